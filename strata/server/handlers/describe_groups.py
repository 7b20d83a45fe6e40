"""DescribeGroups v0-6: state, protocol and members of each group. An unknown group is Dead;
from v6 (KIP-1043) it is also GROUP_ID_NOT_FOUND with a message, as in Kafka 4.x."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server import authz
from strata.server.authorization import GROUP_OPERATIONS, authorized_operations, denied_names
from strata.server.handlers.group_common import coordinator

FIRST_VERSION_WITH_NOT_FOUND = 6
DEAD = "Dead"


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    include_ops = getattr(body, "include_authorized_operations", False)
    # Kafka: a group the caller may not DESCRIBE answers GROUP_AUTHORIZATION_FAILED
    denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, body.groups)
    described = iter(coordinator(ctx).describe_groups([g for g in body.groups if g not in denied]))
    groups = []
    for group_id in body.groups:
        if group_id in denied:
            groups.append(make(rc, "groups", error_code=kio_error_code(
                ErrorCode.GROUP_AUTHORIZATION_FAILED), error_message=None, group_id=group_id,
                group_state="", protocol_type="", protocol_data="", members=(),
                authorized_operations=authz.OMITTED))
            continue
        g = next(described)
        members = tuple(
            make(rc, "groups.members", member_id=m.member_id, group_instance_id=m.group_instance_id,
                 client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                 member_assignment=m.assignment)
            for m in g.members)
        ops = authz.OMITTED
        if include_ops and not g.error:
            ops = authorized_operations(ctx, ResourceType.GROUP, g.group_id, GROUP_OPERATIONS)
        error, message = g.error, None
        if request.api_version >= FIRST_VERSION_WITH_NOT_FOUND and not error and g.state == DEAD:
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {g.group_id} not found."
        groups.append(make(rc, "groups", error_code=kio_error_code(error), error_message=message,
                           group_id=g.group_id,
                           group_state=g.state, protocol_type=g.protocol_type,
                           protocol_data=g.protocol_data, members=members,
                           authorized_operations=ops))
    return make(rc, groups=tuple(groups))
