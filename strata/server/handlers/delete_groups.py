"""DeleteGroups v0-2: delete Empty groups with their committed offsets.

As Kafka answers: a group with members is NON_EMPTY_GROUP, an unknown (or Dead) one
GROUP_ID_NOT_FOUND, and without a running coordinator every group is
COORDINATOR_NOT_AVAILABLE. A group named twice is answered once.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import denied_names
from strata.server.handlers.group_common import coordinator


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    names = list(dict.fromkeys(request.body.groups_names))
    # Kafka: a group the caller may not DELETE answers GROUP_AUTHORIZATION_FAILED
    denied = denied_names(ctx, AclOperation.DELETE, ResourceType.GROUP, names)
    allowed = [n for n in names if n not in denied]
    errors = await coordinator(ctx).delete_groups(allowed) if allowed or not denied else {}
    errors.update({n: ErrorCode.GROUP_AUTHORIZATION_FAILED for n in denied})
    return make(rc, results=tuple(
        make(rc, "results", group_id=name, error_code=kio_error_code(errors[name]))
        for name in names))
