"""AlterPartitionReassignments v0-1 on one node: the only valid target is this node, which
already holds every partition, so a valid reassignment completes at once with nothing to move.

Per partition, as Kafka's controller answers: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION, a cancellation (null replicas) NO_REASSIGNMENT_IN_PROGRESS, and a
target naming another broker, no broker or one broker twice INVALID_REPLICA_ASSIGNMENT.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.admin_common import attempt


def _reassign(ctx, topic: str, partition: int, replicas) -> tuple[ErrorCode, str | None]:
    info = ctx.metadata.topic(topic)
    if info is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {topic}."
    if not 0 <= partition < info.partitions:
        return (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"Unable to find partition {topic}:{partition}.")
    if replicas is None:
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None
    _, code, message = attempt(lambda: ctx.metadata.check_reassignment(sorted(replicas)))
    return code, message


def _result(ctx, rc, topic: str, p):
    code, message = _reassign(ctx, topic, p.partition_index, p.replicas)
    return make(rc, "responses.partitions", partition_index=p.partition_index,
                error_code=kio_error_code(code), error_message=message)


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    allow_rf_change = getattr(body, "allow_replication_factor_change", True)
    return make(rc, error_message=None, allow_replication_factor_change=allow_rf_change,
                responses=tuple(
                    make(rc, "responses", name=t.name, partitions=tuple(
                        _result(ctx, rc, t.name, p) for p in t.partitions))
                    for t in body.topics))
