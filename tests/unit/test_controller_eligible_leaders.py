"""Eligible Leader Replicas (KIP-966) in the controller's decisions, mirroring Kafka 4's
``ReplicationControlManagerTest.testEligibleLeaderReplicas_*`` (a broker fenced there is a
``BrokerFailed`` here; an unclean shutdown is a registration without the clean-shutdown marker)
plus the znode round trip and Strata's rules for brokers that lost their log.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller_events import (
    AlterPartition, BrokerFailed, BrokerRegistered, ControllerFailover, TopicConfigsChanged,
    TopicCreated, TopicDeleted)
from strata.cluster.controller_logic import handle
from strata.cluster.eligible_leaders import with_eligible_leaders
from strata.cluster.image import (
    NO_LEADER, BrokerRegistration, LeaderRecoveryState, MetadataImage, PartitionRegistration,
    frozen_map)
from strata.cluster.zk.znodes import decode_partition_state, encode_partition_state
from strata.common.types import TopicPartition

T0 = TopicPartition("foo", 0)
MIN_ISR = "min.insync.replicas"


def disk(broker: int, generation: int = 0) -> uuid.UUID:
    return uuid.UUID(int=broker * 1000 + generation)


def registration(broker: int, epoch: int, clean: bool = True, generation: int = 0):
    return BrokerRegistration(broker, epoch=epoch, directory_ids=(disk(broker, generation),),
                              clean_shutdown=clean)


def cluster(*brokers: int, elr: bool = True) -> MetadataImage:
    image = replace(MetadataImage(controller_epoch=1), eligible_leader_replicas_enabled=elr)
    for b in brokers:
        image = handle(image, BrokerRegistered(registration(b, 100 + b))).image
    return image


def with_topic(image: MetadataImage, replicas: tuple[int, ...], min_isr: int | None = None):
    configs = {} if min_isr is None else {MIN_ISR: str(min_isr)}
    return handle(image, TopicCreated("foo", uuid.UUID(int=7), assignment=(replicas,),
                                      configs=frozen_map(configs))).image


def fence(image: MetadataImage, *brokers: int) -> MetadataImage:
    for b in brokers:
        image = handle(image, BrokerFailed(b)).image
    return image


def unfence(image: MetadataImage, *brokers: int, clean: bool = True) -> MetadataImage:
    for b in brokers:
        image = handle(image, BrokerRegistered(registration(b, image.brokers[b].epoch + 10,
                                                            clean))).image
    return image


def alter_isr(image: MetadataImage, *isr: int) -> MetadataImage:
    reg = image.registration(T0)
    result = handle(image, AlterPartition(reg.leader, image.brokers[reg.leader].epoch, "foo", 0,
                                          reg.leader_epoch, reg.partition_epoch, isr))
    assert result.response.error == 0
    return result.image


def part(image: MetadataImage) -> PartitionRegistration:
    return image.registration(T0)


def test_shrinking_the_isr_below_min_isr_keeps_the_removed_members_as_eligible_leaders():
    """testEligibleLeaderReplicas_ShrinkAndExpandIsr"""
    image = with_topic(cluster(0, 1, 2), (0, 1, 2))
    image = handle(image, TopicConfigsChanged("foo", frozen_map({MIN_ISR: "2"}))).image
    image = alter_isr(image, 0)
    assert (part(image).elr, part(image).last_known_elr) == ((1, 2), ())
    image = alter_isr(image, 0, 1)
    assert (part(image).elr, part(image).last_known_elr) == ((), ())


def test_fenced_brokers_join_the_elr_once_the_isr_is_below_min_isr():
    """testEligibleLeaderReplicas_BrokerFence"""
    image = with_topic(cluster(0, 1, 2, 3), (0, 1, 2, 3), min_isr=3)
    image = fence(image, 2, 3)
    assert (part(image).isr, part(image).elr, part(image).last_known_elr) == ((0, 1), (3,), ())
    image = fence(image, 1)
    assert (part(image).isr, part(image).elr, part(image).last_known_elr) == ((0,), (1, 3), ())
    image = unfence(image, 1, 2, 3)
    assert (part(image).leader, part(image).elr) == (0, (1, 3))


def test_deleting_a_topic_takes_its_eligible_leaders_with_it():
    """testEligibleLeaderReplicas_DeleteTopic"""
    image = with_topic(cluster(0, 1, 2), (0, 1, 2), min_isr=2)
    image = alter_isr(image, 0)
    assert part(image).elr == (1, 2)
    image = handle(image, TopicDeleted("foo")).image
    assert "foo" not in image.topics


def test_the_effective_min_isr_is_at_most_the_replication_factor():
    """testEligibleLeaderReplicas_EffectiveMinIsr"""
    image = with_topic(cluster(0, 1, 2), (0, 1, 2), min_isr=5)
    assert image.effective_min_isr(T0) == 3


def test_with_the_isr_empty_a_live_elr_member_is_elected_cleanly():
    """testEligibleLeaderReplicas_CleanElection"""
    image = with_topic(cluster(0, 1, 2, 3), (0, 1, 2, 3), min_isr=3)
    image = fence(image, 1, 2, 3)
    assert (part(image).elr, part(image).last_known_elr) == ((2, 3), ())
    image = unfence(image, 2)
    image = fence(image, 0, 1)
    r = part(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (2, (2,), (0, 3), ())
    assert r.leader_recovery_state == LeaderRecoveryState.RECOVERED


def test_an_unclean_shutdown_leaves_the_elr_and_the_last_isr_member_is_the_last_known_leader():
    """testEligibleLeaderReplicas_UncleanShutdown"""
    image = with_topic(cluster(0, 1, 2, 3), (0, 1, 2, 3), min_isr=3)
    image = fence(image, 1, 2, 3)
    assert (part(image).elr, part(image).last_known_elr) == ((2, 3), ())
    image = unfence(image, 3, clean=False)
    assert (part(image).elr, part(image).last_known_elr) == ((2,), ())
    image = unfence(image, 0, clean=False)   # the leader, last in the ISR, bounces uncleanly
    r = part(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (2,), (0,))


def test_with_neither_isr_nor_elr_the_last_known_leader_leads_again_recovering():
    """Balanced recovery: RF 1 after a SIGKILL (an unclean shutdown) is served again, as the
    last known leader, marked RECOVERING as an unclean election is."""
    image = with_topic(cluster(0), (0,))
    image = fence(image, 0)
    assert (part(image).isr, part(image).elr, part(image).last_known_elr) == ((), (0,), (0,))
    image = unfence(image, 0, clean=False)
    r = part(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (0, (0,), (), ())
    assert r.leader_recovery_state == LeaderRecoveryState.RECOVERING


def test_a_replica_that_lost_its_log_is_neither_eligible_nor_the_last_known_leader():
    image = with_topic(cluster(0, 1), (0, 1), min_isr=2)
    image = fence(image, 1, 0)
    assert (part(image).isr, part(image).elr, part(image).last_known_elr) == ((), (0, 1), (0,))
    image = handle(image, BrokerRegistered(registration(0, 500, clean=False, generation=1))).image
    r = part(image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (1,), ())
    image = unfence(image, 1)   # it kept its data and shut down cleanly
    assert (part(image).leader, part(image).isr, part(image).elr) == (1, (1,), ())


def test_when_the_last_holder_shuts_down_uncleanly_it_becomes_the_last_known_leader():
    """Strata's rule beside Kafka's: the last ISR or ELR member out after an unclean shutdown
    is the last known leader (the earlier one left while it still held the data)."""
    image = with_topic(cluster(1, 3), (1, 3), min_isr=2)
    image = fence(alter_isr(image, 1), 3)    # ISR {1}, ELR {3}, 3 down
    image = unfence(image, 1, clean=False)   # the leader bounces uncleanly: ISR empties
    assert (part(image).elr, part(image).last_known_elr) == ((3,), (1,))
    image = unfence(image, 3, clean=False)
    r = part(image)
    assert (r.leader, r.isr, r.leader_recovery_state) == (3, (3,), LeaderRecoveryState.RECOVERING)


def test_a_controller_failover_that_finds_every_isr_member_dead_keeps_them_eligible():
    image = with_topic(cluster(1, 3), (1, 3), min_isr=2)
    stale = replace(image, brokers=frozen_map({}), controller_epoch=4)
    r = part(handle(stale, ControllerFailover(5)).image)
    assert (r.leader, r.isr, r.elr, r.last_known_elr) == (NO_LEADER, (), (1, 3), (3,))


def test_with_elr_disabled_nothing_is_kept():
    image = with_topic(cluster(0, 1, 2, elr=False), (0, 1, 2), min_isr=3)
    image = fence(image, 1, 2, 0)
    r = part(image)
    assert (r.isr, r.elr, r.last_known_elr) == ((0,), (), ())


def test_the_state_znode_carries_elr_and_last_known_elr_only_while_not_empty():
    reg = PartitionRegistration(leader=NO_LEADER, isr=(), leader_epoch=4, controller_epoch=2,
                                elr=(1, 3), last_known_elr=(2,))
    data = encode_partition_state(reg)
    assert b'"eligible_leader_replicas":[1,3]' in data and b'"last_known_elr":[2]' in data
    back = decode_partition_state(data, zk_version=7)
    assert (back.elr, back.last_known_elr, back.partition_epoch) == ((1, 3), (2,), 7)
    plain = encode_partition_state(PartitionRegistration(leader=1, isr=(1,)))
    assert b"eligible" not in plain and b"last_known" not in plain


def test_an_unclean_election_clears_the_elr():
    old = PartitionRegistration(leader=NO_LEADER, isr=(), elr=(2,), last_known_elr=(1,))
    new = old.with_leader_and_isr(3, (3,), LeaderRecoveryState.RECOVERING)
    out = with_eligible_leaders(old, new, min_isr=2, enabled=True)
    assert (out.elr, out.last_known_elr) == ((), ())
