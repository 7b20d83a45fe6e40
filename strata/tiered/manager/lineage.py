"""A log's leader-epoch lineage and the remote segments in it.

A remote segment may hold records a log no longer has: an old leader tiered records that an
unclean election or a lost unflushed tail took out of the log, and Kafka's expirer leaves
such a copy to retention. ``within_lineage`` says whether a whole segment is the log's (the
expirer's and the copier's test); ``lineage_end`` how far into a segment the log's records
go (the remote read's bound).
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.tiered.api import RemoteLogSegmentMetadata


def _with_records(entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(epoch, start offset) entries of the epochs that hold records: an entry the next one
    starts at the same offset as is dropped (Kafka's ``buildFilteredLeaderEpochMap``)."""
    return [e for e, nxt in zip(entries, [*entries[1:], None]) if nxt is None or nxt[1] > e[1]]


def within_lineage(meta: RemoteLogSegmentMetadata, epochs: dict[int, int], earliest_epoch: int,
                   log_end_offset: int) -> bool:
    """Whether the segment is part of the log's epoch lineage (Kafka's
    ``isRemoteSegmentWithinLeaderEpochs``): every epoch of the segment is one the log still
    has, at the same start offset, and ends in the segment where it ends in the log -- the
    log's next epoch is the segment's next one, and the segment's last epoch ends no later
    than the log's (a segment an old leader tiered past the offset where the log's next epoch
    starts holds records the log no longer has); and the segment ends below the log end."""
    if meta.end_offset >= log_end_offset:
        return False
    seg_epochs = _with_records(sorted(meta.segment_leader_epochs.items()))
    lineage = _with_records(sorted(epochs.items()))
    if all(epoch < earliest_epoch for epoch, _ in seg_epochs):
        return False  # the log's earliest epoch covers its start: this is no part of it
    if seg_epochs[-1][0] > max(epochs, default=-1):
        return False
    starts = dict(lineage)
    for i, (epoch, start) in enumerate(seg_epochs):
        if epoch < earliest_epoch:
            continue  # truncated from the start of the cache with the log start offset
        cached = starts.get(epoch)
        if cached is None:
            return False
        if i > 0 and cached != start:
            return False
        later = next(((e, s) for e, s in lineage if e > epoch), None)
        if i + 1 < len(seg_epochs):
            if later != seg_epochs[i + 1]:
                return False
        elif later is not None and meta.end_offset >= later[1]:
            return False
    return True


def lineage_end(meta: RemoteLogSegmentMetadata, entries: Sequence[tuple[int, int]]) -> int:
    """The offset after the last one of the segment whose record is the log's: where the
    segment's epochs (those with records) first part from the log's ``entries`` ((epoch,
    start offset), by epoch), else the segment's end + 1. An epoch of the segment the log
    lacks ends it where that epoch starts; an epoch the log ends earlier, or follows with
    another epoch than the segment does, ends it where the log's next epoch starts. Epochs
    below the log's earliest (truncated with the log start offset) are passed over."""
    lineage = _with_records(sorted((e, s) for e, s in entries))
    epochs = dict(lineage)
    seg = _with_records(sorted(meta.segment_leader_epochs.items()))
    for i, (epoch, start) in enumerate(seg):
        if epoch not in epochs:
            if lineage and epoch < lineage[0][0]:
                continue  # below the log start, where the cache was truncated: never read
            return max(start, meta.start_offset)
        truncated = epoch == lineage[0][0] and start < epochs[epoch]  # the cache's start moved
        if i > 0 and epochs[epoch] != start and not truncated:
            return start  # the log's epoch starts elsewhere
        later = next((s for e, s in lineage if e > epoch), None)
        seg_next = seg[i + 1][1] if i + 1 < len(seg) else meta.end_offset + 1
        if later is not None and later < seg_next:
            return later
        if i + 1 < len(seg) and later != seg_next:
            return seg_next
    return meta.end_offset + 1
