"""A three-broker cluster through Kafka 4.4's own CLI tools and kafka-python's admin client, and
controlled shutdown: SIGTERM moves a broker's leaderships away before it leaves."""

from __future__ import annotations

import re

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, wait_for
from cluster_process import StrataCluster
from kafka_tools import (
    BROKER_API_VERSIONS, KAFKA_TOPICS, LEADER_ELECTION, require_kafka_dist, run_kafka_class)

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

OVERRIDES = {
    "zookeeper.session.timeout.ms": "4000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("cluster-tools"), brokers=3, overrides=OVERRIDES) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("described", 3, 3)])["described"].result(30)
        yield c


def tool(main_class: str, *args: str) -> str:
    result = run_kafka_class(main_class, *args, timeout=120)
    assert result.returncode == 0, f"{main_class} {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def described(cluster) -> dict[int, tuple[int, list[int], list[int]]]:
    """kafka-topics --describe: partition -> (leader, replicas, isr)."""
    out = tool(KAFKA_TOPICS, "--bootstrap-server", cluster.bootstrap, "--describe", "--topic", "described")
    found = {}
    for m in re.finditer(r"Partition: (\d+)\s+Leader: (-?\d+)\s+Replicas: ([\d,]+)\s+Isr: ([\d,]+)", out):
        found[int(m.group(1))] = (int(m.group(2)), [int(x) for x in m.group(3).split(",")],
                                  [int(x) for x in m.group(4).split(",")])
    return found


def test_kafka_topics_describes_leaders_replicas_and_isr(cluster):
    require_kafka_dist()
    parts = described(cluster)
    assert sorted(parts) == [0, 1, 2]
    assert {leader for leader, _, _ in parts.values()} == cluster.node_ids
    for leader, replicas, isr in parts.values():
        assert leader == replicas[0] and sorted(replicas) == sorted(isr) == [1, 2, 3]


def test_kafka_broker_api_versions_lists_every_broker(cluster):
    require_kafka_dist()
    out = tool(BROKER_API_VERSIONS, "--bootstrap-server", cluster.bootstrap)
    listed = {int(m.group(1)) for m in re.finditer(r"\(id: (\d+) rack: ", out)}
    assert listed == cluster.node_ids


def test_kafka_leader_election_reaches_the_controller(cluster):
    require_kafka_dist()
    # every partition is led by its preferred replica: nothing to elect, and the tool says so
    out = tool(LEADER_ELECTION, "--bootstrap-server", cluster.bootstrap,
               "--election-type", "preferred", "--topic", "described", "--partition", "0")
    assert "Valid replica already elected for partitions described-0" in out


def test_kafka_python_admin_sees_the_cluster(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        (topic,) = admin.describe_topics(["described"])
        leaders = {p["partition_index"]: p["leader_id"] for p in topic["partitions"]}
        assert set(leaders.values()) == cluster.node_ids
        assert {b["broker_id"] for b in admin.describe_cluster()["brokers"]} == cluster.node_ids
    finally:
        admin.close()


def test_sigterm_moves_leaderships_away_before_the_broker_leaves(cluster):
    require_kafka_dist()
    before = described(cluster)
    victim = next(b for b in cluster.brokers if any(l == b.node_id for l, _, _ in before.values()))
    assert victim.stop() == 0
    assert "controlled shutdown: leaderships moved" in victim.output()
    after = described(cluster)
    for p, (leader, replicas, isr) in after.items():
        assert leader != victim.node_id and leader in replicas
        assert victim.node_id not in isr
    victim.start()
    cluster.wait_metadata()  # every broker lists all three again
    # back in every ISR once it has caught up, it leads its partitions again only when asked:
    # kafka-leader-election --election-type preferred (ElectLeaders, sent to the controller)
    wait_for("the restarted broker back in every ISR",
             lambda: all(victim.node_id in isr for _, _, isr in described(cluster).values()), 60)
    assert any(leader != replicas[0] for leader, replicas, _ in described(cluster).values())
    out = tool(LEADER_ELECTION, "--bootstrap-server", cluster.bootstrap,
               "--election-type", "preferred", "--all-topic-partitions")
    assert "Successfully completed leader election (PREFERRED)" in out, out
    wait_for("every partition led by its preferred replica",
             lambda: all(leader == replicas[0] for leader, replicas, _ in described(cluster).values()))
