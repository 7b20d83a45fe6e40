"""Transactional produce verification (KIP-890 part 1, Kafka's
``transaction.partition.verification.enable``): before a partition leader appends a
producer's first transactional batch of a transaction, it asks the transaction coordinator
whether the partition was added to the producer's ongoing transaction (AddPartitionsToTxn v4
``verify_only``; a direct call when this broker is the coordinator). A late produce of a
transaction that already ended is refused instead of opening a transaction nobody will end.

Errors are translated as Kafka's ReplicaManager does for the produce response: retriable
coordinator errors become NOT_ENOUGH_REPLICAS (old clients retry it), PRODUCER_FENCED
INVALID_PRODUCER_EPOCH, and TRANSACTION_ABORTABLE INVALID_TXN_STATE for Produce before v11.

From Produce v12 (a transactions V2 client, KIP-890 part 2) the leader does not verify but
adds the partition to the transaction itself (AddPartitionsToTxn v5 without ``verify_only``, or
a direct call to the local coordinator): such a client sends no AddPartitionsToTxn of its own.
TxnOffsetCommit v5 adds the group's ``__consumer_offsets`` partition the same way.

A verification guard (``UnifiedLog.start_transaction_verification``) refuses the append with
INVALID_TXN_STATE when a marker for the producer lands between the verification and the append.
"""

from __future__ import annotations

import asyncio
import logging

from strata.common.errors import ErrorCode, error_code_of
from strata.common.types import TopicPartition
from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC
from strata.protocol import records as rec
from strata.protocol.codec import ApiKey, make, request_class, response_class
from strata.server.broker_channel import BrokerChannel

log = logging.getLogger(__name__)

VERIFY_VERSION = 4
ADD_VERSION = 5                      # AddPartitionsToTxn of a V2 transaction's partitions
FIRST_TXN_ABORTABLE_PRODUCE_VERSION = 11
FIRST_ADD_PRODUCE_VERSION = 12       # Kafka's produceRequestVersionToTransactionSupportedOperation
TV_2 = 2
# Kafka's add.partitions.to.txn.retry.backoff.ms and .max.ms: a V2 add answered
# CONCURRENT_TRANSACTIONS (the previous transaction's markers still being written) is asked
# again on the broker for this long before the producer is told to retry
ADD_RETRY_BACKOFF_S = 0.02
ADD_RETRY_MAX_S = 0.1
_RETRIABLE = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NETWORK_EXCEPTION,
                        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                        ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})


def transactional_producer(records: bytes | None) -> tuple[int, int] | None:
    """(producer id, epoch) of a transactional data batch, else None."""
    if not records or len(records) < rec.HEADER_SIZE:
        return None
    try:
        h = rec.read_header(records, 0)
    except Exception:  # noqa: BLE001 - the append validates and refuses it
        return None
    if not h.is_transactional or h.is_control:
        return None
    return h.producer_id, h.producer_epoch


class TxnVerifier:
    """Asks ``coordinator`` (on this broker) or the leader of the transactional id's
    ``__transaction_state`` partition whether a partition is in the producer's transaction."""

    def __init__(self, node_id: int, metadata, replica_manager, coordinator, *, security=None,
                 channel: BrokerChannel | None = None, verification_enabled: bool = True,
                 add_retry_backoff_s: float = ADD_RETRY_BACKOFF_S,
                 add_retry_max_s: float = ADD_RETRY_MAX_S):
        self.node_id = node_id
        # transaction.partition.verification.enable; the V2 add (Produce v12) is always done
        self.verification_enabled = verification_enabled
        self.add_retry_backoff_s = add_retry_backoff_s
        self.add_retry_max_s = add_retry_max_s
        self.metadata = metadata
        self.replica_manager = replica_manager
        self.coordinator = coordinator
        self.channel = channel or BrokerChannel(f"broker-{node_id}-txn-verifier",
                                                security=security)

    def applies_to(self, produce_version: int) -> bool:
        """Whether a transactional Produce of ``produce_version`` is verified or added here."""
        return self.verification_enabled or produce_version >= FIRST_ADD_PRODUCE_VERSION

    def start(self, tp: TopicPartition, producer_id: int, epoch: int) -> object | None:
        """The partition's verification guard, or None when there is nothing to verify (the
        producer's transaction is already ongoing there, or the partition is not here: its
        append answers the error)."""
        try:
            ulog = self.replica_manager.get_log(tp)
        except Exception:  # noqa: BLE001 - the append answers the partition's error
            return None
        return None if ulog is None else ulog.start_transaction_verification(producer_id, epoch)

    def abandon(self, tp: TopicPartition, producer_id: int, guard: object) -> None:
        """A refused verification's guard goes (no append will end it)."""
        ulog = self.replica_manager.get_log(tp)
        if ulog is not None:
            ulog.end_transaction_verification(producer_id, guard)

    async def verify(self, transactional_id: str, producer_id: int, epoch: int,
                     partitions: list[TopicPartition], produce_version: int
                     ) -> dict[TopicPartition, ErrorCode]:
        """A produce error per partition that may not be appended (none: all verified, or
        added from Produce v12)."""
        add = produce_version >= FIRST_ADD_PRODUCE_VERSION
        raw = await self._ask(transactional_id, producer_id, epoch, partitions, add=add)
        if add:
            raw = await self._retry_concurrent(transactional_id, producer_id, epoch, raw)
        out = {}
        for tp in partitions:
            error = raw.get((tp.topic, tp.partition), ErrorCode.NETWORK_EXCEPTION)
            if error == ErrorCode.NONE:
                continue
            if error in _RETRIABLE:
                error = ErrorCode.NOT_ENOUGH_REPLICAS
            elif error == ErrorCode.PRODUCER_FENCED:
                error = ErrorCode.INVALID_PRODUCER_EPOCH
            elif error == ErrorCode.TRANSACTION_ABORTABLE \
                    and produce_version < FIRST_TXN_ABORTABLE_PRODUCE_VERSION:
                error = ErrorCode.INVALID_TXN_STATE
            out[tp] = error
        return out

    async def _retry_concurrent(self, transactional_id: str, producer_id: int, epoch: int,
                                raw: dict[tuple[str, int], ErrorCode]
                                ) -> dict[tuple[str, int], ErrorCode]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.add_retry_max_s
        while True:
            busy = [TopicPartition(*k) for k, e in raw.items()
                    if e == ErrorCode.CONCURRENT_TRANSACTIONS]
            if not busy or loop.time() + self.add_retry_backoff_s >= deadline:
                return raw
            await asyncio.sleep(self.add_retry_backoff_s)
            raw = {**raw, **await self._ask(transactional_id, producer_id, epoch, busy, add=True)}

    async def add(self, transactional_id: str, producer_id: int, epoch: int,
                  partition: tuple[str, int]) -> ErrorCode:
        """The coordinator's answer to adding ``partition`` to the V2 transaction (TxnOffsetCommit
        v5's ``__consumer_offsets`` partition), untranslated."""
        raw = await self._ask(transactional_id, producer_id, epoch,
                              [TopicPartition(*partition)], add=True)
        raw = await self._retry_concurrent(transactional_id, producer_id, epoch, raw)
        return raw.get(tuple(partition), ErrorCode.NETWORK_EXCEPTION)

    async def _ask(self, transactional_id: str, producer_id: int, epoch: int,
                   partitions: list[TopicPartition], add: bool = False
                   ) -> dict[tuple[str, int], ErrorCode]:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        coordinator = self.coordinator
        metadata = self.metadata
        if coordinator is None or metadata.topic(TRANSACTION_STATE_TOPIC) is None:
            return {k: ErrorCode.COORDINATOR_NOT_AVAILABLE for k in keys}
        st = metadata.partition_state(TRANSACTION_STATE_TOPIC,
                                      coordinator.partition_for(transactional_id))
        if st is None or st.leader < 0:
            return {k: ErrorCode.COORDINATOR_NOT_AVAILABLE for k in keys}
        if st.leader == self.node_id:
            if add:
                error = await coordinator.add_partitions(transactional_id, producer_id, epoch,
                                                         keys, TV_2)
                return {k: error for k in keys}
            return coordinator.verify_partitions(transactional_id, producer_id, epoch, keys)
        node = next((b for b in metadata.live_brokers() if b.node_id == st.leader), None)
        if node is None:
            return {k: ErrorCode.COORDINATOR_NOT_AVAILABLE for k in keys}
        return await asyncio.to_thread(self._remote, node.host, node.port, transactional_id,
                                       producer_id, epoch, keys, add)

    def _remote(self, host: str, port: int, transactional_id: str, producer_id: int, epoch: int,
                keys: list[tuple[str, int]], add: bool = False
                ) -> dict[tuple[str, int], ErrorCode]:
        version = ADD_VERSION if add else VERIFY_VERSION
        rq = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, version)
        by_topic: dict[str, list[int]] = {}
        for topic, p in keys:
            by_topic.setdefault(topic, []).append(p)
        body = rq(transactions=(make(
            rq, "transactions", transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=epoch, verify_only=not add,
            topics=tuple(make(rq, "transactions.topics", name=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())),))
        try:
            response = self.channel.request(
                host, port, body, response_class(ApiKey.ADD_PARTITIONS_TO_TXN, version))
        except Exception as exc:  # noqa: BLE001 - the producer retries
            log.info("transaction verification with %s:%d failed: %s", host, port, exc)
            return {k: ErrorCode.NETWORK_EXCEPTION for k in keys}
        top = error_code_of(response.error_code)
        if top != ErrorCode.NONE:
            return {k: top for k in keys}
        out = {}
        for result in response.results_by_transaction:
            for t in result.topic_results:
                for p in t.results_by_partition:
                    out[(t.name, p.partition_index)] = error_code_of(p.partition_error_code)
        return out

    def close(self) -> None:
        self.channel.close()
