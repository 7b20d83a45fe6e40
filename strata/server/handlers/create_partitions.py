"""CreatePartitions v0-3: grow topics, optionally with a manual placement of the new partitions."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    dups = duplicates(t.name for t in body.topics)
    results = []
    for t in body.topics:
        if t.name in dups:
            code, message = ErrorCode.INVALID_REQUEST, "Duplicate topic name."
        else:
            assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
            _, code, message = attempt(lambda: ctx.metadata.create_partitions(
                t.name, t.count, validate_only=body.validate_only, assignments=assignments))
        results.append(make(rc, "results", name=t.name, error_code=kio_error_code(code),
                            error_message=message))
    return make(rc, results=tuple(results))
