"""Every API's authorization as Kafka's KafkaApis does it, per API family: a principal that
lacks exactly the needed ACL gets Kafka's error, one that has it gets through.

Requests go through the Dispatcher and the wire format both ways (as in test_group_handlers),
from a connection whose principal is ``User:<name>``; the broker's authorizer is a small fake
that allows exactly the (user, operation, resource type, name) tuples granted and counts its
calls.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import replace

from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader

from strata.cluster.metadata import ZERO_UUID
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.coordinator.txn_coordinator import DescribedTxn, ListedTxn
from strata.protocol.codec import (
    ApiKey, encode_response, make, parse_request, request_class, response_class)
from strata.protocol.records import SimpleRecord, build_batch
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    CLUSTER_NAME, AclOperation as Op, AclPermissionType, Action, Authorizer, PatternType,
    ResourceType as R)
from strata.security.sasl import KafkaPrincipal
from strata.server import authz
from strata.server.dispatch import Dispatcher
from strata.server.network import ConnectionInfo
from support.waiting import eventually
from test_admin_handlers import broker, create  # noqa: F401 - the fixture
from test_group_handlers import context, new_coordinator
from wire import client_frame

MS = datetime.timedelta(milliseconds=1)
C = CLUSTER_NAME
TAF = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GAF = ErrorCode.GROUP_AUTHORIZATION_FAILED
CAF = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
TIAF = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class Grants(Authorizer):
    """An authorizer allowing exactly the granted (user, operation, type, name) tuples."""

    def __init__(self, *grants):
        self.grants = set(grants)
        self.calls: list[list] = []

    def authorize(self, principal, host, actions):
        assert host == "10.0.0.7"
        assert all(isinstance(a, Action) and a.pattern_type == PatternType.LITERAL
                   and isinstance(a.log_if_allowed, bool) and isinstance(a.log_if_denied, bool)
                   for a in actions)
        self.calls.append(list(actions))
        return [(principal.name, a.operation, a.resource_type, a.name) in self.grants
                for a in actions]


async def _send(ctx, user: str, api: ApiKey, version: int, **fields):
    conn = ConnectionInfo("10.0.0.7:50123", 3)
    conn.principal = KafkaPrincipal("User", user)
    request = parse_request(client_frame(make(request_class(api, version), **fields),
                                         correlation_id=5))
    frame = encode_response(request, await Dispatcher(ctx)(request, conn))
    cls = response_class(api, version)
    start = 8 + (0 if cls.__header_schema__ is ResponseHeaderV0 else 1)
    return entity_reader(cls)(frame, start)[0]


def send(ctx, user, api, version, **fields):
    return asyncio.run(_send(ctx, user, api, version, **fields))


def n(api, version, path, **fields):
    return make(request_class(api, version), path, **fields)


def batch(count=1):
    return build_batch([SimpleRecord(b"v", None, (), 1_700_000_000_000)] * count)


def end_offset(ctx, topic, partition=0):
    return ctx.replica_manager.get_log(TopicPartition(topic, partition)).log_end_offset


# ---- Produce, Fetch, ListOffsets, OffsetForLeaderEpoch ------------------------------------------

def produce(ctx, user, *topics, version=9, transactional_id=None):
    r = send(ctx, user, ApiKey.PRODUCE, version, acks=-1, timeout=5000 * MS,
             transactional_id=transactional_id, topic_data=tuple(
                 n(ApiKey.PRODUCE, version, "topic_data", name=t, partition_data=(
                     n(ApiKey.PRODUCE, version, "topic_data.partition_data", index=0,
                       records=batch()),)) for t in topics))
    return {t.name: t.partition_responses[0].error_code for t in r.responses}


def test_produce_needs_write_on_each_topic_and_hides_whether_it_exists(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}), ("other", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("alice", Op.WRITE, R.TOPIC, "paid"),
                                         ("bob", Op.DESCRIBE, R.TOPIC, "paid")))
    assert produce(ctx, "bob", "paid", "missing") == {"paid": TAF, "missing": TAF}
    assert end_offset(ctx, "paid") == 0
    assert produce(ctx, "alice", "paid", "other", "missing") == {
        "paid": ErrorCode.NONE, "other": TAF, "missing": TAF}
    assert end_offset(ctx, "paid") == 1 and end_offset(ctx, "other") == 0
    # one authorizer call per request, with one action per topic
    assert [len(c) for c in ctx.authorizer.calls] == [2, 3]


def test_produce_of_transactional_records_needs_write_on_the_transactional_id(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    txn_batch = build_batch([SimpleRecord(b"v", None, (), 1_700_000_000_000)],
                            producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    ctx = replace(ctx, authorizer=Grants(("bob", Op.WRITE, R.TOPIC, "paid")))
    r = send(ctx, "bob", ApiKey.PRODUCE, 9, acks=-1, timeout=5000 * MS, transactional_id="tx",
             topic_data=(n(ApiKey.PRODUCE, 9, "topic_data", name="paid", partition_data=(
                 n(ApiKey.PRODUCE, 9, "topic_data.partition_data", index=0,
                   records=txn_batch),)),))
    assert r.responses[0].partition_responses[0].error_code == TIAF
    assert end_offset(ctx, "paid") == 0


def test_an_acks_0_produce_that_fails_closes_its_connection_instead_of_answering(broker):
    """Kafka answers no acks=0 Produce; one that failed closes the connection, so the
    producer refreshes its metadata (KafkaApis.handleProduceRequest)."""
    import pytest
    from strata.server.network import CloseConnection
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("alice", Op.WRITE, R.TOPIC, "paid")))

    def acks_0(user, topic):
        conn = ConnectionInfo("10.0.0.7:50123", 3)
        conn.principal = KafkaPrincipal("User", user)
        request = parse_request(client_frame(make(request_class(ApiKey.PRODUCE, 9), acks=0,
            timeout=5000 * MS, transactional_id=None, topic_data=(
                n(ApiKey.PRODUCE, 9, "topic_data", name=topic, partition_data=(
                    n(ApiKey.PRODUCE, 9, "topic_data.partition_data", index=0,
                      records=batch()),)),)), correlation_id=5))
        return asyncio.run(Dispatcher(ctx)(request, conn))
    assert acks_0("alice", "paid") is None and end_offset(ctx, "paid") == 1
    with pytest.raises(CloseConnection, match="TOPIC_AUTHORIZATION_FAILED"):
        acks_0("bob", "paid")
    assert end_offset(ctx, "paid") == 1


def fetch(ctx, user, *topics, replica_id=-1, version=12):
    r = send(ctx, user, ApiKey.FETCH, version, replica_id=replica_id, max_wait=0 * MS,
             min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
             topics=tuple(n(ApiKey.FETCH, version, "topics", topic=t, partitions=(
                 n(ApiKey.FETCH, version, "topics.partitions", partition=0, fetch_offset=0,
                   partition_max_bytes=1 << 20),)) for t in topics),
             forgotten_topics_data=(), rack_id="")
    return {t.topic: (t.partitions[0].error_code, bool(t.partitions[0].records))
            for t in r.responses}


def test_fetch_needs_read_on_each_topic(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    assert ctx.replica_manager.append(TopicPartition("paid", 0), batch(), produce_version=9).error == 0
    ctx = replace(ctx, authorizer=Grants(("alice", Op.READ, R.TOPIC, "paid"),
                                         ("bob", Op.DESCRIBE, R.TOPIC, "paid")))
    assert fetch(ctx, "bob", "paid", "missing") == {"paid": (TAF, False), "missing": (TAF, False)}
    assert fetch(ctx, "alice", "paid")["paid"] == (ErrorCode.NONE, True)


def test_a_replica_fetch_needs_cluster_action(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("alice", Op.CLUSTER_ACTION, R.CLUSTER, C),
                                         ("bob", Op.READ, R.TOPIC, "paid")))
    assert fetch(ctx, "bob", "paid", replica_id=2) == {"paid": (TAF, False)}
    assert fetch(ctx, "alice", "paid", replica_id=2)["paid"][0] != TAF


def test_list_offsets_needs_describe_on_each_topic(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))

    def latest(user):
        r = send(ctx, user, ApiKey.LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=(
            n(ApiKey.LIST_OFFSETS, 7, "topics", name="paid", partitions=(
                n(ApiKey.LIST_OFFSETS, 7, "topics.partitions", partition_index=0,
                  timestamp=-1),)),))
        p = r.topics[0].partitions[0]
        return p.error_code, p.offset
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DESCRIBE, R.TOPIC, "paid"),
                                         ("bob", Op.WRITE, R.TOPIC, "other")))
    assert latest("bob") == (TAF, -1)
    assert latest("alice") == (ErrorCode.NONE, 0)


def test_offset_for_leader_epoch_needs_cluster_action_or_describe_on_the_topic(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))

    def ask(user):
        r = send(ctx, user, ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=(
            n(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, "topics", topic="paid", partitions=(
                n(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, "topics.partitions", partition=0,
                  current_leader_epoch=-1, leader_epoch=0),)),))
        return r.topics[0].partitions[0].error_code
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DESCRIBE, R.TOPIC, "paid"),
                                         ("carol", Op.CLUSTER_ACTION, R.CLUSTER, C)))
    assert ask("bob") == TAF
    assert ask("alice") == ErrorCode.NONE
    assert ask("carol") == ErrorCode.NONE


# ---- Metadata, DescribeTopicPartitions, DescribeCluster ------------------------------------------

def metadata(ctx, user, topics, version=12, auto_create=False, ops=False):
    r = send(ctx, user, ApiKey.METADATA, version, allow_auto_topic_creation=auto_create,
             include_topic_authorized_operations=ops, topics=None if topics is None else tuple(
                 n(ApiKey.METADATA, version, "topics", name=t, topic_id=ZERO_UUID)
                 for t in topics))
    return r


def test_metadata_leaves_out_undescribable_topics_and_refuses_named_ones_existing_or_not(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}), ("secret", 2, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("bob", Op.DESCRIBE, R.TOPIC, "paid")))
    everything = metadata(ctx, "bob", None)
    assert [t.name for t in everything.topics] == ["paid"]
    r = metadata(ctx, "bob", ["secret", "nowhere", "paid"])
    answered = {t.name: (t.error_code, t.topic_id, len(t.partitions)) for t in r.topics}
    # (kio decodes the zero id as None)
    assert answered == {"secret": (TAF, None, 0), "nowhere": (TAF, None, 0),
                        "paid": (ErrorCode.NONE, ctx.metadata.topic("paid").topic_id, 1)}
    # the denial of an undescribable topic is not logged for an all-topics request
    assert all(not a.log_if_denied for a in ctx.authorizer.calls[0])


def test_metadata_by_topic_id_answers_the_id_but_not_the_name_when_undescribable(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("secret", 1, 1, {}))
    topic_id = ctx.metadata.topic("secret").topic_id
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DESCRIBE, R.TOPIC, "secret")))

    def by_id(user):
        r = send(ctx, user, ApiKey.METADATA, 12, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False,
                 topics=(n(ApiKey.METADATA, 12, "topics", name=None, topic_id=topic_id),))
        return [(t.error_code, t.name, t.topic_id) for t in r.topics]
    assert by_id("bob") == [(TAF, None, topic_id)]
    assert by_id("alice") == [(ErrorCode.NONE, "secret", topic_id)]


def test_metadata_auto_creation_needs_create_on_the_cluster_or_the_topic(broker):
    ctx, _, _ = broker
    ctx = replace(ctx, authorizer=Grants(("bob", Op.DESCRIBE, R.TOPIC, "fresh"),
                                         ("alice", Op.DESCRIBE, R.TOPIC, "fresh"),
                                         ("alice", Op.CREATE, R.TOPIC, "fresh"),
                                         ("carol", Op.DESCRIBE, R.TOPIC, "other"),
                                         ("carol", Op.CREATE, R.CLUSTER, C)))
    [t] = metadata(ctx, "bob", ["fresh"], version=9, auto_create=True).topics
    assert t.error_code == TAF and ctx.metadata.topic("fresh") is None
    [t] = metadata(ctx, "alice", ["fresh"], version=9, auto_create=True).topics
    assert t.error_code in (ErrorCode.NONE, ErrorCode.LEADER_NOT_AVAILABLE)
    eventually(lambda: ctx.metadata.topic("fresh"), "fresh auto-created")   # off the loop
    [t] = metadata(ctx, "carol", ["other"], version=9, auto_create=True).topics
    eventually(lambda: ctx.metadata.topic("other"), "other auto-created")


def test_metadata_and_describe_cluster_report_the_principals_authorized_operations(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(
        ("bob", Op.DESCRIBE, R.TOPIC, "paid"), ("bob", Op.READ, R.TOPIC, "paid"),
        ("alice", Op.DESCRIBE, R.CLUSTER, C), ("alice", Op.ALTER, R.CLUSTER, C)))
    [t] = metadata(ctx, "bob", ["paid"], version=10, ops=True).topics
    assert t.topic_authorized_operations == (1 << Op.DESCRIBE) | (1 << Op.READ)
    r = send(ctx, "bob", ApiKey.METADATA, 10, topics=(), allow_auto_topic_creation=False,
             include_cluster_authorized_operations=True, include_topic_authorized_operations=False)
    assert r.cluster_authorized_operations == 0     # no DESCRIBE on the cluster
    for user, expected in (("bob", 0), ("alice", (1 << Op.DESCRIBE) | (1 << Op.ALTER))):
        r = send(ctx, user, ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True,
                 endpoint_type=1)
        assert (r.error_code, r.cluster_authorized_operations) == (0, expected)
    r = send(ctx, "bob", ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=False,
             endpoint_type=1)
    assert r.cluster_authorized_operations == authz.OMITTED


def test_describe_topic_partitions_hides_undescribable_topics(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}), ("secret", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("bob", Op.DESCRIBE, R.TOPIC, "paid")))

    def describe(topics):
        r = send(ctx, "bob", ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, response_partition_limit=100,
                 cursor=None, topics=tuple(n(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "topics", name=t)
                                           for t in topics))
        return [(t.name, t.error_code, t.topic_authorized_operations) for t in r.topics]
    assert describe([]) == [("paid", 0, 1 << Op.DESCRIBE)]
    assert describe(["secret", "paid", "nowhere"]) == [
        ("paid", 0, 1 << Op.DESCRIBE), ("nowhere", TAF, authz.OMITTED),
        ("secret", TAF, authz.OMITTED)]


def test_describe_producers_needs_read_on_the_topic(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("alice", Op.READ, R.TOPIC, "paid"),
                                         ("bob", Op.DESCRIBE, R.TOPIC, "paid")))

    def ask(user):
        r = send(ctx, user, ApiKey.DESCRIBE_PRODUCERS, 0, topics=(
            n(ApiKey.DESCRIBE_PRODUCERS, 0, "topics", name="paid", partition_indexes=(0,)),))
        return r.topics[0].partitions[0].error_code
    assert ask("bob") == TAF
    assert ask("alice") == ErrorCode.NONE


# ---- the group APIs ------------------------------------------------------------------------------

def group_ctx(*grants):
    ctx = context(new_coordinator(), orders=2)
    ctx = replace(ctx, authorizer=Grants(*grants))
    return ctx


def test_join_sync_heartbeat_and_leave_need_read_on_the_group():
    async def scenario():
        ctx = group_ctx(("alice", Op.READ, R.GROUP, "g"), ("bob", Op.DESCRIBE, R.GROUP, "g"))
        join = dict(group_id="g", session_timeout=10_000 * MS, rebalance_timeout=30_000 * MS,
                    protocol_type="consumer", member_id="", group_instance_id=None, reason=None,
                    protocols=(n(ApiKey.JOIN_GROUP, 9, "protocols", name="range", metadata=b""),))
        r = await _send(ctx, "bob", ApiKey.JOIN_GROUP, 9, **join)
        assert (r.error_code, r.member_id, r.generation_id) == (GAF, "", -1)
        r = await _send(ctx, "alice", ApiKey.JOIN_GROUP, 9, **join)
        assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED
        member = r.member_id
        r = await _send(ctx, "alice", ApiKey.JOIN_GROUP, 9, **{**join, "member_id": member})
        assert r.error_code == ErrorCode.NONE
        sync = dict(group_id="g", generation_id=1, member_id=member, group_instance_id=None,
                    protocol_type="consumer", protocol_name="range", assignments=())
        assert (await _send(ctx, "bob", ApiKey.SYNC_GROUP, 5, **sync)).error_code == GAF
        assert (await _send(ctx, "alice", ApiKey.SYNC_GROUP, 5, **sync)).error_code == ErrorCode.NONE
        beat = dict(group_id="g", generation_id=1, member_id=member, group_instance_id=None)
        assert (await _send(ctx, "bob", ApiKey.HEARTBEAT, 4, **beat)).error_code == GAF
        assert (await _send(ctx, "alice", ApiKey.HEARTBEAT, 4, **beat)).error_code == ErrorCode.NONE
        leave = dict(group_id="g", members=(n(ApiKey.LEAVE_GROUP, 5, "members", member_id=member,
                                              group_instance_id=None, reason=None),))
        r = await _send(ctx, "bob", ApiKey.LEAVE_GROUP, 5, **leave)
        assert (r.error_code, r.members) == (GAF, ())
        assert (await _send(ctx, "alice", ApiKey.LEAVE_GROUP, 5, **leave)).error_code == ErrorCode.NONE
    asyncio.run(scenario())


async def commit(ctx, user, version=8, **topics):
    r = await _send(ctx, user, ApiKey.OFFSET_COMMIT, version, group_id="g", generation_id_or_member_epoch=-1,
             member_id="", group_instance_id=None, topics=tuple(
                 n(ApiKey.OFFSET_COMMIT, version, "topics", name=t, partitions=(
                     n(ApiKey.OFFSET_COMMIT, version, "topics.partitions", partition_index=0,
                       committed_offset=o, committed_leader_epoch=-1, committed_metadata=""),))
                 for t, o in topics.items()))
    return {t.name: t.partitions[0].error_code for t in r.topics}


def test_offset_commit_needs_read_on_the_group_and_on_each_topic():
    async def scenario():
        ctx = group_ctx(("bob", Op.READ, R.TOPIC, "orders"),
                        ("carol", Op.READ, R.GROUP, "g"),
                        ("alice", Op.READ, R.GROUP, "g"), ("alice", Op.READ, R.TOPIC, "orders"))
        assert await commit(ctx, "bob", orders=5) == {"orders": GAF}
        assert await commit(ctx, "carol", orders=5, nowhere=1) == {"orders": TAF, "nowhere": TAF}
        assert await commit(ctx, "alice", orders=5, nowhere=1) == {
            "orders": ErrorCode.NONE, "nowhere": TAF}
        assert ctx.group_coordinator.fetch_offsets("g", [("orders", 0)]).offsets[("orders", 0)].offset == 5
    asyncio.run(scenario())


def test_offset_fetch_needs_describe_on_the_group_and_shows_only_describable_topics():
    async def scenario():
        ctx = group_ctx(("alice", Op.READ, R.GROUP, "g"), ("alice", Op.READ, R.TOPIC, "orders"),
                        ("alice", Op.READ, R.TOPIC, "audit"),
                        ("bob", Op.DESCRIBE, R.TOPIC, "orders"),
                        ("carol", Op.DESCRIBE, R.GROUP, "g"), ("carol", Op.DESCRIBE, R.TOPIC, "audit"))
        ctx.metadata.partitions["audit"] = 1
        assert await commit(ctx, "alice", orders=5, audit=3) == {"orders": 0, "audit": 0}

        async def fetched(user, topics):
            r = await _send(ctx, user, ApiKey.OFFSET_FETCH, 7, group_id="g", require_stable=False,
                     topics=None if topics is None else tuple(
                         n(ApiKey.OFFSET_FETCH, 7, "topics", name=t, partition_indexes=(0,))
                         for t in topics))
            return r.error_code, {t.name: (t.partitions[0].error_code, t.partitions[0].committed_offset)
                                  for t in r.topics}
        assert await fetched("bob", ["orders"]) == (GAF, {})
        assert await fetched("carol", ["orders", "audit"]) == (0, {"orders": (TAF, -1), "audit": (0, 3)})
        assert await fetched("carol", None) == (0, {"audit": (0, 3)})
    asyncio.run(scenario())


def test_offset_delete_needs_delete_on_the_group_and_read_on_each_topic():
    async def scenario():
        ctx = group_ctx(("alice", Op.READ, R.GROUP, "g"), ("alice", Op.READ, R.TOPIC, "orders"),
                        ("alice", Op.DELETE, R.GROUP, "g"),
                        ("bob", Op.READ, R.GROUP, "g"), ("bob", Op.READ, R.TOPIC, "orders"),
                        ("carol", Op.DELETE, R.GROUP, "g"))
        assert await commit(ctx, "alice", orders=5) == {"orders": 0}

        async def delete(user):
            r = await _send(ctx, user, ApiKey.OFFSET_DELETE, 0, group_id="g", topics=(
                n(ApiKey.OFFSET_DELETE, 0, "topics", name="orders", partitions=(
                    n(ApiKey.OFFSET_DELETE, 0, "topics.partitions", partition_index=0),)),))
            return r.error_code, [p.error_code for t in r.topics for p in t.partitions]
        assert await delete("bob") == (GAF, [])
        assert await delete("carol") == (0, [TAF])
        assert await delete("alice") == (0, [0])
    asyncio.run(scenario())


def test_describe_list_and_delete_groups_need_describe_and_delete_on_each_group():
    async def scenario():
        ctx = group_ctx(("alice", Op.READ, R.GROUP, "g"), ("alice", Op.READ, R.TOPIC, "orders"),
                        ("alice", Op.READ, R.GROUP, "h"),
                        ("bob", Op.DESCRIBE, R.GROUP, "g"), ("bob", Op.DELETE, R.GROUP, "h"),
                        ("carol", Op.DESCRIBE, R.CLUSTER, C))
        for group in ("g", "h"):
            r = await _send(ctx, "alice", ApiKey.OFFSET_COMMIT, 8, group_id=group,
                     generation_id_or_member_epoch=-1, member_id="", group_instance_id=None, topics=(
                         n(ApiKey.OFFSET_COMMIT, 8, "topics", name="orders", partitions=(
                             n(ApiKey.OFFSET_COMMIT, 8, "topics.partitions", partition_index=0,
                               committed_offset=1, committed_leader_epoch=-1,
                               committed_metadata=""),)),))
            assert r.topics[0].partitions[0].error_code == 0
        r = await _send(ctx, "bob", ApiKey.DESCRIBE_GROUPS, 5, groups=("g", "h"),
                 include_authorized_operations=True)
        assert [(g.group_id, g.error_code, g.authorized_operations) for g in r.groups] == [
            ("g", 0, 1 << Op.DESCRIBE), ("h", GAF, authz.OMITTED)]

        async def listed(user):
            r = await _send(ctx, user, ApiKey.LIST_GROUPS, 4, states_filter=())
            return sorted(g.group_id for g in r.groups)
        assert await listed("bob") == ["g"]
        assert await listed("carol") == ["g", "h"]
        assert await listed("alice") == []
        r = await _send(ctx, "bob", ApiKey.DELETE_GROUPS, 2, groups_names=("g", "h"))
        assert {x.group_id: x.error_code for x in r.results} == {"g": GAF, "h": 0}
        assert await listed("carol") == ["g"]
    asyncio.run(scenario())


def test_find_coordinator_needs_describe_on_the_group_or_transactional_id():
    async def scenario():
        ctx = group_ctx(("alice", Op.DESCRIBE, R.GROUP, "g"),
                        ("alice", Op.DESCRIBE, R.TRANSACTIONAL_ID, "tx"))
        r = await _send(ctx, "alice", ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g", "h"))
        assert [(c.key, c.error_code, c.node_id) for c in r.coordinators] == [
            ("g", 0, 1), ("h", GAF, -1)]
        r = await _send(ctx, "bob", ApiKey.FIND_COORDINATOR, 3, key="g", key_type=0)
        assert (r.error_code, r.node_id) == (GAF, -1)
        r = await _send(ctx, "bob", ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",))
        assert r.coordinators[0].error_code == TIAF
        r = await _send(ctx, "alice", ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",))
        assert r.coordinators[0].error_code != TIAF
    asyncio.run(scenario())


class CountingInternalLog:
    def __init__(self):
        self.created = 0

    def ensure_topic(self):
        self.created += 1


def test_find_coordinator_makes_internal_topics_only_for_an_authorized_key():
    async def scenario():
        ctx = group_ctx(("alice", Op.DESCRIBE, R.TRANSACTIONAL_ID, "tx"))
        ctx = replace(ctx, txn_log=CountingInternalLog(), offsets_log=CountingInternalLog())
        for user, key_type, keys in [("bob", 1, ("tx",)), ("bob", 0, ("g",)),
                                     ("alice", 1, ()), ("alice", 0, ())]:
            await _send(ctx, user, ApiKey.FIND_COORDINATOR, 4, key_type=key_type,
                        coordinator_keys=keys)
        r = await _send(ctx, "bob", ApiKey.FIND_COORDINATOR, 3, key="tx", key_type=1)
        assert r.error_code == TIAF
        assert (ctx.txn_log.created, ctx.offsets_log.created) == (0, 0)
        await _send(ctx, "alice", ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",))
        assert ctx.txn_log.created == 1
    asyncio.run(scenario())


# ---- the transaction APIs ------------------------------------------------------------------------

class FakeProducerIds:
    def generate(self):
        return 4000


def test_init_producer_id_needs_write_on_the_transactional_id_or_idempotent_write(broker):
    ctx, _, _ = broker
    ctx = replace(ctx, producer_ids=FakeProducerIds())
    ctx = replace(ctx, authorizer=Grants(("alice", Op.IDEMPOTENT_WRITE, R.CLUSTER, C)))

    def init(user, tid=None):
        r = send(ctx, user, ApiKey.INIT_PRODUCER_ID, 4, transactional_id=tid,
                 transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1)
        return r.error_code, r.producer_id
    assert init("bob") == (CAF, -1)
    assert init("alice") == (0, 4000)
    assert init("alice", "tx") == (TIAF, -1)


def test_init_producer_id_of_an_idempotent_producer_allows_write_on_any_topic(broker):
    """Kafka's authorizeByResourceType, over the real authorizer: WRITE on some topic (a
    prefix or a literal name) not covered by a DENY."""
    ctx, _, _ = broker
    ctx = replace(ctx, producer_ids=FakeProducerIds())
    acls = StandardAuthorizer()
    ctx = replace(ctx, authorizer=acls)

    def grant(user, name, pattern, permission=AclPermissionType.ALLOW):
        assert acls.create_acls([AclBinding(ResourcePattern(R.TOPIC, name, pattern),
                                             AccessControlEntry(f"User:{user}", "*", Op.WRITE,
                                                                permission))]) == [None]

    def init(user):
        return send(ctx, user, ApiKey.INIT_PRODUCER_ID, 4, transactional_id=None,
                    transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1).error_code
    grant("alice", "orders-", PatternType.PREFIXED)
    grant("bob", "orders", PatternType.LITERAL)
    grant("bob", "ord", PatternType.PREFIXED, AclPermissionType.DENY)
    assert init("alice") == 0
    assert init("bob") == CAF      # the only allowed topic is covered by a prefixed DENY
    assert init("carol") == CAF


def test_the_transaction_apis_need_write_on_the_transactional_id(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(
        ("bob", Op.WRITE, R.TOPIC, "paid"), ("bob", Op.READ, R.GROUP, "g"),
        ("carol", Op.WRITE, R.TRANSACTIONAL_ID, "tx")))
    r = send(ctx, "bob", ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="tx",
             v3_and_below_producer_id=1, v3_and_below_producer_epoch=0, v3_and_below_topics=(
                 n(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "v3_and_below_topics", name="paid",
                   partitions=(0,)),))
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == TIAF
    r = send(ctx, "carol", ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="tx",
             v3_and_below_producer_id=1, v3_and_below_producer_epoch=0, v3_and_below_topics=(
                 n(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "v3_and_below_topics", name="paid",
                   partitions=(0,)),
                 n(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "v3_and_below_topics", name="__consumer_offsets",
                   partitions=(0,))))
    codes = {t.name: t.results_by_partition[0].partition_error_code
             for t in r.results_by_topic_v3_and_below}
    assert codes == {"paid": TAF, "__consumer_offsets": TAF}   # internal topics: never
    r = send(ctx, "bob", ApiKey.END_TXN, 3, transactional_id="tx", producer_id=1,
             producer_epoch=0, committed=True)
    assert r.error_code == TIAF
    r = send(ctx, "carol", ApiKey.END_TXN, 3, transactional_id="tx", producer_id=1,
             producer_epoch=0, committed=True)
    assert r.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE   # authorized; no coordinator here
    r = send(ctx, "bob", ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id="tx", producer_id=1,
             producer_epoch=0, group_id="g")
    assert r.error_code == TIAF
    r = send(ctx, "carol", ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id="tx", producer_id=1,
             producer_epoch=0, group_id="g")
    assert r.error_code == GAF


def test_txn_offset_commit_needs_the_transactional_id_the_group_and_the_topics():
    async def scenario():
        ctx = group_ctx(("bob", Op.READ, R.GROUP, "g"), ("bob", Op.READ, R.TOPIC, "orders"),
                        ("carol", Op.WRITE, R.TRANSACTIONAL_ID, "tx"),
                        ("carol", Op.READ, R.TOPIC, "orders"),
                        ("dave", Op.WRITE, R.TRANSACTIONAL_ID, "tx"), ("dave", Op.READ, R.GROUP, "g"))

        async def commit_txn(user):
            r = await _send(ctx, user, ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id="tx", group_id="g",
                     producer_id=1, producer_epoch=0, generation_id=-1, member_id="",
                     group_instance_id=None, topics=(n(ApiKey.TXN_OFFSET_COMMIT, 3, "topics",
                                                       name="orders", partitions=(
                         n(ApiKey.TXN_OFFSET_COMMIT, 3, "topics.partitions", partition_index=0,
                           committed_offset=3, committed_leader_epoch=-1, committed_metadata=""),)),))
            return r.topics[0].partitions[0].error_code
        assert await commit_txn("bob") == TIAF
        assert await commit_txn("carol") == GAF
        assert await commit_txn("dave") == TAF
    asyncio.run(scenario())


class FakeTxnCoordinator:
    """Two ongoing transactions, tx (on paid and audit) and other."""

    def describe(self, tid):
        return DescribedTxn(ErrorCode.NONE, tid, "Ongoing", 7, 0, 60_000, 1_700_000_000_000,
                            (TopicPartition("audit", 0), TopicPartition("paid", 0)))

    def list_transactions(self, states, producer_ids, duration):
        return ErrorCode.NONE, [ListedTxn("tx", 7, "Ongoing"), ListedTxn("other", 8, "Ongoing")], []


def test_transactions_are_described_and_listed_only_where_the_principal_may_describe(broker):
    ctx, _, _ = broker
    ctx = replace(ctx, txn_coordinator=FakeTxnCoordinator())
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DESCRIBE, R.TRANSACTIONAL_ID, "tx"),
                                         ("alice", Op.DESCRIBE, R.TOPIC, "paid")))
    r = send(ctx, "bob", ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("tx",))
    assert (r.transaction_states[0].error_code, r.transaction_states[0].topics) == (TIAF, ())
    r = send(ctx, "alice", ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("tx",))
    [state] = r.transaction_states
    assert (state.error_code, [(t.topic, t.partitions) for t in state.topics]) == (
        0, [("paid", (0,))])   # audit's partition is not shown
    for user, listed in (("bob", []), ("alice", ["tx"])):
        r = send(ctx, user, ApiKey.LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(),
                 duration_filter=-1)
        assert [t.transactional_id for t in r.transaction_states] == listed


# ---- the inter-broker APIs -----------------------------------------------------------------------

def test_inter_broker_apis_need_cluster_action(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("broker", Op.CLUSTER_ACTION, R.CLUSTER, C),
                                         ("admin", Op.ALTER, R.CLUSTER, C)))
    markers = (n(ApiKey.WRITE_TXN_MARKERS, 1, "markers", producer_id=9, producer_epoch=0,
                 transaction_result=True, coordinator_epoch=0, topics=(
                     n(ApiKey.WRITE_TXN_MARKERS, 1, "markers.topics", name="paid",
                       partition_indexes=(0,)),)),)
    for user, expected in (("client", CAF), ("broker", None), ("admin", None)):
        r = send(ctx, user, ApiKey.WRITE_TXN_MARKERS, 1, markers=markers)
        code = r.markers[0].topics[0].partitions[0].error_code
        assert (code == CAF) == (expected == CAF), user
    r = send(ctx, "client", ApiKey.ADD_PARTITIONS_TO_TXN, 4, transactions=(
        n(ApiKey.ADD_PARTITIONS_TO_TXN, 4, "transactions", transactional_id="tx", producer_id=1,
          producer_epoch=0, verify_only=True, topics=(
              n(ApiKey.ADD_PARTITIONS_TO_TXN, 4, "transactions.topics", name="paid",
                partitions=(0,)),)),))
    assert (r.error_code, r.results_by_transaction) == (CAF, ())
    r = send(ctx, "client", ApiKey.ALTER_PARTITION, 3, broker_id=2, broker_epoch=1, topics=())
    assert r.error_code == CAF
    r = send(ctx, "broker", ApiKey.ALTER_PARTITION, 3, broker_id=2, broker_epoch=1, topics=())
    assert r.error_code != CAF


# ---- the admin APIs ------------------------------------------------------------------------------

def test_create_topics_needs_create_on_the_cluster_or_topic_and_describe_configs_for_them(broker):
    ctx, _, _ = broker
    ctx = replace(ctx, authorizer=Grants(("alice", Op.CREATE, R.TOPIC, "mine"),
                                         ("alice", Op.DESCRIBE_CONFIGS, R.TOPIC, "mine"),
                                         ("admin", Op.CREATE, R.CLUSTER, C)))

    def create_as(user, *names):
        r = send(ctx, user, ApiKey.CREATE_TOPICS, 7, timeout_ms=1000, validate_only=False,
                 topics=tuple(n(ApiKey.CREATE_TOPICS, 7, "topics", name=t, num_partitions=1,
                                replication_factor=1, assignments=(), configs=()) for t in names))
        return {t.name: (t.error_code, t.error_message, t.num_partitions,
                         t.topic_config_error_code, bool(t.configs)) for t in r.topics}
    assert create_as("bob", "mine") == {"mine": (TAF, "Authorization failed.", -1, 0, False)}
    assert ctx.metadata.topic("mine") is None
    assert create_as("alice", "mine", "theirs") == {
        "mine": (0, None, 1, 0, True), "theirs": (TAF, "Authorization failed.", -1, 0, False)}
    assert create_as("admin", "theirs") == {"theirs": (0, None, -1, TAF, False)}
    assert ctx.metadata.topic("theirs") is not None


def test_delete_topics_needs_delete_and_hides_the_name_of_an_undescribable_id(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("doomed", 1, 1, {}), ("kept", 1, 1, {}))
    kept_id = ctx.metadata.topic("kept").topic_id
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DELETE, R.TOPIC, "doomed"),
                                         ("bob", Op.DESCRIBE, R.TOPIC, "doomed")))

    def delete(user, *topics):
        r = send(ctx, user, ApiKey.DELETE_TOPICS, 6, timeout_ms=1000, topics=tuple(
            n(ApiKey.DELETE_TOPICS, 6, "topics", name=name, topic_id=topic_id or ZERO_UUID)
            for name, topic_id in topics))
        return [(x.name, x.topic_id, x.error_code) for x in r.responses]
    assert delete("bob", ("doomed", None), ("nowhere", None)) == [
        ("doomed", None, TAF), ("nowhere", None, TAF)]
    assert delete("bob", (None, kept_id)) == [(None, kept_id, TAF)]
    assert ctx.metadata.topic("doomed") is not None
    assert delete("alice", ("doomed", None))[0][2] == 0
    assert ctx.metadata.topic("doomed") is None


def test_create_partitions_and_delete_records_need_alter_and_delete_on_the_topic(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx.replica_manager.append(TopicPartition("paid", 0), batch(3), produce_version=9)
    ctx = replace(ctx, authorizer=Grants(("alice", Op.ALTER, R.TOPIC, "paid"),
                                         ("alice", Op.DELETE, R.TOPIC, "paid")))

    def grow(user):
        r = send(ctx, user, ApiKey.CREATE_PARTITIONS, 3, timeout_ms=1000, validate_only=False,
                 topics=(n(ApiKey.CREATE_PARTITIONS, 3, "topics", name="paid", count=2,
                           assignments=None),))
        return r.results[0].error_code

    def trim(user):
        r = send(ctx, user, ApiKey.DELETE_RECORDS, 2, timeout_ms=1000, topics=(
            n(ApiKey.DELETE_RECORDS, 2, "topics", name="paid", partitions=(
                n(ApiKey.DELETE_RECORDS, 2, "topics.partitions", partition_index=0,
                  offset=2),)),))
        return r.topics[0].partitions[0].error_code
    assert (grow("bob"), trim("bob")) == (TAF, TAF)
    assert ctx.metadata.topic("paid").partitions == 1
    assert (grow("alice"), trim("alice")) == (0, 0)
    assert ctx.metadata.topic("paid").partitions == 2


def test_configs_need_describe_configs_and_alter_configs_on_the_topic_or_the_cluster(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    ctx = replace(ctx, authorizer=Grants(("alice", Op.DESCRIBE_CONFIGS, R.TOPIC, "paid"),
                                         ("alice", Op.ALTER_CONFIGS, R.TOPIC, "paid"),
                                         ("admin", Op.DESCRIBE_CONFIGS, R.CLUSTER, C)))
    resources = ((2, "paid"), (4, "1"))

    def describe(user):
        r = send(ctx, user, ApiKey.DESCRIBE_CONFIGS, 4, include_synonyms=False,
                 include_documentation=False, resources=tuple(
                     n(ApiKey.DESCRIBE_CONFIGS, 4, "resources", resource_type=t, resource_name=nm,
                       configuration_keys=None) for t, nm in resources))
        return [(x.resource_name, x.error_code, x.error_message, bool(x.configs))
                for x in r.results]
    assert describe("alice") == [("paid", 0, None, True),
                                 ("1", CAF, "Cluster authorization failed.", False)]
    assert describe("admin") == [("paid", TAF, "Topic authorization failed.", False),
                                 ("1", 0, None, True)]

    def alter(user, incremental):
        api = ApiKey.INCREMENTAL_ALTER_CONFIGS if incremental else ApiKey.ALTER_CONFIGS
        version = 1 if incremental else 2
        extra = {"config_operation": 0} if incremental else {}
        r = send(ctx, user, api, version, validate_only=False, resources=(
            n(api, version, "resources", resource_type=2, resource_name="paid", configs=(
                n(api, version, "resources.configs", name="retention.ms", value="1000",
                  **extra),)),))
        return r.responses[0].error_code
    for incremental in (False, True):
        assert alter("admin", incremental) == TAF
        assert alter("alice", incremental) == 0


def test_cluster_admin_apis_need_their_cluster_operation(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    grants = {Op.ALTER: "alterer", Op.DESCRIBE: "describer", Op.DESCRIBE_CONFIGS: "reader",
              Op.ALTER_CONFIGS: "configurer"}
    ctx = replace(ctx, authorizer=Grants(*((user, op, R.CLUSTER, C) for op, user in grants.items())))
    requests = [  # (api, version, needed operation, fields, the response's error)
        (ApiKey.DESCRIBE_LOG_DIRS, 4, Op.DESCRIBE, dict(topics=None), lambda r: r.error_code),
        (ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, Op.DESCRIBE, dict(timeout_ms=1000, topics=None),
         lambda r: r.error_code),
        (ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, Op.DESCRIBE, dict(users=None),
         lambda r: r.error_code),
        (ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, Op.ALTER, dict(timeout_ms=1000, topics=()),
         lambda r: r.error_code),
        (ApiKey.ELECT_LEADERS, 2, Op.ALTER, dict(election_type=0, timeout_ms=1000,
                                                  topic_partitions=None), lambda r: r.error_code),
        (ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, Op.ALTER, dict(
            deletions=(n(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, "deletions", name="u",
                         mechanism=1),), upsertions=()), lambda r: r.results[0].error_code),
        (ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, Op.DESCRIBE_CONFIGS, dict(components=(), strict=False),
         lambda r: r.error_code),
        (ApiKey.ALTER_CLIENT_QUOTAS, 1, Op.ALTER_CONFIGS, dict(validate_only=True, entries=(
            n(ApiKey.ALTER_CLIENT_QUOTAS, 1, "entries", entity=(
                n(ApiKey.ALTER_CLIENT_QUOTAS, 1, "entries.entity", entity_type="user",
                  entity_name="u"),), ops=(
                n(ApiKey.ALTER_CLIENT_QUOTAS, 1, "entries.ops", key="producer_byte_rate",
                  value=1024.0, remove=False),)),)), lambda r: r.entries[0].error_code),
    ]
    for api, version, op, fields, error in requests:
        for user in grants.values():
            code = error(send(ctx, user, api, version, **fields))
            assert (code == CAF) == (user != grants[op]), (api.name, user, code)


def test_no_authorizer_is_asked_nothing_and_allows_everything(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("paid", 1, 1, {}))
    assert ctx.authorizer is None
    assert produce(ctx, "anyone", "paid") == {"paid": 0}
    assert fetch(ctx, "anyone", "paid")["paid"] == (0, True)
    [t] = metadata(ctx, "anyone", ["paid"], version=10, ops=True).topics
    assert t.topic_authorized_operations == authz.TOPIC
