"""What the group coordinator answers, and the plain arguments some requests carry: frozen values
with an ``ErrorCode``, which the broker's handlers turn into responses (this package knows no
wire format). Also the translation of a failed ``__consumer_offsets`` append into the code a
client gets (Kafka's ``appendGroupMetadataErrorToResponseError`` and the offset commit's
``normalizeException``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from strata.common.errors import ErrorCode
from strata.coordinator.offsets_records import NO_LEADER_EPOCH

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1
NO_OFFSET = -1
CONSUMER_PROTOCOL_TYPE = "consumer"
CLASSIC_GROUP_TYPE = "classic"
DEFAULT_RETENTION_TIME = -1  # OffsetCommit v2-4 retention_time_ms meaning "broker default"

TopicPartition = tuple[str, int]


# =========================================================================== requests

class LeaveMember(NamedTuple):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


class OffsetCommitPartition(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str | None = ""


# =========================================================================== results

@dataclass(frozen=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResult:
    error: ErrorCode
    member_id: str = UNKNOWN_MEMBER_ID
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinGroupMember, ...] = ()  # filled for the leader only
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class LeaveMemberResult(NamedTuple):
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True)
class LeaveGroupResult:
    """``error`` is the top-level code; per-member codes are in ``members`` (LeaveGroup v3+;
    a v0-2 response carries the single member's code as its top-level error)."""

    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


class FetchedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True)
class OffsetFetchResult:
    error: ErrorCode
    offsets: dict[TopicPartition, FetchedOffset] = field(default_factory=dict)


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    protocol_data: str = ""  # the selected protocol name, for a Stable group
    members: tuple[DescribedMember, ...] = ()


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True)
class ListGroupsResult:
    error: ErrorCode
    groups: tuple[ListedGroup, ...] = ()


# =========================================================================== append errors

# A failed append of group metadata (JoinGroup of a static member, SyncGroup's assignment).
GROUP_STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}

# A failed append of offsets (OffsetCommit, TxnOffsetCommit).
OFFSET_STORE_ERRORS = {
    ErrorCode.NETWORK_EXCEPTION: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


# =========================================================================== consumer groups

CONSUMER_GROUP_TYPE = "consumer"

# topic id -> partitions (what ConsumerGroupHeartbeat and the records carry)
TopicIdPartitions = dict


@dataclass(frozen=True)
class ConsumerGroupHeartbeatRequest:
    """A ConsumerGroupHeartbeat v0-1 as plain values; ``None`` fields were not sent.
    ``owned`` is the request's TopicPartitions: (topic id, partitions) pairs."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: tuple | None = None


@dataclass(frozen=True)
class ConsumerGroupHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: TopicIdPartitions | None = None   # None: not sent in this response


@dataclass(frozen=True)
class DescribedConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: TopicIdPartitions
    target_assignment: TopicIdPartitions
    member_type: int = -1     # ConsumerGroupDescribe v1: 0 classic, 1 consumer protocol


@dataclass(frozen=True)
class DescribedConsumerGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedConsumerMember, ...] = ()
