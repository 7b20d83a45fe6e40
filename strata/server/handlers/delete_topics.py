"""DeleteTopics v1-6: by name, or (v6) by topic id. Each deletion runs on a worker thread (it
removes every partition's files), so the event loop keeps serving other connections."""

from __future__ import annotations

import asyncio

from strata.cluster.metadata import ZERO_UUID
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates
from strata.server.quotas import mutation_quota

FIRST_VERSION_WITH_DELETION_DISABLED_ERROR = 3


def _partitions(info) -> int:
    return info.partitions


def _requested(body) -> list[tuple[str | None, object]]:
    if getattr(body, "topics", None):
        return [(t.name, t.topic_id if t.topic_id != ZERO_UUID else None) for t in body.topics]
    return [(name, None) for name in getattr(body, "topic_names", ())]


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    requested = _requested(request.body)
    dup_names = duplicates(n for n, _ in requested if n is not None)
    dup_ids = duplicates(i for _, i in requested if i is not None)
    quota = mutation_quota()
    results = []
    for name, topic_id in requested:
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
