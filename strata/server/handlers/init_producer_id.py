"""InitProducerId v0-5: a fresh producer id for an idempotent producer; for a transactional
one the transaction coordinator's answer (epoch bump, fencing, CONCURRENT_TRANSACTIONS while
it aborts the previous producer's transaction)."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, authorize_by_resource_type, authorize_cluster


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body

    def answer(error: ErrorCode, producer_id: int = -1, producer_epoch: int = -1):
        return make(rc, error_code=kio_error_code(error), producer_id=producer_id,
                    producer_epoch=producer_epoch, throttle_time=datetime.timedelta(0))
    if ctx.authorizer is not None:
        # Kafka: WRITE on the transactional id; an idempotent producer needs IDEMPOTENT_WRITE
        # on the cluster or WRITE on some topic
        if body.transactional_id is not None:
            if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                             body.transactional_id):
                return answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif not (authorize_cluster(ctx, AclOperation.IDEMPOTENT_WRITE, log_if_denied=False)
                  or authorize_by_resource_type(ctx, AclOperation.WRITE, ResourceType.TOPIC)):
            return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    if body.transactional_id is None:
        return answer(ErrorCode.NONE, ctx.producer_ids.generate(), 0)
    coordinator = ctx.txn_coordinator
    if coordinator is None:
        return answer(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    expected = None
    pid = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    if pid != -1 or epoch != -1:                      # v3+: a producer recovering
        expected = (int(pid), int(epoch))
    timeout = body.transaction_timeout
    timeout_ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) \
        else int(timeout)
    result = await coordinator.init_producer_id(body.transactional_id, timeout_ms, expected)
    if request.api_version < 4 and result.error == ErrorCode.PRODUCER_FENCED:
        return answer(ErrorCode.INVALID_PRODUCER_EPOCH)  # clients before KIP-588
    return answer(result.error, result.producer_id, result.producer_epoch)
