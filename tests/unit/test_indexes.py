"""Offset, time and transaction index files: Kafka byte layout and lookup semantics."""

from __future__ import annotations

import bisect
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.log.indexes import (
    AbortedTxn,
    CorruptIndexError,
    IndexClosedError,
    IndexFullError,
    IndexOffsetOverflowError,
    InvalidOffsetError,
    InvalidTimestampOrderError,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
    TransactionIndex,
    TxnIndexSearchResult,
)

BASE = 45


def offset_index(tmp_path: Path, max_entries: int = 30, base: int = BASE, name: str = "idx") -> OffsetIndex:
    return OffsetIndex(tmp_path / f"{base:020d}.{name}", base, max_entries * 8)


def time_index(tmp_path: Path, max_entries: int = 30, base: int = BASE) -> TimeIndex:
    return TimeIndex(tmp_path / f"{base:020d}.timeindex", base, max_entries * 12)


# ============================================================== OffsetIndex


def test_new_offset_index_is_preallocated_to_max_size_rounded_down(tmp_path):
    idx = OffsetIndex(tmp_path / "a.index", 0, 100)
    assert os.path.getsize(tmp_path / "a.index") == 96
    assert (tmp_path / "a.index").read_bytes() == bytes(96)
    assert idx.entries == 0
    assert idx.max_entries == 12
    assert idx.length == 96
    assert idx.size_in_bytes == 0
    assert not idx.is_full()
    idx.close()


def test_offset_index_entries_are_big_endian_relative_offset_then_position(tmp_path):
    idx = offset_index(tmp_path, max_entries=4)
    idx.append(BASE, 0)
    idx.append(BASE + 7, 4096)
    idx.append(BASE + 70000, 2**31 - 1)
    idx.flush()
    expected = struct.pack(">ii", 0, 0) + struct.pack(">ii", 7, 4096) + struct.pack(">ii", 70000, 2**31 - 1)
    assert idx.path.read_bytes() == expected + bytes(8)  # one preallocated slot still free
    idx.close()
    assert idx.path.read_bytes() == expected


def test_close_trims_offset_index_to_valid_entries(tmp_path):
    idx = offset_index(tmp_path, max_entries=100)
    for i in range(5):
        idx.append(BASE + i * 3, i * 100)
    assert os.path.getsize(idx.path) == 800
    idx.close()
    assert os.path.getsize(idx.path) == 5 * 8
    idx.close()  # idempotent


def test_empty_offset_index_trims_to_zero_bytes_and_reopens(tmp_path):
    path = tmp_path / "e.index"
    OffsetIndex(path, 10, 80).close()
    assert path.read_bytes() == b""
    reopened = OffsetIndex(path, 10, 80)
    assert reopened.entries == 0
    assert reopened.lookup(50) == OffsetPosition(10, 0)
    assert reopened.is_full()  # an existing file is not re-extended until resize()
    assert reopened.resize(80)
    reopened.append(12, 0)
    assert reopened.lookup(50) == OffsetPosition(12, 0)
    reopened.close()


def test_reopened_trimmed_index_has_its_entries_and_grows_only_after_resize(tmp_path):
    idx = offset_index(tmp_path, max_entries=10)
    for i in range(4):
        idx.append(BASE + i * 10, i * 50)
    idx.close()

    reopened = OffsetIndex(idx.path, BASE, 80)
    assert reopened.entries == 4
    assert reopened.max_entries == 4
    assert reopened.last_offset == BASE + 30
    assert reopened.is_full()
    with pytest.raises(IndexFullError):
        reopened.append(BASE + 40, 200)
    assert reopened.resize(80) is True
    assert reopened.resize(80) is False
    assert reopened.max_entries == 10
    reopened.append(BASE + 40, 200)
    assert [reopened.entry(i) for i in range(5)] == [
        OffsetPosition(BASE + i * 10, i * 50) for i in range(5)]
    reopened.close()
    assert os.path.getsize(idx.path) == 40


def test_read_only_index_maps_existing_file_without_changing_it(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 10)
    idx.append(BASE + 5, 20)
    idx.close()
    before = idx.path.read_bytes()

    ro = OffsetIndex(idx.path, BASE, writable=False)
    assert ro.entries == 2
    assert ro.lookup(BASE + 4) == OffsetPosition(BASE + 1, 10)
    with pytest.raises(PermissionError):
        ro.append(BASE + 9, 30)
    with pytest.raises(PermissionError):
        ro.truncate_to(BASE)
    ro.close()
    assert idx.path.read_bytes() == before


def test_read_only_index_on_empty_file_has_no_entries(tmp_path):
    path = tmp_path / "empty.index"
    path.write_bytes(b"")
    ro = OffsetIndex(path, 100, writable=False)
    assert ro.entries == 0
    assert ro.lookup(500) == OffsetPosition(100, 0)
    assert ro.fetch_upper_bound_offset(0, 10) is None
    ro.sanity_check()
    ro.close()
    assert path.read_bytes() == b""


def test_read_only_index_requires_existing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        OffsetIndex(tmp_path / "missing.index", 0, writable=False)
    assert not (tmp_path / "missing.index").exists()


def test_max_index_size_smaller_than_one_entry_is_rejected(tmp_path):
    with pytest.raises(ValueError):
        OffsetIndex(tmp_path / "tiny.index", 0, 7)
    assert not (tmp_path / "tiny.index").exists()
    with pytest.raises(ValueError):
        TimeIndex(tmp_path / "tiny.timeindex", 0, 11)


def test_lookup_on_empty_index_returns_base_offset_and_position_zero(tmp_path):
    idx = offset_index(tmp_path)
    assert idx.lookup(BASE) == OffsetPosition(BASE, 0)
    assert idx.lookup(BASE + 100) == OffsetPosition(BASE, 0)
    assert idx.lookup(0) == OffsetPosition(BASE, 0)
    assert idx.last_offset == BASE


def test_lookup_finds_greatest_entry_at_or_below_target(tmp_path):
    idx = offset_index(tmp_path)
    for rel, pos in [(2, 0), (5, 100), (9, 230), (20, 400)]:
        idx.append(BASE + rel, pos)
    assert idx.lookup(BASE) == OffsetPosition(BASE, 0)  # below the first entry
    assert idx.lookup(BASE + 1) == OffsetPosition(BASE, 0)
    assert idx.lookup(BASE + 2) == OffsetPosition(BASE + 2, 0)
    assert idx.lookup(BASE + 4) == OffsetPosition(BASE + 2, 0)
    assert idx.lookup(BASE + 5) == OffsetPosition(BASE + 5, 100)
    assert idx.lookup(BASE + 19) == OffsetPosition(BASE + 9, 230)
    assert idx.lookup(BASE + 20) == OffsetPosition(BASE + 20, 400)
    assert idx.lookup(BASE + 10**9) == OffsetPosition(BASE + 20, 400)


def test_lookup_across_warm_and_cold_sections_of_a_large_index(tmp_path):
    n = 3000  # well past the 1024-entry warm section of an offset index
    idx = offset_index(tmp_path, max_entries=n)
    for i in range(n):
        idx.append(BASE + 2 * i, 10 * i)
    assert idx.is_full()
    for i in range(0, n, 7):
        assert idx.lookup(BASE + 2 * i) == OffsetPosition(BASE + 2 * i, 10 * i)
        assert idx.lookup(BASE + 2 * i + 1) == OffsetPosition(BASE + 2 * i, 10 * i)
        assert idx.fetch_upper_bound_offset(0, 10 * i) == OffsetPosition(BASE + 2 * i, 10 * i)
        assert idx.fetch_upper_bound_offset(0, 10 * i - 3) == OffsetPosition(BASE + 2 * i, 10 * i)
    assert idx.lookup(BASE - 1) == OffsetPosition(BASE, 0)
    assert idx.lookup(BASE + 2 * n) == OffsetPosition(BASE + 2 * (n - 1), 10 * (n - 1))


def test_append_rejects_offset_not_larger_than_last(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE + 5, 0)
    with pytest.raises(InvalidOffsetError):
        idx.append(BASE + 5, 10)
    with pytest.raises(InvalidOffsetError):
        idx.append(BASE + 4, 10)
    assert issubclass(InvalidOffsetError, ValueError)
    assert idx.entries == 1


def test_append_rejects_offsets_outside_relative_offset_range(tmp_path):
    idx = offset_index(tmp_path)
    with pytest.raises(IndexOffsetOverflowError):
        idx.append(BASE - 1, 0)
    with pytest.raises(IndexOffsetOverflowError):
        idx.append(BASE + 2**31, 0)
    assert idx.entries == 0
    idx.append(BASE + 2**31 - 1, 0)
    assert idx.lookup(BASE + 2**31 - 1) == OffsetPosition(BASE + 2**31 - 1, 0)


def test_relative_offset_bounds(tmp_path):
    idx = offset_index(tmp_path)
    assert idx.relative_offset(BASE) == 0
    assert idx.relative_offset(BASE + 2**31 - 1) == 2**31 - 1
    assert idx.can_append_offset(BASE + 10)
    assert not idx.can_append_offset(BASE + 2**31)
    with pytest.raises(IndexOffsetOverflowError):
        idx.relative_offset(BASE - 1)


def test_append_to_full_offset_index_raises(tmp_path):
    idx = offset_index(tmp_path, max_entries=3)
    for i in range(3):
        idx.append(BASE + i, i)
    assert idx.is_full()
    with pytest.raises(IndexFullError):
        idx.append(BASE + 3, 3)


def test_entry_returns_nth_pair_and_rejects_out_of_range(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 11)
    idx.append(BASE + 2, 22)
    assert idx.entry(0) == OffsetPosition(BASE + 1, 11)
    assert idx.entry(1) == OffsetPosition(BASE + 2, 22)
    with pytest.raises(IndexError):
        idx.entry(2)
    with pytest.raises(IndexError):
        idx.entry(-1)


@pytest.mark.parametrize("truncate_at, remaining", [
    (BASE + 10, [0, 5]),        # an exact entry goes, and everything after it
    (BASE + 11, [0, 5, 10]),    # between entries: keep the one below
    (BASE + 100, [0, 5, 10, 15]),  # beyond the last: no effect
    (BASE, []),                 # at the first entry
    (BASE - 3, []),             # below everything
])
def test_truncate_to_removes_entries_at_or_above_offset(tmp_path, truncate_at, remaining):
    idx = offset_index(tmp_path)
    for rel in (0, 5, 10, 15):
        idx.append(BASE + rel, rel * 10)
    idx.truncate_to(truncate_at)
    assert [idx.entry(i).offset - BASE for i in range(idx.entries)] == remaining
    assert idx.last_offset == (BASE + remaining[-1] if remaining else BASE)
    # Appending resumes right after the kept entries.
    idx.append(BASE + 50, 500)
    assert idx.lookup(BASE + 60) == OffsetPosition(BASE + 50, 500)


def test_truncate_then_close_trims_file(tmp_path):
    idx = offset_index(tmp_path)
    for rel in range(6):
        idx.append(BASE + rel, rel)
    idx.truncate_to(BASE + 2)
    idx.close()
    assert idx.path.read_bytes() == struct.pack(">iiii", 0, 0, 1, 1)


def test_fetch_upper_bound_offset_finds_first_entry_at_or_past_fetch_end(tmp_path):
    idx = offset_index(tmp_path)
    for rel, pos in [(0, 0), (1, 100), (2, 200), (3, 300)]:
        idx.append(BASE + rel, pos)
    assert idx.fetch_upper_bound_offset(0, 150) == OffsetPosition(BASE + 2, 200)
    assert idx.fetch_upper_bound_offset(OffsetPosition(BASE, 0), 150) == OffsetPosition(BASE + 2, 200)
    assert idx.fetch_upper_bound_offset(100, 100) == OffsetPosition(BASE + 2, 200)  # exact position
    assert idx.fetch_upper_bound_offset(0, 0) == OffsetPosition(BASE, 0)
    assert idx.fetch_upper_bound_offset(0, 300) == OffsetPosition(BASE + 3, 300)
    assert idx.fetch_upper_bound_offset(0, 301) is None


def test_reset_drops_entries_and_reextends_to_max_size(tmp_path):
    idx = offset_index(tmp_path, max_entries=8)
    for i in range(3):
        idx.append(BASE + i, i)
    idx.trim_to_valid_size()
    assert os.path.getsize(idx.path) == 24
    assert idx.max_entries == 3
    idx.reset()
    assert idx.entries == 0
    assert idx.last_offset == BASE
    assert os.path.getsize(idx.path) == 64
    assert idx.max_entries == 8
    idx.append(BASE + 9, 0)
    assert idx.lookup(BASE + 9) == OffsetPosition(BASE + 9, 0)


def test_resize_refuses_to_drop_valid_entries(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE, 0)
    idx.append(BASE + 1, 1)
    with pytest.raises(ValueError):
        idx.resize(8)
    assert idx.entries == 2


def test_sanity_check_rejects_length_not_a_multiple_of_entry_size(tmp_path):
    path = tmp_path / "garbage.index"
    path.write_bytes(struct.pack(">ii", 1, 0) + b"\x00\x00\x00\x02\x00")  # 13 bytes
    ro = OffsetIndex(path, 0, writable=False)
    assert ro.entries == 1
    with pytest.raises(CorruptIndexError):
        ro.sanity_check()
    ro.close()
    rw = OffsetIndex(path, 0, 80)
    with pytest.raises(CorruptIndexError):
        rw.sanity_check()


def test_sanity_check_rejects_last_offset_below_base_offset(tmp_path):
    path = tmp_path / "neg.index"
    path.write_bytes(struct.pack(">ii", 1, 0) + struct.pack(">ii", -5, 10))
    idx = OffsetIndex(path, 100, writable=False)
    assert idx.last_offset == 95
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()


def test_sanity_check_passes_for_valid_index(tmp_path):
    idx = offset_index(tmp_path)
    idx.sanity_check()
    idx.append(BASE + 3, 0)
    idx.sanity_check()


def test_rename_keeps_index_usable_and_delete_removes_file(tmp_path):
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 1)
    old = idx.path
    new = tmp_path / (old.name + ".deleted")
    idx.rename_to(new)
    assert idx.path == new and new.exists() and not old.exists()
    idx.append(BASE + 2, 2)
    assert idx.lookup(BASE + 2) == OffsetPosition(BASE + 2, 2)
    assert idx.delete() is True
    assert not new.exists()
    assert idx.delete() is False
    with pytest.raises(IndexClosedError):
        idx.lookup(BASE)


def test_closed_index_rejects_operations(tmp_path):
    idx = offset_index(tmp_path)
    idx.close()
    with pytest.raises(IndexClosedError):
        idx.lookup(BASE)
    with pytest.raises(IndexClosedError):
        idx.append(BASE, 0)


def test_index_works_as_context_manager(tmp_path):
    with offset_index(tmp_path, max_entries=10) as idx:
        idx.append(BASE, 0)
    assert idx.is_closed
    assert os.path.getsize(idx.path) == 8


# ================================================================ TimeIndex


def test_time_index_entries_are_big_endian_timestamp_then_relative_offset(tmp_path):
    idx = time_index(tmp_path, max_entries=5)
    assert os.path.getsize(idx.path) == 60
    idx.maybe_append(1_700_000_000_000, BASE + 3)
    idx.maybe_append(1_700_000_000_500, BASE + 9)
    idx.close()
    assert idx.path.read_bytes() == (struct.pack(">qi", 1_700_000_000_000, 3)
                                     + struct.pack(">qi", 1_700_000_000_500, 9))


def test_time_index_keeps_last_slot_for_roll_entry(tmp_path):
    idx = time_index(tmp_path, max_entries=3)
    idx.maybe_append(10, BASE + 1)
    assert not idx.is_full()
    idx.maybe_append(20, BASE + 2)
    assert idx.entries == 2 and idx.max_entries == 3
    assert idx.is_full()  # one slot left, reserved
    with pytest.raises(IndexFullError):
        idx.maybe_append(30, BASE + 3)
    idx.maybe_append(30, BASE + 3, skip_full_check=True)
    assert idx.entries == 3
    with pytest.raises(IndexFullError):
        idx.maybe_append(40, BASE + 4, skip_full_check=True)


def test_time_index_appends_only_increasing_timestamps(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(-1, BASE)  # NO_TIMESTAMP on an empty index: nothing to index
    assert idx.entries == 0
    idx.maybe_append(100, BASE + 1)
    idx.maybe_append(100, BASE + 2)  # same timestamp: ignored
    assert idx.entries == 1
    idx.maybe_append(100, BASE + 1)  # re-appending the last entry (roll/close) is a no-op
    assert idx.entries == 1
    idx.maybe_append(150, BASE + 1)  # same offset, larger timestamp: appended (as Kafka does)
    assert idx.last_entry == TimestampOffset(150, BASE + 1)
    assert idx.entries == 2


def test_time_index_rejects_offset_or_timestamp_going_backwards(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(100, BASE + 10)
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(200, BASE + 9)
    with pytest.raises(InvalidTimestampOrderError):
        idx.maybe_append(99, BASE + 11)
    with pytest.raises(IndexOffsetOverflowError):
        idx.maybe_append(300, BASE + 2**31)
    assert idx.entries == 1


def test_time_index_lookup_edge_cases(tmp_path):
    idx = time_index(tmp_path)
    assert idx.lookup(1000) == TimestampOffset(-1, BASE)
    assert idx.last_entry == TimestampOffset(-1, BASE)
    for ts, rel in [(100, 1), (200, 4), (300, 9)]:
        idx.maybe_append(ts, BASE + rel)
    assert idx.lookup(99) == TimestampOffset(-1, BASE)
    assert idx.lookup(100) == TimestampOffset(100, BASE + 1)
    assert idx.lookup(250) == TimestampOffset(200, BASE + 4)
    assert idx.lookup(300) == TimestampOffset(300, BASE + 9)
    assert idx.lookup(2**62) == TimestampOffset(300, BASE + 9)
    assert idx.entry(1) == TimestampOffset(200, BASE + 4)
    with pytest.raises(IndexError):
        idx.entry(3)


@pytest.mark.parametrize("truncate_at, remaining", [
    (BASE + 4, [1]),
    (BASE + 5, [1, 4]),
    (BASE + 1, []),
    (BASE + 0, []),
    (BASE + 10, [1, 4, 9]),
])
def test_time_index_truncate_to_removes_entries_at_or_above_offset(tmp_path, truncate_at, remaining):
    idx = time_index(tmp_path)
    for ts, rel in [(100, 1), (200, 4), (300, 9)]:
        idx.maybe_append(ts, BASE + rel)
    idx.truncate_to(truncate_at)
    assert [idx.entry(i).offset - BASE for i in range(idx.entries)] == remaining
    expected_last = idx.entry(idx.entries - 1) if remaining else TimestampOffset(-1, BASE)
    assert idx.last_entry == expected_last


def test_time_index_truncate_removes_every_entry_sharing_the_offset(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(100, BASE + 1)
    idx.maybe_append(200, BASE + 3)
    idx.maybe_append(250, BASE + 3)
    idx.maybe_append(300, BASE + 5)
    idx.truncate_to(BASE + 3)
    assert idx.entries == 1
    assert idx.last_entry == TimestampOffset(100, BASE + 1)


def test_time_index_reopen_restores_last_entry(tmp_path):
    idx = time_index(tmp_path)
    idx.maybe_append(100, BASE + 1)
    idx.maybe_append(200, BASE + 4)
    idx.close()
    assert os.path.getsize(idx.path) == 24
    reopened = TimeIndex(idx.path, BASE, 30 * 12)
    assert reopened.entries == 2
    assert reopened.last_entry == TimestampOffset(200, BASE + 4)
    reopened.resize(30 * 12)
    reopened.maybe_append(300, BASE + 8)
    assert reopened.lookup(1000) == TimestampOffset(300, BASE + 8)
    reopened.sanity_check()


def test_time_index_sanity_check_rejects_last_timestamp_below_first(tmp_path):
    path = tmp_path / "bad.timeindex"
    path.write_bytes(struct.pack(">qi", 500, 1) + struct.pack(">qi", 100, 2))
    idx = TimeIndex(path, 0, writable=False)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()


def test_time_index_sanity_check_rejects_garbage_length_and_offset_below_base(tmp_path):
    path = tmp_path / "garbage.timeindex"
    path.write_bytes(struct.pack(">qi", 5, 1) + b"\x01\x02\x03")
    with pytest.raises(CorruptIndexError):
        TimeIndex(path, 0, writable=False).sanity_check()
    path2 = tmp_path / "below.timeindex"
    path2.write_bytes(struct.pack(">qi", 5, -1))
    with pytest.raises(CorruptIndexError):
        TimeIndex(path2, 10, writable=False).sanity_check()


def test_time_index_reset_and_trim(tmp_path):
    idx = time_index(tmp_path, max_entries=4)
    idx.maybe_append(1, BASE)
    idx.trim_to_valid_size()
    assert os.path.getsize(idx.path) == 12
    idx.reset()
    assert idx.entries == 0
    assert idx.last_entry == TimestampOffset(-1, BASE)
    assert os.path.getsize(idx.path) == 48


# ======================================================= property tests


def _model_lookup(keys: list[int], target: int) -> int:
    """Index of the greatest key <= target in a sorted list, or -1."""
    return bisect.bisect_right(keys, target) - 1


@settings(max_examples=150, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 50_000), unique=True, max_size=200).map(sorted),
    targets=st.lists(st.integers(-5, 50_010), max_size=40),
    truncate_at=st.integers(-5, 50_010),
)
def test_offset_index_lookup_matches_sorted_list_model(offsets, targets, truncate_at):
    with tempfile.TemporaryDirectory() as d:
        idx = OffsetIndex(Path(d) / "p.index", 0, 8 * max(1, len(offsets)))
        positions = [o * 3 + 1 for o in offsets]
        for o, p in zip(offsets, positions):
            idx.append(o, p)
        for t in targets:
            i = _model_lookup(offsets, t)
            expected = OffsetPosition(offsets[i], positions[i]) if i >= 0 else OffsetPosition(0, 0)
            assert idx.lookup(t) == expected
            j = bisect.bisect_left(positions, t)
            expected_ub = OffsetPosition(offsets[j], positions[j]) if j < len(positions) else None
            assert idx.fetch_upper_bound_offset(0, t) == expected_ub
        idx.truncate_to(truncate_at)
        kept = [o for o in offsets if o < truncate_at]
        assert [idx.entry(i).offset for i in range(idx.entries)] == kept
        idx.close()
        assert os.path.getsize(Path(d) / "p.index") == 8 * len(kept)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 3)), max_size=150),
    targets=st.lists(st.integers(-5, 200_000), max_size=40),
)
def test_time_index_lookup_matches_sorted_list_model(steps, targets):
    # Strictly increasing timestamps with non-decreasing offsets.
    entries, ts, off = [], 0, 0
    for dts, doff in steps:
        ts += dts
        off += doff
        entries.append((ts, off))
    with tempfile.TemporaryDirectory() as d:
        idx = TimeIndex(Path(d) / "p.timeindex", 0, 12 * (len(entries) + 2))
        for t, o in entries:
            idx.maybe_append(t, o)
        assert idx.entries == len(entries)
        keys = [t for t, _ in entries]
        for target in targets:
            i = _model_lookup(keys, target)
            expected = TimestampOffset(*entries[i]) if i >= 0 else TimestampOffset(-1, 0)
            assert idx.lookup(target) == expected


# ========================================================== TransactionIndex


TXNS = [
    AbortedTxn(0, 0, 10, 11),
    AbortedTxn(1, 5, 15, 13),
    AbortedTxn(2, 18, 35, 25),
    AbortedTxn(3, 32, 50, 40),
]


def test_transaction_index_file_is_created_on_first_append(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    assert not path.exists()
    assert idx.all_aborted_txns() == []
    assert idx.collect_aborted_txns(0, 100) == TxnIndexSearchResult([], False)
    idx.truncate_to(0)
    idx.reset()
    idx.flush()
    idx.sanity_check()
    assert not path.exists()
    idx.append(TXNS[0])
    assert path.exists()


def test_transaction_index_entry_layout_is_34_big_endian_bytes(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    idx.append(AbortedTxn(983493, 137, 299, 200))
    idx.append(AbortedTxn(-1, 300, 2**62, 301))
    idx.close()
    assert path.read_bytes() == (struct.pack(">hqqqq", 0, 983493, 137, 299, 200)
                                 + struct.pack(">hqqqq", 0, -1, 300, 2**62, 301))
    assert len(path.read_bytes()) == 68


def test_transaction_index_reopen_reads_entries_and_enforces_order(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    for txn in TXNS:
        idx.append(txn)
    idx.close()
    reopened = TransactionIndex(path, 0)
    assert reopened.all_aborted_txns() == TXNS
    assert reopened.last_offset == 50
    with pytest.raises(ValueError):
        reopened.append(AbortedTxn(9, 40, 50, 45))


def test_transaction_index_last_offset_must_increase(tmp_path):
    idx = TransactionIndex(tmp_path / "0.txnindex", 0)
    idx.append(AbortedTxn(1, 5, 15, 13))
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(0, 0, 15, 11))
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(0, 0, 10, 11))
    assert idx.all_aborted_txns() == [AbortedTxn(1, 5, 15, 13)]


def test_collect_aborted_txns_returns_overlapping_and_stops_at_lso(tmp_path):
    idx = TransactionIndex(tmp_path / "0.txnindex", 0)
    for txn in TXNS:
        idx.append(txn)
    assert idx.collect_aborted_txns(0, 100) == TxnIndexSearchResult(TXNS, False)
    assert idx.collect_aborted_txns(0, 32) == TxnIndexSearchResult(TXNS[:3], True)
    assert idx.collect_aborted_txns(0, 35) == TxnIndexSearchResult(TXNS, True)
    assert idx.collect_aborted_txns(10, 35) == TxnIndexSearchResult(TXNS, True)
    assert idx.collect_aborted_txns(11, 35) == TxnIndexSearchResult(TXNS[1:], True)
    assert idx.collect_aborted_txns(51, 100) == TxnIndexSearchResult([], False)


def test_transaction_index_truncate_to_removes_txns_ending_at_or_after_offset(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    for txn in TXNS:
        idx.append(txn)
    idx.truncate_to(51)
    assert idx.all_aborted_txns() == TXNS
    idx.truncate_to(35)
    assert idx.all_aborted_txns() == TXNS[:2]
    assert idx.last_offset == 15
    assert os.path.getsize(path) == 68
    idx.append(AbortedTxn(7, 20, 30, 21))  # order is checked against the kept entries
    assert idx.all_aborted_txns() == TXNS[:2] + [AbortedTxn(7, 20, 30, 21)]
    idx.truncate_to(0)
    assert idx.all_aborted_txns() == []
    assert idx.last_offset is None


def test_transaction_index_reset_empties_file(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    for txn in TXNS:
        idx.append(txn)
    idx.reset()
    assert path.read_bytes() == b""
    assert idx.all_aborted_txns() == []
    idx.append(AbortedTxn(1, 1, 2, 3))
    assert idx.all_aborted_txns() == [AbortedTxn(1, 1, 2, 3)]


def test_transaction_index_sanity_check_rejects_txn_before_start_offset(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    for txn in TXNS:
        idx.append(txn)
    idx.sanity_check()
    idx.close()
    with pytest.raises(CorruptIndexError):
        TransactionIndex(path, 100).sanity_check()


def test_transaction_index_rejects_unknown_entry_version(tmp_path):
    path = tmp_path / "0.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 1, 1, 2, 3, 4))
    with pytest.raises(CorruptIndexError):
        TransactionIndex(path, 0)


def test_transaction_index_ignores_torn_tail_and_overwrites_it(tmp_path):
    path = tmp_path / "0.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 1, 2, 3, 4) + b"\x00\x00\x07")
    idx = TransactionIndex(path, 0)
    assert idx.all_aborted_txns() == [AbortedTxn(1, 2, 3, 4)]
    idx.append(AbortedTxn(5, 6, 7, 8))
    assert path.read_bytes() == struct.pack(">hqqqq", 0, 1, 2, 3, 4) + struct.pack(">hqqqq", 0, 5, 6, 7, 8)


def test_transaction_index_rename_delete_and_reuse_after_close(tmp_path):
    path = tmp_path / "0.txnindex"
    idx = TransactionIndex(path, 0)
    new = tmp_path / "0.txnindex.deleted"
    idx.rename_to(new)  # nothing on disk yet: only the path changes
    assert idx.path == new and not new.exists()
    idx.append(TXNS[0])
    assert new.exists()
    idx.close()
    assert idx.all_aborted_txns() == [TXNS[0]]  # reopens on demand
    idx.flush()
    assert idx.delete() is True
    assert not new.exists()
    assert idx.delete() is False


def test_empty_transaction_index_is_searched_without_touching_its_file(tmp_path, monkeypatch):
    """A read-committed Fetch searches every segment's index; an empty one costs no syscall."""
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex", 0)

    def touched(*args, **kw):
        raise AssertionError("the file system was asked")
    with monkeypatch.context() as m:
        m.setattr(os, "fstat", touched)
        m.setattr(os, "stat", touched)
        result = idx.collect_aborted_txns(0, 100)
    assert result.aborted_transactions == [] and not result.is_complete
