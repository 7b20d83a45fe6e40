"""Replicated produce and follower catch-up on a three-node cluster on this machine:

    python -m benchmarks.replication --system kafka|strata --rounds 3 [--json F]
        [--workloads produce,latency,catchup]

The clusters are failover.py's (``KafkaCluster``: three KRaft nodes in combined mode;
``StrataCluster``: three ``strata serve`` with ZooKeeper), every setting not named here the
system's default. Records are 1 KiB of random bytes, no key, no compression; MiB/s counts
record value bytes (N x 1024).

produce
    A topic with replication factor 3 and ``min.insync.replicas=2``, once with one partition
    and once with six (a fresh topic each round). One confluent-kafka producer with
    workloads.py's settings (acks=all, idempotence on, linger.ms 5, batch.size 1 MB, no
    compression) sends ``--records`` records as fast as it can; throughput is records over the
    time from the first produce() to the end of flush(), after one record delivered untimed
    (connections, leaders, the producer id). Latency is each record's
    ``Message.latency()``: librdkafka's time from produce() to the delivery report. The
    producer is never throttled, so the latency includes the wait in librdkafka's own queue
    (up to queue.buffering.max.messages, 100,000 records) and says as much about that queue as
    about the brokers. Each round then checks that the three replicas of every partition
    report the same log end offset, summing to the records acknowledged.

latency
    What a rate-limited producer waits for an acks=all acknowledgement, so that the brokers'
    latency is measured rather than a queue's. For each ``--partitions`` count a fresh topic
    (replication factor 3, ``min.insync.replicas=2``) and one confluent-kafka producer with
    workloads.py's settings but ``linger.ms`` ``--linger-ms`` (default 1): acks=all,
    idempotence on, batch.size 1 MB, no compression. It offers ``--latency-rate`` records/s
    (default 2,000 of 1 KiB: 2 MiB/s, well under what both systems sustain flat out) on a fixed
    schedule (record i due at t0 + i/rate, whatever the acknowledgements do), first for
    ``--latency-warmup-s`` (default 10) untimed, then for ``--latency-seconds`` (default 20)
    timed, on the same producer and topic. A record's latency is its ``Message.latency()``:
    librdkafka's time from produce() to the delivery report. p50/p99/p99.9/max are over the
    timed records; ``achieved records/s`` says whether the schedule was kept (a producer that
    falls behind sends late, and its latency no longer says what the brokers did). Several
    rates (``--latency-rate 2000,10000``) run one after another, each on its own topic. Each
    round records ``uptime`` (the load averages) before and after it: on a shared machine the
    tails say as much about the load as about the brokers. ``brokers_cpu_cores`` is the three
    broker processes' CPU (user + system, from /proc, the JVMs' included) over the round,
    warm-up included, divided by its wall time. After produce rounds, the latency rounds start
    once the produce topics' files are gone: both systems delete them 60 s after the topic
    (``file.delete.delay.ms``), and removing gigabytes stalls every writer on the disk.

catch-up
    A topic with one partition, replication factor 3, ``min.insync.replicas=2``, its replicas
    assigned so that the follower stopped is not the active controller. The follower's
    process gets SIGKILL; ``--backlog-mib`` of records are produced (workloads.produce_throughput,
    acks=1, so that the backlog does not wait for the leader to drop the dead follower from the
    ISR); once the cluster's Metadata no longer lists the follower (Kafka fenced it after
    broker.session.timeout.ms, Strata's ZooKeeper session expired: a Strata broker restarted
    before that exits, as Kafka's does in ZooKeeper mode, on its old /brokers/ids ephemeral),
    the follower is restarted. ``catchup_s`` is the time from the restart (process launched)
    until the follower's own log end offset equals the leader's, both read with ListOffsets as
    the debugging replica (-2) sent to the replica itself; ``catchup_ready_s`` the same from
    when the restarted broker first answers Metadata (startup apart; ``first_log_end`` is the
    follower's log end offset when it first answers ListOffsets). MB/s is backlog bytes
    (records x 1024) / 10^6 / time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.brokers import log
from benchmarks.cpu import CpuMeter
from benchmarks.failover import (START_TIMEOUT_S, WHOLE_TIMEOUT_S, Cluster, cluster_arguments,
                                   make_cluster, wait_for)
from benchmarks.workloads import (MIB, percentile, produce_throughput, producer_config,
                                    random_values, send_flat_out)
from strata.common.errors import code_of
from strata.net.connection import roundtrip

RECORD_SIZE = 1024
CATCHUP_TIMEOUT_S = 600
WORKLOADS = ("produce", "latency", "catchup")


def uptime() -> str:
    """``uptime``'s line (the load averages), to record beside each measurement."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: %.2f, %.2f, %.2f" % os.getloadavg()


def source_tree() -> str:
    """``git describe --always --dirty`` of the repository the brokers run from (Strata runs the
    working tree, which others may be editing), or "?" outside a git checkout."""
    from benchmarks.brokers import REPO_ROOT
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def log_end(bootstrap: str, topic: str, partition: int = 0) -> int | None:
    """The log end offset of the replica at ``bootstrap`` (ListOffsets latest as the debugging
    replica, -2, which a follower answers too); None while it does not answer."""
    from kio.schema.list_offsets.v7.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v7.response import ListOffsetsResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i32, i64
    req = ListOffsetsRequest(replica_id=i32(-2), isolation_level=0, topics=(ListOffsetsTopic(
        name=TopicName(topic), partitions=(ListOffsetsPartition(
            partition_index=i32(partition), current_leader_epoch=i32(-1),
            timestamp=i64(-1)),)),))
    try:
        p = roundtrip(bootstrap, req, ListOffsetsResponse, timeout=2).topics[0].partitions[0]
    except OSError:
        return None
    if code_of(p.error_code) != 0:
        return None
    return int(p.offset)


def broker_ids(admin) -> set[int]:
    try:
        return set(admin.list_topics(timeout=5).brokers)
    except Exception:  # noqa: BLE001 - look again
        return set()


def topic_in_sync(admin, topic: str, brokers: set[int]) -> dict | None:
    """{partition: leader} once every partition of ``topic`` has a leader and all of
    ``brokers``' replicas in its ISR, else None."""
    try:
        t = admin.list_topics(topic, timeout=5).topics.get(topic)
    except Exception:  # noqa: BLE001 - a broker restarting; look again
        return None
    if t is None or t.error is not None or not t.partitions:
        return None
    if any(p.leader < 0 or set(p.isrs) != set(p.replicas) or set(p.replicas) - brokers
           for p in t.partitions.values()):
        return None
    return {i: p.leader for i, p in t.partitions.items()}


def create_topic(admin, cluster: Cluster, label: str, partitions: int,
                 assignment: list[int] | None = None) -> str:
    """A fresh topic with RF 3 and min.insync.replicas 2; its name once its ISRs are full."""
    from confluent_kafka.admin import NewTopic
    name = f"repl-{label}-{uuid.uuid4().hex[:6]}"
    config = {"min.insync.replicas": "2"}
    if assignment is not None:
        topic = NewTopic(name, partitions, replica_assignment=[assignment], config=config)
    else:
        topic = NewTopic(name, partitions, replication_factor=3, config=config)
    admin.create_topics([topic], request_timeout=30)[name].result(60)
    wait_for(f"{name} in sync", lambda: topic_in_sync(admin, name, set(cluster.nodes)),
             WHOLE_TIMEOUT_S, 0.1)
    return name


def delete_topic(admin, name: str) -> None:
    """Frees the disk between rounds; a failure here is reported but does not end the run."""
    try:
        admin.delete_topics([name], request_timeout=30)[name].result(60)
    except Exception as e:  # noqa: BLE001
        log(f"deleting {name}: {e}")


def produce_with_latency(bootstrap: str, topic: str, n: int, values: list[bytes]) -> dict:
    """``n`` records, acks=all, as fast as the producer takes them; throughput and the
    per-record latency percentiles."""
    from confluent_kafka import Producer
    latencies: list[float] = []
    errors: list = []

    def report(err, msg) -> None:
        if err is None:
            latencies.append(msg.latency())
        else:
            errors.append(err)
    p = Producer({**producer_config(bootstrap, "all"), "on_delivery": report})
    # one record delivered before the clock starts: connections, leaders and the idempotent
    # producer id (Kafka's InitProducerId can wait for its transaction coordinator to load)
    p.produce(topic, values[0])
    p.flush(60)
    if len(latencies) != 1:
        raise RuntimeError(f"produce warm-up record: {errors[:1] or 'not delivered'}")
    latencies.clear()
    remaining, elapsed = send_flat_out(p, topic, n, values)
    if remaining or errors or len(latencies) != n:
        raise RuntimeError(f"produce: {len(latencies)}/{n} delivered, {len(errors)} errors "
                           f"(first: {errors[:1]}), {remaining} undelivered")
    xs = sorted(x * 1000 for x in latencies)
    return {"MiB/s": round(n * len(values[0]) / elapsed / MIB, 2),
            "records/s": round(n / elapsed), "seconds": round(elapsed, 2), "records": n,
            "p50_ms": round(percentile(xs, 50), 1), "p99_ms": round(percentile(xs, 99), 1),
            "max_ms": round(xs[-1], 1)}


def paced_latency(bootstrap: str, topic: str, rate: float, seconds: float, warmup_s: float,
                  values: list[bytes], linger_ms: float) -> dict:
    """Records offered at ``rate`` per second on a fixed schedule for ``warmup_s`` (untimed)
    then ``seconds``; the timed records' ``Message.latency()`` percentiles."""
    from confluent_kafka import Producer
    warm = int(rate * warmup_s)
    count = warm + max(1, int(rate * seconds))
    latency = [-1.0] * count
    errors: list = []

    def report(i, err, msg) -> None:
        if err is None:
            latency[i] = msg.latency()
        else:
            errors.append(err)
    p = Producer({**producer_config(bootstrap, "all"), "linger.ms": linger_ms})
    # connections, leaders and the idempotent producer id before the schedule starts
    p.produce(topic, values[0], on_delivery=lambda err, msg: err and errors.append(err))
    p.flush(60)
    if errors:
        raise RuntimeError(f"latency: the first record failed: {errors[0]}")
    produce, poll, mask, cb = p.produce, p.poll, len(values) - 1, functools.partial
    now = time.perf_counter
    t0 = now()
    timed_from = None
    i = 0
    while i < count:
        due = min(count, int((now() - t0) * rate) + 1)
        while i < due:
            if i == warm:
                timed_from = now()
            produce(topic, values[i & mask], on_delivery=cb(report, i))
            i += 1
        # serve delivery reports until the next record is due (librdkafka waits in whole ms)
        wait = t0 + i / rate - now()
        poll(max(1, math.ceil(wait * 1000)) / 1000 if wait > 0 else 0)
    send_span = now() - (timed_from if timed_from is not None else t0)
    remaining = p.flush(60)
    timed = latency[warm:]
    if errors or remaining or min(latency) < 0:
        raise RuntimeError(f"latency: {len(errors)} errors (first: {errors[:1]}), {remaining} "
                           f"undelivered, {sum(x < 0 for x in latency)} without a report")
    xs = sorted(x * 1000 for x in timed)
    return {"rate": rate, "records": len(timed), "warmup_records": warm,
            "achieved_records/s": round(len(timed) / send_span, 1),
            "p50_ms": round(percentile(xs, 50), 2), "p99_ms": round(percentile(xs, 99), 2),
            "p99.9_ms": round(percentile(xs, 99.9), 2), "max_ms": round(xs[-1], 2),
            "mean_ms": round(statistics.fmean(xs), 2)}


def wait_for_deleted_logs(root: Path, timeout: float = 180) -> float:
    """Seconds waited until no log directory under ``root`` awaits deletion. Both systems
    delete a topic's files ``file.delete.delay.ms`` (60 s) after the topic, from a directory
    renamed ``...-delete``; removing the gigabytes of a produce round stalls writers on the same
    disk for up to ~100 ms (seen as one burst of 40-130 ms acknowledgements in a latency round
    started right after), so the latency rounds wait for it, whichever system runs."""
    started = time.monotonic()
    wait_for("deleted topics' files removed",
             lambda: not any(root.glob("*/kafka-logs/*-delete")), timeout, 0.5)
    return time.monotonic() - started


def latency_round(cluster: Cluster, admin, partitions: int, number: int, rate: float,
                  args, values: list[bytes]) -> dict:
    topic = create_topic(admin, cluster, f"lat{partitions}", partitions)
    load_before = uptime()
    meters = [CpuMeter(node.pid) for node in cluster.nodes.values()]
    try:
        with contextlib.ExitStack() as stack:
            for meter in meters:
                stack.enter_context(meter)
            started = time.monotonic()
            result = {"round": number, "partitions": partitions, "linger_ms": args.linger_ms,
                      **paced_latency(cluster.bootstrap(), topic, rate, args.latency_seconds,
                                      args.latency_warmup_s, values, args.linger_ms)}
        # the three brokers' CPU over the round (warm-up included), in cores
        result["brokers_cpu_cores"] = round(
            sum(m.seconds for m in meters) / (time.monotonic() - started), 3)
    finally:
        delete_topic(admin, topic)
    result.update(uptime_before=load_before, uptime_after=uptime())
    return result


def replicas_equal(cluster: Cluster, admin, topic: str) -> int | None:
    """The records in ``topic`` once every partition's three replicas report the same log end
    offset, else None."""
    t = admin.list_topics(topic, timeout=5).topics[topic]
    total = 0
    for i, p in t.partitions.items():
        ends = {log_end(cluster.nodes[r].bootstrap, topic, i) for r in p.replicas}
        if len(ends) != 1 or None in ends:
            return None
        total += ends.pop()
    return total


def produce_round(cluster: Cluster, admin, partitions: int, number: int, n: int,
                  values: list[bytes]) -> dict:
    topic = create_topic(admin, cluster, f"p{partitions}", partitions)
    try:
        result = {"round": number, "partitions": partitions,
                  **produce_with_latency(cluster.bootstrap(), topic, n, values)}
        # acks=all acknowledged them, so all three replicas must hold them (and the warm-up record)
        total = wait_for("replicas' log ends equal", lambda: replicas_equal(cluster, admin, topic),
                         WHOLE_TIMEOUT_S, 0.1)
        if total != n + 1:
            raise RuntimeError(f"{topic}: replicas hold {total} records, {n + 1} were acknowledged")
    finally:
        delete_topic(admin, topic)
    return result


def catchup_round(cluster: Cluster, admin, number: int, backlog_records: int,
                  values: list[bytes]) -> dict:
    controller = wait_for("active controller", lambda: cluster.active_controller(cluster.nodes),
                          WHOLE_TIMEOUT_S)
    others = [i for i in cluster.nodes if i != controller]
    # the follower stopped alternates between the two nodes that are not the controller
    victim = others[number % 2]
    leader = others[(number + 1) % 2]
    topic = create_topic(admin, cluster, "catchup", 1, [leader, controller, victim])
    try:
        node = cluster.nodes[victim]
        node.kill()
        killed_at = time.monotonic()
        produced = produce_throughput(cluster.bootstrap([leader, controller]), topic,
                                      backlog_records, values, "1")
        leader_end = log_end(cluster.nodes[leader].bootstrap, topic)
        behind = log_end(cluster.nodes[victim].bootstrap, topic)   # None: it is down
        if leader_end is None or behind is not None:
            raise RuntimeError(f"leader log end {leader_end}, stopped follower answers {behind}")
        # A restart before the cluster has noticed the death fails on Strata as on Kafka's
        # ZooKeeper mode (its /brokers/ids ephemeral still belongs to the old session).
        gone_at = wait_for(f"broker {victim} gone from Metadata",
                           lambda: victim not in broker_ids(admin) and time.monotonic(),
                           WHOLE_TIMEOUT_S, 0.1)
        node.launch()
        ready_at = None
        first_seen = None
        deadline = node.started_at + CATCHUP_TIMEOUT_S
        while True:
            now = time.monotonic()
            if ready_at is None and node._answers_metadata():   # noqa: SLF001 - Broker's own check
                ready_at = time.monotonic()
            end = log_end(node.bootstrap, topic)
            if end is not None and first_seen is None:
                first_seen = (time.monotonic(), end)
            if end is not None and end >= leader_end:
                done_at = time.monotonic()
                break
            if node.proc.poll() is not None:
                raise RuntimeError(f"follower {victim} exited with {node.proc.returncode}")
            if now > deadline:
                raise TimeoutError(f"follower {victim} at {end} of {leader_end} after "
                                   f"{CATCHUP_TIMEOUT_S} s")
            time.sleep(0.02)
        if ready_at is None:
            ready_at = done_at
        wait_for(f"{topic} ISR whole again",
                 lambda: topic_in_sync(admin, topic, set(cluster.nodes)), WHOLE_TIMEOUT_S, 0.1)
        isr_at = time.monotonic()
    finally:
        delete_topic(admin, topic)
    nbytes = backlog_records * RECORD_SIZE
    took = done_at - node.started_at
    took_ready = done_at - ready_at
    return {"round": number, "leader": leader, "follower": victim, "controller": controller,
            "backlog_records": backlog_records, "backlog_MiB": round(nbytes / MIB, 1),
            "leader_log_end": leader_end,
            "restarted_after_kill_s": round(node.started_at - killed_at, 2),
            "gone_from_metadata_s": round(gone_at - killed_at, 2),
            "backlog_produce_MiB/s": round(produced["MiB/s"], 2),
            "ready_s": round(ready_at - node.started_at, 3),
            "first_log_end_s": round(first_seen[0] - node.started_at, 3),
            "first_log_end": first_seen[1],
            "catchup_s": round(took, 3), "catchup_MB/s": round(nbytes / 1e6 / took, 2),
            "catchup_ready_s": round(took_ready, 3),
            "catchup_ready_MB/s": round(nbytes / 1e6 / took_ready, 2) if took_ready > 0 else None,
            "isr_rejoin_s": round(isr_at - node.started_at, 3)}


def summarize(rounds: list[dict], keys: tuple[str, ...]) -> dict:
    """Median, min and max of each key over the rounds that have a value for it."""
    out = {}
    for k in keys:
        xs = [r[k] for r in rounds if r.get(k) is not None]
        if xs:
            out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return out


def produce_line(r: dict) -> str:
    return (f"produce {r['partitions']} partition(s) round {r['round']}: {r['records']} records "
            f"in {r['seconds']:.2f} s, {r['MiB/s']:.2f} MiB/s, {r['records/s']} records/s; "
            f"latency p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms")


def latency_line(r: dict) -> str:
    return (f"latency {r['partitions']} partition(s) at {r['rate']:g} records/s round "
            f"{r['round']}: {r['records']} timed records, achieved {r['achieved_records/s']} "
            f"records/s; p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, p99.9 "
            f"{r['p99.9_ms']:.2f} ms, max {r['max_ms']:.2f} ms; brokers' CPU "
            f"{r['brokers_cpu_cores']:.2f} cores; {r['uptime_after']}")


def catchup_line(r: dict) -> str:
    return (f"catch-up round {r['round']}: follower {r['follower']} (leader {r['leader']}) "
            f"{r['backlog_MiB']} MiB behind; up after {r['ready_s']:.2f} s, caught up "
            f"{r['catchup_s']:.2f} s after the restart ({r['catchup_MB/s']:.2f} MB/s), "
            f"{r['catchup_ready_s']:.2f} s after it answered ({r['catchup_ready_MB/s']} MB/s); "
            f"back in the ISR after {r['isr_rejoin_s']:.2f} s; backlog produced at "
            f"{r['backlog_produce_MiB/s']:.2f} MiB/s")


def main(argv: list[str] | None = None) -> int:
    ap = cluster_arguments(__doc__)
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="which to run, comma separated, in this order: produce, latency, "
                         "catchup (default all three)")
    ap.add_argument("--kinds", choices=("produce", "catchup", "both"),
                    help="the older selection: produce, catchup or both (without latency); "
                         "--workloads wins when both are given")
    ap.add_argument("--partitions", default="1,6",
                    help="partition counts of the produce and latency topics (default 1,6)")
    ap.add_argument("--records", default="300000",
                    help="records of 1 KiB per produce round: one count, or one per --partitions "
                         "entry (default 300000)")
    ap.add_argument("--backlog-mib", type=int, default=200,
                    help="the stopped follower's backlog in MiB (default 200)")
    ap.add_argument("--latency-rate", default="2000",
                    help="records/s the latency producer offers; several comma separated run "
                         "in turn (default 2000)")
    ap.add_argument("--latency-seconds", type=float, default=20,
                    help="timed seconds of each latency round (default 20)")
    ap.add_argument("--latency-warmup-s", type=float, default=10,
                    help="untimed seconds at the same rate before (default 10)")
    ap.add_argument("--linger-ms", type=float, default=1,
                    help="the latency producer's linger.ms (default 1)")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.kinds is not None and not any(a.startswith("--workloads") for a in given):
        args.workloads = {"both": "produce,catchup"}.get(args.kinds, args.kinds)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - set(WORKLOADS):
        ap.error(f"--workloads: a comma separated selection of {', '.join(WORKLOADS)}")
    rates = [float(x) for x in args.latency_rate.split(",")]
    partition_counts = [int(x) for x in args.partitions.split(",")]
    record_counts = [int(x) for x in args.records.split(",")]
    if len(record_counts) == 1:
        record_counts *= len(partition_counts)
    if len(record_counts) != len(partition_counts):
        ap.error("--records: one count, or one per --partitions entry")

    from confluent_kafka.admin import AdminClient
    cluster, root = make_cluster(args, "replication")
    values = random_values(RECORD_SIZE)
    backlog_records = args.backlog_mib * MIB // RECORD_SIZE
    started_tree = source_tree()
    produce_rounds: list[dict] = []
    latency_rounds: list[dict] = []
    catchup_rounds: list[dict] = []
    try:
        log(f"starting three {cluster.system} nodes under {root}")
        cluster.start()
        # librdkafka's admin client is a producer handle: left to its default it refreshes the
        # topics it has seen with auto-creation allowed, re-creating each round's deleted topic
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(),
                             "allow.auto.create.topics": False})
        wait_for("active controller", lambda: cluster.active_controller(cluster.nodes),
                 START_TIMEOUT_S)
        log(uptime())
        if "produce" in workloads:
            for partitions, records in zip(partition_counts, record_counts):
                for n in range(1, args.rounds + 1):
                    produce_rounds.append(produce_round(cluster, admin, partitions, n,
                                                        records, values))
                    print(produce_line(produce_rounds[-1]), flush=True)
        if "latency" in workloads:
            if produce_rounds:
                waited = wait_for_deleted_logs(root)
                log(f"the produce topics' files deleted; waited {waited:.1f} s")
            for rate in rates:
                for partitions in partition_counts:
                    for n in range(1, args.rounds + 1):
                        latency_rounds.append(latency_round(cluster, admin, partitions, n, rate,
                                                            args, values))
                        print(latency_line(latency_rounds[-1]), flush=True)
        if "catchup" in workloads:
            for n in range(1, args.rounds + 1):
                catchup_rounds.append(catchup_round(cluster, admin, n, backlog_records, values))
                print(catchup_line(catchup_rounds[-1]), flush=True)
    except BaseException:
        for i, node in cluster.nodes.items():
            log(f"--- node {i} ({node.log_path}) ---\n{node.output_tail(15)}")
        raise
    finally:
        cluster.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    summary = {
        "produce": {str(p): summarize([r for r in produce_rounds if r["partitions"] == p],
                                      ("MiB/s", "records/s", "p50_ms", "p99_ms"))
                    for p in partition_counts if "produce" in workloads},
        "latency": {f"{p}@{rate:g}": summarize(
            [r for r in latency_rounds if r["partitions"] == p and r["rate"] == rate],
            ("p50_ms", "p99_ms", "p99.9_ms", "max_ms", "achieved_records/s", "brokers_cpu_cores"))
            for rate in rates for p in partition_counts if "latency" in workloads},
        "catchup": summarize(catchup_rounds, ("catchup_s", "catchup_MB/s", "catchup_ready_MB/s")),
    }
    for p, stats in summary["produce"].items():
        for key, s in stats.items():
            print(f"produce {p} partition(s) {key}: median {s['median']} (min {s['min']}, "
                  f"max {s['max']}) over {args.rounds} rounds")
    for label, stats in summary["latency"].items():
        p, rate = label.split("@")
        for key, s in stats.items():
            print(f"latency {p} partition(s) at {rate} records/s {key}: median {s['median']} "
                  f"(min {s['min']}, max {s['max']}) over {args.rounds} rounds")
    for key, s in summary["catchup"].items():
        print(f"catch-up {key}: median {s['median']} (min {s['min']}, max {s['max']}) "
              f"over {args.rounds} rounds")
    if args.json:
        args.json.write_text(json.dumps({
            "system": cluster.system, "version": cluster.version(), "source": started_tree,
            "command": shlex.join(["python", "-m", "benchmarks.replication",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "record_size": RECORD_SIZE, "uptime_end": uptime(),
            "produce": produce_rounds, "latency": latency_rounds, "catchup": catchup_rounds,
            "summary": summary},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
