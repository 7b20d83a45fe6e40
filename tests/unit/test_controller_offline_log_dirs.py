"""A failed log directory moves leadership away (issue 51): the controller's rules for a broker's
report of replicas in failed log dirs (``LogDirEventNotification``).

- a replica reported offline leaves its ISR (but as the last member); a partition it led gets
  the first live ISR member elsewhere, else no leader;
- an offline replica is never elected (offline, preferred, controlled shutdown, reassignment)
  nor admitted to an ISR by AlterPartition;
- reported back, it waits for its leader's AlterPartition; a partition left without a leader
  elects it again;
- a report of an earlier registration changes nothing; a new registration has nothing offline;
  a new controller acts on reports the previous one never handled.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller_events import (
    AlterPartition, BrokerRegistered, ControlledShutdownRequested, ControllerFailover,
    ElectionType, ElectLeaders, LogDirEventNotification, TopicCreated, UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import NO_LEADER, BrokerRegistration, MetadataImage, frozen_map
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
EPOCH = {1: 101, 2: 102, 3: 103}


def cluster(*ids: int, unclean: bool = False) -> MetadataImage:
    image = MetadataImage(unclean_leader_election_enable=unclean)
    for i in ids:
        image = handle(image, BrokerRegistered(BrokerRegistration(i, epoch=EPOCH[i]))).image
    return image


def with_topic(image: MetadataImage, *assignment: tuple[int, ...]) -> MetadataImage:
    return handle(image, TopicCreated("t", uuid.uuid4(), assignment=tuple(assignment))).image


def offline(image: MetadataImage, broker: int, *tps: TopicPartition, epoch: int | None = None):
    return handle(image, LogDirEventNotification(broker, EPOCH[broker] if epoch is None else epoch,
                                                 frozenset(tps)))


def state(image: MetadataImage, tp: TopicPartition = T0):
    r = image.registration(tp)
    return r.leader, r.isr


def test_a_failed_leader_dir_moves_leadership_to_the_next_isr_member_and_leaves_the_isr():
    image = with_topic(cluster(1, 2, 3), (1, 2, 3), (2, 1, 3))
    before = image.registration(T0)
    result = offline(image, 1, T0, T1)
    assert state(result.image, T0) == (2, (2, 3))
    assert state(result.image, T1) == (2, (2, 3))   # a follower there: it leaves the ISR
    assert result.image.registration(T0).leader_epoch == before.leader_epoch + 1
    assert result.image.offline_replicas == {1: frozenset({T0, T1})}
    assert all(isinstance(w, UpdatePartitionState) for w in result.writes)


def test_only_the_reported_replicas_move_the_broker_stays_alive_for_the_others():
    image = with_topic(cluster(1, 2, 3), (1, 2, 3), (1, 2, 3))
    result = offline(image, 1, T0)
    assert state(result.image, T0) == (2, (2, 3))
    assert state(result.image, T1) == (1, (1, 2, 3))
    assert result.image.is_alive(1)


def test_the_last_isr_member_leading_from_a_failed_dir_leaves_the_partition_without_leader():
    image = with_topic(cluster(1, 2), (1, 2))
    image = handle(image, AlterPartition(1, EPOCH[1], "t", 0, 0, 0, (1,))).image
    result = offline(image, 1, T0)
    assert state(result.image) == (NO_LEADER, ())   # waits: nobody else has the data
    assert result.image.registration(T0).elr == (1,)   # ... but it does (KIP-966)
    # reported again (the same set): nothing more happens
    assert offline(result.image, 1, T0).writes == ()


def test_with_unclean_election_a_live_replica_outside_the_isr_takes_over():
    image = with_topic(cluster(1, 2, unclean=True), (1, 2))
    image = handle(image, AlterPartition(1, EPOCH[1], "t", 0, 0, 0, (1,))).image
    assert state(offline(image, 1, T0).image) == (2, (2,))


def test_an_offline_replica_is_not_admitted_to_the_isr_until_reported_back():
    image = offline(with_topic(cluster(1, 2, 3), (1, 2, 3)), 3, T0).image
    reg = image.registration(T0)
    assert state(image) == (1, (1, 2))
    grow = AlterPartition(1, EPOCH[1], "t", 0, reg.leader_epoch, reg.partition_epoch, (1, 2, 3))
    refused = handle(image, grow)
    assert refused.response.error == ErrorCode.INELIGIBLE_REPLICA and refused.writes == ()
    # a shrink that keeps out the offline replica is fine
    shrink = replace(grow, new_isr=(1,))
    assert handle(image, shrink).response.error == ErrorCode.NONE
    back = offline(image, 3).image
    assert back.offline_replicas == {}
    assert state(back) == (1, (1, 2))   # back, but not in sync until its leader says so
    assert handle(back, grow).response.error == ErrorCode.NONE


def test_a_partition_without_leader_elects_the_replica_once_its_dir_is_back():
    image = with_topic(cluster(1, 2), (1, 2))
    image = handle(image, AlterPartition(1, EPOCH[1], "t", 0, 0, 0, (1,))).image
    image = offline(image, 1, T0).image
    assert state(image) == (NO_LEADER, ())
    back = offline(image, 1)
    assert state(back.image) == (1, (1,))
    assert any(getattr(n, "broker_id", None) == 1 and n.partition == T0 for n in back.notices)


def test_offline_replicas_are_never_elected():
    image = with_topic(cluster(1, 2, 3), (1, 2, 3))
    image = offline(image, 2, T0).image
    # the leader shuts down: the next live ISR member that is online is 3, not 2
    shut = handle(image, ControlledShutdownRequested(1, EPOCH[1]))
    assert state(shut.image) == (3, (3,))
    # preferred election to an offline preferred replica is not possible
    moved = offline(with_topic(cluster(1, 2, 3), (1, 2, 3)), 1, T0).image
    assert state(moved) == (2, (2, 3))
    elect = handle(moved, ElectLeaders((T0,), ElectionType.PREFERRED))
    assert elect.response[T0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    assert state(elect.image) == (2, (2, 3))


def test_a_report_of_an_earlier_registration_changes_nothing():
    image = with_topic(cluster(1, 2, 3), (1, 2, 3))
    stale = offline(image, 1, T0, epoch=EPOCH[1] - 50)
    assert stale.image is image and stale.writes == ()


def test_a_new_registration_starts_with_nothing_offline():
    image = offline(with_topic(cluster(1, 2, 3), (1, 2, 3)), 1, T0).image
    again = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=500))).image
    assert again.offline_replicas == {}


def test_a_new_controller_acts_on_a_report_the_previous_one_never_handled():
    image = with_topic(cluster(1, 2, 3), (1, 2, 3))
    # read from ZooKeeper: broker 1's report is there, the partition state not yet changed
    read = replace(image, offline_replicas=frozen_map({1: frozenset({T0})}), controller_epoch=4)
    result = handle(read, ControllerFailover(5))
    assert state(result.image) == (2, (2, 3))
    # and a failover over an image already reconciled writes nothing for it
    again = handle(replace(result.image, controller_epoch=5), ControllerFailover(6))
    assert not any(isinstance(w, UpdatePartitionState) and w.partition == T0 for w in again.writes)
