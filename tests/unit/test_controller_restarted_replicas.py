"""A replica knows what it holds (issue 51, scenario 2): the controller's rules for brokers that
come back without their data, and for ISR proposals that name an earlier incarnation.

- KIP-858: a broker registering without a log directory id it last registered with lost that
  directory: it leaves every ISR, the last member's too (the partition then waits for a
  replica with the data, unless unclean election is on);
- KIP-966's unclean shutdown detection: a broker whose logs were not closed cleanly leaves the
  ISRs and ELRs (it may lack what the others acknowledged); with no ISR or ELR member left, the
  last known leader may lead again (balanced recovery, RECOVERING) unless it lost its log;
- both before any election of the event, at registration and at controller failover alike, and
  the handled registration is recorded so that a later controller does not handle it again;
- KIP-903: AlterPartition refuses a new ISR member whose broker epoch (as the leader saw it
  fetch) is not its registration's, with INELIGIBLE_REPLICA.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller_events import (
    AlterPartition, BrokerFailed, BrokerRegistered, ControllerFailover, SetBrokerDirectories,
    TopicCreated, UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import (
    NO_LEADER, BrokerDirectories, BrokerRegistration, LeaderRecoveryState, MetadataImage,
    frozen_map)
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition

T0 = TopicPartition("t", 0)


def disk(broker: int, generation: int = 0) -> uuid.UUID:
    return uuid.UUID(int=broker * 1000 + generation)


def registration(broker: int, epoch: int, generation: int = 0,
                 clean: bool = True) -> BrokerRegistration:
    return BrokerRegistration(broker, epoch=epoch, directory_ids=(disk(broker, generation),),
                              clean_shutdown=clean)


def cluster(*ids: int, unclean: bool = False) -> MetadataImage:
    image = MetadataImage(unclean_leader_election_enable=unclean)
    for i in ids:
        image = handle(image, BrokerRegistered(registration(i, 100 + i))).image
    return image


def with_topic(image: MetadataImage, *replicas: int) -> MetadataImage:
    return handle(image, TopicCreated("t", uuid.uuid4(), assignment=(tuple(replicas),))).image


def reg(image: MetadataImage):
    return image.registration(T0)


def as_read_by_next_controller(image: MetadataImage, dead=(), restarted=()) -> MetadataImage:
    """The store as a controller elected next reads it: ``dead`` brokers' registrations gone,
    ``restarted`` ones (BrokerRegistrations) in place of the old, the records and partition
    states as the previous controller left them."""
    brokers = {i: b for i, b in image.brokers.items() if i not in dead}
    brokers.update({r.id: r for r in restarted})
    return replace(image, brokers=frozen_map(brokers), controller_epoch=4)


# --- the scenario: the follower's disk is wiped, then the leader dies ---------------

def test_a_wiped_follower_found_at_failover_leaves_the_isr_before_the_dead_leader_does():
    """RF 2: the leader (also the controller) dies right after its follower came back with an
    empty disk; the next controller must not elect the empty replica."""
    image = with_topic(cluster(1, 2), 1, 2)
    stale = as_read_by_next_controller(image, dead=[1],
                                       restarted=[registration(2, 500, generation=1, clean=False)])
    result = handle(stale, ControllerFailover(5))
    r = reg(result.image)
    # offline: waits for the replica with data
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (1,), (1,))
    assert result.image.broker_directories[2] == BrokerDirectories((disk(2, 1),), 500)
    # the old leader comes back (killed: not a clean shutdown) and is the one to lead, as the
    # last known leader (balanced recovery)
    back = reg(handle(result.image, BrokerRegistered(registration(1, 600, clean=False))).image)
    assert (back.leader, back.isr, back.elr) == (1, (1,), ())
    assert back.leader_recovery_state == LeaderRecoveryState.RECOVERING


def test_with_rf_3_the_replica_that_kept_its_data_is_elected_not_the_wiped_one():
    image = with_topic(cluster(1, 2, 3), 1, 2, 3)
    stale = as_read_by_next_controller(image, dead=[1],
                                       restarted=[registration(2, 500, generation=1, clean=False)])
    r = reg(handle(stale, ControllerFailover(5)).image)
    assert (r.leader, r.isr) == (3, (3,))


def test_the_wiped_replica_is_out_of_the_isr_before_an_election_in_the_same_event():
    """Seen by the controller after its failure: the broker left the ISR when it failed, as
    its last member into the ELR and the last known ELR; it leaves both on registering."""
    image = with_topic(cluster(1, 2), 1, 2)
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    assert (reg(image).leader, reg(image).isr, reg(image).elr) == (NO_LEADER, (), (1,))
    result = handle(image, BrokerRegistered(registration(1, 700, generation=1, clean=False)))
    r = reg(result.image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (), ())
    assert r.leader_epoch == reg(image).leader_epoch  # neither leader nor ISR changed
    # writes: the ISR change first, the handled registration last
    assert [type(w) for w in result.writes] == [UpdatePartitionState, SetBrokerDirectories]
    # broker 2 (out of sync when it failed) is no clean candidate either
    r = reg(handle(result.image, BrokerRegistered(registration(2, 800))).image)
    assert (r.leader, r.isr) == (NO_LEADER, ())


def test_with_unclean_election_a_partition_that_lost_its_only_in_sync_replica_elects_unclean():
    image = with_topic(cluster(1, 2, unclean=True), 1, 2)
    image = handle(image, BrokerFailed(2)).image
    image = handle(image, BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(registration(2, 800))).image  # elected unclean
    assert (reg(image).leader, reg(image).leader_recovery_state) == (
        2, LeaderRecoveryState.RECOVERING)


def test_a_wiped_leader_hands_its_partitions_to_the_next_live_isr_member():
    image = with_topic(cluster(1, 2, 3), 1, 2, 3)
    stale = as_read_by_next_controller(image, restarted=[registration(1, 500, generation=1,
                                                                      clean=False)])
    r = reg(handle(stale, ControllerFailover(5)).image)
    assert (r.leader, r.isr, r.leader_epoch) == (2, (2, 3), 1)


# --- unclean shutdown, same directory ------------------------------------------------------

def test_after_an_unclean_shutdown_a_broker_leaves_the_isrs_it_shares():
    image = with_topic(cluster(1, 2), 1, 2)
    stale = as_read_by_next_controller(image, restarted=[registration(1, 500, clean=False)])
    r = reg(handle(stale, ControllerFailover(5)).image)
    assert (r.leader, r.isr) == (2, (2,))


def test_after_an_unclean_shutdown_the_only_in_sync_replica_leads_again():
    """Nobody holds more than the last ISR member: without it the partition would wait for
    an unclean election for nothing."""
    image = with_topic(cluster(1, 2), 1)
    image = handle(image, BrokerFailed(1)).image
    r = reg(handle(image, BrokerRegistered(registration(1, 500, clean=False))).image)
    assert (r.leader, r.isr) == (1, (1,))


def test_a_clean_restart_with_its_directory_keeps_its_isrs():
    image = with_topic(cluster(1, 2), 1, 2)
    stale = as_read_by_next_controller(image, restarted=[registration(2, 500)])
    result = handle(stale, ControllerFailover(5))
    assert (reg(result.image).leader, reg(result.image).isr) == (1, (1, 2))
    assert result.image.broker_directories[2].broker_epoch == 500


def test_a_handled_registration_is_not_handled_again_by_the_next_controller():
    image = with_topic(cluster(1, 2), 1, 2)
    image = handle(image, BrokerRegistered(registration(2, 500, clean=False))).image
    assert reg(image).isr == (1,)
    # the leader takes it back once it caught up
    r = reg(image)
    image = handle(image, AlterPartition(1, 101, "t", 0, r.leader_epoch, r.partition_epoch,
                                         (1, 2), new_isr_broker_epochs=(101, 500))).image
    assert reg(image).isr == (1, 2)
    result = handle(replace(image, controller_epoch=4), ControllerFailover(5))
    assert reg(result.image).isr == (1, 2)
    assert not any(isinstance(w, SetBrokerDirectories) for w in result.writes)


def test_a_registration_without_directory_ids_is_not_taken_for_a_lost_disk():
    """Kafka's brokers and older Strata's say nothing of their directories."""
    image = with_topic(cluster(1, 2), 1, 2)
    stale = as_read_by_next_controller(image, restarted=[BrokerRegistration(2, epoch=500)])
    assert reg(handle(stale, ControllerFailover(5)).image).isr == (1, 2)


def test_a_broker_that_gained_a_directory_did_not_lose_one():
    image = with_topic(cluster(1, 2), 1, 2)
    more = BrokerRegistration(2, epoch=500, directory_ids=(disk(2), disk(2, 7)))
    stale = as_read_by_next_controller(image, restarted=[more])
    assert reg(handle(stale, ControllerFailover(5)).image).isr == (1, 2)


# --- KIP-903: broker epochs in AlterPartition -----------------------------------------------

def expand(image: MetadataImage, epochs):
    r = reg(image)
    return handle(image, AlterPartition(1, 101, "t", 0, r.leader_epoch, r.partition_epoch,
                                        (1, 2), new_isr_broker_epochs=epochs))


def test_an_isr_expansion_with_an_earlier_incarnations_epoch_is_ineligible_replica():
    """The leader's fetch state of broker 2 is from before its restart (epoch 102): the new
    incarnation (epoch 500) has not caught up and must not be admitted on it."""
    image = with_topic(cluster(1, 2), 1, 2)
    image = handle(image, BrokerRegistered(registration(2, 500, generation=1, clean=False))).image
    assert reg(image).isr == (1,)
    refused = expand(image, (101, 102))
    assert refused.response.error == ErrorCode.INELIGIBLE_REPLICA
    assert refused.image is image and refused.writes == ()
    assert expand(image, (101, 500)).response.error == ErrorCode.NONE
    assert expand(image, (-1, -1)).response.error == ErrorCode.NONE   # -1: not checked
    assert expand(image, None).response.error == ErrorCode.NONE       # v2: no epochs
