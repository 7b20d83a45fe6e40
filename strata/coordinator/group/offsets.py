"""Committed offsets of classic groups (Kafka's ``OffsetMetadataManager``): OffsetCommit,
TxnOffsetCommit and the completion of its transactions, OffsetFetch, OffsetDelete, the removal
of a deleted topic's offsets, and ``offsets.retention.minutes`` expiry.

Requests arrive here once ``GroupCoordinator`` has checked that the group's
``__consumer_offsets`` partition is loaded and ours. The offsets live on their
``ClassicGroup``; this module decides what they are. As in Kafka, an offset replaces the current
one only when its record is newer in the log (``seq`` follows append order), so a plain commit
appended after a transactional one wins even if the transaction commits later.

Transactional offset commits (Kafka's exactly-once consume-transform-produce): the offsets are
appended as one transactional batch of the producer to the group's partition; they stay
*pending* for that producer id — invisible to OffsetFetch, UNSTABLE_OFFSET_COMMIT with
``require_stable`` — until the transaction's marker is written to that partition and
``complete_transaction`` makes them the committed offsets (commit) or drops them (abort).

Deleted topics: an offset record names its topic, not the topic's id, so an offset must never
outlive its topic or a new topic of the same name would inherit it: ``delete_topic_offsets``
drops the topic's offsets from every group at once, then appends their tombstones.

Runs on the event loop only.
"""

from __future__ import annotations

import itertools
import logging
from typing import Awaitable, Callable, Iterable

from strata.common.errors import ErrorCode
from strata.coordinator.group.classic_group import ClassicGroup, CommittedOffset
from strata.coordinator.group.membership import GroupMetadataManager
from strata.coordinator.group.results import (
    CONSUMER_PROTOCOL_TYPE,
    DEFAULT_RETENTION_TIME,
    NO_OFFSET,
    OFFSET_STORE_ERRORS,
    UNKNOWN_MEMBER_ID,
    FetchedOffset,
    OffsetCommitPartition,
    OffsetFetchResult,
    TopicPartition,
)
from strata.coordinator.group.runtime import CoordinatorRuntime
from strata.coordinator.group.state import GroupState
from strata.coordinator.group.timers import TimerHandle
from strata.coordinator.offsets_records import (
    NO_LEADER_EPOCH,
    NO_TIMESTAMP,
    OffsetCommitValue,
    group_metadata_record,
    offset_commit_record,
)

log = logging.getLogger(__name__)


async def _nothing() -> None:
    return None


class OffsetMetadataManager:
    """The committed offsets of the groups ``membership`` holds; see the module docstring."""

    def __init__(self, runtime: CoordinatorRuntime, membership: GroupMetadataManager):
        self._rt = runtime
        self.config = runtime.config
        self._membership = membership
        self._groups = membership.groups
        self._retention_timer: TimerHandle | None = None
        # producer id -> ids of groups with offsets pending in its open transaction (Kafka's
        # openGroupsForProducer); a stale entry is harmless (the group is checked)
        self.txn_groups: dict[int, set[str]] = {}
        # whether a consumer group of this id has members (its offsets then never expire
        # as an empty group's do); set by GroupCoordinator
        self.is_active_consumer_group: Callable[[str], bool] = lambda group_id: False
        # run after each expiry pass (GroupCoordinator: drop empty consumer groups)
        self.after_expiry: Callable[[], Awaitable[None]] = _nothing

    async def commit_consumer_group_offsets(self, group_id: str,
                                            entries: list[OffsetCommitPartition],
                                            retention_time_ms: int
                                            ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit to a consumer group, validated by ``consumer_membership``: the
        offsets go on the member-less classic group of the same id."""
        group = self._membership.get_or_create_group(group_id)
        return await self._store_offsets(group, entries, retention_time_ms)

    async def commit_consumer_group_txn_offsets(self, group_id: str, producer_id: int,
                                                producer_epoch: int,
                                                entries: list[OffsetCommitPartition]
                                                ) -> dict[TopicPartition, ErrorCode]:
        group = self._membership.get_or_create_group(group_id)
        if not entries:
            return {}
        return await self._store_txn_offsets(group, producer_id, producer_epoch, entries)

    # ================================================================== OffsetCommit
    async def commit_offsets(self, group_id: str, member_id: str, generation_id: int,
                             entries: list[OffsetCommitPartition], group_instance_id: str | None,
                             retention_time_ms: int) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit to a group of ours (``GroupCoordinator.commit_offsets``)."""
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                log.info("creating simple consumer group %s via manual offset commit", group_id)
                group = self._membership.get_or_create_group(group_id)
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
                self._membership.schedule_heartbeat(group, member)
        return await self._store_offsets(group, entries, retention_time_ms)

    @staticmethod
    def _validate_offset_commit(group: ClassicGroup, generation_id: int, member_id: str,
                                group_instance_id: str | None,
                                transactional: bool = False) -> ErrorCode | None:
        """Kafka's validateOffsetCommit. A transactional commit without member id and
        generation (TxnOffsetCommit v0-2 carry none) is accepted whatever the group's state."""
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return None  # admin client or a consumer with manual assignment
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
            return None
        if not transactional and group.state != GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit to a non-empty group
        return None

    async def _store_offsets(self, group: ClassicGroup, entries: list[OffsetCommitPartition],
                             retention_time_ms: int) -> dict[TopicPartition, ErrorCode]:
        now = self._rt.now()
        expire = NO_TIMESTAMP if retention_time_ms == DEFAULT_RETENTION_TIME else now + retention_time_ms
        result, valid = self._valid_commits(entries, now, expire)
        if not valid:
            return result

        group.received_consumer_commits = True
        self._warn_mixed_commits(group)
        records = []
        for (topic, partition), c in valid.items():
            c.seq = next(self._rt.seq)
            records.append(offset_commit_record(group.group_id, topic, partition, OffsetCommitValue(
                offset=c.offset, metadata=c.metadata, commit_timestamp=c.commit_timestamp,
                leader_epoch=c.leader_epoch, expire_timestamp=c.expire_timestamp)))
            group.pending_offset_commits[(topic, partition)] = (
                group.pending_offset_commits.get((topic, partition), 0) + 1)

        partition = self._rt.partition_for(group.group_id)
        error = await self._rt.append(partition, records)
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
            await self._rt.append_tombstones({partition: undone})
        code = OFFSET_STORE_ERRORS.get(error, error)
        for tp in valid:
            result[tp] = code
        return {(e.topic, e.partition): result[(e.topic, e.partition)] for e in entries}

    def _valid_commits(self, entries: list[OffsetCommitPartition], now: int,
                       expire: int) -> tuple[dict[TopicPartition, ErrorCode],
                                             dict[TopicPartition, CommittedOffset]]:
        """OFFSET_METADATA_TOO_LARGE for the entries whose metadata is over
        ``offset.metadata.max.bytes``; the others as offsets to store."""
        max_meta = self.config.offset_metadata_max_bytes
        too_large: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, CommittedOffset] = {}
        for e in entries:
            tp = (e.topic, e.partition)
            metadata = e.metadata if e.metadata is not None else ""
            if len(metadata) > max_meta:
                too_large[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            valid[tp] = CommittedOffset(
                e.offset, e.leader_epoch if e.leader_epoch is not None else NO_LEADER_EPOCH,
                metadata, now, expire, 0)
        return too_large, valid

    @staticmethod
    def _warn_mixed_commits(group: ClassicGroup) -> None:
        if group.received_consumer_commits and group.received_txn_commits:
            log.warning("group %s (leader %s) has received offset commits from consumers as well "
                        "as transactional producers; mixing both generally gives surprises and "
                        "should be avoided", group.group_id, group.leader_id)

    # ================================================================== TxnOffsetCommit
    async def commit_transactional_offsets(
            self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
            entries: list[OffsetCommitPartition], member_id: str, generation_id: int,
            group_instance_id: str | None) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit to a group of ours (``GroupCoordinator.commit_transactional_offsets``)."""
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        group = self._groups.get(group_id)
        if group is None:
            log.info("creating group %s for a transactional offset commit of %s", group_id,
                     transactional_id)
            group = self._membership.get_or_create_group(group_id)
        error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id,
                                             transactional=True)
        if error is not None:
            return all_(error)
        if not entries:
            return {}
        return await self._store_txn_offsets(group, producer_id, producer_epoch, entries)

    async def _store_txn_offsets(self, group: ClassicGroup, producer_id: int, producer_epoch: int,
                                 entries: list[OffsetCommitPartition]
                                 ) -> dict[TopicPartition, ErrorCode]:
        result, valid = self._valid_commits(entries, self._rt.now(), NO_TIMESTAMP)
        if not valid:
            return result
        group.received_txn_commits = True
        self._warn_mixed_commits(group)
        # pending before the append (Kafka's prepareTxnOffsetCommit): a stable OffsetFetch
        # sees them from now on
        pending = group.pending_txn_offsets.setdefault(producer_id, {})
        records = []
        for (topic, partition), c in valid.items():
            c.seq = next(self._rt.seq)
            pending[(topic, partition)] = c
            records.append(offset_commit_record(group.group_id, topic, partition, OffsetCommitValue(
                offset=c.offset, metadata=c.metadata, commit_timestamp=c.commit_timestamp,
                leader_epoch=c.leader_epoch, expire_timestamp=c.expire_timestamp)))
        self.txn_groups.setdefault(producer_id, set()).add(group.group_id)

        error = await self._rt.append(self._rt.partition_for(group.group_id), records,
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
        code = OFFSET_STORE_ERRORS.get(error, error)
        for tp in valid:
            result[tp] = code
        return {(e.topic, e.partition): result[(e.topic, e.partition)] for e in entries}

    def _forget_txn_group(self, producer_id: int, group_id: str) -> None:
        groups = self.txn_groups.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self.txn_groups[producer_id]

    def complete_transaction(self, offsets_partition: int, producer_id: int,
                             commit: bool) -> None:
        """The marker of ``producer_id``'s transaction is in ``__consumer_offsets-
        <offsets_partition>`` (Kafka's handleTxnCompletion): the offsets the transaction
        committed to that partition's groups become their committed offsets — each only if
        its record is newer than the current offset's — or, on abort, are dropped. Called on
        the event loop once the marker is appended."""
        group_ids = self.txn_groups.get(producer_id)
        if not group_ids:
            return
        for group_id in [g for g in group_ids if self._rt.partition_for(g) == offsets_partition]:
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
            self.txn_groups.pop(producer_id, None)

    # ================================================================== OffsetFetch
    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool) -> OffsetFetchResult:
        """OffsetFetch of a group of ours (``GroupCoordinator.fetch_offsets``)."""
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

    async def delete_offsets(self, group_id: str, wanted: list[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete in a group of ours (``GroupCoordinator.delete_offsets``)."""
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
            await self.cleanup_groups([group], lambda g: self.remove_offsets(g, eligible),
                                      drop_empty=False)
            for tp in eligible:
                partition_errors[tp] = ErrorCode.NONE
        return ErrorCode.NONE, partition_errors

    @staticmethod
    def remove_offsets(group: ClassicGroup, tps: Iterable[TopicPartition] | None) -> list[TopicPartition]:
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

    async def cleanup_groups(self, groups: Iterable[ClassicGroup],
                              selector: Callable[[ClassicGroup], list[TopicPartition]], *,
                              drop_empty: bool = True) -> int:
        """Kafka's cleanupGroupMetadata: remove offsets chosen by ``selector``; an Empty group
        left without offsets dies (with ``drop_empty``) as a Dead one does; tombstone what
        went."""
        removed_count, by_partition = self._remove_from_groups(groups, selector, drop_empty)
        await self._rt.append_tombstones(by_partition)
        return removed_count

    def _remove_from_groups(self, groups: Iterable[ClassicGroup],
                            selector: Callable[[ClassicGroup], list[TopicPartition]],
                            drop_empty: bool = True
                            ) -> tuple[int, dict[int, list[tuple[bytes, bytes | None]]]]:
        """The in-memory half of ``cleanup_groups``: the number of offsets removed and the
        tombstones to append, by ``__consumer_offsets`` partition."""
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        removed_count = 0
        for group in groups:
            removed = selector(group)
            if drop_empty and group.state == GroupState.EMPTY and not group.has_offsets():
                log.info("group %s transitioned to Dead in generation %d", group.group_id,
                         group.generation_id)
                group.transition(GroupState.DEAD, self._rt.now())
            records = [offset_commit_record(group.group_id, t, p, None) for t, p in removed]
            if group.state == GroupState.DEAD and self._groups.get(group.group_id) is group:
                self.drop_group(group)
                # a generation-0 group only ever stored offsets: it has no metadata record
                if group.generation_id > 0:
                    records.append(group_metadata_record(group.group_id, None))
            removed_count += len(removed)
            if records:
                by_partition.setdefault(self._rt.partition_for(group.group_id), []).extend(records)
        return removed_count, by_partition

    # ================================================================== deleted topics
    def delete_topic_offsets(self, topic: str) -> None:
        def of_topic(group: ClassicGroup) -> list[TopicPartition]:
            return self.remove_offsets(group, [
                tp for tp in itertools.chain(group.offsets, group.pending_offset_commits,
                                             group.pending_txn_partitions())
                if tp[0] == topic])

        removed, by_partition = self._remove_from_groups(list(self._groups.values()), of_topic,
                                                         drop_empty=False)
        if by_partition:
            log.info("removed %d offsets of deleted topic %s", removed, topic)
            self._rt.spawn(self._rt.append_tombstones(by_partition), f"tombstones of topic {topic}")

    def drop_group(self, group: ClassicGroup) -> None:
        self._membership.cancel_group_timers(group)
        self._groups.pop(group.group_id, None)
        for producer_id in group.pending_txn_offsets:
            self._forget_txn_group(producer_id, group.group_id)

    # ================================================================== offsets retention
    async def expire_offsets(self) -> int:
        """One pass of ``offsets.retention.minutes`` expiry (Kafka's cleanupGroupMetadata):
        an Empty group's offsets go once it has been empty for the retention time (or, without
        a state timestamp, once each commit is that old); a simple group's (no protocol type)
        and a Stable consumer group's offsets of topics it no longer subscribes to go when the
        commit is that old; commits carrying an explicit expire timestamp (v2-4 retention
        time) go at that timestamp. Empty groups left without offsets are deleted."""
        now = self._rt.now()
        retention = self.config.offsets_retention_ms

        def expired(group: ClassicGroup) -> list[TopicPartition]:
            if self.is_active_consumer_group(group.group_id):
                return []
            if group.protocol_type and group.state == GroupState.EMPTY:
                def base(c: CommittedOffset) -> int:
                    return (group.state_timestamp if group.state_timestamp is not None
                            else c.commit_timestamp)
                subscribed: set[str] = set()
            elif (group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.subscribed_topics is not None
                  and group.state == GroupState.STABLE):
                def base(c: CommittedOffset) -> int:
                    return c.commit_timestamp
                subscribed = group.subscribed_topics
            elif not group.protocol_type:
                def base(c: CommittedOffset) -> int:
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

        removed = await self.cleanup_groups(list(self._groups.values()), expired)
        if removed:
            log.info("removed %d expired offsets", removed)
        await self.after_expiry()
        return removed

    def schedule_retention(self) -> None:
        if self._retention_timer is not None or not self._rt.active:
            return
        interval = self.config.offsets_retention_check_interval_ms
        if interval <= 0:
            return

        def fire() -> None:
            self._retention_timer = None
            if not self._rt.active:
                return
            self._rt.spawn(self.expire_offsets(), "offsets expiry")
            self.schedule_retention()
        self._retention_timer = self._rt.timers.call_later(interval, fire)


    def cancel_retention(self) -> None:
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
