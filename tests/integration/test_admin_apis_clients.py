"""Python clients against a live broker: the admin APIs Kafka serves on any broker answer as
Kafka's (transactions are tested in test_transactions.py).

Each client waits at most 5 s: an answer that came later (or never) would surface as a timeout
instead of the error these tests expect.
"""

from __future__ import annotations

import pytest
from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic,
    ResourcePatternType, ResourceType)

from broker_process import BrokerProcess

WAIT_S = 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("admin-apis")) as b:
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


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
