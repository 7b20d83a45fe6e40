"""KIP-956 quotas of the remote log manager: the copy and fetch byte-rate bounds.

``RLMQuotaManager`` is Kafka's class of that name: a byte-rate sensor (``SampledRate``:
``window_num`` windows of ``window_size_seconds``) with an upper bound; the quota is exceeded
when the measured rate is above the bound, and ``throttle_time_ms`` says how long the excess
takes to drain (Kafka's ``getThrottleTimeMs``). ``update_quota`` changes the bound live (the
dynamic ``remote.log.manager.{copy,fetch}.max.bytes.per.second``), keeping what was recorded.

``RemoteLogQuotas`` bundles what the remote log manager needs, as Kafka's RemoteLogManager
has it:

- the copy quota, with the copier's admission loop (``acquire_copy``, RLMCopyTask's): under
  one lock, while the copy quota is exceeded, record the throttle time and wait on a
  condition (up to ``quota_timeout_ms``, 1 s as Kafka's ``quotaTimeout``, or less when the
  throttle time is shorter), re-check; then record the segment's bytes and wake the other
  waiting copiers. Shutdown (or the caller's ``stop``) interrupts the wait;
- the fetch quota, checked before a Fetch starts remote reads (``fetch_throttle_time_ms``)
  and fed with the bytes each remote read returned (``record_fetch``);
- the throttle-time sensors behind Kafka's ``kafka.server:type=RemoteLogManager`` metrics
  ``remote-copy-throttle-time-{avg,max}`` and ``remote-fetch-throttle-time-{avg,max}``.

Thread-safe. Time comes from the injected clock; with anything but the system clock a wait
is ``clock.sleep`` (a MockClock moves forward) instead of a condition wait.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from strata.common.clock import SYSTEM_CLOCK, Clock, SystemClock
from strata.common.config import LONG_MAX
from strata.common.rate import ByteRateQuota, SampledAvgMax

log = logging.getLogger(__name__)

# Kafka's RemoteLogManager.quotaTimeout(): the longest a copier waits before re-checking.
DEFAULT_QUOTA_TIMEOUT_MS = 1000


class RLMQuotaManager(ByteRateQuota):
    """Kafka's ``RLMQuotaManager``: the remote copy or fetch byte-rate bound."""


class ThrottleTimeSensor:
    """Kafka's ``RLMQuotaMetrics`` sensor: the average and maximum throttle time recorded."""

    def __init__(self, name: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.name = name
        self._stats = SampledAvgMax()
        self._clock = clock
        self._lock = threading.Lock()
        self.count = 0          # throttle events since start (Strata's, for tests and logs)

    def record(self, throttle_ms: float) -> None:
        self._stats.record(throttle_ms, self._clock.milliseconds())
        with self._lock:
            self.count += 1

    def avg(self) -> float:
        return self._stats.avg(self._clock.milliseconds())

    def max(self) -> float:
        return self._stats.max(self._clock.milliseconds())


class RemoteLogQuotas:
    """The copy and fetch quotas of one remote log manager, and their throttle sensors."""

    def __init__(self, *, copy_bytes_per_second: int = LONG_MAX, copy_window_num: int = 11,
                 copy_window_size_seconds: int = 1, fetch_bytes_per_second: int = LONG_MAX,
                 fetch_window_num: int = 11, fetch_window_size_seconds: int = 1,
                 clock: Clock = SYSTEM_CLOCK,
                 quota_timeout_ms: int = DEFAULT_QUOTA_TIMEOUT_MS) -> None:
        self.clock = clock
        self.copy = RLMQuotaManager(copy_bytes_per_second, copy_window_num,
                                    copy_window_size_seconds, clock=clock,
                                    description="remote copy quota")
        self.fetch = RLMQuotaManager(fetch_bytes_per_second, fetch_window_num,
                                     fetch_window_size_seconds, clock=clock,
                                     description="remote fetch quota")
        self.copy_throttle = ThrottleTimeSensor("remote-copy-throttle-time", clock)
        self.fetch_throttle = ThrottleTimeSensor("remote-fetch-throttle-time", clock)
        self.quota_timeout_ms = quota_timeout_ms
        self._copy_cond = threading.Condition(threading.Lock())
        self._closed = False

    # ---- copy ----

    def acquire_copy(self, size: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait while the copy quota is exceeded, then record ``size`` bytes: True. False,
        with nothing recorded, when ``stop()`` turns true or the quotas are closed."""
        with self._copy_cond:
            throttle = self.copy.throttle_time_ms()
            while throttle > 0:
                if self._closed or stop():
                    return False
                self.copy_throttle.record(throttle)
                log.debug("remote copy quota exceeded: waiting up to %d ms", throttle)
                self._wait(min(throttle, self.quota_timeout_ms) / 1000.0)
                throttle = self.copy.throttle_time_ms()
            if self._closed or stop():
                return False
            self.copy.record(size)
            self._copy_cond.notify_all()   # the other copiers check the quota again
            return True

    def _wait(self, seconds: float) -> None:
        if isinstance(self.clock, SystemClock):
            self._copy_cond.wait(seconds)
        else:
            self.clock.sleep(seconds)   # an injected clock moves when slept on

    def update_copy_quota(self, bytes_per_second: int) -> None:
        self.copy.update_quota(bytes_per_second)
        with self._copy_cond:
            self._copy_cond.notify_all()

    # ---- fetch ----

    def fetch_throttle_time_ms(self) -> int:
        """Kafka's ``getFetchThrottleTimeMs``: > 0 means start no remote read now."""
        return self.fetch.throttle_time_ms()

    def record_fetch_throttled(self, throttle_ms: int) -> None:
        self.fetch_throttle.record(throttle_ms)

    def record_fetch(self, size: int) -> None:
        self.fetch.record(size)

    def update_fetch_quota(self, bytes_per_second: int) -> None:
        self.fetch.update_quota(bytes_per_second)

    # ---- lifecycle ----

    def close(self) -> None:
        """Wake and release every waiting copier (shutdown)."""
        with self._copy_cond:
            self._closed = True
            self._copy_cond.notify_all()
