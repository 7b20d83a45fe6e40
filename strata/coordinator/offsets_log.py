"""A coordinator's internal topic on this broker's own logs: ``__consumer_offsets`` (the group
coordinator's ``OffsetsLog`` port) or ``__transaction_state`` (``for_transaction_state``).

``append`` writes one record batch through the ReplicaManager as the coordinator (origin
COORDINATOR: no sequence checks), so fetch waiters on the partition wake as for any produce; in
a cluster it then waits until the batch is replicated to the ISR (Kafka's
``offsets.commit.required.acks=-1`` and ``offsets.commit.timeout.ms``; the transaction log's
writes are acks=-1 too), so a write the client saw succeed survives the coordinator's loss. A
transactional append (a TxnOffsetCommit) is one transactional batch carrying the producer's id
and epoch, as Kafka's GroupMetadataManager writes it.

``replay`` yields the keyed records a partition holds from its log start offset to its high
watermark, committed data only (``strata.log.committed_records``). ``replay_batches`` yields
the same span with its transaction structure, for loaders that resolve transactions
themselves (Kafka's group loader keeps the offsets of a still-open transaction pending):
a ``ReplayRecord`` per keyed data record (aborted and open transactions included) and a
``ReplayMarker`` per COMMIT/ABORT control batch, in log order.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping, NamedTuple

from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.coordinator.offsets_records import DEFAULT_OFFSETS_TOPIC_PARTITIONS, OFFSETS_TOPIC
from strata.log.committed_records import read_committed
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import FetchIsolation
from strata.protocol import records as rec

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"

# Kafka's topic configs for __consumer_offsets (GroupCoordinator.groupMetadataTopicConfigs);
# segment.bytes is offsets.topic.segment.bytes (default 100 MiB).
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "104857600",
    "compression.type": "producer",
}
# Kafka's broker defaults for __transaction_state (TransactionLogConfigs); its topic configs
# are TransactionStateManager.transactionTopicConfigs.
DEFAULT_TRANSACTION_STATE_PARTITIONS = 50       # transaction.state.log.num.partitions
DEFAULT_TRANSACTION_STATE_SEGMENT_BYTES = 104857600  # transaction.state.log.segment.bytes
DEFAULT_TRANSACTION_STATE_MIN_ISR = 2           # transaction.state.log.min.isr
DEFAULT_REQUEST_TIMEOUT_MS = 30_000             # request.timeout.ms
DEFAULT_OFFSETS_COMMIT_TIMEOUT_MS = 5000        # offsets.commit.timeout.ms
REPLAY_CHUNK_BYTES = 1024 * 1024  # offsets.load.buffer.size default (5 MiB in Kafka)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


class ReplayRecord(NamedTuple):
    """A keyed data record of the log; ``transactional`` with the producer's id when written
    in a transaction (its fate is the next ``ReplayMarker`` of that producer id)."""

    key: bytes
    value: bytes | None
    producer_id: int
    transactional: bool
    offset: int
    is_marker = False  # not a field: tells records from markers without importing this module


class ReplayMarker(NamedTuple):
    """A COMMIT (``commit``) or ABORT transaction marker of ``producer_id``."""

    producer_id: int
    commit: bool
    offset: int
    is_marker = True


class ReplicaOffsetsLog:
    """An internal coordinator topic over the ReplicaManager: the group coordinator's
    ``OffsetsLog`` (``strata.coordinator.group``) by default, or, through
    ``for_transaction_state``, the transaction coordinator's ``__transaction_state``."""

    def __init__(self, replica_manager: Any, metadata: Any,
                 props: Mapping[str, Any] | None = None, *,
                 topic: str = OFFSETS_TOPIC,
                 configured_partitions: int | None = None,
                 topic_configs: Mapping[str, str] | None = None,
                 commit_timeout_s: float | None = None,
                 chunk_bytes: int = REPLAY_CHUNK_BYTES,
                 await_replication: Any = None):
        """``topic`` and the settings not given default to ``__consumer_offsets`` and its
        broker properties (``offsets.topic.num.partitions``, ``offsets.topic.segment.bytes``,
        ``offsets.commit.timeout.ms``); any other topic must name its partition count."""
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.topic = topic
        props = props or {}
        offsets = topic == OFFSETS_TOPIC
        if configured_partitions is None:
            if not offsets:
                raise ValueError(f"the partition count of {topic} must be given")
            configured_partitions = int(props.get("offsets.topic.num.partitions",
                                                  DEFAULT_OFFSETS_TOPIC_PARTITIONS))
        self.configured_partitions = int(configured_partitions)
        if topic_configs is None:
            topic_configs = dict(OFFSETS_TOPIC_CONFIGS) if offsets else {}
            segment_bytes = props.get("offsets.topic.segment.bytes") if offsets else None
            if segment_bytes is not None:
                topic_configs["segment.bytes"] = str(int(segment_bytes))
        self.topic_configs = {k: str(v) for k, v in topic_configs.items()}
        self.chunk_bytes = chunk_bytes
        if commit_timeout_s is None:
            commit_timeout_s = (int(props.get("offsets.commit.timeout.ms",
                                              DEFAULT_OFFSETS_COMMIT_TIMEOUT_MS)) if offsets
                                else int(props.get("request.timeout.ms",
                                                   DEFAULT_REQUEST_TIMEOUT_MS))) / 1000
        self.commit_timeout_s = float(commit_timeout_s)
        # async (partition, offset the high watermark must reach, timeout s) -> ErrorCode;
        # given by a clustered broker (None: the write is acks=1)
        self.await_replication: Any = await_replication

    @classmethod
    def for_transaction_state(cls, replica_manager: Any, metadata: Any,
                              props: Mapping[str, Any] | None = None, *,
                              chunk_bytes: int | None = None,
                              await_replication: Any = None) -> "ReplicaOffsetsLog":
        """``__transaction_state`` with Kafka's settings: ``transaction.state.log.num.partitions``
        (50) partitions; topic configs as TransactionStateManager.transactionTopicConfigs sets
        them (compacted, uncompressed, no unclean election, ``min.insync.replicas`` from
        ``transaction.state.log.min.isr`` (2), ``segment.bytes`` from
        ``transaction.state.log.segment.bytes``); writes wait up to ``request.timeout.ms``
        for the ISR (Kafka's timeout for the log's tombstones; it gives a transaction's own
        state writes the transaction timeout, which ``append(timeout_ms=)`` takes)."""
        props = props or {}
        configs = {
            "unclean.leader.election.enable": "false",
            "compression.type": "uncompressed",
            "cleanup.policy": "compact",
            "min.insync.replicas": str(int(props.get("transaction.state.log.min.isr",
                                                     DEFAULT_TRANSACTION_STATE_MIN_ISR))),
            "segment.bytes": str(int(props.get("transaction.state.log.segment.bytes",
                                               DEFAULT_TRANSACTION_STATE_SEGMENT_BYTES))),
        }
        if chunk_bytes is None:
            chunk_bytes = int(props.get("transaction.state.log.load.buffer.size",
                                        REPLAY_CHUNK_BYTES))
        return cls(replica_manager, metadata, props, topic=TRANSACTION_STATE_TOPIC,
                   configured_partitions=int(props.get("transaction.state.log.num.partitions",
                                                       DEFAULT_TRANSACTION_STATE_PARTITIONS)),
                   topic_configs=configs,
                   commit_timeout_s=int(props.get("request.timeout.ms",
                                                  DEFAULT_REQUEST_TIMEOUT_MS)) / 1000,
                   chunk_bytes=chunk_bytes, await_replication=await_replication)

    def ensure_topic(self) -> int:
        """Create the topic if it does not exist; its partition count (an existing topic keeps
        its own count, which then wins over the configured one)."""
        info = self.metadata.create_internal_topic(self.topic, self.configured_partitions,
                                                   self.topic_configs)
        if info.partitions != self.configured_partitions:
            log.warning("%s has %d partitions, not the configured %d; using %d",
                        self.topic, info.partitions, self.configured_partitions,
                        info.partitions)
        return info.partitions

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]], *,
                     producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                     transactional: bool = False, timeout_ms: int | None = None) -> None:
        """Append ``records`` as one batch; raise a ``KafkaError`` unless it is durable.

        ``transactional`` writes a transactional batch of ``producer_id``/``producer_epoch``
        with base sequence 0, as Kafka's GroupMetadataManager builds TxnOffsetCommit batches
        (coordinator appends are not sequence-checked). On a single broker the append is
        acks=1 — the broker is the whole ISR, and a topic's ``min.insync.replicas`` only
        applies to acks=-1 —; in a cluster it waits (``timeout_ms``, default the log's commit
        timeout) until the ISR has it."""
        if not records:
            return
        items = [rec.SimpleRecord(value, key) for key, value in records]
        if transactional:
            if producer_id < 0 or producer_epoch < 0:
                raise ValueError("a transactional append needs a producer id and epoch")
            batch = rec.build_batch(items, producer_id=producer_id,
                                    producer_epoch=producer_epoch, base_sequence=0,
                                    transactional=True)
        else:
            batch = rec.build_batch(items)
        tp = TopicPartition(self.topic, partition)
        wait = self.await_replication
        result = self.replica_manager.append(tp, batch, produce_version=None,
                                             origin=AppendOrigin.COORDINATOR,
                                             required_acks=-1 if wait is not None else 1)
        if result.error == ErrorCode.NONE and wait is not None:
            timeout_s = self.commit_timeout_s if timeout_ms is None else timeout_ms / 1000
            error = await wait(tp, result.last_offset + 1, timeout_s)
            result = result._replace(error=error, message=None)
        if result.error != ErrorCode.NONE:
            raise KafkaError(result.message or f"append to {self.topic}-{partition} failed: "
                             f"{ErrorCode(result.error).name}", code=ErrorCode(result.error))

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Committed keyed records (read_committed) up to the log end, oldest first: as
        Kafka's coordinators load, a new leader's records above its lagging high watermark
        were acknowledged and are its own (it never truncates them while it leads)."""
        ulog = self.replica_manager.get_log(TopicPartition(self.topic, partition))
        if ulog is None:
            return
        for record in read_committed(ulog, chunk_bytes=self.chunk_bytes, to_log_end=True):
            if record.key is not None:
                yield record.key, record.value

    def replay_batches(self, partition: int) -> Iterator[ReplayRecord | ReplayMarker]:
        """Every keyed data record and every transaction marker from the log start offset to
        the log end as it is when the walk starts (see ``replay``), in log order (records of
        aborted and open transactions included: the caller resolves them, as Kafka's loaders
        do).

        A control batch the cleaner emptied carries no marker and is skipped, as in Kafka."""
        ulog = self.replica_manager.get_log(TopicPartition(self.topic, partition))
        if ulog is None:
            return
        start = max(ulog.log_start_offset, ulog.local_log_start_offset)
        end = ulog.log_end_offset
        offset = start
        while offset < end:
            data = ulog.read(offset, self.chunk_bytes, FetchIsolation.LOG_END, True).records
            if not data:
                break
            next_offset = offset
            for header in rec.iter_headers(data):
                if header.base_offset >= end:
                    next_offset = end
                    break
                next_offset = max(next_offset, header.next_offset)
                if header.is_control:
                    if header.record_count > 0:
                        yield ReplayMarker(header.producer_id,
                                           rec.control_type(data, header) == rec.CONTROL_COMMIT,
                                           header.base_offset)
                    continue
                transactional = header.is_transactional
                producer_id = header.producer_id
                for record in rec.decode_batch(data, header):
                    if record.offset >= start and record.key is not None:
                        yield ReplayRecord(record.key, record.value, producer_id, transactional,
                                           record.offset)
            if next_offset <= offset:
                log.error("no progress reading %s at offset %d", ulog.topic_partition, offset)
                break
            offset = next_offset
