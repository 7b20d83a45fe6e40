"""ChunkCache: remote segments' ``.log`` chunks cached in memory and on local disk.

The remote storage manager stores each segment's ``.log`` object as fixed-size chunks and
loads every chunk through :meth:`ChunkCache.get`; a chunk is identified by
``(object key of the .log object, chunk id)`` and its cached bytes are its original content
(verified, decrypted, decompressed). Objects are immutable under their key, so a cached
chunk never goes stale; :meth:`ChunkCache.invalidate` drops an object's chunks when its
segment is deleted.

Lookup order of ``get``: the prefetched chunks not read yet, the memory tier, a load in
flight, the disk tier, and finally the loader. Concurrent requests for one chunk (``get``
or ``prefetch``) call the loader once ("single flight"); a loader error reaches every waiter
and is not cached.

Tiers: each is bounded in bytes by W-TinyLFU (:class:`strata.common.tinylfu.ByteWeightedTinyLfu`)
and filled on every load (write-through), so a chunk evicted from memory is still served
from disk. The disk tier is one file per chunk in ``chunk.cache.disk.path``, named
``{blake2b-128 of the key}-{sequence}.chunk``, written to ``<name>.tmp`` and renamed into
place, with its length and CRC32C kept in memory and checked on every read (a mismatch is a
miss). Files of an earlier run are deleted at start (as Aiven's plugin does): their index is
in memory only, and a cache that starts empty never serves a chunk it cannot vouch for.
Only files named like ours are deleted; anything else in the directory is left alone. One
cache per directory.

Prefetch: ``prefetch`` schedules loads on a pool of ``chunk.cache.prefetch.threads``
threads, at most ``chunk.cache.prefetch.queue.size`` waiting for a busy pool (the excess is
dropped). W-TinyLFU is scan resistant: a chunk seen once rarely displaces chunks seen
several times, which would defeat read-ahead, so prefetched chunks are also kept, outside
the tiers' policies, until their reader has moved two chunks further in the object (up to
``chunk.cache.prefetch.hold.size`` bytes, oldest dropped first); so are chunks loaded for a
``get``, which a sequential reader reads again in its next fetch. A ``get`` that finds a prefetch waiting in the queue runs the
load itself rather than waiting behind other prefetches.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import crc32c

from strata.common.files import TMP_SUFFIX, atomic_write
from strata.common.tinylfu import ByteWeightedTinyLfu
from strata.tiered.storage.chunks import DEFAULT_CHUNK_SIZE

__all__ = [
    "ChunkCache", "ChunkCacheConfig", "ChunkKey", "Loader",
    "MEMORY_SIZE_CONFIG", "DISK_SIZE_CONFIG", "DISK_PATH_CONFIG", "PREFETCH_THREADS_CONFIG",
    "PREFETCH_QUEUE_SIZE_CONFIG", "PREFETCH_HOLD_SIZE_CONFIG",
]

log = logging.getLogger(__name__)

ChunkKey = tuple[str, int]
Loader = Callable[[], bytes]

MEMORY_SIZE_CONFIG = "chunk.cache.memory.size"
DISK_SIZE_CONFIG = "chunk.cache.disk.size"
DISK_PATH_CONFIG = "chunk.cache.disk.path"
PREFETCH_THREADS_CONFIG = "chunk.cache.prefetch.threads"
PREFETCH_QUEUE_SIZE_CONFIG = "chunk.cache.prefetch.queue.size"
PREFETCH_HOLD_SIZE_CONFIG = "chunk.cache.prefetch.hold.size"
CHUNK_SIZE_CONFIG = "chunk.size"       # the RSM's chunk size: sizes the policies' slots
SLOTS_PER_CHUNK = 64                   # a chunk of chunk.size weighs at most this many slots

CHUNK_SUFFIX = ".chunk"
_OUR_FILE = re.compile(r"^[0-9a-f]{32}-[0-9]+" + re.escape(CHUNK_SUFFIX)
                       + "(" + re.escape(TMP_SUFFIX) + ")?$")

V = TypeVar("V")


# ---- configuration -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkCacheConfig:
    """The cache's settings; :meth:`from_mapping` reads them from the RSM's configuration.

    ``memory_size`` / ``disk_size``: byte budgets of the tiers, 0 disables a tier (the disk
    tier then needs ``disk_path``). ``prefetch_threads``: loader threads for ``prefetch``
    (0 disables prefetching). ``prefetch_queue_size``: prefetches that may wait while every
    prefetch thread is busy; more are dropped. ``prefetch_hold_size``: bytes of chunks held for
    a sequential reader until it has moved on (0 holds none: chunks then live only in the
    tiers, if their policies admit them); it should exceed the read-ahead window by a few chunks.
    ``chunk_size``: the chunk size most values have (0: unknown). A tier's policy weighs keys in
    slots of at least ``chunk_size / SLOTS_PER_CHUNK`` bytes, so admitting a chunk costs the same
    whatever the tier's size (a 16 MiB tier with 1 KiB slots made a 4 MiB chunk 4096 policy
    keys). :meth:`from_mapping` takes the RSM's ``chunk.size`` (default 4 MiB).
    """

    memory_size: int = 256 << 20
    disk_size: int = 0
    disk_path: Path | None = None
    prefetch_threads: int = 8
    prefetch_queue_size: int = 16
    prefetch_hold_size: int = 64 << 20
    chunk_size: int = 0

    def __post_init__(self) -> None:
        for name, key in (("memory_size", MEMORY_SIZE_CONFIG), ("disk_size", DISK_SIZE_CONFIG),
                          ("prefetch_threads", PREFETCH_THREADS_CONFIG),
                          ("prefetch_queue_size", PREFETCH_QUEUE_SIZE_CONFIG),
                          ("prefetch_hold_size", PREFETCH_HOLD_SIZE_CONFIG),
                          ("chunk_size", CHUNK_SIZE_CONFIG)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative integer, not {value!r}")
        if self.prefetch_threads > 1024:
            raise ValueError(f"{PREFETCH_THREADS_CONFIG} must be at most 1024, "
                             f"not {self.prefetch_threads}")
        if self.disk_path is not None and not isinstance(self.disk_path, Path):
            object.__setattr__(self, "disk_path", Path(self.disk_path))
        if self.disk_size > 0 and self.disk_path is None:
            raise ValueError(f"{DISK_PATH_CONFIG} is required when {DISK_SIZE_CONFIG} is set "
                             f"({self.disk_size})")

    @property
    def enabled(self) -> bool:
        """Whether any tier is on."""
        return self.memory_size > 0 or self.disk_size > 0

    @classmethod
    def from_mapping(cls, configs: Mapping[str, Any]) -> ChunkCacheConfig:
        """The settings in ``configs`` (the ``rsm.config.``-stripped RSM keys; other keys are
        ignored). Values may be ints or decimal strings. Raises ValueError naming the key."""
        d = cls()
        path = configs.get(DISK_PATH_CONFIG)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"{DISK_PATH_CONFIG} must be a path, not {path!r}")
        if isinstance(path, str):
            path = path.strip() or None
        return cls(
            memory_size=_non_negative_int(configs, MEMORY_SIZE_CONFIG, d.memory_size),
            disk_size=_non_negative_int(configs, DISK_SIZE_CONFIG, d.disk_size),
            disk_path=Path(path) if path is not None else None,
            prefetch_threads=_non_negative_int(configs, PREFETCH_THREADS_CONFIG,
                                               d.prefetch_threads),
            prefetch_queue_size=_non_negative_int(configs, PREFETCH_QUEUE_SIZE_CONFIG,
                                                  d.prefetch_queue_size),
            prefetch_hold_size=_non_negative_int(configs, PREFETCH_HOLD_SIZE_CONFIG,
                                                d.prefetch_hold_size),
            chunk_size=_non_negative_int(configs, CHUNK_SIZE_CONFIG, DEFAULT_CHUNK_SIZE))

    @property
    def min_slot_bytes(self) -> int:
        """The smallest policy slot of a tier (see ``chunk_size``)."""
        return max(1, self.chunk_size // SLOTS_PER_CHUNK)


def _non_negative_int(configs: Mapping[str, Any], key: str, default: int) -> int:
    value = configs.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a non-negative integer, not {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        n = int(value)
    else:
        raise ValueError(f"{key} must be a non-negative integer, not {value!r}")
    if n < 0:
        raise ValueError(f"{key} must be a non-negative integer, not {n}")
    return n


# ---- internals ---------------------------------------------------------------------------------

class _Tier(Generic[V]):
    """The values of one tier, their W-TinyLFU policy and a per-object index of chunk ids.
    Not thread-safe: the cache's lock guards it."""

    def __init__(self, name: str, capacity_bytes: int, min_slot_bytes: int = 1) -> None:
        self.name = name
        self.policy: ByteWeightedTinyLfu[ChunkKey] = ByteWeightedTinyLfu(
            capacity_bytes, min_slot_bytes=min_slot_bytes)
        self.values: dict[ChunkKey, V] = {}
        self.by_object: dict[str, set[int]] = {}
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.policy.capacity_bytes > 0

    @property
    def size_bytes(self) -> int:
        return self.policy.weighted_bytes

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def get(self, key: ChunkKey) -> V | None:
        """The value (recording a hit with the policy), or None."""
        value = self.values.get(key)
        if value is not None:
            self.policy.touch(key)
        return value

    def put(self, key: ChunkKey, value: V, weight: int) -> list[V]:
        """Offer ``value``; returns the values dropped: the evicted ones, ``value`` itself if
        not admitted, and the value it replaces."""
        replaced = self.pop(key)
        evicted_keys = self.policy.admit(key, weight)
        if key not in evicted_keys:
            self.values[key] = value
            self.by_object.setdefault(key[0], set()).add(key[1])
        evicted: list[V] = [replaced] if replaced is not None else []
        for k in evicted_keys:
            self.evictions += 1
            old = self._unlink(k) if k != key else value
            if old is not None:
                evicted.append(old)
        return evicted

    def pop(self, key: ChunkKey) -> V | None:
        if key not in self.values:
            return None
        self.policy.remove(key)
        return self._unlink(key)

    def pop_object(self, object_key: str) -> list[V]:
        return [v for cid in list(self.by_object.get(object_key, ()))
                if (v := self.pop((object_key, cid))) is not None]

    def clear(self) -> list[V]:
        values = list(self.values.values())
        self.policy.clear()
        self.values.clear()
        self.by_object.clear()
        return values

    def _unlink(self, key: ChunkKey) -> V | None:
        value = self.values.pop(key, None)
        ids = self.by_object.get(key[0])
        if ids is not None:
            ids.discard(key[1])
            if not ids:
                del self.by_object[key[0]]
        return value


class _DiskEntry:
    """A chunk's file; ``ready`` once written (readers skip it before)."""

    __slots__ = ("path", "size", "crc", "ready")

    def __init__(self, path: Path, size: int, crc: int) -> None:
        self.path = path
        self.size = size
        self.crc = crc
        self.ready = False


_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class _Flight:
    """One load of one chunk, shared by every request that arrives while it runs."""

    __slots__ = ("state", "prefetch", "read", "detached", "done", "data", "error")

    def __init__(self, state: int, prefetch: bool) -> None:
        self.state = state
        self.prefetch = prefetch      # started by prefetch() and not taken over by a get()
        self.read = not prefetch      # a get() waits for it
        self.detached = False         # invalidated or closed: the result is not cached
        self.done = threading.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None

    def result(self) -> bytes:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.data is not None
        return self.data


class _DiskCorrupt(Exception):
    pass


# ---- the cache -----------------------------------------------------------------------------------

class ChunkCache:
    """Chunks of remote ``.log`` objects cached in memory and on disk (see the module doc).

    Thread-safe: every method may be called from any thread. One lock guards the cache's
    state; it is never held while a loader runs or a file is read, written or deleted.
    """

    def __init__(self, config: ChunkCacheConfig | None = None) -> None:
        config = config if config is not None else ChunkCacheConfig()
        self.config = config
        self._lock = threading.Lock()       # guards every field below
        self._memory: _Tier[bytes] = _Tier("memory", config.memory_size, config.min_slot_bytes)
        self._disk: _Tier[_DiskEntry] = _Tier("disk", config.disk_size, config.min_slot_bytes)
        # prefetched chunks held outside the tiers' policies, and those of them already read
        self._staged: OrderedDict[ChunkKey, bytes] = OrderedDict()
        self._staged_read: set[ChunkKey] = set()
        self._staged_bytes = 0
        self._flights: dict[ChunkKey, _Flight] = {}
        self._detached_runs = 0             # loads invalidated while they ran, not yet ended
        self._queued = 0                    # prefetch flights waiting for a pool thread
        self._prefetching = 0               # prefetch flights running on a pool thread
        self._closed = False
        self._file_seq = itertools.count()
        self._counts = dict.fromkeys(
            ("hits_memory", "hits_disk", "misses", "loads", "load_errors", "disk_errors",
             "prefetch_requested", "prefetch_dropped", "prefetch_hits"), 0)
        self.disk_dir = config.disk_path if config.disk_size > 0 else None
        if self.disk_dir is not None:
            self._reset_disk_dir(self.disk_dir)
        self._pool = (ThreadPoolExecutor(config.prefetch_threads,
                                         thread_name_prefix="chunk-prefetch")
                      if config.prefetch_threads > 0 else None)

    @classmethod
    def from_config(cls, configs: Mapping[str, Any]) -> ChunkCache | None:
        """A cache configured from the RSM's (``rsm.config.``-stripped) keys, or None when
        both tiers are disabled. Raises ValueError naming the offending key."""
        config = ChunkCacheConfig.from_mapping(configs)
        return cls(config) if config.enabled else None

    # ---- reads -----------------------------------------------------------------------------

    def get(self, key: ChunkKey, loader: Loader) -> bytes:
        """The chunk's bytes: from the cache, or from ``loader`` (called at most once for
        concurrent requests of ``key``; its exception reaches each of them and is not cached)."""
        while True:
            with self._lock:
                if self._closed:
                    break
                data = self._cached(key)
                if data is not None:
                    return data
                flight = self._flights.get(key)
                if flight is not None:
                    self._counts["misses"] += 1
                    if flight.state == _QUEUED:     # take it over: don't queue behind others
                        flight.state = _RUNNING
                        flight.prefetch, flight.read = False, True
                        self._queued -= 1
                        lead = True
                    else:
                        if flight.prefetch and not flight.read:
                            self._counts["prefetch_hits"] += 1
                        flight.read = True
                        lead = False
                    disk_entry = None
                else:
                    disk_entry = self._disk.get(key)
                    if disk_entry is not None and not disk_entry.ready:
                        disk_entry = None
                    if disk_entry is None:
                        self._counts["misses"] += 1
                        flight = self._flights[key] = _Flight(_RUNNING, prefetch=False)
                        lead = True
            if disk_entry is not None:
                data = self._read_disk(key, disk_entry)
                if data is None:
                    continue        # gone or corrupt: look again (and load)
                return data
            assert flight is not None
            return self._run(key, flight, loader) if lead else flight.result()
        return _checked(loader())   # closed: no caching

    def _cached(self, key: ChunkKey) -> bytes | None:
        """A prefetched or memory-cached chunk, counted as a hit. Holds ``_lock``."""
        data = self._staged.get(key)
        if data is not None:
            self._counts["hits_memory"] += 1
            if key not in self._staged_read:
                self._staged_read.add(key)
                self._counts["prefetch_hits"] += 1
                if key in self._memory:
                    self._memory.policy.touch(key)
                elif self._memory.enabled:
                    self._memory.put(key, data, len(data))
                self._unstage_passed(key)
            return data
        data = self._memory.get(key)
        if data is not None:
            self._counts["hits_memory"] += 1
        return data

    def _read_disk(self, key: ChunkKey, entry: _DiskEntry) -> bytes | None:
        """The chunk read from ``entry``'s file and promoted to memory, or None (the entry
        is dropped) when the file is missing or does not hold what was written."""
        try:
            with open(entry.path, "rb") as f:
                data = f.read()
            if len(data) != entry.size or crc32c.crc32c(data) != entry.crc:
                raise _DiskCorrupt(f"{len(data)} bytes, expected {entry.size} with crc "
                                   f"{entry.crc:#010x}")
        except (OSError, _DiskCorrupt) as exc:
            with self._lock:
                mine = self._disk.values.get(key) is entry
                if mine:
                    self._disk.pop(key)
                    self._counts["disk_errors"] += 1
            if mine:
                log.warning("dropping cached chunk %s (%s): %s", key, entry.path, exc)
                _unlink(entry.path)
            return None
        with self._lock:
            self._counts["hits_disk"] += 1
            if not self._closed and self._disk.values.get(key) is entry and \
                    self._memory.enabled and key not in self._memory:
                self._memory.put(key, data, len(data))
        return data

    def _run(self, key: ChunkKey, flight: _Flight, loader: Loader) -> bytes:
        """Load ``key`` for ``flight`` (this thread leads it), cache and publish the result."""
        try:
            data = _checked(loader())
        except BaseException as exc:
            with self._lock:
                self._counts["loads"] += 1
                self._counts["load_errors"] += 1
                self._end_run(key, flight)
            flight.error = exc
            flight.state = _DONE
            flight.done.set()
            raise
        disk_entry: _DiskEntry | None = None
        doomed: list[Path] = []
        crc = crc32c.crc32c(data) if self._disk.enabled else 0     # not under the lock
        with self._lock:
            self._counts["loads"] += 1
            if not flight.detached:
                if self._memory.enabled:
                    self._memory.put(key, data, len(data))
                # held until its reader moves past it, whatever the memory tier admits
                self._stage(key, data)
                if flight.read:
                    if key in self._staged:
                        self._staged_read.add(key)
                    self._unstage_passed(key)
                if self._disk.enabled and self.disk_dir is not None:
                    disk_entry = self._new_disk_entry(key, len(data), crc)
                    doomed += [e.path for e in self._disk.put(key, disk_entry, len(data))
                               if e is not disk_entry]
                    if key not in self._disk:
                        disk_entry = None       # not admitted: nothing to write
        flight.data = data
        flight.state = _DONE
        flight.done.set()       # waiters go on; the flight stays registered until written
        try:
            if disk_entry is not None:
                try:
                    atomic_write(disk_entry.path, data, sync=False)
                    written = True
                except OSError as exc:
                    log.warning("could not cache chunk %s in %s: %s", key, disk_entry.path, exc)
                    written = False
                with self._lock:
                    if self._disk.values.get(key) is disk_entry:
                        if written:
                            disk_entry.ready = True
                        else:
                            self._disk.pop(key)
                            self._counts["disk_errors"] += 1
                            doomed.append(disk_entry.path)
                    else:                       # evicted or invalidated while written
                        doomed.append(disk_entry.path)
        finally:
            for path in doomed:     # before the flight ends: in_flight 0 means files settled
                _unlink(path)
            with self._lock:
                self._end_run(key, flight)
        return data

    def _end_run(self, key: ChunkKey, flight: _Flight) -> None:
        """A load's end: its flight leaves, unless invalidate took it already. Holds ``_lock``."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        else:
            self._detached_runs -= 1

    def _stage(self, key: ChunkKey, data: bytes) -> None:
        """Hold a prefetched chunk until its reader has moved past it (a sequential reader
        reads a chunk in several fetches), oldest dropped first. Holds ``_lock``."""
        limit = self.config.prefetch_hold_size
        if len(data) > limit:
            return
        self._unstage(key)
        self._staged[key] = data
        self._staged_bytes += len(data)
        while self._staged_bytes > limit:
            self._unstage(next(iter(self._staged)))

    def _unstage(self, key: ChunkKey) -> None:
        """Holds ``_lock``."""
        data = self._staged.pop(key, None)
        if data is not None:
            self._staged_bytes -= len(data)
            self._staged_read.discard(key)

    def _unstage_passed(self, key: ChunkKey) -> None:
        """Release the held chunks of ``key``'s object that were read and lie more than one
        chunk before it: a fetch that reads into ``key`` may return less than it read, and the
        next fetch then starts in the chunk before. Holds ``_lock``."""
        for k in [k for k in self._staged_read if k[0] == key[0] and k[1] < key[1] - 1]:
            self._unstage(k)

    def _new_disk_entry(self, key: ChunkKey, size: int, crc: int) -> _DiskEntry:
        """A new file name for ``key``: never reused, so a late delete of an evicted file
        can never hit a newer copy. Holds ``_lock``."""
        assert self.disk_dir is not None
        name = f"{_key_digest(key)}-{next(self._file_seq)}{CHUNK_SUFFIX}"
        return _DiskEntry(self.disk_dir / name, size, crc)

    # ---- prefetch --------------------------------------------------------------------------

    def prefetch(self, items: Iterable[tuple[ChunkKey, Loader]]) -> None:
        """Load the chunks not cached nor in flight in the background; never raises for a
        load. When every prefetch thread is busy and ``chunk.cache.prefetch.queue.size``
        loads wait for one, further requests are dropped. Errors are logged (debug) and not
        cached."""
        items = list(items)
        start: list[tuple[ChunkKey, _Flight, Loader]] = []
        with self._lock:
            for key, loader in items:
                self._counts["prefetch_requested"] += 1
                if self._closed or self._pool is None:
                    self._counts["prefetch_dropped"] += 1
                    continue
                if key in self._staged or key in self._memory or key in self._flights or \
                        key in self._disk:
                    continue
                if self._queued + self._prefetching >= \
                        self.config.prefetch_threads + self.config.prefetch_queue_size:
                    self._counts["prefetch_dropped"] += 1
                    continue
                flight = self._flights[key] = _Flight(_QUEUED, prefetch=True)
                self._queued += 1
                start.append((key, flight, loader))
        for key, flight, loader in start:
            try:
                assert self._pool is not None
                self._pool.submit(self._prefetch_task, key, flight, loader)
            except RuntimeError:        # the pool shut down meanwhile
                with self._lock:
                    if flight.state == _QUEUED:
                        self._cancel(key, flight)
                        self._counts["prefetch_dropped"] += 1

    def _prefetch_task(self, key: ChunkKey, flight: _Flight, loader: Loader) -> None:
        with self._lock:
            if flight.state != _QUEUED:     # taken over by a get(), invalidated or closed
                return
            flight.state = _RUNNING
            self._queued -= 1
            self._prefetching += 1
        try:
            self._run(key, flight, loader)
        except Exception as exc:  # noqa: BLE001 - a prefetch is best effort
            log.debug("prefetch of chunk %s failed: %r", key, exc)
        finally:
            with self._lock:
                self._prefetching -= 1

    def _cancel(self, key: ChunkKey, flight: _Flight) -> None:
        """Drop a queued prefetch (nobody waits on one). Holds ``_lock``."""
        flight.state = _CANCELLED
        flight.detached = True
        self._queued -= 1
        if self._flights.get(key) is flight:
            del self._flights[key]

    # ---- changes ---------------------------------------------------------------------------

    def invalidate(self, object_key: str) -> None:
        """Drop every chunk of ``object_key`` (its segment was deleted): from memory, disk
        and the prefetched chunks; loads in flight finish for their waiters but are not cached,
        and later requests start afresh."""
        with self._lock:
            self._memory.pop_object(object_key)
            files = [e.path for e in self._disk.pop_object(object_key)]
            for key in [k for k in self._staged if k[0] == object_key]:
                self._unstage(key)
            for key, flight in [(k, f) for k, f in self._flights.items() if k[0] == object_key]:
                if flight.state == _QUEUED:
                    self._cancel(key, flight)
                else:
                    flight.detached = True
                    del self._flights[key]
                    self._detached_runs += 1    # its _run still writes or deletes a file
        for path in files:
            _unlink(path)

    def close(self) -> None:
        """Stop prefetching (queued prefetches are cancelled, running ones finish) and drop
        the memory contents. Later ``get`` calls go straight to their loader. The disk files
        stay until the next start clears them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for key, flight in list(self._flights.items()):
                if flight.state == _QUEUED:
                    self._cancel(key, flight)
                else:
                    flight.detached = True
            self._memory.clear()
            self._staged.clear()
            self._staged_read.clear()
            self._staged_bytes = 0
            self._disk.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        log.info("closed the chunk cache: %s", self.stats())

    def __enter__(self) -> ChunkCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- statistics --------------------------------------------------------------------------

    # the keys of ``stats`` that are levels (gauges); the others only grow (counters)
    LEVEL_STATS = frozenset({"memory_bytes", "memory_entries", "disk_bytes", "disk_entries",
                             "prefetch_bytes", "prefetch_entries", "prefetch_queued",
                             "prefetch_running", "in_flight"})

    def stats(self) -> dict[str, int]:
        """A consistent snapshot of the counters and sizes.

        ``hits_memory`` / ``hits_disk``: ``get`` calls served by a tier (a prefetched chunk's
        first read counts as a memory hit); ``misses``: ``get`` calls that waited for a load
        (led it or joined it); ``loads`` / ``load_errors``: loader calls and those that
        raised; ``prefetch_hits``: ``get`` calls served by a prefetch (its kept chunk, or by
        joining it while it ran); ``prefetch_requested`` / ``prefetch_dropped``: chunks
        offered to ``prefetch`` and those refused for a full queue (or a closed cache);
        ``prefetch_queued`` / ``prefetch_running``: prefetches waiting for / on a thread;
        ``in_flight``: loads under way, invalidated ones included (a finished load stays until
        its file, and the files it evicted, are written or deleted);
        ``*_evictions``: chunks the tier's policy dropped or did not admit; ``disk_errors``:
        chunk files that failed to write or read back; ``*_bytes`` / ``*_entries``: contents
        (``prefetch_*``: the chunks held for their readers, prefetched or just loaded).
        """
        with self._lock:
            out = dict(self._counts)
            out.update(
                memory_evictions=self._memory.evictions,
                memory_bytes=self._memory.size_bytes,
                memory_entries=len(self._memory.values),
                disk_evictions=self._disk.evictions,
                disk_bytes=self._disk.size_bytes,
                disk_entries=len(self._disk.values),
                prefetch_bytes=self._staged_bytes,
                prefetch_entries=len(self._staged),
                prefetch_queued=self._queued,
                prefetch_running=self._prefetching,
                in_flight=len(self._flights) + self._detached_runs,
            )
            return out

    # ---- disk directory ----------------------------------------------------------------------

    @staticmethod
    def _reset_disk_dir(directory: Path) -> None:
        """Create the directory, delete the chunk files an earlier run left in it. Raises
        ValueError naming the key when the directory cannot be used."""
        removed = 0
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for path in directory.iterdir():
                if _OUR_FILE.match(path.name):
                    path.unlink(missing_ok=True)
                    removed += 1
        except OSError as exc:
            raise ValueError(f"{DISK_PATH_CONFIG} {str(directory)!r} is not a usable "
                             f"directory: {exc}") from exc
        if removed:
            log.info("deleted %d chunk files of an earlier run from %s", removed, directory)


def _checked(data: Any) -> bytes | memoryview:
    if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
        return data     # immutable: cached and handed out as it is
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"a chunk loader returned {type(data).__name__}, not bytes")


def _key_digest(key: ChunkKey) -> str:
    object_key, chunk_id = key
    raw = object_key.encode("utf-8", "surrogatepass") + b"\0" + str(chunk_id).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not delete the cached chunk file %s: %s", path, exc)
