"""ACLs enforced on the data path through real clients (issue 46), on one broker with Kafka's
authorizer over SASL/PLAIN: User:admin is a super user and adds ACLs with confluent-kafka's
AdminClient; alice's producer and consumer are refused (TOPIC_AUTHORIZATION_FAILED) until the
ACLs they need exist, then produce and consume; a consumer group is refused without READ on
the group; Kafka's Java console producer is refused with TopicAuthorizationException; a topic
alice may not DESCRIBE stays out of her metadata; a client that is not a broker may not fetch
as a replica, write transaction markers or propose ISR changes."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
    ResourceType)
from kio.schema.alter_partition.v3.request import AlterPartitionRequest
from kio.schema.alter_partition.v3.response import AlterPartitionResponse
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest)
from kio.schema.write_txn_markers.v1.response import WriteTxnMarkersResponse

from broker_process import BrokerProcess, free_port
from cluster_clients import NO_TIERING
from kafka_tools import CONSOLE_PRODUCER, require_kafka_dist, run_kafka_class
from strata.common.errors import ErrorCode
from strata.net.connection import ClientSecurity, Connection
from strata.security.sasl_client import SaslCredentials, new_client

pytestmark = pytest.mark.slow

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" '
        'user_bob="bob-secret";')


def sasl(bootstrap: str, user: str) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acl-enforcement")
    plain_port, sasl_port = free_port(), free_port()
    with BrokerProcess(tmp / "broker", {
            "listeners": f"PLAINTEXT://127.0.0.1:{plain_port},"
                         f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin", "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "group.initial.rebalance.delay.ms": "0", **NO_TIERING}, port=plain_port) as b:
        b.at = f"127.0.0.1:{sasl_port}"
        b.admin = AdminClient(sasl(b.at, "admin"))
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def allow(broker, resource_type, name: str, user: str, operation) -> None:
    [f] = broker.admin.create_acls([AclBinding(
        resource_type, name, ResourcePatternType.LITERAL, f"User:{user}", "*", operation,
        AclPermissionType.ALLOW)]).values()
    assert f.result(30) is None


def new_topic(broker, name: str, partitions: int = 1) -> None:
    broker.admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def produce(broker, user: str, topic: str, count: int, **config) -> list[str]:
    """``count`` records as ``user``: each delivery's outcome ("ok" or the error's name)."""
    producer = Producer({**sasl(broker.at, user), "acks": "all", "message.timeout.ms": 15000,
                         **config})
    outcomes: list[str] = []
    for i in range(count):
        producer.produce(topic, b"v%d" % i, on_delivery=lambda err, _msg: outcomes.append(
            "ok" if err is None else err.name()))
    producer.flush(30)
    return outcomes


def consume(broker, user: str, topic: str, group: str, count: int) -> tuple[list[bytes], set]:
    """What ``user``'s consumer in ``group`` reads of ``topic`` and the errors it is told,
    until it has ``count`` records or an error."""
    consumer = Consumer({**sasl(broker.at, user), "group.id": group,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got, errors = [], set()
    deadline = time.monotonic() + 30
    try:
        while len(got) < count and not errors and time.monotonic() < deadline:
            for m in consumer.consume(count, 0.5):
                if m.error() is None:
                    got.append(m.value())
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    errors.add(m.error().name())
    finally:
        consumer.close()
    return got, errors


def test_a_producer_and_a_consumer_are_refused_until_their_acls_are_added(broker):
    new_topic(broker, "orders")
    assert produce(broker, "alice", "orders", 3) == ["TOPIC_AUTHORIZATION_FAILED"] * 3
    allow(broker, ResourceType.TOPIC, "orders", "alice", AclOperation.WRITE)
    # an idempotent producer: WRITE on a topic is enough for its InitProducerId (Kafka 4's rule)
    assert produce(broker, "alice", "orders", 5, **{"enable.idempotence": True}) == ["ok"] * 5
    allow(broker, ResourceType.GROUP, "shop", "alice", AclOperation.READ)
    got, errors = consume(broker, "alice", "orders", "shop", 5)
    assert (got, errors) == ([], {"TOPIC_AUTHORIZATION_FAILED"})
    allow(broker, ResourceType.TOPIC, "orders", "alice", AclOperation.READ)
    got, errors = consume(broker, "alice", "orders", "shop", 5)
    assert (got, errors) == ([b"v%d" % i for i in range(5)], set())


def test_a_consumer_group_needs_read_on_the_group(broker):
    new_topic(broker, "ledger")
    assert produce(broker, "admin", "ledger", 2) == ["ok", "ok"]
    allow(broker, ResourceType.TOPIC, "ledger", "bob", AclOperation.READ)
    got, errors = consume(broker, "bob", "ledger", "auditors", 2)
    assert (got, errors) == ([], {"GROUP_AUTHORIZATION_FAILED"})
    allow(broker, ResourceType.GROUP, "auditors", "bob", AclOperation.READ)
    got, errors = consume(broker, "bob", "ledger", "auditors", 2)
    assert (got, errors) == ([b"v0", b"v1"], set())


def test_an_undescribable_topic_stays_out_of_a_principals_metadata(broker):
    new_topic(broker, "hidden")
    new_topic(broker, "visible")
    allow(broker, ResourceType.TOPIC, "visible", "bob", AclOperation.DESCRIBE)
    topics = AdminClient(sasl(broker.at, "bob")).list_topics(timeout=10).topics
    assert "visible" in topics and "hidden" not in topics
    assert {"hidden", "visible"} <= set(broker.admin.list_topics(timeout=10).topics)


def test_the_java_console_producer_is_refused_without_write_on_the_topic(broker, tmp_path):
    require_kafka_dist()
    new_topic(broker, "payments")
    # WRITE on another topic: InitProducerId of its idempotent producer passes, the topic not
    allow(broker, ResourceType.TOPIC, "elsewhere", "alice", AclOperation.WRITE)
    config = tmp_path / "alice.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                      'required username="alice" password="alice-secret";\n')
    result = run_kafka_class(CONSOLE_PRODUCER, "--bootstrap-server", broker.at, "--topic",
                             "payments", "--command-config", str(config), input="a\nb\n")
    assert "TopicAuthorizationException" in result.stdout + result.stderr, \
        result.stdout + result.stderr
    assert "Principal = User:alice is Denied operation = DESCRIBE from host = 127.0.0.1 on " \
           "resource = Topic:LITERAL:payments" in broker.output()
    allow(broker, ResourceType.TOPIC, "payments", "alice", AclOperation.WRITE)
    result = run_kafka_class(CONSOLE_PRODUCER, "--bootstrap-server", broker.at, "--topic",
                             "payments", "--command-config", str(config), input="a\nb\n")
    assert result.returncode == 0, result.stdout + result.stderr
    got, _ = consume(broker, "admin", "payments", "check-payments", 2)
    assert got == [b"a", b"b"]


def test_a_client_that_is_not_a_broker_cannot_replicate_or_act_for_the_cluster(broker):
    """A follower's Fetch (replica id >= 0), WriteTxnMarkers and AlterPartition from User:alice,
    who has READ and WRITE on the topic but no CLUSTER_ACTION: refused as Kafka refuses them,
    while her consumer Fetch of the same partition reads it."""
    new_topic(broker, "replicated")
    for operation in (AclOperation.READ, AclOperation.WRITE):
        allow(broker, ResourceType.TOPIC, "replicated", "alice", operation)
    assert produce(broker, "alice", "replicated", 1) == ["ok"]
    alice = SaslCredentials("PLAIN", "alice", "alice-secret")

    def fetch(replica_id: int) -> FetchRequest:
        return FetchRequest(
            replica_id=replica_id, max_wait=datetime.timedelta(0), min_bytes=0,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
            forgotten_topics_data=(), topics=(FetchTopic(topic="replicated", partitions=(
                FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                               last_fetched_epoch=-1, log_start_offset=-1,
                               partition_max_bytes=1 << 20),)),))
    with Connection(broker.at, security=ClientSecurity(
            sasl_mechanism="PLAIN", sasl_client=lambda host: new_client(alice, host))) as conn:
        [p] = conn.request(fetch(2), FetchResponse).responses[0].partitions
        assert (p.error_code, p.records or b"") == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, b"")
        [p] = conn.request(fetch(-1), FetchResponse).responses[0].partitions
        assert p.error_code == ErrorCode.NONE and p.records
        markers = WriteTxnMarkersRequest(markers=(WritableTxnMarker(
            producer_id=1, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
            topics=(WritableTxnMarkerTopic(name="replicated", partition_indexes=(0,)),)),))
        r = conn.request(markers, WriteTxnMarkersResponse)
        assert r.markers[0].topics[0].partitions[0].error_code == \
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        r = conn.request(AlterPartitionRequest(broker_id=2, broker_epoch=1, topics=()),
                         AlterPartitionResponse)
        assert r.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
