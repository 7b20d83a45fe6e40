"""The cleaner's record scan: where each record of a v2 batch lies, its offset, its key and
whether its value is null, as numpy arrays, without building ``Record`` objects.

Only the record length prefixes are walked one record at a time (each record's start depends
on the previous one's length); every other field is decoded for all records at once. A batch
whose records do not frame as its header says gives None: the caller decodes it with
``records.decode_batch``, which raises the error the cleaner reports.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from strata.protocol import records as rec
from strata.protocol.wire import read_varint

_PAD = b"\0" * 16   # so that reads past the last record's fields stay inside the array


class ScannedBatch(NamedTuple):
    """The records of one or more batches, their data joined in order."""
    data: bytes              # the batches' records (decompressed)
    starts: np.ndarray       # where each record begins (its length prefix), int64
    ends: np.ndarray         # where each record ends
    offsets: np.ndarray      # absolute offsets, int64
    key_starts: np.ndarray
    key_ends: np.ndarray
    has_key: np.ndarray      # bool
    value_null: np.ndarray   # bool: a tombstone
    first: list[int]         # the index of each batch's first record, then the record count


def _width(arr: np.ndarray, pos: np.ndarray, max_width: int) -> np.ndarray | None:
    """The byte widths of the varints at ``pos`` (None if one is longer than ``max_width``)."""
    width = np.ones(len(pos), np.int64)
    cont = arr[pos] >= 0x80
    for i in range(1, max_width):
        if not cont.any():
            return width
        width += cont
        cont &= arr[pos + i] >= 0x80
    return None if cont.any() else width


def _zigzag(arr: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The zig-zag int32 varints at ``pos`` and their widths (None if one is overlong)."""
    b = arr[pos].astype(np.int64)
    value = b & 0x7F
    width = np.ones(len(pos), np.int64)
    cont = b >= 0x80
    for i in range(1, 5):
        if not cont.any():
            break
        b = arr[pos + i].astype(np.int64)
        value |= np.where(cont, (b & 0x7F) << (7 * i), 0)
        width += cont
        cont &= b >= 0x80
    if cont.any():
        return None
    return (value >> 1) ^ -(value & 1), width


def _record_starts(data: bytes, pos: int, count: int, starts: list[int]) -> int | None:
    """Append the start of each of ``count`` records from ``pos``; where the last one ends."""
    append = starts.append
    try:
        for _ in range(count):
            append(pos)
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = read_varint(data, pos)
            if length <= 0:
                return None
            pos += length
    except (IndexError, ValueError):
        return None
    return pos


def batch_records(buf, h: rec.BatchHeader) -> bytes:
    """The records of batch ``h`` in ``buf``, decompressed (CRC and length checked)."""
    if h.magic != rec.CURRENT_MAGIC:
        raise rec.CorruptRecordError(f"cannot decode magic {h.magic} at {h.position}")
    start = h.position + rec.HEADER_SIZE
    end = h.position + h.batch_length + rec.LOG_OVERHEAD
    if h.batch_length < rec.MIN_BATCH_LENGTH or end > len(buf):
        raise rec.CorruptRecordError(f"batch at {h.position} has bad length {h.batch_length}")
    if not rec.batch_crc_ok(buf, h):
        raise rec.CorruptRecordError(f"CRC mismatch in batch at position {h.position}")
    with memoryview(buf) as view:
        data = bytes(view[start:end])
    codec = h.attributes & rec.COMPRESSION_MASK
    return rec._decompress(codec, data) if codec and data else data


def scan_batch(buf, h: rec.BatchHeader) -> ScannedBatch | None:
    """The records of data batch ``h`` (at least one record) in ``buf``; None when they do
    not frame as the header says. Raises ``CorruptRecordError`` for a bad CRC or codec."""
    return scan_batches([(buf, h)])


def scan_batches(batches: list[tuple[bytes, rec.BatchHeader]], *,
                 lenient: bool = False) -> ScannedBatch | None:
    """The records of data batches (each of at least one record), in order; None when one's
    records do not frame as its header says, or, ``lenient``, when one is corrupt."""
    try:
        parts = [batch_records(buf, h) for buf, h in batches]
    except rec.CorruptRecordError:
        if lenient:
            return None
        raise
    data = b"".join(parts) if len(parts) > 1 else parts[0]
    starts: list[int] = []
    first = []
    pos = 0
    for (_, h), part in zip(batches, parts):
        first.append(len(starts))
        end = pos + len(part)
        if h.record_count <= 0 or _record_starts(data, pos, h.record_count, starts) != end:
            return None
        pos = end
    first.append(len(starts))
    arr = np.frombuffer(data + _PAD, np.uint8)
    starts = np.array(starts, np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = pos
    length_width = _width(arr, starts, 5)
    if length_width is None:
        return None
    pos = starts + length_width + 1               # past the length and the attributes
    ts_width = _width(arr, np.minimum(pos, len(data)), 10)
    if ts_width is None:
        return None
    pos += ts_width
    if (pos >= ends).any():
        return None
    delta = _zigzag(arr, pos)
    if delta is None:
        return None
    pos += delta[1]
    if (pos >= ends).any():
        return None
    key_len = _zigzag(arr, pos)
    if key_len is None:
        return None
    klen, kwidth = key_len
    key_starts = pos + kwidth
    has_key = klen >= 0
    key_ends = key_starts + np.where(has_key, klen, 0)
    if (klen < -1).any() or (key_ends >= ends).any():
        return None
    value_len = _zigzag(arr, key_ends)
    if value_len is None:
        return None
    vlen, vwidth = value_len
    if (vlen < -1).any() or (key_ends + vwidth + np.maximum(vlen, 0) >= ends).any():
        return None
    counts = np.diff(first)
    bases = np.repeat(np.array([h.base_offset for _, h in batches], np.int64), counts)
    return ScannedBatch(data, starts, ends, bases + delta[0], key_starts, key_ends,
                        has_key, vlen == -1, first)


def keys_of(sb: ScannedBatch, index: np.ndarray) -> list[bytes]:
    """The keys of the records at ``index`` (which all have one)."""
    return list(map(sb.data.__getitem__,
                    map(slice, sb.key_starts[index].tolist(), sb.key_ends[index].tolist())))


def record_at(sb: ScannedBatch, h: rec.BatchHeader, i: int) -> rec.Record:
    """Record ``i`` of the batch, decoded as ``records.decode_batch`` decodes it."""
    append_time = h.max_timestamp if h.attributes & rec.TIMESTAMP_TYPE_MASK else None
    s, e = int(sb.starts[i]), int(sb.ends[i])
    return rec._parse_records(sb.data[s:e], 1, h.base_offset, h.base_timestamp, append_time)[0]
