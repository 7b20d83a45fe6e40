"""Log cleaner throughput: MB/s of dirty log compacted by ``Cleaner.clean``.

    python -m benchmarks.cleaner [--total-mib 64] [--keys 10000] [--value-bytes 100]
                                   [--codec none|lz4|zstd] [--dir DIR] [--system strata|kafka]

Writes ``--total-mib`` of batches of 200 keyed records (keys drawn from ``--keys``) to a
compacted log, rolls it, then times one clean of the whole dirty section (offset map, rewrite,
swap) and prints one JSON line: dirty MiB, seconds, MB/s (10^6 bytes), and the bytes kept.

``--system kafka`` produces the same records (same keys, values, count, codec, 200 a batch) to
a 1 MiB-segment topic of an Apache Kafka broker (``benchmarks.brokers``), rolls it, turns on
``cleanup.policy=compact`` and reads Kafka's own figure from its ``log-cleaner.log`` (Kafka
prints MiB; ``mb_per_s`` is converted to 10^6 bytes, ``logged`` is Kafka's text).
``--system strata-broker`` does the same against ``strata serve`` and reads its cleaner's
"cleaned ... bytes in Ns" line from the broker log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from strata.log.log_cleaner import Cleaner, OffsetMap, log_to_clean
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import Compression, SimpleRecord, build_batch

MIB = 1024 * 1024
RECORDS_PER_BATCH = 200


def record_batches(keys: int, value: bytes):
    """Endless batches of (key, value): the same sequence on every run and system."""
    rnd = random.Random(1)
    while True:
        yield [(b"key-%d" % rnd.randrange(keys), value) for _ in range(RECORDS_PER_BATCH)]


def build_log(directory: Path, total_mib: int, keys: int, value: bytes,
              codec: Compression) -> UnifiedLog:
    config = LogConfig({"cleanup.policy": "compact", "segment.bytes": 64 * MIB,
                        "file.delete.delay.ms": 0})
    ulog = UnifiedLog(directory, config)
    batches = record_batches(keys, value)
    while ulog.size < total_mib * MIB:
        batch = build_batch([SimpleRecord(v, k) for k, v in next(batches)], compression=codec)
        ulog.append_as_leader(batch, 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    ulog.roll()
    return ulog


KAFKA_LOG4J = """\
status = error
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
appender.cleaner.type = File
appender.cleaner.name = CLEANER
appender.cleaner.fileName = {path}
appender.cleaner.layout.type = PatternLayout
appender.cleaner.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
""" + "".join(f"""\
logger.{name}.name = org.apache.kafka.storage.internals.log.{cls}
logger.{name}.level = INFO
logger.{name}.additivity = false
logger.{name}.appenderRef.cleaner.ref = CLEANER
""" for name, cls in [("cleaner", "LogCleaner"), ("thread", "LogCleaner$CleanerThread"),
                      ("cleanerimpl", "Cleaner")])
KAFKA_STATS = re.compile(r"cleaned log (\S+) \(dirty section = \[(\d+), (\d+)\]\)\s+"
                         r"([\d,.]+) MB of log processed in ([\d,.]+) seconds "
                         r"\(([\d,.]+) MB/sec\)")


STRATA_STATS = re.compile(r"cleaned (\S+) up to (\d+): (\d+) -> (\d+) bytes in ([\d.]+)s")


def broker_clean(system: str, base: Path, count: int, keys: int, value: bytes, codec: str,
                 timeout: float = 180) -> dict:
    """Produce ``count`` records of ``record_batches`` to a broker of ``system`` under
    ``cleanup.policy=delete``, roll, switch to ``compact``; the broker's figure for the clean."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)
    from benchmarks.brokers import find_kafka_libs, make_broker
    libs, log4j = None, None
    if system == "kafka":
        libs, why = find_kafka_libs()
        if libs is None:
            raise SystemExit(why)
        log4j = base / "kafka-log4j2.properties"
        log4j.write_text(KAFKA_LOG4J.format(path=base / system / "logs" / "log-cleaner.log"))
    broker = make_broker(system, base / system, libs, {"log.cleaner.backoff.ms": "100"},
                         log4j=log4j)
    cleaner_log = (base / system / "logs" / "log-cleaner.log" if system == "kafka"
                   else broker.log_path)
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = "bench"
        # Produced under cleanup.policy=delete so that the cleaner sees the whole log at once.
        admin.create_topics([NewTopic(topic, 1, 1, config={
            "cleanup.policy": "delete", "segment.bytes": str(MIB), "retention.ms": "-1",
            "min.cleanable.dirty.ratio": "0.01"})])[topic].result()

        def alter(**cfg: str) -> None:
            res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
                ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
                for k, v in cfg.items()])
            admin.incremental_alter_configs([res])[res].result()
            time.sleep(1)   # let the broker apply it

        producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec,
                             "batch.num.messages": RECORDS_PER_BATCH, "linger.ms": 100,
                             "batch.size": 8 * MIB, "queue.buffering.max.kbytes": 1024 * 1024,
                             "queue.buffering.max.messages": 10_000_000})
        sent = 0
        for batch in record_batches(keys, value):
            for k, v in batch[:count - sent]:
                producer.produce(topic, v, k, partition=0)
            sent += min(len(batch), count - sent)
            if sent >= count:
                break
        producer.flush(60)
        alter(segment_ms="1")                     # roll the active segment on the next append
        producer.produce(topic, b"x", b"roll", partition=0)
        producer.flush(60)
        part = next((base / system).rglob(f"{topic}-0"))
        dirty = sum(f.stat().st_size for f in part.glob("*.log"))
        start = time.monotonic()
        alter(cleanup_policy="compact", segment_ms=str(7 * 24 * 3600 * 1000))
        pattern = KAFKA_STATS if system == "kafka" else STRATA_STATS
        while time.monotonic() - start < timeout:
            text = cleaner_log.read_text(errors="replace") if cleaner_log.exists() else ""
            m = next((m for m in pattern.finditer(text) if m.group(1) == f"{topic}-0"), None)
            if m:
                out = {"workload": "cleaner", "system": "kafka" if libs else "strata-broker",
                       "codec": codec, "keys": keys, "records": count, "dirty_bytes": dirty}
                if system == "kafka":   # Kafka's MB are MiB; its seconds are rounded to 0.1
                    mib_s = float(m.group(6).replace(",", ""))
                    out.update(seconds=float(m.group(5).replace(",", "")),
                               mb_per_s=round(mib_s * MIB / 1e6, 1),
                               clean_end_offset=int(m.group(3)),
                               logged=m.group(0).splitlines()[-1].strip())
                else:
                    read, seconds = int(m.group(3)), float(m.group(5))
                    out.update(seconds=seconds, mb_per_s=round(read / 1e6 / seconds, 1),
                               bytes_kept=int(m.group(4)), clean_end_offset=int(m.group(2)),
                               logged=m.group(0))
                return out
            time.sleep(0.2)
        raise TimeoutError(f"{system}'s cleaner did not clean {topic}-0 in {timeout} s; "
                           f"see {cleaner_log}")
    finally:
        broker.stop()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-mib", type=int, default=64)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--codec", choices=[c.name.lower() for c in Compression], default="none")
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--system", choices=["strata", "kafka", "strata-broker"], default="strata",
                   help="strata: Cleaner.clean in this process; kafka / strata-broker: a broker's "
                        "own cleaner on the same records produced to it")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="strata-cleaner-bench-", dir=args.dir))
    try:
        value = os.urandom(args.value_bytes)
        # Strata's log is built in both modes: it fixes the record count Kafka gets.
        ulog = build_log(base / "bench-0", args.total_mib, args.keys, value,
                         Compression[args.codec.upper()])
        dirty = ulog.size
        if args.system != "strata":
            count = ulog.log_end_offset
            ulog.close()
            print(json.dumps(broker_clean(args.system.split("-")[0], base, count, args.keys,
                                          value, args.codec)))
            return
        cleaner = Cleaner(OffsetMap(128 * MIB))
        start = time.perf_counter()
        end, stats = cleaner.clean(log_to_clean(ulog.topic_partition, ulog, None,
                                                int(time.time() * 1000)))
        seconds = time.perf_counter() - start
        print(json.dumps({"workload": "cleaner", "system": "strata", "codec": args.codec,
                          "keys": args.keys, "records": ulog.log_end_offset, "dirty_bytes": dirty,
                          "dirty_mib": round(dirty / MIB, 1), "seconds": round(seconds, 3),
                          "mb_per_s": round(dirty / 1e6 / seconds, 1),
                          "bytes_kept": stats.bytes_written, "clean_end_offset": end}))
        ulog.close()
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
