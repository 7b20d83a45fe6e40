"""Heartbeat v0-4: a member is alive; REBALANCE_IN_PROGRESS tells it to rejoin."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize
from strata.server.handlers.group_common import coordinator


async def handle(ctx, request):
    body = request.body
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    error = coordinator(ctx).heartbeat(body.group_id, body.member_id, body.generation_id,
                                       group_instance_id=getattr(body, "group_instance_id", None))
    return make(response_class(request.api_key, request.api_version),
                error_code=kio_error_code(error))
