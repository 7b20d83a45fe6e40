"""WriteTxnMarkers v1-2: a transaction coordinator's COMMIT/ABORT markers for the partitions
this broker leads (``strata.server.txn_markers.write_markers``).

v2 (KIP-890) adds each marker's transaction version. The response has one entry per producer
id, as Kafka's (the errors of markers of the same producer id are merged), each partition's
error under its topic. Throttling does not apply (an inter-broker request).
"""

from __future__ import annotations

from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import authorize_cluster, cluster_denied
from strata.server.txn_markers import TxnMarker, write_markers


def _markers(body) -> list[TxnMarker]:
    return [TxnMarker(producer_id=int(m.producer_id), producer_epoch=int(m.producer_epoch),
                      commit=bool(m.transaction_result), coordinator_epoch=int(m.coordinator_epoch),
                      partitions=tuple((t.name, int(p)) for t in m.topics for p in t.partition_indexes),
                      transaction_version=int(getattr(m, "transaction_version", 0)))
            for m in body.markers]


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    # Kafka: ALTER on the cluster, else CLUSTER_ACTION
    if ctx.authorizer is not None and not authorize_cluster(ctx, AclOperation.ALTER,
                                                            log_if_denied=False):
        denied = cluster_denied(ctx, request, AclOperation.CLUSTER_ACTION)
        if denied is not None:
            return denied
    markers = _markers(request.body)
    results = await write_markers(ctx, markers) if markers else []
    by_producer: dict[int, dict[str, dict[int, int]]] = {}  # in request order
    for marker, errors in zip(markers, results):
        topics = by_producer.setdefault(marker.producer_id, {})
        for (topic, partition), error in errors.items():
            topics.setdefault(topic, {})[partition] = error
    return make(rc, markers=tuple(
        make(rc, "markers", producer_id=pid, topics=tuple(
            make(rc, "markers.topics", name=topic, partitions=tuple(
                make(rc, "markers.topics.partitions", partition_index=p,
                     error_code=kio_error_code(e))
                for p, e in parts.items()))
            for topic, parts in topics.items()))
        for pid, topics in by_producer.items()))
