"""EndTxn v0-4: commit or abort the producer's transaction. Answered once PrepareCommit or
PrepareAbort is durable in ``__transaction_state``; the markers are written after."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    coordinator = getattr(ctx, "txn_coordinator", None)
    if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif coordinator is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        error = (await coordinator.end_transaction(body.transactional_id, body.producer_id,
                                                   body.producer_epoch, body.committed)).error
    if request.api_version < 2 and error == ErrorCode.PRODUCER_FENCED:
        error = ErrorCode.INVALID_PRODUCER_EPOCH
    return make(rc, error_code=kio_error_code(error), throttle_time=datetime.timedelta(0))
