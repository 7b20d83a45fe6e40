"""Zero-copy Fetch: responses sent with sendfile are byte-identical to the copying path's.

A real listener (KafkaServer) serves the real Fetch handler over loopback sockets, from real
segment files, on plain asyncio and on uvloop; the copying path is the same handler with a
ReplicaManager that reads bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import socket
import struct
import threading
from pathlib import Path

import pytest
import uvloop
from kio.serial import entity_reader

from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.net.connection import recv_exact
from strata.protocol.codec import API_VERSIONS, ApiKey, make, request_class, response_class
from strata.protocol.file_region import FileRegion, whole_batches_length
from strata.protocol.records import Compression, SimpleRecord, build_batch, iter_headers
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.handlers import fetch
from strata.server.network import KafkaServer
from strata.protocol.client import client_frame, framed
from support.replicas import lead_alone
from support.waiting import eventually
from support.metadata_stand_in import no_metadata

TOPIC = "t"
SEGMENT_BYTES = 64 * 1024
DEADLINE_S = 20


class CopyingReplicaManager(ReplicaManager):
    """The copying read path: records as bytes read from the segment, whatever is asked."""

    def read(self, *args, as_region: bool = False, **kw):
        return super().read(*args, **kw)


class Broker:
    """Logs in ``path`` served on two listeners from one event-loop thread: ``zero_copy``
    (regions sent with sendfile) and ``copying`` (records read into memory)."""

    def __init__(self, path: Path, new_loop, partitions: int = 3,
                 segment_bytes: int = SEGMENT_BYTES):
        config = LogConfig({"internal.segment.bytes": segment_bytes, "file.delete.delay.ms": 0,
                            "retention.ms": -1})
        self.logs = LogManager([path], config)
        self.logs.startup()
        count = lambda topic: partitions if topic == TOPIC else None  # noqa: E731
        self.rm = ReplicaManager(self.logs, count)
        copying = CopyingReplicaManager(self.logs, count)
        for rm in (self.rm, copying):
            lead_alone(rm, *(TopicPartition(TOPIC, p) for p in range(partitions)))
        self.loop = new_loop()
        self.servers = {}
        for name, rm in (("zero_copy", self.rm), ("copying", copying)):
            ctx = BrokerContext(node_id=1, advertised_host="127.0.0.1", advertised_port=0,
                                metadata=no_metadata(), replica_manager=rm)
            self.servers[name] = KafkaServer(
                lambda request, info, ctx=ctx: fetch.handle(ctx, request), "127.0.0.1", 0,
                sendfile=name == "zero_copy")
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        for server in self.servers.values():
            self.call(server.start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)

    def port(self, name: str) -> int:
        return self.servers[name].port

    def append(self, partition: int, data: bytes) -> None:
        result = self.rm.append(TopicPartition(TOPIC, partition), data, produce_version=9)
        assert result.error == 0, result

    def close(self) -> None:
        for server in self.servers.values():
            self.call(server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.logs.shutdown()


@pytest.fixture(params=["asyncio", "uvloop"])
def new_loop(request):
    """Plain asyncio, and uvloop (what ``strata serve`` runs)."""
    return uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop


@pytest.fixture
def broker(tmp_path, new_loop):
    b = Broker(tmp_path / "logs", new_loop)
    yield b
    b.close()


def batch(first: int, n: int, size: int, compression=Compression.NONE) -> bytes:
    return build_batch([SimpleRecord(bytes([(first + i) % 251]) * size, b"k%d" % (first + i),
                                     timestamp=1_700_000_000_000 + first + i) for i in range(n)],
                       compression=compression)


def fill(broker: Broker) -> None:
    """Partition 0: batches of 1 to 20 records of varied sizes over several segments;
    partition 1: empty; partition 2: a few batches."""
    offset = 0
    for i in range(60):
        n = 1 + i % 20
        broker.append(0, batch(offset, n, 100 + (i * 37) % 900))
        offset += n
    for i in range(3):
        broker.append(2, batch(i, 1, 5000))


def fetch_request(version: int, partitions: list[tuple[int, int, int]], max_bytes: int,
                  isolation_level: int = 0):
    cls = request_class(ApiKey.FETCH, version)
    by_partition = tuple(make(cls, "topics.partitions", partition=p, fetch_offset=offset,
                              partition_max_bytes=pmax, current_leader_epoch=-1,
                              log_start_offset=-1, last_fetched_epoch=-1)
                         for p, offset, pmax in partitions)
    return make(cls, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                max_bytes=max_bytes, isolation_level=isolation_level, session_id=0,
                session_epoch=-1, topics=(make(cls, "topics", topic=TOPIC, partitions=by_partition),),
                forgotten_topics_data=(), rack_id="")


def exchange(port: int, request, correlation_id: int = 7) -> bytes:
    """One request on a fresh connection; the whole response frame."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        sock.sendall(framed(client_frame(request, correlation_id)))
        head = recv_exact(sock, 4)
        return bytes(head + recv_exact(sock, struct.unpack(">i", head)[0]))


@pytest.fixture
def sendfile_calls(monkeypatch):
    """Counts the listener's sendfile calls (the real call still runs)."""
    import strata.server.network as network
    calls = []
    real = os.sendfile

    def counting(out_fd, in_fd, offset, count):
        calls.append(count)
        return real(out_fd, in_fd, offset, count)
    monkeypatch.setattr(network.os, "sendfile", counting)
    return calls


FETCH_VERSIONS = range(API_VERSIONS[ApiKey.FETCH][0], API_VERSIONS[ApiKey.FETCH][1] + 1)
CASES = {
    # (partition, fetch offset, partition max bytes) ..., request max bytes
    "one partition, from the start": ([(0, 0, 1 << 20)], 1 << 20),
    "max_bytes cuts a batch": ([(0, 0, 3000)], 1 << 20),
    "first batch larger than max_bytes (KIP-74)": ([(0, 5, 10)], 10),
    "offset inside a batch, next segments": ([(0, 333, 200_000)], 1 << 20),
    "several partitions: local, empty, erroring, budget spent": (
        [(0, 100, 50_000), (1, 0, 50_000), (7, 0, 50_000), (2, 1, 50_000), (0, 0, 50_000)],
        60_000),
    "out of range": ([(0, 10_000, 50_000), (2, 0, 50_000)], 1 << 20),
}


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_sendfile_response_is_byte_identical_to_the_copied_one(broker, sendfile_calls, version, case):
    fill(broker)
    partitions, max_bytes = CASES[case]
    request = fetch_request(version, partitions, max_bytes)
    copied = exchange(broker.port("copying"), request)
    assert sendfile_calls == []
    sent = exchange(broker.port("zero_copy"), request)
    assert sent == copied
    if case != "out of range":
        assert sendfile_calls, "records went through memory"


def test_segment_boundaries_read_identically_with_and_without_sendfile(broker):
    fill(broker)
    tp_log = broker.logs.get_log(TopicPartition(TOPIC, 0))
    assert len(tp_log.local_log.segments) >= 3
    offset = 0
    end = tp_log.log_end_offset
    while offset < end:   # a consumer's walk, segment after segment
        request = fetch_request(12, [(0, offset, 40_000)], 40_000)
        sent = exchange(broker.port("zero_copy"), request)
        assert sent == exchange(broker.port("copying"), request)
        got = list(iter_headers(records_of(sent)))
        assert got, f"nothing at offset {offset}"
        offset = got[-1].next_offset
    assert offset == end


def records_of(frame: bytes) -> bytes:
    """The records of the only partition of a Fetch v12 response frame."""
    cls = response_class(ApiKey.FETCH, 12)
    body, _ = entity_reader(cls)(frame, 4 + 4 + 1)   # length, correlation id, header tags
    return bytes(body.responses[0].partitions[0].records or b"")


def test_old_fetch_versions_refuse_zstd_from_a_region_as_from_bytes(broker):
    broker.append(0, batch(0, 3, 500, compression=Compression.ZSTD))
    for version in (9, 10):
        request = fetch_request(version, [(0, 0, 1 << 20)], 1 << 20)
        assert exchange(broker.port("zero_copy"), request) == exchange(broker.port("copying"), request)


def test_region_length_is_the_cut_of_whole_batches(tmp_path):
    data = b"".join(batch(i, 1 + i % 4, 300 + 50 * i) for i in range(12))
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for budget in range(0, len(data) + 1, 97):
            expected = whole_batches_length(lambda pos, n: data[pos:pos + n], budget, budget)
            region, _ = FileRegion.of_whole_batches(fd, 0, budget)
            assert len(region) == expected
            if expected:
                assert region.read() == data[:expected]
                assert [h.base_offset for h in region.headers()] == \
                    [h.base_offset for h in iter_headers(data[:expected])]
                region.close()
    finally:
        os.close(fd)


def test_a_region_stays_readable_after_its_segment_is_deleted(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(batch(0, 3, 1000))
    fd = os.open(path, os.O_RDONLY)
    region, _ = FileRegion.of_whole_batches(fd, 0, 1 << 20)
    os.close(fd)
    path.unlink()
    assert region.read() == batch(0, 3, 1000)
    region.close()
    region.close()   # idempotent
    assert region.fd == -1


BIG_SEGMENT = 16 * 1024 * 1024


@pytest.fixture
def big_broker(tmp_path, new_loop):
    """One partition of two 16 MiB segments of 100 KB batches."""
    b = Broker(tmp_path / "logs", new_loop, partitions=1, segment_bytes=BIG_SEGMENT)
    for offset in range(2 * BIG_SEGMENT // 100_000):
        b.append(0, batch(offset, 1, 100_000))
    yield b
    b.close()


def slow_reader(port: int, request) -> socket.socket:
    """A connection with a 4 KiB receive buffer that has sent ``request`` and read nothing,
    once the listener holds part of the response pending behind the full socket."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(DEADLINE_S)
    sock.connect(("127.0.0.1", port))
    sock.sendall(framed(client_frame(request, 7)))
    return sock


def wait_pending(server: KafkaServer) -> None:
    eventually(lambda: any(c._pending for c in list(server._connections)),
               "the response waiting on the reader", DEADLINE_S)


def test_a_segment_deleted_by_retention_while_being_sent_arrives_whole(big_broker):
    b = big_broker
    ulog = b.logs.get_log(TopicPartition(TOPIC, 0))
    first = ulog.local_log.segments[0]
    request = fetch_request(12, [(0, 0, BIG_SEGMENT)], BIG_SEGMENT)
    expected = exchange(b.port("copying"), request)
    assert len(expected) > BIG_SEGMENT - 200_000
    with slow_reader(b.port("zero_copy"), request) as sock:
        got = recv_exact(sock, 4096)
        wait_pending(b.servers["zero_copy"])
        ulog.maybe_increment_log_start_offset(ulog.local_log.segments[1].base_offset, "test")
        assert ulog.delete_old_segments() == 1
        assert not first.log_path.exists()
        assert not first.log_path.with_name(first.log_path.name + ".deleted").exists()
        got += recv_exact(sock, len(expected) - len(got))
    assert got == expected


def test_regions_of_a_lost_connection_are_released(big_broker):
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    request = fetch_request(12, [(0, 0, BIG_SEGMENT)], BIG_SEGMENT)
    server = big_broker.servers["zero_copy"]
    for _ in range(3):
        with slow_reader(big_broker.port("zero_copy"), request):
            wait_pending(server)
    eventually(lambda: not server.connection_count and fds() <= before,
               "the connections and their descriptors released", DEADLINE_S)


def test_a_parked_long_poll_holds_no_segment_descriptors(broker):
    broker.append(2, batch(0, 1, 5000))
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    server = broker.servers["zero_copy"]
    request = fetch_request(12, [(2, 0, 1 << 20)], 1 << 20)
    request = dataclasses.replace(request, min_bytes=1 << 20, max_wait=datetime.timedelta(seconds=5))
    with socket.create_connection(("127.0.0.1", broker.port("zero_copy")), timeout=DEADLINE_S) as sock:
        eventually(lambda: server.connection_count, "the connection accepted", DEADLINE_S)
        before = fds()
        sock.sendall(framed(client_frame(request, 7)))
        eventually(lambda: server.requests_in_flight,   # parked: fewer bytes than min_bytes
                   "the fetch parked (not answered at once)", DEADLINE_S, interval=0.001)
        eventually(lambda: fds() <= before or not server.requests_in_flight,
                   "the descriptors released or the long poll ended", DEADLINE_S, interval=0.001)
        assert server.requests_in_flight == 1, "descriptors were held until the long poll ended"
        head = recv_exact(sock, 4)
        frame = head + recv_exact(sock, struct.unpack(">i", head)[0])
    assert frame == exchange(broker.port("copying"), request)


def test_a_region_walks_only_past_the_last_indexed_batch_and_cuts_as_the_copy_does(tmp_path):
    """With sparse index entries every few batches, a region's length (walked from the last
    indexed batch start in range) equals the copying path's whole-batch cut, for every budget."""
    from strata.common.clock import SYSTEM_CLOCK
    from strata.log.segment import LogSegment
    seg = LogSegment(tmp_path, 0, index_interval_bytes=700, max_index_size=1 << 16,
                     roll_jitter_ms=0, clock=SYSTEM_CLOCK)
    offset = 0
    for i in range(40):
        data = build_batch([SimpleRecord(b"v" * (50 + 37 * i), b"k", timestamp=1_700_000_000_000)]
                           * (1 + i % 3), base_offset=offset)
        headers = list(iter_headers(data))
        seg.append(headers[-1].last_offset, 1_700_000_000_000, headers[-1].last_offset, data,
                   headers)
        offset = headers[-1].next_offset
    assert seg.offset_index.entries > 5
    try:
        for start in (0, 7, 30):
            for budget in range(1, seg.size + 1, 53):
                copied = seg.read(start, budget, min_one_message=False)
                region = seg.read(start, budget, min_one_message=False, as_region=True)
                assert len(region.data) == len(copied.data), (start, budget)
                if copied.data:
                    assert region.data.read() == copied.data
                    region.data.close()
    finally:
        seg.close()
