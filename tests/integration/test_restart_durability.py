"""What a producer was told is stored survives the broker stopping: cleanly (SIGTERM) or not
(SIGKILL in the middle of a produce stream). Unmodified confluent-kafka clients, a real
``strata serve`` process, restarted on the same data directory and port.

After either kind of restart every acknowledged record reads back at its acknowledged offset
with the same key, value, headers and timestamp, partitions hold no duplicates, gaps or torn
records, and producing continues at the log end the broker had before it stopped.
"""

from __future__ import annotations

import hashlib
import random
import signal
import threading
import time

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")

CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"
PARTITIONS = 3
BASE_TS = 1_700_000_000_000

# Reconnect quickly while the broker restarts (librdkafka backs off up to 10 s by default).
FAST_RECONNECT = {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 250,
                  "retry.backoff.ms": 20, "retry.backoff.max.ms": 250}


def record(seq: int, tag: str = "r") -> tuple[bytes, bytes | None, list, int]:
    """(key, value, headers, timestamp) for sequence number ``seq``: unique key, binary value
    of varying size (sometimes empty or null), two headers."""
    key = f"{tag}-{seq:07d}".encode()
    digest = hashlib.sha256(key).digest()
    if seq % 101 == 0:
        value = None
    elif seq % 103 == 0:
        value = b""
    else:  # incompressible, so that segments fill up even with lz4
        value = hashlib.shake_256(key).digest(64 * (seq % 37 + 1))
    headers = [("seq", str(seq).encode()), ("digest", digest[:8])]
    return key, value, headers, BASE_TS + seq


def seq_of(key: bytes) -> int:
    return int(key.rsplit(b"-", 1)[1])


def log_dir(broker: BrokerProcess):
    return broker.data_dir / "kafka-logs"


def producer(broker: BrokerProcess, **extra):
    return ck.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                        "acks": "all", "linger.ms": 5, **FAST_RECONNECT, **extra})


class Deliveries:
    """Delivery reports: (partition, offset) per acknowledged key, and every failure."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[tuple[bytes, str]] = []

    def __call__(self, err, msg) -> None:
        with self.lock:
            if err is not None:
                self.failed.append((msg.key(), str(err)))
            else:
                assert msg.key() not in self.acked, f"{msg.key()!r} acknowledged twice"
                self.acked[msg.key()] = (msg.partition(), msg.offset())

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def snapshot(self) -> dict[bytes, tuple[int, int]]:
        with self.lock:
            return dict(self.acked)


def produce_all(broker: BrokerProcess, topic: str, seqs, tag: str = "r", **extra) -> Deliveries:
    """Produce ``record(seq)`` to partition ``seq % PARTITIONS`` for every seq; wait for all acks."""
    d = Deliveries()
    p = producer(broker, **extra)
    for seq in seqs:
        key, value, headers, ts = record(seq, tag)
        p.produce(topic, key=key, value=value, headers=headers, timestamp=ts,
                  partition=seq % PARTITIONS, on_delivery=d)
        p.poll(0)
    assert p.flush(60) == 0, "producer could not deliver everything"
    assert d.failed == [], d.failed[:5]
    return d


def read_partitions(broker: BrokerProcess, topic: str, timeout: float = 60) -> dict[int, list]:
    """Every record of every partition, from offset 0 to the high watermark, with CRC checks:
    partition -> [(offset, key, value, headers, timestamp)]."""
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "durability-reader",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "check.crcs": True, **FAST_RECONNECT})
    try:
        tps = [ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
        highs = {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[1]
                 for p in range(PARTITIONS)}
        c.assign(tps)
        out: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        at_end = {p for p, high in highs.items() if high == 0}
        deadline = time.monotonic() + timeout
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, \
                f"read {[len(v) for v in out.values()]} records, high watermarks {highs}"
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == ck.KafkaError._PARTITION_EOF, msg.error()
                if msg.offset() >= highs[msg.partition()]:
                    at_end.add(msg.partition())
                continue
            out[msg.partition()].append(
                (msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
        return out
    finally:
        c.close()


def end_offsets(broker: BrokerProcess, topic: str) -> dict[int, int]:
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "durability-offsets"})
    try:
        marks = {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)
                 for p in range(PARTITIONS)}
    finally:
        c.close()
    assert all(low == 0 for low, _ in marks.values()), marks
    return {p: high for p, (_, high) in marks.items()}


def as_stored(seq: int, offset: int, tag: str = "r") -> tuple:
    key, value, headers, ts = record(seq, tag)
    return offset, key, value, headers, ts


def output_since(broker: BrokerProcess, mark: int) -> str:
    return broker.output()[mark:]


def check_continues_at_log_end(broker: BrokerProcess, topic: str, before: dict[int, list]) -> None:
    """A fresh producer's records land right after what the log held, and read back with it."""
    ends = end_offsets(broker, topic)
    assert ends == {p: len(recs) for p, recs in before.items()}
    extra = range(0, 5 * PARTITIONS)
    d = produce_all(broker, topic, extra, tag="after")
    for seq in extra:
        p = seq % PARTITIONS
        k = seq // PARTITIONS
        assert d.acked[record(seq, "after")[0]] == (p, ends[p] + k), "not appended at the log end"
    after = read_partitions(broker, topic)
    for p in range(PARTITIONS):
        appended = [as_stored(seq, ends[p] + i, "after")
                    for i, seq in enumerate(s for s in extra if s % PARTITIONS == p)]
        assert after[p] == before[p] + appended


# ---------------------------------------------------------------------------------------------


def test_records_read_back_identical_at_the_same_offsets_after_a_clean_restart(tmp_path):
    broker = BrokerProcess(tmp_path, overrides={"num.partitions": str(PARTITIONS)}).start()
    try:
        n = 1500
        d = produce_all(broker, "durable", range(n))
        # acknowledged per partition at offsets 0, 1, 2, ... in produce order
        for seq in range(n):
            assert d.acked[record(seq)[0]] == (seq % PARTITIONS, seq // PARTITIONS)
        before = read_partitions(broker, "durable")

        assert broker.stop(signal.SIGTERM) == 0, broker.output()[-3000:]
        assert (log_dir(broker) / CLEAN_SHUTDOWN_MARKER).exists()

        mark = len(broker.output())
        broker.start()
        assert "(clean shutdown)" in output_since(broker, mark)
        # the marker is consumed at start, so a crash from here on is recognised as unclean
        assert not (log_dir(broker) / CLEAN_SHUTDOWN_MARKER).exists()

        after = read_partitions(broker, "durable")
        assert after == before
        for p in range(PARTITIONS):
            assert after[p] == [as_stored(seq, i) for i, seq in
                                enumerate(range(p, n, PARTITIONS))]
        check_continues_at_log_end(broker, "durable", after)
    finally:
        broker.stop()


class StreamingProducer(threading.Thread):
    """Keeps producing ``record(seq)`` for seq = 0, 1, 2, ... (partition seq % PARTITIONS)
    until stopped, then flushes; delivery reports go to ``deliveries``."""

    def __init__(self, broker: BrokerProcess, topic: str):
        super().__init__(daemon=True)
        self.topic = topic
        self.deliveries = Deliveries()
        self.producer = producer(broker, **{"compression.type": "lz4", "linger.ms": 2,
                                            "message.timeout.ms": 120_000})
        self.sent = 0
        self.stopping = threading.Event()
        self.unflushed = -1
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for _ in range(20):
                    key, value, headers, ts = record(self.sent)
                    try:
                        self.producer.produce(self.topic, key=key, value=value, headers=headers,
                                              timestamp=ts, partition=self.sent % PARTITIONS,
                                              on_delivery=self.deliveries)
                    except BufferError:  # local queue full (broker down): wait for room
                        self.producer.poll(0.05)
                        break
                    self.sent += 1
                self.producer.poll(0.002)
            self.unflushed = self.producer.flush(120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


# Small segments (Kafka's minimum) so that the stream rolls several of them, each flushed in the
# background on roll, and the recovery point checkpointed often: a kill then lands with some
# segments flushed and checkpointed and a tail that recovery has to validate.
CRASH_OVERRIDES = {"num.partitions": str(PARTITIONS), "log.segment.bytes": str(1 << 20),
                   "log.flush.offset.checkpoint.interval.ms": "200"}


@pytest.mark.parametrize("kills", [3])
def test_every_acknowledged_record_survives_sigkill_mid_stream_exactly_once(tmp_path, kills):
    rng = random.Random(20_250_101)
    broker = BrokerProcess(tmp_path, overrides=CRASH_OVERRIDES).start()
    stream = StreamingProducer(broker, "crashy")
    stream.start()
    acked_at_kill: list[dict[bytes, tuple[int, int]]] = []
    try:
        for i in range(kills):
            target = stream.deliveries.count() + 1500
            eventually(lambda: stream.deliveries.count() >= target, f"{target} acks", 60,
                       interval=0.01)
            time.sleep(rng.uniform(0, 0.1))
            in_flight = stream.sent - stream.deliveries.count()
            assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
            acked_at_kill.append(stream.deliveries.snapshot())
            assert in_flight > 0, "the kill did not happen mid-stream"
            assert not (log_dir(broker) / CLEAN_SHUTDOWN_MARKER).exists()

            time.sleep(rng.uniform(0.05, 0.5))  # the producer keeps queueing while it is down
            mark = len(broker.output())
            broker.start()
            assert "unclean shutdown: recovered" in output_since(broker, mark)
            restarted = stream.deliveries.count()
            eventually(lambda: stream.deliveries.count() >= restarted + 300,
                       "acks after the restart", 60, interval=0.01)
        stream.stopping.set()
        stream.join(150)
        assert not stream.is_alive(), "the producer did not finish flushing"
        assert stream.error is None, stream.error
        assert stream.unflushed == 0
        d = stream.deliveries
        assert d.failed == [], f"{len(d.failed)} records failed, e.g. {d.failed[:3]}"
        assert len(d.acked) == stream.sent

        stored = read_partitions(broker, "crashy")
        segments = [len(list((log_dir(broker) / f"crashy-{p}").glob("*.log")))
                    for p in range(PARTITIONS)]
        assert min(segments) >= 2, f"no segment rolled ({segments}): the test lost its point"
        by_key: dict[bytes, tuple[int, int]] = {}
        for p, recs in stored.items():
            assert [r[0] for r in recs] == list(range(len(recs))), f"gap in partition {p}"
            for offset, key, value, headers, ts in recs:
                assert key not in by_key, f"{key!r} stored twice: {by_key[key]} and {(p, offset)}"
                by_key[key] = (p, offset)
                seq = seq_of(key)
                assert seq % PARTITIONS == p
                assert (offset, key, value, headers, ts) == as_stored(seq, offset), "torn record"
            seqs = [seq_of(r[1]) for r in recs]
            assert seqs == sorted(seqs), f"partition {p} out of produce order"
        # acknowledged before each kill: still there, where the broker said
        for snapshot in acked_at_kill:
            missing = {k: v for k, v in snapshot.items() if by_key.get(k) != v}
            assert not missing, f"{len(missing)} acknowledged records lost or moved: " \
                                f"{list(missing.items())[:3]}"
        # and in the end everything sent was stored exactly once, where it was acknowledged
        assert by_key == d.acked
        check_continues_at_log_end(broker, "crashy", stored)
    finally:
        stream.stopping.set()
        broker.stop(signal.SIGKILL)
