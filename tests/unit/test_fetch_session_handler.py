"""Fetch sessions (KIP-227) served by the real Fetch handler over a real listener: full fetches
open sessions, incremental ones read the whole session and answer only partitions with news,
long polls and zero-copy (sendfile) records work inside a session, and session errors are
Kafka's."""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
import time
from pathlib import Path

import pytest

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.log.unified_log import FetchIsolation
from strata.net.connection import Connection
from strata.protocol.codec import ApiKey, make, request_class, response_class
from strata.protocol.records import SimpleRecord, build_batch, iter_headers
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.fetch_session import FetchSessionCache
from strata.server.handlers import fetch
from strata.server.network import KafkaServer
from strata.server.purgatory import PartitionWatchers
from support.replicas import lead_alone
from support.metadata_stand_in import no_metadata

TOPIC = "t"
P0, P1, P2 = (TopicPartition(TOPIC, i) for i in range(3))
DEADLINE_S = 20


class Broker:
    """Logs of a 3-partition topic served by the Fetch handler with a session cache."""

    def __init__(self, path: Path, slots: int = 1000, sendfile: bool = True):
        self.logs = LogManager([path], LogConfig({"retention.ms": -1}))
        self.logs.startup()
        self.loop = asyncio.new_event_loop()
        watchers = PartitionWatchers()
        self.rm = ReplicaManager(
            self.logs, lambda topic: 3 if topic == TOPIC else None,
            on_append=lambda tp: self.loop.call_soon_threadsafe(watchers.notify, tp))
        lead_alone(self.rm, *(TopicPartition(TOPIC, p) for p in range(3)))
        self.cache = FetchSessionCache(slots)
        self.ctx = BrokerContext(node_id=1, advertised_host="127.0.0.1", advertised_port=0,
                                 metadata=no_metadata(), replica_manager=self.rm, fetch_watchers=watchers,
                                 fetch_sessions=self.cache)
        self.requests: list = []

        async def serve(request, info):
            self.requests.append(request.body)
            return await fetch.handle(self.ctx, request)
        self.server = KafkaServer(serve, "127.0.0.1", 0, sendfile=sendfile)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)

    def connect(self) -> Connection:
        return Connection(f"127.0.0.1:{self.server.port}", timeout=DEADLINE_S)

    def append(self, tp: TopicPartition, n: int = 1, size: int = 100) -> None:
        start = self.rm.get_log(tp).log_end_offset
        data = build_batch([SimpleRecord(b"v" * size, b"k%d" % (start + i),
                                         timestamp=1_700_000_000_000) for i in range(n)])
        assert self.rm.append(tp, data, produce_version=9).error == ErrorCode.NONE

    def log_bytes(self, tp: TopicPartition, offset: int) -> bytes:
        return bytes(self.rm.get_log(tp).read(offset, 1 << 30, FetchIsolation.LOG_END).records)

    def close(self) -> None:
        self.call(self.server.stop(grace_s=1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.logs.shutdown()


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "logs")
    yield b
    b.close()


def request(version: int = 12, *, session: tuple[int, int] = (0, 0), parts=(), forget=(),
            max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 1 << 20,
            replica_id: int = -1):
    """``parts``: (partition, fetch offset); ``forget``: partitions."""
    cls = request_class(ApiKey.FETCH, version)
    topics = (make(cls, "topics", topic=TOPIC, partitions=tuple(
        make(cls, "topics.partitions", partition=p, fetch_offset=offset,
             partition_max_bytes=1 << 20, current_leader_epoch=-1, log_start_offset=-1,
             last_fetched_epoch=-1)
        for p, offset in parts)),) if parts else ()
    forgotten = (make(cls, "forgotten_topics_data", topic=TOPIC, partitions=tuple(forget)),) \
        if forget else ()
    return make(cls, replica_id=replica_id, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
                session_id=session[0], session_epoch=session[1], topics=topics,
                forgotten_topics_data=forgotten, rack_id="")


def send(conn: Connection, req):
    return conn.request(req, response_class(ApiKey.FETCH, req.__version__))


def answered(resp) -> dict[int, tuple]:
    """partition -> (error, high watermark, log start offset, records bytes)."""
    out = {}
    for t in resp.responses:
        assert t.topic == TOPIC
        for p in t.partitions:
            code = getattr(p.error_code, "value", p.error_code)
            out[p.partition_index] = (code, p.high_watermark, p.log_start_offset,
                                      bytes(p.records or b""))
    return out


def code(resp) -> int:
    return int(getattr(resp.error_code, "value", resp.error_code))


def fill(broker: Broker) -> None:
    broker.append(P0, 2)
    broker.append(P0, 1)
    broker.append(P2, 3)
    assert broker.rm.get_log(P1).log_end_offset == 0   # made empty on first use


def open_session(broker: Broker, conn: Connection, offsets=((0, 0), (1, 0), (2, 0))) -> int:
    resp = send(conn, request(parts=offsets))
    assert code(resp) == 0 and resp.session_id != 0
    assert set(answered(resp)) == {p for p, _ in offsets}
    return resp.session_id


# ---- the protocol -----------------------------------------------------------------------------


def test_a_session_answers_only_partitions_with_news(broker):
    fill(broker)
    with broker.connect() as conn:
        resp = send(conn, request(parts=[(0, 0), (1, 0), (2, 0)]))
        sid = resp.session_id
        assert code(resp) == 0 and sid > 0 and broker.cache.size == 1
        got = answered(resp)
        assert got[0] == (0, 3, 0, broker.log_bytes(P0, 0))
        assert got[1][:3] == (0, 0, 0) and got[1][3] == b""
        assert got[2] == (0, 3, 0, broker.log_bytes(P2, 0))

        # the client moves its offsets: sent again; nothing new: nothing answered
        resp = send(conn, request(session=(sid, 1), parts=[(0, 3), (2, 3)], max_wait_ms=50))
        assert (code(resp), resp.session_id, answered(resp)) == (0, sid, {})
        # P1 was not sent: the session still reads it (at offset 0), and answers it with news
        broker.append(P1, 2)
        resp = send(conn, request(session=(sid, 2)))
        assert answered(resp) == {1: (0, 2, 0, broker.log_bytes(P1, 0))}
        # the same offset again, no client change: the records again (the client did not move)
        resp = send(conn, request(session=(sid, 3)))
        assert set(answered(resp)) == {1}
        resp = send(conn, request(session=(sid, 4), parts=[(1, 2)], max_wait_ms=50))
        assert answered(resp) == {}
        # a log start offset change (DeleteRecords) is news without records
        broker.rm.delete_records(P0, 1)
        resp = send(conn, request(session=(sid, 5), max_wait_ms=50))
        assert answered(resp) == {0: (0, 3, 1, b"")}
    assert [len(r.topics) for r in broker.requests] == [1, 1, 0, 0, 1, 0]


def test_session_errors_are_kafkas_and_change_nothing(broker):
    fill(broker)
    with broker.connect() as conn:
        sid = open_session(broker, conn, ((0, 0), (1, 0), (2, 3)))
        for session, error in (((sid, 2), ErrorCode.INVALID_FETCH_SESSION_EPOCH),
                               ((sid + 1, 1), ErrorCode.FETCH_SESSION_ID_NOT_FOUND)):
            resp = send(conn, request(session=session, parts=[(0, 0)]))
            assert (code(resp), resp.session_id, resp.responses) == (error, 0, ())
        # epoch 1 still works, and the offsets sent with the refused requests were not taken
        broker.append(P0, 1)
        resp = send(conn, request(session=(sid, 1)))
        assert answered(resp) == {0: (0, 4, 0, broker.log_bytes(P0, 0))}


def test_forgotten_partitions_are_no_longer_read_and_can_come_back(broker):
    fill(broker)
    with broker.connect() as conn:
        sid = open_session(broker, conn, ((0, 3), (1, 0), (2, 3)))
        resp = send(conn, request(session=(sid, 1), forget=[0], max_wait_ms=50))
        assert answered(resp) == {}
        broker.append(P0, 1)
        resp = send(conn, request(session=(sid, 2), max_wait_ms=50))
        assert answered(resp) == {}      # P0 has news, but is not in the session
        resp = send(conn, request(session=(sid, 3), parts=[(0, 3)]))
        assert answered(resp) == {0: (0, 4, 0, broker.log_bytes(P0, 3))}
        # forgetting every partition closes the session: answered sessionless
        resp = send(conn, request(session=(sid, 4), forget=[0, 1, 2]))
        assert (code(resp), resp.session_id, answered(resp)) == (0, 0, {})
        assert broker.cache.size == 0
        resp = send(conn, request(session=(sid, 5)))
        assert code(resp) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_a_long_poll_in_a_session_wakes_on_a_partition_of_the_session(broker):
    fill(broker)
    with broker.connect() as conn:
        sid = open_session(broker, conn, ((0, 3), (1, 0), (2, 3)))
        threading.Timer(0.3, broker.append, (P1,)).start()
        start = time.monotonic()
        # P1 is not named: the session's offset for it (0) is what the long poll watches
        resp = send(conn, request(session=(sid, 1), max_wait_ms=10_000))
        assert time.monotonic() - start < 5
        assert answered(resp) == {1: (0, 1, 0, broker.log_bytes(P1, 0))}


def test_full_and_sessionless_fetches_name_every_partition(broker):
    fill(broker)
    with broker.connect() as conn:
        resp = send(conn, request(session=(0, -1), parts=[(0, 3), (1, 0), (2, 3)]))
        assert resp.session_id == 0 and set(answered(resp)) == {0, 1, 2}
        assert broker.cache.size == 0
        # before v7 no session fields: sessionless
        resp = send(conn, request(6, parts=[(0, 3), (2, 0)]))
        assert set(answered(resp)) == {0, 2} and broker.cache.size == 0
        # a full fetch naming a session closes it and opens another
        sid = open_session(broker, conn)
        resp = send(conn, request(session=(sid, 0), parts=[(0, 3)]))
        assert resp.session_id not in (0, sid) and set(answered(resp)) == {0}
        assert broker.cache.size == 1 and broker.cache.get(sid) is None


@pytest.mark.parametrize("version", [7, 9, 11, 12])
def test_every_session_version(broker, version):
    fill(broker)
    with broker.connect() as conn:
        resp = send(conn, request(version, parts=[(0, 0), (2, 3)]))
        sid = resp.session_id
        assert sid > 0 and set(answered(resp)) == {0, 2}
        broker.append(P2, 1)
        resp = send(conn, request(version, session=(sid, 1), parts=[(0, 3)]))
        assert answered(resp) == {2: (0, 4, 0, broker.log_bytes(P2, 3))}


def test_a_full_cache_answers_full_fetches_sessionless(tmp_path):
    b = Broker(tmp_path / "logs", slots=1)
    try:
        fill(b)
        with b.connect() as one, b.connect() as two:
            first = open_session(b, one)
            resp = send(two, request(parts=[(0, 0)]))
            assert resp.session_id == 0 and set(answered(resp)) == {0}
            assert b.cache.get(first) is not None
    finally:
        b.close()


def test_records_of_a_session_go_out_with_sendfile(broker, monkeypatch):
    import strata.server.network as network
    calls = []
    real = os.sendfile

    def counting(out_fd, in_fd, offset, count):
        calls.append(count)
        return real(out_fd, in_fd, offset, count)
    monkeypatch.setattr(network.os, "sendfile", counting)
    fill(broker)
    with broker.connect() as conn:
        sid = open_session(broker, conn, ((0, 3), (1, 0), (2, 3)))
        calls.clear()
        broker.append(P2, 4, size=3000)
        resp = send(conn, request(session=(sid, 1)))
        got = answered(resp)
        assert set(got) == {2} and got[2][3] == broker.log_bytes(P2, 3)
        assert calls and sum(calls) >= len(got[2][3])
        assert [h.base_offset for h in iter_headers(got[2][3])] == [3]
