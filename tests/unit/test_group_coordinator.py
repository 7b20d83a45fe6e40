"""The classic group coordinator and the ``__consumer_offsets`` record formats.

Timers are ``ManualTimers`` on a ``MockClock``: a test moves time with ``h.advance(ms)`` and
every session / rebalance / initial-delay deadline due by then fires, in order.
"""

from __future__ import annotations

import asyncio
import struct
from collections import defaultdict
from types import SimpleNamespace

import pytest

from strata.common.clock import MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.group import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    GroupState,
    LeaveMember,
    ManualTimers,
    OffsetCommitPartition,
)
from strata.coordinator.offsets_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    UnknownKey,
    consumer_subscription_topics,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    decode_record,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    group_metadata_record,
    java_string_hashcode,
    java_utils_abs,
    offset_commit_record,
    partition_for,
)

GROUP = "test-group"
SESSION = 10_000
REBALANCE = 30_000


# =========================================================================== fakes and helpers

class MemoryOffsetsLog:
    """An in-memory ``__consumer_offsets``: (key, value) pairs per partition."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        self.fail_with: ErrorCode | None = None
        self.gate: asyncio.Event | None = None
        self.appends = 0

    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        self.appends += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise KafkaError("append failed", self.fail_with)
        self.partitions[partition].extend(records)

    def replay(self, partition: int):
        return list(self.partitions.get(partition, ()))

    def decoded(self, partition: int) -> list:
        return [decode_record(k, v) for k, v in self.partitions.get(partition, ())]


def subscription(*topics: str) -> bytes:
    """A consumer-protocol Subscription v0: version, topics, user data (null)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Harness:
    def __init__(self, log: MemoryOffsetsLog | None = None, clock: MockClock | None = None,
                 topic_exists=None, **config):
        self.clock = clock or MockClock()
        self.timers = ManualTimers(self.clock)
        self.log = log or MemoryOffsetsLog()
        config.setdefault("group_min_session_timeout_ms", 1)
        config.setdefault("group_initial_rebalance_delay_ms", 0)
        self.config = GroupCoordinatorConfig(**config)
        ids = iter(range(1, 1000))
        self.coord = GroupCoordinator(self.log, self.config, clock=self.clock, timers=self.timers,
                                      member_id_factory=lambda prefix: f"{prefix}-{next(ids)}",
                                      topic_exists=topic_exists)
        self.coord.load()

    @property
    def partition(self) -> int:
        return self.coord.partition_for(GROUP)

    def join(self, member_id: str = "", *, client_id: str = "client", group_id: str = GROUP,
             protocols=(("range", b"meta"),), protocol_type: str = "consumer",
             session_timeout_ms: int = SESSION, rebalance_timeout_ms: int = REBALANCE,
             **kw) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self.coord.join_group(
            group_id, member_id, protocol_type, list(protocols), client_id=client_id,
            client_host="/127.0.0.1", session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms, **kw))

    def sync(self, member_id: str, generation: int, assignments=(), **kw) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self.coord.sync_group(
            kw.pop("group_id", GROUP), generation, member_id, assignments=assignments, **kw))

    async def advance(self, ms: float) -> None:
        await settle()
        self.timers.advance(ms)
        await settle()

    async def stable_group(self, *client_ids: str, protocols=(("range", b"meta"),)):
        """Join ``client_ids`` together, sync with assignment b"asg-<member>"; return the
        join results keyed by client id."""
        tasks = {c: self.join(client_id=c, protocols=protocols) for c in client_ids}
        await self.advance(0)
        joins = {c: await t for c, t in tasks.items()}
        assert {j.error for j in joins.values()} == {ErrorCode.NONE}
        leader = next(j for j in joins.values() if j.member_id == j.leader_id)
        gen = leader.generation_id
        syncs = [self.sync(j.member_id, gen,
                           {m.member_id: b"asg-" + m.member_id.encode() for m in leader.members}
                           if j is leader else ())
                 for j in joins.values()]
        await settle()
        for s in syncs:
            assert (await s).error == ErrorCode.NONE
        assert self.coord.group_state(GROUP) == GroupState.STABLE
        return joins


def run(coro, timeout: float = 10):
    """Run a test coroutine; a response that never comes fails the test instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


# =========================================================================== membership

def test_two_members_join_get_the_same_generation_and_the_leader_gets_all_metadata():
    async def main():
        h = Harness(group_initial_rebalance_delay_ms=100)
        a = h.join(client_id="a", protocols=[("range", b"A-meta")])
        await settle()
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        b = h.join(client_id="b", protocols=[("range", b"B-meta"), ("roundrobin", b"B-rr")])
        await h.advance(100)      # initial delay ends, but a member arrived: wait once more
        assert not a.done() and not b.done()
        await h.advance(100)
        ra, rb = await a, await b
        assert ra.error == rb.error == ErrorCode.NONE
        assert ra.generation_id == rb.generation_id == 1
        assert ra.protocol_type == "consumer" and ra.protocol_name == "range"
        assert ra.leader_id == rb.leader_id == ra.member_id    # the first to join leads
        assert ra.member_id.startswith("a-") and rb.member_id.startswith("b-")
        assert {(m.member_id, m.metadata) for m in ra.members} == {
            (ra.member_id, b"A-meta"), (rb.member_id, b"B-meta")}
        assert rb.members == ()                                  # followers get none
        assert h.coord.group_state(GROUP) == GroupState.COMPLETING_REBALANCE
    run(main())


def test_protocol_chosen_by_votes_among_protocols_all_members_support():
    async def main():
        h = Harness()
        a = h.join(client_id="a", protocols=[("roundrobin", b"1"), ("range", b"1"), ("x", b"")])
        b = h.join(client_id="b", protocols=[("range", b"2"), ("roundrobin", b"2")])
        c = h.join(client_id="c", protocols=[("range", b"3"), ("roundrobin", b"3")])
        await h.advance(0)
        results = [await t for t in (a, b, c)]
        assert {r.protocol_name for r in results} == {"range"}   # 2 votes against 1
        leader = next(r for r in results if r.members)
        assert sorted(m.metadata for m in leader.members) == [b"1", b"2", b"3"]
    run(main())


def test_sync_group_distributes_the_leaders_assignment_and_stores_group_metadata():
    async def main():
        h = Harness()
        a, b = h.join(client_id="a"), h.join(client_id="b")
        await h.advance(0)
        ra, rb = await a, await b
        leader, follower = (ra, rb) if ra.members else (rb, ra)
        fsync = h.sync(follower.member_id, 1)
        await settle()
        assert not fsync.done()                       # parked until the leader's assignment
        lsync = h.sync(leader.member_id, 1, {leader.member_id: b"L", follower.member_id: b"F"},
                       protocol_type="consumer", protocol_name="range")
        rl, rf = await lsync, await fsync
        assert (rl.error, rl.assignment, rl.protocol_type, rl.protocol_name) == (
            ErrorCode.NONE, b"L", "consumer", "range")
        assert (rf.error, rf.assignment) == (ErrorCode.NONE, b"F")
        assert h.coord.group_state(GROUP) == GroupState.STABLE

        (key, value), = h.log.decoded(h.partition)
        assert key == GroupMetadataKey(GROUP)
        assert value.generation == 1 and value.protocol == "range" and value.leader == leader.member_id
        assert {m.member_id: m.assignment for m in value.members} == {
            leader.member_id: b"L", follower.member_id: b"F"}

        # a late SyncGroup in Stable just gets the current assignment
        again = await h.sync(follower.member_id, 1)
        assert (again.error, again.assignment) == (ErrorCode.NONE, b"F")
        assert h.coord.heartbeat(GROUP, follower.member_id, 1) == ErrorCode.NONE
    run(main())


def test_members_missing_from_the_leaders_assignment_get_an_empty_one():
    async def main():
        h = Harness()
        a, b = h.join(client_id="a"), h.join(client_id="b")
        await h.advance(0)
        ra, rb = await a, await b
        leader, follower = (ra, rb) if ra.members else (rb, ra)
        f = h.sync(follower.member_id, 1)
        r = await h.sync(leader.member_id, 1, {leader.member_id: b"all"})
        assert r.assignment == b"all" and (await f).assignment == b""
    run(main())


def test_third_member_causes_rebalance_in_progress_on_heartbeat_then_a_new_generation():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", "b")
        ma, mb = joins["a"].member_id, joins["b"].member_id
        c = h.join(client_id="c")
        await settle()
        assert not c.done()
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        assert h.coord.heartbeat(GROUP, ma, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        assert h.coord.heartbeat(GROUP, mb, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        ja = h.join(ma, client_id="a")
        await settle()
        assert not ja.done()                          # b has not rejoined yet
        jb = h.join(mb, client_id="b")
        ra, rb, rc = await ja, await jb, await c      # all joined: completes at once
        assert ra.generation_id == rb.generation_id == rc.generation_id == 2
        assert ra.leader_id == ma and len(ra.members) == 3
        assert h.coord.heartbeat(GROUP, ma, 1) == ErrorCode.ILLEGAL_GENERATION
        assert h.coord.heartbeat(GROUP, ma, 2) == ErrorCode.NONE   # CompletingRebalance
    run(main())


def test_leader_rejoining_a_stable_group_forces_a_rebalance_and_followers_do_not():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", "b")
        leader = next(j for j in joins.values() if j.members)
        follower = next(j for j in joins.values() if not j.members)
        same = await h.join(follower.member_id)       # same metadata: current generation back
        assert (same.error, same.generation_id, same.leader_id) == (
            ErrorCode.NONE, 1, leader.member_id)
        assert h.coord.group_state(GROUP) == GroupState.STABLE
        lj = h.join(leader.member_id)
        await settle()
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        assert not lj.done()
    run(main())


def test_leave_group_triggers_a_rebalance_and_the_last_leave_empties_the_group():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", "b")
        ma, mb = joins["a"].member_id, joins["b"].member_id
        res = h.coord.leave_group(GROUP, [LeaveMember(mb)])
        assert res.error == ErrorCode.NONE and res.members[0].error == ErrorCode.NONE
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        assert h.coord.heartbeat(GROUP, mb, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.coord.heartbeat(GROUP, ma, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        ra = await h.join(ma)
        assert ra.generation_id == 2 and [m.member_id for m in ra.members] == [ma]
        assert (await h.sync(ma, 2, {ma: b"x"})).error == ErrorCode.NONE

        res = h.coord.leave_group(GROUP, [LeaveMember(ma), LeaveMember("nobody")])
        assert [m.error for m in res.members] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
        await settle()
        assert h.coord.group_state(GROUP) == GroupState.EMPTY
        key, value = h.log.decoded(h.partition)[-1]   # the empty generation is stored too
        assert key == GroupMetadataKey(GROUP)
        assert (value.generation, value.protocol, value.leader, value.members) == (3, None, None, ())
    run(main())


def test_session_timeout_expels_a_silent_member_and_rebalances():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", "b")
        ma, mb = joins["a"].member_id, joins["b"].member_id
        for _ in range(3):                            # a heartbeats, b stays silent
            await h.advance(SESSION - 1000)
            assert h.coord.heartbeat(GROUP, ma, 1) in (ErrorCode.NONE,
                                                        ErrorCode.REBALANCE_IN_PROGRESS)
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
        assert h.coord.heartbeat(GROUP, mb, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        ra = await h.join(ma)
        assert ra.generation_id == 2 and [m.member_id for m in ra.members] == [ma]
    run(main())


def test_rebalance_timeout_removes_members_that_did_not_rejoin():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", "b")
        ma, mb = joins["a"].member_id, joins["b"].member_id
        ja = h.join(ma)                               # leader rejoins: rebalance
        await settle()
        for _ in range(4):                            # b keeps heartbeating but never rejoins
            await h.advance(REBALANCE // 4 - 10)
            h.coord.heartbeat(GROUP, mb, 1)
        assert not ja.done()
        await h.advance(100)
        ra = await ja
        assert ra.error == ErrorCode.NONE and ra.generation_id == 2
        assert [m.member_id for m in ra.members] == [ma]
        assert h.coord.heartbeat(GROUP, mb, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    run(main())


def test_member_that_never_sends_sync_group_is_removed_after_the_rebalance_timeout():
    async def main():
        h = Harness()
        a, b = h.join(client_id="a"), h.join(client_id="b")
        await h.advance(0)
        ra, rb = await a, await b
        leader, follower = (ra, rb) if ra.members else (rb, ra)
        assert (await h.sync(leader.member_id, 1, {})).error == ErrorCode.NONE
        for _ in range(4):
            await h.advance(REBALANCE // 4)
            h.coord.heartbeat(GROUP, leader.member_id, 1)
        assert h.coord.heartbeat(GROUP, follower.member_id, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    run(main())


def test_member_id_required_flow_for_join_group_v4_and_later():
    async def main():
        h = Harness()
        first = await h.join(client_id="c1", require_known_member_id=True)
        assert first.error == ErrorCode.MEMBER_ID_REQUIRED
        assert first.member_id.startswith("c1-") and first.generation_id == -1
        assert h.coord.group_state(GROUP) == GroupState.EMPTY       # pending, not a member yet
        j = h.join(first.member_id, client_id="c1", require_known_member_id=True)
        await h.advance(0)                            # group.initial.rebalance.delay.ms = 0
        second = await j
        assert second.error == ErrorCode.NONE and second.member_id == first.member_id
        assert second.leader_id == first.member_id and second.generation_id == 1
        # an id the coordinator never handed out is refused
        bogus = await h.join("c9-bogus", require_known_member_id=True)
        assert bogus.error == ErrorCode.UNKNOWN_MEMBER_ID
    run(main())


def test_pending_member_that_never_comes_back_expires_after_its_session_timeout():
    async def main():
        h = Harness()
        joins = await h.stable_group("a")
        ma = joins["a"].member_id
        pending = await h.join(client_id="late", require_known_member_id=True)
        assert pending.error == ErrorCode.MEMBER_ID_REQUIRED
        ja = h.join(ma)                       # a rebalance now waits for the pending member
        await settle()
        assert not ja.done()
        await h.advance(SESSION)
        ra = await ja
        assert ra.generation_id == 2 and [m.member_id for m in ra.members] == [ma]
        late = await h.join(pending.member_id, require_known_member_id=True)
        assert late.error == ErrorCode.UNKNOWN_MEMBER_ID
    run(main())


def test_join_and_sync_errors():
    async def main():
        h = Harness(group_min_session_timeout_ms=6000, group_max_session_timeout_ms=60_000)
        assert (await h.join(session_timeout_ms=5999)).error == ErrorCode.INVALID_SESSION_TIMEOUT
        assert (await h.join(session_timeout_ms=60_001)).error == ErrorCode.INVALID_SESSION_TIMEOUT
        assert (await h.join(group_id="")).error == ErrorCode.INVALID_GROUP_ID
        assert (await h.join("someone", group_id="nope")).error == ErrorCode.UNKNOWN_MEMBER_ID
        assert (await h.join(protocol_type="")).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert (await h.join(protocols=())).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        joins = await h.stable_group("a")
        ma = joins["a"].member_id
        assert (await h.join(protocol_type="connect")).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        other = await h.join(protocols=[("sticky", b"")])
        assert other.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert (await h.sync(ma, 7)).error == ErrorCode.ILLEGAL_GENERATION
        assert (await h.sync("ghost", 1)).error == ErrorCode.UNKNOWN_MEMBER_ID
        assert (await h.sync(ma, 1, protocol_type="connect")).error == \
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert (await h.sync(ma, 1, protocol_name="roundrobin")).error == \
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert (await h.sync(ma, 1, protocol_type="consumer", protocol_name="range")).error == \
            ErrorCode.NONE
        assert (await h.sync(ma, 1, group_id="unknown-group")).error == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.coord.heartbeat(GROUP, "ghost", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.coord.heartbeat("other", ma, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.coord.heartbeat(GROUP, ma, 0) == ErrorCode.ILLEGAL_GENERATION
    run(main())


def test_sync_group_during_a_new_rebalance_is_told_to_rejoin():
    async def main():
        h = Harness()
        a, b = h.join(client_id="a"), h.join(client_id="b")
        await h.advance(0)
        ra, rb = await a, await b
        follower = ra if not ra.members else rb
        parked = h.sync(follower.member_id, 1)
        await settle()
        c = h.join(client_id="c")                     # joins before the leader's SyncGroup
        assert (await parked).error == ErrorCode.REBALANCE_IN_PROGRESS
        assert (await h.sync(follower.member_id, 1)).error == ErrorCode.REBALANCE_IN_PROGRESS
        c.cancel()
    run(main())


def test_static_member_rejoining_with_a_new_id_replaces_the_old_one_without_rebalance():
    async def main():
        h = Harness()
        a = h.join(client_id="a", group_instance_id="inst-a")
        b = h.join(client_id="b", group_instance_id="inst-b")
        await h.advance(0)
        ra, rb = await a, await b
        assert ra.member_id.startswith("inst-a-")
        leader = ra if ra.members else rb
        syncs = [h.sync(ra.member_id, 1, group_instance_id="inst-a",
                        assignments={ra.member_id: b"A", rb.member_id: b"B"} if leader is ra else ()),
                 h.sync(rb.member_id, 1, group_instance_id="inst-b",
                        assignments={ra.member_id: b"A", rb.member_id: b"B"} if leader is rb else ())]
        await settle()
        assert [(await s).error for s in syncs] == [ErrorCode.NONE] * 2

        # inst-b restarts: it comes back with no member id and gets a new one, no rebalance
        rb2 = await h.join(client_id="b", group_instance_id="inst-b")
        assert rb2.error == ErrorCode.NONE and rb2.member_id != rb.member_id
        assert rb2.generation_id == 1
        assert h.coord.group_state(GROUP) == GroupState.STABLE
        assert (await h.sync(rb2.member_id, 1, group_instance_id="inst-b")).assignment == b"B"
        # the old incarnation is fenced
        assert h.coord.heartbeat(GROUP, rb.member_id, 1, group_instance_id="inst-b") == \
            ErrorCode.FENCED_INSTANCE_ID
        assert h.coord.heartbeat(GROUP, rb2.member_id, 1, group_instance_id="inst-b") == \
            ErrorCode.NONE
        members = {m.member_id for m in h.coord.describe_groups([GROUP])[0].members}
        assert members == {ra.member_id, rb2.member_id}
        _, value = h.log.decoded(h.partition)[-1]     # the new member id is persisted
        assert {m.member_id for m in value.members} == members

        # LeaveGroup v3+ by instance id, in a batch
        res = h.coord.leave_group(GROUP, [LeaveMember("", "inst-a"), LeaveMember("", "inst-z")])
        assert [m.error for m in res.members] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
        assert h.coord.group_state(GROUP) == GroupState.PREPARING_REBALANCE
    run(main())


def test_static_member_that_misses_the_rebalance_deadline_stays_in_the_group():
    async def main():
        h = Harness()
        a = h.join(client_id="a")
        b = h.join(client_id="b", group_instance_id="inst-b")
        await h.advance(0)
        ra, rb = await a, await b
        assert ra.leader_id == ra.member_id
        s = [h.sync(ra.member_id, 1, {ra.member_id: b"A", rb.member_id: b"B"}),
             h.sync(rb.member_id, 1, group_instance_id="inst-b")]
        await settle()
        assert [(await t).error for t in s] == [ErrorCode.NONE] * 2
        ja = h.join(ra.member_id)                     # the leader rejoins; inst-b does not,
        await settle()                                # though it stays alive (heartbeats)
        for _ in range(6):
            await h.advance(REBALANCE // 6)
            h.coord.heartbeat(GROUP, rb.member_id, 1, group_instance_id="inst-b")
        await h.advance(10)
        r = await ja
        assert r.generation_id == 2
        assert {m.member_id for m in r.members} == {ra.member_id, rb.member_id}
    run(main())


# =========================================================================== offsets

def test_commit_then_fetch_round_trip_with_leader_epoch_and_metadata():
    async def main():
        h = Harness()
        joins = await h.stable_group("a")
        ma = joins["a"].member_id
        res = await h.coord.commit_offsets(GROUP, ma, 1, [
            OffsetCommitPartition("orders", 0, 100, 5, "m0"),
            OffsetCommitPartition("orders", 1, 200, metadata=None),
        ])
        assert res == {("orders", 0): ErrorCode.NONE, ("orders", 1): ErrorCode.NONE}
        all_ = h.coord.fetch_offsets(GROUP)
        assert all_.error == ErrorCode.NONE
        assert {tp: tuple(o) for tp, o in all_.offsets.items()} == {
            ("orders", 0): (100, 5, "m0", ErrorCode.NONE),
            ("orders", 1): (200, -1, "", ErrorCode.NONE)}
        some = h.coord.fetch_offsets(GROUP, [("orders", 1), ("orders", 9), ("other", 0)])
        assert [tuple(o)[:3] for o in some.offsets.values()] == [
            (200, -1, ""), (-1, -1, ""), (-1, -1, "")]
        assert h.coord.fetch_offsets("no-such-group", [("t", 0)]).offsets[("t", 0)].offset == -1
        assert h.coord.fetch_offsets("no-such-group").offsets == {}

        records = [(k, v) for k, v in h.log.decoded(h.partition) if isinstance(k, OffsetCommitKey)]
        assert records == [
            (OffsetCommitKey(GROUP, "orders", 0), OffsetCommitValue(100, "m0", h.clock.milliseconds(), 5)),
            (OffsetCommitKey(GROUP, "orders", 1), OffsetCommitValue(200, "", h.clock.milliseconds(), -1)),
        ]
    run(main())


def test_generation_minus_one_commit_from_a_manually_assigned_consumer():
    async def main():
        h = Harness()
        res = await h.coord.commit_offsets("manual", "", -1, [("t", 0, 7)])
        assert res == {("t", 0): ErrorCode.NONE}
        assert h.coord.group_state("manual") == GroupState.EMPTY
        assert h.coord.fetch_offsets("manual").offsets[("t", 0)].offset == 7
        assert h.coord.describe_groups(["manual"])[0].state == "Empty"
        # a member id or a generation of a group that has none is refused
        assert (await h.coord.commit_offsets("manual", "x", 1, [("t", 0, 8)]))[("t", 0)] == \
            ErrorCode.UNKNOWN_MEMBER_ID
        assert (await h.coord.commit_offsets("fresh", "", 3, [("t", 0, 8)]))[("t", 0)] == \
            ErrorCode.ILLEGAL_GENERATION

        # once the group has members, only they may commit
        joins = await h.stable_group("a")
        assert (await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 1)]))[("t", 0)] == \
            ErrorCode.UNKNOWN_MEMBER_ID
        ma = joins["a"].member_id
        assert (await h.coord.commit_offsets(GROUP, ma, 0, [("t", 0, 1)]))[("t", 0)] == \
            ErrorCode.ILLEGAL_GENERATION
        assert (await h.coord.commit_offsets(GROUP, "ghost", 1, [("t", 0, 1)]))[("t", 0)] == \
            ErrorCode.UNKNOWN_MEMBER_ID
    run(main())


def test_commit_during_completing_rebalance_gets_rebalance_in_progress():
    async def main():
        h = Harness()
        j = h.join(client_id="a")
        await h.advance(0)
        r = await j
        assert h.coord.group_state(GROUP) == GroupState.COMPLETING_REBALANCE
        res = await h.coord.commit_offsets(GROUP, r.member_id, 1, [("t", 0, 1)])
        assert res[("t", 0)] == ErrorCode.REBALANCE_IN_PROGRESS
    run(main())


def test_commit_answers_only_after_the_append_completes():
    async def main():
        h = Harness()
        h.log.gate = asyncio.Event()
        commit = asyncio.get_running_loop().create_task(
            h.coord.commit_offsets("g", "", -1, [("t", 0, 5)]))
        await settle()
        assert not commit.done()
        assert h.coord.fetch_offsets("g", [("t", 0)]).offsets[("t", 0)].offset == -1
        stable = h.coord.fetch_offsets("g", [("t", 0)], require_stable=True)
        assert stable.offsets[("t", 0)].error == ErrorCode.UNSTABLE_OFFSET_COMMIT
        h.log.gate.set()
        assert (await commit)[("t", 0)] == ErrorCode.NONE
        assert h.coord.fetch_offsets("g", [("t", 0)], require_stable=True).offsets[("t", 0)] \
            .offset == 5
    run(main())


def test_failed_append_is_reported_and_not_applied():
    async def main():
        h = Harness()
        h.log.fail_with = ErrorCode.NOT_LEADER_OR_FOLLOWER
        res = await h.coord.commit_offsets("g", "", -1, [("t", 0, 5)])
        assert res[("t", 0)] == ErrorCode.NOT_COORDINATOR
        h.log.fail_with = ErrorCode.RECORD_LIST_TOO_LARGE
        res = await h.coord.commit_offsets("g", "", -1, [("t", 0, 5)])
        assert res[("t", 0)] == ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        assert h.coord.fetch_offsets("g", [("t", 0)]).offsets[("t", 0)].offset == -1
    run(main())


def test_metadata_over_the_limit_is_refused_per_partition():
    async def main():
        h = Harness(offset_metadata_max_bytes=4)
        res = await h.coord.commit_offsets("g", "", -1, [("t", 0, 1, -1, "1234"),
                                                         ("t", 1, 1, -1, "12345")])
        assert res == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    run(main())


def test_committed_offsets_and_group_state_survive_a_restart():
    async def main():
        log = MemoryOffsetsLog()
        h = Harness(log)
        joins = await h.stable_group("a", "b", protocols=[("range", subscription("orders"))])
        ma, mb = joins["a"].member_id, joins["b"].member_id
        await h.coord.commit_offsets(GROUP, ma, 1, [("orders", 0, 10, 3, "x"), ("orders", 1, 11)])
        await h.coord.commit_offsets(GROUP, mb, 1, [("orders", 0, 12, 4, "y")])    # newer wins
        await h.coord.commit_offsets("simple", "", -1, [("logs", 2, 99)])
        await h.coord.commit_offsets("gone", "", -1, [("logs", 0, 1)])
        assert await h.coord.delete_groups(["gone"]) == {"gone": ErrorCode.NONE}
        h.coord.shutdown()

        h2 = Harness(log, clock=h.clock)              # a new broker process replays the topic
        c = h2.coord
        assert c.group_state(GROUP) == GroupState.STABLE
        d = c.describe_groups([GROUP])[0]
        assert (d.state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
        assert {m.member_id: m.assignment for m in d.members} == {
            ma: b"asg-" + ma.encode(), mb: b"asg-" + mb.encode()}
        assert {tp: tuple(o)[:3] for tp, o in c.fetch_offsets(GROUP).offsets.items()} == {
            ("orders", 0): (12, 4, "y"), ("orders", 1): (11, -1, "")}
        assert c.fetch_offsets("simple").offsets[("logs", 2)].offset == 99
        assert c.group_state("simple") == GroupState.EMPTY
        assert c.group_state("gone") is None
        # the members carry on where they were ...
        assert c.heartbeat(GROUP, ma, 1) == ErrorCode.NONE
        assert (await h2.sync(mb, 1)).assignment == b"asg-" + mb.encode()
        # ... and one that does not come back is expelled after its session timeout
        for _ in range(3):
            await h2.advance(SESSION // 2)
            c.heartbeat(GROUP, ma, 1)
        assert c.heartbeat(GROUP, mb, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert c.group_state(GROUP) == GroupState.PREPARING_REBALANCE
    run(main())


def test_replay_honours_tombstones_and_skips_unknown_keys():
    async def main():
        log = MemoryOffsetsLog()
        p = partition_for("g")
        log.partitions[p] += [
            offset_commit_record("g", "t", 0, OffsetCommitValue(5, "", 1)),
            offset_commit_record("g", "t", 1, OffsetCommitValue(6, "", 1)),
            offset_commit_record("g", "t", 0, None),
            (struct.pack(">h", 3) + b"\x00\x01g", b"\x00\x00whatever"),  # a newer Kafka's record
            group_metadata_record("g", GroupMetadataValue("consumer", 4, None, None, 1, ())),
        ]
        c = Harness(log).coord
        assert list(c.fetch_offsets("g").offsets) == [("t", 1)]
        assert c.group_state("g") == GroupState.EMPTY
        # the next rebalance continues the stored generation
        h = Harness(log)
        j = h.join(group_id="g")
        await h.advance(0)
        assert (await j).generation_id == 5
    run(main())


def test_offsets_of_an_empty_group_expire_after_the_retention_time():
    async def main():
        h = Harness(offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
        joins = await h.stable_group("a")
        ma = joins["a"].member_id
        await h.coord.commit_offsets(GROUP, ma, 1, [("t", 0, 1)])
        await h.coord.commit_offsets("simple", "", -1, [("t", 0, 1)])
        for _ in range(13):                           # 65 s; the periodic check runs every 10 s
            await h.advance(5_000)
            assert h.coord.heartbeat(GROUP, ma, 1) == ErrorCode.NONE
        # the simple group's commit is 60 s old at the 60 s check: gone, and the group with it
        assert h.coord.group_state("simple") is None
        assert h.log.decoded(partition_for("simple"))[-1] == (OffsetCommitKey("simple", "t", 0), None)
        # a consumer group keeps its offsets while it has members
        assert h.coord.fetch_offsets(GROUP).offsets
        h.coord.leave_group(GROUP, [LeaveMember(ma)])
        await settle()
        assert h.coord.group_state(GROUP) == GroupState.EMPTY
        await h.advance(59_000)                       # checked at 120 s: empty for 55 s only
        assert h.coord.fetch_offsets(GROUP).offsets
        await h.advance(7_000)                        # checked at 130 s: empty for 65 s
        assert h.coord.fetch_offsets(GROUP).offsets == {}
        assert h.coord.group_state(GROUP) is None
        tail = h.log.decoded(h.partition)[-2:]
        assert tail == [(OffsetCommitKey(GROUP, "t", 0), None), (GroupMetadataKey(GROUP), None)]
        assert await h.coord.expire_offsets() == 0
    run(main())


def test_stable_consumer_group_expires_offsets_of_topics_it_no_longer_subscribes_to():
    async def main():
        h = Harness(offsets_retention_ms=1_000)
        joins = await h.stable_group("a", protocols=[("range", subscription("t1"))])
        ma = joins["a"].member_id
        await h.coord.commit_offsets(GROUP, ma, 1, [("t1", 0, 1), ("t2", 0, 1)])
        h.clock.advance_ms(5_000)
        assert await h.coord.expire_offsets() == 1
        assert list(h.coord.fetch_offsets(GROUP).offsets) == [("t1", 0)]
    run(main())


def test_delete_groups_only_deletes_empty_groups_and_writes_tombstones():
    async def main():
        h = Harness()
        await h.stable_group("a")
        await h.coord.commit_offsets("manual", "", -1, [("t", 0, 1)])
        res = await h.coord.delete_groups([GROUP, "manual", "missing"])
        assert res == {GROUP: ErrorCode.NON_EMPTY_GROUP, "manual": ErrorCode.NONE,
                       "missing": ErrorCode.GROUP_ID_NOT_FOUND}
        assert h.coord.fetch_offsets("manual").offsets == {}
        # generation 0 (offsets only): no group metadata tombstone
        assert h.log.decoded(partition_for("manual"))[-1] == (OffsetCommitKey("manual", "t", 0), None)
    run(main())


def test_commit_with_a_retention_time_stores_an_expire_timestamp():
    async def main():
        h = Harness()
        now = h.clock.milliseconds()
        await h.coord.commit_offsets("g", "", -1, [("t", 0, 3)], retention_time_ms=5_000)
        (key, value), = h.log.decoded(partition_for("g"))
        assert value == OffsetCommitValue(3, "", now, -1, expire_timestamp=now + 5_000)
        assert h.log.partitions[partition_for("g")][0][1][:2] == b"\x00\x01"   # value v1
        h.clock.advance_ms(4_999)
        assert await h.coord.expire_offsets() == 0
        h.clock.advance_ms(1)
        assert await h.coord.expire_offsets() == 1
    run(main())


def test_delete_offsets_of_topics_a_consumer_group_does_not_subscribe_to():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", protocols=[("range", subscription("t1"))])
        ma = joins["a"].member_id
        await h.coord.commit_offsets(GROUP, ma, 1, [("t1", 0, 1), ("t2", 0, 1)])
        error, parts = await h.coord.delete_offsets(GROUP, [("t1", 0), ("t2", 0)])
        assert error == ErrorCode.NONE
        assert parts == {("t1", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ("t2", 0): ErrorCode.NONE}
        assert list(h.coord.fetch_offsets(GROUP).offsets) == [("t1", 0)]
        assert (await h.coord.delete_offsets("missing", [("t", 0)]))[0] == \
            ErrorCode.GROUP_ID_NOT_FOUND
    run(main())


def test_a_deleted_topics_offsets_leave_every_group_and_stay_gone_after_a_restart():
    async def main():
        h = Harness()
        joins = await h.stable_group("a", protocols=[("range", subscription("t", "u"))])
        ma = joins["a"].member_id
        await h.coord.commit_offsets(GROUP, ma, 1, [("t", 0, 50), ("t", 1, 40), ("u", 0, 7)])
        await h.coord.commit_offsets("simple", "", -1, [("t", 0, 50)])
        h.coord.on_topic_deleted(SimpleNamespace(name="t"))
        # gone at once, before any tombstone is appended
        assert list(h.coord.fetch_offsets(GROUP).offsets) == [("u", 0)]
        await settle()
        assert h.log.decoded(h.partition)[-2:] == [(OffsetCommitKey(GROUP, "t", 0), None),
                                                   (OffsetCommitKey(GROUP, "t", 1), None)]
        assert h.log.decoded(partition_for("simple"))[-1] == \
            (OffsetCommitKey("simple", "t", 0), None)
        # as in Kafka 4, a group left Empty without offsets goes at the next expiry pass
        assert h.coord.group_state("simple") == GroupState.EMPTY
        await h.coord.expire_offsets()
        assert h.coord.group_state("simple") is None
        h.coord.shutdown()
        # "t" is created again: a restarted coordinator gives it no offsets
        c = Harness(h.log, clock=h.clock, topic_exists=lambda topic: True).coord
        assert list(c.fetch_offsets(GROUP).offsets) == [("u", 0)]
        assert c.fetch_offsets("simple", [("t", 0)]).offsets[("t", 0)].offset == -1
    run(main())


def test_offsets_of_a_topic_deleted_before_its_tombstones_were_written_are_dropped_at_load():
    async def main():
        log = MemoryOffsetsLog()
        p = partition_for("g")
        log.partitions[p] += [offset_commit_record("g", "t", 0, OffsetCommitValue(50, "", 1)),
                              offset_commit_record("g", "u", 0, OffsetCommitValue(7, "", 1))]
        # the broker stopped after "t" was deleted, before its tombstones were appended
        h = Harness(log, topic_exists=lambda topic: topic != "t")
        assert list(h.coord.fetch_offsets("g").offsets) == [("u", 0)]
        await settle()
        assert log.decoded(p)[-1] == (OffsetCommitKey("g", "t", 0), None)
        h.coord.shutdown()
        # a new "t" created later does not inherit the old offset
        c = Harness(log, topic_exists=lambda topic: True).coord
        assert list(c.fetch_offsets("g").offsets) == [("u", 0)]
    run(main())


def test_a_commit_in_flight_when_its_topic_is_deleted_is_never_applied():
    async def main():
        h = Harness()
        h.log.gate = asyncio.Event()
        commit = asyncio.get_running_loop().create_task(
            h.coord.commit_offsets("g", "", -1, [("t", 0, 50)]))
        await settle()                                # its append is under way
        h.coord.on_topic_deleted(SimpleNamespace(name="t"))
        h.log.gate.set()
        assert await commit == {("t", 0): ErrorCode.NONE}
        await settle()
        assert h.coord.fetch_offsets("g").offsets == {}
        # the commit's record is followed by its tombstone
        assert [v for _, v in h.log.decoded(partition_for("g"))][-1] is None
        h.coord.shutdown()
        assert Harness(h.log, topic_exists=lambda topic: True).coord.fetch_offsets("g").offsets == {}
    run(main())


def test_group_max_size_refuses_extra_members():
    async def main():
        h = Harness(group_max_size=1)
        await h.stable_group("a")
        refused = await h.join(client_id="b")
        assert refused.error == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert h.coord.group_state(GROUP) == GroupState.STABLE
    run(main())


def test_describe_and_list_groups_report_kafka_state_names():
    async def main():
        h = Harness()
        joins = await h.stable_group("a")
        await h.coord.commit_offsets("manual", "", -1, [("t", 0, 1)])
        d, missing = h.coord.describe_groups([GROUP, "nope"])
        assert (d.error, d.state, d.protocol_type, d.protocol_data) == (
            ErrorCode.NONE, "Stable", "consumer", "range")
        m, = d.members
        assert (m.member_id, m.client_id, m.client_host, m.metadata) == (
            joins["a"].member_id, "a", "/127.0.0.1", b"meta")
        assert (missing.error, missing.state) == (ErrorCode.NONE, "Dead")
        listed = h.coord.list_groups()
        assert listed.error == ErrorCode.NONE
        assert sorted(listed.groups) == [("manual", "", "Empty", "classic"),
                                         (GROUP, "consumer", "Stable", "classic")]
        assert [g.group_id for g in h.coord.list_groups(states=["stable"]).groups] == [GROUP]
        assert h.coord.list_groups(types=["consumer"]).groups == ()
    run(main())


def test_groups_of_partitions_not_loaded_get_not_coordinator():
    async def main():
        log = MemoryOffsetsLog()
        c = GroupCoordinator(log, GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0),
                             timers=ManualTimers())
        assert c.heartbeat(GROUP, "m", 1) == ErrorCode.NOT_COORDINATOR
        assert c.fetch_offsets(GROUP).error == ErrorCode.NOT_COORDINATOR
        c.load([partition_for(GROUP)])
        assert c.heartbeat(GROUP, "m", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert c.heartbeat("", "m", 1) == ErrorCode.INVALID_GROUP_ID
        c.unload([partition_for(GROUP)])
        assert (await c.commit_offsets(GROUP, "", -1, [("t", 0, 1)]))[("t", 0)] == \
            ErrorCode.NOT_COORDINATOR
    run(main())


def test_unloading_answers_parked_join_requests_with_not_coordinator():
    async def main():
        h = Harness(group_initial_rebalance_delay_ms=1000)
        j = h.join()
        await settle()
        h.coord.unload([h.partition])
        assert (await j).error == ErrorCode.NOT_COORDINATOR
    run(main())


def test_loop_timers_drive_a_real_rebalance():
    """The default timers: the running loop's call_later, with real (short) timeouts."""
    async def main():
        c = GroupCoordinator(MemoryOffsetsLog(), GroupCoordinatorConfig(
            group_min_session_timeout_ms=1, group_initial_rebalance_delay_ms=20))
        c.load()
        a = asyncio.create_task(c.join_group(GROUP, "", "consumer", [("range", b"")],
                                             session_timeout_ms=200, rebalance_timeout_ms=500))
        b = asyncio.create_task(c.join_group(GROUP, "", "consumer", [("range", b"")],
                                             session_timeout_ms=200, rebalance_timeout_ms=500))
        ra, rb = await asyncio.wait_for(asyncio.gather(a, b), 2)
        assert ra.generation_id == rb.generation_id == 1
        leader = ra if ra.members else rb
        follower = rb if leader is ra else ra
        assert (await c.sync_group(GROUP, 1, leader.member_id, assignments={})).error == ErrorCode.NONE
        await asyncio.sleep(0.35)                     # the follower never syncs nor heartbeats
        assert c.heartbeat(GROUP, follower.member_id, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        c.shutdown()
    run(main())


# =========================================================================== record formats

def s16(s: str) -> bytes:
    """A non-flexible string: int16 length, UTF-8 bytes."""
    return struct.pack(">h", len(s.encode())) + s.encode()


def test_offset_commit_key_bytes():
    # OffsetCommitKey.json: version int16 (1 as Kafka writes), group string, topic string,
    # partition int32
    expected = (b"\x00\x01"
                b"\x00\x0atest-group"
                b"\x00\x06orders"
                b"\x00\x00\x00\x03")
    assert encode_offset_commit_key("test-group", "orders", 3) == expected
    assert decode_key(expected) == OffsetCommitKey("test-group", "orders", 3)
    v0 = b"\x00\x00" + expected[2:]
    assert decode_key(v0) == OffsetCommitKey("test-group", "orders", 3, version=0)


def test_group_metadata_key_bytes():
    expected = b"\x00\x02" + b"\x00\x0atest-group"
    assert encode_group_metadata_key("test-group") == expected
    assert decode_key(expected) == GroupMetadataKey("test-group")
    assert decode_key(b"\x00\x10whatever") == UnknownKey(16)   # a consumer group regex record


def test_offset_commit_value_v3_bytes():
    # v3: offset int64, leaderEpoch int32, metadata string, commitTimestamp int64
    value = OffsetCommitValue(offset=42, metadata="meta", commit_timestamp=1_700_000_000_000,
                              leader_epoch=7)
    expected = (b"\x00\x03"
                + (42).to_bytes(8, "big")
                + (7).to_bytes(4, "big")
                + b"\x00\x04meta"
                + (1_700_000_000_000).to_bytes(8, "big"))
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value
    assert decode_offset_commit_value(None) is None     # tombstone


def test_offset_commit_value_other_versions():
    # v1 (written when the commit had a retention time): offset, metadata, commit, expire
    v1 = OffsetCommitValue(offset=1, metadata="", commit_timestamp=2, expire_timestamp=3)
    expected_v1 = (b"\x00\x01" + (1).to_bytes(8, "big") + b"\x00\x00"
                   + (2).to_bytes(8, "big") + (3).to_bytes(8, "big"))
    assert encode_offset_commit_value(v1) == expected_v1
    assert decode_offset_commit_value(expected_v1) == v1
    # v0/v2: offset, metadata, commit timestamp; no leader epoch
    body = (5).to_bytes(8, "big") + b"\x00\x01m" + (6).to_bytes(8, "big")
    for version in (0, 2):
        assert decode_offset_commit_value(struct.pack(">h", version) + body) == \
            OffsetCommitValue(5, "m", 6, -1)
    # v4 is flexible: compact string (uvarint length+1), then an empty tagged-field section
    v4 = (b"\x00\x04" + (5).to_bytes(8, "big") + (9).to_bytes(4, "big") + b"\x02m"
          + (6).to_bytes(8, "big") + b"\x00")
    assert decode_offset_commit_value(v4) == OffsetCommitValue(5, "m", 6, 9)
    assert encode_offset_commit_value(OffsetCommitValue(5, "m", 6, 9), version=4) == v4
    # unknown tagged fields are skipped
    v4_tagged = v4[:-1] + b"\x01\x05\x02zz"
    assert decode_offset_commit_value(v4_tagged) == OffsetCommitValue(5, "m", 6, 9)


def test_group_metadata_value_v3_bytes():
    member = MemberMetadataValue(member_id="m-1", client_id="cli", client_host="/10.0.0.1",
                                 session_timeout=45_000, rebalance_timeout=300_000,
                                 subscription=b"\x00\x01", assignment=b"\x00\x02\x03",
                                 group_instance_id="inst")
    value = GroupMetadataValue(protocol_type="consumer", generation=5, protocol="range",
                               leader="m-1", current_state_timestamp=1_700_000_000_001,
                               members=(member,))
    expected = (b"\x00\x03"
                + s16("consumer")
                + (5).to_bytes(4, "big")
                + s16("range")
                + s16("m-1")
                + (1_700_000_000_001).to_bytes(8, "big")
                + (1).to_bytes(4, "big")                # members: int32 count
                + s16("m-1")
                + s16("inst")                           # groupInstanceId (v3+, nullable)
                + s16("cli")
                + s16("/10.0.0.1")
                + (300_000).to_bytes(4, "big")          # rebalanceTimeout (v1+)
                + (45_000).to_bytes(4, "big")           # sessionTimeout
                + b"\x00\x00\x00\x02\x00\x01"           # subscription: int32 length + bytes
                + b"\x00\x00\x00\x03\x00\x02\x03")      # assignment
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_group_metadata_value_of_an_empty_group_and_old_versions():
    empty = GroupMetadataValue("consumer", 2, None, None, 7, ())
    expected = (b"\x00\x03" + s16("consumer") + (2).to_bytes(4, "big")
                + b"\xff\xff" + b"\xff\xff"             # null protocol, null leader
                + (7).to_bytes(8, "big") + (0).to_bytes(4, "big"))
    assert encode_group_metadata_value(empty) == expected
    assert decode_group_metadata_value(expected) == empty
    # v0: no currentStateTimestamp, no instance id, no rebalance timeout (= session timeout)
    v0 = (b"\x00\x00" + s16("consumer") + (1).to_bytes(4, "big") + s16("range") + s16("m")
          + (1).to_bytes(4, "big") + s16("m") + s16("c") + s16("h")
          + (10).to_bytes(4, "big") + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00")
    decoded = decode_group_metadata_value(v0)
    assert decoded.current_state_timestamp == -1
    assert decoded.members == (MemberMetadataValue("m", "c", "h", 10, 10, b"", b"", None),)
    # v4 (flexible) round trip
    member = MemberMetadataValue("m", "c", "h", 10, 20, b"s", b"a", None)
    v4 = GroupMetadataValue("consumer", 3, "range", "m", 9, (member,))
    assert decode_group_metadata_value(encode_group_metadata_value(v4, version=4)) == v4
    assert decode_group_metadata_value(None) is None


def test_consumer_subscription_topics_are_read_from_the_v0_prefix():
    assert consumer_subscription_topics(subscription("a", "b")) == {"a", "b"}
    assert consumer_subscription_topics(b"\x00") is None


def test_java_string_hashcode_and_partition_for_known_group_ids():
    # "test-group": h = 31*h + c over the UTF-16 units, wrapping to int32:
    #   t 116 -> 116; e 101 -> 3697; s 115 -> 114722; t 116 -> 3556498; - 45 -> 110251483;
    #   g 103 -> 3417796076 = -877171220 (mod 2^32); r 114 -> -27192307706 = -1422503930;
    #   o 111 -> -44097621719 = -1147948759; u 117 -> -35586411412 = -1226673044;
    #   p 112 -> -38026864252 = 627841412.  627841412 % 50 = 12.
    assert java_string_hashcode("test-group") == 627841412
    assert partition_for("test-group") == 12
    assert partition_for("test-group", 7) == 627841412 % 7
    assert java_string_hashcode("") == 0 and java_string_hashcode("a") == 97
    assert partition_for("a") == 47
    # "my-group" hashes negative: -1906497762, abs 1906497762 % 50 = 12
    assert java_string_hashcode("my-group") == -1906497762
    assert partition_for("my-group") == 12
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: Utils.abs makes it 0, not negative
    assert java_string_hashcode("polygenelubricants") == -2**31
    assert java_utils_abs(-2**31) == 0
    assert partition_for("polygenelubricants") == 0
    # characters outside the BMP count as two UTF-16 units (a surrogate pair)
    assert java_string_hashcode("\U0001F600") == 0xD83D * 31 + 0xDE00


@pytest.mark.slow
def test_kafka_dump_log_segments_decodes_our_records(tmp_path):
    """Kafka's own offsets decoder (kafka-dump-log --offsets-decoder) reads what we write."""
    from kafka_tools import dump_log_segments, require_kafka_dist
    require_kafka_dist()
    from strata.protocol.records import SimpleRecord, build_batch
    member = MemberMetadataValue("m-1", "cli", "/127.0.0.1", 45_000, 300_000, b"\x00\x01",
                                 b"\x00\x02", "inst-1")
    records = [
        offset_commit_record("test-group", "orders", 3, OffsetCommitValue(42, "meta", 1_700_000_000_000, 7)),
        group_metadata_record("test-group", GroupMetadataValue("consumer", 5, "range", "m-1",
                                                               1_700_000_000_001, (member,))),
        offset_commit_record("test-group", "orders", 3, None),
    ]
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(build_batch([SimpleRecord(v, k, timestamp=1_700_000_000_000)
                                     for k, v in records]))
    out = dump_log_segments(segment, print_data=True, extra_args=["--offsets-decoder"])
    assert ('key: {"type":"1","data":{"group":"test-group","topic":"orders","partition":3}} '
            'payload: {"version":"3","data":{"offset":42,"leaderEpoch":7,"metadata":"meta",'
            '"commitTimestamp":1700000000000}}') in out
    assert ('payload: {"version":"3","data":{"protocolType":"consumer","generation":5,'
            '"protocol":"range","leader":"m-1","currentStateTimestamp":1700000000001,'
            '"members":[{"memberId":"m-1","groupInstanceId":"inst-1","clientId":"cli",'
            '"clientHost":"/127.0.0.1","rebalanceTimeout":300000,"sessionTimeout":45000,'
            '"subscription":"AAE=","assignment":"AAI="}]}}') in out
    assert "payload: <DELETE>" in out


class _SlowReplayLog(MemoryOffsetsLog):
    """A log whose replay (run in a worker thread by ``load_in_background``) waits for a
    threading event, as a large ``__consumer_offsets`` keeps a real replay busy."""

    def __init__(self) -> None:
        super().__init__()
        import threading
        self.release = threading.Event()

    def replay(self, partition: int):
        assert self.release.wait(10)
        return super().replay(partition)


def test_a_background_load_leaves_the_loop_serving_and_answers_load_in_progress_until_done():
    async def main():
        log = _SlowReplayLog()
        log.release.set()
        first = GroupCoordinator(log, GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0),
                                 timers=ManualTimers())
        first.load([partition_for(GROUP)])
        assert (await first.commit_offsets(GROUP, "", -1, [("t", 0, 42)]))[("t", 0)] == ErrorCode.NONE
        log.release.clear()
        c = GroupCoordinator(log, GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0),
                             timers=ManualTimers())
        c.load_in_background([partition_for(GROUP)])
        ticks = 0
        for _ in range(20):           # the loop runs while the replay is stuck
            await asyncio.sleep(0.001)
            ticks += 1
        assert ticks == 20
        assert c.fetch_offsets(GROUP).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        log.release.set()
        for _ in range(500):
            if partition_for(GROUP) in c.owned_partitions:
                break
            await asyncio.sleep(0.01)
        result = c.fetch_offsets(GROUP, [("t", 0)])
        assert result.error == ErrorCode.NONE and result.offsets[("t", 0)].offset == 42
    run(main())


def test_a_partition_unloaded_during_its_background_load_is_not_applied():
    async def main():
        log = _SlowReplayLog()
        c = GroupCoordinator(log, GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0),
                             timers=ManualTimers())
        c.load_in_background([partition_for(GROUP)])
        await asyncio.sleep(0.01)
        c.unload([partition_for(GROUP)])
        assert c.fetch_offsets(GROUP).error == ErrorCode.NOT_COORDINATOR
        log.release.set()
        await asyncio.sleep(0.2)
        assert partition_for(GROUP) not in c.owned_partitions
        assert c.fetch_offsets(GROUP).error == ErrorCode.NOT_COORDINATOR
    run(main())
