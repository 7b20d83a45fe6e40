"""The remote log manager's tasks, run one at a time on a real log, a memory object store and
the topic-based metadata manager in memory, with a mock clock: what gets copied, what the
expirer deletes and why, how the log's offsets move, retries with backoff, remote reads."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest

from strata.common.errors import ErrorCode, KafkaStorageError
from strata.log.unified_log import FetchIsolation
from strata.protocol.records import iter_records
from strata.log.producer_state import decode_snapshot
from strata.tiered.api import IndexType, RemoteLogSegmentState, RemoteStorageException
from strata.tiered.manager import copier, expirer
from strata.log.log_config import LogConfig
from strata.tiered.manager.remote_log_manager import PartitionTiering
from strata.tiered.manager.retry import Backoff
from strata.tiered.storage import FaultInjectingObjectStore, MemoryObjectStore
from support.waiting import eventually
from tiered_env import T0, TIP, TP, TieredEnv
from support.replicas import lead_alone


class Env(TieredEnv):
    """The tiered env behind a fault-injecting store (``faults``); ``config`` overrides the
    log's."""

    def __init__(self, tmp: Path, **config):
        self.faults = FaultInjectingObjectStore(MemoryObjectStore())
        super().__init__(tmp, store=self.faults, log_props=config)

    def expire(self) -> int:
        self.rlm._ensure_initialized(self.part)
        return expirer.expire_remote_segments(self.rlm.ctx, self.part)

    def remote(self, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED):
        return [m for m in self.rlmm.list_remote_log_segments(TIP) if state is None or m.state is state]

    def objects(self) -> list[str]:
        return sorted(self.faults.inner.objects) if hasattr(self.faults, "inner") else \
            sorted(k for k, _ in self.faults.list(""))

    def read_all(self, start: int) -> list[int]:
        out = []
        while start < self.log.high_watermark:
            if start < self.log.local_log_start_offset:
                data = self.rlm.read(self.log, start, 10_000, FetchIsolation.HIGH_WATERMARK, True).records
            else:
                data = self.log.read(start, 10_000).records
            got = [r.offset for r in iter_records(data) if r.offset >= start]
            assert got, f"no progress at {start}"
            out += got
            start = got[-1] + 1
        return out


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def test_copier_tiers_every_inactive_segment_in_order_and_local_retention_follows(env):
    env.produce(100)
    segments = env.log.local_log.segments
    assert len(segments) > 3
    copied = env.copy()
    assert copied == len(segments) - 1  # never the active segment
    remote = env.remote()
    assert [m.start_offset for m in remote] == [s.base_offset for s in segments[:-1]]
    assert all(b.start_offset == a.end_offset + 1 for a, b in zip(remote, remote[1:]))
    assert env.log.highest_offset_in_remote_storage == remote[-1].end_offset
    assert env.copy() == 0  # nothing new: idempotent
    env.log.delete_old_segments()
    assert env.log.local_log_start_offset == remote[-1].end_offset + 1
    assert env.log.log_start_offset == 0
    assert env.read_all(0) == list(range(100))


def test_a_segment_without_a_producer_snapshot_is_copied_with_an_empty_one(env, tmp_path,
                                                                         monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    env.produce(100)
    first, second, third = env.log.local_log.segments[:3]
    lost = env.log.producer_state.fetch_snapshot(second.base_offset)
    lost.unlink()                       # as after a recovery that rebuilt the segment
    kept = env.log.producer_state.fetch_snapshot(third.base_offset).read_bytes()
    copy_data = env.rsm.copy_log_segment_data
    in_flight = []                      # what a crash in the middle of each copy would leave

    def copy_and_look(meta, data):
        in_flight.append(len(list(scratch.iterdir())))
        return copy_data(meta, data)

    monkeypatch.setattr(env.rsm, "copy_log_segment_data", copy_and_look)
    env.copy()
    remote = env.remote()
    assert remote[0].start_offset == first.base_offset
    with env.rsm.fetch_index(remote[0], IndexType.PRODUCER_SNAPSHOT) as stream:
        assert decode_snapshot(stream.read()) == []
    with env.rsm.fetch_index(remote[1], IndexType.PRODUCER_SNAPSHOT) as stream:
        assert stream.read() == kept
    assert in_flight[:3] == [1, 0, 0]   # only the missing snapshot needs a scratch dir
    assert list(scratch.iterdir()) == []


def test_copier_stops_at_the_last_stable_offset(env):
    env.produce(60)
    env.log.update_high_watermark(10)  # only offsets < 10 are committed
    env.copy()
    assert all(m.end_offset < 10 for m in env.remote())


def test_a_failed_copy_leaves_no_objects_and_no_visible_segment_then_retries_under_a_new_id(env):
    env.produce(40)
    env.faults.fail_keys = r"\.rsm-manifest$"
    with pytest.raises(RemoteStorageException):
        env.copy()
    assert env.remote() == []
    assert env.objects() == []
    assert env.log.highest_offset_in_remote_storage == -1
    env.faults.fail_keys = None
    env.copy()
    assert env.remote()[0].start_offset == 0
    env.expire()  # the attempt's cleanup failed too (the fault matches its delete): now it goes
    assert env.remote(None) == env.remote()
    finished = {str(m.remote_log_segment_id.id) for m in env.remote()}
    assert len({k.rsplit(".", 1)[0] for k in env.objects()}) == len(finished)


def test_an_interrupted_copy_is_an_orphan_the_expirer_deletes(env):
    from strata.tiered.api import RemoteLogSegmentId, RemoteLogSegmentMetadata
    env.produce(40)
    seg = env.log.local_log.segments[0]
    nxt = env.log.local_log.segments[1].base_offset
    # a crash after COPY_SEGMENT_STARTED and the .log upload, before anything else
    orphan = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate_new(TIP), 0, nxt - 1, T0, 1, T0,
                                      seg.size, segment_leader_epochs={0: 0})
    env.rlmm.add_remote_log_segment_metadata(orphan).result()
    env.faults.put(env.rsm.object_key(orphan, "log"), seg.log_path.read_bytes())
    env.copy()  # the segment is copied again, under a new id
    assert env.remote()[0].start_offset == 0
    assert env.remote()[0].remote_log_segment_id != orphan.remote_log_segment_id
    env.expire()
    assert [m for m in env.remote(None) if m.state is not RemoteLogSegmentState.COPY_SEGMENT_FINISHED] == []
    assert env.rsm.object_key(orphan, "log") not in env.objects()
    assert env.read_all(0) == list(range(40))


def test_expirer_deletes_by_retention_time_oldest_first_and_moves_the_log_start(tmp_path):
    env = Env(tmp_path, **{"retention.ms": "3600000"})
    env.produce(30, ts=T0 - 7_200_000)  # two hours old
    env.produce(30, ts=T0)
    env.log.roll()
    env.produce(1)
    env.copy()
    old = [m for m in env.remote() if m.max_timestamp_ms <= T0 - 3_600_000]
    assert old
    deleted = env.expire()
    assert deleted == len(old)
    assert env.log.log_start_offset == old[-1].end_offset + 1
    assert all(m.max_timestamp_ms > T0 - 3_600_000 for m in env.remote())
    assert env.read_all(env.log.log_start_offset)[0] == env.log.log_start_offset


def test_expirer_deletes_by_retention_size_until_the_whole_log_fits(tmp_path):
    env = Env(tmp_path, **{"retention.bytes": "6000"})
    env.produce(200)
    env.copy()
    env.expire()
    remote = env.remote()
    local_only = sum(s.size for s in env.log.local_log.segments
                     if s.base_offset > env.log.highest_offset_in_remote_storage)
    total = sum(m.segment_size_in_bytes for m in remote) + local_only
    # as Kafka (and local retention) do: delete while the log stays at or above the limit
    assert total >= 6000 and total - remote[0].segment_size_in_bytes < 6000
    assert env.remote(None)[0].start_offset > 0
    assert env.log.log_start_offset == remote[0].start_offset


def test_expirer_deletes_segments_below_the_log_start_offset_after_delete_records(env):
    env.produce(100)
    env.copy()
    remote = env.remote()
    target = remote[2].start_offset + 1
    env.log.maybe_increment_log_start_offset(target, "DeleteRecords")
    env.expire()
    assert [m.start_offset for m in env.remote()] == [m.start_offset for m in remote[2:]]
    assert env.rlm.segment_for_offset(env.log, remote[0].start_offset)[0].start_offset \
        == remote[2].start_offset
    assert env.read_all(target)[0] == target


def test_segments_of_epochs_older_than_the_logs_earliest_are_deleted(env):
    env.produce(40)
    env.copy()
    victim = env.remote()[-1]
    # the log loses the epoch that wrote the segment (as a truncating follower would)
    env.log.leader_epoch_cache.truncate_from_end(0)
    env.log.leader_epoch_cache.assign(5, 0)
    env.expire()
    assert victim not in env.remote()


def test_remote_read_of_a_deleted_object_is_a_retriable_error_never_data(env):
    env.produce(40)
    env.copy()
    env.log.delete_old_segments()
    m = env.remote()[0]
    for key in env.rsm.segment_keys(m):
        env.faults.delete(key)
    env.cache.remove(m.remote_log_segment_id.id)
    with pytest.raises(KafkaStorageError):
        env.rlm.read(env.log, m.start_offset, 1000, FetchIsolation.HIGH_WATERMARK, True)
    assert env.rlm.metrics.snapshot()["RemoteFetchErrorsPerSec"]["orders"] == 1


def test_resume_after_restart_finds_the_highest_copied_offset_through_the_epochs(tmp_path):
    env = Env(tmp_path)
    env.produce(40)
    env.copy()
    highest = env.log.highest_offset_in_remote_storage
    fresh = PartitionTiering(TIP, env.log, env.rlm.settings)
    env.log.update_highest_offset_in_remote_storage(-1, force=True)
    env.rlm._ensure_initialized(fresh)
    assert env.log.highest_offset_in_remote_storage == highest


def test_backoff_doubles_with_jitter_up_to_the_maximum_and_resets():
    b = Backoff(100, 1000, 0.2, random.Random(7))
    delays = [b.next_delay_ms() for _ in range(8)]
    for i, d in enumerate(delays[:4]):
        assert 0.8 * 100 * 2 ** i <= d <= 1.2 * 100 * 2 ** i
    assert all(800 <= d <= 1200 for d in delays[4:])
    b.reset()
    assert 80 <= b.next_delay_ms() <= 120


def test_topic_deletion_removes_every_remote_segment_and_records_the_partition_states(env):
    env.produce(60)
    env.copy()
    assert env.objects()
    published = []
    real_put = env.rlmm.put_remote_partition_delete_metadata

    def put(meta):
        published.append(meta.state.name)
        return real_put(meta)
    env.rlmm.put_remote_partition_delete_metadata = put
    env.rlm._remove_partition(TIP)
    assert env.objects() == []
    assert list(env.rlmm.list_remote_log_segments(TIP)) == []
    assert published == ["DELETE_PARTITION_MARKED", "DELETE_PARTITION_STARTED",
                         "DELETE_PARTITION_FINISHED"]
    assert env.rlm._removals == {}


def test_expirer_never_deletes_a_copy_that_finishes_while_it_lists(env):
    import threading
    env.produce(40)
    env.rlm._ensure_initialized(env.part)
    at_manifest, go = threading.Event(), threading.Event()
    env.faults.delay_keys, env.faults.delay_ms = r"\.rsm-manifest$", 1

    def hold(_):
        at_manifest.set()
        go.wait(10)
    env.faults._sleep = hold
    seg, nxt = env.log.local_log.segments[0], env.log.local_log.segments[1].base_offset
    t = threading.Thread(target=copier.copy_log_segment, args=(env.rlm.ctx, env.part, seg, nxt))
    t.start()
    assert at_manifest.wait(10)
    real = env.rlmm.list_remote_log_segments

    def listing(tip, *a):
        snap = list(real(tip, *a))  # sees the copy in flight: COPY_SEGMENT_STARTED
        env.rlmm.list_remote_log_segments = real
        go.set()
        t.join()  # ...which finishes before the expirer decides
        return iter(snap)
    env.rlmm.list_remote_log_segments = listing
    assert expirer.expire_remote_segments(env.rlm.ctx, env.part) == 0
    assert [m.start_offset for m in env.remote()] == [0]
    assert env.log.highest_offset_in_remote_storage == nxt - 1


def test_expirer_running_right_after_copy_started_leaves_the_copy_alone(env):
    env.produce(40)
    env.rlm._ensure_initialized(env.part)
    real_add = env.rlmm.add_remote_log_segment_metadata
    deleted = []

    def add(meta):
        fut = real_add(meta)
        deleted.append(expirer.expire_remote_segments(env.rlm.ctx, env.part))
        return fut
    env.rlmm.add_remote_log_segment_metadata = add
    seg, nxt = env.log.local_log.segments[0], env.log.local_log.segments[1].base_offset
    copier.copy_log_segment(env.rlm.ctx, env.part, seg, nxt)
    assert deleted == [0]
    assert [m.state for m in env.remote(None)] == [RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    assert len(env.objects()) == 3


def test_delete_on_disable_retries_through_an_outage_until_the_remote_data_is_gone(env):
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    assert env.remote()
    env.log.update_config(LogConfig({**env.log.config.originals, "remote.storage.enable": "false",
                                     "remote.log.delete.on.disable": "true"}))
    env.faults.set_outage(True)

    def settle():
        def idle():
            with env.rlm._lock:
                tasks = list(env.rlm._disabling.values())
            return None if any(t.running for t in tasks) else (tasks,)
        return eventually(idle, "the deletion task to finish its attempt")[0]
    env.rlm._schedule_round()
    tasks = settle()
    assert len(tasks) == 1 and tasks[0].backoff.failures == 1  # failed, will retry
    assert env.remote()
    env.faults.set_outage(False)
    env.clock.advance_ms(60_000)
    env.rlm._schedule_round()
    settle()
    assert env.remote(None) == [] and env.objects() == []
    assert env.rlm._disabling == {}
    assert env.log.log_start_offset == env.log.local_log_start_offset > 0
    assert env.log.highest_offset_in_remote_storage == -1


def test_sequential_remote_reads_prefetch_ahead_into_the_next_segment(env):

    from test_remote_storage import RecordingObjectStore
    recorder = env.faults.inner = RecordingObjectStore(env.faults.inner)
    env.rsm.configure({"chunk.size": 512, "prefetch.max.size": 4096})
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    first, second = env.remote()[:2]
    second_log = env.rsm.object_key(second, "log")

    def second_gets() -> int:
        return sum(1 for op, key in recorder.calls if op == "get_range" and key == second_log)

    # read the first segment sequentially, 300 bytes a time, as a consumer does
    offset = first.start_offset
    while offset <= first.end_offset:
        data = env.rlm.read(env.log, offset, 300, FetchIsolation.HIGH_WATERMARK, True).records
        offset = list(iter_records(data))[-1].offset + 1
    index_cache = env.rlm.ctx.index_cache
    # the read-ahead reached into the next segment: its chunks and its indexes
    eventually(lambda: second_gets() > 0 and second.remote_log_segment_id.id in index_cache,
               "a read-ahead into the next segment")
    cache = env.rsm._chunk_cache
    loaded = second_gets()
    index_misses = index_cache.misses
    hits = cache.stats()["prefetch_hits"] + cache.stats()["hits_memory"]
    env.rlm.read(env.log, second.start_offset, 300, FetchIsolation.HIGH_WATERMARK, True)
    assert second_gets() == loaded                 # served from what was prefetched
    assert index_cache.misses == index_misses
    assert cache.stats()["prefetch_hits"] + cache.stats()["hits_memory"] > hits


def test_a_partitions_first_remote_read_loads_its_read_ahead_while_it_waits_for_its_first_chunk(env):
    """The first chunk's GET is held until another chunk's GET has started: that only happens
    when the read-ahead is queued before the read waits (50 ms GETs would otherwise stall a
    fast consumer a few chunks in)."""
    import threading

    from test_remote_storage import RecordingObjectStore

    class FirstChunkWaits(RecordingObjectStore):
        def __init__(self, inner, log_key):
            super().__init__(inner)
            self.log_key, self.other_chunk_started, self.waited = log_key, threading.Event(), None

        def get_range(self, key, start, end_exclusive):
            if key == self.log_key and start == 0:
                self.waited = self.other_chunk_started.wait(10)
            elif key == self.log_key:
                self.other_chunk_started.set()
            return super().get_range(key, start, end_exclusive)

    env.rsm.configure({"chunk.size": 256, "prefetch.max.size": 1024})
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    first = env.remote()[0]
    store = env.faults.inner = FirstChunkWaits(env.faults.inner, env.rsm.object_key(first, "log"))
    data = env.rlm.read(env.log, first.start_offset, 100, FetchIsolation.HIGH_WATERMARK, True).records
    assert list(iter_records(data))[0].offset == first.start_offset
    assert store.waited is True


def test_a_read_ahead_ending_near_a_segment_end_warms_the_next_segments_metadata_not_its_chunks(env):

    from test_remote_storage import RecordingObjectStore
    recorder = env.faults.inner = RecordingObjectStore(env.faults.inner)
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    # segments of about 2 KiB: a first read's 1124 bytes of read-ahead end within 1024 of the
    # end (configured after the copy, so no manifest is cached: a restarted broker's case)
    env.rsm.configure({"chunk.size": 256, "prefetch.max.size": 1024})
    first, second = env.remote()[:2]
    assert 100 + 1024 < first.segment_size_in_bytes <= 100 + 2 * 1024
    env.rlm.read(env.log, first.start_offset, 100, FetchIsolation.HIGH_WATERMARK, True)
    manifest = env.rsm.object_key(second, "rsm-manifest")
    eventually(lambda: ("get", manifest) in recorder.calls
               and second.remote_log_segment_id.id in env.rlm.ctx.index_cache,
               "the next segment's manifest and indexes loaded")
    assert ("get_range", env.rsm.object_key(second, "log")) not in recorder.calls


def test_a_fetch_racing_local_retention_is_served_from_the_remote_tier(env):
    """Local retention deletes the segment between the fetch's range check and its local read:
    the fetch then goes to the remote tier instead of answering OFFSET_OUT_OF_RANGE."""
    from strata.replication.replica_manager import ReplicaManager

    class Logs:
        def get_log(self, tp):
            return env.log if tp == TP else None

    env.produce(60)
    env.copy()
    assert env.log.local_log_start_offset == 0
    local_read = env.log.read

    def read_after_retention(*args, **kwargs):
        env.log.delete_old_segments()
        return local_read(*args, **kwargs)

    env.log.read = read_after_retention
    replicas = ReplicaManager(Logs(), lambda t: 1 if t == TP.topic else None,
                              remote_log_manager=env.rlm)
    lead_alone(replicas, TP)
    result = replicas.read(TP, 0, 1000, FetchIsolation.HIGH_WATERMARK, True)
    assert env.log.local_log_start_offset > 0
    assert result.error == ErrorCode.NONE and result.remote is env.log
