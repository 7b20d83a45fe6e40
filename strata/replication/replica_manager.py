"""ReplicaManager: the partitions this broker leads, and the produce/fetch/list-offsets paths.

One broker alone leads every partition at leader epoch 0. In a cluster the controller's
partition states arrive through ``apply_states``: this broker serves as leader only the
partitions it leads, at their leader epoch, and answers the others with Kafka's errors
(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH). Until replication lands
the ISR's followers copy nothing, so an append is committed (high watermark = log end offset)
as soon as it is in the leader's log.

Synchronous and thread-safe (each log has its own lock); the server awaits nothing here.
``on_append`` is called with the partition after every append, to wake delayed fetches.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Mapping, NamedTuple

from strata.common.errors import ErrorCode, KafkaError, OffsetOutOfRangeError
from strata.common.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, TopicPartition
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import LATEST_TIMESTAMP, FetchIsolation, UnifiedLog

log = logging.getLogger(__name__)

LEADER_EPOCH = 0  # the one-broker setup's leader epoch, forever


class PartitionState(NamedTuple):
    """One partition as the controller last set it (Kafka's LeaderAndIsr partition state)."""

    leader: int                 # -1: no leader
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int = 0


class StateChange(NamedTuple):
    """What ``apply_states`` did: partitions this broker started or stopped leading."""

    became_leader: tuple[TopicPartition, ...] = ()
    stopped_leading: tuple[TopicPartition, ...] = ()


class AppendResult(NamedTuple):
    error: ErrorCode
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()   # (index in batch, message)


class ReadResult(NamedTuple):
    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    aborted_transactions: list | None = None
    remote: UnifiedLog | None = None   # the offset lives in the remote tier: read it there


class OffsetResult(NamedTuple):
    error: ErrorCode
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


def _code(exc: Exception) -> ErrorCode:
    if isinstance(exc, KafkaError):
        return ErrorCode(exc.code)
    log.exception("unexpected error on the data path")
    return ErrorCode.UNKNOWN_SERVER_ERROR


class ReplicaManager:
    def __init__(self, log_manager: LogManager, partitions: Callable[[str], int | None],
                 on_append: Callable[[TopicPartition], None] | None = None, *,
                 broker_id: int = -1, clustered: bool = False):
        self.log_manager = log_manager
        self._partitions = partitions
        self._on_append = on_append or (lambda tp: None)
        # strata.tiered.manager.RemoteLogManager when tiered storage is enabled on this broker
        self.remote_log_manager = None
        self.broker_id = broker_id
        # In a cluster, the state of each partition hosted here; None: one broker leads all.
        self._states: dict[TopicPartition, PartitionState] | None = {} if clustered else None
        self._states_lock = threading.Lock()

    # ---- leadership -------------------------------------------------------------------------

    @property
    def clustered(self) -> bool:
        return self._states is not None

    def state(self, tp: TopicPartition) -> PartitionState | None:
        """The partition's state here; the one-broker setup leads every partition."""
        if self._states is None:
            return PartitionState(self.broker_id, LEADER_EPOCH, (self.broker_id,), (self.broker_id,))
        return self._states.get(tp)

    def is_leader(self, tp: TopicPartition) -> bool:
        st = self.state(tp)
        return st is not None and st.leader == self.broker_id

    def led_partitions(self, topic: str | None = None) -> list[TopicPartition]:
        if self._states is None:
            return []
        return [tp for tp, st in self._states.items()
                if st.leader == self.broker_id and (topic is None or tp.topic == topic)]

    def apply_states(self, states: Mapping[TopicPartition, PartitionState | None]) -> StateChange:
        """Kafka's becomeLeaderOrFollower/stopReplicas for the partitions given (None: this
        broker no longer hosts it). A state older than the one held (lower leader epoch, or the
        same leader epoch at a lower partition epoch) is ignored, so no stale controller or
        late read moves a partition back. A new leader stamps its epoch into the leader epoch
        cache at its log end offset (Kafka's makeLeader)."""
        if self._states is None:
            raise RuntimeError("apply_states needs a clustered ReplicaManager")
        with self._states_lock:
            return self._apply_states(states)

    def _apply_states(self, states: Mapping[TopicPartition, PartitionState | None]) -> StateChange:
        gained, lost = [], []
        for tp, st in states.items():
            old = self._states.get(tp)
            if st is None:
                if old is not None:
                    del self._states[tp]
                    if old.leader == self.broker_id:
                        lost.append(tp)
                continue
            if old is not None and (st.leader_epoch, st.partition_epoch) < (old.leader_epoch, old.partition_epoch):
                log.info("ignoring stale state of %s: epoch %d/%d, holding %d/%d", tp,
                         st.leader_epoch, st.partition_epoch, old.leader_epoch, old.partition_epoch)
                continue
            was_leader = old is not None and old.leader == self.broker_id
            now_leader = st.leader == self.broker_id
            if now_leader or self.broker_id in st.replicas:
                try:
                    ulog = self.get_log(tp, create=True)
                except KafkaError as exc:
                    log.error("cannot host %s: %s", tp, exc)
                    ulog = None
                if now_leader and ulog is not None and (not was_leader or old.leader_epoch != st.leader_epoch):
                    ulog.leader_epoch_cache.assign(st.leader_epoch, ulog.log_end_offset)
                    ulog.update_high_watermark(ulog.log_end_offset)
            self._states[tp] = st
            if now_leader and not was_leader:
                gained.append(tp)
            elif was_leader and not now_leader:
                lost.append(tp)
        return StateChange(tuple(gained), tuple(lost))

    def leader_log(self, tp: TopicPartition, current_leader_epoch: int = UNDEFINED_EPOCH,
                   require_leader: bool = True) -> tuple[UnifiedLog | None, ErrorCode, int]:
        """(log, NONE, leader epoch) when this broker may serve ``tp``, else (None, error, -1).

        Kafka's order: an unknown partition is UNKNOWN_TOPIC_OR_PARTITION (NOT_LEADER_OR_FOLLOWER
        when the topic exists but the replica is not here); a client's ``current_leader_epoch``
        below ours is FENCED_LEADER_EPOCH, above it UNKNOWN_LEADER_EPOCH; then a broker that
        does not lead it (with ``require_leader``) is NOT_LEADER_OR_FOLLOWER."""
        st = self.state(tp)
        if st is None:
            count = self._partitions(tp.topic)
            known = count is not None and 0 <= tp.partition < count
            return None, (ErrorCode.NOT_LEADER_OR_FOLLOWER if known
                          else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), -1
        if current_leader_epoch != UNDEFINED_EPOCH and current_leader_epoch != st.leader_epoch:
            return None, (ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < st.leader_epoch
                          else ErrorCode.UNKNOWN_LEADER_EPOCH), -1
        if require_leader and st.leader != self.broker_id:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        ulog, error = self._hosted(tp)
        return ulog, error, st.leader_epoch if ulog is not None else -1

    def get_log(self, tp: TopicPartition, create: bool | None = None) -> UnifiedLog | None:
        """The partition's log; None if the partition does not exist. One broker creates it
        on first use; in a cluster only ``apply_states`` does (``create``)."""
        count = self._partitions(tp.topic)
        if count is None or not 0 <= tp.partition < count:
            return None
        found = self.log_manager.get_log(tp)
        if found is not None or not (self._states is None if create is None else create):
            return found
        return self.log_manager.get_or_create_log(tp)

    def _hosted(self, tp: TopicPartition) -> tuple[UnifiedLog | None, ErrorCode]:
        """The partition's log, or None and why: UNKNOWN_TOPIC_OR_PARTITION, or the
        KAFKA_STORAGE_ERROR of a log that cannot be created on a failing disk."""
        try:
            ulog = self.get_log(tp)
        except KafkaError as exc:
            return None, ErrorCode(exc.code)
        return ulog, ErrorCode.NONE if ulog is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # ---- produce ----------------------------------------------------------------------------

    def append(self, tp: TopicPartition, records: bytes | None, *, produce_version: int | None,
               origin: AppendOrigin = AppendOrigin.CLIENT) -> AppendResult:
        ulog, error, epoch = self.leader_log(tp)
        if ulog is None:
            return AppendResult(error)
        if not records:
            return AppendResult(ErrorCode.INVALID_RECORD, message="no records")
        try:
            info = ulog.append_as_leader(records, epoch, origin=origin,
                                         produce_version=produce_version)
            if not info.duplicate:
                ulog.update_high_watermark(ulog.log_end_offset)  # the ISR is this broker
        except Exception as exc:  # noqa: BLE001 - every failure is a Kafka error code for the client
            return AppendResult(_code(exc), log_start_offset=ulog.log_start_offset,
                                message=str(exc),
                                record_errors=tuple(getattr(exc, "record_errors", ())))
        self._on_append(tp)
        return AppendResult(ErrorCode.NONE, info.first_offset, info.log_append_time,
                            info.log_start_offset)

    # ---- fetch ------------------------------------------------------------------------------

    def read(self, tp: TopicPartition, fetch_offset: int, max_bytes: int,
             isolation: FetchIsolation, min_one_message: bool, *,
             as_region: bool = False, current_leader_epoch: int = UNDEFINED_EPOCH) -> ReadResult:
        """The records at ``fetch_offset``; local ones as a ``FileRegion`` with ``as_region``."""
        ulog, error, _ = self.leader_log(tp, current_leader_epoch)
        if ulog is None:
            return ReadResult(error)
        remote = self._remote_read(ulog, fetch_offset, isolation)
        if remote is not None:
            return remote
        try:
            info = ulog.read(fetch_offset, max_bytes, isolation, min_one_message, as_region)
        except Exception as exc:  # noqa: BLE001
            # Local retention may have deleted the segment since the check above: the offset
            # is then in the remote tier (Kafka's out-of-range handling looks again too).
            remote = self._remote_read(ulog, fetch_offset, isolation) \
                if isinstance(exc, OffsetOutOfRangeError) else None
            return remote or ReadResult(_code(exc), ulog.high_watermark, ulog.last_stable_offset,
                                        ulog.log_start_offset)
        return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                          ulog.log_start_offset, info.records, info.aborted_transactions)

    def _remote_read(self, ulog: UnifiedLog, fetch_offset: int,
                     isolation: FetchIsolation) -> ReadResult | None:
        """The answer when ``fetch_offset`` lies in the remote tier only, else None."""
        if not (ulog.log_start_offset <= fetch_offset < ulog.local_log_start_offset) \
                or self.remote_log_manager is None:
            return None
        if isolation is FetchIsolation.LOG_END:  # a follower rebuilds from remote storage
            return ReadResult(ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, ulog.high_watermark,
                              ulog.last_stable_offset, ulog.log_start_offset)
        return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                          ulog.log_start_offset, remote=ulog)

    # ---- list offsets -----------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int, isolation: FetchIsolation,
                    from_consumer: bool = True,
                    current_leader_epoch: int = UNDEFINED_EPOCH) -> OffsetResult:
        ulog, error, _ = self.leader_log(tp, current_leader_epoch)
        if ulog is None:
            return OffsetResult(error)
        try:
            if from_consumer:
                last_fetchable = ulog.last_stable_offset if isolation is FetchIsolation.TXN_COMMITTED \
                    else ulog.high_watermark
            else:
                last_fetchable = ulog.log_end_offset
            if timestamp == LATEST_TIMESTAMP:
                epoch = ulog.leader_epoch_cache.latest_epoch()
                return OffsetResult(ErrorCode.NONE, -1, last_fetchable, epoch if epoch is not None else -1)
            found = None
            rlm = self.remote_log_manager
            if timestamp >= 0 and rlm is not None and ulog.log_start_offset < ulog.local_log_start_offset:
                found = rlm.find_offset_by_timestamp(ulog, timestamp)
            if found is None:
                found = ulog.fetch_offset_by_timestamp(timestamp)
        except Exception as exc:  # noqa: BLE001
            return OffsetResult(_code(exc))
        if found is None or (timestamp >= 0 and found.offset >= last_fetchable):
            return OffsetResult(ErrorCode.NONE, -1, -1, -1)
        epoch = found.leader_epoch if found.leader_epoch is not None else -1
        return OffsetResult(ErrorCode.NONE, found.timestamp, found.offset, epoch)

    # ---- delete records ---------------------------------------------------------------------

    def delete_records(self, tp: TopicPartition, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords: move the log start offset (-1 means the high watermark); the low
        watermark is the log start offset this leaves, as in Kafka. The segments below it go
        in the retention task (``log.retention.check.interval.ms``), never in the request,
        so time or size retention cannot move the answer past the requested offset."""
        ulog, error, _ = self.leader_log(tp)
        if ulog is None:
            return error, -1
        try:
            if "delete" not in ulog.config.get("cleanup.policy"):
                return ErrorCode.POLICY_VIOLATION, -1  # Kafka: only with cleanup.policy delete
            target = ulog.high_watermark if offset == -1 else offset
            if target < 0:
                return ErrorCode.OFFSET_OUT_OF_RANGE, -1
            ulog.maybe_increment_log_start_offset(target, "DeleteRecords")
        except Exception as exc:  # noqa: BLE001
            return _code(exc), -1
        return ErrorCode.NONE, ulog.log_start_offset

    # ---- offset for leader epoch ------------------------------------------------------------

    def end_offset_for_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                             epoch: int) -> tuple[ErrorCode, int, int]:
        """OffsetForLeaderEpoch: (error, the largest epoch <= ``epoch``, its end offset)."""
        ulog, error, _ = self.leader_log(tp, current_leader_epoch)
        if ulog is None:
            return error, UNDEFINED_EPOCH, UNDEFINED_OFFSET
        found = ulog.leader_epoch_cache.end_offset_for(epoch, ulog.log_end_offset)
        return ErrorCode.NONE, found.leader_epoch, found.offset
