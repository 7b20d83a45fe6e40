"""SASL tokens after SaslHandshake v0 (clients before Kafka 1.0): raw length-prefixed frames with
no request header, answered with raw frames, over the real listener and dispatcher. PLAIN and
SCRAM log in; a token the exchange refuses, or garbage, closes only that connection; after the
exchange, and after a v1 handshake, frames are Kafka requests again."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import scramp
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as HandshakeV0Response
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as HandshakeV1

from strata.common.errors import ErrorCode
from strata.protocol.client import client_frame, decode_response, framed
from strata.security.sasl import PlainServer
from strata.security.scram import SCRAM_SHA_256, ScramFormatter, ScramServer
from strata.security.session import AuthenticationStats
from strata.server.dispatch import Dispatcher, advertised_versions
from strata.server.network import KafkaServer

CREDENTIAL = ScramFormatter(SCRAM_SHA_256).generate_credential("bob-secret", 4096)


def _factories():
    return {"PLAIN": lambda: PlainServer({"alice": "alice-secret"}),
            "SCRAM-SHA-256": lambda: ScramServer(
                SCRAM_SHA_256, lambda user, mech: CREDENTIAL if user == "bob" else None)}


async def _serve():
    ctx = SimpleNamespace(authentication_stats=AuthenticationStats(), quotas=None,
                          api_versions=advertised_versions(),
                          failed_authentication_delay_ms=0)
    server = KafkaServer(Dispatcher(ctx), "127.0.0.1", 0, listener="SASL_PLAINTEXT",
                         security_protocol="SASL_PLAINTEXT", sasl_factories=_factories())
    await server.start()
    return server, ctx


async def _raw(reader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


async def _handshake(reader, writer, mechanism: str, request=HandshakeV0):
    writer.write(framed(client_frame(request(mechanism=mechanism), 1)))
    return decode_response(HandshakeV0Response, await _raw(reader), 1)


def _raw_frame(token: bytes) -> bytes:
    return struct.pack(">i", len(token)) + token


async def _closed(reader) -> bool:
    return await asyncio.wait_for(reader.read(), 10) == b""


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_plain_logs_in_with_raw_frames_and_requests_follow_with_headers():
    async def main():
        server, ctx = await _serve()
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        answer = await _handshake(r, w, "PLAIN")
        assert answer.error_code == ErrorCode.NONE
        w.write(_raw_frame(b"\0alice\0alice-secret"))
        assert await _raw(r) == b""          # PLAIN's empty token, as a frame of its own
        assert ctx.authentication_stats.successful == {("SASL_PLAINTEXT", "PLAIN"): 1}
        # a request header again: a second handshake is ILLEGAL_SASL_STATE, not a token
        answer = await _handshake(r, w, "PLAIN")
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
        w.close()
        await server.stop()
    run(main())


def test_scram_logs_in_with_raw_frames():
    async def main():
        server, ctx = await _serve()
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        await _handshake(r, w, "SCRAM-SHA-256")
        client = scramp.ScramClient(["SCRAM-SHA-256"], "bob", "bob-secret")
        w.write(_raw_frame(client.get_client_first().encode()))
        client.set_server_first((await _raw(r)).decode())
        w.write(_raw_frame(client.get_client_final().encode()))
        client.set_server_final((await _raw(r)).decode())   # checks the server's signature
        assert ctx.authentication_stats.successful == {("SASL_PLAINTEXT", "SCRAM-SHA-256"): 1}
        w.close()
        await server.stop()
    run(main())


def test_a_wrong_password_or_garbage_token_closes_only_that_connection():
    async def main():
        server, ctx = await _serve()
        bystander_r, bystander_w = await asyncio.open_connection("127.0.0.1", server.port)
        await _handshake(bystander_r, bystander_w, "PLAIN")
        for mechanism, token in [("PLAIN", b"\0alice\0wrong"), ("PLAIN", b"\xff" * 40),
                                 ("SCRAM-SHA-256", b"\x00garbage\xff"), ("PLAIN", b"")]:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            await _handshake(r, w, mechanism)
            w.write(_raw_frame(token))
            assert await _closed(r)
            w.close()
        assert ctx.authentication_stats.failed_total == {("SASL_PLAINTEXT", "PLAIN"): 3,
                                                         ("SASL_PLAINTEXT", "SCRAM-SHA-256"): 1}
        bystander_w.write(_raw_frame(b"\0alice\0alice-secret"))   # untouched by the others
        assert await _raw(bystander_r) == b""
        bystander_w.close()
        await server.stop()
    run(main())


def test_after_a_v1_handshake_a_raw_token_is_not_accepted():
    async def main():
        server, ctx = await _serve()
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        await _handshake(r, w, "PLAIN", HandshakeV1)
        w.write(_raw_frame(b"\0alice\0alice-secret"))   # parsed as a request: malformed
        assert await _closed(r)
        assert ctx.authentication_stats.successful == {}
        w.close()
        await server.stop()
    run(main())
