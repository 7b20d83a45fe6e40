"""The strata source's planner and option parser, without Spark or a broker: offsets are
resolved against a fake ListOffsets/Metadata client and segments are built by hand."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from strata.common.types import TopicIdPartition, TopicPartition
from strata.spark.options import (
    DEFAULT_MAX_BYTES_PER_PARTITION, OffsetSpec, SourceOptions, StrataOptionError,
    parse_sink_options, parse_source_options)
from strata.spark.plan import (
    OffsetRange, ReadTask, offset_ranges, offsets_from_json, offsets_to_json, plan_tasks,
    rate_limit, resolve_offsets, resolve_partitions, split_segment)
from strata.tiered.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

TOPIC_ID = uuid.UUID(int=7)


def seg(start: int, end: int, size: int = 1000, partition: int = 0,
        topic: str = "t") -> RemoteLogSegmentMetadata:
    tip = TopicIdPartition(TOPIC_ID, TopicPartition(topic, partition))
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(tip, uuid.uuid4()), start, end, 0, 0, 0, size,
        state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED, segment_leader_epochs={0: start})


@dataclass
class FakeClient:
    """Metadata and ListOffsets over a made-up log: per topic-partition the log start offset,
    the log end offset, and record timestamps (offset i has timestamp ts0 + 10 * i)."""

    partitions: dict[str, int]
    log_start: dict[tuple[str, int], int]
    end: dict[tuple[str, int], int]
    ts0: int = 1_000_000

    def topics(self, names=None):
        wanted = self.partitions if names is None else [n for n in names if n in self.partitions]
        return {t: SimpleNamespace(name=t, topic_id=TOPIC_ID, partitions=self.partitions[t])
                for t in wanted}

    def list_offsets(self, topic, partitions, timestamp):
        out = {}
        for p in partitions:
            tp = (topic, p)
            if timestamp == -2:
                out[p] = self.log_start[tp]
            elif timestamp == -1:
                out[p] = self.end[tp]
            else:  # first offset whose timestamp >= timestamp
                first = max(self.log_start[tp], -(-(timestamp - self.ts0) // 10))
                out[p] = first if first < self.end[tp] else -1
        return out


def client() -> FakeClient:
    return FakeClient({"t": 2, "u": 1, "__internal": 1},
                      {("t", 0): 0, ("t", 1): 100, ("u", 0): 0, ("__internal", 0): 0},
                      {("t", 0): 1000, ("t", 1): 500, ("u", 0): 10, ("__internal", 0): 3})


def opts(**kw) -> SourceOptions:
    return SourceOptions(bootstrap_servers="b:1", streaming=False, **kw)


# ---- options --------------------------------------------------------------------------------------

def test_both_bootstrap_option_spellings_are_accepted_and_keys_are_case_insensitive():
    a = parse_source_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t"}, streaming=False)
    b = parse_source_options({"BOOTSTRAP.SERVERS": "h:1", "Subscribe": "t"}, streaming=False)
    assert a.bootstrap_servers == b.bootstrap_servers == "h:1"
    assert a.subscribe == b.subscribe == ("t",)


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "t"}, "'kafka.bootstrap.servers' (or 'bootstrap.servers') must be specified"),
    ({"bootstrap.servers": "h:1"}, "One of the following options must be specified"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "assign": '{"t":[0]}'},
     "Only one of the following options can be specified"),
    ({"bootstrap.servers": "h:1", "subscribe": " , "}, "No topics to subscribe to"),
    ({"bootstrap.servers": "h:1", "subscribePattern": "("}, "invalid regex"),
    ({"bootstrap.servers": "h:1", "assign": "[0]"}, 'expected e.g. {"topicA":[0,1]'),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "latest"},
     "starting offset can't be latest for batch queries"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": "earliest"},
     "ending offset can't be earliest"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": '{"t":{"0":-1}}'},
     "can't be latest (-1) for batch queries"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'},
     "can't be earliest (-2)"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": '{"t":[1]}'},
     "Option 'startingOffsets': expected e.g."),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "startingTimestamp": "yesterday"},
     "'startingTimestamp' must be a timestamp in milliseconds"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "failOnDataLoss": "yes"},
     "'failOnDataLoss' must be true or false"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "mode": "fast"},
     "'mode' must be 'direct' or 'broker'"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "mode": "direct"},
     "no remote tier is configured"),
    ({"bootstrap.servers": "h:1", "subscribe": "t", "maxRecordsPerPartition": "0"},
     "'maxRecordsPerPartition' must be a positive integer"),
])
def test_bad_source_options_fail_with_a_message_naming_the_option(options, message):
    with pytest.raises(StrataOptionError) as err:
        parse_source_options(options, streaming=False)
    assert message in str(err.value)


def test_ending_options_are_refused_in_streaming_queries():
    with pytest.raises(StrataOptionError, match="'endingOffsets' is not valid in streaming"):
        parse_source_options({"bootstrap.servers": "h:1", "subscribe": "t",
                              "endingOffsets": "latest"}, streaming=True)


def test_starting_offsets_default_to_earliest_in_batch_and_latest_in_streaming():
    base = {"bootstrap.servers": "h:1", "subscribe": "t"}
    assert parse_source_options(base, streaming=False).starting == OffsetSpec("earliest")
    assert parse_source_options(base, streaming=False).ending == OffsetSpec("latest")
    assert parse_source_options(base, streaming=True).starting == OffsetSpec("latest")


def test_timestamp_options_take_precedence_over_offsets_as_in_spark():
    o = parse_source_options({"bootstrap.servers": "h:1", "subscribe": "t",
                              "startingOffsets": "earliest", "startingTimestamp": "1234",
                              "endingOffsetsByTimestamp": '{"t":{"0":99}}'}, streaming=False)
    assert o.starting == OffsetSpec("timestamp", timestamp=1234)
    assert o.ending == OffsetSpec("timestamps", per_partition={"t": {0: 99}})


def test_mode_defaults_to_direct_when_a_remote_tier_is_configured_else_broker(tmp_path):
    base = {"bootstrap.servers": "h:1", "subscribe": "t"}
    assert parse_source_options(base, streaming=False).mode == "broker"
    direct = parse_source_options({**base, "rsm.config.storage.url": tmp_path.as_uri()},
                                  streaming=False)
    assert direct.mode == "direct" and direct.rsm_props
    forced = parse_source_options({**base, "rsm.config.storage.url": tmp_path.as_uri(),
                                   "mode": "BROKER"}, streaming=False)
    assert forced.mode == "broker"


def test_parsed_source_options_pickle_for_the_executors(tmp_path):
    o = parse_source_options({"bootstrap.servers": "h:1", "assign": '{"t":[1,0]}',
                              "startingOffsets": '{"t":{"0":5,"1":-2}}',
                              "rsm.config.storage.url": tmp_path.as_uri()}, streaming=False)
    assert pickle.loads(pickle.dumps(o)) == o
    assert o.assign == {"t": (0, 1)}


def test_sink_options_fix_idempotence_and_pass_kafka_options_through():
    s = parse_sink_options({"kafka.bootstrap.servers": "h:1", "topic": "out",
                            "kafka.linger.ms": "20"})
    assert s.topic == "out"
    assert s.producer_config == {"bootstrap.servers": "h:1", "linger.ms": "20",
                                 "enable.idempotence": "true", "acks": "all"}
    with pytest.raises(StrataOptionError, match="'kafka.enable.idempotence' is fixed"):
        parse_sink_options({"bootstrap.servers": "h:1", "kafka.enable.idempotence": "false"})


# ---- topics and offsets ---------------------------------------------------------------------------

def test_subscribe_pattern_matches_whole_names_and_skips_internal_topics():
    c = client()
    assert resolve_partitions(opts(subscribe_pattern="t|u"), c) == {"t": [0, 1], "u": [0]}
    assert resolve_partitions(opts(subscribe_pattern="_.*"), c) == {}
    assert resolve_partitions(opts(subscribe_pattern="t.+"), c) == {}


def test_assign_checks_topics_and_partitions_exist():
    c = client()
    assert resolve_partitions(opts(assign={"t": (1,)}), c) == {"t": [1]}
    with pytest.raises(StrataOptionError, match="t has 2 partition"):
        resolve_partitions(opts(assign={"t": (2,)}), c)
    with pytest.raises(StrataOptionError, match="Topic.* nope do not exist"):
        resolve_partitions(opts(subscribe=("nope",)), c)


def test_specific_offsets_resolve_minus_two_and_minus_one_and_must_cover_every_partition():
    c = client()
    parts = {"t": [0, 1]}
    spec = OffsetSpec("offsets", per_partition={"t": {0: 7, 1: -2}})
    assert resolve_offsets(spec, parts, c, starting=True) == {("t", 0): 7, ("t", 1): 100}
    spec = OffsetSpec("offsets", per_partition={"t": {0: -1, 1: 300}})
    assert resolve_offsets(spec, parts, c, starting=False) == {("t", 0): 1000, ("t", 1): 300}
    with pytest.raises(StrataOptionError, match="must specify all topic-partitions"):
        resolve_offsets(OffsetSpec("offsets", per_partition={"t": {0: 1}}), parts, c,
                        starting=True)


def test_timestamps_resolve_to_the_first_offset_at_or_after_them():
    c = client()
    parts = {"t": [0, 1]}
    spec = OffsetSpec("timestamp", timestamp=c.ts0 + 2005)   # offset 200.5 -> 201
    assert resolve_offsets(spec, parts, c, starting=True) == {("t", 0): 201, ("t", 1): 201}
    per = OffsetSpec("timestamps", per_partition={"t": {0: c.ts0, 1: c.ts0 + 10 * 450}})
    assert resolve_offsets(per, parts, c, starting=False) == {("t", 0): 0, ("t", 1): 450}


def test_a_timestamp_past_the_end_is_latest_when_ending_and_an_error_or_latest_when_starting():
    c = client()
    parts = {"t": [0, 1]}
    late = OffsetSpec("timestamp", timestamp=c.ts0 + 10 * 800)  # beyond t-1's end (500)
    assert resolve_offsets(late, parts, c, starting=False) == {("t", 0): 800, ("t", 1): 500}
    with pytest.raises(StrataOptionError, match="No offset matched .* t-1 and timestamp"):
        resolve_offsets(late, parts, c, starting=True)
    assert resolve_offsets(late, parts, c, starting=True, start_timestamp_strategy="latest") \
        == {("t", 0): 800, ("t", 1): 500}


def test_batch_ranges_run_from_start_to_end_and_drop_empty_partitions():
    c = client()
    ranges = offset_ranges(opts(subscribe=("t", "u"), ending=OffsetSpec(
        "offsets", per_partition={"t": {0: 40, 1: 100}, "u": {0: 10}})), c)
    assert ranges == [OffsetRange("t", 0, 0, 40), OffsetRange("u", 0, 0, 10)]


def test_offsets_below_the_log_start_fail_or_start_at_the_log_start_without_fail_on_data_loss():
    from strata.spark.broker_client import DataLossError
    c = client()
    spec = OffsetSpec("offsets", per_partition={"t": {0: 0, 1: 50}})
    with pytest.raises(DataLossError, match=r"Offsets \[50, 100\) of t-1 are gone"):
        offset_ranges(opts(subscribe=("t",), starting=spec), c)
    lenient = offset_ranges(opts(subscribe=("t",), starting=spec, fail_on_data_loss=False), c)
    assert lenient == [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 100, 500)]


def test_an_end_beyond_latest_or_before_the_start_is_an_error():
    c = client()
    with pytest.raises(StrataOptionError, match="Ending offset 501 of t-1 is beyond"):
        offset_ranges(opts(subscribe=("t",), ending=OffsetSpec(
            "offsets", per_partition={"t": {0: 10, 1: 501}})), c)
    with pytest.raises(StrataOptionError, match="Starting offset 300 of t-1 is after"):
        offset_ranges(opts(subscribe=("t",),
                           starting=OffsetSpec("offsets", per_partition={"t": {0: 0, 1: 300}}),
                           ending=OffsetSpec("offsets", per_partition={"t": {0: 10, 1: 200}})), c)


# ---- input partitions -----------------------------------------------------------------------------

def plan(ranges, segments=None, positions=None, max_bytes=DEFAULT_MAX_BYTES_PER_PARTITION,
         max_records=1_000_000):
    return plan_tasks(ranges, segments=segments, positions=positions,
                      max_bytes_per_partition=max_bytes, max_records_per_partition=max_records)


def test_direct_plan_is_one_task_per_remote_segment_plus_the_local_tail():
    segs = [seg(0, 99), seg(100, 199), seg(200, 249)]
    tasks = plan([OffsetRange("t", 0, 0, 300)], {("t", 0): segs})
    assert [(t.start, t.end, t.segment) for t in tasks] == [
        (0, 100, segs[0]), (100, 200, segs[1]), (200, 250, segs[2]), (250, 300, None)]


def test_direct_plan_trims_segments_to_the_range_and_skips_those_outside_it():
    segs = [seg(0, 99), seg(100, 199), seg(200, 249)]
    tasks = plan([OffsetRange("t", 0, 150, 220)], {("t", 0): segs})
    assert [(t.start, t.end, t.segment) for t in tasks] == [(150, 200, segs[1]),
                                                             (200, 220, segs[2])]


def test_offsets_the_remote_tier_does_not_cover_go_through_fetch():
    segs = [seg(100, 199), seg(300, 399)]
    tasks = plan([OffsetRange("t", 0, 50, 450)], {("t", 0): segs})
    assert [(t.start, t.end, t.remote) for t in tasks] == [
        (50, 100, False), (100, 200, True), (200, 300, False), (300, 400, True), (400, 450, False)]


def test_overlapping_segments_never_read_an_offset_twice():
    segs = [seg(0, 99), seg(50, 149)]
    tasks = plan([OffsetRange("t", 0, 0, 150)], {("t", 0): segs})
    assert [(t.start, t.end) for t in tasks] == [(0, 100), (100, 150)]


def test_broker_plan_splits_ranges_by_offset_count():
    tasks = plan([OffsetRange("t", 0, 10, 35), OffsetRange("t", 1, 0, 5)], max_records=10)
    assert [(t.partition, t.start, t.end, t.segment) for t in tasks] == [
        (0, 10, 20, None), (0, 20, 30, None), (0, 30, 35, None), (1, 0, 5, None)]


def test_large_segments_are_split_at_index_entries_and_the_index_is_read_only_for_them():
    small, big = seg(0, 99, size=500), seg(100, 1099, size=10_000)
    index = [(100 + 100 * i, 1000 * i) for i in range(10)]   # an entry every 1000 bytes
    asked = []

    def positions(meta):
        asked.append(meta)
        return index
    tasks = plan([OffsetRange("t", 0, 0, 1100)], {("t", 0): [small, big]}, positions,
                 max_bytes=2500)
    assert asked == [big]
    assert [(t.start, t.end) for t in tasks] == [(0, 100), (100, 300), (300, 500), (500, 700),
                                                 (700, 900), (900, 1100)]
    assert all(t.segment is (small if t.start == 0 else big) for t in tasks)


def test_split_segment_covers_the_segment_even_when_one_step_exceeds_the_limit():
    meta = seg(0, 99, size=10_000)
    pieces = split_segment(meta, [(10, 100), (50, 9000)], max_bytes=1000)
    assert pieces[0][0] == 0 and pieces[-1][1] == 100
    assert all(a < b for a, b in pieces) and all(
        x[1] == y[0] for x, y in zip(pieces, pieces[1:]))
    assert split_segment(seg(0, 99, size=800), [(10, 100)], max_bytes=1000) == [(0, 100)]


def test_read_tasks_pickle_with_their_segment():
    task = ReadTask("t", 0, 5, 10, seg(0, 99))
    assert pickle.loads(pickle.dumps(task)) == task


# ---- streaming offsets ----------------------------------------------------------------------------

def test_offsets_serialise_to_the_same_json_whatever_the_order():
    a = offsets_to_json({("u", 0): 3, ("t", 1): 2, ("t", 0): 1})
    b = offsets_to_json({("t", 0): 1, ("u", 0): 3, ("t", 1): 2})
    assert list(a.items()) == list(b.items()) == [("t", {"0": 1, "1": 2}), ("u", {"0": 3})]
    assert offsets_from_json(a) == {("t", 0): 1, ("t", 1): 2, ("u", 0): 3}


def test_rate_limit_shares_the_budget_by_backlog_and_never_starves_a_partition():
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 10}
    latest = {("t", 0): 900, ("t", 1): 99, ("t", 2): 11}
    out = rate_limit(start, latest, 100)
    assert out[("t", 2)] == 11                      # 1 pending offset still moves
    assert out[("t", 0)] == 90 and out[("t", 1)] == 9
    assert rate_limit(start, latest, 10_000) == latest


# ---- sink schema ----------------------------------------------------------------------------------

def test_sink_schema_check_names_the_offending_column():
    pytest.importorskip("pyspark")
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
        TimestampType)
    from strata.spark.sink import SinkColumns, check_sink_schema

    def schema(**cols):
        return StructType([StructField(n, t) for n, t in cols.items()])
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    ok = schema(key=StringType(), value=BinaryType(), topic=StringType(), partition=IntegerType(),
                headers=ArrayType(header), timestamp=TimestampType())
    assert check_sink_schema(ok, None) == SinkColumns(True, True, True, True, True)
    assert check_sink_schema(ok, "forced").topic is False      # the option wins
    for cols, topic, message in [
            (dict(key=BinaryType()), "t", "Required attribute 'value' not found"),
            (dict(value=IntegerType()), "t", "value attribute type must be a string or binary"),
            (dict(value=BinaryType()), None, "topic option required"),
            (dict(value=BinaryType(), partition=LongType()), "t",
             "partition attribute type must be an int"),
            (dict(value=BinaryType(), headers=ArrayType(StringType())), "t",
             "headers attribute type must be")]:
        with pytest.raises(StrataOptionError, match=message):
            check_sink_schema(schema(**cols), topic)
