"""The broker's metadata publishers decide against fakes: which deleted partitions have remote
data to delete, which logs a topic change makes or updates, and what a partition-state change
does to the replica manager, the logs, the remote tier and the two coordinators; when one broker
loads ``__transaction_state``; what changed replication throttles do to the quotas."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from strata.broker.metadata_publisher import (
    LeadershipPublisher, ReplicationThrottlesPublisher, TopicLogsPublisher,
    TransactionStateLoader)
from strata.common.config import LONG_MAX
from strata.common.types import TopicIdPartition, TopicPartition
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import StateChange

ME = 1
T_ID = uuid.UUID(int=7)


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict = field(default_factory=dict)


@dataclass
class FakeLog:
    remote_log_enabled: bool = False
    highest_offset_in_remote_storage: int = -1
    configs: list = field(default_factory=list)

    def update_config(self, config) -> None:
        self.configs.append(config)


class FakeLogs:
    def __init__(self, **logs: FakeLog):   # t_0=FakeLog(): partition 0 of topic t
        self.logs = {TopicPartition(k.rpartition("_")[0], int(k.rpartition("_")[2])): v
                     for k, v in logs.items()}
        self.created: list = []
        self.deleted: list[TopicPartition] = []

    def get_log(self, tp):
        return self.logs.get(tp)

    def get_or_create_log(self, tp, config):
        self.created.append((tp, config))
        return self.logs.setdefault(tp, FakeLog())

    def delete_log(self, tp) -> None:
        self.deleted.append(tp)
        self.logs.pop(tp, None)

    def update_cordoned_log_dirs(self, dirs) -> None:
        self.cordoned = list(dirs)


class FakeMetadata:
    def __init__(self, *topics: Topic):
        self.topics = {t.name: t for t in topics}

    def topic(self, name):
        return self.topics.get(name)

    def topic_config(self, info):
        return {"remote.storage.enable": info.configs.get("remote.storage.enable") == "true"}

    def log_config(self, name):
        return f"config of {name}"

    def cordoned_log_dirs(self):
        return ["/d2"]


class FakeRemoteTier:
    def __init__(self):
        self.deleted: list[list[TopicIdPartition]] = []
        self.wakes = 0
        self.configs: list = []

    def on_partitions_deleted(self, partitions) -> None:
        self.deleted.append(list(partitions))

    def wake(self) -> None:
        self.wakes += 1

    def reconfigure(self, rlm_config) -> None:
        self.configs.append(rlm_config)


def tp(topic: str, p: int) -> TopicPartition:
    return TopicPartition(topic, p)


def tidp(p: int) -> TopicIdPartition:
    return TopicIdPartition(T_ID, tp("t", p))


# ---- topic changes: the logs and the remote tier --------------------------------------------

def test_a_deleted_topic_that_never_tiered_has_its_logs_deleted_and_no_remote_data():
    logs, remote = FakeLogs(t_0=FakeLog(), t_1=FakeLog()), FakeRemoteTier()
    TopicLogsPublisher(logs, FakeMetadata(), remote).on_topic_deleted(Topic("t", T_ID, 2))
    assert logs.deleted == [tp("t", 0), tp("t", 1)]
    assert remote.deleted == []


def test_a_deleted_topic_has_remote_data_deleted_where_its_log_tiers_or_had_tiered():
    logs = FakeLogs(t_0=FakeLog(remote_log_enabled=True),
                    t_1=FakeLog(highest_offset_in_remote_storage=5),   # tiering since turned off
                    t_2=FakeLog())
    remote = FakeRemoteTier()
    TopicLogsPublisher(logs, FakeMetadata(), remote).on_topic_deleted(Topic("t", T_ID, 4))
    assert remote.deleted == [[tidp(0), tidp(1)]]
    assert logs.deleted == [tp("t", 0), tp("t", 1), tp("t", 2), tp("t", 3)]


def test_in_a_cluster_every_partition_of_a_deleted_tiered_topic_has_remote_data_deleted():
    """The leader of each partition's metadata partition removes its remote data, whether or not
    this broker hosts a replica of it."""
    logs, remote = FakeLogs(), FakeRemoteTier()
    topic = Topic("t", T_ID, 3, {"remote.storage.enable": "true"})
    TopicLogsPublisher(logs, FakeMetadata(), remote, create_logs=False).on_topic_deleted(topic)
    assert remote.deleted == [[tidp(0), tidp(1), tidp(2)]]


def test_in_a_cluster_a_deleted_topic_without_tiering_has_no_remote_data_deleted():
    logs, remote = FakeLogs(t_0=FakeLog()), FakeRemoteTier()
    TopicLogsPublisher(logs, FakeMetadata(), remote, create_logs=False).on_topic_deleted(
        Topic("t", T_ID, 2))
    assert remote.deleted == [] and logs.deleted == [tp("t", 0), tp("t", 1)]


def test_without_tiered_storage_a_deleted_tiered_log_is_deleted_locally():
    logs = FakeLogs(t_0=FakeLog(remote_log_enabled=True))
    publisher = TopicLogsPublisher(logs, FakeMetadata())
    publisher.on_topic_deleted(Topic("t", T_ID, 1))
    assert logs.deleted == [tp("t", 0)]
    assert publisher.partitions_with_remote_data(Topic("t", T_ID, 1)) == []   # gone with its log


def test_one_broker_makes_the_logs_of_a_new_topic_and_of_added_partitions_only():
    logs = FakeLogs()
    publisher = TopicLogsPublisher(logs, FakeMetadata(), FakeRemoteTier())
    publisher.on_topic_created(Topic("t", T_ID, 2))
    publisher.on_partitions_created(Topic("t", T_ID, 3), 2)
    assert logs.created == [(tp("t", p), "config of t") for p in (0, 1, 2)]


def test_a_cluster_broker_makes_no_log_for_a_new_topic():
    logs = FakeLogs()
    publisher = TopicLogsPublisher(logs, FakeMetadata(), FakeRemoteTier(), create_logs=False)
    publisher.on_topic_created(Topic("t", T_ID, 2))
    publisher.on_partitions_created(Topic("t", T_ID, 3), 2)
    assert logs.created == []


def test_a_topic_config_change_reaches_the_hosted_logs_and_wakes_the_remote_tier():
    logs, remote = FakeLogs(t_1=FakeLog()), FakeRemoteTier()
    TopicLogsPublisher(logs, FakeMetadata(), remote).on_topic_config_changed(
        Topic("t", T_ID, 2), "new config")
    assert logs.logs[tp("t", 1)].configs == ["new config"] and remote.wakes == 1


def test_changed_broker_configs_reconfigure_the_remote_tier_and_the_cordoned_log_dirs():
    remote, logs = FakeRemoteTier(), FakeLogs()
    TopicLogsPublisher(logs, FakeMetadata(), remote).on_broker_configs_changed("quotas")
    assert remote.configs == ["quotas"] and logs.cordoned == ["/d2"]


# ---- partition states: replicas, logs, remote tier, coordinators ----------------------------

class FakeReplicaManager:
    def __init__(self, change: StateChange, states: dict | None = None):
        self.change = change
        self.states = states or {}
        self.applied: list[dict] = []

    def apply_states(self, states) -> StateChange:
        self.applied.append(dict(states))
        return self.change

    def state(self, tp):
        return self.states[tp]


class FakeLoop:
    """Holds what is handed to the event loop until ``run``."""

    def __init__(self):
        self.pending: list = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.pending.append((fn, args))

    def run(self) -> None:
        for fn, args in self.pending:
            fn(*args)
        self.pending.clear()


class FakeCoordinator:
    def __init__(self):
        self.calls: list = []

    def load_in_background(self, partitions) -> None:
        self.calls.append(("load", partitions))

    def load(self, partitions) -> None:
        self.calls.append(("load", partitions))

    def unload(self, partitions) -> None:
        self.calls.append(("unload", partitions))


def leader(epoch: int) -> PartitionState:
    return PartitionState(ME, epoch, (ME, 2), (ME, 2))


class Leadership:
    def __init__(self, change: StateChange, states: dict | None = None, *topics: Topic):
        self.replicas = FakeReplicaManager(change, states)
        self.logs, self.loop, self.remote = FakeLogs(), FakeLoop(), FakeRemoteTier()
        self.groups, self.txns = FakeCoordinator(), FakeCoordinator()
        self.publisher = LeadershipPublisher(self.replicas, self.logs, FakeMetadata(*topics),
                                             self.loop, self.groups, self.remote, self.txns)

    def apply(self, states) -> None:
        self.publisher.on_partition_states(states)


def test_leadership_of_a_regular_partition_gained_or_lost_wakes_the_remote_tier_only():
    gained = {tp("t", 0): leader(3), tp("t", 1): PartitionState(2, 4, (2, ME), (2, ME))}
    b = Leadership(StateChange(became_leader=(tp("t", 0),), stopped_leading=(tp("t", 1),)),
                   None, Topic("t", T_ID, 2))
    b.apply(gained)
    assert b.replicas.applied == [gained]
    assert b.remote.wakes == 1
    assert b.loop.pending == [] and b.logs.deleted == []


def test_states_that_change_no_leadership_leave_the_remote_tier_asleep():
    b = Leadership(StateChange(), None, Topic("t", T_ID, 1))
    b.apply({tp("t", 0): PartitionState(2, 1, (2, ME), (2, ME))})
    assert b.remote.wakes == 0 and b.loop.pending == []


def test_consumer_offsets_leadership_loads_and_unloads_the_group_coordinator_on_the_loop():
    b = Leadership(StateChange(became_leader=(tp(OFFSETS_TOPIC, 3), tp(OFFSETS_TOPIC, 5)),
                               stopped_leading=(tp(OFFSETS_TOPIC, 0),)))
    b.apply({})
    assert b.groups.calls == []   # not on the metadata's thread
    b.loop.run()
    assert b.groups.calls == [("unload", [0]), ("load", [3, 5])]
    assert b.txns.calls == []


def test_transaction_state_leadership_loads_the_coordinator_with_its_leader_epochs():
    gained, lost = tp(TRANSACTION_STATE_TOPIC, 2), tp(TRANSACTION_STATE_TOPIC, 4)
    b = Leadership(StateChange(became_leader=(gained,), stopped_leading=(lost,)),
                   {gained: leader(9)})
    b.apply({})
    assert b.txns.calls == []
    b.loop.run()
    assert b.txns.calls == [("unload", [4]), ("load", {2: 9})]   # the epoch goes into markers
    assert b.groups.calls == []


def test_without_a_transaction_coordinator_transaction_state_leadership_loads_nothing():
    gained = tp(TRANSACTION_STATE_TOPIC, 0)
    replicas, loop, groups = FakeReplicaManager(StateChange(became_leader=(gained,)),
                                                {gained: leader(1)}), FakeLoop(), FakeCoordinator()
    LeadershipPublisher(replicas, FakeLogs(), FakeMetadata(), loop, groups).on_partition_states({})
    loop.run()
    assert groups.calls == []


def test_a_broker_no_longer_a_replica_deletes_its_log_unless_the_topic_is_gone():
    """A replica moved off this broker is deleted here; a deleted topic's logs go with the
    topic's deletion (``TopicLogsPublisher``)."""
    b = Leadership(StateChange(stopped_leading=(tp("t", 0),)), None, Topic("t", T_ID, 2))
    b.apply({tp("t", 0): None, tp("t", 1): leader(2), tp("gone", 0): None})
    assert b.logs.deleted == [tp("t", 0)]


def test_one_broker_loads_every_transaction_state_partition_on_the_loop_once_the_topic_is_made():
    loop, txns = FakeLoop(), FakeCoordinator()
    loader = TransactionStateLoader(loop, txns)
    loader.on_topic_created(Topic("orders", T_ID, 3))
    loader.on_topic_created(Topic(OFFSETS_TOPIC, T_ID, 2))
    assert loop.pending == []
    loader.on_topic_created(Topic(TRANSACTION_STATE_TOPIC, T_ID, 3))
    assert txns.calls == []   # not on the metadata's thread
    loop.run()
    assert txns.calls == [("load", {0: 0, 1: 0, 2: 0})]


class FakeQuota:
    def __init__(self):
        self.rates: list[int] = []

    def update_quota(self, bytes_per_second: int) -> None:
        self.rates.append(bytes_per_second)


class BrokerProps:
    def __init__(self, **props: str):
        self.props = {k.replace("_", "."): v for k, v in props.items()}

    def effective_broker_props(self):
        return self.props


def test_changed_replication_throttles_reach_the_leader_and_follower_quotas():
    metadata, leader, follower = BrokerProps(), FakeQuota(), FakeQuota()
    publisher = ReplicationThrottlesPublisher(metadata, leader, follower)
    metadata.props.update({"leader.replication.throttled.rate": "1000",
                           "follower.replication.throttled.rate": "2000"})
    publisher.on_broker_configs_changed(None)
    assert (leader.rates, follower.rates) == ([1000], [2000])
    del metadata.props["leader.replication.throttled.rate"]   # removed: unbounded again
    metadata.props["follower.replication.throttled.rate"] = ""
    publisher.on_broker_configs_changed(None)
    assert (leader.rates, follower.rates) == ([1000, LONG_MAX], [2000, LONG_MAX])
