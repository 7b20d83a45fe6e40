"""Mutated requests from a principal with no ACL change nothing (issue 46: no request skips the
authorizer).

Real clients' traffic (test_mutated_requests' admin calls, idempotent producers, consumer
groups, commits) is recorded while User:ANONYMOUS on the PLAINTEXT listener holds ALLOW ALL on
every resource; then those ACLs are deleted and the recorded requests, mutated as the fuzzer
mutates them, are sent as User:ANONYMOUS: each once as it was, then mutated for
``STRATA_FUZZ_SECONDS``. Each is answered with
Kafka error codes or closes its connection, and afterwards the super user (over SASL/PLAIN)
finds the broker exactly as before: the same topics and partitions, every partition's log
start and end offsets, the groups and their committed offsets, the topic's configs, no ACL.
"""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ConfigResource,
    ResourcePatternType, ResourceType)

from broker_process import BrokerProcess, free_port
from test_bad_input import api_versions_on, connect
from test_mutated_requests import (
    FUZZ_SECONDS, SEED, RecordingProxy, _check_one, _client_traffic, _may_wait_past_the_probe,
    fuzz)

pytestmark = pytest.mark.slow

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret";')
ANONYMOUS_ALL = [(ResourceType.TOPIC, "*"), (ResourceType.GROUP, "*"),
                 (ResourceType.TRANSACTIONAL_ID, "*"), (ResourceType.BROKER, "kafka-cluster")]


def _state(admin: AdminClient, bootstrap_admin: dict) -> dict:
    """What a request could have changed, as the super user sees it."""
    topics = admin.list_topics(timeout=10).topics
    consumer = Consumer({**bootstrap_admin, "group.id": "state-reader"})
    try:
        offsets = {(name, p): consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                   for name, t in topics.items() for p in t.partitions}
    finally:
        consumer.close()
    groups = sorted(g.group_id for g in admin.list_consumer_groups().result(30).valid)
    committed = {}
    for group in groups:
        [f] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
        committed[group] = sorted((tp.topic, tp.partition, tp.offset)
                                  for tp in f.result(30).topic_partitions)
    [f] = admin.describe_configs([ConfigResource("topic", "fuzz-topic")]).values()
    configs = {k: v.value for k, v in f.result(30).items()}
    acls = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(30)
    return {"topics": {name: len(t.partitions) for name, t in topics.items()},
            "offsets": offsets, "groups": groups, "committed": committed, "configs": configs,
            "acls": sorted(str(a) for a in acls)}


def test_mutated_requests_of_a_principal_without_acls_change_nothing(tmp_path):
    broker_port, sasl_port = free_port(), free_port()
    proxy = RecordingProxy(broker_port)
    broker = BrokerProcess(tmp_path, port=broker_port, overrides={
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port},"
                                f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:admin", "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "group.initial.rebalance.delay.ms": "0", "socket.request.max.bytes": str(1 << 20),
        "connections.max.idle.ms": str(int(max(600, FUZZ_SECONDS + 300) * 1000))})
    as_admin = {"bootstrap.servers": f"127.0.0.1:{sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret"}
    with broker:
        admin = AdminClient(as_admin)
        bindings = [AclBinding(t, name, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                               AclOperation.ALL, AclPermissionType.ALLOW)
                    for t, name in ANONYMOUS_ALL]
        for f in admin.create_acls(bindings).values():
            assert f.result(30) is None
        _client_traffic(f"127.0.0.1:{proxy.port}")
        # and a producer without idempotence, whose requests would append again if replayed
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "acks": "all",
                             "enable.idempotence": False})
        for i in range(10):
            producer.produce("fuzz-topic", b"plain-%d" % i, partition=i % 3)
        assert producer.flush(30) == 0
        proxy.recording = False
        frames = [f for f in proxy.frames if len(f) >= 8]
        assert len({struct.unpack_from(">h", f)[0] for f in frames}) >= 10, "too few kinds recorded"
        for f in admin.delete_acls([AclBindingFilter(
                ResourceType.ANY, None, ResourcePatternType.ANY, "User:ANONYMOUS", None,
                AclOperation.ANY, AclPermissionType.ANY)]).values():
            assert len(f.result(30)) == len(bindings)
        before = _state(admin, as_admin)
        assert before["acls"] == [] and "fuzz-topic" in before["topics"]

        first = connect(broker_port)
        apis = api_versions_on(first, 1, None)
        # every recorded request as it was (a produce among them would append again), then mutated
        for payload in frames:
            if not _may_wait_past_the_probe(payload):
                _check_one(broker_port, payload, apis)
        assert _state(admin, as_admin) == before
        kinds = fuzz(broker_port, frames, apis)
        first.close()
        assert kinds.get("answered", 0) >= 100, f"only {kinds} mutated requests were answered"
        print(f"seed {SEED}: denied mutated requests by outcome: {kinds}")
        assert _state(admin, as_admin) == before
    proxy.close()
    bad = broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad[:20])
