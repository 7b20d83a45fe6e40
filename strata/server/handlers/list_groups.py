"""ListGroups v0-5: every group this coordinator holds, filtered by state (v4+) and type (v5+)."""

from __future__ import annotations

from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize_cluster, denied_names
from strata.server.handlers.group_common import coordinator


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    result = coordinator(ctx).list_groups(getattr(body, "states_filter", None) or None,
                                          getattr(body, "types_filter", None) or None)
    listed = result.groups
    # Kafka: DESCRIBE on the cluster lists every group, else those the caller may DESCRIBE
    if ctx.authorizer is not None and not authorize_cluster(ctx, AclOperation.DESCRIBE,
                                                            log_if_denied=False):
        hidden = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.GROUP,
                              (g.group_id for g in listed), log_if_denied=False)
        listed = [g for g in listed if g.group_id not in hidden]
    groups = tuple(make(rc, "groups", group_id=g.group_id, protocol_type=g.protocol_type,
                        group_state=g.state, group_type=g.group_type)
                   for g in listed)
    return make(rc, error_code=kio_error_code(result.error), groups=groups)
