"""Tiered-storage configuration: Kafka's ``RemoteLogManagerConfig`` and the remote-storage
rules of ``LogConfig`` (Apache Kafka 4.3, with 4.4's KIP-1241 copy lag).

Three things live here:

- ``REMOTE_LOG_MANAGER_CONFIG_DEF``: every broker key of Kafka's ``RemoteLogManagerConfig``
  with Kafka's name, type, default, validator and documentation. Two defaults are Strata's:
  ``remote.log.metadata.manager.class.name`` names Strata's topic-based RLMM, and an unset
  ``remote.log.storage.manager.class.name`` resolves to Strata's object-store RSM.
- ``RemoteLogManagerConfig``: the parsed broker properties with typed accessors and the
  prefix-stripped plugin property maps (``rsm_props`` / ``rlmm_props``); ``load_plugin``
  imports a plugin class by its dotted name.
- The validation rules: ``validate_topic_remote_storage`` (a topic's full config, on create
  and on every alter; Kafka's ``LogConfig.validateTopicLogConfigValues``) and
  ``validate_broker_remote_storage`` (the broker's own properties at startup; Kafka's
  ``LogConfig.validateBrokerLogConfigValues`` plus Strata's ``log.remote.storage.enable``).

Topic rules raise ``InvalidConfigError`` (INVALID_CONFIG) with Kafka's messages; broker
rules raise ``ValueError``, which stops the broker from starting.

This module is pure: no I/O except ``load_plugin``'s import. Any thread may use it.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from strata.common.config import (
    LONG_MAX, AbstractConfig, ConfigDef, ConfigType as T, Validator, at_least)
from strata.common.errors import InvalidConfigError

GIB = 1024 * 1024 * 1024

# ---- key names (RemoteLogManagerConfig.*_PROP) -------------------------------------------------

REMOTE_LOG_STORAGE_SYSTEM_ENABLE_PROP = "remote.log.storage.system.enable"
REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP = "remote.log.storage.manager.impl.prefix"
REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX_PROP = "remote.log.metadata.manager.impl.prefix"
REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP = "remote.log.storage.manager.class.name"
REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP = "remote.log.storage.manager.class.path"
REMOTE_LOG_METADATA_MANAGER_CLASS_NAME_PROP = "remote.log.metadata.manager.class.name"
REMOTE_LOG_METADATA_MANAGER_CLASS_PATH_PROP = "remote.log.metadata.manager.class.path"
REMOTE_LOG_METADATA_MANAGER_LISTENER_NAME_PROP = "remote.log.metadata.manager.listener.name"
REMOTE_LOG_METADATA_CUSTOM_METADATA_MAX_BYTES_PROP = "remote.log.metadata.custom.metadata.max.bytes"
REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES_PROP = "remote.log.index.file.cache.total.size.bytes"
REMOTE_LOG_INDEX_FILE_CACHE_TTL_MS_PROP = "remote.log.index.file.cache.ttl.ms"
REMOTE_LOG_MANAGER_THREAD_POOL_SIZE_PROP = "remote.log.manager.thread.pool.size"
REMOTE_LOG_MANAGER_COPIER_THREAD_POOL_SIZE_PROP = "remote.log.manager.copier.thread.pool.size"
REMOTE_LOG_MANAGER_EXPIRATION_THREAD_POOL_SIZE_PROP = "remote.log.manager.expiration.thread.pool.size"
REMOTE_LOG_MANAGER_FOLLOWER_THREAD_POOL_SIZE_PROP = "remote.log.manager.follower.thread.pool.size"
REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_PROP = "remote.log.manager.task.interval.ms"
REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MS_PROP = "remote.log.manager.task.retry.backoff.ms"
REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MAX_MS_PROP = "remote.log.manager.task.retry.backoff.max.ms"
REMOTE_LOG_MANAGER_TASK_RETRY_JITTER_PROP = "remote.log.manager.task.retry.jitter"
REMOTE_LOG_READER_THREADS_PROP = "remote.log.reader.threads"
REMOTE_LOG_READER_MAX_PENDING_TASKS_PROP = "remote.log.reader.max.pending.tasks"
LOG_LOCAL_RETENTION_MS_PROP = "log.local.retention.ms"
LOG_LOCAL_RETENTION_BYTES_PROP = "log.local.retention.bytes"
LOG_REMOTE_COPY_LAG_MS_PROP = "log.remote.copy.lag.ms"          # KIP-1241 (Kafka 4.4)
LOG_REMOTE_COPY_LAG_BYTES_PROP = "log.remote.copy.lag.bytes"
REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND_PROP = "remote.log.manager.copy.max.bytes.per.second"
REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM_PROP = "remote.log.manager.copy.quota.window.num"
REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS_PROP = "remote.log.manager.copy.quota.window.size.seconds"
REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND_PROP = "remote.log.manager.fetch.max.bytes.per.second"
REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM_PROP = "remote.log.manager.fetch.quota.window.num"
REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS_PROP = "remote.log.manager.fetch.quota.window.size.seconds"
REMOTE_FETCH_MAX_WAIT_MS_PROP = "remote.fetch.max.wait.ms"
REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS_PROP = "remote.list.offsets.request.timeout.ms"

# Strata's broker-wide default of the topic config ``remote.storage.enable`` (the KIP's
# "future work" item); see ``validate_broker_remote_storage`` and ClusterMetadata.
LOG_REMOTE_STORAGE_ENABLE_PROP = "log.remote.storage.enable"

# ---- defaults -----------------------------------------------------------------------------------

DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX = "rsm.config."
DEFAULT_REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX = "rlmm.config."
# Kafka: org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager
DEFAULT_REMOTE_LOG_METADATA_MANAGER_CLASS_NAME = (
    "strata.tiered.metadata.topic_based.TopicBasedRemoteLogMetadataManager")
# Kafka has no default RemoteStorageManager; Strata uses this one when none is configured.
DEFAULT_REMOTE_STORAGE_MANAGER_CLASS_NAME = (
    "strata.tiered.storage.remote_storage_manager.ObjectStoreRemoteStorageManager")
# The RSM property (after the prefix is stripped) that names the object store; defaulted by
# ``RemoteLogManagerConfig.rsm_props`` to ``default_remote_storage_url(first log dir)``.
RSM_STORAGE_URL_KEY = "storage.url"
REMOTE_STORAGE_DIR_NAME = "remote-storage"
DEFAULT_LOG_DIR = "/tmp/kafka-logs"  # Kafka's log.dir default

# Properties the broker adds to the plugins' configs (RemoteLogManager.createRemote*Manager).
BROKER_ID_KEY = "broker.id"
CLUSTER_ID_KEY = "cluster.id"
LOG_DIR_KEY = "log.dir"
RLMM_BOOTSTRAP_SERVERS_KEY = "remote.log.metadata.common.client.bootstrap.servers"
RLMM_SECURITY_PROTOCOL_KEY = "remote.log.metadata.common.client.security.protocol"


# ---- validators with Kafka's wording ------------------------------------------------------------

def non_empty_string() -> Validator:
    """Kafka's ``ConfigDef.NonEmptyString`` (None passes: the key is simply unset)."""
    def check(name: str, value: Any) -> None:
        if value is not None and value == "":
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     "String must be non-empty")
    return check


def kafka_range(minimum: float, maximum: float) -> Validator:
    """Kafka's ``ConfigDef.Range.between``, with its two messages."""
    def check(name: str, value: Any) -> None:
        if value < minimum:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     f"Value must be at least {minimum}")
        if value > maximum:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     f"Value must be no more than {maximum}")
    return check


# ---- the ConfigDef (RemoteLogManagerConfig.configDef(), Kafka 4.3) ------------------------------

_FOLLOWER_POOL_DOC = ("Size of the thread pool used in scheduling follower tasks to read the "
                      "highest-uploaded remote-offset for follower partitions.")

REMOTE_LOG_MANAGER_CONFIG_DEF = (
    ConfigDef()
    .define(REMOTE_LOG_STORAGE_SYSTEM_ENABLE_PROP, T.BOOLEAN, False, None,
            "Whether to enable tiered storage functionality in a broker or not. When it is true "
            "broker starts all the services required for the tiered storage functionality.")
    .define(REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP, T.STRING,
            DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX, non_empty_string(),
            "Prefix used for properties to be passed to RemoteStorageManager implementation. "
            "For example this value can be <code>rsm.config.</code>.")
    .define(REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX_PROP, T.STRING,
            DEFAULT_REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX, non_empty_string(),
            "Prefix used for properties to be passed to RemoteLogMetadataManager implementation. "
            "For example this value can be <code>rlmm.config.</code>.")
    .define(REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP, T.STRING, None, non_empty_string(),
            "Fully qualified class name of <code>RemoteStorageManager</code> implementation.")
    .define(REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP, T.STRING, None, None,
            "Class path of the <code>RemoteStorageManager</code> implementation. If specified, "
            "the RemoteStorageManager implementation and its dependent libraries will be loaded "
            "by a dedicated classloader which searches this class path before the Kafka broker "
            "class path. The syntax of this parameter is same as the standard Java class path "
            "string.")
    .define(REMOTE_LOG_METADATA_MANAGER_CLASS_NAME_PROP, T.STRING,
            DEFAULT_REMOTE_LOG_METADATA_MANAGER_CLASS_NAME, non_empty_string(),
            "Fully qualified class name of <code>RemoteLogMetadataManager</code> implementation.")
    .define(REMOTE_LOG_METADATA_MANAGER_CLASS_PATH_PROP, T.STRING, None, None,
            "Class path of the <code>RemoteLogMetadataManager</code> implementation. If "
            "specified, the RemoteLogMetadataManager implementation and its dependent libraries "
            "will be loaded by a dedicated classloader which searches this class path before the "
            "Kafka broker class path. The syntax of this parameter is same as the standard Java "
            "class path string.")
    .define(REMOTE_LOG_METADATA_MANAGER_LISTENER_NAME_PROP, T.STRING, None, non_empty_string(),
            "Listener name of the local broker to which it should get connected if needed by "
            "RemoteLogMetadataManager implementation.")
    .define(REMOTE_LOG_METADATA_CUSTOM_METADATA_MAX_BYTES_PROP, T.INT, 128, at_least(0),
            "The maximum size of custom metadata in bytes that the broker should accept from a "
            "remote storage plugin. If custom  metadata exceeds this limit, the updated segment "
            "metadata will not be stored, the copied data will be attempted to delete, and the "
            "remote copying task for this topic-partition will stop with an error.")
    .define(REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES_PROP, T.LONG, GIB, at_least(1),
            "The total size of the space allocated to store index files fetched from remote "
            "storage in the local storage.")
    .define(REMOTE_LOG_INDEX_FILE_CACHE_TTL_MS_PROP, T.LONG, 900_000, at_least(-1),
            "The maximum time in milliseconds an index file entry can remain in the cache after "
            "its last access. After this duration, the entry will be evicted even if there is "
            "available space. This helps prevent stale index files from remaining in cache "
            "indefinitely, particularly when a broker is no longer the leader for a partition or "
            "when read-from-replica is enabled. Evicted index files are automatically re-fetched "
            "from remote storage when needed. Default is 15 minutes (900000 ms), which provides "
            "sufficient time for clients to read a partition/segment while ensuring stale "
            "entries don't accumulate. Set to -1 to disable time-based eviction and use only "
            "size-based eviction.")
    .define(REMOTE_LOG_MANAGER_THREAD_POOL_SIZE_PROP, T.INT, 2, at_least(1),
            _FOLLOWER_POOL_DOC + " This config is deprecated since 4.2, please use "
            "<code>remote.log.manager.follower.thread.pool.size</code> instead.")
    .define(REMOTE_LOG_MANAGER_COPIER_THREAD_POOL_SIZE_PROP, T.INT, 10, at_least(1),
            "Size of the thread pool used in scheduling tasks to copy segments.")
    .define(REMOTE_LOG_MANAGER_EXPIRATION_THREAD_POOL_SIZE_PROP, T.INT, 10, at_least(1),
            "Size of the thread pool used in scheduling tasks to clean up the expired remote log "
            "segments.")
    .define(REMOTE_LOG_MANAGER_FOLLOWER_THREAD_POOL_SIZE_PROP, T.INT, 2, at_least(1),
            _FOLLOWER_POOL_DOC)
    .define(REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_PROP, T.LONG, 30_000, at_least(1),
            "Interval at which remote log manager runs the scheduled tasks like copy segments, "
            "and clean up remote log segments.")
    .define(REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MS_PROP, T.LONG, 500, at_least(1),
            "The initial amount of wait in milliseconds before the request is retried again.")
    .define(REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MAX_MS_PROP, T.LONG, 30_000, at_least(1),
            "The maximum amount of time in milliseconds to wait when the request is retried "
            "again. The retry duration will increase exponentially for each request failure up "
            "to this maximum wait interval.")
    .define(REMOTE_LOG_MANAGER_TASK_RETRY_JITTER_PROP, T.DOUBLE, 0.2, kafka_range(0, 0.5),
            "The value used in defining the range for computing random jitter factor. It is "
            "applied to the effective exponential term for computing the resultant retry backoff "
            "interval. This will avoid thundering herds of requests. The default value is 0.2 "
            "and valid value should be between 0(inclusive) and 0.5(inclusive). For ex: "
            "remote.log.manager.task.retry.jitter = 0.25, then the range to compute random "
            "jitter will be [1-0.25, 1+0.25) viz [0.75, 1.25). So, jitter factor can be any "
            "random value with in that range.")
    .define(REMOTE_LOG_READER_THREADS_PROP, T.INT, 10, at_least(1),
            "Size of the thread pool that is allocated for handling remote log reads.")
    .define(REMOTE_LOG_READER_MAX_PENDING_TASKS_PROP, T.INT, 100, at_least(1),
            "Maximum remote log reader thread pool task queue size. If the task queue is full, "
            "fetch requests are served with an error.")
    .define(LOG_LOCAL_RETENTION_MS_PROP, T.LONG, -2, at_least(-2),
            "The number of milliseconds to keep the local log segments before it gets eligible "
            "for deletion. Default value is -2, it represents <code>log.retention.ms</code> "
            "value is to be used. The effective value should always be less than or equal to "
            "<code>log.retention.ms</code> value.")
    .define(LOG_LOCAL_RETENTION_BYTES_PROP, T.LONG, -2, at_least(-2),
            "The maximum size of local log segments that can grow for a partition before it "
            "gets eligible for deletion. Default value is -2, it represents "
            "<code>log.retention.bytes</code> value to be used. The effective value should "
            "always be less than or equal to <code>log.retention.bytes</code> value.")
    .define(LOG_REMOTE_COPY_LAG_MS_PROP, T.LONG, 0, at_least(-1),
            "Controls one of the two upload eligibility checks (time and size) for copying "
            "segments to remote storage. A non-active segment is upload-eligible when either "
            "this time-based check or <code>log.remote.copy.lag.bytes</code> is satisfied. When "
            "set to 0, uploads are immediately eligible regardless of lag checks. When set to a "
            "positive value (ms), the segment is time-eligible once elapsed time since its "
            "latest record reaches this value. When set to -1, this value is derived from "
            "effective local retention time (<code>log.local.retention.ms</code>). If that "
            "effective local retention time is unlimited (-1), this time-based check is not "
            "applied. A positive value should not exceed effective local retention time unless "
            "local retention is unlimited (-1).")
    .define(LOG_REMOTE_COPY_LAG_BYTES_PROP, T.LONG, -1, at_least(-1),
            "Controls one of the two upload eligibility checks (time and size) for copying "
            "segments to remote storage. A non-active segment is upload-eligible when either "
            "this size-based check or <code>log.remote.copy.lag.ms</code> is satisfied. When set "
            "to 0, uploads are immediately eligible regardless of lag checks. When set to a "
            "positive value (bytes), the segment is size-eligible once bytes of newer local log "
            "data after that segment reaches this value. When set to -1, this value is derived "
            "from effective local retention size (<code>log.local.retention.bytes</code>). If "
            "that effective local retention size is unlimited (-1), this size-based check is "
            "not applied. A positive value should not exceed effective local retention size "
            "unless local retention is unlimited (-1).")
    .define(REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND_PROP, T.LONG, LONG_MAX, at_least(1),
            "The maximum number of bytes that can be copied from local storage to remote storage "
            "per second. This is a global limit for all the partitions that are being copied "
            "from local storage to remote storage. The default value is Long.MAX_VALUE, which "
            "means there is no limit on the number of bytes that can be copied per second.")
    .define(REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM_PROP, T.INT, 11, at_least(1),
            "The number of samples to retain in memory for remote copy quota management. The "
            "default value is 11, which means there are 10 whole windows + 1 current window.")
    .define(REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS_PROP, T.INT, 1, at_least(1),
            "The time span of each sample for remote copy quota management. The default value "
            "is 1 second.")
    .define(REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND_PROP, T.LONG, LONG_MAX, at_least(1),
            "The maximum number of bytes that can be fetched from remote storage to local "
            "storage per second. This is a global limit for all the partitions that are being "
            "fetched from remote storage to local storage. The default value is Long.MAX_VALUE, "
            "which means there is no limit on the number of bytes that can be fetched per "
            "second.")
    .define(REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM_PROP, T.INT, 11, at_least(1),
            "The number of samples to retain in memory for remote fetch quota management. The "
            "default value is 11, which means there are 10 whole windows + 1 current window.")
    .define(REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS_PROP, T.INT, 1, at_least(1),
            "The time span of each sample for remote fetch quota management. The default value "
            "is 1 second.")
    .define(REMOTE_FETCH_MAX_WAIT_MS_PROP, T.INT, 500, at_least(1),
            "The maximum amount of time the server will wait before answering the fetch request "
            "containing remote fetch partitions. It's important to be aware that the request "
            "will only be responded after all remote partitions have been successfully fetched, "
            "have failed, or this timeout is exceeded.")
    .define(REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS_PROP, T.LONG, 30_000, at_least(1),
            "The maximum amount of time the server will wait for the remote list offsets request "
            "to complete.")
)

# Keys Kafka defines with ``defineInternal``: DescribeConfigs lists them only when set.
INTERNAL_REMOTE_LOG_MANAGER_KEYS = frozenset({
    REMOTE_LOG_INDEX_FILE_CACHE_TTL_MS_PROP,
    REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MS_PROP,
    REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MAX_MS_PROP,
    REMOTE_LOG_MANAGER_TASK_RETRY_JITTER_PROP,
})


# ---- log dirs and the default object store ------------------------------------------------------

def broker_log_dirs(props: Mapping[str, Any]) -> list[str]:
    """The broker's log dirs as Kafka resolves them: ``log.dirs``, else ``log.dir``, else
    ``/tmp/kafka-logs``; comma-separated, blanks dropped."""
    raw = props.get("log.dirs")
    if raw is None or str(raw).strip() == "":
        raw = props.get("log.dir")
    if raw is None or str(raw).strip() == "":
        raw = DEFAULT_LOG_DIR
    dirs = [d.strip() for d in str(raw).split(",") if d.strip()]
    return dirs or [DEFAULT_LOG_DIR]


def default_remote_storage_dir(log_dir: str | os.PathLike[str]) -> Path:
    """Where Strata's object-store RSM keeps remote data when ``rsm.config.storage.url`` is
    unset: ``<first log dir>/remote-storage`` (absolute)."""
    return Path(log_dir).expanduser().absolute() / REMOTE_STORAGE_DIR_NAME


def default_remote_storage_url(log_dir: str | os.PathLike[str]) -> str:
    """``default_remote_storage_dir`` as a ``file://`` URL, the form ``storage.url`` takes."""
    return default_remote_storage_dir(log_dir).as_uri()


# ---- RemoteLogManagerConfig ----------------------------------------------------------------------

class RemoteLogManagerConfig(AbstractConfig):
    """The broker's tiered-storage settings, parsed from ``server.properties``.

    Built from every broker property (unknown keys are kept, so the ``rsm.config.`` and
    ``rlmm.config.`` keys are there to strip). ``cfg.get(name)`` returns a typed value;
    the accessors below mirror Kafka's ``RemoteLogManagerConfig`` methods. Immutable after
    construction; any thread may read it.
    """

    definition = REMOTE_LOG_MANAGER_CONFIG_DEF

    # ---- accessors (Kafka's names, snake_case) ----

    @property
    def is_remote_storage_system_enabled(self) -> bool:
        return bool(self.values[REMOTE_LOG_STORAGE_SYSTEM_ENABLE_PROP])

    @property
    def remote_storage_manager_class_name(self) -> str:
        """The configured RSM class, or Strata's object-store RSM when none is configured."""
        return (self.values[REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP]
                or DEFAULT_REMOTE_STORAGE_MANAGER_CLASS_NAME)

    @property
    def remote_storage_manager_class_path(self) -> str | None:
        return self.values[REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP]

    @property
    def remote_log_metadata_manager_class_name(self) -> str:
        return self.values[REMOTE_LOG_METADATA_MANAGER_CLASS_NAME_PROP]

    @property
    def remote_log_metadata_manager_class_path(self) -> str | None:
        return self.values[REMOTE_LOG_METADATA_MANAGER_CLASS_PATH_PROP]

    @property
    def remote_log_metadata_manager_listener_name(self) -> str | None:
        return self.values[REMOTE_LOG_METADATA_MANAGER_LISTENER_NAME_PROP]

    @property
    def remote_log_metadata_custom_metadata_max_bytes(self) -> int:
        return self.values[REMOTE_LOG_METADATA_CUSTOM_METADATA_MAX_BYTES_PROP]

    @property
    def remote_storage_manager_prefix(self) -> str:
        return self.values[REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP]

    @property
    def remote_log_metadata_manager_prefix(self) -> str:
        return self.values[REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX_PROP]

    @property
    def remote_log_index_file_cache_total_size_bytes(self) -> int:
        return self.values[REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES_PROP]

    @property
    def remote_log_index_file_cache_ttl_ms(self) -> int:
        return self.values[REMOTE_LOG_INDEX_FILE_CACHE_TTL_MS_PROP]

    @property
    def remote_log_manager_follower_thread_pool_size(self) -> int:
        """``remote.log.manager.follower.thread.pool.size`` if set, else the deprecated
        ``remote.log.manager.thread.pool.size`` (both default to 2), as Kafka 4.2+ does."""
        if REMOTE_LOG_MANAGER_FOLLOWER_THREAD_POOL_SIZE_PROP in self.originals:
            return self.values[REMOTE_LOG_MANAGER_FOLLOWER_THREAD_POOL_SIZE_PROP]
        return self.values[REMOTE_LOG_MANAGER_THREAD_POOL_SIZE_PROP]

    @property
    def remote_log_manager_thread_pool_size(self) -> int:
        """Kafka 4.2+: an alias of ``remote_log_manager_follower_thread_pool_size``."""
        return self.remote_log_manager_follower_thread_pool_size

    @property
    def remote_log_manager_copier_thread_pool_size(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_COPIER_THREAD_POOL_SIZE_PROP]

    @property
    def remote_log_manager_expiration_thread_pool_size(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_EXPIRATION_THREAD_POOL_SIZE_PROP]

    @property
    def remote_log_manager_task_interval_ms(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_PROP]

    @property
    def remote_log_manager_task_retry_backoff_ms(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MS_PROP]

    @property
    def remote_log_manager_task_retry_backoff_max_ms(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_TASK_RETRY_BACK_OFF_MAX_MS_PROP]

    @property
    def remote_log_manager_task_retry_jitter(self) -> float:
        return self.values[REMOTE_LOG_MANAGER_TASK_RETRY_JITTER_PROP]

    @property
    def remote_log_reader_threads(self) -> int:
        return self.values[REMOTE_LOG_READER_THREADS_PROP]

    @property
    def remote_log_reader_max_pending_tasks(self) -> int:
        return self.values[REMOTE_LOG_READER_MAX_PENDING_TASKS_PROP]

    @property
    def log_local_retention_ms(self) -> int:
        return self.values[LOG_LOCAL_RETENTION_MS_PROP]

    @property
    def log_local_retention_bytes(self) -> int:
        return self.values[LOG_LOCAL_RETENTION_BYTES_PROP]

    @property
    def remote_log_manager_copy_max_bytes_per_second(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND_PROP]

    @property
    def remote_log_manager_copy_num_quota_samples(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM_PROP]

    @property
    def remote_log_manager_copy_quota_window_size_seconds(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS_PROP]

    @property
    def remote_log_manager_fetch_max_bytes_per_second(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND_PROP]

    @property
    def remote_log_manager_fetch_num_quota_samples(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM_PROP]

    @property
    def remote_log_manager_fetch_quota_window_size_seconds(self) -> int:
        return self.values[REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS_PROP]

    @property
    def remote_fetch_max_wait_ms(self) -> int:
        return self.values[REMOTE_FETCH_MAX_WAIT_MS_PROP]

    @property
    def remote_list_offsets_request_timeout_ms(self) -> int:
        return self.values[REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS_PROP]

    # ---- short names (the broker wiring in strata.cli.main uses these) ----

    system_enabled = is_remote_storage_system_enabled
    rsm_class_name = remote_storage_manager_class_name
    rlmm_class_name = remote_log_metadata_manager_class_name
    index_cache_size_bytes = remote_log_index_file_cache_total_size_bytes
    task_interval_ms = remote_log_manager_task_interval_ms
    retry_backoff_ms = remote_log_manager_task_retry_backoff_ms
    retry_backoff_max_ms = remote_log_manager_task_retry_backoff_max_ms
    retry_jitter = remote_log_manager_task_retry_jitter
    copier_threads = remote_log_manager_copier_thread_pool_size
    expiration_threads = remote_log_manager_expiration_thread_pool_size
    follower_threads = remote_log_manager_follower_thread_pool_size
    reader_threads = remote_log_reader_threads
    reader_max_pending_tasks = remote_log_reader_max_pending_tasks

    # ---- Strata extras ----

    @property
    def log_dirs(self) -> list[str]:
        """The broker's log dirs (``log.dirs`` / ``log.dir``), in order."""
        return broker_log_dirs(self.originals)

    @property
    def default_storage_url(self) -> str:
        """``file://<first log dir>/remote-storage``: the RSM's ``storage.url`` when unset."""
        return default_remote_storage_url(self.log_dirs[0])

    # ---- plugin property maps ----

    def config_props(self, prefix_prop: str) -> dict[str, Any]:
        """Kafka's ``getConfigProps``: the original broker properties whose names start with
        the prefix that ``prefix_prop`` names, prefix stripped (the bare prefix itself is not
        a property). Values are as given (strings from server.properties)."""
        prefix = self.values.get(prefix_prop)
        if prefix is None:
            return {}
        return {k[len(prefix):]: v for k, v in self.originals.items()
                if isinstance(k, str) and k.startswith(prefix) and len(k) > len(prefix)}

    def rsm_props(self, log_dir: str | os.PathLike[str] | None = None, *,
                  broker_id: int | None = None) -> dict[str, Any]:
        """The RemoteStorageManager's ``configure`` map: the ``rsm.config.``-prefixed broker
        properties with the prefix stripped; ``storage.url`` defaulted, when absent or empty,
        to ``file://<log_dir>/remote-storage`` (``log_dir`` defaults to the broker's first log
        dir); ``broker.id`` added when given (Kafka adds it too)."""
        props = self.config_props(REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP)
        if props.get(RSM_STORAGE_URL_KEY) in (None, ""):
            props[RSM_STORAGE_URL_KEY] = (default_remote_storage_url(log_dir)
                                          if log_dir is not None else self.default_storage_url)
        if broker_id is not None:
            props[BROKER_ID_KEY] = broker_id
        return props

    def rlmm_props(self, broker_id: int | None = None, cluster_id: str | None = None,
                   log_dir: str | os.PathLike[str] | None = None,
                   endpoint: tuple[str, int] | None = None,
                   security_protocol: str = "PLAINTEXT") -> dict[str, Any]:
        """The RemoteLogMetadataManager's ``configure`` map, built as Kafka's
        ``RemoteLogManager.createRemoteLogMetadataManager`` builds it: the listener
        ``endpoint`` (host, port) as ``remote.log.metadata.common.client.bootstrap.servers``
        and ``...security.protocol`` if given, then the ``rlmm.config.``-prefixed properties
        (prefix stripped), then ``broker.id``, ``log.dir`` and ``cluster.id`` when given."""
        props: dict[str, Any] = {}
        if endpoint is not None:
            host, port = endpoint
            props[RLMM_BOOTSTRAP_SERVERS_KEY] = f"{host}:{port}"
            props[RLMM_SECURITY_PROTOCOL_KEY] = security_protocol
        props.update(self.config_props(REMOTE_LOG_METADATA_MANAGER_CONFIG_PREFIX_PROP))
        if broker_id is not None:
            props[BROKER_ID_KEY] = broker_id
        if log_dir is not None:
            props[LOG_DIR_KEY] = str(log_dir)
        if cluster_id is not None:
            props[CLUSTER_ID_KEY] = cluster_id
        return props

    # ---- plugins ----

    def remote_storage_manager_class(self) -> type:
        """The RSM class, imported (``remote.log.storage.manager.class.path`` honoured)."""
        return load_plugin(self.remote_storage_manager_class_name,
                           self.remote_storage_manager_class_path)

    def remote_log_metadata_manager_class(self) -> type:
        """The RLMM class, imported (``remote.log.metadata.manager.class.path`` honoured)."""
        return load_plugin(self.remote_log_metadata_manager_class_name,
                           self.remote_log_metadata_manager_class_path)


def load_plugin(class_name: str, class_path: str | None = None,
                expected_type: type | None = None) -> type:
    """Import a plugin class by name: ``package.module.Class``, ``package.module:Class``, or
    ``package.module:Outer.Inner``.

    ``class_path`` (the ``*.class.path`` config) is a list of directories or zip files
    separated by ``os.pathsep``; they are put at the front of ``sys.path`` first, the nearest
    Python has to Kafka's dedicated class loader. ``expected_type``, if given, must be a base
    class of the result. Raises ``ImportError`` naming the class when it cannot be loaded and
    ``TypeError`` when it is not a class or not of the expected type.
    """
    name = (class_name or "").strip()
    if not name:
        raise ImportError("Plugin class name must be non-empty")
    if class_path:
        for entry in reversed([p for p in class_path.split(os.pathsep) if p.strip()]):
            entry = str(Path(entry.strip()).expanduser())
            if entry not in sys.path:
                sys.path.insert(0, entry)
    obj: Any
    if ":" in name:
        module_name, _, attr_path = name.partition(":")
        if not module_name or not attr_path:
            raise ImportError(f"Class {name} cannot be found: expected 'module:Class'")
        try:
            obj = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"Class {name} cannot be found: {exc}") from exc
        attrs = attr_path.split(".")
    else:
        parts = name.split(".")
        if len(parts) < 2:
            raise ImportError(f"Class {name} cannot be found: expected 'module.Class'")
        obj, attrs, error = None, [], None
        # the longest importable module prefix, then attributes (nested classes)
        for cut in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError as exc:
                # only "this prefix is not a module" moves on; a module that exists but
                # fails to import (a missing dependency of it) is reported as is
                prefix, missing = ".".join(parts[:cut]), exc.name or ""
                if not missing or not (prefix == missing or prefix.startswith(missing + ".")):
                    raise ImportError(f"Class {name} cannot be loaded: {exc}") from exc
                error = exc
                continue
            attrs = parts[cut:]
            break
        if obj is None:
            raise ImportError(f"Class {name} cannot be found: {error}") from error
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ImportError(f"Class {name} cannot be found: {exc}") from exc
    if not isinstance(obj, type):
        raise TypeError(f"{name} is not a class")
    if expected_type is not None and not issubclass(obj, expected_type):
        raise TypeError(f"{name} is not an instance of "
                        f"{expected_type.__module__}.{expected_type.__qualname__}")
    return obj


# ---- validation (LogConfig.validateTopicLogConfigValues and friends) ----------------------------

TIERED_STORAGE_DISABLED_MESSAGE = ("Tiered Storage functionality is disabled in the broker. "
                                   "Topic cannot be configured with remote log storage.")
TIERED_TOPICS_REMAIN_MESSAGE = ("You have to delete all topics with the property "
                                "remote.storage.enable=true before disabling tiered storage "
                                "cluster-wide")
CLEANUP_POLICY_MESSAGE = ("Remote log storage only supports topics with cleanup.policy=delete "
                          "or cleanup.policy being an empty list.")
DISABLE_WITHOUT_DELETE_MESSAGE = (
    "It is invalid to disable remote storage without deleting remote data. If you want to keep "
    "the remote data and turn to read only, please set "
    "`remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable remote "
    "storage and delete all remote data, please set "
    "`remote.storage.enable=false,remote.log.delete.on.disable=true`.")
COPY_DISABLED_BYTES_MESSAGE = (
    "When `remote.log.copy.disable` is set to true, the `local.retention.bytes` and "
    "`retention.bytes` must be set to the identical value because there will be no more logs "
    "copied to the remote storage.")
COPY_DISABLED_MS_MESSAGE = (
    "When `remote.log.copy.disable` is set to true, the `local.retention.ms` and `retention.ms` "
    "must be set to the identical value because there will be no more logs copied to the "
    "remote storage.")


def internal_topic_message(topic: str) -> str:
    """Strata's rule (Kafka has none): broker-managed topics are never tiered."""
    return f"Remote log storage is unsupported for the internal topic {topic}"


def _config_error(name: str, value: Any, message: str) -> InvalidConfigError:
    """Kafka's ``ConfigException(name, value, message)`` wording."""
    return InvalidConfigError(f"Invalid value {value} for configuration {name}: {message}")


def remote_retention_size_error(config: Any) -> str | None:
    """``LogConfig.validateRemoteStorageRetentionSize``'s message, or None if valid."""
    total, local = config.get("retention.bytes"), config.get("local.retention.bytes")
    if total > -1 and local != -2:
        if local == -1:
            return str(_config_error("local.retention.bytes", local,
                                     f"Value must not be -1 as retention.bytes value is set as "
                                     f"{total}."))
        if local > total:
            return str(_config_error("local.retention.bytes", local,
                                     f"Value must not be more than retention.bytes property "
                                     f"value: {total}"))
    return None


def remote_retention_time_error(config: Any) -> str | None:
    """``LogConfig.validateRemoteStorageRetentionTime``'s message, or None if valid."""
    total, local = config.get("retention.ms"), config.get("local.retention.ms")
    if total != -1 and local != -2:
        if local == -1:
            return str(_config_error("local.retention.ms", local,
                                     f"Value must not be -1 as retention.ms value is set as "
                                     f"{total}."))
        if local > total:
            return str(_config_error("local.retention.ms", local,
                                     f"Value must not be more than retention.ms property "
                                     f"value: {total}"))
    return None


def remote_copy_lag_errors(config: Any, prefix: str = "") -> list[str]:
    """KIP-1241's rule (Kafka 4.4's ``LogConfig.validateRemoteCopyLagSize`` then ``...Time``):
    a positive copy lag must not exceed the effective local retention (``local.retention.*``,
    −2 meaning ``retention.*``) unless that is unlimited. ``config`` holds topic-level values;
    ``prefix="log."`` words the messages with the broker keys. Messages of the breaches."""
    out = []
    for unit, total_key in (("bytes", "retention.bytes"), ("ms", "retention.ms")):
        local = config.get(f"local.retention.{unit}")
        effective = config.get(total_key) if local == -2 else local
        lag = config.get(f"remote.copy.lag.{unit}")
        if lag > 0 and effective >= 0 and lag > effective:
            out.append(str(_config_error(
                f"{prefix}remote.copy.lag.{unit}", lag,
                f"Value must not exceed {prefix}local.retention.{unit} (effective value: "
                f"{effective})")))
    return out


def inherited_local_retention_caps(config: Any, overrides: Mapping[str, Any]) -> dict[str, int]:
    """Strata's rule for a local retention the topic inherits from the broker
    (``log.local.retention.*``): capped at the topic's own retention, so the effective value
    is min(inherited, retention) for time and bytes alike, and a short ``retention.ms`` or
    ``retention.bytes`` is never refused because of a broker default. Values set on the
    topic itself are not capped: Kafka's rule (rules 4 and 5 below) judges them.

    ``config`` is the topic's LogConfig before capping; returns the keys to override and
    their capped values (empty when the inherited values fit)."""
    caps = {}
    for key, effective in (("local.retention.ms", config.local_retention_ms),
                           ("local.retention.bytes", config.local_retention_bytes)):
        inherited = config.get(key)
        if key not in overrides and inherited != -2 and inherited != effective:
            caps[key] = effective
    return caps


def inherited_tiering_remote_data_message(topic: str, reason: str) -> str:
    """Why a topic tiered only by ``log.remote.storage.enable`` cannot stop being tiered."""
    return (f"Topic {topic} is tiered by the broker default {LOG_REMOTE_STORAGE_ENABLE_PROP}=true "
            f"and {reason}: it cannot stop being tiered (compacted topics are not tiered) "
            "while that data is there. To delete the remote data and stop tiering, set "
            "`remote.storage.enable=false,remote.log.delete.on.disable=true` with this change; "
            "to keep the data, keep the topic tiered (cleanup.policy=delete).")


def validate_topic_remote_storage(config: Any, old: Any | None, *, system_enabled: bool,
                                  topic: str = "", internal: bool = False,
                                  tiering_inherited: bool = False) -> None:
    """Kafka's remote-storage rules for a topic's full effective config (overrides merged
    over the broker's defaults), in Kafka's order; raises ``InvalidConfigError``.

    ``config`` and ``old`` (the config before this change; None on create) are LogConfigs or
    anything with ``get(name)`` returning typed values. ``internal`` marks a broker-managed
    topic (``__consumer_offsets``, ``__remote_log_metadata``, ...), which is never tiered.
    ``tiering_inherited``: ``old`` was tiered by Strata's ``log.remote.storage.enable``
    default, not by ``remote.storage.enable`` set on the topic.

    With ``remote.storage.enable=true``:
      1. the broker's ``remote.log.storage.system.enable`` must be true;
      2. ``cleanup.policy`` must be exactly ``delete`` or empty (so no compaction);
      3. (Strata) the topic must not be internal;
      4. ``local.retention.bytes`` ≠ −2 with ``retention.bytes`` ≥ 0: not −1 and ≤ it;
      5. ``local.retention.ms`` ≠ −2 with ``retention.ms`` ≠ −1: not −1 and ≤ it;
      5a. (Kafka 4.4, KIP-1241) a positive ``remote.copy.lag.bytes`` / ``.ms`` not above the
         effective local retention when that is limited (``remote_copy_lag_errors``);
      6. with ``remote.log.copy.disable=true``: each local retention −2 or equal to the total
         (bytes checked before ms).
    With ``remote.storage.enable=false`` on a topic that had it true:
      7. ``remote.log.delete.on.disable=true`` is required -- unless the tiering was inherited
         (Strata): then the change passes here and the tiered layer's hook
         (``ClusterMetadata.config_validator``) refuses it while the topic has remote data.
    """
    if config.get("remote.storage.enable"):
        if not system_enabled:
            raise InvalidConfigError(TIERED_STORAGE_DISABLED_MESSAGE)
        # Kafka 4.3 parses LIST values without duplicates, so "delete,delete" is "delete"
        policy = list(dict.fromkeys(config.get("cleanup.policy") or []))
        if policy and policy != ["delete"]:
            raise InvalidConfigError(CLEANUP_POLICY_MESSAGE)
        if internal:
            raise InvalidConfigError(internal_topic_message(topic))
        for check in (remote_retention_size_error, remote_retention_time_error):
            message = check(config)
            if message is not None:
                raise InvalidConfigError(message)
        for message in remote_copy_lag_errors(config):
            raise InvalidConfigError(message)
        if config.get("remote.log.copy.disable"):
            local_bytes = config.get("local.retention.bytes")
            if local_bytes != -2 and local_bytes != config.get("retention.bytes"):
                raise InvalidConfigError(COPY_DISABLED_BYTES_MESSAGE)
            local_ms = config.get("local.retention.ms")
            if local_ms != -2 and local_ms != config.get("retention.ms"):
                raise InvalidConfigError(COPY_DISABLED_MS_MESSAGE)
    else:
        was_enabled = old is not None and bool(old.get("remote.storage.enable"))
        if was_enabled and not config.get("remote.log.delete.on.disable") \
                and not tiering_inherited:
            raise InvalidConfigError(DISABLE_WITHOUT_DELETE_MESSAGE)


def validate_broker_remote_storage(rlm_config: RemoteLogManagerConfig,
                                   default_log_config: Any) -> None:
    """The broker's own tiering settings, checked once at startup; raises ``ValueError``.

    ``default_log_config`` is the topic-config defaults the broker's ``log.*`` keys imply.
    Rules: Strata's ``log.remote.storage.enable=true`` (tier every new topic by default) needs
    ``remote.log.storage.system.enable=true``; and, as Kafka's
    ``LogConfig.validateBrokerLogConfigValues`` does when tiering is enabled, the broker's
    ``log.local.retention.*`` must fit its ``log.retention.*``.
    """
    system_enabled = rlm_config.is_remote_storage_system_enabled
    if default_log_config.get("remote.storage.enable") and not system_enabled:
        raise ValueError(
            f"{LOG_REMOTE_STORAGE_ENABLE_PROP}=true requires "
            f"{REMOTE_LOG_STORAGE_SYSTEM_ENABLE_PROP}=true: tiered storage functionality is "
            "disabled in the broker, so new topics cannot be tiered by default. Set "
            f"{REMOTE_LOG_STORAGE_SYSTEM_ENABLE_PROP}=true or remove "
            f"{LOG_REMOTE_STORAGE_ENABLE_PROP}.")
    if system_enabled:
        for check in (remote_retention_size_error, remote_retention_time_error):
            message = check(default_log_config)
            if message is not None:
                raise ValueError(message)


def validate_stored_topic_remote_storage(topic: str, config: Any, *,
                                         system_enabled: bool) -> None:
    """A topic loaded from the metadata store (at broker start) with
    ``remote.storage.enable=true`` while the broker's tiering is disabled stops the broker,
    as Kafka's ``LogManager.updateTopicConfig`` does; raises ``ValueError``."""
    if config.get("remote.storage.enable") and not system_enabled:
        raise ValueError(f"{TIERED_TOPICS_REMAIN_MESSAGE} (topic {topic} has "
                         "remote.storage.enable=true)")
