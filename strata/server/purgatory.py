"""Delayed operations: requests that wait for data or a deadline (Kafka's purgatories).

``PartitionWatchers`` wakes every waiter watching a partition when that partition changes
(an append, or its high watermark moving), so a long-polling Fetch answers as soon as data
arrives instead of at its deadline, and an acks=all append as soon as it is replicated
(``await_replication``, Kafka's DelayedProduce). Waiting is event-loop only.

Changes made by other threads (a high watermark that an ISR shrink on the scheduler's thread
moves, a replica manager used without the loop) reach the loop through ``notifier``, which
crosses threads only when someone waits on the partition: a wake-up of the loop costs the
changing thread a GIL hand-off. Replica fetchers append on the loop and wake waiters directly.
A waiter that registers just after such a change still sees it: a
caller takes ``mark()`` before it checks its condition, and ``wait_any`` returns at once if a
partition changed after the mark.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import Callable

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.server.broker_metrics import REMOTE_WAIT_NS


class PartitionWatchers:
    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future]] = defaultdict(set)
        self._closed = False
        self._clock = 0   # counts changes made off the loop; _changed: each one's last
        self._changed: dict[TopicPartition, int] = {}
        self._clock_lock = threading.Lock()
        # Kafka's DelayedOperationPurgatory gauges by operation (Produce, Fetch): waiting
        # requests (NumDelayedOperations) and their partition watches (PurgatorySize)
        self.delayed: dict[str, int] = {"Produce": 0, "Fetch": 0}
        self.watches: dict[str, int] = {"Produce": 0, "Fetch": 0}

    def mark(self) -> int:
        """Taken before checking what to wait for; ``wait_any(..., since=mark)``."""
        return self._clock

    async def wait_any(self, partitions: list[TopicPartition], timeout_s: float,
                       since: int, kind: str = "Fetch") -> bool:
        """Wait until one of ``partitions`` changes or the timeout passes; True if woken, or
        at once if another thread changed one after ``since`` (the ``mark()`` taken before
        the caller checked its condition). ``kind``: the purgatory it counts in (Produce,
        Fetch); the time waited adds to the request's RemoteTimeMs."""
        if timeout_s <= 0 or self._closed:
            return False
        fut = asyncio.get_running_loop().create_future()
        for tp in partitions:
            self._waiters[tp].add(fut)
        self.delayed[kind] += 1
        self.watches[kind] += len(partitions)
        started = time.monotonic_ns()
        try:
            if since != self._clock and any(
                    self._changed.get(tp, 0) > since for tp in partitions):
                return True
            await asyncio.wait_for(fut, timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.delayed[kind] -= 1
            self.watches[kind] -= len(partitions)
            remote = REMOTE_WAIT_NS.get()
            if remote is not None:
                remote[0] += time.monotonic_ns() - started
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

    def notifier(self, loop: asyncio.AbstractEventLoop) -> Callable[[TopicPartition], None]:
        """``notify`` callable from ``loop``'s thread or any other."""
        loop_thread = threading.get_ident()

        def call(tp: TopicPartition) -> None:
            if threading.get_ident() == loop_thread:
                self.notify(tp)
                return
            with self._clock_lock:
                self._clock += 1
                self._changed[tp] = self._clock
            if tp in self._waiters:   # registered before the change: woken by the loop
                loop.call_soon_threadsafe(self.notify, tp)
        return call

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


async def await_replication(replica_manager, watchers: PartitionWatchers, waits: dict,
                            timeout_s: float) -> dict:
    """acks=all: ``waits`` maps a key to (partition, offset the high watermark must reach);
    waits until each is done (``ReplicaManager.enough_replicas_reached``) or ``timeout_s``
    (REQUEST_TIMED_OUT). The error per key."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    waits = dict(waits)
    errors = {}
    while True:
        since = watchers.mark()
        for key, (tp, required) in list(waits.items()):
            done, error = replica_manager.enough_replicas_reached(tp, required)
            if done:
                errors[key] = error
                del waits[key]
        left = deadline - loop.time()
        if not waits or left <= 0 or watchers.closed:
            break
        await watchers.wait_any([tp for tp, _ in waits.values()], left, since, kind="Produce")
    errors.update({key: ErrorCode.REQUEST_TIMED_OUT for key in waits})
    return errors
