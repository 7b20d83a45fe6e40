"""DescribeTransactions v0: each transactional id's state from this broker's transaction
coordinator (NOT_COORDINATOR for ids another broker coordinates; INVALID_REQUEST for "")."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, denied_names, denied_topics


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    coordinator = ctx.txn_coordinator
    tids = request.body.transactional_ids
    # Kafka: DESCRIBE on each transactional id, and only the topics the caller may DESCRIBE
    denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tids)
    states = []
    for tid in tids:
        if tid in denied:
            states.append(make(rc, "transaction_states", transactional_id=tid, topics=(),
                               error_code=kio_error_code(
                                   ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))
            continue
        if coordinator is None:
            states.append(make(rc, "transaction_states", transactional_id=tid, topics=(),
                               error_code=kio_error_code(ErrorCode.COORDINATOR_NOT_AVAILABLE)))
            continue
        d = coordinator.describe(tid)
        if d.error != ErrorCode.NONE:
            states.append(make(rc, "transaction_states", transactional_id=tid, topics=(),
                               error_code=kio_error_code(d.error)))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in d.partitions:
            by_topic.setdefault(topic, []).append(p)
        hidden = NOTHING_DENIED if ctx.authorizer is None else \
            denied_topics(ctx, AclOperation.DESCRIBE, by_topic)
        for topic in hidden:
            del by_topic[topic]
        states.append(make(
            rc, "transaction_states", transactional_id=tid, error_code=kio_error_code(d.error),
            transaction_state=d.state,
            transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
            transaction_start_time=datetime.datetime.fromtimestamp(d.start_ms / 1000,
                                                                   datetime.timezone.utc),
            producer_id=d.producer_id,
            producer_epoch=d.producer_epoch,
            topics=tuple(make(rc, "transaction_states.topics", topic=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())))
    return make(rc, transaction_states=tuple(states), throttle_time=datetime.timedelta(0))
