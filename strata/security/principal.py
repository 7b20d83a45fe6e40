"""Principals of TLS clients, as Kafka's ``DefaultKafkaPrincipalBuilder`` and
``SslPrincipalMapper`` make them: ``User:`` and the client certificate's distinguished name
(RFC 2253/4514 form, most specific first: ``CN=alice,O=Example``), rewritten by the listener's
``ssl.principal.mapping.rules`` (``RULE:<regex>/<replacement>/[L|U]`` entries tried in order,
``DEFAULT`` keeping the name). Pure; any thread may call it."""

from __future__ import annotations

import re

from cryptography import x509

from strata.security.sasl import ANONYMOUS, KafkaPrincipal

__all__ = ["PrincipalMappingError", "parse_mapping_rules", "tls_principal"]

_RULE = re.compile(r'\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)')


class PrincipalMappingError(ValueError):
    """An ``ssl.principal.mapping.rules`` value Kafka would refuse."""


def parse_mapping_rules(rules: str | None) -> list[tuple[re.Pattern, str, str] | None]:
    """Each rule as (pattern, replacement, case) or None for DEFAULT."""
    text = (rules or "DEFAULT").strip()
    out: list[tuple[re.Pattern, str, str] | None] = []
    pos = 0
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None or m.end() == pos:
            raise PrincipalMappingError(f"Invalid rule: {text[pos:]}")
        if m.group(1):
            out.append(None)
        else:
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
            out.append((re.compile(m.group(2).replace("\\/", "/")), replacement, m.group(4)))
        pos = m.end()
    return out


def map_name(dn: str, rules: list[tuple[re.Pattern, str, str] | None]) -> str:
    for rule in rules:
        if rule is None:
            return dn
        pattern, replacement, case = rule
        if pattern.fullmatch(dn):   # Java's matches(), then replaceAll
            name = pattern.sub(replacement, dn)
            return name.lower() if case == "L" else name.upper() if case == "U" else name
    raise PrincipalMappingError(f"No rules apply to {dn}, rules {rules}")


def tls_principal(der: bytes | None, rules: list[tuple[re.Pattern, str, str] | None]
                  ) -> KafkaPrincipal:
    """The principal of a TLS client from its certificate (DER), ANONYMOUS without one."""
    if not der:
        return ANONYMOUS
    dn = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    return KafkaPrincipal("User", map_name(dn, rules))
