"""Remote read replicas (issue 52): a topic created with ``strata.remote.readreplica=<URL>``
serves the topic of that name in another cluster's bucket, read-only, from the bucket alone.

The replica never writes to the origin's bucket: its store is wrapped in ``ReadOnlyObjectStore``
(every PUT and DELETE raises) and it never claims the origin's cluster marker. What it serves
is what the origin's partition manifests prove: per partition the COPY_SEGMENT_FINISHED segments
from the manifest's log start offset on, without a gap (``recovery.plan_partition``). Every
``strata.remote.readreplica.refresh.ms`` it reads each partition's pointer again (one small GET),
and the manifest it names when the pointer moved: new uploads become readable, and segments the
origin expired (absent from its manifest, or moved past its log start) stop being served.

Reads go through the broker's remote read functions (``remote_log_reader``) with the origin's
segment metadata, on a small thread pool; handlers ask ``ClusterMetadata.read_replicas``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, NamedTuple

from strata.common.errors import ErrorCode, InvalidConfigError
from strata.common.types import TopicIdPartition, TopicPartition
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteResourceNotFoundException,
    RemoteStorageException)
from strata.tiered.bucket.catalog import CATALOG_DIR, BucketCatalog
from strata.tiered.bucket.format import ManifestError, TopicManifest
from strata.tiered.bucket.recovery import RECOVERY_CONFIG, PartitionPlan, plan_partition
from strata.tiered.storage.object_store import ObjectStore, object_store_from_config

log = logging.getLogger(__name__)

READ_REPLICA_CONFIG = "strata.remote.readreplica"
REFRESH_MS_CONFIG = "strata.remote.readreplica.refresh.ms"
KEY_PREFIX_CONFIG = "strata.remote.readreplica.key.prefix"
DEFAULT_REFRESH_MS = 10_000
# Kafka has no error for "this topic is read-only"; a policy refusal with a message says it.
WRITE_REFUSED = ErrorCode.POLICY_VIOLATION
_INDEX_CACHE_BYTES = 64 * 1024 * 1024
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING = \
    -1, -2, -3, -4, -5, -6


def is_read_replica(configs: Mapping[str, Any]) -> bool:
    return bool(str(configs.get(READ_REPLICA_CONFIG, "") or "").strip())


def origin_url(value: str) -> str:
    """The store URL of ``strata.remote.readreplica``: an absolute path is a filesystem
    store; anything else must be a URL ``object_store_from_config`` takes."""
    value = value.strip()
    if value.startswith("/"):
        return "file://" + urllib.parse.quote(value)
    if not urllib.parse.urlsplit(value).scheme:
        raise InvalidConfigError(f"{READ_REPLICA_CONFIG}={value!r}: not an absolute path or a "
                                 "storage URL (file:///..., s3://..., gs://..., az://...)")
    return value


class ReadOnlyObjectStore(ObjectStore):
    """Another cluster's store: reads pass, every write or delete raises (nothing of the
    replica may change the origin's bucket)."""

    def __init__(self, store: ObjectStore, what: str):
        self._store = store
        self._what = what

    def _refuse(self, op: str, key: str) -> RemoteStorageException:
        return RemoteStorageException(f"{op} {key}: {self._what} is read-only to this broker "
                                      "(a remote read replica never writes to its origin)")

    def put(self, key: str, data: bytes) -> None:
        raise self._refuse("PUT", key)

    def put_file(self, key: str, path: Any) -> None:
        raise self._refuse("PUT", key)

    def delete(self, key: str) -> None:
        raise self._refuse("DELETE", key)

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            raise self._refuse("DELETE", key)

    def abort_incomplete_uploads(self, prefix: str = "", older_than_ms: int = 0) -> list[str]:
        return []

    def get(self, key: str) -> bytes:
        return self._store.get(key)

    def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return self._store.get_range(key, start, end_exclusive)

    def get_range_buffer(self, key: str, start: int, end_exclusive: int) -> bytes | memoryview:
        return self._store.get_range_buffer(key, start, end_exclusive)

    def size(self, key: str) -> int:
        return self._store.size(key)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        return self._store.list(prefix)

    def close(self) -> None:
        self._store.close()


class Origin:
    """One origin bucket (URL and key prefix): its read-only store, a storage manager and an
    index cache over it, and a catalog used for reads only."""

    def __init__(self, url: str, prefix: str, rsm_configs: Mapping[str, Any], cache_dir: Path):
        from strata.tiered.manager.remote_index_cache import RemoteIndexCache
        from strata.tiered.storage.remote_storage_manager import ObjectStoreRemoteStorageManager
        self.url = url
        self.prefix = prefix
        configs = {k: v for k, v in rsm_configs.items()
                   if not k.startswith(("chunk.cache.", "fault."))}
        configs.update({"storage.url": url, "key.prefix": prefix})
        self.store = ReadOnlyObjectStore(object_store_from_config(configs),
                                         f"{url} (prefix {prefix!r})")
        self.rsm = ObjectStoreRemoteStorageManager(self.store)
        self.rsm.configure(configs)
        # never claims the marker: only read_pointer / read_partition / topics_named are used
        self.catalog = BucketCatalog(self.store, prefix, "read-replica")
        digest = hashlib.sha256(f"{url}\0{prefix}".encode()).hexdigest()[:16]
        self.index_cache = RemoteIndexCache(self.rsm, cache_dir / digest, _INDEX_CACHE_BYTES)

    @property
    def where(self) -> str:
        return f"{self.url} (key prefix {self.prefix!r})"

    def close(self) -> None:
        for closer in (self.index_cache.close, self.rsm.close):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing
                log.debug("closing read replica origin %s", self.where, exc_info=True)


@dataclasses.dataclass(frozen=True)
class PartitionView:
    """What the replica serves of one partition: ``segments`` cover [log_start, end]."""

    origin: TopicIdPartition
    log_start: int
    end: int                      # the last offset served, log_start - 1 when none
    segments: tuple[RemoteLogSegmentMetadata, ...]
    sequence: int                 # the pointer's sequence it was read from (0: none)
    refreshed_ms: int

    @property
    def next_offset(self) -> int:
        return self.end + 1

    def segment_for(self, offset: int) -> RemoteLogSegmentMetadata | None:
        lo, hi = 0, len(self.segments) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            s = self.segments[mid]
            if offset < s.start_offset:
                hi = mid - 1
            elif offset > s.end_offset:
                lo = mid + 1
            else:
                return s
        return None

    def epoch_at(self, offset: int) -> int:
        s = self.segment_for(offset)
        if s is None:
            s = self.segments[-1] if self.segments else None
            if s is None:
                return -1
            return max(s.segment_leader_epochs)
        return max(e for e, o in s.segment_leader_epochs.items() if o <= offset)


def view_of(plan: PartitionPlan, tip: TopicIdPartition, sequence: int, now_ms: int) -> PartitionView:
    from strata.tiered.storage.remote_storage_manager import origin_custom_metadata
    segments = []
    for entry, object_topic_id in plan.segments:
        custom = None if object_topic_id == tip.topic_id else origin_custom_metadata(object_topic_id)
        meta = dataclasses.replace(entry.metadata(tip, custom),
                                   state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
        segments.append(meta)
    start = plan.log_start_offset
    end = plan.end_offset if segments else start - 1
    return PartitionView(tip, start, end, tuple(segments), sequence, now_ms)


class ReplicaState(NamedTuple):
    """A Fetch's view of a read replica partition (the fields of ReplicaManager.ReadResult)."""
    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    aborted_transactions: list | None = None
    remote: Any = None
    diverging_epoch: tuple[int, int] | None = None
    preferred_read_replica: int = -1


class ReplicaRead(NamedTuple):
    records: bytes | memoryview
    aborted_transactions: list | None


class OffsetAnswer(NamedTuple):
    error: ErrorCode
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


class _Pending:
    """A Fetch's remote read of a read replica partition (``fetch.py`` calls ``submit_read``)."""

    read_replica = True

    def __init__(self, manager: ReadReplicaManager, tp: TopicPartition, view: PartitionView):
        self._manager = manager
        self.tp = tp
        self.view = view

    def submit_read(self, fetch_offset: int, max_bytes: int, committed: bool,
                    min_one: bool) -> concurrent.futures.Future:
        return self._manager.submit_read(self.tp, self.view, fetch_offset, max_bytes, committed,
                                         min_one)


@dataclasses.dataclass
class ReplicaTopic:
    name: str
    origin: Origin
    manifest: TopicManifest
    refresh_ms: int
    views: dict[int, PartitionView]
    problems: dict[int, str] = dataclasses.field(default_factory=dict)
    next_refresh_ms: int = 0


class ReadReplicaManager:
    """The read replica topics of one broker. ``rsm_configs``: the broker's own RSM keys
    (credentials, endpoints, encryption keys), under which the origin's URL and prefix go."""

    def __init__(self, rsm_configs: Mapping[str, Any], cache_dir: Path, *,
                 now_ms: Callable[[], int] | None = None, reader_threads: int = 4):
        self._rsm_configs = dict(rsm_configs)
        self._cache_dir = Path(cache_dir)
        self._now = now_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._origins: dict[tuple[str, str], Origin] = {}
        self._topics: dict[str, ReplicaTopic] = {}
        self._plans: dict[str, ReplicaTopic] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(reader_threads, "read-replica")
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.refreshes = 0            # partition pointers read
        self.listeners: list[Callable[[TopicPartition], None]] = []   # new data readable

    # ---- lifecycle

    def start(self) -> ReadReplicaManager:
        self._thread = threading.Thread(target=self._run, name="read-replica-refresh", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            origins, self._origins = list(self._origins.values()), {}
        for o in origins:
            o.close()

    def _origin(self, url: str, prefix: str) -> Origin:
        with self._lock:
            o = self._origins.get((url, prefix))
            if o is None:
                o = self._origins[(url, prefix)] = Origin(url, prefix, self._rsm_configs,
                                                          self._cache_dir)
            return o

    # ---- creation

    def plan(self, topic: str, configs: Mapping[str, Any]) -> ReplicaTopic:
        """Read the origin's topic and partition manifests for a new read replica topic;
        InvalidConfigError (naming the bucket and key) when the origin has none."""
        if str(configs.get(RECOVERY_CONFIG, "")).strip().lower() == "true":
            raise InvalidConfigError(f"{READ_REPLICA_CONFIG} and {RECOVERY_CONFIG} exclude "
                                     "each other")
        if str(configs.get("remote.storage.enable", "")).strip().lower() == "true":
            raise InvalidConfigError(f"a read replica ({READ_REPLICA_CONFIG}) has no tier of "
                                     "its own: remote.storage.enable must not be true")
        url = origin_url(str(configs[READ_REPLICA_CONFIG]))
        prefix = str(configs.get(KEY_PREFIX_CONFIG, "") or "")
        try:
            refresh_ms = int(configs.get(REFRESH_MS_CONFIG, DEFAULT_REFRESH_MS))
        except (TypeError, ValueError):
            raise InvalidConfigError(f"{REFRESH_MS_CONFIG} must be a number of milliseconds")
        if refresh_ms < 1:
            raise InvalidConfigError(f"{REFRESH_MS_CONFIG} must be at least 1")
        try:
            origin = self._origin(url, prefix)
        except RemoteStorageException as e:
            raise InvalidConfigError(f"{READ_REPLICA_CONFIG}: cannot open {url}: {e}") from e
        try:
            found = origin.catalog.topics_named(topic)
        except RemoteStorageException as e:
            raise InvalidConfigError(f"{READ_REPLICA_CONFIG}: cannot list {origin.where}: {e}") from e
        manifests = [m for _, m in found if isinstance(m, TopicManifest)]
        errors = [str(m) for _, m in found if isinstance(m, ManifestError)]
        if not manifests:
            raise InvalidConfigError(
                f"{READ_REPLICA_CONFIG}: {origin.where} has no readable manifest of topic "
                f"{topic!r} (nothing under {prefix}{CATALOG_DIR}/topics/{topic}/; the origin "
                "writes manifests when it tiers the topic with strata.remote.manifests.enable)"
                + (f": {'; '.join(errors)}" if errors else ""))
        manifest = manifests[0]
        rt = ReplicaTopic(topic, origin, manifest, refresh_ms, {})
        for p in range(manifest.partitions):
            self._refresh_partition(rt, p)
        with self._lock:
            self._plans[topic] = rt
        return rt

    def on_topic_created(self, info: Any) -> None:
        if not is_read_replica(info.configs):
            return
        with self._lock:
            rt = self._plans.pop(info.name, None)
        if rt is None:     # a restart: the topic was created before
            try:
                rt = self.plan(info.name, info.configs)
            except InvalidConfigError as e:
                log.error("read replica %s: %s", info.name, e)
                return
            with self._lock:
                self._plans.pop(info.name, None)
        rt.next_refresh_ms = self._now() + rt.refresh_ms
        with self._lock:
            self._topics[info.name] = rt
        log.info("%s is a read replica of topic %s (%s) in %s, %d partition(s), refreshed every "
                 "%d ms", info.name, rt.manifest.topic, kafka_uuid_str(rt.manifest.topic_id),
                 rt.origin.where, rt.manifest.partitions, rt.refresh_ms)
        self._wake.set()

    def on_topic_deleted(self, info: Any) -> None:
        with self._lock:
            self._topics.pop(info.name, None)

    # ---- refresh

    def _refresh_partition(self, rt: ReplicaTopic, p: int) -> bool:
        """Read partition ``p``'s pointer (and its manifest when the pointer moved); whether
        the view changed."""
        m = rt.manifest
        tip = TopicIdPartition(m.topic_id, TopicPartition(m.topic, p))
        old = rt.views.get(p)
        now = self._now()
        self.refreshes += 1
        try:
            pointer, _, _ = rt.origin.catalog.read_pointer(tip)
            if pointer is not None and old is not None and pointer.sequence == old.sequence:
                rt.views[p] = dataclasses.replace(old, refreshed_ms=now)
                return False
            pm = rt.origin.catalog.read_partition(tip)
        except (ManifestError, RemoteStorageException) as e:
            if rt.problems.get(p) != str(e):
                log.error("read replica %s-%d: %s (serving what was read before)", rt.name, p, e)
            rt.problems[p] = str(e)
            return False
        rt.problems.pop(p, None)
        plan = PartitionPlan(p, m.topic_id)
        if pm is None:
            view = PartitionView(tip, 0, -1, (), 0, now)
        else:
            plan_partition(list(pm.segments), pm.log_start_offset, plan, m.topic_id)
            view = view_of(plan, tip, pm.sequence, now)
            if not plan.segments:
                # nothing finished yet: serve nothing, from the origin's log start
                view = dataclasses.replace(view, log_start=pm.log_start_offset,
                                           end=pm.log_start_offset - 1)
        for problem in plan.problems:
            log.warning("read replica %s: %s", rt.name, problem)
        rt.views[p] = view
        return old is None or (old.log_start, old.end) != (view.log_start, view.end)

    def refresh_due(self) -> None:
        """Refresh every topic whose interval has passed (the refresh thread's work)."""
        now = self._now()
        with self._lock:
            due = [rt for rt in self._topics.values() if rt.next_refresh_ms <= now]
        for rt in due:
            for p in range(rt.manifest.partitions):
                if self._refresh_partition(rt, p):
                    tp = TopicPartition(rt.name, p)
                    for listener in self.listeners:
                        listener(tp)
            rt.next_refresh_ms = self._now() + rt.refresh_ms

    def _run(self) -> None:
        while not self._closed:
            try:
                self.refresh_due()
            except Exception:  # noqa: BLE001 - the thread keeps refreshing
                log.exception("read replica refresh failed")
            with self._lock:
                nexts = [rt.next_refresh_ms for rt in self._topics.values()]
            wait_ms = min(nexts, default=self._now() + 1000) - self._now()
            self._wake.wait(min(max(wait_ms, 1), 1000) / 1000)
            self._wake.clear()

    # ---- serving

    def serves(self, topic: str) -> bool:
        return topic in self._topics

    def write_refusal(self, topic: str) -> str:
        rt = self._topics.get(topic)
        where = rt.origin.where if rt is not None else "another cluster's bucket"
        return (f"Topic {topic} is a remote read replica of {where}: it is read-only "
                "(produce to the origin cluster)")

    def view(self, tp: TopicPartition) -> PartitionView | None:
        rt = self._topics.get(tp.topic)
        return None if rt is None else rt.views.get(tp.partition)

    def read_state(self, tp: TopicPartition, fetch_offset: int) -> ReplicaState:
        """A Fetch's answer before reading: an error, nothing new, or a read to run."""
        rt = self._topics.get(tp.topic)
        if rt is None or not 0 <= tp.partition < rt.manifest.partitions:
            return ReplicaState(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        view = rt.views.get(tp.partition)
        if view is None:
            return ReplicaState(ErrorCode.KAFKA_STORAGE_ERROR)
        hw = view.next_offset
        base = ReplicaState(ErrorCode.NONE, hw, hw, view.log_start)
        if fetch_offset < view.log_start or fetch_offset > hw:
            return base._replace(error=ErrorCode.OFFSET_OUT_OF_RANGE)
        if fetch_offset == hw:
            return base
        return base._replace(remote=_Pending(self, tp, view))

    def submit_read(self, tp: TopicPartition, view: PartitionView, fetch_offset: int,
                    max_bytes: int, committed: bool, min_one: bool) -> concurrent.futures.Future:
        return self._pool.submit(self._read, tp, view, fetch_offset, max_bytes, committed, min_one)

    def _read(self, tp: TopicPartition, view: PartitionView, fetch_offset: int, max_bytes: int,
              committed: bool, min_one: bool) -> ReplicaRead:
        from strata.common.errors import KafkaError
        from strata.tiered.manager.remote_log_reader import (
            collect_aborted_transactions, read_remote_segment)
        rt = self._topics.get(tp.topic)
        if rt is None:
            raise KafkaError(f"{tp} is no longer a read replica",
                             code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        origin = rt.origin
        meta = view.segment_for(fetch_offset)
        if meta is None:
            return ReplicaRead(b"", None)
        try:
            got = read_remote_segment(origin.rsm, origin.index_cache, meta, fetch_offset,
                                      max_bytes, min_one)
        except RemoteResourceNotFoundException as e:
            # expired by the origin after the manifest that listed it: look again
            self._refresh_partition(rt, tp.partition)
            raise KafkaError(f"{tp}: segment {kafka_uuid_str(meta.remote_log_segment_id.id)} "
                             f"is gone from {origin.where}: {e}",
                             code=ErrorCode.OFFSET_OUT_OF_RANGE
                             if fetch_offset < self._log_start(rt, tp.partition)
                             else ErrorCode.KAFKA_STORAGE_ERROR) from e
        aborted = None
        if committed:
            aborted = []
            if got.records:
                upper = min(got.next_offset, view.next_offset)
                aborted = collect_aborted_transactions(origin.rsm, origin.index_cache, meta,
                                                       fetch_offset, upper)
        return ReplicaRead(got.records, aborted)

    def _log_start(self, rt: ReplicaTopic, partition: int) -> int:
        view = rt.views.get(partition)
        return view.log_start if view is not None else 0

    def list_offset(self, tp: TopicPartition, timestamp: int) -> OffsetAnswer:
        """ListOffsets of a read replica partition (blocks on the bucket for timestamps)."""
        from strata.tiered.manager.remote_log_reader import find_offset_by_timestamp
        rt = self._topics.get(tp.topic)
        if rt is None or not 0 <= tp.partition < rt.manifest.partitions:
            return OffsetAnswer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        view = rt.views.get(tp.partition)
        if view is None:
            return OffsetAnswer(ErrorCode.KAFKA_STORAGE_ERROR)
        if timestamp in (LATEST, EARLIEST_LOCAL):     # nothing is local: both are the end
            return OffsetAnswer(ErrorCode.NONE, -1, view.next_offset, view.epoch_at(view.end))
        if timestamp == EARLIEST:
            return OffsetAnswer(ErrorCode.NONE, -1, view.log_start, view.epoch_at(view.log_start))
        if timestamp == LATEST_TIERED:
            if not view.segments:
                return OffsetAnswer(ErrorCode.NONE, -1, -1, -1)
            return OffsetAnswer(ErrorCode.NONE, -1, view.end, view.epoch_at(view.end))
        if timestamp == EARLIEST_PENDING:            # nothing waits for an upload here
            return OffsetAnswer(ErrorCode.NONE, -1, -1, -1)
        if timestamp == MAX_TIMESTAMP:
            if not view.segments:
                return OffsetAnswer(ErrorCode.NONE, -1, -1, -1)
            best = max(view.segments, key=lambda s: s.max_timestamp_ms)
            target = best.max_timestamp_ms
            candidates = [best]
        elif timestamp < 0:
            return OffsetAnswer(ErrorCode.UNSUPPORTED_VERSION)
        else:
            target = timestamp
            candidates = [s for s in view.segments if s.max_timestamp_ms >= timestamp]
        origin = rt.origin
        for meta in candidates:
            try:
                hit = find_offset_by_timestamp(origin.rsm, origin.index_cache, meta, target,
                                               view.log_start)
            except RemoteStorageException as e:
                log.warning("read replica %s: timestamp search: %s", tp, e)
                return OffsetAnswer(ErrorCode.KAFKA_STORAGE_ERROR)
            if hit is not None:
                epoch = hit.leader_epoch if hit.leader_epoch is not None else -1
                return OffsetAnswer(ErrorCode.NONE, hit.timestamp, hit.offset, epoch)
        return OffsetAnswer(ErrorCode.NONE, -1, -1, -1)


def rsm_configs_of(props: Mapping[str, str]) -> dict[str, str]:
    """The broker's RemoteStorageManager keys (``rsm.config.*`` by default), prefix removed."""
    from strata.tiered.config import (
        DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX, REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP)
    prefix = props.get(REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP,
                       DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX)
    return {k[len(prefix):]: v for k, v in props.items() if k.startswith(prefix)}


def attach(metadata: Any, props: Mapping[str, str], log_dir: Path) -> ReadReplicaManager:
    """Build the broker's read replica manager, hook it into ``metadata`` (CreateTopics and
    the handlers ask ``metadata.read_replicas``) and serve the read replicas it already has."""
    manager = ReadReplicaManager(rsm_configs_of(props), Path(log_dir) / "read-replica-index-cache")
    metadata.read_replicas = manager
    metadata.add_listener(manager)
    for info in list(metadata.topics().values()):
        if is_read_replica(info.configs):
            manager.on_topic_created(info)
    return manager.start()
