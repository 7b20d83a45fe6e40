"""Kafka 4.4's admin tools against a live broker, for the admin APIs Kafka serves on any broker:
ACLs, features, leader elections, reassignments, transactions and producers, and
DescribeTopicPartitions behind ``kafka-topics --describe``. Each prints what it prints against a
single Kafka 4.x node with no authorizer and no transactions.

The tools are Kafka's Java classes from Maven Central (scripts/kafka-dist.sh); without Java or
Maven these tests skip with the reason.
"""

from __future__ import annotations

import json
import re

import pytest

from broker_process import BrokerProcess
from kafka_tools import (
    BROKER_API_VERSIONS, CONSOLE_PRODUCER, KAFKA_ACLS, KAFKA_FEATURES, KAFKA_TOPICS,
    KAFKA_TRANSACTIONS, LEADER_ELECTION, REASSIGN_PARTITIONS,
    require_kafka_dist, run_kafka_class)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("admin-tools")) as b:
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def tool(main_class: str, *args: str, input: str | None = None) -> str:
    """Run a tool; its stdout. Fails the test with the tool's output if it exits non-zero."""
    result = run_kafka_class(main_class, *args, input=input)
    assert result.returncode == 0, \
        f"{main_class} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def create_topic(b, name: str, partitions: int) -> None:
    tool(KAFKA_TOPICS, "--bootstrap-server", b.bootstrap, "--create", "--topic", name,
         "--partitions", str(partitions))


def test_broker_api_versions_lists_the_admin_apis(broker):
    out = tool(BROKER_API_VERSIONS, "--bootstrap-server", broker.bootstrap)
    for api in ("DescribeAcls(29): 1 to 3 [usable: 3]", "CreateAcls(30): 1 to 3 [usable: 3]",
                "DeleteAcls(31): 1 to 3 [usable: 3]", "FindCoordinator(10): 0 to 6 [usable: 6]",
                "ApiVersions(18): 0 to 4 [usable: 4]", "ElectLeaders(43): 0 to 2 [usable: 2]",
                "AlterPartitionReassignments(45): 0 to 1 [usable: 1]",
                "ListPartitionReassignments(46): 0 [usable: 0]",
                "DescribeUserScramCredentials(50): 0 [usable: 0]",
                "DescribeProducers(61): 0 [usable: 0]", "DescribeTransactions(65): 0 [usable: 0]",
                "ListTransactions(66): 0 to 2 [usable: 2]",
                "GetTelemetrySubscriptions(71): 0 [usable: 0]", "PushTelemetry(72): 0 [usable: 0]",
                "DescribeTopicPartitions(75): 0 [usable: 0]"):
        assert api in out, out


def test_kafka_acls_list_prints_that_no_authorizer_is_configured(broker):
    result = run_kafka_class(KAFKA_ACLS, "--bootstrap-server", broker.bootstrap, "--list")
    # Kafka's own answer: the tool fails with SecurityDisabledException and the broker's text
    assert result.returncode == 1
    assert ("Error while executing ACL command: org.apache.kafka.common.errors."
            "SecurityDisabledException: No Authorizer is configured on the broker") in result.stdout


def test_kafka_topics_describe_pages_through_describe_topic_partitions(broker):
    create_topic(broker, "paged", 5)
    out = tool(KAFKA_TOPICS, "--bootstrap-server", broker.bootstrap, "--describe", "--topic",
               "paged", "--partition-size-limit-per-response", "2")
    assert re.search(r"Topic: paged\s+TopicId: \S+\s+PartitionCount: 5\s+ReplicationFactor: 1", out)
    partitions = re.findall(r"Partition: (\d+)\s+Leader: 1\s+Replicas: 1\s+Isr: 1\s+Elr: \s*"
                            r"LastKnownElr:", out)
    assert partitions == ["0", "1", "2", "3", "4"], out


def test_kafka_features_describe_prints_the_finalized_features(broker):
    out = tool(KAFKA_FEATURES, "--bootstrap-server", broker.bootstrap, "describe")
    features = {m[0]: m[1:] for m in re.findall(
        r"Feature: (\S+)\s+SupportedMinVersion: (\S+)\s+SupportedMaxVersion: (\S+)\s+"
        r"FinalizedVersionLevel: (\S+)\s+Epoch: (\S+)", out)}
    assert features["metadata.version"] == ("3.3-IV3", "3.3-IV3", "3.3-IV3", "0"), out
    for name in ("kraft.version", "share.version", "streams.version"):
        assert features[name] == ("0", "0", "0", "0"), out
    assert features["group.version"] == ("0", "1", "1", "0"), out         # KIP-848
    assert features["transaction.version"] == ("0", "2", "2", "0"), out   # transactions V2
    assert features["eligible.leader.replicas.version"] == ("0", "1", "1", "0"), out


def test_kafka_leader_election_finds_every_preferred_leader_elected(broker):
    create_topic(broker, "elect", 2)
    args = ("--bootstrap-server", broker.bootstrap, "--election-type", "preferred")
    assert tool(LEADER_ELECTION, *args, "--all-topic-partitions").strip() == ""
    out = tool(LEADER_ELECTION, *args, "--topic", "elect", "--partition", "1")
    assert "Valid replica already elected for partitions elect-1" in out


def test_kafka_reassign_partitions_lists_none_and_moves_nothing_on_one_node(broker, tmp_path):
    create_topic(broker, "moves", 1)
    args = ("--bootstrap-server", broker.bootstrap)
    assert "No partition reassignments found." in tool(REASSIGN_PARTITIONS, *args, "--list")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "moves", "partition": 0, "replicas": [1]}]}))
    out = tool(REASSIGN_PARTITIONS, *args, "--execute", "--reassignment-json-file", str(plan))
    assert "Successfully started partition reassignment for moves-0" in out
    assert "No partition reassignments found." in tool(REASSIGN_PARTITIONS, *args, "--list")


def test_kafka_transactions_lists_none_and_describes_an_idempotent_producer(broker):
    args = ("--bootstrap-server", broker.bootstrap)
    out = tool(KAFKA_TRANSACTIONS, *args, "list")
    assert out.split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    create_topic(broker, "idem", 1)
    tool(CONSOLE_PRODUCER, *args, "--topic", "idem", input="a\nb\nc\n")  # idempotent by default
    out = tool(KAFKA_TRANSACTIONS, *args, "describe-producers", "--topic", "idem",
               "--partition", "0")
    header, *rows = [line.split() for line in out.strip().splitlines()]
    assert header == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                      "LastTimestamp", "CurrentTransactionStartOffset"]
    [(producer_id, epoch, coordinator_epoch, last_sequence, _, txn_start)] = rows
    assert int(producer_id) >= 0 and epoch == "0"
    assert (coordinator_epoch, last_sequence, txn_start) == ("-1", "2", "None")
