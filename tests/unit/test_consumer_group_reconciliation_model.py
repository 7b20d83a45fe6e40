"""A hypothesis model of KIP-848 reconciliation: clients that own exactly what their last
heartbeat response gave them, joining, heartbeating, changing subscriptions, leaving, while
topics grow. Whatever the order, no partition is owned by two clients at once, and once
everyone keeps heartbeating the group is Stable with every subscribed partition assigned, and
a coordinator restarted from the records in ``__consumer_offsets`` has the same group.
Also the assignors' own properties."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.common.errors import ErrorCode
from strata.coordinator.group.assignors import MemberSubscription, range_, uniform
from test_consumer_group_protocol import ORDERS, PAYMENTS, Harness, owned

MEMBERS = ["m0", "m1", "m2", "m3"]
TOPICS = {"orders": ORDERS, "payments": PAYMENTS}

op = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS),
              st.sampled_from([("orders",), ("payments",), ("orders", "payments")]),
              st.sampled_from([None, "uniform", "range"])),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("resubscribe"), st.sampled_from(MEMBERS),
              st.sampled_from([("orders",), ("payments",), ("orders", "payments")])),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("grow"), st.sampled_from(sorted(TOPICS))),
)


class Client:
    def __init__(self, member_id: str):
        self.member_id = member_id
        self.epoch = 0
        self.joined = False
        self.owned: dict[uuid.UUID, frozenset[int]] = {}

    def take(self, r) -> None:
        if r.error in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            self.owned, self.joined, self.epoch = {}, False, 0   # abandon everything, rejoin
            return
        assert r.error == ErrorCode.NONE, r
        self.epoch = r.member_epoch
        if r.assignment is not None:
            self.owned = {t: ps for t, ps in r.assignment.items() if ps}


def assert_disjoint(clients) -> None:
    seen: dict[tuple, str] = {}
    for c in clients.values():
        for t, ps in c.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {c.member_id}"
                seen[(t, p)] = c.member_id


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_no_partition_is_ever_owned_by_two_members(ops):
    async def scenario():
        h = Harness()
        clients = {m: Client(m) for m in MEMBERS}
        subscriptions: dict[str, tuple[str, ...]] = {}

        async def heartbeat(c: Client, **kw) -> None:
            if not c.joined:
                r = await h.hb(c.member_id, 0, topics=subscriptions[c.member_id], **kw)
                c.joined = r.error == ErrorCode.NONE
            else:
                r = await h.hb(c.member_id, c.epoch, owned=owned(c.owned), **kw)
            c.take(r)

        for step in ops:
            kind, name = step[0], step[1]
            if kind == "join":
                c = clients[name]
                if not c.joined:
                    subscriptions[name] = step[2]
                    await heartbeat(c, server_assignor=step[3])
            elif kind == "heartbeat" and clients[name].joined:
                await heartbeat(clients[name])
            elif kind == "resubscribe" and clients[name].joined:
                subscriptions[name] = step[2]
                c = clients[name]
                c.take(await h.hb(name, c.epoch, owned=owned(c.owned), topics=step[2]))
            elif kind == "leave" and clients[name].joined:
                c = clients[name]
                r = await h.hb(name, -1)
                assert r.error == ErrorCode.NONE
                c.owned, c.joined, c.epoch = {}, False, 0
            elif kind == "grow":
                info = h.image[name]
                info.partitions = min(info.partitions + 1, 12)
            assert_disjoint(clients)

        # everyone keeps heartbeating: the group converges
        active = [c for c in clients.values() if c.joined]
        for _ in range(4):
            for c in active:
                await heartbeat(c)
                assert_disjoint(clients)
        group = h.coord.consumer_group("cg")
        if active:
            assert group.state == "Stable"
            wanted = {(TOPICS[t], p) for c in active for t in subscriptions[c.member_id]
                      for p in range(h.image[t].partitions)}
            got = {(t, p) for c in active for t, ps in c.owned.items() for p in ps}
            assert got == wanted
            assert {c.epoch for c in active} == {group.group_epoch}
        # what __consumer_offsets holds is the group: a restarted coordinator has it all
        await asyncio.sleep(0)
        again = Harness(log=h.log).coord.consumer_group("cg")

        def state(g):
            if g is None or not g.members:
                return None
            return (g.group_epoch, g.assignment_epoch, g.target, {
                m.member_id: (m.member_epoch, m.previous_member_epoch, m.state, m.assigned,
                              m.pending_revocation, m.subscribed_topic_names)
                for m in g.members.values()})
        assert state(again) == state(group)

    asyncio.run(scenario())


@given(st.dictionaries(st.sampled_from(MEMBERS),
                       st.sets(st.sampled_from([ORDERS, PAYMENTS]), min_size=1), min_size=1),
       st.integers(1, 20), st.integers(1, 20), st.sampled_from([uniform, range_]))
def test_assignors_give_every_partition_to_exactly_one_subscriber(subs, n_orders, n_payments,
                                                                  assignor):
    topics = {ORDERS: n_orders, PAYMENTS: n_payments}
    out = assignor({m: MemberSubscription(frozenset(t)) for m, t in subs.items()}, topics)
    owners: dict[tuple, str] = {}
    for m, a in out.items():
        for t, ps in a.items():
            assert t in subs[m]
            for p in ps:
                assert (t, p) not in owners
                owners[(t, p)] = m
    expected = {(t, p) for t, n in topics.items() if any(t in s for s in subs.values())
                for p in range(n)}
    assert set(owners) == expected


@given(st.integers(1, 4), st.integers(1, 40))
def test_uniform_balances_a_homogeneous_group_and_keeps_what_it_can(members, partitions):
    spec = {f"m{i}": MemberSubscription(frozenset({ORDERS})) for i in range(members)}
    first = uniform(spec, {ORDERS: partitions})
    counts = [len(a.get(ORDERS, ())) for a in first.values()]
    assert max(counts) - min(counts) <= 1
    # a new member joins: the others keep all but what it takes
    spec = {m: MemberSubscription(frozenset({ORDERS}), first[m]) for m in spec}
    spec["new"] = MemberSubscription(frozenset({ORDERS}))
    second = uniform(spec, {ORDERS: partitions})
    counts = [len(a.get(ORDERS, ())) for a in second.values()]
    assert max(counts) - min(counts) <= 1
    moved = sum(len(first[m].get(ORDERS, frozenset()) - second[m].get(ORDERS, frozenset()))
                for m in first)
    assert moved == len(second["new"].get(ORDERS, ()))


def test_range_gives_contiguous_ranges_the_first_members_one_more():
    spec = {m: MemberSubscription(frozenset({ORDERS, PAYMENTS})) for m in ("b", "a", "c")}
    out = range_(spec, {ORDERS: 7, PAYMENTS: 2})
    assert out["a"] == {ORDERS: frozenset({0, 1, 2}), PAYMENTS: frozenset({0})}
    assert out["b"] == {ORDERS: frozenset({3, 4}), PAYMENTS: frozenset({1})}
    assert out["c"] == {ORDERS: frozenset({5, 6})}


@given(st.integers(2, 6), st.integers(1, 8), st.randoms(use_true_random=False))
def test_uniform_moves_only_what_a_new_member_takes_whatever_the_layout(members, per_member,
                                                                        rnd):
    """However the current partitions are spread (contiguous blocks here, shuffled there), a
    joining member takes its share and nobody else's partitions move."""
    partitions = members * per_member
    order = list(range(partitions))
    rnd.shuffle(order)
    current = {f"m{i}": {ORDERS: frozenset(order[i * per_member:(i + 1) * per_member])}
               for i in range(members)}
    spec = {m: MemberSubscription(frozenset({ORDERS}), a) for m, a in current.items()}
    spec["new"] = MemberSubscription(frozenset({ORDERS}))
    out = uniform(spec, {ORDERS: partitions})
    moved = sum(len(current[m][ORDERS] - out[m].get(ORDERS, frozenset())) for m in current)
    gained = sum(len(out[m].get(ORDERS, frozenset()) - current[m][ORDERS]) for m in current)
    assert gained == 0 and moved == len(out["new"].get(ORDERS, ()))
    counts = [len(a.get(ORDERS, ())) for a in out.values()]
    assert max(counts) - min(counts) <= 1
