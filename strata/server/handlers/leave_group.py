"""LeaveGroup v0-5: v0-2 name one member; v3+ a batch (KIP-345), answered per member."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.coordinator.group import LeaveMember
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize
from strata.server.handlers.group_common import coordinator

BATCH_VERSION = 3


async def handle(ctx, request):
    body = request.body
    version = request.api_version
    rc = response_class(request.api_key, version)
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        # Kafka's getErrorResponse: the top-level error, no members
        return make(rc, error_code=kio_error_code(ErrorCode.GROUP_AUTHORIZATION_FAILED), members=())
    if version < BATCH_VERSION:
        leaving = [LeaveMember(body.member_id)]
    else:
        leaving = [LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in body.members]
    result = coordinator(ctx).leave_group(body.group_id, leaving)
    if version < BATCH_VERSION:
        # Kafka's LeaveGroupResponse: the top-level error, else the first member error
        error = result.error
        if error == ErrorCode.NONE:
            error = next((m.error for m in result.members if m.error != ErrorCode.NONE),
                         ErrorCode.NONE)
        return make(rc, error_code=kio_error_code(error))
    members = tuple(make(rc, "members", member_id=m.member_id,
                         group_instance_id=m.group_instance_id, error_code=kio_error_code(m.error))
                    for m in result.members)
    return make(rc, error_code=kio_error_code(result.error), members=members)
