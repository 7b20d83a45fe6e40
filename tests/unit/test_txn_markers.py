"""Transaction markers on the partition leader (``strata.server.txn_markers``) and the
WriteTxnMarkers handler, over a real ReplicaManager and real logs."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader

from strata.common.errors import ErrorCode
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.log.indexes import AbortedTxn
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import FetchIsolation
from strata.protocol import codec
from strata.protocol import records as rec
from strata.protocol.client import client_frame
from strata.protocol.codec import ApiKey, encode_response, make, parse_request, request_class, \
    response_class
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.handlers import write_txn_markers
from strata.server.purgatory import PartitionWatchers
from strata.server.txn_markers import TxnMarker, write_markers
from support.replicas import lead_alone

TP = TopicPartition("t", 0)
TOPICS = {"t": 2, OFFSETS_TOPIC: 3}
PID = 1000
ME = 1
NONE = ErrorCode.NONE


class FakeGroupCoordinator:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple[int, int, bool]] = []
        self.fail = fail

    def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        self.calls.append((partition, producer_id, commit))
        if self.fail:
            raise RuntimeError("offsets cache unavailable")


def make_ctx(tmp_path, *, clustered: bool = False, coordinator=None) -> BrokerContext:
    manager = LogManager([tmp_path], LogConfig({}), scheduler=ImmediateScheduler())
    manager.startup()
    watchers = PartitionWatchers()
    rm = ReplicaManager(manager, TOPICS.get, watchers.notify, broker_id=ME, clustered=clustered)
    if not clustered:   # a broker alone leads every partition
        lead_alone(rm, *(TopicPartition(t, p) for t, n in TOPICS.items() for p in range(n)))
    return BrokerContext(node_id=ME, advertised_host="", advertised_port=0, metadata=None,
                         replica_manager=rm, fetch_watchers=watchers,
                         group_coordinator=coordinator)


@pytest.fixture
def ctx(tmp_path):
    c = make_ctx(tmp_path, coordinator=FakeGroupCoordinator())
    yield c
    c.replica_manager.log_manager.shutdown()


@pytest.fixture
def cluster(tmp_path):
    c = make_ctx(tmp_path, clustered=True, coordinator=FakeGroupCoordinator())
    yield c
    c.replica_manager.log_manager.shutdown()


def produce_txn(ctx, tp=TP, *, pid=PID, epoch=0, n=3, seq=0):
    batch = rec.build_batch([rec.SimpleRecord(b"v%d" % i, b"k") for i in range(n)],
                            producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                            transactional=True)
    r = ctx.replica_manager.append(tp, batch, produce_version=9, origin=AppendOrigin.CLIENT)
    assert r.error == NONE, r.message
    return r


def marker(commit=True, *partitions, pid=PID, epoch=0, coordinator_epoch=0, tv=0) -> TxnMarker:
    return TxnMarker(producer_id=pid, producer_epoch=epoch, commit=commit,
                     coordinator_epoch=coordinator_epoch,
                     partitions=[(tp.topic, tp.partition) for tp in (partitions or (TP,))],
                     transaction_version=tv)


def write(ctx, *markers, **kw):
    return asyncio.run(write_markers(ctx, list(markers), **kw))


def log_of(ctx, tp=TP):
    return ctx.replica_manager.get_log(tp)


# ---- the log ----------------------------------------------------------------------------------


def test_a_commit_marker_moves_the_last_stable_offset_past_the_transaction(ctx):
    produce_txn(ctx)
    ulog = log_of(ctx)
    assert (ulog.high_watermark, ulog.last_stable_offset) == (3, 0)
    assert write(ctx, marker(True)) == [{("t", 0): NONE}]
    assert ulog.log_end_offset == 4
    assert ulog.last_stable_offset == ulog.high_watermark == 4
    r = ctx.replica_manager.read(TP, 0, 1 << 20, FetchIsolation.TXN_COMMITTED, True)
    assert r.error == NONE and r.last_stable_offset == 4 and r.aborted_transactions == []
    [*_, last] = rec.iter_headers(r.records)
    assert last.is_control and last.base_offset == 3
    assert rec.control_type(r.records, last) == rec.CONTROL_COMMIT
    assert ulog.local_log.active_segment.txn_index.all_aborted_txns() == []
    assert ctx.group_coordinator.calls == []  # not an offsets partition


def test_an_abort_marker_is_reported_to_read_committed_fetches_and_indexed(ctx):
    produce_txn(ctx)
    assert write(ctx, marker(False, coordinator_epoch=2)) == [{("t", 0): NONE}]
    ulog = log_of(ctx)
    assert ulog.last_stable_offset == 4
    r = ctx.replica_manager.read(TP, 0, 1 << 20, FetchIsolation.TXN_COMMITTED, True)
    assert r.error == NONE
    assert [(a.producer_id, a.first_offset) for a in r.aborted_transactions] == [(PID, 0)]
    seg = ulog.local_log.active_segment
    assert seg.txn_index.all_aborted_txns() == [AbortedTxn(PID, 0, 3, 4)]
    seg.txn_index.flush()
    assert seg.txn_index.path.name.endswith(".txnindex") and seg.txn_index.path.stat().st_size > 0
    [*_, last] = rec.iter_headers(r.records)
    assert rec.control_type(r.records, last) == rec.CONTROL_ABORT


def test_a_marker_of_an_older_producer_epoch_is_invalid_producer_epoch(ctx):
    produce_txn(ctx, epoch=5)
    ulog = log_of(ctx)
    assert write(ctx, marker(True, epoch=4)) == [{("t", 0): ErrorCode.INVALID_PRODUCER_EPOCH}]
    assert ulog.log_end_offset == 3 and ulog.last_stable_offset == 0  # nothing written
    # the coordinator's bumped epoch (an abort after a timeout, or TV2) is accepted
    assert write(ctx, marker(False, epoch=6, tv=2)) == [{("t", 0): NONE}]
    assert ulog.last_stable_offset == 4
    # and now the epoch before it is the stale one
    assert write(ctx, marker(False, epoch=5)) == [{("t", 0): ErrorCode.INVALID_PRODUCER_EPOCH}]


def test_a_marker_of_an_older_coordinator_epoch_is_fenced(ctx):
    produce_txn(ctx)
    assert write(ctx, marker(True, coordinator_epoch=3)) == [{("t", 0): NONE}]
    produce_txn(ctx, seq=3)
    assert write(ctx, marker(True, coordinator_epoch=2)) == \
        [{("t", 0): ErrorCode.TRANSACTION_COORDINATOR_FENCED}]
    assert log_of(ctx).last_stable_offset == 4  # the second transaction is still open
    assert write(ctx, marker(True, coordinator_epoch=3)) == [{("t", 0): NONE}]
    assert log_of(ctx).last_stable_offset == 8


def test_a_retried_marker_is_appended_again_and_changes_nothing(ctx):
    produce_txn(ctx)
    assert write(ctx, marker(True)) == [{("t", 0): NONE}]
    assert write(ctx, marker(True)) == [{("t", 0): NONE}]
    ulog = log_of(ctx)
    assert ulog.log_end_offset == 5 and ulog.last_stable_offset == 5


def test_partitions_not_hosted_are_unknown_and_do_not_stop_the_others(ctx):
    produce_txn(ctx)
    got = write(ctx, marker(True, TopicPartition("nope", 0), TP, TopicPartition("t", 7), TP))
    assert got == [{("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ("t", 0): NONE,
                    ("t", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}]
    assert log_of(ctx).log_end_offset == 4  # one marker for the partition named twice


def test_markers_are_answered_in_order_one_result_per_marker(ctx):
    other = TopicPartition("t", 1)
    produce_txn(ctx)
    produce_txn(ctx, other, pid=7)
    got = write(ctx, marker(True, TP), marker(False, other, pid=7), marker(True, other, pid=8))
    assert got == [{("t", 0): NONE}, {("t", 1): NONE}, {("t", 1): NONE}]
    r = ctx.replica_manager.read(other, 0, 1 << 20, FetchIsolation.TXN_COMMITTED, True)
    assert [a.producer_id for a in r.aborted_transactions] == [7]


def test_clients_may_not_write_control_batches(ctx):
    produce_txn(ctx)
    batch = rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=PID, producer_epoch=0)
    r = ctx.replica_manager.append(TP, batch, produce_version=9, origin=AppendOrigin.CLIENT)
    assert r.error == ErrorCode.INVALID_RECORD
    assert log_of(ctx).last_stable_offset == 0


# ---- __consumer_offsets ------------------------------------------------------------------------


def test_a_marker_in_an_offsets_partition_completes_the_groups_transaction(ctx):
    offsets = TopicPartition(OFFSETS_TOPIC, 1)
    produce_txn(ctx, offsets, n=1)
    produce_txn(ctx)
    assert write(ctx, marker(True, offsets, TP)) == [{(OFFSETS_TOPIC, 1): NONE, ("t", 0): NONE}]
    assert ctx.group_coordinator.calls == [(1, PID, True)]
    produce_txn(ctx, offsets, n=1, seq=1)
    assert write(ctx, marker(False, offsets)) == [{(OFFSETS_TOPIC, 1): NONE}]
    assert ctx.group_coordinator.calls == [(1, PID, True), (1, PID, False)]


def test_a_refused_offsets_marker_does_not_complete_anything(ctx):
    offsets = TopicPartition(OFFSETS_TOPIC, 2)
    produce_txn(ctx, offsets, n=1, epoch=3)
    got = write(ctx, marker(True, offsets, TopicPartition(OFFSETS_TOPIC, 9), epoch=2))
    assert got == [{(OFFSETS_TOPIC, 2): ErrorCode.INVALID_PRODUCER_EPOCH,
                    (OFFSETS_TOPIC, 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}]
    assert ctx.group_coordinator.calls == []


def test_a_failing_group_coordinator_answers_unknown_server_error(tmp_path):
    ctx = make_ctx(tmp_path, coordinator=FakeGroupCoordinator(fail=True))
    try:
        offsets = TopicPartition(OFFSETS_TOPIC, 0)
        produce_txn(ctx, offsets, n=1)
        produce_txn(ctx)
        assert write(ctx, marker(True, TP, offsets)) == \
            [{("t", 0): NONE, (OFFSETS_TOPIC, 0): ErrorCode.UNKNOWN_SERVER_ERROR}]
        assert ctx.group_coordinator.calls == [(0, PID, True)]
    finally:
        ctx.replica_manager.log_manager.shutdown()


def test_no_group_coordinator_is_fine(tmp_path):
    ctx = make_ctx(tmp_path, coordinator=None)
    try:
        offsets = TopicPartition(OFFSETS_TOPIC, 0)
        produce_txn(ctx, offsets, n=1)
        assert write(ctx, marker(True, offsets)) == [{(OFFSETS_TOPIC, 0): NONE}]
    finally:
        ctx.replica_manager.log_manager.shutdown()


# ---- in a cluster ------------------------------------------------------------------------------


def test_in_a_cluster_only_the_leader_writes_markers(cluster):
    rm = cluster.replica_manager
    rm.apply_states({TP: PartitionState(ME, 2, (ME,), (ME,)),
                     TopicPartition("t", 1): PartitionState(3, 4, (3, ME), (3, ME))})
    produce_txn(cluster)
    got = write(cluster, marker(True, TP, TopicPartition("t", 1),
                                TopicPartition(OFFSETS_TOPIC, 0), TopicPartition("u", 0)))
    assert got == [{("t", 0): NONE, ("t", 1): ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    (OFFSETS_TOPIC, 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # no replica here
                    ("u", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}]
    ulog = log_of(cluster)
    assert ulog.last_stable_offset == 4
    [*_, last] = rec.iter_headers(rm.read(TP, 0, 1 << 20, FetchIsolation.LOG_END, True).records)
    assert last.is_control and last.partition_leader_epoch == 2


def test_in_a_cluster_a_marker_needs_min_insync_replicas(cluster):
    rm = cluster.replica_manager
    rm.apply_states({TP: PartitionState(ME, 0, (ME,), (ME, 3))})
    produce_txn(cluster)
    rm.min_insync_replicas = lambda topic: 2
    assert write(cluster, marker(True)) == [{("t", 0): ErrorCode.NOT_ENOUGH_REPLICAS}]
    assert log_of(cluster).log_end_offset == 3


def test_in_a_cluster_the_answer_waits_for_the_isr(cluster):
    rm = cluster.replica_manager
    offsets = TopicPartition(OFFSETS_TOPIC, 0)
    rm.apply_states({TP: PartitionState(ME, 0, (ME, 3), (ME, 3)),
                     offsets: PartitionState(ME, 0, (ME, 3), (ME, 3))})
    produce_txn(cluster)
    produce_txn(cluster, offsets, n=1)
    for tp in (TP, offsets):  # the follower has the transactions' data
        rm.follower_fetch(tp, 3, log_of(cluster, tp).log_end_offset, -1, 1 << 20, 0)

    async def scenario():
        task = asyncio.create_task(write_markers(cluster, [marker(True, TP, offsets)]))
        await asyncio.sleep(0.05)
        assert not task.done()
        assert cluster.group_coordinator.calls == []  # not replicated yet
        assert log_of(cluster).log_end_offset == 4 and log_of(cluster).high_watermark == 3
        for tp in (TP, offsets):
            rm.follower_fetch(tp, 3, log_of(cluster, tp).log_end_offset, 0, 1 << 20, 0)
        return await asyncio.wait_for(task, 5)

    assert asyncio.run(scenario()) == [{("t", 0): NONE, (OFFSETS_TOPIC, 0): NONE}]
    assert log_of(cluster).last_stable_offset == 4
    assert cluster.group_coordinator.calls == [(0, PID, True)]


def test_in_a_cluster_a_marker_not_replicated_in_time_times_out(cluster):
    rm = cluster.replica_manager
    offsets = TopicPartition(OFFSETS_TOPIC, 0)
    rm.apply_states({offsets: PartitionState(ME, 0, (ME, 3), (ME, 3))})
    produce_txn(cluster, offsets, n=1)
    cluster = replace(cluster, txn_marker_timeout_s=0.05)
    assert write(cluster, marker(True, offsets)) == \
        [{(OFFSETS_TOPIC, 0): ErrorCode.REQUEST_TIMED_OUT}]
    assert cluster.group_coordinator.calls == []


# ---- the handler, through the wire format ------------------------------------------------------


@pytest.fixture
def wire(monkeypatch):
    """Decodable WriteTxnMarkers (the dispatcher registers it elsewhere)."""
    monkeypatch.setitem(codec.API_VERSIONS, ApiKey.WRITE_TXN_MARKERS, (1, 2))
    yield
    for v in (1, 2):
        codec._DECODERS.pop((ApiKey.WRITE_TXN_MARKERS, v), None)


def send(ctx, version: int, markers: list[dict]):
    api = ApiKey.WRITE_TXN_MARKERS
    rq = request_class(api, version)
    body = make(rq, markers=tuple(
        make(rq, "markers", **{k: v for k, v in m.items() if k != "topics"}, topics=tuple(
            make(rq, "markers.topics", name=name, partition_indexes=tuple(parts))
            for name, parts in m["topics"].items()))
        for m in markers))
    request = parse_request(client_frame(body, correlation_id=5))
    assert request.api_version == version
    frame = encode_response(request, asyncio.run(write_txn_markers.handle(ctx, request)))
    cls = response_class(api, version)
    start = 8 + (0 if cls.__header_schema__ is ResponseHeaderV0 else 1)
    response, size = entity_reader(cls)(frame, start)
    assert start + size == len(frame)
    return {int(m.producer_id): {t.name: {int(p.partition_index): int(p.error_code)
                                          for p in t.partitions} for t in m.topics}
            for m in response.markers}


@pytest.mark.parametrize("version", [1, 2])
def test_write_txn_markers_handler(ctx, wire, version):
    offsets = TopicPartition(OFFSETS_TOPIC, 1)
    produce_txn(ctx)
    produce_txn(ctx, TopicPartition("t", 1))
    produce_txn(ctx, offsets, pid=9, n=1)
    extra = {"transaction_version": 2} if version >= 2 else {}
    got = send(ctx, version, [
        dict(producer_id=PID, producer_epoch=0, transaction_result=True, coordinator_epoch=1,
             topics={"t": [0], "gone": [0]}, **extra),
        dict(producer_id=9, producer_epoch=0, transaction_result=False, coordinator_epoch=1,
             topics={OFFSETS_TOPIC: [1]}),
        # a second marker of the same producer id: merged into its entry, as Kafka's
        dict(producer_id=PID, producer_epoch=0, transaction_result=False, coordinator_epoch=1,
             topics={"t": [1]}),
        dict(producer_id=11, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
             topics={"t": [5]}),
    ])
    assert got == {
        PID: {"t": {0: NONE, 1: NONE}, "gone": {0: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}},
        9: {OFFSETS_TOPIC: {1: NONE}},
        11: {"t": {5: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}},
    }
    assert log_of(ctx).last_stable_offset == 4
    r = ctx.replica_manager.read(TopicPartition("t", 1), 0, 1 << 20,
                                 FetchIsolation.TXN_COMMITTED, True)
    assert [a.producer_id for a in r.aborted_transactions] == [PID]
    assert ctx.group_coordinator.calls == [(1, 9, False)]


@pytest.mark.parametrize("version", [1, 2])
def test_write_txn_markers_handler_with_no_markers(ctx, wire, version):
    assert send(ctx, version, []) == {}
