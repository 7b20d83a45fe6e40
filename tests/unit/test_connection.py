"""``strata.net.connection`` against a real socket. AsyncConnection (the replica fetchers'
connection on the event loop): responses of any size and split in any way are decoded whole and
in order; a response that does not come in time is a TimeoutError and the connection is not
reused; a broker that closes the connection fails the request waiting on it. Both connections:
an answer carrying another request's correlation id fails the request and closes the
connection."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import struct
import threading

import pytest
from kio.schema.fetch.v12 import response as fr

from strata.common.errors import ErrorCode
from strata.net.connection import AsyncConnection, Connection
from strata.protocol.client import fetch_request
from strata.protocol.codec import encode_response_parts, kio_error_code, parse_request


def fetch_answer(records: bytes, hw: int) -> fr.FetchResponse:
    return fr.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=kio_error_code(ErrorCode.NONE),
        responses=(fr.FetchableTopicResponse(topic="t", partitions=(fr.PartitionData(
            partition_index=0, error_code=kio_error_code(ErrorCode.NONE), high_watermark=hw,
            log_start_offset=0, aborted_transactions=None, records=records),)),))


@contextlib.asynccontextmanager
async def connected(handle, timeout: float):
    """An AsyncConnection to a server whose connections ``handle(request frame, writer)``
    answers."""
    async def on_connection(reader, writer):
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await handle(await reader.readexactly(size), writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    conn = await AsyncConnection.open(f"{host}:{port}", timeout=timeout)
    try:
        yield conn
    finally:
        conn.close()
        server.close()
        await server.wait_closed()


def answer_bytes(frame: bytes, records: bytes, hw: int) -> bytes:
    return b"".join(bytes(p) for p in encode_response_parts(parse_request(frame),
                                                            fetch_answer(records, hw)))


def test_responses_of_any_size_split_anyhow_are_decoded_whole_and_in_order():
    big = bytes(range(256)) * (3 * 4096)          # 3 MiB of records
    answers = [(b"", 1), (big, 2), (b"x" * 7, 3)]

    async def main():
        turn = iter(answers)

        async def handle(frame, writer):
            records, hw = next(turn)
            data = answer_bytes(frame, records, hw)
            # the size prefix split, then the rest in uneven pieces
            for piece in (data[:2], data[2:5], data[5:70_001], data[70_001:]):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.01)
        async with connected(handle, timeout=30) as conn:
            got = []
            for _ in answers:
                resp = await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
                p = resp.responses[0].partitions[0]
                got.append((p.records or b"", int(p.high_watermark)))
            return got
    assert asyncio.run(main()) == answers


def test_a_response_late_past_the_timeout_fails_the_request_and_closes_the_connection():
    async def main():
        async def handle(frame, writer):
            await asyncio.sleep(3)                  # past the request's 0.2 s
            writer.write(answer_bytes(frame, b"late", 1))
        async with connected(handle, timeout=0.2) as conn:
            with pytest.raises(TimeoutError):
                await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
            # the late answer can never be read as the next request's
            with pytest.raises(ConnectionError):
                await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
    asyncio.run(main())


def test_a_broker_closing_the_connection_fails_the_waiting_request():
    async def main():
        async def handle(frame, writer):
            writer.write(b"\x00\x00\x01\x00partial")   # a frame of 256 bytes cut short
            await writer.drain()
            writer.close()
        async with connected(handle, timeout=30) as conn:
            with pytest.raises(ConnectionError):
                await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
    asyncio.run(main())


def out_of_step(frame: bytes) -> bytes:
    """An answer to ``frame`` whose header carries the correlation id after the request's."""
    data = answer_bytes(frame, b"", 1)
    (cid,) = struct.unpack_from(">i", data, 4)
    return data[:4] + struct.pack(">i", cid + 1) + data[8:]


def test_an_answer_to_another_request_fails_the_async_request_and_closes_the_connection():
    async def main():
        async def handle(frame, writer):
            writer.write(out_of_step(frame))
        async with connected(handle, timeout=30) as conn:
            with pytest.raises(ConnectionError, match="correlation id"):
                await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
            with pytest.raises(ConnectionError):
                await conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
    asyncio.run(main())


def test_an_answer_to_another_request_fails_the_blocking_request_and_closes_the_connection():
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        peer, _ = server.accept()
        with peer, peer.makefile("rb") as reader:
            size = struct.unpack(">i", reader.read(4))[0]
            peer.sendall(out_of_step(reader.read(size)))
            reader.read(1)   # until the client closes
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    host, port = server.getsockname()[:2]
    try:
        with Connection((host, port), timeout=10) as conn:
            with pytest.raises(ConnectionError, match="correlation id"):
                conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
            with pytest.raises(OSError):   # closed: never read as the next request's answer
                conn.request(fetch_request("t", 0, 0), fr.FetchResponse)
    finally:
        t.join(10)
        server.close()
    assert not t.is_alive()


def test_the_blocking_connection_reads_each_answer_in_order():
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        peer, _ = server.accept()
        with peer, peer.makefile("rb") as reader:
            for hw in (1, 2, 3):
                size = struct.unpack(">i", reader.read(4))[0]
                data = answer_bytes(reader.read(size), b"r" * hw * 1000, hw)
                for i in range(0, len(data), 997):   # in uneven pieces
                    peer.sendall(data[i:i + 997])
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    host, port = server.getsockname()[:2]
    try:
        with Connection(f"{host}:{port}", timeout=10) as conn:
            got = []
            for _ in range(3):
                p = conn.request(fetch_request("t", 0, 0), fr.FetchResponse).responses[0].partitions[0]
                got.append((p.records, int(p.high_watermark)))
    finally:
        t.join(10)
        server.close()
    assert got == [(b"r" * hw * 1000, hw) for hw in (1, 2, 3)]
