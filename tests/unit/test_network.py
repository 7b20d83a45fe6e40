"""The Kafka listener: framing, ordering, bad input and backpressure, over real sockets."""

from __future__ import annotations

import asyncio
import random
import socket
import struct

import pytest
from hypothesis import given, settings, strategies as st

from strata.protocol.codec import ApiKey, api_versions_response
from strata.server.network import ConnectionInfo, KafkaConnection, KafkaServer


def api_versions_v0_request(correlation_id: int) -> bytes:
    client = b"test"
    body = struct.pack(">hhih", ApiKey.API_VERSIONS, 0, correlation_id, len(client)) + client
    return struct.pack(">i", len(body)) + body


def api_versions_request(version: int, correlation_id: int) -> bytes:
    client = b"test"
    header = struct.pack(">hhih", ApiKey.API_VERSIONS, version, correlation_id, len(client)) + client
    if version >= 3:
        header += b"\x00"  # header tagged fields
        body = b"\x05strt" + b"\x040.1" + b"\x00"  # compact strings + tagged fields
    else:
        body = b""
    frame = header + body
    return struct.pack(">i", len(frame)) + frame


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    payload = await reader.readexactly(size)
    return struct.unpack_from(">i", payload)[0], payload[4:]


async def serve(handler, **kw) -> KafkaServer:
    server = KafkaServer(handler, "127.0.0.1", 0, **kw)
    await server.start()
    return server


async def answer_api_versions(request, conn):
    return api_versions_response(request.api_version)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_api_versions_v3_is_answered_with_a_v0_response_header():
    async def main():
        server = await serve(answer_api_versions)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(api_versions_request(3, 42))
        corr, body = await read_response(r)
        assert corr == 42
        assert struct.unpack_from(">h", body)[0] == 0  # error code right after the v0 header
        w.close()
        await server.stop()
    run(main())


def test_an_unsupported_api_versions_version_gets_the_v0_fallback_with_error_35():
    async def main():
        server = await serve(answer_api_versions)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(api_versions_request(99, 7))
        corr, body = await read_response(r)
        error, count = struct.unpack_from(">hi", body)
        assert (corr, error) == (7, 35) and count > 0
        keys = {struct.unpack_from(">h", body, 6 + 6 * i)[0] for i in range(count)}
        assert ApiKey.PRODUCE in keys and ApiKey.FETCH in keys
        w.close()
        await server.stop()
    run(main())


def test_pipelined_requests_are_answered_in_order():
    async def slow(request, conn):
        await asyncio.sleep(random.random() / 200)
        return api_versions_response(request.api_version)

    async def main():
        server = await serve(slow)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(b"".join(api_versions_request(3, i) for i in range(50)))
        got = [(await read_response(r))[0] for _ in range(50)]
        assert got == list(range(50))
        w.close()
        await server.stop()
    run(main())


def test_a_request_without_a_response_does_not_break_the_order():
    async def sometimes_silent(request, conn):
        return None if request.correlation_id % 2 else api_versions_response(request.api_version)

    async def main():
        server = await serve(sometimes_silent)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(b"".join(api_versions_request(3, i) for i in range(10)))
        got = [(await read_response(r))[0] for _ in range(5)]
        assert got == [0, 2, 4, 6, 8]
        w.close()
        await server.stop()
    run(main())


@pytest.mark.parametrize("frame", [
    struct.pack(">i", 200 * 1024 * 1024),       # over socket.request.max.bytes
    struct.pack(">i", -5),                     # negative length
    struct.pack(">i", 6) + b"\xff" * 6,        # too short to hold a header
    struct.pack(">i", 10) + struct.pack(">hhi", 3, 9, 1) + b"\x7f\xff",  # string past the end
], ids=["oversized", "negative", "garbage", "truncated-client-id"])
def test_bad_frames_close_only_that_connection(frame):
    async def main():
        server = await serve(answer_api_versions)
        bad_r, bad_w = await asyncio.open_connection("127.0.0.1", server.port)
        good_r, good_w = await asyncio.open_connection("127.0.0.1", server.port)
        bad_w.write(frame)
        assert await bad_r.read() == b""  # closed by the broker
        good_w.write(api_versions_request(3, 1))
        assert (await read_response(good_r))[0] == 1
        good_w.close()
        await server.stop()
    run(main())


def test_reading_pauses_when_too_many_requests_are_queued_and_all_are_answered():
    gate = asyncio.Event()

    async def gated(request, conn):
        await gate.wait()
        return api_versions_response(request.api_version)

    async def main():
        server = await serve(gated, max_queued_requests=4)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(b"".join(api_versions_request(3, i) for i in range(100)))
        await asyncio.sleep(0.2)
        (conn,) = server._connections
        assert conn._paused_reading and len(conn._frames) <= 4
        gate.set()
        got = [(await read_response(r))[0] for _ in range(100)]
        assert got == list(range(100))
        w.close()
        await server.stop()
    run(main())


def test_idle_connections_are_closed():
    async def main():
        server = await serve(answer_api_versions, idle_timeout_ms=100)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(api_versions_request(3, 1))
        await read_response(r)
        assert await asyncio.wait_for(r.read(), 2) == b""
        await server.stop()
    run(main())


def test_a_connection_in_use_outlives_the_idle_timeout():
    async def main():
        server = await serve(answer_api_versions, idle_timeout_ms=400)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5   # almost four idle timeouts, a request every 50 ms
        correlation_id = 0
        while loop.time() < end:
            correlation_id += 1
            w.write(api_versions_request(3, correlation_id))
            await read_response(r)
            await asyncio.sleep(0.05)
        w.write(api_versions_request(3, correlation_id + 1))
        await read_response(r)   # still open
        assert await asyncio.wait_for(r.read(), 3) == b""   # and closed once left idle
        await server.stop()
    run(main())


def test_stop_lets_the_running_request_finish_and_starts_no_new_ones():
    started = []

    async def slow(request, conn):
        started.append(request.correlation_id)
        await asyncio.sleep(0.2)
        return api_versions_response(request.api_version)

    async def main():
        server = await serve(slow)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(b"".join(api_versions_request(3, i) for i in range(5)))
        await asyncio.sleep(0.05)
        await server.stop(grace_s=5)
        assert (await read_response(r))[0] == 0
        assert await r.read() == b""
        assert started == [0]
    run(main())


def _frame_with_padding(correlation_id: int, pad: int) -> bytes:
    """An ApiVersions v0 request whose frame carries ``pad`` trailing bytes (ignored by the
    handler below): frames of any size, checked by what the handler received."""
    body = struct.pack(">hhih", ApiKey.API_VERSIONS, 0, correlation_id, 4) + b"test"
    body += bytes((correlation_id + i) % 251 for i in range(pad))
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_large_and_small_frames_arrive_whole_however_the_bytes_are_split(loop_kind):
    """Frames of every size, sent in random pieces, with a queue small enough that reading
    pauses: each reaches the handler whole, in order. The sizes straddle the connection's
    16 KiB stream buffer and the 4 KiB from which a frame gets a buffer of its own, and a
    burst of tiny frames fills the stream buffer with whole frames while reading is paused."""
    sizes = [0, 10, 32_000, 33_000, 300_000, 5, 200_000, 1, 2_000_000, 64, 65_522,
             4_081, 4_082, 4_083, 16_369, 16_370, 16_371, 16_384, 40_000]
    sizes = sizes * 3 + [3] * 2_000 + [4_082, 16_370]
    frames = [_frame_with_padding(i, pad) for i, pad in enumerate(sizes)]
    seen: dict[int, int] = {}

    async def check(request, conn):
        seen[request.correlation_id] = conn.request_size
        await asyncio.sleep(0)
        return api_versions_response(request.api_version)

    async def main():
        server = await serve(check, max_queued_requests=3)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        data = b"".join(frames)
        rng = random.Random(7)
        pos = 0
        while pos < len(data):
            step = rng.choice([1, 3, 700, 40_000, 1 << 20])
            w.write(data[pos:pos + step])
            pos += step
            if rng.random() < 0.3:
                await w.drain()
        got = [(await read_response(r))[0] for _ in frames]
        assert got == list(range(len(frames)))
        assert seen == {i: len(f) - 4 for i, f in enumerate(frames)}
        w.close()
        await server.stop()

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(asyncio.wait_for(main(), 30))
    else:
        run(main())


def _locked_size(option: int, size: int) -> int:
    """What the kernel reports for a socket whose ``option`` was set to ``size`` (Linux doubles it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, option, size)
        return probe.getsockopt(socket.SOL_SOCKET, option)


@pytest.mark.parametrize("size", [102_400, 65_536])
def test_accepted_connections_get_kafkas_socket_buffer_sizes(size):
    """socket.send.buffer.bytes and socket.receive.buffer.bytes, when set (default -1: the OS's)."""
    async def main():
        server = await serve(answer_api_versions, send_buffer_bytes=size, receive_buffer_bytes=size)
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(api_versions_request(3, 1))
        await read_response(r)
        (conn,) = server._connections
        sock = conn._transport.get_extra_info("socket")
        got = (sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
               sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        w.close()
        await server.stop()
        return got
    assert run(main()) == (_locked_size(socket.SO_SNDBUF, size), _locked_size(socket.SO_RCVBUF, size))


class _ReadingTransport:
    """What the framing asks of a transport: pause and resume reading."""

    def __init__(self):
        self.paused = False

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.one_of(st.integers(0, 40), st.integers(4_080, 4_100),
                                st.integers(16_370, 16_400), st.integers(0, 70_000)),
                      min_size=1, max_size=25),
       reads=st.lists(st.integers(1, 70_000), min_size=1, max_size=40),
       queue=st.integers(1, 4), drains=st.lists(st.booleans(), min_size=1, max_size=40))
def test_framing_hands_over_every_frame_whole_whatever_the_reads_and_pauses(sizes, reads, queue,
                                                                             drains):
    """The connection's receive buffers driven directly, as a transport does (``get_buffer``,
    then ``buffer_updated``), with reads of any size, a queue of 1-4 frames, and reads that
    continue for a while after reading was paused (a transport may deliver what it had)."""
    frames = [bytes((i + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)

    async def main():
        conn = KafkaConnection(KafkaServer(answer_api_versions, max_queued_requests=queue), 1)
        conn._transport = _ReadingTransport()
        conn.info = ConnectionInfo("test", 1)
        got, pos, step = [], 0, 0
        while pos < len(stream) or conn._frames:
            drain = drains[step % len(drains)] or pos == len(stream)
            if conn._frames and (drain or conn._transport.paused and step % 3 == 0):
                got.append(bytes(conn._frames.popleft()))   # as _process takes a frame
                if conn._paused_reading:
                    conn._parse_frames()
            elif pos < len(stream):
                buf = conn.get_buffer(-1)
                n = min(len(buf), reads[step % len(reads)], len(stream) - pos)
                assert n > 0
                buf[:n] = stream[pos:pos + n]
                pos += n
                conn.buffer_updated(n)
            step += 1
        return got

    assert asyncio.run(main()) == frames
