"""CreateAcls v1-3: no authorizer is configured, so every creation gets SECURITY_DISABLED (the
error response, as Kafka builds it)."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.server import authz


async def handle(ctx, request):
    raise KafkaError(authz.NO_AUTHORIZER, code=ErrorCode.SECURITY_DISABLED)
