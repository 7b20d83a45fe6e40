"""Cluster snapshots in the bucket (issue 52): the format, the newest three kept behind a
pointer, an unreadable snapshot reported with its key and an older one used, capture of
topics, committed offsets and quotas, and writes only when something changed."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from strata.common.types import TopicPartition
from strata.tiered.bucket.catalog import BucketCatalog, BucketOwnedError
from strata.tiered.bucket.format import ManifestError
from strata.tiered.bucket.snapshot import (
    ClusterSnapshot, SnapshotWriter, TopicEntry, capture, pointer_key, read_latest,
    write_snapshot)
from strata.tiered.storage import MemoryObjectStore

TID = "AAAAAAAAAAAAAAAAAAAABw"


def snap(ms: int, offset: int = 5) -> ClusterSnapshot:
    return ClusterSnapshot("c1", ms, (TopicEntry("orders", TID, 2, {"retention.ms": "-1"}),),
                           {"g": (("orders", 0, offset, "m"),)},
                           (((("user", "alice"),), {"producer_byte_rate": 1024.0}),))


def test_a_snapshot_round_trips_and_a_damaged_one_names_its_key():
    s = snap(1000)
    assert ClusterSnapshot.decode("k", s.encode()) == s
    data = s.encode()
    with pytest.raises(ManifestError, match="snapshots/x"):
        ClusterSnapshot.decode("_strata/snapshots/x", data[:-3])
    with pytest.raises(ManifestError, match="CRC32C"):
        ClusterSnapshot.decode("k", data.replace(b"alice", b"alicf"))


def test_the_pointer_names_the_newest_and_three_are_kept():
    store = MemoryObjectStore()
    cat = BucketCatalog(store, "p/", "c1")
    for ms in (1000, 2000, 3000, 4000):
        write_snapshot(cat, snap(ms, ms))
    got, problems = read_latest(cat)
    assert got.written_ms == 4000 and got.group_offsets["g"][0][2] == 4000 and problems == []
    assert sorted(k for k, _ in store.list("p/_strata/snapshots/snapshot-")) == [
        f"p/_strata/snapshots/snapshot-{ms:015d}" for ms in (2000, 3000, 4000)]


def test_an_unreadable_newest_snapshot_is_reported_and_the_one_before_is_used():
    store = MemoryObjectStore()
    cat = BucketCatalog(store, "", "c1")
    write_snapshot(cat, snap(1000))
    key = write_snapshot(cat, snap(2000))
    store.put(key, store.get(key)[:-5])              # truncated
    got, problems = read_latest(cat)
    assert got.written_ms == 1000
    assert len(problems) == 1 and key in problems[0] and "truncated" in problems[0]
    store.put(pointer_key(cat), b"garbage")
    got, problems = read_latest(cat)
    assert got.written_ms == 1000 and pointer_key(cat) in problems[0]


def test_no_snapshot_and_a_foreign_prefix():
    store = MemoryObjectStore()
    assert read_latest(BucketCatalog(store, "", "c1")) == (None, [
        "_strata/snapshots/latest: " + str(_missing(store, "_strata/snapshots/latest"))])
    BucketCatalog(store, "", "c1").check_owner()
    with pytest.raises(BucketOwnedError):
        write_snapshot(BucketCatalog(store, "", "c2"), snap(1))
    assert list(store.list("_strata/snapshots/")) == []


def _missing(store, key):
    try:
        store.get(key)
    except Exception as e:  # noqa: BLE001 - the store's own message
        return e


def test_capture_takes_topics_offsets_and_quotas_and_writes_only_changes():
    topics = {"orders": SimpleNamespace(name="orders", topic_id=uuid.UUID(int=7), partitions=2,
                                        configs={"retention.ms": "-1"}, internal=False),
              "__consumer_offsets": SimpleNamespace(name="__consumer_offsets", internal=True,
                                                    topic_id=uuid.UUID(int=8), partitions=50,
                                                    configs={})}
    metadata = SimpleNamespace(topics=lambda: topics, cluster_id="c1")
    committed = {TopicPartition("orders", 0): SimpleNamespace(offset=5, metadata="m"),
                 TopicPartition("orders", 1): SimpleNamespace(offset=-1, metadata="")}
    coordinator = SimpleNamespace(
        list_groups=lambda: SimpleNamespace(groups=[SimpleNamespace(group_id="g"),
                                                    SimpleNamespace(group_id="empty")]),
        fetch_offsets=lambda g: SimpleNamespace(offsets=committed if g == "g" else {}))
    quotas = SimpleNamespace(snapshot=lambda: {(("user", "alice"),): {"producer_byte_rate": 1024.0}})
    got = capture(metadata, coordinator, quotas, 1000)
    assert got == snap(1000)
    store = MemoryObjectStore()
    now = [1000]
    writer = SnapshotWriter(BucketCatalog(store, "", "c1"),
                            lambda: capture(metadata, coordinator, quotas, now[0]))
    assert writer.run() is True
    now[0] = 2000
    assert writer.run() is False                     # nothing changed: no PUT
    committed[TopicPartition("orders", 0)] = SimpleNamespace(offset=9, metadata="m")
    assert writer.run() is True and writer.written == 2
    assert read_latest(writer.catalog)[0].group_offsets["g"] == (("orders", 0, 9, "m"),)
