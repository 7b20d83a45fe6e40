"""The ``strata`` command: the one place where concrete classes are built and wired together."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from strata.common.config import load_properties
from strata.common.scheduler import KafkaScheduler
from strata.log.log_config import LogConfig, topic_defaults_from_broker
from strata.log.log_manager import LogManager

log = logging.getLogger("strata")


def read_server_properties(path: str | None, overrides: list[str]) -> dict[str, str]:
    props = load_properties(Path(path).read_text()) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--override expects key=value, got {item!r}")
        props[key.strip()] = value.strip()
    return props


def _int(props: dict[str, str], key: str, default: int) -> int:
    return int(props.get(key, default))


def serve(args: argparse.Namespace) -> int:
    props = read_server_properties(args.config, args.override)
    log_dirs = [Path(d) for d in props.get("log.dirs", props.get("log.dir", "/tmp/kafka-logs")).split(",")]
    default_config = LogConfig(topic_defaults_from_broker(props))
    scheduler = KafkaScheduler(threads=2)
    manager = LogManager(log_dirs, default_config, scheduler=scheduler)
    manager.startup()
    scheduler.schedule_periodic("log-retention", manager.cleanup_logs,
                                _int(props, "log.retention.check.interval.ms", 300_000))
    scheduler.schedule_periodic("recovery-point-checkpoint", manager.checkpoint,
                                _int(props, "log.flush.offset.checkpoint.interval.ms", 60_000))
    flush_interval = _int(props, "log.flush.scheduler.interval.ms", 2**63 - 1)
    if flush_interval < 2**62:
        scheduler.schedule_periodic("log-flusher", manager.flush_dirty_logs, flush_interval)
    scheduler.schedule_periodic("producer-expiration",
                                lambda: [ul.remove_expired_producers() for ul in manager.all_logs()],
                                _int(props, "producer.id.expiration.check.interval.ms", 600_000))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("storage engine up: %d partition logs under %s", len(manager.partitions()),
             ", ".join(map(str, log_dirs)))
    log.info("the Kafka protocol listener is not built yet (issue: single-node broker); "
             "this process manages the local log only")
    stop.wait()
    log.info("shutting down")
    scheduler.shutdown(run_pending=False)
    manager.shutdown()
    log.info("clean shutdown complete")
    return 0


def dump_log(args: argparse.Namespace) -> int:
    """Print the batches of segment files, in the spirit of Kafka's DumpLogSegments."""
    from strata.protocol import records as rec
    for name in args.files:
        data = Path(name).read_bytes()
        print(f"Dumping {name}")
        end = 0
        for h in rec.iter_headers(data):
            end = h.position + h.size
            print(f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
                  f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
                  f"baseSequence: {h.base_sequence} partitionLeaderEpoch: {h.partition_leader_epoch} "
                  f"isTransactional: {h.is_transactional} isControl: {h.is_control} "
                  f"position: {h.position} maxTimestamp: {h.max_timestamp} size: {h.size} "
                  f"compression: {h.compression} crcValid: {rec.batch_crc_ok(data, h)}")
            if args.print_data:
                for r in rec.decode_batch(data, h):
                    print(f"| offset: {r.offset} timestamp: {r.timestamp} key: {r.key!r} "
                          f"value: {r.value!r} headers: {list(r.headers)}")
        if end != len(data):
            print(f"Found {len(data) - end} bytes at the end that are not a whole batch")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata", description="Kafka-compatible tiered log broker")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run a single-node broker")
    p.add_argument("--config", default=None, help="server.properties file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(fn=serve)
    p = sub.add_parser("dump-log", help="print the batches of .log segment files")
    p.add_argument("files", nargs="+")
    p.add_argument("--print-data", action="store_true")
    p.set_defaults(fn=dump_log)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
