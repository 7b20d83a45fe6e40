"""Kafka's text checkpoint files.

Format (Kafka's ``CheckpointFile``)::

    <version>\\n
    <entry count>\\n
    <entry>\\n          (one per line, fields separated by a single space)

Used for ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
``replication-offset-checkpoint`` (entries ``topic partition offset``) in each log directory, and
for each partition's ``leader-epoch-checkpoint`` (entries ``epoch startOffset``).

Writes go to ``<path>.tmp``, are flushed and fsynced, renamed over the file with ``os.replace`` and
then the directory is fsynced. Reads validate everything and raise ``KafkaStorageError`` naming the
file and line; a missing or empty file reads as no entries.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from strata.common.files import TMP_SUFFIX, atomic_write
from strata.common.errors import KafkaStorageError
from strata.common.types import TopicPartition
from strata.log.leader_epoch import EpochEntry

__all__ = [
    "CheckpointFile",
    "EntryFormatter",
    "EpochEntry",
    "LEADER_EPOCH_CHECKPOINT_FILENAME",
    "LOG_START_OFFSET_CHECKPOINT_FILENAME",
    "LeaderEpochCheckpointFile",
    "OffsetCheckpointFile",
    "RECOVERY_POINT_OFFSET_CHECKPOINT_FILENAME",
    "REPLICATION_OFFSET_CHECKPOINT_FILENAME",
    "decode_checkpoint",
    "decode_epoch_entries",
    "encode_checkpoint",
    "encode_epoch_entries",
]

LEADER_EPOCH_CHECKPOINT_FILENAME = "leader-epoch-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT_FILENAME = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILENAME = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT_FILENAME = "replication-offset-checkpoint"

T = TypeVar("T")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")
# Java's \s (the separator Kafka splits entries on), without Python's Unicode whitespace.
_JAVA_WS = re.compile(r"[ \t\n\x0b\f\r]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class MalformedLineError(ValueError):
    """Raised by an EntryFormatter for a line it cannot parse."""


class EntryFormatter(Protocol[T]):
    def to_line(self, entry: T) -> str: ...

    def from_line(self, line: str) -> T:
        """Parse one line; raise ValueError if it is malformed."""
        ...


def _parse_int(text: str, lo: int, hi: int) -> int:
    """Java's Integer/Long.parseInt: optional sign and ASCII digits only, range-checked."""
    if not _INT_RE.fullmatch(text):
        raise MalformedLineError(f"not an integer: {text!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise MalformedLineError(f"integer out of range: {text!r}")
    return value


def parse_int32(text: str) -> int:
    return _parse_int(text, _INT32_MIN, _INT32_MAX)


def parse_int64(text: str) -> int:
    return _parse_int(text, _INT64_MIN, _INT64_MAX)


def split_fields(line: str) -> list[str]:
    """Split like Java's ``Pattern.compile("\\\\s+").split(line)`` (trailing empties dropped)."""
    parts = _JAVA_WS.split(line)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def encode_checkpoint(version: int, entries: Iterable[T], formatter: EntryFormatter[T]) -> str:
    entries = list(entries)
    lines = [str(version), str(len(entries))]
    for entry in entries:
        line = formatter.to_line(entry)
        if _LINE_BREAK.search(line):
            raise ValueError(f"checkpoint entry {entry!r} formats to more than one line")
        lines.append(line)
    return "\n".join(lines) + "\n"


def decode_checkpoint(text: str, version: int, formatter: EntryFormatter[T],
                      location: str) -> list[T]:
    """Parse checkpoint text; raise KafkaStorageError naming ``location`` and the bad line."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()  # text ended with a line break
    if not lines:
        return []

    def malformed(lineno: int, why: str) -> KafkaStorageError:
        return KafkaStorageError(
            f"Malformed line {lineno} in checkpoint file [{location}]: {lines[lineno - 1]!r} ({why})")

    try:
        read_version = parse_int32(lines[0])
    except ValueError as e:
        raise malformed(1, str(e)) from None
    if read_version != version:
        raise KafkaStorageError(f"Unrecognised version: {read_version}, expected version: "
                                f"{version} in checkpoint file at: {location} (line 1)")
    if len(lines) < 2:
        return []  # Kafka reads a file without a count line as empty
    try:
        expected = parse_int32(lines[1])
    except ValueError as e:
        raise malformed(2, str(e)) from None
    if expected < 0:
        raise malformed(2, "negative entry count")
    entries: list[T] = []
    for lineno in range(3, len(lines) + 1):
        try:
            entries.append(formatter.from_line(lines[lineno - 1]))
        except ValueError as e:
            raise malformed(lineno, str(e)) from None
    if len(entries) != expected:
        raise KafkaStorageError(f"Expected [{expected}] entries in checkpoint file [{location}], "
                                f"but found [{len(entries)}]")
    return entries


class CheckpointFile(Generic[T]):
    """A versioned list of entries stored as text, rewritten atomically on every write."""

    def __init__(self, path: str | os.PathLike[str], version: int, formatter: EntryFormatter[T]):
        self._path = Path(path)
        self._version = version
        self._formatter = formatter
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def tmp_path(self) -> Path:
        return self._path.with_name(self._path.name + TMP_SUFFIX)

    def write(self, entries: Iterable[T], sync: bool = True) -> None:
        """Replace the file's content; raises KafkaStorageError on an I/O failure."""
        try:
            self._write(entries, sync)
        except OSError as e:
            raise KafkaStorageError(f"Error while writing to checkpoint file {self._path}: {e}") from e

    def write_if_dir_exists(self, entries: Iterable[T], sync: bool = True) -> bool:
        """Like :meth:`write`, but return False instead of failing if the directory is gone
        (the partition directory was deleted or renamed meanwhile)."""
        try:
            self._write(entries, sync)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            raise KafkaStorageError(f"Error while writing to checkpoint file {self._path}: {e}") from e

    def _write(self, entries: Iterable[T], sync: bool) -> None:
        data = encode_checkpoint(self._version, entries, self._formatter).encode("utf-8")
        with self._lock:
            atomic_write(self._path, data, sync)

    def read(self) -> list[T]:
        """The file's entries; ``[]`` if it is missing or empty."""
        with self._lock:
            try:
                raw = self._path.read_bytes()
            except FileNotFoundError:
                return []
            except OSError as e:
                raise KafkaStorageError(
                    f"Error while reading checkpoint file {self._path}: {e}") from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise KafkaStorageError(
                f"Error while reading checkpoint file {self._path}: not UTF-8 ({e})") from e
        return decode_checkpoint(text, self._version, self._formatter, str(self._path))


# ------------------------------------------------------------------- offsets


class _TopicPartitionOffsetFormatter:
    def to_line(self, entry: tuple[TopicPartition, int]) -> str:
        tp, offset = entry
        if not tp.topic or _JAVA_WS.search(tp.topic):
            raise ValueError(f"topic name {tp.topic!r} cannot be stored in a checkpoint file")
        return f"{tp.topic} {tp.partition} {offset}"

    def from_line(self, line: str) -> tuple[TopicPartition, int]:
        parts = split_fields(line)
        if len(parts) != 3 or not parts[0]:
            raise MalformedLineError("expected 'topic partition offset'")
        return TopicPartition(parts[0], parse_int32(parts[1])), parse_int64(parts[2])


class OffsetCheckpointFile:
    """``topic partition offset`` entries, version 0 (recovery point, log start offset, HW)."""

    CURRENT_VERSION = 0

    def __init__(self, path: str | os.PathLike[str]):
        self._checkpoint: CheckpointFile[tuple[TopicPartition, int]] = CheckpointFile(
            path, self.CURRENT_VERSION, _TopicPartitionOffsetFormatter())

    @property
    def path(self) -> Path:
        return self._checkpoint.path

    def write(self, offsets: Mapping[TopicPartition, int], sync: bool = True) -> None:
        self._checkpoint.write(list(offsets.items()), sync)

    def read(self) -> dict[TopicPartition, int]:
        return dict(self._checkpoint.read())


# -------------------------------------------------------------- leader epochs


class _EpochEntryFormatter:
    def to_line(self, entry: EpochEntry) -> str:
        return f"{entry.epoch} {entry.start_offset}"

    def from_line(self, line: str) -> EpochEntry:
        parts = split_fields(line)
        if len(parts) != 2:
            raise MalformedLineError("expected 'epoch startOffset'")
        return EpochEntry(parse_int32(parts[0]), parse_int64(parts[1]))


_EPOCH_FORMATTER = _EpochEntryFormatter()
LEADER_EPOCH_CHECKPOINT_VERSION = 0


def encode_epoch_entries(entries: Iterable[EpochEntry]) -> bytes:
    """The ``leader-epoch-checkpoint`` file content for ``entries``."""
    return encode_checkpoint(LEADER_EPOCH_CHECKPOINT_VERSION, entries, _EPOCH_FORMATTER).encode()


def decode_epoch_entries(data: bytes, source: str = "<leader epoch checkpoint bytes>") -> list[EpochEntry]:
    """Parse ``leader-epoch-checkpoint`` content; KafkaStorageError (naming ``source``) if bad."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise KafkaStorageError(f"Error while reading {source}: not UTF-8 ({e})") from e
    return decode_checkpoint(text, LEADER_EPOCH_CHECKPOINT_VERSION, _EPOCH_FORMATTER, source)


class LeaderEpochCheckpointFile:
    """``epoch startOffset`` entries, version 0 (a partition's ``leader-epoch-checkpoint``)."""

    CURRENT_VERSION = LEADER_EPOCH_CHECKPOINT_VERSION

    def __init__(self, path: str | os.PathLike[str]):
        self._checkpoint: CheckpointFile[EpochEntry] = CheckpointFile(
            path, self.CURRENT_VERSION, _EPOCH_FORMATTER)

    @classmethod
    def in_dir(cls, partition_dir: str | os.PathLike[str]) -> "LeaderEpochCheckpointFile":
        return cls(Path(partition_dir) / LEADER_EPOCH_CHECKPOINT_FILENAME)

    @property
    def path(self) -> Path:
        return self._checkpoint.path

    def write(self, entries: Iterable[EpochEntry], sync: bool = True) -> None:
        self._checkpoint.write(entries, sync)

    def write_if_dir_exists(self, entries: Iterable[EpochEntry], sync: bool = True) -> bool:
        return self._checkpoint.write_if_dir_exists(entries, sync)

    def read(self) -> list[EpochEntry]:
        return self._checkpoint.read()
