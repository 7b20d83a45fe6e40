"""Replication throttles (Kafka's ReplicationQuotaManager, KIP-73).

Two byte-rate bounds per broker, dynamic broker configs as in Kafka: what a leader sends to
followers that are out of sync (``leader.replication.throttled.rate``) and what a follower
fetches while it is catching up (``follower.replication.throttled.rate``). Only the partitions a
topic names are throttled, in its ``leader.replication.throttled.replicas`` /
``follower.replication.throttled.replicas`` (``*`` or ``partition:broker`` pairs; an entry
applies on the broker it names). A replica in sync is never throttled, so throttling slows a
catch-up (a reassignment, a broker coming back) without holding back acks=all.

Thread-safe (the rate is; the callables are read-only).
"""

from __future__ import annotations

from typing import Callable, Mapping

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.config import LONG_MAX, ConfigDef, ConfigType as T, at_least
from strata.common.rate import ByteRateQuota
from strata.common.types import TopicPartition

LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
ALTER_LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
WINDOW_NUM = "replication.quota.window.num"
WINDOW_SIZE_SECONDS = "replication.quota.window.size.seconds"

REPLICATION_QUOTA_CONFIG_DEF = (
    ConfigDef()
    .define(LEADER_THROTTLED_RATE, T.LONG, LONG_MAX, at_least(0),
            "A long representing the upper bound (bytes/sec) on outbound replication traffic "
            "for leader replicas enumerated in the property leader.replication.throttled.replicas "
            "(for each topic). This property can be only set dynamically. It is suggested that "
            "the limit be kept above 1MB/s for accurate behaviour.")
    .define(FOLLOWER_THROTTLED_RATE, T.LONG, LONG_MAX, at_least(0),
            "A long representing the upper bound (bytes/sec) on inbound replication traffic for "
            "follower replicas enumerated in the property follower.replication.throttled.replicas "
            "(for each topic). This property can be only set dynamically. It is suggested that "
            "the limit be kept above 1MB/s for accurate behaviour.")
    .define(ALTER_LOG_DIRS_RATE, T.LONG, LONG_MAX, at_least(0),
            "A long representing the upper bound (bytes/sec) on disk IO used for moving replica "
            "between log directories on the same broker. (Strata moves no replica between log "
            "directories: accepted, with no effect.)")
    .define(WINDOW_NUM, T.INT, 11, at_least(1),
            "The number of samples to retain in memory for replication quotas")
    .define(WINDOW_SIZE_SECONDS, T.INT, 1, at_least(1),
            "The time span of each sample for replication quotas")
)
# kafka-reassign-partitions sets and clears all three on the brokers it moves replicas between
DYNAMIC_REPLICATION_QUOTA_CONFIGS = frozenset({LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE,
                                               ALTER_LOG_DIRS_RATE})


class ReplicationQuota(ByteRateQuota):
    """One direction's bound and which partitions it applies to (``throttled``)."""

    def __init__(self, bytes_per_second: int, throttled: Callable[[TopicPartition], bool], *,
                 window_num: int = 11, window_size_seconds: int = 1,
                 clock: Clock = SYSTEM_CLOCK, description: str = "") -> None:
        # Kafka accepts 0 (nothing passes); the sensor needs a positive bound
        super().__init__(max(1, int(bytes_per_second)), window_num, window_size_seconds,
                         clock=clock, description=description)
        self._throttled = throttled

    def is_throttled(self, tp: TopicPartition) -> bool:
        return not self.unlimited and self._throttled(tp)

    def update_quota(self, bytes_per_second: int) -> None:
        super().update_quota(max(1, int(bytes_per_second)))


def replication_quotas(props: Mapping[str, str], leader_throttled: Callable[[TopicPartition], bool],
                       follower_throttled: Callable[[TopicPartition], bool], *,
                       clock: Clock = SYSTEM_CLOCK) -> tuple[ReplicationQuota, ReplicationQuota]:
    """(leader, follower) quotas from broker properties (static or dynamic)."""
    cfg = {k.name: REPLICATION_QUOTA_CONFIG_DEF.parse_value(k.name, props[k.name])
           if props.get(k.name) not in (None, "") else k.default
           for k in REPLICATION_QUOTA_CONFIG_DEF.keys()}
    window = dict(window_num=cfg[WINDOW_NUM], window_size_seconds=cfg[WINDOW_SIZE_SECONDS], clock=clock)
    return (ReplicationQuota(cfg[LEADER_THROTTLED_RATE], leader_throttled,
                             description="leader replication throttle", **window),
            ReplicationQuota(cfg[FOLLOWER_THROTTLED_RATE], follower_throttled,
                             description="follower replication throttle", **window))
