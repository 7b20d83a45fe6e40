"""Fetch: whole batches per partition, long-polling until ``min_bytes`` or ``max_wait``.

Sessionless (session id 0): every request is a full fetch, which every client accepts. The
first partition with data may exceed the limits by one batch (KIP-74); then the response's
``max_bytes`` bounds the rest.
"""

from __future__ import annotations

import asyncio
import datetime

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.unified_log import FetchIsolation
from strata.protocol import records as rec
from strata.protocol.codec import kio_error_code, make, response_class

READ_COMMITTED = 1
ZSTD_MIN_FETCH_VERSION = 10


def _has_zstd(data: bytes) -> bool:
    return any(h.compression == rec.Compression.ZSTD for h in rec.iter_headers(data))


def _read_all(ctx, request, isolation):
    body = request.body
    remaining = body.max_bytes
    min_one = True
    results = []
    total = 0
    for t in body.topics:
        for p in t.partitions:
            tp = TopicPartition(t.topic, p.partition)
            r = ctx.replica_manager.read(tp, p.fetch_offset, min(p.partition_max_bytes, max(remaining, 0)),
                                         isolation, min_one)
            if r.records and request.api_version < ZSTD_MIN_FETCH_VERSION and _has_zstd(r.records):
                r = r._replace(error=ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, records=b"")
            if r.records:
                min_one = False
                remaining -= len(r.records)
                total += len(r.records)
            results.append((tp, r))
    return results, total


async def handle(ctx, request):
    body = request.body
    isolation = FetchIsolation.TXN_COMMITTED if body.isolation_level == READ_COMMITTED \
        else FetchIsolation.HIGH_WATERMARK
    if body.replica_id >= 0:
        isolation = FetchIsolation.LOG_END
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.max_wait.total_seconds()
    partitions = [TopicPartition(t.topic, p.partition) for t in body.topics for p in t.partitions]
    while True:
        results, total = _read_all(ctx, request, isolation)
        errors = any(r.error != ErrorCode.NONE for _, r in results)
        left = deadline - loop.time()
        if total >= body.min_bytes or errors or left <= 0 or not partitions:
            break
        if not await ctx.fetch_watchers.wait_any(partitions, left) and ctx.fetch_watchers.closed:
            break
    rc = response_class(request.api_key, request.api_version)
    by_topic: dict[str, list] = {}
    for tp, r in results:
        aborted = None
        if isolation is FetchIsolation.TXN_COMMITTED:
            aborted = tuple(make(rc, "responses.partitions.aborted_transactions",
                                 producer_id=a.producer_id, first_offset=a.first_offset)
                            for a in (r.aborted_transactions or ()))
        by_topic.setdefault(tp.topic, []).append(make(
            rc, "responses.partitions", partition_index=tp.partition,
            error_code=kio_error_code(r.error), high_watermark=r.high_watermark,
            last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
            aborted_transactions=aborted, preferred_read_replica=-1, records=r.records))
    responses = tuple(make(rc, "responses", topic=topic, partitions=tuple(parts))
                      for topic, parts in by_topic.items())
    return make(rc, throttle_time=datetime.timedelta(0), error_code=kio_error_code(ErrorCode.NONE),
                session_id=0, responses=responses)
