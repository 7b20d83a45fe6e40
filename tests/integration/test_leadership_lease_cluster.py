"""A partition leader cut from ZooKeeper alone (issue 51) stops acknowledging acks=all as soon
as its session is in doubt, and acknowledges again once the same session is back.

Two broker processes and a real ZooKeeper; each broker reaches ZooKeeper through a TCP relay
the test owns (tests/tcp_relay.py), so cutting the leader's relay cuts that one link while the
leader still serves clients and its follower. kazoo reports the connection suspended within
about 2/3 of the session timeout, and ZooKeeper expires the session only after the whole
timeout: the test sends its produce in between, checks it is not answered while the follower
already holds the record, and heals the link before the session can expire.
"""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka.admin import NewTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.schema.types import TopicName
from kio.static.primitive import i32

from cluster_clients import NO_TIERING, admin, log_end, partitions, wait_for
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode
from strata.net.connection import Connection, list_offset
from strata.protocol import records as rec
from tcp_relay import TcpRelay
from zk_server import zookeeper_available

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

SESSION_MS = 12_000   # ZooKeeper allows up to 20 ticks: 1 s ticks below
IN_DOUBT = "ZooKeeper session in doubt"
HELD = "ZooKeeper session held (connected)"
TOPIC = "lease"
LEADER, FOLLOWER = 1, 2


@pytest.fixture
def cluster(tmp_path):
    c = StrataCluster(tmp_path, brokers=2, zk_tick_ms=1000, overrides={
        "zookeeper.session.timeout.ms": str(SESSION_MS), **NO_TIERING,
        "offsets.topic.num.partitions": "1", "replica.fetch.wait.max.ms": "200",
        "replica.lag.time.max.ms": "30000"})
    relays = {}
    for b in c.brokers:
        relays[b.node_id] = TcpRelay(("127.0.0.1", c.zk.port)).start()
        b.process.overrides["zookeeper.connect"] = f"127.0.0.1:{relays[b.node_id].port}{c.chroot}"
    c.relays = relays
    try:
        with c:
            yield c
    finally:
        for relay in relays.values():
            relay.close()


def produce(bootstrap: str, value: bytes, timeout_s: float = 30) -> tuple[int, int]:
    """One acks=all record in one Produce request: (error code, base offset)."""
    batch = rec.build_batch([rec.SimpleRecord(value, b"k")])
    with Connection(bootstrap, timeout=timeout_s + 10) as conn:
        resp = conn.request(ProduceRequest(
            transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=timeout_s),
            topic_data=(TopicProduceData(name=TopicName(TOPIC), partition_data=(
                PartitionProduceData(index=i32(0), records=batch),)),)), ProduceResponse)
    p = resp.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def high_watermark(broker) -> int:
    error, offset, _ = list_offset(broker.bootstrap, TOPIC, 0, -1)
    assert error == ErrorCode.NONE
    return offset


def test_acks_all_waits_while_the_leaders_session_is_in_doubt_and_completes_when_it_is_back(
        cluster):
    admin(cluster.bootstrap).create_topics([NewTopic(
        TOPIC, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER]],
        config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    wait_for("the leader and a full ISR", lambda: (
        p := partitions(cluster.broker(LEADER).bootstrap, TOPIC, timeout=2).get(0)) is not None
        and p.leader == LEADER and sorted(p.isr) == [LEADER, FOLLOWER])
    leader = cluster.broker(LEADER)
    # its own view may name it leader a moment before it takes over (NOT_LEADER_OR_FOLLOWER)
    wait_for("the leader accepting a record", lambda: produce(leader.bootstrap, b"before")
             == (ErrorCode.NONE, 0))

    held_before = leader.output().count(HELD)
    cluster.relays[LEADER].cut()
    wait_for("the leader's session in doubt", lambda: IN_DOUBT in leader.output(),
             timeout=SESSION_MS / 1000)
    in_doubt_at = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(produce, leader.bootstrap, b"in doubt")
        # the follower holds the record: a leader not held back would acknowledge it now
        wait_for("the follower to fetch the record",
                 lambda: log_end(cluster.broker(FOLLOWER), TOPIC) == 2, timeout=3)
        time.sleep(1.0)   # five of the follower's fetches: the HW would have moved by now
        assert not pending.done(), pending.result()
        assert high_watermark(leader) == 1
        # kazoo suspends 1/3 of the session timeout before ZooKeeper may expire the session
        assert time.monotonic() - in_doubt_at < SESSION_MS / 3000 - 1, \
            "too late to heal before the session may expire"
        cluster.relays[LEADER].heal()
        assert pending.result(timeout=SESSION_MS / 1000) == (ErrorCode.NONE, 1)
    assert high_watermark(leader) == 2
    assert "ZooKeeper session expired" not in leader.output()
    assert leader.output().count(HELD) == held_before + 1


def test_a_leader_whose_session_expired_never_acknowledges_and_comes_back_as_a_follower(
        cluster):
    """The cut outlasts the session: the controller moves leadership to the follower. A
    produce sent meanwhile to the old leader, which still believes it leads, is never
    acknowledged; after healing, the old leader's lease is held only on its new session, once
    it has re-registered, and it follows the new leader's log."""
    admin(cluster.bootstrap).create_topics([NewTopic(
        TOPIC, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER]],
        config={"min.insync.replicas": "1"})])[TOPIC].result(30)
    wait_for("the leader and a full ISR", lambda: (
        p := partitions(cluster.broker(LEADER).bootstrap, TOPIC, timeout=2).get(0)) is not None
        and p.leader == LEADER and sorted(p.isr) == [LEADER, FOLLOWER])
    old, new = cluster.broker(LEADER), cluster.broker(FOLLOWER)
    assert produce(old.bootstrap, b"before") == (ErrorCode.NONE, 0)

    cluster.relays[LEADER].cut()
    wait_for("the follower elected", lambda: partitions(new.bootstrap, TOPIC, timeout=2)[0].leader
             == FOLLOWER, timeout=3 * SESSION_MS / 1000)
    assert partitions(old.bootstrap, TOPIC, timeout=2)[0].leader == LEADER   # it cannot know
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(produce, old.bootstrap, b"cut off")
        assert produce(new.bootstrap, b"elsewhere") == (ErrorCode.NONE, 1)
        cluster.relays[LEADER].heal()
        assert pending.result(timeout=SESSION_MS / 1000)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    wait_for("the old leader's lease held on its new session",
             lambda: "ZooKeeper session held (new session initialised)" in old.output())
    wait_for("the old leader back in the ISR", lambda: sorted(
        partitions(new.bootstrap, TOPIC, timeout=2)[0].isr) == [LEADER, FOLLOWER])
    wait_for("the old leader holding the new leader's log", lambda: log_end(old, TOPIC) == 2)
