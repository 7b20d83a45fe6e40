"""KIP-405 across replicas, on broker processes with a real ZooKeeper and a shared remote tier:
only the leader tiers; a follower whose disk was wiped rebuilds from the remote tier
(OFFSET_MOVED_TO_TIERED_STORAGE) and copies only the leader's local tail; it then leads and
serves every record from offset 0 across both tiers, and once the old leader is back (the
metadata topic wants two in-sync replicas, as Kafka 4.3's) tiers what comes next from where the
old leader stopped, with no gap and no lost record."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from zk_server import zookeeper_available

from confluent_kafka import Producer
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from cluster_clients import admin, consume_all, dump_threads, log_end, partitions, wait_for
from cluster_process import StrataCluster
from strata.net.connection import list_offset
from strata.protocol.client import EARLIEST_LOCAL, LATEST_TIERED
from tiered_support import TIERED_BROKER

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096",
                "min.insync.replicas": "1"}
OVERRIDES = {
    **TIERED_BROKER,
    "log.remote.storage.enable": "false",          # only the topics that ask are tiered
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "2",
    "offsets.topic.num.partitions": "3",
    "remote.log.metadata.topic.replication.factor": "2",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "2",
}


@pytest.fixture
def cluster(tmp_path):
    with StrataCluster(tmp_path, brokers=2, overrides=OVERRIDES) as c:
        yield c


def produce(bootstrap: str, topic: str, keys: list[bytes]) -> list[bytes]:
    """Idempotent acks=all, in small batches (so segments of 16 KiB roll); the keys acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 1, "batch.num.messages": 20, "message.timeout.ms": 60000})
    acked = []
    for k in keys:
        producer.produce(topic, key=k, value=k * 8, partition=0,
                         on_delivery=lambda err, msg: err is None and acked.append(msg.key()))
        producer.poll(0)
    producer.flush(90)
    return acked


def guarded_at_zookeeper(cluster, broker: int) -> dict:
    """Broker ``broker``'s report of its tier-bootstrapped replicas (KIP-1303), as stored."""
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=10)
    try:
        data, _ = zk.get(f"/strata/tier_bootstrapped/{broker}")
        return json.loads(data)["partitions"]
    except NoNodeError:
        return {}
    finally:
        zk.stop()
        zk.close()


def keys(start: int, n: int) -> list[bytes]:
    return [b"k%06d" % i for i in range(start, start + n)]


def leader_of(cluster, topic: str) -> int:
    return partitions(",".join(b.bootstrap for b in cluster.brokers if b.running), topic)[0].leader


def local_segment_bases(broker, topic: str) -> list[int]:
    d = Path(broker.data_dir) / "kafka-logs" / f"{topic}-0"
    return sorted(int(p.stem) for p in d.glob("*.log"))


def test_a_wiped_follower_copies_only_the_local_tail_then_leads_and_serves_everything(cluster):
    topic = "tiered"
    admin(cluster.bootstrap).create_topics(
        [NewTopic(topic, 1, 2, config=TIERED_TOPIC)])[topic].result(30)
    wait_for("a leader", lambda: leader_of(cluster, topic) >= 0)
    first = keys(0, 3000)
    assert produce(cluster.bootstrap, topic, first) == first
    leader = cluster.broker(leader_of(cluster, topic))
    follower = next(b for b in cluster.brokers if b.node_id != leader.node_id)
    # the leader tiers and its local retention keeps only what is not in the remote tier
    wait_for("the leader tiered most of the log", lambda: list_offset(
        leader.bootstrap, topic, 0, LATEST_TIERED)[1] >= 2000, timeout=60)
    wait_for("the leader's local log shrank", lambda: list_offset(
        leader.bootstrap, topic, 0, EARLIEST_LOCAL)[1] >= 2000, timeout=60)

    follower.kill()
    # until its ZooKeeper session expires the ISR still names the dead follower: waiting for
    # the shrink first, the rejoin below cannot be the stale ISR (killing the leader between
    # that shrink and the rejoin would leave no in-sync replica to elect)
    wait_for("the killed follower out of the ISR", lambda: partitions(
        leader.bootstrap, topic)[0].isr == [leader.node_id])
    shutil.rmtree(Path(follower.data_dir) / "kafka-logs")   # a replaced disk, the same broker id
    follower.start()
    wait_for("the wiped follower caught up", lambda: log_end(follower, topic) == 3000, timeout=90)
    wait_for("the wiped follower back in the ISR", lambda: sorted(
        partitions(leader.bootstrap, topic)[0].isr) == sorted(cluster.node_ids), timeout=90)
    bases = local_segment_bases(follower, topic)
    # only the local tail came over the wire: nothing below the leader's local log start
    assert bases and bases[0] >= 2000, bases
    assert log_end(follower, topic) == log_end(leader, topic) == 3000
    assert "rebuilt from remote segment" in follower.output()
    # tiering ran only on the leader
    assert "copied tiered-0" not in follower.output()

    leader.kill()
    wait_for("the follower leads", lambda: leader_of(cluster, topic) == follower.node_id)
    got = consume_all(follower.bootstrap, topic, 3000, timeout=90)
    assert got == first                                     # every record, in order, from 0

    # the old leader returns as a follower (the metadata topic's min.insync.replicas is 2, so
    # tiering waits for it); the new leader tiers what comes next from where the old one
    # stopped: no gap, no loss
    leader.start()
    more = keys(3000, 2000)
    assert produce(follower.bootstrap, topic, more) == more
    try:
        wait_for("the new leader tiers", lambda: list_offset(
            follower.bootstrap, topic, 0, LATEST_TIERED)[1] >= 4000, timeout=60)
    except AssertionError:
        dump_threads(cluster)
        raise
    wait_for("its local log shrank", lambda: list_offset(
        follower.bootstrap, topic, 0, EARLIEST_LOCAL)[1] > 3000, timeout=60)
    assert consume_all(follower.bootstrap, topic, 5000, timeout=90) == first + more

    # deleting the topic removes its remote data once, by the leader of its metadata partition
    admin(cluster.bootstrap).delete_topics([topic])[topic].result(30)
    remote = Path(cluster.remote_dir)
    wait_for("the topic's remote objects deleted", lambda: not [
        p for p in remote.rglob("*") if p.is_file() and p.parts[len(remote.parts)].startswith(topic)],
        timeout=60)
    removers = wait_for("the remover's last record", lambda: [
        b.node_id for b in cluster.brokers if "remote partition deleted" in b.output()])
    assert len(removers) == 1, removers


@pytest.mark.parametrize("last_tiered", [False, True], ids=["elo", "kip1023"])
def test_a_wiped_follower_starts_at_the_leaders_local_start_or_with_kip_1023_after_the_tiered_offset(
        tmp_path, last_tiered):
    """The leader keeps a few tiered segments locally: a wiped follower rebuilds at the
    leader's earliest local offset (KIP-405), or with follower.fetch.last.tiered.offset.enable
    at the leader's earliest pending upload (KIP-1023), copying only what is not tiered."""
    topic = "kip1023"
    overrides = {**OVERRIDES,
                 "follower.fetch.last.tiered.offset.enable": str(last_tiered).lower()}
    with StrataCluster(tmp_path, brokers=2, overrides=overrides) as cluster:
        admin(cluster.bootstrap).create_topics([NewTopic(topic, 1, 2, config={
            **TIERED_TOPIC, "local.retention.bytes": str(4 * SEGMENT)})])[topic].result(30)
        wait_for("a leader", lambda: leader_of(cluster, topic) >= 0)
        records = keys(0, 3000)
        assert produce(cluster.bootstrap, topic, records) == records
        leader = cluster.broker(leader_of(cluster, topic))
        follower = next(b for b in cluster.brokers if b.node_id != leader.node_id)

        def settled():
            """(local start, tiered) once every inactive segment is tiered and local retention
            is done: deleting the first local segment would take the log under its
            local.retention.bytes (the rule UnifiedLog applies)."""
            d = Path(leader.data_dir) / "kafka-logs" / f"{topic}-0"
            sizes = sorted((int(p.stem), p.stat().st_size) for p in d.glob("*.log"))
            tiered = list_offset(leader.bootstrap, topic, 0, LATEST_TIERED)[1]
            local = list_offset(leader.bootstrap, topic, 0, EARLIEST_LOCAL)[1]
            done = len(sizes) > 1 and tiered == sizes[-1][0] - 1 and local == sizes[0][0] > 0 \
                and sum(size for _, size in sizes) - sizes[0][1] < 4 * SEGMENT
            return done and (local, tiered)
        local_start, tiered = wait_for("the leader tiered and trimmed", settled, timeout=60)
        assert local_start < tiered     # the leader keeps tiered segments locally
        follower.kill()
        shutil.rmtree(Path(follower.data_dir) / "kafka-logs")
        follower.start()
        wait_for("the wiped follower caught up", lambda: log_end(follower, topic) == 3000,
                 timeout=90)
        rebuilt = re.search(rf"{topic}-0: rebuilt from remote segment \S+ \[\d+, (\d+)\]",
                            follower.output())
        assert rebuilt is not None
        started = int(rebuilt.group(1)) + 1
        assert started == (tiered + 1 if last_tiered else local_start)
        assert local_segment_bases(follower, topic)[0] >= started


def test_a_replica_rebuilt_from_the_tier_is_not_elected_while_one_with_more_local_log_can_lead(
        tmp_path):
    """KIP-1303's guard: replicas 1, 2, 3 (so 2 comes first after the leader); 2's disk is
    wiped and it rebuilds from the remote tier. When the leader dies, 3 leads, not 2, whose
    local log holds only the tail; with 3 gone too, 2 leads (nobody else can)."""
    overrides = {**OVERRIDES, "leader.election.eligible.local.log.ms": "600000",
                 "leader.election.eligible.local.log.bytes": "1073741824"}
    with StrataCluster(tmp_path, brokers=3, overrides=overrides) as cluster:
        topic = "guarded"
        client = admin(cluster.bootstrap)
        client.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2, 3]],
                                       config=TIERED_TOPIC)])[topic].result(30)
        wait_for("1 leads", lambda: leader_of(cluster, topic) == 1)
        first = keys(0, 3000)
        assert produce(cluster.bootstrap, topic, first) == first
        one, two, three = cluster.brokers
        wait_for("the leader's local log shrank", lambda: list_offset(
            one.bootstrap, topic, 0, EARLIEST_LOCAL)[1] >= 2000, timeout=60)
        two.kill()
        wait_for("2 out of the ISR", lambda: 2 not in partitions(one.bootstrap, topic)[0].isr)
        shutil.rmtree(Path(two.data_dir) / "kafka-logs")
        two.start()
        wait_for("2 rebuilt and back in the ISR", lambda: sorted(
            partitions(one.bootstrap, topic)[0].isr) == [1, 2, 3], timeout=90)
        assert "started at the tiered offset" in two.output()
        wait_for("2 reported as tier-bootstrapped", lambda: guarded_at_zookeeper(cluster, 2) == {
            topic: [0]})
        one.kill()
        wait_for("3 leads, not the rebuilt 2", lambda: leader_of(cluster, topic) == 3)
        assert consume_all(three.bootstrap, topic, 3000, timeout=90) == first
        three.kill()
        wait_for("2 leads once nobody else can", lambda: leader_of(cluster, topic) == 2)
        assert consume_all(two.bootstrap, topic, 3000, timeout=90) == first
