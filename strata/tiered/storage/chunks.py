"""Chunk indexes of a segment's ``.log`` object, in the JSON forms of Aiven's plugin.

The original segment file is cut into chunks of ``original_chunk_size`` bytes (the last may
be shorter); each chunk is stored, possibly transformed, and the stored chunks are
concatenated. A chunk index maps a chunk id to its original byte range and to its stored
byte range in the object. ``fixed``: every stored chunk has the same size except the last
(untransformed data). ``variable``: each stored size is listed (compressed or encrypted data).
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Union

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ChunkIndex",
    "FixedSizeChunkIndex",
    "VariableSizeChunkIndex",
    "chunk_index_from_json",
    "chunk_range",
    "decode_chunk_sizes",
    "decode_crcs",
    "encode_chunk_sizes",
    "encode_crcs",
]

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024     # the RSM's ``chunk.size`` when not configured
_INT32_MAX = 2**31 - 1


def _chunk_count(original_file_size: int, original_chunk_size: int) -> int:
    return -(-original_file_size // original_chunk_size)


def _check_sizes(original_chunk_size: int, original_file_size: int) -> None:
    if original_chunk_size <= 0:
        raise ValueError(f"originalChunkSize must be positive, got {original_chunk_size}")
    if original_file_size < 0:
        raise ValueError(f"originalFileSize must be >= 0, got {original_file_size}")


class _ChunkIndexBase:
    """Original-side arithmetic shared by both forms."""

    __slots__ = ()
    original_chunk_size: int
    original_file_size: int

    @property
    def chunk_count(self) -> int:
        return _chunk_count(self.original_file_size, self.original_chunk_size)

    def original_range(self, chunk_id: int) -> tuple[int, int]:
        """``[start, stop)`` of chunk ``chunk_id`` in the original file."""
        self._check_id(chunk_id)
        start = chunk_id * self.original_chunk_size
        return start, min(start + self.original_chunk_size, self.original_file_size)

    def chunk_id(self, position: int) -> int:
        """The chunk holding original byte ``position`` (which must be inside the file)."""
        if not 0 <= position < self.original_file_size:
            raise ValueError(f"position {position} is outside [0, {self.original_file_size})")
        return position // self.original_chunk_size

    def _check_id(self, chunk_id: int) -> None:
        if not 0 <= chunk_id < self.chunk_count:
            raise IndexError(f"chunk {chunk_id} is outside [0, {self.chunk_count})")


@dataclasses.dataclass(frozen=True, slots=True)
class FixedSizeChunkIndex(_ChunkIndexBase):
    """Aiven's ``fixed`` chunk index: every stored chunk is ``transformed_chunk_size`` bytes
    except the last (``final_transformed_chunk_size``)."""

    original_chunk_size: int
    original_file_size: int
    transformed_chunk_size: int
    final_transformed_chunk_size: int

    def __post_init__(self) -> None:
        _check_sizes(self.original_chunk_size, self.original_file_size)

    @classmethod
    def single_chunk(cls, file_size: int) -> FixedSizeChunkIndex:
        """The whole file as one untransformed chunk (manifest version 1)."""
        # Aiven requires a positive chunk size, even for an empty file.
        return cls(max(file_size, 1), file_size, max(file_size, 1), file_size)

    @classmethod
    def untransformed(cls, file_size: int, chunk_size: int) -> FixedSizeChunkIndex:
        """Chunks of ``chunk_size`` stored as they are."""
        last = file_size - (_chunk_count(file_size, chunk_size) - 1) * chunk_size if file_size else 0
        return cls(chunk_size, file_size, chunk_size, last)

    def stored_range(self, chunk_id: int) -> tuple[int, int]:
        """``[start, stop)`` of chunk ``chunk_id`` in the stored object."""
        self._check_id(chunk_id)
        start = chunk_id * self.transformed_chunk_size
        last = chunk_id == self.chunk_count - 1
        return start, start + (self.final_transformed_chunk_size if last else self.transformed_chunk_size)

    @property
    def stored_size(self) -> int:
        n = self.chunk_count
        return 0 if n == 0 else (n - 1) * self.transformed_chunk_size + self.final_transformed_chunk_size

    def to_json(self) -> dict[str, Any]:
        return {"type": "fixed", "originalChunkSize": self.original_chunk_size,
                "originalFileSize": self.original_file_size,
                "transformedChunkSize": self.transformed_chunk_size,
                "finalTransformedChunkSize": self.final_transformed_chunk_size}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FixedSizeChunkIndex:
        if obj.get("type") != "fixed":
            raise ValueError(f"unsupported chunk index type {obj.get('type')!r}")
        return cls(int(obj["originalChunkSize"]), int(obj["originalFileSize"]),
                   int(obj["transformedChunkSize"]), int(obj["finalTransformedChunkSize"]))


@dataclasses.dataclass(frozen=True, slots=True)
class VariableSizeChunkIndex(_ChunkIndexBase):
    """Aiven's ``variable`` chunk index: the stored size of every chunk, in order.

    JSON ``transformedChunks`` is ``encode_chunk_sizes`` in base64.
    """

    original_chunk_size: int
    original_file_size: int
    transformed_chunks: tuple[int, ...]
    _offsets: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_sizes(self.original_chunk_size, self.original_file_size)
        sizes = tuple(int(s) for s in self.transformed_chunks)
        if len(sizes) != self.chunk_count:
            raise ValueError(f"{len(sizes)} transformed chunk sizes for {self.chunk_count} chunks")
        if any(s < 0 for s in sizes):
            raise ValueError("transformed chunk sizes must be >= 0")
        object.__setattr__(self, "transformed_chunks", sizes)
        object.__setattr__(self, "_offsets", (0, *itertools.accumulate(sizes)))

    def stored_range(self, chunk_id: int) -> tuple[int, int]:
        """``[start, stop)`` of chunk ``chunk_id`` in the stored object."""
        self._check_id(chunk_id)
        return self._offsets[chunk_id], self._offsets[chunk_id + 1]

    @property
    def stored_size(self) -> int:
        return self._offsets[-1]

    def to_json(self) -> dict[str, Any]:
        return {"type": "variable", "originalChunkSize": self.original_chunk_size,
                "originalFileSize": self.original_file_size,
                "transformedChunks": base64.b64encode(
                    encode_chunk_sizes(self.transformed_chunks)).decode("ascii")}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> VariableSizeChunkIndex:
        if obj.get("type") != "variable":
            raise ValueError(f"unsupported chunk index type {obj.get('type')!r}")
        sizes = decode_chunk_sizes(base64.b64decode(obj["transformedChunks"], validate=True))
        return cls(int(obj["originalChunkSize"]), int(obj["originalFileSize"]), tuple(sizes))


ChunkIndex = Union[FixedSizeChunkIndex, VariableSizeChunkIndex]


def chunk_index_from_json(obj: Mapping[str, Any]) -> ChunkIndex:
    """Either form, by its ``type``; ValueError for anything else."""
    kind = obj.get("type")
    if kind == "fixed":
        return FixedSizeChunkIndex.from_json(obj)
    if kind == "variable":
        return VariableSizeChunkIndex.from_json(obj)
    raise ValueError(f"unsupported chunk index type {kind!r}")


def chunk_range(manifest: Any, start: int, end: int) -> range:
    """The ids of the chunks holding original bytes ``[start, end)`` (end exclusive, clamped
    to the file's size). ``manifest`` is a SegmentManifest or a chunk index."""
    index: ChunkIndex = getattr(manifest, "chunk_index", manifest)
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    end = min(end, index.original_file_size)
    if start >= end:
        return range(0)
    return range(start // index.original_chunk_size, (end - 1) // index.original_chunk_size + 1)


# --------------------------------------------------------------------------- binary codecs


def encode_chunk_sizes(values: Sequence[int]) -> bytes:
    """A compact big-endian encoding of a list of int32 >= 0, the layout of Aiven's
    ``transformedChunks``: ``count`` (int32); then, for one value, that value (int32); for
    more, ``base`` = the minimum of all but the last (int32), ``width`` (1 byte, 1-4), each
    value but the last minus ``base`` in ``width`` bytes, and the last value (int32)."""
    count = len(values)
    if any(not 0 <= v <= _INT32_MAX for v in values):
        raise ValueError("chunk sizes must be int32 values >= 0")
    if count == 0:
        return struct.pack(">i", 0)
    if count == 1:
        return struct.pack(">ii", 1, values[0])
    body = values[:-1]
    base = min(body)
    width = max(1, (max(body) - base).bit_length() + 7 >> 3)
    packed = b"".join((v - base).to_bytes(width, "big") for v in body)
    return struct.pack(">iiB", count, base, width) + packed + struct.pack(">i", values[-1])


def decode_chunk_sizes(data: bytes) -> list[int]:
    """The inverse of ``encode_chunk_sizes``; ValueError when malformed."""
    try:
        (count,) = struct.unpack_from(">i", data, 0)
        if count < 0:
            raise ValueError(f"negative chunk count {count}")
        if count == 0:
            expected, values = 4, []
        elif count == 1:
            expected, values = 8, [struct.unpack_from(">i", data, 4)[0]]
        else:
            base, width = struct.unpack_from(">iB", data, 4)
            if not 1 <= width <= 4:
                raise ValueError(f"bad value width {width}")
            pos = 9
            values = [base + int.from_bytes(data[pos + i * width:pos + (i + 1) * width], "big")
                      for i in range(count - 1)]
            pos += (count - 1) * width
            values.append(struct.unpack_from(">i", data, pos)[0])
            expected = pos + 4
    except struct.error as e:
        raise ValueError(f"truncated chunk sizes: {e}") from e
    if len(data) != expected:
        raise ValueError(f"chunk sizes take {expected} bytes, got {len(data)}")
    return values


def encode_crcs(crcs: Sequence[int]) -> str:
    """Base64 of the CRC32C values as big-endian uint32s, in chunk order."""
    return base64.b64encode(struct.pack(f">{len(crcs)}I", *crcs)).decode("ascii")


def decode_crcs(text: str) -> tuple[int, ...]:
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError(f"CRC list of {len(raw)} bytes is not a multiple of 4")
    return struct.unpack(f">{len(raw) // 4}I", raw)
