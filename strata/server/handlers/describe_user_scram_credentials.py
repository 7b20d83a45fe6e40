"""DescribeUserScramCredentials v0: this broker has no SCRAM credentials. Asking for all users
gets an empty list; a named user RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE,
in Kafka's words."""

from __future__ import annotations

from collections import Counter

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class


def _result(rc, user: str, times: int):
    if times > 1:
        code, message = (ErrorCode.DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for "
                         f"the same user twice in a single request: {user}")
    else:
        code, message = (ErrorCode.RESOURCE_NOT_FOUND,
                         f"Attempt to describe a user credential that does not exist: {user}")
    return make(rc, "results", user=user, error_code=kio_error_code(code), error_message=message,
                credential_infos=())


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    named = Counter(u.name for u in request.body.users or ())
    return make(rc, error_message="",
                results=tuple(_result(rc, user, times) for user, times in named.items()))
