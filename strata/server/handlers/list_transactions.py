"""ListTransactions v0-2: no transaction has state on this broker (transactions are not
supported yet), so the list is empty; the filters are checked as Kafka checks them."""

from __future__ import annotations

import re

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class

# Kafka's TransactionState names, what a state filter may name.
TRANSACTION_STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                                "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence"})


def _valid_pattern(pattern: str | None) -> bool:
    if not pattern:
        return True
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    if not _valid_pattern(getattr(body, "transactional_id_pattern", None)):
        return make(rc, error_code=kio_error_code(ErrorCode.INVALID_REGULAR_EXPRESSION),
                    unknown_state_filters=(), transaction_states=())
    unknown = tuple(s for s in body.state_filters if s not in TRANSACTION_STATES)
    return make(rc, unknown_state_filters=unknown, transaction_states=())
