"""CreatePartitions v0-3: grow topics, optionally with a manual placement of the new partitions.

Like CreateTopics, the work runs on a worker thread and a request adding more than Kafka's
``MAX_RECORDS_PER_USER_OP`` partitions is refused whole before anything is written."""

from __future__ import annotations

import asyncio

from strata.cluster.metadata import check_records_per_operation
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates
from strata.security.authorizer import AclOperation
from strata.server.authorization import NOTHING_DENIED, denied_topics
from strata.server.quotas import mutation_quota


def _added(ctx, t) -> int:
    info = ctx.metadata.topic(t.name)
    return max(t.count - info.partitions, 0) if info is not None else 0


def _results(ctx, body, denied=NOTHING_DENIED) -> list[tuple[str, ErrorCode, str | None]]:
    dups = duplicates(t.name for t in body.topics)
    _, code, message = attempt(lambda: check_records_per_operation(
        sum(_added(ctx, t) for t in body.topics if t.name not in dups and t.name not in denied)))
    if code != ErrorCode.NONE:
        return [(t.name, code, message) for t in body.topics]
    out = []
    for t in body.topics:
        if t.name in dups:
            out.append((t.name, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
            continue
        if t.name in denied:   # Kafka: ALTER on the topic
            out.append((t.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED, None))
            continue
        assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
        added = _added(ctx, t)
        _, code, message = attempt(lambda: mutation_quota().apply(
            lambda: ctx.metadata.create_partitions(
                t.name, t.count, validate_only=body.validate_only, assignments=assignments),
            lambda _info: added))
        out.append((t.name, code, message))
    return out


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    results = tuple(make(rc, "results", name=name, error_code=kio_error_code(code),
                         error_message=message)
                    for name, code, message in await asyncio.to_thread(
                        _results, ctx, request.body,
                        denied_topics(ctx, AclOperation.ALTER,
                                      (t.name for t in request.body.topics))))
    return make(rc, results=results)
