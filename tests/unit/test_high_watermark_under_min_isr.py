"""KIP-966 on the leader: the high watermark does not advance while the ISR is under the
effective min.insync.replicas (min of the topic's setting and the replica count), so every
replica that left the ISR then (an eligible leader replica) holds all below it; once the ISR
is back at min ISR it catches up. ``clock`` is a ``MockClock``; no sockets."""

from __future__ import annotations

import pytest

from strata.common.clock import MockClock
from strata.common.errors import ErrorCode
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.protocol import records as rec
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager

TP = TopicPartition("t", 0)
ME = 1


@pytest.fixture
def manager(tmp_path):
    m = LogManager([tmp_path], LogConfig({}), scheduler=ImmediateScheduler())
    m.startup()
    yield m
    m.shutdown()


def replica_manager(manager, min_isr: int, clustered: bool = True) -> ReplicaManager:
    rm = ReplicaManager(manager, lambda topic: 1 if topic == "t" else None,
                        broker_id=ME, clustered=clustered)
    rm.clock = MockClock()
    rm.min_insync_replicas = lambda topic: min_isr
    return rm


def append(rm, n: int = 3) -> int:
    result = rm.append(TP, rec.build_batch([rec.SimpleRecord(b"v", b"k")] * n),
                       produce_version=9, required_acks=1)
    assert result.error == ErrorCode.NONE
    return result.last_offset + 1


def test_under_min_isr_the_high_watermark_stays_and_moves_once_the_isr_is_back(manager):
    rm = replica_manager(manager, min_isr=2)
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME, 2, 3))})
    end = append(rm)
    assert rm.get_log(TP).high_watermark == 0          # ISR {1} < min ISR 2
    assert rm.follower_fetch(TP, 2, end, -1, 1 << 20, 1).error == ErrorCode.NONE
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2, 3), partition_epoch=1)})
    assert rm.follower_fetch(TP, 2, end, -1, 1 << 20, 1).error == ErrorCode.NONE
    assert rm.get_log(TP).high_watermark == end


def test_a_min_isr_above_the_replica_count_is_capped_at_it(manager):
    rm = replica_manager(manager, min_isr=3)
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME,))})
    end = append(rm)
    assert rm.get_log(TP).high_watermark == end        # RF 1: the effective min ISR is 1


def acks_all(rm) -> ErrorCode:
    return rm.append(TP, rec.build_batch([rec.SimpleRecord(b"v", b"k")]), produce_version=9,
                     required_acks=-1).error


@pytest.mark.parametrize("clustered", [False, True])
def test_acks_all_takes_min_isr_capped_at_the_replica_count_as_kafka(manager, clustered):
    # Kafka's Partition.appendRecordsToLeader refuses acks=all while the ISR is under
    # min(min.insync.replicas, replicas): an RF 1 partition (one broker's) takes it at min ISR 2
    rm = replica_manager(manager, min_isr=2, clustered=clustered)
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME,))})
    assert acks_all(rm) == ErrorCode.NONE
    assert rm.enough_replicas_reached(TP, rm.get_log(TP).log_end_offset) == (True, ErrorCode.NONE)


def test_acks_all_under_the_capped_min_isr_is_refused_and_fits_once_at_it(manager):
    rm = replica_manager(manager, min_isr=3)   # RF 2: the effective min ISR is 2
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME, 2))})
    assert acks_all(rm) == ErrorCode.NOT_ENOUGH_REPLICAS
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 2), (ME, 2), partition_epoch=1)})
    assert acks_all(rm) == ErrorCode.NONE
