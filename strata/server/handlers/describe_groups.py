"""DescribeGroups v0-5: state, protocol and members of each group (Dead when unknown)."""

from __future__ import annotations

from strata.protocol.codec import kio_error_code, make, response_class
from strata.server import authz
from strata.server.handlers.group_common import coordinator


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    include_ops = getattr(body, "include_authorized_operations", False)
    groups = []
    for g in coordinator(ctx).describe_groups(body.groups):
        members = tuple(
            make(rc, "groups.members", member_id=m.member_id, group_instance_id=m.group_instance_id,
                 client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                 member_assignment=m.assignment)
            for m in g.members)
        ops = authz.operations(authz.GROUP, include_ops and not g.error)
        groups.append(make(rc, "groups", error_code=kio_error_code(g.error), group_id=g.group_id,
                           group_state=g.state, protocol_type=g.protocol_type,
                           protocol_data=g.protocol_data, members=members,
                           authorized_operations=ops))
    return make(rc, groups=tuple(groups))
