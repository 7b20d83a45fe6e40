"""RecordBatch v2 (magic 2): header parsing, validation, offset assignment, decode and build.

On-disk and on-wire layout, big-endian (61-byte header):

    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records...

``batchLength`` counts the bytes after itself; the CRC-32C covers attributes to the end, so
``baseOffset`` and ``partitionLeaderEpoch`` can be rewritten without recomputing it.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import crc32c as _crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
assert HEADER_SIZE == 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part outside batchLength
BASE_OFFSET_LENGTH = struct.Struct(">qi")
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # start of the CRC-covered region
PARTITION_LEADER_EPOCH_OFFSET = 12
MAX_TIMESTAMP_OFFSET = 35
CURRENT_MAGIC = 2

# attributes
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_TIMESTAMP = -1


def crc32c(data) -> int:
    return _crc32c.crc32c(data)


class BatchHeader(NamedTuple):
    """The 61-byte header of one batch, plus its position in the buffer it was read from."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    position: int = 0

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def read_header(buf, position: int = 0) -> BatchHeader:
    """Parse the header at ``position``; the caller guarantees 61 bytes are there."""
    return BatchHeader(*HEADER.unpack_from(buf, position), position)


def batch_crc_ok(buf, header: BatchHeader) -> bool:
    start = header.position + ATTRIBUTES_OFFSET
    end = header.position + header.size
    return crc32c(memoryview(buf)[start:end]) == header.crc


def iter_headers(buf, position: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Headers of the complete batches in ``buf[position:end]``; stops silently at a partial tail.

    No CRC check: this is the cheap walk used for searching; recovery validates separately.
    """
    end = len(buf) if end is None else end
    unpack = HEADER.unpack_from
    while position + HEADER_SIZE <= end:
        fields = unpack(buf, position)
        size = fields[1] + LOG_OVERHEAD
        if fields[1] < HEADER_SIZE - LOG_OVERHEAD or position + size > end:
            return
        yield BatchHeader(*fields, position)
        position += size


def read_varint(buf, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at ``pos``; return (value, next position)."""
    shift = 0
    raw = 0
    while True:
        if shift > 63:
            raise ValueError("varint too long")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), pos


CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")


def control_type(buf, header: BatchHeader) -> int:
    """The control record type (0 abort, 1 commit) of a control batch's single record."""
    pos = header.position + HEADER_SIZE
    _, pos = read_varint(buf, pos)          # record length
    pos += 1                                # attributes
    _, pos = read_varint(buf, pos)          # timestamp delta
    _, pos = read_varint(buf, pos)          # offset delta
    key_len, pos = read_varint(buf, pos)
    if key_len < 4:
        raise ValueError("control record key too short")
    _version, ctype = _CONTROL_KEY.unpack_from(buf, pos)
    return ctype
