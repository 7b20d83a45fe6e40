"""Reading ``__consumer_offsets`` back into memory (Kafka's ``CoordinatorLoader`` and the replay
of ``GroupMetadataManager`` / ``OffsetMetadataManager``), in two halves: ``scan`` replays a
partition's log (any thread: ``GroupCoordinator.load_in_background`` runs it in a worker) into
the offsets and group metadata the log last states; ``apply`` (on the event loop) makes them
this coordinator's groups.

Loaded groups are Stable (members from their last metadata record, whose sessions start now) or
Empty. An offset of a transaction is held per producer id until the producer's marker (commit:
it replaces the offset unless that one is newer in the log; abort: dropped); the offsets of
transactions still open at the high watermark stay pending. If the broker stopped before a
deleted topic's tombstones were durable, ``apply`` drops (and tombstones) every offset of a
topic that does not exist (the ``topic_exists`` port), so a later topic of that name starts
without offsets.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, NamedTuple

from strata.coordinator.group.classic_group import ClassicGroup, CommittedOffset
from strata.coordinator.group.consumer_membership import ConsumerGroupManager, LoadedConsumerGroup
from strata.coordinator.group.membership import GroupMetadataManager
from strata.coordinator.group.offsets import OffsetMetadataManager
from strata.coordinator.group.runtime import CoordinatorRuntime
from strata.coordinator.offsets_records import (
    ConsumerGroupKey,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_record,
    offset_commit_record,
)

log = logging.getLogger(__name__)

OffsetKey = tuple[str, str, int]   # (group, topic, partition)


class PlainRecord(NamedTuple):
    """A committed record replayed by an ``OffsetsLog`` without ``replay_batches``."""

    key: bytes
    value: bytes | None
    producer_id: int = -1
    transactional: bool = False
    is_marker = False


class LoadedPartition(NamedTuple):
    """What ``scan`` found in a partition: offsets and pending transactional offsets (per
    producer id), each with its append order, and the groups' last metadata."""

    offsets: dict[OffsetKey, tuple[OffsetCommitValue, int]]
    pending: dict[int, dict[OffsetKey, tuple[OffsetCommitValue, int]]]
    groups: dict[str, GroupMetadataValue]
    consumer_groups: dict[str, LoadedConsumerGroup] = {}


class CoordinatorLoader:
    """Replays ``__consumer_offsets`` partitions into the managers; see the module docstring."""

    def __init__(self, runtime: CoordinatorRuntime, membership: GroupMetadataManager,
                 offsets: OffsetMetadataManager, topic_exists: Callable[[str], bool] | None,
                 consumer: ConsumerGroupManager | None = None):
        self._rt = runtime
        self.config = runtime.config
        self._membership = membership
        self._offsets = offsets
        self._groups = membership.groups
        # None: no topic list to check offsets against when loading (every topic exists)
        self._topic_exists = topic_exists
        self._consumer = consumer

    def replayed(self, partition: int) -> Iterable[Any]:
        """The partition's records and transaction markers in log order (``replay_batches``),
        or its committed records as plain ones for a log without transaction structure."""
        replay_batches = getattr(self._rt.log, "replay_batches", None)
        if replay_batches is not None:
            yield from replay_batches(partition)
            return
        for key, value in self._rt.log.replay(partition):
            yield PlainRecord(key, value)

    def scan(self, partition: int) -> LoadedPartition:
        """Kafka's doLoadGroupsAndOffsets, the replay (any thread): offsets and group
        metadata as the log last says; an offset of a transaction is held per producer id
        until the producer's marker (commit: it replaces the offset unless that one is newer
        in the log; abort: dropped); the offsets of transactions still open at the end stay
        pending."""
        offsets: dict[OffsetKey, tuple[OffsetCommitValue, int]] = {}
        pending: dict[int, dict[OffsetKey, tuple[OffsetCommitValue, int]]] = {}
        groups: dict[str, GroupMetadataValue] = {}
        consumer_groups: dict[str, LoadedConsumerGroup] = {}
        removed: set[str] = set()
        for item in self.replayed(partition):
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
                    target[k] = (value, next(self._rt.seq))
            elif isinstance(key, GroupMetadataKey):
                if value is None:
                    groups.pop(key.group, None)
                    removed.add(key.group)
                else:
                    groups[key.group] = value
                    removed.discard(key.group)
            elif isinstance(key, ConsumerGroupKey):
                state = consumer_groups.get(key.group)
                if state is None:
                    state = consumer_groups[key.group] = LoadedConsumerGroup()
                state.apply(key, value)
                if value is None and key.kind == 3 and not state.members:
                    del consumer_groups[key.group]   # the group's tombstone: deleted
            else:
                log.debug("ignoring record with key version %d in __consumer_offsets-%d",
                          key.version, partition)
        return LoadedPartition(offsets, pending, groups, consumer_groups)

    def apply(self, partition: int, loaded: LoadedPartition) -> None:
        """The replayed groups and offsets become this coordinator's (on the loop)."""
        offsets, pending, groups, consumer_groups = loaded
        if self._consumer is not None and consumer_groups:
            self._consumer.apply_loaded(consumer_groups)
        if self._topic_exists is not None:
            orphans = [k for k in offsets if not self._topic_exists(k[1])]
            if orphans:
                # their topic was deleted before the tombstones were durable
                log.info("dropping %d offsets of deleted topics %s from __consumer_offsets-%d",
                         len(orphans), sorted({t for _, t, _ in orphans}), partition)
                for k in orphans:
                    del offsets[k]
                if self._rt.loop is not None:
                    self._rt.spawn(self._rt.append_tombstones(
                        {partition: [offset_commit_record(g, t, p, None) for g, t, p in orphans]}),
                        f"tombstones of deleted topics in __consumer_offsets-{partition}")
            for held in pending.values():
                # an open transaction's offsets of a deleted topic: never committed (a load
                # after the marker finds and tombstones them if the transaction commits)
                for k in [k for k in held if not self._topic_exists(k[1])]:
                    del held[k]

        now = self._rt.now()
        loaded: dict[str, ClassicGroup] = {}
        for group_id, value in groups.items():
            loaded[group_id] = ClassicGroup.from_record(group_id, value, now)
        for (group_id, topic, p), (v, seq) in offsets.items():
            group = loaded.get(group_id)
            if group is None:
                group = loaded[group_id] = ClassicGroup(group_id, now)  # offsets only: Empty
            group.offsets[(topic, p)] = CommittedOffset(
                v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp, seq)
        for producer_id, held in pending.items():
            for (group_id, topic, p), (v, seq) in held.items():
                group = loaded.get(group_id)
                if group is None:
                    group = loaded[group_id] = ClassicGroup(group_id, now)  # pending offsets only
                group.pending_txn_offsets.setdefault(producer_id, {})[(topic, p)] = (
                    CommittedOffset(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp,
                                     v.expire_timestamp, seq))

        for group_id, group in loaded.items():
            if group_id in self._groups:
                log.debug("group %s already cached; not replacing it from the log", group_id)
                continue
            self._groups[group_id] = group
            for producer_id in group.pending_txn_offsets:
                self._offsets.txn_groups.setdefault(producer_id, set()).add(group_id)
            log.debug("loaded group %s (%s, generation %d, %d members, %d offsets, %d open "
                      "transactions)", group_id, group.state.value, group.generation_id,
                      len(group.members), len(group.offsets), len(group.pending_txn_offsets))
            if len(group.members) > self.config.group_max_size:
                self._membership.prepare_rebalance(group, "loaded group is over capacity")
            for member in list(group.members.values()):
                self._membership.schedule_heartbeat(group, member)
