"""Kafka request/response framing on top of ``kio``: bytes in, objects out (sans-I/O).

The broker reads a 4-byte length-prefixed frame, hands the frame (without the prefix) to
``parse_request``, dispatches on ``(api_key, api_version)`` and turns the handler's kio response
object back into bytes with ``encode_response`` (or ``encode_response_parts`` for ``writelines``).
Fetch responses, the hot path, are written by ``fetch_wire`` instead of kio's writer.

What we learned about kio (0.6.5; schemas generated from a recent Kafka 4.x's message JSON)
-------------------------------------------------------------------------------------------
* Lookup: ``kio.index.load_request_schema(api_key, version)`` / ``load_response_schema`` return
  the generated frozen, slotted dataclass (one module per version: ``kio.schema.<api>.vN.request``);
  they raise ``UnknownAPIKey`` / ``UnknownEntity`` (``KioIndexError``, a ``RuntimeError``). The raw
  tables are ``kio.schema.index.api_key_map`` (key -> name) and ``schema_name_map``
  (name -> version -> entity type -> dotted path), which we use to learn kio's version ranges
  without importing every module. Classes carry ``__api_key__``, ``__version__``, ``__flexible__``
  and ``__header_schema__``: the request header class (v1 for non-flexible, v2 for flexible
  versions) or response header class (v0/v1; kio already special-cases ApiVersions responses to v0).
  kio has no request header v0 (only ControlledShutdown v0 used it; removed in Kafka 4).
* kio's ranges follow Kafka 4.x, i.e. KIP-896 removals: Produce starts at v3 (Kafka still
  *advertises* Produce 0 because librdkafka disables compression otherwise -- KAFKA-18659 -- and
  answers v0-2 with UNSUPPORTED_VERSION), Fetch at v4, ListOffsets at v1, OffsetCommit at v2, ...
* Serialization: ``kio.serial.entity_reader(cls)`` returns a native (Rust/pyo3) callable
  ``reader(buffer, offset) -> (obj, consumed)`` accepting any buffer (bytes, bytearray,
  memoryview). ``kio.serial.entity_writer(cls)`` returns a pure-Python ``writer(io, obj)`` that
  calls ``io.write(chunk)`` many times (tiny struct.pack chunks; a flexible entity first writes its
  tagged fields to a temporary BytesIO). Fields follow dataclass order; field metadata holds
  ``kafka_type`` and, for tagged fields, ``tag``. Defaults from the JSON schemas are dataclass
  defaults (e.g. ``log_start_offset=-1``); error codes are ``kio.schema.errors.ErrorCode`` (the
  writer calls ``.value``, so any IntEnum, e.g. ``strata.common.errors.ErrorCode``, also works).
  Timeouts are ``datetime.timedelta`` (``i32Timedelta``), some timestamps tz-aware ``datetime``.
* Tagged fields: the writer omits a tag whose value equals its default. The reader knows every tag
  in its schema but raises ``KeyError`` on an *unknown* tag although the protocol says receivers
  must ignore them -- ``parse_request`` strips unknown tags before kio sees them (see below).
  kio ignores a tag's declared size and reads the field by its schema.
* Nulls: kio refuses a null for a non-nullable string or bytes field, but reads a null array
  (length -1, compact 0) as None even where the schema does not allow it -- handlers would
  then iterate None. The pre-scan refuses those, as Kafka's generated readers do.
* Records (``kafka_type == "records"``, type ``Records``, a ``bytes`` subclass, nullable): decoding
  copies the records into a new plain ``bytes`` object (one memcpy, ~same cost as
  ``bytes(memoryview)``); nothing in the decoded request references the frame buffer, so the
  caller may reuse it. The native reader refuses *writable* buffers (bytearray, or a memoryview
  of one) with ValueError; ``parse_request`` passes such frames as ``memoryview.toreadonly()``.
  Encoding is zero-copy: the writer passes the records object itself to ``io.write``, so a sink
  that keeps large chunks by reference (``_Sink``) never copies them, and a ``memoryview`` (e.g.
  over a segment file) works too since kio only calls ``len()`` on it.
* Cost: ``parse_request``'s time is mostly kio's copy of the records; ``encode_response_parts``
  copies nothing, ``encode_response`` joins the parts once. Per-element work (partitions,
  topics), not payload size, is what a large request costs (figures: docs/benchmarks.md, "The
  wire codec over kio").
* Hazard found: kio's native array reader pre-allocates ``Vec::with_capacity(count)`` from the
  wire count before reading elements. A 5-byte compact array length (~2**35) makes it allocate
  ~256 GiB and Rust aborts the whole process (no Python exception). ``parse_request`` therefore
  pre-scans every frame with a schema-driven bounds checker (``_entity_skimmer``, generated
  Python per request class) that rejects any array whose count cannot fit in the remaining
  bytes before kio runs, and checks afterwards that kio consumed exactly what the pre-scan did.

Error handling: anything unparseable raises ``MalformedRequest`` (close the connection); a header
that parses but names an API/version we do not serve raises ``UnsupportedVersion``. For
ApiVersions the broker answers with ``encode_api_versions_fallback(correlation_id)`` instead.
Like Kafka, bytes after the end of the request body are ignored.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
import uuid
from enum import Enum, IntEnum
from functools import lru_cache
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map as _KIO_API_NAMES
from kio.schema.index import schema_name_map as _KIO_SCHEMAS
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol import produce_wire
from strata.protocol.file_region import FileRegion
from strata.protocol.fetch_wire import fetch_response_writable, write_fetch_response
from strata.protocol.wire import Malformed, encode_uvarint, skip_tags, uvarint

__all__ = [
    "API_VERSIONS",
    "ApiKey",
    "DecodedRequest",
    "MalformedRequest",
    "RequestFrame",
    "UnsupportedReason",
    "UnsupportedVersion",
    "api_versions_response",
    "encode_api_versions_fallback",
    "encode_response",
    "encode_response_parts",
    "error_response",
    "kio_error_code",
    "kio_versions",
    "parse_request",
    "request_class",
    "response_class",
]


class ApiKey(IntEnum):
    """Kafka's API keys (org.apache.kafka.common.protocol.ApiKeys), by number."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    CREATE_DELEGATION_TOKEN = 38
    RENEW_DELEGATION_TOKEN = 39
    EXPIRE_DELEGATION_TOKEN = 40
    DESCRIBE_DELEGATION_TOKEN = 41
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    UPDATE_FEATURES = 57
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    CONTROLLER_REGISTRATION = 70
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    ASSIGN_REPLICAS_TO_DIRS = 73
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    ADD_RAFT_VOTER = 80
    REMOVE_RAFT_VOTER = 81
    UPDATE_RAFT_VOTER = 82
    INITIALIZE_SHARE_GROUP_STATE = 83
    READ_SHARE_GROUP_STATE = 84
    WRITE_SHARE_GROUP_STATE = 85
    DELETE_SHARE_GROUP_STATE = 86
    READ_SHARE_GROUP_STATE_SUMMARY = 87
    STREAMS_GROUP_HEARTBEAT = 88
    STREAMS_GROUP_DESCRIBE = 89
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


# What Strata advertises in ApiVersions: api key -> (min, max). Produce 0-2 are advertised but
# not decodable (kio, like Kafka 4, starts at v3): Kafka 4 does the same so that librdkafka keeps
# compression enabled (KAFKA-18659); parse_request raises UnsupportedVersion for them.
API_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 12),                # v12: transactions V2 (KIP-890 part 2)
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 11),
    ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (2, 9),       # v9: KIP-848 member epochs (v10, topic ids: not yet)
    ApiKey.OFFSET_FETCH: (1, 9),        # v8: batched groups; v9: KIP-848 member epochs
    ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.LIST_GROUPS: (0, 5),  # Kafka 4.x: 0-5 (v5 adds TypesFilter, KIP-848)
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),    # KIP-848 consumer groups
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),   # v4+: broker-to-coordinator verification (KIP-890)
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),                 # v5: transactions V2 (KIP-890 part 2)
    ApiKey.WRITE_TXN_MARKERS: (1, 2),       # v2: the marker's transaction version
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.UPDATE_FEATURES: (0, 2),         # transaction.version (strata.cluster.features)
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0),
    ApiKey.PUSH_TELEMETRY: (0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 5),       # v5: IsCordoned (KIP-1066)
    ApiKey.ALTER_PARTITION: (2, 3),  # broker to controller; errors are top-level only
    ApiKey.CREATE_DELEGATION_TOKEN: (1, 3),     # Kafka 4 dropped v0 of the four (KIP-896)
    ApiKey.RENEW_DELEGATION_TOKEN: (1, 2),
    ApiKey.EXPIRE_DELEGATION_TOKEN: (1, 2),
    ApiKey.DESCRIBE_DELEGATION_TOKEN: (1, 3),
}


# --------------------------------------------------------------------------------------------
# errors


class UnsupportedReason(Enum):
    UNKNOWN_API_KEY = "unknown api key"  # not a Kafka API key at all
    API_NOT_SUPPORTED = "api not supported"  # a Kafka API Strata does not serve
    VERSION_NOT_SUPPORTED = "version not supported"  # outside the advertised range
    VERSION_NOT_DECODABLE = "version not decodable"  # advertised, but kio has no schema (Produce 0-2)


class MalformedRequest(KafkaError):
    """The frame cannot be parsed (truncated, garbage, inconsistent): close the connection."""

    code = ErrorCode.INVALID_REQUEST


class UnsupportedVersion(KafkaError):
    """The request header parsed, but Strata cannot serve this api key/version.

    For ApiVersions, answer with ``encode_api_versions_fallback(correlation_id)``; for anything
    else Kafka closes the connection (it cannot build a response without decoding the body).
    """

    code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, api_key: int, api_version: int, correlation_id: int,
                 reason: UnsupportedReason = UnsupportedReason.VERSION_NOT_SUPPORTED):
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.reason = reason
        try:
            name = ApiKey(api_key).name
        except ValueError:
            name = "?"
        super().__init__(f"{reason.value}: api key {api_key} ({name}) version {api_version}")


# --------------------------------------------------------------------------------------------
# schema lookup


def kio_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) request versions kio can decode for ``api_key``, or None."""
    return _kio_ranges().get(api_key)


@lru_cache(maxsize=None)
def _kio_ranges() -> dict[int, tuple[int, int]]:
    ranges = {}
    for key, name in _KIO_API_NAMES.items():
        versions = [v for v, kinds in _KIO_SCHEMAS[name].items() if EntityType.request in kinds]
        if versions:
            ranges[key] = (min(versions), max(versions))
    return ranges


@lru_cache(maxsize=None)
def request_class(api_key: int, api_version: int) -> type:
    """kio's request dataclass for (api_key, version); ``LookupError`` if kio has none."""
    try:
        return load_request_schema(api_key, api_version)
    except RuntimeError as e:  # kio.index.KioIndexError
        raise LookupError(f"no request schema for api key {api_key} v{api_version}") from e


@lru_cache(maxsize=None)
def response_class(api_key: int, api_version: int) -> type:
    """kio's response dataclass for (api_key, version); ``LookupError`` if kio has none."""
    try:
        return load_response_schema(api_key, api_version)
    except RuntimeError as e:
        raise LookupError(f"no response schema for api key {api_key} v{api_version}") from e


@lru_cache(maxsize=256)
def kio_error_code(code: int) -> Any:
    """``code`` as kio's ErrorCode member (what kio's reader produces); Strata's if kio lacks it."""
    try:
        return KioErrorCode(int(code))
    except ValueError:
        return ErrorCode(int(code))


# --------------------------------------------------------------------------------------------
# pre-scan: a schema-driven bounds check run before kio's native reader
#
# A skimmer is ``skim(buf, pos, end, edits) -> new_pos``. It walks exactly what kio's reader
# will read, raising Malformed if something does not fit in [pos, end) -- above all array
# counts, which kio trusts for its pre-allocation. Unknown tagged fields (which kio rejects) are
# recorded in ``edits`` as (start, end, replacement) byte ranges so a cleaned copy can be parsed.

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")

_FIXED_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}

Skim = Callable[[Any, int, int, list], int]


def _apply_edits(buf, start: int, end: int, edits: list) -> bytes:
    out = bytearray()
    cur = start
    for s, e, replacement in sorted(edits, key=lambda edit: edit[0]):
        out += buf[cur:s]
        out += replacement
        cur = e
    out += buf[cur:end]
    return bytes(out)


def _unwrap_optional(tp) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def _classify(f: dataclasses.Field, tagged: bool) -> tuple[str, Any, bool]:
    """("array" | "entity" | "primitive", element/entity type or kafka_type, nullable)."""
    tp, optional = _unwrap_optional(f.type)
    if tagged:
        optional = False  # kio never writes a nullable marker for a tagged field
    if typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        return "array", elem if dataclasses.is_dataclass(elem) else f.metadata["kafka_type"], optional
    if dataclasses.is_dataclass(tp):
        return "entity", tp, optional
    return "primitive", f.metadata["kafka_type"], optional


class _SkimGen:
    """Generates straight-line Python for a skimmer (calls per field would cost ~3x more)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {
            "M": Malformed, "uvarint": uvarint, "_skim_tags": _skim_tags,
            "_h": _I16.unpack_from, "_i": _I32.unpack_from,
        }
        self.counter = 0

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, value: Any) -> str:
        name = self.name("K")
        self.env[name] = value
        return name

    def compact_length(self, ind: int, var: str) -> None:
        self.emit(ind, "if pos >= end: raise M('truncated')")
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, f"if {var} < 0x80: pos += 1")
        self.emit(ind, f"else: {var}, pos = uvarint(buf, pos, end)")

    def primitive(self, ind: int, kafka_type: str, flexible: bool) -> None:
        if kafka_type == "string" and not flexible:
            self.emit(ind, "if pos + 2 > end: raise M('truncated string length')")
            self.emit(ind, "n = _h(buf, pos)[0]; pos += 2")
            self.emit(ind, "if n > 0: pos += n")
            self.emit(ind, "elif n < -1: raise M('negative string length')")
        elif kafka_type in ("bytes", "records") and not flexible:
            self.emit(ind, "if pos + 4 > end: raise M('truncated bytes length')")
            self.emit(ind, "n = _i(buf, pos)[0]; pos += 4")
            self.emit(ind, "if n > 0: pos += n")
            self.emit(ind, "elif n < -1: raise M('negative bytes length')")
        elif kafka_type in ("string", "bytes", "records"):
            self.compact_length(ind, "n")
            self.emit(ind, "if n: pos += n - 1")
        else:
            raise TypeError(f"unsupported kafka_type {kafka_type!r}")
        self.emit(ind, "if pos > end: raise M('string/bytes longer than frame')")

    def field(self, ind: int, f: dataclasses.Field, flexible: bool, tagged: bool) -> None:
        kind, what, nullable = _classify(f, tagged)
        if kind == "entity":
            self.entity(ind, what, nullable)
        elif kind == "primitive":
            self.primitive(ind, what, flexible)
        else:
            self.array(ind, what, flexible, nullable or tagged)

    def array(self, ind: int, elem: Any, flexible: bool, nullable: bool) -> None:
        count = self.name("c")
        if flexible:
            self.compact_length(ind, count)
            self.emit(ind, f"{count} -= 1")
        else:
            self.emit(ind, "if pos + 4 > end: raise M('truncated array length')")
            self.emit(ind, f"{count} = _i(buf, pos)[0]; pos += 4")
            self.emit(ind, f"if {count} < -1: raise M('negative array length')")
        if not nullable:
            # kio reads a null array as None whatever the schema says; Kafka refuses it
            # ("non-nullable field ... was serialized as null").
            self.emit(ind, f"if {count} < 0: raise M('null for a non-nullable array')")
        self.emit(ind, f"if {count} > 0:")
        if isinstance(elem, str):
            size = _FIXED_SIZES.get(elem)
            min_size = size or (1 if flexible else 2 if elem == "string" else 4)
        else:
            size, min_size = _entity_sizes(elem)
        if size is not None:
            self.emit(ind + 1, f"pos += {count} * {size}")
            self.emit(ind + 1, "if pos > end: raise M('array longer than frame')")
            return
        # kio pre-allocates `count` slots: never let it see a count the frame cannot hold.
        self.emit(ind + 1, f"if {count} * {max(min_size, 1)} > end - pos: "
                           "raise M('array longer than frame')")
        self.emit(ind + 1, f"for _ in range({count}):")
        if isinstance(elem, str):
            self.primitive(ind + 2, elem, flexible)
        else:
            self.entity(ind + 2, elem, False)

    def entity(self, ind: int, cls: type, nullable: bool) -> None:
        flexible = cls.__flexible__
        if nullable:
            self.emit(ind, "if pos >= end: raise M('truncated')")
            self.emit(ind, "pos += 1")
            self.emit(ind, "if buf[pos - 1] != 0xFF:")  # int8 -1 means null
            ind += 1
            self.emit(ind, "pass")
        fixed_run = 0
        tags = {}
        for f in dataclasses.fields(cls):
            tag = f.metadata.get("tag")
            if tag is not None:
                tags[tag] = _field_skimmer(cls, f.name)
                continue
            kind, what, _ = _classify(f, False)
            if kind == "primitive" and what in _FIXED_SIZES:
                fixed_run += _FIXED_SIZES[what]
                continue
            if fixed_run:
                self.emit(ind, f"pos += {fixed_run}")
                fixed_run = 0
            self.field(ind, f, flexible, False)
        if fixed_run:
            self.emit(ind, f"pos += {fixed_run}")
        if flexible:
            self.emit(ind, "if pos >= end: raise M('truncated')")
            self.emit(ind, "if buf[pos] == 0: pos += 1")
            self.emit(ind, f"else: pos = _skim_tags(buf, pos, end, edits, {self.const(tags)})")

    def compile(self, body: Callable[[int], None]) -> Skim:
        self.emit(0, "def skim(buf, pos, end, edits):")
        body(1)
        self.emit(1, "if pos > end: raise M('truncated')")
        self.emit(1, "return pos")
        exec("\n".join(self.lines), self.env)  # noqa: S102 -- source generated from kio's schema
        return self.env["skim"]


@lru_cache(maxsize=None)
def _entity_sizes(cls: type) -> tuple[int | None, int]:
    """(exact encoded size if constant, minimum encoded size) of a non-null ``cls``."""
    exact: int | None = 0
    minimum = 0
    if cls.__flexible__:
        exact, minimum = None, 1
    for f in dataclasses.fields(cls):
        if f.metadata.get("tag") is not None:
            continue
        kind, what, nullable = _classify(f, False)
        if kind == "primitive" and what in _FIXED_SIZES:
            size, least = _FIXED_SIZES[what], _FIXED_SIZES[what]
        elif kind == "primitive":
            size, least = None, (1 if cls.__flexible__ else 2 if what == "string" else 4)
        elif kind == "array":
            size, least = None, (1 if cls.__flexible__ else 4)
        else:
            size, least = _entity_sizes(what)
            if nullable:
                size, least = None, 1
        minimum += least
        exact = None if exact is None or size is None else exact + size
    return exact, minimum


@lru_cache(maxsize=None)
def _entity_skimmer(cls: type) -> Skim:
    gen = _SkimGen()
    return gen.compile(lambda ind: gen.entity(ind, cls, False))


@lru_cache(maxsize=None)
def _field_skimmer(cls: type, name: str) -> Skim:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    gen = _SkimGen()
    return gen.compile(lambda ind: gen.field(ind, f, cls.__flexible__, True))


def _skim_tags(buf, pos: int, end: int, edits: list, known: dict[int, Skim]) -> int:
    start = pos
    count, pos = uvarint(buf, pos, end)
    if count == 0:
        return pos
    if 2 * count > end - pos:
        raise Malformed("tag count longer than frame")
    kept: list[tuple[int, Any]] = []
    changed = False
    for _ in range(count):
        tag_start = pos
        tag, pos = uvarint(buf, pos, end)
        size, pos = uvarint(buf, pos, end)
        value_end = pos + size
        if value_end > end:
            raise Malformed("tagged field longer than frame")
        skim = known.get(tag)
        if skim is None:
            changed = True  # unknown tag: ignored, as the protocol requires
        else:
            sub: list = []
            if skim(buf, pos, value_end, sub) != value_end:
                raise Malformed(f"tagged field {tag} size mismatch")
            if sub:
                changed = True
                kept.append((tag, _apply_edits(buf, pos, value_end, sub)))
            else:
                kept.append((tag, (tag_start, value_end)))
        pos = value_end
    if changed:
        out = bytearray(encode_uvarint(len(kept)))
        for tag, value in kept:
            if isinstance(value, tuple):
                out += buf[value[0]:value[1]]
            else:
                out += encode_uvarint(tag) + encode_uvarint(len(value)) + value
        edits.append((start, pos, bytes(out)))
    return pos


# --------------------------------------------------------------------------------------------
# decoding


class RequestFrame(NamedTuple):
    """The fixed 8-byte prefix every request header version starts with."""

    api_key: int
    api_version: int
    correlation_id: int

    @classmethod
    def peek(cls, frame: bytes | bytearray | memoryview) -> RequestFrame:
        """Read the prefix without decoding anything else; MalformedRequest if too short."""
        if len(frame) < 8:
            raise MalformedRequest(f"frame of {len(frame)} bytes is shorter than a request header")
        return cls(*_HEADER_PREFIX.unpack_from(frame, 0))


@dataclasses.dataclass(frozen=True, slots=True)
class DecodedRequest:
    api_key: ApiKey
    api_version: int
    correlation_id: int
    client_id: str | None
    header: Any  # kio RequestHeader (v1 or v2)
    body: Any  # kio request dataclass for (api_key, api_version)

    @property
    def header_version(self) -> int:
        return 2 if isinstance(self.header, RequestHeaderV2) else 1


class _Decoder(NamedTuple):
    request_cls: type
    flexible_header: bool
    skim: Skim
    read: Callable


_DECODERS: dict[tuple[int, int], _Decoder] = {}


def _unsupported_reason(api_key: int, api_version: int) -> UnsupportedReason | None:
    advertised = API_VERSIONS.get(api_key)
    if advertised is None:
        try:
            ApiKey(api_key)
        except ValueError:
            return UnsupportedReason.UNKNOWN_API_KEY
        return UnsupportedReason.API_NOT_SUPPORTED
    if not advertised[0] <= api_version <= advertised[1]:
        return UnsupportedReason.VERSION_NOT_SUPPORTED
    known = kio_versions(api_key)
    if known is None or not known[0] <= api_version <= known[1]:
        return UnsupportedReason.VERSION_NOT_DECODABLE
    return None


def _decoder(api_key: int, api_version: int, correlation_id: int) -> _Decoder:
    decoder = _DECODERS.get((api_key, api_version))
    if decoder is not None:
        return decoder
    reason = _unsupported_reason(api_key, api_version)
    if reason is not None:
        raise UnsupportedVersion(api_key, api_version, correlation_id, reason)
    cls = request_class(api_key, api_version)
    decoder = _Decoder(
        request_cls=cls,
        flexible_header=cls.__header_schema__ is RequestHeaderV2,
        skim=_entity_skimmer(cls),
        read=produce_wire.produce_reader(cls)
        if api_key == ApiKey.PRODUCE and api_version >= produce_wire.FIRST_VERSION
        else entity_reader(cls),
    )
    _DECODERS[(api_key, api_version)] = decoder
    return decoder


def parse_request(frame: bytes | bytearray | memoryview) -> DecodedRequest:
    """Decode one request frame (the bytes after the 4-byte length prefix).

    Raises ``MalformedRequest`` if the frame cannot be parsed and ``UnsupportedVersion`` if the
    header parses but Strata does not serve the api key/version. Produce's records (v3+) are
    views of ``frame`` (``produce_wire``), so a frame must not be reused while its request
    lives; nothing else in the result references it.
    """
    if not isinstance(frame, bytes):
        # kio's native reader refuses writable buffers; a read-only view avoids a copy.
        frame = memoryview(frame).toreadonly()
    n = len(frame)
    api_key, api_version, correlation_id = RequestFrame.peek(frame)
    decoder = _decoder(api_key, api_version, correlation_id)
    try:
        # Header: api key, version, correlation id, then client id -- always an int16-length
        # nullable string, even in the flexible header v2 -- then (v2) tagged fields, which no
        # Kafka version defines for requests: skip them all.
        if n < 10:
            raise Malformed("truncated client id")
        (length,) = _I16.unpack_from(frame, 8)
        pos = 10
        if length >= 0:
            if pos + length > n:
                raise Malformed("client id longer than frame")
            client_id = str(frame[pos:pos + length], "utf-8", "replace")
            pos += length
        elif length == -1:
            client_id = None
        else:
            raise Malformed("negative client id length")
        if decoder.flexible_header:
            pos = skip_tags(frame, pos, n)
        edits: list = []
        body_end = decoder.skim(frame, pos, n, edits)
    except Malformed as e:
        raise MalformedRequest(f"api key {api_key} v{api_version}: {e}") from None
    buf = frame
    if edits:  # unknown tagged fields: parse a copy without them
        buf = _apply_edits(frame, 0, n, edits)
        body_end += len(buf) - n
    try:
        body, size = decoder.read(buf, pos)
    except Exception as e:  # kio DecodeError, ValueError, KeyError, UnicodeDecodeError, ...
        raise MalformedRequest(f"api key {api_key} v{api_version}: {type(e).__name__}: {e}") from e
    except BaseException as e:
        if type(e).__name__ != "PanicException":  # a pyo3 panic: still a bad frame
            raise
        raise MalformedRequest(f"api key {api_key} v{api_version}: kio panicked: {e}") from e
    if pos + size != body_end:  # the pre-scan and kio must agree on every byte
        raise MalformedRequest(f"api key {api_key} v{api_version}: body is {size} bytes for kio "
                               f"but {body_end - pos} for the pre-scan")
    header_cls = RequestHeaderV2 if decoder.flexible_header else RequestHeaderV1
    header = header_cls(request_api_key=api_key, request_api_version=api_version,
                        correlation_id=correlation_id, client_id=client_id)
    return DecodedRequest(ApiKey(api_key), api_version, correlation_id, client_id, header, body)


# --------------------------------------------------------------------------------------------
# encoding

_ZERO_COPY_MIN = 16 * 1024  # chunks at least this large are kept by reference, not copied


class _Sink:
    """A write-only file for kio's writer: small writes are coalesced, large ones and file
    regions referenced (kio only takes ``len()`` of a records value before writing it)."""

    __slots__ = ("parts", "current")

    def __init__(self, head: bytes):
        self.current = bytearray(head)
        self.parts: list = [self.current]

    def write(self, data) -> int:
        n = len(data)
        if n >= _ZERO_COPY_MIN or isinstance(data, FileRegion):
            self.parts.append(data)
            self.current = bytearray()
            self.parts.append(self.current)
        else:
            self.current += data
        return n


def _encode_parts(correlation_id: int, header_v1: bool, cls: type, body) -> list:
    if header_v1:
        head = struct.pack(">iib", 0, correlation_id, 0)  # v1: empty tagged fields
    else:
        head = struct.pack(">ii", 0, correlation_id)
    sink = _Sink(head)
    if fetch_response_writable(body):
        write_fetch_response(sink, body)
    else:
        entity_writer(cls)(sink, body)
    parts = [p for p in sink.parts if len(p)]
    struct.pack_into(">i", parts[0], 0, sum(map(len, parts)) - 4)
    return parts


def encode_response_parts(request: DecodedRequest, response_body) -> list:
    """The response frame (length prefix, header, body) as a list of buffers for ``writelines``.

    Large ``bytes``/``memoryview`` values in the body (records) are included by reference, not
    copied; do not mutate them until the buffers have been written. A ``FileRegion`` records
    value stays a ``FileRegion`` part, for the connection to send with ``sendfile``.
    """
    cls = type(response_body)
    if cls.__api_key__ != request.api_key or cls.__version__ != request.api_version:
        raise ValueError(f"{cls.__module__}.{cls.__name__} does not answer api key "
                         f"{request.api_key} v{request.api_version}")
    # ApiVersions responses always use header v0 so that a client that sent a version we do
    # not know can still read the correlation id (kio's classes already say so).
    header_v1 = (request.api_key != ApiKey.API_VERSIONS
                 and cls.__header_schema__ is not ResponseHeaderV0)
    return _encode_parts(request.correlation_id, header_v1, cls, response_body)


def encode_response(request: DecodedRequest, response_body) -> bytes:
    """The complete response frame, including the 4-byte length prefix."""
    parts = encode_response_parts(request, response_body)
    return bytes(parts[0]) if len(parts) == 1 else b"".join(
        p.read() if isinstance(p, FileRegion) else p for p in parts)


def api_versions_response(api_version: int, code: int = ErrorCode.NONE,
                          apis: Mapping[int, tuple[int, int]] | None = None):
    """The ApiVersions response body advertising ``apis`` (default: ``API_VERSIONS``)."""
    cls = response_class(ApiKey.API_VERSIONS, api_version)
    entry = nested_class(cls, "api_keys")
    keys = tuple(entry(api_key=int(k), min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted((API_VERSIONS if apis is None else apis).items()))
    return _make(cls, kio_error_code(code), api_keys=keys)


def encode_api_versions_fallback(correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions request of a version it does not support.

    A v0 response body (readable by every client) with error UNSUPPORTED_VERSION and the API
    list, after a v0 response header, with the length prefix. (Kafka itself lists only the
    ApiVersions entry, KIP-511; clients read just that entry, so the full list is equally valid.)
    """
    body = api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION)
    return b"".join(_encode_parts(correlation_id, False, type(body), body))


# --------------------------------------------------------------------------------------------
# building responses, and error responses


def _zero(f: dataclasses.Field, code) -> Any:
    """A neutral value for a field without a schema default (Kafka's generated-code zero)."""
    tp, optional = _unwrap_optional(f.type)
    kafka_type = f.metadata.get("kafka_type")
    if typing.get_origin(tp) is tuple:
        return ()
    if dataclasses.is_dataclass(tp):
        return None if optional else _make(tp, code)
    if kafka_type in ("bytes", "records"):
        return b""
    if optional:
        return None
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type == "float64":
        return 0.0
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    return 0


@lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@lru_cache(maxsize=None)
def _fill_plan(cls: type) -> tuple[frozenset[str], tuple[tuple[str, dataclasses.Field | None], ...]]:
    """``cls``'s field names, and the fields ``_make`` fills when not given: (name, None) for
    an error code, (name, field) for one without a schema default."""
    fill = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("kafka_type") == "error_code":
            fill.append((f.name, None))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            fill.append((f.name, f))
    return _field_names(cls), tuple(fill)


def _make(cls: type, code, **given) -> Any:
    """Instantiate ``cls``: ``given`` fields that exist in this version, every ``error_code``
    field set to ``code``, schema defaults, and zero values for the rest."""
    names, fill = _fill_plan(cls)
    kwargs = {k: v for k, v in given.items() if k in names}
    for name, f in fill:
        if name not in kwargs:
            kwargs[name] = code if f is None else _zero(f, code)
    return cls(**kwargs)


@lru_cache(maxsize=None)
def nested_class(cls: type, path: str) -> type:
    """The entity class at dotted field ``path`` under ``cls`` (element type for arrays)."""
    for name in path.split("."):
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        tp, _ = _unwrap_optional(f.type)
        if typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
        cls = tp
    return cls


def _has(cls: type, path: str) -> bool:
    try:
        nested_class(cls, path)
    except StopIteration:
        return False
    return True


def _mk(root: type, path: str, code, **given) -> Any:
    return _make(nested_class(root, path) if path else root, code, **given)


def _topic_key(topic) -> dict:
    """The identifying fields of a request topic; request and response use the same names."""
    return {k: getattr(topic, k) for k in ("name", "topic", "topic_id") if hasattr(topic, k)}


def _err_produce(req, rc, code, msg):
    topics = tuple(
        _mk(rc, "responses", code, **_topic_key(t), partition_responses=tuple(
            _mk(rc, "responses.partition_responses", code, index=p.index, base_offset=-1,
                log_append_time=None, log_start_offset=-1, error_message=msg)
            for p in t.partition_data))
        for t in req.body.topic_data)
    return _mk(rc, "", code, responses=topics)


def _err_fetch(req, rc, code, msg):
    topics = tuple(
        _mk(rc, "responses", code, **_topic_key(t), partitions=tuple(
            _mk(rc, "responses.partitions", code, partition_index=p.partition, high_watermark=-1,
                last_stable_offset=-1, log_start_offset=-1, records=b"")
            for p in t.partitions))
        for t in req.body.topics)
    return _mk(rc, "", code, session_id=0, responses=topics)


def _err_list_offsets(req, rc, code, msg):
    topics = tuple(
        _mk(rc, "topics", code, name=t.name, partitions=tuple(
            _mk(rc, "topics.partitions", code, partition_index=p.partition_index, timestamp=-1,
                offset=-1, leader_epoch=-1)
            for p in t.partitions))
        for t in req.body.topics)
    return _mk(rc, "", code, topics=topics)


def _or_empty(name: str | None) -> str:
    return "" if name is None else name


def _err_metadata(req, rc, code, msg):
    # v10+ requests may name a topic by id with a null name; the response name is not nullable
    # before v12, so a null becomes "" (as Kafka's MetadataRequest.getErrorResponse does).
    topics = tuple(
        _mk(rc, "topics", code, name=_or_empty(getattr(t, "name", None)),
            topic_id=getattr(t, "topic_id", None), is_internal=False, partitions=())
        for t in (req.body.topics or ()))
    return _mk(rc, "", code, topics=topics, brokers=(), cluster_id=None, controller_id=-1)


def _err_offset_for_leader_epoch(req, rc, code, msg):
    topics = tuple(
        _mk(rc, "topics", code, topic=t.topic, partitions=tuple(
            _mk(rc, "topics.partitions", code, partition=p.partition, leader_epoch=-1,
                end_offset=-1)
            for p in t.partitions))
        for t in req.body.topics)
    return _mk(rc, "", code, topics=topics)


def _err_find_coordinator(req, rc, code, msg):
    node = dict(node_id=-1, host="", port=-1, error_message=msg)
    if _has(rc, "coordinators"):
        keys = req.body.coordinator_keys or ()
        return _mk(rc, "", code, coordinators=tuple(
            _mk(rc, "coordinators", code, key=k, **node) for k in keys))
    return _mk(rc, "", code, **node)


def _err_join_group(req, rc, code, msg):
    return _mk(rc, "", code, generation_id=-1, leader="", member_id="", members=())


def _err_leave_group(req, rc, code, msg):
    members = tuple(
        _mk(rc, "members", code, member_id=m.member_id, group_instance_id=m.group_instance_id)
        for m in getattr(req.body, "members", ()))
    return _mk(rc, "", code, members=members)


def _err_offset_commit(req, rc, code, msg):
    topics = tuple(
        _mk(rc, "topics", code, **_topic_key(t), partitions=tuple(
            _mk(rc, "topics.partitions", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in req.body.topics)
    return _mk(rc, "", code, topics=topics)


def _offset_fetch_topics(rc, path, code, topics):
    return tuple(
        _mk(rc, path, code, **_topic_key(t), partitions=tuple(
            _mk(rc, path + ".partitions", code, partition_index=i, committed_offset=-1,
                committed_leader_epoch=-1, metadata="")
            for i in t.partition_indexes))
        for t in (topics or ()))


def _err_offset_fetch(req, rc, code, msg):
    if _has(rc, "groups"):  # v8+
        return _mk(rc, "", code, groups=tuple(
            _mk(rc, "groups", code, group_id=g.group_id,
                topics=_offset_fetch_topics(rc, "groups.topics", code, g.topics))
            for g in req.body.groups))
    return _mk(rc, "", code, topics=_offset_fetch_topics(rc, "topics", code, req.body.topics))


def _err_describe_groups(req, rc, code, msg):
    return _mk(rc, "", code, groups=tuple(
        _mk(rc, "groups", code, group_id=g, error_message=msg, group_state="", protocol_type="",
            protocol_data="", members=())
        for g in req.body.groups))


def _err_consumer_group_describe(req, rc, code, msg):
    return _mk(rc, "", code, groups=tuple(
        _mk(rc, "groups", code, group_id=g, error_message=msg) for g in req.body.group_ids))


def _err_delete_groups(req, rc, code, msg):
    return _mk(rc, "", code, results=tuple(
        _mk(rc, "results", code, group_id=g) for g in dict.fromkeys(req.body.groups_names)))


def _err_init_producer_id(req, rc, code, msg):
    return _mk(rc, "", code, producer_id=-1, producer_epoch=-1)


def _err_create_topics(req, rc, code, msg):
    return _mk(rc, "", code, topics=tuple(
        _mk(rc, "topics", code, name=t.name, error_message=msg, num_partitions=-1,
            replication_factor=-1, configs=())
        for t in req.body.topics))


def _err_delete_topics(req, rc, code, msg):
    if hasattr(req.body, "topics"):  # v6+: names or ids
        items = [dict(name=t.name, topic_id=t.topic_id) for t in req.body.topics]
    else:
        items = [dict(name=name) for name in req.body.topic_names]
    return _mk(rc, "", code, responses=tuple(
        _mk(rc, "responses", code, error_message=msg, **item) for item in items))


def _err_create_partitions(req, rc, code, msg):
    return _mk(rc, "", code, results=tuple(
        _mk(rc, "results", code, name=t.name, error_message=msg) for t in req.body.topics))


def _config_resources(rc, path, code, msg, resources):
    return tuple(
        _mk(rc, path, code, error_message=msg, resource_type=r.resource_type,
            resource_name=r.resource_name, configs=())
        for r in resources)


def _err_describe_configs(req, rc, code, msg):
    return _mk(rc, "", code,
               results=_config_resources(rc, "results", code, msg, req.body.resources))


def _err_alter_configs(req, rc, code, msg):
    return _mk(rc, "", code,
               responses=_config_resources(rc, "responses", code, msg, req.body.resources))


def _err_delete_records(req, rc, code, msg):
    return _mk(rc, "", code, topics=tuple(
        _mk(rc, "topics", code, name=t.name, partitions=tuple(
            _mk(rc, "topics.partitions", code, partition_index=p.partition_index, low_watermark=-1)
            for p in t.partitions))
        for t in req.body.topics))


def _err_describe_cluster(req, rc, code, msg):
    return _mk(rc, "", code, error_message=msg, cluster_id="", controller_id=-1, brokers=(),
               endpoint_type=getattr(req.body, "endpoint_type", 1))


def _err_sasl_handshake(req, rc, code, msg):
    return _mk(rc, "", code, mechanisms=())


def _err_sasl_authenticate(req, rc, code, msg):
    return _mk(rc, "", code, error_message=msg, auth_bytes=b"",
               **({"session_lifetime": datetime.timedelta(0)} if req.api_version >= 1 else {}))


def _err_alter_client_quotas(req, rc, code, msg):
    return _mk(rc, "", code, entries=tuple(
        _mk(rc, "entries", code, error_message=msg, entity=tuple(
            _mk(rc, "entries.entity", code, entity_type=e.entity_type, entity_name=e.entity_name)
            for e in entry.entity))
        for entry in req.body.entries))


def _err_api_versions(req, rc, code, msg):
    if int(code) == ErrorCode.UNSUPPORTED_VERSION:
        return api_versions_response(req.api_version, code)
    return _mk(rc, "", code, api_keys=())


def _err_top_level(req, rc, code, msg):
    return _mk(rc, "", code, error_message=msg)


def _err_create_acls(req, rc, code, msg):
    return _mk(rc, "", code, results=tuple(
        _mk(rc, "results", code, error_message=msg) for _ in req.body.creations))


def _err_delete_acls(req, rc, code, msg):
    return _mk(rc, "", code, filter_results=tuple(
        _mk(rc, "filter_results", code, error_message=msg, matching_acls=())
        for _ in req.body.filters))


def _err_describe_producers(req, rc, code, msg):
    return _mk(rc, "", code, topics=tuple(
        _mk(rc, "topics", code, name=t.name, partitions=tuple(
            _mk(rc, "topics.partitions", code, partition_index=p, error_message=msg,
                active_producers=())
            for p in t.partition_indexes))
        for t in req.body.topics))


def _err_describe_transactions(req, rc, code, msg):
    return _mk(rc, "", code, transaction_states=tuple(
        _mk(rc, "transaction_states", code, transactional_id=tid, topics=())
        for tid in req.body.transactional_ids))


def _err_elect_leaders(req, rc, code, msg):
    return _mk(rc, "", code, replica_election_results=tuple(
        _mk(rc, "replica_election_results", code, topic=t.topic, partition_result=tuple(
            _mk(rc, "replica_election_results.partition_result", code, partition_id=p,
                error_message=msg)
            for p in t.partitions))
        for t in req.body.topic_partitions or ()))


def _err_alter_partition_reassignments(req, rc, code, msg):
    return _mk(rc, "", code, error_message=msg, allow_replication_factor_change=getattr(
        req.body, "allow_replication_factor_change", True), responses=tuple(
        _mk(rc, "responses", code, name=t.name, partitions=tuple(
            _mk(rc, "responses.partitions", code, partition_index=p.partition_index,
                error_message=msg)
            for p in t.partitions))
        for t in req.body.topics))


def _err_add_partitions_to_txn(req, rc, code, msg):
    body = req.body
    if req.api_version >= 4:
        return _mk(rc, "", code, results_by_transaction=tuple(
            _mk(rc, "results_by_transaction", code, transactional_id=x.transactional_id,
                topic_results=tuple(
                    _mk(rc, "results_by_transaction.topic_results", code, name=t.name,
                        results_by_partition=tuple(
                            _mk(rc, "results_by_transaction.topic_results.results_by_partition",
                                code, partition_index=p, partition_error_code=code)
                            for p in t.partitions))
                    for t in x.topics))
            for x in body.transactions))
    return _mk(rc, "", code, results_by_topic_v3_and_below=tuple(
        _mk(rc, "results_by_topic_v3_and_below", code, name=t.name, results_by_partition=tuple(
            _mk(rc, "results_by_topic_v3_and_below.results_by_partition", code,
                partition_index=p, partition_error_code=code) for p in t.partitions))
        for t in body.v3_and_below_topics))


def _err_txn_offset_commit(req, rc, code, msg):
    return _mk(rc, "", code, topics=tuple(
        _mk(rc, "topics", code, name=t.name, partitions=tuple(
            _mk(rc, "topics.partitions", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in req.body.topics))


def _err_write_txn_markers(req, rc, code, msg):
    return _mk(rc, "", code, markers=tuple(
        _mk(rc, "markers", code, producer_id=m.producer_id, topics=tuple(
            _mk(rc, "markers.topics", code, name=t.name, partitions=tuple(
                _mk(rc, "markers.topics.partitions", code, partition_index=p)
                for p in t.partition_indexes))
            for t in m.topics))
        for m in req.body.markers))


def _err_alter_user_scram_credentials(req, rc, code, msg):
    # Kafka's getErrorResponse: each user named, once, in name order
    users = {d.name for d in req.body.deletions or ()} | {u.name for u in req.body.upsertions or ()}
    return _mk(rc, "", code, results=tuple(
        _mk(rc, "results", code, user=user, error_message=msg) for user in sorted(users)))


def _err_describe_topic_partitions(req, rc, code, msg):
    return _mk(rc, "", code, next_cursor=None, topics=tuple(
        _mk(rc, "topics", code, name=t.name, partitions=()) for t in req.body.topics))


_ERROR_BUILDERS: dict[int, Callable] = {
    ApiKey.PRODUCE: _err_produce,
    ApiKey.FETCH: _err_fetch,
    ApiKey.LIST_OFFSETS: _err_list_offsets,
    ApiKey.METADATA: _err_metadata,
    ApiKey.OFFSET_COMMIT: _err_offset_commit,
    ApiKey.OFFSET_FETCH: _err_offset_fetch,
    ApiKey.FIND_COORDINATOR: _err_find_coordinator,
    ApiKey.JOIN_GROUP: _err_join_group,
    ApiKey.HEARTBEAT: _err_top_level,
    ApiKey.LEAVE_GROUP: _err_leave_group,
    ApiKey.SYNC_GROUP: _err_top_level,  # assignment b"", protocol fields null
    ApiKey.DESCRIBE_GROUPS: _err_describe_groups,
    ApiKey.DELETE_GROUPS: _err_delete_groups,
    ApiKey.CONSUMER_GROUP_DESCRIBE: _err_consumer_group_describe,
    ApiKey.LIST_GROUPS: _err_top_level,
    ApiKey.API_VERSIONS: _err_api_versions,
    ApiKey.CREATE_TOPICS: _err_create_topics,
    ApiKey.DELETE_TOPICS: _err_delete_topics,
    ApiKey.DELETE_RECORDS: _err_delete_records,
    ApiKey.INIT_PRODUCER_ID: _err_init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: _err_add_partitions_to_txn,
    ApiKey.TXN_OFFSET_COMMIT: _err_txn_offset_commit,
    ApiKey.WRITE_TXN_MARKERS: _err_write_txn_markers,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _err_offset_for_leader_epoch,
    ApiKey.DESCRIBE_CONFIGS: _err_describe_configs,
    ApiKey.ALTER_CONFIGS: _err_alter_configs,
    ApiKey.CREATE_PARTITIONS: _err_create_partitions,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _err_alter_configs,
    ApiKey.DESCRIBE_CLUSTER: _err_describe_cluster,
    ApiKey.SASL_HANDSHAKE: _err_sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: _err_sasl_authenticate,
    ApiKey.CREATE_ACLS: _err_create_acls,
    ApiKey.DELETE_ACLS: _err_delete_acls,
    ApiKey.DESCRIBE_PRODUCERS: _err_describe_producers,
    ApiKey.DESCRIBE_TRANSACTIONS: _err_describe_transactions,
    ApiKey.ELECT_LEADERS: _err_elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _err_alter_partition_reassignments,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: _err_describe_topic_partitions,
    ApiKey.ALTER_CLIENT_QUOTAS: _err_alter_client_quotas,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: _err_alter_user_scram_credentials,
}


def error_response(request: DecodedRequest, code: int, message: str | None = None):
    """A response to ``request`` reporting ``code`` everywhere the schema has an error field.

    Per-topic/partition/resource/group entries mirror the request (as Kafka's
    ``getErrorResponse`` does), with offsets, epochs and ids set to -1. APIs without a dedicated
    builder get only their top-level error fields (empty arrays). ``message`` fills
    ``error_message`` fields where they exist (null otherwise).
    """
    rc = response_class(request.api_key, request.api_version)
    builder = _ERROR_BUILDERS.get(request.api_key, _err_top_level)
    return builder(request, rc, kio_error_code(code), message)


def make(root: type, path: str = "", **given) -> Any:
    """Build the entity at dotted ``path`` under response class ``root`` for its version:
    fields the version lacks are dropped, missing ones get schema defaults or zero values, and
    error codes default to NONE. Handlers build every response through this."""
    return _mk(root, path, kio_error_code(ErrorCode.NONE), **given)
