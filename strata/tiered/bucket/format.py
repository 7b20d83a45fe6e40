"""The bucket's manifest objects: encoding, decoding and the errors a bad object gives.

Every object is one header line then a JSON body (docs/remote-manifests.md)::

    STRATA-MANIFEST <kind> v<format version> crc32c=<8 hex digits> length=<body bytes>\\n
    {...}

``kind`` is ``partition``, ``pointer``, ``topic`` or ``cluster``. A reader refuses a body whose
length or CRC32C differs from the header's (truncated or corrupted), a format version above
``FORMAT_VERSION`` (written by a newer Strata) and a body whose fields do not parse, with a
``ManifestError`` naming the object's key: nothing is guessed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Mapping

from crc32c import crc32c

from strata.common.types import TopicIdPartition, TopicPartition
from strata.common.types import uuid_from_kafka_str as kafka_str_to_uuid
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState)

FORMAT_VERSION = 1
MAGIC = "STRATA-MANIFEST"
KINDS = ("partition", "pointer", "topic", "cluster", "snapshot")
_HEADER = re.compile(rb"^STRATA-MANIFEST (?P<kind>[a-z]+) v(?P<version>\d+) "
                     rb"crc32c=(?P<crc>[0-9a-f]{8}) length=(?P<length>\d+)\n")


class ManifestError(Exception):
    """A manifest object that cannot be used: missing, truncated, corrupted, of a newer
    format version or malformed. ``key`` is the object's key."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"manifest object {key}: {reason}")
        self.key = key
        self.reason = reason


class ManifestVersionError(ManifestError):
    """Written in a format version this broker does not read."""


def encode(kind: str, body: Mapping[str, Any]) -> bytes:
    assert kind in KINDS
    data = json.dumps({"formatVersion": FORMAT_VERSION, **body}, sort_keys=True,
                      separators=(",", ":")).encode()
    header = f"{MAGIC} {kind} v{FORMAT_VERSION} crc32c={crc32c(data):08x} length={len(data)}\n"
    return header.encode() + data


def decode(key: str, data: bytes, kind: str) -> dict[str, Any]:
    """The body of a ``kind`` object; raises ManifestError (naming ``key``) for anything else."""
    m = _HEADER.match(data)
    if m is None:
        raise ManifestError(key, "no STRATA-MANIFEST header (not a manifest, or truncated "
                                 "before its first line ended)")
    version = int(m["version"])
    if version > FORMAT_VERSION:
        raise ManifestVersionError(key, f"format version {version} is newer than this "
                                        f"broker's ({FORMAT_VERSION})")
    if m["kind"].decode() != kind:
        raise ManifestError(key, f"a {m['kind'].decode()} object where a {kind} was expected")
    body = data[m.end():]
    length = int(m["length"])
    if len(body) != length:
        raise ManifestError(key, f"truncated or padded: {len(body)} body bytes, the header "
                                 f"says {length}")
    if crc32c(body) != int(m["crc"], 16):
        raise ManifestError(key, f"CRC32C {crc32c(body):08x} differs from the header's "
                                 f"{m['crc'].decode()}")
    try:
        obj = json.loads(body)
    except ValueError as e:
        raise ManifestError(key, f"body is not JSON: {e}") from e
    if not isinstance(obj, dict) or obj.get("formatVersion") != version:
        raise ManifestError(key, "body's formatVersion differs from the header's")
    return obj


# ---- partition manifests -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SegmentEntry:
    """One remote segment as a partition manifest lists it. ``object_topic_id``: the topic id
    in the keys of its objects (that of a topic it was recovered from), None when it is the
    manifest's own."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    broker_id: int
    size_bytes: int
    leader_epochs: Mapping[int, int]
    state: RemoteLogSegmentState
    txn_idx_empty: bool
    object_topic_id: uuid.UUID | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"id": kafka_uuid_str(self.segment_id), "startOffset": self.start_offset,
               "endOffset": self.end_offset, "maxTimestampMs": self.max_timestamp_ms,
               "eventTimestampMs": self.event_timestamp_ms, "brokerId": self.broker_id,
               "sizeBytes": self.size_bytes,
               "leaderEpochs": [[e, o] for e, o in sorted(self.leader_epochs.items())],
               "state": self.state.name, "txnIndexEmpty": self.txn_idx_empty}
        if self.object_topic_id is not None:
            out["objectTopicId"] = kafka_uuid_str(self.object_topic_id)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SegmentEntry:
        epochs = {int(e): int(o) for e, o in obj["leaderEpochs"]}
        start, end = int(obj["startOffset"]), int(obj["endOffset"])
        if not epochs or start < 0 or end < start or any(
                not start <= o <= end for o in epochs.values()):
            raise ValueError(f"segment {obj.get('id')}: offsets [{start}, {end}] and leader "
                             f"epochs {epochs} are inconsistent")
        other = obj.get("objectTopicId")
        return cls(kafka_str_to_uuid(obj["id"]), start, end, int(obj["maxTimestampMs"]),
                   int(obj["eventTimestampMs"]), int(obj["brokerId"]), int(obj["sizeBytes"]),
                   epochs, RemoteLogSegmentState[obj["state"]], bool(obj["txnIndexEmpty"]),
                   kafka_str_to_uuid(other) if other is not None else None)

    @classmethod
    def of(cls, meta: RemoteLogSegmentMetadata, object_topic_id: uuid.UUID | None) -> SegmentEntry:
        return cls(meta.remote_log_segment_id.id, meta.start_offset, meta.end_offset,
                   meta.max_timestamp_ms, meta.event_timestamp_ms, meta.broker_id,
                   meta.segment_size_in_bytes, dict(meta.segment_leader_epochs), meta.state,
                   meta.txn_idx_empty, object_topic_id)

    def metadata(self, tip: TopicIdPartition, custom: bytes | None) -> RemoteLogSegmentMetadata:
        """This segment as COPY_SEGMENT_STARTED metadata of partition ``tip`` (a recovery
        publishes it, then its FINISHED update with ``custom``)."""
        return RemoteLogSegmentMetadata(
            RemoteLogSegmentId(tip, self.segment_id), self.start_offset, self.end_offset,
            self.max_timestamp_ms, self.broker_id, self.event_timestamp_ms, self.size_bytes,
            custom_metadata=custom, segment_leader_epochs=dict(self.leader_epochs),
            txn_idx_empty=self.txn_idx_empty)


@dataclasses.dataclass(frozen=True)
class PartitionManifest:
    """The remote segments of one partition, as its leader at ``leader_epoch`` last wrote
    them (``sequence`` counts the manifests of the partition)."""

    cluster_id: str
    topic: str
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    sequence: int
    written_ms: int
    log_start_offset: int
    segments: tuple[SegmentEntry, ...]

    def encode(self) -> bytes:
        return encode("partition", {
            "clusterId": self.cluster_id, "topic": self.topic,
            "topicId": kafka_uuid_str(self.topic_id), "partition": self.partition,
            "leaderEpoch": self.leader_epoch, "sequence": self.sequence,
            "writtenMs": self.written_ms, "logStartOffset": self.log_start_offset,
            "segments": [s.to_json() for s in self.segments]})

    @classmethod
    def decode(cls, key: str, data: bytes) -> PartitionManifest:
        obj = decode(key, data, "partition")
        try:
            return cls(str(obj["clusterId"]), str(obj["topic"]), kafka_str_to_uuid(obj["topicId"]),
                       int(obj["partition"]), int(obj["leaderEpoch"]), int(obj["sequence"]),
                       int(obj["writtenMs"]), int(obj["logStartOffset"]),
                       tuple(SegmentEntry.from_json(s) for s in obj["segments"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(key, f"malformed partition manifest: {e!r}") from e

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, TopicPartition(self.topic, self.partition))


@dataclasses.dataclass(frozen=True)
class Pointer:
    """Which manifest object of a partition is current, and the leader epoch that wrote it."""

    leader_epoch: int
    sequence: int
    manifest_key: str

    def encode(self) -> bytes:
        return encode("pointer", {"leaderEpoch": self.leader_epoch, "sequence": self.sequence,
                                  "manifest": self.manifest_key})

    @classmethod
    def decode(cls, key: str, data: bytes) -> Pointer:
        obj = decode(key, data, "pointer")
        try:
            return cls(int(obj["leaderEpoch"]), int(obj["sequence"]), str(obj["manifest"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(key, f"malformed pointer: {e!r}") from e


@dataclasses.dataclass(frozen=True)
class TopicManifest:
    """A tiered topic: its id, partition count and config overrides. ``origin_topic_ids``:
    the ids of the topics it was recovered from, oldest first."""

    cluster_id: str
    topic: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str]
    written_ms: int
    origin_topic_ids: tuple[uuid.UUID, ...] = ()

    def encode(self) -> bytes:
        return encode("topic", {
            "clusterId": self.cluster_id, "topic": self.topic,
            "topicId": kafka_uuid_str(self.topic_id), "partitions": self.partitions,
            "configs": dict(sorted(self.configs.items())), "writtenMs": self.written_ms,
            "originTopicIds": [kafka_uuid_str(t) for t in self.origin_topic_ids]})

    @classmethod
    def decode(cls, key: str, data: bytes) -> TopicManifest:
        obj = decode(key, data, "topic")
        try:
            partitions = int(obj["partitions"])
            if partitions <= 0:
                raise ValueError(f"partitions {partitions}")
            configs = obj["configs"]
            if not isinstance(configs, dict):
                raise TypeError("configs is not an object")
            return cls(str(obj["clusterId"]), str(obj["topic"]), kafka_str_to_uuid(obj["topicId"]),
                       partitions, {str(k): str(v) for k, v in configs.items()},
                       int(obj["writtenMs"]),
                       tuple(kafka_str_to_uuid(t) for t in obj.get("originTopicIds", ())))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(key, f"malformed topic manifest: {e!r}") from e


@dataclasses.dataclass(frozen=True)
class ClusterMarker:
    """The cluster that owns a key prefix, until ``lease_until_ms`` unless it renews."""

    cluster_id: str
    lease_until_ms: int
    written_ms: int

    def encode(self) -> bytes:
        return encode("cluster", {"clusterId": self.cluster_id,
                                  "leaseUntilMs": self.lease_until_ms,
                                  "writtenMs": self.written_ms})

    @classmethod
    def decode(cls, key: str, data: bytes) -> ClusterMarker:
        obj = decode(key, data, "cluster")
        try:
            return cls(str(obj["clusterId"]), int(obj["leaseUntilMs"]), int(obj["writtenMs"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(key, f"malformed cluster marker: {e!r}") from e
