"""DescribeProducers v0: the active producers of each partition, from its producer state.

As Kafka: an illegal topic name is INVALID_TOPIC_EXCEPTION, an unknown topic
UNKNOWN_TOPIC_OR_PARTITION (with the error's default message), and a partition the topic
does not have UNKNOWN_TOPIC_OR_PARTITION without a message.
"""

from __future__ import annotations

from strata.cluster.metadata import invalid_topic_reason
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import denied_topics

UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
TOPIC_AUTHORIZATION_MESSAGE = "Topic authorization failed."   # the error's default message


def _topic_error(ctx, name: str, denied) -> tuple[ErrorCode, str | None] | None:
    reason = invalid_topic_reason(name)
    if reason is not None:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic name is invalid: {reason}"
    if name in denied:   # Kafka: READ on the topic
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_MESSAGE
    if ctx.metadata.topic(name) is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE
    return None


def _partition(ctx, rc, topic: str, index: int, topic_error):
    if topic_error is not None:
        code, message = topic_error
        return make(rc, "topics.partitions", partition_index=index,
                    error_code=kio_error_code(code), error_message=message, active_producers=())
    ulog = ctx.replica_manager.get_log(TopicPartition(topic, index))
    if ulog is None:
        return make(rc, "topics.partitions", partition_index=index, error_message=None,
                    error_code=kio_error_code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                    active_producers=())
    producers = tuple(
        make(rc, "topics.partitions.active_producers", producer_id=e.producer_id,
             producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
             last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
             current_txn_start_offset=e.current_txn_first_offset)
        for e in ulog.active_producers())
    return make(rc, "topics.partitions", partition_index=index, error_message=None,
                active_producers=producers)


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    denied = denied_topics(ctx, AclOperation.READ, (t.name for t in request.body.topics))
    topics = []
    for t in request.body.topics:
        error = _topic_error(ctx, t.name, denied)
        topics.append(make(rc, "topics", name=t.name, partitions=tuple(
            _partition(ctx, rc, t.name, index, error) for index in t.partition_indexes)))
    return make(rc, topics=tuple(topics))
