"""Remote read replicas (issue 52): a topic served read-only from another cluster's bucket by
its partition manifests; follows new uploads at a refresh, never serves an unfinished or
expired segment, never writes to the origin's bucket."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from strata.common.errors import ErrorCode, InvalidConfigError, KafkaError
from strata.common.types import TopicPartition
from strata.log.unified_log import FetchIsolation
from strata.protocol.records import iter_records
from strata.tiered.api import RemoteLogSegmentState, RemoteStorageException
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.bucket.format import SegmentEntry
from strata.tiered.bucket.read_replica import (
    EARLIEST, LATEST, LATEST_TIERED, READ_REPLICA_CONFIG, REFRESH_MS_CONFIG, ReadOnlyObjectStore,
    PartitionView, ReadReplicaManager, origin_url)
from strata.tiered.bucket.writer import ManifestWriter
from strata.tiered.storage import FileSystemObjectStore, MemoryObjectStore
from tiered_env import TIP, TieredEnv


class _Info:
    def __init__(self, name, configs, partitions=1):
        self.name, self.configs, self.partitions = name, configs, partitions


def _bucket_state(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


class _Origin:
    """A tiering broker (TieredEnv) on a filesystem bucket, writing its manifests."""

    def __init__(self, tmp: Path):
        self.root = tmp / "bucket"
        self.root.mkdir(parents=True)
        self.env = TieredEnv(tmp / "origin", store=FileSystemObjectStore(self.root))
        self.catalog = BucketCatalog(self.env.store, "", "origin", clock=self.env.clock.milliseconds)
        self.writer = ManifestWriter(self.catalog, self.env.rlmm, interval_ms=0,
                                     now_ms=self.env.clock.milliseconds,
                                     topic_info=lambda t: (TIP.topic_id, 1, {}))

    def produce_and_tier(self, n: int) -> int:
        self.env.produce(n)
        assert self.env.copy() > 0
        self.writer.changed(TIP)
        assert self.writer.maybe_write(TIP, 0, self.env.log.log_start_offset)
        return self.env.log.highest_offset_in_remote_storage

    def records(self, start: int, end: int) -> dict[int, tuple]:
        out = {}
        while start <= end:
            data = self.env.rlm.read(self.env.log, start, 100_000, FetchIsolation.HIGH_WATERMARK,
                                     True).records
            got = [(r.offset, r.key, r.value, r.timestamp) for r in iter_records(data)
                   if r.offset >= start]
            out.update((o, rest) for o, *rest in got)
            start = got[-1][0] + 1
        return {o: tuple(v) for o, v in out.items() if o <= end}


def _replica_records(mgr: ReadReplicaManager, tp, start: int) -> dict[int, tuple]:
    out = {}
    while True:
        state = mgr.read_state(tp, start)
        assert state.error == ErrorCode.NONE, state
        if state.remote is None:
            return out
        got = state.remote.submit_read(start, 100_000, False, True).result(10)
        recs = [(r.offset, r.key, r.value, r.timestamp) for r in iter_records(got.records)
                if r.offset >= start]
        assert recs, f"no progress at {start}"
        out.update((o, tuple(rest)) for o, *rest in recs)
        start = recs[-1][0] + 1


@pytest.fixture
def origin(tmp_path):
    o = _Origin(tmp_path)
    yield o
    o.env.close()


@pytest.fixture
def replica(tmp_path, origin):
    mgr = ReadReplicaManager({}, tmp_path / "replica", now_ms=origin.env.clock.milliseconds)
    yield mgr
    mgr.close()


def test_a_read_replica_serves_every_tiered_offset_with_the_origins_bytes_and_writes_nothing(
        origin, replica):
    end = origin.produce_and_tier(200)
    want = origin.records(0, end)
    before = _bucket_state(origin.root)
    configs = {READ_REPLICA_CONFIG: str(origin.root)}
    planned = replica.plan("orders", configs)
    assert planned.manifest.partitions == 1
    replica.on_topic_created(_Info("orders", configs))
    tp = TopicPartition("orders", 0)
    assert replica.serves("orders") and not replica.serves("other")
    assert _replica_records(replica, tp, 0) == want
    assert replica.list_offset(tp, EARLIEST).offset == 0
    assert replica.list_offset(tp, LATEST).offset == end + 1
    assert replica.list_offset(tp, LATEST_TIERED).offset == end
    ts = want[50][2]
    hit = replica.list_offset(tp, ts)
    assert hit.offset == min(o for o, v in want.items() if v[2] >= ts)
    assert replica.read_state(tp, end + 2).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert replica.read_state(tp, end + 1).remote is None      # caught up: nothing to read
    replica.refresh_due()
    assert _bucket_state(origin.root) == before                # not one byte written


def test_the_replica_follows_new_uploads_at_its_refresh_and_notifies(origin, replica):
    end = origin.produce_and_tier(100)
    configs = {READ_REPLICA_CONFIG: f"file://{origin.root}", REFRESH_MS_CONFIG: "1000"}
    replica.plan("orders", configs)
    replica.on_topic_created(_Info("orders", configs))
    tp = TopicPartition("orders", 0)
    woken = []
    replica.listeners.append(woken.append)
    new_end = origin.produce_and_tier(100)
    assert new_end > end
    replica.refresh_due()                        # not due yet: the old view
    assert replica.list_offset(tp, LATEST).offset == end + 1
    origin.env.clock.sleep(1000)
    replica.refresh_due()
    assert replica.list_offset(tp, LATEST).offset == new_end + 1 and woken == [tp]
    assert _replica_records(replica, tp, 0) == origin.records(0, new_end)
    pointer_reads = replica.refreshes
    origin.env.clock.sleep(1000)
    replica.refresh_due()                        # nothing new: one pointer read, same view
    assert replica.refreshes == pointer_reads + 1 and woken == [tp]


def test_unfinished_and_expired_segments_are_never_served(origin, replica):
    end = origin.produce_and_tier(200)
    configs = {READ_REPLICA_CONFIG: str(origin.root), REFRESH_MS_CONFIG: "1"}
    replica.plan("orders", configs)
    replica.on_topic_created(_Info("orders", configs))
    tp = TopicPartition("orders", 0)
    manifest = origin.catalog.read_partition(TIP)
    segments = list(manifest.segments)
    first, rest = segments[0], segments[1:]
    started = dataclasses.replace(segments[-1], start_offset=end + 1, end_offset=end + 10,
                                  leader_epochs={0: end + 1},
                                  state=RemoteLogSegmentState.COPY_SEGMENT_STARTED)
    # the origin expires its first segment (log start moves) and starts copying another
    origin.catalog.write_partition(TIP, 0, first.end_offset + 1, rest + [started])
    origin.env.clock.sleep(1)
    replica.refresh_due()
    assert replica.list_offset(tp, EARLIEST).offset == first.end_offset + 1
    assert replica.list_offset(tp, LATEST).offset == end + 1
    assert replica.read_state(tp, 0).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert replica.read_state(tp, end + 1).remote is None
    # a segment deleted before the origin's next manifest: refreshed and refused, not invented
    victim = rest[0]
    for p in origin.root.rglob(f"*{victim.start_offset:020d}-*"):
        p.unlink()
    state = replica.read_state(tp, victim.start_offset)
    with pytest.raises(KafkaError) as err:
        state.remote.submit_read(victim.start_offset, 10_000, False, True).result(10)
    assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR


def test_a_bucket_without_manifests_is_refused_naming_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    mgr = ReadReplicaManager({}, tmp_path / "replica")
    try:
        with pytest.raises(InvalidConfigError, match="has no readable manifest of topic 'orders'"):
            mgr.plan("orders", {READ_REPLICA_CONFIG: str(empty)})
        with pytest.raises(InvalidConfigError, match="exclude each other"):
            mgr.plan("orders", {READ_REPLICA_CONFIG: str(empty), "strata.remote.recovery": "true"})
        with pytest.raises(InvalidConfigError, match="not an absolute path"):
            mgr.plan("orders", {READ_REPLICA_CONFIG: "relative/dir"})
    finally:
        mgr.close()
    assert list(empty.iterdir()) == []
    assert origin_url("/a b") == "file:///a%20b"


def test_the_origins_store_refuses_every_write():
    inner = MemoryObjectStore()
    inner.put("k", b"v")
    ro = ReadOnlyObjectStore(inner, "origin")
    assert ro.get("k") == b"v" and [k for k, _ in ro.list("")] == ["k"]
    for write in (lambda: ro.put("k", b"x"), lambda: ro.delete("k"),
                  lambda: ro.delete_many(["k"]), lambda: ro.put_file("k", "/dev/null")):
        with pytest.raises(RemoteStorageException, match="read-only"):
            write()
    assert inner.get("k") == b"v"


def test_segment_lookup_and_epochs_of_a_view():

    segs = tuple(SegmentEntry(uuid.UUID(int=i + 1), i * 10, i * 10 + 9, 0, 0, 1,
                              100, {i: i * 10}, RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                              True).metadata(TIP, None) for i in range(3))
    view = PartitionView(TIP, 0, 29, segs, 1, 0)
    assert view.segment_for(15).start_offset == 10 and view.segment_for(30) is None
    assert view.epoch_at(25) == 2 and view.epoch_at(29) == 2 and view.next_offset == 30
