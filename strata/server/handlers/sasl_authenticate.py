"""SaslAuthenticate v0-2: one token of the exchange the handshake started. A failed exchange is
answered SASL_AUTHENTICATION_FAILED after ``connection.failed.authentication.delay.ms`` and the
connection closed once the answer has left (Kafka's behaviour); its message tells a guesser
nothing. Without a handshake first, or on a listener without SASL, ILLEGAL_SASL_STATE. The
answer completing an exchange carries the session's lifetime (v1+, KIP-368; 0 when it has no
end); a re-authentication that changes the principal fails."""

from __future__ import annotations

import asyncio
import datetime
import logging

from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.sasl import SaslAuthenticationFailed
from strata.server.handlers.group_common import CURRENT_CONNECTION
from strata.server.network import CloseConnection

log = logging.getLogger(__name__)


async def handle(ctx, request):
    conn = CURRENT_CONNECTION.get()
    session = conn.sasl
    if session is None or session.server is None:
        conn.close_after_response = session is not None
        return error_response(request, ErrorCode.ILLEGAL_SASL_STATE,
                              "Unexpected SaslAuthenticate request")
    server = session.server
    reauthentication = session.reauthenticating
    try:
        answer = server.evaluate(bytes(request.body.auth_bytes))
        lifetime_ms = session.completed(server) if server.complete else 0
    except SaslAuthenticationFailed as exc:
        log.info("failed %s with %s (%s on %s): %s",
                 "re-authentication" if reauthentication else "authentication", conn.peer,
                 server.mechanism, conn.listener, exc)
        ctx.authentication_stats.failed(conn.listener, server.mechanism, reauthentication)
        await asyncio.sleep(ctx.failed_authentication_delay_ms / 1000)
        conn.close_after_response = True
        return error_response(request, ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc))
    if server.complete:
        conn.principal = session.principal
        ctx.authentication_stats.succeeded(conn.listener, server.mechanism, reauthentication)
        if reauthentication:
            log.info("%s re-authenticated %s on %s; session lifetime %d ms", conn.peer,
                      conn.principal, conn.listener, lifetime_ms)
    lifetime = ({"session_lifetime": datetime.timedelta(milliseconds=lifetime_ms)}
                if request.api_version >= 1 else {})
    return make(response_class(request.api_key, request.api_version),
                error_code=kio_error_code(ErrorCode.NONE), error_message=None,
                auth_bytes=answer, **lifetime)


async def raw_token(ctx, conn, token: bytes) -> bytes:
    """One token of the exchange after SaslHandshake v0, a raw frame without a request header;
    the server's token, which goes back as a raw frame (empty ones too, as Kafka sends them).
    A failure closes the connection after the delay: this framing has no error answer."""
    server = conn.sasl.server
    try:
        answer = server.evaluate(token)
        if server.complete:
            conn.sasl.completed(server)
    except SaslAuthenticationFailed as exc:
        log.info("failed authentication with %s (%s on %s, raw tokens): %s", conn.peer,
                 server.mechanism, conn.listener, exc)
        ctx.authentication_stats.failed(conn.listener, server.mechanism)
        await asyncio.sleep(ctx.failed_authentication_delay_ms / 1000)
        raise CloseConnection(f"SASL authentication failed: {exc}") from None
    if server.complete:
        conn.principal = conn.sasl.principal
        ctx.authentication_stats.succeeded(conn.listener, server.mechanism)
    return answer
