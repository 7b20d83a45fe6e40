"""One connection's SASL state on a SASL listener (Kafka's ``SaslServerAuthenticator``):
a SaslHandshake picks the mechanism, SaslAuthenticate requests carry the tokens, and until the
exchange is complete only ApiVersions, SaslHandshake and SaslAuthenticate are served.

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
