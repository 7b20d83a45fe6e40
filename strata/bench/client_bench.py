"""End-to-end client throughput and latency against a broker, with real Kafka clients.

    python -m strata.bench.client_bench [--records 200000] [--rounds 3] [--partitions 1]
        [--bootstrap HOST:PORT] [--workloads produce-acks1,...] [--json PATH] [--smoke]

Without ``--bootstrap`` a Strata broker is started for the run (``python -m strata.cli.main
serve`` in a temp dir under /var/tmp, loopback port) and stopped at the end; with it, any
Kafka-compatible broker already running there is measured instead (Strata or Apache Kafka:
nothing below depends on which).

Workloads (1 KiB records of random, incompressible bytes, no key, no compression), each run
``--rounds`` times, rounds interleaved so machine drift hits every workload alike:

``produce-acks1`` / ``produce-acksall``
    confluent-kafka (librdkafka) producer, ``linger.ms=5``, ``batch.size=1000000`` (librdkafka
    caps a batch at ``message.max.bytes``, 1000000 by default); acks=all also sets
    ``enable.idempotence=true``. Timed from the first ``produce()`` to the end of the final
    ``flush()``; all N deliveries must succeed.
``consume``
    confluent-kafka consumer, ``assign()`` at each partition's log start offset (looked up before
    the clock starts; no group join), default fetch settings, until all N records of the round's ``produce-acks1`` topic are read (a topic is
    filled, untimed, when that workload is not selected).
``latency``
    confluent-kafka producer, acks=all + idempotence, same batching settings, at a fixed rate
    (default 5000 records/s for 10 s, paced in 1 ms steps): per-record time from the
    ``produce()`` call to its delivery callback; p50 / p99 / p99.9 / max in ms. 200 untimed
    warm-up records first (connection, producer id).
``java-produce`` / ``java-consume``
    Apache Kafka's own ``kafka-producer-perf-test`` (``org.apache.kafka.tools.ProducerPerformance``:
    ``--num-records N --record-size 1024 --throughput -1``, ``acks=all``, Java client defaults
    otherwise) and ``kafka-consumer-perf-test`` (``ConsumerPerformance --num-records N``, a
    consumer group; reads the same topic as ``consume``). Their summary lines are parsed;
    consume is reported twice: ``fetch`` (excludes the group join) and ``total`` (includes it).
    The jars are those of ``scripts/kafka-dist.sh`` (``make kafka-dist``; never installed from
    here); without java or the jars these workloads are skipped with the reason printed.

MiB/s counts record value bytes only (N x record size), as Kafka's perf tools do; those tools
print it as "MB/sec" but divide by 1024 * 1024 too, so every row is in the same unit.

Topics are created with the Admin API's CreateTopics (``--partitions``, default 1); if the
broker refuses it, by auto-creation through a Metadata request (the started Strata broker gets
``num.partitions`` = ``--partitions`` for that). The report is a markdown table on stdout, with
the exact command lines; ``--json PATH`` also writes every round's figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KAFKA_VERSION = "4.3.1"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"

WORKLOADS = ("produce-acks1", "produce-acksall", "consume", "latency", "java-produce", "java-consume")
JAVA_WORKLOADS = ("java-produce", "java-consume")
LATENCY_WARMUP_RECORDS = 200


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the broker under test -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StrataBroker:
    """A ``strata serve`` subprocess started by :func:`start_strata`."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path, argv: list[str], log_file):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.argv = argv
        self._log_file = log_file

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
        return self.proc.returncode


def start_strata(data_dir: Path, overrides: dict[str, str] | None = None, timeout: float = 30) -> StrataBroker:
    """Run ``python -m strata.cli.main serve`` on a free loopback port with its logs in ``data_dir``
    (the same way tests/broker_process.py does); returns once the port accepts connections."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    props = {"listeners": f"PLAINTEXT://127.0.0.1:{port}",
             "log.dirs": str(data_dir / "kafka-logs"),
             **(overrides or {})}
    argv = [sys.executable, "-m", "strata.cli.main", "serve"]
    for k, v in props.items():
        argv += ["--override", f"{k}={v}"]
    log_path = data_dir / "broker.log"
    log_file = open(log_path, "ab")
    proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    broker = StrataBroker(proc, port, log_path, argv, log_file)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            broker.stop()
            raise RuntimeError(f"strata exited with {proc.returncode}:\n{broker.output_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return broker
        except OSError:
            time.sleep(0.05)
    broker.stop()
    raise TimeoutError(f"strata did not listen on {port}:\n{broker.output_tail()}")


# --- topics --------------------------------------------------------------------------------

class Topics:
    """Creates the bench's topics: CreateTopics when the broker has it, else auto-creation."""

    def __init__(self, bootstrap: str, partitions: int, replication_factor: int):
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.create_topics_error: str | None = None  # set once CreateTopics failed: use auto-create
        self.created: list[str] = []
        self.notes: list[str] = []

    def new(self, label: str) -> str:
        name = f"bench-{label}-{uuid.uuid4().hex[:8]}"
        self.create(name)
        return name

    def create(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        if self.create_topics_error is None:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                fs = admin.create_topics([NewTopic(name, num_partitions=self.partitions,
                                                   replication_factor=self.replication_factor)],
                                         operation_timeout=30, request_timeout=15)
                fs[name].result(timeout=30)
            except Exception as exc:  # noqa: BLE001 - any refusal: fall back to auto-create
                self.create_topics_error = str(exc)
                note = f"CreateTopics failed ({exc}); topics are auto-created through Metadata"
                self.notes.append(note)
                log(note)
        if self.create_topics_error is not None:
            self._auto_create(name)
        parts = self.wait_ready(name)
        if parts != self.partitions:
            note = (f"topic {name} has {parts} partitions, not --partitions={self.partitions} "
                    f"(auto-created with the broker's num.partitions)")
            if note not in self.notes:
                self.notes.append(note)
                log(note)
        self.created.append(name)

    def _auto_create(self, name: str) -> None:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": True})
        try:
            deadline = time.monotonic() + 30
            while True:
                md = p.list_topics(name, timeout=10)
                t = md.topics.get(name)
                if t is not None and t.error is None and t.partitions:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not auto-create {name}: {t.error if t else 'absent'}")
                time.sleep(0.2)
        finally:
            p.flush(1)

    def wait_ready(self, name: str, timeout: float = 30) -> int:
        """Wait until every partition of ``name`` has a leader; its partition count."""
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            md = admin.list_topics(name, timeout=10)
            t = md.topics.get(name)
            if t is not None and t.error is None and t.partitions and \
                    all(p.leader >= 0 for p in t.partitions.values()):
                return len(t.partitions)
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not ready: {t.error if t else 'absent'}")
            time.sleep(0.1)

    def partition_ids(self, name: str) -> list[int]:
        from confluent_kafka.admin import AdminClient
        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(name, timeout=10)
        return sorted(md.topics[name].partitions)

    def delete_all(self) -> None:
        """Best effort (for a long-running external broker)."""
        if not self.created:
            return
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # alive until the futures resolve
        try:
            fs = admin.delete_topics(self.created, operation_timeout=30, request_timeout=15)
            for f in fs.values():
                f.result(timeout=30)
        except Exception as exc:  # noqa: BLE001
            log(f"could not delete the bench topics ({exc}); they stay: {' '.join(self.created)}")


# --- confluent-kafka workloads -------------------------------------------------------------

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
    return {"bootstrap.servers": bootstrap,
            "group.id": f"bench-assign-{uuid.uuid4().hex[:8]}",  # required; never joined
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}


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


def produce_throughput(bootstrap: str, topic: str, n: int, values: list[bytes], acks: str) -> dict:
    from confluent_kafka import Producer
    d = _Deliveries()
    p = Producer({**producer_config(bootstrap, acks), "on_delivery": d})
    p.list_topics(topic, timeout=10)  # connect and learn the leader before the clock starts
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
    elapsed = time.perf_counter() - t0
    if remaining or d.errors or d.ok != n:
        raise RuntimeError(f"produce acks={acks}: {d.ok}/{n} delivered, {d.errors} errors "
                           f"(first: {d.first_error}), {remaining} undelivered")
    nbytes = n * len(values[0])
    return {"MiB/s": nbytes / elapsed / MIB, "records/s": n / elapsed, "seconds": elapsed}


def consume_throughput(bootstrap: str, topic: str, partitions: list[int], n: int,
                       stall_timeout: float = 30) -> dict:
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer(consumer_config(bootstrap))
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

def find_kafka_libs(explicit: str | None) -> tuple[Path | None, str]:
    """(libs dir, "") or (None, why the Java workloads are skipped). Never installs anything."""
    if shutil.which("java") is None:
        return None, "java not found on PATH"
    if explicit:
        libs = Path(explicit)
        return (libs, "") if libs.is_dir() else (None, f"--kafka-libs {libs} is not a directory")
    version = os.environ.get("KAFKA_VERSION", DEFAULT_KAFKA_VERSION)
    root = Path(os.environ.get("KAFKA_CACHE_DIR", REPO_ROOT / ".cache" / "kafka"))
    libs = root / version / "libs"
    if (root / version / ".installed").is_file() and libs.is_dir():
        return libs, ""
    return None, f"Kafka {version} jars not installed in {libs} (run scripts/kafka-dist.sh / make kafka-dist)"


def java_command(libs: Path, main_class: str, *args: str, heap: str = "-Xmx512m") -> list[str]:
    cmd = ["java", heap]
    log4j = libs.parent / "log4j2.properties"
    if log4j.is_file():
        cmd.append(f"-Dlog4j2.configurationFile={log4j}")
    return [*cmd, "-cp", f"{libs}{os.sep}*", main_class, *args]


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


def java_produce(libs: Path, bootstrap: str, topic: str, n: int, record_size: int,
                 extra_props: list[str]) -> tuple[dict, list[str]]:
    cmd = java_command(libs, PRODUCER_PERF, "--bootstrap-server", bootstrap, "--topic", topic,
                       "--num-records", str(n), "--record-size", str(record_size), "--throughput", "-1",
                       "--command-property", "acks=all", *extra_props)
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


# --- the report ----------------------------------------------------------------------------

# (workload, label in the table, metrics shown in this order)
REPORT_ROWS = (
    ("produce-acks1", "produce acks=1 (confluent-kafka)", ("MiB/s", "records/s")),
    ("produce-acksall", "produce acks=all, idempotent (confluent-kafka)", ("MiB/s", "records/s")),
    ("consume", "consume, assign from beginning (confluent-kafka)", ("MiB/s", "records/s")),
    ("latency", "produce latency at fixed rate, acks=all (confluent-kafka)",
     ("p50 ms", "p99 ms", "p99.9 ms", "max ms", "achieved records/s")),
    ("java-produce", "kafka-producer-perf-test, acks=all", ("MiB/s", "records/s", "p50 ms", "p99 ms")),
    ("java-consume", "kafka-consumer-perf-test", ("fetch MiB/s", "fetch records/s", "total MiB/s", "rebalance ms")),
)


@dataclass
class Report:
    results: dict[str, list[dict]] = field(default_factory=dict)  # workload -> one dict per round
    skipped: dict[str, str] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)        # workload -> command line (last round)

    def add(self, workload: str, figures: dict) -> None:
        self.results.setdefault(workload, []).append(figures)

    def summary(self) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        for workload, rounds in self.results.items():
            out[workload] = {}
            for metric in rounds[0]:
                xs = [r[metric] for r in rounds if metric in r]
                out[workload][metric] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
                                         "rounds": xs}
        return out


def fmt(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}"


def render(report: Report, header: list[str], selected: list[str], rounds: int) -> str:
    summary = report.summary()
    out = ["# Strata client benchmark", ""] + header + ["",
           "| workload | metric | median | min–max | rounds |", "|---|---|---|---|---|"]
    for workload, label, metrics in REPORT_ROWS:
        if workload not in selected:
            continue
        if workload in report.skipped:
            out.append(f"| {label} | skipped: {report.skipped[workload]} | | | |")
            continue
        figures = summary.get(workload)
        if not figures:
            out.append(f"| {label} | no result | | | |")
            continue
        for metric in metrics:
            if metric in figures:
                s = figures[metric]
                out.append(f"| {label} | {metric} | {fmt(s['median'])} | {fmt(s['min'])}–{fmt(s['max'])} "
                           f"| {len(s['rounds'])}/{rounds} |")
    if report.commands:
        out += ["", "Java tool command lines (last round):", ""]
        out += [f"- {w}: `{c}`" for w, c in report.commands.items()]
    return "\n".join(out)


# --- driver --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m strata.bench.client_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                   help="measure this running broker (default: start a Strata broker for the run)")
    p.add_argument("--records", type=int, default=None, help="records per throughput round (default 200000)")
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=None, help="default 3")
    p.add_argument("--partitions", type=int, default=1, help="partitions per topic")
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--latency-rate", type=float, default=5000, help="records/s of the latency workload")
    p.add_argument("--latency-seconds", type=float, default=None, help="default 10")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--java-producer-prop", action="append", default=[], metavar="KEY=VALUE",
                   help="extra --command-property for kafka-producer-perf-test (repeatable)")
    p.add_argument("--kafka-libs", default=None, help="Kafka libs dir (default: the kafka-dist.sh cache)")
    p.add_argument("--strata-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra broker property for the started Strata broker (repeatable)")
    p.add_argument("--dir", default=None, help="data dir of the started broker (default: temp dir in /var/tmp)")
    p.add_argument("--keep-dir", action="store_true", help="keep the started broker's data dir")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run to check the harness: 2000 records, 1 round, 1 s of latency "
                        "(explicit --records/--rounds/--latency-seconds still win)")
    args = p.parse_args(argv)
    defaults = {"records": 2000, "rounds": 1, "latency_seconds": 1.0} if args.smoke else \
        {"records": 200_000, "rounds": 3, "latency_seconds": 10.0}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.selected = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(args.selected) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if args.records < 1 or args.rounds < 1 or args.partitions < 1:
        p.error("--records, --rounds and --partitions must be positive")
    return args


def git_describe() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{head}{' (uncommitted changes)' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def run(args: argparse.Namespace, bootstrap: str, report: Report, libs: Path | None) -> list[str]:
    """All rounds of the selected workloads against ``bootstrap``; notes on topic creation."""
    topics = Topics(bootstrap, args.partitions, args.replication_factor)
    values = random_values(args.record_size)
    sel = args.selected
    n = args.records
    try:
        for r in range(args.rounds):
            log(f"round {r + 1}/{args.rounds}")
            source = None  # this round's topic of n confluent-kafka records, read by both consumers
            if "produce-acks1" in sel:
                source = topics.new(f"acks1-r{r}")
                res = produce_throughput(bootstrap, source, n, values, "1")
                report.add("produce-acks1", res)
                log(f"  produce acks=1: {res['MiB/s']:.2f} MiB/s, {res['records/s']:,.0f} records/s")
            if "produce-acksall" in sel:
                t = topics.new(f"acksall-r{r}")
                res = produce_throughput(bootstrap, t, n, values, "all")
                report.add("produce-acksall", res)
                log(f"  produce acks=all: {res['MiB/s']:.2f} MiB/s, {res['records/s']:,.0f} records/s")
            needs_source = "consume" in sel or ("java-consume" in sel and libs is not None)
            if needs_source and source is None:
                source = topics.new(f"fill-r{r}")
                produce_throughput(bootstrap, source, n, values, "1")
                log("  filled a topic for the consumers (untimed)")
            if "consume" in sel:
                res = consume_throughput(bootstrap, source, topics.partition_ids(source), n)
                report.add("consume", res)
                log(f"  consume: {res['MiB/s']:.2f} MiB/s, {res['records/s']:,.0f} records/s")
            if "latency" in sel:
                t = topics.new(f"latency-r{r}")
                res = produce_latency(bootstrap, t, args.latency_rate, args.latency_seconds, values)
                report.add("latency", res)
                log(f"  latency at {res['achieved records/s']:,.0f} records/s: p50 {res['p50 ms']:.2f} ms, "
                    f"p99 {res['p99 ms']:.2f} ms, p99.9 {res['p99.9 ms']:.2f} ms")
            if libs is not None and "java-produce" in sel:
                t = topics.new(f"java-r{r}")
                extra = [x for kv in args.java_producer_prop for x in ("--command-property", kv)]
                res, cmd = java_produce(libs, bootstrap, t, n, args.record_size, extra)
                report.add("java-produce", res)
                report.commands["java-produce"] = shlex.join(cmd)
                log(f"  kafka-producer-perf-test: {res['MiB/s']:.2f} MiB/s, {res['records/s']:,.0f} records/s")
            if libs is not None and "java-consume" in sel:
                res, cmd = java_consume(libs, bootstrap, source, n)
                report.add("java-consume", res)
                report.commands["java-consume"] = shlex.join(cmd)
                log(f"  kafka-consumer-perf-test: fetch {res['fetch MiB/s']:.2f} MiB/s, "
                    f"total {res['total MiB/s']:.2f} MiB/s")
    finally:
        if args.bootstrap:  # a started broker's data dir goes away anyway
            topics.delete_all()
    return topics.notes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import confluent_kafka
    ck_version = confluent_kafka.version()
    ck_version = ck_version[0] if isinstance(ck_version, tuple) else ck_version

    command = shlex.join([sys.executable, "-m", "strata.bench.client_bench",
                          *(sys.argv[1:] if argv is None else argv)])
    report = Report()
    libs = None
    if any(w in args.selected for w in JAVA_WORKLOADS):
        libs, reason = find_kafka_libs(args.kafka_libs)
        if libs is None:
            for w in JAVA_WORKLOADS:
                if w in args.selected:
                    report.skipped[w] = reason
            log(f"skipping the Java workloads: {reason}")

    broker: StrataBroker | None = None
    base: Path | None = None
    if args.bootstrap:
        bootstrap, target = args.bootstrap, f"broker already running at {args.bootstrap}"
    else:
        base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="strata-client-bench-", dir="/var/tmp"))
        overrides = {"num.partitions": str(args.partitions)}
        for item in args.strata_override:
            k, sep, v = item.partition("=")
            if not sep:
                raise SystemExit(f"--strata-override expects KEY=VALUE, got {item!r}")
            overrides[k.strip()] = v.strip()
        broker = start_strata(base, overrides)
        bootstrap = broker.bootstrap
        target = f"Strata {git_describe()} started by the bench: `{shlex.join(broker.argv)}`"
    load = os.getloadavg()
    header = [
        f"- command: `{command}`",
        f"- target: {target}",
        f"- {args.records:,} records of {args.record_size} B (random) per throughput round, "
        f"{args.rounds} round(s), {args.partitions} partition(s) per topic; latency: "
        f"{args.latency_rate:g} records/s for {args.latency_seconds:g} s",
        f"- confluent-kafka {ck_version} (librdkafka {confluent_kafka.libversion()[0]}), "
        f"producer: linger.ms=5 batch.size=1000000 compression none; Python {platform.python_version()}",
        f"- machine: {os.cpu_count()} CPUs, load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"(client and broker share it)",
        "- MiB/s = record value bytes / 2^20 per second (Kafka's perf tools' \"MB\" is the same unit)",
    ]
    failed = None
    try:
        try:
            notes = run(args, bootstrap, report, libs)
        except Exception as exc:  # report what finished, then fail
            failed = exc
            notes = []
            if broker is not None:
                log(f"broker log tail:\n{broker.output_tail()}")
    finally:
        if broker is not None:
            code = broker.stop()
            if code not in (0, None):
                log(f"strata exited with {code}")
        if base is not None and not args.keep_dir and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    header += [f"- note: {n}" for n in notes]
    print(render(report, header, args.selected, args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": command, "target": target, "bootstrap": bootstrap,
            "params": {k: getattr(args, k) for k in ("records", "record_size", "rounds", "partitions",
                                                     "latency_rate", "latency_seconds", "selected")},
            "summary": report.summary(), "skipped": report.skipped, "java_commands": report.commands,
            "notes": notes, "error": None if failed is None else repr(failed),
        }, indent=2) + "\n")
    if failed is not None:
        raise failed
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
