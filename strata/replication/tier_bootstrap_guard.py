"""KIP-1303's guard, broker side: replicas whose local log was started at the tiered offset.

A follower rebuilt from the remote tier (KIP-405's rebuild after OFFSET_MOVED_TO_TIERED_STORAGE,
or KIP-1023's start at the last tiered offset) holds only the newest part of the log locally.
Elected leader, it would send every lagging consumer to the remote tier, and be unable to serve
them at all while the remote tier is unreachable. So until its local log spans
``leader.election.eligible.local.log.ms`` (of time since it started there) or
``leader.election.eligible.local.log.bytes``, the broker reports it (``/strata/tier_bootstrapped/N``)
and the controller elects it only when no other eligible replica can lead. A negative
threshold turns its half of the guard off; both negative, no replica is ever guarded.

What is guarded is this incarnation's memory: a broker that restarts reports nothing until it
rebuilds a replica again (its registration starts with nothing guarded at the controller).

A replica whose log is gone (deleted, moved away) is dropped at the next poll.

Threads: ``bootstrapped`` is called from the replica fetcher's worker threads, ``poll`` from
the scheduler; one lock guards the state.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.types import TopicPartition

__all__ = ["LOCAL_LOG_BYTES_CONFIG", "LOCAL_LOG_MS_CONFIG", "TierBootstrapGuard",
           "TierBootstrapReporter"]

log = logging.getLogger(__name__)

LOCAL_LOG_MS_CONFIG = "leader.election.eligible.local.log.ms"
LOCAL_LOG_BYTES_CONFIG = "leader.election.eligible.local.log.bytes"


class TierBootstrapReporter(Protocol):
    """Where a broker reports its guarded replicas (the ZooKeeper cluster metadata)."""

    def registration_epoch(self) -> int:
        """The broker epoch reports are made for; -1 before the broker registered."""

    def report_tier_bootstrapped(self, broker_epoch: int,
                                 partitions: frozenset[TopicPartition]) -> None:
        """All the broker's guarded replicas now; raises when not written."""


class TierBootstrapGuard:
    def __init__(self, local_log_bytes: Callable[[TopicPartition], int | None],
                 reporter: TierBootstrapReporter | None, *, local_log_ms: int,
                 local_log_min_bytes: int, clock: Clock = SYSTEM_CLOCK):
        """``local_log_bytes(tp)``: the size of the replica's local log, None once it is gone."""
        self.local_log_bytes = local_log_bytes
        self.reporter = reporter
        self.local_log_ms = local_log_ms
        self.local_log_min_bytes = local_log_min_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._since: dict[TopicPartition, int] = {}     # guarded replica -> when it started
        self._reported: tuple[frozenset[TopicPartition], int] = (frozenset(), -1)

    @property
    def enabled(self) -> bool:
        return self.local_log_ms >= 0 or self.local_log_min_bytes >= 0

    def bootstrapped(self, tp: TopicPartition) -> None:
        """The replica's local log now starts at the tiered offset."""
        if not self.enabled:
            return
        with self._lock:
            self._since[tp] = self.clock.milliseconds()
        log.info("%s started at the tiered offset: not elected while a replica with more local "
                 "log can lead, until its local log spans %d ms or %d bytes", tp,
                 self.local_log_ms, self.local_log_min_bytes)

    def guarded(self) -> frozenset[TopicPartition]:
        """The replicas guarded now (after dropping those that span the thresholds)."""
        now = self.clock.milliseconds()
        with self._lock:
            for tp, since in list(self._since.items()):
                size = self.local_log_bytes(tp)
                if size is None or (0 <= self.local_log_ms <= now - since) or \
                        (0 <= self.local_log_min_bytes <= size):
                    del self._since[tp]
                    if size is not None:
                        log.info("%s: its local log spans the election guard (%d ms, %d bytes): "
                                 "electable as any replica", tp, now - since, size)
            return frozenset(self._since)

    def poll(self) -> frozenset[TopicPartition]:
        """Drop replicas that span the thresholds; report when the controller's view (at this
        registration) differs. The replicas guarded now."""
        guarded = self.guarded()
        if self.reporter is None:
            return guarded
        epoch = self.reporter.registration_epoch()
        if epoch < 0:
            return guarded
        last, last_epoch = self._reported
        known = last if epoch == last_epoch else frozenset()  # a new registration: nothing
        if guarded != known:
            try:
                self.reporter.report_tier_bootstrapped(epoch, guarded)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper away: the next poll retries
                log.warning("cannot report %d tier-bootstrapped replica(s) to the controller "
                            "(%s: %s); retrying", len(guarded), type(exc).__name__, exc)
                return guarded
            self._reported = (guarded, epoch)
        return guarded
