"""Remote read replicas (issue 52): how far a read replica lags behind its origin.

    python -m benchmarks.read_replica_lag --rounds 3 [--duration 20] [--manifest-interval-ms 1000]
        [--refresh-ms 1000] [--json PATH]

Two ``strata serve`` processes on loopback: the origin tiers topic ``lag`` (64 KiB segments,
a filesystem bucket under its log dir, ``strata.remote.manifest.interval.ms`` as given); the
replica (its own data dir, no tier of its own) serves it with ``strata.remote.readreplica``
pointing at the origin's remote dir and ``strata.remote.readreplica.refresh.ms`` as given. A
producer writes about 300 KB/s to the origin (about five segments a second uploaded). Each
round, for ``--duration`` seconds, a watcher looks every 20 ms at the origin's bucket for new
``.log`` objects of the partition (an object's upload time is its mtime: the filesystem store
writes it by rename once complete) and asks the replica's ListOffsets latest; a segment is
readable on the replica once that latest is above the segment's start offset (the replica
serves whole segments only). The lag of a segment is from its upload to that moment; the
20 ms polling adds up to 20 ms.

Expected bound: the origin writes its manifest after its next copier task at most every
manifest interval (the task interval is 200 ms here), and the replica reads the pointer again
every refresh interval, so a segment's lag is at most about
manifest interval + task interval + refresh interval.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.brokers import COMMON_BROKER, StrataBroker, log

TOPIC = "lag"
TOPIC_CONFIG = {"remote.storage.enable": "true", "internal.segment.bytes": str(64 * 1024),
                "retention.ms": "-1", "local.retention.bytes": "1"}


def _create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(60)


def _segments(remote_dir: Path) -> dict[int, float]:
    """start offset -> upload time of every ``.log`` object of the topic's partition 0."""
    out = {}
    for path in remote_dir.glob(f"{TOPIC}-*/0/*.log"):
        try:
            out[int(path.name.split("-", 1)[0])] = path.stat().st_mtime
        except (OSError, ValueError):
            continue
    return out


class Producer(threading.Thread):
    def __init__(self, bootstrap: str, rate_bytes: int = 300_000):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.rate = rate_bytes
        self.stop = threading.Event()

    def run(self) -> None:
        import confluent_kafka as ck
        p = ck.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20})
        value = b"x" * 300
        per_tick = max(1, self.rate // len(value) // 50)
        while not self.stop.is_set():
            for _ in range(per_tick):
                p.produce(TOPIC, value, partition=0)
            p.poll(0)
            self.stop.wait(0.02)
        p.flush(30)


def measure(origin: StrataBroker, replica_bootstrap: str, duration: float) -> list[float]:
    """Lags (seconds) of the segments the origin uploaded during ``duration``."""
    import confluent_kafka as ck
    from confluent_kafka import TopicPartition
    consumer = ck.Consumer({"bootstrap.servers": replica_bootstrap, "group.id": "lag-probe"})
    remote_dir = origin.remote_dir()
    known = set(_segments(remote_dir))
    pending: dict[int, float] = {}
    lags: list[float] = []
    start = time.time()
    try:
        while True:
            now = time.time()
            for s, uploaded in _segments(remote_dir).items():
                if s not in known:
                    known.add(s)
                    if now - start < duration:
                        pending[s] = uploaded
            if pending:
                _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=5)
                seen = time.time()
                for s in [s for s in pending if high > s]:
                    lags.append(seen - pending.pop(s))
            if now - start >= duration and not pending:
                return lags
            if now - start > duration + 120:
                raise TimeoutError(f"segments never readable on the replica: {sorted(pending)}")
            time.sleep(0.02)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--manifest-interval-ms", type=int, default=1000)
    parser.add_argument("--refresh-ms", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="rr-lag-") as tmp:
        origin = StrataBroker(Path(tmp) / "origin", {
            **COMMON_BROKER, "remote.log.manager.task.interval.ms": "200",
            "strata.remote.manifest.interval.ms": str(args.manifest_interval_ms)})
        replica = StrataBroker(Path(tmp) / "replica", {"num.partitions": "1"})
        origin.start()
        replica.start()
        producer = Producer(origin.bootstrap)
        try:
            _create(origin.bootstrap, TOPIC, TOPIC_CONFIG)
            producer.start()
            deadline = time.time() + 60
            while True:      # the replica needs the origin's first manifests
                try:
                    _create(replica.bootstrap, TOPIC, {
                        "strata.remote.readreplica": str(origin.remote_dir()),
                        "strata.remote.readreplica.refresh.ms": str(args.refresh_ms)})
                    break
                except Exception as e:  # noqa: BLE001 - no manifest yet
                    if time.time() > deadline:
                        raise
                    log(f"waiting for the origin's manifests: {e}")
                    time.sleep(0.5)
            for r in range(args.rounds):
                lags = measure(origin, replica.bootstrap, args.duration)
                row = {"round": r + 1, "segments": len(lags),
                       "median_s": round(statistics.median(lags), 3),
                       "p95_s": round(sorted(lags)[int(0.95 * (len(lags) - 1))], 3),
                       "max_s": round(max(lags), 3), "min_s": round(min(lags), 3)}
                results.append(row)
                log(json.dumps(row))
        finally:
            producer.stop.set()
            producer.join(30)
            replica.stop()
            origin.stop()
    summary = {"manifest_interval_ms": args.manifest_interval_ms, "refresh_ms": args.refresh_ms,
               "duration_s": args.duration, "rounds": results}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
