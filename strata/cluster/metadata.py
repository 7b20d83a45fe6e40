"""The single node's cluster metadata: identity, topics, topic configs (the embedded controller).

``ClusterMetadata`` plays the part of Kafka's KRaft controller for one node: it owns the
topics (name, id, partition count, config overrides), applies Kafka's CreateTopics,
DeleteTopics, CreatePartitions, AlterConfigs, IncrementalAlterConfigs and DescribeConfigs
rules, and tells listeners (the log manager, the tiered-storage layer) about every change.
Topic configs also pass Kafka's tiered-storage rules (``strata.tiered.config``), and the broker
refuses to start with an inconsistent tiering setup (``remote.log.storage.system.enable``,
Strata's ``log.remote.storage.enable`` default, tiered topics left behind).

On disk, in the first log dir:

- ``meta.properties``: Kafka's v1 format (``version=1``, ``node.id``, ``cluster.id``,
  ``directory.id``), written on first start and checked on every later one.
- ``__strata_cluster_metadata.json``: every topic, and the dynamic broker configs when any
  is set, rewritten whole and atomically (tmp file, fsync, rename, dir fsync) by each
  mutation::

      {"version": 1, "cluster_id": "<22 chars>",
       "topics": [{"name": "orders", "topic_id": "<Kafka base64 uuid>", "partitions": 3,
                   "configs": {"retention.ms": "3600000"}}],
       "broker_configs": {"": {"remote.log.manager.fetch.max.bytes.per.second": "1048576"},
                          "1": {"remote.log.manager.copy.max.bytes.per.second": "5242880"}}}

  ``broker_configs`` is keyed by BROKER resource name as Kafka's config records are: ""
  (the cluster-wide default) and this node's id. Only ``DYNAMIC_BROKER_CONFIGS`` may be set
  (through AlterConfigs / IncrementalAlterConfigs); a per-broker value wins over the default,
  which wins over server.properties. An older Strata ignores the key.

  ``users`` (when any) holds each user's entity configs as ZooKeeper's ``/config/users/<user>``
  does: SCRAM credentials in Kafka's string form under their mechanism's name
  (``{"alice": {"SCRAM-SHA-512": "salt=...,stored_key=...,server_key=...,iterations=4096"}}``),
  set by AlterUserScramCredentials (``cluster/scram_credentials.py`` has the rules); other
  entries of a user are kept as they are.

Invariants: topic ids are random version-4 UUIDs, never the zero or one UUID, whose Kafka
string form does not start with ``-`` (Kafka's ``Uuid.randomUuid``); ``configs`` holds only
topic-level overrides, as the strings the client sent.

Threads: any thread may call any method. Reads are lock-free (they see an immutable image
that each mutation replaces whole); mutations hold one re-entrant lock from validation
through persistence and listener calls, so listeners see changes one at a time, in order,
and only after the change is durable. A listener may read the metadata from its callback.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from strata.common.config import ConfigType, load_properties
from strata.common.errors import (
    ErrorCode, InvalidConfigError, InvalidRequestError, KafkaError, KafkaStorageError)
from strata.common.files import atomic_write, descriptor_limit
from strata.common.kafka_broker_configs import KAFKA_BROKER_CONFIGS
from strata.common.types import TopicPartition
from strata.common.types import uuid_from_kafka_str, uuid_to_kafka_str  # noqa: F401 - re-exported
from strata.log.log_config import BROKER_SYNONYMS, LOG_CONFIG_DEF, LogConfig, topic_defaults_from_broker
from strata.log.log_dir_failure import LogDirFailureChannel
from strata.log.log_manager import (
    CORDONED_LOG_DIRS_PROP, cordoned_log_dirs, cordoned_log_dirs_error)
from strata.tiered.config import (
    INTERNAL_REMOTE_LOG_MANAGER_KEYS, LOG_REMOTE_COPY_LAG_BYTES_PROP, LOG_REMOTE_COPY_LAG_MS_PROP,
    LOG_REMOTE_STORAGE_ENABLE_PROP, REMOTE_LOG_MANAGER_CONFIG_DEF, broker_log_dirs,
    REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND_PROP,
    REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND_PROP, RemoteLogManagerConfig,
    inherited_local_retention_caps, remote_copy_lag_errors, validate_broker_remote_storage,
    validate_stored_topic_remote_storage, validate_topic_remote_storage)
from strata.replication.quota import DYNAMIC_REPLICATION_QUOTA_CONFIGS, REPLICATION_QUOTA_CONFIG_DEF
from strata.cluster.image import PartitionState
from strata.cluster import scram_credentials
from strata.cluster.read_replicas import NO_READ_REPLICAS, ReadReplicas
from strata.security.scram import ScramCredential, user_credentials

log = logging.getLogger(__name__)

META_PROPERTIES_FILE = "meta.properties"
METADATA_FILE = "__strata_cluster_metadata.json"
METADATA_FORMAT_VERSION = 1

# org.apache.kafka.common.internals.Topic
GROUP_METADATA_TOPIC_NAME = "__consumer_offsets"
TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"
SHARE_GROUP_STATE_TOPIC_NAME = "__share_group_state"
CLUSTER_METADATA_TOPIC_NAME = "__cluster_metadata"
REMOTE_LOG_METADATA_TOPIC_NAME = "__remote_log_metadata"
# Kafka's Topic.isInternal set (the Metadata response's is_internal flag).
INTERNAL_TOPICS = frozenset({GROUP_METADATA_TOPIC_NAME, TRANSACTION_STATE_TOPIC_NAME,
                             SHARE_GROUP_STATE_TOPIC_NAME})
# Topics the broker creates for itself through ``create_internal_topic``.
BROKER_MANAGED_TOPICS = INTERNAL_TOPICS | {REMOTE_LOG_METADATA_TOPIC_NAME}
# Topics never tiered: the broker-wide ``log.remote.storage.enable`` default skips them and an
# explicit ``remote.storage.enable=true`` on them is refused.
NEVER_TIERED_TOPICS = BROKER_MANAGED_TOPICS | {CLUSTER_METADATA_TOPIC_NAME}
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")

ZERO_UUID = uuid.UUID(int=0)
_ONE_UUID = uuid.UUID(int=1)

# IncrementalAlterConfigs operation types (AlterConfigOp.OpType ids).
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

LONG_MAX = 2**63 - 1

# Kafka's controller refuses an operation that would write more records than this (its
# MAX_RECORDS_PER_USER_OP): a topic, each of its partitions and each config override is one.
MAX_RECORDS_PER_USER_OP = 10_000
EXCESSIVE_BATCH_MESSAGE = "Unable to perform excessively large batch operation."
# Partitions this broker may host (the name KIP-578 proposed; Apache Kafka has no such bound).
# Unset, it follows the open-file limit: a partition at rest holds DESCRIPTORS_PER_PARTITION
# (its active segment's log file; index maps hold none), one more is kept per partition for
# older segments, and DESCRIPTORS_RESERVED stay for connections and the remote tier.
MAX_BROKER_PARTITIONS_PROP = "max.broker.partitions"
SENDFILE_PROP = "strata.fetch.sendfile.enable"
DESCRIPTORS_PER_PARTITION = 1
DESCRIPTORS_RESERVED = 4096


def default_max_broker_partitions(open_file_limit: int) -> int:
    """``max.broker.partitions`` when unset: what ``open_file_limit`` descriptors can hold."""
    return max(100, (open_file_limit - DESCRIPTORS_RESERVED) // (DESCRIPTORS_PER_PARTITION + 1))

# Broker configs that AlterConfigs / IncrementalAlterConfigs may change at runtime, for this
# node or as the cluster-wide default (Kafka's DynamicRemoteLogConfig keys Strata applies live:
# the KIP-956 quotas; and of its DynamicLogConfig keys, KIP-1241's copy lags, the defaults of
# the topic configs remote.copy.lag.*, and KIP-1066's cordoned.log.dirs). Every other broker
# config is static.
DYNAMIC_BROKER_CONFIGS = frozenset({
    CORDONED_LOG_DIRS_PROP,
    REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND_PROP,
    REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND_PROP,
    LOG_REMOTE_COPY_LAG_MS_PROP,
    LOG_REMOTE_COPY_LAG_BYTES_PROP,
}) | DYNAMIC_REPLICATION_QUOTA_CONFIGS
DEFAULT_BROKER_RESOURCE = ""   # the BROKER resource name of the cluster-wide defaults
# Kafka's dynamic security configs (SslConfigs.RECONFIGURABLE_CONFIGS and the DN/SAN switches):
# per broker, with a listener prefix only; a keystore or truststore reloaded live
LISTENER_SSL_CONFIGS = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.keystore.key", "ssl.keystore.certificate.chain", "ssl.truststore.type",
    "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.certificates",
    "ssl.allow.dn.changes", "ssl.allow.san.changes"})
_LISTENER_CONFIG = re.compile(r"listener\.name\.[^.]+\.(.+)")


def is_listener_ssl_config(key: str) -> bool:
    m = _LISTENER_CONFIG.fullmatch(key)
    return m is not None and m.group(1) in LISTENER_SSL_CONFIGS


def broker_config_type(name: str) -> ConfigType | None:
    """A broker config's type: Strata's definition, else Kafka's (``KafkaConfig``); None for
    a config neither knows."""
    key = BROKER_CONFIG_KEYS.get(name)
    if key is not None:
        return key.type
    kafka = KAFKA_BROKER_CONFIGS.get(name)
    return ConfigType[kafka[0]] if kafka is not None else None


def sensitive_broker_config(name: str) -> bool:
    """Kafka's rule for describing and logging a broker config (``KafkaConfig.maybeSensitive``):
    PASSWORD types, listener SSL passwords and keys, and any config it does not know are
    sensitive; every other known config (``broker.rack``, ``replica.selector.class``) is not."""
    if is_listener_ssl_config(name):
        return name.endswith((".password", ".ssl.keystore.key"))
    type_ = broker_config_type(name)
    return type_ is None or type_ is ConfigType.PASSWORD


def loggable_broker_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """``configs`` (or configs by resource) with sensitive values as Kafka logs them:
    ``[hidden]``."""
    return {k: loggable_broker_configs(v) if isinstance(v, Mapping)
            else "[hidden]" if sensitive_broker_config(k) else v for k, v in configs.items()}


def static_broker_configs_message(keys: Iterable[str]) -> str:
    """Why a change to static broker configs is refused (INVALID_REQUEST)."""
    return ("Strata reads broker configs from server.properties only; dynamic broker configs "
            f"are not supported: {', '.join(keys)}")


class MetaPropertiesError(RuntimeError):
    """``meta.properties`` or the metadata file is unreadable or belongs to another node/cluster."""


# Kafka UUID strings live in strata.common.types (re-exported here for callers).


def random_kafka_uuid() -> uuid.UUID:
    """Kafka's ``Uuid.randomUuid``: version 4, never 0 or 1, string form never starting with '-'."""
    while True:
        u = uuid.uuid4()
        if u not in (ZERO_UUID, _ONE_UUID) and not uuid_to_kafka_str(u).startswith("-"):
            return u


def random_directory_id() -> uuid.UUID:
    """Kafka's ``DirectoryId.random``: a random Kafka uuid outside the 100 reserved ids."""
    while True:
        u = random_kafka_uuid()
        if u.int >= 100:
            return u


# ---- topic names -------------------------------------------------------------------------------

def is_internal_topic(name: str) -> bool:
    """Kafka's ``Topic.isInternal``."""
    return name in INTERNAL_TOPICS


def invalid_topic_reason(name: str) -> str | None:
    """Why ``name`` is not a legal topic name (Kafka's wording), or None if it is."""
    if not name:
        return "the empty string is not allowed"
    if name == ".":
        return "'.' is not allowed"
    if name == "..":
        return "'..' is not allowed"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (f"the length of '{name}' is longer than the max allowed length "
                f"{MAX_TOPIC_NAME_LENGTH}")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        return (f"'{name}' contains one or more characters other than ASCII alphanumerics, "
                "'.', '_' and '-'")
    return None


def validate_topic_name(name: str) -> None:
    """Kafka's ``Topic.validate``: raise INVALID_TOPIC_EXCEPTION for an illegal name."""
    reason = invalid_topic_reason(name)
    if reason is not None:
        raise KafkaError(f"Topic name is invalid: {reason}", code=ErrorCode.INVALID_TOPIC_EXCEPTION)


def check_records_per_operation(records: int) -> None:
    """POLICY_VIOLATION, as Kafka's controller answers, for an operation of more records than
    ``MAX_RECORDS_PER_USER_OP``; nothing of it is written."""
    if records > MAX_RECORDS_PER_USER_OP:
        raise KafkaError(EXCESSIVE_BATCH_MESSAGE, code=ErrorCode.POLICY_VIOLATION)


def unify_collision_chars(name: str) -> str:
    """Kafka's ``Topic.unifyCollisionChars``: '.' and '_' collide in metric names."""
    return name.replace(".", "_")


# ---- value types -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # topic-level overrides only

    @property
    def internal(self) -> bool:
        return is_internal_topic(self.name)


class ConfigSource(IntEnum):
    """DescribeConfigsResponse.ConfigSource ids (the wire values)."""
    UNKNOWN = 0
    TOPIC_CONFIG = 1
    DYNAMIC_TOPIC_CONFIG = 1  # the admin client's name for it
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class ConfigEntryType(IntEnum):
    """DescribeConfigsResponse.ConfigType ids (DescribeConfigs v3+ ``config_type``)."""
    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


_ENTRY_TYPE = {
    ConfigType.BOOLEAN: ConfigEntryType.BOOLEAN, ConfigType.STRING: ConfigEntryType.STRING,
    ConfigType.INT: ConfigEntryType.INT, ConfigType.SHORT: ConfigEntryType.SHORT,
    ConfigType.LONG: ConfigEntryType.LONG, ConfigType.DOUBLE: ConfigEntryType.DOUBLE,
    ConfigType.LIST: ConfigEntryType.LIST, ConfigType.CLASS: ConfigEntryType.CLASS,
    ConfigType.PASSWORD: ConfigEntryType.PASSWORD,
}


class ConfigSynonym(NamedTuple):
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True)
class ConfigEntry:
    """One DescribeConfigs result entry, ready for the response."""
    name: str
    value: str | None
    read_only: bool
    source: ConfigSource
    is_sensitive: bool
    synonyms: list[ConfigSynonym]
    config_type: ConfigEntryType
    documentation: str | None


# ---- rendering values as Kafka does (ConfigDef.convertToString) -------------------------------

def _java_double(x: float) -> str:
    """Java's ``Double.toString``."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    if 1e-3 <= abs(x) < 1e7:
        s = repr(float(x))
        return s if "." in s else s + ".0"
    sign, digits, exp = Decimal(repr(float(x))).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    exponent = len(digits) - 1 + exp
    return f"{'-' if sign else ''}{ds[0]}.{ds[1:] or '0'}E{exponent}"


def render_config_value(value: Any, type_: ConfigType | None) -> str | None:
    """A typed config value as Kafka renders it: lists comma-joined, booleans lowercase."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_ is ConfigType.LIST or isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    if type_ is ConfigType.DOUBLE or isinstance(value, float):
        return _java_double(float(value))
    return str(value)


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")
_INT_BOUNDS = {ConfigType.SHORT: 2**15, ConfigType.INT: 2**31, ConfigType.LONG: 2**63}


def _check_number_syntax(name: str, value: str) -> None:
    """Kafka's parse error for a number that Java would not parse ("Not a number of type INT")."""
    key = LOG_CONFIG_DEF[name]
    s = str(value).strip()
    if key.type in _INT_BOUNDS:
        bound = _INT_BOUNDS[key.type]
        if not _INTEGER.fullmatch(s) or not -bound <= int(s) < bound:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     f"Not a number of type {key.type.name}")
    elif key.type is ConfigType.DOUBLE and not _DOUBLE.fullmatch(s):
        raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                 "Not a number of type DOUBLE")


# ---- broker configs known to DescribeConfigs ---------------------------------------------------

class _BrokerKey(NamedTuple):
    type: ConfigType
    default: str | None          # Kafka's default, rendered; None: no default
    doc: str
    internal: bool = False       # Kafka's defineInternal: described only when set


_T = ConfigType
BROKER_CONFIG_KEYS: dict[str, _BrokerKey] = {
    "node.id": _BrokerKey(_T.INT, "1", "The node ID of this server."),
    "process.roles": _BrokerKey(_T.LIST, "broker,controller",
                                "The roles this process plays (one node plays both)."),
    "listeners": _BrokerKey(_T.STRING, "PLAINTEXT://:9092",
                            "Listener list: URIs the server listens on."),
    "advertised.listeners": _BrokerKey(_T.STRING, None,
                                       "Listeners published to clients, if not `listeners`."),
    "log.dirs": _BrokerKey(_T.STRING, None, "Directories in which the log data is kept."),
    "log.dir": _BrokerKey(_T.STRING, "/tmp/kafka-logs",
                          "The directory in which the log data is kept (if log.dirs is unset)."),
    "num.partitions": _BrokerKey(_T.INT, "1", "The default number of log partitions per topic."),
    "default.replication.factor": _BrokerKey(_T.INT, "1",
                                             "The default replication factor for topics."),
    "auto.create.topics.enable": _BrokerKey(_T.BOOLEAN, "true",
                                            "Enable auto creation of topics on the server."),
    "delete.topic.enable": _BrokerKey(_T.BOOLEAN, "true", "Enables topic deletion."),
    "fetch.max.bytes": _BrokerKey(_T.INT, "57671680", "The maximum number of bytes returned "
                                  "for a fetch request."),
    "message.max.bytes": _BrokerKey(_T.INT, "1048588",
                                    "The largest record batch size allowed by Kafka."),
    "socket.request.max.bytes": _BrokerKey(_T.INT, "104857600",
                                           "The maximum number of bytes in a socket request."),
    "socket.send.buffer.bytes": _BrokerKey(_T.INT, "-1", "The SO_SNDBUF buffer of the "
                                           "socket server sockets. If the value is -1, the OS "
                                           "default will be used."),
    "socket.receive.buffer.bytes": _BrokerKey(_T.INT, "-1", "The SO_RCVBUF buffer of the "
                                              "socket server sockets. If the value is -1, the OS "
                                              "default will be used."),
    "log.segment.bytes": _BrokerKey(_T.INT, "1073741824",
                                    "The maximum size of a single log file."),
    "log.roll.ms": _BrokerKey(_T.LONG, None, "The maximum time before a new segment is rolled "
                              "out (in milliseconds)."),
    "log.roll.hours": _BrokerKey(_T.INT, "168", "The maximum time before a new segment is "
                                 "rolled out (in hours)."),
    "log.roll.jitter.ms": _BrokerKey(_T.LONG, None, "The maximum jitter to subtract from "
                                     "logRollTimeMillis (in milliseconds)."),
    "log.roll.jitter.hours": _BrokerKey(_T.INT, "0", "The maximum jitter to subtract from "
                                        "logRollTimeMillis (in hours)."),
    "log.index.size.max.bytes": _BrokerKey(_T.INT, "10485760",
                                           "The maximum size in bytes of the offset index."),
    "log.index.interval.bytes": _BrokerKey(_T.INT, "4096", "The interval with which we add an "
                                           "entry to the offset index."),
    "log.flush.interval.messages": _BrokerKey(_T.LONG, str(LONG_MAX), "The number of messages "
                                              "accumulated before messages are flushed to disk."),
    "log.flush.interval.ms": _BrokerKey(_T.LONG, None, "The maximum time a message stays in "
                                        "memory before it is flushed to disk."),
    "log.flush.scheduler.interval.ms": _BrokerKey(_T.LONG, str(LONG_MAX), "The frequency with "
                                                  "which the log flusher checks for logs to flush."),
    "log.flush.offset.checkpoint.interval.ms": _BrokerKey(_T.INT, "60000", "The frequency with "
                                                          "which the recovery point is persisted."),
    "log.retention.bytes": _BrokerKey(_T.LONG, "-1",
                                      "The maximum size of the log before deleting it."),
    "log.retention.ms": _BrokerKey(_T.LONG, None, "The number of milliseconds to keep a log "
                                   "file before deleting it."),
    "log.retention.minutes": _BrokerKey(_T.INT, None, "The number of minutes to keep a log file "
                                        "before deleting it."),
    "log.retention.hours": _BrokerKey(_T.INT, "168", "The number of hours to keep a log file "
                                      "before deleting it."),
    "log.retention.check.interval.ms": _BrokerKey(_T.LONG, "300000", "The frequency with which "
                                                  "the log cleaner checks for deletable logs."),
    "log.cleanup.policy": _BrokerKey(_T.LIST, "delete",
                                     "The default cleanup policy for segments."),
    "log.cleaner.delete.retention.ms": _BrokerKey(_T.LONG, "86400000", "The amount of time to "
                                                  "retain tombstone markers for compacted topics."),
    "log.cleaner.enable": _BrokerKey(_T.BOOLEAN, "true", "Enable the log cleaner process to "
                                     "run on the server."),
    "log.cleaner.threads": _BrokerKey(_T.INT, "1", "The number of background threads to use "
                                      "for log cleaning."),
    "log.cleaner.dedupe.buffer.size": _BrokerKey(_T.LONG, "134217728", "The total memory used "
                                                 "for log deduplication across all cleaner "
                                                 "threads."),
    "log.cleaner.io.max.bytes.per.second": _BrokerKey(_T.DOUBLE, "1.7976931348623157E308",
                                                      "The log cleaner will be throttled so that "
                                                      "the sum of its read and write i/o will be "
                                                      "less than this value on average."),
    "log.cleaner.backoff.ms": _BrokerKey(_T.LONG, "15000", "The amount of time to sleep when "
                                         "there are no logs to clean."),
    "log.cleaner.min.cleanable.ratio": _BrokerKey(_T.DOUBLE, "0.5", "The minimum ratio of "
                                                  "dirty log to total log for a log to be "
                                                  "eligible for cleaning."),
    "log.cleaner.min.compaction.lag.ms": _BrokerKey(_T.LONG, "0", "The minimum time a message "
                                                    "will remain uncompacted in the log."),
    "log.cleaner.max.compaction.lag.ms": _BrokerKey(_T.LONG, str(LONG_MAX), "The maximum time "
                                                    "a message will remain ineligible for "
                                                    "compaction in the log."),
    "log.segment.delete.delay.ms": _BrokerKey(_T.LONG, "60000", "The amount of time to wait "
                                              "before deleting a file from the filesystem."),
    "log.preallocate": _BrokerKey(_T.BOOLEAN, "false",
                                  "Preallocate the file when creating a new segment."),
    "log.message.timestamp.type": _BrokerKey(_T.STRING, "CreateTime", "Whether the timestamp "
                                             "is the create time or the log append time."),
    "log.message.timestamp.before.max.ms": _BrokerKey(_T.LONG, str(LONG_MAX), "Allowed "
                                                      "timestamp lag behind the broker time."),
    "log.message.timestamp.after.max.ms": _BrokerKey(_T.LONG, "3600000", "Allowed timestamp "
                                                     "lead over the broker time."),
    CORDONED_LOG_DIRS_PROP: _BrokerKey(_T.LIST, "", "A comma-separated list of the directories "
                                       "that are cordoned. Entries in this list must be entries "
                                       "in log.dirs or log.dir configuration. This can also be "
                                       "set to * to cordon all log directories."),
    "broker.rack": _BrokerKey(_T.STRING, None, "The broker's rack: replica placement spreads a "
                              "partition's replicas over racks, and rack-aware replica selection "
                              "serves consumers from their own rack."),
    "replica.selector.class": _BrokerKey(_T.STRING, None, "The ReplicaSelector that picks a "
                                         "consumer's preferred read replica (KIP-392); unset: "
                                         "consumers read from the leader."),
    "strata.metrics.listener": _BrokerKey(_T.STRING, None, "Strata: http://host:port of the "
                                          "Prometheus endpoint (/metrics, /tiered/<topic>); "
                                          "absent: no endpoint."),
    "log.remote.storage.enable": _BrokerKey(_T.BOOLEAN, None, "Strata: the default of the topic "
                                            "config remote.storage.enable for new topics that "
                                            "are neither compacted nor internal. Requires "
                                            "remote.log.storage.system.enable=true."),
    MAX_BROKER_PARTITIONS_PROP: _BrokerKey(_T.INT, None, "Strata (KIP-578's name): the most "
                                           "partitions this broker hosts; CreateTopics and "
                                           "CreatePartitions beyond it get POLICY_VIOLATION. "
                                           "Unset: derived from the open-file limit."),
    SENDFILE_PROP: _BrokerKey(_T.BOOLEAN, "true", "Strata: Fetch sends local records from the "
                              "segment file with sendfile (zero-copy); false copies them "
                              "through the broker's memory."),
    "min.insync.replicas": _BrokerKey(_T.INT, "1", "The minimum number of in-sync replicas "
                                      "for acks=all."),
    "compression.type": _BrokerKey(_T.STRING, "producer",
                                   "The final compression type for a given topic."),
    "unclean.leader.election.enable": _BrokerKey(_T.BOOLEAN, "false", "Whether replicas not in "
                                                 "the ISR may be elected leader."),
    "eligible.leader.replicas.enable": _BrokerKey(_T.BOOLEAN, "true", "Whether the controller "
                                                  "keeps Eligible Leader Replicas (KIP-966) and "
                                                  "elects from them when the ISR is empty (Kafka "
                                                  "4's eligible.leader.replicas.version=1)."),
    "leader.election.eligible.local.log.ms": _BrokerKey(
        _T.LONG, "600000", "KIP-1303: a replica started at the tiered offset is not elected "
        "while a replica with more local log can lead, until it has held its local log this "
        "long (or the bytes below); negative: no time limit of the guard."),
    "leader.election.eligible.local.log.bytes": _BrokerKey(
        _T.LONG, "1073741824", "KIP-1303: ... or until its local log holds this many bytes; "
        "negative: no size limit of the guard (both negative: no guard)."),
    "auto.leader.rebalance.enable": _BrokerKey(_T.BOOLEAN, "true", "Enables auto leader "
                                               "balancing."),
    "leader.imbalance.per.broker.percentage": _BrokerKey(_T.INT, "10", "The ratio of leader "
                                                         "imbalance allowed per broker."),
    "leader.imbalance.check.interval.seconds": _BrokerKey(_T.LONG, "300", "The frequency with "
                                                          "which the partition rebalance check "
                                                          "is triggered by the controller."),
    "controlled.shutdown.enable": _BrokerKey(_T.BOOLEAN, "true", "Enable controlled shutdown "
                                             "of the server."),
    "replica.lag.time.max.ms": _BrokerKey(_T.LONG, "30000", "How long a follower may go without "
                                          "fetching up to the leader's log end before it is "
                                          "removed from the ISR."),
    "replica.high.watermark.checkpoint.interval.ms": _BrokerKey(
        _T.LONG, "5000", "The frequency with which the high watermark is saved out to disk."),
    "request.timeout.ms": _BrokerKey(_T.INT, "30000", "The longest the client waits for a "
                                     "request's response."),
    "connections.max.idle.ms": _BrokerKey(_T.LONG, "600000", "Idle connections timeout: the "
                                          "server socket processor threads close the "
                                          "connections that idle more than this."),
    "producer.id.expiration.check.interval.ms": _BrokerKey(_T.INT, "600000", "The interval at "
                                                           "which to remove producer IDs that "
                                                           "have expired."),
    "transaction.partition.verification.enable": _BrokerKey(_T.BOOLEAN, "true", "Enable "
                                                            "verification that checks that the "
                                                            "partition has been added to the "
                                                            "transaction before writing "
                                                            "transactional records to the "
                                                            "partition."),
}
# Every key of Kafka's RemoteLogManagerConfig (log.local.retention.* included) and of its
# replication quotas, with their docs.
BROKER_CONFIG_KEYS.update({
    key.name: _BrokerKey(key.type, render_config_value(key.default, key.type), key.doc,
                         key.name in INTERNAL_REMOTE_LOG_MANAGER_KEYS)
    for key in [*REMOTE_LOG_MANAGER_CONFIG_DEF.keys(), *REPLICATION_QUOTA_CONFIG_DEF.keys()]
})

# DynamicBrokerConfig.brokerConfigSynonyms: the groups of broker keys that mean one setting.
_BROKER_SYNONYM_GROUPS = [
    ["log.roll.ms", "log.roll.hours"],
    ["log.roll.jitter.ms", "log.roll.jitter.hours"],
    ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"],
    ["log.retention.ms", "log.retention.minutes", "log.retention.hours"],
]


def _broker_synonyms(name: str) -> list[str]:
    for group in _BROKER_SYNONYM_GROUPS:
        if name in group:
            return group
    return [name]


# ---- the store -----------------------------------------------------------------------------

class _Image(NamedTuple):
    """Everything readers see; replaced whole by each mutation, never changed in place."""
    topics: dict[str, TopicInfo]
    by_id: dict[uuid.UUID, TopicInfo]
    configs: dict[str, LogConfig]
    collisions: dict[str, frozenset[str]]   # unified name -> topic names with '.' or '_'


def _build_image(topics: Iterable[TopicInfo], configs: dict[str, LogConfig]) -> _Image:
    by_name = {t.name: t for t in topics}
    collisions: dict[str, set[str]] = {}
    for name in by_name:
        if "." in name or "_" in name:
            collisions.setdefault(unify_collision_chars(name), set()).add(name)
    return _Image(by_name, {t.topic_id: t for t in by_name.values()},
                  {n: configs[n] for n in by_name},
                  {k: frozenset(v) for k, v in collisions.items()})


ConfigValidator = Callable[[str, LogConfig, "LogConfig | None"], None]


ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."


class PartitionReassignment(NamedTuple):
    """A reassignment in progress: all replicas, and those being added and removed."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


class BrokerInfo(NamedTuple):
    """A live broker as clients see it: id, the endpoint they connect to, rack."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class AlterPartitionItem:
    """One partition of an AlterPartition request: the leader's proposed ISR and the epochs it
    was based on. ``isr_broker_epochs`` (v3) holds each new ISR member's broker epoch, -1 for
    unchecked; None for v2."""

    topic_id: uuid.UUID | None
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    leader_recovery_state: int = 0
    isr_broker_epochs: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AlterPartitionItemResult:
    """AlterPartition's answer for one partition: its error, and with NONE its state now."""

    topic_id: uuid.UUID | None
    partition: int
    error: ErrorCode
    leader_id: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1
    leader_recovery_state: int = 0


class ClusterMetadata:
    """Cluster id, node id and the topics of a single-node cluster, durable in one log dir.

    ``ZkClusterMetadata`` (``zk_metadata.py``) is the same interface for a broker of a
    ZooKeeper cluster: handlers ask for ``live_brokers``, ``partition_state`` and
    ``controller_id`` and never know which one runs.
    """

    def __init__(self, log_dir: Path, node_id: int, broker_props: Mapping[str, str]):
        self.log_dir = Path(log_dir)
        self.node_id = int(node_id)
        self.broker_props: dict[str, str] = {k: str(v) for k, v in broker_props.items()}
        self.rack: str | None = self.broker_props.get("broker.rack") or None
        # Hook for the tiered-storage layer: (topic, new config, old config or None); may raise
        # InvalidConfigError to refuse a topic config.
        self.config_validator: ConfigValidator | None = None
        # Hook of topic recovery (issue 52): plan(topic) -> a plan with the bucket's topic
        # manifest (partition count, configs); raises InvalidConfigError.
        self.remote_recovery: Any = None
        # Remote read replicas (issue 52): plan(topic, configs) -> the origin's topic manifest
        # (partition count); serves(topic), read_state, list_offset for the handlers.
        self.read_replicas: ReadReplicas = NO_READ_REPLICAS
        # Hook of the listeners' TLS: (effective broker props now, after a dynamic change); may
        # raise InvalidRequestError to refuse the change (a keystore Kafka would refuse).
        self.broker_config_validator: Callable[[dict, dict], None] | None = None
        # Storage failures of the metadata file's log dir (the broker shares the LogManager's).
        self.dir_failures = LogDirFailureChannel()
        self._lock = threading.RLock()
        self._listeners: list[Any] = []
        self._closed = False  # set by close(): listeners hear nothing more
        self._topic_defaults = topic_defaults_from_broker(self.broker_props)
        self._default_config = LogConfig(self._topic_defaults)
        # Tiered storage: the broker's RemoteLogManagerConfig, checked before anything is
        # written (a bad value raises InvalidConfigError, a bad combination ValueError).
        self.remote_log_manager_config = RemoteLogManagerConfig(self.broker_props)
        validate_broker_remote_storage(self.remote_log_manager_config, self._default_config)
        cordon_error = cordoned_log_dirs_error(self.broker_props.get(CORDONED_LOG_DIRS_PROP),
                                               broker_log_dirs(self.broker_props))
        if cordon_error is not None:
            raise ValueError(cordon_error)
        self._num_partitions = self._int_prop("num.partitions", 1)
        self._default_replication_factor = self._int_prop("default.replication.factor", 1)
        self._delete_enabled = self.broker_props.get("delete.topic.enable", "true").strip().lower() != "false"
        self.max_broker_partitions = self._int_prop(
            MAX_BROKER_PARTITIONS_PROP, default_max_broker_partitions(descriptor_limit()))

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id, self.directory_id = self._load_or_write_meta_properties()
        self._image = self._load_topics()
        # Dynamic broker configs: resource name ("" or this node's id) -> {key: value}
        self._dynamic_broker: dict[str, dict[str, str]] = self._load_dynamic_broker_configs()
        # Users' entity configs (SCRAM credentials): user -> {key: value}
        self._user_configs: dict[str, dict[str, str]] = self._load_user_configs()
        if self._dynamic_broker:
            self.remote_log_manager_config = RemoteLogManagerConfig(self.effective_broker_props())
            self._refresh_topic_defaults(announce=False)
        for name, config in self._image.configs.items():
            validate_stored_topic_remote_storage(name, config,
                                                 system_enabled=self.remote_storage_system_enabled)

    @property
    def controller_id(self) -> int:
        return self.node_id

    # Where clients reach this broker, by listener name (the inter-broker listener first); set
    # by the broker once it listens.
    advertised_endpoints: Mapping[str, tuple[str, int]] = {}
    rack: str | None = None

    def live_brokers(self, listener: str | None = None) -> list[BrokerInfo]:
        """This broker, with its endpoint on ``listener`` (the inter-broker one for None)."""
        if not self.advertised_endpoints:
            return [BrokerInfo(self.node_id, "", 0, self.rack)]
        if listener not in self.advertised_endpoints:
            listener = next(iter(self.advertised_endpoints))
        host, port = self.advertised_endpoints[listener]
        return [BrokerInfo(self.node_id, host, port, self.rack)]

    def elect_leaders(self, partitions: list[TopicPartition] | None, election_type: int
                      ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        """ElectLeaders: per partition (every partition for None) the error and message. One
        broker is every partition's preferred leader: no election is ever needed."""
        if partitions is None:
            return {}
        out = {}
        for tp in partitions:
            info = self._image.topics.get(tp.topic)
            if info is None:
                out[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {tp.topic}")
            elif not 0 <= tp.partition < info.partitions:
                out[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {tp}")
            else:
                out[tp] = (ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE)
        return out

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        items: list[AlterPartitionItem]) -> list[AlterPartitionItemResult]:
        """AlterPartition (a leader's ISR change), one result per item; a KafkaError refuses
        the whole request (its code is the response's top-level error). One broker has no
        followers and no controller to ask: NOT_CONTROLLER, as Kafka's non-controller says."""
        raise KafkaError(f"Broker {self.node_id} is not the controller", ErrorCode.NOT_CONTROLLER)

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """Leader, epoch, ISR and replicas of a partition; None if it does not exist."""
        info = self._image.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        return self._granted()

    def _granted(self) -> PartitionState:
        """One broker is a cluster of one: it leads every partition, at leader epoch 0, the
        ISR and the replicas itself."""
        node = (self.node_id,)
        return PartitionState(self.node_id, 0, node, node)

    def hosted_states(self) -> dict[TopicPartition, PartitionState]:
        """The state of every partition this broker hosts: every partition, granted."""
        granted = self._granted()
        return {TopicPartition(t.name, p): granted
                for t in self._image.topics.values() for p in range(t.partitions)}

    @property
    def remote_storage_system_enabled(self) -> bool:
        """The broker's ``remote.log.storage.system.enable``."""
        return self.remote_log_manager_config.is_remote_storage_system_enabled

    @property
    def metadata_path(self) -> Path:
        return self.log_dir / METADATA_FILE

    def _int_prop(self, key: str, default: int) -> int:
        raw = self.broker_props.get(key)
        if raw is None or str(raw).strip() == "":
            return default
        try:
            return int(str(raw).strip())
        except ValueError:
            raise InvalidConfigError(f"Invalid value {raw} for configuration {key}: "
                                     "Not a number of type INT") from None

    # ---- meta.properties -----------------------------------------------------------------------

    def _load_or_write_meta_properties(self) -> tuple[str, uuid.UUID]:
        path = self.log_dir / META_PROPERTIES_FILE
        if not path.exists():
            cluster_id = uuid_to_kafka_str(random_kafka_uuid())
            directory_id = random_directory_id()
            text = (f"#\n#{time.strftime('%a %b %d %H:%M:%S %Z %Y')}\n"
                    f"node.id={self.node_id}\n"
                    f"directory.id={uuid_to_kafka_str(directory_id)}\n"
                    f"version=1\n"
                    f"cluster.id={cluster_id}\n")
            atomic_write(path, text.encode("utf-8"))
            log.info("formatted %s: cluster id %s, node id %d", self.log_dir, cluster_id,
                     self.node_id)
            return cluster_id, directory_id
        props = load_properties(path.read_text(encoding="utf-8"))
        version = props.get("version", "0")
        if version not in ("0", "1"):
            raise MetaPropertiesError(f"Unknown meta.properties version {version} in {path}")
        node_key = "node.id" if version == "1" else "broker.id"
        cluster_id = props.get("cluster.id")
        if not cluster_id:
            raise MetaPropertiesError(f"cluster.id was not specified in the v{version} file: {path}")
        if node_key not in props:
            raise MetaPropertiesError(f"{node_key} was not specified in {path}")
        try:
            stored = int(props[node_key])
        except ValueError:
            raise MetaPropertiesError(f"Invalid {node_key} {props[node_key]!r} in {path}") from None
        if stored != self.node_id:
            raise MetaPropertiesError(
                f"Stored node id {stored} doesn't match previous node id {self.node_id} in {path}. "
                "If you moved your data, make sure your configured node id matches. If you intend "
                "to create a new node, you should remove all data in your data directories.")
        directory_id = ZERO_UUID
        if "directory.id" in props:
            try:
                directory_id = uuid_from_kafka_str(props["directory.id"])
            except ValueError as exc:
                raise MetaPropertiesError(
                    f"Unable to read directory.id as a Uuid: {exc} ({path})") from None
        return cluster_id, directory_id

    # ---- the topics file -----------------------------------------------------------------------

    def _load_topics(self) -> _Image:
        path = self.metadata_path
        if not path.exists():
            return _build_image([], {})
        try:
            doc = json.loads(path.read_bytes())
            if doc.get("version") != METADATA_FORMAT_VERSION:
                raise MetaPropertiesError(f"unsupported metadata file version {doc.get('version')!r}")
            topics = [TopicInfo(t["name"], uuid_from_kafka_str(t["topic_id"]),
                                int(t["partitions"]), {str(k): str(v) for k, v in t["configs"].items()})
                      for t in doc["topics"]]
        except MetaPropertiesError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetaPropertiesError(f"Unreadable cluster metadata file {path}: {exc}") from exc
        stored_cluster = doc.get("cluster_id")
        if stored_cluster is not None and stored_cluster != self.cluster_id:
            raise MetaPropertiesError(f"Invalid cluster.id in: {path}. Expected {self.cluster_id}, "
                                      f"but read {stored_cluster}")
        configs = {t.name: self._make_config(t.configs, t.name) for t in topics}
        log.info("loaded %d topics from %s", len(topics), path)
        return _build_image(topics, configs)

    def _persist(self, topics: Iterable[TopicInfo],
                 broker_configs: Mapping[str, Mapping[str, str]] | None = None,
                 users: Mapping[str, Mapping[str, str]] | None = None) -> None:
        doc: dict[str, Any] = {
            "version": METADATA_FORMAT_VERSION,
            "cluster_id": self.cluster_id,
            "topics": [{"name": t.name, "topic_id": uuid_to_kafka_str(t.topic_id),
                        "partitions": t.partitions, "configs": dict(t.configs)}
                       for t in sorted(topics, key=lambda t: t.name)],
        }
        if broker_configs is None:
            broker_configs = getattr(self, "_dynamic_broker", {})
        if broker_configs:
            doc["broker_configs"] = {name: dict(c) for name, c in broker_configs.items() if c}
        users = getattr(self, "_user_configs", {}) if users is None else users
        if users:
            doc["users"] = {name: dict(c) for name, c in users.items() if c}
        with self.dir_failures.guard(self.log_dir, "writing the cluster metadata"):
            atomic_write(self.metadata_path,
                         json.dumps(doc, indent=1, sort_keys=True).encode("utf-8"))

    def _commit(self, topics: dict[str, TopicInfo], configs: dict[str, LogConfig]) -> None:
        """Persist, then publish the new image (caller holds the lock)."""
        self._persist(topics.values())
        self._image = _build_image(topics.values(), configs)

    # ---- listeners -----------------------------------------------------------------------------

    def add_listener(self, listener: Any) -> None:
        """Register an object with any of ``on_topic_created(info)``, ``on_topic_deleted(info)``,
        ``on_partitions_created(info, old_count)``, ``on_topic_config_changed(info, config)``.
        Called in registration order, after the change is durable, under the metadata lock."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def close(self) -> None:
        """Listeners hear no more changes once this returns (an admin change under way
        finishes first): the broker closes its logs after this."""
        with self._lock:
            self._closed = True

    def _notify(self, method: str, *args: Any) -> None:
        for listener in list(self._listeners):
            if self._closed:
                return
            callback = getattr(listener, method, None)
            if callback is None:
                continue
            try:
                callback(*args)
            except KafkaStorageError:
                pass  # the failing log dir is reported once by its LogDirFailureChannel
            except Exception:
                log.exception("metadata listener %r failed in %s%r", listener, method, args[:1])

    # ---- reads ---------------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        return dict(self._image.topics)

    def topic(self, name: str) -> TopicInfo | None:
        return self._image.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._image.by_id.get(topic_id)

    def default_log_config(self) -> LogConfig:
        """Topic config defaults: Kafka's LogConfig defaults overlaid with the broker's ``log.*``."""
        return self._default_config

    def topic_config(self, info: TopicInfo) -> LogConfig:
        """The effective config of the topic ``info`` describes (one just deleted too)."""
        return self._make_config(info.configs, info.name)

    def log_config(self, name: str) -> LogConfig:
        """The effective config of ``name``; the defaults for a topic this node does not know."""
        return self._image.configs.get(name, self._default_config)

    # ---- config validation ---------------------------------------------------------------------

    def _make_config(self, overrides: Mapping[str, str], name: str | None = None) -> LogConfig:
        """The effective config of topic ``name``: ``overrides`` over the broker's defaults.

        Strata's ``log.remote.storage.enable=true`` tiers new topics by default, but not a
        compacted one nor a broker-managed one: for those, without an explicit
        ``remote.storage.enable``, the broker default does not apply (the value is false).
        A local retention inherited from ``log.local.retention.*`` is capped at the topic's
        retention (``inherited_local_retention_caps``)."""
        merged: dict[str, Any] = dict(self._topic_defaults)
        merged.update(overrides)
        config = LogConfig(merged)
        if self._broker_tiering_skipped(name, overrides, config):
            del merged["remote.storage.enable"]
            config = LogConfig(merged)
        caps = inherited_local_retention_caps(config, overrides)
        if caps:
            merged.update(caps)
            config = LogConfig(merged)
        return config

    def _broker_tiering_skipped(self, name: str | None, overrides: Mapping[str, str],
                                config: LogConfig) -> bool:
        """Whether ``log.remote.storage.enable=true`` is set but does not reach this topic."""
        return ("remote.storage.enable" in self._topic_defaults
                and "remote.storage.enable" not in overrides
                and bool(self._default_config.get("remote.storage.enable"))
                and (config.is_compacted or (name is not None and name in NEVER_TIERED_TOPICS)))

    def _validate_configs(self, name: str, overrides: Mapping[str, str],
                          old: LogConfig | None) -> LogConfig:
        """Kafka's LogConfig.validate for a full override set (names, values, the compaction
        lags, then the remote-storage rules of ``strata.tiered.config``), then the hook; the
        new config. ``old`` is the topic's config before the change, None on create."""
        for key in overrides:
            if key not in LOG_CONFIG_DEF:
                raise InvalidConfigError(f"Unknown topic config name: {key}")
        for key, value in overrides.items():
            _check_number_syntax(key, value)
        config = self._make_config(overrides, name)
        min_lag = config.get("min.compaction.lag.ms")
        max_lag = config.get("max.compaction.lag.ms")
        if min_lag > max_lag:
            raise InvalidConfigError(f"conflict topic config setting min.compaction.lag.ms "
                                     f"({min_lag}) > max.compaction.lag.ms ({max_lag})")
        current = self._image.topics.get(name) if old is not None else None
        inherited = current is not None and "remote.storage.enable" not in current.configs
        validate_topic_remote_storage(config, old, system_enabled=self.remote_storage_system_enabled,
                                      topic=name, internal=name in NEVER_TIERED_TOPICS,
                                      tiering_inherited=inherited)
        if self.config_validator is not None:
            self.config_validator(name, config, old)
        return config

    # ---- topics --------------------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                     configs: Mapping[str, str | None] | None = None,
                     validate_only: bool = False,
                     assignments: Mapping[int, list[int]] | None = None) -> TopicInfo:
        """CreateTopics for one topic, with Kafka's checks in Kafka's order; the new topic.

        ``assignments`` is a manual placement (partition -> broker ids); with one, the partition
        count and replication factor come from it and both arguments must be -1."""
        configs = dict(configs or {})
        if name == CLUSTER_METADATA_TOPIC_NAME:
            raise InvalidRequestError(
                f"Creation of internal topic {CLUSTER_METADATA_TOPIC_NAME} is prohibited.")
        with self._lock:
            image = self._image
            validate_topic_name(name)
            if name in image.topics:
                raise KafkaError(f"Topic '{name}' already exists.",
                                 code=ErrorCode.TOPIC_ALREADY_EXISTS)
            colliding = image.collisions.get(unify_collision_chars(name))
            if colliding:
                raise KafkaError(f"Topic '{name}' collides with existing topic: "
                                 f"{sorted(colliding)[0]}", code=ErrorCode.INVALID_TOPIC_EXCEPTION)
            nulls = [k for k, v in configs.items() if v is None]
            if nulls:
                raise InvalidConfigError("Null value not supported for topic configs: " +
                                         ",".join(nulls))
            overrides: dict[str, str] = {k: v for k, v in configs.items() if v is not None}
            recovering = str(overrides.get("strata.remote.recovery", "")).strip().lower() == "true"
            if recovering:
                # the topic's partition count and configs come from the bucket
                if self.remote_recovery is None:
                    raise InvalidConfigError("strata.remote.recovery=true needs the remote "
                                             "tier (an ObjectStoreRemoteStorageManager)")
                plan = self.remote_recovery.plan(name)
                overrides = {**plan.manifest.configs, **overrides}
                if num_partitions == -1 and not assignments:
                    num_partitions = plan.manifest.partitions
                elif (len(assignments) if assignments else num_partitions) != plan.manifest.partitions:
                    raise KafkaError(
                        f"Topic '{name}' has {plan.manifest.partitions} partitions in the "
                        "bucket; a recovery must ask for that many (or -1).",
                        code=ErrorCode.INVALID_PARTITIONS)
            if str(overrides.get("strata.remote.readreplica", "") or "").strip():
                # a read-only copy of another cluster's topic: its partitions are the origin's
                if self.read_replicas is NO_READ_REPLICAS:
                    raise InvalidConfigError("strata.remote.readreplica is served by a single "
                                             "broker (not a broker of a ZooKeeper cluster)")
                origin = self.read_replicas.plan(name, overrides).manifest
                if num_partitions == -1 and not assignments:
                    num_partitions = origin.partitions
                elif (len(assignments) if assignments else num_partitions) != origin.partitions:
                    raise KafkaError(
                        f"Topic '{name}' has {origin.partitions} partitions in the origin's "
                        "bucket; a read replica must ask for that many (or -1).",
                        code=ErrorCode.INVALID_PARTITIONS)
            config = self._validate_configs(name, overrides, None)
            if assignments:
                if replication_factor != -1:
                    raise InvalidRequestError("A manual partition assignment was specified, but "
                                              "replication factor was not set to -1.")
                if num_partitions != -1:
                    raise InvalidRequestError("A manual partition assignment was specified, but "
                                              "numPartitions was not set to -1.")
                for i in range(len(assignments)):
                    if i not in assignments:
                        raise KafkaError(f"Partitions should be sequential starting from 0, but "
                                         f"partition {i} is missing.",
                                         code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
                replication_factor = self._check_assignments(assignments.values(), None)
                num_partitions = len(assignments)
            if replication_factor == 0 or replication_factor < -1:
                raise KafkaError("Replication factor must be larger than 0, or -1 to use the "
                                 "default value.", code=ErrorCode.INVALID_REPLICATION_FACTOR)
            if num_partitions == 0 or num_partitions < -1:
                raise KafkaError("Number of partitions was set to an invalid non-positive value.",
                                 code=ErrorCode.INVALID_PARTITIONS)
            partitions = self._num_partitions if num_partitions == -1 else num_partitions
            rf = self._default_replication_factor if replication_factor == -1 else replication_factor
            check_records_per_operation(1 + partitions + len(overrides))
            placement = self._check_placement(
                partitions, rf, [assignments[i] for i in range(len(assignments))] if assignments else None)
            self._check_broker_partitions(partitions)
            info = TopicInfo(name, random_kafka_uuid(), partitions, overrides)
            if validate_only:
                return info
            self._add_topic(info, config, placement)
            log.info("created topic %s (%s) with %d partitions%s", name,
                     uuid_to_kafka_str(info.topic_id), partitions,
                     f" and configs {overrides}" if overrides else "")
            self._announce("on_topic_created", info)
            return info

    def partition_count(self) -> int:
        """Partitions of every topic this broker hosts."""
        return sum(t.partitions for t in self._image.topics.values())

    def _check_broker_partitions(self, added: int) -> None:
        """POLICY_VIOLATION if ``added`` more partitions would pass ``max.broker.partitions``."""
        hosted = self.partition_count()
        if hosted + added > self.max_broker_partitions:
            raise KafkaError(
                f"Adding {added} partition(s) to the {hosted} this broker hosts would exceed "
                f"{MAX_BROKER_PARTITIONS_PROP}={self.max_broker_partitions}.",
                code=ErrorCode.POLICY_VIOLATION)

    def _check_placement(self, partitions: int, replication_factor: int,
                         manual: list[list[int]] | None = None) -> list[list[int]]:
        """Kafka's StripedReplicaPlacer checks, for a cluster of this one broker; the replicas
        of each partition (``manual`` when given, already checked)."""
        if partitions <= 0:
            raise KafkaError(f"Invalid number of partitions {partitions}",
                             code=ErrorCode.INVALID_PARTITIONS)
        if replication_factor <= 0:
            raise KafkaError(f"Unable to replicate the partition {replication_factor} time(s): "
                             f"Invalid replication factor {replication_factor}: the replication "
                             "factor must be positive.", code=ErrorCode.INVALID_REPLICATION_FACTOR)
        if replication_factor > 1:
            raise KafkaError(f"Unable to replicate the partition {replication_factor} time(s): "
                             f"The target replication factor of {replication_factor} cannot be "
                             "reached because only 1 broker(s) are registered.",
                             code=ErrorCode.INVALID_REPLICATION_FACTOR)
        if manual is None and self.all_log_dirs_cordoned():
            raise KafkaError(f"Unable to replicate the partition {replication_factor} time(s): "
                             "All brokers are currently fenced, or have all their log "
                             "directories cordoned.", code=ErrorCode.INVALID_REPLICATION_FACTOR)
        return manual or [[self.node_id]] * partitions

    def cordoned_log_dirs(self) -> list[str]:
        """KIP-1066: this broker's cordoned log dirs (``cordoned.log.dirs``, dynamic)."""
        props = self.effective_broker_props()
        return cordoned_log_dirs(props.get(CORDONED_LOG_DIRS_PROP), broker_log_dirs(props))

    def all_log_dirs_cordoned(self) -> bool:
        """Kafka's controller places no new partition on a broker whose every log dir is
        cordoned."""
        cordoned = set(self.cordoned_log_dirs())
        return all(d in cordoned for d in broker_log_dirs(self.broker_props))

    def _registered_broker_ids(self) -> set[int]:
        """The brokers a manual placement may name: this one alone."""
        return {self.node_id}

    def _check_assignments(self, assignments: Iterable[list[int]], expected_rf: int | None) -> int:
        """Kafka's checks of a manual placement over the registered brokers; its replication
        factor."""
        known = self._registered_broker_ids()
        rf = expected_rf
        for brokers in assignments:
            if not brokers:
                raise KafkaError("The manual partition assignment includes an empty replica list.",
                                 code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            for b in brokers:
                if b not in known:
                    raise KafkaError(f"The manual partition assignment includes broker {b}, but "
                                     "no such broker is registered.",
                                     code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            if len(set(brokers)) != len(brokers):
                raise KafkaError(f"The manual partition assignment includes the broker "
                                 f"{brokers[0]} more than once.",
                                 code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            if rf is None:
                rf = len(brokers)
            elif len(brokers) != rf:
                raise KafkaError(f"The manual partition assignment includes a partition with "
                                 f"{len(brokers)} replica(s), but this is not consistent with "
                                 f"previous partitions, which have {rf} replica(s).",
                                 code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        return rf if rf is not None else -1

    def check_reassignment(self, replicas: list[int]) -> None:
        """Kafka's checks of a partition reassignment's target replicas (INVALID_REPLICA_ASSIGNMENT)."""
        self._check_assignments([replicas], None)

    def alter_partition_reassignments(self, items: list[tuple[TopicPartition, list[int] | None]]
                                      ) -> list[tuple[ErrorCode, str | None]]:
        """AlterPartitionReassignments: (error, message) per item, in order (None replicas
        cancel). A KafkaError refuses the whole request (NOT_CONTROLLER in a cluster). One node
        already holds every partition: a valid target (this node) completes at once."""
        out = []
        for tp, replicas in items:
            info = self._image.topics.get(tp.topic)
            if info is None:
                out.append((ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"Unable to find a topic named {tp.topic}."))
            elif not 0 <= tp.partition < info.partitions:
                out.append((ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"Unable to find partition {tp.topic}:{tp.partition}."))
            elif replicas is None:
                out.append((ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None))
            else:
                try:
                    self.check_reassignment(sorted(replicas))
                    out.append((ErrorCode.NONE, None))
                except KafkaError as exc:
                    out.append((ErrorCode(exc.code), str(exc)))
        return out

    def list_partition_reassignments(self, partitions: list[TopicPartition] | None
                                     ) -> dict[TopicPartition, PartitionReassignment]:
        """ListPartitionReassignments: the partitions (of ``partitions``, or all) being
        reassigned. A KafkaError refuses the request (NOT_CONTROLLER in a cluster). One node
        never has a reassignment in progress."""
        return {}

    def _place_new_partitions(self, info: TopicInfo, new_total: int,
                              assignments: list[list[int]] | None) -> list[list[int]]:
        """Replicas of the partitions CreatePartitions adds (``assignments`` checked)."""
        if assignments is not None:
            self._check_assignments(assignments, 1)
            return assignments
        return [[self.node_id]] * (new_total - info.partitions)

    def _internal_replication_factor(self, name: str) -> int:
        """The replication factor of a broker-managed topic: one, on one broker."""
        return 1

    def _announce(self, method: str, *args: Any) -> None:
        """Tell listeners of a change this node just made (a cluster announces what it reads
        back from its store instead), and ``on_partition_states`` of the partitions it grants
        or takes back: after a topic's partitions are made, before they are deleted (as a
        cluster's metadata orders them)."""
        if method == "on_topic_deleted":
            info = args[0]
            self._notify("on_partition_states",
                         dict.fromkeys(TopicPartition(info.name, p) for p in range(info.partitions)))
        self._notify(method, *args)
        if method in ("on_topic_created", "on_partitions_created"):
            info, old_count = args[0], (args[1] if len(args) > 1 else 0)
            granted = self._granted()
            self._notify("on_partition_states", {TopicPartition(info.name, p): granted
                                                 for p in range(old_count, info.partitions)})

    def _grow_topic(self, info: TopicInfo, updated: TopicInfo, placement: list[list[int]]) -> None:
        topics = dict(self._image.topics)
        topics[info.name] = updated
        self._commit(topics, dict(self._image.configs))

    def _set_topic_config(self, updated: TopicInfo, config: LogConfig) -> None:
        topics = dict(self._image.topics)
        topics[updated.name] = updated
        configs = dict(self._image.configs)
        configs[updated.name] = config
        self._commit(topics, configs)

    def _add_topic(self, info: TopicInfo, config: LogConfig,
                   placement: list[list[int]] | None = None) -> None:
        image = self._image
        topics = dict(image.topics)
        topics[info.name] = info
        configs = dict(image.configs)
        configs[info.name] = config
        self._commit(topics, configs)

    def create_internal_topic(self, name: str, partitions: int,
                              configs: Mapping[str, str] | None = None) -> TopicInfo:
        """Create a topic the broker runs on (``__consumer_offsets``, ...), replication factor 1.

        Skips the user-facing checks (name collisions, the broker defaults); the configs are
        still validated. Returns the existing topic, unchanged, if there already is one."""
        if name not in BROKER_MANAGED_TOPICS:
            raise ValueError(f"{name!r} is not a broker-managed topic")
        with self._lock:
            existing = self._image.topics.get(name)
            if existing is not None:
                return existing
            if partitions < 1:
                raise KafkaError("Number of partitions was set to an invalid non-positive value.",
                                 code=ErrorCode.INVALID_PARTITIONS)
            overrides = {k: str(v) for k, v in (configs or {}).items()}
            config = self._validate_configs(name, overrides, None)
            info = TopicInfo(name, random_kafka_uuid(), int(partitions), overrides)
            self._add_topic(info, config, self._check_placement(
                int(partitions), self._internal_replication_factor(name)))
            log.info("created internal topic %s (%s) with %d partitions", name,
                     uuid_to_kafka_str(info.topic_id), partitions)
            self._announce("on_topic_created", info)
            return info

    def delete_topic(self, name: str) -> TopicInfo:
        """DeleteTopics by name; the deleted topic.

        As in Kafka (KRaft), internal topics are not refused: a client allowed to delete
        ``__consumer_offsets`` deletes it, and the broker re-creates it when next needed."""
        with self._lock:
            self._check_delete_enabled()
            info = self._image.topics.get(name)
            if info is None:
                raise KafkaError("This server does not host this topic-partition.",
                                 code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            return self._remove_topic(info)

    def delete_topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo:
        """DeleteTopics by topic id; the deleted topic."""
        with self._lock:
            self._check_delete_enabled()
            if topic_id is None or topic_id == ZERO_UUID:
                raise InvalidRequestError(
                    f"Attempt to find topic with invalid topicId "
                    f"{uuid_to_kafka_str(topic_id or ZERO_UUID)}")
            info = self._image.by_id.get(topic_id)
            if info is None:
                raise KafkaError("This server does not host this topic ID.",
                                 code=ErrorCode.UNKNOWN_TOPIC_ID)
            return self._remove_topic(info)

    def _check_delete_enabled(self) -> None:
        if not self._delete_enabled:
            # The handler answers INVALID_REQUEST instead for DeleteTopics versions below 3.
            raise KafkaError("Topic deletion is disabled.", code=ErrorCode.TOPIC_DELETION_DISABLED)

    def _remove_topic(self, info: TopicInfo) -> TopicInfo:
        image = self._image
        topics = {n: t for n, t in image.topics.items() if n != info.name}
        configs = {n: c for n, c in image.configs.items() if n != info.name}
        self._commit(topics, configs)
        log.info("deleted topic %s (%s)", info.name, uuid_to_kafka_str(info.topic_id))
        self._announce("on_topic_deleted", info)
        return info

    def create_partitions(self, name: str, new_total: int, validate_only: bool = False,
                          assignments: list[list[int]] | None = None) -> TopicInfo:
        """CreatePartitions: grow ``name`` to ``new_total`` partitions; the updated topic.
        ``assignments`` places the new partitions (one broker list each)."""
        with self._lock:
            info = self._image.topics.get(name)
            if info is None:
                raise KafkaError("This server does not host this topic-partition.",
                                 code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if new_total == info.partitions:
                raise KafkaError(f"Topic already has {info.partitions} partition(s).",
                                 code=ErrorCode.INVALID_PARTITIONS)
            if new_total < info.partitions:
                raise KafkaError(f"The topic {name} currently has {info.partitions} partition(s); "
                                 f"{new_total} would not be an increase.",
                                 code=ErrorCode.INVALID_PARTITIONS)
            if assignments is not None:
                added = new_total - info.partitions
                if len(assignments) != added:
                    raise KafkaError(f"Attempted to add {added} additional partition(s), but only "
                                     f"{len(assignments)} assignment(s) were specified.",
                                     code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            placement = self._place_new_partitions(info, new_total, assignments)
            check_records_per_operation(new_total - info.partitions)
            self._check_broker_partitions(new_total - info.partitions)
            updated = replace(info, partitions=new_total)
            if validate_only:
                return updated
            self._grow_topic(info, updated, placement)
            log.info("topic %s: partitions %d -> %d", name, info.partitions, new_total)
            self._announce("on_partitions_created", updated, info.partitions)
            return updated

    # ---- topic configs -------------------------------------------------------------------------

    def _existing_topic_for_config(self, name: str) -> TopicInfo:
        """ControllerConfigurationValidator's name checks, then existence."""
        if name == "":
            raise InvalidRequestError("Default topic resources are not allowed.")
        validate_topic_name(name)
        info = self._image.topics.get(name)
        if info is None:
            raise KafkaError(f"The topic '{name}' does not exist.",
                             code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return info

    def alter_topic_configs(self, name: str, configs: Mapping[str, str | None],
                            validate_only: bool = False) -> TopicInfo:
        """Legacy AlterConfigs: ``configs`` becomes the topic's whole override set."""
        with self._lock:
            info = self._existing_topic_for_config(name)
            nulls = [k for k, v in configs.items() if v is None]
            if nulls:
                raise InvalidRequestError("Null value not supported for : " + ", ".join(nulls))
            return self._apply_overrides(info, {k: str(v) for k, v in configs.items()},
                                         validate_only)

    def incremental_alter_topic_configs(self, name: str,
                                        ops: Iterable[tuple[str, int, str | None]],
                                        validate_only: bool = False) -> TopicInfo:
        """IncrementalAlterConfigs: ``ops`` are (key, op, value), op 0 SET, 1 DELETE, 2 APPEND,
        3 SUBTRACT (APPEND/SUBTRACT only for LIST configs)."""
        ops = list(ops)
        keys = [k for k, _, _ in ops]
        if len(set(keys)) != len(keys):
            raise InvalidRequestError("Error due to duplicate config keys")
        nulls = [k for k, op, v in ops if op != OP_DELETE and v is None]
        if nulls:
            raise InvalidRequestError("Null value not supported for : " + ", ".join(nulls))
        for _, op, _ in ops:
            if op not in _OP_NAMES:
                raise InvalidRequestError(f"Unknown operations type {op}")
        with self._lock:
            info = self._existing_topic_for_config(name)
            overrides = dict(info.configs)
            for key, op, value in ops:
                if op == OP_SET:
                    overrides[key] = str(value)
                elif op == OP_DELETE:
                    overrides.pop(key, None)
                else:
                    if key not in LOG_CONFIG_DEF or LOG_CONFIG_DEF[key].type is not ConfigType.LIST:
                        raise InvalidConfigError(f"Can't {_OP_NAMES[op]} to key {key} because its "
                                                 "type is not LIST.")
                    current = overrides.get(key)
                    if current is None:  # Kafka starts from the topic config's own default
                        current = render_config_value(LOG_CONFIG_DEF[key].default, ConfigType.LIST)
                    parts = [p for p in (current or "").split(",") if p]
                    for item in str(value).split(","):
                        if op == OP_APPEND:
                            if item and item not in parts:
                                parts.append(item)
                        elif item in parts:
                            parts.remove(item)
                    overrides[key] = ",".join(parts)
            return self._apply_overrides(info, overrides, validate_only)

    def _apply_overrides(self, info: TopicInfo, overrides: dict[str, str],
                         validate_only: bool) -> TopicInfo:
        old = self._image.configs.get(info.name)
        config = self._validate_configs(info.name, overrides, old)
        updated = replace(info, configs=overrides)
        if validate_only or overrides == info.configs:
            return updated
        self._set_topic_config(updated, config)
        log.info("topic %s: config overrides now %s", info.name, overrides)
        self._announce("on_topic_config_changed", updated, config)
        return updated

    # ---- dynamic broker configs ----------------------------------------------------------------

    def _load_dynamic_broker_configs(self) -> dict[str, dict[str, str]]:
        """The stored dynamic broker configs of this node and the cluster default. As Kafka
        does at startup, a stored value that is not (or no longer) valid is logged and
        ignored rather than stopping the broker."""
        path = self.metadata_path
        if not path.exists():
            return {}
        try:
            stored = json.loads(path.read_bytes()).get("broker_configs") or {}
            items = {str(n): {str(k): str(v) for k, v in c.items()} for n, c in stored.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise MetaPropertiesError(f"Unreadable broker configs in {path}: {exc}") from exc
        out: dict[str, dict[str, str]] = {}
        for name, configs in items.items():
            if name not in (DEFAULT_BROKER_RESOURCE, str(self.node_id)):
                log.warning("ignoring the stored dynamic configs of broker %r", name)
                continue
            kept = {}
            for key, value in configs.items():
                try:
                    self._check_dynamic_broker_config(key, value)
                except KafkaError as exc:
                    log.warning("ignoring the stored dynamic broker config %s=%s: %s", key,
                                "[hidden]" if sensitive_broker_config(key) else value, exc)
                    continue
                kept[key] = value
            if kept:
                out[name] = kept
        if out:
            log.info("loaded dynamic broker configs %s from %s", loggable_broker_configs(out),
                     path)
        return out

    def effective_broker_props(self, dynamic: dict[str, dict[str, str]] | None = None
                               ) -> dict[str, str]:
        """server.properties overlaid with the dynamic cluster default, then this node's own
        dynamic configs (Kafka's precedence); ``dynamic`` instead of the current ones."""
        dynamic = self._dynamic_broker if dynamic is None else dynamic
        props = dict(self.broker_props)
        props.update(dynamic.get(DEFAULT_BROKER_RESOURCE, {}))
        props.update(dynamic.get(str(self.node_id), {}))
        return props

    def dynamic_broker_configs(self, resource_name: str) -> dict[str, str]:
        """The dynamic configs set on a BROKER resource ("" or this node's id)."""
        return dict(self._dynamic_broker.get(resource_name, {}))

    @staticmethod
    def _check_dynamic_broker_config(key: str, value: str | None) -> None:
        """Refuse a key that is not dynamic, or a bad value, with Kafka's INVALID_REQUEST
        (Kafka answers a ConfigException of a broker config that way, KAFKA-13609)."""
        if is_listener_ssl_config(key):
            return   # checked whole, as a keystore or truststore, by broker_config_validator
        if key == CORDONED_LOG_DIRS_PROP:
            return   # a list of log dirs: _check_dynamic_broker_combination
        if key in LISTENER_SSL_CONFIGS:
            raise InvalidRequestError("These security configs can be dynamically updated only "
                                      f"per-listener using the listener prefix: {key}")
        if key not in DYNAMIC_BROKER_CONFIGS:
            raise KafkaError(static_broker_configs_message([key]), code=ErrorCode.INVALID_REQUEST)
        definition = REPLICATION_QUOTA_CONFIG_DEF if key in REPLICATION_QUOTA_CONFIG_DEF \
            else REMOTE_LOG_MANAGER_CONFIG_DEF
        cdef = definition[key]
        text = str(value).strip()
        bound = _INT_BOUNDS[cdef.type]
        if not _INTEGER.fullmatch(text) or not -bound <= int(text) < bound:
            raise InvalidRequestError(f"Invalid value {value} for configuration {key}: "
                                      f"Not a number of type {cdef.type.name}")
        try:
            definition.parse_value(key, text)
        except InvalidConfigError as exc:
            raise InvalidRequestError(str(exc)) from None

    def alter_broker_configs(self, resource_name: str,
                             ops: Iterable[tuple[str, int, str | None]], incremental: bool,
                             validate_only: bool = False) -> dict[str, str]:
        """AlterConfigs (``incremental=False``: the given set replaces the resource's dynamic
        configs) or IncrementalAlterConfigs (SET / DELETE) on the BROKER resource
        ``resource_name``: "" (the cluster default) or this node's id (the caller checks the
        name). Only ``DYNAMIC_BROKER_CONFIGS`` may change; values are checked as Kafka checks
        them. Persisted, then listeners' ``on_broker_configs_changed(rlm_config)`` get the
        new effective RemoteLogManagerConfig. Returns the resource's dynamic configs."""
        ops = list(ops)
        static = [k for k, _, _ in ops if k not in DYNAMIC_BROKER_CONFIGS
                  and k not in LISTENER_SSL_CONFIGS and not is_listener_ssl_config(k)]
        if static:
            raise KafkaError(static_broker_configs_message(static), code=ErrorCode.INVALID_REQUEST)
        for _, op, _ in ops:
            if op not in _OP_NAMES:
                raise InvalidRequestError(f"Unknown operations type {op}")
        nulls = [k for k, op, v in ops if v is None and not (incremental and op == OP_DELETE)]
        if nulls:
            raise InvalidRequestError("Null value not supported for : " + ", ".join(nulls))
        with self._lock:
            old = self._dynamic_broker.get(resource_name, {})
            configs = dict(old) if incremental else {}
            for key, op, value in ops:
                if op == OP_SET:
                    configs[key] = str(value)
                elif op == OP_DELETE:
                    configs.pop(key, None)
                else:
                    word = "append" if op == OP_APPEND else "subtract"
                    raise InvalidRequestError(f"Config value {word} is not allowed for config "
                                              f"key: {key}")
            for key, value in configs.items():
                self._check_dynamic_broker_config(key, value)
            updated = {n: c for n, c in self._dynamic_broker.items() if n != resource_name}
            if configs:
                updated[resource_name] = configs
            self._check_dynamic_broker_combination(self.effective_broker_props(updated))
            per_broker = sorted(k for k, _, _ in ops if is_listener_ssl_config(k))
            if resource_name == DEFAULT_BROKER_RESOURCE and per_broker:
                raise InvalidRequestError("Cannot update these configs at default cluster level, "
                                          f"broker id must be specified: {', '.join(per_broker)}")
            if self.broker_config_validator is not None and (configs != old or per_broker):
                self.broker_config_validator(self.effective_broker_props(),
                                             self.effective_broker_props(updated))
            if configs == old and per_broker and not validate_only:
                # the same keystore path again: Kafka reloads the file if it changed
                self._notify("on_broker_configs_changed", self.remote_log_manager_config)
            if validate_only or configs == old:
                return configs
            self._store_broker_configs(resource_name, configs, updated)
            return configs

    def _store_broker_configs(self, resource_name: str, configs: dict[str, str],
                              updated: dict[str, dict[str, str]]) -> None:
        """Persist one resource's new dynamic configs (``updated``: all of them) and apply
        them (caller holds the lock)."""
        self._persist(self._image.topics.values(), updated)
        self._apply_dynamic_broker_configs(updated)
        log.info("broker resource %r: dynamic configs now %s", resource_name,
                 loggable_broker_configs(configs))

    def _apply_dynamic_broker_configs(self, dynamic: dict[str, dict[str, str]]) -> bool:
        """Make ``dynamic`` the dynamic broker configs; listeners hear the new effective
        RemoteLogManagerConfig (``on_broker_configs_changed``), and the new effective config
        of each topic a changed topic default reaches (``on_topic_config_changed``). Whether
        the topic defaults changed."""
        self._dynamic_broker = dynamic
        self.remote_log_manager_config = RemoteLogManagerConfig(self.effective_broker_props())
        changed = self._refresh_topic_defaults(announce=True)
        self._notify("on_broker_configs_changed", self.remote_log_manager_config)
        return changed

    def _check_dynamic_broker_combination(self, props: Mapping[str, str]) -> None:
        """Kafka's DynamicLogConfig.validateReconfiguration rules across keys, on the
        effective broker props a change would give (INVALID_REQUEST, as for one key)."""
        errors = remote_copy_lag_errors(LogConfig(topic_defaults_from_broker(props)), "log.")
        cordon_error = cordoned_log_dirs_error(props.get(CORDONED_LOG_DIRS_PROP),
                                               broker_log_dirs(props), dynamic=True)
        if cordon_error is not None:
            errors.append(cordon_error)
        if errors:
            raise InvalidRequestError(errors[0])

    def _refresh_topic_defaults(self, announce: bool) -> bool:
        """Topic defaults from the effective broker props (a dynamic ``log.remote.copy.lag.*``
        is one); when they changed, every topic's effective config is rebuilt and, with
        ``announce``, listeners hear of those that changed. Whether they changed."""
        defaults = topic_defaults_from_broker(self.effective_broker_props())
        if defaults == self._topic_defaults:
            return False
        self._topic_defaults = defaults
        self._default_config = LogConfig(defaults)
        image = self._image
        configs = {n: self._make_config(t.configs, n) for n, t in image.topics.items()}
        self._image = _build_image(image.topics.values(), configs)
        if announce:
            for name, info in image.topics.items():
                if configs[name].values != image.configs[name].values:
                    self._notify("on_topic_config_changed", info, configs[name])
        return True

    # ---- SCRAM credentials: the users' entity configs ------------------------------------------

    def _load_user_configs(self) -> dict[str, dict[str, str]]:
        path = self.metadata_path
        if not path.exists():
            return {}
        try:
            stored = json.loads(path.read_bytes()).get("users") or {}
            return {str(u): {str(k): str(v) for k, v in c.items()} for u, c in stored.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise MetaPropertiesError(f"Unreadable users in {path}: {exc}") from exc

    def user_scram_credentials(self, user: str) -> dict[str, ScramCredential]:
        """The user's SCRAM credentials by mechanism name."""
        return user_credentials(self._user_configs.get(user, {}))

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """``strata.security.sasl.ScramCredentials``: what the SCRAM server checks against."""
        return self.user_scram_credentials(user).get(mechanism)

    def describe_user_scram_credentials(self, users: Iterable[str] | None
                                        ) -> list[scram_credentials.DescribeResult]:
        return scram_credentials.describe(users, self.user_scram_credentials,
                                          lambda: list(self._user_configs))

    def alter_user_scram_credentials(self, deletions: Iterable[scram_credentials.Deletion],
                                     upsertions: Iterable[scram_credentials.Upsertion]
                                     ) -> list[scram_credentials.AlterResult]:
        """AlterUserScramCredentials: durable before this returns."""
        with self._lock:
            results, changes = scram_credentials.plan_alteration(
                deletions, upsertions, lambda u, m: m in self.user_scram_credentials(u))
            if changes:
                users = dict(self._user_configs)
                for user, change in changes.items():
                    users[user] = scram_credentials.apply_changes(users.get(user, {}), change)
                    if not users[user]:
                        del users[user]
                self._persist(self._image.topics.values(), users=users)
                self._user_configs = users
                log.info("SCRAM credentials altered: %s", {
                    u: {m: "deleted" if c is None else "set" for m, c in ch.items()}
                    for u, ch in changes.items()})
        return results

    # ---- DescribeConfigs -----------------------------------------------------------------------

    def describe_topic_configs(self, name: str, keys: Iterable[str] | None = None,
                               include_synonyms: bool = False,
                               include_documentation: bool = False) -> list[ConfigEntry]:
        """DescribeConfigs for a topic: every topic config (or only ``keys``), sorted by name.

        Synonyms, highest priority first: the topic override (TOPIC_CONFIG), the broker's
        ``log.*`` synonyms set in server.properties (STATIC_BROKER_CONFIG, raw values), then
        their Kafka defaults (DEFAULT_CONFIG). The entry's source is the first synonym's.
        (Kafka drops a lower-priority broker synonym such as ``log.retention.hours`` from the
        list for ``retention.ms`` unless ``log.retention.ms`` is set; Strata keeps it, so the
        source says where the value came from.)"""
        if name == "":
            raise InvalidRequestError("Default topic resources are not allowed.")
        validate_topic_name(name)
        image = self._image
        info = image.topics.get(name)
        if info is None:
            raise KafkaError(f"The topic '{name}' does not exist.",
                             code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return self.config_entries(info, image.configs[name], keys, include_synonyms,
                                   include_documentation)

    def config_entries(self, info: TopicInfo, config: LogConfig | None = None,
                       keys: Iterable[str] | None = None, include_synonyms: bool = False,
                       include_documentation: bool = False) -> list[ConfigEntry]:
        """The DescribeConfigs entries of ``info`` (also of a topic only validated, not created)."""
        if config is None:
            config = self._make_config(info.configs, info.name)
        wanted = set(keys) if keys else None
        entries = []
        for key in sorted(LOG_CONFIG_DEF.names()):
            if wanted is not None and key not in wanted:
                continue
            if key == "internal.segment.bytes" and key not in info.configs:
                continue  # internal configs are shown only when set, as Kafka does
            entries.append(self._topic_entry(key, config, info.configs, include_synonyms,
                                             include_documentation, info.name))
        return entries

    def _topic_entry(self, key: str, config: LogConfig, overrides: Mapping[str, str],
                     include_synonyms: bool, include_documentation: bool,
                     name: str | None = None) -> ConfigEntry:
        cdef = LOG_CONFIG_DEF[key]
        sensitive = cdef.type is ConfigType.PASSWORD
        value = None if sensitive else render_config_value(config.get(key), cdef.type)
        synonyms: list[ConfigSynonym] = []
        if key in overrides:
            synonyms.append(ConfigSynonym(key, value, ConfigSource.TOPIC_CONFIG))
        broker_keys = [b for b, _ in BROKER_SYNONYMS.get(key, [])]
        if key == "remote.storage.enable" and self._broker_tiering_skipped(name, overrides, config):
            # log.remote.storage.enable does not reach compacted or internal topics
            broker_keys = [b for b in broker_keys if b != LOG_REMOTE_STORAGE_ENABLE_PROP]
        for scope, scope_source in (
                (self._dynamic_broker.get(str(self.node_id), {}), ConfigSource.DYNAMIC_BROKER_CONFIG),
                (self._dynamic_broker.get(DEFAULT_BROKER_RESOURCE, {}),
                 ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)):
            synonyms.extend(ConfigSynonym(b, None if sensitive else scope[b], scope_source)
                            for b in broker_keys if b in scope)
        for b in broker_keys:
            if self.broker_props.get(b, "") != "":
                synonyms.append(ConfigSynonym(b, None if sensitive else self.broker_props[b],
                                              ConfigSource.STATIC_BROKER_CONFIG))
        for b in broker_keys:
            bkey = BROKER_CONFIG_KEYS.get(b)
            if bkey is not None and bkey.default is not None:
                synonyms.append(ConfigSynonym(b, None if sensitive else bkey.default,
                                              ConfigSource.DEFAULT_CONFIG))
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
        return ConfigEntry(
            name=key, value=value, read_only=False, source=source, is_sensitive=sensitive,
            synonyms=synonyms if include_synonyms else [],
            config_type=_ENTRY_TYPE[cdef.type],
            documentation=(cdef.doc or None) if include_documentation else None)

    def describe_broker_configs(self, keys: Iterable[str] | None = None,
                                include_synonyms: bool = False,
                                include_documentation: bool = False) -> list[ConfigEntry]:
        """DescribeConfigs for this broker: the known broker configs and every key of
        server.properties, sorted by name, with their effective values. Every entry is
        read-only but ``DYNAMIC_BROKER_CONFIGS``, whose source is DYNAMIC_BROKER_CONFIG or
        DYNAMIC_DEFAULT_BROKER_CONFIG when set at runtime; keys Strata does not know are typed
        UNKNOWN and, as in Kafka, treated as sensitive."""
        wanted = set(keys) if keys else None
        dynamic = self._dynamic_broker.get(str(self.node_id), {})
        default = self._dynamic_broker.get(DEFAULT_BROKER_RESOURCE, {})
        names = sorted(set(BROKER_CONFIG_KEYS) | set(self.broker_props) | set(dynamic))
        entries = []
        for name in names:
            if wanted is not None and name not in wanted:
                continue
            bkey = BROKER_CONFIG_KEYS.get(name)
            if bkey is not None and bkey.internal and name not in self.broker_props:
                continue  # Kafka's internal configs are described only when set
            sensitive = sensitive_broker_config(name)
            if name in dynamic:
                raw: str | None = dynamic[name]
            elif name in default:
                raw = default[name]
            elif name in self.broker_props:
                raw = self.broker_props[name]
            elif name == "node.id":
                raw = str(self.node_id)
            else:
                raw = bkey.default if bkey is not None else None
            value = None if sensitive else raw
            synonyms: list[ConfigSynonym] = []
            group = _broker_synonyms(name)
            for scope, source in ((dynamic, ConfigSource.DYNAMIC_BROKER_CONFIG),
                                  (default, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)):
                for b in group:
                    if b in scope:
                        synonyms.append(ConfigSynonym(b, None if sensitive else scope[b], source))
            for b in group:
                if b in self.broker_props:
                    synonyms.append(ConfigSynonym(b, None if sensitive else self.broker_props[b],
                                                  ConfigSource.STATIC_BROKER_CONFIG))
            for b in group:
                d = BROKER_CONFIG_KEYS.get(b)
                if d is not None and d.default is not None:
                    synonyms.append(ConfigSynonym(b, None if sensitive else d.default,
                                                  ConfigSource.DEFAULT_CONFIG))
            # Kafka: drop higher-priority synonyms when describing a lower-priority name.
            while synonyms and synonyms[0].name != name:
                synonyms.pop(0)
            source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
            entries.append(ConfigEntry(
                name=name, value=value,
                read_only=name not in DYNAMIC_BROKER_CONFIGS and not is_listener_ssl_config(name),
                source=source, is_sensitive=sensitive,
                synonyms=synonyms if include_synonyms else [],
                config_type=_ENTRY_TYPE[type_] if (type_ := broker_config_type(name)) is not None
                else ConfigEntryType.UNKNOWN,
                documentation=(bkey.doc if bkey is not None else None) if include_documentation
                else None))
        return entries

    def describe_default_broker_configs(self, keys: Iterable[str] | None = None,
                                        include_synonyms: bool = False,
                                        include_documentation: bool = False) -> list[ConfigEntry]:
        """DescribeConfigs for the cluster-default BROKER resource (""): only the dynamic
        defaults set, sorted by name, source DYNAMIC_DEFAULT_BROKER_CONFIG (Kafka's answer)."""
        wanted = set(keys) if keys else None
        default = self._dynamic_broker.get(DEFAULT_BROKER_RESOURCE, {})
        entries = []
        for name in sorted(default):
            if wanted is not None and name not in wanted:
                continue
            bkey = BROKER_CONFIG_KEYS[name]
            synonyms = [ConfigSynonym(name, default[name],
                                      ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)]
            if name in self.broker_props:
                synonyms.append(ConfigSynonym(name, self.broker_props[name],
                                              ConfigSource.STATIC_BROKER_CONFIG))
            if bkey.default is not None:
                synonyms.append(ConfigSynonym(name, bkey.default, ConfigSource.DEFAULT_CONFIG))
            entries.append(ConfigEntry(
                name=name, value=default[name], read_only=False,
                source=ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, is_sensitive=False,
                synonyms=synonyms if include_synonyms else [],
                config_type=_ENTRY_TYPE[bkey.type],
                documentation=bkey.doc if include_documentation else None))
        return entries
