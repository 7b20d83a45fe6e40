"""The ``zookeeper.*`` broker configs (Kafka's ``ZkConfigs``) and the connect string."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

ZK_CONNECT = "zookeeper.connect"
ZK_SESSION_TIMEOUT_MS = "zookeeper.session.timeout.ms"
ZK_CONNECTION_TIMEOUT_MS = "zookeeper.connection.timeout.ms"
ZK_SET_ACL = "zookeeper.set.acl"
# JVM system properties of Kafka's ZooKeeper client: read from the broker config, else from a
# -D flag in KAFKA_OPTS (a Kafka broker's only way to set them).
JAAS_LOGIN_CONFIG = "java.security.auth.login.config"
ZK_SASL_CLIENT = "zookeeper.sasl.client"
ZK_SASL_CLIENT_CONFIG = "zookeeper.sasl.clientconfig"
ZK_SSL_CLIENT_ENABLE = "zookeeper.ssl.client.enable"
ZK_SSL_PREFIX = "zookeeper.ssl."
DEFAULT_SESSION_TIMEOUT_MS = 18000
DIGEST_LOGIN_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"


class ZkConfigError(ValueError):
    """A ``zookeeper.*`` setting (or the JAAS file it names) that cannot be used."""


@dataclass(frozen=True)
class ZkSaslCredentials:
    """DIGEST-MD5 credentials from the JAAS file's ``Client`` section."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"ZkSaslCredentials(username={self.username!r}, password=[hidden])"


@dataclass(frozen=True)
class ZkTlsConfig:
    """``zookeeper.ssl.*`` as Kafka's ZooKeeper client reads them (KIP-515)."""

    keystore_location: str | None = None
    keystore_password: str | None = None
    keystore_type: str | None = None
    truststore_location: str | None = None
    truststore_password: str | None = None
    truststore_type: str | None = None
    endpoint_identification: bool = True

    def __repr__(self) -> str:
        return (f"ZkTlsConfig(keystore={self.keystore_location!r}, "
                f"truststore={self.truststore_location!r}, "
                f"endpoint_identification={self.endpoint_identification})")


@dataclass(frozen=True)
class ZkClientConfig:
    """``host:port[,host:port][/chroot]`` plus the session and connection timeouts, the
    SASL credentials and TLS settings, and whether znodes get Kafka's secure ACLs.

    ``connection_timeout_ms`` defaults to the session timeout, as Kafka's does.
    """

    connect: str
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    connection_timeout_ms: int | None = None
    sasl: ZkSaslCredentials | None = None
    tls: ZkTlsConfig | None = None
    set_acl: bool = False

    @classmethod
    def from_properties(cls, props: Mapping[str, str],
                        environ: Mapping[str, str] = os.environ) -> "ZkClientConfig | None":
        """The config, or None without ``zookeeper.connect`` (the one-broker setup).

        Raises ZkConfigError for ``zookeeper.set.acl=true`` without SASL or TLS (Kafka's
        broker refuses to start then too) and for an unreadable JAAS file."""
        connect = (props.get(ZK_CONNECT) or "").strip()
        if not connect:
            return None
        connection = props.get(ZK_CONNECTION_TIMEOUT_MS)
        sasl = _sasl_credentials(props, environ)
        tls = _tls_config(props, environ)
        set_acl = _bool(props.get(ZK_SET_ACL), False)
        if set_acl and sasl is None and tls is None:
            raise ZkConfigError(
                f"{ZK_SET_ACL} is true, but neither SASL ({JAAS_LOGIN_CONFIG} with a "
                f"{_prop(props, environ, ZK_SASL_CLIENT_CONFIG) or 'Client'} section) nor TLS "
                f"({ZK_SSL_CLIENT_ENABLE}) is configured for ZooKeeper")
        return cls(connect, int(props.get(ZK_SESSION_TIMEOUT_MS, DEFAULT_SESSION_TIMEOUT_MS)),
                   int(connection) if connection not in (None, "") else None,
                   sasl, tls, set_acl)

    @property
    def effective_connection_timeout_ms(self) -> int:
        return self.session_timeout_ms if self.connection_timeout_ms is None \
            else self.connection_timeout_ms

    @property
    def hosts(self) -> str:
        """The server list without the chroot."""
        index = self.connect.find("/")
        return self.connect if index < 0 else self.connect[:index]

    @property
    def chroot(self) -> str | None:
        """``/a/b`` from ``h:p/a/b/``; None without one (or for ``/`` alone)."""
        index = self.connect.find("/")
        if index < 0:
            return None
        chroot = self.connect[index:].rstrip("/")
        return chroot or None


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() == "true"


def _prop(props: Mapping[str, str], environ: Mapping[str, str], name: str) -> str | None:
    if props.get(name) not in (None, ""):
        return props[name]
    found = None
    for arg in shlex.split(environ.get("KAFKA_OPTS", "")):
        if arg.startswith(f"-D{name}="):
            found = arg.split("=", 1)[1]
    return found


_SECTION = re.compile(r'([\w.$-]+)\s*\{(.*?)\}\s*;', re.S)


def jaas_sections(text: str) -> dict[str, str]:
    """A JAAS file's sections: name -> the login module entries between its braces."""
    text = re.sub(r'/\*.*?\*/|//[^\n]*', "", text, flags=re.S)
    return {m.group(1): m.group(2).strip() for m in _SECTION.finditer(text)}


def _sasl_credentials(props: Mapping[str, str],
                      environ: Mapping[str, str]) -> ZkSaslCredentials | None:
    """The ``Client`` section's DigestLoginModule credentials, as Kafka's ZooKeeper client
    reads them; None when SASL is off or no JAAS file (or no such section) is given."""
    from strata.security.sasl import SaslConfigError, parse_jaas
    if not _bool(_prop(props, environ, ZK_SASL_CLIENT), True):
        return None
    location = _prop(props, environ, JAAS_LOGIN_CONFIG)
    if not location:
        return None
    section = _prop(props, environ, ZK_SASL_CLIENT_CONFIG) or "Client"
    try:
        text = Path(location).read_text()
    except OSError as e:
        raise ZkConfigError(f"cannot read the JAAS file {location}: {e}") from e
    body = jaas_sections(text).get(section)
    if body is None:
        return None  # Kafka's client then connects without SASL
    try:
        entry = parse_jaas(body.split(";", 1)[0] + ";")
    except SaslConfigError as e:
        raise ZkConfigError(f"JAAS section {section} of {location}: {e}") from e
    if entry.login_module != DIGEST_LOGIN_MODULE or "username" not in entry.options:
        raise ZkConfigError(f"JAAS section {section} of {location}: only {DIGEST_LOGIN_MODULE} "
                            f"with username and password is supported for ZooKeeper")
    return ZkSaslCredentials(entry.options["username"], entry.options.get("password", ""))


def _tls_config(props: Mapping[str, str], environ: Mapping[str, str]) -> ZkTlsConfig | None:
    if not _bool(_prop(props, environ, ZK_SSL_CLIENT_ENABLE), False):
        return None

    def ssl(name: str) -> str | None:
        return _prop(props, environ, ZK_SSL_PREFIX + name) or None
    return ZkTlsConfig(ssl("keystore.location"), ssl("keystore.password"), ssl("keystore.type"),
                       ssl("truststore.location"), ssl("truststore.password"),
                       ssl("truststore.type"),
                       _bool(ssl("endpoint.identification.enable"), True))
