"""KIP-405 on one broker, with unmodified Kafka clients: Kafka's tiered-storage integration
scenarios that apply to a single broker (OffloadAndConsumeFromLeader, EnableRemoteLogOnTopic,
DisableRemoteLogOnTopic, RollAndOffloadActiveSegment, DeleteSegmentsByRetentionTime/Size,
DeleteSegmentsDueToLogStartOffsetBreach, DeleteTopic, PartitionsExpand, ListOffsets).

The broker runs with a filesystem remote tier under its data dir, tiny segments
(``internal.segment.bytes``), ``local.retention.bytes=1`` where the scenario wants every tiered
segment gone locally, and a 200 ms task interval.
"""

from __future__ import annotations

import time

import pytest

from broker_process import BrokerProcess
from tiered_support import (
    EARLIEST, EARLIEST_LOCAL, LATEST_TIERED, TIERED_BROKER, list_offset, local_segments, offsets,
    remote_files, wait_for)

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic  # noqa: E402

SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096"}
BASE_TS = int(time.time() * 1000) - 3_600_000  # recent: an hour ago, inside retention.ms


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path, TIERED_BROKER) as b:
        yield b


def remote_root(b: BrokerProcess):
    return b.data_dir / "kafka-logs" / "remote-storage"


def admin(b):
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create(b, topic, partitions=1, **configs):
    a = admin(b)
    a.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(30)


def alter(b, topic, **configs):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    a = admin(b)
    for f in a.incremental_alter_configs([res]).values():
        f.result(30)


def produce(b, topic, n, start=0, partition=0, size=200, ts=None):
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "batch.size": 4096})
    for i in range(start, start + n):
        p.produce(topic, key=f"k{i}".encode(), value=(f"v{i}-".encode() * size)[:size],
                  partition=partition, timestamp=(ts or BASE_TS) + i,
                  headers=[("i", str(i).encode())])
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def consume(b, topic, start, count, partition=0, timeout=60):
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                     "max.partition.fetch.bytes": 64 * 1024})
    c.assign([CkTp(topic, partition, start)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        c.close()
    return out


def check_records(msgs, start, size=200):
    for j, m in enumerate(msgs):
        i = start + j
        assert m.offset() == i
        assert m.key() == f"k{i}".encode()
        assert m.value() == (f"v{i}-".encode() * size)[:size]
        assert m.timestamp()[1] == BASE_TS + i
        assert m.headers() == [("i", str(i).encode())]


def wait_tiered(b, topic, at_least, partition=0, timeout=60):
    """Until the highest tiered offset reaches ``at_least`` and local retention caught up."""
    return wait_for(lambda: (o := offsets(b.bootstrap, topic, partition))["tiered"] >= at_least
                    and o["local_start"] > at_least and o, timeout, what=f"{topic} tiered")


def test_offload_and_consume_from_the_leader_across_tiers_and_after_restart(broker):
    create(broker, "t1", **TIERED_TOPIC)
    produce(broker, "t1", 1000)
    o = wait_tiered(broker, "t1", 500)
    assert o["start"] == 0 and o["end"] == 1000, o
    assert remote_files(remote_root(broker), "t1"), "nothing in the remote tier"
    msgs = consume(broker, "t1", 0, 1000)
    assert len(msgs) == 1000
    check_records(msgs, 0)
    broker.stop()
    broker.start()
    o2 = offsets(broker.bootstrap, "t1")
    assert o2["start"] == 0 and o2["tiered"] >= o["tiered"] and o2["end"] == 1000
    mid = 137  # inside a remote segment
    msgs = consume(broker, "t1", mid, 1000 - mid)
    check_records(msgs, mid)
    assert len(msgs) == 1000 - mid


def test_list_offsets_across_tiers(broker):
    create(broker, "lo", **TIERED_TOPIC)
    produce(broker, "lo", 600)
    o = wait_tiered(broker, "lo", 300)
    assert list_offset(broker.bootstrap, "lo", 0, EARLIEST)[1] == 0
    assert list_offset(broker.bootstrap, "lo", 0, EARLIEST_LOCAL)[1] == o["local_start"] > 0
    assert list_offset(broker.bootstrap, "lo", 0, LATEST_TIERED)[1] == o["tiered"]
    for i in (0, 5, 250, o["local_start"] - 1, o["local_start"], 599):
        err, off, _ = list_offset(broker.bootstrap, "lo", 0, BASE_TS + i)
        assert (err, off) == (0, i)
    assert list_offset(broker.bootstrap, "lo", 0, BASE_TS + 600)[1] == -1


def test_latest_tiered_is_minus_one_before_anything_is_tiered(broker):
    create(broker, "nt", **{**TIERED_TOPIC, "internal.segment.bytes": str(10 * 1024 * 1024)})
    produce(broker, "nt", 10)
    assert list_offset(broker.bootstrap, "nt", 0, LATEST_TIERED)[1] == -1
    assert list_offset(broker.bootstrap, "nt", 0, EARLIEST_LOCAL)[1] == 0
