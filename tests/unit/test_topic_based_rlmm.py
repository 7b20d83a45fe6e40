"""TopicBasedRemoteLogMetadataManager: publishing through ``__remote_log_metadata``, replay at
start, snapshots that make restarts replay only the tail -- over an in-memory topic and over
the broker's own partition logs."""

from __future__ import annotations

import concurrent.futures
import struct
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from strata.cluster.metadata import REMOTE_LOG_METADATA_TOPIC_NAME as CLUSTER_TOPIC_NAME
from strata.cluster.metadata import ClusterMetadata
from strata.common.clock import MockClock
from strata.common.errors import InvalidConfigError
from strata.common.types import TopicPartition
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.protocol import records as rec
from strata.tiered.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundException,
    RemoteStorageException,
    RemoteStorageNotReadyException,
    TopicIdPartition,
)
from strata.tiered.metadata.cache import IllegalStateTransition, RemotePartitionMetadataStore
from strata.tiered.metadata.serde import metadata_partition, serialize
from strata.tiered.metadata.topic_based import (
    SNAPSHOT_VERSION,
    MetadataSnapshot,
    SnapshotError,
    TopicBasedRemoteLogMetadataManager,
    decode_snapshot,
    encode_snapshot,
    snapshot_path,
)
from strata.tiered.metadata.topic_log import (
    REMOTE_LOG_METADATA_TOPIC_NAME,
    InMemoryMetadataTopicLog,
    LogMetadataTopicLog,
)

S = RemoteLogSegmentState
D = RemotePartitionDeleteState
NUM_PARTITIONS = 5


def tip(topic: str = "orders", partition: int = 0, topic_id: int = 0xC0FFEE) -> TopicIdPartition:
    return TopicIdPartition(uuid.UUID(int=topic_id), TopicPartition(topic, partition))


TIP = tip()
PARTITIONS = [tip("orders", p) for p in range(4)] + [tip("events", 0, 0xBEEF)]


def segment(start: int, end: int, *, partition: TopicIdPartition = TIP,
            epochs: dict[int, int] | None = None, size: int = 1000,
            uid: int | None = None) -> RemoteLogSegmentMetadata:
    segment_id = RemoteLogSegmentId(partition, uuid.UUID(int=uid)) if uid else RemoteLogSegmentId.generate_new(partition)
    return RemoteLogSegmentMetadata(segment_id, start, end, 5_000 + end, 1,
                                    4_000, size, segment_leader_epochs=epochs or {0: start},
                                    txn_idx_empty=start % 2 == 0)


def update(m: RemoteLogSegmentMetadata, state: S, custom: bytes | None = None) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(m.remote_log_segment_id, 6_000, custom, state, 1)


def configs(log_dir: Path, **extra) -> dict[str, object]:
    return {"remote.log.metadata.topic.num.partitions": NUM_PARTITIONS, "log.dir": str(log_dir),
            "broker.id": 1, "cluster.id": "c1", **extra}


def started(topic_log, log_dir: Path, clock=None, **extra) -> TopicBasedRemoteLogMetadataManager:
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log, **({"clock": clock} if clock else {}))
    rlmm.configure(configs(log_dir, **extra))
    rlmm.start()
    return rlmm


def done(future: concurrent.futures.Future) -> None:
    assert future.done()
    assert future.result() is None


def copy_segment(rlmm, m: RemoteLogSegmentMetadata, custom: bytes | None = b"rsm") -> RemoteLogSegmentMetadata:
    done(rlmm.add_remote_log_segment_metadata(m))
    done(rlmm.update_remote_log_segment_metadata(update(m, S.COPY_SEGMENT_FINISHED, custom)))
    return m.create_with_updates(update(m, S.COPY_SEGMENT_FINISHED, custom))


def caches(rlmm, partitions=PARTITIONS) -> dict:
    return {p: rlmm.cache_copy(p) for p in partitions}


def workload(rlmm, rounds: int = 3) -> None:
    """Copies, deletes and a partition deletion across several user partitions."""
    for p in PARTITIONS:
        made = []
        for i in range(rounds):
            made.append(copy_segment(rlmm, segment(i * 100, i * 100 + 99, partition=p,
                                                   epochs={0: i * 100, 1: i * 100 + 50})))
        done(rlmm.update_remote_log_segment_metadata(update(made[0], S.DELETE_SEGMENT_STARTED)))
        done(rlmm.update_remote_log_segment_metadata(update(made[0], S.DELETE_SEGMENT_FINISHED)))
        done(rlmm.add_remote_log_segment_metadata(segment(rounds * 100, rounds * 100 + 9, partition=p)))
    gone = PARTITIONS[-1]
    for state in (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED):
        done(rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(gone, state, 7, 1)))


@pytest.fixture
def topic_log() -> InMemoryMetadataTopicLog:
    return InMemoryMetadataTopicLog()


@pytest.fixture
def rlmm(topic_log, tmp_path):
    manager = started(topic_log, tmp_path)
    yield manager
    manager.close()


# --------------------------------------------------------------------------- configuration


def test_start_creates_the_topic_with_kafkas_configs(topic_log, tmp_path):
    rlmm = started(topic_log, tmp_path, **{"remote.log.metadata.topic.retention.ms": 86_400_000,
                                           "remote.log.metadata.topic.replication.factor": 3})
    assert topic_log.num_partitions == NUM_PARTITIONS
    assert topic_log.topic_configs == {"cleanup.policy": "delete", "retention.ms": "86400000",
                                       "remote.storage.enable": "false"}
    assert rlmm.broker_id == 1 and rlmm.cluster_id == "c1" and rlmm.log_dir == tmp_path
    assert (rlmm.snapshot_interval_records, rlmm.snapshot_interval_ms) == (1000, 60_000)
    rlmm.close()


def test_defaults_are_kafkas(topic_log, tmp_path):
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log)
    rlmm.configure({"log.dir": str(tmp_path)})
    rlmm.start()
    assert topic_log.num_partitions == 50
    assert topic_log.topic_configs["retention.ms"] == "-1"
    assert rlmm.metadata_partition(TIP) == metadata_partition(TIP.topic_id, TIP.partition, 50)
    rlmm.close()


@pytest.mark.parametrize("bad", [
    {"log.dir": ""},
    {"remote.log.metadata.topic.retention.ms": 0},
    {"remote.log.metadata.topic.retention.ms": -2},
    {"remote.log.metadata.topic.num.partitions": 0},
    {"remote.log.metadata.topic.replication.factor": 0},
    {"remote.log.metadata.snapshot.interval.records": -1},
])
def test_invalid_configs_are_refused(topic_log, tmp_path, bad):
    props = {"log.dir": str(tmp_path), **bad}
    with pytest.raises(InvalidConfigError):
        TopicBasedRemoteLogMetadataManager(topic_log).configure(props)


def test_log_dir_is_required(topic_log):
    with pytest.raises(InvalidConfigError):
        TopicBasedRemoteLogMetadataManager(topic_log).configure({})


def test_an_existing_topic_keeps_its_partition_count(topic_log, tmp_path):
    topic_log.ensure_topic(3)
    rlmm = started(topic_log, tmp_path)
    assert rlmm.num_partitions == 3
    m = segment(0, 9)
    done(rlmm.add_remote_log_segment_metadata(m))
    assert topic_log.values(metadata_partition(TIP.topic_id, TIP.partition, 3)) == [serialize(m)]
    rlmm.close()


def test_nothing_is_served_before_start_or_after_close(topic_log, tmp_path):
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log)
    rlmm.configure(configs(tmp_path))
    assert not rlmm.is_ready(TIP)
    with pytest.raises(RemoteStorageNotReadyException):
        rlmm.remote_log_segment_metadata(TIP, 0, 0)
    with pytest.raises(RemoteStorageNotReadyException):
        rlmm.add_remote_log_segment_metadata(segment(0, 9))
    rlmm.on_partition_leadership_changes({TIP}, set())  # allowed before start, as in Kafka
    rlmm.start()
    assert rlmm.is_ready(TIP)
    assert list(rlmm.list_remote_log_segments(TIP)) == []
    rlmm.close()
    assert not rlmm.is_ready(TIP)
    with pytest.raises(RemoteStorageException):
        rlmm.highest_offset_for_epoch(TIP, 0)
    with pytest.raises(RemoteStorageException):
        rlmm.add_remote_log_segment_metadata(segment(0, 9))


# --------------------------------------------------------------------------- publishing


def test_a_published_segment_is_readable_once_its_copy_is_finished(rlmm):
    m = segment(0, 99, epochs={0: 0, 3: 60})
    future = rlmm.add_remote_log_segment_metadata(m)
    done(future)
    assert rlmm.remote_log_segment_metadata(TIP, 0, 10) is None
    assert list(rlmm.list_remote_log_segments(TIP)) == [m]
    done(rlmm.update_remote_log_segment_metadata(update(m, S.COPY_SEGMENT_FINISHED, b"manifest")))
    found = rlmm.remote_log_segment_metadata(TIP, 3, 99)
    assert found.state is S.COPY_SEGMENT_FINISHED and found.custom_metadata == b"manifest"
    assert rlmm.remote_log_segment_metadata(TIP, 0, 60) is None
    assert rlmm.highest_offset_for_epoch(TIP, 0) == 59
    assert rlmm.highest_offset_for_epoch(TIP, 3) == 99
    assert rlmm.remote_log_size(TIP, 3) == 1000
    assert list(rlmm.list_remote_log_segments(TIP, 3)) == [found]
    assert rlmm.next_segment_with_txn_index(TIP, 0, 10) == found


def test_records_are_serde_bytes_in_the_user_partitions_metadata_partition(rlmm, topic_log):
    published = {p: [] for p in PARTITIONS}
    for p in PARTITIONS:
        m = segment(0, 9, partition=p)
        u = update(m, S.COPY_SEGMENT_FINISHED)
        d = RemotePartitionDeleteMetadata(p, D.DELETE_PARTITION_MARKED, 9, 1)
        done(rlmm.add_remote_log_segment_metadata(m))
        done(rlmm.update_remote_log_segment_metadata(u))
        done(rlmm.put_remote_partition_delete_metadata(d))
        published[p] = [serialize(m), serialize(u), serialize(d)]
    for mp in range(NUM_PARTITIONS):
        expected = [v for p in PARTITIONS if metadata_partition(p.topic_id, p.partition, NUM_PARTITIONS) == mp
                    for v in published[p]]
        assert sorted(topic_log.values(mp)) == sorted(expected)
        assert rlmm.read_offset(mp) == len(expected)
    assert len({rlmm.metadata_partition(p) for p in PARTITIONS}) > 1


def test_invalid_publishes_raise_and_append_nothing(rlmm, topic_log):
    m = segment(0, 9)
    mp = rlmm.metadata_partition(TIP)
    with pytest.raises(ValueError):
        rlmm.add_remote_log_segment_metadata(m.create_with_updates(update(m, S.COPY_SEGMENT_FINISHED)))
    with pytest.raises(RemoteResourceNotFoundException):
        rlmm.update_remote_log_segment_metadata(update(m, S.COPY_SEGMENT_FINISHED))
    done(rlmm.add_remote_log_segment_metadata(m))
    with pytest.raises(ValueError):
        rlmm.update_remote_log_segment_metadata(update(m, S.COPY_SEGMENT_STARTED))
    with pytest.raises(IllegalStateTransition):
        rlmm.update_remote_log_segment_metadata(update(m, S.DELETE_SEGMENT_FINISHED))
    with pytest.raises(IllegalStateTransition):
        rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_STARTED, 1, 1))
    assert topic_log.values(mp) == [serialize(m)]
    done(rlmm.add_remote_log_segment_metadata(m))  # a retried add is fine
    assert len(topic_log.values(mp)) == 2


def test_a_failed_append_fails_the_future_and_changes_nothing(rlmm, topic_log, monkeypatch):
    def broken(partition, value):
        raise OSError("disk on fire")
    monkeypatch.setattr(topic_log, "append", broken)
    future = rlmm.add_remote_log_segment_metadata(segment(0, 9))
    with pytest.raises(RemoteStorageException, match="disk on fire"):
        future.result(timeout=0)
    assert list(rlmm.list_remote_log_segments(TIP)) == []


def test_an_append_that_is_not_readable_afterwards_fails_the_future(rlmm, topic_log, monkeypatch):
    real = topic_log.append
    monkeypatch.setattr(topic_log, "append", lambda p, v: real(p, v) + 5)
    future = rlmm.add_remote_log_segment_metadata(segment(0, 9))
    with pytest.raises(RemoteStorageException, match="not readable"):
        future.result(timeout=0)


def test_a_partition_deletion_ends_with_its_metadata_dropped(rlmm):
    rlmm.on_partition_leadership_changes({TIP}, {PARTITIONS[1]})
    assert rlmm.assigned_partitions() == {TIP, PARTITIONS[1]}
    m = copy_segment(rlmm, segment(0, 9))
    rlmm.on_stop_partitions({TIP})
    assert rlmm.assigned_partitions() == {PARTITIONS[1]}
    for state in (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED):
        done(rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(TIP, state, 1, 1)))
        assert rlmm.remote_partition_delete_metadata(TIP).state is state
    assert list(rlmm.list_remote_log_segments(TIP)) == [m]  # what the remover deletes
    done(rlmm.update_remote_log_segment_metadata(update(m, S.DELETE_SEGMENT_STARTED)))
    done(rlmm.update_remote_log_segment_metadata(update(m, S.DELETE_SEGMENT_FINISHED)))
    done(rlmm.put_remote_partition_delete_metadata(
        RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_FINISHED, 1, 1)))
    assert rlmm.remote_partition_delete_metadata(TIP) is None
    assert rlmm.cache_copy(TIP) is None
    assert rlmm.highest_offset_for_epoch(TIP, 0) is None


def test_concurrent_publishers_all_land(rlmm):
    def copy_many(p):
        for i in range(20):
            copy_segment(rlmm, segment(i * 10, i * 10 + 9, partition=p))
    threads = [threading.Thread(target=copy_many, args=(p,)) for p in PARTITIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in PARTITIONS:
        assert len(list(rlmm.list_remote_log_segments(p))) == 20
        assert rlmm.highest_offset_for_epoch(p, 0) == 199


def test_records_appended_by_another_writer_are_seen_by_reads(rlmm, topic_log):
    m = segment(0, 9)
    mp = rlmm.metadata_partition(TIP)
    topic_log.append(mp, serialize(m))
    topic_log.append(mp, serialize(update(m, S.COPY_SEGMENT_FINISHED)))
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5).state is S.COPY_SEGMENT_FINISHED
    topic_log.append(mp, serialize(segment(10, 19)))
    assert rlmm.poll() == 1


def test_bad_records_are_skipped_and_later_ones_applied(rlmm, topic_log):
    m = segment(0, 9)
    mp = rlmm.metadata_partition(TIP)
    for value in (b"\x01\x09garbage", serialize(update(m, S.COPY_SEGMENT_FINISHED)), serialize(m),
                  serialize(update(m, S.DELETE_SEGMENT_FINISHED)), serialize(update(m, S.COPY_SEGMENT_FINISHED))):
        topic_log.append(mp, value)
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5).state is S.COPY_SEGMENT_FINISHED
    assert rlmm.skipped_records == 3


# --------------------------------------------------------------------------- restarts and snapshots


def test_a_restart_without_snapshots_replays_everything_into_the_same_caches(topic_log, tmp_path):
    first = started(topic_log, tmp_path)
    workload(first)
    before = caches(first)
    first.close()
    for path in (tmp_path / "remote-log-metadata-snapshots").iterdir():
        path.unlink()
    second = started(topic_log, tmp_path)
    assert second.replayed_records == sum(len(topic_log.values(mp)) for mp in range(NUM_PARTITIONS))
    assert second.snapshot_offsets == {}
    assert caches(second) == before
    assert before[PARTITIONS[0]] is not None and before[PARTITIONS[-1]] is not None
    assert second.remote_partition_delete_metadata(PARTITIONS[-1]).state is D.DELETE_PARTITION_STARTED
    assert list(second.describe()) == list(first._store.describe())
    second.close()


def test_close_writes_snapshots_so_a_restart_replays_nothing(topic_log, tmp_path):
    first = started(topic_log, tmp_path)
    workload(first)
    before = caches(first)
    first.close()
    used = {first.metadata_partition(p) for p in PARTITIONS}
    assert sorted(p.name for p in (tmp_path / "remote-log-metadata-snapshots").iterdir()) == \
        sorted(f"__remote_log_metadata-{mp}.snapshot" for mp in used)
    second = started(topic_log, tmp_path)
    assert second.replayed_records == 0
    assert second.snapshot_offsets == {mp: len(topic_log.values(mp)) for mp in used}
    assert caches(second) == before
    second.close()


def test_a_restart_replays_only_the_records_after_the_snapshot(topic_log, tmp_path):
    first = started(topic_log, tmp_path)
    workload(first)
    first.close()
    # Written after the snapshots (by another broker, or before a crash).
    writer = started(topic_log, tmp_path / "other")
    late = [copy_segment(writer, segment(1000, 1099, partition=p)) for p in PARTITIONS[:3]]
    expected = caches(writer)
    second = started(topic_log, tmp_path)
    assert second.replayed_records == 6
    assert sum(second.replayed_records_by_partition.values()) == 6
    assert caches(second) == expected
    assert second.remote_log_segment_metadata(PARTITIONS[0], 0, 1050) == late[0]
    second.close()
    writer.close()


def test_snapshots_are_written_every_n_records(topic_log, tmp_path):
    first = started(topic_log, tmp_path, **{"remote.log.metadata.snapshot.interval.records": 4,
                                            "remote.log.metadata.snapshot.interval.ms": 0})
    for i in range(5):
        copy_segment(first, segment(i * 10, i * 10 + 9))  # 10 records in one metadata partition
    mp = first.metadata_partition(TIP)
    assert decode_snapshot(snapshot_path(tmp_path, mp).read_bytes()).next_offset == 8
    expected = caches(first)
    del first  # a crash: no close
    second = started(topic_log, tmp_path)
    assert second.snapshot_offsets == {mp: 8}
    assert second.replayed_records == 2
    assert caches(second) == expected


def test_snapshots_are_written_when_the_interval_passes(topic_log, tmp_path):
    clock = MockClock()
    first = started(topic_log, tmp_path, clock, **{"remote.log.metadata.snapshot.interval.records": 0,
                                                   "remote.log.metadata.snapshot.interval.ms": 1000})
    mp = first.metadata_partition(TIP)
    copy_segment(first, segment(0, 9))
    assert not snapshot_path(tmp_path, mp).exists()
    clock.advance_ms(1000)
    copy_segment(first, segment(10, 19))
    assert decode_snapshot(snapshot_path(tmp_path, mp).read_bytes()).next_offset == 3
    clock.advance_ms(999)
    done(first.add_remote_log_segment_metadata(segment(20, 29)))
    assert decode_snapshot(snapshot_path(tmp_path, mp).read_bytes()).next_offset == 3


def _replace_snapshot(path: Path, change) -> None:
    path.write_bytes(change(path.read_bytes()))


@pytest.mark.parametrize("damage", [
    pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="flipped-bit"),
    pytest.param(lambda b: b[:len(b) // 2], id="truncated"),
    pytest.param(lambda b: b"", id="empty"),
    pytest.param(lambda b: b[:4] + struct.pack(">h", SNAPSHOT_VERSION + 1) + b[6:], id="too-new"),
    pytest.param(lambda b: b"XXXX" + b[4:], id="bad-magic"),
])
def test_a_damaged_snapshot_is_ignored_and_the_full_replay_gives_the_same_caches(topic_log, tmp_path, damage):
    first = started(topic_log, tmp_path)
    workload(first)
    before = caches(first)
    first.close()
    mp = first.metadata_partition(TIP)
    _replace_snapshot(snapshot_path(tmp_path, mp), damage)
    second = started(topic_log, tmp_path)
    assert mp not in second.snapshot_offsets
    assert second.replayed_records == len(topic_log.values(mp))
    assert caches(second) == before
    second.close()


def test_a_snapshot_ahead_of_the_log_is_ignored(tmp_path):
    first_log = InMemoryMetadataTopicLog()
    first = started(first_log, tmp_path)
    workload(first)
    first.close()
    # The topic was lost and recreated: the snapshots claim offsets the log does not have.
    fresh = InMemoryMetadataTopicLog()
    second = started(fresh, tmp_path)
    assert second.snapshot_offsets == {}
    assert all(c is None for c in caches(second).values())
    second.close()


def test_a_snapshot_of_another_log_is_ignored_even_when_the_offsets_fit(tmp_path):
    first = started(InMemoryMetadataTopicLog(), tmp_path)
    workload(first)
    first.close()
    other_log = InMemoryMetadataTopicLog()
    other = started(other_log, tmp_path / "other")
    workload(other, rounds=5)  # more records in every metadata partition, different ones
    expected = caches(other)
    other.close()
    second = started(other_log, tmp_path)
    assert second.snapshot_offsets == {}
    assert caches(second) == expected


def test_a_snapshot_behind_the_log_start_is_ignored_and_the_retained_records_replayed(topic_log, tmp_path):
    first = started(topic_log, tmp_path)
    copy_segment(first, segment(0, 9))
    first.close()  # snapshot at offset 2
    mp = first.metadata_partition(TIP)
    writer = started(topic_log, tmp_path / "other")
    copy_segment(writer, segment(10, 19))
    writer.close()
    topic_log.delete_records(mp, 3)  # retention removed both adds and the first finish
    second = started(topic_log, tmp_path)
    assert mp not in second.snapshot_offsets
    assert second.replayed_records == 1  # the last finish, whose add is gone
    assert second.skipped_records == 1
    assert list(second.list_remote_log_segments(TIP)) == []


def test_snapshot_files_round_trip_and_reject_garbage():
    store = RemotePartitionMetadataStore()
    m = segment(0, 99, epochs={0: 0, 2: 50})
    store.handle(m)
    store.handle(update(m, S.COPY_SEGMENT_FINISHED, b"x"))
    store.handle(segment(100, 109))
    store.handle(RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 1, 1))
    parts, deletes = store.export([TIP])
    snapshot = MetadataSnapshot(2, 42, 1234, parts, deletes)
    decoded = decode_snapshot(encode_snapshot(snapshot))
    assert decoded == snapshot
    with pytest.raises(SnapshotError):
        decode_snapshot(encode_snapshot(snapshot) + b"\x00")


# --------------------------------------------------------------------------- over real partition logs


class Broker:
    """ClusterMetadata and a LogManager; appends as the broker's ReplicaManager would commit them."""

    def __init__(self, path: Path) -> None:
        self.metadata = ClusterMetadata(path, 1, {})
        self.manager = LogManager([path], self.metadata.default_log_config(),
                                  topic_config=self.metadata.log_config)
        self.manager.startup()
        self.metadata.add_listener(self)
        self.topic_log = LogMetadataTopicLog(self.metadata, self.manager.get_log, self.append,
                                             chunk_bytes=256)

    def on_topic_created(self, info) -> None:
        for p in range(info.partitions):
            self.manager.get_or_create_log(TopicPartition(info.name, p), self.metadata.log_config(info.name))

    def append(self, tp: TopicPartition, batch: bytes) -> int:
        ulog = self.manager.get_log(tp)
        info = ulog.append_as_leader(batch, 0, origin=AppendOrigin.COORDINATOR)
        ulog.update_high_watermark(ulog.log_end_offset)
        return info.first_offset

    def shutdown(self) -> None:
        self.manager.shutdown()


def test_the_topic_on_partition_logs_is_created_as_kafka_creates_it(tmp_path):
    broker = Broker(tmp_path / "data")
    assert CLUSTER_TOPIC_NAME == REMOTE_LOG_METADATA_TOPIC_NAME
    assert broker.topic_log.ensure_topic(4, 3_600_000) == 4
    info = broker.metadata.topic(REMOTE_LOG_METADATA_TOPIC_NAME)
    assert info.configs == {"cleanup.policy": "delete", "retention.ms": "3600000",
                            "remote.storage.enable": "false"}
    assert broker.topic_log.ensure_topic(9) == 4
    assert broker.topic_log.end_offset(0) == 0 and broker.topic_log.log_start_offset(0) == 0
    broker.shutdown()


def test_over_partition_logs_records_are_one_null_keyed_serde_record_per_batch(tmp_path):
    broker = Broker(tmp_path / "data")
    rlmm = started(broker.topic_log, tmp_path / "data")
    m = segment(0, 9)
    u = update(m, S.COPY_SEGMENT_FINISHED, b"c")
    done(rlmm.add_remote_log_segment_metadata(m))
    done(rlmm.update_remote_log_segment_metadata(u))
    ulog = broker.manager.get_log(TopicPartition(REMOTE_LOG_METADATA_TOPIC_NAME, rlmm.metadata_partition(TIP)))
    data = ulog.read(0, 1 << 20).records
    headers = list(rec.iter_headers(data))
    assert [h.record_count for h in headers] == [1, 1]
    assert [(r.key, r.value) for r in rec.iter_records(data)] == [(None, serialize(m)), (None, serialize(u))]
    assert rlmm.remote_log_segment_metadata(TIP, 0, 3) == m.create_with_updates(u)
    rlmm.close()
    broker.shutdown()


def test_over_partition_logs_a_null_value_is_a_skipped_record(tmp_path):
    broker = Broker(tmp_path / "data")
    rlmm = started(broker.topic_log, tmp_path / "data")
    mp = rlmm.metadata_partition(TIP)
    broker.append(broker.topic_log.topic_partition(mp), rec.build_batch([rec.SimpleRecord(None)]))
    m = segment(0, 9)
    done(rlmm.add_remote_log_segment_metadata(m))
    assert rlmm.skipped_records == 1
    assert rlmm.read_offset(mp) == 2
    assert list(rlmm.list_remote_log_segments(TIP)) == [m]
    rlmm.close()
    broker.shutdown()


def test_over_partition_logs_a_restarted_broker_rebuilds_the_same_caches(tmp_path):
    data = tmp_path / "data"
    broker = Broker(data)
    rlmm = started(broker.topic_log, data, **{"remote.log.metadata.snapshot.interval.records": 0,
                                              "remote.log.metadata.snapshot.interval.ms": 0})
    workload(rlmm, rounds=4)
    before = caches(rlmm)
    total = sum(broker.topic_log.end_offset(mp) for mp in range(NUM_PARTITIONS))
    rlmm.close()
    broker.shutdown()

    broker = Broker(data)  # snapshots from close(): nothing to replay
    rlmm = started(broker.topic_log, data)
    assert rlmm.replayed_records == 0
    assert caches(rlmm) == before
    late = copy_segment(rlmm, segment(5000, 5099))
    expected = caches(rlmm)
    del rlmm  # crash: the last two records are after the snapshot
    broker.shutdown()

    broker = Broker(data)
    rlmm = started(broker.topic_log, data)
    assert rlmm.replayed_records == 2
    assert caches(rlmm) == expected
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5000) == late
    rlmm.close()
    for path in (data / "remote-log-metadata-snapshots").iterdir():
        path.unlink()
    broker.shutdown()

    broker = Broker(data)  # and without snapshots, from the logs alone
    rlmm = started(broker.topic_log, data)
    assert rlmm.replayed_records == total + 2
    assert caches(rlmm) == expected
    rlmm.close()
    broker.shutdown()


# --------------------------------------------------------------------------- restarts against a model


class RestartsKeepTheCache(RuleBasedStateMachine):
    """Random publishes (valid or not), clean restarts, crashes and damaged snapshots: after
    each, the manager's caches equal a store fed the accepted events directly, and a clean
    restart replays nothing."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        self._tmp = tempfile.TemporaryDirectory()
        self.log_dir = Path(self._tmp.name)
        self.topic_log = InMemoryMetadataTopicLog()
        self.extra = {"remote.log.metadata.snapshot.interval.records": 3,
                      "remote.log.metadata.snapshot.interval.ms": 0}
        self.rlmm = started(self.topic_log, self.log_dir, **self.extra)
        self.model = RemotePartitionMetadataStore()
        self.segments: list[RemoteLogSegmentMetadata] = []

    def teardown(self) -> None:
        self.rlmm.close()
        self._tmp.cleanup()

    @rule(p=st.sampled_from(PARTITIONS[:3]), start=st.integers(0, 5), length=st.integers(0, 3))
    def add(self, p, start, length):
        m = segment(start * 10, start * 10 + length * 10 + 9, partition=p, uid=len(self.segments) + 1)
        done(self.rlmm.add_remote_log_segment_metadata(m))
        self.model.handle(m)
        self.segments.append(m)

    @precondition(lambda self: self.segments)
    @rule(data=st.data(), state=st.sampled_from([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED,
                                                 S.DELETE_SEGMENT_FINISHED]))
    def move(self, data, state):
        m = data.draw(st.sampled_from(self.segments))
        event = update(m, state, b"c" if state is S.COPY_SEGMENT_FINISHED else None)
        try:
            self.model.handle(event)
        except (ValueError, RemoteResourceNotFoundException) as exc:
            with pytest.raises(type(exc)):
                self.rlmm.update_remote_log_segment_metadata(event)
        else:
            done(self.rlmm.update_remote_log_segment_metadata(event))

    @rule(p=st.sampled_from(PARTITIONS[:3]), state=st.sampled_from(list(D)))
    def delete_partition(self, p, state):
        current = self.model.delete_state(p)
        event = RemotePartitionDeleteMetadata(p, state, 3, 1)
        if D.is_valid_transition(current.state if current else None, state):
            done(self.rlmm.put_remote_partition_delete_metadata(event))
            self.model.handle(event)
        else:
            with pytest.raises(ValueError):
                self.rlmm.put_remote_partition_delete_metadata(event)

    @rule()
    def clean_restart(self):
        self.rlmm.close()
        self.rlmm = started(self.topic_log, self.log_dir, **self.extra)
        assert self.rlmm.replayed_records == 0

    @rule()
    def crash_restart(self):
        self.rlmm = started(self.topic_log, self.log_dir, **self.extra)

    @rule(mp=st.integers(0, NUM_PARTITIONS - 1))
    def damage_snapshot_and_crash(self, mp):
        path = snapshot_path(self.log_dir, mp)
        if path.exists():
            path.write_bytes(path.read_bytes()[:-3])
        self.rlmm = started(self.topic_log, self.log_dir, **self.extra)
        if path.exists():
            assert mp not in self.rlmm.snapshot_offsets

    @invariant()
    def caches_match(self):
        for p in PARTITIONS[:3]:
            assert self.rlmm.cache_copy(p) == self.model.cache_copy(p)
            assert self.rlmm.remote_partition_delete_metadata(p) == self.model.delete_state(p)


RestartsKeepTheCache.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestRestartsKeepTheCache = RestartsKeepTheCache.TestCase
