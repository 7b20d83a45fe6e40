"""DescribeTopicPartitions v0 (KIP-966): topics and their partitions a page at a time, what
Kafka 4's ``kafka-topics --describe`` uses instead of Metadata.

Paging as Kafka's broker does it: topics in name order, from the cursor's topic and partition
on; at most ``response_partition_limit`` partitions (capped to 1..2000, Kafka's
``max.request.partition.size.limit`` default) per response. When a topic's partitions do not
all fit, ``next_cursor`` names the first one left out; when the limit is used up exactly and
topics remain, it names the next topic at partition 0. Named topics that do not exist are
answered with an error (and cost nothing of the limit); when all topics are asked for, only
existing ones are listed. This node leads every partition.
"""

from __future__ import annotations

from strata.cluster.metadata import ZERO_UUID, invalid_topic_reason, is_internal_topic
from strata.common.errors import ErrorCode, InvalidRequestError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server import authz
from strata.server.authorization import TOPIC_OPERATIONS, authorized_operations, denied_topics
from strata.server.handlers.metadata import partition_entries

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000


def _operations(ctx, name: str) -> int:
    return authorized_operations(ctx, ResourceType.TOPIC, name, TOPIC_OPERATIONS)


def _missing_topic(ctx, rc, name: str):
    code = (ErrorCode.INVALID_TOPIC_EXCEPTION if invalid_topic_reason(name) is not None
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return make(rc, "topics", error_code=kio_error_code(code), name=name, topic_id=ZERO_UUID,
                is_internal=is_internal_topic(name), partitions=(),
                topic_authorized_operations=_operations(ctx, name))


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    cursor = body.cursor
    start_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = not body.topics
    requested = ctx.metadata.topics() if fetch_all else (t.name for t in body.topics)
    names = sorted({n for n in requested if n >= start_topic})
    # A bad cursor fails the request: the error response names every requested topic.
    if cursor is not None and not fetch_all and cursor.topic_name not in names:
        raise InvalidRequestError("DescribeTopicPartitionsRequest topic list should contain the "
                                  f"cursor topic: {cursor.topic_name}")
    if cursor is not None and cursor.partition_index < 0:
        raise InvalidRequestError("DescribeTopicPartitionsRequest cursor partition must be "
                                  f"valid: {cursor}")

    # As Kafka: topics the caller may not DESCRIBE are left out, and named ones answered
    # TOPIC_AUTHORIZATION_FAILED (after the others) whether they exist or not
    denied = denied_topics(ctx, AclOperation.DESCRIBE, names)
    remaining = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, body.response_partition_limit), 1)
    topics, unauthorized, next_cursor = [], [], None
    for name in names:
        if denied and name in denied:
            if not fetch_all:
                unauthorized.append(make(
                    rc, "topics", error_code=kio_error_code(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                    name=name, topic_id=ZERO_UUID, is_internal=False, partitions=(),
                    topic_authorized_operations=authz.OMITTED))
            continue
        if remaining == 0:
            next_cursor = make(rc, "next_cursor", topic_name=name, partition_index=0)
            break
        info = ctx.metadata.topic(name)
        if info is None:
            if not fetch_all:
                topics.append(_missing_topic(ctx, rc, name))
            continue
        first = cursor.partition_index if cursor is not None and name == start_topic else 0
        end = min(info.partitions, first + remaining)
        topics.append(make(rc, "topics", name=name, topic_id=info.topic_id,
                           is_internal=is_internal_topic(name),
                           partitions=partition_entries(ctx, rc, "topics.partitions", name, first, end),
                           topic_authorized_operations=_operations(ctx, name)))
        if end < info.partitions:
            next_cursor = make(rc, "next_cursor", topic_name=name, partition_index=end)
            break
        remaining -= max(end - first, 0)
    return make(rc, topics=tuple(topics + unauthorized), next_cursor=next_cursor)
