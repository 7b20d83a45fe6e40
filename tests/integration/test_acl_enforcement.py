"""ACLs enforced on the data path through real clients (issue 46), on one broker with Kafka's
authorizer over SASL/PLAIN: User:admin is a super user and adds ACLs with confluent-kafka's
AdminClient; alice's producer and consumer are refused (TOPIC_AUTHORIZATION_FAILED) until the
ACLs they need exist, then produce and consume; a consumer group is refused without READ on
the group; Kafka's Java console producer is refused with TopicAuthorizationException; a topic
alice may not DESCRIBE stays out of her metadata."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
    ResourceType)

from broker_process import BrokerProcess, free_port
from cluster_clients import NO_TIERING
from kafka_tools import CONSOLE_PRODUCER, require_kafka_dist, run_kafka_class

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
