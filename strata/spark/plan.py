"""Planning a read of Strata topics: which topic-partitions, which offsets, and how the
offset ranges are cut into Spark input partitions.

Runs on the driver (in the Python planner worker Spark starts for a data source). The only
I/O is through the ``client`` and ``positions`` arguments (a ``BrokerClient`` and a
``RemoteSegmentReader.offset_positions`` in production), so everything here is testable with
fakes and segment lists built by hand.

Offsets are half-open: a range ``[start, end)`` reads offsets ``start <= o < end``. A remote
segment's ``start_offset``/``end_offset`` are both inclusive, as Kafka's are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from strata.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, StrataOptionError
from strata.tiered.api import RemoteLogSegmentMetadata

__all__ = [
    "OffsetRange", "ReadTask", "TopicPartitionKey", "offset_ranges", "offsets_from_json",
    "offsets_to_json", "plan_tasks", "rate_limit", "resolve_offsets", "resolve_partitions",
    "split_segment",
]

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
Positions = Callable[[RemoteLogSegmentMetadata], Sequence[tuple[int, int]]]


class OffsetClient(Protocol):
    """What planning needs from the broker (``BrokerClient`` provides it)."""

    def topics(self, names: list[str] | None = None) -> Mapping[str, object]: ...

    def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]: ...


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class ReadTask:
    """One Spark input partition: offsets ``[start, end)`` of a topic-partition, read from the
    remote ``segment`` straight from the object store, or through the broker's Fetch API when
    ``segment`` is None. Picklable (it travels to the executors)."""

    topic: str
    partition: int
    start: int
    end: int
    segment: RemoteLogSegmentMetadata | None = None

    @property
    def remote(self) -> bool:
        return self.segment is not None

    def describe(self) -> str:
        where = (f"remote segment {self.segment.remote_log_segment_id.id}"
                 if self.segment is not None else "fetch")
        return f"{self.topic}-{self.partition} [{self.start}, {self.end}) via {where}"


def _data_loss(message: str) -> Exception:
    from strata.spark.broker_client import DataLossError
    return DataLossError(message + ". Some data may have been lost because it is not available "
                         "any more; set failOnDataLoss=false to skip it instead of failing")


# ---- topics and offsets ---------------------------------------------------------------------------

def resolve_partitions(opts: SourceOptions, client: OffsetClient) -> dict[str, list[int]]:
    """{topic: sorted partitions} the read covers. Subscribed topics that do not exist are
    errors (a batch read of nothing is a typo more often than not); a pattern may match none."""
    if opts.subscribe_pattern is not None:
        infos = client.topics(None)
        return {t: list(range(_partition_count(i))) for t, i in sorted(infos.items())
                if opts.topic_matches(t)}
    names = list(opts.assign) if opts.assign is not None else list(opts.subscribe)
    infos = client.topics(names)
    missing = [t for t in names if t not in infos]
    if missing:
        raise StrataOptionError(f"Topic(s) {', '.join(missing)} do not exist on "
                                f"{opts.bootstrap_servers}")
    if opts.assign is None:
        return {t: list(range(_partition_count(infos[t]))) for t in names}
    out: dict[str, list[int]] = {}
    for t, parts in opts.assign.items():
        count = _partition_count(infos[t])
        bad = [p for p in parts if p >= count]
        if bad:
            raise StrataOptionError(f"Option 'assign': {t} has {count} partition(s), no "
                                    f"partition {bad[0]}")
        out[t] = list(parts)
    return out


def _partition_count(info: object) -> int:
    return int(getattr(info, "partitions"))


def _check_covered(spec: OffsetSpec, partitions: Mapping[str, Sequence[int]], name: str) -> None:
    """Spark's rule: per-partition JSON names every partition the read covers."""
    wanted = {(t, p) for t, ps in partitions.items() for p in ps}
    given = {(t, p) for t, ps in spec.per_partition.items() for p in ps}
    if given != wanted:
        fmt = lambda s: ", ".join(f"{t}-{p}" for t, p in sorted(s)) or "none"  # noqa: E731
        raise StrataOptionError(f"Option '{name}' must specify all topic-partitions of the read: "
                                f"specified {fmt(given)}; assigned {fmt(wanted)}")


def resolve_offsets(spec: OffsetSpec, partitions: Mapping[str, Sequence[int]],
                    client: OffsetClient, *, starting: bool,
                    start_timestamp_strategy: str = "error") -> dict[TopicPartitionKey, int]:
    """Concrete offsets for ``spec`` over ``partitions`` (ListOffsets for earliest, latest
    and timestamps). A starting timestamp no record reaches is an error, or the latest offset
    with ``start_timestamp_strategy="latest"``; an ending one means the latest offset."""
    role = "starting" if starting else "ending"
    if spec.kind in ("offsets", "timestamps"):
        _check_covered(spec, partitions, f"{role}Offsets" if spec.kind == "offsets"
                       else f"{role}OffsetsByTimestamp")
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in partitions.items():
        if not parts:
            continue
        if spec.kind in ("earliest", "latest"):
            found = client.list_offsets(topic, list(parts),
                                        EARLIEST if spec.kind == "earliest" else LATEST)
            out.update({(topic, p): found[p] for p in parts})
            continue
        if spec.kind == "offsets":
            wanted = spec.per_partition[topic]
            special = {w for w in (EARLIEST, LATEST) if w in wanted.values()}
            resolved = {w: client.list_offsets(topic, list(parts), w) for w in special}
            for p in parts:
                off = wanted[p]
                out[(topic, p)] = resolved[off][p] if off in resolved else off
            continue
        # by timestamp: one ListOffsets per distinct timestamp
        by_ts: dict[int, list[int]] = {}
        for p in parts:
            ts = spec.timestamp if spec.kind == "timestamp" else spec.per_partition[topic][p]
            by_ts.setdefault(int(ts), []).append(p)
        latest: dict[int, int] | None = None
        for ts, ps in by_ts.items():
            found = client.list_offsets(topic, ps, ts)
            for p in ps:
                off = found[p]
                if off < 0:
                    if starting and start_timestamp_strategy == "error":
                        raise StrataOptionError(
                            f"No offset matched from request of topic-partition {topic}-{p} and "
                            f"timestamp {ts} (no record is that recent); set "
                            "startingOffsetsByTimestampStrategy=latest to start at the latest "
                            "offset instead")
                    if latest is None:
                        latest = client.list_offsets(topic, list(parts), LATEST)
                    off = latest[p]
                out[(topic, p)] = off
    return out


def offset_ranges(opts: SourceOptions, client: OffsetClient) -> list[OffsetRange]:
    """The batch read's ranges: one per topic-partition, from the starting to the ending
    offsets, empty ranges dropped. Offsets below the log start offset are data loss (an error,
    or with failOnDataLoss=false the range starts at the log start offset); an end beyond the
    latest offset, or a start past the end, is an error, as in Spark."""
    partitions = resolve_partitions(opts, client)
    start = resolve_offsets(opts.starting, partitions, client, starting=True,
                            start_timestamp_strategy=opts.start_timestamp_strategy)
    end = resolve_offsets(opts.ending, partitions, client, starting=False)
    out: list[OffsetRange] = []
    for topic, parts in partitions.items():
        if not parts:
            continue
        log_start = client.list_offsets(topic, parts, EARLIEST)
        latest = client.list_offsets(topic, parts, LATEST)
        for p in parts:
            s, e = start[(topic, p)], end[(topic, p)]
            if e > latest[p]:
                raise StrataOptionError(f"Ending offset {e} of {topic}-{p} is beyond its latest "
                                        f"offset {latest[p]}")
            s = clamp_to_log_start(topic, p, s, log_start[p], opts.fail_on_data_loss)
            if s > e:
                if opts.starting.kind == "offsets" or opts.ending.kind == "offsets":
                    raise StrataOptionError(f"Starting offset {s} of {topic}-{p} is after its "
                                            f"ending offset {e}")
                s = e  # timestamps (or a clamp) past the end: nothing to read
            if s < e:
                out.append(OffsetRange(topic, p, s, e))
    return out


def clamp_to_log_start(topic: str, partition: int, start: int, log_start: int,
                       fail_on_data_loss: bool) -> int:
    """``start``, or the log start offset when ``start`` is below it (data loss: an error
    unless ``fail_on_data_loss`` is false, then a warning)."""
    if start >= log_start:
        return start
    message = (f"Offsets [{start}, {log_start}) of {topic}-{partition} are gone: its log start "
               f"offset is {log_start}")
    if fail_on_data_loss:
        raise _data_loss(message)
    log.warning("%s; reading from %d (failOnDataLoss=false)", message, log_start)
    return log_start


# ---- cutting ranges into input partitions ---------------------------------------------------------

def split_segment(meta: RemoteLogSegmentMetadata, positions: Sequence[tuple[int, int]],
                  max_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` pieces covering the whole segment, each spanning at most about
    ``max_bytes`` of it, cut at offset-index entries ``(offset, byte position)`` (a piece is
    larger only when one indexed step already is)."""
    seg_end = meta.end_offset + 1
    if meta.segment_size_in_bytes <= max_bytes:
        return [(meta.start_offset, seg_end)]
    entries = sorted((o, pos) for o, pos in positions if meta.start_offset < o < seg_end)
    cuts: list[int] = []
    piece_pos = 0                         # byte position where the current piece starts
    last: tuple[int, int] | None = None   # the last entry inside the current piece
    for off, pos in entries:
        if pos - piece_pos > max_bytes:
            if last is not None:          # cut at the last entry that still fit
                cuts.append(last[0])
                piece_pos, last = last[1], None
            if pos - piece_pos > max_bytes:   # one indexed step alone is too big: cut here too
                cuts.append(off)
                piece_pos = pos
                continue
        last = (off, pos)
    if meta.segment_size_in_bytes - piece_pos > max_bytes and last is not None:
        cuts.append(last[0])
    bounds = [meta.start_offset, *cuts, seg_end]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def _split_by_count(r: OffsetRange, max_records: int) -> Iterable[ReadTask]:
    for s in range(r.start, r.end, max_records):
        yield ReadTask(r.topic, r.partition, s, min(r.end, s + max_records))


def plan_tasks(ranges: Iterable[OffsetRange], *,
               segments: Mapping[TopicPartitionKey, Sequence[RemoteLogSegmentMetadata]] | None = None,
               positions: Positions | None = None,
               max_bytes_per_partition: int, max_records_per_partition: int) -> list[ReadTask]:
    """Input partitions for ``ranges``. With ``segments`` (direct mode): one task per remote
    segment overlapping a range (``split_segment`` pieces when the segment is larger than
    ``max_bytes_per_partition``; ``positions`` gives its offset index, fetched only then),
    and the rest of the range -- the local tail, and any gap the remote tier does not cover --
    through Fetch. Without ``segments`` (broker mode) everything goes through Fetch. Fetch
    ranges are cut every ``max_records_per_partition`` offsets."""
    tasks: list[ReadTask] = []
    for r in ranges:
        cursor = r.start
        for meta in (segments or {}).get((r.topic, r.partition), ()):
            seg_start, seg_end = meta.start_offset, meta.end_offset + 1
            if seg_end <= cursor or seg_start >= r.end:
                continue
            if seg_start > cursor:
                tasks.extend(_split_by_count(OffsetRange(r.topic, r.partition, cursor, seg_start),
                                             max_records_per_partition))
            pieces = ([(seg_start, seg_end)]
                      if meta.segment_size_in_bytes <= max_bytes_per_partition or positions is None
                      else split_segment(meta, positions(meta), max_bytes_per_partition))
            for a, b in pieces:
                a, b = max(a, cursor), min(b, r.end)
                if a < b:
                    tasks.append(ReadTask(r.topic, r.partition, a, b, meta))
            cursor = max(cursor, min(seg_end, r.end))
            if cursor >= r.end:
                break
        if cursor < r.end:
            tasks.extend(_split_by_count(OffsetRange(r.topic, r.partition, cursor, r.end),
                                         max_records_per_partition))
    return tasks


# ---- streaming offsets ----------------------------------------------------------------------------

def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """{"topic": {"partition": offset}} with topics and partitions in order, so equal offsets
    always serialise to the same JSON (Spark compares offsets by their JSON)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, p), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = int(off)
    return out


def offsets_from_json(doc: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(topic, int(p)): int(off) for topic, parts in doc.items() for p, off in parts.items()}


def rate_limit(start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int],
               limit: int) -> dict[TopicPartitionKey, int]:
    """End offsets that advance at most ``limit`` offsets in total past ``start``, shared out
    in proportion to each partition's backlog (a partition with any backlog gets at least one,
    so small partitions are not starved). A partition absent from ``start`` has no backlog:
    give new partitions their first offset in ``start``."""
    backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    out: dict[TopicPartitionKey, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = limit * backlog[tp] / total
        step = int(share) if share >= 1 else (1 if backlog[tp] else 0)
        out[tp] = min(end, begin + step)
    return out
