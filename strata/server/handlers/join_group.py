"""JoinGroup v0-9: the response waits until the group's rebalance completes."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize
from strata.server.handlers.group_common import client_host, coordinator, millis

REQUIRE_KNOWN_MEMBER_ID_VERSION = 4   # KIP-394: new members first get MEMBER_ID_REQUIRED
NULLABLE_PROTOCOL_NAME_VERSION = 7    # before v7 a missing protocol name is "" on the wire
SKIP_ASSIGNMENT_VERSION = 9           # KIP-814


async def handle(ctx, request):
    body = request.body
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    version = request.api_version
    rc = response_class(request.api_key, version)
    result = await coordinator(ctx).join_group(
        body.group_id, body.member_id, body.protocol_type,
        [(p.name, p.metadata) for p in body.protocols],
        session_timeout_ms=millis(body.session_timeout),
        # v0 has no rebalance timeout: the coordinator falls back to the session timeout
        rebalance_timeout_ms=millis(getattr(body, "rebalance_timeout", None)),
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=request.client_id or "",
        client_host=client_host(),
        require_known_member_id=version >= REQUIRE_KNOWN_MEMBER_ID_VERSION,
        supports_skip_assignment=version >= SKIP_ASSIGNMENT_VERSION,
        reason=getattr(body, "reason", None))
    protocol_name = result.protocol_name
    if protocol_name is None and version < NULLABLE_PROTOCOL_NAME_VERSION:
        protocol_name = ""
    members = tuple(make(rc, "members", member_id=m.member_id,
                         group_instance_id=m.group_instance_id, metadata=m.metadata)
                    for m in result.members)
    return make(rc, error_code=kio_error_code(result.error), generation_id=result.generation_id,
                protocol_type=result.protocol_type, protocol_name=protocol_name,
                leader=result.leader_id, skip_assignment=result.skip_assignment,
                member_id=result.member_id, members=members)
