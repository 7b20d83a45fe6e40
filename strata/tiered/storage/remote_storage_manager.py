"""A segment-aware RemoteStorageManager over a dumb ObjectStore, in the layout of Aiven's plugin."""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import (
    CustomMetadata, IndexType, LogSegmentData, RemoteLogSegmentMetadata,
    RemoteResourceNotFoundException, RemoteStorageException, RemoteStorageManager,
    TopicIdPartition)
from strata.tiered.storage.object_store import ObjectStore, object_store_from_config

__all__ = [
    "FixedSizeChunkIndex",
    "ObjectStoreRemoteStorageManager",
    "SegmentIndexEntry",
    "SegmentManifest",
    "kafka_uuid_str",
]

LOG_SUFFIX = "log"
INDEXES_SUFFIX = "indexes"
MANIFEST_SUFFIX = "rsm-manifest"
MANIFEST_VERSION = "1"

DEFAULT_MANIFEST_CACHE_SIZE = 1000
DEFAULT_FETCH_WINDOW_BYTES = 4 * 1024 * 1024

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
    """Where one index lies inside the ``.indexes`` blob."""

    position: int
    size: int

    def to_json(self) -> dict[str, int]:
        return {"position": self.position, "size": self.size}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SegmentIndexEntry:
        return cls(int(obj["position"]), int(obj["size"]))


@dataclasses.dataclass(frozen=True, slots=True)
class FixedSizeChunkIndex:
    """Aiven's ``fixed`` chunk index: the original file cut into ``original_chunk_size``
    chunks, each ``transformed_chunk_size`` bytes once stored except the last
    (``final_transformed_chunk_size``). Untransformed single-chunk segments store the
    file size in all four."""

    original_chunk_size: int
    original_file_size: int
    transformed_chunk_size: int
    final_transformed_chunk_size: int

    @classmethod
    def single_chunk(cls, file_size: int) -> FixedSizeChunkIndex:
        # Aiven requires a positive chunk size, even for an empty file.
        return cls(max(file_size, 1), file_size, max(file_size, 1), file_size)

    def to_json(self) -> dict[str, Any]:
        return {"type": "fixed", "originalChunkSize": self.original_chunk_size,
                "originalFileSize": self.original_file_size,
                "transformedChunkSize": self.transformed_chunk_size,
                "finalTransformedChunkSize": self.final_transformed_chunk_size}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FixedSizeChunkIndex:
        if obj.get("type") != "fixed":
            raise ValueError(f"unsupported chunk index type {obj.get('type')!r}")
        return cls(int(obj["originalChunkSize"]), int(obj["originalFileSize"]),
                   int(obj["transformedChunkSize"]), int(obj["finalTransformedChunkSize"]))


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentManifest:
    """The ``.rsm-manifest`` of one segment (JSON, ``"version": "1"``, Aiven's field names).

    ``segment_indexes`` maps each IndexType present to its place in the ``.indexes`` blob (no
    TRANSACTION entry when the segment had no transaction index). ``segment_metadata`` is the
    segment's RemoteLogSegmentMetadata in Aiven's JSON form, informational only (audits).
    """

    segment_size: int
    chunk_index: FixedSizeChunkIndex
    segment_indexes: Mapping[IndexType, SegmentIndexEntry]
    compression: bool = False
    segment_metadata: Mapping[str, Any] | None = None

    def to_json(self) -> bytes:
        indexes: dict[str, Any] = {}
        for index_type, name in _INDEX_NAMES.items():
            entry = self.segment_indexes.get(index_type)
            indexes[name] = entry.to_json() if entry is not None else None
        obj: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "segmentSize": self.segment_size,
            "chunkIndex": self.chunk_index.to_json(),
            "segmentIndexes": indexes,
            "compression": self.compression,
        }
        if self.segment_metadata is not None:
            obj["remoteLogSegmentMetadata"] = self.segment_metadata
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> SegmentManifest:
        """Parse a manifest; raises ValueError for anything malformed or of another version."""
        try:
            obj = json.loads(data)
            if obj.get("version") != MANIFEST_VERSION:
                raise ValueError(f"unsupported manifest version {obj.get('version')!r}")
            if obj.get("encryption"):
                raise ValueError("encrypted segments are not supported")
            chunk_index = FixedSizeChunkIndex.from_json(obj["chunkIndex"])
            raw = obj["segmentIndexes"]
            indexes = {t: SegmentIndexEntry.from_json(raw[name])
                       for t, name in _INDEX_NAMES.items() if raw.get(name) is not None}
            for t in _INDEX_NAMES:
                if t is not IndexType.TRANSACTION and t not in indexes:
                    raise ValueError(f"manifest lacks the {_INDEX_NAMES[t]} index")
            size = int(obj.get("segmentSize", chunk_index.original_file_size))
            return cls(size, chunk_index, indexes, bool(obj["compression"]),
                       obj.get("remoteLogSegmentMetadata"))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"malformed segment manifest: {e!r}") from e


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


# --------------------------------------------------------------------------- streams


class _RangeReader(io.RawIOBase):
    """A read-only stream over ``[position, end)`` of one object, fetched in ranged GETs of at
    least ``window`` bytes as it is read; ``first`` is the already fetched first window.

    Errors of later GETs (the object deleted meanwhile, the store down) surface from ``read``
    as RemoteStorageException. Not thread-safe: one reader per caller.
    """

    def __init__(self, store: ObjectStore, key: str, position: int, end: int, window: int,
                 first: bytes) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._end = end
        self._window = window
        self._buffer = memoryview(first)
        self._next = position + len(first)   # position of the first byte not yet fetched

    def readable(self) -> bool:
        return True

    def _fetch(self, n: int) -> bytes:
        start = self._next
        stop = min(self._end, start + max(n, self._window))
        data = self._store.get_range(self._key, start, stop) if stop > start else b""
        self._next = start + len(data)
        if len(data) < stop - start:
            self._end = self._next   # the object is shorter than its manifest says: stop there
        return data

    def readinto(self, b: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        if not self._buffer:
            if self._next >= self._end:
                return 0
            self._buffer = memoryview(self._fetch(len(b)))
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def readall(self) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        head = bytes(self._buffer)
        self._buffer = memoryview(b"")
        rest = self._fetch(self._end - self._next) if self._next < self._end else b""
        return head + rest


# --------------------------------------------------------------------------- the RSM


class _ManifestCache:
    """A small thread-safe LRU of parsed manifests keyed by segment uuid."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[uuid.UUID, SegmentManifest] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: uuid.UUID) -> SegmentManifest | None:
        with self._lock:
            manifest = self._entries.get(key)
            if manifest is not None:
                self._entries.move_to_end(key)
            return manifest

    def put(self, key: uuid.UUID, manifest: SegmentManifest) -> None:
        if self._capacity <= 0:
            return
        with self._lock:
            self._entries[key] = manifest
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def invalidate(self, key: uuid.UUID) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class ObjectStoreRemoteStorageManager(RemoteStorageManager):
    """Stores each segment as three objects in an ObjectStore, in Aiven's layout.

    Keys: ``{key.prefix}{topic}-{topicId}/{partition}/{%020d startOffset}-{segmentUuid}.{suffix}``
    where both uuids are in Kafka's string form (URL-safe base64, 22 chars) and suffix is:

    - ``log``: the segment file's bytes, as is (one chunk, no compression or encryption yet);
    - ``indexes``: one blob, the concatenation of the offset index, time index, producer
      snapshot, leader-epoch checkpoint and, if the segment has one, transaction index;
    - ``rsm-manifest``: JSON (``SegmentManifest``): version ``"1"``, the segment size, a
      ``fixed`` chunk index, each index's position and size in the blob, the compression flag.

    A copy uploads ``.log``, then ``.indexes``, then the manifest last: the manifest is the
    commit marker, so a segment without one is incomplete (a crash mid-copy) and is never
    read. A failed copy deletes what it may have written (best effort) and raises; a retry
    overwrites. A delete removes the manifest first, then the data. The broker's remote log
    metadata, not a listing of the store, is the source of truth for which segments exist;
    listings (``list_partition_objects``) serve audits and topic-deletion checks.

    Configured with the ``rsm.config.``-stripped keys: ``storage.url`` (required unless a
    store is passed to the constructor), ``key.prefix`` (default ""),
    ``manifest.cache.size`` (default 1000), ``fetch.window.bytes`` (ranged GET size of
    segment streams, default 4 MiB) and the ``storage.*`` / ``fault.*`` keys of
    ``object_store_from_config``. Thread-safe: any method may be called from several threads.
    """

    def __init__(self, store: ObjectStore | None = None) -> None:
        self._store = store
        self._key_prefix = ""
        self._fetch_window = DEFAULT_FETCH_WINDOW_BYTES
        self._manifests = _ManifestCache(DEFAULT_MANIFEST_CACHE_SIZE)

    def configure(self, configs: Mapping[str, Any]) -> None:
        """Read the configuration (see the class docstring); invalid values raise
        RemoteStorageException naming the key."""
        prefix = str(configs.get("key.prefix", "") or "")
        if prefix.startswith("/") or "//" in prefix or any(
                p in (".", "..") for p in prefix.split("/")):
            raise RemoteStorageException(f"key.prefix {prefix!r} is not a valid key prefix")
        try:
            window = int(configs.get("fetch.window.bytes", DEFAULT_FETCH_WINDOW_BYTES))
            cache_size = int(configs.get("manifest.cache.size", DEFAULT_MANIFEST_CACHE_SIZE))
        except (TypeError, ValueError) as e:
            raise RemoteStorageException(f"invalid RSM configuration: {e}") from e
        if window <= 0:
            raise RemoteStorageException(f"fetch.window.bytes must be positive, got {window}")
        self._key_prefix = prefix
        self._fetch_window = window
        self._manifests = _ManifestCache(cache_size)
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

    # ---- layout -----------------------------------------------------------------------------

    def partition_prefix(self, topic_id_partition: TopicIdPartition) -> str:
        """``{prefix}{topic}-{topicId}/{partition}/``: the start of every key of the partition."""
        tip = topic_id_partition
        return f"{self._key_prefix}{tip.topic}-{kafka_uuid_str(tip.topic_id)}/{tip.partition}/"

    def object_key(self, meta: RemoteLogSegmentMetadata, suffix: str) -> str:
        """The key of one of the segment's objects (suffix ``log``, ``indexes`` or ``rsm-manifest``)."""
        return (f"{self.partition_prefix(meta.topic_id_partition)}{meta.start_offset:020d}-"
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
        try:
            segment_size = os.stat(data.log_segment).st_size
            store.put_file(self.object_key(meta, LOG_SUFFIX), data.log_segment)
            blob, entries = self._index_blob(data)
            store.put(self.object_key(meta, INDEXES_SUFFIX), blob)
            manifest = SegmentManifest(segment_size, FixedSizeChunkIndex.single_chunk(segment_size),
                                       entries, False, _metadata_json(meta))
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

    @staticmethod
    def _index_blob(data: LogSegmentData) -> tuple[bytes, dict[IndexType, SegmentIndexEntry]]:
        parts: list[tuple[IndexType, bytes]] = [
            (IndexType.OFFSET, Path(data.offset_index).read_bytes()),
            (IndexType.TIMESTAMP, Path(data.time_index).read_bytes()),
            (IndexType.PRODUCER_SNAPSHOT, Path(data.producer_snapshot_index).read_bytes()),
            (IndexType.LEADER_EPOCH, bytes(data.leader_epoch_index)),
        ]
        if data.transaction_index is not None:
            parts.append((IndexType.TRANSACTION, Path(data.transaction_index).read_bytes()))
        entries: dict[IndexType, SegmentIndexEntry] = {}
        position = 0
        for index_type, content in parts:
            entries[index_type] = SegmentIndexEntry(position, len(content))
            position += len(content)
        return b"".join(content for _, content in parts), entries

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
        segment_id = meta.remote_log_segment_id.id
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

    def fetch_log_segment(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                          start_position: int, end_position: int | None = None) -> BinaryIO:
        """The segment's bytes from ``start_position`` to ``end_position`` (inclusive), clamped
        to the segment's end. The first window is fetched before returning (so a missing
        segment raises here); later windows as the stream is read."""
        if start_position < 0:
            raise ValueError(f"start_position must be >= 0, got {start_position}")
        if end_position is not None and end_position < start_position:
            raise ValueError(f"end_position {end_position} must be >= start_position {start_position}")
        meta = remote_log_segment_metadata
        manifest = self._manifest(meta)
        end = manifest.segment_size if end_position is None else min(end_position + 1,
                                                                      manifest.segment_size)
        if start_position >= end:
            return io.BytesIO(b"")
        key = self.object_key(meta, LOG_SUFFIX)
        first = self.store.get_range(key, start_position, min(end, start_position + self._fetch_window))
        if start_position + len(first) >= end:
            return io.BytesIO(first)
        return io.BufferedReader(_RangeReader(self.store, key, start_position, end,
                                              self._fetch_window, first))  # type: ignore[return-value]

    def fetch_index(self, remote_log_segment_metadata: RemoteLogSegmentMetadata,
                    index_type: IndexType) -> BinaryIO:
        meta = remote_log_segment_metadata
        entry = self._manifest(meta).segment_indexes.get(IndexType(index_type))
        if entry is None:
            raise RemoteResourceNotFoundException(
                f"remote segment {kafka_uuid_str(meta.remote_log_segment_id.id)} has no "
                f"{IndexType(index_type).name} index")
        if entry.size == 0:
            return io.BytesIO(b"")
        key = self.object_key(meta, INDEXES_SUFFIX)
        data = self.store.get_range(key, entry.position, entry.position + entry.size)
        if len(data) != entry.size:
            raise RemoteStorageException(
                f"{key} is truncated: {IndexType(index_type).name} index wants "
                f"{entry.size} bytes at {entry.position}, got {len(data)}")
        return io.BytesIO(data)

    # ---- delete -----------------------------------------------------------------------------

    def delete_log_segment_data(self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> None:
        meta = remote_log_segment_metadata
        self._manifests.invalidate(meta.remote_log_segment_id.id)
        manifest_key, *data_keys = self.segment_keys(meta)
        self.store.delete(manifest_key)     # first: readers stop seeing a complete segment
        self.store.delete_many(data_keys)
        self._manifests.invalidate(meta.remote_log_segment_id.id)   # cached by a racing fetch

    def close(self) -> None:
        self._manifests.clear()
        if self._store is not None:
            self._store.close()
