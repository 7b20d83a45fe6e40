"""LeaderEpochFileCache: Kafka 4.x semantics (cases mirror Kafka's LeaderEpochFileCacheTest)."""

from __future__ import annotations

import threading

import pytest

from strata.common.types import UNDEFINED_EPOCH, OffsetAndEpoch, TopicPartition
from strata.log.checkpoint import LEADER_EPOCH_CHECKPOINT_FILENAME, LeaderEpochCheckpointFile
from strata.log.leader_epoch import UNDEFINED_EPOCH_OFFSET, EpochEntry, LeaderEpochFileCache

TP = TopicPartition("TestTopic", 5)
UNDEFINED = OffsetAndEpoch(UNDEFINED_EPOCH_OFFSET, UNDEFINED_EPOCH)


def end(offset: int, epoch: int) -> OffsetAndEpoch:
    return OffsetAndEpoch(offset, epoch)


@pytest.fixture
def checkpoint(tmp_path) -> LeaderEpochCheckpointFile:
    return LeaderEpochCheckpointFile(tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME)


@pytest.fixture
def cache(checkpoint) -> LeaderEpochFileCache:
    return LeaderEpochFileCache(TP, checkpoint)


def seeded(cache: LeaderEpochFileCache) -> LeaderEpochFileCache:
    cache.assign(2, 6)
    cache.assign(3, 8)
    cache.assign(4, 11)
    return cache


# ------------------------------------------------------------------ assign


def test_assign_adds_epoch_and_answers_end_offset_with_log_end(cache):
    cache.assign(2, 10)
    assert cache.latest_epoch() == 2
    assert cache.epoch_entries() == [EpochEntry(2, 10)]
    assert cache.end_offset_for(2, 11) == end(11, 2)
    assert cache.is_defined


def test_assign_same_epoch_at_later_offset_is_a_no_op(cache):
    cache.assign(2, 6)
    cache.assign(2, 7)
    cache.assign(2, 10)
    assert cache.epoch_entries() == [EpochEntry(2, 6)]


def test_assign_same_epoch_at_earlier_offset_replaces_entry(cache):
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    cache.assign(7, 12)
    assert cache.epoch_entries() == [EpochEntry(5, 11), EpochEntry(7, 12)]
    assert cache.end_offset_for(5, 0) == end(12, 5)
    assert cache.end_offset_for(6, 0) == end(12, 5)


def test_assign_enforces_monotonic_start_offsets(cache):
    cache.assign(2, 9)
    cache.assign(3, 9)
    assert cache.epoch_entries() == [EpochEntry(3, 9)]
    cache.assign(4, 5)
    assert cache.epoch_entries() == [EpochEntry(4, 5)]


def test_assign_enforces_monotonic_epochs(cache):
    cache.assign(1, 5)
    cache.assign(2, 6)
    cache.assign(1, 7)
    assert cache.latest_epoch() == 1
    assert cache.epoch_entries() == [EpochEntry(1, 7)]
    assert cache.end_offset_for(1, 8) == end(8, 1)
    assert cache.end_offset_for(2, 8) == UNDEFINED


def test_assign_ignores_undefined_epoch_and_rejects_negative_offset(cache, checkpoint):
    cache.assign(-1, 5)
    assert cache.epoch_entries() == []
    assert not cache.is_defined
    assert not checkpoint.path.exists()  # nothing changed, nothing written
    with pytest.raises(ValueError):
        cache.assign(3, -1)


def test_assign_flushes_to_checkpoint(cache, checkpoint):
    cache.assign(2, 6)
    assert checkpoint.path.read_bytes() == b"0\n1\n2 6\n"
    cache.assign(5, 20)
    assert checkpoint.read() == [EpochEntry(2, 6), EpochEntry(5, 20)]


def test_epochs_persist_between_instances(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    LeaderEpochFileCache(TP, LeaderEpochCheckpointFile(path)).assign(2, 6)
    cache2 = LeaderEpochFileCache(TP, LeaderEpochCheckpointFile(path))
    assert cache2.epoch_entries() == [EpochEntry(2, 6)]


def test_loading_checkpoint_drops_non_monotonic_entries(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    path.write_bytes(b"0\n3\n1 0\n3 10\n2 12\n")
    cache = LeaderEpochFileCache(TP, LeaderEpochCheckpointFile(path))
    assert cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 12)]


def test_in_memory_cache_without_checkpoint(tmp_path):
    cache = LeaderEpochFileCache(TP, None)
    cache.assign(1, 0)
    cache.truncate_from_end(0)
    cache.flush()
    cache.clear_and_flush()
    assert cache.epoch_entries() == []


def test_assign_entries_flushes_once(cache, checkpoint):
    cache.assign_entries([EpochEntry(0, 0), EpochEntry(1, 5), EpochEntry(3, 9)])
    assert checkpoint.read() == [EpochEntry(0, 0), EpochEntry(1, 5), EpochEntry(3, 9)]


# ---------------------------------------------------------- end_offset_for


def test_end_offset_for_latest_epoch_is_log_end_offset(cache):
    cache.assign(2, 11)
    cache.assign(2, 12)
    assert cache.end_offset_for(2, 14) == end(14, 2)


def test_end_offset_for_undefined_epoch_is_undefined(cache):
    assert cache.end_offset_for(UNDEFINED_EPOCH, 73) == UNDEFINED
    cache.assign(2, 11)
    cache.assign(3, 12)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 0) == UNDEFINED


def test_end_offset_for_on_empty_cache_is_undefined(cache):
    assert cache.end_offset_for(0, 0) == UNDEFINED
    assert cache.end_offset_for(7, 0) == UNDEFINED


def test_end_offset_for_epoch_below_first_returns_requested_epoch_and_first_start(cache):
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    assert cache.end_offset_for(4, 0) == end(11, 4)


def test_end_offset_for_previous_epoch_is_next_epoch_start(cache):
    for epoch, offset in [(1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16)]:
        cache.assign(epoch, offset)
    assert cache.end_offset_for(2, 17) == end(15, 2)


def test_end_offset_for_unknown_epoch_between_known_uses_floor_epoch(cache):
    cache.assign(0, 10)
    cache.assign(2, 13)
    cache.assign(4, 17)
    assert cache.end_offset_for(1, 0) == end(13, 0)
    assert cache.end_offset_for(2, 0) == end(17, 2)
    assert cache.end_offset_for(3, 0) == end(17, 2)


def test_end_offset_for_epoch_above_latest_is_undefined(cache):
    cache.assign(2, 100)
    assert cache.end_offset_for(3, 100) == UNDEFINED


def test_end_offsets_track_many_leader_changes(cache):
    cache.assign(0, 0)
    cache.assign(1, 0)
    assert cache.latest_epoch() == 1
    assert cache.end_offset_for(1, 0) == end(0, 1)
    assert cache.end_offset_for(0, 0) == end(0, 0)
    assert cache.end_offset_for(1, 5) == end(5, 1)
    cache.assign(2, 5)
    assert cache.end_offset_for(2, 10) == end(10, 2)
    assert cache.end_offset_for(1, 10) == end(5, 1)
    assert cache.end_offset_for(0, 10) == end(0, 0)


def test_end_offsets_as_follower_receives_many_messages(cache):
    for offset in range(3):
        cache.assign(0, offset)
    assert cache.end_offset_for(0, 3) == end(3, 0)
    for offset in range(3, 6):
        cache.assign(1, offset)
    assert cache.end_offset_for(1, 6) == end(6, 1)
    for offset in range(6, 9):
        cache.assign(2, offset)
    assert cache.latest_epoch() == 2
    assert cache.end_offset_for(2, 9) == end(9, 2)
    assert cache.end_offset_for(0, 9) == end(3, 0)
    assert cache.end_offset_for(1, 9) == end(6, 1)


# ----------------------------------------------------------- truncation


def test_truncate_from_end_drops_entries_on_epoch_boundary(cache):
    seeded(cache).truncate_from_end(8)
    assert cache.epoch_entries() == [EpochEntry(2, 6)]


def test_truncate_from_end_between_boundaries_keeps_containing_epoch(cache):
    seeded(cache).truncate_from_end(9)
    assert cache.latest_epoch() == 3
    assert cache.epoch_entries() == [EpochEntry(2, 6), EpochEntry(3, 8)]


def test_truncate_from_end_with_undefined_offset_is_a_no_op(cache):
    seeded(cache).truncate_from_end(UNDEFINED_EPOCH_OFFSET)
    assert len(cache.epoch_entries()) == 3


def test_truncate_from_start_preserves_reset_offset_at_boundary(cache):
    seeded(cache).truncate_from_start(8)
    assert cache.epoch_entries() == [EpochEntry(3, 8), EpochEntry(4, 11)]


def test_truncate_from_start_before_first_offset_changes_nothing(cache, checkpoint):
    seeded(cache)
    before = checkpoint.path.read_bytes()
    cache.truncate_from_start(1)
    cache.truncate_from_start(6)  # exclusive: an entry starting at 6 is kept as is
    assert cache.epoch_entries() == [EpochEntry(2, 6), EpochEntry(3, 8), EpochEntry(4, 11)]
    assert checkpoint.path.read_bytes() == before


def test_truncate_from_start_retains_latest_epoch_when_clearing_all(cache):
    seeded(cache).truncate_from_start(11)
    assert cache.epoch_entries() == [EpochEntry(4, 11)]


def test_truncate_from_start_between_boundaries_rebases_epoch(cache):
    seeded(cache).truncate_from_start(9)
    assert cache.epoch_entries() == [EpochEntry(3, 9), EpochEntry(4, 11)]


def test_truncate_from_start_between_first_two_epochs(cache):
    cache.assign(0, 0)
    cache.assign(1, 7)
    cache.assign(2, 10)
    cache.truncate_from_start(5)
    assert cache.epoch_entries() == [EpochEntry(0, 5), EpochEntry(1, 7), EpochEntry(2, 10)]


def test_truncate_from_start_past_last_epoch_rebases_it(cache):
    seeded(cache).truncate_from_start(15)
    assert cache.epoch_entries() == [EpochEntry(4, 15)]


def test_truncate_from_start_with_undefined_offset_is_a_no_op(cache):
    seeded(cache).truncate_from_start(UNDEFINED_EPOCH_OFFSET)
    assert len(cache.epoch_entries()) == 3


def test_truncation_on_empty_cache_is_harmless(cache):
    cache.truncate_from_start(7)
    cache.truncate_from_end(7)
    assert cache.epoch_entries() == []


def test_truncation_writes_checkpoint(cache, checkpoint):
    seeded(cache)
    cache.truncate_from_end(11)
    cache.truncate_from_start(8)
    assert checkpoint.read() == [EpochEntry(3, 8)]
    assert checkpoint.path.read_bytes() == b"0\n1\n3 8\n"


def test_truncation_tolerates_deleted_partition_directory(tmp_path):
    part_dir = tmp_path / "TestTopic-5"
    part_dir.mkdir()
    cache = seeded(LeaderEpochFileCache(TP, LeaderEpochCheckpointFile.in_dir(part_dir)))
    (part_dir / LEADER_EPOCH_CHECKPOINT_FILENAME).unlink()
    part_dir.rmdir()
    cache.truncate_from_end(8)  # no exception: the directory is gone
    assert cache.epoch_entries() == [EpochEntry(2, 6)]


def test_clear_and_flush_removes_all_entries(cache, checkpoint):
    seeded(cache).clear_and_flush()
    assert cache.epoch_entries() == []
    assert checkpoint.path.read_bytes() == b"0\n0\n"
    assert cache.latest_epoch() is None
    assert not cache.is_defined


# ----------------------------------------------------------------- queries


def test_latest_and_earliest_entries(cache):
    assert cache.latest_entry() is None and cache.earliest_entry() is None
    assert cache.latest_epoch() is None
    seeded(cache)
    assert cache.latest_entry() == EpochEntry(4, 11)
    assert cache.earliest_entry() == EpochEntry(2, 6)


def test_previous_epoch(cache):
    assert cache.previous_epoch() is None
    cache.assign(2, 10)
    assert cache.previous_epoch() is None
    cache.assign(4, 15)
    assert cache.previous_epoch() == 2
    cache.assign(10, 20)
    assert cache.previous_epoch() == 4
    cache.truncate_from_end(18)
    assert cache.previous_epoch() == 2


def test_previous_epoch_and_entry_of_given_epoch(cache):
    assert cache.previous_epoch(2) is None
    assert cache.previous_entry(2) is None
    cache.assign(2, 10)
    cache.assign(4, 15)
    cache.assign(10, 20)
    assert cache.previous_epoch(4) == 2
    assert cache.previous_entry(10) == EpochEntry(4, 15)
    assert cache.previous_epoch(7) == 4


def test_next_epoch_and_epoch_entry(cache):
    cache.assign(0, 0)
    cache.assign(1, 100)
    cache.assign(2, 200)
    assert [cache.next_epoch(e) for e in (-1, 0, 1, 2, 100)] == [0, 1, 2, None, None]
    assert cache.epoch_entry(1) == EpochEntry(1, 100)
    assert cache.epoch_entry(3) is None


def test_epoch_for_offset(cache):
    cache.assign(0, 10)
    cache.assign(1, 20)
    cache.assign(5, 30)
    assert cache.epoch_for_offset(25) == 1
    assert cache.epoch_for_offset(20) == 1
    assert cache.epoch_for_offset(30) == 5
    assert cache.epoch_for_offset(50) == 5
    assert cache.epoch_for_offset(5) is None


def test_epoch_entries_in_range_truncates_a_copy(cache, checkpoint):
    cache.assign(0, 0)
    cache.assign(1, 10)
    cache.assign(2, 20)
    cache.assign(3, 30)
    assert cache.epoch_entries_in_range(15, 30) == [EpochEntry(1, 15), EpochEntry(2, 20)]
    assert cache.epoch_entries_in_range(10, 31) == [
        EpochEntry(1, 10), EpochEntry(2, 20), EpochEntry(3, 30)]
    assert cache.epoch_entries_in_range(-1, 20) == [EpochEntry(0, 0), EpochEntry(1, 10)]
    assert cache.epoch_entries_in_range(35, 40) == [EpochEntry(3, 35)]
    assert len(cache.epoch_entries()) == 4  # the cache itself is untouched
    assert len(checkpoint.read()) == 4


def test_entries_up_to_is_a_copy_truncated_from_end(cache):
    seeded(cache)
    assert cache.entries_up_to(11) == [EpochEntry(2, 6), EpochEntry(3, 8)]
    assert cache.entries_up_to(12) == [EpochEntry(2, 6), EpochEntry(3, 8), EpochEntry(4, 11)]
    assert cache.entries_up_to(6) == []
    assert len(cache.epoch_entries()) == 3


def test_with_checkpoint_copies_entries(cache, tmp_path):
    seeded(cache)
    other = LeaderEpochCheckpointFile(tmp_path / "other")
    copy = cache.with_checkpoint(other)
    assert copy.epoch_entries() == cache.epoch_entries()
    assert not other.path.exists()
    copy.flush()
    assert other.read() == cache.epoch_entries()


def test_concurrent_assign_and_truncate_keep_entries_monotonic(cache):
    errors = []

    def writer(base):
        try:
            for i in range(200):
                cache.assign(base + i, (base + i) * 10)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def truncator():
        try:
            for i in range(200):
                cache.truncate_from_end(i * 10)
                cache.entries_up_to(i * 5)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(b,)) for b in (0, 1000)]
    threads.append(threading.Thread(target=truncator))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    entries = cache.epoch_entries()
    assert all(a.epoch < b.epoch and a.start_offset < b.start_offset
               for a, b in zip(entries, entries[1:]))
    assert LeaderEpochFileCache(TP, cache.checkpoint).epoch_entries() == entries
