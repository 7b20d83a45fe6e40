"""The materialised remote log metadata: per user partition, its segments by leader epoch.

Kafka's ``RemoteLogMetadataCache``, ``RemoteLogLeaderEpochState`` and
``RemotePartitionMetadataStore`` (``org.apache.kafka.server.log.remote.metadata.storage``),
with the same visibility rules per segment state:

=================================  =======  ========  ==============  ===============
method                             STARTED  FINISHED  DELETE_STARTED  DELETE_FINISHED
=================================  =======  ========  ==============  ===============
remote_log_segment_metadata                 yes
list_remote_log_segments(, epoch)  yes      yes       yes
highest_offset_for_epoch                    yes [1]
=================================  =======  ========  ==============  ===============

[1] the highest offset an epoch ever reached in a finished copy; deleting the segment later
does not lower it (Kafka keeps it too, so the copier never re-uploads deleted data).

A segment reaching DELETE_SEGMENT_FINISHED leaves the cache. Invalid transitions raise:
RemoteResourceNotFoundException for an update of an unknown segment, ValueError for a
transition ``RemoteLogSegmentState.is_valid_transition`` refuses (Kafka's cache logs and
drops both; the topic-based manager's consumer does that with the exception).
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections.abc import Iterable, Iterator

from strata.tiered.api import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundException,
    TopicIdPartition,
)

__all__ = [
    "IllegalStateTransition",
    "RemoteLogLeaderEpochState",
    "RemoteLogMetadataCache",
    "RemotePartitionMetadataStore",
]

_S = RemoteLogSegmentState


class IllegalStateTransition(ValueError):
    """A metadata event whose state does not follow from the current one."""


def _sort_key(metadata: RemoteLogSegmentMetadata) -> tuple[int, int, int]:
    # Start offset as Kafka sorts; the rest only makes ties deterministic.
    return metadata.start_offset, metadata.end_offset, metadata.remote_log_segment_id.id.int


def _epoch_end_offset(metadata: RemoteLogSegmentMetadata, epoch: int) -> int:
    """Last offset of ``epoch`` inside the segment: the next epoch's start - 1, or the end."""
    later = [offset for e, offset in metadata.segment_leader_epochs.items() if e > epoch]
    return later[0] - 1 if later else metadata.end_offset


class RemoteLogLeaderEpochState:
    """The segments of one leader epoch of one partition (Kafka's ``RemoteLogLeaderEpochState``).

    ``offset_to_id``: the epoch's first offset in a segment -> that segment, for
    COPY_SEGMENT_FINISHED segments only (its keys also kept sorted for floor lookups);
    ``unreferenced``: segments of the epoch not in that map (still copying, being deleted,
    or superseded by a later copy of the same range); ``highest_offset``: the highest offset
    of the epoch in any finished copy, or None. Not thread-safe: the owning cache's lock
    guards it.
    """

    __slots__ = ("offset_to_id", "unreferenced", "highest_offset", "_starts")

    def __init__(self, offset_to_id: dict[int, RemoteLogSegmentId] | None = None,
                 unreferenced: Iterable[RemoteLogSegmentId] = (),
                 highest_offset: int | None = None) -> None:
        self.offset_to_id: dict[int, RemoteLogSegmentId] = dict(offset_to_id or {})
        self.unreferenced: set[RemoteLogSegmentId] = set(unreferenced)
        self.highest_offset = highest_offset
        self._starts = sorted(self.offset_to_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemoteLogLeaderEpochState):
            return NotImplemented
        return (self.offset_to_id == other.offset_to_id and self.unreferenced == other.unreferenced
                and self.highest_offset == other.highest_offset)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"RemoteLogLeaderEpochState(offset_to_id={self.offset_to_id}, "
                f"unreferenced={self.unreferenced}, highest_offset={self.highest_offset})")

    def copy(self) -> RemoteLogLeaderEpochState:
        return RemoteLogLeaderEpochState(self.offset_to_id, self.unreferenced, self.highest_offset)

    def is_empty(self) -> bool:
        return not self.offset_to_id and not self.unreferenced and self.highest_offset is None

    def segment_ids(self) -> list[RemoteLogSegmentId]:
        return [*self.offset_to_id.values(), *self.unreferenced]

    def floor_segment(self, offset: int) -> RemoteLogSegmentId | None:
        """The finished segment whose epoch start is the greatest one <= ``offset``."""
        i = bisect.bisect_right(self._starts, offset)
        return self.offset_to_id[self._starts[i - 1]] if i else None

    def on_copy_started(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced.add(segment_id)

    def on_copy_finished(self, start_offset: int, segment_id: RemoteLogSegmentId,
                         epoch_end_offset: int) -> None:
        # A new leader may upload again what a lagging predecessor had uploaded (the same
        # range or a superset): finished segments starting at or after this one's epoch start
        # are superseded and become unreferenced.
        while self._starts and self._starts[-1] >= start_offset \
                and self.highest_offset is not None and self.highest_offset <= epoch_end_offset:
            self.unreferenced.add(self.offset_to_id.pop(self._starts.pop()))
        if start_offset not in self.offset_to_id:
            bisect.insort(self._starts, start_offset)
        self.offset_to_id[start_offset] = segment_id
        self.unreferenced.discard(segment_id)
        if self.highest_offset is None or epoch_end_offset > self.highest_offset:
            self.highest_offset = epoch_end_offset

    def on_delete_started(self, start_offset: int, segment_id: RemoteLogSegmentId) -> None:
        if self.offset_to_id.get(start_offset) == segment_id:
            del self.offset_to_id[start_offset]
            del self._starts[bisect.bisect_left(self._starts, start_offset)]
        self.unreferenced.add(segment_id)

    def on_delete_finished(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced.discard(segment_id)


class RemoteLogMetadataCache:
    """The remote segments of one user partition (Kafka's ``RemoteLogMetadataCache``).

    Holds every segment that has not reached DELETE_SEGMENT_FINISHED, by id, and a
    RemoteLogLeaderEpochState per leader epoch the segments contain (epochs whose state
    becomes empty are dropped). Listings are sorted by start offset. Two caches compare
    equal when segments and epoch states are equal. Not thread-safe: the
    RemotePartitionMetadataStore's lock guards it.
    """

    def __init__(self) -> None:
        self.segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self.epochs: dict[int, RemoteLogLeaderEpochState] = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemoteLogMetadataCache):
            return NotImplemented
        return self.segments == other.segments and self.epochs == other.epochs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RemoteLogMetadataCache({len(self.segments)} segments, epochs {sorted(self.epochs)})"

    def __len__(self) -> int:
        return len(self.segments)

    def is_empty(self) -> bool:
        """No segments and no epoch state (not even a highest offset) left."""
        return not self.segments and not self.epochs

    # ---- reads ----------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self.segments.get(segment_id)

    def remote_log_segment_metadata(self, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding ``offset`` within ``leader_epoch``, or None."""
        state = self.epochs.get(leader_epoch)
        segment_id = state.floor_segment(offset) if state is not None else None
        if segment_id is None:
            return None
        metadata = self.segments[segment_id]
        return metadata if offset <= _epoch_end_offset(metadata, leader_epoch) else None

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        state = self.epochs.get(leader_epoch)
        return state.highest_offset if state is not None else None

    def list_remote_log_segments(self, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Segments in COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED or DELETE_SEGMENT_STARTED,
        all or those holding ``leader_epoch``, sorted by start offset."""
        if leader_epoch is None:
            found: Iterable[RemoteLogSegmentMetadata] = self.segments.values()
        else:
            state = self.epochs.get(leader_epoch)
            found = [self.segments[i] for i in state.segment_ids()] if state is not None else []
        return sorted(found, key=_sort_key)

    def remote_log_size(self, leader_epoch: int) -> int:
        """Bytes of the segments ``list_remote_log_segments(leader_epoch)`` returns."""
        return sum(m.segment_size_in_bytes for m in self.list_remote_log_segments(leader_epoch))

    # ---- changes --------------------------------------------------------------------------

    def add_copy_in_progress_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Track a new segment in COPY_SEGMENT_STARTED; not readable until it is finished.

        Adding a segment that is still in COPY_SEGMENT_STARTED again replaces its metadata
        (a retried publish; unlike Kafka, epochs it no longer lists drop it); any other
        existing state raises IllegalStateTransition.
        """
        if metadata.state is not _S.COPY_SEGMENT_STARTED:
            raise ValueError(f"a new segment must be in {_S.COPY_SEGMENT_STARTED.name}, "
                             f"not {metadata.state.name}: {metadata}")
        segment_id = metadata.remote_log_segment_id
        existing = self.segments.get(segment_id)
        self._check_transition(existing.state if existing else None, metadata.state, segment_id)
        if existing is not None:  # replaced: forget epochs the new metadata no longer has
            for epoch in existing.segment_leader_epochs.keys() - metadata.segment_leader_epochs.keys():
                state = self.epochs[epoch]
                state.unreferenced.discard(segment_id)
                if state.is_empty():
                    del self.epochs[epoch]
        for epoch in metadata.segment_leader_epochs:
            self._epoch(epoch).on_copy_started(segment_id)
        self.segments[segment_id] = metadata

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        """Move a known segment to the update's state (and take its custom metadata, broker
        id and event time)."""
        segment_id = update.remote_log_segment_id
        existing = self.segments.get(segment_id)
        if existing is None:
            raise RemoteResourceNotFoundException(f"No remote log segment metadata found for: {segment_id}")
        if update.state is _S.COPY_SEGMENT_STARTED:
            raise ValueError(f"an update can not move a segment to {_S.COPY_SEGMENT_STARTED.name}: {update}")
        self._check_transition(existing.state, update.state, segment_id)
        metadata = existing.create_with_updates(update)
        for epoch, start in metadata.segment_leader_epochs.items():
            state = self._epoch(epoch)
            if update.state is _S.COPY_SEGMENT_FINISHED:
                state.on_copy_finished(start, segment_id, _epoch_end_offset(metadata, epoch))
            elif update.state is _S.DELETE_SEGMENT_STARTED:
                state.on_delete_started(start, segment_id)
            else:
                state.on_delete_finished(segment_id)
                if state.is_empty():
                    del self.epochs[epoch]
        if update.state is _S.DELETE_SEGMENT_FINISHED:
            del self.segments[segment_id]
        else:
            self.segments[segment_id] = metadata

    def restore(self, segments: Iterable[RemoteLogSegmentMetadata],
                epochs: Iterable[tuple[int, RemoteLogLeaderEpochState]]) -> None:
        """Load state exactly as ``segments`` and ``epoch_states()`` gave it (snapshots).

        Raises ValueError if an epoch state names a segment that is not in ``segments``.
        """
        by_id = {m.remote_log_segment_id: m for m in segments}
        states = dict(epochs)
        for state in states.values():
            missing = [i for i in state.segment_ids() if i not in by_id]
            if missing:
                raise ValueError(f"epoch state refers to unknown segments {missing}")
        self.segments = by_id
        self.epochs = states

    def epoch_states(self) -> list[tuple[int, RemoteLogLeaderEpochState]]:
        """Copies of the per-epoch states, by epoch (snapshots)."""
        return [(epoch, state.copy()) for epoch, state in sorted(self.epochs.items())]

    def _epoch(self, epoch: int) -> RemoteLogLeaderEpochState:
        state = self.epochs.get(epoch)
        if state is None:
            state = self.epochs[epoch] = RemoteLogLeaderEpochState()
        return state

    @staticmethod
    def _check_transition(src: RemoteLogSegmentState | None, dst: RemoteLogSegmentState,
                          segment_id: RemoteLogSegmentId) -> None:
        if not _S.is_valid_transition(src, dst):
            raise IllegalStateTransition(
                f"segment {segment_id.id} can not move from {src.name if src else 'nothing'} "
                f"to {dst.name}")


class RemotePartitionMetadataStore:
    """Every user partition's RemoteLogMetadataCache and remote partition delete state.

    Kafka's ``RemotePartitionMetadataStore``, except that a partition's cache is created by
    its first segment event rather than by assignment, and dropped when nothing is left in
    it. DELETE_PARTITION_FINISHED drops the partition's cache and delete state. Thread-safe: one lock around every read and change;
    reads return lists and value objects, never live views.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caches: dict[TopicIdPartition, RemoteLogMetadataCache] = {}
        self._delete_states: dict[TopicIdPartition, RemotePartitionDeleteMetadata] = {}

    # ---- changes --------------------------------------------------------------------------

    def handle(self, metadata: RemoteLogMetadata) -> None:
        """Apply one event; raises as RemoteLogMetadataCache does for invalid ones."""
        with self._lock:
            if isinstance(metadata, RemoteLogSegmentMetadata):
                tip = metadata.topic_id_partition
                cache = self._caches.get(tip)
                if cache is None:
                    cache = RemoteLogMetadataCache()
                    cache.add_copy_in_progress_segment(metadata)
                    self._caches[tip] = cache
                else:
                    cache.add_copy_in_progress_segment(metadata)
            elif isinstance(metadata, RemoteLogSegmentMetadataUpdate):
                cache = self._caches.get(metadata.topic_id_partition)
                if cache is None:
                    raise RemoteResourceNotFoundException(
                        f"No remote log segment metadata found for: {metadata.remote_log_segment_id}")
                cache.update_remote_log_segment_metadata(metadata)
                if cache.is_empty():
                    del self._caches[metadata.topic_id_partition]
            elif isinstance(metadata, RemotePartitionDeleteMetadata):
                # As Kafka's store: any state is taken as it comes; only publishing checks order.
                tip = metadata.topic_id_partition
                if metadata.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                    self._caches.pop(tip, None)
                    self._delete_states.pop(tip, None)
                else:
                    self._delete_states[tip] = metadata
            else:
                raise TypeError(f"not a remote log metadata event: {type(metadata).__name__}")

    def restore_partition(self, tip: TopicIdPartition, cache: RemoteLogMetadataCache) -> None:
        with self._lock:
            if not cache.is_empty():
                self._caches[tip] = cache
            else:
                self._caches.pop(tip, None)

    def restore_delete_state(self, metadata: RemotePartitionDeleteMetadata) -> None:
        with self._lock:
            self._delete_states[metadata.topic_id_partition] = metadata

    def clear_partition(self, tip: TopicIdPartition) -> None:
        """Forget a partition's segments and delete state."""
        with self._lock:
            self._caches.pop(tip, None)
            self._delete_states.pop(tip, None)

    # ---- reads ----------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        with self._lock:
            cache = self._caches.get(segment_id.topic_id_partition)
            return cache.segment(segment_id) if cache is not None else None

    def delete_state(self, tip: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        with self._lock:
            return self._delete_states.get(tip)

    def remote_log_segment_metadata(self, tip: TopicIdPartition, leader_epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        with self._lock:
            cache = self._caches.get(tip)
            return cache.remote_log_segment_metadata(leader_epoch, offset) if cache else None

    def highest_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        with self._lock:
            cache = self._caches.get(tip)
            return cache.highest_offset_for_epoch(leader_epoch) if cache else None

    def list_remote_log_segments(self, tip: TopicIdPartition,
                                 leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        with self._lock:
            cache = self._caches.get(tip)
            return cache.list_remote_log_segments(leader_epoch) if cache else []

    def remote_log_size(self, tip: TopicIdPartition, leader_epoch: int) -> int:
        with self._lock:
            cache = self._caches.get(tip)
            return cache.remote_log_size(leader_epoch) if cache else 0

    def partitions(self) -> list[TopicIdPartition]:
        """Partitions with segments or a delete state."""
        with self._lock:
            return list(self._caches.keys() | self._delete_states.keys())

    def export(self, tips: Iterable[TopicIdPartition]) -> tuple[
            list[tuple[TopicIdPartition, list[RemoteLogSegmentMetadata],
                       list[tuple[int, RemoteLogLeaderEpochState]]]],
            list[RemotePartitionDeleteMetadata]]:
        """A consistent copy of the given partitions' state: (partition, segments by start
        offset, epoch states) for those with any, and their delete states."""
        with self._lock:
            caches = []
            deletes = []
            for tip in sorted(tips, key=_tip_key):
                cache = self._caches.get(tip)
                if cache is not None and not cache.is_empty():
                    caches.append((tip, cache.list_remote_log_segments(), cache.epoch_states()))
                delete = self._delete_states.get(tip)
                if delete is not None:
                    deletes.append(delete)
            return caches, deletes

    def cache_copy(self, tip: TopicIdPartition) -> RemoteLogMetadataCache | None:
        """An independent copy of a partition's cache, or None (tests, tools)."""
        with self._lock:
            cache = self._caches.get(tip)
            if cache is None:
                return None
            copy = RemoteLogMetadataCache()
            copy.restore(cache.segments.values(), cache.epoch_states())
            return copy

    def describe(self) -> Iterator[RemoteLogMetadata]:
        """Every live segment (by partition, then start offset) and delete state."""
        caches, deletes = self.export(self.partitions())
        for _, segments, _ in caches:
            yield from segments
        yield from deletes


def _tip_key(tip: TopicIdPartition) -> tuple[str, int, uuid.UUID]:
    return tip.topic, tip.partition, tip.topic_id
