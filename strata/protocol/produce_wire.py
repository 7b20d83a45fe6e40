"""Produce requests read without copying their records.

kio's reader copies each partition's records into a new ``bytes``: a second pass over every
produced byte before the log's own. ``produce_reader(cls)`` reads Produce v3-v11 into the same
kio entities, with each ``records`` a read-only ``memoryview`` of the frame. The caller owns the
frame and must not reuse it while the request lives (the network layer hands each frame over
whole). ``parse_request`` runs its bounds pre-scan first, so a count or length here never
claims more bytes than the frame has; anything else malformed raises, as kio's reader would.
"""

from __future__ import annotations

import datetime
import struct
import typing
from typing import Callable

from strata.protocol.wire import Malformed, skip_tags, uvarint

__all__ = ["FIRST_VERSION", "produce_reader"]

FIRST_VERSION = 3    # v0-v2 (no transactional id) are left to kio's reader

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


def _element(tuple_type) -> type:
    return typing.get_args(tuple_type)[0]


def produce_reader(cls: type) -> Callable:
    """A reader for kio's Produce request class ``cls`` (v3-v11): ``read(buf, pos)`` gives the
    body and the bytes it took, as kio's ``entity_reader(cls)`` does."""
    hints = typing.get_type_hints(cls)
    topic_cls = _element(hints["topic_data"])
    partition_cls = _element(typing.get_type_hints(topic_cls)["partition_data"])
    flexible = cls.__flexible__

    def length(buf, pos: int) -> tuple[int, int]:
        """A string, bytes or array length: -1 for null."""
        if flexible:
            n, pos = uvarint(buf, pos, len(buf))
            return n - 1, pos
        return _I32.unpack_from(buf, pos)[0], pos + 4

    def count(buf, pos: int) -> tuple[int, int]:
        n, pos = length(buf, pos)
        if n < 0:
            raise Malformed("null array")
        return n, pos

    def string(buf, pos: int, nullable: bool) -> tuple[str | None, int]:
        if flexible:
            n, pos = length(buf, pos)
        else:   # a classic string's length is an int16, not length()'s int32
            n, pos = _I16.unpack_from(buf, pos)[0], pos + 2
        if n < 0:
            if n == -1 and nullable:
                return None, pos
            raise Malformed("null or negative string length")
        return str(buf[pos:pos + n], "utf-8"), pos + n

    def read(buf, pos: int):
        start = pos
        view = memoryview(buf)
        transactional_id, pos = string(buf, pos, True)
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
        pos += 6
        topics = []
        n_topics, pos = count(buf, pos)
        for _ in range(n_topics):
            name, pos = string(buf, pos, False)
            partitions = []
            n_parts, pos = count(buf, pos)
            for _ in range(n_parts):
                (index,) = _I32.unpack_from(buf, pos)
                size, pos = length(buf, pos + 4)
                if size < -1:
                    raise Malformed("negative records length")
                records = None if size == -1 else view[pos:pos + size]
                pos += max(size, 0)
                if flexible:
                    pos = skip_tags(buf, pos, len(buf))
                partitions.append(partition_cls(index=index, records=records))
            if flexible:
                pos = skip_tags(buf, pos, len(buf))
            topics.append(topic_cls(name=name, partition_data=tuple(partitions)))
        if flexible:
            pos = skip_tags(buf, pos, len(buf))
        body = cls(transactional_id=transactional_id, acks=acks,
                   timeout=datetime.timedelta(milliseconds=timeout_ms), topic_data=tuple(topics))
        return body, pos - start

    return read
