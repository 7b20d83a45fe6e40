"""The log cleaner seen by real clients: a confluent-kafka producer writes many values for few
keys and tombstones to a compacted topic; a consumer from offset 0 then reads the latest value
per key at increasing offsets with gaps, and tombstones go after ``delete.retention.ms``."""

from __future__ import annotations

import time

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "latest-per-key"
KEYS = [b"k%d" % i for i in range(5)]
ROUNDS = 30
DEADLINE_S = 60


def produce(bootstrap: str, items: list[tuple[bytes, bytes | None, int]]) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                            "enable.idempotence": True})
    for key, value, ts in items:
        producer.produce(TOPIC, value=value, key=key, partition=0, timestamp=ts)
        producer.flush(10)   # one batch per record: every round can roll a segment
    assert producer.flush(10) == 0


def read_all(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                            "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    try:
        _, high = consumer.get_watermark_offsets(ck.TopicPartition(TOPIC, 0), timeout=10)
        consumer.assign([ck.TopicPartition(TOPIC, 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + DEADLINE_S
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                out.append((m.offset(), m.key(), m.value()))
        return out
    finally:
        consumer.close()


def test_a_consumer_reads_the_latest_value_per_key_and_tombstones_go(tmp_path):
    overrides = {"log.cleaner.backoff.ms": "50"}
    with BrokerProcess(tmp_path, overrides=overrides) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {"cleanup.policy": "compact", "segment.ms": "1000",
                  "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "2000"}
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(10)
        # Timestamps one second apart: each round rolls a segment (segment.ms) without waiting.
        base = int(time.time() * 1000) - 600_000
        items = []
        for r in range(ROUNDS):
            items += [(k, b"%s-%d" % (k, r), base + r * 2000) for k in KEYS]
        items += [(b"gone", b"value", base + ROUNDS * 2000), (b"gone", None, base + ROUNDS * 2000)]
        items += [(b"roll", b"1", base + (ROUNDS + 1) * 2000)]
        produce(broker.bootstrap, items)
        expected = {k: b"%s-%d" % (k, ROUNDS - 1) for k in KEYS}

        def compacted():
            got = read_all(broker.bootstrap)
            latest = {k: v for _, k, v in got if k in expected}
            return got if latest == expected and len(got) <= len(KEYS) + 2 else None

        got = eventually(compacted, "the cleaner to compact the topic", DEADLINE_S, interval=0.2)
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)) and offsets[0] > 0   # increasing; 0 was cleaned
        assert len(offsets) < offsets[-1] - offsets[0] + 1                 # with gaps
        assert (b"gone", None) in [(k, v) for _, k, v in got]   # tombstone kept for now
        assert len([k for _, k, _ in got if k in expected]) == len(KEYS)

        # Cleans after delete.retention.ms drop the tombstone; each attempt dirties the log.
        attempt = iter(range(2, 10_000))

        def tombstone_gone():
            n = next(attempt)
            produce(broker.bootstrap, [(b"roll", b"%d" % n, base + (ROUNDS + n) * 2000)])
            g = read_all(broker.bootstrap)
            return g if b"gone" not in [k for _, k, _ in g] else None

        got = eventually(tombstone_gone, "the tombstone to go", DEADLINE_S, interval=0.2)
        assert {k: v for _, k, v in got if k in expected} == expected
        errors = broker.logged_errors()
        assert not errors, errors


def offsets_topic_records(broker: BrokerProcess) -> int | None:
    """Records in ``__consumer_offsets-0``'s segment files (None while a swap is under way)."""
    from strata.protocol import records as rec
    directory = broker.data_dir / "kafka-logs" / "__consumer_offsets-0"
    try:
        return sum(h.record_count for p in directory.glob("*.log")
                   for h in rec.iter_headers(p.read_bytes()))
    except FileNotFoundError:
        return None


def test_consumer_offsets_is_compacted_and_reloads_the_latest_commit(tmp_path):
    overrides = {"log.cleaner.backoff.ms": "50", "offsets.topic.num.partitions": "1",
                 "offsets.topic.segment.bytes": str(1 << 20)}
    commits = 400
    metadata = "m" * 3000    # ~3 KB per commit record: segments of 1 MiB roll in a few hundred
    broker = BrokerProcess(tmp_path, overrides=overrides).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("committed", 1, 1)])["committed"].result(10)
        consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g",
                                "enable.auto.commit": False})
        for i in range(1, commits + 1):
            consumer.commit(offsets=[ck.TopicPartition("committed", 0, i, metadata=metadata)],
                            asynchronous=False)
        consumer.close()
        eventually(lambda: (n := offsets_topic_records(broker)) is not None and n < commits // 4,
                   "the cleaner to compact __consumer_offsets", DEADLINE_S, interval=0.2)
    finally:
        broker.stop()
    with BrokerProcess(tmp_path, overrides=overrides, port=broker.port) as restarted:
        consumer = ck.Consumer({"bootstrap.servers": restarted.bootstrap, "group.id": "g"})
        [got] = consumer.committed([ck.TopicPartition("committed", 0)], timeout=10)
        consumer.close()
        assert (got.offset, got.metadata) == (commits, metadata)
        errors = broker.logged_errors()
        assert not errors, errors
