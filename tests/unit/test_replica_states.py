"""A clustered ReplicaManager follows the controller's partition states: it serves as leader only
what it leads, at the leader epoch, answers the rest with Kafka's errors, and never moves back
to an older state."""

from __future__ import annotations

import pytest

from strata.common.errors import ErrorCode
from strata.common.late_bound import LateBound
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.log.unified_log import FetchIsolation
from strata.protocol import records as rec
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager

TP = TopicPartition("t", 0)
ME = 2


@pytest.fixture
def parts():
    """The replica manager's parts made after it, set by a test as a broker sets them."""
    return {"fetchers": LateBound("follower fetchers"),
            "alter_partition": LateBound("AlterPartition sender")}


@pytest.fixture
def rm(tmp_path, parts):
    manager = LogManager([tmp_path], LogConfig({}), scheduler=ImmediateScheduler())
    manager.startup()
    yield ReplicaManager(manager, lambda topic: 2 if topic == "t" else None,
                         broker_id=ME, clustered=True, **parts)
    manager.shutdown()


def batch() -> bytes:
    return rec.build_batch([rec.SimpleRecord(b"v", b"k")])


def test_a_partition_without_a_state_here_is_not_led(rm):
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert rm.append(TopicPartition("t", 5), batch(), produce_version=9).error == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert rm.append(TopicPartition("u", 0), batch(), produce_version=9).error == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert rm.get_log(TP) is None  # a cluster makes logs only for hosted partitions


def test_a_leader_appends_at_its_leader_epoch_and_a_follower_refuses(rm):
    change = rm.apply_states({TP: PartitionState(ME, 4, (ME, 3), (ME, 3))})
    assert change.became_leader == (TP,)
    r = rm.append(TP, batch(), produce_version=9)
    assert r.error == ErrorCode.NONE
    ulog = rm.get_log(TP)
    assert ulog.leader_epoch_cache.latest_epoch() == 4
    change = rm.apply_states({TP: PartitionState(3, 5, (3,), (ME, 3))})
    assert change.stopped_leading == (TP,)
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert rm.read(TP, 0, 1000, FetchIsolation.HIGH_WATERMARK, True).error == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_state_older_than_the_one_held_is_ignored(rm):
    rm.apply_states({TP: PartitionState(3, 7, (3, ME), (ME, 3), 9)})
    change = rm.apply_states({TP: PartitionState(ME, 6, (ME,), (ME, 3), 8)})  # a stale controller
    assert change.became_leader == ()
    assert rm.state(TP).leader_epoch == 7 and rm.state(TP).leader == 3
    # same leader epoch, newer partition epoch (an ISR change): taken
    rm.apply_states({TP: PartitionState(3, 7, (3,), (ME, 3), 10)})
    assert rm.state(TP).isr == (3,)


def test_client_leader_epochs_are_checked_as_kafka_checks_them(rm):
    rm.apply_states({TP: PartitionState(ME, 4, (ME,), (ME,))})
    assert rm.list_offset(TP, -1, FetchIsolation.HIGH_WATERMARK, current_leader_epoch=3).error == \
        ErrorCode.FENCED_LEADER_EPOCH
    assert rm.list_offset(TP, -1, FetchIsolation.HIGH_WATERMARK, current_leader_epoch=5).error == \
        ErrorCode.UNKNOWN_LEADER_EPOCH
    assert rm.list_offset(TP, -1, FetchIsolation.HIGH_WATERMARK, current_leader_epoch=4).error == \
        ErrorCode.NONE
    assert rm.end_offset_for_epoch(TP, 3, 4)[0] == ErrorCode.FENCED_LEADER_EPOCH


def test_a_replica_no_longer_hosted_is_dropped(rm):
    rm.apply_states({TP: PartitionState(ME, 1, (ME,), (ME,))})
    change = rm.apply_states({TP: None})
    assert change.stopped_leading == (TP,)
    assert rm.state(TP) is None


def test_one_broker_is_a_cluster_of_one_its_metadata_grants_every_partition(tmp_path):
    """A broker alone: its metadata grants it every partition (leader at epoch 0, the ISR
    itself) when a topic or partitions are made, at startup for those it has, and takes them
    back when the topic is deleted; a record is committed as soon as it is appended."""
    from strata.broker.metadata_publisher import GrantedStatesPublisher, TopicLogsPublisher
    from strata.cluster.metadata import ClusterMetadata
    metadata = ClusterMetadata(tmp_path, 1, {})
    manager = LogManager([tmp_path], metadata.default_log_config(),
                         topic_config=metadata.log_config, scheduler=ImmediateScheduler())
    manager.startup()
    try:
        metadata.create_topic("before", 1)
        rm = ReplicaManager(manager, lambda t: (i.partitions if (i := metadata.topic(t)) else None),
                            broker_id=1)
        assert rm.state(TopicPartition("before", 0)) is None   # nothing granted yet
        metadata.add_listener(TopicLogsPublisher(manager, metadata))
        metadata.add_listener(GrantedStatesPublisher(rm))
        rm.apply_states(metadata.hosted_states())
        assert rm.state(TopicPartition("before", 0)) == PartitionState(1, 0, (1,), (1,))
        metadata.create_topic("t", 1)
        metadata.create_partitions("t", 2)
        for tp in (TopicPartition("t", 0), TopicPartition("t", 1)):
            assert rm.state(tp) == PartitionState(1, 0, (1,), (1,))
            r = rm.append(tp, batch(), produce_version=9, required_acks=-1)
            assert r.error == ErrorCode.NONE
            assert rm.get_log(tp).high_watermark == r.last_offset + 1
            assert rm.enough_replicas_reached(tp, r.last_offset + 1) == (True, ErrorCode.NONE)
            assert rm.get_log(tp).leader_epoch_cache.latest_epoch() == 0
        metadata.delete_topic("t")
        assert rm.state(TP) is None and rm.partition(TopicPartition("t", 1)) is None
        assert rm.append(TP, batch(), produce_version=9).error == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        manager.shutdown()


def test_a_leader_throttles_out_of_sync_followers_of_throttled_partitions_only(rm):
    """leader.replication.throttled.rate (KIP-73): while the rate is exceeded an out-of-sync
    follower of a throttled partition gets no records; an in-sync one still does."""
    from strata.common.clock import MockClock
    from strata.replication.quota import ReplicationQuota
    clock = MockClock()
    rm.leader_quota = ReplicationQuota(100, lambda tp: tp == TP, window_num=2,
                                       window_size_seconds=1, clock=clock)
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 3), (ME, 3, 4))})   # 4 is out of sync
    for _ in range(5):
        assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NONE
    first = rm.follower_fetch(TP, 4, 0, -1, 1 << 20, 1)
    assert first.error == ErrorCode.NONE and len(first.records) > 100   # under the rate: sent
    assert rm.leader_quota.is_quota_exceeded()
    held = rm.follower_fetch(TP, 4, 0, -1, 1 << 20, 1)
    assert held.error == ErrorCode.NONE and not held.records
    in_sync = rm.follower_fetch(TP, 3, 0, -1, 1 << 20, 1)
    assert in_sync.records   # the ISR is never throttled: acks=all does not wait on the throttle
    clock.sleep(5)
    assert rm.follower_fetch(TP, 4, 0, -1, 1 << 20, 1).records


def test_a_follower_becoming_leader_stops_its_fetcher_before_taking_the_new_epoch(rm, parts):
    """Kafka's makeLeader order: a batch the old leader's fetcher appends after the new epoch
    began would corrupt the leader epoch cache, so the fetcher lets go first."""
    seen = []

    class Fetchers:
        def add_partitions(self, states):
            seen.append(("add", dict(states)))

        def remove_partitions(self, tps):
            ulog = rm.get_log(TP)
            seen.append(("remove", list(tps), ulog.leader_epoch_cache.latest_epoch() if ulog else None,
                         rm.state(TP).leader if rm.state(TP) else None))
    parts["fetchers"].set(Fetchers())
    rm.apply_states({TP: PartitionState(3, 4, (3, ME), (ME, 3))})
    assert seen[-1] == ("add", {TP: (3, 4)})
    rm.apply_states({TP: PartitionState(ME, 5, (3, ME), (ME, 3))})
    first = next(e for e in seen if e[0] == "remove")
    assert first == ("remove", [TP], None, 3)   # still following, epoch 5 not yet taken
    assert rm.get_log(TP).leader_epoch_cache.latest_epoch() == 5
    # a stale state (lower epoch) naming this broker leader does not stop the fetcher
    seen.clear()
    rm.apply_states({TP: PartitionState(3, 6, (3, ME), (ME, 3))})
    seen.clear()
    rm.apply_states({TP: PartitionState(ME, 5, (ME,), (ME, 3), -1)})
    assert [e for e in seen if e[0] == "remove"] == []


def test_an_append_at_an_epoch_older_than_the_logs_is_refused(rm):
    """A produce that read the leader epoch just before a new leadership began (under the log
    lock) must not append after the new epoch's start: it gets NOT_LEADER_OR_FOLLOWER and
    retries. The fault loop found followers looping on a diverging epoch without this."""
    from strata.common.errors import KafkaError
    rm.apply_states({TP: PartitionState(ME, 4, (ME,), (ME,))})
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NONE
    rm.apply_states({TP: PartitionState(ME, 5, (ME,), (ME,), 1)})
    ulog = rm.get_log(TP)
    with pytest.raises(KafkaError) as err:
        ulog.append_as_leader(batch(), 4)
    assert err.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert ulog.leader_epoch_cache.latest_epoch() == 5
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NONE


def test_a_parked_fetch_read_again_does_not_record_the_follower_again(rm, parts):
    """Kafka's DelayedFetch: the follower's position is recorded when its Fetch arrives. A
    re-read after the wait (record=False) must not take an out-of-sync follower back into the
    ISR: the follower may be gone since."""
    from concurrent.futures import Future

    proposals = []

    class Sender:
        def submit(self, tp, leader_epoch, partition_epoch, isr, broker_epochs=None):
            proposals.append(isr)
            return Future()   # left pending

    parts["alter_partition"].set(Sender())
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 3), (ME, 3, 4))})   # 4 is out of sync
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NONE
    end = rm.get_log(TP).log_end_offset
    assert rm.follower_fetch(TP, 3, end, -1, 1 << 20, 1).error == ErrorCode.NONE   # HW = end
    rm.follower_fetch(TP, 4, end, -1, 1 << 20, 1, record=False)
    assert proposals == []
    rm.follower_fetch(TP, 4, end, -1, 1 << 20, 1)   # a Fetch that arrives: recorded
    assert proposals == [(ME, 3, 4)]


def test_an_isr_expansion_names_the_broker_epoch_the_follower_fetched_at(rm, parts):
    """KIP-903: the follower's registration when its fetch arrived goes with the proposal, so
    the controller refuses it if that incarnation is gone (the same broker id registered again,
    say with an empty disk, before the proposal reached it)."""
    from concurrent.futures import Future

    proposals = []

    class Sender:
        def submit(self, tp, leader_epoch, partition_epoch, isr, broker_epochs=None):
            proposals.append((isr, broker_epochs))
            return Future()   # left pending

    epochs = {3: 300, 4: 400}
    parts["alter_partition"].set(Sender())
    rm.broker_epoch_of = lambda broker: epochs.get(broker, -1)
    rm.apply_states({TP: PartitionState(ME, 1, (ME, 3), (ME, 3, 4))})   # 4 is out of sync
    assert rm.append(TP, batch(), produce_version=9).error == ErrorCode.NONE
    end = rm.get_log(TP).log_end_offset
    rm.follower_fetch(TP, 3, end, -1, 1 << 20, 1)
    rm.follower_fetch(TP, 4, end, -1, 1 << 20, 1)   # caught up, fetching as epoch 400
    epochs[4] = 401                                 # registered again since
    assert proposals == [((ME, 3, 4), {4: 400})]    # only the member added is checked
