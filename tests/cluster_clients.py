"""What the cluster tests do as clients: wait for a condition, keep admin clients, read a
broker's own log end, produce and consume with confluent-kafka, send one raw Produce."""

from __future__ import annotations

import datetime
import os
import signal
import time
import uuid
from typing import NamedTuple

from confluent_kafka import Consumer, Producer, TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip
from strata.protocol import records as rec
from support.waiting import eventually

# Cluster tests that are not about tiering run without it (fewer threads and topics).
NO_TIERING = {"remote.log.storage.system.enable": "false", "log.remote.storage.enable": "false"}


# Long enough for a dead broker's ZooKeeper session (the tests use 4-6 s) and the elections after.
DEADLINE_S = 30.0


def wait_for(what: str, check, timeout: float = DEADLINE_S, interval: float = 0.1):
    """``check()``'s first truthy result (exceptions count as not yet: brokers come and go); a
    timeout reports the brokers' state."""
    return eventually(check, what, timeout, interval, ignoring=Exception, report=brokers_report)


# The clusters running now (StrataCluster adds itself while it runs): a wait that times out
# reports what their brokers logged, so that a failure on a CI machine explains itself.
RUNNING_CLUSTERS: list = []


def brokers_report(tail: int = 12, stack_chars: int = 6000) -> str:
    """Per running broker: its stall reports' first lines and its last warnings and errors;
    then the first stall report's stacks, cut at ``stack_chars``."""
    parts, stacks = [], ""
    for cluster in RUNNING_CLUSTERS:
        for b in cluster.brokers:
            if not b.running:
                continue
            lines = b.output().splitlines()
            stalls = [i for i, line in enumerate(lines) if "stalled: " in line]
            noted = [line for line in lines if " WARNING " in line or " ERROR " in line]
            parts.append(f"--- broker {b.node_id}: {len(stalls)} stall reports ---\n"
                         + "\n".join([lines[i] for i in stalls[:5]] + noted[-tail:]))
            if stalls and not stacks:
                stacks = f"--- broker {b.node_id}'s first stall ---\n" + "\n".join(
                    lines[stalls[0]:stalls[0] + 400])[:stack_chars]
    return "\n" + "\n".join(parts + ([stacks] if stacks else [])) if parts else ""


def dump_threads(cluster) -> None:
    """Every running broker writes its threads' stacks to its log (SIGUSR1), for the
    post-mortem of a test that failed waiting."""
    for b in cluster.brokers:
        if b.running:
            os.kill(b.pid, signal.SIGUSR1)
    time.sleep(1)


_ADMINS: dict[str, AdminClient] = {}


def forget_admins(ports: set[int]) -> None:
    """Drops the cached clients of a cluster that stopped: left alive, each would retry its
    dead brokers for the rest of the session."""
    for bootstrap in [b for b in _ADMINS
                      if any(int(hp.rsplit(":", 1)[1]) in ports for hp in b.split(","))]:
        del _ADMINS[bootstrap]


def admin(bootstrap: str) -> AdminClient:
    """One client per bootstrap, kept: a dropped AdminClient fails its pending futures."""
    if bootstrap not in _ADMINS:
        _ADMINS[bootstrap] = AdminClient({"bootstrap.servers": bootstrap})
    return _ADMINS[bootstrap]


def log_end(broker, topic: str, partition: int = 0) -> int:
    """The broker's own log end offset (ListOffsets latest as the debugging replica, -2, which
    a follower answers too)."""
    resp = roundtrip(broker.bootstrap, ListOffsetsRequest(
        replica_id=i32(-2), isolation_level=0, topics=(ListOffsetsTopic(
            name=TopicName(topic), partitions=(ListOffsetsPartition(
                partition_index=i32(partition), current_leader_epoch=i32(-1),
                timestamp=i64(-1)),)),)), ListOffsetsResponse)
    p = resp.topics[0].partitions[0]
    assert p.error_code == ErrorCode.NONE, p
    return int(p.offset)


def produce(bootstrap: str, topic: str, keys, acks: str = "all", partition: int = 0) -> list:
    """One record per key (idempotent with acks=all); the keys acknowledged without error."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0,
                         "enable.idempotence": acks == "all", "message.timeout.ms": 30000})
    acked = []

    def report(err, msg):
        if err is None:
            acked.append(msg.key())
    for k in keys:
        producer.produce(topic, key=k, value=k, partition=partition, on_delivery=report)
        producer.poll(0)
    producer.flush(60)
    return acked


def consume_all(bootstrap: str, topic: str, expect: int, timeout: float = 60,
                partition: int = 0) -> list:
    """Keys of one partition from offset 0 until ``expect`` arrived or ``timeout`` passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([CTopicPartition(topic, partition, 0)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.key())
    consumer.close()
    return got


def produce_raw(bootstrap: str, topic: str, partition: int = 0, acks: int = -1) -> int:
    """One record in one Produce request straight to ``bootstrap``; the partition's error."""
    batch = rec.build_batch([rec.SimpleRecord(b"v", b"k")])
    resp = roundtrip(bootstrap, ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
        topic_data=(TopicProduceData(name=TopicName(topic), partition_data=(
            PartitionProduceData(index=i32(partition), records=batch),)),)), ProduceResponse)
    return int(resp.responses[0].partition_responses[0].error_code)


class PartitionMetadata(NamedTuple):
    leader: int
    replicas: list[int]
    isr: list[int]
    leader_epoch: int


def partitions(bootstrap: str, topic: str, timeout: float = 5) -> dict[int, PartitionMetadata]:
    """``topic``'s partitions as the broker at ``bootstrap`` itself answers Metadata v12 (a
    client library may ask any broker it knows, a paused one included); with a list, the
    first broker that answers."""
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.metadata.v12.response import MetadataResponse
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(topic)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    *others, last = bootstrap.split(",")
    for address in others:
        try:
            resp = roundtrip(address, request, MetadataResponse, timeout)
            break
        except OSError:
            continue
    else:
        resp = roundtrip(last, request, MetadataResponse, timeout)
    (t,) = resp.topics
    return {int(p.partition_index): PartitionMetadata(int(p.leader_id), [int(r) for r in p.replica_nodes],
                                                      [int(r) for r in p.isr_nodes], int(p.leader_epoch))
            for p in t.partitions}
