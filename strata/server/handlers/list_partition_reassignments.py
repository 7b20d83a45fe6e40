"""ListPartitionReassignments v0 (KIP-455): the reassignments in progress, from
``ClusterMetadata.list_partition_reassignments`` (in a cluster the active controller answers,
any other broker NOT_CONTROLLER as the top-level error; one node never has one). As Kafka, only
partitions being reassigned are listed, whether all or named ones are asked for; unknown topics
are left out."""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    denied = cluster_denied(ctx, request, AclOperation.DESCRIBE)  # Kafka: DESCRIBE on the cluster
    if denied is not None:
        return denied
    requested = request.body.topics
    wanted = None if requested is None else [
        TopicPartition(t.name, p) for t in requested for p in t.partition_indexes]
    try:
        found = await asyncio.to_thread(ctx.metadata.list_partition_reassignments, wanted)
    except KafkaError as exc:
        return make(rc, error_code=kio_error_code(ErrorCode(exc.code)), error_message=str(exc),
                    topics=())
    names = sorted({tp.topic for tp in found})
    return make(rc, error_message=None, topics=tuple(
        make(rc, "topics", name=name, partitions=tuple(
            make(rc, "topics.partitions", partition_index=tp.partition, replicas=r.replicas,
                 adding_replicas=r.adding, removing_replicas=r.removing)
            for tp, r in sorted(found.items()) if tp.topic == name))
        for name in names))
