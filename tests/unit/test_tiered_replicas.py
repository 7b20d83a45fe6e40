"""KIP-405 across replicas, on real logs, a memory remote tier and the topic-based RLMM: a
follower rebuilds its leader epochs and producer state from the remote segment below the
leader's local log start (the KIP's BuildingRemoteLogAuxState), only a leader copies, a follower
learns how far the remote tier reaches, and a new leader resumes copying where the old one
stopped in its epoch lineage (the KIP's "follower to leader transition")."""

from __future__ import annotations

import threading
import time

import pytest

from strata.log.leader_epoch import EpochEntry
from strata.log.log_config import LogConfig
from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch, iter_records
from strata.tiered.api import RemoteLogSegmentState, RemoteStorageException
from strata.tiered.manager import copier
from strata.tiered.manager.remote_log_manager import PartitionTiering, RemoteLogManager
from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
from strata.tiered.storage import FaultInjectingObjectStore, MemoryObjectStore
from support.waiting import eventually
from tiered_env import SMALL_SEGMENTS, TIP, TP, TieredEnv

PRODUCER_ID = 4242


def produce(ulog: UnifiedLog, epoch: int, n: int, clock) -> None:
    """``n`` batches of one record from one idempotent producer, at leader epoch ``epoch``,
    committed."""
    for _ in range(n):
        off = ulog.log_end_offset
        seq = ulog.producer_state.last_entry(PRODUCER_ID).last_seq + 1 \
            if ulog.producer_state.last_entry(PRODUCER_ID) else 0
        ulog.append_as_leader(build_batch(
            [SimpleRecord(b"%d-" % off * 25, b"k%d" % off, timestamp=clock.milliseconds())],
            producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq), epoch)
        ulog.update_high_watermark(ulog.log_end_offset)


def values(ulog: UnifiedLog, start: int) -> dict[int, bytes]:
    data = ulog.read(start, 1 << 20, FetchIsolation.LOG_END).records
    return {r.offset: r.value for r in iter_records(bytes(data))}


class Leader(TieredEnv):
    """A leader's tiered log with epochs 0, 1, 2, 3 (the KIP's follower scenario tables, at
    ten records an epoch), copied to the remote tier, its local segments below the last copy
    deleted by local retention."""

    def __init__(self, tmp, store=None):
        super().__init__(tmp, store=store)
        for epoch in range(4):
            produce(self.log, epoch, 10, self.clock)
        self.copy()
        self.log.delete_old_segments()

    def follower_log(self, tmp) -> UnifiedLog:
        return UnifiedLog(tmp / "follower" / "orders-0", LogConfig(SMALL_SEGMENTS),
                          clock=self.clock, topic_partition=TP)

    def target_epoch(self) -> int:
        """What the fetcher asks the leader: the epoch of the offset just below its local log."""
        return self.log.leader_epoch_cache.epoch_for_offset(self.log.local_log_start_offset - 1)


@pytest.fixture
def leader(tmp_path):
    env = Leader(tmp_path / "leader")
    yield env
    env.close()


def test_a_follower_starts_after_the_remote_segment_below_the_leaders_local_log(leader, tmp_path):
    local_start = leader.log.local_log_start_offset
    assert 0 < local_start < leader.log.log_end_offset
    follower = leader.follower_log(tmp_path)
    try:
        produce(follower, 0, 3, leader.clock)       # what it had before: truncated fully
        nxt = leader.rlm.build_remote_log_aux_state(follower, leader.target_epoch(), local_start, 0)
        assert nxt == local_start == follower.log_end_offset == follower.local_log_start_offset
        assert follower.log_start_offset == 0       # the remote tier serves [0, local start)
        assert follower.high_watermark == nxt
        assert follower.leader_epoch_cache.epoch_entries() == [
            e for e in leader.log.leader_epoch_cache.epoch_entries() if e.start_offset < nxt]
        # the idempotent producer continues here: its state came with the remote segment
        entry = follower.producer_state.last_entry(PRODUCER_ID)
        assert entry is not None and entry.last_data_offset == nxt - 1
        # the leader's local tail, appended as a follower appends it, makes the same log
        replicate(leader.log, follower)
        assert values(follower, nxt) == values(leader.log, nxt)
        assert follower.leader_epoch_cache.epoch_entries() == leader.log.leader_epoch_cache.epoch_entries()
        metrics = leader.rlm.metrics.snapshot()
        assert metrics["BuildRemoteLogAuxStateRequestsPerSec"] == {"orders": 1}
        assert metrics["BuildRemoteLogAuxStateErrorsPerSec"] == {}
    finally:
        follower.close()


def test_a_rebuilt_follower_survives_its_restart(leader, tmp_path):
    local_start = leader.log.local_log_start_offset
    follower = leader.follower_log(tmp_path)
    leader.rlm.build_remote_log_aux_state(follower, leader.target_epoch(), local_start, 0)
    epochs = follower.leader_epoch_cache.epoch_entries()
    follower.close()
    follower = leader.follower_log(tmp_path)
    try:
        assert (follower.log_end_offset, follower.local_log_start_offset) == (local_start, local_start)
        assert follower.leader_epoch_cache.epoch_entries() == epochs
        assert follower.producer_state.last_entry(PRODUCER_ID) is not None
    finally:
        follower.close()


def test_a_rebuild_with_the_remote_tier_unreachable_fails_and_leaves_the_log_as_it_was(tmp_path):
    faults = FaultInjectingObjectStore(MemoryObjectStore())
    env = Leader(tmp_path / "leader", store=faults)
    follower = env.follower_log(tmp_path)
    try:
        produce(follower, 0, 3, env.clock)
        before = (values(follower, 0), follower.leader_epoch_cache.epoch_entries())
        faults.set_outage(True)
        with pytest.raises(RemoteStorageException):
            env.rlm.build_remote_log_aux_state(follower, env.target_epoch(),
                                               env.log.local_log_start_offset, 0)
        assert (values(follower, 0), follower.leader_epoch_cache.epoch_entries()) == before
        assert env.rlm.metrics.snapshot()["BuildRemoteLogAuxStateErrorsPerSec"] == {"orders": 1}
        faults.set_outage(False)                    # the fetcher's retry then succeeds
        env.rlm.build_remote_log_aux_state(follower, env.target_epoch(),
                                           env.log.local_log_start_offset, 0)
        assert follower.log_end_offset == env.log.local_log_start_offset
    finally:
        follower.close()
        env.close()


def test_a_rebuild_before_the_segments_metadata_arrived_is_retriable(leader, tmp_path):
    from strata.tiered.api import RetriableRemoteStorageException
    follower = leader.follower_log(tmp_path)
    try:
        beyond = leader.log.log_end_offset + 5      # no remote segment holds offset beyond - 1
        with pytest.raises(RetriableRemoteStorageException):
            leader.rlm.build_remote_log_aux_state(follower, 3, beyond, 0)
        assert follower.log_end_offset == 0
    finally:
        follower.close()


# ---- leadership: who copies ----------------------------------------------------------------


class Replica:
    """One broker's view: its own log of the partition, its own RLMM over the shared metadata
    topic log and its own RemoteLogManager over the shared store, leading at ``epoch`` or
    following (None)."""

    def __init__(self, tmp, env: TieredEnv, broker_id: int, epoch: int | None, ulog=None):
        self.epoch = epoch
        self.leads_metadata = False
        self.log = ulog or UnifiedLog(tmp / f"b{broker_id}" / "orders-0", LogConfig(SMALL_SEGMENTS),
                                      clock=env.clock, topic_partition=TP)
        self.rlmm = TopicBasedRemoteLogMetadataManager(env.rlmm._topic_log, clock=env.clock)
        self.rlmm.configure({"log.dir": str(tmp / f"b{broker_id}"), "broker.id": broker_id,
                             "remote.log.metadata.topic.num.partitions": 3})
        self.rlmm.start()
        self.rlm = RemoteLogManager(env.rsm, self.rlmm, broker_id=broker_id, logs=lambda: [self.log],
                                    topic_id=env.topic_id, settings=env.rlm.settings,
                                    clock=env.clock, leader_epoch_of=lambda tp: self.epoch,
                                    leads_metadata_partition=lambda p: self.leads_metadata)

    def run_round(self) -> None:
        """One scheduling round, waited for."""
        self.rlm._schedule_round()

        def finished() -> bool:
            parts = list(self.rlm._partitions.values())
            return bool(parts) and not any(t.running for p in parts
                                           for t in (p.copy_task, p.expire_task))
        eventually(finished, "the round's tasks to finish")

    def close(self) -> None:
        self.rlm._copiers.shutdown(wait=True)
        self.rlm._expirers.shutdown(wait=True)
        self.rlm._readers.shutdown(wait=True)
        self.rlmm.close()
        if self.log is not None:
            self.log.close()


def replicate(src: UnifiedLog, dst: UnifiedLog) -> None:
    """What a follower's fetcher does: the leader's batches from our end, appended as bytes."""
    while dst.log_end_offset < src.log_end_offset:
        dst.append_as_follower(bytes(src.read(dst.log_end_offset, 1 << 30, FetchIsolation.LOG_END).records))
    dst.update_high_watermark(min(src.high_watermark, dst.log_end_offset))


@pytest.fixture
def shared(tmp_path):
    env = TieredEnv(tmp_path / "shared")
    made: list[Replica] = []

    def replica(broker_id: int, epoch: int | None) -> Replica:
        made.append(Replica(tmp_path, env, broker_id, epoch))
        return made[-1]
    yield env, replica
    for r in made:
        r.close()
    env.close()


def test_only_the_leader_copies_and_a_follower_learns_how_far_the_remote_tier_reaches(shared):
    env, replica = shared
    a, b = replica(1, 0), replica(2, None)
    produce(a.log, 0, 40, env.clock)
    replicate(a.log, b.log)
    b.run_round()
    assert list(b.rlmm.list_remote_log_segments(TIP)) == []      # a follower copies nothing
    a.run_round()
    copied = [m for m in a.rlmm.list_remote_log_segments(TIP)
              if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    assert copied and all(m.broker_id == 1 for m in copied)
    assert b.log.highest_offset_in_remote_storage == -1
    b.run_round()                                                 # Kafka's RLMFollowerTask
    assert b.log.highest_offset_in_remote_storage == a.log.highest_offset_in_remote_storage
    # so the follower's local retention may now delete what is in the remote tier
    b.log.delete_old_segments()
    assert b.log.local_log_start_offset == copied[-1].end_offset + 1
    assert b.log.log_start_offset == 0


def test_a_new_leader_resumes_copying_after_the_highest_offset_of_its_epoch_lineage(shared):
    env, replica = shared
    a, b = replica(1, 0), replica(2, None)
    produce(a.log, 0, 30, env.clock)
    replicate(a.log, b.log)
    a.run_round()
    before = {m.remote_log_segment_id for m in a.rlmm.list_remote_log_segments(TIP)}
    highest = a.log.highest_offset_in_remote_storage
    # the leader dies; the follower leads at epoch 1 (makeLeader stamps the epoch at its end)
    a.epoch, b.epoch = None, 1
    b.log.leader_epoch_cache.assign(1, b.log.log_end_offset)
    produce(b.log, 1, 20, env.clock)
    b.run_round()
    segments = sorted(b.rlmm.list_remote_log_segments(TIP), key=lambda m: m.start_offset)
    new = [m for m in segments if m.remote_log_segment_id not in before]
    assert new and all(m.broker_id == 2 for m in new)
    # the first new segment is the one holding highest + 1: no gap, at most an overlap
    assert new[0].start_offset <= highest + 1 <= new[0].end_offset
    assert all(y.start_offset <= x.end_offset + 1 for x, y in zip(segments, segments[1:]))
    assert {m.remote_log_segment_id for m in a.rlmm.list_remote_log_segments(TIP)} >= before
    assert 1 in new[-1].segment_leader_epochs


def test_an_old_leaders_copy_stops_once_its_leadership_is_superseded(shared):
    env, replica = shared
    a = replica(1, 0)
    produce(a.log, 0, 40, env.clock)
    started = threading.Event()
    release = threading.Event()
    copy = a.rlm.ctx.rsm.copy_log_segment_data
    calls = []

    def slow_copy(meta, data):
        calls.append(meta.start_offset)
        started.set()
        release.wait(10)
        return copy(meta, data)

    a.rlm.ctx.rsm.copy_log_segment_data = slow_copy
    try:
        a.rlm._schedule_round()
        assert started.wait(10)
        leading = a.rlm._partitions[TP]
        a.epoch = None                   # leadership lost while the first copy is in flight
        a.rlm._schedule_round()          # the follower state supersedes the leader's
        assert leading.superseded
        release.set()
        eventually(lambda: not leading.copy_task.running, "the copy in flight to finish")
    finally:
        a.rlm.ctx.rsm.copy_log_segment_data = copy
    assert len(calls) == 1               # the copy in flight finished; no further segment
    assert not a.rlm._partitions[TP].leader


def test_partition_tiering_copies_only_while_it_leads(tmp_path):
    env = TieredEnv(tmp_path)
    try:
        produce(env.log, 0, 30, env.clock)
        follower_part = PartitionTiering(TIP, env.log, env.rlm.settings, leader=False, leader_epoch=-1)
        assert not follower_part.copy_enabled
        env.rlm._ensure_initialized(follower_part)
        assert copier.copy_log_segments(env.rlm.ctx, follower_part) == 0
        assert list(env.rlmm.list_remote_log_segments(TIP)) == []
        part = PartitionTiering(TIP, env.log, env.rlm.settings, leader=True, leader_epoch=0)
        assert part.copy_enabled
        part.superseded = True
        assert not part.copy_enabled
    finally:
        env.close()


def test_epoch_entries_from_the_remote_tier_are_cut_at_the_local_start(tmp_path):
    ulog = UnifiedLog(tmp_path / "orders-0", LogConfig(SMALL_SEGMENTS), topic_partition=TP)
    try:
        ulog.truncate_fully_and_start_after_remote(
            7, 2, [EpochEntry(0, 0), EpochEntry(1, 3), EpochEntry(2, 5), EpochEntry(3, 7)], None)
        assert ulog.leader_epoch_cache.epoch_entries() == [EpochEntry(0, 0), EpochEntry(1, 3),
                                                           EpochEntry(2, 5)]
        assert (ulog.log_start_offset, ulog.local_log_start_offset, ulog.log_end_offset) == (2, 7, 7)
    finally:
        ulog.close()


def test_earliest_pending_upload_is_the_first_offset_not_in_the_remote_tier(leader, tmp_path):
    """ListOffsets -6 (KIP-1023): highest copied + 1 at its epoch; -1 on a topic not tiered."""
    from strata.log.unified_log import EARLIEST_PENDING_UPLOAD_TIMESTAMP as PENDING
    found = leader.log.fetch_offset_by_timestamp(PENDING)
    highest = leader.log.highest_offset_in_remote_storage
    assert highest > 0 and found.offset == highest + 1
    assert found.leader_epoch == leader.log.leader_epoch_cache.epoch_for_offset(highest + 1)
    plain = UnifiedLog(tmp_path / "plain" / "orders-0", LogConfig({}), topic_partition=TP)
    fresh = leader.follower_log(tmp_path)
    try:
        produce(plain, 0, 3, leader.clock)
        assert plain.fetch_offset_by_timestamp(PENDING).offset == -1
        assert fresh.fetch_offset_by_timestamp(PENDING).offset == 0   # nothing copied yet
    finally:
        plain.close()
        fresh.close()


def test_the_leader_of_the_metadata_partition_removes_a_deleted_topics_remote_data(shared):
    """KIP-405's RemotePartitionRemover runs where the partition's metadata partition is led:
    every broker hears of the deletion, one publishes the lifecycle and deletes the objects."""
    env, replica = shared
    a, b = replica(1, 0), replica(2, None)
    produce(a.log, 0, 40, env.clock)
    a.run_round()
    assert env.store.objects
    published = []
    for r in (a, b):
        real = r.rlmm.put_remote_partition_delete_metadata

        def put(meta, real=real, who=r):
            published.append((who.rlm.ctx.broker_id, meta.state.name))
            return real(meta)
        r.rlmm.put_remote_partition_delete_metadata = put
    b.leads_metadata = True                       # broker 2 leads the metadata partition
    a.epoch = b.epoch = None                      # the topic is gone: nobody leads it
    for r in (a, b):
        r.rlm.on_partitions_deleted([TIP])
        r.rlm._remove_partition(TIP)              # the remover task, run inline
    assert published == [(2, "DELETE_PARTITION_MARKED"), (2, "DELETE_PARTITION_STARTED"),
                         (2, "DELETE_PARTITION_FINISHED")]
    assert env.store.objects == {}
    assert a.rlm._removals == {} and b.rlm._removals == {}


class _LoadingMetadata:
    """The leader's metadata manager as a restarted follower's sees it: not ready until its
    consumer, a moment after the partition is assigned, has read it (``ready_after_s``)."""

    def __init__(self, inner, ready_after_s: float):
        self._inner = inner
        self._ready_after_s = ready_after_s
        self._ready_at: float | None = None
        self._ready = threading.Event()

    def on_partition_leadership_changes(self, leaders, followers) -> None:
        if self._ready_at is None:
            self._ready_at = time.monotonic() + self._ready_after_s
            threading.Timer(self._ready_after_s, self._ready.set).start()

    def is_ready(self, tip) -> bool:
        return self._ready.is_set()

    def wait_ready(self, tip, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.mark.parametrize("ready_after_s, rebuilt", [(0.05, True), (2.0, False)])
def test_a_rebuild_waits_briefly_for_metadata_being_loaded(tmp_path, ready_after_s, rebuilt):
    """Metadata that loads within moments of the assignment (a broker that just started) is
    waited for instead of failing the rebuild into the fetcher's back-off; metadata that takes
    longer fails it as not ready, leaving the log as it was."""
    from strata.tiered.api import RemoteStorageNotReadyException
    env = Leader(tmp_path / "leader")
    follower = env.follower_log(tmp_path)
    real = env.rlm.ctx.rlmm
    env.rlm.ctx.rlmm = _LoadingMetadata(real, ready_after_s)
    try:
        local_start = env.log.local_log_start_offset
        if rebuilt:
            assert env.rlm.build_remote_log_aux_state(follower, env.target_epoch(), local_start, 0) \
                == local_start
            assert follower.log_end_offset == local_start
        else:
            started = time.monotonic()
            with pytest.raises(RemoteStorageNotReadyException):
                env.rlm.build_remote_log_aux_state(follower, env.target_epoch(), local_start, 0)
            assert time.monotonic() - started < 1.0
            assert follower.log_end_offset == 0
    finally:
        env.rlm.ctx.rlmm = real
        follower.close()
        env.close()
