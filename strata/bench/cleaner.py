"""Log cleaner throughput: MB/s of dirty log compacted by ``Cleaner.clean``.

    python -m strata.bench.cleaner [--total-mib 64] [--keys 10000] [--value-bytes 100]
                                   [--codec none|lz4|zstd] [--dir DIR]

Writes ``--total-mib`` of batches of 200 keyed records (keys drawn from ``--keys``) to a
compacted log, rolls it, then times one clean of the whole dirty section (offset map, rewrite,
swap) and prints one JSON line: dirty MiB, seconds, MB/s, and the bytes kept.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from strata.log.log_cleaner import Cleaner, OffsetMap, log_to_clean
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import Compression, SimpleRecord, build_batch

MIB = 1024 * 1024
RECORDS_PER_BATCH = 200


def build_log(directory: Path, total_mib: int, keys: int, value_bytes: int,
              codec: Compression) -> UnifiedLog:
    config = LogConfig({"cleanup.policy": "compact", "segment.bytes": 64 * MIB,
                        "file.delete.delay.ms": 0})
    ulog = UnifiedLog(directory, config)
    rnd = random.Random(1)
    value = os.urandom(value_bytes)
    while ulog.size < total_mib * MIB:
        batch = build_batch([SimpleRecord(value, b"key-%d" % rnd.randrange(keys))
                             for _ in range(RECORDS_PER_BATCH)], compression=codec)
        ulog.append_as_leader(batch, 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    ulog.roll()
    return ulog


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-mib", type=int, default=64)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--codec", choices=[c.name.lower() for c in Compression], default="none")
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="strata-cleaner-bench-", dir=args.dir))
    try:
        ulog = build_log(base / "bench-0", args.total_mib, args.keys, args.value_bytes,
                         Compression[args.codec.upper()])
        dirty = ulog.size
        cleaner = Cleaner(OffsetMap(128 * MIB))
        start = time.perf_counter()
        end, stats = cleaner.clean(log_to_clean(ulog.topic_partition, ulog, None,
                                                int(time.time() * 1000)))
        seconds = time.perf_counter() - start
        print(json.dumps({"workload": "cleaner", "codec": args.codec, "keys": args.keys,
                          "dirty_mib": round(dirty / MIB, 1), "seconds": round(seconds, 3),
                          "mb_per_s": round(dirty / 1e6 / seconds, 1),
                          "bytes_kept": stats.bytes_written, "clean_end_offset": end}))
        ulog.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
