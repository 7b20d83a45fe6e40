"""The controller's pure decisions: replica placement, election rules and event handlers.

Placement examples are Kafka's own (``AdminRackAwareTest``); the handler cases follow Kafka's
ZooKeeper-mode controller and KRaft's AlterPartition validation.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import replace

import pytest

from strata.cluster import election
from strata.cluster.controller_events import (
    AlterPartition, AutoLeaderRebalance, BrokerFailed, BrokerRegistered,
    ControlledShutdownRequested, ControllerFailover, CreatePartitionState, ElectionType,
    ElectLeaders, LeaderAndIsr, PartitionsAdded, StopReplica, TopicConfigsChanged, TopicCreated,
    TopicDeleted, UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import (
    NO_LEADER, BrokerRegistration, LeaderRecoveryState, MetadataImage, PartitionRegistration,
    frozen_map)
from strata.cluster.replica_assignment import (
    assign_replicas_to_brokers, new_partitions_assignment, rack_alternated_broker_list,
    validate_new_topic_assignment)
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition

T0 = TopicPartition("t", 0)
RACKS = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"}


def racked(mapping):
    return sorted(mapping.items())


# --- placement ----------------------------------------------------------------------------------

def test_rack_alternated_list_takes_one_broker_per_rack_in_turn():
    rack_map = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated_broker_list(rack_map) == [0, 3, 1, 5, 4, 2]
    del rack_map[5]
    assert rack_alternated_broker_list(rack_map) == [0, 3, 1, 4, 2]


def test_rack_aware_assignment_matches_kafka_for_a_fixed_start():
    rack_map = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert assign_replicas_to_brokers(racked(rack_map), 7, 3, 0, 0) == {
        0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0], 5: [2, 0, 3],
        6: [0, 4, 2]}


def test_rack_unaware_assignment_matches_kafka_for_a_fixed_start():
    brokers = [(b, None) for b in range(5)]
    assert assign_replicas_to_brokers(brokers, 10, 3, 0, -1) == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1], 5: [0, 2, 3],
        6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("partitions,rf", [(6, 3), (12, 2), (6, 2)])
def test_rack_aware_replicas_of_each_partition_span_racks_and_spread_evenly(seed, partitions, rf):
    assignment = assign_replicas_to_brokers(racked(RACKS), partitions, rf, rng=random.Random(seed))
    assert sorted(assignment) == list(range(partitions))
    for replicas in assignment.values():
        assert len({RACKS[b] for b in replicas}) == rf
        assert len(set(replicas)) == rf
    leaders = Counter(r[0] for r in assignment.values())
    assert set(leaders.values()) == {partitions // len(RACKS)}
    per_broker = Counter(b for r in assignment.values() for b in r)
    assert set(per_broker.values()) == {partitions * rf // len(RACKS)}


def test_same_seed_gives_same_assignment():
    brokers = [(b, None) for b in range(7)]
    a = assign_replicas_to_brokers(brokers, 20, 3, rng=random.Random(42))
    assert a == assign_replicas_to_brokers(brokers, 20, 3, rng=random.Random(42))


def test_replication_factor_above_broker_count_is_refused_with_kafkas_message():
    with pytest.raises(KafkaError) as e:
        assign_replicas_to_brokers([(1, None), (2, None)], 3, 3)
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert str(e.value) == "Replication factor: 3 larger than available brokers: 2."
    with pytest.raises(KafkaError) as e:
        assign_replicas_to_brokers([(1, None)], 3, 0)
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(KafkaError) as e:
        assign_replicas_to_brokers([(1, None)], 0, 1)
    assert e.value.code == ErrorCode.INVALID_PARTITIONS


def test_some_brokers_without_rack_refuse_rack_aware_assignment():
    with pytest.raises(KafkaError) as e:
        assign_replicas_to_brokers([(1, "a"), (2, None), (3, "b")], 3, 2)
    assert e.value.code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "Not all brokers have rack information" in str(e.value)


@pytest.mark.parametrize("assignment,message", [
    ({0: [1, 2], 1: [1]}, "same number of replicas"),
    ({0: [1, 1]}, "Duplicate replica assignment"),
    ({0: [1], 2: [2]}, "consecutive 0-based"),
    ({0: []}, "empty replica list"),
])
def test_manual_topic_assignment_rules(assignment, message):
    with pytest.raises(KafkaError) as e:
        validate_new_topic_assignment(assignment)
    assert e.value.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert message in str(e.value)


def test_added_partitions_continue_the_placement_after_the_existing_ones():
    brokers = [(b, None) for b in range(5)]
    full = assign_replicas_to_brokers(brokers, 10, 3, 0, 0)
    existing = [full[p] for p in range(4)]
    assert new_partitions_assignment(existing, 10, brokers) == [full[p] for p in range(4, 10)]


@pytest.mark.parametrize("count,manual,code", [
    (2, None, ErrorCode.INVALID_PARTITIONS),
    (1, None, ErrorCode.INVALID_PARTITIONS),
    (3, [[9, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    (4, [[0, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    (3, [[0]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
])
def test_create_partitions_refusals(count, manual, code):
    with pytest.raises(KafkaError) as e:
        new_partitions_assignment([[0, 1], [1, 0]], count, [(0, None), (1, None)], manual)
    assert e.value.code == code


# --- election rules -----------------------------------------------------------------------------

def test_offline_election_takes_first_live_isr_member_in_assignment_order():
    assert election.offline_partition_leader([3, 1, 2], [2, 1], {1, 2}) == 1
    assert election.offline_partition_leader([3, 1, 2], [3], {1, 2}) is None


def test_reassign_election_takes_first_live_isr_member_of_the_target():
    assert election.reassign_partition_leader([4, 5, 1], [1, 5], {1, 4, 5}) == 5
    assert election.reassign_partition_leader([4, 5], [1], {1, 4, 5}) is None


def test_reassign_election_bumps_leader_epoch_and_keeps_isr():
    image = cluster(1, 2, 3, 4)
    current = PartitionRegistration(leader=1, isr=(1, 2, 4), leader_epoch=3, partition_epoch=7)
    elected = election.elect_reassign(image, (4, 2), current)
    assert (elected.leader, elected.isr, elected.leader_epoch, elected.partition_epoch) == (4, (1, 2, 4), 4, 7)
    assert election.elect_reassign(image, (3,), current) is None


def test_preferred_election_takes_only_the_first_replica():
    assert election.preferred_replica_leader([2, 1], [1, 2], {1, 2}) == 2
    assert election.preferred_replica_leader([2, 1], [1], {1, 2}) is None
    assert election.preferred_replica_leader([2, 1], [1, 2], {1}) is None


def test_controlled_shutdown_election_skips_shutting_down_brokers():
    assert election.controlled_shutdown_leader([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}) == 2
    assert election.controlled_shutdown_leader([1, 2, 3], [1], {1, 2, 3}, {1}) is None


# --- handlers -----------------------------------------------------------------------------------

def cluster(*ids, racks=None, unclean=False) -> MetadataImage:
    image = MetadataImage(unclean_leader_election_enable=unclean)
    for i in ids:
        registration = BrokerRegistration(i, (racks or {}).get(i), epoch=100 + i)
        image = handle(image, BrokerRegistered(registration)).image
    return image


def with_topic(image, assignment, name="t"):
    return handle(image, TopicCreated(name, uuid.uuid4(), assignment=assignment)).image


def reg(image, tp=T0) -> PartitionRegistration:
    return image.registration(tp)


def state_writes(result) -> list:
    """The partition state writes of a result (not the registrations it records)."""
    return [w for w in result.writes if isinstance(w, (CreatePartitionState, UpdatePartitionState))]


def test_new_topic_leader_is_first_live_replica_and_isr_all_live_replicas():
    image = cluster(1, 2)
    result = handle(image, TopicCreated("t", uuid.uuid4(), assignment=((3, 2, 1),)))
    r = reg(result.image)
    assert (r.leader, r.isr, r.leader_epoch, r.partition_epoch) == (2, (2, 1), 0, 0)
    assert [type(w).__name__ for w in result.writes] == ["CreateTopic", "CreatePartitionState"]
    assert {(n.broker_id, n.is_leader, n.is_new) for n in result.notices} == {
        (2, True, True), (1, False, True)}


def test_partition_without_live_replicas_gets_state_when_one_registers():
    image = with_topic(cluster(1), ((2, 3),))
    assert reg(image) is None
    result = handle(image, BrokerRegistered(BrokerRegistration(3, epoch=7)))
    assert isinstance(state_writes(result)[0], CreatePartitionState)
    assert (reg(result.image).leader, reg(result.image).isr) == (3, (3,))


def test_create_topic_on_racked_brokers_spreads_each_partition_over_racks():
    image = cluster(*RACKS, racks=RACKS)
    result = handle(image, TopicCreated("t", uuid.uuid4(), 6, 3, seed=3))
    assert all(len({RACKS[b] for b in replicas}) == 3 for replicas in result.response)
    assert all(reg(result.image, TopicPartition("t", p)).isr == result.response[p] for p in range(6))


def test_unclean_cluster_default_elects_a_live_replica_when_the_last_isr_member_dies():
    image = with_topic(cluster(1, 2, unclean=True), ((1, 2),))
    image = alter(image, (1,)).image  # 2 fell behind
    r = reg(handle(image, BrokerFailed(1)).image)
    assert (r.leader, r.isr, r.leader_recovery_state) == (2, (2,), LeaderRecoveryState.RECOVERING)


def test_create_topic_places_replicas_on_eligible_brokers_only():
    image = cluster(1, 2, 3)
    image = handle(image, ControlledShutdownRequested(3)).image
    with pytest.raises(KafkaError) as e:
        handle(image, TopicCreated("t", uuid.uuid4(), 1, 3))
    assert e.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    result = handle(image, TopicCreated("t", uuid.uuid4(), 4, 2, seed=5))
    assert all(set(r) == {1, 2} for r in result.response)


def test_create_topic_refuses_existing_name_and_mixed_arguments():
    image = with_topic(cluster(1), ((1,),))
    with pytest.raises(KafkaError) as e:
        handle(image, TopicCreated("t", uuid.uuid4(), 1, 1))
    assert e.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaError) as e:
        handle(image, TopicCreated("u", uuid.uuid4(), 1, None, assignment=((1,),)))
    assert e.value.code == ErrorCode.INVALID_REQUEST


def test_leader_failure_elects_next_isr_member_and_bumps_epochs_once():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    result = handle(image, BrokerFailed(1))
    r = reg(result.image)
    assert (r.leader, r.isr, r.leader_epoch, r.partition_epoch) == (2, (2, 3), 1, 1)
    assert [w.expected_version for w in result.writes] == [0]
    assert {n.broker_id for n in result.notices} == {2, 3}


def test_follower_failure_leaves_isr_and_bumps_leader_epoch_as_zk_mode_does():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    r = reg(handle(image, BrokerFailed(3)).image)
    assert (r.leader, r.isr, r.leader_epoch, r.partition_epoch) == (1, (1, 2), 1, 1)


def test_last_isr_member_dying_moves_to_the_elr_and_leads_again_when_back():
    """KIP-966: the ISR may empty; its last member, which holds the high watermark, is kept as
    an eligible leader replica and the last known leader."""
    image = with_topic(cluster(1, 2), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    r = reg(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (1,), (1,))
    image = handle(image, BrokerRegistered(BrokerRegistration(2, epoch=9))).image
    assert reg(image).leader == NO_LEADER  # 2 is in neither ISR nor ELR: no clean leader
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=10))).image
    r = reg(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (1, (1,), (), ())
    assert r.leader_recovery_state == LeaderRecoveryState.RECOVERED


def test_with_elr_off_the_last_isr_member_dying_stays_in_the_isr_as_zk_mode_does():
    image = with_topic(replace(cluster(1, 2), eligible_leader_replicas_enabled=False), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    assert (reg(image).leader, reg(image).isr, reg(image).elr) == (NO_LEADER, (1,), ())
    image = handle(image, BrokerRegistered(BrokerRegistration(2, epoch=9))).image
    assert reg(image).leader == NO_LEADER
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=10))).image
    assert (reg(image).leader, reg(image).isr) == (1, (1,))


def test_unclean_election_resets_isr_to_the_leader_and_marks_it_recovering():
    image = with_topic(cluster(1, 2), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(BrokerRegistration(2, epoch=9))).image
    epoch = reg(image).leader_epoch
    image = handle(image, TopicConfigsChanged("t", {"unclean.leader.election.enable": "true"})).image
    r = reg(image)
    assert (r.leader, r.isr, r.leader_recovery_state) == (2, (2,), LeaderRecoveryState.RECOVERING)
    assert r.leader_epoch == epoch + 1


def test_controlled_shutdown_moves_leadership_and_drops_broker_from_followed_isrs():
    image = with_topic(with_topic(cluster(1, 2, 3), ((1, 2, 3), (2, 1, 3))), ((1,),), name="u")
    result = handle(image, ControlledShutdownRequested(1, broker_epoch=101))
    assert result.response == frozenset({TopicPartition("u", 0)})  # RF 1 stays
    p0, p1 = reg(result.image), reg(result.image, TopicPartition("t", 1))
    assert (p0.leader, p0.isr) == (2, (2, 3))
    assert (p1.leader, p1.isr) == (2, (2, 3))
    stops = [n for n in result.notices if isinstance(n, StopReplica)]
    assert [(n.broker_id, n.partition, n.delete) for n in stops] == [(1, TopicPartition("t", 1), False)]
    assert result.image.brokers[1].in_controlled_shutdown


def test_controlled_shutdown_keeps_leader_when_no_other_isr_member():
    image = with_topic(cluster(1, 2), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    result = handle(image, ControlledShutdownRequested(1))
    assert result.response == frozenset({T0}) and reg(result.image) == reg(image)


def test_controlled_shutdown_refusals():
    image = cluster(1)
    with pytest.raises(KafkaError) as e:
        handle(image, ControlledShutdownRequested(7))
    assert e.value.code == ErrorCode.BROKER_NOT_AVAILABLE
    with pytest.raises(KafkaError) as e:
        handle(image, ControlledShutdownRequested(1, broker_epoch=5))
    assert e.value.code == ErrorCode.STALE_BROKER_EPOCH


def alter(image, isr, broker=1, leader_epoch=None, partition_epoch=None, **kw):
    r = reg(image)
    return handle(image, AlterPartition(
        broker, image.brokers[broker].epoch if broker in image.brokers else 0, "t", 0,
        r.leader_epoch if leader_epoch is None else leader_epoch,
        r.partition_epoch if partition_epoch is None else partition_epoch, tuple(isr), **kw))


def test_alter_partition_shrinks_isr_bumping_only_the_partition_epoch():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    result = alter(image, (1, 2))
    r = reg(result.image)
    assert result.response.error == ErrorCode.NONE and result.response.registration == r
    assert (r.isr, r.leader_epoch, r.partition_epoch) == ((1, 2), 0, 1)
    assert result.writes == (UpdatePartitionState(T0, image.topics["t"].topic_id, r, 0),)
    assert result.notices == ()


@pytest.mark.parametrize("kwargs,code", [
    ({"leader_epoch": -1}, ErrorCode.FENCED_LEADER_EPOCH),
    ({"leader_epoch": 5}, ErrorCode.NOT_CONTROLLER),
    ({"partition_epoch": 5}, ErrorCode.NOT_CONTROLLER),
    ({"broker": 2}, ErrorCode.INVALID_REQUEST),
    ({"isr": (2, 3)}, ErrorCode.INVALID_REQUEST),
    ({"isr": (1, 4)}, ErrorCode.INVALID_REQUEST),
    ({"isr": (1,), "leader_recovery_state": LeaderRecoveryState.RECOVERING}, ErrorCode.INVALID_REQUEST),
    ({"broker": 9}, ErrorCode.STALE_BROKER_EPOCH),
    ({"topic_id": uuid.UUID(int=1)}, ErrorCode.UNKNOWN_TOPIC_ID),
])
def test_alter_partition_refusals_change_nothing(kwargs, code):
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    result = alter(image, kwargs.pop("isr", (1, 2)), **kwargs)
    assert result.response.error == code
    assert result.image is image and result.writes == () and result.notices == ()


def test_alter_partition_with_stale_partition_epoch_is_invalid_update_version():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    image = alter(image, (1, 2)).image
    result = alter(image, (1,), partition_epoch=0)
    assert result.response.error == ErrorCode.INVALID_UPDATE_VERSION and result.image is image
    retry = alter(image, (1, 2), partition_epoch=0)  # the same change again: idempotent
    assert retry.response.error == ErrorCode.NONE and retry.writes == ()


def test_alter_partition_refuses_fenced_or_shutting_down_isr_members():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    image = alter(image, (1,)).image
    down = handle(image, BrokerFailed(2)).image
    assert alter(down, (1, 2)).response.error == ErrorCode.INELIGIBLE_REPLICA
    draining = handle(image, ControlledShutdownRequested(3)).image
    assert alter(draining, (1, 3)).response.error == ErrorCode.INELIGIBLE_REPLICA
    assert alter(draining, (1, 2)).response.error == ErrorCode.NONE


def test_preferred_election_answers_per_partition():
    image = with_topic(cluster(1, 2), ((1, 2), (2, 1)))
    image = handle(image, BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=50))).image
    tps = (T0, TopicPartition("t", 1), TopicPartition("t", 7))
    result = handle(image, ElectLeaders(tps))
    # broker 1 came back outside the ISR, so it cannot lead yet
    assert result.response == {T0: ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                               tps[1]: ErrorCode.ELECTION_NOT_NEEDED,
                               tps[2]: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    image = alter(image, (2, 1), broker=2).image
    result = handle(image, ElectLeaders(tps[:1]))
    assert result.response == {T0: ErrorCode.NONE} and reg(result.image).leader == 1


def test_unclean_elect_leaders_elects_outside_the_isr():
    image = with_topic(cluster(1, 2), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(BrokerRegistration(2, epoch=9))).image
    result = handle(image, ElectLeaders((T0,), ElectionType.UNCLEAN))
    assert result.response == {T0: ErrorCode.NONE} and reg(result.image).isr == (2,)


def test_auto_rebalance_moves_leaders_back_when_imbalance_exceeds_percentage():
    image = with_topic(cluster(1, 2), ((1, 2), (1, 2), (2, 1)))
    image = handle(image, BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=50))).image
    for p in (0, 1):
        tp = TopicPartition("t", p)
        r = image.registration(tp)
        image = handle(image, AlterPartition(2, 102, "t", p, r.leader_epoch, r.partition_epoch, (2, 1))).image
    result = handle(image, AutoLeaderRebalance())
    assert [result.image.registration(TopicPartition("t", p)).leader for p in range(3)] == [1, 1, 2]
    assert handle(result.image, AutoLeaderRebalance()).writes == ()


def test_partitions_added_get_state_and_notices():
    image = with_topic(cluster(1, 2), ((1, 2),))
    result = handle(image, PartitionsAdded("t", 3))
    assert len(result.response) == 3
    assert result.image.registration(TopicPartition("t", 2)) is not None
    with pytest.raises(KafkaError) as e:
        handle(image, PartitionsAdded("nope", 3))
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_topic_deleted_stops_and_deletes_replicas():
    image = with_topic(cluster(1, 2), ((1, 2),))
    result = handle(image, TopicDeleted("t"))
    assert "t" not in result.image.topics
    assert {(n.broker_id, n.delete) for n in result.notices} == {(1, True), (2, True)}
    with pytest.raises(KafkaError) as e:
        handle(result.image, TopicDeleted("t"))
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def store_as_read(image, leader_restarted_at: int, state_written_at: int):
    """The image a new controller reads: the state znode of t-0 last written at zxid
    ``state_written_at``, its leader registered (broker epoch = czxid) at ``leader_restarted_at``."""
    r = reg(image)
    topic = image.topics["t"]
    topic = replace(topic, partitions=frozen_map({0: replace(r, zxid=state_written_at)}))
    brokers = dict(image.brokers)
    brokers[r.leader] = replace(brokers[r.leader], epoch=leader_restarted_at)
    return replace(image, brokers=frozen_map(brokers), topics=frozen_map({"t": topic}),
                   controller_epoch=4)


def test_controller_failover_treats_a_leader_registered_after_its_state_as_bounced():
    """The leader restarted (new registration) while no controller watched: a new controller
    elects another ISR member, as the old one would have on the bounce; the restarted broker
    may have lost its log (a replaced disk)."""
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    result = handle(store_as_read(image, leader_restarted_at=900, state_written_at=500),
                    ControllerFailover(5))
    r = reg(result.image)
    assert (r.leader, r.leader_epoch) == (2, 1)
    assert result.image.is_alive(1)          # still registered: it follows
    # a state written after the registration is the leader's own: nothing changes
    kept = reg(handle(store_as_read(image, leader_restarted_at=500, state_written_at=900),
                      ControllerFailover(5)).image)
    assert (kept.leader, kept.leader_epoch) == (1, 0)


def test_a_bounced_sole_isr_leader_is_elected_again_at_a_new_epoch():
    image = with_topic(cluster(1, 2), ((1,),))
    result = handle(store_as_read(image, leader_restarted_at=900, state_written_at=500),
                    ControllerFailover(5))
    r = reg(result.image)
    # offline (epoch 1) when it fails, its own again (epoch 2) when it registers: a leader
    # epoch newer than any its previous incarnation held, which it accepts
    assert (r.leader, r.leader_epoch, r.isr) == (1, 2, (1,))


def test_controller_failover_cleans_dead_isr_members_and_tells_every_broker_everything():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    # the store as a new controller reads it: broker 1 gone, still leader and in the ISR
    brokers = dict(image.brokers)
    del brokers[1]
    stale = replace(image, brokers=frozen_map(brokers), controller_epoch=4)
    result = handle(stale, ControllerFailover(5))
    r = reg(result.image)
    assert (r.leader, r.isr, r.controller_epoch) == (2, (2, 3), 5)
    assert {n.broker_id for n in result.notices if isinstance(n, LeaderAndIsr)} == {2, 3}
    with pytest.raises(KafkaError) as e:
        handle(result.image, ControllerFailover(5))
    assert e.value.code == ErrorCode.STALE_CONTROLLER_EPOCH


def test_bounced_broker_is_failed_then_registered_in_one_event():
    image = with_topic(cluster(1, 2), ((1, 2),))
    result = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=999)))
    r = reg(result.image)
    assert (r.leader, r.isr) == (2, (2,))
    assert [w.expected_version for w in state_writes(result)] == [0]
    assert any(n.broker_id == 1 and not n.is_leader for n in result.notices)


def test_a_partition_given_state_at_failover_is_announced_as_new():
    # the store as a new controller reads it: a topic written by an admin path, no states yet
    image = cluster(1, 2)
    topic = handle(image, TopicCreated("t", uuid.uuid4(), assignment=((1, 2),))).image.topics["t"]
    stale = replace(image, topics=frozen_map({"t": replace(topic, partitions=frozen_map())}),
                    controller_epoch=4)
    result = handle(stale, ControllerFailover(5))
    assert [type(w).__name__ for w in result.writes] == ["CreatePartitionState"]
    assert {(n.broker_id, n.is_new) for n in result.notices} == {(1, True), (2, True)}
