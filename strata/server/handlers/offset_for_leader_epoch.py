"""OffsetForLeaderEpoch v2-4: the end offset of a leader epoch (consumers' truncation check)."""

from __future__ import annotations

from strata.common.types import TopicPartition
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import NOTHING_DENIED, authorize_cluster, denied_topics


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    # Kafka: CLUSTER_ACTION on the cluster (followers), else DESCRIBE on each topic (KIP-320)
    denied = NOTHING_DENIED
    if ctx.authorizer is not None and not authorize_cluster(ctx, AclOperation.CLUSTER_ACTION,
                                                            log_if_denied=False):
        denied = denied_topics(ctx, AclOperation.DESCRIBE, (t.topic for t in request.body.topics))
    topics = []
    for t in request.body.topics:
        partitions = []
        for p in t.partitions:
            if t.topic in denied:
                code, epoch, offset = ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1
            else:
                code, epoch, offset = ctx.replica_manager.end_offset_for_epoch(
                    TopicPartition(t.topic, p.partition), p.current_leader_epoch, p.leader_epoch)
            partitions.append(make(rc, "topics.partitions", error_code=kio_error_code(code),
                                   partition=p.partition, leader_epoch=epoch, end_offset=offset))
        topics.append(make(rc, "topics", topic=t.topic, partitions=tuple(partitions)))
    return make(rc, topics=tuple(topics))
