"""Small value types shared by every layer."""

from __future__ import annotations

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
