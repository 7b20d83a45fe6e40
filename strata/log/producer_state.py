"""Idempotent and transactional producer state of one partition, as Kafka 4.x keeps it.

For every producer id that has written to the partition we remember its epoch, the metadata of
its last few batches (for duplicate detection and sequence validation), the coordinator epoch of
its last transaction marker and the first offset of its ongoing transaction, if any. The state is
rebuilt on restart from the newest ``<offset>.snapshot`` file plus a replay of the log above it.

Append protocol (the log drives it, under the partition's log lock):

1. ``find_duplicate(header)`` for client batches carrying a producer id: a retry of one of the
   producer's last five batches is acknowledged with the original offsets instead of appended.
2. ``prepare_update(pid, origin)`` and ``append_info.append_batch(header, buf)`` for each batch of
   that producer: validates epoch, sequence and transaction state against a private copy of the
   producer's entry, and returns a ``CompletedTxn`` for a COMMIT/ABORT marker. The manager itself
   is untouched until step 3, so a batch rejected halfway leaves no trace.
3. Once the bytes are in the segment: ``update(append_info)``, ``update_map_end_offset(next)``,
   and for each completed transaction ``last_stable_offset(txn)`` (for the .txnindex entry of an
   aborted one) followed by ``complete_txn(txn)``.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.files import TMP_SUFFIX, atomic_write
from strata.common.errors import (
    CorruptRecordError, ErrorCode, InvalidProducerEpochError, InvalidTxnStateError, KafkaError,
    KafkaStorageError, OutOfOrderSequenceError)
from strata.common.types import TopicPartition
from strata.protocol.records import (
    CONTROL_ABORT, CONTROL_COMMIT, HEADER_SIZE, BatchHeader, control_type, crc32c, read_varint)

log = logging.getLogger(__name__)

INT32_MAX = 0x7FFFFFFF
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NUM_BATCHES_TO_RETAIN = 5

SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"

PRODUCER_SNAPSHOT_VERSION = 1

_SNAPSHOT_HEADER = struct.Struct(">hIi")     # version, crc, entry count
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")  # 46 bytes, see ProducerStateManager
_CRC_START = 6                               # the CRC covers bytes 6..EOF (count + entries)
assert _SNAPSHOT_ENTRY.size == 46

# Transaction versions (KIP-890). TV2 coordinators bump the epoch before writing the marker.
TV_0 = 0
TV_2 = 2


class CorruptSnapshotError(KafkaStorageError):
    """A producer snapshot failed validation (version, CRC or layout); delete it and rebuild."""


class TransactionCoordinatorFencedError(KafkaError):
    """Kafka TRANSACTION_COORDINATOR_FENCED (52): a marker from an older coordinator epoch."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class AppendOrigin(Enum):
    """Who is appending, which decides how much is validated.

    CLIENT batches get full validation (epoch and sequence); REPLICATION batches (and batches
    replayed from the log during recovery) were validated by the leader, so a stale epoch is only
    logged; COORDINATOR batches (offset commits, transaction markers) carry no sequence numbers,
    so only the epoch is checked.
    """

    CLIENT = "client"
    REPLICATION = "replication"
    COORDINATOR = "coordinator"


# ---------------------------------------------------------------------------------------------
# sequence arithmetic (int32, wrapping from 2^31-1 to 0)


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


# ---------------------------------------------------------------------------------------------
# value types


class BatchMetadata(NamedTuple):
    """What is remembered of one appended batch: enough to recognise its retry."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker; ``last_offset`` is the marker's offset (inclusive)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool

    def aborted_txn_fields(self, last_stable_offset: int) -> tuple[int, int, int, int]:
        """``(producer_id, first_offset, last_offset, last_stable_offset)``: a .txnindex entry."""
        return (self.producer_id, self.first_offset, self.last_offset, last_stable_offset)


@dataclass
class TxnMetadata:
    """A transaction that is ongoing (``last_offset is None``) or completed but unreplicated."""

    producer_id: int
    first_offset: int
    last_offset: int | None = None


class ProducerStateEntry:
    """The state of one producer id.

    ``batch_metadata`` holds up to ``NUM_BATCHES_TO_RETAIN`` batches of the current epoch, oldest
    (lowest sequence) first; a new epoch clears it.
    """

    __slots__ = ("producer_id", "producer_epoch", "batch_metadata", "coordinator_epoch",
                 "last_timestamp", "current_txn_first_offset")

    def __init__(self, producer_id: int, producer_epoch: int = NO_PRODUCER_EPOCH,
                 coordinator_epoch: int = -1, last_timestamp: int = NO_TIMESTAMP,
                 current_txn_first_offset: int = -1,
                 batch_metadata: Iterable[BatchMetadata] = ()):
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.coordinator_epoch = coordinator_epoch
        self.last_timestamp = last_timestamp
        self.current_txn_first_offset = current_txn_first_offset
        self.batch_metadata: deque[BatchMetadata] = deque(batch_metadata,
                                                          maxlen=NUM_BATCHES_TO_RETAIN)

    @classmethod
    def empty(cls, producer_id: int) -> "ProducerStateEntry":
        return cls(producer_id)

    # -- derived ------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        """True when no batch metadata is held (a new producer, or one loaded without batches)."""
        return not self.batch_metadata

    @property
    def has_ongoing_txn(self) -> bool:
        return self.current_txn_first_offset >= 0

    @property
    def first_seq(self) -> int:
        return self.batch_metadata[0].first_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batch_metadata[-1].offset_delta if self.batch_metadata else 0

    # -- mutation -----------------------------------------------------------------------------

    def copy_without_batches(self) -> "ProducerStateEntry":
        """Same epochs, timestamp and ongoing txn, no batch metadata: the start of an append."""
        return ProducerStateEntry(self.producer_id, self.producer_epoch, self.coordinator_epoch,
                                  self.last_timestamp, self.current_txn_first_offset)

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        if self.producer_epoch != producer_epoch:
            self.batch_metadata.clear()
            self.producer_epoch = producer_epoch
            return True
        return False

    def add_batch(self, producer_epoch: int, last_seq: int, last_offset: int, offset_delta: int,
                  timestamp: int) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self.batch_metadata.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def end_txn(self, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> None:
        """Apply a transaction marker: new epochs, no ongoing transaction."""
        self.maybe_update_producer_epoch(producer_epoch)
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = -1
        self.last_timestamp = timestamp

    def update(self, next_entry: "ProducerStateEntry") -> None:
        """Merge the result of an append (``next_entry``) into this, the stored entry."""
        self.maybe_update_producer_epoch(next_entry.producer_epoch)
        self.batch_metadata.extend(next_entry.batch_metadata)
        self.coordinator_epoch = next_entry.coordinator_epoch
        self.current_txn_first_offset = next_entry.current_txn_first_offset
        self.last_timestamp = next_entry.last_timestamp

    # -- lookup -------------------------------------------------------------------------------

    def find_duplicate_batch(self, header: BatchHeader) -> BatchMetadata | None:
        """The retained batch with the same epoch and exactly the same sequence range, if any."""
        if header.producer_epoch != self.producer_epoch:
            return None
        return self.batch_with_sequence_range(header.base_sequence, header.last_sequence)

    def batch_with_sequence_range(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for metadata in self.batch_metadata:
            if metadata.first_seq == first_seq and metadata.last_seq == last_seq:
                return metadata
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateEntry):
            return NotImplemented
        return (self.producer_id == other.producer_id
                and self.producer_epoch == other.producer_epoch
                and self.coordinator_epoch == other.coordinator_epoch
                and self.last_timestamp == other.last_timestamp
                and self.current_txn_first_offset == other.current_txn_first_offset
                and list(self.batch_metadata) == list(other.batch_metadata))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (f"ProducerStateEntry(producer_id={self.producer_id}, "
                f"producer_epoch={self.producer_epoch}, "
                f"coordinator_epoch={self.coordinator_epoch}, "
                f"last_timestamp={self.last_timestamp}, "
                f"current_txn_first_offset={self.current_txn_first_offset}, "
                f"batch_metadata={list(self.batch_metadata)})")


# ---------------------------------------------------------------------------------------------
# control records


def _end_txn_marker(buf, header: BatchHeader) -> tuple[int, int, int]:
    """``(control type, coordinator epoch, record timestamp)`` of a marker batch's one record.

    The value is ``version i16 | coordinatorEpoch i32``; later versions are read as version 0,
    as Kafka does. Control batches are never compressed.
    """
    try:
        ctype = control_type(buf, header)
        pos = header.position + HEADER_SIZE
        _, pos = read_varint(buf, pos)                # record length
        pos += 1                                      # attributes
        ts_delta, pos = read_varint(buf, pos)
        _, pos = read_varint(buf, pos)                # offset delta
        key_len, pos = read_varint(buf, pos)
        pos += max(key_len, 0)
        value_len, pos = read_varint(buf, pos)
        if value_len < 6:
            raise CorruptRecordError(
                f"end transaction marker value is {value_len} bytes, at least 6 expected")
        version, coordinator_epoch = struct.unpack_from(">hi", buf, pos)
    except (ValueError, IndexError, struct.error) as e:
        raise CorruptRecordError(f"unreadable control record at offset {header.base_offset}: {e}")
    if version < 0:
        raise CorruptRecordError(f"invalid end transaction marker version {version}")
    if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise CorruptRecordError(
            f"control type {ctype} at offset {header.base_offset} is not a transaction marker")
    if header.is_log_append_time:
        timestamp = header.max_timestamp
    else:
        timestamp = header.base_timestamp + ts_delta
    return ctype, coordinator_epoch, timestamp


# ---------------------------------------------------------------------------------------------
# validation of one append


class ProducerAppendInfo:
    """Validates one producer's batches of one append against its state before the append.

    Works on a private copy of the producer's entry (``to_entry()``); the manager is changed only
    by ``ProducerStateManager.update(self)``. Headers must carry their final (assigned) offsets
    and, for LogAppendTime, the broker-assigned max timestamp.
    """

    def __init__(self, topic_partition: TopicPartition, producer_id: int,
                 current_entry: ProducerStateEntry, origin: AppendOrigin):
        self.topic_partition = topic_partition
        self.producer_id = producer_id
        self.origin = origin
        self._current = current_entry
        self._updated = current_entry.copy_without_batches()
        self._updated.producer_id = producer_id
        self._started: list[TxnMetadata] = []

    # -- checks -------------------------------------------------------------------------------

    def _check_producer_epoch(self, producer_epoch: int, offset: int, origin: AppendOrigin,
                              transaction_version: int) -> None:
        current = self._updated.producer_epoch
        strict = transaction_version >= TV_2
        if (producer_epoch <= current) if strict else (producer_epoch < current):
            if (strict and producer_epoch == current
                    and not self._updated.has_ongoing_txn):
                # A TV2 marker retried after it was written: the transaction already ended.
                log.info("Idempotent transaction marker retry for producer %d epoch %d in %s",
                         self.producer_id, producer_epoch, self.topic_partition)
                return
            message = (f"Epoch of producer {self.producer_id} at offset {offset} in "
                       f"{self.topic_partition} is {producer_epoch}, which is "
                       f"{'<=' if strict else '<'} the last seen epoch {current} "
                       f"(TV{transaction_version})")
            if origin is AppendOrigin.REPLICATION:
                log.warning(message)
            else:
                raise InvalidProducerEpochError(message)

    def _check_sequence(self, producer_epoch: int, first_seq: int, offset: int) -> None:
        updated = self._updated
        if producer_epoch != updated.producer_epoch:
            # A new epoch must start at sequence 0, unless the producer is unknown here.
            if first_seq != 0 and updated.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"Invalid sequence number for new epoch of producer {self.producer_id} at "
                    f"offset {offset} in {self.topic_partition}: {producer_epoch} (request "
                    f"epoch), {first_seq} (seq. number), {updated.producer_epoch} (current "
                    f"producer epoch)")
            return
        if not updated.is_empty:
            last_seq = updated.last_seq
        elif producer_epoch == self._current.producer_epoch:
            last_seq = self._current.last_seq
        else:
            last_seq = NO_SEQUENCE
        # With no known epoch (all the producer's records were deleted by retention or
        # DeleteRecords) any sequence is accepted.
        if not (self._current.producer_epoch == NO_PRODUCER_EPOCH
                or _in_sequence(last_seq, first_seq)):
            raise OutOfOrderSequenceError(
                f"Out of order sequence number for producer {self.producer_id} at offset "
                f"{offset} in {self.topic_partition}: {first_seq} (incoming seq. number), "
                f"{last_seq} (current end sequence number)")

    # -- appends ------------------------------------------------------------------------------

    def append_batch(self, header: BatchHeader, buf=None, origin: AppendOrigin | None = None,
                     transaction_version: int | None = None) -> CompletedTxn | None:
        """Validate and record one batch; a COMMIT/ABORT marker returns its ``CompletedTxn``.

        ``buf`` holds the batch at ``header.position`` (needed for control batches only).
        ``transaction_version`` applies to markers: 2 and above enforce the KIP-890 rule that a
        marker's epoch exceeds the producer's; ``None`` means legacy (TV0/1) validation, which is
        also what a follower or a recovery replay must use.
        """
        origin = self.origin if origin is None else origin
        if header.is_control:
            if header.record_count == 0:
                # Empty control batch: the cleaner removed the whole transaction.
                return None
            if buf is None:
                raise ValueError("a control batch needs its bytes to read the marker")
            ctype, coordinator_epoch, timestamp = _end_txn_marker(buf, header)
            return self.append_end_txn_marker(
                ctype, coordinator_epoch, header.producer_epoch, header.base_offset, timestamp,
                origin, TV_0 if transaction_version is None else transaction_version)
        self.append_data_batch(header.producer_epoch, header.base_sequence, header.last_sequence,
                               header.max_timestamp, header.base_offset, header.last_offset,
                               header.is_transactional, origin)
        return None

    def append_data_batch(self, epoch: int, first_seq: int, last_seq: int, last_timestamp: int,
                          first_offset: int, last_offset: int, is_transactional: bool,
                          origin: AppendOrigin | None = None) -> None:
        origin = self.origin if origin is None else origin
        self._check_producer_epoch(epoch, first_offset, origin, TV_0)
        if origin is AppendOrigin.CLIENT:
            self._check_sequence(epoch, first_seq, first_offset)
        updated = self._updated
        updated.add_batch(epoch, last_seq, last_offset, last_offset - first_offset,
                          last_timestamp)
        if updated.has_ongoing_txn and not is_transactional:
            raise InvalidTxnStateError(
                f"Expected transactional write from producer {self.producer_id} at offset "
                f"{first_offset} in {self.topic_partition}")
        if not updated.has_ongoing_txn and is_transactional:
            updated.current_txn_first_offset = first_offset
            self._started.append(TxnMetadata(self.producer_id, first_offset))

    def append_end_txn_marker(self, ctype: int, coordinator_epoch: int, producer_epoch: int,
                              offset: int, timestamp: int, origin: AppendOrigin | None = None,
                              transaction_version: int = TV_0) -> CompletedTxn | None:
        origin = self.origin if origin is None else origin
        self._check_producer_epoch(producer_epoch, offset, origin, transaction_version)
        updated = self._updated
        if updated.coordinator_epoch > coordinator_epoch:
            message = (f"Invalid coordinator epoch for producer {self.producer_id} at offset "
                       f"{offset} in {self.topic_partition}: {coordinator_epoch} (zombie), "
                       f"{updated.coordinator_epoch} (current)")
            if origin is AppendOrigin.REPLICATION:
                log.info(message)
            else:
                raise TransactionCoordinatorFencedError(message)
        # A marker with no data before it does not affect the LSO or the transaction index.
        completed = None
        if updated.has_ongoing_txn:
            completed = CompletedTxn(self.producer_id, updated.current_txn_first_offset, offset,
                                     ctype == CONTROL_ABORT)
        updated.end_txn(producer_epoch, coordinator_epoch, timestamp)
        return completed

    # -- results ------------------------------------------------------------------------------

    def to_entry(self) -> ProducerStateEntry:
        return self._updated

    @property
    def started_transactions(self) -> list[TxnMetadata]:
        return list(self._started)

    def __repr__(self) -> str:
        u = self._updated
        return (f"ProducerAppendInfo(producer_id={self.producer_id}, "
                f"producer_epoch={u.producer_epoch}, first_seq={u.first_seq}, "
                f"last_seq={u.last_seq}, current_txn_first_offset={u.current_txn_first_offset}, "
                f"coordinator_epoch={u.coordinator_epoch}, last_timestamp={u.last_timestamp}, "
                f"started_transactions={self._started})")


# ---------------------------------------------------------------------------------------------
# snapshot files


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def offset_from_snapshot_path(path: Path) -> int | None:
    """The offset a ``<offset>.snapshot`` file name encodes, or None for any other name."""
    name = path.name
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[:-len(SNAPSHOT_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """The bytes of a version-1 producer snapshot holding ``entries``."""
    body = bytearray()
    count = 0
    for e in entries:
        body += _SNAPSHOT_ENTRY.pack(e.producer_id, e.producer_epoch, e.last_seq,
                                     e.last_data_offset, e.last_offset_delta, e.last_timestamp,
                                     e.coordinator_epoch, e.current_txn_first_offset)
        count += 1
    covered = struct.pack(">i", count) + bytes(body)
    return struct.pack(">hI", PRODUCER_SNAPSHOT_VERSION, crc32c(covered)) + covered


def decode_snapshot(data: bytes, source: object = "snapshot") -> list[ProducerStateEntry]:
    """Parse snapshot bytes; ``CorruptSnapshotError`` on a bad layout, version or CRC."""
    if len(data) < _SNAPSHOT_HEADER.size:
        raise CorruptSnapshotError(f"{source}: {len(data)} bytes is too short for a snapshot")
    version, crc, count = _SNAPSHOT_HEADER.unpack_from(data, 0)
    if count < 0 or len(data) != _SNAPSHOT_HEADER.size + count * _SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(
            f"{source}: {count} entries do not match the file size {len(data)}")
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"{source}: unknown snapshot version {version}")
    computed = crc32c(data[_CRC_START:])
    if computed != crc:
        raise CorruptSnapshotError(
            f"{source}: CRC is no longer valid; stored {crc}, computed {computed}")
    entries = []
    for (producer_id, epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch,
         txn_first_offset) in _SNAPSHOT_ENTRY.iter_unpack(data[_SNAPSHOT_HEADER.size:]):
        batches = ([BatchMetadata(last_seq, last_offset, offset_delta, timestamp)]
                   if last_offset >= 0 else [])
        entries.append(ProducerStateEntry(
            producer_id, epoch, coordinator_epoch, timestamp,
            txn_first_offset if txn_first_offset >= 0 else -1, batches))
    return entries


def write_snapshot(path: Path,
                   entries: Iterable[ProducerStateEntry] | Mapping[int, ProducerStateEntry],
                   sync: bool = True) -> None:
    """Write a snapshot atomically: ``<path>.tmp``, fsync, rename over ``path``, fsync the dir.

    Only the last batch of each producer fits the format, so a producer reloaded from a
    snapshot can detect a duplicate of its last batch only (as in Kafka).
    """
    path = Path(path)
    if isinstance(entries, Mapping):
        entries = entries.values()
    data = encode_snapshot(entries)
    try:
        atomic_write(path, data, sync)
    except OSError as e:
        raise KafkaStorageError(f"failed to write producer snapshot {path}: {e}") from e


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    """Entries of a snapshot file; ``CorruptSnapshotError`` if it fails validation."""
    path = Path(path)
    return decode_snapshot(path.read_bytes(), path)


# ---------------------------------------------------------------------------------------------
# the manager


class ProducerStateManager:
    """Producer id -> ``ProducerStateEntry`` for one partition, plus its transactions and snapshots.

    On disk: ``<log_dir>/<offset %020d>.snapshot`` files, each the state of every producer as of
    ``offset`` (exclusive: it covers batches below it). Byte-compatible with Kafka, big-endian::

        version i16 = 1 | crc u32 | count i32 | count x entry
        entry (46 bytes) = producerId i64 | epoch i16 | lastSequence i32 | lastOffset i64 |
                           offsetDelta i32 | timestamp i64 | coordinatorEpoch i32 |
                           currentTxnFirstOffset i64

    The CRC-32C covers bytes 6 to the end of the file. ``lastSequence``/``lastOffset``/
    ``offsetDelta`` describe the producer's last batch only (-1/-1/0 when none is known);
    ``timestamp`` is the entry's last timestamp; ``currentTxnFirstOffset`` is -1 with no
    transaction ongoing. Snapshots are written to a ``.tmp`` file and renamed into place.

    Invariants:

    * ``map_end_offset`` is the offset up to which (exclusive) the log has been applied;
      ``_last_snap_offset`` the offset of the latest snapshot taken or loaded.
    * ``ongoing_txns`` maps first offset -> ``TxnMetadata`` for every producer whose entry has a
      ``current_txn_first_offset``, in ascending offset order.
    * ``_unreplicated_txns`` holds completed transactions until the high watermark (or the log
      start offset) passes their marker.
    * Each entry retains at most ``NUM_BATCHES_TO_RETAIN`` batches, all of its current epoch.

    Not thread-safe: the partition's log lock serialises every call, appends included.
    """

    def __init__(self, topic_partition: TopicPartition, log_dir: Path,
                 producer_id_expiration_ms: int = 86_400_000, clock: Clock = SYSTEM_CLOCK,
                 max_transaction_timeout_ms: int = 900_000):
        self.topic_partition = topic_partition
        self.log_dir = Path(log_dir)
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.max_transaction_timeout_ms = max_transaction_timeout_ms
        self.clock = clock
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing_txns: dict[int, TxnMetadata] = {}        # kept sorted by first offset
        self._unreplicated_txns: dict[int, TxnMetadata] = {}   # kept sorted by first offset
        self._last_map_offset = 0
        self._last_snap_offset = 0
        self._snapshots: dict[int, Path] = self._scan_snapshots()

    # -- snapshot bookkeeping -----------------------------------------------------------------

    def _scan_snapshots(self) -> dict[int, Path]:
        found: dict[int, Path] = {}
        if not self.log_dir.is_dir():
            return found
        for path in self.log_dir.iterdir():
            if path.name.endswith(SNAPSHOT_SUFFIX + TMP_SUFFIX):
                path.unlink(missing_ok=True)        # an interrupted snapshot write
                continue
            offset = offset_from_snapshot_path(path)
            if offset is not None and path.is_file():
                found[offset] = path
        return dict(sorted(found.items()))

    def _remove_and_delete_snapshot(self, offset: int) -> None:
        path = self._snapshots.pop(offset, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def remove_and_mark_snapshot_for_deletion(self, offset: int) -> Path | None:
        """Forget the snapshot at ``offset`` and rename it ``*.snapshot.deleted`` (async delete)."""
        path = self._snapshots.pop(offset, None)
        if path is None:
            return None
        target = path.with_name(path.name + DELETED_SUFFIX)
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return None
        return target

    @property
    def latest_snapshot_offset(self) -> int | None:
        return next(reversed(self._snapshots), None)

    @property
    def oldest_snapshot_offset(self) -> int | None:
        return next(iter(self._snapshots), None)

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    def snapshot_file_for(self, offset: int) -> Path | None:
        return self._snapshots.get(offset)

    def fetch_snapshot(self, offset: int) -> Path | None:
        """The snapshot file at exactly ``offset`` (e.g. for tiered storage upload)."""
        return self._snapshots.get(offset)

    def delete_snapshots_before(self, offset: int) -> None:
        """Delete snapshots with offsets below ``offset`` (exclusive)."""
        for snap_offset in [o for o in self._snapshots if o < offset]:
            self._remove_and_delete_snapshot(snap_offset)

    def take_snapshot(self, sync: bool = True) -> Path | None:
        """Write a snapshot at ``map_end_offset`` unless nothing was applied since the last one."""
        if self._last_map_offset <= self._last_snap_offset:
            return None
        offset = self._last_map_offset
        path = self.log_dir / snapshot_file_name(offset)
        write_snapshot(path, self._producers.values(), sync=sync)
        self._snapshots[offset] = path
        if next(reversed(self._snapshots)) != offset:
            self._snapshots = dict(sorted(self._snapshots.items()))
        self._last_snap_offset = offset
        log.debug("Wrote producer snapshot of %s at offset %d with %d producer ids",
                  self.topic_partition, offset, len(self._producers))
        return path

    def update_parent_dir(self, log_dir: Path) -> None:
        """The partition directory was renamed (e.g. for deletion): follow it."""
        self.log_dir = Path(log_dir)
        self._snapshots = {o: self.log_dir / p.name for o, p in self._snapshots.items()}

    # -- loading ------------------------------------------------------------------------------

    def _is_producer_expired(self, now_ms: int, entry: ProducerStateEntry) -> bool:
        return (not entry.has_ongoing_txn
                and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms)

    def load_producer_entry(self, entry: ProducerStateEntry) -> None:
        """Install ``entry`` as loaded (from a snapshot), registering its ongoing transaction."""
        self._producers[entry.producer_id] = entry
        if entry.has_ongoing_txn:
            self._add_ongoing(TxnMetadata(entry.producer_id, entry.current_txn_first_offset))

    def _load_from_snapshot(self, log_start_offset: int, now_ms: int) -> None:
        while True:
            offset = self.latest_snapshot_offset
            if offset is None:
                self._last_snap_offset = log_start_offset
                self._last_map_offset = log_start_offset
                return
            path = self._snapshots[offset]
            try:
                entries = read_snapshot(path)
            except CorruptSnapshotError as e:
                log.warning("Deleting corrupt producer snapshot %s: %s", path, e)
                self._remove_and_delete_snapshot(offset)
                continue
            except FileNotFoundError:
                self._snapshots.pop(offset, None)
                continue
            for entry in entries:
                if not self._is_producer_expired(now_ms, entry):
                    self.load_producer_entry(entry)
            self._last_snap_offset = offset
            self._last_map_offset = offset
            return

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int,
                            current_time_ms: int) -> None:
        """Bring the state to ``log_end_offset`` from the latest snapshot in range.

        Snapshots above ``log_end_offset`` or at/below ``log_start_offset`` are deleted (Kafka
        4.x's rule). If the state is not already at ``log_end_offset`` it is cleared and the
        latest remaining snapshot loaded, dropping expired producers; ``map_end_offset`` is then
        that snapshot's offset (or ``log_start_offset``) and the log replays the rest.
        """
        for offset in list(self._snapshots):
            if offset > log_end_offset or offset <= log_start_offset:
                self._remove_and_delete_snapshot(offset)
        if log_end_offset != self._last_map_offset:
            self._producers.clear()
            self._ongoing_txns.clear()
            self._unreplicated_txns.clear()
            self._load_from_snapshot(log_start_offset, current_time_ms)
        else:
            self.on_log_start_offset_incremented(log_start_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Forget all state and delete every snapshot; the map then starts at ``offset``."""
        self._producers.clear()
        self._ongoing_txns.clear()
        self._unreplicated_txns.clear()
        for snap_offset in list(self._snapshots):
            self._remove_and_delete_snapshot(snap_offset)
        self._last_snap_offset = 0
        self._last_map_offset = offset

    def load_snapshot_at(self, offset: int, data: bytes, now_ms: int) -> None:
        """Install snapshot bytes (a remote segment's, KIP-405) as the state at ``offset``:
        written as ``<offset>.snapshot``, then loaded as at start-up. The state must be empty
        at ``offset`` (``truncate_fully_and_start_at``). Raises CorruptSnapshotError."""
        entries = decode_snapshot(data, f"producer snapshot at {offset}")
        path = self.log_dir / snapshot_file_name(offset)
        write_snapshot(path, entries)
        self._snapshots[offset] = path
        self._snapshots = dict(sorted(self._snapshots.items()))
        for entry in entries:
            if not self._is_producer_expired(now_ms, entry):
                self.load_producer_entry(entry)
        self._last_snap_offset = offset
        self._last_map_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """Drop completed transactions below the new start and move ``map_end_offset`` up to it."""
        self._remove_unreplicated_txns(log_start_offset)
        if self._last_map_offset < log_start_offset:
            self._last_map_offset = log_start_offset
        latest = self.latest_snapshot_offset
        self._last_snap_offset = log_start_offset if latest is None else latest

    def remove_expired_producers(self, now_ms: int) -> None:
        """Forget producers with no ongoing transaction idle for ``producer_id_expiration_ms``."""
        expired = [pid for pid, e in self._producers.items()
                   if self._is_producer_expired(now_ms, e)]
        for pid in expired:
            del self._producers[pid]

    # -- appends ------------------------------------------------------------------------------

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        """The metadata of an earlier batch that ``header`` is a retry of, if retained."""
        entry = self._producers.get(header.producer_id)
        return None if entry is None else entry.find_duplicate_batch(header)

    def prepare_update(self, producer_id: int, origin: AppendOrigin) -> ProducerAppendInfo:
        current = self._producers.get(producer_id) or ProducerStateEntry.empty(producer_id)
        return ProducerAppendInfo(self.topic_partition, producer_id, current, origin)

    def update(self, append_info: ProducerAppendInfo) -> None:
        """Apply a validated append (after its bytes are in the log)."""
        pid = append_info.producer_id
        if pid == NO_PRODUCER_ID:
            raise ValueError(f"invalid producer id {pid} passed to update for "
                             f"{self.topic_partition}")
        updated = append_info.to_entry()
        current = self._producers.get(pid)
        if current is not None:
            current.update(updated)
        else:
            self._producers[pid] = updated
        for txn in append_info.started_transactions:
            self._add_ongoing(txn)

    def update_map_end_offset(self, next_offset: int) -> None:
        self._last_map_offset = next_offset

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    # -- transactions -------------------------------------------------------------------------

    def _add_ongoing(self, txn: TxnMetadata) -> None:
        txns = self._ongoing_txns
        out_of_order = bool(txns) and txn.first_offset < next(reversed(txns))
        txns[txn.first_offset] = txn
        if out_of_order:
            self._ongoing_txns = dict(sorted(txns.items()))

    def last_stable_offset(self, completed_txn: CompletedTxn) -> int:
        """The LSO once ``completed_txn`` completes: the first offset of the earliest ongoing
        transaction of another producer, else just past the marker. Call before ``complete_txn``;
        it is the value an aborted transaction's .txnindex entry records."""
        for txn in self._ongoing_txns.values():
            if txn.producer_id != completed_txn.producer_id:
                return txn.first_offset
        return completed_txn.last_offset + 1

    def complete_txn(self, completed_txn: CompletedTxn) -> None:
        """Mark a transaction complete (after its marker, and any .txnindex entry, are written)."""
        txn = self._ongoing_txns.pop(completed_txn.first_offset, None)
        if txn is None:
            raise ValueError(f"attempted to complete transaction {completed_txn} on "
                             f"{self.topic_partition} which was not started")
        txn.last_offset = completed_txn.last_offset
        unreplicated = self._unreplicated_txns
        out_of_order = bool(unreplicated) and txn.first_offset < next(reversed(unreplicated))
        unreplicated[txn.first_offset] = txn
        if out_of_order:
            self._unreplicated_txns = dict(sorted(unreplicated.items()))

    def first_unstable_offset(self, include_unreplicated: bool = False) -> int | None:
        """First offset of the earliest ongoing transaction, which bounds the last stable offset.

        With ``include_unreplicated`` it is Kafka's ``firstUnstableOffset``: completed
        transactions whose marker is not yet below the high watermark (see
        ``on_high_watermark_updated``) count as unstable too.
        """
        undecided = next(iter(self._ongoing_txns), None)
        if not include_unreplicated:
            return undecided
        unreplicated = next(iter(self._unreplicated_txns), None)
        if unreplicated is None:
            return undecided
        if undecided is None:
            return unreplicated
        return min(undecided, unreplicated)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Forget completed transactions whose marker is below the high watermark."""
        self._remove_unreplicated_txns(high_watermark)

    def _remove_unreplicated_txns(self, offset: int) -> None:
        done = [k for k, t in self._unreplicated_txns.items()
                if t.last_offset is not None and t.last_offset < offset]
        for k in done:
            del self._unreplicated_txns[k]

    # -- views --------------------------------------------------------------------------------

    @property
    def ongoing_txns(self) -> Mapping[int, TxnMetadata]:
        """First offset -> ongoing transaction, ascending."""
        return MappingProxyType(self._ongoing_txns)

    @property
    def active_producers(self) -> Mapping[int, ProducerStateEntry]:
        """Read-only view of producer id -> entry."""
        return MappingProxyType(self._producers)

    @property
    def map_end_offset(self) -> int:
        return self._last_map_offset

    @property
    def is_empty(self) -> bool:
        return not self._producers and not self._unreplicated_txns
