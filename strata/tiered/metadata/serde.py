"""Record values of the ``__remote_log_metadata`` topic, byte-compatible with Kafka 4.3.

Kafka's ``RemoteLogMetadataSerde`` over ``BytesApiMessageSerde``. A record value is::

    uvarint frame_version (= 1) | uvarint api_key | uvarint version | body

and the body is the flexible-version (KIP-482) encoding of the message's JSON schema
(``storage/src/main/resources/message/*.json``): int8/int32/int64 big-endian, uuid as 16
bytes (most significant half first), compact string/array/nullable bytes with an uvarint
length + 1 (0 = null), and after every struct (the message and each nested struct) a
tagged-field section: uvarint count, then per field uvarint tag, uvarint size, data.

============================================  =======  ========  ===================================
message                                       api_key  versions  value type
============================================  =======  ========  ===================================
RemoteLogSegmentMetadataRecord                0        0         api.RemoteLogSegmentMetadata
RemoteLogSegmentMetadataUpdateRecord          1        0         api.RemoteLogSegmentMetadataUpdate
RemotePartitionDeleteMetadataRecord           2        0         api.RemotePartitionDeleteMetadata
RemoteLogSegmentMetadataSnapshotRecord        3        0         RemoteLogSegmentMetadataSnapshot
============================================  =======  ========  ===================================

Field order (all version 0)::

    TopicIdPartitionEntry    = Name: string, Id: uuid, Partition: int32, tags
    RemoteLogSegmentIdEntry  = TopicIdPartition: TopicIdPartitionEntry, Id: uuid, tags
    SegmentLeaderEpochEntry  = LeaderEpoch: int32, Offset: int64, tags
    0: RemoteLogSegmentId, StartOffset int64, EndOffset int64, BrokerId int32, MaxTimestampMs int64,
       EventTimestampMs int64, SegmentLeaderEpochs []SegmentLeaderEpochEntry, SegmentSizeInBytes int32,
       CustomMetadata nullable bytes, RemoteLogSegmentState int8,
       tags {0: TxnIndexEmpty bool, written only when true; 10000: leader epoch}
    1: RemoteLogSegmentId, BrokerId int32, EventTimestampMs int64, CustomMetadata nullable bytes,
       RemoteLogSegmentState int8, tags {10000: leader epoch}
    2: TopicIdPartition, BrokerId int32, EventTimestampMs int64, RemotePartitionDeleteState int8,
       tags {10000: leader epoch}
    3: SegmentId uuid, StartOffset int64, EndOffset int64, BrokerId int32, MaxTimestampMs int64,
       EventTimestampMs int64, SegmentLeaderEpochs, SegmentSizeInBytes int32, CustomMetadata,
       RemoteLogSegmentState int8, tags {0: TxnIndexEmpty bool}

Tag 10000 is Strata's own: the leader epoch of the user partition its writer led at
(``leader_epoch`` of the api types; int32, written only when known). Readers refuse a
deposed leader's records by it (``cache.RemotePartitionMetadataStore``); Kafka's readers skip
it as they skip any unknown tagged field, so Kafka reads every record Strata writes.

Unknown tagged fields are skipped, as Kafka's transforms drop them. Kafka's trunk after 4.3.1
adds version 1 of record 0 (tagged BrokerLeaderEpoch, tag 1); like 4.3.1 and 4.4.0 (whose
record 0 is still version 0 only) this module rejects it. Kafka's topic-based manager never writes the snapshot record (3); it is here for completeness.

The partitioner (Kafka's ``RemoteLogMetadataTopicPartitioner``) maps a user partition to a
partition of the metadata topic; every broker must agree on it.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Union

from strata.tiered.api import (
    CustomMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    TopicPartition,
)

__all__ = [
    "FRAME_VERSION",
    "MetadataParseException",
    "REMOTE_LOG_SEGMENT_METADATA_API_KEY",
    "REMOTE_LOG_SEGMENT_METADATA_SNAPSHOT_API_KEY",
    "REMOTE_LOG_SEGMENT_METADATA_UPDATE_API_KEY",
    "REMOTE_PARTITION_DELETE_API_KEY",
    "RemoteLogMetadataSerde",
    "RemoteLogMetadataTopicPartitioner",
    "RemoteLogSegmentMetadataSnapshot",
    "deserialize",
    "metadata_partition",
    "murmur2",
    "serialize",
]

FRAME_VERSION = 1
REMOTE_LOG_SEGMENT_METADATA_API_KEY = 0
REMOTE_LOG_SEGMENT_METADATA_UPDATE_API_KEY = 1
REMOTE_PARTITION_DELETE_API_KEY = 2
REMOTE_LOG_SEGMENT_METADATA_SNAPSHOT_API_KEY = 3

# api_key -> versions this module reads and writes (Kafka 4.3: all "validVersions": "0").
SUPPORTED_VERSIONS: Mapping[int, range] = MappingProxyType({
    REMOTE_LOG_SEGMENT_METADATA_API_KEY: range(0, 1),
    REMOTE_LOG_SEGMENT_METADATA_UPDATE_API_KEY: range(0, 1),
    REMOTE_PARTITION_DELETE_API_KEY: range(0, 1),
    REMOTE_LOG_SEGMENT_METADATA_SNAPSHOT_API_KEY: range(0, 1),
})

_TAG_TXN_INDEX_EMPTY = 0
# Strata's own tagged field on records 0, 1 and 2: the writer's leader epoch of the user
# partition (int32), written only when known. Kafka 4.4 defines no tag this high; its
# readers skip it as an unknown tagged field.
TAG_LEADER_EPOCH = 10_000
_INT32 = struct.Struct(">i")
_MAX_STRING_LENGTH = 0x7FFF  # Kafka refuses longer compact strings
_SHORT_MAX = 0x7FFF


class MetadataParseException(ValueError):
    """A ``__remote_log_metadata`` record value could not be decoded (Kafka's MetadataParseException)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataSnapshot(RemoteLogMetadata):
    """One segment's metadata as a snapshot record stores it: without its topic partition,
    which the snapshot file implies (Kafka's storage-internal type; api_key 3)."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    custom_metadata: CustomMetadata | None
    state: RemoteLogSegmentState
    segment_leader_epochs: Mapping[int, int]
    txn_idx_empty: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.segment_id, uuid.UUID):
            raise ValueError("segment_id must be a uuid.UUID")
        if self.state is None:
            raise ValueError("state can not be None")
        object.__setattr__(self, "state", RemoteLogSegmentState(self.state))
        if self.custom_metadata is not None:
            object.__setattr__(self, "custom_metadata", CustomMetadata(self.custom_metadata))
        if not self.segment_leader_epochs:
            raise ValueError("segment_leader_epochs can not be None or empty")
        object.__setattr__(self, "segment_leader_epochs",
                           MappingProxyType(dict(sorted(self.segment_leader_epochs.items()))))
        object.__setattr__(self, "txn_idx_empty", bool(self.txn_idx_empty))

    def __hash__(self) -> int:
        return hash((self.segment_id, self.start_offset, self.end_offset, self.max_timestamp_ms,
                     tuple(self.segment_leader_epochs.items()), self.segment_size_in_bytes,
                     self.custom_metadata, self.state))

    def __reduce__(self) -> tuple[Any, ...]:
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        values[9] = dict(self.segment_leader_epochs)
        return (RemoteLogSegmentMetadataSnapshot, tuple(values))

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        raise TypeError("a snapshot record does not carry its topic partition")

    @classmethod
    def create(cls, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadataSnapshot:
        return cls(metadata.remote_log_segment_id.id, metadata.start_offset, metadata.end_offset,
                   metadata.max_timestamp_ms, metadata.broker_id, metadata.event_timestamp_ms,
                   metadata.segment_size_in_bytes, metadata.custom_metadata, metadata.state,
                   metadata.segment_leader_epochs, metadata.txn_idx_empty)


AnyRemoteLogMetadata = Union[RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
                             RemotePartitionDeleteMetadata, RemoteLogSegmentMetadataSnapshot]


# --------------------------------------------------------------------------- writing

_INT8 = struct.Struct(">b")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class _Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def uvarint(self, value: int) -> None:
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"unsigned varint out of range: {value}")
        while value > 0x7F:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)

    def _pack(self, st: struct.Struct, value: int, name: str) -> None:
        try:
            self.buf += st.pack(value)
        except struct.error as exc:
            raise ValueError(f"{name}={value!r} does not fit its field: {exc}") from None

    def int8(self, value: int, name: str) -> None:
        self._pack(_INT8, value, name)

    def int32(self, value: int, name: str) -> None:
        self._pack(_INT32, value, name)

    def int64(self, value: int, name: str) -> None:
        self._pack(_INT64, value, name)

    def uuid(self, value: uuid.UUID) -> None:
        self.buf += value.bytes

    def compact_string(self, value: str, name: str) -> None:
        data = value.encode("utf-8")
        if len(data) > _MAX_STRING_LENGTH:
            raise ValueError(f"'{name}' field is too long to be serialized")
        self.uvarint(len(data) + 1)
        self.buf += data

    def compact_nullable_bytes(self, value: bytes | None) -> None:
        if value is None:
            self.uvarint(0)
        else:
            self.uvarint(len(value) + 1)
            self.buf += value

    def tagged_fields(self, fields: list[tuple[int, bytes]]) -> None:
        self.uvarint(len(fields))
        for tag, data in fields:  # ascending tag order, as Kafka writes them
            self.uvarint(tag)
            self.uvarint(len(data))
            self.buf += data


def _write_topic_id_partition(w: _Writer, tip: TopicIdPartition) -> None:
    w.compact_string(tip.topic_partition.topic, "name")
    w.uuid(tip.topic_id)
    w.int32(tip.topic_partition.partition, "partition")
    w.tagged_fields([])


def _write_segment_id(w: _Writer, segment_id: RemoteLogSegmentId) -> None:
    _write_topic_id_partition(w, segment_id.topic_id_partition)
    w.uuid(segment_id.id)
    w.tagged_fields([])


def _write_leader_epochs(w: _Writer, epochs: Mapping[int, int]) -> None:
    w.uvarint(len(epochs) + 1)
    for epoch, offset in epochs.items():
        w.int32(epoch, "leader_epoch")
        w.int64(offset, "offset")
        w.tagged_fields([])


def _segment_tags(txn_idx_empty: bool) -> list[tuple[int, bytes]]:
    # TxnIndexEmpty is tagged with default false: written only when true.
    return [(_TAG_TXN_INDEX_EMPTY, b"\x01")] if txn_idx_empty else []


def _epoch_tags(leader_epoch: int) -> list[tuple[int, bytes]]:
    # The writer's leader epoch, written only when known (>= 0).
    return [(TAG_LEADER_EPOCH, _INT32.pack(leader_epoch))] if leader_epoch >= 0 else []


def _write_segment_body(w: _Writer, m: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataSnapshot) -> None:
    """What records 0 and 3 share after the segment id."""
    w.int64(m.start_offset, "start_offset")
    w.int64(m.end_offset, "end_offset")
    w.int32(m.broker_id, "broker_id")
    w.int64(m.max_timestamp_ms, "max_timestamp_ms")
    w.int64(m.event_timestamp_ms, "event_timestamp_ms")
    _write_leader_epochs(w, m.segment_leader_epochs)
    w.int32(m.segment_size_in_bytes, "segment_size_in_bytes")
    w.compact_nullable_bytes(m.custom_metadata)
    w.int8(m.state.id, "state")
    epoch = m.leader_epoch if isinstance(m, RemoteLogSegmentMetadata) else -1
    w.tagged_fields(_segment_tags(m.txn_idx_empty) + _epoch_tags(epoch))


def _write_segment_metadata(w: _Writer, m: RemoteLogSegmentMetadata) -> None:
    _write_segment_id(w, m.remote_log_segment_id)
    _write_segment_body(w, m)


def _write_segment_update(w: _Writer, u: RemoteLogSegmentMetadataUpdate) -> None:
    _write_segment_id(w, u.remote_log_segment_id)
    w.int32(u.broker_id, "broker_id")
    w.int64(u.event_timestamp_ms, "event_timestamp_ms")
    w.compact_nullable_bytes(u.custom_metadata)
    w.int8(u.state.id, "state")
    w.tagged_fields(_epoch_tags(u.leader_epoch))


def _write_partition_delete(w: _Writer, d: RemotePartitionDeleteMetadata) -> None:
    _write_topic_id_partition(w, d.topic_id_partition)
    w.int32(d.broker_id, "broker_id")
    w.int64(d.event_timestamp_ms, "event_timestamp_ms")
    w.int8(d.state.id, "state")
    w.tagged_fields(_epoch_tags(d.leader_epoch))


def _write_snapshot(w: _Writer, s: RemoteLogSegmentMetadataSnapshot) -> None:
    w.uuid(s.segment_id)
    _write_segment_body(w, s)


_WRITERS: tuple[tuple[type, int, Any], ...] = (
    (RemoteLogSegmentMetadata, REMOTE_LOG_SEGMENT_METADATA_API_KEY, _write_segment_metadata),
    (RemoteLogSegmentMetadataUpdate, REMOTE_LOG_SEGMENT_METADATA_UPDATE_API_KEY, _write_segment_update),
    (RemotePartitionDeleteMetadata, REMOTE_PARTITION_DELETE_API_KEY, _write_partition_delete),
    (RemoteLogSegmentMetadataSnapshot, REMOTE_LOG_SEGMENT_METADATA_SNAPSHOT_API_KEY, _write_snapshot),
)


def serialize(metadata: AnyRemoteLogMetadata) -> bytes:
    """The ``__remote_log_metadata`` record value for ``metadata`` (highest version, 0)."""
    for cls, api_key, write in _WRITERS:
        if isinstance(metadata, cls):
            w = _Writer()
            w.uvarint(FRAME_VERSION)
            w.uvarint(api_key)
            w.uvarint(SUPPORTED_VERSIONS[api_key][-1])
            write(w, metadata)
            return bytes(w.buf)
    raise TypeError(f"no remote log metadata record for {type(metadata).__name__}")


# --------------------------------------------------------------------------- reading


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise MetadataParseException(f"need {n} byte(s) for {what}, {self.remaining} left")
        start = self.pos
        self.pos += n
        return self.data[start:self.pos]

    def uvarint(self, what: str) -> int:
        value = 0
        for i in range(5):  # Kafka's readUnsignedVarint: at most 5 bytes (32 bits)
            if self.pos >= len(self.data):
                raise MetadataParseException(f"truncated varint in {what}")
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                if value > 0xFFFFFFFF:
                    raise MetadataParseException(f"varint too long in {what}")
                return value
        raise MetadataParseException(f"varint too long in {what}")

    def int8(self, what: str) -> int:
        return _INT8.unpack(self.take(1, what))[0]

    def int32(self, what: str) -> int:
        return _INT32.unpack(self.take(4, what))[0]

    def int64(self, what: str) -> int:
        return _INT64.unpack(self.take(8, what))[0]

    def uuid(self, what: str) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16, what))

    def compact_string(self, what: str) -> str:
        n = self.uvarint(what) - 1
        if n < 0:
            raise MetadataParseException(f"non-nullable field {what} was serialized as null")
        if n > _MAX_STRING_LENGTH:
            raise MetadataParseException(f"string field {what} had invalid length {n}")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataParseException(f"field {what} is not UTF-8: {exc}") from None

    def compact_nullable_bytes(self, what: str) -> bytes | None:
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        return bytes(self.take(n, what))

    def compact_array_length(self, what: str) -> int:
        n = self.uvarint(what) - 1
        if n < 0:
            raise MetadataParseException(f"non-nullable field {what} was serialized as null")
        if n > self.remaining:
            raise MetadataParseException(f"array {what} claims {n} elements, {self.remaining} byte(s) left")
        return n

    def tagged_fields(self, what: str) -> dict[int, bytes]:
        """The tagged-field section: known and unknown fields by tag."""
        fields: dict[int, bytes] = {}
        for _ in range(self.uvarint(f"{what} tagged field count")):
            tag = self.uvarint(f"{what} tag")
            size = self.uvarint(f"{what} tag {tag} size")
            fields[tag] = bytes(self.take(size, f"{what} tag {tag}"))
        return fields


def _read_topic_id_partition(r: _Reader) -> TopicIdPartition:
    name = r.compact_string("name")
    topic_id = r.uuid("topic id")
    partition = r.int32("partition")
    r.tagged_fields("TopicIdPartitionEntry")
    return TopicIdPartition(topic_id, TopicPartition(name, partition))


def _read_segment_id(r: _Reader) -> RemoteLogSegmentId:
    tip = _read_topic_id_partition(r)
    segment_id = r.uuid("segment id")
    r.tagged_fields("RemoteLogSegmentIdEntry")
    return RemoteLogSegmentId(tip, segment_id)


def _read_leader_epochs(r: _Reader) -> dict[int, int]:
    epochs: dict[int, int] = {}
    for _ in range(r.compact_array_length("segment_leader_epochs")):
        epoch = r.int32("leader_epoch")
        epochs[epoch] = r.int64("offset")  # a repeated epoch: the last one wins, as in Kafka's HashMap
        r.tagged_fields("SegmentLeaderEpochEntry")
    return epochs


def _segment_state(state_id: int) -> RemoteLogSegmentState:
    state = RemoteLogSegmentState.for_id(state_id)
    if state is None:
        raise MetadataParseException(f"unknown remote log segment state id {state_id}")
    return state


def _txn_idx_empty(tags: dict[int, bytes]) -> bool:
    data = tags.get(_TAG_TXN_INDEX_EMPTY)
    if data is None:
        return False
    if len(data) != 1:
        raise MetadataParseException(f"TxnIndexEmpty tagged field has {len(data)} bytes, expected 1")
    return data[0] != 0


def _leader_epoch(tags: dict[int, bytes]) -> int:
    data = tags.get(TAG_LEADER_EPOCH)
    if data is None:
        return -1
    if len(data) != 4:
        raise MetadataParseException(f"leader epoch tagged field has {len(data)} bytes, expected 4")
    epoch = _INT32.unpack(data)[0]
    if epoch < 0:
        raise MetadataParseException(f"negative leader epoch {epoch} in a tagged field")
    return epoch


def _read_segment_body(r: _Reader, record: str) -> dict[str, Any]:
    """What records 0 and 3 share after the segment id, as keyword arguments."""
    fields: dict[str, Any] = {
        "start_offset": r.int64("start_offset"),
        "end_offset": r.int64("end_offset"),
        "broker_id": r.int32("broker_id"),
        "max_timestamp_ms": r.int64("max_timestamp_ms"),
        "event_timestamp_ms": r.int64("event_timestamp_ms"),
        "segment_leader_epochs": _read_leader_epochs(r),
        "segment_size_in_bytes": r.int32("segment_size_in_bytes"),
        "custom_metadata": r.compact_nullable_bytes("custom_metadata"),
        "state": _segment_state(r.int8("state")),
    }
    tags = r.tagged_fields(record)
    fields["txn_idx_empty"] = _txn_idx_empty(tags)
    if record == "RemoteLogSegmentMetadataRecord":
        fields["leader_epoch"] = _leader_epoch(tags)
    return fields


def _read_segment_metadata(r: _Reader) -> RemoteLogSegmentMetadata:
    segment_id = _read_segment_id(r)
    return RemoteLogSegmentMetadata(segment_id, **_read_segment_body(r, "RemoteLogSegmentMetadataRecord"))


def _read_segment_update(r: _Reader) -> RemoteLogSegmentMetadataUpdate:
    segment_id = _read_segment_id(r)
    broker_id = r.int32("broker_id")
    event_timestamp_ms = r.int64("event_timestamp_ms")
    custom = r.compact_nullable_bytes("custom_metadata")
    state = _segment_state(r.int8("state"))
    epoch = _leader_epoch(r.tagged_fields("RemoteLogSegmentMetadataUpdateRecord"))
    return RemoteLogSegmentMetadataUpdate(segment_id, event_timestamp_ms, custom, state, broker_id,
                                          leader_epoch=epoch)


def _read_partition_delete(r: _Reader) -> RemotePartitionDeleteMetadata:
    tip = _read_topic_id_partition(r)
    broker_id = r.int32("broker_id")
    event_timestamp_ms = r.int64("event_timestamp_ms")
    state_id = r.int8("state")
    epoch = _leader_epoch(r.tagged_fields("RemotePartitionDeleteMetadataRecord"))
    state = RemotePartitionDeleteState.for_id(state_id)
    if state is None:
        raise MetadataParseException(f"unknown remote partition delete state id {state_id}")
    return RemotePartitionDeleteMetadata(tip, state, event_timestamp_ms, broker_id,
                                         leader_epoch=epoch)


def _read_snapshot(r: _Reader) -> RemoteLogSegmentMetadataSnapshot:
    segment_id = r.uuid("segment id")
    return RemoteLogSegmentMetadataSnapshot(
        segment_id, **_read_segment_body(r, "RemoteLogSegmentMetadataSnapshotRecord"))


_READERS = {
    REMOTE_LOG_SEGMENT_METADATA_API_KEY: _read_segment_metadata,
    REMOTE_LOG_SEGMENT_METADATA_UPDATE_API_KEY: _read_segment_update,
    REMOTE_PARTITION_DELETE_API_KEY: _read_partition_delete,
    REMOTE_LOG_SEGMENT_METADATA_SNAPSHOT_API_KEY: _read_snapshot,
}


def _header_short(r: _Reader, what: str) -> int:
    value = r.uvarint(what)
    if value > _SHORT_MAX:
        raise MetadataParseException(f"Value for {what} was too large.")
    return value


def deserialize(data: bytes | bytearray | memoryview) -> AnyRemoteLogMetadata:
    """Decode a ``__remote_log_metadata`` record value.

    Raises MetadataParseException for an unknown frame version, api key or version, a
    truncated or malformed body, trailing bytes, or values Kafka's constructors reject.
    """
    r = _Reader(bytes(data))
    frame_version = _header_short(r, "frame version")
    if frame_version == 0:
        raise MetadataParseException("Could not deserialize metadata record with frame version 0.")
    if frame_version != FRAME_VERSION:
        raise MetadataParseException(f"Could not deserialize metadata record due to unknown frame version "
                                     f"{frame_version} (only frame version {FRAME_VERSION} is supported)")
    api_key = _header_short(r, "type")
    version = _header_short(r, "version")
    read = _READERS.get(api_key)
    if read is None:
        raise MetadataParseException(f"Unknown metadata record type {api_key}")
    if version not in SUPPORTED_VERSIONS[api_key]:
        raise MetadataParseException(f"Can't read version {version} of metadata record type {api_key}")
    try:
        metadata = read(r)
    except MetadataParseException:
        raise
    except ValueError as exc:  # a value the api types reject (negative start offset, ...)
        raise MetadataParseException(f"Failed to deserialize record with type {api_key}: {exc}") from exc
    if r.remaining:
        raise MetadataParseException(f"Found {r.remaining} byte(s) of garbage after {api_key}")
    return metadata


# --------------------------------------------------------------------------- partitioner

_M32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (the default producer partitioner's hash) as a signed int32."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & _M32
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & _M32
        k ^= k >> 24
        k = (k * m) & _M32
        h = ((h * m) & _M32) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & _M32
    h ^= h >> 13
    h = (h * m) & _M32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _java_long_hash(value: int) -> int:
    # Long.hashCode(v) = (int)(v ^ (v >>> 32)); only the low 32 bits matter.
    u = value & 0xFFFFFFFFFFFFFFFF
    return (u ^ (u >> 32)) & _M32


def metadata_partition(topic_id: uuid.UUID, partition: int, num_partitions: int) -> int:
    """The ``__remote_log_metadata`` partition holding ``(topic_id, partition)``'s metadata.

    ``toPositive(murmur2(int32BE(Objects.hash(lsb, msb, partition)))) % num_partitions``,
    where lsb/msb are the uuid's halves as Java longs and ``Objects.hash`` is
    ``31 * (31 * (31 + h(lsb)) + h(msb)) + partition`` in int32 arithmetic.
    """
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    value = topic_id.int
    h = 1
    for element in (_java_long_hash(value), _java_long_hash(value >> 64), partition & _M32):
        h = (31 * h + element) & _M32
    return (murmur2(h.to_bytes(4, "big")) & 0x7FFFFFFF) % num_partitions


class RemoteLogMetadataTopicPartitioner:
    """Kafka's ``RemoteLogMetadataTopicPartitioner`` for a metadata topic of ``num_partitions``."""

    __slots__ = ("num_metadata_topic_partitions",)

    def __init__(self, num_metadata_topic_partitions: int) -> None:
        if num_metadata_topic_partitions <= 0:
            raise ValueError("the metadata topic needs at least one partition")
        self.num_metadata_topic_partitions = num_metadata_topic_partitions

    def metadata_partition(self, topic_id_partition: TopicIdPartition) -> int:
        return metadata_partition(topic_id_partition.topic_id, topic_id_partition.partition,
                                  self.num_metadata_topic_partitions)


class RemoteLogMetadataSerde:
    """Kafka's ``RemoteLogMetadataSerde``: the module's ``serialize``/``deserialize`` as an object
    (stateless; safe to share between threads)."""

    __slots__ = ()

    @staticmethod
    def serialize(metadata: AnyRemoteLogMetadata) -> bytes:
        return serialize(metadata)

    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview) -> AnyRemoteLogMetadata:
        return deserialize(data)
