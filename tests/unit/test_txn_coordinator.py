"""The transaction coordinator (``strata.coordinator.txn_coordinator``) against Apache Kafka's
``TransactionCoordinator`` / ``TransactionMetadata`` / ``TransactionStateManager`` /
``TransactionMarkerChannelManager`` (transactions V1).

Most tests port a case of Kafka's ``TransactionCoordinatorTest``, ``TransactionMetadataTest``,
``TransactionStateManagerTest`` or ``TransactionMarkerChannelManagerTest``; the Kafka test is
named in the docstring. Everything runs over in-memory fakes defined here:

- ``FakeTxnStateLog``: ``__transaction_state`` as (key, value) pairs per partition; an append
  can be made to fail with a chosen ``KafkaError(code=...)`` or to block until released
  (before or after the record is stored);
- ``FakeMarkerSender``: records every ``TxnMarker`` and answers per partition with scripted
  error codes (or blocks, or raises);
- ``FakePids``: the producer id generator (can block in its thread, or fail);
- ``MockClock`` from ``strata.common.clock``.

Coroutines run under ``asyncio.run`` (as the group coordinator tests do); a test that waits
for something that never happens fails on a timeout instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Callable

import pytest

from strata.common.clock import MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.txn_coordinator import (
    SHORT_MAX,
    TransactionCoordinator,
    TxnCoordinatorConfig,
    TxnMarker,
)
from strata.coordinator.txn_records import (
    TxnLogValue,
    TxnState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from support.waiting import eventually_async

E = ErrorCode
S = TxnState

NUM_PARTITIONS = 4
COORD_EPOCH = 7
TIMEOUT = 60_000
MAX_TIMEOUT = 900_000
EXPIRATION = 100_000
FIRST_PID = 1000
OLD_PID = 500          # the producer id of seeded (replayed) transactions
WAIT_S = 3.0           # a wait fails with its own message well before run()'s 10 s

TID = "txn-a"
T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


def ids_in_partition(partition: int, n: int, prefix: str = "tx") -> list[str]:
    out, i = [], 0
    while len(out) < n:
        tid = f"{prefix}-{i}"
        if partition_for(tid, NUM_PARTITIONS) == partition:
            out.append(tid)
        i += 1
    return out


P = partition_for(TID, NUM_PARTITIONS)


# =========================================================================== fakes

class Hold:
    """One blocked append (or pid generation): ``entered`` once it is waiting, ``release()``."""

    def __init__(self, when: Callable | None, store_first: bool):
        self.when = when
        self.store_first = store_first
        self.entered = asyncio.Event()
        self._release = asyncio.Event()

    def release(self) -> None:
        self._release.set()


class FakeTxnStateLog:
    """``__transaction_state`` in memory: (key, value) per partition, in append order.

    ``fail(code, times, when)`` makes the next ``times`` matching appends raise
    ``KafkaError(code=code)`` (``code`` may also be an exception instance to raise);
    ``hold(when, store_first)`` blocks the next matching append until released, with its
    record stored before blocking (``store_first``, like a local append waiting for
    replication) or only after. ``when`` sees (transactional id, decoded value or None)."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        self.attempts: list[tuple[int, str, TxnLogValue | None]] = []
        self._faults: list[list] = []
        self._holds: list[Hold] = []
        self.on_replay: Callable[[], None] | None = None

    # -- test controls
    def fail(self, code, *, times: int = 1, when: Callable | None = None) -> None:
        self._faults.append([when, code, times])

    def hold(self, *, when: Callable | None = None, store_first: bool = False) -> Hold:
        h = Hold(when, store_first)
        self._holds.append(h)
        return h

    def seed(self, tid: str, state: TxnState | None, *, pid: int = OLD_PID, epoch: int = 0,
             partitions=(), timeout_ms: int = TIMEOUT, start_ms: int = -1,
             last_update_ms: int = 0, previous_pid: int = -1) -> None:
        """Write a record directly (as a previous coordinator did); ``state=None``: tombstone."""
        if state is None:
            value = None
        else:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for t, p in partitions:
                by_topic[t].append(p)
            value = encode_value(TxnLogValue(
                producer_id=pid, producer_epoch=epoch, transaction_timeout_ms=timeout_ms,
                state=state, partitions=tuple((t, tuple(ps)) for t, ps in by_topic.items()),
                last_update_ms=last_update_ms, start_ms=start_ms, previous_producer_id=previous_pid))
        self.partitions[partition_for(tid, NUM_PARTITIONS)].append((encode_key(tid), value))

    # -- the port
    async def append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        decoded = [(decode_key(k), decode_value(v)) for k, v in records]
        for tid, value in decoded:
            self.attempts.append((partition, tid, value))
        hold = next((h for h in self._holds
                     if h.when is None or any(h.when(t, v) for t, v in decoded)), None)
        if hold is not None:
            self._holds.remove(hold)
            if hold.store_first:
                self.partitions[partition].extend(records)
            hold.entered.set()
            await hold._release.wait()
            if hold.store_first:
                return
        for fault in self._faults:
            when, code, times = fault
            if times > 0 and (when is None or any(when(t, v) for t, v in decoded)):
                fault[2] -= 1
                if isinstance(code, BaseException):
                    raise code
                raise KafkaError("append failed", code=code)
        self.partitions[partition].extend(records)

    def replay(self, partition: int):
        for i, record in enumerate(list(self.partitions.get(partition, ()))):
            if i == 1 and self.on_replay is not None:
                self.on_replay()
            yield record

    # -- reading back
    def values(self, tid: str) -> list[TxnLogValue | None]:
        return [decode_value(v) for k, v in self.partitions.get(partition_for(tid, NUM_PARTITIONS), ())
                if decode_key(k) == tid]

    def states(self, tid: str) -> list[str]:
        return ["tombstone" if v is None else v.state.name for v in self.values(tid)]

    def last(self, tid: str) -> TxnLogValue | None:
        return self.values(tid)[-1]

    def count(self) -> int:
        return sum(len(v) for v in self.partitions.values())


class FakeMarkerSender:
    """Records each marker and answers each of its partitions: the next scripted code of the
    partition, else its ``always`` code, else NONE. ``gate`` blocks sends; ``raise_next``
    makes the next sends raise (a lost connection)."""

    def __init__(self) -> None:
        self.sent: list[TxnMarker] = []
        self.script: dict[tuple[str, int], list[ErrorCode]] = defaultdict(list)
        self.always: dict[tuple[str, int], ErrorCode] = {}
        self.gate: asyncio.Event | None = None
        self.raise_next = 0

    async def send(self, marker: TxnMarker):
        self.sent.append(marker)
        if self.gate is not None:
            await self.gate.wait()
        if self.raise_next:
            self.raise_next -= 1
            raise ConnectionResetError("broker went away")
        out = {}
        for tp in marker.partitions:
            queue = self.script.get(tp)
            out[tp] = queue.pop(0) if queue else self.always.get(tp, E.NONE)
        return out

    def for_pid(self, pid: int) -> list[TxnMarker]:
        return [m for m in self.sent if m.producer_id == pid]


class FakePids:
    """Producer ids FIRST_PID, FIRST_PID+1...; called in a worker thread by the coordinator.
    ``block()`` holds the next call until ``release()``; ``error`` makes calls raise it."""

    def __init__(self) -> None:
        self.next = FIRST_PID
        self.calls = 0
        self.error: BaseException | None = None
        self._gate: threading.Event | None = None
        self.entered = threading.Event()

    def block(self) -> None:
        self._gate = threading.Event()
        self.entered.clear()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()

    def __call__(self) -> int:
        self.calls += 1
        gate = self._gate
        if gate is not None:
            self.entered.set()
            gate.wait(5)
            self._gate = None
        if self.error is not None:
            raise self.error
        pid = self.next
        self.next += 1
        return pid


# =========================================================================== harness

class Harness:
    def __init__(self, *, loaded=None, topic_exists=None, load_now: bool = True,
                 transaction_version: int = 0, **config):
        self.clock = MockClock()
        self.log = FakeTxnStateLog()
        self.markers = FakeMarkerSender()
        self.pids = FakePids()
        config.setdefault("num_partitions", NUM_PARTITIONS)
        config.setdefault("transaction_max_timeout_ms", MAX_TIMEOUT)
        config.setdefault("transactional_id_expiration_ms", EXPIRATION)
        self.config = TxnCoordinatorConfig(**config)
        kw = {} if topic_exists is None else {"topic_exists": topic_exists}
        kw["transaction_version"] = lambda: transaction_version
        self.coord = TransactionCoordinator(self.log, self.pids, self.markers, self.config,
                                            clock=self.clock, marker_retry_backoff_s=0.001, **kw)
        self.loaded = {p: COORD_EPOCH for p in range(NUM_PARTITIONS)} if loaded is None else loaded
        if load_now:
            self.coord.load(self.loaded)

    @property
    def now(self) -> int:
        return self.clock.milliseconds()

    async def init(self, tid: str | None = TID, timeout_ms: int = TIMEOUT, expected=None):
        return await self.coord.init_producer_id(tid, timeout_ms, expected)

    async def add(self, pid: int, epoch: int, *tps, tid: str = TID) -> ErrorCode:
        return await self.coord.add_partitions(tid, pid, epoch, tps or (T0,))

    async def end(self, pid: int, epoch: int, commit: bool = True, tid: str = TID):
        return await self.coord.end_transaction(tid, pid, epoch, commit)

    async def ongoing(self, *tps, tid: str = TID, timeout_ms: int = TIMEOUT):
        """A fresh id with an Ongoing transaction on ``tps``: (pid, epoch)."""
        r = await self.init(tid, timeout_ms)
        assert r.error == E.NONE, r
        assert await self.add(r.producer_id, r.producer_epoch, *(tps or (T0, T1)), tid=tid) == E.NONE
        return r.producer_id, r.producer_epoch

    async def completed(self, tid: str, state: str) -> None:
        await eventually_async(lambda: self.log.states(tid)[-1:] == [state],
                               f"{tid} in state {state}", WAIT_S)

    def state(self, tid: str = TID) -> str:
        d = self.coord.describe(tid)
        assert d.error == E.NONE, d
        return d.state

    def close(self) -> None:
        self.coord.shutdown()


async def settle(seconds: float = 0.03) -> None:
    """Let background work (marker retries every 1 ms) run for a while."""
    await asyncio.sleep(seconds)


def run(coro, timeout: float = 10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def run_now(coro):
    """Step a coroutine that must answer without suspending (used inside ``load``)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the coroutine suspended")


def state_is(state: TxnState):
    return lambda tid, value: value is not None and value.state == state


# =========================================================================== InitProducerId

def test_init_producer_id_without_transactional_id_returns_fresh_id_with_epoch_0():
    """shouldAcceptInitPidAndReturnNextPidWhenTransactionalIdIsNull"""
    async def main():
        h = Harness()
        a = await h.init(None)
        b = await h.init(None)
        assert (a.error, a.producer_id, a.producer_epoch) == (E.NONE, FIRST_PID, 0)
        assert (b.error, b.producer_id, b.producer_epoch) == (E.NONE, FIRST_PID + 1, 0)
        assert h.log.count() == 0
    run(main())


def test_init_producer_id_with_empty_transactional_id_is_invalid_request():
    """shouldReturnInvalidRequestWhenTransactionalIdIsEmpty"""
    async def main():
        h = Harness()
        r = await h.init("")
        assert (r.error, r.producer_id, r.producer_epoch) == (E.INVALID_REQUEST, -1, -1)
        assert h.pids.calls == 0 and h.log.count() == 0
    run(main())


@pytest.mark.parametrize("timeout_ms", [0, -1, MAX_TIMEOUT + 1])
def test_init_producer_id_rejects_a_timeout_out_of_range(timeout_ms):
    """TransactionStateManager.validateTransactionTimeoutMs: 0 < timeout <= max."""
    async def main():
        h = Harness()
        r = await h.init(TID, timeout_ms)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.INVALID_TRANSACTION_TIMEOUT, -1, -1)
        assert h.log.count() == 0
        assert (await h.init(TID, MAX_TIMEOUT)).error == E.NONE   # the maximum itself is fine
    run(main())


def test_init_producer_id_for_a_new_id_gives_epoch_0_and_writes_an_empty_record():
    """shouldInitPidWithEpochZeroForNewTransactionalId"""
    async def main():
        h = Harness()
        r = await h.init(TID, 12_345)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        records = h.log.partitions[P]
        assert len(records) == 1
        key, value = records[0]
        assert decode_key(key) == TID
        v = decode_value(value)
        assert v.state == S.EMPTY
        assert (v.producer_id, v.producer_epoch, v.transaction_timeout_ms) == (FIRST_PID, 0, 12_345)
        assert v.partitions == () and v.start_ms == -1 and v.last_update_ms == h.now
        d = h.coord.describe(TID)
        assert (d.state, d.producer_id, d.producer_epoch, d.timeout_ms) == ("Empty", FIRST_PID, 0, 12_345)
    run(main())


def test_init_producer_id_with_expected_ids_for_an_unknown_id_gives_a_new_id_with_epoch_0():
    """shouldGenerateNewProducerIdIfNoStateAndProducerIdAndEpochProvided"""
    async def main():
        h = Harness()
        r = await h.init(TID, expected=(42, 3))
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
    run(main())


def test_second_init_producer_id_bumps_the_epoch_and_takes_the_new_timeout():
    """shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingEmptyTransaction"""
    async def main():
        h = Harness()
        first = await h.init(TID, 5_000)
        h.clock.advance_ms(10)
        second = await h.init(TID, 10)
        assert (second.error, second.producer_id, second.producer_epoch) == \
            (E.NONE, first.producer_id, 1)
        v = h.log.last(TID)
        assert (v.state, v.producer_epoch, v.transaction_timeout_ms, v.last_update_ms) == \
            (S.EMPTY, 1, 10, h.now)
        assert h.coord.describe(TID).timeout_ms == 10
        assert h.pids.calls == 1
    run(main())


@pytest.mark.parametrize("commit", [True, False])
def test_init_producer_id_after_a_completed_transaction_bumps_the_epoch(commit):
    """shouldIncrementEpochAndUpdateMetadataOnHandleInitPidWhenExistingComplete{Commit,Abort}Transaction"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing()
        assert (await h.end(pid, epoch, commit)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch + 1)
        assert h.log.last(TID).state == S.EMPTY
    run(main())


def test_not_coordinator_for_an_id_whose_partition_is_not_loaded():
    """shouldRespondWithNotCoordinatorOn{InitPid,AddPartitions,EndTxn}WhenNotCoordinator"""
    async def main():
        h = Harness(loaded={p: COORD_EPOCH for p in range(NUM_PARTITIONS) if p != P})
        assert (await h.init()).error == E.NOT_COORDINATOR
        assert await h.add(1, 0) == E.NOT_COORDINATOR
        assert (await h.end(1, 0)).error == E.NOT_COORDINATOR
        assert h.coord.verify_partitions(TID, 1, 0, [T0]) == {T0: E.NOT_COORDINATOR}
        assert h.coord.describe(TID).error == E.NOT_COORDINATOR
        assert h.pids.calls == 0 and h.log.count() == 0
        assert P not in h.coord.owned_partitions
    run(main())


def test_coordinator_load_in_progress_while_the_partition_is_being_replayed():
    """shouldRespondWithCoordinatorLoadInProgressOn{InitPid,AddPartitions,EndTxn}WhenCoordinatorLoading,
    testDescribeTransactionsWhileCoordinatorLoading"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=3, last_update_ms=h.now)
        h.log.seed(TID, S.ONGOING, epoch=3, partitions=[T0], start_ms=h.now, last_update_ms=h.now)
        seen = {}

        def during_load():
            seen["describe"] = h.coord.describe(TID).error
            seen["init"] = run_now(h.coord.init_producer_id(TID, TIMEOUT)).error
            seen["add"] = run_now(h.coord.add_partitions(TID, OLD_PID, 3, [T1]))
            seen["end"] = run_now(h.coord.end_transaction(TID, OLD_PID, 3, True)).error
            seen["verify"] = h.coord.verify_partitions(TID, OLD_PID, 3, [T0])[T0]
            seen["owned"] = P in h.coord.owned_partitions
        h.log.on_replay = during_load
        h.coord.load({P: COORD_EPOCH})
        assert seen == {"describe": E.COORDINATOR_LOAD_IN_PROGRESS,
                        "init": E.COORDINATOR_LOAD_IN_PROGRESS,
                        "add": E.COORDINATOR_LOAD_IN_PROGRESS,
                        "end": E.COORDINATOR_LOAD_IN_PROGRESS,
                        "verify": E.COORDINATOR_LOAD_IN_PROGRESS,
                        "owned": False}
        assert h.state() == "Ongoing"
        assert h.coord.coordinator_epoch(P) == COORD_EPOCH and P in h.coord.owned_partitions
    run(main())


def test_coordinator_not_available_after_shutdown():
    """handleListTransactions / handleDescribeTransactions when !isActive."""
    async def main():
        h = Harness()
        await h.init()
        h.close()
        assert (await h.init()).error == E.COORDINATOR_NOT_AVAILABLE
        assert h.coord.describe(TID).error == E.COORDINATOR_NOT_AVAILABLE
        assert h.coord.list_transactions()[0] == E.COORDINATOR_NOT_AVAILABLE
    run(main())


def test_init_producer_id_fails_with_the_generator_error_and_creates_nothing():
    """handleInitProducerId: generateProducerId() Failure -> Errors.forException."""
    async def main():
        h = Harness()
        h.pids.error = KafkaError("no block", code=E.COORDINATOR_LOAD_IN_PROGRESS)
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (E.COORDINATOR_LOAD_IN_PROGRESS, -1, -1)
        assert h.coord.describe(TID).error == E.TRANSACTIONAL_ID_NOT_FOUND
        h.pids.error = None
        assert (await h.init()).error == E.NONE
    run(main())


def test_init_while_ongoing_fences_the_producer_aborts_and_answers_concurrent_transactions():
    """shouldAbortTransactionOnHandleInitPidWhenExistingTransactionInOngoingState: the epoch is
    bumped, PrepareAbort is written with it, ABORT markers carry it, the client is told to
    retry, and its retry after CompleteAbort bumps once more."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1, U0)
        start = h.log.last(TID).start_ms
        h.clock.advance_ms(5)
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (E.CONCURRENT_TRANSACTIONS, -1, -1)
        prepare = next(v for v in h.log.values(TID) if v.state == S.PREPARE_ABORT)
        assert (prepare.producer_id, prepare.producer_epoch) == (pid, epoch + 1)
        assert prepare.partitions == (("t", (0, 1)), ("u", (0,)))
        assert prepare.start_ms == start and prepare.last_update_ms == h.now
        await h.completed(TID, "COMPLETE_ABORT")
        assert h.markers.sent == [TxnMarker(pid, epoch + 1, False, COORD_EPOCH, (T0, T1, U0))]
        complete = h.log.last(TID)
        assert (complete.producer_epoch, complete.partitions) == (epoch + 1, ())
        # the old producer is fenced
        assert (await h.end(pid, epoch, commit=True)).error == E.PRODUCER_FENCED
        assert await h.add(pid, epoch, T0) == E.PRODUCER_FENCED
        retry = await h.init()
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, pid, epoch + 2)
        assert h.log.states(TID) == ["EMPTY", "ONGOING", "PREPARE_ABORT", "COMPLETE_ABORT", "EMPTY"]
    run(main())


@pytest.mark.parametrize("commit", [True, False])
def test_init_while_prepare_commit_or_abort_answers_concurrent_transactions(commit):
    """shouldWaitForCommitToCompleteOnHandleInitPidAndExistingTransactionInPrepare{Commit,Abort}State"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing()
        h.markers.gate = asyncio.Event()
        assert (await h.end(pid, epoch, commit)).error == E.NONE
        await eventually_async(lambda: h.markers.sent, "a marker request", WAIT_S)
        before = h.log.count()
        assert (await h.init()).error == E.CONCURRENT_TRANSACTIONS
        assert (await h.init(expected=(pid, epoch))).error == E.CONCURRENT_TRANSACTIONS
        assert h.log.count() == before
        h.markers.gate.set()
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        assert (await h.init()).producer_epoch == epoch + 1
    run(main())


def test_init_while_a_transition_is_pending_answers_concurrent_transactions():
    """prepareInitProducerIdTransit: pendingTransitionInProgress -> CONCURRENT_TRANSACTIONS
    (shouldNotBumpEpochWithPendingTransaction)."""
    async def main():
        h = Harness()
        r = await h.init()
        hold = h.log.hold(when=state_is(S.ONGOING))
        add = asyncio.create_task(h.add(r.producer_id, r.producer_epoch, T0))
        await hold.entered.wait()
        assert (await h.init()).error == E.CONCURRENT_TRANSACTIONS
        assert (await h.init(expected=(r.producer_id, 10))).error == E.CONCURRENT_TRANSACTIONS
        hold.release()
        assert await add == E.NONE
        assert h.state() == "Ongoing"
    run(main())


def test_failed_fence_append_does_not_bump_the_epoch_twice():
    """shouldNotRepeatedlyBumpEpochDueToInitPidDuringOngoingTxnIfAppendToLogFails"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.ONGOING, epoch=5, partitions=[T0], start_ms=h.now, last_update_ms=h.now)
        h.coord.load(h.loaded)
        h.log.fail(E.NOT_ENOUGH_REPLICAS, times=2, when=state_is(S.PREPARE_ABORT))
        for _ in range(2):
            r = await h.init()
            assert (r.error, r.producer_id, r.producer_epoch) == (E.COORDINATOR_NOT_AVAILABLE, -1, -1)
            d = h.coord.describe(TID)
            assert (d.state, d.producer_epoch) == ("Ongoing", 6)   # bumped once, not returned
        assert (await h.init()).error == E.CONCURRENT_TRANSACTIONS
        attempts = [v.producer_epoch for _, t, v in h.log.attempts if v.state == S.PREPARE_ABORT]
        assert attempts == [6, 6, 6]
        await h.completed(TID, "COMPLETE_ABORT")
        assert [m.producer_epoch for m in h.markers.sent] == [6]
        assert h.log.last(TID).producer_epoch == 6
        assert (await h.init()).producer_epoch == 7
    run(main())


def test_fencing_an_exhausted_epoch_uses_max_and_the_retry_rotates_the_producer_id():
    """shouldUseLastEpochToFenceWhenEpochsAreExhausted, then shouldGenerateNewProducerIdIfEpochsExhausted"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.ONGOING, epoch=SHORT_MAX - 1, partitions=[T0, U0], start_ms=h.now,
                   last_update_ms=h.now)
        h.coord.load(h.loaded)
        assert (await h.init()).error == E.CONCURRENT_TRANSACTIONS
        prepare = h.log.values(TID)[1]
        assert (prepare.state, prepare.producer_id, prepare.producer_epoch) == \
            (S.PREPARE_ABORT, OLD_PID, SHORT_MAX)
        await h.completed(TID, "COMPLETE_ABORT")
        assert h.markers.sent == [TxnMarker(OLD_PID, SHORT_MAX, False, COORD_EPOCH, (T0, U0))]
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        v = h.log.last(TID)
        assert (v.state, v.producer_id, v.producer_epoch, v.previous_producer_id) == \
            (S.EMPTY, FIRST_PID, 0, OLD_PID)
        # the old producer id is gone for good
        assert await h.add(OLD_PID, SHORT_MAX, T0) == E.INVALID_PRODUCER_ID_MAPPING
        assert (await h.init()).producer_id == FIRST_PID    # next bump keeps the new id
    run(main())


def test_an_exhausted_epoch_in_empty_state_rotates_the_producer_id():
    """shouldGenerateNewProducerIdIfEpochsExhausted"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=SHORT_MAX - 1, last_update_ms=h.now)
        h.coord.load(h.loaded)
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        assert h.log.last(TID).previous_producer_id == OLD_PID
    run(main())


def test_init_with_the_current_epoch_bumps_and_its_retry_gets_the_same_epoch():
    """testInitProducerIdWithCurrentEpochProvided"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=10, last_update_ms=h.now)
        h.coord.load(h.loaded)
        r = await h.init(expected=(OLD_PID, 10))
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, OLD_PID, 11)
        retry = await h.init(expected=(OLD_PID, 10))
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, OLD_PID, 11)
        assert h.coord.describe(TID).producer_epoch == 11
    run(main())


def test_init_with_a_stale_epoch_after_another_producer_initialized_is_fenced():
    """testInitProducerIdStaleCurrentEpochProvided"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=10, last_update_ms=h.now)
        h.coord.load(h.loaded)
        assert (await h.init()).producer_epoch == 11
        r = await h.init(expected=(OLD_PID, 10))
        assert (r.error, r.producer_id, r.producer_epoch) == (E.PRODUCER_FENCED, -1, -1)
    run(main())


def test_init_with_an_epoch_older_than_the_loaded_one_is_fenced():
    """testInitProducerIdWithNoLastProducerData: the last epoch is not in the log."""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=11, last_update_ms=h.now)
        h.coord.load(h.loaded)
        assert (await h.init(expected=(OLD_PID, 10))).error == E.PRODUCER_FENCED
    run(main())


def test_init_with_a_producer_id_that_is_not_the_current_one_is_fenced():
    """testFenceProducerWhenMappingExistsWithDifferentProducerId"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, pid=OLD_PID + 1, previous_pid=OLD_PID, epoch=5, last_update_ms=h.now)
        h.coord.load(h.loaded)
        assert (await h.init(expected=(OLD_PID, 10))).error == E.PRODUCER_FENCED
        assert (await h.init(expected=(12345, 5))).error == E.PRODUCER_FENCED
        assert h.coord.describe(TID).producer_epoch == 5
    run(main())


def test_retry_of_init_after_a_producer_id_rotation_returns_the_rotated_id():
    """testRetryInitProducerIdAfterProducerIdRotation, testInitProducerIdWithInvalidEpochAfterProducerIdRotation"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=SHORT_MAX - 1, last_update_ms=h.now)
        h.coord.load(h.loaded)
        r = await h.init(expected=(OLD_PID, SHORT_MAX - 1))
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        retry = await h.init(expected=(OLD_PID, SHORT_MAX - 1))
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, FIRST_PID, 0)
        stale = await h.init(expected=(OLD_PID, SHORT_MAX - 2))
        assert (stale.error, stale.producer_id, stale.producer_epoch) == (E.PRODUCER_FENCED, -1, -1)
        assert h.pids.calls == 1
    run(main())


# =========================================================================== AddPartitionsToTxn

def test_add_partitions_rejects_unknown_ids_wrong_producer_ids_and_wrong_epochs():
    """shouldRespondWithInvalidPidMappingOnAddPartitionsToTransactionWhenTransactionalIdNotPresent,
    shouldRespondWithProducerFencedOnAddPartitionsWhenEpochsAreDifferent,
    shouldRespondWithInvalidRequestAddPartitionsToTransactionWhenTransactionalIdIsEmpty"""
    async def main():
        h = Harness()
        assert await h.add(1, 0, T0) == E.INVALID_PRODUCER_ID_MAPPING
        r = await h.init()
        assert await h.add(r.producer_id + 1, r.producer_epoch, T0) == E.INVALID_PRODUCER_ID_MAPPING
        assert await h.add(r.producer_id, r.producer_epoch + 1, T0) == E.PRODUCER_FENCED
        assert await h.add(r.producer_id, r.producer_epoch - 1, T0) == E.PRODUCER_FENCED
        assert await h.coord.add_partitions("", r.producer_id, 0, [T0]) == E.INVALID_REQUEST
        assert h.log.states(TID) == ["EMPTY"] and h.state() == "Empty"
    run(main())


def test_add_partitions_records_ongoing_with_the_partitions_and_the_first_start_time():
    """shouldAppendNewMetadataToLogOnAddPartitionsWhenPartitionsAdded,
    TransactionMetadataTest.testTolerateTimeShiftDuringAddPartitions (start time only on the first add)"""
    async def main():
        h = Harness()
        r = await h.init()
        h.clock.advance_ms(100)
        first_add = h.now
        assert await h.add(r.producer_id, r.producer_epoch, T1, T0) == E.NONE
        v = h.log.last(TID)
        assert (v.state, v.producer_id, v.producer_epoch) == (S.ONGOING, r.producer_id, r.producer_epoch)
        assert v.partitions == (("t", (0, 1)),)
        assert (v.start_ms, v.last_update_ms) == (first_add, first_add)
        h.clock.advance_ms(100)
        assert await h.add(r.producer_id, r.producer_epoch, U0) == E.NONE
        v = h.log.last(TID)
        assert v.partitions == (("t", (0, 1)), ("u", (0,)))
        assert (v.start_ms, v.last_update_ms) == (first_add, h.now)
        d = h.coord.describe(TID)
        assert (d.state, d.start_ms, d.partitions) == ("Ongoing", first_add, (T0, T1, U0))
    run(main())


def test_add_partitions_already_in_the_transaction_answers_none_without_a_record():
    """shouldRespondWithErrorsNoneOnAddPartitionWhenNoErrorsAndPartitionsTheSame"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1)
        before = h.log.count()
        assert await h.add(pid, epoch, T0) == E.NONE
        assert await h.add(pid, epoch, T1, T0) == E.NONE
        assert h.log.count() == before
    run(main())


@pytest.mark.parametrize("commit", [True, False])
def test_add_partitions_while_prepare_commit_or_abort_answers_concurrent_transactions(commit):
    """shouldRespondWithConcurrentTransactionsOnAddPartitionsWhenStateIsPrepareCommit,
    shouldRespondWithConcurrentTransactionOnAddPartitionsWhenStateIsPrepareAbort"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing()
        h.markers.always[T0] = E.NOT_LEADER_OR_FOLLOWER
        assert (await h.end(pid, epoch, commit)).error == E.NONE
        await eventually_async(lambda: len(h.markers.sent) >= 2, "two marker requests", WAIT_S)
        assert await h.add(pid, epoch, U0) == E.CONCURRENT_TRANSACTIONS
        assert await h.add(pid, epoch, T0) == E.CONCURRENT_TRANSACTIONS
        del h.markers.always[T0]
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        assert await h.add(pid, epoch, U0) == E.NONE
    run(main())


def test_add_partitions_while_a_transition_is_pending_answers_concurrent_transactions():
    """handleAddPartitionsToTransaction: pendingTransitionInProgress -> CONCURRENT_TRANSACTIONS"""
    async def main():
        h = Harness()
        r = await h.init()
        hold = h.log.hold(when=state_is(S.ONGOING))
        first = asyncio.create_task(h.add(r.producer_id, r.producer_epoch, T0))
        await hold.entered.wait()
        assert await h.add(r.producer_id, r.producer_epoch, T1) == E.CONCURRENT_TRANSACTIONS
        assert h.state() == "Empty"       # nothing is applied before the record is durable
        hold.release()
        assert await first == E.NONE
        assert h.coord.describe(TID).partitions == (T0,)
        assert await h.add(r.producer_id, r.producer_epoch, T1) == E.NONE
    run(main())


@pytest.mark.parametrize("commit", [True, False])
def test_add_partitions_after_a_completed_transaction_starts_a_new_one(commit):
    """shouldRespondWithSuccessOnAddPartitionsWhenStateIsComplete{Commit,Abort}"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1)
        assert (await h.end(pid, epoch, commit)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        h.clock.advance_ms(1000)
        assert await h.add(pid, epoch, U0) == E.NONE
        v = h.log.last(TID)
        assert (v.state, v.partitions, v.start_ms) == (S.ONGOING, (("u", (0,)),), h.now)
    run(main())


# =========================================================================== verify_partitions

def test_verify_partitions_reports_which_partitions_are_in_the_transaction():
    """testVerifyPartitionHandling, shouldRespondWithErrorsNoneOnAddPartitionWhenOngoingVerifyOnlyAndPartitionsTheSame,
    shouldRespondWithInvalidTxnStateWhenVerifyOnlyAndPartitionNotPresent"""
    async def main():
        h = Harness()
        assert h.coord.verify_partitions(TID, 1, 0, [T0]) == {T0: E.INVALID_PRODUCER_ID_MAPPING}
        pid, epoch = await h.ongoing(T0)
        before = h.log.count()
        assert h.coord.verify_partitions(TID, pid, epoch, [T0, T1]) == \
            {T0: E.NONE, T1: E.TRANSACTION_ABORTABLE}
        assert h.coord.verify_partitions(TID, pid, epoch + 1, [T0]) == {T0: E.PRODUCER_FENCED}
        assert h.coord.verify_partitions(TID, pid + 1, epoch, [T0, T1]) == \
            {T0: E.INVALID_PRODUCER_ID_MAPPING, T1: E.INVALID_PRODUCER_ID_MAPPING}
        assert h.coord.verify_partitions("", pid, epoch, [T0]) == {T0: E.INVALID_REQUEST}
        assert h.log.count() == before          # verification never writes
        h.markers.gate = asyncio.Event()
        assert (await h.end(pid, epoch)).error == E.NONE
        assert h.coord.verify_partitions(TID, pid, epoch, [T0]) == {T0: E.CONCURRENT_TRANSACTIONS}
        h.markers.gate.set()
        await h.completed(TID, "COMPLETE_COMMIT")
        assert h.coord.verify_partitions(TID, pid, epoch, [T0]) == {T0: E.TRANSACTION_ABORTABLE}
    run(main())


# =========================================================================== EndTxn

@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_answers_sends_markers_then_completes(commit):
    """shouldAppendPrepare{Commit,Abort}ToLogOnEndTxnWhenStatusIsOngoingAndResultIs{Commit,Abort},
    TransactionMarkerChannelManagerTest.shouldCompleteAppendToLogOnEndTxnWhenSendMarkersSucceed"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1, U0)
        start = h.log.last(TID).start_ms
        h.markers.gate = asyncio.Event()
        h.clock.advance_ms(50)
        r = await h.end(pid, epoch, commit)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch)
        prepare = h.log.last(TID)
        assert prepare.state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
        assert (prepare.producer_id, prepare.producer_epoch) == (pid, epoch)
        assert prepare.partitions == (("t", (0, 1)), ("u", (0,)))
        assert (prepare.start_ms, prepare.last_update_ms) == (start, h.now)
        # answered before any marker was acknowledged
        assert h.state() == ("PrepareCommit" if commit else "PrepareAbort")
        h.markers.gate.set()
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        assert h.markers.sent == [TxnMarker(pid, epoch, commit, COORD_EPOCH, (T0, T1, U0))]
        complete = h.log.last(TID)
        assert (complete.producer_id, complete.producer_epoch, complete.partitions) == (pid, epoch, ())
        assert complete.start_ms == start
        d = h.coord.describe(TID)
        assert (d.state, d.partitions) == ("CompleteCommit" if commit else "CompleteAbort", ())
    run(main())


def test_end_txn_retry_after_completion_and_the_opposite_result():
    """shouldReturnOkOnEndTxnWhenStatusIsComplete{Commit,Abort}AndResultIs{Commit,Abort},
    shouldReturnInvalidTxnRequestOnEndTxnRequestWhenStatusIsComplete{Abort,Commit}AndResultIsNot{Abort,Commit}"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing()
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        before = h.log.count()
        retry = await h.end(pid, epoch, True)
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, pid, epoch)
        assert (await h.end(pid, epoch, False)).error == E.INVALID_TXN_STATE
        assert await h.add(pid, epoch, T0) == E.NONE
        assert (await h.end(pid, epoch, False)).error == E.NONE
        await h.completed(TID, "COMPLETE_ABORT")
        assert (await h.end(pid, epoch, False)).error == E.NONE
        assert (await h.end(pid, epoch, True)).error == E.INVALID_TXN_STATE
        assert h.log.count() == before + 3       # Ongoing, PrepareAbort, CompleteAbort only
    run(main())


def test_end_txn_while_markers_are_still_failing_answers_concurrent_transactions():
    """shouldReturnConcurrentTransactionsOnEndTxnRequestWhenStatusIsPrepareCommit"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1)
        h.markers.always[T1] = E.NOT_ENOUGH_REPLICAS
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await eventually_async(lambda: len(h.markers.sent) >= 3, "three marker requests", WAIT_S)
        r = await h.end(pid, epoch, True)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.CONCURRENT_TRANSACTIONS, -1, -1)
        assert h.state() == "PrepareCommit"
        del h.markers.always[T1]
        await h.completed(TID, "COMPLETE_COMMIT")
        assert (await h.end(pid, epoch, True)).error == E.NONE
    run(main())


def test_end_txn_abort_of_a_prepared_commit_is_an_invalid_state_or_a_retry():
    """shouldReturnInvalidTxnRequestOnEndTxnRequestWhenStatusIsPrepareAbort (commit asked while
    PrepareAbort) and the PrepareAbort + abort retry (CONCURRENT_TRANSACTIONS)."""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.PREPARE_ABORT, epoch=4, partitions=[T0], start_ms=h.now, last_update_ms=h.now)
        h.markers.gate = asyncio.Event()
        h.coord.load(h.loaded)
        assert (await h.end(OLD_PID, 4, True)).error == E.INVALID_TXN_STATE
        assert (await h.end(OLD_PID, 4, False)).error == E.CONCURRENT_TRANSACTIONS
        h.markers.gate.set()
        await h.completed(TID, "COMPLETE_ABORT")
    run(main())


def test_end_txn_rejects_empty_state_wrong_epochs_and_unknown_producers():
    """shouldReplyWithInvalidPidMappingOnEndTxnWhen{TxnIdDoesntExist,PidDosentMatchMapped},
    shouldReturnInvalidEpochOnEndTxnWhenEpochIs{Larger,Smaller},
    shouldRespondWithInvalidRequestOnEndTxnWhenTransactionalIdIsEmpty, and Empty -> INVALID_TXN_STATE"""
    async def main():
        h = Harness()
        assert (await h.end(1, 0)).error == E.INVALID_PRODUCER_ID_MAPPING
        r = await h.init()
        assert (await h.end(r.producer_id, 0, True)).error == E.INVALID_TXN_STATE
        assert (await h.end(r.producer_id, 0, False)).error == E.INVALID_TXN_STATE
        await h.add(r.producer_id, 0, T0)
        assert (await h.end(r.producer_id + 1, 0)).error == E.INVALID_PRODUCER_ID_MAPPING
        fenced = await h.end(r.producer_id, 1)
        assert (fenced.error, fenced.producer_id, fenced.producer_epoch) == (E.PRODUCER_FENCED, -1, -1)
        assert (await h.coord.end_transaction("", r.producer_id, 0, True)).error == E.INVALID_REQUEST
        assert h.state() == "Ongoing" and h.log.states(TID) == ["EMPTY", "ONGOING"]
        await h.init()            # epoch 1 after the fence and the abort
        await h.completed(TID, "COMPLETE_ABORT")
        assert (await h.end(r.producer_id, 0, False)).error == E.PRODUCER_FENCED
    run(main())


def test_end_txn_while_add_partitions_is_pending_answers_concurrent_transactions():
    """endTransaction: pendingTransitionInProgress (not PrepareEpochFence) -> CONCURRENT_TRANSACTIONS"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0)
        hold = h.log.hold(when=state_is(S.ONGOING))
        add = asyncio.create_task(h.add(pid, epoch, T1))
        await hold.entered.wait()
        assert (await h.end(pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS
        hold.release()
        assert await add == E.NONE
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        assert h.markers.sent[-1].partitions == (T0, T1)
    run(main())


# =========================================================================== append failures

@pytest.mark.parametrize("append_error,client_error", [
    (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
    (E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.COORDINATOR_NOT_AVAILABLE),
    (E.UNKNOWN_TOPIC_OR_PARTITION, E.COORDINATOR_NOT_AVAILABLE),
    (E.REQUEST_TIMED_OUT, E.COORDINATOR_NOT_AVAILABLE),
    (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
    (E.KAFKA_STORAGE_ERROR, E.NOT_COORDINATOR),
    (E.MESSAGE_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    (E.RECORD_LIST_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    (E.INVALID_REQUIRED_ACKS, E.INVALID_REQUIRED_ACKS),      # "case other => other"
])
def test_a_failed_append_maps_the_error_and_clears_the_pending_state(append_error, client_error):
    """TransactionStateManager.appendTransactionToLog's error mapping and pending-state reset
    (testAppendFailToCoordinatorNotAvailableError, testAppendFailToNotCoordinatorError,
    testAppendFailToUnknownError)."""
    async def main():
        h = Harness()
        h.log.fail(append_error)
        r = await h.init()
        assert (r.error, r.producer_id, r.producer_epoch) == (client_error, -1, -1)
        assert h.log.count() == 0
        ok = await h.init()
        assert (ok.error, ok.producer_epoch) == (E.NONE, 0)
        h.log.fail(append_error)
        assert await h.add(ok.producer_id, 0, T0) == client_error
        assert h.state() == "Empty"
        assert await h.add(ok.producer_id, 0, T0) == E.NONE
        h.log.fail(append_error)
        assert (await h.end(ok.producer_id, 0, True)).error == client_error
        assert h.state() == "Ongoing" and h.markers.sent == []
        assert (await h.end(ok.producer_id, 0, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
    run(main())


def test_an_append_raising_a_non_kafka_exception_answers_unknown_server_error():
    async def main():
        h = Harness()
        h.log.fail(RuntimeError("disk on fire"))
        assert (await h.init()).error == E.UNKNOWN_SERVER_ERROR
        assert (await h.init()).error == E.NONE
    run(main())


# =========================================================================== markers

def test_retriable_marker_errors_are_retried_for_the_failed_partitions_only():
    """TransactionMarkerRequestCompletionHandler: retriable errors re-enqueue their partitions;
    the completion is written once every partition has its marker."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1, U0)
        h.markers.script[T0] = [E.NOT_LEADER_OR_FOLLOWER, E.NETWORK_EXCEPTION]
        h.markers.script[U0] = [E.NOT_ENOUGH_REPLICAS]
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        assert [m.partitions for m in h.markers.sent] == [(T0, T1, U0), (T0, U0), (T0,)]
        assert {(m.producer_id, m.producer_epoch, m.commit, m.coordinator_epoch)
                for m in h.markers.sent} == {(pid, epoch, True, COORD_EPOCH)}
        assert h.log.states(TID).count("COMPLETE_COMMIT") == 1
    run(main())


def test_a_marker_send_that_raises_is_retried():
    """A disconnected WriteTxnMarkers request is re-enqueued (wasDisconnected branch)."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0)
        h.markers.raise_next = 2
        assert (await h.end(pid, epoch, False)).error == E.NONE
        await h.completed(TID, "COMPLETE_ABORT")
        assert len(h.markers.sent) == 3
    run(main())


@pytest.mark.parametrize("error", [E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED])
def test_a_fenced_marker_stops_sending_and_writes_no_completion(error):
    """TransactionMarkerRequestCompletionHandler: INVALID_PRODUCER_EPOCH /
    TRANSACTION_COORDINATOR_FENCED -> removeMarkersForTxn, abortSending."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1)
        h.markers.always[T0] = error
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await eventually_async(lambda: h.markers.sent, "a marker request", WAIT_S)
        await settle()
        assert len(h.markers.sent) == 1
        assert "COMPLETE_COMMIT" not in h.log.states(TID)
        assert h.state() == "PrepareCommit"
        assert (await h.init()).error == E.CONCURRENT_TRANSACTIONS
    run(main())


def test_markers_for_partitions_of_deleted_topics_are_dropped():
    """addTxnMarkersToBrokerQueue: no leader -> the partitions are removed
    (shouldSkipSendMarkersWhenLeaderNotFound)."""
    async def main():
        h = Harness(topic_exists=lambda topic: topic != "gone")
        pid, epoch = await h.ongoing(T0, ("gone", 0), ("gone", 1))
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        assert [m.partitions for m in h.markers.sent] == [(T0,)]

        other = ids_in_partition(P, 1, prefix="only-gone")[0]
        pid2, epoch2 = await h.ongoing(("gone", 0), tid=other)
        assert (await h.end(pid2, epoch2, False, tid=other)).error == E.NONE
        await h.completed(other, "COMPLETE_ABORT")
        assert h.markers.for_pid(pid2) == []
    run(main())


def test_markers_rejected_for_an_old_message_format_drop_the_partition():
    """UNSUPPORTED_FOR_MESSAGE_FORMAT / UNSUPPORTED_VERSION -> removePartition."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0, T1)
        h.markers.script[T0] = [E.UNSUPPORTED_FOR_MESSAGE_FORMAT]
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        assert len(h.markers.sent) == 1
    run(main())


def test_a_completion_append_that_is_not_available_is_retried():
    """TransactionMarkerChannelManager.tryAppendToLog: COORDINATOR_NOT_AVAILABLE -> retry queue
    (shouldRetryAppendToLogOnEndTxnWhenCoordinatorNotAvailableError)."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0)
        h.log.fail(E.NOT_ENOUGH_REPLICAS, times=3, when=state_is(S.COMPLETE_COMMIT))
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await h.completed(TID, "COMPLETE_COMMIT")
        assert [v.state for _, t, v in h.log.attempts].count(S.COMPLETE_COMMIT) == 4
        assert len(h.markers.sent) == 1          # the markers are not sent again
        assert h.state() == "CompleteCommit"
    run(main())


def test_a_completion_append_answering_not_coordinator_is_abandoned():
    """tryAppendToLog: NOT_COORDINATOR -> skip writing (shouldAbortAppendToLogOnEndTxnWhenNotCoordinatorError)."""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0)
        h.log.fail(E.NOT_LEADER_OR_FOLLOWER, times=1, when=state_is(S.COMPLETE_COMMIT))
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await eventually_async(lambda: any(v.state == S.COMPLETE_COMMIT for _, t, v in h.log.attempts),
                               "an attempt to write COMPLETE_COMMIT", WAIT_S)
        await settle()
        assert [v.state for _, t, v in h.log.attempts].count(S.COMPLETE_COMMIT) == 1
        assert h.log.states(TID)[-1] == "PREPARE_COMMIT"
    run(main())


# =========================================================================== load / unload

def test_load_completes_prepared_transactions_drops_tombstones_and_keeps_the_rest():
    """TransactionStateManagerTest.testLoadAndRemoveTransactionsForPartition,
    shouldWriteTxnMarkersForTransactionInPrepared{Commit,Abort}State,
    shouldAbortExpiredTransactionsInOngoingStateAndBumpEpoch"""
    async def main():
        h = Harness(load_now=False)
        ongoing, prepared, aborted, deleted, prep_abort = ids_in_partition(P, 5)
        t = h.now
        h.log.seed(ongoing, S.EMPTY, pid=10, epoch=2, last_update_ms=t - 100)
        h.log.seed(ongoing, S.ONGOING, pid=10, epoch=2, partitions=[T0, U0], start_ms=t - 100,
                   last_update_ms=t - 100, timeout_ms=60_000)
        h.log.seed(prepared, S.PREPARE_COMMIT, pid=11, epoch=4, partitions=[T0, T1],
                   start_ms=t - 50, last_update_ms=t - 40)
        h.log.seed(aborted, S.COMPLETE_ABORT, pid=12, epoch=1, start_ms=t - 30, last_update_ms=t - 20)
        h.log.seed(deleted, S.COMPLETE_COMMIT, pid=13, epoch=0, start_ms=t - 30, last_update_ms=t - 20)
        h.log.seed(deleted, None)
        h.log.seed(prep_abort, S.PREPARE_ABORT, pid=14, epoch=9, partitions=[U0],
                   start_ms=t - 50, last_update_ms=t - 40)
        h.coord.load({P: 3})
        assert h.coord.owned_partitions == {P} and h.coord.coordinator_epoch(P) == 3

        await h.completed(prepared, "COMPLETE_COMMIT")
        await h.completed(prep_abort, "COMPLETE_ABORT")
        assert sorted(h.markers.sent, key=lambda m: m.producer_id) == [
            TxnMarker(11, 4, True, 3, (T0, T1)), TxnMarker(14, 9, False, 3, (U0,))]
        done = h.log.last(prepared)
        assert (done.producer_id, done.producer_epoch, done.partitions) == (11, 4, ())

        assert h.coord.describe(deleted).error == E.TRANSACTIONAL_ID_NOT_FOUND
        assert await h.add(13, 0, T0, tid=deleted) == E.INVALID_PRODUCER_ID_MAPPING
        d = h.coord.describe(aborted)
        assert (d.state, d.producer_id, d.producer_epoch) == ("CompleteAbort", 12, 1)
        d = h.coord.describe(ongoing)
        assert (d.state, d.producer_id, d.producer_epoch, d.partitions, d.start_ms) == \
            ("Ongoing", 10, 2, (T0, U0), t - 100)
        assert h.log.states(ongoing) == ["EMPTY", "ONGOING"]

        # the Ongoing one is aborted once its timeout has passed, at a bumped epoch
        assert await h.coord.abort_timed_out_transactions() == 0
        h.clock.advance_ms(60_000 - 100)
        assert await h.coord.abort_timed_out_transactions() == 0     # start + timeout == now
        h.clock.advance_ms(1)
        assert await h.coord.abort_timed_out_transactions() == 1
        await h.completed(ongoing, "COMPLETE_ABORT")
        prepare = h.log.values(ongoing)[-2]
        assert (prepare.state, prepare.producer_epoch, prepare.last_update_ms) == \
            (S.PREPARE_ABORT, 3, h.now)
        assert h.markers.for_pid(10) == [TxnMarker(10, 3, False, 3, (T0, U0))]
        assert h.log.last(ongoing).producer_epoch == 3
        # the timed-out producer is fenced; a new one gets the next epoch
        assert (await h.end(10, 2, True, tid=ongoing)).error == E.PRODUCER_FENCED
        assert (await h.init(ongoing)).producer_epoch == 4
    run(main())


def test_load_skips_records_with_an_unknown_key_version():
    """TransactionStateManagerTest.testIgnoreUnknownRecordType"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=1, last_update_ms=h.now)
        h.log.partitions[P].append((b"\x00\x05junk", b"whatever"))
        h.log.seed(TID, S.EMPTY, epoch=2, last_update_ms=h.now)
        h.coord.load(h.loaded)
        assert h.coord.describe(TID).producer_epoch == 2
    run(main())


def test_abort_of_timed_out_transactions_considers_only_idle_ongoing_ones():
    """shouldOnlyConsiderTransactionsInTheOngoingStateToAbort,
    shouldNotAbortExpiredTransactionsThatHaveAPendingStateTransition"""
    async def main():
        h = Harness(load_now=False)
        ongoing, long_timeout, prepared, completed, pending = ids_in_partition(P, 5)
        t = h.now
        h.log.seed(ongoing, S.ONGOING, pid=1, partitions=[T0], start_ms=t, timeout_ms=1000)
        h.log.seed(long_timeout, S.ONGOING, pid=2, partitions=[T0], start_ms=t, timeout_ms=10_000)
        h.log.seed(prepared, S.PREPARE_COMMIT, pid=3, partitions=[T0], start_ms=t, timeout_ms=1000)
        h.log.seed(completed, S.COMPLETE_COMMIT, pid=4, start_ms=t, timeout_ms=1000)
        h.log.seed(pending, S.ONGOING, pid=5, partitions=[T0], start_ms=t, timeout_ms=1000)
        h.markers.gate = asyncio.Event()
        h.coord.load({P: 1})
        hold = h.log.hold(when=lambda tid, v: tid == pending)
        add = asyncio.create_task(h.add(5, 0, T1, tid=pending))
        await hold.entered.wait()
        h.clock.advance_ms(2000)
        assert await h.coord.abort_timed_out_transactions() == 1
        await eventually_async(lambda: h.log.states(ongoing)[-1] == "PREPARE_ABORT",
                               "the timed-out transaction in PREPARE_ABORT", WAIT_S)
        for tid in (long_timeout, prepared, completed):
            assert len(h.log.states(tid)) == 1
        hold.release()
        assert await add == E.NONE
        h.markers.gate.set()
        await h.completed(ongoing, "COMPLETE_ABORT")
    run(main())


def test_a_failed_timeout_abort_does_not_bump_the_epoch_again():
    """shouldNotBumpEpochWhenAbortingExpiredTransactionIfAppendToLogFails"""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.ONGOING, epoch=5, partitions=[T0], start_ms=h.now, timeout_ms=1000)
        h.coord.load(h.loaded)
        h.clock.advance_ms(1001)
        h.log.fail(E.NOT_ENOUGH_REPLICAS, when=state_is(S.PREPARE_ABORT))
        assert await h.coord.abort_timed_out_transactions() == 1
        await eventually_async(lambda: h.log.attempts, "an attempt to write the abort", WAIT_S)
        await settle()
        d = h.coord.describe(TID)
        assert (d.state, d.producer_epoch) == ("Ongoing", 6)
        assert await h.coord.abort_timed_out_transactions() == 1
        await h.completed(TID, "COMPLETE_ABORT")
        assert [v.producer_epoch for _, t, v in h.log.attempts if v.state == S.PREPARE_ABORT] == [6, 6]
        assert h.log.last(TID).producer_epoch == 6
    run(main())


def test_unload_answers_not_coordinator_and_a_late_append_is_not_applied():
    """shouldRemoveTransactionsForPartitionOnEmigration; appendTransactionToLog's callback when
    the metadata is gone -> NOT_COORDINATOR."""
    async def main():
        h = Harness()
        r = await h.init()
        hold = h.log.hold(when=state_is(S.ONGOING), store_first=True)
        add = asyncio.create_task(h.add(r.producer_id, 0, T0))
        await hold.entered.wait()
        h.coord.unload([P])
        hold.release()
        assert await add == E.NOT_COORDINATOR
        assert (await h.init()).error == E.NOT_COORDINATOR
        assert await h.add(r.producer_id, 0, T0) == E.NOT_COORDINATOR
        assert (await h.end(r.producer_id, 0)).error == E.NOT_COORDINATOR
        assert h.coord.describe(TID).error == E.NOT_COORDINATOR
        assert P not in h.coord.owned_partitions and h.coord.coordinator_epoch(P) is None
        # a new load sees what was durable
        h.coord.load({P: COORD_EPOCH + 1})
        assert h.state() == "Ongoing"
    run(main())


def test_unload_while_markers_are_in_flight_writes_no_completion():
    """shouldRemoveMarkersForTxnPartitionWhenPartitionEmigrated"""
    async def main():
        h = Harness()
        pid, epoch = await h.ongoing(T0)
        h.markers.always[T0] = E.NOT_LEADER_OR_FOLLOWER
        assert (await h.end(pid, epoch, True)).error == E.NONE
        await eventually_async(lambda: len(h.markers.sent) >= 2, "two marker requests", WAIT_S)
        h.coord.unload([P])
        del h.markers.always[T0]
        await settle()
        sent = len(h.markers.sent)
        await settle()
        assert len(h.markers.sent) == sent
        assert h.log.states(TID)[-1] == "PREPARE_COMMIT"
    run(main())


def test_a_reload_at_a_new_coordinator_epoch_stops_the_old_marker_sender():
    """onElection -> removeMarkersForTxnTopicPartition; the handler drops responses of an older
    coordinator epoch (testSuccessfulReimmigration, shouldNotLoseTxnCompletionAfterLoad)."""
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.PREPARE_COMMIT, epoch=3, partitions=[T0, T1], start_ms=h.now,
                   last_update_ms=h.now)
        h.markers.always[T0] = E.NOT_LEADER_OR_FOLLOWER
        h.coord.load({P: 1})
        await eventually_async(lambda: len(h.markers.sent) >= 3, "three marker requests", WAIT_S)
        assert {m.coordinator_epoch for m in h.markers.sent} == {1}
        del h.markers.always[T0]
        h.coord.load({P: 2})
        old = len(h.markers.sent)
        await h.completed(TID, "COMPLETE_COMMIT")
        await settle()
        assert h.markers.sent[old:] == [TxnMarker(OLD_PID, 3, True, 2, (T0, T1))]
        assert h.log.states(TID).count("COMPLETE_COMMIT") == 1
        assert h.state() == "CompleteCommit"
    run(main())


# =========================================================================== expiration

def test_idle_completed_and_empty_ids_expire_with_a_tombstone_and_others_stay():
    """shouldRemove{CompleteCommit,CompleteAbort,Empty}ExpiredTransactionalIds,
    shouldNotRemove{Ongoing,PrepareCommit,PrepareAbort}TransactionalIds"""
    async def main():
        h = Harness(load_now=False)
        cc, ca, empty, boundary, recent, ongoing, prep = ids_in_partition(P, 7)
        old = h.now - EXPIRATION - 1
        h.log.seed(cc, S.COMPLETE_COMMIT, pid=1, start_ms=old, last_update_ms=old)
        h.log.seed(ca, S.COMPLETE_ABORT, pid=2, start_ms=old, last_update_ms=old)
        h.log.seed(empty, S.EMPTY, pid=3, last_update_ms=old)
        h.log.seed(boundary, S.COMPLETE_COMMIT, pid=4, start_ms=old, last_update_ms=h.now - EXPIRATION)
        h.log.seed(recent, S.COMPLETE_COMMIT, pid=5, start_ms=old, last_update_ms=h.now - EXPIRATION + 1)
        h.log.seed(ongoing, S.ONGOING, pid=6, partitions=[T0], start_ms=old, last_update_ms=old,
                   timeout_ms=MAX_TIMEOUT)
        h.log.seed(prep, S.PREPARE_COMMIT, pid=7, partitions=[T0], start_ms=old, last_update_ms=old)
        h.markers.gate = asyncio.Event()
        h.coord.load({P: 1})
        assert await h.coord.expire_transactional_ids() == 4
        for tid in (cc, ca, empty, boundary):
            assert h.log.states(tid)[-1] == "tombstone"
            assert h.coord.describe(tid).error == E.TRANSACTIONAL_ID_NOT_FOUND
        for tid in (recent, ongoing, prep):
            assert h.log.last(tid) is not None
            assert h.coord.describe(tid).error == E.NONE
        # an expired id starts over with a new producer id
        r = await h.init(cc)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        assert await h.add(1, 0, T0, tid=cc) == E.INVALID_PRODUCER_ID_MAPPING
        h.markers.gate.set()
    run(main())


def test_a_failed_tombstone_append_keeps_the_id():
    """shouldNotRemoveExpiredTransactionalIdsIfLogAppendFails"""
    async def main():
        h = Harness(load_now=False)
        old = h.now - EXPIRATION - 1
        h.log.seed(TID, S.COMPLETE_COMMIT, start_ms=old, last_update_ms=old)
        h.coord.load(h.loaded)
        h.log.fail(E.NOT_ENOUGH_REPLICAS)
        assert await h.coord.expire_transactional_ids() == 0
        assert h.state() == "CompleteCommit"
        assert (await h.init()).producer_epoch == 1       # pending state was cleared
    run(main())


def test_an_id_whose_init_failed_can_expire():
    """testTransactionExpirationShouldNotFailWithUninitializedTransactionMetadata"""
    async def main():
        h = Harness()
        h.log.fail(E.NOT_ENOUGH_REPLICAS)
        assert (await h.init()).error == E.COORDINATOR_NOT_AVAILABLE
        h.clock.advance_ms(EXPIRATION)
        assert await h.coord.expire_transactional_ids() == 1
        assert h.coord.describe(TID).error == E.TRANSACTIONAL_ID_NOT_FOUND
    run(main())


# =========================================================================== describe / list

def test_describe_transactions():
    """testDescribeTransactions, testDescribeTransactionsWithEmptyTransactionalId"""
    async def main():
        h = Harness()
        assert h.coord.describe(TID).error == E.TRANSACTIONAL_ID_NOT_FOUND
        e = h.coord.describe("")
        assert (e.error, e.transactional_id) == (E.INVALID_REQUEST, "")
        pid, epoch = await h.ongoing(U0, T1, T0, timeout_ms=30_000)
        d = h.coord.describe(TID)
        assert (d.error, d.transactional_id, d.state, d.producer_id, d.producer_epoch,
                d.timeout_ms, d.start_ms, d.partitions) == \
            (E.NONE, TID, "Ongoing", pid, epoch, 30_000, h.now, (T0, T1, U0))
    run(main())


async def _listing_fixture(h: Harness) -> None:
    """TransactionStateManagerTest.testListTransactionsFiltering's transactions (without the
    PrepareEpochFence and Dead ones, which a log never holds)."""
    t = h.now
    h.log.seed("t0", S.ONGOING, pid=0, partitions=[T0], start_ms=t, last_update_ms=t)
    h.log.seed("t1", S.ONGOING, pid=1, partitions=[T0], start_ms=t, last_update_ms=t)
    h.log.seed("t2", S.PREPARE_COMMIT, pid=2, partitions=[T0], start_ms=t + 1000, last_update_ms=t + 1000)
    h.log.seed("t3", S.PREPARE_ABORT, pid=3, partitions=[T0], start_ms=t + 1000, last_update_ms=t + 1000)
    for tid, pid, state in (("t4", 4, S.COMPLETE_COMMIT), ("t5", 5, S.COMPLETE_ABORT),
                            ("t6", 6, S.COMPLETE_ABORT)):
        h.log.seed(tid, state, pid=pid, start_ms=t + 2000, last_update_ms=t + 2000)
    h.markers.gate = asyncio.Event()          # keep t2 and t3 prepared
    h.coord.load(h.loaded)
    h.clock.advance_ms(3000)


def test_list_transactions_filters_by_state_and_producer_id():
    """TransactionStateManagerTest.testListTransactionsFiltering (state and producer id filters)"""
    async def main():
        h = Harness(load_now=False)
        await _listing_fixture(h)

        def ids(**kw):
            error, listed, unknown = h.coord.list_transactions(**kw)
            assert error == E.NONE
            return {x.transactional_id for x in listed}, set(unknown)
        everyone = {"t0", "t1", "t2", "t3", "t4", "t5", "t6"}
        assert ids() == (everyone, set())
        assert ids(states=["Ongoing"]) == ({"t0", "t1"}, set())
        assert ids(states=["Ongoing", "UnknownState"]) == ({"t0", "t1"}, {"UnknownState"})
        assert ids(states=["PrepareCommit", "CompleteCommit"]) == ({"t2", "t4"}, set())
        assert ids(states=["UnknownState"]) == (set(), {"UnknownState"})
        assert ids(producer_ids=[5]) == ({"t5"}, set())
        assert ids(producer_ids=[5, 6, 8, 9]) == ({"t5", "t6"}, set())
        assert ids(producer_ids=[4, 5], states=["CompleteCommit"]) == ({"t4"}, set())
        assert ids(producer_ids=[4, 5], states=["CompleteCommit", "CompleteAbort"]) == ({"t4", "t5"}, set())
        assert ids(producer_ids=[3, 6], states=["UnknownState"]) == (set(), {"UnknownState"})
        assert ids(producer_ids=[10], states=["CompleteCommit"]) == (set(), set())
        assert ids(states=["Dead"]) == (set(), set())
        _, listed, _ = h.coord.list_transactions(producer_ids=[2])
        assert [(x.transactional_id, x.producer_id, x.state) for x in listed] == [("t2", 2, "PrepareCommit")]
        # the duration filter on Ongoing transactions, away from the boundaries
        assert ids(states=["Ongoing"], min_duration_ms=2000) == ({"t0", "t1"}, set())
        assert ids(states=["Ongoing"], min_duration_ms=3001) == (set(), set())
        h.markers.gate.set()
    run(main())


def test_list_transactions_duration_filter_as_kafka():
    """TransactionStateManagerTest.testListTransactionsFiltering (duration filter):
    TransactionStateManager.listTransactionStates' shouldInclude."""
    async def main():
        h = Harness(load_now=False)
        await _listing_fixture(h)

        def ids(duration):
            error, listed, _ = h.coord.list_transactions(min_duration_ms=duration)
            assert error == E.NONE
            return {x.transactional_id for x in listed}
        try:
            assert ids(0) == {"t0", "t1", "t2", "t3", "t4", "t5", "t6"}
            assert ids(1000) == {"t0", "t1", "t2", "t3"}
            assert ids(2000) == {"t0", "t1"}
            assert ids(3000) == set()
        finally:
            h.markers.gate.set()
    run(main())


# =========================================================================== races with a reload
#
# Kafka's TransactionStateManager.appendTransactionToLog re-checks, under the state read lock
# and *before* appending, that the partition is still loaded at the caller's coordinator epoch
# ("to avoid the case where an emigration followed by an immigration could have completed after
# the check returns and before appendRecords() is called ... make the log in a bad state").
# The coordinator's ``_append`` only checks after the append, so work that began before a
# reload and resumes after it writes records derived from the old metadata.

def _log_agrees_with_cache(h: Harness, tid: str) -> bool:
    last = h.log.last(tid)
    d = h.coord.describe(tid)
    if last is None:
        return d.error == E.TRANSACTIONAL_ID_NOT_FOUND
    return d.error == E.NONE and (d.state, d.producer_id, d.producer_epoch) == \
        (STATE_NAMES[last.state], last.producer_id, last.producer_epoch)


STATE_NAMES = {S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit",
               S.PREPARE_ABORT: "PrepareAbort", S.COMPLETE_COMMIT: "CompleteCommit",
               S.COMPLETE_ABORT: "CompleteAbort"}


def test_expiration_does_not_write_tombstones_for_a_reloaded_partition():
    async def main():
        h = Harness(load_now=False)
        first, second = ids_in_partition(P, 2)
        old = h.now - EXPIRATION - 1
        h.log.seed(first, S.COMPLETE_COMMIT, pid=1, start_ms=old, last_update_ms=old)
        h.log.seed(second, S.COMPLETE_COMMIT, pid=2, start_ms=old, last_update_ms=old)
        h.coord.load({P: 1})
        hold = h.log.hold(when=lambda tid, v: tid == first, store_first=True)
        expire = asyncio.create_task(h.coord.expire_transactional_ids())
        await hold.entered.wait()
        h.coord.unload([P])
        h.coord.load({P: 2})               # sees the first tombstone, still has `second`
        hold.release()
        await expire
        assert _log_agrees_with_cache(h, first)
        assert _log_agrees_with_cache(h, second)
    run(main())


def test_a_timeout_abort_started_before_a_reload_writes_nothing_stale():
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.ONGOING, epoch=5, partitions=[T0], start_ms=h.now, timeout_ms=1000)
        h.coord.load({P: 1})
        h.clock.advance_ms(1001)
        assert await h.coord.abort_timed_out_transactions() == 1
        h.coord.unload([P])                # before the spawned abort ran
        h.coord.load({P: 2})
        await settle()
        assert _log_agrees_with_cache(h, TID)
    run(main())


def test_init_rotation_across_a_reload_writes_nothing_stale():
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.EMPTY, epoch=SHORT_MAX - 1, last_update_ms=h.now)
        h.coord.load({P: 1})
        h.pids.block()
        try:
            init = asyncio.create_task(h.init())
            await eventually_async(h.pids.entered.is_set, "InitProducerId allocating an id",
                                   WAIT_S)
            h.coord.unload([P])
            h.coord.load({P: 2})
        finally:
            h.pids.release()
        r = await init
        assert r.error == E.NOT_COORDINATOR
        assert h.log.states(TID) == ["EMPTY"]
        assert _log_agrees_with_cache(h, TID)
    run(main())


def test_init_rotation_racing_add_partitions_fences_instead_of_failing():
    async def main():
        h = Harness(load_now=False)
        h.log.seed(TID, S.COMPLETE_COMMIT, epoch=SHORT_MAX - 1, start_ms=h.now, last_update_ms=h.now)
        h.coord.load(h.loaded)
        h.pids.block()
        try:
            init = asyncio.create_task(h.init())
            await eventually_async(h.pids.entered.is_set, "InitProducerId allocating an id",
                                   WAIT_S)
            assert await h.add(OLD_PID, SHORT_MAX - 1, T0) == E.NONE
        finally:
            h.pids.release()
        r = await init
        # the Ongoing transaction is fenced and aborted, the client retries (Kafka's Ongoing case)
        assert r.error == E.CONCURRENT_TRANSACTIONS
        await h.completed(TID, "COMPLETE_ABORT")
        assert _log_agrees_with_cache(h, TID)
    run(main())


# =========================================================================== transactions V2

def seed_v2(h: Harness, tid: str, state: TxnState, *, epoch: int, partitions=(),
            pid: int = OLD_PID) -> None:
    """A record of a V2 transaction (ClientTransactionVersion 2), as a previous coordinator
    wrote it."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for t, p in partitions:
        by_topic[t].append(p)
    h.log.partitions[partition_for(tid, NUM_PARTITIONS)].append((encode_key(tid), encode_value(
        TxnLogValue(producer_id=pid, producer_epoch=epoch, transaction_timeout_ms=TIMEOUT,
                    state=state, partitions=tuple((t, tuple(ps)) for t, ps in by_topic.items()),
                    last_update_ms=h.now, start_ms=h.now, client_transaction_version=2))))


async def v2_ongoing(h: Harness, *tps, tid: str = TID):
    """A fresh id whose partitions were added by their leaders (a V2 client): (pid, epoch)."""
    r = await h.init(tid)
    assert await h.coord.add_partitions(tid, r.producer_id, r.producer_epoch, tps or (T0, T1),
                                        client_transaction_version=2) == E.NONE
    return r.producer_id, r.producer_epoch


async def v2_end(h: Harness, pid: int, epoch: int, commit: bool = True, tid: str = TID):
    return await h.coord.end_transaction(tid, pid, epoch, commit, client_transaction_version=2)


@pytest.mark.parametrize("commit", [True, False])
def test_v2_end_bumps_the_epoch_answers_it_and_writes_markers_with_it(commit):
    """shouldAppendPrepare{Commit,Abort}ToLogOnEndTxnWhenStatusIsOngoingAndResultIs{Commit,Abort}
    with TV_2: the epoch is bumped in Prepare*, answered, carried by the markers (transaction
    version 2) and kept by Complete*; every record carries ClientTransactionVersion 2."""
    async def main():
        h = Harness()
        pid, epoch = await v2_ongoing(h, T0, U0)
        assert h.log.last(TID).client_transaction_version == 2
        r = await v2_end(h, pid, epoch, commit)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch + 1)
        prepare = h.log.last(TID)
        assert prepare.state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
        assert (prepare.producer_epoch, prepare.client_transaction_version) == (epoch + 1, 2)
        await h.completed(TID, "COMPLETE_COMMIT" if commit else "COMPLETE_ABORT")
        assert h.markers.sent == [TxnMarker(pid, epoch + 1, commit, COORD_EPOCH, (T0, U0), 2)]
        complete = h.log.last(TID)
        assert (complete.producer_id, complete.producer_epoch,
                complete.client_transaction_version) == (pid, epoch + 1, 2)
        # the next transaction runs at the bumped epoch; the old one is fenced
        assert await h.coord.add_partitions(TID, pid, epoch, [T1], 2) == E.PRODUCER_FENCED
        assert await h.coord.add_partitions(TID, pid, epoch + 1, [T1], 2) == E.NONE
        r = await v2_end(h, pid, epoch + 1, commit)
        assert (r.error, r.producer_epoch) == (E.NONE, epoch + 2)
    run(main())


def test_v2_end_retries_are_answered_from_the_bumped_epoch():
    """TV_2 retries (endTxnEpochBumped): an EndTxn at epoch - 1 of the stored epoch is the retry
    of one that completed (NONE with the current id/epoch; the opposite result
    INVALID_TXN_STATE) or is still writing markers (CONCURRENT_TRANSACTIONS); the stored epoch
    itself and older epochs are PRODUCER_FENCED, as Kafka answers them."""
    async def main():
        h = Harness()
        pid, epoch = await v2_ongoing(h)
        h.markers.gate = asyncio.Event()
        assert (await v2_end(h, pid, epoch, True)).error == E.NONE
        assert (await v2_end(h, pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS
        assert (await v2_end(h, pid, epoch + 1, True)).error == E.PRODUCER_FENCED
        h.markers.gate.set()
        await h.completed(TID, "COMPLETE_COMMIT")
        before = h.log.count()
        retry = await v2_end(h, pid, epoch, True)
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, pid, epoch + 1)
        assert (await v2_end(h, pid, epoch, False)).error == E.INVALID_TXN_STATE
        assert (await v2_end(h, pid, epoch + 1, True)).error == E.PRODUCER_FENCED
        assert (await v2_end(h, pid, epoch - 1, True)).error == E.PRODUCER_FENCED
        assert (await v2_end(h, pid + 1, epoch, True)).error == E.INVALID_PRODUCER_ID_MAPPING
        assert h.log.count() == before
    run(main())


def test_v2_end_of_an_exhausted_epoch_moves_to_a_new_producer_id():
    """TV_2 epoch overflow: Prepare* at Short.MaxValue with the next producer id, the markers at
    Short.MaxValue, Complete* with the new id at epoch 0 (the old one its previous id); the
    client is answered the new id at epoch 0, and the retry of the end too."""
    async def main():
        h = Harness(load_now=False)
        seed_v2(h, TID, S.ONGOING, epoch=SHORT_MAX - 1, partitions=[T0])
        h.coord.load(h.loaded)
        r = await v2_end(h, OLD_PID, SHORT_MAX - 1, True)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, FIRST_PID, 0)
        prepare = h.log.last(TID)
        assert (prepare.producer_id, prepare.producer_epoch, prepare.next_producer_id) == \
            (OLD_PID, SHORT_MAX, FIRST_PID)
        await h.completed(TID, "COMPLETE_COMMIT")
        assert h.markers.sent == [TxnMarker(OLD_PID, SHORT_MAX, True, COORD_EPOCH, (T0,), 2)]
        complete = h.log.last(TID)
        assert (complete.producer_id, complete.producer_epoch, complete.previous_producer_id,
                complete.next_producer_id) == (FIRST_PID, 0, OLD_PID, -1)
        retry = await v2_end(h, OLD_PID, SHORT_MAX - 1, True)
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, FIRST_PID, 0)
        assert await h.coord.add_partitions(TID, FIRST_PID, 0, [T1], 2) == E.NONE
    run(main())


def test_a_loaded_v2_prepare_is_completed_with_v2_markers():
    """A coordinator that takes over a V2 PrepareCommit writes its markers with transaction
    version 2 at the stored (bumped) epoch."""
    async def main():
        h = Harness(load_now=False)
        seed_v2(h, TID, S.PREPARE_COMMIT, epoch=4, partitions=[T0, T1])
        h.coord.load(h.loaded)
        await h.completed(TID, "COMPLETE_COMMIT")
        assert h.markers.sent == [TxnMarker(OLD_PID, 4, True, COORD_EPOCH, (T0, T1), 2)]
        assert h.log.last(TID).client_transaction_version == 2
        retry = await v2_end(h, OLD_PID, 3, True)
        assert (retry.error, retry.producer_epoch) == (E.NONE, 4)
    run(main())


def test_v1_end_on_a_v2_cluster_keeps_the_epoch():
    """An EndTxn before v5 (client transaction version 0) keeps V1's rules on a cluster at
    transaction.version 2: no bump, markers at the producer's epoch with version 0."""
    async def main():
        h = Harness(transaction_version=2)
        pid, epoch = await h.ongoing(T0)
        r = await h.end(pid, epoch, True)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch)
        await h.completed(TID, "COMPLETE_COMMIT")
        assert h.markers.sent == [TxnMarker(pid, epoch, True, COORD_EPOCH, (T0,), 0)]
        assert h.log.last(TID).client_transaction_version == 0
        assert (await h.end(pid, epoch, True)).error == E.NONE    # V1 retry
    run(main())


def test_a_timeout_abort_on_a_v2_cluster_fences_then_bumps_again():
    """abortTimedOutTransactions uses the cluster's transaction version: on a TV_2 cluster the
    fence's epoch (+1) is bumped again by PrepareAbort (+2), which the markers carry; the
    producer's next end at its old epoch is PRODUCER_FENCED."""
    async def main():
        h = Harness(transaction_version=2)
        pid, epoch = await v2_ongoing(h, T0)
        h.clock.advance_ms(TIMEOUT + 1)
        assert await h.coord.abort_timed_out_transactions() == 1
        await h.completed(TID, "COMPLETE_ABORT")
        assert h.markers.sent == [TxnMarker(pid, epoch + 2, False, COORD_EPOCH, (T0,), 2)]
        assert (await v2_end(h, pid, epoch, False)).error == E.PRODUCER_FENCED
    run(main())
