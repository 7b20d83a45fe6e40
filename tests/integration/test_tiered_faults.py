"""KIP-405 under faults, against a real ``strata serve`` process and unmodified Kafka clients.

- A broker SIGKILLed in the middle of copying a segment (after ``COPY_SEGMENT_STARTED``, with
  only some of the segment's objects written): after a restart nothing acknowledged is lost or
  duplicated, the segment is copied again under a new segment id, and the objects and metadata
  of the interrupted copy are cleaned up (``DELETE_SEGMENT_STARTED`` → ``DELETE_SEGMENT_FINISHED``).
  The copy is frozen with the object store's fault injection (``rsm.config.fault.delay.*``).
- A broker SIGKILLed while an object is half written (``rsm.config.fault.stall.keys``): its
  temporary file is removed by the sweep at the next start, and counted.
- The object store (moto's S3 server behind a cuttable proxy) unreachable while producers and
  hot consumers carry on: produce latency stays normal, hot reads work, remote reads answer a
  retriable error (never wrong data), local segments pile up, and tiering catches up by itself
  once the store is back. The ``short`` case (a 20 s outage) is in ``make test``; the ``long``
  one (``STRATA_S3_OUTAGE_S``, a minute by default) carries the ``faults`` marker
  (``make faults-tiered``).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka import TopicPartition as CkTp
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.response import FetchResponse
from prometheus_client.parser import text_string_to_metric_families

from broker_process import BrokerProcess, free_port
from s3_server import S3Server
from tiered_support import TIERED_BROKER, local_segments, offsets, remote_files, wait_for

from strata.net.connection import Connection
from strata.protocol import records as rec
from strata.protocol.client import fetch_request
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState)
from strata.tiered.metadata.serde import deserialize
from strata.tiered.storage.object_store import object_store_from_config
from strata.tiered.storage.remote_storage_manager import kafka_uuid_str

pytestmark = pytest.mark.slow

S = RemoteLogSegmentState
SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096"}
BASE_TS = int(time.time() * 1000) - 3_600_000  # an hour ago: inside retention.ms
SIZE = 200
SUFFIXES = {"log", "indexes", "rsm-manifest"}
OBJECT_NAME = re.compile(r"^(\d{20})-([A-Za-z0-9_-]{22})\.(log|indexes|rsm-manifest)$")
STORAGE_ERROR = 56  # KAFKA_STORAGE_ERROR


# --------------------------------------------------------------------------- helpers


def key(i: int) -> bytes:
    return f"k{i}".encode()


def value(i: int) -> bytes:
    return (f"v{i}-".encode() * SIZE)[:SIZE]


def create(b: BrokerProcess, topic: str, **configs: str) -> None:
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)


def producer(b: BrokerProcess) -> ck.Producer:
    return ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                        "enable.idempotence": True, "linger.ms": 5, "batch.size": 4096})


def send(p: ck.Producer, topic: str, i: int, on_delivery=None) -> None:
    p.produce(topic, key=key(i), value=value(i), partition=0, timestamp=BASE_TS + i,
              headers=[("i", str(i).encode())], on_delivery=on_delivery)


def produce(b: BrokerProcess, topic: str, n: int, start: int = 0) -> None:
    """Produce records ``start..start+n-1`` (acks=all, idempotent); each must land at its index."""
    failures: list[str] = []

    def done(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        elif msg.offset() != int(msg.key()[1:]):
            failures.append(f"{msg.key()!r} acknowledged at offset {msg.offset()}")
    p = producer(b)
    for i in range(start, start + n):
        send(p, topic, i, done)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert not failures, failures[:5]


def bad_record(m) -> str | None:
    """Why a consumed message is not the record produced at its offset (None: it is)."""
    i = m.offset()
    got = (m.key(), m.value(), m.timestamp()[1], m.headers())
    want = (key(i), value(i), BASE_TS + i, [("i", str(i).encode())])
    return None if got == want else f"offset {i}: got {got[0]!r}/{got[2]}, want {want[0]!r}/{want[2]}"


def consumer(b: BrokerProcess, topic: str, start: int) -> ck.Consumer:
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                     "max.partition.fetch.bytes": 64 * 1024})
    c.assign([CkTp(topic, 0, start)])
    return c


def consume_all(b: BrokerProcess, topic: str, start: int, end: int, timeout: float = 60) -> None:
    """Read ``[start, end)`` and check every record: in order, none missing, none extra."""
    c = consumer(b, topic, start)
    expected = start
    deadline = time.monotonic() + timeout
    try:
        while expected < end and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                assert m.offset() == expected, f"offset {m.offset()} read, {expected} expected"
                assert bad_record(m) is None, bad_record(m)
                expected += 1
    finally:
        c.close()
    assert expected == end, f"read [{start}, {expected}) of [{start}, {end}) in {timeout}s"


def remote_segments(root: Path, topic: str, *, writing: bool = True
                    ) -> dict[tuple[int, str], set[str]]:
    """(start offset, segment uuid) -> suffixes stored, for every object of the topic. Any file
    of another shape fails the test, but for the temporary files of PUTs in progress when the
    broker may be ``writing``."""
    out: dict[tuple[int, str], set[str]] = defaultdict(set)
    for path in remote_files(root, topic):
        if writing and ".strata-tmp-" in path.name:
            continue
        m = OBJECT_NAME.match(path.name)
        assert m, f"unexpected object in the remote tier: {path}"
        out[(int(m[1]), m[2])].add(m[3])
    return dict(out)


def metadata_history(log_dir: Path) -> dict[str, list]:
    """Every ``__remote_log_metadata`` segment event, read offline from the broker's log files,
    by segment uuid (Kafka's string form): [(state, (start, end) or None), ...] in log order
    (the events of one partition all go to one metadata partition)."""
    history: dict[str, list] = defaultdict(list)
    dirs = sorted(log_dir.glob("__remote_log_metadata-*"))
    assert dirs, "no __remote_log_metadata partitions"
    for d in dirs:
        for seg in sorted(d.glob("*.log")):
            for r in rec.iter_records(seg.read_bytes()):
                event = deserialize(r.value)
                if isinstance(event, RemoteLogSegmentMetadata):
                    history[kafka_uuid_str(event.remote_log_segment_id.id)].append(
                        (event.state, (event.start_offset, event.end_offset)))
                elif isinstance(event, RemoteLogSegmentMetadataUpdate):
                    history[kafka_uuid_str(event.remote_log_segment_id.id)].append(
                        (event.state, None))
    return dict(history)


COPIED = [S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED]
CLEANED_UP = [S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]


def check_history(history: dict[str, list], stored: set[str], end: int) -> set[str]:
    """Every segment id was either copied once and kept (no retention deletes anything in these
    tests) or was an attempt that failed and got cleaned up; the kept ones are exactly the
    segments in ``stored`` and cover [0, end) without gap or overlap. The failed attempts."""
    copied = {sid for sid, events in history.items() if states(events) == COPIED}
    failed = {sid for sid, events in history.items() if states(events) == CLEANED_UP}
    odd = {sid: events for sid, events in history.items() if sid not in copied | failed}
    assert not odd, f"segments neither kept nor cleaned up: {odd}"
    assert copied == stored, (sorted(copied - stored), sorted(stored - copied))
    ranges = sorted(history[sid][0][1] for sid in copied)
    expected = 0
    for start, last in ranges:
        assert start == expected, f"remote segments {ranges}: gap or overlap at {expected}"
        expected = last + 1
    assert expected == end, (ranges[-1:], end)
    return failed


def states(events: list) -> list[S]:
    return [state for state, _ in events]


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the broker's ``/metrics``."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def active_base(b: BrokerProcess, topic: str) -> int:
    return int(local_segments(b.data_dir / "kafka-logs", topic)[-1].stem)


def raw_fetch(bootstrap: str, topic: str, offset: int, max_wait_ms: int = 500) -> tuple[int, bytes]:
    """(error code, records) of a consumer's Fetch v12 of partition 0 at ``offset``."""
    req = fetch_request(topic, 0, offset, partition_max_bytes=64 * 1024, max_wait_ms=max_wait_ms)
    with Connection(bootstrap, timeout=30) as conn:
        p = conn.request(req, FetchResponse).responses[0].partitions[0]
    code = p.error_code.value if hasattr(p.error_code, "value") else p.error_code
    return int(code), bytes(p.records or b"")


# --------------------------------------------------------------------------- SIGKILL mid-copy


@pytest.mark.parametrize("frozen, written", [
    ("rsm-manifest", {"log", "indexes"}),   # between COPY_SEGMENT_STARTED and FINISHED
    ("indexes", {"log"}),                   # between the objects of one segment
], ids=["before-the-manifest", "between-log-and-indexes"])
def test_sigkill_in_the_middle_of_a_segment_copy(tmp_path, frozen, written):
    topic, n = "crash", 1500
    faults = {"rsm.config.fault.delay.keys": rf"\.{re.escape(frozen)}$",
              "rsm.config.fault.delay.ms": "600000"}
    b = BrokerProcess(tmp_path, {**TIERED_BROKER, **faults})
    root = b.data_dir / "kafka-logs" / "remote-storage"
    b.start()
    try:
        create(b, topic, **TIERED_TOPIC)
        produce(b, topic, n)
        # The copy of the first segment hangs on the frozen object's PUT.
        stuck = wait_for(lambda: (segs := remote_segments(root, topic))
                         and all(s == written for s in segs.values()) and segs,
                         30, what=f"a copy frozen with only {written} written")
        assert len(stuck) == 1, stuck
        (orphan_start, orphan_id), = stuck
        assert offsets(b.bootstrap, topic) == {"start": 0, "local_start": 0, "end": n,
                                               "tiered": -1}
        assert b.stop(signal.SIGKILL) == -signal.SIGKILL

        for k in faults:
            del b.overrides[k]
        b.start()
        assert offsets(b.bootstrap, topic)["end"] == n

        def settled():
            segs = remote_segments(root, topic)
            o = offsets(b.bootstrap, topic)
            return (all(s == SUFFIXES for s in segs.values()) and (orphan_start, orphan_id) not in segs
                    and o["tiered"] + 1 == active_base(b, topic) == o["local_start"] and o)
        o = wait_for(settled, 60, what="tiering to settle after the restart")
        assert o["start"] == 0 and o["end"] == n, o
        segs = remote_segments(root, topic)
        assert all(s == SUFFIXES for s in segs.values()), segs
        again = [sid for start, sid in segs if start == orphan_start]
        assert len(again) == 1 and again[0] != orphan_id, (orphan_start, orphan_id, segs)
        # every acknowledged record at its offset, across both tiers; nothing after them
        consume_all(b, topic, 0, n)
        assert b.stop() == 0
        assert remote_segments(root, topic, writing=False) == segs
    finally:
        b.stop(signal.SIGKILL)

    history = metadata_history(b.data_dir / "kafka-logs")
    assert states(history[orphan_id]) == CLEANED_UP, history[orphan_id]
    assert history[again[0]][0] == (S.COPY_SEGMENT_STARTED, history[orphan_id][0][1])
    failed = check_history(history, {sid for _, sid in segs}, o["tiered"] + 1)
    assert failed == {orphan_id}, failed


def test_sigkill_while_an_object_is_written_leaves_no_temporary_file_after_a_restart(tmp_path):
    topic, n = "midwrite", 1500
    port = free_port()
    stall = {"rsm.config.fault.stall.keys": r"\.log$"}
    b = BrokerProcess(tmp_path, {**TIERED_BROKER, **stall,
                                 "strata.metrics.listener": f"http://127.0.0.1:{port}"})
    root = b.data_dir / "kafka-logs" / "remote-storage"
    b.start()
    try:
        create(b, topic, **TIERED_TOPIC)
        produce(b, topic, n)
        # The first segment's .log object is half written when the broker dies.
        partial, = wait_for(lambda: [p for p in remote_files(root, topic)
                                     if ".strata-tmp-" in p.name],
                            30, what="an upload stalled mid-write")
        assert b.stop(signal.SIGKILL) == -signal.SIGKILL
        assert partial.exists()
        # older than the sweep's bound (incomplete.upload.max.age.ms, one hour by default)
        past = time.time() - 7200
        os.utime(partial, (past, past))

        del b.overrides["rsm.config.fault.stall.keys"]
        b.start()

        def settled():
            segs = remote_segments(root, topic)
            o = offsets(b.bootstrap, topic)
            return (not partial.exists() and segs and all(s == SUFFIXES for s in segs.values())
                    and o["tiered"] + 1 == active_base(b, topic) == o["local_start"] and o)
        wait_for(settled, 60, what="the leftover removed and tiering settled after the restart")
        removed = ("strata_remote_storage_incomplete_uploads_removed_total", (("topic", topic),))
        assert wait_for(lambda: scrape(f"http://127.0.0.1:{port}").get(removed), 30,
                        what="the removal counted") == 1
        consume_all(b, topic, 0, n)
        assert b.stop() == 0
        assert remote_segments(root, topic, writing=False)     # fails on any temporary file
    finally:
        b.stop(signal.SIGKILL)


# --------------------------------------------------------------------------- S3 outage


class Producing(threading.Thread):
    """Produces records ``start, start+1, ...`` at ``rate`` per second until stopped,
    recording each record's delivery latency and any failure."""

    def __init__(self, b: BrokerProcess, topic: str, start: int, rate: int):
        super().__init__(name="producing", daemon=True)
        self.p = producer(b)
        self.topic, self.next, self.rate = topic, start, rate
        self.latencies: list[tuple[float, float]] = []   # (sent at, latency) in seconds
        self.failures: list[str] = []
        self.acked = start - 1
        self.stopped = threading.Event()
        self.unflushed = -1

    def _done(self, i: int, sent: float):
        def done(err, msg) -> None:
            now = time.monotonic()
            if err is not None:
                self.failures.append(f"record {i}: {err}")
            elif msg.offset() != i:
                self.failures.append(f"record {i} acknowledged at offset {msg.offset()}")
            else:
                self.latencies.append((sent, now - sent))
                self.acked = max(self.acked, i)
        return done

    def run(self) -> None:
        burst = max(1, self.rate // 20)          # a burst every 50 ms
        due = time.monotonic()
        while not self.stopped.is_set():
            for _ in range(burst):
                send(self.p, self.topic, self.next, self._done(self.next, time.monotonic()))
                self.next += 1
            due += burst / self.rate
            while (left := due - time.monotonic()) > 0:
                self.p.poll(left)
            self.p.poll(0)
        self.unflushed = self.p.flush(30)

    def stop(self) -> int:
        """Stop, flush; one past the last record produced."""
        self.stopped.set()
        self.join(60)
        assert not self.is_alive()
        return self.next


class Consuming(threading.Thread):
    """Consumes from ``start`` until stopped, checking each record against what was produced
    at its offset; offsets must come in order with no gap."""

    def __init__(self, b: BrokerProcess, topic: str, start: int):
        super().__init__(name=f"consuming-{start}", daemon=True)
        self.c = consumer(b, topic, start)
        self.next = start
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                for m in self.c.consume(500, 0.2):
                    if m.error() is not None:
                        self.errors.append(str(m.error()))
                        continue
                    if m.offset() != self.next or bad_record(m) is not None:
                        self.wrong.append(f"expected {self.next}: " + (
                            bad_record(m) or f"offset {m.offset()}"))
                    self.next = m.offset() + 1
        finally:
            self.c.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


LONG_OUTAGE_S = int(os.environ.get("STRATA_S3_OUTAGE_S", "60"))
RATE = 100   # records per second


def bucket_segments(s3: S3Server, prefix: str, topic: str) -> dict[tuple[int, str], set[str]]:
    """As ``remote_segments``, for the S3 bucket, listed past the proxy."""
    store = object_store_from_config({**s3.storage_configs(),
                                      "storage.aws_endpoint": s3.direct_endpoint})
    out: dict[tuple[int, str], set[str]] = defaultdict(set)
    try:
        for k, _ in store.list(f"{prefix}{topic}-"):
            m = OBJECT_NAME.match(k.rsplit("/", 1)[-1])
            assert m, f"unexpected object in the bucket: {k}"
            out[(int(m[1]), m[2])].add(m[3])
    finally:
        store.close()
    return dict(out)


@pytest.mark.parametrize("outage_s", [
    pytest.param(20, id="short"),
    pytest.param(LONG_OUTAGE_S, id="long", marks=pytest.mark.faults),
])
def test_object_store_outage_while_producing_and_consuming(tmp_path, outage_s):
    topic, prefix = "outage", "strata/"
    with S3Server() as s3:
        rsm = {f"rsm.config.{k}": str(v) for k, v in
               s3.rsm_configs(prefix=prefix, timeout_ms=1000, max_retries=1).items()}
        # No chunk cache: what was read before the cut would be served from it (correctly),
        # and this test is about reads that must reach the store.
        overrides = {**TIERED_BROKER, **rsm, "remote.fetch.max.wait.ms": "5000",
                     "rsm.config.chunk.cache.memory.size": "0"}
        threads: list = []
        with BrokerProcess(tmp_path, overrides) as b:
            try:
                end, tiered = _outage(b, s3, topic, threads, outage_s)
            finally:
                s3.restore()
                for t in threads:
                    t.stopped.set()
                for t in threads:
                    t.join(40)
            # The attempts that failed during the outage leave nothing behind once it is over.
            segs = wait_for(lambda: (segs := bucket_segments(s3, prefix, topic))
                            and all(v == SUFFIXES for v in segs.values()) and segs,
                            30, what="the failed copies' objects to be deleted")
            assert b.stop() == 0
        assert bucket_segments(s3, prefix, topic) == segs
    failed = check_history(metadata_history(b.data_dir / "kafka-logs"),
                           {sid for _, sid in segs}, tiered + 1)
    assert failed, "no copy failed during the outage"


def _outage(b: BrokerProcess, s3: S3Server, topic: str, threads: list,
            outage_s: int) -> tuple[int, int]:
    create(b, topic, **{**TIERED_TOPIC, "internal.segment.bytes": str(64 * 1024)})
    produce(b, topic, 1000)
    before = wait_for(lambda: (o := offsets(b.bootstrap, topic))["tiered"] >= 500
                      and o["local_start"] > 500 and o, 30, what="initial tiering")
    assert before["start"] == 0
    assert raw_fetch(b.bootstrap, topic, 0)[0] == 0  # a remote read works before the outage

    prod = Producing(b, topic, 1000, RATE)
    hot = Consuming(b, topic, before["end"])
    threads += [prod, hot]
    prod.start()
    hot.start()
    time.sleep(2)

    s3.cut()
    cut_at = time.monotonic()
    time.sleep(1.5)   # a copy that finished its PUTs before the cut may still commit
    at_cut = offsets(b.bootstrap, topic)
    segments_at_cut = len(local_segments(b.data_dir / "kafka-logs", topic))

    # A remote read answers a retriable error, never data (nor wrong data).
    remote = [raw_fetch(b.bootstrap, topic, 0) for _ in range(3)]
    assert all(records == b"" for _, records in remote), remote
    assert STORAGE_ERROR in [code for code, _ in remote], remote
    # A consumer from offset 0 keeps retrying; it gets everything once the store is back.
    cold = Consuming(b, topic, 0)
    threads.append(cold)
    cold.start()

    samples = []
    while time.monotonic() - cut_at < outage_s:
        time.sleep(5)
        samples.append(offsets(b.bootstrap, topic))
        assert samples[-1]["tiered"] == at_cut["tiered"], ("tiered during the outage", samples)
        assert samples[-1]["local_start"] == at_cut["local_start"], samples
    during = offsets(b.bootstrap, topic)
    produced_during = prod.acked
    # Hot reads kept up with the producer, with the data produced.
    wait_for(lambda: hot.next > produced_during, 5, what="the hot consumer to catch up")
    assert not hot.wrong, hot.wrong[:5]
    assert cold.next == 0 and not cold.wrong, (cold.next, cold.wrong[:5])
    # Local segments piled up: nothing was tiered or deleted locally.
    assert during["tiered"] == at_cut["tiered"] and during["local_start"] == at_cut["local_start"]
    piled = len(local_segments(b.data_dir / "kafka-logs", topic)) - segments_at_cut
    # About a segment every 3 s at RATE (10 in a minute: half of what it produces).
    assert piled >= outage_s // 6, piled

    s3.restore()
    restored_at = time.monotonic()
    time.sleep(3)
    end = prod.stop()
    assert prod.unflushed == 0 and not prod.failures, prod.failures[:5]
    assert prod.acked == end - 1
    lat = sorted(latency for _, latency in prod.latencies)
    p99 = lat[int(len(lat) * 0.99)]
    in_outage = sorted(latency for sent, latency in prod.latencies if cut_at <= sent < restored_at)
    assert len(in_outage) >= RATE * outage_s * 0.8, len(in_outage)
    p99_outage = in_outage[int(len(in_outage) * 0.99)]
    print(f"produce latency: p50 {lat[len(lat) // 2]:.3f}s p99 {p99:.3f}s, during the outage "
          f"p99 {p99_outage:.3f}s; max {lat[-1]:.3f}s; {piled} segments piled up; consumer "
          f"errors: hot {hot.errors[:3]} cold {cold.errors[:3]}")
    assert p99 < 1.0 and p99_outage < 1.0, (p99, p99_outage, lat[-5:])

    # Tiering catches up by itself.
    caught_up = wait_for(lambda: (o := offsets(b.bootstrap, topic))["tiered"] + 1
                         == active_base(b, topic) and o, 60, what="tiering to catch up")
    assert caught_up["end"] == end and caught_up["start"] == 0, caught_up
    assert caught_up["tiered"] > during["end"] - 1000 and caught_up["local_start"] > during["end"] - 1000
    # The consumer started during the outage got everything, in order, once the store was back.
    wait_for(lambda: cold.next >= end, 60, what="the consumer from offset 0")
    hot.stop()
    cold.stop()
    assert not cold.wrong and not hot.wrong, (cold.wrong[:5], hot.wrong[:5])
    assert cold.next == end and hot.next == end
    # And every acknowledged record reads back from 0, now mostly from the remote tier.
    consume_all(b, topic, 0, end)
    assert offsets(b.bootstrap, topic)["tiered"] == caught_up["tiered"]
    return end, caught_up["tiered"]
