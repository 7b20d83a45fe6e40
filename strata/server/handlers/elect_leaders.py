"""ElectLeaders v0-2: the controller elects (``ClusterMetadata.elect_leaders``; on one node no
election is ever needed, in a cluster a broker that is not the controller answers NOT_CONTROLLER
and the client asks the controller).

As Kafka's controller: a request for all partitions (null list) lists every topic with only the
partitions an election was tried for (those that need none are left out); an unknown election
type fails every named partition with INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode, InvalidRequestError
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied

PREFERRED, UNCLEAN = 0, 1


def _result(rc, partition: int, found: tuple[ErrorCode, str | None]):
    return make(rc, "replica_election_results.partition_result", partition_id=partition,
                error_code=kio_error_code(found[0]), error_message=found[1])


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    denied = cluster_denied(ctx, request, AclOperation.ALTER)  # Kafka: ALTER on the cluster
    if denied is not None:
        return denied
    election_type = getattr(body, "election_type", PREFERRED)
    requested = body.topic_partitions
    if election_type not in (PREFERRED, UNCLEAN):  # the error response names every partition
        raise InvalidRequestError(f"Unknown election type {election_type}")
    wanted = None if requested is None else \
        [TopicPartition(t.topic, p) for t in requested for p in t.partitions]
    found = await asyncio.to_thread(ctx.metadata.elect_leaders, wanted, election_type)
    if requested is None:
        return make(rc, replica_election_results=tuple(
            make(rc, "replica_election_results", topic=name, partition_result=tuple(
                _result(rc, tp.partition, r) for tp, r in sorted(found.items())
                if tp.topic == name and r[0] != ErrorCode.ELECTION_NOT_NEEDED))
            for name in sorted(ctx.metadata.topics())))
    return make(rc, replica_election_results=tuple(
        make(rc, "replica_election_results", topic=t.topic,
             partition_result=tuple(_result(rc, p, found[TopicPartition(t.topic, p)])
                                    for p in t.partitions))
        for t in requested))
