"""Rates over time: Kafka's sampled statistics and a blocking token bucket.

- ``SampledRate``: Kafka's ``SimpleRate`` over a ``SampledStat`` (``org.apache.kafka.common.
  metrics.stats``): values are summed into ``samples`` windows of ``window_ms`` each; the rate
  is the sum of the live windows divided by the time since the oldest live window began (at
  least one window). A window older than ``samples × window_ms`` is dropped. This is what
  Kafka's quota sensors measure (KIP-956's remote copy/fetch quotas among them).
- ``Rate``: Kafka's ``Rate``, as the client quota sensors measure: the same windows, with
  the not yet elapsed ones of the first ``samples − 1`` counted as elapsed.
- ``SampledAvgMax``: Kafka's ``Avg`` and ``Max`` over the same kind of windows (default 2 of
  30 s, Kafka's default ``MetricConfig``); NaN when nothing was recorded in the live windows.
- ``throttle_time_ms``: Kafka's ``QuotaUtils.throttleTime``: how long, at the bound, the
  measured excess takes to drain over the rate's current window.
- ``TokenBucket``: a byte-rate limiter for blocking callers: ``acquire(n)`` reserves ``n``
  tokens (the balance may go negative) and sleeps until the reservation is paid for, so over
  any interval the bytes let through are at most ``burst + rate × interval``.

Time is injected (milliseconds for the Kafka stats, a ``now()`` in seconds and a ``sleep`` for
the bucket), so the math is testable without sleeping. Every class is thread-safe.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.config import LONG_MAX

log = logging.getLogger(__name__)

__all__ = ["ByteRateQuota", "Rate", "SampledAvgMax", "SampledRate", "TokenBucket", "throttle_time_ms"]


class _Sample:
    __slots__ = ("start_ms", "value", "events")

    def __init__(self, start_ms: int, initial: float) -> None:
        self.start_ms = start_ms
        self.value = initial
        self.events = 0

    def reset(self, now_ms: int, initial: float) -> None:
        self.start_ms = now_ms
        self.value = initial
        self.events = 0


class _SampledStat:
    """Kafka's ``SampledStat``: a ring of at most ``samples`` windows of ``window_ms``."""

    initial = 0.0

    def __init__(self, samples: int, window_ms: int) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError(f"need samples >= 1 and window_ms >= 1, got {samples}, {window_ms}")
        self.samples = samples
        self.window_ms = window_ms
        self._ring: list[_Sample] = []
        self._current = 0
        self._lock = threading.Lock()

    def _update(self, sample: _Sample, value: float) -> None:
        raise NotImplementedError

    def record(self, value: float, now_ms: int) -> None:
        with self._lock:
            if not self._ring:
                self._ring.append(_Sample(now_ms, self.initial))
            sample = self._ring[self._current]
            if now_ms - sample.start_ms >= self.window_ms:   # complete: advance
                self._current = (self._current + 1) % self.samples
                if self._current >= len(self._ring):
                    sample = _Sample(now_ms, self.initial)
                    self._ring.append(sample)
                else:
                    sample = self._ring[self._current]
                    sample.reset(now_ms, self.initial)
            self._update(sample, value)
            sample.events += 1

    def _purge(self, now_ms: int) -> None:
        """Reset the windows that began ``samples × window_ms`` or more ago (lock held)."""
        expire_age = self.samples * self.window_ms
        for sample in self._ring:
            if now_ms - sample.start_ms >= expire_age:
                sample.reset(now_ms, self.initial)

    def _oldest_start(self, now_ms: int) -> int:
        return min((s.start_ms for s in self._ring), default=now_ms)


class SampledRate(_SampledStat):
    """Kafka's ``SimpleRate`` (a ``Rate`` of a ``SampledTotal``), per second."""

    def _update(self, sample: _Sample, value: float) -> None:
        sample.value += value

    def _window(self, now_ms: int) -> int:
        """Since the oldest live window began, at least one window (``SimpleRate``; lock held)."""
        return max(now_ms - self._oldest_start(now_ms), self.window_ms)

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate divides by (purging expired windows first)."""
        with self._lock:
            self._purge(now_ms)
            return self._window(now_ms)

    def total(self, now_ms: int) -> float:
        """The sum of the live windows."""
        with self._lock:
            self._purge(now_ms)
            return sum(s.value for s in self._ring)

    def measure(self, now_ms: int) -> float:
        """Units per second over the live windows."""
        with self._lock:
            self._purge(now_ms)
            total = sum(s.value for s in self._ring)
            window = self._window(now_ms)
        return total / (window / 1000.0)


class Rate(SampledRate):
    """Kafka's ``Rate`` (what client quota sensors measure): as ``SampledRate``, but until
    ``samples − 1`` full windows have passed the missing ones count as elapsed, so a new
    sensor divides by about ``(samples − 1) × window`` and admits that much burst."""

    def _window(self, now_ms: int) -> int:
        elapsed = now_ms - self._oldest_start(now_ms)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)


class SampledAvgMax:
    """Kafka's ``Avg`` and ``Max`` stats of one sensor (NaN with nothing recorded)."""

    def __init__(self, samples: int = 2, window_ms: int = 30_000) -> None:
        self._sum = _SumStat(samples, window_ms)
        self._max = _MaxStat(samples, window_ms)

    def record(self, value: float, now_ms: int) -> None:
        self._sum.record(value, now_ms)
        self._max.record(value, now_ms)

    def avg(self, now_ms: int) -> float:
        return self._sum.combine(now_ms, lambda total, _max, n: total / n)

    def max(self, now_ms: int) -> float:
        return self._max.combine(now_ms, lambda _total, biggest, n: biggest)


class _SumStat(_SampledStat):
    def _update(self, sample: _Sample, value: float) -> None:
        sample.value += value

    def combine(self, now_ms: int, fn: Callable[[float, float, int], float]) -> float:
        with self._lock:
            self._purge(now_ms)
            events = sum(s.events for s in self._ring)
            total = sum(s.value for s in self._ring)
        return math.nan if events == 0 else fn(total, math.nan, events)


class _MaxStat(_SampledStat):
    initial = -math.inf

    def _update(self, sample: _Sample, value: float) -> None:
        sample.value = max(sample.value, value)

    def combine(self, now_ms: int, fn: Callable[[float, float, int], float]) -> float:
        with self._lock:
            self._purge(now_ms)
            events = sum(s.events for s in self._ring)
            biggest = max((s.value for s in self._ring), default=-math.inf)
        return math.nan if events == 0 else fn(math.nan, biggest, events)


def throttle_time_ms(value: float, bound: float, window_ms: int) -> int:
    """Kafka's ``QuotaUtils.throttleTime``: ``(value − bound) / bound × window``, rounded;
    0 when the value is within the bound."""
    if value <= bound or bound <= 0:
        return 0
    return int(math.floor((value - bound) / bound * window_ms + 0.5))


class TokenBucket:
    """Blocks callers so that at most ``rate`` units per second pass, after a ``burst``.

    ``acquire(n)`` takes ``n`` tokens at once, letting the balance go negative, then sleeps
    until the balance would be back at zero: a request larger than the burst passes (after
    its wait) instead of blocking forever, and concurrent callers queue in reservation order.
    The bucket starts full. ``now`` (seconds, monotonic) and ``sleep`` are injectable.
    """

    def __init__(self, rate: float, burst: float | None = None, *,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self._rate = float(rate)
        self._burst = float(rate if burst is None else burst)
        if self._burst < 0:
            raise ValueError(f"burst must be >= 0, got {burst}")
        self._now = now
        self._sleep = sleep
        self._tokens = self._burst
        self._last = now()
        self._lock = threading.Lock()
        self.waited_s = 0.0     # total time callers were made to sleep

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    def _refill(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
            self._last = now

    def reserve(self, n: float) -> float:
        """Take ``n`` tokens now; the seconds the caller must wait before using them."""
        if n <= 0:
            return 0.0
        with self._lock:
            self._refill(self._now())
            self._tokens -= n
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
            self.waited_s += wait
        return wait

    def acquire(self, n: float, cancelled: Callable[[], bool] | None = None,
                slice_s: float = 0.5) -> float:
        """Take ``n`` tokens, sleeping as long as the reservation needs; the time slept.

        With ``cancelled``, the sleep is cut in slices of at most ``slice_s`` seconds and
        ``InterruptedError`` is raised as soon as ``cancelled()`` is true (shutdown)."""
        wait = self.reserve(n)
        if wait <= 0:
            return 0.0
        if cancelled is None:
            self._sleep(wait)
            return wait
        left = wait
        while left > 0:
            if cancelled():
                raise InterruptedError("token bucket wait cancelled")
            step = min(left, slice_s)
            self._sleep(step)
            left -= step
        return wait


class ByteRateQuota:
    """A byte-rate upper bound over a sampled rate: Kafka's ``RLMQuotaManager`` and
    ``ReplicationQuotaManager`` (``window_num`` windows of ``window_size_seconds``)."""

    def __init__(self, bytes_per_second: int = LONG_MAX, window_num: int = 11,
                 window_size_seconds: int = 1, *, clock: Clock = SYSTEM_CLOCK,
                 description: str = "") -> None:
        self._check(bytes_per_second)
        self._bound = int(bytes_per_second)
        self._rate = SampledRate(window_num, window_size_seconds * 1000)
        self._clock = clock
        self.description = description

    @staticmethod
    def _check(bytes_per_second: int) -> None:
        if int(bytes_per_second) < 1:
            raise ValueError(f"a quota must be at least 1 byte per second, got {bytes_per_second}")

    @property
    def quota_bytes_per_second(self) -> int:
        return self._bound

    @property
    def unlimited(self) -> bool:
        return self._bound >= LONG_MAX

    def update_quota(self, bytes_per_second: int) -> None:
        """A new bound, effective at the next check; the recorded samples stay."""
        self._check(bytes_per_second)
        if int(bytes_per_second) != self._bound:
            log.info("%s: quota now %d bytes per second", self.description or "quota",
                     bytes_per_second)
        self._bound = int(bytes_per_second)

    def record(self, value: float) -> None:
        self._rate.record(value, self._clock.milliseconds())

    def rate(self) -> float:
        """The measured byte rate (Kafka's ``byte-rate`` metric of the quota sensor)."""
        return self._rate.measure(self._clock.milliseconds())

    def throttle_time_ms(self) -> int:
        """0 within the quota, else Kafka's throttle time for the measured excess."""
        now = self._clock.milliseconds()
        value = self._rate.measure(now)
        if value <= self._bound:
            return 0
        return throttle_time_ms(value, self._bound, self._rate.window_size_ms(now))

    def is_quota_exceeded(self) -> bool:
        """The measured rate is above the bound (the throttle time may still round to 0)."""
        return self.rate() > self._bound
