"""The log cleaner: compaction of ``cleanup.policy=compact`` logs, as Kafka's ``LogCleaner``.

One clean of a log (``Cleaner.clean``):

1. The dirty section runs from the cleaner checkpoint (``cleaner-offset-checkpoint``, else the
   log start offset) to the first uncleanable offset: the lowest of the active segment's base
   offset, the last stable offset (itself at most the high watermark) and the base offset of the
   first dirty segment younger than ``min.compaction.lag.ms``.
2. An ``OffsetMap`` (key digest -> latest offset) is built over the dirty section, stopping when
   it is full; the clean ends at the last offset put in the map + 1.
3. Every segment from the start of the log to that end is rewritten, in groups that fit one
   segment (``segment.bytes``, ``segment.index.bytes``), into a ``.cleaned`` segment keeping
   per batch the records whose offset is the latest for their key (``rebuild_batch``: offsets
   are never renumbered). Tombstones and markers of finished transactions get a delete horizon
   (now + ``delete.retention.ms``) the first time they are cleaned, and go once it passed.
   A batch whose records all go is dropped, except the last batch of each active producer,
   kept as an empty batch so its sequence and epoch survive (Kafka's rule).
4. The cleaned segment replaces the group through ``LocalLog.replace_segments`` (``.cleaned`` ->
   ``.swap`` -> final name), which ``load_log`` completes after a crash.

Data batches are read in groups of consecutive batches (``cleaner_scan.scan_batches``): each
record's offset, key and tombstone flag land in numpy arrays without a ``Record`` being built,
the map takes a group's keys in one call, and a record of the dirty section is the latest of
its key when the map holds its offset. Only the retained records of a batch that loses some are
decoded and re-encoded (and re-compressed). Markers, aborted data and batches the scan cannot
frame go record by record (``Cleaner(scan=False)`` does so for every batch: the reference the
scan is tested against, byte for byte).

Every batch the cleaner reads has its CRC checked: a corrupt batch fails the clean
(and marks the partition uncleanable, see ``LogCleaner``) instead of being rewritten under a
fresh CRC.

Threads: ``Cleaner`` runs on one cleaner thread at a time per log (the ``LogCleaner`` marks a
log in progress); it reads segments without the log lock (segments below the first
uncleanable offset do not change) and takes the lock to swap, aborting if retention or
truncation removed a segment meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from itertools import repeat
from operator import methodcaller
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.types import TopicPartition
from strata.log.checkpoint import OffsetCheckpointFile
from strata.log.cleaner_scan import ScannedBatch, keys_of, record_at, scan_batches
from strata.log.indexes import AbortedTxn, OffsetIndex, TimeIndex
from strata.log.log_config import LogConfig
from strata.log.segment import CLEANED_SUFFIX, LogSegment
from strata.protocol import records as rec

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT_FILENAME = "cleaner-offset-checkpoint"
_DIGEST_SIZE = 16  # MD5, Kafka's default hash for the offset map
_LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor's default
_APPEND_CHUNK = 1 << 20
_digest = methodcaller("digest")
try:   # CPython's own MD5: the same digests at half the cost of OpenSSL's per short key
    from _md5 import md5 as _md5
except ImportError:  # pragma: no cover - a Python built without it
    _md5 = hashlib.md5
# consecutive batches are scanned together up to this many records or stored bytes
_GROUP_RECORDS = 4096
_GROUP_BYTES = 4 << 20


class OffsetMap:
    """Kafka's ``SkimpyOffsetMap``: key MD5 digest -> the latest offset seen for it.

    Holds at most ``slots`` keys, one per (16 + 8) bytes of its memory budget; ``is_full`` once
    ``slots * 0.9`` keys are held (the load factor Kafka uses). Digests may collide as in Kafka.
    One cleaner thread owns a map.
    """

    def __init__(self, memory_bytes: int):
        self.slots = max(memory_bytes // (_DIGEST_SIZE + 8), 1)
        self.max_entries = max(int(self.slots * _LOAD_FACTOR), 1)
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1

    def put(self, key: bytes, offset: int) -> None:
        self._map[_md5(key).digest()] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        return self._map.get(_md5(key).digest(), -1)

    def put_all(self, keys: list[bytes], offsets: list[int]) -> bool:
        """``put`` each key at its offset, in order, if they all fit before the map is full
        (``is_full`` is checked before each put); False, with nothing put, if they may not."""
        if len(keys) > self.max_entries - len(self._map):
            return False
        if keys:
            self._map.update(zip(map(_digest, map(_md5, keys)), offsets))
            self.latest_offset = offsets[-1]
        return True

    def live_offsets(self) -> np.ndarray:
        """The offsets the map holds, sorted: those of the latest record of each key."""
        return np.sort(np.fromiter(self._map.values(), np.int64, len(self._map)))

    def get_all(self, keys: list[bytes]) -> list[int]:
        """``get`` of each key."""
        return list(map(self._map.get, map(_digest, map(_md5, keys)), repeat(-1)))

    def is_full(self) -> bool:
        return len(self._map) >= self.max_entries

    @property
    def size(self) -> int:
        return len(self._map)

    def clear(self) -> None:
        self._map.clear()
        self.latest_offset = -1


class CleanerStats:
    """What one clean read and wrote (Kafka's ``CleanerStats``)."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self.start_ms = clock.milliseconds()
        self.end_ms = self.start_ms
        self.map_bytes_read = self.map_messages_read = 0
        self.bytes_read = self.bytes_written = 0
        self.messages_read = self.messages_written = 0
        self.invalid_messages = 0
        self.buffer_utilization = 0.0

    def done(self) -> None:
        self.end_ms = self._clock.milliseconds()

    @property
    def elapsed_s(self) -> float:
        return max(self.end_ms - self.start_ms, 1) / 1000


class Throttler:
    """``log.cleaner.io.max.bytes.per.second``: sleeps so the cleaner's I/O stays under it.
    Shared by every cleaner thread, as Kafka's."""

    def __init__(self, bytes_per_second: float, clock: Clock = SYSTEM_CLOCK,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._start = clock.milliseconds()
        self._bytes = 0
        self._lock = threading.Lock()

    def maybe_throttle(self, n: int) -> None:
        if self.rate >= 1.7e308:
            return
        with self._lock:
            self._bytes += n
            elapsed_ms = self._clock.milliseconds() - self._start
            wait_ms = self._bytes * 1000 / self.rate - elapsed_ms
            if elapsed_ms > 1000:
                self._start, self._bytes = self._clock.milliseconds(), 0
        if wait_ms > 0:
            self._sleep(wait_ms / 1000)


class LastRecord(NamedTuple):
    last_data_offset: int | None
    producer_epoch: int


class _TransactionMetadata:
    """Kafka's ``CleanedTransactionMetadata``: aborted data goes; markers stay until no data of
    their transaction is left."""

    def __init__(self):
        self._aborted: deque[AbortedTxn] = deque()
        self._ongoing_aborted: dict[int, list] = {}   # pid -> [txn, last observed offset]
        self._ongoing_committed: set[int] = set()
        self.cleaned_index: LogSegment | None = None

    def add_aborted(self, txns: Iterable[AbortedTxn]) -> None:
        self._aborted.extend(sorted(txns, key=lambda t: t.first_offset))

    def _consume_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0].first_offset <= offset:
            txn = self._aborted.popleft()
            self._ongoing_aborted.setdefault(txn.producer_id, [txn, None])

    def on_batch_read(self, header: rec.BatchHeader, buf) -> bool:
        """Whether the batch can be discarded (aborted data, or a marker of an empty txn)."""
        self._consume_up_to(header.last_offset)
        pid = header.producer_id
        if header.is_control:
            if header.record_count == 0:
                return True
            kind = rec.control_type(buf, header)
            if kind == rec.CONTROL_ABORT:
                entry = self._ongoing_aborted.pop(pid, None)
                if entry is not None and entry[1] is not None:
                    if self.cleaned_index is not None:
                        self.cleaned_index.update_txn_index(entry[0])
                    return False
                return True
            if kind == rec.CONTROL_COMMIT:
                if pid in self._ongoing_committed:
                    self._ongoing_committed.discard(pid)
                    return False
                return True
            return False
        if header.is_transactional:
            entry = self._ongoing_aborted.get(pid)
            if entry is not None:
                entry[1] = header.last_offset
                return True
            self._ongoing_committed.add(pid)
        return False


class LogToClean(NamedTuple):
    """A compacted log with its cleanable range (Kafka's ``LogToClean``)."""

    topic_partition: TopicPartition
    log: object   # UnifiedLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool
    # how late its compaction is past max.compaction.lag.ms (Kafka's maxCompactionDelay)
    compaction_delay_ms: int = 0

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


def _offsets_to_clean(ulog, checkpoint: int | None, now_ms: int) -> tuple[int, int, int]:
    """(first dirty, first uncleanable, compaction delay in ms); ``ulog.lock`` held."""
    start = ulog.log_start_offset
    first_dirty = start if checkpoint is None or checkpoint < start or \
        checkpoint > ulog.log_end_offset else checkpoint
    cfg = ulog.config
    segments = ulog.local_log.segments
    active = segments[-1]
    candidates = [ulog.last_stable_offset, active.base_offset]
    lag = cfg.get("min.compaction.lag.ms")
    dirty = [s for i, s in enumerate(segments[:-1])
             if segments[i + 1].base_offset > first_dirty]
    if lag > 0:
        young = next((s for s in dirty if s.largest_timestamp > now_ms - lag), None)
        if young is not None:
            candidates.append(young.base_offset)
    first_uncleanable = max(min(candidates), first_dirty)
    delay = max_compaction_delay(dirty, cfg.get("max.compaction.lag.ms"), now_ms)
    return first_dirty, first_uncleanable, delay


def max_compaction_delay(dirty_segments, max_compaction_lag_ms: int, now_ms: int) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest dirty record of a log waits, in ms
    (0 when not late): Kafka's ``LogCleanerManager.maxCompactionDelay``. ``dirty_segments`` are
    the non-active segments from the first dirty offset; each counts its first batch's
    timestamp, when positive."""
    clean_until = now_ms - max(max_compaction_lag_ms, 0)
    if clean_until <= 0:     # the default lag (Long.MAX_VALUE): never late
        return 0
    stamps = [t for t in map(_first_batch_timestamp, dirty_segments) if t > 0]
    earliest = min(stamps, default=clean_until)
    return clean_until - earliest if earliest < clean_until else 0


def _first_batch_timestamp(seg: LogSegment) -> int:
    """The max timestamp of the segment's first batch (Kafka's ``getFirstBatchTimestamp``)."""
    head = seg.read_bytes(0, rec.HEADER_SIZE)
    return rec.read_header(head, 0).max_timestamp if len(head) == rec.HEADER_SIZE else -1


def _segment_bytes(segments, lo: int, hi: int) -> int:
    """Bytes of the segments overlapping [lo, hi)."""
    out = 0
    for i, s in enumerate(segments):
        end = segments[i + 1].base_offset if i + 1 < len(segments) else 2**63 - 1
        if end > lo and s.base_offset < hi:
            out += s.size
    return out


def log_to_clean(tp: TopicPartition, ulog, checkpoint: int | None, now_ms: int) -> LogToClean:
    with ulog.lock:
        first_dirty, first_uncleanable, delay_ms = _offsets_to_clean(ulog, checkpoint, now_ms)
        segments = ulog.local_log.segments
        clean = _segment_bytes(segments, -1, first_dirty)
        cleanable = _segment_bytes(segments, first_dirty, first_uncleanable) \
            if first_uncleanable > first_dirty else 0
    return LogToClean(tp, ulog, first_dirty, first_uncleanable, clean, cleanable, delay_ms > 0,
                      delay_ms)


def group_segments_by_size(segments: list[LogSegment], max_size: int, max_index_size: int,
                           first_uncleanable: int) -> list[list[LogSegment]]:
    """Consecutive segments whose data and indexes fit one segment (Kafka's
    ``groupSegmentsBySize``); the last offset of a group stays within 2^31 of its base."""
    groups: list[list[LogSegment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        index = segments[i].offset_index.entries * OffsetIndex.ENTRY_SIZE
        tindex = segments[i].time_index.entries * TimeIndex.ENTRY_SIZE
        i += 1
        while i < len(segments):
            nxt = segments[i]
            upper = segments[i + 1].base_offset - 1 if i + 1 < len(segments) \
                else first_uncleanable - 1
            if size + nxt.size > max_size or \
                    index + nxt.offset_index.entries * OffsetIndex.ENTRY_SIZE > max_index_size or \
                    tindex + nxt.time_index.entries * TimeIndex.ENTRY_SIZE > max_index_size or \
                    upper - group[0].base_offset > 2**31 - 1:
                break
            group.append(nxt)
            size += nxt.size
            index += nxt.offset_index.entries * OffsetIndex.ENTRY_SIZE
            tindex += nxt.time_index.entries * TimeIndex.ENTRY_SIZE
            i += 1
        groups.append(group)
    return groups


class CleanAborted(Exception):
    """The log changed under the cleaner (segments deleted or truncated): try again later."""


class Cleaner:
    """Cleans one log at a time; owns its ``OffsetMap`` and ``Throttler``. One thread."""

    def __init__(self, offset_map: OffsetMap, throttler: Throttler | None = None,
                 clock: Clock = SYSTEM_CLOCK, stop: threading.Event | None = None,
                 scan: bool = True):
        self.offset_map = offset_map
        # scan batches into arrays (cleaner_scan); False decodes every record (the reference)
        self._scan = scan
        self.throttler = throttler or Throttler(float("inf"), clock)
        self._clock = clock
        self._stop = stop or threading.Event()

    def _read(self, h: rec.BatchHeader) -> None:
        """Account for one batch read; a broker shutting down aborts the clean."""
        if self._stop.is_set():
            raise CleanAborted("the cleaner is shutting down")
        self.throttler.maybe_throttle(h.size)

    def clean(self, cleanable: LogToClean) -> tuple[int, CleanerStats]:
        """Clean ``cleanable.log``; returns the new first dirty offset and the stats."""
        ulog = cleanable.log
        stats = CleanerStats(self._clock)
        now = self._clock.milliseconds()
        self.offset_map.clear()
        # batches of the dirty section the map skipped (markers, aborted data)
        self._unmapped: set[int] = set()
        self._map_start = cleanable.first_dirty_offset
        with ulog.lock:
            segments = ulog.local_log.segments
            producers = {pid: LastRecord(e.batch_metadata[-1].last_offset if e.batch_metadata
                                         else None, e.producer_epoch)
                         for pid, e in ulog.producer_state.active_producers.items()}
        end = self._build_offset_map(ulog, segments, cleanable.first_dirty_offset,
                                     cleanable.first_uncleanable_offset, stats)
        stats.buffer_utilization = self.offset_map.size / self.offset_map.slots
        self._live = self.offset_map.live_offsets()
        to_clean = [s for s in segments[:-1] if s.base_offset < end]
        cfg: LogConfig = ulog.config
        for group in group_segments_by_size(to_clean, cfg.effective_segment_bytes,
                                            cfg.get("segment.index.bytes"),
                                            cleanable.first_uncleanable_offset):
            self._clean_segments(ulog, group, segments, producers, now,
                                 cfg.get("delete.retention.ms"), stats)
        stats.done()
        return end, stats

    # ---- the offset map ---------------------------------------------------------------------

    def _build_offset_map(self, ulog, segments, start: int, upper: int,
                          stats: CleanerStats) -> int:
        """Fill the map from ``start`` below ``upper``; returns where the clean ends."""
        txns = _TransactionMetadata()
        txns.add_aborted(ulog.local_log.collect_aborted_transactions(start, upper))
        self._fill_offset_map(segments, start, upper, txns, stats)
        latest = self.offset_map.latest_offset
        return latest + 1 if latest >= start else start

    def _fill_offset_map(self, segments, start: int, upper: int, txns: _TransactionMetadata,
                         stats: CleanerStats) -> None:
        def batches():
            for seg in segments:
                if seg.base_offset >= upper:
                    return
                for h, block, _ in seg.iter_batches(0):
                    if h.last_offset < start:
                        continue
                    if h.base_offset >= upper:
                        return
                    yield h, block

        offset_map = self.offset_map
        group: list[tuple[rec.BatchHeader, bytes]] = []   # data batches scanned together
        records = size = 0
        for h, block in batches():
            self._read(h)
            skip = txns.on_batch_read(h, block) or h.is_control
            if not skip and h.record_count > 0:
                group.append((h, block))
                records += h.record_count
                size += h.size
                if records < _GROUP_RECORDS and size < _GROUP_BYTES:
                    continue
            if group and not self._map_group(group, start, upper, stats):
                return
            if group and group[-1][0] is h:
                group, records, size = [], 0, 0
                continue
            group, records, size = [], 0, 0
            if not skip:   # an empty data batch
                if not self._map_group([(h, block)], start, upper, stats):
                    return
                continue
            self._unmapped.add(h.base_offset)
            stats.map_bytes_read += h.size
            # markers, aborted and keyless batches count as read too (Kafka's
            # updateLatestOffset): the clean then ends past them, else a log whose dirty
            # part ends with a marker stays dirty and is picked again at once, forever
            offset_map.latest_offset = max(offset_map.latest_offset, min(h.last_offset, upper - 1))
        if group:
            self._map_group(group, start, upper, stats)

    def _map_group(self, group: list[tuple[rec.BatchHeader, bytes]], start: int, upper: int,
                   stats: CleanerStats) -> bool:
        """Put the keyed records in [start, upper) of data batches ``group`` into the map, in
        order; False once the map is full."""
        offset_map = self.offset_map
        sb = scan_batches([(b, h) for h, b in group], lenient=True) if self._scan else None
        if sb is not None:
            offsets = sb.offsets
            index = np.flatnonzero(sb.has_key & (offsets >= start) & (offsets < upper))
            if offset_map.put_all(keys_of(sb, index), offsets[index].tolist()):
                stats.map_bytes_read += sum(h.size for h, _ in group)
                stats.map_messages_read += len(offsets)
                offset_map.latest_offset = max(offset_map.latest_offset,
                                               min(group[-1][0].last_offset, upper - 1))
                return True
        # record by record: an odd or corrupt batch (decode_batch raises), or the map filling
        for h, block in group:
            stats.map_bytes_read += h.size
            for r in rec.decode_batch(block, h, check_crc=True):
                stats.map_messages_read += 1
                if r.key is None or r.offset < start or r.offset >= upper:
                    continue
                if offset_map.is_full():
                    return False
                offset_map.put(r.key, r.offset)
            offset_map.latest_offset = max(offset_map.latest_offset,
                                           min(h.last_offset, upper - 1))
        return True

    # ---- rewriting a group --------------------------------------------------------------------

    def _clean_segments(self, ulog, group: list[LogSegment], all_segments, producers, now: int,
                        delete_retention_ms: int, stats: CleanerStats) -> None:
        head = group[0]
        for stale in head.directory.glob(f"{head.base_offset:020d}.*{CLEANED_SUFFIX}"):
            stale.unlink()
        cleaned = LogSegment(head.directory, head.base_offset,
                             index_interval_bytes=ulog.config.get("index.interval.bytes"),
                             max_index_size=ulog.config.get("segment.index.bytes"),
                             roll_jitter_ms=0, clock=self._clock, file_suffix=CLEANED_SUFFIX)
        txns = _TransactionMetadata()
        txns.cleaned_index = cleaned
        sizes = [s.size for s in group]
        try:
            for seg in group:
                i = all_segments.index(seg)
                upper = all_segments[i + 1].base_offset if i + 1 < len(all_segments) \
                    else seg.read_next_offset()
                txns.add_aborted(ulog.local_log.collect_aborted_transactions(seg.base_offset,
                                                                             upper))
                self._clean_into(seg, cleaned, txns, producers, now, delete_retention_ms, stats)
            cleaned.on_become_inactive()
            cleaned.flush()
            mtime_ns = os.stat(group[-1].log_path).st_mtime_ns   # keeps time retention as it was
            os.utime(cleaned.log_path, ns=(mtime_ns, mtime_ns))
            with ulog.lock:
                current = ulog.local_log.segments
                if any(s not in current for s in group) or \
                        [s.size for s in group] != sizes:
                    raise CleanAborted(f"segments of {ulog.topic_partition} changed")
                ulog.local_log.replace_segments(cleaned, group)
                for seg in group[1:]:   # as Kafka, the producer snapshots of replaced segments go
                    snapshot = ulog.producer_state.remove_and_mark_snapshot_for_deletion(
                        seg.base_offset)
                    if snapshot is not None:
                        snapshot.unlink(missing_ok=True)
        except BaseException:
            cleaned.delete_files()
            raise

    def _clean_into(self, source: LogSegment, dest: LogSegment, txns: _TransactionMetadata,
                    producers: dict[int, LastRecord], now: int, delete_retention_ms: int,
                    stats: CleanerStats) -> None:
        output = _Output(self, dest, stats)
        group: list[tuple] = []   # data batches scanned together
        records = size = 0
        for h, block, _ in source.iter_batches(0):
            stats.bytes_read += h.size
            self._read(h)
            if h.is_control and group:   # its txn index entry after the data before it
                self._clean_group(group, output, now, delete_retention_ms, stats)
                group, records, size = [], 0, 0
            discard = txns.on_batch_read(h, block)
            horizon = h.base_timestamp if h.attributes & rec.DELETE_HORIZON_MASK else -1
            if h.is_control:
                drop_all = discard and 0 <= horizon <= now
            else:
                drop_all = discard
            last = producers.get(h.producer_id) if h.has_producer_id else None
            keep_empty = last is not None and (
                h.last_offset == last.last_data_offset if last.last_data_offset is not None
                else h.is_control and h.producer_epoch == last.producer_epoch)
            if self._scan and not drop_all and not h.is_control and h.record_count > 0:
                group.append((h, block, horizon, keep_empty))
                records += h.record_count
                size += h.size
                if records >= _GROUP_RECORDS or size >= _GROUP_BYTES:
                    self._clean_group(group, output, now, delete_retention_ms, stats)
                    group, records, size = [], 0, 0
                continue
            if group:
                self._clean_group(group, output, now, delete_retention_ms, stats)
                group, records, size = [], 0, 0
            self._clean_batch(h, block, discard, horizon, drop_all, keep_empty, output, now,
                              delete_retention_ms, stats)
        if group:
            self._clean_group(group, output, now, delete_retention_ms, stats)
        output.flush()

    def _clean_batch(self, h: rec.BatchHeader, block, discard: bool, horizon: int,
                     drop_all: bool, keep_empty: bool, output: "_Output", now: int,
                     delete_retention_ms: int, stats: CleanerStats) -> None:
        """One batch, record by record (markers, aborted data, odd or corrupt batches)."""
        records = rec.decode_batch(block, h, check_crc=True)
        stats.messages_read += len(records)
        retained = []
        tombstones = False
        for r in records:
            if drop_all:
                continue
            if not h.is_control and not self._retain(r, h, horizon, now, stats):
                continue
            retained.append(r)
            tombstones = tombstones or r.value is None
        empty_txn_marker = discard and h.is_control
        set_horizon = (tombstones or empty_txn_marker) and horizon < 0
        if retained and len(retained) == len(records) and not set_horizon:
            output.add(bytes(memoryview(block)[h.position:h.position + h.size]), len(retained))
        elif retained:
            output.add(rec.rebuild_batch(h, retained, now + delete_retention_ms if set_horizon
                                         else horizon), len(retained))
        elif keep_empty:
            output.add(rec.rebuild_batch(h, [], -1), 0)

    def _clean_group(self, group: list[tuple], output: "_Output", now: int,
                     delete_retention_ms: int, stats: CleanerStats) -> None:
        """Data batches (none dropped whole) scanned and judged together; a batch keeping all
        its records (and needing no delete horizon) is copied untouched, the others rebuilt
        from their retained records only."""
        sb = scan_batches([(block, h) for h, block, _, _ in group], lenient=True)
        if sb is None:
            for h, block, horizon, keep_empty in group:
                self._clean_batch(h, block, False, horizon, False, keep_empty, output, now,
                                  delete_retention_ms, stats)
            return
        counts = np.diff(sb.first)
        keep = self._retained(
            sb, np.repeat([h.base_offset not in self._unmapped for h, *_ in group], counts),
            np.repeat([0 <= horizon <= now for _, _, horizon, _ in group], counts), stats)
        starts = sb.first[:-1]
        kept = np.add.reduceat(keep, starts).tolist()
        tombstones = np.add.reduceat(keep & sb.value_null, starts).tolist()
        for i, (h, block, horizon, keep_empty) in enumerate(group):
            stats.messages_read += h.record_count
            n_kept = kept[i]
            set_horizon = tombstones[i] > 0 and horizon < 0
            if n_kept == h.record_count and not set_horizon:   # the batch as it is
                output.add(bytes(memoryview(block)[h.position:h.position + h.size]), n_kept)
            elif n_kept:
                first = sb.first[i]
                retained = [record_at(sb, h, j) for j in
                            (np.flatnonzero(keep[first:sb.first[i + 1]]) + first).tolist()]
                output.add(rec.rebuild_batch(h, retained, now + delete_retention_ms
                                             if set_horizon else horizon), n_kept)
            elif keep_empty:
                output.add(rec.rebuild_batch(h, [], -1), 0)

    def _retained(self, sb: ScannedBatch, mapped_batch: np.ndarray, expired: np.ndarray,
                  stats: CleanerStats) -> np.ndarray:
        """Which scanned records ``_retain`` keeps, decided for all at once. ``mapped_batch``:
        the record's batch was read into the map (not skipped); ``expired``: its batch's
        delete horizon passed.

        A keyed record the map was filled from (from the first dirty offset to the map's latest
        offset) is the latest of its key exactly when the map holds its offset: that is looked
        up in the sorted offsets, without hashing its key again."""
        offset_map = self.offset_map
        offsets = sb.offsets
        old = offsets <= offset_map.latest_offset
        keyed = old & sb.has_key
        stats.invalid_messages += int(np.count_nonzero(old)) - int(np.count_nonzero(keyed))
        keep = ~old
        index = np.flatnonzero(keyed)
        if len(index):
            at = offsets[index]
            live = np.empty(len(index), bool)
            mapped = mapped_batch[index] & (at >= self._map_start) if len(self._live) \
                else np.zeros(len(index), bool)
            if mapped.any():
                found = at[mapped]
                pos = np.minimum(np.searchsorted(self._live, found), len(self._live) - 1)
                live[mapped] = self._live[pos] == found
            rest = ~mapped
            if rest.any():
                live[rest] = at[rest] >= np.array(
                    offset_map.get_all(keys_of(sb, index[rest])), np.int64)
            live &= ~(expired[index] & sb.value_null[index])
            keep[index] = live
        return keep

    def _retain(self, r: rec.Record, h: rec.BatchHeader, horizon: int, now: int,
                stats: CleanerStats) -> bool:
        """Kafka's ``shouldRetainRecord`` for a v2 data record."""
        offset_map = self.offset_map
        if r.offset > offset_map.latest_offset:
            return True
        if r.key is None:
            stats.invalid_messages += 1
            return False
        if r.offset < offset_map.get(r.key):
            return False
        return r.value is not None or horizon < 0 or now < horizon

    def _append(self, dest: LogSegment, out: bytearray, headers: list[rec.BatchHeader],
                stats: CleanerStats) -> None:
        max_ts, shallow = -1, -1
        for h in headers:
            if h.max_timestamp > max_ts:
                max_ts, shallow = h.max_timestamp, h.last_offset
        dest.append(headers[-1].last_offset, max_ts, shallow, bytes(out), headers)
        stats.bytes_written += len(out)
        self.throttler.maybe_throttle(len(out))


class _Output:
    """The cleaned batches of a segment, appended to ``dest`` about 1 MiB at a time."""

    def __init__(self, cleaner: Cleaner, dest: LogSegment, stats: CleanerStats):
        self._cleaner, self._dest, self._stats = cleaner, dest, stats
        self._out = bytearray()
        self._headers: list[rec.BatchHeader] = []

    def add(self, data: bytes, n_kept: int) -> None:
        nh = rec.read_header(data, 0)
        # an empty batch holds no record of its max timestamp: the time index skips it
        self._headers.append(nh._replace(position=len(self._out),
                                         max_timestamp=nh.max_timestamp if n_kept else -1))
        self._out += data
        self._stats.messages_written += n_kept
        if len(self._out) >= _APPEND_CHUNK:
            self.flush()

    def flush(self) -> None:
        if self._out:
            self._cleaner._append(self._dest, self._out, self._headers, self._stats)
            self._out, self._headers = bytearray(), []


class PreCleanStats:
    """What a cleaner thread saw while picking its log (Kafka's ``PreCleanStats``)."""

    def __init__(self):
        self.max_compaction_delay_ms = 0
        self.delayed_partitions = 0
        self.cleanable_partitions = 0

    def update_max_compaction_delay(self, delay_ms: int) -> None:
        self.max_compaction_delay_ms = max(self.max_compaction_delay_ms, delay_ms)
        if delay_ms > 0:
            self.delayed_partitions += 1

    def record_cleanable_partitions(self, n: int) -> None:
        self.cleanable_partitions = n


def _dir_key(log_dir) -> str:
    """A log dir as Kafka tags it (``logDirectory``): its absolute path."""
    return os.path.abspath(os.fspath(log_dir))


class LogCleaner:
    """The cleaner threads of a broker (Kafka's ``LogCleaner`` + ``LogCleanerManager``).

    ``cleaner-offset-checkpoint`` in each log dir holds, per partition, the first dirty offset
    (Kafka's offset checkpoint format, version 0). Each of ``log.cleaner.threads`` threads picks
    the compacted log with the highest cleanable ratio at or above ``min.cleanable.dirty.ratio``
    (or one past ``max.compaction.lag.ms``) not being cleaned by another thread, cleans it and
    updates the checkpoint; with nothing to clean it waits ``log.cleaner.backoff.ms``.
    ``logs`` is called for the current ``(log dir, partition, UnifiedLog)`` triples.

    A clean that raises anything but an abort (``CleanAborted``) or an I/O error (``OSError``)
    -- a batch failing its CRC check or its decoding, say -- marks the partition *uncleanable*
    in its log dir, as Kafka's ``markPartitionUncleanable``: it is logged once with the
    exception and skipped by ``grab_filthiest`` afterwards, so a thread does not spin on it.
    The mark is in memory only and goes with that log: deleting the partition, moving it to
    another log dir (a new log) or restarting the broker clears it (Kafka's
    ``maintainUncleanablePartitions``). ``log_dir_metrics`` counts them per log dir.
    """

    def __init__(self, logs: Callable[[], list[tuple[Path, TopicPartition, object]]], *,
                 threads: int = 1, dedupe_buffer_size: int = 128 * 1024 * 1024,
                 io_max_bytes_per_second: float = float("inf"), backoff_ms: int = 15_000,
                 clock: Clock = SYSTEM_CLOCK, log_dirs: Iterable[Path] = ()):
        self._logs = logs
        self._threads_n = threads
        self._map_bytes = dedupe_buffer_size // max(threads, 1)
        self._throttler = Throttler(io_max_bytes_per_second, clock)
        self._backoff_s = backoff_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._in_progress: set[TopicPartition] = set()
        # log dir (absolute) -> partition -> the log marked uncleanable (Kafka's
        # uncleanablePartitions); the log is kept so a new log of the partition is not skipped
        self._uncleanable: dict[str, dict[TopicPartition, object]] = {}
        self._log_dirs = [_dir_key(d) for d in log_dirs]   # gauges from startup, as Kafka
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # metrics (Kafka's kafka.log:type=LogCleaner and LogCleanerManager)
        self.max_dirty_percent = 0
        self.last_stats: CleanerStats | None = None
        self.last_run_ms = clock.milliseconds()
        # per cleaner thread, its last pick's PreCleanStats (Kafka's lastPreCleanStats)
        self._pre_clean_stats: dict[int, PreCleanStats] = {}

    # ---- checkpoints --------------------------------------------------------------------------

    @staticmethod
    def checkpoint_file(log_dir: Path) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(Path(log_dir) / CLEANER_CHECKPOINT_FILENAME)

    def _update_checkpoint(self, log_dir: Path, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            f = self.checkpoint_file(log_dir)
            live = {p for d, p, _ in self._logs() if Path(d) == Path(log_dir)}
            offsets = {p: o for p, o in f.read().items() if p in live}
            offsets[tp] = offset
            f.write(offsets)

    # ---- uncleanable partitions ---------------------------------------------------------------

    def _mark_uncleanable_locked(self, log_dir, tp: TopicPartition, ulog) -> None:
        self._uncleanable.setdefault(_dir_key(log_dir), {})[tp] = ulog

    def uncleanable_partitions(self, log_dir) -> set[TopicPartition]:
        """The partitions marked uncleanable in ``log_dir``."""
        with self._lock:
            return set(self._uncleanable.get(_dir_key(log_dir), ()))

    def _is_uncleanable_locked(self, log_dir, tp: TopicPartition, ulog) -> bool:
        return self._uncleanable.get(_dir_key(log_dir), {}).get(tp) is ulog

    def maintain_uncleanable_partitions(self) -> None:
        """Kafka's ``maintainUncleanablePartitions``: forget the partitions whose log is gone."""
        if not self._uncleanable:
            return
        current = self._logs()
        with self._lock:
            self._prune_uncleanable_locked(current)

    def _prune_uncleanable_locked(self, current) -> None:
        if not self._uncleanable:
            return
        live = {(_dir_key(d), tp): ulog for d, tp, ulog in current}
        for log_dir, partitions in list(self._uncleanable.items()):
            for tp, ulog in list(partitions.items()):
                if live.get((log_dir, tp)) is not ulog:
                    del partitions[tp]
                    log.info("%s in %s is no longer uncleanable: its log was deleted or moved",
                             tp, log_dir)
            if not partitions:
                del self._uncleanable[log_dir]

    # ---- picking and cleaning -----------------------------------------------------------------

    def grab_filthiest(self, pre_clean_stats: PreCleanStats | None = None
                       ) -> tuple[Path, LogToClean] | None:
        """The dirtiest compacted log eligible now, marked in progress (or None); skips the
        partitions marked uncleanable (Kafka's ``grabFilthiestCompactedLog``)."""
        stats = pre_clean_stats if pre_clean_stats is not None else PreCleanStats()
        now = self._clock.milliseconds()
        checkpoints: dict[Path, dict[TopicPartition, int]] = {}
        best: tuple[Path, LogToClean] | None = None
        max_ratio = 0.0
        cleanable_n = 0
        with self._lock:
            current = self._logs()
            self._prune_uncleanable_locked(current)
            for log_dir, tp, ulog in current:
                if tp in self._in_progress or not ulog.config.is_compacted or \
                        self._is_uncleanable_locked(log_dir, tp, ulog):
                    continue
                try:
                    if log_dir not in checkpoints:
                        checkpoints[log_dir] = self.checkpoint_file(log_dir).read()
                    ltc = log_to_clean(tp, ulog, checkpoints[log_dir].get(tp), now)
                except OSError as exc:   # e.g. the partition being deleted: try next time
                    log.warning("cannot compute the cleanable range of %s: %s", tp, exc)
                    continue
                except Exception:  # noqa: BLE001 - Kafka's LogCleaningException from the pick
                    log.warning("Failed to calculate log cleaning stats for partition %s in %s. "
                                "Marking it as uncleanable", tp, log_dir, exc_info=True)
                    self._mark_uncleanable_locked(log_dir, tp, ulog)
                    continue
                stats.update_max_compaction_delay(ltc.compaction_delay_ms)
                max_ratio = max(max_ratio, ltc.cleanable_ratio)
                eligible = ltc.cleanable_bytes > 0 and (
                    ltc.needs_compaction_now or
                    ltc.cleanable_ratio >= ulog.config.get("min.cleanable.dirty.ratio"))
                if not eligible:
                    continue
                cleanable_n += 1
                if best is None or ltc.cleanable_ratio > best[1].cleanable_ratio:
                    best = (log_dir, ltc)
            self.max_dirty_percent = int(100 * max_ratio)
            if best is not None:
                stats.record_cleanable_partitions(cleanable_n)
                self._in_progress.add(best[1].topic_partition)
        return best

    def clean_once(self, cleaner: Cleaner) -> bool:
        """Clean the filthiest log, if any; True when one was cleaned (or the clean aborted),
        False when there was none or its clean failed and marked it uncleanable."""
        pre_clean = PreCleanStats()
        picked = self.grab_filthiest(pre_clean)
        if picked is None:
            return False
        self._pre_clean_stats[threading.get_ident()] = pre_clean   # Kafka: only on a pick
        log_dir, ltc = picked
        try:
            end, stats = cleaner.clean(ltc)
            self._update_checkpoint(log_dir, ltc.topic_partition, end)
            self.last_stats = stats
            log.info("cleaned %s up to %d: %d -> %d bytes in %.2fs", ltc.topic_partition, end,
                     stats.bytes_read, stats.bytes_written, stats.elapsed_s)
            if pre_clean.delayed_partitions > 0:
                log.info("Cleanable partitions: %d, Delayed partitions: %d, max delay: %d",
                         pre_clean.cleanable_partitions, pre_clean.delayed_partitions,
                         pre_clean.max_compaction_delay_ms)
        except CleanAborted as exc:
            log.info("clean aborted: %s", exc)
        except OSError as exc:   # e.g. the partition deleted meanwhile
            log.warning("cleaning %s failed: %s", ltc.topic_partition, exc)
        except Exception:  # noqa: BLE001 - Kafka's LogCleaningException: mark, never spin on it
            log.warning("Unexpected exception thrown when cleaning log %s. Marking its partition "
                        "(%s) as uncleanable in %s", ltc.log.directory, ltc.topic_partition,
                        _dir_key(log_dir), exc_info=True)
            with self._lock:   # before leaving in progress: no other thread picks it meanwhile
                self._mark_uncleanable_locked(log_dir, ltc.topic_partition, ltc.log)
            return False
        finally:
            with self._lock:
                self._in_progress.discard(ltc.topic_partition)
            self.last_run_ms = self._clock.milliseconds()
        return True

    @classmethod
    def from_properties(cls, props: dict[str, str], logs, clock: Clock = SYSTEM_CLOCK
                        ) -> "LogCleaner | None":
        """The broker's cleaner from ``server.properties`` (None when ``log.cleaner.enable``
        is false)."""
        if str(props.get("log.cleaner.enable", "true")).strip().lower() != "true":
            return None
        log_dirs = [Path(d.strip()) for d in str(props.get(
            "log.dirs", props.get("log.dir", "/tmp/kafka-logs"))).split(",") if d.strip()]
        return cls(logs, threads=int(props.get("log.cleaner.threads", 1)),
                   dedupe_buffer_size=int(props.get("log.cleaner.dedupe.buffer.size", 128 << 20)),
                   io_max_bytes_per_second=float(props.get(
                       "log.cleaner.io.max.bytes.per.second", 1.7976931348623157e308)),
                   backoff_ms=int(props.get("log.cleaner.backoff.ms", 15_000)), clock=clock,
                   log_dirs=log_dirs)

    def metrics(self) -> dict[str, float]:
        """Kafka's LogCleaner / LogCleanerManager gauges, by their JMX attribute names."""
        stats = self.last_stats
        now = self._clock.milliseconds()
        # Kafka: the max over the cleaner threads of their last pick's delay, in whole seconds
        delay_ms = max((s.max_compaction_delay_ms for s in list(self._pre_clean_stats.values())),
                       default=0)
        out = {"max-dirty-percent": self.max_dirty_percent,
               "time-since-last-run-ms": now - self.last_run_ms,
               "max-compaction-delay-secs": int(delay_ms) // 1000,
               "DeadThreadCount": sum(1 for t in self._threads if not t.is_alive())}
        if stats is not None:
            out["max-clean-time-secs"] = stats.elapsed_s
            out["max-buffer-utilization-percent"] = int(100 * stats.buffer_utilization)
            out["cleaner-recopy-percent"] = int(
                100 * stats.bytes_written / stats.bytes_read) if stats.bytes_read else 0
        return out

    def log_dir_metrics(self) -> dict[str, dict[str, float]]:
        """Kafka's per log dir LogCleanerManager gauges (tag ``logDirectory``, the absolute
        path): ``uncleanable-partitions-count`` and ``uncleanable-bytes``, the cleanable bytes of
        the uncleanable partitions. ``{gauge: {log dir: value}}``."""
        current = self._logs()
        with self._lock:
            self._prune_uncleanable_locked(current)
            marked = {d: dict(parts) for d, parts in self._uncleanable.items()}
            checkpoints = {d: self.checkpoint_file(d).read() for d in marked}
        dirs = set(self._log_dirs) | {_dir_key(d) for d, _, _ in current} | set(marked)
        count = dict.fromkeys(dirs, 0)
        size = dict.fromkeys(dirs, 0)
        now = self._clock.milliseconds()
        for d, partitions in marked.items():
            count[d] = len(partitions)
            for tp, ulog in partitions.items():
                try:
                    size[d] += log_to_clean(tp, ulog, checkpoints[d].get(tp), now).cleanable_bytes
                except Exception:  # noqa: BLE001 - it is uncleanable: its bytes may not be read
                    pass
        return {"uncleanable-partitions-count": count, "uncleanable-bytes": size}

    def _run(self) -> None:
        cleaner = Cleaner(OffsetMap(self._map_bytes), self._throttler, self._clock, self._stop)
        while not self._stop.is_set():
            try:
                if not self.clean_once(cleaner):
                    self._stop.wait(self._backoff_s)
                self.maintain_uncleanable_partitions()
            except Exception:  # noqa: BLE001 - Kafka marks the thread dead; we log and back off
                log.exception("log cleaner thread error")
                self._stop.wait(self._backoff_s)

    def startup(self) -> None:
        for i in range(self._threads_n):
            t = threading.Thread(target=self._run, name=f"kafka-log-cleaner-thread-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def shutdown(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads.clear()
