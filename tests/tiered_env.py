"""A tiered log for unit tests: a UnifiedLog of small segments, a memory remote tier, the
topic-based RLMM over an in-memory metadata log, the index cache and a RemoteLogManager whose
pools are not driven (copies run inline through ``copy``), all on a mock clock."""

from __future__ import annotations

import uuid
from pathlib import Path

from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch
from strata.tiered.manager import copier
from strata.tiered.manager.remote_index_cache import RemoteIndexCache
from strata.tiered.manager.remote_log_manager import PartitionTiering, RemoteLogManager, TieringSettings
from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
from strata.tiered.metadata.topic_log import InMemoryMetadataTopicLog
from strata.tiered.storage import MemoryObjectStore, ObjectStore, ObjectStoreRemoteStorageManager

T0 = 1_700_000_000_000
TOPIC_ID = uuid.UUID(int=0xC0FFEE)
TP = TopicPartition("orders", 0)
TIP = TopicIdPartition(TOPIC_ID, TP)
SMALL_SEGMENTS = {"remote.storage.enable": "true", "internal.segment.bytes": "2048",
                  "local.retention.bytes": "1", "index.interval.bytes": "256"}


class TieredEnv:
    """``log`` (topic ``orders``, tiered, ~2 KiB segments; ``log_props`` override its
    config), ``store`` (a MemoryObjectStore unless given), ``rsm``, ``rlmm``, ``cache``,
    ``rlm`` (``settings``) and ``part``, the log's PartitionTiering."""

    def __init__(self, tmp: Path, *, store: ObjectStore | None = None,
                 settings: TieringSettings | None = None, log_props: dict | None = None,
                 clock: MockClock | None = None, topic_log: InMemoryMetadataTopicLog | None = None,
                 broker_id: int = 1, leader_epoch_of=None) -> None:
        """``topic_log`` and ``store`` shared make brokers of one cluster; ``leader_epoch_of``
        is the RemoteLogManager's (None: the log is led)."""
        self.clock = clock or MockClock(T0)
        self.log = UnifiedLog(tmp / "orders-0", LogConfig({**SMALL_SEGMENTS, **(log_props or {})}),
                              clock=self.clock, topic_partition=TP)
        self.store = store if store is not None else MemoryObjectStore()
        self.rsm = ObjectStoreRemoteStorageManager(self.store)
        self.rsm.configure({})
        self.topic_log = topic_log if topic_log is not None else InMemoryMetadataTopicLog()
        self.rlmm = TopicBasedRemoteLogMetadataManager(self.topic_log, clock=self.clock)
        self.rlmm.configure({"log.dir": str(tmp), "broker.id": broker_id,
                             "remote.log.metadata.topic.num.partitions": 3})
        self.rlmm.start()
        self.cache = RemoteIndexCache(self.rsm, tmp, 1 << 20)
        self.rlm = RemoteLogManager(self.rsm, self.rlmm, broker_id=broker_id, logs=self.logs,
                                    topic_id=self.topic_id, settings=settings or TieringSettings(),
                                    index_cache=self.cache, clock=self.clock,
                                    leader_epoch_of=leader_epoch_of)
        epoch = leader_epoch_of(TP) if leader_epoch_of is not None else 0
        self.part = PartitionTiering(TIP, self.log, self.rlm.settings, leader_epoch=epoch or 0)

    def logs(self) -> list[UnifiedLog]:
        return [self.log]

    def topic_id(self, topic: str) -> uuid.UUID | None:
        return TOPIC_ID if topic == "orders" else None

    def produce(self, n: int, ts: int | None = None, size: int = 100,
                ulog: UnifiedLog | None = None, epoch: int = 0) -> None:
        """``n`` single-record batches (value ``<offset>-`` repeated, at most ``size`` bytes)
        at leader epoch ``epoch``, committed."""
        ulog = ulog or self.log
        for _ in range(n):
            off = ulog.log_end_offset
            value = (b"%d-" % off) * (size // 4)
            ulog.append_as_leader(build_batch([SimpleRecord(
                value[:size], b"k%d" % off, timestamp=ts or self.clock.milliseconds())]), epoch)
            ulog.update_high_watermark(ulog.log_end_offset)

    def copy(self) -> int:
        self.rlm._ensure_initialized(self.part)
        return copier.copy_log_segments(self.rlm.ctx, self.part)

    def close(self) -> None:
        self.rlm.shutdown()
        self.cache.close()
        self.rlmm.close()
        self.rsm.close()
