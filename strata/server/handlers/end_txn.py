"""EndTxn v0-5: commit or abort the producer's transaction. Answered once PrepareCommit or
PrepareAbort is durable in ``__transaction_state``; the markers are written after.

v5 is transactions V2 (KIP-890 part 2): the coordinator bumps the producer epoch at every end
and the response carries the producer id and epoch the client goes on with."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize

FIRST_V2_VERSION = 5


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    coordinator = ctx.txn_coordinator
    pid, epoch = -1, -1
    if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif coordinator is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        result = await coordinator.end_transaction(
            body.transactional_id, body.producer_id, body.producer_epoch, body.committed,
            client_transaction_version=2 if request.api_version >= FIRST_V2_VERSION else 0)
        error = result.error
        if error == ErrorCode.NONE:
            pid, epoch = result.producer_id, result.producer_epoch
    if request.api_version < 2 and error == ErrorCode.PRODUCER_FENCED:
        error = ErrorCode.INVALID_PRODUCER_EPOCH
    return make(rc, error_code=kio_error_code(error), throttle_time=datetime.timedelta(0),
                producer_id=pid, producer_epoch=epoch)
