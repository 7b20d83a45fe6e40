"""Requests as a client writes them, without I/O: a kio request framed (header and length
prefix), a response frame decoded, and the requests Strata's own tools build by hand.
``strata.net.connection`` sends them over sockets."""

from __future__ import annotations

import io
import struct

from kio.serial import entity_reader, entity_writer

__all__ = ["EARLIEST", "EARLIEST_LOCAL", "LATEST", "LATEST_TIERED", "MAX_TIMESTAMP",
           "client_frame", "decode_response", "fetch_request", "framed", "list_offsets_request"]

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


def client_frame(body, correlation_id: int = 7, client_id: str | None = "test-client") -> bytes:
    """What a client puts after the length prefix: header (the version kio gives this request)
    and body."""
    header_cls = body.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(
        request_api_key=body.__api_key__, request_api_version=body.__version__,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def decode_response(response_cls, payload: bytes | memoryview, correlation_id: int | None = None):
    """A response frame (without its length prefix) decoded, its header skipped; with
    ``correlation_id``, ConnectionError unless the header carries it (the stream is out of step)."""
    header, pos = entity_reader(response_cls.__header_schema__)(payload, 0)
    if correlation_id is not None and int(header.correlation_id) != correlation_id:
        raise ConnectionError(f"the answer to request {correlation_id} carries correlation id "
                              f"{int(header.correlation_id)}")
    resp, _ = entity_reader(response_cls)(payload, pos)
    return resp


def fetch_request(topic: str, partition: int, offset: int, *, partition_max_bytes: int = 1 << 20,
                  max_wait_ms: int = 500, min_bytes: int = 1, isolation_level: int = 0):
    """A consumer's Fetch v12 of one partition (names, not topic ids); send it with
    ``Connection.request(req, FetchResponse)`` (``kio.schema.fetch.v12.response``).
    ``isolation_level`` 1 is read_committed."""
    import datetime
    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.types import TopicName
    from kio.static.primitive import i8, i32, i32Timedelta, i64
    return FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(min_bytes), isolation_level=i8(isolation_level),
        topics=(FetchTopic(topic=TopicName(topic), partitions=(
            FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                           partition_max_bytes=i32(partition_max_bytes)),)),),
        forgotten_topics_data=())


def list_offsets_request(topic: str, partition: int, timestamp: int):
    """A ListOffsets v9 of one partition at ``timestamp`` (or one of the constants above)."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    return ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),))
