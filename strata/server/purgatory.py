"""Delayed operations: requests that wait for data or a deadline (Kafka's purgatories).

``PartitionWatchers`` wakes every waiter watching a partition when that partition changes
(an append), so a long-polling Fetch answers as soon as data arrives instead of at its deadline.
Event-loop only.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from strata.common.types import TopicPartition


class PartitionWatchers:
    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future]] = defaultdict(set)
        self._closed = False

    async def wait_any(self, partitions: list[TopicPartition], timeout_s: float) -> bool:
        """Wait until one of ``partitions`` changes or the timeout passes; True if woken."""
        if timeout_s <= 0 or self._closed:
            return False
        fut = asyncio.get_running_loop().create_future()
        for tp in partitions:
            self._waiters[tp].add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            for tp in partitions:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        for fut in self._waiters.get(tp, ()):
            if not fut.done():
                fut.set_result(None)

    def notify_topic(self, topic: str) -> None:
        """Wake waiters on every partition of ``topic`` (it was deleted: they answer now)."""
        for tp in [tp for tp in self._waiters if tp.topic == topic]:
            self.notify(tp)

    def close(self) -> None:
        """Shutdown: wake every waiter now and answer later waits at once."""
        self._closed = True
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        return len({f for s in self._waiters.values() for f in s})
