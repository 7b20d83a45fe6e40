"""InitProducerId for idempotent (non-transactional) producers: a fresh producer id, epoch 0."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    if request.body.transactional_id is not None:
        # No transaction coordinator yet: a fatal, explicit error rather than endless retries.
        return make(rc, error_code=kio_error_code(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                    producer_id=-1, producer_epoch=-1, throttle_time=datetime.timedelta(0))
    return make(rc, producer_id=ctx.producer_ids.generate(), producer_epoch=0,
                throttle_time=datetime.timedelta(0))
