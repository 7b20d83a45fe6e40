"""OffsetForLeaderEpoch v2-4: the end offset of a leader epoch (consumers' truncation check)."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.common.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.replication.replica_manager import LEADER_EPOCH


def _end_offset(ctx, tp: TopicPartition, current_epoch: int, epoch: int):
    ulog = ctx.replica_manager.get_log(tp)
    if ulog is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if current_epoch != UNDEFINED_EPOCH and current_epoch != LEADER_EPOCH:
        code = ErrorCode.FENCED_LEADER_EPOCH if current_epoch < LEADER_EPOCH \
            else ErrorCode.UNKNOWN_LEADER_EPOCH
        return code, UNDEFINED_EPOCH, UNDEFINED_OFFSET
    found = ulog.leader_epoch_cache.end_offset_for(epoch, ulog.log_end_offset)
    return ErrorCode.NONE, found.leader_epoch, found.offset


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    topics = []
    for t in request.body.topics:
        partitions = []
        for p in t.partitions:
            code, epoch, offset = _end_offset(ctx, TopicPartition(t.topic, p.partition),
                                              p.current_leader_epoch, p.leader_epoch)
            partitions.append(make(rc, "topics.partitions", error_code=kio_error_code(code),
                                   partition=p.partition, leader_epoch=epoch, end_offset=offset))
        topics.append(make(rc, "topics", topic=t.topic, partitions=tuple(partitions)))
    return make(rc, topics=tuple(topics))
