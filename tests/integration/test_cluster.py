"""Three ``strata serve`` processes joined through a real ZooKeeper, seen by real clients:
Metadata and DescribeCluster list every broker, RF 3 topics spread their leaders, produce and
a consumer group work across brokers, a broker that does not lead a partition answers as Kafka
does, and the cluster survives SIGKILL of the controller and SIGSTOP of a broker past its
ZooKeeper session.

Replication is not built yet (issue 26): these tests check leadership and metadata, never that
a follower holds data.
"""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v4.response import InitProducerIdResponse
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, partitions, produce_raw, wait_for
from cluster_process import StrataCluster, metadata_node_ids
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

SESSION_MS = 4000
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    **NO_TIERING,
    "offsets.topic.num.partitions": "6",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("cluster"), brokers=3, overrides=OVERRIDES) as c:
        yield c


def create(cluster, name: str, partitions: int, rf: int) -> None:
    futures = admin(cluster.bootstrap).create_topics([NewTopic(name, partitions, rf)])
    futures[name].result(30)


def partitions_of(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, ISR) as that broker itself answers."""
    return {p: (m.leader, m.replicas, m.isr) for p, m in partitions(bootstrap, topic).items()}


def list_offsets_raw(bootstrap: str, topic: str, partition: int, current_epoch: int) -> int:
    resp = roundtrip(bootstrap, ListOffsetsRequest(
        replica_id=i32(-1), isolation_level=0, topics=(ListOffsetsTopic(
            name=TopicName(topic), partitions=(ListOffsetsPartition(
                partition_index=i32(partition), current_leader_epoch=i32(current_epoch),
                timestamp=i64(-1)),)),)), ListOffsetsResponse)
    return int(resp.topics[0].partitions[0].error_code)


def test_three_brokers_form_one_cluster_that_every_broker_describes_alike(cluster):
    controllers = set()
    for b in cluster.brokers:   # each broker asked itself
        ids, controller = metadata_node_ids(b.bootstrap)
        assert ids == cluster.node_ids
        controllers.add(controller)
    assert len(controllers) == 1 and controllers <= cluster.node_ids
    md = admin(cluster.bootstrap).list_topics(timeout=10)
    assert {(x.id, x.port) for x in md.brokers.values()} == \
        {(x.node_id, x.port) for x in cluster.brokers}
    described = admin(cluster.bootstrap).describe_cluster().result(10)
    assert {n.id for n in described.nodes} == cluster.node_ids
    assert described.controller.id in cluster.node_ids


def test_an_rf3_topic_spreads_its_leaders_and_every_broker_agrees_on_them(cluster):
    create(cluster, "spread", 6, 3)
    views = [wait_for("leaders of every partition", lambda b=b: (
        v := partitions_of(b.bootstrap, "spread")) and all(l >= 0 for l, _, _ in v.values()) and v)
        for b in cluster.brokers]
    assert views[0] == views[1] == views[2]
    assert {leader for leader, _, _ in views[0].values()} == cluster.node_ids
    for leader, replicas, isr in views[0].values():
        assert sorted(replicas) == sorted(isr) == sorted(cluster.node_ids)
        assert leader == replicas[0]  # the preferred leader leads a new partition


def test_produce_and_a_consumer_group_work_across_brokers(cluster):
    create(cluster, "orders", 6, 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    for i in range(600):
        producer.produce("orders", key=str(i).encode(), value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "g-orders",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["orders"])
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < 600 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            seen.add(m.key())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == {str(i).encode() for i in range(600)}
    # the group's offsets are on the coordinator every broker names
    offsets = admin(cluster.bootstrap).list_consumer_group_offsets(
        [_group_request("g-orders")])["g-orders"].result(10)
    assert sum(tp.offset for tp in offsets.topic_partitions) == 600


def _group_request(group: str):
    from confluent_kafka import ConsumerGroupTopicPartitions
    return ConsumerGroupTopicPartitions(group)


def test_a_broker_that_does_not_lead_answers_as_kafka_does(cluster):
    create(cluster, "leaders", 1, 3)
    leader, replicas, _ = wait_for("a leader", lambda: (
        v := partitions_of(cluster.bootstrap, "leaders")[0]) and v[0] >= 0 and v)
    follower = next(b for b in cluster.brokers if b.node_id != leader)
    assert produce_raw(follower.bootstrap, "leaders", 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert produce_raw(follower.bootstrap, "nosuchtopic", 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    lead = cluster.broker(leader)
    assert produce_raw(lead.bootstrap, "leaders", 0) == ErrorCode.NONE
    epoch = partitions(lead.bootstrap, "leaders")[0].leader_epoch
    assert list_offsets_raw(lead.bootstrap, "leaders", 0, epoch) == ErrorCode.NONE
    assert list_offsets_raw(lead.bootstrap, "leaders", 0, epoch + 1) == ErrorCode.UNKNOWN_LEADER_EPOCH
    if epoch > 0:
        assert list_offsets_raw(lead.bootstrap, "leaders", 0, epoch - 1) == ErrorCode.FENCED_LEADER_EPOCH


def test_producer_ids_come_from_blocks_no_two_brokers_share(cluster):
    ids = []
    for b in cluster.brokers:
        for _ in range(2):
            resp = roundtrip(b.bootstrap, InitProducerIdRequest(
                transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=i64(-1), producer_epoch=-1), InitProducerIdResponse)
            assert resp.error_code == ErrorCode.NONE
            ids.append(int(resp.producer_id))
    assert len(set(ids)) == len(ids)
    blocks = {i // 1000 for i in ids}
    assert len(blocks) == len(cluster.brokers)  # one block per broker


def broker_config(bootstrap: str, broker: int, key: str):
    """(value, source name) of one config of broker ``broker`` as the broker at ``bootstrap``
    describes it itself."""
    from confluent_kafka.admin import AdminClient, ConfigResource
    resource = ConfigResource("broker", str(broker))
    client = AdminClient({"bootstrap.servers": bootstrap})   # a fresh one: brokers restart
    found = client.describe_configs([resource], request_timeout=10)[resource].result(15)[key]
    return found.value, found.source


def topic_config(bootstrap: str, topic: str, key: str) -> tuple[str, int]:
    """(value, source) of one config of ``topic`` as ``bootstrap`` describes it."""
    from confluent_kafka.admin import AdminClient, ConfigResource
    resource = ConfigResource("topic", topic)
    client = AdminClient({"bootstrap.servers": bootstrap})
    found = client.describe_configs([resource], request_timeout=10)[resource].result(15)[key]
    return found.value, found.source


def alter_broker(bootstrap: str, name: str, **configs: str | None) -> None:
    """IncrementalAlterConfigs (as kafka-configs sends it) of BROKER resource ``name`` (""
    is ``--entity-default``): SET, or DELETE for None."""
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig, AlterConfigsResource, IncrementalAlterConfigsRequest)
    from kio.schema.incremental_alter_configs.v1.response import IncrementalAlterConfigsResponse
    from kio.static.primitive import i8
    request = IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=i8(4), resource_name=name, configs=tuple(
            AlterableConfig(name=k, config_operation=i8(1 if v is None else 0), value=v)
            for k, v in configs.items())),), validate_only=False)
    (result,) = roundtrip(bootstrap, request, IncrementalAlterConfigsResponse, 30).responses
    assert result.error_code == ErrorCode.NONE, result


def test_dynamic_broker_configs_live_in_zookeeper_and_reach_every_broker(cluster):
    """kafka-configs --entity-default lands in /config/brokers/<default> and every broker
    applies it; a per-broker value overrides it on that broker only, and survives a restart."""
    from confluent_kafka.admin import ConfigSource
    key = "leader.replication.throttled.rate"
    alter_broker(cluster.broker(1).bootstrap, "", **{key: "1048576"})
    for b in cluster.brokers:   # the others learn it from ZooKeeper's change notification
        wait_for(f"broker {b.node_id} applying the default", lambda b=b: broker_config(
            b.bootstrap, b.node_id, key) == ("1048576", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value))
    alter_broker(cluster.broker(2).bootstrap, "2", **{key: "2097152"})
    assert broker_config(cluster.broker(2).bootstrap, 2, key) == (
        "2097152", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert broker_config(cluster.broker(3).bootstrap, 3, key)[0] == "1048576"
    import json
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=10)
    try:   # Kafka's znodes, which Kafka's own ZooKeeper-mode tools read and write
        stored = {n: json.loads(zk.get(f"/config/brokers/{n}")[0])["config"]
                  for n in zk.get_children("/config/brokers")}
    finally:
        zk.stop()
        zk.close()
    assert stored == {"<default>": {key: "1048576"}, "2": {key: "2097152"}}
    # a dynamic default of a topic config's broker synonym (KIP-1241's log.remote.copy.lag.ms)
    # reaches the topics of every broker
    create(cluster, "lag-default", 1, 3)
    alter_broker(cluster.broker(1).bootstrap, "", **{"log.remote.copy.lag.ms": "60000"})
    for b in cluster.brokers:
        wait_for(f"broker {b.node_id} applying the copy lag default", lambda b=b: topic_config(
            b.bootstrap, "lag-default", "remote.copy.lag.ms") == (
                "60000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value))
    alter_broker(cluster.broker(1).bootstrap, "", **{"log.remote.copy.lag.ms": None})
    cluster.broker(2).stop()
    cluster.broker(2).start()
    wait_for("broker 2 back with its configs", lambda: broker_config(
        cluster.broker(2).bootstrap, 2, key)[0] == "2097152")
    alter_broker(cluster.broker(2).bootstrap, "2", **{key: None})
    alter_broker(cluster.broker(3).bootstrap, "", **{key: None})
    for b in cluster.brokers:
        wait_for(f"broker {b.node_id} dropping the default", lambda b=b: broker_config(
            b.bootstrap, b.node_id, key)[1] != ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)


def test_the_controller_sigkilled_is_replaced_and_its_partitions_get_leaders(cluster):
    create(cluster, "failover", 3, 3)
    before = wait_for("leaders", lambda: (v := partitions_of(cluster.bootstrap, "failover"))
                      and all(l >= 0 for l, _, _ in v.values()) and v)
    controller = admin(cluster.bootstrap).describe_cluster().result(10).controller.id
    survivors = [b for b in cluster.brokers if b.node_id != controller]
    epochs_before = {p: m.leader_epoch for p, m in partitions(survivors[0].bootstrap, "failover").items()}
    cluster.broker(controller).kill()
    try:
        # asked of a survivor directly: a client's pick of broker could be the dead one
        new_controller = wait_for("a new controller", lambda: (
            c := metadata_node_ids(survivors[0].bootstrap)[1])
            != controller and c in {b.node_id for b in survivors} and c)
        after = wait_for("leaders off the dead broker", lambda: (
            v := partitions_of(survivors[0].bootstrap, "failover"))
            and all(l >= 0 and l != controller and controller not in isr for l, _, isr in v.values()) and v)
        for p, (leader, _, _) in after.items():   # the new leader may not have taken over yet
            wait_for(f"broker {leader} accepting partition {p}", lambda p=p, leader=leader: produce_raw(
                cluster.broker(leader).bootstrap, "failover", p) == ErrorCode.NONE)
            if before[p][0] == controller:  # moved: a higher leader epoch
                assert partitions(survivors[0].bootstrap, "failover")[p].leader_epoch > epochs_before[p]
    except BaseException:
        cluster.broker(controller).start()   # the module's next tests need all three brokers
        raise
    # the old controller, restarted, rejoins as a broker and changes nothing
    cluster.broker(controller).start()
    cluster.wait_metadata()
    assert metadata_node_ids(cluster.bootstrap.split(",")[0])[1] == new_controller
    assert {p: v[0] for p, v in partitions_of(cluster.bootstrap, "failover").items()} == \
        {p: v[0] for p, v in after.items()}


def test_a_broker_paused_past_its_session_is_fenced_then_rejoins(cluster):
    create(cluster, "paused", 3, 3)
    wait_for("leaders", lambda: all(l >= 0 for l, _, _ in partitions_of(cluster.bootstrap, "paused").values()))
    victim = cluster.broker(max(cluster.node_ids))
    others = [b for b in cluster.brokers if b is not victim]
    victim.pause()
    try:
        wait_for("the paused broker leaves Metadata",
                 lambda: victim.node_id not in metadata_node_ids(others[0].bootstrap)[0])
        wait_for("its partitions led by others", lambda: all(
            l not in (victim.node_id, -1) for l, _, _ in partitions_of(others[0].bootstrap, "paused").values()))
    finally:
        victim.resume()
    wait_for("the broker rejoins", lambda: victim.node_id in metadata_node_ids(others[0].bootstrap)[0])
    cluster.wait_metadata()
    # it serves again: it catches up, returns to every ISR, and every broker sees the same state
    # (the views follow ZooKeeper, so they may differ for a moment while ISRs grow back)
    def agreed():
        views = [partitions_of(b.bootstrap, "paused") for b in cluster.brokers]
        return views[0] == views[1] == views[2] and all(
            sorted(isr) == sorted(cluster.node_ids) for _, _, isr in views[0].values())
    wait_for("every broker agreeing on whole ISRs", agreed)


def test_a_broker_sigkilled_and_relaunched_at_once_rejoins(cluster):
    """Its previous session's /brokers/ids/N is still there when it registers again; it waits
    for ZooKeeper to expire it (Kafka's ZooKeeper mode would exit) and rejoins."""
    victim = cluster.broker(min(cluster.node_ids))
    victim.kill()
    victim.start()
    wait_for("every broker listing all three", lambda: all(
        metadata_node_ids(b.bootstrap)[0] == cluster.node_ids for b in cluster.brokers),
        SESSION_MS / 1000 + 20)
    assert victim.running
