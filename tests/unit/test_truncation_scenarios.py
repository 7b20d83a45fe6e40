"""The truncation scenarios of KIP-101 and KIP-279, with the offsets and epochs they give.

KIP-101 replaced truncation to the high watermark by truncation to the leader's epoch
boundaries; KIP-279 made the leader answer, for an epoch it never had, the largest epoch at
or below it with that epoch's end offset, and the follower walk back epoch by epoch. Each test
replays one scenario (the KIPs' own, and the truncation scenarios of Kafka's
EpochDrivenReplicationProtocolAcceptanceTest, ReplicaFetcherThreadTest and
AbstractFetcherThreadTest, plus the back-to-back election of KAFKA-10706) between brokers that
are real: one LogManager with UnifiedLogs per broker on its own directory, the leader a
clustered ReplicaManager whose states come through ``apply_states``, and the follower Strata's
ReplicaFetcher, stepped by hand. Requests go to the leader's real Fetch and ListOffsets
handlers through the real codec, in process (no sockets).

A broker restart closes its logs and reopens the directory; a crash writes no clean-shutdown
marker (the logs recover) and may cut the segment file where unflushed data was lost.

Kafka restores a replica's high watermark from ``replication-offset-checkpoint`` at startup;
Strata keeps no such checkpoint (a reopened log's high watermark is its log end offset), so where
a scenario's point is a high watermark below the log end after a restart, the test puts the
checkpointed value back (``restart(..., checkpointed_hw=...)``).

Every test fails if the follower truncated to its high watermark (when it starts following, or
on a diverging epoch) instead of to the leader's epoch boundary.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import NamedTuple

import pytest
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.fetch.v12.response import FetchResponse
from kio.serial import entity_reader

from strata.common.errors import ErrorCode
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.protocol import records as rec
from strata.protocol.client import client_frame
from strata.protocol.codec import encode_response, parse_request
from strata.protocol.fetch_wire import ReplicaFetch
from strata.replication.replica_fetcher import ReplicaFetcher, ReplicaFetcherManager
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.handlers import fetch as fetch_handler
from strata.server.handlers import list_offsets as list_offsets_handler
from support.metadata_stand_in import no_metadata

TP = TopicPartition("t", 0)
T0 = 1_700_000_000_000
HANDLERS = {1: fetch_handler.handle, 2: list_offsets_handler.handle}
MAX_ROUNDS = 20


# ---- the cluster -------------------------------------------------------------------------------


class Exchange(NamedTuple):
    """One replica Fetch as the leader saw it and answered it."""

    follower: int
    fetch_offset: int
    last_fetched_epoch: int
    diverging: tuple[int, int] | None    # the leader's (epoch, end offset), KIP-320
    records: int                        # how many records it sent


class InProcessConnection:
    """A follower's connection to a leader: the request is framed and parsed by the codec,
    answered by the leader's own handler, encoded and decoded again, as on the wire."""

    def __init__(self, cluster: "Cluster", leader_id: int):
        self.cluster = cluster
        self.leader_id = leader_id
        self.correlation_id = 0

    def request(self, body, response_cls):
        broker = self.cluster.brokers[self.leader_id]
        if not broker.alive:
            raise ConnectionError(f"broker {self.leader_id} is down")
        self.correlation_id += 1
        if isinstance(body, ReplicaFetch):   # the fetcher's own encoding, as on the wire
            frame = body.frame(self.correlation_id, "replica-fetcher")[4:]
            body = body.to_kio()
        else:
            frame = client_frame(body, self.correlation_id, "replica-fetcher")
        request = parse_request(frame)
        answer = asyncio.run(HANDLERS[request.api_key](broker.ctx, request))
        frame = encode_response(request, answer)[4:]
        _, pos = entity_reader(response_cls.__header_schema__)(frame, 0)
        response, _ = entity_reader(response_cls)(frame, pos)
        if isinstance(body, FetchRequest):
            self.cluster.record(body, response)
        return response

    def close(self) -> None:
        pass


class Broker:
    def __init__(self, cluster: "Cluster", broker_id: int):
        self.cluster = cluster
        self.id = broker_id
        self.dir = cluster.tmp_path / f"broker-{broker_id}"
        self.alive = False
        self.fetcher: ReplicaFetcher | None = None
        self.start()

    def start(self) -> None:
        self.lm = LogManager([self.dir], LogConfig({}), scheduler=ImmediateScheduler())
        self.lm.startup()
        self.rm = ReplicaManager(self.lm, lambda topic: 1 if topic == TP.topic else None,
                                 broker_id=self.id, clustered=True)
        self.ctx = BrokerContext(node_id=self.id, advertised_host="", advertised_port=0,
                                 metadata=no_metadata(), replica_manager=self.rm)
        self.fetcher = None
        self.alive = True

    @property
    def log(self) -> UnifiedLog:
        ulog = self.lm.get_log(TP)
        assert ulog is not None, f"broker {self.id} hosts no log"
        return ulog

    # ---- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        """A clean shutdown."""
        self.lm.shutdown()
        self.alive = False
        self.fetcher = None

    def crash(self, *, lose_from_offset: int | None = None, lose_bytes: int | None = None) -> None:
        """A hard failure: no clean-shutdown marker, so the logs recover at the next start.
        ``lose_from_offset``: the page cache held the batches from that offset on, never
        flushed (the segment file is cut where that batch starts); ``lose_bytes``: that many
        bytes are cut from the end of the segment file (a torn write)."""
        segment = active_segment_file(self.log)
        for ulog in self.lm.all_logs():
            ulog.local_log.close()
        self.alive = False
        self.fetcher = None
        if lose_from_offset is not None:
            data = segment.read_bytes()
            cut = next((h.position for h in rec.iter_headers(data)
                        if h.last_offset >= lose_from_offset), len(data))
            os.truncate(segment, cut)
        if lose_bytes is not None:
            os.truncate(segment, max(0, segment.stat().st_size - lose_bytes))

    # ---- replication ------------------------------------------------------------------------

    def follow(self, leader_id: int, epoch: int) -> None:
        """What the broker's fetcher manager does for a new (leader, epoch): a fetcher
        for that leader, with the partition at that epoch (not started: the test steps it)."""
        manager = ReplicaFetcherManager(
            self.id, self.cluster.endpoint_of, lambda tp: self.lm.get_log(tp),
            connect=self.cluster.connect, max_wait_ms=0, backoff_ms=0)
        self.fetcher = ReplicaFetcher(manager, leader_id, 0)
        self.fetcher.add(TP, epoch)

    def send_fetch(self):
        """One Fetch to the leader, as the fetcher builds it: (request sent, answer)."""
        t = self.fetcher
        with t._lock:
            request, sent = t._build_request([TP], [])
        assert sent, f"broker {self.id} has nothing to fetch"
        return sent, t._connection().request(request, FetchResponse)

    def fetch(self) -> int:
        """One round of the fetcher (request, answer handled); our log end offset after it."""
        sent, response = self.send_fetch()
        worker: list = []
        with self.fetcher._lock:
            self.fetcher._process_response(response, sent, [], worker)
        self.fetcher._run_steps(worker)   # the leader requests of a truncation, as its worker
        return self.log.log_end_offset

    def catch_up(self) -> list[int]:
        """Fetch until the leader has nothing more and the high watermark came back too;
        the log end offset after every round."""
        ends = []
        leader = self.cluster.brokers[self.fetcher.leader_id]
        for _ in range(MAX_ROUNDS):
            ends.append(self.fetch())
            last = self.cluster.exchanges[-1]
            if (last.diverging is None and last.records == 0
                    and self.log.log_end_offset == leader.log.log_end_offset
                    and self.log.high_watermark == leader.log.high_watermark):
                return ends
        raise AssertionError(f"broker {self.id} did not converge with broker {leader.id} in "
                             f"{MAX_ROUNDS} fetches: {self.cluster.exchanges[-5:]}")

    # ---- the leader side --------------------------------------------------------------------

    def produce(self, *values: bytes, batch: bool = False) -> None:
        """Append as the leader does for a producer (acks=1): one batch per value, or all of
        them in one batch."""
        groups = [values] if batch else [(v,) for v in values]
        for group in groups:
            data = rec.build_batch([rec.SimpleRecord(v, b"k", timestamp=T0) for v in group])
            result = self.rm.append(TP, data, produce_version=9)
            assert result.error == ErrorCode.NONE, result


class Cluster:
    def __init__(self, tmp_path: Path, ids: tuple[int, ...]):
        self.tmp_path = tmp_path
        self.replicas = ids
        self.brokers = {i: Broker(self, i) for i in ids}
        self.state: PartitionState | None = None
        self.partition_epoch = 0
        self.exchanges: list[Exchange] = []

    def endpoint_of(self, broker_id: int):
        return ("in-process", broker_id) if self.brokers[broker_id].alive else None

    def connect(self, address: str) -> InProcessConnection:
        return InProcessConnection(self, int(address.rsplit(":", 1)[1]))

    def record(self, request: FetchRequest, response) -> None:
        p = next(p for t in request.topics for p in t.partitions)
        a = next(a for t in response.responses for a in t.partitions)
        diverging = None
        if a.diverging_epoch is not None and a.diverging_epoch.epoch >= 0:
            diverging = (int(a.diverging_epoch.epoch), int(a.diverging_epoch.end_offset))
        count = sum(1 for _ in rec.iter_records(bytes(a.records or b"")))
        self.exchanges.append(Exchange(int(request.replica_id), int(p.fetch_offset),
                                       int(p.last_fetched_epoch), diverging, count))

    def elect(self, leader: int, epoch: int, isr: tuple[int, ...]) -> None:
        """The controller's new partition state, applied on every live broker; the live
        followers start fetching from the leader at that epoch."""
        self.partition_epoch += 1
        self.state = PartitionState(leader, epoch, isr, self.replicas, self.partition_epoch)
        for b in self.brokers.values():
            if b.alive:
                self._apply(b)

    def offline(self, epoch: int, isr: tuple[int, ...]) -> None:
        """No live replica can lead (the controller's offline partition: no leader)."""
        self.elect(leader=-1, epoch=epoch, isr=isr)

    def _apply(self, b: Broker) -> None:
        b.rm.apply_states({TP: self.state})
        if self.state.leader == b.id:
            b.fetcher = None
        elif self.state.leader >= 0:
            b.follow(self.state.leader, self.state.leader_epoch)

    def restart(self, broker_id: int, *, checkpointed_hw: int | None = None) -> Broker:
        """Start a stopped or crashed broker; it takes the current partition state."""
        b = self.brokers[broker_id]
        assert not b.alive
        b.start()
        if checkpointed_hw is not None:
            # Kafka reads this from replication-offset-checkpoint; Strata keeps none
            b.log.update_high_watermark(checkpointed_hw)
        if self.state is not None:
            self._apply(b)
        return b

    def close(self) -> None:
        for b in self.brokers.values():
            if b.alive:
                b.stop()


def active_segment_file(ulog: UnifiedLog) -> Path:
    return Path(ulog.local_log.active_segment.log_path)


def records(ulog: UnifiedLog) -> list[tuple[int, int, bytes]]:
    """(offset, leader epoch, value) of every record in the log."""
    if ulog.log_end_offset == ulog.log_start_offset:
        return []
    data = bytes(ulog.read(ulog.log_start_offset, 1 << 30, FetchIsolation.LOG_END).records)
    return [(r.offset, h.partition_leader_epoch, r.value)
            for h in rec.iter_headers(data) for r in rec.decode_batch(data, h)]


def epochs(ulog: UnifiedLog) -> list[tuple[int, int]]:
    return [tuple(e) for e in ulog.leader_epoch_cache.epoch_entries()]


def assert_same_logs(a: Broker, b: Broker) -> None:
    assert records(a.log) == records(b.log)
    assert active_segment_file(a.log).read_bytes() == active_segment_file(b.log).read_bytes()


@pytest.fixture
def make_cluster(tmp_path):
    made: list[Cluster] = []

    def make(*ids: int) -> Cluster:
        c = Cluster(tmp_path, ids)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


# ---- KIP-101 ------------------------------------------------------------------------------------


def test_kip101_scenario1_a_restarted_follower_keeps_m2_and_m2_survives_the_leaders_failure(
        make_cluster):
    """KIP-101, scenario 1 (high watermark truncation followed by immediate leader election).

    B leads (epoch 0); A has fetched m1 (offset 0) and m2 (offset 1) but heard of the high
    watermark only up to 1: B {m1, m2, HW 2}, A {m1, m2, HW 1}. A restarts and issues a fetch
    to B; B then fails and A leads epoch 1. Truncating to its HW on restart would have lost m2
    for good; instead A's fetch names its latest epoch 0, whose end on B is 2: nothing to
    truncate, and A leads with m2 at offset 1."""
    c = make_cluster(1, 2)
    a, b = c.brokers[1], c.brokers[2]
    c.elect(leader=2, epoch=0, isr=(1, 2))
    b.produce(b"m1")
    assert a.fetch() == 1          # m1
    b.produce(b"m2")
    assert a.fetch() == 2          # m2, with the leader's HW as of our fetch at 1
    assert (a.log.high_watermark, b.log.high_watermark) == (1, 1)
    a.send_fetch()                 # B learns A is at 2 (HW 2); A restarts before the answer
    assert (b.log.log_end_offset, b.log.high_watermark) == (2, 2)
    assert (a.log.log_end_offset, a.log.high_watermark) == (2, 1)

    a.stop()
    c.restart(1, checkpointed_hw=1)
    assert (a.log.log_end_offset, a.log.high_watermark) == (2, 1)
    # OffsetForLeaderEpoch(epoch 0) on B: epoch 0 ends at B's log end, 2
    assert b.rm.end_offset_for_epoch(TP, 0, 0) == (ErrorCode.NONE, 0, 2)
    a.send_fetch()                 # A's first fetch: from 2, last fetched epoch 0; no divergence
    assert c.exchanges[-1][1:4] == (2, 0, None)
    assert a.log.log_end_offset == 2

    b.crash()                      # B fails before A handles the answer
    c.elect(leader=1, epoch=1, isr=(1,))
    assert records(a.log) == [(0, 0, b"m1"), (1, 0, b"m2")]
    assert epochs(a.log) == [(0, 0), (1, 2)]

    c.restart(2)                   # B comes back as a follower of A
    a.produce(b"m3")
    b.catch_up()
    assert records(b.log) == [(0, 0, b"m1"), (1, 0, b"m2"), (2, 1, b"m3")]
    assert_same_logs(a, b)
    assert epochs(a.log) == epochs(b.log) == [(0, 0), (1, 2)]
    assert a.log.high_watermark == b.log.high_watermark == 3


def test_kip101_scenario2_replicas_converge_after_both_crash_and_the_follower_lost_m2(
        make_cluster):
    """KIP-101, scenario 2 (replica divergence on restart after multiple hard failures).

    A leads (epoch 0) with m1, m2 (HW 2); B fetched both but m2 was still in its page cache
    when the power went: B restarts with m1 only, leads epoch 1 and takes m3 at offset 1.
    A restarts with m1, m2 and HW 2: truncating to the HW leaves m2 and m3 both at offset 1.
    With epochs, A asks for the end of epoch 0, B answers 1, A truncates to 1 and copies m3."""
    c = make_cluster(1, 2)
    a, b = c.brokers[1], c.brokers[2]
    c.elect(leader=1, epoch=0, isr=(1, 2))
    a.produce(b"m1", b"m2")
    b.catch_up()
    assert (a.log.high_watermark, b.log.high_watermark) == (2, 2)

    b.crash(lose_from_offset=1)    # m2 never reached B's disk
    a.crash()
    c.restart(2)
    assert records(b.log) == [(0, 0, b"m1")]
    assert epochs(b.log) == [(0, 0)]
    c.elect(leader=2, epoch=1, isr=(2,))
    b.produce(b"m3")
    assert epochs(b.log) == [(0, 0), (1, 1)]

    c.restart(1)
    assert records(a.log) == [(0, 0, b"m1"), (1, 0, b"m2")]
    assert a.log.high_watermark == 2
    # OffsetForLeaderEpoch(epoch 0) on B: epoch 0 ends where epoch 1 starts, offset 1
    assert b.rm.end_offset_for_epoch(TP, 1, 0) == (ErrorCode.NONE, 0, 1)
    assert a.fetch() == 1          # m2 truncated
    assert c.exchanges[-1][1:4] == (2, 0, (0, 1))
    a.catch_up()
    assert records(a.log) == records(b.log) == [(0, 0, b"m1"), (1, 1, b"m3")]
    assert_same_logs(a, b)
    assert epochs(a.log) == epochs(b.log) == [(0, 0), (1, 1)]
    assert a.log.high_watermark == b.log.high_watermark == 2


# ---- KIP-279 ------------------------------------------------------------------------------------


def test_kip279_a_follower_with_an_epoch_the_leader_never_had_truncates_to_the_end_of_the_one_below(
        make_cluster):
    """KIP-279 (KAFKA-6361), fast leader failover: the follower's latest epoch is not the
    leader's.

    A leads epoch 1 with m0, m1 on both replicas and m2 (offset 2) on A only. A fails; B leads
    epoch 2 alone and takes m3 at offset 2. B fails before A fetched anything; A leads epoch 3.
        A: epochs (1,0), (3,3)   log m0 m1 m2(e1)     B: epochs (1,0), (2,2)   log m0 m1 m3(e2)
    B asks for epoch 2. A never had it: it answers the largest epoch at or below it, 1, and
    its end offset 3 (the start of epoch 3). B has epoch 1 and ends it at 2, so it truncates to
    min(2, 3) = 2 and copies m2. (Before KIP-279 the leader answered the start offset of the
    next epoch, 3, and B kept m3 where A has m2; B's high watermark is 3 too.)"""
    c = make_cluster(1, 2)
    a, b = c.brokers[1], c.brokers[2]
    c.elect(leader=1, epoch=1, isr=(1, 2))
    a.produce(b"m0", b"m1")
    b.catch_up()
    a.produce(b"m2")
    a.crash()
    c.elect(leader=2, epoch=2, isr=(2,))
    b.produce(b"m3")
    b.crash()
    c.restart(1)
    c.elect(leader=1, epoch=3, isr=(1,))
    c.restart(2)
    assert epochs(a.log) == [(1, 0), (3, 3)]
    assert epochs(b.log) == [(1, 0), (2, 2)]
    assert (b.log.log_end_offset, b.log.high_watermark) == (3, 3)
    assert a.rm.end_offset_for_epoch(TP, 3, 2) == (ErrorCode.NONE, 1, 3)

    assert b.fetch() == 2
    assert c.exchanges[-1][1:4] == (3, 2, (1, 3))
    b.catch_up()
    assert records(b.log) == [(0, 1, b"m0"), (1, 1, b"m1"), (2, 1, b"m2")]
    assert_same_logs(a, b)
    a.produce(b"m4")
    b.catch_up()
    assert_same_logs(a, b)
    assert epochs(a.log) == epochs(b.log) == [(1, 0), (3, 3)]
    assert a.log.high_watermark == b.log.high_watermark == 4


def test_kip279_an_epoch_unknown_to_the_follower_makes_it_cut_to_its_epoch_below_and_ask_again(
        make_cluster):
    """KIP-279 as Kafka's ReplicaFetcherThreadTest
    (shouldFetchLeaderEpochSecondTimeIfLeaderRepliesWithEpochNotKnownToFollower) gives it:
    the follower's latest epoch is 5 and its log ends at 200; the leader answers epoch 4, end
    offset 155; the follower has no epoch 4, its epoch 3 ends at 120: it truncates to 120 and
    asks for epoch 3; the leader's epoch 3 ends at 101: it truncates to 101.
        leader:   (3,0) (4,101) (6,155), log end 160
        follower: (3,0) (5,120),         log end 200
    (F led epoch 3 and wrote 0..119, L had fetched 0..100; L led epoch 4 alone, 101..154;
    F led epoch 5 alone, 120..199; L leads epoch 6, 155..159.)"""
    c = make_cluster(1, 2)
    leader, follower = c.brokers[1], c.brokers[2]
    c.elect(leader=2, epoch=3, isr=(1, 2))
    follower.produce(*[b"f3-%d" % i for i in range(101)], batch=True)
    leader.catch_up()
    follower.produce(*[b"f3-%d" % i for i in range(101, 120)], batch=True)
    follower.crash()
    c.elect(leader=1, epoch=4, isr=(1,))
    leader.produce(*[b"l4-%d" % i for i in range(101, 155)], batch=True)
    leader.crash()
    c.restart(2)
    c.elect(leader=2, epoch=5, isr=(2,))
    follower.produce(*[b"f5-%d" % i for i in range(120, 200)], batch=True)
    follower.crash()
    c.restart(1)
    c.elect(leader=1, epoch=6, isr=(1,))
    leader.produce(*[b"l6-%d" % i for i in range(155, 160)], batch=True)
    c.restart(2)
    assert epochs(leader.log) == [(3, 0), (4, 101), (6, 155)]
    assert epochs(follower.log) == [(3, 0), (5, 120)]
    assert follower.log.log_end_offset == 200
    # the two OffsetForLeaderEpoch answers of the Kafka test
    assert leader.rm.end_offset_for_epoch(TP, 6, 5) == (ErrorCode.NONE, 4, 155)
    assert leader.rm.end_offset_for_epoch(TP, 6, 3) == (ErrorCode.NONE, 3, 101)

    assert follower.fetch() == 120
    assert follower.fetch() == 101
    assert [e[1:4] for e in c.exchanges[-2:]] == [(200, 5, (4, 155)), (120, 3, (3, 101))]
    follower.catch_up()
    assert_same_logs(leader, follower)
    assert records(follower.log)[100] == (100, 3, b"f3-100")
    assert records(follower.log)[101] == (101, 4, b"l4-101")
    assert epochs(follower.log) == [(3, 0), (4, 101), (6, 155)]
    assert follower.log.high_watermark == leader.log.high_watermark == 160


def test_kip279_logs_do_not_diverge_on_unclean_leader_elections(make_cluster):
    """Kafka's EpochDrivenReplicationProtocolAcceptanceTest
    .logsShouldNotDivergeOnUncleanLeaderElections, the integration test of KIP-279: two
    brokers, unclean election, min ISR 1, acks=1; the brokers take turns as the only live one
    (one epoch each; Kafka's test does not fix the numbers):
        epoch 0: 100 leads, m0 on both            epoch 1: 101 alone, m1 (offset 1)
        epoch 2: 100 alone, b1 b2 b3 (1..3)       epoch 3: 101 alone, m2 (offset 2)
        epoch 4: 100 alone, b4 b5 (4..5)          then 101 follows 100
        100: (0,0) (2,1) (4,4)                    101: (0,0) (1,1) (3,2), log end 3
    101 walks back one epoch per answer: for epoch 3 the leader answers (2, 4), 101's end of
    epoch 1 (its largest below 2) is 2: truncate to 2; for epoch 1 the leader answers (0, 1):
    truncate to 1; then it copies 1..5."""
    c = make_cluster(100, 101)
    b100, b101 = c.brokers[100], c.brokers[101]
    c.elect(leader=100, epoch=0, isr=(100, 101))
    b100.produce(b"m0")
    b101.catch_up()
    b100.stop()
    c.elect(leader=101, epoch=1, isr=(101,))
    b101.produce(b"m1")
    b101.stop()
    c.restart(100)
    c.elect(leader=100, epoch=2, isr=(100,))
    b100.produce(b"b1" * 50, b"b2" * 50, b"b3" * 50)
    b100.stop()
    c.restart(101)
    c.elect(leader=101, epoch=3, isr=(101,))
    b101.produce(b"m2")
    b101.stop()
    c.restart(100)
    c.elect(leader=100, epoch=4, isr=(100,))
    b100.produce(b"b4" * 50, b"b5" * 50)
    c.restart(101)
    assert epochs(b100.log) == [(0, 0), (2, 1), (4, 4)]
    assert epochs(b101.log) == [(0, 0), (1, 1), (3, 2)]
    assert b101.log.high_watermark == 3

    assert b101.fetch() == 2
    assert b101.fetch() == 1
    assert [e[1:4] for e in c.exchanges[-2:]] == [(3, 3, (2, 4)), (2, 1, (0, 1))]
    b101.catch_up()
    assert_same_logs(b100, b101)
    assert [v[:2] for _, _, v in records(b101.log)] == [b"m0", b"b1", b"b2", b"b3", b"b4", b"b5"]
    assert epochs(b101.log) == [(0, 0), (2, 1), (4, 4)]
    assert b101.log.high_watermark == b100.log.high_watermark == 6


def test_kafka_10706_a_follower_drops_an_epoch_it_stamped_but_never_wrote(make_cluster):
    """KAFKA-10706 (back-to-back elections, the truncation liveness bug): A led epoch 7, B
    led epoch 8 without writing anything, A leads epoch 9 again:
        A: (4,3953) (7,3983) (9,3988), records 3953..3987
        B: (4,3953) (8,3983),          records 3953..3982, log end 3983
    B asks for epoch 8; A answers epoch 7, end offset 3988; B's largest epoch below 7 is 4,
    ending at 3983 = its log end: nothing to cut from the log, but B's epoch 8 entry (at its
    log end) must go, or B asks for epoch 8 again forever and never rejoins the ISR."""
    c = make_cluster(1, 2)
    a, b = c.brokers[1], c.brokers[2]
    for broker in (a, b):   # both logs start at 3953: older segments are gone
        broker.lm.get_or_create_log(TP).truncate_fully_and_start_at(3953)
    c.elect(leader=1, epoch=4, isr=(1, 2))
    a.produce(*[b"e4-%d" % i for i in range(3953, 3983)], batch=True)
    assert b.fetch() == 3983       # B's high watermark stays 3953 until its next fetch
    c.elect(leader=1, epoch=7, isr=(1, 2))
    a.produce(*[b"e7-%d" % i for i in range(3983, 3988)], batch=True)
    c.elect(leader=2, epoch=8, isr=(1, 2))
    c.elect(leader=1, epoch=9, isr=(1, 2))
    assert epochs(a.log) == [(4, 3953), (7, 3983), (9, 3988)]
    assert epochs(b.log) == [(4, 3953), (8, 3983)]
    assert (b.log.log_end_offset, b.log.high_watermark) == (3983, 3953)
    assert a.rm.end_offset_for_epoch(TP, 9, 8) == (ErrorCode.NONE, 7, 3988)

    assert b.fetch() == 3983
    assert c.exchanges[-1][1:4] == (3983, 8, (7, 3988))
    assert epochs(b.log) == [(4, 3953)]
    b.catch_up()
    assert c.exchanges[-2][1:3] == (3983, 4)
    assert_same_logs(a, b)
    a.produce(b"e9-3988")
    b.catch_up()
    assert epochs(b.log) == epochs(a.log) == [(4, 3953), (7, 3983), (9, 3988)]
    assert b.log.high_watermark == a.log.high_watermark == 3989


# ---- Kafka's acceptance and fetcher tests about truncation ------------------------------------


def test_should_not_allow_divergent_logs_after_the_leader_loses_its_unflushed_tail(make_cluster):
    """Kafka's EpochDrivenReplicationProtocolAcceptanceTest.shouldNotAllowDivergentLogs:
    ten messages on both brokers (epoch 0); 101 stops, then 100 crashes and loses the last
    five messages' bytes; 100 comes back as leader (epoch 3, offsets 0..4 left) and takes
    nine more messages at 5..13. 101 (0..9, high watermark 10) starts again and must match:
    the leader's epoch 0 ends at 5, so it truncates to 5, not to its high watermark 10."""
    c = make_cluster(100, 101)
    b100, b101 = c.brokers[100], c.brokers[101]
    msg = b"x" * 1000
    c.elect(leader=100, epoch=0, isr=(100, 101))
    b100.produce(*[msg] * 10)
    b101.catch_up()
    assert b101.log.high_watermark == 10
    b101.stop()
    c.elect(leader=100, epoch=1, isr=(100,))
    b100.crash(lose_bytes=5 * len(msg))
    c.offline(epoch=2, isr=(100,))
    c.restart(100)
    assert b100.log.log_end_offset == 5
    assert epochs(b100.log) == [(0, 0)]      # (1, 10) was past the recovered log end
    c.elect(leader=100, epoch=3, isr=(100,))
    b100.produce(*[b"y" * 1000] * 9)
    c.restart(101)
    assert (b101.log.log_end_offset, b101.log.high_watermark) == (10, 10)

    assert b101.fetch() == 5
    assert c.exchanges[-1][1:4] == (10, 0, (0, 5))
    b101.catch_up()
    assert_same_logs(b100, b101)
    assert [v[:1] for _, _, v in records(b101.log)] == [b"x"] * 5 + [b"y"] * 9
    assert epochs(b101.log) == epochs(b100.log) == [(0, 0), (3, 5)]
    assert b101.log.high_watermark == b100.log.high_watermark == 14


def test_offsets_should_not_go_backwards_when_the_followers_end_falls_inside_a_leader_batch(
        make_cluster):
    """Kafka's EpochDrivenReplicationProtocolAcceptanceTest.offsetsShouldNotGoBackwards: 100
    one-record batches on both brokers; the leader crashes and loses half its file (offsets
    0..49 left), then takes two batches of 77 records (50..126, 127..203) at epoch 3. The
    follower's log end, 100, falls inside the first: fetching from there would hand it a batch
    starting at 50. With epochs it truncates to 50 first and copies whole batches."""
    c = make_cluster(100, 101)
    b100, b101 = c.brokers[100], c.brokers[101]
    c.elect(leader=100, epoch=0, isr=(100, 101))
    b100.produce(*[b"%03d" % i * 100 for i in range(100)])
    b101.catch_up()
    b101.stop()
    c.elect(leader=100, epoch=1, isr=(100,))
    size = active_segment_file(b100.log).stat().st_size
    b100.crash(lose_bytes=size // 2)
    c.offline(epoch=2, isr=(100,))
    c.restart(100)
    assert b100.log.log_end_offset == 50
    c.elect(leader=100, epoch=3, isr=(100,))
    b100.produce(*[b"a" * 300] * 77, batch=True)
    b100.produce(*[b"b" * 300] * 77, batch=True)
    c.restart(101)
    assert b101.log.log_end_offset == 100

    assert b101.fetch() == 50
    assert c.exchanges[-1][1:4] == (100, 0, (0, 50))
    b101.catch_up()
    offsets = [o for o, _, _ in records(b101.log)]
    assert offsets == list(range(204))
    assert_same_logs(b100, b101)
    assert epochs(b101.log) == epochs(b100.log) == [(0, 0), (3, 50)]
    assert b101.log.high_watermark == b100.log.high_watermark == 204


def test_fast_leader_changes_lose_no_record_both_replicas_had(make_cluster):
    """Kafka's EpochDrivenReplicationProtocolAcceptanceTest.shouldSurviveFastLeaderChange,
    made deterministic as KIP-101 scenario 1 repeated: five rounds of (produce one record,
    which the follower fetches while its high watermark lags one behind; the follower
    crashes and restarts at once, still in the ISR; it fetches, and the leader crashes before
    answering; the follower leads the next epoch; the old leader restarts and follows).
    Truncating to the high watermark on restart would lose each round's record; with epochs
    both logs end at the number of records written after every round."""
    c = make_cluster(100, 101)
    c.elect(leader=100, epoch=0, isr=(100, 101))
    c.brokers[100].produce(b"r0")
    c.brokers[101].catch_up()
    leader, follower, epoch, written = 100, 101, 0, 1
    for _ in range(5):
        lead, fol = c.brokers[leader], c.brokers[follower]
        lead.produce(b"r%d" % written)
        written += 1
        assert fol.fetch() == written
        fol.send_fetch()                       # acknowledged (HW) on the leader; answer lost
        assert (lead.log.high_watermark, fol.log.high_watermark) == (written, written - 1)

        fol.crash()                            # back before its session expires: same epoch
        c.restart(follower, checkpointed_hw=written - 1)
        fol.send_fetch()                       # the leader crashes before answering
        assert c.exchanges[-1][1:3] == (written, epoch)
        lead.crash()
        epoch += 1
        c.elect(leader=follower, epoch=epoch, isr=(follower,))
        assert fol.log.log_end_offset == written

        c.restart(leader)
        lead.catch_up()
        c.elect(leader=follower, epoch=epoch, isr=(follower, leader))
        assert lead.log.log_end_offset == fol.log.log_end_offset == written
        assert lead.log.high_watermark == fol.log.high_watermark == written
        assert_same_logs(lead, fol)
        leader, follower = follower, leader
    assert [v for _, _, v in records(c.brokers[leader].log)] == [b"r%d" % i for i in range(6)]
    assert epochs(c.brokers[leader].log) == [(0, 0)] + [(e, e + 1) for e in range(1, 6)]


def test_a_diverging_fetch_truncates_to_the_epoch_boundary_3_not_to_the_high_watermark_1(
        make_cluster):
    """Kafka's AbstractFetcherThreadTest.testTruncateOnFetchDoesNotProcessPartitionData:
        follower: a b (e0) c (e2) d e f (e4), high watermark 1
        leader:   a b (e0) c (e2) g h (e5), leader epoch 5
    The first fetch (offset 6, epoch 4) is answered with the diverging epoch (2, 3): the
    follower truncates to 3 and processes no data (its high watermark stays 1); then it
    copies g and h."""
    c = make_cluster(1, 2)
    leader, follower = c.brokers[1], c.brokers[2]
    c.elect(leader=1, epoch=0, isr=(1, 2))
    leader.produce(b"a", b"b")
    follower.catch_up()
    c.elect(leader=1, epoch=2, isr=(1, 2))
    leader.produce(b"c")
    follower.catch_up()
    leader.crash()
    c.elect(leader=2, epoch=4, isr=(2,))
    follower.produce(b"d", b"e", b"f")
    follower.crash()
    c.restart(1)
    c.elect(leader=1, epoch=5, isr=(1,))
    leader.produce(b"g", b"h")
    c.restart(2, checkpointed_hw=1)
    assert epochs(follower.log) == [(0, 0), (2, 2), (4, 3)]
    assert epochs(leader.log) == [(0, 0), (2, 2), (5, 3)]

    assert follower.fetch() == 3
    assert c.exchanges[-1][1:5] == (6, 4, (2, 3), 0)
    assert follower.log.high_watermark == 1
    follower.catch_up()
    assert [v for _, _, v in records(follower.log)] == [b"a", b"b", b"c", b"g", b"h"]
    assert_same_logs(leader, follower)
    assert follower.log.high_watermark == leader.log.high_watermark == 5


def test_a_follower_with_no_common_epoch_walks_back_to_offset_zero(make_cluster):
    """Kafka's AbstractFetcherThreadTest.testTruncation: the same three offsets, never the
    same epoch:
        follower: a (e0) b (e2) c (e4), high watermark 0
        leader:   a (e1) b (e3) c (e5), leader epoch 5
    The answers walk the follower back one epoch at a time: epoch 4 -> (3, 2), truncate to 2;
    epoch 2 -> (1, 1), truncate to 1; epoch 0, below every epoch of the leader -> (0, 0)
    (KAFKA-7415: the requested epoch and the leader's first offset), truncate to 0."""
    c = make_cluster(1, 2)
    follower, leader = c.brokers[1], c.brokers[2]
    # each broker leads every other epoch alone and writes one record; neither ever fetches
    c.elect(leader=1, epoch=0, isr=(1,))
    leader.crash()
    follower.produce(b"a")
    for epoch, value in enumerate([b"a", b"b", b"b", b"c", b"c"], start=1):
        mine, other = (follower, leader) if epoch % 2 == 0 else (leader, follower)
        other.crash()
        c.restart(mine.id)
        c.elect(leader=mine.id, epoch=epoch, isr=(mine.id,))
        mine.produce(value)
    c.restart(1, checkpointed_hw=0)
    c.elect(leader=2, epoch=5, isr=(2, 1))
    assert epochs(follower.log) == [(0, 0), (2, 1), (4, 2)]
    assert epochs(leader.log) == [(1, 0), (3, 1), (5, 2)]

    assert [follower.fetch() for _ in range(3)] == [2, 1, 0]
    assert [e[1:4] for e in c.exchanges[-3:]] == [(3, 4, (3, 2)), (2, 2, (1, 1)), (1, 0, (0, 0))]
    assert epochs(follower.log) == []
    follower.catch_up()
    assert_same_logs(leader, follower)
    assert epochs(follower.log) == [(1, 0), (3, 1), (5, 2)]
    assert follower.log.high_watermark == leader.log.high_watermark == 3
