"""A segment-aware RemoteStorageManager over a dumb ObjectStore, in the layout of Aiven's plugin."""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import io
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from crc32c import crc32c

from strata.common.scheduler import BackgroundThread
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import (
    CustomMetadata, IndexType, LogSegmentData, RemoteLogSegmentMetadata,
    RemoteResourceNotFoundException, RemoteStorageException, RemoteStorageManager,
    TopicIdPartition)
from strata.tiered.storage.chunks import (
    DEFAULT_CHUNK_SIZE, ChunkIndex, FixedSizeChunkIndex, VariableSizeChunkIndex,
    chunk_index_from_json, chunk_range, decode_crcs, encode_crcs)
from strata.tiered.storage.chunk_cache import ChunkCache
from strata.tiered.storage.object_store import ObjectStore, object_store_from_config
from strata.tiered.storage.transforms import (
    BatchCheck, ChunkTransform, KeyRing, SegmentEncryption, first_batch_is_compressed,
    new_data_key)

__all__ = [
    "FixedSizeChunkIndex",
    "ObjectStoreRemoteStorageManager",
    "SegmentIndexEntry",
    "SegmentManifest",
    "VariableSizeChunkIndex",
    "chunk_range",
    "kafka_uuid_str",
]

LOG_SUFFIX = "log"
INDEXES_SUFFIX = "indexes"
MANIFEST_SUFFIX = "rsm-manifest"
MANIFEST_VERSION = "2"
_READABLE_VERSIONS = ("1", "2")

DEFAULT_MANIFEST_CACHE_SIZE = 1000
DEFAULT_FETCH_WINDOW_BYTES = 4 * 1024 * 1024
MAX_CHUNK_SIZE = 1024 * 1024 * 1024
DEFAULT_PREFETCH_MAX_SIZE = 32 * 1024 * 1024
DEFAULT_INCOMPLETE_UPLOAD_MAX_AGE_MS = 3_600_000

logger = logging.getLogger(__name__)
# Version 1 manifests describe one untransformed chunk; it is read as chunks of this size
# (a constant, so chunk ids of a segment never change with the configuration).
V1_READ_CHUNK_SIZE = 4 * 1024 * 1024

# Manifest names of the indexes, in their order inside the .indexes blob.
_INDEX_NAMES = {
    IndexType.OFFSET: "offset",
    IndexType.TIMESTAMP: "timestamp",
    IndexType.PRODUCER_SNAPSHOT: "producerSnapshot",
    IndexType.LEADER_EPOCH: "leaderEpoch",
    IndexType.TRANSACTION: "transaction",
}


# --------------------------------------------------------------------------- manifest


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentIndexEntry:
    """Where one index lies inside the ``.indexes`` blob: its stored (transformed) bytes and,
    from version 2, their CRC32C."""

    position: int
    size: int
    crc32c: int | None = None

    def to_json(self) -> dict[str, int]:
        obj = {"position": self.position, "size": self.size}
        if self.crc32c is not None:
            obj["crc32c"] = self.crc32c
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SegmentIndexEntry:
        crc = obj.get("crc32c")
        return cls(int(obj["position"]), int(obj["size"]), None if crc is None else int(crc))


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentManifest:
    """The ``.rsm-manifest`` of one segment (JSON with Aiven's field names).

    Version 2: ``chunkIndex`` (``fixed`` when untransformed, else ``variable``),
    ``chunkCrc32c`` (base64 of one big-endian uint32 CRC32C per stored chunk),
    ``batchCrc32cChecked`` (every record batch of the segment passed its own CRC32C check when
    it was copied; absent in older manifests: false), ``compression`` (zstd applied),
    ``encryption`` (absent, or the wrapped data key and AAD). Each index in
    ``segmentIndexes`` is transformed alone, as one chunk, and its entry gives its stored
    position, size and CRC32C. Version 1 (read only): one untransformed chunk, no CRCs; it
    is parsed as a ``fixed`` index of ``V1_READ_CHUNK_SIZE`` chunks, which stores the same bytes.

    ``segment_metadata`` is the segment's RemoteLogSegmentMetadata in Aiven's JSON form,
    informational only (audits).
    """

    segment_size: int
    chunk_index: ChunkIndex
    segment_indexes: Mapping[IndexType, SegmentIndexEntry]
    compression: bool = False
    segment_metadata: Mapping[str, Any] | None = None
    encryption: SegmentEncryption | None = None
    chunk_crcs: tuple[int, ...] | None = None
    version: str = MANIFEST_VERSION
    batch_crcs_checked: bool = False

    def to_json(self) -> bytes:
        indexes: dict[str, Any] = {}
        for index_type, name in _INDEX_NAMES.items():
            entry = self.segment_indexes.get(index_type)
            indexes[name] = entry.to_json() if entry is not None else None
        obj: dict[str, Any] = {
            "version": self.version,
            "segmentSize": self.segment_size,
            "chunkIndex": self.chunk_index.to_json(),
        }
        if self.chunk_crcs is not None:
            obj["chunkCrc32c"] = encode_crcs(self.chunk_crcs)
            obj["batchCrc32cChecked"] = self.batch_crcs_checked
        obj["segmentIndexes"] = indexes
        obj["compression"] = self.compression
        if self.encryption is not None:
            obj["encryption"] = self.encryption.to_json()
        if self.segment_metadata is not None:
            obj["remoteLogSegmentMetadata"] = self.segment_metadata
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> SegmentManifest:
        """Parse a manifest; raises ValueError for anything malformed or of another version."""
        try:
            obj = json.loads(data)
            version = obj.get("version")
            if version not in _READABLE_VERSIONS:
                raise ValueError(f"unsupported manifest version {version!r}")
            chunk_index = chunk_index_from_json(obj["chunkIndex"])
            size = int(obj.get("segmentSize", chunk_index.original_file_size))
            if size != chunk_index.original_file_size:
                raise ValueError(f"segmentSize {size} differs from the chunk index's "
                                 f"originalFileSize {chunk_index.original_file_size}")
            compression = obj["compression"]
            if not isinstance(compression, bool):
                raise ValueError(f"compression must be a boolean, got {compression!r}")
            raw = obj["segmentIndexes"]
            indexes = {t: SegmentIndexEntry.from_json(raw[name])
                       for t, name in _INDEX_NAMES.items() if raw.get(name) is not None}
            for t in _INDEX_NAMES:
                if t is not IndexType.TRANSACTION and t not in indexes:
                    raise ValueError(f"manifest lacks the {_INDEX_NAMES[t]} index")
            encryption = None
            crcs = None
            batches_checked = False
            if version == "1":
                if compression or obj.get("encryption") or not isinstance(
                        chunk_index, FixedSizeChunkIndex):
                    raise ValueError("version 1 manifests describe untransformed segments only")
                chunk_index = FixedSizeChunkIndex.untransformed(size, V1_READ_CHUNK_SIZE)
            else:
                if obj.get("encryption") is not None:
                    encryption = SegmentEncryption.from_json(obj["encryption"])
                crcs = decode_crcs(obj["chunkCrc32c"])
                if len(crcs) != chunk_index.chunk_count:
                    raise ValueError(f"{len(crcs)} chunk CRCs for {chunk_index.chunk_count} chunks")
                batches_checked = obj.get("batchCrc32cChecked", False)
                if not isinstance(batches_checked, bool):
                    raise ValueError(f"batchCrc32cChecked must be a boolean, "
                                     f"got {batches_checked!r}")
            return cls(size, chunk_index, indexes, compression,
                       obj.get("remoteLogSegmentMetadata"), encryption, crcs, version,
                       batches_checked)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"malformed segment manifest: {e!r}") from e

    @property
    def transformed(self) -> bool:
        return self.compression or self.encryption is not None


# Segments whose batches average fewer bytes are not checked at the copy (their readers check
# each batch): the check costs a Python step per batch, 0.5 CPU-s per GiB of 1 KiB batches.
BATCH_CHECK_MIN_AVERAGE = 16 * 1024


def _batches_intact(check: BatchCheck, meta: RemoteLogSegmentMetadata) -> bool:
    """Whether every record batch of the copied segment passed its CRC32C check. A segment
    that failed is copied as it is (as Kafka copies it); its readers then check each batch."""
    bad = check.close()
    if bad is None:
        return check.checked
    logger.warning("segment %s of %s: the batch at byte %d is malformed or fails its CRC32C; "
                   "copied as it is, marked for readers to check every batch",
                   kafka_uuid_str(meta.remote_log_segment_id.id), meta.topic_id_partition, bad)
    return False


def _metadata_json(meta: RemoteLogSegmentMetadata) -> dict[str, Any]:
    tip = meta.topic_id_partition
    return {
        "remoteLogSegmentId": {
            "topicIdPartition": {"topicId": kafka_uuid_str(tip.topic_id),
                                 "topicPartition": {"topic": tip.topic, "partition": tip.partition}},
            "id": kafka_uuid_str(meta.remote_log_segment_id.id),
        },
        "startOffset": meta.start_offset,
        "endOffset": meta.end_offset,
        "maxTimestampMs": meta.max_timestamp_ms,
        "brokerId": meta.broker_id,
        "eventTimestampMs": meta.event_timestamp_ms,
        "segmentLeaderEpochs": {str(k): v for k, v in meta.segment_leader_epochs.items()},
    }


# A recovered segment's objects stay under the key of the topic id they were copied with: its
# custom metadata is ORIGIN_MARK + that id's 16 bytes (docs/remote-manifests.md).
ORIGIN_MARK = b"strata-origin-topic-id:"


def origin_custom_metadata(topic_id: uuid.UUID) -> bytes:
    return ORIGIN_MARK + topic_id.bytes


def origin_topic_id(custom: bytes | None) -> uuid.UUID | None:
    """The topic id in the keys of a segment recovered from another topic id, else None."""
    if custom is None or len(custom) != len(ORIGIN_MARK) + 16 or not custom.startswith(ORIGIN_MARK):
        return None
    return uuid.UUID(bytes=bytes(custom[len(ORIGIN_MARK):]))


# --------------------------------------------------------------------------- streams


class _ChunkStream(io.RawIOBase):
    """A read-only stream over original bytes ``[start, end)`` of a segment, loading one
    chunk at a time with ``load(chunk_id)`` as it is read; ``first`` is the already loaded
    first chunk of ``ids``.

    Errors of later loads (a corrupt chunk, the object deleted meanwhile, the store down)
    surface from ``read`` as RemoteStorageException. Not thread-safe: one stream per caller.
    """

    def __init__(self, load: Callable[[int], bytes], index: ChunkIndex, ids: range,
                 start: int, end: int, first: bytes) -> None:
        super().__init__()
        self._load = load
        self._index = index
        self._start = start
        self._end = end
        self._ids = ids
        self._pending = iter(ids[1:])
        self._chunk: tuple[int, memoryview] = (start, memoryview(b""))  # loaded chunk, its start
        self._resume = start        # where reading goes on in the next chunk loaded
        self._buffer = self._slice(ids[0], first)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _slice(self, chunk_id: int, data: bytes) -> memoryview:
        chunk_start, chunk_stop = self._index.original_range(chunk_id)
        whole = memoryview(data)[:min(self._end, chunk_stop) - chunk_start]
        self._chunk = (chunk_start, whole)
        return whole[max(self._resume - chunk_start, 0):]

    def tell(self) -> int:
        chunk_start, whole = self._chunk
        return chunk_start + len(whole) - len(self._buffer) - self._start

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move within the range (positions count from its start, clamped to it). A target
        outside the loaded chunk loads its chunk only when read, so skipped chunks are never
        fetched."""
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        if whence == io.SEEK_SET:
            base = 0
        elif whence == io.SEEK_CUR:
            base = self.tell()
        elif whence == io.SEEK_END:
            base = self._end - self._start
        else:
            raise ValueError(f"invalid whence {whence}")
        target = min(max(self._start + base + offset, self._start), self._end)
        chunk_start, whole = self._chunk
        if chunk_start <= target < chunk_start + len(whole):
            self._buffer = whole[target - chunk_start:]
        else:
            self._chunk = (target, memoryview(b""))
            self._buffer = memoryview(b"")
            self._resume = target
            first = self._index.chunk_id(target) if target < self._end else self._ids.stop
            self._pending = iter(range(max(first, self._ids.start), self._ids.stop))
        return target - self._start

    def view(self, start: int, n: int) -> memoryview | None:
        """Bytes ``[start, start + n)`` of the range straight out of the loaded chunk (no
        copy; the chunk is immutable), or None when that chunk does not hold them all. The
        stream does not move."""
        chunk_start, whole = self._chunk
        lo = start - chunk_start
        if lo < 0 or start < self._start or lo + n > len(whole):
            return None
        return whole[lo:lo + n]

    def _advance(self) -> bool:
        chunk_id = next(self._pending, None)
        if chunk_id is None:
            self._buffer = memoryview(b"")
            return False
        self._buffer = self._slice(chunk_id, self._load(chunk_id))
        return True

    def _unread(self) -> memoryview:
        """What is left of the loaded chunk's part of the range, loading the next chunk when
        it is used up; empty at the end."""
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        while not self._buffer and self._advance():
            pass
        return self._buffer

    def readinto(self, b: Any) -> int:
        unread = self._unread()
        n = min(len(b), len(unread))
        b[:n] = unread[:n]
        self._buffer = unread[n:]
        return n

    def readview(self) -> memoryview:
        """The rest of the loaded chunk's part of the range as a read-only view (no copy),
        moving past it; empty at the end."""
        piece = self._unread()
        self._buffer = piece[len(piece):]
        return piece

    def readall(self) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        parts = [bytes(self._buffer)]
        while self._advance():
            parts.append(bytes(self._buffer))
        return b"".join(parts)

    def close(self) -> None:
        self._buffer = memoryview(b"")
        self._chunk = (self._start, memoryview(b""))
        self._pending = iter(())
        super().close()


# --------------------------------------------------------------------------- the RSM

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _LruCache(Generic[K, V]):
    """A small thread-safe LRU (parsed manifests by segment uuid, data keys)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[K, V] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self._capacity <= 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def invalidate(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _config_bool(configs: Mapping[str, Any], key: str, default: bool) -> bool:
    value = configs.get(key, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise RemoteStorageException(f"{key} must be true or false, got {value!r}")


def _config_int(configs: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = configs.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise RemoteStorageException(f"{key} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise RemoteStorageException(f"{key} must be in [{low}, {high}], got {number}")
    return number


def log_part(chunk_id: int) -> bytes:
    """A ``.log`` chunk's place, bound into its encryption (see ChunkTransform)."""
    return b"log:%d" % chunk_id


def index_part(index_type: IndexType) -> bytes:
    """An index's place in the ``.indexes`` object, bound into its encryption."""
    return b"index:" + IndexType(index_type).name.encode()


class ObjectStoreRemoteStorageManager(RemoteStorageManager):
    """Stores each segment as three objects in an ObjectStore, in Aiven's layout.

    Keys: ``{key.prefix}{topic}-{topicId}/{partition}/{%020d startOffset}-{segmentUuid}.{suffix}``
    where both uuids are in Kafka's string form (URL-safe base64, 22 chars) and suffix is:

    - ``log``: the segment file cut into ``chunk.size`` chunks, each compressed and/or
      encrypted on its own, stored back to back (as is when neither is enabled);
    - ``indexes``: the offset index, time index, producer snapshot, leader-epoch checkpoint
      and, if the segment has one, transaction index, each transformed alone, concatenated;
    - ``rsm-manifest``: JSON (``SegmentManifest``, version ``"2"``): the chunk index, a
      CRC32C per stored chunk, each index's place in the blob, the compression flag and the
      wrapped data key. Version ``"1"`` manifests (one untransformed chunk) stay readable.

    A copy uploads ``.log``, then ``.indexes``, then the manifest last: the manifest is the
    commit marker, so a segment without one is incomplete (a crash mid-copy) and is never
    read. A failed copy deletes what it may have written (best effort) and raises; a retry
    overwrites. A delete removes the manifest first, then the data. The broker's remote log
    metadata, not a listing of the store, is the source of truth for which segments exist;
    listings (``list_partition_objects``) serve audits and topic-deletion checks.

    A fetch loads the chunks its range covers one at a time as the stream is read: one ranged
    GET of the chunk's stored bytes, a CRC32C check, then decryption and decompression
    (``_load_chunk``; through ``chunk_cache.get((log key, chunk id), loader)`` when a cache is
    given, whose ``invalidate(log key)``, if any, is called on copy and delete). A chunk that
    fails its check raises RemoteStorageException.

    Configured with the ``rsm.config.``-stripped keys: ``storage.url`` (required unless a
    store is passed to the constructor), ``key.prefix`` (default ""),
    ``manifest.cache.size`` (default 1000), ``chunk.size`` (original bytes per chunk,
    default 4 MiB), ``compression.enabled`` (zstd per chunk, default false),
    ``compression.heuristic.enabled`` (skip compression when the segment's first batch is
    already compressed, default false), ``encryption.enabled`` (default false),
    ``encryption.key.pair.id`` (the key pair wrapping new segments' data keys),
    ``encryption.key.pairs`` (comma list of ids; old ids must stay listed while segments
    encrypted with them exist), ``encryption.key.pairs.<id>.private.key.file`` and
    ``encryption.key.pairs.<id>.public.key.file`` (RSA PEM; the public one is optional),
    ``prefetch.max.size`` (the read-ahead a sequential reader grows to, default 32 MiB; 0
    turns read-ahead off), the ``chunk.cache.*`` keys of ``ChunkCache.from_config`` (a 256 MiB
    memory tier by default), ``fetch.window.bytes`` (accepted for compatibility, unused),
    ``incomplete.upload.max.age.ms`` (how old what an interrupted upload left must be before
    ``abort_incomplete_uploads`` removes it, default one hour: uploads of other brokers
    sharing the store finish well within it) and the ``storage.*`` /
    ``fault.*`` keys of ``object_store_from_config``. Thread-safe: any method may be called
    from several threads.
    """

    chunk_range = staticmethod(chunk_range)

    def __init__(self, store: ObjectStore | None = None, *, chunk_cache: Any = None) -> None:
        self._store = store
        self._chunk_cache = chunk_cache
        self._own_cache = chunk_cache is None       # configure() builds it from the keys
        self._prefetch_max = DEFAULT_PREFETCH_MAX_SIZE
        self._planner = BackgroundThread("rsm-prefetch-plan")
        self._key_prefix = ""
        self._incomplete_upload_max_age_ms = DEFAULT_INCOMPLETE_UPLOAD_MAX_AGE_MS
        self._chunk_size = DEFAULT_CHUNK_SIZE
        self._compression = False
        self._compression_heuristic = False
        self._encryption_key_pair: str | None = None
        self._key_ring = KeyRing()
        self._lock = threading.Lock()
        self._manifests: _LruCache[uuid.UUID, SegmentManifest] = _LruCache(DEFAULT_MANIFEST_CACHE_SIZE)
        self._data_keys: _LruCache[tuple[str, bytes], bytes] = _LruCache(DEFAULT_MANIFEST_CACHE_SIZE)

    def configure(self, configs: Mapping[str, Any]) -> None:
        """Read the configuration (see the class docstring); invalid values raise
        RemoteStorageException naming the key."""
        prefix = str(configs.get("key.prefix", "") or "")
        if prefix.startswith("/") or "//" in prefix or any(
                p in (".", "..") for p in prefix.split("/")):
            raise RemoteStorageException(f"key.prefix {prefix!r} is not a valid key prefix")
        _config_int(configs, "fetch.window.bytes", DEFAULT_FETCH_WINDOW_BYTES, 1, 2**63 - 1)
        cache_size = _config_int(configs, "manifest.cache.size", DEFAULT_MANIFEST_CACHE_SIZE,
                                 -(2**63), 2**63 - 1)
        chunk_size = _config_int(configs, "chunk.size", DEFAULT_CHUNK_SIZE, 1, MAX_CHUNK_SIZE)
        prefetch_max = _config_int(configs, "prefetch.max.size", DEFAULT_PREFETCH_MAX_SIZE, 0,
                                   2**63 - 1)
        max_age = _config_int(configs, "incomplete.upload.max.age.ms",
                              DEFAULT_INCOMPLETE_UPLOAD_MAX_AGE_MS, 0, 2**63 - 1)
        compression = _config_bool(configs, "compression.enabled", False)
        heuristic = _config_bool(configs, "compression.heuristic.enabled", False)
        key_ring = KeyRing.from_config(configs)
        active: str | None = None
        if _config_bool(configs, "encryption.enabled", False):
            active = str(configs.get("encryption.key.pair.id", "") or "").strip()
            if not active:
                raise RemoteStorageException(
                    "encryption.key.pair.id is required when encryption.enabled is true")
            if active not in key_ring:
                raise RemoteStorageException(
                    f"encryption.key.pair.id {active!r} is not in encryption.key.pairs")
        self._key_prefix = prefix
        self._incomplete_upload_max_age_ms = max_age
        self._chunk_size = chunk_size
        self._compression = compression
        self._compression_heuristic = heuristic
        self._encryption_key_pair = active
        self._key_ring = key_ring
        self._manifests = _LruCache(cache_size)
        self._manifest_loads: dict[uuid.UUID, threading.Lock] = {}
        self._data_keys = _LruCache(max(cache_size, 1))
        self._prefetch_max = prefetch_max
        if self._own_cache:
            try:
                cache = ChunkCache.from_config(configs)
            except ValueError as e:
                raise RemoteStorageException(f"invalid chunk cache configuration: {e}") from e
            if self._chunk_cache is not None:
                self._chunk_cache.close()
            self._chunk_cache = cache
            if cache is not None and prefetch_max and \
                    cache.config.prefetch_hold_size < prefetch_max + 3 * chunk_size:
                logger.warning(
                    "chunk.cache.prefetch.hold.size %d is below prefetch.max.size %d plus three "
                    "chunks: read-ahead will be dropped before it is read",
                    cache.config.prefetch_hold_size, prefetch_max)
        if self._store is None:
            self._store = object_store_from_config(configs)

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            raise RemoteStorageException("ObjectStoreRemoteStorageManager is not configured")
        return self._store

    @property
    def key_prefix(self) -> str:
        return self._key_prefix

    def abort_waits(self) -> None:
        """``abort_waits`` on every layer of the store that has one (the rate limiter's)."""
        layer: Any = self._store
        for _ in range(32):
            if layer is None:
                return
            abort = getattr(layer, "abort_waits", None)
            if callable(abort):
                abort()
            layer = getattr(layer, "inner", None)

    # ---- layout -----------------------------------------------------------------------------

    def partition_prefix(self, topic_id_partition: TopicIdPartition) -> str:
        """``{prefix}{topic}-{topicId}/{partition}/``: the start of every key of the partition."""
        tip = topic_id_partition
        return f"{self._key_prefix}{tip.topic}-{kafka_uuid_str(tip.topic_id)}/{tip.partition}/"

    def object_key(self, meta: RemoteLogSegmentMetadata, suffix: str) -> str:
        """The key of one of the segment's objects (suffix ``log``, ``indexes`` or
        ``rsm-manifest``); a recovered segment's are under its origin topic id."""
        tip = meta.topic_id_partition
        origin = origin_topic_id(meta.custom_metadata)
        if origin is not None:
            tip = TopicIdPartition(origin, tip.topic_partition)
        return (f"{self.partition_prefix(tip)}{meta.start_offset:020d}-"
                f"{kafka_uuid_str(meta.remote_log_segment_id.id)}.{suffix}")

    def segment_keys(self, meta: RemoteLogSegmentMetadata) -> list[str]:
        """The keys of the segment's three objects, manifest first."""
        return [self.object_key(meta, s) for s in (MANIFEST_SUFFIX, LOG_SUFFIX, INDEXES_SUFFIX)]

    def list_partition_objects(self, topic_id_partition: TopicIdPartition) -> list[tuple[str, int]]:
        """``(key, size)`` of every object stored under the partition's prefix."""
        return list(self.store.list(self.partition_prefix(topic_id_partition)))

    # ---- copy -------------------------------------------------------------------------------

    def copy_log_segment_data(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                              log_segment_data: LogSegmentData) -> CustomMetadata | None:
        meta, data = remote_log_segment_metadata, log_segment_data
        store = self.store
        segment_id = meta.remote_log_segment_id.id
        self._manifests.invalidate(segment_id)
        self._invalidate_chunks(meta)     # a re-copy may chunk differently
        try:
            compression = self._compression and not (
                self._compression_heuristic and first_batch_is_compressed(data.log_segment))
            encryption = None
            transform = ChunkTransform(compression)
            if self._encryption_key_pair is not None:
                data_key, aad = new_data_key()
                encryption = SegmentEncryption(
                    self._encryption_key_pair,
                    self._key_ring.wrap(self._encryption_key_pair, data_key), aad)
                transform = ChunkTransform(compression, data_key, aad)
            check = BatchCheck(BATCH_CHECK_MIN_AVERAGE)
            segment_size, chunk_index, crcs = self._upload_log(
                self.object_key(meta, LOG_SUFFIX), data.log_segment, transform, check)
            batches_checked = _batches_intact(check, meta)
            blob, entries = self._index_blob(data, transform)
            store.put(self.object_key(meta, INDEXES_SUFFIX), blob)
            manifest = SegmentManifest(segment_size, chunk_index, entries, compression,
                                       _metadata_json(meta), encryption, tuple(crcs),
                                       batch_crcs_checked=batches_checked)
            store.put(self.object_key(meta, MANIFEST_SUFFIX), manifest.to_json())
        except BaseException as e:
            self._delete_quietly(meta)
            if isinstance(e, RemoteStorageException):
                raise
            if isinstance(e, Exception):
                raise RemoteStorageException(
                    f"copy of remote segment {kafka_uuid_str(segment_id)} failed: {e}") from e
            raise
        self._manifests.put(segment_id, manifest)
        return None

    def _upload_log(self, key: str, path: str | os.PathLike[str], transform: ChunkTransform,
                    check: BatchCheck) -> tuple[int, ChunkIndex, list[int]]:
        """Upload the segment file as chunks; ``(size, chunk index, CRC32C per stored chunk)``.
        Each chunk read is fed to ``check`` too. Transformed chunks are staged in a temporary
        file, so memory holds one chunk."""
        chunk_size = self._chunk_size
        crcs: list[int] = []
        sizes: list[int] = []
        segment_size = 0
        with open(path, "rb") as source:
            if transform.identity:
                while chunk := source.read(chunk_size):
                    check.feed(chunk)
                    crcs.append(crc32c(chunk))
                    segment_size += len(chunk)
                self._check_unchanged(path, segment_size)
                self.store.put_file(key, path)
                return segment_size, FixedSizeChunkIndex.untransformed(segment_size, chunk_size), crcs
            with tempfile.NamedTemporaryFile(prefix="strata-rsm-", suffix=".log") as staged:
                while chunk := source.read(chunk_size):
                    check.feed(chunk)
                    stored = transform.transform(chunk, log_part(len(sizes)))
                    staged.write(stored)
                    crcs.append(crc32c(stored))
                    sizes.append(len(stored))
                    segment_size += len(chunk)
                staged.flush()
                self._check_unchanged(path, segment_size)
                self.store.put_file(key, staged.name)
        return segment_size, VariableSizeChunkIndex(chunk_size, segment_size, tuple(sizes)), crcs

    def abort_incomplete_uploads(self) -> int:
        """Remove what interrupted uploads under ``key.prefix`` left in the store, once older
        than ``incomplete.upload.max.age.ms`` (see ``ObjectStore.abort_incomplete_uploads``)."""
        removed = self.store.abort_incomplete_uploads(self._key_prefix,
                                                      self._incomplete_upload_max_age_ms)
        return len(removed)

    def batches_verified(self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> bool:
        """True when every batch of the segment passed its CRC32C check when it was copied
        (the manifest's ``batchCrc32cChecked``): every chunk read is checked against its
        stored CRC32C, so what ``fetch_log_segment`` returns is those batches unchanged."""
        manifest = self._manifest(remote_log_segment_metadata)
        return manifest.batch_crcs_checked and manifest.chunk_crcs is not None

    @staticmethod
    def _check_unchanged(path: str | os.PathLike[str], size: int) -> None:
        if os.stat(path).st_size != size:
            raise RemoteStorageException(f"segment file {path} changed size while being copied")

    @staticmethod
    def _index_blob(data: LogSegmentData, transform: ChunkTransform
                    ) -> tuple[bytes, dict[IndexType, SegmentIndexEntry]]:
        parts: list[tuple[IndexType, bytes]] = [
            (IndexType.OFFSET, Path(data.offset_index).read_bytes()),
            (IndexType.TIMESTAMP, Path(data.time_index).read_bytes()),
            (IndexType.PRODUCER_SNAPSHOT, Path(data.producer_snapshot_index).read_bytes()),
            (IndexType.LEADER_EPOCH, bytes(data.leader_epoch_index)),
        ]
        if data.transaction_index is not None:
            parts.append((IndexType.TRANSACTION, Path(data.transaction_index).read_bytes()))
        entries: dict[IndexType, SegmentIndexEntry] = {}
        stored_parts: list[bytes] = []
        position = 0
        for index_type, content in parts:
            # An empty index is stored as nothing, whatever the transforms.
            stored = transform.transform(content, index_part(index_type)) if content else b""
            entries[index_type] = SegmentIndexEntry(position, len(stored), crc32c(stored))
            stored_parts.append(stored)
            position += len(stored)
        return b"".join(stored_parts), entries

    def _delete_quietly(self, meta: RemoteLogSegmentMetadata) -> None:
        # Best effort, key by key so one failure does not keep the others; what is left is
        # cleaned up by the copier's retry (which overwrites) or by the expirer.
        for key in self.segment_keys(meta):
            try:
                self.store.delete(key)
            except Exception:
                pass

    # ---- fetch ------------------------------------------------------------------------------

    def _manifest(self, meta: RemoteLogSegmentMetadata) -> SegmentManifest:
        """The segment's manifest, cached; concurrent first readers of one segment (a fetch and
        the read-ahead) share one GET."""
        segment_id = meta.remote_log_segment_id.id
        manifest = self._manifests.get(segment_id)
        if manifest is not None:
            return manifest
        with self._lock:
            loading = self._manifest_loads.setdefault(segment_id, threading.Lock())
        try:
            with loading:
                manifest = self._manifests.get(segment_id)
                if manifest is None:
                    key = self.object_key(meta, MANIFEST_SUFFIX)
                    raw = self.store.get(key)
                    try:
                        manifest = SegmentManifest.from_json(raw)
                    except ValueError as e:
                        raise RemoteStorageException(f"manifest {key}: {e}") from e
                    self._manifests.put(segment_id, manifest)
                return manifest
        finally:
            with self._lock:
                if self._manifest_loads.get(segment_id) is loading and not loading.locked():
                    del self._manifest_loads[segment_id]

    def _transform(self, manifest: SegmentManifest) -> ChunkTransform:
        """The manifest's transform, its data key unwrapped (and cached)."""
        enc = manifest.encryption
        if enc is None:
            return ChunkTransform(manifest.compression)
        cache_key = (enc.key_pair_id, enc.wrapped_key)
        data_key = self._data_keys.get(cache_key)
        if data_key is None:
            data_key = self._key_ring.unwrap(enc.key_pair_id, enc.wrapped_key)
            self._data_keys.put(cache_key, data_key)
        return ChunkTransform(manifest.compression, data_key, enc.aad)

    def _load_chunk(self, meta: RemoteLogSegmentMetadata, manifest: SegmentManifest,
                    chunk_id: int) -> bytes | memoryview:
        """The original bytes of chunk ``chunk_id`` of the segment's ``.log``: one ranged GET
        of its stored bytes, CRC32C check, decryption, decompression. A chunk failing any
        check raises RemoteStorageException naming the object and the chunk."""
        key = self.object_key(meta, LOG_SUFFIX)
        index = manifest.chunk_index
        start, stop = index.stored_range(chunk_id)
        original_start, original_stop = index.original_range(chunk_id)
        transform = self._transform(manifest)
        stored = self.store.get_range_buffer(key, start, stop)
        if len(stored) != stop - start:
            raise RemoteStorageException(
                f"{key} chunk {chunk_id} is truncated: {len(stored)} of {stop - start} bytes "
                f"at {start}")
        if manifest.chunk_crcs is not None and crc32c(stored) != manifest.chunk_crcs[chunk_id]:
            raise RemoteStorageException(f"{key} chunk {chunk_id} is corrupt: CRC32C mismatch")
        if transform.identity:
            return stored
        try:
            return transform.detransform(stored, log_part(chunk_id), original_stop - original_start)
        except ValueError as e:
            raise RemoteStorageException(f"{key} chunk {chunk_id} is corrupt: {e}") from e

    def _chunk(self, meta: RemoteLogSegmentMetadata, manifest: SegmentManifest,
               chunk_id: int) -> bytes:
        if self._chunk_cache is None:
            return self._load_chunk(meta, manifest, chunk_id)
        return self._chunk_cache.get((self.object_key(meta, LOG_SUFFIX), chunk_id),
                                     lambda: self._load_chunk(meta, manifest, chunk_id))

    def fetch_log_segment(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                          start_position: int, end_position: int | None = None) -> BinaryIO:
        """The segment's bytes from ``start_position`` to ``end_position`` (inclusive), clamped
        to the segment's end. The first chunk is loaded before returning (so a missing
        segment raises here); later chunks as the stream is read."""
        if start_position < 0:
            raise ValueError(f"start_position must be >= 0, got {start_position}")
        if end_position is not None and end_position < start_position:
            raise ValueError(f"end_position {end_position} must be >= start_position {start_position}")
        meta = remote_log_segment_metadata
        manifest = self._manifest(meta)
        end = manifest.segment_size if end_position is None else min(end_position + 1,
                                                                      manifest.segment_size)
        ids = chunk_range(manifest, start_position, end)
        if not ids:
            return io.BytesIO(b"")
        first = self._chunk(meta, manifest, ids[0])
        stream = _ChunkStream(lambda chunk_id: self._chunk(meta, manifest, chunk_id),
                              manifest.chunk_index, ids, start_position, end, first)
        if len(ids) == 1:
            return stream  # type: ignore[return-value]  # reads copy straight out of the chunk
        return io.BufferedReader(stream)  # type: ignore[return-value]

    @property
    def chunk_cache(self) -> ChunkCache | None:
        return self._chunk_cache

    @property
    def prefetch_max_size(self) -> int:
        """``prefetch.max.size``: the most a reader should ask ``prefetch`` for at once."""
        return self._prefetch_max if self._chunk_cache is not None else 0

    def prefetch(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                 start_position: int, length: int) -> int:
        """Load the chunks holding ``[start_position, start_position + length)`` into the
        chunk cache in the background; a ``length`` of 0 loads only the manifest. With the
        manifest cached the loads are queued at once; otherwise a planner thread loads the
        manifest first, off the caller's thread. Returns the part of the range past the
        segment's end."""
        meta = remote_log_segment_metadata
        overflow = max(0, start_position + length - meta.segment_size_in_bytes)
        if self._chunk_cache is None or length < 0 or \
                start_position >= meta.segment_size_in_bytes:
            return overflow
        end = start_position + length - overflow
        manifest = self._manifests.get(meta.remote_log_segment_id.id)
        if manifest is not None:
            self._prefetch_chunks(meta, manifest, chunk_range(manifest, start_position, end))
            return overflow
        self._planner.submit(self._plan_prefetch, meta, start_position, end)
        return overflow

    def _plan_prefetch(self, meta: RemoteLogSegmentMetadata, start: int, end: int) -> None:
        manifest = self._manifest(meta)
        self._prefetch_chunks(meta, manifest, chunk_range(manifest, start, end))

    def _prefetch_chunks(self, meta: RemoteLogSegmentMetadata, manifest: SegmentManifest,
                         ids: range) -> None:
        if not ids or self._chunk_cache is None:
            return
        key = self.object_key(meta, LOG_SUFFIX)
        self._chunk_cache.prefetch(
            ((key, chunk_id), functools.partial(self._load_chunk, meta, manifest, chunk_id))
            for chunk_id in ids)

    def fetch_index(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                    index_type: IndexType) -> BinaryIO:
        meta = remote_log_segment_metadata
        if IndexType(index_type) not in self._manifest(meta).segment_indexes:
            raise RemoteResourceNotFoundException(
                f"remote segment {kafka_uuid_str(meta.remote_log_segment_id.id)} has no "
                f"{IndexType(index_type).name} index")
        return self.fetch_indexes(meta, [index_type])[IndexType(index_type)]

    def fetch_indexes(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                      index_types: Iterable[IndexType]) -> dict[IndexType, BinaryIO]:
        """The indexes asked for that the segment has, read with one ranged GET of the
        ``.indexes`` object spanning them all; each checked against its CRC32C."""
        meta = remote_log_segment_metadata
        manifest = self._manifest(meta)
        entries = {t: e for t in map(IndexType, index_types)
                   if (e := manifest.segment_indexes.get(t)) is not None}
        out: dict[IndexType, BinaryIO] = {t: io.BytesIO(b"") for t, e in entries.items() if e.size == 0}
        stored = {t: e for t, e in entries.items() if e.size > 0}
        if not stored:
            return out
        key = self.object_key(meta, INDEXES_SUFFIX)
        start = min(e.position for e in stored.values())
        end = max(e.position + e.size for e in stored.values())
        data = self.store.get_range(key, start, end)
        transform = self._transform(manifest)
        for index_type, entry in stored.items():
            name = index_type.name
            part = data[entry.position - start:entry.position - start + entry.size]
            if len(part) != entry.size:
                raise RemoteStorageException(
                    f"{key} is truncated: {name} index wants "
                    f"{entry.size} bytes at {entry.position}, got {len(part)}")
            if entry.crc32c is not None and crc32c(part) != entry.crc32c:
                raise RemoteStorageException(f"{key}: the {name} index is corrupt: CRC32C mismatch")
            if not transform.identity:
                try:
                    part = transform.detransform(part, index_part(index_type))
                except ValueError as e:
                    raise RemoteStorageException(f"{key}: the {name} index is corrupt: {e}") from e
            out[index_type] = io.BytesIO(part)
        return out

    # ---- delete -----------------------------------------------------------------------------

    def delete_log_segment_data(self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> None:
        meta = remote_log_segment_metadata
        self._manifests.invalidate(meta.remote_log_segment_id.id)
        manifest_key, *data_keys = self.segment_keys(meta)
        self.store.delete(manifest_key)     # first: readers stop seeing a complete segment
        self.store.delete_many(data_keys)
        self._manifests.invalidate(meta.remote_log_segment_id.id)   # cached by a racing fetch
        self._invalidate_chunks(meta)

    def _invalidate_chunks(self, meta: RemoteLogSegmentMetadata) -> None:
        invalidate = getattr(self._chunk_cache, "invalidate", None)
        if invalidate is not None:
            invalidate(self.object_key(meta, LOG_SUFFIX))

    def close(self) -> None:
        self._planner.close()
        if self._own_cache and self._chunk_cache is not None:
            self._chunk_cache.close()
        self._manifests.clear()
        self._data_keys.clear()
        if self._store is not None:
            self._store.close()
