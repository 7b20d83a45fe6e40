"""The leader's side of the manifests: after its copier and expirer run, it writes the
partition's manifest when something changed, at most once per
``strata.remote.manifest.interval.ms`` per partition (two PUTs each: the manifest and the
pointer), and the topic manifest when the topic's partition count or configs change (the
leader of partition 0 writes it, looking after each of its tasks)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any, Callable, Mapping

from strata.common.types import TopicIdPartition
from strata.tiered.api import RemoteLogMetadataManager
from strata.tiered.bucket.catalog import BucketCatalog
from strata.tiered.bucket.format import SegmentEntry, TopicManifest
from strata.tiered.storage.remote_storage_manager import origin_topic_id

log = logging.getLogger(__name__)

MANIFEST_INTERVAL_MS_CONFIG = "strata.remote.manifest.interval.ms"
DEFAULT_MANIFEST_INTERVAL_MS = 60_000
CLUSTER_LEASE_MS_CONFIG = "strata.remote.cluster.lease.ms"
MANIFESTS_ENABLE_CONFIG = "strata.remote.manifests.enable"


@dataclasses.dataclass
class _State:
    dirty: bool = True          # a new leadership writes its first manifest when due
    last_ms: int = -(2**62)
    log_start: int = -1


class ManifestWriter:
    """``topic_info(topic) -> (topic_id, partitions, configs)`` or None (deleted)."""

    def __init__(self, catalog: BucketCatalog, rlmm: RemoteLogMetadataManager, *,
                 interval_ms: int = DEFAULT_MANIFEST_INTERVAL_MS,
                 now_ms: Callable[[], int],
                 topic_info: Callable[[str], tuple[uuid.UUID, int, Mapping[str, str]] | None]):
        self.catalog = catalog
        self.rlmm = rlmm
        self.interval_ms = interval_ms
        self._now = now_ms
        self._topic_info = topic_info
        self._states: dict[TopicIdPartition, _State] = {}
        self._topics: dict[tuple[str, uuid.UUID], tuple[int, tuple]] = {}
        self.origins: dict[str, tuple[uuid.UUID, ...]] = {}   # recovered topics' lineage
        self._lock = threading.Lock()
        self.manifests_written = 0

    def changed(self, tip: TopicIdPartition) -> None:
        with self._lock:
            self._states.setdefault(tip, _State()).dirty = True

    def check_owner(self) -> None:
        self.catalog.check_owner()

    def maybe_write(self, tip: TopicIdPartition, leader_epoch: int, log_start_offset: int) -> bool:
        """Write the partition's manifest if it changed and the interval since the last one
        passed; whether it wrote. Errors propagate (the state stays dirty)."""
        if tip.partition == 0:
            self.maybe_write_topic(tip.topic, tip.topic_id)   # its configs may have changed
        now = self._now()
        with self._lock:
            st = self._states.setdefault(tip, _State())
            if not st.dirty and st.log_start == log_start_offset:
                return False
            if now - st.last_ms < self.interval_ms:
                return False
            st.dirty = False
        try:
            segments = [SegmentEntry.of(m, origin_topic_id(m.custom_metadata))
                        for m in self.rlmm.list_remote_log_segments(tip)]
            self.catalog.write_partition(tip, leader_epoch, log_start_offset, segments)
        except BaseException:
            with self._lock:
                st.dirty = True
            raise
        with self._lock:
            st.last_ms = now
            st.log_start = log_start_offset
        self.manifests_written += 1
        return True

    def maybe_write_topic(self, topic: str, topic_id: uuid.UUID) -> bool:
        info = self._topic_info(topic)
        if info is None or info[0] != topic_id:
            return False
        _, partitions, configs = info
        fingerprint = (partitions, tuple(sorted(configs.items())))
        if self._topics.get((topic, topic_id)) == fingerprint:
            return False
        self.catalog.write_topic(TopicManifest(
            self.catalog.cluster_id, topic, topic_id, partitions, dict(configs), self._now(),
            self.origins.get(topic, ())))
        self._topics[(topic, topic_id)] = fingerprint
        return True

    def forget(self, tips: Any) -> None:
        with self._lock:
            for tip in tips:
                self._states.pop(tip, None)

    def partition_deleted(self, tip: TopicIdPartition) -> None:
        """The partition's remote data is being removed: its manifests go first, so no
        recovery finds segments that are about to disappear."""
        self.forget([tip])
        self.catalog.delete_partition(tip)
        if tip.partition == 0:
            self.catalog.delete_topic(tip.topic, tip.topic_id)
            self._topics.pop((tip.topic, tip.topic_id), None)
