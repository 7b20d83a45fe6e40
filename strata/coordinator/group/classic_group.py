"""A classic group in memory (Kafka's ``ClassicGroup`` and ``ClassicGroupMember``): its members,
static members, generation, selected protocol, the pending join and sync phases, and its
committed offsets (plain, in flight, and pending in open transactions).

Plain state with invariants kept by its own methods; no timers are started and nothing is
appended here (``membership`` and ``offsets`` do that). The state changes only through
``transition``, against the table in ``state``. Used on the event loop only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Mapping

from strata.common.errors import ErrorCode
from strata.coordinator.group.results import (
    CONSUMER_PROTOCOL_TYPE,
    DescribedGroup,
    DescribedMember,
    JoinGroupMember,
    JoinGroupResult,
    ListedGroup,
    SyncGroupResult,
    TopicPartition,
)
from strata.coordinator.group.state import GroupState, can_rebalance, is_legal
from strata.coordinator.group.timers import TimerHandle
from strata.coordinator.offsets_records import (
    NO_TIMESTAMP,
    GroupMetadataValue,
    MemberMetadataValue,
    consumer_subscription_topics,
    group_metadata_record,
)


@dataclass
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int  # NO_TIMESTAMP unless committed with a retention time (v2-4)
    seq: int               # append order, so a late completion never overwrites a newer one


class ClassicGroupMember:
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


class JoinOp:
    """The pending completion of a PreparingRebalance phase (Kafka's DelayedJoin and
    InitialDelayedJoin)."""

    __slots__ = ("initial", "configured_delay", "delay", "remaining", "handle")

    def __init__(self, initial: bool, configured_delay: int, delay: int, remaining: int):
        self.initial = initial
        self.configured_delay = configured_delay
        self.delay = delay
        self.remaining = remaining
        self.handle: TimerHandle | None = None


class SyncOp:
    __slots__ = ("generation", "handle")

    def __init__(self, generation: int):
        self.generation = generation
        self.handle: TimerHandle | None = None


class ClassicGroup:
    def __init__(self, group_id: str, now_ms: int, state: GroupState = GroupState.EMPTY):
        self.group_id = group_id
        self.state = state
        self.state_timestamp: int | None = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, ClassicGroupMember] = {}
        self.static_members: dict[str, str] = {}
        self.pending_members: dict[str, TimerHandle] = {}
        self.pending_sync_members: set[str] = set()
        self.new_member_added = False
        self.join_op: JoinOp | None = None
        self.sync_op: SyncOp | None = None
        self.subscribed_topics: set[str] | None = None
        self.offsets: dict[TopicPartition, CommittedOffset] = {}
        self.pending_offset_commits: dict[TopicPartition, int] = {}
        # producer id -> offsets of its open transaction (Kafka's
        # pendingTransactionalOffsetCommits); a producer stays here, even with no offsets left
        # (deleted topic), until its marker completes the transaction
        self.pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = {}
        self.received_consumer_commits = False
        self.received_txn_commits = False

    # ---- state
    def transition(self, state: GroupState, now_ms: int) -> None:
        if not is_legal(self.state, state):
            raise RuntimeError(f"group {self.group_id}: invalid transition {self.state.value} -> "
                               f"{state.value}")
        self.state = state
        self.state_timestamp = now_ms

    def can_rebalance(self) -> bool:
        return can_rebalance(self.state)

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

    def add(self, member: ClassicGroupMember, fut: asyncio.Future | None) -> None:
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

    def remove(self, member_id: str) -> ClassicGroupMember | None:
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

    def update_member(self, member: ClassicGroupMember, protocols: list[tuple[str, bytes]],
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

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> ClassicGroupMember:
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
    def _answer(member: ClassicGroupMember, attr: str, result) -> bool:
        """Answer the member's parked request held in ``attr``; False if none is parked."""
        fut = getattr(member, attr)
        if fut is None:
            return False
        setattr(member, attr, None)
        if not fut.done():
            fut.set_result(result)
        return True

    @classmethod
    def invoke_join(cls, member: ClassicGroupMember, result: JoinGroupResult) -> bool:
        return cls._answer(member, "awaiting_join", result)

    @classmethod
    def invoke_sync(cls, member: ClassicGroupMember, result: SyncGroupResult) -> bool:
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

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """Whether ``member_id`` (of static member ``group_instance_id``, if given) is a current
        member: UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID if not."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
            return None
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    # ---- answers
    def describe(self) -> DescribedGroup:
        if self.state == GroupState.STABLE and self.protocol_name is not None:
            protocol = self.protocol_name
            members = tuple(DescribedMember(m.member_id, m.group_instance_id, m.client_id,
                                            m.client_host, m.metadata(protocol), m.assignment)
                            for m in self.members.values())
        else:
            protocol = ""
            members = tuple(DescribedMember(m.member_id, m.group_instance_id, m.client_id,
                                            m.client_host, b"", b"")
                            for m in self.members.values())
        return DescribedGroup(self.group_id, ErrorCode.NONE, self.state.value,
                              self.protocol_type or "", protocol, members)

    def as_listed_group(self) -> ListedGroup:
        return ListedGroup(self.group_id, self.protocol_type or "", self.state.value)

    # ---- records
    def metadata_record(self, assignment: Mapping[str, bytes]) -> tuple[bytes, bytes | None]:
        """The group's metadata record of ``__consumer_offsets``, members with ``assignment``."""
        members = []
        for m in self.members.values():
            if self.protocol_name is None:
                raise RuntimeError(f"group {self.group_id} has members but no protocol")
            members.append(MemberMetadataValue(
                member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                session_timeout=m.session_timeout_ms, rebalance_timeout=m.rebalance_timeout_ms,
                subscription=m.metadata(self.protocol_name),
                assignment=assignment.get(m.member_id, b""),
                group_instance_id=m.group_instance_id))
        value = GroupMetadataValue(
            protocol_type=self.protocol_type or "", generation=self.generation_id,
            protocol=self.protocol_name, leader=self.leader_id,
            current_state_timestamp=(self.state_timestamp if self.state_timestamp is not None
                                     else NO_TIMESTAMP),
            members=tuple(members))
        return group_metadata_record(self.group_id, value)

    @classmethod
    def from_record(cls, group_id: str, value: GroupMetadataValue, now: int) -> "ClassicGroup":
        """The group a metadata record describes: Stable with its members (whose sessions are
        the caller's to start), or Empty."""
        state = GroupState.STABLE if value.members else GroupState.EMPTY
        group = cls(group_id, now, state)
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        group.state_timestamp = (None if value.current_state_timestamp == NO_TIMESTAMP
                                 else value.current_state_timestamp)
        for m in value.members:
            member = ClassicGroupMember(m.member_id, m.group_instance_id, m.client_id,
                                        m.client_host, m.rebalance_timeout, m.session_timeout,
                                        value.protocol_type,
                                        [(value.protocol or "", m.subscription)], m.assignment)
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
        group.subscribed_topics = group.compute_subscribed_topics()
        return group
