"""The classic-protocol group coordinator: consumer groups, rebalances and committed offsets.

It follows Kafka's classic group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup,
OffsetCommit/OffsetFetch, DescribeGroups/ListGroups/DeleteGroups/OffsetDelete) but does no
I/O of its own and knows nothing of the wire format: the broker's handler layer turns requests
into plain arguments and the results (dataclasses carrying an ``ErrorCode``) into responses.

Everything runs on one asyncio event loop, so no locks are needed: a method changes state
synchronously and only awaits for two things — a JoinGroup/SyncGroup response parked until the
rebalance moves on (a future stored on the member, as Kafka stores a callback), and an append
to ``__consumer_offsets`` through the ``OffsetsLog`` port. State that may have changed during
an append is checked again afterwards (group still alive, same generation), as Kafka does.

Group life cycle (Kafka's states and names)::

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup stored--> Stable
    Stable / CompletingRebalance --join with new metadata, leader rejoin, leave, session
        expiry--> PreparingRebalance
    PreparingRebalance --no members left--> Empty
    Empty without offsets (after expiry) or deleted --> Dead (dropped from the cache)

Timers (session timeouts, rebalance timeouts, ``group.initial.rebalance.delay.ms``, the
pending-SyncGroup deadline and the offsets expiry task) go through a ``Timers`` port:
``LoopTimers`` uses the running loop's ``call_later``; ``ManualTimers`` is driven by tests.

Persistence: committed offsets and group metadata are records of ``__consumer_offsets`` in
Kafka's format (``offsets_records``), appended through ``OffsetsLog.append`` to the partition
``partition_for(group_id)``. ``load(partitions)`` replays those partitions to rebuild the
groups (Stable with their members, or Empty) and their offsets before serving them.

Deleted topics: an offset record names its topic, not the topic's id, so an offset must never
outlive its topic or a new topic of the same name would inherit it. ``on_topic_deleted`` (a
cluster-metadata listener) drops the topic's offsets from every group at once, before the
deletion is answered, and then appends their tombstones. If the broker stops before the
tombstones are durable, ``load`` drops (and tombstones) every offset of a topic that does not
exist (the ``topic_exists`` port), so a later topic of that name starts without offsets.

Transactional offset commits (TxnOffsetCommit, Kafka's exactly-once consume-transform-produce):
``commit_transactional_offsets`` appends the offsets as one transactional batch of the
producer to the group's partition; they stay *pending* for that producer id — invisible to
OffsetFetch, UNSTABLE_OFFSET_COMMIT with ``require_stable`` — until the transaction's marker is
written to that partition and ``complete_transaction`` makes them the committed offsets
(commit) or drops them (abort). As in Kafka, an offset replaces the current one only when its
record is newer in the log (``seq`` follows append order), so a plain commit appended after a
transactional one wins even if the transaction commits later. ``load`` rebuilds the pending
offsets of transactions still open at the high watermark from the log's batches.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Awaitable, Callable, Iterable, Mapping, NamedTuple, Protocol

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.offsets_records import (
    DEFAULT_OFFSETS_TOPIC_PARTITIONS,
    NO_LEADER_EPOCH,
    NO_TIMESTAMP,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    consumer_subscription_topics,
    decode_record,
    group_metadata_record,
    offset_commit_record,
    partition_for,
)

log = logging.getLogger(__name__)

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1
NO_OFFSET = -1
CONSUMER_PROTOCOL_TYPE = "consumer"
CLASSIC_GROUP_TYPE = "classic"
DEFAULT_RETENTION_TIME = -1  # OffsetCommit v2-4 retention_time_ms meaning "broker default"

TopicPartition = tuple[str, int]


class GroupState(str, Enum):
    """Kafka's classic group states; ``.value`` is the name DescribeGroups/ListGroups report."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS = {
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE,
                                     GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.DEAD: set(GroupState),
}


# =========================================================================== configuration

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


# =========================================================================== ports

class OffsetsLog(Protocol):
    """Storage of ``__consumer_offsets``, implemented by the broker
    (``strata.coordinator.offsets_log.ReplicaOffsetsLog``).

    ``append`` writes the (key, value) records — value ``None`` is a tombstone — as one batch
    to ``__consumer_offsets-<partition>`` and returns once it is durable enough to acknowledge;
    it raises (ideally a ``KafkaError`` carrying the log's error code) when it is not. With
    ``transactional=True`` (TxnOffsetCommit only; plain commits pass no keywords) the batch is
    a transactional one of ``producer_id``/``producer_epoch``.
    ``replay`` yields the partition's records from its start, oldest first (committed data
    only: records of aborted transactions left out).

    ``replay_batches`` (optional; the loader falls back to ``replay`` without it) yields the
    same span with its transaction structure, in log order: records (``is_marker`` False;
    ``key``, ``value``, ``producer_id``, ``transactional``), aborted and open transactions
    included, and markers (``is_marker`` True; ``producer_id``, ``commit``)."""

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]], *,
                     producer_id: int = -1, producer_epoch: int = -1,
                     transactional: bool = False) -> None: ...

    def replay(self, partition: int) -> Iterable[tuple[bytes, bytes | None]]: ...


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopTimers:
    """Timers on the running asyncio loop (the coordinator must be used from inside it)."""

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000.0, callback)


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Timers that fire only when ``advance`` moves time on (and a ``MockClock`` with it)."""

    def __init__(self, clock: Any = None):
        self._clock = clock
        self._now = 0.0
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        handle = _ManualHandle()
        heapq.heappush(self._heap, (self._now + max(delay_ms, 0), next(self._seq), handle, callback))
        return handle

    def _move_to(self, t: float) -> None:
        if self._clock is not None and t > self._now:
            self._clock.advance_ms(int(t) - int(self._now))
        self._now = max(self._now, t)

    def advance(self, ms: float) -> None:
        """Run every callback due within ``ms`` (including ones scheduled meanwhile), in order."""
        target = self._now + ms
        while self._heap and self._heap[0][0] <= target:
            due, _, handle, callback = heapq.heappop(self._heap)
            self._move_to(due)
            if not handle.cancelled:
                callback()
        self._move_to(target)

    def pending(self) -> int:
        return sum(1 for _, _, handle, _ in self._heap if not handle.cancelled)


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


class LeaveMember(NamedTuple):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


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


class OffsetCommitPartition(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str | None = ""


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


# =========================================================================== internal state

class _PlainRecord(NamedTuple):
    """A committed record replayed by an ``OffsetsLog`` without ``replay_batches``."""

    key: bytes
    value: bytes | None
    producer_id: int = -1
    transactional: bool = False
    is_marker = False


@dataclass
class _CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int  # NO_TIMESTAMP unless committed with a retention time (v2-4)
    seq: int               # append order, so a late completion never overwrites a newer one


class _Member:
    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host",
                 "rebalance_timeout_ms", "session_timeout_ms", "protocol_type", "protocols",
                 "assignment", "awaiting_join", "awaiting_sync", "is_new",
                 "heartbeat_satisfied", "heartbeat_timer")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str,
                 client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                 protocol_type: str, protocols: list[tuple[str, bytes]], assignment: bytes = b""):
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = assignment
        self.awaiting_join: asyncio.Future | None = None
        self.awaiting_sync: asyncio.Future | None = None
        self.is_new = False
        self.heartbeat_satisfied = False
        self.heartbeat_timer: TimerHandle | None = None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise ValueError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return protocols == self.protocols

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        if self.is_new:
            return self.heartbeat_satisfied
        if self.awaiting_join is not None or self.awaiting_sync is not None:
            return True
        return self.heartbeat_satisfied


class _JoinOp:
    """The pending completion of a PreparingRebalance phase (Kafka's DelayedJoin and
    InitialDelayedJoin)."""

    __slots__ = ("initial", "configured_delay", "delay", "remaining", "handle")

    def __init__(self, initial: bool, configured_delay: int, delay: int, remaining: int):
        self.initial = initial
        self.configured_delay = configured_delay
        self.delay = delay
        self.remaining = remaining
        self.handle: TimerHandle | None = None


class _SyncOp:
    __slots__ = ("generation", "handle")

    def __init__(self, generation: int):
        self.generation = generation
        self.handle: TimerHandle | None = None


class _Group:
    def __init__(self, group_id: str, now_ms: int, state: GroupState = GroupState.EMPTY):
        self.group_id = group_id
        self.state = state
        self.state_timestamp: int | None = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, _Member] = {}
        self.static_members: dict[str, str] = {}
        self.pending_members: dict[str, TimerHandle] = {}
        self.pending_sync_members: set[str] = set()
        self.new_member_added = False
        self.join_op: _JoinOp | None = None
        self.sync_op: _SyncOp | None = None
        self.subscribed_topics: set[str] | None = None
        self.offsets: dict[TopicPartition, _CommittedOffset] = {}
        self.pending_offset_commits: dict[TopicPartition, int] = {}
        # producer id -> offsets of its open transaction (Kafka's
        # pendingTransactionalOffsetCommits); a producer stays here, even with no offsets left
        # (deleted topic), until its marker completes the transaction
        self.pending_txn_offsets: dict[int, dict[TopicPartition, _CommittedOffset]] = {}
        self.received_consumer_commits = False
        self.received_txn_commits = False

    # ---- state
    def transition(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise RuntimeError(f"group {self.group_id}: invalid transition {self.state.value} -> "
                               f"{state.value}")
        self.state = state
        self.state_timestamp = now_ms

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # ---- members
    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return (not self.pending_members
                and all(m.awaiting_join is not None for m in self.members.values()))

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    def candidate_protocols(self) -> set[str] | None:
        """Protocols every member supports; ``None`` when there are no members (any goes)."""
        result: set[str] | None = None
        for m in self.members.values():
            names = {name for name, _ in m.protocols}
            result = names if result is None else result & names
        return result

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.state == GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        candidates = self.candidate_protocols()
        if candidates is None:
            return bool(names)
        return bool(names & candidates)

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        if not candidates:
            raise RuntimeError(f"group {self.group_id}: no protocol common to all members")
        votes: dict[str, int] = {}
        for m in self.members.values():
            p = m.vote(candidates)
            votes[p] = votes.get(p, 0) + 1
        # most votes; ties go to the protocol voted for first (dict order), for determinism
        return max(votes, key=lambda p: votes[p])

    def add(self, member: _Member, fut: asyncio.Future | None) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        member.awaiting_join = fut
        handle = self.pending_members.pop(member.member_id, None)
        if handle is not None:
            handle.cancel()

    def remove(self, member_id: str) -> _Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            if member.group_instance_id is not None:
                if self.static_members.get(member.group_instance_id) == member_id:
                    del self.static_members[member.group_instance_id]
            if member.heartbeat_timer is not None:
                member.heartbeat_timer.cancel()
                member.heartbeat_timer = None
            # nothing will answer a removed member's parked SyncGroup otherwise
            self.invoke_sync(member, SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        handle = self.pending_members.pop(member_id, None)
        if handle is not None:
            handle.cancel()
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(self, member: _Member, protocols: list[tuple[str, bytes]],
                      rebalance_timeout_ms: int, session_timeout_ms: int,
                      fut: asyncio.Future | None) -> None:
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        old = member.awaiting_join
        member.awaiting_join = fut
        if old is not None and old is not fut and not old.done():
            # a newer JoinGroup from the same member supersedes this one
            old.set_result(JoinGroupResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> _Member:
        member = self.members.pop(old_id)
        self.invoke_join(member, JoinGroupResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        self.invoke_sync(member, SyncGroupResult(ErrorCode.FENCED_INSTANCE_ID))
        member.member_id = new_id
        self.members[new_id] = member
        if self.is_leader(old_id):
            self.leader_id = new_id
        if old_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_id)
            self.pending_sync_members.add(new_id)
        self.static_members[instance_id] = new_id
        return member

    def maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join is not None:
            return True
        for m in self.members.values():
            if m.awaiting_join is not None:
                self.leader_id = m.member_id
                return True
        return False

    @staticmethod
    def _answer(member: _Member, attr: str, result) -> bool:
        """Answer the member's parked request held in ``attr``; False if none is parked."""
        fut = getattr(member, attr)
        if fut is None:
            return False
        setattr(member, attr, None)
        if not fut.done():
            fut.set_result(result)
        return True

    @classmethod
    def invoke_join(cls, member: _Member, result: JoinGroupResult) -> bool:
        return cls._answer(member, "awaiting_join", result)

    @classmethod
    def invoke_sync(cls, member: _Member, result: SyncGroupResult) -> bool:
        return cls._answer(member, "awaiting_sync", result)

    def current_member_metadata(self) -> tuple[JoinGroupMember, ...]:
        assert self.protocol_name is not None
        return tuple(JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def compute_subscribed_topics(self) -> set[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                sub = consumer_subscription_topics(m.metadata(self.protocol_name))
            except ValueError:
                sub = None
            if sub is None:
                return None
            topics |= sub
        return topics

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is None or topic in self.subscribed_topics

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.EMPTY, now_ms)
        self.received_consumer_commits = False
        self.received_txn_commits = False
        self.pending_sync_members.clear()

    def has_offsets(self) -> bool:
        return (bool(self.offsets) or bool(self.pending_offset_commits)
                or bool(self.pending_txn_offsets))

    def has_pending_commit(self, tp: TopicPartition) -> bool:
        """A commit of ``tp`` in flight or in an open transaction (Kafka's
        hasPendingOffsetCommitsForTopicPartition)."""
        return tp in self.pending_offset_commits or any(
            tp in pending for pending in self.pending_txn_offsets.values())

    def pending_txn_partitions(self) -> list[TopicPartition]:
        return list({tp: None for pending in self.pending_txn_offsets.values() for tp in pending})


# =========================================================================== coordinator

_GROUP_STORE_ERRORS = {
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

_OFFSET_STORE_ERRORS = {
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


def _default_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator:
    """Kafka's classic group coordinator over an ``OffsetsLog``; see the module docstring.

    Call ``load()`` (from inside the event loop) before serving: until a group's
    ``__consumer_offsets`` partition is loaded, its requests get NOT_COORDINATOR.
    """

    def __init__(self, offsets_log: OffsetsLog, config: GroupCoordinatorConfig | None = None, *,
                 clock: Clock = SYSTEM_CLOCK, timers: Timers | None = None,
                 member_id_factory: Callable[[str], str] = _default_member_id,
                 topic_exists: Callable[[str], bool] | None = None):
        self.config = config or GroupCoordinatorConfig()
        # None: no topic list to check offsets against when loading (every topic exists)
        self._topic_exists = topic_exists
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log = offsets_log
        self._clock = clock
        self._timers: Timers = timers if timers is not None else LoopTimers()
        self._new_member_id = member_id_factory
        self._groups: dict[str, _Group] = {}
        self._owned: set[int] = set()
        self._loading: set[int] = set()
        self._load_tokens: dict[int, object] = {}   # partition -> its background load
        self._active = True
        self._tasks: set[asyncio.Task] = set()
        self._seq = itertools.count(1)
        self._retention_timer: TimerHandle | None = None
        # producer id -> ids of groups with offsets pending in its open transaction (Kafka's
        # openGroupsForProducer); a stale entry is harmless (the group is checked)
        self._txn_groups: dict[int, set[str]] = {}

    # ------------------------------------------------------------------ helpers
    def _now(self) -> int:
        return self._clock.milliseconds()

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.offsets_topic_num_partitions)

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("group coordinator task %s failed", what, exc_info=t.exception())
        task.add_done_callback(done)
        return task

    async def _append(self, partition: int, records: list[tuple[bytes, bytes | None]],
                      **txn: Any) -> ErrorCode:
        """Append to ``__consumer_offsets-<partition>``; ``txn`` holds ``producer_id``,
        ``producer_epoch`` and ``transactional`` for a transactional batch (plain appends
        pass no keywords)."""
        try:
            await self._log.append(partition, records, **txn)
            return ErrorCode.NONE
        except KafkaError as e:
            log.warning("append to __consumer_offsets-%d failed: %s", partition, e)
            return ErrorCode(e.code)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - any storage failure becomes an error code
            log.exception("append to __consumer_offsets-%d failed", partition)
            return ErrorCode.UNKNOWN_SERVER_ERROR

    def _status_error(self, group_id: str | None, allow_empty_id: bool) -> ErrorCode | None:
        """Kafka's validateGroupStatus: valid id, active, loaded, and ours."""
        if group_id is None or (not allow_empty_id and group_id == ""):
            return ErrorCode.INVALID_GROUP_ID
        if not self._active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        partition = self.partition_for(group_id)
        if partition in self._loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if partition not in self._owned:
            return ErrorCode.NOT_COORDINATOR
        return None

    @staticmethod
    def _validate_current_member(group: _Group, member_id: str,
                                 group_instance_id: str | None) -> ErrorCode | None:
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
            return None
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def _get_or_create_group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            group = _Group(group_id, self._now())
            self._groups[group_id] = group
        return group

    # ------------------------------------------------------------------ heartbeats / timers
    def _schedule_heartbeat(self, group: _Group, member: _Member, timeout_ms: int | None = None) -> None:
        """Kafka's completeAndScheduleNextExpiration: the member is alive now; expect the next
        sign of life within ``timeout_ms`` (its session timeout by default)."""
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None
        member.heartbeat_satisfied = False
        if member.has_satisfied_heartbeat():
            # awaiting a JoinGroup/SyncGroup response: the rebalance's own deadlines apply
            return
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.heartbeat_timer = self._timers.call_later(
            delay, lambda: self._on_heartbeat_expired(group, member))

    def _on_heartbeat_expired(self, group: _Group, member: _Member) -> None:
        member.heartbeat_timer = None
        if group.state == GroupState.DEAD or group.members.get(member.member_id) is not member:
            return
        if not member.has_satisfied_heartbeat():
            log.info("member %s of group %s has failed (session timeout), removing it",
                     member.member_id, group.group_id)
            self._remove_member_and_update_group(group, member)

    def _add_pending_member(self, group: _Group, member_id: str, timeout_ms: int) -> None:
        old = group.pending_members.pop(member_id, None)
        if old is not None:
            old.cancel()
        group.pending_members[member_id] = self._timers.call_later(
            timeout_ms, lambda: self._on_pending_member_expired(group, member_id))

    def _on_pending_member_expired(self, group: _Group, member_id: str) -> None:
        if group.state == GroupState.DEAD or member_id not in group.pending_members:
            return
        log.info("pending member %s of group %s removed after session timeout", member_id,
                 group.group_id)
        group.pending_members.pop(member_id, None)
        if group.state == GroupState.PREPARING_REBALANCE:
            self._check_join(group)

    # ------------------------------------------------------------------ rebalance machinery
    def _maybe_prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_op(group)
        group.pending_sync_members.clear()

        delay = self.config.group_initial_rebalance_delay_ms
        if group.state == GroupState.EMPTY:
            op = _JoinOp(True, delay, delay, max(group.rebalance_timeout_ms() - delay, 0))
        else:
            timeout = group.rebalance_timeout_ms()
            op = _JoinOp(False, delay, timeout, 0)
        group.transition(GroupState.PREPARING_REBALANCE, self._now())
        log.info("preparing to rebalance group %s (old generation %d, __consumer_offsets-%d): %s",
                 group.group_id, group.generation_id, self.partition_for(group.group_id), reason)
        self._start_join_op(group, op)

    def _start_join_op(self, group: _Group, op: _JoinOp) -> None:
        if group.join_op is not None and group.join_op.handle is not None:
            group.join_op.handle.cancel()
        group.join_op = op
        op.handle = self._timers.call_later(op.delay, lambda: self._on_join_timer(group, op))
        if not op.initial:
            self._check_join(group)

    def _on_join_timer(self, group: _Group, op: _JoinOp) -> None:
        if group.join_op is not op:
            return
        op.handle = None
        if op.initial and group.new_member_added and op.remaining != 0:
            # more members arrived during the initial delay: wait a little longer
            group.new_member_added = False
            delay = min(op.configured_delay, op.remaining)
            remaining = max(op.remaining - op.delay, 0)
            self._start_join_op(group, _JoinOp(True, op.configured_delay, delay, remaining))
            return
        self._complete_join(group)

    def _check_join(self, group: _Group) -> None:
        """Kafka's tryCompleteJoin: an (non-initial) join phase ends once all have joined."""
        op = group.join_op
        if op is not None and not op.initial and group.has_all_members_joined():
            self._complete_join(group)

    def _complete_join(self, group: _Group) -> None:
        op = group.join_op
        if op is not None and op.handle is not None:
            op.handle.cancel()
        group.join_op = None
        self._on_complete_join(group)

    def _on_complete_join(self, group: _Group) -> None:
        for member in [m for m in group.members.values()
                       if m.awaiting_join is None and not m.is_static]:
            log.info("group %s removes member %s which did not rejoin in time", group.group_id,
                     member.member_id)
            group.remove(member.member_id)

        if group.state == GroupState.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.error("group %s could not complete rebalance because no members rejoined",
                      group.group_id)
            self._start_join_op(group, _JoinOp(False, self.config.group_initial_rebalance_delay_ms,
                                               group.rebalance_timeout_ms(), 0))
            return

        group.init_next_generation(self._now())
        if group.state == GroupState.EMPTY:
            log.info("group %s with generation %d is now empty", group.group_id, group.generation_id)
            records = [self._group_metadata_record(group, {})]
            self._spawn(self._store_quietly(group, records), f"store empty group {group.group_id}")
            return

        log.info("stabilized group %s generation %d with %d members", group.group_id,
                 group.generation_id, len(group.members))
        leader_members = group.current_member_metadata()
        for member in list(group.members.values()):
            result = JoinGroupResult(
                error=ErrorCode.NONE, member_id=member.member_id,
                generation_id=group.generation_id, protocol_type=group.protocol_type,
                protocol_name=group.protocol_name, leader_id=group.leader_id or "",
                members=leader_members if group.is_leader(member.member_id) else ())
            group.invoke_join(member, result)
            member.is_new = False
            self._schedule_heartbeat(group, member)
            group.pending_sync_members.add(member.member_id)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: _Group) -> None:
        self._cancel_sync_op(group)
        op = _SyncOp(group.generation_id)
        group.sync_op = op
        op.handle = self._timers.call_later(group.rebalance_timeout_ms(),
                                            lambda: self._on_sync_timer(group, op))

    def _cancel_sync_op(self, group: _Group) -> None:
        if group.sync_op is not None and group.sync_op.handle is not None:
            group.sync_op.handle.cancel()
        group.sync_op = None

    def _remove_pending_sync_member(self, group: _Group, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            self._cancel_sync_op(group)

    def _on_sync_timer(self, group: _Group, op: _SyncOp) -> None:
        if group.sync_op is not op:
            return
        group.sync_op = None
        if op.generation != group.generation_id or group.state not in (
                GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if group.pending_sync_members:
            missing = sorted(group.pending_sync_members)
            for member_id in missing:
                group.remove(member_id)
            self._prepare_rebalance(group, f"members {missing} did not send SyncGroup in time")

    def _remove_member_and_update_group(self, group: _Group, member: _Member) -> None:
        # a member removed while its JoinGroup is parked is told to rejoin from scratch
        group.invoke_join(member, JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"removing member {member.member_id}")
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._check_join(group)

    def _set_and_propagate_assignment(self, group: _Group, assignment: Mapping[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.NONE)

    def _reset_and_propagate_assignment_error(self, group: _Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: _Group, error: ErrorCode) -> None:
        ok = error == ErrorCode.NONE
        for member in list(group.members.values()):
            result = SyncGroupResult(error, group.protocol_type if ok else None,
                                     group.protocol_name if ok else None, member.assignment)
            if group.invoke_sync(member, result):
                self._schedule_heartbeat(group, member)

    # ------------------------------------------------------------------ persistence helpers
    def _group_metadata_record(self, group: _Group,
                               assignment: Mapping[str, bytes]) -> tuple[bytes, bytes | None]:
        members = []
        for m in group.members.values():
            if group.protocol_name is None:
                raise RuntimeError(f"group {group.group_id} has members but no protocol")
            members.append(MemberMetadataValue(
                member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                session_timeout=m.session_timeout_ms, rebalance_timeout=m.rebalance_timeout_ms,
                subscription=m.metadata(group.protocol_name),
                assignment=assignment.get(m.member_id, b""),
                group_instance_id=m.group_instance_id))
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "", generation=group.generation_id,
            protocol=group.protocol_name, leader=group.leader_id,
            current_state_timestamp=(group.state_timestamp if group.state_timestamp is not None
                                     else NO_TIMESTAMP),
            members=tuple(members))
        return group_metadata_record(group.group_id, value)

    async def _store_group(self, records: list[tuple[bytes, bytes | None]], group: _Group) -> ErrorCode:
        error = await self._append(self.partition_for(group.group_id), records)
        return _GROUP_STORE_ERRORS.get(error, error)

    async def _store_quietly(self, group: _Group, records: list[tuple[bytes, bytes | None]]) -> None:
        error = await self._store_group(records, group)
        if error != ErrorCode.NONE:
            log.warning("failed to write metadata of group %s: %s", group.group_id, error.name)

    # ================================================================== JoinGroup
    async def join_group(
        self,
        group_id: str,
        member_id: str,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int | None = None,
        group_instance_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = False,
        supports_skip_assignment: bool = False,
        reason: str | None = None,
    ) -> JoinGroupResult:
        """JoinGroup v0-9. The response waits until the rebalance completes.

        ``require_known_member_id`` is true for v4+ (a new member first gets
        MEMBER_ID_REQUIRED with its id); ``rebalance_timeout_ms`` defaults to the session
        timeout (v0); ``supports_skip_assignment`` is true for v9+."""
        fut = asyncio.get_running_loop().create_future()
        self._handle_join(
            fut, group_id, member_id or UNKNOWN_MEMBER_ID, group_instance_id,
            require_known_member_id, supports_skip_assignment, client_id, client_host,
            session_timeout_ms if rebalance_timeout_ms is None or rebalance_timeout_ms < 0
            else rebalance_timeout_ms,
            session_timeout_ms, protocol_type,
            [(str(name), bytes(meta or b"")) for name, meta in protocols],
            reason or "not provided")
        return await fut

    def _handle_join(self, fut: asyncio.Future, group_id: str, member_id: str,
                     group_instance_id: str | None, require_known_member_id: bool,
                     supports_skip_assignment: bool, client_id: str, client_host: str,
                     rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                     protocols: list[tuple[str, bytes]], reason: str) -> None:
        def respond(error: ErrorCode, mid: str = member_id) -> None:
            fut.set_result(JoinGroupResult(error, mid))

        error = self._status_error(group_id, allow_empty_id=False)
        if error is not None:
            return respond(error)
        if not (self.config.group_min_session_timeout_ms <= session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return respond(ErrorCode.INVALID_SESSION_TIMEOUT)

        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(group_id)
        if group is None:
            if not is_unknown:
                return respond(ErrorCode.UNKNOWN_MEMBER_ID)
            group = self._get_or_create_group(group_id)

        if not self._accept_joining_member(group, member_id):
            removed = group.remove(member_id)
            if removed is not None:
                group.invoke_join(removed, JoinGroupResult(ErrorCode.GROUP_MAX_SIZE_REACHED))
            respond(ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID)
        elif is_unknown:
            self._new_member_join(fut, group, group_instance_id, require_known_member_id,
                                  supports_skip_assignment, client_id, client_host,
                                  rebalance_timeout_ms, session_timeout_ms, protocol_type,
                                  protocols, reason)
        else:
            self._current_member_join(fut, group, member_id, group_instance_id, client_id,
                                      client_host, rebalance_timeout_ms, session_timeout_ms,
                                      protocol_type, protocols, reason)

        if group.state == GroupState.PREPARING_REBALANCE:
            self._check_join(group)

    def _accept_joining_member(self, group: _Group, member_id: str) -> bool:
        max_size = self.config.group_max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.state == GroupState.PREPARING_REBALANCE:
            member = group.members.get(member_id)
            return ((member is not None and member.awaiting_join is not None)
                    or group.num_awaiting_join() < max_size)
        return member_id in group.members or len(group.members) < max_size

    def _new_member_join(self, fut: asyncio.Future, group: _Group, group_instance_id: str | None,
                         require_known_member_id: bool, supports_skip_assignment: bool,
                         client_id: str, client_host: str, rebalance_timeout_ms: int,
                         session_timeout_ms: int, protocol_type: str,
                         protocols: list[tuple[str, bytes]], reason: str) -> None:
        if group.state == GroupState.DEAD:
            fut.set_result(JoinGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(protocol_type, {name for name, _ in protocols}):
            fut.set_result(JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        new_member_id = self._new_member_id(
            group_instance_id if group_instance_id is not None else client_id)
        if group_instance_id is not None:
            old_member_id = group.static_members.get(group_instance_id)
            if old_member_id is not None:
                log.info("static member %s of group %s rejoins with a new member id; replacing %s",
                         group_instance_id, group.group_id, old_member_id)
                self._update_static_member_and_rebalance(
                    fut, group, old_member_id, new_member_id, group_instance_id, protocols,
                    rebalance_timeout_ms, session_timeout_ms, supports_skip_assignment, reason)
            else:
                self._add_member_and_rebalance(
                    fut, group, new_member_id, group_instance_id, client_id, client_host,
                    rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols, reason)
        elif require_known_member_id:
            # JoinGroup v4+: hand out the id and have the member come back with it
            self._add_pending_member(group, new_member_id, session_timeout_ms)
            fut.set_result(JoinGroupResult(ErrorCode.MEMBER_ID_REQUIRED, new_member_id))
        else:
            self._add_member_and_rebalance(
                fut, group, new_member_id, None, client_id, client_host, rebalance_timeout_ms,
                session_timeout_ms, protocol_type, protocols, reason)

    def _current_member_join(self, fut: asyncio.Future, group: _Group, member_id: str,
                             group_instance_id: str | None, client_id: str, client_host: str,
                             rebalance_timeout_ms: int, session_timeout_ms: int,
                             protocol_type: str, protocols: list[tuple[str, bytes]],
                             reason: str) -> None:
        def respond(error: ErrorCode) -> None:
            fut.set_result(JoinGroupResult(error, member_id))

        if group.state == GroupState.DEAD:
            return respond(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(protocol_type, {name for name, _ in protocols}):
            return respond(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if member_id in group.pending_members:
            if group_instance_id is not None:
                # pending members are dynamic only; Kafka treats this as a broken client
                return respond(ErrorCode.UNKNOWN_MEMBER_ID)
            self._add_member_and_rebalance(
                fut, group, member_id, None, client_id, client_host, rebalance_timeout_ms,
                session_timeout_ms, protocol_type, protocols, reason)
            return
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return respond(error)

        member = group.members[member_id]
        state = group.state
        if state == GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                              session_timeout_ms, fut,
                                              f"member {member_id} joining during rebalance")
        elif state == GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # a retry of a JoinGroup whose response was lost: same generation again
                fut.set_result(self._current_generation_result(group, member_id))
            else:
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                                  session_timeout_ms, fut,
                                                  f"member {member_id} changed its metadata")
        elif state == GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # the leader rejoining forces a rebalance (e.g. topic metadata changed)
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                                  session_timeout_ms, fut,
                                                  f"member {member_id} rejoining a stable group")
            else:
                fut.set_result(JoinGroupResult(
                    ErrorCode.NONE, member_id, group.generation_id, group.protocol_type,
                    group.protocol_name, group.leader_id or ""))
        else:  # Empty: a member id the group no longer knows
            respond(ErrorCode.UNKNOWN_MEMBER_ID)

    @staticmethod
    def _current_generation_result(group: _Group, member_id: str) -> JoinGroupResult:
        return JoinGroupResult(
            ErrorCode.NONE, member_id, group.generation_id, group.protocol_type,
            group.protocol_name, group.leader_id or "",
            group.current_member_metadata() if group.is_leader(member_id) else ())

    def _add_member_and_rebalance(self, fut: asyncio.Future, group: _Group, member_id: str,
                                  group_instance_id: str | None, client_id: str, client_host: str,
                                  rebalance_timeout_ms: int, session_timeout_ms: int,
                                  protocol_type: str, protocols: list[tuple[str, bytes]],
                                  reason: str) -> None:
        member = _Member(member_id, group_instance_id, client_id, client_host,
                         rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols)
        member.is_new = True
        if group.state == GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, fut)
        # a new member cannot heartbeat until it has its first JoinGroup response, and its
        # parked JoinGroup hides a disconnect: it gets a long fixed deadline instead
        self._schedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id} "
                                             f"(instance id {group_instance_id}); reason: {reason}")

    def _update_member_and_rebalance(self, group: _Group, member: _Member,
                                     protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                                     session_timeout_ms: int, fut: asyncio.Future,
                                     reason: str) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        self._maybe_prepare_rebalance(group, reason)

    def _update_static_member_and_rebalance(
            self, fut: asyncio.Future, group: _Group, old_member_id: str, new_member_id: str,
            group_instance_id: str, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
            session_timeout_ms: int, supports_skip_assignment: bool, reason: str) -> None:
        current_leader = group.leader_id
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat(group, member)
        old_protocols = member.protocols
        old_rebalance_timeout = member.rebalance_timeout_ms
        old_session_timeout = member.session_timeout_ms
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)

        if group.state == GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # same protocol: no rebalance, just persist the new member id
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                record = self._group_metadata_record(group, assignment)
                self._spawn(self._finish_static_rejoin(
                    group, member, fut, record, group_instance_id, old_member_id, new_member_id,
                    current_leader, old_protocols, old_rebalance_timeout, old_session_timeout,
                    supports_skip_assignment), f"static rejoin in {group.group_id}")
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {group_instance_id} rejoined with another protocol")
        elif group.state == GroupState.COMPLETING_REBALANCE:
            # the leader may be assigning to the old member id: start over
            self._prepare_rebalance(group, f"static member {group_instance_id} rejoined "
                                           f"during CompletingRebalance; reason: {reason}")
        elif group.state == GroupState.PREPARING_REBALANCE:
            pass  # its JoinGroup is parked with the others
        else:
            group.invoke_join(member, JoinGroupResult(ErrorCode.UNKNOWN_SERVER_ERROR, new_member_id))

    async def _finish_static_rejoin(self, group: _Group, member: _Member, fut: asyncio.Future,
                                    record: tuple[bytes, bytes | None], group_instance_id: str,
                                    old_member_id: str, new_member_id: str,
                                    current_leader: str | None, old_protocols: list,
                                    old_rebalance_timeout: int, old_session_timeout: int,
                                    supports_skip_assignment: bool) -> None:
        error = await self._store_group([record], group)
        if member.awaiting_join is not fut:
            return  # superseded (fenced, removed or re-joined meanwhile)
        if error != ErrorCode.NONE:
            log.warning("failed to persist static member %s of group %s: %s", group_instance_id,
                        group.group_id, error.name)
            group.update_member(member, old_protocols, old_rebalance_timeout, old_session_timeout,
                                None)
            if group.members.get(new_member_id) is member:
                group.replace_static_member(group_instance_id, new_member_id, old_member_id)
                self._schedule_heartbeat(group, member)
            if not fut.done():
                fut.set_result(JoinGroupResult(
                    error, UNKNOWN_MEMBER_ID, group.generation_id, group.protocol_type,
                    group.protocol_name, current_leader or ""))
            return
        if group.state != GroupState.STABLE:
            return  # a rebalance started meanwhile; it will answer this JoinGroup
        if supports_skip_assignment:
            # JoinGroup v9+: a static leader learns it leads but skips running the assignor
            is_leader = group.is_leader(new_member_id)
            group.invoke_join(member, JoinGroupResult(
                ErrorCode.NONE, new_member_id, group.generation_id, group.protocol_type,
                group.protocol_name, group.leader_id or "",
                group.current_member_metadata() if is_leader else (), skip_assignment=is_leader))
        else:
            # older clients get the old leader id, so a rejoined leader does not assign
            group.invoke_join(member, JoinGroupResult(
                ErrorCode.NONE, new_member_id, group.generation_id, group.protocol_type,
                group.protocol_name, current_leader or ""))
        self._schedule_heartbeat(group, member)

    # ================================================================== SyncGroup
    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: Mapping[str, bytes] | Iterable[tuple[str, bytes]] = (),
    ) -> SyncGroupResult:
        """SyncGroup v0-5. The leader sends ``assignments`` (member id -> bytes); every
        member's response waits until the leader's assignment is stored. ``protocol_type`` /
        ``protocol_name`` (v5+) must match the group's when given."""
        fut = asyncio.get_running_loop().create_future()
        items = assignments.items() if isinstance(assignments, Mapping) else assignments
        self._handle_sync(fut, group_id, generation_id, member_id, group_instance_id,
                          protocol_type, protocol_name, {m: bytes(a or b"") for m, a in items})
        return await fut

    def _handle_sync(self, fut: asyncio.Future, group_id: str, generation_id: int,
                     member_id: str, group_instance_id: str | None, protocol_type: str | None,
                     protocol_name: str | None, assignment: dict[str, bytes]) -> None:
        def respond(error: ErrorCode) -> None:
            fut.set_result(SyncGroupResult(error))

        error = self._status_error(group_id, allow_empty_id=False)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance state was lost: have the member rejoin without rediscovery
            return respond(ErrorCode.REBALANCE_IN_PROGRESS)
        if error is not None:
            return respond(error)
        group = self._groups.get(group_id)
        if group is None:
            return respond(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return respond(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return respond(error)
        if generation_id != group.generation_id:
            return respond(ErrorCode.ILLEGAL_GENERATION)
        if protocol_type is not None and group.protocol_type != protocol_type:
            return respond(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if protocol_name is not None and group.protocol_name != protocol_name:
            return respond(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)

        if group.state == GroupState.EMPTY:
            return respond(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.PREPARING_REBALANCE:
            return respond(ErrorCode.REBALANCE_IN_PROGRESS)

        member = group.members[member_id]
        if group.state == GroupState.COMPLETING_REBALANCE:
            old = member.awaiting_sync
            member.awaiting_sync = fut
            if old is not None and old is not fut and not old.done():
                old.set_result(SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                full = {m: assignment.get(m, b"") for m in group.members}
                missing = [m for m in group.members if m not in assignment]
                if missing:
                    log.warning("group %s generation %d: empty assignment for members %s",
                                group_id, group.generation_id, missing)
                record = self._group_metadata_record(group, full)
                self._spawn(self._complete_sync(group, group.generation_id, full, record),
                            f"store assignment of {group_id}")
            return

        # Stable: hand out the current assignment
        self._remove_pending_sync_member(group, member_id)
        fut.set_result(SyncGroupResult(ErrorCode.NONE, group.protocol_type, group.protocol_name,
                                       member.assignment))
        self._schedule_heartbeat(group, member)

    async def _complete_sync(self, group: _Group, generation: int, assignment: dict[str, bytes],
                             record: tuple[bytes, bytes | None]) -> None:
        error = await self._store_group([record], group)
        if group.state != GroupState.COMPLETING_REBALANCE or group.generation_id != generation:
            return  # the group moved on meanwhile (a member joined, left or expired)
        if error != ErrorCode.NONE:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, f"error {error.name} storing the assignment")
        else:
            self._set_and_propagate_assignment(group, assignment)
            group.transition(GroupState.STABLE, self._now())

    # ================================================================== Heartbeat
    def heartbeat(self, group_id: str, member_id: str, generation_id: int, *,
                  group_instance_id: str | None = None) -> ErrorCode:
        """Heartbeat v0-4: NONE, REBALANCE_IN_PROGRESS (rejoin), or an error."""
        error = self._status_error(group_id, allow_empty_id=False)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return ErrorCode.NONE  # still loading: answer blindly, as Kafka does
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, group.members[member_id])
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # ================================================================== LeaveGroup
    def leave_group(self, group_id: str, members: Iterable[LeaveMember | tuple]) -> LeaveGroupResult:
        """LeaveGroup v0-5 (v0-2 send one member; v3+ a batch, where an empty member id with
        a group instance id removes that static member)."""
        leaving = [m if isinstance(m, LeaveMember) else LeaveMember(*m) for m in members]
        error = self._status_error(group_id, allow_empty_id=False)
        if error is not None:
            return LeaveGroupResult(error)
        group = self._groups.get(group_id)
        if group is None:
            return LeaveGroupResult(ErrorCode.NONE, tuple(
                LeaveMemberResult(m.member_id, m.group_instance_id, ErrorCode.UNKNOWN_MEMBER_ID)
                for m in leaving))
        if group.state == GroupState.DEAD:
            return LeaveGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)

        results = []
        for m in leaving:
            if m.member_id == UNKNOWN_MEMBER_ID:
                current = (group.static_members.get(m.group_instance_id)
                           if m.group_instance_id is not None else None)
                if current is None:
                    member_error = ErrorCode.UNKNOWN_MEMBER_ID
                else:
                    self._leave(group, group.members[current], m.reason)
                    member_error = ErrorCode.NONE
            elif m.member_id in group.pending_members:
                group.pending_members.pop(m.member_id).cancel()
                if group.state == GroupState.PREPARING_REBALANCE:
                    self._check_join(group)
                member_error = ErrorCode.NONE
            else:
                member_error = self._validate_current_member(group, m.member_id,
                                                             m.group_instance_id)
                if member_error is None:
                    self._leave(group, group.members[m.member_id], m.reason)
                    member_error = ErrorCode.NONE
            results.append(LeaveMemberResult(m.member_id, m.group_instance_id, member_error))
        return LeaveGroupResult(ErrorCode.NONE, tuple(results))

    def _leave(self, group: _Group, member: _Member, reason: str | None) -> None:
        log.info("member %s left group %s (reason: %s)", member.member_id, group.group_id,
                 reason or "not provided")
        self._remove_member_and_update_group(group, member)

    # ================================================================== OffsetCommit
    async def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        offsets: Iterable[OffsetCommitPartition | tuple],
        *,
        group_instance_id: str | None = None,
        retention_time_ms: int = DEFAULT_RETENTION_TIME,
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit v2-8. Generation -1 with an empty member id is a "simple" commit,
        allowed while the group has no members (it creates the group if needed). Answers
        after the records are appended; returns a code per (topic, partition)."""
        entries = [o if isinstance(o, OffsetCommitPartition) else OffsetCommitPartition(*o)
                   for o in offsets]

        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        error = self._status_error(group_id, allow_empty_id=True)
        if error is not None:
            return all_(error)
        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                log.info("creating simple consumer group %s via manual offset commit", group_id)
                group = self._get_or_create_group(group_id)
            else:
                return all_(ErrorCode.ILLEGAL_GENERATION)

        error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id)
        if error is not None:
            return all_(error)
        if group.state == GroupState.COMPLETING_REBALANCE:
            return all_(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            if member is not None:
                self._schedule_heartbeat(group, member)
        return await self._store_offsets(group, entries, retention_time_ms)

    @staticmethod
    def _validate_offset_commit(group: _Group, generation_id: int, member_id: str,
                                group_instance_id: str | None,
                                transactional: bool = False) -> ErrorCode | None:
        """Kafka's validateOffsetCommit. A transactional commit without member id and
        generation (TxnOffsetCommit v0-2 carry none) is accepted whatever the group's state."""
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return None  # admin client or a consumer with manual assignment
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = GroupCoordinator._validate_current_member(group, member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
            return None
        if not transactional and group.state != GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit to a non-empty group
        return None

    async def _store_offsets(self, group: _Group, entries: list[OffsetCommitPartition],
                             retention_time_ms: int) -> dict[TopicPartition, ErrorCode]:
        now = self._now()
        expire = NO_TIMESTAMP if retention_time_ms == DEFAULT_RETENTION_TIME else now + retention_time_ms
        result, valid = self._valid_commits(entries, now, expire)
        if not valid:
            return result

        group.received_consumer_commits = True
        self._warn_mixed_commits(group)
        records = []
        for (topic, partition), c in valid.items():
            c.seq = next(self._seq)
            records.append(offset_commit_record(group.group_id, topic, partition, OffsetCommitValue(
                offset=c.offset, metadata=c.metadata, commit_timestamp=c.commit_timestamp,
                leader_epoch=c.leader_epoch, expire_timestamp=c.expire_timestamp)))
            group.pending_offset_commits[(topic, partition)] = (
                group.pending_offset_commits.get((topic, partition), 0) + 1)

        partition = self.partition_for(group.group_id)
        error = await self._append(partition, records)
        alive = group.state != GroupState.DEAD
        undone = []
        for tp, c in valid.items():
            pending = group.pending_offset_commits.get(tp)
            if pending is None:
                # its offset (topic, group) was deleted during the append: delete it again
                if error == ErrorCode.NONE:
                    undone.append(offset_commit_record(group.group_id, tp[0], tp[1], None))
                continue
            if alive and error == ErrorCode.NONE:
                current = group.offsets.get(tp)
                if current is None or current.seq < c.seq:
                    group.offsets[tp] = c
            if pending <= 1:
                del group.pending_offset_commits[tp]
            else:
                group.pending_offset_commits[tp] = pending - 1
        if undone:
            await self._append_tombstones({partition: undone})
        code = _OFFSET_STORE_ERRORS.get(error, error)
        for tp in valid:
            result[tp] = code
        return {(e.topic, e.partition): result[(e.topic, e.partition)] for e in entries}

    def _valid_commits(self, entries: list[OffsetCommitPartition], now: int,
                       expire: int) -> tuple[dict[TopicPartition, ErrorCode],
                                             dict[TopicPartition, _CommittedOffset]]:
        """OFFSET_METADATA_TOO_LARGE for the entries whose metadata is over
        ``offset.metadata.max.bytes``; the others as offsets to store."""
        max_meta = self.config.offset_metadata_max_bytes
        too_large: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, _CommittedOffset] = {}
        for e in entries:
            tp = (e.topic, e.partition)
            metadata = e.metadata if e.metadata is not None else ""
            if len(metadata) > max_meta:
                too_large[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            valid[tp] = _CommittedOffset(
                e.offset, e.leader_epoch if e.leader_epoch is not None else NO_LEADER_EPOCH,
                metadata, now, expire, 0)
        return too_large, valid

    @staticmethod
    def _warn_mixed_commits(group: _Group) -> None:
        if group.received_consumer_commits and group.received_txn_commits:
            log.warning("group %s (leader %s) has received offset commits from consumers as well "
                        "as transactional producers; mixing both generally gives surprises and "
                        "should be avoided", group.group_id, group.leader_id)

    # ================================================================== TxnOffsetCommit
    async def commit_transactional_offsets(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: Iterable[OffsetCommitPartition | tuple],
        *,
        member_id: str = UNKNOWN_MEMBER_ID,
        generation_id: int = NO_GENERATION,
        group_instance_id: str | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit v0-5 (Kafka's handleTxnCommitOffsets): the offsets are appended as
        one transactional batch of ``producer_id``/``producer_epoch`` and stay pending for that
        producer until ``complete_transaction``. An unknown group is created (Empty). Members
        of a group (v3+: member id, generation, instance id) are validated as for OffsetCommit;
        without them the commit is accepted in any group state. Returns a code per (topic,
        partition). ``transactional_id`` is for the log only: that the producer added the
        group to its transaction (AddOffsetsToTxn) is the transaction coordinator's concern."""
        entries = [o if isinstance(o, OffsetCommitPartition) else OffsetCommitPartition(*o)
                   for o in offsets]

        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        error = self._status_error(group_id, allow_empty_id=False)
        if error is not None:
            return all_(error)
        group = self._groups.get(group_id)
        if group is None:
            log.info("creating group %s for a transactional offset commit of %s", group_id,
                     transactional_id)
            group = self._get_or_create_group(group_id)
        error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id,
                                             transactional=True)
        if error is not None:
            return all_(error)
        if not entries:
            return {}
        return await self._store_txn_offsets(group, producer_id, producer_epoch, entries)

    async def _store_txn_offsets(self, group: _Group, producer_id: int, producer_epoch: int,
                                 entries: list[OffsetCommitPartition]
                                 ) -> dict[TopicPartition, ErrorCode]:
        result, valid = self._valid_commits(entries, self._now(), NO_TIMESTAMP)
        if not valid:
            return result
        group.received_txn_commits = True
        self._warn_mixed_commits(group)
        # pending before the append (Kafka's prepareTxnOffsetCommit): a stable OffsetFetch
        # sees them from now on
        pending = group.pending_txn_offsets.setdefault(producer_id, {})
        records = []
        for (topic, partition), c in valid.items():
            c.seq = next(self._seq)
            pending[(topic, partition)] = c
            records.append(offset_commit_record(group.group_id, topic, partition, OffsetCommitValue(
                offset=c.offset, metadata=c.metadata, commit_timestamp=c.commit_timestamp,
                leader_epoch=c.leader_epoch, expire_timestamp=c.expire_timestamp)))
        self._txn_groups.setdefault(producer_id, set()).add(group.group_id)

        error = await self._append(self.partition_for(group.group_id), records,
                                   producer_id=producer_id, producer_epoch=producer_epoch,
                                   transactional=True)
        if error != ErrorCode.NONE and group.state != GroupState.DEAD:
            # Kafka's failPendingTxnOffsetCommit: not in the log, so not in the transaction
            # (a newer commit of the same partition by the producer stays)
            current = group.pending_txn_offsets.get(producer_id)
            if current is not None:
                for tp, c in valid.items():
                    if current.get(tp) is c:
                        del current[tp]
                if not current:
                    del group.pending_txn_offsets[producer_id]
                    self._forget_txn_group(producer_id, group.group_id)
        code = _OFFSET_STORE_ERRORS.get(error, error)
        for tp in valid:
            result[tp] = code
        return {(e.topic, e.partition): result[(e.topic, e.partition)] for e in entries}

    def _forget_txn_group(self, producer_id: int, group_id: str) -> None:
        groups = self._txn_groups.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self._txn_groups[producer_id]

    def complete_transaction(self, offsets_partition: int, producer_id: int,
                             commit: bool) -> None:
        """The marker of ``producer_id``'s transaction is in ``__consumer_offsets-
        <offsets_partition>`` (Kafka's handleTxnCompletion): the offsets the transaction
        committed to that partition's groups become their committed offsets — each only if
        its record is newer than the current offset's — or, on abort, are dropped. Called on
        the event loop once the marker is appended."""
        group_ids = self._txn_groups.get(producer_id)
        if not group_ids:
            return
        for group_id in [g for g in group_ids if self.partition_for(g) == offsets_partition]:
            group_ids.discard(group_id)
            group = self._groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                log.info("group %s is gone from this coordinator after the marker of producer "
                         "%d was written; its next coordinator loads the outcome", group_id,
                         producer_id)
                continue
            pending = group.pending_txn_offsets.pop(producer_id, None)
            if not pending or not commit:
                log.debug("transactional offsets of producer %d in group %s %s", producer_id,
                          group_id, "committed" if commit else "aborted")
                continue
            for tp, c in pending.items():
                current = group.offsets.get(tp)
                if current is None or current.seq < c.seq:
                    group.offsets[tp] = c
                else:
                    log.debug("transactional offset %d of %s in group %s committed but older "
                              "than the current offset %d", c.offset, tp, group_id,
                              current.offset)
        if not group_ids:
            self._txn_groups.pop(producer_id, None)

    # ================================================================== OffsetFetch
    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None, *,
                      require_stable: bool = False) -> OffsetFetchResult:
        """OffsetFetch v1-7 for one group (v8+ batches call this per group). ``partitions``
        None means every partition with a committed offset. Unknown partitions get offset -1;
        with ``require_stable`` a partition with a commit in flight or in an open transaction
        gets UNSTABLE_OFFSET_COMMIT."""
        error = self._status_error(group_id, allow_empty_id=True)
        if error is not None:
            return OffsetFetchResult(error)
        wanted = None if partitions is None else [(t, p) for t, p in partitions]
        unknown = FetchedOffset(NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.NONE)
        group = self._groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return OffsetFetchResult(ErrorCode.NONE, {tp: unknown for tp in wanted or ()})
        out: dict[TopicPartition, FetchedOffset] = {}
        for tp in (wanted if wanted is not None else list(group.offsets)):
            if require_stable and group.has_pending_commit(tp):
                out[tp] = FetchedOffset(NO_OFFSET, NO_LEADER_EPOCH, "",
                                        ErrorCode.UNSTABLE_OFFSET_COMMIT)
                continue
            c = group.offsets.get(tp)
            out[tp] = unknown if c is None else FetchedOffset(c.offset, c.leader_epoch, c.metadata)
        return OffsetFetchResult(ErrorCode.NONE, out)

    # ================================================================== Describe / List
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        out = []
        for group_id in group_ids:
            error = self._status_error(group_id, allow_empty_id=True)
            if error is not None:
                out.append(DescribedGroup(group_id, error, ""))
                continue
            group = self._groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                out.append(DescribedGroup(group_id, ErrorCode.NONE, GroupState.DEAD.value))
                continue
            if group.state == GroupState.STABLE and group.protocol_name is not None:
                protocol = group.protocol_name
                members = tuple(DescribedMember(m.member_id, m.group_instance_id, m.client_id,
                                                m.client_host, m.metadata(protocol), m.assignment)
                                for m in group.members.values())
            else:
                protocol = ""
                members = tuple(DescribedMember(m.member_id, m.group_instance_id, m.client_id,
                                                m.client_host, b"", b"")
                                for m in group.members.values())
            out.append(DescribedGroup(group_id, ErrorCode.NONE, group.state.value,
                                      group.protocol_type or "", protocol, members))
        return out

    def list_groups(self, states: Iterable[str] | None = None,
                    types: Iterable[str] | None = None) -> ListGroupsResult:
        """ListGroups v0-5; ``states`` (v4+) and ``types`` (v5+) filter case-insensitively;
        every group here is of type "classic"."""
        if not self._active:
            return ListGroupsResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        state_filter = {s.lower() for s in states} if states else None
        type_filter = {t.lower() for t in types} if types else None
        if type_filter is not None and CLASSIC_GROUP_TYPE not in type_filter:
            return ListGroupsResult(ErrorCode.NONE)
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self._loading else ErrorCode.NONE
        groups = tuple(
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if g.state != GroupState.DEAD
            and (state_filter is None or g.state.value.lower() in state_filter))
        return ListGroupsResult(error, groups)

    # ================================================================== DeleteGroups / OffsetDelete
    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: only Empty groups go (NON_EMPTY_GROUP otherwise); their offsets and
        metadata are tombstoned."""
        errors: dict[str, ErrorCode] = {}
        eligible: list[_Group] = []
        for group_id in group_ids:
            error = self._status_error(group_id, allow_empty_id=True)
            if error is not None:
                errors[group_id] = error
                continue
            group = self._groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                errors[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state == GroupState.EMPTY:
                group.transition(GroupState.DEAD, self._now())
                eligible.append(group)
            else:
                errors[group_id] = ErrorCode.NON_EMPTY_GROUP
        if eligible:
            removed = await self._cleanup_groups(eligible, lambda g: self._remove_offsets(g, None))
            log.info("deleted groups %s (%d offsets removed)", [g.group_id for g in eligible],
                     removed)
            for g in eligible:
                errors[g.group_id] = ErrorCode.NONE
        return errors

    async def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete, as Kafka answers it: a group error (INVALID_GROUP_ID for "",
        GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP for a non-consumer group with members) and no
        partitions; else a code per requested partition: GROUP_SUBSCRIBED_TO_TOPIC for a topic
        the members consume, NONE for the rest (with or without an offset to delete)."""
        wanted = [(t, p) for t, p in partitions]
        error = self._status_error(group_id, allow_empty_id=False)
        if error is not None:
            return error, {}
        group = self._groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        partition_errors: dict[TopicPartition, ErrorCode] = {}
        if group.state == GroupState.EMPTY:
            eligible = wanted
        elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            eligible = [tp for tp in wanted if not group.is_subscribed_to(tp[0])]
            for tp in wanted:
                if group.is_subscribed_to(tp[0]):
                    partition_errors[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        else:
            return ErrorCode.NON_EMPTY_GROUP, {}
        if eligible:
            # as in Kafka 4, an Empty group left without offsets waits for the expiry pass
            await self._cleanup_groups([group], lambda g: self._remove_offsets(g, eligible),
                                       drop_empty=False)
            for tp in eligible:
                partition_errors[tp] = ErrorCode.NONE
        return ErrorCode.NONE, partition_errors

    @staticmethod
    def _remove_offsets(group: _Group, tps: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        """Remove the offsets of ``tps`` (None: all, commits in flight and in open
        transactions included); those that were stored. A commit in flight loses its pending
        entry, so that its completion tombstones it instead of storing it; an open
        transaction's offset of ``tps`` is dropped, so its commit does not bring it back (the
        producer stays pending until its marker, as in Kafka's removeOffsets)."""
        keys = (list(itertools.chain(group.offsets, group.pending_offset_commits,
                                     group.pending_txn_partitions())) if tps is None
                else list(tps))
        removed = []
        for tp in keys:
            group.pending_offset_commits.pop(tp, None)
            for pending in group.pending_txn_offsets.values():
                pending.pop(tp, None)
            if group.offsets.pop(tp, None) is not None:
                removed.append(tp)
        return removed

    async def _cleanup_groups(self, groups: Iterable[_Group],
                              selector: Callable[[_Group], list[TopicPartition]], *,
                              drop_empty: bool = True) -> int:
        """Kafka's cleanupGroupMetadata: remove offsets chosen by ``selector``; an Empty group
        left without offsets dies (with ``drop_empty``) as a Dead one does; tombstone what
        went."""
        removed_count, by_partition = self._remove_from_groups(groups, selector, drop_empty)
        await self._append_tombstones(by_partition)
        return removed_count

    def _remove_from_groups(self, groups: Iterable[_Group],
                            selector: Callable[[_Group], list[TopicPartition]],
                            drop_empty: bool = True
                            ) -> tuple[int, dict[int, list[tuple[bytes, bytes | None]]]]:
        """The in-memory half of ``_cleanup_groups``: the number of offsets removed and the
        tombstones to append, by ``__consumer_offsets`` partition."""
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        removed_count = 0
        for group in groups:
            removed = selector(group)
            if drop_empty and group.state == GroupState.EMPTY and not group.has_offsets():
                log.info("group %s transitioned to Dead in generation %d", group.group_id,
                         group.generation_id)
                group.transition(GroupState.DEAD, self._now())
            records = [offset_commit_record(group.group_id, t, p, None) for t, p in removed]
            if group.state == GroupState.DEAD and self._groups.get(group.group_id) is group:
                self._drop_group(group)
                # a generation-0 group only ever stored offsets: it has no metadata record
                if group.generation_id > 0:
                    records.append(group_metadata_record(group.group_id, None))
            removed_count += len(removed)
            if records:
                by_partition.setdefault(self.partition_for(group.group_id), []).extend(records)
        return removed_count, by_partition

    async def _append_tombstones(self, by_partition: Mapping[int, list[tuple[bytes, bytes | None]]]
                                 ) -> None:
        for partition, records in by_partition.items():
            error = await self._append(partition, records)
            if error != ErrorCode.NONE:
                log.warning("failed to append %d tombstones to __consumer_offsets-%d: %s",
                            len(records), partition, error.name)

    # ================================================================== deleted topics
    def on_topic_deleted(self, info: Any) -> None:
        """Cluster-metadata listener (any thread): ``info.name`` is gone, and so are its
        committed offsets in every group, as Kafka's onPartitionsDeleted does. On the loop's
        thread the offsets leave memory before this returns (so before DeleteTopics is
        answered); their tombstones are appended right after."""
        loop = self._loop
        if loop is None or not self._active:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._delete_topic_offsets(info.name)
        else:
            loop.call_soon_threadsafe(self._delete_topic_offsets, info.name)

    def _delete_topic_offsets(self, topic: str) -> None:
        def of_topic(group: _Group) -> list[TopicPartition]:
            return self._remove_offsets(group, [
                tp for tp in itertools.chain(group.offsets, group.pending_offset_commits,
                                             group.pending_txn_partitions())
                if tp[0] == topic])

        removed, by_partition = self._remove_from_groups(list(self._groups.values()), of_topic,
                                                         drop_empty=False)
        if by_partition:
            log.info("removed %d offsets of deleted topic %s", removed, topic)
            self._spawn(self._append_tombstones(by_partition), f"tombstones of topic {topic}")

    def _drop_group(self, group: _Group) -> None:
        self._cancel_group_timers(group)
        self._groups.pop(group.group_id, None)
        for producer_id in group.pending_txn_offsets:
            self._forget_txn_group(producer_id, group.group_id)

    def _cancel_group_timers(self, group: _Group) -> None:
        if group.join_op is not None and group.join_op.handle is not None:
            group.join_op.handle.cancel()
        group.join_op = None
        self._cancel_sync_op(group)
        for handle in group.pending_members.values():
            handle.cancel()
        group.pending_members.clear()
        for m in group.members.values():
            if m.heartbeat_timer is not None:
                m.heartbeat_timer.cancel()
                m.heartbeat_timer = None

    # ================================================================== offsets retention
    async def expire_offsets(self) -> int:
        """One pass of ``offsets.retention.minutes`` expiry (Kafka's cleanupGroupMetadata):
        an Empty group's offsets go once it has been empty for the retention time (or, without
        a state timestamp, once each commit is that old); a simple group's (no protocol type)
        and a Stable consumer group's offsets of topics it no longer subscribes to go when the
        commit is that old; commits carrying an explicit expire timestamp (v2-4 retention
        time) go at that timestamp. Empty groups left without offsets are deleted."""
        now = self._now()
        retention = self.config.offsets_retention_ms

        def expired(group: _Group) -> list[TopicPartition]:
            if group.protocol_type and group.state == GroupState.EMPTY:
                def base(c: _CommittedOffset) -> int:
                    return (group.state_timestamp if group.state_timestamp is not None
                            else c.commit_timestamp)
                subscribed: set[str] = set()
            elif (group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.subscribed_topics is not None
                  and group.state == GroupState.STABLE):
                def base(c: _CommittedOffset) -> int:
                    return c.commit_timestamp
                subscribed = group.subscribed_topics
            elif not group.protocol_type:
                def base(c: _CommittedOffset) -> int:
                    return c.commit_timestamp
                subscribed = set()
            else:
                return []
            gone = []
            for tp, c in group.offsets.items():
                if tp[0] in subscribed or tp in group.pending_offset_commits:
                    continue
                if c.expire_timestamp == NO_TIMESTAMP:
                    if now - base(c) >= retention:
                        gone.append(tp)
                elif now >= c.expire_timestamp:
                    gone.append(tp)
            for tp in gone:
                del group.offsets[tp]
            return gone

        removed = await self._cleanup_groups(list(self._groups.values()), expired)
        if removed:
            log.info("removed %d expired offsets", removed)
        return removed

    def _schedule_retention(self) -> None:
        if self._retention_timer is not None or not self._active:
            return
        interval = self.config.offsets_retention_check_interval_ms
        if interval <= 0:
            return

        def fire() -> None:
            self._retention_timer = None
            if not self._active:
                return
            self._spawn(self.expire_offsets(), "offsets expiry")
            self._schedule_retention()
        self._retention_timer = self._timers.call_later(interval, fire)

    # ================================================================== load / unload
    def load(self, partitions: Iterable[int] | None = None) -> None:
        """Become coordinator of ``partitions`` of ``__consumer_offsets`` (all by default):
        replay each to rebuild its groups and committed offsets. Loaded groups are Stable
        (members from their last metadata record, whose sessions start now) or Empty."""
        parts = (range(self.config.offsets_topic_num_partitions) if partitions is None
                 else list(partitions))
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        for partition in parts:
            if partition in self._owned:
                continue
            self._loading.add(partition)
            try:
                self._load_partition(partition)
            finally:
                self._loading.discard(partition)
            self._owned.add(partition)
        self._schedule_retention()

    def _replayed(self, partition: int) -> Iterable[Any]:
        """The partition's records and transaction markers in log order (``replay_batches``),
        or its committed records as plain ones for a log without transaction structure."""
        replay_batches = getattr(self._log, "replay_batches", None)
        if replay_batches is not None:
            yield from replay_batches(partition)
            return
        for key, value in self._log.replay(partition):
            yield _PlainRecord(key, value)

    def load_in_background(self, partitions: Iterable[int] | None = None) -> None:
        """``load`` for a running broker: each partition's log is replayed in a worker thread
        (the event loop keeps serving every other request; the partition's groups answer
        COORDINATOR_LOAD_IN_PROGRESS meanwhile, as Kafka's do), then applied on the loop.
        A partition unloaded during its replay is not applied."""
        self._loop = asyncio.get_running_loop()
        parts = (range(self.config.offsets_topic_num_partitions) if partitions is None
                 else list(partitions))
        for partition in parts:
            if partition in self._owned or partition in self._loading:
                continue
            self._loading.add(partition)
            token = self._load_tokens[partition] = object()
            self._spawn(self._load_async(partition, token),
                        f"loading __consumer_offsets-{partition}")

    async def _load_async(self, partition: int, token: object) -> None:
        started = time.monotonic()
        try:
            scanned = await asyncio.to_thread(self._scan_partition, partition)
        except Exception:  # noqa: BLE001 - the partition stays unserved; a new leadership retries
            log.exception("loading __consumer_offsets-%d failed", partition)
            if self._load_tokens.get(partition) is token:
                del self._load_tokens[partition]
                self._loading.discard(partition)
            return
        if self._load_tokens.get(partition) is not token:
            return   # unloaded (or loaded again) meanwhile
        del self._load_tokens[partition]
        self._loading.discard(partition)
        self._apply_partition(partition, *scanned)
        self._owned.add(partition)
        self._schedule_retention()
        offsets, _, groups = scanned
        if offsets or groups:
            log.info("loaded %d group(s) and %d offset(s) of __consumer_offsets-%d in %d ms",
                     len(groups), len(offsets), partition, (time.monotonic() - started) * 1000)

    def _load_partition(self, partition: int) -> None:
        self._apply_partition(partition, *self._scan_partition(partition))

    def _scan_partition(self, partition: int) -> tuple:
        """Kafka's doLoadGroupsAndOffsets, the replay (any thread): offsets and group
        metadata as the log last says; an offset of a transaction is held per producer id
        until the producer's marker (commit: it replaces the offset unless that one is newer
        in the log; abort: dropped); the offsets of transactions still open at the end stay
        pending. (offsets, pending, groups) for ``_apply_partition``."""
        Key = tuple[str, str, int]
        offsets: dict[Key, tuple[OffsetCommitValue, int]] = {}
        pending: dict[int, dict[Key, tuple[OffsetCommitValue, int]]] = {}
        groups: dict[str, GroupMetadataValue] = {}
        removed: set[str] = set()
        for item in self._replayed(partition):
            if item.is_marker:
                held = pending.pop(item.producer_id, None)
                if held and item.commit:
                    for k, (v, seq) in held.items():
                        current = offsets.get(k)
                        if current is None or current[1] < seq:
                            offsets[k] = (v, seq)
                continue
            try:
                key, value = decode_record(item.key, item.value)
            except (RecordFormatError, UnicodeDecodeError) as e:
                log.error("skipping undecodable record in __consumer_offsets-%d: %s", partition, e)
                continue
            if isinstance(key, OffsetCommitKey):
                k = (key.group, key.topic, key.partition)
                target = (pending.setdefault(item.producer_id, {}) if item.transactional
                          else offsets)
                if value is None:
                    target.pop(k, None)
                else:
                    target[k] = (value, next(self._seq))
            elif isinstance(key, GroupMetadataKey):
                if value is None:
                    groups.pop(key.group, None)
                    removed.add(key.group)
                else:
                    groups[key.group] = value
                    removed.discard(key.group)
            else:
                log.debug("ignoring record with key version %d in __consumer_offsets-%d",
                          key.version, partition)
        return offsets, pending, groups

    def _apply_partition(self, partition: int, offsets: dict, pending: dict,
                         groups: dict) -> None:
        """The replayed groups and offsets become this coordinator's (on the loop)."""
        if self._topic_exists is not None:
            orphans = [k for k in offsets if not self._topic_exists(k[1])]
            if orphans:
                # their topic was deleted before the tombstones were durable
                log.info("dropping %d offsets of deleted topics %s from __consumer_offsets-%d",
                         len(orphans), sorted({t for _, t, _ in orphans}), partition)
                for k in orphans:
                    del offsets[k]
                if self._loop is not None:
                    self._spawn(self._append_tombstones(
                        {partition: [offset_commit_record(g, t, p, None) for g, t, p in orphans]}),
                        f"tombstones of deleted topics in __consumer_offsets-{partition}")
            for held in pending.values():
                # an open transaction's offsets of a deleted topic: never committed (a load
                # after the marker finds and tombstones them if the transaction commits)
                for k in [k for k in held if not self._topic_exists(k[1])]:
                    del held[k]

        now = self._now()
        loaded: dict[str, _Group] = {}
        for group_id, value in groups.items():
            loaded[group_id] = self._group_from_value(group_id, value, now)
        for (group_id, topic, p), (v, seq) in offsets.items():
            group = loaded.get(group_id)
            if group is None:
                group = loaded[group_id] = _Group(group_id, now)  # offsets only: Empty
            group.offsets[(topic, p)] = _CommittedOffset(
                v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp, seq)
        for producer_id, held in pending.items():
            for (group_id, topic, p), (v, seq) in held.items():
                group = loaded.get(group_id)
                if group is None:
                    group = loaded[group_id] = _Group(group_id, now)  # pending offsets only
                group.pending_txn_offsets.setdefault(producer_id, {})[(topic, p)] = (
                    _CommittedOffset(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp,
                                     v.expire_timestamp, seq))

        for group_id, group in loaded.items():
            if group_id in self._groups:
                log.debug("group %s already cached; not replacing it from the log", group_id)
                continue
            self._groups[group_id] = group
            for producer_id in group.pending_txn_offsets:
                self._txn_groups.setdefault(producer_id, set()).add(group_id)
            log.debug("loaded group %s (%s, generation %d, %d members, %d offsets, %d open "
                      "transactions)", group_id, group.state.value, group.generation_id,
                      len(group.members), len(group.offsets), len(group.pending_txn_offsets))
            if len(group.members) > self.config.group_max_size:
                self._prepare_rebalance(group, "loaded group is over capacity")
            for member in list(group.members.values()):
                self._schedule_heartbeat(group, member)

    @staticmethod
    def _group_from_value(group_id: str, value: GroupMetadataValue, now: int) -> _Group:
        state = GroupState.STABLE if value.members else GroupState.EMPTY
        group = _Group(group_id, now, state)
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        group.state_timestamp = (None if value.current_state_timestamp == NO_TIMESTAMP
                                 else value.current_state_timestamp)
        for m in value.members:
            member = _Member(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                             m.rebalance_timeout, m.session_timeout, value.protocol_type,
                             [(value.protocol or "", m.subscription)], m.assignment)
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def unload(self, partitions: Iterable[int]) -> None:
        """Stop coordinating ``partitions``: their groups are dropped (parked JoinGroup and
        SyncGroup requests get NOT_COORDINATOR)."""
        parts = set(partitions)
        for group in list(self._groups.values()):
            if self.partition_for(group.group_id) in parts:
                self._unload_group(group)
        self._owned -= parts
        self._loading -= parts
        for p in parts:
            self._load_tokens.pop(p, None)

    def _unload_group(self, group: _Group) -> None:
        previous = group.state
        group.transition(GroupState.DEAD, self._now())
        log.info("unloading group %s (%s, generation %d)", group.group_id, previous.value,
                 group.generation_id)
        for member in list(group.members.values()):
            # parked JoinGroups (a rebalance, or a static rejoin being stored) and SyncGroups
            group.invoke_join(member, JoinGroupResult(ErrorCode.NOT_COORDINATOR, member.member_id))
            group.invoke_sync(member, SyncGroupResult(ErrorCode.NOT_COORDINATOR))
        self._drop_group(group)

    def shutdown(self) -> None:
        """Stop serving: unload everything and cancel timers and background work."""
        self.unload(set(self._owned))
        self._active = False
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        for task in list(self._tasks):
            task.cancel()

    # ================================================================== introspection
    def group_state(self, group_id: str) -> GroupState | None:
        group = self._groups.get(group_id)
        return None if group is None else group.state

    @property
    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._owned)
