"""KIP-890 verification on the partition leader: the verification guard of
``UnifiedLog.start_transaction_verification`` and the produce path's use of it, over real logs
and a real transaction coordinator (with an in-memory ``__transaction_state``)."""

from __future__ import annotations

import asyncio

import pytest

from strata.common.errors import InvalidTxnStateError
from strata.coordinator.txn_coordinator import TransactionCoordinator
from strata.log.log_config import LogConfig
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import UnifiedLog
from strata.protocol import records as rec

PID, EPOCH = 4000, 3


def txn_batch(seq: int = 0, n: int = 2) -> bytes:
    return rec.build_batch([rec.SimpleRecord(b"v%d" % i, b"k") for i in range(n)],
                           producer_id=PID, producer_epoch=EPOCH, base_sequence=seq,
                           transactional=True)


def commit_marker() -> bytes:
    return rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=PID, producer_epoch=EPOCH)


@pytest.fixture
def ulog(tmp_path):
    return UnifiedLog(tmp_path / "orders-0", LogConfig({}))


def test_a_guarded_first_append_of_a_transaction_is_accepted_and_ends_the_guard(ulog):
    guard = ulog.start_transaction_verification(PID, EPOCH)
    assert guard is not None
    ulog.append_as_leader(txn_batch(), 0, verification_guard=guard)
    # the transaction is ongoing here now: nothing more to verify
    assert ulog.start_transaction_verification(PID, EPOCH) is None
    assert ulog.log_end_offset == 2


def test_a_marker_landing_during_verification_refuses_the_late_append(ulog):
    """The hanging transaction KIP-890 prevents: the transaction ended (its marker written)
    while the produce was being verified; the produce must not open a new one."""
    ulog.append_as_leader(txn_batch(), 0)
    ulog.append_as_leader(commit_marker(), 0, origin=AppendOrigin.COORDINATOR)
    guard = ulog.start_transaction_verification(PID, EPOCH)
    ulog.append_as_leader(commit_marker(), 0, origin=AppendOrigin.COORDINATOR)
    end = ulog.log_end_offset
    with pytest.raises(InvalidTxnStateError):
        ulog.append_as_leader(txn_batch(seq=2), 0, verification_guard=guard)
    assert ulog.log_end_offset == end
    assert not ulog.producer_state.ongoing_txns


def test_a_guard_replaced_by_a_newer_verification_is_refused(ulog):
    old = ulog.start_transaction_verification(PID, EPOCH)
    new = ulog.start_transaction_verification(PID, EPOCH)
    with pytest.raises(InvalidTxnStateError):
        ulog.append_as_leader(txn_batch(), 0, verification_guard=old)
    ulog.append_as_leader(txn_batch(), 0, verification_guard=new)
    assert ulog.log_end_offset == 2


class _Log:
    def __init__(self):
        self.records = {}

    async def append(self, partition, records):
        self.records.setdefault(partition, []).extend(records)

    def replay(self, partition):
        return list(self.records.get(partition, ()))


def test_the_coordinator_verifies_only_partitions_added_to_the_ongoing_transaction():
    async def run():
        c = TransactionCoordinator(_Log(), iter(range(7000, 7100)).__next__)
        c.load({p: 0 for p in range(c.config.num_partitions)})
        init = await c.init_producer_id("app", 60_000)
        pid, epoch = init.producer_id, init.producer_epoch
        assert await c.add_partitions("app", pid, epoch, [("orders", 0)]) is not None
        return c.verify_partitions("app", pid, epoch, [("orders", 0), ("orders", 1)]), \
            c.verify_partitions("app", pid, epoch + 1, [("orders", 0)])
    ok, fenced = asyncio.run(run())
    assert [(tp, e.name) for tp, e in ok.items()] == \
        [(("orders", 0), "NONE"), (("orders", 1), "TRANSACTION_ABORTABLE")]
    assert [e.name for e in fenced.values()] == ["PRODUCER_FENCED"]


def test_a_refused_verification_leaves_no_guard_behind(ulog):
    guard = ulog.start_transaction_verification(PID, EPOCH)
    ulog.end_transaction_verification(PID, guard)
    assert ulog._verification_guards == {}
    newer = ulog.start_transaction_verification(PID, EPOCH)
    ulog.end_transaction_verification(PID, guard)          # an older guard forgets nothing
    assert ulog._verification_guards == {PID: newer}


# ---- transactions V2: the leader adds the partition (Produce v12) ---------------------------

class _Metadata:
    """One broker (node 1) leading every partition of ``__transaction_state`` (``remote``:
    node 2 leads them, at ``remote_port``)."""

    def __init__(self, leader: int = 1):
        self.leader = leader

    def topic(self, name):
        return object()

    def partition_state(self, topic, partition):
        return type("State", (), {"leader": self.leader})()

    def live_brokers(self):
        return [type("Node", (), {"node_id": 2, "host": "broker-2", "port": 9092})()]


class _Channel:
    """Records each request; answers AddPartitionsToTxn with NONE for every partition."""

    def __init__(self):
        self.sent = []

    def request(self, host, port, body, response_cls):
        from strata.protocol.codec import make
        self.sent.append((host, port, body))
        return make(response_cls, results_by_transaction=tuple(make(
            response_cls, "results_by_transaction", transactional_id=t.transactional_id,
            topic_results=tuple(make(
                response_cls, "results_by_transaction.topic_results", name=topic.name,
                results_by_partition=tuple(make(
                    response_cls, "results_by_transaction.topic_results.results_by_partition",
                    partition_index=p) for p in topic.partitions)) for topic in t.topics))
            for t in body.transactions))

    def close(self):
        pass


def _verifier(coordinator, metadata=None, replica_manager=None, **kw):
    from strata.server.txn_verification import TxnVerifier
    return TxnVerifier(1, metadata or _Metadata(), replica_manager, coordinator,
                       channel=_Channel(), **kw)


def test_a_v12_produce_adds_its_partition_to_the_transaction_and_v11_only_verifies():
    from strata.common.types import TopicPartition

    async def run():
        c = TransactionCoordinator(_Log(), iter(range(7000, 7100)).__next__)
        c.load({p: 0 for p in range(c.config.num_partitions)})
        init = await c.init_producer_id("app", 60_000)
        pid, epoch = init.producer_id, init.producer_epoch
        v = _verifier(c)
        old = await v.verify("app", pid, epoch, [TopicPartition("orders", 0)], 11)
        new = await v.verify("app", pid, epoch, [TopicPartition("orders", 0)], 12)
        return old, new, c.describe("app")
    old, new, described = asyncio.run(run())
    assert [e.name for e in old.values()] == ["TRANSACTION_ABORTABLE"]
    assert new == {}
    assert (described.state, described.partitions) == ("Ongoing", (("orders", 0),))


def test_a_remote_coordinator_gets_add_partitions_to_txn_v5_without_verify_only():
    from strata.common.types import TopicPartition
    v = _verifier(None, _Metadata(leader=2))
    v.coordinator = type("C", (), {"partition_for": staticmethod(lambda tid: 0)})()
    assert asyncio.run(v.verify("app", 5, 1, [TopicPartition("orders", 3)], 12)) == {}
    assert asyncio.run(v.verify("app", 5, 1, [TopicPartition("orders", 3)], 11)) == {}
    (_, _, add), (_, _, verify) = v.channel.sent
    assert (add.__version__, add.transactions[0].verify_only) == (5, False)
    assert (verify.__version__, verify.transactions[0].verify_only) == (4, True)
    assert [(t.name, tuple(t.partitions)) for t in add.transactions[0].topics] == [("orders", (3,))]


def test_an_add_answered_concurrent_transactions_is_asked_again_until_it_succeeds():
    from strata.common.errors import ErrorCode
    from strata.common.types import TopicPartition

    class Busy:
        """CONCURRENT_TRANSACTIONS twice (the last transaction's markers), then NONE."""
        calls = 0

        def partition_for(self, tid):
            return 0

        async def add_partitions(self, tid, pid, epoch, partitions, tv):
            Busy.calls += 1
            return ErrorCode.CONCURRENT_TRANSACTIONS if Busy.calls < 3 else ErrorCode.NONE
    v = _verifier(Busy(), add_retry_backoff_s=0, add_retry_max_s=60)
    assert asyncio.run(v.verify("app", 5, 1, [TopicPartition("orders", 0)], 12)) == {}
    assert Busy.calls == 3
    Busy.calls = -100          # busy for good: answered as a retriable produce error
    v = _verifier(Busy(), add_retry_backoff_s=0, add_retry_max_s=0)
    assert [e.name for e in asyncio.run(
        v.verify("app", 5, 1, [TopicPartition("orders", 0)], 12)).values()] == \
        ["NOT_ENOUGH_REPLICAS"]


def test_a_v2_append_whose_add_waited_for_the_previous_transactions_marker_is_accepted(ulog):
    """Produce v12 right after EndTxn v5: the partition still holds the previous transaction
    (epoch E) when the add of the next one (epoch E + 1) starts; its marker (at the bumped
    epoch E + 1) lands while the add waits. The append of the next transaction goes in."""
    from types import SimpleNamespace as NS

    from strata.common.errors import ErrorCode
    from strata.common.types import TopicPartition
    from strata.server.authorization import NOTHING_DENIED
    from strata.server.handlers.produce import _verify_transaction
    tp = TopicPartition("orders", 0)
    ulog.append_as_leader(txn_batch(), 0)
    bumped_marker = rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=PID,
                                            producer_epoch=EPOCH + 1)
    next_txn = rec.build_batch([rec.SimpleRecord(b"n", b"k")], producer_id=PID,
                               producer_epoch=EPOCH + 1, base_sequence=0, transactional=True)

    class MarkersLandDuringTheAdd:
        def partition_for(self, tid):
            return 0

        async def add_partitions(self, tid, pid, epoch, partitions, tv):
            ulog.append_as_leader(bumped_marker, 0, origin=AppendOrigin.COORDINATOR)
            return ErrorCode.NONE
    rm = NS(get_log=lambda t: ulog)
    ctx = NS(txn_verifier=_verifier(MarkersLandDuringTheAdd(), replica_manager=rm))
    body = NS(transactional_id="app", topic_data=[
        NS(name="orders", partition_data=[NS(index=0, records=next_txn)])])
    refused, guards = asyncio.run(_verify_transaction(ctx, body, 12, NOTHING_DENIED))
    assert refused == {} and tp in guards
    ulog.append_as_leader(next_txn, 0, verification_guard=guards[tp])
    assert [t.producer_id for t in ulog.producer_state.ongoing_txns.values()] == [PID]
