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
    # KIP-848 consumer groups (group.consumer.*)
    consumer_group_session_timeout_ms: int = 45_000
    consumer_group_min_session_timeout_ms: int = 45_000
    consumer_group_max_session_timeout_ms: int = 60_000
    consumer_group_heartbeat_interval_ms: int = 5_000
    consumer_group_min_heartbeat_interval_ms: int = 5_000
    consumer_group_max_heartbeat_interval_ms: int = 15_000
    consumer_group_max_size: int = 2**31 - 1
    consumer_group_assignors: tuple[str, ...] = ("uniform", "range")  # the first is the default
    # group.consumer.migration.policy: bidirectional, upgrade, downgrade or disabled
    consumer_group_migration_policy: str = "bidirectional"

    def __post_init__(self) -> None:
        """Kafka's GroupCoordinatorConfig requirements; ValueError names the broken one."""
        def require(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"requirement failed: {what}")
        require(self.consumer_group_max_heartbeat_interval_ms
                >= self.consumer_group_min_heartbeat_interval_ms,
                "group.consumer.max.heartbeat.interval.ms must be greater than or equal to "
                "group.consumer.min.heartbeat.interval.ms")
        require(self.consumer_group_min_heartbeat_interval_ms
                <= self.consumer_group_heartbeat_interval_ms
                <= self.consumer_group_max_heartbeat_interval_ms,
                "group.consumer.heartbeat.interval.ms must be between "
                "group.consumer.min.heartbeat.interval.ms and "
                "group.consumer.max.heartbeat.interval.ms")
        require(self.consumer_group_max_session_timeout_ms
                >= self.consumer_group_min_session_timeout_ms,
                "group.consumer.max.session.timeout.ms must be greater than or equal to "
                "group.consumer.min.session.timeout.ms")
        require(self.consumer_group_min_session_timeout_ms
                <= self.consumer_group_session_timeout_ms
                <= self.consumer_group_max_session_timeout_ms,
                "group.consumer.session.timeout.ms must be between "
                "group.consumer.min.session.timeout.ms and group.consumer.max.session.timeout.ms")
        require(self.consumer_group_heartbeat_interval_ms < self.consumer_group_session_timeout_ms,
                "group.consumer.heartbeat.interval.ms must be less than "
                "group.consumer.session.timeout.ms")
        require(self.consumer_group_migration_policy in
                ("bidirectional", "upgrade", "downgrade", "disabled"),
                "group.consumer.migration.policy must be one of bidirectional, upgrade, "
                "downgrade, disabled (case-insensitive)")
        require(self.consumer_group_max_size >= 1, "group.consumer.max.size must be at least 1")
        from strata.coordinator.group.assignors import ASSIGNORS
        require(bool(self.consumer_group_assignors), "group.consumer.assignors must not be empty")
        for name in self.consumer_group_assignors:
            require(name in ASSIGNORS, f"group.consumer.assignors: unknown assignor {name!r} "
                                       f"(known: {', '.join(ASSIGNORS)})")

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
            "group.consumer.session.timeout.ms": "consumer_group_session_timeout_ms",
            "group.consumer.min.session.timeout.ms": "consumer_group_min_session_timeout_ms",
            "group.consumer.max.session.timeout.ms": "consumer_group_max_session_timeout_ms",
            "group.consumer.heartbeat.interval.ms": "consumer_group_heartbeat_interval_ms",
            "group.consumer.min.heartbeat.interval.ms": "consumer_group_min_heartbeat_interval_ms",
            "group.consumer.max.heartbeat.interval.ms": "consumer_group_max_heartbeat_interval_ms",
            "group.consumer.max.size": "consumer_group_max_size",
        }
        kwargs: dict[str, Any] = {}
        for prop, attr in names.items():
            if prop in props and props[prop] is not None:
                kwargs[attr] = int(props[prop])
        if props.get("offsets.retention.minutes") is not None:
            kwargs["offsets_retention_ms"] = int(props["offsets.retention.minutes"]) * 60_000
        if props.get("group.consumer.migration.policy") is not None:
            kwargs["consumer_group_migration_policy"] = str(
                props["group.consumer.migration.policy"]).strip().lower()
        if props.get("group.consumer.assignors") is not None:
            from strata.coordinator.group.assignors import assignor_name
            raw = props["group.consumer.assignors"]
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            kwargs["consumer_group_assignors"] = tuple(
                assignor_name(item.strip()) for item in items if item.strip())
        return cls(**kwargs)
