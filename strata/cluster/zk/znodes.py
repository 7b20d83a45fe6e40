"""Kafka's ZooKeeper-mode znode layout and the JSON stored in each znode (Kafka 3.9 ``ZkData``).

Every path here is relative to the chroot of ``zookeeper.connect``. The JSON is compact
(``{"a":1}``, as Jackson writes it), UTF-8, with Kafka's field names and value types, so a
Kafka 3.9 ZooKeeper-mode tool reads what Strata writes and the other way round:

- ``/brokers/ids/N`` (ephemeral, ``BrokerRegistration``, version 5)
- ``/controller`` (ephemeral, :class:`ControllerRegistration`, version 2)
- ``/controller_epoch`` (the epoch as a decimal string; its zkVersion fences controllers)
- ``/brokers/topics/T`` (:class:`TopicAssignment`, version 3)
- ``/brokers/topics/T/partitions/P/state`` (``PartitionRegistration``, version 1)
- ``/config/<entity type>/<name>`` (``{"version":1,"config":{...}}``)
- ``/config/changes/config_change_<seq>`` (``{"version":2,"entity_path":"topics/T"}``)
- ``/admin/delete_topics/T`` (no data)
- ``/latest_producer_id_block`` (:class:`ProducerIdsBlock`, version 1)
- ``/cluster/id`` (``{"version":"1","id":"..."}``)
- ``/strata/broker_directories/N`` (Strata's own, :class:`BrokerDirectories` as the controller
  last accepted broker N's registration, version 1)
- ``/log_dir_event_notification/log_dir_event_<seq>`` (``{"version":1,"broker":N,"event":1}``)
- ``/strata/offline_replicas/N`` (Strata's own, the replicas broker N hosts in failed log dirs,
  version 1)
- ``/strata/tier_bootstrapped/N`` (Strata's own, broker N's replicas started at the tiered
  offset whose local log does not yet span the election guard, version 1)

Pure values and codecs only: nothing here talks to ZooKeeper (``client.py`` does). Brokers and
partition states decode to ``strata.cluster.image`` types; fields Kafka stores that the image
lacks (``jmx_port``, ``features``, ``timestamp``) are written with Kafka's values and dropped
on reading.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from strata.cluster.image import (
    BrokerDirectories, BrokerRegistration, Endpoint, LeaderRecoveryState, PartitionRegistration)
from strata.common.types import TopicPartition, uuid_from_kafka_str, uuid_to_kafka_str

# Paths (ZkData's *ZNode.path).
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
FEATURE_PATH = "/feature"            # finalized features (strata.cluster.features)
BROKERS_PATH = "/brokers"
BROKER_IDS_PATH = "/brokers/ids"
TOPICS_PATH = "/brokers/topics"
BROKER_SEQUENCE_ID_PATH = "/brokers/seqid"
CONFIG_PATH = "/config"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
ADMIN_PATH = "/admin"
DELETE_TOPICS_PATH = "/admin/delete_topics"
# Strata's, where Kafka sent a ControlledShutdown request to the controller: an ephemeral
# /admin/controlled_shutdown/N holding the broker epoch asks the controller to drain broker N.
CONTROLLED_SHUTDOWN_PATH = "/admin/controlled_shutdown"
ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
LOG_DIR_EVENT_NOTIFICATION_PATH = "/log_dir_event_notification"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
CLUSTER_ID_PATH = "/cluster/id"
CONSUMERS_PATH = "/consumers"
# Strata's, as KRaft's broker registrations remember log directories (KIP-858): per broker, the
# directory ids and broker epoch of the registration the controller last handled, so that a
# new controller knows which registrations are new and which brokers lost a directory.
BROKER_DIRECTORIES_PATH = "/strata/broker_directories"
LOG_DIR_EVENT_PREFIX = "log_dir_event_"
# Strata's, where Kafka's controller asked the broker (LeaderAndIsr answers): written by broker N
# before each of its log dir event notifications, read by the controller.
OFFLINE_REPLICAS_PATH = "/strata/offline_replicas"
# Strata's, the same way: broker N's tier-bootstrapped replicas not yet electable while a
# replica with more local log is (KIP-1303's guard).
TIER_BOOTSTRAPPED_PATH = "/strata/tier_bootstrapped"

# org.apache.kafka.server.config.ConfigType.ALL
CONFIG_ENTITY_TYPES = ("topics", "clients", "users", "brokers", "ips")

# ZkData.PersistentZkPaths: created at startup by every broker.
PERSISTENT_PATHS = (CONSUMERS_PATH, BROKER_IDS_PATH, TOPICS_PATH, CONFIG_CHANGES_PATH,
                    DELETE_TOPICS_PATH, CONTROLLED_SHUTDOWN_PATH, BROKER_SEQUENCE_ID_PATH, ISR_CHANGE_NOTIFICATION_PATH,
                    PRODUCER_ID_BLOCK_PATH, LOG_DIR_EVENT_NOTIFICATION_PATH) + tuple(
    f"{CONFIG_PATH}/{t}" for t in CONFIG_ENTITY_TYPES)

# KafkaController.InitialControllerEpoch / InitialControllerEpochZkVersion
INITIAL_CONTROLLER_EPOCH = 0
INITIAL_CONTROLLER_EPOCH_ZK_VERSION = 0


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{partitions_path(topic)}/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


def config_entity_path(entity_type: str, entity_name: str) -> str:
    return f"{CONFIG_PATH}/{entity_type}/{entity_name}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{topic}"


def encode_json(value: Any) -> bytes:
    """Jackson's compact form: no spaces, UTF-8, non-ASCII unescaped."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_json(data: bytes | None) -> Any:
    """The parsed JSON, or None for a znode without data (Kafka's ``Json.parseBytes``)."""
    if not data:
        return None
    return json.loads(data.decode("utf-8"))


def now_ms() -> int:
    return int(time.time() * 1000)


# --- /brokers/ids/N ---------------------------------------------------------------------
#
# Version 5 (Kafka's ``BrokerIdZNode``)::
#
#     {"version":5,"host":"h","port":9092,"endpoints":["PLAINTEXT://h:9092"],"jmx_port":-1,
#      "timestamp":"1700000000000","rack":"r1",
#      "listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"features":{}}
#
# ``host``/``port`` are the first PLAINTEXT endpoint's (null and -1 without one), for old
# clients; ``rack`` is absent when unset. The broker epoch is the znode's czxid. Strata adds
# two fields Kafka's readers skip, each only when it says something: ``"directory_ids":
# ["<kafka uuid>",..]`` (the log directories' ``directory.id``) and ``"clean_shutdown":false``
# (the logs were not closed cleanly before this registration). Without them (Kafka's, an
# older Strata's, or nothing to say) a registration reads as no directory known, clean.

BROKER_REGISTRATION_VERSION = 5


def endpoint_connection_string(endpoint: Endpoint) -> str:
    """Kafka's ``EndPoint.connectionString``: ``LISTENER://host:port`` ([host] for IPv6)."""
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return f"{endpoint.listener}://{host}:{endpoint.port}"


def parse_endpoint(value: str, protocols: Mapping[str, str]) -> Endpoint:
    """One entry of Kafka's ``listenerListToEndPoints``: the protocol comes from the map, or
    is the listener's own name when the map lacks it (Kafka's default map)."""
    name, sep, address = value.partition("://")
    host, colon, port = address.rpartition(":")
    if not sep or not colon or not name:
        raise ValueError(f"Unable to parse {value} to a broker endpoint")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return Endpoint(name, host, int(port), protocols.get(name, name))


def encode_broker(broker: BrokerRegistration, *, jmx_port: int = -1,
                  features: Mapping[str, Mapping[str, int]] | None = None,
                  timestamp_ms: int | None = None) -> bytes:
    plaintext = next((e for e in broker.endpoints if e.security_protocol == "PLAINTEXT"), None)
    doc: dict[str, Any] = {
        "version": BROKER_REGISTRATION_VERSION,
        "host": plaintext.host if plaintext else None,
        "port": plaintext.port if plaintext else -1,
        "endpoints": [endpoint_connection_string(e) for e in broker.endpoints],
        "jmx_port": jmx_port,
        "timestamp": str(now_ms() if timestamp_ms is None else timestamp_ms),
    }
    if broker.rack is not None:
        doc["rack"] = broker.rack
    doc["listener_security_protocol_map"] = {e.listener: e.security_protocol
                                             for e in broker.endpoints}
    doc["features"] = {name: dict(r) for name, r in (features or {}).items()}
    if broker.directory_ids:
        doc["directory_ids"] = [uuid_to_kafka_str(d) for d in broker.directory_ids]
    if not broker.clean_shutdown:
        doc["clean_shutdown"] = False
    return encode_json(doc)


def decode_broker(broker_id: int, data: bytes, epoch: int) -> BrokerRegistration:
    """Any version Kafka reads (1 to 5); ``epoch`` is the znode's czxid."""
    doc = decode_json(data)
    version = int(doc["version"])
    if version < 1:
        raise ValueError(f"Unsupported version of broker registration: {data!r}")
    if version == 1:
        endpoints: tuple[Endpoint, ...] = (Endpoint("PLAINTEXT", doc["host"], int(doc["port"])),)
    else:
        protocols = doc.get("listener_security_protocol_map") or {}
        endpoints = tuple(parse_endpoint(e, protocols) for e in doc["endpoints"])
    return BrokerRegistration(id=broker_id, rack=doc.get("rack"), endpoints=endpoints,
                              epoch=epoch,
                              directory_ids=tuple(uuid_from_kafka_str(d)
                                                  for d in doc.get("directory_ids") or ()),
                              clean_shutdown=doc.get("clean_shutdown") is not False)


# --- /strata/broker_directories/N -------------------------------------------------------------
#
# Version 1: ``{"version":1,"directory_ids":["<kafka uuid>"],"broker_epoch":4294967312}``,
# written by the controller (fenced by its epoch) once it has handled a registration.

def broker_directories_path(broker_id: int) -> str:
    return f"{BROKER_DIRECTORIES_PATH}/{broker_id}"


def encode_broker_directories(value: BrokerDirectories) -> bytes:
    return encode_json({"version": 1,
                        "directory_ids": [uuid_to_kafka_str(d) for d in value.directory_ids],
                        "broker_epoch": value.broker_epoch})


def decode_broker_directories(data: bytes) -> BrokerDirectories:
    doc = decode_json(data)
    if int(doc["version"]) != 1:
        raise ValueError(f"Unsupported version of broker directories: {data!r}")
    return BrokerDirectories(tuple(uuid_from_kafka_str(d) for d in doc["directory_ids"]),
                             int(doc["broker_epoch"]))


# --- /log_dir_event_notification and /strata/offline_replicas ---------------------------------
#
# ``log_dir_event_<seq>`` (persistent sequential, Kafka's ``LogDirEventNotificationSequenceZNode``):
# ``{"version":1,"broker":2,"event":1}``; event 1 is Kafka's LogDirFailure, 2 Strata's "a dir
# came back", 3 Strata's "tier-bootstrapped replicas changed". The controller reads, acts on and
# deletes them. What broker N reports is in ``/strata/offline_replicas/N`` and
# ``/strata/tier_bootstrapped/N``: ``{"version":1,"broker_epoch":4294967312,
# "partitions":{"t":[0,2]}}`` (all of broker N's replicas of that kind, written by broker N; a
# broker epoch other than its registration's is stale).

LOG_DIR_FAILURE_EVENT = 1
LOG_DIR_RECOVERY_EVENT = 2
TIER_BOOTSTRAP_EVENT = 3


def replica_report_path(base: str, broker_id: int) -> str:
    """``base`` (``OFFLINE_REPLICAS_PATH`` or ``TIER_BOOTSTRAPPED_PATH``) for broker N."""
    return f"{base}/{broker_id}"


def encode_log_dir_event(broker_id: int, event: int = LOG_DIR_FAILURE_EVENT) -> bytes:
    return encode_json({"version": 1, "broker": broker_id, "event": event})


def decode_log_dir_event(data: bytes) -> int:
    """The broker id of a notification."""
    return int(decode_json(data)["broker"])


def encode_replica_report(broker_epoch: int, partitions: frozenset[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return encode_json({"version": 1, "broker_epoch": broker_epoch, "partitions": by_topic})


def decode_replica_report(data: bytes) -> tuple[int, frozenset[TopicPartition]]:
    """(broker epoch, frozenset of TopicPartition)."""
    doc = decode_json(data)
    if int(doc["version"]) != 1:
        raise ValueError(f"Unsupported version of a replica report: {data!r}")
    return int(doc["broker_epoch"]), frozenset(
        TopicPartition(t, int(p)) for t, ps in (doc.get("partitions") or {}).items() for p in ps)


# --- /controller and /controller_epoch ---------------------------------------------------

@dataclass(frozen=True)
class ControllerRegistration:
    """``/controller`` (Kafka's ``ControllerZNode``)::

        {"version":2,"brokerid":1,"timestamp":"1700000000000","kraftControllerEpoch":-1}

    ``zk_version`` is the znode's version, filled in on reading.
    """

    broker_id: int
    timestamp: int = 0
    kraft_controller_epoch: int = -1
    zk_version: int = -1

    def encode(self) -> bytes:
        return encode_json({"version": 2, "brokerid": self.broker_id,
                            "timestamp": str(self.timestamp),
                            "kraftControllerEpoch": self.kraft_controller_epoch})

    @classmethod
    def decode(cls, data: bytes, zk_version: int = -1) -> "ControllerRegistration":
        doc = decode_json(data)
        return cls(int(doc["brokerid"]), int(doc.get("timestamp", 0)),
                   int(doc.get("kraftControllerEpoch", -1)), zk_version)


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode("utf-8")


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode("utf-8"))


# --- /brokers/topics/T -------------------------------------------------------------------

@dataclass(frozen=True)
class ReplicaAssignment:
    """One partition's replicas, and those being added or removed by a reassignment."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicAssignment:
    """``/brokers/topics/T``, version 3 (Kafka's ``TopicZNode``)::

        {"version":3,"partitions":{"0":[1,2,3]},"adding_replicas":{},"removing_replicas":{},
         "topic_id":"<22-char Kafka uuid>"}

    ``adding_replicas``/``removing_replicas`` list only the partitions that have some;
    ``topic_id`` is absent for topics made before topic ids. ``zk_version`` is the znode's
    version, filled in on reading.
    """

    topic: str
    topic_id: uuid.UUID | None
    partitions: Mapping[int, ReplicaAssignment]
    zk_version: int = -1

    def encode(self) -> bytes:
        ordered = sorted(self.partitions.items())
        doc: dict[str, Any] = {
            "version": 3,
            "partitions": {str(p): list(a.replicas) for p, a in ordered},
            "adding_replicas": {str(p): list(a.adding_replicas)
                                for p, a in ordered if a.adding_replicas},
            "removing_replicas": {str(p): list(a.removing_replicas)
                                  for p, a in ordered if a.removing_replicas},
        }
        if self.topic_id is not None:
            doc["topic_id"] = uuid_to_kafka_str(self.topic_id)
        return encode_json(doc)

    @classmethod
    def decode(cls, topic: str, data: bytes | None, zk_version: int = -1) -> "TopicAssignment":
        doc = decode_json(data) or {}
        topic_id = uuid_from_kafka_str(doc["topic_id"]) if doc.get("topic_id") else None
        adding = doc.get("adding_replicas") or {}
        removing = doc.get("removing_replicas") or {}
        partitions = {
            int(p): ReplicaAssignment(tuple(replicas), tuple(adding.get(p, ())),
                                      tuple(removing.get(p, ())))
            for p, replicas in (doc.get("partitions") or {}).items()}
        return cls(topic, topic_id, partitions, zk_version)


# --- /brokers/topics/T/partitions/P/state --------------------------------------------------
#
# Version 1 (Kafka's ``TopicPartitionStateZNode``)::
#
#     {"version":1,"leader":1,"leader_epoch":0,"controller_epoch":1,"isr":[1,2,3]}
#
# plus ``"leader_recovery_state":1`` only while the leader is RECOVERING, and KIP-966's
# ``"eligible_leader_replicas":[2]`` and ``"last_known_elr":[1]`` only while not empty (Kafka's
# ZooKeeper mode never had them; its readers ignore fields they do not know). The partition
# epoch is the znode's version: the version the next conditional write of the state expects.

def encode_partition_state(state: PartitionRegistration) -> bytes:
    doc: dict[str, Any] = {"version": 1, "leader": state.leader, "leader_epoch": state.leader_epoch,
                           "controller_epoch": state.controller_epoch, "isr": list(state.isr)}
    if state.leader_recovery_state != LeaderRecoveryState.RECOVERED:
        doc["leader_recovery_state"] = int(state.leader_recovery_state)
    if state.elr:
        doc["eligible_leader_replicas"] = list(state.elr)
    if state.last_known_elr:
        doc["last_known_elr"] = list(state.last_known_elr)
    return encode_json(doc)


def decode_partition_state(data: bytes, zk_version: int, zxid: int = 0) -> PartitionRegistration:
    doc = decode_json(data)
    return PartitionRegistration(
        leader=int(doc["leader"]), isr=tuple(int(b) for b in doc["isr"]),
        leader_epoch=int(doc["leader_epoch"]), partition_epoch=zk_version,
        leader_recovery_state=LeaderRecoveryState(int(doc.get("leader_recovery_state", 0))),
        controller_epoch=int(doc["controller_epoch"]), zxid=zxid,
        elr=tuple(int(b) for b in doc.get("eligible_leader_replicas", ())),
        last_known_elr=tuple(int(b) for b in doc.get("last_known_elr", ())))


# --- /config --------------------------------------------------------------------------------

def encode_entity_config(config: Mapping[str, str]) -> bytes:
    """``/config/<type>/<name>`` (``ConfigEntityZNode``): ``{"version":1,"config":{...}}``."""
    return encode_json({"version": 1, "config": {k: str(v) for k, v in config.items()}})


def decode_entity_config(data: bytes | None) -> dict[str, str]:
    doc = decode_json(data)
    config = doc.get("config") if isinstance(doc, dict) else None
    return {k: str(v) for k, v in (config or {}).items()}


def encode_config_change(entity_path: str) -> bytes:
    """``/config/changes/config_change_<seq>``: ``{"version":2,"entity_path":"topics/T"}``."""
    return encode_json({"version": 2, "entity_path": entity_path})


def decode_config_change(data: bytes) -> str:
    return decode_json(data)["entity_path"]


# --- /latest_producer_id_block ---------------------------------------------------------------

PRODUCER_ID_BLOCK_SIZE = 1000  # ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class ProducerIdsBlock:
    """``/latest_producer_id_block``, version 1 (``ProducerIdBlockZNode``)::

        {"version":1,"broker":1,"block_start":"0","block_end":"999"}

    The ids ``first_producer_id`` .. ``last_producer_id`` (inclusive) belong to one broker.
    """

    assigned_broker_id: int
    first_producer_id: int
    size: int

    @property
    def last_producer_id(self) -> int:
        return self.first_producer_id + self.size - 1

    @property
    def next_block_first_id(self) -> int:
        return self.first_producer_id + self.size

    def encode(self) -> bytes:
        return encode_json({"version": 1, "broker": self.assigned_broker_id,
                            "block_start": str(self.first_producer_id),
                            "block_end": str(self.last_producer_id)})

    @classmethod
    def decode(cls, data: bytes) -> "ProducerIdsBlock":
        doc = decode_json(data)
        start, end = int(doc["block_start"]), int(doc["block_end"])
        return cls(int(doc["broker"]), start, end - start + 1)


# --- /cluster/id ------------------------------------------------------------------------------

def encode_cluster_id(cluster_id: str) -> bytes:
    """``/cluster/id`` (``ClusterIdZNode``): ``{"version":"1","id":"..."}`` (version a string)."""
    return encode_json({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return decode_json(data)["id"]
