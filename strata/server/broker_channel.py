"""Requests from this broker to another (transaction markers, produce verification): one
blocking connection per destination, used from worker threads, one request at a time on each;
a failed request drops the connection and raises, so the next one reconnects."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from strata.net.connection import Connection

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0       # request.timeout.ms


class BrokerChannel:
    def __init__(self, client_id: str, *, connect: Callable[[str, int], Any] | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, security=None):
        """``security``: TLS and/or SASL to the other brokers' inter-broker listener."""
        self._connect = connect or (lambda host, port: Connection(
            f"{host}:{port}", timeout=request_timeout_s, client_id=client_id,
            security=security))
        self._conns: dict[tuple[str, int], Any] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def request(self, host: str, port: int, body: Any, response_cls: type) -> Any:
        """Send ``body`` to ``host:port``; the decoded response (blocking; any thread)."""
        key = (host, port)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            try:
                conn = self._conns.get(key)
                if conn is None:
                    conn = self._conns[key] = self._connect(host, port)
                return conn.request(body, response_cls)
            except Exception:
                self._drop(key)
                raise

    def _drop(self, key: tuple[str, int]) -> None:
        conn = self._conns.pop(key, None)
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        for key in list(self._conns):
            self._drop(key)
