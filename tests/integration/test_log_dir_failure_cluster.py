"""A failed log directory moves leadership away (issue 51), with three ``strata serve``
processes, a real ZooKeeper, broker 3's log dir on a small tmpfs and unmodified clients.

- the follower's disk fills while acks=all records flow to an RF 3 / min ISR 2 topic: the
  follower reports its replica offline, the partition keeps taking acks=all writes with the
  other two, and once space is freed the follower rejoins the ISR within seconds;
- the disk of the broker that leads a partition and a ``__consumer_offsets`` partition fills:
  leadership of both moves within seconds, a consumer's synchronous commits keep succeeding,
  and once space returns the broker is back in the ISRs.
In both, every acknowledged record is read back. Skipped when tmpfs cannot be mounted here.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import NewTopic

from cluster_clients import NO_TIERING, admin, consume_all, partitions, wait_for
from cluster_process import StrataCluster
from strata.coordinator.offsets_records import partition_for
from zk_server import zookeeper_available

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _ok, reason=_why)]

FULL = 3          # the broker whose log dir is on the tmpfs
OFFSETS = "__consumer_offsets"
OVERRIDES = {
    **NO_TIERING,
    "zookeeper.session.timeout.ms": "6000",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "3",
    "group.initial.rebalance.delay.ms": "0",
    "replica.lag.time.max.ms": "10000",
    "strata.log.dir.probe.interval.ms": "300",
}
MOVE_S = 10       # leadership off a failed dir, and an offline follower out of the ISR
REJOIN_S = 20     # space freed to back in the ISR


@pytest.fixture
def small_disk(tmp_path) -> Path:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        print(f"skipping: cannot mount a tmpfs here: {mounted.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def cluster(tmp_path, small_disk):
    with StrataCluster(tmp_path / "cluster", brokers=3, overrides=OVERRIDES, broker_overrides={
            FULL: {"log.dirs": str(small_disk / "logs")}}) as c:
        yield c


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left."""
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 512):
            while True:
                try:
                    f.write(b"\xa5" * size)
                except OSError:
                    break


def value(i: int) -> bytes:
    return (f"value-{i:06d}-".encode() * 330)[:4200]


class AckedProducer:
    """acks=all, idempotent, producing ``topic``-0 in the background until stopped."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.acked: set[bytes] = set()
        self.failed: list[str] = []
        self.last_ack = time.monotonic()
        self._p = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                            "enable.idempotence": True, "linger.ms": 5,
                            "message.timeout.ms": 120_000, "retry.backoff.ms": 100,
                            "retry.backoff.max.ms": 300})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.add(msg.key())
            self.last_ack = time.monotonic()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self._p.produce(self.topic, key=b"k%06d" % i, value=value(i), partition=0,
                                on_delivery=self._delivered)
                i += 1
            except BufferError:
                pass
            self._p.poll(0.02)

    def start(self) -> "AckedProducer":
        self._thread.start()
        return self

    def acks_after(self, n: int, timeout: float) -> None:
        start = len(self.acked)
        wait_for(f"{n} more acks=all records acknowledged", lambda: len(self.acked) >= start + n,
                 timeout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self._p.flush(60) == 0
        assert not self.failed, self.failed[:3]


def isr(bootstrap: str, topic: str, p: int = 0) -> tuple[int, list[int]]:
    m = partitions(bootstrap, topic)[p]
    return m.leader, sorted(m.isr)


def healthy(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers if b.node_id != FULL)


def create(cluster, topic: str, replicas: list[int]) -> None:
    admin(healthy(cluster)).create_topics([NewTopic(
        topic, num_partitions=1, replica_assignment=[replicas], config={"min.insync.replicas": "2"})])[topic].result(30)
    wait_for("the topic's leader", lambda: isr(cluster.bootstrap, topic) == (replicas[0], [1, 2, 3]))


def all_read_back(cluster, topic: str, acked: set[bytes]) -> None:
    got = set(consume_all(healthy(cluster), topic, expect=len(acked), timeout=40))
    assert acked <= got, f"{len(acked - got)} acknowledged records missing"


def test_a_full_follower_disk_leaves_the_isr_and_rejoins_once_space_is_freed(cluster, small_disk):
    topic = "follower-fills"
    create(cluster, topic, [1, 2, FULL])
    producer = AckedProducer(healthy(cluster), topic).start()
    producer.acks_after(100, 30)
    filler = small_disk / "filler"
    fill(filler)
    filled = time.monotonic()
    wait_for("the full follower out of the ISR", lambda: isr(healthy(cluster), topic) == (1, [1, 2]),
             MOVE_S)
    producer.acks_after(300, 30)    # min ISR 2: the other two take acks=all writes
    assert time.monotonic() - filled < 40
    filler.unlink()
    freed = time.monotonic()
    wait_for("the follower back in the ISR", lambda: isr(healthy(cluster), topic) == (1, [1, 2, 3]),
             REJOIN_S)
    print(f"back in the ISR {time.monotonic() - freed:.1f} s after space was freed")
    producer.acks_after(50, 30)
    producer.stop()
    all_read_back(cluster, topic, producer.acked)
    out = cluster.broker(FULL).output()
    assert out.count("failed: its") == 1 and out.count("follow their leaders again") == 1


def test_a_full_leader_disk_moves_leadership_and_group_commits_keep_succeeding(cluster, small_disk):
    topic = "leader-fills"
    create(cluster, topic, [FULL, 1, 2])
    # __consumer_offsets is made at the first FindCoordinator; a group whose partition broker 3 leads
    warm = Consumer({"bootstrap.servers": healthy(cluster), "group.id": "warm-up"})
    warm.subscribe([topic])
    wait_for("__consumer_offsets", lambda: (warm.poll(0.2), len(partitions(healthy(cluster), OFFSETS)) == 3
                                            and all(m.leader >= 0 for m in partitions(healthy(cluster), OFFSETS).values()))[1], 30)
    warm.close()
    led = [p for p, m in partitions(healthy(cluster), OFFSETS).items() if m.leader == FULL]
    assert led, "the placement gives every broker one __consumer_offsets partition to lead"
    group = next(g for g in (f"group-{uuid.uuid4()}" for _ in range(1000))
                 if partition_for(g, 3) == led[0])
    producer = AckedProducer(healthy(cluster), topic).start()
    producer.acks_after(50, 30)
    consumer = Consumer({"bootstrap.servers": healthy(cluster), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    commits: list[float] = []        # when each synchronous commit succeeded
    refused: list[str] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            m = consumer.poll(0.1)
            if m is None or m.error() is not None:
                continue
            try:
                consumer.commit(message=m, asynchronous=False)
                commits.append(time.monotonic())
            except KafkaException as exc:
                refused.append(exc.args[0].name())
    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        wait_for("a first commit", lambda: commits, 30)
        fill(small_disk / "filler")
        filled = time.monotonic()
        wait_for("leadership off the full broker",
                 lambda: isr(healthy(cluster), topic)[0] in (1, 2)
                 and partitions(healthy(cluster), OFFSETS)[led[0]].leader in (1, 2), MOVE_S)
        moved = time.monotonic() - filled
        wait_for("commits after the fill", lambda: any(t > filled + moved for t in commits), 20)
        producer.acks_after(200, 30)
        gaps = [b - a for a, b in zip(commits, commits[1:])]
        print(f"leadership moved {moved:.1f} s after the fill; longest gap between commits "
              f"{max(gaps):.1f} s; refused commits: {sorted(set(refused))}")
        assert max(gaps) < 15
        (small_disk / "filler").unlink()
        wait_for("the broker back in the ISRs", lambda: isr(healthy(cluster), topic)[1] == [1, 2, 3]
                 and sorted(partitions(healthy(cluster), OFFSETS)[led[0]].isr) == [1, 2, 3], REJOIN_S)
    finally:
        stop.set()
        thread.join(10)
        consumer.close()
    producer.stop()
    all_read_back(cluster, topic, producer.acked)
