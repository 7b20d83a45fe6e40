"""Metadata changes applied to the broker's parts (Kafka's ``BrokerMetadataPublisher``).

``TopicLogsPublisher`` hears topic changes (create, delete, add partitions, configs) and keeps
the logs and the remote tier in step; ``GrantedStatesPublisher`` applies one broker's granted
partition states to its replica manager; ``LeadershipPublisher`` hears a cluster broker's partition
states and applies them to the replica manager, deletes replicas moved off this broker and
loads or unloads the group and transaction coordinators' partitions. On one broker
``TransactionStateLoader`` loads every ``__transaction_state`` partition once the topic is made;
``ReplicationThrottlesPublisher`` applies changed replication throttles. All are listeners of the
cluster metadata; every collaborator comes in the constructor, optional ones as null objects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from strata.common.config import LONG_MAX
from strata.common.types import TopicIdPartition, TopicPartition
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC
from strata.replication.quota import FOLLOWER_THROTTLED_RATE, LEADER_THROTTLED_RATE

if TYPE_CHECKING:
    from strata.log.log_manager import LogManager


class RemoteTier(Protocol):
    """What the publishers ask of the remote log manager."""

    def on_partitions_deleted(self, partitions: list[TopicIdPartition]) -> None: ...
    def wake(self) -> None: ...
    def reconfigure(self, rlm_config: Any) -> None: ...


class NoRemoteTier:
    """Tiered storage off: deletions, wake-ups and quota changes have nothing to reach."""

    def on_partitions_deleted(self, partitions: list[TopicIdPartition]) -> None:
        pass

    def wake(self) -> None:
        pass

    def reconfigure(self, rlm_config: Any) -> None:
        pass


class NoTransactionCoordinator:
    """No transaction coordinator: ``__transaction_state`` leadership loads nothing."""

    def load(self, partitions: dict[int, int]) -> None:
        pass

    def unload(self, partitions: list[int]) -> None:
        pass


NO_REMOTE_TIER = NoRemoteTier()
NO_TRANSACTION_COORDINATOR = NoTransactionCoordinator()


class TopicLogsPublisher:
    """Keeps the logs in step with topic changes. On one broker a log is made with its
    partition (``create_logs``); in a cluster when its partition's state names this broker
    (``LeadershipPublisher``)."""

    def __init__(self, manager: LogManager, metadata, remote_tier: RemoteTier = NO_REMOTE_TIER,
                 *, create_logs: bool = True):
        self.manager = manager
        self.metadata = metadata
        self.remote_tier = remote_tier
        self.create_logs = create_logs

    def on_topic_created(self, info) -> None:
        self.on_partitions_created(info, 0)

    def on_partitions_created(self, info, old_count) -> None:
        if not self.create_logs:
            return
        for p in range(old_count, info.partitions):
            self.manager.get_or_create_log(TopicPartition(info.name, p),
                                           self.metadata.log_config(info.name))

    def on_topic_deleted(self, info) -> None:
        tiered = self.partitions_with_remote_data(info)
        for p in range(info.partitions):
            self.manager.delete_log(TopicPartition(info.name, p))
        if tiered:
            self.remote_tier.on_partitions_deleted(tiered)

    def partitions_with_remote_data(self, info) -> list[TopicIdPartition]:
        """The partitions of deleted topic ``info`` whose remote data this broker removes: in a
        cluster every broker hears of the deletion, and the leader of each partition's metadata
        partition removes its remote data whether or not it hosts a replica, so every partition
        of a topic with ``remote.storage.enable``; on one broker those whose log tiers or has
        tiered."""
        topic_tiered = not self.create_logs and self.metadata.topic_config(info).get(
            "remote.storage.enable")
        tiered = []
        for p in range(info.partitions):
            tp = TopicPartition(info.name, p)
            ulog = self.manager.get_log(tp)
            if topic_tiered or (ulog is not None and (ulog.remote_log_enabled
                                                      or ulog.highest_offset_in_remote_storage >= 0)):
                tiered.append(TopicIdPartition(info.topic_id, tp))
        return tiered

    def on_topic_config_changed(self, info, config) -> None:
        for p in range(info.partitions):
            ulog = self.manager.get_log(TopicPartition(info.name, p))
            if ulog is not None:
                ulog.update_config(config)
        self.remote_tier.wake()

    def on_broker_configs_changed(self, rlm_config) -> None:
        """Dynamic broker configs changed: the remote copy/fetch quotas and the cordoned log
        dirs apply at once."""
        self.remote_tier.reconfigure(rlm_config)
        self.manager.update_cordoned_log_dirs(self.metadata.cordoned_log_dirs())


class GrantedStatesPublisher:
    """One broker, a cluster of one: the partition states its metadata grants (every partition
    led here, the ISR itself) applied to the replica manager as they come, a topic's after its
    logs are made. The coordinators load their topics' partitions on their own on one broker."""

    def __init__(self, replica_manager):
        self.replica_manager = replica_manager

    def on_partition_states(self, states) -> None:
        self.replica_manager.apply_states(states)


class LeadershipPublisher:
    """A cluster broker's partition states (from ZooKeeper), applied: the replica manager leads
    or follows, a replica moved off this broker is deleted, the remote tier wakes (a new leader
    resumes copying, an old one stops), and the group coordinator loads the
    ``__consumer_offsets`` partitions this broker starts leading and unloads those it stops
    leading, as the transaction coordinator does for ``__transaction_state`` (both on the event
    loop, ``loop.call_soon_threadsafe``: states arrive on the metadata's thread)."""

    def __init__(self, replica_manager, manager: LogManager, metadata, loop, group_coordinator,
                 remote_tier: RemoteTier = NO_REMOTE_TIER,
                 txn_coordinator=NO_TRANSACTION_COORDINATOR):
        self.replica_manager = replica_manager
        self.manager = manager
        self.metadata = metadata
        self.loop = loop
        self.group_coordinator = group_coordinator
        self.remote_tier = remote_tier
        self.txn_coordinator = txn_coordinator

    def on_partition_states(self, states) -> None:
        change = self.replica_manager.apply_states(states)
        if change.became_leader or change.stopped_leading:
            self.remote_tier.wake()
        for tp, st in states.items():
            if st is None and self.metadata.topic(tp.topic) is not None:
                self.manager.delete_log(tp)  # reassigned away (a deleted topic's go with it)
        lost = [tp.partition for tp in change.stopped_leading if tp.topic == OFFSETS_TOPIC]
        gained = [tp.partition for tp in change.became_leader if tp.topic == OFFSETS_TOPIC]
        if lost:
            self.loop.call_soon_threadsafe(self.group_coordinator.unload, lost)
        if gained:
            self.loop.call_soon_threadsafe(self.group_coordinator.load_in_background, gained)
        lost = [tp.partition for tp in change.stopped_leading
                if tp.topic == TRANSACTION_STATE_TOPIC]
        gained = {tp.partition: self.replica_manager.state(tp).leader_epoch
                  for tp in change.became_leader if tp.topic == TRANSACTION_STATE_TOPIC}
        if lost:
            self.loop.call_soon_threadsafe(self.txn_coordinator.unload, lost)
        if gained:  # the leader epoch is the coordinator epoch written into markers
            self.loop.call_soon_threadsafe(self.txn_coordinator.load, gained)


class TransactionStateLoader:
    """One broker: the transaction coordinator serves every ``__transaction_state`` partition
    (coordinator epoch 0) once the topic exists, made at the first FindCoordinator for a
    transactional id; loaded on the event loop (topics are made on a request's thread)."""

    def __init__(self, loop, coordinator):
        self.loop = loop
        self.coordinator = coordinator

    def on_topic_created(self, info) -> None:
        if info.name == TRANSACTION_STATE_TOPIC:
            self.loop.call_soon_threadsafe(self.coordinator.load,
                                           {p: 0 for p in range(info.partitions)})


class ReplicationThrottlesPublisher:
    """Dynamic ``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate``
    changes reach the replication quotas at once; an unset rate is unbounded (Kafka's
    Long.MAX_VALUE)."""

    def __init__(self, metadata, leader_quota, follower_quota):
        self.metadata = metadata
        self.leader = leader_quota
        self.follower = follower_quota

    def on_broker_configs_changed(self, _rlm_config) -> None:
        props = self.metadata.effective_broker_props()
        self.leader.update_quota(int(props.get(LEADER_THROTTLED_RATE) or LONG_MAX))
        self.follower.update_quota(int(props.get(FOLLOWER_THROTTLED_RATE) or LONG_MAX))
