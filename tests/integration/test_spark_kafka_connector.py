"""Spark's own Kafka connector (spark-sql-kafka-0-10, the version of the installed PySpark) against
a live Strata broker: batch and streaming reads and writes of a topic whose history lives mostly
in the remote tier (≥ 10 remote segments per partition plus a local tail).

The connector and the jars it needs beyond PySpark's come from Maven Central through
``scripts/spark-kafka-dist.sh``; these tests skip only when Java or Maven is missing, and a
failing install fails them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from spark_support import (  # noqa: F401  (pytest fixtures)
    Produced, TieredTopic, create_tiered_topic, make_tiered_topic, spark, tiered_broker,
    tiered_topic, wait_tiering_settled)
from tiered_support import offsets

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST_SCRIPT = REPO_ROOT / "scripts" / "spark-kafka-dist.sh"
CONNECTOR_JAR = "spark-sql-kafka-0-10_2.13-"
REMOTE_FETCHES = "kafka_server_BrokerTopicMetrics_RemoteFetchRequestsPerSec_total"
# A row as the tests compare them: (partition, offset, key, value, timestamp ms, headers).
Row = tuple[int, int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]


@functools.cache
def connector_jars() -> tuple[Path | None, str]:
    """Install the connector once per process: (jars dir, "") or (None, why it cannot be)."""
    missing = [tool for tool in ("java", os.environ.get("MVN", "mvn")) if shutil.which(tool) is None]
    if missing:
        return None, f"Spark's Kafka connector unavailable: {' and '.join(missing)} not found on PATH"
    proc = subprocess.run(["bash", str(DIST_SCRIPT)], capture_output=True, text=True, timeout=900,
                          check=False, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, (
        f"{DIST_SCRIPT.name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1]), ""


@pytest.fixture(scope="session", autouse=True)
def connector_or_skip() -> Path:
    """Runs before the session-scoped ``spark`` fixture, so that its session gets the jars."""
    jars, reason = connector_jars()
    if jars is None:
        pytest.skip(reason)
    assert any(jars.glob(f"{CONNECTOR_JAR}*.jar")), f"no connector jar in {jars}"
    return jars


@pytest.fixture(scope="module")
def kafka(spark, connector_or_skip):
    """The Spark session, checked to have the connector on its classpath."""
    assert CONNECTOR_JAR in spark.conf.get("spark.jars", ""), (
        "the Spark session was built without the connector jars (spark.jars); "
        "run scripts/spark-kafka-dist.sh before the session starts")
    return spark


def expected_rows(records: Iterable[Produced]) -> list[Row]:
    return sorted((r.partition, r.offset, r.key, r.value, r.timestamp,
                   tuple((k, v) for k, v in (r.headers or ()))) for r in records)


def without_timestamps(rows: list[Row]) -> list[tuple]:
    return [(p, o, k, v, h) for p, o, k, v, _, h in rows]


def spark_rows(df) -> list[Row]:
    """A connector DataFrame (with headers) as sorted comparable tuples."""
    table = df.selectExpr("partition", "offset", "key", "value", "unix_millis(timestamp) AS ts",
                          "headers").toArrow()
    cols = table.to_pydict()
    return sorted(zip(cols["partition"], cols["offset"], cols["key"], cols["value"], cols["ts"],
                      (tuple((h["key"], h["value"]) for h in hs or ()) for hs in cols["headers"]),
                      strict=True))


def read_batch(session, bootstrap: str, topic: str, **options: str):
    reader = (session.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("includeHeaders", "true"))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def consume_all(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> list[Row]:
    """Every record of ``topic`` from offset 0 to the high watermark, with a plain consumer."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "auto.offset.reset": "error"})
    try:
        ends = {p: c.get_watermark_offsets(CkTp(topic, p), timeout=10)[1] for p in range(partitions)}
        c.assign([CkTp(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        want = sum(ends.values())
        out: list[Row] = []
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                assert m.error() is None, m.error()
                out.append((m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1],
                            tuple(m.headers() or ())))
    finally:
        c.close()
    assert len(out) == want, f"read {len(out)} of {want} records of {topic}"
    return sorted(out)


# ---- batch ---------------------------------------------------------------------------------------

def test_batch_read_from_earliest_returns_every_produced_row_across_both_tiers(
        kafka, tiered_topic: TieredTopic):
    for p in range(tiered_topic.partitions):
        assert offsets(tiered_topic.bootstrap, tiered_topic.topic, p)["local_start"] > 0
    remote_reads = tiered_topic.broker.metric(REMOTE_FETCHES, topic=tiered_topic.topic)
    df = read_batch(kafka, tiered_topic.bootstrap, tiered_topic.topic,
                    startingOffsets="earliest", endingOffsets="latest")
    assert spark_rows(df) == expected_rows(tiered_topic.records)
    # The history came from the remote tier, through the broker's remote reads.
    assert tiered_topic.broker.metric(REMOTE_FETCHES, topic=tiered_topic.topic) > remote_reads
    assert {r.topic for r in df.select("topic").distinct().collect()} == {tiered_topic.topic}
    assert [r.timestampType for r in df.select("timestampType").distinct().collect()] == [0]


def test_batch_read_of_offset_ranges_that_live_only_in_the_remote_tier(
        kafka, tiered_topic: TieredTopic):
    topic = tiered_topic.topic
    local_start = {p: offsets(tiered_topic.bootstrap, topic, p)["local_start"]
                   for p in range(tiered_topic.partitions)}
    start = {p: ls // 3 for p, ls in local_start.items()}
    end = {p: (ls * 2) // 3 for p, ls in local_start.items()}
    assert all(0 < start[p] < end[p] < local_start[p] for p in local_start), local_start
    df = read_batch(kafka, tiered_topic.bootstrap, topic,
                    startingOffsets=json.dumps({topic: {str(p): o for p, o in start.items()}}),
                    endingOffsets=json.dumps({topic: {str(p): o for p, o in end.items()}}))
    assert spark_rows(df) == expected_rows(
        r for r in tiered_topic.records if start[r.partition] <= r.offset < end[r.partition])

    # From inside the remote tier to the end of the local tail.
    df = read_batch(kafka, tiered_topic.bootstrap, topic,
                    startingOffsets=json.dumps({topic: {str(p): o for p, o in start.items()}}),
                    endingOffsets="latest")
    assert spark_rows(df) == expected_rows(
        r for r in tiered_topic.records if r.offset >= start[r.partition])


def test_batch_read_from_a_timestamp_inside_the_remote_tier(kafka, tiered_topic: TieredTopic):
    topic = tiered_topic.topic
    by_partition: dict[int, list[Produced]] = {}
    for r in tiered_topic.records:
        by_partition.setdefault(r.partition, []).append(r)
    # The first record of each partition at or after the timestamp of a record in its remote part.
    starts = {}
    for p, recs in by_partition.items():
        local_start = offsets(tiered_topic.bootstrap, topic, p)["local_start"]
        recs.sort(key=lambda r: r.offset)
        starts[p] = recs[local_start // 2].timestamp
    df = read_batch(kafka, tiered_topic.bootstrap, topic,
                    startingOffsetsByTimestamp=json.dumps({topic: {str(p): ts for p, ts in starts.items()}}),
                    endingOffsets="latest")
    first = {p: min(r.offset for r in recs if r.timestamp >= starts[p])
             for p, recs in by_partition.items()}
    assert spark_rows(df) == expected_rows(
        r for r in tiered_topic.records if r.offset >= first[r.partition])


def test_batch_write_reads_back_identical_with_a_plain_consumer(kafka, tiered_topic: TieredTopic):
    dest = "connector-batch-written"
    create_tiered_topic(tiered_topic.broker, dest, tiered_topic.partitions)
    source = read_batch(kafka, tiered_topic.bootstrap, tiered_topic.topic,
                        startingOffsets="earliest", endingOffsets="latest")
    # One writing task, rows in offset order: each partition's records keep their order.
    (source.select("key", "value", "headers", "partition").orderBy("partition", "offset")
     .coalesce(1).write.format("kafka")
     .option("kafka.bootstrap.servers", tiered_topic.bootstrap).option("topic", dest).save())
    # Read once the written topic is tiered too (most of it only in the remote tier).
    wait_tiering_settled(tiered_topic.broker, dest, tiered_topic.partitions)
    got = consume_all(tiered_topic.bootstrap, dest, tiered_topic.partitions)
    # The written records get new CreateTime timestamps; everything else is the source's.
    assert without_timestamps(got) == without_timestamps(expected_rows(tiered_topic.records))


# ---- streaming -----------------------------------------------------------------------------------

def stream_to_parquet(session, bootstrap: str, topic: str, out: Path, checkpoint: Path) -> None:
    """One availableNow run of Kafka topic -> parquet files, resuming from ``checkpoint``."""
    query = (session.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("includeHeaders", "true").load()
             .selectExpr("partition", "offset", "key", "value", "timestamp", "headers")
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive, "the availableNow query did not finish in 300 s"
    assert query.exception() is None, query.exception()


def test_streaming_read_picks_up_new_records_and_resumes_from_its_checkpoint_without_loss_or_duplicates(
        kafka, tiered_broker, tmp_path):
    source = make_tiered_topic(tiered_broker, "connector-stream-source", partitions=2,
                               remote_segments=3, tail_records=20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    stream_to_parquet(kafka, source.bootstrap, source.topic, out, checkpoint)
    assert spark_rows(kafka.read.parquet(str(out))) == expected_rows(source.records)

    new = source.produce(60)
    wait_tiering_settled(tiered_broker, source.topic, source.partitions)
    stream_to_parquet(kafka, source.bootstrap, source.topic, out, checkpoint)
    got = spark_rows(kafka.read.parquet(str(out)))
    assert len(new) == 60 and got == expected_rows(source.records)

    # A run with nothing new adds nothing.
    stream_to_parquet(kafka, source.bootstrap, source.topic, out, checkpoint)
    assert spark_rows(kafka.read.parquet(str(out))) == got


def test_streaming_write_produces_every_row_of_a_tiered_topic_to_another_topic(
        kafka, tiered_topic: TieredTopic, tmp_path):
    dest = "connector-stream-written"
    create_tiered_topic(tiered_topic.broker, dest, tiered_topic.partitions)
    query = (kafka.readStream.format("kafka").option("kafka.bootstrap.servers", tiered_topic.bootstrap)
             .option("subscribe", tiered_topic.topic).option("startingOffsets", "earliest")
             .option("includeHeaders", "true").load()
             .select("key", "value", "headers", "partition")
             .writeStream.format("kafka").option("kafka.bootstrap.servers", tiered_topic.bootstrap)
             .option("topic", dest).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive, "the availableNow query did not finish in 300 s"
    assert query.exception() is None, query.exception()
    wait_tiering_settled(tiered_topic.broker, dest, tiered_topic.partitions)
    got = consume_all(tiered_topic.bootstrap, dest, tiered_topic.partitions)
    # One task per source partition writes to the same partition, in offset order.
    assert without_timestamps(got) == without_timestamps(expected_rows(tiered_topic.records))
