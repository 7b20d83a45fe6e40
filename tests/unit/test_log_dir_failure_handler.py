"""The broker side of a failed log dir (issue 51), on a manual clock: the replicas it hosts are
reported offline and no longer followed; the dir is probed every interval (a follower that
appends nothing would not notice space returning); once it takes writes they are reported back
and follow their leaders afresh; each change is logged once; a report ZooKeeper refused is
retried, and made again for a new registration."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from strata.common.clock import MockClock
from strata.common.errors import KafkaStorageError
from strata.common.types import TopicPartition
from strata.log import log_dir_failure
from strata.log.log_dir_failure import PROBE_FILE, LogDirFailureChannel
from strata.replication.log_dir_failure_handler import LogDirFailureHandler
from strata.cluster.image import PartitionState

ME = 1
LED = TopicPartition("led", 0)          # this broker leads it
FOLLOWED = TopicPartition("followed", 0)
ELSEWHERE = TopicPartition("elsewhere", 0)   # in the healthy dir


class Logs:
    def __init__(self, full: Path, healthy: Path):
        self.dirs = {LED: full, FOLLOWED: full, ELSEWHERE: healthy}

    def logs_with_dirs(self):
        return [(d, tp, None) for tp, d in self.dirs.items()]


class Fetchers:
    def __init__(self):
        self.following: dict[TopicPartition, tuple[int, int]] = {}
        self.calls: list[tuple[str, object]] = []

    def fetching(self):
        return dict(self.following)

    def remove_partitions(self, tps):
        tps = list(tps)
        self.calls.append(("remove", sorted(tps)))
        for tp in tps:
            self.following.pop(tp, None)

    def add_partitions(self, states):
        self.calls.append(("add", dict(states)))
        self.following.update(states)


class Replicas:
    broker_id = ME

    def __init__(self):
        self.fetchers = Fetchers()
        self.states = {LED: PartitionState(ME, 3, (ME, 2), (ME, 2)),
                       FOLLOWED: PartitionState(2, 5, (2, ME), (2, ME)),
                       ELSEWHERE: PartitionState(2, 1, (2, ME), (2, ME))}

    def state(self, tp):
        return self.states.get(tp)


class Reporter:
    def __init__(self):
        self.epoch = 100
        self.reports: list[tuple[int, frozenset, bool]] = []
        self.refuse = 0

    def registration_epoch(self):
        return self.epoch

    def report_offline_replicas(self, broker_epoch, offline, failed):
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("ZooKeeper away")
        self.reports.append((broker_epoch, offline, failed))


@pytest.fixture
def broker(tmp_path):
    full, healthy = tmp_path / "full", tmp_path / "healthy"
    full.mkdir()
    healthy.mkdir()
    channel = LogDirFailureChannel()
    replicas = Replicas()
    replicas.fetchers.following = {FOLLOWED: (2, 5), ELSEWHERE: (2, 1)}
    reporter = Reporter()
    clock = MockClock()
    handler = LogDirFailureHandler(channel, Logs(full, healthy), replicas, reporter,
                                   probe_interval_ms=1000, clock=clock)
    return handler, channel, replicas, reporter, clock, full


def fail_write(channel: LogDirFailureChannel, d: Path) -> None:
    with pytest.raises(KafkaStorageError):
        with channel.guard(d, "appending records to followed-0"):
            raise OSError(errno.ENOSPC, "No space left on device")


def full_disk(monkeypatch) -> None:
    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(log_dir_failure.os, "write", no_space)


def test_a_failed_dir_is_reported_its_followers_stop_and_a_probe_brings_it_back(
        broker, monkeypatch, caplog):
    handler, channel, replicas, reporter, clock, full = broker
    real_write = os.write
    full_disk(monkeypatch)
    caplog.set_level(logging.INFO, logger="strata.replication.log_dir_failure_handler")
    fail_write(channel, full)
    assert handler.poll() == {LED, FOLLOWED}
    assert reporter.reports == [(100, frozenset({LED, FOLLOWED}), True)]
    assert replicas.fetchers.following == {ELSEWHERE: (2, 1)}   # the healthy dir's still followed
    # nothing is due yet; a probe at the interval fails: still offline, nothing said again
    handler.poll()
    clock.advance_ms(1000)
    assert handler.poll() == {LED, FOLLOWED}
    assert channel.offline_dirs() == {full}
    assert len(reporter.reports) == 1
    # a new leader epoch re-added the follower meanwhile: it is let go again
    replicas.fetchers.following[FOLLOWED] = (3, 6)
    handler.poll()
    assert FOLLOWED not in replicas.fetchers.following
    # space returns: the next due probe writes, fsyncs and removes its file
    monkeypatch.setattr(log_dir_failure.os, "write", real_write)
    clock.advance_ms(999)
    handler.poll()
    assert channel.offline_dirs() == {full}
    clock.advance_ms(1)
    assert handler.poll() == frozenset()
    assert channel.offline_dirs() == frozenset() and not (full / PROBE_FILE).exists()
    assert reporter.reports[-1] == (100, frozenset(), False)
    assert replicas.fetchers.calls[-2:] == [("remove", [FOLLOWED, LED]), ("add", {FOLLOWED: (2, 5)})]
    assert replicas.fetchers.following == {ELSEWHERE: (2, 1), FOLLOWED: (2, 5)}
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("failure_handler")]
    assert sum("failed: its 2 replica(s) are offline" in m for m in lines) == 1
    assert sum("takes writes again" in m for m in lines) == 1
    assert len(reporter.reports) == 2


def test_a_successful_write_brings_the_dir_back_without_waiting_for_a_probe(broker):
    handler, channel, replicas, reporter, clock, full = broker
    fail_write(channel, full)
    handler.poll()
    with channel.guard(full, "appending records to led-0"):
        pass
    assert handler.poll() == frozenset()
    assert reporter.reports[-1] == (100, frozenset(), False)


def test_a_refused_report_is_retried_and_a_new_registration_gets_it_again(broker, monkeypatch):
    handler, channel, replicas, reporter, clock, full = broker
    full_disk(monkeypatch)
    reporter.refuse = 1
    fail_write(channel, full)
    handler.poll()
    assert reporter.reports == []
    handler.poll()
    assert reporter.reports == [(100, frozenset({LED, FOLLOWED}), True)]
    reporter.epoch = 200      # a new session: the controller forgot what was offline
    handler.poll()
    assert reporter.reports[-1] == (200, frozenset({LED, FOLLOWED}), True)
    handler.poll()
    assert len(reporter.reports) == 2


def test_before_registration_nothing_is_reported(broker):
    handler, channel, replicas, reporter, clock, full = broker
    reporter.epoch = -1
    fail_write(channel, full)
    handler.poll()
    assert reporter.reports == []


def test_the_channel_tells_listeners_once_per_change(tmp_path):
    channel = LogDirFailureChannel()
    heard = []
    channel.add_listener(lambda d, online: heard.append((d, online)))
    fail_write(channel, tmp_path)
    fail_write(channel, tmp_path)
    with channel.guard(tmp_path, "x"):
        pass
    with channel.guard(tmp_path, "x"):
        pass
    assert heard == [(tmp_path, False), (tmp_path, True)]
