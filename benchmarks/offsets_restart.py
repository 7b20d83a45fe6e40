"""Broker restart time with a large ``__consumer_offsets``, before and after compaction (issue 28):

    python -m benchmarks.offsets_restart [--groups 200] [--partitions 50] [--commits 100]
        [--rounds 3] [--clients 4] [--segment-mib 1] [--roll-ms 10000] [--json F] [--dir D]

One ``strata serve`` (``benchmarks.brokers.StrataBroker``: one node, no ZooKeeper, Strata's
defaults but for these settings, the same in every phase except ``log.cleaner.enable``):
``offsets.topic.replication.factor=1``, ``offsets.topic.segment.bytes`` ``--segment-mib`` MiB
(1, the smallest ``segment.bytes``; so that ``__consumer_offsets`` has rolled, cleanable
segments), ``log.roll.ms`` ``--roll-ms`` (see "after"), ``log.cleaner.backoff.ms=500``,
``log.cleaner.min.cleanable.ratio=0.01`` (with the default 0.5 a partition cleaned while the
groups re-commit can stop short of its live records) and the metrics listener
(``strata.metrics.listener``, for the cleaner's gauges).

Fill (once, ``log.cleaner.enable=false``): the topic ``offsets-bench`` with ``--partitions`` P
partitions is created; ``--groups`` G groups ``bench-group-<i>`` then each commit offsets for
all P partitions ``--commits`` C times: raw OffsetCommit v8 requests (``strata.protocol.codec``
classes over ``strata.net.connection.Connection``), one request per group and commit carrying
all P partitions (one record batch of P records in the group's ``__consumer_offsets`` partition),
simple commits (generation -1, empty member id: groups without members, so no group metadata
records). Commit c of partition p of group g has offset ``committed_offset(g, p, c)``; the
commits go round by round (every group's commit c before any commit c+1), the groups spread
over ``--clients`` connections, one thread each. G*P*C offset commit records in all.

Records and bytes of ``__consumer_offsets`` on disk are counted from its segment files'
batch headers while the broker is stopped (``offsets_disk``).

A restart round (``restart_round``), from a stopped broker: ``launch`` (``subprocess.Popen``;
t=0), then

- ``api_s``: the first ApiVersions v3 answered (a new connection every 10 ms until one answers);
- ``served_s``: every group served: an OffsetFetch v7 for each group (all P partitions) on one
  connection, in group order, answered without a group-level or partition-level error and with
  the offsets of the group's last commit (asserted); a group answered with
  COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR is asked again (``retries`` counts those);
- from the broker's own log (``broker_log_marks``; its timestamps have millisecond resolution,
  relative to the same t=0): ``logs_loaded_s`` ("loaded N logs"), ``groups_first_s`` and
  ``groups_last_s`` (the first and last line of a loaded group, or since 4451c6a of a loaded
  ``__consumer_offsets`` partition), ``listening_s`` ("listening on");
- ``cpu_api_s`` and ``cpu_served_s``: the broker process's CPU-seconds (user + system, from
  ``/proc``) at ``api_s`` and at ``served_s`` (on a loaded machine the wall times vary, these less);
- then SIGTERM, and ``stop_s`` until the process has exited (a clean shutdown).

Each round records ``uptime`` (the load averages) before it. ``--rounds`` N rounds per phase:

- ``empty``: before the fill (no offsets; the fixed cost of a start on this machine);
- ``before``: after the fill, cleaner off;
- compaction: the broker started with ``log.cleaner.enable=true``. The last segment of each
  ``__consumer_offsets`` partition is its active one, which no cleaner touches (Kafka's neither),
  so once ``--roll-ms`` has passed since the fill every group re-commits its partition 0 with
  its last offset (G records, the values unchanged): each partition's next append rolls it and
  every record of the fill becomes cleanable. The bench then waits (polling the disk every
  second) until ``__consumer_offsets`` holds at most G*P + G records (each key's latest value
  in the cleaned segments plus the G re-commits in the active segments), records the cleaner's
  "cleaned ..." log lines and gauges, and stops the broker. The cleaner starts before the
  broker loads its groups, so most of the cleaning overlaps that (untimed) start: ``start_s``
  is the start, ``reached_s`` the wait after the re-commits, the log lines' seconds the
  cleaner's own;
- ``after``: as ``before``, with the cleaner on (it finds nothing to clean). ``disk`` is
  counted before its rounds (the segments the cleaner replaced may still await deletion) and
  ``disk_end`` after them (a start deletes them).

Every round is printed to stderr as it completes; ``--json`` writes everything.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from benchmarks.brokers import StrataBroker, free_port, log
from benchmarks.cpu import tree_cpu_seconds
from benchmarks.replication import source_tree, uptime
from strata.common.errors import code_of
from strata.net.connection import Connection
from strata.protocol.codec import ApiKey, make, request_class, response_class

MIB = 1024 * 1024
TOPIC = "offsets-bench"
OFFSETS_TOPIC = "__consumer_offsets"
COMMIT_V, FETCH_V, API_VERSIONS_V = 8, 7, 3
LOAD_IN_PROGRESS, NOT_COORDINATOR = 14, 16
RESTART_TIMEOUT_S = 900
COMPACTION_TIMEOUT_S = 1800

# A record batch header (magic 2): base offset i64, batch length i32 (of what follows it),
# partition leader epoch i32, magic i8, ..., record count i32 at byte 57; 61 bytes in all.
BATCH_HEADER = 61
# a loaded __consumer_offsets partition (one line each since 4451c6a; one per group before)
LOADED_PARTITION = re.compile(r": loaded (\d+) group\(s\) and \d+ offset\(s\) of __consumer_offsets-")
LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)


def committed_offset(group: int, partition: int, commit: int) -> int:
    """The offset commit ``commit`` (0-based) of ``group`` stores for ``partition``."""
    return commit * 10**9 + group * 10**4 + partition


def segment_records(data: bytes) -> tuple[int, int]:
    """(batches, records) in a segment file's bytes, by the batch headers; stops at a
    truncated or zeroed tail (a batch header with length 0 or running past the end)."""
    pos, batches, records = 0, 0, 0
    while pos + BATCH_HEADER <= len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        if length <= 0 or pos + 12 + length > len(data):
            break
        batches += 1
        records += struct.unpack_from(">i", data, pos + 57)[0]
        pos += 12 + length
    return batches, records


def offsets_disk(log_dir: Path, topic: str = OFFSETS_TOPIC) -> dict:
    """Records, batches, ``.log`` bytes and segments of ``topic`` under ``log_dir``; the bytes
    of every file in its partition directories (indexes, checkpoints, snapshots, and segments
    awaiting deletion), and of those awaiting deletion (``.deleted``: removed
    ``file.delete.delay.ms`` after the cleaner replaced them, or at the next start)."""
    out = {"records": 0, "batches": 0, "log_bytes": 0, "segments": 0, "dir_bytes": 0,
           "deleted_bytes": 0, "partitions_with_data": 0}
    for part in sorted(log_dir.glob(f"{topic}-*")):
        had = 0
        for f in part.iterdir():
            try:
                size = f.stat().st_size
                out["dir_bytes"] += size
                if f.suffix == ".deleted":
                    out["deleted_bytes"] += size
                if f.suffix != ".log":
                    continue
                data = f.read_bytes()
            except FileNotFoundError:   # the cleaner swapped it meanwhile
                continue
            b, r = segment_records(data)
            out["batches"] += b
            out["records"] += r
            out["log_bytes"] += size
            out["segments"] += 1
            had += r
        out["partitions_with_data"] += had > 0
    return out


def log_time(stamp: str) -> float:
    """Epoch seconds of a broker log timestamp (``%(asctime)s``: local time, milliseconds)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def broker_log_marks(text: str, launched_wall: float) -> dict:
    """Seconds from ``launched_wall`` to the broker's startup log lines in ``text`` (one start's
    output): "loaded N logs", the first and last "loaded group", "listening on"; and the count
    of groups it logged loading. Missing lines are None."""
    marks: dict = {"logs_loaded_s": None, "groups_first_s": None, "groups_last_s": None,
                   "listening_s": None, "groups_logged": 0, "errors": 0}
    for line in text.splitlines():
        m = LOG_TS.match(line)
        if not m:
            continue
        at = round(log_time(m.group(1)) - launched_wall, 3)
        if " ERROR " in line or "Traceback" in line:
            marks["errors"] += 1
        if "strata.log.log_manager: loaded " in line and marks["logs_loaded_s"] is None:
            marks["logs_loaded_s"] = at
        elif ": loaded group " in line or LOADED_PARTITION.search(line):
            summary = LOADED_PARTITION.search(line)
            marks["groups_logged"] += int(summary.group(1)) if summary else 1
            if marks["groups_first_s"] is None:
                marks["groups_first_s"] = at
            marks["groups_last_s"] = at
        elif "strata.server.network: listening on " in line and marks["listening_s"] is None:
            marks["listening_s"] = at
    return marks


CLEANED = re.compile(r"cleaned (__consumer_offsets-\d+) up to (\d+): (\d+) -> (\d+) bytes "
                     r"in ([\d.]+)s")


def cleaned_lines(text: str) -> dict:
    """The cleaner's "cleaned __consumer_offsets-N ..." lines: count, partitions, bytes read and
    kept, and the seconds they report in total."""
    hits = CLEANED.findall(text)
    return {"cleans": len(hits), "partitions": len({h[0] for h in hits}),
            "bytes_read": sum(int(h[2]) for h in hits), "bytes_kept": sum(int(h[3]) for h in hits),
            "seconds": round(sum(float(h[4]) for h in hits), 2)}


# ------------------------------------------------------------------------------------ requests
class Requests:
    """The kio request bodies and response classes of the three requests the bench sends."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        cc = request_class(ApiKey.OFFSET_COMMIT, COMMIT_V)
        self.commit_cls = cc
        self.commit_topic = type(make(cc, "topics"))
        self.commit_part = type(make(cc, "topics.partitions"))
        self.commit_resp = response_class(ApiKey.OFFSET_COMMIT, COMMIT_V)
        fc = request_class(ApiKey.OFFSET_FETCH, FETCH_V)
        self.fetch_resp = response_class(ApiKey.OFFSET_FETCH, FETCH_V)
        self._fetch = {}
        self._fetch_cls = fc
        av = request_class(ApiKey.API_VERSIONS, API_VERSIONS_V)
        self.api_versions = make(av, client_software_name="strata-bench",
                                 client_software_version="1")
        self.api_versions_resp = response_class(ApiKey.API_VERSIONS, API_VERSIONS_V)

    def commit(self, group_id: str, offsets: dict[int, int]):
        """A simple commit (generation -1, no member) of ``offsets`` (partition -> offset)."""
        parts = tuple(self.commit_part(partition_index=p, committed_offset=o,
                                       committed_leader_epoch=-1, committed_metadata="")
                      for p, o in offsets.items())
        return self.commit_cls(group_id=group_id, generation_id_or_member_epoch=-1, member_id="",
                               group_instance_id=None,
                               topics=(self.commit_topic(name=TOPIC, partitions=parts),))

    def fetch(self, group_id: str):
        return make(self._fetch_cls, group_id=group_id, require_stable=False, topics=(
            make(self._fetch_cls, "topics", name=TOPIC,
                 partition_indexes=tuple(range(self.partitions))),))



LOADING = (14, 16)   # COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR: the groups are loading


def commit_or_raise(conn: Connection, reqs: Requests, group_id: str, offsets: dict[int, int],
                    timeout_s: float = 120.0):
    """Commit, asking again while the group's partition is still loading after a start."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp = conn.request(reqs.commit(group_id, offsets), reqs.commit_resp)
        bad = [(p.partition_index, code_of(p.error_code)) for t in resp.topics for p in t.partitions
               if code_of(p.error_code) != 0]
        if not bad:
            return
        if all(c in LOADING for _, c in bad) and time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        raise RuntimeError(f"OffsetCommit of {group_id} failed: {bad[:5]}")


def fill(bootstrap: str, reqs: Requests, groups: int, commits: int, clients: int) -> dict:
    """G*P*C offset commit records: commit rounds 0..C-1 of every group, ``clients`` threads."""
    errors: list[BaseException] = []
    done = [0] * clients

    def work(k: int) -> None:
        try:
            mine = range(k, groups, clients)
            with Connection(bootstrap, timeout=60) as conn:
                for c in range(commits):
                    for g in mine:
                        commit_or_raise(conn, reqs, group_name(g), {
                            p: committed_offset(g, p, c) for p in range(reqs.partitions)})
                    done[k] = c + 1
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    last = start
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(1)
        if time.monotonic() - last >= 15:
            last = time.monotonic()
            log(f"  fill: commit round {min(done)}/{commits} after {last - start:.0f} s")
    seconds = time.monotonic() - start
    if errors:
        raise errors[0]
    n = groups * reqs.partitions * commits
    return {"records": n, "requests": groups * commits, "seconds": round(seconds, 1),
            "records_per_s": round(n / seconds)}


def start(broker: StrataBroker, reqs: Requests) -> float:
    """Launch ``broker`` (untimed starts) and wait until it answers ApiVersions."""
    broker.launch()
    return wait_api_versions(broker, reqs, RESTART_TIMEOUT_S)


def group_name(g: int) -> str:
    return f"bench-group-{g}"


def wait_api_versions(broker: StrataBroker, reqs: Requests, timeout: float) -> float:
    """Seconds from the launch to the first ApiVersions answered."""
    deadline = broker.started_at + timeout
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise RuntimeError(f"broker exited with {broker.proc.returncode}:\n"
                               f"{broker.output_tail()}")
        try:
            with Connection(broker.bootstrap, timeout=5) as conn:
                resp = conn.request(reqs.api_versions, reqs.api_versions_resp)
            if code_of(resp.error_code) == 0:
                return time.monotonic() - broker.started_at
        except (OSError, ConnectionError):
            pass
        time.sleep(0.01)
    raise TimeoutError(f"no ApiVersions answer within {timeout} s:\n{broker.output_tail()}")


def wait_groups_served(broker: StrataBroker, reqs: Requests, groups: int, last_commit: int,
                       timeout: float) -> tuple[float, int]:
    """(seconds from the launch until every group's OffsetFetch returned its last commit,
    retries of groups still loading or not yet coordinated here)."""
    deadline = broker.started_at + timeout
    pending = list(range(groups))
    retries = 0
    with Connection(broker.bootstrap, timeout=30) as conn:
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} groups not served within {timeout} s")
            again = []
            for g in pending:
                resp = conn.request(reqs.fetch(group_name(g)), reqs.fetch_resp)
                codes = {code_of(resp.error_code)} | {code_of(p.error_code) for t in resp.topics
                                                  for p in t.partitions}
                if codes & {LOAD_IN_PROGRESS, NOT_COORDINATOR}:
                    again.append(g)
                    continue
                if codes != {0}:
                    raise RuntimeError(f"OffsetFetch of {group_name(g)}: error codes {codes}")
                got = {p.partition_index: p.committed_offset for t in resp.topics
                       for p in t.partitions}
                want = {p: committed_offset(g, p, last_commit) for p in range(reqs.partitions)}
                if got != want:
                    wrong = sorted(p for p in want if got.get(p) != want[p])
                    raise AssertionError(f"{group_name(g)}: partitions {wrong[:5]} hold "
                                         f"{[got.get(p) for p in wrong[:5]]}, expected "
                                         f"{[want[p] for p in wrong[:5]]}")
            retries += len(again)
            pending = again
            if pending:
                time.sleep(0.02)
    return time.monotonic() - broker.started_at, retries


def restart_round(broker: StrataBroker, reqs: Requests, phase: str, number: int, groups: int,
                  last_commit: int | None) -> dict:
    """One timed start of the stopped ``broker`` (see the module docstring), then its stop."""
    load = uptime()
    log_from = broker.log_path.stat().st_size if broker.log_path.exists() else 0
    launched_wall = time.time()
    broker.launch()
    api_s = wait_api_versions(broker, reqs, RESTART_TIMEOUT_S)
    cpu_api_s = tree_cpu_seconds(broker.pid)
    if last_commit is None:
        served_s, retries = api_s, 0
    else:
        served_s, retries = wait_groups_served(broker, reqs, groups, last_commit,
                                               RESTART_TIMEOUT_S)
    cpu_served_s = tree_cpu_seconds(broker.pid)
    stop_start = time.monotonic()
    code = broker.stop()
    stop_s = time.monotonic() - stop_start
    with open(broker.log_path, "rb") as f:
        f.seek(log_from)
        text = f.read().decode(errors="replace")
    out = {"phase": phase, "round": number, "api_s": round(api_s, 3),
           "served_s": round(served_s, 3), "cpu_api_s": round(cpu_api_s, 2),
           "cpu_served_s": round(cpu_served_s, 2), "retries": retries, "stop_s": round(stop_s, 2),
           "exit_code": code, **broker_log_marks(text, launched_wall), "uptime": load}
    served = groups if last_commit is not None else 0
    log(f"  {phase} round {number}: ApiVersions {out['api_s']:.2f} s ({out['cpu_api_s']} CPU-s), "
        f"all {served} groups served {out['served_s']:.2f} s ({out['cpu_served_s']} CPU-s, "
        f"retries {retries}); broker log: logs loaded "
        f"{out['logs_loaded_s']} s, groups {out['groups_first_s']}..{out['groups_last_s']} s "
        f"({out['groups_logged']} logged), listening {out['listening_s']} s; stop {out['stop_s']} s"
        f" (exit {code}); {load}")
    return out


def cleaner_gauges(metrics_url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": str(e)}
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^(kafka_log_LogCleaner\w*) (\S+)$", text, re.M)}


def compact(broker: StrataBroker, reqs: Requests, groups: int, commits: int, roll_ms: int,
            last_fill_wall: float, metrics_url: str, log_dir: Path) -> dict:
    """Start with the cleaner on, roll every partition by one re-commit a group, wait until
    ``__consumer_offsets`` is down to its live records; stop the broker."""
    log_from = broker.log_path.stat().st_size
    start_s = start(broker, reqs)
    started = time.monotonic()
    wait = last_fill_wall + roll_ms / 1000 + 1 - time.time()
    if wait > 0:
        log(f"  waiting {wait:.0f} s for log.roll.ms to pass since the fill")
        time.sleep(wait)
    with Connection(broker.bootstrap, timeout=60) as conn:
        for g in range(groups):
            commit_or_raise(conn, reqs, group_name(g), {0: committed_offset(g, 0, commits - 1)})
    target = groups * reqs.partitions + groups
    rolled = time.monotonic()
    polls = []
    while True:
        disk = offsets_disk(log_dir)
        elapsed = time.monotonic() - rolled
        polls.append((round(elapsed, 1), disk["records"]))
        if disk["records"] <= target:
            break
        if elapsed > COMPACTION_TIMEOUT_S:
            log(f"  compaction: still {disk['records']} records after {elapsed:.0f} s; giving up")
            break
        if len(polls) % 15 == 1:
            log(f"  compaction: {disk['records']} records on disk after {elapsed:.0f} s "
                f"(target {target})")
        time.sleep(1)
    reached_s = time.monotonic() - rolled
    gauges = cleaner_gauges(metrics_url)
    code = broker.stop()
    with open(broker.log_path, "rb") as f:
        f.seek(log_from)
        text = f.read().decode(errors="replace")
    return {"target_records": target, "start_s": round(start_s, 1),
            "reached_s": round(reached_s, 1),
            "since_start_s": round(time.monotonic() - started, 1),
            "records_at_stop": polls[-1][1], "polls": polls[:: max(1, len(polls) // 20)],
            "cleaner_log": cleaned_lines(text), "gauges": gauges, "exit_code": code,
            "errors_in_log": sum(1 for line in text.splitlines()
                                 if " ERROR " in line or "Traceback" in line)}


def summary(rounds: list[dict], key: str) -> str:
    vals = sorted(r[key] for r in rounds)
    return f"{vals[0]:.2f}-{vals[-1]:.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--partitions", type=int, default=50)
    p.add_argument("--commits", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4, help="connections (threads) for the fill")
    p.add_argument("--segment-mib", type=int, default=1,
                   help="offsets.topic.segment.bytes in MiB (at least 1)")
    p.add_argument("--roll-ms", type=int, default=10_000, help="log.roll.ms")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dir", type=Path, default=None, help="parent of the temp data directory")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    args = p.parse_args(argv)
    if args.partitions >= 10**4 or args.groups >= 10**5:
        p.error("--partitions must be below 10,000 and --groups below 100,000")
    base = Path(tempfile.mkdtemp(prefix="strata-offsets-restart-", dir=args.dir))
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    common = {"offsets.topic.replication.factor": "1", "num.partitions": "1",
              "offsets.topic.segment.bytes": str(args.segment_mib * MIB),
              "log.roll.ms": str(args.roll_ms), "log.cleaner.backoff.ms": "500",
              # every dirty byte is worth a clean: the "after" target is the live records only
              "log.cleaner.min.cleanable.ratio": "0.01",
              "strata.metrics.listener": metrics_url}
    port = free_port()
    off = StrataBroker(base, {**common, "log.cleaner.enable": "false"}, port=port)
    on = StrataBroker(base, {**common, "log.cleaner.enable": "true"}, port=port)
    log_dir = base / "kafka-logs"
    reqs = Requests(args.partitions)
    result: dict = {"workload": "offsets-restart", "source": source_tree(),
                    "params": {k: v for k, v in vars(args).items() if k not in ("json", "dir")}
                    | {"json": str(args.json) if args.json else None},
                    "broker_overrides": common, "dir": str(base), "uptime_start": uptime()}
    log(f"offsets restart bench under {base}: {args.groups} groups x {args.partitions} partitions"
        f" x {args.commits} commits = {args.groups * args.partitions * args.commits:,} records; "
        f"{result['uptime_start']}")
    try:
        start(off, reqs)
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": off.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result()
        del admin   # else librdkafka keeps reconnecting to the stopped broker
        off.stop()
        result["empty"] = {"disk": offsets_disk(log_dir), "rounds": [
            restart_round(off, reqs, "empty", i + 1, args.groups, None)
            for i in range(args.rounds)]}

        start(off, reqs)
        log(f"  filling __consumer_offsets ({args.clients} connections); {uptime()}")
        result["fill"] = fill(off.bootstrap, reqs, args.groups, args.commits, args.clients)
        result["fill"]["uptime_after"] = uptime()
        last_fill_wall = time.time()
        off.stop()
        disk = offsets_disk(log_dir)
        log(f"  filled in {result['fill']['seconds']} s ({result['fill']['records_per_s']:,} "
            f"records/s); on disk: {disk['records']:,} records, {disk['log_bytes'] / MIB:.1f} MiB "
            f"in {disk['segments']} segments")
        result["before"] = {"disk": disk, "rounds": [
            restart_round(off, reqs, "before", i + 1, args.groups, args.commits - 1)
            for i in range(args.rounds)]}

        log(f"  compacting (cleaner on); {uptime()}")
        result["compaction"] = comp = compact(on, reqs, args.groups, args.commits, args.roll_ms,
                                              last_fill_wall, metrics_url, log_dir)
        disk = offsets_disk(log_dir)
        log(f"  compacted: {disk['records']:,} records, {disk['log_bytes'] / MIB:.2f} MiB in "
            f"{disk['segments']} segments {comp['reached_s']} s after the roll; cleaner log "
            f"{comp['cleaner_log']}")
        result["after"] = {"disk": disk, "rounds": [
            restart_round(on, reqs, "after", i + 1, args.groups, args.commits - 1)
            for i in range(args.rounds)], "disk_end": offsets_disk(log_dir)}
        result["uptime_end"] = uptime()
        text = off.log_path.read_text(errors="replace")
        result["broker_log_errors"] = [line for line in text.splitlines()
                                       if " ERROR " in line or "Traceback" in line][:20]
    finally:
        off.kill()
        on.kill()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    for phase in ("empty", "before", "after"):
        rs = result[phase]["rounds"]
        disk = result[phase]["disk"]
        log(f"{phase}: {disk['records']:,} records, {disk['log_bytes'] / MIB:.1f} MiB; "
            f"ApiVersions {summary(rs, 'api_s')} s, groups served {summary(rs, 'served_s')} s")
    print(json.dumps({k: result[k] for k in ("empty", "before", "after") if k in result}
                     | {"fill": result.get("fill"), "compaction": result.get("compaction")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
