"""A leader's remote tier after unclean elections and lost tails: which remote segments are in
its leader-epoch lineage (the expirer's rule, Kafka's ``isRemoteSegmentWithinLeaderEpochs``)
and where its copier resumes (Kafka's ``findHighestRemoteOffset``, plus the copies another
lineage's leader expired). The integration tests of KIP-405's scenarios 3 to 5
(``tests/integration/test_tiered_scenarios.py``) reach these states on broker processes;
these pin them down deterministically."""

from __future__ import annotations

import threading

import pytest

from strata.protocol.records import SimpleRecord, build_batch
from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState)
from strata.tiered.manager import copier, expirer
from strata.tiered.manager.lineage import lineage_end, within_lineage
from strata.tiered.manager.remote_log_manager import RemoteLogManager
from support.waiting import eventually
from tiered_env import TIP, TieredEnv

S = RemoteLogSegmentState


def segment(start: int, end: int, epochs: dict[int, int], broker: int = 1) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate_new(TIP), start, end, 1_000 + end,
                                    broker, 1_000, 100 * (end - start + 1),
                                    segment_leader_epochs=epochs)


def within(meta: RemoteLogSegmentMetadata, lineage: dict[int, int], log_end: int) -> bool:
    return within_lineage(meta, lineage, min(lineage), log_end)


@pytest.mark.parametrize(("start", "end", "epochs", "expected"), [
    (0, 4, {0: 0}, True),                 # epoch 0 up to where the log's epoch 3 starts
    (0, 7, {0: 0}, False),                # an old leader's epoch 0 past it: records the log lost
    (2, 9, {0: 2, 3: 5}, True),           # both epochs, starting where the log's do
    (2, 9, {0: 2, 2: 5}, False),          # an epoch the log never had
    (2, 9, {0: 2, 3: 6}, False),          # epoch 3 starting elsewhere
    (12, 19, {3: 12}, True),
    (12, 20, {3: 12}, False),             # past the log end
])
def test_a_segment_is_in_the_lineage_only_where_its_epochs_begin_and_end_as_the_logs(
        start, end, epochs, expected):
    assert within(segment(start, end, epochs), {0: 0, 3: 5}, 20) is expected


def test_epochs_without_records_do_not_take_a_segment_out_of_the_lineage():
    # epoch 1 began at 5 and ended there (a leadership with no append): the segment's epoch 0
    # is followed by epoch 2, as the log's is once empty epochs are left out (Kafka's filter)
    assert within(segment(0, 9, {0: 0, 2: 5}), {0: 0, 1: 5, 2: 5}, 20)
    assert within(segment(0, 9, {0: 0, 1: 5, 2: 5}), {0: 0, 1: 5, 2: 5}, 20)
    assert not within(segment(0, 9, {0: 0, 2: 6}), {0: 0, 1: 5, 2: 5}, 20)


def test_overlapping_copies_of_two_leaders_of_one_lineage_are_both_in_it():
    # KAFKA-16511's example: an old leader's copy and a new leader's overlapping one
    lineage = {5: 10, 7: 15, 9: 100}
    assert within(segment(10, 50, {5: 10, 7: 15}), lineage, 200)
    assert within(segment(14, 150, {5: 14, 7: 15, 9: 100}), lineage, 200)


@pytest.mark.parametrize(("start", "end", "epochs", "expected"), [
    (0, 4, {0: 0}, 5),                   # all the log's
    (0, 7, {0: 0}, 5),                   # an old leader's epoch 0 past where the log's ends
    (2, 9, {0: 2, 3: 5}, 10),            # both epochs where the log has them
    (2, 9, {0: 2, 2: 5}, 5),             # an epoch the log never had: ends where it starts
    (2, 9, {0: 2, 3: 6}, 5),             # epoch 0 followed by 3 at 6: the log's 3 starts at 5
    (12, 19, {3: 12}, 20),
    (6, 9, {2: 6}, 6),                   # nothing of it
])
def test_a_segment_is_the_logs_up_to_where_its_epochs_part_from_the_logs(start, end, epochs,
                                                                         expected):
    assert lineage_end(segment(start, end, epochs), [(0, 0), (3, 5)]) == expected


def test_epochs_below_the_logs_earliest_are_passed_over():
    # the log start moved to 100 and the cache lost epoch 0: the segment's epoch 0 part is
    # below the log start, never read; its epoch 3 part is the log's
    assert lineage_end(segment(50, 150, {0: 50, 3: 90}), [(3, 90), (5, 200)]) == 151
    # ... and so when the log start moved into epoch 3, taking its cache entry's start along
    assert lineage_end(segment(50, 150, {0: 50, 3: 90}), [(3, 120), (5, 200)]) == 151


def append(env: TieredEnv, epoch: int, n: int) -> None:
    for _ in range(n):
        off = env.log.log_end_offset
        env.log.append_as_leader(build_batch([SimpleRecord(
            b"v%d" % off, b"k%d" % off, timestamp=env.clock.milliseconds())]), epoch)
        env.log.update_high_watermark(env.log.log_end_offset)


def publish(env: TieredEnv, meta: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState) -> None:
    env.rlmm.add_remote_log_segment_metadata(meta).result(5)
    for state in states:
        env.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            meta.remote_log_segment_id, 2_000, None, state, meta.broker_id)).result(5)


COPIED = (S.COPY_SEGMENT_FINISHED,)
DELETED = (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)


@pytest.fixture
def env(tmp_path):
    e = TieredEnv(tmp_path, log_props={"local.retention.bytes": "-2"})
    yield e
    e.close()


def test_a_leader_resumes_copying_at_its_own_end_of_an_epoch_an_old_leader_tiered_further(env):
    """KIP-405 scenarios 3 and 4: the old leader tiered epoch 0 up to offset 7; this log's
    epoch 0 ends at 4 (it lost or never had 5..7) and epoch 3 starts at 5. Resuming after 7
    would never copy this log's 5..7, and local retention would then delete them."""
    append(env, 0, 5)
    append(env, 3, 10)
    publish(env, segment(0, 7, {0: 0}, broker=2), *COPIED)
    assert copier.find_resume_offset(env.rlm.ctx, env.part) == 4


def test_a_leader_resumes_after_the_copies_of_its_lineage_that_another_lineage_left(env):
    """KIP-405 scenario 5: this log (epochs 0, 1 from 5, 4 from 10) had tiered 0..9; while it
    was away a leader of another lineage (epoch 3 from 5) expired the copy of 5..9, which was
    not in its lineage, and copied its own. The metadata still says epoch 1 reached 9; resuming
    there would leave this log's 5..9 in no tier once local retention runs."""
    append(env, 0, 5)
    append(env, 1, 5)
    append(env, 4, 5)
    publish(env, segment(0, 4, {0: 0}), *COPIED)
    publish(env, segment(5, 9, {1: 5}), *DELETED)
    publish(env, segment(0, 12, {0: 0, 3: 5}, broker=2), *COPIED)
    assert env.rlmm.highest_offset_for_epoch(TIP, 1) == 9
    assert copier.find_resume_offset(env.rlm.ctx, env.part) == 4
    # ... and the copier copies this log's 5..9 again
    env.log.roll()
    env.rlm._ensure_initialized(env.part)
    assert env.log.highest_offset_in_remote_storage == 4
    copier.copy_log_segments(env.rlm.ctx, env.part)
    copies = [m for m in env.rlmm.list_remote_log_segments(TIP)
              if m.state is S.COPY_SEGMENT_FINISHED and m.broker_id == 1]
    assert any(m.start_offset <= 5 and m.end_offset >= 9 for m in copies)


def test_a_leader_whose_copies_are_there_resumes_after_them(env):
    append(env, 0, 5)
    append(env, 1, 5)
    publish(env, segment(0, 4, {0: 0}), *COPIED)
    publish(env, segment(5, 7, {1: 5}), *COPIED)
    assert copier.find_resume_offset(env.rlm.ctx, env.part) == 7


def test_a_new_leader_epoch_does_not_expire_the_copy_its_previous_leadership_has_in_flight(tmp_path):
    """The same broker leads at a new epoch (in ZooKeeper mode an ISR shrink on a broker's
    failure starts one) while its copier of the previous epoch is uploading a segment: that
    COPY_SEGMENT_STARTED segment is no orphan. Expiring it lost records on broker processes
    (KIP-405 scenario 2.2 test): the old copier published COPY_SEGMENT_FINISHED, moving the
    highest tiered offset past the segment, then the new expirer deleted it."""
    env = TieredEnv(tmp_path)
    epoch = {"now": 0}
    rlm = RemoteLogManager(env.rsm, env.rlmm, broker_id=1, logs=env.logs, topic_id=env.topic_id,
                           settings=env.rlm.settings, index_cache=env.cache, clock=env.clock,
                           leader_epoch_of=lambda tp: epoch["now"])
    started, release = threading.Event(), threading.Event()
    copy = env.rsm.copy_log_segment_data

    in_flight = []

    def slow_copy(meta, data):
        if not started.is_set():                # the first copy waits for the test
            in_flight.append(meta.remote_log_segment_id)
            started.set()
            release.wait(10)
        return copy(meta, data)

    def settle(tasks) -> None:
        eventually(lambda: not any(t.running for t in tasks), "the tasks to finish")

    env.rsm.copy_log_segment_data = slow_copy
    try:
        env.produce(40)
        rlm._schedule_round()
        assert started.wait(10)                 # the epoch-0 copy of [0, ...] is in flight
        first = rlm._partitions[env.log.topic_partition]
        epoch["now"] = 1
        env.log.leader_epoch_cache.assign(1, env.log.log_end_offset)
        rlm._schedule_round()                   # the leadership at epoch 1 takes over
        second = rlm._partitions[env.log.topic_partition]
        assert second is not first and first.superseded
        settle([second.expire_task])
        release.set()
        settle([first.copy_task, second.copy_task])
        listed = list(env.rlmm.list_remote_log_segments(TIP))
        states = {m.remote_log_segment_id: m.state for m in listed}
    finally:
        release.set()
        env.rsm.copy_log_segment_data = copy
        rlm._copiers.shutdown(wait=True)
        rlm._expirers.shutdown(wait=True)
        rlm._readers.shutdown(wait=True)
        env.close()
    # the copy the previous leadership had in flight is finished and kept (deleting it is what
    # lost records), and not copied again
    assert states.get(in_flight[0]) is S.COPY_SEGMENT_FINISHED, states
    copied = sorted(m.start_offset for m in listed if m.state is S.COPY_SEGMENT_FINISHED)
    assert len(copied) == len(set(copied)), copied
