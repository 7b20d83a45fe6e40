"""Topic recovery from the bucket (issue 52) on broker processes with a filesystem remote tier:
a tiered topic is produced to until its segments are remote, the broker is stopped and its
data dir deleted, and a fresh broker (a new cluster) on the same bucket recreates the topic
with ``strata.remote.recovery=true``: every tiered record reads back with confluent-kafka at
its original offset with the same bytes, ListOffsets answers the recovered range, producers
continue after it, and a topic the broker already had is untouched."""

from __future__ import annotations

import shutil
import time

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually
from tiered_support import TIERED_BROKER, offsets

from strata.common.types import TopicIdPartition, TopicPartition, uuid_from_kafka_str
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.storage import FileSystemObjectStore

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(16 * 1024),
         "local.retention.bytes": "1", "segment.index.bytes": "4096", "retention.ms": "-1"}
BASE_TS = int(time.time() * 1000) - 3_600_000


def broker_config(bucket):
    return {**TIERED_BROKER, "rsm.config.storage.url": f"file://{bucket}",
            "strata.remote.manifest.interval.ms": "100"}


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
    cat = BucketCatalog(FileSystemObjectStore(bucket), "", "reader")
    m = cat.read_partition(TopicIdPartition(topic_id, TopicPartition(topic, partition)))
    if m is None or not m.segments:
        return -1
    return max(s.end_offset for s in m.segments if s.state.name == "COPY_SEGMENT_FINISHED")


def test_a_tiered_topic_comes_back_from_the_bucket_on_a_fresh_broker(tmp_path):
    bucket = tmp_path / "bucket"
    tiered, want = {}, {}
    with BrokerProcess(tmp_path / "a", broker_config(bucket)) as a:
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

    with BrokerProcess(tmp_path / "b", broker_config(bucket)) as b:
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
        with BrokerProcess(tmp_path / "c", broker_config(bucket)) as c:
            with pytest.raises(ck.KafkaException, match="belongs to cluster"):
                create(c, "orders", 2, **{"strata.remote.recovery": "true"})
