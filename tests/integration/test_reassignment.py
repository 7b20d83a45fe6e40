"""Partition reassignment (KIP-455) on three broker processes and a real ZooKeeper, driven by
Kafka 4.4's kafka-reassign-partitions (``ReassignPartitionsCommand``) against the active
controller, as Kafka 3.9's ZooKeeper-mode controller runs it:

- an RF 2 topic on brokers {1,2} with acks=all data moves to {2,3}: --execute, then --verify
  until it reports completion; Metadata then lists replicas [2,3], broker 3's own log holds every
  record, broker 1's partition directory is gone and a consumer reads everything;
- a reassignment that cannot complete (its new replica is paused) is listed in progress and
  --cancel reverts it to the original replicas; the added broker ends with no replica.

(confluent-kafka 2.16's AdminClient has no alter_partition_reassignments, so only Kafka's
tool drives these tests.)
"""

from __future__ import annotations

import datetime
import json

import pytest
from kio.schema.list_partition_reassignments.v0.request import ListPartitionReassignmentsRequest
from kio.schema.list_partition_reassignments.v0.response import ListPartitionReassignmentsResponse
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, consume_all, log_end, partitions, produce, wait_for
from cluster_process import StrataCluster, elected_controller
from kafka_tools import REASSIGN_PARTITIONS, kafka_dist_available, run_kafka_class
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip

_ok, _why = zookeeper_available()
_kafka, _kafka_why = kafka_dist_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why),
              pytest.mark.skipif(not _kafka, reason=_kafka_why), pytest.mark.slow]

OVERRIDES = {
    # a broker paused by the cancel test keeps its session (ZooKeeper's tick is 2 s here, so
    # sessions up to 40 s are granted)
    "zookeeper.session.timeout.ms": "30000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
    "log.segment.delete.delay.ms": "500",  # a removed replica's ...-delete directory goes soon
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("reassignment"), brokers=3, overrides=OVERRIDES,
                       zk_tick_ms=2000) as c:
        yield c


def create_on(cluster, name: str, replicas: list[int]) -> None:
    from confluent_kafka.admin import NewTopic
    admin(cluster.bootstrap).create_topics(
        [NewTopic(name, num_partitions=1, replica_assignment=[replicas])])[name].result(30)
    wait_for(f"{name} has an ISR of {replicas}",
             lambda: sorted(partition(cluster, name)[1]) == sorted(replicas))


def partition(cluster, topic: str, via=None) -> tuple[list[int], list[int], int]:
    """(replicas, isr, leader) of partition 0 as ``via`` (default: the first running broker)
    says in Metadata."""
    broker = via or next(b for b in cluster.brokers if b.running)
    p = partitions(broker.bootstrap, topic)[0]   # that broker itself answers
    return p.replicas, p.isr, p.leader


def reassign_tool(cluster, tmp_path, action: str, plan: dict[str, list[int]],
                  bootstrap: str | None = None, *extra: str) -> str:
    """Runs kafka-reassign-partitions ``action`` (--execute, --verify, --cancel) on ``plan``
    (topic -> partition 0's target replicas); returns its output (exit code checked).
    --verify and --cancel also clear the throttles --execute --throttle set."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": 0, "replicas": r} for t, r in plan.items()]}))
    done = run_kafka_class(REASSIGN_PARTITIONS,
                           "--bootstrap-server", bootstrap or cluster.bootstrap,
                           "--reassignment-json-file", str(plan_file), action, *extra, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


THROTTLE = 2_000_000   # bytes/s, kafka-reassign-partitions --throttle


def broker_config(broker, key: str) -> str | None:
    """A dynamic config of ``broker`` (its own BROKER resource), None when not set."""
    from confluent_kafka.admin import ConfigResource, ResourceType
    resource = ConfigResource(ResourceType.BROKER, str(broker.node_id))
    entries = admin(broker.bootstrap).describe_configs([resource])[resource].result(10)
    entry = entries.get(key)
    from confluent_kafka.admin import ConfigSource
    dynamic = entry is not None and entry.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    return entry.value if dynamic else None


def topic_config(cluster, topic: str, key: str) -> str | None:
    from confluent_kafka.admin import ConfigResource, ResourceType
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entry = admin(cluster.bootstrap).describe_configs([resource])[resource].result(10).get(key)
    return entry.value if entry is not None else None


def listed(broker) -> tuple[int, dict]:
    """ListPartitionReassignments (all partitions) sent to ``broker``: (top-level error,
    {(topic, partition): (replicas, adding, removing)})."""
    resp = roundtrip(broker.bootstrap, ListPartitionReassignmentsRequest(
        timeout=datetime.timedelta(seconds=10), topics=None), ListPartitionReassignmentsResponse)
    return int(resp.error_code), {
        (str(t.name), int(p.partition_index)): (list(p.replicas), list(p.adding_replicas),
                                                list(p.removing_replicas))
        for t in resp.topics for p in t.partitions}


def partition_dirs(broker, topic: str) -> list[str]:
    return sorted(p.name for p in broker.log_dir.iterdir()
                  if p.name == f"{topic}-0" or p.name.startswith(f"{topic}-0."))


def test_reassign_partitions_moves_a_replica_with_its_data(cluster, tmp_path):
    create_on(cluster, "moved", [1, 2])
    keys = [b"k%d" % i for i in range(500)]
    assert produce(cluster.bootstrap, "moved", keys) == keys
    assert partition_dirs(cluster.broker(1), "moved") == ["moved-0"]

    out = reassign_tool(cluster, tmp_path, "--execute", {"moved": [2, 3]}, None,
                        "--throttle", str(THROTTLE))
    assert "Successfully started partition reassignment" in out, out
    # the tool throttled the move: the rates on the brokers, the moving replicas on the topic
    assert broker_config(cluster.broker(1), "leader.replication.throttled.rate") == str(THROTTLE)
    assert topic_config(cluster, "moved", "follower.replication.throttled.replicas") == "0:3"
    verified = wait_for("--verify reports the reassignment complete", lambda: (
        o := reassign_tool(cluster, tmp_path, "--verify", {"moved": [2, 3]}))
        and "Reassignment of partition moved-0 is completed" in o and o, timeout=90)
    assert "still in progress" not in verified
    # --verify, once complete, cleared the throttles
    assert broker_config(cluster.broker(1), "leader.replication.throttled.rate") is None
    assert topic_config(cluster, "moved", "follower.replication.throttled.replicas") in (None, "")

    for b in (1, 2, 3):  # every broker's Metadata shows the target, led from inside it
        replicas, isr, leader = partition(cluster, "moved", via=cluster.broker(b))
        assert replicas == [2, 3] and sorted(isr) == [2, 3] and leader in (2, 3)
    assert log_end(cluster.broker(3), "moved") == 500
    wait_for("broker 1's replica deleted", lambda: partition_dirs(cluster.broker(1), "moved") == [])
    assert consume_all(cluster.bootstrap, "moved", 500) == keys
    more = [b"m%d" % i for i in range(100)]  # the new replica set takes acks=all writes
    assert produce(cluster.bootstrap, "moved", more) == more
    assert wait_for("broker 3 has the new records",
                    lambda: log_end(cluster.broker(3), "moved") == 600)


def test_a_stuck_reassignment_is_listed_and_cancel_reverts_it(cluster, tmp_path):
    controller = elected_controller(cluster.broker(1).bootstrap)
    added = max(b for b in cluster.node_ids if b != controller)  # paused: not the controller
    first, second = sorted(cluster.node_ids - {added})
    create_on(cluster, "stuck", [first, second])
    keys = [b"s%d" % i for i in range(200)]
    assert produce(cluster.bootstrap, "stuck", keys) == keys
    paused, lead = cluster.broker(added), cluster.broker(controller)

    def tool(action: str) -> str:
        # bootstrapped off the paused broker; --preserve-throttles: clearing the throttles
        # would have to reach the paused broker too
        extra = ("--preserve-throttles",) if action != "--execute" else ()
        return reassign_tool(cluster, tmp_path, action, {"stuck": [first, added]},
                             lead.bootstrap, *extra)
    paused.pause()  # fetching nothing, it cannot join the ISR; the tool bootstraps elsewhere
    try:
        out = tool("--execute")
        assert "Successfully started partition reassignment" in out, out
        replicas, isr, _ = wait_for("replicas target + original", lambda: (
            s := partition(cluster, "stuck", via=lead)) and s[0] == [first, added, second] and s)
        assert sorted(isr) == [first, second]
        # the controller lists it (adding and removing as KIP-455 has them); others refuse
        assert listed(cluster.broker(controller)) == (
            ErrorCode.NONE, {("stuck", 0): ([first, added, second], [added], [second])})
        assert listed(cluster.broker(second if second != controller else first))[0] == \
            ErrorCode.NOT_CONTROLLER
        verify = tool("--verify")
        assert "Reassignment of partition stuck-0 is still in progress." in verify, verify
        cancelled = tool("--cancel")
        assert "Successfully cancelled partition reassignment" in cancelled, cancelled
        wait_for("the original replicas again",
                 lambda: partition(cluster, "stuck", via=lead)[0] == [first, second])
        assert listed(cluster.broker(controller)) == (ErrorCode.NONE, {})
    finally:
        paused.resume()
    verify = tool("--verify")
    assert "There is no active reassignment of partition stuck-0" in verify, verify
    cluster.wait_metadata()
    wait_for(f"broker {added} holds no replica", lambda: partition_dirs(paused, "stuck") == [])
    assert consume_all(cluster.bootstrap, "stuck", 200) == keys
