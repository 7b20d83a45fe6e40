"""Child process of ``test_crash_recovery.py``: appends to one local log until it is SIGKILLed.

Usage: ``python crash_writer.py DATA_DIR SEED``

Opens a LogManager on DATA_DIR (a single log dir) with tiny segments and indexes, gets or
creates the log ``crash-0`` and appends batches forever. Every record's key and value are a
deterministic function of the offset it lands at (``record_value``), so the parent can check
any batch it reads back without knowing what this process wrote. Batches mix codecs, sizes and
idempotent batches of producer ``PRODUCER_ID`` (epoch 0, sequences continuing across runs from
the recovered producer state). Every run appends with a new partition leader epoch.

Progress lines on stdout (flushed one by one, so whatever the parent reads was printed):

    OPEN <log end offset> <recovery point> <clean 0|1> <leader epoch> <next sequence>
    DUP <first offset> <last offset> <base sequence> <last sequence>   (retry of the last
                                          idempotent batch, answered from producer state)
    ACK <first offset> <last offset>       after each append returned
    CKPT <recovery point>                  after log.flush() + manager.checkpoint()
    CYCLE <log end offset>                 after an in-process clean shutdown and restart

As in the broker, a ``KafkaScheduler`` flushes rolled segments in the background. Now and then
the writer shuts the LogManager down cleanly and starts it again (the kill may land in either).

Any inconsistency seen here (offset not assigned at the log end, a retry not detected as a
duplicate, a rejected sequence) makes the process print ``ERROR ...`` and exit with status 3.
"""

from __future__ import annotations

import hashlib
import random
import sys
import traceback
from pathlib import Path

TOPIC = "crash"
PARTITION = 0
PRODUCER_ID = 4242
PRODUCER_EPOCH = 0

# Small segments (64 KiB), an index entry every ~512 bytes and indexes of 512 bytes (64 offset
# index entries, 42 time index entries): segments of large batches roll on size, segments of
# small batches (the writer alternates phases of both) roll on a full offset index.
LOG_CONFIG = {
    "internal.segment.bytes": 64 * 1024,
    "index.interval.bytes": 512,
    "segment.index.bytes": 512,
}

_FILLER_BLOCK = 64


def record_key(offset: int) -> bytes:
    return b"k%d" % offset


def record_value(offset: int, size: int) -> bytes:
    """``<offset>:<sha prefix>|`` then a filler derived from the offset, cut/padded to ``size``."""
    digest = hashlib.sha256(b"%d" % offset).hexdigest()
    prefix = f"{offset}:{digest[:16]}|".encode()
    if size <= len(prefix):
        return prefix
    filler = (digest.encode() * (size // _FILLER_BLOCK + 1))
    return prefix + filler[: size - len(prefix)]


def value_ok(offset: int, value: bytes | None) -> bool:
    return value is not None and value == record_value(offset, len(value))


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(data_dir: str, seed: int) -> int:
    from strata.common.scheduler import KafkaScheduler
    from strata.common.types import TopicPartition
    from strata.log.log_config import LogConfig
    from strata.log.log_manager import LogManager
    from strata.protocol import records as rec

    rng = random.Random(seed)
    tp = TopicPartition(TOPIC, PARTITION)
    config = LogConfig(LOG_CONFIG)

    def start():
        scheduler = KafkaScheduler(threads=2, name="crash-writer")
        manager = LogManager([Path(data_dir)], config, scheduler=scheduler)
        manager.startup()
        return scheduler, manager, manager.get_or_create_log(tp)

    scheduler, manager, ulog = start()
    clean = manager.had_clean_shutdown.get(Path(data_dir), False)

    start_leo = ulog.log_end_offset
    latest_epoch = ulog.leader_epoch_cache.latest_epoch()
    leader_epoch = 0 if latest_epoch is None else latest_epoch + 1
    entry = ulog.producer_state.last_entry(PRODUCER_ID)
    next_seq = 0 if entry is None or entry.is_empty else entry.last_seq + 1
    _print(f"OPEN {start_leo} {ulog.recovery_point} {int(clean)} {leader_epoch} {next_seq}")

    def build(first_offset: int, sizes: list[int], codec: int, base_seq: int) -> bytes:
        records = [rec.SimpleRecord(record_value(first_offset + i, size),
                                    key=record_key(first_offset + i),
                                    headers=(("o", b"%d" % (first_offset + i)),))
                   for i, size in enumerate(sizes)]
        if base_seq >= 0:
            return rec.build_batch(records, compression=codec, producer_id=PRODUCER_ID,
                                   producer_epoch=PRODUCER_EPOCH, base_sequence=base_seq)
        return rec.build_batch(records, compression=codec)

    # A producer retry of its last batch after the restart must be answered from the recovered
    # producer state as a duplicate, with the offsets the batch really has.
    if entry is not None and not entry.is_empty:
        delta = entry.last_offset_delta
        first_seq = entry.last_seq - delta
        retry = build(0, [20] * (delta + 1), rec.Compression.NONE, first_seq)
        info = ulog.append_as_leader(retry, leader_epoch)
        if not info.duplicate:
            _print(f"ERROR retry of seq {first_seq}..{entry.last_seq} appended at "
                   f"{info.first_offset}..{info.last_offset} instead of being a duplicate")
            return 3
        _print(f"DUP {info.first_offset} {info.last_offset} {first_seq} {entry.last_seq}")

    codecs = [rec.Compression.NONE] * 4 + [rec.Compression.GZIP, rec.Compression.SNAPPY,
                                           rec.Compression.LZ4, rec.Compression.ZSTD]
    until_checkpoint = rng.randint(3, 25)
    until_phase_change = 0
    while True:
        if until_phase_change == 0:
            small_only = rng.random() < 0.5
            until_phase_change = rng.randint(20, 300)
        until_phase_change -= 1
        first = ulog.log_end_offset
        count = rng.randint(1, 8)
        if small_only or rng.random() < 0.5:
            sizes = [rng.randint(10, 60) for _ in range(count)]
        else:
            sizes = [rng.randint(10, 3000) for _ in range(count)]
        idempotent = rng.random() < 0.4
        batch = build(first, sizes, rng.choice(codecs), next_seq if idempotent else -1)
        info = ulog.append_as_leader(batch, leader_epoch)
        if info.duplicate or info.first_offset != first or info.last_offset != first + count - 1:
            _print(f"ERROR append of {count} records at log end {first} returned {info}")
            return 3
        if idempotent:
            next_seq += count
        _print(f"ACK {info.first_offset} {info.last_offset}")
        until_checkpoint -= 1
        if until_checkpoint == 0:
            ulog.flush()
            manager.checkpoint()
            _print(f"CKPT {ulog.recovery_point}")
            until_checkpoint = rng.randint(3, 25)
        if rng.random() < 1 / 400:
            leo = ulog.log_end_offset
            scheduler.shutdown(run_pending=False)
            manager.shutdown()
            scheduler, manager, ulog = start()
            if not manager.had_clean_shutdown.get(Path(data_dir)) or ulog.log_end_offset != leo:
                _print(f"ERROR after a clean restart the log ends at {ulog.log_end_offset}, "
                       f"not {leo}")
                return 3
            entry = ulog.producer_state.last_entry(PRODUCER_ID)
            last_seq = -1 if entry is None or entry.is_empty else entry.last_seq
            if last_seq != next_seq - 1:
                _print(f"ERROR after a clean restart producer state ends at sequence {last_seq}, "
                       f"the writer at {next_seq - 1}")
                return 3
            _print(f"CYCLE {leo}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2])))
    except Exception:  # noqa: BLE001 - report anything unexpected to the parent
        _print("ERROR " + traceback.format_exc().replace("\n", " | "))
        sys.exit(3)
