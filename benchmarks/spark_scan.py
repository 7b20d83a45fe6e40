"""Full-history scan of a tiered Strata topic with Spark: the ``strata`` source in ``direct`` mode
(remote segments straight from the object store) and in ``broker`` mode (everything through
Fetch), against Spark's own Kafka connector (spark-sql-kafka-0-10, through Fetch).

    python -m benchmarks.spark_scan                  # make bench-spark: 1 GiB, 3 rounds
    python -m benchmarks.spark_scan --smoke          # 8 MiB, 1 round, under a minute

One Strata broker (``strata serve``, filesystem remote tier, ``--remote-latency-ms`` added to
every GET of its remote tier and of the ``direct`` readers', metrics on a local port) holds one
topic of ``--gib`` GiB of ``--record-size`` byte random values in 2 partitions, produced with
confluent-kafka, in ``--segment-mib`` MiB segments with ``local.retention.bytes=1``: once
tiering settles, all but each partition's active segment is only in the remote tier.

A Spark session on ``local[2]`` then scans the topic's whole history, ``--rounds`` times per
mode (the mode order rotates each round), as
``df.selectExpr("count(*)", "sum(length(value))")`` so that every row is materialised; each
scan's count and byte sum are checked against the topic. Each mode first scans the whole topic
once untimed, so that round 1 finds the Python workers started and the JVM's row conversion and
the connector's code compiled, as every later round does. Per scan it records rows/s, MB/s of
record values, and from the broker's ``/metrics`` the remote-tier reads it served meanwhile:
Fetch reads of remote data
(``kafka_server_BrokerTopicMetrics_RemoteFetchRequestsPerSec_total{topic}``), their bytes, and
its object-store GETs. The broker has no per-API request counter, so Fetch requests
for local data are not counted.

The report is markdown (stdout; ``--report-md`` replaces the section between the
``make bench-spark`` markers of that file) and every scan's figures as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.brokers import REPO_ROOT, Broker, free_port, make_broker
from benchmarks.compare import (
    git_describe, machine_facts, parse_overrides, prom_sum, replace_section, tiered_topic_config)
from benchmarks.workloads import MIB, Topics, log, producer_config, random_values
from strata.spark import session

MODES = ("direct", "broker", "connector")
MODE_LABELS = {
    "direct": "strata source, `direct` (remote segments from the object store)",
    "broker": "strata source, `broker` (everything through Fetch)",
    "connector": "Spark's Kafka connector (spark-sql-kafka-0-10, Fetch)",
}
MARK_START = "<!-- make bench-spark: start -->"
MARK_END = "<!-- make bench-spark: end -->"
HEADING = "## Spark: full-history scan (`make bench-spark`)"
GIB = 1024 * MIB
PARTITIONS = 2
REMOTE_FETCH_REQUESTS = "kafka_server_BrokerTopicMetrics_RemoteFetchRequestsPerSec_total"
REMOTE_FETCH_BYTES = "kafka_server_BrokerTopicMetrics_RemoteFetchBytesPerSec_total"
REMOTE_STORE_REQUESTS = "strata_remote_storage_requests_total"
SCAN_EXPRS = ("count(*) AS rows", "sum(length(value)) AS value_bytes")


@dataclass
class Params:
    gib: float = 1.0
    record_size: int = 1024
    segment_mib: int = 64
    rounds: int = 3
    remote_latency_ms: float = 0.0
    modes: tuple[str, ...] = MODES

    @classmethod
    def smoke(cls) -> Params:
        return cls(gib=8 / 1024, segment_mib=1, rounds=1)

    @property
    def records(self) -> int:
        return int(self.gib * GIB) // self.record_size


@dataclass
class Scan:
    """One timed full-history scan and the broker's remote-tier work meanwhile."""
    mode: str
    round: int
    seconds: float
    rows: int
    value_bytes: int
    remote_fetches: float       # Fetch reads of remote data the broker served
    remote_fetch_bytes: float
    broker_gets: float          # the broker's object-store GETs

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.seconds / 1e6


@dataclass
class Topic:
    name: str
    rows: int                   # records in the topic (every partition from offset 0)
    value_bytes: int
    remote_segments: int
    local_segments: int
    remote_bytes: int
    high_watermarks: dict[int, int] = field(default_factory=dict)


# --- the broker and its topic ------------------------------------------------------------------

def tiered_state(metrics_url: str, topic: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{metrics_url}/tiered/{topic}", timeout=10) as r:
        return json.loads(r.read())["partitions"]


def scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as r:
        return r.read().decode()


def broker_counters(metrics_url: str, topic: str) -> dict[str, float]:
    text = scrape(metrics_url)
    return {"remote_fetches": prom_sum(text, REMOTE_FETCH_REQUESTS, topic=topic),
            "remote_fetch_bytes": prom_sum(text, REMOTE_FETCH_BYTES, topic=topic),
            "broker_gets": prom_sum(text, REMOTE_STORE_REQUESTS, op="GET", topic=topic)}


def wait_tiered(metrics_url: str, topic: str, timeout: float) -> list[dict[str, Any]]:
    """Until every partition's rolled segments are in the remote tier and gone locally."""
    deadline = time.monotonic() + timeout
    parts: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        parts = tiered_state(metrics_url, topic)
        if len(parts) == PARTITIONS and all(
                p["local_segments"] == 1 and p["remote_segments"]
                and p["highest_offset_in_remote_storage"] + 1 == p["local_log_start_offset"]
                for p in parts):
            return parts
        time.sleep(0.5)
    raise TimeoutError(f"{topic} not tiered after {timeout:.0f} s: {parts}")


def produce(bootstrap: str, topic: str, n: int, values: list[bytes]) -> None:
    """``n`` records, alternating between the partitions, acks=1."""
    from confluent_kafka import Producer
    failed: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)
    p = Producer({**producer_config(bootstrap, "1"), "on_delivery": delivered})
    send, poll, mask = p.produce, p.poll, len(values) - 1
    for i in range(n):
        while True:
            try:
                send(topic, values[i & mask], partition=i % PARTITIONS)
                break
            except BufferError:  # local queue full: let deliveries drain it
                poll(0.005)
        if not i & 1023:
            poll(0)
    remaining = p.flush(600)
    if remaining or failed:
        raise RuntimeError(f"produce to {topic}: {remaining} undelivered, {len(failed)} failed "
                           f"(first: {failed[:1]})")


def fill_topic(broker: Broker, metrics_url: str, p: Params) -> Topic:
    name = Topics(broker.bootstrap, partitions=PARTITIONS).new(
        "spark-scan", tiered_topic_config(p.segment_mib * MIB))
    n = p.records
    log(f"producing {n:,} records of {p.record_size} B ({n * p.record_size / MIB:,.0f} MiB) to {name}")
    produce(broker.bootstrap, name, n, random_values(p.record_size))
    parts = wait_tiered(metrics_url, name, timeout=120 + n * p.record_size / (20 * MIB))
    hw = {int(x["partition"]): int(x["high_watermark"]) for x in parts}
    if sum(hw.values()) != n or any(x["log_start_offset"] != 0 for x in parts):
        raise RuntimeError(f"{name}: expected {n} records from offset 0, the broker has {parts}")
    return Topic(name, n, n * p.record_size,
                 remote_segments=sum(x["remote_segments"] for x in parts),
                 local_segments=sum(x["local_segments"] for x in parts),
                 remote_bytes=sum(x["remote_bytes"] for x in parts), high_watermarks=hw)


# --- Spark -------------------------------------------------------------------------------------

def connector_jars() -> tuple[list[Path], str]:
    """The jars of ``scripts/spark-kafka-dist.sh`` for the installed PySpark (never installs)."""
    import pyspark
    root = Path(os.environ.get("SPARK_KAFKA_CACHE_DIR", REPO_ROOT / ".cache" / "spark-kafka"))
    dist = root / pyspark.__version__
    jars = sorted((dist / "jars").glob("*.jar")) if (dist / ".installed").is_file() else []
    if not jars:
        return [], (f"Spark's Kafka connector is not installed in {dist / 'jars'} "
                    f"(run scripts/spark-kafka-dist.sh or make spark-kafka-dist)")
    return jars, ""


def source_options(broker: Broker, topic: str, mode: str, p: Params) -> dict[str, str]:
    """The strata source's options: the broker, the topic, the mode and, for ``direct``, the
    broker's remote tier (with the same added GET latency)."""
    opts = {"bootstrap.servers": broker.bootstrap, "subscribe": topic, "mode": mode}
    if mode == "direct":
        opts["rsm.config.storage.url"] = broker.remote_dir().as_uri()
        if p.remote_latency_ms:
            opts["rsm.config.fault.get.latency.ms"] = f"{p.remote_latency_ms:g}"
    return opts


def scan_frame(spark, mode: str, broker: Broker, topic: str, p: Params):
    """The DataFrame of ``topic``'s whole history in ``mode``."""
    if mode == "connector":
        return (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                .option("subscribe", topic).option("startingOffsets", "earliest")
                .option("endingOffsets", "latest").load())
    return (spark.read.format("strata").options(**source_options(broker, topic, mode, p))
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").load())


def run_scan(spark, mode: str, broker: Broker, metrics_url: str, topic: Topic, p: Params,
             round_no: int) -> Scan:
    before = broker_counters(metrics_url, topic.name)
    t0 = time.perf_counter()
    row = scan_frame(spark, mode, broker, topic.name, p).selectExpr(*SCAN_EXPRS).collect()[0]
    seconds = time.perf_counter() - t0
    after = broker_counters(metrics_url, topic.name)
    rows, value_bytes = int(row["rows"]), int(row["value_bytes"] or 0)
    if (rows, value_bytes) != (topic.rows, topic.value_bytes):
        raise RuntimeError(f"{mode} scan of {topic.name}: {rows:,} rows / {value_bytes:,} bytes, "
                           f"expected {topic.rows:,} / {topic.value_bytes:,}")
    return Scan(mode, round_no, seconds, rows, value_bytes,
                **{k: after[k] - before[k] for k in before})


def warm_up(spark, mode: str, broker: Broker, metrics_url: str, topic: Topic, p: Params) -> None:
    """One untimed full scan in ``mode`` (checked like the timed ones)."""
    scan = run_scan(spark, mode, broker, metrics_url, topic, p, 0)
    log(f"warm-up {mode}: {scan.seconds:.1f} s, {scan.mb_per_s:,.1f} MB/s (not counted)")


# --- the report --------------------------------------------------------------------------------

def _fmt(x: float, count: bool = False) -> str:
    if count or x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _spread(xs: list[float], count: bool = False) -> str:
    """median (min–max), or the one value; ``count``: whole numbers."""
    if len(xs) == 1:
        return _fmt(xs[0], count)
    return (f"{_fmt(statistics.median(xs), count)} "
            f"({_fmt(min(xs), count)}–{_fmt(max(xs), count)})")


def render(scans: list[Scan], p: Params, topic: Topic, command: str, facts: list[str],
           versions: list[str], date: datetime.date) -> str:
    """The markdown report: the setup, one row per mode, and the direct/connector ratio."""
    out = [f"Run {date.isoformat()}: `{command}`", ""]
    out += [f"- machine: {m}" for m in facts]
    out += [f"- {v}" for v in versions]
    latency = f"{p.remote_latency_ms:g} ms added to every remote GET" if p.remote_latency_ms \
        else "no added GET latency"
    out += [f"- topic: {topic.rows:,} records of {p.record_size} B in {PARTITIONS} partitions "
            f"({topic.value_bytes / GIB:.2f} GiB of values), {p.segment_mib} MiB segments: "
            f"{topic.remote_segments} remote ({topic.remote_bytes / MIB:,.0f} MiB), "
            f"{topic.local_segments} local (the active ones); filesystem remote tier, {latency}",
            f"- scan: `df.selectExpr(\"count(*)\", \"sum(length(value))\")` over the whole history "
            f"on `local[2]`, {p.rounds} round(s), mode order rotating; MB/s counts record values "
            f"(10^6 B); broker figures are per scan, from its `/metrics`", ""]
    out += ["| scan | rows/s | MB/s | seconds | remote-data Fetch reads served by the broker "
            "| remote bytes through the broker (MB) | broker object-store GETs |",
            "|---|---|---|---|---|---|---|"]
    for mode in p.modes:
        mine = [s for s in scans if s.mode == mode]
        if not mine:
            continue
        out.append(f"| {MODE_LABELS[mode]} | {_spread([s.rows_per_s for s in mine])} "
                   f"| {_spread([s.mb_per_s for s in mine])} | {_spread([s.seconds for s in mine])} "
                   f"| {_spread([s.remote_fetches for s in mine], count=True)} "
                   f"| {_spread([s.remote_fetch_bytes / 1e6 for s in mine])} "
                   f"| {_spread([s.broker_gets for s in mine], count=True)} |")
    ratio = speedup(scans, "direct", "connector")
    if ratio is not None:
        direct_load = max(s.remote_fetches for s in scans if s.mode == "direct")
        per_round = ", ".join(f"{r:.2f}×" for r in round_speedups(scans, "direct", "connector"))
        out += ["", f"`direct` / connector (median rows/s): **{ratio:.2f}×** (goal ≥ 3×; "
                    f"per round: {per_round}); remote-data Fetch reads the broker served "
                    f"during `direct` scans: **{direct_load:.0f}** (goal 0)."]
    return "\n".join(out)


def speedup(scans: list[Scan], a: str, b: str) -> float | None:
    """Median rows/s of mode ``a`` over mode ``b``'s, when both ran."""
    xa = [s.rows_per_s for s in scans if s.mode == a]
    xb = [s.rows_per_s for s in scans if s.mode == b]
    if not xa or not xb:
        return None
    return statistics.median(xa) / statistics.median(xb)


def round_speedups(scans: list[Scan], a: str, b: str) -> list[float]:
    """Mode ``a``'s rows/s over mode ``b``'s in each round both ran, in round order: the two
    scans of a round run back to back, so a machine that speeds up or slows down between
    rounds moves both."""
    xa = {s.round: s.rows_per_s for s in scans if s.mode == a}
    xb = {s.round: s.rows_per_s for s in scans if s.mode == b}
    return [xa[r] / xb[r] for r in sorted(xa.keys() & xb.keys())]


def report_json(scans: list[Scan], p: Params, topic: Topic, command: str,
                versions: list[str], date: datetime.date) -> dict[str, Any]:
    return {"date": date.isoformat(), "command": command, "params": asdict(p),
            "topic": asdict(topic), "versions": versions,
            "scans": [{**asdict(s), "rows/s": s.rows_per_s, "MB/s": s.mb_per_s} for s in scans],
            "direct/connector": speedup(scans, "direct", "connector"),
            "direct/connector per round": round_speedups(scans, "direct", "connector")}


# --- driver ------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spark_scan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="8 MiB in 1 MiB segments, 1 round")
    ap.add_argument("--gib", type=float, default=None, help="topic size in GiB (default 1)")
    ap.add_argument("--rounds", type=int, default=None, help="scans per mode (default 3; smoke 1)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {','.join(MODES)}")
    ap.add_argument("--record-size", type=int, default=None, help="bytes per value (default 1024)")
    ap.add_argument("--segment-mib", type=int, default=None, help="segment.bytes in MiB (default 64)")
    ap.add_argument("--remote-latency-ms", type=float, default=None,
                    help="added to every remote GET (rsm.config.fault.get.latency.ms; default 0)")
    ap.add_argument("--strata-override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra broker setting")
    ap.add_argument("--dir", default=None, help="the broker's data dir (default: a temp dir in /var/tmp)")
    ap.add_argument("--report-md", type=Path, default=None,
                    help="replace the `make bench-spark` section of this markdown file")
    ap.add_argument("--json", type=Path, default=None, help="write every scan's figures here")
    args = ap.parse_args(argv)
    p = Params.smoke() if args.smoke else Params()
    for k in ("gib", "rounds", "record_size", "segment_mib", "remote_latency_ms"):
        if getattr(args, k) is not None:
            setattr(p, k, getattr(args, k))
    p.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not p.modes or set(p.modes) - set(MODES):
        ap.error(f"--modes takes a comma list of {', '.join(MODES)}")
    if p.rounds < 1 or p.records < PARTITIONS:
        ap.error("need at least 1 round and a topic of some MiB")
    args.params = p
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    p: Params = args.params
    command = shlex.join(["python", "-m", "benchmarks.spark_scan",
                          *(sys.argv[1:] if argv is None else argv)])
    jars, why = connector_jars()
    if "connector" in p.modes and not jars:
        raise SystemExit(why)
    import pyspark
    versions = [f"Strata {git_describe()} (`strata serve`, filesystem remote tier)",
                f"PySpark {pyspark.__version__}"
                + (f", {', '.join(j.stem for j in jars if 'kafka' in j.name)}" if jars else "")]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="strata-spark-scan-",
                                                                 dir="/var/tmp"))
    metrics_url = f"http://127.0.0.1:{free_port()}"
    broker_props = {"strata.metrics.listener": metrics_url,
                    **({"rsm.config.fault.get.latency.ms": f"{p.remote_latency_ms:g}"}
                       if p.remote_latency_ms else {}),
                    **parse_overrides(args.strata_override)}
    broker = make_broker("strata", base / "strata", None, broker_props)
    scans: list[Scan] = []
    spark = None
    try:
        broker.start()
        topic = fill_topic(broker, metrics_url, p)
        log(f"{topic.name}: {topic.remote_segments} remote segments, {topic.local_segments} local")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = session("local[2]", "strata-bench-spark-scan",
                        [("spark.ui.enabled", "false"), ("spark.sql.shuffle.partitions", "2"),
                         ("spark.python.worker.reuse", "true")], jars)
        for mode in p.modes:
            warm_up(spark, mode, broker, metrics_url, topic, p)
        for r in range(p.rounds):
            k = r % len(p.modes)
            for mode in p.modes[k:] + p.modes[:k]:
                scan = run_scan(spark, mode, broker, metrics_url, topic, p, r + 1)
                log(f"round {r + 1}/{p.rounds} {mode}: {scan.seconds:.1f} s, "
                    f"{scan.rows_per_s:,.0f} rows/s, {scan.mb_per_s:,.1f} MB/s, "
                    f"{scan.remote_fetches:.0f} remote Fetch reads by the broker")
                scans.append(scan)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    date = datetime.date.today()
    report = render(scans, p, topic, command, machine_facts(), versions, date)
    print(report)
    if args.report_md:
        replace_section(args.report_md, report, start=MARK_START, end=MARK_END, heading=HEADING)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report_json(scans, p, topic, command, versions, date),
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
