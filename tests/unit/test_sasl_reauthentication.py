"""KIP-368 re-authentication on the broker's side: the session's lifetime (Kafka's
``calcCompletionTimesAndReturnSessionLifetimeMs``), what an expired or re-authenticating session
serves, the same mechanism and principal required of a re-authentication, and the exchange over
the real listener and dispatcher (SaslAuthenticate v2 tells the lifetime; the same connection
re-authenticates; after the lifetime a request other than SaslHandshake closes it)."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

from strata.common.errors import ErrorCode
from strata.protocol.client import client_frame, decode_response, framed
from strata.protocol.codec import ApiKey
from strata.security.sasl import KafkaPrincipal, ListenerMechanisms, PlainServer, \
    SaslAuthenticationFailed, server_factories
from strata.security.session import AuthenticationStats, SaslSession, session_lifetime_ms
from strata.server.dispatch import Dispatcher, advertised_versions
from strata.server.network import KafkaServer

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.mark.parametrize("max_reauth_ms, expires_ms, expected", [
    (0, None, None),           # neither: the session never ends
    (5000, None, 5000),        # connections.max.reauth.ms alone
    (0, 1_003_000, 3000),      # the credential's end alone (a token's exp)
    (5000, 1_003_000, 3000),   # the sooner of both
    (2000, 1_003_000, 2000),
    (5000, 999_000, 0),        # a credential already past its end: no lifetime left
])
def test_the_session_lifetime_is_the_sooner_of_the_limit_and_the_credentials_end(
        max_reauth_ms, expires_ms, expected):
    assert session_lifetime_ms(max_reauth_ms, expires_ms, now_ms=1_000_000) == expected


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain_session(clock, max_reauth_ms=1000) -> SaslSession:
    return SaslSession({"PLAIN": lambda: PlainServer(USERS), "OTHER": lambda: PlainServer(USERS)},
                       {"PLAIN": max_reauth_ms}, clock=clock, wall_clock=clock)


def login(session: SaslSession, user: str = "alice", mechanism: str = "PLAIN") -> int:
    assert session.handshake(mechanism)
    session.server.evaluate(f"\0{user}\0{USERS[user]}".encode())
    return session.completed(session.server)


def test_an_expired_session_serves_nothing_but_the_handshake_of_a_re_authentication():
    clock = Clock()
    session = plain_session(clock)
    assert session.refusal(ApiKey.METADATA) is not None      # before authenticating
    assert login(session) == 1000
    assert session.refusal(ApiKey.METADATA) is None
    clock.now += 1.0
    assert "expired" in session.refusal(ApiKey.PRODUCE)
    assert session.refusal(ApiKey.SASL_HANDSHAKE) is None and session.reauthenticating
    assert "re-authentication" in session.refusal(ApiKey.FETCH)   # nothing else meanwhile
    assert login(session) == 1000 and not session.reauthenticating
    assert session.principal == KafkaPrincipal("User", "alice")
    assert session.refusal(ApiKey.FETCH) is None and not session.expired()


def test_re_authentication_starts_at_most_once_a_second_and_only_with_a_lifetime():
    clock = Clock()
    session = plain_session(clock)
    login(session)
    assert session.begin_reauthentication()
    login(session)
    clock.now += 0.5
    assert not session.begin_reauthentication()     # within a second of the last start
    clock.now += 0.6
    assert session.begin_reauthentication()
    unlimited = plain_session(clock, max_reauth_ms=0)
    login(unlimited)
    assert not unlimited.begin_reauthentication() and not unlimited.expired()


def test_re_authentication_keeps_the_mechanism_and_the_principal():
    clock = Clock()
    session = plain_session(clock)
    login(session)
    session.begin_reauthentication()
    assert session.handshake("OTHER")
    with pytest.raises(SaslAuthenticationFailed, match="not supported for re-authentication"):
        session.server.evaluate(b"\0alice\0alice-secret")
    session = plain_session(clock)
    login(session)
    session.begin_reauthentication()
    with pytest.raises(SaslAuthenticationFailed,
                       match="Cannot change principals during re-authentication from "
                             "User.alice: User.bob"):
        login(session, "bob")


def test_connections_max_reauth_ms_is_per_listener_and_mechanism():
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'user_alice="alice-secret";')
    props = {"sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": jaas,
             "connections.max.reauth.ms": "60000",
             "listener.name.a.connections.max.reauth.ms": "30000",
             "listener.name.b.plain.connections.max.reauth.ms": "10000"}
    assert server_factories(props, "A").connections_max_reauth_ms == {"PLAIN": 30000}
    assert server_factories(props, "B").connections_max_reauth_ms == {"PLAIN": 10000}
    assert server_factories(props, "C").connections_max_reauth_ms == {"PLAIN": 60000}
    no_limit = {k: v for k, v in props.items() if "reauth" not in k}
    assert server_factories(no_limit, "C").connections_max_reauth_ms == {"PLAIN": 0}


async def _request(reader, writer, body, response_cls, correlation_id: int):
    writer.write(framed(client_frame(body, correlation_id)))
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return decode_response(response_cls, await reader.readexactly(size), correlation_id)


async def _authenticate(reader, writer, user: str = "alice"):
    handshake = await _request(reader, writer, SaslHandshakeRequest(mechanism="PLAIN"),
                               SaslHandshakeResponse, 1)
    assert handshake.error_code == ErrorCode.NONE
    return await _request(reader, writer, SaslAuthenticateRequest(
        auth_bytes=f"\0{user}\0{USERS[user]}".encode()), SaslAuthenticateResponse, 2)


VERSIONS = ApiVersionsRequest()


def test_over_the_listener_a_client_re_authenticates_and_one_that_does_not_is_closed():
    async def main():
        ctx = SimpleNamespace(authentication_stats=AuthenticationStats(), quotas=None,
                              api_versions=advertised_versions(), features=None,
                              failed_authentication_delay_ms=0, eligible_leader_replicas=True)
        factories = ListenerMechanisms(PLAIN=lambda: PlainServer(USERS))
        factories.connections_max_reauth_ms = {"PLAIN": 1500}
        server = KafkaServer(Dispatcher(ctx), "127.0.0.1", 0, listener="SASL_PLAINTEXT",
                             security_protocol="SASL_PLAINTEXT", sasl_factories=factories)
        await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            done = await _authenticate(r, w)
            assert done.error_code == ErrorCode.NONE
            assert done.session_lifetime.total_seconds() == 1.5
            loop = asyncio.get_running_loop()
            for _ in range(2):   # re-authenticate on the same connection near the session's end
                await asyncio.sleep(1.1)
                again = await _authenticate(r, w)
                assert again.error_code == ErrorCode.NONE
                assert again.session_lifetime.total_seconds() == 1.5
                assert (await _request(r, w, VERSIONS, ApiVersionsResponse, 3)).error_code \
                    == ErrorCode.NONE
            assert ctx.authentication_stats.successful_reauthentication == {
                ("SASL_PLAINTEXT", "PLAIN"): 2}
            assert ctx.authentication_stats.successful == {("SASL_PLAINTEXT", "PLAIN"): 1}
            # a client that ignores the lifetime: answered until the session ends, then closed
            r2, w2 = await asyncio.open_connection("127.0.0.1", server.port)
            await _authenticate(r2, w2)
            deadline = loop.time() + 20
            with pytest.raises(asyncio.IncompleteReadError):
                while loop.time() < deadline:
                    await _request(r2, w2, VERSIONS, ApiVersionsResponse, 4)
                    await asyncio.sleep(0.1)
            assert ctx.authentication_stats.expired_connections_killed == {"SASL_PLAINTEXT": 1}
            # a re-authentication as another user fails and closes that connection
            failed = await _authenticate(r, w, "bob")
            assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert "Cannot change principals" in failed.error_message
            assert await asyncio.wait_for(r.read(), 10) == b""
            assert ctx.authentication_stats.failed_reauthentication == {
                ("SASL_PLAINTEXT", "PLAIN"): 1}
            w.close()
            w2.close()
        finally:
            await server.stop()
    asyncio.run(asyncio.wait_for(main(), 40))


def test_re_authentications_and_expired_connections_are_exported_as_kafka_names_them():
    from prometheus_client import CollectorRegistry, generate_latest
    from strata.server.metrics import AuthenticationCollector
    stats = AuthenticationStats()
    stats.succeeded("SASL_SSL", "OAUTHBEARER", reauthentication=True)
    stats.failed("SASL_SSL", "PLAIN", reauthentication=True)
    stats.expired_killed("SASL_SSL")
    registry = CollectorRegistry()
    registry.register(AuthenticationCollector(stats))
    text = generate_latest(registry).decode()
    assert ('kafka_server_socket_server_metrics_successful_reauthentication_total{'
            'listener="SASL_SSL",mechanism="OAUTHBEARER"} 1.0') in text
    assert ('kafka_server_socket_server_metrics_failed_reauthentication_total{'
            'listener="SASL_SSL",mechanism="PLAIN"} 1.0') in text
    assert ('kafka_server_socket_server_metrics_expired_connections_killed_count_total{'
            'listener="SASL_SSL"} 1.0') in text


def test_during_a_re_authentication_frames_are_bounded_by_sasl_server_max_receive_size():
    async def main():
        ctx = SimpleNamespace(authentication_stats=AuthenticationStats(), quotas=None,
                              api_versions=advertised_versions(), features=None,
                              failed_authentication_delay_ms=0)
        factories = ListenerMechanisms(PLAIN=lambda: PlainServer(USERS))
        factories.connections_max_reauth_ms = {"PLAIN": 60_000}
        server = KafkaServer(Dispatcher(ctx), "127.0.0.1", 0, listener="SASL_PLAINTEXT",
                             security_protocol="SASL_PLAINTEXT", sasl_factories=factories,
                             sasl_max_receive_size=1024)
        await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            await _authenticate(r, w)
            handshake = await _request(r, w, SaslHandshakeRequest(mechanism="PLAIN"),
                                       SaslHandshakeResponse, 5)
            assert handshake.error_code == ErrorCode.NONE
            w.write(framed(client_frame(SaslAuthenticateRequest(auth_bytes=b"\0" * 4096), 6)))
            assert await asyncio.wait_for(r.read(), 10) == b""    # closed, not answered
            w.close()
        finally:
            await server.stop()
    asyncio.run(asyncio.wait_for(main(), 30))
