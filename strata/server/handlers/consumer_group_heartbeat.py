"""ConsumerGroupHeartbeat v0-1 (KIP-848): join, heartbeat in and leave a consumer group.

Authorization as Kafka 4's: READ on the group (else GROUP_AUTHORIZATION_FAILED), DESCRIBE on
every subscribed topic name (else TOPIC_AUTHORIZATION_FAILED); a regex subscription matches
only the topics the caller may DESCRIBE.
"""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.coordinator.group import ConsumerGroupHeartbeatRequest
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, denied_topics
from strata.server.handlers.group_common import client_host, coordinator, millis


async def handle(ctx, request):
    body = request.body
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    names = body.subscribed_topic_names
    if names and denied_topics(ctx, AclOperation.DESCRIBE, names):
        return error_response(request, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                              "The group has subscribed to topics that are not authorized.")

    def authorized(topics):
        topics = list(topics)
        hidden = denied_topics(ctx, AclOperation.DESCRIBE, topics, log_if_denied=False)
        return {t for t in topics if t not in hidden}

    owned = None
    if body.topic_partitions is not None:
        owned = tuple((tp.topic_id, tuple(tp.partitions)) for tp in body.topic_partitions)
    result = await coordinator(ctx).consumer_group_heartbeat(
        ConsumerGroupHeartbeatRequest(
            group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
            instance_id=body.instance_id, rack_id=body.rack_id,
            rebalance_timeout_ms=millis(body.rebalance_timeout, -1),
            subscribed_topic_names=None if names is None else tuple(names),
            subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
            server_assignor=body.server_assignor, owned=owned),
        api_version=request.api_version, client_id=request.client_id or "",
        client_host=client_host(),
        authorized_topics=authorized if ctx.authorizer is not None else None)
    rc = response_class(request.api_key, request.api_version)
    assignment = None
    if result.assignment is not None:
        assignment = make(rc, "assignment", topic_partitions=tuple(
            make(rc, "assignment.topic_partitions", topic_id=topic_id,
                 partitions=tuple(sorted(parts)))
            for topic_id, parts in sorted(result.assignment.items(), key=lambda i: i[0].bytes)))
    return make(rc, error_code=kio_error_code(result.error), error_message=result.message,
                member_id=result.member_id, member_epoch=result.member_epoch,
                heartbeat_interval=datetime.timedelta(milliseconds=result.heartbeat_interval_ms),
                assignment=assignment)
