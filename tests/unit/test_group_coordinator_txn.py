"""Transactional offset commits in the group coordinator (TxnOffsetCommit, Kafka's
pendingTransactionalOffsetCommits): pending per producer id until the transaction's marker,
the log-order rule against plain commits, loading open/committed/aborted transactions from a
real partition log, and the TxnOffsetCommit handler.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace

import pytest
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader

from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.coordinator.group import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    GroupState,
    OffsetCommitPartition,
)
from strata.coordinator.offsets_log import ReplayMarker, ReplayRecord, ReplicaOffsetsLog
from strata.coordinator.offsets_records import OFFSETS_TOPIC, OffsetCommitKey
from strata.log.producer_state import AppendOrigin
from strata.protocol import records as rec
from strata.protocol.codec import (
    ApiKey,
    encode_response,
    make,
    parse_request,
    request_class,
    response_class,
)
from strata.server.handlers import txn_offset_commit
from test_group_coordinator import GROUP, Harness, MemoryOffsetsLog, run, settle
from test_offsets_log import Broker
from wire import client_frame

PID, EPOCH = 4000, 2
TXN_ID = "txn-1"


class TxnMemoryOffsetsLog(MemoryOffsetsLog):
    """``MemoryOffsetsLog`` that keeps the transaction structure: each partition is a list of
    ``ReplayRecord``/``ReplayMarker`` in append order; ``marker`` writes a transaction marker
    as the WriteTxnMarkers handler would."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[int, list] = defaultdict(list)
        self.batches: list[tuple[int, int, int, bool, int]] = []  # partition, pid, epoch, txn, n

    async def append(self, partition, records, *, producer_id=-1, producer_epoch=-1,
                     transactional=False) -> None:
        self.appends += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise KafkaError("append failed", self.fail_with)
        self.batches.append((partition, producer_id, producer_epoch, transactional, len(records)))
        for key, value in records:
            self.items[partition].append(ReplayRecord(key, value, producer_id, transactional,
                                                      len(self.items[partition])))
        self.partitions[partition].extend(records)  # what ``decoded`` shows (every record)

    def marker(self, partition: int, producer_id: int, commit: bool) -> None:
        self.items[partition].append(ReplayMarker(producer_id, commit,
                                                  len(self.items[partition])))

    def replay_batches(self, partition: int):
        return list(self.items.get(partition, ()))

    def replay(self, partition: int):
        raise AssertionError("the loader reads replay_batches when the log has it")


def harness(**config) -> Harness:
    return Harness(TxnMemoryOffsetsLog(), **config)


async def txn_commit(h: Harness, offsets, *, pid=PID, epoch=EPOCH, group=GROUP, **kw):
    return await h.coord.commit_transactional_offsets(
        TXN_ID, group, pid, epoch,
        [OffsetCommitPartition(t, p, o, *rest) for t, p, o, *rest in offsets], **kw)


def fetched(h: Harness, *tps, stable=False, group=GROUP):
    result = h.coord.fetch_offsets(group, list(tps), require_stable=stable)
    assert result.error == ErrorCode.NONE
    return {tp: (o.offset, o.error) for tp, o in result.offsets.items()}


UNSTABLE = (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)


# =========================================================================== pending / complete

def test_transactional_offsets_are_invisible_until_the_commit_marker():
    async def main():
        h = harness()
        assert await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 5)]) == {
            ("t", 0): ErrorCode.NONE}
        errors = await txn_commit(h, [("t", 0, 10, 7, "m"), ("t", 1, 20)])
        assert errors == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE}
        # one transactional batch of the producer, to the group's partition
        assert h.log.batches[-1] == (h.partition, PID, EPOCH, True, 2)
        keys = [k for k, _ in h.log.decoded(h.partition)[-2:]]
        assert keys == [OffsetCommitKey(GROUP, "t", 0), OffsetCommitKey(GROUP, "t", 1)]

        assert fetched(h, ("t", 0), ("t", 1)) == {("t", 0): (5, ErrorCode.NONE),
                                                  ("t", 1): (-1, ErrorCode.NONE)}
        assert fetched(h, ("t", 0), ("t", 1), stable=True) == {("t", 0): UNSTABLE,
                                                               ("t", 1): UNSTABLE}
        assert h.coord.fetch_offsets(GROUP).offsets.keys() == {("t", 0)}

        h.coord.complete_transaction(h.partition + 1, PID, True)   # another partition's marker
        h.coord.complete_transaction(h.partition, PID + 1, True)   # another producer's
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): UNSTABLE}

        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0), ("t", 1), stable=True) == {("t", 0): (10, ErrorCode.NONE),
                                                               ("t", 1): (20, ErrorCode.NONE)}
        got = h.coord.fetch_offsets(GROUP, [("t", 0)]).offsets[("t", 0)]
        assert (got.leader_epoch, got.metadata) == (7, "m")
        h.coord.complete_transaction(h.partition, PID, True)      # a retried marker: no-op
        assert fetched(h, ("t", 0)) == {("t", 0): (10, ErrorCode.NONE)}
    run(main())


def test_an_aborted_transaction_leaves_the_committed_offsets_alone():
    async def main():
        h = harness()
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 5)])
        await txn_commit(h, [("t", 0, 10), ("t", 1, 20)])
        await txn_commit(h, [("t", 2, 30)], pid=PID + 1)
        h.coord.complete_transaction(h.partition, PID, False)
        assert fetched(h, ("t", 0), ("t", 1), stable=True) == {
            ("t", 0): (5, ErrorCode.NONE), ("t", 1): (-1, ErrorCode.NONE)}
        # the other producer's transaction is still open, then commits
        assert fetched(h, ("t", 2), stable=True) == {("t", 2): UNSTABLE}
        h.coord.complete_transaction(h.partition, PID + 1, True)
        assert fetched(h, ("t", 2), stable=True) == {("t", 2): (30, ErrorCode.NONE)}
    run(main())


def test_a_later_transactional_commit_of_the_same_partition_replaces_the_pending_one():
    async def main():
        h = harness()
        await txn_commit(h, [("t", 0, 10)])
        await txn_commit(h, [("t", 0, 11)])
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0)) == {("t", 0): (11, ErrorCode.NONE)}
    run(main())


def test_a_plain_commit_appended_after_the_transactional_one_wins_when_the_transaction_commits():
    async def main():
        h = harness()
        await txn_commit(h, [("t", 0, 10), ("t", 1, 10)])
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 20)])
        # the plain commit is visible at once; the partition is still unstable
        assert fetched(h, ("t", 0)) == {("t", 0): (20, ErrorCode.NONE)}
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): UNSTABLE}
        h.coord.complete_transaction(h.partition, PID, True)
        # Kafka's rule: the offset whose record is later in the log wins
        assert fetched(h, ("t", 0), ("t", 1), stable=True) == {
            ("t", 0): (20, ErrorCode.NONE), ("t", 1): (10, ErrorCode.NONE)}

        # the other way round: a plain commit before the transactional one loses to it
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 2, 50)])
        await txn_commit(h, [("t", 2, 40)], pid=PID + 1)
        h.coord.complete_transaction(h.partition, PID + 1, True)
        assert fetched(h, ("t", 2)) == {("t", 2): (40, ErrorCode.NONE)}
    run(main())


def test_a_plain_commit_in_flight_and_a_transaction_both_make_the_partition_unstable():
    async def main():
        h = harness()
        h.log.gate = asyncio.Event()
        task = asyncio.get_running_loop().create_task(txn_commit(h, [("t", 0, 10)]))
        await settle()
        assert not task.done()
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): UNSTABLE}  # pending from the start
        h.log.gate.set()
        assert await task == {("t", 0): ErrorCode.NONE}
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): UNSTABLE}
    run(main())


def test_a_failed_append_leaves_nothing_pending_and_maps_the_error():
    async def main():
        h = harness()
        h.log.fail_with = ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert await txn_commit(h, [("t", 0, 10)]) == {("t", 0): ErrorCode.NOT_COORDINATOR}
        h.log.fail_with = ErrorCode.NOT_ENOUGH_REPLICAS
        assert await txn_commit(h, [("t", 0, 10)]) == {
            ("t", 0): ErrorCode.COORDINATOR_NOT_AVAILABLE}
        h.log.fail_with = ErrorCode.INVALID_PRODUCER_EPOCH       # passed through, as in Kafka
        assert await txn_commit(h, [("t", 0, 10)]) == {("t", 0): ErrorCode.INVALID_PRODUCER_EPOCH}
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): (-1, ErrorCode.NONE)}
        h.log.fail_with = None
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0)) == {("t", 0): (-1, ErrorCode.NONE)}
        assert h.coord._offsets.txn_groups == {}
    run(main())


def test_metadata_over_the_limit_is_refused_per_partition():
    async def main():
        h = harness(offset_metadata_max_bytes=4)
        errors = await txn_commit(h, [("t", 0, 1, -1, "12345"), ("t", 1, 2, -1, "1234")])
        assert errors == {("t", 0): ErrorCode.OFFSET_METADATA_TOO_LARGE,
                          ("t", 1): ErrorCode.NONE}
        assert await txn_commit(h, [("t", 0, 1, -1, "12345")]) == {
            ("t", 0): ErrorCode.OFFSET_METADATA_TOO_LARGE}
        assert h.log.batches[-1][4] == 1          # only the valid one was written
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0), ("t", 1)) == {("t", 0): (-1, ErrorCode.NONE),
                                                  ("t", 1): (2, ErrorCode.NONE)}
    run(main())


# =========================================================================== validation

def test_group_status_errors():
    async def main():
        h = harness()
        assert await txn_commit(h, [("t", 0, 1)], group="") == {
            ("t", 0): ErrorCode.INVALID_GROUP_ID}
        h.coord.unload([h.partition])
        assert await txn_commit(h, [("t", 0, 1)]) == {("t", 0): ErrorCode.NOT_COORDINATOR}
        h.coord._loading.add(h.partition)
        assert await txn_commit(h, [("t", 0, 1)]) == {
            ("t", 0): ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
    run(main())


def test_an_unknown_group_is_created_empty_and_kept_while_its_transaction_is_open():
    async def main():
        h = harness(offsets_retention_ms=1000)
        assert await txn_commit(h, [("t", 0, 10)]) == {("t", 0): ErrorCode.NONE}
        assert h.coord.group_state(GROUP) == GroupState.EMPTY
        await h.advance(5000)
        assert await h.coord.expire_offsets() == 0
        assert h.coord.group_state(GROUP) == GroupState.EMPTY     # pending offsets keep it
        h.coord.complete_transaction(h.partition, PID, False)
        await h.coord.expire_offsets()
        assert h.coord.group_state(GROUP) is None                 # nothing left: deleted
    run(main())


def test_member_and_generation_validation_of_a_group_with_members():
    async def main():
        h = harness()
        joins = await h.stable_group("a")
        member = joins["a"].member_id
        assert await txn_commit(h, [("t", 0, 1)], member_id=member, generation_id=1) == {
            ("t", 0): ErrorCode.NONE}
        assert await txn_commit(h, [("t", 0, 1)], member_id=member, generation_id=2) == {
            ("t", 0): ErrorCode.ILLEGAL_GENERATION}
        assert await txn_commit(h, [("t", 0, 1)], member_id="nobody", generation_id=1) == {
            ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
        assert await txn_commit(h, [("t", 0, 1)], member_id="", generation_id=1) == {
            ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
        # v0-2 carry no member: accepted in a group with members (not for a plain commit)
        assert await txn_commit(h, [("t", 0, 1)]) == {("t", 0): ErrorCode.NONE}
        assert await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 1)]) == {
            ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    run(main())


def test_a_static_member_is_fenced_by_its_instance_id():
    async def main():
        h = harness()
        j = h.join(client_id="a", group_instance_id="inst")
        await h.advance(0)
        r = await j
        await h.sync(r.member_id, r.generation_id, {r.member_id: b""})
        ok = await txn_commit(h, [("t", 0, 1)], member_id=r.member_id,
                              generation_id=r.generation_id, group_instance_id="inst")
        assert ok == {("t", 0): ErrorCode.NONE}
        assert await txn_commit(h, [("t", 0, 1)], member_id="old-id", generation_id=1,
                                group_instance_id="inst") == {
            ("t", 0): ErrorCode.FENCED_INSTANCE_ID}
        assert await txn_commit(h, [("t", 0, 1)], member_id=r.member_id, generation_id=1,
                                group_instance_id="other") == {
            ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    run(main())


def test_a_member_commits_during_completing_rebalance_as_kafka_allows():
    async def main():
        h = harness()
        j = h.join(client_id="a")
        await h.advance(0)
        r = await j
        assert h.coord.group_state(GROUP) == GroupState.COMPLETING_REBALANCE
        assert await txn_commit(h, [("t", 0, 1)], member_id=r.member_id,
                                generation_id=r.generation_id) == {("t", 0): ErrorCode.NONE}
    run(main())


# =========================================================================== unload / delete

def test_unload_drops_pending_state_and_a_reload_brings_back_the_open_transaction():
    async def main():
        h = harness()
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 5)])
        await txn_commit(h, [("t", 0, 10)])
        h.coord.unload([h.partition])
        assert h.coord._offsets.txn_groups == {}
        h.coord.complete_transaction(h.partition, PID, True)   # not ours any more: nothing
        h.coord.load([h.partition])
        assert fetched(h, ("t", 0)) == {("t", 0): (5, ErrorCode.NONE)}
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): UNSTABLE}
        h.log.marker(h.partition, PID, True)
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0), stable=True) == {("t", 0): (10, ErrorCode.NONE)}
    run(main())


def test_a_deleted_topic_takes_its_pending_offsets_with_it():
    async def main():
        h = harness()
        await txn_commit(h, [("gone", 0, 10), ("kept", 0, 20)])
        h.coord._offsets.delete_topic_offsets("gone")
        assert fetched(h, ("gone", 0), stable=True) == {("gone", 0): (-1, ErrorCode.NONE)}
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("gone", 0), ("kept", 0)) == {("gone", 0): (-1, ErrorCode.NONE),
                                                        ("kept", 0): (20, ErrorCode.NONE)}
    run(main())


def test_deleting_the_group_drops_its_open_transaction():
    async def main():
        h = harness()
        await txn_commit(h, [("t", 0, 10)])
        assert await h.coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
        assert h.coord.group_state(GROUP) is None and h.coord._offsets.txn_groups == {}
        h.coord.complete_transaction(h.partition, PID, True)
        assert fetched(h, ("t", 0)) == {("t", 0): (-1, ErrorCode.NONE)}
    run(main())


# =========================================================================== loading

def test_load_resolves_transactions_from_the_log_structure():
    async def main():
        h = harness()
        p = h.partition
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 1), ("t", 1, 1), ("t", 2, 1)])
        await txn_commit(h, [("t", 0, 10)], pid=1)          # committed
        await txn_commit(h, [("t", 1, 20)], pid=2)          # aborted
        await txn_commit(h, [("t", 2, 30)], pid=3)          # committed, but older than ...
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 2, 31)])   # ... this plain commit
        await txn_commit(h, [("t", 3, 40)], pid=4)          # open
        await txn_commit(h, [("t", 0, 40)], group="other", pid=4)  # open, group with no other state
        for pid, commit in ((1, True), (2, False), (3, True)):
            h.log.marker(p, pid, commit)

        h2 = Harness(h.log)
        other_p = h2.coord.partition_for("other")
        assert fetched(h2, ("t", 0), ("t", 1), ("t", 2), ("t", 3)) == {
            ("t", 0): (10, ErrorCode.NONE), ("t", 1): (1, ErrorCode.NONE),
            ("t", 2): (31, ErrorCode.NONE), ("t", 3): (-1, ErrorCode.NONE)}
        assert fetched(h2, ("t", 3), stable=True) == {("t", 3): UNSTABLE}
        assert h2.coord.group_state("other") == GroupState.EMPTY
        assert fetched(h2, ("t", 0), group="other", stable=True) == {("t", 0): UNSTABLE}
        h2.coord.complete_transaction(p, 4, True)
        assert fetched(h2, ("t", 3), stable=True) == {("t", 3): (40, ErrorCode.NONE)}
        if other_p != p:
            assert fetched(h2, ("t", 0), group="other", stable=True) == {("t", 0): UNSTABLE}
        h2.coord.complete_transaction(other_p, 4, True)
        assert fetched(h2, ("t", 0), group="other", stable=True) == {
            ("t", 0): (40, ErrorCode.NONE)}
    run(main())


def test_load_drops_open_transactional_offsets_of_deleted_topics():
    async def main():
        h = harness()
        await txn_commit(h, [("gone", 0, 10), ("kept", 0, 20)])
        h2 = Harness(h.log, topic_exists=lambda topic: topic != "gone")
        assert fetched(h2, ("gone", 0), ("kept", 0), stable=True) == {
            ("gone", 0): (-1, ErrorCode.NONE), ("kept", 0): UNSTABLE}
    run(main())


def test_a_log_without_replay_batches_still_loads():
    async def main():
        h = Harness()                          # the plain MemoryOffsetsLog: replay only
        await h.coord.commit_offsets(GROUP, "", -1, [("t", 0, 5)])
        h2 = Harness(h.log)
        assert fetched(h2, ("t", 0)) == {("t", 0): (5, ErrorCode.NONE)}
    run(main())


# =========================================================================== real logs

PROPS = {"offsets.topic.num.partitions": "3"}


def coordinator_on(broker: Broker) -> GroupCoordinator:
    log = broker.offsets_log()
    gc = GroupCoordinator(log, GroupCoordinatorConfig(offsets_topic_num_partitions=log.ensure_topic()))
    gc.load()
    return gc


def write_marker(broker: Broker, partition: int, pid: int, epoch: int, commit: bool) -> None:
    batch = rec.build_control_batch(rec.CONTROL_COMMIT if commit else rec.CONTROL_ABORT,
                                    producer_id=pid, producer_epoch=epoch)
    result = broker.replica_manager.append(TopicPartition(OFFSETS_TOPIC, partition), batch,
                                           produce_version=None,
                                           origin=AppendOrigin.COORDINATOR)
    assert result.error == ErrorCode.NONE


def test_txn_offset_commits_on_a_real_log_survive_a_restart_committed_aborted_and_open(tmp_path):
    async def first_life():
        b = Broker(tmp_path, PROPS)
        gc = coordinator_on(b)
        p = gc.partition_for(GROUP)
        commit = gc.commit_transactional_offsets
        assert await gc.commit_offsets(GROUP, "", -1, [("t", 0, 1), ("t", 1, 1), ("t", 2, 1)]) \
            == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE, ("t", 2): ErrorCode.NONE}
        assert await commit("a", GROUP, 11, 0, [("t", 0, 10, 3, "ten")]) == {
            ("t", 0): ErrorCode.NONE}
        assert await commit("b", GROUP, 12, 0, [("t", 1, 20)]) == {("t", 1): ErrorCode.NONE}
        assert await commit("c", GROUP, 13, 0, [("t", 2, 30)]) == {("t", 2): ErrorCode.NONE}
        await gc.commit_offsets(GROUP, "", -1, [("t", 2, 31)])
        assert await commit("d", GROUP, 14, 5, [("t", 3, 40)]) == {("t", 3): ErrorCode.NONE}
        for pid, epoch, ok in ((11, 0, True), (12, 0, False), (13, 0, True)):
            write_marker(b, p, pid, epoch, ok)
            gc.complete_transaction(p, pid, ok)
        before = gc.fetch_offsets(GROUP, [("t", i) for i in range(4)], require_stable=True)

        # the batches on disk: plain ones without producer, the transactional ones with it
        ulog = b.replica_manager.get_log(TopicPartition(OFFSETS_TOPIC, p))
        headers = list(rec.iter_headers(ulog.read(0, 1 << 20).records))
        txn = [(h.producer_id, h.producer_epoch, h.base_sequence) for h in headers
               if h.is_transactional and not h.is_control]
        assert txn == [(11, 0, 0), (12, 0, 0), (13, 0, 0), (14, 5, 0)]
        assert all(h.producer_id == -1 for h in headers if not h.is_transactional)
        gc.shutdown()
        b.shutdown()
        return p, before

    async def second_life(p):
        b = Broker(tmp_path, PROPS)
        gc = coordinator_on(b)
        wanted = [("t", i) for i in range(4)]
        plain = gc.fetch_offsets(GROUP, wanted)
        stable = gc.fetch_offsets(GROUP, wanted, require_stable=True)
        write_marker(b, p, 14, 5, True)
        gc.complete_transaction(p, 14, True)
        done = gc.fetch_offsets(GROUP, wanted, require_stable=True)
        gc.shutdown()
        b.shutdown()
        return plain, stable, done

    p, before = run(first_life())
    plain, stable, done = run(second_life(p))

    def view(result):
        return {tp: (o.offset, o.error) for tp, o in result.offsets.items()}

    expected = {("t", 0): (10, ErrorCode.NONE), ("t", 1): (1, ErrorCode.NONE),
                ("t", 2): (31, ErrorCode.NONE)}
    assert view(before) == {**expected, ("t", 3): UNSTABLE}
    assert view(plain) == {**expected, ("t", 3): (-1, ErrorCode.NONE)}
    assert view(stable) == {**expected, ("t", 3): UNSTABLE}
    assert view(done) == {**expected, ("t", 3): (40, ErrorCode.NONE)}
    assert plain.offsets[("t", 0)][1:3] == (3, "ten")

    # and a third life sees the transaction that committed in the second
    async def third_life():
        b = Broker(tmp_path, PROPS)
        gc = coordinator_on(b)
        result = gc.fetch_offsets(GROUP, [("t", 3)], require_stable=True)
        gc.shutdown()
        b.shutdown()
        return result
    assert view(run(third_life())) == {("t", 3): (40, ErrorCode.NONE)}


def test_replay_batches_yields_records_and_markers_in_log_order(tmp_path):
    b = Broker(tmp_path, PROPS)
    try:
        log = b.offsets_log(chunk_bytes=64)
        log.ensure_topic()
        run(log.append(1, [(b"plain", b"1")]))
        run(log.append(1, [(b"t1", b"a"), (b"t2", b"b")], producer_id=7, producer_epoch=1,
                       transactional=True))
        write_marker(b, 1, 7, 1, False)
        run(log.append(1, [(b"t3", b"c")], producer_id=7, producer_epoch=1, transactional=True))
        write_marker(b, 1, 7, 1, True)
        run(log.append(1, [(b"open", b"d")], producer_id=8, producer_epoch=0,
                       transactional=True))
        items = list(log.replay_batches(1))
        assert items == [
            ReplayRecord(b"plain", b"1", -1, False, 0),
            ReplayRecord(b"t1", b"a", 7, True, 1), ReplayRecord(b"t2", b"b", 7, True, 2),
            ReplayMarker(7, False, 3),
            ReplayRecord(b"t3", b"c", 7, True, 4),
            ReplayMarker(7, True, 5),
            ReplayRecord(b"open", b"d", 8, True, 6)]
        assert [m.is_marker for m in items] == [False, False, False, True, False, True, False]
        # read_committed replay still gives the committed data only
        assert list(log.replay(1)) == [(b"plain", b"1"), (b"t3", b"c")]
        assert list(log.replay_batches(0)) == []
        with pytest.raises(ValueError):
            run(log.append(1, [(b"k", b"v")], transactional=True))
    finally:
        b.shutdown()


def test_the_transaction_state_log_has_kafkas_topic_configs(tmp_path):
    b = Broker(tmp_path, {"transaction.state.log.num.partitions": "4"})
    try:
        log = ReplicaOffsetsLog.for_transaction_state(b.replica_manager, b.metadata, b.props)
        assert (log.topic, log.configured_partitions, log.commit_timeout_s) == (
            "__transaction_state", 4, 30.0)
        assert log.ensure_topic() == 4
        info = b.metadata.topic("__transaction_state")
        assert info.configs == {"unclean.leader.election.enable": "false",
                                "compression.type": "uncompressed",
                                "cleanup.policy": "compact", "min.insync.replicas": "2",
                                "segment.bytes": "104857600"}
        # one broker: min.insync.replicas=2 does not stop its (acks=1) appends
        run(log.append(2, [(b"txn-id", b"state")]))
        assert list(log.replay(2)) == [(b"txn-id", b"state")]
        # the default stays __consumer_offsets, as the broker builds it
        default = ReplicaOffsetsLog(b.replica_manager, b.metadata, b.props)
        assert (default.topic, default.configured_partitions, default.commit_timeout_s) == (
            OFFSETS_TOPIC, 50, 5.0)
        with pytest.raises(ValueError):
            ReplicaOffsetsLog(b.replica_manager, b.metadata, b.props, topic="__transaction_state")
    finally:
        b.shutdown()


def test_the_transaction_state_log_reads_its_broker_properties(tmp_path):
    props = {"transaction.state.log.num.partitions": "7",
             "transaction.state.log.min.isr": "1",
             "transaction.state.log.segment.bytes": "1048576", "request.timeout.ms": "1500"}
    log = ReplicaOffsetsLog.for_transaction_state(None, None, props)
    assert (log.configured_partitions, log.commit_timeout_s) == (7, 1.5)
    assert log.topic_configs["min.insync.replicas"] == "1"
    assert log.topic_configs["segment.bytes"] == "1048576"


# =========================================================================== the handler

class Topics:
    def __init__(self, **partitions: int):
        self.partitions = partitions

    def topic(self, name):
        n = self.partitions.get(name)
        return None if n is None else SimpleNamespace(name=name, partitions=n)


def request(version: int, **fields):
    rq = request_class(ApiKey.TXN_OFFSET_COMMIT, version)
    topics = (
        make(rq, "topics", name="orders", partitions=(
            make(rq, "topics.partitions", partition_index=0, committed_offset=10,
                 committed_metadata="m"),
            make(rq, "topics.partitions", partition_index=5, committed_offset=10,
                 committed_metadata=None))),
        make(rq, "topics", name="missing", partitions=(
            make(rq, "topics.partitions", partition_index=0, committed_offset=1,
                 committed_metadata=""),)))
    body = make(rq, transactional_id=TXN_ID, group_id=fields.pop("group_id", GROUP),
                producer_id=PID, producer_epoch=EPOCH, topics=topics, **fields)
    return parse_request(client_frame(body, correlation_id=3))


def answer(req, response) -> dict:
    frame = encode_response(req, response)     # every version's response encodes
    cls = response_class(ApiKey.TXN_OFFSET_COMMIT, req.api_version)
    start = 8 + (0 if cls.__header_schema__ is ResponseHeaderV0 else 1)
    decoded, size = entity_reader(cls)(frame, start)
    assert start + size == len(frame)
    return {(t.name, p.partition_index): ErrorCode(p.error_code)
            for t in decoded.topics for p in t.partitions}


class AddingVerifier:
    """The leader's add of a partition to a V2 transaction, recorded."""

    def __init__(self):
        self.added = []

    async def add(self, transactional_id, producer_id, producer_epoch, partition):
        self.added.append((transactional_id, producer_id, producer_epoch, partition))
        return ErrorCode.NONE


@pytest.mark.parametrize("version", range(6))
def test_the_handler_commits_the_existing_partitions_in_every_version(version):
    async def main():
        h = harness()
        verifier = AddingVerifier()
        ctx = SimpleNamespace(metadata=Topics(orders=2), group_coordinator=h.coord, authorizer=None,
                              txn_verifier=verifier)
        fields = {}
        if version >= 3:
            fields = dict(generation_id=-1, member_id="", group_instance_id=None)
        req = request(version, **fields)
        errors = answer(req, await txn_offset_commit.handle(ctx, req))
        assert errors == {("orders", 0): ErrorCode.NONE,
                          ("orders", 5): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                          ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert fetched(h, ("orders", 0), stable=True) == {("orders", 0): UNSTABLE}
        h.coord.complete_transaction(h.partition, PID, True)
        got = h.coord.fetch_offsets(GROUP, [("orders", 0)]).offsets[("orders", 0)]
        assert (got.offset, got.metadata) == (10, "m")
        assert h.log.batches[-1] == (h.partition, PID, EPOCH, True, 1)
        # v5 (transactions V2): the group's offsets partition joins the transaction implicitly
        assert [a[3] for a in verifier.added] == ([("__consumer_offsets", h.partition)]
                                                  if version >= 5 else [])
    run(main())


def test_the_handler_passes_member_fields_from_v3():
    async def main():
        h = harness()
        joins = await h.stable_group("a")
        ctx = SimpleNamespace(metadata=Topics(orders=1), group_coordinator=h.coord, authorizer=None)
        req = request(3, generation_id=7, member_id=joins["a"].member_id)
        errors = answer(req, await txn_offset_commit.handle(ctx, req))
        assert errors[("orders", 0)] == ErrorCode.ILLEGAL_GENERATION
    run(main())


@pytest.mark.parametrize("version,expected", [(1, ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                              (2, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)])
def test_the_handler_hides_load_in_progress_from_v0_1(version, expected):
    async def main():
        h = harness()
        h.coord._loading.add(h.partition)
        ctx = SimpleNamespace(metadata=Topics(orders=1), group_coordinator=h.coord, authorizer=None)
        req = request(version)
        assert answer(req, await txn_offset_commit.handle(ctx, req))[("orders", 0)] == expected
    run(main())


def test_the_handler_without_a_coordinator_answers_coordinator_not_available():
    async def main():
        ctx = SimpleNamespace(metadata=Topics(orders=1), group_coordinator=None, authorizer=None)
        req = request(5)
        errors = answer(req, await txn_offset_commit.handle(ctx, req))
        assert errors[("orders", 0)] == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert errors[("missing", 0)] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    run(main())


def test_the_handler_refuses_an_empty_group_id():
    async def main():
        h = harness()
        ctx = SimpleNamespace(metadata=Topics(orders=1), group_coordinator=h.coord, authorizer=None)
        ctx.txn_verifier = AddingVerifier()
        req = request(5, group_id="")
        assert answer(req, await txn_offset_commit.handle(ctx, req))[("orders", 0)] == (
            ErrorCode.INVALID_GROUP_ID)
        assert ctx.txn_verifier.added == []   # refused before anything joins the transaction
    run(main())
