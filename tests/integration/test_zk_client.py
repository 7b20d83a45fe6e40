"""StrataZkClient against a real ZooKeeper server: Kafka's znode formats, controller election
and fencing, broker registration across session expiry, producer id blocks, chroots."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor

import pytest
from broker_process import free_port
from kazoo.client import KazooClient
from zk_fixtures import SESSION_MS, chroot, new_client, zk_server  # noqa: F401 - the fixtures
from zk_server import ZooKeeperServer, zookeeper_available

from strata.cluster.image import (
    BrokerDirectories, BrokerRegistration, Endpoint, LeaderRecoveryState, PartitionRegistration)
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import (
    ControllerMovedError, StateChangeHandler, StrataZkClient, ZkConnectionTimeoutError,
    ZkNodeExistsError)
from strata.cluster.zk.config import ZkClientConfig
from strata.common.types import TopicPartition, uuid_to_kafka_str
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

DEADLINE_S = 30.0


@pytest.fixture
def raw(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client at the server's root: an independent reader of the znodes."""
    client = KazooClient(hosts=zk_server.connect_string())
    client.start(timeout=DEADLINE_S)
    yield client
    client.stop()
    client.close()


def broker(broker_id: int, rack: str | None = "r1") -> BrokerRegistration:
    return BrokerRegistration(broker_id, rack, (
        Endpoint("PLAINTEXT", "127.0.0.1", 9090 + broker_id),
        Endpoint("REPLICATION", "127.0.0.1", 9190 + broker_id, "SSL")))


def read_json(raw: KazooClient, path: str):
    return json.loads(raw.get(path)[0])


def test_chroot_is_created_when_missing_and_everything_lives_under_it(zk_server, raw, chroot):
    deep = f"{chroot}/a/b"
    assert raw.exists(deep) is None
    with StrataZkClient(ZkClientConfig(zk_server.connect_string(deep), SESSION_MS)) as client:
        client.create_top_level_paths()
        client.register_broker(broker(1))
    for path in z.PERSISTENT_PATHS:
        assert raw.exists(deep + path) is not None, path
    assert raw.exists("/brokers") is None


def test_znodes_are_written_with_kafkas_field_names_and_types(new_client, raw, chroot):
    client = new_client()
    client.create_top_level_paths()
    epoch = client.register_broker(broker(1))
    doc = read_json(raw, f"{chroot}/brokers/ids/1")
    assert set(doc) == {"version", "host", "port", "endpoints", "jmx_port", "timestamp", "rack",
                        "listener_security_protocol_map", "features"}
    assert (doc["version"], doc["host"], doc["port"], doc["jmx_port"], doc["rack"]) == \
        (5, "127.0.0.1", 9091, -1, "r1")
    assert doc["endpoints"] == ["PLAINTEXT://127.0.0.1:9091", "REPLICATION://127.0.0.1:9191"]
    assert doc["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT", "REPLICATION": "SSL"}
    assert doc["timestamp"].isdigit() and doc["features"] == {}
    assert raw.get(f"{chroot}/brokers/ids/1")[1].ephemeralOwner == client.session_id
    assert client.get_broker(1) == replace(broker(1), epoch=epoch)

    assert client.register_controller_and_increment_controller_epoch(1, timestamp_ms=1234) == (1, 1)
    assert raw.get(f"{chroot}/controller")[0] == \
        b'{"version":2,"brokerid":1,"timestamp":"1234","kraftControllerEpoch":-1}'
    assert raw.get(f"{chroot}/controller")[1].ephemeralOwner == client.session_id
    assert raw.get(f"{chroot}/controller_epoch")[0] == b"1"

    topic_id = uuid.uuid4()
    client.create_topic_assignment(z.TopicAssignment("orders", topic_id, {
        0: z.ReplicaAssignment((1, 2, 3)), 1: z.ReplicaAssignment((2, 3, 1), (3,), (1,))}))
    assert read_json(raw, f"{chroot}/brokers/topics/orders") == {
        "version": 3, "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]},
        "adding_replicas": {"1": [3]}, "removing_replicas": {"1": [1]},
        "topic_id": uuid_to_kafka_str(topic_id)}

    tp0, tp1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
    client.create_partition_states({
        tp0: PartitionRegistration(1, (1, 2, 3), controller_epoch=1),
        tp1: PartitionRegistration(2, (2,), leader_epoch=4, controller_epoch=1,
                                   leader_recovery_state=LeaderRecoveryState.RECOVERING)}, 1)
    assert read_json(raw, f"{chroot}/brokers/topics/orders/partitions/0/state") == {
        "version": 1, "leader": 1, "leader_epoch": 0, "controller_epoch": 1, "isr": [1, 2, 3]}
    assert read_json(raw, f"{chroot}/brokers/topics/orders/partitions/1/state") == {
        "version": 1, "leader": 2, "leader_epoch": 4, "controller_epoch": 1, "isr": [2],
        "leader_recovery_state": 1}

    client.change_entity_config("topics", "orders", {"retention.ms": "1000"})
    assert read_json(raw, f"{chroot}/config/topics/orders") == \
        {"version": 1, "config": {"retention.ms": "1000"}}
    assert raw.get_children(f"{chroot}/config/changes") == ["config_change_0000000000"]
    assert raw.get(f"{chroot}/config/changes/config_change_0000000000")[0] == \
        b'{"version":2,"entity_path":"topics/orders"}'
    # notifications older than 15 minutes go when the next one is written
    client.purge_config_change_notifications(z.now_ms() + 1)
    assert raw.get_children(f"{chroot}/config/changes") == []

    client.allocate_producer_id_block(1)
    assert raw.get(f"{chroot}/latest_producer_id_block")[0] == \
        b'{"version":1,"broker":1,"block_start":"0","block_end":"999"}'
    assert client.create_or_get_cluster_id("AAAAAAAAAAAAAAAAAAAAAA") == "AAAAAAAAAAAAAAAAAAAAAA"
    assert raw.get(f"{chroot}/cluster/id")[0] == b'{"version":"1","id":"AAAAAAAAAAAAAAAAAAAAAA"}'

    client.create_delete_topic_path("orders")
    assert raw.get_children(f"{chroot}/admin/delete_topics") == ["orders"]


def test_what_is_written_reads_back_the_same(new_client):
    client = new_client()
    client.create_top_level_paths()
    epoch = client.register_broker(broker(7, rack=None))
    assert client.get_all_brokers() == [BrokerRegistration(7, None, broker(7).endpoints, epoch)]
    assignment = z.TopicAssignment("t", uuid.uuid4(), {0: z.ReplicaAssignment((7,))})
    client.create_topic_assignment(assignment)
    assert client.get_topic_assignments(["t", "missing"]) == {"t": z.TopicAssignment(
        "t", assignment.topic_id, assignment.partitions, zk_version=0)}
    with pytest.raises(ZkNodeExistsError):
        client.create_topic_assignment(assignment)
    assert client.create_or_get_cluster_id("first") == "first"
    assert client.create_or_get_cluster_id("second") == "first"
    client.set_or_create_entity_configs("brokers", "<default>", {"a": "1"})
    client.set_or_create_entity_configs("brokers", "<default>", {"b": "2"})
    assert client.get_entity_configs("brokers", "<default>") == {"b": "2"}
    assert client.get_entity_configs("brokers", "7") == {}


def test_racing_controllers_exactly_one_wins_each_round_and_epochs_only_grow(new_client):
    contenders = [new_client() for _ in range(4)]
    barrier = threading.Barrier(len(contenders))

    def run(broker_id: int):
        barrier.wait()
        try:
            return contenders[broker_id].register_controller_and_increment_controller_epoch(broker_id)
        except ControllerMovedError:
            return None

    last_epoch = 0
    with ThreadPoolExecutor(len(contenders)) as pool:
        for _ in range(5):
            results = list(pool.map(run, range(len(contenders))))
            winners = [(i, r) for i, r in enumerate(results) if r is not None]
            assert len(winners) == 1, results
            winner, (epoch, epoch_zk_version) = winners[0]
            assert epoch == last_epoch + 1
            last_epoch = epoch
            for client in contenders:
                assert client.get_controller_id() == winner
                assert client.get_controller_epoch() == (epoch, epoch_zk_version)
            contenders[winner].delete_controller(epoch_zk_version)


def test_a_stale_controller_cannot_change_partition_state(new_client):
    old, new = new_client(), new_client()
    old_epoch, old_version = old.register_controller_and_increment_controller_epoch(1)
    tp = TopicPartition("t", 0)
    old.create_topic_assignment(z.TopicAssignment("t", uuid.uuid4(), {0: z.ReplicaAssignment((1, 2))}))
    state = old.create_partition_states(
        {tp: PartitionRegistration(1, (1, 2), controller_epoch=old_epoch)}, old_version)[tp]

    old.delete_controller(old_version)  # as a session expiry would
    new_epoch, new_version = new.register_controller_and_increment_controller_epoch(2)
    assert new_epoch == old_epoch + 1

    with pytest.raises(ControllerMovedError):
        old.update_leader_and_isr({tp: state.with_leader_and_isr(2, (2,))}, old_epoch, old_version)
    with pytest.raises(ControllerMovedError):
        old.delete_topic_znode("t", old_version)
    with pytest.raises(ControllerMovedError):
        old.create_partition_states(
            {TopicPartition("t", 1): PartitionRegistration(1, (1,))}, old_version)
    assert new.get_partition_states([tp]) == {tp: state}

    result = new.update_leader_and_isr({tp: state.with_leader_and_isr(2, (2,))},
                                       new_epoch, new_version)
    written = result.finished[tp]
    assert (written.leader, written.isr, written.leader_epoch, written.controller_epoch,
            written.partition_epoch) == (2, (2,), 1, new_epoch, 1)
    assert new.get_partition_states([tp]) == {tp: written}

    # A write based on a state read before the last change loses the version race.
    again = new.update_leader_and_isr({tp: state.with_leader_and_isr(1, (1,))},
                                      new_epoch, new_version)
    assert again.to_retry == (tp,) and not again.finished
    assert new.get_partition_states([tp]) == {tp: written}


def test_only_the_current_controller_records_the_registrations_it_handled(new_client, raw,
                                                                        chroot):
    old, new = new_client(), new_client()
    _, old_version = old.register_controller_and_increment_controller_epoch(1)
    first = BrokerDirectories((uuid.UUID(int=7),), 4294967312)
    old.set_broker_directories(2, first, old_version)          # created
    again = BrokerDirectories((uuid.UUID(int=8),), 4294967400)
    old.set_broker_directories(2, again, old_version)          # replaced
    data, _ = raw.get(f"{chroot}/strata/broker_directories/2")
    assert json.loads(data) == {"version": 1, "directory_ids": [uuid_to_kafka_str(uuid.UUID(int=8))],
                                "broker_epoch": 4294967400}
    old.delete_controller(old_version)
    _, new_version = new.register_controller_and_increment_controller_epoch(2)
    with pytest.raises(ControllerMovedError):
        old.set_broker_directories(3, first, old_version)
    raw.create(f"{chroot}/strata/broker_directories/4", b"not json")  # read as never handled
    assert new.get_all_broker_directories() == {2: again}


def expire_session(zk_server: ZooKeeperServer, client: StrataZkClient) -> None:
    """Expires the client's session on the server: another connection takes it over and closes it."""
    thief = KazooClient(hosts=zk_server.connect_string(), client_id=client.session_credentials)
    thief.start(timeout=DEADLINE_S)
    thief.stop()
    thief.close()


def test_a_brokers_registration_vanishes_with_its_session_and_comes_back_on_the_next(
        zk_server, new_client):
    broker_client, observer = new_client(), new_client()
    observer.create_top_level_paths()
    seen: list[list[int]] = []
    observer.watch_broker_ids(seen.append)

    allowed, registered = threading.Event(), threading.Event()

    def reregister() -> None:
        allowed.wait(DEADLINE_S)  # held until the test has seen the old registration go
        broker_client.register_broker(broker(3))
        registered.set()
    broker_client.register_state_change_handler(
        StateChangeHandler("broker-info", after_initializing_session=reregister))

    first_epoch = broker_client.register_broker(broker(3))
    first_session = broker_client.session_id
    eventually(lambda: seen and seen[-1] == [3], "the registration to be seen", DEADLINE_S)

    expire_session(zk_server, broker_client)
    eventually(lambda: seen[-1] == [], "the registration to vanish", DEADLINE_S)
    allowed.set()
    eventually(registered.is_set, "the broker to re-register on its new session", DEADLINE_S)
    eventually(lambda: seen[-1] == [3], "the new registration to be seen", DEADLINE_S)
    again = observer.get_broker(3)
    assert broker_client.session_id != first_session
    assert again is not None and again.epoch > first_epoch


def test_after_a_session_expiry_the_leadership_lease_is_held_once_the_handlers_have_run(
        zk_server, new_client):
    """Connected again on a new session is not enough: the broker must have re-registered
    (which drops the leaderships of the expired session) before it acts as a leader."""
    client = new_client()
    client.create_top_level_paths()
    assert not client.leadership_lease.in_doubt()
    allowed, registered = threading.Event(), threading.Event()

    def reregister() -> None:
        allowed.wait(DEADLINE_S)
        client.register_broker(broker(4))
        registered.set()
    client.register_state_change_handler(
        StateChangeHandler("broker-info", after_initializing_session=reregister))
    client.register_broker(broker(4))
    first_session = client.session_id
    expire_session(zk_server, client)
    eventually(lambda: client.connected and client.session_id != first_session, "a new session",
               DEADLINE_S)
    assert client.leadership_lease.in_doubt()    # the handler has not finished
    allowed.set()
    eventually(lambda: not client.leadership_lease.in_doubt(), "the lease held again", DEADLINE_S)
    assert registered.is_set()


def test_a_failed_handler_on_the_new_session_keeps_the_leadership_lease_in_doubt(
        zk_server, new_client):
    client = new_client()
    ran = threading.Event()

    def fail() -> None:
        raise RuntimeError("cannot re-register")
    client.register_state_change_handler(
        StateChangeHandler("broken", after_initializing_session=fail))
    client.register_state_change_handler(   # handlers run in order: this one runs last
        StateChangeHandler("last", after_initializing_session=ran.set))
    expire_session(zk_server, client)
    eventually(ran.is_set, "the new session's handlers to run", DEADLINE_S)
    # private: whatever the session thread does after the handlers is done once this runs
    client._session_events.submit(lambda: None).result(DEADLINE_S)
    assert client.connected and client.leadership_lease.in_doubt()


def test_a_registration_held_by_another_live_session_is_refused(new_client):
    first, second = new_client(), new_client()
    first.create_top_level_paths()
    epoch = first.register_broker(broker(5))
    assert first.register_broker(broker(5)) == epoch  # same session: already ours
    with pytest.raises(ZkNodeExistsError):
        second.register_broker(broker(5))


def test_producer_id_blocks_from_racing_brokers_never_overlap(new_client):
    brokers = [new_client() for _ in range(3)]
    brokers[0].create_top_level_paths()
    per_thread, threads = 15, 6

    def allocate(i: int):
        client = brokers[i % len(brokers)]
        return [client.allocate_producer_id_block(i % len(brokers)) for _ in range(per_thread)]

    with ThreadPoolExecutor(threads) as pool:
        blocks = [b for got in pool.map(allocate, range(threads)) for b in got]
    blocks.sort(key=lambda b: b.first_producer_id)
    assert len(blocks) == per_thread * threads
    assert blocks[0].first_producer_id == 0
    for before, after in zip(blocks, blocks[1:]):
        assert after.first_producer_id == before.last_producer_id + 1
    assert all(b.size == z.PRODUCER_ID_BLOCK_SIZE for b in blocks)


def test_a_request_made_while_zookeeper_is_stopped_completes_after_it_resumes(zk_server, new_client):
    client = new_client()
    zk_server.pause()
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.create_or_get_cluster_id, "paused")
            assert not pending.done()  # the server cannot have answered
            zk_server.resume()
            assert pending.result(timeout=DEADLINE_S) == "paused"
    finally:
        zk_server.resume()
    assert client.get_cluster_id() == "paused"


def test_connecting_to_no_server_fails_after_the_connection_timeout():
    config = ZkClientConfig(f"127.0.0.1:{free_port()}", SESSION_MS, connection_timeout_ms=500)
    client = StrataZkClient(config)
    with pytest.raises(ZkConnectionTimeoutError):
        client.start()
    client.close()


def test_watches_report_controller_and_topic_changes(new_client):
    controller, observer = new_client(), new_client()
    controllers: list[int | None] = []
    topics: list[set[str]] = []
    observer.watch_controller(controllers.append)
    observer.watch_topics(topics.append)
    eventually(lambda: controllers == [None] and topics == [set()], "the initial values",
               DEADLINE_S)
    _, version = controller.register_controller_and_increment_controller_epoch(9)
    controller.create_topic_assignment(z.TopicAssignment("w", uuid.uuid4(), {}))
    eventually(lambda: controllers[-1] == 9 and topics[-1] == {"w"}, "the changes", DEADLINE_S)
    controller.delete_topic_znode("w", version)
    controller.delete_controller(version)
    eventually(lambda: controllers[-1] is None and topics[-1] == set(), "the deletions",
               DEADLINE_S)


def test_a_topic_watch_reports_each_change_of_its_znode(new_client):
    admin, observer = new_client(), new_client()
    topic_id = uuid.uuid4()
    admin.create_topic_assignment(z.TopicAssignment("w", topic_id, {0: z.ReplicaAssignment((1,))}))
    calls: list[int] = []
    observer.watch_topic(
        "w", lambda: calls.append(len(observer.get_topic_assignments(["w"])["w"].partitions)))
    eventually(lambda: calls == [1], "the initial call", DEADLINE_S)
    _, version = admin.register_controller_and_increment_controller_epoch(9)
    admin.set_topic_assignment(z.TopicAssignment("w", topic_id, {
        0: z.ReplicaAssignment((1,)), 1: z.ReplicaAssignment((1,))}), version)
    eventually(lambda: calls == [1, 2], "the change", DEADLINE_S)
