"""A follower's Fetch request (v12), encoded without kio.

A replica fetcher sends one Fetch per round, and kio's pure-Python writer spent more time
building and encoding it (20-40 us) than the rest of the round's Python work. ``ReplicaFetch``
holds what the request carries and writes its frame directly; ``to_kio`` gives the same request
as kio's object, for code that wants one (blocking connections, tests).
"""

from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

__all__ = ["FETCH_KEY", "FETCH_VERSION", "PartitionFetch", "ReplicaFetch"]

FETCH_KEY, FETCH_VERSION = 1, 12

_HEAD = struct.Struct(">ihhih")          # size, api key, version, correlation id, client id length
_BODY = struct.Struct(">iiiibii")        # replica id .. session epoch
_PARTITION = struct.Struct(">iiqiqiB")   # one partition, then its (empty) tagged fields
_I32 = struct.Struct(">i")


class PartitionFetch(NamedTuple):
    """One partition of a Fetch v12, its fields in wire order."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


def _uvarint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compact_string(s: str) -> bytes:
    data = s.encode()
    return _uvarint(len(data) + 1) + data


class ReplicaFetch(NamedTuple):
    """A follower's Fetch v12: no cluster id, isolation READ_UNCOMMITTED, no rack."""

    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    session_id: int
    session_epoch: int
    topics: tuple[tuple[str, tuple[PartitionFetch, ...]], ...]
    forgotten: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def frame(self, correlation_id: int, client_id: str) -> bytes:
        """The request as sent: length prefix, header v2 and body."""
        cid = client_id.encode()
        parts = [b"", cid, b"\x00",   # the header's tagged fields
                 _BODY.pack(self.replica_id, self.max_wait_ms, self.min_bytes, self.max_bytes,
                            0, self.session_id, self.session_epoch),
                 _uvarint(len(self.topics) + 1)]
        pack = _PARTITION.pack
        for topic, partitions in self.topics:
            parts.append(_compact_string(topic))
            parts.append(_uvarint(len(partitions) + 1))
            parts.extend(pack(*p, 0) for p in partitions)
            parts.append(b"\x00")
        parts.append(_uvarint(len(self.forgotten) + 1))
        for topic, ids in self.forgotten:
            parts.append(_compact_string(topic))
            parts.append(_uvarint(len(ids) + 1))
            parts.extend(_I32.pack(i) for i in ids)
            parts.append(b"\x00")
        parts.append(b"\x01\x00")   # rack id "" and the body's tagged fields
        size = sum(map(len, parts)) + _HEAD.size - 4
        parts[0] = _HEAD.pack(size, FETCH_KEY, FETCH_VERSION, correlation_id, len(cid))
        return b"".join(parts)

    def to_kio(self):
        """The same request as kio's ``FetchRequest`` v12."""
        from kio.schema.fetch.v12.request import (
            FetchPartition, FetchRequest, FetchTopic, ForgottenTopic)
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i8, i32, i32Timedelta, i64
        return FetchRequest(
            replica_id=BrokerId(self.replica_id),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=self.max_wait_ms)),
            min_bytes=i32(self.min_bytes), max_bytes=i32(self.max_bytes), isolation_level=i8(0),
            session_id=i32(self.session_id), session_epoch=i32(self.session_epoch),
            topics=tuple(FetchTopic(topic=TopicName(topic), partitions=tuple(
                FetchPartition(partition=i32(p.partition),
                               current_leader_epoch=i32(p.current_leader_epoch),
                               fetch_offset=i64(p.fetch_offset),
                               last_fetched_epoch=i32(p.last_fetched_epoch),
                               log_start_offset=i64(p.log_start_offset),
                               partition_max_bytes=i32(p.partition_max_bytes))
                for p in partitions)) for topic, partitions in self.topics),
            forgotten_topics_data=tuple(
                ForgottenTopic(topic=TopicName(topic), partitions=tuple(i32(i) for i in ids))
                for topic, ids in self.forgotten))
