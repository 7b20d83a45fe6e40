"""A small synchronous object store: the dumb layer under the segment-aware RemoteStorageManager.

Keys are ``/``-separated relative strings (no leading ``/``, no empty, ``.`` or ``..`` parts).
Every backend raises ``RemoteResourceNotFoundException`` for a missing object, and wraps every
other failure in ``RemoteStorageException`` (``RetriableRemoteStorageException`` when it is
transient: connection errors, timeouts, throttling, 5xx). Calls block and may come from several
threads at once; every backend here is thread-safe.

Throttling responses (S3's 503 SlowDown, HTTP 429) raise ``ThrottledRemoteStorageException``,
a ``RetriableRemoteStorageException``: callers treat it like any other transient error.

Backends: ``FileSystemObjectStore`` (a directory tree), ``MemoryObjectStore`` (unit tests),
``ObstoreObjectStore`` (S3, GCS, Azure, HTTP through ``obstore``). Decorators:
``FaultInjectingObjectStore`` (latency, bandwidth, failures, throttling), ``MeteredObjectStore``
(requests, bytes and estimated request cost per operation and topic) and
``UploadRateLimitedObjectStore`` (a token bucket on uploaded bytes). ``object_store_from_config``
builds the chain from the RSM configuration, innermost first: the backend (``storage.*``), the
fault injector (any ``fault.*`` key), the meter (always), the upload limiter
(``upload.rate.limit.bytes.per.second``). ``find_layer`` finds a decorator in a chain.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import logging
import math
import mmap
import os
import random
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from strata.common.files import fsync_dir
from strata.common.rate import TokenBucket
from strata.tiered.api import (
    RemoteResourceNotFoundException, RemoteStorageException, RetriableRemoteStorageException)
from strata.tiered.storage.s3_uploads import S3MultipartUploads

logger = logging.getLogger(__name__)

__all__ = [
    "FaultInjectingObjectStore",
    "FileSystemObjectStore",
    "MemoryObjectStore",
    "MeteredObjectStore",
    "ObjectStore",
    "ObstoreObjectStore",
    "RequestPrices",
    "ThrottledRemoteStorageException",
    "UploadRateLimitedObjectStore",
    "find_layer",
    "object_store_from_config",
    "topic_of_key",
]


class ThrottledRemoteStorageException(RetriableRemoteStorageException):
    """The store asked the client to slow down (S3 ``503 SlowDown``, HTTP 429): transient."""


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or any(
            part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}")
    return key


class ObjectStore(abc.ABC):
    """Whole-object puts, ranged gets, deletes and prefix listings over one bucket or root.

    A put is atomic: readers see the old object, the new one, or none, never a partial one.
    ``list`` uses plain string-prefix matching and returns keys in no promised order.
    """

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object ``key`` with ``data``."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Create or replace ``key`` with the content of the local file ``path``, streamed
        (multipart for big files where the backend supports it)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        """Bytes ``[start, end_exclusive)`` of the object, clamped to its end: empty when
        ``start`` is at or past the end or the range is empty (the object must still exist)."""

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        """``get_range`` as a read-only buffer, without a copy where the backend can (a file
        mapped into memory, the HTTP client's own buffer): for ranges that are kept, like
        cached chunks."""
        return self.get_range(key, start, end_exclusive)

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object; a missing object is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every key; missing objects are not an error."""
        for key in keys:
            self.delete(key)

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``."""

    def abort_incomplete_uploads(self, prefix: str = "", older_than_ms: int = 0) -> list[str]:
        """Remove what interrupted uploads of keys under ``prefix`` left behind (a crash
        mid-write: temporary files, S3 multipart uploads never completed) once it is at least
        ``older_than_ms`` old; the keys of the uploads removed. Uploads this process has in
        progress are never removed, whatever their age. A decorator passes the call to its
        ``inner`` store; a store whose puts leave nothing behind (memory) removes nothing."""
        inner = getattr(self, "inner", None)
        return inner.abort_incomplete_uploads(prefix, older_than_ms) if inner is not None else []

    def close(self) -> None:
        """Release resources; no other method is called afterwards."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_range(start: int, end_exclusive: int) -> None:
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if end_exclusive < 0:
        raise ValueError(f"end_exclusive must be >= 0, got {end_exclusive}")


# --------------------------------------------------------------------------- memory


class MemoryObjectStore(ObjectStore):
    """Objects in a dict, for unit tests. Thread-safe; ``objects`` is a snapshot copy."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def objects(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self._objects)

    def put(self, key: str, data: bytes) -> None:
        value = bytes(data)
        with self._lock:
            self._objects[_check_key(key)] = value

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise RemoteStorageException(f"cannot read {path} to upload as {key}: {e}") from e
        self.put(key, data)

    def _object(self, key: str) -> bytes:
        with self._lock:
            try:
                return self._objects[_check_key(key)]
            except KeyError:
                raise RemoteResourceNotFoundException(f"object {key} not found") from None

    def get(self, key: str) -> bytes:
        return self._object(key)

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        _check_range(start, end_exclusive)
        return self._object(key)[start:end_exclusive]

    def size(self, key: str) -> int:
        return len(self._object(key))

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(_check_key(key), None)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        with self._lock:
            found = [(k, len(v)) for k, v in self._objects.items() if k.startswith(prefix)]
        return iter(sorted(found))


# --------------------------------------------------------------------------- file system


_TMP_MARK = ".strata-tmp-"
_MAP_MIN_BYTES = 256 * 1024    # smaller ranges are read: a mapping costs more than the copy


class FileSystemObjectStore(ObjectStore):
    """Objects as files under ``root``; the key's ``/`` parts are directories.

    A put writes ``<dir>/<name>.strata-tmp-<random>``, fsyncs it, renames it over the key and
    fsyncs the directory, so a reader (or a crash) never sees a partial object. A temporary
    file left by a crash is skipped by ``list`` and removed by ``abort_incomplete_uploads``;
    the ones of this object's puts in progress are tracked, and never removed. A delete
    removes directories it leaves empty.
    """

    def __init__(self, root: str | os.PathLike[str], *, sync: bool = True) -> None:
        self.root = Path(root).absolute()
        self.sync = sync
        self._writing: set[Path] = set()     # temporary files of the puts in progress
        self._writing_lock = threading.Lock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RemoteStorageException(f"cannot create object store root {self.root}: {e}") from e

    def __repr__(self) -> str:
        return f"FileSystemObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_check_key(key).split("/"))

    def _write(self, key: str, write: Callable[[Any], None]) -> None:
        path = self._path(key)
        tmp = path.with_name(f"{path.name}{_TMP_MARK}{uuid.uuid4().hex}")
        with self._writing_lock:
            self._writing.add(tmp)
        try:
            # A concurrent delete may prune the directory while it is made (mkdir finds it,
            # EEXIST, then no directory; or a parent goes, ENOENT) or before the temporary file
            # is in it (open: ENOENT): make it again then.
            for attempt in range(3):
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    f = open(tmp, "xb")
                    break
                except (FileNotFoundError, FileExistsError):
                    if attempt == 2:
                        raise
            with f:
                write(f)
                if self.sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            if isinstance(e, OSError):
                raise RemoteStorageException(f"cannot write object {key}: {e}") from e
            raise
        finally:
            with self._writing_lock:
                self._writing.discard(tmp)
        if self.sync:
            fsync_dir(path.parent)

    def put(self, key: str, data: bytes) -> None:
        self._write(key, lambda f: f.write(data))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        try:
            src = open(path, "rb", buffering=0)    # reads return what has arrived
        except OSError as e:
            raise RemoteStorageException(f"cannot read {path} to upload as {key}: {e}") from e
        with src:
            self._write(key, lambda f: shutil.copyfileobj(src, f, 1024 * 1024))

    def _fail(self, key: str, e: OSError) -> NoReturn:
        if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            raise RemoteResourceNotFoundException(f"object {key} not found") from e
        raise RemoteStorageException(f"object {key}: {e}") from e

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            self._fail(key, e)

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        _check_range(start, end_exclusive)
        try:
            with open(self._path(key), "rb") as f:
                if end_exclusive <= start:
                    return b""
                f.seek(start)
                return f.read(end_exclusive - start)
        except OSError as e:
            self._fail(key, e)

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        """A view of the file mapped read-only: the range is not copied out of the page
        cache (objects are replaced by rename, never rewritten, so the mapping stays valid)."""
        _check_range(start, end_exclusive)
        if end_exclusive - start < _MAP_MIN_BYTES:
            return self.get_range(key, start, end_exclusive)
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start >= size:
                    return b""
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            self._fail(key, e)
        return memoryview(mapped)[start:min(end_exclusive, size)]

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            if path.is_dir():
                raise IsADirectoryError(str(path))
            return path.stat().st_size
        except OSError as e:
            self._fail(key, e)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        except OSError as e:
            raise RemoteStorageException(f"cannot delete object {key}: {e}") from e
        self._prune(path.parent)

    def _prune(self, parent: Path) -> None:
        """Remove directories left empty, as an object store has none (best effort, racy by
        design: rmdir fails on a directory that a concurrent put has just filled)."""
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def _walk(self, prefix: str, temporary: bool) -> Iterator[tuple[str, str]]:
        """``(key, file path)`` of the objects (or, ``temporary``, of the leftover temporary
        files, by the key they were for) whose key starts with ``prefix``; walks only below
        the deepest directory the prefix names."""
        base = prefix.rpartition("/")[0]
        top = self.root.joinpath(*base.split("/")) if base else self.root
        if not top.is_dir():
            return
        for dirpath, _dirs, files in os.walk(top):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if (_TMP_MARK in name) != temporary:
                    continue
                name_of_key = name.partition(_TMP_MARK)[0]
                key = name_of_key if rel == "." else f"{rel}/{name_of_key}"
                if key.startswith(prefix):
                    yield key, os.path.join(dirpath, name)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for key, path in self._walk(prefix, temporary=False):
            try:
                found.append((key, os.stat(path).st_size))
            except FileNotFoundError:
                continue    # deleted while listing
        return iter(sorted(found))

    def abort_incomplete_uploads(self, prefix: str = "", older_than_ms: int = 0) -> list[str]:
        """Delete the temporary files of crashed puts last modified ``older_than_ms`` ago or
        earlier (the age keeps the puts of other processes sharing the tree)."""
        cutoff = time.time() - older_than_ms / 1000.0
        removed: list[str] = []
        for key, name in self._walk(prefix, temporary=True):
            path = Path(name)
            with self._writing_lock:
                if path in self._writing:
                    continue
            try:
                if path.stat().st_mtime > cutoff:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue    # renamed or removed meanwhile
            except OSError as e:
                raise RemoteStorageException(f"cannot remove {path}: {e}") from e
            removed.append(key)
            self._prune(path.parent)
        return removed


# --------------------------------------------------------------------------- obstore


# Substrings (lowercase) of obstore error messages that mean "try again later".
_TRANSIENT_MARKERS = (
    "http error", "error sending request", "timed out", "timeout", "connection", "connect error",
    "broken pipe", "reset by peer", "status code: 5", "429", "too many requests", "slowdown",
    "slow down", "service unavailable", "internal error", "incomplete", "unexpected eof",
)
# Substrings (lowercase) that mean the store is throttling this client.
_THROTTLE_MARKERS = ("slowdown", "slow down", "429", "too many requests",
                     "reduce your request rate")
# Range requests that start at or past the end of an object.
_RANGE_PAST_END_MARKERS = ("416", "invalidrange", "range not satisfiable", "starttoolarge")

# Option names obstore takes as client options (they must not go into the store config).
_CLIENT_OPTIONS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "default_headers", "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "root_certificate",
    "randomize_addresses", "read_timeout", "timeout", "user_agent",
})


def _obstore_error(op: str, key: str, e: BaseException) -> RemoteStorageException:
    """The Strata exception for an obstore failure of ``op`` on ``key``."""
    import obstore.exceptions as oe

    first_line = str(e).split("\n", 1)[0]
    message = f"{op} {key}: {type(e).__name__}: {first_line}"
    if isinstance(e, (FileNotFoundError, oe.NotFoundError)):
        return RemoteResourceNotFoundException(message)
    if isinstance(e, (TimeoutError, ConnectionError)):
        return RetriableRemoteStorageException(message)
    if isinstance(e, (oe.PermissionDeniedError, oe.UnauthenticatedError, oe.InvalidPathError,
                      oe.NotSupportedError, oe.UnknownConfigurationKeyError, ValueError, TypeError)):
        return RemoteStorageException(message)
    text = str(e).lower()
    if any(marker in text for marker in _THROTTLE_MARKERS):
        return ThrottledRemoteStorageException(message)
    if any(marker in text for marker in _TRANSIENT_MARKERS):
        return RetriableRemoteStorageException(message)
    return RemoteStorageException(message)


class ObstoreObjectStore(ObjectStore):
    """Objects in S3, GCS, Azure Blob or over HTTP, through ``obstore`` (thread-safe; calls
    release the GIL while the Rust client works).

    ``put_file`` streams the file and switches to a multipart upload above
    ``multipart_chunk_size``. obstore's own retries (``retry_config``) run inside each call;
    what still fails is translated as the module docstring says.

    Incomplete multipart uploads: obstore cannot list or abort them, so on S3 with static
    credentials ``uploads`` (``S3MultipartUploads``) does; a failed ``put_file`` aborts the
    uploads of its key at once, and ``abort_incomplete_uploads`` the old ones of any key but
    those this object is uploading. Elsewhere nothing is removed: GCS resumable sessions and
    Azure's uncommitted blocks expire by themselves after a week, and S3 without static
    credentials needs a lifecycle rule.
    """

    def __init__(self, store: Any, *, multipart_chunk_size: int = 8 * 1024 * 1024,
                 multipart_concurrency: int = 4, description: str | None = None,
                 uploads: S3MultipartUploads | None = None) -> None:
        self._store = store
        self.multipart_chunk_size = multipart_chunk_size
        self.multipart_concurrency = multipart_concurrency
        self._description = description or repr(store)
        self.uploads = uploads
        self._uploading: dict[str, int] = {}    # key -> put_file calls in progress
        self._uploading_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, config: Mapping[str, Any] | None = None,
                 client_options: Mapping[str, Any] | None = None,
                 retry_config: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> ObstoreObjectStore:
        """Build over ``obstore.store.from_url(url, config=..., client_options=..., retry_config=...)``."""
        from obstore.store import from_url

        try:
            store = from_url(url, config=dict(config or {}) or None,
                             client_options=dict(client_options or {}) or None,
                             retry_config=dict(retry_config or {}) or None)
        except BaseException as e:  # obstore panics surface as BaseException subclasses
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise RemoteStorageException(f"cannot open object store {url}: {e}") from e
        return cls(store, description=url,
                   uploads=S3MultipartUploads.from_config(url, dict(config or {})), **kwargs)

    def __repr__(self) -> str:
        return f"ObstoreObjectStore({self._description!r})"

    def _call(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RemoteStorageException:
            raise
        except Exception as e:
            raise _obstore_error(op, key, e) from e

    def put(self, key: str, data: bytes) -> None:
        import obstore

        _check_key(key)
        self._call("put", key, lambda: obstore.put(self._store, key, bytes(data), use_multipart=False))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        import obstore

        _check_key(key)
        try:
            src = open(path, "rb")
        except OSError as e:
            raise RemoteStorageException(f"cannot read {path} to upload as {key}: {e}") from e
        with self._uploading_lock:
            self._uploading[key] = self._uploading.get(key, 0) + 1
        try:
            with src:
                self._call("put", key, lambda: obstore.put(
                    self._store, key, src, chunk_size=self.multipart_chunk_size,
                    max_concurrency=self.multipart_concurrency))
        except RemoteStorageException:
            self._abort_uploads_of(key)
            raise
        finally:
            with self._uploading_lock:
                if self._uploading[key] == 1:
                    del self._uploading[key]
                else:
                    self._uploading[key] -= 1

    def _abort_uploads_of(self, key: str) -> None:
        """After a failed put_file: abort what it may have left of a multipart upload (best
        effort; unless another put of the key is in progress here)."""
        if self.uploads is None or self._uploading.get(key, 0) > 1:
            return
        try:
            for up in self.uploads.list(key):
                if up.key == key:
                    self.uploads.abort(up.key, up.upload_id)
        except RemoteStorageException as e:
            logger.warning("cannot abort the multipart upload of %s (the sweep will): %s", key, e)

    def abort_incomplete_uploads(self, prefix: str = "", older_than_ms: int = 0) -> list[str]:
        if self.uploads is None:
            return []
        cutoff = time.time() * 1000 - older_than_ms
        removed = []
        for up in self.uploads.list(prefix):
            with self._uploading_lock:
                if up.key in self._uploading:
                    continue
            if up.initiated_ms <= cutoff:
                self.uploads.abort(up.key, up.upload_id)
                removed.append(up.key)
        return removed

    def get(self, key: str) -> bytes:
        import obstore

        _check_key(key)
        return self._call("get", key, lambda: bytes(obstore.get(self._store, key).bytes()))

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return bytes(self.get_range_buffer(key, start, end_exclusive))

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        """A view of the client's buffer of the response body (no copy)."""
        import obstore

        _check_key(key)
        _check_range(start, end_exclusive)
        if end_exclusive <= start:
            self.size(key)  # an empty range still requires the object to exist
            return b""
        try:
            return memoryview(obstore.get_range(self._store, key, start=start, end=end_exclusive))
        except Exception as e:
            error = _obstore_error("get_range", key, e)
            if not isinstance(error, RemoteResourceNotFoundException) and any(
                    m in str(e).lower() for m in _RANGE_PAST_END_MARKERS):
                return b""  # the range starts at or past the end of an existing object
            raise error from e

    def size(self, key: str) -> int:
        import obstore

        _check_key(key)
        return int(self._call("head", key, lambda: obstore.head(self._store, key)["size"]))

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Iterable[str]) -> None:
        import obstore

        batch = [_check_key(k) for k in keys]
        if not batch:
            return
        try:
            obstore.delete(self._store, batch if len(batch) > 1 else batch[0])
        except Exception as e:
            error = _obstore_error("delete", batch[0], e)
            if not isinstance(error, RemoteResourceNotFoundException):
                raise error from e
            # Some backends (local, memory) fail a whole batch on one missing key.
            for key in batch:
                try:
                    obstore.delete(self._store, key)
                except Exception as e1:
                    error = _obstore_error("delete", key, e1)
                    if not isinstance(error, RemoteResourceNotFoundException):
                        raise error from e1

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        import obstore

        # obstore matches whole path segments; list the prefix's directory, filter by string.
        base = prefix.rpartition("/")[0]

        def run() -> list[tuple[str, int]]:
            found = []
            for batch in obstore.list(self._store, prefix=base or None):
                for meta in batch:
                    if meta["path"].startswith(prefix):
                        found.append((meta["path"], int(meta["size"])))
            return found

        return iter(sorted(self._call("list", prefix, run)))

    def close(self) -> None:
        self._store = None


# --------------------------------------------------------------------------- fault injection


def _file_size(path: str | os.PathLike[str]) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0   # the inner store reports the unreadable file


class FaultInjectingObjectStore(ObjectStore):
    """Wraps a store and injects latency, bandwidth limits, throttling and failures, for tests
    and benchmarks.

    Before each call: while ``set_outage(True)`` is in force, it fails; a key matching
    ``fail_keys`` (regex, ``re.search``) fails; with probability ``error_rate`` it fails; with
    probability ``throttle_rate`` it is throttled; a key matching ``delay_keys`` sleeps
    ``delay_ms``; gets (get, get_range, size, list) sleep ``get_latency_ms`` and puts
    ``put_latency_ms``. Failures are ``RetriableRemoteStorageException``, throttled calls
    ``ThrottledRemoteStorageException`` (S3's "503 SlowDown"); either way the inner store is not
    called. Bandwidth: a put sleeps ``len / put_bandwidth_bps`` seconds before it reaches the
    inner store, a get or ranged get ``len / get_bandwidth_bps`` after (0: unlimited), as if
    every transfer ran at that speed. ``seed`` makes the random rolls (errors, then throttling)
    repeatable. Attributes may be changed while other threads use the store.

    ``stall_keys`` (regex), for crash tests: a put or put_file of a matching key hands the
    store underneath the first half of its bytes (through a pipe), then never the rest: the
    upload stays in progress, mid-write, and the call never returns.
    """

    _GETS = frozenset({"get", "get_range", "size", "list"})
    _PUTS = frozenset({"put", "put_file"})

    def __init__(self, inner: ObjectStore, *, get_latency_ms: float = 0.0,
                 put_latency_ms: float = 0.0, error_rate: float = 0.0,
                 fail_keys: str | None = None, delay_keys: str | None = None,
                 delay_ms: float = 0.0, seed: int | None = None,
                 get_bandwidth_bps: float = 0.0, put_bandwidth_bps: float = 0.0,
                 throttle_rate: float = 0.0, stall_keys: str | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        for name, rate in (("error_rate", error_rate), ("throttle_rate", throttle_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {rate}")
        for name, bw in (("get_bandwidth_bps", get_bandwidth_bps),
                         ("put_bandwidth_bps", put_bandwidth_bps)):
            if bw < 0:
                raise ValueError(f"{name} must be >= 0 (0: unlimited), got {bw}")
        self.inner = inner
        self.get_latency_ms = get_latency_ms
        self.put_latency_ms = put_latency_ms
        self.error_rate = error_rate
        self.throttle_rate = throttle_rate
        self.get_bandwidth_bps = get_bandwidth_bps
        self.put_bandwidth_bps = put_bandwidth_bps
        self.fail_keys = fail_keys
        self.delay_keys = delay_keys
        self.delay_ms = delay_ms
        self.stall_keys = re.compile(stall_keys) if stall_keys else None
        self.injected_failures = 0      # every injected failure, throttling included
        self.injected_throttles = 0
        self._outage = False
        self._random = random.Random(seed)
        self._sleep = sleep
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FaultInjectingObjectStore({self.inner!r})"

    @property
    def fail_keys(self) -> str | None:
        return self._fail_keys.pattern if self._fail_keys else None

    @fail_keys.setter
    def fail_keys(self, pattern: str | None) -> None:
        self._fail_keys = re.compile(pattern) if pattern else None

    @property
    def delay_keys(self) -> str | None:
        return self._delay_keys.pattern if self._delay_keys else None

    @delay_keys.setter
    def delay_keys(self, pattern: str | None) -> None:
        self._delay_keys = re.compile(pattern) if pattern else None

    @property
    def outage(self) -> bool:
        return self._outage

    def set_outage(self, outage: bool) -> None:
        """While True, every call fails with RetriableRemoteStorageException."""
        self._outage = bool(outage)

    def _roll(self, probability: float) -> bool:
        if probability <= 0:
            return False
        with self._lock:
            return self._random.random() < probability

    def _fault(self, op: str, keys: list[str]) -> None:
        reason = None
        if self._outage:
            reason = "outage"
        else:
            fail = self._fail_keys
            if fail is not None and any(fail.search(k) for k in keys):
                reason = f"key matches {fail.pattern!r}"
            elif self._roll(self.error_rate):
                reason = f"error rate {self.error_rate}"
            elif self._roll(self.throttle_rate):
                with self._lock:
                    self.injected_failures += 1
                    self.injected_throttles += 1
                raise ThrottledRemoteStorageException(
                    f"injected throttling: {op} {keys[:3]}: 503 SlowDown: Please reduce your "
                    "request rate.")
        if reason is not None:
            with self._lock:
                self.injected_failures += 1
            raise RetriableRemoteStorageException(f"injected failure: {op} {keys[:3]}: {reason}")
        delay = self._delay_keys
        if delay is not None and self.delay_ms > 0 and any(delay.search(k) for k in keys):
            self._sleep(self.delay_ms / 1000.0)
        latency = (self.get_latency_ms if op in self._GETS
                   else self.put_latency_ms if op in self._PUTS else 0.0)
        if latency > 0:
            self._sleep(latency / 1000.0)

    def _transfer(self, size: int, bandwidth: float) -> None:
        if bandwidth > 0 and size > 0:
            self._sleep(size / bandwidth)

    def _stall(self, key: str, data: bytes) -> NoReturn:
        """Feed half of ``data`` to the inner store's upload of ``key`` through a FIFO, and
        the rest never."""
        fifo = Path(tempfile.mkdtemp(prefix="strata-stall-")) / "source"
        os.mkfifo(fifo)

        def feed() -> None:
            with open(fifo, "wb") as out:
                out.write(data[:max(1, len(data) // 2)])
                out.flush()
                threading.Event().wait()    # the write end stays open: no EOF, ever
        threading.Thread(target=feed, name="fault-stall", daemon=True).start()
        self.inner.put_file(key, fifo)
        raise AssertionError("a stalled upload returned")

    def put(self, key: str, data: bytes) -> None:
        self._fault("put", [key])
        if self.stall_keys is not None and self.stall_keys.search(key):
            self._stall(key, bytes(data))
        self._transfer(len(data), self.put_bandwidth_bps)
        self.inner.put(key, data)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self._fault("put_file", [key])
        if self.stall_keys is not None and self.stall_keys.search(key):
            self._stall(key, Path(path).read_bytes())
        if self.put_bandwidth_bps > 0:
            self._transfer(_file_size(path), self.put_bandwidth_bps)
        self.inner.put_file(key, path)

    def get(self, key: str) -> bytes:
        self._fault("get", [key])
        data = self.inner.get(key)
        self._transfer(len(data), self.get_bandwidth_bps)
        return data

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        self._fault("get_range", [key])
        data = self.inner.get_range(key, start, end_exclusive)
        self._transfer(len(data), self.get_bandwidth_bps)
        return data

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        self._fault("get_range", [key])
        data = self.inner.get_range_buffer(key, start, end_exclusive)
        self._transfer(len(data), self.get_bandwidth_bps)
        return data

    def size(self, key: str) -> int:
        self._fault("size", [key])
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        self._fault("delete", [key])
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._fault("delete_many", keys)
        self.inner.delete_many(keys)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        self._fault("list", [prefix])
        return self.inner.list(prefix)

    def close(self) -> None:
        self.inner.close()


# --------------------------------------------------------------------------- upload rate limit


class UploadRateLimitedObjectStore(ObjectStore):
    """Limits the bytes uploaded (``put``, ``put_file``) to ``bytes_per_second`` with a token
    bucket (``strata.common.rate.TokenBucket``; burst: one second's worth unless given).

    An upload takes its size from the bucket before it starts and sleeps until the bucket has
    paid for it, so uploads of any size pass, and over any interval at most ``burst +
    bytes_per_second × interval`` bytes start uploading. The caller's thread blocks (the
    copier's, for segments); ``abort_waits`` (the remote log manager's shutdown) or ``close``
    ends every wait with a ``RetriableRemoteStorageException``. Reads, deletes and listings
    pass through untouched. Aiven's tiered-storage plugin calls the setting
    ``upload.rate.limit.bytes.per.second``.
    """

    def __init__(self, inner: ObjectStore, bytes_per_second: float, *,
                 burst_bytes: float | None = None,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.bucket = TokenBucket(bytes_per_second, burst_bytes, now=now, sleep=sleep)
        self._aborted = False

    def __repr__(self) -> str:
        return f"UploadRateLimitedObjectStore({self.inner!r}, {self.bucket.rate:g} B/s)"

    @property
    def bytes_per_second(self) -> float:
        return self.bucket.rate

    def abort_waits(self) -> None:
        """Fail every upload waiting for (or later asking) the bucket: shutdown."""
        self._aborted = True

    def _acquire(self, key: str, size: int) -> None:
        if self._aborted:
            raise RetriableRemoteStorageException(f"put {key}: the upload rate limiter is stopped")
        try:
            self.bucket.acquire(size, lambda: self._aborted)
        except InterruptedError:
            raise RetriableRemoteStorageException(
                f"put {key}: the upload rate limiter is stopped") from None

    def put(self, key: str, data: bytes) -> None:
        self._acquire(key, len(data))
        self.inner.put(key, data)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self._acquire(key, _file_size(path))
        self.inner.put_file(key, path)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return self.inner.get_range(key, start, end_exclusive)

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        return self.inner.get_range_buffer(key, start, end_exclusive)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        return self.inner.list(prefix)

    def close(self) -> None:
        self._aborted = True
        self.inner.close()


# --------------------------------------------------------------------------- metering


_TOPIC_DIR = re.compile(r"^(?P<topic>.+)-[A-Za-z0-9_-]{22}$")


def topic_of_key(key: str, prefix: str = "") -> str:
    """The topic of an object key (or listing prefix) in the RSM's layout
    ``{prefix}{topic}-{topicId, 22 chars}/{partition}/...``; "" when the key does not say."""
    if not key.startswith(prefix):
        return ""
    first, sep, _ = key[len(prefix):].partition("/")
    if not sep:
        return ""
    m = _TOPIC_DIR.match(first)
    return m.group("topic") if m else ""


@dataclasses.dataclass(frozen=True)
class RequestPrices:
    """Request prices in dollars per 1000 requests (S3 Standard, us-east-1, as published by
    AWS): GET-class (GET, HEAD) $0.0004, PUT-class (PUT, COPY, POST, LIST, the parts of a
    multipart upload) $0.005; DELETE is free. Storage and transfer are not counted. RSM keys:
    ``cost.get.per.1000.requests`` and ``cost.put.per.1000.requests``."""

    get_per_1000: float = 0.0004
    put_per_1000: float = 0.005

    def per_request(self, op: str) -> float:
        if op in ("GET", "HEAD"):
            return self.get_per_1000 / 1000.0
        if op in ("PUT", "LIST"):
            return self.put_per_1000 / 1000.0
        return 0.0


@dataclasses.dataclass
class OperationStats:
    """The counters of one (operation, topic)."""

    requests: int = 0
    bytes: int = 0
    errors: int = 0


# Requests per LIST call: S3 returns at most 1000 keys per ListObjectsV2 page.
_LIST_PAGE_KEYS = 1000


class MeteredObjectStore(ObjectStore):
    """Counts the requests, bytes and errors per operation and per topic, and the estimated
    request cost per topic, of the calls that go through it (thread-safe).

    Operations: ``GET`` (get, get_range; bytes received), ``HEAD`` (size), ``PUT`` (put,
    put_file; bytes sent; a multipart upload counts its parts plus the create and complete
    requests when the store underneath is an ``ObstoreObjectStore`` and the file is above its
    part size), ``DELETE`` (one per key), ``LIST`` (one per page of 1000 keys, at least one).
    A call that fails still counts as a request (and an error). The topic comes from the key
    (``topic_of_key`` with ``key_prefix``); "" when the key does not say. Cost: requests times
    ``prices`` (``RequestPrices``); an estimate of the request charges, nothing more.
    ``abort_incomplete_uploads`` counts the uploads it removed per topic
    (``incomplete_uploads_removed``).
    """

    OPS = ("GET", "HEAD", "PUT", "DELETE", "LIST")

    def __init__(self, inner: ObjectStore, *, key_prefix: str = "",
                 prices: RequestPrices | None = None) -> None:
        self.inner = inner
        self.key_prefix = key_prefix
        self.prices = prices or RequestPrices()
        self._stats: dict[tuple[str, str], OperationStats] = {}
        self._removed: dict[str, int] = {}    # topic -> incomplete uploads removed
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MeteredObjectStore({self.inner!r})"

    def _count(self, op: str, key: str, requests: int = 1, size: int = 0,
               error: bool = False) -> None:
        topic = topic_of_key(key, self.key_prefix)
        with self._lock:
            stats = self._stats.get((op, topic))
            if stats is None:
                stats = self._stats[(op, topic)] = OperationStats()
            stats.requests += requests
            stats.bytes += size
            if error:
                stats.errors += 1

    def _metered(self, op: str, key: str, fn: Callable[[], Any], *,
                 size: Callable[[Any], int] | int = 0, requests: int = 1) -> Any:
        try:
            result = fn()
        except BaseException:
            self._count(op, key, requests, 0, error=True)
            raise
        self._count(op, key, requests, size(result) if callable(size) else size)
        return result

    def _part_size(self) -> int | None:
        layer: Any = self.inner
        while layer is not None:
            chunk = getattr(layer, "multipart_chunk_size", None)
            if isinstance(layer, ObstoreObjectStore) and chunk:
                return int(chunk)
            layer = getattr(layer, "inner", None)
        return None

    def put(self, key: str, data: bytes) -> None:
        self._metered("PUT", key, lambda: self.inner.put(key, data), size=len(data))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        size = _file_size(path)
        part = self._part_size()
        requests = math.ceil(size / part) + 2 if part and size > part else 1
        self._metered("PUT", key, lambda: self.inner.put_file(key, path), size=size,
                      requests=requests)

    def get(self, key: str) -> bytes:
        return self._metered("GET", key, lambda: self.inner.get(key), size=len)

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return self._metered("GET", key, lambda: self.inner.get_range(key, start, end_exclusive),
                             size=len)

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        return self._metered(
            "GET", key, lambda: self.inner.get_range_buffer(key, start, end_exclusive), size=len)

    def size(self, key: str) -> int:
        return self._metered("HEAD", key, lambda: self.inner.size(key))

    def delete(self, key: str) -> None:
        self._metered("DELETE", key, lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        try:
            self.inner.delete_many(keys)
        except BaseException:
            for key in keys:
                self._count("DELETE", key, error=True)
            raise
        for key in keys:
            self._count("DELETE", key)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        try:
            found = list(self.inner.list(prefix))
        except BaseException:
            self._count("LIST", prefix, error=True)
            raise
        self._count("LIST", prefix, max(1, math.ceil(len(found) / _LIST_PAGE_KEYS)))
        return iter(found)

    def abort_incomplete_uploads(self, prefix: str = "", older_than_ms: int = 0) -> list[str]:
        removed = self.inner.abort_incomplete_uploads(prefix, older_than_ms)
        with self._lock:
            for key in removed:
                topic = topic_of_key(key, self.key_prefix)
                self._removed[topic] = self._removed.get(topic, 0) + 1
        return removed

    def close(self) -> None:
        self.inner.close()

    # ---- reading the counters ----

    def incomplete_uploads_removed(self) -> dict[str, int]:
        """Incomplete uploads removed per topic, since the store was built."""
        with self._lock:
            return dict(self._removed)

    def snapshot(self) -> dict[tuple[str, str], OperationStats]:
        """A copy of the counters: (operation, topic) -> OperationStats."""
        with self._lock:
            return {k: dataclasses.replace(v) for k, v in self._stats.items()}

    def estimated_cost(self) -> dict[str, float]:
        """Estimated request cost in dollars per topic, since the store was built."""
        out: dict[str, float] = {}
        for (op, topic), stats in self.snapshot().items():
            out[topic] = out.get(topic, 0.0) + stats.requests * self.prices.per_request(op)
        return out


def find_layer(store: Any, kind: type) -> Any:
    """The first store of type ``kind`` in a chain of decorators (following ``inner``), or
    None. ``store`` itself counts."""
    seen = 0
    while store is not None and seen < 32:
        if isinstance(store, kind):
            return store
        store = getattr(store, "inner", None)
        seen += 1
    return None


# --------------------------------------------------------------------------- factory


_FAULT_KEYS = {
    "fault.get.latency.ms": ("get_latency_ms", float),
    "fault.put.latency.ms": ("put_latency_ms", float),
    "fault.error.rate": ("error_rate", float),
    "fault.fail.keys": ("fail_keys", str),
    "fault.delay.keys": ("delay_keys", str),
    "fault.delay.ms": ("delay_ms", float),
    "fault.seed": ("seed", int),
    "fault.get.bandwidth.bytes.per.second": ("get_bandwidth_bps", float),
    "fault.put.bandwidth.bytes.per.second": ("put_bandwidth_bps", float),
    "fault.throttle.rate": ("throttle_rate", float),
    "fault.stall.keys": ("stall_keys", str),
}
_RETRY_DURATIONS = {"retry_timeout_ms": "retry_timeout", "init_backoff_ms": "init_backoff",
                    "max_backoff_ms": "max_backoff"}


def _option_value(value: Any) -> Any:
    # obstore takes strings for nearly every option; booleans as "true"/"false".
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _retry_config(options: Mapping[str, Any]) -> dict[str, Any]:
    retry: dict[str, Any] = {}
    backoff: dict[str, Any] = {}
    for name, value in options.items():
        if name == "max_retries":
            retry["max_retries"] = int(value)
        elif name == "retry_timeout_ms":
            retry["retry_timeout"] = datetime.timedelta(milliseconds=float(value))
        elif name in ("init_backoff_ms", "max_backoff_ms"):
            backoff[_RETRY_DURATIONS[name]] = datetime.timedelta(milliseconds=float(value))
        elif name == "backoff_base":
            backoff["base"] = float(value)
        else:
            raise RemoteStorageException(f"unknown retry option storage.retry.{name}")
    if backoff:
        retry["backoff"] = backoff
    return retry


def object_store_from_config(configs: Mapping[str, Any]) -> ObjectStore:
    """The store named by ``storage.url`` and its decorators, innermost first: a
    FaultInjectingObjectStore when any ``fault.*`` key is present, a MeteredObjectStore
    (always; ``key.prefix`` tells it where topics start in keys, ``cost.get.per.1000.requests``
    and ``cost.put.per.1000.requests`` price the requests, S3 Standard's by default), and an
    UploadRateLimitedObjectStore when ``upload.rate.limit.bytes.per.second`` is set (a positive
    integer; unset: unlimited). ``find_layer`` finds one of them in the result.

    ``fault.*`` keys: ``fault.get.latency.ms``, ``fault.put.latency.ms``, ``fault.error.rate``,
    ``fault.fail.keys``, ``fault.delay.keys``, ``fault.delay.ms``, ``fault.seed``,
    ``fault.get.bandwidth.bytes.per.second``, ``fault.put.bandwidth.bytes.per.second`` and
    ``fault.throttle.rate`` and ``fault.stall.keys`` (see FaultInjectingObjectStore).

    ``storage.url``: ``file:///abs/path`` (FileSystemObjectStore), ``memory://`` (a new
    MemoryObjectStore), ``s3://bucket[/prefix]``, ``gs://...``, ``az://...``, ``http(s)://...``
    (ObstoreObjectStore). For obstore: ``storage.client.<option>`` and the client options
    named without it (``storage.timeout``, ``storage.aws_allow_http``; a cloud prefix such as
    ``aws_`` is dropped) go to ``client_options``; ``storage.retry.max_retries``,
    ``storage.retry.{retry_timeout,init_backoff,max_backoff}_ms`` and
    ``storage.retry.backoff_base`` to ``retry_config``; ``storage.multipart.chunk.bytes`` and
    ``storage.multipart.concurrency`` tune ``put_file``; every other ``storage.<option>``
    (``storage.aws_endpoint``, ``storage.aws_region``, ...) is passed as store config.
    """
    url = configs.get("storage.url")
    if not url:
        raise RemoteStorageException("storage.url is required")
    url = str(url)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    store: ObjectStore
    if scheme == "file":
        parsed = urllib.parse.urlsplit(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise RemoteStorageException(f"storage.url {url!r}: file URLs need an absolute path")
        store = FileSystemObjectStore(urllib.parse.unquote(parsed.path))
    elif scheme == "memory":
        store = MemoryObjectStore()
    elif scheme in ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl", "http", "https"):
        config: dict[str, Any] = {}
        client: dict[str, Any] = {}
        retry: dict[str, Any] = {}
        tuning: dict[str, Any] = {}
        for full, value in configs.items():
            if not full.startswith("storage.") or full == "storage.url":
                continue
            name = full[len("storage."):]
            if name.startswith("client."):
                client[name[len("client."):]] = _option_value(value)
            elif name.startswith("retry."):
                retry[name[len("retry."):]] = value
            elif name == "multipart.chunk.bytes":
                tuning["multipart_chunk_size"] = int(value)
            elif name == "multipart.concurrency":
                tuning["multipart_concurrency"] = int(value)
            else:
                bare = re.sub(r"^(aws|google|azure)_", "", name)
                if bare in _CLIENT_OPTIONS:
                    client[bare] = _option_value(value)
                else:
                    config[name] = _option_value(value)
        store = ObstoreObjectStore.from_url(url, config=config, client_options=client,
                                            retry_config=_retry_config(retry), **tuning)
    else:
        raise RemoteStorageException(f"storage.url {url!r}: unsupported scheme {scheme!r}")

    try:
        faults = {k: v for k, v in configs.items() if k.startswith("fault.")}
        if faults:
            kwargs: dict[str, Any] = {}
            for key, value in faults.items():
                if key not in _FAULT_KEYS:
                    raise RemoteStorageException(f"unknown fault injection option {key}")
                name, kind = _FAULT_KEYS[key]
                try:
                    kwargs[name] = kind(value)
                except (TypeError, ValueError) as e:
                    raise RemoteStorageException(f"{key}: invalid value {value!r}: {e}") from e
            try:
                store = FaultInjectingObjectStore(store, **kwargs)
            except ValueError as e:
                raise RemoteStorageException(f"invalid fault injection option: {e}") from e
        store = MeteredObjectStore(store, key_prefix=str(configs.get("key.prefix", "") or ""),
                                   prices=_request_prices(configs))
        limit = configs.get(UPLOAD_RATE_LIMIT_KEY)
        if limit not in (None, ""):
            store = UploadRateLimitedObjectStore(store, _positive_int(UPLOAD_RATE_LIMIT_KEY, limit))
    except BaseException:
        store.close()
        raise
    return store


UPLOAD_RATE_LIMIT_KEY = "upload.rate.limit.bytes.per.second"
COST_GET_KEY = "cost.get.per.1000.requests"
COST_PUT_KEY = "cost.put.per.1000.requests"


def _positive_int(key: str, value: Any) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise RemoteStorageException(f"{key} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise RemoteStorageException(f"{key} must be a positive integer, got {value!r}")
    return n


def _request_prices(configs: Mapping[str, Any]) -> RequestPrices:
    prices = {}
    for key, field in ((COST_GET_KEY, "get_per_1000"), (COST_PUT_KEY, "put_per_1000")):
        value = configs.get(key)
        if value in (None, ""):
            continue
        try:
            price = float(str(value).strip())
        except ValueError:
            price = -1.0
        if not price >= 0 or math.isinf(price):
            raise RemoteStorageException(f"{key} must be a non-negative number, got {value!r}")
        prices[field] = price
    return RequestPrices(**prices)
