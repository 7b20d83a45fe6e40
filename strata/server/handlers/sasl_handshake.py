"""SaslHandshake v0-1 (Kafka's ``SaslServerAuthenticator.handleHandshakeRequest``): the client
names its mechanism; the answer lists the listener's enabled ones, UNSUPPORTED_SASL_MECHANISM
when it is not among them. On an authenticated connection it starts a re-authentication
(KIP-368) when the session has an end and none started in the last second; otherwise, on a
listener without SASL, or during an exchange, ILLEGAL_SASL_STATE (Kafka's KafkaApis answer).
After a successful v0 the tokens come as raw frames without a header (the network layer passes
them to ``sasl_authenticate.raw_token``)."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.group_common import CURRENT_CONNECTION


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    session = CURRENT_CONNECTION.get().sasl
    if session is None or session.server is not None or (
            session.authenticated and not session.reauthenticating and
            not session.begin_reauthentication()):
        return make(rc, error_code=kio_error_code(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=())
    ok = session.handshake(str(request.body.mechanism))
    session.raw_tokens = ok and request.api_version == 0
    code = ErrorCode.NONE if ok else ErrorCode.UNSUPPORTED_SASL_MECHANISM
    return make(rc, error_code=kio_error_code(code), mechanisms=session.mechanisms)
