"""The group coordinator's broker settings (Kafka's ``GroupCoordinatorConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from strata.coordinator.offsets_records import DEFAULT_OFFSETS_TOPIC_PARTITIONS


@dataclass(frozen=True)
class GroupCoordinatorConfig:
    """Kafka's group coordinator settings (broker property names in the comments)."""

    group_min_session_timeout_ms: int = 6000           # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000      # group.max.session.timeout.ms
    group_initial_rebalance_delay_ms: int = 3000       # group.initial.rebalance.delay.ms
    group_max_size: int = 2**31 - 1                    # group.max.size
    offsets_topic_num_partitions: int = DEFAULT_OFFSETS_TOPIC_PARTITIONS  # offsets.topic.num.partitions
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000  # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096              # offset.metadata.max.bytes
    new_member_join_timeout_ms: int = 5 * 60 * 1000    # Kafka's NewMemberJoinTimeoutMs (fixed)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "GroupCoordinatorConfig":
        """Build from broker properties (Kafka names; values may be strings)."""
        names = {
            "group.min.session.timeout.ms": "group_min_session_timeout_ms",
            "group.max.session.timeout.ms": "group_max_session_timeout_ms",
            "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
            "group.max.size": "group_max_size",
            "offsets.topic.num.partitions": "offsets_topic_num_partitions",
            "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
            "offset.metadata.max.bytes": "offset_metadata_max_bytes",
        }
        kwargs: dict[str, int] = {}
        for prop, attr in names.items():
            if prop in props and props[prop] is not None:
                kwargs[attr] = int(props[prop])
        if props.get("offsets.retention.minutes") is not None:
            kwargs["offsets_retention_ms"] = int(props["offsets.retention.minutes"]) * 60_000
        return cls(**kwargs)
