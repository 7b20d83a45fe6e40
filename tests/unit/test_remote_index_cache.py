"""RemoteIndexCache: remote segments' indexes cached on local disk, bounded by bytes.

Expected behaviour is Kafka's ``RemoteIndexCache``. The remote storage here is a small
RemoteStorageManager serving the files of real local segments (built by ``UnifiedLog``)
and counting every fetch. ``LocalSegmentRSM`` and ``build_log`` are shared with
test_remote_log_reader.py.
"""

from __future__ import annotations

import base64
import io
import random
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.log_config import LogConfig
from strata.log.producer_state import AppendOrigin
from strata.log.segment import LogSegment
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import (
    CONTROL_ABORT, CONTROL_COMMIT, Compression, SimpleRecord, build_batch, build_control_batch)
from strata.tiered.api import (
    IndexType, RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState,
    RemoteResourceNotFoundException, RemoteStorageException, RemoteStorageManager)
from strata.tiered.manager.remote_index_cache import DIR_NAME, RemoteIndexCache, index_file_prefix

T0 = 1_700_000_000_000
TIP = TopicIdPartition(uuid.UUID("6a1d3b8e-2f4c-4e0a-9b7d-5c3e1f2a4b6c"),
                       TopicPartition("orders", 3))


# ---- a remote tier made of local segments -------------------------------------------------------

class LocalSegmentRSM(RemoteStorageManager):
    """Serves local segments' files as remote segments and counts every fetch.

    ``index_fetches[(uuid, IndexType)]`` counts index downloads; ``log_ranges`` records the
    ``(start, end)`` of every ``fetch_log_segment``. ``override_log`` serves other bytes for
    a segment (to corrupt it); ``index_delay`` slows index fetches so threads overlap.
    """

    def __init__(self) -> None:
        self.segments: dict[uuid.UUID, LogSegment] = {}
        self.overrides: dict[uuid.UUID, bytes] = {}
        self.index_fetches: Counter = Counter()
        self.log_ranges: list[tuple[int, int | None]] = []
        self.index_delay = 0.0
        self._lock = threading.Lock()

    def add(self, seg: LogSegment, *, txn_idx_empty: bool = False) -> RemoteLogSegmentMetadata:
        seg_id = RemoteLogSegmentId.generate_new(TIP)
        self.segments[seg_id.id] = seg
        return RemoteLogSegmentMetadata(
            seg_id, seg.base_offset, seg.read_next_offset() - 1, seg.max_timestamp_so_far, 0,
            T0, seg.size, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            segment_leader_epochs={0: seg.base_offset}, txn_idx_empty=txn_idx_empty)

    def override_log(self, meta: RemoteLogSegmentMetadata, data: bytes) -> None:
        self.overrides[meta.remote_log_segment_id.id] = data

    def fetch_count(self, meta: RemoteLogSegmentMetadata | None = None) -> int:
        return sum(n for (key, _), n in self.index_fetches.items()
                   if meta is None or key == meta.remote_log_segment_id.id)

    def configure(self, configs) -> None:
        pass

    def copy_log_segment_data(self, remote_log_segment_metadata, log_segment_data):
        raise NotImplementedError

    def fetch_log_segment(self, remote_log_segment_metadata, start_position, end_position=None):
        key = remote_log_segment_metadata.remote_log_segment_id.id
        data = self.overrides.get(key)
        if data is None:
            data = self.segments[key].log_path.read_bytes()
        with self._lock:
            self.log_ranges.append((start_position, end_position))
        end = len(data) if end_position is None else min(end_position + 1, len(data))
        return io.BytesIO(data[start_position:end])

    def fetch_index(self, remote_log_segment_metadata, index_type):
        key = remote_log_segment_metadata.remote_log_segment_id.id
        with self._lock:
            self.index_fetches[(key, index_type)] += 1
        time.sleep(self.index_delay)
        seg = self.segments[key]
        path = {IndexType.OFFSET: seg.offset_index.path, IndexType.TIMESTAMP: seg.time_index.path,
                IndexType.TRANSACTION: seg.txn_index.path}.get(index_type)
        if path is None or not path.exists() or (
                index_type is IndexType.TRANSACTION and path.stat().st_size == 0):
            raise RemoteResourceNotFoundException(f"no {index_type.name} index")
        return io.BytesIO(path.read_bytes())

    def delete_log_segment_data(self, remote_log_segment_metadata) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def build_log(path: Path, *, batches: int = 120, segment_bytes: int = 5000,
              seed: int = 7) -> UnifiedLog:
    """A log of sealed segments (plus an empty active one): batches of 1-8 records, mixed
    codecs, a few large batches, out-of-order timestamps, three leader epochs, and
    transactions (aborted and committed) interleaved with plain batches."""
    rnd = random.Random(seed)
    config = LogConfig({"index.interval.bytes": 150, "internal.segment.bytes": segment_bytes})
    ulog = UnifiedLog(path / "orders-3", config, clock=MockClock(T0 + 86_400_000))
    open_txn: tuple[int, int] | None = None  # (producer id, next sequence)
    for i in range(batches):
        epoch = i * 3 // batches
        ts = T0 + i * 1000
        if i % 9 == 4 and open_txn is None and i < batches // 2:
            open_txn = (1000 + i, 0)
        if open_txn is not None and i % 3 == 0:
            pid, seq = open_txn
            ulog.append_as_leader(build_batch(
                [SimpleRecord(b"txn%d" % i, timestamp=ts)], producer_id=pid, producer_epoch=0,
                base_sequence=seq, transactional=True), epoch)
            open_txn = (pid, seq + 1)
            if seq == 2:
                marker = CONTROL_ABORT if pid % 2 == 0 else CONTROL_COMMIT
                ulog.append_as_leader(build_control_batch(marker, producer_id=pid, producer_epoch=0,
                                                          timestamp=ts),
                                      epoch, origin=AppendOrigin.COORDINATOR)
                open_txn = None
            continue
        n = rnd.randint(1, 8)
        size = 3000 if i % 17 == 5 else rnd.randint(1, 40)
        records = [SimpleRecord(bytes([65 + j]) * size, b"k%d" % j,
                                timestamp=ts + rnd.randint(-1500, 1500)) for j in range(n)]
        codec = rnd.choice([Compression.NONE, Compression.NONE, Compression.GZIP,
                            Compression.ZSTD, Compression.LZ4, Compression.SNAPPY])
        ulog.append_as_leader(build_batch(records, compression=codec), epoch)
    ulog.roll()
    ulog.update_high_watermark(ulog.log_end_offset)
    return ulog


def sealed_segments(ulog: UnifiedLog) -> list[LogSegment]:
    return [s for s in ulog.local_log.segments if s.size > 0]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A built log and the remote metadata of each of its sealed segments."""
    path = tmp_path_factory.mktemp("remote-index-cache")
    ulog = build_log(path)
    rsm = LocalSegmentRSM()
    metas = [rsm.add(seg) for seg in sealed_segments(ulog)]
    yield ulog, rsm, metas
    ulog.close()


@pytest.fixture
def rsm(remote) -> LocalSegmentRSM:
    """A fresh counting RSM over the module's segments, with the same segment ids."""
    fresh = LocalSegmentRSM()
    fresh.segments = dict(remote[1].segments)
    return fresh


def cached_files(cache: RemoteIndexCache) -> list[str]:
    return sorted(p.name for p in cache.cache_dir.iterdir())


def entry_files(meta: RemoteLogSegmentMetadata) -> list[str]:
    prefix = index_file_prefix(meta)
    return sorted(prefix + s for s in (".index", ".timeindex", ".txnindex"))


# ---- lookups ---------------------------------------------------------------------------------

def test_offset_lookups_match_the_local_segment_index_for_every_offset(remote, rsm, tmp_path):
    ulog, _, metas = remote
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        assert sum(seg.offset_index.entries > 1 for seg in sealed_segments(ulog)) >= 4
        for seg, meta in zip(sealed_segments(ulog), metas):
            for offset in range(seg.base_offset - 1, meta.end_offset + 3):
                assert cache.lookup_offset(meta, offset) == seg.offset_index.lookup(offset).position


def test_timestamp_lookups_match_the_local_segment_indexes(remote, rsm, tmp_path):
    ulog, _, metas = remote
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        for seg, meta in zip(sealed_segments(ulog), metas):
            for ts in range(T0 - 2000, meta.max_timestamp_ms + 2000, 250):
                for start in (0, seg.base_offset + 3, meta.end_offset):
                    local = seg.offset_index.lookup(max(seg.time_index.lookup(ts).offset, start))
                    assert cache.lookup_timestamp(meta, ts, start) == local.position


def test_second_lookup_is_a_hit_without_fetching(remote, rsm, tmp_path):
    meta = remote[2][0]
    cache = RemoteIndexCache(rsm, tmp_path, 10 << 20)
    cache.lookup_offset(meta, meta.start_offset + 5)
    fetched = dict(rsm.index_fetches)
    assert (cache.hits, cache.misses) == (0, 1)
    assert {t for (_, t) in fetched} == {IndexType.OFFSET, IndexType.TIMESTAMP,
                                         IndexType.TRANSACTION}
    cache.lookup_offset(meta, meta.start_offset + 9)
    cache.lookup_timestamp(meta, T0, 0)
    assert dict(rsm.index_fetches) == fetched
    assert (cache.hits, cache.misses) == (2, 1)
    cache.close()


def test_concurrent_cold_lookups_fetch_each_index_once(remote, rsm, tmp_path):
    meta = remote[2][1]
    seg = rsm.segments[meta.remote_log_segment_id.id]
    rsm.index_delay = 0.05
    cache = RemoteIndexCache(rsm, tmp_path, 10 << 20)
    barrier = threading.Barrier(10)
    results: list[int] = []
    errors: list[BaseException] = []

    def lookup(i: int) -> None:
        try:
            barrier.wait()
            results.append(cache.lookup_offset(meta, meta.start_offset + i))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lookup, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == sorted(seg.offset_index.lookup(meta.start_offset + i).position
                                     for i in range(10))
    assert rsm.index_fetches[(meta.remote_log_segment_id.id, IndexType.OFFSET)] == 1
    assert rsm.index_fetches[(meta.remote_log_segment_id.id, IndexType.TIMESTAMP)] == 1
    assert rsm.index_fetches[(meta.remote_log_segment_id.id, IndexType.TRANSACTION)] == 1
    assert (cache.misses, cache.hits) == (1, 9)
    cache.close()


# ---- files on disk ---------------------------------------------------------------------------

def test_files_are_named_as_kafka_names_them(remote, rsm, tmp_path):
    meta = remote[2][2]
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        cache.get_index_entry(meta)
        raw = meta.remote_log_segment_id.id.bytes
        kafka_uuid = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        assert len(kafka_uuid) == 22
        prefix = f"{meta.start_offset}_{kafka_uuid}"
        assert cache.cache_dir == tmp_path / DIR_NAME
        assert cached_files(cache) == sorted(prefix + s for s in (".index", ".timeindex", ".txnindex"))
        seg = rsm.segments[meta.remote_log_segment_id.id]
        cached = cache.cache_dir / prefix
        assert Path(f"{cached}.index").read_bytes() == seg.offset_index.path.read_bytes()
        assert Path(f"{cached}.timeindex").read_bytes() == seg.time_index.path.read_bytes()


def test_a_missing_transaction_index_is_cached_as_an_empty_file(remote, rsm, tmp_path):
    ulog, _, metas = remote
    without = [m for m, s in zip(metas, sealed_segments(ulog)) if s.txn_index.size_in_bytes == 0]
    with_txn = [m for m, s in zip(metas, sealed_segments(ulog)) if s.txn_index.size_in_bytes > 0]
    assert without and with_txn
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        entry = cache.get_index_entry(without[0])
        assert entry.txn_index is None
        assert (cache.cache_dir / f"{index_file_prefix(without[0])}.txnindex").stat().st_size == 0
        assert cache.get_index_entry(with_txn[0]).txn_index is not None


def test_a_segment_known_to_have_no_transactions_skips_the_transaction_fetch(remote, rsm, tmp_path):
    seg = rsm.segments[remote[2][0].remote_log_segment_id.id]
    meta = rsm.add(seg, txn_idx_empty=True)
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        assert cache.get_index_entry(meta).txn_index is None
    assert rsm.index_fetches[(meta.remote_log_segment_id.id, IndexType.TRANSACTION)] == 0


def test_a_new_instance_reuses_the_files_without_fetching(remote, rsm, tmp_path):
    metas = remote[2][:3]
    first = RemoteIndexCache(rsm, tmp_path, 10 << 20)
    expected = [first.lookup_offset(m, m.start_offset + 7) for m in metas]
    first.close()
    files = cached_files(first)
    assert len(files) == 9
    again = LocalSegmentRSM()
    again.segments = rsm.segments
    second = RemoteIndexCache(again, tmp_path, 10 << 20)
    assert len(second) == 3 and cached_files(second) == files
    assert [second.lookup_offset(m, m.start_offset + 7) for m in metas] == expected
    assert again.fetch_count() == 0
    assert (second.hits, second.misses) == (3, 0)
    second.close()


def test_leftovers_and_incomplete_sets_are_removed_at_start(remote, rsm, tmp_path):
    meta, partial = remote[2][0], remote[2][1]
    cache_dir = tmp_path / DIR_NAME
    cache_dir.mkdir()
    (cache_dir / f"{index_file_prefix(meta)}.index.tmp").write_bytes(b"half a download")
    (cache_dir / f"{index_file_prefix(meta)}.timeindex.deleted").write_bytes(b"evicted")
    (cache_dir / f"{index_file_prefix(partial)}.index").write_bytes(b"\0" * 8)
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        assert cached_files(cache) == []
        assert len(cache) == 0


def test_a_corrupt_cached_file_is_fetched_again(remote, rsm, tmp_path):
    meta = remote[2][3]
    seg = rsm.segments[meta.remote_log_segment_id.id]
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        cache.get_index_entry(meta)
    index_path = tmp_path / DIR_NAME / f"{index_file_prefix(meta)}.index"
    index_path.write_bytes(index_path.read_bytes() + b"\1\2\3")  # not a whole entry
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        assert len(cache) == 0
        assert cache.lookup_offset(meta, meta.end_offset) == \
            seg.offset_index.lookup(meta.end_offset).position
    assert index_path.read_bytes() == seg.offset_index.path.read_bytes()


def test_a_failed_download_leaves_no_files_and_is_retried(remote, rsm, tmp_path):
    meta = remote[2][0]
    fetch_index = rsm.fetch_index

    def failing_time_index(m, index_type):
        if index_type is IndexType.TIMESTAMP:
            raise RemoteStorageException("store unavailable")
        return fetch_index(m, index_type)

    rsm.fetch_index = failing_time_index
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        with pytest.raises(RemoteStorageException):
            cache.get_index_entry(meta)
        assert cached_files(cache) == [] and len(cache) == 0
        rsm.fetch_index = fetch_index
        cache.get_index_entry(meta)
        assert cached_files(cache) == entry_files(meta)
        assert (cache.misses, cache.hits) == (2, 0)


# ---- eviction and removal --------------------------------------------------------------------

def test_eviction_under_a_small_budget_deletes_the_files(remote, rsm, tmp_path):
    metas = remote[2]
    sizes = []
    with RemoteIndexCache(rsm, tmp_path / "probe", 10 << 20) as probe:
        for m in metas:
            sizes.append(probe.get_index_entry(m).size_bytes)
    budget = int(max(sizes) * 2.5)
    cache = RemoteIndexCache(rsm, tmp_path, budget)
    for _ in range(3):
        for m in metas:
            cache.lookup_offset(m, m.start_offset)
            assert cache.size_bytes <= budget
    assert cache.evictions > 0
    assert 1 <= len(cache) < len(metas)
    kept = [m for m in metas if m.remote_log_segment_id.id in cache]
    assert cached_files(cache) == sorted(f for m in kept for f in entry_files(m))
    assert cache.size_bytes == sum(s for m, s in zip(metas, sizes) if m in kept)
    cache.close()


def test_lookups_racing_with_eviction_always_answer_correctly(remote, rsm, tmp_path):
    ulog, _, metas = remote
    segments = dict(zip((m.remote_log_segment_id.id for m in metas), sealed_segments(ulog)))
    with RemoteIndexCache(rsm, tmp_path / "probe", 10 << 20) as probe:
        budget = sum(probe.get_index_entry(m).size_bytes for m in metas) // 3
    cache = RemoteIndexCache(rsm, tmp_path, budget)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(150):
                m = rnd.choice(metas)
                offset = rnd.randint(m.start_offset, m.end_offset)
                expected = segments[m.remote_log_segment_id.id].offset_index.lookup(offset).position
                assert cache.lookup_offset(m, offset) == expected
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.evictions > 0 and cache.size_bytes <= budget
    kept = [m for m in metas if m.remote_log_segment_id.id in cache]
    assert cached_files(cache) == sorted(f for m in kept for f in entry_files(m))
    cache.close()


def test_an_entry_larger_than_the_budget_is_used_once_and_not_kept(remote, rsm, tmp_path):
    meta = remote[2][0]
    seg = rsm.segments[meta.remote_log_segment_id.id]
    with RemoteIndexCache(rsm, tmp_path, 16) as cache:
        for _ in range(2):
            assert cache.lookup_offset(meta, meta.end_offset) == \
                seg.offset_index.lookup(meta.end_offset).position
        assert len(cache) == 0 and cached_files(cache) == []
        assert rsm.index_fetches[(meta.remote_log_segment_id.id, IndexType.OFFSET)] == 2
        assert cache.evictions == 2


def test_remove_deletes_the_files_and_the_next_lookup_fetches_again(remote, rsm, tmp_path):
    meta, other = remote[2][0], remote[2][1]
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        cache.get_index_entry(meta)
        cache.get_index_entry(other)
        cache.remove(meta.remote_log_segment_id.id)
        cache.remove(uuid.uuid4())  # unknown: nothing happens
        assert cached_files(cache) == entry_files(other)
        assert cache.evictions == 0
        cache.get_index_entry(meta)
        assert rsm.fetch_count(meta) == 6


def test_an_entry_in_use_survives_removal_until_released(remote, rsm, tmp_path):
    meta = remote[2][2]
    seg = rsm.segments[meta.remote_log_segment_id.id]
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        with cache.pinned_entry(meta) as entry:
            cache.remove(meta.remote_log_segment_id.id)
            assert all(name.endswith(".deleted") for name in cached_files(cache))
            assert entry.lookup_offset(meta.end_offset) == seg.offset_index.lookup(meta.end_offset)
        assert cached_files(cache) == []


def test_resize_evicts_what_no_longer_fits(remote, rsm, tmp_path):
    metas = remote[2]
    with RemoteIndexCache(rsm, tmp_path, 10 << 20) as cache:
        for m in metas:
            cache.get_index_entry(m)
        assert len(cache) == len(metas)
        biggest = max(cache.get_index_entry(m).size_bytes for m in metas)
        cache.resize(biggest)
        assert cache.max_size_bytes == biggest
        assert 1 <= len(cache) < len(metas) and cache.size_bytes <= biggest
        kept = [m for m in metas if m.remote_log_segment_id.id in cache]
        assert cached_files(cache) == sorted(f for m in kept for f in entry_files(m))


def test_close_keeps_the_files_and_refuses_lookups(remote, rsm, tmp_path):
    meta = remote[2][0]
    cache = RemoteIndexCache(rsm, tmp_path, 10 << 20)
    cache.get_index_entry(meta)
    cache.close()
    cache.close()
    assert cached_files(cache) == entry_files(meta)
    with pytest.raises(RuntimeError):
        cache.lookup_offset(meta, 0)
