"""KIP-392: consumers read from a follower in their rack. Three brokers in racks r1, r2, r3
with Kafka's RackAwareReplicaSelector; a leader names the in-sync follower in the consumer's
rack (preferred_read_replica), the follower serves the records up to its high watermark, and a
confluent-kafka consumer with ``client.rack`` reads the whole topic that way."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i64
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip
from strata.protocol import records as rec
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

OVERRIDES = {
    "zookeeper.session.timeout.ms": "6000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
    "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
    "replica.fetch.wait.max.ms": "100",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    racks = {n: {"broker.rack": f"r{n}"} for n in (1, 2, 3)}
    with StrataCluster(tmp_path_factory.mktemp("kip392"), brokers=3, overrides=OVERRIDES,
                       broker_overrides=racks) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("racked", 1, 3)])["racked"].result(30)
        producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
        for i in range(200):
            producer.produce("racked", key=b"k%d" % i, value=b"v%d" % i)
        assert producer.flush(30) == 0
        c.admin = admin
        yield c


def fetch(broker, rack: str, offset: int = 0) -> tuple[int, int, bytes]:
    """(error, preferred read replica, records) of a consumer's Fetch v12 from ``broker``."""
    resp = roundtrip(broker.bootstrap, FetchRequest(
        replica_id=BrokerId(-1), max_wait=__import__("datetime").timedelta(0), min_bytes=i32(1),
        max_bytes=i32(1 << 20), isolation_level=0, session_id=i32(0), session_epoch=i32(-1),
        topics=(FetchTopic(topic=TopicName("racked"), partitions=(FetchPartition(
            partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
            last_fetched_epoch=i32(-1), log_start_offset=i64(-1),
            partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=(), rack_id=rack), FetchResponse)
    p = resp.responses[0].partitions[0]
    return int(p.error_code), int(p.preferred_read_replica), bytes(p.records or b"")


def leader_of(cluster) -> int:
    md = cluster.admin.list_topics("racked", timeout=10)
    return md.topics["racked"].partitions[0].leader


def test_the_leader_names_the_follower_in_the_consumers_rack(cluster):
    leader = leader_of(cluster)
    follower = next(n for n in cluster.node_ids if n != leader)

    def naming_the_follower():   # the leader knows the follower is in sync once it has fetched
        answer = fetch(cluster.broker(leader), f"r{follower}")
        assert answer[1] == follower, answer
        return answer
    assert eventually(naming_the_follower, "the leader naming the follower", 30, interval=0.1,
                      ignoring=AssertionError) == (ErrorCode.NONE, follower, b"")
    # a consumer in the leader's own rack, or in no rack, reads from the leader
    error, preferred, records = fetch(cluster.broker(leader), f"r{leader}")
    assert (error, preferred) == (ErrorCode.NONE, -1) and records
    assert fetch(cluster.broker(leader), "")[1] == -1

    # the follower serves the records itself, up to its high watermark (which follows the
    # leader's a fetch behind)
    def answered():
        answer = fetch(cluster.broker(follower), f"r{follower}")
        assert answer[2] or answer[0] != ErrorCode.NONE, answer
        return answer
    error, preferred, records = eventually(answered, "records or an error from the follower", 30,
                                           interval=0.1, ignoring=AssertionError)
    assert error == ErrorCode.NONE and preferred == -1
    assert sum(h.record_count for h in rec.iter_headers(records)) > 0


def test_a_consumer_with_client_rack_reads_everything_through_its_follower(cluster):
    leader = leader_of(cluster)
    follower = next(n for n in cluster.node_ids if n != leader)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": str(uuid.uuid4()),
                         "client.rack": f"r{follower}", "auto.offset.reset": "earliest"})
    consumer.assign([CTopicPartition("racked", 0, 0)])
    keys = []
    deadline = time.monotonic() + 60
    while len(keys) < 200 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            keys.append(m.key())
    consumer.close()
    assert keys == [b"k%d" % i for i in range(200)]
