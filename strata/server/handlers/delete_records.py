"""DeleteRecords v0-2: move each partition's log start offset (-1: to the high watermark)."""

from __future__ import annotations

from strata.cluster.metadata import is_internal_topic
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import denied_topics


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    # Kafka: DELETE on each topic, TOPIC_AUTHORIZATION_FAILED before anything else
    denied = denied_topics(ctx, AclOperation.DELETE, (t.name for t in request.body.topics))
    topics = []
    replicas = ctx.metadata.read_replicas   # issue 52's read-only topics
    for t in request.body.topics:
        partitions = []
        for p in t.partitions:
            if t.name in denied:
                code, low = ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1
            elif is_internal_topic(t.name):  # as Kafka: clients may not delete internal records
                code, low = ErrorCode.INVALID_TOPIC_EXCEPTION, -1
            elif replicas.serves(t.name):
                code, low = ErrorCode.POLICY_VIOLATION, -1   # read-only: the origin expires
            else:
                code, low = ctx.replica_manager.delete_records(
                    TopicPartition(t.name, p.partition_index), p.offset)
            partitions.append(make(rc, "topics.partitions", partition_index=p.partition_index,
                                   low_watermark=low, error_code=kio_error_code(code)))
        topics.append(make(rc, "topics", name=t.name, partitions=tuple(partitions)))
    return make(rc, topics=tuple(topics))
