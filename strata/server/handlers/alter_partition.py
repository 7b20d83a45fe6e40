"""AlterPartition v2-3: a partition leader's ISR change, answered by the active controller
(``ClusterMetadata.alter_partition``).

As Kafka's: a broker that is not the controller, a stale sender broker epoch, or a controller
that does not answer in time fail the whole request with a top-level error and no topics (the
sender retries it); everything else is a partition-level error. v3 gives each new ISR member's
broker epoch (-1: not checked).
"""

from __future__ import annotations

import asyncio

from strata.cluster.metadata import AlterPartitionItem
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


def _items(body) -> list[AlterPartitionItem]:
    items = []
    for topic in body.topics:
        for p in topic.partitions:
            if hasattr(p, "new_isr_with_epochs"):  # v3
                isr = tuple(int(m.broker_id) for m in p.new_isr_with_epochs)
                epochs = tuple(int(m.broker_epoch) for m in p.new_isr_with_epochs)
            else:
                isr, epochs = tuple(int(b) for b in p.new_isr), None
            items.append(AlterPartitionItem(
                topic.topic_id, int(p.partition_index), int(p.leader_epoch),
                int(p.partition_epoch), isr, int(p.leader_recovery_state), epochs))
    return items


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    denied = cluster_denied(ctx, request, AclOperation.CLUSTER_ACTION)  # brokers only
    if denied is not None:
        return denied
    results = await asyncio.to_thread(ctx.metadata.alter_partition, int(body.broker_id),
                                      int(body.broker_epoch), _items(body))
    by_topic: dict = {}  # topic id -> its partitions' results, in request order
    for r in results:
        by_topic.setdefault(r.topic_id, []).append(make(
            rc, "topics.partitions", partition_index=r.partition,
            error_code=kio_error_code(r.error), leader_id=r.leader_id, leader_epoch=r.leader_epoch,
            isr=tuple(r.isr), leader_recovery_state=r.leader_recovery_state,
            partition_epoch=r.partition_epoch))
    return make(rc, topics=tuple(make(rc, "topics", topic_id=topic_id, partitions=tuple(parts))
                                 for topic_id, parts in by_topic.items()))
