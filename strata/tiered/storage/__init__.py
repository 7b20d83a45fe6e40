"""RemoteStorageManager implementations over a dumb ObjectStore (filesystem, memory, obstore)."""

from strata.tiered.storage.chunks import FixedSizeChunkIndex, VariableSizeChunkIndex, chunk_range
from strata.tiered.storage.object_store import (
    FaultInjectingObjectStore, FileSystemObjectStore, MemoryObjectStore, ObjectStore,
    ObstoreObjectStore, object_store_from_config)
from strata.tiered.storage.remote_storage_manager import (
    ObjectStoreRemoteStorageManager, SegmentIndexEntry, SegmentManifest, kafka_uuid_str)
from strata.tiered.storage.transforms import KeyRing, SegmentEncryption

__all__ = [
    "FaultInjectingObjectStore",
    "FileSystemObjectStore",
    "FixedSizeChunkIndex",
    "KeyRing",
    "MemoryObjectStore",
    "ObjectStore",
    "ObjectStoreRemoteStorageManager",
    "ObstoreObjectStore",
    "SegmentEncryption",
    "SegmentIndexEntry",
    "SegmentManifest",
    "VariableSizeChunkIndex",
    "chunk_range",
    "kafka_uuid_str",
    "object_store_from_config",
]
