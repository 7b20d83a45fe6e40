"""ElectLeaders v0-2 on one node: every partition's preferred leader (this node) leads, so no
election is ever needed.

As Kafka's controller: a named partition gets ELECTION_NOT_NEEDED, or UNKNOWN_TOPIC_OR_PARTITION
if it does not exist; a request for all partitions (null list) lists every topic with no
partition results, since partitions that need no election are left out; an unknown election
type fails every named partition with INVALID_REQUEST.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode, InvalidRequestError
from strata.protocol.codec import kio_error_code, make, response_class

PREFERRED, UNCLEAN = 0, 1
ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."


def _elect(ctx, topic: str, partition: int) -> tuple[ErrorCode, str]:
    info = ctx.metadata.topic(topic)
    if info is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {topic}"
    if not 0 <= partition < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {topic}-{partition}"
    return ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE


def _result(ctx, rc, topic: str, partition: int):
    code, message = _elect(ctx, topic, partition)
    return make(rc, "replica_election_results.partition_result", partition_id=partition,
                error_code=kio_error_code(code), error_message=message)


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    election_type = getattr(body, "election_type", PREFERRED)
    requested = body.topic_partitions
    if election_type not in (PREFERRED, UNCLEAN):  # the error response names every partition
        raise InvalidRequestError(f"Unknown election type {election_type}")
    if requested is None:
        return make(rc, replica_election_results=tuple(
            make(rc, "replica_election_results", topic=name, partition_result=())
            for name in sorted(ctx.metadata.topics())))
    return make(rc, replica_election_results=tuple(
        make(rc, "replica_election_results", topic=t.topic,
             partition_result=tuple(_result(ctx, rc, t.topic, p) for p in t.partitions))
        for t in requested))
