"""The Kafka listener: connections, frames, in-order processing and backpressure.

Per connection, requests are handled one at a time in arrival order and answered in that
order, as Kafka does (clients pipeline up to ``max.in.flight`` requests; they queue here). At
most ``max_queued_requests`` frames wait per connection: beyond that the transport stops
reading until the queue drains (TCP pushes back on the client). Responses ready in one turn of
the event loop leave in one write (one send syscall for a pipelined burst, not one each), and
the next request waits while the transport is above its high-water mark, so a slow reader
cannot make the broker buffer without bound.

Receiving (``asyncio.BufferedProtocol``): small frames are read into a 16 KiB buffer per
connection and copied out whole; a frame of 4 KiB or more that is not yet whole gets a buffer of
its own, sized from its length prefix, which the socket then fills directly (as Kafka's
``NetworkReceive``), so a produce request's records are not copied on their way in.

Zero-copy Fetch: a response part that is a ``FileRegion`` (records in a segment file) is sent
with ``os.sendfile`` on the connection's socket once the transport's buffer is empty; the parts
after it wait in ``_pending`` behind it, so responses stay in order, and the next request waits
while more than the high-water mark is pending. Without a plain socket (TLS, or
``sendfile=False``) regions are read into memory and written like any other part.

After a SaslHandshake v0, SASL tokens arrive as raw frames without a request header; they go to
the handler's ``sasl_token`` and its answer leaves as a raw frame (Kafka's v0 framing).

A frame whose length is negative or above ``socket.request.max.bytes``, or that the codec
cannot parse, closes that connection only. An unsupported ApiVersions version is answered
with the v0 fallback; any other unsupported version closes the connection (Kafka's behaviour).
A handler response that cannot be encoded is answered with the API's UNKNOWN_SERVER_ERROR
response instead (as Kafka's KafkaApis.handle does).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl as ssl_module
import struct
import time
from collections import deque
from typing import Awaitable, Callable, Mapping

from strata.common.errors import ErrorCode
from strata.protocol.codec import (
    ApiKey, DecodedRequest, MalformedRequest, UnsupportedVersion, encode_api_versions_fallback,
    encode_response_parts, error_response, parse_request)
from strata.protocol.file_region import FileRegion
from strata.security.principal import parse_mapping_rules, tls_principal
from strata.security.sasl import ANONYMOUS, SaslServer
from strata.security.session import SaslSession
from strata.server.broker_metrics import REMOTE_WAIT_NS

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">i")
_STREAM_BUFFER = 16 * 1024   # receive buffer of a connection's small frames
_DIRECT_MIN = 4 * 1024       # frames from this size on are received into a buffer of their own
_FLUSH_BYTES = 1 << 20  # queued response bytes that are written at once instead of at turn end
_TLS_PIECE = 64 * 1024  # TLS: responses go to the transport in pieces of about this size
_HIGH_WATER = 4 * 1024 * 1024  # transport buffer, and bytes pending behind a region, above
                               # which the next request waits

# A handler returns the response body, or None when no response is sent (Produce acks=0).
Handler = Callable[[DecodedRequest, "ConnectionInfo"], Awaitable[object | None]]


class CloseConnection(Exception):
    """Raised by a handler: the request is not answered and its connection is closed (a
    request Kafka refuses that way, such as one sent before SASL authentication)."""


class ConnectionInfo:
    """What a handler may know about the peer (its address, the listener it came in on and
    that listener's security protocol), and the request being handled: its size in bytes, and
    ``throttle_ms``, which the handler sets to have the connection muted that long once the
    response has left (KIP-219)."""

    __slots__ = ("peer", "connection_id", "request_size", "throttle_ms", "listener",
                 "security_protocol", "sasl", "principal", "close_after_response")

    def __init__(self, peer: str, connection_id: int, listener: str = "PLAINTEXT",
                 security_protocol: str = "PLAINTEXT", sasl: SaslSession | None = None):
        self.peer = peer
        self.connection_id = connection_id
        self.request_size = 0
        self.throttle_ms = 0
        self.listener = listener
        self.security_protocol = security_protocol
        self.sasl = sasl                    # the SASL exchange, on a SASL listener
        self.principal = ANONYMOUS          # who authenticated (User:ANONYMOUS until then)
        self.close_after_response = False   # a handler's wish: close once its answer is sent


class KafkaConnection(asyncio.BufferedProtocol):
    """One client connection; called on the event loop's thread only.

    Output order: ``_out`` (this turn's responses), then ``_pending`` (everything from the first
    unsent region on), then the transport. Nothing is given to the transport while
    ``_pending`` is non-empty except by ``_pump``, and a region is sent only while the
    transport's buffer is empty. A region's descriptor is closed once sent or dropped.
    """

    def __init__(self, server: "KafkaServer", connection_id: int):
        self._server = server
        self._id = connection_id
        self._buf = bytearray(_STREAM_BUFFER)   # received bytes of small frames
        self._buf_len = 0
        self._direct: bytearray | None = None   # a large frame, received straight into place
        self._direct_got = 0
        self._frames: deque[bytes | bytearray] = deque()
        self._frame_times: deque[int] = deque()   # monotonic ns each frame was whole
        self._wakeup = asyncio.Event()
        self._transport: asyncio.Transport | None = None
        self._paused_reading = False
        self._muted = False
        self._closed = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._transport_paused = False
        self._out: list = []          # response parts not yet handed to the transport
        self._out_bytes = 0
        self._flush_scheduled = False
        self._sock = None             # the socket, when regions may be sent with sendfile
        self._tls = False
        self._poll_fd = -1            # a dup of it, to wait for writability while a region waits
        self._pending: deque = deque()  # parts from the first unsent region on, in order
        self._pending_bytes = 0
        self._close_when_sent = False
        self._task: asyncio.Task | None = None
        self._idle_handle: asyncio.TimerHandle | None = None
        self._active_at = 0.0         # loop time of the last bytes received
        self._handling = False
        self.info: ConnectionInfo | None = None

    # ---- transport callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        factories = self._server.sasl_factories
        self.info = ConnectionInfo(f"{peer[0]}:{peer[1]}" if peer else "?", self._id,
                                   self._server.listener, self._server.security_protocol,
                                   SaslSession(factories) if factories else None)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and not factories:   # SSL: the client certificate names it
            try:
                self.info.principal = tls_principal(ssl_object.getpeercert(binary_form=True),
                                                    self._server.principal_rules)
            except ValueError as exc:
                log.info("closing %s: no principal for its certificate: %s", self.info.peer, exc)
                transport.abort()
                return
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None and self._server.send_buffer_bytes != USE_DEFAULT_BUFFER_SIZE:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._server.send_buffer_bytes)
        self._tls = transport.get_extra_info("sslcontext") is not None
        if self._server.sendfile and sock is not None and not self._tls:
            self._sock = sock
        self._server._connections.add(self)
        self._task = asyncio.get_running_loop().create_task(self._process())
        self._touch()
        self._arm_idle(self._server.idle_timeout_ms / 1000)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct is not None:
            return memoryview(self._direct)[self._direct_got:]
        if self._buf_len == len(self._buf):   # full of whole frames read before a pause took hold
            grown = bytearray(2 * len(self._buf))
            grown[:self._buf_len] = self._buf
            self._buf = grown   # a new buffer: the transport may still hold a view of the old
        return memoryview(self._buf)[self._buf_len:]

    def buffer_updated(self, nbytes: int) -> None:
        self._touch()
        if self._direct is not None:
            self._direct_got += nbytes
            if self._direct_got < len(self._direct):
                return
            self._frames.append(self._direct)
            self._frame_times.append(time.monotonic_ns())
            self._direct = None
        else:
            self._buf_len += nbytes
        self._parse_frames()

    def _parse_frames(self) -> None:
        """Move whole frames from the buffer to the queue while it has room; pause reading when
        full. A large frame not yet whole continues in a buffer of its own, which the socket
        fills directly (no copy out of a stream buffer)."""
        limit = self._server.max_request_size
        sasl = self.info.sasl
        if sasl is not None and (not sasl.authenticated or sasl.reauthenticating):
            limit = min(limit, self._server.sasl_max_receive_size)   # during an exchange
        room = self._server.max_queued_requests - len(self._frames)
        buf, end = self._buf, self._buf_len
        start = 0
        oversized = None
        now = time.monotonic_ns()
        with memoryview(buf) as view:
            while room > 0 and end - start >= 4:
                (size,) = _LENGTH.unpack_from(buf, start)
                if size < 0 or size > limit:
                    oversized = size
                    break
                if end - start - 4 < size:
                    if size >= _DIRECT_MIN:
                        got = end - start - 4
                        self._direct = bytearray(size)
                        self._direct[:got] = view[start + 4:end]
                        self._direct_got = got
                        start = end
                    break
                self._frames.append(bytes(view[start + 4:start + 4 + size]))
                self._frame_times.append(now)
                start += 4 + size
                room -= 1
            if oversized is None and start:   # keep the unread tail at the front
                view[:end - start] = view[start:end]
        if oversized is not None:
            log.warning("closing %s: frame of %d bytes (limit %d)", self.info.peer, oversized, limit)
            self.close()
            return
        self._buf_len = end - start
        if len(buf) > _STREAM_BUFFER >= self._buf_len:   # a pause's surplus is read: shrink back
            self._buf = bytearray(_STREAM_BUFFER)
            self._buf[:self._buf_len] = buf[:self._buf_len]
        if self._frames:
            self._wakeup.set()
        pause = room <= 0 or self._muted
        if pause and not self._paused_reading:
            self._paused_reading = True
            self._transport.pause_reading()
        elif not pause and self._paused_reading:
            self._paused_reading = False
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._wakeup.set()
        self._drained.set()
        self._server._connections.discard(self)
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        self._release_output()

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._update_drained()

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._update_drained()

    def _update_drained(self) -> None:
        if self._closed or not (self._transport_paused or self._pending_bytes > _HIGH_WATER):
            self._drained.set()
        else:
            self._drained.clear()

    # ---- processing -------------------------------------------------------------------------

    async def _process(self) -> None:
        try:
            while not self._closed:
                if not self._frames:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if self._server.stopping:
                    self.close()  # shutting down: finish what runs, start nothing new
                    return
                if not self._drained.is_set():
                    await self._drained.wait()
                    continue
                frame = self._frames.popleft()
                received_ns = self._frame_times.popleft()
                if self._paused_reading:
                    self._parse_frames()
                await self._handle_frame(frame, received_ns)
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - one connection's failure never reaches the server
            log.exception("connection %s failed; closing it", self.info.peer if self.info else "?")
            self.close()

    async def _handle_frame(self, frame: bytes, received_ns: int = 0) -> None:
        if self.info.sasl is not None and self.info.sasl.raw_tokens_expected:
            await self._handle_raw_token(frame)
            return
        try:
            request = parse_request(frame)
        except UnsupportedVersion as exc:
            if exc.api_key == ApiKey.API_VERSIONS:
                self._write([encode_api_versions_fallback(exc.correlation_id)])
                return
            log.info("closing %s: %s", self.info.peer, exc)
            self.close()
            return
        except MalformedRequest as exc:
            log.info("closing %s: malformed request: %s", self.info.peer, exc)
            self.close()
            return
        self._server.requests_in_flight += 1
        self._handling = True
        self.info.request_size = len(frame)
        metrics = self._server.request_metrics
        if metrics is not None:
            started_ns = time.monotonic_ns()
            remote = [0]
            remote_token = REMOTE_WAIT_NS.set(remote)
        try:
            body = await self._server.handler(request, self.info)
        except CloseConnection as exc:
            log.info("closing %s: %s", self.info.peer, exc)
            self.close()
            return
        finally:
            self._handling = False
            self._server.requests_in_flight -= 1
            if metrics is not None:
                REMOTE_WAIT_NS.reset(remote_token)
        try:
            if metrics is not None:
                handled_ns = time.monotonic_ns()
            if body is not None and not self._closed:
                self._respond(request, body)
            if metrics is not None:
                metrics.record(request, body, received_ns or started_ns, started_ns, handled_ns,
                               time.monotonic_ns(), remote[0])
            if self.info.close_after_response:
                self.close()
        finally:
            if self.info.throttle_ms > 0:
                await self._mute(self.info.throttle_ms)

    async def _handle_raw_token(self, token: bytes) -> None:
        """A SASL token after SaslHandshake v0: no request header; the answer is the server's
        token as a length-prefixed frame. A token the exchange refuses closes the connection."""
        try:
            answer = await self._server.handler.sasl_token(token, self.info)
        except CloseConnection as exc:
            log.info("closing %s: %s", self.info.peer, exc)
            self.close()
            return
        self._write([_LENGTH.pack(len(answer)), answer])

    def _respond(self, request: DecodedRequest, body: object) -> None:
        try:
            parts = encode_response_parts(request, body)
        except Exception:  # noqa: BLE001 - a handler built a body its schema cannot carry
            # Kafka serializes inside KafkaApis.handle, so such a failure is answered with the
            # API's error response instead of dropping the connection; so do we.
            log.exception("%s v%d response to %s cannot be encoded; answering UNKNOWN_SERVER_ERROR",
                          request.api_key.name, request.api_version, self.info.peer)
            parts = encode_response_parts(request, error_response(request, ErrorCode.UNKNOWN_SERVER_ERROR))
        self._write(parts)

    async def _mute(self, ms: int) -> None:
        """Read and handle nothing from this client for ``ms`` (a quota's throttle time); the
        response already queued leaves meanwhile. Ends early when the connection closes."""
        self.info.throttle_ms = 0
        self._muted = True
        self._parse_frames()   # pauses reading
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ms / 1000
        try:
            while not self._closed and (left := deadline - loop.time()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except TimeoutError:
                    break
        finally:
            self._muted = False
            if not self._closed:
                self._parse_frames()   # resumes reading

    def _write(self, parts: list) -> None:
        """Queue a response. It leaves at once when no request waits behind it on this
        connection (or it is large); otherwise with the rest of this loop turn's responses."""
        if self._closed:
            return
        if self._sock is None:
            parts = [_copied(p) if isinstance(p, FileRegion) else p for p in parts]
        self._out.extend(parts)
        self._out_bytes += sum(len(part) for part in parts)
        if self._out_bytes >= _FLUSH_BYTES or not self._frames:
            self._flush()   # large, or the last of a burst: no later response joins this write
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self._transport is None or self._transport.is_closing():
            return
        out, self._out, self._out_bytes = self._out, [], 0
        if self._pending or any(isinstance(p, FileRegion) for p in out):
            self._pending.extend(out)
            self._pending_bytes += sum(len(p) for p in out)
            self._pump()
        elif self._tls:
            _write_in_pieces(self._transport, out)
        else:
            self._transport.writelines(out)

    def _pump(self) -> None:
        """Send pending parts in order: bytes through the transport, a region with sendfile
        once the transport has written everything before it; wait for writability when the
        socket is full."""
        transport, pending = self._transport, self._pending
        while pending:
            if not isinstance(pending[0], FileRegion):
                run = []
                while pending and not isinstance(pending[0], FileRegion):
                    run.append(pending.popleft())
                self._pending_bytes -= sum(len(p) for p in run)
                transport.writelines(run)
                continue
            region = pending[0]
            if transport.get_write_buffer_size():
                return self._wait_writable()
            try:
                sent = os.sendfile(self._sock.fileno(), region.fd, region.position + region.sent,
                                   region.length - region.sent)
            except (BlockingIOError, InterruptedError):
                return self._wait_writable()
            except OSError as exc:
                log.info("closing %s: sendfile failed: %s", self.info.peer, exc)
                return self.abort()
            if sent == 0:   # the file is shorter than the region: the frame cannot be completed
                log.error("closing %s: %r ends early", self.info.peer, region)
                return self.abort()
            region.sent += sent
            self._pending_bytes -= sent
            if region.sent == region.length:
                pending.popleft()
                region.close()
        if self._poll_fd >= 0:
            asyncio.get_running_loop().remove_writer(self._poll_fd)
        self._update_drained()
        if self._close_when_sent:
            transport.close()

    def _wait_writable(self) -> None:
        if self._poll_fd < 0:
            self._poll_fd = os.dup(self._sock.fileno())  # the loop refuses a transport's own fd
        asyncio.get_running_loop().add_writer(self._poll_fd, self._pump)
        self._update_drained()

    def _release_output(self) -> None:
        """Drop unsent output (the connection is gone): close regions and the poll descriptor."""
        for part in (*self._out, *self._pending):
            if isinstance(part, FileRegion):
                part.close()
        self._out, self._out_bytes = [], 0
        self._pending.clear()
        self._pending_bytes = 0
        if self._poll_fd >= 0:
            asyncio.get_running_loop().remove_writer(self._poll_fd)
            os.close(self._poll_fd)
            self._poll_fd = -1

    def _touch(self) -> None:
        self._active_at = asyncio.get_running_loop().time()

    def _arm_idle(self, delay: float) -> None:
        """One timer per connection, moved on only when it fires (not at every request)."""
        if self._server.idle_timeout_ms > 0 and not self._closed:
            self._idle_handle = asyncio.get_running_loop().call_later(delay, self._idle)

    def _idle(self) -> None:
        idle_s = self._server.idle_timeout_ms / 1000
        if self._frames or self._handling:
            self._touch()
        left = self._active_at + idle_s - asyncio.get_running_loop().time()
        if left > 0:
            self._arm_idle(left)
            return
        log.debug("closing idle connection %s", self.info.peer)
        self.close()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._flush()  # answers already made go out before the close
            if self._pending:
                self._close_when_sent = True   # _pump closes once the last region is sent
            else:
                self._transport.close()
        self._closed = True
        self._wakeup.set()

    def abort(self) -> None:
        """Close at once, dropping unsent output (a response that cannot be completed)."""
        self._closed = True
        self._wakeup.set()
        self._release_output()
        if self._transport is not None:
            self._transport.abort()


def _write_in_pieces(transport: asyncio.Transport, parts: list) -> None:
    """Hands ``parts`` to a TLS transport about ``_TLS_PIECE`` bytes at a time. The transport
    encrypts all it is given into one buffer before writing any of it: a 1 MiB Fetch response
    became one 1 MiB encrypted copy, and its first byte left only once all of it was encrypted
    (docs/benchmarks.md, issue 45: about a third less broker CPU per GiB of TLS consume)."""
    batch, size = [], 0
    for part in parts:
        pieces = [part] if len(part) <= _TLS_PIECE else \
            [memoryview(part)[i:i + _TLS_PIECE] for i in range(0, len(part), _TLS_PIECE)]
        for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= _TLS_PIECE:
                transport.writelines(batch)
                batch, size = [], 0
    if batch:
        transport.writelines(batch)


def _copied(region: FileRegion) -> bytes:
    try:
        return region.read()
    finally:
        region.close()


USE_DEFAULT_BUFFER_SIZE = -1   # Kafka's Selectable.USE_DEFAULT_BUFFER_SIZE: the OS's own sizing


class KafkaServer:
    """Accepts connections on one listener and feeds their requests to ``handler``.

    ``listener`` and ``security_protocol`` name the listener (each connection's
    ``ConnectionInfo`` carries them); ``ssl``, its TLS context (SSL and SASL_SSL listeners):
    responses are then copied through the TLS layer, never sent with sendfile;
    ``sasl_factories``, its SASL mechanisms (SASL_PLAINTEXT and SASL_SSL listeners).

    ``sendfile=False`` sends file regions as copies (the copying path, for comparison).
    ``send_buffer_bytes`` and ``receive_buffer_bytes`` are Kafka's ``socket.send.buffer.bytes``
    and ``socket.receive.buffer.bytes`` (SO_SNDBUF of each connection, SO_RCVBUF of the listener,
    which accepted connections inherit); -1, Strata's default, leaves the OS to size them."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 9092, *,
                 max_request_size: int = 104_857_600, max_queued_requests: int = 64,
                 idle_timeout_ms: int = 600_000, sendfile: bool = True,
                 send_buffer_bytes: int = -1, receive_buffer_bytes: int = -1,
                 listener: str = "PLAINTEXT", security_protocol: str = "PLAINTEXT",
                 ssl: "ssl_module.SSLContext | None" = None,
                 sasl_factories: Mapping[str, Callable[[], SaslServer]] | None = None,
                 principal_rules: str | None = None, sasl_max_receive_size: int = 524_288):
        self.handler = handler
        self.listener = listener
        self.security_protocol = security_protocol
        self.ssl = ssl
        self.sasl_factories = sasl_factories   # SASL listeners: mechanism -> new server
        self.principal_rules = parse_mapping_rules(principal_rules)  # ssl.principal.mapping.rules
        self.sasl_max_receive_size = sasl_max_receive_size   # sasl.server.max.receive.size
        self.sendfile = sendfile
        self.send_buffer_bytes = send_buffer_bytes        # SO_SNDBUF of each connection
        self.receive_buffer_bytes = receive_buffer_bytes  # SO_RCVBUF, set on the listener
        self.host = host
        self.port = port
        self.max_request_size = max_request_size
        self.max_queued_requests = max_queued_requests
        self.idle_timeout_ms = idle_timeout_ms
        self.requests_in_flight = 0
        self.stopping = False
        # strata.server.broker_metrics.RequestStats: Kafka's RequestMetrics (None: not counted)
        self.request_metrics = getattr(handler, "request_metrics", None)
        self._connections: set[KafkaConnection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._next_id = 0

    def _new_connection(self) -> KafkaConnection:
        self._next_id += 1
        return KafkaConnection(self, self._next_id)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, self.host, self.port,
                                                reuse_address=True, backlog=512, ssl=self.ssl,
                                                start_serving=False)
        if self.receive_buffer_bytes != USE_DEFAULT_BUFFER_SIZE:
            for listener in self._server.sockets:   # accepted sockets inherit it
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)
        await self._server.start_serving()
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("listening on %s:%d (%s, %s)", self.host, self.port, self.listener,
                 self.security_protocol)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``grace_s``), close connections."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.requests_in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def connection_count(self) -> int:
        return len(self._connections)
