"""TLS contexts from Kafka's ``ssl.*`` settings, for a listener (server side) and for the
broker's own connections to other brokers (client side).

Keystores: ``ssl.keystore.type`` PEM (``ssl.keystore.location``, a file holding the private key
and the certificate chain, or inline ``ssl.keystore.key`` and
``ssl.keystore.certificate.chain``) or PKCS12; ``ssl.key.password`` decrypts an encrypted PEM
key, ``ssl.keystore.password`` a PKCS12 file. JKS is refused with how to convert it. Truststores:
``ssl.truststore.type`` PEM (a file, or inline ``ssl.truststore.certificates``) or PKCS12; none
trusts the system's CAs. ``ssl.client.auth`` none/requested/required,
``ssl.enabled.protocols`` (TLSv1.2, TLSv1.3), ``ssl.protocol`` (TLSv1.2 keeps the broker's
client side off TLS 1.3), ``ssl.cipher.suites`` (Kafka's names, or OpenSSL's; TLS 1.3 suites
cannot be restricted, see ``_protocols``), ``ssl.endpoint.identification.algorithm``
(``https``, Kafka's default, checks the peer's host name; empty turns it off) on the client side.
Every key is looked up with the listener's ``listener.name.<l>.`` prefix first.

Certificates and keys are parsed by ``cryptography`` and handed to the standard ``ssl``
module; no cryptography of our own.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from strata.common.listeners import listener_prop

log = logging.getLogger(__name__)

__all__ = ["TlsConfigError", "check_keystore_update", "cipher_suites", "client_context",
           "keystore_certificate", "reload_server_context", "server_context"]

_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
# ssl.protocol: the SSLContext's protocol; TLSv1.2 keeps the broker's client side off TLS 1.3
_CONTEXT_PROTOCOLS = {"TLS": ssl.TLSVersion.TLSv1_3, "TLSV1.2": ssl.TLSVersion.TLSv1_2,
                      "TLSV1.3": ssl.TLSVersion.TLSv1_3}

# Kafka's (Java's, IANA's) TLS 1.2 suite names, without their TLS_ prefix, to OpenSSL's
# (`openssl ciphers -stdname`); export, anonymous, PSK, 3DES and RC4 suites are left out.
_TLS12_SUITES = dict(pair.split("=") for pair in (
    "ECDHE_ECDSA_WITH_AES_256_GCM_SHA384=ECDHE-ECDSA-AES256-GCM-SHA384 "
    "ECDHE_RSA_WITH_AES_256_GCM_SHA384=ECDHE-RSA-AES256-GCM-SHA384 "
    "DHE_DSS_WITH_AES_256_GCM_SHA384=DHE-DSS-AES256-GCM-SHA384 "
    "DHE_RSA_WITH_AES_256_GCM_SHA384=DHE-RSA-AES256-GCM-SHA384 "
    "ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256=ECDHE-ECDSA-CHACHA20-POLY1305 "
    "ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256=ECDHE-RSA-CHACHA20-POLY1305 "
    "DHE_RSA_WITH_CHACHA20_POLY1305_SHA256=DHE-RSA-CHACHA20-POLY1305 "
    "ECDHE_ECDSA_WITH_AES_256_CCM_8=ECDHE-ECDSA-AES256-CCM8 "
    "ECDHE_ECDSA_WITH_AES_256_CCM=ECDHE-ECDSA-AES256-CCM "
    "DHE_RSA_WITH_AES_256_CCM_8=DHE-RSA-AES256-CCM8 DHE_RSA_WITH_AES_256_CCM=DHE-RSA-AES256-CCM "
    "ECDHE_ECDSA_WITH_AES_128_GCM_SHA256=ECDHE-ECDSA-AES128-GCM-SHA256 "
    "ECDHE_RSA_WITH_AES_128_GCM_SHA256=ECDHE-RSA-AES128-GCM-SHA256 "
    "DHE_DSS_WITH_AES_128_GCM_SHA256=DHE-DSS-AES128-GCM-SHA256 "
    "DHE_RSA_WITH_AES_128_GCM_SHA256=DHE-RSA-AES128-GCM-SHA256 "
    "ECDHE_ECDSA_WITH_AES_128_CCM_8=ECDHE-ECDSA-AES128-CCM8 "
    "ECDHE_ECDSA_WITH_AES_128_CCM=ECDHE-ECDSA-AES128-CCM "
    "DHE_RSA_WITH_AES_128_CCM_8=DHE-RSA-AES128-CCM8 DHE_RSA_WITH_AES_128_CCM=DHE-RSA-AES128-CCM "
    "ECDHE_ECDSA_WITH_AES_256_CBC_SHA384=ECDHE-ECDSA-AES256-SHA384 "
    "ECDHE_RSA_WITH_AES_256_CBC_SHA384=ECDHE-RSA-AES256-SHA384 "
    "DHE_RSA_WITH_AES_256_CBC_SHA256=DHE-RSA-AES256-SHA256 "
    "DHE_DSS_WITH_AES_256_CBC_SHA256=DHE-DSS-AES256-SHA256 "
    "ECDHE_ECDSA_WITH_AES_128_CBC_SHA256=ECDHE-ECDSA-AES128-SHA256 "
    "ECDHE_RSA_WITH_AES_128_CBC_SHA256=ECDHE-RSA-AES128-SHA256 "
    "DHE_RSA_WITH_AES_128_CBC_SHA256=DHE-RSA-AES128-SHA256 "
    "DHE_DSS_WITH_AES_128_CBC_SHA256=DHE-DSS-AES128-SHA256 "
    "ECDHE_ECDSA_WITH_AES_256_CBC_SHA=ECDHE-ECDSA-AES256-SHA "
    "ECDHE_RSA_WITH_AES_256_CBC_SHA=ECDHE-RSA-AES256-SHA "
    "DHE_RSA_WITH_AES_256_CBC_SHA=DHE-RSA-AES256-SHA "
    "DHE_DSS_WITH_AES_256_CBC_SHA=DHE-DSS-AES256-SHA "
    "ECDHE_ECDSA_WITH_AES_128_CBC_SHA=ECDHE-ECDSA-AES128-SHA "
    "ECDHE_RSA_WITH_AES_128_CBC_SHA=ECDHE-RSA-AES128-SHA "
    "DHE_RSA_WITH_AES_128_CBC_SHA=DHE-RSA-AES128-SHA "
    "DHE_DSS_WITH_AES_128_CBC_SHA=DHE-DSS-AES128-SHA "
    "RSA_WITH_AES_256_GCM_SHA384=AES256-GCM-SHA384 RSA_WITH_AES_256_CCM_8=AES256-CCM8 "
    "RSA_WITH_AES_256_CCM=AES256-CCM RSA_WITH_AES_128_GCM_SHA256=AES128-GCM-SHA256 "
    "RSA_WITH_AES_128_CCM_8=AES128-CCM8 RSA_WITH_AES_128_CCM=AES128-CCM "
    "RSA_WITH_AES_256_CBC_SHA256=AES256-SHA256 RSA_WITH_AES_128_CBC_SHA256=AES128-SHA256 "
    "RSA_WITH_AES_256_CBC_SHA=AES256-SHA RSA_WITH_AES_128_CBC_SHA=AES128-SHA "
).split())
_TLS13_SUITES = {"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
                 "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256"}


class TlsConfigError(ValueError):
    """An ``ssl.*`` setting that cannot be used."""


def _get(props: Mapping[str, str], listener: str | None, key: str,
         default: str | None = None) -> str | None:
    value = listener_prop(props, listener, key, default) if listener else props.get(key, default)
    return value.strip() if isinstance(value, str) and value.strip() else default


def _password(value: str | None) -> bytes | None:
    return value.encode() if value else None


def _store_type(props, listener, kind: str) -> str:
    location = _get(props, listener, f"ssl.{kind}.location") or ""
    explicit = _get(props, listener, f"ssl.{kind}.type")
    if explicit is None:   # Kafka's default is JKS; a file's suffix or inline PEM says better
        if location.lower().endswith((".p12", ".pfx")):
            return "PKCS12"
        return "PEM" if location.lower().endswith((".pem", ".crt")) or not location else "JKS"
    return explicit.upper()


def _refuse_jks(kind: str, location: str | None) -> TlsConfigError:
    return TlsConfigError(
        f"ssl.{kind}.type JKS is not supported ({location}): convert it to PKCS12 with "
        f"`keytool -importkeystore -srckeystore {location or '<file>.jks'} -srcstoretype JKS "
        f"-destkeystore {kind}.p12 -deststoretype PKCS12` and set ssl.{kind}.type=PKCS12")


def _store(props, listener, kind: str) -> tuple[str, str | None, tuple | None]:
    """A keystore's or truststore's (type, location, and for PKCS12 the loaded (key,
    certificate, other certificates)); JKS refused."""
    store_type = _store_type(props, listener, kind)
    location = _get(props, listener, f"ssl.{kind}.location")
    if store_type == "JKS":
        raise _refuse_jks(kind, location)
    if store_type != "PKCS12":
        return store_type, location, None
    if location is None:
        raise TlsConfigError(f"ssl.{kind}.type PKCS12 needs ssl.{kind}.location")
    return store_type, location, pkcs12.load_key_and_certificates(
        Path(location).read_bytes(), _password(_get(props, listener, f"ssl.{kind}.password")))


def _keystore_pem(props, listener) -> tuple[bytes, bytes] | None:
    """(certificate chain PEM, unencrypted private key PEM), or None without a keystore."""
    kind, location, loaded = _store(props, listener, "keystore")
    if loaded is not None:
        key, cert, extra = loaded
        if key is None or cert is None:
            raise TlsConfigError(f"{location} holds no private key and certificate")
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (cert, *extra))
        return chain, _unencrypted(key)
    if kind != "PEM":
        raise TlsConfigError(f"ssl.keystore.type {kind} is not supported (PEM, PKCS12)")
    inline_key = _get(props, listener, "ssl.keystore.key")
    inline_chain = _get(props, listener, "ssl.keystore.certificate.chain")
    if inline_key or inline_chain:
        if not (inline_key and inline_chain):
            raise TlsConfigError("ssl.keystore.key and ssl.keystore.certificate.chain go together")
        key_pem, chain = inline_key.encode(), inline_chain.encode()
    elif location is not None:
        key_pem = chain = Path(location).read_bytes()
    else:
        return None
    key = serialization.load_pem_private_key(
        _first_block(key_pem, b"PRIVATE KEY"), _password(_get(props, listener, "ssl.key.password")))
    return _certificates(chain), _unencrypted(key)


def _first_block(pem: bytes, label: bytes) -> bytes:
    """The first PEM block whose label ends with ``label`` (a key in a file of several)."""
    start = pem.find(b"-----BEGIN ")
    while start >= 0:
        line_end = pem.find(b"-----", start + 11)
        if pem[start + 11:line_end].endswith(label):
            end = pem.find(b"-----END ", line_end)
            return pem[start:pem.find(b"-----", end + 9) + 5]
        start = pem.find(b"-----BEGIN ", line_end)
    raise TlsConfigError(f"no {label.decode()} in the keystore")


def _certificates(pem: bytes) -> bytes:
    out, start = [], pem.find(b"-----BEGIN CERTIFICATE-----")
    while start >= 0:
        end = pem.find(b"-----END CERTIFICATE-----", start) + len(b"-----END CERTIFICATE-----")
        out.append(pem[start:end])
        start = pem.find(b"-----BEGIN CERTIFICATE-----", end)
    if not out:
        raise TlsConfigError("no certificate in the keystore")
    return b"\n".join(out) + b"\n"


def _unencrypted(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _truststore_pem(props, listener) -> str | None:
    _, location, loaded = _store(props, listener, "truststore")
    if loaded is not None:
        _, cert, extra = loaded
        certs = [c for c in (cert, *extra) if c is not None]
        return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)
    inline = _get(props, listener, "ssl.truststore.certificates")
    if inline:
        return inline
    return Path(location).read_text() if location else None


def _load_keystore(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """``ssl`` loads a key and chain from files only: a private temporary file, removed at once."""
    fd, path = tempfile.mkstemp(prefix="strata-keystore-", suffix=".pem")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key + b"\n" + chain)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def _protocols(context: ssl.SSLContext, props, listener, client: bool = False) -> None:
    """``ssl.enabled.protocols``, ``ssl.protocol`` (on the client side) and ``ssl.cipher.suites``.

    Python's ``ssl`` sets TLS 1.2 suites (OpenSSL's cipher list) but cannot restrict TLS 1.3's
    (no SSL_CTX_set_ciphersuites): a list naming no TLS 1.3 suite turns TLS 1.3 off, as Java
    does when no enabled suite can serve it; one naming some TLS 1.3 suites leaves OpenSSL's
    TLS 1.3 defaults all enabled (logged); one naming only TLS 1.3 suites turns TLS 1.2 off."""
    raw = _get(props, listener, "ssl.enabled.protocols", "TLSv1.2,TLSv1.3") or ""
    enabled = [p.strip() for p in raw.split(",") if p.strip()]
    versions = [_PROTOCOLS[p] for p in enabled if p in _PROTOCOLS]
    if not versions:
        raise TlsConfigError(f"ssl.enabled.protocols {enabled} names none of "
                             f"{', '.join(_PROTOCOLS)}")
    ignored = [p for p in enabled if p not in _PROTOCOLS]
    if ignored:
        log.warning("ssl.enabled.protocols: %s not supported, ignored (%s only)",
                    ", ".join(ignored), ", ".join(_PROTOCOLS))
    low, high = min(versions), max(versions)
    protocol = (_get(props, listener, "ssl.protocol", "TLSv1.3") or "TLSv1.3").upper()
    if protocol not in _CONTEXT_PROTOCOLS:
        raise TlsConfigError(f"ssl.protocol {protocol} is not supported (TLSv1.2, TLSv1.3, TLS)")
    if client:   # a TLSv1.2 context never offers TLS 1.3 (Kafka's ssl.protocol doc)
        high = min(high, _CONTEXT_PROTOCOLS[protocol])
    suites = [c.strip() for c in (_get(props, listener, "ssl.cipher.suites") or "").split(",")
              if c.strip()]
    if suites:
        tls12, tls13 = cipher_suites(suites)
        if not tls13:
            high = min(high, ssl.TLSVersion.TLSv1_2)
        elif len(tls13) < len(_default_tls13_suites()):
            log.warning("ssl.cipher.suites names TLS 1.3 suites %s: Python's ssl cannot restrict "
                        "TLS 1.3 suites, OpenSSL's defaults (%s) all stay enabled",
                        ", ".join(tls13), ", ".join(_default_tls13_suites()))
        if not tls12:
            low = max(low, ssl.TLSVersion.TLSv1_3)
        else:
            context.set_ciphers(":".join(tls12))
    if low > high:
        raise TlsConfigError(f"ssl.enabled.protocols {enabled}, ssl.protocol {protocol} and "
                             f"ssl.cipher.suites {suites} leave no protocol to use")
    context.minimum_version, context.maximum_version = low, high


def cipher_suites(names) -> tuple[list[str], list[str]]:
    """Kafka's ``ssl.cipher.suites`` entries as (OpenSSL's names of the TLS 1.2 suites, the TLS
    1.3 suites); OpenSSL's own names are taken too. An unknown name is refused, as Java's
    SSLEngine refuses it at startup."""
    tls12, tls13 = [], []
    openssl_names = set(_TLS12_SUITES.values())
    for name in names:
        if name in _TLS13_SUITES:
            tls13.append(name)
        elif name.startswith(("TLS_", "SSL_")) and name[4:] in _TLS12_SUITES:
            tls12.append(_TLS12_SUITES[name[4:]])
        elif name in openssl_names:
            tls12.append(name)
        else:
            raise TlsConfigError(f"ssl.cipher.suites: unsupported cipher suite {name}")
    return tls12, tls13


def _default_tls13_suites() -> list[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    return [c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.3"]


def server_context(props: Mapping[str, str], listener: str) -> ssl.SSLContext:
    """The listener's TLS context; its keystore is required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _protocols(context, props, listener)
    keystore = _keystore_pem(props, listener)
    if keystore is None:
        raise TlsConfigError(f"listener {listener} uses TLS but has no keystore "
                             f"(ssl.keystore.location, or ssl.keystore.key and "
                             f"ssl.keystore.certificate.chain)")
    _load_keystore(context, *keystore)
    auth = (_get(props, listener, "ssl.client.auth", "none") or "none").lower()
    if auth not in ("none", "requested", "required"):
        raise TlsConfigError(f"ssl.client.auth must be none, requested or required, not {auth}")
    if auth != "none":
        trusted = _truststore_pem(props, listener)
        if trusted:
            context.load_verify_locations(cadata=trusted)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        context.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    return context


def client_context(props: Mapping[str, str], listener: str | None = None) -> ssl.SSLContext:
    """The TLS context of this broker's connections to ``listener`` of other brokers."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _protocols(context, props, listener, client=True)
    trusted = _truststore_pem(props, listener)
    if trusted:
        context.load_verify_locations(cadata=trusted)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    keystore = _keystore_pem(props, listener)
    if keystore is not None:   # presented when the other side asks (ssl.client.auth)
        _load_keystore(context, *keystore)
    key = "ssl.endpoint.identification.algorithm"    # set empty: no host name check
    algorithm = listener_prop(props, listener, key, "https") if listener else props.get(key, "https")
    context.check_hostname = (algorithm or "").strip().lower() == "https"
    return context


# ---- keystores reloaded at runtime (Kafka's SslFactory.reconfigure) ---------------------------

def keystore_certificate(props, listener):
    """The keystore's own certificate (``cryptography``'s), or None without a keystore."""
    from cryptography import x509
    keystore = _keystore_pem(props, listener)
    if keystore is None:
        return None
    return x509.load_pem_x509_certificate(_first_block(keystore[0], b"CERTIFICATE"))


def _sans(cert) -> set:
    from cryptography import x509
    try:
        return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return set()


def _flag(props, listener, key: str) -> bool:
    return (_get(props, listener, key, "false") or "false").lower() == "true"


def check_keystore_update(old: Mapping[str, str], new: Mapping[str, str], listener: str,
                          current=None) -> None:
    """Refuse (TlsConfigError, Kafka's messages) a listener's new keystore or truststore as
    Kafka's SslFactory does: one that does not make a working context, a keystore added or
    removed, a truststore added, a certificate whose subject DN differs (unless
    ``ssl.allow.dn.changes``) or whose SANs leave out any of the old ones (unless
    ``ssl.allow.san.changes``). ``current``: the certificate served now, when the old
    settings' files may have changed since they were loaded."""
    try:
        server_context(new, listener)
        before = current if current is not None else keystore_certificate(old, listener)
        after = keystore_certificate(new, listener)
    except Exception as exc:  # noqa: BLE001 - any failure to load refuses the change
        raise TlsConfigError(f"Validation of dynamic config update of SSLFactory failed: "
                             f"{exc}") from None
    if before is None or after is None:
        raise TlsConfigError("Cannot remove the SSL keystore from an existing listener for which "
                             "a keystore was configured." if after is None else
                             "Cannot add SSL keystore to an existing listener for which no "
                             "keystore was configured.")
    if _truststore_pem(old, listener) is None and _truststore_pem(new, listener) is not None:
        raise TlsConfigError("Cannot add SSL truststore to an existing listener for which no "
                             "truststore was configured.")
    if not _flag(new, listener, "ssl.allow.dn.changes") and before.subject != after.subject:
        raise TlsConfigError(
            f"Validation of dynamic config update of SSLFactory failed: Keystore "
            f"DistinguishedName does not match:  existing={{DN={before.subject.rfc4514_string()}}}, "
            f"new={{DN={after.subject.rfc4514_string()}}}")
    if not _flag(new, listener, "ssl.allow.san.changes") and not _sans(before) <= _sans(after):
        raise TlsConfigError(
            f"Validation of dynamic config update of SSLFactory failed: Keystore "
            f"SubjectAltNames do not match:  existing={{SAN={sorted(map(str, _sans(before)))}}}, "
            f"new={{SAN={sorted(map(str, _sans(after)))}}}")


def reload_server_context(context: ssl.SSLContext, props: Mapping[str, str],
                          listener: str) -> None:
    """Load the listener's keystore (and truststore) from ``props`` into its live context:
    connections made from now on present the new certificate; established ones keep theirs
    (OpenSSL copies the certificate into each connection). Python's ``ssl`` cannot remove
    trusted CAs from a context: a new truststore's CAs are added to the old ones."""
    keystore = _keystore_pem(props, listener)
    if keystore is None:
        raise TlsConfigError(f"listener {listener} has no keystore")
    _load_keystore(context, *keystore)
    if context.verify_mode != ssl.CERT_NONE:
        trusted = _truststore_pem(props, listener)
        if trusted:
            context.load_verify_locations(cadata=trusted)
