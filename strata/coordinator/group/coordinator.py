"""The classic-protocol group coordinator: consumer groups, rebalances and committed offsets.

It follows Kafka's classic group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup,
OffsetCommit/OffsetFetch, DescribeGroups/ListGroups/DeleteGroups/OffsetDelete) but does no
I/O of its own and knows nothing of the wire format: the broker's handler layer turns requests
into plain arguments and the results (``results``: dataclasses carrying an ``ErrorCode``) into
responses.

``GroupCoordinator`` is the package's face (Kafka's ``GroupCoordinatorService``): it owns which
``__consumer_offsets`` partitions are loaded and ours, answers NOT_COORDINATOR /
COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE itself, and hands every other request
to the part that holds its state:

- ``membership.GroupMetadataManager``: the groups, JoinGroup/SyncGroup/Heartbeat/LeaveGroup,
  static membership and the rebalance timers; a group is a ``classic_group.ClassicGroup`` whose
  states and legal transitions are the table in ``state``;
- ``offsets.OffsetMetadataManager``: plain and transactional offset commits, OffsetFetch,
  OffsetDelete, a deleted topic's offsets and expiry;
- ``loader.CoordinatorLoader``: replaying ``__consumer_offsets`` partitions into both;
- ``runtime.CoordinatorRuntime``: what they share (the ``OffsetsLog`` port, clock, ``Timers``
  port, background tasks).

Everything runs on one asyncio event loop, so no locks are needed: a method changes state
synchronously and only awaits for two things — a JoinGroup/SyncGroup response parked until the
rebalance moves on, and an append to ``__consumer_offsets`` through the ``OffsetsLog`` port.

Persistence: committed offsets and group metadata are records of ``__consumer_offsets`` in
Kafka's format (``offsets_records``), appended to the partition ``partition_for(group_id)``.
``load(partitions)`` replays those partitions to rebuild the groups and their offsets before
serving them; ``on_topic_deleted`` (a cluster-metadata listener) drops a deleted topic's offsets
from every group before the deletion is answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Iterable, Mapping

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import ErrorCode
from strata.coordinator.group.classic_group import ClassicGroup
from strata.coordinator.group.config import GroupCoordinatorConfig
from strata.coordinator.group.consumer_membership import ConsumerGroupManager
from strata.coordinator.group.migration import GroupMigration
from strata.coordinator.group.loader import CoordinatorLoader
from strata.coordinator.group.membership import GroupMetadataManager
from strata.coordinator.group.offsets import OffsetMetadataManager
from strata.coordinator.group.results import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_GROUP_TYPE,
    CONSUMER_PROTOCOL_TYPE,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResult,
    DescribedConsumerGroup,
    DescribedMember,
    ListedGroup,
    DEFAULT_RETENTION_TIME,
    NO_GENERATION,
    UNKNOWN_MEMBER_ID,
    DescribedGroup,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMember,
    ListGroupsResult,
    OffsetCommitPartition,
    OffsetFetchResult,
    SyncGroupResult,
    TopicPartition,
)
from strata.coordinator.group.runtime import CoordinatorRuntime, OffsetsLog
from strata.coordinator.group.state import GroupState
from strata.coordinator.group.timers import LoopTimers, Timers

log = logging.getLogger(__name__)


def _default_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def _commit_entries(offsets: Iterable[OffsetCommitPartition | tuple]) -> list[OffsetCommitPartition]:
    return [o if isinstance(o, OffsetCommitPartition) else OffsetCommitPartition(*o)
            for o in offsets]


class GroupCoordinator:
    """Kafka's classic group coordinator over an ``OffsetsLog``; see the module docstring.

    Call ``load()`` (from inside the event loop) before serving: until a group's
    ``__consumer_offsets`` partition is loaded, its requests get NOT_COORDINATOR.
    """

    def __init__(self, offsets_log: OffsetsLog, config: GroupCoordinatorConfig | None = None, *,
                 clock: Clock = SYSTEM_CLOCK, timers: Timers | None = None,
                 member_id_factory: Callable[[str], str] = _default_member_id,
                 topic_exists: Callable[[str], bool] | None = None,
                 topics: Callable[[], Mapping[str, Any]] | None = None):
        self.config = config or GroupCoordinatorConfig()
        self._runtime = CoordinatorRuntime(offsets_log, self.config, clock,
                                           timers if timers is not None else LoopTimers())
        self._membership = GroupMetadataManager(self._runtime, member_id_factory)
        self._offsets = OffsetMetadataManager(self._runtime, self._membership)
        # KIP-848 consumer groups; ``topics`` is the topic image (name -> TopicInfo)
        self._consumer = ConsumerGroupManager(self._runtime, self._membership.groups,
                                              topics if topics is not None else dict)
        self._consumer_groups = self._consumer.groups
        self._migration = GroupMigration(self._consumer, self._membership,
                                         topics if topics is not None else dict,
                                         member_id_factory)
        self._offsets.is_active_consumer_group = (
            lambda group_id: bool(getattr(self._consumer_groups.get(group_id), "members", None)))
        self._offsets.after_expiry = self._drop_empty_consumer_groups
        self._loader = CoordinatorLoader(self._runtime, self._membership, self._offsets,
                                         topic_exists, self._consumer)
        self._groups = self._membership.groups
        self._owned: set[int] = set()
        self._loading: set[int] = set()
        self._load_tokens: dict[int, object] = {}   # partition -> its background load

    # ------------------------------------------------------------------ helpers
    def partition_for(self, group_id: str) -> int:
        return self._runtime.partition_for(group_id)

    def _status_error(self, group_id: str | None, allow_empty_id: bool) -> ErrorCode | None:
        """Kafka's validateGroupStatus: valid id, active, loaded, and ours."""
        if group_id is None or (not allow_empty_id and group_id == ""):
            return ErrorCode.INVALID_GROUP_ID
        if not self._runtime.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        partition = self.partition_for(group_id)
        if partition in self._loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if partition not in self._owned:
            return ErrorCode.NOT_COORDINATOR
        return None

    # ================================================================== membership
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
        member_id = member_id or UNKNOWN_MEMBER_ID
        error = self._status_error(group_id, allow_empty_id=False)
        consumer = self._consumer_groups.get(group_id) if error is None else None
        if consumer is not None and consumer.members:
            # a classic member of a consumer group (KIP-848's mixed membership)
            return await self._migration.join(
                consumer, member_id, group_instance_id, require_known_member_id, client_id,
                client_host,
                session_timeout_ms if rebalance_timeout_ms is None or rebalance_timeout_ms < 0
                else rebalance_timeout_ms, session_timeout_ms, protocol_type,
                [(str(name), bytes(meta or b"")) for name, meta in protocols])
        if error is None:
            error = self._classic_join_conflict(group_id)
        if error is not None:
            fut.set_result(JoinGroupResult(error, member_id))
        else:
            self._membership.handle_join(
                fut, group_id, member_id, group_instance_id,
                require_known_member_id, supports_skip_assignment, client_id, client_host,
                session_timeout_ms if rebalance_timeout_ms is None or rebalance_timeout_ms < 0
                else rebalance_timeout_ms,
                session_timeout_ms, protocol_type,
                [(str(name), bytes(meta or b"")) for name, meta in protocols],
                reason or "not provided")
        return await fut

    def _classic_join_conflict(self, group_id: str) -> ErrorCode | None:
        """A classic JoinGroup to an empty consumer group: it becomes classic (as in Kafka)."""
        group = self._consumer_groups.get(group_id)
        if group is None:
            return None
        self._consumer.delete(group)
        self._runtime.spawn(self._runtime.append_tombstones(
            {self.partition_for(group_id): self._consumer.group_tombstones(group_id)}),
            f"tombstones of consumer group {group_id}")
        return None

    # ================================================================== consumer groups
    async def consumer_group_heartbeat(
            self, request: ConsumerGroupHeartbeatRequest, *, api_version: int = 1,
            client_id: str = "", client_host: str = "",
            authorized_topics: Callable[[Iterable[str]], set[str]] | None = None,
    ) -> ConsumerGroupHeartbeatResult:
        """ConsumerGroupHeartbeat v0-1 (KIP-848); see ``consumer_membership``."""
        error = self._status_error(request.group_id, allow_empty_id=True)
        if error is not None:
            return ConsumerGroupHeartbeatResult(error)
        return await self._consumer.heartbeat(request, api_version=api_version,
                                              client_id=client_id, client_host=client_host,
                                              authorized_topics=authorized_topics)

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[DescribedConsumerGroup]:
        """ConsumerGroupDescribe v0-1: GROUP_ID_NOT_FOUND for a group that is not a consumer
        group."""
        out = []
        for group_id in group_ids:
            error = self._status_error(group_id, allow_empty_id=True)
            out.append(DescribedConsumerGroup(group_id, error) if error is not None
                       else self._consumer.describe(group_id))
        return out

    async def _drop_empty_consumer_groups(self) -> None:
        """After an expiry pass: a consumer group without members and without offsets is
        deleted, as Kafka deletes it."""
        for group in list(self._consumer_groups.values()):
            holder = self._groups.get(group.group_id)
            if group.members or (holder is not None and holder.has_offsets()):
                continue
            log.info("deleting empty consumer group %s without offsets", group.group_id)
            await self._runtime.append_tombstones(
                {self.partition_for(group.group_id): self._consumer.delete(group)})

    def consumer_group(self, group_id: str):
        """The consumer group ``group_id`` (introspection for tests), or None."""
        return self._consumer_groups.get(group_id)

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
        assignment = {m: bytes(a or b"") for m, a in items}
        error = self._status_error(group_id, allow_empty_id=False)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance state was lost: have the member rejoin without rediscovery
            fut.set_result(SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        elif error is not None:
            fut.set_result(SyncGroupResult(error))
        elif group_id in self._consumer_groups:
            return await self._migration.sync(self._consumer_groups[group_id], generation_id,
                                              member_id, group_instance_id, protocol_type,
                                              protocol_name)
        else:
            self._membership.handle_sync(fut, group_id, generation_id, member_id,
                                         group_instance_id, protocol_type, protocol_name,
                                         assignment)
        return await fut

    def heartbeat(self, group_id: str, member_id: str, generation_id: int, *,
                  group_instance_id: str | None = None) -> ErrorCode:
        """Heartbeat v0-4: NONE, REBALANCE_IN_PROGRESS (rejoin), or an error."""
        error = self._status_error(group_id, allow_empty_id=False)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return ErrorCode.NONE  # still loading: answer blindly, as Kafka does
        if error is not None:
            return error
        if group_id in self._consumer_groups:
            return self._migration.heartbeat(self._consumer_groups[group_id], member_id,
                                             generation_id, group_instance_id)
        return self._membership.heartbeat(group_id, member_id, generation_id,
                                          group_instance_id=group_instance_id)

    def leave_group(self, group_id: str, members: Iterable[LeaveMember | tuple]) -> LeaveGroupResult:
        """LeaveGroup v0-5 (v0-2 send one member; v3+ a batch, where an empty member id with
        a group instance id removes that static member)."""
        leaving = [m if isinstance(m, LeaveMember) else LeaveMember(*m) for m in members]
        error = self._status_error(group_id, allow_empty_id=False)
        if error is not None:
            return LeaveGroupResult(error)
        if group_id in self._consumer_groups:
            return self._migration.leave(self._consumer_groups[group_id], leaving)
        return self._membership.leave_group(group_id, leaving)

    # ================================================================== offsets
    async def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        offsets: Iterable[OffsetCommitPartition | tuple],
        *,
        group_instance_id: str | None = None,
        retention_time_ms: int = DEFAULT_RETENTION_TIME,
        api_version: int | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit v2-8. Generation -1 with an empty member id is a "simple" commit,
        allowed while the group has no members (it creates the group if needed). Answers
        after the records are appended; returns a code per (topic, partition)."""
        entries = _commit_entries(offsets)
        error = self._status_error(group_id, allow_empty_id=True)
        if error is None and group_id in self._consumer_groups:
            # a consumer group: ``generation_id`` is the member epoch (v9+)
            error = self._consumer.validate_offset_commit(
                group_id, member_id, group_instance_id, generation_id, api_version=api_version)
            if error is None:
                return await self._offsets.commit_consumer_group_offsets(
                    group_id, entries, retention_time_ms)
        if error is not None:
            return {(e.topic, e.partition): error for e in entries}
        return await self._offsets.commit_offsets(group_id, member_id, generation_id, entries,
                                                  group_instance_id, retention_time_ms)

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
        entries = _commit_entries(offsets)
        error = self._status_error(group_id, allow_empty_id=False)
        if error is None and group_id in self._consumer_groups:
            error = self._consumer.validate_offset_commit(
                group_id, member_id, group_instance_id, generation_id, api_version=None,
                transactional=True)
            if error is None:
                return await self._offsets.commit_consumer_group_txn_offsets(
                    group_id, producer_id, producer_epoch, entries)
        if error is not None:
            return {(e.topic, e.partition): error for e in entries}
        return await self._offsets.commit_transactional_offsets(
            transactional_id, group_id, producer_id, producer_epoch, entries, member_id,
            generation_id, group_instance_id)

    def complete_transaction(self, offsets_partition: int, producer_id: int,
                             commit: bool) -> None:
        """The marker of ``producer_id``'s transaction is in ``__consumer_offsets-
        <offsets_partition>`` (Kafka's handleTxnCompletion): the offsets the transaction
        committed to that partition's groups become their committed offsets — each only if
        its record is newer than the current offset's — or, on abort, are dropped. Called on
        the event loop once the marker is appended."""
        self._offsets.complete_transaction(offsets_partition, producer_id, commit)

    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None, *,
                      require_stable: bool = False, member_id: str | None = None,
                      member_epoch: int = -1) -> OffsetFetchResult:
        """OffsetFetch v1-7 for one group (v8+ batches call this per group). ``partitions``
        None means every partition with a committed offset. Unknown partitions get offset -1;
        with ``require_stable`` a partition with a commit in flight or in an open transaction
        gets UNSTABLE_OFFSET_COMMIT. ``member_id``/``member_epoch`` (v9+) are checked against
        a consumer group's member (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH)."""
        error = self._status_error(group_id, allow_empty_id=True)
        if error is None and group_id in self._consumer_groups:
            error = self._consumer.validate_offset_fetch(group_id, member_id, member_epoch)
        if error is not None:
            return OffsetFetchResult(error)
        return self._offsets.fetch_offsets(group_id, partitions, require_stable)

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
        consumer = self._consumer_groups.get(group_id)
        if consumer is not None and consumer.members:
            subscribed = consumer.subscribed_topic_names()
            errors = {tp: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC for tp in wanted
                      if tp[0] in subscribed}
            rest = [tp for tp in wanted if tp[0] not in subscribed]
            if rest and group_id in self._groups:
                error, deleted = await self._offsets.delete_offsets(group_id, rest)
                errors.update(deleted)
            else:
                errors.update({tp: ErrorCode.NONE for tp in rest})
            return ErrorCode.NONE, errors
        if consumer is not None and group_id not in self._groups:
            return ErrorCode.NONE, {tp: ErrorCode.NONE for tp in wanted}
        return await self._offsets.delete_offsets(group_id, wanted)

    async def expire_offsets(self) -> int:
        """One pass of ``offsets.retention.minutes`` expiry (``offsets``); how many went."""
        return await self._offsets.expire_offsets()

    def on_topic_deleted(self, info: Any) -> None:
        """Cluster-metadata listener (any thread): ``info.name`` is gone, and so are its
        committed offsets in every group, as Kafka's onPartitionsDeleted does. On the loop's
        thread the offsets leave memory before this returns (so before DeleteTopics is
        answered); their tombstones are appended right after."""
        loop = self._runtime.loop
        if loop is None or not self._runtime.active:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._offsets.delete_topic_offsets(info.name)
        else:
            loop.call_soon_threadsafe(self._offsets.delete_topic_offsets, info.name)

    # ================================================================== groups
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        out = []
        for group_id in group_ids:
            error = self._status_error(group_id, allow_empty_id=True)
            if error is not None:
                out.append(DescribedGroup(group_id, error, ""))
                continue
            consumer = self._consumer_groups.get(group_id)
            if consumer is not None:
                out.append(self._describe_consumer_group(consumer))
                continue
            group = self._groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                out.append(DescribedGroup(group_id, ErrorCode.NONE, GroupState.DEAD.value))
                continue
            out.append(group.describe())
        return out

    def _describe_consumer_group(self, group) -> DescribedGroup:
        """A consumer group as DescribeGroups shows it (Kafka's asDescribedGroup): members'
        subscriptions and assignments in the consumer protocol's v0 encoding."""
        from strata.coordinator.offsets_records import (
            encode_consumer_protocol_assignment, encode_consumer_protocol_subscription)
        image = self._consumer._topics()
        names = {info.topic_id: name for name, info in image.items()}
        members = tuple(
            DescribedMember(
                m.member_id, m.instance_id, m.client_id, m.client_host,
                encode_consumer_protocol_subscription(sorted(m.subscribed_topics())),
                encode_consumer_protocol_assignment(
                    {names[t]: sorted(ps) for t, ps in m.assigned.items() if t in names}))
            for m in group.members.values())
        return DescribedGroup(group.group_id, ErrorCode.NONE, group.state,
                              CONSUMER_PROTOCOL_TYPE,
                              group.preferred_assignor(self.config.consumer_group_assignors[0]),
                              members)

    def list_groups(self, states: Iterable[str] | None = None,
                    types: Iterable[str] | None = None) -> ListGroupsResult:
        """ListGroups v0-5; ``states`` (v4+) and ``types`` (v5+: "classic", "consumer")
        filter case-insensitively."""
        if not self._runtime.active:
            return ListGroupsResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        state_filter = {s.lower() for s in states} if states else None
        type_filter = {t.lower() for t in types} if types else None
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self._loading else ErrorCode.NONE
        groups: list[ListedGroup] = []
        if type_filter is None or CLASSIC_GROUP_TYPE in type_filter:
            groups.extend(
                g.as_listed_group()
                for g in self._groups.values()
                if g.state != GroupState.DEAD and g.group_id not in self._consumer_groups
                and (state_filter is None or g.state.value.lower() in state_filter))
        if type_filter is None or CONSUMER_GROUP_TYPE in type_filter:
            groups.extend(
                ListedGroup(g.group_id, CONSUMER_PROTOCOL_TYPE, g.state, CONSUMER_GROUP_TYPE)
                for g in self._consumer_groups.values()
                if state_filter is None or g.state.lower() in state_filter)
        return ListGroupsResult(error, tuple(groups))

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: only Empty groups go (NON_EMPTY_GROUP otherwise); their offsets and
        metadata are tombstoned."""
        errors: dict[str, ErrorCode] = {}
        eligible: list[ClassicGroup] = []
        for group_id in group_ids:
            error = self._status_error(group_id, allow_empty_id=True)
            if error is not None:
                errors[group_id] = error
                continue
            consumer = self._consumer_groups.get(group_id)
            if consumer is not None:
                if consumer.members:
                    errors[group_id] = ErrorCode.NON_EMPTY_GROUP
                    continue
                await self._runtime.append_tombstones(
                    {self.partition_for(group_id): self._consumer.delete(consumer)})
                errors[group_id] = ErrorCode.NONE
                if group_id not in self._groups:
                    continue
            group = self._groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                errors[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state == GroupState.EMPTY:
                group.transition(GroupState.DEAD, self._runtime.now())
                eligible.append(group)
            else:
                errors[group_id] = ErrorCode.NON_EMPTY_GROUP
        if eligible:
            removed = await self._offsets.cleanup_groups(
                eligible, lambda g: self._offsets.remove_offsets(g, None))
            log.info("deleted groups %s (%d offsets removed)", [g.group_id for g in eligible],
                     removed)
            for g in eligible:
                errors[g.group_id] = ErrorCode.NONE
        return errors

    # ================================================================== load / unload
    def load(self, partitions: Iterable[int] | None = None) -> None:
        """Become coordinator of ``partitions`` of ``__consumer_offsets`` (all by default):
        replay each to rebuild its groups and committed offsets. Loaded groups are Stable
        (members from their last metadata record, whose sessions start now) or Empty."""
        parts = (range(self.config.offsets_topic_num_partitions) if partitions is None
                 else list(partitions))
        try:
            self._runtime.loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        for partition in parts:
            if partition in self._owned:
                continue
            self._loading.add(partition)
            try:
                self._loader.apply(partition, self._loader.scan(partition))
            finally:
                self._loading.discard(partition)
            self._owned.add(partition)
        self._offsets.schedule_retention()

    def load_in_background(self, partitions: Iterable[int] | None = None) -> None:
        """``load`` for a running broker: each partition's log is replayed in a worker thread
        (the event loop keeps serving every other request; the partition's groups answer
        COORDINATOR_LOAD_IN_PROGRESS meanwhile, as Kafka's do), then applied on the loop.
        A partition unloaded during its replay is not applied."""
        self._runtime.loop = asyncio.get_running_loop()
        parts = (range(self.config.offsets_topic_num_partitions) if partitions is None
                 else list(partitions))
        for partition in parts:
            if partition in self._owned or partition in self._loading:
                continue
            self._loading.add(partition)
            token = self._load_tokens[partition] = object()
            self._runtime.spawn(self._load_async(partition, token),
                                f"loading __consumer_offsets-{partition}")

    async def _load_async(self, partition: int, token: object) -> None:
        started = time.monotonic()
        try:
            scanned = await asyncio.to_thread(self._loader.scan, partition)
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
        self._loader.apply(partition, scanned)
        self._owned.add(partition)
        self._offsets.schedule_retention()
        if scanned.offsets or scanned.groups:
            log.info("loaded %d group(s) and %d offset(s) of __consumer_offsets-%d in %d ms",
                     len(scanned.groups), len(scanned.offsets), partition,
                     (time.monotonic() - started) * 1000)

    def unload(self, partitions: Iterable[int]) -> None:
        """Stop coordinating ``partitions``: their groups are dropped (parked JoinGroup and
        SyncGroup requests get NOT_COORDINATOR)."""
        parts = set(partitions)
        for group in list(self._groups.values()):
            if self.partition_for(group.group_id) in parts:
                self._unload_group(group)
        for consumer in list(self._consumer_groups.values()):
            if self.partition_for(consumer.group_id) in parts:
                log.info("unloading consumer group %s (epoch %d)", consumer.group_id,
                         consumer.group_epoch)
                self._consumer.unload(consumer)
        self._owned -= parts
        self._loading -= parts
        for p in parts:
            self._load_tokens.pop(p, None)

    def _unload_group(self, group: ClassicGroup) -> None:
        previous = group.state
        group.transition(GroupState.DEAD, self._runtime.now())
        log.info("unloading group %s (%s, generation %d)", group.group_id, previous.value,
                 group.generation_id)
        for member in list(group.members.values()):
            # parked JoinGroups (a rebalance, or a static rejoin being stored) and SyncGroups
            group.invoke_join(member, JoinGroupResult(ErrorCode.NOT_COORDINATOR, member.member_id))
            group.invoke_sync(member, SyncGroupResult(ErrorCode.NOT_COORDINATOR))
        self._offsets.drop_group(group)

    def shutdown(self) -> None:
        """Stop serving: unload everything and cancel timers and background work."""
        self.unload(set(self._owned))
        self._runtime.active = False
        self._offsets.cancel_retention()
        for task in list(self._runtime.tasks):
            task.cancel()

    # ================================================================== introspection
    def group_state(self, group_id: str) -> GroupState | None:
        group = self._groups.get(group_id)
        return None if group is None else group.state

    @property
    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._owned)
