"""``__consumer_offsets`` on this broker's own logs: the group coordinator's ``OffsetsLog`` port.

``append`` writes one record batch through the ReplicaManager as the coordinator (no producer
id, no sequence checks), so fetch waiters on the partition wake as for any produce; in a
cluster it then waits until the batch is replicated to the ISR (Kafka's
``offsets.commit.required.acks=-1`` and ``offsets.commit.timeout.ms``), so a commit the client
saw succeed survives the coordinator's loss. ``replay``
yields the keyed records a partition holds from its log start offset to its high watermark,
committed data only (``strata.log.committed_records``).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping

from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.coordinator.offsets_records import DEFAULT_OFFSETS_TOPIC_PARTITIONS, OFFSETS_TOPIC
from strata.log.committed_records import read_committed
from strata.log.producer_state import AppendOrigin
from strata.protocol import records as rec

log = logging.getLogger(__name__)

# Kafka's topic configs for __consumer_offsets (GroupCoordinator.groupMetadataTopicConfigs);
# segment.bytes is offsets.topic.segment.bytes (default 100 MiB).
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "104857600",
    "compression.type": "producer",
}
REPLAY_CHUNK_BYTES = 1024 * 1024  # offsets.load.buffer.size default (5 MiB in Kafka)


class ReplicaOffsetsLog:
    """``OffsetsLog`` over the ReplicaManager (``strata.coordinator.group_coordinator``)."""

    def __init__(self, replica_manager: Any, metadata: Any,
                 props: Mapping[str, Any] | None = None, *,
                 chunk_bytes: int = REPLAY_CHUNK_BYTES):
        self.replica_manager = replica_manager
        self.metadata = metadata
        props = props or {}
        self.configured_partitions = int(props.get("offsets.topic.num.partitions",
                                                   DEFAULT_OFFSETS_TOPIC_PARTITIONS))
        segment_bytes = props.get("offsets.topic.segment.bytes")
        self.topic_configs = dict(OFFSETS_TOPIC_CONFIGS)
        if segment_bytes is not None:
            self.topic_configs["segment.bytes"] = str(int(segment_bytes))
        self.chunk_bytes = chunk_bytes
        self.commit_timeout_s = int(props.get("offsets.commit.timeout.ms", 5000)) / 1000
        # async (partition, offset the high watermark must reach, timeout s) -> ErrorCode;
        # set by a clustered broker
        self.await_replication: Any = None

    def ensure_topic(self) -> int:
        """Create ``__consumer_offsets`` if it does not exist; its partition count (an existing
        topic keeps its own count, which then wins over ``offsets.topic.num.partitions``)."""
        info = self.metadata.create_internal_topic(OFFSETS_TOPIC, self.configured_partitions,
                                                   self.topic_configs)
        if info.partitions != self.configured_partitions:
            log.warning("%s has %d partitions, not offsets.topic.num.partitions=%d; using %d",
                        OFFSETS_TOPIC, info.partitions, self.configured_partitions,
                        info.partitions)
        return info.partitions

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        if not records:
            return
        batch = rec.build_batch([rec.SimpleRecord(value, key) for key, value in records])
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        wait = self.await_replication
        result = self.replica_manager.append(tp, batch, produce_version=None,
                                             origin=AppendOrigin.COORDINATOR,
                                             required_acks=-1 if wait is not None else 1)
        if result.error == ErrorCode.NONE and wait is not None:
            error = await wait(tp, result.last_offset + 1, self.commit_timeout_s)
            result = result._replace(error=error, message=None)
        if result.error != ErrorCode.NONE:
            raise KafkaError(result.message or f"append to {OFFSETS_TOPIC}-{partition} failed: "
                             f"{ErrorCode(result.error).name}", code=ErrorCode(result.error))

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        ulog = self.replica_manager.get_log(TopicPartition(OFFSETS_TOPIC, partition))
        if ulog is None:
            return
        for record in read_committed(ulog, chunk_bytes=self.chunk_bytes):
            if record.key is not None:
                yield record.key, record.value
