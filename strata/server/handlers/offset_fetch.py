"""OffsetFetch v1-9 (v8+ batch groups; v9 carries the member id and epoch of a KIP-848
consumer group's member, checked by the coordinator: UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH).

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
BATCHED_VERSION = 8


def _partition(rc, path: str, index: int, offset: int, leader_epoch: int, metadata: str, error):
    return make(rc, path, partition_index=index, committed_offset=offset,
                committed_leader_epoch=leader_epoch, metadata=metadata,
                error_code=kio_error_code(error))


def _fetch(ctx, rc, prefix: str, group_id: str, topics, require_stable: bool,
           member_id: str | None = None, member_epoch: int = -1):
    """One group's answer: (error, topics)."""
    path = prefix + "topics"
    ppath = path + ".partitions"
    # Kafka: DESCRIBE on the group; offsets of topics the caller may not DESCRIBE are not
    # shown (named ones answer TOPIC_AUTHORIZATION_FAILED, the others are left out)
    if not authorize(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, ()
    wanted = None
    denied = NOTHING_DENIED
    if topics is not None:
        denied = denied_topics(ctx, AclOperation.DESCRIBE, (t.name for t in topics))
        wanted = [(t.name, i) for t in topics if t.name not in denied
                  for i in t.partition_indexes]
    result = coordinator(ctx).fetch_offsets(group_id, wanted, require_stable=require_stable,
                                            member_id=member_id, member_epoch=member_epoch)
    if result.error != ErrorCode.NONE:
        return result.error, ()
    offsets = result.offsets
    if topics is None and ctx.authorizer is not None:
        hidden = denied_topics(ctx, AclOperation.DESCRIBE, (topic for topic, _ in offsets))
        offsets = {tp: o for tp, o in offsets.items() if tp[0] not in hidden}
    by_topic: dict[str, list] = {}
    for (topic, index), o in offsets.items():
        by_topic.setdefault(topic, []).append(
            _partition(rc, ppath, index, o.offset, o.leader_epoch, o.metadata, o.error))
    for t in topics or ():
        if t.name in denied:
            by_topic[t.name] = [_partition(rc, ppath, i, -1, -1, "",
                                           ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                                for i in t.partition_indexes]
    return ErrorCode.NONE, tuple(make(rc, path, name=name, partitions=tuple(parts))
                                 for name, parts in by_topic.items())


async def handle(ctx, request):
    body = request.body
    version = request.api_version
    rc = response_class(request.api_key, version)
    stable = getattr(body, "require_stable", False)
    if version >= BATCHED_VERSION:
        groups = []
        for g in body.groups:
            error, topics = _fetch(ctx, rc, "groups.", g.group_id, g.topics, stable,
                                   getattr(g, "member_id", None), getattr(g, "member_epoch", -1))
            groups.append(make(rc, "groups", group_id=g.group_id, topics=topics,
                               error_code=kio_error_code(error)))
        return make(rc, groups=tuple(groups))
    error, topics = _fetch(ctx, rc, "", body.group_id, body.topics, stable)
    if error != ErrorCode.NONE and version < TOP_LEVEL_ERROR_VERSION:
        topics = tuple(
            make(rc, "topics", name=t.name, partitions=tuple(
                _partition(rc, "topics.partitions", i, -1, -1, "", error)
                for i in t.partition_indexes))
            for t in body.topics or ())
    return make(rc, error_code=kio_error_code(error), topics=topics)
