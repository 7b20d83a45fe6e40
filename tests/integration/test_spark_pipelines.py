"""The pipelines (``backfill``, ``audit``, ``usage``) and ``strata spark JOB`` against a live
tiered broker, on Spark ``local[2]``.

Read-only checks use the shared ``tiered_topic`` (2 partitions, >= 10 remote segments each and
a local tail); the backfill reads its own topic, whose records span three UTC days, and the
audit damages a topic of its own.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from spark_support import (  # noqa: F401 - fixtures
    Produced, TieredTopic, create_tiered_topic, make_tiered_topic, produce_records, spark,
    tiered_broker, tiered_topic, wait_tiering_settled)
from strata.common.types import uuid_to_kafka_str as kafka_str
from strata.spark.pipelines import audit, backfill, usage
from strata.spark.pipelines.usage import GIB, describe_log_dirs, segment_requests

pytestmark = pytest.mark.slow

DAY = 86_400_000
TODAY = int(datetime.datetime.now(datetime.timezone.utc)
            .replace(hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)
DAYS = [TODAY - 3 * DAY, TODAY - 2 * DAY, TODAY - DAY]      # midnights, inside retention
PER_DAY = 600
STRATA = Path(sys.executable).with_name("strata")


def utc_date(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d")


@pytest.fixture(scope="module")
def days_topic(tiered_broker) -> TieredTopic:
    """2 partitions, ``PER_DAY`` records on each of three UTC days (from 06:00), mostly remote."""
    name = "pipeline-days"
    create_tiered_topic(tiered_broker, name, 2)
    records: list[Produced] = []
    for d, midnight in enumerate(DAYS):
        records += produce_records(tiered_broker.bootstrap, name, 2, PER_DAY,
                                   first_index=d * PER_DAY, base_ts=midnight + 6 * 3_600_000
                                   - d * PER_DAY)
    records.sort(key=lambda r: (r.partition, r.offset))
    wait_tiering_settled(tiered_broker, name, 2)
    return TieredTopic(tiered_broker, tiered_broker.bootstrap, name, 2, tiered_broker.data_dir,
                       tiered_broker.remote_root, records)


def written_rows(spark, path: Path) -> list[tuple]:
    df = spark.read.parquet(str(path))
    return sorted(tuple(r) for r in df.selectExpr(
        "partition", "offset", "key", "value", "unix_millis(timestamp)", "timestampType",
        "headers", "CAST(date AS STRING)").collect())


def expected_rows(records: list[Produced]) -> list[tuple]:
    return sorted((r.partition, r.offset, r.key, r.value, r.timestamp, 0,
                   [(k, v) for k, v in r.headers], utc_date(r.timestamp)) for r in records)


def normalise(rows: list[tuple]) -> list[tuple]:
    """Spark rows as plain values (bytearray -> bytes, header Rows -> tuples; no headers -> [])."""
    out = []
    for p, o, k, v, ts, tt, headers, date in rows:
        out.append((p, o, None if k is None else bytes(k), bytes(v), ts, tt,
                    [(h[0], bytes(h[1])) for h in headers or ()], date))
    return sorted(out)


# ---- backfill ----------------------------------------------------------------------------------

def test_backfill_writes_the_whole_history_as_parquet_partitioned_by_utc_date(spark, days_topic,
                                                                              tmp_path):
    out = tmp_path / "full"
    rows = backfill(spark, days_topic.topic, str(out), options=days_topic.options())
    assert rows == len(days_topic.records) == 3 * PER_DAY
    assert sorted(p.name for p in out.glob("date=*")) == [f"date={utc_date(d)}" for d in DAYS]
    assert normalise(written_rows(spark, out)) == expected_rows(days_topic.records)


def test_backfill_of_a_time_range_writes_exactly_the_records_inside_it(spark, days_topic, tmp_path):
    start = DAYS[0] + 6 * 3_600_000 + 250      # inside the first day's records
    end = DAYS[2]                              # midnight before the third day
    out = tmp_path / "range"
    rows = backfill(spark, days_topic.topic, str(out), options=days_topic.options(),
                    start_timestamp=start, end_timestamp=end)
    inside = [r for r in days_topic.records if start <= r.timestamp < end]
    assert rows == len(inside) and 0 < len(inside) < len(days_topic.records)
    assert sorted(p.name for p in out.glob("date=*")) == [f"date={utc_date(d)}" for d in DAYS[:2]]
    assert normalise(written_rows(spark, out)) == expected_rows(inside)


def test_backfill_appends_and_overwrites_only_the_dates_it_writes(spark, days_topic, tmp_path):
    out = str(tmp_path / "modes")
    day = {d: [r for r in days_topic.records if DAYS[d] <= r.timestamp < DAYS[d] + DAY]
           for d in range(3)}
    opts = days_topic.options()
    assert backfill(spark, days_topic.topic, out, options=opts, start_timestamp=DAYS[0],
                    end_timestamp=DAYS[1]) == len(day[0])
    assert backfill(spark, days_topic.topic, out, options=opts, start_timestamp=DAYS[1],
                    end_timestamp=DAYS[2], mode="append") == len(day[1])
    assert backfill(spark, days_topic.topic, out, options=opts, start_timestamp=DAYS[1],
                    end_timestamp=DAYS[2], mode="overwrite-dates") == len(day[1])
    assert normalise(written_rows(spark, Path(out))) == expected_rows(day[0] + day[1])


# ---- audit -------------------------------------------------------------------------------------

def remote_logs(tt: TieredTopic, partition: int) -> list[Path]:
    """The topic's ``.log`` objects of one partition in the filesystem remote tier."""
    [topic_dir] = [d for d in tt.remote_root.iterdir() if d.name.startswith(f"{tt.topic}-")
                   and len(d.name) == len(tt.topic) + 23]
    return sorted((topic_dir / str(partition)).glob("*.log"))


def test_audit_of_a_clean_topic_reports_nothing_with_and_without_spark(spark, tiered_topic):
    segments = sum(len(remote_logs(tiered_topic, p)) for p in range(tiered_topic.partitions))
    plain = audit(tiered_topic.options(), tiered_topic.topic)
    assert plain.ok, plain.format_table()
    assert plain.segments == segments >= 20 and plain.objects == 3 * segments
    assert plain.chunks_verified >= segments
    with_spark = audit(tiered_topic.options(), tiered_topic.topic, spark=spark)
    assert with_spark.ok and (with_spark.segments, with_spark.chunks_verified) == \
        (plain.segments, plain.chunks_verified)


@pytest.fixture(scope="module")
def damaged_topic(tiered_broker) -> tuple[TieredTopic, dict[str, str]]:
    """A topic of its own with one .log object deleted, a byte flipped inside another and an
    orphan object planted: (topic, {"missing": key, "corrupt": key, "orphan": key})."""
    tt = make_tiered_topic(tiered_broker, "pipeline-audit", partitions=1, remote_segments=4,
                           tail_records=10)
    logs = remote_logs(tt, 0)
    missing, corrupt = logs[1], logs[2]
    missing.unlink()
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    orphan = logs[0].with_name(f"{0:020d}-{kafka_str(uuid.uuid4())}.log")
    orphan.write_bytes(b"an object no metadata knows")
    key = lambda p: p.relative_to(tt.remote_root).as_posix()  # noqa: E731
    return tt, {"missing": key(missing), "corrupt": key(corrupt), "orphan": key(orphan)}


def test_audit_reports_exactly_the_missing_object_the_orphan_and_the_corrupt_chunk(damaged_topic):
    tt, keys = damaged_topic
    report = audit(tt.options(), tt.topic)
    assert [m.key for m in report.missing] == [keys["missing"]]
    assert [(o.key, o.reason) for o in report.orphans] == \
        [(keys["orphan"], "no remote log metadata for this segment")]
    assert [(c.key, c.part) for c in report.corrupt_chunks] == [(keys["corrupt"], "chunk 0")]
    assert report.size_mismatches == [] and report.problems == 3


def test_audit_of_the_whole_store_finds_the_damage_of_that_topic_alone(damaged_topic, days_topic,
                                                                      tiered_topic):
    tt, keys = damaged_topic
    report = audit(tt.options())            # no topic: every object under the store's root
    assert {days_topic.topic, tiered_topic.topic, tt.topic} <= set(report.topics)
    assert report.objects == sum(1 for p in tt.remote_root.rglob("*") if p.is_file())
    assert ([m.key for m in report.missing], [o.key for o in report.orphans],
            [c.key for c in report.corrupt_chunks]) == \
        ([keys["missing"]], [keys["orphan"]], [keys["corrupt"]])


def test_audit_deletes_only_the_orphan(damaged_topic):
    tt, keys = damaged_topic
    before = {p for p in tt.remote_root.rglob("*") if p.is_file()}
    report = audit(tt.options(), tt.topic, delete_orphans=True)
    assert report.deleted_orphans == [keys["orphan"]]
    after = {p for p in tt.remote_root.rglob("*") if p.is_file()}
    assert before - after == {tt.remote_root / keys["orphan"]} and after <= before
    again = audit(tt.options(), tt.topic)
    assert again.orphans == [] and again.problems == 2


# ---- usage -------------------------------------------------------------------------------------

def test_usage_matches_describe_log_dirs_the_remote_metadata_and_the_files(tiered_topic):
    tt = tiered_topic
    report = usage(tt.options(), [tt.topic], metrics_url=tt.broker.metrics_url)
    _, described = describe_log_dirs(tt.bootstrap, {tt.topic: range(tt.partitions)})
    log_dir = tt.data_dir / "kafka-logs"
    assert [(p.topic, p.partition) for p in report.partitions] == \
        [(tt.topic, p) for p in range(tt.partitions)]
    for p in report.partitions:
        local = sorted((log_dir / f"{tt.topic}-{p.partition}").glob("*.log"))
        remote = remote_logs(tt, p.partition)
        assert p.local_bytes == described[(tt.topic, p.partition)] == \
            sum(f.stat().st_size for f in local) > 0
        assert p.local_segments == len(local) == 1
        assert p.remote_segments == len(remote) >= 10
        assert p.remote_bytes == sum(f.stat().st_size for f in remote)   # stored as is
        # 16 KiB segments: one PUT per object, one GET per chunk, manifest and indexes
        assert p.remote_puts == p.remote_gets == 3 * p.remote_segments
        assert p.storage_cost_month == pytest.approx(p.remote_bytes / GIB * 0.023)
        assert p.write_cost == pytest.approx(p.remote_puts * 0.005 / 1000)
        assert p.read_cost == pytest.approx(p.remote_gets * 0.0004 / 1000)
    total = report.totals(tt.topic)
    for name in ("local_bytes", "local_segments", "remote_bytes", "remote_segments"):
        assert total[name] == sum(getattr(p, name) for p in report.partitions)
    assert report.log_dirs[0].log_dir == str(log_dir.absolute())


def test_usage_counts_multipart_uploads_and_chunk_reads_of_large_segments():
    mib = 1024 * 1024
    # .log of 8 MiB: one PUT; 20 MiB: create + 3 parts + complete; plus .indexes and manifest
    assert segment_requests(8 * mib)[0] == 3 and segment_requests(20 * mib)[0] == 2 + 5
    # GETs: manifest, indexes, one per 4 MiB chunk
    assert segment_requests(20 * mib)[1] == 2 + 5 and segment_requests(1)[1] == 3
    assert segment_requests(20 * mib, part_bytes=64 * mib, chunk_bytes=mib) == (3, 22)


def test_kafka_log_dirs_tool_reads_strata_describe_log_dirs(tiered_topic):
    from kafka_tools import LOG_DIRS, require_kafka_dist, run_kafka_class
    require_kafka_dist()
    tt = tiered_topic
    result = run_kafka_class(LOG_DIRS, "--bootstrap-server", tt.bootstrap, "--describe",
                             "--topic-list", tt.topic)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    [broker] = doc["brokers"]
    [log_dir] = broker["logDirs"]
    assert log_dir["logDir"] == str((tt.data_dir / "kafka-logs").absolute())
    assert log_dir["error"] is None
    _, described = describe_log_dirs(tt.bootstrap, {tt.topic: range(tt.partitions)})
    assert {p["partition"]: (p["size"], p["offsetLag"], p["isFuture"])
            for p in log_dir["partitions"]} == \
        {f"{tt.topic}-{p}": (described[(tt.topic, p)], 0, False) for p in range(tt.partitions)}


# ---- the CLI -----------------------------------------------------------------------------------

def strata_spark(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(STRATA), "spark", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def remote_args(tt: TieredTopic) -> list[str]:
    return ["--bootstrap-server", tt.bootstrap, "--rsm", f"storage.url={tt.remote_root.as_uri()}"]


def test_strata_spark_usage_prints_the_report_and_exits_zero(tiered_topic):
    result = strata_spark("usage", *remote_args(tiered_topic), "--topic", tiered_topic.topic,
                          "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    direct = usage(tiered_topic.options(), [tiered_topic.topic])
    assert doc["total"]["remote_bytes"] == direct.totals()["remote_bytes"] > 0
    assert doc["total"]["local_bytes"] == direct.totals()["local_bytes"]
    table = strata_spark("usage", *remote_args(tiered_topic), "--topic", tiered_topic.topic)
    assert table.returncode == 0 and "REMOTE-BYTES" in table.stdout


def test_strata_spark_audit_exits_zero_when_clean_and_one_with_problems(tiered_topic,
                                                                       damaged_topic):
    clean = strata_spark("audit", *remote_args(tiered_topic), "--topic", tiered_topic.topic)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 problem(s)" in clean.stdout
    tt, keys = damaged_topic
    bad = strata_spark("audit", *remote_args(tt), "--topic", tt.topic, "--json")
    assert bad.returncode == 1, bad.stderr
    doc = json.loads(bad.stdout)
    assert [m["key"] for m in doc["missing"]] == [keys["missing"]]
    assert [c["key"] for c in doc["corrupt_chunks"]] == [keys["corrupt"]]


def test_strata_spark_refuses_a_job_without_what_it_needs(tiered_topic):
    no_tier = strata_spark("audit", "--bootstrap-server", tiered_topic.bootstrap)
    assert no_tier.returncode == 2 and "no remote tier configured" in no_tier.stderr
    no_topic = strata_spark("usage", "--bootstrap-server", tiered_topic.bootstrap,
                            "--topic", "no-such-topic")
    assert no_topic.returncode == 2 and "no-such-topic" in no_topic.stderr


def test_strata_spark_backfill_writes_parquet_and_prints_the_row_count(days_topic, tmp_path):
    out = tmp_path / "cli"
    result = strata_spark("backfill", *remote_args(days_topic), "--topic", days_topic.topic,
                          "--output", str(out), "--master", "local[1]",
                          "--conf", "spark.ui.enabled=false",
                          "--start-timestamp", datetime.datetime.fromtimestamp(
                              DAYS[2] / 1000, datetime.timezone.utc).isoformat())
    assert result.returncode == 0, result.stderr[-3000:]
    last_day = [r for r in days_topic.records if r.timestamp >= DAYS[2]]
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == len(last_day) > 0
    assert [p.name for p in out.glob("date=*")] == [f"date={utc_date(DAYS[2])}"]
