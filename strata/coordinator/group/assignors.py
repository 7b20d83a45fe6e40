"""The server-side assignors of KIP-848 consumer groups (``group.consumer.assignors``), as
Kafka 4's ``uniform`` and ``range``: given each member's subscribed topics (by topic id) and
its current target assignment, and every subscribed topic's partition count, each computes the
group's new target assignment. Pure functions, no state.

- ``uniform``: every partition of a subscribed topic goes to one of its subscribers; members
  keep what they had as long as the result stays balanced (Kafka's goals: counts within one of
  each other among members with the same subscription, then stickiness). The placement is not
  Kafka's partition for partition: Kafka's UniformAssignor is a different (optimised) algorithm
  with the same goals; clients never see which one ran.
- ``range``: per topic, its subscribers sorted by member id get contiguous ranges, the first
  ``partitions % members`` one partition more (co-partitioned topics land together).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping

Assignment = dict[uuid.UUID, frozenset[int]]

UNIFORM = "uniform"
RANGE = "range"

# Kafka accepts an assignor's class name as well as its short name
_CLASS_NAMES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": UNIFORM,
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": RANGE,
}


def assignor_name(configured: str) -> str:
    return _CLASS_NAMES.get(configured, configured)


@dataclass(frozen=True)
class MemberSubscription:
    topic_ids: frozenset[uuid.UUID]
    assigned: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    instance_id: str | None = None


def _subscribers(members: Mapping[str, MemberSubscription],
                 topics: Mapping[uuid.UUID, int]) -> dict[uuid.UUID, list[str]]:
    return {t: sorted(m for m, spec in members.items() if t in spec.topic_ids)
            for t in sorted(topics, key=lambda u: u.bytes)}


def _as_assignment(members: Mapping[str, MemberSubscription],
                   owner: Mapping[tuple[uuid.UUID, int], str]) -> dict[str, Assignment]:
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in members}
    for (t, p), m in owner.items():
        out[m].setdefault(t, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in out.items()}


def uniform(members: Mapping[str, MemberSubscription],
            topics: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
    subscribers = _subscribers(members, topics)
    counts = {m: 0 for m in members}
    owner: dict[tuple[uuid.UUID, int], str] = {}
    # stickiness: a member keeps what it has of topics it still subscribes to
    for m in sorted(members):
        spec = members[m]
        for t in sorted(spec.assigned, key=lambda u: u.bytes):
            if t not in topics or t not in spec.topic_ids:
                continue
            for p in sorted(spec.assigned[t]):
                if p < topics[t] and (t, p) not in owner:
                    owner[(t, p)] = m
                    counts[m] += 1
    partitions = [(t, p) for t, subs in subscribers.items() if subs for p in range(topics[t])]

    def least_loaded(t: uuid.UUID) -> str:
        return min(subscribers[t], key=lambda x: (counts[x], x))

    for tp in partitions:
        if tp not in owner:
            m = least_loaded(tp[0])
            owner[tp] = m
            counts[m] += 1
    # balance: the most loaded member gives a partition to the least loaded subscriber of its
    # topic while they differ by two or more; donors are always the most loaded, so no member
    # gives partitions away and then takes others (each move lowers the sum of squared
    # counts, so this ends)
    owned_by: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in members}
    for tp, m in owner.items():
        owned_by[m].add(tp)
    while True:
        move = None
        for donor in sorted(members, key=lambda x: (-counts[x], x)):
            for tp in sorted(owned_by[donor], key=lambda i: (i[0].bytes, i[1])):
                best = least_loaded(tp[0])
                if counts[donor] > counts[best] + 1:
                    move = (tp, donor, best)
                    break
            if move is not None:
                break
        if move is None:
            break
        tp, donor, best = move
        owner[tp] = best
        owned_by[donor].discard(tp)
        owned_by[best].add(tp)
        counts[donor] -= 1
        counts[best] += 1
    return _as_assignment(members, owner)


def range_(members: Mapping[str, MemberSubscription],
           topics: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
    owner: dict[tuple[uuid.UUID, int], str] = {}
    for t, subs in _subscribers(members, topics).items():
        if not subs:
            continue
        per_member, extra = divmod(topics[t], len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per_member + (1 if i < extra else 0)
            for p in range(start, start + n):
                owner[(t, p)] = m
            start += n
    return _as_assignment(members, owner)


ASSIGNORS: dict[str, Callable[[Mapping[str, MemberSubscription], Mapping[uuid.UUID, int]],
                              dict[str, Assignment]]] = {UNIFORM: uniform, RANGE: range_}
