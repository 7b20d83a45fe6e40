"""SASL on the client's side, for the broker's own connections to other brokers' SASL
inter-broker listener: PLAIN and SCRAM-SHA-256/512 (RFC 5802 with channel binding "n"), with
the credentials of that listener's JAAS config for ``sasl.mechanism.inter.broker.protocol``
(``username``/``password``, as Kafka's brokers take them), and GSSAPI with that config's
Kerberos ``principal`` and ``keyTab`` (``strata.security.kerberos``).

A client is a generator of tokens: ``first()`` gives the first, ``next(server_token)`` the
answer to each server token, None once the exchange is over; a server signature that does not
verify raises ``SaslAuthenticationFailed``. Pure; one exchange per client.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from strata.common.listeners import listener_prop
from strata.security.sasl import SaslAuthenticationFailed, SaslConfigError, jaas_config
from strata.security.scram import MECHANISMS as SCRAM_MECHANISMS
from strata.security.scram import ScramFormatter, sasl_name

if TYPE_CHECKING:
    from strata.security.kerberos import KerberosClientCredentials

__all__ = ["SaslCredentials", "inter_broker_credentials", "new_client"]


@dataclass(frozen=True)
class SaslCredentials:
    mechanism: str
    username: str
    password: str


def inter_broker_credentials(props: Mapping[str, str], listener: str
                             ) -> SaslCredentials | KerberosClientCredentials:
    """The broker's own credentials on its SASL inter-broker ``listener``."""
    mechanism = (props.get("sasl.mechanism.inter.broker.protocol") or "GSSAPI").strip().upper()
    if mechanism == "GSSAPI":
        from strata.security.kerberos import client_credentials
        credentials = client_credentials(props, listener)
    elif mechanism != "PLAIN" and mechanism not in SCRAM_MECHANISMS:
        raise SaslConfigError(f"sasl.mechanism.inter.broker.protocol {mechanism} is not "
                              f"supported (GSSAPI, PLAIN, {', '.join(sorted(SCRAM_MECHANISMS))})")
    else:
        jaas = jaas_config(props, listener, mechanism)
        if jaas is None or not jaas.options.get("username"):
            raise SaslConfigError(f"the inter-broker listener {listener} has no username/password "
                                  f"in listener.name.{listener.lower()}.{mechanism.lower()}"
                                  f".sasl.jaas.config")
        credentials = SaslCredentials(mechanism, jaas.options["username"],
                                      jaas.options.get("password", ""))
    enabled = listener_prop(props, listener, "sasl.enabled.mechanisms", "GSSAPI") or ""
    if mechanism not in {m.strip().upper() for m in enabled.split(",")}:
        raise SaslConfigError(f"sasl.mechanism.inter.broker.protocol {mechanism} is not among "
                              f"the inter-broker listener's sasl.enabled.mechanisms {enabled}")
    return credentials


class _PlainClient:
    def __init__(self, credentials: SaslCredentials):
        self._credentials = credentials

    def first(self) -> bytes:
        c = self._credentials
        return b"\0" + c.username.encode() + b"\0" + c.password.encode()

    def next(self, server_token: bytes) -> bytes | None:
        return None


class _ScramClient:
    def __init__(self, credentials: SaslCredentials):
        self._credentials = credentials
        self._formatter = ScramFormatter(SCRAM_MECHANISMS[credentials.mechanism])
        self._nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self._bare = f"n={sasl_name(credentials.username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def next(self, server_token: bytes) -> bytes | None:
        if self._server_signature is not None:       # server-final: verify, then done
            fields = dict(f.split("=", 1) for f in server_token.decode().split(",") if "=" in f)
            if "e" in fields or not hmac.compare_digest(
                    base64.b64decode(fields.get("v", "")), self._server_signature):
                raise SaslAuthenticationFailed("the server's SCRAM signature does not verify")
            return None
        server_first = server_token.decode()
        fields = dict(f.split("=", 1) for f in server_first.split(",") if "=" in f)
        nonce, salt, iterations = fields.get("r", ""), fields.get("s", ""), fields.get("i", "0")
        if not nonce.startswith(self._nonce):
            raise SaslAuthenticationFailed("the server's SCRAM nonce does not extend ours")
        f = self._formatter
        salted = f.salted_password(self._credentials.password, base64.b64decode(salt),
                                   int(iterations))
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        auth_message = f"{self._bare},{server_first},{without_proof}".encode()
        client_key = f.client_key(salted)
        signature = f.hmac(f.stored_key(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = f.hmac(f.server_key(salted), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def new_client(credentials, host: str | None = None):
    """A client for one exchange with the broker at ``host`` (GSSAPI names its ticket's
    service after it)."""
    if credentials.mechanism == "GSSAPI":
        from strata.security.kerberos import GssapiClient
        return GssapiClient(credentials, host)
    return _PlainClient(credentials) if credentials.mechanism == "PLAIN" \
        else _ScramClient(credentials)
