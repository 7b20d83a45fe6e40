"""Produce: append each partition's batch; no response at all for acks=0 (as Kafka, a failed
acks=0 request closes its connection instead, so that the producer refreshes its metadata)."""

from __future__ import annotations

import asyncio
import datetime

from strata.common.errors import ErrorCode, KafkaError, error_name
from strata.common.types import TopicPartition
from strata.protocol.codec import kio_error_code, make, response_class
from strata.replication.replica_manager import AppendResult
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, authorize, denied_topics
from strata.server.network import CloseConnection
from strata.server.purgatory import await_replication
from strata.server.txn_verification import FIRST_ADD_PRODUCE_VERSION, transactional_producer


def _append_time(ms: int):
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _record_errors(rc, errors, version: int) -> tuple:
    """The refused records of a batch (Produce v8+; older versions have no such field)."""
    if version < 8:
        return ()
    return tuple(make(rc, "responses.partition_responses.record_errors", batch_index=i,
                      batch_index_error_message=m) for i, m in errors)


async def _verify_transaction(ctx, body, version: int, denied):
    """KIP-890 verification of the request's transactional batches (``TxnVerifier``; from v12
    the partitions are added to the transaction instead): the partitions that must not be
    appended, with their errors, and the guards of the others."""
    verifier = ctx.txn_verifier
    if verifier is None or not verifier.applies_to(version):
        return {}, {}
    producer = None
    guards = {}
    for t in body.topic_data:
        if t.name in denied:
            continue
        for p in t.partition_data:
            found = transactional_producer(p.records)
            if found is None:
                continue
            producer = producer or found
            tp = TopicPartition(t.name, p.index)
            guard = verifier.start(tp, *found)
            if guard is not None:
                guards[tp] = guard
    if not guards:
        return {}, {}
    refused = await verifier.verify(body.transactional_id, producer[0], producer[1],
                                    list(guards), version)
    for tp in refused:
        verifier.abandon(tp, producer[0], guards.pop(tp))
    if version >= FIRST_ADD_PRODUCE_VERSION:
        # V2: the previous transaction's marker may have ended a guard while the add waited
        # for it; a marker ending this transaction bumps the epoch past this append's, which
        # the append refuses by itself, so the guards start anew once added
        guards = {tp: verifier.start(tp, *producer) for tp in guards}
    return refused, guards


_TOPIC_DENIED = AppendResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def _authorize(ctx, body) -> frozenset[str] | None:
    """Kafka's checks before a Produce: transactional records need WRITE on the request's
    transactional id (None: the whole request fails); else the topics the caller may not
    WRITE. Idempotent records need nothing more (InitProducerId checked their producer)."""
    tid = getattr(body, "transactional_id", None)
    if tid and any(transactional_producer(p.records) is not None
                   for t in body.topic_data for p in t.partition_data):
        if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return None
    return denied_topics(ctx, AclOperation.WRITE, (t.name for t in body.topic_data))


# A request of many partitions yields to the event loop between them once this many record
# bytes were appended, so that one large request does not hold up every other connection.
YIELD_EVERY_BYTES = 1 << 20


async def handle(ctx, request):
    try:
        return await _produce(ctx, request)
    except KafkaError as exc:
        if request.body.acks != 0:
            raise
        raise CloseConnection(_ACKS_0_FAILED.format(request.correlation_id, exc)) from None


_ACKS_0_FAILED = "error during produce request with correlation id {} with ack=0: {}"


async def _produce(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    acks = body.acks
    results = []
    since_yield = 0
    waits = {}
    denied = NOTHING_DENIED
    if ctx.authorizer is not None:
        denied = _authorize(ctx, body)
        if denied is None:
            raise KafkaError(f"WRITE on transactional id {body.transactional_id} denied",
                             code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if getattr(body, "transactional_id", None):
        refused, guards = await _verify_transaction(ctx, body, request.api_version, denied)
    else:
        refused, guards = {}, {}
        if any(transactional_producer(p.records) is not None
               for t in body.topic_data for p in t.partition_data):
            # Kafka: transactional records need the transactional id they belong to
            raise KafkaError("Transactional records require the request's transactional id",
                             code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    replicas = ctx.metadata.read_replicas   # issue 52's read-only topics
    for t in body.topic_data:
        for p in t.partition_data:
            key = (t.name, p.index)
            if acks not in (-1, 0, 1):
                results.append((key, None))
                continue
            if denied and t.name in denied:
                results.append((key, _TOPIC_DENIED))
                continue
            if replicas.serves(t.name):
                results.append((key, AppendResult(ErrorCode.POLICY_VIOLATION,
                                                  message=replicas.write_refusal(t.name))))
                continue
            tp = TopicPartition(t.name, p.index)
            if tp in refused:
                results.append((key, AppendResult(refused[tp], message=(
                    "Partition was not added to the transaction"
                    if refused[tp] == ErrorCode.INVALID_TXN_STATE else None))))
                continue
            r = ctx.replica_manager.append(tp, p.records, produce_version=request.api_version,
                                           required_acks=acks, verification_guard=guards.get(tp))
            if acks == -1 and r.error == ErrorCode.NONE and ctx.replica_manager.clustered:
                waits[key] = (tp, r.last_offset + 1)
            results.append((key, r))
            size = len(p.records or b"")
            ctx.topic_stats.produced(t.name, r.error, size, r.last_offset - r.base_offset + 1
                                     if r.error == ErrorCode.NONE and r.base_offset >= 0 else 0)
            since_yield += size
            if since_yield >= YIELD_EVERY_BYTES:
                since_yield = 0
                await asyncio.sleep(0)
    if acks == 0:
        failed = {f"{topic}-{index}": error_name(r.error) for (topic, index), r in results
                  if r is not None and r.error != ErrorCode.NONE}
        if failed:
            raise KafkaError(f"topic and partition to exceptions: {failed}")
        return None
    errors = await await_replication(ctx.replica_manager, ctx.fetch_watchers, waits,
                                     body.timeout.total_seconds()) if waits else {}
    by_topic: dict[str, list] = {}
    for (topic, index), r in results:
        if r is None:
            entry = make(rc, "responses.partition_responses", index=index,
                         error_code=kio_error_code(ErrorCode.INVALID_REQUIRED_ACKS),
                         base_offset=-1, log_start_offset=-1)
        else:
            error = errors.get((topic, index), r.error)
            entry = make(
                rc, "responses.partition_responses", index=index,
                error_code=kio_error_code(error), base_offset=r.base_offset,
                log_append_time=_append_time(r.log_append_time),
                log_start_offset=r.log_start_offset,
                record_errors=_record_errors(rc, r.record_errors, request.api_version),
                error_message=r.message if error != ErrorCode.NONE else None)
        by_topic.setdefault(topic, []).append(entry)
    return make(rc, responses=tuple(make(rc, "responses", name=name, partition_responses=tuple(parts))
                                    for name, parts in by_topic.items()),
                throttle_time=datetime.timedelta(0))
