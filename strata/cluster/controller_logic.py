"""The controller's decisions: pure functions from (image, event) to ``ControllerResult``.

``handle(image, event)`` dispatches to one handler per event type. Handlers follow Kafka's
ZooKeeper-mode controller (``KafkaController``, ``PartitionStateMachine``,
``ReplicaStateMachine``), with AlterPartition validated as KRaft's ``ReplicationControlManager``:

- a new partition's leader is its first live replica, its ISR all live replicas (epochs 0); with
  no live replica it gets no state until one registers;
- a partition whose leader is not alive gets one by offline election (``election.py``) whenever
  a broker registers, a broker fails, unclean election is enabled or a controller takes over;
- a failed broker then leaves every ISR it is in (with ELR off, as Kafka's ZooKeeper mode,
  except the last member of one), and a leader that cannot be replaced becomes -1 (NoLeader);
- every change keeps KIP-966's eligible leader replicas (``eligible_leaders.py``): members that
  left an ISR below min.insync.replicas stay electable when the ISR is empty, the last leader
  is kept while the partition has neither ISR nor leader (balanced recovery);
- a registration the controller has not handled yet (``image.broker_directories`` holds an
  older broker epoch) whose broker lost a log directory (KIP-858: a directory id it last
  registered with is missing) leaves every ISR it is in, the last member's included (the ISR
  is then empty and the partition waits, without unclean election, for a replica with the
  data) and every ELR and last known ELR; one after an unclean shutdown (KIP-966: no
  clean-shutdown marker) leaves every ISR and ELR (with ELR off, but the ISRs it is the only
  member of: it holds all there is). Both happen before any election
  of the event, at registration and at failover alike; a partition it led gets the first live
  remaining ISR member, else -1; the broker rejoins ISRs only through AlterPartition, once
  its leader sees it caught up. The handled registration is then recorded
  (``SetBrokerDirectories``);
- controlled shutdown moves leadership off the broker where another ISR member can take it and
  takes the broker out of the ISRs it follows;
- a broker's report of replicas in failed log dirs (Kafka's ``LogDirEventNotification``,
  ``onReplicasBecomeOffline``) moves leadership of those it led to another live ISR member
  (else -1) and takes them out of the ISRs, but for an ISR's last member; an offline replica is
  never elected nor admitted to an ISR; once reported back it waits for its leader's
  AlterPartition, and a partition without a leader may elect it again. A new registration
  starts with no offline replica (a restart brings its dirs back);
- every partition state change bumps the leader epoch except an accepted AlterPartition, and
  every write bumps the partition epoch (the znode version) by exactly one;
- AlterPartition refuses a new ISR with a member that is not alive and eligible, or (v3,
  KIP-903) whose broker epoch as the leader saw it fetch is not its registration's
  (INELIGIBLE_REPLICA): a fetch state from an earlier incarnation never admits a new one;
- a reassignment (KIP-455, ``onPartitionReassignment``) makes the replicas target + original
  with adding/removing recorded in the topic znode; once every target replica is in the ISR
  (checked after every event, in ``handle``) the replicas become the target, the
  leader moves into it if needed, and removed replicas leave the ISR and are deleted.

Handlers raise ``KafkaError`` for a request refused whole (CreateTopics, CreatePartitions,
DeleteTopics, ControlledShutdown); per-partition answers are in ``ControllerResult.response``.
The controller's event loop thread calls them, one event at a time.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable, Iterable, Mapping

from strata.cluster import election
from strata.cluster.eligible_leaders import with_eligible_leaders
from strata.cluster.controller_events import (
    AlterPartition, AlterPartitionResult, AlterPartitions, AutoLeaderRebalance, BrokerFailed, BrokerRegistered,
    ControlledShutdownRequested, ControllerFailover, ControllerResult, CreatePartitionState,
    CreateTopic, DeleteTopic, ElectionType, ElectLeaders, LeaderAndIsr, LogDirEventNotification,
    PartitionReassignmentRequested, PartitionsAdded, SetBrokerDirectories, SetTopicAssignment,
    StopReplica, TierBootstrappedReplicas, TopicConfigsChanged, TopicCreated, TopicDeleted, UncleanLeaderElectionChanged,
    UpdatePartitionState)
from strata.cluster.image import (
    NO_LEADER, UNCLEAN_LEADER_ELECTION_ENABLE, BrokerDirectories, BrokerRegistration,
    LeaderRecoveryState, MetadataImage, PartitionRegistration, TopicImage, frozen_map)
from strata.cluster.replica_assignment import (
    assign_replicas_to_brokers, brokers_for_placement, new_partitions_assignment,
    validate_new_topic_assignment)
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition


class _Change:
    """Partition state changes of one handler over a base image, with their writes and notices.

    Broker and topic edits replace ``image`` directly (they are few); partition registrations
    collect in a dict and join the image once, in ``result``. The last notice per (kind, broker,
    partition) wins, so a partition changed twice in one event is announced once.
    """

    def __init__(self, image: MetadataImage):
        self.image = image
        self._partitions: dict[TopicPartition, PartitionRegistration] = {}
        self.writes: list = []
        self._notices: dict[tuple, object] = {}

    def registration(self, tp: TopicPartition) -> PartitionRegistration | None:
        return self._partitions.get(tp) or self.image.registration(tp)

    def set_broker(self, broker: BrokerRegistration) -> None:
        self.image = replace(self.image, brokers=frozen_map({**self.image.brokers, broker.id: broker}))

    def set_broker_directories(self, broker_id: int, value: BrokerDirectories) -> None:
        self.image = replace(self.image, broker_directories=frozen_map(
            {**self.image.broker_directories, broker_id: value}))
        self.writes.append(SetBrokerDirectories(broker_id, value))

    def set_offline_replicas(self, broker_id: int, partitions: frozenset[TopicPartition]) -> None:
        self.image = replace(self.image, offline_replicas=_with_report(
            self.image.offline_replicas, broker_id, partitions))

    def set_tier_bootstrapped(self, broker_id: int, partitions: frozenset[TopicPartition]) -> None:
        self.image = replace(self.image, tier_bootstrapped=_with_report(
            self.image.tier_bootstrapped, broker_id, partitions))

    def set_topic(self, name: str, topic: TopicImage | None) -> None:
        topics = dict(self.image.topics)
        if topic is None:
            del topics[name]
        else:
            topics[name] = topic
        self.image = replace(self.image, topics=frozen_map(topics))

    def _topic_id(self, tp: TopicPartition):
        return self.image.topics[tp.topic].topic_id

    def create(self, tp: TopicPartition, reg: PartitionRegistration) -> None:
        reg = replace(reg, controller_epoch=self.image.controller_epoch)
        self._partitions[tp] = reg
        self.writes.append(CreatePartitionState(tp, self._topic_id(tp), reg))
        self.announce(tp, is_new=True)

    def update(self, tp: TopicPartition, reg: PartitionRegistration, notify: bool = True,
               exclude: int | None = None, unclean: frozenset[int] = frozenset(),
               lost: frozenset[int] = frozenset()) -> PartitionRegistration:
        """``reg`` (a change of the partition's leader or ISR) written, its ELR kept by
        KIP-966's rules; ``unclean``/``lost``: brokers back from an unclean shutdown or
        without their log, which leave the ELR (and, lost, the last known ELR)."""
        old = self.registration(tp)
        reg = with_eligible_leaders(old, reg, self.image.effective_min_isr(tp),
                                    self.image.eligible_leader_replicas_enabled, unclean, lost)
        reg = replace(reg, partition_epoch=old.partition_epoch + 1,
                      controller_epoch=self.image.controller_epoch)
        self._partitions[tp] = reg
        self.writes.append(UpdatePartitionState(tp, self._topic_id(tp), reg, old.partition_epoch))
        if notify:
            self.announce(tp, exclude=exclude)
        return reg

    def announce(self, tp: TopicPartition, is_new: bool = False, exclude: int | None = None,
                 to: Iterable[int] | None = None) -> None:
        """LeaderAndIsr with the partition's current state to its alive replicas (or ``to``)."""
        reg = self.registration(tp)
        replicas = self.image.replicas(tp)
        for broker in replicas if to is None else to:
            if broker != exclude and self.image.is_alive(broker):
                self._notice(LeaderAndIsr(broker, tp, self._topic_id(tp), reg.leader, reg.leader_epoch,
                                          reg.isr, replicas, reg.partition_epoch, is_new))

    def stop_replica(self, broker: int, tp: TopicPartition, delete: bool) -> None:
        if delete:  # no longer a replica: nothing of it to follow
            self._notices.pop((LeaderAndIsr, broker, tp), None)
        self._notice(StopReplica(broker, tp, self._topic_id(tp), delete))

    def _notice(self, notice) -> None:
        key = (type(notice), notice.broker_id, notice.partition)
        old = self._notices.pop(key, None)
        if isinstance(old, LeaderAndIsr) and old.is_new:  # created in this event: still new
            notice = replace(notice, is_new=True)
        self._notices[key] = notice

    def result(self, response=None) -> ControllerResult:
        image = self.image
        if self._partitions:
            by_topic: dict[str, dict[int, PartitionRegistration]] = {}
            for tp, reg in self._partitions.items():
                by_topic.setdefault(tp.topic, {})[tp.partition] = reg
            topics = dict(image.topics)
            for name, regs in by_topic.items():
                if name in topics:
                    topic = topics[name]
                    topics[name] = replace(topic, partitions=frozen_map({**topic.partitions, **regs}))
            image = replace(image, topics=frozen_map(topics))
        return ControllerResult(image, tuple(self.writes), tuple(self._notices.values()), response)


def _with_report(reports: Mapping[int, frozenset[TopicPartition]], broker_id: int,
                 partitions: frozenset[TopicPartition]) -> Mapping[int, frozenset[TopicPartition]]:
    """A broker's report of its replicas of some kind set in ``reports`` (dropped when empty)."""
    out = {**reports, broker_id: frozenset(partitions)}
    if not partitions:
        del out[broker_id]
    return frozen_map(out)


# --- the partition state machine's two moves ----------------------------------------------------

def _electable(image: MetadataImage, tp: TopicPartition, replicas: tuple[int, ...],
               guard: bool = True) -> tuple[int, ...]:
    """``replicas`` without those in a failed log dir, in order but (with ``guard``) for those
    rebuilt from the remote tier that do not span the election guard yet (KIP-1303), which go
    last: every election picks the first that may lead, so one of them leads only if nobody
    else can. An operator's explicit preferred election is not guarded."""
    if image.offline_replicas:
        replicas = tuple(r for r in replicas if image.is_replica_online(r, tp))
    if guard and image.tier_bootstrapped:
        guarded = tuple(r for r in replicas if tp in image.tier_bootstrapped.get(r, ()))
        if guarded:
            replicas = tuple(r for r in replicas if r not in guarded) + guarded
    return replicas


def _online_partition_state_change(change: _Change, topic: str | None = None) -> None:
    """Kafka's ``triggerOnlinePartitionStateChange``: give state to new partitions and leaders
    to partitions whose leader is not alive, where the election rules allow."""
    image = change.image
    for tp in image.all_partitions():
        if topic is not None and tp.topic != topic:
            continue
        replicas = _electable(image, tp, image.replicas(tp))
        reg = change.registration(tp)
        if reg is None:
            live = tuple(r for r in replicas if image.is_eligible(r))
            if live:
                change.create(tp, PartitionRegistration(leader=live[0], isr=live))
        elif not image.is_alive(reg.leader):
            elected = election.elect_offline(image, replicas, reg, image.unclean_enabled(tp.topic))
            if elected is not None:
                change.update(tp, elected)


def _isr_without(change: _Change, isr: tuple[int, ...], broker_id: int) -> tuple[int, ...]:
    """``isr`` without the broker; with ELR off (Kafka's ZooKeeper mode) the last member stays."""
    if len(isr) == 1 and not change.image.eligible_leader_replicas_enabled:
        return isr
    return tuple(r for r in isr if r != broker_id)


def _remove_replica_from_isrs(change: _Change, broker_id: int,
                              partitions: Iterable[TopicPartition] | None = None) -> None:
    """``ReplicaStateMachine``'s move to OfflineReplica: the replica leaves the ISR (with ELR
    off, unless it is the last member); if it led, the leader becomes -1; the leader epoch
    goes up."""
    for tp in change.image.all_partitions() if partitions is None else partitions:
        reg = change.registration(tp)
        if reg is None or broker_id not in reg.isr:
            continue
        leader = NO_LEADER if reg.leader == broker_id else reg.leader
        isr = _isr_without(change, reg.isr, broker_id)
        change.update(tp, reg.with_leader_and_isr(leader, isr), exclude=broker_id)


def _leave_isrs_after_restart(change: _Change, broker_id: int, lost: bool) -> None:
    """The broker leaves every ISR and ELR it is in (with ELR off, after an unclean shutdown,
    not the ISRs it alone is in); a partition it led gets the first live remaining ISR member
    in assignment order, else -1 (and an election from the ELR, or of the last leader, may
    follow). A broker that ``lost`` its log also leaves the last known ELRs."""
    image = change.image
    elr = image.eligible_leader_replicas_enabled
    gone = frozenset((broker_id,))
    for tp in image.all_partitions():
        reg = change.registration(tp)
        if reg is None or not (broker_id in reg.isr or broker_id in reg.elr
                               or (lost and broker_id in reg.last_known_elr)):
            continue
        if not elr and not lost and reg.isr == (broker_id,):
            continue
        isr = tuple(r for r in reg.isr if r != broker_id)
        leader = reg.leader
        if leader in (broker_id, NO_LEADER):
            leader = next((r for r in _electable(image, tp, image.replicas(tp))
                           if r in isr and image.is_eligible(r)), NO_LEADER)
        new = reg.with_leader_and_isr(leader, isr) if (leader, isr) != (reg.leader, reg.isr) \
            else reg
        change.update(tp, new, unclean=frozenset() if lost else gone,
                      lost=gone if lost else frozenset())


def _admit_registration(change: _Change, reg: BrokerRegistration) -> None:
    """A registration not handled yet: a broker that lost a log directory or shut down
    uncleanly leaves the ISRs (see the module docstring), then the registration is recorded."""
    known = change.image.broker_directories.get(reg.id)
    if known is not None and known.broker_epoch == reg.epoch:
        return
    lost = known is not None and bool(reg.directory_ids) \
        and not set(known.directory_ids) <= set(reg.directory_ids)
    if lost or not reg.clean_shutdown:
        _leave_isrs_after_restart(change, reg.id, lost=lost)
    change.set_broker_directories(reg.id, BrokerDirectories(reg.directory_ids, reg.epoch))


def _announce_all(change: _Change, broker_ids: Iterable[int]) -> None:
    """Send brokers the whole state of every partition they host (after they (re)join)."""
    wanted = set(broker_ids)
    for tp in change.image.all_partitions():
        if change.registration(tp) is not None:
            change.announce(tp, to=[b for b in change.image.replicas(tp) if b in wanted])


# --- handlers -----------------------------------------------------------------------------------

def _fail_broker(change: _Change, broker_id: int) -> None:
    """``onBrokerFailure`` -> ``onReplicasBecomeOffline``: elect where the leader died, then
    take the broker out of the ISRs it is still in."""
    change.set_broker(replace(change.image.brokers[broker_id], fenced=True, in_controlled_shutdown=False))
    _online_partition_state_change(change)
    _remove_replica_from_isrs(change, broker_id)


def on_broker_registered(image: MetadataImage, event: BrokerRegistered) -> ControllerResult:
    """``onBrokerStartup``; a broker that re-registers with a new epoch first fails (a bounce)."""
    reg = event.registration
    old = image.brokers.get(reg.id)
    if old is not None and old.alive and old.epoch == reg.epoch:
        return ControllerResult(image)
    change = _Change(image)
    if old is not None and old.alive:
        _fail_broker(change, reg.id)
    change.set_broker(replace(reg, fenced=False, in_controlled_shutdown=False))
    if reg.id in change.image.offline_replicas:  # a new incarnation: its dirs are back
        change.set_offline_replicas(reg.id, frozenset())
    if reg.id in change.image.tier_bootstrapped:  # ... and it reports what it rebuilds anew
        change.set_tier_bootstrapped(reg.id, frozenset())
    _admit_registration(change, change.image.brokers[reg.id])
    _online_partition_state_change(change)
    _announce_all(change, [reg.id])
    return change.result()


def _take_replicas_offline(change: _Change, broker_id: int,
                           partitions: Iterable[TopicPartition]) -> None:
    """``onReplicasBecomeOffline`` for the broker's replicas of ``partitions`` (already in the
    image's offline replicas): a partition it led gets the first live ISR member elsewhere by
    offline election (else -1); it leaves the ISRs but as the last member. Idempotent."""
    image = change.image
    for tp in partitions:
        reg = change.registration(tp)
        if reg is None or broker_id not in reg.isr:
            continue
        leader = reg.leader
        if leader == broker_id:
            elected = election.elect_offline(image, _electable(image, tp, image.replicas(tp)),
                                             reg, image.unclean_enabled(tp.topic))
            if elected is not None:
                change.update(tp, elected, exclude=broker_id)
                continue
            leader = NO_LEADER
        isr = _isr_without(change, reg.isr, broker_id)
        if (leader, isr) != (reg.leader, reg.isr):
            change.update(tp, reg.with_leader_and_isr(leader, isr), exclude=broker_id)


def _reported(image: MetadataImage, broker_id: int, broker_epoch: int,
              partitions: frozenset[TopicPartition]) -> frozenset[TopicPartition] | None:
    """The partitions of a broker's report that it hosts; None for a report of an earlier
    registration, or of a broker not alive (it changes nothing)."""
    broker = image.brokers.get(broker_id)
    if broker is None or not broker.alive or broker.epoch != broker_epoch:
        return None
    return frozenset(tp for tp in partitions
                     if (t := image.topics.get(tp.topic)) is not None
                     and 0 <= tp.partition < len(t.assignment)
                     and broker_id in t.assignment[tp.partition])


def on_log_dir_event(image: MetadataImage, event: LogDirEventNotification) -> ControllerResult:
    """A broker's offline replicas now (see the module docstring)."""
    hosted = _reported(image, event.broker_id, event.broker_epoch, event.offline_replicas)
    old = image.offline_replicas.get(event.broker_id, frozenset())
    if hosted is None or hosted == old:
        return ControllerResult(image)
    change = _Change(image)
    change.set_offline_replicas(event.broker_id, hosted)
    _take_replicas_offline(change, event.broker_id, sorted(hosted - old))
    back = sorted(old - hosted)
    if back:
        _online_partition_state_change(change)  # a partition waiting for it may elect it
        for tp in back:
            if tp.topic in change.image.topics and change.registration(tp) is not None:
                change.announce(tp, to=[event.broker_id])
    return change.result()


def on_tier_bootstrapped_replicas(image: MetadataImage,
                                  event: TierBootstrappedReplicas) -> ControllerResult:
    """A broker's guarded replicas now (KIP-1303); elections from then on put them last."""
    hosted = _reported(image, event.broker_id, event.broker_epoch, event.partitions)
    if hosted is None or hosted == image.tier_bootstrapped.get(event.broker_id, frozenset()):
        return ControllerResult(image)
    change = _Change(image)
    change.set_tier_bootstrapped(event.broker_id, hosted)
    return change.result()


def on_broker_failed(image: MetadataImage, event: BrokerFailed) -> ControllerResult:
    if not image.is_alive(event.broker_id):
        return ControllerResult(image)
    change = _Change(image)
    _fail_broker(change, event.broker_id)
    return change.result()


def on_controlled_shutdown(image: MetadataImage, event: ControlledShutdownRequested) -> ControllerResult:
    """``doControlledShutdown``; the response is the set of partitions the broker still leads."""
    broker = image.brokers.get(event.broker_id)
    if broker is None or not broker.alive:
        raise KafkaError(f"Broker id {event.broker_id} does not exist.", ErrorCode.BROKER_NOT_AVAILABLE)
    if event.broker_epoch != -1 and event.broker_epoch < broker.epoch:
        raise KafkaError(f"Received controlled shutdown request from an old broker epoch "
                         f"{event.broker_epoch} for broker {event.broker_id}. Current broker epoch "
                         f"is {broker.epoch}.", ErrorCode.STALE_BROKER_EPOCH)
    change = _Change(image)
    change.set_broker(replace(broker, in_controlled_shutdown=True))
    followed = []
    for tp in change.image.all_partitions():
        replicas = change.image.replicas(tp)
        reg = change.registration(tp)
        if event.broker_id not in replicas or len(replicas) <= 1 or reg is None:
            continue
        if reg.leader == event.broker_id:
            elected = election.elect_controlled_shutdown(
                change.image, _electable(change.image, tp, replicas), reg)
            if elected is not None:
                change.update(tp, elected)
        else:
            followed.append(tp)
            change.stop_replica(event.broker_id, tp, delete=False)
    _remove_replica_from_isrs(change, event.broker_id, followed)
    still_led = frozenset(tp for tp in change.image.all_partitions()
                          if (r := change.registration(tp)) is not None and r.leader == event.broker_id)
    return change.result(still_led)


def on_topic_created(image: MetadataImage, event: TopicCreated) -> ControllerResult:
    """CreateTopics (``ZkAdminManager.createTopics``) then ``onNewPartitionCreation``; the
    response is the assignment."""
    if event.name in image.topics:
        raise KafkaError(f"Topic '{event.name}' already exists.", ErrorCode.TOPIC_ALREADY_EXISTS)
    if any(t.topic_id == event.topic_id for t in image.topics.values()):
        raise KafkaError(f"Topic id {event.topic_id} is already in use.", ErrorCode.INVALID_REQUEST)
    if event.assignment is not None:
        if event.num_partitions is not None or event.replication_factor is not None:
            raise KafkaError("Both numPartitions or replicationFactor and replicasAssignments were "
                             "set. Both cannot be used at the same time.", ErrorCode.INVALID_REQUEST)
        by_partition = dict(enumerate(event.assignment))
        validate_new_topic_assignment(by_partition)
    else:
        if event.num_partitions is None or event.replication_factor is None:
            raise KafkaError("numPartitions and replicationFactor must be resolved before the "
                             "controller sees the topic.", ErrorCode.INVALID_REQUEST)
        by_partition = assign_replicas_to_brokers(
            brokers_for_placement(image.brokers.values()), event.num_partitions,
            event.replication_factor, rng=random.Random(event.seed))
    assignment = tuple(tuple(by_partition[p]) for p in range(len(by_partition)))
    configs = frozen_map(event.configs)
    change = _Change(image)
    change.set_topic(event.name, TopicImage(event.name, event.topic_id, assignment, configs=configs))
    change.writes.append(CreateTopic(event.name, event.topic_id, assignment, configs))
    _online_partition_state_change(change, event.name)
    return change.result(assignment)


def on_partitions_added(image: MetadataImage, event: PartitionsAdded) -> ControllerResult:
    """CreatePartitions; the response is the topic's whole new assignment."""
    topic = image.topics.get(event.topic)
    if topic is None:
        raise KafkaError(f"The topic '{event.topic}' does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    added = new_partitions_assignment(topic.assignment, event.count,
                                      brokers_for_placement(image.brokers.values()), event.assignment)
    assignment = topic.assignment + tuple(tuple(r) for r in added)
    change = _Change(image)
    change.set_topic(event.topic, replace(topic, assignment=assignment))
    change.writes.append(SetTopicAssignment(event.topic, topic.topic_id, assignment,
                                            topic.adding_replicas, topic.removing_replicas))
    _online_partition_state_change(change, event.topic)
    return change.result(assignment)


def on_topic_deleted(image: MetadataImage, event: TopicDeleted) -> ControllerResult:
    """DeleteTopics: the topic goes at once; its alive replicas are told to stop and delete."""
    topic = image.topics.get(event.topic)
    if topic is None:
        raise KafkaError(f"Topic `{event.topic}` to delete does not exist",
                         ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    change = _Change(image)
    for p, replicas in enumerate(topic.assignment):
        for broker in replicas:
            if image.is_alive(broker):
                change.stop_replica(broker, TopicPartition(event.topic, p), delete=True)
    change.writes.append(DeleteTopic(event.topic, topic.topic_id))
    change.set_topic(event.topic, None)
    return change.result()


def _alter_partition_error(image: MetadataImage, event: AlterPartition) -> ErrorCode | None:
    """The reason to refuse the proposal, None to accept it, NONE when it is already in place."""
    broker = image.brokers.get(event.broker_id)
    if broker is None or not broker.alive or broker.epoch != event.broker_epoch:
        return ErrorCode.STALE_BROKER_EPOCH
    topic = image.topics.get(event.topic)
    if topic is not None and event.topic_id is not None and topic.topic_id != event.topic_id:
        return ErrorCode.UNKNOWN_TOPIC_ID
    reg = image.registration(TopicPartition(event.topic, event.partition))
    if reg is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if event.leader_epoch > reg.leader_epoch or event.partition_epoch > reg.partition_epoch:
        return ErrorCode.NOT_CONTROLLER
    if event.leader_epoch < reg.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if event.broker_id != reg.leader:
        return ErrorCode.INVALID_REQUEST
    if event.new_isr == reg.isr and event.leader_recovery_state == reg.leader_recovery_state:
        return ErrorCode.NONE  # idempotent retry, even with a stale partition epoch
    if event.partition_epoch < reg.partition_epoch:
        return ErrorCode.INVALID_UPDATE_VERSION
    replicas = topic.assignment[event.partition]
    if (len(set(event.new_isr)) != len(event.new_isr) or not set(event.new_isr) <= set(replicas)
            or reg.leader not in event.new_isr):
        return ErrorCode.INVALID_REQUEST
    recovering = event.leader_recovery_state == LeaderRecoveryState.RECOVERING
    if recovering and (len(event.new_isr) > 1 or reg.leader_recovery_state == LeaderRecoveryState.RECOVERED):
        return ErrorCode.INVALID_REQUEST
    if any(not image.is_eligible(r) for r in event.new_isr):
        return ErrorCode.INELIGIBLE_REPLICA
    tp = TopicPartition(event.topic, event.partition)
    if any(r not in reg.isr and not image.is_replica_online(r, tp) for r in event.new_isr):
        return ErrorCode.INELIGIBLE_REPLICA  # its log dir failed: not until reported back
    if event.new_isr_broker_epochs is not None and any(
            epoch != -1 and image.brokers[r].epoch != epoch
            for r, epoch in zip(event.new_isr, event.new_isr_broker_epochs)):
        return ErrorCode.INELIGIBLE_REPLICA  # KIP-903: a fetch of another incarnation
    return None


def on_alter_partition(image: MetadataImage, event: AlterPartition) -> ControllerResult:
    """AlterPartition: the response is an ``AlterPartitionResult``; no notices (the leader reads
    the response, the others the image)."""
    tp = TopicPartition(event.topic, event.partition)
    error = _alter_partition_error(image, event)
    if error is not None:
        current = image.registration(tp) if error == ErrorCode.NONE else None
        return ControllerResult(image, response=AlterPartitionResult(error, current))
    change = _Change(image)
    reg = change.update(tp, replace(image.registration(tp), isr=tuple(event.new_isr),
                                    leader_recovery_state=event.leader_recovery_state), notify=False)
    return change.result(AlterPartitionResult(ErrorCode.NONE, reg))


def on_alter_partitions(image: MetadataImage, event: AlterPartitions) -> ControllerResult:
    """A batch of AlterPartition proposals: each decided (``handle``) on the image the ones
    before it left, so every proposal is fenced by the epochs it would be alone; the writes
    and notices of all, in order, and a tuple of their ``AlterPartitionResult``. A proposal
    refused whole (KafkaError) is answered with its code and changes nothing."""
    writes: list = []
    notices: list = []
    results: list[AlterPartitionResult] = []
    for item in event.items:
        try:
            result = handle(image, item)
        except KafkaError as e:
            results.append(AlterPartitionResult(ErrorCode(e.code)))
            continue
        image = result.image
        writes.extend(result.writes)
        notices.extend(result.notices)
        results.append(result.response)
    return ControllerResult(image, tuple(writes), tuple(notices), tuple(results))


_Elector = Callable[[MetadataImage, tuple[int, ...], PartitionRegistration], PartitionRegistration | None]


def _elect(change: _Change, tp: TopicPartition, elect: _Elector, guard: bool = True) -> bool:
    reg = change.registration(tp)
    replicas = change.image.replicas(tp)
    electable = _electable(change.image, tp, replicas, guard)
    if elect is election.elect_preferred and electable[:1] != replicas[:1]:
        return False  # the preferred replica's log dir failed
    elected = None if reg is None else elect(change.image, electable, reg)
    if elected is not None:
        change.update(tp, elected)
    return elected is not None


def on_elect_leaders(image: MetadataImage, event: ElectLeaders) -> ControllerResult:
    """ElectLeaders (``processReplicaLeaderElection``); the response maps each partition to its
    error code (NONE when a leader was elected)."""
    change = _Change(image)
    results: dict[TopicPartition, ErrorCode] = {}
    preferred = event.election_type == ElectionType.PREFERRED
    for tp in event.partitions:
        topic = image.topics.get(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.assignment):
            results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            continue
        reg = change.registration(tp)
        leader = NO_LEADER if reg is None else reg.leader
        if (leader == topic.assignment[tp.partition][0]) if preferred else image.is_eligible(leader):
            results[tp] = ErrorCode.ELECTION_NOT_NEEDED
        elif preferred:
            ok = _elect(change, tp, election.elect_preferred, guard=False)   # asked for
            results[tp] = ErrorCode.NONE if ok else ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
        else:
            ok = _elect(change, tp, lambda i, a, r: election.elect_offline(i, a, r, unclean=True))
            results[tp] = ErrorCode.NONE if ok else ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    return change.result(results)


def on_auto_leader_rebalance(image: MetadataImage, event: AutoLeaderRebalance) -> ControllerResult:
    """``checkAndTriggerAutoLeaderRebalance``: per preferred broker, when more than
    ``leader.imbalance.per.broker.percentage`` of its partitions are led elsewhere, move back
    those whose preferred replica can lead."""
    by_preferred: dict[int, list[TopicPartition]] = {}
    for tp in image.all_partitions():
        by_preferred.setdefault(image.replicas(tp)[0], []).append(tp)
    change = _Change(image)
    for broker, partitions in sorted(by_preferred.items()):
        elsewhere = [tp for tp in partitions
                     if (r := image.registration(tp)) is not None and r.leader != broker]
        if len(elsewhere) / len(partitions) > image.leader_imbalance_per_broker_percentage / 100:
            for tp in elsewhere:
                _elect(change, tp, election.elect_preferred)
    return change.result()


def on_unclean_leader_election_changed(image: MetadataImage,
                                       event: UncleanLeaderElectionChanged) -> ControllerResult:
    """A broker default the admin path already stored; turning it on elects offline partitions."""
    change = _Change(replace(image, unclean_leader_election_enable=bool(event.enabled)))
    _online_partition_state_change(change)
    return change.result()


def on_topic_configs_changed(image: MetadataImage, event: TopicConfigsChanged) -> ControllerResult:
    """Overrides the admin path already stored; the topic's offline partitions are elected
    again (unclean election may have been turned on). A new min.insync.replicas applies from
    each partition's next change, as in Kafka."""
    topic = image.topics.get(event.topic)
    if topic is None or topic.configs == event.configs:
        return ControllerResult(image)
    change = _Change(image)
    change.set_topic(event.topic, replace(topic, configs=frozen_map(event.configs)))
    _online_partition_state_change(change, event.topic)
    return change.result()


def _bounced_leaders(image: MetadataImage) -> list[int]:
    """Alive brokers leading a partition whose state znode is older than their registration
    (their broker epoch is the registration's czxid, the state's ``zxid`` its mzxid)."""
    return sorted({reg.leader for tp in image.all_partitions()
                   if (reg := image.registration(tp)) is not None and reg.zxid
                   and image.is_alive(reg.leader) and image.brokers[reg.leader].epoch > reg.zxid})


def on_controller_failover(image: MetadataImage, event: ControllerFailover) -> ControllerResult:
    """``onControllerFailover`` over an image just read from the store: registrations not
    handled yet are (first, so that a broker that lost its log never inherits an ISR from a
    dead member), replicas on brokers that are not alive leave the ISRs, offline and new
    partitions get leaders, and every alive broker is sent the state of everything it hosts."""
    if event.controller_epoch <= image.controller_epoch:
        raise KafkaError(f"Controller epoch {event.controller_epoch} is not newer than "
                         f"{image.controller_epoch}.", ErrorCode.STALE_CONTROLLER_EPOCH)
    change = _Change(replace(image, controller_epoch=event.controller_epoch))
    for broker in sorted(image.alive_broker_ids()):
        _admit_registration(change, image.brokers[broker])
    dead_in_isrs = sorted({r for tp in image.all_partitions() if (reg := image.registration(tp))
                           for r in reg.isr if not image.is_alive(r)})
    for broker in dead_in_isrs:
        _remove_replica_from_isrs(change, broker)
    # a leader registered after its partition's state was written restarted while no
    # controller watched: handled as the bounce the previous controller would have seen
    for broker in _bounced_leaders(image):
        _fail_broker(change, broker)
        change.set_broker(replace(image.brokers[broker], fenced=False, in_controlled_shutdown=False))
    # reports the previous controller may not have acted on (idempotent for those it did)
    for broker, offline in sorted(change.image.offline_replicas.items()):
        if change.image.is_alive(broker):
            _take_replicas_offline(change, broker, sorted(offline))
    _online_partition_state_change(change)
    _announce_all(change, change.image.alive_broker_ids())
    return change.result()


# --- partition reassignment (KIP-455) ------------------------------------------------------------

def _set_replicas(change: _Change, tp: TopicPartition, replicas: tuple[int, ...],
                  adding: tuple[int, ...] = (), removing: tuple[int, ...] = (),
                  write_now: bool = True) -> SetTopicAssignment:
    """Partition ``tp``'s replicas and reassignment fields, in the image and (unless not
    ``write_now``: the caller appends it) in the topic znode's write."""
    topic = change.image.topics[tp.topic]
    assignment = tuple(replicas if p == tp.partition else r for p, r in enumerate(topic.assignment))
    adds = {p: r for p, r in topic.adding_replicas.items() if p != tp.partition}
    removes = {p: r for p, r in topic.removing_replicas.items() if p != tp.partition}
    if adding:
        adds[tp.partition] = tuple(adding)
    if removing:
        removes[tp.partition] = tuple(removing)
    topic = replace(topic, assignment=assignment, adding_replicas=frozen_map(adds),
                    removing_replicas=frozen_map(removes))
    change.set_topic(tp.topic, topic)
    write = SetTopicAssignment(tp.topic, topic.topic_id, assignment, topic.adding_replicas,
                               topic.removing_replicas)
    if not write_now:
        return write
    if change.writes and isinstance(change.writes[-1], SetTopicAssignment) \
            and change.writes[-1].topic == tp.topic:
        change.writes[-1] = write  # one znode write for consecutive changes of one topic
    else:
        change.writes.append(write)
    return write


def _drop_replicas(change: _Change, tp: TopicPartition, dropped: Iterable[int]) -> None:
    """Replicas no longer in ``tp``'s (already updated) replica list: they leave the ISR
    (``OfflineReplica``) and are told to stop and delete (``NonExistentReplica``). The leader
    stays if it is still in the ISR, else the first live ISR member in replica order leads; an
    ISR left empty (a cancel whose added replicas alone were in sync) elects the first live
    replica unclean, as KRaft's reassignment revert does."""
    dropped = [b for b in dropped if b not in change.image.replicas(tp)]
    reg = change.registration(tp)
    if reg is not None and set(dropped) & set(reg.isr):
        image = change.image
        replicas = image.replicas(tp)
        isr = tuple(r for r in reg.isr if r not in dropped)
        if isr:
            leader = reg.leader if reg.leader in isr else next(
                (r for r in _electable(image, tp, replicas) if r in isr and image.is_eligible(r)),
                NO_LEADER)
            change.update(tp, reg.with_leader_and_isr(leader, isr))
        else:
            live = [r for r in replicas if image.is_eligible(r)]
            if live:
                change.update(tp, reg.with_leader_and_isr(live[0], (live[0],),
                                                          LeaderRecoveryState.RECOVERING))
            else:
                change.update(tp, reg.with_leader_and_isr(NO_LEADER, (replicas[0],)))
    for broker in dropped:
        if change.image.is_alive(broker):
            change.stop_replica(broker, tp, delete=True)


def _maybe_complete_reassignment(change: _Change, tp: TopicPartition) -> bool:
    """Phase B of ``onPartitionReassignment``: once every target replica is in the ISR, the
    replicas become the target, the leader moves into it when it is outside (or not alive),
    otherwise its epoch is bumped, and the removed replicas go; the topic znode is written
    last, after the partition state (Kafka's B3-B6 order). True when it completed."""
    topic = change.image.topics.get(tp.topic)
    reg = change.registration(tp)
    if topic is None or reg is None or not topic.is_reassigning(tp.partition):
        return False
    target = topic.target_replicas(tp.partition)
    if not set(target) <= set(reg.isr):
        return False
    removing = topic.removing_replicas.get(tp.partition, ())
    assignment = _set_replicas(change, tp, target, write_now=False)
    if reg.leader not in target or not change.image.is_alive(reg.leader):
        elected = election.elect_reassign(change.image, _electable(change.image, tp, target), reg)
        if elected is not None:
            change.update(tp, elected)
    elif not set(removing) & set(reg.isr):  # else the ISR shrink below bumps the epoch
        change.update(tp, reg.with_leader_and_isr(reg.leader, reg.isr))
    _drop_replicas(change, tp, removing)
    change.writes.append(assignment)
    return True


def _complete_reassignments(change: _Change, partitions: Iterable[TopicPartition]) -> None:
    for tp in partitions:
        _maybe_complete_reassignment(change, tp)


def _reassignment_error(image: MetadataImage, tp: TopicPartition,
                        target: tuple[int, ...] | None) -> tuple[ErrorCode, str | None] | None:
    """Kafka's per-partition refusals (``validateReplicas`` and ``maybeBuildReassignment``)."""
    topic = image.topics.get(tp.topic)
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {tp.topic}."
    if not 0 <= tp.partition < len(topic.assignment):
        return (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"Unable to find partition {tp.topic}:{tp.partition}.")
    if target is None:
        if not topic.is_reassigning(tp.partition):
            return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None
        return None
    if not target:
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "Empty replica list specified in partition reassignment.")
    shown = "[" + ", ".join(str(b) for b in target) + "]"
    if len(set(target)) != len(target):
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Duplicate replica ids in partition reassignment replica list: {shown}")
    if any(b < 0 for b in target):
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"Invalid broker id in replica list: {shown}"
    original = topic.original_replicas(tp.partition)
    adding = [b for b in target if b not in original]
    live = sorted(b for b in image.brokers if image.is_eligible(b))
    if not set(adding) <= set(live):
        return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Replica assignment has brokers that are not alive. Replica list: "
                f"{adding}, live broker list: {live}")
    return None


def on_partition_reassignment(image: MetadataImage,
                              event: PartitionReassignmentRequested) -> ControllerResult:
    """AlterPartitionReassignments (``onApiPartitionReassignment``): a new target replaces any
    reassignment in progress (always measured from the original replicas); None cancels back
    to the original replicas. Phase A records replicas = target + original with adding and
    removing, stops replicas no longer wanted, bumps the leader epoch and tells every replica
    (new ones start following); a target already in the ISR completes at once."""
    change = _Change(image)
    results: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
    for tp, target in event.partitions.items():
        target = None if target is None else tuple(target)
        error = _reassignment_error(change.image, tp, target)
        if error is not None:
            results[tp] = error
            continue
        results[tp] = (ErrorCode.NONE, None)
        topic = change.image.topics[tp.topic]
        current = topic.assignment[tp.partition]
        original = topic.original_replicas(tp.partition)
        if target is None:
            target = original
        replicas = tuple(dict.fromkeys(target + original))
        adding = tuple(r for r in target if r not in original)
        removing = tuple(r for r in original if r not in target)
        if (replicas, adding, removing) == (current, topic.adding_replicas.get(tp.partition, ()),
                                            topic.removing_replicas.get(tp.partition, ())):
            continue  # already this reassignment
        _set_replicas(change, tp, replicas, adding, removing)
        unneeded = [r for r in current if r not in replicas]
        _drop_replicas(change, tp, unneeded)
        if _maybe_complete_reassignment(change, tp):
            continue
        reg = change.registration(tp)
        if reg is not None:
            change.update(tp, reg.with_leader_and_isr(reg.leader, reg.isr))
            for broker in adding:
                change.announce(tp, is_new=True, to=[broker])
    # a partition without state or leader may get one from its new replicas
    for name in sorted({tp.topic for tp, (code, _) in results.items() if code == ErrorCode.NONE}):
        _online_partition_state_change(change, name)
    return change.result(results)


_HANDLERS: dict[type, Callable[[MetadataImage, object], ControllerResult]] = {
    BrokerRegistered: on_broker_registered,
    BrokerFailed: on_broker_failed,
    ControlledShutdownRequested: on_controlled_shutdown,
    TopicCreated: on_topic_created,
    PartitionsAdded: on_partitions_added,
    TopicDeleted: on_topic_deleted,
    AlterPartition: on_alter_partition,
    AlterPartitions: on_alter_partitions,
    ElectLeaders: on_elect_leaders,
    AutoLeaderRebalance: on_auto_leader_rebalance,
    UncleanLeaderElectionChanged: on_unclean_leader_election_changed,
    TopicConfigsChanged: on_topic_configs_changed,
    TierBootstrappedReplicas: on_tier_bootstrapped_replicas,
    ControllerFailover: on_controller_failover,
    PartitionReassignmentRequested: on_partition_reassignment,
    LogDirEventNotification: on_log_dir_event,
}


def _in_sync_reassignments(image: MetadataImage) -> list[TopicPartition]:
    return [TopicPartition(name, p) for name, t in sorted(image.topics.items())
            for p in sorted(set(t.adding_replicas) | set(t.removing_replicas))
            if (reg := t.partitions.get(p)) is not None
            and set(t.target_replicas(p)) <= set(reg.isr)]


def handle(image: MetadataImage, event: object) -> ControllerResult:
    """Apply one event; raises ``KafkaError`` when a request is refused whole. Whatever the
    event, a reassignment whose target replicas it brought into the ISR (an accepted
    AlterPartition, an election) then completes, with its writes and notices after the event's."""
    result = _HANDLERS[type(event)](image, event)
    done = _in_sync_reassignments(result.image)
    if not done:
        return result
    change = _Change(result.image)
    change.writes = list(result.writes)
    for notice in result.notices:
        change._notice(notice)
    _complete_reassignments(change, done)
    return change.result(result.response)
