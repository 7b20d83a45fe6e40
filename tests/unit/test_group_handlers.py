"""The group APIs' handlers, every advertised version, through the wire format.

Each request is encoded as a client would send it, parsed by ``parse_request``, dispatched,
and the response encoded and decoded again with kio, so a field a version lacks or a value it
cannot carry fails here rather than in a client.
"""

from __future__ import annotations

import asyncio
import datetime
from types import SimpleNamespace

import pytest
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader

from strata.common.errors import ErrorCode
from strata.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.protocol.codec import (
    API_VERSIONS,
    ApiKey,
    encode_response,
    make,
    parse_request,
    request_class,
    response_class,
)
from strata.cluster.metadata import BrokerInfo
from strata.cluster.image import PartitionState
from strata.server.context import BrokerContext
from strata.server.dispatch import Dispatcher, advertised_versions
from strata.server.network import ConnectionInfo
from wire import client_frame
from test_group_coordinator import MemoryOffsetsLog, subscription

GROUP_APIS = (ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH,
              ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS)
STEPS = max(hi - lo + 1 for k, (lo, hi) in API_VERSIONS.items() if k in GROUP_APIS)
MS = datetime.timedelta(milliseconds=1)
PEER = ConnectionInfo("10.1.2.3:50123", 1)


class Topics:
    """The metadata of one broker (node 1) leading every partition of these topics."""

    advertised_endpoints = {"PLAINTEXT": ("", 0)}

    def __init__(self, **partitions: int):
        self.partitions = {OFFSETS_TOPIC: 50, **partitions}

    def topic(self, name):
        n = self.partitions.get(name)
        return None if n is None else SimpleNamespace(name=name, partitions=n)

    def live_brokers(self, listener=None):
        return [BrokerInfo(1, *self.advertised_endpoints["PLAINTEXT"])]

    def partition_state(self, topic, partition):
        return PartitionState(1, 0, (1,), (1,)) if self.topic(topic) else None


class Client:
    """Sends requests of chosen versions through the Dispatcher, as bytes both ways."""

    def __init__(self, ctx, step: int = 0):
        self.dispatcher = Dispatcher(ctx)
        self.step = step

    def version(self, api_key: int) -> int:
        lo, hi = API_VERSIONS[api_key]
        return lo + self.step % (hi - lo + 1)

    async def send(self, api_key: int, version: int | None = None, **fields):
        version = self.version(api_key) if version is None else version
        body = make(request_class(api_key, version), **fields)
        request = parse_request(client_frame(body, correlation_id=11))
        frame = encode_response(request, await self.dispatcher(request, PEER))
        cls = response_class(api_key, version)
        start = 8 + (0 if cls.__header_schema__ is ResponseHeaderV0 else 1)
        response, size = entity_reader(cls)(frame, start)
        assert start + size == len(frame)
        return response

    @staticmethod
    def nested(api_key: int, version: int, path: str, **fields):
        return make(request_class(api_key, version), path, **fields)


def context(coordinator=None, **topics) -> BrokerContext:
    return BrokerContext(node_id=1, advertised_host="broker.example", advertised_port=9093,
                         metadata=Topics(**topics), replica_manager=None,
                         group_coordinator=coordinator)


async def offset_fetch(client, group_id, topics, **fields):
    """OffsetFetch of one group, ``topics`` [(name, partitions)] or None, in the client's
    version: v8+ batch groups, and the one group's answer is returned."""
    fv = client.version(ApiKey.OFFSET_FETCH)
    if fv < 8:
        return await client.send(ApiKey.OFFSET_FETCH, group_id=group_id, topics=None
                                 if topics is None else tuple(
            client.nested(ApiKey.OFFSET_FETCH, fv, "topics", name=n, partition_indexes=ps)
            for n, ps in topics), **fields)
    group = client.nested(ApiKey.OFFSET_FETCH, fv, "groups", group_id=group_id, topics=None
                          if topics is None else tuple(
        client.nested(ApiKey.OFFSET_FETCH, fv, "groups.topics", name=n, partition_indexes=ps)
        for n, ps in topics))
    r = await client.send(ApiKey.OFFSET_FETCH, groups=(group,), **fields)
    [g] = r.groups
    assert g.group_id == group_id
    return g


def new_coordinator(offsets_log=None) -> GroupCoordinator:
    gc = GroupCoordinator(offsets_log or MemoryOffsetsLog(),
                          GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0))
    gc.load()
    return gc


def test_every_group_api_is_advertised_with_its_full_range():
    advertised = advertised_versions()
    for api in GROUP_APIS:
        assert advertised[api] == API_VERSIONS[api]


@pytest.mark.parametrize("step", range(STEPS))
def test_a_consumer_group_lifecycle_in_every_version(step):
    async def scenario():
        gc = new_coordinator()
        client = Client(context(gc, orders=2), step)
        v = client.version
        sub = subscription("orders")

        if v(ApiKey.FIND_COORDINATOR) >= 4:  # batched: one answer per key
            r = await client.send(ApiKey.FIND_COORDINATOR, key_type=0, coordinator_keys=("g",))
            [r] = r.coordinators
        else:
            r = await client.send(ApiKey.FIND_COORDINATOR, key="g", key_type=0)
        assert (r.error_code, r.node_id, r.host, r.port) == (0, 1, "broker.example", 9093)

        jv = v(ApiKey.JOIN_GROUP)
        protocols = (client.nested(ApiKey.JOIN_GROUP, jv, "protocols", name="range",
                                   metadata=sub),)
        join = dict(group_id="g", session_timeout=10_000 * MS, rebalance_timeout=30_000 * MS,
                    protocol_type="consumer", protocols=protocols)
        r = await client.send(ApiKey.JOIN_GROUP, member_id="", **join)
        if jv >= 4:
            assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED and r.member_id
            r = await client.send(ApiKey.JOIN_GROUP, member_id=r.member_id, **join)
        assert r.error_code == 0
        member = r.member_id
        assert member.startswith("test-client-")
        assert (r.generation_id, r.leader, r.protocol_name) == (1, member, "range")
        assert [(m.member_id, m.metadata) for m in r.members] == [(member, sub)]
        if jv >= 7:
            assert r.protocol_type == "consumer"

        sv = v(ApiKey.SYNC_GROUP)
        assignments = (client.nested(ApiKey.SYNC_GROUP, sv, "assignments", member_id=member,
                                     assignment=b"orders-0-1"),)
        r = await client.send(ApiKey.SYNC_GROUP, group_id="g", generation_id=1, member_id=member,
                              protocol_type="consumer", protocol_name="range",
                              assignments=assignments)
        assert (r.error_code, r.assignment) == (0, b"orders-0-1")
        if sv >= 5:
            assert (r.protocol_type, r.protocol_name) == ("consumer", "range")

        r = await client.send(ApiKey.HEARTBEAT, group_id="g", generation_id=1, member_id=member)
        assert r.error_code == 0
        r = await client.send(ApiKey.HEARTBEAT, group_id="g", generation_id=7, member_id=member)
        assert r.error_code == ErrorCode.ILLEGAL_GENERATION

        cv = v(ApiKey.OFFSET_COMMIT)

        def commit_partition(index, offset, metadata):
            return client.nested(ApiKey.OFFSET_COMMIT, cv, "topics.partitions",
                                 partition_index=index, committed_offset=offset,
                                 committed_leader_epoch=4, committed_metadata=metadata)
        topics = (client.nested(ApiKey.OFFSET_COMMIT, cv, "topics", name="orders", partitions=(
                      commit_partition(0, 15, "m"), commit_partition(1, 3, None),
                      commit_partition(2, 9, ""))),
                  client.nested(ApiKey.OFFSET_COMMIT, cv, "topics", name="missing", partitions=(
                      commit_partition(0, 1, ""),)))
        r = await client.send(ApiKey.OFFSET_COMMIT, group_id="g", generation_id_or_member_epoch=1,
                              member_id=member, retention_time=-MS, topics=topics)
        assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
                for t in r.topics] == [
            ("orders", [(0, 0), (1, 0), (2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]),
            ("missing", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)])]

        fv = v(ApiKey.OFFSET_FETCH)
        r = await offset_fetch(client, "g", [("orders", (0, 1, 2))], require_stable=True)
        # leader epochs are committed from v6 and fetched from v5
        epoch = (4 if cv >= 6 else -1) if fv >= 5 else None
        got = [(p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", None),
                p.metadata, p.error_code) for t in r.topics for p in t.partitions]
        assert got == [(0, 15, epoch, "m", 0), (1, 3, epoch, "", 0),
                       (2, -1, -1 if fv >= 5 else None, "", 0)]
        if fv >= 2:
            assert r.error_code == 0
            r = await offset_fetch(client, "g", None)
            assert sorted((t.name, p.partition_index, p.committed_offset)
                          for t in r.topics for p in t.partitions) == \
                [("orders", 0, 15), ("orders", 1, 3)]

        r = await client.send(ApiKey.DESCRIBE_GROUPS, groups=("g", "nobody"),
                              include_authorized_operations=True)
        g, nobody = r.groups
        assert (g.error_code, g.group_id, g.group_state, g.protocol_type, g.protocol_data) == \
            (0, "g", "Stable", "consumer", "range")
        assert [(m.member_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment)
                for m in g.members] == [(member, "test-client", "/10.1.2.3", sub, b"orders-0-1")]
        if v(ApiKey.DESCRIBE_GROUPS) >= 6:  # KIP-1043
            assert (nobody.error_code, nobody.error_message, nobody.group_state) == \
                (ErrorCode.GROUP_ID_NOT_FOUND, "Group nobody not found.", "Dead")
        else:
            assert (nobody.error_code, nobody.group_state, nobody.members) == (0, "Dead", ())
        if v(ApiKey.DESCRIBE_GROUPS) >= 3:
            assert g.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8)

        r = await client.send(ApiKey.LIST_GROUPS, states_filter=(), types_filter=())
        assert r.error_code == 0
        assert [(x.group_id, x.protocol_type) for x in r.groups] == [("g", "consumer")]
        lv = v(ApiKey.LIST_GROUPS)
        if lv >= 4:
            assert r.groups[0].group_state == "Stable"
            r = await client.send(ApiKey.LIST_GROUPS, states_filter=("empty",))
            assert r.groups == ()
        if lv >= 5:
            assert r.groups == () and (await client.send(
                ApiKey.LIST_GROUPS, types_filter=("classic",))).groups[0].group_type == "classic"

        lev = v(ApiKey.LEAVE_GROUP)
        for expected in (ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID):
            if lev < 3:
                r = await client.send(ApiKey.LEAVE_GROUP, group_id="g", member_id=member)
                assert r.error_code == expected
            else:
                members = (client.nested(ApiKey.LEAVE_GROUP, lev, "members", member_id=member,
                                         group_instance_id=None, reason="done"),)
                r = await client.send(ApiKey.LEAVE_GROUP, group_id="g", members=members)
                assert r.error_code == 0
                assert [(m.member_id, m.error_code) for m in r.members] == [(member, expected)]
        assert gc.group_state("g").value == "Empty"
        gc.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize("step", range(STEPS))
def test_empty_group_ids_are_invalid_except_for_offsets_and_describe(step):
    async def scenario():
        gc = new_coordinator()
        client = Client(context(gc, orders=1), step)
        jv = client.version(ApiKey.JOIN_GROUP)
        protocols = (client.nested(ApiKey.JOIN_GROUP, jv, "protocols", name="range",
                                   metadata=b""),)
        r = await client.send(ApiKey.JOIN_GROUP, group_id="", member_id="",
                              session_timeout=10_000 * MS, protocol_type="consumer",
                              protocols=protocols)
        assert r.error_code == ErrorCode.INVALID_GROUP_ID
        assert r.protocol_name == ("" if jv < 7 else None)
        r = await client.send(ApiKey.SYNC_GROUP, group_id="", generation_id=1, member_id="m",
                              protocol_type="consumer", protocol_name="range")
        assert r.error_code == ErrorCode.INVALID_GROUP_ID
        r = await client.send(ApiKey.HEARTBEAT, group_id="", generation_id=1, member_id="m")
        assert r.error_code == ErrorCode.INVALID_GROUP_ID
        lev = client.version(ApiKey.LEAVE_GROUP)
        members = (client.nested(ApiKey.LEAVE_GROUP, lev, "members", member_id="m"),) \
            if lev >= 3 else ()
        r = await client.send(ApiKey.LEAVE_GROUP, group_id="", member_id="m", members=members)
        assert r.error_code == ErrorCode.INVALID_GROUP_ID

        # Kafka keeps the empty group id working for offsets, for backwards compatibility
        cv = client.version(ApiKey.OFFSET_COMMIT)
        topics = (client.nested(ApiKey.OFFSET_COMMIT, cv, "topics", name="orders", partitions=(
            client.nested(ApiKey.OFFSET_COMMIT, cv, "topics.partitions", partition_index=0,
                          committed_offset=8, committed_metadata=""),)),)
        r = await client.send(ApiKey.OFFSET_COMMIT, group_id="", generation_id_or_member_epoch=-1,
                              member_id="", topics=topics)
        assert r.topics[0].partitions[0].error_code == 0
        r = await offset_fetch(client, "", [("orders", (0,))])
        assert r.topics[0].partitions[0].committed_offset == 8
        r = await client.send(ApiKey.DESCRIBE_GROUPS, groups=("",))
        assert (r.groups[0].error_code, r.groups[0].group_state) == (0, "Empty")
        gc.shutdown()

    asyncio.run(scenario())


@pytest.mark.parametrize("version", range(1, 8))
def test_offset_fetch_reports_a_group_error_per_partition_before_v2_and_top_level_after(version):
    async def scenario():
        gc = new_coordinator()
        gc.shutdown()  # no longer serving: COORDINATOR_NOT_AVAILABLE
        client = Client(context(gc, orders=1))
        r = await client.send(ApiKey.OFFSET_FETCH, version, group_id="g", topics=(client.nested(
            ApiKey.OFFSET_FETCH, version, "topics", name="orders", partition_indexes=(0, 1)),))
        if version < 2:
            assert [(p.partition_index, p.committed_offset, p.error_code)
                    for t in r.topics for p in t.partitions] == \
                [(0, -1, ErrorCode.COORDINATOR_NOT_AVAILABLE),
                 (1, -1, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
        else:
            assert (r.error_code, r.topics) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, ())

    asyncio.run(scenario())


def test_sync_group_v5_without_protocol_type_or_name_is_inconsistent():
    async def scenario():
        client = Client(context(new_coordinator()))
        r = await client.send(ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=1,
                              member_id="m", protocol_type="consumer", protocol_name=None)
        assert r.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    asyncio.run(scenario())


def test_find_coordinator_rejects_an_unknown_key_type_and_answers_without_a_coordinator():
    """A coordinator that is not serving (not yet, or no more) is not available."""
    async def scenario():
        client = Client(context(new_coordinator()))
        r = await client.send(ApiKey.FIND_COORDINATOR, 3, key="g", key_type=5)
        assert (r.error_code, r.node_id) == (ErrorCode.INVALID_REQUEST, -1)
        client.dispatcher.ctx.group_coordinator.shutdown()  # a broker on its way down
        r = await client.send(ApiKey.FIND_COORDINATOR, 2, key="g", key_type=0)
        assert (r.error_code, r.node_id) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1)
        client = Client(context(None))
        r = await client.send(ApiKey.FIND_COORDINATOR, 0, key="g")
        assert (r.error_code, r.node_id, r.host, r.port) == \
            (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1)
        r = await client.send(ApiKey.HEARTBEAT, 4, group_id="g", generation_id=1, member_id="m")
        assert r.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())


def test_commit_of_only_unknown_partitions_does_not_reach_the_coordinator():
    async def scenario():
        offsets = MemoryOffsetsLog()
        client = Client(context(new_coordinator(offsets)))
        topics = (client.nested(ApiKey.OFFSET_COMMIT, 8, "topics", name="ghost", partitions=(
            client.nested(ApiKey.OFFSET_COMMIT, 8, "topics.partitions", partition_index=0,
                          committed_offset=1, committed_metadata=""),)),)
        r = await client.send(ApiKey.OFFSET_COMMIT, 8, group_id="g",
                              generation_id_or_member_epoch=5, member_id="nobody", topics=topics)
        assert r.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert offsets.appends == 0

    asyncio.run(scenario())
