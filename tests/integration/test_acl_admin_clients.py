"""ACLs through real clients: Kafka 4's ``kafka-acls`` (--add, --list, --remove) and
confluent-kafka's AdminClient (create_acls, describe_acls, delete_acls) against one broker
(bindings kept across a restart) and a three-broker ZooKeeper cluster (a binding added through
one broker is enforced by every broker within seconds: alice's records to partitions led by
each broker are refused, then accepted; each broker's DescribeAcls shows it; the znodes are
Kafka's). The admin logs in as User:admin (a super user) over SASL/PLAIN; alice,
with no ACL on the cluster, is refused the ACL APIs with CLUSTER_AUTHORIZATION_FAILED."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic,
    ResourcePatternType, ResourceType)
from kazoo.client import KazooClient
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_acls.v3.response import DescribeAclsResponse
from zk_server import zookeeper_available

from broker_process import BrokerProcess, free_port
from cluster_clients import NO_TIERING
from cluster_process import StrataCluster
from kafka_tools import KAFKA_ACLS, require_kafka_dist, run_kafka_class
from strata.cluster.acl_store import ACLS_FILE
from strata.net.connection import Connection
from support.waiting import eventually

pytestmark = pytest.mark.slow

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
AUTHORIZER = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
              "sasl.enabled.mechanisms": "PLAIN",
              "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS}


def sasl(bootstrap: str, user: str) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": f"{user}-secret"}


def command_config(tmp_path, user: str):
    path = tmp_path / f"{user}.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                    f'required username="{user}" password="{user}-secret";\n')
    return path


def acls(bootstrap: str, config, *args: str, ok: bool = True) -> str:
    result = run_kafka_class(KAFKA_ACLS, "--bootstrap-server", bootstrap, "--command-config",
                             str(config), *args, timeout=120)
    if ok:
        assert result.returncode == 0, f"kafka-acls {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def produce_each(bootstrap: str, user: str, topic: str, partitions: range) -> dict[int, str]:
    """One record to each partition as ``user``: partition -> "ok" or the error's name."""
    producer = Producer({**sasl(bootstrap, user), "acks": "all", "message.timeout.ms": 20000})
    results: dict[int, str] = {}
    for p in partitions:
        producer.produce(topic, b"v", partition=p, on_delivery=lambda err, _msg, p=p:
                         results.__setitem__(p, "ok" if err is None else err.name()))
    producer.flush(30)
    return results


def described_on(address: str) -> set[tuple]:
    """DescribeAcls (everything) sent to this one broker: (type, name, pattern, principal,
    host, operation, permission) of each binding its authorizer holds."""
    request = DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None,
                                  pattern_type_filter=1, principal_filter=None, host_filter=None,
                                  operation=1, permission_type=1)
    with Connection(address) as conn:
        r = conn.request(request, DescribeAclsResponse)
    assert r.error_code == 0, r
    return {(x.resource_type, x.resource_name, x.pattern_type, a.principal, a.host,
             a.operation, a.permission_type) for x in r.resources for a in x.acls}


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


def one_broker(tmp_path, sasl_port: int, plain_port: int | None = None) -> BrokerProcess:
    plain_port = plain_port or free_port()
    return BrokerProcess(tmp_path / "broker", {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "super.users": "User:admin", **AUTHORIZER, **NO_TIERING}, port=plain_port)


def test_kafka_acls_and_admin_client_on_one_broker_kept_across_a_restart(tmp_path):
    sasl_port = free_port()
    admin_cfg, alice_cfg = command_config(tmp_path, "admin"), command_config(tmp_path, "alice")
    at = f"127.0.0.1:{sasl_port}"
    broker = one_broker(tmp_path, sasl_port)
    with broker:
        out = acls(at, admin_cfg, "--add", "--allow-principal", "User:alice", "--operation",
                   "Read", "--topic", "orders", "--group", "app")
        assert "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, " \
               "patternType=LITERAL)`" in out
        acls(at, admin_cfg, "--add", "--deny-principal", "User:bob", "--allow-host", "*",
             "--deny-host", "10.0.0.9", "--operation", "Write", "--topic", "pay.",
             "--resource-pattern-type", "prefixed")
        listed = acls(at, admin_cfg, "--list")
        assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listed
        assert "ResourcePattern(resourceType=GROUP, name=app, patternType=LITERAL)" in listed
        assert ("ResourcePattern(resourceType=TOPIC, name=pay., patternType=PREFIXED)" in listed
                and "(principal=User:bob, host=10.0.0.9, operation=WRITE, "
                    "permissionType=DENY)" in listed)
        # --list --topic with the match pattern: what applies to topic pay.eu
        matched = acls(at, admin_cfg, "--list", "--topic", "pay.eu", "--resource-pattern-type",
                       "match")
        assert "name=pay., patternType=PREFIXED" in matched and "name=orders" not in matched

        # confluent-kafka's AdminClient as the admin
        admin = AdminClient(sasl(at, "admin"))
        admin.create_topics([NewTopic("pay.eu", 1, 1)])["pay.eu"].result(30)
        assert produce_each(at, "alice", "pay.eu", range(1)) == {0: "TOPIC_AUTHORIZATION_FAILED"}
        binding = AclBinding(ResourceType.TRANSACTIONAL_ID, "tx-", ResourcePatternType.PREFIXED,
                             "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
        [f] = admin.create_acls([binding]).values()
        assert f.result(30) is None
        [f] = admin.create_acls([AclBinding(
            ResourceType.TOPIC, "pay.", ResourcePatternType.PREFIXED, "User:alice", "*",
            AclOperation.WRITE, AclPermissionType.ALLOW)]).values()
        assert f.result(30) is None
        assert produce_each(at, "alice", "pay.eu", range(1)) == {0: "ok"}
        found = admin.describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
            AclOperation.ANY, AclPermissionType.ANY)).result(30)
        assert sorted((b.restype_int, b.name) for b in found) == sorted([
            (ResourceType.TOPIC.value, "orders"), (ResourceType.GROUP.value, "app"),
            (ResourceType.TRANSACTIONAL_ID.value, "tx-"), (ResourceType.TOPIC.value, "pay.")])
        # a Cluster resource must be named kafka-cluster: Kafka's INVALID_REQUEST
        bad = AclBinding(ResourceType.BROKER, "other", ResourcePatternType.LITERAL,
                         "User:alice", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
        [f] = admin.create_acls([bad]).values()
        with pytest.raises(KafkaException, match="INVALID_REQUEST|kafka-cluster"):
            f.result(30)
        # alice has no ACL on the cluster: refused each ACL API
        alice = AdminClient(sasl(at, "alice"))
        [f] = alice.create_acls([binding]).values()
        with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            f.result(30)
        refused = acls(at, alice_cfg, "--add", "--allow-principal", "User:alice",
                       "--operation", "All", "--topic", "*", ok=False)
        assert "ClusterAuthorizationException" in refused
        refused = acls(at, alice_cfg, "--list", ok=False)
        assert "ClusterAuthorizationException" in refused
        refused = acls(at, alice_cfg, "--remove", "--force", "--topic", "orders", ok=False)
        assert "ClusterAuthorizationException" in refused
        assert "Principal = User:alice is Denied operation = DESCRIBE from host = 127.0.0.1 " \
               "on resource = Cluster:LITERAL:kafka-cluster for request = DescribeAcls" \
               in broker.output()
        # removed with a filter through the AdminClient
        [f] = admin.delete_acls([AclBindingFilter(
            ResourceType.GROUP, "app", ResourcePatternType.LITERAL, None, None,
            AclOperation.ANY, AclPermissionType.ANY)]).values()
        assert [(b.name, b.principal) for b in f.result(30)] == [("app", "User:alice")]
    stored = json.loads((tmp_path / "broker" / "kafka-logs" / ACLS_FILE).read_text())
    assert {(r["resourceType"], r["name"]) for r in stored["resources"]} == {
        ("Topic", "orders"), ("Topic", "pay."), ("TransactionalId", "tx-")}
    with one_broker(tmp_path, sasl_port, broker.port):
        listed = acls(at, admin_cfg, "--list")
        assert "name=orders, patternType=LITERAL" in listed
        assert "name=tx-, patternType=PREFIXED" in listed and "name=app" not in listed
        acls(at, admin_cfg, "--remove", "--force", "--topic", "orders")
        assert "name=orders" not in acls(at, admin_cfg, "--list")
    bad = broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def test_an_unknown_authorizer_class_stops_the_broker(tmp_path):
    broker = BrokerProcess(tmp_path / "broker", {"authorizer.class.name": "com.example.Mine",
                                                 **NO_TIERING})
    broker.launch()
    assert broker.proc.wait(60) != 0
    assert "authorizer.class.name" in broker.output() and "com.example.Mine" in broker.output()


_zk_ok, _zk_why = zookeeper_available()


@pytest.mark.skipif(not _zk_ok, reason=_zk_why)
def test_a_binding_added_through_one_broker_is_on_every_broker_within_seconds(tmp_path):
    # brokers talk to each other over PLAINTEXT as User:ANONYMOUS, a super user here
    cluster = StrataCluster(tmp_path, brokers=3, overrides={
        "super.users": "User:admin;User:ANONYMOUS", "zookeeper.session.timeout.ms": "6000",
        **AUTHORIZER, **NO_TIERING})
    sasl_ports = {}
    for b in cluster.brokers:
        sasl_ports[b.node_id] = free_port()
        both = (f"PLAINTEXT://127.0.0.1:{b.port},"
                f"SASL_PLAINTEXT://127.0.0.1:{sasl_ports[b.node_id]}")
        b.process.overrides.update({"listeners": both, "advertised.listeners": both})
    admin_cfg = command_config(tmp_path, "admin")
    with cluster:
        one = f"127.0.0.1:{sasl_ports[1]}"
        two = f"127.0.0.1:{sasl_ports[2]}"
        # partition p led by broker p + 1: alice's records go to each broker
        admin = AdminClient(sasl(one, "admin"))
        admin.create_topics([NewTopic("orders", num_partitions=3,
                                      replica_assignment=[[1], [2], [3]])])["orders"].result(30)
        assert produce_each(two, "alice", "orders", range(3)) == dict.fromkeys(
            range(3), "TOPIC_AUTHORIZATION_FAILED")
        acls(one, admin_cfg, "--add", "--allow-principal", "User:alice", "--operation", "Write",
             "--topic", "orders")
        eventually(lambda: produce_each(two, "alice", "orders", range(3)) == dict.fromkeys(
            range(3), "ok"), "alice's records accepted by every broker")
        acls(one, admin_cfg, "--add", "--allow-principal", "User:*", "--operation", "Read",
             "--group", "team-", "--resource-pattern-type", "prefixed")
        expected = {(2, "orders", 3, "User:alice", "*", 4, 3),
                    (3, "team-", 4, "User:*", "*", 3, 3)}
        for b in cluster.brokers:
            eventually(lambda b=b: described_on(b.bootstrap) == expected,
                       f"broker {b.node_id}'s authorizer holds both bindings")
        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(30)
        try:
            assert json.loads(zk.get("/kafka-acl/Topic/orders")[0]) == {"version": 1, "acls": [
                {"principal": "User:alice", "permissionType": "Allow", "operation": "Write",
                 "host": "*"}]}
            assert zk.exists("/kafka-acl-extended/prefixed/Group/team-")
            assert zk.get_children("/kafka-acl-changes")
            assert zk.get_children("/kafka-acl-extended-changes")
        finally:
            zk.stop()
            zk.close()
        # removed through broker 3 with the AdminClient: gone from every broker
        admin = AdminClient(sasl(f"127.0.0.1:{sasl_ports[3]}", "admin"))
        [f] = admin.delete_acls([AclBindingFilter(
            ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, None, None,
            AclOperation.ANY, AclPermissionType.ANY)]).values()
        assert [b.name for b in f.result(30)] == ["orders"]
        for b in cluster.brokers:
            eventually(lambda b=b: described_on(b.bootstrap) == {
                (3, "team-", 4, "User:*", "*", 3, 3)}, f"broker {b.node_id} lost the binding")
        # a broker restarted loads the bindings from ZooKeeper
        cluster.broker(2).stop()
        cluster.broker(2).start()
        assert described_on(cluster.broker(2).bootstrap) == {(3, "team-", 4, "User:*", "*", 3, 3)}
