"""A failing log dir (full disk, I/O errors): KAFKA_STORAGE_ERROR from one place (Produce,
new logs; OffsetCommit then gets Kafka's NOT_COORDINATOR), the offline log dir count, logging
once with rate-limited repeats, and writes again once space returns. The disk is made to fail
by making ``os.pwritev``/``os.posix_fallocate`` raise; the real full disk is in
``tests/integration/test_full_disk.py``."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from strata.common.errors import ErrorCode, KafkaStorageError
from strata.common.types import TopicPartition
from strata.coordinator.group import (
    GroupCoordinator, GroupCoordinatorConfig, OffsetCommitPartition)
from strata.log import indexes, segment
from strata.log.log_config import LogConfig
from strata.log.log_dir_failure import LogDirFailureChannel
from strata.log.log_manager import LogManager
from strata.protocol.records import SimpleRecord, build_batch, iter_records
from strata.replication.replica_manager import ReplicaManager
from strata.server.metrics import BrokerMetricsCollector
from support.replicas import lead_alone

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def no_space(*args) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def batch(i: int, size: int = 100) -> bytes:
    return build_batch([SimpleRecord(b"v%d-" % i + b"x" * size, b"k%d" % i)])


@pytest.fixture
def broker(tmp_path):
    manager = LogManager([tmp_path / "logs"], LogConfig({"index.interval.bytes": 1}))
    manager.startup()
    replicas = ReplicaManager(manager, lambda topic: 1 if topic == "t" else None)
    lead_alone(replicas, TP)
    yield manager, replicas
    manager.shutdown()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS])
def test_storage_errnos_become_kafka_storage_errors_with_kafkas_message(tmp_path, code):
    channel = LogDirFailureChannel()
    with pytest.raises(KafkaStorageError) as raised:
        with channel.guard(tmp_path, "appending records to t-0"):
            raise OSError(code, os.strerror(code))
    assert str(raised.value).startswith(f"Error while appending records to t-0 in dir {tmp_path}")
    assert raised.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert channel.offline_log_directory_count() == 1
    with channel.guard(tmp_path, "appending records to t-0"):
        pass
    assert channel.offline_log_directory_count() == 0


def test_other_os_errors_pass_through_and_leave_the_dir_online(tmp_path):
    channel = LogDirFailureChannel()
    with pytest.raises(FileNotFoundError):
        with channel.guard(tmp_path, "creating log for t-0"):
            raise FileNotFoundError(errno.ENOENT, "gone")
    assert channel.offline_log_directory_count() == 0


def test_failures_are_logged_once_then_at_most_once_per_interval_and_recovery_once(
        tmp_path, caplog):
    clock = Clock()
    channel = LogDirFailureChannel(repeat_interval_s=60, monotonic=clock)

    def fail() -> None:
        with pytest.raises(KafkaStorageError):
            with channel.guard(tmp_path, "appending records to t-0"):
                raise OSError(errno.ENOSPC, "No space left on device")

    def succeed() -> None:
        with channel.guard(tmp_path, "appending records to t-0"):
            pass

    caplog.set_level(logging.INFO, "strata.log.log_dir_failure")
    for _ in range(1000):
        fail()
    succeed()
    for _ in range(10):      # flapping within the interval: no new lines
        fail()
        succeed()
    clock.now = 61
    fail()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == ["ERROR", "WARNING", "ERROR"]
    assert "1009 more failed write(s)" in messages[2][1]
    assert all(r.exc_info is None for r in caplog.records)
    assert channel.offline_log_directory_count() == 1


def test_a_full_disk_fails_the_append_unwritten_and_the_next_append_succeeds(
        broker, monkeypatch):
    manager, replicas = broker
    assert replicas.append(TP, batch(0), produce_version=9).error == ErrorCode.NONE
    ulog = manager.get_log(TP)
    end, size = ulog.log_end_offset, ulog.size
    monkeypatch.setattr(segment.os, "pwritev", no_space)
    refused = replicas.append(TP, batch(1), produce_version=9)
    assert refused.error == ErrorCode.KAFKA_STORAGE_ERROR
    assert refused.message.startswith("Error while appending records to t-0 in dir ")
    assert (ulog.log_end_offset, ulog.size) == (end, size)
    assert manager.dir_failures.offline_log_directory_count() == 1

    monkeypatch.undo()
    stored = replicas.append(TP, batch(2), produce_version=9)
    assert (stored.error, stored.base_offset) == (ErrorCode.NONE, end)
    assert manager.dir_failures.offline_log_directory_count() == 0
    assert [r.key for r in iter_records(ulog.read(0, 1 << 20).records)] == [b"k0", b"k2"]


def test_a_short_write_is_a_full_disk(broker, monkeypatch):
    manager, replicas = broker
    real = os.pwrite
    monkeypatch.setattr(segment.os, "pwritev",
                        lambda fd, parts, pos: real(fd, b"".join(parts)[:10], pos))
    assert replicas.append(TP, batch(0), produce_version=9).error == \
        ErrorCode.KAFKA_STORAGE_ERROR
    monkeypatch.undo()
    stored = replicas.append(TP, batch(1), produce_version=9)
    assert (stored.error, stored.base_offset) == (ErrorCode.NONE, 0)


def test_index_blocks_are_allocated_before_the_batch_is_written(broker, monkeypatch):
    """A write through the index map to an unallocated page of a full disk is a SIGBUS: the
    append must fail on the allocation, before anything is written."""
    manager, replicas = broker
    assert replicas.append(TP, batch(0), produce_version=9).error == ErrorCode.NONE
    ulog = manager.get_log(TP)
    end = ulog.log_end_offset
    written = []
    monkeypatch.setattr(segment.os, "pwritev",
                        lambda fd, parts, pos: written.append(parts) or sum(map(len, parts)))
    monkeypatch.setattr(indexes.os, "posix_fallocate", no_space)
    # past the reserved index blocks: 16 KiB of 8-byte entries, one entry per batch here
    for i in range(1, 3000):
        result = replicas.append(TP, batch(i, 0), produce_version=9)
        if result.error != ErrorCode.NONE:
            break
    assert result.error == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(written) == i - 1         # the refused batch was never written
    assert ulog.log_end_offset == end + i - 1


def test_a_log_that_cannot_be_created_is_a_storage_error(tmp_path, monkeypatch):
    """The partition is granted while its log cannot be made: it is hosted without one, and
    appends answer KAFKA_STORAGE_ERROR (each tries to make the log again)."""
    manager = LogManager([tmp_path / "logs"], LogConfig({"index.interval.bytes": 1}))
    manager.startup()
    replicas = ReplicaManager(manager, lambda topic: 1 if topic == "t" else None)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(Path, "mkdir", read_only)
    lead_alone(replicas, TP)
    assert replicas.partition(TP).log_failed
    assert replicas.append(TP, batch(0), produce_version=9).error == \
        ErrorCode.KAFKA_STORAGE_ERROR
    assert manager.dir_failures.offline_log_directory_count() == 1
    manager.shutdown()


def test_a_cluster_broker_never_makes_a_log_its_state_could_not(tmp_path, monkeypatch):
    """In a cluster a leader whose log could not be made when its state came is not given an
    empty one later by an append (its data may be on the failed disk); it waits for the log
    dir failure handler to follow it afresh."""
    from strata.cluster.image import PartitionState
    manager = LogManager([tmp_path / "logs"], LogConfig({"index.interval.bytes": 1}))
    manager.startup()
    replicas = ReplicaManager(manager, lambda topic: 1 if topic == "t" else None,
                              broker_id=1, clustered=True)
    with monkeypatch.context() as failing:
        failing.setattr(Path, "mkdir", lambda *a, **k: (_ for _ in ()).throw(
            OSError(errno.EROFS, "Read-only file system")))
        replicas.apply_states({TP: PartitionState(1, 3, (1, 2), (1, 2))})
    assert replicas.partition(TP).log_failed
    assert replicas.append(TP, batch(0), produce_version=9).error == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert manager.get_log(TP) is None
    manager.shutdown()


def test_the_offline_log_directory_count_is_exported_as_kafka_names_it(tmp_path):
    channel = LogDirFailureChannel()
    collector = BrokerMetricsCollector(lambda: [], None, channel.offline_log_directory_count)

    def gauge() -> float:
        return {s.name: s.value for f in collector.collect() for s in f.samples}[
            "kafka_log_LogManager_OfflineLogDirectoryCount"]
    assert gauge() == 0
    with pytest.raises(KafkaStorageError):
        with channel.guard(tmp_path, "writing the cluster metadata"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert gauge() == 1
    with channel.guard(tmp_path, "writing the cluster metadata"):
        pass
    assert gauge() == 0


def test_a_storage_error_mapped_below_marks_the_dir_and_passes_unchanged(tmp_path):
    channel = LogDirFailureChannel()
    snapshot_failed = KafkaStorageError("failed to write producer snapshot x")
    with pytest.raises(KafkaStorageError) as raised:
        with channel.guard(tmp_path, "appending records to t-0"):
            raise snapshot_failed from OSError(errno.ENOSPC, "No space left on device")
    assert raised.value is snapshot_failed
    assert channel.offline_log_directory_count() == 1


def test_an_offset_commit_on_a_full_disk_gets_not_coordinator_as_from_kafka(tmp_path, monkeypatch):
    """Kafka's group coordinator answers a storage error of ``__consumer_offsets`` with
    NOT_COORDINATOR (retriable: the client finds the coordinator again and retries)."""
    from unit.test_offsets_log import Broker

    async def commits() -> list[dict]:
        b = Broker(tmp_path, {"offsets.topic.num.partitions": "1"})
        log = b.offsets_log()
        gc = GroupCoordinator(log, GroupCoordinatorConfig(
            offsets_topic_num_partitions=log.ensure_topic()))
        gc.load()
        answers = []
        with monkeypatch.context() as full:
            full.setattr(segment.os, "pwritev", no_space)
            answers.append(await gc.commit_offsets(
                "g", "", -1, [OffsetCommitPartition("t", 0, 42, 3, "")]))
        answers.append(await gc.commit_offsets(
            "g", "", -1, [OffsetCommitPartition("t", 0, 42, 3, "")]))
        gc.shutdown()
        b.shutdown()
        return answers
    assert asyncio.run(commits()) == [{("t", 0): ErrorCode.NOT_COORDINATOR},
                                      {("t", 0): ErrorCode.NONE}]
