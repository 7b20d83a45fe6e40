"""The default RemoteLogMetadataManager: remote segment metadata in ``__remote_log_metadata``.

Kafka's ``TopicBasedRemoteLogMetadataManager``: publishing appends the serialised event
(``serde``) to the metadata partition the user partition maps to
(``RemoteLogMetadataTopicPartitioner``) through a ``MetadataTopicLog``, then applies the
partition's records from the log up to and including it to the in-memory
``RemotePartitionMetadataStore`` -- the same code path that replays the topic at start, so
what this broker reads is exactly what the log says. Bad records (undecodable, unknown
segment, invalid transition, a repeated final state) are logged and skipped, never fatal.

On one broker the topic log is the broker's own partition logs and there is no client
round trip. In a cluster it is remote (``ClusterMetadataTopicLog``: the Kafka protocol to
each partition's leader); then, as in Kafka, the topic is loaded in the background and a
consumer thread applies what every broker publishes (see the class docstring).

Snapshots (Kafka has none and replays the whole topic at every start): per metadata
partition the materialised state is written every
``remote.log.metadata.snapshot.interval.records`` applied records or
``remote.log.metadata.snapshot.interval.ms``, whichever comes first, and on ``close``;
``start`` loads it and replays only the records after it. See ``encode_snapshot`` for the
file format; files live in ``{log.dir}/remote-log-metadata-snapshots/``. A version 2 snapshot
(columns, read in bulk) restores its partitions as lazy caches (``RemoteLogMetadataCache``):
no Python object per segment until a partition is used for more than lookups; version 1
files (a serde record per segment) are still read, and rewritten as version 2 at the next
snapshot.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import crc32c as _crc32c

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.config import ConfigDef, ConfigType, at_least
from strata.common.errors import InvalidConfigError
from strata.common.files import atomic_write
from strata.tiered.api import (
    FencedLeaderEpochException,
    RemoteLogMetadata,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundException,
    RemoteStorageException,
    RemoteStorageNotReadyException,
    TopicIdPartition,
    TopicPartition,
)
from strata.tiered.metadata.cache import (
    EpochColumns,
    IllegalStateTransition,
    RemoteLogLeaderEpochState,
    RemoteLogMetadataCache,
    RemotePartitionMetadataStore,
    SegmentColumns,
    columns_from_bytes,
    columns_to_bytes,
)
from strata.tiered.metadata.serde import (
    MetadataParseException,
    RemoteLogMetadataTopicPartitioner,
    RemoteLogSegmentMetadataSnapshot,
    deserialize,
    serialize,
)
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME, MetadataTopicLog

__all__ = [
    "MetadataSnapshot",
    "SNAPSHOT_DIR_NAME",
    "SnapshotError",
    "TopicBasedRemoteLogMetadataManager",
    "decode_snapshot",
    "encode_snapshot",
    "snapshot_path",
]

log = logging.getLogger(__name__)

# Kafka's TopicBasedRemoteLogMetadataManagerConfig keys and defaults, then Strata's own.
NUM_PARTITIONS = "remote.log.metadata.topic.num.partitions"
REPLICATION_FACTOR = "remote.log.metadata.topic.replication.factor"
RETENTION_MS = "remote.log.metadata.topic.retention.ms"
SNAPSHOT_INTERVAL_RECORDS = "remote.log.metadata.snapshot.interval.records"
SNAPSHOT_INTERVAL_MS = "remote.log.metadata.snapshot.interval.ms"
CONSUME_WAIT_MS = "remote.log.metadata.consume.wait.ms"
INITIALIZATION_RETRY_INTERVAL_MS = "remote.log.metadata.initialization.retry.interval.ms"
POLL_INTERVAL_MS = "remote.log.metadata.poll.interval.ms"
BROKER_ID = "broker.id"
CLUSTER_ID = "cluster.id"
LOG_DIR = "log.dir"


def _retention(name: str, value: Any) -> None:
    if value != -1 and value <= 0:
        raise InvalidConfigError(f"Invalid metadata topic retention in millis: {value} ({name})")


CONFIG = (ConfigDef()
          .define(NUM_PARTITIONS, ConfigType.INT, 50, at_least(1))
          .define(REPLICATION_FACTOR, ConfigType.SHORT, 3, at_least(1))
          .define(RETENTION_MS, ConfigType.LONG, -1, _retention)
          .define(SNAPSHOT_INTERVAL_RECORDS, ConfigType.INT, 1000, at_least(0),
                  "Applied records of a metadata partition between two snapshots of it (0: none).")
          .define(SNAPSHOT_INTERVAL_MS, ConfigType.LONG, 60_000, at_least(0),
                  "Most milliseconds a metadata partition's applied records wait for a snapshot "
                  "(0: no time trigger).")
          .define(CONSUME_WAIT_MS, ConfigType.LONG, 120_000, at_least(0),
                  "With a remote topic log: most milliseconds a publish waits for its record to "
                  "be read back from the leader and applied.")
          .define(INITIALIZATION_RETRY_INTERVAL_MS, ConfigType.LONG, 100, at_least(1),
                  "With a remote topic log: milliseconds between attempts to create the topic "
                  "and load its partitions.")
          .define(POLL_INTERVAL_MS, ConfigType.LONG, 100, at_least(1),
                  "With a remote topic log: milliseconds between two rounds of the background "
                  "consumer (one Fetch per metadata partition holding an assigned partition).")
          .define(BROKER_ID, ConfigType.INT, -1)
          .define(CLUSTER_ID, ConfigType.STRING, None)
          .define(LOG_DIR, ConfigType.STRING, None))

SNAPSHOT_DIR_NAME = "remote-log-metadata-snapshots"

# Most records the consumer thread reads from one metadata partition per round.
POLL_MAX_RECORDS = 10_000

# With a remote topic log, the most one call of the loader or consumer thread retries (the
# topic log's own deadline is for publishes): the threads retry by themselves, and a metadata
# partition that cannot be read (no leader) must not hold up the others.
BACKGROUND_CALL_DEADLINE_MS = 2_000

# A background task failing this long is logged at WARNING, then again at this interval.
FAILING_WARN_AFTER_MS = 10_000
FAILING_WARN_EVERY_MS = 60_000


def snapshot_path(log_dir: Path | str, metadata_partition: int) -> Path:
    """Where the snapshot of one metadata partition lives."""
    return Path(log_dir) / SNAPSHOT_DIR_NAME / f"{REMOTE_LOG_METADATA_TOPIC_NAME}-{metadata_partition}.snapshot"


# --------------------------------------------------------------------------- snapshot format

SNAPSHOT_MAGIC = b"SRLM"
SNAPSHOT_VERSION = 3
READABLE_SNAPSHOT_VERSIONS = (1, 2, 3)
_HEADER = struct.Struct(">4shI")          # magic, version, crc32c of everything after
_PREFIX = struct.Struct(">iqq")           # metadata partition, next offset, last value crc or -1
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_EPOCH = struct.Struct(">iq")             # leader epoch, highest offset or -1
_REFERENCE = struct.Struct(">q16s")       # epoch start offset, segment uuid (version 1)
_COUNTS = struct.Struct(">IIIb")          # segments, extra epochs, epoch states, flags (version 2)
_STATE_COUNTS = struct.Struct(">II")      # finished, unreferenced (version 2)
_FLAG_CUSTOM = 1


class SnapshotError(ValueError):
    """A snapshot file is unreadable, corrupt or of an unknown version."""


@dataclass(frozen=True)
class MetadataSnapshot:
    """The state of one metadata partition after applying every record below ``next_offset``.

    ``last_value_crc`` is the CRC32C of the record value at ``next_offset - 1`` (-1 if none):
    a loader checks it against the log to tell a snapshot of this log from one of another.
    """

    metadata_partition: int
    next_offset: int
    last_value_crc: int
    partitions: list[tuple[TopicIdPartition, list[RemoteLogSegmentMetadata],
                           list[tuple[int, RemoteLogLeaderEpochState]]]]
    delete_states: list[RemotePartitionDeleteMetadata]
    fences: list[tuple[TopicIdPartition, int]] = field(default_factory=list)


def encode_snapshot(snapshot: MetadataSnapshot) -> bytes:
    """The snapshot file's bytes (version 3). Big-endian::

        magic "SRLM" | version int16 (3) | crc uint32: CRC32C of everything after it |
        metadata partition int32 | next offset int64 | last value crc int64 (-1: none) |
        user partition count uint32, per user partition:
            topic id 16 bytes | partition int32 | topic name uint16 length + UTF-8 |
            n: segment count uint32 | x: extra epoch count uint32 | e: epoch state count uint32 |
            flags int8 (1: custom metadata present) |
            the segments' columns, by start offset: uuid 16 bytes [n] | start offset int64 [n] |
                end offset int64 [n] | max timestamp int64 [n] | event timestamp int64 [n] |
                broker id int32 [n] | size int32 [n] | state id int8 [n] | txn index empty int8 [n] |
                first leader epoch int32 [n] | its first offset int64 [n] |
            the further leader epochs of segments with several, by segment then epoch:
                segment index uint32 [x] | epoch int32 [x] | first offset int64 [x] |
            if flags & 1: custom metadata length int32 [n] (-1: none) | uint32 length + bytes |
            per leader epoch state, by epoch: epoch int32 | highest offset int64 (-1: none) |
                k: finished count uint32 | u: unreferenced count uint32 |
                epoch start offset int64 [k] (increasing) | segment index uint32 [k] |
                unreferenced segment index uint32 [u] |
        delete state count uint32, per state: uint32 length + a RemotePartitionDeleteMetadata
            record value (serde api key 2) |
        fence count uint32, per user partition with one: topic id 16 bytes | partition int32 |
            topic name uint16 length + UTF-8 | leader epoch int32 (the highest applied)

    ``[n]`` is a column of n values. Version 2 is version 3 without the fences (read as
    none). The epoch states are written out, not recomputed on
    load, because they depend on the order segments finished in (superseded copies, highest
    offsets of deleted segments). Version 1 (``_encode_snapshot_v1``) held a serde record per
    segment and segment uuids in the epoch states; it is still read.
    """
    columns = [SegmentColumns.build(tip, segments, epochs) for tip, segments, epochs in snapshot.partitions]
    return _encode_columns(snapshot.metadata_partition, snapshot.next_offset,
                           snapshot.last_value_crc, columns, snapshot.delete_states,
                           snapshot.fences)


def _put_tip(out: bytearray, tip: TopicIdPartition) -> None:
    name = tip.topic.encode("utf-8")
    out += tip.topic_id.bytes + _I32.pack(tip.partition) + _U16.pack(len(name)) + name


def _encode_columns(metadata_partition: int, next_offset: int, last_value_crc: int,
                    partitions: list[SegmentColumns], delete_states: list[RemotePartitionDeleteMetadata],
                    fences: Iterable[tuple[TopicIdPartition, int]] = ()) -> bytes:
    out = bytearray(_PREFIX.pack(metadata_partition, next_offset, last_value_crc))
    out += _U32.pack(len(partitions))
    for c in partitions:
        _put_tip(out, c.tip)
        custom = c.custom_lengths is not None
        out += _COUNTS.pack(len(c), len(c.extra_segment), len(c.epoch_states), _FLAG_CUSTOM if custom else 0)
        out += c.ids
        for column in (c.start, c.end, c.max_ts, c.event_ts, c.broker, c.size):
            out += columns_to_bytes(column)
        out += c.state
        out += c.txn
        for column in (c.first_epoch, c.first_offset, c.extra_segment, c.extra_epoch, c.extra_offset):
            out += columns_to_bytes(column)
        if custom:
            out += columns_to_bytes(c.custom_lengths)
            _put_bytes(out, c.custom_blob or b"")
        for st in c.epoch_states:
            out += _EPOCH.pack(st.epoch, -1 if st.highest_offset is None else st.highest_offset)
            out += _STATE_COUNTS.pack(len(st.starts), len(st.unreferenced))
            for column in (st.starts, st.segments, st.unreferenced):
                out += columns_to_bytes(column)
    out += _U32.pack(len(delete_states))
    for delete in delete_states:
        _put_bytes(out, serialize(delete))
    fences = sorted(fences, key=lambda f: (f[0].topic, f[0].partition, f[0].topic_id))
    out += _U32.pack(len(fences))
    for tip, epoch in fences:
        _put_tip(out, tip)
        out += _I32.pack(epoch)
    return _HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, _crc32c.crc32c(out)) + bytes(out)


def _encode_snapshot_v1(snapshot: MetadataSnapshot) -> bytes:
    """Version 1 of the snapshot file (read, no longer written; kept for tests). Big-endian::

        magic "SRLM" | version int16 (1) | crc uint32: CRC32C of everything after it |
        metadata partition int32 | next offset int64 | last value crc int64 (-1: none) |
        user partition count uint32, per user partition:
            topic id 16 bytes | partition int32 | topic name uint16 length + UTF-8 |
            segment count uint32, per segment: uint32 length + a RemoteLogSegmentMetadataSnapshot
                record value (serde api key 3), by start offset |
            epoch count uint32, per leader epoch: epoch int32 | highest offset int64 (-1: none) |
                finished count uint32 + (epoch start offset int64, segment uuid 16 bytes) each |
                unreferenced count uint32 + segment uuid 16 bytes each |
        delete state count uint32, per state: uint32 length + a RemotePartitionDeleteMetadata
            record value (serde api key 2)
    """
    out = bytearray(_PREFIX.pack(snapshot.metadata_partition, snapshot.next_offset,
                                 snapshot.last_value_crc))
    out += _U32.pack(len(snapshot.partitions))
    for tip, segments, epochs in snapshot.partitions:
        name = tip.topic.encode("utf-8")
        out += tip.topic_id.bytes + _I32.pack(tip.partition) + _U16.pack(len(name)) + name
        out += _U32.pack(len(segments))
        for metadata in segments:
            _put_bytes(out, serialize(RemoteLogSegmentMetadataSnapshot.create(metadata)))
        out += _U32.pack(len(epochs))
        for epoch, state in epochs:
            out += _EPOCH.pack(epoch, -1 if state.highest_offset is None else state.highest_offset)
            out += _U32.pack(len(state.offset_to_id))
            for start, segment_id in sorted(state.offset_to_id.items()):
                out += _REFERENCE.pack(start, segment_id.id.bytes)
            out += _U32.pack(len(state.unreferenced))
            for segment_id in sorted(state.unreferenced, key=lambda i: i.id.int):
                out += segment_id.id.bytes
    out += _U32.pack(len(snapshot.delete_states))
    for delete in snapshot.delete_states:
        _put_bytes(out, serialize(delete))
    return _HEADER.pack(SNAPSHOT_MAGIC, 1, _crc32c.crc32c(out)) + bytes(out)


def _put_bytes(out: bytearray, data: bytes) -> None:
    out += _U32.pack(len(data))
    out += data


class _SnapshotReader:
    __slots__ = ("data", "view", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.view = memoryview(data)
        self.pos = pos

    def _advance(self, n: int) -> int:
        if n > len(self.data) - self.pos:
            raise SnapshotError(f"snapshot truncated at byte {self.pos}")
        start = self.pos
        self.pos += n
        return start

    def take(self, n: int) -> bytes:
        start = self._advance(n)
        return self.data[start:self.pos]

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        start = self._advance(st.size)
        return st.unpack_from(self.data, start)

    def count(self) -> int:
        return self.unpack(_U32)[0]

    def sized(self) -> bytes:
        return self.take(self.count())

    def column(self, typecode: str, n: int) -> Any:
        """n big-endian values as an array."""
        size = n * _ITEM_SIZES[typecode]
        start = self._advance(size)
        return columns_from_bytes(typecode, self.view[start:self.pos])


_ITEM_SIZES = {"q": 8, "i": 4, "I": 4}


@dataclass(frozen=True)
class _LoadedSnapshot:
    """A snapshot file as ``_load_snapshot`` restores it: a cache per user partition (lazy
    ones from version 2)."""

    version: int
    metadata_partition: int
    next_offset: int
    last_value_crc: int
    caches: list[tuple[TopicIdPartition, RemoteLogMetadataCache]]
    delete_states: list[RemotePartitionDeleteMetadata]
    fences: list[tuple[TopicIdPartition, int]]


def _parse_snapshot(data: bytes) -> tuple[int, tuple[int, int, int], list[Any],
                                         list[RemotePartitionDeleteMetadata],
                                         list[tuple[TopicIdPartition, int]]]:
    """(version, (metadata partition, next offset, last value crc), partitions, delete states,
    fences) of a snapshot file of any readable version: a partition is (tip, segments, epoch
    states) in version 1, SegmentColumns (validated) from version 2. SnapshotError if it is
    not a snapshot this version can trust."""
    if len(data) < _HEADER.size:
        raise SnapshotError("snapshot shorter than its header")
    magic, version, crc = _HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError(f"not a remote log metadata snapshot (magic {magic!r})")
    if version not in READABLE_SNAPSHOT_VERSIONS:
        raise SnapshotError(f"unsupported snapshot version {version}")
    if _crc32c.crc32c(memoryview(data)[_HEADER.size:]) != crc:
        raise SnapshotError("snapshot CRC mismatch")
    r = _SnapshotReader(data, _HEADER.size)
    read_partition = _read_partition_v1 if version == 1 else _read_partition_columns
    try:
        prefix = r.unpack(_PREFIX)
        partitions = [read_partition(r) for _ in range(r.count())]
        deletes = []
        for _ in range(r.count()):
            delete = deserialize(r.sized())
            if not isinstance(delete, RemotePartitionDeleteMetadata):
                raise SnapshotError(f"expected a partition delete record, found {type(delete).__name__}")
            deletes.append(delete)
        fences = []
        if version >= 3:
            for _ in range(r.count()):
                tip = _read_tip(r)
                epoch = r.unpack(_I32)[0]
                if epoch < 0:
                    raise SnapshotError(f"negative leader epoch fence {epoch} of {tip}")
                fences.append((tip, epoch))
    except SnapshotError:
        raise
    except ValueError as exc:  # a record the serde or the api types reject, a bad name, bad columns
        raise SnapshotError(f"bad record in snapshot: {exc}") from exc
    if r.pos != len(data):
        raise SnapshotError(f"{len(data) - r.pos} byte(s) after the snapshot's end")
    return version, prefix, partitions, deletes, fences


def decode_snapshot(data: bytes) -> MetadataSnapshot:
    """Parse a snapshot file (version 1 or 2); SnapshotError if it is not one this version can
    trust. Every segment becomes a RemoteLogSegmentMetadata (the RLMM's own loading keeps
    version 2's columns instead)."""
    _, prefix, partitions, deletes, fences = _parse_snapshot(data)
    decoded = [(p.tip, *p.restored()) if isinstance(p, SegmentColumns) else p for p in partitions]
    return MetadataSnapshot(*prefix, decoded, deletes, fences)


def _read_snapshot(data: bytes) -> _LoadedSnapshot:
    """A snapshot file as caches: lazy ones from version 2. SnapshotError if it is not a
    snapshot this version can trust (nothing of it is used then)."""
    version, prefix, partitions, deletes, fences = _parse_snapshot(data)
    caches = []
    for p in partitions:
        if isinstance(p, SegmentColumns):
            caches.append((p.tip, RemoteLogMetadataCache.from_columns(p)))
        else:
            tip, segments, epochs = p
            cache = RemoteLogMetadataCache()
            try:
                cache.restore(segments, epochs)
            except ValueError as exc:
                raise SnapshotError(f"bad partition {tip} in snapshot: {exc}") from exc
            caches.append((tip, cache))
    return _LoadedSnapshot(version, *prefix, caches, deletes, fences)


def _read_tip(r: _SnapshotReader) -> TopicIdPartition:
    topic_id = uuid.UUID(bytes=r.take(16))
    partition = r.unpack(_I32)[0]
    name = r.take(r.unpack(_U16)[0]).decode("utf-8")
    return TopicIdPartition(topic_id, TopicPartition(name, partition))


def _read_partition_columns(r: _SnapshotReader) -> SegmentColumns:
    tip = _read_tip(r)
    n, x, e, flags = r.unpack(_COUNTS)
    if flags & ~_FLAG_CUSTOM:
        raise SnapshotError(f"unknown partition flags {flags:#x}")
    ids = r.take(16 * n)
    start, end, max_ts, event_ts = (r.column("q", n) for _ in range(4))
    broker, size = r.column("i", n), r.column("i", n)
    state, txn = r.take(n), r.take(n)
    first_epoch, first_offset = r.column("i", n), r.column("q", n)
    extra_segment, extra_epoch, extra_offset = r.column("I", x), r.column("i", x), r.column("q", x)
    custom_lengths = custom_blob = None
    if flags & _FLAG_CUSTOM:
        custom_lengths = r.column("i", n)
        custom_blob = r.sized()
    states = []
    for _ in range(e):
        epoch, highest = r.unpack(_EPOCH)
        k, u = r.unpack(_STATE_COUNTS)
        states.append(EpochColumns(epoch, None if highest < 0 else highest, r.column("q", k),
                                   r.column("I", k), r.column("I", u)))
    columns = SegmentColumns(tip, ids, start, end, max_ts, event_ts, broker, size, state, txn,
                             first_epoch, first_offset, extra_segment, extra_epoch, extra_offset,
                             custom_lengths, custom_blob, states)
    columns.validate()
    return columns


def _read_partition_v1(r: _SnapshotReader) -> tuple[TopicIdPartition, list[RemoteLogSegmentMetadata],
                                                    list[tuple[int, RemoteLogLeaderEpochState]]]:
    tip = _read_tip(r)
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = {}
    for _ in range(r.count()):
        s = deserialize(r.sized())
        if not isinstance(s, RemoteLogSegmentMetadataSnapshot):
            raise SnapshotError(f"expected a segment snapshot record, found {type(s).__name__}")
        segments[s.segment_id] = RemoteLogSegmentMetadata(
            _segment_id(tip, s.segment_id), s.start_offset, s.end_offset, s.max_timestamp_ms,
            s.broker_id, s.event_timestamp_ms, s.segment_size_in_bytes,
            custom_metadata=s.custom_metadata, state=s.state,
            segment_leader_epochs=s.segment_leader_epochs, txn_idx_empty=s.txn_idx_empty)
    epochs = []
    for _ in range(r.count()):
        epoch, highest = r.unpack(_EPOCH)
        offset_to_id = {}
        for _ in range(r.count()):
            start, raw = r.unpack(_REFERENCE)
            offset_to_id[start] = _segment_id(tip, uuid.UUID(bytes=raw))
        unreferenced = [_segment_id(tip, uuid.UUID(bytes=r.take(16))) for _ in range(r.count())]
        epochs.append((epoch, RemoteLogLeaderEpochState(offset_to_id, unreferenced,
                                                        None if highest < 0 else highest)))
    return tip, list(segments.values()), epochs


def _segment_id(tip: TopicIdPartition, segment_uuid: uuid.UUID) -> RemoteLogSegmentId:
    return RemoteLogSegmentId(tip, segment_uuid)


# --------------------------------------------------------------------------- the manager


class _MetadataPartition:
    """Consumption state of one metadata partition; ``lock`` orders its appends and applies."""

    __slots__ = ("partition", "lock", "next_offset", "last_value_crc", "ready", "positioned",
                 "applied", "unsnapshotted", "last_snapshot_ns")

    def __init__(self, partition: int, now_ns: int) -> None:
        self.partition = partition
        self.lock = threading.Lock()
        self.next_offset = 0           # every record below it is applied
        self.last_value_crc = -1       # CRC32C of the value at next_offset - 1, -1 if unknown
        self.ready = False             # loaded: snapshot and replay done
        self.positioned = False        # snapshot loaded or next_offset at the log start
        self.applied = 0               # records applied since it was created
        self.unsnapshotted = 0         # records applied since the last snapshot
        self.last_snapshot_ns = now_ns


class _Pending:
    """An assigned user partition not ready yet: ready once its metadata partition is applied
    up to ``target``, the end offset read after the assignment (None: not read yet)."""

    __slots__ = ("target",)

    def __init__(self) -> None:
        self.target: int | None = None


def _completed() -> concurrent.futures.Future[None]:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future


def _failed(exc: BaseException, what: str) -> concurrent.futures.Future[None]:
    if not isinstance(exc, RemoteStorageException):
        error = RemoteStorageException(f"{what}: {exc}")
        error.__cause__ = exc
        exc = error
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_exception(exc)
    return future


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    """RemoteLogMetadataManager over the ``__remote_log_metadata`` topic, with snapshots.

    Life cycle: ``TopicBasedRemoteLogMetadataManager(topic_log)``, ``configure(configs)``,
    ``start()`` (creates the topic if needed, loads each metadata partition's snapshot and
    replays the records after it), then any calls, then ``close()`` (writes snapshots).
    Before ``start`` returns, reads and publishes raise RemoteStorageNotReadyException.

    Configs (rlmm prefix already stripped): ``remote.log.metadata.topic.num.partitions``
    (50), ``remote.log.metadata.topic.replication.factor`` (3; the topic log decides the
    replication factor it creates the topic with), ``remote.log.metadata.topic.retention.ms``
    (-1), ``remote.log.metadata.snapshot.interval.records`` (1000),
    ``remote.log.metadata.snapshot.interval.ms`` (60000), ``broker.id``, ``cluster.id`` and
    ``log.dir`` (required: the snapshots' home); with a remote topic log also
    ``remote.log.metadata.poll.interval.ms`` (100), ``remote.log.metadata.consume.wait.ms``
    (120000) and ``remote.log.metadata.initialization.retry.interval.ms`` (100).

    An existing topic keeps its partition count, which then wins over the configured one
    (Kafka refuses to start instead). Every metadata partition is materialised whole,
    whatever this broker leads or follows: whole partitions keep snapshots complete. A
    partition's state is dropped when its DELETE_PARTITION_FINISHED is applied, as in Kafka.

    Local topic log (``LogMetadataTopicLog``, ``InMemoryMetadataTopicLog``: one broker):
    ``start`` loads every metadata partition before it returns; a read first applies what
    other writers appended to its metadata partition since (``poll`` does it for all), so
    there is no consumer thread; leadership calls only track the assigned set
    (``assigned_partitions``), and ``is_ready`` is true once started.

    Remote topic log (one whose class says ``remote = True``: ``ClusterMetadataTopicLog``,
    the topic replicated across a cluster, its partitions led by any broker):

    - ``start`` returns at once; a loader thread creates the topic and loads the metadata
      partitions (those holding assigned partitions first), retrying every
      ``remote.log.metadata.initialization.retry.interval.ms`` until all are loaded (the
      topic cannot be created before enough brokers registered). Until a metadata partition
      is loaded, reads and publishes concerning it raise RemoteStorageNotReadyException.
      A call of the loader (or consumer) thread retries for at most
      ``BACKGROUND_CALL_DEADLINE_MS``, so a metadata partition that cannot be read (no
      leader) does not hold up the others; a failure lasting ``FAILING_WARN_AFTER_MS`` is
      logged at WARNING, then every ``FAILING_WARN_EVERY_MS`` while it lasts.
    - A consumer thread (Kafka's ConsumerTask) applies, every
      ``remote.log.metadata.poll.interval.ms``, what was appended since to each loaded
      metadata partition holding an assigned partition (one Fetch each when idle). Reads
      serve the applied state, never catching up over the network themselves.
    - ``is_ready(tip)`` (Kafka's): true once ``tip`` is assigned and its metadata partition is
      applied up to the end offset its leader reported after the assignment; a partition
      assigned as leader again (a new leadership) waits for a fresh end offset. A new leader
      waits for it before it resumes copying; a follower before it rebuilds from the remote
      metadata. ``wait_ready`` blocks for it.
    - ``close`` stops both threads and closes the topic log (its connections).

    Counters of the last load: ``replayed_records`` (records read from the log after the
    snapshots), ``replayed_records_by_partition``, ``snapshot_offsets`` (metadata partition
    -> offset of the snapshot it loaded). ``skipped_records`` counts bad records,
    ``fenced_records`` those of them a deposed leader wrote (its leader epoch was below one
    already applied for the partition; see ``RemotePartitionMetadataStore``).

    Threads: any method from any thread. A lock per metadata partition orders its appends,
    applies and snapshot writes; the store's one lock guards the caches for readers. A
    publish blocks its caller until its record is appended and applied (the returned future
    is already done) and occasionally for a snapshot write of its metadata partition.
    """

    def __init__(self, topic_log: MetadataTopicLog, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._topic_log = topic_log
        self._remote = bool(getattr(topic_log, "remote", False))
        bounded = getattr(topic_log, "bounded", None)
        # what the loader and the consumer read with (publishes use ``_topic_log``)
        self._background_log = bounded(BACKGROUND_CALL_DEADLINE_MS) \
            if self._remote and bounded is not None else topic_log
        # failing background tasks (the loader's and the consumer's keys differ):
        # what -> [failing since, next warning] (ms)
        self._failing: dict[str, list[int]] = {}
        self._clock = clock
        self._store = RemotePartitionMetadataStore()
        self._configured = False
        self._started = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()
        self._partitions: list[_MetadataPartition] = []
        # the partitioner and its memo, swapped together when the topic's count wins
        self._mapping: tuple[RemoteLogMetadataTopicPartitioner | None,
                             dict[TopicIdPartition, int]] = (None, {})
        self._assigned: set[TopicIdPartition] = set()
        self._assigned_lock = threading.RLock()
        self._ready_changed = threading.Condition(self._assigned_lock)
        self._pending: dict[TopicIdPartition, _Pending] = {}   # remote: assigned, not ready
        self._ready: set[TopicIdPartition] = set()             # remote: assigned and ready
        self._ready_listeners: list[Callable[[TopicIdPartition], None]] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.num_partitions = 50
        self.retention_ms = -1
        self.snapshot_interval_records = 1000
        self.snapshot_interval_ms = 60_000
        self.poll_interval_ms = 100
        self.consume_wait_ms = 120_000
        self.initialization_retry_interval_ms = 100
        self.broker_id = -1
        self.cluster_id: str | None = None
        self.log_dir: Path | None = None
        self.replayed_records = 0
        self.replayed_records_by_partition: dict[int, int] = {}
        self.snapshot_offsets: dict[int, int] = {}
        self.skipped_records = 0
        self.fenced_records = 0     # of them, those a deposed leader wrote

    @property
    def remote(self) -> bool:
        """Whether the topic log is remote (consumed in the background)."""
        return self._remote

    # ---- life cycle -----------------------------------------------------------------------

    def configure(self, configs: Mapping[str, Any]) -> None:
        with self._lifecycle_lock:
            if self._configured:
                log.info("topic-based RLMM is already configured; ignoring the new configs")
                return
            values = CONFIG.parse(configs)
            if not values[LOG_DIR]:
                raise InvalidConfigError(f"{LOG_DIR} config must not be null or empty.")
            self.num_partitions = values[NUM_PARTITIONS]
            self.retention_ms = values[RETENTION_MS]
            self.snapshot_interval_records = values[SNAPSHOT_INTERVAL_RECORDS]
            self.snapshot_interval_ms = values[SNAPSHOT_INTERVAL_MS]
            self.poll_interval_ms = values[POLL_INTERVAL_MS]
            self.consume_wait_ms = values[CONSUME_WAIT_MS]
            self.initialization_retry_interval_ms = values[INITIALIZATION_RETRY_INTERVAL_MS]
            self.broker_id = values[BROKER_ID]
            self.cluster_id = values[CLUSTER_ID]
            self.log_dir = Path(values[LOG_DIR])
            if values[REPLICATION_FACTOR] > 1 and not self._remote:
                log.info("%s=%d: this broker creates %s with replication factor 1",
                         REPLICATION_FACTOR, values[REPLICATION_FACTOR], REMOTE_LOG_METADATA_TOPIC_NAME)
            self._mapping = (RemoteLogMetadataTopicPartitioner(self.num_partitions), {})
            self._configured = True

    def start(self) -> None:
        """Create the topic if absent, then per metadata partition load the snapshot (if it
        is valid and fits the log) and apply the records after it. With a remote topic log
        a background thread does that (retrying until done) and this returns at once."""
        with self._lifecycle_lock:
            if not self._configured:
                raise RemoteStorageException("configure() must be called before start()")
            if self._closed:
                raise RemoteStorageException("this RemoteLogMetadataManager is closed")
            if self._started:
                return
            if self._remote:
                self._started = True
                self._threads = [
                    threading.Thread(target=self._run_loader, daemon=True,
                                     name=f"rlmm-loader-{self.broker_id}"),
                    threading.Thread(target=self._run_consumer, daemon=True,
                                     name=f"rlmm-consumer-{self.broker_id}")]
                for thread in self._threads:
                    thread.start()
                return
            self._create_topic()
            for mp in self._partitions:
                self._load(mp)
            self._started = True
            self._log_loaded()
        with self._ready_changed:
            self._ready_changed.notify_all()

    def close(self) -> None:
        """Stop the background threads (closing a remote topic log), then write the snapshots
        of partitions with records applied since their last one."""
        with self._lifecycle_lock:
            if self._closed:
                return
            self._closed = True
            threads, self._threads = self._threads, []
        self._stop.set()
        self._wake.set()
        if self._remote:
            close = getattr(self._topic_log, "close", None)
            if close is not None:
                close()  # interrupts calls blocked on a connection
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=30)
                if thread.is_alive():
                    log.warning("%s did not stop within 30 s", thread.name)
        with self._ready_changed:
            self._ready_changed.notify_all()
        for mp in self._partitions:
            with mp.lock:
                if mp.ready and mp.unsnapshotted:
                    self._write_snapshot(mp)

    def _create_topic(self) -> None:
        """Create the topic if absent and set up its (not yet loaded) metadata partitions."""
        count = self._topic_log.ensure_topic(self.num_partitions, self.retention_ms)
        if count != self.num_partitions:
            log.warning("%s has %d partitions, not %s=%d; using %d", REMOTE_LOG_METADATA_TOPIC_NAME,
                        count, NUM_PARTITIONS, self.num_partitions, count)
            self.num_partitions = count
        self._mapping = (RemoteLogMetadataTopicPartitioner(count), {})
        now = self._clock.nanoseconds()
        self._store = RemotePartitionMetadataStore()  # a retried start begins afresh
        self.replayed_records = 0
        self.replayed_records_by_partition = {}
        self.snapshot_offsets = {}
        self._partitions = [_MetadataPartition(p, now) for p in range(count)]

    def _load(self, mp: _MetadataPartition) -> None:
        """Load the snapshot (or start at the log start) and replay the rest; a failed
        attempt leaves what it applied, and the next one goes on from there."""
        topic_log = self._background_log
        with mp.lock:
            if mp.ready:
                return
            if not mp.positioned:
                if not self._load_snapshot(mp):
                    mp.next_offset = topic_log.log_start_offset(mp.partition)
                mp.positioned = True
            self._consume(mp, live=False, records=topic_log.read(mp.partition, mp.next_offset))
            self.replayed_records_by_partition[mp.partition] = mp.applied
            self.replayed_records = sum(self.replayed_records_by_partition.values())
            mp.ready = True
            self._maybe_snapshot(mp)

    def _log_loaded(self) -> None:
        log.info("topic-based RLMM loaded: %d metadata partitions, %d snapshot(s) loaded, "
                 "%d record(s) replayed", len(self._partitions), len(self.snapshot_offsets),
                 self.replayed_records)

    # ---- background threads (remote topic log) -------------------------------------------

    def _run_loader(self) -> None:
        """Create the topic and load every metadata partition, retrying until done. Each
        round tries every unloaded partition once, the next one picked after each (those
        holding assigned partitions first, an assignment made meanwhile included); a call
        retries for at most BACKGROUND_CALL_DEADLINE_MS, so a partition that cannot be read
        delays the others by that much, not by the topic log's deadline."""
        interval = self.initialization_retry_interval_ms / 1000
        creating = f"creating {REMOTE_LOG_METADATA_TOPIC_NAME}"
        while not self._stop.is_set():
            try:
                if not self._partitions:
                    self._create_topic()
                    self._recovered(creating)
                tried: set[int] = set()
                while (mp := next((m for m in self._loading_order() if m.partition not in tried),
                                  None)) is not None:
                    if self._stop.is_set():
                        return
                    tried.add(mp.partition)
                    what = f"loading {REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition}"
                    try:
                        self._load(mp)
                    except Exception as exc:  # noqa: BLE001 - retried next round
                        self._report(what, exc)
                        continue
                    self._recovered(what)
                    self._wake.set()  # the consumer may now read its end offsets
                    with self._ready_changed:
                        self._ready_changed.notify_all()
                if all(mp.ready for mp in self._partitions):
                    self._log_loaded()
                    return
            except Exception as exc:  # noqa: BLE001 - retried after the interval
                self._report(creating, exc)
            self._stop.wait(interval)

    def _loading_order(self) -> list[_MetadataPartition]:
        """Unloaded metadata partitions, those holding assigned partitions first."""
        with self._assigned_lock:
            wanted = {self.metadata_partition(tip) for tip in self._assigned}
        unloaded = [mp for mp in self._partitions if not mp.ready]
        return sorted(unloaded, key=lambda mp: (mp.partition not in wanted, mp.partition))

    def _report(self, what: str, exc: BaseException) -> None:
        """Log a background task's failure: INFO the first time, DEBUG while it repeats, but
        WARNING once it has failed for FAILING_WARN_AFTER_MS, then every
        FAILING_WARN_EVERY_MS (a start may well fail for a while; a stuck one must show)."""
        now = self._clock.milliseconds()
        state = self._failing.get(what)
        if state is None:
            self._failing[what] = [now, now + FAILING_WARN_AFTER_MS]
            log.info("%s failed (retrying): %s: %s", what, type(exc).__name__, exc)
            return
        since, next_warning = state
        if now < next_warning:
            log.debug("%s failed (retrying): %s: %s", what, type(exc).__name__, exc)
            return
        state[1] = now + FAILING_WARN_EVERY_MS
        log.warning("%s has been failing for %d s (retrying): %s: %s", what,
                    (now - since) // 1000, type(exc).__name__, exc)

    def _recovered(self, what: str) -> None:
        state = self._failing.pop(what, None) if self._failing else None
        if state is not None:
            log.info("%s succeeded after failing for %d s", what,
                     (self._clock.milliseconds() - state[0]) // 1000)

    def _run_consumer(self) -> None:
        """Kafka's ConsumerTask: read end offsets for new assignments, apply what others
        appended to the metadata partitions in use, mark partitions ready; then wait."""
        while not self._stop.is_set():
            try:
                self._consume_round()
            except Exception:  # noqa: BLE001 - the thread must survive anything
                if self._stop.is_set():
                    return
                log.exception("remote log metadata consumer round failed")
            self._wake.wait(self.poll_interval_ms / 1000)
            self._wake.clear()

    def _consume_round(self) -> None:
        partitions = self._partitions
        if not partitions:
            return
        with self._assigned_lock:
            in_use = {self.metadata_partition(tip) for tip in self._assigned}
            unread: dict[int, list[_Pending]] = {}
            for tip, pending in self._pending.items():
                if pending.target is None:
                    unread.setdefault(self.metadata_partition(tip), []).append(pending)
        for p in sorted(unread):
            if self._stop.is_set() or not partitions[p].ready:
                continue
            try:
                end = self._background_log.end_offset(p)
            except Exception as exc:  # noqa: BLE001 - next round
                self._poll_failed(p, exc)
                continue
            with self._assigned_lock:
                for pending in unread[p]:
                    if pending.target is None:
                        pending.target = end
        for p in sorted(in_use):
            if self._stop.is_set():
                return
            mp = partitions[p]
            if not mp.ready:
                continue
            try:
                self._poll_partition(mp)
            except Exception as exc:  # noqa: BLE001 - next round
                self._poll_failed(p, exc)
                continue
            self._recovered(f"reading {REMOTE_LOG_METADATA_TOPIC_NAME}-{p}")
        self._mark_ready(partitions)
        for mp in partitions:  # the time trigger of snapshots
            if mp.ready and mp.unsnapshotted and mp.lock.acquire(blocking=False):
                try:
                    self._maybe_snapshot(mp)
                finally:
                    mp.lock.release()

    def _poll_failed(self, partition: int, exc: BaseException) -> None:
        self._report(f"reading {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition}", exc)

    def _poll_partition(self, mp: _MetadataPartition) -> int:
        """Read what follows the applied records (off the lock), then apply it; skipped while a
        publish holds the lock, since a publish applies everything up to its own record."""
        records = list(itertools.islice(self._background_log.read(mp.partition, mp.next_offset),
                                        POLL_MAX_RECORDS))
        if not records or not mp.lock.acquire(blocking=False):
            return 0
        try:
            if self._closed:
                return 0
            count = self._consume(mp, live=True, records=records)
            self._maybe_snapshot(mp)
            return count
        finally:
            mp.lock.release()

    def _mark_ready(self, partitions: list[_MetadataPartition]) -> None:
        with self._assigned_lock:
            done = [tip for tip, pending in self._pending.items()
                    if pending.target is not None
                    and partitions[self.metadata_partition(tip)].ready
                    and partitions[self.metadata_partition(tip)].next_offset >= pending.target]
            for tip in done:
                del self._pending[tip]
                self._ready.add(tip)
            if done:
                self._ready_changed.notify_all()
            listeners = list(self._ready_listeners) if done else []
        for tip in done:
            for listener in listeners:
                try:
                    listener(tip)
                except Exception:  # noqa: BLE001 - a listener's failure is its own
                    log.exception("remote log metadata ready listener failed for %s", tip)

    # ---- publishing -----------------------------------------------------------------------

    def add_remote_log_segment_metadata(
            self, remote_log_segment_metadata: RemoteLogSegmentMetadata) -> concurrent.futures.Future[None]:
        metadata = remote_log_segment_metadata
        if metadata.state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            raise ValueError(f"Given remoteLogSegmentMetadata should have state as "
                             f"{RemoteLogSegmentState.COPY_SEGMENT_STARTED.name} but it contains "
                             f"state as: {metadata.state.name}")

        def validate() -> None:
            existing = self._store.segment(metadata.remote_log_segment_id)
            _check(RemoteLogSegmentState, existing.state if existing else None, metadata.state,
                   f"segment {metadata.remote_log_segment_id.id}")
        return self._publish(metadata.topic_id_partition, metadata, validate)

    def update_remote_log_segment_metadata(
            self, remote_log_segment_metadata_update: RemoteLogSegmentMetadataUpdate) -> concurrent.futures.Future[None]:
        update = remote_log_segment_metadata_update
        if update.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            raise ValueError(f"Given remoteLogSegmentMetadata should not have the state as: "
                             f"{RemoteLogSegmentState.COPY_SEGMENT_STARTED.name}")

        def validate() -> None:
            existing = self._store.segment(update.remote_log_segment_id)
            if existing is None:
                raise RemoteResourceNotFoundException(
                    f"No remote log segment metadata found for: {update.remote_log_segment_id}")
            _check(RemoteLogSegmentState, existing.state, update.state,
                   f"segment {update.remote_log_segment_id.id}")
        return self._publish(update.topic_id_partition, update, validate)

    def put_remote_partition_delete_metadata(
            self, remote_partition_delete_metadata: RemotePartitionDeleteMetadata) -> concurrent.futures.Future[None]:
        delete = remote_partition_delete_metadata

        def validate() -> None:
            current = self._store.delete_state(delete.topic_id_partition)
            _check(RemotePartitionDeleteState, current.state if current else None, delete.state,
                   f"partition {delete.topic_id_partition}")
        return self._publish(delete.topic_id_partition, delete, validate)

    def _publish(self, tip: TopicIdPartition, metadata: RemoteLogMetadata,
                 validate: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Validate against the caught-up state, append, apply through the appended offset.

        The record counts as applied once the offset the append returned is; with a remote
        topic log also once a record with the very same value is applied at or after the
        offset the append started from: an attempt of a retried append that landed although
        it seemed to fail (the append may even give up after such an attempt).
        """
        self._ensure_running()
        value = serialize(metadata)  # type: ignore[arg-type]
        mp = self._loaded(tip)
        with mp.lock:
            self._ensure_running()
            try:
                self._consume(mp, live=True)
            except Exception as exc:
                return _failed(exc, f"reading {REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition}")
            fence = self._store.fence(tip)
            if 0 <= metadata.leader_epoch < fence:
                raise FencedLeaderEpochException(
                    f"{tip} has an event of leader epoch {fence}; not publishing {metadata} "
                    f"of epoch {metadata.leader_epoch}")
            validate()
            mine: list[int] = []
            refused: dict[int, Exception] = {}

            def seen(offset: int, applied: bytes, error: Exception | None) -> None:
                if applied == value:
                    mine.append(offset)
                    if error is not None:
                        refused[offset] = error
            try:
                try:
                    offset = self._topic_log.append(mp.partition, value)
                except Exception as exc:
                    if not self._remote:
                        raise
                    # the append gave up, but one of its attempts may have landed
                    try:
                        self._consume(mp, live=True, on_record=seen)
                    except Exception:  # noqa: BLE001 - the append's error says more
                        raise exc from None
                    if not mine:
                        raise
                    offset = mine[0]
                self._consume_through(mp, offset, seen, mine)
            except Exception as exc:
                return _failed(exc, f"storing {metadata} in {REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition}")
            self._maybe_snapshot(mp)
            # What every reader did with it: refused (a successor's event came first, or a
            # concurrent writer's made the transition illegal) is a failure of the publish.
            error = refused.get(min((m for m in mine if m <= offset), default=offset))
            if error is not None:
                return _failed(error, f"{REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition} "
                                      f"refused {metadata}")
        return _completed()

    def _consume_through(self, mp: _MetadataPartition, offset: int,
                         on_record: Callable[[int, bytes, Exception | None], None],
                         mine: list[int]) -> None:
        """Apply records until ``offset`` is applied; with a remote log also until a copy of
        its value from an earlier attempt (``mine``, at or below ``offset``) is, reading the
        leader (whose high watermark may trail the append's acknowledgement after a leader
        change) for up to ``consume_wait_ms``."""
        deadline = time.monotonic() + self.consume_wait_ms / 1000
        while True:
            self._consume(mp, live=True, on_record=on_record)
            if mp.next_offset > offset or (self._remote and any(m <= offset for m in mine)):
                return
            if not self._remote or time.monotonic() >= deadline or \
                    self._stop.wait(min(self.poll_interval_ms / 1000, max(0.0, deadline - time.monotonic()))):
                raise RemoteStorageException(
                    f"{REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition} offset {offset} is not "
                    f"readable after its append (read up to {mp.next_offset})")

    # ---- reads ----------------------------------------------------------------------------

    def poll(self) -> int:
        """Apply what other writers appended to any (loaded) metadata partition; the records
        read. Never required: with a local topic log reads do this for their own metadata
        partition, with a remote one the consumer thread for those in use."""
        self._ensure_running()
        if not self._remote:
            return sum(self._catch_up(mp) for mp in self._partitions)
        total = 0
        for mp in self._partitions:
            if mp.ready:
                with mp.lock:
                    total += self._consume(mp, live=True)
                    self._maybe_snapshot(mp)
        return total

    def remote_log_segment_metadata(self, topic_id_partition: TopicIdPartition, epoch_for_offset: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        self._ensure_ready(topic_id_partition)
        return self._store.remote_log_segment_metadata(topic_id_partition, epoch_for_offset, offset)

    def highest_offset_for_epoch(self, topic_id_partition: TopicIdPartition, leader_epoch: int) -> int | None:
        self._ensure_ready(topic_id_partition)
        return self._store.highest_offset_for_epoch(topic_id_partition, leader_epoch)

    def list_remote_log_segments(self, topic_id_partition: TopicIdPartition,
                                 leader_epoch: int | None = None) -> Iterator[RemoteLogSegmentMetadata]:
        self._ensure_ready(topic_id_partition)
        return iter(self._store.list_remote_log_segments(topic_id_partition, leader_epoch))

    def remote_log_size(self, topic_id_partition: TopicIdPartition, leader_epoch: int) -> int:
        self._ensure_ready(topic_id_partition)
        return self._store.remote_log_size(topic_id_partition, leader_epoch)

    def remote_partition_delete_metadata(self, topic_id_partition: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        """The partition's latest delete state, or None (none, or DELETE_PARTITION_FINISHED)."""
        self._ensure_ready(topic_id_partition)
        return self._store.delete_state(topic_id_partition)

    def describe(self) -> Iterator[RemoteLogMetadata]:
        """Every live segment (by partition, then start offset) and partition delete state,
        for tools such as ``strata tiered metadata``."""
        self.poll()
        return self._store.describe()

    def cache_copy(self, topic_id_partition: TopicIdPartition) -> RemoteLogMetadataCache | None:
        """An independent copy of a partition's cache, or None (tests, tools)."""
        self._ensure_ready(topic_id_partition)
        return self._store.cache_copy(topic_id_partition)

    def metadata_partition(self, topic_id_partition: TopicIdPartition) -> int:
        """The ``__remote_log_metadata`` partition holding this partition's events."""
        partitioner, memo = self._mapping
        found = memo.get(topic_id_partition)
        if found is None:
            if partitioner is None:
                raise RemoteStorageNotReadyException("configure() has not been called")
            found = memo[topic_id_partition] = partitioner.metadata_partition(topic_id_partition)
        return found

    def read_offset(self, metadata_partition: int) -> int | None:
        """The next offset to apply in a metadata partition, None before it is replayed."""
        if not 0 <= metadata_partition < len(self._partitions):
            return None
        mp = self._partitions[metadata_partition]
        return mp.next_offset if mp.ready else None

    # ---- assignment -----------------------------------------------------------------------

    def on_partition_leadership_changes(self, leader_partitions: AbstractSet[TopicIdPartition],
                                        follower_partitions: AbstractSet[TopicIdPartition]) -> None:
        """Add to the assigned set. With a remote topic log, a partition assigned anew, or as
        leader, is not ready until its metadata partition is applied up to the end offset
        read after this call (a follower already assigned stays as it is)."""
        if self._closed:
            raise RemoteStorageException("this RemoteLogMetadataManager is closed")
        with self._assigned_lock:
            if self._remote:
                for tip in leader_partitions:
                    pending = self._pending.get(tip)
                    if pending is None or pending.target is not None:
                        self._ready.discard(tip)
                        self._pending[tip] = _Pending()
                for tip in follower_partitions:
                    if tip not in self._assigned and tip not in leader_partitions:
                        self._pending[tip] = _Pending()
            self._assigned |= set(leader_partitions) | set(follower_partitions)
        if self._remote:
            self._wake.set()

    def on_stop_partitions(self, partitions: AbstractSet[TopicIdPartition]) -> None:
        if self._closed:
            raise RemoteStorageException("this RemoteLogMetadataManager is closed")
        with self._assigned_lock:
            self._assigned -= set(partitions)
            for tip in partitions:
                self._pending.pop(tip, None)
                self._ready.discard(tip)

    def assigned_partitions(self) -> frozenset[TopicIdPartition]:
        with self._assigned_lock:
            return frozenset(self._assigned)

    def is_ready(self, topic_id_partition: TopicIdPartition) -> bool:
        """Local topic log: started. Remote: assigned and applied up to the end offset its
        metadata partition had after the assignment (see ``on_partition_leadership_changes``)."""
        if not self._started or self._closed:
            return False
        if self._remote:
            with self._assigned_lock:
                return topic_id_partition in self._ready
        return self._partitions[self.metadata_partition(topic_id_partition)].ready

    def add_ready_listener(self, listener: Callable[[TopicIdPartition], None]) -> None:
        """Call ``listener(tip)`` (on the consumer thread, outside locks) each time an
        assigned partition becomes ready (remote topic log only)."""
        with self._assigned_lock:
            self._ready_listeners.append(listener)

    def wait_ready(self, topic_id_partition: TopicIdPartition, timeout_s: float) -> bool:
        """Block until ``is_ready`` or ``timeout_s`` passed (or the manager closed); is_ready."""
        deadline = time.monotonic() + timeout_s
        with self._ready_changed:
            while not self.is_ready(topic_id_partition):
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return False
                self._ready_changed.wait(left)
            return True

    # ---- consuming ------------------------------------------------------------------------

    def _consume(self, mp: _MetadataPartition, *, live: bool,
                 records: Iterable[tuple[int, bytes]] | None = None,
                 on_record: Callable[[int, bytes, Exception | None], None] | None = None) -> int:
        """Apply the partition's records from ``mp.next_offset`` to the high watermark (or
        those of ``records`` at or after it, read from there earlier); the number applied,
        each also handed to ``on_record`` with the reason it was refused (None: it was
        not). Caller holds ``mp.lock``."""
        if records is None:
            records = self._topic_log.read(mp.partition, mp.next_offset)
        count = 0
        try:
            for offset, value in records:
                if offset < mp.next_offset:
                    continue
                error = self._apply(mp.partition, offset, value, live)
                mp.next_offset = offset + 1
                mp.last_value_crc = _crc32c.crc32c(value)
                count += 1
                if on_record is not None:
                    on_record(offset, value, error)
        finally:
            mp.unsnapshotted += count
            mp.applied += count
        return count

    def _apply(self, partition: int, offset: int, value: bytes, live: bool) -> Exception | None:
        """Apply one record; the reason it was skipped, if it was."""
        try:
            metadata = deserialize(value)
            if isinstance(metadata, RemoteLogSegmentMetadataSnapshot):
                raise MetadataParseException("a snapshot record has no place in the topic")
            self._store.handle(metadata)
            return None
        except (ValueError, RemoteStorageException) as exc:
            self.skipped_records += 1
            if isinstance(exc, FencedLeaderEpochException):
                self.fenced_records += 1
            # Replaying a topic whose start was deleted by retention meets updates of
            # segments it never saw: expected then, worth a warning otherwise.
            quiet = not live and isinstance(exc, RemoteResourceNotFoundException)
            log.log(logging.DEBUG if quiet else logging.WARNING, "skipping %s-%d offset %d: %s",
                    REMOTE_LOG_METADATA_TOPIC_NAME, partition, offset, exc)
            return exc

    # ---- snapshots ------------------------------------------------------------------------

    def _snapshot_path(self, partition: int) -> Path:
        assert self.log_dir is not None
        return snapshot_path(self.log_dir, partition)

    def _maybe_snapshot(self, mp: _MetadataPartition) -> None:
        if not mp.unsnapshotted:
            return
        by_count = 0 < self.snapshot_interval_records <= mp.unsnapshotted
        by_time = self.snapshot_interval_ms > 0 and \
            self._clock.nanoseconds() - mp.last_snapshot_ns >= self.snapshot_interval_ms * 1_000_000
        if by_count or by_time:
            self._write_snapshot(mp)

    def _write_snapshot(self, mp: _MetadataPartition) -> None:
        """Write the partition's snapshot (caller holds ``mp.lock``); a failure only logs."""
        tips = [tip for tip in self._store.partitions()
                if self.metadata_partition(tip) == mp.partition]
        columns, deletes = self._store.export_columns(tips)  # lazy caches stay lazy
        fences = [(tip, epoch) for tip, epoch in self._store.fences().items()
                  if self.metadata_partition(tip) == mp.partition]
        data = _encode_columns(mp.partition, mp.next_offset, mp.last_value_crc, columns, deletes,
                               fences)
        path = self._snapshot_path(mp.partition)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        except OSError as exc:
            log.warning("could not write the snapshot %s: %s", path, exc)
            return
        mp.unsnapshotted = 0
        mp.last_snapshot_ns = self._clock.nanoseconds()

    def _load_snapshot(self, mp: _MetadataPartition) -> bool:
        """Restore the partition's snapshot into the store if it is valid and fits the log."""
        path = self._snapshot_path(mp.partition)
        try:
            snapshot = _read_snapshot(path.read_bytes())
            self._check_snapshot(mp.partition, snapshot)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            log.warning("ignoring the snapshot %s, replaying %s-%d from its start: %s", path,
                        REMOTE_LOG_METADATA_TOPIC_NAME, mp.partition, exc)
            return False
        for tip, cache in snapshot.caches:
            self._store.restore_partition(tip, cache)
        for delete in snapshot.delete_states:
            self._store.restore_delete_state(delete)
        for tip, epoch in snapshot.fences:
            self._store.restore_fence(tip, epoch)
        mp.next_offset = snapshot.next_offset
        mp.last_value_crc = snapshot.last_value_crc
        if snapshot.version != SNAPSHOT_VERSION:
            # an older format: rewritten in this one by the next snapshot (time trigger, close)
            mp.unsnapshotted = max(mp.unsnapshotted, 1)
        self.snapshot_offsets[mp.partition] = snapshot.next_offset
        return True

    def _check_snapshot(self, partition: int, snapshot: _LoadedSnapshot) -> None:
        if snapshot.metadata_partition != partition:
            raise SnapshotError(f"it is the snapshot of partition {snapshot.metadata_partition}")
        start = self._background_log.log_start_offset(partition)
        end = self._background_log.end_offset(partition)
        if not start <= snapshot.next_offset <= end:
            raise SnapshotError(f"its offset {snapshot.next_offset} is outside the log's "
                                f"[{start}, {end}]")
        last = snapshot.next_offset - 1
        if snapshot.last_value_crc >= 0 and last >= start:
            found = next(iter(self._background_log.read(partition, last)), None)
            if found is None or found[0] != last or _crc32c.crc32c(found[1]) != snapshot.last_value_crc:
                raise SnapshotError(f"the log's record at offset {last} is not the one it covers")
        for tip, _ in snapshot.caches:
            if self.metadata_partition(tip) != partition:
                raise SnapshotError(f"{tip} does not belong in this metadata partition")
        for delete in snapshot.delete_states:
            if self.metadata_partition(delete.topic_id_partition) != partition:
                raise SnapshotError(f"{delete.topic_id_partition} does not belong in this metadata partition")
        for tip, _ in snapshot.fences:
            if self.metadata_partition(tip) != partition:
                raise SnapshotError(f"{tip} does not belong in this metadata partition")

    # ---- state checks ---------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._closed:
            raise RemoteStorageException("this RemoteLogMetadataManager is closed")
        if not self._started:
            raise RemoteStorageNotReadyException("the topic-based RLMM has not started yet")

    def _loaded(self, tip: TopicIdPartition) -> _MetadataPartition:
        """The metadata partition of ``tip``; RemoteStorageNotReadyException until loaded."""
        partitions = self._partitions
        if not partitions:
            raise RemoteStorageNotReadyException(f"{REMOTE_LOG_METADATA_TOPIC_NAME} is not loaded yet")
        mp = partitions[self.metadata_partition(tip)]
        if not mp.ready:
            raise RemoteStorageNotReadyException(f"remote log metadata of {tip} is not loaded yet")
        return mp

    def _ensure_ready(self, tip: TopicIdPartition) -> None:
        """Check a read may be served; with a local topic log, after applying what others
        appended meanwhile (a remote one is applied by the consumer thread)."""
        self._ensure_running()
        mp = self._loaded(tip)
        if not self._remote:
            self._catch_up(mp)

    def _catch_up(self, mp: _MetadataPartition) -> int:
        if self._topic_log.end_offset(mp.partition) <= mp.next_offset:
            return 0
        with mp.lock:
            try:
                count = self._consume(mp, live=True)
            except RemoteStorageException:
                raise
            except Exception as exc:
                raise RemoteStorageException(
                    f"reading {REMOTE_LOG_METADATA_TOPIC_NAME}-{mp.partition}: {exc}") from exc
            self._maybe_snapshot(mp)
            return count


def _check(states: Any, src: Any, dst: Any, what: str) -> None:
    if not states.is_valid_transition(src, dst):
        raise IllegalStateTransition(f"{what} can not move from {src.name if src else 'nothing'} "
                                     f"to {dst.name}")
