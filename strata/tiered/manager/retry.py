"""Exponential backoff with jitter for the remote log manager's tasks.

``remote.log.manager.task.retry.backoff.ms`` is the first delay, doubled after each consecutive
failure up to ``remote.log.manager.task.retry.backoff.max.ms``; each delay is spread by
±``remote.log.manager.task.retry.jitter`` so that partitions failing together do not retry in
lockstep (never above the maximum, as Kafka caps it). A success resets the sequence. (Kafka
defines these configs but never uses them.)
"""

from __future__ import annotations

import random

from strata.common.backoff import ExponentialBackoff


class Backoff:
    """The consecutive failures of one task, over ``common.backoff.ExponentialBackoff``."""

    def __init__(self, initial_ms: int, max_ms: int, jitter: float,
                 rng: random.Random | None = None):
        initial_ms = max(0, initial_ms)
        self._delays = ExponentialBackoff(initial_ms, max(initial_ms, max_ms),
                                          jitter=min(max(jitter, 0.0), 0.99), rng=rng)
        self.failures = 0

    def next_delay_ms(self) -> int:
        """Record one more failure; the delay before the next attempt."""
        delay = self._delays.backoff_ms(self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
