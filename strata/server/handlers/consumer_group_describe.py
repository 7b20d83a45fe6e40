"""ConsumerGroupDescribe v0-1 (KIP-848): a consumer group's epochs, assignor and members with
their current and target assignments. A group that is not a consumer group is
GROUP_ID_NOT_FOUND, as in Kafka (the admin client then asks DescribeGroups)."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server import authz
from strata.server.authorization import GROUP_OPERATIONS, authorized_operations, denied_names
from strata.server.handlers.group_common import coordinator


def _assignment(rc, ctx, partitions):
    parts = []
    for topic_id, ps in sorted(partitions.items(), key=lambda i: i[0].bytes):
        info = ctx.metadata.topic_by_id(topic_id)
        if info is None:
            continue   # deleted since: Kafka leaves such topics out as well
        parts.append(make(rc, "groups.members.assignment.topic_partitions", topic_id=topic_id,
                          topic_name=info.name, partitions=tuple(sorted(ps))))
    return make(rc, "groups.members.assignment", topic_partitions=tuple(parts))


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, body.group_ids)
    described = iter(coordinator(ctx).consumer_group_describe(
        [g for g in body.group_ids if g not in denied]))
    groups = []
    for group_id in body.group_ids:
        if group_id in denied:
            groups.append(make(rc, "groups", group_id=group_id, error_code=kio_error_code(
                ErrorCode.GROUP_AUTHORIZATION_FAILED), error_message=None,
                authorized_operations=authz.OMITTED))
            continue
        g = next(described)
        if g.error != ErrorCode.NONE:
            groups.append(make(rc, "groups", group_id=group_id,
                               error_code=kio_error_code(g.error), error_message=g.message,
                               authorized_operations=authz.OMITTED))
            continue
        members = tuple(
            make(rc, "groups.members", member_id=m.member_id, instance_id=m.instance_id,
                 rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                 client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                 subscribed_topic_regex=m.subscribed_topic_regex,
                 assignment=_assignment(rc, ctx, m.assignment),
                 target_assignment=_assignment(rc, ctx, m.target_assignment),
                 member_type=m.member_type)
            for m in g.members)
        ops = authz.OMITTED
        if body.include_authorized_operations:
            ops = authorized_operations(ctx, ResourceType.GROUP, group_id, GROUP_OPERATIONS)
        groups.append(make(rc, "groups", group_id=group_id, error_code=kio_error_code(g.error),
                           error_message=None, group_state=g.state, group_epoch=g.group_epoch,
                           assignment_epoch=g.assignment_epoch, assignor_name=g.assignor_name,
                           members=members, authorized_operations=ops))
    return make(rc, groups=tuple(groups))
