"""Background work for the log layer (async flush on roll, delayed file deletion, periodic tasks).

``KafkaScheduler`` runs tasks on daemon threads; ``ImmediateScheduler`` runs them inline, for tests.
``BackgroundThread`` is one lazily started thread for best-effort hints (prefetches).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
from typing import Callable, Protocol

from strata.common.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


class Scheduler(Protocol):
    def schedule_once(self, name: str, fn: Callable[[], None], delay_ms: int = 0) -> None: ...


class ImmediateScheduler:
    """Runs every task at once on the caller's thread, delay or not."""

    def schedule_once(self, name: str, fn: Callable[[], None], delay_ms: int = 0) -> None:
        fn()


class KafkaScheduler:
    """A timer heap served by ``threads`` worker threads; tasks that raise are logged, not fatal."""

    def __init__(self, threads: int = 1, name: str = "strata-scheduler", clock: Clock = SYSTEM_CLOCK):
        self._clock = clock
        self._heap: list[tuple[int, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._running = True
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def schedule_once(self, name: str, fn: Callable[[], None], delay_ms: int = 0) -> None:
        due = self._clock.nanoseconds() + delay_ms * 1_000_000
        with self._cv:
            if not self._running:
                return
            heapq.heappush(self._heap, (due, next(self._seq), name, fn))
            self._cv.notify()

    def schedule_periodic(self, name: str, fn: Callable[[], None], period_ms: int,
                          delay_ms: int | None = None) -> None:
        """Run ``fn`` every ``period_ms`` (first after ``delay_ms``, default one period)."""
        def run() -> None:
            try:
                fn()
            finally:
                self.schedule_once(name, run, period_ms)
        self.schedule_once(name, run, period_ms if delay_ms is None else delay_ms)

    def _work(self) -> None:
        while True:
            with self._cv:
                while self._running:
                    if self._heap:
                        wait = (self._heap[0][0] - self._clock.nanoseconds()) / 1e9
                        if wait <= 0:
                            break
                        self._cv.wait(min(wait, 0.5))
                    else:
                        self._cv.wait()
                if not self._running:
                    return
                _, _, name, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a background task must not kill its thread
                log.exception("scheduled task %s failed", name)

    def shutdown(self, run_pending: bool = True) -> None:
        """Stop the workers; with ``run_pending`` the queued tasks run first on this thread."""
        with self._cv:
            self._running = False
            pending = sorted(self._heap) if run_pending else []
            self._heap.clear()
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        for _, _, name, fn in pending:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("scheduled task %s failed at shutdown", name)


class BackgroundThread:
    """One worker thread, started on first use, for best-effort work such as prefetches:
    ``submit`` never blocks and never raises, work that raises is logged at debug level (a
    hint's failure is the later read's to report), and ``close`` cancels what has not started
    and waits for what has. A ``submit`` after ``close`` starts a new thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., object], *args: object) -> bool:
        """Queue ``fn(*args)``; False when the thread was shut down meanwhile."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=self._name)
            pool = self._pool
        try:
            pool.submit(self._run, fn, args)
        except RuntimeError:        # closed meanwhile
            return False
        return True

    def _run(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        try:
            fn(*args)
        except Exception as e:      # noqa: BLE001
            log.debug("%s: %s%r failed: %s", self._name, getattr(fn, "__name__", fn), args, e)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
