"""What the group handlers share: the coordinator, the caller's address, timeouts in ms, and
the request/response sides of OffsetCommit and TxnOffsetCommit."""

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


def client_listener() -> str | None:
    """The listener the request being handled came in on (None outside a request)."""
    conn = CURRENT_CONNECTION.get()
    return None if conn is None else conn.listener


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


def offsets_to_commit(ctx, body, denied=frozenset()) -> tuple[dict, list]:
    """An (Txn)OffsetCommit request's partitions: TOPIC_AUTHORIZATION_FAILED for those of
    ``denied`` topics, UNKNOWN_TOPIC_OR_PARTITION for those that do not exist,
    ``OffsetCommitPartition``s for the others."""
    from strata.coordinator.group import OffsetCommitPartition
    from strata.coordinator.offsets_records import NO_LEADER_EPOCH
    errors: dict[tuple[str, int], ErrorCode] = {}
    valid: list = []
    for t in body.topics:
        if t.name in denied:
            errors.update({(t.name, p.partition_index): ErrorCode.TOPIC_AUTHORIZATION_FAILED
                           for p in t.partitions})
            continue
        info = ctx.metadata.topic(t.name)
        for p in t.partitions:
            if info is None or not 0 <= p.partition_index < info.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            valid.append(OffsetCommitPartition(
                t.name, p.partition_index, p.committed_offset,
                getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH), p.committed_metadata))
    return errors, valid


def commit_response(rc, body, errors: dict):
    """The (Txn)OffsetCommit response: a code per requested partition, in request order."""
    from strata.protocol.codec import kio_error_code, make
    return make(rc, topics=tuple(
        make(rc, "topics", name=t.name, partitions=tuple(
            make(rc, "topics.partitions", partition_index=p.partition_index,
                 error_code=kio_error_code(errors.get((t.name, p.partition_index),
                                                      ErrorCode.NONE)))
            for p in t.partitions))
        for t in body.topics))
