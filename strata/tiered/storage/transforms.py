"""Per-chunk transforms of stored segment data: zstd compression, then AES-256-GCM encryption
under a per-segment data key that is wrapped with RSA-OAEP (SHA-256) by a key pair of a ring.

A stored encrypted chunk is ``IV (12 bytes) || ciphertext || GCM tag (16 bytes)``, with the
segment's random AAD as associated data. Every failure is a RemoteStorageException.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cramjam
from crc32c import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from strata.tiered.api import RemoteStorageException

__all__ = [
    "BatchCheck",
    "ChunkTransform",
    "KeyRing",
    "SegmentEncryption",
    "first_batch_is_compressed",
    "new_data_key",
]

IV_SIZE = 12
TAG_SIZE = 16
DATA_KEY_SIZE = 32   # AES-256
AAD_SIZE = 32

_OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(),
                     label=None)


# --------------------------------------------------------------------------- key pairs


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentEncryption:
    """The manifest's ``encryption`` object: the data key wrapped under key pair
    ``key_pair_id`` (JSON ``"dataKey": "<keyPairId>:<base64>"``) and the AAD (base64)."""

    key_pair_id: str
    wrapped_key: bytes
    aad: bytes

    def to_json(self) -> dict[str, str]:
        return {"dataKey": f"{self.key_pair_id}:{base64.b64encode(self.wrapped_key).decode()}",
                "aad": base64.b64encode(self.aad).decode()}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SegmentEncryption:
        """ValueError when malformed."""
        try:
            key_pair_id, sep, wrapped = str(obj["dataKey"]).rpartition(":")
            if not sep or not key_pair_id:
                raise ValueError("dataKey is not <keyPairId>:<base64>")
            return cls(key_pair_id, base64.b64decode(wrapped, validate=True),
                       base64.b64decode(str(obj["aad"]), validate=True))
        except binascii.Error as e:
            raise ValueError(f"bad base64 in encryption metadata: {e}") from e


class KeyRing:
    """RSA key pairs by id, from the RSM keys ``encryption.key.pairs`` (comma list),
    ``encryption.key.pairs.<id>.private.key.file`` (PEM, required) and
    ``encryption.key.pairs.<id>.public.key.file`` (PEM, optional: derived from the private
    key; must match it when given). Immutable, thread-safe."""

    def __init__(self, pairs: Mapping[str, rsa.RSAPrivateKey] | None = None) -> None:
        self._private = dict(pairs or {})

    @classmethod
    def from_config(cls, configs: Mapping[str, Any]) -> KeyRing:
        ids = [i.strip() for i in str(configs.get("encryption.key.pairs", "") or "").split(",")]
        ids = [i for i in ids if i]
        pairs: dict[str, rsa.RSAPrivateKey] = {}
        for key_pair_id in ids:
            if ":" in key_pair_id or any(c.isspace() for c in key_pair_id):
                raise RemoteStorageException(
                    f"encryption.key.pairs: key pair id {key_pair_id!r} may not hold ':' or spaces")
            base = f"encryption.key.pairs.{key_pair_id}"
            private_file = configs.get(f"{base}.private.key.file")
            if not private_file:
                raise RemoteStorageException(f"{base}.private.key.file is required")
            private = _load_pem(f"{base}.private.key.file", private_file, private=True)
            public_file = configs.get(f"{base}.public.key.file")
            if public_file:
                public = _load_pem(f"{base}.public.key.file", public_file, private=False)
                if public.public_numbers() != private.public_key().public_numbers():
                    raise RemoteStorageException(
                        f"key pair {key_pair_id!r}: the public key does not match the private key")
            pairs[key_pair_id] = private
        return cls(pairs)

    @property
    def ids(self) -> list[str]:
        return list(self._private)

    def __contains__(self, key_pair_id: object) -> bool:
        return key_pair_id in self._private

    def wrap(self, key_pair_id: str, data_key: bytes) -> bytes:
        """``data_key`` encrypted with the public key of ``key_pair_id``."""
        return self._key(key_pair_id).public_key().encrypt(data_key, _OAEP)

    def unwrap(self, key_pair_id: str, wrapped: bytes) -> bytes:
        """The data key; RemoteStorageException naming the key pair when it is not in the
        ring or cannot decrypt ``wrapped``."""
        try:
            data_key = self._key(key_pair_id).decrypt(wrapped, _OAEP)
        except ValueError as e:
            raise RemoteStorageException(
                f"key pair {key_pair_id!r} cannot decrypt the segment's data key "
                f"(wrong private key?): {e}") from e
        if len(data_key) != DATA_KEY_SIZE:
            raise RemoteStorageException(
                f"key pair {key_pair_id!r}: data key of {len(data_key)} bytes, expected {DATA_KEY_SIZE}")
        return data_key

    def _key(self, key_pair_id: str) -> rsa.RSAPrivateKey:
        key = self._private.get(key_pair_id)
        if key is None:
            raise RemoteStorageException(
                f"key pair {key_pair_id!r} is not in encryption.key.pairs "
                f"(configured: {', '.join(self._private) or 'none'})")
        return key


def _load_pem(config_key: str, path: Any, *, private: bool) -> Any:
    try:
        data = Path(str(path)).read_bytes()
    except OSError as e:
        raise RemoteStorageException(f"{config_key}: cannot read {path}: {e}") from e
    try:
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))
    except (ValueError, TypeError) as e:
        raise RemoteStorageException(f"{config_key}: {path} is not an unencrypted PEM key: {e}") from e
    if not isinstance(key, rsa.RSAPrivateKey if private else rsa.RSAPublicKey):
        raise RemoteStorageException(f"{config_key}: {path} is not an RSA key")
    return key


# --------------------------------------------------------------------------- chunk transform


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkTransform:
    """Compress (zstd) then encrypt (AES-256-GCM with ``data_key``) one chunk; ``detransform``
    undoes both. The GCM associated data is the segment's ``aad`` followed by ``part``, the
    chunk's place in the segment (``b"log:7"``, ``b"index:OFFSET"``), so a stored chunk moved
    to another place fails authentication. Stateless, thread-safe."""

    compression: bool = False
    data_key: bytes | None = None
    aad: bytes = b""

    @property
    def identity(self) -> bool:
        return not self.compression and self.data_key is None

    def transform(self, data: bytes, part: bytes) -> bytes:
        if self.compression:
            data = bytes(cramjam.zstd.compress(data))
        if self.data_key is not None:
            iv = os.urandom(IV_SIZE)
            data = iv + AESGCM(self.data_key).encrypt(iv, data, self.aad + part)
        return data

    def detransform(self, data: bytes, part: bytes, original_size: int | None = None) -> bytes:
        """The original bytes; ValueError when they do not decrypt, decompress, or come
        out ``original_size`` bytes long (when given)."""
        if self.data_key is not None:
            if len(data) < IV_SIZE + TAG_SIZE:
                raise ValueError(f"encrypted chunk of {len(data)} bytes is too short")
            try:
                data = AESGCM(self.data_key).decrypt(data[:IV_SIZE], data[IV_SIZE:], self.aad + part)
            except InvalidTag:
                raise ValueError("chunk fails AES-GCM authentication") from None
        if self.compression:
            try:
                data = bytes(cramjam.zstd.decompress(data))
            except cramjam.DecompressionError as e:
                raise ValueError(f"chunk does not decompress: {e}") from e
        if original_size is not None and len(data) != original_size:
            raise ValueError(f"chunk holds {len(data)} bytes, expected {original_size}")
        return data


def new_data_key() -> tuple[bytes, bytes]:
    """A fresh random ``(AES-256 data key, AAD)`` for one segment."""
    return os.urandom(DATA_KEY_SIZE), os.urandom(AAD_SIZE)


# --------------------------------------------------------------------------- segment files

_BATCH_PREFIX = struct.Struct(">qiibIh")   # baseOffset, batchLength, leaderEpoch, magic, crc, attributes
_LOG_OVERHEAD = 12                         # baseOffset and batchLength
_CRC_FROM = 21                             # a batch's CRC32C covers its bytes from attributes on
_MIN_BATCH_SIZE = 61                       # the v2 batch header


def first_batch_is_compressed(path: str | os.PathLike[str]) -> bool:
    """True when the segment's first record batch (format v2) names a compression codec
    (attributes bits 0-2). An empty segment or an older format counts as uncompressed."""
    with open(path, "rb") as f:
        head = f.read(_BATCH_PREFIX.size)
    if len(head) < _BATCH_PREFIX.size:
        return False
    _, _, _, magic, _, attributes = _BATCH_PREFIX.unpack(head)
    return magic == 2 and attributes & 0x07 != 0


class BatchCheck:
    """Checks the record batches of a stream (a segment's bytes: format-v2 batches back to
    back) fed in pieces of any size, as a segment is read chunk by chunk: ``close()`` gives
    the position of the first batch that is cut short, of another format or fails its
    CRC32C, or None when every batch is intact. Only a batch that a piece's end cuts is
    copied, to be checked whole.

    With ``min_average`` set, a stream whose batches average fewer bytes than that (checked
    from its first MiB on) is given up: each batch costs a Python step, which small batches
    make dear. ``checked`` then turns False."""

    def __init__(self, min_average: int = 0) -> None:
        self.first_invalid: int | None = None
        self.checked = True
        self._min_average = min_average
        self._fed = 0                   # stream bytes fed so far
        self._batches = 0               # whole batches walked so far
        self._carry = bytearray()       # the start of a batch the last piece ended inside

    def feed(self, piece) -> None:
        if self.first_invalid is not None or not self.checked:
            return
        with memoryview(piece) as view:
            used = self._complete_carry(view) if self._carry else 0
            if self.first_invalid is None:
                bad, whole, count = _walk_batches(view, used)
                self._batches += count
                if bad is not None:
                    self.first_invalid = self._fed + bad
                else:
                    self._carry += view[whole:]
            self._fed += len(view)
        if self._fed >= 1 << 20 and self._batches * self._min_average > self._fed:
            self.checked = False
            self._carry = bytearray()

    def close(self) -> int | None:
        """The position of the first invalid batch (a batch left cut at the end is one)."""
        if self.first_invalid is None and self._carry and self.checked:
            self.first_invalid = self._fed - len(self._carry)
        return self.first_invalid

    def _complete_carry(self, view: memoryview) -> int:
        """Add to the carried batch what ``view`` holds of it, check it once whole; the bytes
        of ``view`` taken."""
        carry = self._carry
        start = self._fed - len(carry)
        taken = min(max(_MIN_BATCH_SIZE - len(carry), 0), len(view))
        carry += view[:taken]
        if len(carry) < _MIN_BATCH_SIZE:
            return taken
        _, length, _, magic, _, _ = _BATCH_PREFIX.unpack_from(carry)
        size = length + _LOG_OVERHEAD
        if size < _MIN_BATCH_SIZE or magic != 2:
            self.first_invalid = start
            return taken
        more = min(size - len(carry), len(view) - taken)
        carry += view[taken:taken + more]
        taken += more
        if len(carry) == size:
            self._batches += 1
            if _walk_batches(carry, 0)[0] is not None:
                self.first_invalid = start
            carry.clear()
        return taken


def _walk_batches(data, position: int) -> tuple[int | None, int, int]:
    """Check the whole batches of ``data`` from ``position``: (the position of the first
    invalid one or None, where the batch the data ends inside starts, batches passed)."""
    unpack = _BATCH_PREFIX.unpack_from
    end = len(data)
    count = 0
    with memoryview(data) as view:
        while end - position >= _MIN_BATCH_SIZE:
            _, length, _, magic, crc, _ = unpack(view, position)
            size = length + _LOG_OVERHEAD
            if size < _MIN_BATCH_SIZE or magic != 2:
                return position, position, count
            if position + size > end:
                break
            if crc32c(view[position + _CRC_FROM:position + size]) != crc:
                return position, position, count
            position += size
            count += 1
    return None, position, count
