"""Strata and Apache Kafka side by side on this machine: the same workloads, clients and broker
settings against each, in alternating rounds, with medians, spreads and Strata/Kafka ratios.

    python -m benchmarks.compare                    # make bench: both systems, 3 rounds
    python -m benchmarks.compare --smoke            # make bench-smoke: Strata only, tiny sizes

Each round starts each system afresh (a new data dir; Kafka in KRaft mode from the jars of
``scripts/kafka-dist.sh`` with ``LocalTieredStorage``, Strata with its filesystem remote tier;
settings in ``benchmarks.brokers``), runs the selected workloads in this order, restarts the
broker for the restart figure, and stops it. Each round begins with an untimed warm-up
(``warmup_records`` produced and consumed) so that Kafka's JIT is not measured cold.
Systems alternate in A B B A A B ... order, so the machine's drift reaches both and neither
always runs first (right after the ceilings' 1 GiB of writes, in the first round).

``produce-acks1`` / ``produce-acksall``
    confluent-kafka producer, linger.ms=5, batch.size=1000000; acks=all is idempotent.
``consume``
    confluent-kafka consumer (assigned, no group) reading the acks=1 topic from its start
    (``fetch.queue.backoff.ms`` 10: see ``benchmarks.workloads.consumer_config``).
``latency``
    acks=all producer at a fixed rate below saturation: produce() to delivery, p50/p99/p99.9.
``java-produce-acks1`` / ``java-produce-acksall`` / ``java-consume``
    Kafka's kafka-producer-perf-test (Java client defaults: batch.size 16 KiB, linger.ms 5) and
    kafka-consumer-perf-test (a consumer group; ``fetch`` excludes the group join).
``cold-consume``
    A tiered topic (``remote.storage.enable=true``, ``local.retention.bytes=1``, 16 MiB
    segments) is filled, untimed, until every segment but the active one is in the remote tier
    and gone locally; then a confluent-kafka consumer reads that history from offset 0.
``latency-cold-reader``
    ``latency`` on a new topic while another process reads the cold topic from the remote tier
    in a loop (KIP-405's test case 2); also the cold reader's MiB/s meanwhile.
``remote-read``
    KIP-405 history reads at object-store latency, on a broker of their own: Strata's remote tier
    answers every GET ``--remote-latency-ms`` (50) late (``rsm.config.fault.get.latency.ms``) and
    stores 4 MiB chunks; Kafka's ``LocalTieredStorage`` reads files and cannot inject latency.
    Two tiered topics of ``--remote-mib`` MiB in ``remote_segment_mib`` MiB segments: a
    confluent-kafka consumer reads the first one's remote history (MB/s; on Strata also GETs
    issued per chunk of remote bytes, from its ``strata_remote_storage_requests_total``), and
    sequential 1 MiB Fetch requests, one at a time, read the second one's (the first request's
    latency, p50/p99 of the rest), against the same Fetch loop over a hot local topic
    (``hot_mib``): the "cold/hot p99" ratio.
``restart``
    A tiered topic of ``--restart-segments`` 1 MiB segments, all remote; the broker is stopped
    cleanly and started: seconds to answering Metadata, and to serving offset 0 from the remote
    tier (the remote log metadata loaded).

Beside the figures of each throughput workload and of ``latency``: the broker's CPU-seconds
(user + system of the broker process and its children, the JVM for Kafka, from ``/proc``;
``benchmarks.cpu``) over the workload's span, and per GiB of record values moved
("broker CPU s/GiB"; /proc counts in clock ticks, 10 ms, so tiny runs read 0).

Beside them, in ``--json`` and the log, what the rest of the machine did over the span
(``benchmarks.cpu.MachineMeter``): CPU-seconds idle and stolen by the hypervisor, and MiB the
kernel wrote back from the page cache. A round slower than its CPU-seconds explain waited on
one of these. Every round starts after ``sync``, so no round pays for the writeback of the
one before it.

The confluent-kafka clients run in this process, which keeps the memory it frees
(``--client-heap kept``, the default: ``benchmarks.workloads.keep_freed_heap``); with
``--client-heap returned`` glibc hands it back to the kernel as it does by default, and the
clients fault it in again.

``--cpu-load N`` runs every round of both systems contended: N background processes spin on the
CPU from the first round's start to the last round's end.

Before the first round and after the last it measures the machine's ceilings (page-cache read,
fsync'd write, loopback TCP). The report is markdown (stdout, and ``--report-md`` replaces the
section between the ``make bench`` markers of that file), matplotlib charts (``--charts-dir``)
and every round's figures (``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import ceilings
from benchmarks.brokers import (
    COMMON_BROKER, REPO_ROOT, Broker, find_kafka_libs, kafka_version, make_broker)
from benchmarks.cpu import CpuMeter, MachineMeter
from benchmarks.workloads import (
    CLIENT_HEAPS, MIB, Topics, apply_client_heap, consume_throughput, java_consume, java_produce,
    log, produce_latency, produce_throughput, random_values)
from strata.net.connection import list_offset
from strata.protocol.client import EARLIEST_LOCAL, LATEST, LATEST_TIERED

SYSTEMS = ("strata", "kafka")
WORKLOADS = ("produce-acks1", "produce-acksall", "consume", "latency", "java-produce-acks1",
             "java-produce-acksall", "java-consume", "cold-consume", "latency-cold-reader", "remote-read", "restart")
JAVA_WORKLOADS = ("java-produce-acks1", "java-produce-acksall", "java-consume")
COLD_SEGMENT_BYTES = 16 * MIB
RESTART_SEGMENT_BYTES = MIB   # Kafka's smallest segment.bytes
REMOTE_CHUNK_BYTES = 4 * MIB
CPU = "broker CPU s/GiB"
MARK_START = "<!-- make bench: start -->"
MARK_END = "<!-- make bench: end -->"

# (workload, label, metric, higher is better) rows of the table, in order; the first metric of a
# workload marked for a chart is drawn there.
ROWS = (
    ("produce-acks1", "produce acks=1 (confluent-kafka)", "MiB/s", True),
    ("produce-acks1", "produce acks=1 (confluent-kafka)", CPU, False),
    ("produce-acksall", "produce acks=all, idempotent (confluent-kafka)", "MiB/s", True),
    ("produce-acksall", "produce acks=all, idempotent (confluent-kafka)", CPU, False),
    ("consume", "hot consume (confluent-kafka)", "MiB/s", True),
    ("consume", "hot consume (confluent-kafka)", CPU, False),
    ("java-produce-acks1", "kafka-producer-perf-test acks=1", "MiB/s", True),
    ("java-produce-acks1", "kafka-producer-perf-test acks=1", CPU, False),
    ("java-produce-acksall", "kafka-producer-perf-test acks=all", "MiB/s", True),
    ("java-produce-acksall", "kafka-producer-perf-test acks=all", CPU, False),
    ("java-consume", "kafka-consumer-perf-test (fetch)", "fetch MiB/s", True),
    ("java-consume", "kafka-consumer-perf-test (incl. group join)", CPU, False),
    ("cold-consume", "cold consume from the remote tier (confluent-kafka)", "MiB/s", True),
    ("cold-consume", "cold consume from the remote tier (confluent-kafka)", CPU, False),
    ("latency", "produce latency, fixed rate, acks=all", "p50 ms", False),
    ("latency", "produce latency, fixed rate, acks=all", "p99 ms", False),
    ("latency", "produce latency, fixed rate, acks=all", "p99.9 ms", False),
    ("latency", "produce latency, fixed rate, acks=all", CPU, False),
    ("latency-cold-reader", "produce latency with a cold reader", "p50 ms", False),
    ("latency-cold-reader", "produce latency with a cold reader", "p99 ms", False),
    ("latency-cold-reader", "produce latency with a cold reader", "p99.9 ms", False),
    ("latency-cold-reader", "produce latency with a cold reader", "cold reader MiB/s", True),
    ("remote-read", "remote-tier consumer (Strata: 50 ms GETs)", "MB/s", True),
    ("remote-read", "remote-tier Fetch, after the first", "fetch p50 ms", False),
    ("remote-read", "remote-tier Fetch, after the first", "fetch p99 ms", False),
    ("remote-read", "remote-tier Fetch, the first", "first fetch ms", False),
    ("remote-read", "hot local Fetch", "hot fetch p99 ms", False),
    ("remote-read", "remote-tier Fetch p99 / hot Fetch p99", "cold/hot p99", False),
    ("remote-read", "GETs issued / (remote bytes read / chunk size)", "GETs per chunk", False),
    ("java-produce-acksall", "kafka-producer-perf-test acks=all", "p99 ms", False),
    ("java-consume", "kafka-consumer-perf-test (incl. group join)", "total MiB/s", True),
    ("restart", "restart: to answering Metadata", "seconds", False),
    ("restart", "restart: to serving offset 0 from the remote tier", "to remote read s", False),
)
THROUGHPUT_CHART = [r for r in ROWS if r[2] in ("MiB/s", "fetch MiB/s", "MB/s")]
LATENCY_CHART = [r for r in ROWS if r[0] in ("latency", "latency-cold-reader") and r[2].endswith(" ms")]
CPU_CHART = [r for r in ROWS if r[2] == CPU]


@dataclass
class Params:
    records: int = 200_000
    record_size: int = 1024
    latency_rate: float = 5000
    latency_seconds: float = 10
    cold_mib: int = 512
    restart_segments: int = 500
    ceiling_mib: int = 1024
    warmup_records: int = 200_000
    remote_mib: int = 1024
    remote_segment_mib: int = 256
    remote_latency_ms: float = 50
    hot_mib: int = 256
    cpu_load: int = 0             # background processes spinning on the CPU during the rounds

    @classmethod
    def smoke(cls) -> Params:
        return cls(records=2000, latency_rate=500, latency_seconds=1, cold_mib=40,
                   restart_segments=3, ceiling_mib=16, warmup_records=1000, remote_mib=24,
                   remote_segment_mib=4, hot_mib=8)


@dataclass
class Results:
    rounds: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # system -> workload -> rounds
    skipped: dict[str, str] = field(default_factory=dict)                   # workload -> why
    ceilings: list[dict[str, float]] = field(default_factory=list)
    commands: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)                  # workload -> file

    def add(self, system: str, workload: str, figures: dict) -> None:
        self.rounds.setdefault(system, {}).setdefault(workload, []).append(figures)

    def stats(self, system: str, workload: str, metric: str) -> tuple[float, float, float, int] | None:
        xs = [r[metric] for r in self.rounds.get(system, {}).get(workload, []) if metric in r]
        if not xs:
            return None
        return statistics.median(xs), min(xs), max(xs), len(xs)


# --- the tiered workloads ------------------------------------------------------------------

def tiered_topic_config(segment_bytes: int) -> dict[str, str]:
    return {"remote.storage.enable": "true", "local.retention.bytes": "1",
            "segment.bytes": str(segment_bytes)}


def wait_until_remote(bootstrap: str, topic: str, timeout: float) -> dict[str, int]:
    """Wait until everything but the active segment is tiered and gone locally: the local log
    starts right after the highest tiered offset, and the active segment is the last one."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        offs = {}
        for name, ts in (("end", LATEST), ("local_start", EARLIEST_LOCAL), ("tiered", LATEST_TIERED)):
            err, off, _ = list_offset(bootstrap, topic, 0, ts)
            if err:
                raise RuntimeError(f"ListOffsets({ts}) on {topic}: error {err}")
            offs[name] = off
        last = offs
        if offs["tiered"] >= 0 and offs["local_start"] == offs["tiered"] + 1 and \
                _settled(bootstrap, topic, offs):
            return offs
        time.sleep(0.25)
    raise TimeoutError(f"{topic} not tiered after {timeout:.0f} s: {last}")


def _settled(bootstrap: str, topic: str, offs: dict[str, int]) -> bool:
    # Settled when a second look a task interval later shows no more progress.
    time.sleep(1.0)
    err, local_start, _ = list_offset(bootstrap, topic, 0, EARLIEST_LOCAL)
    return not err and local_start == offs["local_start"]


def fill_tiered(bootstrap: str, topics: Topics, label: str, mib: int, segment_bytes: int,
                values: list[bytes], timeout: float) -> tuple[str, dict[str, int], float]:
    """A new tiered topic with ``mib`` MiB produced and tiered; (topic, offsets, seconds
    the tiering took after the last record was acknowledged)."""
    topic = topics.new(label, tiered_topic_config(segment_bytes))
    n = mib * MIB // len(values[0])
    produce_throughput(bootstrap, topic, n, values, "1")
    t0 = time.monotonic()
    offs = wait_until_remote(bootstrap, topic, timeout)
    return topic, offs, time.monotonic() - t0


def cold_reader_loop(bootstrap: str, topic: str, end: int, stop, out) -> None:
    """Read ``topic`` [0, end) again and again until ``stop`` is set; put (bytes, seconds)."""
    from confluent_kafka import Consumer, TopicPartition
    from benchmarks.workloads import consumer_config
    c = Consumer(consumer_config(bootstrap))
    nbytes = 0
    t0 = time.perf_counter()
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while not stop.is_set():
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    continue
                nbytes += len(m)
                if m.offset() >= end - 1:
                    c.seek(TopicPartition(topic, 0, 0))
                    break
    finally:
        out.put((nbytes, time.perf_counter() - t0))
        c.close()


def latency_with_cold_reader(bootstrap: str, topics: Topics, cold_topic: str, cold_end: int,
                             p: Params, values: list[bytes]) -> dict:
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=cold_reader_loop, args=(bootstrap, cold_topic, cold_end, stop, out),
                         daemon=True)
    reader.start()
    try:
        time.sleep(1.0)   # the reader is connected and reading
        res = produce_latency(bootstrap, topics.new("latency-cold"), p.latency_rate,
                              p.latency_seconds, values)
    finally:
        stop.set()
        nbytes, seconds = out.get(timeout=60)
        reader.join(30)
    res["cold reader MiB/s"] = nbytes / seconds / MIB
    return res


def prom_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of metric ``name`` whose labels include ``labels`` (Prometheus
    text format)."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            if all(w in head for w in want):
                total += float(value)
    return total


def remote_read(system: str, data: Path, libs: Path | None, p: Params,
                overrides: dict[str, str] | None, values: list[bytes]) -> dict:
    """The ``remote-read`` workload on a broker of its own (see the module docstring)."""
    import urllib.request
    from benchmarks.brokers import free_port
    from benchmarks.workloads import fetch_latency
    extra: dict[str, str] = {}
    metrics = None
    if system == "strata":
        metrics = f"http://127.0.0.1:{free_port()}"
        extra = {"rsm.config.fault.get.latency.ms": f"{p.remote_latency_ms:g}",
                 "rsm.config.chunk.size": str(REMOTE_CHUNK_BYTES),
                 "strata.metrics.listener": metrics}
    broker = make_broker(system, data, libs, {**extra, **(overrides or {})})
    broker.start()
    bootstrap = broker.bootstrap
    topics = Topics(bootstrap, 1, 1)
    segment = p.remote_segment_mib * MIB

    def scrape(path: str) -> str:
        with urllib.request.urlopen(metrics + path, timeout=30) as r:
            return r.read().decode()

    try:
        hot = topics.new("hot")
        n_hot = p.hot_mib * MIB // len(values[0])
        produce_throughput(bootstrap, hot, n_hot, values, "1")
        hot_res = fetch_latency(bootstrap, hot, 0, 0, n_hot)
        first, offs1, _ = fill_tiered(bootstrap, topics, "remote-consume", p.remote_mib, segment,
                                      values, timeout=900)
        second, offs2, _ = fill_tiered(bootstrap, topics, "remote-fetch", p.remote_mib, segment,
                                       values, timeout=900)
        gets_before = prom_sum(scrape("/metrics"), "strata_remote_storage_requests_total",
                               op="GET", topic=first) if metrics else 0
        res = consume_throughput(bootstrap, first, [0], offs1["local_start"])
        out = {"MB/s": res["MiB/s"] * MIB / 1e6}
        if metrics:
            gets = prom_sum(scrape("/metrics"), "strata_remote_storage_requests_total",
                            op="GET", topic=first) - gets_before
            remote_bytes = json.loads(scrape(f"/tiered/{first}"))["partitions"][0]["remote_bytes"]
            out["GETs"] = gets
            out["GETs per chunk"] = gets / (remote_bytes / REMOTE_CHUNK_BYTES)
        cold = fetch_latency(bootstrap, second, 0, 0, offs2["local_start"])
    finally:
        code = broker.stop()
        if code not in (0, None, 143, -15):
            log(f"{system} exited with {code}:\n{broker.output_tail()}")
        shutil.rmtree(data, ignore_errors=True)
    out.update({k: cold[k] for k in ("first fetch ms", "fetch p50 ms", "fetch p99 ms", "fetch max ms")})
    out["fetch MB/s"] = cold["MB/s"]
    out["hot fetch p99 ms"] = hot_res["fetch p99 ms"]
    out["cold/hot p99"] = cold["fetch p99 ms"] / hot_res["fetch p99 ms"]
    return out


def restart_figures(broker: Broker, topic: str) -> dict:
    """Stop the broker cleanly, start it, and time it back to Metadata and to a remote read."""
    from confluent_kafka import Consumer, TopicPartition
    from benchmarks.workloads import consumer_config
    broker.stop()
    to_metadata = broker.start(timeout=600)
    c = Consumer({**consumer_config(broker.bootstrap), "fetch.wait.max.ms": 10})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            m = c.poll(0.05)
            if m is not None and m.error() is None and m.offset() == 0:
                return {"seconds": to_metadata, "to remote read s": time.monotonic() - broker.started_at}
        raise TimeoutError(f"offset 0 of {topic} not served within 600 s of the restart")
    finally:
        c.close()


# --- profiling -----------------------------------------------------------------------------

class PySpy:
    """``py-spy record`` of the Strata broker for the span of one workload (raw collapsed stacks)."""

    def __init__(self, out_dir: Path | None, pid: int, workload: str) -> None:
        self.proc = None
        self.path = None
        beside = Path(sys.executable).with_name("py-spy")     # the venv's, from the test extras
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if out_dir is None or exe is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / f"{workload}.txt"
        self.proc = subprocess.Popen([exe, "record", "-p", str(pid), "-f", "raw", "-r", "200",
                                      "--threads", "-o", str(self.path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class CpuLoad:
    """``n`` processes that spin on the CPU from ``__enter__`` to ``__exit__``: the same
    background load for both systems' rounds. Driver thread only."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> CpuLoad:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


# --- one system, one round -----------------------------------------------------------------

def run_round(system: str, round_no: int, libs: Path | None, p: Params, selected: list[str],
              results: Results, base: Path, overrides: dict[str, dict[str, str]],
              profile_dir: Path | None) -> None:
    data = base / f"{system}-{round_no}"
    os.sync()   # the last round's (or run's) dirty pages are written back on no one's clock
    broker = make_broker(system, data, libs, overrides.get(system))
    broker.start()
    bootstrap = broker.bootstrap
    values = random_values(p.record_size)
    topics = Topics(bootstrap, 1, 1)
    n = p.records

    @contextmanager
    def measured(workload: str):
        """The workload's span: profiled if asked (Strata only), the broker's CPU-seconds over it
        and what the rest of the machine did meanwhile."""
        spy_dir = profile_dir / system if profile_dir and system == "strata" else None
        with PySpy(spy_dir, broker.pid, workload), CpuMeter(broker.pid) as cpu, \
                MachineMeter() as machine:
            yield cpu, machine

    def record(workload: str, figures: dict, meters: tuple[CpuMeter, MachineMeter] | None = None,
               records: int = 0) -> None:
        if meters is not None:
            cpu, machine = meters
            figures.update(cpu.figures(records * p.record_size))
            figures.update(machine.figures())
        results.add(system, workload, figures)
        shown = ", ".join(f"{k} {v:,.2f}" for k, v in figures.items() if isinstance(v, (int, float)))
        log(f"  {system} {workload}: {shown}")

    try:
        # Untimed warm-up, the same for both: a JVM's JIT (and any broker's caches) start cold.
        warm = topics.new("warmup")
        produce_throughput(bootstrap, warm, p.warmup_records, values, "1")
        consume_throughput(bootstrap, warm, [0], p.warmup_records)
        source = None
        if "produce-acks1" in selected:
            source = topics.new("acks1")
            with measured("produce-acks1") as meters:
                res = produce_throughput(bootstrap, source, n, values, "1")
            record("produce-acks1", res, meters, n)
        if "produce-acksall" in selected:
            t = topics.new("acksall")
            with measured("produce-acksall") as meters:
                res = produce_throughput(bootstrap, t, n, values, "all")
            record("produce-acksall", res, meters, n)
        if source is None and ("consume" in selected or "java-consume" in selected):
            source = topics.new("fill")
            produce_throughput(bootstrap, source, n, values, "1")
        if "consume" in selected:
            with measured("consume") as meters:
                res = consume_throughput(bootstrap, source, [0], n)
            record("consume", res, meters, n)
        if "latency" in selected:
            t = topics.new("latency")
            with measured("latency") as meters:
                res = produce_latency(bootstrap, t, p.latency_rate, p.latency_seconds, values)
            record("latency", res, meters, res["records"])
        for acks in ("1", "all"):
            w = f"java-produce-acks{acks}"
            if w in selected and libs is not None:
                t = topics.new(f"java{acks}")
                with measured(w) as meters:
                    res, cmd = java_produce(libs, bootstrap, t, n, p.record_size, acks)
                record(w, res, meters, n)
                results.commands[w] = shlex.join(cmd)
        if "java-consume" in selected and libs is not None:
            with measured("java-consume") as meters:
                res, cmd = java_consume(libs, bootstrap, source, n)
            record("java-consume", res, meters, res["records"])
            results.commands["java-consume"] = shlex.join(cmd)
        cold = None
        if "cold-consume" in selected or "latency-cold-reader" in selected:
            cold, offs, took = fill_tiered(bootstrap, topics, "cold", p.cold_mib, COLD_SEGMENT_BYTES,
                                           values, timeout=600)
            log(f"  {system}: cold topic tiered up to offset {offs['tiered']} "
                f"{took:.1f} s after the last produce")
            cold_end = offs["local_start"]
            if "cold-consume" in selected:
                with measured("cold-consume") as meters:
                    res = consume_throughput(bootstrap, cold, [0], cold_end)
                res["tiering wait s"] = took
                record("cold-consume", res, meters, res["records"])
            if "latency-cold-reader" in selected:
                with measured("latency-cold-reader"):   # its bytes are mixed: no CPU per GiB
                    record("latency-cold-reader",
                           latency_with_cold_reader(bootstrap, topics, cold, cold_end, p, values))
        if "remote-read" in selected:
            # its own broker: the round's one is not the process to profile here
            record("remote-read", remote_read(system, data / "remote-read", libs, p,
                                              overrides.get(system), values))
        if "restart" in selected:
            rtopic, offs, took = fill_tiered(bootstrap, topics, "restart", p.restart_segments,
                                             RESTART_SEGMENT_BYTES, values, timeout=1800)
            segments = sum(rtopic in str(f) for f in broker.remote_dir().rglob("*.log"))
            res = restart_figures(broker, rtopic)
            res["remote segments"] = segments
            record("restart", res)
    finally:
        code = broker.stop()
        if code not in (0, None, 143, -15):
            log(f"{system} exited with {code}:\n{broker.output_tail()}")
        shutil.rmtree(data, ignore_errors=True)


# --- the report ----------------------------------------------------------------------------

def fmt(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}"


def render_table(results: Results, systems: list[str], selected: list[str]) -> list[str]:
    head = ["workload", "metric"] + [f"{s.capitalize()} median (min–max)" for s in systems]
    if systems == list(SYSTEMS):
        head.append("Strata/Kafka")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload, label, metric, higher in ROWS:
        if workload not in selected:
            continue
        if workload in results.skipped:
            out.append(f"| {label} | skipped: {results.skipped[workload]} |" + " |" * (len(head) - 2))
            continue
        cells, medians = [], []
        for s in systems:
            st = results.stats(s, workload, metric)
            if st is None:
                cells.append("–")
                medians.append(None)
            else:
                cells.append(f"{fmt(st[0])} ({fmt(st[1])}–{fmt(st[2])})")
                medians.append(st[0])
        if len(head) > 2 + len(systems):
            a, b = medians
            ratio = f"{a / b:.2f}" if a is not None and b else "–"
            cells.append(ratio)
        out.append(f"| {label} | {metric} ({'higher' if higher else 'lower'} is better) | "
                   + " | ".join(cells) + " |")
    return out


def machine_facts() -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()[:1] \
        if shutil.which("java") else ["no java"]
    import confluent_kafka
    ck = confluent_kafka.version()
    ck = ck[0] if isinstance(ck, tuple) else ck
    return [f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}",
            f"Python {platform.python_version()}, {java[0] if java else '?'}, confluent-kafka "
            f"{ck} (librdkafka {confluent_kafka.libversion()[0]})"]


def git_describe() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def render(results: Results, systems: list[str], selected: list[str], p: Params, command: str,
           versions: dict[str, str], rounds: int, charts: list[Path], client_heap: str) -> str:
    date = datetime.date.today().isoformat()
    out = [f"Run {date}: `{command}`", ""]
    out += [f"- machine: {m}" for m in machine_facts()]
    out += [f"- {s}: {versions[s]}" for s in systems]
    out += [f"- client heap: {client_heap}"]
    if p.cpu_load:
        out += [f"- contended: {p.cpu_load} background process(es) spinning on the CPU throughout "
                "every round of both systems"]
    order = [s for r in range(min(rounds, 2)) for s in round_order(systems, r)]
    out += [f"- {rounds} round(s) per system in alternating order ({' '.join(order)} ...); "
            f"{p.records:,} records of {p.record_size} B per throughput workload; latency at "
            f"{p.latency_rate:g} records/s for {p.latency_seconds:g} s after an untimed warm-up of "
            f"{p.warmup_records:,} records produced and consumed; cold topic {p.cold_mib} MiB in "
            f"{COLD_SEGMENT_BYTES // MIB} MiB segments; remote-read topics {p.remote_mib} MiB in "
            f"{p.remote_segment_mib} MiB segments, {REMOTE_CHUNK_BYTES // MIB} MiB chunks, Strata's GETs "
            f"{p.remote_latency_ms:g} ms late, hot topic {p.hot_mib} MiB; restart with "
            f"{p.restart_segments} remote segments",
            "- broker settings both systems get: "
            + ", ".join(f"`{k}={v}`" for k, v in COMMON_BROKER.items()),
            f"- {CPU}: CPU-seconds (user + system, from /proc) of the broker process and its "
            "children (the JVM for Kafka) over the workload, per GiB of record values moved"]
    if results.ceilings:
        keys = list(results.ceilings[0])
        out += ["- machine ceilings (before / after the rounds): "
                + "; ".join(f"{k.removesuffix(' MiB/s')} " + " / ".join(f"{c[k]:,.0f}" for c in results.ceilings)
                            + " MiB/s" for k in keys)]
    out += ["", *render_table(results, systems, selected)]
    if results.commands:
        out += ["", "Kafka tool command lines (last round):", ""]
        out += [f"- {w}: `{c}`" for w, c in sorted(results.commands.items())]
    if charts:
        out += [""] + [f"![{c.stem}](benchmarks/{c.name})" for c in charts]
    return "\n".join(out)


def draw_charts(results: Results, systems: list[str], selected: list[str], out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = {"strata": "#2a7ab0", "kafka": "#555555"}
    paths = []
    for name, rows, ylabel, log_scale in (
            ("throughput", THROUGHPUT_CHART, "MiB/s (median, bars: min–max)", False),
            ("latency", LATENCY_CHART, "ms (median, bars: min–max; log scale)", True),
            ("cpu", CPU_CHART, "broker CPU-seconds per GiB (median, bars: min–max)", False)):
        rows = [r for r in rows if r[0] in selected and any(results.stats(s, r[0], r[2]) for s in systems)]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows) + 2), 4.5))
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            meds, lo, hi = [], [], []
            for r in rows:
                st = results.stats(s, r[0], r[2]) or (0, 0, 0, 0)
                meds.append(st[0])
                lo.append(st[0] - st[1])
                hi.append(st[2] - st[0])
            xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(rows))]
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=s.capitalize(), color=colors.get(s))
        labels = [f"{r[1]}\n{r[2]}" if name == "latency" else r[1] for r in rows]
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_wrap(label) for label in labels], fontsize=7)
        ax.set_ylabel(ylabel)
        if log_scale:
            ax.set_yscale("log")
        ax.set_title({"throughput": "Throughput per workload", "latency": "Produce latency percentiles",
                      "cpu": "Broker CPU per GiB moved"}[name])
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _wrap(text: str, width: int = 18) -> str:
    words, lines, line = text.replace("\n", " \n ").split(" "), [], ""
    for w in words:
        if w == "\n" or (line and len(line) + len(w) + 1 > width):
            lines.append(line)
            line = "" if w == "\n" else w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "\n".join(x for x in lines if x)


def replace_section(path: Path, section: str, start: str = MARK_START, end: str = MARK_END,
                    heading: str = "## Strata vs Apache Kafka (`make bench`)") -> None:
    """Put ``section`` between the ``start`` and ``end`` markers of ``path`` (appended under
    ``heading`` when the markers are not there yet)."""
    text = path.read_text() if path.exists() else ""
    block = f"{start}\n{section}\n{end}"
    if start in text and end in text:
        a, b = text.index(start), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + f"\n\n{heading}\n\n" + block + "\n"
    path.write_text(text)


# --- driver --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, 1 round, Strata only (make bench-smoke)")
    ap.add_argument("--systems", default=None, help="comma list of strata,kafka (default both; smoke: strata)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (smoke: 1)")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--latency-rate", type=float, default=None)
    ap.add_argument("--latency-seconds", type=float, default=None)
    ap.add_argument("--cold-mib", type=int, default=None)
    ap.add_argument("--restart-segments", type=int, default=None)
    ap.add_argument("--remote-mib", type=int, default=None)
    ap.add_argument("--remote-latency-ms", type=float, default=None)
    ap.add_argument("--ceiling-mib", type=int, default=None)
    ap.add_argument("--strata-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kafka-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kafka-libs", default=None, help="Kafka jars dir (default: scripts/kafka-dist.sh's cache)")
    ap.add_argument("--dir", default=None, help="where the brokers' data goes (default: a temp dir in /var/tmp)")
    ap.add_argument("--report-md", type=Path, default=None,
                    help="replace the `make bench` section of this markdown file with the report")
    ap.add_argument("--charts-dir", type=Path, default=None, help="write PNG charts here")
    ap.add_argument("--json", type=Path, default=None, help="write every round's figures here")
    ap.add_argument("--cpu-load", type=int, default=None, metavar="N",
                    help="N background processes spin on the CPU during every round (contended)")
    ap.add_argument("--client-heap", choices=CLIENT_HEAPS, default="kept",
                    help="whether this process's glibc keeps freed memory for its clients (default kept)")
    ap.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                    help="record py-spy raw profiles of the Strata broker per workload into DIR")
    args = ap.parse_args(argv)
    args.selected = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(args.selected) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    args.system_list = [s.strip() for s in (args.systems or ("strata" if args.smoke else ",".join(SYSTEMS))).split(",")]
    if set(args.system_list) - set(SYSTEMS):
        ap.error(f"--systems takes {', '.join(SYSTEMS)}")
    args.rounds = args.rounds or (1 if args.smoke else 3)
    p = Params.smoke() if args.smoke else Params()
    for k in ("records", "latency_rate", "latency_seconds", "cold_mib", "restart_segments", "ceiling_mib",
              "remote_mib", "remote_latency_ms", "cpu_load"):
        if getattr(args, k) is not None:
            setattr(p, k, getattr(args, k))
    args.params = p
    return args


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``--*-override KEY=VALUE`` arguments as a dict."""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"overrides are KEY=VALUE, got {item!r}")
        out[k.strip()] = v.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    p: Params = args.params
    systems, selected = args.system_list, args.selected
    command = shlex.join(["python", "-m", "benchmarks.compare", *(sys.argv[1:] if argv is None else argv)])
    results = Results()
    client_heap = apply_client_heap(args.client_heap)
    log(f"client heap: {client_heap}")
    libs, why = find_kafka_libs(args.kafka_libs)
    if libs is None:
        if "kafka" in systems:
            raise SystemExit(f"cannot run Apache Kafka: {why}")
        for w in JAVA_WORKLOADS:
            if w in selected:
                results.skipped[w] = why
                log(f"skipping {w}: {why}")
    versions = {"strata": f"Strata {git_describe()} (`strata serve`, filesystem remote tier)",
                "kafka": f"Apache Kafka {kafka_version(libs) if libs else '?'} (KRaft, LocalTieredStorage)"}
    overrides = {"strata": parse_overrides(args.strata_override),
                 "kafka": parse_overrides(args.kafka_override)}
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="strata-compare-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        results.ceilings.append(ceilings.measure(base, p.ceiling_mib))
        with CpuLoad(p.cpu_load):
            for r in range(args.rounds):
                for system in round_order(systems, r):
                    log(f"round {r + 1}/{args.rounds}: {system}")
                    run_round(system, r + 1, libs, p, selected, results, base, overrides, args.py_spy)
        results.ceilings.append(ceilings.measure(base, p.ceiling_mib))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    charts = draw_charts(results, systems, selected, args.charts_dir) if args.charts_dir else []
    report = render(results, systems, selected, p, command, versions, args.rounds, charts, client_heap)
    print(report)
    if args.report_md:
        replace_section(args.report_md, report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "params": vars(p), "systems": systems,
                                         "versions": versions, "client_heap": client_heap,
                                         "ceilings": results.ceilings,
                                         "rounds": results.rounds, "skipped": results.skipped,
                                         "commands": results.commands}, indent=1) + "\n")
    problems = check_figures(results, systems, selected)
    for problem in problems:
        log(f"bad figures: {problem}")
    return 1 if problems else 0


def round_order(systems: list[str], round_index: int) -> list[str]:
    """A B, then B A, then A B ...: each system runs first in every other round."""
    return list(systems) if round_index % 2 == 0 else list(reversed(systems))


def check_figures(results: Results, systems: list[str], selected: list[str]) -> list[str]:
    """What is wrong with a run's figures: a workload without figures, a throughput that is not
    positive, percentiles out of order."""
    problems = []
    for s in systems:
        for w in selected:
            if w in results.skipped:
                continue
            rounds = results.rounds.get(s, {}).get(w)
            if not rounds:
                problems.append(f"{s} {w}: no figures")
                continue
            for fig in rounds:
                for k, v in fig.items():
                    if ("MiB/s" in k or "MB/s" in k) and not v > 0:
                        problems.append(f"{s} {w}: {k} = {v}")
                pcts = [fig[k] for k in ("p50 ms", "p99 ms", "p99.9 ms") if k in fig]
                if pcts != sorted(pcts) or any(x <= 0 for x in pcts):
                    problems.append(f"{s} {w}: percentiles {pcts}")
    return problems


if __name__ == "__main__":
    raise SystemExit(main())
