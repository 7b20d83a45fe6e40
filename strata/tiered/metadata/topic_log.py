"""The ``__remote_log_metadata`` topic as the topic-based RemoteLogMetadataManager sees it.

``MetadataTopicLog`` is the port: append a record value to a partition, read committed
values back from an offset. ``LogMetadataTopicLog`` is the broker's implementation over its
own partition logs; ``InMemoryMetadataTopicLog`` serves unit tests and tools.

Records are written as Kafka's producer in the RLMM writes them: key null, value the serde
bytes (``strata.tiered.metadata.serde``), here one record per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from strata.common.types import TopicPartition
from strata.log.committed_records import DEFAULT_CHUNK_BYTES, read_committed
from strata.log.unified_log import UnifiedLog
from strata.protocol import records as rec

__all__ = [
    "InMemoryMetadataTopicLog",
    "LogMetadataTopicLog",
    "MetadataTopicLog",
    "REMOTE_LOG_METADATA_TOPIC_NAME",
    "metadata_topic_configs",
]

# The same name as strata.cluster.metadata's constant (tiered may not import cluster).
REMOTE_LOG_METADATA_TOPIC_NAME = "__remote_log_metadata"


def metadata_topic_configs(retention_ms: int = -1) -> dict[str, str]:
    """Kafka's topic configs for ``__remote_log_metadata`` (TopicBasedRemoteLogMetadataManager's
    createRemoteLogMetadataTopicRequest); segment.bytes stays the broker default."""
    return {"cleanup.policy": "delete", "retention.ms": str(int(retention_ms)),
            "remote.storage.enable": "false"}


class MetadataTopicLog(Protocol):
    """The metadata topic, partition by partition. Every method may be called from any thread."""

    def ensure_topic(self, num_partitions: int, retention_ms: int = -1) -> int:
        """Create the topic with ``num_partitions`` and ``retention.ms`` if absent; its
        partition count (an existing topic keeps its own)."""

    def append(self, partition: int, value: bytes) -> int:
        """Append one record with this value and a null key; blocks until it is committed and
        returns its offset. Raises on failure."""

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes]]:
        """(offset, value) of the committed records from ``start_offset`` (or the log start
        offset, if higher) up to the high watermark, in offset order."""

    def log_start_offset(self, partition: int) -> int:
        """The first offset still in the partition."""

    def end_offset(self, partition: int) -> int:
        """The high watermark: one past the last committed record."""


class LogMetadataTopicLog:
    """MetadataTopicLog over the broker's own partition logs.

    ``metadata`` is the ClusterMetadata (``create_internal_topic``); ``get_log`` finds a
    partition's UnifiedLog (None when it is not hosted here); ``append`` appends a batch to
    a partition and returns its base offset once it is committed (the broker wraps
    ReplicaManager.append; it raises on error). Appends to one partition are serialised
    here; reads walk whole batches (``strata.log.committed_records``); a null value reads as
    ``b""`` (which no decoder accepts), so a reader counts it as a bad record and moves on.
    """

    def __init__(self, metadata: Any, get_log: Callable[[TopicPartition], UnifiedLog | None],
                 append: Callable[[TopicPartition, bytes], int], *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.metadata = metadata
        self._get_log = get_log
        self._append = append
        self.chunk_bytes = chunk_bytes
        self._locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @staticmethod
    def topic_partition(partition: int) -> TopicPartition:
        return TopicPartition(REMOTE_LOG_METADATA_TOPIC_NAME, partition)

    def ensure_topic(self, num_partitions: int, retention_ms: int = -1) -> int:
        info = self.metadata.create_internal_topic(REMOTE_LOG_METADATA_TOPIC_NAME, num_partitions,
                                                   metadata_topic_configs(retention_ms))
        return int(info.partitions)

    def append(self, partition: int, value: bytes) -> int:
        batch = rec.build_batch([rec.SimpleRecord(bytes(value))])
        with self._lock(partition):
            return int(self._append(self.topic_partition(partition), batch))

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes]]:
        ulog = self._get_log(self.topic_partition(partition))
        if ulog is None:
            return
        for record in read_committed(ulog, start_offset, chunk_bytes=self.chunk_bytes):
            yield record.offset, record.value if record.value is not None else b""

    def log_start_offset(self, partition: int) -> int:
        ulog = self._get_log(self.topic_partition(partition))
        return max(ulog.log_start_offset, ulog.local_log_start_offset) if ulog is not None else 0

    def end_offset(self, partition: int) -> int:
        ulog = self._get_log(self.topic_partition(partition))
        return ulog.high_watermark if ulog is not None else 0

    def _lock(self, partition: int) -> threading.Lock:
        with self._locks_lock:
            lock = self._locks.get(partition)
            if lock is None:
                lock = self._locks[partition] = threading.Lock()
            return lock


class InMemoryMetadataTopicLog:
    """MetadataTopicLog in memory: per partition a list of values and a log start offset.

    Every append is committed at once. ``delete_records`` moves a log start offset (as
    retention would); ``values`` shows a partition's live values. Thread-safe (one lock).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_partitions: int | None = None
        self.topic_configs: Mapping[str, str] = {}
        self._values: list[list[bytes]] = []
        self._start: list[int] = []

    def ensure_topic(self, num_partitions: int, retention_ms: int = -1) -> int:
        with self._lock:
            if self.num_partitions is None:
                if num_partitions < 1:
                    raise ValueError(f"invalid partition count {num_partitions}")
                self.num_partitions = num_partitions
                self.topic_configs = metadata_topic_configs(retention_ms)
                self._values = [[] for _ in range(num_partitions)]
                self._start = [0] * num_partitions
            return self.num_partitions

    def append(self, partition: int, value: bytes) -> int:
        with self._lock:
            values = self._partition(partition)
            values.append(bytes(value))
            return self._start[partition] + len(values) - 1

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes]]:
        with self._lock:
            values = self._partition(partition)
            base = self._start[partition]
            first = max(start_offset, base)
            found = [(offset, values[offset - base]) for offset in range(first, base + len(values))]
        yield from found

    def log_start_offset(self, partition: int) -> int:
        with self._lock:
            self._partition(partition)
            return self._start[partition]

    def end_offset(self, partition: int) -> int:
        with self._lock:
            return self._start[partition] + len(self._partition(partition))

    def delete_records(self, partition: int, before_offset: int) -> None:
        """Drop the records below ``before_offset`` (at most up to the end)."""
        with self._lock:
            values = self._partition(partition)
            base = self._start[partition]
            drop = max(0, min(before_offset - base, len(values)))
            del values[:drop]
            self._start[partition] = base + drop

    def values(self, partition: int) -> list[bytes]:
        with self._lock:
            return list(self._partition(partition))

    def _partition(self, partition: int) -> list[bytes]:
        if self.num_partitions is None or not 0 <= partition < self.num_partitions:
            raise KeyError(f"{REMOTE_LOG_METADATA_TOPIC_NAME}-{partition} does not exist")
        return self._values[partition]
