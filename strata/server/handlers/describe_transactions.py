"""DescribeTransactions v0: no transactional id has state on this broker (transactions are not
supported yet): TRANSACTIONAL_ID_NOT_FOUND for each, INVALID_REQUEST for an empty id, as
Kafka's coordinator answers for ids it owns but does not know (other fields zero)."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    return make(rc, transaction_states=tuple(
        make(rc, "transaction_states", transactional_id=tid, topics=(),
             error_code=kio_error_code(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND if tid
                                       else ErrorCode.INVALID_REQUEST))
        for tid in request.body.transactional_ids))
