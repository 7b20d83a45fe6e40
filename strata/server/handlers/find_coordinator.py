"""FindCoordinator v0-3: this node coordinates every group; no transaction coordinator yet."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.protocol.codec import kio_error_code, make, response_class

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


def _coordinator_for(ctx, key_type: int, key: str) -> ErrorCode:
    """NONE when this node coordinates ``key``, else the error (COORDINATOR_NOT_AVAILABLE)."""
    if key_type == KEY_TYPE_GROUP:
        gc = ctx.group_coordinator
        if (gc is None or ctx.metadata.topic(OFFSETS_TOPIC) is None
                or gc.partition_for(key) not in gc.owned_partitions):  # e.g. shutting down
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE
    if key_type == KEY_TYPE_TRANSACTION:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    # Kafka: CoordinatorType.forId throws InvalidRequestException, failing the whole request
    raise KafkaError(f"Unknown coordinator type received: {key_type}",
                     code=ErrorCode.INVALID_REQUEST)


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    error = _coordinator_for(ctx, getattr(body, "key_type", KEY_TYPE_GROUP), body.key)
    if error != ErrorCode.NONE:
        return make(rc, error_code=kio_error_code(error),
                    error_message="The coordinator is not available.", node_id=-1, host="",
                    port=-1)
    return make(rc, error_message=None, node_id=ctx.node_id, host=ctx.advertised_host,
                port=ctx.advertised_port)
