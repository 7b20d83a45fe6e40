"""Injected time, so retention, roll and backoff logic is testable without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def milliseconds(self) -> int: ...
    def nanoseconds(self) -> int: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock milliseconds (for timestamps) and monotonic nanoseconds (for intervals)."""

    def milliseconds(self) -> int:
        return time.time_ns() // 1_000_000

    def nanoseconds(self) -> int:
        return time.monotonic_ns()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class MockClock:
    """A clock that moves only when told to; ``sleep`` advances it."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self._ns = start_ms * 1_000_000

    def milliseconds(self) -> int:
        return self._ns // 1_000_000

    def nanoseconds(self) -> int:
        return self._ns

    def sleep(self, seconds: float) -> None:
        self.advance_ms(int(seconds * 1000))

    def advance_ms(self, ms: int) -> None:
        self._ns += ms * 1_000_000


SYSTEM_CLOCK = SystemClock()
