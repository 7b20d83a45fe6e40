"""LogManager: every partition log under the broker's ``log.dirs``, as Kafka keeps them.

Per log dir: one subdirectory per partition (``topic-partition``), the checkpoint files
``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``, and the
``.kafka_cleanshutdown`` marker written after a clean shutdown and removed once the logs are
loaded (its absence at start means every log recovers from its recovery point).

Thread-safety: the log map is guarded by a lock; each log guards itself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Callable, Iterable

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.files import atomic_write, fsync_dir
from strata.common.scheduler import ImmediateScheduler, Scheduler
from strata.common.types import TopicPartition
from strata.log.checkpoint import OffsetCheckpointFile
from strata.log.log_config import LogConfig
from strata.log.log_dir_failure import LogDirFailureChannel
from strata.log.unified_log import UnifiedLog

log = logging.getLogger(__name__)

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
DELETE_DIR_SUFFIX = "-delete"
CORDONED_LOG_DIRS_PROP = "cordoned.log.dirs"   # KIP-1066 (Kafka 4.4), dynamic


def cordoned_log_dirs(value: str | None, log_dirs: Iterable[str | Path]) -> list[str]:
    """The entries of a ``cordoned.log.dirs`` value (comma-separated; ``*``: every log dir)."""
    entries = [e.strip() for e in str(value or "").split(",") if e.strip()]
    return [str(d) for d in log_dirs] if entries == ["*"] else entries


def cordoned_log_dirs_error(value: str | None, log_dirs: Iterable[str | Path],
                            dynamic: bool = False) -> str | None:
    """Kafka 4.4's refusal of a ``cordoned.log.dirs`` value, or None: ``*`` alone, else
    entries of ``log.dirs`` (KafkaConfig's wording at startup, DynamicLogConfig's for a
    dynamic change)."""
    entries = [e.strip() for e in str(value or "").split(",") if e.strip()]
    if "*" in entries and entries != ["*"]:
        return "When cordoned.log.dirs is set to *, it must not contain other values"
    known = {str(d) for d in log_dirs}
    missing = [e for e in cordoned_log_dirs(value, log_dirs) if e not in known]
    if not missing:
        return None
    if dynamic:
        return (f"Invalid value {value} for configuration {CORDONED_LOG_DIRS_PROP}: Invalid "
                f"entry in cordoned.log.dirs: {missing[0]}. All cordoned log dirs must be "
                "entries of log.dirs or log.dir.")
    return ("All entries in cordoned.log.dirs must be present in log.dirs or log.dir. Missing "
            f"entries : [{', '.join(missing)}]")


class LogManager:
    def __init__(self, log_dirs: Iterable[Path], default_config: LogConfig, *,
                 topic_config: Callable[[str], LogConfig] | None = None,
                 clock: Clock = SYSTEM_CLOCK, scheduler: Scheduler | None = None,
                 producer_id_expiration_ms: int = 86_400_000,
                 dir_failures: LogDirFailureChannel | None = None,
                 replicated: bool = False):
        """``replicated`` (a broker in a cluster): high watermarks are checkpointed in
        ``replication-offset-checkpoint`` and restored from it, as Kafka's replica manager does,
        so a restarted replica never takes records the ISR may not have for committed."""
        self.log_dirs = [Path(d) for d in log_dirs]
        self.replicated = replicated
        # the log dirs failing writes now (their logs share it)
        self.dir_failures = dir_failures or LogDirFailureChannel()
        self.default_config = default_config
        self._topic_config = topic_config or (lambda topic: default_config)
        self._clock = clock
        self._scheduler = scheduler or ImmediateScheduler()
        self._pid_expiration_ms = producer_id_expiration_ms
        self._logs: dict[TopicPartition, UnifiedLog] = {}
        self._log_dir_of: dict[TopicPartition, Path] = {}
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        # held by a deletion from start to end; shutdown takes it, so it never closes a log
        # a deletion is renaming, and no deletion starts once it has
        self._delete_lock = threading.Lock()
        self._shutting_down = False
        self._recovery_checkpoints = {d: OffsetCheckpointFile(d / RECOVERY_POINT_CHECKPOINT)
                                      for d in self.log_dirs}
        self._start_offset_checkpoints = {d: OffsetCheckpointFile(d / LOG_START_OFFSET_CHECKPOINT)
                                          for d in self.log_dirs}
        self._high_watermark_checkpoints = {d: OffsetCheckpointFile(d / HIGH_WATERMARK_CHECKPOINT)
                                            for d in self.log_dirs}
        self.had_clean_shutdown: dict[Path, bool] = {}
        # KIP-1066: log dirs that take no new partition (their logs stay); absolute paths
        self.cordoned: frozenset[Path] = frozenset()

    # ---- startup ----------------------------------------------------------------------------

    def startup(self) -> None:
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
            self._load_dir(d)

    def _load_dir(self, log_dir: Path) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        self.had_clean_shutdown[log_dir] = clean
        recovery_points = self._recovery_checkpoints[log_dir].read()
        start_offsets = self._start_offset_checkpoints[log_dir].read()
        high_watermarks = self._high_watermark_checkpoints[log_dir].read() if self.replicated else {}
        for sub in sorted(log_dir.iterdir()):
            if not sub.is_dir() or sub.name.startswith("."):
                continue
            if sub.name.endswith(DELETE_DIR_SUFFIX):
                shutil.rmtree(sub, ignore_errors=True)
                continue
            try:
                tp = TopicPartition.from_dir_name(sub.name)
            except ValueError:
                continue
            ulog = UnifiedLog(sub, self._topic_config(tp.topic),
                              recovery_point=recovery_points.get(tp, 0),
                              log_start_offset=start_offsets.get(tp, 0),
                              had_clean_shutdown=clean, clock=self._clock,
                              scheduler=self._scheduler, topic_partition=tp,
                              producer_id_expiration_ms=self._pid_expiration_ms,
                              dir_failures=self.dir_failures,
                              high_watermark=high_watermarks.get(tp, 0) if self.replicated else None)
            self._logs[tp] = ulog
            self._log_dir_of[tp] = log_dir
        loaded = sum(1 for d in self._log_dir_of.values() if d == log_dir)
        log.info("loaded %d logs from %s (%s)", loaded, log_dir,
                 "clean shutdown" if clean else "unclean shutdown: recovered" if loaded else "new")
        marker.unlink(missing_ok=True)
        fsync_dir(log_dir)

    # ---- lookup and creation ----------------------------------------------------------------

    def get_log(self, tp: TopicPartition) -> UnifiedLog | None:
        return self._logs.get(tp)

    def all_logs(self) -> list[UnifiedLog]:
        with self._lock:
            return list(self._logs.values())

    def logs_with_dirs(self) -> list[tuple[Path, TopicPartition, UnifiedLog]]:
        """(log dir, partition, log) of every log: what the log cleaner walks."""
        with self._lock:
            return [(self._log_dir_of[tp], tp, ulog) for tp, ulog in self._logs.items()]

    def partitions(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._logs)

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None) -> UnifiedLog:
        with self._lock:
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            log_dir = self._next_log_dir()
            with self.dir_failures.guard(log_dir, f"creating log for {tp}"):
                ulog = UnifiedLog(log_dir / f"{tp.topic}-{tp.partition}",
                                  config or self._topic_config(tp.topic), clock=self._clock,
                                  scheduler=self._scheduler, topic_partition=tp,
                                  producer_id_expiration_ms=self._pid_expiration_ms,
                                  dir_failures=self.dir_failures)
                # no fsync of the parent dir: Kafka's createLogDirectory makes none (one per
                # new partition was most of a broker's time creating many topics, issue 50)
            self._logs[tp] = ulog
            self._log_dir_of[tp] = log_dir
            return ulog

    def update_cordoned_log_dirs(self, dirs: Iterable[str | Path]) -> None:
        """The log dirs ``cordoned.log.dirs`` names now (entries of ``log_dirs``)."""
        self.cordoned = frozenset(Path(d).absolute() for d in dirs)

    def is_cordoned(self, log_dir: str | Path) -> bool:
        return Path(log_dir).absolute() in self.cordoned

    def _next_log_dir(self) -> Path:
        """The log dir with the fewest logs among those not cordoned; as Kafka 4.4's
        ``LogManager.nextLogDirs``, with every dir cordoned the first one (the controller
        keeps new partitions off such a broker: ``all_log_dirs_cordoned``)."""
        counts = {d: 0 for d in self.log_dirs}
        for d in self._log_dir_of.values():
            counts[d] = counts.get(d, 0) + 1
        open_dirs = [d for d in self.log_dirs if not self.is_cordoned(d)]
        if not open_dirs:
            return self.log_dirs[0]
        return min(open_dirs, key=lambda d: counts[d])

    def all_log_dirs_cordoned(self) -> bool:
        return all(self.is_cordoned(d) for d in self.log_dirs)

    def delete_log(self, tp: TopicPartition) -> None:
        """Close the log and rename its directory ``-delete``; the files go in the background.
        Refused (logged) once ``shutdown`` has begun: the log is closed and kept."""
        with self._delete_lock:
            with self._lock:
                if self._shutting_down:
                    if tp in self._logs:
                        log.warning("not deleting the log of %s: the log manager is shutting "
                                    "down", tp)
                    return
                ulog = self._logs.pop(tp, None)
                log_dir = self._log_dir_of.pop(tp, None)
            if ulog is None or log_dir is None:
                return
            ulog.local_log.close()
            target = log_dir / f"{tp.topic}-{tp.partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
            os.rename(ulog.directory, target)
            fsync_dir(log_dir)
            self._scheduler.schedule_once(f"delete-{target.name}",
                                          lambda: shutil.rmtree(target, ignore_errors=True),
                                          self.default_config.get("file.delete.delay.ms"))
            self.checkpoint()

    # ---- periodic work ----------------------------------------------------------------------

    def cleanup_logs(self) -> int:
        """One retention pass over every log (``log.retention.check.interval.ms``)."""
        deleted = 0
        for ulog in self.all_logs():
            deleted += ulog.delete_old_segments()
        return deleted

    def flush_dirty_logs(self) -> None:
        """``flush.ms``: flush logs whose last flush is older than their setting."""
        for ulog in self.all_logs():
            ulog.flush_if_due()

    def checkpoint(self) -> None:
        """Write both offset checkpoints for every log dir (one writer at a time: they share tmp files)."""
        by_dir: dict[Path, dict[TopicPartition, UnifiedLog]] = {d: {} for d in self.log_dirs}
        with self._lock:
            for tp, ulog in self._logs.items():
                by_dir[self._log_dir_of[tp]][tp] = ulog
        with self._checkpoint_lock:
            for d, logs in by_dir.items():
                self._recovery_checkpoints[d].write(
                    {tp: ul.recovery_point for tp, ul in logs.items()})
                self._start_offset_checkpoints[d].write(
                    {tp: ul.log_start_offset for tp, ul in logs.items()
                     if ul.log_start_offset > ul.local_log.first_segment.base_offset
                     or ul.remote_log_enabled})
        if self.replicated:
            self.checkpoint_high_watermarks()

    def checkpoint_high_watermarks(self) -> None:
        """``replication-offset-checkpoint`` of every log dir (a cluster's brokers, every
        ``replica.high.watermark.checkpoint.interval.ms`` and at shutdown)."""
        by_dir: dict[Path, dict[TopicPartition, int]] = {d: {} for d in self.log_dirs}
        with self._lock:
            for tp, ulog in self._logs.items():
                by_dir[self._log_dir_of[tp]][tp] = ulog.high_watermark
        with self._checkpoint_lock:
            for d, hws in by_dir.items():
                self._high_watermark_checkpoints[d].write(hws)

    # ---- shutdown ---------------------------------------------------------------------------

    def shutdown(self, broker_epoch: int = -1) -> None:
        """Close every log, write the checkpoints, then the clean-shutdown markers. A deletion
        under way finishes first; none starts after."""
        with self._delete_lock, self._lock:
            self._shutting_down = True
        for ulog in self.all_logs():
            ulog.close()
        self.checkpoint()
        for d in self.log_dirs:
            atomic_write(d / CLEAN_SHUTDOWN_FILE,
                         json.dumps({"version": 0, "broker_epoch": broker_epoch}).encode())
