"""AlterPartitionReassignments v0-1 (KIP-455): ``ClusterMetadata.alter_partition_reassignments``
decides. In a cluster only the active controller reassigns (a refusal of the whole request,
NOT_CONTROLLER elsewhere, is the response's top-level error with no partitions, as Kafka's
ZooKeeper-mode controller answers); on one node a valid target (this node) completes at once.

Per partition, as Kafka's controller answers: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION, a cancellation (null replicas) of nothing
NO_REASSIGNMENT_IN_PROGRESS, and a target naming a broker that is not alive, no broker or one
broker twice INVALID_REPLICA_ASSIGNMENT.
"""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    denied = cluster_denied(ctx, request, AclOperation.ALTER)  # Kafka: ALTER on the cluster
    if denied is not None:
        return denied
    allow_rf_change = getattr(body, "allow_replication_factor_change", True)
    items = [(TopicPartition(t.name, p.partition_index),
              None if p.replicas is None else list(p.replicas))
             for t in body.topics for p in t.partitions]
    try:
        found = await asyncio.to_thread(ctx.metadata.alter_partition_reassignments, items)
    except KafkaError as exc:
        return make(rc, error_code=kio_error_code(ErrorCode(exc.code)), error_message=str(exc),
                    allow_replication_factor_change=allow_rf_change, responses=())
    results = iter(found)
    return make(rc, error_message=None, allow_replication_factor_change=allow_rf_change,
                responses=tuple(
                    make(rc, "responses", name=t.name, partitions=tuple(
                        make(rc, "responses.partitions", partition_index=p.partition_index,
                             error_code=kio_error_code(code), error_message=message)
                        for p, (code, message) in ((p, next(results)) for p in t.partitions)))
                    for t in body.topics))
