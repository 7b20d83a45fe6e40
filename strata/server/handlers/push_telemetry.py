"""PushTelemetry v0 (KIP-714): checked as Kafka checks a push, then dropped, since no
telemetry receiver is configured (and no subscription asks for metrics)."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.get_telemetry_subscriptions import subscription_id

COMPRESSION_TYPES = range(5)  # none, gzip, snappy, lz4, zstd
RESERVED_IDS = frozenset({0, 1})  # Kafka's Uuid.RESERVED: ZERO_UUID and ONE_UUID


def _error(body) -> ErrorCode:
    instance_id = body.client_instance_id
    if instance_id is None or instance_id.int in RESERVED_IDS:
        return ErrorCode.INVALID_REQUEST
    if body.subscription_id != subscription_id(instance_id):
        return ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    if body.compression_type not in COMPRESSION_TYPES:
        return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    return ErrorCode.NONE


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    return make(rc, error_code=kio_error_code(_error(request.body)))
