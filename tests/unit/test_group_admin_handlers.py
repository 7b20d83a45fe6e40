"""DeleteGroups and OffsetDelete through the wire format, every advertised version, with the
error codes Kafka's group coordinator answers."""

from __future__ import annotations

import asyncio

import pytest

from strata.common.errors import ErrorCode
from strata.coordinator.group import GroupState
from strata.coordinator.offsets_records import GroupMetadataKey, OffsetCommitKey, partition_for
from strata.protocol.codec import API_VERSIONS, ApiKey
from strata.server.dispatch import advertised_versions
from test_group_coordinator import MemoryOffsetsLog, subscription
from test_group_handlers import Client, context, new_coordinator


def test_delete_groups_and_offset_delete_are_advertised_as_kafka_4_serves_them():
    advertised = advertised_versions()
    assert advertised[ApiKey.DELETE_GROUPS] == API_VERSIONS[ApiKey.DELETE_GROUPS] == (0, 2)
    assert advertised[ApiKey.OFFSET_DELETE] == API_VERSIONS[ApiKey.OFFSET_DELETE] == (0, 0)


async def stable_member(gc, group: str, *topics: str) -> str:
    """One consumer joined to ``group``, subscribed to ``topics``, Stable; its member id."""
    join = await gc.join_group(group, "", "consumer", [("range", subscription(*topics))],
                               session_timeout_ms=10_000)
    assert join.error == ErrorCode.NONE
    sync = await gc.sync_group(group, join.generation_id, join.member_id,
                               assignments={join.member_id: b""})
    assert sync.error == ErrorCode.NONE
    return join.member_id


@pytest.mark.parametrize("version", range(3))
def test_delete_groups_deletes_empty_groups_and_refuses_the_others(version):
    async def scenario():
        offsets = MemoryOffsetsLog()
        gc = new_coordinator(offsets)
        client = Client(context(gc, orders=2))
        member = await stable_member(gc, "busy", "orders")
        await gc.commit_offsets("busy", member, 1, [("orders", 0, 5)])
        await gc.commit_offsets("idle", "", -1, [("orders", 0, 7), ("orders", 1, 9)])
        r = await client.send(ApiKey.DELETE_GROUPS, version,
                              groups_names=("idle", "busy", "nobody", "idle"))
        assert [(x.group_id, x.error_code) for x in r.results] == [
            ("idle", 0), ("busy", ErrorCode.NON_EMPTY_GROUP),
            ("nobody", ErrorCode.GROUP_ID_NOT_FOUND)]
        assert gc.fetch_offsets("idle").offsets == {}
        assert gc.fetch_offsets("busy").offsets[("orders", 0)].offset == 5
        tail = offsets.decoded(partition_for("idle"))[-2:]
        assert sorted(tail, key=repr) == [(OffsetCommitKey("idle", "orders", 0), None),
                                          (OffsetCommitKey("idle", "orders", 1), None)]
        # deleted once: the second time it is not found
        r = await client.send(ApiKey.DELETE_GROUPS, version, groups_names=("idle",))
        assert r.results[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND

    asyncio.run(scenario())


def test_delete_groups_of_a_group_that_had_members_tombstones_its_metadata_too():
    async def scenario():
        offsets = MemoryOffsetsLog()
        gc = new_coordinator(offsets)
        client = Client(context(gc, orders=1))
        member = await stable_member(gc, "g", "orders")
        await gc.commit_offsets("g", member, 1, [("orders", 0, 5)])
        gc.leave_group("g", [(member,)])
        for _ in range(5):
            await asyncio.sleep(0)
        r = await client.send(ApiKey.DELETE_GROUPS, 2, groups_names=("g",))
        assert r.results[0].error_code == 0
        assert offsets.decoded(partition_for("g"))[-2:] == [
            (OffsetCommitKey("g", "orders", 0), None), (GroupMetadataKey("g"), None)]
        # a restarted coordinator does not bring it back
        gc.shutdown()
        assert new_coordinator(offsets).group_state("g") is None

    asyncio.run(scenario())


def test_delete_groups_without_a_serving_coordinator_is_coordinator_not_available():
    async def scenario():
        r = await Client(context(None)).send(ApiKey.DELETE_GROUPS, 1, groups_names=("a", "b"))
        assert [(x.group_id, x.error_code) for x in r.results] == [
            ("a", ErrorCode.COORDINATOR_NOT_AVAILABLE), ("b", ErrorCode.COORDINATOR_NOT_AVAILABLE)]
        gc = new_coordinator()
        gc.shutdown()
        r = await Client(context(gc)).send(ApiKey.DELETE_GROUPS, 0, groups_names=("a",))
        assert r.results[0].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())


def offset_delete_topics(client, **partitions):
    return tuple(client.nested(ApiKey.OFFSET_DELETE, 0, "topics", name=name, partitions=tuple(
        client.nested(ApiKey.OFFSET_DELETE, 0, "topics.partitions", partition_index=i)
        for i in indexes)) for name, indexes in partitions.items())


def answered(r):
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def test_offset_delete_refuses_topics_the_members_consume_and_deletes_the_others():
    async def scenario():
        offsets = MemoryOffsetsLog()
        gc = new_coordinator(offsets)
        client = Client(context(gc, orders=2, audit=1))
        member = await stable_member(gc, "g", "orders")
        await gc.commit_offsets("g", member, 1, [("orders", 0, 5), ("audit", 0, 3)])
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="g", topics=offset_delete_topics(
            client, orders=(0, 1), audit=(0,), ghost=(0,)))
        assert r.error_code == 0
        assert answered(r) == {("orders", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                               ("orders", 1): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                               ("audit", 0): 0,
                               ("ghost", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert list(gc.fetch_offsets("g").offsets) == [("orders", 0)]
        assert offsets.decoded(partition_for("g"))[-1] == (OffsetCommitKey("g", "audit", 0), None)

    asyncio.run(scenario())


def test_offset_delete_of_an_empty_group_answers_every_partition_even_without_an_offset():
    """What the admin client's deleteConsumerGroupOffsets (and Kafka Connect's offset reset)
    needs: an answer for every partition it asked about."""
    async def scenario():
        gc = new_coordinator()
        client = Client(context(gc, orders=3))
        await gc.commit_offsets("connect-sink", "", -1, [("orders", 0, 5)])
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="connect-sink",
                              topics=offset_delete_topics(client, orders=(0, 1, 7)))
        assert (r.error_code, answered(r)) == (0, {
            ("orders", 0): 0, ("orders", 1): 0,
            ("orders", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
        assert gc.fetch_offsets("connect-sink").offsets == {}
        assert gc.group_state("connect-sink") == GroupState.EMPTY   # until the expiry pass

    asyncio.run(scenario())


def test_offset_delete_group_errors_replace_the_whole_response():
    async def scenario():
        gc = new_coordinator()
        client = Client(context(gc, orders=1))
        topics = offset_delete_topics(client, orders=(0,))
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="nobody", topics=topics)
        assert (r.error_code, r.topics) == (ErrorCode.GROUP_ID_NOT_FOUND, ())
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="", topics=topics)
        assert (r.error_code, r.topics) == (ErrorCode.INVALID_GROUP_ID, ())
        # a group with members that does not use the consumer protocol (Kafka Connect workers)
        join = await gc.join_group("workers", "", "connect", [("sessioned", b"")],
                                   session_timeout_ms=10_000)
        assert join.error == ErrorCode.NONE
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="workers", topics=topics)
        assert r.error_code == ErrorCode.NON_EMPTY_GROUP
        gc.shutdown()
        r = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="g", topics=topics)
        assert r.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE

    asyncio.run(scenario())
