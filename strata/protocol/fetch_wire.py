"""Fetch on the wire without kio's pure-Python writer: a follower's request, and every
response the broker sends.

Each acks=all record costs a follower one Fetch request and its leader one Fetch response, and
kio's writer took longer to build and encode them than the rest of the round's Python work
(docs/benchmarks.md, "Fetch written without kio"). Both are written here directly, byte for
byte as kio writes them (the tests compare the two):

* ``ReplicaFetch`` holds what a follower's Fetch v12 carries and writes its frame; ``to_kio``
  gives the same request as kio's object, for code that wants one (blocking connections, tests).
* ``write_fetch_response(sink, body)`` writes any kio ``FetchResponse`` (v4-v12) to a sink with
  ``write``; records (bytes, views or ``FileRegion``s) are passed to it whole, one ``write``
  each, so the sink can keep them by reference.
"""

from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

from strata.protocol.wire import encode_compact_string, encode_uvarint

__all__ = ["FETCH_KEY", "FETCH_VERSION", "PartitionFetch", "ReplicaFetch",
           "fetch_response_writable", "write_fetch_response"]

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
                 encode_uvarint(len(self.topics) + 1)]
        pack = _PARTITION.pack
        for topic, partitions in self.topics:
            parts.append(encode_compact_string(topic))
            parts.append(encode_uvarint(len(partitions) + 1))
            parts.extend(pack(*p, 0) for p in partitions)
            parts.append(b"\x00")
        parts.append(encode_uvarint(len(self.forgotten) + 1))
        for topic, ids in self.forgotten:
            parts.append(encode_compact_string(topic))
            parts.append(encode_uvarint(len(ids) + 1))
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


# ---- responses ------------------------------------------------------------------------------

_FIXED = {v: struct.Struct(">ihqq" + ("q" if v >= 5 else "")) for v in range(4, 13)}
_TOP_V7 = struct.Struct(">ihi")
_ABORTED = struct.Struct(">qq")
# v12's partition tags, each with its size and its own (empty) tagged fields
_TAG_EPOCH = struct.Struct(">BBiqB")      # 0: diverging epoch (epoch, end offset)
_TAG_LEADER = struct.Struct(">BBiiB")     # 1: current leader (leader id, leader epoch)
_TAG_SNAPSHOT = struct.Struct(">BBqiB")   # 2: snapshot id (end offset, epoch)
_I16 = struct.Struct(">h")
_NULL32 = _I32.pack(-1)
_TAG_DEFAULTS: dict[type, tuple] = {}


def _tag_defaults(body_cls) -> tuple:
    """The kio defaults of a v12 partition's tagged fields (diverging epoch, current leader,
    snapshot id): a field equal to its default is not written."""
    defaults = _TAG_DEFAULTS.get(body_cls)
    if defaults is None:
        import typing
        topic_cls = typing.get_args(body_cls.__dataclass_fields__["responses"].type)[0]
        partition_cls = typing.get_args(topic_cls.__dataclass_fields__["partitions"].type)[0]
        fields = partition_cls.__dataclass_fields__
        defaults = _TAG_DEFAULTS[body_cls] = tuple(
            fields[n].default for n in ("diverging_epoch", "current_leader", "snapshot_id"))
    return defaults


def fetch_response_writable(body) -> bool:
    """Whether ``write_fetch_response`` writes ``body``: a Fetch response, v4-v12."""
    return body.__api_key__ == FETCH_KEY and 4 <= body.__version__ <= 12


def _partition_tags(p, defaults: tuple) -> bytes:
    """A v12 partition's tagged fields: those that differ from their defaults, in tag order."""
    no_divergence, no_leader, no_snapshot = defaults
    d, leader, snapshot = p.diverging_epoch, p.current_leader, p.snapshot_id
    if d == no_divergence and leader == no_leader and snapshot == no_snapshot:
        return b"\x00"
    tags = []
    if d != no_divergence:
        tags.append(_TAG_EPOCH.pack(0, 13, d.epoch, d.end_offset, 0))
    if leader != no_leader:
        tags.append(_TAG_LEADER.pack(1, 9, leader.leader_id, leader.leader_epoch, 0))
    if snapshot != no_snapshot:
        tags.append(_TAG_SNAPSHOT.pack(2, 13, snapshot.end_offset, snapshot.epoch, 0))
    return bytes((len(tags),)) + b"".join(tags)


def write_fetch_response(sink, body) -> None:
    """Write ``body`` (``fetch_response_writable``) as kio would: small fields gathered into
    few writes, each partition's records in one."""
    version = body.__version__
    flexible = version >= 12
    fixed = _FIXED[version].pack
    write = sink.write
    head = bytearray(_TOP_V7.pack(round(body.throttle_time.total_seconds() * 1000),
                                  body.error_code.value, body.session_id) if version >= 7
                     else _I32.pack(round(body.throttle_time.total_seconds() * 1000)))
    defaults = _tag_defaults(type(body)) if flexible else None
    responses = body.responses
    head += encode_uvarint(len(responses) + 1) if flexible else _I32.pack(len(responses))
    for t in responses:
        name = t.topic.encode()
        partitions = t.partitions
        if flexible:
            head += encode_uvarint(len(name) + 1)
            head += name
            head += encode_uvarint(len(partitions) + 1)
        else:
            head += _I16.pack(len(name))
            head += name
            head += _I32.pack(len(partitions))
        for p in partitions:
            fields = (p.partition_index, p.error_code.value, p.high_watermark, p.last_stable_offset)
            head += fixed(*fields, p.log_start_offset) if version >= 5 else fixed(*fields)
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\x00" if flexible else _NULL32
            else:
                head += encode_uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for a in aborted:
                    head += _ABORTED.pack(a.producer_id, a.first_offset)
                    if flexible:
                        head += b"\x00"
            if version >= 11:
                head += _I32.pack(p.preferred_read_replica)
            records = p.records
            if records is None:
                head += b"\x00" if flexible else _NULL32
            else:
                n = len(records)
                head += encode_uvarint(n + 1) if flexible else _I32.pack(n)
                if n:
                    write(head)
                    write(records)
                    head = bytearray()
            if flexible:
                head += _partition_tags(p, defaults)
        if flexible:
            head += b"\x00"
    if flexible:
        head += b"\x00"
    write(head)
