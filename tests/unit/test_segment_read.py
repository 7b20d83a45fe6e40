"""A segment read's shortcuts answer as the long way does.

A read finds the first indexed offset past its end with the same index search that bounds its
walk, and remembers where it stopped so that a sequential reader's next read needs no index
search or header read. Each is checked against a segment opened afresh on the same files.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from strata.common.clock import SYSTEM_CLOCK
from strata.log.segment import LogSegment
from strata.protocol.file_region import FileRegion, whole_batches_cut
from strata.protocol.records import SimpleRecord, build_batch, iter_headers

TS = 1_700_000_000_000


def new_segment(path, interval: int = 700) -> LogSegment:
    return LogSegment(path, 0, index_interval_bytes=interval, max_index_size=1 << 16,
                      roll_jitter_ms=0, clock=SYSTEM_CLOCK)


def append(seg: LogSegment, offset: int, sizes: list[int]) -> int:
    """One batch per entry of ``sizes`` (records of that many value bytes); the next offset."""
    for i, size in enumerate(sizes):
        data = build_batch([SimpleRecord(b"v" * size, b"k", timestamp=TS)] * (1 + i % 3),
                           base_offset=offset)
        headers = list(iter_headers(data))
        seg.append(headers[-1].last_offset, TS, headers[-1].last_offset, data, headers)
        offset = headers[-1].next_offset
    return offset


def reopened(seg: LogSegment) -> LogSegment:
    """Seal ``seg`` (indexes trimmed, as on roll) and open its files through a segment that has
    read nothing yet."""
    seg.on_become_inactive()
    seg.flush()
    return LogSegment(seg.directory, seg.base_offset, index_interval_bytes=seg.index_interval_bytes,
                      max_index_size=seg.max_index_size, roll_jitter_ms=0, clock=SYSTEM_CLOCK,
                      readonly=True)


def as_bytes(got) -> tuple[bytes, int, int | None]:
    data = got.data
    if isinstance(data, FileRegion):
        data, _ = data.read(), data.close()
    return bytes(data), got.position, got.upper_offset


def where_a_read_stops(seg: LogSegment, budget: int) -> int:
    """The offset after the whole batches of a ``budget``-byte read from offset 0."""
    data, _, _ = as_bytes(seg.read(0, budget, as_region=True))
    return list(iter_headers(data))[-1].next_offset


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 900), min_size=1, max_size=30),
       interval=st.sampled_from([1, 300, 700, 4096]),
       reads=st.lists(st.tuples(st.integers(0, 80), st.integers(1, 5000), st.booleans()),
                      min_size=1, max_size=12))
def test_a_read_reports_the_first_indexed_offset_past_its_end_as_a_separate_search_would(
        tmp_path_factory, sizes, interval, reads):
    seg = new_segment(tmp_path_factory.mktemp("seg"), interval)
    try:
        end = append(seg, 0, sizes)
        for start, budget, region in reads:
            got = seg.read(start % end, budget, min_one_message=False, as_region=region)
            data, position, upper = as_bytes(got)
            if not data:
                continue
            entry = seg.offset_index.fetch_upper_bound_offset(position, len(data))
            assert upper == (entry.offset if entry is not None else None)
    finally:
        seg.close()


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 900), min_size=1, max_size=30),
       interval=st.sampled_from([1, 700, 4096]),
       start=st.integers(0, 80),
       budgets=st.lists(st.integers(1, 4000), min_size=1, max_size=15),
       region=st.booleans(), min_one=st.booleans())
def test_a_sequential_reader_gets_what_a_fresh_segment_gives(
        tmp_path_factory, sizes, interval, start, budgets, region, min_one):
    seg = new_segment(tmp_path_factory.mktemp("seg"), interval)
    end = append(seg, 0, sizes)
    fresh = reopened(seg)
    try:
        offset = start % end
        for budget in budgets:
            got = as_bytes(seg.read(offset, budget, None, min_one, region))
            assert got == as_bytes(fresh.read(offset, budget, None, min_one, region))
            headers = list(iter_headers(got[0]))
            if headers:
                offset = headers[-1].next_offset
            if offset >= end:
                break
    finally:
        fresh.close()
        seg.close()


def test_the_next_read_of_a_sequential_reader_needs_no_index_search_or_header_read(tmp_path):
    """Even a read of one byte gets its first batch whole (KIP-74): the size is remembered."""
    seg = new_segment(tmp_path)
    try:
        append(seg, 0, [500] * 20)
        following = where_a_read_stops(seg, 2000)
        fresh = reopened(seg)
        expected = [as_bytes(fresh.read(following, budget, as_region=True)) for budget in (1, 2000)]
        fresh.close()
        assert len(expected[0][0]) > 1

        def refuse(*_):
            raise AssertionError("searched for a batch the last read stopped at")
        seg.offset_index.lookup = refuse
        seg._headers_from = refuse
        assert [as_bytes(seg.read(following, budget, as_region=True))
                for budget in (1, 2000)] == expected
    finally:
        seg.close()


def test_a_truncated_segment_forgets_where_reads_stopped(tmp_path):
    """After truncation and appends of other sizes, an offset a read stopped at lies elsewhere."""
    seg = new_segment(tmp_path)
    try:
        append(seg, 0, [400] * 10)
        following = where_a_read_stops(seg, 3000)
        assert following > 4
        seg.truncate_to(4)
        append(seg, 4, [90] * 30)
        got = as_bytes(seg.read(following, 1000, as_region=True))
        fresh = reopened(seg)
        try:
            assert got == as_bytes(fresh.read(following, 1000, as_region=True))
        finally:
            fresh.close()
    finally:
        seg.close()


@pytest.mark.parametrize("budget, expected", [
    (0, (0, -1, 0)),            # nothing read
    (70, (0, 0, 100)),          # inside the first batch: its header was read
    (100, (100, -1, 0)),        # ends exactly after the first: the next header was not read
    (150, (100, 10, 120)),      # inside the second
    (220, (220, -1, 0)),        # both whole
])
def test_a_cut_names_the_batch_it_stopped_inside(budget, expected):
    def header(base: int, size: int) -> bytes:
        return base.to_bytes(8, "big") + (size - 12).to_bytes(4, "big") + bytes(size - 12)
    data = header(0, 100) + header(10, 120)
    assert tuple(whole_batches_cut(lambda pos, n: data[pos:pos + n], budget, 64)) == expected
