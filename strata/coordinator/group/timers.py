"""The group coordinator's timers port: session and rebalance timeouts,
``group.initial.rebalance.delay.ms``, the pending-SyncGroup deadline and the offsets expiry task
all go through ``Timers``. ``LoopTimers`` uses the running loop's ``call_later``;
``ManualTimers`` is driven by tests (and a ``MockClock`` with it)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any, Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopTimers:
    """Timers on the running asyncio loop (the coordinator must be used from inside it)."""

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000.0, callback)


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Timers that fire only when ``advance`` moves time on (and a ``MockClock`` with it)."""

    def __init__(self, clock: Any = None):
        self._clock = clock
        self._now = 0.0
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        handle = _ManualHandle()
        heapq.heappush(self._heap, (self._now + max(delay_ms, 0), next(self._seq), handle, callback))
        return handle

    def _move_to(self, t: float) -> None:
        if self._clock is not None and t > self._now:
            self._clock.advance_ms(int(t) - int(self._now))
        self._now = max(self._now, t)

    def advance(self, ms: float) -> None:
        """Run every callback due within ``ms`` (including ones scheduled meanwhile), in order."""
        target = self._now + ms
        while self._heap and self._heap[0][0] <= target:
            due, _, handle, callback = heapq.heappop(self._heap)
            self._move_to(due)
            if not handle.cancelled:
                callback()
        self._move_to(target)

    def pending(self) -> int:
        return sum(1 for _, _, handle, _ in self._heap if not handle.cancelled)
