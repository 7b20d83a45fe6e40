"""Failover times of a three-node cluster on this machine:

    python -m benchmarks.failover --system kafka|strata --rounds 3 [--json F]

Kafka is three KRaft nodes in combined mode (``process.roles=broker,controller``, node ids 1..3,
a static ``controller.quorum.voters``, one cluster id); Strata is three ``strata serve``
processes coordinated by a ZooKeeper that ``scripts/zookeeper-run.sh`` runs. Every setting not
named here is the system's default, so the times include its default failure detection
(Kafka: ``broker.session.timeout.ms``, the quorum's fetch and election timeouts).

leader failover
    Topic ``failover``: 1 partition, replication factor 3, ``min.insync.replicas=2``. A
    confluent-kafka producer (acks=all, linger.ms=0, one request in flight, the client's default
    retries) sends small records continuously; the partition leader's process gets SIGKILL.
    ``failover_s`` is the time from the kill to the first successful delivery report of a record
    produced after the kill, which only the new leader can have acknowledged. ``first_ack_s``
    is the first successful report of any record after the kill (records sent before it and
    retried; it may include a reply the old leader sent just before it died). The replicas are
    assigned with the active controller last, so that the leader killed is not the controller
    as well (``leader_was_controller`` says whether it was).

controller failover
    The active controller's process gets SIGKILL. ``controller_s`` is the time until a
    surviving node reports a different controller, ``create_topics_s`` the time until a
    CreateTopics (1 partition, replication factor 1) sent to a surviving broker succeeds
    (attempts start at the kill, to the survivors in turn), ``failover_s`` the later of the
    two. Kafka's active controller is read with DescribeQuorum (the request behind its
    ``describeMetadataQuorum``) of ``__cluster_metadata`` sent to each live node's CONTROLLER
    listener: only the quorum leader answers it without error (DescribeCluster's controller is
    a random broker under KRaft). Strata's is DescribeCluster's ``controller_id``.

Each round restarts the killed node and waits until the cluster is whole again (three brokers
in Metadata, the partition's ISR all three replicas, a controller known) before the next.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from benchmarks.brokers import (REPO_ROOT, Broker, KafkaBroker, StrataBroker, find_kafka_libs,
                                  free_port, kafka_version, log)
from strata.common.types import uuid_to_kafka_str
from strata.net.connection import roundtrip

TOPIC = "failover"
NODE_IDS = (1, 2, 3)
POLL_S = 0.02          # how often a waiting loop looks again
START_TIMEOUT_S = 180
WHOLE_TIMEOUT_S = 180
FAILOVER_TIMEOUT_S = 120


def wait_for(what: str, check: Callable[[], object], timeout: float, interval: float = POLL_S):
    """``check()``'s first truthy result, polling until ``timeout``; TimeoutError after."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)


def kraft_quorum_leader(addresses: list[str], timeout: float) -> int | None:
    """The KRaft quorum leader's node id, asked of each controller listener ("host:port")
    in turn with DescribeQuorum (only the leader answers without an error); None if none."""
    from kio.schema.describe_quorum.v2.request import (
        DescribeQuorumRequest, PartitionData, TopicData)
    from kio.schema.describe_quorum.v2.response import DescribeQuorumResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i32
    req = DescribeQuorumRequest(topics=(TopicData(
        topic_name=TopicName("__cluster_metadata"),
        partitions=(PartitionData(partition_index=i32(0)),)),))
    for address in addresses:
        try:
            resp = roundtrip(address, req, DescribeQuorumResponse, timeout=timeout)
        except OSError:
            continue
        if _code(resp.error_code) != 0 or not resp.topics:
            continue    # not the quorum leader (NOT_LEADER_OR_FOLLOWER)
        p = resp.topics[0].partitions[0]
        if _code(p.error_code) == 0 and int(p.leader_id) >= 0:
            return int(p.leader_id)
    return None


def _code(value) -> int:
    return int(getattr(value, "value", value))


def start_zookeeper(data_dir: Path, timeout: float = 60) -> tuple[subprocess.Popen, int]:
    """``scripts/zookeeper-run.sh PORT DIR`` in the background, its output in
    ``DIR/zookeeper.log``; (process, port) once it answers ``ruok`` with ``imok``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with open(data_dir / "zookeeper.log", "ab") as out:
        proc = subprocess.Popen(["bash", str(REPO_ROOT / "scripts" / "zookeeper-run.sh"),
                                 str(port), str(data_dir)], stdout=out, stderr=subprocess.STDOUT)

    def ok() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"zookeeper exited with {proc.returncode}; "
                               f"see {data_dir}/zookeeper.log")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        except OSError:
            return False
    try:
        wait_for("ZooKeeper answering ruok", ok, timeout, 0.1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, port


class Cluster:
    """Three nodes, ids 1..3, each a ``Broker`` subprocess."""

    system = "?"

    def __init__(self) -> None:
        self.nodes: dict[int, Broker] = {}

    def bootstrap(self, ids=None) -> str:
        return ",".join(self.nodes[i].bootstrap for i in (ids or self.nodes))

    def start(self) -> None:
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready(START_TIMEOUT_S)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def active_controller(self, ids) -> int | None:
        """The active controller as the live nodes ``ids`` report it; None if none is known."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError


class KafkaCluster(Cluster):
    system = "kafka"

    def __init__(self, root: Path, libs: Path, overrides: dict[str, str] | None = None) -> None:
        super().__init__()
        self.libs = libs
        ports = {i: (free_port(), free_port()) for i in NODE_IDS}
        voters = ",".join(f"{i}@127.0.0.1:{ports[i][1]}" for i in NODE_IDS)
        cluster_id = uuid_to_kafka_str(uuid.uuid4())
        for i in NODE_IDS:
            self.nodes[i] = KafkaBroker(root / f"node{i}", libs, node_id=i, port=ports[i][0],
                                        controller_port=ports[i][1], voters=voters,
                                        cluster_id=cluster_id, overrides=overrides)

    def active_controller(self, ids) -> int | None:
        nodes = [self.nodes[i] for i in ids]
        assert all(isinstance(n, KafkaBroker) for n in nodes)
        return kraft_quorum_leader([f"127.0.0.1:{n.controller_port}" for n in nodes], 1)

    def version(self) -> str:
        return kafka_version(self.libs)


class StrataCluster(Cluster):
    system = "strata"

    def __init__(self, root: Path, config: Path, overrides: dict[str, str] | None = None) -> None:
        super().__init__()
        self.root = root
        self.config = config
        self.overrides = overrides or {}
        self.zk: subprocess.Popen | None = None
        self.zk_port = 0

    def start(self) -> None:
        self.zk, self.zk_port = start_zookeeper(self.root / "zookeeper")
        for i in NODE_IDS:
            port = free_port()
            self.nodes[i] = StrataBroker(self.root / f"node{i}", {
                "zookeeper.connect": f"127.0.0.1:{self.zk_port}/strata",
                "node.id": str(i),
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                # config/server.properties turns tiering on, which a ZooKeeper cluster refuses
                "remote.log.storage.system.enable": "false",
                "log.remote.storage.enable": "false",
                "strata.metrics.listener": "",   # the shipped config's port is one broker's
                **self.overrides,
            }, port=port, config=self.config)
        super().start()

    def stop(self) -> None:
        super().stop()
        if self.zk is not None and self.zk.poll() is None:
            self.zk.terminate()
            try:
                self.zk.wait(30)
            except subprocess.TimeoutExpired:
                self.zk.kill()
                self.zk.wait()

    def active_controller(self, ids) -> int | None:
        from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
        from kio.schema.describe_cluster.v0.response import DescribeClusterResponse
        req = DescribeClusterRequest(include_cluster_authorized_operations=False)
        for i in ids:
            try:
                resp = roundtrip(self.nodes[i].bootstrap, req, DescribeClusterResponse, timeout=1)
            except OSError:
                continue
            if _code(resp.error_code) == 0 and int(resp.controller_id) >= 0:
                return int(resp.controller_id)
        return None

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("strata")
        except PackageNotFoundError:
            return "?"


def partition_state(admin, topic: str = TOPIC) -> tuple[set[int], int, list[int], list[int]] | None:
    """(broker ids, leader, replicas, isr) of ``topic``'s partition 0 from one Metadata request;
    None while the request fails or the partition is unknown."""
    try:
        md = admin.list_topics(topic, timeout=2)
    except Exception:  # noqa: BLE001 - a broker down or electing; look again
        return None
    t = md.topics.get(topic)
    if t is None or t.error is not None or 0 not in t.partitions:
        return None
    p = t.partitions[0]
    return set(md.brokers), p.leader, list(p.replicas), list(p.isrs)


def wait_whole(cluster: Cluster, admin) -> int:
    """Wait until all three brokers are in Metadata, the partition has a leader and all three
    replicas in its ISR, and a controller is known; the controller's id."""
    ids = set(cluster.nodes)
    seen = {}

    def whole():
        state = partition_state(admin)
        if state is None:
            return None
        brokers, leader, replicas, isr = state
        seen.update(brokers=sorted(brokers), leader=leader, replicas=replicas, isr=isr)
        if brokers != ids or leader < 0 or len(replicas) != 3 or set(isr) != set(replicas):
            return None
        seen["controller"] = cluster.active_controller(ids)
        return seen["controller"]
    try:
        return wait_for("whole cluster", whole, WHOLE_TIMEOUT_S, 0.1)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; last seen: {seen or 'no Metadata'}") from None


class ProduceLoop(threading.Thread):
    """Sends small records continuously, noting when each was produced and each delivery
    report (time, error)."""

    def __init__(self, bootstrap: str, topic: str = TOPIC) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.sent_at: list[float] = []                    # produce() time by record number
        self.acked: list[tuple[int, float]] = []          # (record number, report time)
        self.failed: list[tuple[int, float, str]] = []    # (record number, report time, error)
        self.client_errors: list[str] = []                # error_cb: connection failures etc.
        self._done = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0,
                             "max.in.flight.requests.per.connection": 1,
                             "error_cb": lambda err: self.client_errors.append(str(err))})
        while not self._done.is_set():
            n = len(self.sent_at)
            try:
                producer.produce(self.topic, value=b"%d" % n,
                                 on_delivery=functools.partial(self._report, n))
                self.sent_at.append(time.monotonic())
            except BufferError:
                pass
            producer.poll(0.005)    # returns early when a report arrives
        producer.flush(30)

    def _report(self, n: int, err, _msg) -> None:
        now = time.monotonic()
        if err is None:
            self.acked.append((n, now))
        else:
            self.failed.append((n, now, str(err)))

    def stop(self) -> None:
        self._done.set()
        self.join(60)


def leader_round(cluster: Cluster, admin, number: int) -> dict:
    controller = wait_whole(cluster, admin)
    _, leader, _, _ = partition_state(admin) or (None, -1, None, None)
    loop = ProduceLoop(cluster.bootstrap())
    loop.start()
    try:
        try:
            wait_for("records acknowledged before the kill", lambda: len(loop.acked) >= 50, 60)
        except TimeoutError as e:
            raise TimeoutError(f"{e} ({len(loop.acked)} acknowledged, {len(loop.failed)} failed "
                               f"{sorted({f[2] for f in loop.failed})[:3]}, client errors "
                               f"{loop.client_errors[-3:]})") from None
        node = cluster.nodes[leader]
        killed_at = time.monotonic()
        node.kill()

        def first_new_ack():
            return next((t for n, t in list(loop.acked) if loop.sent_at[n] >= killed_at), None)
        acked_at = wait_for("acknowledgement after the kill", first_new_ack, FAILOVER_TIMEOUT_S)
        first_any = min(t for _, t in list(loop.acked) if t >= killed_at)
    finally:
        loop.stop()

    def new_leader():
        state = partition_state(admin)
        return state[1] if state and state[1] not in (-1, leader) else None
    result = {
        "round": number, "killed": leader, "leader_was_controller": leader == controller,
        "new_leader": wait_for("new leader in Metadata", new_leader, FAILOVER_TIMEOUT_S),
        "failover_s": round(acked_at - killed_at, 3),
        "first_ack_s": round(first_any - killed_at, 3),
        "records_acked": len(loop.acked), "delivery_errors": len(loop.failed),
        "delivery_error_kinds": sorted({e for _, _, e in loop.failed}),
        "client_errors": len(loop.client_errors),
    }
    node.start(START_TIMEOUT_S)
    result["restart_s"] = round(time.monotonic() - node.started_at, 3)
    return result


def create_topic_on(bootstrap: str, name: str) -> str | None:
    """CreateTopics of ``name`` (1 partition, replication factor 1) sent to the one broker at
    ``bootstrap``; None when it succeeds, else what went wrong."""
    import datetime
    from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
    from kio.schema.create_topics.v7.response import CreateTopicsResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32, i32Timedelta
    req = CreateTopicsRequest(topics=(CreatableTopic(
        name=TopicName(name), num_partitions=i32(1), replication_factor=i16(1), assignments=(),
        configs=()),), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)))
    try:
        result = roundtrip(bootstrap, req, CreateTopicsResponse, timeout=15).topics[0]
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    if _code(result.error_code) == 0:
        return None
    return f"{getattr(result.error_code, 'name', result.error_code)}: {result.error_message}"


def controller_round(cluster: Cluster, admin, number: int) -> dict:
    old = wait_whole(cluster, admin)
    survivors = [i for i in cluster.nodes if i != old]
    node = cluster.nodes[old]
    killed_at = time.monotonic()
    node.kill()
    reported: dict[str, float | int] = {}

    def watch() -> None:
        deadline = killed_at + FAILOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            new = cluster.active_controller(survivors)
            if new is not None and new != old:
                reported.update(at=time.monotonic(), id=new)
                return
            time.sleep(POLL_S)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    # Straight to the surviving brokers in turn: a client library would route CreateTopics to
    # the controller its Metadata names, which under KRaft may be the killed node until fenced.
    errors: list[str] = []
    created_at = None
    while created_at is None and time.monotonic() < killed_at + FAILOVER_TIMEOUT_S:
        target = cluster.nodes[survivors[len(errors) % len(survivors)]].bootstrap
        error = create_topic_on(target, f"controller-failover-{number}-{len(errors)}")
        if error is None:
            created_at = time.monotonic()
        else:
            errors.append(error)
            time.sleep(POLL_S)    # pacing between attempts that fail at once
    watcher.join(FAILOVER_TIMEOUT_S)
    if created_at is None or "at" not in reported:
        raise TimeoutError(f"controller failover did not complete within {FAILOVER_TIMEOUT_S} s "
                           f"(new controller: {reported.get('id')}, CreateTopics errors: "
                           f"{errors[-3:]})")
    result = {
        "round": number, "killed": old, "new_controller": reported["id"],
        "controller_s": round(reported["at"] - killed_at, 3),
        "create_topics_s": round(created_at - killed_at, 3),
        "failover_s": round(max(reported["at"], created_at) - killed_at, 3),
        "create_topics_errors": len(errors), "create_topics_error_kinds": sorted(set(errors)),
    }
    node.start(START_TIMEOUT_S)
    result["restart_s"] = round(time.monotonic() - node.started_at, 3)
    return result


def create_failover_topic(cluster: Cluster, admin) -> None:
    """``failover`` with the active controller last in its replica list, so that leadership
    (first live replica in the ISR) stays off the controller while the controller is alive."""
    from confluent_kafka.admin import NewTopic
    controller = wait_for("active controller", lambda: cluster.active_controller(cluster.nodes),
                          WHOLE_TIMEOUT_S)
    replicas = [i for i in cluster.nodes if i != controller] + [controller]
    topic = NewTopic(TOPIC, 1, replica_assignment=[replicas], config={"min.insync.replicas": "2"})
    admin.create_topics([topic], request_timeout=30)[TOPIC].result(60)


def summarize(rounds: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: {"median": statistics.median(r[k] for r in rounds),
                "min": min(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
            for k in keys if rounds}


def leader_line(r: dict) -> str:
    return (f"leader round {r['round']}: killed node {r['killed']} (controller too: "
            f"{'yes' if r['leader_was_controller'] else 'no'}), new leader {r['new_leader']}; "
            f"first ack of a record produced after the kill {r['failover_s']:.3f} s, of any "
            f"record {r['first_ack_s']:.3f} s; {r['delivery_errors']} delivery errors, "
            f"{r['client_errors']} client errors; restart {r['restart_s']:.1f} s")


def controller_line(r: dict) -> str:
    return (f"controller round {r['round']}: killed node {r['killed']}, new controller "
            f"{r['new_controller']} reported after {r['controller_s']:.3f} s, CreateTopics ok "
            f"after {r['create_topics_s']:.3f} s ({r['create_topics_errors']} failed attempts); "
            f"failover {r['failover_s']:.3f} s; restart {r['restart_s']:.1f} s")


def cluster_arguments(description: str | None) -> argparse.ArgumentParser:
    """The options every three-node benchmark takes (system, rounds, where, what to override)."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", choices=("kafka", "strata"), required=True)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each kind (default 3)")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")
    ap.add_argument("--dir", type=Path, help="data directory (default: a temporary one, removed)")
    ap.add_argument("--kafka-libs", help="Kafka's jars (default: make kafka-dist's cache)")
    ap.add_argument("--config", type=Path, default=REPO_ROOT / "config" / "server.properties",
                    help="Strata's --config (default: config/server.properties)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker property for every node (e.g. zookeeper.session.timeout.ms=9000)")
    return ap


def make_cluster(args: argparse.Namespace, name: str) -> tuple["Cluster", Path]:
    """The three nodes ``cluster_arguments`` describe, not started; and their data dir."""
    overrides = dict(item.split("=", 1) for item in args.override)
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"{name}-{args.system}-"))
    if args.system == "kafka":
        libs, why = find_kafka_libs(args.kafka_libs)
        if libs is None:
            raise SystemExit(why)
        return KafkaCluster(root, libs, overrides), root
    return StrataCluster(root, args.config, overrides), root


def main(argv: list[str] | None = None) -> int:
    ap = cluster_arguments(__doc__)
    ap.add_argument("--kinds", choices=("leader", "controller", "both"), default="both")
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient
    cluster, root = make_cluster(args, "failover")
    leader_rounds: list[dict] = []
    controller_rounds: list[dict] = []
    try:
        log(f"starting three {cluster.system} nodes under {root}")
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        create_failover_topic(cluster, admin)
        if args.kinds in ("leader", "both"):
            for n in range(1, args.rounds + 1):
                leader_rounds.append(leader_round(cluster, admin, n))
                print(leader_line(leader_rounds[-1]), flush=True)
        if args.kinds in ("controller", "both"):
            for n in range(1, args.rounds + 1):
                controller_rounds.append(controller_round(cluster, admin, n))
                print(controller_line(controller_rounds[-1]), flush=True)
        wait_whole(cluster, admin)
    except BaseException:
        for i, node in cluster.nodes.items():
            log(f"--- node {i} ({node.log_path}) ---\n{node.output_tail(15)}")
        raise
    finally:
        cluster.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    summary = {"leader_failover": summarize(leader_rounds, ("failover_s", "first_ack_s")),
               "controller_failover": summarize(controller_rounds,
                                                ("controller_s", "create_topics_s", "failover_s"))}
    for kind, stats in summary.items():
        for key, s in stats.items():
            print(f"{kind} {key}: median {s['median']:.3f} s (min {s['min']:.3f}, "
                  f"max {s['max']:.3f}) over {args.rounds} rounds")
    if args.json:
        args.json.write_text(json.dumps({
            "system": cluster.system, "version": cluster.version(),
            "command": shlex.join(["python", "-m", "benchmarks.failover",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "leader_failover": leader_rounds,
            "controller_failover": controller_rounds, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
