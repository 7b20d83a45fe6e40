"""LogDirFailureHandler: a broker in a cluster takes a failed log dir's replicas offline and
brings them back (Kafka's ``ReplicaManager.handleLogDirFailure``, plus Strata's way back).

When the ``LogDirFailureChannel`` counts a dir offline (a write failed with ENOSPC, EDQUOT, EIO
or EROFS), the handler, on its own thread:

- stops following the replicas hosted in that dir (their fetchers let go of them, as Kafka's
  ``removeFetcherForPartitions``), and keeps any that a new leader epoch adds meanwhile out;
- reports every replica it hosts in offline dirs to the controller (``OfflineReplicaReporter``:
  ``/strata/offline_replicas/N`` and a ``/log_dir_event_notification``), which moves their
  leadership elsewhere and takes them out of the ISRs;
- probes the dir every ``strata.log.dir.probe.interval.ms`` (a small file written and
  fsynced): a follower that appends nothing would otherwise never notice space returning.

When the dir takes writes again (a probe or any other write succeeded), the replicas it hosts
follow their leaders afresh (a fetcher partition stopped by the storage error starts again),
the report shrinks, and each rejoins the ISR through its leader's AlterPartition once caught
up. A restart brings every dir back (a new registration starts with no offline replica). Each
change is logged once; the report is retried every interval until ZooKeeper takes it, and made
again when the broker registers anew while something is offline.

Single-broker mode has no handler: there a dir comes back when a write succeeds.

Threads: the channel's listener only wakes the handler's thread (it runs on whatever thread
wrote); ``poll`` does the work, on that thread or a test's.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.types import TopicPartition
from strata.log.log_dir_failure import LogDirFailureChannel

__all__ = ["DEFAULT_PROBE_INTERVAL_MS", "PROBE_INTERVAL_CONFIG", "LogDirFailureHandler",
           "OfflineReplicaReporter"]

log = logging.getLogger(__name__)

PROBE_INTERVAL_CONFIG = "strata.log.dir.probe.interval.ms"   # Strata's
DEFAULT_PROBE_INTERVAL_MS = 1000


class OfflineReplicaReporter(Protocol):
    """Where a broker reports its offline replicas (the ZooKeeper cluster metadata)."""

    def registration_epoch(self) -> int:
        """The broker epoch reports are made for; -1 before the broker registered."""

    def report_offline_replicas(self, broker_epoch: int, offline: frozenset[TopicPartition],
                                failed: bool) -> None:
        """All the broker's offline replicas now (``failed``: some just went offline);
        raises when not written."""


class LogDirFailureHandler:
    def __init__(self, channel: LogDirFailureChannel, log_manager, replica_manager,
                 reporter: OfflineReplicaReporter | None = None, *,
                 probe_interval_ms: int = DEFAULT_PROBE_INTERVAL_MS, clock: Clock = SYSTEM_CLOCK):
        """``log_manager``: its ``logs_with_dirs()`` says which replicas a dir hosts;
        ``replica_manager``: its ``state(tp)``, ``broker_id`` and ``fetchers``."""
        if probe_interval_ms <= 0:
            raise ValueError(f"{PROBE_INTERVAL_CONFIG} must be positive, got {probe_interval_ms}")
        self.channel = channel
        self.log_manager = log_manager
        self.replica_manager = replica_manager
        self.reporter = reporter
        self.probe_interval_ms = probe_interval_ms
        self.clock = clock
        self._acted: frozenset[Path] = frozenset()    # dirs handled as offline
        self._next_probe: dict[Path, int] = {}
        self._reported: tuple[frozenset[TopicPartition], int] = (frozenset(), -1)
        self._report_failing = False
        self._poll_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        channel.add_listener(lambda _dir, _online: self._wake.set())

    def start(self) -> "LogDirFailureHandler":
        self._thread = threading.Thread(target=self._run, name="log-dir-failure-handler",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.probe_interval_ms / 1000)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the handler must outlive a bad round
                log.exception("handling offline log dirs failed; retrying")

    # ---- one round ------------------------------------------------------------------------

    def poll(self) -> frozenset[TopicPartition]:
        """Probe the offline dirs that are due, act on dirs that went offline or came back,
        and report; the replicas offline now."""
        with self._poll_lock:
            self._probe_due()
            offline = self.channel.offline_dirs()
            went, back = offline - self._acted, self._acted - offline
            self._acted = offline
            hosted = self._hosted_by_dir()
            offline_tps = frozenset(tp for d in offline for tp in hosted.get(d, ()))
            for d in sorted(went):
                tps = sorted(hosted.get(d, ()))
                log.warning("log dir %s failed: its %d replica(s) are offline %s; reporting them "
                            "so their leadership moves, probing the dir every %d ms", d, len(tps),
                            _shown(tps), self.probe_interval_ms)
            fetchers = self.replica_manager.fetchers
            if fetchers is not None:
                following = fetchers.fetching()
                stray = [tp for tp in offline_tps if tp in following]
                if stray:   # the dir cannot take their records
                    fetchers.remove_partitions(stray)
            for d in sorted(back):
                tps = sorted(hosted.get(d, ()))
                followed = self._follow_again(tps) if fetchers is not None else 0
                log.warning("log dir %s takes writes again: its %d replica(s) are online, %d "
                            "follow their leaders again and rejoin the ISR once caught up",
                            d, len(tps), followed)
            self._maybe_report(offline_tps, failed=bool(went))
            return offline_tps

    def _probe_due(self) -> None:
        now = self.clock.milliseconds()
        offline = self.channel.offline_dirs()
        for d in list(self._next_probe):
            if d not in offline:
                del self._next_probe[d]
        for d in sorted(offline):
            due = self._next_probe.setdefault(d, now + self.probe_interval_ms)
            if now >= due:
                self._next_probe[d] = now + self.probe_interval_ms
                self.channel.probe(d)

    def _hosted_by_dir(self) -> dict[Path, list[TopicPartition]]:
        out: dict[Path, list[TopicPartition]] = {}
        for log_dir, tp, _ in self.log_manager.logs_with_dirs():
            out.setdefault(Path(log_dir), []).append(tp)
        return out

    def _follow_again(self, tps: list[TopicPartition]) -> int:
        """The followers among ``tps`` follow their leaders from scratch: a fetcher partition
        stopped by the storage error at this leader epoch would stay stopped."""
        fetchers = self.replica_manager.fetchers
        me = self.replica_manager.broker_id
        fetchers.remove_partitions(tps)
        follow = {}
        for tp in tps:   # read after the removal: a newer state's own add is never undone
            st = self.replica_manager.state(tp)
            if st is not None and 0 <= st.leader != me and me in st.replicas:
                follow[tp] = (st.leader, st.leader_epoch)
        if follow:
            fetchers.add_partitions(follow)
        return len(follow)

    def _maybe_report(self, offline: frozenset[TopicPartition], failed: bool) -> None:
        """Reports when the controller's view (at this registration) differs from ``offline``."""
        if self.reporter is None:
            return
        epoch = self.reporter.registration_epoch()
        if epoch < 0:
            return
        last, last_epoch = self._reported
        # a new registration starts with nothing offline at the controller
        known = last if epoch == last_epoch else frozenset()
        if offline == known:
            return
        try:
            self.reporter.report_offline_replicas(epoch, offline, failed or bool(offline - known))
        except Exception as exc:  # noqa: BLE001 - ZooKeeper away: the next round retries
            if not self._report_failing:
                log.warning("cannot report %d offline replica(s) to the controller (%s: %s); "
                            "retrying every %d ms", len(offline), type(exc).__name__, exc,
                            self.probe_interval_ms)
            self._report_failing = True
            return
        if self._report_failing:
            log.info("reported %d offline replica(s) to the controller", len(offline))
        self._report_failing = False
        self._reported = (offline, epoch)


def _shown(tps: list[TopicPartition], most: int = 10) -> str:
    names = [f"{tp.topic}-{tp.partition}" for tp in tps[:most]]
    more = f", ... ({len(tps) - most} more)" if len(tps) > most else ""
    return "[" + ", ".join(names) + more + "]"
