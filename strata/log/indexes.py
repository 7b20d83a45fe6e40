"""Kafka's per-segment index files: offset index, time index and transaction index.

All three are byte-compatible with Apache Kafka's ``.index``, ``.timeindex`` and ``.txnindex``
files (big-endian, fixed-size entries, offsets stored relative to the segment's base offset):

* ``.index``      8-byte entries  ``relativeOffset i32 | position i32``
* ``.timeindex``  12-byte entries ``timestamp i64 | relativeOffset i32``
* ``.txnindex``   34-byte entries ``version i16 | producerId i64 | firstOffset i64 |
  lastOffset i64 | lastStableOffset i64``

The offset and time indexes are memory-mapped and preallocated to ``max_index_size`` while the
segment is active; they are trimmed to their valid entries on roll and close, so a file that is
opened again has exactly ``length / entry_size`` entries. The preallocated file is sparse:
``reserve`` allocates its blocks ahead of the entries written through the map, because a
write to an unallocated page of a full file system kills the process (SIGBUS) where a
``write`` would fail with ENOSPC. The transaction index is an
append-only file that is only created when the first aborted transaction is appended.

The caller names the files (``%020d`` base offset plus suffix); this module receives paths.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "AbortedTxn",
    "AbstractIndex",
    "CorruptIndexError",
    "IndexClosedError",
    "IndexFullError",
    "IndexOffsetOverflowError",
    "InvalidOffsetError",
    "InvalidTimestampOrderError",
    "NO_TIMESTAMP",
    "OffsetIndex",
    "OffsetPosition",
    "TimeIndex",
    "TimestampOffset",
    "TransactionIndex",
    "TxnIndexSearchResult",
]

NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP
_INT32_MAX = 2**31 - 1

# Kafka keeps binary searches inside the last 8 KiB of an index ("warm" section) whenever the target
# lies there, so in-sync lookups touch the same few pages. Results are identical to a plain search.
_WARM_SECTION_BYTES = 8192
_RESERVE_BYTES = 16384      # blocks allocated ahead of an index's entries at a time


class CorruptIndexError(Exception):
    """An index file failed its sanity check (Kafka's CorruptIndexException)."""


class IndexOffsetOverflowError(Exception):
    """``offset - base_offset`` does not fit in the index's 32-bit relative offset."""


class InvalidOffsetError(ValueError):
    """An appended offset is not larger than the last offset in the index."""


class InvalidTimestampOrderError(ValueError):
    """A time index append with a timestamp smaller than the last indexed timestamp."""


class IndexFullError(ValueError):
    """An append to an index that has no free slot left."""


class IndexClosedError(ValueError):
    """An operation on an index whose memory map was released by close() or delete()."""


class OffsetPosition(NamedTuple):
    """An offset index entry: absolute offset and byte position in the segment's log file."""

    offset: int
    position: int


class TimestampOffset(NamedTuple):
    """A time index entry: the largest timestamp seen up to (and including) ``offset``."""

    timestamp: int
    offset: int


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TxnIndexSearchResult(NamedTuple):
    aborted_transactions: list[AbortedTxn]
    # True when the search need not continue into later segments.
    is_complete: bool


def _round_down(number: int, factor: int) -> int:
    return factor * (number // factor)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MS_SYNC = 4


class FileMap:
    """A shared mapping of a whole file that keeps no file descriptor once made.

    CPython's ``mmap.mmap`` (before 3.13's ``trackfd=False``) holds a duplicate descriptor for
    the life of the map: with the log file that made three per segment, so descriptors, not
    memory, bounded how many partitions a broker could host. This maps through libc and keeps
    the address only, as Java's MappedByteBuffer does. ``view`` is the buffer (read-only for
    a read-only map); ``close`` unmaps it, so no view of it may outlive the call that took it:
    the owning index's lock serialises them."""

    __slots__ = ("_addr", "_length", "view")

    def __init__(self, fd: int, length: int, writable: bool):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        addr = _libc.mmap(None, length, prot, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        self._addr = addr
        self._length = length
        view = memoryview((ctypes.c_ubyte * length).from_address(addr)).cast("B")
        self.view = view if writable else view.toreadonly()

    def flush(self) -> None:
        if self._addr is not None and _libc.msync(self._addr, self._length, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync: {os.strerror(err)}")

    def close(self) -> None:
        if self._addr is not None:
            self.view.release()
            _libc.munmap(self._addr, self._length)
            self._addr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit libc may be gone already
            pass


class AbstractIndex:
    """A memory-mapped index of fixed-size entries sorted by key (a ``FileMap``: no descriptor
    is held while it is mapped).

    Subclasses define ``ENTRY_SIZE``, how an entry's search key and value are read, and the
    cached "last entry" state that has to be recomputed after truncation.
    """

    ENTRY_SIZE: int = 0

    def __init__(self, path: str | os.PathLike[str], base_offset: int,
                 max_index_size: int = -1, writable: bool = True):
        self._path = Path(path)
        self._base_offset = base_offset
        self._max_index_size = max_index_size
        self._writable = writable
        self._lock = threading.RLock()
        self._closed = False
        self._map_obj: FileMap | None = None
        self._mmap: memoryview | None = None   # the map's buffer
        self._length = 0
        self._max_entries = 0
        self._entries = 0
        self._reserved = 0      # bytes from the start whose blocks are allocated
        self._open_and_map()
        self._reload_last_entry()

    # ------------------------------------------------------------------ mapping

    def _open_and_map(self) -> None:
        entry_size = self.ENTRY_SIZE
        if self._writable:
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                newly_created = True
            except FileExistsError:
                fd = os.open(self._path, os.O_RDWR)
                newly_created = False
        else:
            fd = os.open(self._path, os.O_RDONLY)  # FileNotFoundError if missing
            newly_created = False
        try:
            if newly_created:
                if self._max_index_size < entry_size:
                    os.close(fd)
                    fd = -1
                    os.unlink(self._path)
                    raise ValueError(f"Invalid max index size: {self._max_index_size}")
                os.ftruncate(fd, _round_down(self._max_index_size, entry_size))
            length = os.fstat(fd).st_size
            self._map_file(fd, length)
            self._length = length
            self._max_entries = length // entry_size
            # A new index starts empty; an existing one is assumed to be trimmed to its entries.
            self._entries = 0 if newly_created else length // entry_size
            self._reserved = self._entries * entry_size
        finally:
            if fd >= 0:
                os.close(fd)

    def _map_file(self, fd: int, length: int) -> None:
        if length == 0:
            return  # an empty file cannot be mapped; an empty map holds no entries anyway
        self._map_obj = FileMap(fd, length, self._writable)
        self._mmap = self._map_obj.view

    def _unmap(self) -> None:
        if self._map_obj is not None:
            self._mmap = None
            self._map_obj.close()
            self._map_obj = None

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"index {self._path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise PermissionError(f"index {self._path} was opened read-only")

    # ------------------------------------------------------------- subclass hooks

    def _key(self, buf: memoryview, n: int) -> int:
        raise NotImplementedError

    def _value(self, buf: memoryview, n: int) -> int:
        raise NotImplementedError

    def _reload_last_entry(self) -> None:
        raise NotImplementedError

    def sanity_check(self) -> None:
        raise NotImplementedError

    def truncate_to(self, offset: int) -> None:
        raise NotImplementedError

    # --------------------------------------------------------------- properties

    @property
    def path(self) -> Path:
        return self._path

    @property
    def base_offset(self) -> int:
        return self._base_offset

    @property
    def max_index_size(self) -> int:
        return self._max_index_size

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def length(self) -> int:
        """Current length of the index file (preallocated length while active)."""
        return self._length

    @property
    def size_in_bytes(self) -> int:
        """Bytes used by valid entries."""
        return self.ENTRY_SIZE * self._entries

    @property
    def is_closed(self) -> bool:
        return self._closed

    def is_full(self) -> bool:
        return self._entries >= self._max_entries

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self._path)!r}, base_offset={self._base_offset}, "
                f"entries={self._entries}, max_entries={self._max_entries})")

    # ------------------------------------------------------------ size changes

    def resize(self, new_size: int) -> bool:
        """Set the file and map to ``new_size`` rounded down to whole entries.

        Returns False when the size is already right. Used to trim on roll/close and to re-extend
        an index to ``max_index_size`` when its segment becomes active again.
        """
        with self._lock:
            self._check_writable()
            rounded = _round_down(new_size, self.ENTRY_SIZE)
            if rounded == self._length:
                return False
            if rounded < self._entries * self.ENTRY_SIZE:
                raise ValueError(f"cannot resize index {self._path} to {rounded} bytes: it holds "
                                 f"{self._entries} entries of {self.ENTRY_SIZE} bytes")
            self._unmap()
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, rounded)
                self._map_file(fd, rounded)
            finally:
                os.close(fd)
            self._length = rounded
            self._max_entries = rounded // self.ENTRY_SIZE
            self._reserved = min(self._reserved, rounded)
            return True

    def reserve(self, entries: int) -> None:
        """Allocate the file's blocks for the next ``entries`` entries (at most up to its
        end) before they are written through the map: a full disk raises OSError (ENOSPC)
        here instead of killing the process with SIGBUS on the write."""
        with self._lock:
            end = min(self._length, (self._entries + entries) * self.ENTRY_SIZE)
            if end <= self._reserved:
                return
            start = self._reserved
            end = min(self._length, max(end, start + _RESERVE_BYTES))
            fd = os.open(self._path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, start, end - start)
            finally:
                os.close(fd)
            self._reserved = end

    def trim_to_valid_size(self) -> None:
        """Shrink the file to exactly ``entries * entry_size`` bytes."""
        with self._lock:
            self.resize(self.ENTRY_SIZE * self._entries)

    def truncate(self) -> None:
        """Remove every entry (the file keeps its size)."""
        with self._lock:
            self._truncate_to_entries(0)

    def reset(self) -> None:
        """Remove every entry and re-extend the file to ``max_index_size``."""
        with self._lock:
            self._check_writable()
            self._truncate_to_entries(0)
            self.resize(self._max_index_size)

    def _truncate_to_entries(self, entries: int) -> None:
        self._check_writable()
        self._entries = entries
        self._reload_last_entry()

    # --------------------------------------------------------------- lifecycle

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            if self._map_obj is not None and self._writable:
                self._map_obj.flush()

    def close(self) -> None:
        """Trim a writable index to its valid entries and release the map. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._writable and self._path.exists():
                    self.trim_to_valid_size()
            finally:
                self._unmap()
                self._closed = True

    def close_handler(self) -> None:
        """Release the map without trimming (Kafka's closeHandler)."""
        with self._lock:
            self._unmap()
            self._closed = True

    def delete(self) -> bool:
        """Release the map and delete the file; False if the file did not exist."""
        with self._lock:
            self.close_handler()
            try:
                self._path.unlink()
                return True
            except FileNotFoundError:
                return False

    delete_if_exists = delete

    def rename_to(self, new_path: str | os.PathLike[str]) -> None:
        """Atomically rename the backing file (the map stays valid)."""
        new_path = Path(new_path)
        with self._lock:
            try:
                os.replace(self._path, new_path)
            finally:
                self._path = new_path

    def update_parent_dir(self, parent_dir: str | os.PathLike[str]) -> None:
        """Point at the same file name in another directory (after the directory was renamed)."""
        with self._lock:
            self._path = Path(parent_dir) / self._path.name

    # ---------------------------------------------------------------- offsets

    def relative_offset(self, offset: int) -> int:
        rel = offset - self._base_offset
        if rel < 0 or rel > _INT32_MAX:
            raise IndexOffsetOverflowError(
                f"Integer overflow for offset: {offset} (base offset {self._base_offset}, "
                f"{self._path})")
        return rel

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self._base_offset <= _INT32_MAX

    # ----------------------------------------------------------------- search

    def _largest_lower_bound_slot(self, target: int, by_value: bool = False) -> int:
        """Slot of the greatest entry whose key (or value) is <= target, or -1."""
        n = self._entries
        buf = self._mmap
        if n == 0 or buf is None:
            return -1
        get = self._value if by_value else self._key
        lo, hi = self._search_range(buf, get, target, n)
        if lo < 0:
            return -1
        # Invariant: get(lo) <= target; find the last such slot in [lo, hi].
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if get(buf, mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _smallest_upper_bound_slot(self, target: int, by_value: bool = False) -> int:
        """Slot of the smallest entry whose key (or value) is >= target, or -1."""
        n = self._entries
        buf = self._mmap
        if n == 0 or buf is None:
            return -1
        get = self._value if by_value else self._key
        lo = self._largest_lower_bound_slot(target, by_value)
        if lo >= 0 and get(buf, lo) == target:
            return lo
        slot = lo + 1
        return slot if slot < n else -1

    def _search_range(self, buf: memoryview, get, target: int, n: int) -> tuple[int, int]:
        """Narrow the binary search to the warm tail of the index when the target lies there."""
        first_hot = max(0, n - 1 - _WARM_SECTION_BYTES // self.ENTRY_SIZE)
        if get(buf, first_hot) < target:
            return first_hot, n - 1
        if get(buf, 0) > target:
            return -1, -1
        return 0, first_hot


class OffsetIndex(AbstractIndex):
    """Maps offsets to byte positions in a segment's log file (Kafka's ``.index``)."""

    ENTRY_SIZE = 8
    _ENTRY = struct.Struct(">ii")
    _I32 = struct.Struct(">i")

    def _key(self, buf: memoryview, n: int) -> int:
        return self._base_offset + self._I32.unpack_from(buf, n * 8)[0]

    def _value(self, buf: memoryview, n: int) -> int:
        return self._I32.unpack_from(buf, n * 8 + 4)[0]

    def _parse(self, buf: memoryview, n: int) -> OffsetPosition:
        rel, pos = self._ENTRY.unpack_from(buf, n * 8)
        return OffsetPosition(self._base_offset + rel, pos)

    def _reload_last_entry(self) -> None:
        if self._entries == 0 or self._mmap is None:
            self._last_offset = self._base_offset
        else:
            self._last_offset = self._key(self._mmap, self._entries - 1)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when the index is empty."""
        return self._last_offset

    def sanity_check(self) -> None:
        if self._entries != 0 and self._last_offset < self._base_offset:
            raise CorruptIndexError(
                f"Corrupt index found, index file {self._path} has non-zero size but the last "
                f"offset is {self._last_offset} which is less than the base offset "
                f"{self._base_offset}")
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"Index file {self._path} is corrupt, found {self._length} bytes which is "
                f"neither positive nor a multiple of {self.ENTRY_SIZE}")

    def append(self, offset: int, position: int) -> None:
        with self._lock:
            self._check_writable()
            if self.is_full():
                raise IndexFullError(
                    f"Attempt to append to a full index {self._path} (size = {self._entries}).")
            if self._entries != 0 and offset <= self._last_offset:
                raise InvalidOffsetError(
                    f"Attempt to append an offset {offset} to position {self._entries} no larger "
                    f"than the last offset appended ({self._last_offset}) to {self._path}")
            rel = self.relative_offset(offset)
            self._ENTRY.pack_into(self._mmap, self._entries * 8, rel, position)
            self._entries += 1
            self._last_offset = offset

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The greatest entry with offset <= target, or ``(base_offset, 0)`` if there is none."""
        with self._lock:
            self._check_open()
            slot = self._largest_lower_bound_slot(target_offset)
            if slot < 0:
                return OffsetPosition(self._base_offset, 0)
            return self._parse(self._mmap, slot)

    def entry(self, n: int) -> OffsetPosition:
        with self._lock:
            self._check_open()
            if n < 0 or n >= self._entries:
                raise IndexError(f"Attempt to fetch the {n}th entry from index {self._path}, "
                                 f"which has size {self._entries}")
            return self._parse(self._mmap, n)

    def fetch_upper_bound_offset(self, fetch_position: OffsetPosition | int,
                                 fetch_size: int) -> OffsetPosition | None:
        """The first entry whose position is >= ``fetch_position + fetch_size``, if any.

        ``fetch_position`` is the fetch start's byte position (or its OffsetPosition). The result
        is an offset guaranteed to lie outside the fetched range, not the smallest such offset.
        """
        start = fetch_position.position if isinstance(fetch_position, OffsetPosition) \
            else fetch_position
        with self._lock:
            self._check_open()
            slot = self._smallest_upper_bound_slot(start + fetch_size, by_value=True)
            if slot < 0:
                return None
            return self._parse(self._mmap, slot)

    def bracket(self, position: int) -> tuple[OffsetPosition | None, OffsetPosition | None]:
        """The last entry whose position is <= ``position`` and the entry after it (None where
        there is none). One search gives a read both the last batch start it need not walk to
        and the first indexed offset past its end."""
        with self._lock:
            self._check_open()
            slot = self._largest_lower_bound_slot(position, by_value=True)
            buf = self._mmap
            below = self._parse(buf, slot) if slot >= 0 else None
            above = self._parse(buf, slot + 1) if slot + 1 < self._entries else None
            return below, above

    def truncate_to(self, offset: int) -> None:
        """Remove all entries with offset >= ``offset``."""
        with self._lock:
            self._check_writable()
            slot = self._largest_lower_bound_slot(offset)
            if slot < 0:
                new_entries = 0
            elif self._key(self._mmap, slot) == offset:
                new_entries = slot
            else:
                new_entries = slot + 1
            self._truncate_to_entries(new_entries)


class TimeIndex(AbstractIndex):
    """Maps timestamps to offsets (Kafka's ``.timeindex``).

    An entry ``(T, O)`` means the largest timestamp seen up to offset ``O`` is ``T``. Timestamps
    strictly increase; offsets never decrease.
    """

    ENTRY_SIZE = 12
    _ENTRY = struct.Struct(">qi")
    _I64 = struct.Struct(">q")
    _I32 = struct.Struct(">i")

    def _key(self, buf: memoryview, n: int) -> int:
        return self._I64.unpack_from(buf, n * 12)[0]

    def _value(self, buf: memoryview, n: int) -> int:
        return self._base_offset + self._I32.unpack_from(buf, n * 12 + 8)[0]

    def _parse(self, buf: memoryview, n: int) -> TimestampOffset:
        ts, rel = self._ENTRY.unpack_from(buf, n * 12)
        return TimestampOffset(ts, self._base_offset + rel)

    def _reload_last_entry(self) -> None:
        if self._entries == 0 or self._mmap is None:
            self._last_entry = TimestampOffset(NO_TIMESTAMP, self._base_offset)
        else:
            self._last_entry = self._parse(self._mmap, self._entries - 1)

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` when the index is empty."""
        return self._last_entry

    def is_full(self) -> bool:
        # One slot is kept back for the entry written when the segment is rolled or closed.
        return self._entries >= self._max_entries - 1

    def sanity_check(self) -> None:
        last_ts, last_offset = self._last_entry
        if self._entries != 0 and self._mmap is not None:
            first_ts = self._key(self._mmap, 0)
            if last_ts < first_ts:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self._path}) has non-zero size "
                    f"but the last timestamp is {last_ts} which is less than the first timestamp "
                    f"{first_ts}")
        if self._entries != 0 and last_offset < self._base_offset:
            raise CorruptIndexError(
                f"Corrupt time index found, time index file ({self._path}) has non-zero size but "
                f"the last offset is {last_offset} which is less than the first offset "
                f"{self._base_offset}")
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"Time index file {self._path} is corrupt, found {self._length} bytes which is "
                f"neither positive nor a multiple of {self.ENTRY_SIZE}")

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append ``(timestamp, offset)`` if ``timestamp`` is larger than the last entry's.

        Re-appending the last entry (as happens on roll and close) is a no-op. ``skip_full_check``
        lets that final entry use the slot :meth:`is_full` keeps back.
        """
        with self._lock:
            self._check_writable()
            if not skip_full_check and self.is_full():
                raise IndexFullError(f"Attempt to append to a full time index {self._path} "
                                     f"(size = {self._entries}).")
            last_ts, last_offset = self._last_entry
            if self._entries != 0 and offset < last_offset:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({offset}) to slot {self._entries} no larger "
                    f"than the last offset appended ({last_offset}) to {self._path}")
            if self._entries != 0 and timestamp < last_ts:
                raise InvalidTimestampOrderError(
                    f"Attempt to append a timestamp ({timestamp}) to slot {self._entries} no "
                    f"larger than the last timestamp appended ({last_ts}) to {self._path}")
            if timestamp > last_ts:
                if self._entries >= self._max_entries:
                    raise IndexFullError(f"Time index {self._path} has no free slot "
                                         f"(size = {self._entries}).")
                rel = self.relative_offset(offset)
                self._ENTRY.pack_into(self._mmap, self._entries * 12, timestamp, rel)
                self._entries += 1
                self._last_entry = TimestampOffset(timestamp, offset)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The greatest entry with timestamp <= target, or ``(-1, base_offset)`` if none."""
        with self._lock:
            self._check_open()
            slot = self._largest_lower_bound_slot(target_timestamp)
            if slot < 0:
                return TimestampOffset(NO_TIMESTAMP, self._base_offset)
            return self._parse(self._mmap, slot)

    def entry(self, n: int) -> TimestampOffset:
        with self._lock:
            self._check_open()
            if n < 0 or n >= self._entries:
                raise IndexError(f"Attempt to fetch the {n}th entry from time index {self._path} "
                                 f"which has size {self._entries}")
            return self._parse(self._mmap, n)

    def truncate_to(self, offset: int) -> None:
        """Remove all entries with offset >= ``offset``."""
        with self._lock:
            self._check_writable()
            slot = self._largest_lower_bound_slot(offset, by_value=True)
            if slot < 0:
                new_entries = 0
            else:
                # Offsets may repeat in a time index: step back over every entry equal to offset.
                buf = self._mmap
                while slot >= 0 and self._value(buf, slot) >= offset:
                    slot -= 1
                new_entries = slot + 1
            self._truncate_to_entries(new_entries)


class TransactionIndex:
    """Aborted transactions whose markers are in a segment (Kafka's ``.txnindex``).

    The file is created on the first append. Entries are ordered by ``last_offset``.
    """

    ENTRY_SIZE = 34
    CURRENT_VERSION = 0
    _ENTRY = struct.Struct(">hqqqq")

    def __init__(self, path: str | os.PathLike[str], start_offset: int):
        self._path = Path(path)
        self._start_offset = start_offset
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._last_offset: int | None = None
        if self._path.exists():
            self._open()
            entries = self._read_entries()
            if entries:
                self._last_offset = entries[-1].last_offset

    # ----------------------------------------------------------------- file

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def _read_entries(self) -> list[AbortedTxn]:
        with self._lock:
            if self._fd is None:
                if not self._path.exists():
                    return []
                self._open()
            fd = self._fd
            size = os.fstat(fd).st_size
            data = os.pread(fd, _round_down(size, self.ENTRY_SIZE), 0) if size else b""
        result = []
        for version, pid, first, last, lso in self._ENTRY.iter_unpack(data):
            if version > self.CURRENT_VERSION:
                raise CorruptIndexError(
                    f"Unexpected aborted transaction version {version} in transaction index "
                    f"{self._path}, current version is {self.CURRENT_VERSION}")
            result.append(AbortedTxn(pid, first, last, lso))
        return result

    # ----------------------------------------------------------- properties

    @property
    def path(self) -> Path:
        return self._path

    @property
    def base_offset(self) -> int:
        return self._start_offset

    start_offset = base_offset

    @property
    def last_offset(self) -> int | None:
        """``last_offset`` of the last appended transaction, or None when empty."""
        return self._last_offset

    @property
    def size_in_bytes(self) -> int:
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    # ------------------------------------------------------------ operations

    def append(self, aborted_txn: AbortedTxn) -> None:
        with self._lock:
            if self._last_offset is not None and self._last_offset >= aborted_txn.last_offset:
                raise ValueError(
                    f"The last offset of appended transactions must increase sequentially, but "
                    f"{aborted_txn.last_offset} is not greater than current last offset "
                    f"{self._last_offset} of index {self._path}")
            data = self._ENTRY.pack(self.CURRENT_VERSION, *aborted_txn)
            fd = self._open()
            size = os.fstat(fd).st_size
            # Entries are appended after the last whole entry; a torn tail is overwritten.
            os.pwrite(fd, data, _round_down(size, self.ENTRY_SIZE))
            self._last_offset = aborted_txn.last_offset

    def all_aborted_txns(self) -> list[AbortedTxn]:
        return self._read_entries()

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions overlapping ``[fetch_offset, upper_bound_offset)``.

        ``is_complete`` is True once an entry's last stable offset reaches the upper bound: no
        later segment can hold an aborted transaction that overlaps the range.
        """
        found: list[AbortedTxn] = []
        if self._last_offset is None:   # empty: every read_committed Fetch asks, so no syscall
            return TxnIndexSearchResult(found, False)
        for txn in self._read_entries():
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(found, True)
        return TxnIndexSearchResult(found, False)

    def truncate_to(self, offset: int) -> None:
        """Remove every transaction whose ``last_offset`` is >= ``offset``."""
        with self._lock:
            new_last: int | None = None
            for i, txn in enumerate(self._read_entries()):
                if txn.last_offset >= offset:
                    os.ftruncate(self._fd, i * self.ENTRY_SIZE)
                    self._last_offset = new_last
                    return
                new_last = txn.last_offset

    def reset(self) -> None:
        """Remove every entry (the file, if any, is truncated to zero bytes)."""
        with self._lock:
            if self._fd is None and self._path.exists():
                self._open()
            if self._fd is not None:
                os.ftruncate(self._fd, 0)
            self._last_offset = None

    def sanity_check(self) -> None:
        for txn in self._read_entries():
            if txn.last_offset < self._start_offset:
                raise CorruptIndexError(
                    f"Last offset of aborted transaction {txn} in index {self._path} is less "
                    f"than start offset {self._start_offset}")

    def flush(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the file handle; later reads or appends reopen it."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def delete(self) -> bool:
        with self._lock:
            self.close()
            self._last_offset = None
            try:
                self._path.unlink()
                return True
            except FileNotFoundError:
                return False

    delete_if_exists = delete

    def rename_to(self, new_path: str | os.PathLike[str]) -> None:
        new_path = Path(new_path)
        with self._lock:
            try:
                if self._path.exists():
                    os.replace(self._path, new_path)
            finally:
                self._path = new_path

    def update_parent_dir(self, parent_dir: str | os.PathLike[str]) -> None:
        with self._lock:
            self._path = Path(parent_dir) / self._path.name
