"""One connection's SASL state on a SASL listener (Kafka's ``SaslServerAuthenticator``):
a SaslHandshake picks the mechanism, SaslAuthenticate requests carry the tokens, and until the
exchange is complete only ApiVersions, SaslHandshake and SaslAuthenticate are served. After a
SaslHandshake v0 (clients before Kafka 1.0) the tokens travel as raw length-prefixed frames
without a request header (``raw_tokens``), answered the same way.

Threads: the connection's task only.
"""

from __future__ import annotations

from typing import Callable, Mapping

from strata.security.sasl import KafkaPrincipal, SaslServer

__all__ = ["AuthenticationStats", "SaslSession"]


class SaslSession:
    def __init__(self, factories: Mapping[str, Callable[[], SaslServer]]):
        self.factories = factories
        self.server: SaslServer | None = None
        self.principal: KafkaPrincipal | None = None
        self.raw_tokens = False   # Kafka's enableKafkaSaslAuthenticateHeaders, negated

    @property
    def raw_tokens_expected(self) -> bool:
        """The next frame is a raw token (the v0 exchange is under way)."""
        return self.raw_tokens and self.server is not None and not self.authenticated

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return tuple(self.factories)

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def handshake(self, mechanism: str) -> bool:
        """Start an exchange of ``mechanism``; False when the listener does not enable it."""
        make = self.factories.get(mechanism)
        if make is None:
            return False
        self.server = make()
        return True


class AuthenticationStats:
    """Successful and failed authentications per (listener, mechanism): Kafka's
    ``successful-authentication-total`` and ``failed-authentication-total``."""

    def __init__(self):
        self.successful: dict[tuple[str, str], int] = {}
        self.failed_total: dict[tuple[str, str], int] = {}

    def succeeded(self, listener: str, mechanism: str) -> None:
        key = (listener, mechanism)
        self.successful[key] = self.successful.get(key, 0) + 1

    def failed(self, listener: str, mechanism: str) -> None:
        key = (listener, mechanism)
        self.failed_total[key] = self.failed_total.get(key, 0) + 1
