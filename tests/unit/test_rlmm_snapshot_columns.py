"""Version 2 remote log metadata snapshots: the columns (SegmentColumns), the lazy caches they
restore, and what a snapshot that fails validation does (the metadata partition is replayed)."""

from __future__ import annotations

import dataclasses
import pickle
import struct
import threading
import uuid
from pathlib import Path
from types import MappingProxyType

import crc32c
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from strata.tiered.api import (
    CustomMetadata,
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
from strata.tiered.metadata import cache as cache_module
from strata.tiered.metadata.cache import (
    EpochColumns,
    RemoteLogMetadataCache,
    RemotePartitionMetadataStore,
    SegmentColumns,
)
from strata.tiered.metadata.topic_based import (
    SNAPSHOT_VERSION,
    MetadataSnapshot,
    SnapshotError,
    TopicBasedRemoteLogMetadataManager,
    _encode_columns,
    _parse_snapshot,
    _read_snapshot,
    decode_snapshot,
    encode_snapshot,
    snapshot_path,
)
from strata.tiered.metadata.serde import serialize
from strata.tiered.metadata.topic_log import InMemoryMetadataTopicLog

S = RemoteLogSegmentState
D = RemotePartitionDeleteState
TIP = TopicIdPartition(uuid.UUID(int=0xABCDEF), TopicPartition("orders", 3))
OTHER = TopicIdPartition(uuid.UUID(int=0x123456), TopicPartition("events", 0))


def segment(start: int, end: int, epochs: dict[int, int] | None = None, *, tip: TopicIdPartition = TIP,
            uid: int | None = None, size: int = 100, txn: bool = False) -> RemoteLogSegmentMetadata:
    segment_id = RemoteLogSegmentId(tip, uuid.UUID(int=uid)) if uid else RemoteLogSegmentId.generate_new(tip)
    return RemoteLogSegmentMetadata(segment_id, start, end, 1_000 + end, 2, 1_500, size,
                                    segment_leader_epochs=epochs or {0: start}, txn_idx_empty=txn)


def update(m: RemoteLogSegmentMetadata, state: S, custom: bytes | None = None) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(m.remote_log_segment_id, 2_000, custom, state, 1)


def snapshot_bytes(store: RemotePartitionMetadataStore, tips=(TIP,)) -> bytes:
    columns, deletes = store.export_columns(tips)
    return _encode_columns(7, 99, 1234, columns, deletes)


def lazy_cache(store: RemotePartitionMetadataStore, tip: TopicIdPartition = TIP) -> RemoteLogMetadataCache:
    """The tip's cache after a round trip through a version 2 snapshot file."""
    loaded = dict(_read_snapshot(snapshot_bytes(store, (tip,))).caches)
    assert loaded[tip].is_lazy()
    return loaded[tip]


def mixed_store() -> tuple[RemotePartitionMetadataStore, list[RemoteLogSegmentMetadata]]:
    """Segments in every live state, with several epochs, custom metadata, a superseded copy."""
    store = RemotePartitionMetadataStore()
    made = [segment(0, 99, {0: 0, 2: 40, 5: 90}, uid=1, txn=True),
            segment(100, 199, {5: 100}, uid=2),
            segment(200, 299, {5: 200, 6: 250}, uid=3, size=1 << 30),
            segment(300, 399, {6: 300}, uid=4),
            segment(300, 449, {6: 300, 7: 420}, uid=5),   # a new leader's copy of more
            segment(450, 499, {7: 450}, uid=6),
            segment(500, 599, {7: 500}, uid=7)]
    for m in made:
        store.handle(m)
    for m, custom in zip(made[:6], [b"c1", None, b"", b"x" * 300, b"c5", None]):
        store.handle(update(m, S.COPY_SEGMENT_FINISHED, custom))
    store.handle(update(made[0], S.DELETE_SEGMENT_STARTED))
    store.handle(update(made[5], S.DELETE_SEGMENT_STARTED))
    store.handle(update(made[5], S.DELETE_SEGMENT_FINISHED))
    store.handle(RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 5, 1))
    return store, made


# --------------------------------------------------------------------------- columns and lazy caches


def test_segments_built_from_columns_are_the_constructors_values():
    store, _ = mixed_store()
    original = store.cache_copy(TIP)
    columns = SegmentColumns.build(TIP, original.list_remote_log_segments(), sorted(original.epochs.items()))
    columns.validate()
    rebuilt = columns.segments()
    assert rebuilt == original.list_remote_log_segments()
    assert [columns.segment_at(k) for k in range(len(columns))] == rebuilt
    for built, m in zip(rebuilt, original.list_remote_log_segments()):
        assert hash(built) == hash(m) and hash(built.remote_log_segment_id) == hash(m.remote_log_segment_id)
        assert type(built.segment_leader_epochs) is MappingProxyType
        assert list(built.segment_leader_epochs.items()) == list(m.segment_leader_epochs.items())
        assert type(built.state) is S and type(built.txn_idx_empty) is bool
        assert built.custom_metadata is None or type(built.custom_metadata) is CustomMetadata
        assert built.remote_log_segment_id.id.bytes == m.remote_log_segment_id.id.bytes
        assert str(built.remote_log_segment_id.id) == str(m.remote_log_segment_id.id)
        assert pickle.loads(pickle.dumps(built)) == m
    assert cache_module._FAST_BUILD  # else the constructors are used, which this also checks


def test_a_lazy_cache_answers_as_the_materialised_one_then_materialises_once():
    store, made = mixed_store()
    original = store.cache_copy(TIP)
    lazy = lazy_cache(store)
    for epoch in range(-1, 9):
        assert lazy.highest_offset_for_epoch(epoch) == original.highest_offset_for_epoch(epoch)
        for offset in range(-1, 602):
            assert lazy.remote_log_segment_metadata(epoch, offset) == \
                original.remote_log_segment_metadata(epoch, offset)
    assert lazy.is_lazy() and len(lazy) == len(original) and not lazy.is_empty()
    assert "not materialised" in repr(lazy)
    assert lazy.list_remote_log_segments(6) == original.list_remote_log_segments(6)
    assert not lazy.is_lazy()
    assert lazy == original
    # and a materialised one takes changes as any other
    lazy.update_remote_log_segment_metadata(update(made[6], S.COPY_SEGMENT_FINISHED))
    original.update_remote_log_segment_metadata(update(made[6], S.COPY_SEGMENT_FINISHED))
    assert lazy == original and lazy.remote_log_segment_metadata(7, 550).start_offset == 500


def test_the_file_round_trips_in_both_the_list_and_the_column_forms():
    store, _ = mixed_store()
    store.handle(segment(0, 9, uid=40, tip=OTHER))
    parts, deletes = store.export([TIP, OTHER])
    snapshot = MetadataSnapshot(7, 99, 1234, parts, deletes)
    data = encode_snapshot(snapshot)
    assert data[4:6] == SNAPSHOT_VERSION.to_bytes(2, "big") == b"\x00\x03"
    assert decode_snapshot(data) == snapshot
    assert data == snapshot_bytes(store, [TIP, OTHER])  # the RLMM's writer: the same bytes
    reloaded = RemotePartitionMetadataStore()
    for tip, cache in _read_snapshot(data).caches:  # lazy: written again without materialising
        reloaded.restore_partition(tip, cache)
    for delete in deletes:
        reloaded.restore_delete_state(delete)
    assert snapshot_bytes(reloaded, [TIP, OTHER]) == data
    assert reloaded.cache_copy(TIP).is_lazy()


def test_concurrent_readers_and_a_writer_see_one_materialisation(monkeypatch):
    store, made = mixed_store()
    restored = RemotePartitionMetadataStore()
    restored.restore_partition(TIP, lazy_cache(store))
    calls = []
    real = SegmentColumns.materialise

    def counting(self):
        calls.append(1)
        return real(self)
    monkeypatch.setattr(SegmentColumns, "materialise", counting)
    errors: list[BaseException] = []
    go = threading.Barrier(5)

    def reader(i: int) -> None:
        try:
            go.wait()
            for _ in range(50):
                assert restored.remote_log_segment_metadata(TIP, 5, 150).start_offset == 100
                if i % 2:
                    assert len(restored.list_remote_log_segments(TIP)) >= 6
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    go.wait()
    restored.handle(update(made[6], S.COPY_SEGMENT_FINISHED))
    store.handle(update(made[6], S.COPY_SEGMENT_FINISHED))
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1
    assert restored.cache_copy(TIP) == store.cache_copy(TIP)


# --------------------------------------------------------------------------- against a model

EPOCH_STARTS = {0: 0, 1: 25, 3: 60, 4: 110}
SLOTS = [(0, 19), (20, 49), (50, 59), (60, 109), (110, 139), (140, 149), (20, 109)]


def slot_epochs(start: int, end: int) -> dict[int, int]:
    epochs = sorted(EPOCH_STARTS.items())
    found = {}
    for i, (epoch, first) in enumerate(epochs):
        last = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else 1 << 40
        if first <= end and last >= start:
            found[epoch] = max(first, start)
    return found


class LazyCacheMatchesCache(RuleBasedStateMachine):
    """Random life cycles (overlapping copies, invalid moves refused) in a store; after each
    step the store's partition, through a version 2 snapshot file, answers every lookup as the
    store does, and materialises to an equal cache."""

    def __init__(self) -> None:
        super().__init__()
        self.store = RemotePartitionMetadataStore()
        self.ids: list[RemoteLogSegmentMetadata] = []

    @rule(slot=st.integers(0, len(SLOTS) - 1), size=st.integers(0, 1 << 31 - 1), txn=st.booleans())
    def add(self, slot, size, txn):
        start, end = SLOTS[slot]
        m = segment(start, end, slot_epochs(start, end), size=size, uid=len(self.ids) + 1, txn=txn)
        self.store.handle(m)
        self.ids.append(m)

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), state=st.sampled_from([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED,
                                                 S.DELETE_SEGMENT_FINISHED]),
          custom=st.one_of(st.none(), st.binary(max_size=5)))
    def move(self, data, state, custom):
        m = data.draw(st.sampled_from(self.ids))
        try:
            self.store.handle(update(m, state, custom))
        except (ValueError, RemoteResourceNotFoundException):
            pass  # refused: an invalid transition, or a segment already gone

    @invariant()
    def lazy_answers_match(self):
        cache = self.store.cache_copy(TIP)
        if cache is None:
            return
        lazy = lazy_cache(self.store)
        for epoch in (-1, 0, 1, 2, 3, 4, 5):
            assert lazy.highest_offset_for_epoch(epoch) == cache.highest_offset_for_epoch(epoch)
            for offset in range(0, 151, 2):
                assert lazy.remote_log_segment_metadata(epoch, offset) == \
                    cache.remote_log_segment_metadata(epoch, offset)
        assert lazy.is_lazy()
        assert lazy == cache
        assert lazy.list_remote_log_segments() == cache.list_remote_log_segments()


LazyCacheMatchesCache.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLazyCacheMatchesCache = LazyCacheMatchesCache.TestCase


# --------------------------------------------------------------------------- validation


def _with(columns: SegmentColumns, **changes) -> SegmentColumns:
    values = {name: getattr(columns, name) for name in (
        "tip", "ids", "start", "end", "max_ts", "event_ts", "broker", "size", "state", "txn",
        "first_epoch", "first_offset", "extra_segment", "extra_epoch", "extra_offset",
        "custom_lengths", "custom_blob", "epoch_states")}
    values.update(changes)
    return SegmentColumns(**values)


def _array_with(values, index: int, value):
    copy = type(values)(values.typecode, values)
    copy[index] = value
    return copy


def _first_state_with(columns: SegmentColumns, **changes) -> tuple[EpochColumns, ...]:
    first = columns.epoch_states[0]
    values = {"epoch": first.epoch, "highest_offset": first.highest_offset, "starts": first.starts,
              "segments": first.segments, "unreferenced": first.unreferenced}
    values.update(changes)
    return (EpochColumns(**values), *columns.epoch_states[1:])


BAD_COLUMNS = {
    "negative-start": lambda c: _with(c, start=_array_with(c.start, 0, -5)),
    "end-below-start": lambda c: _with(c, end=_array_with(c.end, 1, c.start[1] - 1)),
    "unknown-state": lambda c: _with(c, state=b"\x09" + c.state[1:]),
    "txn-flag": lambda c: _with(c, txn=b"\x02" + c.txn[1:]),
    "short-column": lambda c: _with(c, size=c.size[:-1]),
    "epochs-not-increasing": lambda c: _with(c, extra_epoch=_array_with(c.extra_epoch, 0, c.first_epoch[0])),
    "extra-of-unknown-segment": lambda c: _with(c, extra_segment=_array_with(c.extra_segment, 0, 10_000)),
    "reference-to-unknown-segment": lambda c: _with(c, epoch_states=_first_state_with(
        c, segments=_array_with(c.epoch_states[0].segments, 0, 10_000))),
    "starts-not-increasing": lambda c: _with(c, epoch_states=_first_state_with(
        c, starts=type(c.epoch_states[0].starts)("q", [7, 7]),
        segments=type(c.epoch_states[0].segments)("I", [0, 1]))),
    "custom-lengths": lambda c: _with(c, custom_lengths=_array_with(c.custom_lengths, 0, 1000)),
}


def _started(topic_log, log_dir: Path) -> TopicBasedRemoteLogMetadataManager:
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log)
    rlmm.configure({"remote.log.metadata.topic.num.partitions": 3, "log.dir": str(log_dir), "broker.id": 1})
    rlmm.start()
    return rlmm


def _publish(rlmm: TopicBasedRemoteLogMetadataManager) -> None:
    _, made = mixed_store()
    for m in made:
        rlmm.add_remote_log_segment_metadata(m).result()
    for m, custom in zip(made[:4], [b"c1", None, b"", b"xyz"]):
        rlmm.update_remote_log_segment_metadata(update(m, S.COPY_SEGMENT_FINISHED, custom)).result()


@pytest.mark.parametrize("damage", list(BAD_COLUMNS), ids=list(BAD_COLUMNS))
def test_a_snapshot_whose_columns_fail_validation_is_ignored_and_replayed(tmp_path, damage):
    topic_log = InMemoryMetadataTopicLog()
    first = _started(topic_log, tmp_path)
    _publish(first)
    expected = first.cache_copy(TIP)
    first.close()
    mp = first.metadata_partition(TIP)
    path = snapshot_path(tmp_path, mp)
    version, prefix, partitions, deletes, fences = _parse_snapshot(path.read_bytes())
    assert version == SNAPSHOT_VERSION and [p.tip for p in partitions] == [TIP]
    bad = BAD_COLUMNS[damage](partitions[0])
    with pytest.raises(ValueError):
        bad.validate()
    path.write_bytes(_encode_columns(*prefix, [bad], deletes, fences))  # a valid CRC, bad columns
    with pytest.raises(SnapshotError):
        decode_snapshot(path.read_bytes())
    second = _started(topic_log, tmp_path)
    assert mp not in second.snapshot_offsets
    assert second.replayed_records == len(topic_log.values(mp))
    assert second.cache_copy(TIP) == expected
    second.close()


@pytest.mark.parametrize("damage", [
    pytest.param(lambda b: b + b"\x00", id="trailing-byte"),
    pytest.param(lambda b: b[:-1], id="truncated"),
])
def test_damaged_version_2_files_are_refused(damage):
    store, _ = mixed_store()
    data = snapshot_bytes(store)
    with pytest.raises(SnapshotError):
        decode_snapshot(damage(data))


def test_a_version_2_restart_keeps_partitions_lazy_until_used_and_snapshots_them_as_they_are(tmp_path):
    topic_log = InMemoryMetadataTopicLog()
    first = _started(topic_log, tmp_path)
    _publish(first)
    expected = first.cache_copy(TIP)
    first.close()
    second = _started(topic_log, tmp_path)
    assert second.replayed_records == 0
    assert second.cache_copy(TIP).is_lazy()
    assert second.remote_log_segment_metadata(TIP, 5, 150).start_offset == 100
    assert second.highest_offset_for_epoch(TIP, 6) == 399
    assert second.cache_copy(TIP).is_lazy()
    # another partition of the same metadata partition changes: the snapshot keeps TIP's columns
    other = next(TopicIdPartition(uuid.UUID(int=i), TopicPartition("x", 0)) for i in range(2, 999)
                 if second.metadata_partition(TopicIdPartition(uuid.UUID(int=i), TopicPartition("x", 0)))
                 == second.metadata_partition(TIP))
    second.add_remote_log_segment_metadata(segment(0, 9, tip=other)).result()
    assert second.cache_copy(TIP).is_lazy()
    second.close()
    third = _started(topic_log, tmp_path)
    assert third.replayed_records == 0
    assert third.cache_copy(TIP) == expected
    assert [m.start_offset for m in third.list_remote_log_segments(other)] == [0]
    third.close()


def test_a_restart_from_a_snapshot_keeps_refusing_what_a_deposed_leader_writes(tmp_path):
    """The leader-epoch fence is part of the snapshot (version 3): a broker restarted from
    its snapshot refuses the same stale records as one that replayed the whole topic."""
    topic_log = InMemoryMetadataTopicLog()
    first = _started(topic_log, tmp_path / "a")
    m = dataclasses.replace(segment(0, 99, uid=50), leader_epoch=6)
    first.add_remote_log_segment_metadata(m).result()
    first.close()                                   # writes the snapshot
    again = _started(topic_log, tmp_path / "a")
    replayed = _started(topic_log, tmp_path / "b")  # no snapshot: replays the topic
    assert again.snapshot_offsets and again.replayed_records == 0
    stale = RemoteLogSegmentMetadataUpdate(m.remote_log_segment_id, 3_000, None,
                                           S.DELETE_SEGMENT_STARTED, 1, leader_epoch=5)
    topic_log.append(again.metadata_partition(TIP), serialize(stale))
    for rlmm in (again, replayed):
        rlmm.poll()
        assert rlmm.fenced_records == 1
        assert [s.state for s in rlmm.list_remote_log_segments(TIP)] == [S.COPY_SEGMENT_STARTED]
    again.close()
    replayed.close()


def test_a_version_2_snapshot_is_read_with_no_fences():
    store = RemotePartitionMetadataStore()
    store.handle(dataclasses.replace(segment(0, 9, uid=60), leader_epoch=4))
    columns, deletes = store.export_columns([TIP])
    v3 = _encode_columns(7, 99, 1234, columns, deletes, store.fences().items())
    assert decode_snapshot(v3).fences == [(TIP, 4)]
    fence_section = 4 + (16 + 4 + 2 + len(TIP.topic)) + 4   # count, the partition, its epoch
    body = v3[10:-fence_section]                     # version 2 ends with the delete states
    v2 = b"SRLM" + struct.pack(">hI", 2, crc32c.crc32c(body)) + body
    loaded = decode_snapshot(v2)
    assert loaded.fences == [] and loaded.partitions == decode_snapshot(v3).partitions
