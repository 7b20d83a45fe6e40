"""Small value types shared by every layer."""

from __future__ import annotations

import base64
import uuid
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def from_dir_name(cls, name: str) -> "TopicPartition":
        """Parse a partition directory name such as ``orders-3`` (topics may contain ``-``)."""
        topic, sep, part = name.rpartition("-")
        if not sep or not topic or not part.isdigit():
            raise ValueError(f"not a partition directory name: {name!r}")
        return cls(topic, int(part))


class TopicIdPartition(NamedTuple):
    topic_id: uuid.UUID
    topic_partition: TopicPartition

    @property
    def topic(self) -> str:
        return self.topic_partition.topic

    @property
    def partition(self) -> int:
        return self.topic_partition.partition

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.topic_partition}"


class OffsetAndEpoch(NamedTuple):
    offset: int
    leader_epoch: int


UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1


def uuid_to_kafka_str(u: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, no padding (22 chars)."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode("ascii")


def uuid_from_kafka_str(s: str) -> uuid.UUID:
    """Kafka's ``Uuid.fromString``; raises ``ValueError`` for anything but 16 encoded bytes."""
    if len(s) > 24:
        raise ValueError(f"Input string with prefix `{s[:24]}` is too long to be decoded as a "
                         "base64 UUID")
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if len(raw) != 16:
        raise ValueError(f"Input string `{s}` decoded as {len(raw)} bytes, which is not equal to "
                         "the expected 16 bytes of a base64-encoded UUID")
    return uuid.UUID(bytes=raw)
