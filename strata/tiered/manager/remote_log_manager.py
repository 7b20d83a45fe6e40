"""RemoteLogManager: a small coordinator that runs the tiering tasks of every tiered partition.

Each ``remote.log.manager.task.interval.ms`` a driver thread looks at the broker's logs: every
log with ``remote.storage.enable`` (and not compacted) gets a :class:`PartitionTiering`, whose
copier task runs on the copier pool and expirer task on the expiration pool — at most one of
each in flight per partition. A task that fails waits an exponential backoff with jitter
before its next attempt (``remote.log.manager.task.retry.*``), so an object-store outage never
blocks produce or local reads and tiering resumes by itself. Remote reads run on the reader
pool (``remote.log.reader.threads``, at most ``remote.log.reader.max.pending.tasks`` queued).

KIP-956 quotas (``quota.RemoteLogQuotas``): a copier waits while the copy byte-rate quota is
exceeded before each segment (``remote.log.manager.copy.max.bytes.per.second``); the Fetch
handler asks ``fetch_throttle_time_ms`` before starting remote reads and skips them while the
fetch quota (``remote.log.manager.fetch.max.bytes.per.second``) is exceeded; every remote read
records the bytes it returned. Both bounds change live through ``reconfigure`` (dynamic broker
configs).

The store sweep (``expirer.abort_incomplete_uploads``: leftovers of uploads a crash cut
short) runs on the expiration pool at start and then every
``INCOMPLETE_UPLOAD_SWEEP_INTERVAL_MS`` (or the task interval, if longer).

The tasks live in their own modules (``copier``, ``expirer``); this module owns the pools,
the per-partition state, the read entry points, topic deletion (the remote partition remover)
and turning tiering off with ``remote.log.delete.on.disable``.

Threads: the public methods may be called from any thread (the event loop submits reads and
topic deletions); each partition's state is touched by its own tasks only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.config import LONG_MAX
from strata.common.errors import (
    ErrorCode, InvalidConfigError, KafkaError, KafkaStorageError, OffsetOutOfRangeError)
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.local_log import FetchDataInfo
from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.tiered.api import (
    FencedLeaderEpochException, RemoteLogMetadataManager, RemoteLogSegmentId,
    RemoteLogSegmentMetadata, RemoteLogSegmentState, RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState, RemoteStorageManager)
from strata.tiered.config import inherited_tiering_remote_data_message
from strata.tiered.manager import copier, expirer
from strata.tiered.manager.leadership import LeadershipLost
from strata.tiered.manager.lineage import lineage_end
from strata.tiered.manager.quota import RemoteLogQuotas
from strata.tiered.manager.retry import Backoff

log = logging.getLogger(__name__)

INCOMPLETE_UPLOAD_SWEEP_INTERVAL_MS = 300_000
SHUTDOWN_TASK_WAIT_S = 5   # what a shutdown gives running tasks before it interrupts them


@dataclasses.dataclass
class TieringSettings:
    """The ``remote.log.manager.*`` and reader settings the manager uses (Kafka's names)."""

    task_interval_ms: int = 30_000
    retry_backoff_ms: int = 500
    retry_backoff_max_ms: int = 30_000
    retry_jitter: float = 0.2
    copier_threads: int = 10
    expiration_threads: int = 10
    reader_threads: int = 10
    reader_max_pending_tasks: int = 100
    # KIP-956 quotas (remote.log.manager.{copy,fetch}.max.bytes.per.second and their windows)
    copy_max_bytes_per_second: int = LONG_MAX
    copy_quota_window_num: int = 11
    copy_quota_window_size_seconds: int = 1
    fetch_max_bytes_per_second: int = LONG_MAX
    fetch_quota_window_num: int = 11
    fetch_quota_window_size_seconds: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> TieringSettings:
        """The settings of a ``RemoteLogManagerConfig``."""
        return cls(
            task_interval_ms=cfg.task_interval_ms, retry_backoff_ms=cfg.retry_backoff_ms,
            retry_backoff_max_ms=cfg.retry_backoff_max_ms, retry_jitter=cfg.retry_jitter,
            copier_threads=cfg.copier_threads, expiration_threads=cfg.expiration_threads,
            reader_threads=cfg.reader_threads,
            reader_max_pending_tasks=cfg.reader_max_pending_tasks,
            **quota_settings(cfg))


def quota_settings(cfg: Any) -> dict[str, int]:
    """The quota fields of ``TieringSettings`` from a ``RemoteLogManagerConfig``."""
    return {
        "copy_max_bytes_per_second": cfg.remote_log_manager_copy_max_bytes_per_second,
        "copy_quota_window_num": cfg.remote_log_manager_copy_num_quota_samples,
        "copy_quota_window_size_seconds": cfg.remote_log_manager_copy_quota_window_size_seconds,
        "fetch_max_bytes_per_second": cfg.remote_log_manager_fetch_max_bytes_per_second,
        "fetch_quota_window_num": cfg.remote_log_manager_fetch_num_quota_samples,
        "fetch_quota_window_size_seconds":
            cfg.remote_log_manager_fetch_quota_window_size_seconds,
    }


class TieringMetrics:
    """Per-topic counters behind the KIP-930 metrics (thread-safe, monotonic)."""

    NAMES = ("RemoteCopyBytesPerSec", "RemoteCopyRequestsPerSec", "RemoteCopyErrorsPerSec",
             "RemoteFetchBytesPerSec", "RemoteFetchRequestsPerSec", "RemoteFetchErrorsPerSec",
             "RemoteDeleteRequestsPerSec", "RemoteDeleteErrorsPerSec",
             "BuildRemoteLogAuxStateRequestsPerSec", "BuildRemoteLogAuxStateErrorsPerSec")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, dict[str, int]] = {n: defaultdict(int) for n in self.NAMES}

    def _add(self, name: str, topic: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name][topic] += n

    def copied(self, topic: str, size: int) -> None:
        self._add("RemoteCopyRequestsPerSec", topic)
        self._add("RemoteCopyBytesPerSec", topic, size)

    def copy_failed(self, topic: str) -> None:
        self._add("RemoteCopyRequestsPerSec", topic)
        self._add("RemoteCopyErrorsPerSec", topic)

    def fetched(self, topic: str, size: int) -> None:
        self._add("RemoteFetchRequestsPerSec", topic)
        self._add("RemoteFetchBytesPerSec", topic, size)

    def fetch_failed(self, topic: str) -> None:
        self._add("RemoteFetchRequestsPerSec", topic)
        self._add("RemoteFetchErrorsPerSec", topic)

    def deleted(self, topic: str) -> None:
        self._add("RemoteDeleteRequestsPerSec", topic)

    def delete_failed(self, topic: str) -> None:
        self._add("RemoteDeleteRequestsPerSec", topic)
        self._add("RemoteDeleteErrorsPerSec", topic)

    def aux_state_built(self, topic: str) -> None:
        self._add("BuildRemoteLogAuxStateRequestsPerSec", topic)

    def aux_state_failed(self, topic: str) -> None:
        self._add("BuildRemoteLogAuxStateRequestsPerSec", topic)
        self._add("BuildRemoteLogAuxStateErrorsPerSec", topic)

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {n: dict(c) for n, c in self.counters.items()}


class ReaderPoolStats:
    """Accounting of the reader pool for its metrics: reads queued (submitted, not started),
    reads running, and the reader threads' busy time (thread-safe; read on scrape)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self.queued = 0
        self.active = 0
        self._busy_ns = 0
        self._active_started_ns = 0  # sum of the start times of the running reads
        self.created_ns = time.monotonic_ns()

    def submitted(self) -> None:
        with self._lock:
            self.queued += 1

    def dropped(self) -> None:
        with self._lock:
            self.queued -= 1

    def started(self) -> int:
        now = time.monotonic_ns()
        with self._lock:
            self.queued -= 1
            self.active += 1
            self._active_started_ns += now
        return now

    def finished(self, started_ns: int) -> None:
        now = time.monotonic_ns()
        with self._lock:
            self.active -= 1
            self._active_started_ns -= started_ns
            self._busy_ns += now - started_ns

    def busy_ns(self, now_ns: int | None = None) -> int:
        """Total busy time of the reader threads so far, running reads included."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            return self._busy_ns + self.active * now - self._active_started_ns


@dataclasses.dataclass
class TieringContext:
    """What every task needs: the plugins, this broker's id, the clock, the metrics, and
    ``leader_epoch_of`` (None on one broker, where every log is led): the leader epoch this
    broker leads a partition at now, None where it does not (or may not: its cluster
    session is in doubt)."""

    rsm: RemoteStorageManager
    rlmm: RemoteLogMetadataManager
    broker_id: int
    clock: Clock
    metrics: TieringMetrics
    index_cache: Any = None       # RemoteIndexCache
    stopping: bool = False
    quotas: RemoteLogQuotas | None = None
    leader_epoch_of: Callable[[TopicPartition], int | None] | None = None

    def leading_epoch(self, part: PartitionTiering) -> int:
        """The leader epoch to write ``part``'s next remote object or metadata record at:
        this broker's epoch, if it still leads the partition at ``part``'s epoch or a later
        one of its own. Checked before every such write. Raises LeadershipLost otherwise."""
        if self.stopping or not part.leader:
            raise LeadershipLost(f"{part.tip.topic_partition}: tiering stopped")
        if self.leader_epoch_of is None:
            return part.leader_epoch
        epoch = self.leader_epoch_of(part.tip.topic_partition)
        if epoch is None or epoch < part.leader_epoch:
            raise LeadershipLost(f"{part.tip.topic_partition}: this broker no longer leads it "
                                 f"at leader epoch {part.leader_epoch}")
        return epoch


class _Task:
    """One recurring task of one partition: in flight or not, and when it may run next."""

    def __init__(self, backoff: Backoff):
        self.backoff = backoff
        self.running = False
        self.next_run_ms = 0
        self.last_error: str | None = None


class PartitionTiering:
    """The tiering state of one tiered partition hosted here, for one leadership: as its
    leader (copy and expire) at ``leader_epoch``, or as a follower (``leader`` False), which
    only learns from the metadata how far the remote tier reaches. A new leadership gets a
    new object; the old one is ``superseded`` and its tasks stop at their next segment."""

    def __init__(self, tip: TopicIdPartition, ulog: UnifiedLog, settings: TieringSettings, *,
                 leader: bool = True, leader_epoch: int = 0):
        self.tip = tip
        self.log = ulog
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.superseded = False
        self.initialized = False
        self.copying: RemoteLogSegmentId | None = None
        # the leaderships of this log it replaced, while their tasks may still run
        self.predecessor: PartitionTiering | None = None

        def backoff() -> Backoff:
            return Backoff(settings.retry_backoff_ms, settings.retry_backoff_max_ms,
                           settings.retry_jitter)
        self.copy_task = _Task(backoff())
        self.expire_task = _Task(backoff())

    @property
    def copy_enabled(self) -> bool:
        return (self.leader and not self.superseded and self.log.remote_log_enabled
                and not self.log.config.get("remote.log.copy.disable"))


# How long a follower's rebuild from the remote tier waits for the partition's remote log
# metadata to load before failing (to be retried after the fetcher's back-off, or as soon as
# the metadata manager says it is loaded). The fetcher thread, and its lock (which partition
# state changes for that thread take), are held that long, as during the rebuild's requests.
AUX_STATE_METADATA_WAIT_S = 0.2


class RemoteLogManager:
    def __init__(self, rsm: RemoteStorageManager, rlmm: RemoteLogMetadataManager, *,
                 broker_id: int, logs: Callable[[], list[UnifiedLog]],
                 topic_id: Callable[[str], Any], settings: TieringSettings | None = None,
                 index_cache: Any = None, clock: Clock = SYSTEM_CLOCK,
                 leader_epoch_of: Callable[[TopicPartition], int | None] | None = None,
                 leads_metadata_partition: Callable[[int], bool] | None = None,
                 manifests: Any = None):
        """``leader_epoch_of``: in a cluster, this broker's leader epoch for a partition it
        leads, None for one it follows (only leaders copy and expire, as in Kafka); without
        it (one broker) every log is led. ``leads_metadata_partition``: whether this broker
        leads a ``__remote_log_metadata`` partition, whose leader removes the remote data of
        the deleted partitions it holds (KIP-405's RemotePartitionRemover); without it this
        broker removes them all. ``manifests``: the bucket's ``ManifestWriter`` (issue 52),
        which checks this cluster owns the key prefix before tasks write and keeps each
        partition's manifest current after them."""
        self.manifests = manifests
        self.settings = settings or TieringSettings()
        s = self.settings
        quotas = RemoteLogQuotas(
            copy_bytes_per_second=s.copy_max_bytes_per_second,
            copy_window_num=s.copy_quota_window_num,
            copy_window_size_seconds=s.copy_quota_window_size_seconds,
            fetch_bytes_per_second=s.fetch_max_bytes_per_second,
            fetch_window_num=s.fetch_quota_window_num,
            fetch_window_size_seconds=s.fetch_quota_window_size_seconds, clock=clock)
        self.ctx = TieringContext(rsm, rlmm, broker_id, clock, TieringMetrics(), index_cache,
                                  quotas=quotas, leader_epoch_of=leader_epoch_of)
        self._logs = logs
        self._topic_id = topic_id
        self._leader_epoch_of = leader_epoch_of
        self._leads_metadata_partition = leads_metadata_partition
        self._partitions: dict[TopicPartition, PartitionTiering] = {}
        self._removals: dict[TopicIdPartition, _Task] = {}
        self._disabling: dict[TopicPartition, _Task] = {}   # delete-on-disable in progress
        self._sweep = _Task(Backoff(s.retry_backoff_ms, s.retry_backoff_max_ms, s.retry_jitter))
        self._next_sweep_ms = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._copiers = concurrent.futures.ThreadPoolExecutor(s.copier_threads, "rlm-copier")
        self._expirers = concurrent.futures.ThreadPoolExecutor(s.expiration_threads, "rlm-expirer")
        self._readers = concurrent.futures.ThreadPoolExecutor(s.reader_threads, "rlm-reader")
        self._read_slots = threading.BoundedSemaphore(s.reader_max_pending_tasks)
        self.reader_stats = ReaderPoolStats(s.reader_threads)
        self._read_ahead: dict[TopicPartition, tuple[int, int]] = {}   # next offset, window
        self._driver: threading.Thread | None = None
        self._running: set[concurrent.futures.Future] = set()   # submitted tasks not done
        self._deletions_resumed = False
        self._next_deletion_scan_ms = 0

    @property
    def metrics(self) -> TieringMetrics:
        return self.ctx.metrics

    @property
    def quotas(self) -> RemoteLogQuotas:
        assert self.ctx.quotas is not None
        return self.ctx.quotas

    # ---- quotas (KIP-956) ----------------------------------------------------------------------

    def update_copy_quota(self, bytes_per_second: int) -> None:
        """Kafka's ``updateCopyQuota``: a new copy bound, effective for the next segment."""
        self.quotas.update_copy_quota(bytes_per_second)

    def update_fetch_quota(self, bytes_per_second: int) -> None:
        """Kafka's ``updateFetchQuota``: a new fetch bound, effective for the next Fetch."""
        self.quotas.update_fetch_quota(bytes_per_second)

    def reconfigure(self, cfg: Any) -> None:
        """Apply the dynamic settings of a ``RemoteLogManagerConfig`` (the broker's static
        properties overlaid with its dynamic configs): the copy and fetch quotas."""
        q = quota_settings(cfg)
        self.update_copy_quota(q["copy_max_bytes_per_second"])
        self.update_fetch_quota(q["fetch_max_bytes_per_second"])

    def fetch_throttle_time_ms(self) -> int:
        """Kafka's ``getFetchThrottleTimeMs``: > 0 while the fetch quota is exceeded, when a
        Fetch must not start remote reads."""
        return self.quotas.fetch_throttle_time_ms()

    def record_fetch_throttled(self, throttle_ms: int) -> None:
        """A Fetch skipped its remote reads for ``throttle_ms`` (the fetch throttle sensor)."""
        self.quotas.record_fetch_throttled(throttle_ms)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._resume_deletions()
        self._driver = threading.Thread(target=self._drive, name="rlm-driver", daemon=True)
        self._driver.start()

    def shutdown(self) -> None:
        """Stop scheduling, let running tasks stop at their next segment, close the plugins.

        Tasks get ``SHUTDOWN_TASK_WAIT_S`` to finish; one still running then is most likely
        blocked publishing to the metadata topic, which retries for minutes (too few in-sync
        replicas, its leader gone with this broker), so the metadata manager is closed first,
        which ends that. A copy left COPY_SEGMENT_STARTED is an orphan the expirer deletes, as
        after a crash."""
        self.ctx.stopping = True
        self._wake.set()
        self.quotas.close()   # copiers waiting for the copy quota give up now
        self._abort_store_waits()
        if self._driver is not None:
            self._driver.join(timeout=10)
        for pool in (self._copiers, self._expirers, self._readers):
            pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            running = list(self._running)
        _, stuck = concurrent.futures.wait(running, timeout=SHUTDOWN_TASK_WAIT_S)
        closing = [self.ctx.index_cache, self.ctx.rsm, self.ctx.rlmm]
        if stuck:
            log.warning("%d tiering task(s) still running %d s into the shutdown; closing the "
                        "remote log metadata manager to stop them", len(stuck),
                        SHUTDOWN_TASK_WAIT_S)
            self._close(closing.pop())
        for pool in (self._copiers, self._expirers, self._readers):
            pool.shutdown(wait=True)
        if self.manifests is not None and self._leader_epoch_of is None:
            # one broker is the whole cluster: its prefix is free once it stops
            try:
                self.manifests.catalog.release()
            except Exception as exc:  # noqa: BLE001 - the lease then runs out by itself
                log.warning("could not release the remote storage prefix: %s", exc)
        for closeable in closing:
            self._close(closeable)

    @staticmethod
    def _close(closeable: Any) -> None:
        if closeable is not None:
            try:
                closeable.close()
            except Exception:  # noqa: BLE001 - shutdown goes on
                log.exception("closing %s failed", type(closeable).__name__)

    def _abort_store_waits(self) -> None:
        """Uploads sleeping in the RSM's rate limits fail now rather than hold the copier
        pool's shutdown."""
        self.ctx.rsm.abort_waits()

    def wake(self) -> None:
        """Run a scheduling round now (tests, config changes)."""
        self._wake.set()

    def _drive(self) -> None:
        while not self.ctx.stopping:
            try:
                self._schedule_round()
            except Exception:  # noqa: BLE001 - the driver must survive anything
                log.exception("remote log manager scheduling round failed")
            self._wake.wait(self._next_wait_s())
            self._wake.clear()

    def _next_wait_s(self) -> float:
        now = self.ctx.clock.milliseconds()
        due = now + self.settings.task_interval_ms
        with self._lock:
            tasks = [t for p in self._partitions.values() for t in (p.copy_task, p.expire_task)]
            tasks += list(self._removals.values()) + list(self._disabling.values())
        for t in tasks:
            if t.backoff.failures and not t.running:
                due = min(due, t.next_run_ms)
        return max(0.01, (due - now) / 1000)

    # ---- scheduling --------------------------------------------------------------------------

    def _schedule_round(self) -> None:
        now = self.ctx.clock.milliseconds()
        self._resume_deletions()
        seen = set()
        for ulog in self._logs():
            tp = ulog.topic_partition
            part = self._partitions.get(tp)
            if not ulog.remote_log_enabled:
                if ulog.config.get("remote.log.delete.on.disable"):
                    self._schedule_remote_log_deletion(ulog, now)
                continue
            topic_id = self._topic_id(tp.topic)
            if topic_id is None:
                continue
            seen.add(tp)
            epoch = 0 if self._leader_epoch_of is None else self._leader_epoch_of(tp)
            leader = epoch is not None
            if part is None or part.log is not ulog or part.leader != leader \
                    or (leader and part.leader_epoch != epoch):
                new = PartitionTiering(TopicIdPartition(topic_id, tp), ulog, self.settings,
                                       leader=leader, leader_epoch=epoch if leader else -1)
                if part is not None and part.log is ulog:
                    new.predecessor = part
                part = self._track(tp, new)
            if self._predecessors_busy(part):
                # The previous leadership's copy in flight is no orphan for this one's expirer
                # (deleting it after it finished lost its records), and this one's copier
                # resumes after it: both start once the previous tasks are over.
                continue
            if not part.leader:
                self._submit(self._expirers, part.expire_task, now, self._follow, part)
                continue
            if part.copy_enabled:
                self._submit(self._copiers, part.copy_task, now, self._copy, part)
            self._submit(self._expirers, part.expire_task, now, self._expire, part)
        with self._lock:
            gone = [self._partitions.pop(tp) for tp in list(self._partitions) if tp not in seen]
            removals = list(self._removals.items())
        for part in gone:
            part.superseded = True
        if gone:
            try:
                self.ctx.rlmm.on_stop_partitions({p.tip for p in gone})
            except Exception as exc:  # noqa: BLE001 - the metadata manager is closing
                log.debug("on_stop_partitions failed: %s", exc)
        for tip, task in removals:
            self._submit(self._expirers, task, now, self._remove_partition, tip)
        if now >= self._next_sweep_ms:
            self._submit(self._expirers, self._sweep, now, self._abort_incomplete_uploads, now)

    @staticmethod
    def _predecessors_busy(part: PartitionTiering) -> bool:
        """Whether a task of a leadership ``part`` replaced still runs (forgotten once none)."""
        old = part.predecessor
        while old is not None:
            if old.copy_task.running or old.expire_task.running:
                return True
            old = old.predecessor
        part.predecessor = None
        return False

    def _track(self, tp: TopicPartition, part: PartitionTiering) -> PartitionTiering:
        """Make ``part`` the partition's tiering state; the one it replaces stops."""
        with self._lock:
            old = self._partitions.get(tp)
            self._partitions[tp] = part
        if old is not None:
            old.superseded = True
        if part.leader:
            log.info("%s: tiering as leader at epoch %d", tp, part.leader_epoch)
            self.ctx.rlmm.on_partition_leadership_changes({part.tip}, set())
        else:
            self.ctx.rlmm.on_partition_leadership_changes(set(), {part.tip})
        return part

    def _abort_incomplete_uploads(self, started_ms: int) -> None:
        expirer.abort_incomplete_uploads(self.ctx)
        self._next_sweep_ms = started_ms + max(INCOMPLETE_UPLOAD_SWEEP_INTERVAL_MS,
                                               self.settings.task_interval_ms)

    def _submit(self, pool, task: _Task, now: int, fn, arg) -> None:
        if task.running or now < task.next_run_ms or self.ctx.stopping:
            return
        task.running = True

        def run() -> None:
            try:
                fn(arg)
                task.backoff.reset()
                task.last_error = None
                task.next_run_ms = 0
            except (LeadershipLost, FencedLeaderEpochException) as exc:
                # Not a failure: the next round runs the tasks of the leadership there is.
                log.info("%s stopped: %s", fn.__name__, exc)
                task.last_error = None
            except Exception as exc:  # noqa: BLE001 - retried with backoff
                delay = task.backoff.next_delay_ms()
                task.next_run_ms = self.ctx.clock.milliseconds() + delay
                task.last_error = str(exc)
                log.warning("%s failed (attempt %d, retry in %d ms): %s", fn.__name__,
                            task.backoff.failures, delay, exc,
                            exc_info=not isinstance(exc, (KafkaError, OSError))
                            and "Remote" not in type(exc).__name__)
            finally:
                task.running = False
                if task.backoff.failures:
                    self._wake.set()
        try:
            fut = pool.submit(run)
        except RuntimeError:  # pool shut down
            task.running = False
            return
        with self._lock:
            self._running.add(fut)
        fut.add_done_callback(self._task_done)

    def _task_done(self, fut: concurrent.futures.Future) -> None:
        with self._lock:
            self._running.discard(fut)

    def _ensure_initialized(self, part: PartitionTiering) -> None:
        if part.initialized:
            return
        if not self.ctx.rlmm.is_ready(part.tip):
            raise KafkaStorageError(f"remote log metadata of {part.tip} is not loaded yet")
        highest = copier.find_resume_offset(self.ctx, part)
        part.log.update_highest_offset_in_remote_storage(highest)
        earliest = self._earliest_remote_offset(part.tip)
        if earliest is not None and earliest > part.log.log_start_offset:
            # A log start offset checkpointed before the last remote deletions.
            part.log.maybe_increment_log_start_offset(earliest, "earliest remote segment")
        part.initialized = True

    def copied_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The partition's fully copied remote segments (what readers may use), by start offset."""
        return [m for m in self.ctx.rlmm.list_remote_log_segments(tip)
                if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED]

    def _earliest_remote_offset(self, tip: TopicIdPartition) -> int | None:
        copied = self.copied_segments(tip)
        return copied[0].start_offset if copied else None

    def _copy(self, part: PartitionTiering) -> None:
        self._ensure_initialized(part)
        if self.manifests is not None:
            self.manifests.check_owner()
        try:
            if copier.copy_log_segments(self.ctx, part) and self.manifests is not None:
                self.manifests.changed(part.tip)
        finally:
            self._write_manifest(part)

    def _expire(self, part: PartitionTiering) -> None:
        self._ensure_initialized(part)
        if self.manifests is not None:
            self.manifests.check_owner()
        if expirer.expire_remote_segments(self.ctx, part) and self.manifests is not None:
            self.manifests.changed(part.tip)
        self._write_manifest(part)

    def _write_manifest(self, part: PartitionTiering) -> None:
        """The partition's manifest, if it changed and is due (coalesced by the writer)."""
        if self.manifests is None or self.ctx.stopping:
            return
        try:
            self.manifests.maybe_write(part.tip, self.ctx.leading_epoch(part),
                                       part.log.log_start_offset)
        except LeadershipLost:
            pass
        except Exception as exc:  # noqa: BLE001 - retried after the next task
            log.warning("%s: manifest not written: %s", part.tip.topic_partition, exc)

    def _follow(self, part: PartitionTiering) -> None:
        """Kafka's RLMFollowerTask: a follower learns from the metadata the highest offset
        its leaders copied in its epoch lineage, so its local retention may delete what is
        in the remote tier; it copies and deletes nothing."""
        if not self.ctx.rlmm.is_ready(part.tip):
            raise KafkaStorageError(f"remote log metadata of {part.tip} is not loaded yet")
        part.log.update_highest_offset_in_remote_storage(copier.find_resume_offset(self.ctx, part))

    # ---- followers: KIP-405's auxiliary state ------------------------------------------------

    def on_metadata_ready(self, callback: Callable[[TopicPartition], None]) -> None:
        """Call ``callback(tp)`` when a partition's remote log metadata becomes ready, where
        the metadata manager tells (the topic-based one does): a follower whose rebuild found
        it not loaded yet retries then instead of after its back-off."""
        self.ctx.rlmm.add_ready_listener(lambda tip: callback(tip.topic_partition))

    def build_remote_log_aux_state(self, ulog: UnifiedLog, target_epoch: int,
                                   leader_local_start: int, leader_log_start: int) -> int:
        """A follower told OFFSET_MOVED_TO_TIERED_STORAGE (Kafka's TierStateMachine): find the
        remote segment of ``target_epoch`` holding ``leader_local_start - 1``, then start the
        local log empty just after it with the leader epochs and producer state uploaded with
        it; returns the offset to fetch from. Everything is read before the log is touched,
        so a failure (metadata not there yet, remote tier unreachable: retriable) leaves it
        as it was."""
        from strata.log.checkpoint import decode_epoch_entries
        from strata.tiered.api import IndexType, RemoteStorageNotReadyException
        tp = ulog.topic_partition
        tip = self._tip(ulog)
        try:
            if not self.ctx.rlmm.is_ready(tip):
                self.ctx.rlmm.on_partition_leadership_changes(set(), {tip})
                # a broker that just started has it within milliseconds; waiting here beats
                # the fetcher's back-off, which a long poll of its other partitions stretches
                if not self.ctx.rlmm.wait_ready(tip, AUX_STATE_METADATA_WAIT_S):
                    raise RemoteStorageNotReadyException(
                        f"remote log metadata of {tip} is not loaded yet")
            meta = self.ctx.rlmm.remote_log_segment_metadata(tip, target_epoch, leader_local_start - 1)
            if meta is None:
                raise RemoteStorageNotReadyException(
                    f"no remote segment of {tp} holds offset {leader_local_start - 1} at leader "
                    f"epoch {target_epoch} yet (leader's local log start {leader_local_start}, "
                    f"log start {leader_log_start})")
            with self.ctx.rsm.fetch_index(meta, IndexType.LEADER_EPOCH) as f:
                epochs = decode_epoch_entries(f.read(), f"leader epochs of {meta.remote_log_segment_id.id}")
            try:
                with self.ctx.rsm.fetch_index(meta, IndexType.PRODUCER_SNAPSHOT) as f:
                    snapshot = f.read()
            except Exception as exc:  # noqa: BLE001 - Kafka too goes on without it
                log.warning("%s: no producer snapshot with remote segment %s (%s); producer "
                            "state starts empty", tp, meta.remote_log_segment_id.id, exc)
                snapshot = None
        except Exception:
            self.metrics.aux_state_failed(tp.topic)
            raise
        next_offset = meta.end_offset + 1
        ulog.truncate_fully_and_start_after_remote(next_offset, leader_log_start, epochs, snapshot)
        self.metrics.aux_state_built(tp.topic)
        log.info("%s: rebuilt from remote segment %s [%d, %d] (leader epochs %s); fetching from %d",
                 tp, meta.remote_log_segment_id.id, meta.start_offset, meta.end_offset,
                 [tuple(e) for e in epochs if e.start_offset < next_offset], next_offset)
        return next_offset

    # ---- disabling and deleting --------------------------------------------------------------

    def validate_topic_config(self, topic: str, config: Any, old: Any | None) -> None:
        """``ClusterMetadata.config_validator``: a topic that stops being tiered without
        ``remote.log.delete.on.disable`` (which the metadata lets through only where tiering
        was inherited from ``log.remote.storage.enable``) must have nothing in the remote
        tier: no segment in its metadata, in any state, and no copy in flight. Raises
        ``InvalidConfigError`` saying what to do otherwise."""
        if old is None or not old.get("remote.storage.enable") \
                or config.get("remote.storage.enable") \
                or config.get("remote.log.delete.on.disable"):
            return
        reason = self._remote_data_of(topic)
        if reason is not None:
            raise InvalidConfigError(inherited_tiering_remote_data_message(topic, reason))

    def _remote_data_of(self, topic: str) -> str | None:
        """What the topic has in (or on its way to) the remote tier, or None if nothing."""
        topic_id = self._topic_id(topic)
        for ulog in self._logs():
            tp = ulog.topic_partition
            if tp.topic != topic:
                continue
            part = self._partitions.get(tp)
            if ulog.highest_offset_in_remote_storage >= 0:
                return f"partition {tp} has data in remote storage"
            if part is not None and part.copying is not None:
                return f"partition {tp} is copying a segment to remote storage"
            if topic_id is None:
                continue
            tip = TopicIdPartition(topic_id, tp)
            if not self.ctx.rlmm.is_ready(tip):
                return (f"the remote log metadata of partition {tp} is not loaded yet (retry "
                        "shortly)")
            if next(iter(self.ctx.rlmm.list_remote_log_segments(tip)), None) is not None:
                return f"partition {tp} has segments in remote storage"
        return None

    def _schedule_remote_log_deletion(self, ulog: UnifiedLog, now: int) -> None:
        """``remote.storage.enable`` is off with ``remote.log.delete.on.disable``: while the
        partition still has remote segments, delete them (retried with backoff; after a
        restart the metadata still shows them, so an interrupted deletion resumes)."""
        tp = ulog.topic_partition
        topic_id = self._topic_id(tp.topic)
        if topic_id is None:
            return
        tip = TopicIdPartition(topic_id, tp)
        with self._lock:
            task = self._disabling.get(tp)
        if task is None:
            try:
                if not self.ctx.rlmm.is_ready(tip) or \
                        next(iter(self.ctx.rlmm.list_remote_log_segments(tip)), None) is None:
                    return
            except Exception:  # noqa: BLE001 - metadata not loaded yet: next round
                return
            task = _Task(Backoff(self.settings.retry_backoff_ms,
                                 self.settings.retry_backoff_max_ms, self.settings.retry_jitter))
            with self._lock:
                self._disabling[tp] = task
        self._submit(self._expirers, task, now, self._delete_remote_log, (tip, ulog))

    def _delete_remote_log(self, target: tuple[TopicIdPartition, UnifiedLog]) -> None:
        tip, ulog = target
        if self.manifests is not None:
            self.manifests.check_owner()
            self.manifests.partition_deleted(tip)   # before the segments it lists go
        n = expirer.delete_all_remote_segments(self.ctx, tip, lambda: self.ctx.stopping)
        if self.ctx.stopping:
            return
        ulog.update_highest_offset_in_remote_storage(-1, force=True)
        ulog.maybe_increment_log_start_offset(ulog.local_log_start_offset, "remote storage disabled")
        with self._lock:
            self._disabling.pop(tip.topic_partition, None)
        log.info("%s: tiering disabled, deleted %d remote segment(s)", tip, n)

    def on_partitions_deleted(self, tips: list[TopicIdPartition]) -> None:
        """A topic was deleted: mark its partitions and let the remover delete every object."""
        with self._lock:
            for tip in tips:
                self._partitions.pop(tip.topic_partition, None)
                self._read_ahead.pop(tip.topic_partition, None)
                if tip not in self._removals:
                    self._removals[tip] = _Task(Backoff(
                        self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms,
                        self.settings.retry_jitter))
        self._wake.set()

    def _resume_deletions(self) -> None:
        """As soon as the metadata manager has loaded every metadata partition (at start on
        one broker; in a cluster it loads in the background), and again every
        ``INCOMPLETE_UPLOAD_SWEEP_INTERVAL_MS`` in a cluster (a metadata partition's
        leadership may have moved here): the removals of deleted topics' partitions that
        were interrupted, or that this broker now owns, go on."""
        now = self.ctx.clock.milliseconds()
        if self._deletions_resumed and (self._leads_metadata_partition is None
                                        or now < self._next_deletion_scan_ms):
            return
        rlmm = self.ctx.rlmm
        if any(rlmm.read_offset(p) is None for p in range(rlmm.num_partitions)):
            return
        self._deletions_resumed = True
        self._next_deletion_scan_ms = now + max(INCOMPLETE_UPLOAD_SWEEP_INTERVAL_MS,
                                                self.settings.task_interval_ms)
        try:
            orphans = [tip for tip in self._partitions_of_deleted_topics()
                       if self._removes(tip) and tip not in self._removals]
        except Exception as exc:  # noqa: BLE001 - the next scan retries
            log.info("scanning for deleted topics' remote data failed: %s", exc)
            return
        if orphans:
            log.info("resuming remote deletion of %d partition(s) of deleted topics", len(orphans))
            self.on_partitions_deleted(orphans)

    def _partitions_of_deleted_topics(self) -> list[TopicIdPartition]:
        """Partitions with remote metadata whose topic no longer exists (deleted, perhaps while
        this broker was down, or its removal interrupted): the remover finishes them."""
        found = set()
        for record in self.ctx.rlmm.describe():
            tip = record.topic_id_partition
            if isinstance(record, RemotePartitionDeleteMetadata) and \
                    record.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                continue
            if self._topic_id(tip.topic) != tip.topic_id:
                found.add(tip)
        return sorted(found, key=lambda t: (t.topic, t.partition))

    def _removes(self, tip: TopicIdPartition) -> bool:
        """Whether this broker removes ``tip``'s remote data: the leader of the metadata
        partition holding it does (every broker, in the one-broker setup)."""
        if self._leads_metadata_partition is None:
            return True
        partition = self.ctx.rlmm.metadata_partition(tip)
        return partition is None or self._leads_metadata_partition(partition)

    def _remove_partition(self, tip: TopicIdPartition) -> None:
        rlmm = self.ctx.rlmm
        if not self._removes(tip):
            # another broker leads its metadata partition and removes it (a leadership that
            # moves here later finds it in the periodic scan)
            with self._lock:
                self._removals.pop(tip, None)
            return
        if not rlmm.is_ready(tip):   # a cluster's metadata manager reads what it is assigned
            rlmm.on_partition_leadership_changes(set(), {tip})
            raise KafkaStorageError(f"remote log metadata of {tip} is not loaded yet")
        now = self.ctx.clock.milliseconds
        _P = RemotePartitionDeleteState
        for state in (_P.DELETE_PARTITION_MARKED, _P.DELETE_PARTITION_STARTED):
            try:
                rlmm.put_remote_partition_delete_metadata(
                    RemotePartitionDeleteMetadata(tip, state, now(), self.ctx.broker_id)).result()
            except ValueError:
                pass  # already past this state (a resumed removal)
        if self.manifests is not None:
            self.manifests.check_owner()
            self.manifests.partition_deleted(tip)   # before the segments it lists go
        expirer.delete_all_remote_segments(self.ctx, tip, lambda: self.ctx.stopping)
        if self.ctx.stopping:
            return
        rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
            tip, _P.DELETE_PARTITION_FINISHED, now(), self.ctx.broker_id)).result()
        rlmm.on_stop_partitions({tip})
        with self._lock:
            self._removals.pop(tip, None)
        log.info("%s: remote partition deleted", tip)

    # ---- reads -------------------------------------------------------------------------------

    def submit_read(self, ulog: UnifiedLog, fetch_offset: int, max_bytes: int,
                    isolation: FetchIsolation, min_one_message: bool
                    ) -> concurrent.futures.Future[FetchDataInfo]:
        """Queue a consumer read of ``fetch_offset`` from the remote tier on the reader pool.

        A full queue (``remote.log.reader.max.pending.tasks``) fails the future at once.
        """
        if not self._read_slots.acquire(blocking=False):
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_exception(KafkaStorageError("remote log reader queue is full"))
            return fut

        stats = self.reader_stats

        def run() -> FetchDataInfo:
            started = stats.started()
            try:
                return self.read(ulog, fetch_offset, max_bytes, isolation, min_one_message)
            finally:
                stats.finished(started)
                self._read_slots.release()
        stats.submitted()
        try:
            return self._readers.submit(run)
        except RuntimeError:
            stats.dropped()
            self._read_slots.release()
            raise KafkaStorageError("broker shutting down")

    def _tip(self, ulog: UnifiedLog) -> TopicIdPartition:
        topic_id = self._topic_id(ulog.topic_partition.topic)
        if topic_id is None:
            raise KafkaError(f"unknown topic {ulog.topic_partition.topic}",
                             code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return TopicIdPartition(topic_id, ulog.topic_partition)

    def segment_for_offset(self, ulog: UnifiedLog, offset: int
                           ) -> tuple[RemoteLogSegmentMetadata, int] | None:
        """The copied segment holding ``offset`` as the log has it or, past a gap, the next
        one above it; with the offset after the last one of it that is the log's
        (``lineage.lineage_end``: an old leader's copy may go on past where the log parted
        from its records, and Kafka's expirer leaves such copies to retention)."""
        tip = self._tip(ulog)
        entries = [(e.epoch, e.start_offset) for e in ulog.leader_epoch_cache.epoch_entries()]
        epoch = ulog.leader_epoch_cache.epoch_for_offset(offset)
        if epoch is not None:
            meta = self.ctx.rlmm.remote_log_segment_metadata(tip, epoch, offset)
            if meta is not None and (end := lineage_end(meta, entries)) > offset:
                return meta, end
        for m in self.copied_segments(tip):
            if m.end_offset >= offset \
                    and (end := lineage_end(m, entries)) > max(offset, m.start_offset):
                return m, end
        return None

    def read(self, ulog: UnifiedLog, fetch_offset: int, max_bytes: int,
             isolation: FetchIsolation, min_one_message: bool) -> FetchDataInfo:
        """Whole batches from the remote segment that holds ``fetch_offset`` (blocking)."""
        from strata.tiered.manager.remote_log_reader import read_remote_segment
        topic = ulog.topic_partition.topic
        try:
            found = self.segment_for_offset(ulog, fetch_offset)
            window, continues = self._read_ahead_window(ulog.topic_partition, fetch_offset)
            if window and not continues and found is not None:
                # a reader starting here: its read-ahead loads alongside its first chunk
                self._read_ahead_from(ulog, found[0], fetch_offset, None,
                                      max(max_bytes, 0) + window)
            while True:
                if found is None:
                    raise OffsetOutOfRangeError(
                        f"offset {fetch_offset} of {ulog.topic_partition} is not in remote storage")
                meta, upto = found
                result = read_remote_segment(self.ctx.rsm, self.ctx.index_cache, meta,
                                             fetch_offset, max_bytes, min_one_message, upto=upto)
                if not result.end_of_segment:
                    break
                # no batch of this segment (of the log's part of it) reaches the offset
                found = self.segment_for_offset(ulog, upto)
            aborted = None
            if isolation is FetchIsolation.TXN_COMMITTED:
                aborted = self._aborted_transactions(ulog, meta, fetch_offset, result.next_offset) \
                    if result.records else []
        except KafkaError:
            self.ctx.metrics.fetch_failed(topic)
            raise
        except Exception as exc:  # noqa: BLE001 - the consumer retries; never wrong data
            self.ctx.metrics.fetch_failed(topic)
            log.warning("remote read of %s at %d failed: %s", ulog.topic_partition, fetch_offset, exc)
            raise KafkaStorageError(f"remote read failed: {exc}") from exc
        self.ctx.metrics.fetched(topic, len(result.records))
        if self.ctx.quotas is not None:
            self.ctx.quotas.record_fetch(len(result.records))
        if result.records and window:
            with self._lock:
                self._read_ahead[ulog.topic_partition] = (result.next_offset, window)
            self._read_ahead_from(ulog, meta, result.next_offset,
                                  result.position + len(result.records), window)
        return result.to_fetch_data_info(aborted)

    def _read_ahead_window(self, tp: TopicPartition, fetch_offset: int) -> tuple[int, bool]:
        """The read-ahead for a read of ``tp`` at ``fetch_offset`` (0: the RSM does none), and
        whether the read continues where the partition's last one ended.

        A partition's first read starts at the RSM's ``prefetch_max_size``: at 50 ms a GET a
        consumer reading a few hundred MB/s needs about that much in flight, so a smaller start
        stalls it in its first chunks. Each read that continues the last one doubles the
        window (up to that size); each seek halves it (down to an eighth), so a random reader
        soon stops loading what it never reads."""
        most = self.ctx.rsm.prefetch_max_size
        if most <= 0:
            return 0, True
        with self._lock:
            last = self._read_ahead.get(tp)
        if last is None:
            return most, False
        if last[0] == fetch_offset:
            return min(last[1] * 2, most), True
        return max(last[1] // 2, most // 8, 1), False

    def _read_ahead_from(self, ulog: UnifiedLog, meta: RemoteLogSegmentMetadata, offset: int,
                         position: int | None, length: int) -> None:
        """Ask the RSM to load ``length`` bytes of the partition's remote log from byte
        ``position`` of ``meta`` (None: where ``offset`` is indexed), continuing into the next
        remote segments when that passes this one's end. When the range ends within
        ``prefetch_max_size`` of the segment's end, the next segment's manifest and indexes
        are warmed already, so crossing into it waits for no metadata."""
        most = self.ctx.rsm.prefetch_max_size
        try:
            if position is None:
                position = self.ctx.index_cache.lookup_offset(meta, offset)
            while True:
                past_end = self.ctx.rsm.prefetch(meta, position, length)
                if past_end == 0 and position + length + most < meta.segment_size_in_bytes:
                    return
                found = self.segment_for_offset(ulog, meta.end_offset + 1)
                if found is None:
                    return
                meta = found[0]
                # the reader's first fetch there looks up its offset index: have it ready too
                self.ctx.index_cache.prefetch(meta)
                if past_end == 0:
                    self.ctx.rsm.prefetch(meta, 0, 0)
                    return
                position, length = 0, past_end
        except Exception as exc:  # noqa: BLE001 - a hint; reads report real errors
            log.debug("read-ahead of %s failed: %s", ulog.topic_partition, exc)

    def _aborted_transactions(self, ulog: UnifiedLog, meta: RemoteLogSegmentMetadata,
                              start: int, upper: int) -> list:
        """Aborted transactions overlapping [start, upper): an entry sits in the segment of its
        abort marker, so the search goes on through later remote segments, then the local log,
        until an entry ends at or past ``upper`` (Kafka's collectAbortedTransactions)."""
        from strata.tiered.manager.remote_log_reader import search_aborted_transactions
        out: list = []
        later = [m for m in self.copied_segments(meta.topic_id_partition)
                 if m.start_offset > meta.end_offset]
        for m in [meta, *later]:
            found = search_aborted_transactions(self.ctx.index_cache, m, start, upper)
            out.extend(found.aborted_transactions)
            if found.is_complete:
                return out
        with ulog.lock:
            out.extend(ulog.local_log.collect_aborted_transactions(
                max(start, ulog.local_log_start_offset), upper))
        return out

    def find_offset_by_timestamp(self, ulog: UnifiedLog, timestamp: int):
        """The first offset with a timestamp ≥ ``timestamp`` in the remote tier, or None
        (only records the log has: not those of an old leader's copy past where the log
        parted from it)."""
        from strata.tiered.manager.remote_log_reader import find_offset_by_timestamp
        tip = self._tip(ulog)
        start = ulog.log_start_offset
        entries = [(e.epoch, e.start_offset) for e in ulog.leader_epoch_cache.epoch_entries()]
        for m in self.copied_segments(tip):
            if m.end_offset < start or m.max_timestamp_ms < timestamp:
                continue
            found = find_offset_by_timestamp(self.ctx.rsm, self.ctx.index_cache, m, timestamp,
                                             start)
            if found is not None and found.offset < lineage_end(m, entries):
                return found
        return None

    # ---- introspection -----------------------------------------------------------------------

    def describe(self, ulog: UnifiedLog) -> dict[str, int]:
        """Remote segment count and bytes of one partition (copied segments only)."""
        done = self.copied_segments(self._tip(ulog))
        return {"remote_segments": len(done),
                "remote_bytes": sum(m.segment_size_in_bytes for m in done)}

    def remote_segments(self, ulog: UnifiedLog) -> list[RemoteLogSegmentMetadata]:
        """Every live remote segment of one partition, in any state (metrics, tools)."""
        return list(self.ctx.rlmm.list_remote_log_segments(self._tip(ulog)))

    def copier_idle_fraction(self) -> float:
        """1 − copy tasks in flight / copier threads (Kafka's RemoteLogManagerTasksAvgIdlePercent,
        the copy pool's idle ratio)."""
        with self._lock:
            busy = sum(1 for p in self._partitions.values() if p.copy_task.running)
        threads = max(1, self.settings.copier_threads)
        return 1.0 - min(busy, threads) / threads

    def copy_lag(self, ulog: UnifiedLog) -> tuple[int, int]:
        """(bytes, segments) of inactive local segments not yet in remote storage."""
        with ulog.lock:
            highest = ulog.highest_offset_in_remote_storage
            segs = list(ulog.local_log.segments)[:-1]
        pending = [s for s in segs if s.base_offset > highest]
        return sum(s.size for s in pending), len(pending)
