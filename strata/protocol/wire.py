"""Kafka's wire primitives, written once for every codec in ``protocol`` (``codec``'s pre-scan,
``produce_wire``, ``fetch_wire`` and the RecordBatch format in ``records``).

* unsigned varints: the lengths of compact strings, bytes and arrays (length + 1, 0 for null),
  tag numbers and tagged-field sizes; ``uvarint`` reads one within ``[pos, end)``,
  ``encode_uvarint`` writes one;
* zig-zag varints: the fields of a RecordBatch's records; ``read_varint`` and ``write_varint``;
* compact strings (``encode_compact_string``) and tagged fields (``skip_tags`` passes over a
  tagged-field section without reading it);
* ``Malformed``: input that does not fit in the frame it came in.

Readers take ``(buf, pos[, end])`` and return ``(value, next position)``. Hot loops may inline
the one- and two-byte cases of a varint (``records._parse_records``, the validator's framing
walk) and call these for the rest.
"""

from __future__ import annotations

__all__ = ["Malformed", "encode_compact_string", "encode_uvarint", "read_varint", "skip_tags",
           "uvarint", "write_varint"]


class Malformed(Exception):
    """Input that does not fit in its frame (a truncated or overlong varint, a length past the
    end); ``codec.parse_request`` answers it with ``MalformedRequest``."""


def uvarint(buf, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (32 bits) at ``pos``, within ``buf[:end]``."""
    if pos >= end:
        raise Malformed("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise Malformed("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 35:
            raise Malformed("varint too long")


def encode_uvarint(n: int) -> bytes:
    """An unsigned varint (compact lengths, tag numbers and sizes)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_compact_string(s: str) -> bytes:
    """A non-null compact string: its UTF-8 length + 1 as an unsigned varint, then the bytes."""
    data = s.encode()
    return encode_uvarint(len(data) + 1) + data


def skip_tags(buf, pos: int, end: int) -> int:
    """The position after the tagged-field section at ``pos``, every field skipped unread."""
    count, pos = uvarint(buf, pos, end)
    for _ in range(count):
        _tag, pos = uvarint(buf, pos, end)
        size, pos = uvarint(buf, pos, end)
        pos += size
        if pos > end:
            raise Malformed("tagged field longer than frame")
    return pos


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


def write_varint(out: bytearray, n: int) -> None:
    """Append ``n`` as a zig-zag varint."""
    z = n << 1 if n >= 0 else ((-n) << 1) - 1
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
