"""AddPartitionsToTxn v0-5: a producer adds partitions to its ongoing transaction (v0-3), or a
partition leader verifies that a transactional produce belongs to one (v4+ ``verify_only``,
KIP-890), or adds them for a transactions V2 client's Produce v12 / TxnOffsetCommit v5 (v5
without ``verify_only``: the transaction is V2). Partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION and the others of the
request OPERATION_NOT_ATTEMPTED, as Kafka answers."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.cluster.metadata import is_internal_topic
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import (
    NOTHING_DENIED, authorize, authorize_cluster, denied_topics)

FIRST_BATCHED_VERSION = 4
FIRST_V2_ADD_VERSION = 5   # a broker's add (not verify_only) at v5+ is a V2 client's


def _topic_results(rc, field: str, codes: dict[tuple[str, int], ErrorCode]):
    by_topic: dict[str, list] = {}
    for (topic, p), code in codes.items():
        by_topic.setdefault(topic, []).append(make(
            rc, f"{field}.results_by_partition", partition_index=p,
            partition_error_code=kio_error_code(code)))
    return tuple(make(rc, field, name=t, results_by_partition=tuple(ps))
                 for t, ps in by_topic.items())


def _unknown(ctx, partitions: list[tuple[str, int]]) -> set[tuple[str, int]]:
    out = set()
    for topic, p in partitions:
        info = ctx.metadata.topic(topic)
        if info is None or not 0 <= p < info.partitions:
            out.add((topic, p))
    return out


def _client_denied(ctx, transactional_id: str, partitions) -> ErrorCode | frozenset[str]:
    """Kafka's checks of a client's (v0-3) AddPartitionsToTxn: WRITE on the transactional id
    (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and the topics it may not WRITE (internal
    topics are never authorized)."""
    if ctx.authorizer is None:
        return NOTHING_DENIED
    if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    names = {t for t, _ in partitions}
    internal = {t for t in names if is_internal_topic(t)}
    return internal | denied_topics(ctx, AclOperation.WRITE, names - internal)


async def add(ctx, transactional_id: str, producer_id: int, producer_epoch: int,
              partitions: list[tuple[str, int]], denied=NOTHING_DENIED,
              client_transaction_version: int = 0) -> dict[tuple[str, int], ErrorCode]:
    """One transaction's partitions added: a code per partition. When one is of a ``denied``
    topic or unknown, none is added (the others OPERATION_NOT_ATTEMPTED)."""
    unknown = _unknown(ctx, partitions)
    if unknown or denied:
        return {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp[0] in denied
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in partitions}
    coordinator = ctx.txn_coordinator
    error = ErrorCode.COORDINATOR_NOT_AVAILABLE if coordinator is None else \
        await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions,
                                         client_transaction_version)
    return {tp: error for tp in partitions}


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    coordinator = ctx.txn_coordinator
    if request.api_version < FIRST_BATCHED_VERSION:
        partitions = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        denied = _client_denied(ctx, body.v3_and_below_transactional_id, partitions)
        if isinstance(denied, ErrorCode):
            codes = {tp: denied for tp in partitions}
        else:
            codes = await add(ctx, body.v3_and_below_transactional_id,
                              body.v3_and_below_producer_id, body.v3_and_below_producer_epoch,
                              partitions, denied)
        if request.api_version < 2:
            codes = {tp: ErrorCode.INVALID_PRODUCER_EPOCH if c == ErrorCode.PRODUCER_FENCED else c
                     for tp, c in codes.items()}
        return make(rc, throttle_time=datetime.timedelta(0),
                    results_by_topic_v3_and_below=_topic_results(
                        rc, "results_by_topic_v3_and_below", codes))
    # v4+ comes from brokers (KIP-890): CLUSTER_ACTION on the cluster, else (as Kafka's
    # getErrorResponse) only the top-level error
    if ctx.authorizer is not None and \
            not authorize_cluster(ctx, AclOperation.CLUSTER_ACTION):
        return make(rc, throttle_time=datetime.timedelta(0), results_by_transaction=(),
                    error_code=kio_error_code(ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
    results = []
    for txn in body.transactions:
        partitions = [(t.name, p) for t in txn.topics for p in t.partitions]
        if coordinator is None:
            codes = {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in partitions}
        elif txn.verify_only:
            codes = coordinator.verify_partitions(txn.transactional_id, txn.producer_id,
                                                  txn.producer_epoch, partitions)
        else:
            codes = await add(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                              partitions, client_transaction_version=(
                                  2 if request.api_version >= FIRST_V2_ADD_VERSION else 0))
        results.append(make(rc, "results_by_transaction", transactional_id=txn.transactional_id,
                            topic_results=_topic_results(
                                rc, "results_by_transaction.topic_results", codes)))
    return make(rc, throttle_time=datetime.timedelta(0), error_code=kio_error_code(ErrorCode.NONE),
                results_by_transaction=tuple(results))
