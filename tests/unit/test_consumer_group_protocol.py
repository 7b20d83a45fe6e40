"""KIP-848 consumer groups in the group coordinator (no sockets): ConsumerGroupHeartbeat's
state machine (member and group epochs, target assignment, revocation before reassignment),
its errors, static members, regex subscriptions, sessions, offsets with member epochs, the
group in DescribeGroups/ListGroups, and a restart from ``__consumer_offsets``."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from strata.common.clock import MockClock
from strata.common.errors import ErrorCode
from strata.coordinator.group import (
    ConsumerGroupHeartbeatRequest,
    GroupCoordinator,
    GroupCoordinatorConfig,
    ManualTimers,
)
from strata.coordinator.offsets_records import (
    ConsumerGroupCurrentAssignmentValue,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    consumer_group_record,
    decode_record,
)
from strata.coordinator.group.consumer_membership import REGEX_REFRESH_MS
from test_group_coordinator import MemoryOffsetsLog

GROUP = "cg"
ORDERS = uuid.UUID(int=1)
PAYMENTS = uuid.UUID(int=2)
SESSION = 45_000


def topic(name, topic_id, partitions, internal=False):
    return SimpleNamespace(name=name, topic_id=topic_id, partitions=partitions, internal=internal)


class Harness:
    def __init__(self, log: MemoryOffsetsLog | None = None, **config):
        self.clock = MockClock()
        self.timers = ManualTimers(self.clock)
        self.log = log or MemoryOffsetsLog()
        self.image = {"orders": topic("orders", ORDERS, 4),
                      "payments": topic("payments", PAYMENTS, 2),
                      "__consumer_offsets": topic("__consumer_offsets", uuid.UUID(int=9), 50,
                                                  internal=True)}
        config.setdefault("group_min_session_timeout_ms", 1)
        config.setdefault("group_initial_rebalance_delay_ms", 0)
        self.coord = GroupCoordinator(self.log, GroupCoordinatorConfig(**config),
                                      clock=self.clock, timers=self.timers,
                                      topics=lambda: self.image)
        self.coord.load()

    async def hb(self, member_id, epoch, *, topics=None, owned=None, group=GROUP, **kw):
        if epoch == 0:
            kw.setdefault("rebalance_timeout_ms", 300_000)
            if topics is None and kw.get("subscribed_topic_regex") is None:
                topics = ("orders",)
            owned = () if owned is None else owned
        r = ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=member_id, member_epoch=epoch,
            subscribed_topic_names=topics, owned=owned, **kw)
        return await self.coord.consumer_group_heartbeat(r, client_id="c", client_host="/h")


def owned(assignment):
    """The request's TopicPartitions for an assignment the member now owns."""
    return tuple((t, tuple(sorted(ps))) for t, ps in (assignment or {}).items())


def count(assignment):
    return sum(len(ps) for ps in (assignment or {}).values())


def run(coro):
    return asyncio.run(coro)


def test_a_member_gets_partitions_only_after_their_owner_revoked_them():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        assert (a.error, a.member_epoch, a.assignment) == (ErrorCode.NONE, 1,
                                                           {ORDERS: frozenset(range(4))})
        assert a.heartbeat_interval_ms == 5000
        b = await h.hb("b", 0)
        # b is in epoch 2 but its partitions are still a's: none yet (UNRELEASED_PARTITIONS)
        assert (b.error, b.member_epoch, b.assignment) == (ErrorCode.NONE, 2, {})
        assert h.coord.consumer_group(GROUP).state == "Reconciling"
        # a must revoke two partitions first: it stays in epoch 1 with the two it keeps
        a = await h.hb("a", 1, owned=owned({ORDERS: range(4)}))
        assert a.member_epoch == 1 and count(a.assignment) == 2
        kept = a.assignment
        # b asks again: still held by a (a has not said it dropped them)
        b = await h.hb("b", 2, owned=())
        assert b.member_epoch == 2 and not b.assignment
        a = await h.hb("a", 1, owned=owned(kept))
        assert a.member_epoch == 2
        b = await h.hb("b", 2, owned=())
        assert count(b.assignment) == 2
        assert b.assignment[ORDERS].isdisjoint(kept[ORDERS])
        b = await h.hb("b", 2, owned=owned(b.assignment))
        assert h.coord.consumer_group(GROUP).state == "Stable"
    run(scenario())


def test_a_leaving_member_frees_its_partitions_for_the_others():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        b = await h.hb("b", 0)
        a = await h.hb("a", 1, owned=owned(a.assignment))
        a = await h.hb("a", 1, owned=owned(a.assignment))
        b = await h.hb("b", 2, owned=())
        assert count(a.assignment) == count(b.assignment) == 2
        left = await h.hb("a", -1)
        assert (left.error, left.member_epoch) == (ErrorCode.NONE, -1)
        b = await h.hb("b", 2, owned=owned(b.assignment))
        assert (b.member_epoch, b.assignment) == (3, {ORDERS: frozenset(range(4))})
        assert (await h.hb("a", 2)).error == ErrorCode.UNKNOWN_MEMBER_ID
    run(scenario())


def test_stale_and_unknown_members_get_kafkas_errors():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        assert (await h.hb("a", 5, owned=())).error == ErrorCode.FENCED_MEMBER_EPOCH
        await h.hb("b", 0)
        a = await h.hb("a", 1, owned=owned(a.assignment))
        a = await h.hb("a", 1, owned=owned(a.assignment))
        assert a.member_epoch == 2
        # one epoch behind is tolerated (a lost response) if it owns nothing it should not
        assert (await h.hb("a", 1, owned=owned(a.assignment))).error == ErrorCode.NONE
        assert (await h.hb("a", 1, owned=owned({ORDERS: range(4)}))).error == \
            ErrorCode.FENCED_MEMBER_EPOCH
        assert (await h.hb("nobody", 3)).error == ErrorCode.UNKNOWN_MEMBER_ID
        assert (await h.hb("a", 1, group="other")).error == ErrorCode.GROUP_ID_NOT_FOUND
    run(scenario())


@pytest.mark.parametrize("fields,error", [
    ({"member_id": "m", "member_epoch": 0, "subscribed_topic_names": ("orders",), "owned": ()},
     ErrorCode.INVALID_REQUEST),                                  # no rebalance timeout
    ({"member_id": "m", "member_epoch": 0, "rebalance_timeout_ms": 1, "owned": ()},
     ErrorCode.INVALID_REQUEST),                                  # no subscription
    ({"member_id": "m", "member_epoch": 0, "rebalance_timeout_ms": 1,
      "subscribed_topic_names": ("orders",), "owned": ((ORDERS, (0,)),)},
     ErrorCode.INVALID_REQUEST),                                  # owns partitions at join
    ({"member_id": "", "member_epoch": 0, "rebalance_timeout_ms": 1,
      "subscribed_topic_names": ("orders",), "owned": ()}, ErrorCode.INVALID_REQUEST),
    ({"member_id": "m", "member_epoch": -3}, ErrorCode.INVALID_REQUEST),
    ({"member_id": "m", "member_epoch": -2}, ErrorCode.INVALID_REQUEST),   # no instance id
    ({"member_id": "m", "member_epoch": 0, "rebalance_timeout_ms": 1, "owned": (),
      "subscribed_topic_regex": "ord(?=ers)"}, ErrorCode.INVALID_REGULAR_EXPRESSION),
    ({"member_id": "m", "member_epoch": 0, "rebalance_timeout_ms": 1, "owned": (),
      "subscribed_topic_regex": "(orders"}, ErrorCode.INVALID_REGULAR_EXPRESSION),
    ({"member_id": "m", "member_epoch": 0, "rebalance_timeout_ms": 1, "owned": (),
      "subscribed_topic_names": ("orders",), "server_assignor": "sticky"},
     ErrorCode.UNSUPPORTED_ASSIGNOR),
])
def test_bad_heartbeats_get_kafkas_error_codes(fields, error):
    async def scenario():
        h = Harness()
        r = await h.coord.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(GROUP, **fields))
        assert r.error == error and r.message
        assert h.coord.consumer_group(GROUP) is None
    run(scenario())


def test_a_classic_group_whose_subscriptions_do_not_parse_is_not_a_consumer_group():
    async def scenario():
        h = Harness()
        join = asyncio.ensure_future(h.coord.join_group(
            GROUP, "", "consumer", [("range", b"")], session_timeout_ms=10_000,
            client_id="c", client_host="/h"))
        for _ in range(5):
            await asyncio.sleep(0)
        h.timers.advance(1)
        assert (await asyncio.wait_for(join, 5)).error == ErrorCode.NONE
        r = await h.hb("a", 0)
        assert (r.error, r.message) == (ErrorCode.GROUP_ID_NOT_FOUND,
                                        f"Group {GROUP} is not a consumer group")
        # and a classic JoinGroup without a consumer protocol subscription to a consumer group
        # with members is refused
        await h.hb("a", 0, group="cg2")
        j = await h.coord.join_group("cg2", "", "consumer", [("range", b"")],
                                     session_timeout_ms=10_000)
        assert j.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    run(scenario())


def test_the_group_size_is_capped():
    async def scenario():
        h = Harness(consumer_group_max_size=1)
        assert (await h.hb("a", 0)).error == ErrorCode.NONE
        assert (await h.hb("b", 0)).error == ErrorCode.GROUP_MAX_SIZE_REACHED
    run(scenario())


def test_a_regex_subscription_is_matched_on_the_broker():
    async def scenario():
        h = Harness()
        h.image["orders-eu"] = topic("orders-eu", uuid.UUID(int=3), 1)
        r = await h.hb("a", 0, subscribed_topic_regex="orders.*|__.*")
        assert r.assignment == {ORDERS: frozenset(range(4)), uuid.UUID(int=3): frozenset({0})}
        # a new matching topic moves the group epoch once the regex is resolved again
        h.image["orders-us"] = topic("orders-us", uuid.UUID(int=4), 2)
        r = await h.hb("a", 1, owned=owned(r.assignment))
        assert r.member_epoch == 1
        h.timers.advance(REGEX_REFRESH_MS)
        r = await h.hb("a", 1, owned=owned(r.assignment))
        assert r.member_epoch == 2 and uuid.UUID(int=4) in r.assignment
    run(scenario())


def test_a_member_whose_session_ends_is_removed():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        await h.hb("b", 0)
        h.timers.advance(SESSION - 1)
        a = await h.hb("a", 1, owned=owned(a.assignment))
        h.timers.advance(2)   # b's session is over; a's was renewed
        await asyncio.sleep(0)
        group = h.coord.consumer_group(GROUP)
        assert list(group.members) == ["a"] and group.group_epoch == 3
        a = await h.hb("a", 1, owned=owned(a.assignment))
        assert (a.member_epoch, count(a.assignment)) == (3, 4)
    run(scenario())


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0, rebalance_timeout_ms=10_000)
        await h.hb("b", 0)
        a = await h.hb("a", 1, owned=owned(a.assignment))      # asked to revoke two
        for _ in range(3):
            h.timers.advance(4_000)
            await h.hb("b", 2, owned=())
        assert "a" not in h.coord.consumer_group(GROUP).members
    run(scenario())


def test_a_static_member_rejoining_keeps_its_epoch_and_assignment():
    async def scenario():
        h = Harness()
        a = await h.hb("a1", 0, instance_id="i-a")
        await h.hb("b", 0)
        a = await h.hb("a1", 1, instance_id="i-a", owned=owned(a.assignment))
        a = await h.hb("a1", 1, instance_id="i-a", owned=owned(a.assignment))
        assert (a.member_epoch, count(a.assignment)) == (2, 2)
        r = await h.hb("a2", 0, instance_id="i-a")
        assert r.error == ErrorCode.UNRELEASED_INSTANCE_ID
        left = await h.hb("a1", -2, instance_id="i-a")
        assert (left.error, left.member_epoch) == (ErrorCode.NONE, -2)
        epoch_before = h.coord.consumer_group(GROUP).group_epoch
        back = await h.hb("a2", 0, instance_id="i-a")
        assert (back.error, back.member_epoch, back.assignment) == (ErrorCode.NONE, 2,
                                                                   a.assignment)
        group = h.coord.consumer_group(GROUP)
        assert group.group_epoch == epoch_before and set(group.members) == {"a2", "b"}
        assert (await h.hb("a1", 2, instance_id="i-a", owned=())).error == \
            ErrorCode.FENCED_INSTANCE_ID
        # the replacement is in the log: a restarted coordinator has it, not the old id
        again = Harness(log=h.log).coord.consumer_group(GROUP)
        assert set(again.members) == {"a2", "b"}
        assert (again.members["a2"].member_epoch, again.members["a2"].assigned,
                again.target["a2"]) == (2, a.assignment, a.assignment)
    run(scenario())


def test_offsets_are_committed_and_fetched_with_member_epochs():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        commit = [("orders", 0, 42)]
        assert await h.coord.commit_offsets(GROUP, "a", 1, commit, api_version=9) == \
            {("orders", 0): ErrorCode.NONE}
        assert await h.coord.commit_offsets(GROUP, "a", 0, commit, api_version=9) == \
            {("orders", 0): ErrorCode.STALE_MEMBER_EPOCH}
        assert await h.coord.commit_offsets(GROUP, "z", 1, commit, api_version=9) == \
            {("orders", 0): ErrorCode.UNKNOWN_MEMBER_ID}
        assert await h.coord.commit_offsets(GROUP, "a", 1, commit, api_version=8) == \
            {("orders", 0): ErrorCode.UNSUPPORTED_VERSION}
        assert await h.coord.commit_offsets(GROUP, "", -1, commit) == \
            {("orders", 0): ErrorCode.UNKNOWN_MEMBER_ID}   # not while it has members
        fetched = h.coord.fetch_offsets(GROUP, [("orders", 0)], member_id="a", member_epoch=1)
        assert (fetched.error, fetched.offsets[("orders", 0)].offset) == (ErrorCode.NONE, 42)
        assert h.coord.fetch_offsets(GROUP, [("orders", 0)], member_id="a",
                                     member_epoch=7).error == ErrorCode.STALE_MEMBER_EPOCH
        assert h.coord.fetch_offsets(GROUP, [("orders", 0)]).offsets[("orders", 0)].offset == 42
        await h.hb("a", -1)
        assert await h.coord.commit_offsets(GROUP, "", -1, [("orders", 0, 7)]) == \
            {("orders", 0): ErrorCode.NONE}    # an empty group takes the admin's commits
        del a
    run(scenario())


def test_consumer_groups_are_listed_and_described_beside_classic_ones():
    async def scenario():
        h = Harness()
        await h.hb("a", 0, topics=("orders", "payments"))
        await h.coord.commit_offsets("simple", "", -1, [("orders", 0, 1)])
        listed = {g.group_id: g for g in h.coord.list_groups().groups}
        assert (listed[GROUP].group_type, listed[GROUP].protocol_type, listed[GROUP].state) == \
            ("consumer", "consumer", "Stable")
        assert listed["simple"].group_type == "classic"
        assert [g.group_id for g in h.coord.list_groups(types=["Consumer"]).groups] == [GROUP]
        assert [g.group_id for g in h.coord.list_groups(types=["classic"]).groups] == ["simple"]
        [d] = h.coord.describe_groups([GROUP])
        assert (d.state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "uniform")
        [cd, classic] = h.coord.consumer_group_describe([GROUP, "simple"])
        assert (cd.state, cd.group_epoch, cd.assignment_epoch, cd.assignor_name) == \
            ("Stable", 1, 1, "uniform")
        [m] = cd.members
        assert m.assignment == m.target_assignment == {ORDERS: frozenset(range(4)),
                                                      PAYMENTS: frozenset(range(2))}
        assert classic.error == ErrorCode.GROUP_ID_NOT_FOUND
        # deleting a consumer group needs it empty
        assert await h.coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NON_EMPTY_GROUP}
        await h.hb(m.member_id, -1)
        assert await h.coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
        assert h.coord.consumer_group(GROUP) is None
    run(scenario())


def test_the_range_assignor_is_used_when_members_ask_for_it():
    async def scenario():
        h = Harness()
        await h.hb("a", 0, server_assignor="range")
        await h.hb("b", 0, server_assignor="range")
        group = h.coord.consumer_group(GROUP)
        assert group.target == {"a": {ORDERS: frozenset({0, 1})}, "b": {ORDERS: frozenset({2, 3})}}
    run(scenario())


def test_a_restarted_coordinator_resumes_every_members_epoch_and_assignment():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        b = await h.hb("b", 0, instance_id="i-b")
        a = await h.hb("a", 1, owned=owned(a.assignment))
        a = await h.hb("a", 1, owned=owned(a.assignment))
        b = await h.hb("b", 2, owned=(), instance_id="i-b")
        before = h.coord.consumer_group(GROUP)
        snapshot = {m.member_id: (m.member_epoch, m.state, m.assigned, m.instance_id)
                    for m in before.members.values()}
        assert all(v[0] == 2 for v in snapshot.values())

        again = Harness(log=h.log)
        after = again.coord.consumer_group(GROUP)
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch,
                                                               before.assignment_epoch)
        assert {m.member_id: (m.member_epoch, m.state, m.assigned, m.instance_id)
                for m in after.members.values()} == snapshot
        assert after.target == before.target
        # the members carry on where they were: no new epoch, no error
        r = await again.hb("b", 2, owned=owned(b.assignment), instance_id="i-b")
        assert (r.error, r.member_epoch) == (ErrorCode.NONE, 2)
        # and a member that left stays gone after the next restart
        await again.hb("a", -1)
        third = Harness(log=h.log)
        assert set(third.coord.consumer_group(GROUP).members) == {"b"}
    run(scenario())


def test_consumer_group_records_are_kafkas():
    key = ConsumerGroupKey(8, "g", "m")
    value = ConsumerGroupCurrentAssignmentValue(5, 4, 1, {ORDERS: frozenset({0, 2})},
                                                {PAYMENTS: frozenset({1})})
    k, v = consumer_group_record(key, value)
    # key: version 8, group, member (non-flexible strings)
    assert k == b"\x00\x08" + b"\x00\x01g" + b"\x00\x01m"
    # value v0 flexible: epochs, state byte, compact arrays of (uuid, compact int32 array)
    assert v == (b"\x00\x00" + (5).to_bytes(4, "big") + (4).to_bytes(4, "big") + b"\x01"
                 + b"\x02" + ORDERS.bytes + b"\x03" + (0).to_bytes(4, "big")
                 + (2).to_bytes(4, "big") + b"\x00"
                 + b"\x02" + PAYMENTS.bytes + b"\x02" + (1).to_bytes(4, "big") + b"\x00"
                 + b"\x00")
    assert decode_record(k, v) == (key, value)
    meta = ConsumerGroupMemberMetadataValue("i", None, "client", "/h", ("a", "b"), "x.*", 300, None)
    mk = ConsumerGroupKey(5, "g", "m")
    assert decode_record(*consumer_group_record(mk, meta)) == (mk, meta)
    assert decode_record(consumer_group_record(mk, None)[0], None) == (mk, None)


def test_a_coordinator_that_loses_the_partition_drops_the_group_and_its_timers():
    async def scenario():
        h = Harness()
        a = await h.hb("a", 0)
        pending = h.timers.pending()
        h.coord.unload([h.coord.partition_for(GROUP)])
        assert h.coord.consumer_group(GROUP) is None
        assert h.timers.pending() == pending - 1          # the member's session timer
        r = await h.hb("a", 1, owned=owned(a.assignment))
        assert r.error == ErrorCode.NOT_COORDINATOR
        # the new coordinator of the partition (here: the same one, loading it again)
        h.coord.load([h.coord.partition_for(GROUP)])
        r = await h.hb("a", 1, owned=owned(a.assignment))
        assert (r.error, r.member_epoch) == (ErrorCode.NONE, 1)
    run(scenario())


def test_an_empty_consumer_group_goes_when_its_offsets_expire():
    async def scenario():
        h = Harness(offsets_retention_ms=60_000)
        await h.hb("a", 0)
        assert await h.coord.commit_offsets(GROUP, "a", 1, [("orders", 0, 3)],
                                            api_version=9) == {("orders", 0): ErrorCode.NONE}
        await h.coord.expire_offsets()
        assert h.coord.consumer_group(GROUP) is not None     # it has a member
        await h.hb("a", -1)
        await h.coord.expire_offsets()
        assert h.coord.consumer_group(GROUP) is not None     # its offsets are not expired yet
        h.clock.advance_ms(60_000)
        await h.coord.expire_offsets()
        assert h.coord.consumer_group(GROUP) is None
        assert [g.group_id for g in h.coord.list_groups().groups] == []
        # and it stays gone after a restart
        again = Harness(log=h.log)
        assert again.coord.consumer_group(GROUP) is None
    run(scenario())
