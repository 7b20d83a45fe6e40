"""Eligible Leader Replicas (KIP-966) on broker processes and a real ZooKeeper, seen through
``kafka-topics --describe`` and an acks=all producer (issue 51).

Four brokers, an RF 3 topic with min.insync.replicas=2 on the three that are not the
controller. One follower stops (clean shutdown)
while the ISR still holds two members: it is not eligible (the high watermark could move on
without it). The second follower stops: the ISR is now below min ISR, so the follower that left
is an eligible leader replica. The leader is then SIGKILLed: no ISR is left. The first follower
comes back and is not elected (it may lack acknowledged records); the second comes back and is
elected from the ELR, with every acknowledged record, where Kafka's ZooKeeper mode would have
waited for the dead leader.
"""

from __future__ import annotations

import re

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, consume_all, log_end, partitions, produce, wait_for
from cluster_process import StrataCluster, elected_controller, metadata_node_ids
from kafka_tools import KAFKA_TOPICS, require_kafka_dist, run_kafka_class

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

TOPIC = "elr"
OVERRIDES = {
    "zookeeper.session.timeout.ms": "4000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "1",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
}


def describe(bootstrap: str) -> dict[str, str]:
    """Partition 0 as ``kafka-topics --describe`` prints it: field -> value."""
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", bootstrap, "--describe",
                             "--topic", TOPIC)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if "Partition: 0" in ln)
    return dict(re.findall(r"(\w+): ?(\S*)", line))


def test_a_follower_that_left_below_min_isr_is_elected_when_the_isr_is_gone(tmp_path):
    require_kafka_dist()
    cluster = StrataCluster(tmp_path, brokers=4, overrides=OVERRIDES).start()
    try:
        controller = elected_controller(cluster.broker(1).bootstrap)
        leader, early, late = [n for n in sorted(cluster.node_ids) if n != controller]
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        client.create_topics([NewTopic(
            TOPIC, num_partitions=1, replica_assignment=[[leader, early, late]],
            config={"min.insync.replicas": "2"})])[TOPIC].result(30)
        wait_for("a full ISR", lambda: sorted(partitions(
            cluster.broker(leader).bootstrap, TOPIC)[0].isr) == sorted((leader, early, late)))
        acked = [b"k-%d" % i for i in range(2_000)]
        assert produce(cluster.bootstrap, TOPIC, acked) == acked

        cluster.broker(early).stop()   # ISR {leader, late}: still min ISR, not eligible
        wait_for("the ISR without the first follower", lambda: describe(
            cluster.broker(leader).bootstrap)["Isr"] == ",".join(map(str, sorted((leader, late)))))
        cluster.broker(late).stop()    # ISR {leader}: below min ISR, so it is eligible
        wait_for("the second follower eligible", lambda: describe(
            cluster.broker(leader).bootstrap)["Elr"] == str(late))

        cluster.broker(leader).kill()
        alive = cluster.broker(controller)
        wait_for("no ISR left, the dead leader last known", lambda: (
            (d := describe(alive.bootstrap))["Isr"], d["Elr"], d["LastKnownElr"]) == (
            "", ",".join(map(str, sorted((leader, late)))), str(leader)))

        cluster.broker(early).start()
        wait_for("the first follower registered", lambda: early in metadata_node_ids(
            alive.bootstrap)[0])
        assert partitions(alive.bootstrap, TOPIC)[0].leader == -1, \
            "a replica that left while the ISR held min ISR members was elected"

        cluster.broker(late).start()
        wait_for("the eligible replica elected", lambda: partitions(
            alive.bootstrap, TOPIC)[0].leader == late)
        state = describe(alive.bootstrap)
        assert state["Leader"] == str(late)
        if state["Isr"] == str(late):   # the first follower may have caught up already
            assert state["Elr"] == str(leader)
        got = consume_all(cluster.broker(late).bootstrap, TOPIC,
                          log_end(cluster.broker(late), TOPIC))
        assert got[:len(acked)] == acked
    finally:
        cluster.stop()
