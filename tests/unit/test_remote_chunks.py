"""Chunked segment objects: chunk indexes, per-chunk zstd compression, envelope encryption,
CRC32C checks, lazy one-GET-per-chunk reads, key rotation and version 1 manifests."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import struct
import uuid
from pathlib import Path

import crc32c
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remote_storage import TIP, RecordingObjectStore, Segment

from strata.protocol.records import Compression, SimpleRecord, build_batch
from strata.tiered.api import (
    IndexType, LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteResourceNotFoundException,
    RemoteStorageException)
from strata.tiered.storage import (
    FileSystemObjectStore, FixedSizeChunkIndex, MemoryObjectStore, ObjectStoreRemoteStorageManager,
    SegmentManifest, VariableSizeChunkIndex, chunk_range)
from strata.tiered.storage.chunks import (
    decode_chunk_sizes, decode_crcs, encode_chunk_sizes, encode_crcs)
from strata.tiered.storage.transforms import BatchCheck
from support.waiting import eventually

KIB = 1024
MIB = 1024 * 1024
T0 = 1_700_000_000_000


# ---- helpers --------------------------------------------------------------------------------

@dataclasses.dataclass
class BigSegment:
    """A segment file of a bit more than two 4 MiB chunks (real batches first, then text that
    compresses and random bytes that do not), with the indexes of a real small segment."""

    data: LogSegmentData
    metadata: RemoteLogSegmentMetadata
    bytes: bytes
    real: Segment


def make_big_segment(directory: Path, size: int = 2 * 4 * MIB + 12_345) -> BigSegment:
    real = Segment(directory / "real", batches=40)
    rng = random.Random(405)
    text = b"".join(b"offset=%08d key=k%d value=%s\n" % (i, i % 97, b"v" * (i % 31))
                    for i in range(size // 40))
    body = real.bytes + text[:size // 2] + rng.randbytes(size)
    body = body[:size]
    path = directory / "big.log"
    path.write_bytes(body)
    data = dataclasses.replace(real.data, log_segment=path)
    meta = RemoteLogSegmentMetadata(RemoteLogSegmentId(TIP, uuid.uuid4()), 0, real.next_offset - 1,
                                    T0, 0, T0, size, segment_leader_epochs={0: 0})
    return BigSegment(data, meta, body, real)


def write_key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / f"{name}-private.pem"
    public = directory / f"{name}-public.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("keys")
    return {name: write_key_pair(directory, name) for name in ("A", "B")}


def ring_configs(keys, active: str | None, ring: tuple[str, ...]) -> dict[str, object]:
    configs: dict[str, object] = {"encryption.key.pairs": ",".join(ring)}
    for name in ring:
        private, public = keys[name]
        configs[f"encryption.key.pairs.{name}.private.key.file"] = str(private)
        configs[f"encryption.key.pairs.{name}.public.key.file"] = str(public)
    if active is not None:
        configs.update({"encryption.enabled": "true", "encryption.key.pair.id": active})
    return configs


def make_rsm(store, **configs) -> ObjectStoreRemoteStorageManager:
    manager = ObjectStoreRemoteStorageManager(store)
    manager.configure(configs)
    return manager


def log_gets(recorder: RecordingObjectStore) -> list[str]:
    return [k for k in recorder.ops("get_range") if k.endswith(".log")]


def flip_byte(store: MemoryObjectStore, key: str, position: int) -> None:
    data = bytearray(store.get(key))
    data[position] ^= 0x40
    store.put(key, bytes(data))


# ---- round trips ----------------------------------------------------------------------------

COMBOS = [(chunk, compression, encryption) for chunk in (KIB, 4 * MIB)
          for compression in (False, True) for encryption in (False, True)]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> BigSegment:
    return make_big_segment(tmp_path_factory.mktemp("big"))


@pytest.fixture(scope="module", params=COMBOS, ids=lambda c: f"chunk{c[0]}-comp{c[1]}-enc{c[2]}")
def copied(request, big, keys):
    chunk, compression, encryption = request.param
    configs = {"chunk.size": chunk, "compression.enabled": compression,
               **ring_configs(keys, "A" if encryption else None, ("A",))}
    store = MemoryObjectStore()
    make_rsm(store, **configs).copy_log_segment_data(big.metadata, big.data)
    # A fresh manager: everything comes from the store, nothing from the copy's caches.
    return make_rsm(store, **configs), store, request.param


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fetch_returns_the_original_bytes_for_any_range_chunking_and_transforms(copied, big, data):
    manager, _, (chunk, _, _) = copied
    size = len(big.bytes)
    near_boundary = st.integers(1, size // chunk).map(lambda k: k * chunk) | st.integers(0, size - 1)
    base = data.draw(near_boundary, label="base")
    start = min(max(base + data.draw(st.integers(-2, 2), label="delta"), 0), size - 1)
    end = data.draw(st.integers(start, min(size + 10, start + 3 * chunk + 5)), label="end")
    with manager.fetch_log_segment(big.metadata, start, end) as stream:
        assert stream.read() == big.bytes[start:end + 1]


def test_whole_segment_and_its_indexes_round_trip(copied, big):
    manager, store, (chunk, compression, encryption) = copied
    assert manager.fetch_log_segment(big.metadata, 0).read() == big.bytes
    stream = manager.fetch_log_segment(big.metadata, chunk - 3, chunk + 2)
    assert stream.read(2) + stream.read(1) + stream.read() == big.bytes[chunk - 3:chunk + 3]
    for index_type in IndexType:
        assert manager.fetch_index(big.metadata, index_type).read() == \
            big.real.expected_index(index_type)
    doc = json.loads(store.get(manager.object_key(big.metadata, "rsm-manifest")))
    assert doc["compression"] is compression
    assert ("encryption" in doc) is encryption
    assert doc["chunkIndex"]["type"] == ("variable" if compression or encryption else "fixed")


@pytest.mark.parametrize("compression,encryption", [(False, False), (True, True)])
def test_an_empty_segment_round_trips_as_no_chunks(tmp_path, keys, compression, encryption):
    seg = Segment(tmp_path / "logs", batches=3)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    data = dataclasses.replace(seg.data, log_segment=empty)
    manager = make_rsm(MemoryObjectStore(), **{"compression.enabled": compression},
                       **ring_configs(keys, "A" if encryption else None, ("A",)))
    manager.copy_log_segment_data(seg.metadata, data)
    assert manager._manifest(seg.metadata).chunk_index.chunk_count == 0
    assert manager.fetch_log_segment(seg.metadata, 0).read() == b""


def test_a_filesystem_store_round_trips_a_compressed_encrypted_segment(tmp_path, keys):
    seg = Segment(tmp_path / "logs")
    store = FileSystemObjectStore(tmp_path / "remote")
    configs = {"chunk.size": 700, "compression.enabled": "true", **ring_configs(keys, "A", ("A",))}
    make_rsm(store, **configs).copy_log_segment_data(seg.metadata, seg.data)
    fresh = make_rsm(store, **configs)
    assert fresh.fetch_log_segment(seg.metadata, 0).read() == seg.bytes
    assert fresh.fetch_log_segment(seg.metadata, 650, 1460).read() == seg.bytes[650:1461]
    assert fresh.fetch_index(seg.metadata, IndexType.TRANSACTION).read() == \
        seg.expected_index(IndexType.TRANSACTION)


# ---- one ranged GET per chunk, lazily ---------------------------------------------------------

@pytest.mark.parametrize("compression,encryption", [(False, False), (True, False), (True, True)])
def test_reading_a_whole_segment_takes_one_ranged_get_per_chunk_of_its_stored_range(
        big, keys, compression, encryption):
    recorder = RecordingObjectStore(MemoryObjectStore())
    ranges: list[tuple[int, int]] = []
    inner_get_range = recorder.get_range

    def get_range(key, start, stop):
        if key.endswith(".log"):
            ranges.append((start, stop))
        return inner_get_range(key, start, stop)

    recorder.get_range = get_range
    configs = {"chunk.size": 64 * KIB, "compression.enabled": compression,
               **ring_configs(keys, "A" if encryption else None, ("A",))}
    make_rsm(recorder, **configs).copy_log_segment_data(big.metadata, big.data)
    manager = make_rsm(recorder, **configs)
    assert manager.fetch_log_segment(big.metadata, 0).read() == big.bytes
    index = manager._manifest(big.metadata).chunk_index
    assert index.chunk_count == -(-len(big.bytes) // (64 * KIB))
    assert ranges == [index.stored_range(i) for i in range(index.chunk_count)]
    assert ranges[-1][1] == recorder.inner.size(manager.object_key(big.metadata, "log"))


def test_chunks_are_fetched_only_as_the_stream_is_read(big):
    recorder = RecordingObjectStore(MemoryObjectStore())
    manager = make_rsm(recorder, **{"chunk.size": 100 * KIB, "compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    recorder.calls.clear()
    stream = manager.fetch_log_segment(big.metadata, 150 * KIB, 550 * KIB - 1)
    assert len(log_gets(recorder)) == 1          # chunk 1, before returning
    assert stream.read(60 * KIB) == big.bytes[150 * KIB:210 * KIB]
    assert len(log_gets(recorder)) == 2          # chunk 2 as the read crossed into it
    assert stream.read() == big.bytes[210 * KIB:550 * KIB]
    assert len(log_gets(recorder)) == 5          # chunks 1..5


def test_a_range_within_the_loaded_chunk_is_viewed_in_place_and_one_across_chunks_is_not(big):
    manager = make_rsm(MemoryObjectStore(), **{"chunk.size": MIB, "compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    stream = manager.fetch_log_segment(big.metadata, MIB + 10, 3 * MIB)
    raw = getattr(stream, "raw", stream)
    view = raw.view(MIB + 100, 5000)
    assert view == big.bytes[MIB + 100:MIB + 5100] and view.readonly
    manifest = manager._manifest(big.metadata)
    assert view.obj is manager._chunk(big.metadata, manifest, 1)   # the cached chunk itself
    assert raw.view(2 * MIB - 10, 20) is None       # runs into chunk 2, not loaded yet
    assert raw.view(MIB, 20) is None                # before the range
    assert stream.read(MIB) == big.bytes[MIB + 10:2 * MIB + 10]
    assert raw.view(2 * MIB, 100) == big.bytes[2 * MIB:2 * MIB + 100]


def test_readview_gives_the_range_chunk_by_chunk_as_views_of_the_cached_chunks(big):
    manager = make_rsm(MemoryObjectStore(), **{"chunk.size": MIB, "compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    manifest = manager._manifest(big.metadata)
    stream = manager.fetch_log_segment(big.metadata, MIB + 10, 3 * MIB + 99)
    raw = getattr(stream, "raw", stream)
    pieces = []
    while piece := raw.readview():
        pieces.append(piece)
    assert [len(p) for p in pieces] == [MIB - 10, MIB, 100]
    assert b"".join(pieces) == big.bytes[MIB + 10:3 * MIB + 100]
    assert all(p.readonly for p in pieces)
    chunks = [manager._chunk(big.metadata, manifest, i) for i in (1, 2, 3)]
    assert all(p.obj is chunk for p, chunk in zip(pieces, chunks))    # no copies
    assert raw.readview() == b"" and raw.read() == b""


def test_a_chunk_cache_gets_every_load_keyed_by_log_object_and_chunk_id_and_drops_deleted_ones(big):
    class DictCache:
        def __init__(self):
            self.entries: dict[tuple[str, int], bytes] = {}
            self.keys: list[tuple[str, int]] = []

        def get(self, key, loader):
            self.keys.append(key)
            if key not in self.entries:
                self.entries[key] = loader()
            return self.entries[key]

        def prefetch(self, items):
            pass

        def invalidate(self, object_key):
            self.entries = {k: v for k, v in self.entries.items() if k[0] != object_key}

    recorder = RecordingObjectStore(MemoryObjectStore())
    cache = DictCache()
    manager = ObjectStoreRemoteStorageManager(recorder, chunk_cache=cache)
    manager.configure({"chunk.size": MIB, "compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    log_key = manager.object_key(big.metadata, "log")
    recorder.calls.clear()
    assert manager.fetch_log_segment(big.metadata, MIB - 5, 3 * MIB).read() == \
        big.bytes[MIB - 5:3 * MIB + 1]
    assert cache.keys == [(log_key, 0), (log_key, 1), (log_key, 2), (log_key, 3)]
    assert len(log_gets(recorder)) == 4
    assert manager.fetch_log_segment(big.metadata, MIB, 2 * MIB).read() == \
        big.bytes[MIB:2 * MIB + 1]
    assert len(log_gets(recorder)) == 4          # served by the cache
    manifest = manager._manifest(big.metadata)
    assert cache.entries[(log_key, 2)] == manager._load_chunk(big.metadata, manifest, 2) == \
        big.bytes[2 * MIB:3 * MIB]
    manager.delete_log_segment_data(big.metadata)
    assert cache.entries == {}


def test_prefetch_loads_the_range_in_the_background_and_reading_it_then_takes_no_get(big):
    recorder = RecordingObjectStore(MemoryObjectStore())
    manager = make_rsm(recorder, **{"chunk.size": MIB, "compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    manager._manifests.clear()
    recorder.calls.clear()
    past_end = manager.prefetch(big.metadata, MIB + 10, 3 * MIB)
    assert past_end == 0
    eventually(lambda: len(log_gets(recorder)) == 4, "chunks 1 to 4 prefetched")
    assert manager._chunk_cache.stats()["prefetch_requested"] == 4
    assert manager.fetch_log_segment(big.metadata, MIB + 10, 4 * MIB).read() == \
        big.bytes[MIB + 10:4 * MIB + 1]
    assert len(log_gets(recorder)) == 4
    assert manager._chunk_cache.stats()["prefetch_hits"] >= 1
    manager.close()


def test_prefetch_reports_the_part_of_the_range_past_the_segment_end(big):
    manager = make_rsm(MemoryObjectStore(), **{"chunk.size": MIB})
    manager.copy_log_segment_data(big.metadata, big.data)
    size = big.metadata.segment_size_in_bytes
    assert manager.prefetch(big.metadata, size - 100, 1000) == 900
    assert manager.prefetch(big.metadata, size, 1000) == 1000
    manager.close()


def test_without_a_chunk_cache_prefetch_is_off(big):
    manager = make_rsm(MemoryObjectStore(), **{"chunk.cache.memory.size": 0})
    assert manager._chunk_cache is None and manager.prefetch_max_size == 0
    manager.copy_log_segment_data(big.metadata, big.data)
    assert manager.fetch_log_segment(big.metadata, 0, 99).read() == big.bytes[:100]


def test_chunk_range_maps_original_byte_ranges_to_chunk_ids():
    index = FixedSizeChunkIndex.untransformed(2500, 1000)
    assert index.chunk_count == 3
    assert chunk_range(index, 0, 2500) == range(0, 3)
    assert chunk_range(index, 999, 1001) == range(0, 2)
    assert chunk_range(index, 1000, 2000) == range(1, 2)
    assert chunk_range(index, 2400, 9999) == range(2, 3)
    assert chunk_range(index, 2500, 2600) == range(0)
    assert chunk_range(index, 5, 5) == range(0)
    assert index.stored_range(2) == (2000, 2500)
    variable = VariableSizeChunkIndex(1000, 2500, (10, 20, 5))
    assert [variable.stored_range(i) for i in range(3)] == [(0, 10), (10, 30), (30, 35)]
    assert variable.original_range(2) == (2000, 2500)
    assert ObjectStoreRemoteStorageManager.chunk_range(variable, 1500, 2001) == range(1, 3)


# ---- integrity ------------------------------------------------------------------------------

@pytest.mark.parametrize("compression,encryption", [(False, False), (True, False), (False, True)])
def test_a_flipped_byte_in_a_stored_chunk_is_a_storage_error_naming_object_and_chunk(
        big, keys, compression, encryption):
    store = MemoryObjectStore()
    configs = {"chunk.size": MIB, "compression.enabled": compression,
               **ring_configs(keys, "A" if encryption else None, ("A",))}
    make_rsm(store, **configs).copy_log_segment_data(big.metadata, big.data)
    manager = make_rsm(store, **configs)
    log_key = manager.object_key(big.metadata, "log")
    start, stop = manager._manifest(big.metadata).chunk_index.stored_range(3)
    flip_byte(store, log_key, (start + stop) // 2)
    # Chunks before the corrupt one still read.
    assert manager.fetch_log_segment(big.metadata, 0, 3 * MIB - 1).read() == big.bytes[:3 * MIB]
    with pytest.raises(RemoteStorageException, match=rf"{log_key} chunk 3 is corrupt"):
        manager.fetch_log_segment(big.metadata, 3 * MIB + 10, 3 * MIB + 20)
    stream = manager.fetch_log_segment(big.metadata, 2 * MIB)     # chunk 2 is fine
    assert stream.read(MIB) == big.bytes[2 * MIB:3 * MIB]
    with pytest.raises(RemoteStorageException, match="chunk 3"):
        stream.read()


def test_a_chunk_failing_authentication_is_an_error_even_when_its_crc_matches(big, keys):
    store = MemoryObjectStore()
    configs = {"chunk.size": MIB, **ring_configs(keys, "A", ("A",))}
    make_rsm(store, **configs).copy_log_segment_data(big.metadata, big.data)
    manager = make_rsm(store, **configs)
    log_key = manager.object_key(big.metadata, "log")
    manifest_key = manager.object_key(big.metadata, "rsm-manifest")
    start, stop = manager._manifest(big.metadata).chunk_index.stored_range(0)
    flip_byte(store, log_key, start + 20)
    doc = json.loads(store.get(manifest_key))
    crcs = list(decode_crcs(doc["chunkCrc32c"]))
    crcs[0] = crc32c.crc32c(store.get_range(log_key, start, stop))
    doc["chunkCrc32c"] = encode_crcs(crcs)
    store.put(manifest_key, json.dumps(doc).encode())
    with pytest.raises(RemoteStorageException, match=rf"{log_key} chunk 0 is corrupt.*authentication"):
        make_rsm(store, **configs).fetch_log_segment(big.metadata, 0, 10)


def test_encrypted_chunks_swapped_in_place_fail_authentication(big, keys):
    # Same-size chunks swapped, CRCs swapped with them: only the chunk id bound into the
    # GCM associated data can tell.
    store = MemoryObjectStore()
    configs = {"chunk.size": MIB, **ring_configs(keys, "A", ("A",))}
    make_rsm(store, **configs).copy_log_segment_data(big.metadata, big.data)
    manager = make_rsm(store, **configs)
    log_key = manager.object_key(big.metadata, "log")
    manifest_key = manager.object_key(big.metadata, "rsm-manifest")
    index = manager._manifest(big.metadata).chunk_index
    (a0, a1), (b0, b1) = index.stored_range(0), index.stored_range(1)
    assert a1 - a0 == b1 - b0
    stored = bytearray(store.get(log_key))
    stored[a0:a1], stored[b0:b1] = stored[b0:b1], stored[a0:a1]
    store.put(log_key, bytes(stored))
    doc = json.loads(store.get(manifest_key))
    crcs = list(decode_crcs(doc["chunkCrc32c"]))
    crcs[0], crcs[1] = crcs[1], crcs[0]
    doc["chunkCrc32c"] = encode_crcs(crcs)
    store.put(manifest_key, json.dumps(doc).encode())
    with pytest.raises(RemoteStorageException, match=rf"{log_key} chunk 0 is corrupt.*authentication"):
        make_rsm(store, **configs).fetch_log_segment(big.metadata, 0, 10)


@pytest.mark.parametrize("encryption", [False, True])
def test_a_corrupt_index_is_a_storage_error(tmp_path, keys, encryption):
    seg = Segment(tmp_path / "logs")
    store = MemoryObjectStore()
    configs = ring_configs(keys, "A" if encryption else None, ("A",))
    make_rsm(store, **configs).copy_log_segment_data(seg.metadata, seg.data)
    manager = make_rsm(store, **configs)
    entry = manager._manifest(seg.metadata).segment_indexes[IndexType.TIMESTAMP]
    flip_byte(store, manager.object_key(seg.metadata, "indexes"), entry.position + 3)
    with pytest.raises(RemoteStorageException, match="TIMESTAMP index is corrupt"):
        manager.fetch_index(seg.metadata, IndexType.TIMESTAMP)
    assert manager.fetch_index(seg.metadata, IndexType.OFFSET).read() == \
        seg.expected_index(IndexType.OFFSET)


@pytest.mark.parametrize("encryption", [False, True])
def test_the_indexes_of_a_segment_are_read_with_one_get(tmp_path, keys, encryption):
    seg = Segment(tmp_path / "logs")
    recorder = RecordingObjectStore(MemoryObjectStore())
    configs = ring_configs(keys, "A" if encryption else None, ("A",))
    make_rsm(recorder, **configs).copy_log_segment_data(seg.metadata, seg.data)
    manager = make_rsm(recorder, **configs)
    manager._manifest(seg.metadata)
    recorder.calls.clear()
    types = [IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.LEADER_EPOCH, IndexType.TRANSACTION]
    got = manager.fetch_indexes(seg.metadata, types)
    assert recorder.calls == [("get_range", manager.object_key(seg.metadata, "indexes"))]
    for index_type in types:
        if index_type in got:
            assert got[index_type].read() == seg.expected_index(index_type)
        else:   # left out only when the segment has none
            with pytest.raises(RemoteResourceNotFoundException):
                manager.fetch_index(seg.metadata, index_type)
    assert IndexType.OFFSET in got and IndexType.TIMESTAMP in got


def test_concurrent_first_readers_of_a_segment_share_one_manifest_get(tmp_path):
    import threading
    seg = Segment(tmp_path / "logs")
    store = MemoryObjectStore()
    make_rsm(store).copy_log_segment_data(seg.metadata, seg.data)
    manifest_key = make_rsm(store).object_key(seg.metadata, "rsm-manifest")
    gate = threading.Event()

    class SlowManifest(RecordingObjectStore):
        def get(self, key):
            gate.wait(5)
            return super().get(key)

    recorder = SlowManifest(store)
    manager = make_rsm(recorder)
    readers = [threading.Thread(target=manager.fetch_index, args=(seg.metadata, IndexType.OFFSET))
               for _ in range(8)]
    for t in readers:
        t.start()
    gate.set()
    for t in readers:
        t.join(10)
    assert [c for c in recorder.calls if c == ("get", manifest_key)] == [("get", manifest_key)]


# ---- encryption -----------------------------------------------------------------------------

def test_encrypted_objects_hold_no_plaintext_and_the_manifest_names_the_key_pair(tmp_path, keys):
    seg = Segment(tmp_path / "logs")
    store = MemoryObjectStore()
    manager = make_rsm(store, **{"chunk.size": 512}, **ring_configs(keys, "A", ("A", "B")))
    manager.copy_log_segment_data(seg.metadata, seg.data)
    log = store.get(manager.object_key(seg.metadata, "log"))
    indexes = store.get(manager.object_key(seg.metadata, "indexes"))
    assert b"value-1" in seg.bytes and b"value-1" not in log
    leader_epochs = seg.expected_index(IndexType.LEADER_EPOCH)
    assert leader_epochs not in indexes
    doc = json.loads(store.get(manager.object_key(seg.metadata, "rsm-manifest")))
    key_pair_id, wrapped = doc["encryption"]["dataKey"].split(":", 1)
    assert key_pair_id == "A"
    assert len(base64.b64decode(wrapped)) == 256          # RSA-2048 OAEP
    assert len(base64.b64decode(doc["encryption"]["aad"])) == 32
    # Each 512-byte chunk grows by the IV and the GCM tag.
    sizes = decode_chunk_sizes(base64.b64decode(doc["chunkIndex"]["transformedChunks"]))
    assert sizes[:-1] == [512 + 12 + 16] * (len(sizes) - 1)
    assert len(log) == sum(sizes)


def test_segments_stay_readable_after_the_active_key_pair_changes(tmp_path, keys):
    store = MemoryObjectStore()
    old = Segment(tmp_path / "old")
    new = Segment(tmp_path / "new")
    make_rsm(store, **{"chunk.size": 1000}, **ring_configs(keys, "A", ("A",))
             ).copy_log_segment_data(old.metadata, old.data)
    rotated = make_rsm(store, **{"chunk.size": 1000}, **ring_configs(keys, "B", ("A", "B")))
    rotated.copy_log_segment_data(new.metadata, new.data)
    data_key = json.loads(store.get(rotated.object_key(new.metadata, "rsm-manifest")))[
        "encryption"]["dataKey"]
    assert data_key.startswith("B:")
    fresh = make_rsm(store, **ring_configs(keys, "B", ("A", "B")))
    assert fresh.fetch_log_segment(old.metadata, 0).read() == old.bytes
    assert fresh.fetch_log_segment(new.metadata, 0).read() == new.bytes
    assert fresh.fetch_index(old.metadata, IndexType.OFFSET).read() == \
        old.expected_index(IndexType.OFFSET)
    # Reading needs only the ring, not encryption.enabled.
    reader = make_rsm(store, **ring_configs(keys, None, ("A", "B")))
    assert reader.fetch_log_segment(old.metadata, 0).read() == old.bytes


def test_a_segment_whose_key_pair_left_the_ring_fails_naming_the_key_pair(tmp_path, keys):
    store = MemoryObjectStore()
    seg = Segment(tmp_path / "logs")
    make_rsm(store, **ring_configs(keys, "A", ("A",))).copy_log_segment_data(seg.metadata, seg.data)
    without_a = make_rsm(store, **ring_configs(keys, "B", ("B",)))
    with pytest.raises(RemoteStorageException, match="key pair 'A' is not in encryption.key.pairs"):
        without_a.fetch_log_segment(seg.metadata, 0)
    with pytest.raises(RemoteStorageException, match="key pair 'A'"):
        without_a.fetch_index(seg.metadata, IndexType.OFFSET)
    no_ring = make_rsm(store)
    with pytest.raises(RemoteStorageException, match="key pair 'A'"):
        no_ring.fetch_log_segment(seg.metadata, 0)


def test_a_key_pair_id_pointing_at_another_private_key_fails_naming_the_key_pair(tmp_path, keys):
    store = MemoryObjectStore()
    seg = Segment(tmp_path / "logs")
    make_rsm(store, **ring_configs(keys, "A", ("A",))).copy_log_segment_data(seg.metadata, seg.data)
    wrong = make_rsm(store, **{"encryption.key.pairs": "A",
                               "encryption.key.pairs.A.private.key.file": str(keys["B"][0])})
    with pytest.raises(RemoteStorageException, match="key pair 'A' cannot decrypt"):
        wrong.fetch_log_segment(seg.metadata, 0)


def test_encryption_configuration_errors_name_the_key(tmp_path, keys):
    bad_pem = tmp_path / "bad.pem"
    bad_pem.write_bytes(b"not a key")
    cases = {
        "encryption.key.pair.id": {"encryption.enabled": "true"},
        "'C' is not in encryption.key.pairs": ring_configs(keys, "C", ("A",)),
        "encryption.key.pairs.A.private.key.file is required": {"encryption.key.pairs": "A"},
        "encryption.key.pairs.A.private.key.file": {
            "encryption.key.pairs": "A", "encryption.key.pairs.A.private.key.file": str(bad_pem)},
        "does not match": {**ring_configs(keys, "A", ("A",)),
                           "encryption.key.pairs.A.public.key.file": str(keys["B"][1])},
        "missing.pem": {"encryption.key.pairs": "A",
                        "encryption.key.pairs.A.private.key.file": str(tmp_path / "missing.pem")},
    }
    for message, configs in cases.items():
        with pytest.raises(RemoteStorageException, match=message):
            ObjectStoreRemoteStorageManager(MemoryObjectStore()).configure(configs)


# ---- compression ----------------------------------------------------------------------------

def compressed_segment(directory: Path, codec: Compression) -> Segment:
    seg = Segment(directory)
    path = directory / "compressed.log"
    batches = [build_batch([SimpleRecord(b"value-%d" % i * 20, b"k%d" % i, timestamp=T0 + i)],
                           base_offset=i, compression=codec) for i in range(50)]
    path.write_bytes(b"".join(batches))
    seg.data = dataclasses.replace(seg.data, log_segment=path)
    seg.bytes = path.read_bytes()
    return seg


@pytest.mark.parametrize("heuristic,codec,compressed", [
    (True, Compression.ZSTD, False), (True, Compression.GZIP, False),
    (True, Compression.NONE, True), (False, Compression.ZSTD, True)])
def test_the_compression_heuristic_skips_segments_whose_first_batch_is_compressed(
        tmp_path, heuristic, codec, compressed):
    seg = compressed_segment(tmp_path / "logs", codec)
    store = MemoryObjectStore()
    manager = make_rsm(store, **{"compression.enabled": "true", "chunk.size": 600,
                                 "compression.heuristic.enabled": str(heuristic).lower()})
    manager.copy_log_segment_data(seg.metadata, seg.data)
    doc = json.loads(store.get(manager.object_key(seg.metadata, "rsm-manifest")))
    assert doc["compression"] is compressed
    assert doc["chunkIndex"]["type"] == ("variable" if compressed else "fixed")
    if not compressed:
        assert store.get(manager.object_key(seg.metadata, "log")) == seg.bytes
    assert make_rsm(store).fetch_log_segment(seg.metadata, 0).read() == seg.bytes


def _two_batches() -> bytes:
    return (build_batch([SimpleRecord(b"v" * 40, b"k")]) +
            build_batch([SimpleRecord(b"w" * 40, None)], base_offset=1))


def _damage(where: int, value: int | None = None, cut: int = 0) -> bytes:
    body = bytearray(_two_batches())
    if value is None:
        body[where] ^= 0xFF
    else:
        body[where] = value
    return bytes(body[:len(body) - cut])


@pytest.mark.parametrize("data,bad", [
    (b"", None),
    (_two_batches(), None),
    (_two_batches()[:-1], "second"),                  # truncated
    (_two_batches() + b"\0" * 20, "end"),              # trailing bytes, no whole header
    (_damage(-1), "second"),                          # a record byte: CRC mismatch
    (_damage(21), "first"),                           # attributes are CRC-covered
    (_damage(16, value=1), "first"),                  # magic 1
    (_damage(11, value=10), "first"),                 # batchLength 10: impossible
])
def test_the_batch_check_finds_the_first_batch_that_is_cut_foreign_or_fails_its_crc(data, bad):
    second = len(build_batch([SimpleRecord(b"v" * 40, b"k")]))
    expected = {None: None, "first": 0, "second": second, "end": len(_two_batches())}[bad]
    for size in (len(data) or 1, 1, 7, 12, 61, 62, 100):   # whole, and in pieces of any size
        check = BatchCheck()
        for at in range(0, len(data), size):
            check.feed(data[at:at + size])
        assert check.close() == expected, size


def test_the_batch_check_gives_up_on_a_stream_of_small_batches():
    small = build_batch([SimpleRecord(b"v" * 1000, None)])
    data = small * ((1 << 20) // len(small) + 10)          # just over 1 MiB of ~1 KiB batches
    for min_average, checked in ((16 * KIB, False), (512, True)):
        check = BatchCheck(min_average)
        for at in range(0, len(data), 64 * KIB):
            check.feed(data[at:at + 64 * KIB])
        assert check.close() is None and check.checked is checked


def test_compression_shrinks_a_compressible_segment(tmp_path):
    seg = Segment(tmp_path / "logs")
    store = MemoryObjectStore()
    manager = make_rsm(store, **{"compression.enabled": True})
    manager.copy_log_segment_data(seg.metadata, seg.data)
    stored = store.get(manager.object_key(seg.metadata, "log"))
    assert len(stored) < len(seg.bytes) // 2
    assert manager.fetch_log_segment(seg.metadata, 0).read() == seg.bytes


# ---- manifests ------------------------------------------------------------------------------

def write_v1_segment(manager: ObjectStoreRemoteStorageManager, store, meta, log: bytes,
                     real: Segment) -> None:
    """The three objects exactly as the version 1 writer stored them."""
    parts = [(name, real.expected_index(t)) for name, t in (
        ("offset", IndexType.OFFSET), ("timestamp", IndexType.TIMESTAMP),
        ("producerSnapshot", IndexType.PRODUCER_SNAPSHOT),
        ("leaderEpoch", IndexType.LEADER_EPOCH), ("transaction", IndexType.TRANSACTION))]
    indexes, position = {}, 0
    for name, content in parts:
        indexes[name] = {"position": position, "size": len(content)}
        position += len(content)
    size = len(log)
    manifest = {"version": "1", "segmentSize": size,
                "chunkIndex": {"type": "fixed", "originalChunkSize": max(size, 1),
                               "originalFileSize": size, "transformedChunkSize": max(size, 1),
                               "finalTransformedChunkSize": size},
                "segmentIndexes": indexes, "compression": False,
                "remoteLogSegmentMetadata": {"startOffset": meta.start_offset}}
    store.put(manager.object_key(meta, "log"), log)
    store.put(manager.object_key(meta, "indexes"), b"".join(c for _, c in parts))
    store.put(manager.object_key(meta, "rsm-manifest"),
              json.dumps(manifest, separators=(",", ":")).encode())


def test_version_1_manifests_as_written_before_still_read(big):
    recorder = RecordingObjectStore(MemoryObjectStore())
    manager = make_rsm(recorder, **{"chunk.size": KIB, "compression.enabled": True})
    write_v1_segment(manager, recorder.inner, big.metadata, big.bytes, big.real)
    assert manager.fetch_log_segment(big.metadata, 0).read() == big.bytes
    # Read as 4 MiB untransformed chunks, one ranged GET each, whatever chunk.size says.
    assert len(log_gets(recorder)) == 3
    assert manager.fetch_log_segment(big.metadata, 4 * MIB - 7, 4 * MIB + 7).read() == \
        big.bytes[4 * MIB - 7:4 * MIB + 8]
    for index_type in IndexType:
        assert manager.fetch_index(big.metadata, index_type).read() == \
            big.real.expected_index(index_type)
    manifest = manager._manifest(big.metadata)
    assert (manifest.version, manifest.chunk_crcs, manifest.encryption) == ("1", None, None)
    assert SegmentManifest.from_json(manifest.to_json()) == manifest


def test_a_version_1_manifest_claiming_transforms_is_rejected():
    doc = {"version": "1", "segmentSize": 5,
           "chunkIndex": {"type": "fixed", "originalChunkSize": 5, "originalFileSize": 5,
                          "transformedChunkSize": 5, "finalTransformedChunkSize": 5},
           "segmentIndexes": {n: {"position": 0, "size": 0} for n in
                              ("offset", "timestamp", "producerSnapshot", "leaderEpoch")},
           "compression": True}
    with pytest.raises(ValueError, match="untransformed"):
        SegmentManifest.from_json(json.dumps(doc))


def test_version_2_manifest_json_round_trips_with_variable_index_and_encryption(big, keys):
    store = MemoryObjectStore()
    manager = make_rsm(store, **{"chunk.size": MIB, "compression.enabled": True},
                       **ring_configs(keys, "B", ("A", "B")))
    manager.copy_log_segment_data(big.metadata, big.data)
    raw = store.get(manager.object_key(big.metadata, "rsm-manifest"))
    doc = json.loads(raw)
    assert list(doc) == ["version", "segmentSize", "chunkIndex", "chunkCrc32c",
                         "batchCrc32cChecked", "segmentIndexes", "compression", "encryption",
                         "remoteLogSegmentMetadata"]
    assert doc["batchCrc32cChecked"] is False      # batches, then bytes that are none
    assert doc["chunkIndex"]["originalChunkSize"] == MIB
    manifest = SegmentManifest.from_json(raw)
    assert isinstance(manifest.chunk_index, VariableSizeChunkIndex)
    assert manifest.chunk_index.chunk_count == len(manifest.chunk_crcs) == 9
    assert manifest.encryption.key_pair_id == "B"
    assert SegmentManifest.from_json(manifest.to_json()) == manifest
    doc["chunkCrc32c"] = base64.b64encode(b"\0" * 8).decode()     # 2 CRCs for 9 chunks
    with pytest.raises(ValueError, match="CRC"):
        SegmentManifest.from_json(json.dumps(doc))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=40) |
       st.integers(0, 2**31 - 200).flatmap(
           lambda base: st.lists(st.integers(base, base + 150), min_size=2, max_size=40)))
def test_chunk_sizes_codec_round_trips(values):
    assert decode_chunk_sizes(encode_chunk_sizes(values)) == values


def test_chunk_sizes_codec_uses_aivens_compact_layout():
    # count, base, width, the values but the last minus base in `width` bytes, the last value.
    assert encode_chunk_sizes([1_000_000, 1_000_010, 1_000_020, 7]) == struct.pack(
        ">iiB3Bi", 4, 1_000_000, 1, 0, 10, 20, 7)
    assert encode_chunk_sizes([5]) == struct.pack(">ii", 1, 5)
    assert encode_chunk_sizes([]) == struct.pack(">i", 0)
    with pytest.raises(ValueError):
        decode_chunk_sizes(struct.pack(">ii", 2, 5))
    with pytest.raises(ValueError):
        encode_chunk_sizes([-1])


def test_a_copy_leaves_no_staging_files_behind(big, tmp_path, monkeypatch):
    import tempfile
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    manager = make_rsm(MemoryObjectStore(), **{"compression.enabled": True})
    manager.copy_log_segment_data(big.metadata, big.data)
    assert os.listdir(staging) == []
