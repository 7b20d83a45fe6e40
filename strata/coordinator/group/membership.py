"""Membership of classic groups (the classic half of Kafka's ``GroupMetadataManager``):
JoinGroup, SyncGroup, Heartbeat and LeaveGroup, static membership, and the rebalance that they
drive, with its timers (member sessions, pending members, the join phase — Kafka's DelayedJoin
and InitialDelayedJoin — and the pending-SyncGroup deadline).

Owns the cache of groups (``groups``). Requests arrive here once ``GroupCoordinator`` has
checked that the group's ``__consumer_offsets`` partition is loaded and ours. A JoinGroup or
SyncGroup response is a future parked on the member until the rebalance moves on (as Kafka
parks a callback); the group's metadata record is appended through the runtime, and state that
may have changed during an append is checked again afterwards (group still alive, same
generation), as Kafka does. Runs on the event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Mapping

from strata.common.errors import ErrorCode
from strata.coordinator.group.classic_group import (
    ClassicGroup,
    ClassicGroupMember,
    JoinOp,
    SyncOp,
)
from strata.coordinator.group.results import (
    GROUP_STORE_ERRORS,
    UNKNOWN_MEMBER_ID,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMember,
    LeaveMemberResult,
    SyncGroupResult,
)
from strata.coordinator.group.runtime import CoordinatorRuntime
from strata.coordinator.group.state import GroupState

log = logging.getLogger(__name__)


class GroupMetadataManager:
    """The groups of this coordinator and the classic protocol's membership; see the module
    docstring."""

    def __init__(self, runtime: CoordinatorRuntime, member_id_factory: Callable[[str], str]):
        self._rt = runtime
        self.config = runtime.config
        self._new_member_id = member_id_factory
        self.groups: dict[str, ClassicGroup] = {}

    def get_or_create_group(self, group_id: str) -> ClassicGroup:
        group = self.groups.get(group_id)
        if group is None:
            group = ClassicGroup(group_id, self._rt.now())
            self.groups[group_id] = group
        return group

    # ------------------------------------------------------------------ heartbeats / timers
    def schedule_heartbeat(self, group: ClassicGroup, member: ClassicGroupMember,
                           timeout_ms: int | None = None) -> None:
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
        member.heartbeat_timer = self._rt.timers.call_later(
            delay, lambda: self._on_heartbeat_expired(group, member))

    def _on_heartbeat_expired(self, group: ClassicGroup, member: ClassicGroupMember) -> None:
        member.heartbeat_timer = None
        if group.state == GroupState.DEAD or group.members.get(member.member_id) is not member:
            return
        if not member.has_satisfied_heartbeat():
            log.info("member %s of group %s has failed (session timeout), removing it",
                     member.member_id, group.group_id)
            self._remove_member_and_update_group(group, member)

    def _add_pending_member(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        old = group.pending_members.pop(member_id, None)
        if old is not None:
            old.cancel()
        group.pending_members[member_id] = self._rt.timers.call_later(
            timeout_ms, lambda: self._on_pending_member_expired(group, member_id))

    def _on_pending_member_expired(self, group: ClassicGroup, member_id: str) -> None:
        if group.state == GroupState.DEAD or member_id not in group.pending_members:
            return
        log.info("pending member %s of group %s removed after session timeout", member_id,
                 group.group_id)
        group.pending_members.pop(member_id, None)
        if group.state == GroupState.PREPARING_REBALANCE:
            self._check_join(group)

    # ------------------------------------------------------------------ rebalance machinery
    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, reason)

    def prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_op(group)
        group.pending_sync_members.clear()

        delay = self.config.group_initial_rebalance_delay_ms
        if group.state == GroupState.EMPTY:
            op = JoinOp(True, delay, delay, max(group.rebalance_timeout_ms() - delay, 0))
        else:
            timeout = group.rebalance_timeout_ms()
            op = JoinOp(False, delay, timeout, 0)
        group.transition(GroupState.PREPARING_REBALANCE, self._rt.now())
        log.info("preparing to rebalance group %s (old generation %d, __consumer_offsets-%d): %s",
                 group.group_id, group.generation_id, self._rt.partition_for(group.group_id), reason)
        self._start_join_op(group, op)

    def _start_join_op(self, group: ClassicGroup, op: JoinOp) -> None:
        if group.join_op is not None and group.join_op.handle is not None:
            group.join_op.handle.cancel()
        group.join_op = op
        op.handle = self._rt.timers.call_later(op.delay, lambda: self._on_join_timer(group, op))
        if not op.initial:
            self._check_join(group)

    def _on_join_timer(self, group: ClassicGroup, op: JoinOp) -> None:
        if group.join_op is not op:
            return
        op.handle = None
        if op.initial and group.new_member_added and op.remaining != 0:
            # more members arrived during the initial delay: wait a little longer
            group.new_member_added = False
            delay = min(op.configured_delay, op.remaining)
            remaining = max(op.remaining - op.delay, 0)
            self._start_join_op(group, JoinOp(True, op.configured_delay, delay, remaining))
            return
        self._complete_join(group)

    def _check_join(self, group: ClassicGroup) -> None:
        """Kafka's tryCompleteJoin: an (non-initial) join phase ends once all have joined."""
        op = group.join_op
        if op is not None and not op.initial and group.has_all_members_joined():
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        op = group.join_op
        if op is not None and op.handle is not None:
            op.handle.cancel()
        group.join_op = None
        self._on_complete_join(group)

    def _on_complete_join(self, group: ClassicGroup) -> None:
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
            self._start_join_op(group, JoinOp(False, self.config.group_initial_rebalance_delay_ms,
                                               group.rebalance_timeout_ms(), 0))
            return

        group.init_next_generation(self._rt.now())
        if group.state == GroupState.EMPTY:
            log.info("group %s with generation %d is now empty", group.group_id, group.generation_id)
            records = [group.metadata_record({})]
            self._rt.spawn(self._store_quietly(group, records), f"store empty group {group.group_id}")
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
            self.schedule_heartbeat(group, member)
            group.pending_sync_members.add(member.member_id)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: ClassicGroup) -> None:
        self._cancel_sync_op(group)
        op = SyncOp(group.generation_id)
        group.sync_op = op
        op.handle = self._rt.timers.call_later(group.rebalance_timeout_ms(),
                                            lambda: self._on_sync_timer(group, op))

    def _cancel_sync_op(self, group: ClassicGroup) -> None:
        if group.sync_op is not None and group.sync_op.handle is not None:
            group.sync_op.handle.cancel()
        group.sync_op = None

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            self._cancel_sync_op(group)

    def _on_sync_timer(self, group: ClassicGroup, op: SyncOp) -> None:
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
            self.prepare_rebalance(group, f"members {missing} did not send SyncGroup in time")

    def _remove_member_and_update_group(self, group: ClassicGroup,
                                        member: ClassicGroupMember) -> None:
        # a member removed while its JoinGroup is parked is told to rejoin from scratch
        group.invoke_join(member, JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"removing member {member.member_id}")
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._check_join(group)

    def _set_and_propagate_assignment(self, group: ClassicGroup, assignment: Mapping[str,
                                      bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.NONE)

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == ErrorCode.NONE
        for member in list(group.members.values()):
            result = SyncGroupResult(error, group.protocol_type if ok else None,
                                     group.protocol_name if ok else None, member.assignment)
            if group.invoke_sync(member, result):
                self.schedule_heartbeat(group, member)

    async def _store_group(self, records: list[tuple[bytes, bytes | None]],
                           group: ClassicGroup) -> ErrorCode:
        error = await self._rt.append(self._rt.partition_for(group.group_id), records)
        return GROUP_STORE_ERRORS.get(error, error)

    async def _store_quietly(self, group: ClassicGroup, records: list[tuple[bytes,
                             bytes | None]]) -> None:
        error = await self._store_group(records, group)
        if error != ErrorCode.NONE:
            log.warning("failed to write metadata of group %s: %s", group.group_id, error.name)

    def handle_join(self, fut: asyncio.Future, group_id: str, member_id: str,
                    group_instance_id: str | None, require_known_member_id: bool,
                    supports_skip_assignment: bool, client_id: str, client_host: str,
                    rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                    protocols: list[tuple[str, bytes]], reason: str) -> None:
        def respond(error: ErrorCode, mid: str = member_id) -> None:
            fut.set_result(JoinGroupResult(error, mid))

        if not (self.config.group_min_session_timeout_ms <= session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return respond(ErrorCode.INVALID_SESSION_TIMEOUT)

        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self.groups.get(group_id)
        if group is None:
            if not is_unknown:
                return respond(ErrorCode.UNKNOWN_MEMBER_ID)
            group = self.get_or_create_group(group_id)

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

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self.config.group_max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.state == GroupState.PREPARING_REBALANCE:
            member = group.members.get(member_id)
            return ((member is not None and member.awaiting_join is not None)
                    or group.num_awaiting_join() < max_size)
        return member_id in group.members or len(group.members) < max_size

    def _new_member_join(self, fut: asyncio.Future, group: ClassicGroup,
                         group_instance_id: str | None,
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

    def _current_member_join(self, fut: asyncio.Future, group: ClassicGroup, member_id: str,
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
        error = group.validate_member(member_id, group_instance_id)
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
    def _current_generation_result(group: ClassicGroup, member_id: str) -> JoinGroupResult:
        return JoinGroupResult(
            ErrorCode.NONE, member_id, group.generation_id, group.protocol_type,
            group.protocol_name, group.leader_id or "",
            group.current_member_metadata() if group.is_leader(member_id) else ())

    def _add_member_and_rebalance(self, fut: asyncio.Future, group: ClassicGroup, member_id: str,
                                  group_instance_id: str | None, client_id: str, client_host: str,
                                  rebalance_timeout_ms: int, session_timeout_ms: int,
                                  protocol_type: str, protocols: list[tuple[str, bytes]],
                                  reason: str) -> None:
        member = ClassicGroupMember(member_id, group_instance_id, client_id, client_host,
                         rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols)
        member.is_new = True
        if group.state == GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, fut)
        # a new member cannot heartbeat until it has its first JoinGroup response, and its
        # parked JoinGroup hides a disconnect: it gets a long fixed deadline instead
        self.schedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id} "
                                             f"(instance id {group_instance_id}); reason: {reason}")

    def _update_member_and_rebalance(self, group: ClassicGroup, member: ClassicGroupMember,
                                     protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                                     session_timeout_ms: int, fut: asyncio.Future,
                                     reason: str) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        self._maybe_prepare_rebalance(group, reason)

    def _update_static_member_and_rebalance(
            self, fut: asyncio.Future, group: ClassicGroup, old_member_id: str, new_member_id: str,
            group_instance_id: str, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
            session_timeout_ms: int, supports_skip_assignment: bool, reason: str) -> None:
        current_leader = group.leader_id
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        self.schedule_heartbeat(group, member)
        old_protocols = member.protocols
        old_rebalance_timeout = member.rebalance_timeout_ms
        old_session_timeout = member.session_timeout_ms
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)

        if group.state == GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # same protocol: no rebalance, just persist the new member id
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                record = group.metadata_record(assignment)
                self._rt.spawn(self._finish_static_rejoin(
                    group, member, fut, record, group_instance_id, old_member_id, new_member_id,
                    current_leader, old_protocols, old_rebalance_timeout, old_session_timeout,
                    supports_skip_assignment), f"static rejoin in {group.group_id}")
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {group_instance_id} rejoined with another protocol")
        elif group.state == GroupState.COMPLETING_REBALANCE:
            # the leader may be assigning to the old member id: start over
            self.prepare_rebalance(group, f"static member {group_instance_id} rejoined "
                                           f"during CompletingRebalance; reason: {reason}")
        elif group.state == GroupState.PREPARING_REBALANCE:
            pass  # its JoinGroup is parked with the others
        else:
            group.invoke_join(member, JoinGroupResult(ErrorCode.UNKNOWN_SERVER_ERROR, new_member_id))

    async def _finish_static_rejoin(self, group: ClassicGroup, member: ClassicGroupMember,
                                    fut: asyncio.Future,
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
                self.schedule_heartbeat(group, member)
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
        self.schedule_heartbeat(group, member)

    def handle_sync(self, fut: asyncio.Future, group_id: str, generation_id: int,
                    member_id: str, group_instance_id: str | None, protocol_type: str | None,
                    protocol_name: str | None, assignment: dict[str, bytes]) -> None:
        def respond(error: ErrorCode) -> None:
            fut.set_result(SyncGroupResult(error))

        group = self.groups.get(group_id)
        if group is None:
            return respond(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return respond(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = group.validate_member(member_id, group_instance_id)
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
                record = group.metadata_record(full)
                self._rt.spawn(self._complete_sync(group, group.generation_id, full, record),
                            f"store assignment of {group_id}")
            return

        # Stable: hand out the current assignment
        self._remove_pending_sync_member(group, member_id)
        fut.set_result(SyncGroupResult(ErrorCode.NONE, group.protocol_type, group.protocol_name,
                                       member.assignment))
        self.schedule_heartbeat(group, member)

    async def _complete_sync(self, group: ClassicGroup, generation: int, assignment: dict[str,
                             bytes],
                             record: tuple[bytes, bytes | None]) -> None:
        error = await self._store_group([record], group)
        if group.state != GroupState.COMPLETING_REBALANCE or group.generation_id != generation:
            return  # the group moved on meanwhile (a member joined, left or expired)
        if error != ErrorCode.NONE:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, f"error {error.name} storing the assignment")
        else:
            self._set_and_propagate_assignment(group, assignment)
            group.transition(GroupState.STABLE, self._rt.now())

    # ================================================================== Heartbeat
    def heartbeat(self, group_id: str, member_id: str, generation_id: int, *,
                  group_instance_id: str | None = None) -> ErrorCode:
        """Heartbeat v0-4 of a group of ours: NONE, REBALANCE_IN_PROGRESS (rejoin), or an
        error."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self.schedule_heartbeat(group, group.members[member_id])
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # ================================================================== LeaveGroup
    def leave_group(self, group_id: str, leaving: list[LeaveMember]) -> LeaveGroupResult:
        """LeaveGroup v0-5 of a group of ours (v0-2 send one member; v3+ a batch, where an
        empty member id with a group instance id removes that static member)."""
        group = self.groups.get(group_id)
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
                member_error = group.validate_member(m.member_id,
                                                             m.group_instance_id)
                if member_error is None:
                    self._leave(group, group.members[m.member_id], m.reason)
                    member_error = ErrorCode.NONE
            results.append(LeaveMemberResult(m.member_id, m.group_instance_id, member_error))
        return LeaveGroupResult(ErrorCode.NONE, tuple(results))

    def _leave(self, group: ClassicGroup, member: ClassicGroupMember, reason: str | None) -> None:
        log.info("member %s left group %s (reason: %s)", member.member_id, group.group_id,
                 reason or "not provided")
        self._remove_member_and_update_group(group, member)

    def cancel_group_timers(self, group: ClassicGroup) -> None:
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

