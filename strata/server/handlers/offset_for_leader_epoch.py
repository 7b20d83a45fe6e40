"""OffsetForLeaderEpoch v2-4: the end offset of a leader epoch (consumers' truncation check)."""

from __future__ import annotations

from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    topics = []
    for t in request.body.topics:
        partitions = []
        for p in t.partitions:
            code, epoch, offset = ctx.replica_manager.end_offset_for_epoch(
                TopicPartition(t.topic, p.partition), p.current_leader_epoch, p.leader_epoch)
            partitions.append(make(rc, "topics.partitions", error_code=kio_error_code(code),
                                   partition=p.partition, leader_epoch=epoch, end_offset=offset))
        topics.append(make(rc, "topics", topic=t.topic, partitions=tuple(partitions)))
    return make(rc, topics=tuple(topics))
