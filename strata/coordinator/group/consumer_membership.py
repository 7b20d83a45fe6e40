"""Membership of KIP-848 consumer groups (the consumer half of Kafka's ``GroupMetadataManager``):
ConsumerGroupHeartbeat, ConsumerGroupDescribe, member sessions and revocation deadlines, the
target assignment computed by the server-side assignor, and the group's records in
``__consumer_offsets``.

A heartbeat is handled synchronously up to the append of its records (so heartbeats never
interleave): validate, find or create the group and member, fence stale epochs, update the
member's subscription (regexes resolved against the topic image, as the member's principal
may see it), bump the group epoch when membership, subscriptions or the subscribed topics'
partitions changed, recompute the target assignment when the group epoch is ahead of it, and
reconcile the member (``ConsumerGroup.reconcile``). The records go to the group's partition in
the order they were made (one writer per partition); the response waits for them. An append
that fails is answered with its error; the in-memory state is not rolled back (the usual cause,
a lost leadership, unloads the group anyway).

A consumer group's committed offsets live on a ``ClassicGroup`` of the same id that has no
members (an Empty classic group becomes a consumer group as in Kafka; a non-empty one is
converted by ``migration.GroupMigration`` when the policy allows, else GROUP_ID_NOT_FOUND to a
consumer heartbeat); ``offsets`` handles them once the commit or fetch
is validated here (member epochs). Runs on the event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any, Callable, Iterable, Mapping

from strata.common.errors import ErrorCode
from strata.coordinator.group.assignors import ASSIGNORS, MemberSubscription
from strata.coordinator.group.classic_group import ClassicGroup
from strata.coordinator.group.consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerGroupMember,
    FencedMember,
    MemberState,
    is_subset,
)
from strata.coordinator.group.results import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResult,
    DescribedConsumerGroup,
    DescribedConsumerMember,
)
from strata.coordinator.group.runtime import CoordinatorRuntime
from strata.coordinator.group.state import GroupState
from strata.coordinator.offsets_records import (
    CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY,
    CONSUMER_GROUP_MEMBER_METADATA_KEY,
    CONSUMER_GROUP_METADATA_KEY,
    CONSUMER_GROUP_TARGET_MEMBER_KEY,
    CONSUMER_GROUP_TARGET_METADATA_KEY,
    ConsumerGroupCurrentAssignmentValue,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataValue,
    ConsumerGroupTargetMemberValue,
    ConsumerGroupTargetMetadataValue,
    consumer_group_record,
    group_metadata_record,
)

log = logging.getLogger(__name__)

Record = tuple[bytes, bytes | None]

# A failed append of a consumer group's records, as the heartbeat answers it.
_STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}

# How old a regex's resolution against the topic image may be (new topics that match are
# picked up within this time).
REGEX_REFRESH_MS = 10_000

# What RE2 (Kafka's RE2J) refuses and Python's re accepts: lookarounds, backreferences,
# conditionals, atomic groups and possessive quantifiers.
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\\[1-9]|\(\?P=|\(\?\(|\(\?>|[*+?}]\+")


class InvalidRegex(ValueError):
    pass


def compile_topic_regex(pattern: str) -> re.Pattern:
    """``pattern`` as RE2J would compile it, as far as Python's re allows; InvalidRegex if
    either refuses it."""
    if _NOT_RE2.search(pattern):
        raise InvalidRegex("the syntax is not supported by RE2J")
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        raise InvalidRegex(str(e)) from None


class _Reply(Exception):
    """Ends a heartbeat early with an error response."""

    def __init__(self, error: ErrorCode, message: str | None = None):
        super().__init__(message)
        self.error = error
        self.message = message


def _member_key(kind: int, group_id: str, member_id: str) -> ConsumerGroupKey:
    return ConsumerGroupKey(kind, group_id, member_id)


class ConsumerGroupManager:
    """The consumer groups of this coordinator; see the module docstring. ``classic_groups``
    is the classic membership's cache (shared ids: a group is one kind or the other);
    ``topics`` returns the topic image (name -> object with ``topic_id``, ``partitions`` and
    ``internal``)."""

    def __init__(self, runtime: CoordinatorRuntime, classic_groups: dict[str, ClassicGroup],
                 topics: Callable[[], Mapping[str, Any]]):
        self._rt = runtime
        self.config = runtime.config
        self.groups: dict[str, ConsumerGroup] = {}
        self._classic = classic_groups
        self._topics = topics
        self._queues: dict[int, list[tuple[list[Record], asyncio.Future]]] = {}
        self._writers: dict[int, asyncio.Task] = {}
        self._regexes: dict[str, re.Pattern] = {}
        self._resolved: dict[str, tuple[int, frozenset[str]]] = {}   # pattern -> (at, topics)
        # the online upgrade/downgrade with classic groups (``migration.GroupMigration``)
        self.migration = None

    # ================================================================== records
    def _write(self, group_id: str, records: list[Record]) -> asyncio.Future:
        """Append ``records`` after everything written before (one writer per partition);
        the future's result is the append's ErrorCode."""
        fut = asyncio.get_running_loop().create_future()
        partition = self._rt.partition_for(group_id)
        self._queues.setdefault(partition, []).append((records, fut))
        if partition not in self._writers:
            self._writers[partition] = self._rt.spawn(self._drain(partition),
                                                      f"consumer group records of {partition}")
        return fut

    def _write_in_background(self, group_id: str, records: list[Record]) -> None:
        if records and self._rt.loop is not None:
            self._write(group_id, records)

    async def _drain(self, partition: int) -> None:
        queue = self._queues[partition]
        try:
            while queue:
                batch = list(queue)
                queue.clear()
                records = [r for rs, _ in batch for r in rs]
                error = await self._rt.append(partition, records) if records else ErrorCode.NONE
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(error)
        finally:
            self._writers.pop(partition, None)
            for _, fut in queue:
                if not fut.done():
                    fut.set_result(ErrorCode.NOT_COORDINATOR)
            queue.clear()

    @staticmethod
    def _refresh_subscription(group, image) -> bool:
        """The subscribed topics' ids and partition counts from ``image`` into the group;
        whether they changed (a new group epoch)."""
        subscribed = {}
        for name in group.subscribed_topic_names():
            info = image.get(name)
            if info is not None:
                subscribed[name] = (info.topic_id, info.partitions)
        if subscribed == group.subscription_metadata:
            return False
        group.subscription_metadata = subscribed
        return True

    @staticmethod
    def _member_records(group: ConsumerGroup, member: ConsumerGroupMember) -> Record:
        return consumer_group_record(
            _member_key(CONSUMER_GROUP_MEMBER_METADATA_KEY, group.group_id, member.member_id),
            ConsumerGroupMemberMetadataValue(
                member.instance_id, member.rack_id, member.client_id, member.client_host,
                tuple(member.subscribed_topic_names), member.subscribed_topic_regex,
                member.rebalance_timeout_ms, member.server_assignor, member.classic))

    @staticmethod
    def _assignment_record(group: ConsumerGroup, member: ConsumerGroupMember) -> Record:
        return consumer_group_record(
            _member_key(CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY, group.group_id, member.member_id),
            ConsumerGroupCurrentAssignmentValue(member.member_epoch, member.previous_member_epoch,
                                                int(member.state), dict(member.assigned),
                                                dict(member.pending_revocation)))

    @staticmethod
    def _epoch_record(group: ConsumerGroup) -> Record:
        return consumer_group_record(ConsumerGroupKey(CONSUMER_GROUP_METADATA_KEY, group.group_id),
                                     ConsumerGroupMetadataValue(group.group_epoch))

    @staticmethod
    def _removal_records(group: ConsumerGroup, member_id: str) -> list[Record]:
        """Tombstones of a member, in Kafka's order (current assignment, target, metadata)."""
        return [consumer_group_record(_member_key(kind, group.group_id, member_id), None)
                for kind in (CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY,
                             CONSUMER_GROUP_TARGET_MEMBER_KEY,
                             CONSUMER_GROUP_MEMBER_METADATA_KEY)]

    @staticmethod
    def group_tombstones(group_id: str) -> list[Record]:
        return [consumer_group_record(ConsumerGroupKey(kind, group_id), None)
                for kind in (CONSUMER_GROUP_TARGET_METADATA_KEY, CONSUMER_GROUP_METADATA_KEY)]

    # ================================================================== validation
    def _validate(self, r: ConsumerGroupHeartbeatRequest, api_version: int) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        def invalid(message: str) -> _Reply:
            return _Reply(ErrorCode.INVALID_REQUEST, message)
        if r.group_id == "":
            raise invalid("GroupId can't be empty.")
        if r.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if r.rack_id == "":
            raise invalid("RackId can't be empty.")
        if api_version >= 1 and r.member_id == "":
            raise invalid("MemberId can't be empty.")
        if r.member_epoch > 0 or r.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            if r.member_id == "":
                raise invalid("MemberId can't be empty.")
        elif r.member_epoch == 0:
            if r.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if r.owned is None or len(r.owned) > 0:
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if not r.subscribed_topic_names and not r.subscribed_topic_regex:
                raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in "
                              "first request.")
        elif r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if r.member_id == "":
                raise invalid("MemberId can't be empty.")
            if r.instance_id is None:
                raise invalid("InstanceId can't be null.")
        else:
            raise invalid("MemberEpoch is invalid.")
        if r.subscribed_topic_regex:
            self._regex(r.subscribed_topic_regex)
        if r.server_assignor is not None and r.server_assignor not in self.config.consumer_group_assignors:
            raise _Reply(ErrorCode.UNSUPPORTED_ASSIGNOR,
                         f"ServerAssignor {r.server_assignor} is not supported. Supported "
                         f"assignors: {', '.join(self.config.consumer_group_assignors)}.")

    def _regex(self, pattern: str) -> re.Pattern:
        compiled = self._regexes.get(pattern)
        if compiled is None:
            try:
                compiled = compile_topic_regex(pattern)
            except InvalidRegex as e:
                raise _Reply(ErrorCode.INVALID_REGULAR_EXPRESSION,
                             f"SubscribedTopicRegex `{pattern}` is not a valid regular "
                             f"expression: {e}.") from None
            if len(self._regexes) > 10_000:
                self._regexes.clear()
            self._regexes[pattern] = compiled
        return compiled

    def _resolve(self, pattern: str, image: Mapping[str, Any]) -> frozenset[str]:
        """The non-internal topics ``pattern`` fully matches, computed at most every
        REGEX_REFRESH_MS per pattern (a heartbeat must not match every topic name each time)."""
        now = self._rt.now()
        cached = self._resolved.get(pattern)
        if cached is not None and now - cached[0] < REGEX_REFRESH_MS:
            return cached[1]
        compiled = self._regex(pattern)
        matched = frozenset(name for name, info in image.items()
                            if not info.internal and compiled.fullmatch(name))
        if len(self._resolved) > 10_000:
            self._resolved.clear()
        self._resolved[pattern] = (now, matched)
        return matched

    # ================================================================== heartbeat
    async def heartbeat(self, r: ConsumerGroupHeartbeatRequest, *, api_version: int = 1,
                        client_id: str = "", client_host: str = "",
                        authorized_topics: Callable[[Iterable[str]], set[str]] | None = None
                        ) -> ConsumerGroupHeartbeatResult:
        """ConsumerGroupHeartbeat v0-1 of a group of ours. ``authorized_topics`` filters the
        topics the member's regex may match to those its principal may DESCRIBE."""
        try:
            self._validate(r, api_version)
            if r.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                result, records = self._leave(r)
            else:
                result, records = self._join_or_heartbeat(r, api_version, client_id, client_host,
                                                          authorized_topics)
        except _Reply as reply:
            if reply.error == ErrorCode.INVALID_REQUEST:
                log.info("invalid ConsumerGroupHeartbeat v%d of member %r of group %r: %s",
                         api_version, r.member_id, r.group_id, reply.message)
            return ConsumerGroupHeartbeatResult(reply.error, reply.message)
        if records:
            error = await self._write(r.group_id, records)
            if error != ErrorCode.NONE:
                return ConsumerGroupHeartbeatResult(_STORE_ERRORS.get(error, error))
        return result

    def _group_for(self, group_id: str, create: bool, records: list[Record]) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        classic = self._classic.get(group_id)
        if classic is not None and classic.state not in (GroupState.EMPTY, GroupState.DEAD):
            upgraded = None
            if create and self.migration is not None:
                upgraded = self.migration.upgrade(classic)
            if upgraded is None:
                raise _Reply(ErrorCode.GROUP_ID_NOT_FOUND,
                             f"Group {group_id} is not a consumer group")
            return upgraded
        if not create:
            raise _Reply(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        if classic is not None and classic.generation_id > 0:
            # an Empty classic group becomes a consumer group (its offsets stay)
            records.append(group_metadata_record(group_id, None))
            classic.generation_id = 0
            classic.protocol_type = None
            classic.protocol_name = None
            classic.leader_id = None
        return ConsumerGroup(group_id)

    def _member_for(self, group: ConsumerGroup, r: ConsumerGroupHeartbeatRequest,
                    records: list[Record]) -> tuple[ConsumerGroupMember, bool]:
        """The member the heartbeat is from (new: True), fenced as Kafka fences it."""
        if r.instance_id is not None:
            current_id = group.static_members.get(r.instance_id)
            current = None if current_id is None else group.members.get(current_id)
            if r.member_epoch == 0:
                if current is None:
                    return self._new_member(group, r), True
                if current.member_id == r.member_id:
                    return current, False
                if current.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise _Reply(ErrorCode.UNRELEASED_INSTANCE_ID,
                                 f"Static member {r.member_id} with instance id {r.instance_id} "
                                 f"cannot join the group because the instance id is owned by "
                                 f"{current.member_id} member.")
                # the static member comes back under a new member id: it keeps its epoch and
                # assignment
                records.extend(self._removal_records(group, current.member_id))
                member = group.replace_static_member(current, r.member_id or str(uuid.uuid4()))
                records.append(self._member_records(group, member))
                records.append(consumer_group_record(
                    _member_key(CONSUMER_GROUP_TARGET_MEMBER_KEY, group.group_id,
                                member.member_id),
                    ConsumerGroupTargetMemberValue(dict(group.target.get(member.member_id, {})))))
                records.append(self._assignment_record(group, member))
                return member, False
            if current is None:
                raise _Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                             f"Instance id {r.instance_id} is unknown.")
            if current.member_id != r.member_id:
                raise _Reply(ErrorCode.FENCED_INSTANCE_ID,
                             f"Static member {r.member_id} with instance id {r.instance_id} is "
                             f"fenced by existing member {current.member_id}.")
            member = current
        else:
            member = group.members.get(r.member_id) if r.member_id else None
            if r.member_epoch == 0:
                if member is None:
                    return self._new_member(group, r), True
                return member, False
            if member is None or member.classic is not None:
                raise _Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                             f"Member {r.member_id} is not a member of group {group.group_id}.")
        self._check_epoch(member, r)
        return member, False

    def _new_member(self, group: ConsumerGroup, r: ConsumerGroupHeartbeatRequest
                    ) -> ConsumerGroupMember:
        if len(group.members) >= self.config.consumer_group_max_size:
            raise _Reply(ErrorCode.GROUP_MAX_SIZE_REACHED,
                         f"The consumer group has reached its maximum capacity of "
                         f"{self.config.consumer_group_max_size} members.")
        member = ConsumerGroupMember(r.member_id or str(uuid.uuid4()))
        member.instance_id = r.instance_id
        return member

    @staticmethod
    def _check_epoch(member: ConsumerGroupMember, r: ConsumerGroupHeartbeatRequest) -> None:
        """Kafka's throwIfMemberEpochIsInvalid: a member may be one epoch behind (its last
        response was lost) if it owns nothing it should not."""
        if r.member_epoch > member.member_epoch:
            raise _Reply(ErrorCode.FENCED_MEMBER_EPOCH,
                         f"The consumer group member has a greater member epoch "
                         f"({r.member_epoch}) than the one known by the group coordinator "
                         f"({member.member_epoch}). The member must abandon all its partitions "
                         f"and rejoin.")
        if r.member_epoch < member.member_epoch and (
                r.member_epoch != member.previous_member_epoch
                or not is_subset(r.owned, member.assigned)):
            raise _Reply(ErrorCode.FENCED_MEMBER_EPOCH,
                         f"The consumer group member has a smaller member epoch "
                         f"({r.member_epoch}) than the one known by the group coordinator "
                         f"({member.member_epoch}). The member must abandon all its partitions "
                         f"and rejoin.")

    def _join_or_heartbeat(self, r: ConsumerGroupHeartbeatRequest, api_version: int,
                           client_id: str, client_host: str,
                           authorized_topics: Callable[[Iterable[str]], set[str]] | None
                           ) -> tuple[ConsumerGroupHeartbeatResult, list[Record]]:
        records: list[Record] = []
        group = self._group_for(r.group_id, r.member_epoch == 0, records)
        member, is_new = self._member_for(group, r, records)
        before = (member.member_epoch, member.state, dict(member.assigned),
                  dict(member.pending_revocation))
        metadata_before = self._metadata_of(member)
        subscription_before = (member.subscribed_topics(), member.server_assignor)

        # ---- the member's metadata
        if r.instance_id is not None:
            member.instance_id = r.instance_id
        if r.rack_id is not None:
            member.rack_id = r.rack_id
        member.client_id = client_id
        member.client_host = client_host
        member.classic = None     # a classic member that speaks the consumer protocol now
        if r.subscribed_topic_names is not None:
            member.subscribed_topic_names = tuple(r.subscribed_topic_names)
        if r.subscribed_topic_regex is not None:
            # "" clears it (librdkafka sends "" with a subscription by names)
            member.subscribed_topic_regex = r.subscribed_topic_regex or None
            if member.subscribed_topic_regex is None:
                member.regex_topics = frozenset()
        if r.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = r.rebalance_timeout_ms
        if r.server_assignor is not None:
            member.server_assignor = r.server_assignor
        image = self._topics()
        if member.subscribed_topic_regex is not None:
            matched = set(self._resolve(member.subscribed_topic_regex, image))
            if authorized_topics is not None and matched:
                matched = set(authorized_topics(matched))
            member.regex_topics = frozenset(matched)

        if is_new or member.member_id not in group.members:
            group.add_member(member)
        if self._metadata_of(member) != metadata_before or is_new:
            records.append(self._member_records(group, member))
        bump = is_new or (member.subscribed_topics(), member.server_assignor) != subscription_before

        # ---- the subscribed topics' partitions
        if self._refresh_subscription(group, image):
            bump = True
        if bump:
            group.group_epoch += 1
            records.append(self._epoch_record(group))
            log.info("group %s: epoch %d (member %s %s)", group.group_id, group.group_epoch,
                     member.member_id, "joined" if is_new else "changed its subscription")
        if group.group_epoch > group.assignment_epoch:
            records.extend(self._compute_target(group))

        # ---- reconciliation
        if member.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            member.member_epoch = member.previous_member_epoch   # a static member is back
        owned = None if r.owned is None else [(t, list(ps)) for t, ps in r.owned]
        try:
            group.reconcile(member, owned)
        except FencedMember as e:
            raise _Reply(ErrorCode.FENCED_MEMBER_EPOCH, str(e)) from None
        after = (member.member_epoch, member.state, member.assigned, member.pending_revocation)
        changed = after != before or is_new
        if changed:
            records.append(self._assignment_record(group, member))
        self.groups[group.group_id] = group
        self._schedule_session(group, member)
        self._schedule_revocation(group, member, before[1])

        send_assignment = (r.member_epoch == 0 or r.owned is not None
                           or member.assigned != before[2])
        return ConsumerGroupHeartbeatResult(
            ErrorCode.NONE, member_id=member.member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.config.consumer_group_heartbeat_interval_ms,
            assignment=dict(member.assigned) if send_assignment else None), records

    @staticmethod
    def _metadata_of(member: ConsumerGroupMember) -> tuple:
        return (member.instance_id, member.rack_id, member.client_id, member.client_host,
                tuple(member.subscribed_topic_names), member.subscribed_topic_regex,
                member.rebalance_timeout_ms, member.server_assignor, member.classic)

    def _compute_target(self, group: ConsumerGroup) -> list[Record]:
        """A new target assignment at the group epoch, by the preferred server assignor."""
        name = group.preferred_assignor(self.config.consumer_group_assignors[0])
        assignor = ASSIGNORS[name]
        topics = {tid: n for tid, n in group.subscription_metadata.values()}
        ids = {n: tid for n, (tid, _) in group.subscription_metadata.items()}
        specs = {
            m.member_id: MemberSubscription(
                frozenset(ids[n] for n in m.subscribed_topics() if n in ids),
                group.target.get(m.member_id, {}), m.instance_id)
            for m in group.members.values()}
        target = assignor(specs, topics)
        records = []
        for member_id, assignment in target.items():
            if group.target.get(member_id) != assignment or member_id not in group.target:
                records.append(consumer_group_record(
                    _member_key(CONSUMER_GROUP_TARGET_MEMBER_KEY, group.group_id, member_id),
                    ConsumerGroupTargetMemberValue(dict(assignment))))
        group.target = target
        group.assignment_epoch = group.group_epoch
        records.append(consumer_group_record(
            ConsumerGroupKey(CONSUMER_GROUP_TARGET_METADATA_KEY, group.group_id),
            ConsumerGroupTargetMetadataValue(group.assignment_epoch)))
        log.info("group %s: target assignment of epoch %d by %s over %d member(s)",
                 group.group_id, group.assignment_epoch, name, len(target))
        return records

    # ================================================================== leaving
    def _leave(self, r: ConsumerGroupHeartbeatRequest
               ) -> tuple[ConsumerGroupHeartbeatResult, list[Record]]:
        group = self.groups.get(r.group_id)
        if group is None:
            raise _Reply(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {r.group_id} not found.")
        if r.instance_id is not None:
            member_id = group.static_members.get(r.instance_id)
            if member_id is None:
                raise _Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                             f"Instance id {r.instance_id} is unknown.")
            if member_id != r.member_id:
                raise _Reply(ErrorCode.FENCED_INSTANCE_ID,
                             f"Static member {r.member_id} with instance id {r.instance_id} is "
                             f"fenced by existing member {member_id}.")
        member = group.members.get(r.member_id)
        if member is None:
            raise _Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                         f"Member {r.member_id} is not a member of group {group.group_id}.")
        if r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # a static member leaves for now: it keeps its assignment until its session ends
            if member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
            self._schedule_session(group, member)
            records = [self._assignment_record(group, member)]
        else:
            log.info("member %s left consumer group %s", member.member_id, group.group_id)
            records = self._remove(group, member)
        return ConsumerGroupHeartbeatResult(ErrorCode.NONE, member_id=r.member_id,
                                            member_epoch=r.member_epoch), records

    def _remove(self, group: ConsumerGroup, member: ConsumerGroupMember) -> list[Record]:
        """Remove (fence) ``member``; the group epoch moves on so that the others rebalance."""
        group.remove_member(member.member_id)
        records = self._removal_records(group, member.member_id)
        group.group_epoch += 1
        records.append(self._epoch_record(group))
        if self.migration is not None:
            records.extend(self.migration.maybe_downgrade(group))
        return records

    # ================================================================== timers
    def _schedule_session(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._rt.timers.call_later(
            self.config.consumer_group_session_timeout_ms if member.classic is None
            else member.classic.session_timeout_ms,
            lambda: self._on_session_expired(group, member))

    def _on_session_expired(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        member.session_timer = None
        if self.groups.get(group.group_id) is not group or group.members.get(member.member_id) is not member:
            return
        log.info("member %s of consumer group %s fenced: session timeout", member.member_id,
                 group.group_id)
        self._write_in_background(group.group_id, self._remove(group, member))

    def _schedule_revocation(self, group: ConsumerGroup, member: ConsumerGroupMember,
                             previous_state: MemberState) -> None:
        """Kafka's rebalance timeout: a member asked to revoke partitions that has not done
        so within its rebalance timeout is fenced."""
        if member.state != MemberState.UNREVOKED_PARTITIONS:
            if member.revocation_timer is not None:
                member.revocation_timer.cancel()
                member.revocation_timer = None
            return
        if previous_state == MemberState.UNREVOKED_PARTITIONS and member.revocation_timer is not None:
            return
        epoch = member.member_epoch
        timeout = member.rebalance_timeout_ms if member.rebalance_timeout_ms > 0 else \
            self.config.consumer_group_session_timeout_ms
        member.revocation_timer = self._rt.timers.call_later(
            timeout, lambda: self._on_revocation_expired(group, member, epoch))

    def _on_revocation_expired(self, group: ConsumerGroup, member: ConsumerGroupMember,
                               epoch: int) -> None:
        member.revocation_timer = None
        if (self.groups.get(group.group_id) is not group
                or group.members.get(member.member_id) is not member
                or member.state != MemberState.UNREVOKED_PARTITIONS
                or member.member_epoch != epoch):
            return
        log.info("member %s of consumer group %s fenced: it did not revoke its partitions "
                 "within its rebalance timeout", member.member_id, group.group_id)
        self._write_in_background(group.group_id, self._remove(group, member))

    def cancel_timers(self, group: ConsumerGroup) -> None:
        for m in group.members.values():
            m.cancel_timers()

    # ================================================================== offsets
    def validate_offset_commit(self, group_id: str, member_id: str, instance_id: str | None,
                               member_epoch: int, *, api_version: int | None,
                               transactional: bool = False) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit; None when the commit may go ahead."""
        group = self.groups[group_id]
        if member_epoch < 0 and not group.members:
            return None   # the admin client, or a consumer assigning partitions itself
        if transactional and member_epoch < 0 and member_id == "" and instance_id is None:
            return None   # TxnOffsetCommit v0-2 carry no member
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None and member.instance_id != instance_id:
            return ErrorCode.FENCED_INSTANCE_ID
        if member.classic is not None:
            # a classic member commits with its generation, the member epoch
            return None if member_epoch == member.member_epoch else ErrorCode.ILLEGAL_GENERATION
        if not transactional and api_version is not None and api_version < 9:
            # only OffsetCommit v9+ speaks member epochs
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None

    def validate_offset_fetch(self, group_id: str, member_id: str | None,
                              member_epoch: int) -> ErrorCode | None:
        group = self.groups[group_id]
        if member_id is None and member_epoch < 0:
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None

    # ================================================================== describe / load
    def describe(self, group_id: str) -> DescribedConsumerGroup:
        group = self.groups.get(group_id)
        if group is None:
            classic = self._classic.get(group_id)
            if classic is not None and classic.state not in (GroupState.EMPTY, GroupState.DEAD):
                return DescribedConsumerGroup(group_id, ErrorCode.GROUP_ID_NOT_FOUND,
                                              f"Group {group_id} is not a consumer group.")
            return DescribedConsumerGroup(group_id, ErrorCode.GROUP_ID_NOT_FOUND,
                                          f"Group {group_id} not found.")
        members = tuple(
            DescribedConsumerMember(
                m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id,
                m.client_host, tuple(m.subscribed_topic_names), m.subscribed_topic_regex,
                dict(m.assigned), dict(group.target.get(m.member_id, {})),
                0 if m.classic is not None else 1)
            for m in group.members.values())
        return DescribedConsumerGroup(
            group_id, ErrorCode.NONE, None, group.state, group.group_epoch,
            group.assignment_epoch,
            group.preferred_assignor(self.config.consumer_group_assignors[0]), members)

    def delete(self, group: ConsumerGroup) -> list[Record]:
        """Drop an empty consumer group; its tombstones."""
        group.dead = True
        self.cancel_timers(group)
        self.groups.pop(group.group_id, None)
        return self.group_tombstones(group.group_id)

    def unload(self, group: ConsumerGroup) -> None:
        group.dead = True
        self.cancel_timers(group)
        self.groups.pop(group.group_id, None)

    def apply_loaded(self, loaded: Mapping[str, "LoadedConsumerGroup"]) -> None:
        """Consumer groups replayed from ``__consumer_offsets`` become ours: every member
        resumes its epoch and assignment, its session starting now."""
        image = self._topics()
        for group_id, state in loaded.items():
            if group_id in self.groups:
                continue
            group = ConsumerGroup(group_id)
            group.group_epoch = state.epoch
            group.assignment_epoch = state.assignment_epoch
            for member_id, meta in state.members.items():
                member = ConsumerGroupMember(member_id)
                member.instance_id = meta.instance_id
                member.rack_id = meta.rack_id
                member.client_id = meta.client_id
                member.client_host = meta.client_host
                member.subscribed_topic_names = tuple(meta.subscribed_topic_names)
                member.subscribed_topic_regex = meta.subscribed_topic_regex
                member.rebalance_timeout_ms = meta.rebalance_timeout_ms
                member.server_assignor = meta.server_assignor
                member.classic = meta.classic
                if member.subscribed_topic_regex is not None:
                    try:
                        pattern = compile_topic_regex(member.subscribed_topic_regex)
                        member.regex_topics = frozenset(
                            n for n, info in image.items()
                            if not info.internal and pattern.fullmatch(n))
                    except InvalidRegex:
                        pass
                group.add_member(member)
                current = state.current.get(member_id)
                if current is not None:
                    member.member_epoch = current.member_epoch
                    member.previous_member_epoch = current.previous_member_epoch
                    try:
                        member.state = MemberState(current.state)
                    except ValueError:
                        member.state = MemberState.UNKNOWN
                    group.set_member_assignment(member, dict(current.assigned),
                                                dict(current.pending_revocation))
            group.target = {m: dict(a) for m, a in state.targets.items() if m in group.members}
            # the subscribed topics are taken to be as the target saw them (a partition count
            # changed while no coordinator ran goes unnoticed until the next change; Kafka
            # 4.1 stores a hash of the metadata for that, this coordinator does not)
            subscribed = {}
            for name in group.subscribed_topic_names():
                info = image.get(name)
                if info is not None:
                    subscribed[name] = (info.topic_id, info.partitions)
            group.subscription_metadata = subscribed
            self.groups[group_id] = group
            for member in group.members.values():
                self._schedule_session(group, member)
                if member.state == MemberState.UNREVOKED_PARTITIONS:
                    self._schedule_revocation(group, member, MemberState.STABLE)
            log.info("loaded consumer group %s (epoch %d, %d member(s))", group_id,
                     group.group_epoch, len(group.members))


class LoadedConsumerGroup:
    """A consumer group's records as ``__consumer_offsets`` last states them."""

    __slots__ = ("epoch", "assignment_epoch", "members", "targets", "current")

    def __init__(self) -> None:
        self.epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerGroupMemberMetadataValue] = {}
        self.targets: dict[str, dict] = {}
        self.current: dict[str, ConsumerGroupCurrentAssignmentValue] = {}

    def apply(self, key: ConsumerGroupKey, value: Any) -> None:
        kind = key.kind
        if kind == CONSUMER_GROUP_METADATA_KEY:
            self.epoch = 0 if value is None else value.epoch
        elif kind == CONSUMER_GROUP_TARGET_METADATA_KEY:
            self.assignment_epoch = 0 if value is None else value.assignment_epoch
        else:
            table = {CONSUMER_GROUP_MEMBER_METADATA_KEY: self.members,
                     CONSUMER_GROUP_TARGET_MEMBER_KEY: self.targets,
                     CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY: self.current}[kind]
            if value is None:
                table.pop(key.member_id, None)
            elif kind == CONSUMER_GROUP_TARGET_MEMBER_KEY:
                table[key.member_id] = value.partitions
            else:
                table[key.member_id] = value
