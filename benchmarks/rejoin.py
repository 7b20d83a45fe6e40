"""A replaced broker rejoining the ISR, with tiered storage and without (KIP-405's test case 3):

    python -m benchmarks.rejoin --system strata|kafka --tiered on|off --data-mib N
        --rounds 3 [--fetch-last-tiered-offset off|on|both] [--json F]

The cluster is failover.py's three nodes (Kafka: three KRaft nodes in combined mode; Strata: three
``strata serve`` with ZooKeeper), every setting not named here the system's default but for the
intervals that make tiering and local retention act within seconds
(``remote.log.manager.task.interval.ms`` 500, ``log.retention.check.interval.ms`` 500,
``log.segment.delete.delay.ms`` 1000) and the remote tier, one directory all nodes share
(Strata: ``rsm.config.storage.url=file://<dir>/remote``; Kafka: the storage test fixtures'
``LocalTieredStorage`` with ``rsm.config.dir=<dir>/remote``). ``__remote_log_metadata`` has
replication factor 3. Kafka's nodes keep their KRaft metadata log in ``metadata.log.dir``
apart from ``log.dirs``, so that a replaced data disk leaves the node a quorum voter (Strata's
metadata is in ZooKeeper).

The topic ``rejoin``: one partition, replication factor 2, its replicas the two nodes that are
not the active controller (leader first), ``segment.bytes`` ``--segment-mib`` (16 MiB; below
1 MiB it is ``internal.segment.bytes``) and, with ``--tiered on``, ``remote.storage.enable=true``
and ``local.retention.bytes`` ``--local-retention-segments`` segments (3). ``--data-mib`` of
1 KiB random records (confluent-kafka, acks=all, idempotent, linger.ms 5, batch.size 1 MB) are
produced once; every round then uses the same data. Before each round the bench waits until the
follower's log end equals the leader's, both are in the ISR and, when tiered, every rolled
segment of the leader is in the remote tier (ListOffsets -5 at least the active segment's base
offset - 1) and local retention has been applied on both replicas (the segments after the oldest
hold at most ``local.retention.bytes`` + one segment).

A round: SIGKILL of the follower; once the cluster has dropped it (gone from Metadata, out of the
ISR), its log directory is deleted (a replaced disk, the same broker id; Kafka's then formatted
with ``kafka-storage format --ignore-formatted`` and the cluster's id, untimed) and the node is
launched. From the launch the bench polls every 20 ms:

- ``ready_s``: the follower first answers a ListOffsets request (startup done);
- ``caught_up_s``: its own log end (ListOffsets -1 as the debugging replica, -2, sent to it)
  equals the leader's;
- ``isr_s``: the leader's Metadata (sent to the leader itself) lists it in the ISR again.

``fetched_MiB`` is the size of the follower's partition directory's ``.log`` files at
``caught_up_s`` (what it copied from the leader; with tiering, the leader's local tail from the
follower's start offset), ``log_dir_MiB`` the disk its whole log directory takes then (as ``du``;
the internal topics' replicas included). ``--fetch-last-tiered-offset`` sets the follower's
``follower.fetch.last.tiered.offset.enable`` (KIP-1023) at each launch: off, the follower
rebuilds from the leader's earliest local offset (KIP-405's BuildingRemoteLogAuxState after
OFFSET_MOVED_TO_TIERED_STORAGE); on, it starts after the highest offset in the remote tier;
``both`` alternates off and on, ``--rounds`` rounds of each.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.brokers import KafkaBroker, find_kafka_libs, free_port, java_command, log
from benchmarks.failover import (NODE_IDS, START_TIMEOUT_S, WHOLE_TIMEOUT_S, Cluster,
                                   KafkaCluster, cluster_arguments, make_cluster, wait_for)
from benchmarks.replication import broker_ids, source_tree, uptime
from benchmarks.workloads import MIB, produce_throughput, random_values
from strata.common.errors import code_of
from strata.common.types import uuid_to_kafka_str
from strata.net.connection import roundtrip

TOPIC = "rejoin"
RECORD_SIZE = 1024
POLL_S = 0.02
REJOIN_TIMEOUT_S = 900
SETTLE_TIMEOUT_S = 1200
LAST_TIERED = "follower.fetch.last.tiered.offset.enable"
LATEST, EARLIEST, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -4, -5

# What both systems get beyond their defaults: tiering and retention acting within seconds.
COMMON = {
    "remote.log.manager.task.interval.ms": "500",
    "log.retention.check.interval.ms": "500",
    "log.segment.delete.delay.ms": "1000",
}


class RejoinKafkaCluster(KafkaCluster):
    """failover.KafkaCluster with each node's KRaft metadata log in ``nodeN/metadata`` apart
    from its ``log.dirs`` (``nodeN/kafka-logs``), so that a wiped data disk keeps the voter."""

    def __init__(self, root: Path, libs: Path, overrides: dict[str, str] | None = None) -> None:
        Cluster.__init__(self)
        self.libs = libs
        self.cluster_id = uuid_to_kafka_str(uuid.uuid4())
        ports = {i: (free_port(), free_port()) for i in NODE_IDS}
        voters = ",".join(f"{i}@127.0.0.1:{ports[i][1]}" for i in NODE_IDS)
        for i in NODE_IDS:
            self.nodes[i] = KafkaBroker(
                root / f"node{i}", libs, node_id=i, port=ports[i][0], controller_port=ports[i][1],
                voters=voters, cluster_id=self.cluster_id,
                overrides={**(overrides or {}), "metadata.log.dir": str(root / f"node{i}" / "metadata")})


# --- requests to one broker ------------------------------------------------------------------

def list_offset(bootstrap: str, timestamp: int, replica_id: int = -2,
                topic: str = TOPIC) -> tuple[int, int] | None:
    """(error code, offset) of a ListOffsets v9 sent to the broker at ``bootstrap`` itself, as
    the debugging replica (-2, which a follower answers) unless told; None if it does not answer."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    req = ListOffsetsRequest(replica_id=BrokerId(replica_id), isolation_level=i8(0), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(0), timestamp=i64(timestamp)),)),))
    try:
        p = roundtrip(bootstrap, req, ListOffsetsResponse, timeout=2).topics[0].partitions[0]
    except (OSError, ValueError, EOFError):
        return None
    return code_of(p.error_code), int(p.offset)


def offset_of(bootstrap: str, timestamp: int, replica_id: int = -2) -> int | None:
    answer = list_offset(bootstrap, timestamp, replica_id)
    return answer[1] if answer is not None and answer[0] == 0 else None


def partition_state(bootstrap: str, topic: str = TOPIC) -> tuple[int, list[int], list[int]] | None:
    """(leader, replicas, isr) of partition 0 as the broker at ``bootstrap`` itself answers
    Metadata v12; None if it does not."""
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
    for t in resp.topics:
        for p in t.partitions:
            if int(p.partition_index) == 0 and code_of(p.error_code) == 0:
                return (int(p.leader_id), [int(r) for r in p.replica_nodes],
                        [int(r) for r in p.isr_nodes])
    return None


# --- the nodes' directories ----------------------------------------------------------------------

def log_dir(cluster: Cluster, node_id: int) -> Path:
    return cluster.nodes[node_id].data_dir / "kafka-logs"


def partition_dir(cluster: Cluster, node_id: int, topic: str = TOPIC) -> Path:
    return log_dir(cluster, node_id) / f"{topic}-0"


def tree_bytes(path: Path, suffix: str | None = None, allocated: bool = False) -> int:
    """The size of the files under ``path`` (those ending in ``suffix``): their lengths, or with
    ``allocated`` the disk blocks they take (as ``du``: preallocated sparse indexes count only
    what they use)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            if suffix is None or f.endswith(suffix):
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except OSError:
                    continue   # deleted while we looked
                total += st.st_blocks * 512 if allocated else st.st_size
    return total


def active_segment_base(cluster: Cluster, node_id: int) -> int | None:
    bases = [int(p.name[:-4]) for p in partition_dir(cluster, node_id).glob("*.log")]
    return max(bases) if bases else None


def retention_applied(cluster: Cluster, node_id: int, retention: int) -> bool:
    """Whether the replica's local segments are what ``local.retention.bytes`` keeps: Kafka
    deletes the oldest while the rest still hold the retention, so what stays beyond the oldest
    is under it (one segment of slack: a segment may hold more than ``segment.bytes`` when
    batches are larger)."""
    segments = sorted(partition_dir(cluster, node_id).glob("*.log"), key=lambda p: int(p.name[:-4]))
    try:
        sizes = [p.stat().st_size for p in segments]
    except OSError:
        return False   # one deleted while we looked
    return len(sizes) <= 1 or sum(sizes[1:]) <= retention + max(sizes)


def set_property(node, key: str, value: str) -> None:
    """``key=value`` for the node's next launch (Kafka: its server.properties; Strata: its
    ``--override``)."""
    if isinstance(node, KafkaBroker):
        lines = [ln for ln in node.props_path.read_text().splitlines()
                 if not ln.startswith(f"{key}=")]
        node.props_path.write_text("\n".join([*lines, f"{key}={value}"]) + "\n")
        return
    argv = node.argv
    for i in range(len(argv) - 1):
        if argv[i] == "--override" and argv[i + 1].startswith(f"{key}="):
            argv[i + 1] = f"{key}={value}"
            return
    argv += ["--override", f"{key}={value}"]


def format_kafka_log_dir(cluster: RejoinKafkaCluster, node_id: int) -> None:
    """``kafka-storage format --ignore-formatted``: writes meta.properties into the wiped (empty)
    log dir with the cluster's id; the metadata dir, still formatted, is left alone."""
    node = cluster.nodes[node_id]
    assert isinstance(node, KafkaBroker)
    cmd = java_command(cluster.libs, "kafka.tools.StorageTool", "format",
                       f"--cluster-id={cluster.cluster_id}", "--config", str(node.props_path),
                       "--ignore-formatted")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")


# --- setup ---------------------------------------------------------------------------------------

def topic_config(args) -> dict[str, str]:
    seg = int(args.segment_mib * MIB)
    config = {"internal.segment.bytes" if seg < MIB else "segment.bytes": str(seg)}
    if args.tiered == "on":
        config.update({"remote.storage.enable": "true",
                       "local.retention.bytes": str(seg * args.local_retention_segments)})
    return config


def settled(cluster: Cluster, args, leader: int, follower: int, end: int) -> dict | None:
    """The state before a round once it is reached: the follower at the leader's log end, both in
    the ISR, and when tiered every rolled segment tiered and local retention applied."""
    lb, fb = cluster.nodes[leader].bootstrap, cluster.nodes[follower].bootstrap
    state = partition_state(lb)
    if state is None or sorted(state[2]) != sorted([leader, follower]) or state[0] != leader:
        return None
    if offset_of(fb, LATEST) != end or offset_of(lb, LATEST) != end:
        return None
    out = {"leader_log_start": offset_of(lb, EARLIEST), "leader_local_start": None,
           "leader_tiered": None}
    if args.tiered == "on":
        retention = int(args.segment_mib * MIB) * args.local_retention_segments
        tiered = offset_of(lb, LATEST_TIERED, -1)
        base = active_segment_base(cluster, leader)
        if tiered is None or base is None or tiered < base - 1:
            return None
        if not all(retention_applied(cluster, n, retention) for n in (leader, follower)):
            return None
        out.update(leader_local_start=offset_of(lb, EARLIEST_LOCAL), leader_tiered=tiered)
    out["leader_local_MiB"] = round(tree_bytes(partition_dir(cluster, leader), ".log") / MIB, 2)
    out["follower_local_MiB"] = round(tree_bytes(partition_dir(cluster, follower), ".log") / MIB, 2)
    return out


def rejoin_round(cluster: Cluster, args, number: int, mode: str, leader: int, follower: int,
                 end: int, remote_dir: Path) -> dict:
    before = wait_for("the partition settled (caught up, tiered, local retention applied)",
                      lambda: settled(cluster, args, leader, follower, end), SETTLE_TIMEOUT_S, 0.5)
    lb = cluster.nodes[leader].bootstrap
    node = cluster.nodes[follower]
    load_before = uptime()
    node.kill()
    killed_at = time.monotonic()
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": lb, "allow.auto.create.topics": False})
    # A broker relaunched before the cluster noticed the death waits for (Strata) or fails on
    # (Kafka's ZooKeeper mode) its old registration; out of the ISR makes "back in" mean something.
    wait_for(f"node {follower} gone from Metadata and the ISR", lambda: (
        follower not in broker_ids(admin) and (s := partition_state(lb)) is not None
        and follower not in s[2]), WHOLE_TIMEOUT_S, 0.1)
    dropped_s = time.monotonic() - killed_at
    shutil.rmtree(log_dir(cluster, follower))
    if isinstance(cluster, RejoinKafkaCluster):
        format_kafka_log_dir(cluster, follower)
    set_property(node, LAST_TIERED, "true" if mode == "on" else "false")
    node.launch()
    t0 = node.started_at
    ready = caught = isr = None
    fetched = dir_bytes = None
    while caught is None or isr is None:
        now = time.monotonic()
        answer = list_offset(node.bootstrap, LATEST)
        if answer is not None and ready is None:
            ready = now - t0
        if caught is None and answer is not None and answer[0] == 0 and answer[1] >= end:
            caught = time.monotonic() - t0
            fetched = tree_bytes(partition_dir(cluster, follower), ".log")
            dir_bytes = tree_bytes(log_dir(cluster, follower), allocated=True)
        if isr is None:
            s = partition_state(lb)
            if s is not None and follower in s[2]:
                isr = time.monotonic() - t0
        if node.proc.poll() is not None:
            raise RuntimeError(f"node {follower} exited with {node.proc.returncode}")
        if now - t0 > REJOIN_TIMEOUT_S:
            raise TimeoutError(f"node {follower} not back after {REJOIN_TIMEOUT_S} s "
                               f"(ready {ready}, caught up {caught}, in the ISR {isr}; "
                               f"its log end {answer})")
        time.sleep(POLL_S)
    fb = node.bootstrap
    return {
        "round": number, "fetch_last_tiered_offset": mode if args.tiered == "on" else None,
        "leader": leader, "follower": follower, "records": end,
        **before,
        "dropped_after_kill_s": round(dropped_s, 2),
        "ready_s": round(ready, 3), "caught_up_s": round(caught, 3), "isr_s": round(isr, 3),
        "caught_up_after_ready_s": round(caught - ready, 3),
        "isr_after_ready_s": round(isr - ready, 3),
        "fetched_MiB": round(fetched / MIB, 2), "log_dir_MiB": round(dir_bytes / MIB, 2),
        "follower_log_start": offset_of(fb, EARLIEST),
        "follower_local_start": offset_of(fb, EARLIEST_LOCAL),
        "remote_MiB": round(tree_bytes(remote_dir, allocated=True) / MIB, 1),
        "uptime_before": load_before, "uptime_after": uptime(),
    }


def round_line(r: dict) -> str:
    mode = (f", {LAST_TIERED}={r['fetch_last_tiered_offset']}"
            if r["fetch_last_tiered_offset"] else "")
    return (f"rejoin round {r['round']}{mode}: follower {r['follower']} (leader {r['leader']}, "
            f"{r['records']} records) answered after {r['ready_s']:.2f} s, caught up after "
            f"{r['caught_up_s']:.2f} s, back in the ISR after {r['isr_s']:.2f} s; fetched "
            f"{r['fetched_MiB']} MiB (log dir {r['log_dir_MiB']} MiB), its local log from "
            f"{r['follower_local_start']}; leader local {r['leader_local_MiB']} MiB, remote tier "
            f"{r['remote_MiB']} MiB; {r['uptime_after']}")


def summarize(rounds: list[dict], keys: tuple[str, ...]) -> dict:
    out = {}
    for k in keys:
        xs = [r[k] for r in rounds if r.get(k) is not None]
        if xs:
            out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = cluster_arguments(__doc__)
    ap.add_argument("--tiered", choices=("on", "off"), required=True)
    ap.add_argument("--data-mib", type=float, default=1024,
                    help="MiB of 1 KiB records in the topic (default 1024)")
    ap.add_argument("--segment-mib", type=float, default=16,
                    help="segment size in MiB (default 16; under 1 MiB: internal.segment.bytes)")
    ap.add_argument("--local-retention-segments", type=int, default=3,
                    help="local.retention.bytes in segments when tiered (default 3)")
    ap.add_argument("--fetch-last-tiered-offset", choices=("off", "on", "both"), default="off",
                    help=f"the follower's {LAST_TIERED} (KIP-1023); both: alternate, --rounds "
                         "of each (default off; no effect without tiering)")
    args = ap.parse_args(argv)
    if args.tiered == "off":
        args.fetch_last_tiered_offset = "off"
    modes = (["off", "on"] if args.fetch_last_tiered_offset == "both"
             else [args.fetch_last_tiered_offset])

    from confluent_kafka.admin import AdminClient, NewTopic
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"rejoin-{args.system}-"))
    args.dir, keep_dir = root, args.dir is not None
    remote = root / "remote"
    remote.mkdir(parents=True, exist_ok=True)
    props = dict(COMMON)
    props["remote.log.storage.system.enable"] = "true"
    if args.system == "strata":
        props.update({"rsm.config.storage.url": remote.resolve().as_uri(),
                      "log.remote.storage.enable": "false",   # only the topic that asks
                      "remote.log.metadata.topic.replication.factor": "3",
                      "rlmm.config.remote.log.metadata.topic.replication.factor": "3"})
    else:
        props.update({"rsm.config.dir": str(remote),
                      "rlmm.config.remote.log.metadata.topic.replication.factor": "3"})
    args.override = [f"{k}={v}" for k, v in props.items()] + list(args.override)
    if args.system == "kafka":
        # make_cluster's KafkaCluster, but with each node's metadata.log.dir apart
        libs, why = find_kafka_libs(args.kafka_libs)
        if libs is None:
            raise SystemExit(why)
        cluster: Cluster = RejoinKafkaCluster(root, libs, dict(o.split("=", 1) for o in args.override))
    else:
        cluster, _ = make_cluster(args, "rejoin")
    rounds: list[dict] = []
    setup: dict = {"source": source_tree()}
    try:
        log(f"starting three {cluster.system} nodes under {root}; {uptime()}")
        cluster.start()
        controller = wait_for("active controller",
                              lambda: cluster.active_controller(cluster.nodes), START_TIMEOUT_S)
        leader, follower = [i for i in cluster.nodes if i != controller]
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(),
                             "allow.auto.create.topics": False})
        config = topic_config(args)
        admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[leader, follower]],
                                      config=config)], request_timeout=30)[TOPIC].result(60)
        lb = cluster.nodes[leader].bootstrap
        wait_for("the topic's ISR whole", lambda: (s := partition_state(lb)) is not None
                 and s[0] == leader and sorted(s[2]) == sorted([leader, follower]),
                 WHOLE_TIMEOUT_S, 0.1)
        records = int(args.data_mib * MIB) // RECORD_SIZE
        values = random_values(RECORD_SIZE)
        log(f"producing {records} records ({args.data_mib:g} MiB) to {TOPIC} {config}")
        produced = produce_throughput(lb, TOPIC, records, values, "all")
        end = offset_of(lb, LATEST)
        if end != records:
            raise RuntimeError(f"the leader's log end is {end}, {records} records were acknowledged")
        t = time.monotonic()
        wait_for("the partition settled", lambda: settled(cluster, args, leader, follower, end),
                 SETTLE_TIMEOUT_S, 0.5)
        setup |= {"controller": controller, "leader": leader, "follower": follower,
                 "topic_config": config, "records": records,
                 "produce_MiB/s": round(produced["MiB/s"], 2),
                 "settled_after_produce_s": round(time.monotonic() - t, 1)}
        log(f"setup: {setup}")
        for n in range(1, args.rounds + 1):
            for mode in modes:
                rounds.append(rejoin_round(cluster, args, n, mode, leader, follower, end, remote))
                print(round_line(rounds[-1]), flush=True)
    except BaseException:
        for i, node in cluster.nodes.items():
            log(f"--- node {i} ({node.log_path}) ---\n{node.output_tail(15)}")
        raise
    finally:
        cluster.stop()
        if not keep_dir:
            shutil.rmtree(root, ignore_errors=True)

    keys = ("ready_s", "caught_up_s", "isr_s", "caught_up_after_ready_s", "isr_after_ready_s",
            "fetched_MiB")
    summary = {mode: summarize([r for r in rounds if (r["fetch_last_tiered_offset"] or "off")
                                == mode], keys) for mode in modes}
    for mode, stats in summary.items():
        label = f"{LAST_TIERED}={mode}" if args.tiered == "on" else "untiered"
        for key, s in stats.items():
            print(f"{label} {key}: median {s['median']} (min {s['min']}, max {s['max']}) "
                  f"over {args.rounds} rounds")
    if args.json:
        args.json.write_text(json.dumps({
            "system": cluster.system, "version": cluster.version(),
            "command": shlex.join(["python", "-m", "benchmarks.rejoin",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "tiered": args.tiered, "data_MiB": args.data_mib,
            "segment_MiB": args.segment_mib, "setup": setup, "rounds": rounds,
            "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    # SIGTERM (timeout, kill) ends the run through ``finally``, which stops the cluster
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
