"""How long partitions are unavailable during network faults, Strata (ZooKeeper) against Apache
Kafka (KRaft, combined mode), under an idempotent acks=all producer (issue 51):

    python -m benchmarks.netfaults --system strata|kafka [--faults F,...] [--rounds 3]
                                     [--cut-s 30] [--json FILE]

Each node runs in its own network namespace (benchmarks/netfault.py; needs root): Strata is
ZooKeeper and three brokers, Kafka three nodes with ``process.roles=broker,controller`` whose
CONTROLLER listener is on a second address of the node, so that the quorum's traffic can be cut
apart from the rest. Failure detection is each system's default (Strata:
zookeeper.session.timeout.ms 18000; Kafka: broker.session.timeout.ms 9000, the quorum's fetch
and election timeouts; both: replica.lag.time.max.ms 30000).

Topic ``netfaults``: 3 partitions, replication factor 3, min.insync.replicas 2. One producer in
the root namespace (never cut unless a fault says so) sends ``RATE`` records/s to each
partition throughout. A round waits until every ISR is whole, applies one fault for ``--cut-s``
seconds, heals, and waits until every partition is acknowledged again and every ISR is whole.
Per partition it records the longest time without an acknowledgement from the cut to then
(``gap_s``) and when that stall ended, counted from the cut (``resume_s``). After the last round
everything is read back from offset 0 and every acknowledged record is looked for at its offset.

Faults (``L`` leads the round's partition and is not the controller; partitions are taken in
turn):
  leader-isolated     L's link down: no broker, no ZooKeeper/quorum, no client reaches it.
  leader-cut-coord    L cut from ZooKeeper (Strata) or from every controller listener (Kafka)
                      only; it still reaches the other brokers and the clients.
  controller-isolated the controller's link down (Strata: the broker /controller names; Kafka:
                      the quorum leader).
  split               L on one side, the other two brokers (and ZooKeeper) on the other; the
                      clients reach both sides.
  follower-link       only the link between L and one follower F of its partition is cut.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from benchmarks.brokers import (REPO_ROOT, KafkaBroker, StrataBroker, find_kafka_libs,
                                  kafka_version, log)
from benchmarks.failover import _code, kraft_quorum_leader
from benchmarks.netfault import Network, netfault_available
from strata.common.types import uuid_to_kafka_str
from strata.net.connection import roundtrip

TOPIC = "netfaults"
PARTITIONS = 3
RATE = 200                  # records per second per partition
VALUE_SIZE = 100
BROKER_PORT, CONTROLLER_PORT, ZK_PORT = 9092, 9093, 2181
FAULTS = ("leader-isolated", "leader-cut-coord", "controller-isolated", "split", "follower-link")
RECOVER_TIMEOUT_S = 180
STALL_S = 1.0               # gaps shorter than this are not reported as a stall

# Both systems get these. librdkafka keeps sending to a leader until a request times out or
# new metadata names another, and refreshes metadata only every 5 min by default: with 1 s
# refreshes and 5 s request timeouts it follows a move within seconds (the same settings as
# tests/integration/test_network_faults.py).
PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "request.timeout.ms": 5000, "message.timeout.ms": 120000,
            "topic.metadata.refresh.interval.ms": 1000, "metadata.max.age.ms": 3000}


def wait_for(what: str, check, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # noqa: BLE001 - nodes come and go
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise TimeoutError(f"no {what} within {timeout:.0f} s (last: {last!r})")


class NetCluster:
    """Three nodes (ids 1..3, host ``broker-N``) in a Network's namespaces."""

    system = "?"
    coordinator = "?"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict = {}
        self.net: Network | None = None

    def hosts(self) -> list[str]:
        return [f"broker-{i}" for i in (1, 2, 3)]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.bootstraps)

    @property
    def bootstraps(self) -> list[str]:
        return [n.bootstrap for n in self.nodes.values()]

    def _place(self, node, host: str) -> None:
        node.host = self.net.address(host)
        node.argv = [*self.net.command_prefix(host), *node.argv]

    def start(self, net: Network) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop(30)

    def controller(self) -> int | None:
        raise NotImplementedError

    def cut_from_coordinator(self, node_id: int) -> None:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError


class StrataNet(NetCluster):
    system = "strata"
    coordinator = "ZooKeeper"

    def __init__(self, root: Path, config: Path) -> None:
        super().__init__(root)
        self.config = config
        self.zk: subprocess.Popen | None = None

    def hosts(self) -> list[str]:
        return ["zookeeper", *super().hosts()]

    def start(self, net: Network) -> None:
        self.net = net
        zk_dir = self.root / "zookeeper"
        zk_dir.mkdir(parents=True, exist_ok=True)
        zk_address = net.address("zookeeper")
        with open(zk_dir / "zookeeper.log", "ab") as out:
            self.zk = net.popen("zookeeper", ["bash", str(REPO_ROOT / "scripts" / "zookeeper-run.sh"),
                                              str(ZK_PORT), str(zk_dir), "500", zk_address],
                                stdout=out, stderr=subprocess.STDOUT)

        def ruok() -> bool:
            with socket.create_connection((zk_address, ZK_PORT), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        wait_for("ZooKeeper", ruok, 60)
        for i in (1, 2, 3):
            address = net.address(f"broker-{i}")
            node = StrataBroker(self.root / f"node{i}", {
                "node.id": str(i),
                "listeners": f"PLAINTEXT://{address}:{BROKER_PORT}",
                "advertised.listeners": f"PLAINTEXT://{address}:{BROKER_PORT}",
                "zookeeper.connect": f"{zk_address}:{ZK_PORT}/strata",
                # config/server.properties turns tiering on, which a ZooKeeper cluster refuses
                "remote.log.storage.system.enable": "false",
                "log.remote.storage.enable": "false",
                "strata.metrics.listener": "",   # the shipped config's port is one broker's
            }, port=BROKER_PORT, config=self.config)
            self._place(node, f"broker-{i}")
            self.nodes[i] = node
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready(180)

    def stop(self) -> None:
        super().stop()
        if self.zk is not None and self.zk.poll() is None:
            self.zk.terminate()
            self.zk.wait(30)

    def controller(self) -> int | None:
        from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
        from kio.schema.describe_cluster.v0.response import DescribeClusterResponse
        req = DescribeClusterRequest(include_cluster_authorized_operations=False)
        for node in self.nodes.values():
            try:
                resp = roundtrip(node.bootstrap, req, DescribeClusterResponse, timeout=2)
            except OSError:
                continue
            if _code(resp.error_code) == 0 and int(resp.controller_id) >= 0:
                return int(resp.controller_id)
        return None

    def cut_from_coordinator(self, node_id: int) -> None:
        cut_from_zookeeper(self.net, node_id)

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("strata")
        except PackageNotFoundError:
            return "?"


class KafkaNet(NetCluster):
    system = "kafka"
    coordinator = "the controller quorum"

    def __init__(self, root: Path, libs: Path) -> None:
        super().__init__(root)
        self.libs = libs
        self.controller_address: dict[int, str] = {}

    def start(self, net: Network) -> None:
        self.net = net
        for i in (1, 2, 3):
            self.controller_address[i] = net.add_address(f"broker-{i}")
        voters = ",".join(f"{i}@{a}:{CONTROLLER_PORT}" for i, a in self.controller_address.items())
        cluster_id = uuid_to_kafka_str(uuid.uuid4())
        for i in (1, 2, 3):
            address = net.address(f"broker-{i}")
            node = KafkaBroker(self.root / f"node{i}", self.libs, {
                "listeners": f"PLAINTEXT://{address}:{BROKER_PORT},"
                             f"CONTROLLER://{self.controller_address[i]}:{CONTROLLER_PORT}",
                "advertised.listeners": f"PLAINTEXT://{address}:{BROKER_PORT}",
            }, node_id=i, port=BROKER_PORT, controller_port=CONTROLLER_PORT, voters=voters,
                cluster_id=cluster_id)
            self._place(node, f"broker-{i}")
            self.nodes[i] = node
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready(180)

    def controller(self) -> int | None:
        """The quorum leader: only it answers DescribeQuorum without an error."""
        return kraft_quorum_leader(
            [f"{a}:{CONTROLLER_PORT}" for a in self.controller_address.values()], 2)

    def cut_from_coordinator(self, node_id: int) -> None:
        """No packet between the node and any CONTROLLER listener but its own, either way."""
        for other, address in self.controller_address.items():
            if other != node_id:
                self.net.blackhole(f"broker-{node_id}", address)
                self.net.blackhole(f"broker-{other}", self.controller_address[node_id])

    def version(self) -> str:
        return kafka_version(self.libs)


class Producing(threading.Thread):
    """``rate`` records/s to each partition of ``topic`` from one acks=all producer (``config``:
    ``PRODUCER``, idempotent, unless given); every acknowledgement's (partition, offset) ->
    (value, time). Values are ``tag`` and a sequence number, so that producers running together
    never write the same value. Shared by the bench and tests/integration/test_network_faults.py."""

    def __init__(self, bootstrap: str, *, topic: str = TOPIC, partitions: int = PARTITIONS,
                 rate: float = RATE, config: dict | None = None, tag: bytes = b"") -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.config = {**(config or PRODUCER), "bootstrap.servers": bootstrap}
        self.tag = tag
        self.acked: dict[tuple[int, int], tuple[bytes, float]] = {}
        self.ack_times: dict[int, list[float]] = defaultdict(list)
        self.errors: list[tuple[float, str]] = []
        self.sent = 0
        self.undelivered = 0
        self.without_offset = 0     # acknowledgements that carried no offset
        self._stopping = threading.Event()

    @property
    def idempotent(self) -> bool:
        return str(self.config.get("enable.idempotence", False)).lower() == "true"

    def _producer(self):
        from confluent_kafka import Producer
        return Producer(self.config)

    def _delivered(self, err, msg) -> None:
        now = time.monotonic()
        if err is None:
            offset = msg.offset()
            key = (msg.partition(), offset if offset is not None and offset >= 0 else None)
            if key[1] is None:
                self.without_offset += 1
                key = (msg.partition(), -self.without_offset)
            self.acked[key] = (msg.value(), now)
            self.ack_times[msg.partition()].append(now)
        else:
            self.errors.append((now, err.name()))

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported with the errors
            self.errors.append((time.monotonic(), f"producer thread: {exc!r}"))

    def _run(self) -> None:
        from confluent_kafka import KafkaException
        producer = self._producer()
        start = time.monotonic()
        while not self._stopping.is_set():
            i = self.sent
            try:
                producer.produce(self.topic,
                                 value=(self.tag + b"%09d:" % i).ljust(VALUE_SIZE, b"x"),
                                 partition=i % self.partitions, on_delivery=self._delivered)
            except BufferError:
                producer.poll(0.1)
                continue
            except KafkaException as exc:     # a fatal idempotence error: a new producer
                self.errors.append((time.monotonic(), f"fatal:{exc.args[0].name()}"))
                self.undelivered += producer.flush(10)
                producer = self._producer()
                continue
            self.sent += 1
            producer.poll(0)
            ahead = start + self.sent / (self.rate * self.partitions) - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self.undelivered += producer.flush(150)

    def stop(self) -> None:
        self._stopping.set()
        self.join(200)

    def acked_after(self, p: int, t: float) -> bool:
        times = self.ack_times[p]
        return bool(times) and times[-1] > t

    def error_counts(self) -> dict[str, int]:
        return dict(Counter(e for _, e in list(self.errors)))

    def values(self) -> dict[tuple[int, int], bytes]:
        """What was acknowledged: (partition, offset) -> value (offsets < 0: acknowledged
        without one)."""
        return {k: v for k, (v, _) in list(self.acked.items())}


def node_view(bootstrap: str, topic: str = TOPIC
              ) -> tuple[set[int], dict[int, tuple[int, frozenset[int]]]] | None:
    """(broker ids, {partition: (leader, isr)}) of ``topic`` as the broker at ``bootstrap``
    itself answers Metadata; None if it does not."""
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.schema.types import TopicName
    req = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(topic)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    try:
        resp = roundtrip(bootstrap, req, MetadataResponse, timeout=2)
    except (OSError, ValueError, EOFError):
        return None
    parts = {int(p.partition_index): (int(p.leader_id), frozenset(int(r) for r in p.isr_nodes))
             for t in resp.topics for p in t.partitions if _code(p.error_code) == 0}
    return {int(b.node_id) for b in resp.brokers}, parts


def whole(bootstraps: Sequence[str], topic: str = TOPIC, partitions: int = PARTITIONS
          ) -> dict | None:
    """Leaders by partition of ``topic`` once every broker (ids 1 to 3, at ``bootstraps``),
    asked itself, lists all three brokers and the same leaders, and every ISR is whole (a
    broker just healed can answer from a stale view)."""
    views = [node_view(b, topic) for b in bootstraps]
    if any(v is None for v in views) or any(v != views[0] for v in views):
        return None
    brokers, parts = views[0]
    if brokers != {1, 2, 3} or len(parts) != partitions:
        return None
    if any(leader < 0 or isr != {1, 2, 3} for leader, isr in parts.values()):
        return None
    return {p: leader for p, (leader, _) in parts.items()}


def stall(times: list[float], start: float, end: float) -> tuple[float, float, float]:
    """(longest gap, its start, its end), times from ``start``, over acknowledgements in
    (start, end] with ``start`` itself as the first point."""
    points = [start] + [t for t in times if start < t <= end]
    if len(points) == 1:
        return end - start, 0.0, end - start
    a, b = max(zip(points, points[1:]), key=lambda ab: ab[1] - ab[0])
    return b - a, a - start, b - start


def cut_from_zookeeper(net: Network, node_id: int) -> None:
    """Broker ``node_id`` cut from ZooKeeper alone (it still reaches the others and the clients)."""
    net.cut(f"broker-{node_id}", "zookeeper")


def apply_fault(net: Network, fault: str, leaders: dict, controller: int, turn: int,
                cut_from_coordinator: Callable[[int], None], coordinator: str = "ZooKeeper"
                ) -> tuple[int, str]:
    """Applies ``fault`` to brokers 1 to 3 (hosts ``broker-N``) of ``net``, whose other hosts
    (ZooKeeper) are on the majority's side of a split; ``cut_from_coordinator(node)`` cuts a
    broker from ``coordinator``. (the round's partition, what was done). Shared by the bench
    and tests/integration/test_network_faults.py."""
    candidates = [p for p in sorted(leaders) if leaders[p] != controller] or sorted(leaders)
    p = candidates[turn % len(candidates)]
    leader = leaders[p]
    if fault == "leader-isolated":
        net.isolate(f"broker-{leader}")
        return p, f"isolated broker {leader} (leader of p{p})"
    if fault == "leader-cut-coord":
        cut_from_coordinator(leader)
        return p, f"cut broker {leader} (leader of p{p}) from {coordinator}"
    if fault == "controller-isolated":
        led = [q for q in sorted(leaders) if leaders[q] == controller]
        net.isolate(f"broker-{controller}")
        return (led[0] if led else p), f"isolated broker {controller} (controller, leader of " \
                                       f"{['p%d' % q for q in led]})"
    if fault == "split":
        majority = [f"broker-{i}" for i in (1, 2, 3) if i != leader] + \
            [h for h in net.hosts if not h.startswith("broker-")]
        net.split([f"broker-{leader}"], majority)
        return p, f"split broker {leader} (leader of p{p}) from {sorted(majority)}"
    if fault == "follower-link":
        followers = [i for i in (1, 2, 3) if i != leader]
        follower = next((i for i in followers if i != controller), followers[0])
        net.cut(f"broker-{leader}", f"broker-{follower}")
        return p, f"cut the link between broker {leader} (leader of p{p}) and broker {follower}"
    raise ValueError(fault)


def run_round(cluster: NetCluster, producing: Producing, fault: str, turn: int,
              cut_s: float) -> dict:
    leaders = wait_for("every ISR whole", lambda: whole(cluster.bootstraps), RECOVER_TIMEOUT_S)
    controller = wait_for("a controller", cluster.controller, 60)
    steady = time.monotonic()
    wait_for("acknowledgements on every partition", lambda: all(
        producing.acked_after(q, steady) for q in range(PARTITIONS)), 60, 0.05)
    time.sleep(1)
    errors_before = len(producing.errors)
    cut_at = time.monotonic()
    p, what = apply_fault(cluster.net, fault, leaders, controller, turn,
                          cluster.cut_from_coordinator, cluster.coordinator)
    time.sleep(max(0.0, cut_at + cut_s - time.monotonic()))
    cluster.net.heal()
    healed_at = time.monotonic()
    wait_for("acknowledgements on every partition after healing", lambda: all(
        producing.acked_after(q, healed_at) for q in range(PARTITIONS)), RECOVER_TIMEOUT_S, 0.05)
    resumed_at = time.monotonic()
    after = wait_for("every ISR whole after healing", lambda: whole(cluster.bootstraps),
                     RECOVER_TIMEOUT_S)
    end = time.monotonic()
    parts = {}
    for q in range(PARTITIONS):
        gap, gap_from, gap_to = stall(list(producing.ack_times[q]), cut_at, resumed_at)
        parts[q] = {"leader_before": leaders[q], "leader_after": after[q],
                    "gap_s": round(gap, 2), "stall_from_s": round(gap_from, 2),
                    "resume_s": round(gap_to, 2) if gap >= STALL_S else 0.0}
    return {"fault": fault, "round": turn + 1, "partition": p, "what": what,
            "controller_before": controller, "cut_s": round(healed_at - cut_at, 2),
            "whole_after_heal_s": round(end - healed_at, 2),
            "delivery_errors": dict(Counter(e for _, e in producing.errors[errors_before:])),
            "partitions": parts, "_window": (cut_at, end)}


def round_line(system: str, r: dict) -> str:
    cells = []
    for q, s in r["partitions"].items():
        mark = "*" if q == r["partition"] else ""
        if s["gap_s"] < STALL_S:
            cells.append(f"p{q}{mark} no stall (longest gap {s['gap_s']:.2f} s)")
        else:
            cells.append(f"p{q}{mark} gap {s['gap_s']:.1f} s (+{s['stall_from_s']:.1f} to "
                         f"+{s['resume_s']:.1f})")
        if s["leader_before"] != s["leader_after"]:
            cells[-1] += f" leader {s['leader_before']}->{s['leader_after']}"
    return (f"{system} {r['fault']} round {r['round']}: {r['what']}; " + "; ".join(cells)
            + f"; ISR whole {r['whole_after_heal_s']:.1f} s after healing; delivery errors "
            f"{r['delivery_errors'] or 'none'}")


def read_back(bootstrap: str, topic: str = TOPIC, ends: dict[int, int] | None = None
              ) -> tuple[dict[tuple[int, int], bytes], list[str]]:
    """Every record of ``topic``'s partitions from offset 0 up to ``ends[p]`` (None: each
    partition's high watermark now), as a consumer reads them (both tiers): ({(partition,
    offset): value}, errors). A partition stops after 30 s without progress."""
    from confluent_kafka import Consumer, TopicPartition
    stored: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        if ends is None:
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                    for p in range(PARTITIONS)}
        for p, end in ends.items():
            consumer.assign([TopicPartition(topic, p, 0)])
            last, progress = -1, time.monotonic()
            while last < end - 1 and time.monotonic() - progress < 30:
                m = consumer.poll(0.5)
                if m is None:
                    continue
                if m.error() is not None:
                    errors.append(f"partition {p}: {m.error()}")
                    continue
                stored[(p, m.offset())] = m.value()
                last, progress = m.offset(), time.monotonic()
    finally:
        consumer.close()
    return stored, errors


def unread(acked: Mapping[tuple[int, int], bytes], stored: Mapping[tuple[int, int], bytes]
           ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(acknowledged records not read back, acknowledged records read back with another value
    at their offset), each as sorted (partition, offset) keys of ``acked``. An acknowledgement
    without an offset (key offset < 0: a retried batch the broker had already written,
    DUPLICATE_SEQUENCE_NUMBER) is looked for by its value anywhere in its partition."""
    values = {(p, v) for (p, _), v in stored.items()}
    lost, changed = [], []
    for k, v in acked.items():
        if k[1] < 0:
            if (k[0], v) not in values:
                lost.append(k)
        elif k not in stored:
            lost.append(k)
        elif stored[k] != v:
            changed.append(k)
    return sorted(lost), sorted(changed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", choices=("kafka", "strata"), required=True)
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma separated, of {FAULTS}")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each fault (default 3)")
    ap.add_argument("--cut-s", type=float, default=30, help="how long each fault lasts")
    ap.add_argument("--json", type=Path, help="write every round here")
    ap.add_argument("--dir", type=Path, help="data directory (default: a temporary one, removed)")
    ap.add_argument("--kafka-libs", help="Kafka's jars (default: KAFKA_VERSION's in the cache)")
    ap.add_argument("--config", type=Path, default=REPO_ROOT / "config" / "server.properties")
    args = ap.parse_args(argv)
    faults = args.faults.split(",")
    if any(f not in FAULTS for f in faults):
        ap.error(f"--faults: one of {FAULTS}")
    ok, why = netfault_available()
    if not ok:
        raise SystemExit(f"netfaults: {why}")

    from confluent_kafka.admin import AdminClient, NewTopic
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"netfaults-{args.system}-"))
    if args.system == "kafka":
        libs, why = find_kafka_libs(args.kafka_libs)
        if libs is None:
            raise SystemExit(why)
        cluster: NetCluster = KafkaNet(root, libs)
    else:
        cluster = StrataNet(root, args.config)
    rounds: list[dict] = []
    started = time.monotonic()
    producing = None
    try:
        with Network(cluster.hosts()) as net:
            try:
                log(f"starting {cluster.system} {cluster.version()} under {root}")
                cluster.start(net)
                admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
                admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={
                    "min.insync.replicas": "2"})], request_timeout=30)[TOPIC].result(60)
                producing = Producing(cluster.bootstrap)
                producing.start()
                for fault in faults:
                    for turn in range(args.rounds):
                        rounds.append(run_round(cluster, producing, fault, turn,
                                                args.cut_s))
                        print(round_line(cluster.system, rounds[-1]), flush=True)
                producing.stop()
                wait_for("every ISR whole", lambda: whole(cluster.bootstraps), RECOVER_TIMEOUT_S)
                stored, read_errors = read_back(cluster.bootstrap)
            except BaseException:
                for i, node in cluster.nodes.items():
                    log(f"--- node {i} ({node.log_path}) ---\n{node.output_tail(15)}")
                raise
            finally:
                if producing is not None and producing.is_alive():
                    producing.stop()
                cluster.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    missing, changed = unread(producing.values(), stored)
    lost = sorted(missing + changed)
    for r in rounds:
        start, end = r.pop("_window")
        r["lost"] = sum(1 for k in lost if start <= producing.acked[k][1] <= end)
    summary = (f"{cluster.system}: produced {producing.sent}, acknowledged "
               f"{len(producing.acked)} ({producing.without_offset} without an offset), read "
               f"back {len(stored)}, acknowledged but not read back {len(lost)} {lost[:10]}, undelivered {producing.undelivered}, delivery errors "
               f"{producing.error_counts()}, consumer errors "
               f"{read_errors[:5]}; {time.monotonic() - started:.0f} s")
    print(summary, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "system": cluster.system, "version": cluster.version(),
            "command": shlex.join(["python", "-m", "benchmarks.netfaults",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "producer": PRODUCER, "rate_per_partition": RATE,
            "cut_s": args.cut_s, "rounds": rounds, "acknowledged": len(producing.acked),
            "lost": len(lost), "lost_first": lost[:20], "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
