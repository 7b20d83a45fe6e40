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


def decode_response(response_cls, payload: bytes | memoryview):
    """A response frame (without its length prefix) decoded: the header skipped."""
    _, pos = entity_reader(response_cls.__header_schema__)(payload, 0)
    resp, _ = entity_reader(response_cls)(payload, pos)
    return resp


class AsyncConnection(asyncio.BufferedProtocol):
    """``Connection`` on the running event loop: requests in sequence, each bounded by
    ``timeout`` seconds (connecting too); ``open`` connects. Each response frame is received
    straight into a buffer of its own (no stream buffer to copy out of), and a request's
    deadline is a timer, not a task."""

    def __init__(self, timeout: float, client_id: str) -> None:
        self.timeout = timeout
        self.client_id = client_id
        self._correlation_id = 0
        self._transport: asyncio.Transport | None = None
        self._size = bytearray(4)
        self._frame: bytearray | None = None   # the frame being received, once its size is read
        self._got = 0
        self._waiter: asyncio.Future | None = None
        self._lost: BaseException | None = None

    @classmethod
    async def open(cls, address: str, timeout: float = 10,
                   client_id: str = "test-client") -> "AsyncConnection":
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(
            lambda: cls(timeout, client_id), host, int(port)), timeout)
        return conn

    async def request(self, body, response_cls):
        """Send ``body`` (a kio request); its decoded response (TimeoutError after ``timeout``)."""
        return await self.request_frame(
            lambda cid, client_id: framed(client_frame(body, cid, client_id)), response_cls)

    async def request_frame(self, frame, response_cls):
        """``request`` for a request encoded by ``frame(correlation_id, client_id)``: the bytes
        to send, length prefix included."""
        if self._lost is not None or self._transport is None:
            raise ConnectionError(f"connection closed: {self._lost}")
        self._correlation_id += 1
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self.timeout, self._time_out, waiter)
        self._transport.write(frame(self._correlation_id, self.client_id))
        try:
            answer = await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return decode_response(response_cls, memoryview(answer).toreadonly())

    def _time_out(self, waiter: asyncio.Future) -> None:
        if not waiter.done():   # closed: the late answer must not be taken for the next one's
            self._fail(TimeoutError(f"no response within {self.timeout:g} s"))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- asyncio.BufferedProtocol ---------------------------------------------------------

    def connection_made(self, transport) -> None:
        self._transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is None:
            return memoryview(self._size)[self._got:]
        return memoryview(self._frame)[self._got:]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._frame is None:
            if self._got < 4:
                return
            size = struct.unpack(">i", self._size)[0]
            if size < 0:
                self._fail(ConnectionError(f"a response frame of {size} bytes"))
                return
            self._frame, self._got = bytearray(size), 0
        if self._got < len(self._frame):
            return
        frame, self._frame, self._got = self._frame, None, 0
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(frame)
        elif waiter is None:   # nothing asked: the stream is out of step
            self._fail(ConnectionError("a response nothing asked for"))

    def eof_received(self) -> bool:
        self._fail(ConnectionError("broker closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed"))
        self._transport = None

    def _fail(self, exc: BaseException) -> None:
        if self._lost is None:
            self._lost = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()


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
