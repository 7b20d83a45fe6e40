"""Regressions found by the log model (tests/unit/test_log_model.py), pinned deterministically.

* A produce request carrying several batches adds an index entry per batch (Kafka 4.x,
  KAFKA-806), but the roll check before the append only guarantees one free index slot: an
  append that filled the offset or the time index used to raise ``IndexFullError`` after its
  bytes were written, leaving unacknowledged data in the log. Full indexes now skip the sparse
  entry (the next append rolls), in append and in recovery alike.
* ListOffsets MAX_TIMESTAMP (KIP-734) answers the first record holding the greatest timestamp.
  A multi-batch append wrote the request's max timestamp into the time index at its first
  batch (not the running max per batch, as Kafka 4.x does), and after a truncation the
  segment's max timestamp was recomputed by scanning only from the last offset index entry:
  past the first batch that reached the max, so a later record with the same timestamp was
  returned.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata.common.clock import MockClock
from strata.log.log_config import LogConfig
from strata.log.log_validator import assign_offsets
from strata.log.segment import LogSegment
from strata.log.unified_log import MAX_TIMESTAMP, UnifiedLog
from strata.protocol import records as rec
from strata.protocol.records import SimpleRecord, build_batch, iter_records

T0 = 1_700_000_000_000
# 64 bytes: 8 offset index entries, 5 time index entries (one kept back for roll/close)
TINY_INDEX = {"segment.index.bytes": 64}


def open_log(directory: Path, props: dict, clock: MockClock, **kw) -> UnifiedLog:
    return UnifiedLog(directory, LogConfig(props), clock=clock, **kw)


def one_request(timestamps: list[int]) -> bytes:
    """One produce request: a one-record batch per timestamp."""
    return b"".join(build_batch([SimpleRecord(b"v%d" % i, timestamp=ts)])
                    for i, ts in enumerate(timestamps))


def all_offsets(ulog: UnifiedLog) -> list[int]:
    seen: list[int] = []
    start = ulog.log_start_offset
    while start < ulog.log_end_offset:
        got = [r.offset for r in iter_records(ulog.read(start, 1 << 20).records)
               if r.offset >= start]
        assert got, f"nothing read at {start}"
        seen += got
        start = got[-1] + 1
    return seen


def assert_indexes_match_the_log(seg: LogSegment, *, sealed: bool = True) -> None:
    """What Kafka's DumpLogSegments checks: ``--index-sanity-check`` and the verify pass.

    Every offset index entry points at a batch whose last offset is the entry's offset; every
    time index entry names a batch's last offset and that batch's max timestamp, with strictly
    increasing timestamps. A sealed segment's (rolled, closed or recovered) last time index
    entry holds its max timestamp.
    """
    seg.sanity_check()
    batches = [h._replace(position=start + h.position) for h, _, start in seg.iter_batches(0)]
    by_position = {h.position: h for h in batches}
    by_last_offset = {h.last_offset: h for h in batches}
    for n in range(seg.offset_index.entries):
        entry = seg.offset_index.entry(n)
        assert entry.position in by_position, f"offset index entry {entry} is not a batch"
        assert by_position[entry.position].last_offset == entry.offset, entry
    previous = -1
    for n in range(seg.time_index.entries):
        entry = seg.time_index.entry(n)
        assert entry.offset in by_last_offset, f"time index entry {entry}: no batch ends there"
        assert by_last_offset[entry.offset].max_timestamp == entry.timestamp, entry
        assert entry.timestamp > previous, f"time index entry {entry} out of order"
        previous = entry.timestamp
    if sealed and batches:
        assert seg.time_index.last_entry.timestamp == max(h.max_timestamp for h in batches)


def crash(ulog: UnifiedLog) -> None:
    """Stop without a clean close: preallocated indexes stay as they are, nothing is flushed."""
    for seg in ulog.local_log.segments:
        seg.offset_index.close_handler()
        seg.time_index.close_handler()
        seg.txn_index.close()
        os.close(seg._fd)  # noqa: SLF001 - simulating a crash
        seg._fd = -1       # noqa: SLF001


@pytest.mark.parametrize("full_index, singles, request_timestamps", [
    # equal timestamps: the time index keeps one entry, the offset index (8 slots) fills up
    ("offset", [], [T0] * 12),
    ("offset", [T0] * 7, [T0] * 3),             # one slot left before the request
    # rising timestamps: the time index (4 usable slots) fills up first
    ("time", [], [T0 + i for i in range(8)]),
    ("time", [T0 + i for i in range(4)], [T0 + 4, T0 + 5, T0 + 6]),
], ids=["offset-index", "offset-index-one-slot-left", "time-index",
        "time-index-one-slot-left"])
def test_a_multi_batch_append_never_fails_on_a_full_index(tmp_path, full_index, singles,
                                                          request_timestamps):
    clock = MockClock(T0)
    directory = tmp_path / "t-0"
    ulog = open_log(directory, dict(TINY_INDEX, **{"index.interval.bytes": 0}), clock)
    try:
        for ts in singles:   # one batch per request: the roll check keeps one slot free
            ulog.append_as_leader(one_request([ts]), 0)
        seg = ulog.local_log.active_segment
        index = seg.offset_index if full_index == "offset" else seg.time_index
        assert not index.is_full()
        timestamps = singles + request_timestamps
        n = len(timestamps)
        info = ulog.append_as_leader(one_request(request_timestamps), 0)
        assert (info.first_offset, info.last_offset) == (len(singles), n - 1)
        assert ulog.log_end_offset == n
        assert ulog.local_log.active_segment is seg
        assert index.is_full(), f"the {full_index} index should have filled up"
        # entries are added to both indexes or neither
        assert seg.offset_index.entries < n - 1
        assert_indexes_match_the_log(seg, sealed=False)

        # the next append rolls, and the sealed segment still checks out
        ulog.append_as_leader(one_request([timestamps[-1] + 1]), 0)
        assert [s.base_offset for s in ulog.local_log.segments] == [0, n]
        ulog.update_high_watermark(ulog.log_end_offset)
        assert all_offsets(ulog) == list(range(n + 1))
        assert_indexes_match_the_log(ulog.local_log.segments[0])
        for ts in timestamps:
            assert ulog.fetch_offset_by_timestamp(ts).offset == timestamps.index(ts), ts
    finally:
        ulog.close()


@pytest.mark.parametrize("full_index, timestamps", [
    ("offset", [T0] * 12),
    ("time", [T0 + i for i in range(8)]),
])
def test_recovery_rebuilds_indexes_that_would_overflow(tmp_path, full_index, timestamps):
    """A segment holding more index points than its indexes have slots recovers cleanly."""
    clock = MockClock(T0)
    directory = tmp_path / "t-0"
    props = dict(TINY_INDEX, **{"index.interval.bytes": 0})
    ulog = open_log(directory, props, clock)
    ulog.append_as_leader(one_request(timestamps), 0)
    crash(ulog)
    ulog = open_log(directory, props, clock, recovery_point=0, had_clean_shutdown=False)
    try:
        n = len(timestamps)
        assert ulog.log_end_offset == n
        seg = ulog.local_log.active_segment
        assert_indexes_match_the_log(seg)
        ulog.append_as_leader(one_request([timestamps[-1] + 1]), 0)
        ulog.update_high_watermark(ulog.log_end_offset)
        assert all_offsets(ulog) == list(range(n + 1))
        top = ulog.fetch_offset_by_timestamp(MAX_TIMESTAMP)
        assert (top.timestamp, top.offset) == (timestamps[-1] + 1, n)
    finally:
        ulog.close()


@pytest.mark.parametrize("reopen", [False, True])
def test_max_timestamp_after_truncation_is_the_first_record_holding_it(tmp_path, reopen):
    """KIP-734: the first record with the greatest timestamp, also after a truncation.

    Offsets 0..4 in one batch (the last one at ``t1``), then one request of three batches:
    5 at ``t1``, 6 at ``t1``, 7 at ``t2 > t1``. Truncating to 6 leaves ``t1`` as the max,
    first held by offset 4 (Kafka: the segment's maxTimestampAndOffsetSoFar, recomputed
    from the last time index entry and the batches after it, points at offset 4's batch).
    """
    clock = MockClock(T0)
    directory = tmp_path / "t-0"
    props = dict(TINY_INDEX, **{"index.interval.bytes": 40, "internal.segment.bytes": 2076})
    t0, t1, t2 = T0 - 5_000, T0 - 4_839, T0 - 4_560
    ulog = open_log(directory, props, clock)
    try:
        ulog.append_as_leader(build_batch([SimpleRecord(b"x%d" % i, timestamp=t0)
                                           for i in range(4)]
                                          + [SimpleRecord(b"x4", timestamp=t1)]), 0)
        ulog.append_as_leader(one_request([t1, t1, t2]), 0)
        ulog.update_high_watermark(ulog.log_end_offset)
        top = ulog.fetch_offset_by_timestamp(MAX_TIMESTAMP)
        assert (top.timestamp, top.offset) == (t2, 7)
        if reopen:
            ulog.close()
            ulog = open_log(directory, props, clock, recovery_point=ulog.recovery_point)
        assert ulog.truncate_to(6)
        top = ulog.fetch_offset_by_timestamp(MAX_TIMESTAMP)
        assert (top.timestamp, top.offset, top.leader_epoch) == (t1, 4, 0)
        assert ulog.fetch_offset_by_timestamp(t1).offset == 4
        # still right once the segment's time index is sealed and read back
        ulog.close()
        ulog = open_log(directory, props, clock, recovery_point=ulog.recovery_point)
        top = ulog.fetch_offset_by_timestamp(MAX_TIMESTAMP)
        assert (top.timestamp, top.offset) == (t1, 4)
        assert_indexes_match_the_log(ulog.local_log.active_segment)
    finally:
        ulog.close()


def test_a_multi_batch_append_indexes_the_running_max_timestamp(tmp_path):
    """Each batch's time index entry holds the max timestamp up to that batch (KAFKA-806).

    Not the max of the whole request: an entry ``(max of the request, its offset)`` at the
    first batch's index point is dropped by a truncation inside the request.
    """
    clock = MockClock(T0)
    ulog = open_log(tmp_path / "t-0", {"index.interval.bytes": 0}, clock)
    try:
        ulog.append_as_leader(one_request([T0, T0 + 5]), 0)
        ulog.append_as_leader(one_request([T0 + 7, T0 + 6, T0 + 9]), 0)
        seg = ulog.local_log.active_segment
        entries = [seg.time_index.entry(n) for n in range(seg.time_index.entries)]
        assert [(e.timestamp, e.offset) for e in entries] == \
            [(T0 + 5, 1), (T0 + 7, 2), (T0 + 9, 4)]
        assert_indexes_match_the_log(seg, sealed=False)
    finally:
        ulog.close()


def test_truncation_recomputes_the_max_timestamp_from_the_last_time_index_entry(tmp_path):
    """Kafka's readLargestTimestamp: scan from the batch of the last time index entry.

    The layout Strata wrote before the fix, still on disk after an upgrade: offset index
    entries for batches 5, 6 and 7 of one request, but a single time index entry ``(t2, 7)``
    (the request's max, written at its first batch). Truncating to 6 drops that entry and keeps
    the offset index entry of batch 5; the max timestamp ``t1`` is first reached by offset 4,
    before that entry, so the scan has to start before it.
    """
    t0, t1, t2 = T0, T0 + 161, T0 + 440
    seg = LogSegment(tmp_path, 0, index_interval_bytes=1 << 30, max_index_size=4096,
                     roll_jitter_ms=0, clock=MockClock(T0))
    try:
        def append(buf: bytes, base: int) -> list:
            data = bytearray(buf)
            assigned = assign_offsets(data, list(rec.iter_headers(data)), base, 0)
            seg.append(assigned.last_offset, assigned.max_timestamp,
                       assigned.shallow_offset_of_max_timestamp, data, assigned.headers)
            return assigned.headers
        append(build_batch([SimpleRecord(b"x", timestamp=t0)] * 4
                           + [SimpleRecord(b"y", timestamp=t1)]), 0)
        start = seg.size
        headers = append(one_request([t1, t1, t2]), 5)
        assert seg.offset_index.entries == seg.time_index.entries == 0
        for h in headers:
            seg.offset_index.append(h.last_offset, start + h.position)
        seg.time_index.maybe_append(t2, 7)

        seg.truncate_to(6)
        assert (seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far) == (t1, 4)
        top = seg.max_timestamp_record()
        assert (top.timestamp, top.offset) == (t1, 4)
    finally:
        seg.close()


@pytest.mark.slow
def test_kafka_dump_log_segments_accepts_indexes_of_overflowing_appends(tmp_path):
    """Apache Kafka's DumpLogSegments (sanity check and verify) on the full-index layouts."""
    from kafka_tools import (dump_log_segments, dump_reports_index_errors,
                             require_kafka_dist)
    require_kafka_dist()
    clock = MockClock(T0)
    directory = tmp_path / "t-0"
    ulog = open_log(directory, dict(TINY_INDEX, **{"index.interval.bytes": 0}), clock)
    ulog.append_as_leader(one_request([T0] * 12), 0)
    ulog.append_as_leader(one_request([T0 + 1 + i for i in range(8)]), 0)
    ulog.append_as_leader(one_request([T0 + 100]), 0)
    bases = [s.base_offset for s in ulog.local_log.segments]
    ulog.close()
    assert bases == [0, 12, 20]
    for base in bases:
        files = [directory / f"{base:020d}.index", directory / f"{base:020d}.timeindex"]
        out = dump_log_segments(*files, deep_iteration=True)
        assert dump_reports_index_errors(out) == [], out
        sane = dump_log_segments(*files, index_sanity_check=True)
        assert "corrupt" not in sane.lower(), sane
        assert sane.count("passed sanity check") + sane.count("is empty") >= 1, sane

