"""strata.tiered.metadata.cache: Kafka's RemoteLogMetadataCache semantics per segment state,
leader epoch lineage, superseded copies, and the store of every partition's cache."""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from strata.tiered.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundException,
    TopicIdPartition,
    TopicPartition,
)
from strata.tiered.metadata.cache import (
    IllegalStateTransition,
    RemoteLogMetadataCache,
    RemotePartitionMetadataStore,
)

S = RemoteLogSegmentState
D = RemotePartitionDeleteState
TIP = TopicIdPartition(uuid.UUID(int=0xABCDEF), TopicPartition("orders", 3))
OTHER = TopicIdPartition(uuid.UUID(int=0x123456), TopicPartition("events", 0))


def segment(start: int, end: int, epochs: dict[int, int] | None = None, *, size: int = 100,
            tip: TopicIdPartition = TIP, state: S = S.COPY_SEGMENT_STARTED,
            uid: int | None = None) -> RemoteLogSegmentMetadata:
    segment_id = RemoteLogSegmentId(tip, uuid.UUID(int=uid)) if uid else RemoteLogSegmentId.generate_new(tip)
    return RemoteLogSegmentMetadata(segment_id, start, end, 1_000 + end, 0,
                                    1_000, size, state=state,
                                    segment_leader_epochs=epochs or {0: start})


def update(metadata: RemoteLogSegmentMetadata, state: S, custom: bytes | None = None) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(metadata.remote_log_segment_id, 2_000, custom, state, 1)


def finished(cache: RemoteLogMetadataCache, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    cache.add_copy_in_progress_segment(metadata)
    cache.update_remote_log_segment_metadata(update(metadata, S.COPY_SEGMENT_FINISHED))
    return cache.segment(metadata.remote_log_segment_id)


def ids(segments) -> list[uuid.UUID]:
    return [m.remote_log_segment_id.id for m in segments]


@pytest.fixture
def cache() -> RemoteLogMetadataCache:
    return RemoteLogMetadataCache()


# --------------------------------------------------------------------------- visibility by state


def test_a_started_segment_is_listed_but_not_readable_and_sets_no_highest_offset(cache):
    s = segment(0, 99)
    cache.add_copy_in_progress_segment(s)
    assert cache.remote_log_segment_metadata(0, 50) is None
    assert cache.highest_offset_for_epoch(0) is None
    assert cache.list_remote_log_segments() == [s]
    assert cache.list_remote_log_segments(0) == [s]
    assert cache.remote_log_size(0) == 100


def test_a_finished_segment_is_readable_with_the_updates_custom_metadata(cache):
    s = segment(100, 199)
    cache.add_copy_in_progress_segment(s)
    cache.update_remote_log_segment_metadata(update(s, S.COPY_SEGMENT_FINISHED, b"rsm"))
    found = cache.remote_log_segment_metadata(0, 150)
    assert found.state is S.COPY_SEGMENT_FINISHED
    assert found.custom_metadata == b"rsm" and found.broker_id == 1 and found.event_timestamp_ms == 2_000
    assert (found.start_offset, found.end_offset) == (100, 199)
    assert cache.remote_log_segment_metadata(0, 100) == found
    assert cache.remote_log_segment_metadata(0, 199) == found
    assert cache.remote_log_segment_metadata(0, 99) is None
    assert cache.remote_log_segment_metadata(0, 200) is None
    assert cache.remote_log_segment_metadata(1, 150) is None
    assert cache.highest_offset_for_epoch(0) == 199


def test_a_read_needs_the_epoch_the_offset_was_written_in(cache):
    s = finished(cache, segment(0, 99, {0: 0, 2: 40, 3: 70}))
    assert cache.remote_log_segment_metadata(0, 39) == s
    assert cache.remote_log_segment_metadata(0, 40) is None  # epoch 2 wrote offset 40
    assert cache.remote_log_segment_metadata(2, 40) == s
    assert cache.remote_log_segment_metadata(2, 69) == s
    assert cache.remote_log_segment_metadata(2, 39) is None
    assert cache.remote_log_segment_metadata(2, 70) is None
    assert cache.remote_log_segment_metadata(3, 99) == s
    assert cache.remote_log_segment_metadata(1, 50) is None
    assert [cache.highest_offset_for_epoch(e) for e in range(5)] == [39, None, 69, 99, None]


def test_reads_pick_the_segment_holding_the_offset_among_several(cache):
    a = finished(cache, segment(0, 49))
    b = finished(cache, segment(50, 99, {0: 50, 1: 80}))
    c = finished(cache, segment(100, 149, {1: 100}))
    assert [cache.remote_log_segment_metadata(0, o) for o in (0, 49, 50, 79)] == [a, a, b, b]
    assert cache.remote_log_segment_metadata(0, 80) is None
    assert [cache.remote_log_segment_metadata(1, o) for o in (80, 99, 100, 149)] == [b, b, c, c]
    assert cache.remote_log_segment_metadata(1, 150) is None
    assert cache.highest_offset_for_epoch(0) == 79
    assert cache.highest_offset_for_epoch(1) == 149


def test_delete_started_hides_a_segment_from_reads_but_keeps_it_listed(cache):
    a = finished(cache, segment(0, 49))
    b = finished(cache, segment(50, 99))
    cache.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_STARTED))
    assert cache.remote_log_segment_metadata(0, 10) is None
    assert cache.remote_log_segment_metadata(0, 60) == b
    listed = cache.list_remote_log_segments(0)
    assert ids(listed) == ids([a, b])
    assert listed[0].state is S.DELETE_SEGMENT_STARTED
    assert cache.remote_log_size(0) == 200


def test_delete_finished_removes_the_segment_but_not_the_epochs_highest_offset(cache):
    a = finished(cache, segment(0, 49))
    cache.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_STARTED))
    cache.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_FINISHED))
    assert cache.segment(a.remote_log_segment_id) is None
    assert cache.list_remote_log_segments() == []
    assert cache.list_remote_log_segments(0) == []
    assert cache.remote_log_size(0) == 0
    assert len(cache) == 0
    # As in Kafka: the copier must not upload deleted data again.
    assert cache.highest_offset_for_epoch(0) == 49


def test_a_failed_copy_can_be_deleted_without_ever_being_readable(cache):
    s = segment(0, 49)
    cache.add_copy_in_progress_segment(s)
    cache.update_remote_log_segment_metadata(update(s, S.DELETE_SEGMENT_STARTED))
    assert cache.list_remote_log_segments()[0].state is S.DELETE_SEGMENT_STARTED
    cache.update_remote_log_segment_metadata(update(s, S.DELETE_SEGMENT_FINISHED))
    assert cache == RemoteLogMetadataCache()
    assert cache.epochs == {}


def test_listings_are_sorted_by_start_offset_and_filtered_by_epoch(cache):
    c = segment(200, 299, {2: 200})
    a = segment(0, 99, {0: 0, 1: 60})
    b = segment(100, 199, {1: 100, 2: 150})
    for s in (c, a, b):
        cache.add_copy_in_progress_segment(s)
    cache.update_remote_log_segment_metadata(update(b, S.COPY_SEGMENT_FINISHED))
    assert ids(cache.list_remote_log_segments()) == ids([a, b, c])
    assert ids(cache.list_remote_log_segments(0)) == ids([a])
    assert ids(cache.list_remote_log_segments(1)) == ids([a, b])
    assert ids(cache.list_remote_log_segments(2)) == ids([b, c])
    assert cache.list_remote_log_segments(7) == []
    assert cache.remote_log_size(1) == 200
    assert cache.remote_log_size(7) == 0


# --------------------------------------------------------------------------- copies of the same range


def test_a_new_leaders_copy_of_a_larger_range_supersedes_the_earlier_copy(cache):
    # Kafka's case 1: L0 uploaded 0-100, L1 then uploads 0-200 in the same epoch.
    s0 = finished(cache, segment(0, 100))
    s1 = finished(cache, segment(0, 200))
    assert cache.remote_log_segment_metadata(0, 50) == s1
    assert cache.highest_offset_for_epoch(0) == 200
    # The superseded copy stays listed so retention can delete it.
    assert set(ids(cache.list_remote_log_segments(0))) == set(ids([s0, s1]))
    cache.update_remote_log_segment_metadata(update(s0, S.DELETE_SEGMENT_STARTED))
    assert cache.remote_log_segment_metadata(0, 50) == s1


def test_overlapping_copies_serve_the_later_one(cache):
    # Kafka's case 2: L0 uploaded 10-90; L1 uploads 5-100 then 101-200.
    finished(cache, segment(10, 90, {0: 10}))
    s1 = finished(cache, segment(5, 100, {0: 5}))
    s2 = finished(cache, segment(101, 200, {0: 101}))
    assert cache.remote_log_segment_metadata(0, 95) == s1
    assert cache.remote_log_segment_metadata(0, 50) == s1
    assert cache.remote_log_segment_metadata(0, 150) == s2
    assert len(cache.list_remote_log_segments(0)) == 3


def test_finishing_an_earlier_segment_late_does_not_hide_later_ones(cache):
    a = segment(0, 49)
    cache.add_copy_in_progress_segment(a)
    b = finished(cache, segment(50, 99))
    cache.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED))
    assert cache.remote_log_segment_metadata(0, 10).remote_log_segment_id == a.remote_log_segment_id
    assert cache.remote_log_segment_metadata(0, 60) == b


# --------------------------------------------------------------------------- invalid events


def test_an_update_of_an_unknown_segment_raises_not_found(cache):
    with pytest.raises(RemoteResourceNotFoundException):
        cache.update_remote_log_segment_metadata(update(segment(0, 9), S.COPY_SEGMENT_FINISHED))


def test_a_new_segment_must_be_in_copy_segment_started(cache):
    with pytest.raises(ValueError):
        cache.add_copy_in_progress_segment(segment(0, 9, state=S.COPY_SEGMENT_FINISHED))
    assert cache == RemoteLogMetadataCache()


def test_an_update_can_not_go_back_to_copy_segment_started(cache):
    s = segment(0, 9)
    cache.add_copy_in_progress_segment(s)
    with pytest.raises(ValueError):
        cache.update_remote_log_segment_metadata(update(s, S.COPY_SEGMENT_STARTED))


@pytest.mark.parametrize("path, bad", [
    ([], S.DELETE_SEGMENT_FINISHED),
    ([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED], S.COPY_SEGMENT_FINISHED),
    ([S.DELETE_SEGMENT_STARTED], S.COPY_SEGMENT_FINISHED),
    ([S.COPY_SEGMENT_FINISHED], S.DELETE_SEGMENT_FINISHED),
])
def test_invalid_transitions_raise_and_change_nothing(cache, path, bad):
    s = segment(0, 9)
    cache.add_copy_in_progress_segment(s)
    for state in path:
        cache.update_remote_log_segment_metadata(update(s, state))
    before = RemoteLogMetadataCache()
    before.restore(cache.segments.values(), cache.epoch_states())
    with pytest.raises(IllegalStateTransition):
        cache.update_remote_log_segment_metadata(update(s, bad))
    assert cache == before
    assert isinstance(IllegalStateTransition("x"), ValueError)


def test_repeating_a_state_is_idempotent(cache):
    s = segment(0, 9)
    cache.add_copy_in_progress_segment(s)
    cache.add_copy_in_progress_segment(s)  # a retried publish
    f = finished(cache, segment(10, 19))
    cache.update_remote_log_segment_metadata(update(s, S.COPY_SEGMENT_FINISHED))
    snapshot = cache.epoch_states()
    cache.update_remote_log_segment_metadata(update(s, S.COPY_SEGMENT_FINISHED))
    assert cache.epoch_states() == snapshot
    assert cache.remote_log_segment_metadata(0, 15) == f
    with pytest.raises(IllegalStateTransition):
        cache.add_copy_in_progress_segment(s)  # no restarting a finished copy


def test_adding_a_copying_segment_again_replaces_its_epochs(cache):
    s = segment(0, 99, {0: 0, 1: 50})
    cache.add_copy_in_progress_segment(s)
    again = RemoteLogSegmentMetadata(s.remote_log_segment_id, 0, 99, 5, 0, 6, 100,
                                     segment_leader_epochs={1: 0})
    cache.add_copy_in_progress_segment(again)
    assert cache.list_remote_log_segments(0) == []
    assert cache.list_remote_log_segments(1) == [again]
    cache.update_remote_log_segment_metadata(update(s, S.DELETE_SEGMENT_STARTED))
    cache.update_remote_log_segment_metadata(update(s, S.DELETE_SEGMENT_FINISHED))
    assert cache.is_empty()


# --------------------------------------------------------------------------- the store


def test_the_store_keeps_a_cache_per_partition():
    store = RemotePartitionMetadataStore()
    a, b = segment(0, 9), segment(0, 19, tip=OTHER)
    store.handle(a)
    store.handle(b)
    store.handle(update(b, S.COPY_SEGMENT_FINISHED))
    assert store.list_remote_log_segments(TIP) == [a]
    assert store.remote_log_segment_metadata(TIP, 0, 5) is None
    assert store.remote_log_segment_metadata(OTHER, 0, 5).end_offset == 19
    assert store.highest_offset_for_epoch(OTHER, 0) == 19
    assert store.remote_log_size(TIP, 0) == 100
    assert set(store.partitions()) == {TIP, OTHER}
    unknown = TopicIdPartition(uuid.uuid4(), TopicPartition("x", 0))
    assert store.list_remote_log_segments(unknown) == []
    assert store.remote_log_segment_metadata(unknown, 0, 0) is None
    assert store.highest_offset_for_epoch(unknown, 0) is None
    assert store.remote_log_size(unknown, 0) == 0
    with pytest.raises(RemoteResourceNotFoundException):
        store.handle(update(segment(0, 1, tip=unknown), S.COPY_SEGMENT_FINISHED))


def test_partition_delete_states_end_with_the_partitions_state_dropped():
    store = RemotePartitionMetadataStore()
    s = segment(0, 9)
    store.handle(s)
    for state in (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED):
        store.handle(RemotePartitionDeleteMetadata(TIP, state, 5, 0))
        assert store.delete_state(TIP).state is state
        assert store.list_remote_log_segments(TIP) == [s]  # the remover still lists them
    store.handle(RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_FINISHED, 6, 0))
    assert store.delete_state(TIP) is None
    assert store.list_remote_log_segments(TIP) == []
    assert store.partitions() == []


def test_describe_yields_every_live_segment_then_the_delete_states():
    store = RemotePartitionMetadataStore()
    b, a = segment(10, 19), segment(0, 9)
    store.handle(b)
    store.handle(a)
    gone = segment(0, 5, tip=OTHER)
    store.handle(gone)
    marked = RemotePartitionDeleteMetadata(OTHER, D.DELETE_PARTITION_MARKED, 5, 0)
    store.handle(marked)
    assert list(store.describe()) == [gone, a, b, marked]


def test_readers_on_other_threads_see_whole_events():
    store = RemotePartitionMetadataStore()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                for m in store.list_remote_log_segments(TIP, 0):
                    assert m.state in (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED)
                found = store.remote_log_segment_metadata(TIP, 0, 5)
                assert found is None or found.state is S.COPY_SEGMENT_FINISHED
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        s = segment(i * 10, i * 10 + 9)
        store.handle(s)
        store.handle(update(s, S.COPY_SEGMENT_FINISHED))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert len(store.list_remote_log_segments(TIP)) == 300


# --------------------------------------------------------------------------- against a model

# A partition's offsets 0-149 in leader epochs 0 (0-24), 1 (25-59), 3 (60-109), 4 (110-).
EPOCH_STARTS = {0: 0, 1: 25, 3: 60, 4: 110}
SLOTS = [(0, 19), (20, 49), (50, 59), (60, 109), (110, 139), (140, 149)]


def slot_epochs(start: int, end: int) -> dict[int, int]:
    epochs = sorted(EPOCH_STARTS.items())
    found = {}
    for i, (epoch, first) in enumerate(epochs):
        last = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else 1 << 40
        if first <= end and last >= start:
            found[epoch] = max(first, start)
    return found


def epoch_end(m: RemoteLogSegmentMetadata, epoch: int) -> int:
    later = [o for e, o in m.segment_leader_epochs.items() if e > epoch]
    return later[0] - 1 if later else m.end_offset


class CacheMatchesModel(RuleBasedStateMachine):
    """Random segment life cycles (at most one live copy per offset range) against a model:
    readable = finished and holding the offset in its epoch; listed = not delete-finished;
    an epoch's highest offset = the most any finished copy of it ever reached."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = RemoteLogMetadataCache()
        self.live: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self.slot_of: dict[RemoteLogSegmentId, int] = {}
        self.highest: dict[int, int] = {}

    @rule(slot=st.integers(0, len(SLOTS) - 1), size=st.integers(1, 1000))
    def add(self, slot, size):
        if any(s == slot for i, s in self.slot_of.items() if i in self.live):
            return
        start, end = SLOTS[slot]
        m = segment(start, end, slot_epochs(start, end), size=size, uid=len(self.slot_of) + 1)
        self.cache.add_copy_in_progress_segment(m)
        self.live[m.remote_log_segment_id] = m
        self.slot_of[m.remote_log_segment_id] = slot

    @precondition(lambda self: self.slot_of)
    @rule(data=st.data(), state=st.sampled_from(list(S)))
    def move(self, data, state):
        segment_id = data.draw(st.sampled_from(list(self.slot_of)))
        current = self.live.get(segment_id)
        event = RemoteLogSegmentMetadataUpdate(segment_id, 7, None, state, 2)
        if current is None:
            with pytest.raises(RemoteResourceNotFoundException):
                self.cache.update_remote_log_segment_metadata(event)
        elif state is S.COPY_SEGMENT_STARTED or not S.is_valid_transition(current.state, state):
            with pytest.raises(ValueError):
                self.cache.update_remote_log_segment_metadata(event)
        else:
            self.cache.update_remote_log_segment_metadata(event)
            if state is S.DELETE_SEGMENT_FINISHED:
                del self.live[segment_id]
            else:
                self.live[segment_id] = current.create_with_updates(event)
            if state is S.COPY_SEGMENT_FINISHED:
                for epoch in current.segment_leader_epochs:
                    self.highest[epoch] = max(self.highest.get(epoch, -1), epoch_end(current, epoch))

    @invariant()
    def reads_match(self):
        finished_ = [m for m in self.live.values() if m.state is S.COPY_SEGMENT_FINISHED]
        for epoch in (0, 1, 2, 3, 4):
            for offset in range(0, 151, 3):
                expected = [m for m in finished_ if epoch in m.segment_leader_epochs
                            and m.segment_leader_epochs[epoch] <= offset <= epoch_end(m, epoch)]
                assert self.cache.remote_log_segment_metadata(epoch, offset) == (expected[0] if expected else None)
            assert self.cache.highest_offset_for_epoch(epoch) == self.highest.get(epoch)
            in_epoch = sorted((m for m in self.live.values() if epoch in m.segment_leader_epochs),
                              key=lambda m: m.start_offset)
            assert self.cache.list_remote_log_segments(epoch) == in_epoch
            assert self.cache.remote_log_size(epoch) == sum(m.segment_size_in_bytes for m in in_epoch)
        assert self.cache.list_remote_log_segments() == sorted(self.live.values(), key=lambda m: m.start_offset)

    @invariant()
    def restores_equal(self):
        copy = RemoteLogMetadataCache()
        copy.restore(self.cache.segments.values(), self.cache.epoch_states())
        assert copy == self.cache


CacheMatchesModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCacheMatchesModel = CacheMatchesModel.TestCase
