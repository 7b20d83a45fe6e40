"""Records of the internal topic ``__consumer_offsets``, byte-compatible with Kafka.

Every record has a key and a value (``None`` for a tombstone), each starting with a big-endian
int16 version. The key version says what the record is (Kafka's group-coordinator schemas
``OffsetCommitKey.json`` / ``GroupMetadataKey.json``; newer Kafka calls it the record's apiKey):

    key 0 or 1   OffsetCommitKey   group string, topic string, partition int32
    key 2        GroupMetadataKey  group string
    key 3, 5-8   a KIP-848 consumer group's records (``ConsumerGroupKey``; see the end of
                 this module)

Keys are never flexible: a string is an int16 length and UTF-8 bytes. Kafka writes offset keys
with version 1 and group keys with version 2; any other key version (share or streams groups'
records, say) is returned as ``UnknownKey`` and a loader skips it.

The value version says its layout (``OffsetCommitValue.json``, ``GroupMetadataValue.json``;
versions 0-3 are non-flexible, 4 is the first flexible one — compact strings, bytes and arrays
as unsigned varints of length + 1, and an empty tagged-field section after every struct):

    OffsetCommitValue   v0 offset i64, metadata string, commitTimestamp i64
                        v1 ... + expireTimestamp i64 (only when the commit carried a retention)
                        v2 as v0
                        v3 offset i64, leaderEpoch i32, metadata string, commitTimestamp i64
                        v4 as v3, flexible
    GroupMetadataValue  protocolType string, generation i32, protocol string?, leader string?,
                        currentStateTimestamp i64 (v2+), members [MemberMetadata]
    MemberMetadata      memberId string, groupInstanceId string? (v3+), clientId string,
                        clientHost string, rebalanceTimeout i32 (v1+), sessionTimeout i32,
                        subscription bytes, assignment bytes

Kafka 2.3+ writes OffsetCommitValue v3 (v1 when an expire timestamp is set) and
GroupMetadataValue v3, the highest non-flexible versions; so do we by default.

The partition of ``__consumer_offsets`` that holds a group is
``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`` (``partition_for``).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Union

OFFSETS_TOPIC = "__consumer_offsets"
DEFAULT_OFFSETS_TOPIC_PARTITIONS = 50

OFFSET_COMMIT_KEY_VERSION = 1          # what Kafka writes (0 is read too)
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3        # default when no expire timestamp
OFFSET_COMMIT_VALUE_VERSION_EXPIRE = 1  # the only version with expireTimestamp
GROUP_METADATA_VALUE_VERSION = 3
MAX_OFFSET_COMMIT_VALUE_VERSION = 4
MAX_GROUP_METADATA_VALUE_VERSION = 4
FIRST_FLEXIBLE_VALUE_VERSION = 4

NO_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# --------------------------------------------------------------------------- partitioning

@functools.lru_cache(maxsize=65536)   # group and transactional ids recur on every request
def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode``: ``h = 31*h + c`` over UTF-16 code units, in int32 arithmetic."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_utils_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: ``Math.abs`` except that Integer.MIN_VALUE gives 0, not itself."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for(group_id: str, num_partitions: int = DEFAULT_OFFSETS_TOPIC_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition that stores ``group_id`` (as Kafka computes it)."""
    return java_utils_abs(java_string_hashcode(group_id)) % num_partitions


# --------------------------------------------------------------------------- record types

@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int
    version: int = OFFSET_COMMIT_KEY_VERSION


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str
    version: int = GROUP_METADATA_KEY_VERSION


@dataclass(frozen=True)
class UnknownKey:
    """A key version this broker does not know; loaders skip such records, as Kafka does."""

    version: int


RecordKey = Union[OffsetCommitKey, GroupMetadataKey, "ConsumerGroupKey", UnknownKey]


@dataclass(frozen=True)
class OffsetCommitValue:
    offset: int
    metadata: str = ""
    commit_timestamp: int = NO_TIMESTAMP
    leader_epoch: int = NO_LEADER_EPOCH
    expire_timestamp: int = NO_TIMESTAMP  # only stored by value version 1


@dataclass(frozen=True)
class MemberMetadataValue:
    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    rebalance_timeout: int
    subscription: bytes
    assignment: bytes
    group_instance_id: str | None = None


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = NO_TIMESTAMP
    members: tuple[MemberMetadataValue, ...] = field(default_factory=tuple)


class RecordFormatError(ValueError):
    """A ``__consumer_offsets`` key or value that cannot be decoded."""


# --------------------------------------------------------------------------- primitive writers

class _Writer:
    __slots__ = ("buf", "flexible")

    def __init__(self, flexible: bool = False):
        self.buf = bytearray()
        self.flexible = flexible

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def uvarint(self, v: int) -> None:
        while v & ~0x7F:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)

    def string(self, s: str | None, nullable: bool = False) -> None:
        if s is None:
            if not nullable:
                raise RecordFormatError("null value for a non-nullable string field")
            if self.flexible:
                self.uvarint(0)
            else:
                self.int16(-1)
            return
        data = s.encode("utf-8")
        if self.flexible:
            self.uvarint(len(data) + 1)
        else:
            if len(data) > 0x7FFF:
                raise RecordFormatError(f"string of {len(data)} bytes is longer than 32767")
            self.int16(len(data))
        self.buf += data

    def bytes_(self, b: bytes) -> None:
        if self.flexible:
            self.uvarint(len(b) + 1)
        else:
            self.int32(len(b))
        self.buf += b

    def array_len(self, n: int) -> None:
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.int32(n)

    def tagged_fields(self) -> None:
        if self.flexible:
            self.uvarint(0)


class _Reader:
    __slots__ = ("buf", "pos", "flexible")

    def __init__(self, buf: bytes, flexible: bool = False, pos: int = 0):
        self.buf = memoryview(buf)
        self.pos = pos
        self.flexible = flexible

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError(f"truncated record: need {n} bytes at {self.pos} of {len(self.buf)}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint is too long")

    def string(self, nullable: bool = False) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            if not nullable:
                raise RecordFormatError("null in a non-nullable string field")
            return None
        return bytes(self._take(n)).decode("utf-8")

    def bytes_(self) -> bytes:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise RecordFormatError("null in a non-nullable bytes field")
        return bytes(self._take(n))

    def array_len(self) -> int:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise RecordFormatError("null in a non-nullable array field")
        return n

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()          # tag
                self._take(self.uvarint())  # skip unknown tagged data


# --------------------------------------------------------------------------- keys

def encode_offset_commit_key(group: str, topic: str, partition: int,
                             version: int = OFFSET_COMMIT_KEY_VERSION) -> bytes:
    if version not in (0, 1):
        raise RecordFormatError(f"OffsetCommitKey version {version} is not 0 or 1")
    w = _Writer()
    w.int16(version)
    w.string(group)
    w.string(topic)
    w.int32(partition)
    return bytes(w.buf)


def encode_group_metadata_key(group: str) -> bytes:
    w = _Writer()
    w.int16(GROUP_METADATA_KEY_VERSION)
    w.string(group)
    return bytes(w.buf)


def encode_key(key: OffsetCommitKey | GroupMetadataKey) -> bytes:
    if isinstance(key, OffsetCommitKey):
        return encode_offset_commit_key(key.group, key.topic, key.partition, key.version)
    if isinstance(key, GroupMetadataKey):
        return encode_group_metadata_key(key.group)
    raise TypeError(f"cannot encode {key!r}")


def decode_key(data: bytes) -> RecordKey:
    if data is None:
        raise RecordFormatError("a __consumer_offsets record must have a key")
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        group = r.string()
        topic = r.string()
        partition = r.int32()
        return OffsetCommitKey(group, topic, partition, version)
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(r.string(), version)
    if version in _MEMBER_KINDS or version in _GROUP_KINDS:
        return _decode_consumer_group_key(version, r)
    return UnknownKey(version)


# --------------------------------------------------------------------------- values

def encode_offset_commit_value(value: OffsetCommitValue, version: int | None = None) -> bytes:
    """Kafka's choice when ``version`` is None: 1 if an expire timestamp is set, else 3."""
    if version is None:
        version = (OFFSET_COMMIT_VALUE_VERSION_EXPIRE if value.expire_timestamp != NO_TIMESTAMP
                   else OFFSET_COMMIT_VALUE_VERSION)
    if not 0 <= version <= MAX_OFFSET_COMMIT_VALUE_VERSION:
        raise RecordFormatError(f"OffsetCommitValue version {version} is not 0-4")
    w = _Writer(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    w.int16(version)
    w.int64(value.offset)
    if version >= 3:
        w.int32(value.leader_epoch)
    w.string(value.metadata if value.metadata is not None else "")
    w.int64(value.commit_timestamp)
    if version == 1:
        w.int64(value.expire_timestamp)
    w.tagged_fields()
    return bytes(w.buf)


def decode_offset_commit_value(data: bytes | None) -> OffsetCommitValue | None:
    """``None`` (a tombstone) decodes to ``None``."""
    if data is None:
        return None
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= MAX_OFFSET_COMMIT_VALUE_VERSION:
        raise RecordFormatError(f"unknown OffsetCommitValue version {version}")
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else NO_LEADER_EPOCH
    metadata = r.string()
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else NO_TIMESTAMP
    r.tagged_fields()
    return OffsetCommitValue(offset=offset, metadata=metadata, commit_timestamp=commit_timestamp,
                             leader_epoch=leader_epoch, expire_timestamp=expire_timestamp)


def encode_group_metadata_value(value: GroupMetadataValue,
                                version: int = GROUP_METADATA_VALUE_VERSION) -> bytes:
    if not 0 <= version <= MAX_GROUP_METADATA_VALUE_VERSION:
        raise RecordFormatError(f"GroupMetadataValue version {version} is not 0-4")
    w = _Writer(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    w.int16(version)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol, nullable=True)
    w.string(value.leader, nullable=True)
    if version >= 2:
        w.int64(value.current_state_timestamp)
    w.array_len(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        if version >= 3:
            w.string(m.group_instance_id, nullable=True)
        w.string(m.client_id)
        w.string(m.client_host)
        if version >= 1:
            w.int32(m.rebalance_timeout)
        w.int32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
        w.tagged_fields()
    w.tagged_fields()
    return bytes(w.buf)


def decode_group_metadata_value(data: bytes | None) -> GroupMetadataValue | None:
    """``None`` (a tombstone) decodes to ``None``. Version 0 has no rebalance timeout: like
    Kafka, the session timeout stands in for it."""
    if data is None:
        return None
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= MAX_GROUP_METADATA_VALUE_VERSION:
        raise RecordFormatError(f"unknown GroupMetadataValue version {version}")
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.string(nullable=True)
    leader = r.string(nullable=True)
    current_state_timestamp = r.int64() if version >= 2 else NO_TIMESTAMP
    members = []
    for _ in range(r.array_len()):
        member_id = r.string()
        group_instance_id = r.string(nullable=True) if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else None
        session_timeout = r.int32()
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.tagged_fields()
        members.append(MemberMetadataValue(
            member_id=member_id, client_id=client_id, client_host=client_host,
            session_timeout=session_timeout,
            rebalance_timeout=session_timeout if rebalance_timeout is None else rebalance_timeout,
            subscription=subscription, assignment=assignment,
            group_instance_id=group_instance_id))
    r.tagged_fields()
    return GroupMetadataValue(protocol_type=protocol_type, generation=generation,
                              protocol=protocol, leader=leader,
                              current_state_timestamp=current_state_timestamp,
                              members=tuple(members))


# --------------------------------------------------------------------------- whole records

def offset_commit_record(group: str, topic: str, partition: int,
                         value: OffsetCommitValue | None) -> tuple[bytes, bytes | None]:
    """The (key, value) pair of an offset commit; ``value=None`` makes its tombstone."""
    return (encode_offset_commit_key(group, topic, partition),
            None if value is None else encode_offset_commit_value(value))


def group_metadata_record(group: str, value: GroupMetadataValue | None) -> tuple[bytes, bytes | None]:
    """The (key, value) pair of a group's metadata; ``value=None`` makes its tombstone."""
    return (encode_group_metadata_key(group),
            None if value is None else encode_group_metadata_value(value))


def decode_record(key: bytes, value: bytes | None):
    """Decode one record: ``(OffsetCommitKey, OffsetCommitValue | None)``,
    ``(GroupMetadataKey, GroupMetadataValue | None)`` or ``(UnknownKey, None)``."""
    k = decode_key(key)
    if isinstance(k, OffsetCommitKey):
        return k, decode_offset_commit_value(value)
    if isinstance(k, GroupMetadataKey):
        return k, decode_group_metadata_value(value)
    if isinstance(k, ConsumerGroupKey):
        return k, decode_consumer_group_value(k.kind, value)
    return k, None


# --------------------------------------------------------------------------- consumer protocol

def consumer_subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ``consumer`` protocol Subscription, read with its v0 prefix (version
    int16, topics [string]) as Kafka does; ``None`` if the bytes do not parse."""
    try:
        r = _Reader(metadata)
        version = r.int16()
        if version < 0:
            return None
        return {r.string() for _ in range(r.array_len())}
    except (RecordFormatError, UnicodeDecodeError, struct.error):
        return None


# --------------------------------------------------------------------------- consumer groups
# KIP-848 consumer groups (Kafka 4's ConsumerGroup*Key/Value.json). The key's version is the
# record type; keys are non-flexible, values are flexible version 0 (tagged fields skipped on
# read, none written). ConsumerGroupPartitionMetadata (4) and RegularExpression (16) are
# decoded as UnknownKey: this coordinator recomputes both from the topic image.

CONSUMER_GROUP_METADATA_KEY = 3
CONSUMER_GROUP_MEMBER_METADATA_KEY = 5
CONSUMER_GROUP_TARGET_METADATA_KEY = 6
CONSUMER_GROUP_TARGET_MEMBER_KEY = 7
CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY = 8

# topic id -> partitions, as the records carry them
TopicAssignment = dict  # dict[uuid.UUID, frozenset[int]]


@dataclass(frozen=True)
class ConsumerGroupKey:
    """A consumer group record's key: ``kind`` is the record type (3, 5, 6, 7 or 8);
    ``member_id`` is set for the member-level ones (5, 7, 8)."""

    kind: int
    group: str
    member_id: str | None = None

    @property
    def version(self) -> int:
        return self.kind


@dataclass(frozen=True)
class ConsumerGroupMetadataValue:
    epoch: int


@dataclass(frozen=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    # a member using the classic protocol in a consumer group (tagged field 0), else None
    classic: "ClassicMemberMetadata | None" = None


@dataclass(frozen=True)
class ClassicMemberMetadata:
    """Kafka's ConsumerGroupMemberMetadataValue.ClassicMemberMetadata: the JoinGroup session
    timeout and protocols (name, metadata) of a classic member of a consumer group."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class ConsumerGroupTargetMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True)
class ConsumerGroupTargetMemberValue:
    partitions: TopicAssignment


@dataclass(frozen=True)
class ConsumerGroupCurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: TopicAssignment
    pending_revocation: TopicAssignment


_MEMBER_KINDS = (CONSUMER_GROUP_MEMBER_METADATA_KEY, CONSUMER_GROUP_TARGET_MEMBER_KEY,
                 CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY)
_GROUP_KINDS = (CONSUMER_GROUP_METADATA_KEY, CONSUMER_GROUP_TARGET_METADATA_KEY)


def encode_consumer_group_key(key: ConsumerGroupKey) -> bytes:
    w = _Writer()
    w.int16(key.kind)
    w.string(key.group)
    if key.kind in _MEMBER_KINDS:
        w.string(key.member_id)
    return bytes(w.buf)


def _decode_consumer_group_key(kind: int, r: _Reader) -> ConsumerGroupKey:
    group = r.string()
    member = r.string() if kind in _MEMBER_KINDS else None
    return ConsumerGroupKey(kind, group, member)


def _write_uuid(w: _Writer, u) -> None:
    w.buf += u.bytes


def _read_uuid(r: _Reader):
    import uuid as _uuid
    return _uuid.UUID(bytes=bytes(r._take(16)))


def _write_assignment(w: _Writer, assignment: TopicAssignment) -> None:
    w.array_len(len(assignment))
    for topic_id in sorted(assignment, key=lambda u: u.bytes):
        _write_uuid(w, topic_id)
        parts = sorted(assignment[topic_id])
        w.array_len(len(parts))
        for p in parts:
            w.int32(p)
        w.tagged_fields()


def _read_assignment(r: _Reader) -> TopicAssignment:
    out = {}
    for _ in range(r.array_len()):
        topic_id = _read_uuid(r)
        out[topic_id] = frozenset(r.int32() for _ in range(r.array_len()))
        r.tagged_fields()
    return out


def encode_consumer_group_value(kind: int, value) -> bytes:
    w = _Writer(flexible=True)
    w.int16(0)
    if kind == CONSUMER_GROUP_METADATA_KEY:
        w.int32(value.epoch)
    elif kind == CONSUMER_GROUP_MEMBER_METADATA_KEY:
        w.string(value.instance_id, nullable=True)
        w.string(value.rack_id, nullable=True)
        w.string(value.client_id)
        w.string(value.client_host)
        w.array_len(len(value.subscribed_topic_names))
        for name in value.subscribed_topic_names:
            w.string(name)
        w.string(value.subscribed_topic_regex, nullable=True)
        w.int32(value.rebalance_timeout_ms)
        w.string(value.server_assignor, nullable=True)
        if value.classic is not None:
            c = _Writer(flexible=True)
            c.int32(value.classic.session_timeout_ms)
            c.array_len(len(value.classic.protocols))
            for name, metadata in value.classic.protocols:
                c.string(name)
                c.bytes_(metadata)
                c.tagged_fields()
            c.tagged_fields()
            w.uvarint(1)          # one tagged field: tag 0, its size, its bytes
            w.uvarint(0)
            w.uvarint(len(c.buf))
            w.buf += c.buf
            return bytes(w.buf)
    elif kind == CONSUMER_GROUP_TARGET_METADATA_KEY:
        w.int32(value.assignment_epoch)
    elif kind == CONSUMER_GROUP_TARGET_MEMBER_KEY:
        _write_assignment(w, value.partitions)
    elif kind == CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY:
        w.int32(value.member_epoch)
        w.int32(value.previous_member_epoch)
        w.buf += struct.pack(">b", value.state)
        _write_assignment(w, value.assigned)
        _write_assignment(w, value.pending_revocation)
    else:
        raise RecordFormatError(f"no consumer group record of type {kind}")
    w.tagged_fields()
    return bytes(w.buf)


def decode_consumer_group_value(kind: int, data: bytes | None):
    """``None`` (a tombstone) decodes to ``None``."""
    if data is None:
        return None
    r = _Reader(data, flexible=True)
    version = r.int16()
    if version != 0:
        raise RecordFormatError(f"unknown value version {version} of record type {kind}")
    if kind == CONSUMER_GROUP_METADATA_KEY:
        value = ConsumerGroupMetadataValue(r.int32())
    elif kind == CONSUMER_GROUP_MEMBER_METADATA_KEY:
        instance_id = r.string(nullable=True)
        rack_id = r.string(nullable=True)
        client_id = r.string()
        client_host = r.string()
        names = tuple(r.string() for _ in range(r.array_len()))
        regex = r.string(nullable=True)
        timeout = r.int32()
        assignor = r.string(nullable=True)
        classic = None
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            data = bytes(r._take(r.uvarint()))
            if tag == 0:
                c = _Reader(data, flexible=True)
                session = c.int32()
                protocols = []
                for _ in range(c.array_len()):
                    name = c.string()
                    protocols.append((name, c.bytes_()))
                    c.tagged_fields()
                classic = ClassicMemberMetadata(session, tuple(protocols))
        return ConsumerGroupMemberMetadataValue(instance_id, rack_id, client_id, client_host,
                                                names, regex, timeout, assignor, classic)
    elif kind == CONSUMER_GROUP_TARGET_METADATA_KEY:
        value = ConsumerGroupTargetMetadataValue(r.int32())
    elif kind == CONSUMER_GROUP_TARGET_MEMBER_KEY:
        value = ConsumerGroupTargetMemberValue(_read_assignment(r))
    elif kind == CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY:
        member_epoch = r.int32()
        previous = r.int32()
        state = struct.unpack(">b", r._take(1))[0]
        value = ConsumerGroupCurrentAssignmentValue(member_epoch, previous, state,
                                                    _read_assignment(r), _read_assignment(r))
    else:
        raise RecordFormatError(f"no consumer group record of type {kind}")
    r.tagged_fields()
    return value


def consumer_group_record(key: ConsumerGroupKey, value) -> tuple[bytes, bytes | None]:
    """The (key, value) pair of a consumer group record; ``value=None`` makes its tombstone."""
    return (encode_consumer_group_key(key),
            None if value is None else encode_consumer_group_value(key.kind, value))


def encode_consumer_protocol_subscription(topics: list[str]) -> bytes:
    """A consumer protocol Subscription v0 (topics, null user data), as DescribeGroups shows a
    consumer group's member."""
    w = _Writer()
    w.int16(0)
    w.array_len(len(topics))
    for t in topics:
        w.string(t)
    w.int32(-1)
    return bytes(w.buf)


def encode_consumer_protocol_assignment(partitions: dict[str, list[int]]) -> bytes:
    """A consumer protocol Assignment v0 (topic partitions, null user data)."""
    w = _Writer()
    w.int16(0)
    w.array_len(len(partitions))
    for topic in sorted(partitions):
        w.string(topic)
        w.array_len(len(partitions[topic]))
        for p in partitions[topic]:
            w.int32(p)
    w.int32(-1)
    return bytes(w.buf)


@dataclass(frozen=True)
class ConsumerProtocolSubscription:
    """A ``consumer`` protocol Subscription v0-3 as a classic member sends it."""

    version: int
    topics: tuple[str, ...]
    owned: tuple[tuple[str, tuple[int, ...]], ...]   # v1+
    rack_id: str | None                               # v3+


def decode_consumer_protocol_subscription(metadata: bytes) -> ConsumerProtocolSubscription:
    """RecordFormatError if the bytes do not parse (fields of newer versions are ignored)."""
    try:
        r = _Reader(metadata)
        version = r.int16()
        if version < 0:
            raise RecordFormatError(f"consumer protocol subscription version {version}")
        topics = tuple(r.string() for _ in range(r.array_len()))
        n = r.int32()                      # user data
        if n > 0:
            r._take(n)
        owned: list[tuple[str, tuple[int, ...]]] = []
        rack = None
        if version >= 1:
            for _ in range(r.array_len()):
                topic = r.string()
                owned.append((topic, tuple(r.int32() for _ in range(r.array_len()))))
        if version >= 2:
            r.int32()                      # generation id
        if version >= 3:
            rack = r.string(nullable=True)
        return ConsumerProtocolSubscription(version, topics, tuple(owned), rack)
    except (UnicodeDecodeError, struct.error) as e:
        raise RecordFormatError(str(e)) from None


def encode_consumer_protocol_assignment_v(partitions: dict[str, list[int]], version: int) -> bytes:
    """A consumer protocol Assignment of ``version`` (v0-3 share one layout)."""
    body = encode_consumer_protocol_assignment(partitions)
    return struct.pack(">h", max(0, min(version, 3))) + body[2:]


def decode_consumer_protocol_assignment(data: bytes) -> dict[str, tuple[int, ...]]:
    """The partitions of a consumer protocol Assignment (empty bytes: none); RecordFormatError
    if they do not parse."""
    if not data:
        return {}
    try:
        r = _Reader(data)
        if r.int16() < 0:
            raise RecordFormatError("negative consumer protocol assignment version")
        out: dict[str, tuple[int, ...]] = {}
        for _ in range(r.array_len()):
            topic = r.string()
            out[topic] = tuple(r.int32() for _ in range(r.array_len()))
        return out
    except (UnicodeDecodeError, struct.error) as e:
        raise RecordFormatError(str(e)) from None
