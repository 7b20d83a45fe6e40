"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka does them: the mechanisms,
the stored credential and its string form, the formatter (Kafka's ``ScramFormatter``) and the
broker's side of the exchange (Kafka's ``ScramSaslServer``).

A credential is what the broker keeps of a password: a salt, an iteration count, the stored key
``H(HMAC(SaltedPassword, "Client Key"))`` and the server key ``HMAC(SaltedPassword, "Server
Key")``, where ``SaltedPassword`` is PBKDF2-HMAC (RFC 5802's ``Hi``) of the password's UTF-8
bytes (Kafka does not SASLprep it). Kafka's string form, kept in ZooKeeper's
``/config/users/<user>`` under the mechanism's name and in the broker's metadata file::

    "SCRAM-SHA-256": "salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=4096"

The exchange accepts channel binding ``n`` only (no ``-PLUS`` mechanisms, no ``y``/``p`` flag)
and checks that the client's final message echoes that header (``c=biws`` for ``n,,``) and
ends with the whole nonce (Kafka's endsWith, which librdkafka 2.0.x's doubled client part
needs). An unknown user is answered with a made-up credential (stable salt for the
name, keys no proof matches), so the exchange of an unknown user fails where and as a wrong
password's does. With Kafka's ``tokenauth=true`` extension the user name is a delegation token's
id, its credential and principal (the token's owner, token-authenticated) come from the
broker's tokens (``strata.cluster.delegation_tokens``; refused without them) and the session
ends when the token expires; other extensions are ignored, as Kafka does.

Only ``hashlib`` and ``hmac`` compute: PBKDF2-HMAC, HMAC and hashes, compared in constant time.
Pure computation: any thread may use a server, one exchange at a time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = ["MECHANISMS", "MECHANISMS_BY_TYPE", "SCRAM_SHA_256", "SCRAM_SHA_512",
           "ScramCredential", "ScramFormatter", "ScramMechanism", "ScramServer",
           "credential_from_string", "credential_to_string", "desanitize", "random_salt",
           "sanitize", "server_factory", "user_credentials"]

UNKNOWN_MECHANISM_TYPE = 0
MAX_ITERATIONS = 16384   # Kafka's ScramControlManager.MAX_ITERATIONS


@dataclass(frozen=True)
class ScramMechanism:
    """Kafka's ``ScramMechanism``: its name, the type byte of the admin APIs, its hash."""

    name: str
    type: int
    hash_name: str
    min_iterations: int = 4096
    max_iterations: int = MAX_ITERATIONS


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
MECHANISMS_BY_TYPE: dict[int, ScramMechanism] = {m.type: m for m in MECHANISMS.values()}


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def __str__(self) -> str:
        return credential_to_string(self)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def credential_to_string(credential: ScramCredential) -> str:
    """Kafka's ``ScramCredentialUtils.credentialToString``."""
    return (f"salt={_b64(credential.salt)},stored_key={_b64(credential.stored_key)},"
            f"server_key={_b64(credential.server_key)},iterations={credential.iterations}")


def credential_from_string(text: str) -> ScramCredential:
    """Kafka's ``ScramCredentialUtils.credentialFromString``; ValueError for anything else."""
    props: dict[str, str] = {}
    for token in text.split(","):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"Credentials not valid: {text}")
        props[key] = value
    if set(props) != {"salt", "stored_key", "server_key", "iterations"}:
        raise ValueError(f"Credentials not valid: {text}")
    try:
        return ScramCredential(_unb64(props["salt"]), _unb64(props["stored_key"]),
                               _unb64(props["server_key"]), int(props["iterations"]))
    except (binascii.Error, ValueError, UnicodeError):
        raise ValueError(f"Credentials not valid: {text}") from None


def user_credentials(config: Mapping[str, str]) -> dict[str, ScramCredential]:
    """The SCRAM credentials among a user's entity configs, by mechanism name (entries that
    are not SCRAM, such as quotas, and unreadable ones are left out)."""
    out = {}
    for name in MECHANISMS:
        value = config.get(name)
        if value is not None:
            try:
                out[name] = credential_from_string(value)
            except ValueError:
                continue
    return out


def random_salt() -> bytes:
    """Kafka's ``ScramFormatter.secureRandomBytes``: a 130-bit random number in base 36."""
    return _base36(secrets.randbits(130)).encode("ascii")


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


class ScramFormatter:
    """Kafka's ``ScramFormatter`` for one mechanism."""

    def __init__(self, mechanism: ScramMechanism):
        self.mechanism = mechanism
        self._hash = mechanism.hash_name

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self._hash).digest()

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self._hash, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """RFC 5802's ``Hi(Normalize(password), salt, i)``: PBKDF2-HMAC, one block."""
        return hashlib.pbkdf2_hmac(self._hash, password.encode("utf-8"), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def stored_key(self, client_key: bytes) -> bytes:
        return self.hash(client_key)

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")

    def credential(self, salt: bytes, salted_password: bytes, iterations: int) -> ScramCredential:
        """What the broker stores of an AlterUserScramCredentials upsertion."""
        return ScramCredential(salt, self.stored_key(self.client_key(salted_password)),
                               self.server_key(salted_password), iterations)

    def generate_credential(self, password: str, iterations: int,
                            salt: bytes | None = None) -> ScramCredential:
        salt = random_salt() if salt is None else salt
        return self.credential(salt, self.salted_password(password, salt, iterations), iterations)


# ---- user names --------------------------------------------------------------------------------

def sanitize(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize`` (Java's URLEncoder, ``*`` and space percent-encoded):
    the znode name of a user entity."""
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def desanitize(name: str) -> str:
    """Kafka's ``Sanitizer.desanitize`` (Java's URLDecoder)."""
    return urllib.parse.unquote_plus(name)


def username_from_sasl_name(sasl_name: str) -> str:
    """Kafka's ``ScramFormatter.username``: ``=2C`` is ``,`` and ``=3D`` is ``=``."""
    name = sasl_name.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise ValueError(f"Invalid username: {sasl_name}")
    return name.replace("=3D", "=")


def sasl_name(username: str) -> str:
    """Kafka's ``ScramFormatter.saslName``."""
    return username.replace("=", "=3D").replace(",", "=2C")


# ---- the exchange ------------------------------------------------------------------------------

# Kafka's ScramMessages patterns (Java's [\x01-\x7F&&[^=,]] spelled out)
_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]+"
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)(?P<bare>(?:m={_VALUE},)?"
    rf"n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))")
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_BASE64})")

TOKEN_AUTH = "tokenauth"   # Kafka's ScramLoginModule.TOKEN_AUTH_CONFIG
FAKE_ITERATIONS = 4096     # what kafka-configs stores by default
_FAKE_SECRET = secrets.token_bytes(32)   # made-up credentials of unknown users, per process


def _failed(message: str) -> Exception:
    # sasl imports this module for its registry: its names are looked up once needed
    from strata.security.sasl import SaslAuthenticationFailed
    return SaslAuthenticationFailed(message)


def fake_credential(mechanism: ScramMechanism, user: str) -> ScramCredential:
    """A credential for a user who has none: the same salt for the name on every attempt (a
    salt that changed would tell), a Kafka-like salt's form, keys nobody's proof matches."""
    seed = hmac.new(_FAKE_SECRET, f"{mechanism.name}\0{user}".encode("utf-8"),
                    "sha256").digest()
    salt = _base36(int.from_bytes(seed[:17], "big") >> 6).encode("ascii")
    size = hashlib.new(mechanism.hash_name).digest_size
    return ScramCredential(salt, secrets.token_bytes(size), secrets.token_bytes(size),
                           FAKE_ITERATIONS)


class ScramServer:
    """One SCRAM exchange on the broker's side (Kafka's ``ScramSaslServer``)."""

    def __init__(self, mechanism: ScramMechanism,
                 lookup: Callable[[str, str], ScramCredential | None],
                 server_nonce: Callable[[], str] | None = None, tokens=None):
        self.mechanism = mechanism.name
        self.complete = False
        self.principal = None
        self.credential_expires_ms: int | None = None   # a token's expiry (session lifetime)
        self._tokens = tokens   # DelegationTokenManager, or None: tokenauth refused
        self._token_owner = None
        self._mech = mechanism
        self._formatter = ScramFormatter(mechanism)
        self._lookup = lookup
        self._state = "RECEIVE_CLIENT_FIRST_MESSAGE"
        self._credential: ScramCredential | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._username = ""
        # Kafka's: a 130-bit random number in base 36 (tests pass RFC 7677's)
        self._server_nonce = server_nonce or (lambda: _base36(secrets.randbits(130)))

    def _invalid(self) -> Exception:
        """What the client is told of a failure that must not say why (Kafka's answer to the
        SaslException of its SCRAM server)."""
        return _failed("Authentication failed during authentication due to invalid credentials "
                       f"with SASL mechanism {self.mechanism}")

    def evaluate(self, token: bytes) -> bytes:
        try:
            if self._state == "RECEIVE_CLIENT_FIRST_MESSAGE":
                return self._client_first(token)
            if self._state == "RECEIVE_CLIENT_FINAL_MESSAGE":
                return self._client_final(token)
            raise _failed(f"Unexpected challenge in Sasl server state {self._state}")
        except Exception:
            self._credential = None
            self._state = "FAILED" if self._state != "COMPLETE" else self._state
            raise

    def _client_first(self, token: bytes) -> bytes:
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._invalid() from None
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise self._invalid()
        extensions = dict(e.split("=", 1) for e in m.group("extensions")[1:].split(",") if e)
        token_auth = extensions.get(TOKEN_AUTH, "").lower() == "true"
        if token_auth and self._tokens is None:
            raise self._invalid()   # delegation tokens are off
        try:
            username = username_from_sasl_name(m.group("saslname"))
        except ValueError:
            raise self._invalid() from None
        authzid = m.group("authzid") or ""
        if authzid and authzid != username:
            raise _failed("Authentication failed: Client requested an authorization id that is "
                          "different from username")
        try:
            if token_auth:
                found = self._tokens.token_credential(username, self.mechanism)
                if found is None:
                    raise self._invalid()   # Kafka: "Invalid tokenId"
                credential, self._token_owner, self.credential_expires_ms = found
            else:
                credential = self._lookup(username, self.mechanism)
        except Exception:  # noqa: BLE001 - Kafka: "Credentials could not be obtained"
            raise self._invalid() from None
        if credential is None:
            credential = fake_credential(self._mech, username)
        if credential.iterations < self._mech.min_iterations:
            raise self._invalid()
        self._credential = credential
        self._username = username
        self._gs2_header = m.group("gs2")
        self._client_first_bare = m.group("bare")
        self._nonce = m.group("nonce") + self._server_nonce()
        self._server_first = (f"r={self._nonce},s={_b64(credential.salt)},"
                              f"i={credential.iterations}")
        self._state = "RECEIVE_CLIENT_FINAL_MESSAGE"
        return self._server_first.encode("ascii")

    def _client_final(self, token: bytes) -> bytes:
        try:
            message = token.decode("ascii")
        except UnicodeDecodeError:
            raise self._invalid() from None
        m = _CLIENT_FINAL.fullmatch(message)
        if m is None:
            raise self._invalid()
        received, nonce = m.group("nonce").encode(), self._nonce.encode()
        # Kafka checks that the nonce ends with the server-first one (endsWith), not equality:
        # librdkafka 2.0.x (Debian's kcat) sends the client's part twice
        if len(received) < len(nonce) or not hmac.compare_digest(received[-len(nonce):], nonce):
            raise self._invalid()
        if base64.b64decode(m.group("channel")) != self._gs2_header.encode("utf-8"):
            raise self._invalid()   # channel binding "n": c= is the GS2 header itself
        credential = self._credential
        assert credential is not None
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 m.group("without_proof"))).encode("utf-8")
        proof = base64.b64decode(m.group("proof"))
        signature = self._formatter.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise self._invalid()
        client_key = bytes(a ^ b for a, b in zip(signature, proof))
        if not hmac.compare_digest(self._formatter.hash(client_key), credential.stored_key):
            raise self._invalid()
        server_signature = self._formatter.hmac(credential.server_key, auth_message)
        self._credential = None
        self._state = "COMPLETE"
        from strata.security.sasl import KafkaPrincipal
        owner = self._token_owner
        self.principal = (KafkaPrincipal("User", self._username) if owner is None else
                          KafkaPrincipal(owner.type, owner.name, token_authenticated=True))
        self.complete = True
        return f"v={_b64(server_signature)}".encode("ascii")


@dataclass(frozen=True)
class BrokerCredentials:
    """What a broker's SCRAM servers check a login against: its stored credentials
    (``scram_credential(user, mechanism)``) and its delegation tokens (KIP-48; None when off:
    tokenauth refused)."""
    scram_credential: Callable[[str, str], ScramCredential | None]
    delegation_tokens: object | None = None


def server_factory(mechanism_name: str):
    """The ``MECHANISMS`` entry of a SCRAM mechanism: ``(props, listener, credentials)`` to a
    factory of servers, refused (SaslConfigError) without the listener's JAAS config for the
    mechanism (Kafka wants a ScramLoginModule entry) or without a credential store."""
    mechanism = MECHANISMS[mechanism_name]

    def make(props, listener: str, credentials=None) -> Callable[[], ScramServer]:
        from strata.security.sasl import SaslConfigError, jaas_config
        if jaas_config(props, listener, mechanism.name) is None:
            raise SaslConfigError(
                f"listener {listener} enables {mechanism.name} but has no JAAS config "
                f"(listener.name.{listener.lower()}.{mechanism.name.lower()}.sasl.jaas.config)")
        if credentials is None:
            raise SaslConfigError(f"listener {listener} enables {mechanism.name} but the broker "
                                  f"passed no SCRAM credential store")
        tokens = credentials.delegation_tokens if isinstance(credentials, BrokerCredentials) \
            else None
        return lambda: ScramServer(mechanism, credentials.scram_credential, tokens=tokens)
    return make
