"""The ``strata`` Spark source and sink on local[2] against a live tiered broker: a topic with
>= 10 remote segments per partition plus a local tail, read in ``direct`` mode (remote segments
straight from the object store) and ``broker`` mode (everything through Fetch), offsets and
time ranges, data loss, a streaming query restarted from its checkpoint, and writes that read
back identical."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from spark_support import (  # noqa: F401  (fixtures)
    BASE_TS, Produced, TieredTopic, create_tiered_topic, make_tiered_topic, spark, tiered_broker,
    tiered_topic)
from strata.common.types import uuid_to_kafka_str

pytestmark = pytest.mark.slow

pa = pytest.importorskip("pyarrow")


# ---- helpers --------------------------------------------------------------------------------------

def row_key(topic: str, r: Produced, headers: bool = True) -> tuple:
    return (topic, r.partition, r.offset, r.key, r.value, r.timestamp, 0,
            tuple(r.headers) if headers else None)


def rows(df, *, offsets: bool = True) -> list[tuple]:
    """A DataFrame of the source's schema (with headers) as comparable tuples, via Arrow."""
    t = df.toArrow()
    millis = [None if v is None else v // 1000
              for v in t.column("timestamp").cast(pa.int64()).to_pylist()]
    headers = ([tuple((h["key"], h["value"]) for h in hs or ())
                for hs in t.column("headers").to_pylist()]
               if "headers" in t.column_names else [None] * t.num_rows)
    cols = [t.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value",
                                              "timestampType")]
    out = [(tp, p, o if offsets else None, k, v, ms, tt, hs)
           for tp, p, o, k, v, tt, ms, hs in zip(*cols, millis, headers)]
    return sorted(out, key=lambda r: (r[0], r[1], -1 if r[2] is None else r[2], repr(r[3:])))


def expected(tt: TieredTopic, records: list[Produced] | None = None, *,
             headers: bool = True) -> list[tuple]:
    """The rows the source should return for ``records`` (all of the topic's by default);
    ``headers=False``: without the headers column (the source's default schema)."""
    return sorted((row_key(tt.topic, r, headers)
                   for r in (tt.records if records is None else records)),
                  key=lambda r: (r[0], r[1], r[2]))


def load(spark, options: dict[str, str]):
    return spark.read.format("strata").options(**options).load()


def remote_segments_of(tt: TieredTopic) -> dict[int, list]:
    from strata.spark.broker_client import BrokerClient
    from strata.spark.remote_segments import remote_segments
    with BrokerClient(tt.bootstrap) as client:
        return remote_segments(client, tt.topic)


def high_watermarks(tt: TieredTopic) -> dict[int, int]:
    state = tt.broker.tiered_state(tt.topic)
    return {p["partition"]: p["high_watermark"] for p in state["partitions"]}


# ---- batch ----------------------------------------------------------------------------------------

def test_batch_read_in_direct_mode_returns_exactly_the_produced_rows(spark, tiered_topic):
    df = load(spark, tiered_topic.options(includeHeaders="true"))
    assert rows(df) == expected(tiered_topic)


def test_batch_read_in_broker_mode_returns_exactly_the_produced_rows(spark, tiered_topic):
    df = load(spark, tiered_topic.options(includeHeaders="true", mode="broker"))
    assert rows(df) == expected(tiered_topic)


def test_direct_mode_reads_each_partitions_segments_and_local_tail_in_one_input_partition(
        spark, tiered_topic):
    from strata.spark.source import plan_read
    segments = remote_segments_of(tiered_topic)
    hw = high_watermarks(tiered_topic)
    tasks = plan_read(tiered_topic.options())
    assert [t.partition for t in tasks] == list(range(tiered_topic.partitions))
    for p, task in enumerate(tasks):
        remote = [x for x in task.parts() if x.segment is not None]
        fetched = [x for x in task.parts() if x.segment is None]
        assert len(segments[p]) >= 10
        assert list(task.segments) == segments[p]
        assert [(x.start, x.end) for x in remote] == [
            (m.start_offset, m.end_offset + 1) for m in segments[p]]
        assert [(x.start, x.end) for x in fetched] == [(segments[p][-1].end_offset + 1, hw[p])]
        assert fetched[0].start < fetched[0].end      # a real local tail
        assert (task.start, task.end) == (0, hw[p])
    df = load(spark, tiered_topic.options())
    assert df.rdd.getNumPartitions() == len(tasks)


def test_min_partitions_spreads_the_read_and_still_reads_every_row_once(spark, tiered_topic):
    from strata.spark.source import plan_read
    options = tiered_topic.options(includeHeaders="true", minPartitions="7")
    tasks = plan_read(options)
    assert len(tasks) >= 7 and sum(t.remote for t in tasks) >= 7
    df = load(spark, options)
    assert df.rdd.getNumPartitions() == len(tasks)
    assert rows(df) == expected(tiered_topic)


def test_large_segments_split_by_max_bytes_still_read_every_row_once(spark, tiered_topic):
    from strata.spark.source import plan_read
    t = tiered_topic.topic
    first = remote_segments_of(tiered_topic)[0][:4]
    end = first[-1].end_offset + 1
    options = tiered_topic.options(includeHeaders="true", maxBytesPerPartition="6000",
                                   subscribe=None, assign=f'{{"{t}":[0]}}',
                                   endingOffsets=f'{{"{t}":{{"0":{end}}}}}')
    tasks = plan_read(options)
    assert all(t.remote for t in tasks) and len(tasks) > len(first)
    assert {m for t in tasks for m in t.segments} == set(first)
    want = [r for r in tiered_topic.records if r.partition == 0 and r.offset < end]
    assert rows(load(spark, options)) == expected(tiered_topic, want)


def test_starting_and_ending_offsets_json_select_the_right_rows(spark, tiered_topic):
    t = tiered_topic.topic
    hw = high_watermarks(tiered_topic)
    options = tiered_topic.options(
        includeHeaders="true",
        startingOffsets=f'{{"{t}":{{"0":37,"1":-2}}}}',
        endingOffsets=f'{{"{t}":{{"0":{hw[0] - 5},"1":-1}}}}')
    want = [r for r in tiered_topic.records
            if (r.partition == 0 and 37 <= r.offset < hw[0] - 5) or r.partition == 1]
    assert rows(load(spark, options)) == expected(tiered_topic, want)
    assign = tiered_topic.options(includeHeaders="true", mode="broker", subscribe=None,
                                  assign=f'{{"{t}":[1]}}',
                                  startingOffsets=f'{{"{t}":{{"1":300}}}}',
                                  endingOffsets=f'{{"{t}":{{"1":310}}}}')
    want = [r for r in tiered_topic.records if r.partition == 1 and 300 <= r.offset < 310]
    assert rows(load(spark, assign)) == expected(tiered_topic, want)


def test_a_time_range_selects_the_records_with_timestamps_inside_it(spark, tiered_topic):
    lo, hi = BASE_TS + 333, BASE_TS + 1777
    options = tiered_topic.options(startingTimestamp=str(lo), endingTimestamp=str(hi))
    want = [r for r in tiered_topic.records if lo <= r.timestamp < hi]
    df = load(spark, options)
    assert "headers" not in df.columns     # includeHeaders defaults to false, as in Spark
    assert want and rows(df) == expected(tiered_topic, want, headers=False)


def test_bad_options_fail_the_query_with_a_clear_message(spark, tiered_topic):
    with pytest.raises(Exception, match="One of the following options must be specified"):
        load(spark, {"bootstrap.servers": tiered_topic.bootstrap}).collect()
    with pytest.raises(Exception, match="starting offset can't be latest for batch"):
        load(spark, tiered_topic.options(startingOffsets="latest")).collect()


# ---- data loss ------------------------------------------------------------------------------------

def test_a_missing_remote_object_fails_naming_the_segment_or_is_skipped_without_fail_on_data_loss(
        spark, tiered_broker):
    tt = make_tiered_topic(tiered_broker, "spark-loss", partitions=1, remote_segments=3,
                           tail_records=10)
    victim = remote_segments_of(tt)[0][1]
    objects = list(tt.remote_root.glob(f"{tt.topic}-*/0/{victim.start_offset:020d}-*.log"))
    assert len(objects) == 1, objects
    objects[0].unlink()

    with pytest.raises(Exception) as err:
        load(spark, tt.options()).collect()
    seg_id = victim.remote_log_segment_id.id
    assert str(seg_id) in str(err.value) or uuid_to_kafka_str(seg_id) in str(err.value)

    df = load(spark, tt.options(includeHeaders="true", failOnDataLoss="false"))
    survivors = [r for r in tt.records
                 if not victim.start_offset <= r.offset <= victim.end_offset]
    assert rows(df) == expected(tt, survivors)


# ---- streaming ------------------------------------------------------------------------------------

def test_a_streaming_query_picks_up_new_records_and_resumes_from_its_checkpoint_exactly_once(
        spark, tiered_broker, tmp_path: Path):
    tt = make_tiered_topic(tiered_broker, "spark-stream", partitions=2, remote_segments=3,
                           tail_records=20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**extra: str):
        stream = (spark.readStream.format("strata")
                  .options(**tt.options(includeHeaders="true", startingOffsets="earliest",
                                        **extra)).load())
        return stream.writeStream.format("parquet").option("path", str(out)) \
            .option("checkpointLocation", str(checkpoint))

    query = start(maxOffsetsPerTrigger="700").trigger(processingTime="200 milliseconds").start()
    try:
        query.processAllAvailable()
        first = list(tt.records)
        tt.produce(60)
        query.processAllAvailable()
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert max(sizes) <= 700 and sum(sizes) == len(first) + 60
    assert rows(spark.read.parquet(str(out))) == expected(tt)

    tt.produce(40)     # while no query runs
    again = start().trigger(availableNow=True).start()
    again.awaitTermination(120)
    assert again.exception() is None
    got = rows(spark.read.parquet(str(out)))
    assert len(got) == len(set(got)) == len(tt.records)
    assert got == expected(tt)


# ---- sink -----------------------------------------------------------------------------------------

def content(rows_: list[tuple]) -> Counter:
    """(partition, key, value, timestamp, headers) of each row, offsets and topic left out."""
    return Counter((r[1], r[3], r[4], r[5], r[7]) for r in rows_)


def test_a_batch_write_reads_back_identical(spark, tiered_broker, tiered_topic):
    target = f"spark-sink-{uuid.uuid4().hex[:6]}"
    create_tiered_topic(tiered_broker, target, tiered_topic.partitions)
    source = load(spark, tiered_topic.options(includeHeaders="true", mode="broker"))
    (source.select("key", "value", "partition", "headers", "timestamp")
     .write.format("strata").option("bootstrap.servers", tiered_topic.bootstrap)
     .option("topic", target).mode("append").save())
    back = load(spark, tiered_topic.options(includeHeaders="true", mode="broker",
                                            subscribe=target))
    assert content(rows(back)) == content(expected(tiered_topic))


def test_a_streaming_write_reads_back_identical(spark, tiered_broker, tiered_topic, tmp_path):
    target = f"spark-sink-{uuid.uuid4().hex[:6]}"
    create_tiered_topic(tiered_broker, target, tiered_topic.partitions)
    stream = (spark.readStream.format("strata")
              .options(**tiered_topic.options(includeHeaders="true", startingOffsets="earliest",
                                              mode="broker"))
              .load()
              .selectExpr("key", "value", "partition", "headers", "timestamp",
                          f"'{target}' AS topic"))
    query = (stream.writeStream.format("strata")
             .option("bootstrap.servers", tiered_topic.bootstrap)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    back = load(spark, tiered_topic.options(includeHeaders="true", mode="broker",
                                            subscribe=target))
    assert content(rows(back)) == content(expected(tiered_topic))
