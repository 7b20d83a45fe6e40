"""ControllerService against a real ZooKeeper, each "broker" its own OS process
(tests/controller_node.py): election, topics from the admin path, failover after SIGKILL, and
a paused controller fenced by the controller epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from zk_server import ZooKeeperServer, zookeeper_available

from strata.cluster.controller import ControllerService
from strata.cluster.controller_events import AlterPartition, ElectLeaders, TopicCreated
from strata.cluster.image import BrokerRegistration, PartitionRegistration
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import StrataZkClient
from strata.cluster.zk.config import ZkClientConfig
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

SESSION_MS = 3000
DEADLINE_S = 30.0
FAILOVER_DEADLINE_S = SESSION_MS / 1000 + 30  # the session timeout, and room for a loaded machine
NODE_SCRIPT = Path(__file__).resolve().parents[1] / "controller_node.py"
BROKERS = (1, 2, 3)


class Lines:
    """Every JSON line of every node, in the order this process read them."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self._cond = threading.Condition()

    def add(self, line: dict) -> None:
        with self._cond:
            self.seen.append(line)
            self._cond.notify_all()

    def wait(self, predicate: Callable[[list[dict]], object], what: str,
             deadline_s: float = DEADLINE_S):
        end = time.monotonic() + deadline_s
        with self._cond:
            while not (value := predicate(self.seen)):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {deadline_s:g} s waiting for {what}; "
                                         f"lines: {self.seen}")
                self._cond.wait(left)
            return value

    def of(self, event: str, node: int | None = None) -> list[dict]:
        with self._cond:
            return [l for l in self.seen if l["event"] == event and node in (None, l["node"])]


class Node:
    """One controller_node.py process; its stdout lines go to ``lines`` tagged with ``node``."""

    def __init__(self, broker_id: int, connect: str, lines: Lines, log_dir: Path):
        self.broker_id = broker_id
        self._stderr = open(log_dir / f"node-{broker_id}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(NODE_SCRIPT), "--connect", connect, "--broker-id", str(broker_id),
             "--session-ms", str(SESSION_MS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._reader.start()

    def _read(self, lines: Lines) -> None:
        for raw in self.proc.stdout:
            lines.add({**json.loads(raw), "node": self.broker_id})

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            try:
                self.proc.stdin.close()
                self.proc.wait(DEADLINE_S)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._reader.join(DEADLINE_S)
        self._stderr.close()


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk")) as server:
        yield server


@pytest.fixture
def connect(zk_server: ZooKeeperServer) -> str:
    return zk_server.connect_string(f"/strata-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def admin(connect: str) -> Iterator[StrataZkClient]:
    """The test's own client: writes topics as an admin path does, reads what controllers wrote."""
    with StrataZkClient(ZkClientConfig(connect, SESSION_MS)) as client:
        client.create_top_level_paths()
        yield client


@pytest.fixture
def cluster(connect: str, admin: StrataZkClient,
            tmp_path: Path) -> Iterator[tuple[Lines, dict[int, Node]]]:
    """Three nodes, once one of them is the controller and knows all three alive."""
    lines = Lines()
    nodes = {b: Node(b, connect, lines, tmp_path) for b in BROKERS}
    try:
        lines.wait(lambda seen: any(l["event"] == "live_brokers" and l["brokers"] == list(BROKERS)
                                    for l in seen), "a controller that knows all three brokers")
        yield lines, nodes
    finally:
        for node in nodes.values():
            node.stop()


def controller_of(lines: Lines) -> tuple[int, int]:
    """(node, epoch) of the latest election seen."""
    last = lines.of("elected")[-1]
    return last["node"], last["controller_epoch"]


def create_topic(admin: StrataZkClient, name: str, assignment: list[list[int]]) -> uuid.UUID:
    """As Kafka's AdminZkClient: the topic znode with its replica assignment and topic id."""
    topic_id = uuid.uuid4()
    admin.create_topic_assignment(z.TopicAssignment(
        name, topic_id, {p: z.ReplicaAssignment(tuple(r)) for p, r in enumerate(assignment)}))
    return topic_id


def states(admin: StrataZkClient, name: str, count: int):
    found = admin.get_partition_states(TopicPartition(name, p) for p in range(count))
    return found if len(found) == count else None


def leader_and_isr_to(lines: Lines, broker: int, topic: str, partition: int) -> list[dict]:
    return [n for l in lines.of("notices") if l["to"] == broker for n in l["notices"]
            if n["kind"] == "LeaderAndIsr" and (n["topic"], n["partition"]) == (topic, partition)]


ROTATED = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]  # each broker the preferred leader of one partition


def test_one_controller_gives_new_topics_leaders_and_tells_every_replica(cluster, admin):
    lines, _ = cluster
    controller, epoch = controller_of(lines)
    assert len(lines.of("elected")) == 1
    assert admin.get_controller_id() == controller and admin.get_controller_epoch()[0] == epoch

    topic_id = create_topic(admin, "orders", ROTATED)
    written = lines.wait(lambda _: states(admin, "orders", 3), "the partition states")
    for p, replicas in enumerate(ROTATED):
        reg = written[TopicPartition("orders", p)]
        assert (reg.leader, reg.isr, reg.leader_epoch, reg.partition_epoch, reg.controller_epoch) \
            == (replicas[0], tuple(replicas), 0, 0, epoch)
        for broker in replicas:
            notice, = lines.wait(lambda _: leader_and_isr_to(lines, broker, "orders", p),
                                 f"LeaderAndIsr for orders-{p} to {broker}")
            assert (notice["leader"], notice["leader_epoch"], notice["isr"], notice["replicas"],
                    notice["is_new"], notice["topic_id"]) == \
                (replicas[0], 0, replicas, replicas, True, str(topic_id))
    assert all(l["node"] == controller and l["controller_epoch"] == epoch for l in lines.of("notices"))

    # Partitions added by rewriting the topic znode, as AdminZkClient.addPartitions does.
    admin.set_topic_assignment(z.TopicAssignment("orders", topic_id, {
        p: z.ReplicaAssignment(tuple(r)) for p, r in enumerate(ROTATED + [[2, 1, 3]])}),
        admin.get_controller_epoch()[1])
    added = lines.wait(lambda _: states(admin, "orders", 4), "the added partition's state")
    new_partition = added[TopicPartition("orders", 3)]
    assert (new_partition.leader, new_partition.isr) == (2, (2, 1, 3))

    # Deletion requested through /admin/delete_topics: replicas told to delete, znodes gone.
    admin.create_delete_topic_path("orders")
    lines.wait(lambda _: "orders" not in admin.get_all_topics() and not admin.get_topic_deletions(),
               "the topic's deletion")
    expected = {(b, p) for p, replicas in enumerate(ROTATED + [[2, 1, 3]]) for b in replicas}
    lines.wait(lambda _: stop_replicas(lines) == expected, "StopReplica (delete) to every replica")


def stop_replicas(lines: Lines) -> set[tuple[int, int]]:
    return {(n["broker_id"], n["partition"]) for l in lines.of("notices") for n in l["notices"]
            if n["kind"] == "StopReplica" and n["delete"]}


def test_sigkilled_controller_is_replaced_and_its_partitions_get_leaders_from_their_isr(cluster, admin):
    lines, nodes = cluster
    old, old_epoch = controller_of(lines)
    create_topic(admin, "orders", ROTATED)
    before = lines.wait(lambda _: states(admin, "orders", 3), "the partition states")
    led = [tp for tp, reg in before.items() if reg.leader == old]
    assert led

    killed_at = time.monotonic()
    nodes[old].signal(signal.SIGKILL)
    lines.wait(lambda seen: any(l["event"] == "elected" and l["node"] != old for l in seen),
               "a new controller", FAILOVER_DEADLINE_S - (time.monotonic() - killed_at))
    new, new_epoch = controller_of(lines)
    assert new_epoch > old_epoch

    after = lines.wait(lambda _: (s := states(admin, "orders", 3)) and all(
        r.leader != old and old not in r.isr for r in s.values()) and s, "leaders off the dead broker")
    for tp in led:
        reg, was = after[tp], before[tp]
        assert reg.leader in was.isr and reg.leader != old
        assert reg.leader_epoch > was.leader_epoch and reg.controller_epoch == new_epoch
        notices = lines.wait(
            lambda _: [n for n in leader_and_isr_to(lines, reg.leader, tp.topic, tp.partition)
                       if n["leader_epoch"] == reg.leader_epoch], f"the new leader of {tp} told")
        assert notices[0]["leader"] == reg.leader
    assert admin.get_controller_epoch()[0] == new_epoch


def test_a_controller_paused_past_its_session_changes_nothing_with_its_stale_epoch(cluster, admin):
    lines, nodes = cluster
    old, old_epoch = controller_of(lines)
    create_topic(admin, "orders", ROTATED)
    lines.wait(lambda _: states(admin, "orders", 3), "the partition states")
    own = next(p for p, replicas in enumerate(ROTATED) if replicas[0] == old)

    nodes[old].signal(signal.SIGSTOP)
    lines.wait(lambda seen: any(l["event"] == "elected" and l["node"] != old for l in seen),
               "a new controller")
    new, new_epoch = controller_of(lines)
    settled = lines.wait(lambda _: (s := states(admin, "orders", 3)) and all(
        r.leader != old and old not in r.isr for r in s.values()) and s,
        "the old controller out of ISRs")
    epoch_znode = admin.get_controller_epoch()

    # Queued while it sleeps: the AlterPartition it would make as leader, from its stale image.
    nodes[old].send({"op": "shrink_isr", "topic": "orders", "partition": own})
    registrations = len(lines.of("registered", old))
    nodes[old].signal(signal.SIGCONT)
    answer = lines.wait(lambda _: lines.of("answer", old), "the old controller's answer")[0]
    resigned = lines.wait(lambda _: lines.of("resigned", old), "the old controller's resignation")[0]
    lines.wait(lambda _: len(lines.of("registered", old)) > registrations, "its re-registration")
    lines.wait(lambda _: [l for l in lines.of("notices", new) if l["to"] == old],
               "the new controller's notices to the re-registered broker")

    # Refused by the controller epoch fence, or dropped at the session's expiry, whichever of
    # the two reaches its controller thread first; either way it resigned at its old epoch.
    assert (answer["submitted"], answer["error"]) == (True, "NOT_CONTROLLER")
    assert resigned["controller_epoch"] == old_epoch
    assert states(admin, "orders", 3) == settled
    assert admin.get_controller_epoch() == epoch_znode
    assert admin.get_controller_id() == new
    assert all(l["node"] != old for l in lines.of("elected")[1:])
    epochs = [l["controller_epoch"] for l in lines.of("elected")]
    assert epochs == sorted(set(epochs)) and epochs[-1] == new_epoch


class ListSink:
    def __init__(self) -> None:
        self.delivered: list[tuple[int, tuple, int]] = []

    def deliver(self, broker_id, notices, controller_epoch) -> None:
        self.delivered.append((broker_id, tuple(notices), controller_epoch))


@pytest.fixture
def local(connect: str) -> Iterator[tuple[ControllerService, ListSink, KazooClient, dict[int, int]]]:
    """A ControllerService in this process for broker 1, with brokers 1-3 registered on its
    session (broker id -> broker epoch), its sink, and a plain kazoo client on the chroot."""
    zk = StrataZkClient(ZkClientConfig(connect, SESSION_MS)).start()
    raw = KazooClient(hosts=connect)
    raw.start(timeout=DEADLINE_S)
    sink = ListSink()
    service = ControllerService(zk, 1, sink)
    try:
        zk.create_top_level_paths()
        epochs = {b: zk.register_broker(BrokerRegistration(b)) for b in BROKERS}
        service.start()
        eventually(lambda: service.is_active and service.image is not None
                   and service.image.alive_broker_ids() == set(BROKERS), "the election",
                   DEADLINE_S)
        yield service, sink, raw, epochs
    finally:
        service.close()
        raw.stop()
        raw.close()
        zk.close()


def test_a_write_after_the_controller_epoch_moved_is_refused_and_the_controller_resigns(
        local, admin, caplog):
    caplog.set_level("INFO", logger="strata.cluster.controller")
    service, sink, raw, broker_epochs = local
    epoch = service.controller_epoch
    create_topic(admin, "t", [[1, 2]])
    before = eventually(lambda: states(admin, "t", 1), "the partition state", DEADLINE_S)
    eventually(lambda: len(sink.delivered) == 2, "the notices of the new partition", DEADLINE_S)

    # Another controller's election, whose /controller change this one has not seen yet.
    raw.set(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(epoch + 1))
    shrink = service.submit(AlterPartition(1, broker_epochs[1], "t", 0, 0, 0, (1,)))
    with pytest.raises(KafkaError) as refused:
        shrink.result(DEADLINE_S)
    assert refused.value.code == ErrorCode.NOT_CONTROLLER
    assert not service.is_active
    resigned, = [r for r in caplog.records if getattr(r, "controller_event", None) == "resigned"]
    assert resigned.controller_epoch == epoch and "write was refused" in resigned.reason

    with pytest.raises(KafkaError) as later:
        service.submit(ElectLeaders((TopicPartition("t", 0),))).result(DEADLINE_S)
    assert later.value.code == ErrorCode.NOT_CONTROLLER
    assert states(admin, "t", 1) == before
    assert [e for _, _, e in sink.delivered] == [epoch, epoch]


def test_a_lost_version_race_is_decided_again_on_what_zookeeper_holds(local, admin):
    service, sink, raw, _ = local
    create_topic(admin, "t", [[1, 2, 3]])
    eventually(lambda: states(admin, "t", 1), "the partition state", DEADLINE_S)
    # A writer the controller does not watch shrinks the ISR (as ZooKeeper-mode leaders did).
    path = z.partition_state_path("t", 0)
    raw.set(path, z.encode_partition_state(PartitionRegistration(1, (1, 3), controller_epoch=1)), 0)

    raw.delete(z.broker_path(3))
    reg = eventually(lambda: (r := states(admin, "t", 1)[TopicPartition("t", 0)]).isr == (1,) and r,
                     "broker 3 out of the ISR", DEADLINE_S)
    assert (reg.leader, reg.leader_epoch, reg.partition_epoch) == (1, 1, 2)
    last = eventually(lambda: [n for b, ns, _ in sink.delivered if b == 2 for n in ns
                               if n.leader_epoch == 1], "broker 2 told", DEADLINE_S)
    assert (last[0].isr, last[0].partition_epoch) == ((1,), 2)


def test_a_topic_submitted_to_the_controller_is_written_with_its_id_configs_and_states(local, admin):
    service, sink, _, _ = local
    topic_id = uuid.uuid4()
    result = service.submit(TopicCreated("s", topic_id, num_partitions=2, replication_factor=3,
                                         configs={"cleanup.policy": "compact"})).result(DEADLINE_S)
    found = admin.get_topic_assignments(["s"])["s"]
    assert found.topic_id == topic_id
    assert tuple(found.partitions[p].replicas for p in range(2)) == result.response
    assert admin.get_entity_configs("topics", "s") == {"cleanup.policy": "compact"}
    written = states(admin, "s", 2)
    assert {tp.partition: (reg.leader, reg.isr) for tp, reg in written.items()} == {
        p: (replicas[0], replicas) for p, replicas in enumerate(result.response)}
    with pytest.raises(KafkaError) as again:
        service.submit(TopicCreated("s", uuid.uuid4(), num_partitions=1,
                                    replication_factor=1)).result(DEADLINE_S)
    assert again.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
