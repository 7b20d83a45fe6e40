"""The ``strata`` command: argument parsing, ``strata serve`` (a ``strata.broker.Broker`` built
from the server properties) and the offline tools."""

from __future__ import annotations

import argparse
import asyncio
import errno
import faulthandler
import logging
import os
import re
import signal
import sys
from pathlib import Path

from strata.common.config import load_properties
from strata.common.errors import KafkaError


def read_server_properties(path: str | None, overrides: list[str]) -> dict[str, str]:
    props = load_properties(Path(path).read_text()) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--override expects key=value, got {item!r}")
        props[key.strip()] = value.strip()
    return props


def _fail(message: str) -> int:
    """The one line a broker that cannot start prints (no traceback); exit code 1."""
    print(f"strata: {message}", file=sys.stderr, flush=True)
    return 1


def _broker_config(args: argparse.Namespace) -> dict[str, str]:
    """``--config`` and ``--override`` read as ``strata serve`` reads them; an unreadable file
    raises ``_ConfigUnreadable`` with the line to print."""
    # kio registers hypothesis strategies for its types whenever hypothesis is importable (a
    # test dependency, in development installs): 0.15-0.2 s of every broker start. A broker
    # process never uses them.
    if "kio" not in sys.modules:
        sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    try:
        return read_server_properties(args.config, args.override)
    except OSError as exc:
        raise _ConfigUnreadable(
            f"cannot read the config file {args.config}: {exc.strerror or exc}") from None


class _ConfigUnreadable(Exception):
    pass


def serve(args: argparse.Namespace) -> int:
    try:
        props = _broker_config(args)
    except _ConfigUnreadable as exc:
        return _fail(str(exc))
    from strata.broker import config_check
    log = logging.getLogger("strata.broker.config")
    file_keys = load_properties(Path(args.config).read_text()) if args.config else {}
    for line in config_check.unknown_key_warnings(
            props, config_check.origins(args.config, file_keys, args.override)):
        log.warning("%s", line)
    try:
        config_check.check_values(props)
    except config_check.ConfigProblem as exc:
        return _fail(str(exc))
    log.info("%s", config_check.effective_config(props))

    async def main() -> None:
        from strata.broker.broker import Broker
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            broker = Broker.build(props, loop)
        except (ValueError, KafkaError) as exc:   # a config value the broker's parts refuse
            log.debug("start failed", exc_info=True)
            raise _StartFailed(f"invalid configuration: {exc}") from exc
        await broker.serve(stop)

    # kill -USR1 <pid> writes every thread's stack to stderr (Kafka's jstack)
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        uvloop = None
    try:
        if uvloop is not None:
            uvloop.run(main())
        else:
            asyncio.run(main())
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        log.debug("start failed", exc_info=True)
        return _fail(f"cannot listen on {_address_of(exc)}: address already in use")
    except _StartFailed as exc:
        return _fail(str(exc))
    return 0


class _StartFailed(Exception):
    """Building the broker failed for a reason its one line says."""


def _address_of(exc: OSError) -> str:
    """The address of asyncio's bind error ("... on address ('h', p): ..."), else the configs
    that name addresses (the metrics endpoint's error names none)."""
    m = re.search(r"\('([^']*)', (\d+)\)", str(exc))
    return f"{m.group(1)}:{m.group(2)}" if m else "an address of listeners or strata.metrics.listener"


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


def _fetch_json(url: str, timeout: float = 30) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {"error": exc.reason}


def format_tiered_table(doc: dict) -> str:
    """``strata tiered describe``'s table of a ``/tiered/<topic>`` document."""
    columns = (("PARTITION", "partition"), ("LOG-START", "log_start_offset"),
               ("LOCAL-LOG-START", "local_log_start_offset"), ("HIGH-WATERMARK", "high_watermark"),
               ("LOG-END", "log_end_offset"),
               ("HIGHEST-REMOTE-OFFSET", "highest_offset_in_remote_storage"),
               ("LOCAL-SEGMENTS", "local_segments"), ("LOCAL-BYTES", "local_bytes"),
               ("REMOTE-SEGMENTS", "remote_segments"), ("REMOTE-BYTES", "remote_bytes"))
    rows = [[title for title, _ in columns]]
    for p in doc.get("partitions", []):
        rows.append(["-" if p.get(key) is None else str(p.get(key)) for _, key in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = [f"Topic: {doc.get('topic')}\tTopicId: {doc.get('topic_id') or '-'}\t"
             f"remote.storage.enable: {str(bool(doc.get('remote_storage_enable'))).lower()}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    for p in doc.get("partitions", []):
        if p.get("remote_error"):
            lines.append(f"partition {p['partition']}: remote metadata unavailable: {p['remote_error']}")
    return "\n".join(lines)


def tiered_describe(args: argparse.Namespace) -> int:
    """Per partition offsets and tier sizes of a topic, from a broker's metrics endpoint."""
    from urllib.parse import quote
    url = f"{args.metrics_url.rstrip('/')}/tiered/{quote(args.topic, safe='')}"
    try:
        status, doc = _fetch_json(url)
    except OSError as exc:
        print(f"cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: HTTP {status}: {doc.get('error', '')}", file=sys.stderr)
        return 1
    print(format_tiered_table(doc))
    return 0


def tiered_metadata(args: argparse.Namespace) -> int:
    """Print every record of ``__remote_log_metadata`` from its partition logs, offline, in the
    form of Kafka's RemoteLogMetadataFormatter, each followed by the leader epoch its writer
    led at (where it says) and, for a record the brokers skip when they apply the topic (a
    deposed leader's, an illegal transition), why. Reads the segment files only (no locks, no
    writes), so run it on a stopped broker's log dir or accept a torn last batch."""
    import mmap
    import re
    from strata.protocol import records as rec
    from strata.tiered.metadata.cache import RemotePartitionMetadataStore
    from strata.tiered.metadata.formatting import format_record, format_verdict
    from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME
    log_dir = Path(args.log_dir)
    pattern = re.compile(rf"^{re.escape(REMOTE_LOG_METADATA_TOPIC_NAME)}-(\d+)$")
    partitions = sorted((int(m.group(1)), d) for d in (log_dir.iterdir() if log_dir.is_dir() else [])
                        if d.is_dir() and (m := pattern.match(d.name)))
    if not partitions:
        print(f"no {REMOTE_LOG_METADATA_TOPIC_NAME} partitions in {log_dir}", file=sys.stderr)
        return 1
    bad = 0
    store = RemotePartitionMetadataStore()   # applies the records as every broker does
    for partition, directory in partitions:
        if args.partition is not None and partition != args.partition:
            continue
        for segment in sorted(directory.glob("*.log")):
            with open(segment, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    continue
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    for header in rec.iter_headers(data):
                        if header.is_control:
                            continue
                        try:
                            records = rec.decode_batch(data, header)
                        except ValueError as exc:
                            bad += 1
                            print(f"partition: {partition}, offset: {header.base_offset}, "
                                  f"error: undecodable batch: {exc}")
                            continue
                        for r in records:
                            try:
                                line = format_record(partition, r.offset, r.value)
                                print(line + format_verdict(store, r.value))
                            except ValueError as exc:
                                bad += 1
                                print(f"partition: {partition}, offset: {r.offset}, error: {exc}")
    return 1 if bad else 0


def cluster_restore(args: argparse.Namespace) -> int:
    """``strata cluster restore``: start the broker of this config (empty, single broker),
    restore the bucket's newest cluster snapshot into it, report, shut it down."""
    try:
        props = _broker_config(args)
    except _ConfigUnreadable as exc:
        return _fail(str(exc))
    if props.get("zookeeper.connect"):
        return _fail("strata cluster restore restores a single broker (no zookeeper.connect)")

    async def main():
        from strata.broker.broker import Broker
        from strata.tiered.bucket.snapshot import restore
        broker = Broker.build(props)
        await broker.start()
        try:
            return await restore(broker, progress=lambda line: print(line, flush=True))
        finally:
            await broker.shutdown()
    try:
        report = asyncio.run(main())
    except (ValueError, KafkaError) as exc:
        return _fail(f"invalid configuration: {exc}")
    except RuntimeError as exc:     # no remote tier, not an empty broker
        return _fail(str(exc))
    for line in report.lines():
        print(line)
    return 0 if report.restored else 1


def spark_job(args: argparse.Namespace) -> int:
    """``strata spark JOB``: the pipelines of ``strata.spark.pipelines`` (backfill, audit, usage)."""
    from strata.spark.pipelines import run
    return run(args)


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
    p = sub.add_parser("tiered", help="tiered storage tools")
    tiered = p.add_subparsers(dest="tiered_command", required=True)
    p = tiered.add_parser("describe", help="offsets and tier sizes of a topic's partitions, from a "
                                           "broker's metrics endpoint (strata.metrics.listener)")
    p.add_argument("topic")
    p.add_argument("--metrics-url", required=True, help="the broker's metrics endpoint, http://host:port")
    p.set_defaults(fn=tiered_describe)
    p = tiered.add_parser("metadata", help="print every __remote_log_metadata record from a log "
                                           "dir, offline")
    p.add_argument("--log-dir", required=True, help="a broker log dir (one of log.dirs)")
    p.add_argument("--partition", type=int, default=None, help="only this metadata partition")
    p.set_defaults(fn=tiered_metadata)
    p = sub.add_parser("storage", help="storage tools (Kafka's kafka-storage)")
    storage = p.add_subparsers(dest="storage_command", required=True)
    p = storage.add_parser("format", help="prepare storage before the first start; "
                                          "--add-scram creates SCRAM credentials")
    from strata.cli.storage_format import add_arguments as add_format_arguments
    add_format_arguments(p)
    p = sub.add_parser("zookeeper-security-migration",
                       help="set Kafka's ACLs on existing znodes (Kafka's "
                            "zookeeper-security-migration)")
    from strata.cli.zk_security_migration import add_arguments as add_migration_arguments
    add_migration_arguments(p)
    p = sub.add_parser("cluster", help="cluster tools")
    cluster = p.add_subparsers(dest="cluster_command", required=True)
    p = cluster.add_parser("restore", help="restore the remote tier's newest cluster snapshot "
                                           "(topics, committed offsets, quotas) into an empty "
                                           "single broker, reading its config as serve does")
    p.add_argument("--config", default=None, help="server.properties file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(fn=cluster_restore)
    p = sub.add_parser("spark", help="Spark pipelines over topics: backfill, audit, usage")
    if "spark" in (sys.argv[1:] if argv is None else argv):
        # only then: importing the pipelines takes 0.2 s of every other command's start
        from strata.spark.pipelines import add_arguments as add_spark_arguments
        add_spark_arguments(p)
    p.set_defaults(fn=spark_job)
    args = parser.parse_args(argv)
    level = args.log_level.strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        return _fail(f"invalid --log-level '{args.log_level}': expected one of "
                     "DEBUG, INFO, WARNING, ERROR, CRITICAL")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
