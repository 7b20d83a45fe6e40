"""The strata source's planner and option parser, without Spark or a broker: offsets are
resolved against a fake ListOffsets/Metadata client and segments are built by hand."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.common.types import TopicIdPartition, TopicPartition
from strata.protocol.records import CRC_OFFSET
from strata.spark.options import (
    DEFAULT_MAX_BYTES_PER_PARTITION, OffsetSpec, SourceOptions, StrataOptionError,
    parse_sink_options, parse_source_options)
from strata.spark.plan import (
    OffsetRange, ReadPiece, ReadTask, offset_ranges, offsets_from_json, offsets_to_json, plan_tasks,
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
    ({"bootstrap.servers": "h:1", "subscribe": "t", "minPartitions": "-2"},
     "'minPartitions' must be a positive integer"),
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


def test_planning_asks_for_each_topics_earliest_and_latest_offsets_once():
    c = client()
    asked = []
    real = c.list_offsets
    c.list_offsets = lambda topic, parts, ts: asked.append((topic, ts)) or real(topic, parts, ts)
    ranges = offset_ranges(opts(subscribe=("t", "u")), c)
    assert ranges == [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 100, 500),
                      OffsetRange("u", 0, 0, 10)]
    assert sorted(asked) == [("t", -2), ("t", -1), ("u", -2), ("u", -1)]


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
         max_records=1_000_000, min_partitions=None):
    return plan_tasks(ranges, segments=segments, positions=positions,
                      max_bytes_per_partition=max_bytes, max_records_per_partition=max_records,
                      min_partitions=min_partitions)


def pieces(tasks):
    return [[(x.start, x.end, x.segment) for x in t.parts()] for t in tasks]


def test_direct_plan_reads_a_partitions_segments_and_local_tail_in_one_task_when_they_fit():
    segs = [seg(0, 99), seg(100, 199), seg(200, 249)]
    tasks = plan([OffsetRange("t", 0, 0, 300)], {("t", 0): segs})
    assert [(t.start, t.end) for t in tasks] == [(0, 300)]
    assert pieces(tasks) == [[(0, 100, segs[0]), (100, 200, segs[1]), (200, 250, segs[2]),
                              (250, 300, None)]]
    assert tasks[0].remote and tasks[0].segments == tuple(segs)


def test_direct_plan_cuts_a_partition_into_even_runs_of_about_max_bytes():
    segs = [seg(100 * i, 100 * i + 99, size=1000) for i in range(9)]
    tasks = plan([OffsetRange("t", 0, 0, 950)], {("t", 0): segs}, max_bytes=3500)
    # 9000 remote bytes and a 50-offset tail (500 bytes at the segments' density): 3 runs
    assert [(t.start, t.end) for t in tasks] == [(0, 300), (300, 600), (600, 950)]
    assert [len(t.parts()) for t in tasks] == [3, 3, 4]
    assert pieces(tasks)[-1][-1] == (900, 950, None)


def test_each_partition_gets_its_own_tasks():
    segs = {("t", 0): [seg(0, 99)], ("t", 1): [seg(0, 99, partition=1)]}
    tasks = plan([OffsetRange("t", 0, 0, 120), OffsetRange("t", 1, 50, 100)], segs)
    assert [(t.partition, t.start, t.end, len(t.parts())) for t in tasks] == [
        (0, 0, 120, 2), (1, 50, 100, 1)]


def test_direct_plan_trims_segments_to_the_range_and_skips_those_outside_it():
    segs = [seg(0, 99), seg(100, 199), seg(200, 249)]
    tasks = plan([OffsetRange("t", 0, 150, 220)], {("t", 0): segs})
    assert pieces(tasks) == [[(150, 200, segs[1]), (200, 220, segs[2])]]


def test_offsets_the_remote_tier_does_not_cover_go_through_fetch():
    segs = [seg(100, 199), seg(300, 399)]
    tasks = plan([OffsetRange("t", 0, 50, 450)], {("t", 0): segs})
    assert [(a, b, m is not None) for a, b, m in pieces(tasks)[0]] == [
        (50, 100, False), (100, 200, True), (200, 300, False), (300, 400, True), (400, 450, False)]


def test_without_remote_segments_fetch_ranges_are_not_grouped():
    tasks = plan([OffsetRange("t", 0, 0, 25)], {("t", 0): []}, max_records=10)
    assert [(t.start, t.end, t.remote) for t in tasks] == [
        (0, 10, False), (10, 20, False), (20, 25, False)]


def test_a_task_reads_at_most_max_records_offsets_through_fetch_however_small_they_are():
    segs = [seg(0, 99, size=100)]           # 1 byte per offset: the tail is tiny in bytes
    tasks = plan([OffsetRange("t", 0, 0, 400)], {("t", 0): segs}, max_bytes=10_000,
                 max_records=100)
    fetched = [sum(x.end - x.start for x in t.parts() if x.segment is None) for t in tasks]
    assert len(tasks) == 3 and max(fetched) == 100 and sum(fetched) == 300


def test_overlapping_segments_never_read_an_offset_twice():
    segs = [seg(0, 99), seg(50, 149)]
    tasks = plan([OffsetRange("t", 0, 0, 150)], {("t", 0): segs})
    assert [(a, b) for a, b, _ in pieces(tasks)[0]] == [(0, 100), (100, 150)]


def test_broker_plan_splits_ranges_by_offset_count():
    tasks = plan([OffsetRange("t", 0, 10, 35), OffsetRange("t", 1, 0, 5)], max_records=10)
    assert [(t.partition, t.start, t.end, t.remote, t.pieces) for t in tasks] == [
        (0, 10, 20, False, ()), (0, 20, 30, False, ()), (0, 30, 35, False, ()),
        (1, 0, 5, False, ())]


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
    flat = [x for t in pieces(tasks) for x in t]
    assert [(a, b) for a, b, _ in flat] == [(0, 100), (100, 300), (300, 500), (500, 700),
                                            (700, 900), (900, 1100)]
    assert all(m is (small if a == 0 else big) for a, b, m in flat)
    assert len(tasks) == 5 and {t.segments for t in tasks} >= {(big,)}


def test_split_segment_covers_the_segment_even_when_one_step_exceeds_the_limit():
    meta = seg(0, 99, size=10_000)
    pieces = split_segment(meta, [(10, 100), (50, 9000)], max_bytes=1000)
    assert pieces[0][0] == 0 and pieces[-1][1] == 100
    assert all(a < b for a, b in pieces) and all(
        x[1] == y[0] for x, y in zip(pieces, pieces[1:]))
    assert split_segment(seg(0, 99, size=800), [(10, 100)], max_bytes=1000) == [(0, 100)]


def test_min_partitions_cuts_the_largest_tasks_between_segments_first():
    segs = [seg(100 * i, 100 * i + 99) for i in range(4)]
    tasks = plan([OffsetRange("t", 0, 0, 400)], {("t", 0): segs}, min_partitions=3)
    assert [t.start for t in tasks] in ([0, 200, 300], [0, 100, 200])
    assert sorted(len(t.parts()) for t in tasks) == [1, 1, 2]
    assert all(x.start == x.segment.start_offset for t in tasks for x in t.parts())


def test_min_partitions_cuts_a_segment_at_the_index_entry_nearest_its_middle():
    meta = seg(0, 999, size=10_000)
    index = [(99 + 100 * i, 1000 * (i + 1)) for i in range(9)]   # batches of 100 offsets
    tasks = plan([OffsetRange("t", 0, 0, 1000)], {("t", 0): [meta]}, lambda m: index,
                 min_partitions=2)
    assert [(t.start, t.end, t.segments) for t in tasks] == [(0, 500, (meta,)),
                                                             (500, 1000, (meta,))]


def test_min_partitions_halves_fetch_ranges_in_broker_mode_and_stops_at_single_offsets():
    tasks = plan([OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)], min_partitions=4)
    assert [(t.partition, t.start, t.end) for t in tasks] == [
        (0, 0, 25), (0, 25, 50), (0, 50, 100), (1, 0, 10)]
    assert len(plan([OffsetRange("t", 0, 0, 2)], min_partitions=5)) == 2


def test_min_partitions_leaves_an_unsplittable_segment_whole():
    meta = seg(0, 99)
    tasks = plan([OffsetRange("t", 0, 0, 100)], {("t", 0): [meta]}, lambda m: [],
                 min_partitions=4)
    assert [(t.start, t.end) for t in tasks] == [(0, 100)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 60), st.integers(1, 5000)),
                max_size=8),
       st.integers(0, 200), st.integers(0, 200), st.integers(100, 20_000), st.integers(1, 50),
       st.one_of(st.none(), st.integers(1, 30)))
def test_tasks_cover_the_range_exactly_once_in_order(layout, start, length, max_bytes,
                                                     max_records, min_partitions):
    metas, at = [], 0
    for gap, count, size in layout:        # segments with gaps between them
        metas.append(seg(at + gap, at + gap + count - 1, size=size))
        at += gap + count

    def positions(meta):                   # an entry every 7 offsets
        span = meta.end_offset + 1 - meta.start_offset
        return [(o, (o - meta.start_offset) * meta.segment_size_in_bytes // span)
                for o in range(meta.start_offset + 6, meta.end_offset, 7)]
    r = OffsetRange("t", 0, start, start + length + 1)
    tasks = plan([r], {("t", 0): metas}, positions, max_bytes=max_bytes,
                 max_records=max_records, min_partitions=min_partitions)
    flat = [x for t in tasks for x in t.parts()]
    assert tasks[0].start == flat[0].start == r.start and tasks[-1].end == flat[-1].end == r.end
    assert all(a.end == b.start for a, b in zip(tasks, tasks[1:]))
    assert all(a.end == b.start and a.start < a.end for a, b in zip(flat, flat[1:]))
    assert all(t.parts()[0].start == t.start and t.parts()[-1].end == t.end for t in tasks)
    for x in flat:
        if x.segment is not None:
            assert x.segment.start_offset <= x.start and x.end <= x.segment.end_offset + 1
        else:                              # Fetch only where no segment has the offsets
            assert x.end - x.start <= max_records
            assert not any(m.start_offset < x.end and x.start <= m.end_offset for m in metas)
    if min_partitions is not None:
        assert len(tasks) >= min(min_partitions, r.end - r.start) or all(
            len(t.parts()) == 1 for t in tasks)


def test_read_tasks_pickle_with_their_pieces():
    task = ReadTask("t", 0, 5, 20, (ReadPiece(5, 10, seg(0, 9)), ReadPiece(10, 20)))
    assert pickle.loads(pickle.dumps(task)) == task
    assert task.describe() == "t-0 [5, 20) via 1 remote segment piece(s) and 1 fetch range(s)"
    assert task.describe(task.pieces[0]) == \
        f"t-0 [5, 10) via remote segment {task.pieces[0].segment.remote_log_segment_id.id}"
    assert ReadTask("t", 0, 5, 10).describe() == "t-0 [5, 10) via fetch"


# ---- reading a task ---------------------------------------------------------------------------

class FakeSegmentReader:
    """Serves each segment's records (one batch per segment) as views of one buffer, and
    records the calls; segments in ``lost`` are data loss, those in ``damaged`` have a bad
    batch CRC, and the RSM vouches for the batches of those in ``vouched``."""

    def __init__(self, lost=(), damaged=(), vouched=()):
        self.calls = []
        self.lost = set(lost)
        self.damaged = set(damaged)
        self.vouched = set(vouched)

    def batches_verified(self, meta):
        return meta.start_offset in self.vouched

    def prefetch(self, meta, start):
        self.calls.append(("prefetch", meta.start_offset, start))

    def views(self, meta, start, end):
        from strata.protocol.records import SimpleRecord, build_batch
        from strata.spark.broker_client import DataLossError
        self.calls.append(("read", meta.start_offset, start))
        if meta.start_offset in self.lost:
            raise DataLossError(f"segment at {meta.start_offset} is missing", topic="t",
                                partition=0, start=start, end=end)
        count = meta.end_offset + 1 - meta.start_offset
        buf = bytearray(build_batch([SimpleRecord(b"v%d" % i, None, (), 0) for i in range(count)],
                                    base_offset=meta.start_offset))
        if meta.start_offset in self.damaged:
            buf[CRC_OFFSET] ^= 0xFF
        yield memoryview(buf)
        buf[:] = bytes(len(buf))            # reused: must not show in what was returned


def read_all(task, monkeypatch, reader, **kw):
    import strata.spark.source as source
    monkeypatch.setattr(source, "_segment_reader", lambda props: reader)
    o = opts(subscribe=("t",), mode="direct", rsm_props={}, **kw)
    return [r for b in source.read_task(task, o) for r in b.to_pylist()]


def test_read_task_reads_its_pieces_in_order_warming_each_next_segment_first(monkeypatch):
    segs = [seg(0, 9), seg(10, 19), seg(20, 29)]
    task = ReadTask("t", 0, 3, 25, (ReadPiece(3, 10, segs[0]), ReadPiece(10, 15, segs[1]),
                                     ReadPiece(15, 20, segs[1]), ReadPiece(20, 25, segs[2])))
    reader = FakeSegmentReader()
    got = read_all(task, monkeypatch, reader)
    assert [r["offset"] for r in got] == list(range(3, 25))
    assert [r["value"] for r in got] == [b"v%d" % (o % 10) for o in range(3, 25)]
    assert reader.calls == [("prefetch", 10, 10), ("read", 0, 3), ("read", 10, 10),
                            ("prefetch", 20, 20), ("read", 10, 15), ("read", 20, 20)]


def test_a_lost_segment_fails_the_task_or_only_its_piece_is_skipped(monkeypatch):
    from strata.spark.broker_client import DataLossError
    segs = [seg(0, 9), seg(10, 19), seg(20, 29)]
    task = ReadTask("t", 0, 0, 30, tuple(ReadPiece(m.start_offset, m.end_offset + 1, m)
                                         for m in segs))
    with pytest.raises(DataLossError, match="segment at 10 is missing"):
        read_all(task, monkeypatch, FakeSegmentReader(lost={10}))
    got = read_all(task, monkeypatch, FakeSegmentReader(lost={10}), fail_on_data_loss=False)
    assert [r["offset"] for r in got] == list(range(10)) + list(range(20, 30))


def test_batch_crcs_are_checked_unless_the_rsm_vouches_for_the_segments_batches(monkeypatch):
    from strata.common.errors import CorruptRecordError
    task = ReadTask("t", 0, 0, 20, (ReadPiece(0, 10, seg(0, 9)), ReadPiece(10, 20, seg(10, 19))))
    with pytest.raises(CorruptRecordError, match="base offset 10"):
        read_all(task, monkeypatch, FakeSegmentReader(damaged={10}, vouched={0}))
    # vouched for: the RSM checked every batch at upload and checks every chunk it reads
    got = read_all(task, monkeypatch, FakeSegmentReader(damaged={10}, vouched={0, 10}))
    assert [r["offset"] for r in got] == list(range(20))
    with pytest.raises(CorruptRecordError, match="base offset 0"):
        read_all(task, monkeypatch, FakeSegmentReader(damaged={0}, vouched={10}))


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
