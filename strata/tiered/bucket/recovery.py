"""Topic recovery: a topic created with ``strata.remote.recovery=true`` takes its partitions,
remote segments and log start from the bucket's manifests of the topic of that name.

``plan`` (before the topic is created) reads the newest readable topic manifest and every
partition's manifest, and decides per partition what the remote tier proves: the
COPY_SEGMENT_FINISHED segments from the manifest's log start offset on, without a gap. What
cannot be read (a missing, truncated, corrupted or newer-format manifest) is reported with the
object's key and left out; nothing is guessed. ``apply`` (once the topic's logs exist) publishes
those segments into the remote log metadata under the new topic id, each carrying its origin
topic id (``origin_custom_metadata``) so the storage manager reads the objects where they are,
then starts each local log empty after the last recovered offset with the leader epochs and
producer state uploaded with the last segment (as a follower rebuilding from the remote tier).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any, Callable

from strata.common.errors import InvalidConfigError
from strata.common.types import TopicIdPartition, TopicPartition
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.log.checkpoint import decode_epoch_entries
from strata.log.leader_epoch import EpochEntry
from strata.tiered.api import (
    IndexType, RemoteLogMetadataManager, RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState,
    RemoteStorageException, RemoteStorageManager)
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.bucket.format import ManifestError, SegmentEntry, TopicManifest
from strata.tiered.storage.remote_storage_manager import origin_custom_metadata

log = logging.getLogger(__name__)

RECOVERY_CONFIG = "strata.remote.recovery"


@dataclasses.dataclass
class PartitionPlan:
    partition: int
    origin_topic_id: uuid.UUID                 # the topic id of the manifest read
    log_start_offset: int = 0
    segments: list[tuple[SegmentEntry, uuid.UUID]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def end_offset(self) -> int:
        """The last recovered offset (-1: nothing)."""
        return self.segments[-1][0].end_offset if self.segments else -1


@dataclasses.dataclass
class RecoveryPlan:
    topic: str
    manifest: TopicManifest
    partitions: list[PartitionPlan]
    problems: list[str]


def plan_partition(manifest_segments: list[SegmentEntry], log_start: int, plan: PartitionPlan,
                   own_topic_id: uuid.UUID) -> None:
    """Keep the finished segments that cover [log start, end] without a gap."""
    finished = sorted((s for s in manifest_segments
                       if s.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED),
                      key=lambda s: (s.start_offset, -s.end_offset))
    covered = None      # last offset covered so far
    for s in finished:
        if s.end_offset < log_start or (covered is not None and s.end_offset <= covered):
            continue
        first = max(log_start, s.start_offset) if covered is None else covered + 1
        if s.start_offset > first:
            plan.problems.append(
                f"partition {plan.partition}: offsets [{first}, {s.start_offset - 1}] are in "
                f"no finished remote segment; recovered up to {covered if covered is not None else 'nothing'}")
            break
        if covered is not None and s.start_offset <= covered:
            # another lineage's copy overlapping the last: only one copy per offset is kept
            continue
        plan.segments.append((s, s.object_topic_id or own_topic_id))
        covered = s.end_offset
    if plan.segments:
        plan.log_start_offset = max(log_start, plan.segments[0][0].start_offset)


class TopicRecovery:
    """``get_log(tp)``: the broker's log of a partition (None if not hosted)."""

    def __init__(self, catalog: BucketCatalog, rlmm: RemoteLogMetadataManager,
                 rsm: RemoteStorageManager, *, broker_id: int, now_ms: Callable[[], int],
                 get_log: Callable[[TopicPartition], Any], writer: Any = None,
                 leader_epoch_of: Callable[[TopicPartition], int] = lambda tp: 0):
        """``leader_epoch_of``: the new partition's leader epoch (0 on one broker)."""
        self.catalog = catalog
        self.rlmm = rlmm
        self.rsm = rsm
        self.broker_id = broker_id
        self._now = now_ms
        self._get_log = get_log
        self._writer = writer
        self._leader_epoch_of = leader_epoch_of
        self._plans: dict[str, RecoveryPlan] = {}
        self._lock = threading.Lock()

    # ---- before the topic exists

    def plan(self, topic: str) -> RecoveryPlan:
        """What the bucket proves of ``topic``; InvalidConfigError when nothing can be
        recovered (no readable topic manifest) or the prefix belongs to another live cluster."""
        try:
            found = self.catalog.topics_named(topic)
        except RemoteStorageException as e:
            raise InvalidConfigError(f"{RECOVERY_CONFIG}: cannot list the bucket: {e}") from e
        problems = [str(m) for _, m in found if isinstance(m, ManifestError)]
        manifests = [m for _, m in found if isinstance(m, TopicManifest)]
        if not manifests:
            raise InvalidConfigError(
                f"{RECOVERY_CONFIG}: no readable topic manifest of {topic!r} under "
                f"{self.catalog.prefix}_strata/topics/{topic}/"
                + (f" ({'; '.join(problems)})" if problems else ""))
        try:
            self.catalog.check_owner()
        except RemoteStorageException as e:
            raise InvalidConfigError(f"{RECOVERY_CONFIG}: {e}") from e
        manifest = manifests[0]
        parts = []
        for p in range(manifest.partitions):
            tip = TopicIdPartition(manifest.topic_id, TopicPartition(topic, p))
            pp = PartitionPlan(p, manifest.topic_id)
            try:
                pm = self.catalog.read_partition(tip)
            except (ManifestError, RemoteStorageException) as e:
                pp.problems.append(f"partition {p}: {e}")
                pm = None
            if pm is not None:
                plan_partition(list(pm.segments), pm.log_start_offset, pp, manifest.topic_id)
            elif not pp.problems:
                pp.problems.append(f"partition {p}: no manifest ({self.catalog.pointer_key(tip)} "
                                   "does not exist): nothing of it was tiered")
            parts.append(pp)
        plan = RecoveryPlan(topic, manifest, parts,
                            problems + [x for pp in parts for x in pp.problems])
        with self._lock:
            self._plans[topic] = plan
        for problem in plan.problems:
            log.error("recovery of %s: %s", topic, problem)
        return plan

    # ---- once the topic's logs exist

    def on_topic_created(self, info: Any) -> None:
        """Apply the plan made for ``info.name`` (the metadata listener's call, after the
        topic's logs were made)."""
        if str(info.configs.get(RECOVERY_CONFIG, "")).strip().lower() != "true":
            return
        with self._lock:
            plan = self._plans.pop(info.name, None)
        if plan is None:
            log.error("recovery of %s: no plan was made before the topic was created", info.name)
            return
        if self._writer is not None:
            origin = plan.manifest.origin_topic_ids + (plan.manifest.topic_id,)
            self._writer.origins[info.name] = origin
        for pp in plan.partitions:
            if pp.partition >= info.partitions:
                continue
            tp = TopicPartition(info.name, pp.partition)
            ulog = self._get_log(tp)
            if ulog is None:
                log.warning("recovery of %s: not hosted on this broker", tp)
                continue
            try:
                self.apply_partition(TopicIdPartition(info.topic_id, tp), ulog, pp,
                                     self._leader_epoch_of(tp))
            except Exception:  # noqa: BLE001 - the other partitions still recover
                log.exception("recovery of %s failed", tp)

    def apply_partition(self, tip: TopicIdPartition, ulog: Any, pp: PartitionPlan,
                        leader_epoch: int = 0) -> None:
        """Publish ``pp``'s segments under ``tip`` and start the log after them. Segments
        written at leader epochs above ``leader_epoch`` (the new partition's, which its new
        records carry) are published as of ``leader_epoch`` from the log start on: the log's
        epochs must not run backwards, and reads find a segment by the epoch the log gives
        its offset. The record batches keep the epochs they were written with."""
        if not pp.segments:
            return
        remap = max(e for s, _ in pp.segments for e in s.leader_epochs) > leader_epoch
        self.rlmm.on_partition_leadership_changes({tip}, set())
        self.rlmm.wait_ready(tip, 30)
        last = None
        for entry, origin in pp.segments:
            meta = entry.metadata(tip, None)
            if remap:
                meta = dataclasses.replace(meta, segment_leader_epochs={leader_epoch: entry.start_offset})
            self.rlmm.add_remote_log_segment_metadata(meta).result()
            custom = origin_custom_metadata(origin)
            self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                meta.remote_log_segment_id, self._now(), custom,
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, self.broker_id)).result()
            last = meta.create_with_updates(RemoteLogSegmentMetadataUpdate(
                meta.remote_log_segment_id, self._now(), custom,
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, self.broker_id))
        assert last is not None
        if remap:
            epochs = [EpochEntry(leader_epoch, pp.log_start_offset)]
            log.warning("%s: recovered segments were written at leader epochs up to %d, above "
                        "the new partition's %d; their metadata records them at epoch %d",
                        tip.topic_partition,
                        max(e for s, _ in pp.segments for e in s.leader_epochs), leader_epoch,
                        leader_epoch)
        else:
            with self.rsm.fetch_index(last, IndexType.LEADER_EPOCH) as f:
                epochs = decode_epoch_entries(f.read(),
                                              f"leader epochs of {last.remote_log_segment_id.id}")
        try:
            with self.rsm.fetch_index(last, IndexType.PRODUCER_SNAPSHOT) as f:
                snapshot = f.read()
        except Exception as exc:  # noqa: BLE001 - as a rebuilding follower, without it
            log.warning("%s: no producer snapshot with remote segment %s (%s)", tip,
                        kafka_uuid_str(last.remote_log_segment_id.id), exc)
            snapshot = None
        next_offset = pp.end_offset + 1
        ulog.truncate_fully_and_start_after_remote(next_offset, pp.log_start_offset, epochs, snapshot)
        ulog.update_highest_offset_in_remote_storage(pp.end_offset)
        if self._writer is not None:
            self._writer.changed(tip)
        log.info("recovered %s from the bucket: %d remote segment(s), offsets [%d, %d] (topic id "
                 "%s in the bucket); the log continues at %d", tip.topic_partition,
                 len(pp.segments), pp.log_start_offset, pp.end_offset,
                 kafka_uuid_str(pp.origin_topic_id), next_offset)
