"""Records of the internal topic ``__transaction_state``, byte-compatible with Kafka 4.x.

Every record has a key and a value (``None`` for a tombstone), each starting with a big-endian
int16 version (Kafka's ``TransactionLogKey.json`` / ``TransactionLogValue.json``):

    TransactionLogKey v0 (never flexible)
        TransactionalId                   string (int16 length + UTF-8)

    TransactionLogValue v0 (non-flexible) and v1 (flexible: compact strings/arrays as
    unsigned varint length + 1, a tagged-field section after every struct)
        ProducerId                        int64
        ProducerEpoch                     int16
        TransactionTimeoutMs              int32
        TransactionStatus                 int8   (TxnState id)
        TransactionPartitions             nullable [Topic string, PartitionIds [int32]]
        TransactionLastUpdateTimestampMs  int64
        TransactionStartTimestampMs       int64
      tagged, v1 only, written only when not the default:
        tag 0 PreviousProducerId int64 (-1), tag 1 NextProducerId int64 (-1),
        tag 2 ClientTransactionVersion int16 (0), tag 3 NextProducerEpoch int16 (-1)

Kafka 4.x writes value v1 when the cluster's ``transaction.version`` is 1 or more (the
default of a 4.x cluster formatted at the latest metadata version is 2) and v0 below that;
``encode_value`` writes v1 unless asked for v0. Kafka writes a null TransactionPartitions
for EMPTY and an empty array for every other state without partitions (COMPLETE_COMMIT,
COMPLETE_ABORT, DEAD...); on load it ignores the partitions of an EMPTY value.

A key version other than 0 is skipped when loading (``decode_key`` returns ``None``). An
unknown value version raises ``UnknownValueVersionError`` (a ``RecordFormatError``; Kafka 4.3's
loader logs and skips such a record, 4.0's fails); a bad state id or truncated bytes raise
``RecordFormatError``. Trailing bytes after a key or value are ignored, as Kafka's readers do.

The partition of ``__transaction_state`` that holds a transactional id is
``Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from strata.coordinator.offsets_records import (
    RecordFormatError,
    _Reader,
    _Writer,
    java_string_hashcode,
    java_utils_abs,
)

__all__ = [
    "TRANSACTION_STATE_TOPIC", "DEFAULT_TXN_TOPIC_PARTITIONS", "TXN_LOG_KEY_VERSION",
    "TXN_LOG_VALUE_VERSION", "TxnState", "TxnLogValue", "RecordFormatError",
    "UnknownValueVersionError", "partition_for",
    "encode_key", "decode_key", "encode_value", "decode_value", "txn_record",
]

TRANSACTION_STATE_TOPIC = "__transaction_state"
DEFAULT_TXN_TOPIC_PARTITIONS = 50

TXN_LOG_KEY_VERSION = 0
TXN_LOG_VALUE_VERSION = 1         # written by default (transaction.version >= 1)
MAX_TXN_LOG_VALUE_VERSION = 1
FIRST_FLEXIBLE_VALUE_VERSION = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# Tags of the v1+ tagged fields.
TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2
TAG_NEXT_PRODUCER_EPOCH = 3

_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


class UnknownValueVersionError(RecordFormatError):
    """A TransactionLogValue version this broker cannot read."""

    def __init__(self, version: int):
        super().__init__(f"unknown TransactionLogValue version {version}")
        self.version = version


class TxnState(IntEnum):
    """Kafka's ``TransactionState`` ids, as stored in TransactionStatus."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


def _normalize_partitions(partitions) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Merge repeated topics, sort topics and partition ids, drop topics with no partitions
    (the stored partitions are a set of TopicPartitions, so order never matters to Kafka)."""
    merged: dict[str, set[int]] = {}
    for topic, ids in partitions:
        merged.setdefault(topic, set()).update(int(i) for i in ids)
    return tuple((topic, tuple(sorted(ids))) for topic, ids in sorted(merged.items()) if ids)


@dataclass(frozen=True)
class TxnLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TxnState
    partitions: tuple[tuple[str, tuple[int, ...]], ...]  # (topic, partitions) sorted; () when none
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0
    next_producer_epoch: int = NO_PRODUCER_EPOCH  # tag 3 in Kafka 4.3's schema; 4.3 never sets it

    def __post_init__(self):
        object.__setattr__(self, "state", TxnState(self.state))
        object.__setattr__(self, "partitions", _normalize_partitions(self.partitions))


# --------------------------------------------------------------------------- partitioning

def partition_for(transactional_id: str, num_partitions: int = DEFAULT_TXN_TOPIC_PARTITIONS) -> int:
    """The ``__transaction_state`` partition that stores ``transactional_id`` (as Kafka computes it)."""
    return java_utils_abs(java_string_hashcode(transactional_id)) % num_partitions


# --------------------------------------------------------------------------- keys

def encode_key(transactional_id: str) -> bytes:
    w = _Writer()
    try:
        w.int16(TXN_LOG_KEY_VERSION)
        w.string(transactional_id)
    except struct.error as exc:
        raise RecordFormatError(str(exc)) from exc
    return bytes(w.buf)


def decode_key(data: bytes) -> str | None:
    """The transactional id; ``None`` for a key version this broker does not know."""
    if data is None:
        raise RecordFormatError("a __transaction_state record must have a key")
    r = _Reader(data)
    if r.int16() != TXN_LOG_KEY_VERSION:
        return None
    try:
        return r.string()
    except UnicodeDecodeError as exc:
        raise RecordFormatError(f"transactional id is not UTF-8: {exc}") from exc


# --------------------------------------------------------------------------- values

def encode_value(value: TxnLogValue, version: int = TXN_LOG_VALUE_VERSION) -> bytes:
    """Value bytes as Kafka writes them. Version 0 (``transaction.version`` 0) has no tagged
    fields: like Kafka, it leaves out the producer ids; a client transaction version other
    than 0 cannot be stored in it and raises."""
    if not 0 <= version <= MAX_TXN_LOG_VALUE_VERSION:
        raise RecordFormatError(f"TransactionLogValue version {version} is not 0-1")
    flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    state = TxnState(value.state)
    if state == TxnState.EMPTY and value.partitions:
        raise RecordFormatError(f"an EMPTY transaction has no partitions: {value!r}")
    if not flexible and value.client_transaction_version != 0:
        raise RecordFormatError("TransactionLogValue v0 cannot store ClientTransactionVersion "
                                f"{value.client_transaction_version}")
    w = _Writer(flexible=flexible)
    try:
        w.int16(version)
        w.int64(value.producer_id)
        w.int16(value.producer_epoch)
        w.int32(value.transaction_timeout_ms)
        w.buf.append(int(state))
        if state == TxnState.EMPTY:
            w.buf += b"\x00" if flexible else b"\xff\xff\xff\xff"  # null array
        else:
            partitions = _normalize_partitions(value.partitions)
            w.array_len(len(partitions))
            for topic, ids in partitions:
                w.string(topic)
                w.array_len(len(ids))
                for i in ids:
                    w.int32(i)
                w.tagged_fields()
        w.int64(value.last_update_ms)
        w.int64(value.start_ms)
        if flexible:
            tagged = []
            if value.previous_producer_id != NO_PRODUCER_ID:
                tagged.append((TAG_PREVIOUS_PRODUCER_ID, _I64.pack(value.previous_producer_id)))
            if value.next_producer_id != NO_PRODUCER_ID:
                tagged.append((TAG_NEXT_PRODUCER_ID, _I64.pack(value.next_producer_id)))
            if value.client_transaction_version != 0:
                tagged.append((TAG_CLIENT_TRANSACTION_VERSION,
                               _I16.pack(value.client_transaction_version)))
            if value.next_producer_epoch != NO_PRODUCER_EPOCH:
                tagged.append((TAG_NEXT_PRODUCER_EPOCH, _I16.pack(value.next_producer_epoch)))
            w.uvarint(len(tagged))
            for tag, data in tagged:  # ascending tag order, as Kafka writes them
                w.uvarint(tag)
                w.uvarint(len(data))
                w.buf += data
    except struct.error as exc:
        raise RecordFormatError(f"field out of range: {exc}") from exc
    return bytes(w.buf)


def _read_tagged_fixed(r: _Reader, size: int, fmt: struct.Struct, name: str) -> int:
    if size != fmt.size:
        raise RecordFormatError(f"tagged field {name} has {size} bytes, expected {fmt.size}")
    return fmt.unpack(r._take(size))[0]


def decode_value(data: bytes | None) -> TxnLogValue | None:
    """``None`` (a tombstone) decodes to ``None``. Unknown tagged fields are skipped."""
    if data is None:
        return None
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= MAX_TXN_LOG_VALUE_VERSION:
        raise UnknownValueVersionError(version)
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    try:
        producer_id = r.int64()
        producer_epoch = r.int16()
        timeout_ms = r.int32()
        state_id = r._take(1)[0]
        try:
            state = TxnState(state_id)
        except ValueError:
            raise RecordFormatError(f"unknown transaction state id {state_id}") from None
        n = r.uvarint() - 1 if r.flexible else r.int32()
        partitions = []
        if n < 0:
            if state != TxnState.EMPTY:
                raise RecordFormatError(f"null TransactionPartitions in state {state.name}")
        for _ in range(n):
            topic = r.string()
            ids = tuple(r.int32() for _ in range(r.array_len()))
            r.tagged_fields()
            partitions.append((topic, ids))
        last_update_ms = r.int64()
        start_ms = r.int64()
        extra = {}
        if r.flexible:
            for _ in range(r.uvarint()):
                tag = r.uvarint()
                size = r.uvarint()
                if tag == TAG_PREVIOUS_PRODUCER_ID:
                    extra["previous_producer_id"] = _read_tagged_fixed(r, size, _I64, "PreviousProducerId")
                elif tag == TAG_NEXT_PRODUCER_ID:
                    extra["next_producer_id"] = _read_tagged_fixed(r, size, _I64, "NextProducerId")
                elif tag == TAG_CLIENT_TRANSACTION_VERSION:
                    extra["client_transaction_version"] = _read_tagged_fixed(
                        r, size, _I16, "ClientTransactionVersion")
                elif tag == TAG_NEXT_PRODUCER_EPOCH:
                    extra["next_producer_epoch"] = _read_tagged_fixed(r, size, _I16, "NextProducerEpoch")
                else:
                    r._take(size)
    except UnicodeDecodeError as exc:
        raise RecordFormatError(f"topic name is not UTF-8: {exc}") from exc
    return TxnLogValue(
        producer_id=producer_id, producer_epoch=producer_epoch, transaction_timeout_ms=timeout_ms,
        state=state, partitions=() if state == TxnState.EMPTY else tuple(partitions),
        last_update_ms=last_update_ms, start_ms=start_ms, **extra)


def txn_record(transactional_id: str, value: TxnLogValue | None) -> tuple[bytes, bytes | None]:
    """The (key, value) pair of a transactional id's state; ``value=None`` makes its tombstone."""
    return encode_key(transactional_id), None if value is None else encode_value(value)
