"""The self-describing bucket (issue 52): the manifest format and its corruption handling, the
atomic pointer, leader-epoch fencing of manifest writes, the cluster marker, coalesced writes
(PUTs per minute), and topic recovery from the manifests into a fresh remote log metadata."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.unified_log import FetchIsolation
from strata.protocol.records import iter_records
from strata.tiered.api import RemoteLogSegmentState
from strata.tiered.bucket import format as fmt
from strata.tiered.bucket.catalog import (
    BucketCatalog, BucketOwnedError, ConditionalWrites, StaleManifestWriterError)
from strata.tiered.bucket.format import (
    ClusterMarker, ManifestError, ManifestVersionError, PartitionManifest, SegmentEntry,
    TopicManifest)
from strata.tiered.bucket.recovery import PartitionPlan, TopicRecovery, plan_partition
from strata.tiered.bucket.writer import ManifestWriter
from strata.tiered.storage import FileSystemObjectStore, MemoryObjectStore
from strata.tiered.storage.remote_storage_manager import origin_custom_metadata
from tiered_env import T0, TIP, TP, TieredEnv

S = RemoteLogSegmentState
TID = uuid.UUID(int=7)
TIP7 = TopicIdPartition(TID, TopicPartition("orders", 0))


def seg(start, end, state=S.COPY_SEGMENT_FINISHED, epochs=None, n=1):
    return SegmentEntry(uuid.UUID(int=1000 + start * 10 + n), start, end, T0 + end, T0, 1,
                        100 * (end - start + 1), epochs or {0: start}, state, True)


def test_partition_manifest_round_trips_with_every_field():
    m = PartitionManifest("cluster-a", "orders", TID, 0, 3, 9, T0, 5,
                          (seg(5, 9), seg(10, 19, epochs={2: 10, 3: 15}),
                           dataclass_replace(seg(20, 29, S.COPY_SEGMENT_STARTED),
                                             object_topic_id=uuid.UUID(int=99))))
    data = m.encode()
    assert data.startswith(b"STRATA-MANIFEST partition v1 crc32c=")
    assert PartitionManifest.decode("k", data) == m
    t = TopicManifest("cluster-a", "orders", TID, 4, {"retention.ms": "100"}, T0, (uuid.UUID(int=3),))
    assert TopicManifest.decode("k", t.encode()) == t
    c = ClusterMarker("cluster-a", T0 + 1, T0)
    assert ClusterMarker.decode("k", c.encode()) == c


def dataclass_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[:-7], "truncated"),
    (lambda d: d[:20], "no STRATA-MANIFEST header"),
    (lambda d: d.replace(b'"endOffset":9', b'"endOffset":8'), "CRC32C"),
    (lambda d: d.replace(b" v1 ", b" v2 ", 1), "newer than this broker's"),
    (lambda d: d.replace(b"partition v1", b"topic v1", 1), "a topic object where a partition"),
    (lambda d: b"", "no STRATA-MANIFEST header"),
])
def test_a_damaged_manifest_is_refused_naming_its_object(damage, reason):
    data = PartitionManifest("c", "orders", TID, 0, 0, 1, T0, 0, (seg(0, 9),)).encode()
    with pytest.raises(ManifestError) as e:
        PartitionManifest.decode("bucket/_strata/partitions/orders-x/0/manifest-1", damage(data))
    assert "bucket/_strata/partitions/orders-x/0/manifest-1" in str(e.value)
    assert reason in str(e.value)


def test_a_newer_format_version_is_its_own_error():
    data = fmt.encode("cluster", {"clusterId": "c", "leaseUntilMs": 1, "writtenMs": 1})
    data = data.replace(b" v1 ", b" v7 ", 1)
    with pytest.raises(ManifestVersionError, match="format version 7"):
        ClusterMarker.decode("m", data)


def test_fields_that_contradict_each_other_are_malformed_not_guessed():
    bad = fmt.encode("partition", {
        "clusterId": "c", "topic": "orders", "topicId": "AAAAAAAAAAAAAAAAAAAABw", "partition": 0,
        "leaderEpoch": 0, "sequence": 1, "writtenMs": T0, "logStartOffset": 0,
        "segments": [{**seg(0, 9).to_json(), "leaderEpochs": [[0, 12]]}]})
    with pytest.raises(ManifestError, match="malformed partition manifest"):
        PartitionManifest.decode("k", bad)


@pytest.fixture(params=["filesystem", "memory"])
def store(request, tmp_path):
    return FileSystemObjectStore(tmp_path / "bucket") if request.param == "filesystem" \
        else MemoryObjectStore()


def test_the_pointer_names_the_newest_manifest_and_the_replaced_one_goes(store):
    cat = BucketCatalog(store, "pre/", "cluster-a", clock=lambda: T0)
    assert cat.read_partition(TIP7) is None
    cat.write_partition(TIP7, 0, 0, [seg(0, 9)])
    first = [k for k, _ in store.list("pre/_strata/partitions/")]
    cat.write_partition(TIP7, 0, 0, [seg(0, 9), seg(10, 19)])
    keys = sorted(k for k, _ in store.list("pre/_strata/partitions/"))
    assert len(keys) == 2 and set(keys) != set(first)      # the pointer and one manifest
    m = cat.read_partition(TIP7)
    assert [s.start_offset for s in m.segments] == [0, 10] and m.sequence == 2


def test_a_stale_leaders_manifest_write_is_refused_and_changes_nothing(store):
    cat = BucketCatalog(store, "", "cluster-a", clock=lambda: T0)
    cat.write_partition(TIP7, 5, 0, [seg(0, 9)])
    before = {k: store.get(k) for k, _ in store.list("_strata/partitions/")}
    with pytest.raises(StaleManifestWriterError, match="leader epoch 5"):
        cat.write_partition(TIP7, 4, 0, [seg(0, 9), seg(10, 19)])
    assert {k: store.get(k) for k, _ in store.list("_strata/partitions/")} == before
    cat.write_partition(TIP7, 5, 0, [seg(0, 9), seg(10, 19)])   # the same epoch may go on
    cat.write_partition(TIP7, 6, 0, [seg(0, 9)])                # a newer one too
    assert cat.read_partition(TIP7).leader_epoch == 6


def test_a_pointer_replaced_between_read_and_write_is_not_overwritten(store):
    cond = ConditionalWrites(store)
    assert cond.put_if("p", b"one", None, existed=False)
    assert not cond.put_if("p", b"two", None, existed=False)     # create-only: exists
    data, token = cond.read("p")
    assert cond.put_if("p", b"three", token, existed=True)
    assert not cond.put_if("p", b"four", token, existed=True)    # the token is stale now
    assert store.get("p") == b"three"


def test_a_corrupted_pointer_or_manifest_is_reported_with_its_key(store):
    cat = BucketCatalog(store, "", "cluster-a", clock=lambda: T0)
    m = cat.write_partition(TIP7, 0, 0, [seg(0, 9)])
    key = cat.manifest_key(TIP7, 0, m.sequence)
    store.put(key, store.get(key)[:-3])
    with pytest.raises(ManifestError, match=key):
        cat.read_partition(TIP7)
    store.put(cat.pointer_key(TIP7), b"garbage")
    with pytest.raises(ManifestError, match=cat.pointer_key(TIP7)):
        cat.read_partition(TIP7)


def test_a_prefix_owned_by_a_live_cluster_is_refused_and_free_after_release_or_lease(store):
    now = [T0]
    a = BucketCatalog(store, "", "cluster-a", lease_ms=10_000, clock=lambda: now[0])
    b = BucketCatalog(store, "", "cluster-b", lease_ms=10_000, clock=lambda: now[0])
    a.write_partition(TIP7, 0, 0, [seg(0, 9)])     # claims the prefix first
    with pytest.raises(BucketOwnedError, match="belongs to cluster cluster-a"):
        b.write_partition(TIP7, 9, 0, [])
    with pytest.raises(BucketOwnedError):
        b.write_topic(TopicManifest("cluster-b", "orders", TID, 1, {}, T0))
    assert a.read_partition(TIP7).cluster_id == "cluster-a"
    now[0] += 11_000                                 # cluster-a stopped renewing
    b.check_owner()
    assert a.marker().cluster_id == "cluster-b"
    a._owned_until = 0
    with pytest.raises(BucketOwnedError, match="cluster-b"):
        a.check_owner()
    b.release()
    a.check_owner()                                  # a clean stop frees it at once
    assert b.marker().cluster_id == "cluster-a"


def test_a_corrupted_cluster_marker_stops_every_write(store):
    cat = BucketCatalog(store, "", "cluster-a", clock=lambda: T0)
    store.put(cat.cluster_key, b"STRATA-MANIFEST cluster v1 crc32c=00000000 length=2\n{}")
    with pytest.raises(ManifestError, match="_strata/cluster"):
        cat.write_partition(TIP7, 0, 0, [])
    assert cat.read_partition(TIP7) is None


class _CountingStore(MemoryObjectStore):
    def __init__(self):
        super().__init__()
        self.puts = 0
        self.keys = []

    def put(self, key, data):
        self.puts += 1
        self.keys.append(key)
        super().put(key, data)


class _Segments:
    """A metadata manager listing ``count`` finished segments of any partition."""

    def __init__(self):
        self.count = 0

    def list_remote_log_segments(self, tip):
        return (dataclass_replace(seg(j * 10, j * 10 + 9), segment_id=uuid.UUID(int=j))
                .metadata(tip, None) for j in range(self.count))


def test_manifest_writes_are_coalesced_to_one_per_interval_per_partition():
    """Three partitions each copying a segment every second for ten minutes: the bucket sees
    one manifest (two PUTs: manifest and pointer) per partition per
    ``strata.remote.manifest.interval.ms`` (60 s), the last one listing every segment."""
    store = _CountingStore()
    clock = MockClock(T0)
    cat = BucketCatalog(store, "", "cluster-a", lease_ms=300_000, clock=clock.milliseconds)
    rlmm = _Segments()
    writer = ManifestWriter(cat, rlmm, interval_ms=60_000, now_ms=clock.milliseconds,
                            topic_info=lambda t: (TID, 1, {}))
    tips = [TopicIdPartition(TID, TopicPartition("orders", p)) for p in range(3)]
    minutes = 10
    for i in range(minutes * 60):
        rlmm.count = i + 1
        for tip in tips:
            writer.changed(tip)
            writer.maybe_write(tip, 0, 0)
        clock.advance_ms(1000)
    assert writer.manifests_written == 3 * minutes
    partition_puts = [k for k in store.keys if k.startswith("_strata/partitions/")]
    assert len(partition_puts) / 3 / minutes == 2.0        # PUTs per partition per minute
    # besides: the topic manifest once, the marker's claim and a renewal every half lease
    assert store.keys.count(cat.cluster_key) == 4
    assert store.puts == len(partition_puts) + 1 + 4
    assert len(cat.read_partition(tips[0]).segments) == 541     # as of the last write (9:00)


def test_nothing_is_written_while_nothing_changes():
    store = _CountingStore()
    clock = MockClock(T0)
    cat = BucketCatalog(store, "", "c", clock=clock.milliseconds)
    writer = ManifestWriter(cat, _Segments(), interval_ms=1000, now_ms=clock.milliseconds,
                            topic_info=lambda t: None)
    assert writer.maybe_write(TIP7, 0, 0)           # a new leadership writes once
    puts = store.puts
    for _ in range(100):
        clock.sleep(5000)
        assert not writer.maybe_write(TIP7, 0, 0)
    assert store.puts == puts
    assert writer.maybe_write(TIP7, 0, 42)          # the log start moved


def test_the_topic_manifest_follows_the_topics_configs_and_partition_count():
    store = MemoryObjectStore()
    clock = MockClock(T0)
    cat = BucketCatalog(store, "", "c", clock=clock.milliseconds)
    topic = {"configs": {"retention.ms": "1000"}, "partitions": 1}
    writer = ManifestWriter(cat, _Segments(), interval_ms=60_000, now_ms=clock.milliseconds,
                            topic_info=lambda t: (TID, topic["partitions"], topic["configs"]))
    writer.maybe_write(TIP7, 0, 0)
    (_, m), = cat.topics_named("orders")
    assert (m.partitions, m.configs, m.topic_id) == (1, {"retention.ms": "1000"}, TID)
    topic.update(configs={"retention.ms": "5"}, partitions=3)
    assert not writer.maybe_write(TIP7, 0, 0)        # no new partition manifest yet...
    (_, m), = cat.topics_named("orders")
    assert (m.partitions, m.configs) == (3, {"retention.ms": "5"})   # ...but the topic's


def test_recovery_keeps_only_what_the_finished_segments_prove():
    plan = PartitionPlan(0, TID)
    plan_partition([seg(0, 9), seg(10, 19, S.COPY_SEGMENT_STARTED), seg(10, 19, n=2),
                    seg(15, 25, n=3), seg(20, 29), seg(40, 49)], 5, plan, TID)
    assert [(s.start_offset, s.end_offset) for s, _ in plan.segments] == [(0, 9), (10, 19), (20, 29)]
    assert plan.log_start_offset == 5 and plan.end_offset == 29
    assert "offsets [30, 39] are in no finished remote segment" in plan.problems[0]
    empty = PartitionPlan(1, TID)
    plan_partition([seg(0, 9, S.DELETE_SEGMENT_STARTED)], 0, empty, TID)
    assert empty.segments == [] and empty.end_offset == -1


def test_the_storage_manager_reads_a_recovered_segment_under_its_origin_topic_id(tmp_path):
    env = TieredEnv(tmp_path)
    try:
        meta = seg(0, 9).metadata(TIP, origin_custom_metadata(TID))
        assert env.rsm.object_key(meta, "log").startswith(f"orders-AAAAAAAAAAAAAAAAAAAABw/0/")
        assert env.rsm.object_key(seg(0, 9).metadata(TIP, None), "log").startswith(
            env.rsm.partition_prefix(TIP))
    finally:
        env.close()


def _records(rlm, ulog, start, end):
    out = {}
    while start <= end:
        data = rlm.read(ulog, start, 100_000, FetchIsolation.HIGH_WATERMARK, True).records
        got = [(r.offset, r.key, r.value) for r in iter_records(data) if r.offset >= start]
        assert got, f"no progress at {start}"
        out.update((o, (k, v)) for o, k, v in got)
        start = got[-1][0] + 1
    return out


def test_a_topic_recovers_from_the_bucket_into_a_fresh_broker(tmp_path):
    """Broker A tiers and writes manifests; its disk is lost. Broker B (a new cluster, the same
    bucket) recovers the topic under a new topic id: every tiered offset reads the same bytes,
    the log start and the local log's start are the bucket's, and B's own copies go on."""
    store = MemoryObjectStore()
    a = TieredEnv(tmp_path / "a", store=store)
    cat_a = BucketCatalog(store, "", "cluster-a", clock=a.clock.milliseconds)
    writer_a = ManifestWriter(cat_a, a.rlmm, interval_ms=0, now_ms=a.clock.milliseconds,
                              topic_info=lambda t: (TIP.topic_id, 1, {"retention.ms": "-1"}))
    a.produce(200)
    assert a.copy() > 3
    writer_a.maybe_write(TIP, 0, a.log.log_start_offset)
    tiered_end = a.log.highest_offset_in_remote_storage
    want = _records(a.rlm, a.log, 0, tiered_end)
    cat_a.release()
    a.close()

    b = TieredEnv(tmp_path / "b", store=store)
    try:
        cat_b = BucketCatalog(store, "", "cluster-b", clock=b.clock.milliseconds)
        writer_b = ManifestWriter(cat_b, b.rlmm, interval_ms=0, now_ms=b.clock.milliseconds,
                                  topic_info=lambda t: (new_id, 1, {}))
        new_id = uuid.UUID(int=0xBEEF)
        recovery = TopicRecovery(cat_b, b.rlmm, b.rsm, broker_id=2, now_ms=b.clock.milliseconds,
                                 get_log=lambda tp: b.log, writer=writer_b)
        plan = recovery.plan("orders")
        assert plan.manifest.partitions == 1 and plan.manifest.configs == {"retention.ms": "-1"}
        assert plan.problems == []

        class Info:
            name, topic_id, partitions = "orders", new_id, 1
            configs = {"strata.remote.recovery": "true"}
        b.rlm._topic_id = lambda topic: new_id
        recovery.on_topic_created(Info)
        assert b.log.log_start_offset == 0 and b.log.log_end_offset == tiered_end + 1
        assert b.log.local_log_start_offset == tiered_end + 1
        assert b.log.highest_offset_in_remote_storage == tiered_end
        new_tip = TopicIdPartition(new_id, TP)
        assert _records(b.rlm, b.log, 0, tiered_end) == want
        # the new leader's own copies go under the new id, beside the recovered ones
        b.part = type(b.part)(new_tip, b.log, b.rlm.settings)
        b.produce(100)
        assert b.copy() > 0
        writer_b.changed(new_tip)
        assert writer_b.maybe_write(new_tip, 0, b.log.log_start_offset)
        m = cat_b.read_partition(new_tip)
        origins = {s.object_topic_id for s in m.segments}
        assert origins == {TIP.topic_id, None}
        assert writer_b.origins["orders"] == (TIP.topic_id,)
    finally:
        b.close()


def test_recovery_reports_an_unreadable_partition_manifest_and_recovers_the_others(tmp_path):
    store = MemoryObjectStore()
    cat = BucketCatalog(store, "", "cluster-a", clock=lambda: T0)
    cat.write_topic(TopicManifest("cluster-a", "orders", TID, 2, {}, T0))
    for p in (0, 1):
        cat.write_partition(TopicIdPartition(TID, TopicPartition("orders", p)), 0, 0, [seg(0, 9)])
    bad = TopicIdPartition(TID, TopicPartition("orders", 1))
    key = cat.manifest_key(bad, 0, 1)
    store.put(key, store.get(key).replace(b'"endOffset":9', b'"endOffset":7'))
    recovery = TopicRecovery(cat, None, None, broker_id=1, now_ms=lambda: T0,
                             get_log=lambda tp: None)
    plan = recovery.plan("orders")
    assert [len(p.segments) for p in plan.partitions] == [1, 0]
    assert any(key in p and "CRC32C" in p for p in plan.problems), plan.problems


def test_recovery_of_a_topic_the_bucket_does_not_hold_is_refused(tmp_path):
    from strata.common.errors import InvalidConfigError
    cat = BucketCatalog(MemoryObjectStore(), "", "c", clock=lambda: T0)
    recovery = TopicRecovery(cat, None, None, broker_id=1, now_ms=lambda: T0, get_log=lambda tp: None)
    with pytest.raises(InvalidConfigError, match="no readable topic manifest of 'ghost'"):
        recovery.plan("ghost")


def test_the_remote_log_manager_writes_the_manifest_after_its_copies_and_refuses_a_foreign_prefix(tmp_path):
    env = TieredEnv(tmp_path)
    try:
        cat = BucketCatalog(env.store, "", "cluster-a", clock=env.clock.milliseconds)
        env.rlm.manifests = ManifestWriter(cat, env.rlmm, interval_ms=60_000,
                                           now_ms=env.clock.milliseconds,
                                           topic_info=lambda t: (TIP.topic_id, 1, {}))
        env.produce(100)
        env.rlm._copy(env.part)
        m = cat.read_partition(TIP)
        copied = [s.end_offset for s in m.segments]
        assert copied and copied[-1] == env.log.highest_offset_in_remote_storage

        other = BucketCatalog(env.store, "", "cluster-b", clock=env.clock.milliseconds)
        env.clock.advance_ms(cat.lease_ms + 1)           # cluster-a's lease ran out...
        other.check_owner()                              # ...and cluster-b took the prefix
        env.produce(100)
        segment_objects = sorted(k for k, _ in env.store.list("orders-"))
        with pytest.raises(BucketOwnedError, match="belongs to cluster cluster-b"):
            env.rlm._copy(env.part)
        with pytest.raises(BucketOwnedError):
            env.rlm._expire(env.part)
        assert sorted(k for k, _ in env.store.list("orders-")) == segment_objects
        assert cat.read_partition(TIP) == m
    finally:
        env.close()


def test_segments_of_later_leader_epochs_recover_onto_a_partition_leading_at_epoch_zero(tmp_path):
    """A bucket written by a cluster (leader epochs 0, 3, 5) recovered on one broker, whose
    partitions lead at epoch 0: every offset reads back, and after new records at epoch 0 the
    recovered ones still do and the new ones are copied after them."""
    store = MemoryObjectStore()
    a = TieredEnv(tmp_path / "a", store=store)
    cat_a = BucketCatalog(store, "", "cluster-a", clock=a.clock.milliseconds)
    writer_a = ManifestWriter(cat_a, a.rlmm, interval_ms=0, now_ms=a.clock.milliseconds,
                              topic_info=lambda t: (TIP.topic_id, 1, {}))
    for epoch, n in ((0, 40), (3, 40), (5, 120)):
        a.produce(n, epoch=epoch)
    a.part = type(a.part)(TIP, a.log, a.rlm.settings, leader_epoch=5)
    assert a.copy() > 3
    writer_a.maybe_write(TIP, 5, 0)
    end = a.log.highest_offset_in_remote_storage
    want = _records(a.rlm, a.log, 0, end)
    cat_a.release()
    a.close()

    b = TieredEnv(tmp_path / "b", store=store)
    try:
        new_id = uuid.UUID(int=0xFACE)
        b.rlm._topic_id = lambda topic: new_id
        recovery = TopicRecovery(BucketCatalog(store, "", "cluster-b", clock=b.clock.milliseconds),
                                 b.rlmm, b.rsm, broker_id=2, now_ms=b.clock.milliseconds,
                                 get_log=lambda tp: b.log)
        recovery.plan("orders")

        class Info:
            name, topic_id, partitions = "orders", new_id, 1
            configs = {"strata.remote.recovery": "true"}
        recovery.on_topic_created(Info)
        assert [tuple(e) for e in b.log.leader_epoch_cache.epoch_entries()] == [(0, 0)]
        assert _records(b.rlm, b.log, 0, end) == want
        b.part = type(b.part)(TopicIdPartition(new_id, TP), b.log, b.rlm.settings)
        b.produce(100, epoch=0)
        assert b.copy() > 0
        got = _records(b.rlm, b.log, 0, b.log.highest_offset_in_remote_storage)
        assert {o: r for o, r in got.items() if o <= end} == want
        assert sorted(got) == list(range(b.log.highest_offset_in_remote_storage + 1))
    finally:
        b.close()


def test_an_unreadable_pointer_is_never_overwritten(store):
    cat = BucketCatalog(store, "", "cluster-a", clock=lambda: T0)
    cat.write_partition(TIP7, 0, 0, [seg(0, 9)])
    store.put(cat.pointer_key(TIP7), b"STRATA-MANIFEST pointer v9 crc32c=00000000 length=0\n")
    with pytest.raises(ManifestVersionError, match=cat.pointer_key(TIP7)):
        cat.write_partition(TIP7, 7, 0, [seg(0, 9), seg(10, 19)])
    assert store.get(cat.pointer_key(TIP7)).startswith(b"STRATA-MANIFEST pointer v9")
