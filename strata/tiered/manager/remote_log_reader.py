"""Reads from remote log segments: records, timestamp searches, aborted transactions.

Stateless functions that block on the RemoteStorageManager; the remote log manager runs them
on its reader thread pool (Kafka's ``RemoteLogManager.read``, ``lookupTimestamp`` and
``collectAbortedTransactions``). Each starts from the position the RemoteIndexCache gives
and streams the segment in bounded byte ranges, so a small read of a large segment fetches
little more than it returns. Data is handed out in whole batches only: a truncated or
malformed batch header in remote data raises ``CorruptRecordError``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from strata.common.errors import CorruptRecordError
from strata.log.indexes import AbortedTxn, TxnIndexSearchResult
from strata.log.local_log import FetchDataInfo, LogOffsetMetadata
from strata.log.segment import (
    MIN_BATCH_LENGTH, TimestampAndOffset, batch_may_hold_timestamp, find_offset_in_batch)
from strata.protocol.records import (
    BASE_OFFSET_LENGTH, CURRENT_MAGIC, HEADER_SIZE, LOG_OVERHEAD, MAGIC_OFFSET, BatchHeader,
    read_header)
from strata.tiered.api import RemoteLogSegmentMetadata, RemoteStorageManager
from strata.tiered.manager.remote_index_cache import RemoteIndexCache, kafka_uuid_str

__all__ = [
    "DEFAULT_READ_SLACK_BYTES",
    "RemoteReadResult",
    "collect_aborted_transactions",
    "find_offset_by_timestamp",
    "iter_batch_headers",
    "read_remote_segment",
    "search_aborted_transactions",
]

# Bytes fetched beyond max_bytes on the first range of a read: room for the batches between
# the offset index entry and the fetch offset (about index.interval.bytes, 4 KiB by default).
DEFAULT_READ_SLACK_BYTES = 64 * 1024
# Scans of unknown length (timestamp search, header walks) start with this range and double
# it up to the maximum.
_SCAN_WINDOW_BYTES = 64 * 1024
_MAX_SCAN_WINDOW_BYTES = 8 * 1024 * 1024
_DISCARD_CHUNK = 1024 * 1024


class RemoteReadResult(NamedTuple):
    """Whole batches read from one remote segment.

    ``records`` starts with the batch holding ``fetch_offset`` (that batch may begin
    before it) and is empty when that batch alone exceeds ``max_bytes`` without
    ``min_one_message``, or when ``end_of_segment``: no batch in the segment reaches
    ``fetch_offset``. ``position`` is the segment byte position of that batch (-1 when none).
    ``records`` is often a read-only view of a cached chunk, not a copy.
    """

    records: bytes | memoryview
    fetch_offset: int
    first_batch_offset: int     # base offset of the first batch returned, -1 if none
    next_offset: int            # offset after the last batch returned, fetch_offset if none
    position: int
    segment_start_offset: int
    end_of_segment: bool = False

    def to_fetch_data_info(self,
                           aborted_transactions: list[AbortedTxn] | None = None) -> FetchDataInfo:
        """This read as the local log reports one (``LogOffsetMetadata`` in this segment)."""
        if self.position >= 0:
            meta = LogOffsetMetadata(self.fetch_offset, self.segment_start_offset, self.position)
        else:
            meta = LogOffsetMetadata(self.fetch_offset)
        return FetchDataInfo(meta, self.records, False, aborted_transactions)


class _SegmentStream:
    """Sequential reads of a remote segment from a byte position.

    Bytes are fetched with ``fetch_log_segment`` in ranges of at least ``window`` bytes
    (doubling up to ``max_window`` at each new range), never past the segment's size from
    its metadata. Not thread-safe; close it (or use it as a context manager).
    """

    def __init__(self, rsm: RemoteStorageManager, meta: RemoteLogSegmentMetadata, position: int,
                 window: int, max_window: int | None = None):
        self._rsm = rsm
        self._meta = meta
        self.position = position
        self._window = max(1, window)
        self._max_window = max(self._window, max_window or 0)
        self._size = meta.segment_size_in_bytes if meta.segment_size_in_bytes > 0 else None
        self._stream: BinaryIO | None = None
        self._range_end = position      # exclusive end of the open range
        self._at_end = False            # a range ended early: the segment ends there

    def __enter__(self) -> _SegmentStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _open(self, want: int) -> bool:
        self.close()
        if self._at_end or (self._size is not None and self.position >= self._size):
            return False
        end = self.position + max(want, self._window)
        if self._size is not None:
            end = min(end, self._size)
        self._stream = self._rsm.fetch_log_segment(self._meta, self.position, end - 1)
        self._range_end = end
        self._window = min(self._window * 2, self._max_window)
        return True

    def readinto(self, view: memoryview) -> int:
        """Fill ``view``; fewer bytes (the count returned) when the segment ends first."""
        done, n = 0, len(view)
        while done < n:
            if (self._stream is None or self.position >= self._range_end) and \
                    not self._open(n - done):
                break
            got = self._stream.readinto(view[done:done + min(n - done,
                                                             self._range_end - self.position)])
            if not got:
                self._at_end = True
                self.close()
                break
            self.position += got
            done += got
        return done

    def view(self, start: int, n: int) -> memoryview | None:
        """Segment bytes ``[start, start + n)`` without a copy when the open range's loaded
        chunk holds them all, else None."""
        raw = getattr(self._stream, "raw", self._stream)    # under an io.BufferedReader
        view = getattr(raw, "view", None)
        return view(start, n) if view is not None else None

    def read(self, n: int) -> bytearray:
        """``n`` bytes, or fewer when the segment ends first."""
        buf = bytearray(n)
        got = self.readinto(memoryview(buf))
        return buf if got == n else buf[:got]

    def skip(self, n: int) -> bool:
        """Move ``n`` bytes forward: seek (or read) through an open range, jump otherwise.
        False when the segment ends before."""
        if self._stream is not None and self.position + n <= self._range_end:
            if n and self._stream.seekable():
                # a seek never fails past a short object's end: its last byte must be there
                self._stream.seek(n - 1, io.SEEK_CUR)
                if not self._stream.read(1):
                    return False
                self.position += n
                return True
            scratch = memoryview(bytearray(min(n, _DISCARD_CHUNK)))
            while n > 0:
                got = self.readinto(scratch[:min(n, len(scratch))])
                if got == 0:
                    return False
                n -= got
            return True
        self.close()
        self.position += n
        return self._size is None or self.position <= self._size


def _corrupt(meta: RemoteLogSegmentMetadata, position: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{what} at byte {position} of remote segment "
        f"{kafka_uuid_str(meta.remote_log_segment_id.id)} ({meta.topic_id_partition}, "
        f"offsets {meta.start_offset}..{meta.end_offset})")


def _check_header(meta: RemoteLogSegmentMetadata, buf, offset: int, position: int) -> BatchHeader:
    """The header at ``buf[offset:]``, which lies at segment byte ``position``."""
    header = read_header(buf, offset)._replace(position=position)
    if header.batch_length < MIN_BATCH_LENGTH:
        raise _corrupt(meta, position, f"batch length {header.batch_length} below the minimum")
    if header.magic != CURRENT_MAGIC:
        raise _corrupt(meta, position, f"unsupported magic {header.magic}")
    return header


def _next_header(stream: _SegmentStream,
                 meta: RemoteLogSegmentMetadata) -> tuple[BatchHeader, bytearray] | None:
    """The next batch header and its bytes, or None at the end of the segment."""
    position = stream.position
    head = stream.read(HEADER_SIZE)
    if not head:
        return None
    if len(head) < HEADER_SIZE:
        raise _corrupt(meta, position, f"truncated batch header ({len(head)} bytes)")
    return _check_header(meta, head, 0, position), head


def _skip_batch(stream: _SegmentStream, meta: RemoteLogSegmentMetadata,
                header: BatchHeader) -> None:
    if not stream.skip(header.size - HEADER_SIZE):
        raise _corrupt(meta, header.position, f"truncated batch ({header.size} bytes expected)")


def _read_batch(stream: _SegmentStream, meta: RemoteLogSegmentMetadata, header: BatchHeader,
                head: bytearray) -> bytearray:
    """The whole batch ``head`` begins, read into one buffer after it."""
    batch = bytearray(header.size)
    batch[:HEADER_SIZE] = head
    if stream.readinto(memoryview(batch)[HEADER_SIZE:]) < header.size - HEADER_SIZE:
        raise _corrupt(meta, header.position, f"truncated batch ({header.size} bytes expected)")
    return batch


def read_remote_segment(rsm: RemoteStorageManager, index_cache: RemoteIndexCache,
                        meta: RemoteLogSegmentMetadata, fetch_offset: int, max_bytes: int,
                        min_one_message: bool = True, *,
                        slack_bytes: int = DEFAULT_READ_SLACK_BYTES,
                        upto: int | None = None) -> RemoteReadResult:
    """Whole batches of one remote segment from the batch holding ``fetch_offset``.

    At most ``max_bytes``, except that with ``min_one_message`` the first batch is returned
    whole however large (KIP-74). The first range fetched ends ``slack_bytes`` past
    ``max_bytes`` from the indexed position; more is fetched only when needed. ``upto``: no
    batch starting at or after it (where the segment's records stop being the log's,
    ``lineage.lineage_end``); a read that reaches it is ``end_of_segment``.
    """
    upto = meta.end_offset + 1 if upto is None else upto
    position = index_cache.lookup_offset(meta, fetch_offset)
    nothing = RemoteReadResult(b"", fetch_offset, -1, fetch_offset, -1, meta.start_offset)
    with _SegmentStream(rsm, meta, position, max(max_bytes, 0) + slack_bytes) as stream:
        while True:
            found = _next_header(stream, meta)
            if found is None:
                return nothing._replace(end_of_segment=True)
            first, head = found
            if first.base_offset >= upto:
                return nothing._replace(end_of_segment=True)
            if first.last_offset >= fetch_offset:
                break
            _skip_batch(stream, meta, first)
        limit = max(max_bytes, first.size) if min_one_message else max_bytes
        if first.size > limit:
            return nothing._replace(position=first.position)
        room = meta.segment_size_in_bytes - first.position
        want = min(limit, room) if room >= first.size else limit
        # a view of the loaded chunk when it holds the range, else one copy out of the chunks
        data = stream.view(first.position, want)
        if data is None:
            buf = bytearray(want)
            buf[:HEADER_SIZE] = head
            data = memoryview(buf)[:HEADER_SIZE + stream.readinto(memoryview(buf)[HEADER_SIZE:])]
    if len(data) < first.size:
        raise _corrupt(meta, first.position, f"truncated batch ({first.size} bytes expected)")
    # Whole batches within the limit; a partial batch is only allowed where the limit cut it.
    end, last_at, n = 0, 0, len(data)
    unpack = BASE_OFFSET_LENGTH.unpack_from
    cut = False
    while end + HEADER_SIZE <= n:
        base, size = unpack(data, end)
        size += LOG_OVERHEAD
        if end and base >= upto:
            cut = True
            break
        if size < HEADER_SIZE or data[end + MAGIC_OFFSET] != CURRENT_MAGIC:
            _check_header(meta, data, end, first.position + end)     # raises, naming the fault
        if end + size > n:
            break
        last_at, end = end, end + size
    if n < limit and end < n and not cut:
        raise _corrupt(meta, first.position + end, "truncated batch at the end of the segment")
    last = read_header(data, last_at)
    return RemoteReadResult(data[:end], fetch_offset, first.base_offset, last.next_offset,
                            first.position, meta.start_offset)


def find_offset_by_timestamp(rsm: RemoteStorageManager, index_cache: RemoteIndexCache,
                             meta: RemoteLogSegmentMetadata, timestamp: int,
                             start_offset: int) -> TimestampAndOffset | None:
    """The first record of the segment with timestamp >= ``timestamp`` and offset >=
    ``start_offset``, with its batch's leader epoch; None when there is none.

    The same answer as the local ``LogSegment.find_offset_by_timestamp`` on the same segment.
    """
    position = index_cache.lookup_timestamp(meta, timestamp, start_offset)
    with _SegmentStream(rsm, meta, position, _SCAN_WINDOW_BYTES, _MAX_SCAN_WINDOW_BYTES) as stream:
        while (found := _next_header(stream, meta)) is not None:
            header, head = found
            if not batch_may_hold_timestamp(header, timestamp, start_offset):
                _skip_batch(stream, meta, header)
                continue
            batch = _read_batch(stream, meta, header, head)
            hit = find_offset_in_batch(batch, read_header(batch, 0), timestamp, start_offset)
            if hit is not None:
                return hit
    return None


def search_aborted_transactions(index_cache: RemoteIndexCache, meta: RemoteLogSegmentMetadata,
                                start_offset: int, upper_offset: int) -> TxnIndexSearchResult:
    """The segment's aborted transactions overlapping ``[start_offset, upper_offset)``;
    ``is_complete`` says whether later segments can hold more."""
    if meta.txn_idx_empty:
        return TxnIndexSearchResult([], False)
    with index_cache.pinned_entry(meta) as entry:
        return entry.collect_aborted_txns(start_offset, upper_offset)


def collect_aborted_transactions(rsm: RemoteStorageManager, index_cache: RemoteIndexCache,
                                 meta: RemoteLogSegmentMetadata, start_offset: int,
                                 upper_offset: int) -> list[AbortedTxn]:
    """The segment's aborted transactions overlapping ``[start_offset, upper_offset)``, from
    its cached transaction index (read_committed fetches). ``rsm`` is unused: the index
    cache fetches the index; it keeps the reader functions' common signature."""
    return search_aborted_transactions(index_cache, meta, start_offset,
                                       upper_offset).aborted_transactions


def iter_batch_headers(rsm: RemoteStorageManager, meta: RemoteLogSegmentMetadata,
                       position: int = 0) -> Iterator[BatchHeader]:
    """Headers of the segment's batches from byte ``position`` (positions are segment
    positions); bodies are skipped. Raises ``CorruptRecordError`` on a truncated batch."""
    with _SegmentStream(rsm, meta, position, _SCAN_WINDOW_BYTES, _MAX_SCAN_WINDOW_BYTES) as stream:
        while (found := _next_header(stream, meta)) is not None:
            header = found[0]
            yield header
            _skip_batch(stream, meta, header)

