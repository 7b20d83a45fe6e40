"""KIP-848's online migration between classic and consumer groups in the group coordinator (no
sockets): a consumer-protocol member joining a classic group converts it (the classic members
stay, as classic members of the consumer group, reconciled through JoinGroup/SyncGroup/
Heartbeat), the last consumer-protocol member leaving converts it back,
``group.consumer.migration.policy`` gates both, and the classic members' metadata survives a
restart."""

from __future__ import annotations

import asyncio
import struct

import pytest

from strata.common.errors import ErrorCode
from strata.coordinator.group import GroupCoordinatorConfig, LeaveMember, OffsetCommitPartition
from strata.coordinator.group.state import GroupState
from strata.coordinator.offsets_records import (
    ClassicMemberMetadata,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    consumer_group_record,
    decode_consumer_protocol_assignment,
    decode_record,
)
from test_consumer_group_protocol import GROUP, ORDERS, Harness, owned, run


def _s(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def subscription(topics, owned_partitions=None, version=1) -> bytes:
    """A consumer protocol Subscription (v0 or v1 with owned partitions)."""
    out = struct.pack(">h", version) + struct.pack(">i", len(topics))
    out += b"".join(_s(t) for t in topics) + struct.pack(">i", -1)
    if version >= 1:
        owned_partitions = owned_partitions or {}
        out += struct.pack(">i", len(owned_partitions))
        for t, ps in owned_partitions.items():
            out += _s(t) + struct.pack(">i", len(ps)) + b"".join(struct.pack(">i", p) for p in ps)
    return out


def assignment(partitions) -> bytes:
    out = struct.pack(">hi", 1, len(partitions))
    for t, ps in partitions.items():
        out += _s(t) + struct.pack(">i", len(ps)) + b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


async def settle(h, futures):
    for _ in range(10):
        await asyncio.sleep(0)
    h.timers.advance(1)
    return [await asyncio.wait_for(f, 5) for f in futures]


async def classic_join(h, member_id, owned_partitions=None, **kw):
    return await h.coord.join_group(
        GROUP, member_id, "consumer",
        [("cooperative-sticky", subscription(["orders"], owned_partitions))],
        session_timeout_ms=10_000, rebalance_timeout_ms=30_000, client_id="c",
        client_host="/h", **kw)


async def classic_group(h, instance_ids=(None, None)):
    """Members x and y in generation 1 of a classic group, two partitions each."""
    joins = await settle(h, [asyncio.ensure_future(classic_join(h, "", group_instance_id=i))
                             for i in instance_ids])
    assert all(j.error == ErrorCode.NONE for j in joins)
    x, y = sorted(j.member_id for j in joins)
    leader = joins[0].leader_id
    plan = {x: assignment({"orders": [0, 1]}), y: assignment({"orders": [2, 3]})}
    syncs = [asyncio.ensure_future(h.coord.sync_group(
        GROUP, 1, m, assignments=plan if m == leader else {})) for m in (x, y)]
    for s in await settle(h, syncs):
        assert s.error == ErrorCode.NONE
    return x, y


def held(group):
    """partition -> members holding it (assigned or pending revocation)."""
    out = {}
    for m in group.members.values():
        for part in (m.assigned, m.pending_revocation):
            for t, ps in part.items():
                for p in ps:
                    out.setdefault((t, p), []).append(m.member_id)
    return out


async def rejoin_and_sync(h, member_id, owns):
    j = await classic_join(h, member_id, {"orders": owns})
    assert j.error == ErrorCode.NONE, j
    s = await h.coord.sync_group(GROUP, j.generation_id, member_id, protocol_type="consumer",
                                 protocol_name="cooperative-sticky")
    assert s.error == ErrorCode.NONE, s
    return j.generation_id, list(decode_consumer_protocol_assignment(s.assignment).get("orders", ()))


def test_a_consumer_member_joining_a_classic_group_upgrades_it_and_the_classic_members_reconcile():
    async def scenario():
        h = Harness()
        x, y = await classic_group(h)
        a = await h.hb("a", 0)
        assert a.error == ErrorCode.NONE
        group = h.coord.consumer_group(GROUP)
        assert group is not None and set(group.members) == {x, y, "a"}
        assert group.members[x].classic.session_timeout_ms == 10_000
        assert group.members[x].assigned == {ORDERS: frozenset({0, 1})}
        assert group.group_epoch == 2 and a.member_epoch == 2 and not a.assignment
        assert h.coord.group_state(GROUP) == GroupState.EMPTY   # the classic side holds offsets only
        [described] = h.coord.consumer_group_describe([GROUP])
        assert {m.member_id: m.member_type for m in described.members} == {x: 0, y: 0, "a": 1}
        # the consumer protocol does not know the classic members
        assert (await h.hb(x, 1)).error == ErrorCode.UNKNOWN_MEMBER_ID
        # the classic members are told to rejoin; they give up what the target moved away
        assert h.coord.heartbeat(GROUP, x, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        assert h.coord.heartbeat(GROUP, x, 7) == ErrorCode.ILLEGAL_GENERATION
        assert h.coord.heartbeat(GROUP, "nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        gen_x, px = await rejoin_and_sync(h, x, [0, 1])
        gen_y, py = await rejoin_and_sync(h, y, [2, 3])
        # a cooperative member still owning partitions to revoke keeps its epoch (and is
        # given only what it keeps), then rejoins once it dropped them
        revoking = [m for m in (x, y) if group.members[m].pending_revocation]
        assert revoking
        for m, gen, ps in ((x, gen_x, px), (y, gen_y, py)):
            if m in revoking:
                assert gen == 1 and len(ps) < 2
                assert h.coord.heartbeat(GROUP, m, 1) == ErrorCode.REBALANCE_IN_PROGRESS
                gen, ps[:] = await rejoin_and_sync(h, m, ps)
            assert gen == 2
        a = await h.hb("a", 2, owned=())
        assert a.error == ErrorCode.NONE
        a = await h.hb("a", a.member_epoch, owned=owned(a.assignment))
        assert sum(len(ps) for ps in a.assignment.values()) >= 1
        assert all(len(ms) == 1 for ms in held(group).values())
        assert len(px) + len(py) + sum(len(ps) for ps in a.assignment.values()) == 4
        assert h.coord.heartbeat(GROUP, x, 2) == ErrorCode.NONE
        # a classic member commits with its generation (the member epoch)
        r = await h.coord.commit_offsets(GROUP, x, 2, [OffsetCommitPartition("orders", px[0], 5)],
                                         api_version=8)
        assert set(r.values()) == {ErrorCode.NONE}
        r = await h.coord.commit_offsets(GROUP, x, 1, [OffsetCommitPartition("orders", px[0], 6)],
                                         api_version=8)
        assert set(r.values()) == {ErrorCode.ILLEGAL_GENERATION}

        # a restart keeps the classic members' protocols and sessions
        again = Harness(log=h.log)
        reloaded = again.coord.consumer_group(GROUP)
        assert reloaded.members[x].classic == group.members[x].classic
        assert reloaded.members["a"].classic is None
        assert again.coord.heartbeat(GROUP, x, 2) == ErrorCode.NONE
        fetched = again.coord.fetch_offsets(GROUP)
        assert fetched.error == ErrorCode.NONE
        assert [o.offset for o in fetched.offsets.values()] == [5]
    run(scenario())


def test_the_last_consumer_member_leaving_downgrades_the_group_to_classic():
    async def scenario():
        h = Harness()
        x, y = await classic_group(h)
        await h.hb("a", 0)
        await rejoin_and_sync(h, x, [0, 1])
        left = await h.hb("a", -1)
        assert left.error == ErrorCode.NONE
        assert h.coord.consumer_group(GROUP) is None
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        # the classic members rejoin a classic rebalance and get every partition again
        assert h.coord.heartbeat(GROUP, y, 3) == ErrorCode.REBALANCE_IN_PROGRESS
        joins = await settle(h, [asyncio.ensure_future(classic_join(h, m)) for m in (x, y)])
        assert {j.error for j in joins} == {ErrorCode.NONE}
        assert joins[0].generation_id == 4
        # the restarted coordinator sees the classic group, not the consumer group
        again = Harness(log=h.log)
        assert again.coord.consumer_group(GROUP) is None
        assert again.coord.group_state(GROUP) is not None
    run(scenario())


def test_a_classic_member_leaving_a_consumer_group_bumps_its_epoch():
    async def scenario():
        h = Harness()
        x, y = await classic_group(h)
        await h.hb("a", 0)
        group = h.coord.consumer_group(GROUP)
        epoch = group.group_epoch
        r = h.coord.leave_group(GROUP, [LeaveMember(x), LeaveMember("a"), LeaveMember("zz")])
        assert [m.error for m in r.members] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID,
                                                ErrorCode.UNKNOWN_MEMBER_ID]
        assert set(group.members) == {y, "a"} and group.group_epoch == epoch + 1
        # a new classic member joins the consumer group (v4+: it first gets its id)
        j = await h.coord.join_group(GROUP, "", "consumer", [("range", subscription(["orders"]))],
                                     session_timeout_ms=10_000, require_known_member_id=True)
        assert j.error == ErrorCode.MEMBER_ID_REQUIRED and j.member_id
        j = await h.coord.join_group(GROUP, j.member_id, "consumer",
                                     [("range", subscription(["orders"]))],
                                     session_timeout_ms=10_000)
        assert j.error == ErrorCode.NONE and j.generation_id == group.group_epoch
        bad = await h.coord.join_group(GROUP, "", "consumer", [("range", b"\xff")],
                                       session_timeout_ms=10_000)
        assert bad.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        s = await h.coord.sync_group(GROUP, j.generation_id, j.member_id, protocol_name="other")
        assert s.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    run(scenario())


def test_an_upgrade_is_stored_even_when_the_joining_member_is_refused():
    async def scenario():
        h = Harness()
        await classic_group(h, ("i-x", "i-y"))
        r = await h.hb("a", 0, instance_id="i-x")
        assert r.error == ErrorCode.UNRELEASED_INSTANCE_ID
        group = h.coord.consumer_group(GROUP)
        assert group is not None and "a" not in group.members
        for _ in range(5):
            await asyncio.sleep(0)
        again = Harness(log=h.log)
        reloaded = again.coord.consumer_group(GROUP)
        assert set(reloaded.members) == set(group.members)
        assert all(m.classic is not None for m in reloaded.members.values())
    run(scenario())


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
def test_the_migration_policy_can_forbid_the_upgrade(policy):
    async def scenario():
        h = Harness(consumer_group_migration_policy=policy)
        await classic_group(h)
        r = await h.hb("a", 0)
        assert (r.error, r.message) == (ErrorCode.GROUP_ID_NOT_FOUND,
                                        f"Group {GROUP} is not a consumer group")
        assert h.coord.group_state(GROUP) == GroupState.STABLE
    run(scenario())


def test_the_migration_policy_can_forbid_the_downgrade():
    async def scenario():
        h = Harness(consumer_group_migration_policy="upgrade")
        x, _ = await classic_group(h)
        await h.hb("a", 0)
        await h.hb("a", -1)
        group = h.coord.consumer_group(GROUP)
        assert group is not None and x in group.members
    run(scenario())


def test_the_migration_policy_config():
    assert GroupCoordinatorConfig().consumer_group_migration_policy == "bidirectional"
    config = GroupCoordinatorConfig.from_properties({"group.consumer.migration.policy": "UPGRADE"})
    assert config.consumer_group_migration_policy == "upgrade"
    with pytest.raises(ValueError, match="group.consumer.migration.policy"):
        GroupCoordinatorConfig.from_properties({"group.consumer.migration.policy": "sideways"})


def test_classic_member_metadata_is_tagged_field_0_of_the_member_record():
    classic = ClassicMemberMetadata(10_000, (("range", b"\x00\x01"),))
    value = ConsumerGroupMemberMetadataValue(None, None, "c", "/h", ("orders",), None, 30_000,
                                             None, classic)
    k, v = consumer_group_record(ConsumerGroupKey(5, "g", "m"), value)
    plain = consumer_group_record(ConsumerGroupKey(5, "g", "m"),
                                  ConsumerGroupMemberMetadataValue(
                                      None, None, "c", "/h", ("orders",), None, 30_000, None))[1]
    # the same fields, then one tagged field (tag 0) instead of none
    assert v[:len(plain) - 1] == plain[:-1] and plain[-1] == 0
    tagged = v[len(plain) - 1:]
    body = (10_000).to_bytes(4, "big") + b"\x02" + b"\x06range" + b"\x03\x00\x01" + b"\x00" + b"\x00"
    assert tagged == b"\x01\x00" + bytes([len(body)]) + body
    assert decode_record(k, v)[1] == value
