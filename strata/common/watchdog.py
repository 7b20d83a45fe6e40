"""Stall detection: a broker whose event loop, or a thread's watched section, makes no progress
for ``threshold_s`` logs every thread's stack once, with what stalled and for how long, and logs
again when it moves on. A hung broker then explains itself in its own log (a deadlock names both
holders), instead of leaving only a client-side timeout.

``STALLS`` is the process's watchdog; ``STALLS.section(name)`` costs a dict insert and removal,
whether or not the watchdog thread runs (the broker starts it)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD_S = 5.0


def thread_stacks() -> str:
    """Every thread's stack, named, innermost call last (faulthandler's dump, as text)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n"
                     + "".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)


class StallWatchdog:
    def __init__(self, threshold_s: float = DEFAULT_THRESHOLD_S, clock=time.monotonic):
        self.threshold_s = threshold_s
        self._clock = clock
        self._ids = itertools.count()
        self._lock = threading.Lock()
        # id -> (what, thread name, start); entered sections, and the loop's pending heartbeat
        self._open: dict[int, tuple[str, str, float]] = {}
        self._reported: set[int] = set()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._heartbeat: dict[int, int] = {}   # id(loop) -> its last heartbeat's entry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def section(self, what: str) -> Iterator[None]:
        """Watches the code inside: a stall report when it runs longer than the threshold."""
        key = self._enter(what, threading.current_thread().name)
        try:
            yield
        finally:
            self._exit(key)

    def watch_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop must run a callback posted to it within the threshold."""
        self._loops.append(loop)

    def start(self) -> "StallWatchdog":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._stop = threading.Event()
        self._loops.clear()
        with self._lock:   # a stopped loop never runs its last one: no report of it later
            for key in self._heartbeat.values():
                self._open.pop(key, None)
                self._reported.discard(key)
        self._heartbeat.clear()

    def _enter(self, what: str, thread: str) -> int:
        key = next(self._ids)
        with self._lock:
            self._open[key] = (what, thread, self._clock())
        return key

    def _exit(self, key: int) -> None:
        with self._lock:
            entry = self._open.pop(key, None)   # None: a heartbeat that close() forgot
            reported = key in self._reported
            self._reported.discard(key)
        if entry is not None and reported:
            what, thread, start = entry
            log.warning("stall over: %s (%s) ended after %.1f s", what, thread,
                        self._clock() - start)

    def _heartbeats(self) -> None:
        """Posts to each loop a callback that ends an open entry, unless the last one is open."""
        for loop in list(self._loops):
            with self._lock:
                if self._heartbeat.get(id(loop)) in self._open:
                    continue
            key = self._heartbeat[id(loop)] = self._enter("the event loop", "event loop")
            try:
                loop.call_soon_threadsafe(self._exit, key)
            except RuntimeError:   # closed: nothing to watch any more
                self._exit(key)
                self._loops.remove(loop)

    def check(self) -> list[str]:
        """Logs the entries open longer than the threshold (each once, with every stack);
        returns what it reported."""
        now = self._clock()
        with self._lock:
            late = [(k, what, thread, start) for k, (what, thread, start) in self._open.items()
                    if now - start >= self.threshold_s and k not in self._reported]
            self._reported.update(k for k, *_ in late)
        if late:
            log.warning("stalled: %s; every thread's stack:\n%s",
                        "; ".join(f"{what} ({thread}) for {now - start:.1f} s"
                                  for _, what, thread, start in late), thread_stacks())
        return [what for _, what, _, _ in late]

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.threshold_s / 4)):
            try:
                self._heartbeats()
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must not end
                log.exception("stall check failed")


STALLS = StallWatchdog()
