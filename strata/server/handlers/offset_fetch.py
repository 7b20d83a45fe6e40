"""OffsetFetch v1-7 (one group per request; the batched v8+ is not advertised).

A group-level error is, as in Kafka's ``getErrorResponse``, copied into every requested
partition for v1 (which has no top-level error field) and answered with no topics for v2+.
Topics null (v2+) asks for every committed offset of the group.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.server.handlers.group_common import coordinator

TOP_LEVEL_ERROR_VERSION = 2


def _partition(rc, index: int, offset: int, leader_epoch: int, metadata: str, error):
    return make(rc, "topics.partitions", partition_index=index, committed_offset=offset,
                committed_leader_epoch=leader_epoch, metadata=metadata,
                error_code=kio_error_code(error))


async def handle(ctx, request):
    body = request.body
    version = request.api_version
    rc = response_class(request.api_key, version)
    wanted = None
    if body.topics is not None:
        wanted = [(t.name, i) for t in body.topics for i in t.partition_indexes]
    result = coordinator(ctx).fetch_offsets(body.group_id, wanted,
                                            require_stable=getattr(body, "require_stable", False))
    if result.error != ErrorCode.NONE:
        topics = ()
        if version < TOP_LEVEL_ERROR_VERSION:
            topics = tuple(
                make(rc, "topics", name=t.name, partitions=tuple(
                    _partition(rc, i, -1, -1, "", result.error) for i in t.partition_indexes))
                for t in body.topics or ())
        return make(rc, error_code=kio_error_code(result.error), topics=topics)

    by_topic: dict[str, list] = {}
    for (topic, index), o in result.offsets.items():
        by_topic.setdefault(topic, []).append(
            _partition(rc, index, o.offset, o.leader_epoch, o.metadata, o.error))
    topics = tuple(make(rc, "topics", name=name, partitions=tuple(parts))
                   for name, parts in by_topic.items())
    return make(rc, topics=topics)
