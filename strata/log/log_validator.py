"""Kafka's ``LogValidator``: what the log checks and rewrites in a producer's batches before
they are appended (``storage/internals/log/LogValidator.java`` keeps it beside ``UnifiedLog``).

``validate_batches`` checks the record data sent for one partition at the header level (batch
framing, magic, compression codec, CRC, record counts and framing, the compacted topic's keys,
what only brokers may set, CreateTime bounds); ``assign_offsets`` and
``assign_offsets_gathered`` give the batches consecutive offsets and the leader epoch, in place
or around the producer's bytes. The RecordBatch format itself (headers, CRC, varints, decoding)
is ``strata.protocol.records``'s.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from strata.common.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)
from strata.protocol.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_OFFSET,
    CURRENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    MIN_BATCH_LENGTH,
    MIN_RECORD_LENGTH,
    NO_TIMESTAMP,
    PARTITION_LEADER_EPOCH_OFFSET,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Compression,
    crc32c,
    inflate_bounded,
    release_inflated,
)
from strata.protocol.wire import read_varint

_LEGACY_MIN_LENGTH = 14  # smallest magic 0 message after offset+size; any format's floor
# The first 17 bytes; magic sits at byte 16 in every message format (v0, v1 and v2).
_PREFIX = struct.Struct(">qiib")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_INT64_MAX = 2**63 - 1


class RecordValidationError(InvalidRecordError):
    """Kafka's ``RecordValidationException``: records of one batch refused one by one.

    ``record_errors`` holds (index of the record in its batch, message) pairs, what the
    produce response's ``record_errors`` carries; the message is Kafka's summary of them."""

    def __init__(self, record_errors: list[tuple[int, str]]):
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')"
                          for i, m in record_errors[:3])
        super().__init__(f"One or more records have been rejected due to {len(record_errors)} "
                         "record errors in total, and only showing the first three errors at "
                         f"most: [{shown}]")
        self.record_errors = record_errors


def validate_batches(
    buf,
    *,
    max_message_bytes: int,
    produce_version: int | None = None,
    from_client: bool = True,
    now_ms: int | None = None,
    timestamp_before_max_ms: int = _INT64_MAX,
    timestamp_after_max_ms: int = _INT64_MAX,
    log_append_time: bool = False,
    compacted_topic_partition: object = None,
) -> list[BatchHeader]:
    """Check the record data sent for one partition and return its batch headers.

    Looks only at the headers and the CRC (C speed); records are never decoded here. Raises the
    ``KafkaError`` whose code Kafka's broker would answer with. ``compacted_topic_partition``
    (the partition, when its topic is compacted) makes every record need a key: a batch with
    keyless records raises ``RecordValidationError`` naming each, as Kafka's LogValidator does.
    """
    end = len(buf)
    if end == 0:
        raise InvalidRecordError("no record batch in the produce data")
    prefix = _PREFIX.unpack_from
    unpack = HEADER.unpack_from
    headers: list[BatchHeader] = []
    pos = 0
    while pos < end:
        if end - pos < _PREFIX.size:
            raise CorruptRecordError(f"{end - pos} trailing bytes at position {pos}")
        _, length, _, magic = prefix(buf, pos)
        if length < _LEGACY_MIN_LENGTH:
            raise CorruptRecordError(f"batch length {length} at position {pos} is too small")
        if magic != CURRENT_MAGIC:
            raise InvalidRecordError(f"batch at {pos} has magic {magic}; only 2 is accepted")
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch length {length} at position {pos} is below the header")
        size = length + LOG_OVERHEAD
        if pos + size > end:
            raise CorruptRecordError(
                f"partial batch at position {pos}: {size} bytes declared, {end - pos} present")
        headers.append(BatchHeader(*unpack(buf, pos), pos))
        pos += size

    if produce_version is not None and len(headers) != 1:
        raise InvalidRecordError(
            f"produce v{produce_version} needs exactly one batch per partition, got {len(headers)}")

    # CreateTime bounds; a bound of i64 max (Kafka's default) means none, so the exact Python
    # arithmetic never rejects what Java's overflowing arithmetic would let through.
    latest = earliest = None
    if now_ms is not None and not log_append_time:
        if timestamp_after_max_ms < _INT64_MAX:
            latest = now_ms + timestamp_after_max_ms
        if timestamp_before_max_ms < _INT64_MAX:
            earliest = now_ms - timestamp_before_max_ms

    base = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)   # sliced with a stride
    try:
        with memoryview(buf) as view:
            for h in headers:
                pos = h.position
                codec = h.attributes & COMPRESSION_MASK
                if codec > Compression.ZSTD:
                    raise UnsupportedCompressionTypeError(f"unknown compression codec {codec}")
                if (codec == Compression.ZSTD and produce_version is not None
                        and produce_version < 7):
                    raise UnsupportedCompressionTypeError(
                        f"zstd needs produce v7 or later, got v{produce_version}")
                if from_client and h.base_offset != 0:
                    raise InvalidRecordError(f"batch base offset is {h.base_offset}, must be 0")
                size = h.batch_length + LOG_OVERHEAD
                if size > max_message_bytes:
                    raise RecordTooLargeError(
                        f"batch of {size} bytes exceeds max.message.bytes {max_message_bytes}")
                if crc32c(view[pos + ATTRIBUTES_OFFSET:pos + size]) != h.crc:
                    raise CorruptRecordError(f"CRC mismatch in batch at position {pos}")
                if h.record_count <= 0 or h.record_count != h.last_offset_delta + 1:
                    raise InvalidRecordError(
                        f"record count {h.record_count} does not match last offset delta "
                        f"{h.last_offset_delta}")
                lo, hi, records = pos + HEADER_SIZE, pos + size, base
                if codec != Compression.NONE:
                    inflated = inflate_bounded(codec, view[lo:hi])
                    lo, hi, records = 0, len(inflated), inflated.obj   # the view starts at 0
                keyless: list[int] | None = None if compacted_topic_partition is None else []
                if not _records_fill(records, h.record_count, keyless, lo, hi):
                    raise InvalidRecordError(
                        f"the records of the batch at position {pos} do not frame: "
                        f"{h.record_count} declared")
                if keyless:
                    raise RecordValidationError([
                        (i, "Compacted topic cannot accept message without key in topic partition "
                            f"{compacted_topic_partition}") for i in keyless])
                if from_client:
                    if h.attributes & CONTROL_MASK:
                        raise InvalidRecordError("clients may not write control batches")
                    if h.producer_id >= 0 and h.base_sequence < 0:
                        raise InvalidRecordError(f"producer id {h.producer_id} with invalid "
                                                 f"base sequence {h.base_sequence}")
                    # Only brokers set LogAppendTime; Kafka refuses it from producers on
                    # LogAppendTime topics, and on CreateTime topics when the record timestamp
                    # is missing.
                    if h.attributes & TIMESTAMP_TYPE_MASK and (
                            log_append_time or h.max_timestamp == NO_TIMESTAMP):
                        raise InvalidTimestampError("producers may not set the LogAppendTime type")
                # Kafka checks every record's timestamp; from the header we can only bound the batch
                # by its max timestamp and its first record's (base) timestamp.
                if latest is not None and h.max_timestamp > latest:
                    raise InvalidTimestampError(
                        f"max timestamp {h.max_timestamp} is more than {timestamp_after_max_ms} ms "
                        f"after now ({now_ms})")
                if (earliest is not None and h.base_timestamp != NO_TIMESTAMP
                        and h.base_timestamp < earliest):
                    raise InvalidTimestampError(
                        f"base timestamp {h.base_timestamp} is more than {timestamp_before_max_ms} "
                        f"ms before now ({now_ms})")
    finally:
        release_inflated()
    return headers


_RUN_PROBE = 8      # records compared at once before a run of equal lengths is followed
_RUN_BACKOFF = 32   # records stepped one by one after a probe finds no run (doubling while none do)


def _records_fill(data, count: int, keyless: list[int] | None = None, lo: int = 0,
                  hi: int | None = None) -> bool:
    """Whether exactly ``count`` length-prefixed records fill ``data[lo:hi]``.

    The records are framed as Kafka's LogValidator frames them, so a batch whose CRC matches
    but whose records are cut short, miscounted or padded is refused instead of stalling
    consumers. ``data`` is bytes, a bytearray or an mmap (sliced with a stride by
    ``_run_length``). Records come in runs of one length (a batch's sizes change where a
    varint grows, or where values differ): a run is proven from the length prefixes at its
    stride, compared all at once in C, and stepped over whole; where lengths vary, records are
    stepped one at a time. With ``keyless`` (compacted topics) every record is stepped, to
    reach its key length, and the index of each record without a key is appended."""
    end = len(data) if hi is None else hi
    pos = lo
    n = 0
    step_to = count if keyless is not None else 0   # step one by one up to this record
    backoff = _RUN_BACKOFF
    try:
        while pos < end:
            start = pos
            b = data[pos]
            if b < 0x80:  # one- and two-byte zig-zag varints inline: (z >> 1) ^ -(z & 1)
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = read_varint(data, pos)
            if length < MIN_RECORD_LENGTH:
                return False
            if n >= step_to:
                stride = pos - start + length
                fit = min(count - n, (end - start) // stride)
                run = _run_length(data, start, pos - start, stride, fit) if fit >= _RUN_PROBE else 0
                if run:
                    pos = start + run * stride
                    n += run
                    backoff = _RUN_BACKOFF
                    continue
                step_to = n + backoff
                backoff *= 2
            if keyless is not None:
                p = pos + 1                 # past attributes
                while data[p] & 0x80:       # timestamp delta
                    p += 1
                p += 1
                while data[p] & 0x80:       # offset delta
                    p += 1
                p += 1
                if p >= pos + length:
                    return False
                if data[p] & 1:             # zig-zag sign bit: key length < 0, no key
                    keyless.append(n)
            pos += length
            n += 1
    except (IndexError, ValueError):
        return False
    return pos == end and n == count


def _run_length(data, start: int, width: int, stride: int, fit: int) -> int:
    """How many of the ``fit`` records from ``start`` (all within the data if they are
    ``stride`` bytes long) begin with the first one's ``width``-byte length prefix, so are
    ``stride`` bytes long; 0 when the first ``_RUN_PROBE`` do not (so a run is never shorter).
    Each column of prefix bytes is one strided slice; the first record that differs is found
    from the highest set bit of the column XOR its expected value."""
    probe = stride * (_RUN_PROBE - 1) + 1
    span = stride * (fit - 1) + 1
    run = fit
    for j in range(start, start + width):
        if data[j:j + probe:stride] != data[j:j + 1] * _RUN_PROBE:
            return 0
        column = data[j:j + span:stride]
        want = column[:1] * fit
        if column != want:
            diff = int.from_bytes(column, "big") ^ int.from_bytes(want, "big")
            run = min(run, fit - 1 - (diff.bit_length() - 1) // 8)
    return run


class AssignResult(NamedTuple):
    first_offset: int
    last_offset: int
    max_timestamp: int
    shallow_offset_of_max_timestamp: int  # last offset of the batch holding max_timestamp
    headers: list[BatchHeader]
    parts: list | None = None   # assign_offsets_gathered: the batches' bytes, to write in order


_OFFSET_PREFIX = struct.Struct(">qii")   # baseOffset, batchLength, partitionLeaderEpoch


def assign_offsets_gathered(data, headers: list[BatchHeader], base_offset: int,
                            leader_epoch: int) -> AssignResult:
    """``assign_offsets`` (CreateTime) without writing into ``data``: ``parts`` holds, per batch,
    its first 16 bytes with the new base offset and leader epoch, then a view of the rest of it.
    Written in order (``os.pwritev``) they are the bytes ``assign_offsets`` leaves in a copy of
    ``data``; ``data`` itself is not copied. The headers cover ``data`` end to end, as
    ``validate_batches`` returns them."""
    parts: list = []
    view = memoryview(data)

    def patch(h: BatchHeader, offset: int) -> BatchHeader:
        parts.append(_OFFSET_PREFIX.pack(offset, h.batch_length, leader_epoch))
        end = h.position + h.batch_length + LOG_OVERHEAD
        parts.append(view[h.position + _OFFSET_PREFIX.size:end])
        return h._replace(base_offset=offset, partition_leader_epoch=leader_epoch)

    return _assign(headers, base_offset, patch)._replace(parts=parts)


def assign_offsets(
    buf: bytearray | memoryview,
    headers: list[BatchHeader],
    base_offset: int,
    leader_epoch: int,
    log_append_time_ms: int | None = None,
) -> AssignResult:
    """Give the batches consecutive offsets from ``base_offset``, rewriting them in place.

    baseOffset and partitionLeaderEpoch lie outside the CRC, so the CRC is only recomputed when
    ``log_append_time_ms`` stamps the attributes and maxTimestamp (LogAppendTime topics).
    """
    with memoryview(buf) as view:
        def patch(h: BatchHeader, offset: int) -> BatchHeader:
            pos = h.position
            _INT64.pack_into(view, pos, offset)
            _INT32.pack_into(view, pos + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
            if log_append_time_ms is None:
                return h._replace(base_offset=offset, partition_leader_epoch=leader_epoch)
            attributes = h.attributes | TIMESTAMP_TYPE_MASK
            _INT16.pack_into(view, pos + ATTRIBUTES_OFFSET, attributes)
            _INT64.pack_into(view, pos + MAX_TIMESTAMP_OFFSET, log_append_time_ms)
            crc = crc32c(view[pos + ATTRIBUTES_OFFSET:pos + h.batch_length + LOG_OVERHEAD])
            _UINT32.pack_into(view, pos + CRC_OFFSET, crc)
            return h._replace(base_offset=offset, partition_leader_epoch=leader_epoch,
                              attributes=attributes, max_timestamp=log_append_time_ms, crc=crc)

        return _assign(headers, base_offset, patch)


def _assign(headers: list[BatchHeader], base_offset: int, patch) -> AssignResult:
    """Consecutive offsets from ``base_offset``; ``patch(header, offset)`` writes one batch's
    new fields and returns its new header."""
    if not headers:
        raise ValueError("no batches to assign offsets to")
    updated: list[BatchHeader] = []
    offset = base_offset
    max_timestamp = 0
    shallow = -1
    for h in headers:
        h = patch(h, offset)
        last = offset + h.last_offset_delta
        if shallow < 0 or h.max_timestamp > max_timestamp:
            max_timestamp = h.max_timestamp
            shallow = last
        updated.append(h)
        offset = last + 1
    return AssignResult(base_offset, offset - 1, max_timestamp, shallow, updated)
