"""Transaction markers on the partition leader: what WriteTxnMarkers does (Kafka's
``KafkaApis.handleWriteTxnMarkersRequest`` with ``ReplicaManager.appendRecords`` as the
coordinator).

The transaction coordinator calls ``write_markers`` directly for the partitions this broker
leads and sends WriteTxnMarkers (``strata.server.handlers.write_txn_markers``) to the leaders of
the others. For every partition of every marker a COMMIT or ABORT control batch is appended as
``AppendOrigin.COORDINATOR`` with acks=all, so the log checks the producer epoch (an older one
is INVALID_PRODUCER_EPOCH) and the coordinator epoch (an older one is
TRANSACTION_COORDINATOR_FENCED) and ends the producer's transaction (last stable offset,
``.txnindex`` for an abort). In a cluster the answer waits until the marker is replicated to
the ISR (REQUEST_TIMED_OUT after ``ctx.txn_marker_timeout_s``, Kafka's request.timeout.ms).

Once a marker is in a ``__consumer_offsets`` partition for good, the group coordinator
materializes (commit) or drops (abort) that producer's pending transactional offsets:
``ctx.group_coordinator.complete_transaction(partition, producer_id, commit)``. As in Kafka,
only for appends that succeeded, and a failure there answers UNKNOWN_SERVER_ERROR for the
partition.

Errors per partition, as Kafka answers them: a partition not hosted here (unknown topic or
partition, or no replica on this broker) UNKNOWN_TOPIC_OR_PARTITION; a replica that is not the
leader NOT_LEADER_OR_FOLLOWER; an ISR below min.insync.replicas NOT_ENOUGH_REPLICAS (or
NOT_ENOUGH_REPLICAS_AFTER_APPEND once appended); a failing log dir KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.coordinator.txn_coordinator import TxnMarker  # noqa: F401 - the unit of work here too
from strata.log.producer_state import AppendOrigin
from strata.protocol import records as rec
from strata.server.purgatory import await_replication

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms default

PartitionKey = tuple[str, int]


class MarkerTarget(Protocol):
    """What ``write_markers`` uses: the broker's context has these, and so has
    ``LocalMarkerTarget``, which the transaction coordinator's sender is built with before the
    context exists."""
    replica_manager: Any
    fetch_watchers: Any
    group_coordinator: Any                 # ``complete_transaction``, or None: no groups here
    txn_marker_timeout_s: float


@dataclass(frozen=True)
class LocalMarkerTarget:
    replica_manager: Any
    fetch_watchers: Any
    group_coordinator: Any
    txn_marker_timeout_s: float = DEFAULT_TIMEOUT_S


def _hosted_here(replica_manager, tp: TopicPartition) -> bool:
    """Kafka's ``getMagic`` test: a partition with no replica on this broker is unknown to a
    marker (the coordinator retries it at the partition's leader)."""
    return replica_manager.state(tp) is not None


def _append_marker(replica_manager, tp: TopicPartition, marker: TxnMarker):
    """Append ``marker``'s control batch to ``tp``: (error, offset acks=all waits for or -1)."""
    if not _hosted_here(replica_manager, tp):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    batch = rec.build_control_batch(
        rec.CONTROL_COMMIT if marker.commit else rec.CONTROL_ABORT,
        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch)
    try:
        result = replica_manager.append(tp, batch, produce_version=None,
                                        origin=AppendOrigin.COORDINATOR, required_acks=-1)
    except Exception:  # noqa: BLE001 - one partition's failure is that partition's answer
        log.exception("appending the transaction marker of producer %d to %s failed",
                      marker.producer_id, tp)
        return ErrorCode.UNKNOWN_SERVER_ERROR, -1
    if result.error != ErrorCode.NONE:
        log.debug("transaction marker of producer %d (epoch %d, coordinator epoch %d) refused "
                  "by %s: %s %s", marker.producer_id, marker.producer_epoch,
                  marker.coordinator_epoch, tp, ErrorCode(result.error).name, result.message)
        return ErrorCode(result.error), -1
    return ErrorCode.NONE, result.last_offset + 1


async def _complete_offsets_transaction(ctx: MarkerTarget, marker: TxnMarker,
                                        errors: dict[PartitionKey, ErrorCode]) -> None:
    """Hand the successful ``__consumer_offsets`` markers to the group coordinator."""
    partitions = [p for (topic, p), e in errors.items()
                  if topic == OFFSETS_TOPIC and e == ErrorCode.NONE]
    if not partitions:
        return
    if ctx.group_coordinator is None:
        return
    complete = ctx.group_coordinator.complete_transaction
    for partition in partitions:
        try:
            outcome = complete(partition, marker.producer_id, marker.commit)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # noqa: BLE001 - Kafka answers such a failure UNKNOWN_SERVER_ERROR
            log.exception("completing the transactional offsets of producer %d in %s-%d failed",
                          marker.producer_id, OFFSETS_TOPIC, partition)
            errors[(OFFSETS_TOPIC, partition)] = ErrorCode.UNKNOWN_SERVER_ERROR


async def write_markers(ctx: MarkerTarget, markers: list[TxnMarker], *,
                        timeout_s: float | None = None) -> list[dict[PartitionKey, ErrorCode]]:
    """Write each marker to its partitions; per marker (in order) the error of each partition.

    Appends run one partition at a time, yielding to the event loop between them; the waits
    for replication (in a cluster) run together, bounded by ``timeout_s`` (default
    ``ctx.txn_marker_timeout_s``). A partition named twice in a marker gets one
    marker and one answer.
    """
    replica_manager = ctx.replica_manager
    clustered = replica_manager.clustered
    results: list[dict[PartitionKey, ErrorCode]] = []
    waits: dict[tuple[int, str, int], tuple[TopicPartition, int]] = {}
    for i, marker in enumerate(markers):
        errors: dict[PartitionKey, ErrorCode] = {}
        results.append(errors)
        for topic, partition in marker.partitions:
            key = (topic, int(partition))
            if key in errors:
                continue
            tp = TopicPartition(topic, int(partition))
            error, required = _append_marker(replica_manager, tp, marker)
            errors[key] = error
            if error == ErrorCode.NONE and clustered:
                waits[(i, *key)] = (tp, required)
            await asyncio.sleep(0)  # let other connections in between appends
    if waits:
        replicated = await await_replication(
            replica_manager, ctx.fetch_watchers, waits,
            ctx.txn_marker_timeout_s if timeout_s is None else timeout_s)
        for (i, topic, partition), error in replicated.items():
            results[i][(topic, partition)] = ErrorCode(error)
    for marker, errors in zip(markers, results):
        await _complete_offsets_transaction(ctx, marker, errors)
    return results
