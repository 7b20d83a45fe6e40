"""ConsumerGroupHeartbeat, ConsumerGroupDescribe and the member-epoch versions of
OffsetCommit/OffsetFetch through the Dispatcher and the wire format both ways, with and
without an authorizer (Kafka's: READ on the group, DESCRIBE on subscribed topics; a regex
matches only topics the caller may DESCRIBE)."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest

from strata.common.errors import ErrorCode
from strata.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from strata.protocol.codec import ApiKey, make, request_class
from strata.security.authorizer import AclOperation as Op, ResourceType as R
from test_api_authorization import GAF, TAF, Grants, _send
from test_group_coordinator import MemoryOffsetsLog
from test_group_handlers import Topics, context

MS = datetime.timedelta(milliseconds=1)
HB = ApiKey.CONSUMER_GROUP_HEARTBEAT
DESCRIBE = ApiKey.CONSUMER_GROUP_DESCRIBE


class Image(Topics):
    """Topics with ids, as the coordinator's topic image and the handlers' metadata."""

    cluster_id = "cluster"
    controller_id = 1

    def topic(self, name):
        n = self.partitions.get(name)
        return None if n is None else SimpleNamespace(
            name=name, partitions=n, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, name),
            internal=name.startswith("__"))

    def topics(self):
        return {name: self.topic(name) for name in self.partitions}

    def topic_by_id(self, topic_id):
        return next((t for t in self.topics().values() if t.topic_id == topic_id), None)


def setup(**partitions):
    image = Image(**partitions)
    gc = GroupCoordinator(MemoryOffsetsLog(), GroupCoordinatorConfig(), topics=image.topics)
    gc.load()
    return replace(context(gc), metadata=image), image


def tid(name):
    return uuid.uuid5(uuid.NAMESPACE_DNS, name)


async def heartbeat(ctx, user, version, member_id, epoch, *, topics=("orders",), regex=None,
              owned=(), group="g"):
    fields = dict(group_id=group, member_id=member_id, member_epoch=epoch,
                  rebalance_timeout=300_000 * MS, subscribed_topic_names=topics,
                  topic_partitions=tuple(
                      make(request_class(HB, version), "topic_partitions", topic_id=t,
                           partitions=tuple(ps)) for t, ps in owned))
    if version >= 1:
        fields["subscribed_topic_regex"] = regex
    return await _send(ctx, user, HB, version, **fields)


def assignment(r):
    return {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}


@pytest.mark.parametrize("version", [0, 1])
def test_a_member_joins_is_described_and_commits_with_its_epoch(version):
    async def scenario():
        ctx, _ = setup(orders=3)
        r = await heartbeat(ctx, "alice", version, "m-1", 0)
        assert (r.error_code, r.member_id, r.member_epoch, r.heartbeat_interval) == \
            (0, "m-1", 1, 5000 * MS)
        assert assignment(r) == {tid("orders"): {0, 1, 2}}
        d = (await _send(ctx, "alice", DESCRIBE, version, group_ids=("g", "nope"),
                              include_authorized_operations=False))
        g, nope = d.groups
        assert (g.error_code, g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name) == \
            (0, "Stable", 1, 1, "uniform")
        [m] = g.members
        assert (m.member_id, m.member_epoch, m.subscribed_topic_names) == ("m-1", 1, ("orders",))
        assert [(t.topic_name, t.partitions) for t in m.assignment.topic_partitions] == \
            [("orders", (0, 1, 2))]
        assert (nope.error_code, nope.error_message) == (ErrorCode.GROUP_ID_NOT_FOUND,
                                                        "Group nope not found.")

        async def commit(epoch):
            rq = request_class(ApiKey.OFFSET_COMMIT, 9)
            r = (await _send(ctx, "alice", ApiKey.OFFSET_COMMIT, 9, group_id="g",
                                  generation_id_or_member_epoch=epoch, member_id="m-1", topics=(
                                      make(rq, "topics", name="orders", partitions=(
                                          make(rq, "topics.partitions", partition_index=0,
                                               committed_offset=5),)),)))
            return r.topics[0].partitions[0].error_code
        assert await commit(0) == ErrorCode.STALE_MEMBER_EPOCH
        assert await commit(1) == ErrorCode.NONE
        rq = request_class(ApiKey.OFFSET_FETCH, 9)

        async def fetch(epoch):
            r = (await _send(ctx, "alice", ApiKey.OFFSET_FETCH, 9, groups=(
                make(rq, "groups", group_id="g", member_id="m-1", member_epoch=epoch, topics=(
                    make(rq, "groups.topics", name="orders", partition_indexes=(0,)),)),)))
            [g] = r.groups
            return g.error_code, [p.committed_offset for t in g.topics for p in t.partitions]
        assert await fetch(1) == (ErrorCode.NONE, [5])
        assert await fetch(3) == (ErrorCode.STALE_MEMBER_EPOCH, [])
        left = await heartbeat(ctx, "alice", version, "m-1", -1)
        assert (left.error_code, left.member_epoch) == (0, -1)
    asyncio.run(scenario())


def test_heartbeats_need_read_on_the_group_and_describe_on_the_topics():
    async def scenario():
        ctx, _ = setup(orders=2, secret=1)
        ctx = replace(ctx, authorizer=Grants(("alice", Op.READ, R.GROUP, "g"),
                                             ("alice", Op.DESCRIBE, R.TOPIC, "orders"),
                                             ("alice", Op.DESCRIBE, R.GROUP, "g")))
        r = await heartbeat(ctx, "bob", 1, "m-1", 0)
        assert r.error_code == GAF
        r = await heartbeat(ctx, "alice", 1, "m-1", 0, topics=("orders", "secret"))
        assert (r.error_code, r.error_message) == (
            TAF, "The group has subscribed to topics that are not authorized.")
        # a regex matches only the topics the member may describe
        r = await heartbeat(ctx, "alice", 1, "m-1", 0, topics=(), regex="orders|secret")
        assert (r.error_code, assignment(r)) == (0, {tid("orders"): {0, 1}})
        d = (await _send(ctx, "bob", DESCRIBE, 1, group_ids=("g",),
                              include_authorized_operations=False))
        assert d.groups[0].error_code == GAF
    asyncio.run(scenario())


def test_a_bad_regex_is_invalid_regular_expression_on_the_wire():
    async def scenario():
        ctx, _ = setup(orders=1)
        r = await heartbeat(ctx, "alice", 1, "m-1", 0, topics=(), regex="orders(")
        assert r.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION and r.error_message
        # "" is no regex (librdkafka sends it with a subscription by names)
        r = await heartbeat(ctx, "alice", 1, "m-1", 0, regex="")
        assert (r.error_code, r.member_epoch) == (0, 1)
    asyncio.run(scenario())


def test_metadata_finds_a_topic_by_id_when_the_request_leaves_its_name_empty():
    """The Java consumer resolves a regex subscription's assigned topic ids so (Kafka looks
    any non-zero id up, whatever the name)."""
    async def scenario():
        ctx, _ = setup(orders=2)
        rq = request_class(ApiKey.METADATA, 12)
        r = await _send(ctx, "alice", ApiKey.METADATA, 12, topics=(
            make(rq, "topics", name="", topic_id=tid("orders")),
            make(rq, "topics", name=None, topic_id=tid("gone"))),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        assert [(t.error_code, t.name, t.topic_id) for t in r.topics] == [
            (0, "orders", tid("orders")), (ErrorCode.UNKNOWN_TOPIC_ID, None, tid("gone"))]
    asyncio.run(scenario())
