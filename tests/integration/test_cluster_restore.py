"""Whole-cluster restore (issue 52) on broker processes with a filesystem remote tier: a broker
tiers a topic, a consumer group commits offsets, the broker writes cluster snapshots to the
bucket; its data dir is deleted; ``strata cluster restore`` (the broker's own config, as
``strata serve`` reads it) on an empty data dir recreates the topics from the newest snapshot,
recovers the tiered partitions and commits the group's offsets clamped to what was recovered,
reporting what it could not restore; the restored broker then serves every tiered record at
its offset and the group resumes at its commits."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually
from test_topic_recovery import TOPIC, consume, create, manifest_end, produce
from tiered_support import TIERED_BROKER, offsets

from strata.common.types import uuid_from_kafka_str
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.bucket.snapshot import read_latest
from strata.tiered.storage import FileSystemObjectStore

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402


class _Bucket:
    def __init__(self, root):
        self.store, self.prefix = FileSystemObjectStore(root), ""


def test_a_deleted_broker_is_restored_from_the_buckets_cluster_snapshot(tmp_path):
    root = tmp_path / "bucket"
    bucket = _Bucket(root)
    config = {**TIERED_BROKER, "rsm.config.storage.url": f"file://{root}",
              "strata.remote.manifest.interval.ms": "100",
              "strata.remote.cluster.snapshot.interval.ms": "200"}
    tiered, want = {}, {}
    with BrokerProcess(tmp_path / "a", config) as a:
        create(a, "orders", 2, **TOPIC)
        create(a, "plain", 1)                        # never tiered
        for p in (0, 1):
            assert produce(a, "orders", p, 0, 500) == list(range(500))
        admin = AdminClient({"bootstrap.servers": a.bootstrap})
        md = admin.describe_topics(ck.TopicCollection(["orders"]))["orders"].result(30)
        tid = uuid_from_kafka_str(str(md.topic_id))
        for p in (0, 1):
            t = eventually(lambda: (x := offsets(a.bootstrap, "orders", p))["tiered"] >= 250
                           and x["tiered"], "orders tiered", 60)
            tiered[p] = eventually(lambda: (e := manifest_end(bucket, tid, "orders", p)) >= t
                                   and e, "the manifest lists every copy", 30)
            want[p] = consume(a, "orders", p, 0, tiered[p] + 1)
        c = ck.Consumer({"bootstrap.servers": a.bootstrap, "group.id": "g"})
        c.commit(offsets=[CkTp("orders", 0, 100), CkTp("orders", 1, 499)], asynchronous=False)
        c.close()
        eventually(lambda: (s := read_latest(BucketCatalog(bucket.store, "", "r"))[0]) is not None
                   and dict(((t, p), o) for t, p, o, _ in s.group_offsets.get("g", ())) ==
                   {("orders", 0): 100, ("orders", 1): 499}, "a snapshot with the commits", 30)
    # the broker may have copied more before it stopped: the bucket's manifests say what
    final = {p: manifest_end(bucket, tid, "orders", p) for p in (0, 1)}
    assert all(final[p] >= tiered[p] for p in (0, 1)) and final[1] < 499   # the tail was local
    shutil.rmtree(tmp_path / "a")        # the broker's disk is gone; the bucket stays

    b = BrokerProcess(tmp_path / "b", config)
    command = b.command()
    command[command.index("serve")] = "cluster"
    command.insert(command.index("cluster") + 1, "restore")
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"restored: topic orders (2 partition(s); offsets 0: [0, {final[0] + 1}), " \
           f"1: [0, {final[1] + 1}))" in out, out
    assert "NOT restored: plain: no manifests in the bucket" in out, out
    assert f"orders-1 499 -> {final[1] + 1}" in out, out      # clamped to what was recovered
    assert "NOT restored: ACLs: not in cluster snapshots yet" in out, out

    with b:
        for p in (0, 1):
            assert consume(b, "orders", p, 0, tiered[p] + 1) == want[p]
        assert offsets(b.bootstrap, "plain", 0)["end"] == 0
        c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g",
                         "auto.offset.reset": "error", "enable.auto.commit": False})
        try:
            got = c.committed([CkTp("orders", 0), CkTp("orders", 1)], timeout=30)
            assert [x.offset for x in got] == [100, final[1] + 1]
            c.assign([CkTp("orders", 0, 100)])
            first = eventually(lambda: c.poll(0.5), "the group's next record", 30)
            assert first.error() is None and first.offset() == 100
            assert first.value() == want[0][100][2]
        finally:
            c.close()
    # a second restore into the broker, which now has topics, is refused
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "not an empty broker" in again.stderr + again.stdout
