"""Remote segment reads answer exactly as the local log does on the same segment.

Each remote segment is a sealed local segment served by ``LocalSegmentRSM`` (see
test_remote_index_cache.py), so every remote answer can be compared with the local one:
``UnifiedLog.read``, ``UnifiedLog.fetch_offset_by_timestamp``, ``LogSegment`` searches and
the local transaction index.
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.common.errors import CorruptRecordError
from strata.log.local_log import FetchDataInfo
from strata.protocol import records as rec
from strata.protocol.records import HEADER_SIZE, iter_headers
from strata.tiered.manager.remote_index_cache import RemoteIndexCache
from strata.tiered.manager.remote_log_reader import (
    DEFAULT_READ_SLACK_BYTES, collect_aborted_transactions, find_offset_by_timestamp,
    iter_batch_headers, read_remote_segment, search_aborted_transactions)
from test_remote_index_cache import T0, LocalSegmentRSM, build_log, sealed_segments


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """(log, rsm, index cache, [(local segment, remote metadata)]) over one built log."""
    path = tmp_path_factory.mktemp("remote-reader")
    ulog = build_log(path)
    rsm = LocalSegmentRSM()
    pairs = [(seg, rsm.add(seg)) for seg in sealed_segments(ulog)]
    cache = RemoteIndexCache(rsm, path / "cache", 10 << 20)
    yield ulog, rsm, cache, pairs
    cache.close()
    ulog.close()


def segment_of(pairs, offset):
    return next((seg, meta) for seg, meta in pairs
                if meta.start_offset <= offset <= meta.end_offset)


def read(remote, offset, max_bytes, min_one=True, slack=DEFAULT_READ_SLACK_BYTES):
    _, rsm, cache, pairs = remote
    _, meta = segment_of(pairs, offset)
    return read_remote_segment(rsm, cache, meta, offset, max_bytes, min_one, slack_bytes=slack)


# ---- records ---------------------------------------------------------------------------------

@pytest.mark.parametrize("max_bytes", [0, 1, 500, 4096, 1 << 20])
def test_reads_from_every_offset_equal_the_local_log(remote, max_bytes):
    ulog = remote[0]
    for offset in range(ulog.log_end_offset):
        got = read(remote, offset, max_bytes)
        assert got.records == ulog.read(offset, max_bytes).records, offset
        assert got.records


@settings(max_examples=300, deadline=None)
@given(data=st.data(), max_bytes=st.integers(0, 40_000), min_one=st.booleans(),
       slack=st.sampled_from([0, 1, 61, 700, DEFAULT_READ_SLACK_BYTES]))
def test_any_read_equals_the_local_log(remote, data, max_bytes, min_one, slack):
    ulog = remote[0]
    offset = data.draw(st.integers(0, ulog.log_end_offset - 1), label="offset")
    got = read(remote, offset, max_bytes, min_one, slack)
    local = ulog.read(offset, max_bytes, min_one_message=min_one)
    assert got.records == local.records
    headers = list(iter_headers(got.records))
    if headers:
        assert got.first_batch_offset == headers[0].base_offset <= offset <= headers[0].last_offset
        assert got.next_offset == headers[-1].next_offset
        assert got.position == local.fetch_offset_metadata.position
    else:
        assert got.next_offset == offset and not got.end_of_segment


def test_an_offset_inside_a_compressed_batch_returns_the_whole_batch(remote):
    _, _, _, pairs = remote
    seg, meta = pairs[0]
    batch = next(h for h in seg._headers_from(0) if h.compression and h.record_count > 3)
    for offset in range(batch.base_offset, batch.last_offset + 1):
        got = read(remote, offset, batch.size)
        assert got.records == seg.read_bytes(batch.position, batch.size)
        assert (got.first_batch_offset, got.next_offset) == (batch.base_offset, batch.next_offset)
        assert [r.offset for r in rec.iter_records(got.records)] == \
            list(range(batch.base_offset, batch.last_offset + 1))


def test_a_batch_larger_than_max_bytes_is_returned_whole_only_with_min_one_message(remote):
    _, rsm, cache, pairs = remote
    seg, meta = next((s, m) for s, m in pairs
                     if any(h.size > 10_000 for h in s._headers_from(0)))
    big = next(h for h in seg._headers_from(0) if h.size > 10_000)
    assert cache.lookup_offset(meta, big.base_offset) == big.position
    rsm.log_ranges.clear()
    got = read_remote_segment(rsm, cache, meta, big.base_offset, 100, True, slack_bytes=0)
    assert got.records == seg.read_bytes(big.position, big.size)
    # the first range holds the header; the read is extended by the rest of the batch only
    assert rsm.log_ranges == [(big.position, big.position + 99),
                              (big.position + 100, big.position + big.size - 1)]
    empty = read_remote_segment(rsm, cache, meta, big.base_offset, 100, False, slack_bytes=0)
    assert empty.records == b"" and not empty.end_of_segment and empty.position == big.position


def test_an_offset_past_the_segment_end_returns_nothing(remote):
    _, rsm, cache, pairs = remote
    for _, meta in pairs:
        got = read_remote_segment(rsm, cache, meta, meta.end_offset + 1, 1 << 20)
        assert got.records == b"" and got.end_of_segment
        assert got.next_offset == meta.end_offset + 1


def test_a_small_read_of_a_large_segment_fetches_little_more_than_it_returns(remote):
    _, rsm, cache, pairs = remote
    seg, meta = max(pairs, key=lambda p: p[0].offset_index.entries)
    offset = (meta.start_offset + meta.end_offset) // 2
    indexed = cache.lookup_offset(meta, offset)
    rsm.log_ranges.clear()
    got = read_remote_segment(rsm, cache, meta, offset, 300, slack_bytes=200)
    assert got.records and got.position >= indexed
    assert rsm.log_ranges == [(indexed, indexed + 300 + 200 - 1)]
    assert indexed + 500 < seg.size


def test_to_fetch_data_info_locates_the_read(remote):
    got = read(remote, 5, 1000)
    info = got.to_fetch_data_info([])
    assert isinstance(info, FetchDataInfo)
    assert info.records == got.records and info.aborted_transactions == []
    where = info.fetch_offset_metadata
    assert (where.offset, where.segment_base_offset, where.position) == (5, 0, got.position)


def test_headers_only_walk_lists_every_batch(remote):
    _, rsm, _, pairs = remote
    for seg, meta in pairs:
        assert list(iter_batch_headers(rsm, meta)) == list(seg._headers_from(0))


# ---- corrupt remote data ---------------------------------------------------------------------

def corrupted(remote, transform, *, shrink_size: bool = False):
    """A copy of the first segment's metadata whose remote bytes are ``transform(bytes)``."""
    _, rsm, _, pairs = remote
    seg, _ = pairs[0]
    meta = rsm.add(seg)
    data = transform(seg.log_path.read_bytes())
    if shrink_size:
        meta = dataclasses.replace(meta, segment_size_in_bytes=len(data))
    rsm.override_log(meta, data)
    return seg, meta


@pytest.mark.parametrize("shrink_size", [False, True])
def test_a_truncated_last_batch_raises_rather_than_returning_part_of_it(remote, shrink_size):
    _, rsm, cache, _ = remote
    seg, meta = corrupted(remote, lambda b: b[:-10], shrink_size=shrink_size)
    last = list(seg._headers_from(0))[-1]
    with pytest.raises(CorruptRecordError):
        read_remote_segment(rsm, cache, meta, last.base_offset, 1 << 20)
    with pytest.raises(CorruptRecordError):  # a read running into the truncated tail
        read_remote_segment(rsm, cache, meta, meta.start_offset, 1 << 20)
    with pytest.raises(CorruptRecordError):
        list(iter_batch_headers(rsm, meta))
    with pytest.raises(CorruptRecordError):  # a timestamp lookup that reads the truncated batch
        find_offset_by_timestamp(rsm, cache, meta, last.max_timestamp, last.base_offset)
    first = next(seg._headers_from(0))  # a read that stops before the tail is fine
    assert read_remote_segment(rsm, cache, meta, meta.start_offset, first.size).records == \
        seg.read_bytes(0, first.size)


def test_a_truncated_batch_header_raises(remote):
    _, rsm, cache, _ = remote
    seg, meta = corrupted(remote, lambda b: b + b"\0" * (HEADER_SIZE - 20), shrink_size=True)
    with pytest.raises(CorruptRecordError):
        read_remote_segment(rsm, cache, meta, meta.end_offset + 1, 1 << 20)


def test_a_bad_batch_length_raises(remote):
    _, rsm, cache, _ = remote
    headers = []

    def break_second_batch(data: bytes) -> bytes:
        second = list(iter_headers(data))[1]
        headers.append(second)
        out = bytearray(data)
        struct.pack_into(">i", out, second.position + 8, 3)
        return bytes(out)

    seg, meta = corrupted(remote, break_second_batch)
    with pytest.raises(CorruptRecordError):
        read_remote_segment(rsm, cache, meta, headers[0].base_offset, 1 << 20)
    with pytest.raises(CorruptRecordError):
        read_remote_segment(rsm, cache, meta, meta.start_offset, 1 << 20)


# ---- timestamps ------------------------------------------------------------------------------

def test_timestamp_searches_equal_the_local_log(remote):
    ulog, rsm, cache, pairs = remote
    last = max(meta.max_timestamp_ms for _, meta in pairs)
    for ts in range(T0 - 3000, last + 3000, 97):
        remote_answer = None
        for _, meta in pairs:
            if meta.max_timestamp_ms >= ts:
                remote_answer = find_offset_by_timestamp(rsm, cache, meta, ts, 0)
                if remote_answer is not None:
                    break
        assert remote_answer == ulog.fetch_offset_by_timestamp(ts), ts


def test_timestamp_searches_from_a_start_offset_equal_the_local_segment(remote):
    _, rsm, cache, pairs = remote
    for seg, meta in pairs:
        for ts in range(T0 - 2000, meta.max_timestamp_ms + 2000, 331):
            for start in range(meta.start_offset, meta.end_offset + 2, 7):
                assert find_offset_by_timestamp(rsm, cache, meta, ts, start) == \
                    seg.find_offset_by_timestamp(ts, start), (ts, start)


def test_timestamp_answers_carry_the_batch_leader_epoch(remote):
    ulog, rsm, cache, pairs = remote
    epochs = set()
    for seg, meta in pairs:
        found = find_offset_by_timestamp(rsm, cache, meta, meta.max_timestamp_ms, 0)
        assert found is not None
        assert found.leader_epoch == ulog.leader_epoch_cache.epoch_for_offset(found.offset)
        epochs.add(found.leader_epoch)
    assert len(epochs) > 1


# ---- aborted transactions --------------------------------------------------------------------

def test_aborted_transactions_equal_the_local_transaction_index(remote):
    _, rsm, cache, pairs = remote
    assert any(seg.txn_index.all_aborted_txns() for seg, _ in pairs)
    for seg, meta in pairs:
        for start in range(meta.start_offset - 20, meta.end_offset + 5, 3):
            for upper in (start + 1, start + 15, meta.end_offset + 1, meta.end_offset + 500):
                local = seg.txn_index.collect_aborted_txns(start, upper)
                assert collect_aborted_transactions(rsm, cache, meta, start, upper) == \
                    local.aborted_transactions
                assert search_aborted_transactions(cache, meta, start, upper) == local
