"""LogSegment: one slice of a partition's log and its indexes, as Kafka lays them out on disk.

Files, named by the 20-digit base offset: ``.log`` (RecordBatch v2, concatenated), ``.index``
(sparse offset index), ``.timeindex`` (sparse time index), ``.txnindex`` (aborted transactions,
only when there are any). An index entry is added for a batch when more than
``index.interval.bytes`` were appended since the last entry; the offset index entry is
(batch last offset, batch position), so a lookup lands on a batch at or before the target.

Not thread-safe: the owning log serialises every call under its lock.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import NamedTuple

from strata.common.clock import Clock
from strata.common.errors import CorruptRecordError
from strata.log.indexes import (
    AbortedTxn, IndexOffsetOverflowError, OffsetIndex, TimeIndex, TransactionIndex)
from strata.protocol import records as rec
from strata.protocol.file_region import FileRegion, whole_batches_cut
from strata.protocol.records import HEADER, HEADER_SIZE, LOG_OVERHEAD, BatchHeader

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
SNAPSHOT_SUFFIX = ".snapshot"
INT32_MAX = 2**31 - 1
_SCAN_BLOCK = 16 * 1024
RECOVERY_READ_BLOCK = 8 * 1024 * 1024
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_READ_HINTS = 16   # where recent reads ended, per segment: one for each sequential reader


try:
    _IOV_MAX = os.sysconf("SC_IOV_MAX")
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024


def _pwrite_parts(fd: int, parts: list, position: int) -> int:
    """Write ``parts`` in order from ``position``; the bytes written (short only on a full disk)."""
    written = 0
    for i in range(0, len(parts), _IOV_MAX):
        chunk = parts[i:i + _IOV_MAX]
        n = os.pwritev(fd, chunk, position + written)
        written += n
        if n != sum(map(len, chunk)):
            break
    return written


def file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def offset_from_file_name(name: str) -> int:
    return int(name.split(".", 1)[0])


class LogOffsetPosition(NamedTuple):
    """The batch holding an offset: its base offset, byte position and size."""

    offset: int
    position: int
    size: int


class TimestampAndOffset(NamedTuple):
    timestamp: int
    offset: int
    leader_epoch: int | None = None


class SegmentRead(NamedTuple):
    """Whole batches read from one segment, starting at ``position``; ``upper_offset`` is the
    first indexed offset at or past their end (None when no index entry lies there): an offset
    past them all, found without reading them (Kafka's ``fetchUpperBoundOffset``)."""

    data: bytes | FileRegion
    position: int
    upper_offset: int | None = None


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, *, index_interval_bytes: int,
                 max_index_size: int, roll_jitter_ms: int, clock: Clock,
                 file_suffix: str = "", readonly: bool = False):
        self.directory = Path(directory)
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self.roll_jitter_ms = roll_jitter_ms
        self._clock = clock
        self._suffix = file_suffix
        path = self.directory / file_name(base_offset, LOG_SUFFIX + file_suffix)
        flags = os.O_RDONLY if readonly else os.O_RDWR | os.O_CREAT
        self._fd = os.open(path, flags, 0o644)
        self._readonly = readonly
        self.log_path = path
        self._size = os.fstat(self._fd).st_size
        self.offset_index = OffsetIndex(self._path(INDEX_SUFFIX), base_offset,
                                        max_index_size=max_index_size, writable=not readonly)
        self.time_index = TimeIndex(self._path(TIME_INDEX_SUFFIX), base_offset,
                                    max_index_size=max_index_size, writable=not readonly)
        self.txn_index = TransactionIndex(self._path(TXN_INDEX_SUFFIX), base_offset)
        # Bytes appended since the batch of the last index entry: what decides the next entry,
        # so a reopened segment keeps indexing exactly where recovery would.
        self._bytes_since_last_index_entry = self._size - (
            self.offset_index.entry(self.offset_index.entries - 1).position
            if self.offset_index.entries else 0)
        # Greatest batch max timestamp seen and the last offset of its batch.
        last = self.time_index.last_entry
        self.max_timestamp_so_far = last.timestamp
        self.offset_of_max_timestamp_so_far = last.offset
        self._rolling_based_timestamp: int | None = None
        self.created_ms = clock.milliseconds()
        self._dirty = False
        # Base offset -> (position, size) of the batch where a recent read stopped: the next
        # Fetch of a sequential reader starts there, and needs no index search or header read.
        self._read_hints: dict[int, tuple[int, int]] = {}

    def _path(self, suffix: str) -> Path:
        return self.directory / file_name(self.base_offset, suffix + self._suffix)

    # ---- size and offsets -------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def read_next_offset(self) -> int:
        """The offset after the last batch in the segment (base offset when empty)."""
        last_indexed = self.offset_index.lookup(2**63 - 1) if self.offset_index.entries else None
        start = last_indexed.position if last_indexed else 0
        next_offset = self.base_offset
        for header in self._headers_from(start):
            next_offset = header.next_offset
        return next_offset

    @property
    def largest_timestamp(self) -> int:
        """Max batch timestamp in the segment; the file's mtime when the segment has none."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return os.stat(self.log_path).st_mtime_ns // 1_000_000

    # ---- append -----------------------------------------------------------------------------

    def append(self, largest_offset: int, largest_timestamp: int,
               shallow_offset_of_max_timestamp: int, data, headers: list[BatchHeader]) -> None:
        """Append validated batches (``data`` is their bytes, offsets already assigned).

        ``headers`` carry positions relative to ``data``. As in Kafka 4.x (KAFKA-806) the index
        entries and the max timestamp are handled per batch: a batch that passes
        ``index.interval.bytes`` gets an offset index entry and a time index entry holding the
        max timestamp of the segment up to and including that batch.

        The roll check before an append only guarantees one free index slot, while one append
        may hold many batches: when an index fills up mid-append the remaining entries are
        skipped (the index is sparse, lookups scan forward from an earlier entry) and the next
        append's roll check rolls the segment. An append never fails on a full index, which
        would leave bytes in the log that the append reported as failed.

        ``data`` may also be a list of buffers, written in order with one ``pwritev`` (per
        ``IOV_MAX`` of them).

        ``largest_timestamp`` seeds the time-based roll of an empty segment;
        ``shallow_offset_of_max_timestamp`` is kept for callers (the per-batch headers decide).
        """
        parts = data if isinstance(data, list) else [data]
        size = sum(map(len, parts))
        if not size:
            return
        if not self.can_convert_to_relative_offset(largest_offset):
            raise IndexOffsetOverflowError(
                f"offset {largest_offset} out of range for segment {self.base_offset}")
        position = self._size
        if position == 0:
            self._rolling_based_timestamp = largest_timestamp
        if self._bytes_since_last_index_entry + size > self.index_interval_bytes:
            self._reserve_index_entries(len(headers))   # a full disk fails here, unwritten
        written = _pwrite_parts(self._fd, parts, position)
        if written != size:  # a regular file is written short only when it is full
            raise OSError(errno.ENOSPC, f"short write to {self.log_path}: {written} of "
                          f"{size} bytes")
        self._size += written
        self._dirty = True
        interval = self.index_interval_bytes
        since = self._bytes_since_last_index_entry
        for h in headers:
            if h.max_timestamp > self.max_timestamp_so_far:
                self.max_timestamp_so_far = h.max_timestamp
                self.offset_of_max_timestamp_so_far = h.last_offset
            if since > interval and self._indexes_have_room():
                self.offset_index.append(h.last_offset, position + h.position)
                self.time_index.maybe_append(self.max_timestamp_so_far,
                                             self.offset_of_max_timestamp_so_far)
                since = 0
            since += h.batch_length + LOG_OVERHEAD
        self._bytes_since_last_index_entry = since

    def _reserve_index_entries(self, n: int) -> None:
        """Allocate room for ``n`` more entries in both indexes, and for the time index's
        final entry (see ``AbstractIndex.reserve``)."""
        self.offset_index.reserve(n)
        self.time_index.reserve(n + 1)

    def _indexes_have_room(self) -> bool:
        """Whether a sparse index entry can be added now (by append and, alike, recovery).

        Entries go into both indexes or neither, so they stay paired; the time index keeps one
        slot back for the final entry written on roll and close (see ``TimeIndex.is_full``).
        """
        return not self.offset_index.is_full() and not self.time_index.is_full()

    def update_txn_index(self, aborted: AbortedTxn) -> None:
        self.txn_index.append(aborted)

    # ---- reads ------------------------------------------------------------------------------

    def _headers_from(self, position: int, end: int | None = None):
        """Batch headers from ``position`` to ``end`` (default: the segment size), reading in blocks."""
        end = self._size if end is None else min(end, self._size)
        fd = self._fd
        while position + HEADER_SIZE <= end:
            block = os.pread(fd, min(_SCAN_BLOCK, end - position), position)
            off = 0
            n = len(block)
            if n < HEADER_SIZE:
                return
            while off + HEADER_SIZE <= n:
                fields = HEADER.unpack_from(block, off)
                size = fields[1] + LOG_OVERHEAD
                if fields[1] < MIN_BATCH_LENGTH or position + off + size > end:
                    return
                yield BatchHeader(*fields, position + off)
                off += size
            position += off

    def translate_offset(self, offset: int, starting_position: int = 0) -> LogOffsetPosition | None:
        """The first batch at or after ``starting_position`` whose last offset is >= ``offset``."""
        entry = self.offset_index.lookup(offset)
        start = max(entry.position, starting_position)
        for h in self._headers_from(start):
            if h.last_offset >= offset:
                return LogOffsetPosition(h.base_offset, h.position, h.size)
        return None

    def read(self, start_offset: int, max_size: int, max_position: int | None = None,
             min_one_message: bool = True, as_region: bool = False) -> SegmentRead | None:
        """Whole batches from the one holding ``start_offset``, at most ``max_size`` bytes.

        With ``min_one_message`` the first batch is returned whole even when larger (KIP-74).
        ``max_position`` (exclusive) bounds the read, e.g. at the high watermark.
        ``as_region`` gives the same bytes as a ``FileRegion`` of this file (for sendfile).
        None when the offset is beyond this segment.
        """
        hint = self._read_hints.get(start_offset)
        found = LogOffsetPosition(start_offset, *hint) if hint else self.translate_offset(start_offset)
        if found is None:
            return None
        position = found.position
        limit = self._size if max_position is None else min(max_position, self._size)
        if position >= limit:
            return SegmentRead(b"", position)
        budget = min(limit - position, max(max_size, found.size if min_one_message else 0))
        if budget <= 0:
            return SegmentRead(b"", position)
        below, above = self.offset_index.bracket(position + budget)
        if as_region:
            start = below.position - position if below is not None and below.position > position else 0
            data, cut = FileRegion.of_whole_batches(self._fd, position, budget, start)
        else:
            raw = os.pread(self._fd, budget, position)
            cut = whole_batches_cut(lambda pos, size: raw, len(raw), len(raw))
            data = raw if cut.length == len(raw) else raw[:cut.length]
        end = position + cut.length
        if cut.next_offset >= 0:
            hints = self._read_hints
            if len(hints) >= _READ_HINTS:
                hints.clear()   # atomic, unlike evicting one: readers on other threads share it
            hints[cut.next_offset] = (end, cut.next_size)
        upper = below if below is not None and below.position == end else above
        return SegmentRead(data, position, upper.offset if upper is not None else None)

    def read_bytes(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> TimestampAndOffset | None:
        """First record with timestamp >= ``timestamp`` and offset >= ``starting_offset``."""
        ts_entry = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(ts_entry.offset, starting_offset)).position
        for h in self._headers_from(position):
            if batch_may_hold_timestamp(h, timestamp, starting_offset):
                batch = self.read_bytes(h.position, h.size)
                found = find_offset_in_batch(batch, rec.read_header(batch, 0), timestamp,
                                             starting_offset)
                if found is not None:
                    return found
        return None

    def max_timestamp_record(self) -> TimestampAndOffset | None:
        """The record holding the segment's greatest timestamp (first on ties)."""
        best: TimestampAndOffset | None = None
        start = self.offset_index.lookup(self.offset_of_max_timestamp_so_far).position \
            if self.max_timestamp_so_far >= 0 else 0
        for h in self._headers_from(start):
            if h.max_timestamp != self.max_timestamp_so_far:
                continue
            batch = self.read_bytes(h.position, h.size)
            for r in rec.decode_batch(batch, rec.read_header(batch, 0)):
                if best is None or r.timestamp > best.timestamp:
                    best = TimestampAndOffset(r.timestamp, r.offset, h.partition_leader_epoch)
            if best is not None and best.timestamp == self.max_timestamp_so_far:
                return best
        return best

    # ---- roll -------------------------------------------------------------------------------

    def should_roll(self, *, segment_bytes: int, segment_ms: int, messages_size: int,
                    max_timestamp_in_messages: int, max_offset_in_messages: int, now_ms: int) -> bool:
        reached_roll_ms = self._time_waited_for_roll(now_ms, max_timestamp_in_messages) > \
            segment_ms - self.roll_jitter_ms
        return (self._size > segment_bytes - messages_size
                or (self._size > 0 and reached_roll_ms)
                or self.offset_index.is_full() or self.time_index.is_full()
                or not self.can_convert_to_relative_offset(max_offset_in_messages))

    def _time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        if self._rolling_based_timestamp is None and self._size > 0:
            first = next(self._headers_from(0), None)
            self._rolling_based_timestamp = first.max_timestamp if first else None
        if self._rolling_based_timestamp is not None and self._rolling_based_timestamp >= 0:
            return message_timestamp - self._rolling_based_timestamp
        return now_ms - self.created_ms

    def on_become_inactive(self) -> None:
        """Seal the segment on roll: final time index entry, indexes trimmed to their entries."""
        self.time_index.reserve(1)
        self.time_index.maybe_append(self.max_timestamp_so_far,
                                     self.offset_of_max_timestamp_so_far, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        os.ftruncate(self._fd, self._size)

    # ---- recovery and truncation ------------------------------------------------------------

    def iter_batches(self, start: int = 0, end: int | None = None, *, strict: bool = False,
                     block_size: int = RECOVERY_READ_BLOCK):
        """Yield ``(header, block, block_start)`` for each complete batch from ``start``.

        The whole batch lies in ``block``; ``header.position`` is relative to the block. A torn
        tail ends the walk; a length below the minimum ends it too, or raises with ``strict``.
        """
        end = self._size if end is None else min(end, self._size)
        pos = start
        while pos + HEADER_SIZE <= end:
            block = os.pread(self._fd, min(block_size, end - pos), pos)
            n = len(block)
            off = 0
            while off + HEADER_SIZE <= n:
                h = rec.read_header(block, off)
                if h.batch_length < MIN_BATCH_LENGTH:
                    if strict:
                        raise CorruptRecordError(
                            f"batch length {h.batch_length} below minimum at {pos + off}")
                    return
                if off + h.size > n:
                    break
                yield h, block, pos
                off += h.size
            if off == 0:
                # the next batch is larger than a block (or torn): read it whole
                if n < HEADER_SIZE:
                    return
                size = rec.read_header(block, 0).size
                if pos + size > end:
                    return
                block = os.pread(self._fd, size, pos)
                yield rec.read_header(block, 0), block, pos
                off = size
            pos += off

    def recover(self, on_batch=None) -> int:
        """Rebuild the indexes from the log, truncating at the first invalid batch.

        Validates each batch (length, magic, CRC, offset range). ``on_batch(header, block)`` is
        called for every valid batch, for producer state and the leader epoch cache.
        Returns the number of bytes truncated.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.txn_index.reset()
        self.max_timestamp_so_far = -1
        self.offset_of_max_timestamp_so_far = -1
        valid = 0
        last_index_entry = 0
        try:
            for h, block, block_start in self.iter_batches(0, strict=True):
                position = block_start + h.position
                if h.magic != rec.CURRENT_MAGIC:
                    raise CorruptRecordError(f"unsupported magic {h.magic} at {position}")
                if not rec.batch_crc_ok(block, h):
                    raise CorruptRecordError(f"CRC mismatch in batch at {position}")
                if h.base_offset < self.base_offset or \
                        not self.can_convert_to_relative_offset(h.last_offset):
                    raise CorruptRecordError(f"batch offsets {h.base_offset}..{h.last_offset} "
                                             f"outside segment {self.base_offset}")
                if h.max_timestamp > self.max_timestamp_so_far:
                    self.max_timestamp_so_far = h.max_timestamp
                    self.offset_of_max_timestamp_so_far = h.last_offset
                if position - last_index_entry > self.index_interval_bytes and \
                        self._indexes_have_room():
                    self._reserve_index_entries(1)
                    self.offset_index.append(h.last_offset, position)
                    self.time_index.maybe_append(self.max_timestamp_so_far,
                                                 self.offset_of_max_timestamp_so_far)
                    last_index_entry = position
                if on_batch is not None:
                    on_batch(h, block)
                valid = position + h.size
        except CorruptRecordError as exc:
            log.warning("found invalid batch in %s at byte %d: %s", self.log_path, valid, exc)
        truncated = self._size - valid
        if truncated > 0:
            log.warning("truncating %s from %d to %d bytes", self.log_path, self._size, valid)
            self._truncate_file(valid)
        self._bytes_since_last_index_entry = valid - last_index_entry
        self.time_index.reserve(1)
        self.time_index.maybe_append(self.max_timestamp_so_far,
                                     self.offset_of_max_timestamp_so_far, skip_full_check=True)
        return truncated

    def _truncate_file(self, size: int) -> None:
        self._read_hints.clear()
        os.ftruncate(self._fd, size)
        self._size = size
        self._dirty = True

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or after ``offset``; returns the bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        removed = self._size - found.position
        self._truncate_file(found.position)
        self._load_largest_timestamp()
        if self._size == 0:
            self._rolling_based_timestamp = None
            self.created_ms = self._clock.milliseconds()
        self._bytes_since_last_index_entry = self._size - (
            self.offset_index.entry(self.offset_index.entries - 1).position
            if self.offset_index.entries else 0)
        return removed

    def _load_largest_timestamp(self) -> None:
        """Recompute the max timestamp (and its batch) from the time index and the log tail.

        Kafka's ``LogSegment.readLargestTimestamp``: start from the last time index entry
        ``(T, O)`` (T is the max timestamp up to offset O, reached first by O's batch) and scan
        the batches from the offset index position of O for a strictly larger timestamp. The
        scan must start at O's batch, not at the last offset index entry: batches between the
        two can hold a larger timestamp than T whose entry was truncated away (segments written
        before per-batch running max entries put a request's max at its first batch), and a
        scan starting after the first batch reaching the max would pick a later batch with the
        same timestamp (KIP-734 answers the first record holding the max timestamp).
        """
        last = self.time_index.last_entry
        self.max_timestamp_so_far = last.timestamp
        self.offset_of_max_timestamp_so_far = last.offset
        start = self.offset_index.lookup(last.offset).position
        for h in self._headers_from(start):
            if h.max_timestamp > self.max_timestamp_so_far:
                self.max_timestamp_so_far = h.max_timestamp
                self.offset_of_max_timestamp_so_far = h.last_offset

    def resize_indexes(self) -> None:
        """Re-grow the offset and time indexes to full size, for a segment that is active again."""
        self.offset_index.resize(self.max_index_size)
        self.time_index.resize(self.max_index_size)

    def sanity_check(self) -> None:
        """Raise ``CorruptIndexError`` when an index file is inconsistent (see indexes.py)."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()
        self.txn_index.sanity_check()

    # ---- durability and lifecycle -----------------------------------------------------------

    def flush(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        if self.max_timestamp_so_far >= 0 and self._fd >= 0 and not self._readonly:
            try:
                self.time_index.reserve(1)
                self.time_index.maybe_append(self.max_timestamp_so_far,
                                             self.offset_of_max_timestamp_so_far,
                                             skip_full_check=True)
            except Exception:  # noqa: BLE001 - closing must release the files regardless
                log.exception("could not append the final time index entry of %s", self.log_path)
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def files(self) -> list[Path]:
        return [self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path]

    def change_file_suffixes(self, old: str, new: str) -> None:
        """Rename every file of the segment, e.g. to ``.deleted`` before asynchronous removal."""
        def renamed(p: Path) -> Path:
            name = p.name[: -len(old)] if old and p.name.endswith(old) else p.name
            return p.with_name(name + new)
        new_log = renamed(self.log_path)
        os.rename(self.log_path, new_log)
        self.log_path = new_log
        self.offset_index.rename_to(renamed(self.offset_index.path))
        self.time_index.rename_to(renamed(self.time_index.path))
        self.txn_index.rename_to(renamed(self.txn_index.path))
        self._suffix = new

    def delete_files(self) -> None:
        self.close()
        for p in (self.log_path,):
            p.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self._size})"


def batch_may_hold_timestamp(header: BatchHeader, timestamp: int, starting_offset: int) -> bool:
    """Whether a batch can hold a record with timestamp >= ``timestamp`` and offset >=
    ``starting_offset`` (the header test of a timestamp search, before decoding)."""
    return header.max_timestamp >= timestamp and header.last_offset >= starting_offset


def find_offset_in_batch(buf, header: BatchHeader, timestamp: int,
                         starting_offset: int) -> TimestampAndOffset | None:
    """The first record of the batch at ``header.position`` in ``buf`` with timestamp >=
    ``timestamp`` and offset >= ``starting_offset``, with the batch's leader epoch.

    Shared by the local segment search and the remote segment reader, so both tiers answer
    ListOffsets alike (control records included, as Kafka's batch iterator does).
    """
    for r in rec.decode_batch(buf, header):
        if r.timestamp >= timestamp and r.offset >= starting_offset:
            return TimestampAndOffset(r.timestamp, r.offset, header.partition_leader_epoch)
    return None
