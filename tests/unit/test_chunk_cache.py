"""ChunkCache: remote ``.log`` chunks cached in memory and on disk, single-flight loads and
a bounded prefetch pool; and the byte-weighted W-TinyLFU policy it shares with the remote
index cache.

Concurrency is made deterministic with events: loaders block until the test has seen the
state it wants (``eventually`` polls the cache's counters with a generous deadline; nothing
asserts on time).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata.common.tinylfu import ByteWeightedTinyLfu
from strata.tiered.storage.chunk_cache import (
    CHUNK_SUFFIX, DISK_PATH_CONFIG, DISK_SIZE_CONFIG, MEMORY_SIZE_CONFIG,
    PREFETCH_HOLD_SIZE_CONFIG, PREFETCH_QUEUE_SIZE_CONFIG, PREFETCH_THREADS_CONFIG, ChunkCache,
    ChunkCacheConfig)
from support.waiting import eventually

OBJ = "orders-AAAAAAAAAAAAAAAAAAAAAA/3/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
OTHER = "orders-AAAAAAAAAAAAAAAAAAAAAA/3/00000000000000000100-CCCCCCCCCCCCCCCCCCCCCC.log"


def content(key: tuple[str, int], size: int = 4096) -> bytes:
    """Deterministic, key-specific bytes."""
    seed = hashlib.sha256(f"{key[0]}#{key[1]}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Loaders:
    """Counting loaders: ``calls[key]`` loader calls per key."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.calls: Counter = Counter()
        self._lock = threading.Lock()

    def __call__(self, key, *, gate: threading.Event | None = None,
                 started: threading.Event | None = None, error: BaseException | None = None):
        def load() -> bytes:
            with self._lock:
                self.calls[key] += 1
            if started is not None:
                started.set()
            if gate is not None:
                assert gate.wait(10), "the test never released the loader"
            if error is not None:
                raise error
            return content(key, self.size)
        return load


def failing(key) -> bytes:
    raise AssertionError(f"unexpected load of {key}")


def run_threads(n: int, target) -> list:
    """Run ``target(i)`` on n threads; returns their results (exceptions as values)."""
    results: list = [None] * n

    def wrap(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    return results


def chunk_files(cache: ChunkCache) -> list[Path]:
    assert cache.disk_dir is not None
    return sorted(p for p in cache.disk_dir.iterdir() if p.name.endswith(CHUNK_SUFFIX))


@pytest.fixture
def caches():
    made: list[ChunkCache] = []

    def make(**kwargs) -> ChunkCache:
        cache = ChunkCache(ChunkCacheConfig(**kwargs))
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


# ---- single flight ---------------------------------------------------------------------------

def test_ten_concurrent_readers_of_a_cold_chunk_cause_one_load_and_get_the_same_bytes(caches):
    cache = caches()
    loaders = Loaders()
    key = (OBJ, 0)
    gate = threading.Event()
    barrier = threading.Barrier(10)

    def read(i: int) -> bytes:
        barrier.wait()
        return cache.get(key, loaders(key, gate=gate))

    releaser = threading.Thread(target=lambda: (
        eventually(lambda: cache.stats()["misses"] == 10, "all ten readers wait"), gate.set()))
    releaser.start()
    results = run_threads(10, read)
    releaser.join()
    assert results == [content(key)] * 10
    assert loaders.calls[key] == 1
    stats = cache.stats()
    assert (stats["loads"], stats["misses"], stats["hits_memory"]) == (1, 10, 0)
    assert cache.get(key, lambda: failing(key)) == content(key)
    assert cache.stats()["hits_memory"] == 1


def test_a_loader_error_reaches_every_waiter_and_the_next_get_retries(caches):
    cache = caches()
    loaders = Loaders()
    key = (OBJ, 7)
    gate = threading.Event()
    boom = OSError("remote store unavailable")

    def read(i: int) -> bytes:
        return cache.get(key, loaders(key, gate=gate, error=boom))

    releaser = threading.Thread(target=lambda: (
        eventually(lambda: cache.stats()["misses"] == 5, "all five readers wait"), gate.set()))
    releaser.start()
    results = run_threads(5, read)
    releaser.join()
    assert all(r is boom for r in results)
    assert loaders.calls[key] == 1
    assert cache.stats()["load_errors"] == 1 and cache.stats()["in_flight"] == 0
    assert cache.get(key, loaders(key)) == content(key)
    assert loaders.calls[key] == 2
    assert cache.get(key, lambda: failing(key)) == content(key)


def test_a_loader_returning_something_other_than_bytes_is_an_error(caches):
    cache = caches()
    with pytest.raises(TypeError):
        cache.get((OBJ, 0), lambda: 42)
    assert cache.get((OBJ, 0), lambda: bytearray(b"abc")) == b"abc"


# ---- tiers -----------------------------------------------------------------------------------

def test_memory_eviction_respects_the_byte_bound_and_evicted_chunks_come_from_disk(
        caches, tmp_path):
    chunk = 4096
    capacity = 5 * chunk
    cache = caches(memory_size=capacity, disk_size=1 << 20, disk_path=tmp_path / "chunks")
    loaders = Loaders(chunk)
    keys = [(OBJ, i) for i in range(24)]
    for _ in range(2):
        for key in keys:
            assert cache.get(key, loaders(key)) == content(key, chunk)
            stats = cache.stats()
            assert stats["memory_bytes"] <= capacity
            assert stats["memory_entries"] * chunk == stats["memory_bytes"]
    stats = cache.stats()
    assert stats["memory_evictions"] > 0
    assert all(n == 1 for n in loaders.calls.values())   # the second pass never loads
    assert stats["hits_disk"] > 0
    assert stats["disk_entries"] == len(keys) == len(chunk_files(cache))
    for key in keys:
        assert cache.get(key, lambda: failing(key)) == content(key, chunk)


def test_disk_files_survive_memory_eviction_and_read_back_identical(caches, tmp_path):
    cache = caches(memory_size=0, disk_size=1 << 20, disk_path=tmp_path, prefetch_hold_size=0)
    sizes = [1, 4096, 10_000, 65_536]
    loaders = {i: (lambda i=i: content((OBJ, i), sizes[i])) for i in range(len(sizes))}
    for i in range(len(sizes)):
        cache.get((OBJ, i), loaders[i])
    files = chunk_files(cache)
    assert sorted(p.stat().st_size for p in files) == sorted(sizes)
    assert {p.read_bytes() for p in files} == {content((OBJ, i), s) for i, s in enumerate(sizes)}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    for i, size in enumerate(sizes):
        assert cache.get((OBJ, i), lambda: failing(i)) == content((OBJ, i), size)
    stats = cache.stats()
    assert (stats["hits_disk"], stats["loads"], stats["disk_bytes"]) == (4, 4, sum(sizes))


def test_a_corrupt_or_missing_chunk_file_is_loaded_again(caches, tmp_path):
    cache = caches(memory_size=0, disk_size=1 << 20, disk_path=tmp_path, prefetch_hold_size=0)
    loaders = Loaders()
    a, b = (OBJ, 0), (OBJ, 1)
    cache.get(a, loaders(a))
    cache.get(b, loaders(b))
    by_content = {p.read_bytes(): p for p in chunk_files(cache)}
    corrupt = bytearray(content(a))
    corrupt[100] ^= 0xFF
    by_content[content(a)].write_bytes(bytes(corrupt))
    by_content[content(b)].unlink()
    assert cache.get(a, loaders(a)) == content(a)
    assert cache.get(b, loaders(b)) == content(b)
    assert loaders.calls == Counter({a: 2, b: 2})
    assert cache.stats()["disk_errors"] == 2
    assert cache.get(a, lambda: failing(a)) == content(a)


def test_a_new_cache_deletes_the_chunk_files_of_an_earlier_run_and_nothing_else(tmp_path):
    first = ChunkCache(ChunkCacheConfig(disk_size=1 << 20, disk_path=tmp_path))
    loaders = Loaders()
    for i in range(3):
        first.get((OBJ, i), loaders((OBJ, i)))
    first.close()
    assert len(chunk_files(first)) == 3
    leftover_tmp = tmp_path / f"{'0' * 32}-99{CHUNK_SUFFIX}.tmp"
    leftover_tmp.write_bytes(b"half")
    foreign = tmp_path / "README"
    foreign.write_bytes(b"not ours")
    second = ChunkCache(ChunkCacheConfig(disk_size=1 << 20, disk_path=tmp_path))
    try:
        assert sorted(tmp_path.iterdir()) == [foreign]
        assert second.get((OBJ, 0), loaders((OBJ, 0))) == content((OBJ, 0))
        assert loaders.calls[(OBJ, 0)] == 2
    finally:
        second.close()


def test_a_chunk_bigger_than_a_tier_is_served_but_not_kept(caches, tmp_path):
    cache = caches(memory_size=1000, disk_size=1000, disk_path=tmp_path, prefetch_hold_size=1000)
    loaders = Loaders(4096)
    key = (OBJ, 0)
    assert cache.get(key, loaders(key)) == content(key)
    assert cache.get(key, loaders(key)) == content(key)
    assert loaders.calls[key] == 2
    stats = cache.stats()
    assert (stats["memory_bytes"], stats["disk_bytes"]) == (0, 0)
    assert chunk_files(cache) == []


# ---- prefetch --------------------------------------------------------------------------------

def test_a_prefetched_chunk_is_served_without_a_second_load_as_a_prefetch_hit(caches):
    cache = caches()
    loaders = Loaders()
    keys = [(OBJ, i) for i in range(3)]
    cache.prefetch((k, loaders(k)) for k in keys)
    eventually(lambda: cache.stats()["loads"] == 3 and cache.stats()["in_flight"] == 0,
               "the prefetches finish")
    for k in keys:
        assert cache.get(k, lambda k=k: failing(k)) == content(k)
    stats = cache.stats()
    assert (stats["prefetch_requested"], stats["prefetch_hits"], stats["loads"]) == (3, 3, 3)
    assert stats["misses"] == 0
    assert stats["prefetch_entries"] == 2    # the last two: its reader has not moved past them
    cache.prefetch([(keys[0], lambda: failing(keys[0]))])   # cached: nothing to do
    assert cache.stats()["in_flight"] == 0 and cache.stats()["prefetch_requested"] == 4


def test_prefetched_chunks_survive_a_full_memory_tier_until_read(caches):
    """A sequential reader prefetching ahead into a full memory tier: W-TinyLFU alone would
    reject chunks seen once, the kept prefetches still serve every read."""
    chunk = 4096
    cache = caches(memory_size=4 * chunk, prefetch_hold_size=8 * chunk)
    loaders = Loaders(chunk)
    for i in range(4):
        for _ in range(3):
            cache.get((OTHER, i), loaders((OTHER, i)))      # a hot working set fills memory
    for i in range(40):
        ahead = [((OBJ, j), loaders((OBJ, j))) for j in range(i + 1, i + 4)]
        if i == 0:
            cache.get((OBJ, 0), loaders((OBJ, 0)))
        cache.prefetch(ahead)
        eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetches finish")
        if i:
            assert cache.get((OBJ, i), lambda: failing(i)) == content((OBJ, i), chunk)
    assert all(n == 1 for n in loaders.calls.values())
    assert cache.stats()["prefetch_hits"] == 39


def test_a_prefetched_chunk_stays_held_until_its_reader_moves_past_it(caches):
    """A sequential reader reads a chunk in several fetches, and a fetch that read into the
    next chunk may return less, so the next fetch starts back in the chunk before: every
    chunk survives a full memory tier that rejects it until the reader is two chunks on."""
    chunk = 4096
    cache = caches(memory_size=2 * chunk, prefetch_hold_size=8 * chunk)
    loaders = Loaders(chunk)
    for i in range(2):
        for _ in range(3):
            cache.get((OTHER, i), loaders((OTHER, i)))      # a hot working set fills memory
    cache.prefetch([((OBJ, j), loaders((OBJ, j))) for j in range(4)])
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetches finish")
    for j in range(4):
        for _ in range(3):                                   # three fetches read each chunk
            assert cache.get((OBJ, j), lambda j=j: failing(j)) == content((OBJ, j), chunk)
        if j:                                                # the next fetch starts back there
            assert cache.get((OBJ, j - 1), lambda j=j: failing(j - 1)) == content((OBJ, j - 1), chunk)
    assert all(loaders.calls[(OBJ, j)] == 1 for j in range(4))
    stats = cache.stats()
    assert stats["prefetch_hits"] == 4 and stats["misses"] == 2     # the hot set's own loads
    assert stats["prefetch_entries"] == 4       # OBJ's chunks 2 and 3, OTHER's 0 and 1
    cache.get((OBJ, 5), loaders((OBJ, 5)))      # a jump: chunks 2 and 3 are passed
    assert cache.stats()["prefetch_entries"] == 3


def test_a_get_joining_a_running_prefetch_does_not_load_twice(caches):
    cache = caches()
    loaders = Loaders()
    key = (OBJ, 3)
    started, gate = threading.Event(), threading.Event()
    cache.prefetch([(key, loaders(key, started=started, gate=gate))])
    assert started.wait(10)
    reader = run_in_thread(lambda: cache.get(key, loaders(key)))
    eventually(lambda: cache.stats()["misses"] == 1, "the reader waits")
    gate.set()
    assert reader() == content(key)
    assert loaders.calls[key] == 1
    stats = cache.stats()
    assert (stats["prefetch_hits"], stats["loads"]) == (1, 1)


def run_in_thread(fn):
    """Start ``fn`` on a thread; returns a function that joins it and returns its result."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()

    def join():
        t.join(30)
        assert not t.is_alive() and out
        return out[0]
    return join


def test_the_prefetch_queue_bound_drops_the_excess(caches):
    cache = caches(prefetch_threads=1, prefetch_queue_size=2)
    loaders = Loaders()
    started, gate = threading.Event(), threading.Event()
    first = (OBJ, 0)
    cache.prefetch([(first, loaders(first, started=started, gate=gate))])
    assert started.wait(10)                  # the only thread is busy
    cache.prefetch(((OBJ, i), loaders((OBJ, i))) for i in range(1, 6))
    stats = cache.stats()
    assert (stats["prefetch_requested"], stats["prefetch_dropped"],
            stats["prefetch_queued"]) == (6, 3, 2)
    gate.set()
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetches finish")
    assert set(loaders.calls) == {(OBJ, 0), (OBJ, 1), (OBJ, 2)}
    cache.prefetch([((OBJ, 5), loaders((OBJ, 5)))])   # room again
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetch finishes")
    assert loaders.calls[(OBJ, 5)] == 1


def test_without_a_queue_prefetches_still_run_on_idle_threads(caches):
    cache = caches(prefetch_threads=2, prefetch_queue_size=0)
    loaders = Loaders()
    gate = threading.Event()
    cache.prefetch(((OBJ, i), loaders((OBJ, i), gate=gate)) for i in range(3))
    assert cache.stats()["prefetch_dropped"] == 1
    gate.set()
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetches finish")
    assert set(loaders.calls) == {(OBJ, 0), (OBJ, 1)}


def test_a_get_takes_over_a_queued_prefetch_instead_of_waiting_behind_others(caches):
    cache = caches(prefetch_threads=1, prefetch_queue_size=4)
    loaders = Loaders()
    started, gate = threading.Event(), threading.Event()
    busy, queued = (OBJ, 0), (OBJ, 1)
    cache.prefetch([(busy, loaders(busy, started=started, gate=gate))])
    assert started.wait(10)
    cache.prefetch([(queued, lambda: failing(queued))])
    assert cache.get(queued, loaders(queued)) == content(queued)   # the pool is still busy
    gate.set()
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetch finishes")
    assert loaders.calls == Counter({busy: 1, queued: 1})
    assert cache.stats()["prefetch_hits"] == 0


def test_a_failed_prefetch_does_not_poison_a_later_get(caches):
    cache = caches()
    loaders = Loaders()
    key = (OBJ, 9)
    cache.prefetch([(key, loaders(key, error=OSError("flaky")))])
    eventually(lambda: cache.stats()["load_errors"] == 1 and cache.stats()["in_flight"] == 0,
               "the prefetch fails")
    assert cache.get(key, loaders(key)) == content(key)
    assert loaders.calls[key] == 2 and cache.stats()["prefetch_hits"] == 0


# ---- invalidation and close --------------------------------------------------------------------

def test_invalidate_removes_the_memory_and_disk_entries_of_one_object(caches, tmp_path):
    cache = caches(disk_size=1 << 20, disk_path=tmp_path)
    loaders = Loaders()
    for obj in (OBJ, OTHER):
        for i in range(3):
            cache.get((obj, i), loaders((obj, i)))
    cache.prefetch([((OBJ, 3), loaders((OBJ, 3)))])
    eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetch finishes")
    assert len(chunk_files(cache)) == 7
    cache.invalidate(OBJ)
    stats = cache.stats()
    # held for their readers: the last two chunks read of OTHER; none of OBJ
    assert (stats["memory_entries"], stats["disk_entries"], stats["prefetch_entries"]) == (3, 3, 2)
    assert {p.read_bytes() for p in chunk_files(cache)} == {content((OTHER, i)) for i in range(3)}
    assert cache.get((OBJ, 0), loaders((OBJ, 0))) == content((OBJ, 0))
    assert loaders.calls[(OBJ, 0)] == 2
    assert cache.get((OTHER, 0), lambda: failing(0)) == content((OTHER, 0))
    cache.invalidate("never-cached")


def test_a_load_running_during_invalidate_is_delivered_but_not_cached(caches, tmp_path):
    cache = caches(disk_size=1 << 20, disk_path=tmp_path)
    loaders = Loaders()
    key = (OBJ, 0)
    started, gate = threading.Event(), threading.Event()
    reader = run_in_thread(lambda: cache.get(key, loaders(key, started=started, gate=gate)))
    assert started.wait(10)
    cache.invalidate(OBJ)
    gate.set()
    assert reader() == content(key)
    eventually(lambda: cache.stats()["in_flight"] == 0, "the load finishes")
    stats = cache.stats()
    assert (stats["memory_entries"], stats["disk_entries"]) == (0, 0)
    assert chunk_files(cache) == []
    cache.get(key, loaders(key))
    assert loaders.calls[key] == 2


def test_close_stops_prefetching_and_later_gets_go_to_the_loader(tmp_path):
    cache = ChunkCache(ChunkCacheConfig(prefetch_threads=1))
    loaders = Loaders()
    started, gate = threading.Event(), threading.Event()
    cache.prefetch([((OBJ, 0), loaders((OBJ, 0), started=started, gate=gate)),
                    ((OBJ, 1), lambda: failing(1))])
    assert started.wait(10)
    closer = run_in_thread(cache.close)   # waits for the running prefetch
    eventually(lambda: cache.stats()["prefetch_queued"] == 0, "the queued prefetch is cancelled")
    gate.set()
    closer()
    cache.prefetch([((OBJ, 2), lambda: failing(2))])
    assert cache.stats()["prefetch_dropped"] == 1
    assert cache.get((OBJ, 0), loaders((OBJ, 0))) == content((OBJ, 0))
    assert loaders.calls[(OBJ, 0)] == 2
    assert cache.stats()["memory_entries"] == 0
    cache.close()


# ---- configuration -------------------------------------------------------------------------------

def test_configuration_defaults_and_parsing(tmp_path):
    config = ChunkCacheConfig.from_mapping({"unrelated.key": "x"})
    assert (config.memory_size, config.disk_size, config.disk_path) == (256 << 20, 0, None)
    assert (config.prefetch_threads, config.prefetch_queue_size,
            config.prefetch_hold_size, config.chunk_size) == (8, 16, 64 << 20, 4 << 20)
    config = ChunkCacheConfig.from_mapping({
        MEMORY_SIZE_CONFIG: "1048576", DISK_SIZE_CONFIG: " 2097152 ",
        DISK_PATH_CONFIG: str(tmp_path), PREFETCH_THREADS_CONFIG: 2,
        PREFETCH_QUEUE_SIZE_CONFIG: "0", PREFETCH_HOLD_SIZE_CONFIG: "0", "chunk.size": "65536"})
    assert config == ChunkCacheConfig(1 << 20, 2 << 20, tmp_path, 2, 0, 0, 65536)
    assert ChunkCache.from_config({MEMORY_SIZE_CONFIG: 0}) is None
    cache = ChunkCache.from_config({MEMORY_SIZE_CONFIG: 0, DISK_SIZE_CONFIG: 4096,
                                    DISK_PATH_CONFIG: str(tmp_path / "new" / "dir")})
    assert cache is not None and (tmp_path / "new" / "dir").is_dir()
    cache.close()


@pytest.mark.parametrize("memory_size", [16 << 20, 256 << 20, 4 << 30])
def test_a_chunk_weighs_at_most_64_policy_slots_whatever_the_tier_size(memory_size):
    config = ChunkCacheConfig.from_mapping({MEMORY_SIZE_CONFIG: memory_size, "chunk.size": 4 << 20})
    cache = ChunkCache(config)
    try:
        cache.get((OBJ, 0), lambda: bytes(4 << 20))
        assert len(cache._memory.policy._slots[(OBJ, 0)]) <= 64
    finally:
        cache.close()
    assert ChunkCacheConfig().min_slot_bytes == 1     # chunk size unknown: the finest split


@pytest.mark.parametrize("configs, key", [
    ({MEMORY_SIZE_CONFIG: "-1"}, MEMORY_SIZE_CONFIG),
    ({MEMORY_SIZE_CONFIG: "256MiB"}, MEMORY_SIZE_CONFIG),
    ({MEMORY_SIZE_CONFIG: True}, MEMORY_SIZE_CONFIG),
    ({DISK_SIZE_CONFIG: 1.5}, DISK_SIZE_CONFIG),
    ({DISK_SIZE_CONFIG: "1024"}, DISK_PATH_CONFIG),
    ({DISK_SIZE_CONFIG: "1024", DISK_PATH_CONFIG: "  "}, DISK_PATH_CONFIG),
    ({DISK_PATH_CONFIG: 12}, DISK_PATH_CONFIG),
    ({PREFETCH_THREADS_CONFIG: "four"}, PREFETCH_THREADS_CONFIG),
    ({PREFETCH_THREADS_CONFIG: "100000"}, PREFETCH_THREADS_CONFIG),
    ({PREFETCH_QUEUE_SIZE_CONFIG: -3}, PREFETCH_QUEUE_SIZE_CONFIG),
    ({PREFETCH_HOLD_SIZE_CONFIG: "x"}, PREFETCH_HOLD_SIZE_CONFIG),
])
def test_invalid_configuration_names_the_key(configs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ChunkCache.from_config(configs)


def test_an_unusable_disk_path_names_the_key(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(ValueError, match=r"chunk\.cache\.disk\.path"):
        ChunkCache.from_config({DISK_SIZE_CONFIG: 4096, DISK_PATH_CONFIG: str(not_a_dir)})


# ---- concurrent mixed use ------------------------------------------------------------------------

@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), disk=st.booleans())
def test_concurrent_mixed_get_prefetch_invalidate_never_returns_wrong_bytes(tmp_path, seed, disk):
    chunk = 1024
    directory = tmp_path / f"run-{seed}-{disk}"
    cache = ChunkCache(ChunkCacheConfig(
        memory_size=6 * chunk, disk_size=10 * chunk if disk else 0,
        disk_path=directory if disk else None, prefetch_threads=2, prefetch_queue_size=3,
        prefetch_hold_size=3 * chunk))
    objects = [f"topic/{i}.log" for i in range(3)]
    keys = [(o, c) for o in objects for c in range(6)]
    flaky = OSError("flaky")

    def loader(key, rnd):
        fail = rnd.random() < 0.1
        size = chunk - (key[1] * 7)   # per-chunk sizes: a wrong chunk has the wrong length too

        def load() -> bytes:
            if fail:
                raise flaky
            return content(key, size)
        return load

    def worker(i: int) -> int:
        rnd = random.Random(seed * 31 + i)
        served = 0
        for _ in range(120):
            op = rnd.random()
            if op < 0.6:
                key = rnd.choice(keys)
                try:
                    data = cache.get(key, loader(key, rnd))
                except OSError as exc:
                    assert exc is flaky
                    continue
                assert data == content(key, chunk - key[1] * 7), f"wrong bytes for {key}"
                served += 1
            elif op < 0.9:
                cache.prefetch([(k, loader(k, rnd)) for k in rnd.sample(keys, 3)])
            else:
                cache.invalidate(rnd.choice(objects))
        return served

    try:
        results = run_threads(4, worker)
        assert all(isinstance(r, int) for r in results), results
        eventually(lambda: cache.stats()["in_flight"] == 0, "the prefetches finish")
        stats = cache.stats()
        assert stats["memory_bytes"] <= 6 * chunk and stats["disk_bytes"] <= 10 * chunk
        assert stats["prefetch_bytes"] <= 3 * chunk
        if disk:
            files = chunk_files(cache)
            assert len(files) == stats["disk_entries"]
            assert sum(p.stat().st_size for p in files) == stats["disk_bytes"]
        for key in keys:   # whatever is still cached is right
            assert cache.get(key, lambda key=key: content(key, chunk - key[1] * 7)) == \
                content(key, chunk - key[1] * 7)
    finally:
        cache.close()


# ---- the shared byte-weighted W-TinyLFU policy -----------------------------------------------

def test_the_policy_never_holds_more_bytes_than_its_capacity():
    rnd = random.Random(5)
    policy: ByteWeightedTinyLfu[int] = ByteWeightedTinyLfu(100_000)
    held: dict[int, int] = {}
    for i in range(2000):
        key = rnd.randrange(300)
        if rnd.random() < 0.5 and key in held:
            assert policy.touch(key)
            continue
        weight = rnd.choice([1, 100, 4000, 30_000])
        evicted = policy.admit(key, weight)
        held[key] = weight
        for k in evicted:
            held.pop(k, None)
        assert policy.weighted_bytes == sum(held.values()) <= 100_000
        assert set(policy) == set(held) and len(policy) == len(held)
        if rnd.random() < 0.05 and held:
            victim = rnd.choice(sorted(held))
            assert policy.remove(victim) and not policy.remove(victim)
            del held[victim]


def test_the_policy_rejects_a_key_heavier_than_the_budget_and_reports_its_own_rejection():
    policy: ByteWeightedTinyLfu[str] = ByteWeightedTinyLfu(1000)
    assert policy.admit("huge", 1001) == ["huge"] and "huge" not in policy
    assert policy.admit("a", 400) == [] and policy.weight("a") == 400
    assert policy.admit("a", 400) == [] and policy.weighted_bytes == 400   # a touch
    assert policy.admit("a", 600) == [] and policy.weighted_bytes == 600   # re-weighed
    disabled: ByteWeightedTinyLfu[str] = ByteWeightedTinyLfu(0)
    assert disabled.admit("x", 0) == ["x"] and not disabled.touch("x")


def test_the_policy_keeps_frequently_used_keys_over_a_scan():
    policy: ByteWeightedTinyLfu[tuple[str, int]] = ByteWeightedTinyLfu(64 * 4096)
    hot = [("hot", i) for i in range(32)]
    for key in hot:
        policy.admit(key, 4096)
    for _ in range(5):
        for key in hot:
            policy.touch(key)
    for i in range(500):
        policy.admit(("scan", i), 4096)
        assert policy.weighted_bytes <= 64 * 4096
    assert sum(key in policy for key in hot) >= 30
