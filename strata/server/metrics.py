"""The broker's metrics endpoint: Prometheus text on its own HTTP port, plus ``/tiered/<topic>``.

Configured by the broker property ``strata.metrics.listener`` (``http://host:port``; absent:
no endpoint; port 0: any free port, logged at start). Paths:

- ``/metrics``: Prometheus exposition (text 0.0.4, or OpenMetrics when asked) of a private
  ``CollectorRegistry``. One custom collector reads every value live at scrape time from the
  log manager, the RemoteLogManager, its metadata manager and its index cache; nothing runs
  between scrapes. The registry also holds prometheus_client's process collector.
- ``/tiered/<topic>``: JSON with, per partition hosted here, ``log_start_offset``,
  ``local_log_start_offset``, ``high_watermark``, ``log_end_offset``,
  ``highest_offset_in_remote_storage``, ``local_segments``/``local_bytes`` and
  ``remote_segments``/``remote_bytes`` (copied segments: COPY_SEGMENT_FINISHED). 404 when no
  partition of the topic is hosted here. ``strata tiered describe`` prints it as a table.

Metric names: Kafka's MBeans as the Prometheus JMX exporter maps them with the common rules
(``kafka.(\\w+)<type=(.+), name=(.+), topic=(.+)><>Count`` to ``kafka_$1_$2_$3_total`` with a
``topic`` label, ``...><>Value`` to a gauge ``kafka_$1_$2_$3``), *without*
``lowercaseOutputName`` and without stripping ``PerSec``, so Kafka's names stay as KIP-405/
KIP-930/KIP-963 spell them. An MBean ``domain:type=T,name=N[,k=v...]`` becomes
``<domain with dots as underscores>_T_N``; a meter's cumulative count is a counter with the
``_total`` suffix, a gauge keeps its name; the MBean's other keys become labels. Kafka's
all-topics MBean (no ``topic`` key) is the same metric without the label. So::

    kafka_server_BrokerTopicMetrics_RemoteCopyBytesPerSec_total{topic="t"}   counter
    kafka_server_BrokerTopicMetrics_RemoteCopyBytesPerSec_total              counter, all topics
    kafka_server_BrokerTopicMetrics_RemoteLogSizeBytes{topic="t"}            gauge

Families (``{topic}``: per topic and an all-topics series without the label):

- ``kafka_server_BrokerTopicMetrics_<N>_total{topic}`` for N in RemoteCopyBytesPerSec,
  RemoteCopyRequestsPerSec, RemoteCopyErrorsPerSec, RemoteFetchBytesPerSec,
  RemoteFetchRequestsPerSec, RemoteFetchErrorsPerSec, RemoteDeleteRequestsPerSec,
  RemoteDeleteErrorsPerSec, BuildRemoteLogAuxStateRequestsPerSec,
  BuildRemoteLogAuxStateErrorsPerSec (since broker start; a failed attempt counts as a request
  too).
- ``kafka_server_BrokerTopicMetrics_<N>{topic}`` gauges: RemoteCopyLagBytes and
  RemoteCopyLagSegments (inactive local segments not yet copied), RemoteLogSizeBytes (bytes of
  the copied segments), RemoteLogMetadataCount (remote segment metadata in any live state:
  COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED, DELETE_SEGMENT_STARTED), over the partitions
  with tiering enabled or data still in the remote tier.
- ``kafka_log_remote_RemoteLogManager_RemoteLogManagerTasksAvgIdlePercent``: 1 − copy tasks
  running / copier threads, a fraction in [0, 1] as Kafka reports it.
- ``org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderTaskQueueSize``:
  remote reads queued and not yet started.
- ``org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderAvgIdlePercent``:
  the reader threads' idle fraction in [0, 1], averaged over the time since the previous scrape
  (from their busy time; Kafka samples ``1 − active/threads`` instead).
- ``kafka_log_remote_RemoteIndexCache_{Hits,Misses,Evictions}_total`` and
  ``kafka_log_remote_RemoteIndexCache_{Entries,SizeBytes}``: the remote index cache (Strata's
  names; Kafka has no MBean for them).
- ``kafka_log_Log_{Size,NumLogSegments,LogStartOffset,LogEndOffset}{topic,partition}`` and
  ``kafka_server_ReplicaManager_PartitionCount``: the local logs, with or without tiering.
- ``kafka_log_LogManager_OfflineLogDirectoryCount``: log dirs whose last write failed (a full
  disk, an I/O error); back to 0 once a write there succeeds.
- ``kafka_log_LogManager_CordonedLogDirectoryCount``: log dirs ``cordoned.log.dirs`` names
  (KIP-1066).
- KIP-1257 (Kafka 4.4), partition size in percent of retention, integer percent as Kafka's
  gauges: ``kafka_log_Log_RetentionSizeInPercent{topic,partition}`` (the local log against
  ``retention.bytes``; 0 on a tiered topic that copies) and, per tiered partition,
  ``kafka_log_remote_RemoteLogManager_RetentionSizeInPercent{topic,partition}`` (uncopied local
  segments plus the remote tier against ``retention.bytes``: the whole partition) and
  ``kafka_log_remote_RemoteLogManager_LocalRetentionSizeInPercent{topic,partition}`` (the local
  log against the effective ``local.retention.bytes``). Kafka 4.4 has no remote-only
  percentage; the remote tier's bytes are ``RemoteLogSizeBytes``. 0 when the limit is
  unlimited.
- KIP-956 quotas, Kafka's ``kafka.server:type=RemoteLogManager`` metrics (a Kafka ``Metrics``
  sensor: the attribute name, dashes as underscores):
  ``kafka_server_RemoteLogManager_remote_copy_throttle_time_{avg,max}`` and
  ``kafka_server_RemoteLogManager_remote_fetch_throttle_time_{avg,max}`` (ms a copier waited /
  a Fetch skipped remote reads, over Kafka's default 2 × 30 s windows; NaN with none), and the
  quota sensors' measured rates ``kafka_server_RLMCopy_byte_rate`` and
  ``kafka_server_RLMFetch_byte_rate`` (bytes per second).
- Strata's object-store metrics (``strata_`` prefix, from the RSM's ``MeteredObjectStore``):
  ``strata_remote_storage_requests_total{op,topic}``, ``..._bytes_total{op,topic}``,
  ``..._errors_total{op,topic}`` (op: GET, HEAD, PUT, DELETE, LIST; topic "" when the key
  names none), ``strata_remote_storage_estimated_cost_total{topic}`` (dollars, request
  charges at the configured prices) and
  ``strata_remote_storage_incomplete_uploads_removed_total{topic}`` (leftovers of uploads a
  crash interrupted, removed by the remote log manager's sweep: temporary files, incomplete
  multipart uploads).
- Client quotas (``ClientQuotaCollector``): ``kafka_server_{Produce,Fetch}_byte_rate``,
  ``kafka_server_Request_request_time``, ``kafka_server_ControllerMutation_{mutation_rate,tokens}``
  and ``kafka_server_<Group>_throttle_time`` (average ms) per ``{user,client_id}`` quota entity,
  ``kafka_server_<Group>_queue_size`` (channels muted now).
- ``StatsCollector``: any ``stats() -> dict[str, int]`` (a chunk cache, ...) exported under a
  prefix, registered with ``MetricsServer.add_stats``: ``<prefix>_<key>_total`` counters, and
  gauges ``<prefix>_<key>`` for the keys that are levels (``*_bytes``, ``*_entries``, ``size``
  or the ones named as gauges).

- Kafka's broker metrics (``KafkaBrokerCollector``, counted in ``strata.server.broker_metrics``):
  BrokerTopicMetrics BytesIn/BytesOut/MessagesIn/BytesRejected/Failed*/Total*RequestsPerSec,
  RequestMetrics per API (``kafka_network_RequestMetrics_*``), ReplicaManager and
  KafkaController gauges, connection counts, purgatory sizes, LogFlushStats and the event
  loop's idle fraction.

Without tiering the tiered families are present with no samples. docs/metrics.md lists every
name with its type and meaning (tests/unit/test_metrics_reference.py keeps the two in step).

Threads: the HTTP server runs on its own threads (one per request); everything it reads is
either lock-protected (log offsets under the log's lock, counters) or already called from many
threads (the RemoteLogManager's introspection methods).
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.common.types import uuid_to_kafka_str

log = logging.getLogger(__name__)

METRICS_LISTENER_CONFIG = "strata.metrics.listener"

BROKER_TOPIC_METRICS = "kafka_server_BrokerTopicMetrics"
RLM_METRICS = "kafka_log_remote_RemoteLogManager"
THREAD_POOL_METRICS = "org_apache_kafka_storage_internals_log_RemoteStorageThreadPool"
INDEX_CACHE_METRICS = "kafka_log_remote_RemoteIndexCache"
LOG_METRICS = "kafka_log_Log"
REPLICA_MANAGER_METRICS = "kafka_server_ReplicaManager"
LOG_MANAGER_METRICS = "kafka_log_LogManager"
RLM_QUOTA_METRICS = "kafka_server_RemoteLogManager"
REMOTE_STORAGE_METRICS = "strata_remote_storage"

# (name, help): meters, exposed as counters of their cumulative count
TOPIC_COUNTERS = (
    ("RemoteCopyBytesPerSec", "Bytes of segments copied to remote storage."),
    ("RemoteCopyRequestsPerSec", "Segment copies to remote storage attempted."),
    ("RemoteCopyErrorsPerSec", "Segment copies to remote storage that failed."),
    ("RemoteFetchBytesPerSec", "Bytes read from remote storage for consumers."),
    ("RemoteFetchRequestsPerSec", "Consumer reads served from remote storage."),
    ("RemoteFetchErrorsPerSec", "Consumer reads from remote storage that failed."),
    ("RemoteDeleteRequestsPerSec", "Remote segment deletions attempted."),
    ("RemoteDeleteErrorsPerSec", "Remote segment deletions that failed."),
    ("BuildRemoteLogAuxStateRequestsPerSec",
     "Follower rebuilds of leader epochs and producer state from the remote tier (KIP-405)."),
    ("BuildRemoteLogAuxStateErrorsPerSec", "Follower rebuilds from the remote tier that failed."),
)
TOPIC_GAUGES = (
    ("RemoteCopyLagBytes", "Bytes of inactive local segments not yet copied to remote storage."),
    ("RemoteCopyLagSegments", "Inactive local segments not yet copied to remote storage."),
    ("RemoteLogSizeBytes", "Bytes of the segments in remote storage (copy finished)."),
    ("RemoteLogMetadataCount", "Remote log segment metadata entries (any live state)."),
)
LOG_GAUGES = (
    ("Size", "Bytes of the partition's local log."),
    ("NumLogSegments", "Local segments of the partition."),
    ("LogStartOffset", "The partition's log start offset (remote tier included)."),
    ("LogEndOffset", "The partition's log end offset."),
    ("RetentionSizeInPercent", "KIP-1257: the local log's size in percent of retention.bytes "
     "(0 when unlimited, and on a tiered topic that copies: see RemoteLogManager's)."),
)
# KIP-1257 (Kafka 4.4's RemoteStorageMetrics), per tiered partition: (name, help)
RLM_PARTITION_GAUGES = (
    ("RetentionSizeInPercent", "KIP-1257: local segments not yet copied plus the remote tier's "
     "copied segments, in percent of retention.bytes (0 when unlimited)."),
    ("LocalRetentionSizeInPercent", "KIP-1257: the local log's size in percent of the "
     "effective local.retention.bytes (0 when unlimited)."),
)


def size_in_percent(size: int, limit: int) -> int:
    """Kafka's ``size * 100 / limit`` (integer division), 0 for an unlimited ``limit``."""
    return size * 100 // limit if limit > 0 else 0


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """``http://host:port`` to (host, port); an empty host binds every interface."""
    parts = urlsplit(value.strip())
    if parts.scheme != "http" or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(f"{METRICS_LISTENER_CONFIG} must look like http://host:port, got {value!r}")
    return parts.hostname or "", parts.port


# --------------------------------------------------------------------------- live state


def _tiered(ulog: Any) -> bool:
    """Tiering on, or data still in the remote tier (tiering turned off without deletion)."""
    return bool(ulog.remote_log_enabled) or ulog.highest_offset_in_remote_storage >= 0


def partition_state(ulog: Any, rlm: Any = None) -> dict[str, Any]:
    """The ``/tiered/<topic>`` entry of one partition."""
    with ulog.lock:
        segments = list(ulog.local_log.segments)
        out: dict[str, Any] = {
            "partition": ulog.topic_partition.partition,
            "remote_storage_enable": bool(ulog.remote_log_enabled),
            "log_start_offset": ulog.log_start_offset,
            "local_log_start_offset": ulog.local_log_start_offset,
            "high_watermark": ulog.high_watermark,
            "last_stable_offset": ulog.last_stable_offset,
            "log_end_offset": ulog.log_end_offset,
            "highest_offset_in_remote_storage": ulog.highest_offset_in_remote_storage,
            "local_segments": len(segments),
            "local_bytes": sum(s.size for s in segments),
        }
    out["remote_segments"] = out["remote_bytes"] = 0
    if rlm is not None:
        try:
            out.update(rlm.describe(ulog))
        except Exception as exc:  # noqa: BLE001 - report it, keep the local numbers
            out["remote_segments"] = out["remote_bytes"] = None
            out["remote_error"] = str(exc)
    return out


def topic_state(logs: Iterable[Any], topic: str, rlm: Any = None,
                topic_id: Callable[[str], Any] | None = None) -> dict[str, Any] | None:
    """The ``/tiered/<topic>`` document, or None when no partition of ``topic`` is hosted here."""
    mine = sorted((ul for ul in logs if ul.topic_partition.topic == topic),
                  key=lambda ul: ul.topic_partition.partition)
    if not mine:
        return None
    tid = topic_id(topic) if topic_id is not None else None
    partitions = [partition_state(ul, rlm) for ul in mine]
    return {"topic": topic, "topic_id": uuid_to_kafka_str(tid) if tid is not None else None,
            "remote_storage_enable": any(p["remote_storage_enable"] for p in partitions),
            "partitions": partitions}


# --------------------------------------------------------------------------- collector


class BrokerMetricsCollector(Collector):
    """Reads every metric at scrape time (see the module docstring for the names)."""

    def __init__(self, logs: Callable[[], list[Any]], rlm: Any = None,
                 offline_log_dirs: Callable[[], int] = lambda: 0,
                 cordoned_log_dirs: Callable[[], int] = lambda: 0) -> None:
        self._logs = logs
        self._rlm = rlm
        self._offline_log_dirs = offline_log_dirs
        self._cordoned_log_dirs = cordoned_log_dirs
        self._idle_lock = threading.Lock()
        stats = getattr(rlm, "reader_stats", None)
        # (monotonic ns, reader busy ns) at the previous scrape
        self._last_reader = (stats.created_ns, 0) if stats is not None else None

    def describe(self) -> list[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        logs = self._logs()
        families = self._families()
        try:
            self._fill_log_metrics(families, logs)
        except Exception:  # noqa: BLE001 - a scrape never fails as a whole
            log.exception("collecting the log metrics failed")
        if self._rlm is not None:
            for fill in (self._fill_topic_counters, self._fill_topic_gauges,
                         self._fill_pool_metrics, self._fill_index_cache_metrics,
                         self._fill_quota_metrics, self._fill_object_store_metrics):
                try:
                    fill(families, logs)
                except Exception:  # noqa: BLE001
                    log.exception("collecting tiered metrics (%s) failed", fill.__name__)
        return iter(families.values())

    @staticmethod
    def _families() -> dict[str, Metric]:
        f: dict[str, Metric] = {}
        for name, doc in TOPIC_COUNTERS:
            f[name] = CounterMetricFamily(f"{BROKER_TOPIC_METRICS}_{name}", doc, labels=["topic"])
        for name, doc in TOPIC_GAUGES:
            f[name] = GaugeMetricFamily(f"{BROKER_TOPIC_METRICS}_{name}", doc, labels=["topic"])
        f["RemoteLogManagerTasksAvgIdlePercent"] = GaugeMetricFamily(
            f"{RLM_METRICS}_RemoteLogManagerTasksAvgIdlePercent",
            "Idle fraction of the remote log manager's copier threads (0 to 1).")
        f["RemoteLogReaderTaskQueueSize"] = GaugeMetricFamily(
            f"{THREAD_POOL_METRICS}_RemoteLogReaderTaskQueueSize",
            "Remote reads queued for the reader threads, not yet started.")
        f["RemoteLogReaderAvgIdlePercent"] = GaugeMetricFamily(
            f"{THREAD_POOL_METRICS}_RemoteLogReaderAvgIdlePercent",
            "Idle fraction of the remote reader threads since the previous scrape (0 to 1).")
        for name, doc in (("Hits", "Remote index cache lookups served from the cache."),
                          ("Misses", "Remote index cache lookups that fetched the indexes."),
                          ("Evictions", "Remote index cache entries evicted by its size policy.")):
            f[f"IndexCache{name}"] = CounterMetricFamily(f"{INDEX_CACHE_METRICS}_{name}", doc)
        f["IndexCacheEntries"] = GaugeMetricFamily(
            f"{INDEX_CACHE_METRICS}_Entries", "Segments whose indexes the remote index cache holds.")
        f["IndexCacheSizeBytes"] = GaugeMetricFamily(
            f"{INDEX_CACHE_METRICS}_SizeBytes", "Bytes of the remote index cache's files.")
        for name, doc in LOG_GAUGES:
            f[f"Log{name}"] = GaugeMetricFamily(f"{LOG_METRICS}_{name}", doc,
                                                labels=["topic", "partition"])
        f["OfflineLogDirectoryCount"] = GaugeMetricFamily(
            f"{LOG_MANAGER_METRICS}_OfflineLogDirectoryCount",
            "Log dirs whose last write failed (full disk, I/O error).")
        f["CordonedLogDirectoryCount"] = GaugeMetricFamily(
            f"{LOG_MANAGER_METRICS}_CordonedLogDirectoryCount",
            "Log dirs cordoned.log.dirs names (KIP-1066): no new partition goes there.")
        for name, doc in RLM_PARTITION_GAUGES:
            f[f"RLM{name}"] = GaugeMetricFamily(f"{RLM_METRICS}_{name}", doc,
                                                labels=["topic", "partition"])
        f["PartitionCount"] = GaugeMetricFamily(f"{REPLICA_MANAGER_METRICS}_PartitionCount",
                                                "Partitions hosted by this broker.")
        for kind, what in (("copy", "remote copies were throttled by the copy quota"),
                           ("fetch", "remote fetches were throttled by the fetch quota")):
            for stat, word in (("avg", "average"), ("max", "maximum")):
                f[f"{kind}_throttle_{stat}"] = GaugeMetricFamily(
                    f"{RLM_QUOTA_METRICS}_remote_{kind}_throttle_time_{stat}",
                    f"The {word} time in millis {what}.")
        f["copy_byte_rate"] = GaugeMetricFamily(
            "kafka_server_RLMCopy_byte_rate", "Bytes per second admitted by the remote copy quota.")
        f["fetch_byte_rate"] = GaugeMetricFamily(
            "kafka_server_RLMFetch_byte_rate", "Bytes per second read under the remote fetch quota.")
        f["store_requests"] = CounterMetricFamily(
            f"{REMOTE_STORAGE_METRICS}_requests", "Object store requests (failed ones included).",
            labels=["op", "topic"])
        f["store_bytes"] = CounterMetricFamily(
            f"{REMOTE_STORAGE_METRICS}_bytes", "Bytes sent (PUT) or received (GET) by the object "
            "store requests.", labels=["op", "topic"])
        f["store_errors"] = CounterMetricFamily(
            f"{REMOTE_STORAGE_METRICS}_errors", "Object store requests that failed.",
            labels=["op", "topic"])
        f["store_cost"] = CounterMetricFamily(
            f"{REMOTE_STORAGE_METRICS}_estimated_cost", "Estimated request charges of the object "
            "store, in dollars (cost.get/put.per.1000.requests).", labels=["topic"])
        f["store_incomplete_removed"] = CounterMetricFamily(
            f"{REMOTE_STORAGE_METRICS}_incomplete_uploads_removed", "Leftovers of interrupted "
            "uploads (temporary files, incomplete multipart uploads) removed from the store.",
            labels=["topic"])
        return f

    def _fill_log_metrics(self, f: dict[str, Metric], logs: list[Any]) -> None:
        f["PartitionCount"].add_metric([], len(logs))
        f["OfflineLogDirectoryCount"].add_metric([], self._offline_log_dirs())
        f["CordonedLogDirectoryCount"].add_metric([], self._cordoned_log_dirs())
        for ulog in sorted(logs, key=lambda ul: ul.topic_partition):
            tp = ulog.topic_partition
            labels = [tp.topic, str(tp.partition)]
            with ulog.lock:
                segments = list(ulog.local_log.segments)
                size = sum(s.size for s in segments)
                values = {"Size": size, "NumLogSegments": len(segments),
                          "LogStartOffset": ulog.log_start_offset,
                          "LogEndOffset": ulog.log_end_offset,
                          # Kafka's UnifiedLog gauge: 0 while the remote tier takes copies
                          "RetentionSizeInPercent": 0 if ulog.remote_copy_enabled else
                          size_in_percent(size, ulog.config.get("retention.bytes"))}
            for name, value in values.items():
                f[f"Log{name}"].add_metric(labels, value)

    def _fill_topic_counters(self, f: dict[str, Metric], logs: list[Any]) -> None:
        snapshot = self._rlm.metrics.snapshot()
        # every counter of every topic that is tiered or has counted anything, zeros included
        topics = {ul.topic_partition.topic for ul in logs if _tiered(ul)}
        topics.update(t for per_topic in snapshot.values() for t in per_topic)
        for name, _ in TOPIC_COUNTERS:
            per_topic = snapshot.get(name, {})
            for topic in sorted(topics):
                f[name].add_metric([topic], per_topic.get(topic, 0))
            f[name].add_metric([], sum(per_topic.values()))

    def _fill_topic_gauges(self, f: dict[str, Metric], logs: list[Any]) -> None:
        from strata.tiered.api import RemoteLogSegmentState
        totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(
            (n for n, _ in TOPIC_GAUGES), 0))
        for ulog in logs:
            if not _tiered(ulog):
                continue
            topic = ulog.topic_partition.topic
            t = totals[topic]
            try:
                if ulog.remote_log_enabled and not ulog.config.get("remote.log.copy.disable"):
                    lag_bytes, lag_segments = self._rlm.copy_lag(ulog)
                    t["RemoteCopyLagBytes"] += lag_bytes
                    t["RemoteCopyLagSegments"] += lag_segments
                segments = self._rlm.remote_segments(ulog)
            except Exception as exc:  # noqa: BLE001 - a partition not ready, a topic deleted
                log.debug("no remote metrics for %s: %s", ulog.topic_partition, exc)
                continue
            t["RemoteLogMetadataCount"] += len(segments)
            remote_bytes = sum(m.segment_size_in_bytes for m in segments
                               if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
            t["RemoteLogSizeBytes"] += remote_bytes
            if ulog.remote_log_enabled:
                self._fill_retention_percent(f, ulog, remote_bytes)
        for name, _ in TOPIC_GAUGES:
            for topic in sorted(totals):
                f[name].add_metric([topic], totals[topic][name])
            f[name].add_metric([], sum(t[name] for t in totals.values()))

    @staticmethod
    def _fill_retention_percent(f: dict[str, Metric], ulog: Any, remote_bytes: int) -> None:
        """KIP-1257's RemoteLogManager gauges of one tiered partition, as Kafka 4.4's
        expiration task computes them: (local segments not yet copied + copied remote
        segments) / retention.bytes, and the local log / the effective local retention."""
        with ulog.lock:
            highest = ulog.highest_offset_in_remote_storage
            segments = list(ulog.local_log.segments)
            config = ulog.config
        local = sum(s.size for s in segments)
        only_local = sum(s.size for s in segments if s.base_offset > highest)
        labels = [ulog.topic_partition.topic, str(ulog.topic_partition.partition)]
        f["RLMRetentionSizeInPercent"].add_metric(labels, size_in_percent(
            only_local + remote_bytes, config.get("retention.bytes")))
        f["RLMLocalRetentionSizeInPercent"].add_metric(labels, size_in_percent(
            local, config.local_retention_bytes))

    def _fill_pool_metrics(self, f: dict[str, Metric], logs: list[Any]) -> None:
        f["RemoteLogManagerTasksAvgIdlePercent"].add_metric([], self._rlm.copier_idle_fraction())
        stats = getattr(self._rlm, "reader_stats", None)
        if stats is None:
            return
        f["RemoteLogReaderTaskQueueSize"].add_metric([], max(0, stats.queued))
        now = time.monotonic_ns()
        busy = stats.busy_ns(now)
        threads = max(1, stats.threads)
        with self._idle_lock:
            last_now, last_busy = self._last_reader or (now, busy)
            elapsed = now - last_now
            if elapsed > 0:
                idle = 1.0 - (busy - last_busy) / (threads * elapsed)
            else:
                idle = 1.0 - stats.active / threads
            self._last_reader = (now, busy)
        f["RemoteLogReaderAvgIdlePercent"].add_metric([], min(1.0, max(0.0, idle)))

    def _fill_index_cache_metrics(self, f: dict[str, Metric], logs: list[Any]) -> None:
        cache = getattr(getattr(self._rlm, "ctx", None), "index_cache", None)
        if cache is None:
            return
        s = cache.stats()
        f["IndexCacheHits"].add_metric([], s.hits)
        f["IndexCacheMisses"].add_metric([], s.misses)
        f["IndexCacheEvictions"].add_metric([], s.evictions)
        f["IndexCacheEntries"].add_metric([], s.entries)
        f["IndexCacheSizeBytes"].add_metric([], s.size_bytes)


    def _fill_quota_metrics(self, f: dict[str, Metric], logs: list[Any]) -> None:
        quotas = getattr(getattr(self._rlm, "ctx", None), "quotas", None)
        if quotas is None:
            return
        for kind, sensor in (("copy", quotas.copy_throttle), ("fetch", quotas.fetch_throttle)):
            f[f"{kind}_throttle_avg"].add_metric([], sensor.avg())
            f[f"{kind}_throttle_max"].add_metric([], sensor.max())
        f["copy_byte_rate"].add_metric([], quotas.copy.rate())
        f["fetch_byte_rate"].add_metric([], quotas.fetch.rate())

    def _fill_object_store_metrics(self, f: dict[str, Metric], logs: list[Any]) -> None:
        from strata.tiered.storage.object_store import MeteredObjectStore, find_layer
        rsm = getattr(getattr(self._rlm, "ctx", None), "rsm", None)
        try:
            store = getattr(rsm, "store", None)
        except Exception:  # noqa: BLE001 - an RSM not configured (yet)
            store = None
        metered = find_layer(store, MeteredObjectStore)
        if metered is None:
            return
        for (op, topic), stats in sorted(metered.snapshot().items()):
            f["store_requests"].add_metric([op, topic], stats.requests)
            f["store_bytes"].add_metric([op, topic], stats.bytes)
            f["store_errors"].add_metric([op, topic], stats.errors)
        for topic, cost in sorted(metered.estimated_cost().items()):
            f["store_cost"].add_metric([topic], cost)
        for topic, n in sorted(metered.incomplete_uploads_removed().items()):
            f["store_incomplete_removed"].add_metric([topic], n)


class ClientQuotaCollector(Collector):
    """Kafka's client quota sensors (``ClientQuotaManager.metrics``), named as the JMX exporter
    names ``kafka.server:type=<Group>,user=<u>,client-id=<c>`` attributes:
    ``kafka_server_<Group>_<attribute>{user,client_id}`` with dashes as underscores, e.g.
    ``kafka_server_Produce_byte_rate``, ``kafka_server_Fetch_throttle_time``,
    ``kafka_server_Request_request_time``, ``kafka_server_ControllerMutation_tokens``; and
    ``kafka_server_<Group>_queue_size`` (channels being throttled) without labels."""

    def __init__(self, quotas: Any) -> None:
        self._quotas = quotas

    def describe(self) -> list[Metric]:
        return []   # the sensors exist only once clients use them

    def collect(self) -> Iterator[Metric]:
        try:
            samples = self._quotas.metrics()
        except Exception:  # noqa: BLE001 - a scrape never fails as a whole
            log.exception("collecting the client quota metrics failed")
            return iter(())
        families: dict[str, Metric] = {}
        for group, attribute, (user, client_id), value in samples:
            name = f"kafka_server_{group}_{_metric_name(attribute)}"
            labelled = attribute != "queue-size"
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(
                    name, f"kafka.server:type={group} {attribute}",
                    labels=["user", "client_id"] if labelled else None)
            family.add_metric([user, client_id] if labelled else [], value)
        return iter(families.values())


class StatsCollector(Collector):
    """Exports a ``stats() -> dict[str, int | float]`` (a cache's, a pool's) under ``prefix``:
    ``<prefix>_<key>_total`` counters, except the keys that are levels, exported as gauges
    ``<prefix>_<key>``: those in ``gauges`` or, without it, those ending in ``_bytes``,
    ``_entries``, ``_size`` or named ``size``/``entries``. Keys are sanitized to metric-name
    characters. A failing or missing source exports nothing (the scrape goes on)."""

    _GAUGE_SUFFIXES = ("_bytes", "_entries", "_size")

    def __init__(self, prefix: str, stats: Callable[[], dict[str, Any] | None], *,
                 gauges: Iterable[str] | None = None, doc: str = "") -> None:
        self.prefix = _metric_name(prefix)
        self._stats = stats
        self._gauges = set(gauges) if gauges is not None else None
        self._doc = doc

    def _is_gauge(self, key: str) -> bool:
        if self._gauges is not None:
            return key in self._gauges
        return key in ("size", "entries") or key.endswith(self._GAUGE_SUFFIXES)

    def describe(self) -> list[Metric]:
        return []   # the keys are known only at scrape time

    def collect(self) -> Iterator[Metric]:
        try:
            values = self._stats() or {}
        except Exception:  # noqa: BLE001 - a scrape never fails as a whole
            log.exception("collecting %s failed", self.prefix)
            return iter(())
        out: list[Metric] = []
        for key in sorted(values):
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name = f"{self.prefix}_{_metric_name(str(key))}"
            doc = f"{self._doc or self.prefix}: {key}"
            family: Metric = (GaugeMetricFamily(name, doc) if self._is_gauge(str(key))
                              else CounterMetricFamily(name, doc))
            family.add_metric([], value)
            out.append(family)
        return iter(out)


def _metric_name(text: str) -> str:
    """``text`` with every character a Prometheus name may not hold replaced by ``_``."""
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_:") else "_" for c in text)
    return name if name and not name[0].isdigit() else f"_{name}"


# --------------------------------------------------------------------------- HTTP server


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _ThreadingWSGIServer6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        log.debug("metrics endpoint: " + format, *args)


class MetricsApp:
    """The WSGI application: ``/metrics``, ``/tiered/<topic>``, and a short index at ``/``."""

    def __init__(self, registry: CollectorRegistry, logs: Callable[[], list[Any]], rlm: Any = None,
                 topic_id: Callable[[str], Any] | None = None) -> None:
        self._prometheus = make_wsgi_app(registry)
        self._logs = logs
        self._rlm = rlm
        self._topic_id = topic_id

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        # wsgiref decodes the path as latin-1; topic names are ASCII, but be exact anyway
        path = environ.get("PATH_INFO", "/").encode("latin-1", "replace").decode("utf-8", "replace")
        if method not in ("GET", "HEAD"):
            return self._reply(start_response, "405 Method Not Allowed", {"error": "GET only"})
        if path in ("/metrics", "/metrics/"):
            return self._prometheus(environ, start_response)
        if path.startswith("/tiered/") and len(path) > len("/tiered/"):
            topic = path[len("/tiered/"):].rstrip("/")
            try:
                doc = topic_state(self._logs(), topic, self._rlm, self._topic_id)
            except Exception as exc:  # noqa: BLE001
                log.exception("describing %s failed", topic)
                return self._reply(start_response, "500 Internal Server Error", {"error": str(exc)})
            if doc is None:
                return self._reply(start_response, "404 Not Found",
                                   {"error": f"no partition of topic {topic!r} on this broker"})
            return self._reply(start_response, "200 OK", doc)
        if path == "/":
            body = b"Strata metrics endpoint: /metrics (Prometheus), /tiered/<topic> (JSON)\n"
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        return self._reply(start_response, "404 Not Found", {"error": f"no such path {path}"})

    @staticmethod
    def _reply(start_response: Callable, status: str, doc: dict[str, Any]) -> list[bytes]:
        body = (json.dumps(doc, indent=1) + "\n").encode()
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(body)))])
        return [body]


class MetricsServer:
    """The endpoint's HTTP server on its own threads: ``start()`` binds and serves, ``stop()``
    stops serving and closes the socket."""

    def __init__(self, listener: str, *, logs: Callable[[], list[Any]], rlm: Any = None,
                 topic_id: Callable[[str], Any] | None = None,
                 offline_log_dirs: Callable[[], int] = lambda: 0,
                 cordoned_log_dirs: Callable[[], int] = lambda: 0) -> None:
        self.host, self.port = parse_metrics_listener(listener)
        self.registry = CollectorRegistry()
        self.collector = BrokerMetricsCollector(logs, rlm, offline_log_dirs, cordoned_log_dirs)
        self.registry.register(self.collector)
        try:
            ProcessCollector(registry=self.registry)
        except Exception:  # noqa: BLE001 - no /proc: go without process metrics
            log.debug("no process metrics on this platform")
        self.app = MetricsApp(self.registry, logs, rlm, topic_id)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def add_stats(self, prefix: str, stats: Callable[[], dict[str, Any] | None], *,
                  gauges: Iterable[str] | None = None, doc: str = "") -> StatsCollector:
        """Export ``stats()`` (e.g. a chunk cache's ``stats``) under ``prefix`` from now on;
        see ``StatsCollector``."""
        collector = StatsCollector(prefix, stats, gauges=gauges, doc=doc)
        self.registry.register(collector)
        return collector

    @property
    def url(self) -> str:
        host = self.host or "0.0.0.0"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def start(self) -> int:
        """Bind and serve; the port bound (the chosen one for port 0)."""
        host = self.host or "0.0.0.0"
        server_class = _ThreadingWSGIServer6 if ":" in host else _ThreadingWSGIServer
        self._server = make_server(host, self.port, self.app, server_class, _QuietHandler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="metrics-http", daemon=True)
        self._thread.start()
        log.info("metrics endpoint listening on %s (/metrics, /tiered/<topic>)", self.url)
        return self.port

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None


class AuthenticationCollector(Collector):
    """Successful and failed SASL authentications and re-authentications per listener and
    mechanism, Kafka's ``kafka.server:type=socket-server-metrics``
    ``{successful,failed}-{authentication,reauthentication}-total`` as the JMX exporter names
    them (``kafka_server_socket_server_metrics_successful_authentication_total{listener,
    mechanism}``, ...), and ``expired-connections-killed-count`` per listener."""

    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for outcome, counts in (("successful_authentication", self._stats.successful),
                                ("failed_authentication", self._stats.failed_total),
                                ("successful_reauthentication",
                                 self._stats.successful_reauthentication),
                                ("failed_reauthentication", self._stats.failed_reauthentication)):
            family = CounterMetricFamily(
                f"kafka_server_socket_server_metrics_{outcome}",
                f"kafka.server:type=socket-server-metrics {outcome.replace('_', '-')}-total",
                labels=["listener", "mechanism"])
            for (listener, mechanism), value in sorted(dict(counts).items()):
                family.add_metric([listener, mechanism], value)
            yield family
        family = CounterMetricFamily(   # KIP-368: connections closed for an expired session
            "kafka_server_socket_server_metrics_expired_connections_killed_count",
            "kafka.server:type=socket-server-metrics expired-connections-killed-count",
            labels=["listener"])
        for listener, value in sorted(dict(self._stats.expired_connections_killed).items()):
            family.add_metric([listener], value)
        yield family


# --------------------------------------------------------------------------- Kafka's broker metrics

REQUEST_METRICS = "kafka_network_RequestMetrics"
CONTROLLER_METRICS = "kafka_controller_KafkaController"
PURGATORY_METRICS = "kafka_server_DelayedOperationPurgatory"
SOCKET_SERVER_METRICS = "kafka_server_socket_server_metrics"
LOG_FLUSH_METRICS = "kafka_log_LogFlushStats"
EVENT_LOOP_IDLE = "strata_network_EventLoop_AvgIdlePercent"


class KafkaBrokerCollector(Collector):
    """Kafka's broker metrics (issue 48), read at scrape time from what the request path counts
    (``strata.server.broker_metrics``) and from the replica manager, the metadata, the
    listeners and the purgatory. Every input may be None (its families then have no samples).
    See docs/metrics.md for each name."""

    def __init__(self, *, topic_stats: Any = None, request_stats: Any = None,
                 replica_manager: Any = None, metadata: Any = None,
                 servers: Callable[[], Iterable[Any]] = lambda: (), watchers: Any = None,
                 loop_idle: Any = None, flush_stats: Any = None,
                 min_insync_replicas: Callable[[str], int] | None = None) -> None:
        self._topics = topic_stats
        self._requests = request_stats
        self._rm = replica_manager
        self._metadata = metadata
        self._servers = servers
        self._watchers = watchers
        self._loop_idle = loop_idle
        self._flush = flush_stats
        self._min_isr = min_insync_replicas

    def describe(self) -> list[Metric]:
        return list(self._families().values())

    @staticmethod
    def _families() -> dict[str, Metric]:
        from prometheus_client.core import SummaryMetricFamily
        from strata.server.broker_metrics import REQUEST_TIMES, TOPIC_METERS
        f: dict[str, Metric] = {}
        for name, doc in TOPIC_METERS:
            f[name] = CounterMetricFamily(f"{BROKER_TOPIC_METRICS}_{name}", doc, labels=["topic"])
        f["RequestsPerSec"] = CounterMetricFamily(
            f"{REQUEST_METRICS}_RequestsPerSec", "Requests handled, by API and version (Fetch "
            "as FetchConsumer and FetchFollower).", labels=["request", "version"])
        f["ErrorsPerSec"] = CounterMetricFamily(
            f"{REQUEST_METRICS}_ErrorsPerSec", "Error codes in responses, NONE included, by API "
            "and error (each partition's for Produce and Fetch, the top-level one otherwise).",
            labels=["request", "error"])
        for name, doc in REQUEST_TIMES:
            f[name] = SummaryMetricFamily(f"{REQUEST_METRICS}_{name}", doc + " Milliseconds.",
                                          labels=["request"])
        for name, doc in (
                ("UnderReplicatedPartitions", "Partitions led here whose ISR is smaller than "
                 "their replica set."),
                ("UnderMinIsrPartitionCount", "Partitions led here whose ISR is smaller than "
                 "min.insync.replicas."),
                ("LeaderCount", "Partitions led by this broker.")):
            f[name] = GaugeMetricFamily(f"{REPLICA_MANAGER_METRICS}_{name}", doc)
        f["IsrShrinksPerSec"] = CounterMetricFamily(
            f"{REPLICA_MANAGER_METRICS}_IsrShrinksPerSec", "ISR shrinks the controller accepted "
            "for partitions led here.")
        f["IsrExpandsPerSec"] = CounterMetricFamily(
            f"{REPLICA_MANAGER_METRICS}_IsrExpandsPerSec", "ISR expansions the controller "
            "accepted for partitions led here.")
        f["ActiveControllerCount"] = GaugeMetricFamily(
            f"{CONTROLLER_METRICS}_ActiveControllerCount", "1 on the active controller, else 0.")
        f["OfflinePartitionsCount"] = GaugeMetricFamily(
            f"{CONTROLLER_METRICS}_OfflinePartitionsCount", "Partitions without a leader (on "
            "the active controller; 0 elsewhere, as Kafka).")
        f["connection_count"] = GaugeMetricFamily(
            f"{SOCKET_SERVER_METRICS}_connection_count", "Open client connections, by listener.",
            labels=["listener"])
        f["PurgatorySize"] = GaugeMetricFamily(
            f"{PURGATORY_METRICS}_PurgatorySize", "Partition watches of the requests waiting "
            "in the purgatory (a request watches each partition it waits for).",
            labels=["delayedOperation"])
        f["NumDelayedOperations"] = GaugeMetricFamily(
            f"{PURGATORY_METRICS}_NumDelayedOperations", "Requests waiting in the purgatory.",
            labels=["delayedOperation"])
        f["LogFlushRateAndTimeMs"] = SummaryMetricFamily(
            f"{LOG_FLUSH_METRICS}_LogFlushRateAndTimeMs", "Log flushes (fsyncs of a partition's "
            "segments) and their time in milliseconds.")
        f["EventLoopIdle"] = GaugeMetricFamily(
            EVENT_LOOP_IDLE, "Idle fraction (0 to 1) of the broker's event loop thread since the "
            "previous scrape: 1 - its CPU time / wall time (Strata's NetworkProcessorAvgIdlePercent).")
        return f

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for fill in (self._fill_topics, self._fill_requests, self._fill_replicas,
                     self._fill_controller, self._fill_network):
            try:
                fill(families)
            except Exception:  # noqa: BLE001 - a scrape never fails as a whole
                log.exception("collecting Kafka's broker metrics (%s) failed", fill.__name__)
        return iter(families.values())

    def _fill_topics(self, f: dict[str, Metric]) -> None:
        from strata.server.broker_metrics import TOPIC_METERS
        if self._topics is None:
            return
        snapshot = self._topics.snapshot()
        if self._metadata is not None:   # a deleted topic's series go, as Kafka's
            for topic in [t for t in snapshot if self._metadata.topic(t) is None]:
                self._topics.forget(topic)
                del snapshot[topic]
        for i, (name, _) in enumerate(TOPIC_METERS):
            for topic in sorted(snapshot):
                f[name].add_metric([topic], snapshot[topic][i])
            f[name].add_metric([], sum(c[i] for c in snapshot.values()))

    def _fill_requests(self, f: dict[str, Metric]) -> None:
        from strata.common.errors import error_name
        from strata.server.broker_metrics import REQUEST_TIMES
        if self._requests is None:
            return
        requests, errors, times = self._requests.snapshot()
        for (name, version), n in sorted(requests.items()):
            f["RequestsPerSec"].add_metric([name, str(version)], n)
        for (name, code), n in sorted(errors.items()):
            f["ErrorsPerSec"].add_metric([name, error_name(code)], n)
        for name, t in sorted(times.items()):
            for i, (time_name, _) in enumerate(REQUEST_TIMES):
                f[time_name].add_metric([name], count_value=t[0], sum_value=t[1 + i] / 1e6)

    def _fill_replicas(self, f: dict[str, Metric]) -> None:
        if self._rm is None:
            return
        states = self._rm.hosted_states()
        me = self._rm.broker_id
        led = {tp: st for tp, st in states.items() if st.leader == me}
        min_isr = self._min_isr or self._rm.min_insync_replicas
        f["LeaderCount"].add_metric([], len(led))
        f["UnderReplicatedPartitions"].add_metric(
            [], sum(1 for st in led.values() if len(st.isr) < len(st.replicas)))
        f["UnderMinIsrPartitionCount"].add_metric(
            [], sum(1 for tp, st in led.items() if len(st.isr) < min_isr(tp.topic)))
        f["IsrShrinksPerSec"].add_metric([], self._rm.isr_shrinks)
        f["IsrExpandsPerSec"].add_metric([], self._rm.isr_expands)

    def _fill_controller(self, f: dict[str, Metric]) -> None:
        if self._metadata is None:
            return
        active = self._metadata.controller_id == self._metadata.node_id
        f["ActiveControllerCount"].add_metric([], 1 if active else 0)
        offline = 0
        if active:
            for name, info in list(self._metadata.topics().items()):
                for p in range(info.partitions):
                    st = self._metadata.partition_state(name, p)
                    if st is not None and st.leader < 0:
                        offline += 1
        f["OfflinePartitionsCount"].add_metric([], offline)

    def _fill_network(self, f: dict[str, Metric]) -> None:
        counts: dict[str, int] = defaultdict(int)
        for server in self._servers():
            counts[server.listener] += server.connection_count
        for listener, n in sorted(counts.items()):
            f["connection_count"].add_metric([listener], n)
        if self._watchers is not None:
            for kind in ("Produce", "Fetch"):
                f["PurgatorySize"].add_metric([kind], self._watchers.watches.get(kind, 0))
                f["NumDelayedOperations"].add_metric([kind], self._watchers.delayed.get(kind, 0))
        if self._flush is not None:
            count, total_ns = self._flush.snapshot()
            f["LogFlushRateAndTimeMs"].add_metric([], count_value=count, sum_value=total_ns / 1e6)
        if self._loop_idle is not None:
            idle = self._loop_idle.idle_fraction_since_last()
            if idle is not None:
                f["EventLoopIdle"].add_metric([], idle)
