"""OffsetCommit v2-9: store a group's consumed positions in ``__consumer_offsets`` (v9: the
generation is a KIP-848 consumer group member's epoch; STALE_MEMBER_EPOCH if it is not the
member's current one).

As in Kafka, a partition of a topic that does not exist gets UNKNOWN_TOPIC_OR_PARTITION and
is not stored; when no partition is left the coordinator is not asked at all. An empty group
id is allowed (Kafka keeps it for backwards compatibility); a null one is INVALID_GROUP_ID.
"""

from __future__ import annotations

from strata.coordinator.group import DEFAULT_RETENTION_TIME
from strata.common.errors import ErrorCode
from strata.protocol.codec import error_response, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, denied_topics
from strata.server.handlers.group_common import (
    commit_response, coordinator, millis, offsets_to_commit)


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    # Kafka: READ on the group (else every partition GROUP_AUTHORIZATION_FAILED), READ on each topic
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    errors, valid = offsets_to_commit(
        ctx, body, denied_topics(ctx, AclOperation.READ, (t.name for t in body.topics)))
    if valid:
        errors.update(await coordinator(ctx).commit_offsets(
            body.group_id, body.member_id, body.generation_id_or_member_epoch, valid,
            group_instance_id=getattr(body, "group_instance_id", None),
            retention_time_ms=millis(getattr(body, "retention_time", None),
                                     DEFAULT_RETENTION_TIME),
            api_version=request.api_version))
    return commit_response(rc, body, errors)
