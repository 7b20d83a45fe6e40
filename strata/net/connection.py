"""Connections to a broker for requests the usual client libraries cannot spell (ListOffsets
-4/-5 among them, a replica's Fetch): send a request framed by ``strata.protocol.client``, read
back its response. ``Connection`` blocks; ``AsyncConnection`` is the same on an asyncio event
loop. Given a ``ClientSecurity`` (the broker's own connections to another broker's
inter-broker listener), either speaks TLS (checking the host name if the context says so)
and/or logs in with SASL (SaslHandshake v1, then SaslAuthenticate v2 until the exchange ends)
before its first request."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Callable

from strata.common.errors import code_of
from strata.protocol.client import client_frame, decode_response, framed, list_offsets_request

__all__ = ["AsyncConnection", "ClientSecurity", "Connection", "list_offset", "recv_exact",
           "recv_into_exact", "roundtrip"]

_SIZE = struct.Struct(">i")


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` with the next bytes of ``sock``."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("broker closed the connection")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """The next ``n`` bytes of ``sock``, received straight into one buffer."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return buf


@dataclass(frozen=True)
class ClientSecurity:
    """How this broker reaches another: a TLS context and/or a SASL login (its mechanism and a
    factory of clients given the server's host: ``first()`` the first token,
    ``next(server_token)`` each answer, None once done; raising when the server's answer does
    not verify)."""

    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    sasl_client: Callable[[str], Any] | None = None


def _handshake_request(mechanism: str):
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
    from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
    return SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse


def _authenticate_request(token: bytes):
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
    return SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse


def _check(response, what: str) -> None:
    code = code_of(response.error_code)
    if code != 0:
        message = getattr(response, "error_message", None) or ""
        raise ConnectionError(f"SASL {what} refused ({code}): {message}")


class Connection:
    """One connection to a broker for requests in sequence (a context manager). Each response
    frame is received straight into a buffer of its own, and must carry its request's
    correlation id."""

    def __init__(self, address: str | tuple[str, int], timeout: float = 10,
                 client_id: str = "test-client", security: ClientSecurity | None = None) -> None:
        host, port = address.rsplit(":", 1) if isinstance(address, str) else address
        self.address = f"{host}:{port}"
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self._correlation_id = 0
        try:
            if security is not None and security.ssl_context is not None:
                self.sock = security.ssl_context.wrap_socket(self.sock,
                                                             server_hostname=host.strip("[]"))
            if security is not None and security.sasl_mechanism is not None:
                self._login(security, host.strip("[]"))
        except BaseException:
            self.sock.close()
            raise

    def _login(self, security: ClientSecurity, host: str) -> None:
        request, response_cls = _handshake_request(security.sasl_mechanism)
        _check(self.request(request, response_cls), "handshake")
        client = security.sasl_client(host)
        token = client.first()
        while token is not None:
            request, response_cls = _authenticate_request(token)
            answer = self.request(request, response_cls)
            _check(answer, "authentication")
            token = client.next(bytes(answer.auth_bytes))

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def request(self, body, response_cls):
        """Send ``body`` (a kio request); its decoded response."""
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        self.sock.sendall(framed(client_frame(body, self._correlation_id, self.client_id)))
        (size,) = _SIZE.unpack(recv_exact(self.sock, 4))
        if size < 0:
            raise ConnectionError(f"{self.address} sent a response frame of {size} bytes")
        payload = memoryview(recv_exact(self.sock, size)).toreadonly()  # kio reads read-only buffers
        try:
            return decode_response(response_cls, payload, self._correlation_id)
        except ConnectionError:   # out of step: nothing later on it can be trusted
            self.close()
            raise


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
    async def open(cls, address: str, timeout: float = 10, client_id: str = "test-client",
                   security: ClientSecurity | None = None) -> "AsyncConnection":
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        ssl_context = security.ssl_context if security is not None else None
        tls = {} if ssl_context is None else {"ssl": ssl_context,
                                              "server_hostname": host.strip("[]")}
        _, conn = await asyncio.wait_for(loop.create_connection(
            lambda: cls(timeout, client_id), host, int(port), **tls), timeout)
        if security is not None and security.sasl_mechanism is not None:
            try:
                await conn._login(security, host.strip("[]"))
            except BaseException:
                conn.close()
                raise
        return conn

    async def _login(self, security: ClientSecurity, host: str) -> None:
        request, response_cls = _handshake_request(security.sasl_mechanism)
        _check(await self.request(request, response_cls), "handshake")
        client = security.sasl_client(host)
        # off the event loop: GSSAPI's first token may wait for the KDC, SCRAM hashes
        token = await asyncio.to_thread(client.first)
        while token is not None:
            request, response_cls = _authenticate_request(token)
            answer = await self.request(request, response_cls)
            _check(answer, "authentication")
            token = await asyncio.to_thread(client.next, bytes(answer.auth_bytes))

    async def request(self, body, response_cls):
        """Send ``body`` (a kio request); its decoded response (TimeoutError after ``timeout``)."""
        return await self.request_frame(
            lambda cid, client_id: framed(client_frame(body, cid, client_id)), response_cls)

    async def request_frame(self, frame, response_cls):
        """``request`` for a request encoded by ``frame(correlation_id, client_id)``: the bytes
        to send, length prefix included."""
        if self._lost is not None or self._transport is None:
            raise ConnectionError(f"connection closed: {self._lost}")
        cid = self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self.timeout, self._time_out, waiter)
        self._transport.write(frame(cid, self.client_id))
        try:
            answer = await waiter
        finally:
            timer.cancel()
            self._waiter = None
        try:
            return decode_response(response_cls, memoryview(answer).toreadonly(), cid)
        except ConnectionError as exc:   # out of step: nothing later on it can be trusted
            self._fail(exc)
            raise

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
            (size,) = _SIZE.unpack(self._size)
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


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of a ListOffsets v9 for one partition."""
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    p = roundtrip(bootstrap, list_offsets_request(topic, partition, timestamp),
                  ListOffsetsResponse).topics[0].partitions[0]
    return code_of(p.error_code), int(p.offset), int(p.leader_epoch)
