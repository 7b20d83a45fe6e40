"""RemoteStorageManager implementations over a dumb ObjectStore (filesystem, memory, obstore)."""

from strata.tiered.storage.object_store import (
    FaultInjectingObjectStore, FileSystemObjectStore, MemoryObjectStore, ObjectStore,
    ObstoreObjectStore, object_store_from_config)
from strata.tiered.storage.remote_storage_manager import (
    FixedSizeChunkIndex, ObjectStoreRemoteStorageManager, SegmentIndexEntry, SegmentManifest,
    kafka_uuid_str)

__all__ = [
    "FaultInjectingObjectStore",
    "FileSystemObjectStore",
    "FixedSizeChunkIndex",
    "MemoryObjectStore",
    "ObjectStore",
    "ObjectStoreRemoteStorageManager",
    "ObstoreObjectStore",
    "SegmentIndexEntry",
    "SegmentManifest",
    "kafka_uuid_str",
    "object_store_from_config",
]
