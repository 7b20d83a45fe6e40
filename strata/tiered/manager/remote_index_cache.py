"""RemoteIndexCache: remote segments' offset, time and transaction indexes on local disk.

Kafka's ``org.apache.kafka.storage.internals.log.RemoteIndexCache``: reading a remote
segment starts with an index lookup, and these files are small next to the segment, so the
broker keeps recently and frequently used ones in ``<log dir>/remote-log-index-cache/``
instead of fetching them from remote storage on every read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple, TypeVar

from strata.common.scheduler import BackgroundThread
from strata.common.tinylfu import ByteWeightedTinyLfu
from strata.common.types import uuid_from_kafka_str, uuid_to_kafka_str as kafka_uuid_str
from strata.log.indexes import (
    CorruptIndexError, OffsetIndex, OffsetPosition, TimeIndex, TransactionIndex,
    TxnIndexSearchResult)
from strata.tiered.api import (
    IndexType, RemoteLogSegmentMetadata, RemoteStorageManager)

__all__ = ["DIR_NAME", "Entry", "RemoteIndexCache", "RemoteIndexCacheStats", "index_file_prefix"]

log = logging.getLogger(__name__)

DIR_NAME = "remote-log-index-cache"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
TMP_SUFFIX = ".tmp"
DELETED_SUFFIX = ".deleted"
_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

_I = TypeVar("_I")



def index_file_prefix(meta: RemoteLogSegmentMetadata) -> str:
    """``{startOffset}_{segment uuid}``, the name of a segment's cached index files without
    suffix, as Kafka writes it (decimal offset, Kafka's base64 uuid)."""
    return f"{meta.start_offset}_{kafka_uuid_str(meta.remote_log_segment_id.id)}"


def _parse_prefix(prefix: str) -> tuple[int, uuid.UUID] | None:
    offset, sep, uuid_str = prefix.partition("_")
    try:
        return (int(offset), uuid_from_kafka_str(uuid_str)) if sep and offset.isdigit() else None
    except ValueError:
        return None


class RemoteIndexCacheStats(NamedTuple):
    hits: int
    misses: int
    evictions: int
    entries: int
    size_bytes: int


class Entry:
    """The cached indexes of one remote segment.

    ``offset_index`` and ``time_index`` are opened read-only (memory-mapped);
    ``txn_index`` is None when the segment has no aborted transactions (its cached file is
    empty). An entry is *pinned* while a lookup uses it: once evicted or removed its files
    are renamed to ``.deleted`` at once, and closed and deleted when the last pin is
    released. Thread-safe.
    """

    def __init__(self, offset_index: OffsetIndex, time_index: TimeIndex,
                 txn_index: TransactionIndex | None, txn_path: Path):
        self.offset_index = offset_index
        self.time_index = time_index
        self.txn_index = txn_index
        self._txn_path = txn_path
        self.size_bytes = sum(os.path.getsize(p) for p in self.paths)
        self._lock = threading.Lock()
        self._pins = 0
        self._retired = False       # no new pins; close (and delete if _delete) when unpinned
        self._delete = False
        self._closed = False

    @property
    def paths(self) -> list[Path]:
        """The entry's three files (renamed to ``.deleted`` once the entry is removed)."""
        return [self.offset_index.path, self.time_index.path,
                self.txn_index.path if self.txn_index is not None else self._txn_path]

    def lookup_offset(self, offset: int) -> OffsetPosition:
        """The greatest indexed offset <= ``offset`` and its position (position 0 if none)."""
        return self.offset_index.lookup(offset)

    def lookup_timestamp(self, timestamp: int, starting_offset: int) -> OffsetPosition:
        """Where to scan from for the first batch with max timestamp >= ``timestamp`` at or
        after ``starting_offset`` (Kafka's ``Entry.lookupTimestamp``)."""
        found = self.time_index.lookup(timestamp)
        return self.offset_index.lookup(max(found.offset, starting_offset))

    def collect_aborted_txns(self, fetch_offset: int,
                             upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions overlapping ``[fetch_offset, upper_bound_offset)``."""
        if self.txn_index is None:
            return TxnIndexSearchResult([], False)
        return self.txn_index.collect_aborted_txns(fetch_offset, upper_bound_offset)

    # ---- life cycle (the cache calls these) ------------------------------------------------

    def pin(self) -> bool:
        with self._lock:
            if self._retired:
                return False
            self._pins += 1
            return True

    def unpin(self) -> None:
        with self._lock:
            self._pins -= 1
            release = self._retired and self._pins == 0 and not self._closed
            if release:
                self._closed = True
        if release:
            self._release()

    def retire(self, delete: bool) -> None:
        """Stop new pins; with ``delete`` rename the files to ``.deleted`` now. The handles
        are closed (and the files deleted) when no lookup uses the entry any more."""
        with self._lock:
            if self._retired:
                return
            self._retired = True
            self._delete = delete
            if delete:
                self._rename_to_deleted()
            release = self._pins == 0
            if release:
                self._closed = True
        if release:
            self._release()

    def _rename_to_deleted(self) -> None:
        try:
            self.offset_index.rename_to(_with_suffix(self.offset_index.path, DELETED_SUFFIX))
            self.time_index.rename_to(_with_suffix(self.time_index.path, DELETED_SUFFIX))
            deleted_txn = _with_suffix(self._txn_path, DELETED_SUFFIX)
            if self.txn_index is not None:
                self.txn_index.rename_to(deleted_txn)
            elif self._txn_path.exists():
                os.replace(self._txn_path, deleted_txn)
            self._txn_path = deleted_txn
        except OSError:
            log.exception("could not rename the remote index files %s", self.paths)

    def _release(self) -> None:
        for index in (self.offset_index, self.time_index, self.txn_index):
            if index is not None:
                index.close()
        if self._delete:
            for path in self.paths:
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    log.exception("could not delete the remote index file %s", path)

    def __repr__(self) -> str:
        return f"Entry({self.offset_index.path.name}, {self.size_bytes} bytes)"


def _with_suffix(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


class _KeyLock:
    """Serialises loads (and removal) of one segment's entry; dropped when unused."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class RemoteIndexCache:
    """Remote segments' index files cached on local disk, bounded by their total bytes.

    On disk, in ``<log_dir>/remote-log-index-cache/``, Kafka's layout: per segment
    ``{startOffset}_{uuid}.index``, ``.timeindex`` and ``.txnindex`` (decimal start offset,
    Kafka's base64 segment uuid; files byte-identical to the remote indexes; an empty
    ``.txnindex`` when the segment has none). Downloads are written to ``<name>.tmp`` and
    renamed into place. Entries removed from the cache have their files renamed to
    ``<name>.deleted`` and deleted once no lookup uses them. At construction, complete sets
    of three files left by an earlier run are reused, incomplete sets and ``.tmp`` /
    ``.deleted`` leftovers are deleted.

    Policy: W-TinyLFU keyed by segment uuid and weighted by the entry's bytes
    (:class:`strata.common.tinylfu.ByteWeightedTinyLfu`, theine's policy core split into byte
    slots). Invariant: the entries' bytes never exceed ``max_size_bytes``; an entry bigger
    than the whole budget is used once and not kept.

    Threads: every method may be called from any thread. Different segments load in
    parallel; concurrent requests for the same segment download it once (a lock per
    segment). Index lookups pin their entry, so eviction never closes an index under a
    reader.
    """

    def __init__(self, rsm: RemoteStorageManager, log_dir: str | os.PathLike[str],
                 max_size_bytes: int):
        self._rsm = rsm
        self.cache_dir = Path(log_dir) / DIR_NAME
        self._lock = threading.Lock()      # guards every field below
        self._entries: dict[uuid.UUID, Entry] = {}    # the keys the policy holds
        self._key_locks: dict[uuid.UUID, _KeyLock] = {}
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._closed = False
        self._prefetching: set[uuid.UUID] = set()
        self._prefetcher = BackgroundThread("remote-index-prefetch")
        self._set_budget(max_size_bytes)
        self._restore()

    # ---- statistics --------------------------------------------------------------------------

    @property
    def hits(self) -> int:
        return self._hits

    @property
    def misses(self) -> int:
        return self._misses

    @property
    def evictions(self) -> int:
        """Entries dropped by the size policy (explicit ``remove`` calls are not counted)."""
        return self._evictions

    @property
    def size_bytes(self) -> int:
        """Bytes of the index files of the cached entries."""
        return self._policy.weighted_bytes

    @property
    def max_size_bytes(self) -> int:
        return self._policy.capacity_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, segment_uuid: uuid.UUID) -> bool:
        return segment_uuid in self._entries

    def stats(self) -> RemoteIndexCacheStats:
        with self._lock:
            return RemoteIndexCacheStats(self._hits, self._misses, self._evictions,
                                         len(self._entries), self._policy.weighted_bytes)

    # ---- lookups -----------------------------------------------------------------------------

    def get_index_entry(self, meta: RemoteLogSegmentMetadata) -> Entry:
        """The segment's entry, downloading its indexes on a miss.

        The entry is valid until it is evicted; code that must not race with eviction uses
        :meth:`pinned_entry` or the lookup methods.
        """
        entry = self._acquire(meta)
        entry.unpin()
        return entry

    def prefetch(self, meta: RemoteLogSegmentMetadata) -> None:
        """Load the segment's entry in the background (a reader will soon need it); never
        blocks, never raises."""
        key = meta.remote_log_segment_id.id
        with self._lock:
            if self._closed or key in self._entries or key in self._prefetching:
                return
            self._prefetching.add(key)
        if not self._prefetcher.submit(self._prefetch, meta):
            with self._lock:
                self._prefetching.discard(key)

    def _prefetch(self, meta: RemoteLogSegmentMetadata) -> None:
        try:
            self.get_index_entry(meta)
        finally:
            with self._lock:
                self._prefetching.discard(meta.remote_log_segment_id.id)

    @contextlib.contextmanager
    def pinned_entry(self, meta: RemoteLogSegmentMetadata) -> Iterator[Entry]:
        """The segment's entry, kept open for the duration of the ``with`` block."""
        entry = self._acquire(meta)
        try:
            yield entry
        finally:
            entry.unpin()

    def lookup_offset(self, meta: RemoteLogSegmentMetadata, offset: int) -> int:
        """Byte position of the largest indexed offset <= ``offset`` (0 when there is none)."""
        with self.pinned_entry(meta) as entry:
            return entry.lookup_offset(offset).position

    def lookup_timestamp(self, meta: RemoteLogSegmentMetadata, timestamp: int,
                         start_offset: int) -> int:
        """Byte position to scan from for the first batch with max timestamp >= ``timestamp``
        and last offset >= ``start_offset``."""
        with self.pinned_entry(meta) as entry:
            return entry.lookup_timestamp(timestamp, start_offset).position

    # ---- changes -----------------------------------------------------------------------------

    def remove(self, segment_uuid: uuid.UUID) -> None:
        """Drop a segment's entry and delete its files (the remote segment was deleted)."""
        with self._key_lock(segment_uuid), self._lock:
            self._drop(segment_uuid)

    def resize(self, max_bytes: int) -> None:
        """Change the byte budget, evicting what no longer fits. The policy's frequency
        history starts afresh."""
        with self._lock:
            entries = list(self._entries.items())
            self._entries.clear()
            self._set_budget(max_bytes)
            evicted: list[Entry] = []
            for key, entry in entries:
                evicted += self._admit(key, entry)
        self._log_evicted(evicted)

    def close(self) -> None:
        """Close every index; the files stay for the next start. Later lookups raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._prefetcher.close()
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._policy.clear()
        for entry in entries:
            entry.retire(delete=False)
        log.info("closed the remote index cache in %s: %s", self.cache_dir, self.stats())

    def __enter__(self) -> RemoteIndexCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals: policy -------------------------------------------------------------------

    def _set_budget(self, max_bytes: int) -> None:
        """A fresh policy (no entries, no frequency history) for ``max_bytes``."""
        self._policy: ByteWeightedTinyLfu[uuid.UUID] = ByteWeightedTinyLfu(max_bytes)

    def _admit(self, key: uuid.UUID, entry: Entry) -> list[Entry]:
        """Add ``entry`` to the policy; returns the entries evicted (already retired),
        ``entry`` itself included when the policy does not keep it. Holds ``_lock``."""
        self._entries[key] = entry
        evicted = []
        for victim_key in self._policy.admit(key, entry.size_bytes):
            victim = self._entries.pop(victim_key, None)
            if victim is not None:
                self._evictions += 1
                victim.retire(delete=True)
                evicted.append(victim)
        return evicted

    def _drop(self, key: uuid.UUID) -> Entry | None:
        """Remove ``key`` from the map and the policy. Holds ``_lock``."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._policy.remove(key)
        # Renamed now, under the lock, so a later download of the same segment never meets
        # this entry's files under the live names.
        entry.retire(delete=True)
        return entry

    @staticmethod
    def _log_evicted(evicted: list[Entry]) -> None:
        for entry in evicted:
            log.debug("evicted %s from the remote index cache", entry)

    # ---- internals: loading ------------------------------------------------------------------

    @contextlib.contextmanager
    def _key_lock(self, key: uuid.UUID) -> Iterator[None]:
        with self._lock:
            kl = self._key_locks.get(key)
            if kl is None:
                kl = self._key_locks[key] = _KeyLock()
            kl.users += 1
        try:
            with kl.lock:
                yield
        finally:
            with self._lock:
                kl.users -= 1
                if kl.users == 0:
                    del self._key_locks[key]

    def _cached(self, key: uuid.UUID) -> Entry | None:
        """A pinned cached entry (counted as a hit), or None. Holds ``_lock``."""
        if self._closed:
            raise RuntimeError(f"the remote index cache in {self.cache_dir} is closed")
        entry = self._entries.get(key)
        if entry is None or not entry.pin():
            return None
        self._hits += 1
        self._policy.touch(key)
        return entry

    def _acquire(self, meta: RemoteLogSegmentMetadata) -> Entry:
        """The segment's entry, pinned; the caller unpins it."""
        key = meta.remote_log_segment_id.id
        with self._lock:
            entry = self._cached(key)
        if entry is not None:
            return entry
        with self._key_lock(key):
            with self._lock:
                entry = self._cached(key)
                if entry is not None:
                    return entry
                self._misses += 1
            entry = self._load(meta)
            entry.pin()
            with self._lock:
                if self._closed:
                    entry.retire(delete=False)  # keep the files for the next start
                    evicted = []
                else:
                    evicted = self._admit(key, entry)
        self._log_evicted(evicted)
        return entry

    def _load(self, meta: RemoteLogSegmentMetadata) -> Entry:
        """Open the segment's cached files, downloading those missing (in one
        ``fetch_indexes`` call) or corrupt."""
        start = meta.start_offset
        base = self.cache_dir / index_file_prefix(meta)
        paths = {IndexType.OFFSET: _with_suffix(base, INDEX_SUFFIX),
                 IndexType.TIMESTAMP: _with_suffix(base, TIME_INDEX_SUFFIX),
                 IndexType.TRANSACTION: _with_suffix(base, TXN_INDEX_SUFFIX)}
        fetched: dict[IndexType, BinaryIO] = {}

        def fetch(index_type: IndexType) -> BinaryIO | None:
            if not fetched:
                wanted = [t for t, p in paths.items() if not p.exists()
                          and not (t is IndexType.TRANSACTION and meta.txn_idx_empty)]
                fetched.update(self._rsm.fetch_indexes(meta, wanted or [index_type]))
            stream = fetched.pop(index_type, None)
            if stream is not None:
                return stream
            if index_type is IndexType.TRANSACTION:
                return None     # no aborted transactions in the segment: cache an empty file
            return self._rsm.fetch_index(meta, index_type)   # raises what is wrong

        opened: list[OffsetIndex | TimeIndex | TransactionIndex] = []
        try:
            offset_index = self._load_file(paths[IndexType.OFFSET], lambda: fetch(IndexType.OFFSET),
                                           lambda p: _open_index(OffsetIndex, p, start))
            opened.append(offset_index)
            time_index = self._load_file(paths[IndexType.TIMESTAMP],
                                         lambda: fetch(IndexType.TIMESTAMP),
                                         lambda p: _open_index(TimeIndex, p, start))
            opened.append(time_index)
            txn_path = paths[IndexType.TRANSACTION]
            txn_index = self._load_file(
                txn_path, lambda: None if meta.txn_idx_empty else fetch(IndexType.TRANSACTION),
                lambda p: _open_txn_index(p, start))
        except BaseException:
            # Leave no file outside the cache's accounting (the key lock is held: nobody
            # else uses these names now).
            for index in opened:
                index.close()
            for suffix in _SUFFIXES:
                _with_suffix(base, suffix).unlink(missing_ok=True)
            raise
        finally:
            for stream in fetched.values():
                stream.close()
        return Entry(offset_index, time_index, txn_index, txn_path)

    def _load_file(self, path: Path, fetch: Callable[[], BinaryIO | None],
                   open_index: Callable[[Path], _I]) -> _I:
        if path.exists():
            try:
                return open_index(path)
            except CorruptIndexError as exc:
                log.info("re-fetching the corrupt cached index %s: %s", path, exc)
        tmp = _with_suffix(path, TMP_SUFFIX)
        try:
            stream = fetch()
            with open(tmp, "wb") as out:
                if stream is not None:
                    with stream:
                        shutil.copyfileobj(stream, out)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return open_index(path)

    def _restore(self) -> None:
        """Reuse the complete file sets of an earlier run; delete everything else of ours."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        prefixes: set[str] = set()
        for path in self.cache_dir.iterdir():
            if path.name.endswith((TMP_SUFFIX, DELETED_SUFFIX)):
                path.unlink(missing_ok=True)
            elif path.name.endswith(_SUFFIXES):
                prefixes.add(path.name.split(".", 1)[0])
        for prefix in sorted(prefixes):
            parsed = _parse_prefix(prefix)
            paths = [self.cache_dir / (prefix + s) for s in _SUFFIXES]
            if parsed is None:
                log.warning("ignoring unknown files %s in %s", prefix, self.cache_dir)
                continue
            start, key = parsed
            try:
                entry = _open_entry(*paths, start)
            except (OSError, CorruptIndexError) as exc:
                log.info("deleting incomplete or corrupt cached indexes %s: %s", prefix, exc)
                for p in paths:
                    p.unlink(missing_ok=True)
                continue
            with self._lock:
                evicted = self._admit(key, entry)
            self._log_evicted(evicted)
        log.info("remote index cache in %s reuses %d entries (%d bytes)", self.cache_dir,
                 len(self._entries), self._policy.weighted_bytes)


def _open_entry(offset_path: Path, time_path: Path, txn_path: Path, start_offset: int) -> Entry:
    """The entry of a complete set of cached files (FileNotFoundError if one is missing)."""
    offset_index = _open_index(OffsetIndex, offset_path, start_offset)
    try:
        time_index = _open_index(TimeIndex, time_path, start_offset)
    except BaseException:
        offset_index.close()
        raise
    try:
        txn_index = _open_txn_index(txn_path, start_offset)
    except BaseException:
        offset_index.close()
        time_index.close()
        raise
    return Entry(offset_index, time_index, txn_index, txn_path)


def _open_index(cls: type[_I], path: Path, start_offset: int) -> _I:
    """An offset or time index file opened read-only, refused if it fails Kafka's sanity check."""
    index = cls(path, start_offset, writable=False)
    try:
        index.sanity_check()
    except CorruptIndexError:
        index.close()
        raise
    return index


def _open_txn_index(path: Path, start_offset: int) -> TransactionIndex | None:
    """The transaction index, or None when the file is empty (no aborted transactions)."""
    if path.stat().st_size == 0:
        return None
    index = TransactionIndex(path, start_offset)
    try:
        index.sanity_check()
    except CorruptIndexError:
        index.close()
        raise
    return index
