"""Partition reassignment (KIP-455) in the controller's pure logic, as Kafka 3.9's
ZooKeeper-mode ``KafkaController.onPartitionReassignment`` does it: phase A (replicas = target +
original, adding/removing recorded, leader epoch bumped, new replicas told), phase B once the
target is in the ISR (replicas = target, leader moved if outside it, removed replicas out of the
ISR and deleted), cancellation, and the per-partition errors."""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller_events import (
    AlterPartition, BrokerFailed, BrokerRegistered, ControllerFailover, LeaderAndIsr,
    PartitionReassignmentRequested, SetTopicAssignment, StopReplica, TopicCreated,
    UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import (
    NO_LEADER, BrokerRegistration, LeaderRecoveryState, MetadataImage, frozen_map)
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition

T0 = TopicPartition("t", 0)


def cluster(*ids) -> MetadataImage:
    image = MetadataImage()
    for i in ids:
        image = handle(image, BrokerRegistered(BrokerRegistration(i, epoch=100 + i))).image
    return image


def with_topic(image, assignment, name="t"):
    return handle(image, TopicCreated(name, uuid.uuid4(), assignment=assignment)).image


def reassign(image, target, tp=T0):
    return handle(image, PartitionReassignmentRequested({tp: target}))


def isr_proposal(image, new_isr, tp=T0):
    reg = image.registration(tp)
    return handle(image, AlterPartition(reg.leader, image.brokers[reg.leader].epoch, tp.topic,
                                        tp.partition, reg.leader_epoch, reg.partition_epoch,
                                        tuple(new_isr)))


def started(original=(1, 2), target=(2, 3), brokers=(1, 2, 3)):
    image = with_topic(cluster(*brokers), (original,))
    return image, reassign(image, target)


def test_request_makes_replicas_target_then_original_and_records_adding_and_removing():
    before, result = started()
    topic = result.image.topics["t"]
    assert result.response == {T0: (ErrorCode.NONE, None)}
    assert topic.assignment == ((2, 3, 1),)
    assert dict(topic.adding_replicas) == {0: (3,)}
    assert dict(topic.removing_replicas) == {0: (1,)}
    assert topic.target_replicas(0) == (2, 3)
    assert topic.original_replicas(0) == (2, 1)  # Kafka's originReplicas: in replica order
    writes = [w for w in result.writes if isinstance(w, SetTopicAssignment)]
    assert writes == [SetTopicAssignment("t", topic.topic_id, ((2, 3, 1),), {0: (3,)}, {0: (1,)})]
    # A1: the leader epoch moves, leader and ISR stay; A2: every replica, the new one too, is told
    old, new = before.registration(T0), result.image.registration(T0)
    assert (new.leader, new.isr, new.leader_epoch) == (old.leader, old.isr, old.leader_epoch + 1)
    told = {n.broker_id: n for n in result.notices if isinstance(n, LeaderAndIsr)}
    assert set(told) == {1, 2, 3}
    assert told[3].replicas == (2, 3, 1) and told[3].is_new
    assert not any(isinstance(n, StopReplica) for n in result.notices)


def test_new_replica_in_the_isr_completes_and_moves_the_leader_into_the_target():
    _, result = started()
    assert result.image.registration(T0).leader == 1
    done = isr_proposal(result.image, (1, 2, 3))
    assert done.response.error == ErrorCode.NONE
    topic = done.image.topics["t"]
    assert topic.assignment == ((2, 3),)
    assert not topic.adding_replicas and not topic.removing_replicas
    reg = done.image.registration(T0)
    assert reg.leader == 2 and reg.isr == (2, 3)  # the first target replica in the ISR leads
    assert reg.leader_epoch > result.image.registration(T0).leader_epoch
    assert StopReplica(1, T0, topic.topic_id, delete=True) in done.notices
    assert {n.broker_id for n in done.notices if isinstance(n, LeaderAndIsr)} == {2, 3}
    last = [w for w in done.writes if isinstance(w, SetTopicAssignment)][-1]
    assert last.assignment == ((2, 3),)
    assert not last.adding_replicas and not last.removing_replicas
    # each write of the state names the version before it
    versions = [w.expected_version for w in done.writes if isinstance(w, UpdatePartitionState)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def test_leader_inside_the_target_keeps_leading_with_a_new_epoch():
    image = with_topic(cluster(1, 2, 3), ((1, 2),))
    started_ = reassign(image, (1, 3)).image
    done = isr_proposal(started_, (1, 2, 3)).image
    reg = done.registration(T0)
    assert reg.leader == 1 and reg.isr == (1, 3)
    assert reg.leader_epoch > started_.registration(T0).leader_epoch
    assert done.topics["t"].assignment == ((1, 3),)


def test_target_already_in_sync_completes_at_once():
    image = with_topic(cluster(1, 2, 3), ((1, 2, 3),))
    result = reassign(image, (3, 2))
    topic = result.image.topics["t"]
    assert topic.assignment == ((3, 2),) and not topic.is_reassigning(0)
    reg = result.image.registration(T0)
    assert reg.leader == 3 and reg.isr == (2, 3)
    assert StopReplica(1, T0, topic.topic_id, delete=True) in result.notices


def test_reordering_replicas_only_rewrites_the_assignment():
    image = with_topic(cluster(1, 2), ((1, 2),))
    result = reassign(image, (2, 1))
    assert result.image.topics["t"].assignment == ((2, 1),)
    assert not result.image.topics["t"].is_reassigning(0)
    assert result.image.registration(T0).leader == 1  # a preferred election moves it later


def test_cancel_reverts_to_the_original_replicas_and_deletes_the_added_ones():
    _, result = started()
    caught_up = isr_proposal(result.image, (1, 2)).image  # 3 not in sync yet: still reassigning
    assert caught_up.topics["t"].is_reassigning(0)
    cancelled = handle(caught_up, PartitionReassignmentRequested({T0: None}))
    assert cancelled.response == {T0: (ErrorCode.NONE, None)}
    topic = cancelled.image.topics["t"]
    assert topic.assignment == ((2, 1),) and not topic.is_reassigning(0)  # Kafka's order
    assert StopReplica(3, T0, topic.topic_id, delete=True) in cancelled.notices
    reg = cancelled.image.registration(T0)
    assert reg.leader == 1 and reg.isr == (1, 2)


def test_cancel_of_an_in_sync_added_replica_takes_it_out_of_the_isr():
    image = with_topic(cluster(1, 2, 3, 4), ((1, 2),))
    image = reassign(image, (1, 3, 4)).image
    image = isr_proposal(image, (1, 2, 3)).image  # 4 still missing
    cancelled = handle(image, PartitionReassignmentRequested({T0: None}))
    reg = cancelled.image.registration(T0)
    assert reg.isr == (1, 2) and reg.leader == 1
    assert cancelled.image.topics["t"].assignment == ((1, 2),)
    stopped = {n.broker_id for n in cancelled.notices if isinstance(n, StopReplica)}
    assert stopped == {3, 4}


def test_cancel_when_only_added_replicas_are_in_sync_elects_an_original_replica_unclean():
    image = with_topic(cluster(1, 2, 3), ((1,),))
    image = reassign(image, (2, 3)).image
    image = isr_proposal(image, (1, 2)).image  # 3 missing: still reassigning
    image = handle(image, BrokerFailed(1)).image
    assert image.registration(T0).leader == 2 and image.registration(T0).isr == (2,)
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=200))).image
    cancelled = handle(image, PartitionReassignmentRequested({T0: None})).image
    assert cancelled.topics["t"].assignment == ((1,),)
    reg = cancelled.registration(T0)
    assert (reg.leader, reg.isr) == (1, (1,))
    assert reg.leader_recovery_state == LeaderRecoveryState.RECOVERING


def test_cancel_with_no_original_replica_alive_leaves_the_partition_leaderless():
    image = with_topic(cluster(1, 2, 3), ((1,),))
    image = reassign(image, (2, 3)).image
    image = isr_proposal(image, (1, 2)).image
    image = handle(image, BrokerFailed(1)).image
    cancelled = handle(image, PartitionReassignmentRequested({T0: None}))
    reg = cancelled.image.registration(T0)
    assert (reg.leader, reg.isr) == (NO_LEADER, (1,))
    assert {n.broker_id for n in cancelled.notices if isinstance(n, StopReplica)} == {2, 3}


def test_a_new_target_replaces_the_one_in_progress_from_the_original_replicas():
    _, result = started()  # {1,2} -> {2,3}
    again = reassign(result.image, (1, 3))
    topic = again.image.topics["t"]
    assert topic.assignment == ((1, 3, 2),)
    assert dict(topic.adding_replicas) == {0: (3,)} and dict(topic.removing_replicas) == {0: (2,)}
    back = reassign(again.image, (1, 2))  # the original again: nothing added, 3 removed
    assert back.image.topics["t"].assignment == ((1, 2),)
    assert any(isinstance(n, StopReplica) and n.broker_id == 3 for n in back.notices)


def test_a_failed_replica_leaves_the_isr_and_the_reassignment_goes_on():
    _, result = started()
    failed = handle(result.image, BrokerFailed(1)).image
    assert failed.topics["t"].is_reassigning(0)  # 3 is not in sync yet
    assert failed.registration(T0).leader == 2 and failed.registration(T0).isr == (2,)
    done = isr_proposal(failed, (2, 3)).image
    assert done.topics["t"].assignment == ((2, 3),) and done.registration(T0).leader == 2


def test_failover_completes_reassignments_found_in_sync():
    _, result = started()
    done = isr_proposal(result.image, (1, 2, 3)).image
    # the same state found in the store by a new controller before completion was written
    image = result.image
    topic = image.topics["t"]
    reg = image.registration(T0)
    synced = replace(topic, partitions=frozen_map({0: replace(reg, isr=(1, 2, 3))}))
    image = replace(image, topics=frozen_map({"t": synced}))
    after = handle(image, ControllerFailover(image.controller_epoch + 1)).image
    assert after.topics["t"].assignment == done.topics["t"].assignment == ((2, 3),)
    assert after.registration(T0).leader == 2


def test_per_partition_errors_are_kafkas():
    image = with_topic(cluster(1, 2, 3), ((1, 2),))
    image = handle(image, BrokerFailed(3)).image
    result = handle(image, PartitionReassignmentRequested({
        TopicPartition("nope", 0): (1,),
        TopicPartition("t", 5): (1,),
        TopicPartition("t", 0): None,
    }))
    assert result.response[TopicPartition("nope", 0)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert result.response[TopicPartition("t", 5)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert result.response[T0] == (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None)
    assert result.writes == () and result.image.topics == image.topics
    for target, words in [((), "Empty replica list"), ((1, 1), "Duplicate replica ids"),
                          ((1, -1), "Invalid broker id"), ((1, 9), "not alive"),
                          ((1, 3), "not alive")]:
        code, message = reassign(image, target).response[T0]
        assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT and words in message, (target, message)


def test_partition_without_live_replicas_waits_for_one():
    image = with_topic(cluster(1, 2, 3), ((1, 2),))
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    reg = image.registration(T0)
    assert reg.leader == NO_LEADER
    result = reassign(image, (3,))
    assert result.response[T0][0] == ErrorCode.NONE
    assert result.image.topics["t"].is_reassigning(0)  # 3 cannot catch up without a leader
    assert result.image.registration(T0).leader_recovery_state == LeaderRecoveryState.RECOVERED
