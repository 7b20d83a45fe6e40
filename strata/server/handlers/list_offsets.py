"""ListOffsets: latest, earliest, max-timestamp and by-timestamp lookups.

v8 adds −4 (earliest local offset), v9 −5 (latest tiered offset, −1 when nothing is tiered),
v10 a timeout (ignored: answers never wait), v11 −6 (earliest offset pending upload, KIP-1023);
−2 is the start of the whole log, remote tier included, and timestamp lookups search the remote
segments' time indexes before the local ones.
"""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.unified_log import FetchIsolation
from strata.protocol.codec import kio_error_code, make, response_class
from strata.replication.replica_manager import OffsetResult
from strata.security.authorizer import AclOperation
from strata.server.authorization import denied_topics

READ_COMMITTED = 1
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2

_TOPIC_DENIED = OffsetResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    isolation = FetchIsolation.TXN_COMMITTED if getattr(body, "isolation_level", 0) == READ_COMMITTED \
        else FetchIsolation.HIGH_WATERMARK
    # Kafka: a follower (replica id >= 0) or the debugging id -2 reads up to the log end, and
    # the debugging id may ask a follower
    from_consumer = body.replica_id == CONSUMER_REPLICA_ID
    leader_only = body.replica_id != DEBUGGING_REPLICA_ID
    # Kafka: DESCRIBE on each topic, else TOPIC_AUTHORIZATION_FAILED whether it exists or not
    denied = denied_topics(ctx, AclOperation.DESCRIBE, (t.name for t in body.topics))
    topics = []
    replicas = ctx.metadata.read_replicas   # issue 52's read-only topics
    for t in body.topics:
        partitions = []
        for p in t.partitions:
            if denied and t.name in denied:
                r = _TOPIC_DENIED
                partitions.append(make(rc, "topics.partitions", partition_index=p.partition_index,
                                       error_code=kio_error_code(r.error), timestamp=r.timestamp,
                                       offset=r.offset, leader_epoch=r.leader_epoch,
                                       old_style_offsets=()))
                continue
            args = (TopicPartition(t.name, p.partition_index), p.timestamp, isolation, from_consumer,
                    getattr(p, "current_leader_epoch", -1), leader_only)
            if replicas.serves(t.name):
                r = await asyncio.to_thread(replicas.list_offset, args[0], p.timestamp)
            elif p.timestamp >= 0 and ctx.replica_manager.remote_log_manager is not None:
                # may search remote time indexes: off the event loop
                r = await asyncio.to_thread(ctx.replica_manager.list_offset, *args)
            else:
                r = ctx.replica_manager.list_offset(*args)
            partitions.append(make(rc, "topics.partitions", partition_index=p.partition_index,
                                   error_code=kio_error_code(r.error), timestamp=r.timestamp,
                                   offset=r.offset, leader_epoch=r.leader_epoch,
                                   old_style_offsets=(r.offset,) if r.offset >= 0 else ()))
        topics.append(make(rc, "topics", name=t.name, partitions=tuple(partitions)))
    return make(rc, topics=tuple(topics))
