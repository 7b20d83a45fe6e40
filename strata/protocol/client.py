"""A minimal Kafka client for requests the usual client libraries cannot spell (ListOffsets
-4/-5 among them, a replica's Fetch): frame a kio request, send it, read back its response.
``Connection`` blocks; ``AsyncConnection`` is the same on an asyncio event loop."""

from __future__ import annotations

import asyncio
import io
import socket
import struct

from kio.serial import entity_reader, entity_writer

__all__ = ["EARLIEST", "EARLIEST_LOCAL", "LATEST", "LATEST_TIERED", "MAX_TIMESTAMP",
           "AsyncConnection", "Connection", "client_frame", "fetch_request", "framed", "list_offset", "recv_exact", "roundtrip"]

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


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


class Connection:
    """One connection to a broker for requests in sequence (a context manager)."""

    def __init__(self, bootstrap: str, timeout: float = 10, client_id: str = "test-client") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self._correlation_id = 0

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def request(self, body, response_cls):
        """Send ``body``; its decoded response."""
        self._correlation_id += 1
        self.sock.sendall(framed(client_frame(body, self._correlation_id, self.client_id)))
        size = struct.unpack(">i", recv_exact(self.sock, 4))[0]
        return decode_response(response_cls, recv_exact(self.sock, size))


def decode_response(response_cls, payload: bytes):
    """A response frame (without its length prefix) decoded: the header skipped."""
    _, pos = entity_reader(response_cls.__header_schema__)(payload, 0)
    resp, _ = entity_reader(response_cls)(payload, pos)
    return resp


class AsyncConnection:
    """``Connection`` on the running event loop: requests in sequence, each bounded by
    ``timeout`` seconds (connecting too); ``open`` connects."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float, client_id: str) -> None:
        self._reader, self._writer = reader, writer
        self.timeout = timeout
        self.client_id = client_id
        self._correlation_id = 0

    @classmethod
    async def open(cls, address: str, timeout: float = 10,
                   client_id: str = "test-client") -> "AsyncConnection":
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, timeout, client_id)

    async def request(self, body, response_cls):
        """Send ``body``; its decoded response (TimeoutError after ``timeout``)."""
        self._correlation_id += 1
        self._writer.write(framed(client_frame(body, self._correlation_id, self.client_id)))
        return await asyncio.wait_for(self._response(response_cls), self.timeout)

    async def _response(self, response_cls):
        size = struct.unpack(">i", await self._reader.readexactly(4))[0]
        return decode_response(response_cls, await self._reader.readexactly(size))

    def close(self) -> None:
        self._writer.close()


def roundtrip(bootstrap: str, body, response_cls, timeout: float = 10):
    """Send one request on a fresh connection; its decoded response."""
    with Connection(bootstrap, timeout) as conn:
        return conn.request(body, response_cls)


def fetch_request(topic: str, partition: int, offset: int, *, partition_max_bytes: int = 1 << 20,
                  max_wait_ms: int = 500, min_bytes: int = 1):
    """A consumer's Fetch v12 of one partition (names, not topic ids); send it with
    ``Connection.request(req, FetchResponse)`` (``kio.schema.fetch.v12.response``)."""
    import datetime
    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.types import TopicName
    from kio.static.primitive import i32, i32Timedelta, i64
    return FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(min_bytes), topics=(FetchTopic(topic=TopicName(topic), partitions=(
            FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                           partition_max_bytes=i32(partition_max_bytes)),)),),
        forgotten_topics_data=())


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of a ListOffsets v9 for one partition."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),))
    p = roundtrip(bootstrap, req, ListOffsetsResponse).topics[0].partitions[0]
    code = p.error_code.value if hasattr(p.error_code, "value") else p.error_code
    return int(code), int(p.offset), int(p.leader_epoch)
