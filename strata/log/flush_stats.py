"""Kafka's ``LogFlushStats``: one timer of every log flush in this process (the
``kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs`` timer), as a count and a total time;
the metrics endpoint exports both (rates and averages are Prometheus's to compute)."""

from __future__ import annotations

import threading
import time


class LogFlushStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()   # flushes run on the scheduler's threads and the loop
        self.count = 0
        self.total_ns = 0

    def add(self, started_ns: int) -> None:
        """A flush that began at ``started_ns`` (``time.monotonic_ns()``) has ended."""
        elapsed = time.monotonic_ns() - started_ns
        with self._lock:
            self.count += 1
            self.total_ns += elapsed

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.count, self.total_ns


LOG_FLUSH_STATS = LogFlushStats()
