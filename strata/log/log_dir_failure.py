"""LogDirFailureChannel: the one place where a failing disk becomes KAFKA_STORAGE_ERROR.

Writes to a log dir (appends, new partition logs, the cluster metadata file) run inside
``guard(log_dir, what)``. An ``OSError`` that means the storage itself failed (ENOSPC, EDQUOT,
EIO, EROFS) becomes ``KafkaStorageError`` (KAFKA_STORAGE_ERROR, retriable), with Kafka's
message ("Error while appending records to t-0 in dir /d"), and the dir counts as offline
(Kafka's ``OfflineLogDirectoryCount``) until a write there succeeds again: unlike Kafka, which
takes a failed dir offline until a restart, a dir that was full takes writes again as soon as
space returns. Other ``OSError``s pass through unchanged.

Logging: the first failure of a dir is logged once at ERROR without a traceback, further
failures at most once per ``repeat_interval_s`` with the count since, and the recovery once.

Listeners (``add_listener``) hear each dir going offline and coming back, on the thread whose
write changed it; a broker in a cluster reports its offline replicas from there
(``strata.replication.log_dir_failure_handler``). A dir that nothing writes to can only come
back through ``probe``: a small file written and fsynced in it.

Thread-safe; the hot path of a healthy broker reads one dict and takes no lock.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from strata.common.errors import KafkaStorageError

__all__ = ["PROBE_FILE", "STORAGE_ERRNOS", "LogDirFailureChannel"]

log = logging.getLogger(__name__)

# errnos of a disk that fails writes, rather than of a caller's mistake
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
# written and fsynced by ``probe``, then removed; one page, as a small append needs
PROBE_FILE = ".strata-log-dir-probe"
PROBE_BYTES = 4096


class _DirLog:
    """What was logged about one dir: when its last failure line went out, the failures not
    logged since, and whether a recovery line is owed."""

    def __init__(self) -> None:
        self.logged_at: float | None = None
        self.unlogged = 0
        self.recovery_owed = False


class LogDirFailureChannel:
    """Which log dirs fail their writes right now (see the module docstring)."""

    def __init__(self, repeat_interval_s: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.repeat_interval_s = repeat_interval_s
        self._monotonic = monotonic
        self._failing: set[Path] = set()
        self._logs: dict[Path, _DirLog] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Path, bool], None]] = []

    def add_listener(self, listener: Callable[[Path, bool], None]) -> None:
        """``listener(log_dir, online)`` after each change of a dir's state, on the writing
        thread: it must not block."""
        self._listeners.append(listener)

    def offline_dirs(self) -> frozenset[Path]:
        """The log dirs whose last write failed."""
        with self._lock:
            return frozenset(self._failing)

    def probe(self, log_dir: Path) -> bool:
        """Writes and fsyncs ``PROBE_FILE`` in ``log_dir`` under ``guard`` (so success brings
        the dir back), then removes it; whether the write succeeded."""
        path = Path(log_dir) / PROBE_FILE
        try:
            with self.guard(log_dir, "probing the log dir"):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    if os.write(fd, b"\0" * PROBE_BYTES) < PROBE_BYTES:   # a short write: full
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except (KafkaStorageError, OSError):
            ok = False
        else:
            ok = True
        try:
            path.unlink()
        except OSError:
            pass
        return ok

    def _tell(self, log_dir: Path, online: bool) -> None:
        for listener in list(self._listeners):
            try:
                listener(log_dir, online)
            except Exception:  # noqa: BLE001 - a listener must not fail the write
                log.exception("log dir listener failed for %s", log_dir)

    def offline_log_directory_count(self) -> int:
        """Log dirs whose last write failed (Kafka's ``OfflineLogDirectoryCount``)."""
        return len(self._failing)

    def guard(self, log_dir: Path, what: str) -> _Guard:
        """A context for a write to ``log_dir``: a storage failure raises KafkaStorageError
        ("Error while {what} in dir {log_dir}") and marks the dir offline; success marks it
        online again. A KafkaStorageError already mapped from such an OSError below (producer
        snapshots) marks it offline too, and passes unchanged."""
        return _Guard(self, log_dir, what)

    def _failed(self, log_dir: Path, message: str, e: OSError) -> None:
        now = self._monotonic()
        with self._lock:
            new = log_dir not in self._failing
            self._failing.add(log_dir)
            dl = self._logs.setdefault(log_dir, _DirLog())
            if dl.logged_at is not None and now - dl.logged_at < self.repeat_interval_s:
                dl.unlogged += 1
                logged = False
            else:
                suppressed, dl.unlogged, dl.logged_at, dl.recovery_owed = dl.unlogged, 0, now, True
                logged = True
        if logged:
            more = f" ({suppressed} more failed write(s) since the last report)" if suppressed else ""
            log.error("%s: %s; log dir %s is offline until a write succeeds, clients get "
                      "KAFKA_STORAGE_ERROR meanwhile%s", message, e, log_dir, more)
        if new:
            self._tell(log_dir, False)

    def _recovered(self, log_dir: Path) -> None:
        with self._lock:
            if log_dir not in self._failing:
                return
            self._failing.discard(log_dir)
            dl = self._logs[log_dir]
            owed, dl.recovery_owed = dl.recovery_owed, False
        if owed:
            log.warning("log dir %s takes writes again", log_dir)
        self._tell(log_dir, True)


class _Guard:
    """``LogDirFailureChannel.guard`` (a class, not a generator: it runs on every append)."""

    __slots__ = ("channel", "log_dir", "what")

    def __init__(self, channel: LogDirFailureChannel, log_dir: Path, what: str) -> None:
        self.channel, self.log_dir, self.what = channel, log_dir, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, e: BaseException | None, tb: object) -> bool:
        channel = self.channel
        if e is None:
            if channel._failing:
                channel._recovered(Path(self.log_dir))
            return False
        cause = e if isinstance(e, OSError) else e.__cause__ \
            if isinstance(e, KafkaStorageError) else None
        if not isinstance(cause, OSError) or cause.errno not in STORAGE_ERRNOS:
            return False
        message = f"Error while {self.what} in dir {self.log_dir}"
        channel._failed(Path(self.log_dir), message, cause)
        if cause is e:
            raise KafkaStorageError(f"{message}: {cause.strerror or cause}") from cause
        return False
