"""Topic recovery from the bucket (issue 52): how long a recovery of a partition with many
remote segments takes, and whether it depends on the data's size.

    python -m benchmarks.topic_recovery --segments 10000 --rounds 3 [--json PATH]

Setup (not timed): a filesystem bucket (``sync=False``) holding one partition's manifest of
``--segments`` finished segments: the first ``--segments`` - 5 are synthetic entries (10
offsets each; only their manifest entries exist, since a recovery reads no segment's data),
the last five are real segments a real copier uploaded (a log started at the synthetic
segments' end), and a topic manifest. Each round then recovers the topic in a fresh broker's
stack (a new ``TopicBasedRemoteLogMetadataManager`` over an in-memory metadata log, a new
log) and times

- ``plan_s``: listing the topic manifests, reading the partition's pointer and manifest and
  planning (``TopicRecovery.plan``);
- ``apply_s``: publishing every segment's COPY_SEGMENT_STARTED and FINISHED records into the
  remote log metadata, reading the last segment's leader-epoch checkpoint and producer
  snapshot, and starting the log after the recovered end (``TopicRecovery.on_topic_created``);

and checks the log ends where the manifest does. Segment sizes do not enter: what is read is
the manifest (about 220 bytes a segment) and two small indexes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch
from strata.tiered.api import RemoteLogSegmentState
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.bucket.format import SegmentEntry, TopicManifest
from strata.tiered.bucket.recovery import TopicRecovery
from strata.tiered.manager import copier
from strata.tiered.manager.remote_log_manager import PartitionTiering, RemoteLogManager
from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
from strata.tiered.metadata.topic_log import InMemoryMetadataTopicLog
from strata.tiered.storage import FileSystemObjectStore, ObjectStoreRemoteStorageManager

TP = TopicPartition("orders", 0)
CONFIG = {"remote.storage.enable": "true", "internal.segment.bytes": "2048",
          "local.retention.bytes": "1", "index.interval.bytes": "256"}


class Stack:
    """One broker's tiering stack over ``store`` with its own log and metadata."""

    def __init__(self, tmp: Path, store, topic_id: uuid.UUID):
        self.clock = MockClock()
        self.log = UnifiedLog(tmp / "orders-0", LogConfig(CONFIG), clock=self.clock,
                              topic_partition=TP)
        self.rsm = ObjectStoreRemoteStorageManager(store)
        self.rsm.configure({})
        self.rlmm = TopicBasedRemoteLogMetadataManager(InMemoryMetadataTopicLog(), clock=self.clock)
        self.rlmm.configure({"log.dir": str(tmp), "broker.id": 1,
                             "remote.log.metadata.topic.num.partitions": 3})
        self.rlmm.start()
        self.tip = TopicIdPartition(topic_id, TP)
        self.rlm = RemoteLogManager(self.rsm, self.rlmm, broker_id=1, logs=lambda: [self.log],
                                    topic_id=lambda t: topic_id, clock=self.clock)

    def close(self) -> None:
        self.rlm.shutdown()
        self.rlmm.close()
        self.log.close()


def build_bucket(tmp: Path, segments: int) -> FileSystemObjectStore:
    store = FileSystemObjectStore(tmp / "bucket", sync=False)
    origin = Stack(tmp / "origin", store, uuid.uuid4())
    synthetic = segments - 5
    origin.log.truncate_fully_and_start_at(synthetic * 10)
    while True:
        off = origin.log.log_end_offset
        origin.log.append_as_leader(build_batch([SimpleRecord(b"v" * 100, b"k%d" % off,
                                                              timestamp=origin.clock.milliseconds())]), 0)
        origin.log.update_high_watermark(origin.log.log_end_offset)
        if len(origin.log.local_log.segments) > 5:
            break
    part = PartitionTiering(origin.tip, origin.log, origin.rlm.settings)
    origin.rlm._ensure_initialized(part)
    copier.copy_log_segments(origin.rlm.ctx, part)
    real = [SegmentEntry.of(m, None) for m in origin.rlmm.list_remote_log_segments(origin.tip)
            if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    assert len(real) == 5, len(real)
    fake = [SegmentEntry(uuid.uuid4(), i * 10, i * 10 + 9, 1, 1, 1, 1 << 30, {0: i * 10},
                         RemoteLogSegmentState.COPY_SEGMENT_FINISHED, True)
            for i in range(synthetic)]
    cat = BucketCatalog(store, "", "origin-cluster")
    cat.write_partition(origin.tip, 0, 0, fake + real)
    cat.write_topic(TopicManifest("origin-cluster", "orders", origin.tip.topic_id, 1, {}, 0))
    cat.release()
    origin.close()
    return store


def one_round(tmp: Path, store, segments: int) -> dict:
    class Info:
        name, topic_id, partitions = "orders", uuid.uuid4(), 1
        configs = {"strata.remote.recovery": "true"}
    b = Stack(tmp, store, Info.topic_id)
    try:
        recovery = TopicRecovery(BucketCatalog(store, "", f"cluster-{uuid.uuid4().hex[:6]}"),
                                 b.rlmm, b.rsm, broker_id=2, now_ms=b.clock.milliseconds,
                                 get_log=lambda tp: b.log)
        t0 = time.perf_counter()
        plan = recovery.plan("orders")
        t1 = time.perf_counter()
        recovery.on_topic_created(Info)
        t2 = time.perf_counter()
        assert len(plan.partitions[0].segments) == segments
        assert b.log.log_end_offset == plan.partitions[0].end_offset + 1
        recovery.catalog.release()
        return {"plan_s": round(t1 - t0, 3), "apply_s": round(t2 - t1, 3),
                "total_s": round(t2 - t0, 3)}
    finally:
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strata-recovery-bench-") as d:
        tmp = Path(d)
        store = build_bucket(tmp, args.segments)
        manifest_bytes = sum(size for _, size in store.list("_strata/partitions/"))
        rounds = [one_round(tmp / f"round-{i}", store, args.segments) for i in range(args.rounds)]
    result = {"segments": args.segments, "manifest_bytes": manifest_bytes, "rounds": rounds}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
