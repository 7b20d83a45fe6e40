"""The stall watchdog: a section or an event loop stuck past the threshold is reported once,
with every thread's stack, and its end is reported too."""

import asyncio
import logging
import threading

from strata.common.watchdog import StallWatchdog
from support.waiting import eventually


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_section_open_past_the_threshold_is_reported_once_with_every_stack_then_its_end(caplog):
    clock = FakeClock()
    dog = StallWatchdog(threshold_s=5, clock=clock)
    caplog.set_level(logging.WARNING, "strata.common.watchdog")
    with dog.section("applying a metadata image"):
        clock.now += 4.9
        assert dog.check() == []
        clock.now += 0.2
        assert dog.check() == ["applying a metadata image"]
        assert dog.check() == []          # once per stall
        clock.now += 3
    stalled, over = [r.getMessage() for r in caplog.records]
    assert "applying a metadata image (MainThread) for 5.1 s" in stalled
    assert "Thread MainThread" in stalled and "test_a_section_open_past" in stalled
    assert over == "stall over: applying a metadata image (MainThread) ended after 8.1 s"


def test_a_section_that_ends_in_time_is_never_reported(caplog):
    clock = FakeClock()
    dog = StallWatchdog(threshold_s=5, clock=clock)
    with dog.section("quick"):
        clock.now += 1
    clock.now += 10
    assert dog.check() == []
    assert not caplog.records


def test_a_blocked_event_loop_is_reported_with_the_stack_that_blocks_it(caplog):
    caplog.set_level(logging.WARNING, "strata.common.watchdog")
    loop = asyncio.new_event_loop()
    held = threading.Lock()
    held.acquire()
    dog = StallWatchdog(threshold_s=0.3)

    def blocked_on_a_lock():
        held.acquire()   # as a deadlocked callback would

    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        dog.watch_loop(loop)
        dog.start()
        loop.call_soon_threadsafe(blocked_on_a_lock)
        report = eventually(lambda: next((r.getMessage() for r in caplog.records
                                          if "stalled" in r.getMessage()), None),
                            "a stall report", 30)
        assert "the event loop (event loop)" in report and "blocked_on_a_lock" in report
        held.release()
        eventually(lambda: any("stall over: the event loop" in r.getMessage()
                               for r in caplog.records), "the end of the stall reported", 30)
    finally:
        if held.locked():
            held.release()
        dog.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_a_loop_that_ran_its_heartbeat_is_never_reported_however_late_it_is_checked(caplog):
    clock = FakeClock()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    dog = StallWatchdog(threshold_s=5, clock=clock)
    try:
        dog.watch_loop(loop)
        dog._heartbeats()
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)   # it ran since
        clock.now += 60
        assert dog.check() == []
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        dog._heartbeats()   # the next one, unanswered: the loop runs no more
        clock.now += 6
        assert dog.check() == ["the event loop"]
        dog.close()   # the loop's last heartbeat is forgotten with it
        clock.now += 60
        assert dog.check() == []
        loop.run_until_complete(asyncio.sleep(0))   # it runs at last: nothing to end, no error
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        if runner.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            runner.join()
        loop.close()
