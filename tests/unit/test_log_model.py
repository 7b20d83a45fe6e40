"""The local log (UnifiedLog over LocalLog and LogSegment) against a simple in-memory model.

A hypothesis state machine appends (compressed or not, idempotent or not), reads, truncates,
deletes records, applies retention, lists offsets by timestamp, rolls and reopens (cleanly,
after a crash, and after a crash that tore the last batch) one partition log with tiny segments
and indexes, and compares every answer with a model: the list of appended records (offset, key,
value, headers, timestamp, leader epoch) plus the log start offset, the high watermark and the
log end offset.

Model rules worth knowing:

- offsets are never reused except after a truncation, so a record the log returns is compared
  with the model record at the same offset, even below the log start offset (reads return whole
  batches, whose first records may precede the fetch offset);
- the high watermark and truncation points are always batch boundaries, as in Kafka (a
  follower's log end offset, and so the high watermark, only ever sits between batches);
- retention deletes whole segments: which ones is predicted from the segment layout before
  the call (base offsets, sizes) and the model's timestamps, with Kafka's rules: passes for the
  log start offset, then ``retention.bytes``, then ``retention.ms``; only offsets below the high
  watermark; an expired active segment is rolled and deleted;
- a producer's state is only guaranteed to survive while its last batch ends at or after the
  log start offset, so duplicate and sequence checks are made only then.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from strata.common.clock import MockClock
from strata.common.errors import OffsetOutOfRangeError, OutOfOrderSequenceError
from strata.common.scheduler import ImmediateScheduler
from strata.log.log_config import LogConfig
from strata.log.segment import DELETED_SUFFIX
from strata.log.unified_log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    FetchIsolation,
    UnifiedLog,
)
from strata.protocol import records as rec

START_MS = 1_700_000_000_000
PRODUCER_IDS = (4242, 4243)
PRODUCER_EPOCH = 0
# Producers never expire during a run: expiry is not what this model is about.
NO_EXPIRY_MS = 10**15


@dataclass(frozen=True)
class MRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    epoch: int


@dataclass(frozen=True)
class MBatch:
    base: int
    last: int
    epoch: int
    data: bytes          # the bytes as produced (base offset 0), for retries
    producer_id: int     # -1: not idempotent
    base_seq: int

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def last_seq(self) -> int:
        return self.base_seq + self.last - self.base


# ---- strategies -----------------------------------------------------------------------------

# Large values are made from a few drawn numbers: drawing hundreds of bytes each would exhaust
# hypothesis's per-example data budget after a few steps and keep the logs tiny.
_large = st.tuples(st.integers(100, 700), st.integers(0, 2**32 - 1), st.booleans()).map(
    lambda t: random.Random(t[1]).randbytes(t[0]) if t[2] else bytes([t[1] % 256]) * t[0])
_bytes = st.one_of(
    st.none(),
    st.binary(max_size=16),
    st.binary(max_size=16),
    _large,
)
_headers = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=8))),
    max_size=2).map(tuple)
# >= 0: in order (just after the latest timestamp, or the clock); < 0: that far back.
_ts_step = st.one_of(st.integers(0, 300), st.integers(0, 300), st.integers(-100_000, -1))
_record = st.tuples(_bytes, _bytes, _headers, _ts_step)
_codec = st.sampled_from([rec.Compression.NONE, rec.Compression.NONE, rec.Compression.GZIP,
                          rec.Compression.SNAPPY, rec.Compression.LZ4, rec.Compression.ZSTD])
_mostly = st.sampled_from([True, True, True, False])
_rarely = st.sampled_from([False, False, False, True])
_producer = st.sampled_from([-1, -1, PRODUCER_IDS[0], PRODUCER_IDS[1]])  # -1: not idempotent


class LocalLogMatchesModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="strata-log-model-"))
        self.dir = self.root / "model-0"
        self.clock = MockClock(START_MS)
        self.log: UnifiedLog | None = None
        self.config: LogConfig | None = None
        # the model
        self.records: dict[int, MRecord] = {}   # every appended, not truncated record
        self.batches: list[MBatch] = []          # ordered by offset, same lifetime
        self.log_start = 0
        self.hw = 0
        self.leo = 0
        self.leader_epoch = 0
        self.latest_ts = START_MS - 60_000

    def teardown(self):
        try:
            if self.log is not None:
                self.log.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # ---- setup ------------------------------------------------------------------------------

    @initialize(
        segment_bytes=st.one_of(st.integers(300, 1000), st.integers(300, 3000)),
        index_interval=st.one_of(st.just(0), st.integers(0, 200)),
        index_bytes=st.one_of(st.integers(64, 200), st.integers(64, 4096)),
        retention_ms=st.one_of(st.just(-1), st.integers(1_000, 120_000)),
        retention_bytes=st.one_of(st.just(-1), st.just(-1), st.integers(500, 8000)),
        segment_ms=st.sampled_from([604_800_000, 604_800_000, 60_000, 5_000]),
        flush_messages=st.sampled_from([None, None, 1, 7]),
        log_append_time=_rarely,
    )
    def open_log(self, segment_bytes, index_interval, index_bytes, retention_ms,
                 retention_bytes, segment_ms, flush_messages, log_append_time):
        props = {
            "internal.segment.bytes": segment_bytes,
            "index.interval.bytes": index_interval,
            "segment.index.bytes": index_bytes,
            "retention.ms": retention_ms,
            "retention.bytes": retention_bytes,
            "segment.ms": segment_ms,
            "message.timestamp.type": "LogAppendTime" if log_append_time else "CreateTime",
        }
        if flush_messages is not None:
            props["flush.messages"] = flush_messages
        self.config = LogConfig(props)
        self.log = self._open(recovery_point=0, log_start_offset=0, clean=True)

    def _open(self, *, recovery_point: int, log_start_offset: int, clean: bool) -> UnifiedLog:
        return UnifiedLog(self.dir, self.config, recovery_point=recovery_point,
                          log_start_offset=log_start_offset, had_clean_shutdown=clean,
                          clock=self.clock, scheduler=ImmediateScheduler(),
                          producer_id_expiration_ms=NO_EXPIRY_MS)

    # ---- model helpers ----------------------------------------------------------------------

    def _batch_containing(self, offset: int) -> MBatch | None:
        for b in self.batches:
            if b.base <= offset <= b.last:
                return b
        return None

    def _batch_at(self, base: int) -> MBatch | None:
        for b in self.batches:
            if b.base == base:
                return b
        return None

    def _last_batch_of(self, producer_id: int) -> MBatch | None:
        for b in reversed(self.batches):
            if b.producer_id == producer_id:
                return b
        return None

    def _next_sequence(self, producer_id: int) -> int:
        """The last batch's sequence + 1: right whether the log still knows the producer (its
        state then matches the model's batches) or has lost it (any sequence is accepted)."""
        last = self._last_batch_of(producer_id)
        return last.last_seq + 1 if last is not None else 0

    def _producer_state_guaranteed(self, producer_id: int) -> MBatch | None:
        """The producer's last batch when the log must still remember it."""
        last = self._last_batch_of(producer_id)
        if last is not None and last.last >= self.log_start:
            return last
        return None

    def _check_duplicates_detected(self) -> None:
        """A retry of each producer's last batch is answered with the original offsets."""
        for pid in PRODUCER_IDS:
            last = self._producer_state_guaranteed(pid)
            if last is None:
                continue
            again = self.log.append_as_leader(last.data, self.leader_epoch)
            assert again.duplicate, \
                f"retry of producer {pid}'s last batch {last.base}..{last.last} was appended"
            assert (again.first_offset, again.last_offset) == (last.base, last.last)
            assert self.log.log_end_offset == self.leo

    def _truncate_model(self, offset: int) -> None:
        if offset >= self.leo:
            return
        if offset < self.log_start:
            self.records.clear()
            self.batches.clear()
            self.log_start = offset
        else:
            self.batches = [b for b in self.batches if b.last < offset]
            keep = self.batches[-1].last + 1 if self.batches else offset
            self.records = {o: r for o, r in self.records.items() if o < keep}
        self.leo = offset
        self.hw = min(self.hw, offset)

    def _boundaries_above(self, low: int) -> list[int]:
        """Batch boundaries (and the log end offset) strictly above ``low``."""
        return sorted({b.base for b in self.batches if b.base > low} | {self.leo})

    def _segment_max_ts(self, low: int, high: int) -> int | None:
        ts = [r.timestamp for o, r in self.records.items() if low <= o < high]
        return max(ts) if ts else None

    # ---- append -----------------------------------------------------------------------------

    @rule(recs=st.lists(_record, min_size=1, max_size=5), codec=_codec, producer_id=_producer,
          advance_hw=_mostly, retry=_rarely, gap_probe=_rarely)
    def append(self, recs, codec, producer_id, advance_hw, retry, gap_probe):
        self._append(recs, codec, producer_id, advance_hw, retry, gap_probe)

    @rule(batches=st.lists(st.tuples(st.lists(_record, min_size=1, max_size=5), _codec,
                                     _producer), min_size=4, max_size=20),
          advance_hw=_mostly)
    def append_many(self, batches, advance_hw):
        for recs, codec, producer_id in batches:
            self._append(recs, codec, producer_id, advance_hw, False, False)

    def _make_batch(self, recs, codec, producer_id: int, seq: int, base: int, now: int):
        """Build one batch from drawn records; its model batch and records at ``base``."""
        simple = []
        for key, value, headers, step in recs:
            if step >= 0:
                ts = max(self.latest_ts, now - 5_000) + step
            else:
                ts = max(0, self.latest_ts + step)
            self.latest_ts = max(self.latest_ts, ts)
            simple.append(rec.SimpleRecord(value, key, headers, ts))
        pid_args = dict(producer_id=producer_id, producer_epoch=PRODUCER_EPOCH,
                        base_sequence=seq) if producer_id >= 0 else {}
        data = rec.build_batch(simple, compression=codec, **pid_args)
        n = len(simple)
        stamps = [now] * n if self.config.log_append_time else [r.timestamp for r in simple]
        batch = MBatch(base, base + n - 1, self.leader_epoch, data, producer_id, seq)
        records = [MRecord(base + i, r.key, r.value, tuple(r.headers), ts, self.leader_epoch)
                   for i, (r, ts) in enumerate(zip(simple, stamps))]
        return batch, records, pid_args, simple

    def _add_to_model(self, batch: MBatch, records: list[MRecord]) -> None:
        self.batches.append(batch)
        for r in records:
            self.records[r.offset] = r
        self.leo = batch.last + 1

    def _append(self, recs, codec, producer_id, advance_hw, retry, gap_probe):
        log = self.log
        now = self.clock.milliseconds()
        idempotent = producer_id >= 0
        seq = self._next_sequence(producer_id) if idempotent else -1
        batch, records, pid_args, simple = self._make_batch(recs, codec, producer_id, seq,
                                                            self.leo, now)
        data = batch.data

        if gap_probe and idempotent and self._producer_state_guaranteed(producer_id) is not None:
            gapped = rec.build_batch(simple, compression=codec,
                                     **dict(pid_args, base_sequence=seq + 1))
            with pytest.raises(OutOfOrderSequenceError):
                log.append_as_leader(gapped, self.leader_epoch)
            assert log.log_end_offset == self.leo

        info = log.append_as_leader(data, self.leader_epoch)
        assert not info.duplicate
        assert (info.first_offset, info.last_offset) == (batch.base, batch.last)
        assert info.valid_bytes == len(data)
        assert info.log_start_offset == self.log_start
        assert log.log_end_offset == batch.last + 1
        assert info.log_append_time == (now if self.config.log_append_time else -1)
        assert info.max_timestamp == max(r.timestamp for r in records)
        assert info.shallow_offset_of_max_timestamp == info.last_offset
        self._add_to_model(batch, records)

        if retry and idempotent:
            again = log.append_as_leader(data, self.leader_epoch)
            assert again.duplicate
            assert (again.first_offset, again.last_offset) == (batch.base, batch.last)
            assert log.log_end_offset == self.leo

        if advance_hw:
            assert log.update_high_watermark(self.leo) == self.leo
            self.hw = self.leo

    @rule(specs=st.lists(st.tuples(st.lists(_record, min_size=1, max_size=3), _codec, _producer),
                         min_size=2, max_size=4),
          advance_hw=_mostly)
    def append_batches_in_one_request(self, specs, advance_hw):
        """Several batches in one append (the API takes any number of them)."""
        now = self.clock.milliseconds()
        base = self.leo
        next_seq: dict[int, int] = {}
        made = []
        for recs, codec, pid in specs:
            seq = next_seq.get(pid, self._next_sequence(pid)) if pid >= 0 else -1
            batch, records, _, _ = self._make_batch(recs, codec, pid, seq, base, now)
            if pid >= 0:
                next_seq[pid] = batch.last_seq + 1
            made.append((batch, records))
            base = batch.last + 1
        data = b"".join(batch.data for batch, _ in made)
        info = self.log.append_as_leader(data, self.leader_epoch)
        assert not info.duplicate
        assert (info.first_offset, info.last_offset) == (self.leo, base - 1)
        assert info.valid_bytes == len(data)
        maxima = [max(r.timestamp for r in records) for _, records in made]
        assert info.max_timestamp == max(maxima)
        if not self.config.log_append_time:
            # the last offset of the first batch holding the greatest timestamp
            assert info.shallow_offset_of_max_timestamp == \
                made[maxima.index(max(maxima))][0].last
        for batch, records in made:
            self._add_to_model(batch, records)
        assert self.log.log_end_offset == self.leo
        if advance_hw:
            assert self.log.update_high_watermark(self.leo) == self.leo
            self.hw = self.leo

    @precondition(lambda self: self.hw < self.leo)
    @rule(data=st.data())
    def advance_high_watermark(self, data):
        target = data.draw(st.sampled_from(self._boundaries_above(self.hw)), label="hw")
        assert self.log.update_high_watermark(target) == target
        self.hw = target

    @rule()
    def bump_leader_epoch(self):
        self.leader_epoch += 1

    @rule()
    def roll(self):
        before = [s.base_offset for s in self.log.local_log.segments]
        seg = self.log.roll()
        assert seg is self.log.local_log.active_segment
        assert seg.base_offset == self.leo
        after = [s.base_offset for s in self.log.local_log.segments]
        assert after == before or after == before + [self.leo]

    # ---- reads ------------------------------------------------------------------------------

    def _check_read(self, start: int, max_length: int, min_one: bool, upper: int,
                    records: bytes) -> int | None:
        """Check one read's bytes against the model; the last offset returned, if any."""
        buf = bytes(records)
        headers = list(rec.iter_headers(buf))
        assert sum(h.size for h in headers) == len(buf), "a read must return whole batches"
        if start >= upper:
            assert buf == b"", f"read at {start} returned data at/after the bound {upper}"
            return None
        wanted = self._batch_containing(start)
        assert wanted is not None, f"model has no record at {start} below {upper}"
        if not headers:
            assert not min_one, f"KIP-74: read at {start} (max {max_length}) returned nothing"
            assert wanted.size > max_length
            return None
        first = headers[0]
        assert first.base_offset <= start <= first.last_offset, \
            f"first batch {first.base_offset}..{first.last_offset} does not hold {start}"
        if min_one:
            assert len(buf) <= max(max_length, first.size)
            if first.size > max_length:
                event("read: KIP-74 first batch larger than max_length")
        else:
            assert len(buf) <= max_length
        prev = None
        for h in headers:
            assert rec.batch_crc_ok(buf, h)
            if prev is not None:
                assert h.base_offset == prev + 1, f"gap between {prev} and {h.base_offset}"
            assert h.last_offset < upper, f"batch up to {h.last_offset} beyond bound {upper}"
            mb = self._batch_at(h.base_offset)
            assert mb is not None and mb.last == h.last_offset, \
                f"batch {h.base_offset}..{h.last_offset} is not a model batch"
            assert h.partition_leader_epoch == mb.epoch
            assert h.size == mb.size
            prev = h.last_offset
        got = [(r.offset, r.key, r.value, r.headers, r.timestamp)
               for r in rec.iter_records(buf, check_crc=True)]
        want = [(m.offset, m.key, m.value, m.headers, m.timestamp)
                for m in (self.records[o] for o in range(first.base_offset, prev + 1))]
        assert got == want
        # As much as fits: the next batch, if below the bound and in the same segment, would
        # have exceeded the size budget.
        nxt = self._batch_at(prev + 1)
        if nxt is not None and nxt.last < upper:
            local = self.log.local_log
            if local.floor_segment(nxt.base).base_offset == \
                    local.floor_segment(first.base_offset).base_offset:
                budget = max(max_length, first.size) if min_one else max_length
                assert len(buf) + nxt.size > budget, \
                    f"read at {start} stopped at {prev} with room for the next batch"
        return prev

    def _check_fully_readable(self) -> None:
        """Everything from the log start offset to the high watermark reads back, in order."""
        offset = self.log_start
        while offset < self.hw:
            info = self.log.read(offset, 2048)
            last = self._check_read(offset, 2048, True, self.hw, info.records)
            assert last is not None and last >= offset
            offset = last + 1

    @rule(data=st.data(), max_length=st.one_of(st.integers(1, 100), st.integers(1, 5000)),
          min_one=_mostly,
          isolation=st.sampled_from([FetchIsolation.HIGH_WATERMARK,
                                     FetchIsolation.HIGH_WATERMARK, FetchIsolation.LOG_END,
                                     FetchIsolation.TXN_COMMITTED]))
    def read(self, data, max_length, min_one, isolation):
        log = self.log
        low = log.local_log_start_offset
        bases = [b.base for b in self.batches if low <= b.base] or [low]
        start = data.draw(st.one_of(st.integers(low, self.leo), st.just(low),
                                    st.sampled_from(bases)), label="start")
        info = log.read(start, max_length, isolation, min_one)
        assert info.fetch_offset_metadata.offset == start
        upper = self.leo if isolation is FetchIsolation.LOG_END else self.hw
        self._check_read(start, max_length, min_one, upper, info.records)
        if isolation is FetchIsolation.TXN_COMMITTED:
            assert info.aborted_transactions == []

    @rule(data=st.data())
    def read_out_of_range(self, data):
        low = self.log.local_log_start_offset
        choices = [st.integers(self.leo + 1, self.leo + 50), st.just(self.leo + 1), st.just(-1)]
        if low > 0:
            choices += [st.integers(max(0, low - 50), low - 1), st.just(low - 1)]
        offset = data.draw(st.one_of(*choices), label="offset")
        with pytest.raises(OffsetOutOfRangeError) as err:
            self.log.read(offset, 1000)
        assert err.value.code == 1

    # ---- truncation, DeleteRecords and retention --------------------------------------------

    @rule(data=st.data())
    def truncate(self, data):
        # Batch boundaries only, as in Kafka (leader epoch end offsets, high watermarks): a
        # target inside a batch drops the whole batch yet sets the log end offset to the target.
        bounds = sorted({b.base for b in self.batches if b.base >= self.log_start} | {self.leo})
        choices = [st.sampled_from(bounds), st.sampled_from(bounds[-3:]),
                   st.integers(self.leo, self.leo + 3)]
        if self.log_start > 0:
            choices.append(st.integers(max(0, self.log_start - 20), self.log_start - 1))
        target = data.draw(st.one_of(*choices), label="truncate_to")
        before = self.log.local_log.segment_count()
        truncated = self.log.truncate_to(target)
        event("truncate: below the log start" if target < self.log_start else
              "truncate: segments dropped" if self.log.local_log.segment_count() < before else
              "truncate: within the active segment" if truncated else "truncate: no-op")
        assert truncated == (target < self.leo)
        self._truncate_model(target)
        assert self.log.log_end_offset == self.leo
        assert self.log.log_start_offset == self.log_start
        assert self.log.high_watermark == self.hw
        self._check_duplicates_detected()

    def _delete_old_segments(self) -> None:
        """delete_old_segments(), checked against a prediction from the segment layout."""
        log = self.log
        segments = log.local_log.segments
        bases = [s.base_offset for s in segments]
        sizes = [s.size for s in segments]
        now = self.clock.milliseconds()
        n = len(bases)
        i = 0

        def upper(i):
            return bases[i + 1] if i + 1 < n else self.leo

        def deletable(i):
            # Kafka's rule: below the high watermark; the active segment too, unless empty
            return i < n and upper(i) <= self.hw and not (i + 1 == n and sizes[i] == 0)

        while deletable(i) and upper(i) <= self.log_start:
            i += 1
        limit = self.config.get("retention.bytes")
        if limit >= 0:
            excess = sum(sizes[i:]) - limit
            while excess > 0 and deletable(i) and excess - sizes[i] >= 0:
                excess -= sizes[i]
                i += 1
        ms = self.config.get("retention.ms")
        if ms >= 0:
            while deletable(i):
                max_ts = self._segment_max_ts(bases[i], upper(i))
                assert max_ts is not None, f"segment {bases[i]} holds no model record"
                if not now - max_ts > ms:
                    break
                i += 1
        # deleting the active segment rolls a new, empty one at the log end first
        remaining = bases[i:] if i < n else [self.leo]

        old_start = self.log_start
        deleted = log.delete_old_segments()
        event(f"segments deleted: {min(deleted, 3)}{'+' if deleted > 3 else ''}")
        assert deleted == i, f"expected {i} segments of {bases} deleted, got {deleted}"
        assert [s.base_offset for s in log.local_log.segments] == remaining
        new_start = log.log_start_offset
        assert old_start <= new_start <= self.hw
        assert new_start == max(old_start, remaining[0])
        self.log_start = new_start

    @rule(data=st.data())
    def delete_records(self, data):
        target = data.draw(st.integers(max(0, self.log_start - 3), self.hw + 3), label="target")
        if target > self.hw:
            with pytest.raises(OffsetOutOfRangeError) as err:
                self.log.maybe_increment_log_start_offset(target, "test")
            assert err.value.code == 1
            assert self.log.log_start_offset == self.log_start
            return
        moved = self.log.maybe_increment_log_start_offset(target, "test")
        assert moved == (target > self.log_start)
        self.log_start = max(self.log_start, target)
        assert self.log.log_start_offset == self.log_start
        self._delete_old_segments()
        if self.log_start > 0:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(self.log_start - 1, 1000)
        self._check_fully_readable()
        self._check_duplicates_detected()

    @rule(ms=st.one_of(st.integers(0, 2_000), st.integers(0, 150_000)), apply=_mostly)
    def advance_clock_and_apply_retention(self, ms, apply):
        self.clock.advance_ms(ms)
        if apply:
            self._delete_old_segments()
            self._check_fully_readable()

    # ---- ListOffsets ------------------------------------------------------------------------

    @rule(data=st.data())
    def fetch_offset_by_timestamp(self, data):
        log = self.log
        stamps = sorted({r.timestamp for r in self.records.values()})
        choices = [st.sampled_from([EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP,
                                    EARLIEST_LOCAL_TIMESTAMP]),
                   st.integers(START_MS - 200_000, self.clock.milliseconds() + 10_000),
                   st.integers(0, START_MS)]
        if stamps:
            choices.append(st.sampled_from(stamps).flatmap(
                lambda t: st.sampled_from([t - 1, t, t + 1])))
        t = data.draw(st.one_of(*choices), label="timestamp")
        got = log.fetch_offset_by_timestamp(t)
        event(f"fetch_offset_by_timestamp: {'special' if t < 0 else 'found' if got else 'none'}")
        if t == EARLIEST_TIMESTAMP:
            assert got.offset == self.log_start
            m = self.records.get(self.log_start)
            if m is not None:
                assert got.leader_epoch == m.epoch
        elif t == EARLIEST_LOCAL_TIMESTAMP:
            assert got.offset == log.local_log_start_offset == self.log_start
        elif t == LATEST_TIMESTAMP:
            assert got.offset == self.leo
            # With nothing readable the epoch may be gone: the cache entry rebased to the log
            # start offset is dropped on reload by truncate_from_end(log end), as in Kafka.
            if self.log_start < self.leo:
                assert got.leader_epoch == self.batches[-1].epoch
        elif t == MAX_TIMESTAMP:
            first_local = log.local_log.first_segment.base_offset
            present = [r for o, r in sorted(self.records.items()) if o >= first_local]
            if not present:
                assert got is None
            else:
                top = max(r.timestamp for r in present)
                best = next(r for r in present if r.timestamp == top)
                assert got is not None
                assert (got.timestamp, got.offset, got.leader_epoch) == \
                    (best.timestamp, best.offset, best.epoch)
        else:
            expected = next((r for o, r in sorted(self.records.items())
                             if o >= self.log_start and r.timestamp >= t), None)
            if expected is None:
                assert got is None, f"timestamp {t}: expected nothing, got {got}"
            else:
                assert got is not None, f"timestamp {t}: expected {expected}, got nothing"
                assert (got.timestamp, got.offset, got.leader_epoch) == \
                    (expected.timestamp, expected.offset, expected.epoch)

    # ---- reopen -----------------------------------------------------------------------------

    def _check_reopened(self) -> None:
        log = self.log
        assert log.log_end_offset == self.leo
        assert log.log_start_offset == self.log_start
        # a single replica: everything that survived loading is committed
        assert log.high_watermark == self.leo
        self.hw = self.leo
        self._check_fully_readable()
        event(f"reopened with {min(log.local_log.segment_count(), 5)}+ segments")
        self._check_duplicates_detected()

    @rule()
    def reopen_clean(self):
        old = self.log
        recovery_point, log_start = old.recovery_point, old.log_start_offset
        old.close()
        self.log = None
        self.log = self._open(recovery_point=recovery_point, log_start_offset=log_start,
                              clean=True)
        self._check_reopened()

    @staticmethod
    def _crash(log: UnifiedLog, drop_handles: bool) -> None:
        """Stop using ``log`` without a clean close: no flush, no producer snapshot."""
        if drop_handles:
            # Like a killed process: preallocated indexes stay untrimmed.
            for seg in log.local_log.segments:
                seg.offset_index.close_handler()
                seg.time_index.close_handler()
                seg.txn_index.close()
                os.close(seg._fd)  # noqa: SLF001 - simulating a crash
                seg._fd = -1       # noqa: SLF001
        else:
            log.local_log.close()

    @rule(data=st.data(), drop_handles=st.booleans())
    def reopen_after_crash(self, data, drop_handles):
        old = self.log
        log_start = old.log_start_offset
        recovery_point = data.draw(st.integers(0, self.leo), label="recovery_point")
        self._crash(old, drop_handles)
        self.log = None
        self.log = self._open(recovery_point=recovery_point, log_start_offset=log_start,
                              clean=False)
        self._check_reopened()

    @precondition(lambda self: self.batches
                  and self.batches[-1].base >= self.log.local_log.active_segment.base_offset)
    @rule(data=st.data(), drop_handles=st.booleans(), corrupt=st.booleans())
    def reopen_after_torn_write(self, data, drop_handles, corrupt):
        """A crash tore the last batch (past the recovery point): recovery drops it."""
        old = self.log
        last = self.batches[-1]
        segment = old.local_log.active_segment
        position = segment.size - last.size   # the last batch ends the active segment
        path = segment.log_path
        log_start = old.log_start_offset
        recovery_point = data.draw(st.integers(0, last.base), label="recovery_point")
        self._crash(old, drop_handles)
        self.log = None
        with open(path, "r+b") as f:
            if corrupt:  # a flipped bit in the CRC-covered part of the batch
                at = position + data.draw(st.integers(rec.ATTRIBUTES_OFFSET, last.size - 1),
                                          label="corrupt_at")
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ 0x01]))
            else:        # a short write
                f.truncate(position + data.draw(st.integers(0, last.size - 1), label="keep"))
        self.log = self._open(recovery_point=recovery_point, log_start_offset=log_start,
                              clean=False)
        # the model: the batch is gone
        self.batches.pop()
        self.records = {o: r for o, r in self.records.items() if o < last.base}
        self.leo = last.base
        if self.log_start > self.leo:
            # Kafka's LogLoader (deleteSegmentsIfLogStartGreaterThanLogEnd): the log end
            # offset below the log start offset, so every segment goes and the log restarts
            # at the log start offset; neither moves backwards.
            self.records.clear()
            self.batches.clear()
            self.leo = self.log_start
        self._check_reopened()

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def offsets_are_ordered_and_match_the_model(self):
        log = self.log
        if log is None:
            return
        assert log.log_start_offset <= log.local_log_start_offset <= log.high_watermark \
            <= log.log_end_offset
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == \
            (self.log_start, self.hw, self.leo)
        assert log.recovery_point <= log.log_end_offset

    @invariant()
    def segments_are_ordered_and_on_disk(self):
        log = self.log
        if log is None:
            return
        segments = log.local_log.segments
        bases = [s.base_offset for s in segments]
        assert bases == sorted(set(bases)), f"segment base offsets not increasing: {bases}"
        assert bases[0] <= log.local_log_start_offset
        assert bases[-1] <= log.log_end_offset
        for seg in segments:
            assert seg.log_path.exists(), seg.log_path
            assert seg.offset_index.path.exists(), seg.offset_index.path
            assert seg.time_index.path.exists(), seg.time_index.path
            assert not seg.log_path.name.endswith(DELETED_SUFFIX)
        for seg in segments[:-1]:
            assert seg.size > 0, f"inactive segment {seg.base_offset} is empty"
        leftovers = [p.name for p in self.dir.iterdir() if p.name.endswith(DELETED_SUFFIX)]
        assert not leftovers, leftovers


LocalLogMatchesModel.TestCase.settings = settings(
    # ~20 s on 2 cores; raise LOG_MODEL_EXAMPLES for a longer hunt
    max_examples=int(os.environ.get("LOG_MODEL_EXAMPLES", "75")),
    stateful_step_count=100,
    deadline=None,
    # the explain phase replays the failure hundreds of times: minutes for a stateful test
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestLocalLogMatchesModel = LocalLogMatchesModel.TestCase


# ---- found by the state machine -------------------------------------------------------------


def _one_record_batch(value: bytes, clock: MockClock) -> bytes:
    return rec.build_batch([rec.SimpleRecord(value, b"k", timestamp=clock.milliseconds())])


@pytest.mark.parametrize("how", ["torn write", "truncation inside a batch"])
def test_reopen_never_moves_the_log_start_offset_back(tmp_path, how):
    """A log that reopens ending below its log start offset restarts at the log start offset.

    Kafka's LogLoader (``deleteSegmentsIfLogStartGreaterThanLogEnd``) deletes every segment and
    starts the log at the checkpointed log start offset, so offsets below it (deleted, maybe
    consumed) are never handed out again.
    """
    directory = tmp_path / "t-0"
    clock = MockClock(START_MS)
    config = LogConfig({})
    log = UnifiedLog(directory, config, clock=clock)
    if how == "torn write":
        log.append_as_leader(_one_record_batch(b"a", clock), 0)
        log.append_as_leader(_one_record_batch(b"b", clock), 0)
        log.update_high_watermark(2)
        log.maybe_increment_log_start_offset(2)          # DeleteRecords up to the end
        log_start = log.log_start_offset
        log.local_log.close()                            # crash ...
        segment = directory / "00000000000000000000.log"
        with open(segment, "r+b") as f:                  # ... that tore the last batch
            f.truncate(os.path.getsize(segment) - 3)
        log = UnifiedLog(directory, config, clock=clock, recovery_point=0,
                         log_start_offset=log_start, had_clean_shutdown=False)
    else:
        batch = rec.build_batch([rec.SimpleRecord(b"a", timestamp=clock.milliseconds()),
                                 rec.SimpleRecord(b"b", timestamp=clock.milliseconds())])
        log.append_as_leader(batch, 0)
        log.update_high_watermark(2)
        log.maybe_increment_log_start_offset(1)          # DeleteRecords inside the batch
        log.truncate_to(1)                               # drops the whole batch, end = 1
        assert (log.log_start_offset, log.log_end_offset) == (1, 1)
        log_start, recovery_point = log.log_start_offset, log.recovery_point
        log.close()
        log = UnifiedLog(directory, config, clock=clock, recovery_point=recovery_point,
                         log_start_offset=log_start)
    try:
        assert log.log_start_offset == log_start
        assert log.log_end_offset == log_start
        assert log.append_as_leader(_one_record_batch(b"new", clock), 0).first_offset == log_start
    finally:
        log.close()


def test_delete_records_frees_the_segments_of_a_compacted_topic(tmp_path):
    """Segments wholly below the log start offset go whatever the cleanup policy.

    Kafka's deleteOldSegments runs deleteLogStartOffsetBreachedSegments for every topic (only
    the retention.ms/bytes passes need ``delete``), so DeleteRecords frees disk on compacted
    topics too.
    """
    clock = MockClock(START_MS)
    log = UnifiedLog(tmp_path / "t-0", LogConfig({"cleanup.policy": "compact"}), clock=clock)
    try:
        log.append_as_leader(_one_record_batch(b"a", clock), 0)
        log.roll()
        log.append_as_leader(_one_record_batch(b"b", clock), 0)
        log.update_high_watermark(2)
        assert log.maybe_increment_log_start_offset(1)
        assert log.delete_old_segments() == 1
        assert [s.base_offset for s in log.local_log.segments] == [1]
        assert log.log_start_offset == log.local_log_start_offset == 1
    finally:
        log.close()
