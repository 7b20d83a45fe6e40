"""A KIP-848 consumer group across a group coordinator's SIGKILL in a three-broker cluster:
the next leader of the group's ``__consumer_offsets`` partition loads the group's records and
serves it with the same group epoch and every member's epoch and assignment; the librdkafka
members (``group.protocol=consumer``) carry on without rejoining and read what is produced
after the failover."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_describe.v1.response import ConsumerGroupDescribeResponse
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.static.primitive import i8
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, wait_for
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

OVERRIDES = {
    "zookeeper.session.timeout.ms": "4000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "1",
    "offsets.topic.replication.factor": "3",
    "group.initial.rebalance.delay.ms": "0",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
}
TOPIC, GROUP = "kip848-failover", "kip848-failover-group"


def running(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers if b.running)


def coordinator(cluster) -> int:
    asked = next(b for b in cluster.brokers if b.running)
    resp = roundtrip(asked.bootstrap, FindCoordinatorRequest(
        key_type=i8(0), coordinator_keys=(GROUP,)), FindCoordinatorResponse, 5)
    (c,) = resp.coordinators
    assert c.error_code == ErrorCode.NONE, c
    return int(c.node_id)


def described(cluster, node: int):
    """(state, group epoch, assignment epoch, [(member, epoch, partitions)]) as ``node``
    answers ConsumerGroupDescribe; None while it cannot."""
    resp = roundtrip(cluster.broker(node).bootstrap, ConsumerGroupDescribeRequest(
        group_ids=(GROUP,), include_authorized_operations=False),
        ConsumerGroupDescribeResponse, 5)
    (g,) = resp.groups
    if g.error_code != ErrorCode.NONE:
        return None
    return (g.group_state, g.group_epoch, g.assignment_epoch, sorted(
        (m.member_id, m.member_epoch, sorted((t.topic_name, tuple(t.partitions))
                                             for t in m.assignment.topic_partitions))
        for m in g.members))


def test_the_group_survives_its_coordinators_sigkill(tmp_path):
    with StrataCluster(tmp_path, brokers=3, overrides=OVERRIDES) as cluster:
        admin = AdminClient({"bootstrap.servers": running(cluster)})
        admin.create_topics([NewTopic(TOPIC, 2, 3)])[TOPIC].result(30)
        config = {"bootstrap.servers": running(cluster), "group.id": GROUP,
                  "group.protocol": "consumer", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False}
        members = [Consumer({**config, "client.id": f"m{i}"}) for i in range(2)]
        got: list = []

        def poll() -> None:
            for c in members:
                msg = c.poll(0.1)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        try:
            for c in members:
                c.subscribe([TOPIC])

            def shared():
                poll()
                return all(len(c.assignment()) == 1 for c in members)
            wait_for("the members share the partitions", shared, 60)
            node = coordinator(cluster)

            def stable():
                poll()
                d = described(cluster, node)
                return d if d and d[0] == "Stable" else None
            before = wait_for("a Stable group", stable, 60)
            assert [m[1] for m in before[3]] == [before[1]] * 2
            victim = cluster.broker(node)
            victim.kill()
            try:
                def moved():
                    poll()
                    new = coordinator(cluster)
                    return new if new != node else None
                new = wait_for("a new group coordinator", moved, 90)

                def resumed():
                    poll()
                    return described(cluster, new)
                assert wait_for("the group on its new coordinator", resumed, 60) == before
                producer = Producer({"bootstrap.servers": running(cluster), "acks": "all"})
                for i in range(10):
                    producer.produce(TOPIC, value=b"after-%d" % i, partition=i % 2)
                assert producer.flush(30) == 0

                def read():
                    poll()
                    return len(got) >= 10
                wait_for("the members read what came after the failover", read, 60)
                assert sorted(got) == sorted(b"after-%d" % i for i in range(10))
                # no member rejoined: the same epochs, no new group epoch
                assert described(cluster, new) == before
            finally:
                victim.start()
        finally:
            for c in members:
                c.close()
