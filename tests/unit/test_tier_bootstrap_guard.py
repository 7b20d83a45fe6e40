"""KIP-1303's guard: a replica rebuilt from the remote tier is reported until its local log
spans ``leader.election.eligible.local.log.ms`` or ``.bytes``, and the controller elects it
only when no other replica may lead. Manual clock; no ZooKeeper (the reporter is a list)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller_events import (
    AlterPartition, AutoLeaderRebalance, BrokerFailed, BrokerRegistered, ElectionType,
    ElectLeaders, TierBootstrappedReplicas, TopicCreated)
from strata.cluster.controller_logic import handle
from strata.cluster.image import BrokerRegistration, MetadataImage
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.replication.tier_bootstrap_guard import TierBootstrapGuard

TP = TopicPartition("t", 0)


class Reports:
    def __init__(self):
        self.epoch = 7
        self.made: list[tuple[int, frozenset]] = []

    def registration_epoch(self) -> int:
        return self.epoch

    def report_tier_bootstrapped(self, broker_epoch, partitions) -> None:
        self.made.append((broker_epoch, partitions))


def guard(sizes: dict, ms: int = 1000, min_bytes: int = 100):
    reports, clock = Reports(), MockClock()
    return TierBootstrapGuard(sizes.get, reports, local_log_ms=ms, local_log_min_bytes=min_bytes,
                              clock=clock), reports, clock


def test_a_rebuilt_replica_is_reported_until_its_local_log_spans_the_time():
    sizes = {TP: 10}
    g, reports, clock = guard(sizes)
    g.bootstrapped(TP)
    assert g.poll() == {TP} and reports.made == [(7, frozenset({TP}))]
    clock.advance_ms(999)
    assert g.poll() == {TP} and len(reports.made) == 1     # unchanged: not reported again
    clock.advance_ms(1)
    assert g.poll() == frozenset() and reports.made[-1] == (7, frozenset())


def test_or_until_it_holds_the_bytes():
    sizes = {TP: 10}
    g, reports, _ = guard(sizes)
    g.bootstrapped(TP)
    g.poll()
    sizes[TP] = 100
    assert g.poll() == frozenset()


def test_a_replica_whose_log_is_gone_is_dropped_and_negative_thresholds_turn_the_guard_off():
    g, _, _ = guard({})
    g.bootstrapped(TP)
    assert g.poll() == frozenset()
    off, reports, _ = guard({TP: 0}, ms=-1, min_bytes=-1)
    off.bootstrapped(TP)
    assert off.poll() == frozenset() and reports.made == []


def test_a_new_registration_is_told_again():
    g, reports, _ = guard({TP: 0})
    g.bootstrapped(TP)
    g.poll()
    reports.epoch = 8
    g.poll()
    assert reports.made == [(7, frozenset({TP})), (8, frozenset({TP}))]


# --- the controller ----------------------------------------------------------------------------

def cluster() -> MetadataImage:
    image = MetadataImage(controller_epoch=1)
    for b in (1, 2, 3):
        image = handle(image, BrokerRegistered(BrokerRegistration(b, epoch=100 + b))).image
    return handle(image, TopicCreated("t", uuid.UUID(int=1), assignment=((1, 2, 3),))).image


def test_the_leaders_failure_elects_a_replica_with_more_local_log_first():
    image = handle(cluster(), TierBootstrappedReplicas(2, 102, frozenset({TP}))).image
    assert image.tier_bootstrapped == {2: frozenset({TP})}
    r = handle(image, BrokerFailed(1)).image.registration(TP)
    assert (r.leader, r.isr) == (3, (2, 3))


def test_it_leads_when_nobody_else_can():
    image = handle(cluster(), TierBootstrappedReplicas(2, 102, frozenset({TP}))).image
    image = handle(image, BrokerFailed(3)).image
    assert handle(image, BrokerFailed(1)).image.registration(TP).leader == 2


def test_the_automatic_rebalance_leaves_a_guarded_preferred_replica_an_operator_does_not():
    image = handle(replace(cluster(), leader_imbalance_per_broker_percentage=0),
                   BrokerFailed(1)).image
    image = handle(image, BrokerRegistered(BrokerRegistration(1, epoch=201))).image
    image = handle(image, AlterPartition(2, 102, "t", 0, *epochs(image), (2, 3, 1))).image
    image = handle(image, TierBootstrappedReplicas(1, 201, frozenset({TP}))).image
    assert handle(image, AutoLeaderRebalance()).image.registration(TP).leader == 2
    result = handle(image, ElectLeaders((TP,), ElectionType.PREFERRED))
    assert result.response[TP] == ErrorCode.NONE and result.image.registration(TP).leader == 1
    image = handle(image, TierBootstrappedReplicas(1, 201, frozenset())).image
    assert image.tier_bootstrapped == {}
    assert handle(image, AutoLeaderRebalance()).image.registration(TP).leader == 1


def epochs(image):
    reg = image.registration(TP)
    return reg.leader_epoch, reg.partition_epoch


def test_reports_of_another_registration_or_of_replicas_not_hosted_are_ignored():
    image = cluster()
    assert handle(image, TierBootstrappedReplicas(2, 99, frozenset({TP}))).image is image
    other = TopicPartition("t", 5)
    assert handle(image, TierBootstrappedReplicas(2, 102, frozenset({other}))).image is image


def test_a_new_registration_starts_unguarded():
    image = handle(cluster(), TierBootstrappedReplicas(2, 102, frozenset({TP}))).image
    image = handle(image, BrokerRegistered(BrokerRegistration(2, epoch=300))).image
    assert image.tier_bootstrapped == {}
