"""What handlers ask before acting, as Kafka's ``AuthHelper`` does: is the principal of the
connection being handled allowed an operation on a resource.

With no authorizer configured (``BrokerContext.authorizer`` is None) everything is allowed,
and ``authorized_operations`` is every operation the resource type supports.
"""

from __future__ import annotations

from collections.abc import Iterable

from strata.security.authorizer import AclOperation, Action, ResourceType
from strata.security.sasl import ANONYMOUS, KafkaPrincipal
from strata.server.handlers.group_common import CURRENT_CONNECTION


def caller() -> tuple[KafkaPrincipal, str]:
    """(principal, client IP address) of the connection being handled."""
    conn = CURRENT_CONNECTION.get()
    if conn is None:
        return ANONYMOUS, ""
    peer = getattr(conn, "peer", "") or ""
    host, sep, _port = peer.rpartition(":")
    return (getattr(conn, "principal", None) or ANONYMOUS), (host if sep else peer)


def authorize(ctx, operation: AclOperation, resource_type: ResourceType, name: str, *,
              log_if_allowed: bool = True, log_if_denied: bool = True) -> bool:
    """Whether the caller may do ``operation`` on ``resource_type``:``name``."""
    authorizer = ctx.authorizer
    if authorizer is None:
        return True
    principal, host = caller()
    return authorizer.authorize(principal, host, [Action(
        operation, resource_type, name, log_if_allowed=log_if_allowed,
        log_if_denied=log_if_denied)])[0]


def filter_authorized(ctx, operation: AclOperation, resource_type: ResourceType,
                      names: Iterable[str], *, log_if_allowed: bool = True,
                      log_if_denied: bool = True) -> set[str]:
    """The names among ``names`` the caller may do ``operation`` on (one authorizer call)."""
    unique = list(dict.fromkeys(names))
    authorizer = ctx.authorizer
    if authorizer is None:
        return set(unique)
    principal, host = caller()
    decisions = authorizer.authorize(principal, host, [
        Action(operation, resource_type, n, log_if_allowed=log_if_allowed,
               log_if_denied=log_if_denied) for n in unique])
    return {n for n, ok in zip(unique, decisions) if ok}


def authorized_operations(ctx, resource_type: ResourceType, name: str,
                          supported: Iterable[AclOperation]) -> int:
    """Kafka's authorized-operations bit field (one bit per AclOperation code) of the caller
    on one resource, among the operations ``supported`` by its type; decisions not logged."""
    ops = list(supported)
    authorizer = ctx.authorizer
    if authorizer is None:
        return sum(1 << op for op in ops)
    principal, host = caller()
    decisions = authorizer.authorize(principal, host, [
        Action(op, resource_type, name, log_if_allowed=False, log_if_denied=False)
        for op in ops])
    return sum(1 << op for op, ok in zip(ops, decisions) if ok)
