"""DeleteTopics v1-6: by name, or (v6) by topic id. Each deletion runs on a worker thread (it
removes every partition's files), so the event loop keeps serving other connections."""

from __future__ import annotations

import asyncio

from strata.cluster.metadata import ZERO_UUID
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates
from strata.security.authorizer import CLUSTER_NAME, AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, authorize, denied_topics
from strata.server.quotas import mutation_quota

FIRST_VERSION_WITH_DELETION_DISABLED_ERROR = 3


def _partitions(info) -> int:
    return info.partitions


def _requested(body) -> list[tuple[str | None, object]]:
    if getattr(body, "topics", None):
        return [(t.name, t.topic_id if t.topic_id != ZERO_UUID else None) for t in body.topics]
    return [(name, None) for name in getattr(body, "topic_names", ())]


def _authorize(ctx, requested) -> tuple[frozenset[str], frozenset[str]]:
    """Kafka's checks of a DeleteTopics (its controller's): the named or identified topics the
    caller may not DELETE, and those it may not even DESCRIBE (DELETE on the cluster allows
    both)."""
    if ctx.authorizer is None:
        return NOTHING_DENIED, NOTHING_DENIED
    names = set()
    for name, topic_id in requested:
        if name is None and topic_id is not None:
            info = ctx.metadata.topic_by_id(topic_id)
            name = info.name if info is not None else None
        if name is not None:
            names.add(name)
    if not names or authorize(ctx, AclOperation.DELETE, ResourceType.CLUSTER, CLUSTER_NAME,
                              log_if_denied=False):
        return NOTHING_DENIED, NOTHING_DENIED
    return (denied_topics(ctx, AclOperation.DELETE, names),
            denied_topics(ctx, AclOperation.DESCRIBE, names))


def _denial(ctx, name, topic_id, not_deletable, not_describable):
    """(name, topic id, code, message) of a topic the caller may not delete, else None: a
    topic named answers under its name whether it exists or not; one identified answers its
    name only if the caller may DESCRIBE it."""
    if not not_deletable:
        return None
    if topic_id is None:
        if name in not_deletable:
            return name, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
        return None
    info = ctx.metadata.topic_by_id(topic_id)
    if info is None or info.name not in not_deletable:
        return None
    shown = None if info.name in not_describable else info.name
    return shown, topic_id, ErrorCode.TOPIC_AUTHORIZATION_FAILED, None


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    requested = _requested(request.body)
    dup_names = duplicates(n for n, _ in requested if n is not None)
    dup_ids = duplicates(i for _, i in requested if i is not None)
    quota = mutation_quota()
    not_deletable, not_describable = _authorize(ctx, requested)
    results = []
    for name, topic_id in requested:
        denial = None
        if name is None or topic_id is None:
            denial = _denial(ctx, name, topic_id, not_deletable, not_describable)
        if denial is not None and name not in dup_names and topic_id not in dup_ids:
            shown, shown_id, code, message = denial
            results.append(make(rc, "responses", name=shown, topic_id=shown_id or ZERO_UUID,
                                error_code=kio_error_code(code), error_message=message))
            continue
        if name is not None and topic_id is not None:
            info, code, message = None, ErrorCode.INVALID_REQUEST, \
                "You may not specify both topic name and topic id."
        elif name in dup_names:
            info, code, message = None, ErrorCode.INVALID_REQUEST, "Duplicate topic name."
        elif topic_id in dup_ids:
            info, code, message = None, ErrorCode.INVALID_REQUEST, "Duplicate topic id."
        elif topic_id is not None:
            info, code, message = await asyncio.to_thread(attempt, lambda: quota.apply(
                lambda: ctx.metadata.delete_topic_by_id(topic_id), _partitions))
        else:
            info, code, message = await asyncio.to_thread(attempt, lambda: quota.apply(
                lambda: ctx.metadata.delete_topic(name or ""), _partitions))
        if code == ErrorCode.TOPIC_DELETION_DISABLED and \
                request.api_version < FIRST_VERSION_WITH_DELETION_DISABLED_ERROR:
            code = ErrorCode.INVALID_REQUEST
        if info is not None:
            name, topic_id = info.name, info.topic_id
            ctx.fetch_watchers.notify_topic(info.name)
        results.append(make(rc, "responses", name=name, topic_id=topic_id or ZERO_UUID,
                            error_code=kio_error_code(code), error_message=message))
    return make(rc, responses=tuple(results))
