"""DescribeAcls v1-3: no authorizer is configured, so SECURITY_DISABLED (as Kafka answers)."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.server import authz


async def handle(ctx, request):
    raise KafkaError(authz.NO_AUTHORIZER_ON_BROKER, code=ErrorCode.SECURITY_DISABLED)
