"""The controller's decisions against a small model, driven by a hypothesis state machine.

Random sequences of broker registrations, failures, bounces and controlled shutdowns, restarts
after an unclean shutdown or with a new log directory (seen by the controller, or only by the
next one at failover), topic creations (placed or manual), partition additions and deletions,
ISR proposals (current and stale, with broker epochs current, unchecked or of an earlier
incarnation), preferred/unclean/automatic elections, unclean election switched on and off and
controller failovers (the new controller reloads the image from the writes alone) run through
``controller_logic.handle``. After every step:

- the writes, replayed on a versioned dict (each update must name the version it replaces),
  give exactly the image's topics and partition states;
- never two leaders of one partition (by topic id) in one leader epoch, across images and
  notices; leader and partition epochs only grow; a leader change bumps the leader epoch;
- a leader is an alive replica in the ISR; a leader from outside the previous ISR only comes
  from the previous ELR (KIP-966; the ISR is then exactly the leader), from balanced recovery
  (no ISR or ELR left: the last known leader) or from an unclean election (then the ISR is
  exactly the leader, RECOVERING);
- with ELR on (drawn per run, with topics of min.insync.replicas 1 to 3): the ISR and ELR are
  disjoint, the ELR is empty while the ISR holds min.insync.replicas members, and a replica
  without the data is in no ELR; with ELR off both stay empty;
- a partition is leaderless (or has no state yet) only while no replica may lead it: with
  unclean election off, until an ISR member (or an ELR member, or the last known leader) is
  back;
- the ISR is a subset of the replicas, empty only without a leader, of at most one member
  while the leader is RECOVERING;
- a replica that registered with a new directory id, or after an unclean shutdown while another
  ISR member held the data, is in no ISR and leads nothing until an accepted ISR proposal takes
  it back (it caught up) or an unclean election picks it (KIP-858, KIP-966); and the replicas
  that may lead (ISR, ELR, else the last known leader) that held one with the data keep one
  (but through an unclean election);
- an ISR proposal naming a member at a broker epoch other than its registration's is refused
  with INELIGIBLE_REPLICA (KIP-903);
- after a broker failure, each partition's leader is what the model predicts (first live ISR
  member in assignment order, else the first live ELR member, else the first live replica when
  unclean election is on, else -1);
- a refused or stale ISR proposal changes nothing; a valid one is accepted;
- every notice carries the partition's new state, and every alive replica of a partition whose
  leader epoch moved is told.

``STRATA_CONTROLLER_EXAMPLES`` raises the example count for a deeper run.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from strata.cluster.controller_events import (
    AlterPartition, AutoLeaderRebalance, BrokerFailed, BrokerRegistered,
    ControlledShutdownRequested, ControllerFailover, CreatePartitionState, CreateTopic,
    DeleteTopic, ElectionType, ElectLeaders, LeaderAndIsr, PartitionsAdded, SetBrokerDirectories,
    SetTopicAssignment, TopicCreated, TopicDeleted, UncleanLeaderElectionChanged,
    UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import (
    NO_LEADER, BrokerRegistration, LeaderRecoveryState, MetadataImage, TopicImage, frozen_map)
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition

BROKERS = (1, 2, 3)
RACKS = {1: "r1", 2: "r1", 3: "r2"}
NAMES = ("a", "b")

brokers = st.sampled_from(BROKERS)
names = st.sampled_from(NAMES)


def holders(reg) -> set[int]:
    """The replicas that may lead without an unclean election and hold the data: the ISR and
    ELR, else the last known leader (balanced recovery)."""
    return set(reg.isr) | set(reg.elr) or set(reg.last_known_elr)


class VersionedStore:
    """The writes replayed on plain dicts: topic name -> (topic id, assignment), and
    (topic id, partition) -> (registration, version); a write naming a wrong version fails."""

    def __init__(self):
        self.topics: dict[str, tuple[uuid.UUID, tuple]] = {}
        self.states: dict[tuple[uuid.UUID, int], tuple] = {}
        self.directories: dict[int, object] = {}

    def apply(self, write) -> None:
        if isinstance(write, SetBrokerDirectories):
            self.directories[write.broker_id] = write.directories
        elif isinstance(write, CreateTopic):
            assert write.topic not in self.topics
            self.topics[write.topic] = (write.topic_id, write.assignment)
        elif isinstance(write, SetTopicAssignment):
            assert self.topics[write.topic][0] == write.topic_id
            self.topics[write.topic] = (write.topic_id, write.assignment)
        elif isinstance(write, DeleteTopic):
            assert self.topics.pop(write.topic)[0] == write.topic_id
            self.states = {k: v for k, v in self.states.items() if k[0] != write.topic_id}
        elif isinstance(write, CreatePartitionState):
            key = (write.topic_id, write.partition.partition)
            assert key not in self.states
            assert write.registration.partition_epoch == 0
            self.states[key] = (write.registration, 0)
        else:
            assert isinstance(write, UpdatePartitionState)
            key = (write.topic_id, write.partition.partition)
            assert self.states[key][1] == write.expected_version, "conditional write on a stale version"
            assert write.registration.partition_epoch == write.expected_version + 1
            self.states[key] = (write.registration, write.expected_version + 1)

    def reload(self, image: MetadataImage) -> MetadataImage:
        """What a new controller reads: alive brokers, and topics and states from the store."""
        topics = {}
        for name, (topic_id, assignment) in self.topics.items():
            parts = {p: reg for (tid, p), (reg, _) in self.states.items() if tid == topic_id}
            topics[name] = TopicImage(name, topic_id, assignment, frozen_map(parts),
                                      image.topics[name].configs)
        alive = {i: b for i, b in image.brokers.items() if b.alive}
        return replace(image, brokers=frozen_map(alive), topics=frozen_map(topics),
                       broker_directories=frozen_map(self.directories))


class ControllerMatchesModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.image = MetadataImage()
        self.store = VersionedStore()
        self.alive: set[int] = set()
        self.next_epoch = 100
        self.next_topic_id = 1
        self.leaders_by_epoch: dict[tuple[uuid.UUID, int, int], int] = {}
        self.seen_states: dict[tuple[uuid.UUID, int], list] = {}
        self.disk = {b: uuid.UUID(int=b) for b in BROKERS}  # each broker's directory id
        # (topic id, partition) -> replicas that restarted without the data and have not
        # caught up since: never in the ISR, never leader but by an unclean election
        self.stale: dict[tuple[uuid.UUID, int], set[int]] = {}

    # --- applying a result and checking the transition -----------------------------------------

    def apply(self, event, unclean_allowed: bool | None = None):
        before = self.image
        result = handle(before, event)
        for write in result.writes:
            self.store.apply(write)
        self.check_transition(before, result, self.image.unclean_leader_election_enable
                              if unclean_allowed is None else unclean_allowed)
        self.image = result.image
        return result

    def check_transition(self, before: MetadataImage, result, unclean_allowed: bool) -> None:
        after = result.image
        moved = set()
        for tp in after.all_partitions():
            topic = after.topics[tp.topic]
            reg = topic.partitions.get(tp.partition)
            if reg is None:
                continue
            key = (topic.topic_id, tp.partition)
            old_topic = before.topics.get(tp.topic)
            old = (old_topic.partitions.get(tp.partition)
                   if old_topic is not None and old_topic.topic_id == topic.topic_id else None)
            if old is None or old.leader_epoch != reg.leader_epoch:
                moved.add(tp)
            # balanced recovery (KIP-966): the last known leader, or the leader itself after it
            # left ISR and ELR earlier in the same event, elected as unclean elections are
            recovered = (old is not None and after.eligible_leader_replicas_enabled
                         and reg.leader != NO_LEADER and old.leader_epoch != reg.leader_epoch
                         and reg.leader_recovery_state == LeaderRecoveryState.RECOVERING
                         and reg.leader in (*old.last_known_elr, old.leader))
            if recovered:
                event("balanced recovery: the last known leader")
            if old is not None:
                assert reg.leader_epoch >= old.leader_epoch
                assert reg.partition_epoch >= old.partition_epoch
                assert (reg.partition_epoch > old.partition_epoch) == (reg != old)
                if reg.leader != old.leader:
                    assert reg.leader_epoch > old.leader_epoch
                    event("leader change")
                if reg.leader not in (NO_LEADER, old.leader) and reg.leader not in old.isr:
                    assert reg.isr == (reg.leader,)
                    if reg.leader in old.elr and not recovered:
                        event("election from the ELR")
                    elif not recovered:
                        assert unclean_allowed, f"{tp}: unclean leader {reg.leader} from ISR {old.isr}"
                        event("unclean election")
                        assert reg.leader_recovery_state == LeaderRecoveryState.RECOVERING
            elected_unclean = recovered or unclean_allowed and reg.leader != NO_LEADER \
                and reg.leader_recovery_state == LeaderRecoveryState.RECOVERING \
                and (old is None or old.leader_epoch != reg.leader_epoch)
            stale = self.stale.get(key, set())
            if elected_unclean:
                stale.discard(reg.leader)  # its log is the truth now
            elif old is not None and holders(old) - stale:
                assert holders(reg) - stale, \
                    f"{tp}: {old} -> {reg} lost every replica with the data"
            self.record_leader(key, reg.leader_epoch, reg.leader)
        for notice in result.notices:
            assert after.is_alive(notice.broker_id)
            if isinstance(notice, LeaderAndIsr):
                reg = after.registration(notice.partition)
                assert (notice.leader, notice.leader_epoch, notice.isr, notice.partition_epoch) == (
                    reg.leader, reg.leader_epoch, reg.isr, reg.partition_epoch)
                assert notice.broker_id in after.replicas(notice.partition)
                self.record_leader((notice.topic_id, notice.partition.partition),
                                   notice.leader_epoch, notice.leader)
        told = {(n.broker_id, n.partition) for n in result.notices}
        for tp in moved:
            for broker in after.replicas(tp):
                if after.is_alive(broker):
                    assert (broker, tp) in told, f"broker {broker} not told about {tp}"

    def record_leader(self, key, leader_epoch: int, leader: int) -> None:
        seen = self.leaders_by_epoch.setdefault((*key, leader_epoch), leader)
        assert seen == leader, f"{key}: leaders {seen} and {leader} in leader epoch {leader_epoch}"

    @initialize(rf=st.integers(2, 3), partitions=st.integers(1, 3), seed=st.integers(0, 9),
                elr=st.booleans())
    def start_cluster_with_a_topic(self, rf, partitions, seed, elr):
        self.image = replace(self.image, eligible_leader_replicas_enabled=elr)
        event("ELR on" if elr else "ELR off")
        for broker in BROKERS:
            self.register_or_bounce_broker(broker)
        self.create_topic(NAMES[0], partitions, rf, seed, min_isr=2)

    # --- brokers -------------------------------------------------------------------------------

    def registration(self, broker, clean: bool = True) -> BrokerRegistration:
        self.next_epoch += 1
        return BrokerRegistration(broker, RACKS[broker], epoch=self.next_epoch,
                                  directory_ids=(self.disk[broker],), clean_shutdown=clean)

    @rule(broker=brokers)
    def register_or_bounce_broker(self, broker):
        self.apply(BrokerRegistered(self.registration(broker)))
        self.alive.add(broker)

    def restarted_without_data(self, broker, lose_disk: bool, clean: bool,
                               isrs: dict | None = None) -> BrokerRegistration:
        """The broker's new registration; its replicas are stale where it may lack data: all
        of them when its disk is new; after an unclean shutdown, all but those whose ISR it is
        the last one left in (nobody holds more). ``isrs`` carries the ISRs, as these restarts
        leave them, across the restarts one controller handles together (in broker order).
        Partitions without state have no data yet."""
        if lose_disk:
            self.disk[broker] = uuid.uuid4()
        isrs = {} if isrs is None else isrs
        for tp in self.image.all_partitions():
            reg = self.image.registration(tp)
            if reg is None or broker not in self.image.replicas(tp) or (not lose_disk and clean):
                continue
            key = (self.image.topics[tp.topic].topic_id, tp.partition)
            isr = isrs.setdefault(key, holders(reg))
            if not lose_disk and isr == {broker}:
                continue
            isr.discard(broker)
            self.stale.setdefault(key, set()).add(broker)
        return self.registration(broker, clean)

    @rule(broker=brokers, lose_disk=st.booleans(), clean=st.booleans())
    def restart_broker(self, broker, lose_disk, clean):
        event("restart, disk lost" if lose_disk
              else "restart, clean" if clean else "restart, unclean")
        self.apply(BrokerRegistered(self.restarted_without_data(broker, lose_disk, clean)))
        self.alive.add(broker)

    @rule(died=st.sets(brokers), restarted=st.dictionaries(
        brokers, st.tuples(st.booleans(), st.booleans()), max_size=2))
    def brokers_die_and_restart_while_no_controller_watches(self, died, restarted):
        """Between two controllers (the old one among the dead, say) brokers die and others
        restart, with or without their disk (lose_disk, clean); the next controller finds
        ZooKeeper so at failover."""
        brokers = dict(self.image.brokers)
        for broker in died - set(restarted):
            if broker in brokers:
                brokers[broker] = replace(brokers[broker], fenced=True)
            self.alive.discard(broker)
        isrs: dict = {}
        for broker, (lose_disk, clean) in sorted(restarted.items()):
            brokers[broker] = self.restarted_without_data(broker, lose_disk, clean, isrs)
            self.alive.add(broker)
        self.image = replace(self.image, brokers=frozen_map(brokers))
        self.controller_failover()

    @rule(broker=brokers)
    def fail_broker(self, broker):
        before = self.image
        result = self.apply(BrokerFailed(broker))
        self.alive.discard(broker)
        if broker not in {i for i, b in before.brokers.items() if b.alive}:
            assert result.writes == ()
            return
        for tp in before.all_partitions():
            old = before.registration(tp)
            if old is None:
                continue
            assert result.image.registration(tp).leader == self.expected_leader_after_failure(
                before, tp, broker)

    def expected_leader_after_failure(self, before: MetadataImage, tp, dead: int) -> int:
        old = before.registration(tp)
        if old.leader != dead and before.is_alive(old.leader):
            return old.leader
        live = [r for r in before.replicas(tp) if r != dead and before.is_eligible(r)]
        for r in live:
            if r in old.isr:
                return r
        for r in live:
            if r in old.elr:
                return r
        if not old.isr and not old.elr and old.last_known_elr and old.last_known_elr[0] in live:
            return old.last_known_elr[0]
        if before.unclean_enabled(tp.topic) and live:
            return live[0]
        return NO_LEADER

    @rule(broker=brokers)
    def controlled_shutdown(self, broker):
        try:
            result = self.apply(ControlledShutdownRequested(broker))
        except KafkaError as e:
            assert e.code == ErrorCode.BROKER_NOT_AVAILABLE and broker not in self.alive
            return
        assert broker in self.alive
        for tp in result.image.all_partitions():
            reg = result.image.registration(tp)
            if reg is not None and reg.leader == broker:
                assert tp in result.response

    # --- topics --------------------------------------------------------------------------------

    @rule(name=names, partitions=st.integers(1, 3), rf=st.integers(1, 3), seed=st.integers(0, 9),
          min_isr=st.integers(1, 3))
    def create_topic(self, name, partitions, rf, seed, min_isr=1):
        eligible = sum(1 for b in self.image.brokers.values() if b.eligible)
        try:
            self.apply(TopicCreated(name, self.new_topic_id(), partitions, rf, seed=seed,
                                    configs=frozen_map({"min.insync.replicas": str(min_isr)})))
        except KafkaError as e:
            assert (e.code == ErrorCode.TOPIC_ALREADY_EXISTS and name in self.image.topics) or (
                e.code == ErrorCode.INVALID_REPLICATION_FACTOR and rf > eligible)
            return
        assert rf <= eligible

    @rule(name=names, replicas=st.lists(st.permutations(BROKERS), min_size=1, max_size=2),
          rf=st.integers(1, 3))
    def create_topic_manually(self, name, replicas, rf):
        assignment = tuple(tuple(r[:rf]) for r in replicas)
        try:
            self.apply(TopicCreated(name, self.new_topic_id(), assignment=assignment))
        except KafkaError as e:
            assert e.code == ErrorCode.TOPIC_ALREADY_EXISTS and name in self.image.topics

    @rule(name=names, more=st.integers(1, 2))
    def add_partitions(self, name, more):
        topic = self.image.topics.get(name)
        count = len(topic.assignment) + more if topic else more
        try:
            self.apply(PartitionsAdded(name, count))
        except KafkaError as e:
            assert (topic is None and e.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) or (
                topic is not None and e.code == ErrorCode.INVALID_REPLICATION_FACTOR)

    @rule(name=names)
    def delete_topic(self, name):
        try:
            self.apply(TopicDeleted(name))
        except KafkaError as e:
            assert e.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and name not in self.image.topics

    def new_topic_id(self) -> uuid.UUID:
        self.next_topic_id += 1
        return uuid.UUID(int=self.next_topic_id)

    # --- ISR proposals -------------------------------------------------------------------------

    def leader_partitions(self):
        return [tp for tp in self.image.all_partitions()
                if (r := self.image.registration(tp)) is not None and r.leader != NO_LEADER]

    def isr_after_proposal(self, tp, new_isr):
        """The ISR an accepted AlterPartition leaves: the proposed one."""
        return new_isr

    @precondition(lambda self: self.leader_partitions())
    @rule(data=st.data())
    def propose_isr(self, data):
        tp = data.draw(st.sampled_from(self.leader_partitions()))
        reg = self.image.registration(tp)
        replicas = self.image.replicas(tp)
        others = data.draw(st.lists(st.sampled_from([r for r in replicas if r != reg.leader] or [reg.leader]),
                                    unique=True))
        new_isr = tuple(dict.fromkeys([reg.leader, *others]))
        # a leader elected unclean proposes RECOVERING until it has recovered its log
        state = data.draw(st.sampled_from(sorted({reg.leader_recovery_state, LeaderRecoveryState.RECOVERED})))
        # v2 (no epochs) or v3: each member's epoch as the leader saw it fetch, unchecked (-1),
        # or one of an earlier incarnation
        epochs = data.draw(st.none() | st.tuples(*(
            st.sampled_from(["current", "unchecked", "earlier"]) for _ in new_isr)))
        registered = {r: b.epoch for r, b in self.image.brokers.items()}
        stale_epoch = epochs is not None and any(
            e == "earlier" for r, e in zip(new_isr, epochs) if r in registered)
        if epochs is not None:
            epochs = tuple(-1 if e == "unchecked" or r not in registered
                           else registered[r] - (e == "earlier") for r, e in zip(new_isr, epochs))
        self.remember(tp, reg)
        accepted_isr = self.isr_after_proposal(tp, new_isr)
        result = self.apply(AlterPartition(
            reg.leader, self.image.brokers[reg.leader].epoch, tp.topic, tp.partition,
            reg.leader_epoch, reg.partition_epoch, new_isr, state, new_isr_broker_epochs=epochs))
        if new_isr == reg.isr and state == reg.leader_recovery_state:
            expected = ErrorCode.NONE  # an idempotent retry is accepted as is
        elif state == LeaderRecoveryState.RECOVERING and len(new_isr) > 1:
            expected = ErrorCode.INVALID_REQUEST
        elif not all(self.image.is_eligible(r) for r in new_isr):
            expected = ErrorCode.INELIGIBLE_REPLICA
        elif stale_epoch:
            expected = ErrorCode.INELIGIBLE_REPLICA
            event("ISR proposal with an earlier incarnation's epoch")
        else:
            expected = ErrorCode.NONE
        assert result.response.error == expected
        if expected == ErrorCode.NONE:
            assert self.image.registration(tp).isr == accepted_isr
            assert self.image.registration(tp).leader_recovery_state == state
            # in the ISR through the leader: caught up
            self.stale.get((self.image.topics[tp.topic].topic_id, tp.partition),
                           set()).difference_update(accepted_isr)
        else:
            assert result.writes == ()

    @precondition(lambda self: any(len(v) > 1 for v in self.seen_states.values()))
    @rule(data=st.data())
    def propose_stale_isr(self, data):
        key = data.draw(st.sampled_from(sorted(k for k, v in self.seen_states.items() if len(v) > 1)))
        topic = next((t for t in self.image.topics.values() if t.topic_id == key[0]), None)
        if topic is None:
            return
        tp = TopicPartition(topic.name, key[1])
        current = self.image.registration(tp)
        old_reg = data.draw(st.sampled_from(self.seen_states[key][:-1]))
        if (old_reg.leader_epoch, old_reg.partition_epoch) == (
                current.leader_epoch, current.partition_epoch) or old_reg.leader == NO_LEADER:
            return
        broker = self.image.brokers.get(old_reg.leader)
        before = self.image
        result = self.apply(AlterPartition(
            old_reg.leader, broker.epoch if broker else -1, tp.topic, tp.partition,
            old_reg.leader_epoch, old_reg.partition_epoch, old_reg.isr))
        assert result.writes == () and result.image is before
        if result.response.error == ErrorCode.NONE:  # an idempotent retry of the current state
            assert old_reg.isr == current.isr and old_reg.leader_epoch == current.leader_epoch

    def remember(self, tp, reg) -> None:
        key = (self.image.topics[tp.topic].topic_id, tp.partition)
        history = self.seen_states.setdefault(key, [])
        if not history or history[-1] != reg:
            history.append(reg)

    # --- elections and settings ----------------------------------------------------------------

    @rule(name=names, partition=st.integers(0, 3), unclean=st.booleans())
    def elect_leaders(self, name, partition, unclean):
        tp = TopicPartition(name, partition)
        kind = ElectionType.UNCLEAN if unclean else ElectionType.PREFERRED
        result = self.apply(ElectLeaders((tp,), kind), unclean_allowed=unclean or None)
        exists = name in self.image.topics and partition < len(self.image.topics[name].assignment)
        assert (result.response[tp] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) == (not exists)
        if result.response[tp] == ErrorCode.NONE and not unclean:
            assert self.image.registration(tp).leader == self.image.replicas(tp)[0]

    @rule()
    def auto_leader_rebalance(self):
        self.apply(AutoLeaderRebalance())

    @rule(enabled=st.booleans())
    def switch_unclean_election(self, enabled):
        self.apply(UncleanLeaderElectionChanged(enabled), unclean_allowed=enabled)

    @rule()
    def controller_failover(self):
        self.image = self.store.reload(self.image)
        self.apply(ControllerFailover(self.image.controller_epoch + 1))

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def partitions_are_consistent(self):
        image = self.image
        assert image.alive_broker_ids() == frozenset(self.alive)
        for tp in image.all_partitions():
            reg = image.registration(tp)
            replicas = image.replicas(tp)
            eligible = [r for r in replicas if image.is_eligible(r)]
            if reg is None:  # no state yet only while no replica can take it
                assert not eligible
                continue
            if reg.leader == NO_LEADER:  # leaderless only while no replica may lead
                assert not set(eligible) & set(reg.isr)
                assert not set(eligible) & set(reg.elr)
                assert not (not reg.isr and not reg.elr and set(eligible) & set(reg.last_known_elr))
                assert not (eligible and image.unclean_enabled(tp.topic))
            assert not set(reg.isr) & set(reg.elr) and set(reg.elr) <= set(replicas)
            if not image.eligible_leader_replicas_enabled:
                assert reg.elr == () and reg.last_known_elr == ()
            if len(reg.isr) >= image.effective_min_isr(tp):
                assert reg.elr == ()
            if reg.last_known_elr:
                assert not reg.isr and reg.leader == NO_LEADER and len(reg.last_known_elr) == 1
            assert len(set(reg.isr)) == len(reg.isr) and set(reg.isr) <= set(replicas)
            assert reg.isr or reg.leader == NO_LEADER
            if reg.leader_recovery_state == LeaderRecoveryState.RECOVERING:
                assert len(reg.isr) <= 1
            if reg.leader != NO_LEADER:
                assert reg.leader in reg.isr and image.is_alive(reg.leader)
            if not any(image.is_alive(r) for r in reg.isr):
                assert reg.leader == NO_LEADER
            self.remember(tp, reg)

    @invariant()
    def a_replica_without_the_data_is_not_in_sync_until_it_catches_up(self):
        for tp in self.image.all_partitions():
            reg = self.image.registration(tp)
            stale = self.stale.get((self.image.topics[tp.topic].topic_id, tp.partition), set())
            if reg is not None:
                assert not stale & set(reg.isr), f"{tp}: {stale} in the ISR {reg.isr}"
                assert not stale & set(reg.elr), f"{tp}: {stale} in the ELR {reg.elr}"
                assert reg.leader not in stale, f"{tp}: {reg.leader} leads without the data"

    @invariant()
    def writes_replay_to_the_image(self):
        assert set(self.store.topics) == set(self.image.topics)
        for name, topic in self.image.topics.items():
            assert self.store.topics[name] == (topic.topic_id, topic.assignment)
            for p, reg in topic.partitions.items():
                assert self.store.states[(topic.topic_id, p)] == (reg, reg.partition_epoch)
        assert len(self.store.states) == sum(len(t.partitions) for t in self.image.topics.values())


ControllerMatchesModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("STRATA_CONTROLLER_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestControllerMatchesModel = ControllerMatchesModel.TestCase
