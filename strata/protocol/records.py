"""RecordBatch v2 (magic 2): the format: header parsing, CRC, iteration, varints, decode and build.

On-disk and on-wire layout, big-endian (61-byte header):

    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records...

``batchLength`` counts the bytes after itself; the CRC-32C covers attributes to the end, so
``baseOffset`` and ``partitionLeaderEpoch`` can be rewritten without recomputing it.

What the broker checks and rewrites on append (Kafka's ``LogValidator``) is
``strata.log.log_validator``'s.
"""

from __future__ import annotations

import mmap
import struct
import threading
import time
from enum import IntEnum
from typing import Iterable, Iterator, NamedTuple

import cramjam
import crc32c as _crc32c

from strata.common.errors import CorruptRecordError, RecordTooLargeError
from strata.protocol.wire import read_varint, write_varint

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
# attributes, timestamp delta, offset delta, key length, value length, header count: one byte each
MIN_RECORD_LENGTH = 6


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


class Compression(IntEnum):
    """The codec in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: the smallest legal batchLength
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


# ---------------------------------------------------------------------------------------------
# Decoding (tools, tests, Spark; never on the produce path, but for the validator's bounded
# inflate of compressed batches).
# ---------------------------------------------------------------------------------------------

class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


# snappy-java's stream format, written by Java clients: this 8-byte magic, version i32 and
# compatible-version i32, then blocks of [length i32][raw snappy].
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024  # uncompressed bytes per block, snappy-java's default


def _xerial_decode(data: bytes) -> bytes:
    end = len(data)
    pos = len(_XERIAL_HEADER)
    if end < pos:
        raise CorruptRecordError("truncated xerial snappy header")
    parts = []
    decompress = cramjam.snappy.decompress_raw
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        (n,) = _INT32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"bad xerial snappy block length {n}")
        parts.append(bytes(decompress(data[pos:pos + n])))
        pos += n
    return b"".join(parts)


# A produced batch may inflate to at most this many bytes (``strata.log.log_validator`` inflates
# through ``inflate_bounded``); a batch beyond it (a compression bomb: 6 KiB of zstd make
# 200 MB) is refused with RECORD_TOO_LARGE, which producers answer by splitting the batch. It
# also bounds the record walk's time on the event loop (docs/benchmarks.md, "Bad input and
# bounds").
MAX_INFLATED_BATCH_BYTES = 32 << 20
_inflate_buffers = threading.local()


def inflate_bounded(codec: int, data, limit: int = MAX_INFLATED_BATCH_BYTES) -> memoryview:
    """``data`` decompressed into this thread's reused buffer, a view valid until the thread's
    next call or ``release_inflated``. Only the pages the output touches are committed."""
    buf = getattr(_inflate_buffers, "buf", None)
    if buf is None:
        buf = _inflate_buffers.buf = mmap.mmap(-1, MAX_INFLATED_BATCH_BYTES)
        _inflate_buffers.high = 0
    if codec == Compression.SNAPPY and bytes(data[:8]) == _XERIAL_MAGIC:
        out = _xerial_decode(data)  # blocks of raw snappy: at most ~32x each, bounded already
        n = len(out)
        if n > limit:
            raise RecordTooLargeError(f"batch inflates to {n} bytes, more than {limit}")
        buf[:n] = out
    else:
        into = _DECOMPRESS_INTO.get(codec)
        if into is None:
            raise CorruptRecordError(f"unknown compression codec {codec}")
        try:
            with memoryview(buf)[:limit] as room:
                n = into(data, room)
        except cramjam.DecompressionError as e:
            if any(m in str(e) for m in _OUT_OF_ROOM):
                raise RecordTooLargeError(f"batch inflates to more than {limit} bytes") from e
            raise CorruptRecordError(
                f"cannot decompress {Compression(codec).name} records: {e}") from e
    _inflate_buffers.high = max(_inflate_buffers.high, n)
    return memoryview(buf)[:n]


def release_inflated() -> None:
    """Hand this thread's inflate buffer pages back to the kernel after a large batch."""
    high = getattr(_inflate_buffers, "high", 0)
    if high > _KEEP_COMMITTED_BYTES:
        _inflate_buffers.buf.madvise(mmap.MADV_DONTNEED, 0, high + (-high) % mmap.PAGESIZE)
        _inflate_buffers.high = 0


_KEEP_COMMITTED_BYTES = 16 << 20
# How cramjam says that the output buffer was too small (io's WriteZero; snappy's own words).
_OUT_OF_ROOM = ("failed to write whole buffer", "smaller than required")
_DECOMPRESS_INTO = {
    Compression.GZIP: cramjam.gzip.decompress_into,
    Compression.SNAPPY: cramjam.snappy.decompress_raw_into,
    Compression.LZ4: cramjam.lz4.decompress_into,
    Compression.ZSTD: cramjam.zstd.decompress_into,
}


def _decompress(codec: int, data: bytes) -> bytes:
    try:
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == Compression.SNAPPY:
            if data[:8] == _XERIAL_MAGIC:
                return _xerial_decode(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(f"cannot decompress {Compression(codec).name} records: {e}") from e
    raise CorruptRecordError(f"unknown compression codec {codec}")


def _parse_records(data: bytes, count: int, base_offset: int, base_timestamp: int,
                   append_time: int | None) -> list[Record]:
    """Decode ``count`` records filling all of ``data``.

    Varints are decoded inline for the common short cases (zig-zag: (z >> 1) ^ -(z & 1)) and
    through ``read_varint`` otherwise.
    """
    slow = read_varint
    end = len(data)
    pos = 0
    records: list[Record] = []
    append = records.append
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = slow(data, pos)
            record_end = pos + length
            if length <= 0 or record_end > end:
                raise CorruptRecordError(f"record length {length} at {pos} overruns the batch")
            pos += 1  # attributes: unused in magic 2
            b = data[pos]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                timestamp_delta, pos = slow(data, pos)
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = slow(data, pos)
            b = data[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                n, pos = slow(data, pos)
            if n >= 0:
                key = data[pos:pos + n]
                pos += n
            elif n == -1:
                key = None
            else:
                raise CorruptRecordError(f"invalid key length {n}")
            b = data[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                n = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                n, pos = slow(data, pos)
            if n >= 0:
                value = data[pos:pos + n]
                pos += n
            elif n == -1:
                value = None
            else:
                raise CorruptRecordError(f"invalid value length {n}")
            b = data[pos]
            if b == 0:
                headers: tuple = ()
                pos += 1
            else:
                header_count, pos = slow(data, pos)
                if header_count < 0:
                    raise CorruptRecordError(f"invalid header count {header_count}")
                items = []
                for _ in range(header_count):
                    b = data[pos]
                    if b < 0x80:
                        n = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        n, pos = slow(data, pos)
                    if n < 0:
                        raise CorruptRecordError(f"invalid header key length {n}")
                    header_key = data[pos:pos + n].decode()
                    pos += n
                    b = data[pos]
                    if b < 0x80:
                        n = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        n, pos = slow(data, pos)
                    if n >= 0:
                        items.append((header_key, data[pos:pos + n]))
                        pos += n
                    elif n == -1:
                        items.append((header_key, None))
                    else:
                        raise CorruptRecordError(f"invalid header value length {n}")
                headers = tuple(items)
            if pos != record_end:
                raise CorruptRecordError(f"record fields do not fill its declared length {length}")
            append(Record(
                base_offset + offset_delta,
                base_timestamp + timestamp_delta if append_time is None else append_time,
                key, value, headers))
    except (IndexError, ValueError) as e:  # truncated data, overlong varint, bad UTF-8
        raise CorruptRecordError(f"malformed record at byte {pos}: {e}") from e
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after the batch's {count} records")
    return records


def decode_batch(buf, header: BatchHeader, *, check_crc: bool = False) -> list[Record]:
    """All records of one batch (control batches included), decompressed.

    LogAppendTime batches give every record the batch's maxTimestamp, as Kafka does.
    """
    if header.magic != CURRENT_MAGIC:
        raise CorruptRecordError(f"cannot decode magic {header.magic} at {header.position}")
    start = header.position + HEADER_SIZE
    end = header.position + header.batch_length + LOG_OVERHEAD
    if header.batch_length < MIN_BATCH_LENGTH or end > len(buf):
        raise CorruptRecordError(f"batch at {header.position} has bad length {header.batch_length}")
    if header.record_count < 0:
        raise CorruptRecordError(f"negative record count {header.record_count}")
    if check_crc and not batch_crc_ok(buf, header):
        raise CorruptRecordError(f"CRC mismatch in batch at position {header.position}")
    with memoryview(buf) as view:
        data = bytes(view[start:end])  # one copy; bytes index fastest
    if header.record_count == 0 and not data:
        return []  # compaction can leave empty batches behind
    codec = header.attributes & COMPRESSION_MASK
    if codec:
        data = _decompress(codec, data)
    append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    return _parse_records(data, header.record_count, header.base_offset, header.base_timestamp,
                          append_time)


def iter_records(buf, start: int = 0, end: int | None = None, *, include_control: bool = False,
                 check_crc: bool = False) -> Iterator[Record]:
    """Records of every complete batch in ``buf[start:end]``; a partial tail is ignored.

    Control batches (transaction markers) are skipped unless ``include_control``.
    """
    for header in iter_headers(buf, start, end):
        if header.attributes & CONTROL_MASK and not include_control:
            continue
        yield from decode_batch(buf, header, check_crc=check_crc)


# ---------------------------------------------------------------------------------------------
# Building (tests and internal topics).
# ---------------------------------------------------------------------------------------------

class SimpleRecord(NamedTuple):
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None  # None: wall-clock ms when the batch is built


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out.append(1)  # zig-zag of -1
    else:
        write_varint(out, len(data))
        out += data


def _write_record(out: bytearray, offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers) -> None:
    body = bytearray(b"\x00")  # attributes
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_bytes(body, key)
    _write_bytes(body, value)
    write_varint(body, len(headers))
    for header_key, header_value in headers:
        _write_bytes(body, header_key.encode() if isinstance(header_key, str) else header_key)
        _write_bytes(body, header_value)
    write_varint(out, len(body))
    out += body


def _xerial_encode(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    compress = cramjam.snappy.compress_raw
    view = memoryview(data)
    for i in range(0, len(data), _XERIAL_BLOCK_SIZE):
        block = bytes(compress(view[i:i + _XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _xerial_encode(data)
    if codec == Compression.LZ4:
        # Kafka's Java reader decompresses each block on its own: blocks must be independent.
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))  # 3: zstd's and Kafka's default
    raise ValueError(f"unknown compression codec {codec}")


def _assemble(payload: bytes, *, base_offset: int, partition_leader_epoch: int, attributes: int,
              last_offset_delta: int, base_timestamp: int, max_timestamp: int, producer_id: int,
              producer_epoch: int, base_sequence: int, record_count: int) -> bytes:
    buf = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(buf, 0, base_offset, MIN_BATCH_LENGTH + len(payload), partition_leader_epoch,
                     CURRENT_MAGIC, 0, attributes, last_offset_delta, base_timestamp,
                     max_timestamp, producer_id, producer_epoch, base_sequence, record_count)
    buf[HEADER_SIZE:] = payload
    with memoryview(buf) as view:
        _UINT32.pack_into(buf, CRC_OFFSET, crc32c(view[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def build_batch(
    records: Iterable[SimpleRecord],
    *,
    base_offset: int = 0,
    compression: int = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    transactional: bool = False,
    log_append_time: bool = False,
    base_timestamp: int | None = None,
) -> bytes:
    """Encode ``records`` as one batch with offset deltas 0..n-1.

    baseTimestamp is the first record's timestamp unless ``base_timestamp`` is given; maxTimestamp
    is the greatest record timestamp (with ``log_append_time`` it is also what readers report for
    every record).
    """
    items = [r if isinstance(r, SimpleRecord) else SimpleRecord(*r) for r in records]
    if not items:
        raise ValueError("a batch needs at least one record")
    codec = Compression(compression)
    now = None
    timestamps = []
    for r in items:
        ts = r.timestamp
        if ts is None:
            if now is None:
                now = _now_ms()
            ts = now
        timestamps.append(ts)
    base_ts = timestamps[0] if base_timestamp is None else base_timestamp
    body = bytearray()
    for i, (r, ts) in enumerate(zip(items, timestamps)):
        _write_record(body, i, ts - base_ts, r.key, r.value, r.headers)
    payload = _compress(codec, bytes(body)) if codec else body
    attributes = (int(codec) | (TRANSACTIONAL_MASK if transactional else 0)
                  | (TIMESTAMP_TYPE_MASK if log_append_time else 0))
    return _assemble(payload, base_offset=base_offset,
                     partition_leader_epoch=partition_leader_epoch,
                     attributes=attributes, last_offset_delta=len(items) - 1,
                     base_timestamp=base_ts, max_timestamp=max(timestamps),
                     producer_id=producer_id, producer_epoch=producer_epoch,
                     base_sequence=base_sequence, record_count=len(items))


_CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    timestamp: int | None = None,
) -> bytes:
    """A transaction marker: one control record, key (version 0, type), value (version 0, epoch)."""
    ts = _now_ms() if timestamp is None else timestamp
    body = bytearray()
    _write_record(body, 0, 0, _CONTROL_KEY.pack(0, control_type),
                  _CONTROL_VALUE.pack(0, coordinator_epoch), ())
    return _assemble(bytes(body), base_offset=base_offset,
                     partition_leader_epoch=partition_leader_epoch,
                     attributes=TRANSACTIONAL_MASK | CONTROL_MASK, last_offset_delta=0,
                     base_timestamp=ts, max_timestamp=ts, producer_id=producer_id,
                     producer_epoch=producer_epoch, base_sequence=-1, record_count=1)


def rebuild_batch(header: BatchHeader, retained: list[Record], delete_horizon_ms: int) -> bytes:
    """``header``'s batch holding only ``retained`` (Kafka's ``buildRetainedRecordsInto``).

    Offsets keep their deltas from the original base offset and the last offset delta stays,
    so offsets are never renumbered; codec, timestamp type, transactional and control flags,
    producer id/epoch, base sequence and leader epoch are kept. A ``delete_horizon_ms`` >= 0
    becomes the base timestamp with the DELETE_HORIZON flag set (KIP-534). With no record
    retained, the empty batch header Kafka writes to keep a producer's last sequence.
    """
    keep = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    if not retained:
        return _assemble(b"", base_offset=header.base_offset,
                         partition_leader_epoch=header.partition_leader_epoch, attributes=keep,
                         last_offset_delta=header.last_offset_delta, base_timestamp=NO_TIMESTAMP,
                         max_timestamp=header.max_timestamp, producer_id=header.producer_id,
                         producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                         record_count=0)
    base_ts = delete_horizon_ms if delete_horizon_ms >= 0 else retained[0].timestamp
    body = bytearray()
    for r in retained:
        _write_record(body, r.offset - header.base_offset, r.timestamp - base_ts, r.key, r.value,
                      r.headers)
    codec = header.compression
    payload = _compress(codec, bytes(body)) if codec else bytes(body)
    max_ts = header.max_timestamp if header.is_log_append_time else \
        max(r.timestamp for r in retained)
    attributes = codec | keep | (DELETE_HORIZON_MASK if delete_horizon_ms >= 0 else 0)
    return _assemble(payload, base_offset=header.base_offset,
                     partition_leader_epoch=header.partition_leader_epoch, attributes=attributes,
                     last_offset_delta=header.last_offset_delta, base_timestamp=base_ts,
                     max_timestamp=max_ts, producer_id=header.producer_id,
                     producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                     record_count=len(retained))
