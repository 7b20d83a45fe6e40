"""CreateTopics v2-7: one result per topic; v5+ also returns the partitions, replication
factor and configs of each created (or, with validate_only, validated) topic.

The topics are created on a worker thread (each partition opens its log files), so the event
loop keeps serving other connections meanwhile. A request whose topics would add more than
Kafka's ``MAX_RECORDS_PER_USER_OP`` records is refused whole before anything is written."""

from __future__ import annotations

import asyncio

from strata.cluster.metadata import check_records_per_operation
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt, duplicates
from strata.server.quotas import mutation_quota

FIRST_VERSION_WITH_CONFIGS = 5


def _create(ctx, t, validate_only: bool):
    configs = {c.name: c.value for c in t.configs}
    assignments = {a.partition_index: list(a.broker_ids) for a in t.assignments}
    return mutation_quota().apply(
        lambda: ctx.metadata.create_topic(t.name, t.num_partitions, t.replication_factor, configs,
                                          validate_only=validate_only,
                                          assignments=assignments or None),
        lambda info: info.partitions)


def _records(ctx, t) -> int:
    """The controller records creating ``t`` writes: the topic, its partitions, its configs."""
    if ctx.metadata.topic(t.name) is not None:
        return 0
    partitions = len(t.assignments) if t.assignments else max(t.num_partitions, 1)
    return 1 + partitions + len(t.configs)


def _results(ctx, body) -> list[tuple]:
    """(topic, info, code, message) per requested topic, in request order."""
    dups = duplicates(t.name for t in body.topics)
    _, code, message = attempt(lambda: check_records_per_operation(
        sum(_records(ctx, t) for t in body.topics if t.name not in dups)))
    if code != ErrorCode.NONE:
        return [(t, None, code, message) for t in body.topics]
    out = []
    for t in body.topics:
        if t.name in dups:
            out.append((t, None, ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
        elif len({c.name for c in t.configs}) != len(t.configs):
            out.append((t, None, ErrorCode.INVALID_REQUEST, "Duplicate config names."))
        else:
            out.append((t, *attempt(lambda: _create(ctx, t, body.validate_only))))
    return out


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    results = []
    for t, info, code, message in await asyncio.to_thread(_results, ctx, body):
        if info is None:
            results.append(make(rc, "topics", name=t.name, error_code=kio_error_code(code),
                                error_message=message, num_partitions=-1,
                                replication_factor=-1, configs=None))
            continue
        configs = None
        if request.api_version >= FIRST_VERSION_WITH_CONFIGS:
            configs = tuple(
                make(rc, "topics.configs", name=e.name, value=e.value, read_only=e.read_only,
                     config_source=int(e.source), is_sensitive=e.is_sensitive)
                for e in ctx.metadata.config_entries(info))
        results.append(make(rc, "topics", name=t.name, topic_id=info.topic_id,
                            num_partitions=info.partitions, replication_factor=1,
                            configs=configs))
    return make(rc, topics=tuple(results))
