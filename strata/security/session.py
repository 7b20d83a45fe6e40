"""One connection's SASL state on a SASL listener (Kafka's ``SaslServerAuthenticator`` and the
re-authentication of KIP-368): a SaslHandshake picks the mechanism, SaslAuthenticate requests
carry the tokens, and until the exchange is complete only ApiVersions, SaslHandshake and
SaslAuthenticate are served.

Session lifetime (KIP-368, Kafka's ``calcCompletionTimesAndReturnSessionLifetimeMs``): once an
exchange completes, the session lasts the mechanism's ``connections.max.reauth.ms`` (when
positive), bounded by the credential's own end (an OAUTHBEARER token's ``exp``); with neither it
never ends. SaslAuthenticate v1+ tells the client that lifetime. After it, any request but a
SaslHandshake that starts a re-authentication closes the connection (Kafka's SocketServer). A
re-authentication is a SaslHandshake and SaslAuthenticate exchange on the same connection, at
most one start a second, only while the session has an end; it must use the same mechanism and
end with the same principal, else it fails; meanwhile nothing but SaslAuthenticate is served.
After a SaslHandshake v0 (clients before Kafka 1.0) the tokens travel as raw length-prefixed
frames without a request header (``raw_tokens``), answered the same way.

Threads: the connection's task only.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

from strata.protocol.codec import ApiKey
from strata.security.sasl import KafkaPrincipal, SaslAuthenticationFailed, SaslServer

__all__ = ["AuthenticationStats", "SaslSession", "session_lifetime_ms"]

_BEFORE_AUTHENTICATION = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                                    ApiKey.SASL_AUTHENTICATE})
MIN_REAUTH_INTERVAL_S = 1.0   # Kafka's KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS


def session_lifetime_ms(max_reauth_ms: int, credential_expires_ms: int | None,
                        now_ms: int) -> int | None:
    """The session's lifetime in ms once authenticated; None when it has no end."""
    limited = max_reauth_ms > 0
    if credential_expires_ms is None:
        return max_reauth_ms if limited else None
    left = max(0, credential_expires_ms - now_ms)
    return min(left, max_reauth_ms) if limited else left


class _WrongMechanism:
    """The server of a re-authentication that names another mechanism: its token fails."""

    complete = False
    principal = None

    def __init__(self, mechanism: str, previous: str):
        self.mechanism = mechanism
        self._message = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                         f"re-authentication of mechanism '{previous}'")

    def evaluate(self, token: bytes) -> bytes:
        raise SaslAuthenticationFailed(self._message)


class SaslSession:
    def __init__(self, factories: Mapping[str, Callable[[], SaslServer]],
                 max_reauth_ms: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.factories = factories
        self.max_reauth_ms = dict(max_reauth_ms if max_reauth_ms is not None
                                  else getattr(factories, "connections_max_reauth_ms", {}))
        self.server: SaslServer | None = None
        self.principal: KafkaPrincipal | None = None
        self.mechanism: str | None = None        # of the completed authentication
        self.expires_at: float | None = None     # clock() when the session ends; None: never
        self.reauthenticating = False
        self._reauth_started: float | None = None
        self._clock, self._wall = clock, wall_clock
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
        if self.reauthenticating and mechanism != self.mechanism:
            self.server = _WrongMechanism(mechanism, self.mechanism)
        else:
            self.server = make()
        return True

    def expired(self) -> bool:
        return self.expires_at is not None and self._clock() >= self.expires_at

    def begin_reauthentication(self) -> bool:
        """A SaslHandshake on an authenticated connection: True when it starts a
        re-authentication (the session has an end and none started in the last second)."""
        now = self._clock()
        if self.expires_at is None or (self._reauth_started is not None and
                                       now - self._reauth_started < MIN_REAUTH_INTERVAL_S):
            return False
        self._reauth_started = now
        self.reauthenticating = True
        self.server = None
        return True

    def refusal(self, api_key: ApiKey) -> str | None:
        """Why a request must close the connection instead of being handled, or None."""
        if not self.authenticated:
            if api_key not in _BEFORE_AUTHENTICATION:
                return f"unexpected Kafka request of type {api_key.name} during SASL handshake"
        elif self.reauthenticating:
            if api_key != ApiKey.SASL_AUTHENTICATE and not (
                    api_key == ApiKey.SASL_HANDSHAKE and self.server is None):
                return (f"unexpected Kafka request of type {api_key.name} during SASL "
                        f"re-authentication")
        elif self.expired() and not (api_key == ApiKey.SASL_HANDSHAKE and
                                     self.begin_reauthentication()):
            return f"the SASL session expired ({api_key.name} instead of a re-authentication)"
        return None

    def completed(self, server: SaslServer) -> int:
        """The exchange of ``server`` completed: the session's lifetime in ms (0: no end), or
        SaslAuthenticationFailed when a re-authentication names another principal."""
        if self.reauthenticating and server.principal != self.principal:
            old, new = self.principal, server.principal
            raise SaslAuthenticationFailed(
                f"Cannot change principals during re-authentication from {old.type}.{old.name}: "
                f"{new.type}.{new.name}")
        lifetime = session_lifetime_ms(self.max_reauth_ms.get(server.mechanism, 0),
                                       getattr(server, "credential_expires_ms", None),
                                       int(self._wall() * 1000))
        self.expires_at = None if lifetime is None else self._clock() + lifetime / 1000
        self.principal, self.mechanism = server.principal, server.mechanism
        self.reauthenticating = False
        self.server = None
        return lifetime or 0


class AuthenticationStats:
    """Authentications and re-authentications per (listener, mechanism) and expired
    connections closed per listener: Kafka's ``successful-authentication-total``,
    ``failed-authentication-total``, ``successful-reauthentication-total``,
    ``failed-reauthentication-total`` and ``expired-connections-killed-count``."""

    def __init__(self):
        self.successful: dict[tuple[str, str], int] = {}
        self.failed_total: dict[tuple[str, str], int] = {}
        self.successful_reauthentication: dict[tuple[str, str], int] = {}
        self.failed_reauthentication: dict[tuple[str, str], int] = {}
        self.expired_connections_killed: dict[str, int] = {}

    @staticmethod
    def _add(counts: dict, key) -> None:
        counts[key] = counts.get(key, 0) + 1

    def succeeded(self, listener: str, mechanism: str, reauthentication: bool = False) -> None:
        self._add(self.successful_reauthentication if reauthentication else self.successful,
                  (listener, mechanism))

    def failed(self, listener: str, mechanism: str, reauthentication: bool = False) -> None:
        self._add(self.failed_reauthentication if reauthentication else self.failed_total,
                  (listener, mechanism))

    def expired_killed(self, listener: str) -> None:
        self._add(self.expired_connections_killed, listener)
