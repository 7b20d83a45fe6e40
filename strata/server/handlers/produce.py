"""Produce: append each partition's batch; no response at all for acks=0."""

from __future__ import annotations

import asyncio
import datetime

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class


def _append_time(ms: int):
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _record_errors(rc, errors, version: int) -> tuple:
    """The refused records of a batch (Produce v8+; older versions have no such field)."""
    if version < 8:
        return ()
    return tuple(make(rc, "responses.partition_responses.record_errors", batch_index=i,
                      batch_index_error_message=m) for i, m in errors)


# A request of many partitions yields to the event loop between them once this many record
# bytes were appended, so that one large request does not hold up every other connection.
YIELD_EVERY_BYTES = 1 << 20


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    acks = body.acks
    topics = []
    since_yield = 0
    for t in body.topic_data:
        partitions = []
        for p in t.partition_data:
            if acks not in (-1, 0, 1):
                partitions.append(make(rc, "responses.partition_responses", index=p.index,
                                       error_code=kio_error_code(ErrorCode.INVALID_REQUIRED_ACKS),
                                       base_offset=-1, log_start_offset=-1))
                continue
            r = ctx.replica_manager.append(TopicPartition(t.name, p.index), p.records,
                                           produce_version=request.api_version)
            since_yield += len(p.records or b"")
            if since_yield >= YIELD_EVERY_BYTES:
                since_yield = 0
                await asyncio.sleep(0)
            partitions.append(make(
                rc, "responses.partition_responses", index=p.index,
                error_code=kio_error_code(r.error), base_offset=r.base_offset,
                log_append_time=_append_time(r.log_append_time),
                log_start_offset=r.log_start_offset,
                record_errors=_record_errors(rc, r.record_errors, request.api_version),
                error_message=r.message if r.error != ErrorCode.NONE else None))
        topics.append(make(rc, "responses", name=t.name, partition_responses=tuple(partitions)))
    if acks == 0:
        return None
    return make(rc, responses=tuple(topics), throttle_time=datetime.timedelta(0))
