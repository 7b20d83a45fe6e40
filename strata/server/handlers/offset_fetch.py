"""OffsetFetch v1-7 (one group per request; the batched v8+ is not advertised).

A group-level error is, as in Kafka's ``getErrorResponse``, copied into every requested
partition for v1 (which has no top-level error field) and answered with no topics for v2+.
Topics null (v2+) asks for every committed offset of the group.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, authorize, denied_topics
from strata.server.handlers.group_common import coordinator

TOP_LEVEL_ERROR_VERSION = 2


def _partition(rc, index: int, offset: int, leader_epoch: int, metadata: str, error):
    return make(rc, "topics.partitions", partition_index=index, committed_offset=offset,
                committed_leader_epoch=leader_epoch, metadata=metadata,
                error_code=kio_error_code(error))


def _group_error(rc, body, version: int, error: ErrorCode):
    topics = ()
    if version < TOP_LEVEL_ERROR_VERSION:
        topics = tuple(
            make(rc, "topics", name=t.name, partitions=tuple(
                _partition(rc, i, -1, -1, "", error) for i in t.partition_indexes))
            for t in body.topics or ())
    return make(rc, error_code=kio_error_code(error), topics=topics)


async def handle(ctx, request):
    body = request.body
    version = request.api_version
    rc = response_class(request.api_key, version)
    # Kafka: DESCRIBE on the group; offsets of topics the caller may not DESCRIBE are not
    # shown (named ones answer TOPIC_AUTHORIZATION_FAILED, the others are left out)
    if not authorize(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, body.group_id):
        return _group_error(rc, body, version, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    wanted = None
    denied = NOTHING_DENIED
    if body.topics is not None:
        denied = denied_topics(ctx, AclOperation.DESCRIBE, (t.name for t in body.topics))
        wanted = [(t.name, i) for t in body.topics if t.name not in denied
                  for i in t.partition_indexes]
    result = coordinator(ctx).fetch_offsets(body.group_id, wanted,
                                            require_stable=getattr(body, "require_stable", False))
    if result.error != ErrorCode.NONE:
        return _group_error(rc, body, version, result.error)

    offsets = result.offsets
    if body.topics is None and ctx.authorizer is not None:
        hidden = denied_topics(ctx, AclOperation.DESCRIBE, (topic for topic, _ in offsets))
        offsets = {tp: o for tp, o in offsets.items() if tp[0] not in hidden}
    by_topic: dict[str, list] = {}
    for (topic, index), o in offsets.items():
        by_topic.setdefault(topic, []).append(
            _partition(rc, index, o.offset, o.leader_epoch, o.metadata, o.error))
    for t in body.topics or ():
        if t.name in denied:
            by_topic[t.name] = [_partition(rc, i, -1, -1, "", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                                for i in t.partition_indexes]
    topics = tuple(make(rc, "topics", name=name, partitions=tuple(parts))
                   for name, parts in by_topic.items())
    return make(rc, topics=topics)
