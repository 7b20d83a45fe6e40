"""A replica that lost its disk is not elected from a stale ISR (issue 51, scenario 2), on broker
processes and a real ZooKeeper, with a real acks=all producer.

The scenario: the follower's broker is SIGKILLed, its log directory wiped (a replaced disk) and
started again at once; the leader's broker, which is also the controller, is SIGKILLed right
after. No controller sees either change until the next one takes over, and by then the wiped
follower has registered again while still listed in the ISR. Before directory ids (KIP-858) and
unclean-shutdown detection, that controller elected the empty replica and the old leader, once
back, truncated its log to the empty one. Now the wiped replica leaves the ISR first: the
partition waits offline for the old leader (RF 2) or is led by the replica that kept its data
(RF 3), and every acknowledged record is read back once the old leader has returned.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from confluent_kafka import Producer
from kazoo.client import KazooClient
from confluent_kafka.admin import AdminClient, NewTopic
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, consume_all, log_end, produce, wait_for
from cluster_process import StrataCluster, elected_controller
from support.waiting import never

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

TOPIC = "replaced-disk"
OVERRIDES = {
    "zookeeper.session.timeout.ms": "4000",
    **NO_TIERING,
    "offsets.topic.num.partitions": "1",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
}


def leader_isr(broker) -> tuple[int, list[int]]:
    p = admin(broker.bootstrap).list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0]
    return p.leader, sorted(p.isrs)


def partition_state(cluster) -> tuple[int, list[int], int, int, list[int]]:
    """(leader, ISR, leader epoch, controller, ELR) of partition 0 as the controller last wrote
    it in ZooKeeper
    (a broker's Metadata answers leader -1 as soon as the leader's session is gone, before any
    controller has decided anything)."""
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=10)
    try:
        data, _ = zk.get(f"/brokers/topics/{TOPIC}/partitions/0/state")
        controller, _ = zk.get("/controller")
    finally:
        zk.stop()
        zk.close()
    state = json.loads(data)
    return state["leader"], sorted(state["isr"]), state["leader_epoch"], \
        json.loads(controller)["brokerid"], sorted(state.get("eligible_leader_replicas", ()))


class BackgroundProducer:
    """acks=all (idempotent) records, one key after another, until ``stop``; ``acked`` holds
    the keys the cluster acknowledged."""

    def __init__(self, bootstrap: str):
        self.acked: list[bytes] = []
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 20000})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked.append(msg.key())

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self._producer.produce(TOPIC, key=b"during-%d" % i, value=b"v", partition=0,
                                       on_delivery=self._report)
                i += 1
            except BufferError:
                pass
            self._producer.poll(0.002)

    def start(self) -> "BackgroundProducer":
        self._thread.start()
        return self

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)
        return self.acked


def assert_all_readable(broker, acked: list[bytes]) -> None:
    """Every acknowledged key is in the log, in the order acknowledged (the log may also hold
    records whose acknowledgement was lost: a timed-out send that was written)."""
    got = consume_all(broker.bootstrap, TOPIC, log_end(broker, TOPIC))
    position = {k: i for i, k in enumerate(got)}
    missing = [k for k in acked if k not in position]
    assert not missing, f"{len(missing)} acknowledged records lost, first {missing[:3]}"
    assert [position[k] for k in acked] == sorted(position[k] for k in acked)


def replace_the_followers_disk_then_kill_the_leader(tmp_path, brokers: int, min_isr: int):
    """Runs the scenario on ``brokers`` brokers with an RF ``brokers`` topic; asserts the
    wiped replica is not elected. Returns (cluster, old leader, wiped replica, keys acked
    before, the producer still running, (leader, ISR) as decided) with the old leader still
    down; the caller stops the cluster."""
    cluster = StrataCluster(tmp_path, brokers=brokers, overrides=OVERRIDES).start()
    try:
        controller = elected_controller(cluster.broker(1).bootstrap)
        leader = controller          # the leader is the controller: it dies unseen
        wiped, *others = [n for n in sorted(cluster.node_ids) if n != leader]
        # the wiped replica right after the leader: the first an election would look at
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        client.create_topics([NewTopic(
            TOPIC, num_partitions=1, replica_assignment=[[leader, wiped, *others]],
            config={"min.insync.replicas": str(min_isr)})])[TOPIC].result(30)
        wait_for("the topic led by the controller with a full ISR", lambda: leader_isr(
            cluster.broker(leader)) == (leader, sorted(cluster.node_ids)))
        leader_epoch_before = partition_state(cluster)[2]
        before = [b"before-%d" % i for i in range(20_000)]
        assert produce(cluster.bootstrap, TOPIC, before) == before
        background = BackgroundProducer(cluster.bootstrap).start()
        time.sleep(0.5)

        cluster.broker(wiped).kill()
        shutil.rmtree(cluster.broker(wiped).log_dir)
        cluster.broker(wiped).start()    # it registers once its old session has expired
        cluster.broker(leader).kill()

        # the next controller takes the dead leader's partition from it
        decided = wait_for("a new controller's decision", lambda: (
            (st := partition_state(cluster))[0] != leader and st[3] != leader and st))
        assert decided[2] > leader_epoch_before
        new_leader = (*decided[:2], decided[4])
        assert new_leader[0] != wiped, f"the wiped replica was elected: {new_leader}"
        never(lambda: (st := partition_state(cluster))[0] == wiped and st,   # and it stays so
              "the wiped replica elected", during=2, interval=0.2)
        return cluster, leader, wiped, before, background, new_leader
    except BaseException:
        cluster.stop()
        raise


def test_rf2_the_partition_waits_for_the_old_leader_instead_of_electing_the_wiped_replica(
        tmp_path):
    cluster, leader, wiped, before, background, state = \
        replace_the_followers_disk_then_kill_the_leader(tmp_path, brokers=2, min_isr=1)
    try:
        # offline: nobody with the data is alive; the old leader, last out of the ISR, is an
        # eligible leader replica (KIP-966)
        assert state == (-1, [], [leader])
        cluster.broker(leader).start()
        wait_for("the old leader leads again",
                 lambda: leader_isr(cluster.broker(wiped))[0] == leader)
        assert_all_readable(cluster.broker(leader), before + background.stop())
        # the wiped replica catches up and is taken back into the ISR by the leader
        wait_for("the wiped replica back in the ISR",
                 lambda: leader_isr(cluster.broker(leader)) == (leader, sorted([leader, wiped])))
    finally:
        cluster.stop()


def test_rf3_the_replica_that_kept_its_data_leads_and_nothing_acknowledged_is_lost(tmp_path):
    cluster, leader, wiped, before, background, state = \
        replace_the_followers_disk_then_kill_the_leader(tmp_path, brokers=3, min_isr=2)
    try:
        kept = next(n for n in cluster.node_ids if n not in (leader, wiped))
        assert state[0] == kept
        cluster.broker(leader).start()
        wait_for("the whole ISR back", lambda: leader_isr(cluster.broker(kept)) == (
            kept, sorted(cluster.node_ids)))
        assert_all_readable(cluster.broker(kept), before + background.stop())
    finally:
        cluster.stop()
