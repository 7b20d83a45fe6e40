"""SASL on the broker's side, as Kafka's ``SaslServerAuthenticator``: which mechanisms a listener
enables, the JAAS options each is configured with, and one ``SaslServer`` per exchange.

Settings, with Kafka's names: ``sasl.enabled.mechanisms`` (Kafka's default GSSAPI), and each
mechanism's JAAS configuration ``listener.name.<listener>.<mechanism>.sasl.jaas.config`` (else
``listener.name.<listener>.sasl.jaas.config``, else ``sasl.jaas.config``), e.g. PLAIN's
``org.apache.kafka.common.security.plain.PlainLoginModule required username="admin"
password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";``: the broker's own
``username``/``password`` (for its connections to other brokers) and one ``user_<name>`` entry
per user it accepts.

A ``SaslServer`` takes the client's tokens one at a time (``evaluate``) and answers the next
server token (empty when it has none), raising ``SaslAuthenticationFailed`` with a message that
tells a guesser nothing; ``principal`` is set once ``complete``. Mechanisms other than those
built in here register a factory in ``MECHANISMS``. Pure computation: any thread may use a
server, one exchange at a time.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from strata.common.listeners import listener_prop
from strata.security.kerberos import server_factory as gssapi_server_factory
from strata.security.scram import server_factory as scram_server_factory

__all__ = ["ANONYMOUS", "JaasConfig", "KafkaPrincipal", "MECHANISMS", "PlainServer",
           "SaslAuthenticationFailed", "SaslConfigError", "SaslServer", "ScramCredentials",
           "enabled_mechanisms", "jaas_config", "parse_jaas", "server_factories"]


@dataclass(frozen=True)
class KafkaPrincipal:
    """Kafka's ``KafkaPrincipal``: ``User:alice``; ``token_authenticated`` when a delegation
    token authenticated it (not part of its identity, as in Kafka)."""

    type: str
    name: str
    token_authenticated: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")


class SaslAuthenticationFailed(Exception):
    """The exchange failed; the message is what the client is told."""


class SaslConfigError(ValueError):
    """A SASL setting Kafka would refuse at startup."""


class SaslServer(Protocol):
    mechanism: str
    complete: bool
    principal: KafkaPrincipal | None

    def evaluate(self, token: bytes) -> bytes:
        """The client's next token; the server's answer (raises SaslAuthenticationFailed)."""


@dataclass(frozen=True)
class JaasConfig:
    login_module: str
    control_flag: str
    options: Mapping[str, str]


_JAAS = re.compile(r'^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*$', re.S)
_OPTION = re.compile(r'\s*([\w.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


def parse_jaas(value: str) -> JaasConfig:
    """One login module of a ``sasl.jaas.config`` value (Kafka's ``JaasConfig``)."""
    m = _JAAS.match(value)
    if m is None:
        raise SaslConfigError(f"Invalid JAAS config: {value!r} (expected "
                              f"'<LoginModule> required key=\"value\" ...;')")
    options: dict[str, str] = {}
    rest = m.group(3)
    pos = 0
    while pos < len(rest.rstrip()):
        opt = _OPTION.match(rest, pos)
        if opt is None:
            raise SaslConfigError(f"Invalid JAAS config option near {rest[pos:pos + 20]!r}")
        raw = opt.group(2)
        options[opt.group(1)] = (re.sub(r'\\(.)', r'\1', raw[1:-1])
                                 if raw.startswith('"') else raw)
        pos = opt.end()
    return JaasConfig(m.group(1), m.group(2), options)


def enabled_mechanisms(props: Mapping[str, str], listener: str) -> tuple[str, ...]:
    raw = listener_prop(props, listener, "sasl.enabled.mechanisms", "GSSAPI") or ""
    return tuple(m.strip().upper() for m in raw.split(",") if m.strip())


def jaas_config(props: Mapping[str, str], listener: str, mechanism: str) -> JaasConfig | None:
    prefix = f"listener.name.{listener.lower()}."
    for key in (f"{prefix}{mechanism.lower()}.sasl.jaas.config", f"{prefix}sasl.jaas.config",
                "sasl.jaas.config"):
        if props.get(key):
            return parse_jaas(props[key])
    return None


class PlainServer:
    """PLAIN (RFC 4616) against the ``user_<name>`` entries of the listener's JAAS config. A
    client may not act for another (an authorization id, if given, must be its own name)."""

    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]):
        self._users = users
        self.complete = False
        self.principal: KafkaPrincipal | None = None

    def evaluate(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslAuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        if not user:
            raise SaslAuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationFailed("Authentication failed: password not specified")
        expected = self._users.get(user)
        # compare even for an unknown user, so the time taken says nothing of who exists
        ok = hmac.compare_digest(password.encode(), (expected or "\0" + password).encode())
        if expected is None or not ok:
            raise SaslAuthenticationFailed("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise SaslAuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different "
                "from username")
        self.complete = True
        self.principal = KafkaPrincipal("User", user)
        return b""


class ScramCredentials(Protocol):
    """Where SCRAM credentials live (``/config/users/<name>`` in a cluster)."""

    def scram_credential(self, user: str, mechanism: str):
        """The user's stored credential for ``mechanism`` (SCRAM-SHA-256/512), or None."""


def _plain(props: Mapping[str, str], listener: str,
           credentials: ScramCredentials | None = None) -> Callable[[], SaslServer]:
    jaas = jaas_config(props, listener, "PLAIN")
    if jaas is None:
        raise SaslConfigError(f"listener {listener} enables PLAIN but has no JAAS config "
                              f"(listener.name.{listener.lower()}.plain.sasl.jaas.config)")
    users = {k[len("user_"):]: v for k, v in jaas.options.items() if k.startswith("user_")}
    return lambda: PlainServer(users)


def _oauthbearer(props: Mapping[str, str], listener: str,
                 credentials: ScramCredentials | None = None) -> Callable[[], SaslServer]:
    from strata.security.oauthbearer import server_factory   # imports this module
    return server_factory(props, listener, credentials)


# mechanism -> (props, listener, SCRAM credentials) -> a factory of servers; made at startup
MECHANISMS: dict[str, Callable[[Mapping[str, str], str, ScramCredentials | None],
                               Callable[[], SaslServer]]] = {
    "PLAIN": _plain,
    "SCRAM-SHA-256": scram_server_factory("SCRAM-SHA-256"),
    "SCRAM-SHA-512": scram_server_factory("SCRAM-SHA-512"),
    "OAUTHBEARER": _oauthbearer,
    "GSSAPI": gssapi_server_factory,
}


class ListenerMechanisms(dict):
    """A listener's mechanisms, each to a factory of servers, and ``connections_max_reauth_ms``:
    each mechanism's ``connections.max.reauth.ms`` (KIP-368; 0, the default, sets no limit),
    ``listener.name.<l>.<mechanism>.connections.max.reauth.ms``, else the listener's, else the
    broker's."""

    connections_max_reauth_ms: dict[str, int]


def server_factories(props: Mapping[str, str], listener: str,
                     credentials: ScramCredentials | None = None
                     ) -> ListenerMechanisms:
    """The listener's enabled mechanisms, each with a factory of servers; refuses a mechanism
    Strata does not serve."""
    out = ListenerMechanisms()
    out.connections_max_reauth_ms = {}
    for mechanism in enabled_mechanisms(props, listener):
        make = MECHANISMS.get(mechanism)
        if make is None:
            raise SaslConfigError(f"listener {listener}: SASL mechanism {mechanism} is not "
                                  f"supported (supported: {', '.join(sorted(MECHANISMS))})")
        out[mechanism] = make(props, listener, credentials)
        prefix = f"listener.name.{listener.lower()}."
        reauth = next((props[k] for k in (f"{prefix}{mechanism.lower()}.connections.max.reauth.ms",
                                          f"{prefix}connections.max.reauth.ms",
                                          "connections.max.reauth.ms") if props.get(k)), "0")
        out.connections_max_reauth_ms[mechanism] = int(reauth)
    if not out:
        raise SaslConfigError(f"listener {listener} uses SASL but enables no mechanism")
    return out
