"""The group coordinator's cost of a KIP-848 rebalance (issue 47), in process: no network, no
clients, only what the coordinator computes and writes.

    python -m benchmarks.consumer_group_rebalance [--members 50] [--partitions 500]
        [--rounds 5] [--json FILE]

``--members`` simulated members join a consumer group subscribed to one topic of
``--partitions`` partitions and heartbeat until the group is Stable. Then, per round, one more
member joins (and later leaves), and every member heartbeats, each reporting what its last
response gave it, until the group is Stable again. Measured per rebalance: the heartbeats it
took, the coordinator's CPU time for them (``time.process_time``), the records appended to
``__consumer_offsets``, and the partitions that moved. The time a real rebalance takes is
dominated by the members' heartbeat interval and their revocation callbacks, which this does
not measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from types import SimpleNamespace

from strata.common.clock import MockClock
from strata.coordinator.group import (
    ConsumerGroupHeartbeatRequest, GroupCoordinator, GroupCoordinatorConfig, ManualTimers)

GROUP = "bench"
TOPIC_ID = uuid.UUID(int=1)


class _Log:
    def __init__(self) -> None:
        self.records = 0

    async def append(self, partition, records, **_):
        self.records += len(records)

    def replay(self, partition):
        return []


class _Member:
    def __init__(self, member_id: str):
        self.member_id = member_id
        self.epoch = 0
        self.owned: dict = {}


async def _heartbeat(coord, m: _Member, joining: bool = False) -> None:
    owned = tuple((t, tuple(sorted(ps))) for t, ps in m.owned.items())
    r = await coord.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
        GROUP, m.member_id, 0 if joining else m.epoch,
        rebalance_timeout_ms=300_000 if joining else -1,
        subscribed_topic_names=("t",) if joining else None, owned=() if joining else owned))
    assert r.error == 0, r
    m.epoch = r.member_epoch
    if r.assignment is not None:
        m.owned = {t: ps for t, ps in r.assignment.items() if ps}


async def _settle(coord, members: list[_Member]) -> int:
    """Heartbeat every member in turn until the group is Stable; the heartbeats it took."""
    beats = 0
    while coord.consumer_group(GROUP).state != "Stable":
        for m in members:
            await _heartbeat(coord, m)
            beats += 1
        if beats > 100 * len(members):
            raise RuntimeError("the group did not settle")
    return beats


def _owners(members: list[_Member]) -> dict:
    return {(t, p): m.member_id for m in members for t, ps in m.owned.items() for p in ps}


async def _run(members: int, partitions: int, rounds: int) -> list[dict]:
    clock = MockClock()
    log = _Log()
    image = {"t": SimpleNamespace(name="t", topic_id=TOPIC_ID, partitions=partitions,
                                  internal=False)}
    coord = GroupCoordinator(log, GroupCoordinatorConfig(), clock=clock,
                             timers=ManualTimers(clock), topics=lambda: image)
    coord.load()
    group = [_Member(f"m-{i}") for i in range(members)]
    for m in group:
        await _heartbeat(coord, m, joining=True)
    await _settle(coord, group)
    results = []
    for n in range(rounds):
        for event in ("join", "leave"):
            before = _owners(group)
            records = log.records
            started = time.process_time()
            if event == "join":
                extra = _Member(f"extra-{n}")
                group.append(extra)
                await _heartbeat(coord, extra, joining=True)
            else:
                leaving = group.pop()
                r = await coord.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
                    GROUP, leaving.member_id, -1))
                assert r.error == 0
            beats = await _settle(coord, group) + 1
            cpu = time.process_time() - started
            after = _owners(group)
            moved = sum(1 for tp, owner in after.items() if before.get(tp) != owner)
            results.append({"round": n, "event": event, "heartbeats": beats,
                            "cpu_ms": round(cpu * 1000, 2),
                            "cpu_us_per_heartbeat": round(cpu * 1e6 / beats, 1),
                            "records": log.records - records, "partitions_moved": moved})
    coord.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = asyncio.run(_run(args.members, args.partitions, args.rounds))
    for r in results:
        print(f"round {r['round']} {r['event']:5}: {r['heartbeats']:4d} heartbeats, "
              f"{r['cpu_ms']:8.2f} ms CPU ({r['cpu_us_per_heartbeat']:7.1f} us/heartbeat), "
              f"{r['records']:4d} records, {r['partitions_moved']:3d} partitions moved")
    for event in ("join", "leave"):
        cpu = [r["cpu_ms"] for r in results if r["event"] == event]
        print(f"{event}: median {statistics.median(cpu):.2f} ms CPU per rebalance")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"members": args.members, "partitions": args.partitions,
                       "rounds": results}, f, indent=2)


if __name__ == "__main__":
    main()
