"""A leader whose ZooKeeper session is in doubt holds back what only a leader may do: the high
watermark stays, acks=all waits are not completed and no ISR change is proposed; once the
lease is held again the high watermark catches up and the waiters are woken. One broker
without ZooKeeper (``ALWAYS_HELD``) is never held back.

The lease is the real ``ZkSessionLease`` driven by the reports the ZooKeeper client makes;
time is a ``MockClock``."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from strata.cluster.zk.session_lease import ZkSessionLease
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode
from strata.common.leadership_lease import ALWAYS_HELD
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.protocol import records as rec
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager
from support.replicas import lead_alone

TP = TopicPartition("t", 0)
ME = 1
LAG_MS = 10_000


class Sender:
    """``alter_partition``: records each proposal and leaves it pending."""

    def __init__(self):
        self.proposals: list[tuple[int, ...]] = []

    def submit(self, tp, leader_epoch, partition_epoch, new_isr, leader_recovery_state=0,
               broker_epochs=None):
        self.proposals.append(tuple(new_isr))
        return Future()


@pytest.fixture
def manager(tmp_path):
    m = LogManager([tmp_path], LogConfig({}), scheduler=ImmediateScheduler())
    m.startup()
    yield m
    m.shutdown()


@pytest.fixture
def lease():
    lease = ZkSessionLease()
    lease.connected()
    return lease


@pytest.fixture
def woken():
    return []


@pytest.fixture
def rm(manager, lease, woken):
    rm = ReplicaManager(manager, lambda topic: 1 if topic == "t" else None,
                        on_append=woken.append, broker_id=ME, clustered=True, lease=lease,
                        alter_partition=Sender())
    rm.clock = MockClock()
    rm.replica_lag_time_max_ms = LAG_MS
    return rm


def batch(n: int = 1) -> bytes:
    return rec.build_batch([rec.SimpleRecord(b"v", b"k")] * n)


def acks_all(rm) -> int:
    """Appends one record with acks=all; the offset the high watermark must pass."""
    result = rm.append(TP, batch(), produce_version=9, required_acks=-1)
    assert result.error == ErrorCode.NONE
    return result.last_offset + 1


def fetch(rm, replica: int) -> None:
    """The follower fetches at the leader's log end offset (it holds everything)."""
    end = rm.get_log(TP).log_end_offset
    assert rm.follower_fetch(TP, replica, end, -1, 1 << 20, 1).error == ErrorCode.NONE


def test_while_in_doubt_the_high_watermark_stays_and_acks_all_waits_then_both_catch_up(
        rm, lease, woken):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    required = acks_all(rm)
    lease.suspended()
    fetch(rm, 2)                          # the follower has it: HW would move
    hw = rm.get_log(TP).high_watermark
    assert hw == 0
    assert rm.enough_replicas_reached(TP, required) == (False, ErrorCode.NONE)
    woken.clear()
    lease.connected()                     # the same session: held again
    assert rm.get_log(TP).high_watermark == required
    assert TP in woken                    # the acks=all waiter is woken, not left to time out
    assert rm.enough_replicas_reached(TP, required) == (True, ErrorCode.NONE)


def test_a_record_already_below_the_high_watermark_is_not_acknowledged_while_in_doubt(
        rm, lease, woken):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    required = acks_all(rm)
    fetch(rm, 2)
    assert rm.get_log(TP).high_watermark == required
    lease.suspended()                     # before the produce's waiter looked again
    assert rm.enough_replicas_reached(TP, required) == (False, ErrorCode.NONE)
    woken.clear()
    lease.connected()
    assert woken == [TP]                  # the HW did not move, the waiter is woken anyway
    assert rm.enough_replicas_reached(TP, required) == (True, ErrorCode.NONE)


def test_after_an_expiry_nothing_is_acknowledged_until_the_new_session_is_initialised(
        rm, lease):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    required = acks_all(rm)
    token = lease.expired()
    lease.connected()                     # a new session; re-registration not yet done
    fetch(rm, 2)
    assert rm.get_log(TP).high_watermark == 0
    assert rm.enough_replicas_reached(TP, required) == (False, ErrorCode.NONE)
    lease.session_initialized(token)
    assert rm.enough_replicas_reached(TP, required) == (True, ErrorCode.NONE)


def test_a_leadership_lost_while_in_doubt_answers_not_leader(rm, lease):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    required = acks_all(rm)
    lease.suspended()
    rm.apply_states({TP: PartitionState(2, 2, (2,), (ME, 2))})
    assert rm.enough_replicas_reached(TP, required) == (True, ErrorCode.NOT_LEADER_OR_FOLLOWER)


def test_no_isr_expansion_is_proposed_while_in_doubt(rm, lease):
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME, 2))})
    acks_all(rm)
    lease.suspended()
    fetch(rm, 2)                          # caught up: would join the ISR
    assert rm.alter_partition.proposals == []
    lease.connected()
    fetch(rm, 2)                          # its next fetch proposes it
    assert rm.alter_partition.proposals == [(ME, 2)]


def test_no_isr_shrink_is_proposed_while_in_doubt(rm, lease):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    lease.suspended()
    rm.clock.advance_ms(LAG_MS + 1)       # follower 2 has not caught up for too long
    rm.shrink_isrs()
    assert rm.alter_partition.proposals == []
    lease.connected()
    rm.shrink_isrs()
    assert rm.alter_partition.proposals == [(ME,)]


def test_appends_and_follower_fetches_go_on_while_in_doubt(rm, lease):
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2))})
    lease.suspended()
    assert rm.append(TP, batch(3), produce_version=9, required_acks=1).error == ErrorCode.NONE
    result = rm.follower_fetch(TP, 2, 0, -1, 1 << 20, 1)
    assert result.error == ErrorCode.NONE and result.records


def test_one_broker_without_zookeeper_is_never_held_back(manager):
    rm = ReplicaManager(manager, lambda topic: 1, broker_id=1)
    lead_alone(rm, TP)
    assert rm.lease is ALWAYS_HELD
    required = acks_all(rm)
    assert rm.get_log(TP).high_watermark == required
    assert rm.enough_replicas_reached(TP, required) == (True, ErrorCode.NONE)
