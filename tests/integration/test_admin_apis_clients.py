"""Python clients against a live broker: transactional producers are refused at once (no
transaction coordinator yet), and the admin APIs Kafka serves on any broker answer as Kafka's.

Each client waits at most 5 s: a refusal that came later (or never) would surface as a timeout
instead of the fatal authorization error these tests expect.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TransactionalIdAuthorizationFailed
from confluent_kafka import ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic,
    ResourcePatternType, ResourceType)
from kafka import KafkaProducer
from kafka.errors import TransactionalIdAuthorizationFailedError

from broker_process import BrokerProcess

CAUSE = "Transactions are not supported yet"
WAIT_S = 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("admin-apis")) as b:
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def test_confluent_transactional_producer_fails_fatally_naming_the_cause(broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ck-tx"})
    with pytest.raises(KafkaException) as info:
        producer.init_transactions(WAIT_S)
    error = info.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert error.fatal() and not error.retriable()
    assert CAUSE in error.str()


def test_kafka_python_transactional_producer_fails_with_the_authorization_error(broker):
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx",
                                 max_block_ms=WAIT_S * 1000)
        try:
            producer.init_transactions()
        finally:
            producer.close(timeout=WAIT_S)


def test_aiokafka_transactional_producer_fails_with_the_authorization_error(broker):
    async def start():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="ak-tx")
        try:
            await asyncio.wait_for(producer.start(), WAIT_S)
        finally:
            await producer.stop()

    with pytest.raises(TransactionalIdAuthorizationFailed):
        asyncio.run(start())


def test_confluent_admin_acl_calls_are_refused_without_an_authorizer(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:app",
                         "*", AclOperation.READ, AclPermissionType.ALLOW)
    any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                               AclOperation.ANY, AclPermissionType.ANY)
    for futures in (admin.create_acls([binding]), admin.delete_acls([any_acl])):
        [future] = futures.values()
        with pytest.raises(KafkaException) as info:
            future.result(WAIT_S)
        error = info.value.args[0]
        assert (error.code(), error.str()) == \
            (KafkaError.SECURITY_DISABLED, "No Authorizer is configured.")
    # librdkafka reads DescribeAcls' SECURITY_DISABLED as an empty list (so it does from Kafka)
    assert admin.describe_acls(any_acl).result(WAIT_S) == []


def test_confluent_admin_scram_users_and_leader_elections(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("elect", 2)])["elect"].result(WAIT_S)
    assert admin.describe_user_scram_credentials().result(WAIT_S) == {}
    [future] = admin.describe_user_scram_credentials(["alice"]).values()
    with pytest.raises(KafkaException) as info:
        future.result(WAIT_S)
    assert info.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND

    asked = [TopicPartition("elect", 0), TopicPartition("elect", 7)]
    results = admin.elect_leaders(ElectionType.PREFERRED, asked).result(WAIT_S)
    errors = {(tp.topic, tp.partition): e.code() for tp, e in results.items()}
    assert errors == {("elect", 0): KafkaError.ELECTION_NOT_NEEDED,
                      ("elect", 7): KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(WAIT_S) == {}
