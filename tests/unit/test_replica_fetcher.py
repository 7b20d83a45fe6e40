"""The follower side of replication: fetcher threads copy a leader's log through Fetch v12,
truncate where they diverge (KIP-320) or fall out of range, and back off on errors.

The leader is a fake connection answering kio FetchResponse/ListOffsetsResponse v12/v9 from a
real leader-side UnifiedLog (``FakeLeader``), or with scripted errors."""

from __future__ import annotations

import contextlib
import datetime
import logging
import socket
import threading
import time

import pytest
from kio.schema.fetch.v12 import response as fr
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.list_offsets.v9 import response as lr
from kio.schema.list_offsets.v9.request import ListOffsetsRequest
from kio.schema.offset_for_leader_epoch.v4 import response as er
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderEpochRequest

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.unified_log import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, FetchIsolation, UnifiedLog)
from strata.protocol import records as rec
from strata.protocol.codec import kio_error_code
from strata.replication.replica_fetcher import ReplicaFetcherManager, fetcher_id
from support.waiting import eventually
from support.metadata_stand_in import no_metadata

TP = TopicPartition("t", 0)
ME = 2
LEADER = 1
OTHER_LEADER = 3
DEADLINE = 10.0


T0 = 1_700_000_000_000


def batch(n: int = 1, value: bytes = b"v", **kw) -> bytes:
    """Fixed timestamps: equal batches are equal bytes on leader and follower."""
    return rec.build_batch([rec.SimpleRecord(value + b"%d" % i, b"k%d" % i, timestamp=T0)
                            for i in range(n)], **kw)


def append(ulog: UnifiedLog, epoch: int, count: int = 1, value: bytes = b"v") -> None:
    for _ in range(count):
        ulog.append_as_leader(batch(value=value), epoch)


def all_bytes(ulog: UnifiedLog) -> bytes:
    if ulog.log_end_offset == ulog.local_log_start_offset:
        return b""
    return bytes(ulog.read(ulog.local_log_start_offset, 1 << 30, FetchIsolation.LOG_END).records)


def partition(tp: TopicPartition, code: ErrorCode = ErrorCode.NONE, *, hw: int = -1,
              log_start: int = -1, records: bytes = b"",
              diverging: tuple[int, int] | None = None) -> fr.PartitionData:
    extra = {}
    if diverging is not None:
        extra["diverging_epoch"] = fr.EpochEndOffset(epoch=diverging[0], end_offset=diverging[1])
    return fr.PartitionData(partition_index=tp.partition, error_code=kio_error_code(code),
                            high_watermark=hw, log_start_offset=log_start,
                            aborted_transactions=None, records=records, **extra)


def fetch_response(parts: dict[TopicPartition, fr.PartitionData]) -> fr.FetchResponse:
    by_topic: dict[str, list] = {}
    for tp, p in parts.items():
        by_topic.setdefault(tp.topic, []).append(p)
    return fr.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=kio_error_code(ErrorCode.NONE),
        responses=tuple(fr.FetchableTopicResponse(topic=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()))


class FakeLeader:
    """A leader's answers computed from its logs, as Kafka's leader computes them: the
    diverging epoch for the follower's last fetched epoch first, then out of range, then records
    (LOG_END isolation, whole batches unless ``cut_batches``: then cut at the partition limit,
    a partial batch at the end). With nothing to answer it long-polls ``max_wait``.
    ``script`` (tp -> list of PartitionData) answers a partition before the logs do, and
    ``sticky`` (tp -> PartitionData) answers it every time."""

    def __init__(self, logs: dict[TopicPartition, UnifiedLog], *, cut_batches: bool = False):
        self.logs = logs
        self.cut_batches = cut_batches
        self.script: dict[TopicPartition, list[fr.PartitionData]] = {}
        self.sticky: dict[TopicPartition, fr.PartitionData] = {}
        self.fetches: list[tuple[float, FetchRequest]] = []
        self.list_offsets: list[ListOffsetsRequest] = []
        self.epoch_requests: list[OffsetForLeaderEpochRequest] = []
        self.answers: list[fr.FetchResponse] = []
        self.wake = threading.Event()

    def answer_fetch(self, req: FetchRequest) -> fr.FetchResponse:
        parts = {}
        for t in req.topics:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                if tp in self.sticky:
                    parts[tp] = self.sticky[tp]
                    continue
                if self.script.get(tp):
                    parts[tp] = self.script[tp].pop(0)
                    continue
                parts[tp] = self._answer(tp, p, req)
        return fetch_response(parts)

    def _answer(self, tp, p, req) -> fr.PartitionData:
        ulog = self.logs[tp]
        with ulog.lock:
            hw, start, leo = ulog.high_watermark, ulog.log_start_offset, ulog.log_end_offset
            out_of_range = partition(tp, ErrorCode.OFFSET_OUT_OF_RANGE, hw=hw, log_start=start)
            if p.last_fetched_epoch >= 0:
                end = ulog.leader_epoch_cache.end_offset_for(p.last_fetched_epoch, leo)
                if end.offset < 0 or end.leader_epoch < 0:
                    return out_of_range
                if end.leader_epoch < p.last_fetched_epoch or end.offset < p.fetch_offset:
                    return partition(tp, hw=hw, log_start=start,
                                     diverging=(end.leader_epoch, end.offset))
            if p.fetch_offset > leo or p.fetch_offset < start:
                return out_of_range
            data = bytes(ulog.read(p.fetch_offset, p.partition_max_bytes,
                                   FetchIsolation.LOG_END).records)
            if self.cut_batches:
                whole = bytes(ulog.read(p.fetch_offset, 1 << 30, FetchIsolation.LOG_END).records)
                data = whole[:max(p.partition_max_bytes, len(data))]
        return partition(tp, hw=hw, log_start=start, records=data)

    def answer_list_offsets(self, req: ListOffsetsRequest) -> lr.ListOffsetsResponse:
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                ulog = self.logs[TopicPartition(t.name, p.partition_index)]
                found = ulog.fetch_offset_by_timestamp(p.timestamp)
                epoch = found.leader_epoch if found.leader_epoch is not None else -1
                parts.append(lr.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=kio_error_code(ErrorCode.NONE),
                    timestamp=-1, offset=found.offset, leader_epoch=epoch))
            topics.append(lr.ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts)))
        return lr.ListOffsetsResponse(throttle_time=datetime.timedelta(0), topics=tuple(topics))

    def answer_offset_for_leader_epoch(self, req: OffsetForLeaderEpochRequest):
        """The leader's end offset for each epoch asked (Kafka's endOffsetForEpoch)."""
        self.epoch_requests.append(req)
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                ulog = self.logs[TopicPartition(t.topic, p.partition)]
                found = ulog.leader_epoch_cache.end_offset_for(p.leader_epoch, ulog.log_end_offset)
                parts.append(er.EpochEndOffset(error_code=kio_error_code(ErrorCode.NONE),
                                               partition=p.partition, leader_epoch=found.leader_epoch,
                                               end_offset=found.offset))
            topics.append(er.OffsetForLeaderTopicResult(topic=t.topic, partitions=tuple(parts)))
        return er.OffsetForLeaderEpochResponse(throttle_time=datetime.timedelta(0),
                                               topics=tuple(topics))


class FakeConnection:
    def __init__(self, leader: FakeLeader):
        self.leader = leader
        self.closed = False

    def request(self, body, response_cls):
        if self.closed:
            raise ConnectionError("closed")
        if type(body).__name__ == "ListOffsetsRequest":
            self.leader.list_offsets.append(body)
            return self.leader.answer_list_offsets(body)
        if isinstance(body, OffsetForLeaderEpochRequest):
            return self.leader.answer_offset_for_leader_epoch(body)
        assert isinstance(body, FetchRequest) and response_cls is fr.FetchResponse
        self.leader.fetches.append((time.monotonic(), body))
        resp = self.leader.answer_fetch(body)
        if not any(p.records or _code(p.error_code) or p.diverging_epoch.epoch >= 0
                   for t in resp.responses for p in t.partitions):
            # the leader's long poll: nothing to send, wait for data or max_wait
            if self.leader.wake.wait(body.max_wait.total_seconds()):
                self.leader.wake.clear()
                resp = self.leader.answer_fetch(body)
        self.leader.answers.append(resp)
        return resp

    def close(self) -> None:
        self.closed = True


def _code(value) -> int:
    return int(getattr(value, "value", value))


class Cluster:
    """Leaders by broker id, each with its fake connections; the follower's logs."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.leaders: dict[int, FakeLeader] = {}
        self.connections: list[tuple[int, FakeConnection]] = []
        self.follower_logs: dict[TopicPartition, UnifiedLog] = {}
        self.opened: list[UnifiedLog] = []
        self.refuse_connects = 0
        self.connect_times: list[float] = []

    def log(self, who: str, tp: TopicPartition = TP) -> UnifiedLog:
        ulog = UnifiedLog(self.tmp_path / who / f"{tp.topic}-{tp.partition}", LogConfig({}),
                          topic_partition=tp)
        self.opened.append(ulog)
        return ulog

    def follower(self, tp: TopicPartition = TP) -> UnifiedLog:
        ulog = self.follower_logs[tp] = self.log("follower", tp)
        return ulog

    def endpoint_of(self, broker: int):
        return ("leader-host", 9000 + broker) if broker in self.leaders else None

    def connect(self, address: str) -> FakeConnection:
        self.connect_times.append(time.monotonic())
        if self.refuse_connects > 0:
            self.refuse_connects -= 1
            raise ConnectionRefusedError(f"refused: {address}")
        broker = int(address.rsplit(":", 1)[1]) - 9000
        conn = FakeConnection(self.leaders[broker])
        self.connections.append((broker, conn))
        return conn

    def manager(self, **kw) -> ReplicaFetcherManager:
        kw.setdefault("max_wait_ms", 50)
        kw.setdefault("backoff_ms", 100)
        return ReplicaFetcherManager(ME, self.endpoint_of, self.follower_logs.get,
                                     connect=self.connect, **kw)

    def close(self) -> None:
        for ulog in self.opened:
            ulog.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@contextlib.contextmanager
def broker_loop():
    """An event loop running in a thread named ``broker-loop``, as a broker's."""
    import asyncio
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="broker-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(DEADLINE)
        loop.close()


@pytest.fixture(params=["managers-own-loop", "brokers-loop"])
def fetch_loop(request):
    """The loop the fetchers run on: the manager's own (None), or one given, as a broker's."""
    if request.param == "managers-own-loop":
        yield None
        return
    with broker_loop() as loop:
        yield loop


@pytest.fixture
def managers():
    made: list[ReplicaFetcherManager] = []
    yield made
    for m in made:
        m.shutdown()


def request_partition(req: FetchRequest, tp: TopicPartition = TP):
    return next(p for t in req.topics if t.topic == tp.topic
                for p in t.partitions if p.partition == tp.partition)


def test_a_follower_copies_the_leaders_batches_and_follows_its_high_watermark(cluster, managers):
    leader_log = cluster.log("leader")
    append(leader_log, 1, 3)
    leader_log.update_high_watermark(2)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    appended = []
    m = cluster.manager(on_append=appended.append, partition_max_bytes=4096)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    assert m.fetching() == {TP: (LEADER, 1)}

    eventually(lambda: follower.log_end_offset == 3, "the follower to copy 3 offsets")
    eventually(lambda: follower.high_watermark == 2, "the follower's HW to reach the leader's")
    assert all_bytes(follower) == all_bytes(leader_log)
    assert follower.leader_epoch_cache.epoch_entries() == leader_log.leader_epoch_cache.epoch_entries()
    assert TP in appended

    first = leader.fetches[0][1]
    # a full fetch asking for a session (KIP-227); this leader answers none (session id 0)
    assert first.replica_id == ME and first.session_id == 0 and first.session_epoch == 0
    assert first.isolation_level == 0 and first.max_bytes == 10 * 1024 * 1024
    assert first.min_bytes == 1 and first.max_wait.total_seconds() == 0.05
    p = request_partition(first)
    assert (p.fetch_offset, p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset,
            p.partition_max_bytes) == (0, 1, -1, 0, 4096)
    eventually(lambda: request_partition(leader.fetches[-1][1]).fetch_offset == 3,
               "a fetch from the new log end")
    p = request_partition(leader.fetches[-1][1])
    assert p.last_fetched_epoch == 1

    # the HW moves on the leader with no new records: the follower's follows
    leader_log.update_high_watermark(3)
    eventually(lambda: follower.high_watermark == 3, "the follower's HW to advance without data")
    # new data on the leader
    append(leader_log, 1, 2)
    leader.wake.set()
    eventually(lambda: follower.log_end_offset == 5, "the new records")
    eventually(lambda: m.lag(TP) == 0, "the lag (leader HW - our log end, floored at 0)")
    assert all_bytes(follower) == all_bytes(leader_log)


def test_lag_is_the_leaders_high_watermark_minus_our_log_end(cluster, managers):
    leader_log = cluster.log("leader")
    append(leader_log, 0, 2)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    leader_log.update_high_watermark(2)
    follower = cluster.follower()
    # the leader claims a HW of 9 with no records: lag 9 - 0; our HW stays at our log end
    leader.sticky[TP] = partition(TP, hw=9, log_start=0)
    m = cluster.manager()
    managers.append(m)
    assert m.lag(TP) is None
    m.add_partitions({TP: (LEADER, 0)})
    eventually(lambda: m.lag(TP) == 9, "the lag of the first answer")
    assert follower.high_watermark == 0
    del leader.sticky[TP]
    eventually(lambda: follower.log_end_offset == 2 and m.lag(TP) == 0, "lag 0 once caught up")


def test_a_trailing_partial_batch_is_left_for_the_next_fetch(cluster, managers):
    leader_log = cluster.log("leader")
    append(leader_log, 2, 6)
    size = len(batch())
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log}, cut_batches=True)
    follower = cluster.follower()
    # each answer: one whole batch and part of the next
    m = cluster.manager(partition_max_bytes=size + size // 2)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 2)})
    eventually(lambda: follower.log_end_offset == 6, "all 6 batches, one per fetch")
    assert all_bytes(follower) == all_bytes(leader_log)
    offsets = [request_partition(r).fetch_offset for _, r in leader.fetches]
    assert offsets[:6] == [0, 1, 2, 3, 4, 5]


def test_a_diverging_epoch_truncates_the_follower_to_where_it_agrees(cluster, managers):
    # leader: epoch 1 at 0..2, epoch 3 at 3..4; follower: epoch 1 at 0..2, epoch 2 at 3..5
    leader_log = cluster.log("leader")
    follower = cluster.follower()
    append(leader_log, 1, 3)
    append(follower, 1, 3)
    append(leader_log, 3, 2, value=b"new")
    append(follower, 2, 3, value=b"old")
    leader_log.update_high_watermark(5)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})

    eventually(lambda: follower.leader_epoch_cache.epoch_entries()
               == leader_log.leader_epoch_cache.epoch_entries(), "the follower's epochs to agree")
    eventually(lambda: follower.log_end_offset == 5, "the leader's records after the truncation")
    assert all_bytes(follower) == all_bytes(leader_log)
    first = request_partition(leader.fetches[0][1])
    assert (first.fetch_offset, first.last_fetched_epoch) == (6, 2)
    diverging = leader.answers[0].responses[0].partitions[0].diverging_epoch
    assert (diverging.epoch, diverging.end_offset) == (1, 3)
    second = request_partition(leader.fetches[1][1])
    assert (second.fetch_offset, second.last_fetched_epoch) == (3, 1)


def test_an_epoch_unknown_to_the_follower_truncates_in_steps(cluster, managers):
    # leader epochs 0@0, 1@2, 3@4; follower 0@0, 2@2: the leader answers (1, 4), which the
    # follower never had: it cuts to the end of its epoch 0 (2) and asks again
    leader_log = cluster.log("leader")
    follower = cluster.follower()
    append(leader_log, 0, 2)
    append(follower, 0, 2)
    append(leader_log, 1, 2, value=b"l1")
    append(leader_log, 3, 2, value=b"l3")
    append(follower, 2, 3, value=b"f2")
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})
    eventually(lambda: follower.log_end_offset == 6 and follower.leader_epoch_cache.epoch_entries()
               == leader_log.leader_epoch_cache.epoch_entries(), "the follower to match the leader")
    assert all_bytes(follower) == all_bytes(leader_log)
    asked = [(request_partition(r).fetch_offset, request_partition(r).last_fetched_epoch)
             for _, r in leader.fetches[:2]]
    assert asked == [(5, 2), (2, 0)]


def test_out_of_range_above_the_leaders_end_truncates_to_it(cluster, managers):
    leader_log = cluster.log("leader")
    follower = cluster.follower()
    append(leader_log, 1, 3)
    # batches without a leader epoch (an old format): the follower sends no last fetched epoch
    for offset in range(5):
        follower.append_as_follower(batch(base_offset=offset))
    assert follower.leader_epoch_cache.latest_epoch() is None
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 3 and len(leader.fetches) >= 2,
               "the truncation to the leader's end and the next fetch")
    assert [(r.replica_id, r.topics[0].partitions[0].timestamp,
             r.topics[0].partitions[0].current_leader_epoch)
            for r in leader.list_offsets] == [(ME, LATEST_TIMESTAMP, 1)]
    assert request_partition(leader.fetches[1][1]).fetch_offset == 3
    assert follower.log_start_offset == 0


def test_out_of_range_below_the_leaders_log_start_restarts_the_log_there(cluster, managers):
    leader_log = cluster.log("leader")
    follower = cluster.follower()
    append(leader_log, 1, 10)
    leader_log.update_high_watermark(10)
    leader_log.maybe_increment_log_start_offset(6)
    append(follower, 1, 2)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 10, "the records from the leader's log start")
    assert follower.log_start_offset == 6
    assert [r.topics[0].partitions[0].timestamp for r in leader.list_offsets] == \
        [LATEST_TIMESTAMP, EARLIEST_TIMESTAMP]
    assert all_bytes(follower) == all_bytes(leader_log)
    eventually(lambda: follower.high_watermark == 10, "the follower's HW")


def test_the_follower_log_start_follows_the_leaders(cluster, managers):
    leader_log = cluster.log("leader")
    follower = cluster.follower()
    append(leader_log, 1, 6)
    leader_log.update_high_watermark(6)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.high_watermark == 6, "the follower to catch up")
    leader_log.maybe_increment_log_start_offset(4)   # DeleteRecords on the leader
    leader.wake.set()
    eventually(lambda: follower.log_start_offset == 4, "the follower's log start offset")


@pytest.mark.parametrize("code", [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                                  ErrorCode.UNKNOWN_LEADER_EPOCH,
                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION])
def test_a_partition_error_backs_the_partition_off(cluster, managers, code):
    leader_log = cluster.log("leader")
    append(leader_log, 1, 2)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    leader.script[TP] = [partition(TP, code) for _ in range(3)]
    follower = cluster.follower()
    m = cluster.manager(backoff_ms=150)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 2, "the fetch after three errors")
    times = [t for t, _ in leader.fetches[:4]]
    assert len(times) == 4
    assert all(b - a >= 0.15 for a, b in zip(times, times[1:])), times
    assert m.fetching() == {TP: (LEADER, 1)}


def test_connection_failures_back_off_and_reconnect(cluster, managers):
    leader_log = cluster.log("leader")
    append(leader_log, 1, 2)
    cluster.leaders[LEADER] = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    cluster.refuse_connects = 2
    m = cluster.manager(backoff_ms=120)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 2, "the fetch after reconnecting")
    times = cluster.connect_times[:3]
    assert len(times) == 3 and all(b - a >= 0.12 for a, b in zip(times, times[1:])), times

    # the connection drops mid-flight: it is closed, and a new one is made after the back-off
    first = cluster.connections[0][1]
    first.closed = True
    eventually(lambda: len(cluster.connections) == 2, "a new connection")
    assert all(t.is_alive() for t in m.threads().values())


def test_an_unknown_leader_endpoint_backs_off_without_crashing(cluster, managers):
    follower = cluster.follower()
    m = cluster.manager(backoff_ms=50)
    managers.append(m)
    m.add_partitions({TP: (7, 1)})   # broker 7 has no endpoint
    leader_log = cluster.log("leader")
    append(leader_log, 1, 1)
    cluster.leaders[7] = FakeLeader({TP: leader_log})
    eventually(lambda: follower.log_end_offset == 1, "the fetch once the endpoint is known")


def test_offset_moved_to_tiered_storage_without_tiered_storage_marks_the_partition_failed(
        cluster, managers):
    tp2 = TopicPartition("t", 1)
    leader_log, leader_log2 = cluster.log("leader", TP), cluster.log("leader", tp2)
    append(leader_log2, 1, 2)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log, tp2: leader_log2})
    leader.script[TP] = [partition(TP, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE)]
    cluster.follower(TP)
    follower2 = cluster.follower(tp2)
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1), tp2: (LEADER, 1)})
    eventually(lambda: m.failed_partitions() == {TP: (LEADER, 1)}, "the partition marked failed")
    assert m.fetching() == {tp2: (LEADER, 1)}
    eventually(lambda: follower2.log_end_offset == 2, "the other partition still fetched")
    n = len(leader.fetches)
    leader.wake.set()
    eventually(lambda: len(leader.fetches) > n, "another fetch")
    assert all(TP not in {TopicPartition(t.topic, p.partition) for t in r.topics
                          for p in t.partitions} for _, r in leader.fetches[n:])
    m.add_partitions({TP: (LEADER, 1)})   # the same state: still failed
    assert TP in m.failed_partitions()
    m.add_partitions({TP: (LEADER, 2)})   # a new epoch: fetched again
    assert m.fetching() == {TP: (LEADER, 2), tp2: (LEADER, 1)}
    assert m.failed_partitions() == {}


def kip405_scenario_1_leader(cluster) -> UnifiedLog:
    """KIP-405's follower scenario 1: seg-0-2 (LE-0) is only in the remote tier; the leader's
    local log holds 3-4 at LE-1, 5-6 at LE-2, 7 at LE-3."""
    from strata.log.leader_epoch import EpochEntry
    leader_log = cluster.log("leader", TP)
    leader_log.truncate_fully_and_start_after_remote(3, 0, [EpochEntry(0, 0)], None)
    for epoch, count in ((1, 2), (2, 2), (3, 1)):
        append(leader_log, epoch, count)
    leader_log.update_high_watermark(leader_log.log_end_offset)
    return leader_log


class RemoteRebuild:
    """The RemoteLogManager's part, as the fetcher sees it: records its calls, fails the first
    ``failures`` of them, else starts the log after the remote segment as the real one does
    (leader epochs up to it, as the remote tier's checkpoint would give them)."""

    def __init__(self, remote_epochs, failures: int = 0):
        self.remote_epochs = remote_epochs
        self.failures = failures
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, ulog: UnifiedLog, target_epoch: int, local_start: int, log_start: int) -> int:
        self.calls.append((target_epoch, local_start, log_start))
        if self.failures:
            self.failures -= 1
            from strata.tiered.api import RemoteStorageNotReadyException
            raise RemoteStorageNotReadyException("metadata not consumed yet")
        ulog.truncate_fully_and_start_after_remote(local_start, log_start, self.remote_epochs, None)
        return local_start


def test_offset_moved_to_tiered_storage_rebuilds_from_the_remote_tier_then_fetches_the_local_tail(
        cluster, managers):
    """KIP-405 scenario 1 (a new empty follower): OMTS, then ELO 3 at LE-1 from the leader,
    the epoch of offset 2 (LE-0, since LE-0 ends at 3), the remote segment's state up to 3,
    and fetching from 3: the follower ends with the leader's epochs LE-0@0 .. LE-3@7."""
    from strata.log.leader_epoch import EpochEntry
    leader_log = kip405_scenario_1_leader(cluster)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    leader.script[TP] = [partition(TP, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, log_start=0)]
    follower = cluster.follower(TP)
    rebuild = RemoteRebuild([EpochEntry(0, 0)])
    m = cluster.manager(remote_aux_state=rebuild)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})
    eventually(lambda: follower.log_end_offset == 8, "the follower caught up after the rebuild")
    assert rebuild.calls == [(0, 3, 0)]
    assert [p.timestamp for r in leader.list_offsets for t in r.topics for p in t.partitions] \
        == [-4, EARLIEST_TIMESTAMP]
    assert [p.leader_epoch for r in leader.epoch_requests for t in r.topics
            for p in t.partitions] == [0]
    assert follower.log_start_offset == 0 and follower.local_log_start_offset == 3
    assert follower.leader_epoch_cache.epoch_entries() == leader_log.leader_epoch_cache.epoch_entries() \
        == [EpochEntry(0, 0), EpochEntry(1, 3), EpochEntry(2, 5), EpochEntry(3, 7)]
    assert all_bytes(follower) == all_bytes(leader_log)
    assert m.failed_partitions() == {}


def test_a_rebuild_that_fails_backs_off_and_retries_with_the_log_untouched(cluster, managers):
    from strata.log.leader_epoch import EpochEntry
    leader_log = kip405_scenario_1_leader(cluster)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    leader.script[TP] = [partition(TP, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, log_start=0)] * 3
    follower = cluster.follower(TP)
    rebuild = RemoteRebuild([EpochEntry(0, 0)], failures=2)
    m = cluster.manager(remote_aux_state=rebuild)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})
    eventually(lambda: len(rebuild.calls) >= 1, "a first attempt")
    assert follower.log_end_offset == 0 and follower.leader_epoch_cache.epoch_entries() == []
    eventually(lambda: follower.log_end_offset == 8, "caught up after the retries")
    assert len(rebuild.calls) == 3
    times = [t for t, _ in leader.fetches[:3]]
    assert all(b - a >= 0.09 for a, b in zip(times, times[1:]))   # replica.fetch.backoff.ms
    assert follower.leader_epoch_cache.epoch_entries() == leader_log.leader_epoch_cache.epoch_entries()


def test_metadata_ready_ends_a_failed_rebuilds_back_off(cluster, managers):
    """The remote log metadata manager's ready notice (``retry_now``) makes a follower whose
    rebuild found the metadata not loaded retry at once, not after replica.fetch.backoff.ms."""
    from strata.log.leader_epoch import EpochEntry
    leader_log = kip405_scenario_1_leader(cluster)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    leader.script[TP] = [partition(TP, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, log_start=0)] * 2
    follower = cluster.follower(TP)
    rebuild = RemoteRebuild([EpochEntry(0, 0)], failures=1)
    m = cluster.manager(remote_aux_state=rebuild, backoff_ms=60_000)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})
    eventually(lambda: len(rebuild.calls) == 1, "a first attempt, which fails")
    time.sleep(0.2)
    assert len(rebuild.calls) == 1 and follower.log_end_offset == 0   # backing off a minute
    m.retry_now(TP)
    eventually(lambda: follower.log_end_offset == 8, "caught up right after the notice")
    assert len(rebuild.calls) == 2
    m.retry_now(TopicPartition("not-followed", 0))   # nothing to do, no error


def test_an_empty_replica_starts_at_the_leaders_earliest_pending_upload_with_kip_1023(
        cluster, managers):
    """KIP-1023: offsets 0-4 are in the remote tier, 5-7 not yet (LE-0@0, LE-1@3, LE-2@5,
    LE-3@7); an empty follower asks ListOffsets -6 (5 at LE-2), the end of LE-1 (5, so offset
    4 is LE-1's), rebuilds from the remote segment holding 4 and copies only 5-7."""
    from strata.log.leader_epoch import EpochEntry
    tiered = LogConfig({"remote.storage.enable": "true"})
    leader_log = UnifiedLog(cluster.tmp_path / "leader" / "t-0", tiered, topic_partition=TP)
    cluster.opened.append(leader_log)
    for epoch, count in ((0, 3), (1, 2), (2, 2), (3, 1)):
        append(leader_log, epoch, count)
    leader_log.update_high_watermark(leader_log.log_end_offset)
    leader_log.update_highest_offset_in_remote_storage(4)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower_logs[TP] = UnifiedLog(cluster.tmp_path / "follower" / "t-0",
                                                      tiered, topic_partition=TP)
    cluster.opened.append(follower)
    rebuild = RemoteRebuild([EpochEntry(0, 0), EpochEntry(1, 3)])
    m = cluster.manager(remote_aux_state=rebuild, fetch_last_tiered_offset=True)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 3)})
    eventually(lambda: follower.log_end_offset == 8, "the follower caught up")
    assert rebuild.calls == [(1, 5, 0)]
    assert follower.local_log_start_offset == 5
    assert [p.leader_epoch for r in leader.epoch_requests for t in r.topics
            for p in t.partitions] == [1]
    assert follower.leader_epoch_cache.epoch_entries() == leader_log.leader_epoch_cache.epoch_entries()
    first_fetch = request_partition(leader.fetches[0][1])
    assert first_fetch.fetch_offset == 5


def test_without_kip_1023_an_empty_replica_copies_from_the_leaders_start(cluster, managers):
    tiered = LogConfig({"remote.storage.enable": "true"})
    leader_log = UnifiedLog(cluster.tmp_path / "leader" / "t-0", tiered, topic_partition=TP)
    cluster.opened.append(leader_log)
    append(leader_log, 0, 8)
    leader_log.update_high_watermark(8)
    leader_log.update_highest_offset_in_remote_storage(4)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower_logs[TP] = UnifiedLog(cluster.tmp_path / "follower" / "t-0",
                                                      tiered, topic_partition=TP)
    cluster.opened.append(follower)
    rebuild = RemoteRebuild([])
    m = cluster.manager(remote_aux_state=rebuild)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 0)})
    eventually(lambda: follower.log_end_offset == 8, "the follower caught up")
    assert rebuild.calls == [] and leader.list_offsets == []
    assert request_partition(leader.fetches[0][1]).fetch_offset == 0


def test_a_newer_epoch_keeps_progress_and_a_moved_partition_leaves_its_fetcher(cluster, managers):
    leader_log = cluster.log("leader")
    append(leader_log, 1, 3)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 3, "the first records")
    old_thread = m.threads()[(LEADER, 0)]

    m.add_partitions({TP: (LEADER, 2)})
    assert m.fetching() == {TP: (LEADER, 2)}
    assert m.threads()[(LEADER, 0)] is old_thread
    leader.wake.set()
    eventually(lambda: request_partition(leader.fetches[-1][1]).current_leader_epoch == 2,
               "a fetch at the new epoch")
    assert request_partition(leader.fetches[-1][1]).fetch_offset == 3
    m.add_partitions({TP: (LEADER, 1)})   # stale: ignored
    assert m.fetching() == {TP: (LEADER, 2)}

    # the new leader already has two more records (epoch 4)
    new_leader_log = cluster.log("leader3")
    append(new_leader_log, 1, 3)
    append(new_leader_log, 4, 2)
    cluster.leaders[OTHER_LEADER] = other = FakeLeader({TP: new_leader_log})
    m.add_partitions({TP: (OTHER_LEADER, 4)})
    assert m.fetching() == {TP: (OTHER_LEADER, 4)}
    assert set(m.threads()) == {(OTHER_LEADER, 0)}
    assert not old_thread.is_alive()
    assert all(c.closed for b, c in cluster.connections if b == LEADER)
    eventually(lambda: follower.log_end_offset == 5, "the records from the new leader")
    assert request_partition(other.fetches[0][1]).fetch_offset == 3
    assert all_bytes(follower) == all_bytes(new_leader_log)

    m.remove_partitions([TP])
    assert m.fetching() == {} and m.threads() == {}


def test_partitions_spread_over_fetchers_by_leader_and_hash(cluster, managers):
    tps = [TopicPartition("t", i) for i in range(6)]
    leader_logs = {tp: cluster.log("leader", tp) for tp in tps}
    for ulog in leader_logs.values():
        append(ulog, 0, 1)
    cluster.leaders[LEADER] = leader = FakeLeader(leader_logs)
    followers = {tp: cluster.follower(tp) for tp in tps}
    m = cluster.manager(num_fetchers=2)
    managers.append(m)
    m.add_partitions({tp: (LEADER, 0) for tp in tps})
    assert set(m.threads()) == {(LEADER, fetcher_id(tp, 2)) for tp in tps}
    assert set(m.threads()) == {(LEADER, 0), (LEADER, 1)}
    eventually(lambda: all(f.log_end_offset == 1 for f in followers.values()), "every partition")
    for _, req in leader.fetches:
        ids = {fetcher_id(TopicPartition(t.topic, p.partition), 2)
               for t in req.topics for p in t.partitions}
        assert len(ids) == 1   # one fetcher's partitions per request


def test_a_new_fetcher_asks_for_all_its_partitions_in_its_first_fetch(cluster, managers):
    """Partitions added together start a fetcher together: its first Fetch names them all, so
    none waits for a first Fetch of the others that the leader may hold for
    replica.fetch.wait.max.ms (a restarted broker's tiered partitions waited 0.5 s so)."""
    tps = [TopicPartition("t", i) for i in range(20)]
    leader_logs = {tp: cluster.log("leader", tp) for tp in tps}
    for ulog in leader_logs.values():
        append(ulog, 0, 1)
    cluster.leaders[LEADER] = leader = FakeLeader(leader_logs)
    other_tp = TopicPartition("u", 0)
    other_log = cluster.log("other", other_tp)
    append(other_log, 0, 1)
    cluster.leaders[OTHER_LEADER] = FakeLeader({other_tp: other_log})
    followers = {tp: cluster.follower(tp) for tp in [*tps, other_tp]}
    slow = [True]

    def get_log(tp):   # the first lookup is slow: a thread already running would fetch alone
        if slow[0]:
            slow[0] = False
            time.sleep(0.1)
        return cluster.follower_logs.get(tp)
    m = ReplicaFetcherManager(ME, cluster.endpoint_of, get_log, connect=cluster.connect,
                              max_wait_ms=50, backoff_ms=100)
    managers.append(m)
    # another leader's thread starts between them (Thread.start lets the first one run)
    m.add_partitions({tps[0]: (LEADER, 0), other_tp: (OTHER_LEADER, 0),
                      **{tp: (LEADER, 0) for tp in tps[1:]}})
    eventually(lambda: all(f.log_end_offset == 1 for f in followers.values()), "every partition")
    first = leader.fetches[0][1]
    assert {TopicPartition(t.topic, p.partition) for t in first.topics for p in t.partitions} \
        == set(tps)


def test_fetcher_id_is_kafkas():
    # Java: "hello".hashCode() == 99162322; abs(31 * 99162322 + 1) % 7
    assert fetcher_id(TopicPartition("hello", 1), 7) == ((31 * 99162322 + 1) & 0x7FFFFFFF) % 7
    assert fetcher_id(TopicPartition("hello", 1), 1) == 0


def test_shutdown_stops_and_joins_every_thread_and_closes_connections(cluster, managers):
    tps = [TopicPartition("t", i) for i in range(4)]
    logs = {tp: cluster.log("leader", tp) for tp in tps}
    cluster.leaders[LEADER] = FakeLeader(logs)
    cluster.leaders[OTHER_LEADER] = FakeLeader(logs)
    for tp in tps:
        cluster.follower(tp)
    m = cluster.manager(num_fetchers=2)
    m.add_partitions({tp: (LEADER if tp.partition % 2 else OTHER_LEADER, 0) for tp in tps})
    threads = list(m.threads().values())
    assert len(threads) >= 2
    eventually(lambda: len(cluster.connections) == len(threads), "every fetcher connected")
    m.shutdown()
    assert not any(t.is_alive() for t in threads)
    assert all(c.closed for _, c in cluster.connections)
    assert m.fetching() == {} and m.threads() == {}
    m.add_partitions({TP: (LEADER, 0)})   # after shutdown: nothing starts
    assert m.threads() == {}


def test_shutdown_interrupts_a_real_socket_blocked_in_the_long_poll(cluster):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = threading.Event()
    accepted = []

    def serve():
        conn, _ = server.accept()
        accepted.append(conn)
        if conn.recv(4096):
            received.set()   # never answers: the fetcher stays in recv

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cluster.follower()
    m = ReplicaFetcherManager(ME, lambda b: ("127.0.0.1", port), cluster.follower_logs.get,
                              max_wait_ms=500, socket_timeout_ms=60_000)
    try:
        m.add_partitions({TP: (LEADER, 0)})
        assert received.wait(DEADLINE), "the fetch request never arrived"
        threads = list(m.threads().values())
        start = time.monotonic()
        m.shutdown()
        assert time.monotonic() - start < 30   # far below the 60 s socket timeout
        assert not any(th.is_alive() for th in threads)
    finally:
        m.shutdown()
        for c in accepted:
            c.close()
        server.close()
        t.join(DEADLINE)


def test_from_properties_reads_kafkas_names_with_kafkas_defaults():
    m = ReplicaFetcherManager.from_properties(ME, {}, lambda b: None, lambda tp: None)
    assert (m.num_fetchers, m.max_wait_ms, m.min_bytes, m.max_bytes, m.partition_max_bytes,
            m.backoff_ms) == (1, 500, 1, 10485760, 1048576, 1000)
    m = ReplicaFetcherManager.from_properties(ME, {
        "num.replica.fetchers": "3", "replica.fetch.wait.max.ms": "250",
        "replica.fetch.min.bytes": "10", "replica.fetch.response.max.bytes": "2048",
        "replica.fetch.max.bytes": "1024", "replica.fetch.backoff.ms": "20",
        "replica.socket.timeout.ms": "5000"}, lambda b: None, lambda tp: None)
    assert (m.num_fetchers, m.max_wait_ms, m.min_bytes, m.max_bytes, m.partition_max_bytes,
            m.backoff_ms, m.socket_timeout_ms) == (3, 250, 10, 2048, 1024, 20, 5000)
    m.shutdown()


def test_no_leader_stops_fetching_the_partition(cluster, managers):
    leader_log = cluster.log("leader")
    cluster.leaders[LEADER] = FakeLeader({TP: leader_log})
    cluster.follower()
    m = cluster.manager()
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    thread = m.threads()[(LEADER, 0)]
    m.add_partitions({TP: (-1, 2)})
    assert m.fetching() == {} and m.threads() == {}
    assert not thread.is_alive()
    m.add_partitions({TP: (LEADER, 3)})
    assert m.fetching() == {TP: (LEADER, 3)}


def test_a_socket_timeout_below_the_fetch_wait_is_refused():
    with pytest.raises(ValueError, match="replica.socket.timeout.ms"):
        ReplicaFetcherManager(ME, lambda b: None, lambda tp: None, max_wait_ms=500,
                              socket_timeout_ms=100)


class WireLeader:
    """A real listener serving Strata's own Fetch and ListOffsets handlers (one broker, leader
    epoch 0) over loopback: the follower's requests and the answers cross the real codec. The
    leader keeps fetch sessions (``sessions``, its cache); ``fetches`` are the Fetch requests
    and answers it served, in order."""

    def __init__(self, path, clustered: bool = False, partitions: int = 1):
        import asyncio

        from strata.log.log_manager import LogManager
        from strata.replication.replica_manager import ReplicaManager
        from strata.server.context import BrokerContext
        from strata.server.fetch_session import FetchSessionCache
        from strata.server.handlers import fetch, list_offsets
        from strata.server.network import KafkaServer
        self.asyncio = asyncio
        self.logs = LogManager([path], LogConfig({}))
        self.logs.startup()
        self.rm = ReplicaManager(self.logs,
                                 lambda topic: partitions if topic == TP.topic else None,
                                 broker_id=LEADER, clustered=clustered)
        if not clustered:   # a leader of every partition, followed by this test's broker
            from strata.cluster.image import PartitionState
            self.rm.apply_states({TopicPartition(TP.topic, p): PartitionState(
                LEADER, 0, (LEADER,), (LEADER, ME)) for p in range(partitions)})
        self.sessions = FetchSessionCache()
        ctx = BrokerContext(node_id=LEADER, advertised_host="127.0.0.1", advertised_port=0,
                            metadata=no_metadata(), replica_manager=self.rm, fetch_sessions=self.sessions)
        self.fetches: list[tuple] = []

        async def fetched(ctx, request):
            response = await fetch.handle(ctx, request)
            self.fetches.append((time.monotonic(), request.body, response))
            return response
        handlers = {1: fetched, 2: list_offsets.handle}
        self.loop = asyncio.new_event_loop()
        self.server = KafkaServer(lambda request, info: handlers[request.api_key](ctx, request),
                                  "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coro):
        return self.asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE)

    def append(self, count: int, tp: TopicPartition = TP) -> None:
        for _ in range(count):
            assert self.rm.append(tp, batch(), produce_version=9).error == ErrorCode.NONE

    def session_ids(self) -> list[int]:
        with self.sessions.lock:
            return list(self.sessions._sessions)

    def close(self) -> None:
        self.call(self.server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE)
        self.logs.shutdown()


def test_a_follower_replicates_from_stratas_own_handlers_over_a_socket(cluster, tmp_path,
                                                                     fetch_loop):
    wire = WireLeader(tmp_path / "wire-leader")
    m = None
    try:
        wire.append(3)
        leader_log = wire.rm.get_log(TP)
        follower = cluster.follower()
        # ahead of the leader with epoch-less batches: out of range, ListOffsets, truncation
        for offset in range(5):
            follower.append_as_follower(batch(base_offset=offset))
        m = ReplicaFetcherManager(ME, lambda b: ("127.0.0.1", wire.server.port),
                                  cluster.follower_logs.get, max_wait_ms=50, backoff_ms=50,
                                  loop=fetch_loop)
        m.add_partitions({TP: (LEADER, 0)})
        eventually(lambda: follower.log_end_offset == 3 and follower.high_watermark == 3,
                   "the truncation to the leader's end")
        wire.append(2)
        eventually(lambda: follower.log_end_offset == 5 and follower.high_watermark == 5,
                   "2 more offsets")
        assert follower.leader_epoch_cache.epoch_entries() == [(0, 3)]

        def tail(ulog):
            return bytes(ulog.read(3, 1 << 20, FetchIsolation.LOG_END).records)
        assert tail(follower) == tail(leader_log)
        assert m.lag(TP) == 0
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_a_clustered_leader_and_its_follower_agree_after_a_divergence(cluster, tmp_path,
                                                                      fetch_loop):
    """Against Strata's clustered ReplicaManager: the leader answers the diverging epoch, the
    follower truncates, copies, and the leader's HW (from the follower's fetch offsets) flows
    back to the follower."""
    from strata.cluster.image import PartitionState
    wire = WireLeader(tmp_path / "wire-leader", clustered=True)
    m = None
    try:
        def lead(epoch):
            wire.rm.apply_states({TP: PartitionState(LEADER, epoch, (LEADER, ME), (LEADER, ME),
                                                     epoch)})
        lead(1)
        wire.append(3)
        lead(3)
        wire.append(2)
        leader_log = wire.rm.get_log(TP)
        follower = cluster.follower()
        append(follower, 1, 3)
        append(follower, 2, 3, value=b"old")
        m = ReplicaFetcherManager(ME, lambda b: ("127.0.0.1", wire.server.port),
                                  cluster.follower_logs.get, max_wait_ms=50, backoff_ms=50,
                                  loop=fetch_loop)
        m.add_partitions({TP: (LEADER, 3)})
        eventually(lambda: follower.log_end_offset == 5
                   and follower.leader_epoch_cache.epoch_entries() == [(1, 0), (3, 3)],
                   "the follower to truncate and copy")
        eventually(lambda: leader_log.high_watermark == 5, "the leader's HW from our fetches")
        eventually(lambda: follower.high_watermark == 5, "the HW back on the follower")
        assert all_bytes(follower) == all_bytes(leader_log)
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_a_throttled_follower_leaves_a_partition_out_while_over_its_rate(cluster, managers):
    """follower.replication.throttled.rate (KIP-73): a catching-up replica of a throttled
    partition is not fetched while the measured rate is over the bound; the bytes it appends
    are what is measured."""
    from strata.common.clock import MockClock
    from strata.common.config import LONG_MAX
    from strata.replication.quota import ReplicationQuota
    leader_log = cluster.log("leader")
    append(leader_log, 1, 20, value=b"x" * 1000)
    leader_log.update_high_watermark(leader_log.log_end_offset)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    clock = MockClock()
    quota = ReplicationQuota(1000, lambda tp: tp == TP, window_num=2, window_size_seconds=1,
                             clock=clock)
    m = cluster.manager(partition_max_bytes=3000, quota=quota)
    managers.append(m)
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset > 0, "a first fetch")
    eventually(lambda: quota.is_quota_exceeded(), "the quota exceeded")
    held = follower.log_end_offset
    asked = len(leader.fetches)
    time.sleep(0.3)   # the fetcher keeps running; it must not ask for the partition meanwhile
    assert follower.log_end_offset == held
    assert all(not any(t.partitions for t in req.topics) for _, req in leader.fetches[asked:])
    clock.sleep(5)    # the windows pass: the rate drains, one more fetch goes out
    eventually(lambda: follower.log_end_offset > held, "a fetch after the rate drained")
    quota.update_quota(LONG_MAX)   # the throttle lifted (kafka-configs --delete-config)
    eventually(lambda: follower.log_end_offset == leader_log.log_end_offset, "caught up")


# ---- fetch sessions (KIP-227) -------------------------------------------------------------------


def sent_partitions(req) -> dict[TopicPartition, int]:
    return {TopicPartition(t.topic, p.partition): p.fetch_offset
            for t in req.topics for p in t.partitions}


def forgotten(req) -> set[TopicPartition]:
    return {TopicPartition(t.topic, p) for t in req.forgotten_topics_data for p in t.partitions}


def session_response(parts: dict[TopicPartition, fr.PartitionData], session_id: int,
                     code: ErrorCode = ErrorCode.NONE) -> fr.FetchResponse:
    import dataclasses
    return dataclasses.replace(fetch_response(parts), session_id=session_id,
                               error_code=kio_error_code(code))


def test_the_session_handler_sends_only_what_changed_and_forgets_what_left():
    from strata.replication.replica_fetcher import FetchData, FetchSessionHandler
    a, b, c = (TopicPartition("t", i) for i in range(3))
    d = lambda offset, epoch=1: FetchData(offset, 0, 100, epoch, 0)  # noqa: E731
    h = FetchSessionHandler()
    to_send, to_forget, sid, epoch = h.build({a: d(0), b: d(0)})
    assert (to_send, to_forget, sid, epoch) == ({a: d(0), b: d(0)}, [], 0, 0)   # full, opening
    assert h.handle_response(session_response({a: partition(a), b: partition(b)}, 77))
    assert (h.session_id, h.epoch) == (77, 1)
    # a moved, b unchanged, c new: a and c sent, nothing forgotten
    assert h.build({a: d(5), b: d(0), c: d(0)}) == ({c: d(0), a: d(5)}, [], 77, 1)
    assert h.handle_response(session_response({a: partition(a)}, 77))   # b, c: nothing new
    assert h.epoch == 2
    # b left out this round (backed off): forgotten; a's leader epoch changed: sent
    assert h.build({a: d(5, epoch=2), c: d(0)}) == ({a: d(5, epoch=2)}, [b], 77, 2)
    assert h.handle_response(session_response({}, 77)) and h.epoch == 3
    # nothing changed: an empty incremental fetch (the leader still reads a and c)
    assert h.build({a: d(5, epoch=2), c: d(0)}) == ({}, [], 77, 3)
    # an answer naming a partition outside the session is refused: the next fetch is full
    assert not h.handle_response(session_response({b: partition(b)}, 77))
    assert h.build({a: d(5, epoch=2)}) == ({a: d(5, epoch=2)}, [], 77, 0)   # replaces 77
    # a full answer must name every partition asked (an empty one: a quota throttle)
    assert not h.handle_response(session_response({}, 78))
    assert (h.session_id, h.epoch) == (0, 0)
    h.build({a: d(5)})
    assert h.handle_response(session_response({a: partition(a)}, 0))   # the leader keeps none
    assert (h.session_id, h.epoch) == (0, 0)
    h.build({a: d(5)})
    assert h.handle_response(session_response({a: partition(a)}, 90))
    # session errors: an unknown session starts from scratch, a wrong epoch replaces it
    h.build({a: d(5)})
    assert not h.handle_response(session_response({}, 0, ErrorCode.INVALID_FETCH_SESSION_EPOCH))
    assert (h.session_id, h.epoch) == (90, 0)
    h.build({a: d(5)})
    assert h.handle_response(session_response({a: partition(a)}, 91)) and h.epoch == 1
    h.build({a: d(5)})
    assert not h.handle_response(session_response({}, 0, ErrorCode.FETCH_SESSION_ID_NOT_FOUND))
    assert (h.session_id, h.epoch) == (0, 0)
    # the leader closing the session (incremental answer with id 0): full fetches again
    h.build({a: d(5)})
    h.handle_response(session_response({a: partition(a)}, 92))
    h.build({a: d(5)})
    assert h.handle_response(session_response({}, 0)) and (h.session_id, h.epoch) == (0, 0)
    # a failed request: the next fetch is a full one replacing the session
    h.build({a: d(5)})
    h.handle_response(session_response({a: partition(a)}, 93))
    h.handle_error()
    assert h.build({a: d(5)}) == ({a: d(5)}, [], 93, 0)


def test_the_epoch_wraps_as_kafkas():
    from strata.replication.replica_fetcher import FetchData, FetchSessionHandler
    h = FetchSessionHandler()
    a = TopicPartition("t", 0)
    h.session_id, h.epoch, h.session_partitions = 5, 2**31 - 1, {a: FetchData(0, 0, 1, 0, 0)}
    assert h.handle_response(session_response({}, 5)) and h.epoch == 1


def wire_manager(cluster, wire, **kw) -> ReplicaFetcherManager:
    kw.setdefault("max_wait_ms", 50)
    kw.setdefault("backoff_ms", 50)
    return ReplicaFetcherManager(ME, lambda b: ("127.0.0.1", wire.server.port),
                                 cluster.follower_logs.get, **kw)


def test_a_follower_fetches_in_a_session_with_stratas_own_leader(cluster, tmp_path):
    wire = WireLeader(tmp_path / "wire-leader")
    m = None
    try:
        wire.append(3)
        follower = cluster.follower()
        m = wire_manager(cluster, wire)
        m.add_partitions({TP: (LEADER, 0)})
        eventually(lambda: follower.log_end_offset == 3 and follower.high_watermark == 3,
                   "the first records")
        eventually(lambda: len(wire.fetches) >= 5, "a few idle fetches")
        (sid,) = wire.session_ids()
        _, first, answer = wire.fetches[0]
        assert (first.session_id, first.session_epoch, sent_partitions(first)) == (0, 0, {TP: 0})
        assert answer.session_id == sid
        _, second, _ = wire.fetches[1]
        assert (second.session_id, second.session_epoch) == (sid, 1)
        assert sent_partitions(second) == {TP: 3}      # the offset moved: sent again
        idle = [req for _, req, _ in wire.fetches[2:5]]
        assert [r.session_epoch for r in idle] == [2, 3, 4]
        assert all(r.session_id == sid and not r.topics and not r.forgotten_topics_data
                   for r in idle)
        assert all(not resp.responses for _, _, resp in wire.fetches[2:5])   # nothing new

        n = len(wire.fetches)
        wire.append(2)
        eventually(lambda: follower.log_end_offset == 5 and follower.high_watermark == 5,
                   "the new records through the session")
        eventually(lambda: {TP: 5} in [sent_partitions(r) for _, r, _ in wire.fetches[n:]],
                   "the next fetch naming the new offset")
        later = [req for _, req, _ in wire.fetches[n:]]
        assert all(r.session_id == sid for r in later)
        assert all(b - a == 1 for a, b in zip([r.session_epoch for r in later],
                                              [r.session_epoch for r in later][1:]))
        assert m.lag(TP) == 0 and wire.session_ids() == [sid]
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_a_round_that_runs_a_worker_step_leaves_the_session_to_the_next_fetch(cluster, tmp_path):
    """A new partition's KIP-1023 start runs in a worker instead of that round's Fetch. The
    session must not take in what that round would have sent: the leader would never hear
    of it. Here the other partition's fetch offset moved back (a truncation) in that round;
    the leader must be told, else it goes on reading from where it was and the follower
    never gets those offsets again."""
    second = TopicPartition(TP.topic, 1)
    wire = WireLeader(tmp_path / "wire-leader", partitions=2)
    m = None
    try:
        wire.append(3)
        wire.append(2, second)
        follower = cluster.follower()
        other = cluster.follower(second)
        m = wire_manager(cluster, wire, remote_aux_state=RemoteRebuild([]),
                         fetch_last_tiered_offset=True)
        m.add_partitions({TP: (LEADER, 0)})
        eventually(lambda: follower.log_end_offset == 3 and len(wire.fetches) >= 3,
                   "a running session")
        (fetcher,) = m.threads().values()
        with fetcher._lock:   # both changes before the fetcher's next round
            assert follower.truncate_to(1)
            m.add_partitions({second: (LEADER, 0)})   # new: its start is a worker step
        eventually(lambda: other.log_end_offset == 2, "the new partition's records")
        eventually(lambda: follower.log_end_offset == 3, "the truncated offsets fetched again")
        assert all_bytes(follower) == all_bytes(wire.rm.get_log(TP))
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


@pytest.mark.parametrize("lose", ["evicted", "wrong epoch"])
def test_a_session_the_leader_lost_is_replaced_by_a_full_fetch_without_back_off(
        cluster, tmp_path, lose):
    wire = WireLeader(tmp_path / "wire-leader")
    m = None
    try:
        wire.append(2)
        follower = cluster.follower()
        # a back-off (a minute) would outlast every wait below: the test fails unless none
        m = wire_manager(cluster, wire, backoff_ms=60_000)
        m.add_partitions({TP: (LEADER, 0)})
        eventually(lambda: follower.log_end_offset == 2 and len(wire.fetches) >= 3,
                   "a running session")
        (sid,) = wire.session_ids()
        n = len(wire.fetches)
        if lose == "evicted":
            wire.sessions.remove(sid)
            expected = (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0)   # then a brand new session
        else:
            with wire.sessions.lock:
                wire.sessions.get(sid).epoch += 7
            expected = (ErrorCode.INVALID_FETCH_SESSION_EPOCH, sid)   # then it is replaced
        eventually(lambda: any(req.session_epoch == 0 for _, req, _ in wire.fetches[n:]),
                   "a full fetch after the session error")
        i = next(i for i in range(n, len(wire.fetches)) if wire.fetches[i][1].session_epoch == 0)
        refused_at, _, refused = wire.fetches[i - 1]
        full_at, full, _ = wire.fetches[i]
        assert int(getattr(refused.error_code, "value", refused.error_code)) == expected[0]
        assert (full.session_id, sent_partitions(full)) == (expected[1], {TP: 2})
        assert full_at - refused_at < 30         # at once: no replica.fetch.backoff.ms
        eventually(lambda: len(wire.session_ids()) == 1 and wire.session_ids() != [sid],
                   "the new session")
        wire.append(1)
        eventually(lambda: follower.log_end_offset == 3, "records through the new session")
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_a_failed_request_replaces_the_session_with_a_full_fetch(cluster, tmp_path):
    from strata.net.connection import Connection
    wire = WireLeader(tmp_path / "wire-leader")
    fail = threading.Event()

    class Flaky(Connection):
        def request(self, body, response_cls):
            if fail.is_set() and isinstance(body, FetchRequest):
                fail.clear()
                raise ConnectionResetError("dropped")
            return super().request(body, response_cls)
    m = None
    try:
        wire.append(1)
        follower = cluster.follower()
        m = wire_manager(cluster, wire, connect=lambda address: Flaky(address, timeout=5))
        m.add_partitions({TP: (LEADER, 0)})
        eventually(lambda: follower.log_end_offset == 1 and len(wire.fetches) >= 3, "a session")
        (sid,) = wire.session_ids()
        n = len(wire.fetches)
        fail.set()
        eventually(lambda: not fail.is_set() and len(wire.fetches) > n + 1, "fetches after it")
        after = [req for _, req, _ in wire.fetches[n:]]
        full = next(r for r in after if r.session_epoch == 0)
        assert full.session_id == sid and sent_partitions(full) == {TP: 1}   # replaces it
        eventually(lambda: len(wire.session_ids()) == 1 and wire.session_ids() != [sid],
                   "the replacing session")
        wire.append(1)
        eventually(lambda: follower.log_end_offset == 2, "records through it")
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_a_backed_off_partition_leaves_the_session_and_joins_it_again(cluster, tmp_path,
                                                                      fetch_loop):
    """As Kafka's fetcher: a partition not fetched this round (its back-off) is forgotten by
    the session, and added again when it is fetched again; the others go on meanwhile."""
    from strata.cluster.image import PartitionState
    tp1 = TopicPartition(TP.topic, 1)
    wire = WireLeader(tmp_path / "wire-leader", clustered=True, partitions=2)
    m = None
    try:
        def lead(tp, epoch):
            wire.rm.apply_states({tp: PartitionState(LEADER, epoch, (LEADER, ME), (LEADER, ME),
                                                     epoch)})
        lead(TP, 0)
        lead(tp1, 1)
        wire.append(2)
        wire.append(3, tp1)
        follower, follower1 = cluster.follower(), cluster.follower(tp1)
        m = wire_manager(cluster, wire, backoff_ms=200, loop=fetch_loop)
        # tp1 at an epoch the leader does not have yet: UNKNOWN_LEADER_EPOCH, backed off
        m.add_partitions({TP: (LEADER, 0), tp1: (LEADER, 3)})
        eventually(lambda: follower.log_end_offset == 2, "the healthy partition")
        eventually(lambda: sum(tp1 in forgotten(req) for _, req, _ in wire.fetches) >= 2,
                   "tp1 forgotten after each failed fetch")
        reqs = [req for _, req, _ in wire.fetches]
        first_forget = next(i for i, r in enumerate(reqs) if tp1 in forgotten(r))
        assert reqs[first_forget].session_epoch > 0
        # it joined the session again, as an added partition of an incremental fetch
        assert any(tp1 in sent_partitions(r) and r.session_epoch > 0
                   for r in reqs[first_forget + 1:])
        assert follower1.log_end_offset == 0
        wire.append(1)
        eventually(lambda: follower.log_end_offset == 3, "the healthy partition goes on")
        lead(tp1, 3)          # the leader reaches the follower's epoch: tp1 is replicated
        eventually(lambda: follower1.log_end_offset == 3, "tp1 replicated")
        assert len(wire.session_ids()) == 1
    finally:
        if m is not None:
            m.shutdown()
        wire.close()


def test_on_the_loop_the_leader_requests_of_a_truncation_run_in_a_worker_and_stop_ends_the_task(
        cluster, tmp_path, monkeypatch):
    """A fetcher on the broker's loop: the out-of-range answer's ListOffsets (a blocking
    request to the leader) runs in a worker thread while the fetcher waits, never on the loop;
    the fetch itself and the appends run on the loop; the manager's shutdown, from another
    thread, returns once every fetcher task has ended."""
    from strata.replication.replica_fetcher import ReplicaFetcher
    where: dict[str, set[str]] = {"out_of_range": set(), "append": set()}
    out_of_range = ReplicaFetcher._handle_out_of_range
    process_data = ReplicaFetcher._process_data

    def recorded(name, fn):
        def call(*args, **kwargs):
            where[name].add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(ReplicaFetcher, "_handle_out_of_range",
                        recorded("out_of_range", out_of_range))
    monkeypatch.setattr(ReplicaFetcher, "_process_data", recorded("append", process_data))
    wire = WireLeader(tmp_path / "wire-leader")
    m = None
    with broker_loop() as loop:
        try:
            wire.append(2)
            follower = cluster.follower()
            for offset in range(4):       # ahead of the leader: OFFSET_OUT_OF_RANGE
                follower.append_as_follower(batch(base_offset=offset))
            m = wire_manager(cluster, wire, loop=loop)
            m.add_partitions({TP: (LEADER, 0)})
            eventually(lambda: follower.log_end_offset == 2, "the truncation to the leader's end")
            wire.append(1)
            eventually(lambda: follower.log_end_offset == 3, "one more offset")
            assert where["append"] == {"broker-loop"}
            assert where["out_of_range"] and "broker-loop" not in where["out_of_range"]
            fetchers = list(m.threads().values())
            assert fetchers and all(f.is_alive() for f in fetchers)
            m.shutdown()
            m = None
            assert not any(f.is_alive() for f in fetchers)
            wire.append(1)
            time.sleep(0.2)   # a fetcher still running would copy it
            assert follower.log_end_offset == 3
        finally:
            if m is not None:
                m.shutdown()
            wire.close()


def test_stopping_a_fetcher_under_a_lock_the_blocked_loop_waits_for_returns_and_nothing_more_is_copied(
        cluster):
    """ReplicaManager.apply_states stops fetchers while holding its states lock, and the loop's
    AlterPartition callbacks take that lock: stopping must not wait for the loop (it would
    wait for ever), and once it returned the fetcher copies nothing more."""
    import asyncio
    leader_log = cluster.log("leader")
    append(leader_log, 1, 3)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    states_lock = threading.Lock()
    with broker_loop() as loop:
        m = cluster.manager(loop=loop)
        try:
            m.add_partitions({TP: (LEADER, 1)})
            eventually(lambda: follower.log_end_offset == 3, "the follower to copy 3 offsets")
            loop_blocked = threading.Event()

            def alter_partition_callback():   # as ReplicaManager._propose_isr's done callback
                loop_blocked.set()
                with states_lock:
                    pass
            with states_lock:                 # as apply_states, on the ZooKeeper thread
                loop.call_soon_threadsafe(alter_partition_callback)
                assert loop_blocked.wait(DEADLINE)
                stopper = threading.Thread(target=m.remove_partitions, args=([TP],))
                stopper.start()
                stopper.join(DEADLINE)
                assert not stopper.is_alive(), "stopping the fetcher waited for the blocked loop"
                assert m.threads() == {}
                append(leader_log, 1, 2)
                leader.wake.set()
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), loop).result(DEADLINE)
            assert follower.log_end_offset == 3
        finally:
            m.shutdown()


def test_a_full_disk_stops_the_partition_with_one_warning_and_following_afresh_resumes_it(
        cluster, managers, monkeypatch, caplog):
    """Issue 51: the partition a storage error stopped stayed stopped at its leader epoch (an
    ISR shrink does not bump it), so the follower never rejoined; now the broker removes and
    re-adds it once its dir takes writes, and it catches up."""
    import errno
    from strata.log import segment

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    leader_log = cluster.log("leader")
    append(leader_log, 1, 3)
    cluster.leaders[LEADER] = leader = FakeLeader({TP: leader_log})
    follower = cluster.follower()
    real_pwritev = segment.os.pwritev
    monkeypatch.setattr(segment.os, "pwritev", no_space)
    m = cluster.manager()
    managers.append(m)
    with caplog.at_level(logging.WARNING, logger="strata.replication.replica_fetcher"):
        m.add_partitions({TP: (LEADER, 1)})
        eventually(lambda: m.failed_partitions() == {TP: (LEADER, 1)}, "the partition stopped")
        n = len(leader.fetches)
        leader.wake.set()
        time.sleep(0.3)
    stopped = [r for r in caplog.records if "partition stopped" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].exc_info is None
    assert all(TP not in {TopicPartition(t.topic, p.partition) for t in r.topics
                          for p in t.partitions} for _, r in leader.fetches[n:])
    monkeypatch.setattr(segment.os, "pwritev", real_pwritev)
    m.add_partitions({TP: (LEADER, 1)})   # the same epoch: still stopped
    assert TP in m.failed_partitions()
    m.remove_partitions([TP])              # what LogDirFailureHandler does once the dir is back
    m.add_partitions({TP: (LEADER, 1)})
    eventually(lambda: follower.log_end_offset == 3, "the follower caught up")
    assert m.failed_partitions() == {}
