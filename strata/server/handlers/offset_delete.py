"""OffsetDelete v0: delete some committed offsets of a group (``kafka-consumer-groups
--delete-offsets``, the admin client's ``deleteConsumerGroupOffsets``).

As in Kafka's ``handleOffsetDeleteRequest``, partitions of topics or partitions that do not
exist get UNKNOWN_TOPIC_OR_PARTITION and are not passed on; the coordinator answers the rest:
a group error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP for a non-consumer group with members,
INVALID_GROUP_ID, ...) replaces the whole response, and a partition of a topic the group's
members consume gets GROUP_SUBSCRIBED_TO_TOPIC. Every requested partition is answered.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, denied_topics
from strata.server.handlers.group_common import coordinator


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    # Kafka: DELETE on the group, READ on each topic
    if not authorize(ctx, AclOperation.DELETE, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    denied = denied_topics(ctx, AclOperation.READ, (t.name for t in body.topics))
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[tuple[str, int]] = []
    for t in body.topics:
        info = ctx.metadata.topic(t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if t.name in denied:
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif info is None or not 0 <= p.partition_index < info.partitions:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                wanted.append(tp)
    group_error, deleted = await coordinator(ctx).delete_offsets(body.group_id, wanted)
    if group_error != ErrorCode.NONE:
        return make(rc, error_code=kio_error_code(group_error))
    errors.update(deleted)
    topics = tuple(
        make(rc, "topics", name=t.name, partitions=tuple(
            make(rc, "topics.partitions", partition_index=p.partition_index,
                 error_code=kio_error_code(errors[(t.name, p.partition_index)]))
            for p in t.partitions))
        for t in body.topics)
    return make(rc, topics=topics)
