"""The bucket's catalog: where the manifests live, the cluster marker, and the conditional
writes that keep a stale leader from overwriting a newer manifest.

Keys (``p`` is the RSM's ``key.prefix``):

- ``{p}_strata/cluster``: the cluster marker (``ClusterMarker``);
- ``{p}_strata/topics/{topic}/{topicId}``: a topic manifest (``TopicManifest``);
- ``{p}_strata/partitions/{topic}-{topicId}/{partition}/pointer``: which partition manifest
  is current;
- ``{p}_strata/partitions/{topic}-{topicId}/{partition}/manifest-{epoch:010d}-{sequence:012d}``:
  one partition manifest.

Nothing of the catalog is under a topic's segment prefix (``{p}{topic}-{topicId}/``), so
listings of a topic's segments (audits, deletion checks) see segments only.

A partition manifest is written as a new object, then the pointer is replaced by a
conditional PUT (only if it is still the one read): on the filesystem store under an
exclusive lock of the pointer's directory (``flock``: one host), on obstore's stores with
S3/GCS/Azure's If-Match / If-None-Match. Stores without either (the memory store: one
process) compare and write under a process lock. A pointer whose leader epoch is above the
writer's refuses the write (``StaleManifestWriterError``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import uuid
from typing import Any, Callable, Iterator

from strata.common.types import TopicIdPartition
from strata.common.types import uuid_from_kafka_str as kafka_str_to_uuid
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import RemoteResourceNotFoundException, RemoteStorageException
from strata.tiered.bucket.format import (
    ClusterMarker, ManifestError, PartitionManifest, Pointer, SegmentEntry, TopicManifest)
from strata.tiered.storage.object_store import (
    FileSystemObjectStore, ObjectStore, ObstoreObjectStore)

log = logging.getLogger(__name__)

CATALOG_DIR = "_strata"
DEFAULT_LEASE_MS = 300_000
_process_lock = threading.Lock()


class StaleManifestWriterError(RemoteStorageException):
    """A leader tried to replace a partition manifest a later leader epoch wrote."""


class BucketOwnedError(RemoteStorageException):
    """The key prefix belongs to another live cluster."""


# ---- conditional writes ----------------------------------------------------------------------

def _innermost(store: ObjectStore) -> ObjectStore:
    """The backend under the decorators (metering, faults, rate limits)."""
    seen = 0
    while seen < 10:
        inner = getattr(store, "inner", None) or getattr(store, "_inner", None)
        if not isinstance(inner, ObjectStore):
            return store
        store, seen = inner, seen + 1
    return store


class ConditionalWrites:
    """``read(key) -> (data | None, token)`` and ``put_if(key, data, token) -> bool``: the write
    happens only if the object is still what ``read`` saw (absent when ``data`` was None)."""

    def __init__(self, store: ObjectStore):
        self.store = store
        self.backend = _innermost(store)

    @property
    def atomic(self) -> bool:
        """Whether another process's write between read and put is detected."""
        return isinstance(self.backend, (FileSystemObjectStore, ObstoreObjectStore))

    def read(self, key: str) -> tuple[bytes | None, Any]:
        if isinstance(self.backend, ObstoreObjectStore):
            import obstore
            try:
                result = obstore.get(self.backend._store, key)
                data = bytes(result.bytes())
                return data, result.meta.get("e_tag")
            except FileNotFoundError:
                return None, None
            except Exception as e:   # noqa: BLE001 - translated
                if type(e).__name__ == "NotFoundError":
                    return None, None
                raise RemoteStorageException(f"cannot read {key}: {e}") from e
        try:
            data = self.store.get(key)
        except RemoteResourceNotFoundException:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, token: Any, existed: bool) -> bool:
        b = self.backend
        if isinstance(b, ObstoreObjectStore):
            import obstore
            mode: Any = {"e_tag": token} if existed else "create"
            try:
                obstore.put(b._store, key, data, mode=mode, use_multipart=False)
                return True
            except Exception as e:   # noqa: BLE001 - translated
                if type(e).__name__ in ("PreconditionError", "AlreadyExistsError"):
                    return False
                if type(e).__name__ == "NotImplementedError" or "not supported" in str(e).lower():
                    # a store without conditional PUT: the race the docs describe remains
                    log.warning("%s: conditional PUT unsupported (%s); writing unconditionally",
                                key, e)
                    self.store.put(key, data)
                    return True
                raise RemoteStorageException(f"cannot write {key}: {e}") from e
        with self._locked(key):
            current, now_token = self.read(key)
            if (current is not None) != existed or (existed and now_token != token):
                return False
            self.store.put(key, data)
            return True

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        b = self.backend
        if not isinstance(b, FileSystemObjectStore):
            with _process_lock:
                yield
            return
        parent = b._path(key).parent
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with _process_lock:
                yield
        finally:
            os.close(fd)     # releases the lock


# ---- the catalog -----------------------------------------------------------------------------

class BucketCatalog:
    """Manifests and the cluster marker under one key prefix, for cluster ``cluster_id``."""

    def __init__(self, store: ObjectStore, key_prefix: str, cluster_id: str, *,
                 lease_ms: int = DEFAULT_LEASE_MS, clock: Callable[[], int] | None = None):
        import time
        self.store = store
        self.prefix = key_prefix
        self.cluster_id = cluster_id
        self.lease_ms = lease_ms
        self._now = clock or (lambda: int(time.time() * 1000))
        self.cond = ConditionalWrites(store)
        self._owned_until = 0      # no need to look at the marker before this
        self._lock = threading.Lock()
        self.puts = 0              # PUTs this catalog made (manifests, pointers, markers)

    # ---- keys
    @property
    def cluster_key(self) -> str:
        return f"{self.prefix}{CATALOG_DIR}/cluster"

    def topic_key(self, topic: str, topic_id: uuid.UUID) -> str:
        return f"{self.prefix}{CATALOG_DIR}/topics/{topic}/{kafka_uuid_str(topic_id)}"

    def _partition_dir(self, tip: TopicIdPartition) -> str:
        return (f"{self.prefix}{CATALOG_DIR}/partitions/{tip.topic}-"
                f"{kafka_uuid_str(tip.topic_id)}/{tip.partition}/")

    def pointer_key(self, tip: TopicIdPartition) -> str:
        return self._partition_dir(tip) + "pointer"

    def manifest_key(self, tip: TopicIdPartition, leader_epoch: int, sequence: int) -> str:
        return self._partition_dir(tip) + f"manifest-{leader_epoch:010d}-{sequence:012d}"

    def _put(self, key: str, data: bytes) -> None:
        self.store.put(key, data)
        self.puts += 1

    # ---- the cluster marker
    def marker(self) -> ClusterMarker | None:
        data, _ = self.cond.read(self.cluster_key)
        return None if data is None else ClusterMarker.decode(self.cluster_key, data)

    def check_owner(self) -> None:
        """Before any write: this cluster owns the prefix (claimed when no live cluster does,
        the lease renewed when half of it is gone). Raises BucketOwnedError otherwise, or
        ManifestError for a marker that cannot be read (nothing is written over it)."""
        now = self._now()
        if now < self._owned_until:
            return
        with self._lock:
            for _ in range(3):
                now = self._now()
                data, token = self.cond.read(self.cluster_key)
                if data is not None:
                    marker = ClusterMarker.decode(self.cluster_key, data)
                    if marker.cluster_id != self.cluster_id and marker.lease_until_ms > now:
                        raise BucketOwnedError(
                            f"the remote storage prefix {self.prefix!r} belongs to cluster "
                            f"{marker.cluster_id} (its lease in {self.cluster_key} runs until "
                            f"{marker.lease_until_ms}, now {now}); this cluster "
                            f"({self.cluster_id}) will not write to it")
                new = ClusterMarker(self.cluster_id, now + self.lease_ms, now)
                if self.cond.put_if(self.cluster_key, new.encode(), token, data is not None):
                    self.puts += 1
                    if data is None or ClusterMarker.decode(self.cluster_key, data).cluster_id \
                            != self.cluster_id:
                        log.info("cluster %s owns remote storage prefix %r", self.cluster_id,
                                 self.prefix)
                    self._owned_until = now + self.lease_ms // 2
                    return
            raise BucketOwnedError(f"{self.cluster_key} kept changing while this cluster "
                                   f"({self.cluster_id}) claimed it")

    def release(self) -> None:
        """A clean shutdown ends the lease, so another cluster may take the prefix at once."""
        with self._lock:
            data, token = self.cond.read(self.cluster_key)
            if data is None:
                return
            marker = ClusterMarker.decode(self.cluster_key, data)
            if marker.cluster_id != self.cluster_id:
                return
            now = self._now()
            if self.cond.put_if(self.cluster_key,
                                ClusterMarker(self.cluster_id, 0, now).encode(), token, True):
                self.puts += 1
            self._owned_until = 0

    # ---- partition manifests
    def read_pointer(self, tip: TopicIdPartition) -> tuple[Pointer | None, Any, bool]:
        key = self.pointer_key(tip)
        data, token = self.cond.read(key)
        if data is None:
            return None, None, False
        return Pointer.decode(key, data), token, True

    def write_partition(self, tip: TopicIdPartition, leader_epoch: int, log_start_offset: int,
                        segments: list[SegmentEntry]) -> PartitionManifest:
        """Write the partition's manifest at ``leader_epoch``: a new object, then the pointer
        replaced only if no later leader epoch's manifest is current (StaleManifestWriterError
        otherwise) and no other writer replaced it meanwhile."""
        self.check_owner()
        for _ in range(3):
            pointer, token, existed = self.read_pointer(tip)
            if pointer is not None and pointer.leader_epoch > leader_epoch:
                raise StaleManifestWriterError(
                    f"{self.pointer_key(tip)} names a manifest of leader epoch "
                    f"{pointer.leader_epoch}; a leader at epoch {leader_epoch} may not replace it")
            sequence = pointer.sequence + 1 if pointer is not None else 1
            manifest = PartitionManifest(self.cluster_id, tip.topic, tip.topic_id, tip.partition,
                                         leader_epoch, sequence, self._now(), log_start_offset,
                                         tuple(sorted(segments, key=lambda s: s.start_offset)))
            key = self.manifest_key(tip, leader_epoch, sequence)
            self._put(key, manifest.encode())
            new_pointer = Pointer(leader_epoch, sequence, key[len(self._partition_dir(tip)):])
            if self.cond.put_if(self.pointer_key(tip), new_pointer.encode(), token, existed):
                self.puts += 1
                if pointer is not None:
                    self._delete_quietly(self._partition_dir(tip) + pointer.manifest_key)
                return manifest
            self._delete_quietly(key)    # another writer moved the pointer: look again
        raise StaleManifestWriterError(f"{self.pointer_key(tip)} kept changing")

    def read_partition(self, tip: TopicIdPartition) -> PartitionManifest | None:
        """The partition's current manifest, None if it has none; ManifestError if the pointer
        or the manifest it names cannot be read."""
        for _ in range(3):
            pointer, _, _ = self.read_pointer(tip)
            if pointer is None:
                return None
            key = self._partition_dir(tip) + pointer.manifest_key
            try:
                data = self.store.get(key)
            except RemoteResourceNotFoundException:
                continue     # replaced (and deleted) after the pointer was read
            manifest = PartitionManifest.decode(key, data)
            if (manifest.topic, manifest.topic_id, manifest.partition) != \
                    (tip.topic, tip.topic_id, tip.partition):
                raise ManifestError(key, f"describes {manifest.topic_id_partition}, not {tip}")
            return manifest
        raise ManifestError(self.pointer_key(tip), "names a manifest that does not exist")

    def delete_partition(self, tip: TopicIdPartition) -> None:
        """Remove a deleted partition's manifests (pointer first)."""
        pointer, _, _ = self.read_pointer(tip)
        self._delete_quietly(self.pointer_key(tip))
        if pointer is not None:
            self._delete_quietly(self._partition_dir(tip) + pointer.manifest_key)

    def _delete_quietly(self, key: str) -> None:
        try:
            self.store.delete(key)
        except Exception as e:  # noqa: BLE001 - a leftover old manifest is harmless
            log.debug("could not delete %s: %s", key, e)

    # ---- topic manifests
    def write_topic(self, manifest: TopicManifest) -> None:
        self.check_owner()
        self._put(self.topic_key(manifest.topic, manifest.topic_id), manifest.encode())

    def delete_topic(self, topic: str, topic_id: uuid.UUID) -> None:
        self._delete_quietly(self.topic_key(topic, topic_id))

    def topics_named(self, topic: str) -> list[tuple[str, TopicManifest | ManifestError]]:
        """Every topic manifest of ``topic`` in the bucket (one per topic id), newest first;
        those that cannot be read as their ManifestError."""
        out: list[tuple[str, TopicManifest | ManifestError]] = []
        base = f"{self.prefix}{CATALOG_DIR}/topics/{topic}/"
        for key, _ in self.store.list(base):
            rest = key[len(base):]
            if "/" in rest:
                continue
            try:
                kafka_str_to_uuid(rest)
                out.append((key, TopicManifest.decode(key, self.store.get(key))))
            except ManifestError as e:
                out.append((key, e))
            except (ValueError, RemoteResourceNotFoundException):
                continue
        out.sort(key=lambda kv: -kv[1].written_ms if isinstance(kv[1], TopicManifest) else 0)
        return out
