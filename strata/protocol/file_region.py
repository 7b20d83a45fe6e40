"""Record bytes left in a segment file, for zero-copy Fetch (``sendfile`` to the socket).

A Fetch response's records field may be a ``FileRegion`` instead of bytes: the codec keeps it
as its own part and the connection sends it with ``os.sendfile``; where that cannot be used the
region is read into memory (``read``) and sent as bytes, so both paths put the same bytes on the
wire.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator, NamedTuple

from strata.protocol.records import BASE_OFFSET_LENGTH, HEADER, HEADER_SIZE, LOG_OVERHEAD, BatchHeader

_WALK_BLOCK = 16 * 1024   # bytes read per pread while walking batch lengths in a file


class BatchCut(NamedTuple):
    """Where a range's complete batches end, and what follows them when that was read."""

    length: int         # bytes of the complete batches
    next_offset: int    # base offset of the batch after them; -1 when its header was not read
    next_size: int      # that batch's size in bytes (0 when not read)


def whole_batches_cut(read: Callable[[int, int], bytes], length: int, block: int,
                      start: int = 0) -> BatchCut:
    """The complete batches at the start of a ``length``-byte range.

    ``start`` is a batch boundary known to lie in the range (everything before it is whole
    batches), where the walk begins. ``read(pos, n)`` returns the range's bytes
    ``[pos, pos + n)``; it is called once per ``block`` of small batches, or once per batch when
    batches are larger than ``block``. When the range ends inside a batch whose header it
    holds, that batch's base offset and size come back too (where a sequential reader goes next).
    """
    unpack = BASE_OFFSET_LENGTH.unpack_from
    end = start
    buf, buf_start = b"", 0
    while end + LOG_OVERHEAD <= length:
        if end + LOG_OVERHEAD > buf_start + len(buf):
            buf_start = end
            buf = read(end, min(block, length - end))
            if len(buf) < LOG_OVERHEAD:
                break
        base_offset, size = unpack(buf, end - buf_start)
        size += LOG_OVERHEAD
        if size <= LOG_OVERHEAD:
            break
        if end + size > length:
            return BatchCut(end, base_offset, size)
        end += size
    return BatchCut(end, -1, 0)


def whole_batches_length(read: Callable[[int, int], bytes], length: int, block: int,
                         start: int = 0) -> int:
    """Bytes of the complete batches at the start of a ``length``-byte range
    (``whole_batches_cut``'s length)."""
    return whole_batches_cut(read, length, block, start).length


class FileRegion:
    """``length`` bytes at ``position`` of a file, through a descriptor this object owns.

    The descriptor is a ``dup`` of the segment's, taken under the log's lock, so the bytes stay
    readable after retention closes and deletes the segment (as Kafka's FileRecords keep their
    channel open). ``close`` releases it; it is idempotent, and also runs when the region is
    garbage collected, so a region dropped unsent (an error answer, a long-poll retry, a lost
    connection) leaks nothing. ``sent`` counts bytes already handed to the socket. Used by one
    thread at a time: the log's reader creates it, then the event loop owns it.
    """

    __slots__ = ("fd", "position", "length", "sent")

    def __init__(self, fd: int, position: int, length: int):
        self.fd = os.dup(fd)
        self.position = position
        self.length = length
        self.sent = 0

    @classmethod
    def of_whole_batches(cls, fd: int, position: int, budget: int,
                         boundary: int = 0) -> "tuple[FileRegion | bytes, BatchCut]":
        """The complete batches among the ``budget`` bytes at ``position`` of ``fd`` (the same
        cut as reading them and trimming a torn tail; ``b""`` when there are none), and the cut.
        ``boundary`` (relative to ``position``) is a batch start known from the offset index:
        only the batches after it are walked, so the records are not read into memory."""
        cut = whole_batches_cut(lambda pos, n: os.pread(fd, n, position + pos),
                                budget, _WALK_BLOCK, boundary)
        return (cls(fd, position, cut.length) if cut.length else b""), cut

    def __len__(self) -> int:
        return self.length

    def read(self) -> bytes:
        """The region's bytes (the copying fallback)."""
        data = os.pread(self.fd, self.length, self.position)
        if len(data) != self.length:
            raise OSError(f"file region of {self.length} bytes at {self.position} "
                          f"reads only {len(data)}")
        return data

    def headers(self) -> Iterator[BatchHeader]:
        """Headers of the region's batches (positions relative to the region)."""
        pos = 0
        while pos + HEADER_SIZE <= self.length:
            head = os.pread(self.fd, HEADER_SIZE, self.position + pos)
            if len(head) < HEADER_SIZE:
                return
            found = BatchHeader(*HEADER.unpack(head), pos)
            if found.size < HEADER_SIZE:
                return
            yield found
            pos += found.size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    __del__ = close

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, length={self.length})"
