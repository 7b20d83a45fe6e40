"""SyncGroup v0-5: the leader's assignment is stored, then every member gets its share."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.coordinator.group import SyncGroupResult
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize
from strata.server.handlers.group_common import coordinator

MANDATORY_PROTOCOL_VERSION = 5  # v5+: ProtocolType and ProtocolName are required (KIP-559)


async def handle(ctx, request):
    body = request.body
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    rc = response_class(request.api_key, request.api_version)
    protocol_type = getattr(body, "protocol_type", None)
    protocol_name = getattr(body, "protocol_name", None)
    if request.api_version >= MANDATORY_PROTOCOL_VERSION and (protocol_type is None
                                                              or protocol_name is None):
        result = SyncGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    else:
        result = await coordinator(ctx).sync_group(
            body.group_id, body.generation_id, body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            protocol_type=protocol_type, protocol_name=protocol_name,
            assignments=[(a.member_id, a.assignment) for a in body.assignments])
    return make(rc, error_code=kio_error_code(result.error), protocol_type=result.protocol_type,
                protocol_name=result.protocol_name, assignment=result.assignment)
