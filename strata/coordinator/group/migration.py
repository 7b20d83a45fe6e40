"""KIP-848's online migration between a classic group and a consumer group (Kafka's
``group.consumer.migration.policy`` and the classic-member paths of ``GroupMetadataManager``).

- Upgrade: a ConsumerGroupHeartbeat joining a classic group with members (using the
  ``consumer`` protocol type) converts it into a consumer group. Each classic member becomes a
  member of the consumer group that keeps its classic metadata (session timeout, protocols);
  the group epoch and every member's epoch is the classic generation and the target is what
  the members hold, so the joining member's epoch bump starts an ordinary reconciliation.
- Classic members inside a consumer group: JoinGroup updates the member, computes the target
  and reconciles it against the partitions its subscription says it owns, and answers at once
  with the member epoch as the generation; SyncGroup returns the member's assigned
  partitions; Heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin (the group
  epoch moved on, it has partitions to revoke, or partitions it waits for were released);
  LeaveGroup removes it.
- Downgrade: when the last member speaking the consumer protocol is removed and classic
  members remain, the group becomes a classic group of them (generation = group epoch, their
  current assignments) and a rebalance is prepared, so they rejoin as a classic group.

A consumer group's offsets stay on the member-less ``ClassicGroup`` of the same id in both
directions. Runs on the event loop only.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

from strata.common.errors import ErrorCode
from strata.coordinator.group.classic_group import ClassicGroup, ClassicGroupMember
from strata.coordinator.group.consumer_group import ConsumerGroup, ConsumerGroupMember, MemberState
from strata.coordinator.group.results import (
    UNKNOWN_MEMBER_ID,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMember,
    LeaveMemberResult,
    SyncGroupResult,
)
from strata.coordinator.group.state import GroupState
from strata.coordinator.offsets_records import (
    CONSUMER_GROUP_TARGET_MEMBER_KEY,
    CONSUMER_GROUP_TARGET_METADATA_KEY,
    ClassicMemberMetadata,
    ConsumerGroupKey,
    ConsumerGroupTargetMemberValue,
    ConsumerGroupTargetMetadataValue,
    RecordFormatError,
    consumer_group_record,
    decode_consumer_protocol_assignment,
    decode_consumer_protocol_subscription,
    encode_consumer_protocol_assignment_v,
    group_metadata_record,
)

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"
MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")

Record = tuple[bytes, bytes | None]


class GroupMigration:
    """See the module docstring. ``consumer`` is the ConsumerGroupManager, ``classic`` the
    classic GroupMetadataManager; ``topics`` returns the topic image."""

    def __init__(self, consumer: Any, classic: Any, topics: Callable[[], Mapping[str, Any]],
                 member_id_factory: Callable[[str], str]):
        self._consumer = consumer
        self._classic = classic
        self._topics = topics
        self._new_member_id = member_id_factory
        self.config = consumer.config
        consumer.migration = self

    @property
    def _policy(self) -> str:
        return self.config.consumer_group_migration_policy

    # ================================================================== upgrade
    def upgrade(self, classic: ClassicGroup) -> ConsumerGroup | None:
        """The consumer group ``classic`` becomes (its records queued for the group's
        partition), or None when the policy, the protocol type, a malformed subscription or
        the size forbids it."""
        if self._policy not in ("bidirectional", "upgrade"):
            log.info("cannot upgrade classic group %s: the online upgrade is disabled",
                     classic.group_id)
            return None
        if classic.protocol_type != CONSUMER_PROTOCOL_TYPE or classic.protocol_name is None:
            log.info("cannot upgrade classic group %s: it does not use the consumer protocol",
                     classic.group_id)
            return None
        if len(classic.members) >= self.config.consumer_group_max_size:
            log.info("cannot upgrade classic group %s: larger than group.consumer.max.size",
                     classic.group_id)
            return None
        image = self._topics()
        group = ConsumerGroup(classic.group_id)
        group.group_epoch = group.assignment_epoch = classic.generation_id
        try:
            for m in classic.members.values():
                sub = decode_consumer_protocol_subscription(m.metadata(classic.protocol_name))
                member = ConsumerGroupMember(m.member_id)
                member.instance_id = m.group_instance_id
                member.rack_id = sub.rack_id
                member.client_id = m.client_id
                member.client_host = m.client_host
                member.subscribed_topic_names = tuple(sub.topics)
                member.rebalance_timeout_ms = m.rebalance_timeout_ms
                member.classic = ClassicMemberMetadata(m.session_timeout_ms, tuple(m.protocols))
                member.member_epoch = member.previous_member_epoch = classic.generation_id
                member.state = MemberState.STABLE
                group.add_member(member)
                held = {}
                for topic, ps in decode_consumer_protocol_assignment(m.assignment).items():
                    info = image.get(topic)
                    if info is None:
                        continue
                    free = frozenset(p for p in ps if 0 <= p < info.partitions
                                     and (info.topic_id, p) not in group.owners)
                    if free:
                        held[info.topic_id] = free
                group.set_member_assignment(member, held, {})
                group.target[member.member_id] = dict(held)
        except (RecordFormatError, ValueError) as e:
            log.warning("cannot upgrade classic group %s: malformed consumer protocol (%s)",
                        classic.group_id, e)
            return None
        for name in group.subscribed_topic_names():
            info = image.get(name)
            if info is not None:
                group.subscription_metadata[name] = (info.topic_id, info.partitions)

        # the classic group keeps only the offsets: its waiting members rejoin
        for m in list(classic.members.values()):
            ClassicGroup.invoke_join(m, JoinGroupResult(ErrorCode.REBALANCE_IN_PROGRESS, m.member_id))
            ClassicGroup.invoke_sync(m, SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        self._classic.cancel_group_timers(classic)
        _empty_classic(classic, self._classic._rt.now())
        c = self._consumer
        converted = [group_metadata_record(group.group_id, None), c._epoch_record(group)]
        for member in group.members.values():
            converted.append(c._member_records(group, member))
            converted.append(_target_record(group, member.member_id))
            converted.append(c._assignment_record(group, member))
        converted.extend(_target_metadata(group))
        # queued now, ahead of the heartbeat's own records, so that they are written even if
        # the heartbeat is refused after the conversion
        c._write(group.group_id, converted)
        c.groups[group.group_id] = group
        for member in group.members.values():
            c._schedule_session(group, member)
        log.info("upgraded classic group %s (generation %d, %d member(s)) to a consumer group",
                 group.group_id, group.group_epoch, len(group.members))
        return group

    # ================================================================== downgrade
    def maybe_downgrade(self, group: ConsumerGroup) -> list[Record]:
        """After a member was removed: if only classic members remain, the classic group they
        form (its records); else nothing."""
        if not group.members or any(m.classic is None for m in group.members.values()):
            return []
        if self._policy not in ("bidirectional", "downgrade"):
            log.info("cannot downgrade consumer group %s: the online downgrade is disabled",
                     group.group_id)
            return []
        if len(group.members) > self.config.group_max_size:
            log.info("cannot downgrade consumer group %s: larger than group.max.size",
                     group.group_id)
            return []
        c = self._consumer
        image_by_id = {info.topic_id: name for name, info in self._topics().items()}
        classic = self._classic.get_or_create_group(group.group_id)
        now = self._classic._rt.now()
        _empty_classic(classic, now)
        classic.protocol_type = CONSUMER_PROTOCOL_TYPE
        classic.generation_id = group.group_epoch
        assignments: dict[str, bytes] = {}
        for m in group.members.values():
            protocols = [(name, bytes(meta)) for name, meta in m.classic.protocols]
            member = ClassicGroupMember(m.member_id, m.instance_id, m.client_id, m.client_host,
                                        m.rebalance_timeout_ms, m.classic.session_timeout_ms,
                                        CONSUMER_PROTOCOL_TYPE, protocols)
            classic.add(member, None)
            partitions = {image_by_id[t]: sorted(ps) for t, ps in m.assigned.items()
                          if t in image_by_id}
            member.assignment = encode_consumer_protocol_assignment_v(
                partitions, _subscription_version(protocols))
            assignments[m.member_id] = member.assignment
        classic.protocol_name = classic.select_protocol()
        classic.subscribed_topics = classic.compute_subscribed_topics()
        classic.state = GroupState.STABLE        # as a loaded group with members is
        classic.state_timestamp = now

        records: list[Record] = []
        for member_id in list(group.members):
            records.extend(c._removal_records(group, member_id))
        records.extend(c.group_tombstones(group.group_id))
        c.unload(group)
        records.append(classic.metadata_record(assignments))
        for member in classic.members.values():
            self._classic.schedule_heartbeat(classic, member)
        self._classic.prepare_rebalance(
            classic, f"Downgrade group {group.group_id} from consumer to classic.")
        log.info("downgraded consumer group %s (epoch %d, %d member(s)) to a classic group",
                 group.group_id, classic.generation_id, len(classic.members))
        return records

    # ================================================================== classic members
    async def join(self, group: ConsumerGroup, member_id: str, instance_id: str | None,
                   require_known_member_id: bool, client_id: str, client_host: str,
                   rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]]) -> JoinGroupResult:
        """Kafka's classicGroupJoinToConsumerGroup."""
        c = self._consumer
        unknown = member_id == UNKNOWN_MEMBER_ID
        if unknown:
            member_id = self._new_member_id(client_id)
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols:
            return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        try:
            sub = decode_consumer_protocol_subscription(protocols[0][1])
        except RecordFormatError:
            return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        records: list[Record] = []
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None and unknown and require_known_member_id:
                return JoinGroupResult(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        else:
            current_id = group.static_members.get(instance_id)
            member = None if current_id is None else group.members.get(current_id)
            if member is not None and member.member_id != member_id:
                if not unknown:
                    return JoinGroupResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
                # a static member back under a new id takes over the old one's assignment
                records.extend(c._removal_records(group, member.member_id))
                member = group.replace_static_member(member, member_id)
                records.append(_target_record(group, member.member_id))
                records.append(c._assignment_record(group, member))
        is_new = member is None
        if is_new:
            if len(group.members) >= self.config.consumer_group_max_size:
                return JoinGroupResult(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id)
            member = ConsumerGroupMember(member_id)
        before = (member.member_epoch, member.state, dict(member.assigned),
                  dict(member.pending_revocation))
        metadata_before = c._metadata_of(member)
        subscription_before = member.subscribed_topics()
        member.instance_id = instance_id
        if sub.rack_id is not None:
            member.rack_id = sub.rack_id
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.server_assignor = None
        member.subscribed_topic_names = tuple(sub.topics)
        member.subscribed_topic_regex = None
        member.regex_topics = frozenset()
        member.client_id = client_id
        member.client_host = client_host
        member.classic = ClassicMemberMetadata(session_timeout_ms, tuple(protocols))
        if is_new:
            group.add_member(member)
        if is_new or c._metadata_of(member) != metadata_before:
            records.append(c._member_records(group, member))
        image = self._topics()
        bump = is_new or member.subscribed_topics() != subscription_before
        if c._refresh_subscription(group, image):
            bump = True
        if bump:
            group.group_epoch += 1
            records.append(c._epoch_record(group))
        if group.group_epoch > group.assignment_epoch:
            records.extend(c._compute_target(group))
        owned = []
        for topic, ps in sub.owned:
            info = image.get(topic)
            if info is not None:
                owned.append((info.topic_id, list(ps)))
        if member.state == MemberState.UNKNOWN:
            member.state = MemberState.STABLE
        group.reconcile(member, owned)
        if (member.member_epoch, member.state, member.assigned,
                member.pending_revocation) != before or is_new:
            records.append(c._assignment_record(group, member))
        c._schedule_session(group, member)
        if records:
            error = await c._write(group.group_id, records)
            if error != ErrorCode.NONE:
                from strata.coordinator.group.consumer_membership import _STORE_ERRORS
                return JoinGroupResult(_STORE_ERRORS.get(error, error), member_id)
        return JoinGroupResult(ErrorCode.NONE, member.member_id, member.member_epoch,
                               CONSUMER_PROTOCOL_TYPE, protocols[0][0], "")

    def _classic_member(self, group: ConsumerGroup, member_id: str,
                        instance_id: str | None) -> ConsumerGroupMember | ErrorCode:
        """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is None:
            member = group.members.get(member_id)
        else:
            current = group.static_members.get(instance_id)
            member = None if current is None else group.members.get(current)
            if member is not None and member.member_id != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member is None or member.classic is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return member

    async def sync(self, group: ConsumerGroup, generation_id: int, member_id: str,
                   instance_id: str | None, protocol_type: str | None,
                   protocol_name: str | None) -> SyncGroupResult:
        """Kafka's classicGroupSyncToConsumerGroup: the member's assigned partitions."""
        member = self._classic_member(group, member_id, instance_id)
        if isinstance(member, ErrorCode):
            return SyncGroupResult(member)
        if generation_id != member.member_epoch:
            return SyncGroupResult(ErrorCode.ILLEGAL_GENERATION)
        name = member.classic.protocols[0][0]
        if ((protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE)
                or (protocol_name is not None and protocol_name != name)):
            return SyncGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if (group.group_epoch > member.member_epoch
                and member.state != MemberState.UNREVOKED_PARTITIONS):
            return SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS)
        self._consumer._schedule_session(group, member)
        names = {info.topic_id: n for n, info in self._topics().items()}
        partitions = {names[t]: sorted(ps) for t, ps in member.assigned.items() if t in names}
        return SyncGroupResult(ErrorCode.NONE, CONSUMER_PROTOCOL_TYPE, name,
                               encode_consumer_protocol_assignment_v(
                                   partitions, _subscription_version(member.classic.protocols)))

    def heartbeat(self, group: ConsumerGroup, member_id: str, generation_id: int,
                  instance_id: str | None) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup."""
        member = self._classic_member(group, member_id, instance_id)
        if isinstance(member, ErrorCode):
            return member
        if generation_id != member.member_epoch:
            return ErrorCode.ILLEGAL_GENERATION
        self._consumer._schedule_session(group, member)
        if (member.member_epoch < group.group_epoch
                or member.state == MemberState.UNREVOKED_PARTITIONS
                or (member.state == MemberState.UNRELEASED_PARTITIONS
                    and not group.waiting_on_unreleased(member))):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group: ConsumerGroup, leaving: Iterable[LeaveMember]) -> LeaveGroupResult:
        """Kafka's classicGroupLeaveToConsumerGroup (the records go out in the background)."""
        c = self._consumer
        results = []
        records: list[Record] = []
        for lm in leaving:
            if lm.group_instance_id is None:
                member = group.members.get(lm.member_id)
                error = (ErrorCode.UNKNOWN_MEMBER_ID if member is None or member.classic is None
                         else None)
            else:
                current = group.static_members.get(lm.group_instance_id)
                member = None if current is None else group.members.get(current)
                if member is None:
                    error = ErrorCode.UNKNOWN_MEMBER_ID
                elif lm.member_id not in (UNKNOWN_MEMBER_ID, member.member_id):
                    error = ErrorCode.FENCED_INSTANCE_ID
                elif member.classic is None:
                    error = ErrorCode.UNKNOWN_MEMBER_ID
                else:
                    error = None
            if error is not None or member is None:
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, error))
                continue
            log.info("classic member %s left consumer group %s (reason: %s)", member.member_id,
                     group.group_id, lm.reason or "not provided")
            group.remove_member(member.member_id)
            records.extend(c._removal_records(group, member.member_id))
            results.append(LeaveMemberResult(member.member_id, lm.group_instance_id,
                                             ErrorCode.NONE))
        if records:
            group.group_epoch += 1
            records.append(c._epoch_record(group))
            c._write_in_background(group.group_id, records)
        return LeaveGroupResult(ErrorCode.NONE, tuple(results))


def _empty_classic(classic: ClassicGroup, now: int) -> None:
    """``classic`` without members or rebalance: only its offsets are left."""
    classic.members.clear()
    classic.static_members.clear()
    classic.pending_members.clear()
    classic.pending_sync_members.clear()
    classic.generation_id = 0
    classic.protocol_type = None
    classic.protocol_name = None
    classic.leader_id = None
    classic.subscribed_topics = None
    classic.new_member_added = False
    if classic.state != GroupState.EMPTY:
        classic.state = GroupState.EMPTY
        classic.state_timestamp = now


def _subscription_version(protocols: Iterable[tuple[str, bytes]]) -> int:
    for _, metadata in protocols:
        try:
            return decode_consumer_protocol_subscription(metadata).version
        except RecordFormatError:
            return 0
    return 0


def _target_record(group: ConsumerGroup, member_id: str) -> Record:
    return consumer_group_record(
        ConsumerGroupKey(CONSUMER_GROUP_TARGET_MEMBER_KEY, group.group_id, member_id),
        ConsumerGroupTargetMemberValue(dict(group.target.get(member_id, {}))))


def _target_metadata(group: ConsumerGroup) -> list[Record]:
    return [consumer_group_record(
        ConsumerGroupKey(CONSUMER_GROUP_TARGET_METADATA_KEY, group.group_id),
        ConsumerGroupTargetMetadataValue(group.assignment_epoch))]

