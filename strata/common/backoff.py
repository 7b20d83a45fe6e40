"""``ExponentialBackoff``: retry delays that grow per consecutive failure, as Kafka's
``org.apache.kafka.common.utils.ExponentialBackoff`` computes them.

The delay before attempt ``n + 1`` after ``n`` failures is ``initial_ms * multiplier ** n``,
spread uniformly by ±``jitter`` so that peers failing together do not retry in lockstep, and
never above ``max_ms`` (the cap applies after the spread, as in Kafka).

Stateless: the caller counts its failures. Any thread may call ``backoff_ms``.
"""

from __future__ import annotations

import math
import random


class ExponentialBackoff:
    def __init__(self, initial_ms: int, max_ms: int, *, multiplier: float = 2.0,
                 jitter: float = 0.2, rng: random.Random | None = None):
        if initial_ms < 0 or max_ms < 0 or multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError(f"backoff {initial_ms} ms to {max_ms} ms, x{multiplier}, "
                             f"jitter {jitter}: out of range")
        self.initial_ms = initial_ms
        self.max_ms = max(initial_ms, max_ms)
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng or random.Random()
        # exponents stop at the first whose term reaches the cap
        self._max_exponent = 0 if multiplier == 1 or initial_ms == 0 or self.max_ms == initial_ms \
            else math.ceil(math.log(self.max_ms / initial_ms, multiplier))

    def backoff_ms(self, failures: int) -> int:
        """The delay before the next attempt after ``failures`` consecutive failures."""
        term = self.initial_ms * self.multiplier ** min(max(failures, 0), self._max_exponent)
        if self.jitter:
            term *= self._rng.uniform(1 - self.jitter, 1 + self.jitter)
        return int(min(term, self.max_ms))
