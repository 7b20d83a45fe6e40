"""Metadata: live brokers, controller, cluster id, and topics with each partition's leader,
leader epoch, replicas, ISR and offline replicas (from ``ClusterMetadata``, one broker or many)."""

from __future__ import annotations

import logging

from strata.cluster.metadata import ZERO_UUID, is_internal_topic
from strata.common.errors import ErrorCode, InvalidRequestError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import CLUSTER_NAME, AclOperation, ResourceType
from strata.server import authz
from strata.server.authorization import (
    TOPIC_OPERATIONS, authorize, authorized_operations, cluster_operations, denied_topics)
from strata.server.handlers.group_common import client_listener
from strata.server.topic_creation import auto_topic_creator

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
        # by id (Kafka: any non-zero id; the Java client leaves the name "", not null)
        if not name and topic_id is not None and topic_id.int != 0:
            info = ctx.metadata.topic_by_id(topic_id)
            out.append((info.name, topic_id, None) if info else (None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID))
        else:
            out.append((name, topic_id, None))
    return out


def _maybe_create(ctx, name: str, allow: bool) -> ErrorCode | None:
    """None for an existing topic; else UNKNOWN_TOPIC_OR_PARTITION, or (auto-creation on) the
    creation started off the event loop and LEADER_NOT_AVAILABLE until it is done, as Kafka."""
    if ctx.metadata.topic(name) is not None:
        return None
    if not (allow and ctx.auto_create_topics):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return auto_topic_creator(ctx.metadata).request(name)


def partition_entries(ctx, rc, path: str, topic: str, first: int, end: int) -> tuple:
    """Partitions ``first`` to ``end - 1`` as Metadata and DescribeTopicPartitions describe them
    (with KIP-966's ELR and last known ELR; fields a version lacks are dropped). Without a live leader: LEADER_NOT_AVAILABLE,
    leader -1, as Kafka answers."""
    live = {b.node_id for b in ctx.metadata.live_brokers()}
    out = []
    for p in range(first, end):
        st = ctx.metadata.partition_state(topic, p)
        if st is None:
            continue
        leader = st.leader if st.leader in live else -1
        out.append(make(
            rc, path, partition_index=p, leader_id=leader, leader_epoch=st.leader_epoch,
            error_code=kio_error_code(ErrorCode.NONE if leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE),
            replica_nodes=st.replicas, isr_nodes=st.isr,
            offline_replicas=tuple(r for r in st.replicas if r not in live),
            eligible_leader_replicas=st.elr, last_known_elr=st.last_known_elr))
    return tuple(out)


def broker_entries(ctx, rc, path: str) -> tuple:
    return tuple(make(rc, path, node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                 for b in ctx.metadata.live_brokers(client_listener()))


def _authorize(ctx, requested, all_topics: bool, auto_create: bool):
    """Kafka's checks of a Metadata request: the topics the caller may not DESCRIBE (left out
    of an all-topics answer, TOPIC_AUTHORIZATION_FAILED when named, existing or not), and the
    missing ones it may DESCRIBE but not create (CREATE on the cluster or on the topic)."""
    names = [name for name, _, error in requested if error is None]
    denied = denied_topics(ctx, AclOperation.DESCRIBE, names, log_if_denied=not all_topics)
    not_creatable: frozenset[str] = frozenset()
    missing = [n for n in names if n not in denied and ctx.metadata.topic(n) is None]
    if auto_create and missing and not authorize(
            ctx, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=False):
        not_creatable = denied_topics(ctx, AclOperation.CREATE, missing)
    return denied, not_creatable


def _denied_topic(rc, name, topic_id, by_id: bool, internal: bool):
    # a topic asked for by id answers its id (ids are not secret), by name the zero id
    return make(rc, "topics", error_code=kio_error_code(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                name=None if by_id else name, topic_id=topic_id if by_id else ZERO_UUID,
                is_internal=internal, partitions=(), topic_authorized_operations=authz.OMITTED)


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    allow = getattr(body, "allow_auto_topic_creation", True)
    topic_ops = getattr(body, "include_topic_authorized_operations", False)
    requested = _requested_names(ctx, request)
    denied: set[str] = set()
    not_creatable: set[str] = set()
    all_topics = body.topics is None or (request.api_version == 0 and not body.topics)
    if ctx.authorizer is not None:
        denied, not_creatable = _authorize(ctx, requested, all_topics,
                                           allow and ctx.auto_create_topics and not all_topics)
    topics = []
    for name, topic_id, error in requested:
        if error is None and name in denied:
            if not all_topics:
                by_id = request.api_version >= FIRST_VERSION_WITH_TOPIC_IDS and \
                    topic_id is not None and topic_id.int != 0
                topics.append(_denied_topic(rc, name, topic_id, by_id, False))
            continue
        if error is None and name in not_creatable:
            topics.append(_denied_topic(rc, name, topic_id, False, is_internal_topic(name)))
            continue
        if error is None:
            error = _maybe_create(ctx, name, allow)
        info = ctx.metadata.topic(name) if error is None else None
        partitions = ()
        if info is not None:
            partitions = partition_entries(ctx, rc, "topics.partitions", name, 0, info.partitions)
        ops = authz.OMITTED
        if topic_ops and info is not None:
            ops = authorized_operations(ctx, ResourceType.TOPIC, name, TOPIC_OPERATIONS)
        topics.append(make(
            rc, "topics", error_code=kio_error_code(error or ErrorCode.NONE), name=name,
            topic_id=info.topic_id if info else topic_id, is_internal=name is not None and is_internal_topic(name),
            partitions=partitions, topic_authorized_operations=ops))
    return make(rc, brokers=broker_entries(ctx, rc, "brokers"), cluster_id=ctx.metadata.cluster_id,
                controller_id=ctx.metadata.controller_id, topics=tuple(topics),
                cluster_authorized_operations=cluster_operations(
                    ctx, getattr(body, "include_cluster_authorized_operations", False)))
