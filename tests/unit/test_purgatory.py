"""PartitionWatchers: waking waiters on a partition from the loop's thread and from others."""

import asyncio
import threading

from strata.common.types import TopicPartition
from strata.server.purgatory import PartitionWatchers

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def _from_thread(fn, *args) -> None:
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


class _CountingLoop:
    """Wraps a loop to count the wake-ups other threads ask of it."""

    def __init__(self, loop):
        self.loop, self.wakeups = loop, 0

    def call_soon_threadsafe(self, *args):
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(*args)


def test_a_change_on_another_thread_wakes_a_waiter_registered_before_it():
    async def main():
        w = PartitionWatchers()
        counting = _CountingLoop(asyncio.get_running_loop())
        notify = w.notifier(counting)
        waiter = asyncio.ensure_future(w.wait_any([TP], 30, w.mark()))
        await asyncio.sleep(0)   # registered
        _from_thread(notify, TP)
        assert await asyncio.wait_for(waiter, 10) is True
        assert counting.wakeups == 1
    asyncio.run(main())


def test_a_change_on_another_thread_with_no_waiter_does_not_wake_the_loop():
    async def main():
        w = PartitionWatchers()
        counting = _CountingLoop(asyncio.get_running_loop())
        _from_thread(w.notifier(counting), TP)
        assert counting.wakeups == 0
    asyncio.run(main())


def test_a_waiter_that_registers_after_a_change_it_did_not_see_returns_at_once():
    # the check-then-wait race: the change lands after the caller's mark and check but before
    # it registers, so no wake-up is sent; the wait must not last until its timeout
    async def main():
        w = PartitionWatchers()
        notify = w.notifier(_CountingLoop(asyncio.get_running_loop()))
        since = w.mark()
        _from_thread(notify, TP)
        assert await w.wait_any([TP], 30, since) is True
    asyncio.run(main())


def test_a_change_before_the_mark_or_to_another_partition_does_not_end_the_wait():
    async def main():
        w = PartitionWatchers()
        notify = w.notifier(_CountingLoop(asyncio.get_running_loop()))
        _from_thread(notify, TP)
        since = w.mark()
        _from_thread(notify, OTHER)
        assert await w.wait_any([TP], 0.05, since) is False
    asyncio.run(main())


def test_a_change_on_the_loops_thread_wakes_waiters_directly():
    async def main():
        w = PartitionWatchers()
        counting = _CountingLoop(asyncio.get_running_loop())
        notify = w.notifier(counting)
        waiter = asyncio.ensure_future(w.wait_any([TP, OTHER], 30, w.mark()))
        await asyncio.sleep(0)
        notify(OTHER)
        assert await asyncio.wait_for(waiter, 10) is True
        assert counting.wakeups == 0
    asyncio.run(main())
