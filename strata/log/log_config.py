"""Per-topic log configuration with Kafka's names, defaults and validation (LogConfig).

Broker-wide defaults (``log.segment.bytes`` and friends) are mapped onto these names by the
broker; this module knows only the topic-level keys.
"""

from __future__ import annotations

import re
from typing import Any

from strata.common.config import (
    LONG_MAX, AbstractConfig, ConfigDef, ConfigType as T, at_least, between, one_of)
from strata.common.errors import InvalidConfigError

MIB = 1024 * 1024
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
_REPLICA = re.compile(r"\s*[0-9]+\s*:\s*[0-9]+\s*")


def throttled_replica_list(name: str, value: Any) -> None:
    """Kafka's ThrottledReplicaListValidator: ``*`` or ``partition:broker,...``."""
    items = value if isinstance(value, list) else [value]
    if [str(v).strip() for v in items] == ["*"] or all(_REPLICA.fullmatch(str(v)) for v in items):
        return
    raise InvalidConfigError(
        f"Invalid value {','.join(map(str, items))} for configuration {name}: {name} must be "
        "the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


def throttled_partitions(value: list[str] | None, broker_id: int) -> frozenset[int] | None:
    """The partitions a ``*.replication.throttled.replicas`` value throttles on ``broker_id``
    (Kafka's parseThrottledPartitions); None means every partition (``*``)."""
    items = [str(v).strip() for v in (value or []) if str(v).strip()]
    if items == ["*"]:
        return None
    out = set()
    for item in items:
        partition, _, broker = item.partition(":")
        if int(broker) == broker_id:
            out.add(int(partition))
    return frozenset(out)

LOG_CONFIG_DEF = (
    ConfigDef()
    .define("cleanup.policy", T.LIST, ["delete"], one_of("compact", "delete"))
    .define("compression.type", T.STRING, "producer",
            one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"))
    .define("compression.gzip.level", T.INT, -1)
    .define("compression.lz4.level", T.INT, 9)
    .define("compression.zstd.level", T.INT, 3)
    .define("delete.retention.ms", T.LONG, 86_400_000, at_least(0))
    .define("file.delete.delay.ms", T.LONG, 60_000, at_least(0))
    .define("flush.messages", T.LONG, LONG_MAX, at_least(1))
    .define("flush.ms", T.LONG, LONG_MAX, at_least(0))
    .define(FOLLOWER_THROTTLED_REPLICAS, T.LIST, [], throttled_replica_list)
    .define("index.interval.bytes", T.INT, 4096, at_least(0))
    .define(LEADER_THROTTLED_REPLICAS, T.LIST, [], throttled_replica_list)
    .define("local.retention.bytes", T.LONG, -2, at_least(-2))
    .define("local.retention.ms", T.LONG, -2, at_least(-2))
    .define("max.compaction.lag.ms", T.LONG, LONG_MAX, at_least(1))
    .define("max.message.bytes", T.INT, 1_048_588, at_least(0))
    .define("message.timestamp.after.max.ms", T.LONG, 3_600_000, at_least(0))
    .define("message.timestamp.before.max.ms", T.LONG, LONG_MAX, at_least(0))
    .define("message.timestamp.type", T.STRING, "CreateTime", one_of("CreateTime", "LogAppendTime"))
    .define("min.cleanable.dirty.ratio", T.DOUBLE, 0.5, between(0, 1))
    .define("min.compaction.lag.ms", T.LONG, 0, at_least(0))
    .define("min.insync.replicas", T.INT, 1, at_least(1))
    .define("preallocate", T.BOOLEAN, False)
    .define("remote.copy.lag.bytes", T.LONG, -1, at_least(-1))
    .define("remote.copy.lag.ms", T.LONG, 0, at_least(-1))
    .define("remote.log.copy.disable", T.BOOLEAN, False)
    .define("remote.log.delete.on.disable", T.BOOLEAN, False)
    .define("remote.storage.enable", T.BOOLEAN, False)
    .define("strata.remote.recovery", T.BOOLEAN, False)   # Strata's (issue 52)
    .define("strata.remote.readreplica", T.STRING, "")   # issue 52: the origin's bucket
    .define("strata.remote.readreplica.key.prefix", T.STRING, "")
    .define("strata.remote.readreplica.refresh.ms", T.LONG, 10_000, at_least(1))
    .define("retention.bytes", T.LONG, -1)
    .define("retention.ms", T.LONG, 604_800_000, at_least(-1))
    .define("segment.bytes", T.INT, 1024 * MIB, at_least(MIB))
    .define("segment.index.bytes", T.INT, 10 * MIB, at_least(4))
    .define("segment.jitter.ms", T.LONG, 0, at_least(0))
    .define("segment.ms", T.LONG, 604_800_000, at_least(1))
    .define("unclean.leader.election.enable", T.BOOLEAN, False)
    # Kafka 4.x's internal override that lets tests use segments below the 1 MiB minimum.
    .define("internal.segment.bytes", T.INT, None, at_least(14))
)


class LogConfig(AbstractConfig):
    definition = LOG_CONFIG_DEF

    @property
    def effective_segment_bytes(self) -> int:
        internal = self.values.get("internal.segment.bytes")
        return internal if internal is not None else self.values["segment.bytes"]

    @property
    def max_segment_ms(self) -> int:
        """``segment.ms``, capped by ``max.compaction.lag.ms`` on compacted topics (KIP-354: a
        segment must roll for its records to become cleanable in time)."""
        if self.is_compacted:
            return min(self.values["segment.ms"], self.values["max.compaction.lag.ms"])
        return self.values["segment.ms"]

    @property
    def log_append_time(self) -> bool:
        return self.values["message.timestamp.type"] == "LogAppendTime"

    @property
    def is_compacted(self) -> bool:
        return "compact" in self.values["cleanup.policy"]

    @property
    def local_retention_ms(self) -> int:
        """The effective ``local.retention.ms``: never longer than ``retention.ms``."""
        return effective_local_retention(self.values["local.retention.ms"],
                                         self.values["retention.ms"])

    @property
    def local_retention_bytes(self) -> int:
        """The effective ``local.retention.bytes``: never more than ``retention.bytes``."""
        return effective_local_retention(self.values["local.retention.bytes"],
                                         self.values["retention.bytes"])

    @property
    def remote_copy_lag_ms(self) -> int:
        """KIP-1241's effective ``remote.copy.lag.ms``: −1 means the effective local
        retention time (which may itself be −1: no time check)."""
        lag = self.values["remote.copy.lag.ms"]
        return self.local_retention_ms if lag == -1 else lag

    @property
    def remote_copy_lag_bytes(self) -> int:
        """KIP-1241's effective ``remote.copy.lag.bytes``: −1 means the effective local
        retention size (which may itself be −1: no size check)."""
        lag = self.values["remote.copy.lag.bytes"]
        return self.local_retention_bytes if lag == -1 else lag


def effective_local_retention(local: int, total: int) -> int:
    """A local retention (−2: the same as ``total``, −1: unbounded) capped at the total
    retention ``total`` (negative: unbounded), in the unit they share: min(local, total)."""
    if local == -2 or (total >= 0 and (local < 0 or local > total)):
        return total
    return local


# Broker-level synonyms of each topic config, highest priority first (Kafka's LogConfig synonyms).
BROKER_SYNONYMS: dict[str, list[tuple[str, int]]] = {
    # topic key: [(broker key, multiplier to the topic key's unit)]
    "segment.bytes": [("log.segment.bytes", 1)],
    "segment.ms": [("log.roll.ms", 1), ("log.roll.hours", 3_600_000)],
    "segment.jitter.ms": [("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", 3_600_000)],
    "segment.index.bytes": [("log.index.size.max.bytes", 1)],
    "flush.messages": [("log.flush.interval.messages", 1)],
    "flush.ms": [("log.flush.interval.ms", 1), ("log.flush.scheduler.interval.ms", 1)],
    "retention.bytes": [("log.retention.bytes", 1)],
    "retention.ms": [("log.retention.ms", 1), ("log.retention.minutes", 60_000),
                     ("log.retention.hours", 3_600_000)],
    "max.message.bytes": [("message.max.bytes", 1)],
    "index.interval.bytes": [("log.index.interval.bytes", 1)],
    "delete.retention.ms": [("log.cleaner.delete.retention.ms", 1)],
    "min.cleanable.dirty.ratio": [("log.cleaner.min.cleanable.ratio", 1)],
    "min.compaction.lag.ms": [("log.cleaner.min.compaction.lag.ms", 1)],
    "max.compaction.lag.ms": [("log.cleaner.max.compaction.lag.ms", 1)],
    "file.delete.delay.ms": [("log.segment.delete.delay.ms", 1)],
    "cleanup.policy": [("log.cleanup.policy", 1)],
    "min.insync.replicas": [("min.insync.replicas", 1)],
    "compression.type": [("compression.type", 1)],
    "unclean.leader.election.enable": [("unclean.leader.election.enable", 1)],
    "preallocate": [("log.preallocate", 1)],
    "message.timestamp.type": [("log.message.timestamp.type", 1)],
    "message.timestamp.before.max.ms": [("log.message.timestamp.before.max.ms", 1)],
    "message.timestamp.after.max.ms": [("log.message.timestamp.after.max.ms", 1)],
    "local.retention.ms": [("log.local.retention.ms", 1)],
    "local.retention.bytes": [("log.local.retention.bytes", 1)],
    "remote.storage.enable": [("log.remote.storage.enable", 1)],
    "remote.copy.lag.ms": [("log.remote.copy.lag.ms", 1)],
    "remote.copy.lag.bytes": [("log.remote.copy.lag.bytes", 1)],
}


def topic_defaults_from_broker(props) -> dict[str, object]:
    """Topic-level default values implied by broker ``server.properties`` keys."""
    out: dict[str, object] = {}
    for topic_key, synonyms in BROKER_SYNONYMS.items():
        for broker_key, unit in synonyms:
            if broker_key in props and props[broker_key] not in (None, ""):
                value = props[broker_key]
                if unit != 1:
                    value = int(str(value).strip()) * unit
                out[topic_key] = value
                break
    return out
