"""The workloads of the benchmarks, each driven by a real Kafka client against any
Kafka-compatible broker: confluent-kafka (librdkafka) producers and consumers, and Apache
Kafka's own ``kafka-producer-perf-test`` / ``kafka-consumer-perf-test``.

Records are 1 KiB of random (incompressible) bytes by default, no key, no compression.
MiB/s counts record value bytes only (N x record size), as Kafka's perf tools do (they print
"MB/sec" but divide by 1024 * 1024 too).
"""

from __future__ import annotations

import functools
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.brokers import java_command

MIB = 1024 * 1024
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
LATENCY_WARMUP_RECORDS = 200


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- topics --------------------------------------------------------------------------------

class Topics:
    """Creates the bench's topics with the Admin API and waits until they have leaders."""

    def __init__(self, bootstrap: str, partitions: int = 1, replication_factor: int = 1):
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.replication_factor = replication_factor

    def new(self, label: str, config: dict[str, str] | None = None) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic
        name = f"bench-{label}-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fs = admin.create_topics([NewTopic(name, num_partitions=self.partitions,
                                           replication_factor=self.replication_factor,
                                           config=dict(config or {}))],
                                 operation_timeout=30, request_timeout=15)
        fs[name].result(timeout=30)
        self.wait_ready(name)
        return name

    def wait_ready(self, name: str, timeout: float = 30) -> None:
        """Wait until every partition of ``name`` has a leader."""
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            t = admin.list_topics(name, timeout=10).topics.get(name)
            if t is not None and t.error is None and t.partitions and \
                    all(p.leader >= 0 for p in t.partitions.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not ready: {t.error if t else 'absent'}")
            time.sleep(0.1)


# --- confluent-kafka workloads -------------------------------------------------------------

# glibc's mallopt parameters and the values the harness gives them.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_TRIM_BYTES = 512 * MIB
KEPT_MMAP_BYTES = 32 * MIB   # glibc's largest mmap threshold on 64-bit


def keep_freed_heap() -> bool:
    """Has glibc keep what this process frees for its next allocations instead of handing it
    back to the kernel; False where the C library is not glibc.

    By default glibc unmaps each buffer over its mmap threshold when it is freed and returns a
    heap's free top above 128 KiB, so every reuse faults those pages in again. A consumer reading
    1 GiB allocates about that much (librdkafka's receive buffers, each value's ``bytes``): the
    harness's consumer took 156,000-175,000 minor faults per GiB read, with either broker, and on
    a VM that backs memory on first touch what each costs changes from round to round. The
    clients of every system run in the harness's process, so this applies to all of them alike;
    brokers run in processes of their own and are not affected."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_BYTES)) and \
        bool(mallopt(M_MMAP_THRESHOLD, KEPT_MMAP_BYTES))


CLIENT_HEAPS = ("kept", "returned")


def apply_client_heap(choice: str) -> str:
    """Carries out a bench's ``--client-heap`` (one of ``CLIENT_HEAPS``) in this process and
    says, for its report, what the clients' freed memory does."""
    if choice == "kept" and keep_freed_heap():
        return "glibc keeps what the clients' process frees (`--client-heap kept`)"
    return "the C library's default (glibc returns freed memory to the kernel)"


def random_values(record_size: int, count: int = 1024) -> list[bytes]:
    """Distinct random (incompressible) values, cycled through by the producers."""
    return [os.urandom(record_size) for _ in range(count)]


def producer_config(bootstrap: str, acks: str) -> dict:
    return {"bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": acks == "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": "none"}


def consumer_config(bootstrap: str) -> dict:
    """librdkafka's defaults but ``fetch.queue.backoff.ms``: once its prefetch queue is over
    ``queued.max.messages.kbytes`` (64 MiB) or ``queued.min.messages`` (100,000), librdkafka sends
    the partition's next Fetch only after that backoff (1000 ms by default); the application
    drains the queue in a tenth of that, then waits. With a broker fast enough to fill the queue, a
    200 MiB read took 1.4 s instead of 0.3 s, one Fetch arriving 1.00 s after the one before.
    Kafka's Java consumer fetches again as soon as a partition's buffered records are consumed."""
    return {"bootstrap.servers": bootstrap,
            "group.id": f"bench-assign-{uuid.uuid4().hex[:8]}",  # required; never joined
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10}


class _Deliveries:
    def __init__(self):
        self.ok = 0
        self.errors = 0
        self.first_error = None

    def __call__(self, err, msg) -> None:
        if err is None:
            self.ok += 1
        else:
            self.errors += 1
            if self.first_error is None:
                self.first_error = err


def send_flat_out(p, topic: str, n: int, values: list[bytes]) -> tuple[int, float]:
    """Hands ``n`` records (``values`` in turn, a power-of-two count) to producer ``p`` as
    fast as it takes them, then flushes; (records left undelivered, seconds taken)."""
    produce, poll, mask = p.produce, p.poll, len(values) - 1
    t0 = time.perf_counter()
    for i in range(n):
        v = values[i & mask]
        while True:
            try:
                produce(topic, v)
                break
            except BufferError:  # local queue full: let deliveries drain it
                poll(0.005)
        if not i & 1023:
            poll(0)
    remaining = p.flush(300)
    return remaining, time.perf_counter() - t0


def produce_throughput(bootstrap: str, topic: str, n: int, values: list[bytes], acks: str,
                       client: dict | None = None) -> dict:
    """``client``: more producer settings (security, for one)."""
    from confluent_kafka import Producer
    d = _Deliveries()
    p = Producer({**producer_config(bootstrap, acks), **(client or {}), "on_delivery": d})
    p.list_topics(topic, timeout=10)  # connect and learn the leader before the clock starts
    remaining, elapsed = send_flat_out(p, topic, n, values)
    if remaining or d.errors or d.ok != n:
        raise RuntimeError(f"produce acks={acks}: {d.ok}/{n} delivered, {d.errors} errors "
                           f"(first: {d.first_error}), {remaining} undelivered")
    nbytes = n * len(values[0])
    return {"MiB/s": nbytes / elapsed / MIB, "records/s": n / elapsed, "seconds": elapsed}


def consume_throughput(bootstrap: str, topic: str, partitions: list[int], n: int,
                       stall_timeout: float = 30, client: dict | None = None) -> dict:
    """``client``: more consumer settings (security, for one)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({**consumer_config(bootstrap), **(client or {})})
    try:
        # Connect and look up where each partition starts before the clock starts. Assigning
        # OFFSET_BEGINNING instead would resolve the offsets inside the timed span, one partition at
        # a time: a fetch sent for an empty partition alone then waits out fetch.wait.max.ms.
        starts = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in partitions]
        count = nbytes = 0
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, start) for p, start in zip(partitions, starts)])
        last_progress = time.monotonic()
        while count < n:
            # consume() returns when it has num_messages or at the timeout: never ask for more than is left
            msgs = c.consume(num_messages=min(n - count, 10_000), timeout=1.0)
            if not msgs:
                if time.monotonic() - last_progress > stall_timeout:
                    raise RuntimeError(f"consume: stalled at {count}/{n} records")
                continue
            last_progress = time.monotonic()
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consume: {err}")
                count += 1
                nbytes += len(m)  # the value's length
        elapsed = time.perf_counter() - t0
    finally:
        c.close()
    return {"MiB/s": nbytes / elapsed / MIB, "records/s": count / elapsed, "seconds": elapsed,
            "records": count}


def fetch_latency(bootstrap: str, topic: str, partition: int, start: int, end: int, *,
                  partition_max_bytes: int = MIB) -> dict:
    """A sequential reader's Fetch requests over offsets ``[start, end)``, one at a time on one
    connection, each for ``partition_max_bytes`` (a consumer's ``max.partition.fetch.bytes``):
    the first request's latency apart, percentiles of the rest, and MB/s of record bytes."""
    from kio.schema.fetch.v12.response import FetchResponse
    from strata.common.errors import code_of
    from strata.net.connection import Connection
    from strata.protocol.client import fetch_request
    from strata.protocol.records import iter_headers
    offset, nbytes, times = start, 0, []
    with Connection(bootstrap, timeout=60, client_id="bench-fetch") as conn:
        t_start = time.perf_counter()
        while offset < end:
            t0 = time.perf_counter()
            resp = conn.request(fetch_request(topic, partition, offset,
                                              partition_max_bytes=partition_max_bytes), FetchResponse)
            times.append(time.perf_counter() - t0)
            p = resp.responses[0].partitions[0]
            code = code_of(p.error_code)
            if code:
                raise RuntimeError(f"fetch {topic}-{partition} at {offset}: error {code}")
            records = p.records or b""
            last = None
            for last in iter_headers(records):
                pass
            if last is None:
                raise RuntimeError(f"fetch {topic}-{partition} at {offset}: no records before {end}")
            nbytes += len(records)
            offset = last.next_offset
        elapsed = time.perf_counter() - t_start
    rest = sorted(t * 1000 for t in times[1:]) or [times[0] * 1000]
    return {"first fetch ms": times[0] * 1000, "fetch p50 ms": percentile(rest, 50),
            "fetch p99 ms": percentile(rest, 99), "fetch max ms": rest[-1],
            "fetches": len(times), "MB/s": nbytes / elapsed / 1e6}


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    k = max(0, math.ceil(q / 100 * len(sorted_xs)) - 1)
    return sorted_xs[min(k, len(sorted_xs) - 1)]


def produce_latency(bootstrap: str, topic: str, rate: float, seconds: float, values: list[bytes]) -> dict:
    from confluent_kafka import Producer
    count = max(1, int(rate * seconds))
    sent = [0.0] * count
    latency = [-1.0] * count
    errors: list = []
    now = time.perf_counter

    def on_delivery(i, err, msg):
        if err is None:
            latency[i] = now() - sent[i]
        else:
            errors.append(err)

    p = Producer(producer_config(bootstrap, "all"))
    warm = _Deliveries()
    for i in range(LATENCY_WARMUP_RECORDS):
        p.produce(topic, values[i % len(values)], on_delivery=warm)
    p.flush(60)
    if warm.ok != LATENCY_WARMUP_RECORDS:
        raise RuntimeError(f"latency warm-up: {warm.ok}/{LATENCY_WARMUP_RECORDS} delivered ({warm.first_error})")
    produce, poll, mask = p.produce, p.poll, len(values) - 1
    cb = functools.partial
    t0 = now()
    i = 0
    while i < count:
        due = min(count, int((now() - t0) * rate) + 1)
        while i < due:
            sent[i] = now()
            produce(topic, values[i & mask], on_delivery=cb(on_delivery, i))
            i += 1
        # serve delivery callbacks until the next record is due (librdkafka waits in whole ms)
        wait = t0 + i / rate - now()
        poll(max(1, math.ceil(wait * 1000)) / 1000 if wait > 0 else 0)
    send_span = now() - t0
    remaining = p.flush(60)
    if errors or remaining or min(latency) < 0:
        raise RuntimeError(f"latency: {len(errors)} errors (first: {errors[:1]}), {remaining} undelivered")
    xs = sorted(x * 1000 for x in latency)
    return {"p50 ms": percentile(xs, 50), "p99 ms": percentile(xs, 99), "p99.9 ms": percentile(xs, 99.9),
            "max ms": xs[-1], "mean ms": statistics.fmean(xs), "achieved records/s": count / send_span,
            "records": count}


# --- Apache Kafka's perf tools -------------------------------------------------------------

def run_java(cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + "\n" + proc.stderr


# "200000 records sent, 51480.1 records/sec (50.27 MB/sec), 379.61 ms avg latency, 760.00 ms max
#  latency, 390 ms 50th, 610 ms 95th, 700 ms 99th, 740 ms 99.9th."
_PRODUCER_PERF_SUMMARY = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th")


def parse_producer_perf(text: str) -> dict:
    matches = _PRODUCER_PERF_SUMMARY.findall(text)
    if not matches:
        raise ValueError(f"no ProducerPerformance summary line in:\n{text[-2000:]}")
    sent, rps, mbps, avg, mx, p50, p95, p99, p999 = matches[-1]
    return {"records": int(sent), "records/s": float(rps), "MiB/s": float(mbps),
            "avg ms": float(avg), "max ms": float(mx), "p50 ms": float(p50), "p95 ms": float(p95),
            "p99 ms": float(p99), "p99.9 ms": float(p999)}


def parse_consumer_perf(text: str) -> dict:
    """The header line ("start.time, end.time, data.consumed.in.MB, MB.sec, ...") and the row after it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("start.time, end.time,"):
            names = [s.strip() for s in line.split(",")]
            for row in lines[i + 1:]:
                values = [s.strip() for s in row.split(",")]
                if len(values) == len(names):
                    return dict(zip(names, values))
    raise ValueError(f"no ConsumerPerformance summary in:\n{text[-2000:]}")


def java_produce(libs: Path, bootstrap: str, topic: str, n: int, record_size: int, acks: str = "all",
                 extra_props: list[str] = ()) -> tuple[dict, list[str]]:
    """kafka-producer-perf-test at full speed (``--throughput -1``), Java client defaults
    otherwise (batch.size 16 KiB, linger.ms 5, idempotence on with acks=all)."""
    cmd = java_command(libs, PRODUCER_PERF, "--bootstrap-server", bootstrap, "--topic", topic,
                       "--num-records", str(n), "--record-size", str(record_size), "--throughput", "-1",
                       "--command-property", f"acks={acks}", *extra_props)
    res = parse_producer_perf(run_java(cmd, timeout=120 + n / 500))
    if res["records"] != n:
        raise RuntimeError(f"kafka-producer-perf-test sent {res['records']} of {n} records")
    return res, cmd


def java_consume(libs: Path, bootstrap: str, topic: str, n: int) -> tuple[dict, list[str]]:
    cmd = java_command(libs, CONSUMER_PERF, "--bootstrap-server", bootstrap, "--topic", topic,
                       "--num-records", str(n), "--group", f"bench-perf-{uuid.uuid4().hex[:8]}",
                       "--timeout", "30000")
    row = parse_consumer_perf(run_java(cmd, timeout=120 + n / 500))
    got = int(row["data.consumed.in.nMsg"])
    if got < n:
        raise RuntimeError(f"kafka-consumer-perf-test read {got} of {n} records: {row}")
    return {"fetch MiB/s": float(row["fetch.MB.sec"]), "fetch records/s": float(row["fetch.nMsg.sec"]),
            "total MiB/s": float(row["MB.sec"]), "total records/s": float(row["nMsg.sec"]),
            "rebalance ms": float(row["rebalance.time.ms"]), "records": got}, cmd
