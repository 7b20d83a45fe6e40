"""A KIP-848 consumer group in memory (Kafka's ``ConsumerGroup``, ``ConsumerGroupMember`` and
``CurrentAssignmentBuilder``): the group epoch, the target assignment and its epoch, every
member's epoch and current assignment, and the reconciliation that moves a member from its
current assignment towards its target.

The rule the reconciliation keeps: a partition is held (assigned, or pending revocation) by at
most one member at a time. A member is given a partition only once no other member holds it;
until then the member is UNRELEASED_PARTITIONS. A member that must give partitions up keeps its
epoch (UNREVOKED_PARTITIONS) until its heartbeat no longer reports them; only then does it move
to the target's epoch. ``ConsumerGroup.owners`` indexes who holds what. Plain state, no timers,
no I/O; used on the event loop only.
"""

from __future__ import annotations

import uuid
from enum import IntEnum
from typing import Iterable, Mapping

from strata.coordinator.group.assignors import Assignment

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(IntEnum):
    """Kafka's MemberState (the byte stored in ConsumerGroupCurrentMemberAssignmentValue)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class ConsumerGroupState:
    """What DescribeGroups/ListGroups/ConsumerGroupDescribe report for a consumer group."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class FencedMember(Exception):
    """The member's epoch or owned partitions show it is out of date: FENCED_MEMBER_EPOCH."""


def _minus(a: Mapping[uuid.UUID, frozenset[int]],
           b: Mapping[uuid.UUID, frozenset[int]]) -> Assignment:
    out = {}
    for t, ps in a.items():
        rest = ps - b.get(t, frozenset())
        if rest:
            out[t] = frozenset(rest)
    return out


def _intersect(a: Mapping[uuid.UUID, frozenset[int]],
               b: Mapping[uuid.UUID, frozenset[int]]) -> Assignment:
    out = {}
    for t, ps in a.items():
        both = ps & b.get(t, frozenset())
        if both:
            out[t] = frozenset(both)
    return out


def _union(a: Mapping[uuid.UUID, frozenset[int]],
           b: Mapping[uuid.UUID, frozenset[int]]) -> Assignment:
    out = dict(a)
    for t, ps in b.items():
        out[t] = frozenset(out.get(t, frozenset()) | ps)
    return {t: ps for t, ps in out.items() if ps}


def is_subset(owned: Iterable[tuple[uuid.UUID, Iterable[int]]] | None,
              target: Mapping[uuid.UUID, frozenset[int]]) -> bool:
    if owned is None:
        return False
    for t, ps in owned:
        have = target.get(t)
        if have is None or any(p not in have for p in ps):
            return False
    return True


class ConsumerGroupMember:
    __slots__ = ("member_id", "instance_id", "rack_id", "client_id", "client_host",
                 "subscribed_topic_names", "subscribed_topic_regex", "rebalance_timeout_ms",
                 "server_assignor", "member_epoch", "previous_member_epoch", "state",
                 "assigned", "pending_revocation", "session_timer", "revocation_timer",
                 "regex_topics", "classic")

    def __init__(self, member_id: str):
        self.member_id = member_id
        self.instance_id: str | None = None
        self.rack_id: str | None = None
        self.client_id = ""
        self.client_host = ""
        self.subscribed_topic_names: tuple[str, ...] = ()
        self.subscribed_topic_regex: str | None = None
        self.rebalance_timeout_ms = -1
        self.server_assignor: str | None = None
        self.member_epoch = 0
        self.previous_member_epoch = 0
        self.state = MemberState.STABLE
        self.assigned: Assignment = {}
        self.pending_revocation: Assignment = {}
        self.session_timer = None
        self.revocation_timer = None
        # the topic names its regex matched when last resolved (by the member's own heartbeat)
        self.regex_topics: frozenset[str] = frozenset()
        # a member speaking the classic protocol: its ClassicMemberMetadata, else None
        self.classic = None

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(self.subscribed_topic_names) | self.regex_topics

    def cancel_timers(self) -> None:
        for attr in ("session_timer", "revocation_timer"):
            handle = getattr(self, attr)
            if handle is not None:
                handle.cancel()
                setattr(self, attr, None)


class ConsumerGroup:
    def __init__(self, group_id: str):
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerGroupMember] = {}
        self.static_members: dict[str, str] = {}       # instance id -> member id
        self.target: dict[str, Assignment] = {}        # member id -> target assignment
        self.owners: dict[tuple[uuid.UUID, int], str] = {}   # partition -> member holding it
        # what the last target assignment was computed from: topic name -> (id, partitions)
        self.subscription_metadata: dict[str, tuple[uuid.UUID, int]] = {}
        self.dead = False

    # ---- state
    @property
    def state(self) -> str:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def waiting_on_unreleased(self, member: ConsumerGroupMember) -> bool:
        """Whether a partition of ``member``'s target not yet given to it is still held by
        another member (Kafka's waitingOnUnreleasedPartition)."""
        for t, ps in _minus(self.target.get(member.member_id, {}), member.assigned).items():
            for p in ps:
                holder = self.owners.get((t, p))
                if holder is not None and holder != member.member_id:
                    return True
        return False

    def subscribed_topic_names(self) -> set[str]:
        out: set[str] = set()
        for m in self.members.values():
            out |= m.subscribed_topics()
        return out

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (ties: the name first in order), else
        ``default`` (Kafka's ``computePreferredServerAssignor``)."""
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor is not None:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return default
        return max(sorted(votes), key=lambda name: votes[name])

    # ---- members and who holds which partition
    def add_member(self, member: ConsumerGroupMember) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove_member(self, member_id: str) -> ConsumerGroupMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        member.cancel_timers()
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self._release(member)
        self.target.pop(member_id, None)
        return member

    def _release(self, member: ConsumerGroupMember) -> None:
        for held in (member.assigned, member.pending_revocation):
            for t, ps in held.items():
                for p in ps:
                    if self.owners.get((t, p)) == member.member_id:
                        del self.owners[(t, p)]

    def set_member_assignment(self, member: ConsumerGroupMember, assigned: Assignment,
                              pending_revocation: Assignment) -> None:
        self._release(member)
        for held in (assigned, pending_revocation):
            for t, ps in held.items():
                for p in ps:
                    holder = self.owners.get((t, p))
                    if holder is not None and holder != member.member_id:
                        raise RuntimeError(f"group {self.group_id}: partition {t}-{p} of "
                                           f"{holder} given to {member.member_id}")
                    self.owners[(t, p)] = member.member_id
        member.assigned = assigned
        member.pending_revocation = pending_revocation

    def replace_static_member(self, old: ConsumerGroupMember, new_id: str) -> ConsumerGroupMember:
        """A static member rejoining under a new member id takes over the old one's epoch and
        assignment (Kafka's static member replacement)."""
        assigned, pending = old.assigned, old.pending_revocation
        target = self.target.pop(old.member_id, None)
        self.remove_member(old.member_id)
        new = ConsumerGroupMember(new_id)
        for attr in ("instance_id", "rack_id", "client_id", "client_host",
                     "subscribed_topic_names", "subscribed_topic_regex", "rebalance_timeout_ms",
                     "server_assignor", "member_epoch", "previous_member_epoch", "state",
                     "regex_topics", "classic"):
            setattr(new, attr, getattr(old, attr))
        self.add_member(new)
        self.set_member_assignment(new, assigned, pending)
        if target is not None:
            self.target[new_id] = target
        return new

    # ---- reconciliation (Kafka's CurrentAssignmentBuilder)
    def reconcile(self, member: ConsumerGroupMember,
                  owned: list[tuple[uuid.UUID, list[int]]] | None) -> None:
        """Move ``member`` towards its target assignment. ``owned`` is what the heartbeat said
        the member owns (None: not said, so it may still own anything it had)."""
        if member.state == MemberState.STABLE:
            if member.member_epoch != self.assignment_epoch:
                self._next_assignment(member, member.member_epoch, owned)
        elif member.state == MemberState.UNREVOKED_PARTITIONS:
            if not self._owns_any(owned, member.pending_revocation):
                self._next_assignment(member, member.member_epoch + 1, owned)
        elif member.state == MemberState.UNRELEASED_PARTITIONS:
            self._next_assignment(member, member.member_epoch, owned)
        else:
            if owned is None or owned:
                raise FencedMember("The consumer group member is in a unknown state. The "
                                   "member must abandon all its partitions and rejoin.")
            self._next_assignment(member, self.assignment_epoch, owned)

    @staticmethod
    def _owns_any(owned: list[tuple[uuid.UUID, list[int]]] | None,
                  revoking: Mapping[uuid.UUID, frozenset[int]]) -> bool:
        if owned is None:
            return True
        for t, ps in owned:
            pending = revoking.get(t)
            if pending and any(p in pending for p in ps):
                return True
        return False

    @staticmethod
    def _set_epoch(member: ConsumerGroupMember, epoch: int) -> None:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = epoch

    def _next_assignment(self, member: ConsumerGroupMember, epoch: int,
                         owned: list[tuple[uuid.UUID, list[int]]] | None) -> None:
        target = self.target.get(member.member_id, {})
        current = member.assigned
        keep = _intersect(current, target)
        revoking = _minus(current, target)
        wanted = _minus(target, current)
        free: dict[uuid.UUID, set[int]] = {}
        unreleased = False
        for t, ps in wanted.items():
            for p in ps:
                holder = self.owners.get((t, p))
                if holder is None or holder == member.member_id:
                    free.setdefault(t, set()).add(p)
                else:
                    unreleased = True
        if revoking and self._owns_any(owned, revoking):
            # give up first: the member keeps ``epoch`` until it no longer owns them
            self.set_member_assignment(member, keep, revoking)
            member.state = MemberState.UNREVOKED_PARTITIONS
            self._set_epoch(member, epoch)
            return
        assigned = _union(keep, {t: frozenset(ps) for t, ps in free.items()})
        self.set_member_assignment(member, assigned, {})
        member.state = (MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE)
        self._set_epoch(member, self.assignment_epoch)
