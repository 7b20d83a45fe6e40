"""The group coordinator (classic groups, KIP-848 consumer groups, committed offsets), laid out
as Kafka 4's ``group-coordinator`` module is:

- ``coordinator``: ``GroupCoordinator``, the face every request goes through (Kafka's
  ``GroupCoordinatorService``): which ``__consumer_offsets`` partitions are ours, load/unload;
- ``state``: the classic group's states and the one table of legal transitions;
- ``classic_group``: a group and its members in memory (``ClassicGroup``, ``ClassicGroupMember``);
- ``membership``: JoinGroup/SyncGroup/Heartbeat/LeaveGroup, static membership, rebalance timers
  (``GroupMetadataManager``);
- ``consumer_group``, ``consumer_membership``, ``assignors``: KIP-848 consumer groups (member
  epochs, target assignment, reconciliation; ConsumerGroupHeartbeat/Describe; the ``uniform``
  and ``range`` server-side assignors);
- ``offsets``: offset commits (plain and transactional), fetch, delete, expiry
  (``OffsetMetadataManager``);
- ``loader``: reading ``__consumer_offsets`` back into memory (``CoordinatorLoader``);
- ``results``: what requests carry in and what the coordinator answers;
- ``runtime``, ``timers``, ``config``: the shared plumbing, the ``OffsetsLog`` and ``Timers``
  ports, the broker settings.

Other packages import from ``strata.coordinator.group`` only (the names below), never from its
modules: a rule in ``tests/unit/test_import_rules.py``.
"""

from strata.coordinator.group.config import GroupCoordinatorConfig
from strata.coordinator.group.coordinator import GroupCoordinator
from strata.coordinator.group.results import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_GROUP_TYPE,
    CONSUMER_PROTOCOL_TYPE,
    DEFAULT_RETENTION_TIME,
    NO_GENERATION,
    NO_OFFSET,
    UNKNOWN_MEMBER_ID,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResult,
    DescribedConsumerGroup,
    DescribedConsumerMember,
    DescribedGroup,
    DescribedMember,
    FetchedOffset,
    JoinGroupMember,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMember,
    LeaveMemberResult,
    ListedGroup,
    ListGroupsResult,
    OffsetCommitPartition,
    OffsetFetchResult,
    SyncGroupResult,
    TopicPartition,
)
from strata.coordinator.group.runtime import OffsetsLog
from strata.coordinator.group.state import GroupState
from strata.coordinator.group.timers import LoopTimers, ManualTimers, TimerHandle, Timers

__all__ = [
    "CLASSIC_GROUP_TYPE",
    "CONSUMER_GROUP_TYPE",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResult",
    "DescribedConsumerGroup",
    "DescribedConsumerMember",
    "CONSUMER_PROTOCOL_TYPE",
    "DEFAULT_RETENTION_TIME",
    "NO_GENERATION",
    "NO_OFFSET",
    "UNKNOWN_MEMBER_ID",
    "DescribedGroup",
    "DescribedMember",
    "FetchedOffset",
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupState",
    "JoinGroupMember",
    "JoinGroupResult",
    "LeaveGroupResult",
    "LeaveMember",
    "LeaveMemberResult",
    "ListGroupsResult",
    "ListedGroup",
    "LoopTimers",
    "ManualTimers",
    "OffsetCommitPartition",
    "OffsetFetchResult",
    "OffsetsLog",
    "SyncGroupResult",
    "TimerHandle",
    "Timers",
    "TopicPartition",
]
