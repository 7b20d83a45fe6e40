"""LocalLog: the ordered segments of one partition directory on the broker's disk.

Owns the segment map, roll, reads across segments, truncation, segment deletion (rename to
``.deleted``, removed after ``file.delete.delay.ms``) and flushing up to the recovery point.
Offsets that span tiers (log start offset, high watermark, ...) belong to ``UnifiedLog``.

Not thread-safe except ``flush``: ``UnifiedLog`` calls it under its lock.
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

from strata.common.clock import Clock
from strata.common.files import fsync_dir
from strata.common.scheduler import Scheduler
from strata.common.types import TopicPartition
from strata.log.indexes import AbortedTxn
from strata.log.log_config import LogConfig
from strata.log.segment import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX, LogSegment
from strata.protocol.file_region import FileRegion

log = logging.getLogger(__name__)


class LogOffsetMetadata(NamedTuple):
    """An offset with, when known, the segment and byte position where it starts."""

    offset: int
    segment_base_offset: int = -1
    position: int = -1

    @property
    def known(self) -> bool:
        return self.segment_base_offset >= 0


class FetchDataInfo(NamedTuple):
    fetch_offset_metadata: LogOffsetMetadata
    records: bytes | memoryview | FileRegion  # a view for remote reads; a region for sendfile
    first_entry_incomplete: bool = False
    aborted_transactions: list[AbortedTxn] | None = None


EMPTY = b""


class LocalLog:
    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment],
                 recovery_point: int, next_offset: int, topic_partition: TopicPartition,
                 clock: Clock, scheduler: Scheduler):
        self.directory = Path(directory)
        self.config = config
        self.topic_partition = topic_partition
        self._clock = clock
        self._scheduler = scheduler
        self._bases: list[int] = []
        self._segments: dict[int, LogSegment] = {}
        for s in segments:
            self.add_segment(s)
        self.recovery_point = recovery_point
        self._end = LogOffsetMetadata(next_offset, self.active_segment.base_offset,
                                      self.active_segment.size)
        self.last_flush_ms = clock.milliseconds()

    # ---- segment map ------------------------------------------------------------------------

    def add_segment(self, segment: LogSegment) -> None:
        if segment.base_offset not in self._segments:
            bisect.insort(self._bases, segment.base_offset)
        self._segments[segment.base_offset] = segment

    def _remove_segment(self, base_offset: int) -> None:
        del self._segments[base_offset]
        self._bases.pop(bisect.bisect_left(self._bases, base_offset))

    @property
    def segments(self) -> list[LogSegment]:
        return [self._segments[b] for b in self._bases]

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[self._bases[-1]]

    @property
    def first_segment(self) -> LogSegment:
        return self._segments[self._bases[0]]

    def segment_count(self) -> int:
        return len(self._bases)

    def floor_segment(self, offset: int) -> LogSegment | None:
        i = bisect.bisect_right(self._bases, offset)
        return self._segments[self._bases[i - 1]] if i else None

    def higher_segment(self, offset: int) -> LogSegment | None:
        i = bisect.bisect_right(self._bases, offset)
        return self._segments[self._bases[i]] if i < len(self._bases) else None

    def segments_from(self, offset: int) -> Iterator[LogSegment]:
        """Segments that may hold ``offset`` or later offsets, in order."""
        i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        for b in self._bases[i:]:
            yield self._segments[b]

    def next_segment(self, segment: LogSegment) -> LogSegment | None:
        return self.higher_segment(segment.base_offset)

    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    # ---- offsets ----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._end.offset

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        return self._end

    def update_log_end_offset(self, offset: int) -> None:
        seg = self.active_segment
        self._end = LogOffsetMetadata(offset, seg.base_offset, seg.size)
        if self.recovery_point > offset:
            self.recovery_point = offset

    def offset_metadata(self, offset: int) -> LogOffsetMetadata:
        """Segment and position of ``offset`` (the end of the log for the log end offset)."""
        if offset == self._end.offset:
            return self._end
        seg = self.floor_segment(offset)
        if seg is not None:
            found = seg.translate_offset(offset)
            if found is not None:
                return LogOffsetMetadata(offset, seg.base_offset, found.position)
            nxt = self.next_segment(seg)
            if nxt is not None:
                return LogOffsetMetadata(offset, nxt.base_offset, 0)
        return LogOffsetMetadata(offset)

    # ---- roll -------------------------------------------------------------------------------

    def new_segment(self, base_offset: int) -> LogSegment:
        cfg = self.config
        return LogSegment(self.directory, base_offset,
                          index_interval_bytes=cfg.get("index.interval.bytes"),
                          max_index_size=cfg.get("segment.index.bytes"),
                          roll_jitter_ms=_jitter(cfg.get("segment.jitter.ms")),
                          clock=self._clock)

    def roll(self, expected_next_offset: int | None = None) -> LogSegment:
        """Seal the active segment and start a new one at max(expected, log end offset)."""
        new_offset = max(expected_next_offset or 0, self.log_end_offset)
        active = self.active_segment
        if active.base_offset == new_offset and active.size == 0:
            return active  # already a fresh segment at that offset
        if new_offset < active.base_offset:
            raise ValueError(f"cannot roll to {new_offset} below active segment {active.base_offset}")
        active.on_become_inactive()
        seg = self.new_segment(new_offset)
        self.add_segment(seg)
        self._end = LogOffsetMetadata(self._end.offset, seg.base_offset, 0)
        log.info("rolled %s to new segment %d", self.topic_partition, new_offset)
        return seg

    # ---- reads ------------------------------------------------------------------------------

    def read(self, start_offset: int, max_length: int, min_one_message: bool,
             max_offset_metadata: LogOffsetMetadata, include_aborted_txns: bool,
             as_region: bool = False) -> FetchDataInfo:
        """Whole batches from ``start_offset`` below ``max_offset_metadata`` (exclusive).

        The caller has checked ``start_offset`` lies within the local log. With ``as_region``
        the records are a ``FileRegion`` of the segment file (for sendfile) instead of bytes.
        """
        upper = max_offset_metadata
        seg = self.floor_segment(start_offset)
        while seg is not None:
            if upper.known and seg.base_offset == upper.segment_base_offset:
                max_position = upper.position
            elif upper.known and seg.base_offset > upper.segment_base_offset:
                break
            else:
                max_position = seg.size
            got = seg.read(start_offset, max_length, max_position, min_one_message, as_region)
            if got is not None:
                meta = LogOffsetMetadata(start_offset, seg.base_offset, got.position)
                aborted = None
                if include_aborted_txns:   # none can concern an empty read
                    aborted = self.collect_aborted_transactions(
                        start_offset, self._fetch_upper_bound(seg, got.upper_offset)
                    ) if len(got.data) else []
                return FetchDataInfo(meta, got.data, False, aborted)
            seg = self.next_segment(seg)
        return FetchDataInfo(LogOffsetMetadata(start_offset), EMPTY, False,
                             [] if include_aborted_txns else None)

    def _fetch_upper_bound(self, seg: LogSegment, indexed: int | None) -> int:
        """An offset past a read of ``seg``, found without reading it (Kafka's
        ``fetchUpperBoundOffset``): the first offset index entry at or past its end
        (``indexed``), else the next segment's base offset, else the log end offset."""
        if indexed is not None:
            return indexed
        following = self.next_segment(seg)
        return following.base_offset if following is not None else self._end.offset

    def collect_aborted_transactions(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, upper_offset), from the txn indexes.

        A transaction's entry sits in the segment of its abort marker, which may come after the
        fetched range, so the walk goes on until an entry ends at or past ``upper_offset``.
        """
        out: list[AbortedTxn] = []
        for seg in self.segments_from(start_offset):
            result = seg.txn_index.collect_aborted_txns(start_offset, upper_offset)
            out.extend(result.aborted_transactions)
            if result.is_complete:
                break
        return out

    # ---- truncation and deletion ------------------------------------------------------------

    def truncate_to(self, offset: int) -> list[LogSegment]:
        """Drop every offset >= ``offset``; returns the whole segments removed."""
        removed = []
        while self.segment_count() > 1 and self.active_segment.base_offset >= offset:
            seg = self.active_segment
            self._remove_segment(seg.base_offset)
            seg.delete_files()
            removed.append(seg)
        seg = self.active_segment
        if seg.base_offset > offset:
            self.truncate_fully_and_start_at(offset)
            return removed + [seg]
        seg.truncate_to(offset)
        seg.resize_indexes()
        self.update_log_end_offset(offset)
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> None:
        for s in self.segments:
            self._remove_segment(s.base_offset)
            s.delete_files()
        self.add_segment(self.new_segment(offset))
        self.update_log_end_offset(offset)
        self.recovery_point = offset

    def delete_segments(self, segments: Iterable[LogSegment], reason: str) -> None:
        """Remove segments from the map and their files from disk after ``file.delete.delay.ms``."""
        for seg in list(segments):
            if seg is self.active_segment:
                raise ValueError("the active segment cannot be deleted; roll first")
            self._remove_segment(seg.base_offset)
            log.info("deleting segment %s of %s: %s", seg.base_offset, self.topic_partition, reason)
            seg.change_file_suffixes("", DELETED_SUFFIX)
            self._scheduler.schedule_once(f"delete-{seg.log_path.name}", seg.delete_files,
                                          self.config.get("file.delete.delay.ms"))

    def replace_segments(self, new: LogSegment, old: list[LogSegment]) -> None:
        """Swap a flushed ``.cleaned`` segment in for ``old`` (Kafka's ``replaceSegments``).

        Crash-safe order: ``.cleaned`` -> ``.swap``; each old segment -> ``.deleted``; ``.swap``
        -> final name. ``load_log`` completes a swap it finds and drops ``.cleaned`` files.
        Readers never see a gap: the new segment takes the first old one's place in the
        segment map before the others leave it.
        """
        new.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
        fsync_dir(self.directory)
        self.add_segment(new)
        for seg in old:
            if seg is not new and seg.base_offset != new.base_offset \
                    and self._segments.get(seg.base_offset) is seg:
                self._remove_segment(seg.base_offset)
            seg.change_file_suffixes("", DELETED_SUFFIX)
            self._scheduler.schedule_once(f"delete-{seg.log_path.name}", seg.delete_files,
                                          self.config.get("file.delete.delay.ms"))
        new.change_file_suffixes(SWAP_SUFFIX, "")
        fsync_dir(self.directory)

    # ---- durability -------------------------------------------------------------------------

    def segments_to_flush(self, up_to_offset_exclusive: int) -> list[LogSegment]:
        """Segments holding offsets in [recovery point, offset): what a flush must fsync."""
        if up_to_offset_exclusive <= self.recovery_point:
            return []
        out = []
        for seg in self.segments_from(self.recovery_point):
            if seg.base_offset >= up_to_offset_exclusive:
                break
            out.append(seg)
        return out

    @staticmethod
    def fsync_segments(segments: list[LogSegment]) -> None:
        """fsync without the log lock: a segment deleted meanwhile has nothing left to make durable."""
        for seg in segments:
            try:
                seg.flush()
            except (OSError, ValueError):
                log.debug("skipped flushing closed segment %s", seg.base_offset)

    def mark_flushed(self, up_to_offset_exclusive: int) -> None:
        self.recovery_point = max(self.recovery_point,
                                  min(up_to_offset_exclusive, self.log_end_offset))
        self.last_flush_ms = self._clock.milliseconds()

    def flush(self, up_to_offset_exclusive: int) -> None:
        """fsync the segments below ``up_to_offset_exclusive`` and advance the recovery point."""
        self.fsync_segments(self.segments_to_flush(up_to_offset_exclusive))
        self.mark_flushed(up_to_offset_exclusive)

    def close(self) -> None:
        for s in self.segments:
            s.close()


def _jitter(max_jitter_ms: int) -> int:
    if max_jitter_ms <= 0:
        return 0
    import random
    return random.randrange(max_jitter_ms)
