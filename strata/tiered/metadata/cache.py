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

A cache restored from a snapshot starts *lazy* (``RemoteLogMetadataCache.from_columns``): it
holds its partition's state as ``SegmentColumns`` (arrays, no Python object per segment) and
answers ``remote_log_segment_metadata`` and ``highest_offset_for_epoch`` from them, building
only the segment it returns. Anything else (a change, a listing, ``segments``/``epochs``) first
materialises it once into the dicts of RemoteLogSegmentMetadata and RemoteLogLeaderEpochState
every other cache has; the answers are the same either way (the memory and time of each form:
docs/benchmarks.md, "Remote log metadata at scale").
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import itertools
import operator
import struct
import sys
import threading
import types
import uuid
from array import array
from collections.abc import Iterable, Iterator, Sequence
from types import MappingProxyType
from typing import Any

from strata.tiered.api import (
    CustomMetadata,
    FencedLeaderEpochException,
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
    "EpochColumns",
    "SegmentColumns",
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

    @classmethod
    def _restored(cls, offset_to_id: dict[int, RemoteLogSegmentId], unreferenced: set[RemoteLogSegmentId],
                  highest_offset: int | None, starts: list[int]) -> RemoteLogLeaderEpochState:
        """A state that takes the given containers as they are (``starts``: the sorted keys)."""
        state = cls.__new__(cls)
        state.offset_to_id = offset_to_id
        state.unreferenced = unreferenced
        state.highest_offset = highest_offset
        state._starts = starts
        return state

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


# --------------------------------------------------------------------------- columnar form

if array("i").itemsize != 4 or array("I").itemsize != 4 or array("q").itemsize != 8:
    raise ImportError("this platform's array item sizes do not fit the snapshot columns")

_STATE_BY_ID = tuple(_S.for_id(i) for i in range(len(_S)))
_VALID_STATE_IDS = bytes(range(len(_S)))
_BOOL = (False, True)
_LITTLE = sys.byteorder == "little"
_UUID_HALVES = struct.Struct(">QQ")
_new = object.__new__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown

# Segments are built without their constructors' checks (SegmentColumns validated the values
# at load), setting the slots directly: only while the value types are slotted classes with
# exactly the fields set here (else the constructors are used).
_SEGMENT_FIELDS = ("remote_log_segment_id", "start_offset", "end_offset", "max_timestamp_ms",
                   "broker_id", "event_timestamp_ms", "segment_size_in_bytes", "custom_metadata",
                   "state", "segment_leader_epochs", "txn_idx_empty", "leader_epoch")


def _slot_setters(cls: type, names: Sequence[str]) -> tuple[Any, ...] | None:
    found = [cls.__dict__.get(name) for name in names]
    if not all(isinstance(d, types.MemberDescriptorType) for d in found):
        return None
    return tuple(d.__set__ for d in found)


_SEGMENT_SETTERS = _slot_setters(RemoteLogSegmentMetadata, _SEGMENT_FIELDS)
_ID_SETTERS = _slot_setters(RemoteLogSegmentId, ("topic_id_partition", "id"))
_UUID_SETTERS = _slot_setters(uuid.UUID, ("int", "is_safe"))
_FAST_BUILD = (tuple(f.name for f in dataclasses.fields(RemoteLogSegmentMetadata)) == _SEGMENT_FIELDS
               and tuple(f.name for f in dataclasses.fields(RemoteLogSegmentId))
               == ("topic_id_partition", "id")
               and None not in (_SEGMENT_SETTERS, _ID_SETTERS, _UUID_SETTERS))
if _FAST_BUILD:
    (_set_id, _set_start, _set_end, _set_max_ts, _set_broker, _set_event_ts, _set_size,
     _set_custom, _set_state, _set_epochs, _set_txn, _set_leader_epoch) = _SEGMENT_SETTERS  # type: ignore[misc]
    _set_tip, _set_uuid = _ID_SETTERS  # type: ignore[misc]
    _set_int, _set_is_safe = _UUID_SETTERS  # type: ignore[misc]


def _uuid(value: int) -> uuid.UUID:
    if not _FAST_BUILD:
        return uuid.UUID(int=value)
    u = _new(uuid.UUID)
    _set_int(u, value)
    _set_is_safe(u, _SAFE_UNKNOWN)
    return u


def _segment_id(tip: TopicIdPartition, value: uuid.UUID) -> RemoteLogSegmentId:
    if not _FAST_BUILD:
        return RemoteLogSegmentId(tip, value)
    segment_id = _new(RemoteLogSegmentId)
    _set_tip(segment_id, tip)
    _set_uuid(segment_id, value)
    return segment_id


def _segment(segment_id: RemoteLogSegmentId, start: int, end: int, max_ts: int, broker: int,
             event_ts: int, size: int, custom: CustomMetadata | None, state: RemoteLogSegmentState,
             epochs: dict[int, int], txn: bool) -> RemoteLogSegmentMetadata:
    """RemoteLogSegmentMetadata from checked values (``epochs`` sorted by epoch); the
    writer's leader epoch is not kept per segment (-1)."""
    if not _FAST_BUILD:
        return RemoteLogSegmentMetadata(segment_id, start, end, max_ts, broker, event_ts, size,
                                        custom_metadata=custom, state=state,
                                        segment_leader_epochs=epochs, txn_idx_empty=txn)
    m = _new(RemoteLogSegmentMetadata)
    _set_id(m, segment_id)
    _set_start(m, start)
    _set_end(m, end)
    _set_max_ts(m, max_ts)
    _set_broker(m, broker)
    _set_event_ts(m, event_ts)
    _set_size(m, size)
    _set_custom(m, custom)
    _set_state(m, state)
    _set_epochs(m, MappingProxyType(epochs))
    _set_txn(m, txn)
    _set_leader_epoch(m, -1)
    return m


_NO_EXTRAS = range(0)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while building many objects at once: they are all kept,
    and with a million segments' objects alive the collections it would trigger cost more
    than the building (Python 3.11). Process-wide, for the few ms to a second this takes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _increasing(values: Sequence[int]) -> bool:
    return all(map(operator.lt, values, itertools.islice(values, 1, None)))


@dataclasses.dataclass(frozen=True, eq=False)
class EpochColumns:
    """One RemoteLogLeaderEpochState in columns: ``starts`` (increasing) are the epoch's first
    offsets of its finished segments, ``segments`` their indexes in the SegmentColumns;
    ``unreferenced`` the indexes of its other segments; ``highest_offset`` as the state's."""

    epoch: int
    highest_offset: int | None
    starts: array          # int64
    segments: array        # uint32, one per start
    unreferenced: array    # uint32


class SegmentColumns:
    """A partition's cache state as columns: per segment i (listing order: by start offset)
    ``ids[16i:16i+16]`` its uuid, ``start[i]``, ``end[i]``, ``max_ts[i]``, ``event_ts[i]``,
    ``broker[i]``, ``size[i]``, ``state[i]`` (the state's id), ``txn[i]`` (0/1); its first
    leader epoch and that epoch's first offset in ``first_epoch[i]``/``first_offset[i]``, and
    any further epochs in ``extra_segment``/``extra_epoch``/``extra_offset`` (by segment, then
    epoch); custom metadata as ``custom_lengths`` (-1: none) into ``custom_blob``, both None
    when no segment has any; and the epoch states (EpochColumns, by epoch).

    The snapshot format (``topic_based``) stores exactly these columns. The values never
    change once built (only two memos do), so a lazy cache and its copies share one. ``validate`` checks what the value types'
    constructors and ``RemoteLogMetadataCache.restore`` would, so that building segments
    from validated columns can skip the constructors.
    """

    __slots__ = ("tip", "ids", "start", "end", "max_ts", "event_ts", "broker", "size", "state",
                 "txn", "first_epoch", "first_offset", "extra_segment", "extra_epoch",
                 "extra_offset", "custom_lengths", "custom_blob", "epoch_states", "_by_epoch",
                 "_custom_starts", "_last")

    def __init__(self, tip: TopicIdPartition, ids: bytes, start: array, end: array, max_ts: array,
                 event_ts: array, broker: array, size: array, state: bytes, txn: bytes,
                 first_epoch: array, first_offset: array, extra_segment: array, extra_epoch: array,
                 extra_offset: array, custom_lengths: array | None, custom_blob: bytes | None,
                 epoch_states: Sequence[EpochColumns]) -> None:
        self.tip = tip
        self.ids = ids
        self.start = start
        self.end = end
        self.max_ts = max_ts
        self.event_ts = event_ts
        self.broker = broker
        self.size = size
        self.state = state
        self.txn = txn
        self.first_epoch = first_epoch
        self.first_offset = first_offset
        self.extra_segment = extra_segment
        self.extra_epoch = extra_epoch
        self.extra_offset = extra_offset
        self.custom_lengths = custom_lengths
        self.custom_blob = custom_blob
        self.epoch_states = tuple(epoch_states)
        self._by_epoch = {s.epoch: s for s in self.epoch_states}
        self._custom_starts: list[int] | None = None
        self._last: tuple[int, RemoteLogSegmentMetadata] | None = None

    def __len__(self) -> int:
        return len(self.start)

    def __repr__(self) -> str:
        return f"SegmentColumns({self.tip}, {len(self)} segments, {len(self.epoch_states)} epochs)"

    # ---- building -------------------------------------------------------------------------

    @classmethod
    def build(cls, tip: TopicIdPartition, segments: Sequence[RemoteLogSegmentMetadata],
              epochs: Iterable[tuple[int, RemoteLogLeaderEpochState]]) -> SegmentColumns:
        """Columns of a cache's ``segments`` (in listing order) and epoch states; ValueError
        if a state names a segment that is not there."""
        index: dict[RemoteLogSegmentId, int] = {}
        ids = bytearray()
        start, end, max_ts, event_ts = array("q"), array("q"), array("q"), array("q")
        broker, size = array("i"), array("i")
        state, txn = bytearray(), bytearray()
        first_epoch, first_offset = array("i"), array("q")
        extra_segment, extra_epoch, extra_offset = array("I"), array("i"), array("q")
        custom_lengths = array("i")
        blob = bytearray()
        for i, m in enumerate(segments):
            segment_id = m.remote_log_segment_id
            index[segment_id] = i
            ids += segment_id.id.bytes
            start.append(m.start_offset)
            end.append(m.end_offset)
            max_ts.append(m.max_timestamp_ms)
            event_ts.append(m.event_timestamp_ms)
            broker.append(m.broker_id)
            size.append(m.segment_size_in_bytes)
            state.append(m.state.id)
            txn.append(1 if m.txn_idx_empty else 0)
            entries = iter(m.segment_leader_epochs.items())
            epoch, offset = next(entries)
            first_epoch.append(epoch)
            first_offset.append(offset)
            for epoch, offset in entries:
                extra_segment.append(i)
                extra_epoch.append(epoch)
                extra_offset.append(offset)
            if m.custom_metadata is None:
                custom_lengths.append(-1)
            else:
                custom_lengths.append(len(m.custom_metadata))
                blob += m.custom_metadata
        states = []
        for epoch, st in epochs:
            try:
                starts = sorted(st.offset_to_id)
                refs = [index[st.offset_to_id[s]] for s in starts]
                unreferenced = sorted(index[i] for i in st.unreferenced)
            except KeyError as exc:
                raise ValueError(f"epoch state refers to an unknown segment {exc}") from None
            states.append(EpochColumns(epoch, st.highest_offset, array("q", starts),
                                       array("I", refs), array("I", unreferenced)))
        any_custom = any(n >= 0 for n in custom_lengths)
        return cls(tip, bytes(ids), start, end, max_ts, event_ts, broker, size, bytes(state),
                   bytes(txn), first_epoch, first_offset, extra_segment, extra_epoch, extra_offset,
                   custom_lengths if any_custom else None, bytes(blob) if any_custom else None,
                   sorted(states, key=lambda s: s.epoch))

    def validate(self) -> None:
        """ValueError unless every column holds what the value types and a cache accept."""
        n = len(self.start)
        if len(self.ids) != 16 * n or any(len(c) != n for c in (
                self.end, self.max_ts, self.event_ts, self.broker, self.size, self.state,
                self.txn, self.first_epoch, self.first_offset)):
            raise ValueError("columns of different lengths")
        if n and min(self.start) < 0:
            raise ValueError("a negative start offset")
        if any(map(operator.gt, self.start, self.end)):
            raise ValueError("an end offset below its start offset")
        if self.state.translate(None, _VALID_STATE_IDS):
            raise ValueError("an unknown segment state id")
        if self.txn.translate(None, b"\x00\x01"):
            raise ValueError("a transaction index flag other than 0 or 1")
        x = len(self.extra_segment)
        if len(self.extra_epoch) != x or len(self.extra_offset) != x:
            raise ValueError("extra epoch columns of different lengths")
        previous_segment, previous_epoch = -1, 0
        for i, epoch in zip(self.extra_segment, self.extra_epoch):
            if i >= n or i < previous_segment:
                raise ValueError("extra epochs out of order or of an unknown segment")
            floor = self.first_epoch[i] if i != previous_segment else previous_epoch
            if epoch <= floor:
                raise ValueError("a segment's leader epochs are not increasing")
            previous_segment, previous_epoch = i, epoch
        if self.custom_lengths is not None:
            if len(self.custom_lengths) != n or (n and min(self.custom_lengths) < -1) \
                    or sum(v for v in self.custom_lengths if v > 0) != len(self.custom_blob or b""):
                raise ValueError("custom metadata lengths do not fit")
        previous = None
        for st in self.epoch_states:
            if previous is not None and st.epoch <= previous:
                raise ValueError("epoch states out of order")
            previous = st.epoch
            if len(st.starts) != len(st.segments) or not _increasing(st.starts):
                raise ValueError(f"epoch {st.epoch}: starts not increasing or not one per segment")
            for refs in (st.segments, st.unreferenced):
                if refs and max(refs) >= n:
                    raise ValueError(f"epoch {st.epoch} refers to an unknown segment")
            if st.highest_offset is not None and st.highest_offset < 0:
                raise ValueError(f"epoch {st.epoch}: a negative highest offset")

    # ---- reads without materialising -----------------------------------------------------

    def is_empty(self) -> bool:
        return not len(self.start) and not self.epoch_states

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        st = self._by_epoch.get(leader_epoch)
        return st.highest_offset if st is not None else None

    def remote_log_segment_metadata(self, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """RemoteLogMetadataCache.remote_log_segment_metadata on the columns."""
        st = self._by_epoch.get(leader_epoch)
        if st is None:
            return None
        i = bisect.bisect_right(st.starts, offset)
        if not i:
            return None
        k = st.segments[i - 1]
        extras = self._extra_range(k)
        # _epoch_end_offset: the next epoch's first offset - 1, or the segment's end
        if self.first_epoch[k] > leader_epoch:
            end = self.first_offset[k] - 1
        else:
            end = self.end[k]
            for j in extras:
                if self.extra_epoch[j] > leader_epoch:
                    end = self.extra_offset[j] - 1
                    break
        if offset > end:
            return None
        return self._segment_at(k, extras)

    def _extra_range(self, k: int) -> range:
        """Where segment ``k``'s further epochs are in the extra columns."""
        xs = self.extra_segment
        if not xs:
            return _NO_EXTRAS
        lo = bisect.bisect_left(xs, k)
        return range(lo, bisect.bisect_right(xs, k, lo))

    def _custom(self, k: int) -> CustomMetadata | None:
        lengths = self.custom_lengths
        if lengths is None or lengths[k] < 0:
            return None
        if self._custom_starts is None:
            self._custom_starts = [0, *itertools.accumulate(max(v, 0) for v in lengths)]
        at = self._custom_starts[k]
        return CustomMetadata((self.custom_blob or b"")[at:at + lengths[k]])

    def segment_at(self, k: int) -> RemoteLogSegmentMetadata:
        """The RemoteLogSegmentMetadata of segment ``k``."""
        return self._segment_at(k, self._extra_range(k))

    def _segment_at(self, k: int, extras: range) -> RemoteLogSegmentMetadata:
        last = self._last  # a reader going through a segment asks for it again and again
        if last is not None and last[0] == k:
            return last[1]
        hi, lo = _UUID_HALVES.unpack_from(self.ids, 16 * k)
        epochs = {self.first_epoch[k]: self.first_offset[k]}
        for j in extras:
            epochs[self.extra_epoch[j]] = self.extra_offset[j]
        m = _segment(_segment_id(self.tip, _uuid(hi << 64 | lo)), self.start[k], self.end[k],
                     self.max_ts[k], self.broker[k], self.event_ts[k], self.size[k], self._custom(k),
                     _STATE_BY_ID[self.state[k]], epochs, _BOOL[self.txn[k]])
        self._last = (k, m)
        return m

    # ---- materialising --------------------------------------------------------------------

    def segments(self) -> list[RemoteLogSegmentMetadata]:
        """Every segment, in column order."""
        with _gc_paused():
            return self._segments()

    def _segments(self) -> list[RemoteLogSegmentMetadata]:
        tip = self.tip
        ids = [_segment_id(tip, _uuid(hi << 64 | lo)) for hi, lo in _UUID_HALVES.iter_unpack(self.ids)]
        epochs = [{e: o} for e, o in zip(self.first_epoch, self.first_offset)]
        for k, e, o in zip(self.extra_segment, self.extra_epoch, self.extra_offset):
            epochs[k][e] = o
        if self.custom_lengths is None:
            custom: Iterable[CustomMetadata | None] = itertools.repeat(None)
        else:
            custom = [self._custom(k) for k in range(len(self))]
        return list(map(_segment, ids, self.start, self.end, self.max_ts, self.broker,
                        self.event_ts, self.size, custom, map(_STATE_BY_ID.__getitem__, self.state),
                        epochs, map(_BOOL.__getitem__, self.txn)))

    def restored(self) -> tuple[list[RemoteLogSegmentMetadata], list[tuple[int, RemoteLogLeaderEpochState]]]:
        """Every segment (column order) and epoch state (by epoch), as objects."""
        with _gc_paused():
            return self._restored()

    def _restored(self) -> tuple[list[RemoteLogSegmentMetadata], list[tuple[int, RemoteLogLeaderEpochState]]]:
        listed = self._segments()
        ids = [m.remote_log_segment_id for m in listed]
        epochs = []
        for st in self.epoch_states:
            starts = st.starts.tolist()
            epochs.append((st.epoch, RemoteLogLeaderEpochState._restored(
                dict(zip(starts, map(ids.__getitem__, st.segments))),
                set(map(ids.__getitem__, st.unreferenced)), st.highest_offset, starts)))
        return listed, epochs

    def materialise(self) -> tuple[dict[RemoteLogSegmentId, RemoteLogSegmentMetadata],
                                   dict[int, RemoteLogLeaderEpochState]]:
        """The ``segments`` and ``epochs`` dicts of the equivalent RemoteLogMetadataCache."""
        with _gc_paused():
            listed, epochs = self._restored()
            return {m.remote_log_segment_id: m for m in listed}, dict(epochs)


def columns_from_bytes(typecode: str, data: bytes | memoryview) -> array:
    """An array of big-endian ``data`` (the snapshot's byte order)."""
    values = array(typecode)
    values.frombytes(data)
    if _LITTLE and values.itemsize > 1:
        values.byteswap()
    return values


def columns_to_bytes(values: array) -> bytes:
    """The big-endian bytes of ``values``."""
    if _LITTLE and values.itemsize > 1:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


class RemoteLogMetadataCache:
    """The remote segments of one user partition (Kafka's ``RemoteLogMetadataCache``).

    Holds every segment that has not reached DELETE_SEGMENT_FINISHED, by id, and a
    RemoteLogLeaderEpochState per leader epoch the segments contain (epochs whose state
    becomes empty are dropped). Listings are sorted by start offset. Two caches compare
    equal when segments and epoch states are equal. Not thread-safe: the
    RemotePartitionMetadataStore's lock guards it (``materialise`` alone may also be called
    without it: it has a lock of its own).

    ``from_columns`` makes a lazy cache (see the module docstring): ``segments`` and
    ``epochs`` materialise it on first use.
    """

    def __init__(self) -> None:
        self._segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self._epochs: dict[int, RemoteLogLeaderEpochState] = {}
        self._columns: SegmentColumns | None = None
        self._materialise_lock: threading.Lock | None = None

    @classmethod
    def from_columns(cls, columns: SegmentColumns) -> RemoteLogMetadataCache:
        """A lazy cache holding ``columns`` (validated: ``SegmentColumns.validate``)."""
        cache = cls()
        cache._columns = columns
        cache._materialise_lock = threading.Lock()
        return cache

    @property
    def segments(self) -> dict[RemoteLogSegmentId, RemoteLogSegmentMetadata]:
        if self._columns is not None:
            self.materialise()
        return self._segments

    @segments.setter
    def segments(self, value: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata]) -> None:
        self.materialise()
        self._segments = value

    @property
    def epochs(self) -> dict[int, RemoteLogLeaderEpochState]:
        if self._columns is not None:
            self.materialise()
        return self._epochs

    @epochs.setter
    def epochs(self, value: dict[int, RemoteLogLeaderEpochState]) -> None:
        self.materialise()
        self._epochs = value

    def is_lazy(self) -> bool:
        """Still only columns (restored from a snapshot and used for lookups only)."""
        return self._columns is not None

    def materialise(self) -> None:
        """Build the segment and epoch dicts from the columns, once (any thread)."""
        lock = self._materialise_lock
        if self._columns is None or lock is None:
            return
        with lock:
            columns = self._columns
            if columns is None:
                return
            self._segments, self._epochs = columns.materialise()
            self._columns = None

    def columns(self, tip: TopicIdPartition) -> SegmentColumns:
        """This cache as columns of ``tip`` (snapshots); a lazy cache's own, else built."""
        columns = self._columns
        if columns is not None and columns.tip == tip:
            return columns
        return SegmentColumns.build(tip, self.list_remote_log_segments(),
                                    sorted(self.epochs.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemoteLogMetadataCache):
            return NotImplemented
        return self.segments == other.segments and self.epochs == other.epochs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        columns = self._columns
        if columns is not None:
            return (f"RemoteLogMetadataCache({len(columns)} segments, epochs "
                    f"{[s.epoch for s in columns.epoch_states]}, not materialised)")
        return f"RemoteLogMetadataCache({len(self.segments)} segments, epochs {sorted(self.epochs)})"

    def __len__(self) -> int:
        columns = self._columns
        return len(columns) if columns is not None else len(self._segments)

    def is_empty(self) -> bool:
        """No segments and no epoch state (not even a highest offset) left."""
        columns = self._columns
        if columns is not None:
            return columns.is_empty()
        return not self._segments and not self._epochs

    # ---- reads ----------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self.segments.get(segment_id)

    def remote_log_segment_metadata(self, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding ``offset`` within ``leader_epoch``, or None."""
        columns = self._columns
        if columns is not None:
            return columns.remote_log_segment_metadata(leader_epoch, offset)
        state = self._epochs.get(leader_epoch)
        segment_id = state.floor_segment(offset) if state is not None else None
        if segment_id is None:
            return None
        metadata = self._segments[segment_id]
        return metadata if offset <= _epoch_end_offset(metadata, leader_epoch) else None

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        columns = self._columns
        if columns is not None:
            return columns.highest_offset_for_epoch(leader_epoch)
        state = self._epochs.get(leader_epoch)
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
        self._columns = None
        self._segments = by_id
        self._epochs = states

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
    it. DELETE_PARTITION_FINISHED drops the partition's cache and delete state.

    Leader fencing (not in Kafka): the highest ``leader_epoch`` of the events applied is kept
    per partition, and an event with a lower one raises FencedLeaderEpochException and changes
    nothing, so every reader of the topic refuses what a deposed leader wrote after its
    successor's first event. An event without an epoch (-1: the controller's, Kafka's) is
    never refused. Thread-safe: one lock around every read and change;
    reads return lists and value objects, never live views. A lazy cache (restored from a
    snapshot) that a call needs whole is materialised before that lock is taken, so reads
    of other partitions go on meanwhile.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caches: dict[TopicIdPartition, RemoteLogMetadataCache] = {}
        self._delete_states: dict[TopicIdPartition, RemotePartitionDeleteMetadata] = {}
        self._fences: dict[TopicIdPartition, int] = {}

    # ---- changes --------------------------------------------------------------------------

    def _materialise(self, tip: TopicIdPartition) -> None:
        """Materialise ``tip``'s cache if it is lazy, outside the store's lock (the cache's own
        lock makes it happen once); a call that then finds another lazy cache there (a
        restore in between) materialises that one under the store's lock, as any access does."""
        with self._lock:
            cache = self._caches.get(tip)
        if cache is not None and cache.is_lazy():
            cache.materialise()

    def handle(self, metadata: RemoteLogMetadata) -> None:
        """Apply one event; raises as RemoteLogMetadataCache does for invalid ones, and
        FencedLeaderEpochException for a deposed leader's."""
        tip = metadata.topic_id_partition
        if isinstance(metadata, (RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate)):
            self._materialise(tip)
        with self._lock:
            fence = self._fences.get(tip, -1)
            if 0 <= metadata.leader_epoch < fence:
                raise FencedLeaderEpochException(
                    f"{metadata} was written at leader epoch {metadata.leader_epoch}, and "
                    f"{tip} has an event of epoch {fence}")
            self._apply(metadata)
            if isinstance(metadata, RemotePartitionDeleteMetadata) and \
                    metadata.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                self._fences.pop(tip, None)
            elif metadata.leader_epoch > fence:
                self._fences[tip] = metadata.leader_epoch

    def _apply(self, metadata: RemoteLogMetadata) -> None:
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

    def restore_fence(self, tip: TopicIdPartition, leader_epoch: int) -> None:
        with self._lock:
            self._fences[tip] = leader_epoch

    def fence(self, tip: TopicIdPartition) -> int:
        """The highest leader epoch of ``tip``'s applied events (-1: none)."""
        with self._lock:
            return self._fences.get(tip, -1)

    def fences(self) -> dict[TopicIdPartition, int]:
        """Every partition's fence (snapshots)."""
        with self._lock:
            return dict(self._fences)

    # ---- reads ----------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        self._materialise(segment_id.topic_id_partition)
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
        self._materialise(tip)
        with self._lock:
            cache = self._caches.get(tip)
            return cache.list_remote_log_segments(leader_epoch) if cache else []

    def remote_log_size(self, tip: TopicIdPartition, leader_epoch: int) -> int:
        self._materialise(tip)
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
        tips = list(tips)
        for tip in tips:
            self._materialise(tip)
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

    def export_columns(self, tips: Iterable[TopicIdPartition]) -> tuple[
            list[SegmentColumns], list[RemotePartitionDeleteMetadata]]:
        """``export`` as columns (snapshots): a lazy cache's own, without materialising it."""
        with self._lock:
            columns = []
            deletes = []
            for tip in sorted(tips, key=_tip_key):
                cache = self._caches.get(tip)
                if cache is not None and not cache.is_empty():
                    columns.append(cache.columns(tip))
                delete = self._delete_states.get(tip)
                if delete is not None:
                    deletes.append(delete)
            return columns, deletes

    def cache_copy(self, tip: TopicIdPartition) -> RemoteLogMetadataCache | None:
        """An independent copy of a partition's cache, or None (tests, tools). A lazy cache's
        copy is lazy too, sharing its (immutable) columns."""
        with self._lock:
            cache = self._caches.get(tip)
            if cache is None:
                return None
            columns = cache._columns
            if columns is not None:
                return RemoteLogMetadataCache.from_columns(columns)
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
