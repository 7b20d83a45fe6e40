"""The ``zookeeper.*`` broker configs (Kafka's ``ZkConfigs``) and the connect string."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

ZK_CONNECT = "zookeeper.connect"
ZK_SESSION_TIMEOUT_MS = "zookeeper.session.timeout.ms"
ZK_CONNECTION_TIMEOUT_MS = "zookeeper.connection.timeout.ms"
DEFAULT_SESSION_TIMEOUT_MS = 18000


@dataclass(frozen=True)
class ZkClientConfig:
    """``host:port[,host:port][/chroot]`` plus the session and connection timeouts.

    ``connection_timeout_ms`` defaults to the session timeout, as Kafka's does.
    """

    connect: str
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    connection_timeout_ms: int | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "ZkClientConfig | None":
        """The config, or None without ``zookeeper.connect`` (the one-broker setup)."""
        connect = (props.get(ZK_CONNECT) or "").strip()
        if not connect:
            return None
        connection = props.get(ZK_CONNECTION_TIMEOUT_MS)
        return cls(connect, int(props.get(ZK_SESSION_TIMEOUT_MS, DEFAULT_SESSION_TIMEOUT_MS)),
                   int(connection) if connection not in (None, "") else None)

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
