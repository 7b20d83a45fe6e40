"""The transaction coordinator: transactional ids, their producer ids and epochs, and the
two-phase end of each transaction, as Kafka's TransactionCoordinator: transactions V1, and V2
(KIP-890 part 2) for clients that end a transaction with EndTxn v5.

Like the group coordinator it does no I/O of its own and runs on one asyncio event loop, so
state needs no locks; it awaits only three things, through ports:

- ``TxnStateLog``: ``__transaction_state`` (``append(partition, [(key, value)])``, raising
  KafkaError; ``replay(partition)`` yielding the committed (key, value) records);
- ``MarkerSender``: ``send(marker) -> {(topic, partition): ErrorCode}``, which writes a
  COMMIT/ABORT marker to each partition's leader (``strata.server.txn_markers``);
- ``generate_producer_id()``.

State per transactional id (``TxnMetadata``) follows Kafka's ``TransactionMetadata``: a
transition is *prepared* (``pending`` set, nothing else changed), its record appended, and only
then *completed* (the metadata takes the new values). A failed append clears ``pending``. While
a transition is pending every other request for the id answers CONCURRENT_TRANSACTIONS.

Life of a transaction::

    Empty/Complete* --AddPartitionsToTxn/AddOffsetsToTxn--> Ongoing
    Ongoing --EndTxn(commit|abort)--> PrepareCommit|PrepareAbort   (client answered here)
    Prepare* --markers written to every partition--> CompleteCommit|CompleteAbort
    Ongoing --InitProducerId, or timeout--> (epoch bumped: PrepareEpochFence) --> PrepareAbort

Transactions V2 (``client_transaction_version`` 2, recorded with each transition as Kafka's
ClientTransactionVersion): every Prepare* bumps the producer epoch (epoch + 1, the last epoch
kept), the markers carry the bumped epoch, and EndTxn answers the producer the new id/epoch; an
exhausted epoch makes Complete* move to a new producer id at epoch 0. Partitions are added by
the partition leaders (a Produce v12 or TxnOffsetCommit v5 of the transaction) instead of the
client.

Invariants: a producer id/epoch reaches a client only after its record is durable in
``__transaction_state``; markers are written only after Prepare* is durable, so a coordinator
that fails over finishes them from the log (``load``); a completed transaction's markers are in
every one of its partitions before Complete* is written.

Ownership: a transactional id belongs to partition ``partition_for(id)`` of
``__transaction_state``; this coordinator serves the partitions ``load`` gave it (at the
partition's leader epoch, the *coordinator epoch* written into markers) and answers
NOT_COORDINATOR for others and COORDINATOR_LOAD_IN_PROGRESS while loading.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.offsets_records import RecordFormatError
from strata.coordinator.txn_records import (
    DEFAULT_TXN_TOPIC_PARTITIONS, TxnLogValue, TxnState, decode_key, decode_value, encode_key,
    encode_value, partition_for)

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 32767
MARKER_RETRY_BACKOFF_S = 0.1   # Kafka's marker channel retries after a metadata refresh

TopicPartition = tuple[str, int]

S = TxnState

TV_0 = 0
TV_2 = 2   # the first client transaction version that bumps the epoch at each end

# Kafka's TransactionState.validPreviousStates
_VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

# Kafka's names, as DescribeTransactions and ListTransactions report them
STATE_NAMES = {
    S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit",
    S.PREPARE_ABORT: "PrepareAbort", S.COMPLETE_COMMIT: "CompleteCommit",
    S.COMPLETE_ABORT: "CompleteAbort", S.DEAD: "Dead", S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}

# What an append error to __transaction_state becomes for the client (TransactionStateManager).
_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}

# Marker errors the channel retries (TransactionMarkerRequestCompletionHandler).
_MARKER_RETRIABLE = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.UNKNOWN_SERVER_ERROR})
# The producer or the coordinator moved on: this coordinator stops sending the markers.
_MARKER_FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH,
                            ErrorCode.TRANSACTION_COORDINATOR_FENCED})


# Writing Complete* is retried on these (Kafka re-enqueues the completion); others give up.
_RETRY_COMPLETE = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.UNKNOWN_SERVER_ERROR})


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps ``Short.MaxValue`` for fencing: a producer never gets epoch >= MaxValue - 1."""
    return epoch >= SHORT_MAX - 1


class TxnStateLog(Protocol):
    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None: ...

    def replay(self, partition: int) -> Iterable[tuple[bytes, bytes | None]]: ...


@dataclass(frozen=True)
class TxnMarker:
    """A COMMIT or ABORT marker for ``partitions`` (the marker writer's unit of work).
    ``transaction_version`` is WriteTxnMarkers v2's: the client transaction version of the
    transaction (2: the marker's epoch is above the transaction's data, KIP-890)."""
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
    transaction_version: int = 0


class MarkerSender(Protocol):
    async def send(self, marker: TxnMarker) -> Mapping[TopicPartition, ErrorCode]: ...


@dataclass(frozen=True)
class TxnCoordinatorConfig:
    """Kafka's broker configs of the same names (``transaction.*``)."""
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    num_partitions: int = DEFAULT_TXN_TOPIC_PARTITIONS

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "TxnCoordinatorConfig":
        def get(key: str, default: int) -> int:
            value = props.get(key)
            return default if value is None or str(value).strip() == "" else int(value)
        d = cls()
        return cls(
            transaction_max_timeout_ms=get("transaction.max.timeout.ms", d.transaction_max_timeout_ms),
            transactional_id_expiration_ms=get("transactional.id.expiration.ms",
                                               d.transactional_id_expiration_ms),
            abort_timed_out_transaction_cleanup_interval_ms=get(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                d.abort_timed_out_transaction_cleanup_interval_ms),
            remove_expired_transaction_cleanup_interval_ms=get(
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                d.remove_expired_transaction_cleanup_interval_ms),
            num_partitions=get("transaction.state.log.num.partitions", d.num_partitions))


@dataclass(frozen=True)
class _Transit:
    """The values a prepared transition gives the metadata once its record is durable."""
    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = TV_0

    def log_value(self) -> TxnLogValue:
        by_topic: dict[str, list[int]] = {}
        for topic, p in self.partitions:
            by_topic.setdefault(topic, []).append(p)
        return TxnLogValue(
            producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.timeout_ms, state=self.state,
            partitions=tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items())),
            last_update_ms=self.last_update_ms, start_ms=self.start_ms,
            previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version)


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    pending: TxnState | None = None
    failed_epoch_fence: bool = False   # a fence's bumped epoch may not be durable: reuse it
    next_producer_id: int = NO_PRODUCER_ID      # V2: the id Complete* moves to (epoch exhausted)
    client_transaction_version: int = TV_0      # of the last completed transition

    # ---- prepared transitions (Kafka's TransactionMetadata.prepare*) ------------------------

    def _prepare(self, state: TxnState, *, producer_id: int | None = None,
                 epoch: int | None = None, last_epoch: int | None = None,
                 timeout_ms: int | None = None, partitions: Iterable[TopicPartition] | None = None,
                 start_ms: int | None = None, now_ms: int,
                 next_producer_id: int = NO_PRODUCER_ID,
                 client_transaction_version: int = TV_0) -> _Transit:
        if self.pending is not None:
            raise IllegalTxnTransition(f"{self.transactional_id}: preparing {state.name} while "
                                       f"{self.pending.name} is pending")
        if self.state not in _VALID_PREVIOUS[state]:
            raise IllegalTxnTransition(f"{self.transactional_id}: {self.state.name} -> "
                                       f"{state.name} is not a valid transition")
        pid = self.producer_id if producer_id is None else producer_id
        transit = _Transit(
            producer_id=pid,
            previous_producer_id=self.producer_id if pid != self.producer_id else self.previous_producer_id,
            producer_epoch=self.producer_epoch if epoch is None else epoch,
            last_producer_epoch=self.last_producer_epoch if last_epoch is None else last_epoch,
            timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
            state=state,
            partitions=frozenset(self.partitions if partitions is None else partitions),
            start_ms=self.start_ms if start_ms is None else start_ms,
            last_update_ms=now_ms, next_producer_id=next_producer_id,
            client_transaction_version=client_transaction_version)
        self.pending = state
        return transit

    def prepare_fence_epoch(self, now_ms: int) -> _Transit:
        if self.producer_epoch >= SHORT_MAX:
            raise IllegalTxnTransition(f"{self.transactional_id}: cannot fence epoch {SHORT_MAX}")
        epoch = self.producer_epoch if self.failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, epoch=epoch, last_epoch=NO_PRODUCER_EPOCH,
                             now_ms=self.last_update_ms)

    def prepare_increment_epoch(self, timeout_ms: int, expected_epoch: int | None,
                                now_ms: int) -> _Transit | ErrorCode:
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch  # a retry of a success
        else:
            return ErrorCode.PRODUCER_FENCED
        return self._prepare(S.EMPTY, epoch=epoch, last_epoch=last, timeout_ms=timeout_ms,
                             partitions=(), start_ms=-1, now_ms=now_ms)

    def prepare_rotate_producer_id(self, producer_id: int, timeout_ms: int, now_ms: int,
                                   record_last_epoch: bool) -> _Transit:
        return self._prepare(S.EMPTY, producer_id=producer_id, epoch=0,
                             last_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             timeout_ms=timeout_ms, partitions=(), start_ms=-1, now_ms=now_ms)

    def prepare_add_partitions(self, added: Iterable[TopicPartition], now_ms: int,
                               client_transaction_version: int = TV_0) -> _Transit:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT) else self.start_ms
        return self._prepare(S.ONGOING, partitions=self.partitions | set(added), start_ms=start,
                             now_ms=now_ms, client_transaction_version=client_transaction_version)

    def prepare_abort_or_commit(self, state: TxnState, now_ms: int,
                                client_transaction_version: int = TV_0,
                                next_producer_id: int = NO_PRODUCER_ID) -> _Transit:
        if client_transaction_version >= TV_2:
            # V2: every end bumps the epoch (an exhausted one is at most Short.MaxValue here)
            return self._prepare(state, epoch=self.producer_epoch + 1,
                                 last_epoch=self.producer_epoch, now_ms=now_ms,
                                 next_producer_id=next_producer_id,
                                 client_transaction_version=client_transaction_version)
        return self._prepare(state, now_ms=now_ms)

    def prepare_complete(self, now_ms: int) -> _Transit:
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.failed_epoch_fence = False
        tv = self.client_transaction_version
        if tv >= TV_2:
            rotate = self.next_producer_id != NO_PRODUCER_ID
            return self._prepare(
                state, producer_id=self.next_producer_id if rotate else None,
                epoch=0 if rotate else None, last_epoch=self.producer_epoch, partitions=(),
                now_ms=now_ms, client_transaction_version=tv)
        return self._prepare(state, partitions=(), now_ms=now_ms)

    def prepare_dead(self) -> _Transit:
        return self._prepare(S.DEAD, partitions=(), now_ms=self.last_update_ms)

    def complete(self, transit: _Transit) -> None:
        """The transition's record is durable: take its values (Kafka's completeTransitionTo)."""
        if self.pending != transit.state:
            raise IllegalTxnTransition(f"{self.transactional_id}: completing {transit.state.name} "
                                       f"while {self.pending} is pending")
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms
        self.next_producer_id = transit.next_producer_id
        self.client_transaction_version = transit.client_transaction_version
        self.pending = None


class IllegalTxnTransition(Exception):
    """A transition Kafka's state machine does not allow (a coordinator bug, never client input)."""


@dataclass
class _TxnPartition:
    coordinator_epoch: int
    loading: bool = True
    txns: dict[str, TxnMetadata] = field(default_factory=dict)


@dataclass(frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class DescribedTxn:
    error: ErrorCode
    transactional_id: str
    state: str = ""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int = 0
    start_ms: int = -1
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True)
class ListedTxn:
    transactional_id: str
    producer_id: int
    state: str


class TransactionCoordinator:
    def __init__(self, txn_log: TxnStateLog, generate_producer_id: Callable[[], int],
                 markers: MarkerSender | None = None,
                 config: TxnCoordinatorConfig | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 topic_exists: Callable[[str], bool] = lambda topic: True,
                 marker_retry_backoff_s: float = MARKER_RETRY_BACKOFF_S,
                 transaction_version: Callable[[], int] = lambda: TV_0):
        self.log = txn_log
        self.generate_producer_id = generate_producer_id
        self.markers = markers
        self.config = config or TxnCoordinatorConfig()
        self.clock = clock
        self.topic_exists = topic_exists
        self.marker_retry_backoff_s = marker_retry_backoff_s
        # the cluster's finalized transaction.version: the version of the coordinator's own
        # aborts (timeouts, fences), as Kafka's transactionVersionLevel()
        self.transaction_version = transaction_version
        self._partitions: dict[int, _TxnPartition] = {}
        self._tasks: set[asyncio.Task] = set()
        self._periodic: list[asyncio.Task] = []
        self.active = True

    # ---- ownership ---------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    @property
    def owned_partitions(self) -> frozenset[int]:
        """Partitions loaded and served (not those still loading)."""
        return frozenset(p for p, e in self._partitions.items() if not e.loading)

    def coordinator_epoch(self, partition: int) -> int | None:
        entry = self._partitions.get(partition)
        return None if entry is None else entry.coordinator_epoch

    def load(self, partitions: Mapping[int, int]) -> None:
        """Become coordinator of ``{partition: coordinator epoch}``: replay each partition and
        finish the transactions it left in PrepareCommit/PrepareAbort."""
        for partition, epoch in partitions.items():
            entry = _TxnPartition(epoch)
            self._partitions[partition] = entry
            try:
                latest: dict[str, TxnLogValue | None] = {}
                for key, value in self.log.replay(partition):
                    try:
                        tid = decode_key(key)
                        if tid is None:
                            continue
                        latest[tid] = decode_value(value)
                    except RecordFormatError as exc:
                        log.warning("skipping a bad record of %s-%d: %s",
                                    "__transaction_state", partition, exc)
            except Exception:  # noqa: BLE001 - the partition stays unserved; a later load retries
                log.exception("loading __transaction_state-%d failed", partition)
                self._partitions.pop(partition, None)
                continue
            now = self.clock.milliseconds()
            for tid, v in latest.items():
                if v is None or v.state == S.DEAD:
                    continue
                entry.txns[tid] = TxnMetadata(
                    tid, v.producer_id, v.producer_epoch, v.transaction_timeout_ms, S(v.state),
                    {(t, p) for t, ps in v.partitions for p in ps}, v.start_ms, v.last_update_ms,
                    previous_producer_id=v.previous_producer_id,
                    next_producer_id=v.next_producer_id,
                    client_transaction_version=v.client_transaction_version)
            entry.loading = False
            pending = [m for m in entry.txns.values()
                       if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)]
            if entry.txns:
                log.info("loaded %d transactional id(s) of __transaction_state-%d at "
                         "coordinator epoch %d in %d ms; %d to complete", len(entry.txns),
                         partition, epoch, self.clock.milliseconds() - now, len(pending))
            for m in pending:
                self._spawn(self._complete_transaction(m, epoch))

    def unload(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            if self._partitions.pop(partition, None) is not None:
                log.info("unloaded the transactions of __transaction_state-%d", partition)

    def _entry(self, transactional_id: str) -> tuple[_TxnPartition | None, ErrorCode]:
        if not self.active:
            return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
        entry = self._partitions.get(self.partition_for(transactional_id))
        if entry is None:
            return None, ErrorCode.NOT_COORDINATOR
        if entry.loading:
            return None, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return entry, ErrorCode.NONE

    def _current(self, transactional_id: str, coordinator_epoch: int) -> TxnMetadata | None:
        entry = self._partitions.get(self.partition_for(transactional_id))
        if entry is None or entry.loading or entry.coordinator_epoch != coordinator_epoch:
            return None
        return entry.txns.get(transactional_id)

    # ---- the transaction log ------------------------------------------------------------------

    async def _append(self, meta: TxnMetadata, coordinator_epoch: int, transit: _Transit, *,
                      keep_pending_on: frozenset[ErrorCode] = frozenset()) -> ErrorCode:
        """Append ``transit`` and complete it (Kafka's appendTransactionToLog)."""
        tid = meta.transactional_id
        if self._current(tid, coordinator_epoch) is not meta:
            return ErrorCode.NOT_COORDINATOR   # unloaded since the transition was prepared
        value = None if transit.state == S.DEAD else encode_value(transit.log_value())
        try:
            await self.log.append(self.partition_for(tid), [(encode_key(tid), value)])
            error = ErrorCode.NONE
        except KafkaError as exc:
            error = _APPEND_ERRORS.get(ErrorCode(exc.code), ErrorCode(exc.code))
            log.info("%s: appending %s to __transaction_state failed: %s", tid,
                     transit.state.name, exc)
        except Exception:  # noqa: BLE001 - the client gets an error code, the broker goes on
            log.exception("%s: appending %s to __transaction_state failed", tid, transit.state.name)
            error = ErrorCode.UNKNOWN_SERVER_ERROR
        current = self._current(tid, coordinator_epoch)
        if error == ErrorCode.NONE:
            if current is not meta:
                return ErrorCode.NOT_COORDINATOR   # unloaded (and maybe reloaded) meanwhile
            meta.complete(transit)
            if transit.state == S.DEAD:
                self._partitions[self.partition_for(tid)].txns.pop(tid, None)
            return ErrorCode.NONE
        if current is meta and error not in keep_pending_on:
            meta.pending = None
        return error

    # ---- InitProducerId ------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                               expected: tuple[int, int] | None = None) -> InitProducerIdResult:
        """InitProducerId v0-5; ``expected`` is v3+'s (producer id, epoch) when not (-1, -1)."""
        if transactional_id is None:
            return InitProducerIdResult(ErrorCode.NONE, await self._new_producer_id(), 0)
        if transactional_id == "":
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST)
        if timeout_ms <= 0 or timeout_ms > self.config.transaction_max_timeout_ms:
            return InitProducerIdResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        entry, error = self._entry(transactional_id)
        if entry is None:
            return InitProducerIdResult(error)
        meta = entry.txns.get(transactional_id)
        if meta is None:
            try:
                pid = await self._new_producer_id()
            except KafkaError as exc:
                return InitProducerIdResult(ErrorCode(exc.code))
            entry, error = self._entry(transactional_id)   # the allocation may have awaited
            if entry is None:
                return InitProducerIdResult(error)
            meta = entry.txns.setdefault(transactional_id, TxnMetadata(
                transactional_id, pid, NO_PRODUCER_EPOCH, timeout_ms, S.EMPTY,
                last_update_ms=self.clock.milliseconds()))
        new_pid = NO_PRODUCER_ID
        if is_epoch_exhausted(meta.producer_epoch) and meta.pending is None \
                and meta.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            # allocated first: everything from the checks to the prepared transition is atomic
            try:
                new_pid = await self._new_producer_id()
            except KafkaError as exc:
                return InitProducerIdResult(ErrorCode(exc.code))
            if self._current(transactional_id, entry.coordinator_epoch) is not meta:
                return InitProducerIdResult(ErrorCode.NOT_COORDINATOR)
        epoch = entry.coordinator_epoch
        prepared = self._prepare_init(meta, timeout_ms, expected, new_pid)
        if isinstance(prepared, ErrorCode):
            return InitProducerIdResult(prepared)
        if prepared.state == S.PREPARE_EPOCH_FENCE:
            # abort the ongoing transaction first; the client retries and gets the next epoch
            result = await self._end(meta, epoch, prepared.producer_id, prepared.producer_epoch,
                                     commit=False, from_client=False)
            return InitProducerIdResult(result.error if result.error != ErrorCode.NONE
                                        else ErrorCode.CONCURRENT_TRANSACTIONS)
        error = await self._append(meta, epoch, prepared)
        if error != ErrorCode.NONE:
            log.info("%s: InitProducerId answers %s", transactional_id, error.name)
            return InitProducerIdResult(error)
        log.info("initialized transactional id %s with producer id %d and epoch %d on "
                 "__transaction_state-%d", transactional_id, meta.producer_id, meta.producer_epoch,
                 self.partition_for(transactional_id))
        return InitProducerIdResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)

    async def _new_producer_id(self) -> int:
        return await asyncio.to_thread(self.generate_producer_id)

    def _prepare_init(self, meta: TxnMetadata, timeout_ms: int,
                      expected: tuple[int, int] | None, new_pid: int) -> _Transit | ErrorCode:
        """Kafka's prepareInitProducerIdTransit; ``new_pid`` is used when the epochs of the
        current producer id are exhausted."""
        if meta.pending is not None:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if expected is not None:
            pid, ep = expected
            valid = (meta.producer_epoch == NO_PRODUCER_EPOCH or pid == meta.producer_id
                     or (pid == meta.previous_producer_id and is_epoch_exhausted(ep)))
            if not valid:
                return ErrorCode.PRODUCER_FENCED
        if meta.state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        now = self.clock.milliseconds()
        if meta.state in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT, S.EMPTY):
            if is_epoch_exhausted(meta.producer_epoch) and (
                    expected is None or expected[1] == meta.producer_epoch):
                return meta.prepare_rotate_producer_id(new_pid, timeout_ms, now,
                                                       expected is not None)
            return meta.prepare_increment_epoch(timeout_ms, None if expected is None else expected[1],
                                                now)
        if meta.state == S.ONGOING:
            return meta.prepare_fence_epoch(now)
        log.error("%s: InitProducerId found state %s", meta.transactional_id, meta.state.name)
        return ErrorCode.CONCURRENT_TRANSACTIONS

    # ---- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, producer_epoch: int
                        ) -> tuple[_TxnPartition | None, TxnMetadata | None, ErrorCode]:
        if not transactional_id:
            return None, None, ErrorCode.INVALID_REQUEST
        entry, error = self._entry(transactional_id)
        if entry is None:
            return None, None, error
        meta = entry.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return entry, None, ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return entry, None, ErrorCode.PRODUCER_FENCED
        return entry, meta, ErrorCode.NONE

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: Iterable[TopicPartition],
                             client_transaction_version: int = TV_0) -> ErrorCode:
        """AddPartitionsToTxn v0-3 (and AddOffsetsToTxn, with the group's offsets partition);
        with ``client_transaction_version`` 2 a partition leader's implicit add (V2)."""
        wanted = set(partitions)
        entry, meta, error = self._check_producer(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return error
        if meta.pending is not None or meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if meta.state == S.ONGOING and wanted <= meta.partitions:
            return ErrorCode.NONE
        transit = meta.prepare_add_partitions(wanted, self.clock.milliseconds(),
                                              client_transaction_version)
        return await self._append(meta, entry.coordinator_epoch, transit)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4+ ``verify_only`` (KIP-890): is each partition in the ongoing
        transaction? TRANSACTION_ABORTABLE where not."""
        parts = list(partitions)
        _, meta, error = self._check_producer(transactional_id, producer_id, producer_epoch)
        if meta is not None and meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            error = ErrorCode.CONCURRENT_TRANSACTIONS
        if meta is None or error != ErrorCode.NONE:
            return {tp: error for tp in parts}
        return {tp: ErrorCode.NONE if tp in meta.partitions else ErrorCode.TRANSACTION_ABORTABLE
                for tp in parts}

    # ---- EndTxn --------------------------------------------------------------------------------

    async def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              commit: bool, client_transaction_version: int = TV_0
                              ) -> InitProducerIdResult:
        """EndTxn: the error, with the producer id and epoch the client goes on with (v5
        reports them; ``client_transaction_version`` is 2 for v5, else 0)."""
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST)
        entry, error = self._entry(transactional_id)
        if entry is None:
            return InitProducerIdResult(error)
        meta = entry.txns.get(transactional_id)
        if meta is None:
            return InitProducerIdResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        return await self._end(meta, entry.coordinator_epoch, producer_id, producer_epoch, commit,
                               from_client=True,
                               client_transaction_version=client_transaction_version)

    async def _end(self, meta: TxnMetadata, coordinator_epoch: int, producer_id: int,
                   producer_epoch: int, commit: bool, from_client: bool,
                   client_transaction_version: int | None = None) -> InitProducerIdResult:
        """Kafka's endTransaction; the coordinator's own aborts (``from_client`` False) use
        the cluster's transaction version."""
        tid = meta.transactional_id
        tv = self.transaction_version() if client_transaction_version is None \
            else client_transaction_version
        fenced = meta.pending == S.PREPARE_EPOCH_FENCE
        # the transaction's own version decides how its epoch is checked (Kafka's
        # currentTxnMetadataIsAtLeastTransactionsV2); a fence is checked as V1
        v2 = not fenced and meta.client_transaction_version >= TV_2
        # V2: the retry of an end that bumped the epoch, or that moved to a new producer id
        retry_on_bump = v2 and meta.producer_epoch == producer_epoch + 1
        retry_on_overflow = (v2 and meta.previous_producer_id == producer_id
                             and producer_epoch == SHORT_MAX - 1 and meta.producer_epoch == 0)
        state = meta.state
        if v2:
            if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                valid_epoch = retry_on_bump
            elif state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                valid_epoch = retry_on_bump or retry_on_overflow
            else:
                valid_epoch = producer_epoch == meta.producer_epoch
        else:
            valid_epoch = ((not from_client or producer_epoch == meta.producer_epoch)
                           and producer_epoch >= meta.producer_epoch)
        if meta.producer_id != producer_id and not retry_on_overflow:
            return InitProducerIdResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if not valid_epoch and not (fenced and not from_client):
            return InitProducerIdResult(ErrorCode.PRODUCER_FENCED)
        if meta.pending is not None and not fenced:
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if state == S.ONGOING:
            target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            if fenced and target != S.PREPARE_ABORT:
                return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            next_pid = NO_PRODUCER_ID
            if tv >= TV_2 and not fenced and is_epoch_exhausted(meta.producer_epoch):
                try:   # V2 bumps past the last usable epoch: Complete* moves to a new id
                    next_pid = await self._new_producer_id()
                except KafkaError as exc:
                    return InitProducerIdResult(ErrorCode(exc.code))
                if self._current(tid, coordinator_epoch) is not meta or meta.pending is not None \
                        or meta.state != S.ONGOING:
                    return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if fenced:
                # the fence's bumped epoch goes into the PrepareAbort record itself
                meta.pending = None
                meta.producer_epoch = producer_epoch
                meta.last_producer_epoch = NO_PRODUCER_EPOCH
            transit = meta.prepare_abort_or_commit(target, self.clock.milliseconds(), tv, next_pid)
        elif state == S.COMPLETE_COMMIT and commit or state == S.COMPLETE_ABORT and not commit:
            return InitProducerIdResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
        elif state == S.PREPARE_COMMIT and commit or state == S.PREPARE_ABORT and not commit:
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        else:
            log.debug("%s: state %s, end %s asked", tid, state.name, "commit" if commit else "abort")
            return InitProducerIdResult(ErrorCode.INVALID_TXN_STATE)
        error = await self._append(meta, coordinator_epoch, transit)
        if error != ErrorCode.NONE:
            if fenced and self._current(tid, coordinator_epoch) is meta:
                meta.failed_epoch_fence = True
            return InitProducerIdResult(error)
        # PrepareCommit/PrepareAbort is durable: answer now, write the markers behind
        self._spawn(self._complete_transaction(meta, coordinator_epoch))
        if meta.next_producer_id != NO_PRODUCER_ID:
            # V2 past the last epoch: the producer goes on with the id Complete* moves to
            return InitProducerIdResult(ErrorCode.NONE, meta.next_producer_id, 0)
        return InitProducerIdResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)

    async def _complete_transaction(self, meta: TxnMetadata, coordinator_epoch: int) -> None:
        """Write the markers of a Prepare* transaction to each of its partitions, then
        Complete* (Kafka's TransactionMarkerChannelManager and its completion handler)."""
        tid = meta.transactional_id
        commit = meta.state == S.PREPARE_COMMIT
        remaining = set(meta.partitions)
        if meta.pending is not None or self._current(tid, coordinator_epoch) is not meta:
            return   # another task completes it
        # Complete* is pending while the markers go out: other requests for the id wait
        transit = meta.prepare_complete(self.clock.milliseconds())
        while remaining:
            if self._current(tid, coordinator_epoch) is not meta or self.markers is None:
                return   # unloaded: the next coordinator finishes it
            gone = {tp for tp in remaining if not self.topic_exists(tp[0])}
            remaining -= gone
            if not remaining:
                break
            marker = TxnMarker(meta.producer_id, meta.producer_epoch, commit, coordinator_epoch,
                               tuple(sorted(remaining)), meta.client_transaction_version)
            try:
                results = await self.markers.send(marker)
            except Exception:  # noqa: BLE001 - retried
                log.exception("%s: sending transaction markers failed", tid)
                results = {}
            for tp in list(remaining):
                error = results.get(tp, ErrorCode.NETWORK_EXCEPTION)
                if error == ErrorCode.NONE:
                    remaining.discard(tp)
                elif error in _MARKER_FENCED:
                    log.info("%s: the marker for %s failed with %s; no more markers for this "
                             "transaction", tid, tp, error.name)
                    return
                elif error in (ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                               ErrorCode.UNSUPPORTED_VERSION):
                    remaining.discard(tp)
                elif error not in _MARKER_RETRIABLE:
                    log.error("%s: the marker for %s failed with %s (retrying)", tid, tp, error.name)
            if remaining:
                await asyncio.sleep(self.marker_retry_backoff_s)
        while True:
            error = await self._append(meta, coordinator_epoch, transit,
                                       keep_pending_on=_RETRY_COMPLETE)
            if error == ErrorCode.NONE:
                log.debug("%s: transaction %s", tid, transit.state.name)
                return
            if error not in _RETRY_COMPLETE or self._current(tid, coordinator_epoch) is not meta:
                return
            await asyncio.sleep(self.marker_retry_backoff_s)

    # ---- timeouts and expiration -------------------------------------------------------------

    async def abort_timed_out_transactions(self) -> int:
        """Fence and abort every Ongoing transaction past its timeout; how many were started."""
        now = self.clock.milliseconds()
        started = 0
        for entry in list(self._partitions.values()):
            if entry.loading:
                continue
            for meta in list(entry.txns.values()):
                if meta.pending is not None or meta.state != S.ONGOING \
                        or meta.start_ms + meta.timeout_ms >= now:
                    continue
                transit = meta.prepare_fence_epoch(now)
                log.info("aborting transaction of %s (producer id %d, epoch %d): it timed out "
                         "after %d ms", meta.transactional_id, meta.producer_id,
                         meta.producer_epoch, meta.timeout_ms)
                self._spawn(self._end(meta, entry.coordinator_epoch, transit.producer_id,
                                      transit.producer_epoch, commit=False, from_client=False))
                started += 1
        return started

    async def expire_transactional_ids(self) -> int:
        """Remove ids idle longer than ``transactional.id.expiration.ms`` (a tombstone each)."""
        now = self.clock.milliseconds()
        expired = 0
        for entry in list(self._partitions.values()):
            if entry.loading:
                continue
            for meta in list(entry.txns.values()):
                if meta.pending is not None or meta.state not in (
                        S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT) \
                        or meta.last_update_ms > now - self.config.transactional_id_expiration_ms:
                    continue
                if await self._append(meta, entry.coordinator_epoch, meta.prepare_dead()) \
                        == ErrorCode.NONE:
                    expired += 1
        if expired:
            log.info("expired %d transactional id(s)", expired)
        return expired

    def start(self) -> None:
        """The periodic abort and expiration tasks (on the running loop)."""
        self._periodic = [
            asyncio.get_running_loop().create_task(self._every(
                self.config.abort_timed_out_transaction_cleanup_interval_ms,
                self.abort_timed_out_transactions)),
            asyncio.get_running_loop().create_task(self._every(
                self.config.remove_expired_transaction_cleanup_interval_ms,
                self.expire_transactional_ids))]

    async def _every(self, interval_ms: int, fn: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await fn()
            except Exception:  # noqa: BLE001 - the task goes on
                log.exception("transaction coordinator task %s failed", fn.__name__)

    def shutdown(self) -> None:
        self.active = False
        for task in [*self._periodic, *self._tasks]:
            task.cancel()
        self._partitions.clear()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- admin ---------------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> DescribedTxn:
        if not transactional_id:
            return DescribedTxn(ErrorCode.INVALID_REQUEST, transactional_id or "")
        entry, error = self._entry(transactional_id)
        if entry is None:
            return DescribedTxn(error, transactional_id)
        meta = entry.txns.get(transactional_id)
        if meta is None or meta.state == S.DEAD:
            return DescribedTxn(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, transactional_id)
        return DescribedTxn(ErrorCode.NONE, transactional_id, STATE_NAMES[meta.state],
                            meta.producer_id, meta.producer_epoch, meta.timeout_ms, meta.start_ms,
                            tuple(sorted(meta.partitions)))

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          min_duration_ms: int = -1) -> tuple[ErrorCode, list[ListedTxn], list[str]]:
        """ListTransactions: (error, transactions, unknown state filters)."""
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, [], []
        by_name = {name: s for s, name in STATE_NAMES.items()}
        wanted_states = set(states)
        unknown = sorted(s for s in wanted_states if s not in by_name)
        wanted_pids = set(producer_ids)
        now = self.clock.milliseconds()
        out = []
        for entry in self._partitions.values():
            if entry.loading:
                continue
            for meta in entry.txns.values():
                name = STATE_NAMES[meta.state]
                if meta.state == S.DEAD:
                    continue
                if wanted_states and name not in wanted_states:
                    continue
                if wanted_pids and meta.producer_id not in wanted_pids:
                    continue
                if min_duration_ms >= 0 and now - meta.start_ms <= min_duration_ms:
                    continue
                out.append(ListedTxn(meta.transactional_id, meta.producer_id, name))
        return ErrorCode.NONE, out, unknown
