"""UnifiedLog: one partition's log, with the offsets that span the local and remote tiers.

Offsets, always ``log_start_offset <= local_log_start_offset <= ... <= log_end_offset``:

- ``log_start_offset``: first offset readable anywhere (moved by retention and DeleteRecords);
- ``local_log_start_offset``: first offset on local disk (above the log start offset only when
  older segments live in the remote tier);
- ``high_watermark``: last committed offset + 1 (set by replication; a single replica moves it
  to the log end offset after each append);
- ``last_stable_offset``: below the first offset of any open transaction, and <= high watermark;
- ``log_end_offset``: next offset to assign.

The append path moves bytes: it validates batch headers and CRCs, rewrites base offsets in
place and writes the buffer with one ``pwrite``; it never decodes records.

Thread-safety: every mutation and read holds ``self.lock``; ``flush`` may run on a scheduler
thread and takes the lock only to pick its segments.
"""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import (
    CorruptRecordError, ErrorCode, InvalidTxnStateError, KafkaError, OffsetOutOfRangeError)
from strata.common.scheduler import ImmediateScheduler, Scheduler
from strata.common.types import TopicPartition
from strata.log.flush_stats import LOG_FLUSH_STATS
from strata.log.checkpoint import LEADER_EPOCH_CHECKPOINT_FILENAME, LeaderEpochCheckpointFile
from strata.log.indexes import AbortedTxn
from strata.log.leader_epoch import LeaderEpochFileCache
from strata.log.local_log import FetchDataInfo, LocalLog, LogOffsetMetadata
from strata.log.log_config import LogConfig
from strata.log.log_dir_failure import LogDirFailureChannel
from strata.log.log_loader import load_log, rebuild_producer_state
from strata.log.log_validator import assign_offsets, assign_offsets_gathered, validate_batches
from strata.log.producer_state import AppendOrigin, ProducerStateEntry, ProducerStateManager
from strata.log.segment import LogSegment, TimestampAndOffset
from strata.protocol import records as rec

log = logging.getLogger(__name__)

# ListOffsets special timestamps
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6


class FetchIsolation(Enum):
    LOG_END = 0          # followers
    HIGH_WATERMARK = 1   # read_uncommitted consumers
    TXN_COMMITTED = 2    # read_committed consumers


class LogAppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    max_timestamp: int
    shallow_offset_of_max_timestamp: int
    log_append_time: int        # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    valid_bytes: int
    duplicate: bool = False


class UnifiedLog:
    def __init__(self, directory: Path, config: LogConfig, *, recovery_point: int = 0,
                 log_start_offset: int = 0, had_clean_shutdown: bool = True,
                 clock: Clock = SYSTEM_CLOCK, scheduler: Scheduler | None = None,
                 topic_partition: TopicPartition | None = None,
                 producer_id_expiration_ms: int = 86_400_000,
                 dir_failures: LogDirFailureChannel | None = None,
                 high_watermark: int | None = None):
        """``high_watermark``: the checkpointed one (a replica in a cluster); None: every
        record that survived loading counts as committed (one broker is its own ISR)."""
        self.directory = Path(directory)
        self.dir_failures = dir_failures or LogDirFailureChannel()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.topic_partition = topic_partition or TopicPartition.from_dir_name(self.directory.name)
        self._appending = f"appending records to {self.topic_partition}"   # for dir_failures
        self.config = config
        self.lock = threading.RLock()
        self._clock = clock
        # KIP-890 verification guards: producer id -> the guard of its verification in flight
        self._verification_guards: dict[int, object] = {}
        self._scheduler = scheduler or ImmediateScheduler()
        self.leader_epoch_cache = LeaderEpochFileCache(
            self.topic_partition,
            LeaderEpochCheckpointFile(self.directory / LEADER_EPOCH_CHECKPOINT_FILENAME))
        self.producer_state = ProducerStateManager(self.topic_partition, self.directory,
                                                   producer_id_expiration_ms, clock)
        loaded = load_log(self.directory, config, self.topic_partition,
                          recovery_point=recovery_point, log_start_offset=log_start_offset,
                          had_clean_shutdown=had_clean_shutdown, psm=self.producer_state,
                          epoch_cache=self.leader_epoch_cache, clock=clock,
                          remote_log_enabled=self.remote_log_enabled)
        self.local_log = LocalLog(self.directory, config, loaded.segments, loaded.recovery_point,
                                  loaded.next_offset, self.topic_partition, clock, self._scheduler)
        self._log_start_offset = loaded.log_start_offset
        self._high_watermark = LogOffsetMetadata(loaded.log_start_offset)
        self._first_unstable: LogOffsetMetadata | None = None
        # Set by the remote log manager once segments are tiered (-1: nothing in remote storage).
        self.highest_offset_in_remote_storage = -1
        self._unflushed_messages = 0
        self.update_high_watermark(loaded.next_offset if high_watermark is None
                                   else min(high_watermark, loaded.next_offset))
        self._update_first_unstable_offset()

    # ---- offsets ----------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def local_log_start_offset(self) -> int:
        return max(self._log_start_offset, self.local_log.first_segment.base_offset)

    @property
    def log_end_offset(self) -> int:
        return self.local_log.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark.offset

    @property
    def last_stable_offset(self) -> int:
        fu = self._first_unstable
        if fu is not None and fu.offset < self._high_watermark.offset:
            return fu.offset
        return self._high_watermark.offset

    @property
    def recovery_point(self) -> int:
        return self.local_log.recovery_point

    @property
    def remote_log_enabled(self) -> bool:
        return bool(self.config.get("remote.storage.enable")) and not self.config.is_compacted

    @property
    def remote_copy_enabled(self) -> bool:
        """Tiered and still copying (Kafka's ``remoteLogEnabledAndRemoteCopyEnabled``). Only
        then does local retention keep segments until they are copied and leave the log start
        offset where it is; with ``remote.log.copy.disable=true`` it works as on a plain topic."""
        return self.remote_log_enabled and not self.config.get("remote.log.copy.disable")

    @property
    def size(self) -> int:
        """Bytes of the local tier."""
        return self.local_log.size_in_bytes()

    def update_highest_offset_in_remote_storage(self, offset: int, force: bool = False) -> None:
        """The remote log manager's progress: the last offset copied to remote storage.

        Only moves forward unless ``force`` (remote data deleted after disabling tiering).
        Local retention deletes only segments at or below it."""
        with self.lock:
            if force or offset > self.highest_offset_in_remote_storage:
                self.highest_offset_in_remote_storage = offset

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark, clamped to [log start offset, log end offset]."""
        with self.lock:
            offset = min(max(offset, self._log_start_offset), self.log_end_offset)
            self._high_watermark = LogOffsetMetadata(offset)
            self.producer_state.on_high_watermark_updated(offset)
            self._update_first_unstable_offset()
            return offset

    def _high_watermark_metadata(self) -> LogOffsetMetadata:
        hw = self._high_watermark
        if not hw.known:
            if hw.offset < self.local_log_start_offset:
                return hw
            hw = self.local_log.offset_metadata(hw.offset)
            self._high_watermark = hw
        return hw

    def _update_first_unstable_offset(self) -> None:
        first = self.producer_state.first_unstable_offset()
        self._first_unstable = LogOffsetMetadata(first) if first is not None else None

    # ---- append -----------------------------------------------------------------------------

    def start_transaction_verification(self, producer_id: int, producer_epoch: int
                                       ) -> object | None:
        """A guard for verifying that ``producer_id``'s transaction includes this partition
        (KIP-890), or None when its transaction is already ongoing here (nothing to verify).
        A marker for the producer, or its next transactional append, ends the guard, so an
        append carrying a guard that ended is refused (Kafka's VerificationGuard)."""
        with self.lock:
            entry = self.producer_state.last_entry(producer_id)
            if entry is not None and entry.has_ongoing_txn and entry.producer_epoch == producer_epoch:
                return None
            guard = self._verification_guards[producer_id] = object()
            return guard

    def end_transaction_verification(self, producer_id: int, guard: object) -> None:
        """Forget ``guard`` (its verification was refused: nothing will be appended)."""
        with self.lock:
            if self._verification_guards.get(producer_id) is guard:
                del self._verification_guards[producer_id]

    def _check_verification(self, headers, guard: object) -> None:
        for h in headers:
            if not h.is_transactional or h.is_control:
                continue
            entry = self.producer_state.last_entry(h.producer_id)
            if entry is not None and entry.has_ongoing_txn:
                continue
            if self._verification_guards.get(h.producer_id) is not guard:
                raise InvalidTxnStateError(
                    f"{self.topic_partition}: the transaction of producer {h.producer_id} ended "
                    f"while its first append here was being verified")

    def append_as_leader(self, data: bytes | bytearray, leader_epoch: int, *,
                         origin: AppendOrigin = AppendOrigin.CLIENT,
                         produce_version: int | None = None,
                         verification_guard: object | None = None) -> LogAppendInfo:
        """Validate, dedupe, assign offsets to and append a producer's batches."""
        cfg = self.config
        now = self._clock.milliseconds()
        log_append_time = cfg.log_append_time
        headers = validate_batches(
            data, max_message_bytes=cfg.get("max.message.bytes"), produce_version=produce_version,
            from_client=origin is AppendOrigin.CLIENT, now_ms=now,
            timestamp_before_max_ms=cfg.get("message.timestamp.before.max.ms"),
            timestamp_after_max_ms=cfg.get("message.timestamp.after.max.ms"),
            log_append_time=log_append_time,
            compacted_topic_partition=self.topic_partition if cfg.is_compacted else None)
        with self.lock:
            latest = self.leader_epoch_cache.latest_epoch()
            if latest is not None and leader_epoch < latest:
                # the partition moved to a newer epoch after the caller read its own (a new
                # leadership starts under this lock): an append at the old one would sit past
                # the new epoch's start and corrupt the epoch history
                raise KafkaError(f"{self.topic_partition}: leader epoch {leader_epoch} is older "
                                 f"than the log's {latest}", code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
            if origin is AppendOrigin.CLIENT:
                for h in headers:
                    if h.has_producer_id:
                        dup = self.producer_state.find_duplicate(h)
                        if dup is not None:
                            return LogAppendInfo(dup.first_offset, dup.last_offset, dup.timestamp,
                                                 dup.last_offset, -1, self._log_start_offset, 0,
                                                 duplicate=True)
                if verification_guard is not None:
                    self._check_verification(headers, verification_guard)
            if log_append_time:   # stamps timestamps under the CRC: rewrites a copy
                data = data if isinstance(data, bytearray) else bytearray(data)
                assigned = assign_offsets(data, headers, self.log_end_offset, leader_epoch, now)
            else:   # new offsets and epoch only: written around the producer's bytes, no copy
                assigned = assign_offsets_gathered(data, headers, self.log_end_offset,
                                                   leader_epoch)
            return self._append(data, assigned.headers, assigned.first_offset, assigned.last_offset,
                                assigned.max_timestamp, assigned.shallow_offset_of_max_timestamp,
                                origin, now if log_append_time else -1, assigned.parts)

    def append_as_follower(self, data: bytes | bytearray) -> LogAppendInfo | None:
        """Append batches that already carry offsets (replication, internal restores)."""
        headers = list(rec.iter_headers(data))
        if not headers:
            return None
        for h in headers:
            if not rec.batch_crc_ok(data, h):
                raise CorruptRecordError(f"CRC mismatch in batch at offset {h.base_offset}")
        with self.lock:
            if headers[0].base_offset < self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"follower append at {headers[0].base_offset} below log end {self.log_end_offset}")
            max_ts, shallow = -1, -1
            for h in headers:
                if h.max_timestamp > max_ts:
                    max_ts, shallow = h.max_timestamp, h.last_offset
            used = headers[-1].position + headers[-1].size
            whole = type(data) is bytes and used == len(data)   # else copied: ours to keep
            buf = data if whole else bytes(memoryview(data)[:used])
            return self._append(buf, headers, headers[0].base_offset, headers[-1].last_offset,
                                max_ts, shallow, AppendOrigin.REPLICATION, -1)

    def _append(self, buf, headers, first_offset, last_offset, max_timestamp, shallow_offset,
                origin, log_append_time, parts=None) -> LogAppendInfo:
        """Write assigned batches (the lock held): ``buf``, or ``parts`` when given (the same
        batches with their new offsets, as ``assign_offsets_gathered`` gives them; ``buf`` is
        then still read for control batches and sizes). A failing disk raises
        KafkaStorageError (``dir_failures``) with the log end offset and producer state
        unchanged."""
        with self.dir_failures.guard(self.directory.parent, self._appending):
            return self._write(buf, headers, first_offset, last_offset, max_timestamp,
                               shallow_offset, origin, log_append_time, parts)

    def _write(self, buf, headers, first_offset, last_offset, max_timestamp, shallow_offset,
               origin, log_append_time, parts=None) -> LogAppendInfo:
        psm = self.producer_state
        infos = {}
        completed = []
        for h in headers:
            if h.has_producer_id:
                info = infos.get(h.producer_id)
                if info is None:
                    info = infos[h.producer_id] = psm.prepare_update(h.producer_id, origin)
                c = info.append_batch(h, buf, origin)
                if c is not None:
                    completed.append(c)
        segment = self._maybe_roll(len(buf), max_timestamp, last_offset, first_offset)
        epochs = self.leader_epoch_cache
        for h in headers:
            epoch = h.partition_leader_epoch
            if epoch >= 0 and epochs.latest_epoch() != epoch:
                epochs.assign(epoch, h.base_offset)
        segment.append(last_offset, max_timestamp, shallow_offset,
                       buf if parts is None else parts, headers)
        self.local_log.update_log_end_offset(last_offset + 1)
        for info in infos.values():
            psm.update(info)
        if self._verification_guards:
            for h in headers:   # the transaction began here, or ended: verification is over
                if h.is_transactional:
                    self._verification_guards.pop(h.producer_id, None)
        for c in completed:
            lso = psm.last_stable_offset(c)
            if c.is_aborted:
                segment.update_txn_index(AbortedTxn(c.producer_id, c.first_offset, c.last_offset, lso))
            psm.complete_txn(c)
        psm.update_map_end_offset(last_offset + 1)
        self._update_first_unstable_offset()
        self._unflushed_messages += last_offset - first_offset + 1
        if self._unflushed_messages >= self.config.get("flush.messages"):
            self._flush_locked(self.log_end_offset)
        return LogAppendInfo(first_offset, last_offset, max_timestamp, shallow_offset,
                             log_append_time, self._log_start_offset, len(buf))

    def _maybe_roll(self, messages_size: int, max_timestamp: int, max_offset: int,
                    first_offset: int) -> LogSegment:
        seg = self.local_log.active_segment
        cfg = self.config
        if seg.should_roll(segment_bytes=cfg.effective_segment_bytes,
                           segment_ms=cfg.max_segment_ms, messages_size=messages_size,
                           max_timestamp_in_messages=max_timestamp,
                           max_offset_in_messages=max_offset, now_ms=self._clock.milliseconds()):
            return self.roll(first_offset)
        return seg

    def roll(self, expected_next_offset: int | None = None) -> LogSegment:
        """Start a new active segment; snapshot producer state and flush the old one in the background."""
        with self.lock:
            old = self.local_log.active_segment
            seg = self.local_log.roll(expected_next_offset)
            if seg is old:
                return seg
            self.producer_state.update_map_end_offset(seg.base_offset)
            self.producer_state.take_snapshot()
            new_base = seg.base_offset
        self._scheduler.schedule_once(f"flush-{self.topic_partition}", lambda: self.flush(new_base))
        return seg

    # ---- reads ------------------------------------------------------------------------------

    def read(self, start_offset: int, max_length: int,
             isolation: FetchIsolation = FetchIsolation.HIGH_WATERMARK,
             min_one_message: bool = True, as_region: bool = False) -> FetchDataInfo:
        """Whole batches from ``start_offset`` up to the isolation's bound (``as_region``: as a
        ``FileRegion`` of the segment file, which stays readable after this lock is released).

        Offsets outside [local log start offset, log end offset] raise OffsetOutOfRangeError;
        the caller routes offsets still in the remote tier elsewhere before calling.
        """
        with self.lock:
            end = self.local_log.log_end_offset_metadata
            if isolation is FetchIsolation.LOG_END:
                upper = end
            elif isolation is FetchIsolation.HIGH_WATERMARK:
                upper = self._high_watermark_metadata()
            else:
                lso = self.last_stable_offset
                upper = self._high_watermark_metadata() if lso == self.high_watermark \
                    else self.local_log.offset_metadata(lso)
            if start_offset > end.offset or start_offset < self.local_log_start_offset:
                raise OffsetOutOfRangeError(
                    f"offset {start_offset} out of range [{self.local_log_start_offset}, "
                    f"{end.offset}] for {self.topic_partition}")
            if start_offset >= upper.offset:
                return FetchDataInfo(LogOffsetMetadata(start_offset), b"", False,
                                     [] if isolation is FetchIsolation.TXN_COMMITTED else None)
            return self.local_log.read(start_offset, max_length, min_one_message, upper,
                                       isolation is FetchIsolation.TXN_COMMITTED, as_region)

    def fetch_offset_by_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets: the special timestamps, or the first record at or after ``timestamp``."""
        with self.lock:
            epochs = self.leader_epoch_cache
            if timestamp == EARLIEST_TIMESTAMP:
                return TimestampAndOffset(-1, self._log_start_offset,
                                          epochs.epoch_for_offset(self._log_start_offset))
            if timestamp == EARLIEST_LOCAL_TIMESTAMP:
                off = self.local_log_start_offset
                return TimestampAndOffset(-1, off, epochs.epoch_for_offset(off))
            if timestamp == LATEST_TIMESTAMP:
                return TimestampAndOffset(-1, self.log_end_offset, epochs.latest_epoch())
            if timestamp == LATEST_TIERED_TIMESTAMP:
                off = self.highest_offset_in_remote_storage
                return TimestampAndOffset(-1, off, epochs.epoch_for_offset(off) if off >= 0 else None)
            if timestamp == EARLIEST_PENDING_UPLOAD_TIMESTAMP:
                # KIP-1023: the first offset not yet in the remote tier (-1: not tiered, or
                # nothing copied while the remote tier already starts the log)
                if not self.remote_log_enabled:
                    return TimestampAndOffset(-1, -1, None)
                off = self.highest_offset_in_remote_storage + 1
                if off == 0 and self.local_log_start_offset != self._log_start_offset:
                    return TimestampAndOffset(-1, -1, None)
                off = max(off, self._log_start_offset)
                return TimestampAndOffset(-1, off, epochs.epoch_for_offset(off))
            if timestamp == MAX_TIMESTAMP:
                best_seg = None
                for seg in self.local_log.segments:
                    if best_seg is None or seg.max_timestamp_so_far > best_seg.max_timestamp_so_far:
                        best_seg = seg
                if best_seg is None or best_seg.max_timestamp_so_far < 0:
                    return None
                return best_seg.max_timestamp_record()
            for seg in self.local_log.segments:
                if seg.largest_timestamp >= timestamp:
                    found = seg.find_offset_by_timestamp(timestamp, self._log_start_offset)
                    if found is not None:
                        return found
            return None

    # ---- truncation -------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Remove offsets >= ``offset`` (a follower diverging from its leader); False when
        there was no record to remove."""
        with self.lock:
            if offset >= self.log_end_offset:
                # an epoch entry at our log end (an epoch this broker led without appending
                # anything) contradicts the leader all the same: drop it, as Kafka does
                # (KAFKA-10706), or every fetch names that epoch again
                self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
                return False
            if offset < self.local_log_start_offset:
                self.truncate_fully_and_start_at(offset)
                return True
            self.local_log.truncate_to(offset)
            self.leader_epoch_cache.truncate_from_end(offset)
            self._rebuild_producer_state()
            if self._high_watermark.offset > offset:
                self._high_watermark = LogOffsetMetadata(offset)
            self._update_first_unstable_offset()
            return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        with self.lock:
            self.local_log.truncate_fully_and_start_at(offset)
            self.leader_epoch_cache.clear_and_flush()
            self.producer_state.truncate_fully_and_start_at(offset)
            self._log_start_offset = offset
            self._high_watermark = LogOffsetMetadata(offset)
            self._update_first_unstable_offset()

    def truncate_fully_and_start_after_remote(self, next_offset: int, log_start_offset: int,
                                              epochs: list, producer_snapshot: bytes | None) -> None:
        """KIP-405's follower: the leader's local log starts at ``next_offset`` and everything
        below it is in the remote tier. Drop the whole local log, start it empty at
        ``next_offset`` with the log start offset at the leader's (the remote tier serves
        [log start, next)), and take the leader epochs and producer state up to ``next_offset``
        from the remote segment that ends just before it."""
        with self.lock:
            self.truncate_fully_and_start_at(next_offset)
            self._log_start_offset = min(log_start_offset, next_offset)
            self.leader_epoch_cache.assign_entries(
                [e for e in epochs if e.start_offset < next_offset])
            if producer_snapshot:
                self.producer_state.load_snapshot_at(next_offset, producer_snapshot,
                                                     self._clock.milliseconds())
            self._update_first_unstable_offset()

    def _rebuild_producer_state(self) -> None:
        rebuild_producer_state(self.producer_state, self.local_log.segments,
                               self._log_start_offset, self.log_end_offset,
                               self._clock.milliseconds())

    # ---- log start offset and retention -----------------------------------------------------

    def maybe_increment_log_start_offset(self, new_offset: int, reason: str = "") -> bool:
        """DeleteRecords and retention: move the log start offset forward (never past the HW)."""
        with self.lock:
            if new_offset > self.high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot increment the log start offset of {self.topic_partition} to "
                    f"{new_offset}: beyond the high watermark {self.high_watermark}")
            if new_offset <= self._log_start_offset:
                return False
            log.info("incrementing log start offset of %s to %d (%s)",
                     self.topic_partition, new_offset, reason)
            self._log_start_offset = new_offset
            self.leader_epoch_cache.truncate_from_start(new_offset)
            self.producer_state.on_log_start_offset_incremented(new_offset)
            return True

    def delete_old_segments(self) -> int:
        """Apply retention to local segments, as Kafka does; returns how many were deleted.

        Every topic frees segments wholly below the log start offset; ``cleanup.policy=delete``
        topics also apply ``retention.bytes`` then ``retention.ms``. Only offsets below the high
        watermark go; an expired active segment is rolled first (an idle topic still expires).
        With tiering, ``local.retention.*`` applies and only segments already in remote storage
        go, and the log start offset stays (the remote tier still serves those offsets) -- unless
        copying is disabled (``remote.log.copy.disable``): then ``retention.*`` applies to the
        local segments, copied or not, and moves the log start offset, as in Kafka.
        """
        with self.lock:
            n = self._delete_log_start_offset_breached()
            if "delete" in self.config.get("cleanup.policy"):
                n += self._delete_retention_size_breached()
                n += self._delete_retention_ms_breached()
                self._maybe_roll_for_tiering()
            return n

    def _maybe_roll_for_tiering(self) -> None:
        """Roll an active segment that local retention has expired, so it can be tiered.

        Without this an idle tiered topic would keep its last segment local forever: only
        inactive segments are copied, and local retention deletes only what was copied."""
        if not self.remote_log_enabled:
            return
        seg = self.local_log.active_segment
        ms = self.config.local_retention_ms
        if seg.size == 0 or ms < 0 or self.high_watermark < self.log_end_offset:
            return
        if self._clock.milliseconds() - seg.largest_timestamp > ms:
            self.roll()

    def _deletable(self, predicate) -> list[LogSegment]:
        """Segments from the oldest while ``predicate(segment, upper_bound_offset)`` holds."""
        out = []
        hw = self.high_watermark
        segments = self.local_log.segments
        for i, seg in enumerate(segments):
            last = i + 1 == len(segments)
            upper = self.log_end_offset if last else segments[i + 1].base_offset
            if hw < upper or (last and seg.size == 0) or not predicate(seg, upper):
                break
            if self.remote_copy_enabled and upper - 1 > self.highest_offset_in_remote_storage \
                    and upper > self._log_start_offset:
                break  # not tiered yet
            out.append(seg)
        return out

    def _delete_segments(self, segments: list[LogSegment], reason: str) -> int:
        if not segments:
            return 0
        if segments[-1] is self.local_log.active_segment:
            self.roll()
        self.local_log.delete_segments(segments, reason)
        first = self.local_log.first_segment.base_offset
        if not self.remote_copy_enabled and first > self._log_start_offset:
            self._log_start_offset = first
            self.leader_epoch_cache.truncate_from_start(first)
            self.producer_state.on_log_start_offset_incremented(first)
        self.producer_state.delete_snapshots_before(min(first, self._log_start_offset))
        return len(segments)

    def _delete_log_start_offset_breached(self) -> int:
        lso = self._log_start_offset
        return self._delete_segments(self._deletable(lambda s, upper: upper <= lso),
                                     f"log start offset {lso} breach")

    def _delete_retention_ms_breached(self) -> int:
        ms = self.config.local_retention_ms if self.remote_copy_enabled \
            else self.config.get("retention.ms")
        if ms < 0:
            return 0
        now = self._clock.milliseconds()
        return self._delete_segments(
            self._deletable(lambda s, upper: now - s.largest_timestamp > ms),
            f"retention time {ms}ms breach")

    def _delete_retention_size_breached(self) -> int:
        limit = self.config.local_retention_bytes if self.remote_copy_enabled \
            else self.config.get("retention.bytes")
        if limit < 0:
            return 0
        excess = self.size - limit
        if excess <= 0:
            return 0

        def predicate(seg, upper):
            nonlocal excess
            if excess - seg.size >= 0:
                excess -= seg.size
                return True
            return False
        return self._delete_segments(self._deletable(predicate),
                                     f"retention size {limit} bytes breach")

    # ---- durability and lifecycle -----------------------------------------------------------

    def flush(self, up_to_offset_exclusive: int | None = None) -> None:
        """Make offsets below ``up_to_offset_exclusive`` (default: the log end) durable.

        The fsyncs run outside the log lock, so appends continue while a rolled segment is
        written back (this runs on the scheduler after every roll).
        """
        started = time.monotonic_ns()
        with self.lock:
            target = self.log_end_offset if up_to_offset_exclusive is None else up_to_offset_exclusive
            segments = self.local_log.segments_to_flush(target)
        self.local_log.fsync_segments(segments)
        LOG_FLUSH_STATS.add(started)
        with self.lock:
            self.local_log.mark_flushed(target)
            if target >= self.log_end_offset:
                self._unflushed_messages = 0

    def _flush_locked(self, target: int) -> None:
        started = time.monotonic_ns()
        self.local_log.flush(target)
        LOG_FLUSH_STATS.add(started)
        if target >= self.log_end_offset:
            self._unflushed_messages = 0

    def flush_if_due(self) -> None:
        """``flush.ms``: called periodically by the log manager."""
        with self.lock:
            if self._clock.milliseconds() - self.local_log.last_flush_ms >= self.config.get("flush.ms") \
                    and self.recovery_point < self.log_end_offset:
                self._flush_locked(self.log_end_offset)

    def update_config(self, config: LogConfig) -> None:
        with self.lock:
            self.config = config
            self.local_log.config = config

    def close(self) -> None:
        """Clean close: flush, snapshot producer state, trim indexes."""
        with self.lock:
            self._flush_locked(self.log_end_offset)
            self.producer_state.take_snapshot()
            self.local_log.close()

    def remove_expired_producers(self) -> None:
        with self.lock:
            self.producer_state.remove_expired_producers(self._clock.milliseconds())

    def active_producers(self) -> list[ProducerStateEntry]:
        """A copy of every producer's state, taken under the lock (Kafka's ``activeProducers``,
        what DescribeProducers reports)."""
        with self.lock:
            return [ProducerStateEntry(e.producer_id, e.producer_epoch, e.coordinator_epoch,
                                       e.last_timestamp, e.current_txn_first_offset,
                                       e.batch_metadata)
                    for e in self.producer_state.active_producers.values()]

    def __repr__(self) -> str:
        return (f"UnifiedLog({self.topic_partition}, start={self._log_start_offset}, "
                f"end={self.log_end_offset}, hw={self.high_watermark})")

