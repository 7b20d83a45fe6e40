"""ReplicaManager: the partitions this broker leads, and the produce/fetch/list-offsets paths.

Single node today: this broker leads every partition at leader epoch 0, the ISR is itself, so
an append is committed (high watermark = log end offset) as soon as it is in the log, for
acks=1 and acks=all alike. Replication will add followers behind the same methods.

Synchronous and thread-safe (each log has its own lock); the server awaits nothing here.
``on_append`` is called with the partition after every append, to wake delayed fetches.
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

from strata.common.errors import ErrorCode, KafkaError, OffsetOutOfRangeError
from strata.common.types import TopicPartition
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import LATEST_TIMESTAMP, FetchIsolation, UnifiedLog

log = logging.getLogger(__name__)

LEADER_EPOCH = 0


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
                 on_append: Callable[[TopicPartition], None] | None = None):
        self.log_manager = log_manager
        self._partitions = partitions
        self._on_append = on_append or (lambda tp: None)
        # strata.tiered.manager.RemoteLogManager when tiered storage is enabled on this broker
        self.remote_log_manager = None

    def get_log(self, tp: TopicPartition) -> UnifiedLog | None:
        """The partition's log, created on first use; None if the partition does not exist."""
        count = self._partitions(tp.topic)
        if count is None or not 0 <= tp.partition < count:
            return None
        return self.log_manager.get_log(tp) or self.log_manager.get_or_create_log(tp)

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
        ulog, error = self._hosted(tp)
        if ulog is None:
            return AppendResult(error)
        if not records:
            return AppendResult(ErrorCode.INVALID_RECORD, message="no records")
        try:
            info = ulog.append_as_leader(records, LEADER_EPOCH, origin=origin,
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
             as_region: bool = False) -> ReadResult:
        """The records at ``fetch_offset``; local ones as a ``FileRegion`` with ``as_region``."""
        ulog, error = self._hosted(tp)
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
                    from_consumer: bool = True) -> OffsetResult:
        ulog, error = self._hosted(tp)
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
        ulog, error = self._hosted(tp)
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
