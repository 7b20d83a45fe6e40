"""Fetch: whole batches per partition, long-polling until ``min_bytes`` or ``max_wait``.

Fetch sessions (KIP-227, v7+, consumers and followers alike) as Kafka's brokers serve them
(``strata.server.fetch_session``, the cache on ``ctx.fetch_sessions``): a sessionless or full
fetch reads and answers the partitions it names; an incremental one reads every partition of
its session (with the fetch offsets and limits last sent for each) and answers only those with
something new. A broker context without a cache serves no sessions (as Kafka with
``max.incremental.fetch.session.cache.slots=0``). The first partition with data may exceed the
limits by one batch (KIP-74); then the response's ``max_bytes`` bounds the rest. Offsets in the
remote tier are read on the remote log reader pool, every such partition of the request in
parallel (Kafka up to 4.1 serves only the first).
Local records are answered as ``FileRegion``s of the segment files, which the connection sends
with ``sendfile`` (zero-copy); remote ones are bytes already in memory.
While the remote fetch quota (KIP-956) is exceeded no remote read starts: those partitions
answer no records and no error (as Kafka's ReplicaManager), and the Fetch waits for the other
partitions as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from functools import lru_cache
from typing import NamedTuple

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.unified_log import FetchIsolation
from strata.protocol import records as rec
from strata.protocol.codec import ApiKey, kio_error_code, nested_class, response_class
from strata.protocol.file_region import FileRegion
from strata.replication.replica_manager import ReadResult
from strata.security.authorizer import AclOperation
from strata.server.authorization import NOTHING_DENIED, authorize_cluster, denied_topics
from strata.server.fetch_session import (
    FIRST_VERSION_WITH_SESSIONS, SESSIONLESS, FetchContext, FetchMetadata,
    PartitionData)

READ_COMMITTED = 1
NO_THROTTLE = datetime.timedelta(0)
ZSTD_MIN_FETCH_VERSION = 10


def _has_zstd(data) -> bool:
    headers = data.headers() if isinstance(data, FileRegion) else rec.iter_headers(data)
    return any(h.compression == rec.Compression.ZSTD for h in headers)


class _RemoteRead(NamedTuple):
    index: int            # position in the results
    fetch_offset: int
    max_bytes: int
    min_one: bool


def _new_context(ctx, request) -> FetchContext:
    """Kafka's ``FetchManager.newContext`` for this request."""
    body = request.body
    cache = ctx.fetch_sessions
    metadata = SESSIONLESS
    if request.api_version >= FIRST_VERSION_WITH_SESSIONS:
        metadata = FetchMetadata(body.session_id, body.session_epoch)
    data = [(TopicPartition(t.topic, p.partition),
             PartitionData(p.fetch_offset, getattr(p, "log_start_offset", -1),
                           p.partition_max_bytes, getattr(p, "current_leader_epoch", -1),
                           getattr(p, "last_fetched_epoch", -1)))
            for t in body.topics for p in t.partitions]
    forgotten = [TopicPartition(f.topic, partition)
                 for f in getattr(body, "forgotten_topics_data", None) or ()
                 for partition in f.partitions]
    return cache.new_context(request.api_version, metadata, body.replica_id >= 0, data,
                             forgotten)


_TOPIC_DENIED = ReadResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def _denied(ctx, request, partitions) -> frozenset[str]:
    """Kafka's checks of a Fetch: a follower (replica id >= 0) needs CLUSTER_ACTION on the
    cluster, else every partition is refused; a consumer needs READ on each topic."""
    topics = (tp.topic for tp, _ in partitions)
    if request.body.replica_id >= 0:
        if authorize_cluster(ctx, AclOperation.CLUSTER_ACTION):
            return NOTHING_DENIED
        return frozenset(topics)
    return denied_topics(ctx, AclOperation.READ, topics)


def _read_all(ctx, request, isolation, partitions, first: bool = True, denied=NOTHING_DENIED):
    """Local reads for every partition; the partitions whose offsets live in the remote tier
    are returned as remote reads to run, each with the byte budget it was given. A follower's
    position is recorded at the ``first`` read only, not at reads after a wait. Partitions of
    ``denied`` topics are not read: TOPIC_AUTHORIZATION_FAILED."""
    body = request.body
    remaining = min(body.max_bytes, ctx.fetch_max_bytes)  # as Kafka: the broker's cap wins
    min_one = True
    results = []
    remote = []
    total = 0
    throttle_ms = None   # the remote fetch quota, asked at the first remote partition
    # Fetch v11+ carries the consumer's rack and may read from a follower (KIP-392)
    rack = getattr(body, "rack_id", None) if request.api_version >= FIRST_VERSION_WITH_RACK else None
    replicas = ctx.metadata.read_replicas   # issue 52's read-only topics
    for tp, p in partitions:
        if denied and tp.topic in denied:
            results.append((tp, _TOPIC_DENIED))
            continue
        budget = min(p.max_bytes, max(remaining, 0))
        epoch = p.current_leader_epoch
        if replicas.serves(tp.topic):
            r = replicas.read_state(tp, p.fetch_offset)   # read from the origin's bucket
            if r.remote is not None:
                remote.append(_RemoteRead(len(results), p.fetch_offset, budget, min_one))
                min_one = False
                remaining -= budget
            results.append((tp, r))
            continue
        if body.replica_id >= 0:  # a follower
            r = ctx.replica_manager.follower_fetch(
                tp, body.replica_id, p.fetch_offset, p.last_fetched_epoch, budget, epoch,
                as_region=True, record=first)
        else:
            r = ctx.replica_manager.read(tp, p.fetch_offset, budget, isolation, min_one,
                                         as_region=True, current_leader_epoch=epoch,
                                         client_rack=rack)
        if r.remote is not None:
            rlm = ctx.replica_manager.remote_log_manager
            if throttle_ms is None:
                throttle_ms = _fetch_throttle_ms(rlm)
            if throttle_ms > 0:
                # KIP-956: over the fetch quota no remote read starts; the partition
                # answers no records and no error, and the client fetches it again
                rlm.record_fetch_throttled(throttle_ms)
                r = r._replace(remote=None)
            else:
                remote.append(_RemoteRead(len(results), p.fetch_offset, budget, min_one))
                min_one = False
                remaining -= budget
        r = _check_zstd(request, r)
        if r.records:
            min_one = False
            remaining -= len(r.records)
            total += len(r.records)
        results.append((tp, r))
    return results, total, remote


def _fetch_throttle_ms(rlm) -> int:
    """Kafka's ``getFetchThrottleTimeMs``: > 0 while the remote fetch quota is exceeded."""
    check = getattr(rlm, "fetch_throttle_time_ms", None)
    return check() if check is not None else 0


def _close_regions(results) -> None:
    for _, r in results:
        if isinstance(r.records, FileRegion):
            r.records.close()


def _check_zstd(request, r):
    if r.records and request.api_version < ZSTD_MIN_FETCH_VERSION and _has_zstd(r.records):
        return r._replace(error=ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, records=b"")
    return r


async def _read_remote(ctx, request, isolation, results, remote) -> None:
    """Every remote partition of the Fetch, read in parallel on the remote log reader pool
    (the delayed remote fetch): whatever is not read within ``remote.fetch.max.wait.ms``
    answers empty, and a remote failure answers that partition's retriable error."""
    rlm = ctx.replica_manager.remote_log_manager
    futures = []
    for rr in remote:
        ulog = results[rr.index][1].remote
        try:
            if getattr(ulog, "read_replica", False):
                fut = asyncio.wrap_future(ulog.submit_read(
                    rr.fetch_offset, rr.max_bytes, isolation is FetchIsolation.TXN_COMMITTED,
                    rr.min_one))
            else:
                fut = asyncio.wrap_future(rlm.submit_read(ulog, rr.fetch_offset, rr.max_bytes,
                                                          isolation, rr.min_one))
        except Exception as exc:  # noqa: BLE001 - answered as this partition's error
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(exc)
        futures.append(fut)
    done, pending = await asyncio.wait(futures, timeout=ctx.remote_fetch_max_wait_ms / 1000)
    for fut in pending:
        fut.cancel()
    for rr, fut in zip(remote, futures):
        tp, r = results[rr.index]
        r = r._replace(remote=None)
        if fut in done:
            exc = fut.exception()
            if exc is None:
                got = fut.result()
                r = _check_zstd(request, r._replace(records=got.records,
                                                    aborted_transactions=got.aborted_transactions))
            else:
                r = r._replace(error=ErrorCode(getattr(exc, "code", ErrorCode.KAFKA_STORAGE_ERROR)))
        results[rr.index] = (tp, r)


FIRST_VERSION_WITH_RACK = 11


class _Shape(NamedTuple):
    """The kio classes of one Fetch response version, and the partition fields it has."""
    response: type
    topic: type
    partition: type
    aborted: type
    diverging: type | None      # KIP-320's diverging epoch, v12+
    log_start_offset: bool      # v5+
    preferred_read_replica: bool  # v11+
    sessions: bool              # top-level error code and session id, v7+


@lru_cache(maxsize=None)
def _shape(version: int) -> _Shape:
    rc = response_class(ApiKey.FETCH, version)
    partition = nested_class(rc, "responses.partitions")
    names = {f.name for f in dataclasses.fields(partition)}
    return _Shape(
        rc, nested_class(rc, "responses"), partition,
        nested_class(rc, "responses.partitions.aborted_transactions"),
        nested_class(rc, "responses.partitions.diverging_epoch") if "diverging_epoch" in names
        else None,
        "log_start_offset" in names, "preferred_read_replica" in names,
        version >= FIRST_VERSION_WITH_SESSIONS)


def _partition(shape: _Shape, tp: TopicPartition, r, committed: bool):
    """One partition's answer, built straight from its version's class (the hot path: ``make``
    takes four times as long)."""
    fields = {"partition_index": tp.partition, "error_code": kio_error_code(r.error),
              "high_watermark": r.high_watermark, "last_stable_offset": r.last_stable_offset,
              "records": r.records, "aborted_transactions": tuple(
                  shape.aborted(producer_id=a.producer_id, first_offset=a.first_offset)
                  for a in (r.aborted_transactions or ())) if committed else None}
    if shape.log_start_offset:
        fields["log_start_offset"] = r.log_start_offset
    if shape.preferred_read_replica:
        fields["preferred_read_replica"] = r.preferred_read_replica
    if shape.diverging is not None and r.diverging_epoch is not None:
        epoch, end = r.diverging_epoch
        fields["diverging_epoch"] = shape.diverging(epoch=epoch, end_offset=end)
    return shape.partition(**fields)


async def handle(ctx, request):
    body = request.body
    isolation = FetchIsolation.TXN_COMMITTED if body.isolation_level == READ_COMMITTED \
        else FetchIsolation.HIGH_WATERMARK
    if body.replica_id >= 0:
        isolation = FetchIsolation.LOG_END
    shape = _shape(request.api_version)
    context = _new_context(ctx, request)
    if context.error != ErrorCode.NONE:   # a session error (v7+): nothing read
        return shape.response(throttle_time=NO_THROTTLE, error_code=kio_error_code(context.error),
                              session_id=0, responses=())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.max_wait.total_seconds()
    partitions = [tp for tp, _ in context.partitions]
    denied = NOTHING_DENIED if ctx.authorizer is None else _denied(ctx, request, context.partitions)
    first = True
    while True:
        since = ctx.fetch_watchers.mark()
        results, total, remote = _read_all(ctx, request, isolation, context.partitions, first,
                                           denied)
        first = False
        if remote:
            await _read_remote(ctx, request, isolation, results, remote)
            break
        errors = any(r.error != ErrorCode.NONE or r.diverging_epoch is not None
                     or r.preferred_read_replica >= 0 for _, r in results)
        left = deadline - loop.time()
        if total >= body.min_bytes or errors or left <= 0 or not partitions:
            break
        _close_regions(results)   # read again after the wait: hold no descriptors while parked
        if not await ctx.fetch_watchers.wait_any(partitions, left, since) and ctx.fetch_watchers.closed:
            break
    error, session_id, answered = context.respond(results)
    if len(answered) != len(results):   # an incremental answer leaves out what did not change
        kept = {id(r) for _, r in answered}
        _close_regions([(tp, r) for tp, r in results if id(r) not in kept])
    committed = isolation is FetchIsolation.TXN_COMMITTED
    stats = ctx.topic_stats
    for tp, r in results:
        stats.fetched(tp.topic, r.error)
    consumer = body.replica_id < 0   # a follower's bytes are replication, not BytesOut
    by_topic: dict[str, list] = {}
    for tp, r in answered:
        if consumer and r.records:
            stats.sent(tp.topic, len(r.records))
        by_topic.setdefault(tp.topic, []).append(_partition(shape, tp, r, committed))
    responses = tuple(shape.topic(topic=topic, partitions=tuple(parts))
                      for topic, parts in by_topic.items())
    if not shape.sessions:
        return shape.response(throttle_time=NO_THROTTLE, responses=responses)
    return shape.response(throttle_time=NO_THROTTLE, error_code=kio_error_code(error),
                          session_id=session_id, responses=responses)
