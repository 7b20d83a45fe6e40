"""What the group handlers share: the coordinator, the caller's address, timeouts in ms."""

from __future__ import annotations

import contextvars
import datetime

from strata.common.errors import ErrorCode, KafkaError

# The connection (``strata.server.network.ConnectionInfo``) whose request is being handled;
# the Dispatcher sets it around every handler call (each connection has its own task).
CURRENT_CONNECTION: contextvars.ContextVar = contextvars.ContextVar("strata_connection",
                                                                    default=None)

_ONE_MS = datetime.timedelta(milliseconds=1)


def coordinator(ctx):
    """The broker's group coordinator; COORDINATOR_NOT_AVAILABLE while there is none."""
    gc = ctx.group_coordinator
    if gc is None:
        raise KafkaError("the group coordinator is not running",
                         code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return gc


def client_host() -> str:
    """The caller's address as Kafka reports it (``InetAddress.toString``: "/127.0.0.1")."""
    conn = CURRENT_CONNECTION.get()
    peer = getattr(conn, "peer", None)
    if not peer or peer == "?":
        return ""
    host, sep, _port = peer.rpartition(":")
    return "/" + (host if sep else peer)


def millis(value, default: int | None = None) -> int | None:
    """A kio duration (``timedelta``) or plain number as integer milliseconds."""
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return value // _ONE_MS
    return int(value)
