"""SASL/OAUTHBEARER (RFC 7628) on the broker's side, as Kafka 4 validates it.

The client's one message is a GS2 header and key/value pairs, ``n,[a=<authzid>],\\x01auth=Bearer
<token>\\x01[<ext>=<value>\\x01...]\\x01`` (Kafka's ``OAuthBearerClientInitialResponse``). A
token that does not validate is answered, still without an error, with the JSON challenge
``{"status":"invalid_token"}`` (``insufficient_scope`` and the scope for a missing required
scope); the client answers ``\\x01`` and the exchange fails with that JSON as its message
(Kafka's ``OAuthBearerSaslServer``). A message that does not parse fails at once with Kafka's
generic message. Extensions are accepted and ignored, as Kafka's validators do. The principal is
``User:<subject>``; the token's ``exp`` is the credential's end (``credential_expires_ms``),
which bounds the session (KIP-368).

Two validators, chosen per listener:

- JWKS (Kafka's ``OAuthBearerValidatorCallbackHandler`` / ``BrokerJwtValidator``): signed JWTs
  checked with PyJWT against the keys of ``sasl.oauthbearer.jwks.endpoint.url`` (a ``file:``
  URL, re-read when the file changes, or an ``http(s):`` URL, trusted with the JAAS config's
  ``ssl.*`` options when it has some (Kafka's ``JaasOptionsUtils``, e.g.
  ``ssl.truststore.location``), else the system's CAs, fetched in the background every
  ``sasl.oauthbearer.jwks.endpoint.refresh.ms``, with retries backing off from
  ``...retry.backoff.ms`` to ``...retry.backoff.max.ms``, and again soon when a token names a
  key id it does not know). ``alg`` ``none`` and symmetric algorithms are refused; ``exp`` and
  ``iat`` are required; ``sasl.oauthbearer.expected.audience`` (a list; without it a token
  carrying ``aud`` is refused, as jose4j does), ``sasl.oauthbearer.expected.issuer``,
  ``sasl.oauthbearer.clock.skew.seconds`` (30), ``sasl.oauthbearer.sub.claim.name`` (``sub``)
  and ``sasl.oauthbearer.scope.claim.name`` (``scope``). Used when the listener's
  ``sasl.server.callback.handler.class`` names Kafka's validator or a JWKS URL is set (where
  Kafka, given a URL but no class, would fall back to unsecured tokens, Strata does not).
- Unsecured (Kafka's default, ``OAuthBearerUnsecuredValidatorCallbackHandler``): ``alg``
  ``none`` tokens with an empty signature, options from the JAAS config:
  ``unsecuredValidatorPrincipalClaimName``, ``unsecuredValidatorScopeClaimName``,
  ``unsecuredValidatorRequiredScope`` (space-separated) and
  ``unsecuredValidatorAllowableClockSkewMs``. For tests and development only, as in Kafka.

Settings are looked up per listener and mechanism as Kafka does:
``listener.name.<l>.oauthbearer.<key>``, then ``listener.name.<l>.<key>``, then ``<key>``.
Kafka 4's URL allow-list, the JVM system property ``org.apache.kafka.sasl.oauthbearer.allowed.urls``
(comma-separated; empty, the default, allows none), is read from the broker config key of that
name, else from a ``-D`` flag of it in ``KAFKA_OPTS``; the JWKS URL must be listed verbatim.

Threads: a server is used by one connection's task; the JWKS cache is shared and locked, its
HTTP refreshes run on a daemon thread of their own.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import shlex
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jwt

from strata.security.sasl import (
    KafkaPrincipal, SaslAuthenticationFailed, SaslConfigError, jaas_config)

__all__ = ["ALLOWED_URLS", "InvalidToken", "JwksKeys", "JwksValidator", "OAuthBearerServer",
           "Token", "UnsecuredValidator", "mechanism_prop", "parse_initial_response",
           "server_factory"]

log = logging.getLogger(__name__)

MECHANISM = "OAUTHBEARER"
ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
SECURED_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                    "org.apache.kafka.common.security.oauthbearer.secured."
                    "OAuthBearerValidatorCallbackHandler")
UNSECURED_HANDLER = ("org.apache.kafka.common.security.oauthbearer.internals.unsecured."
                     "OAuthBearerUnsecuredValidatorCallbackHandler")
GENERIC_FAILURE = ("Authentication failed during authentication due to invalid credentials with "
                   "SASL mechanism OAUTHBEARER")
# asymmetric JWS algorithms (jose4j's DISALLOW_NONE also admits HMAC with an "oct" key: not here)
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "EdDSA")
_KTY = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}

_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_KEY, _VALUE = r"[A-Za-z]+", r"[\x21-\x7e \t\r\n]+"
_INITIAL = re.compile(rf"n,(?:a=({_SASLNAME}))?,\x01((?:{_KEY}={_VALUE}\x01)*)\x01")
_AUTH = re.compile(r"(\w+) +([-_~+/.a-zA-Z0-9]+=*)")


class InvalidToken(Exception):
    """The token does not validate; ``scope`` names the required scope it lacks, if that."""

    def __init__(self, reason: str, scope: str | None = None):
        super().__init__(reason)
        self.scope = scope


@dataclass(frozen=True)
class Token:
    principal: str
    expires_ms: int
    scopes: frozenset[str]


def mechanism_prop(props: Mapping[str, str], listener: str, key: str,
                   default: str | None = None, mechanism: str = MECHANISM) -> str | None:
    """``listener.name.<l>.<mechanism>.<key>``, else ``listener.name.<l>.<key>``, else
    ``<key>``, else ``default`` (Kafka's listener and mechanism prefixes)."""
    prefix = f"listener.name.{listener.lower()}."
    for name in (f"{prefix}{mechanism.lower()}.{key}", f"{prefix}{key}", key):
        if props.get(name) is not None:
            return props[name]
    return default


def parse_initial_response(message: bytes) -> tuple[str, str]:
    """The token and authorization id of a client's first message (SaslAuthenticationFailed,
    with Kafka's generic message, when it is not one)."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationFailed(GENERIC_FAILURE) from None
    m = _INITIAL.fullmatch(text)
    if m is None:
        raise SaslAuthenticationFailed(GENERIC_FAILURE)
    pairs = dict(p.split("=", 1) for p in m.group(2).split("\x01") if p)
    auth = _AUTH.fullmatch(pairs.get("auth", ""))
    if auth is None or auth.group(1).lower() != "bearer":
        raise SaslAuthenticationFailed(GENERIC_FAILURE)
    return auth.group(2), m.group(1) or ""


def _scopes(raw: Any) -> frozenset[str]:
    if isinstance(raw, str):
        return frozenset(s for s in raw.split(" ") if s)
    if isinstance(raw, list):
        if not all(isinstance(s, str) and s.strip() for s in raw):
            raise InvalidToken("the scope claim has an empty or non-string element")
        return frozenset(s.strip() for s in raw)
    return frozenset()


def _b64json(part: str) -> dict:
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed Base64 URL encoded value or JSON") from None
    if not isinstance(value, dict):
        raise InvalidToken("malformed JSON")
    return value


class UnsecuredValidator:
    """Kafka's ``OAuthBearerUnsecuredValidatorCallbackHandler``."""

    def __init__(self, options: Mapping[str, str], clock: Callable[[], float] = time.time):
        self.principal_claim = (options.get("unsecuredValidatorPrincipalClaimName") or "").strip() or "sub"
        self.scope_claim = (options.get("unsecuredValidatorScopeClaimName") or "").strip() or "scope"
        self.required_scope = (options.get("unsecuredValidatorRequiredScope") or "").split()
        skew = (options.get("unsecuredValidatorAllowableClockSkewMs") or "").strip() or "0"
        try:
            self.skew_ms = int(skew)
        except ValueError:
            raise SaslConfigError(f"unsecuredValidatorAllowableClockSkewMs: {skew!r}") from None
        if self.skew_ms < 0:
            raise SaslConfigError(f"Allowable clock skew millis must not be negative: {skew}")
        self._clock = clock

    def validate(self, token: str) -> Token:
        parts = token.split(".")
        if len(parts) != 3:
            raise InvalidToken("Unsecured JWS compact serializations must have 3 dot-separated "
                               "Base64URL-encoded values")
        header, claims = _b64json(parts[0]), _b64json(parts[1])
        if header.get("alg") != "none":
            raise InvalidToken("Unsecured JWS must have 'none' for an algorithm")
        if parts[2]:
            raise InvalidToken("Unsecured JWS must not contain a digital signature")
        now_ms = self._clock() * 1000
        subject = claims.get(self.principal_claim)
        if not isinstance(subject, str) or not subject.strip():
            raise InvalidToken(f"Required claim missing: {self.principal_claim}")
        iat, exp = claims.get("iat"), claims.get("exp")
        for name, value in (("iat", iat), ("exp", exp)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InvalidToken(f"The {name} claim had the incorrect type")
        if iat is not None and 1000 * iat > now_ms + self.skew_ms:
            raise InvalidToken("The Issued At value was after the indicated time plus allowable "
                               "clock skew")
        if exp is None:
            raise InvalidToken("Required claim missing: exp")
        if now_ms - self.skew_ms >= 1000 * exp:
            raise InvalidToken("The indicated time minus allowable clock skew was on or after the "
                               "Expiration Time value")
        if iat is not None and exp <= iat:
            raise InvalidToken("The Expiration Time was not after the Issued At time")
        scopes = _scopes(claims.get(self.scope_claim))
        for needed in self.required_scope:
            if needed not in scopes:
                raise InvalidToken(f"The provided scope ({sorted(scopes)}) was missing a required "
                                   f"scope ({needed})", scope=str(self.required_scope))
        return Token(subject, int(1000 * exp), scopes)


def allowed_urls(props: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> set[str]:
    raw = props.get(ALLOWED_URLS)
    if raw is None:
        for arg in shlex.split(environ.get("KAFKA_OPTS", "")):
            if arg.startswith(f"-D{ALLOWED_URLS}="):
                raw = arg.split("=", 1)[1]
    return {u.strip() for u in (raw or "").split(",")} - {""}


class JwksKeys:
    """The JWKS of a URL: ``keys(kid)`` answers the JWKs, reloading a ``file:`` JWKS when its
    file changes and asking the refresher of an ``http(s):`` one for a key id it lacks."""

    def __init__(self, url: str, refresh_ms: int = 3_600_000, backoff_ms: int = 100,
                 backoff_max_ms: int = 10_000, fetch: Callable[[str], bytes] | None = None,
                 tls: ssl.SSLContext | None = None):
        self.url = url
        self._tls = tls
        parsed = urllib.parse.urlparse(url)
        self._file = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else None
        self._refresh_s, self._backoff_s = refresh_ms / 1000, backoff_ms / 1000
        self._backoff_max_s = backoff_max_ms / 1000
        self._fetch = fetch or self._http_get
        self._lock = threading.Lock()
        self._keys: list[dict] = []
        self._mtime: int | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._last_missing = 0.0
        if self._file is not None:
            self._load_file()
        else:
            self._refresh_with_retries(initial=True)
            threading.Thread(target=self._refresher, name="jwks-refresh", daemon=True).start()

    @staticmethod
    def _parse(raw: bytes) -> list[dict]:
        keys = json.loads(raw).get("keys")
        if not isinstance(keys, list):
            raise ValueError("a JWKS is an object with a list of keys")
        return [k for k in keys if isinstance(k, dict) and k.get("use", "sig") == "sig"]

    def _load_file(self) -> None:
        try:
            mtime = os.stat(self._file).st_mtime_ns
            if mtime != self._mtime:
                with open(self._file, "rb") as f:
                    keys = self._parse(f.read())
                with self._lock:
                    self._keys, self._mtime = keys, mtime
        except (OSError, ValueError) as exc:
            if self._mtime is None:
                raise SaslConfigError(f"sasl.oauthbearer.jwks.endpoint.url {self.url}: {exc}") from exc
            log.warning("keeping the JWKS of %s: re-reading it failed: %s", self.url, exc)

    def _http_get(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=10, context=self._tls) as response:
            return response.read()

    def _refresh_with_retries(self, initial: bool = False) -> bool:
        delay = self._backoff_s
        deadline = time.monotonic() + self._backoff_max_s   # Kafka's Retry: waits up to the max
        while True:
            try:
                keys = self._parse(self._fetch(self.url))
                with self._lock:
                    self._keys = keys
                return True
            except Exception as exc:  # noqa: BLE001 - any failure of the fetch is retried
                if time.monotonic() + delay > deadline or self._stopped.is_set():
                    if initial:
                        raise SaslConfigError(f"could not fetch the JWKS of {self.url}: {exc}") from exc
                    log.warning("JWKS refresh from %s failed: %s", self.url, exc)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, self._backoff_max_s)

    def _refresher(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._refresh_s)
            self._wake.clear()
            if not self._stopped.is_set():
                self._refresh_with_retries()

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()

    def keys(self, kid: str | None) -> list[dict]:
        if self._file is not None:
            self._load_file()
        with self._lock:
            keys = self._keys
        found = [k for k in keys if kid is None or k.get("kid") == kid]
        now = time.monotonic()
        if not found and self._file is None and now - self._last_missing > 10:
            self._last_missing = now   # a key id not seen yet: refresh soon, at most every 10 s
            self._wake.set()
        return found


class JwksValidator:
    """Kafka's ``BrokerJwtValidator`` over PyJWT."""

    def __init__(self, keys: JwksKeys, audience: list[str] | None = None,
                 issuer: str | None = None, clock_skew_s: int = 30, sub_claim: str = "sub",
                 scope_claim: str = "scope"):
        self._keys, self.audience, self.issuer = keys, audience or None, issuer or None
        self.skew_s, self.sub_claim, self.scope_claim = clock_skew_s, sub_claim, scope_claim

    def _key(self, header: dict) -> jwt.PyJWK:
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise InvalidToken(f"algorithm {alg!r} is not allowed")
        kid = header.get("kid")
        candidates = [k for k in self._keys.keys(kid if isinstance(kid, str) else None)
                      if k.get("kty") == _KTY[alg[:2]] and k.get("alg", alg) == alg]
        if len(candidates) != 1:
            raise InvalidToken(f"no single key of the JWKS matches kid {kid!r} and alg {alg}")
        try:
            return jwt.PyJWK(candidates[0], algorithm=alg)
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"unusable key {kid!r}: {exc}") from None

    def validate(self, token: str) -> Token:
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(
                token, self._key(header), algorithms=list(ALGORITHMS), audience=self.audience,
                issuer=self.issuer, leeway=self.skew_s,
                options={"require": ["exp", "iat"], "verify_iat": True})
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"Could not validate the access token: {exc}") from None
        subject = claims.get(self.sub_claim)
        if not isinstance(subject, str) or not subject.strip():
            raise InvalidToken(f"the {self.sub_claim} claim is missing or blank")
        if not isinstance(claims["exp"], (int, float)) or isinstance(claims["exp"], bool):
            raise InvalidToken("the exp claim is not a number")
        return Token(subject.strip(), int(1000 * claims["exp"]),
                     _scopes(claims.get(self.scope_claim)))


class OAuthBearerServer:
    """Kafka's ``OAuthBearerSaslServer`` with one validator."""

    mechanism = MECHANISM

    def __init__(self, validate: Callable[[str], Token]):
        self._validate = validate
        self._error: str | None = None
        self.complete = False
        self.principal: KafkaPrincipal | None = None
        self.credential_expires_ms: int | None = None

    def evaluate(self, token: bytes) -> bytes:
        if token == b"\x01" and self._error is not None:
            raise SaslAuthenticationFailed(self._error)
        self._error = None
        value, authzid = parse_initial_response(token)
        try:
            validated = self._validate(value)
        except InvalidToken as exc:
            log.info("OAUTHBEARER token refused: %s", exc)
            status = "insufficient_scope" if exc.scope is not None else "invalid_token"
            self._error = (f'{{"status":"{status}", "scope":"{exc.scope}"}}' if exc.scope
                           else f'{{"status":"{status}"}}')
            return self._error.encode()
        if authzid and authzid != validated.principal:
            raise SaslAuthenticationFailed(
                f"Authentication failed: Client requested an authorization id ({authzid}) that is "
                f"different from the token's principal name ({validated.principal})")
        self.complete = True
        self.principal = KafkaPrincipal("User", validated.principal)
        self.credential_expires_ms = validated.expires_ms
        return b""


def _validator(props: Mapping[str, str], listener: str, options: Mapping[str, str]):
    def get(key: str, default: str | None = None) -> str | None:
        value = mechanism_prop(props, listener, key, default)
        return value.strip() if value is not None else None

    handler = get("sasl.server.callback.handler.class")
    url = get("sasl.oauthbearer.jwks.endpoint.url")
    if handler and handler not in (*SECURED_HANDLERS, UNSECURED_HANDLER):
        raise SaslConfigError(f"listener {listener}: OAUTHBEARER callback handler {handler} is "
                              f"not available in Strata")
    if handler == UNSECURED_HANDLER or (not handler and not url):
        return UnsecuredValidator(options).validate
    if not url:
        raise SaslConfigError("The OAuth configuration option sasl.oauthbearer.jwks.endpoint.url "
                              "value must be non-null")
    scheme = urllib.parse.urlparse(url).scheme.lower()
    if scheme not in ("http", "https", "file"):
        raise SaslConfigError(
            f"The OAuth configuration option sasl.oauthbearer.jwks.endpoint.url contains a URL "
            f"({url}) that contains an invalid protocol ({scheme}); only \"http\", \"https\", "
            f"and \"file\" protocol are supported")
    if url not in allowed_urls(props):
        raise SaslConfigError(f"The URL cannot be accessed due to restrictions. Update the system "
                              f"property '{ALLOWED_URLS}' to allow the URL to be accessed. ({url})")
    tls = None
    if scheme == "https" and any(k.startswith("ssl.") for k in options):
        from strata.net.tls import client_context   # Kafka's JaasOptionsUtils: the JAAS ssl.*
        tls = client_context(dict(options))
    keys = JwksKeys(url, int(get("sasl.oauthbearer.jwks.endpoint.refresh.ms", "3600000")),
                    int(get("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", "100")),
                    int(get("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", "10000")),
                    tls=tls)
    audience = [a.strip() for a in (get("sasl.oauthbearer.expected.audience") or "").split(",")
                if a.strip()]
    if not audience:
        log.warning("listener %s: OAUTHBEARER without sasl.oauthbearer.expected.audience accepts "
                    "tokens that carry no aud claim", listener)
    return JwksValidator(keys, audience, get("sasl.oauthbearer.expected.issuer"),
                         int(get("sasl.oauthbearer.clock.skew.seconds", "30")),
                         get("sasl.oauthbearer.sub.claim.name", "sub") or "sub",
                         get("sasl.oauthbearer.scope.claim.name", "scope") or "scope").validate


def server_factory(props: Mapping[str, str], listener: str,
                   credentials=None) -> Callable[[], OAuthBearerServer]:
    """The ``MECHANISMS`` entry: refused (SaslConfigError) without the listener's JAAS config
    for OAUTHBEARER, a JWKS URL outside the allow-list, or a JWKS that cannot be read."""
    jaas = jaas_config(props, listener, MECHANISM)
    if jaas is None:
        raise SaslConfigError(f"listener {listener} enables OAUTHBEARER but has no JAAS config "
                              f"(listener.name.{listener.lower()}.oauthbearer.sasl.jaas.config)")
    validate = _validator(props, listener, jaas.options)
    return lambda: OAuthBearerServer(validate)
