"""Topic recovery from the bucket (issue 52) on broker processes with a filesystem remote tier
and with an S3 API server (moto, through obstore):
a tiered topic is produced to until its segments are remote, the broker is stopped and its
data dir deleted, and a fresh broker (a new cluster) on the same bucket recreates the topic
with ``strata.remote.recovery=true``: every tiered record reads back with confluent-kafka at
its original offset with the same bytes, ListOffsets answers the recovered range, producers
continue after it, and a topic the broker already had is untouched."""

from __future__ import annotations

import shutil
import time
import uuid

import pytest

from broker_process import BrokerProcess
from s3_server import S3Server
from support.waiting import eventually
from tiered_support import TIERED_BROKER, offsets

from strata.common.types import TopicIdPartition, TopicPartition, uuid_from_kafka_str
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.storage import FileSystemObjectStore, object_store_from_config

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(16 * 1024),
         "local.retention.bytes": "1", "segment.index.bytes": "4096", "retention.ms": "-1"}
BASE_TS = int(time.time() * 1000) - 3_600_000


class Bucket:
    """A remote tier: the brokers' ``rsm.config.*`` keys and a store to look into it."""

    def __init__(self, rsm_configs: dict, store, prefix: str = ""):
        self.rsm_configs = rsm_configs
        self.store = store
        self.prefix = prefix

    def broker_config(self) -> dict[str, str]:
        return {**TIERED_BROKER, **{f"rsm.config.{k}": str(v) for k, v in self.rsm_configs.items()},
                "strata.remote.manifest.interval.ms": "100"}


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


@pytest.fixture(params=["filesystem", "s3"])
def bucket(request, tmp_path):
    if request.param == "filesystem":
        root = tmp_path / "bucket"
        return Bucket({"storage.url": f"file://{root}"}, FileSystemObjectStore(root))
    s3 = request.getfixturevalue("s3")
    prefix = f"t-{uuid.uuid4().hex[:8]}/"
    return Bucket(s3.rsm_configs(prefix=prefix), object_store_from_config(s3.storage_configs()),
                  prefix)


def create(b, topic, partitions, **configs):
    admin = AdminClient({"bootstrap.servers": b.bootstrap})   # outlives its future
    return admin.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(30)


def produce(b, topic, partition, start, n) -> list[int]:
    """``n`` records numbered from ``start``; the offsets they were written at."""
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "batch.size": 4096})
    written = []

    def done(err, msg):
        assert err is None, err
        written.append(msg.offset())
    for i in range(start, start + n):
        p.produce(topic, key=f"k{partition}-{i}".encode(), value=(f"v{i}-".encode() * 50)[:200],
                  partition=partition, timestamp=BASE_TS + i, headers=[("i", str(i).encode())],
                  on_delivery=done)
        p.poll(0)
    assert p.flush(30) == 0
    return sorted(written)


def consume(b, topic, partition, start, count):
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                     "auto.offset.reset": "error"})
    c.assign([CkTp(topic, partition, start)])
    out = []
    try:
        def more():
            for m in c.consume(500, 0.5):
                assert m.error() is None, m.error()
                out.append((m.offset(), m.key(), m.value(), m.timestamp(), m.headers()))
            return len(out) >= count
        eventually(more, f"{count} records of {topic}-{partition} from {start}", 60)
    finally:
        c.close()
    return out[:count]


def manifest_end(bucket, topic_id, topic, partition) -> int:
    cat = BucketCatalog(bucket.store, bucket.prefix, "reader")
    m = cat.read_partition(TopicIdPartition(topic_id, TopicPartition(topic, partition)))
    if m is None or not m.segments:
        return -1
    # a manifest may hold only segments still being copied (COPY_SEGMENT_STARTED)
    return max((s.end_offset for s in m.segments if s.state.name == "COPY_SEGMENT_FINISHED"),
               default=-1)


def test_a_tiered_topic_comes_back_from_the_bucket_on_a_fresh_broker(tmp_path, bucket):
    tiered, want = {}, {}
    with BrokerProcess(tmp_path / "a", bucket.broker_config()) as a:
        create(a, "orders", 2, **TOPIC)
        for p in (0, 1):
            assert produce(a, "orders", p, 0, 500) == list(range(500))
        for p in (0, 1):
            o = eventually(lambda: (x := offsets(a.bootstrap, "orders", p))["tiered"] >= 250
                           and x["local_start"] > 250 and x, "orders tiered", 60)
            tiered[p] = o["tiered"]
        admin = AdminClient({"bootstrap.servers": a.bootstrap})
        md = admin.describe_topics(ck.TopicCollection(["orders"]))["orders"].result(30)
        tid = uuid_from_kafka_str(str(md.topic_id))
        for p in (0, 1):
            # the manifest catches up with the copies within an interval
            tiered[p] = eventually(lambda: (e := manifest_end(bucket, tid, "orders", p)) >= tiered[p]
                                   and e, "the manifest lists every copy", 30)
            want[p] = consume(a, "orders", p, 0, tiered[p] + 1)
    shutil.rmtree(tmp_path / "a")      # the broker's disk is gone; the bucket stays

    with BrokerProcess(tmp_path / "b", bucket.broker_config()) as b:
        create(b, "other", 1, **TOPIC)
        assert produce(b, "other", 0, 0, 100) == list(range(100))
        other = consume(b, "other", 0, 0, 100)

        create(b, "orders", 2, **{"strata.remote.recovery": "true"})
        for p in (0, 1):
            end = tiered[p]
            o = offsets(b.bootstrap, "orders", p)
            assert o == {"start": 0, "local_start": end + 1, "end": end + 1, "tiered": end}, o
            assert consume(b, "orders", p, 0, end + 1) == want[p]
            # producers continue after the recovered end, and those records read back too
            assert produce(b, "orders", p, 10_000, 50) == list(range(end + 1, end + 51))
            got = consume(b, "orders", p, end - 9, 60)
            assert got[:10] == want[p][-10:]
            assert [(r[0], r[1]) for r in got[10:]] == [
                (end + 1 + j, f"k{p}-{10_000 + j}".encode()) for j in range(50)]
        assert consume(b, "other", 0, 0, 100) == other
        assert offsets(b.bootstrap, "other", 0)["end"] == 100
        # a name the bucket does not hold is refused, saying why
        with pytest.raises(ck.KafkaException, match="no readable topic manifest"):
            create(b, "ghost", 1, **{"strata.remote.recovery": "true"})
        assert "recovered orders-1 from the bucket" in b.output()

        # a second cluster on the bucket while this one lives: refused, naming the owner
        with BrokerProcess(tmp_path / "c", bucket.broker_config()) as c:
            with pytest.raises(ck.KafkaException, match="belongs to cluster"):
                create(c, "orders", 2, **{"strata.remote.recovery": "true"})


def test_manifest_fencing_on_the_s3_api_server_uses_conditional_puts(s3):
    """On S3 the pointer is replaced with If-Match: a writer whose read of the pointer is stale
    loses, a lower leader epoch is refused, and a second cluster cannot claim a leased prefix."""
    from strata.tiered.bucket.catalog import (
        BucketOwnedError, ConditionalWrites, StaleManifestWriterError)
    from strata.tiered.bucket.format import SegmentEntry
    from strata.tiered.api import RemoteLogSegmentState
    store = object_store_from_config(s3.storage_configs())
    prefix = f"t-{uuid.uuid4().hex[:8]}/"
    cat = BucketCatalog(store, prefix, "cluster-a")
    assert cat.cond.atomic
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition("orders", 0))
    entry = SegmentEntry(uuid.uuid4(), 0, 9, 1, 1, 1, 100, {0: 0},
                         RemoteLogSegmentState.COPY_SEGMENT_FINISHED, True)
    cat.write_partition(tip, 4, 0, [entry])
    _, stale_token, _ = cat.read_pointer(tip)
    cat.write_partition(tip, 5, 0, [entry])
    assert not ConditionalWrites(store).put_if(cat.pointer_key(tip), b"x", stale_token, True)
    with pytest.raises(StaleManifestWriterError, match="leader epoch 5"):
        cat.write_partition(tip, 4, 0, [])
    assert cat.read_partition(tip).leader_epoch == 5
    assert len(cat.read_partition(tip).segments) == 1
    with pytest.raises(BucketOwnedError, match="cluster-a"):
        BucketCatalog(store, prefix, "cluster-b").check_owner()
