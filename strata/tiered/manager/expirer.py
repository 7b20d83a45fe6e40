"""The expirer task: remote segments that retention, the log start offset or lineage rule out.

A leader's remote segments are deleted (DELETE_SEGMENT_STARTED → storage delete →
DELETE_SEGMENT_FINISHED) when they (``plan_expiration``):

- end below the log start offset (DeleteRecords, or local retention of a log that was tiered);
- are in the log's leader-epoch lineage and older than ``retention.ms`` (max timestamp ≤
  now − retention.ms), oldest first, stopping at the first that is not;
- are in the lineage and push the whole log (those segments plus local data not yet tiered)
  over ``retention.bytes``, oldest first while the excess still covers the segment;
- hold only epochs older than the log's earliest one (an old lineage's, Kafka's rule after
  an unclean election);
- are COPY_SEGMENT_STARTED orphans of a copy that failed or crashed (not the copy in flight), or
  DELETE_SEGMENT_STARTED leftovers of a delete that did not finish.

Never deleted (Kafka's rule: only what breaches retention or the log start goes): a segment
outside the lineage otherwise (another leader's view of the log, such as a successor's copy
that this broker has not replicated yet), and any segment holding an epoch above the log's
latest or last written at a leader epoch above the one this broker leads at: those are a
later leader's, whatever state they are in.

Deleting by retention moves the log start offset past the deleted data, after which the local
log drops the segments below it. Every metadata record and storage delete is fenced by
leadership as the copier's are (``TieringContext.leading_epoch``).

Below the metadata, ``abort_incomplete_uploads`` sweeps the store itself for what uploads cut
short by a crash left there (temporary files, incomplete multipart uploads), which no
metadata names.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Callable

from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState, RemoteResourceNotFoundException)
from strata.tiered.manager.lineage import within_lineage

if TYPE_CHECKING:
    from strata.tiered.manager.remote_log_manager import PartitionTiering, TieringContext

log = logging.getLogger(__name__)

_S = RemoteLogSegmentState


def _no_leader() -> int:
    return -1


def delete_remote_segment(ctx: TieringContext, meta: RemoteLogSegmentMetadata,
                          leader_epoch: Callable[[], int] = _no_leader) -> None:
    """DELETE_SEGMENT_STARTED → delete the objects → DELETE_SEGMENT_FINISHED (idempotent).

    ``leader_epoch`` is asked before each of the three steps for the epoch the records carry
    (a leader's task: ``TieringContext.leading_epoch``, which raises once it no longer
    leads); the default, -1, is for deletions no leader makes (the topic's)."""
    seg_id = meta.remote_log_segment_id
    if meta.state is not _S.DELETE_SEGMENT_STARTED:
        ctx.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            seg_id, ctx.clock.milliseconds(), None, _S.DELETE_SEGMENT_STARTED,
            ctx.broker_id, leader_epoch=leader_epoch())).result()
    leader_epoch()
    try:
        ctx.rsm.delete_log_segment_data(meta)
    except Exception:
        ctx.metrics.delete_failed(seg_id.topic_id_partition.topic)
        raise
    if ctx.index_cache is not None:
        ctx.index_cache.remove(seg_id.id)
    try:
        ctx.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            seg_id, ctx.clock.milliseconds(), None, _S.DELETE_SEGMENT_FINISHED,
            ctx.broker_id, leader_epoch=leader_epoch())).result()
    except RemoteResourceNotFoundException:
        pass  # already finished by an earlier attempt
    ctx.metrics.deleted(seg_id.topic_id_partition.topic)


@dataclasses.dataclass(frozen=True)
class LogView:
    """What the expirer knows of the log: its offsets, its leader-epoch lineage (epoch ->
    start offset), the bytes of its local data not yet tiered, its retention settings, and
    the leader epoch the broker leads it at."""

    log_start: int
    log_end: int
    lineage: dict[int, int]
    local_only_bytes: int
    retention_ms: int
    retention_bytes: int
    leader_epoch: int


def plan_expiration(segments: list[RemoteLogSegmentMetadata], view: LogView, now_ms: int,
                    orphans: set[RemoteLogSegmentId], copying: RemoteLogSegmentId | None
                    ) -> tuple[list[RemoteLogSegmentMetadata], int]:
    """(the segments to delete, the log start offset after deleting them) by the rules in
    the module's docstring; ``segments`` by start offset, ``orphans`` the COPY_SEGMENT_STARTED
    attempts known to be over. Pure: the same inputs give the same plan."""
    epochs = view.lineage
    earliest = min(epochs, default=-1)
    latest = max(epochs, default=-1)
    doomed: list[RemoteLogSegmentMetadata] = []
    live: list[RemoteLogSegmentMetadata] = []
    for m in segments:
        if max(m.segment_leader_epochs) > latest or m.leader_epoch > view.leader_epoch:
            continue  # a later leader's: never this broker's to delete
        if m.state is _S.COPY_SEGMENT_STARTED:
            if m.remote_log_segment_id in orphans:
                doomed.append(m)  # orphan of a failed or interrupted copy
        elif m.state is _S.DELETE_SEGMENT_STARTED:
            if m.remote_log_segment_id != copying:  # else the copier is cleaning up its attempt
                doomed.append(m)
        elif within_lineage(m, epochs, earliest, view.log_end):
            live.append(m)
        elif m.end_offset < view.log_start or all(e < earliest for e in m.segment_leader_epochs):
            doomed.append(m)

    new_log_start = view.log_start
    retention_bytes = view.retention_bytes
    excess = sum(m.segment_size_in_bytes for m in live) + view.local_only_bytes - retention_bytes \
        if retention_bytes >= 0 else 0
    by_time = view.retention_ms >= 0
    for m in live:
        if m.end_offset < view.log_start:
            doomed.append(m)
            continue
        if by_time and m.max_timestamp_ms <= now_ms - view.retention_ms:
            reason_ok = True
        else:
            by_time = False
            reason_ok = excess > 0 and excess >= m.segment_size_in_bytes
        if not reason_ok:
            break
        excess -= m.segment_size_in_bytes
        doomed.append(m)
        new_log_start = max(new_log_start, m.end_offset + 1)
    return doomed, new_log_start


def expire_remote_segments(ctx: TieringContext, part: PartitionTiering) -> int:
    """Delete what ``plan_expiration`` rules out; how many segments were deleted."""
    ulog = part.log
    cfg = ulog.config
    leader_epoch = ctx.leading_epoch(part)
    now = ctx.clock.milliseconds()
    segments = list(ctx.rlmm.list_remote_log_segments(part.tip))  # by start offset
    # The copy in flight, read after the listing. The copier sets it before publishing
    # COPY_SEGMENT_STARTED and clears it after COPY_SEGMENT_FINISHED, so a listed attempt that is
    # not the one in flight is over -- but it may have finished since the listing: only the
    # attempts still COPY_SEGMENT_STARTED in a listing made after this read are orphans.
    copying = part.copying
    orphans = {m.remote_log_segment_id for m in segments
               if m.state is _S.COPY_SEGMENT_STARTED and m.remote_log_segment_id != copying}
    if orphans:
        orphans = {m.remote_log_segment_id for m in ctx.rlmm.list_remote_log_segments(part.tip)
                   if m.remote_log_segment_id in orphans and m.state is _S.COPY_SEGMENT_STARTED}
    with ulog.lock:
        highest = ulog.highest_offset_in_remote_storage
        view = LogView(
            log_start=ulog.log_start_offset, log_end=ulog.log_end_offset,
            lineage={e.epoch: e.start_offset for e in ulog.leader_epoch_cache.epoch_entries()},
            local_only_bytes=sum(s.size for s in ulog.local_log.segments if s.base_offset > highest),
            retention_ms=cfg.get("retention.ms"), retention_bytes=cfg.get("retention.bytes"),
            leader_epoch=leader_epoch)
    doomed, new_log_start = plan_expiration(segments, view, now, orphans, copying)

    if new_log_start > view.log_start:
        # Readers must stop at the new start before the objects go.
        ctx.leading_epoch(part)
        ulog.maybe_increment_log_start_offset(new_log_start, "remote retention")
    deleted = 0
    for m in doomed:
        if ctx.stopping:
            break
        delete_remote_segment(ctx, m, lambda: ctx.leading_epoch(part))
        deleted += 1
    if deleted:
        log.info("%s: deleted %d remote segment(s); log start offset %d",
                 part.tip.topic_partition, deleted, ulog.log_start_offset)
    return deleted


def delete_all_remote_segments(ctx: TieringContext, part_tip, stop_check=lambda: False) -> int:
    """Every remote segment of a partition, whatever its state (topic deletion, disabling)."""
    deleted = 0
    for m in list(ctx.rlmm.list_remote_log_segments(part_tip)):
        if stop_check():
            break
        delete_remote_segment(ctx, m)
        deleted += 1
    return deleted


def abort_incomplete_uploads(ctx: TieringContext) -> int:
    """Remove the leftovers of interrupted uploads from the remote store (the RSM's age bound;
    never an upload in progress here); how many were removed."""
    removed = ctx.rsm.abort_incomplete_uploads()
    if removed:
        log.info("removed %d incomplete upload(s) from remote storage", removed)
    return removed
