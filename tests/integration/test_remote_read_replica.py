"""Remote read replicas (issue 52) on broker processes with a filesystem remote tier: an origin
broker tiers a topic (small segments, manifests every 100 ms); a second broker with its own
data dir and no tier of its own creates the topic with ``strata.remote.readreplica`` pointing at
the origin's remote dir and serves it read-only: confluent-kafka reads the same records at the
same offsets as from the origin, follows the origin's new uploads, is refused Produce and
DeleteRecords, and the replica never writes to the origin's bucket. The same on the S3 API
server (moto, through obstore)."""

from __future__ import annotations

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually
from test_topic_recovery import (  # noqa: F401 - the bucket fixtures (filesystem, S3 API)
    TOPIC, bucket, consume, create, manifest_end, produce, s3)
from tiered_support import offsets

from strata.common.types import uuid_from_kafka_str
from strata.tiered.bucket.catalog import BucketCatalog

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

POLICY_VIOLATION = 44


def _wait_tiered(origin, bucket, tid, at_least: int) -> int:
    tiered = eventually(lambda: (x := offsets(origin.bootstrap, "orders", 0))["tiered"] >= at_least
                        and x["tiered"], "orders tiered on the origin", 60)
    return eventually(lambda: (e := manifest_end(bucket, tid, "orders", 0)) >= tiered and e,
                      "the origin's manifest lists its copies", 30)


def test_a_read_replica_on_a_second_broker_serves_and_follows_the_origin(tmp_path, bucket):
    # the replica broker has no tier of its own; its rsm.config.* (endpoint, credentials)
    # apply to the origin's store
    url = bucket.rsm_configs["storage.url"]
    replica_config = {f"rsm.config.{k}": str(v) for k, v in bucket.rsm_configs.items()
                      if k not in ("storage.url", "key.prefix")}
    replica_topic = {"strata.remote.readreplica": url,
                     "strata.remote.readreplica.key.prefix": bucket.prefix}
    with BrokerProcess(tmp_path / "origin", bucket.broker_config()) as a, \
            BrokerProcess(tmp_path / "replica", replica_config) as b:
        create(a, "orders", 1, **TOPIC)
        assert produce(a, "orders", 0, 0, 400) == list(range(400))
        admin_a = AdminClient({"bootstrap.servers": a.bootstrap})
        md = admin_a.describe_topics(ck.TopicCollection(["orders"]))["orders"].result(30)
        tid = uuid_from_kafka_str(str(md.topic_id))
        end = _wait_tiered(a, bucket, tid, 200)

        # a bucket (or a topic) without manifests is refused, saying so
        with pytest.raises(ck.KafkaException, match="has no readable manifest of topic 'ghost'"):
            create(b, "ghost", 1, **replica_topic)
        create(b, "orders", 1, **replica_topic, **{"strata.remote.readreplica.refresh.ms": "200"})
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topics = admin.list_topics("orders", 30).topics
        assert list(topics["orders"].partitions) == [0]
        seen = eventually(lambda: (o := offsets(b.bootstrap, "orders", 0))["end"] > end and o,
                          "the replica serves the tiered offsets", 30)
        assert seen["start"] == 0 and seen["tiered"] == seen["end"] - 1
        served = seen["end"] - 1
        assert consume(b, "orders", 0, 0, served + 1) == consume(a, "orders", 0, 0, served + 1)

        # the origin goes on; the replica follows its uploads
        assert produce(a, "orders", 0, 400, 400) == list(range(400, 800))
        new_end = _wait_tiered(a, bucket, tid, served + 200)
        eventually(lambda: offsets(b.bootstrap, "orders", 0)["end"] >= new_end + 1,
                   "the replica follows the origin's new uploads", 30)
        assert consume(b, "orders", 0, served - 5, new_end - served + 6) == \
            consume(a, "orders", 0, served - 5, new_end - served + 6)

        # the PySpark source's planning and reading (what its executors run), through Fetch
        from strata.spark.options import parse_source_options
        from strata.spark.source import plan_read, read_task
        options = {"kafka.bootstrap.servers": b.bootstrap, "subscribe": "orders",
                   "endingOffsets": "latest"}
        tasks = plan_read(options)
        assert [(t.partition, t.start) for t in tasks] == [(0, 0)]
        planned_end = tasks[0].end          # the replica's end then (it keeps following)
        assert planned_end >= new_end + 1
        opts = parse_source_options(options, streaming=False)
        rows = [(o, k, v) for t in tasks for batch in read_task(t, opts)
                for o, k, v in zip(batch.column("offset").to_pylist(),
                                   batch.column("key").to_pylist(),
                                   batch.column("value").to_pylist())]
        assert rows == [(r[0], r[1], r[2]) for r in consume(a, "orders", 0, 0, planned_end)]

        # read-only: Produce and DeleteRecords refused with POLICY_VIOLATION and a message
        errors = []
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "retries": 0})
        p.produce("orders", b"x", partition=0, on_delivery=lambda err, m: errors.append(err))
        p.flush(30)
        assert [e.code() for e in errors] == [ck.KafkaError.POLICY_VIOLATION]
        fut = admin.delete_records([CkTp("orders", 0, 10)])[CkTp("orders", 0, 10)]
        with pytest.raises(ck.KafkaException) as err:
            fut.result(30)
        assert err.value.args[0].code() == POLICY_VIOLATION
        assert offsets(b.bootstrap, "orders", 0)["start"] == 0
        assert "orders is a read replica of topic orders" in b.output()

        # nothing of the replica's in the origin's bucket: the marker is the origin's
        replica_id = admin.describe_cluster().result(30).cluster_id
        marker = BucketCatalog(bucket.store, bucket.prefix, "reader").marker()
        assert marker is not None and marker.cluster_id != replica_id
