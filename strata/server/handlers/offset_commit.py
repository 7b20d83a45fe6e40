"""OffsetCommit v2-8: store a group's consumed positions in ``__consumer_offsets``.

As in Kafka, a partition of a topic that does not exist gets UNKNOWN_TOPIC_OR_PARTITION and
is not stored; when no partition is left the coordinator is not asked at all. An empty group
id is allowed (Kafka keeps it for backwards compatibility); a null one is INVALID_GROUP_ID.
"""

from __future__ import annotations

from strata.coordinator.group import DEFAULT_RETENTION_TIME
from strata.protocol.codec import response_class
from strata.server.handlers.group_common import (
    commit_response, coordinator, millis, offsets_to_commit)


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    errors, valid = offsets_to_commit(ctx, body)
    if valid:
        errors.update(await coordinator(ctx).commit_offsets(
            body.group_id, body.member_id, body.generation_id_or_member_epoch, valid,
            group_instance_id=getattr(body, "group_instance_id", None),
            retention_time_ms=millis(getattr(body, "retention_time", None),
                                     DEFAULT_RETENTION_TIME)))
    return commit_response(rc, body, errors)
