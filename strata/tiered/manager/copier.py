"""The copier task: a leader's inactive local segments to remote storage, oldest first.

A segment is a candidate when it is not the active segment, the next segment's base offset
is at or below the last stable offset (so no open transaction or uncommitted data is copied),
and its copy lag (KIP-1241's ``remote.copy.lag.ms`` / ``.bytes``) is reached.
Candidates are taken in offset order from ``highest offset in remote storage + 1`` with no gaps.
Each segment first passes the copy quota (``quota.RemoteLogQuotas.acquire_copy``).
Per segment: COPY_SEGMENT_STARTED → copy the segment, its offset/time/transaction indexes, the
producer snapshot at the next segment's base offset and the leader-epoch checkpoint up to the
segment's end → COPY_SEGMENT_FINISHED → the log's highest offset in remote storage advances.

A copy that fails removes what it wrote (the storage manager's contract) and is marked deleted
in the metadata; a crash between STARTED and FINISHED leaves a COPY_SEGMENT_STARTED orphan the
expirer deletes. Either way the segment is copied again, under a new segment id.

Fenced by leadership: before each metadata record and the upload, the broker must still lead
the partition (``TieringContext.leading_epoch``), and each record carries that leader epoch,
so the metadata refuses a deposed leader's record once its successor has written one. A copy
that loses the leadership on the way stops (``LeadershipLost`` or the refused record's
``FencedLeaderEpochException``) and leaves a COPY_SEGMENT_STARTED orphan for the next leader's
expirer; it marks nothing deleted, since it may no longer write.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from strata.log.checkpoint import encode_epoch_entries
from strata.log.producer_state import encode_snapshot
from strata.tiered.api import (
    LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState)

from strata.tiered.manager.leadership import LeadershipLost
from strata.tiered.manager.lineage import within_lineage

if TYPE_CHECKING:
    from strata.log.segment import LogSegment
    from strata.tiered.manager.remote_log_manager import PartitionTiering, TieringContext

log = logging.getLogger(__name__)


def find_resume_offset(ctx: TieringContext, part: PartitionTiering) -> int:
    """The highest offset already in remote storage for the log's epoch lineage (-1: none).

    Walks the leader epochs from the latest back, as Kafka's copier does when it becomes leader
    (``RemoteLogManager.findHighestRemoteOffset``). An epoch's remote copies count only up to
    where the epoch ends in this log: a leader whose log left an epoch before the remote tier's
    copy of it ends (an unclean election, or records lost in a crash, that an old leader had
    tiered) resumes at its own end of that epoch, so the records it wrote after are copied and
    local retention does not delete them uncopied.

    Unlike Kafka, the copy holding that offset must still be there: after two unclean
    elections a leader of another lineage may have expired this lineage's copies (they were
    not in its lineage), and the metadata's highest offset of the epoch outlives them. Then
    the copier resumes after the copies of this log's lineage that remain, so the records only
    this log's local segments still hold are copied again rather than deleted uncopied.
    """
    cache = part.log.leader_epoch_cache
    log_end = part.log.log_end_offset
    for entry in reversed(cache.epoch_entries()):
        offset = ctx.rlmm.highest_offset_for_epoch(part.tip, entry.epoch)
        if offset is None:
            continue
        offset = min(offset, cache.end_offset_for(entry.epoch, log_end).offset - 1)
        if ctx.rlmm.remote_log_segment_metadata(part.tip, entry.epoch, offset) is not None:
            return offset
        return _copied_in_lineage(ctx, part, log_end)
    return -1


def _copied_in_lineage(ctx: TieringContext, part: PartitionTiering, log_end: int) -> int:
    """The end of the copied segments of the log's epoch lineage, from the first one on
    without a gap (-1: none). Segments gone by retention lie below the log start offset, where
    the copier never goes back."""
    entries = part.log.leader_epoch_cache.epoch_entries()
    epochs = {e.epoch: e.start_offset for e in entries}
    earliest = entries[0].epoch if entries else -1
    covered = -1
    copied = sorted((m for m in ctx.rlmm.list_remote_log_segments(part.tip)
                     if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                     and within_lineage(m, epochs, earliest, log_end)),
                    key=lambda m: m.start_offset)
    for m in copied:
        if covered >= 0 and m.start_offset > covered + 1:
            break
        covered = max(covered, m.end_offset)
    return covered


def candidate_segments(part: PartitionTiering, now_ms: int | None = None
                       ) -> list[tuple[LogSegment, int]]:
    """(segment, next segment's base offset) pairs eligible for copying, oldest first.

    With ``now_ms``, KIP-1241's copy lag applies too (Kafka 4.4's
    ``RLMCopyTask.candidateLogSegments``): the candidates end at the first segment not yet
    eligible by ``remote.copy.lag.ms`` or ``remote.copy.lag.bytes`` (``upload_eligible``)."""
    ulog = part.log
    with ulog.lock:
        from_offset = max(ulog.highest_offset_in_remote_storage + 1, ulog.log_start_offset)
        lso = ulog.last_stable_offset
        segments = list(ulog.local_log.segments)
        config = ulog.config
    pending = [(seg, nxt) for seg, nxt in zip(segments, segments[1:])
               if nxt.base_offset > from_offset]   # the others are copied or below the start
    # the bytes from the first uncopied segment to the log end, the active segment included
    total = sum(seg.size for seg, _ in pending) + segments[-1].size if segments else 0
    cumulative = 0
    out = []
    for seg, nxt in pending:
        if nxt.base_offset > lso:
            break
        cumulative += seg.size
        if now_ms is not None and not upload_eligible(config, seg, now_ms, total - cumulative):
            break
        out.append((seg, nxt.base_offset))
    return out


def upload_eligible(config, seg: LogSegment, now_ms: int, newer_bytes: int) -> bool:
    """KIP-1241: may ``seg`` be copied yet? Either lag 0: at once. Otherwise once the time
    since its latest record reaches a positive ``remote.copy.lag.ms`` (a timestamp in the
    future counts as reached), or the local bytes after it (``newer_bytes``) reach a positive
    ``remote.copy.lag.bytes``. Both lags negative (−1 with unlimited local retention): never,
    as in Kafka 4.4."""
    lag_ms, lag_bytes = config.remote_copy_lag_ms, config.remote_copy_lag_bytes
    if lag_ms == 0 or lag_bytes == 0:
        return True
    if lag_ms > 0:
        age = now_ms - seg.largest_timestamp
        if age < 0 or age >= lag_ms:
            return True
    return lag_bytes > 0 and newer_bytes >= lag_bytes


def copy_log_segments(ctx: TieringContext, part: PartitionTiering) -> int:
    """Copy every eligible segment of one partition; how many were copied.

    Before each segment the copy quota (KIP-956) admits it: the copier waits while the
    broker-wide copy byte rate is over ``remote.log.manager.copy.max.bytes.per.second``, then
    the segment's bytes are recorded, before the upload as Kafka's RLMCopyTask does, so that
    concurrent copiers see each other's admitted segments. Shutdown or copying turned off
    ends the wait and the run."""
    copied = 0

    def stop() -> bool:   # copy_enabled is False once the leadership is superseded
        return ctx.stopping or not part.copy_enabled

    for seg, next_base in candidate_segments(part, ctx.clock.milliseconds()):
        if stop():
            break
        if ctx.quotas is not None and not ctx.quotas.acquire_copy(seg.size, stop):
            break
        copy_log_segment(ctx, part, seg, next_base)
        copied += 1
    return copied


def copy_log_segment(ctx: TieringContext, part: PartitionTiering, seg: LogSegment,
                     next_base: int) -> RemoteLogSegmentMetadata:
    ulog = part.log
    end_offset = next_base - 1
    epochs = {e.epoch: e.start_offset
              for e in ulog.leader_epoch_cache.epoch_entries_in_range(seg.base_offset, next_base)}
    if not epochs:
        latest = ulog.leader_epoch_cache.latest_epoch()
        epochs = {latest if latest is not None else 0: seg.base_offset}
    txn_path = seg.txn_index.path
    has_txn = txn_path.exists() and txn_path.stat().st_size > 0
    meta = RemoteLogSegmentMetadata(
        RemoteLogSegmentId.generate_new(part.tip), seg.base_offset, end_offset,
        seg.largest_timestamp, ctx.broker_id, ctx.clock.milliseconds(), seg.size,
        segment_leader_epochs=epochs, txn_idx_empty=not has_txn,
        leader_epoch=ctx.leading_epoch(part))
    epoch_checkpoint = encode_epoch_entries(ulog.leader_epoch_cache.entries_up_to(next_base))
    with contextlib.ExitStack() as scratch:
        snapshot = ulog.producer_state.fetch_snapshot(next_base)
        if snapshot is None or not snapshot.exists():
            # No snapshot at the boundary (a segment rebuilt by recovery): upload an empty one.
            tmp = scratch.enter_context(tempfile.TemporaryDirectory(prefix="strata-copy-"))
            snapshot = Path(tmp) / f"{next_base:020d}.snapshot"
            snapshot.write_bytes(encode_snapshot([]))
            log.warning("%s: no producer snapshot at %d; copying an empty one", part.tip, next_base)
        data = LogSegmentData(seg.log_path, seg.offset_index.path, seg.time_index.path,
                              txn_path if has_txn else None, snapshot, epoch_checkpoint)
        # Set before COPY_SEGMENT_STARTED is visible and cleared after COPY_SEGMENT_FINISHED:
        # the expirer must never take the copy in flight for an orphan.
        part.copying = meta.remote_log_segment_id
        try:
            ctx.rlmm.add_remote_log_segment_metadata(meta).result()
            try:
                ctx.leading_epoch(part)
                custom = ctx.rsm.copy_log_segment_data(meta, data)
            except LeadershipLost:
                raise
            except Exception:
                ctx.metrics.copy_failed(part.tip.topic)
                _abandon_copy(ctx, part, meta)
                raise
            ctx.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                meta.remote_log_segment_id, ctx.clock.milliseconds(), custom,
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, ctx.broker_id,
                leader_epoch=ctx.leading_epoch(part))).result()
        finally:
            part.copying = None
    ulog.update_highest_offset_in_remote_storage(end_offset)
    ctx.metrics.copied(part.tip.topic, seg.size)
    log.info("copied %s [%d, %d] (%d bytes) to remote storage as %s", part.tip.topic_partition,
             seg.base_offset, end_offset, seg.size, meta.remote_log_segment_id.id)
    return meta


def _abandon_copy(ctx: TieringContext, part: PartitionTiering,
                  meta: RemoteLogSegmentMetadata) -> None:
    """Best effort after a failed copy: mark the attempt deleted so no listing keeps it.

    If the metadata or the store is unreachable, or the leadership is lost, the
    COPY_SEGMENT_STARTED record stays and the expirer deletes the orphan later.
    """
    from strata.tiered.manager.expirer import delete_remote_segment
    try:
        delete_remote_segment(ctx, meta, lambda: ctx.leading_epoch(part))
    except Exception as exc:  # noqa: BLE001 - the expirer retries
        log.warning("could not clean up failed copy %s yet: %s", meta.remote_log_segment_id.id, exc)
