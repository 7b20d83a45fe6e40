"""The leader epoch cache: for each leader epoch, the first offset written in it.

Mirrors Kafka's ``LeaderEpochFileCache``. Entries are kept sorted by epoch, and both epochs and
start offsets strictly increase: assigning an entry first removes every entry that would break
that order. The cache answers OffsetsForLeaderEpoch (:meth:`end_offset_for`) and gives the
tiered-storage copier the epoch history of each segment. It is backed by a
``leader-epoch-checkpoint`` file, rewritten on every change.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import TYPE_CHECKING, NamedTuple

from strata.common.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, OffsetAndEpoch, TopicPartition

if TYPE_CHECKING:
    from strata.log.checkpoint import LeaderEpochCheckpointFile

__all__ = ["EpochEntry", "LeaderEpochFileCache", "UNDEFINED_EPOCH_OFFSET"]

log = logging.getLogger(__name__)

UNDEFINED_EPOCH_OFFSET = UNDEFINED_OFFSET


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def _truncate_from_end(entries: list[EpochEntry], end_offset: int) -> list[EpochEntry]:
    """Remove (in place) entries with start_offset >= end_offset; return the removed ones."""
    if end_offset < 0 or not entries or entries[-1].start_offset < end_offset:
        return []
    # Start offsets strictly increase, so the entries to drop are a suffix.
    cut = len(entries)
    while cut > 0 and entries[cut - 1].start_offset >= end_offset:
        cut -= 1
    removed = entries[cut:]
    del entries[cut:]
    return removed


def _truncate_from_start(entries: list[EpochEntry], start_offset: int) -> list[EpochEntry]:
    """Remove (in place) entries with start_offset <= start_offset, keeping the last of them
    re-based to start at ``start_offset``; return the removed entries."""
    cut = 0
    while cut < len(entries) and entries[cut].start_offset <= start_offset:
        cut += 1
    if cut == 0:
        return []
    removed = entries[:cut]
    entries[:cut] = [EpochEntry(removed[-1].epoch, start_offset)]
    return removed


class LeaderEpochFileCache:
    """Thread-safe (epoch -> start offset) history of one partition replica."""

    def __init__(self, topic_partition: TopicPartition,
                 checkpoint: LeaderEpochCheckpointFile | None,
                 entries: list[EpochEntry] | None = None):
        """Load from ``checkpoint`` (None: in memory only), or from ``entries`` when given."""
        self._tp = topic_partition
        self._checkpoint = checkpoint
        self._lock = threading.RLock()
        self._entries: list[EpochEntry] = []
        self._epochs: list[int] = []  # parallel to _entries, for bisect
        loaded = entries if entries is not None else (checkpoint.read() if checkpoint else [])
        for entry in loaded:
            self._assign(EpochEntry(*entry))

    # ----------------------------------------------------------------- updates

    @property
    def topic_partition(self) -> TopicPartition:
        return self._tp

    @property
    def checkpoint(self) -> LeaderEpochCheckpointFile | None:
        return self._checkpoint

    def _update_needed(self, entry: EpochEntry) -> bool:
        if not self._entries:
            return True
        latest = self._entries[-1]
        return entry.epoch != latest.epoch or entry.start_offset < latest.start_offset

    def _assign(self, entry: EpochEntry) -> bool:
        if entry.epoch < 0:
            return False  # batches without a partition leader epoch carry -1
        if entry.start_offset < 0:
            raise ValueError(f"Received invalid partition leader epoch entry {entry}")
        with self._lock:
            if not self._update_needed(entry):
                return False
            # Drop the entries that would break monotonicity of epochs or start offsets.
            cut = len(self._entries)
            while cut > 0 and (self._entries[cut - 1].epoch >= entry.epoch
                               or self._entries[cut - 1].start_offset >= entry.start_offset):
                cut -= 1
            removed = self._entries[cut:]
            if len(removed) > 1 or (removed and removed[0].start_offset != entry.start_offset):
                log.warning("[LeaderEpochCache %s] New epoch entry %s caused truncation of "
                            "conflicting entries %s.", self._tp, entry, removed)
            del self._entries[cut:]
            del self._epochs[cut:]
            self._entries.append(entry)
            self._epochs.append(entry.epoch)
            return True

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op for epoch < 0, for the current
        latest epoch at an equal or later offset); conflicting entries are removed. Flushes."""
        with self._lock:
            if self._assign(EpochEntry(epoch, start_offset)):
                log.debug("[LeaderEpochCache %s] Appended new epoch entry %s. Cache now contains "
                          "%d entries.", self._tp, EpochEntry(epoch, start_offset),
                          len(self._entries))
                self._write(if_dir_exists=False)

    def assign_entries(self, entries: list[EpochEntry]) -> None:
        """Assign several entries, flushing once."""
        with self._lock:
            for entry in entries:
                self._assign(EpochEntry(*entry))
            if entries:
                self._write(if_dir_exists=False)

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove every entry with start_offset >= ``end_offset`` (no-op for a negative offset)."""
        with self._lock:
            removed = _truncate_from_end(self._entries, end_offset)
            if removed:
                del self._epochs[len(self._entries):]
                log.debug("[LeaderEpochCache %s] Cleared entries %s after truncating to end "
                          "offset %d.", self._tp, removed, end_offset)
                self._write(if_dir_exists=True)

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop the history below ``start_offset``: entries starting at or before it are removed,
        except the last of them, which is kept re-based to ``start_offset``. Exclusive:
        ``truncate_from_start(6)`` keeps an entry starting at 6 untouched."""
        with self._lock:
            removed = _truncate_from_start(self._entries, start_offset)
            if removed:
                self._epochs[:len(removed)] = [self._entries[0].epoch]
                log.debug("[LeaderEpochCache %s] Cleared entries %s and rewrote first entry %s "
                          "after truncating to start offset %d.", self._tp, removed,
                          self._entries[0], start_offset)
                self._write(if_dir_exists=True)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._epochs.clear()

    def clear_and_flush(self) -> None:
        with self._lock:
            self.clear()
            self._write(if_dir_exists=False)

    def flush(self) -> None:
        """Write the current entries to the checkpoint file."""
        with self._lock:
            self._write(if_dir_exists=False)

    def _write(self, if_dir_exists: bool) -> None:
        # Called with the lock held so a stale snapshot never overwrites a newer one.
        if self._checkpoint is None:
            return
        if if_dir_exists:
            if not self._checkpoint.write_if_dir_exists(self._entries):
                log.warning("[LeaderEpochCache %s] Failed to write %s: directory is gone",
                            self._tp, self._checkpoint.path)
        else:
            self._checkpoint.write(self._entries)

    def with_checkpoint(self, checkpoint: LeaderEpochCheckpointFile | None) -> "LeaderEpochFileCache":
        """A new cache with the same entries, backed by another checkpoint (not written yet)."""
        with self._lock:
            return LeaderEpochFileCache(self._tp, checkpoint, list(self._entries))

    # ----------------------------------------------------------------- queries

    @property
    def is_defined(self) -> bool:
        """True when the cache holds at least one entry (Kafka's nonEmpty)."""
        return bool(self._entries)

    def latest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    def latest_epoch(self) -> int | None:
        entry = self.latest_entry()
        return entry.epoch if entry is not None else None

    def earliest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def previous_epoch(self, epoch: int | None = None) -> int | None:
        """The largest epoch below ``epoch`` (default: below the latest epoch)."""
        entry = self.previous_entry(epoch)
        return entry.epoch if entry is not None else None

    def previous_entry(self, epoch: int | None = None) -> EpochEntry | None:
        """The entry of the largest epoch below ``epoch`` (default: below the latest epoch)."""
        with self._lock:
            if epoch is None:
                if not self._entries:
                    return None
                epoch = self._entries[-1].epoch
            i = bisect.bisect_left(self._epochs, epoch)
            return self._entries[i - 1] if i > 0 else None

    def next_epoch(self, epoch: int) -> int | None:
        """The smallest epoch above ``epoch``."""
        with self._lock:
            i = bisect.bisect_right(self._epochs, epoch)
            return self._epochs[i] if i < len(self._epochs) else None

    def epoch_entry(self, epoch: int) -> EpochEntry | None:
        with self._lock:
            i = bisect.bisect_left(self._epochs, epoch)
            if i < len(self._epochs) and self._epochs[i] == epoch:
                return self._entries[i]
            return None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch the record at ``offset`` belongs to, or None if it predates every entry."""
        with self._lock:
            previous = None
            for epoch, start in self._entries:
                if start == offset:
                    return epoch
                if start > offset:
                    return previous
                previous = epoch
            return previous

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> OffsetAndEpoch:
        """Kafka's OffsetsForLeaderEpoch answer for ``requested_epoch``.

        Returns the largest known epoch <= ``requested_epoch`` and the start offset of the first
        epoch above it (``log_end_offset`` for the latest epoch). A requested epoch below every
        known epoch is echoed back with the first epoch's start offset. ``UNDEFINED_EPOCH`` /
        ``UNDEFINED_EPOCH_OFFSET`` when the epoch is undefined or above every known epoch.
        """
        undefined = OffsetAndEpoch(UNDEFINED_EPOCH_OFFSET, UNDEFINED_EPOCH)
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH:
                return undefined
            if self._entries and self._entries[-1].epoch == requested_epoch:
                return OffsetAndEpoch(log_end_offset, requested_epoch)
            higher = bisect.bisect_right(self._epochs, requested_epoch)
            if higher >= len(self._entries):
                return undefined
            higher_start = self._entries[higher].start_offset
            if higher == 0:
                return OffsetAndEpoch(higher_start, requested_epoch)
            return OffsetAndEpoch(higher_start, self._entries[higher - 1].epoch)

    def epoch_entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    def epoch_entries_in_range(self, start_offset: int, end_offset: int) -> list[EpochEntry]:
        """The history of ``[start_offset, end_offset)``: a copy truncated from the start at
        ``start_offset`` (when >= 0) and from the end at ``end_offset``."""
        with self._lock:
            copy = list(self._entries)
        if start_offset >= 0:
            _truncate_from_start(copy, start_offset)
        _truncate_from_end(copy, end_offset)
        return copy

    def entries_up_to(self, end_offset: int) -> list[EpochEntry]:
        """A copy truncated from the end at ``end_offset`` (a segment's epoch checkpoint)."""
        with self._lock:
            copy = list(self._entries)
        _truncate_from_end(copy, end_offset)
        return copy

    def __repr__(self) -> str:
        return f"LeaderEpochFileCache({self._tp}, {self._entries})"
