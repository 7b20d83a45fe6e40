"""Creating many topics at once on a three-node cluster, and how responsive the brokers stay:

    python -m benchmarks.topic_creation --system kafka|strata --rounds 3 [--topics 100]
        [--partitions 10] [--json F]

The clusters are ``benchmarks.failover``'s: Kafka is three KRaft nodes in combined mode, Strata
three ``strata serve`` processes coordinated by one ZooKeeper. Each round sends one CreateTopics
of ``--topics`` topics of ``--partitions`` partitions at replication factor 3 (confluent-kafka's
AdminClient, operation timeout 120 s) to the cluster and measures

``created_s``
    from the request to every topic's result (the CreateTopics answer);
``ready_s``
    from the request until one Metadata request shows every topic with all its partitions
    led and their ISR all three replicas;
``probe_max_s``
    the slowest ApiVersions answer of any broker during the round (each broker asked in turn,
    one request in flight, from the request until ``ready_s``): a broker whose event loop
    stalls answers late;
``stalls``
    (Strata) the event-loop watchdog's stall reports in the brokers' logs during the round.

The round's topics are then deleted (``delete_s``, until Metadata lists none of them) so every
round starts from the same cluster.

``--restarts N`` then creates the topics once more, keeps them, and N times stops every node
(SIGTERM, one after the other; Strata's ZooKeeper keeps running) and starts them all again,
measuring from the start: ``up_s`` (every node answers Metadata), ``ready_s`` (every kept
partition led, its ISR all three replicas) and ``coordinator_s`` (FindCoordinator of a group
answered without error by every node).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import threading
import time

from benchmarks.brokers import log
from benchmarks.failover import cluster_arguments, make_cluster, summarize, wait_for
from strata.net.connection import roundtrip

OPERATION_TIMEOUT_S = 120
READY_TIMEOUT_S = 300
STALL_LINE = re.compile(r"stalled: .*the event loop")


class Probe(threading.Thread):
    """ApiVersions to each broker in turn; the slowest answer (a failure counts as its time)."""

    def __init__(self, bootstraps: list[str]) -> None:
        super().__init__(daemon=True, name="probe")
        self.bootstraps = bootstraps
        self.slowest = 0.0
        self.failures = 0
        self._done = threading.Event()

    def run(self) -> None:
        from kio.schema.api_versions.v3.request import ApiVersionsRequest
        from kio.schema.api_versions.v3.response import ApiVersionsResponse
        req = ApiVersionsRequest(client_software_name="probe", client_software_version="1")
        while not self._done.is_set():
            for bootstrap in self.bootstraps:
                start = time.monotonic()
                try:
                    roundtrip(bootstrap, req, ApiVersionsResponse, timeout=30)
                except OSError:
                    self.failures += 1
                self.slowest = max(self.slowest, time.monotonic() - start)
            self._done.wait(0.05)

    def stop(self) -> float:
        self._done.set()
        self.join(60)
        return self.slowest


def all_ready(admin, names: set[str], partitions: int) -> bool:
    try:
        md = admin.list_topics(timeout=10)
    except Exception:  # noqa: BLE001 - a busy broker; look again
        return False
    for name in names:
        t = md.topics.get(name)
        if t is None or t.error is not None or len(t.partitions) != partitions:
            return False
        for p in t.partitions.values():
            if p.leader < 0 or len(p.isrs) != 3:
                return False
    return True


def none_left(admin, names: set[str]) -> bool:
    try:
        return not names.intersection(admin.list_topics(timeout=10).topics)
    except Exception:  # noqa: BLE001
        return False


def log_sizes(cluster) -> dict[int, int]:
    return {i: (n.log_path.stat().st_size if n.log_path.exists() else 0)
            for i, n in cluster.nodes.items()}


def stalls_since(cluster, sizes: dict[int, int]) -> int:
    found = 0
    for i, node in cluster.nodes.items():
        if not node.log_path.exists():
            continue
        with open(node.log_path, "rb") as f:
            f.seek(sizes.get(i, 0))
            found += len(STALL_LINE.findall(f.read().decode(errors="replace")))
    return found


def creation_round(cluster, admin, number: int, topics: int, partitions: int) -> dict:
    from confluent_kafka.admin import NewTopic
    names = [f"tc-{number}-{i}" for i in range(topics)]
    sizes = log_sizes(cluster)
    probe = Probe([cluster.nodes[i].bootstrap for i in sorted(cluster.nodes)])
    probe.start()
    start = time.monotonic()
    futures = admin.create_topics([NewTopic(n, partitions, 3) for n in names],
                                  operation_timeout=OPERATION_TIMEOUT_S,
                                  request_timeout=OPERATION_TIMEOUT_S + 30)
    errors = {}
    for name, fut in futures.items():
        try:
            fut.result()
        except Exception as e:  # noqa: BLE001 - reported with the round
            errors[name] = str(e)
    created = time.monotonic() - start
    wait_for(f"{topics} topics ready", lambda: all_ready(admin, set(names), partitions),
             READY_TIMEOUT_S, 0.2)
    ready = time.monotonic() - start
    slowest = probe.stop()
    stalls = stalls_since(cluster, sizes)
    t = time.monotonic()
    for fut in admin.delete_topics(names, operation_timeout=OPERATION_TIMEOUT_S).values():
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - waited for below
            pass
    wait_for("topics deleted", lambda: none_left(admin, set(names)), READY_TIMEOUT_S, 0.5)
    return {"round": number, "created_s": round(created, 3), "ready_s": round(ready, 3),
            "probe_max_s": round(slowest, 3), "probe_failures": probe.failures,
            "stalls": stalls if cluster.system == "strata" else None,
            "errors": len(errors), "first_error": next(iter(errors.values()), None),
            "delete_s": round(time.monotonic() - t, 3)}


def coordinators_found(cluster) -> bool:
    from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
    from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
    req = FindCoordinatorRequest(key="bench-group", key_type=0)
    for node in cluster.nodes.values():
        try:
            answer = roundtrip(node.bootstrap, req, FindCoordinatorResponse, timeout=10)
        except OSError:
            return False
        if int(getattr(answer.error_code, "value", answer.error_code)) != 0:
            return False
    return True


def restart_round(cluster, admin, number: int, names: set[str], partitions: int) -> dict:
    from benchmarks.failover import Cluster
    for node in cluster.nodes.values():
        node.stop()
    start = time.monotonic()
    Cluster.start(cluster)   # the same nodes again (Strata's ZooKeeper still runs)
    up = time.monotonic() - start
    wait_for("kept topics ready", lambda: all_ready(admin, names, partitions), READY_TIMEOUT_S, 0.2)
    ready = time.monotonic() - start
    wait_for("group coordinator", lambda: coordinators_found(cluster), READY_TIMEOUT_S, 0.2)
    return {"round": number, "up_s": round(up, 3), "ready_s": round(ready, 3),
            "coordinator_s": round(time.monotonic() - start, 3)}


def line(r: dict) -> str:
    return (f"round {r['round']}: created {r['created_s']:.2f} s, ready {r['ready_s']:.2f} s, "
            f"slowest ApiVersions {r['probe_max_s']:.2f} s, stalls {r['stalls']}, "
            f"errors {r['errors']}, deleted in {r['delete_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = cluster_arguments(__doc__)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--restarts", type=int, default=0, help="full restarts after the rounds")
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient
    cluster, root = make_cluster(args, "topic-creation")
    rounds: list[dict] = []
    restarts: list[dict] = []
    try:
        log(f"starting three {cluster.system} nodes under {root}")
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
        wait_for("three brokers", lambda: len(admin.list_topics(timeout=10).brokers) == 3, 120, 0.2)
        for n in range(1, args.rounds + 1):
            rounds.append(creation_round(cluster, admin, n, args.topics, args.partitions))
            print(line(rounds[-1]), flush=True)
        if args.restarts:
            from confluent_kafka.admin import NewTopic
            kept = {f"kept-{i}" for i in range(args.topics)}
            for fut in admin.create_topics([NewTopic(n, args.partitions, 3) for n in sorted(kept)],
                                           operation_timeout=OPERATION_TIMEOUT_S).values():
                fut.result()
            wait_for("kept topics ready", lambda: all_ready(admin, kept, args.partitions),
                     READY_TIMEOUT_S, 0.2)
            for n in range(1, args.restarts + 1):
                restarts.append(restart_round(cluster, admin, n, kept, args.partitions))
                r = restarts[-1]
                print(f"restart {n}: up {r['up_s']:.2f} s, partitions ready {r['ready_s']:.2f} s, "
                      f"group coordinator {r['coordinator_s']:.2f} s", flush=True)
    except BaseException:
        for i, node in cluster.nodes.items():
            log(f"--- node {i} ({node.log_path}) ---\n{node.output_tail(15)}")
        raise
    finally:
        cluster.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    summary = summarize(rounds, ("created_s", "ready_s", "probe_max_s"))
    if restarts:
        summary["restart"] = summarize(restarts, ("up_s", "ready_s", "coordinator_s"))
    for key, s in summary.items():
        if key == "restart":
            continue
        print(f"{key}: median {s['median']:.3f} s (min {s['min']:.3f}, max {s['max']:.3f}) "
              f"over {args.rounds} rounds")
    if args.json:
        args.json.write_text(json.dumps({
            "system": cluster.system, "version": cluster.version(),
            "command": shlex.join(["python", "-m", "benchmarks.topic_creation",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "rounds": rounds, "restarts": restarts,
            "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
