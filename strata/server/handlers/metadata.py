"""Metadata: brokers, controller, cluster id, and topics with their partitions (this node leads all)."""

from __future__ import annotations

import logging

from strata.cluster.metadata import is_internal_topic
from strata.common.errors import ErrorCode, InvalidRequestError, KafkaError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.replication.replica_manager import LEADER_EPOCH
from strata.server import authz

log = logging.getLogger(__name__)
FIRST_VERSION_WITH_TOPIC_IDS = 12


def _requested_names(ctx, request) -> list[tuple[str | None, object, ErrorCode | None]]:
    """(name, topic_id, error) per requested topic; None means all topics."""
    topics = request.body.topics
    if topics is None or (request.api_version == 0 and not topics):
        return [(t.name, t.topic_id, None) for t in ctx.metadata.topics().values()]
    out = []
    for t in topics:
        name = getattr(t, "name", None)
        topic_id = getattr(t, "topic_id", None)
        if request.api_version < FIRST_VERSION_WITH_TOPIC_IDS:
            if name is None:
                raise InvalidRequestError(
                    f"Topic name can not be null for version {request.api_version}")
            if topic_id is not None and topic_id.int != 0:
                raise InvalidRequestError(
                    f"Topic IDs are not supported in requests for version {request.api_version}")
        if name is None and topic_id is not None and topic_id.int != 0:
            info = ctx.metadata.topic_by_id(topic_id)
            out.append((info.name, topic_id, None) if info else (None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID))
        else:
            out.append((name, topic_id, None))
    return out


def _maybe_create(ctx, name: str, allow: bool) -> ErrorCode | None:
    if ctx.metadata.topic(name) is not None:
        return None
    if not (allow and ctx.auto_create_topics):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        ctx.metadata.create_topic(name)
        log.info("auto-created topic %s", name)
        return None
    except KafkaError as exc:
        if exc.code == ErrorCode.TOPIC_ALREADY_EXISTS:
            return None
        return ErrorCode(exc.code)


def partition_entries(ctx, rc, path: str, first: int, end: int) -> tuple:
    """Partitions ``first`` to ``end - 1`` as Metadata and DescribeTopicPartitions describe them:
    this node is the leader and the only replica (no ELR; fields a version lacks are dropped)."""
    node = (ctx.node_id,)
    return tuple(
        make(rc, path, partition_index=p, leader_id=ctx.node_id, leader_epoch=LEADER_EPOCH,
             replica_nodes=node, isr_nodes=node, offline_replicas=(),
             eligible_leader_replicas=(), last_known_elr=())
        for p in range(first, end))


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    allow = getattr(body, "allow_auto_topic_creation", True)
    topic_ops = getattr(body, "include_topic_authorized_operations", False)
    topics = []
    for name, topic_id, error in _requested_names(ctx, request):
        if error is None:
            error = _maybe_create(ctx, name, allow)
        info = ctx.metadata.topic(name) if error is None else None
        partitions = ()
        if info is not None:
            partitions = partition_entries(ctx, rc, "topics.partitions", 0, info.partitions)
        topics.append(make(
            rc, "topics", error_code=kio_error_code(error or ErrorCode.NONE), name=name,
            topic_id=info.topic_id if info else topic_id, is_internal=name is not None and is_internal_topic(name),
            partitions=partitions, topic_authorized_operations=authz.operations(authz.TOPIC, topic_ops and info is not None)))
    brokers = (make(rc, "brokers", node_id=ctx.node_id, host=ctx.advertised_host,
                    port=ctx.advertised_port, rack=None),)
    return make(rc, brokers=brokers, cluster_id=ctx.metadata.cluster_id,
                controller_id=ctx.node_id, topics=tuple(topics),
                cluster_authorized_operations=authz.operations(
                    authz.CLUSTER, getattr(body, "include_cluster_authorized_operations", False)))
