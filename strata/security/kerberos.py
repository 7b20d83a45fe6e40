"""SASL/GSSAPI (Kerberos V5, RFC 4752) on the broker's side, as Kafka's brokers do it through the
JDK's GSSAPI SaslServer, with MIT Kerberos through the ``gssapi`` binding (python-gssapi).

Settings, with Kafka's names: the listener's JAAS config for GSSAPI
(``listener.name.<l>.gssapi.sasl.jaas.config``, else the listener's or the broker's
``sasl.jaas.config``), e.g. ``com.sun.security.auth.module.Krb5LoginModule required
useKeyTab=true storeKey=true keyTab="/etc/kafka/kafka.keytab" principal="kafka/host@REALM";``:
the broker accepts tickets for ``principal`` with its key from ``keyTab`` (without ``keyTab``,
the default keytab: ``KRB5_KTNAME``, else ``/etc/krb5.keytab``). ``krb5.conf`` is found as MIT
Kerberos finds it (``KRB5_CONFIG``, the JVM's ``-Djava.security.krb5.conf``); its
``default_realm`` is the realm of the ``DEFAULT`` rule of
``sasl.kerberos.principal.to.local.rules`` (Kafka's ``KerberosShortNamer``), which turns the
client's Kerberos name into the principal of ACLs and quotas: ``alice@EXAMPLE.COM`` is
``User:alice``. ``sasl.kerberos.service.name`` is the clients' setting (the first component of
the broker's principal they ask tickets for), and the broker's own when it logs in to other
brokers with ``sasl.mechanism.inter.broker.protocol=GSSAPI`` (``GssapiClient``).

The exchange (the JDK's ``GssKrb5Server``): the client's GSS-API context tokens until the
context is established (the last answer is the server's AP-REP when the client asked for
mutual authentication); then, on the client's empty token, the server's wrapped 4-byte offer
(security layers: none only, the only one Kafka's clients use; maximum message size 0, as RFC
4752 wants without a layer); the client's wrapped answer picks "no security layer" and may
carry an authorization id, which, as Kafka's callback does, does not change the principal. A
failure answers Kafka's message, which says nothing of why; the broker logs why.

The acceptor's credentials come from the keytab named in the JAAS config through the binding's
credential store (``gss_acquire_cred_from``), not a process-wide ``KRB5_KTNAME``, so listeners
may use different keytabs. Pure computation after startup (the acceptor needs no KDC): any
thread may use a server, one exchange at a time.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["GssapiClient", "GssapiServer", "KerberosClientCredentials", "KerberosName",
           "KerberosShortNamer", "NoMatchingRule", "client_credentials", "server_factory"]

log = logging.getLogger(__name__)

NO_SECURITY_LAYER = 1
# Kafka's SaslServerAuthenticator answer to a failed exchange: no detail for the client
FAILED = "Authentication failed during authentication due to invalid credentials with SASL " \
         "mechanism GSSAPI"


class NoMatchingRule(ValueError):
    """No ``sasl.kerberos.principal.to.local.rules`` rule gives a simple name."""


@dataclass(frozen=True)
class KerberosName:
    """Kafka's ``KerberosName``: ``service[/host][@REALM]``."""

    service: str
    host: str | None = None
    realm: str | None = None

    _PARSER = re.compile(r"([^/@]*)(/([^/@]*))?@([^/@]*)")

    @classmethod
    def parse(cls, name: str) -> "KerberosName":
        m = cls._PARSER.fullmatch(name)
        if m is None:
            if "@" in name:
                raise ValueError(f"Malformed Kerberos name: {name}")
            return cls(name)
        return cls(m.group(1), m.group(3), m.group(4))

    def __str__(self) -> str:
        return self.service + (f"/{self.host}" if self.host is not None else "") + \
            (f"@{self.realm}" if self.realm is not None else "")


_RULE = re.compile(r"((DEFAULT)|((RULE:\[(\d*):([^\]]*)](\(([^)]*)\))?(s/([^/]*)/([^/]*)/(g)?)?"
                   r"/?(L|U)?)))")
_PARAMETER = re.compile(r"([^$]*)(\$(\d*))?")


def _java_replacement(to: str) -> Callable[[re.Match], str]:
    """Java's ``Matcher.replaceAll`` replacement string (``$n`` groups, ``\\`` escapes)."""
    def expand(m: re.Match) -> str:
        out, i = [], 0
        while i < len(to):
            c = to[i]
            if c == "\\" and i + 1 < len(to):
                out.append(to[i + 1])
                i += 2
            elif c == "$":
                j = i + 1
                while j < len(to) and to[j].isdigit():
                    j += 1
                if j == i + 1:
                    raise ValueError(f"Illegal group reference in {to!r}")
                out.append(m.group(int(to[i + 1:j])) or "")
                i = j
            else:
                out.append(c)
                i += 1
        return "".join(out)
    return expand


@dataclass(frozen=True)
class _Rule:
    default: bool
    components: int = 0
    format: str = ""
    match: re.Pattern | None = None
    from_pattern: re.Pattern | None = None
    to: str = ""
    repeat: bool = False
    lower: bool = False
    upper: bool = False
    text: str = "DEFAULT"

    def apply(self, params: list[str], default_realm: str) -> str | None:
        result = None
        if self.default:
            if params[0] == default_realm:
                result = params[1]
        elif len(params) - 1 == self.components:
            base = _replace_parameters(self.format, params)
            if self.match is None or self.match.fullmatch(base):
                result = base if self.from_pattern is None else self.from_pattern.sub(
                    _java_replacement(self.to), base, count=0 if self.repeat else 1)
        if result is not None and re.search(r"[/@]", result):
            raise NoMatchingRule(f"Non-simple name {result} after auth_to_local rule {self.text}")
        if result is not None and self.lower:
            return result.lower()
        if result is not None and self.upper:
            return result.upper()
        return result


def _replace_parameters(fmt: str, params: list[str]) -> str:
    out, start = [], 0
    while start < len(fmt):
        m = _PARAMETER.match(fmt, start)
        out.append(m.group(1))
        if m.group(2) is not None:
            if not m.group(3):
                raise NoMatchingRule(f"bad format in username mapping in {fmt}")
            n = int(m.group(3))
            if n >= len(params):
                raise NoMatchingRule(f"index {n} from {fmt} is outside of the valid range 0 to "
                                     f"{len(params) - 1}")
            out.append(params[n])
        if m.end() == start:
            break
        start = m.end()
    return "".join(out)


class KerberosShortNamer:
    """Kafka's ``KerberosShortNamer``: the first rule of ``sasl.kerberos.principal.to.local.rules``
    (a comma-separated list, default ``DEFAULT``) that applies gives the short name.
    ``DEFAULT`` takes the first component of a name in the default realm;
    ``RULE:[n:format](match)s/from/to/[g][/L|/U]`` applies to names of ``n`` components, with
    ``format`` built from ``$0`` (the realm) and ``$1``.. (the components)."""

    def __init__(self, rules: str | None, default_realm: str):
        self.default_realm = default_realm
        text = "DEFAULT" if rules is None else rules.strip()
        texts = re.split(r"\s*,\s*", text) if text else []   # Kafka's LIST type
        self.rules = [self._parse(t) for t in texts]

    @staticmethod
    def _parse(text: str) -> _Rule:
        m = _RULE.match(text)
        if m is None:
            raise ValueError(f"Invalid rule: {text}")
        if m.end() != len(text):
            raise ValueError(f"Invalid rule: `{text}`, unmatched substring: `{text[m.end():]}`")
        if m.group(2):
            return _Rule(True)
        return _Rule(False, int(m.group(5)), m.group(6),
                     re.compile(m.group(8)) if m.group(8) is not None else None,
                     re.compile(m.group(10)) if m.group(10) is not None else None,
                     m.group(11) or "", m.group(12) == "g", m.group(13) == "L",
                     m.group(13) == "U", text)

    def short_name(self, name: KerberosName) -> str:
        if name.host is None:
            if name.realm is None:
                return name.service
            params = [name.realm, name.service]
        else:
            params = [name.realm or "", name.service, name.host]
        for rule in self.rules:
            result = rule.apply(params, self.default_realm)
            if result is not None:
                return result
        raise NoMatchingRule(f"No rules apply to {name}, rules "
                             f"{[r.text for r in self.rules]}")


def default_realm() -> str:
    """krb5.conf's ``default_realm`` ("" without one, as Kafka's fallback)."""
    import gssapi
    try:
        name = gssapi.Name("strata", gssapi.NameType.user).canonicalize(gssapi.MechType.kerberos)
    except gssapi.exceptions.GSSError:
        return ""
    return str(name).partition("@")[2]


class GssapiServer:
    mechanism = "GSSAPI"

    def __init__(self, credentials, short_namer: KerberosShortNamer):
        import gssapi
        self._gssapi = gssapi
        self._context = gssapi.SecurityContext(creds=credentials, usage="accept")
        self._short_namer = short_namer
        self._stage = 0       # 0: context tokens, 1: the client's empty token, 2: its answer
        self._peer: str | None = None
        self.complete = False
        self.principal = None

    def _fail(self, why: str) -> SaslAuthenticationFailed:
        log.info("GSSAPI authentication failed%s: %s",
                 f" for {self._peer}" if self._peer else "", why)
        from strata.security.sasl import SaslAuthenticationFailed
        return SaslAuthenticationFailed(FAILED)

    def evaluate(self, token: bytes) -> bytes:
        GSSError = self._gssapi.exceptions.GSSError
        if self._stage == 0:
            try:
                answer = self._context.step(token)
                # a failure with an error token for the peer is raised here, not by step()
                if self._context.complete:
                    self._peer = str(self._context.initiator_name)
                    self._stage = 1
            except GSSError as exc:
                raise self._fail(f"security context: {exc}") from None
            return answer or b""
        if self._stage == 1:
            if token:
                raise self._fail("expected an empty token after the security context")
            offer = bytes([NO_SECURITY_LAYER, 0, 0, 0])
            self._stage = 2
            try:
                return self._context.wrap(offer, False).message
            except GSSError as exc:
                raise self._fail(f"wrapping the security layer offer: {exc}") from None
        if self._stage == 2:
            try:
                answer = self._context.unwrap(token).message
            except GSSError as exc:
                raise self._fail(f"the security layer answer does not unwrap: {exc}") from None
            if len(answer) < 4:
                raise self._fail("the security layer answer is shorter than 4 bytes")
            if not answer[0] & NO_SECURITY_LAYER:
                raise self._fail(f"the client selected an unsupported security layer "
                                 f"{answer[0]:#x}")
            from strata.security.sasl import KafkaPrincipal
            try:
                short = self._short_namer.short_name(KerberosName.parse(self._peer))
            except ValueError as exc:   # NoMatchingRule, a malformed name
                raise self._fail(f"sasl.kerberos.principal.to.local.rules: {exc}") from None
            self._stage = 3
            self.principal = KafkaPrincipal("User", short)
            log.info("Successfully authenticated client: authenticationID=%s; principal=%s",
                     self._peer, self.principal)
            self.complete = True
            return b""
        raise self._fail("token after the exchange completed")


def server_factory(props: Mapping[str, str], listener: str, credentials=None
                   ) -> Callable[[], GssapiServer]:
    """The ``MECHANISMS`` entry of GSSAPI: the listener's acceptor credentials (from the keytab
    of its JAAS config), acquired at startup; SaslConfigError when they cannot be."""
    from strata.common.listeners import listener_prop
    from strata.security.sasl import SaslConfigError, jaas_config
    jaas = jaas_config(props, listener, "GSSAPI")
    if jaas is None:
        raise SaslConfigError(
            f"listener {listener} enables GSSAPI but has no JAAS config (listener.name."
            f"{listener.lower()}.gssapi.sasl.jaas.config=com.sun.security.auth.module."
            f"Krb5LoginModule required useKeyTab=true storeKey=true keyTab=\"...\" "
            f"principal=\"kafka/host@REALM\";)")
    principal = jaas.options.get("principal")
    if not principal:
        raise SaslConfigError(f"listener {listener}: the GSSAPI JAAS config names no principal")
    try:
        KerberosName.parse(principal)
    except ValueError:
        raise SaslConfigError(f"Principal has name with unexpected format {principal}") from None
    try:
        import gssapi
    except ImportError as exc:
        raise SaslConfigError(f"listener {listener} enables GSSAPI, which needs the gssapi "
                              f"package (python-gssapi): {exc}") from None
    store = {"keytab": jaas.options["keyTab"]} if jaas.options.get("keyTab") else None
    try:
        acceptor = gssapi.Credentials(
            name=gssapi.Name(principal, gssapi.NameType.kerberos_principal), usage="accept",
            store=store)
        acceptor.inquire()   # fails now when the keytab lacks the principal's key
    except gssapi.exceptions.GSSError as exc:
        raise SaslConfigError(f"listener {listener}: no Kerberos key for {principal} in "
                              f"{jaas.options.get('keyTab') or 'the default keytab'}: "
                              f"{exc}") from None
    try:
        namer = KerberosShortNamer(listener_prop(props, listener,
                                                 "sasl.kerberos.principal.to.local.rules"),
                                   default_realm())
    except ValueError as exc:
        raise SaslConfigError(f"sasl.kerberos.principal.to.local.rules: {exc}") from None
    return lambda: GssapiServer(acceptor, namer)



@dataclass(frozen=True)
class KerberosClientCredentials:
    """The broker's own Kerberos identity on its inter-broker listener (Kafka's client side):
    ``principal`` with its key from ``keytab`` (None: the default credentials cache), asking
    tickets for ``<service_name>/<the other broker's host>``."""

    principal: str
    keytab: str | None
    service_name: str
    mechanism: str = "GSSAPI"


def client_credentials(props: Mapping[str, str], listener: str) -> KerberosClientCredentials:
    """From the listener's GSSAPI JAAS config (``principal``, ``keyTab``, or ``serviceName``)
    and ``sasl.kerberos.service.name``; SaslConfigError when incomplete, as Kafka refuses."""
    from strata.common.listeners import listener_prop
    from strata.security.sasl import SaslConfigError, jaas_config
    jaas = jaas_config(props, listener, "GSSAPI")
    if jaas is None or not jaas.options.get("principal"):
        raise SaslConfigError(f"the inter-broker listener {listener} has no principal in "
                              f"listener.name.{listener.lower()}.gssapi.sasl.jaas.config")
    service = jaas.options.get("serviceName") or listener_prop(props, listener,
                                                               "sasl.kerberos.service.name")
    if not service:
        raise SaslConfigError("No serviceName defined in either JAAS or Kafka config "
                              "(sasl.kerberos.service.name)")
    keytab = jaas.options.get("keyTab") if jaas.options.get("useKeyTab", "true") != "false" \
        else None
    return KerberosClientCredentials(jaas.options["principal"], keytab or None, service)


class GssapiClient:
    """The client side of the exchange (the JDK's ``GssKrb5Client``): context tokens with
    mutual authentication, an empty token once established, then the server's wrapped offer
    answered with "no security layer" and no authorization id. ``first()`` may ask the KDC
    for tickets (a blocking round trip): async callers run it off the event loop."""

    def __init__(self, credentials: KerberosClientCredentials, host: str):
        import gssapi
        self._gssapi = gssapi
        name = gssapi.Name(credentials.principal, gssapi.NameType.kerberos_principal)
        # the keytab's key gets (and renews) tickets into an in-memory cache of this process
        store = None if credentials.keytab is None else {
            "client_keytab": credentials.keytab,
            "ccache": f"MEMORY:strata-{credentials.principal}"}
        self._credentials = (credentials, name, store)
        self._target = gssapi.Name(f"{credentials.service_name}@{host}",
                                   gssapi.NameType.hostbased_service)
        self._context = None
        self._done = False

    def _failed(self, why: str):
        from strata.security.sasl import SaslAuthenticationFailed
        return SaslAuthenticationFailed(f"GSSAPI login as {self._credentials[0].principal} to "
                                        f"{self._target}: {why}")

    def first(self) -> bytes:
        gssapi = self._gssapi
        _, name, store = self._credentials
        try:
            creds = gssapi.Credentials(name=name, usage="initiate", store=store)
            self._context = gssapi.SecurityContext(
                name=self._target, creds=creds, usage="initiate",
                flags=[gssapi.RequirementFlag.mutual_authentication])
            return self._context.step()
        except gssapi.exceptions.GSSError as exc:
            raise self._failed(str(exc)) from None

    def next(self, server_token: bytes) -> bytes | None:
        GSSError = self._gssapi.exceptions.GSSError
        try:
            if not self._context.complete:
                # the AP-REP completes the context: an empty token asks for the offer
                return self._context.step(server_token) or b""
            if self._done:
                return None
            offer = self._context.unwrap(server_token).message
        except GSSError as exc:
            raise self._failed(str(exc)) from None
        if len(offer) != 4 or not offer[0] & NO_SECURITY_LAYER:
            raise self._failed(f"the server offers no usable security layer ({offer.hex()})")
        self._done = True
        try:
            return self._context.wrap(bytes([NO_SECURITY_LAYER, 0, 0, 0]), False).message
        except GSSError as exc:
            raise self._failed(str(exc)) from None
