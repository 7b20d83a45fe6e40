"""OffsetCommit v2-8: store a group's consumed positions in ``__consumer_offsets``.

As in Kafka, a partition of a topic that does not exist gets UNKNOWN_TOPIC_OR_PARTITION and
is not stored; when no partition is left the coordinator is not asked at all. An empty group
id is allowed (Kafka keeps it for backwards compatibility); a null one is INVALID_GROUP_ID.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.coordinator.group_coordinator import DEFAULT_RETENTION_TIME, OffsetCommitPartition
from strata.coordinator.offsets_records import NO_LEADER_EPOCH
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.group_common import coordinator, millis


def _exists(ctx, topic: str, partition: int) -> bool:
    info = ctx.metadata.topic(topic)
    return info is not None and 0 <= partition < info.partitions


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    errors: dict[tuple[str, int], ErrorCode] = {}
    valid: list[OffsetCommitPartition] = []
    for t in body.topics:
        for p in t.partitions:
            if not _exists(ctx, t.name, p.partition_index):
                errors[(t.name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            valid.append(OffsetCommitPartition(
                t.name, p.partition_index, p.committed_offset,
                getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH), p.committed_metadata))
    if valid:
        errors.update(await coordinator(ctx).commit_offsets(
            body.group_id, body.member_id, body.generation_id_or_member_epoch, valid,
            group_instance_id=getattr(body, "group_instance_id", None),
            retention_time_ms=millis(getattr(body, "retention_time", None),
                                     DEFAULT_RETENTION_TIME)))
    topics = tuple(
        make(rc, "topics", name=t.name, partitions=tuple(
            make(rc, "topics.partitions", partition_index=p.partition_index,
                 error_code=kio_error_code(errors.get((t.name, p.partition_index),
                                                      ErrorCode.NONE)))
            for p in t.partitions))
        for t in body.topics)
    return make(rc, topics=topics)
