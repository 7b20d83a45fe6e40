"""Remote log metadata at scale: restart time and memory of the topic-based RLMM.

    python -m benchmarks.rlmm_scale --segments 1000000 --partitions 1000 --rounds 3
        [--replay-segments N] [--replay-rounds R] [--page-cache warm|cold]
        [--data-dir DIR] [--seed S] [--json PATH]

Generates synthetic remote log metadata for ``--partitions`` user partitions holding
``--segments`` remote segments between them (spread evenly), and leaves it as a broker leaves
it after a clean shutdown:

- every segment is a COPY_SEGMENT_STARTED record and a COPY_SEGMENT_FINISHED update in the
  ``__remote_log_metadata`` partition its user partition maps to (50 partitions, Kafka's
  default), interleaved across user partitions as a copier pool writes them. The records are
  the serde's bytes, one null-keyed record per batch as ``LogMetadataTopicLog.append`` builds
  them, appended with ``UnifiedLog.append_as_leader`` to the partition logs of a
  ``LogManager`` (several such batches per append call: the bytes on disk are the same, the
  generation is 20x faster than one call per record);
- the segments are realistic: random segment ids, offsets contiguous per partition (250,000
  to 750,000 records a segment), a leader epoch change every 50-200 segments (half of them
  inside a segment, which then holds two epochs), sizes of 0.9-1 GiB, increasing
  timestamps, no custom metadata, 5% with transaction index entries;
- a real ``TopicBasedRemoteLogMetadataManager`` then replays the logs and writes its
  snapshot of every metadata partition, and the logs are shut down cleanly.

Each round then runs in a fresh process (``sys.executable -m benchmarks.rlmm_scale
--child``): it opens the logs (``LogManager.startup``, not counted in the RLMM figures),
then measures

- (a) ``start_s``: from constructing the RLMM to ``start()`` returning with every metadata
  partition loaded;
- (b) ``first_lookup_s``: the first ``remote_log_segment_metadata(tip, epoch, offset)`` for a
  random partition, and ``to_first_lookup_s`` = (a) + (b), what "restart to serving remote
  reads" costs (``*_cpu_s``: the same in the process's CPU time, which other load on the
  machine inflates less than wall time);
- (c) ``rss_*``: VmRSS before constructing the RLMM, after ``start()`` and after the first
  lookup (``metadata_rss_mib`` = after the first lookup - before), and VmHWM (the peak);
- (d) 10,000 lookups of random offsets in random partitions (checked against the generator:
  every answer must be the segment holding the offset): ``cold`` is the first pass (it meets
  each partition for the first time), ``warm`` the same lookups again; p50/p99/max in us;
- then ``touch_all_s``: ``list_remote_log_segments`` of every partition (what the remote log
  manager's first round of copier and expiration tasks does) and ``rss_after_touch_mib``:
  the memory once every partition's metadata is in use; ``after_touch``: the lookups again;
- ``snapshot_all_{before,after}_touch_s``: writing every metadata partition's snapshot (into a
  scratch directory), before and after the partitions were used (a clean shutdown writes
  those with records since their last snapshot).

``--replay-segments`` (default: the same as ``--segments``) generates a second data set with
that many segments over the same partition count, whose rounds start the RLMM with an empty
snapshot directory: (e), the full replay of the logs (which writes the snapshots as it
goes, as a restart without snapshots does). ``--replay-rounds 0`` skips it.

The page cache is warm by default (the data was just written or read by the previous
round); ``--page-cache cold`` evicts the data set's files before each round with
``posix_fadvise(DONTNEED)`` (no root needed for one's own files). ``--data-dir`` keeps the
data sets there and reuses them when their parameters and snapshot version match.
Every round is printed as one JSON line; ``--json`` writes them all with the parameters.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
METADATA_PARTITIONS = 50          # remote.log.metadata.topic.num.partitions default
PARTITIONS_PER_TOPIC = 10
BROKER_ID = 1
LOOKUPS = 10_000
DATASET_FILE = "dataset.json"
FORMAT = 1                        # of dataset.json and the generated logs


# --------------------------------------------------------------------------- generation


def partition_names(partitions: int, rng: random.Random) -> list[tuple[str, str, int]]:
    """(topic, topic id hex, partition) for ``partitions`` user partitions, 10 to a topic."""
    out = []
    topic_id = None
    for p in range(partitions):
        if p % PARTITIONS_PER_TOPIC == 0:
            topic_id = uuid.UUID(int=rng.getrandbits(128) | (1 << 127))
        out.append((f"bench-{p // PARTITIONS_PER_TOPIC:05d}", topic_id.hex, p % PARTITIONS_PER_TOPIC))
    return out


class SyntheticPartition:
    """One user partition's remote segments as the generator lays them out."""

    __slots__ = ("tip", "count", "starts", "ends", "epoch_starts", "epochs", "next_offset",
                 "epoch", "until_epoch_change", "timestamp")

    def __init__(self, tip: Any, count: int, rng: random.Random) -> None:
        self.tip = tip
        self.count = count
        self.starts = array("q")
        self.ends = array("q")
        self.epoch = rng.randrange(0, 5)
        self.epochs = [self.epoch]                # leader epochs in order, and
        self.epoch_starts = [0]                   # the offset each one starts at
        self.next_offset = 0
        self.until_epoch_change = rng.randint(50, 200)
        self.timestamp = 1_700_000_000_000 + rng.randrange(86_400_000)

    def epoch_at(self, offset: int) -> int:
        return self.epochs[bisect.bisect_right(self.epoch_starts, offset) - 1]


def segment_events(part: SyntheticPartition, rng: random.Random) -> tuple[Any, Any]:
    """The next segment of ``part``: its COPY_SEGMENT_STARTED metadata and FINISHED update."""
    from strata.tiered.api import (RemoteLogSegmentId, RemoteLogSegmentMetadata,
                                   RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState)
    length = rng.randint(250_000, 750_000)
    start = part.next_offset
    end = start + length - 1
    epochs = {part.epoch: start}
    part.until_epoch_change -= 1
    if part.until_epoch_change <= 0:
        part.until_epoch_change = rng.randint(50, 200)
        part.epoch += rng.randint(1, 2)
        at = start if rng.random() < 0.5 else start + rng.randint(1, length - 1)
        if at == start:
            epochs = {part.epoch: start}
        else:
            epochs[part.epoch] = at
        part.epochs.append(part.epoch)
        part.epoch_starts.append(at)
    part.timestamp += rng.randint(600_000, 3_600_000)
    copied = part.timestamp + rng.randint(60_000, 600_000)
    segment_id = RemoteLogSegmentId(part.tip, uuid.UUID(int=rng.getrandbits(128) | (1 << 126)))
    started = RemoteLogSegmentMetadata(
        segment_id, start, end, part.timestamp, BROKER_ID, copied - 30_000,
        rng.randint(900_000_000, 1 << 30), segment_leader_epochs=epochs,
        txn_idx_empty=rng.random() >= 0.05)
    finished = RemoteLogSegmentMetadataUpdate(segment_id, copied, None,
                                              RemoteLogSegmentState.COPY_SEGMENT_FINISHED, BROKER_ID)
    part.starts.append(start)
    part.ends.append(end)
    part.next_offset = end + 1
    return started, finished


def synthetic_partitions(segments: int, partitions: int, seed: int) -> tuple[list[SyntheticPartition], random.Random]:
    from strata.tiered.api import TopicIdPartition, TopicPartition
    rng = random.Random(seed)
    base, extra = divmod(segments, partitions)
    parts = []
    for i, (topic, topic_id, partition) in enumerate(partition_names(partitions, rng)):
        tip = TopicIdPartition(uuid.UUID(topic_id), TopicPartition(topic, partition))
        parts.append(SyntheticPartition(tip, base + (1 if i < extra else 0), rng))
    return parts, rng


def iter_events(parts: list[SyntheticPartition], rng: random.Random):
    """Every segment's two events, round-robin over the partitions (a copier pool's order)."""
    for j in range(max((p.count for p in parts), default=0)):
        for part in parts:
            if j < part.count:
                yield segment_events(part, rng)


class BenchBroker:
    """ClusterMetadata, a LogManager and the LogMetadataTopicLog over them: the single-broker
    setup of ``strata serve`` without the network (appends as ReplicaManager commits them)."""

    def __init__(self, path: Path) -> None:
        from strata.cluster.metadata import ClusterMetadata
        from strata.log.log_manager import LogManager
        from strata.tiered.metadata.topic_log import LogMetadataTopicLog
        self.path = path
        self.metadata = ClusterMetadata(path, BROKER_ID, {})
        self.manager = LogManager([path], self.metadata.default_log_config(),
                                  topic_config=self.metadata.log_config)
        self.manager.startup()
        self.metadata.add_listener(self)
        self.topic_log = LogMetadataTopicLog(self.metadata, self.manager.get_log, self.append)

    def on_topic_created(self, info: Any) -> None:
        from strata.common.types import TopicPartition
        for p in range(info.partitions):
            self.manager.get_or_create_log(TopicPartition(info.name, p), self.metadata.log_config(info.name))

    def append(self, tp: Any, batches: bytes) -> int:
        from strata.log.producer_state import AppendOrigin
        ulog = self.manager.get_log(tp)
        info = ulog.append_as_leader(batches, 0, origin=AppendOrigin.COORDINATOR)
        ulog.update_high_watermark(ulog.log_end_offset)
        return info.first_offset

    def shutdown(self) -> None:
        self.manager.shutdown()


def rlmm_configs(log_dir: Path) -> dict[str, Any]:
    return {"remote.log.metadata.topic.num.partitions": METADATA_PARTITIONS, "log.dir": str(log_dir),
            "broker.id": BROKER_ID, "cluster.id": "bench"}


def write_logs(broker: BenchBroker, parts: list[SyntheticPartition], rng: random.Random,
               flush_every: int = 1000) -> int:
    """Append every event's record to its metadata partition; the records written."""
    from strata.protocol import records as rec
    from strata.tiered.metadata.serde import RemoteLogMetadataTopicPartitioner, serialize
    count = broker.topic_log.ensure_topic(METADATA_PARTITIONS)
    partitioner = RemoteLogMetadataTopicPartitioner(count)
    mp_of = {part.tip: partitioner.metadata_partition(part.tip) for part in parts}
    pending: list[list[bytes]] = [[] for _ in range(count)]
    written = 0

    def flush(mp: int) -> None:
        if pending[mp]:
            broker.append(broker.topic_log.topic_partition(mp), b"".join(pending[mp]))
            pending[mp].clear()

    for started, finished in iter_events(parts, rng):
        mp = mp_of[started.topic_id_partition]
        for event in (started, finished):
            # what LogMetadataTopicLog.append writes: one null-keyed record per batch
            pending[mp].append(rec.build_batch([rec.SimpleRecord(serialize(event))]))
        written += 2
        if len(pending[mp]) >= flush_every:
            flush(mp)
    for mp in range(count):
        flush(mp)
    return written


def lookup_plan(parts: list[SyntheticPartition], rng: random.Random, count: int) -> list[list[int]]:
    """``count`` random lookups: [partition index, epoch, offset, expected start, expected end]."""
    plan = []
    live = [i for i, p in enumerate(parts) if p.count]
    for _ in range(count):
        i = rng.choice(live)
        part = parts[i]
        j = rng.randrange(part.count)
        offset = rng.randint(part.starts[j], part.ends[j])
        plan.append([i, part.epoch_at(offset), offset, part.starts[j], part.ends[j]])
    return plan


def snapshot_version() -> int:
    from strata.tiered.metadata import topic_based
    return topic_based.SNAPSHOT_VERSION


def generate(path: Path, segments: int, partitions: int, seed: int, *,
             snapshots: bool = True, log=print) -> dict[str, Any]:
    """Write a data set into ``path`` (emptied first); its description (also dataset.json)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    parts, rng = synthetic_partitions(segments, partitions, seed)
    broker = BenchBroker(path)
    t0 = time.perf_counter()
    records = write_logs(broker, parts, rng)
    write_s = time.perf_counter() - t0
    log(f"wrote {records:,} records for {segments:,} segments in {partitions:,} partitions "
        f"in {write_s:.1f} s")
    info: dict[str, Any] = {
        "format": FORMAT, "segments": segments, "partitions": partitions, "seed": seed,
        "records": records, "write_s": round(write_s, 3),
        "log_bytes": sum(f.stat().st_size for f in path.rglob("*.log")),
        "tips": [[str(p.tip.topic_id), p.tip.topic, p.tip.partition] for p in parts],
        "lookups": lookup_plan(parts, random.Random(seed + 1), LOOKUPS),
    }
    del parts
    if snapshots:
        write_snapshots(broker, info, log)
    broker.shutdown()
    (path / DATASET_FILE).write_text(json.dumps(info))
    return info


def write_snapshots(broker: BenchBroker, info: dict[str, Any], log=print) -> None:
    """Replay the logs with a real RLMM (which writes each metadata partition's snapshot once
    loaded) and close it, as a clean shutdown does; the figures go into ``info``."""
    from strata.tiered.metadata.topic_based import SNAPSHOT_DIR_NAME, TopicBasedRemoteLogMetadataManager
    snapshot_dir = broker.path / SNAPSHOT_DIR_NAME
    shutil.rmtree(snapshot_dir, ignore_errors=True)
    rlmm = TopicBasedRemoteLogMetadataManager(broker.topic_log)
    rlmm.configure(rlmm_configs(broker.path))
    t0 = time.perf_counter()
    rlmm.start()
    info["replay_in_generator_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    rlmm.close()
    info["close_s"] = round(time.perf_counter() - t0, 3)
    info["snapshot_version"] = snapshot_version()
    info["snapshot_bytes"] = sum(f.stat().st_size for f in snapshot_dir.iterdir())
    log(f"replayed and snapshotted in {info['replay_in_generator_s']:.1f} s "
        f"(snapshots {info['snapshot_bytes'] / MIB:.1f} MiB)")


def load_or_generate(path: Path, segments: int, partitions: int, seed: int, *,
                     snapshots: bool, log=print) -> dict[str, Any]:
    """The data set in ``path`` if it has these parameters (its snapshots rewritten if they
    are of another version), else a new one."""
    try:
        info = json.loads((path / DATASET_FILE).read_text())
    except (OSError, ValueError):
        info = None
    if info is None or info.get("format") != FORMAT or info["segments"] != segments \
            or info["partitions"] != partitions or info["seed"] != seed:
        return generate(path, segments, partitions, seed, snapshots=snapshots, log=log)
    log(f"reusing the data set in {path}")
    if snapshots and info.get("snapshot_version") != snapshot_version():
        log(f"rewriting its snapshots as version {snapshot_version()}")
        broker = BenchBroker(path)
        write_snapshots(broker, info, log)
        broker.shutdown()
        (path / DATASET_FILE).write_text(json.dumps(info))
    return info


# --------------------------------------------------------------------------- one round (child)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def _percentiles(ns: list[int]) -> dict[str, float]:
    ordered = sorted(ns)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000  # noqa: E731
    return {"p50_us": round(pick(0.50), 1), "p99_us": round(pick(0.99), 1),
            "max_us": round(ordered[-1] / 1000, 1)}


def child(path: Path, mode: str) -> dict[str, Any]:
    """One measured restart in this (fresh) process; see the module docstring."""
    t0 = time.perf_counter()
    from strata.tiered.api import TopicIdPartition, TopicPartition
    from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
    import_s = time.perf_counter() - t0
    info = json.loads((path / DATASET_FILE).read_text())
    tips = [TopicIdPartition(uuid.UUID(t), TopicPartition(name, p)) for t, name, p in info["tips"]]
    plan = info["lookups"]
    del info
    t0 = time.perf_counter()
    broker = BenchBroker(path)
    open_logs_s = time.perf_counter() - t0
    scratch = None
    log_dir = path
    if mode == "replay":  # no snapshots: an empty snapshot directory
        scratch = Path(tempfile.mkdtemp(prefix="rlmm-replay-", dir=path))
        log_dir = scratch
    rss_before = _status_kib("VmRSS")

    c0 = time.process_time()
    t0 = time.perf_counter()
    rlmm = TopicBasedRemoteLogMetadataManager(broker.topic_log)
    rlmm.configure(rlmm_configs(log_dir))
    rlmm.start()
    t1 = time.perf_counter()
    c1 = time.process_time()
    rss_loaded = _status_kib("VmRSS")
    first = plan[0]
    found = rlmm.remote_log_segment_metadata(tips[first[0]], first[1], first[2])
    t2 = time.perf_counter()
    c2 = time.process_time()
    rss_first = _status_kib("VmRSS")
    mismatches = 0 if found is not None and (found.start_offset, found.end_offset) == (first[3], first[4]) else 1

    passes = {}

    def lookups(name: str) -> int:
        timings = []
        wrong = 0
        for i, epoch, offset, start, end in plan:
            a = time.perf_counter_ns()
            m = rlmm.remote_log_segment_metadata(tips[i], epoch, offset)
            timings.append(time.perf_counter_ns() - a)
            if m is None or m.start_offset != start or m.end_offset != end:
                wrong += 1
        passes[name] = _percentiles(timings)
        return wrong

    mismatches += lookups("cold") + lookups("warm")
    rss_lookups = _status_kib("VmRSS")
    snapshot_before_touch_s = write_all_snapshots(rlmm, path)
    t3 = time.perf_counter()
    c3 = time.process_time()
    listed = sum(len(list(rlmm.list_remote_log_segments(tip))) for tip in tips)
    touch_all_s = time.perf_counter() - t3
    touch_all_cpu_s = time.process_time() - c3
    mismatches += lookups("after_touch")
    snapshot_after_touch_s = write_all_snapshots(rlmm, path)
    result = {
        "mode": mode, "segments_listed": listed, "import_s": round(import_s, 3),
        "open_logs_s": round(open_logs_s, 3),
        "start_s": round(t1 - t0, 3), "first_lookup_s": round(t2 - t1, 4),
        "to_first_lookup_s": round(t2 - t0, 3), "to_first_lookup_cpu_s": round(c2 - c0, 3),
        "start_cpu_s": round(c1 - c0, 3),
        "rss_before_mib": _mib(rss_before), "rss_after_start_mib": _mib(rss_loaded),
        "rss_after_first_lookup_mib": _mib(rss_first),
        "metadata_rss_mib": _mib(rss_first - rss_before),
        "rss_after_lookups_mib": _mib(rss_lookups),
        "touch_all_s": round(touch_all_s, 3), "touch_all_cpu_s": round(touch_all_cpu_s, 3),
        "snapshot_all_before_touch_s": round(snapshot_before_touch_s, 3),
        "snapshot_all_after_touch_s": round(snapshot_after_touch_s, 3),
        "rss_after_touch_mib": _mib(_status_kib("VmRSS")),
        "hwm_mib": _mib(_status_kib("VmHWM")),
        "lookups": passes, "lookup_mismatches": mismatches,
        "replayed_records": rlmm.replayed_records, "snapshots_loaded": len(rlmm.snapshot_offsets),
    }
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    broker.shutdown()
    return result


def write_all_snapshots(rlmm: Any, path: Path) -> float:
    """Seconds to write every metadata partition's snapshot (what a clean shutdown does for
    those with records since their last one), into a scratch directory. Uses the manager's
    internals: nothing public writes a snapshot on demand."""
    scratch = Path(tempfile.mkdtemp(prefix="rlmm-snapshots-", dir=path))
    log_dir, rlmm.log_dir = rlmm.log_dir, scratch
    try:
        t0 = time.perf_counter()
        for mp in rlmm._partitions:
            with mp.lock:
                rlmm._write_snapshot(mp)
        return time.perf_counter() - t0
    finally:
        rlmm.log_dir = log_dir
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- driver


def evict_page_cache(path: Path) -> None:
    """Drop the data set's files from the page cache (POSIX_FADV_DONTNEED, after a sync)."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_round(path: Path, mode: str, cold: bool) -> dict[str, Any]:
    if cold:
        evict_page_cache(path)
    load = loadavg()
    out = subprocess.run([sys.executable, "-m", "benchmarks.rlmm_scale", "--child", str(path),
                          "--mode", mode], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"round failed ({out.returncode}): {out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_before"] = load
    result["load_after"] = loadavg()
    result["page_cache"] = "cold" if cold else "warm"
    return result


SUMMARY_KEYS = ("start_s", "start_cpu_s", "first_lookup_s", "to_first_lookup_s",
                "to_first_lookup_cpu_s", "metadata_rss_mib", "hwm_mib", "touch_all_s",
                "touch_all_cpu_s", "rss_after_touch_mib", "snapshot_all_before_touch_s",
                "snapshot_all_after_touch_s")


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in SUMMARY_KEYS}
    for name in ("cold", "warm", "after_touch"):
        for q in ("p50_us", "p99_us"):
            out[f"{name}_{q}"] = statistics.median(r["lookups"][name][q] for r in rounds)
    return out


def arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replay-segments", type=int, default=None,
                    help="segments of the full-replay data set (default: --segments)")
    ap.add_argument("--replay-rounds", type=int, default=None, help="default: --rounds")
    ap.add_argument("--page-cache", choices=("warm", "cold"), default="warm")
    ap.add_argument("--data-dir", type=Path, help="keep (and reuse) the data sets here")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--json", type=Path, help="write every round and the parameters here")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("snapshot", "replay"), default="snapshot", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.mode)))
        return 0
    if args.segments < 1 or args.partitions < 1:
        raise SystemExit("--segments and --partitions must be positive")
    replay_segments = args.replay_segments if args.replay_segments is not None else args.segments
    replay_rounds = args.replay_rounds if args.replay_rounds is not None else args.rounds
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="rlmm-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), "-m", "benchmarks.rlmm_scale",
                             *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "snapshot_version": snapshot_version(), "page_cache": args.page_cache,
        "load_at_start": loadavg(), "rounds": [],
    }
    try:
        snap_dir = base / f"snapshot-{args.segments}x{args.partitions}-s{args.seed}"
        info = load_or_generate(snap_dir, args.segments, args.partitions, args.seed,
                                snapshots=True, log=log)
        report["dataset"] = {k: v for k, v in info.items() if k not in ("tips", "lookups")}
        jobs = [(snap_dir, "snapshot")] * args.rounds
        if replay_rounds:
            if replay_segments == args.segments:
                replay_dir = snap_dir
            else:
                replay_dir = base / f"replay-{replay_segments}x{args.partitions}-s{args.seed}"
                rinfo = load_or_generate(replay_dir, replay_segments, args.partitions, args.seed,
                                         snapshots=False, log=log)
                report["replay_dataset"] = {k: v for k, v in rinfo.items() if k not in ("tips", "lookups")}
            jobs += [(replay_dir, "replay")] * replay_rounds
        for n, (path, mode) in enumerate(jobs, 1):
            result = run_round(path, mode, args.page_cache == "cold")
            result["round"] = n
            report["rounds"].append(result)
            print(json.dumps(result), flush=True)
        for mode in ("snapshot", "replay"):
            rounds = [r for r in report["rounds"] if r["mode"] == mode]
            if rounds:
                report[f"median_{mode}"] = summarise(rounds)
                log(f"median {mode}: {json.dumps(report[f'median_{mode}'])}")
    finally:
        if args.data_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    report["load_at_end"] = loadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
