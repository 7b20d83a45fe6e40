"""ListTransactions v0-2: the transactions this broker coordinates, filtered by state,
producer id, duration (v1: Ongoing for at least that long) and transactional id pattern (v2,
a regular expression); an admin client asks every broker and merges the answers."""

from __future__ import annotations

import datetime
import re

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import denied_names


def _pattern(pattern: str | None) -> re.Pattern | None | bool:
    """The compiled pattern, None for no filter, False for an invalid one."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return False


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    pattern = _pattern(getattr(body, "transactional_id_pattern", None))
    if pattern is False:
        return make(rc, error_code=kio_error_code(ErrorCode.INVALID_REGULAR_EXPRESSION),
                    unknown_state_filters=(), transaction_states=())
    coordinator = ctx.txn_coordinator
    if coordinator is None:
        return make(rc, error_code=kio_error_code(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    unknown_state_filters=(), transaction_states=())
    error, listed, unknown = coordinator.list_transactions(
        body.state_filters, body.producer_id_filters, getattr(body, "duration_filter", -1))
    if pattern is not None:
        listed = [t for t in listed if pattern.fullmatch(t.transactional_id)]
    if ctx.authorizer is not None:   # Kafka: only the ids the caller may DESCRIBE
        hidden = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                              (t.transactional_id for t in listed))
        listed = [t for t in listed if t.transactional_id not in hidden]
    return make(rc, error_code=kio_error_code(error), unknown_state_filters=tuple(unknown),
                throttle_time=datetime.timedelta(0),
                transaction_states=tuple(
                    make(rc, "transaction_states", transactional_id=t.transactional_id,
                         producer_id=t.producer_id, transaction_state=t.state) for t in listed))
