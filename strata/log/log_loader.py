"""Opening a partition directory: what Kafka's LogLoader does at broker start.

1. Complete an interrupted cleaner swap: a ``.swap`` segment replaces every segment file
   whose base offset lies in its offset range, as Kafka's LogLoader does. Then remove leftovers
   of interrupted work (``.deleted``, ``.tmp``, ``.cleaned`` files) and index files whose
   ``.log`` is gone.
2. Open every segment; a missing or inconsistent index gets the segment recovered (rebuilt).
3. After an unclean shutdown, recover every segment from the one holding the recovery point:
   validate each batch, truncate a torn or corrupt tail (and drop the segments after it),
   rebuild indexes, producer state and the leader epoch cache.
4. Rebuild producer state from the latest snapshot up to the log end offset.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from strata.common.clock import Clock
from strata.common.files import fsync_dir
from strata.common.types import TopicPartition
from strata.log.indexes import AbortedTxn, CorruptIndexError
from strata.log.leader_epoch import LeaderEpochFileCache
from strata.log.log_config import LogConfig
from strata.log.producer_state import AppendOrigin, ProducerStateManager
from strata.log.segment import (
    CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX, LogSegment, offset_from_file_name)
from strata.protocol.records import HEADER_SIZE, read_header

log = logging.getLogger(__name__)

CLEANUP_SUFFIXES = (DELETED_SUFFIX, ".tmp", CLEANED_SUFFIX)
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    next_offset: int


def open_segment(directory: Path, base_offset: int, config: LogConfig, clock: Clock) -> LogSegment:
    return LogSegment(directory, base_offset,
                      index_interval_bytes=config.get("index.interval.bytes"),
                      max_index_size=config.get("segment.index.bytes"),
                      roll_jitter_ms=0, clock=clock)


def replay_batch(psm: ProducerStateManager, header, buf, segment: LogSegment | None = None) -> None:
    """Apply one stored batch to producer state; aborted txns go to ``segment``'s txn index."""
    if header.has_producer_id:
        info = psm.prepare_update(header.producer_id, AppendOrigin.REPLICATION)
        completed = info.append_batch(header, buf, AppendOrigin.REPLICATION)
        psm.update(info)
        if completed is not None:
            lso = psm.last_stable_offset(completed)
            if segment is not None and completed.is_aborted:
                segment.update_txn_index(AbortedTxn(completed.producer_id, completed.first_offset,
                                                    completed.last_offset, lso))
            psm.complete_txn(completed)
    psm.update_map_end_offset(header.last_offset + 1)


def rebuild_producer_state(psm: ProducerStateManager, segments: list[LogSegment],
                           log_start_offset: int, up_to: int, now_ms: int) -> None:
    """Latest snapshot at or below ``up_to``, then replay the stored batches after it."""
    psm.truncate_and_reload(log_start_offset, up_to, now_ms)
    start = max(psm.map_end_offset, log_start_offset)
    # Snapshots at the last two segment boundaries, as Kafka takes them, so the tiered copier
    # finds the producer snapshot that belongs with each recent segment.
    snapshot_at = {s.base_offset for s in segments[-2:] if start < s.base_offset < up_to}
    for seg in segments:
        if seg.base_offset >= up_to:
            break
        if seg.base_offset in snapshot_at and psm.map_end_offset <= seg.base_offset:
            psm.update_map_end_offset(seg.base_offset)
            psm.take_snapshot()
        position = 0
        if seg.base_offset <= start:
            found = seg.translate_offset(start)
            if found is None:
                continue
            position = found.position
        for h, block, _ in seg.iter_batches(position):
            if h.base_offset >= up_to:
                break
            if h.last_offset >= start:
                replay_batch(psm, h, block)
    psm.update_map_end_offset(up_to)


def load_log(directory: Path, config: LogConfig, topic_partition: TopicPartition, *,
             recovery_point: int, log_start_offset: int, had_clean_shutdown: bool,
             psm: ProducerStateManager, epoch_cache: LeaderEpochFileCache, clock: Clock,
             remote_log_enabled: bool = False) -> LoadedLog:
    directory = Path(directory)
    _remove_leftovers(directory)
    segments: dict[int, LogSegment] = {}
    needs_recovery: set[int] = set()
    for path in sorted(directory.glob(f"*{LOG_SUFFIX}")):
        base = offset_from_file_name(path.name)
        index_missing = not (directory / path.name.replace(LOG_SUFFIX, INDEX_SUFFIX)).exists() or \
            not (directory / path.name.replace(LOG_SUFFIX, TIME_INDEX_SUFFIX)).exists()
        seg = open_segment(directory, base, config, clock)
        segments[base] = seg
        if index_missing:
            log.warning("index of %s missing; rebuilding", path)
            needs_recovery.add(base)
            continue
        try:
            seg.sanity_check()
            _check_index_bounds(seg)
        except CorruptIndexError as exc:
            # an empty segment's index still preallocated (zeros) after an unclean stop is
            # expected, not damage: rebuilt as quietly as Kafka's recovery does
            (log.debug if seg.size == 0 else log.warning)(
                "index of %s corrupt (%s); rebuilding", path, exc)
            needs_recovery.add(base)
    ordered = [segments[b] for b in sorted(segments)]

    # Segments rebuilt for a bad index alone (below the recovery point) keep their data.
    for seg in ordered:
        if seg.base_offset in needs_recovery and not _unflushed(seg, ordered, recovery_point,
                                                               had_clean_shutdown):
            seg.recover()
            if seg is not ordered[-1]:
                seg.on_become_inactive()

    if not ordered:
        ordered = [open_segment(directory, log_start_offset, config, clock)]

    if not had_clean_shutdown:
        ordered = _recover_unflushed(ordered, recovery_point, log_start_offset, psm, epoch_cache,
                                     clock)
    active = ordered[-1]
    next_offset = max(active.read_next_offset(), active.base_offset)
    if next_offset < log_start_offset:
        # What is left ends below the checkpointed log start offset (a torn tail after
        # DeleteRecords): Kafka drops every segment and restarts the log at the log start offset.
        log.warning("log end offset %d below log start offset %d in %s: deleting all segments",
                    next_offset, log_start_offset, directory)
        for seg in ordered:
            seg.delete_files()
        epoch_cache.clear_and_flush()
        psm.truncate_fully_and_start_at(log_start_offset)
        ordered = [open_segment(directory, log_start_offset, config, clock)]
        active = ordered[0]
        next_offset = log_start_offset
    active.resize_indexes()

    if not remote_log_enabled:
        log_start_offset = max(log_start_offset, ordered[0].base_offset)
    epoch_cache.truncate_from_end(next_offset)
    epoch_cache.truncate_from_start(log_start_offset)
    rebuild_producer_state(psm, ordered, log_start_offset, next_offset, clock.milliseconds())
    recovery_point = next_offset if had_clean_shutdown else min(recovery_point, next_offset)
    return LoadedLog(ordered, log_start_offset, recovery_point, next_offset)


def _unflushed(seg: LogSegment, ordered: list[LogSegment], recovery_point: int,
               had_clean_shutdown: bool) -> bool:
    if had_clean_shutdown:
        return False
    i = ordered.index(seg)
    nxt = ordered[i + 1].base_offset if i + 1 < len(ordered) else None
    return nxt is None or nxt > recovery_point


def _recover_unflushed(ordered: list[LogSegment], recovery_point: int, log_start_offset: int,
                       psm: ProducerStateManager, epoch_cache: LeaderEpochFileCache,
                       clock: Clock) -> list[LogSegment]:
    first = next(i for i, s in enumerate(ordered)
                 if i + 1 == len(ordered) or ordered[i + 1].base_offset > recovery_point)
    rebuild_producer_state(psm, ordered[:first], log_start_offset, ordered[first].base_offset,
                           clock.milliseconds())
    kept = ordered[: first]
    for i in range(first, len(ordered)):
        seg = ordered[i]
        log.info("recovering unflushed segment %d of %s", seg.base_offset, seg.directory.name)

        def on_batch(h, block, seg=seg):
            if h.partition_leader_epoch >= 0:
                latest = epoch_cache.latest_epoch()
                if latest is None or h.partition_leader_epoch > latest:
                    epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
            replay_batch(psm, h, block, seg)

        truncated = seg.recover(on_batch)
        kept.append(seg)
        if truncated > 0:
            for later in ordered[i + 1:]:
                log.warning("deleting segment %d after the corrupt tail", later.base_offset)
                later.delete_files()
            break
        psm.take_snapshot()
        if i + 1 < len(ordered):
            seg.on_become_inactive()
    return kept


def _check_index_bounds(seg: LogSegment) -> None:
    """Cheap checks beyond Kafka's: the last index entries must point inside the segment."""
    if seg.offset_index.entries:
        last = seg.offset_index.entry(seg.offset_index.entries - 1)
        if last.position >= seg.size or last.offset < seg.base_offset:
            raise CorruptIndexError(f"last offset index entry {last} beyond the log ({seg.size} bytes)")
    if seg.time_index.entries:
        last_t = seg.time_index.last_entry
        if last_t.offset < seg.base_offset:
            raise CorruptIndexError(f"last time index entry {last_t} below the base offset")


def _next_offset_of_log_file(path: Path) -> int:
    """The offset after the last complete batch of a ``.log`` file (its base when empty)."""
    next_offset = offset_from_file_name(path.name)
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos + HEADER_SIZE <= size:
            f.seek(pos)
            h = read_header(f.read(HEADER_SIZE), 0)
            if h.batch_length < HEADER_SIZE - 12 or pos + h.size > size:
                break
            next_offset = h.next_offset
            pos += h.size
    return next_offset


def _complete_swaps(directory: Path) -> None:
    """Finish a cleaner swap cut short: drop the segment files the ``.swap`` segments replace
    (base offsets in [min swap base, max swap next offset)), then drop the ``.swap`` suffixes."""
    swaps = list(directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}"))
    if swaps:
        lo = min(offset_from_file_name(p.name) for p in swaps)
        hi = max(_next_offset_of_log_file(p) for p in swaps)
        for p in directory.iterdir():
            if p.name.endswith(SEGMENT_FILE_SUFFIXES) and lo <= offset_from_file_name(p.name) < hi:
                log.info("removing %s, replaced by a swap segment", p)
                p.unlink(missing_ok=True)
    for p in directory.glob(f"*{SWAP_SUFFIX}"):
        log.info("completing the swap of %s", p)
        os.rename(p, p.with_name(p.name[: -len(SWAP_SUFFIX)]))
    if swaps:
        fsync_dir(directory)


def _remove_leftovers(directory: Path) -> None:
    _complete_swaps(directory)
    present_logs = {p.name[: -len(LOG_SUFFIX)] for p in directory.glob(f"*{LOG_SUFFIX}")}
    for p in directory.iterdir():
        if p.name.endswith(CLEANUP_SUFFIXES):
            log.info("removing leftover file %s", p)
            p.unlink(missing_ok=True)
        elif p.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX) and \
                p.name[: -len(p.suffix)] not in present_logs:
            log.info("removing orphaned index file %s", p)
            p.unlink(missing_ok=True)
