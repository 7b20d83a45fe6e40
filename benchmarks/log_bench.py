"""In-process throughput of the local log: append and read of 1 MiB batches of 1 KB records.

    python -m benchmarks.log_bench [--total-mib 4096] [--rounds 3] [--dir DIR]

Append goes through ``UnifiedLog.append_as_leader`` (header validation, CRC32C, offset
assignment, producer-state and index updates, one pwrite into the page cache; rolled segments
are fsynced in the background as Kafka does). Read is a consumer's sequential scan through
``UnifiedLog.read`` with ``max_length`` = 1 MiB (Kafka's default max.partition.fetch.bytes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from strata.common.scheduler import KafkaScheduler
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch

MIB = 1024 * 1024


def one_mib_batch(record_size: int = 1000) -> bytes:
    value = os.urandom(record_size)
    n = 1
    # as many 1 KB records as fit in 1 MiB
    while True:
        b = build_batch([SimpleRecord(value)] * (n + 64))
        if len(b) > MIB:
            break
        n += 64
    while len(build_batch([SimpleRecord(value)] * (n + 1))) <= MIB:
        n += 1
    return build_batch([SimpleRecord(value)] * n)


def run_round(directory: Path, data: bytes, total_bytes: int, read_max: int) -> tuple[float, float, int]:
    shutil.rmtree(directory, ignore_errors=True)
    scheduler = KafkaScheduler(threads=1, name="bench-flush")
    ulog = UnifiedLog(directory / "bench-0", LogConfig({}), scheduler=scheduler)
    n = max(1, total_bytes // len(data))
    t0 = time.perf_counter()
    for _ in range(n):
        ulog.append_as_leader(data, 0)
    append_s = time.perf_counter() - t0
    ulog.update_high_watermark(ulog.log_end_offset)
    written = ulog.size
    t0 = time.perf_counter()
    offset, read_bytes = 0, 0
    end = ulog.log_end_offset
    while offset < end:
        got = ulog.read(offset, read_max)
        read_bytes += len(got.records)
        # next offset: base offset + lastOffsetDelta + 1 of the last batch returned
        last = got.records
        pos = 0
        while pos < len(last):
            size = int.from_bytes(last[pos + 8:pos + 12], "big") + 12
            if pos + size >= len(last):
                offset = int.from_bytes(last[pos:pos + 8], "big") + \
                    int.from_bytes(last[pos + 23:pos + 27], "big") + 1
            pos += size
    read_s = time.perf_counter() - t0
    ulog.close()
    scheduler.shutdown()
    assert read_bytes == written, (read_bytes, written)
    return written / append_s, read_bytes / read_s, written


def raw_ceiling(directory: Path, data: bytes, total_bytes: int) -> tuple[float, float]:
    """Plain pwrite then pread of the same bytes in 1 MiB calls: the page cache's own limit."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "raw"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = max(1, total_bytes // len(data))
        t0 = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, data, i * len(data))
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(n):
            os.pread(fd, len(data), i * len(data))
        read_s = time.perf_counter() - t0
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return n * len(data) / write_s, n * len(data) / read_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-mib", type=int, default=4096, help="bytes appended per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--read-max-bytes", type=int, default=MIB)
    p.add_argument("--dir", default=None, help="scratch dir (default: a temp dir under /var/tmp)")
    args = p.parse_args(argv)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="strata-bench-", dir="/var/tmp"))
    data = one_mib_batch()
    records = int.from_bytes(data[57:61], "big")
    print(f"batch: {len(data)} bytes, {records} records of 1000 B; {args.total_mib} MiB per round")
    appends, reads, raw_w, raw_r = [], [], [], []
    try:
        for r in range(args.rounds):
            # alternate the raw ceiling and the log so drift in the machine affects both
            w, rr = raw_ceiling(base / f"raw{r}", data, args.total_mib * MIB)
            raw_w.append(w)
            raw_r.append(rr)
            a, rd, written = run_round(base / f"round{r}", data, args.total_mib * MIB, args.read_max_bytes)
            shutil.rmtree(base / f"round{r}", ignore_errors=True)
            appends.append(a)
            reads.append(rd)
            print(f"round {r + 1}: log append {a / 1e9:.2f} GB/s, log read {rd / 1e9:.2f} GB/s; "
                  f"raw pwrite {w / 1e9:.2f} GB/s, raw pread {rr / 1e9:.2f} GB/s ({written / MIB:.0f} MiB)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print("| figure | median | min | max |")
    print("|---|---|---|---|")
    for name, xs in (("log append (GB/s)", appends), ("log read (GB/s)", reads),
                     ("raw pwrite, same disk (GB/s)", raw_w), ("raw pread, same disk (GB/s)", raw_r)):
        print(f"| {name} | {statistics.median(xs) / 1e9:.2f} | {min(xs) / 1e9:.2f} | {max(xs) / 1e9:.2f} |")
    print(f"| append (records/s) | {statistics.median(appends) / len(data) * records:,.0f} | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
