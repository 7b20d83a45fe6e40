"""Crash test of the local log: a writer process SIGKILLed at random moments, over and over.

Requirement: a child process appends in a loop and is killed with SIGKILL at random moments, at
least 50 times; after each reopen every batch below the recovery point reads back intact, no
torn batch is ever served, and appends continue at the right offset.

Each iteration:

1. ``crash_writer.py`` (the child) opens the LogManager on the shared log dir and appends
   batches whose keys/values are a function of their offsets, flushing and checkpointing every
   few appends, rolled segments flushed in the background, now and then restarting the
   LogManager cleanly in-process; it reports ``OPEN``/``DUP``/``ACK``/``CKPT``/``CYCLE`` lines
   on stdout (a file here).
2. After a seeded random 50-400 ms (or, sometimes, at a random moment of its start-up) the
   parent SIGKILLs it: mid-append, mid-flush, mid-checkpoint, mid-shutdown or mid-load.
3. Every ~10th iteration the tail of the last non-empty segment is torn (truncated by a few
   bytes, or its last bytes zeroed), only ever above the checkpointed recovery point.
4. The parent opens the LogManager itself (unclean unless the kill hit the child between a
   clean shutdown and the next load) and checks:
   offsets contiguous from 0 to the log end, every batch served by ``read()`` whole, with a
   valid CRC and the right records; everything ACKed below the last CKPT present; the high
   watermark at the log end; leader epochs and producer state consistent with the batches;
   a torn tail cut back exactly to the last whole batch; the child's first ACK at the log end
   the previous iteration left, and its OPEN at that log end.
5. The parent closes the log, alternately with a clean shutdown (marker written, next start
   skips recovery) and without (next start recovers from the recovery point).

A second, deterministic test replays a case the loop found: clean restarts during a
segment's life, a roll on a full offset index, then a crash.

Seeded: ``STRATA_CRASH_SEED`` (default fixed) picks every random choice; ``STRATA_CRASH_KILLS``
the number of iterations. Kill timing itself is up to the OS scheduler, so two runs with one
seed kill at the same nominal moments, not at the same byte.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from strata.common.types import TopicPartition
from strata.log.checkpoint import OffsetCheckpointFile
from strata.log.log_config import LogConfig
from strata.log.log_manager import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT, LogManager
from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.protocol import records as rec
from support.waiting import eventually

HERE = Path(__file__).resolve().parent
WRITER = HERE / "crash_writer.py"
REPO = HERE.parent.parent

_spec = importlib.util.spec_from_file_location("strata_crash_writer", WRITER)
cw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cw)

DEFAULT_SEED = 20_240_611
SEED = int(os.environ.get("STRATA_CRASH_SEED", DEFAULT_SEED))
ITERATIONS = int(os.environ.get("STRATA_CRASH_KILLS", 60))
TP = TopicPartition(cw.TOPIC, cw.PARTITION)
READ_CHUNK = 1 << 20
OPEN_TIMEOUT_S = 30.0


@dataclass
class ChildRun:
    """What the child reported before it was killed."""

    open_leo: int | None = None
    open_recovery_point: int | None = None
    open_clean: bool | None = None
    open_leader_epoch: int | None = None
    open_next_seq: int | None = None
    dup: tuple[int, int, int, int] | None = None
    acks: list[tuple[int, int]] = field(default_factory=list)
    ckpts: list[int] = field(default_factory=list)
    cycles: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def last_ckpt(self) -> int:
        return self.ckpts[-1] if self.ckpts else 0


def parse_output(text: str) -> ChildRun:
    run = ChildRun()
    complete = text[: text.rfind("\n") + 1]  # a line cut by the kill is ignored
    for line in complete.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "ERROR":
            run.errors.append(rest)
            continue
        fields = [int(x) for x in rest.split()]
        if kind == "OPEN":
            (run.open_leo, run.open_recovery_point, clean, run.open_leader_epoch,
             run.open_next_seq) = fields
            run.open_clean = bool(clean)
        elif kind == "DUP":
            run.dup = tuple(fields)
        elif kind == "ACK":
            run.acks.append((fields[0], fields[1]))
        elif kind == "CKPT":
            run.ckpts.append(fields[0])
        elif kind == "CYCLE":
            run.cycles.append(fields[0])
        else:
            raise AssertionError(f"unexpected child output line {line!r}")
    return run


@dataclass
class LogState:
    """What a scan of the whole log found."""

    log_end_offset: int
    batches: int
    deep_checked_batches: int
    last_idempotent: tuple[int, int, int, int] | None  # first offset, last offset, seqs
    max_leader_epoch: int


@dataclass
class Stats:
    kills: int = 0
    early_kills: int = 0
    torn_truncated: int = 0
    torn_zeroed: int = 0
    clean_reopens: int = 0
    unclean_reopens: int = 0
    acked_unflushed_lost: int = 0
    max_segments: int = 0
    appended: int = 0
    recoveries_truncating: int = 0  # reopens whose recovery cut a tail the kill itself left
    index_full_rolls: int = 0
    restarts_in_child: int = 0


# ---------------------------------------------------------------------------------------------
# Checks

def check_records(buf, h: rec.BatchHeader, where: str) -> None:
    records = rec.decode_batch(buf, h, check_crc=True)
    assert len(records) == h.record_count, f"{where}: {len(records)} records, header says {h}"
    for i, r in enumerate(records):
        offset = h.base_offset + i
        assert r.offset == offset, f"{where}: record {i} has offset {r.offset}, expected {offset}"
        assert r.key == cw.record_key(offset), f"{where}: bad key at offset {offset}: {r.key!r}"
        assert cw.value_ok(offset, r.value), \
            f"{where}: bad value at offset {offset}: {r.value[:60]!r}..."
        assert r.headers == (("o", b"%d" % offset),), f"{where}: bad headers at {offset}"


def check_whole_batches(data: bytes, start: int, where: str) -> list[rec.BatchHeader]:
    """Headers of ``data``, which must be whole batches with valid CRCs and nothing else."""
    headers = list(rec.iter_headers(data))
    pos = 0
    for h in headers:
        assert h.position == pos, f"{where}: batch at {h.position}, expected {pos}"
        assert h.magic == rec.CURRENT_MAGIC, f"{where}: magic {h.magic} in {h}"
        assert rec.batch_crc_ok(data, h), f"{where}: CRC mismatch in served batch {h}"
        assert h.record_count == h.last_offset_delta + 1, f"{where}: record count of {h}"
        pos += h.size
    assert pos == len(data), (f"{where}: torn batch served: {len(data) - pos} trailing bytes "
                              f"after {len(headers)} whole batches (read from {start})")
    return headers


def scan_log(ulog: UnifiedLog, deep_from: int) -> LogState:
    """Read the whole log through ``read()``; records of batches ending at or after
    ``deep_from`` are decoded and compared with what the writer must have written."""
    leo = ulog.log_end_offset
    assert ulog.log_start_offset == 0, f"log start offset moved to {ulog.log_start_offset}"
    assert ulog.high_watermark == leo, f"high watermark {ulog.high_watermark} != log end {leo}"
    epochs = ulog.leader_epoch_cache
    offset = 0
    batches = deep = 0
    expected_seq = 0
    last_idem = None
    prev_epoch = -1
    while offset < leo:
        fetched = ulog.read(offset, READ_CHUNK, FetchIsolation.HIGH_WATERMARK)
        data = fetched.records
        where = f"read({offset})"
        assert data, f"{where} returned no data below the log end offset {leo}"
        for h in check_whole_batches(data, offset, where):
            assert h.base_offset == offset, \
                f"{where}: gap or overlap: batch {h.base_offset}..{h.last_offset}, " \
                f"expected {offset}"
            assert h.last_offset < leo, f"{where}: batch {h} beyond the log end {leo}"
            ple = h.partition_leader_epoch
            assert ple >= prev_epoch, f"{where}: leader epoch went back {prev_epoch} -> {ple}"
            cached = epochs.epoch_for_offset(h.base_offset)
            assert cached == ple, (f"{where}: epoch cache says {cached} for offset "
                                   f"{h.base_offset}, batch has {ple} ({epochs.epoch_entries()})")
            prev_epoch = ple
            if h.has_producer_id:
                assert h.producer_id == cw.PRODUCER_ID and h.producer_epoch == cw.PRODUCER_EPOCH
                assert h.base_sequence == expected_seq, (
                    f"{where}: producer sequence jumped: batch {h.base_offset}..{h.last_offset} "
                    f"has sequence {h.base_sequence}, expected {expected_seq}")
                expected_seq = h.last_sequence + 1
                last_idem = (h.base_offset, h.last_offset, h.base_sequence, h.last_sequence)
            if h.last_offset >= deep_from:
                check_records(data, h, where)
                deep += 1
            batches += 1
            offset = h.next_offset
    assert offset == leo, f"batches end at {offset}, log end offset is {leo}"

    entry = ulog.producer_state.last_entry(cw.PRODUCER_ID)
    if last_idem is None:
        assert entry is None or entry.is_empty, f"producer state {entry!r} for an empty log"
    else:
        assert entry is not None and not entry.is_empty, \
            f"producer state lost; last idempotent batch in the log is {last_idem}"
        assert (entry.last_seq, entry.last_data_offset) == (last_idem[3], last_idem[1]), (
            f"producer state has last sequence {entry.last_seq} at offset "
            f"{entry.last_data_offset}, the log {last_idem[3]} at {last_idem[1]}")
    return LogState(leo, batches, deep, last_idem, prev_epoch)


def random_reads(ulog: UnifiedLog, rng: random.Random, n: int) -> None:
    """Reads at random offsets (index lookups) must start with the batch holding the offset."""
    leo = ulog.log_end_offset
    if leo == 0:
        return
    for _ in range(n):
        offset = rng.randrange(leo)
        max_length = rng.choice([1, 100, 5000, READ_CHUNK])
        fetched = ulog.read(offset, max_length, FetchIsolation.HIGH_WATERMARK)
        where = f"read({offset}, {max_length})"
        headers = check_whole_batches(fetched.records, offset, where)
        assert headers, f"{where}: nothing returned below the log end {leo}"
        first = headers[0]
        assert first.base_offset <= offset <= first.last_offset, \
            f"{where}: first batch {first.base_offset}..{first.last_offset} misses the offset"
        check_records(fetched.records, first, where)


def count_index_full_rolls(ulog: UnifiedLog) -> int:
    """Inactive segments that rolled because an index was full (not on size)."""
    index_bytes = cw.LOG_CONFIG["segment.index.bytes"]
    return sum(1 for seg in ulog.local_log.segments[:-1]
               if seg.offset_index.entries >= index_bytes // seg.offset_index.ENTRY_SIZE
               or seg.time_index.entries >= index_bytes // seg.time_index.ENTRY_SIZE)


# ---------------------------------------------------------------------------------------------
# Torn writes

def segment_batches(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of the whole batches in a .log file."""
    data = path.read_bytes()
    return [(h.position, h.size, h.base_offset, h.last_offset) for h in rec.iter_headers(data)]


def tear_tail(part_dir: Path, recovery_point: int, rng: random.Random, zero: bool) -> int | None:
    """Tear the last bytes of the last non-empty segment, only in batches at or above
    ``recovery_point``; returns the log end offset recovery must cut back to, or None when
    nothing above the recovery point could be torn."""
    logs = sorted(p for p in part_dir.glob("*.log") if p.stat().st_size > 0)
    if not logs:
        return None
    path = logs[-1]
    batches = segment_batches(path)
    size = path.stat().st_size
    whole_end = batches[-1][0] + batches[-1][1] if batches else 0
    tearable = [b for b in batches if b[2] >= recovery_point]
    if not tearable:
        return None
    protected = tearable[0][0]  # first byte of the first batch at/above the recovery point
    n = rng.randint(1, min(200, size - protected))
    cut = size - n
    if zero:
        with open(path, "r+b") as f:
            f.seek(cut)
            old = f.read(n)
            if old.count(0) == n:
                return None  # zeros already: nothing torn (and the file is unchanged)
            f.seek(cut)
            f.write(b"\0" * n)
    else:
        os.truncate(path, cut)
    # Recovery keeps the batches that end at or before the cut (a tail beyond the last whole
    # batch, left by a write the kill interrupted, goes too).
    survivors = [b for b in batches if b[0] + b[1] <= min(cut, whole_end)]
    if survivors:
        return survivors[-1][3] + 1
    return int(path.name.split(".")[0])


# ---------------------------------------------------------------------------------------------
# The child

def run_child(data_dir: Path, out_dir: Path, iteration: int, seed: int,
              rng: random.Random, stats: Stats) -> ChildRun:
    out_path = out_dir / f"child-{iteration}.out"
    err_path = out_dir / f"child-{iteration}.err"
    early = rng.random() < 0.12
    delay = rng.uniform(0.0, 0.3) if early else rng.uniform(0.05, 0.4)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(WRITER), str(data_dir), str(seed)],
                                stdout=out, stderr=err, cwd=REPO)
    try:
        if not early:
            eventually(lambda: b"\n" in out_path.read_bytes() or proc.poll() is not None,
                       f"child {iteration} printing its first line (or exiting)", OPEN_TIMEOUT_S,
                       interval=0.002)
        time.sleep(delay)
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    run = parse_output(text)
    if not alive or rc != -signal.SIGKILL or run.errors:
        raise AssertionError(
            f"child {iteration} exited by itself (rc={rc}) or reported errors: {run.errors}\n"
            f"stdout tail: {text[-2000:]}\nstderr tail: {err_path.read_text()[-4000:]}")
    stats.kills += 1
    stats.early_kills += early
    stats.restarts_in_child += len(run.cycles)
    return run


# ---------------------------------------------------------------------------------------------
# The test

@pytest.mark.slow
def test_sigkill_loop_recovers_every_time(tmp_path, caplog):
    seed = SEED
    data_dir = tmp_path / "logs"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    part_dir = data_dir / f"{TP.topic}-{TP.partition}"
    config = LogConfig(cw.LOG_CONFIG)
    stats = Stats()
    started = time.monotonic()

    prev_leo = 0
    prev_clean = False
    prev_last_idem = None
    prev_epoch = -1
    verified_to = 0  # records below this offset were decoded and checked in earlier iterations
    tears = 0
    tear_pending = False
    for i in range(ITERATIONS):
        try:
            # One stream per iteration: its choices do not depend on how earlier ones went.
            rng = random.Random(f"{seed}/{i}")
            run = run_child(data_dir, out_dir, i, rng.randrange(2**31), rng, stats)

            # -- what the child saw at start and did -------------------------------------------
            if run.open_leo is not None:
                assert run.open_leo == prev_leo, \
                    f"child opened the log at {run.open_leo}, the parent left it at {prev_leo}"
                if i > 0:
                    assert run.open_clean == prev_clean, \
                        f"child saw clean={run.open_clean}, parent's shutdown clean={prev_clean}"
                assert run.open_leader_epoch == prev_epoch + 1
                expected_seq = 0 if prev_last_idem is None else prev_last_idem[3] + 1
                assert run.open_next_seq == expected_seq, (
                    f"recovered producer state continues at sequence {run.open_next_seq}, "
                    f"the log at {expected_seq}")
            if run.dup is not None:
                assert run.dup == prev_last_idem, \
                    f"retry answered as duplicate {run.dup}; the last batch was {prev_last_idem}"
            expected_first = prev_leo
            for first, last in run.acks:
                assert first == expected_first, \
                    f"ACK {first}..{last} does not continue at {expected_first}"
                expected_first = last + 1
            last_acked = expected_first - 1
            assert run.last_ckpt <= expected_first, f"CKPT {run.last_ckpt} beyond the ACKs"
            stats.appended += expected_first - prev_leo

            # -- tear the tail, as an interrupted write would ----------------------------------
            marker = data_dir / CLEAN_SHUTDOWN_FILE
            clean_expected = marker.exists()
            expected_leo = None
            torn = False
            # Every tenth iteration, or the next one when nothing above the recovery point
            # was left to tear (the child checkpointed just before the kill).
            tear_pending = tear_pending or i % 10 == 9
            if tear_pending and not clean_expected and part_dir.exists():
                rp_file = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()
                rp = rp_file.get(TP, 0)
                assert rp >= run.last_ckpt, f"checkpoint file {rp} behind CKPT {run.last_ckpt}"
                zero = tears % 2 == 1
                expected_leo = tear_tail(part_dir, rp, rng, zero)
                torn = expected_leo is not None
                if torn:
                    tears += 1
                    tear_pending = False
                    stats.torn_zeroed += zero
                    stats.torn_truncated += not zero

            # -- reopen and verify --------------------------------------------------------------
            caplog.clear()
            manager = LogManager([data_dir], config)
            manager.startup()
            if not torn and any(r.getMessage().startswith("truncating ") for r in caplog.records):
                stats.recoveries_truncating += 1
            assert manager.had_clean_shutdown[data_dir] == clean_expected
            stats.clean_reopens += clean_expected
            stats.unclean_reopens += not clean_expected
            ulog = manager.get_log(TP)
            if ulog is None:
                assert prev_leo == 0 and not run.acks, "the log directory vanished"
                ulog = manager.get_or_create_log(TP)
            leo = ulog.log_end_offset
            assert ulog.recovery_point <= leo
            if expected_leo is not None:
                assert leo == expected_leo, (f"torn tail: recovery cut the log to {leo}, the "
                                             f"last whole batch ends at {expected_leo}")
            assert leo >= run.last_ckpt, \
                f"flushed data lost: log end {leo} below the last checkpoint {run.last_ckpt}"
            if not torn and leo <= last_acked:
                stats.acked_unflushed_lost += 1
            # Every batch is read and CRC-checked; records are decoded from where the previous
            # iteration's check ended (recovery only ever cuts a suffix, which the offset and
            # CRC checks see), and all of them every tenth iteration and at the end.
            deep_from = 0 if i % 10 == 0 or i == ITERATIONS - 1 else min(verified_to, leo)
            state = scan_log(ulog, deep_from)
            random_reads(ulog, rng, 25)
            verified_to = leo
            stats.max_segments = max(stats.max_segments, ulog.local_log.segment_count())
            if i == ITERATIONS - 1:
                stats.index_full_rolls = count_index_full_rolls(ulog)

            prev_leo = leo
            prev_last_idem = state.last_idempotent
            # The next child leads with the latest epoch the cache knows + 1 (a tear may have
            # removed every batch of the newest epoch, and with them its cache entry).
            latest = ulog.leader_epoch_cache.latest_epoch()
            assert latest is None or latest >= state.max_leader_epoch
            prev_epoch = -1 if latest is None else latest

            # -- close, alternately clean and unclean -------------------------------------------
            prev_clean = i % 2 == 0
            if prev_clean:
                manager.shutdown()
            else:
                for lg in manager.all_logs():
                    lg.local_log.close()  # no flush, no checkpoint, no marker
        except Exception as exc:  # assertions, and anything strata raises on reopen
            raise AssertionError(
                f"crash test failed at iteration {i} (STRATA_CRASH_SEED={seed}, "
                f"logs in {data_dir}): {type(exc).__name__}: {exc}") from exc

    elapsed = time.monotonic() - started
    print(f"\ncrash test: seed={seed} iterations={ITERATIONS} kills={stats.kills} "
          f"(early {stats.early_kills}) torn: truncated={stats.torn_truncated} "
          f"zeroed={stats.torn_zeroed} reopens: clean={stats.clean_reopens} "
          f"unclean={stats.unclean_reopens} acked-unflushed lost={stats.acked_unflushed_lost} "
          f"final log end={prev_leo} appended={stats.appended} "
          f"max segments={stats.max_segments} (index-full rolls {stats.index_full_rolls}) "
          f"recoveries that cut a torn tail={stats.recoveries_truncating} "
          f"clean restarts in the child={stats.restarts_in_child} in {elapsed:.1f}s")
    assert stats.kills >= 50
    assert stats.index_full_rolls > 0, "no segment rolled on a full index: config too loose"
    assert stats.torn_truncated + stats.torn_zeroed >= 3, "too few torn-write iterations"


# ---------------------------------------------------------------------------------------------
# A deterministic case the loop above ran into (with the writer's in-process clean restarts).

def test_unclean_start_recovers_segment_that_rolled_on_full_index_after_clean_restarts(tmp_path):
    """Clean restarts during a segment's life, the segment rolls on a full offset index, then
    a crash: the next start recovers the segment and must rebuild its index, not fail.

    After a clean start the append path counts index interval bytes from 0 again, so it adds
    fewer offset index entries than recovery's rule (bytes since the last entry's position);
    recovery then wants more entries than the segment's full index holds.
    """
    data_dir = tmp_path / "logs"
    tp = TopicPartition("t", 0)
    config = LogConfig({"internal.segment.bytes": 1 << 20, "index.interval.bytes": 512,
                        "segment.index.bytes": 64})  # 8 offset index entries
    ts = 1_700_000_000_000  # one timestamp: the time index keeps a single entry

    def start():
        manager = LogManager([data_dir], config)
        manager.startup()
        return manager, manager.get_or_create_log(tp)

    manager, ulog = start()
    n = 0
    while ulog.local_log.segment_count() == 1:  # append until the index fills and it rolls
        value = cw.record_value(n, 250)
        ulog.append_as_leader(rec.build_batch([rec.SimpleRecord(value, key=cw.record_key(n),
                                                                 timestamp=ts)]), 0)
        n += 1
        if n % 3 == 0 and ulog.local_log.segment_count() == 1 and \
                ulog.local_log.active_segment.offset_index.entries < 6:
            manager.shutdown()  # a clean restart every 3 appends, stopping before the roll
            manager, ulog = start()
    first = ulog.local_log.segments[0]
    assert first.offset_index.entries == 8  # rolled on the full offset index
    recovery_point = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()[tp]
    assert recovery_point < ulog.local_log.segments[1].base_offset  # segment 0 is recovered

    for lg in manager.all_logs():  # crash: no flush, no checkpoint, no clean-shutdown marker
        lg.local_log.close()
    manager = LogManager([data_dir], config)
    manager.startup()
    ulog = manager.get_log(tp)
    assert ulog.log_end_offset == n
    offset = 0
    while offset < n:
        data = ulog.read(offset, READ_CHUNK).records
        for h in check_whole_batches(data, offset, f"read({offset})"):
            assert h.base_offset == offset
            decoded = rec.decode_batch(data, h, check_crc=True)
            assert [r.value for r in decoded] == [cw.record_value(offset, 250)]
            offset = h.next_offset
    manager.shutdown()
