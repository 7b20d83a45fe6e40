"""The admin APIs Kafka serves on any broker, answered as Kafka 4.x answers on one node with no
authorizer: ACLs, producers, transactions, leader elections, reassignments,
SCRAM users, DescribeTopicPartitions paging, features in ApiVersions, client telemetry.

Every advertised version goes through the wire format both ways (see test_group_handlers.Client),
over a real ClusterMetadata, LogManager and ReplicaManager.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from strata.cluster.metadata import ZERO_UUID
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.coordinator.txn_coordinator import TransactionCoordinator
from strata.protocol.codec import ApiKey
from strata.protocol.records import SimpleRecord, build_batch
from strata.server import authz
from strata.server.handlers.api_versions import FEATURES
from test_admin_handlers import broker, create, nested, send, versions  # noqa: F401 - fixture

A = ApiKey


# ---- FindCoordinator ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", [v for v in versions(A.FIND_COORDINATOR) if v >= 1])
def test_find_coordinator_for_a_transactional_id_is_not_available_without_a_coordinator(
        broker, version):
    ctx, _, _ = broker
    if version < 4:
        r = send(ctx, A.FIND_COORDINATOR, version, key="payments", key_type=1)
        answers = [r]
    else:
        r = send(ctx, A.FIND_COORDINATOR, version, key_type=1, coordinator_keys=("a", "b"))
        answers = list(r.coordinators)
        assert [c.key for c in answers] == ["a", "b"]
    for c in answers:
        assert (c.error_code, c.node_id, c.host, c.port) == \
            (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1)


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_answers_each_key_of_a_batch(broker, version):
    ctx, _, _ = broker
    r = send(ctx, A.FIND_COORDINATOR, version, key_type=0, coordinator_keys=("g1", "g2"))
    # no group coordinator in this context: each key on its own says so
    assert [(c.key, c.error_code, c.node_id, c.error_message) for c in r.coordinators] == [
        ("g1", ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "The coordinator is not available."),
        ("g2", ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "The coordinator is not available.")]
    r = send(ctx, A.FIND_COORDINATOR, version, key_type=2, coordinator_keys=("g:t:0",))
    assert [(c.error_code, c.error_message) for c in r.coordinators] == \
        [(ErrorCode.INVALID_REQUEST, "")]
    r = send(ctx, A.FIND_COORDINATOR, version, key_type=9, coordinator_keys=("x",))
    assert [c.error_code for c in r.coordinators] == [ErrorCode.INVALID_REQUEST]


# ---- ACLs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(A.DESCRIBE_ACLS))
def test_acl_apis_answer_security_disabled_without_an_authorizer(broker, version):
    ctx, _, _ = broker
    r = send(ctx, A.DESCRIBE_ACLS, version, resource_type_filter=1, pattern_type_filter=1,
             operation=1, permission_type=1)
    assert (r.error_code, r.error_message, r.resources) == \
        (ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker", ())
    creation = nested(A.CREATE_ACLS, version, "creations", resource_type=2, resource_name="t",
                      resource_pattern_type=3, principal="User:a", host="*", operation=3,
                      permission_type=3)
    r = send(ctx, A.CREATE_ACLS, version, creations=(creation, creation))
    assert [(x.error_code, x.error_message) for x in r.results] == \
        [(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")] * 2
    acl_filter = nested(A.DELETE_ACLS, version, "filters", resource_type_filter=1,
                        pattern_type_filter=1, operation=1, permission_type=1)
    r = send(ctx, A.DELETE_ACLS, version, filters=(acl_filter,))
    assert [(x.error_code, x.error_message, x.matching_acls) for x in r.filter_results] == \
        [(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.", ())]


# ---- DescribeProducers -------------------------------------------------------------------------

def test_describe_producers_reports_each_partitions_idempotent_producers(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 2, 1, {}))
    records = [SimpleRecord(b"v", None, (), 1_700_000_000_000 + i) for i in range(3)]
    for seq in (0, 3):
        batch = build_batch(records, producer_id=4000, producer_epoch=2, base_sequence=seq)
        assert ctx.replica_manager.append(TopicPartition("orders", 1), batch,
                                          produce_version=9).error == 0
    r = send(ctx, A.DESCRIBE_PRODUCERS, 0, topics=(
        nested(A.DESCRIBE_PRODUCERS, 0, "topics", name="orders", partition_indexes=(0, 1, 5)),
        nested(A.DESCRIBE_PRODUCERS, 0, "topics", name="ghost", partition_indexes=(0,)),
        nested(A.DESCRIBE_PRODUCERS, 0, "topics", name="bad/name", partition_indexes=(0,))))
    orders, ghost, bad = r.topics
    p0, p1, p5 = orders.partitions
    assert (p0.partition_index, p0.error_code, p0.active_producers) == (0, 0, ())
    [producer] = p1.active_producers
    assert (producer.producer_id, producer.producer_epoch, producer.last_sequence,
            producer.last_timestamp, producer.coordinator_epoch,
            producer.current_txn_start_offset) == (4000, 2, 5, 1_700_000_000_002, -1, -1)
    assert (p5.error_code, p5.error_message) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
    assert [(p.error_code, p.error_message) for p in ghost.partitions] == \
        [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")]
    assert bad.partitions[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert bad.partitions[0].error_message.startswith("Topic name is invalid")


# ---- transactions ------------------------------------------------------------------------------

class _MemoryTxnLog:
    def __init__(self):
        self.records: dict[int, list] = {}

    async def append(self, partition, records):
        self.records.setdefault(partition, []).extend(records)

    def replay(self, partition):
        return list(self.records.get(partition, ()))


def _with_coordinator(ctx):
    """``ctx`` with a loaded transaction coordinator over an in-memory log, and that coordinator."""
    ids = iter(range(5000, 6000))
    coordinator = TransactionCoordinator(_MemoryTxnLog(), lambda: next(ids))
    coordinator.load({p: 0 for p in range(coordinator.config.num_partitions)})
    return replace(ctx, txn_coordinator=coordinator), coordinator


@pytest.mark.parametrize("version", versions(A.LIST_TRANSACTIONS))
def test_list_transactions_filters_and_names_unknown_state_filters(broker, version):
    ctx, _, _ = broker
    r = send(ctx, A.LIST_TRANSACTIONS, version, state_filters=(), producer_id_filters=(),
             duration_filter=-1, transactional_id_pattern=None)
    assert r.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE     # no coordinator here
    ctx, coordinator = _with_coordinator(ctx)
    for tid in ("app-1", "other"):
        assert asyncio.run(coordinator.init_producer_id(tid, 60_000)).error == ErrorCode.NONE
    r = send(ctx, A.LIST_TRANSACTIONS, version, state_filters=("Empty", "Bogus"),
             producer_id_filters=(), duration_filter=-1, transactional_id_pattern="app-.*")
    listed = sorted((t.transactional_id, t.producer_id, t.transaction_state)
                    for t in r.transaction_states)
    assert (r.error_code, r.unknown_state_filters) == (0, ("Bogus",))
    if version >= 2:   # the pattern filters from v2 on
        assert listed == [("app-1", 5000, "Empty")]
        r = send(ctx, A.LIST_TRANSACTIONS, version, state_filters=(), producer_id_filters=(),
                 duration_filter=-1, transactional_id_pattern="[unclosed")
        assert r.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    else:
        assert listed == [("app-1", 5000, "Empty"), ("other", 5001, "Empty")]
    r = send(ctx, A.LIST_TRANSACTIONS, version, state_filters=("Ongoing",),
             producer_id_filters=(5001,), duration_filter=-1, transactional_id_pattern=None)
    assert r.transaction_states == ()


def test_describe_transactions_answers_each_id_from_the_coordinator(broker):
    ctx, _, _ = broker
    ctx, coordinator = _with_coordinator(ctx)
    create(ctx, 7, ("orders", 2, 1, {}))
    init = asyncio.run(coordinator.init_producer_id("app-1", 60_000))
    assert asyncio.run(coordinator.add_partitions("app-1", init.producer_id, init.producer_epoch,
                                                  [("orders", 1)])) == ErrorCode.NONE
    r = send(ctx, A.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("app-1", "nobody", ""))
    app, nobody, empty = r.transaction_states
    assert (app.error_code, app.transaction_state, app.producer_id, app.producer_epoch,
            app.transaction_timeout.total_seconds(), [(t.topic, t.partitions) for t in app.topics]) \
        == (ErrorCode.NONE, "Ongoing", init.producer_id, 0, 60, [("orders", (1,))])
    assert (nobody.error_code, empty.error_code) == \
        (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, ErrorCode.INVALID_REQUEST)


# ---- ElectLeaders ------------------------------------------------------------------------------

def elect(ctx, version, election_type, partitions):
    topics = None if partitions is None else tuple(
        nested(A.ELECT_LEADERS, version, "topic_partitions", topic=t, partitions=ps)
        for t, ps in partitions)
    r = send(ctx, A.ELECT_LEADERS, version, election_type=election_type, topic_partitions=topics)
    return r, {(t.topic, p.partition_id): (p.error_code, p.error_message)
               for t in r.replica_election_results for p in t.partition_result}


@pytest.mark.parametrize("version", versions(A.ELECT_LEADERS))
def test_elect_leaders_finds_no_election_needed_on_one_node(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 2, 1, {}))
    for election_type in ((0, 1) if version >= 1 else (0,)):
        _, results = elect(ctx, version, election_type, [("orders", (0, 1, 7)), ("ghost", (0,))])
        assert results == {
            ("orders", 0): (ErrorCode.ELECTION_NOT_NEEDED,
                            "Leader election not needed for topic partition."),
            ("orders", 1): (ErrorCode.ELECTION_NOT_NEEDED,
                            "Leader election not needed for topic partition."),
            ("orders", 7): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as orders-7"),
            ("ghost", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as ghost")}
    # all partitions: every topic listed, no partition needing an election
    r, results = elect(ctx, version, 0, None)
    assert [t.topic for t in r.replica_election_results] == sorted(ctx.metadata.topics())
    assert results == {}


@pytest.mark.parametrize("version", [1, 2])
def test_elect_leaders_refuses_an_unknown_election_type(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 1, 1, {}))
    r, results = elect(ctx, version, 5, [("orders", (0,))])
    assert r.error_code == ErrorCode.INVALID_REQUEST
    assert results == {("orders", 0): (ErrorCode.INVALID_REQUEST, "Unknown election type 5")}


# ---- partition reassignments -------------------------------------------------------------------

def test_list_partition_reassignments_finds_none(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 2, 1, {}))
    r = send(ctx, A.LIST_PARTITION_REASSIGNMENTS, 0, topics=None)
    assert (r.error_code, r.error_message, r.topics) == (0, None, ())
    named = nested(A.LIST_PARTITION_REASSIGNMENTS, 0, "topics", name="orders",
                   partition_indexes=(0, 1))
    assert send(ctx, A.LIST_PARTITION_REASSIGNMENTS, 0, topics=(named,)).topics == ()


@pytest.mark.parametrize("version", versions(A.ALTER_PARTITION_REASSIGNMENTS))
def test_alter_partition_reassignments_accepts_only_this_node(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 2, 1, {}))

    def target(p, replicas):
        return nested(A.ALTER_PARTITION_REASSIGNMENTS, version, "topics.partitions",
                      partition_index=p, replicas=replicas)
    r = send(ctx, A.ALTER_PARTITION_REASSIGNMENTS, version, allow_replication_factor_change=True,
             topics=(nested(A.ALTER_PARTITION_REASSIGNMENTS, version, "topics", name="orders",
                            partitions=(target(0, (1,)), target(1, (2,)), target(1, None),
                                        target(0, ()), target(0, (1, 1)), target(9, (1,)))),
                     nested(A.ALTER_PARTITION_REASSIGNMENTS, version, "topics", name="ghost",
                            partitions=(target(0, (1,)),))))
    assert r.error_code == 0
    assert [[(p.error_code, p.error_message) for p in t.partitions] for t in r.responses] == [
        [(0, None),
         (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
          "The manual partition assignment includes broker 2, but no such broker is registered."),
         (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None),
         (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
          "The manual partition assignment includes an empty replica list."),
         (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
          "The manual partition assignment includes the broker 1 more than once."),
         (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition orders:9.")],
        [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named ghost.")]]


# ---- DescribeUserScramCredentials --------------------------------------------------------------

def test_describe_user_scram_credentials_knows_no_user(broker):
    ctx, _, _ = broker
    r = send(ctx, A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=None)
    assert (r.error_code, r.results) == (0, ())
    users = tuple(nested(A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, "users", name=name)
                  for name in ("alice", "bob", "bob"))
    r = send(ctx, A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=users)
    assert [(x.user, x.error_code, x.error_message) for x in r.results] == [
        ("alice", ErrorCode.RESOURCE_NOT_FOUND,
         "Attempt to describe a user credential that does not exist: alice"),
        ("bob", ErrorCode.DUPLICATE_RESOURCE,
         "Cannot describe SCRAM credentials for the same user twice in a single request: bob")]


# ---- DescribeTopicPartitions -------------------------------------------------------------------

def describe_partitions(ctx, names, limit, cursor=None):
    topics = tuple(nested(A.DESCRIBE_TOPIC_PARTITIONS, 0, "topics", name=n) for n in names)
    cursor = None if cursor is None else nested(A.DESCRIBE_TOPIC_PARTITIONS, 0, "cursor",
                                                topic_name=cursor[0], partition_index=cursor[1])
    return send(ctx, A.DESCRIBE_TOPIC_PARTITIONS, 0, topics=topics,
                response_partition_limit=limit, cursor=cursor)


def test_describe_topic_partitions_pages_every_partition_once_in_name_order(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("b", 3, 1, {}), ("a", 2, 1, {}), ("c", 1, 1, {}))
    seen, cursor, pages = [], None, 0
    while True:
        r = describe_partitions(ctx, (), 2, cursor)
        pages += 1
        for t in r.topics:
            assert (t.error_code, t.topic_id, t.topic_authorized_operations) == \
                (0, ctx.metadata.topic(t.name).topic_id, authz.TOPIC)
            for p in t.partitions:
                assert (p.leader_id, p.replica_nodes, p.isr_nodes, p.eligible_leader_replicas) == \
                    (1, (1,), (1,), ())
                seen.append((t.name, p.partition_index))
        if r.next_cursor is None:
            break
        cursor = (r.next_cursor.topic_name, r.next_cursor.partition_index)
    assert seen == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("c", 0)]
    assert pages == 3


def test_describe_topic_partitions_answers_named_topics_and_checks_the_cursor(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("orders", 3, 1, {}))
    r = describe_partitions(ctx, ("orders", "ghost", "bad/name"), 3)
    assert [(t.name, t.error_code, t.topic_id, len(t.partitions)) for t in r.topics] == [
        ("bad/name", ErrorCode.INVALID_TOPIC_EXCEPTION, None, 0),  # kio reads the zero id as None
        ("ghost", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, 0),
        ("orders", 0, ctx.metadata.topic("orders").topic_id, 3)]
    assert r.next_cursor is None
    # a limit used up exactly, more topics left: the cursor names the next topic
    create(ctx, 7, ("payments", 1, 1, {}))
    r = describe_partitions(ctx, ("orders", "payments"), 3)
    assert (r.next_cursor.topic_name, r.next_cursor.partition_index) == ("payments", 0)
    r = describe_partitions(ctx, ("orders",), 0, ("orders", 2))  # the limit is at least 1
    assert [p.partition_index for p in r.topics[0].partitions] == [2]
    for bad_cursor in (("payments", 0), ("orders", -1)):
        r = describe_partitions(ctx, ("orders",), 3, bad_cursor)
        assert [(t.name, t.error_code, t.partitions) for t in r.topics] == \
            [("orders", ErrorCode.INVALID_REQUEST, ())]


# ---- ApiVersions features ----------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(A.API_VERSIONS))
def test_api_versions_reports_the_features_strata_has(broker, version):
    ctx, _, _ = broker
    r = send(ctx, A.API_VERSIONS, version, client_software_name="t", client_software_version="1")
    assert r.error_code == 0
    if version < 3:
        return
    supported = {f.name: (f.min_version, f.max_version) for f in r.supported_features}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in r.finalized_features}
    if version >= 4:
        assert supported == FEATURES
    else:  # a v3 reader cannot take a range starting at 0
        assert supported == {"metadata.version": (7, 7)}
    assert finalized == {"metadata.version": (7, 7), "group.version": (1, 1),
                         "transaction.version": (2, 2), "eligible.leader.replicas.version": (1, 1)}
    assert r.finalized_features_epoch == 0


def test_api_versions_does_not_finalize_elr_when_eligible_leader_replicas_are_off(broker):
    ctx, _, _ = broker
    ctx = replace(ctx, eligible_leader_replicas=False)
    r = send(ctx, A.API_VERSIONS, 4, client_software_name="t", client_software_version="1")
    assert {f.name: f.max_version_level for f in r.finalized_features} == \
        {"metadata.version": 7, "group.version": 1, "transaction.version": 2}
    assert {f.name: f.max_version for f in r.supported_features}[
        "eligible.leader.replicas.version"] == 1   # still supported, only not finalized


# ---- client telemetry --------------------------------------------------------------------------

def test_telemetry_subscription_asks_for_no_metrics_and_a_push_is_checked(broker):
    ctx, _, _ = broker
    r = send(ctx, A.GET_TELEMETRY_SUBSCRIPTIONS, 0, client_instance_id=ZERO_UUID)
    instance = r.client_instance_id
    assert r.error_code == 0 and instance not in (None, ZERO_UUID)
    assert (r.requested_metrics, r.accepted_compression_types, r.delta_temporality) == \
        ((), (4, 3, 1, 2), True)
    again = send(ctx, A.GET_TELEMETRY_SUBSCRIPTIONS, 0, client_instance_id=instance)
    assert (again.client_instance_id, again.subscription_id) == (instance, r.subscription_id)

    def push(instance_id, subscription_id, compression=0):
        return send(ctx, A.PUSH_TELEMETRY, 0, client_instance_id=instance_id,
                    subscription_id=subscription_id, terminating=False,
                    compression_type=compression, metrics=b"").error_code
    assert push(instance, r.subscription_id) == 0
    assert push(instance, r.subscription_id + 1) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert push(instance, r.subscription_id, compression=9) == \
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert push(ZERO_UUID, r.subscription_id) == ErrorCode.INVALID_REQUEST
    assert push(uuid.uuid4(), r.subscription_id) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
