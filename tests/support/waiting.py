"""Waiting in tests: ``eventually`` for a condition to hold, ``never`` for one that must not.

Both poll ``check`` (no argument; a truthy result means the condition holds), first every
millisecond, backing off to every ``interval`` seconds. An exception from ``check`` fails the
wait at once unless its type is in ``ignoring`` (``eventually`` only: then it counts as "not
yet" and is reported if the deadline passes). A check may assert, with ``ignoring=AssertionError``,
to have its own message reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, TypeVar

T = TypeVar("T")

FIRST_PAUSE_S = 0.001


def _failure(what: str, timeout: float, last: object,
             report: Callable[[], str] | None) -> AssertionError:
    message = f"{what}: not within {timeout:g} s (last: {last!r})"
    if report is not None:
        message += report()
    return AssertionError(message)


def eventually(check: Callable[[], T], what: str, timeout: float = 10.0, interval: float = 0.05,
               ignoring: type[BaseException] | tuple[type[BaseException], ...] = (),
               report: Callable[[], str] | None = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], object] = time.sleep) -> T:
    """``check()``'s first truthy result; AssertionError naming ``what`` and the last result (or
    ignored exception) once ``timeout`` seconds passed, with ``report()`` appended."""
    deadline = clock() + timeout
    pause = min(FIRST_PAUSE_S, interval)
    while True:
        try:
            last = check()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        now = clock()
        if now >= deadline:
            raise _failure(what, timeout, last, report) from (
                last if isinstance(last, BaseException) else None)
        sleep(min(pause, deadline - now))
        pause = min(pause * 2, interval)


async def eventually_async(check: Callable[[], T], what: str, timeout: float = 10.0,
                           interval: float = 0.05,
                           ignoring: type[BaseException] | tuple[type[BaseException], ...] = (),
                           report: Callable[[], str] | None = None) -> T:
    """``eventually`` inside a running event loop: the loop runs while it waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = min(FIRST_PAUSE_S, interval)
    while True:
        try:
            last = check()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        now = loop.time()
        if now >= deadline:
            raise _failure(what, timeout, last, report) from (
                last if isinstance(last, BaseException) else None)
        await asyncio.sleep(min(pause, deadline - now))
        pause = min(pause * 2, interval)


def never(check: Callable[[], object], what: str, during: float, interval: float = 0.05,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], object] = time.sleep) -> None:
    """Polls ``check`` for ``during`` seconds (at the start and at the end too); AssertionError
    naming ``what`` and the result as soon as it is truthy."""
    start = clock()
    end = start + during
    pause = min(FIRST_PAUSE_S, interval)
    while True:
        value = check()
        if value:
            raise AssertionError(f"{what} (after {clock() - start:.2f} s: {value!r})")
        now = clock()
        if now >= end:
            return
        sleep(min(pause, end - now))
        pause = min(pause * 2, interval)
