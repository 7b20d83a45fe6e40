"""Exponential backoff with jitter for the remote log manager's tasks.

``remote.log.manager.task.retry.backoff.ms`` is the first delay, doubled after each consecutive
failure up to ``remote.log.manager.task.retry.backoff.max.ms``; each delay is spread by
±``remote.log.manager.task.retry.jitter`` so that partitions failing together do not retry in
lockstep. A success resets the sequence. (Kafka defines these configs but never uses them.)
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial_ms: int, max_ms: int, jitter: float,
                 rng: random.Random | None = None):
        self.initial_ms = max(0, initial_ms)
        self.max_ms = max(self.initial_ms, max_ms)
        self.jitter = min(max(jitter, 0.0), 1.0)
        self._rng = rng or random.Random()
        self.failures = 0

    def next_delay_ms(self) -> int:
        """Record one more failure; the delay before the next attempt."""
        base = min(self.max_ms, self.initial_ms * (2 ** min(self.failures, 62)))
        self.failures += 1
        if self.jitter:
            base *= 1 + self._rng.uniform(-self.jitter, self.jitter)
        return int(min(base, self.max_ms * (1 + self.jitter)))

    def reset(self) -> None:
        self.failures = 0
