"""What handlers ask before acting, as Kafka's ``AuthHelper`` does: is the principal of the
connection being handled allowed an operation on a resource.

With no authorizer configured (``BrokerContext.authorizer`` is None) everything is allowed,
and ``authorized_operations`` is every operation the resource type supports.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response
from strata.security.authorizer import (
    CLUSTER_NAME, AclOperation, Action, PatternType, ResourceType)
from strata.security.sasl import ANONYMOUS, KafkaPrincipal
from strata.server import authz
from strata.server.authz import (  # noqa: F401 - the handlers take them from here
    CLUSTER_OPERATIONS, GROUP_OPERATIONS, TOPIC_OPERATIONS, TRANSACTIONAL_ID_OPERATIONS, bits)
from strata.server.handlers.group_common import CURRENT_CONNECTION


# Actions are immutable and a broker asks about the same few over and over: made once each
_action = lru_cache(maxsize=16384)(Action)


def caller() -> tuple[KafkaPrincipal, str]:
    """(principal, client IP address) of the connection being handled."""
    conn = CURRENT_CONNECTION.get()
    if conn is None:
        return ANONYMOUS, ""
    peer = getattr(conn, "peer", "") or ""
    host, sep, _port = peer.rpartition(":")
    return (getattr(conn, "principal", None) or ANONYMOUS), (host if sep else peer)


def _decide(ctx, actions: list[Action]) -> list[bool]:
    """The configured authorizer's decisions about the caller."""
    principal, host = caller()
    return ctx.authorizer.authorize(principal, host, actions)


def authorize(ctx, operation: AclOperation, resource_type: ResourceType, name: str, *,
              log_if_denied: bool = True) -> bool:
    """Whether the caller may do ``operation`` on ``resource_type``:``name``."""
    if ctx.authorizer is None:
        return True
    return _decide(ctx, [_action(operation, resource_type, name, PatternType.LITERAL, True,
                                 log_if_denied)])[0]


def authorized_operations(ctx, resource_type: ResourceType, name: str,
                          supported: Iterable[AclOperation]) -> int:
    """Kafka's authorized-operations bit field (one bit per AclOperation code) of the caller
    on one resource, among the operations ``supported`` by its type; decisions not logged."""
    ops = list(supported)
    if ctx.authorizer is None:
        return bits(ops)
    decisions = _decide(ctx, [_action(op, resource_type, name, PatternType.LITERAL, False, False)
                              for op in ops])
    return bits(op for op, ok in zip(ops, decisions) if ok)


NOTHING_DENIED: frozenset[str] = frozenset()


def authorize_cluster(ctx, operation: AclOperation, *, log_if_denied: bool = True) -> bool:
    """Whether the caller may do ``operation`` on the cluster."""
    return authorize(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME,
                     log_if_denied=log_if_denied)


def cluster_denied(ctx, request, operation: AclOperation):
    """Kafka's ``authorizeClusterOperation``: None when the caller may do ``operation`` on the
    cluster, else the request's CLUSTER_AUTHORIZATION_FAILED error response."""
    if authorize_cluster(ctx, operation):
        return None
    return error_response(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def denied_names(ctx, operation: AclOperation, resource_type: ResourceType,
                 names: Iterable[str], *, log_if_denied: bool = True) -> frozenset[str]:
    """The names among ``names`` the caller may not do ``operation`` on: one authorizer call
    for the whole request, and nothing at all without an authorizer (the produce and fetch
    paths ask this for every request)."""
    if ctx.authorizer is None:
        return NOTHING_DENIED
    unique = list(dict.fromkeys(names))
    if not unique:
        return NOTHING_DENIED
    decisions = _decide(ctx, [_action(operation, resource_type, n, PatternType.LITERAL, True,
                                      log_if_denied) for n in unique])
    if all(decisions):
        return NOTHING_DENIED
    return frozenset(n for n, ok in zip(unique, decisions) if not ok)


def denied_topics(ctx, operation: AclOperation, names: Iterable[str], *,
                  log_if_denied: bool = True) -> frozenset[str]:
    """The topics among ``names`` the caller may not do ``operation`` on (Produce's WRITE,
    Fetch's READ, ListOffsets' DESCRIBE, ...): they answer TOPIC_AUTHORIZATION_FAILED before
    anything else is checked, whether they exist or not."""
    return denied_names(ctx, operation, ResourceType.TOPIC, names, log_if_denied=log_if_denied)


def authorize_by_resource_type(ctx, operation: AclOperation, resource_type: ResourceType) -> bool:
    """Kafka's ``authorizeByResourceType``: whether the caller may do ``operation`` on some
    resource of the type (the authorizer's ``authorize_by_resource_type``)."""
    authorizer = ctx.authorizer
    if authorizer is None:
        return True
    principal, host = caller()
    return bool(authorizer.authorize_by_resource_type(principal, host, operation, resource_type))


def cluster_operations(ctx, include: bool) -> int:
    """The cluster_authorized_operations of Metadata v8-10 and DescribeCluster: OMITTED when
    not asked for, 0 without DESCRIBE on the cluster, else the caller's operations."""
    if not include:
        return authz.OMITTED
    if not authorize_cluster(ctx, AclOperation.DESCRIBE):
        return 0
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS)
