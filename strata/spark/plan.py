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

import bisect
import heapq
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from strata.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, StrataOptionError
from strata.tiered.api import RemoteLogSegmentMetadata

__all__ = [
    "OffsetRange", "ReadPiece", "ReadTask", "TopicPartitionKey", "offset_ranges",
    "offsets_from_json", "offsets_to_json", "plan_tasks", "rate_limit", "resolve_offsets",
    "resolve_partitions", "split_segment",
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
class ReadPiece:
    """Offsets ``[start, end)`` of a task's topic-partition read from the remote ``segment``
    straight from the object store, or through the broker's Fetch API when ``segment`` is
    None."""

    start: int
    end: int
    segment: RemoteLogSegmentMetadata | None = None

    def where(self) -> str:
        return ("fetch" if self.segment is None
                else f"remote segment {self.segment.remote_log_segment_id.id}")


@dataclass(frozen=True)
class ReadTask:
    """One Spark input partition: offsets ``[start, end)`` of a topic-partition, read piece by
    piece in offset order (``pieces``: consecutive, covering ``[start, end)``; each from one
    remote segment or through Fetch). No pieces: the whole range through Fetch. Picklable (it
    travels to the executors)."""

    topic: str
    partition: int
    start: int
    end: int
    pieces: tuple[ReadPiece, ...] = ()

    def parts(self) -> tuple[ReadPiece, ...]:
        """The pieces to read, in order (one Fetch piece when the task has none)."""
        return self.pieces or (ReadPiece(self.start, self.end),)

    @property
    def remote(self) -> bool:
        """Whether any of it is read from remote segments."""
        return any(p.segment is not None for p in self.pieces)

    @property
    def segments(self) -> tuple[RemoteLogSegmentMetadata, ...]:
        """The remote segments it reads, in offset order (a segment split across pieces once)."""
        out: list[RemoteLogSegmentMetadata] = []
        for p in self.pieces:
            if p.segment is not None and (not out or out[-1].remote_log_segment_id
                                          != p.segment.remote_log_segment_id):
                out.append(p.segment)
        return tuple(out)

    def describe(self, piece: ReadPiece | None = None) -> str:
        """The task (or one of its pieces) for messages: where its offsets are read from."""
        if piece is not None:
            return f"{self.topic}-{self.partition} [{piece.start}, {piece.end}) via {piece.where()}"
        parts = self.parts()
        remote = sum(p.segment is not None for p in parts)
        where = (parts[0].where() if len(parts) == 1
                 else f"{remote} remote segment piece(s) and {len(parts) - remote} fetch range(s)")
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
    latest offset, or a start past the end, is an error, as in Spark. Each topic's earliest
    and latest offsets are asked for once, so every check sees the same answer."""
    client = _EndsOnce(client)
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


class _EndsOnce:
    """``client`` answering each (topic, partitions, earliest or latest) ListOffsets once."""

    def __init__(self, client: OffsetClient) -> None:
        self._client = client
        self._ends: dict[tuple[str, tuple[int, ...], int], dict[int, int]] = {}

    def topics(self, names: list[str] | None = None) -> Mapping[str, object]:
        return self._client.topics(names)

    def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        if timestamp not in (EARLIEST, LATEST):
            return self._client.list_offsets(topic, partitions, timestamp)
        key = (topic, tuple(sorted(partitions)), timestamp)
        found = self._ends.get(key)
        if found is None:
            found = self._ends[key] = self._client.list_offsets(topic, partitions, timestamp)
        return found


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


def _split_by_count(start: int, end: int, max_records: int) -> Iterable[ReadPiece]:
    for s in range(start, end, max_records):
        yield ReadPiece(s, min(end, s + max_records))


def _remote_pieces(r: OffsetRange, metas: Sequence[RemoteLogSegmentMetadata],
                   positions: Positions | None, max_bytes: int,
                   max_records: int) -> list[ReadPiece]:
    """``r`` as pieces in offset order: each remote segment overlapping it (``split_segment``
    pieces when larger than ``max_bytes``), and the offsets no segment covers -- the local
    tail, gaps -- through Fetch, cut every ``max_records`` offsets."""
    pieces: list[ReadPiece] = []
    cursor = r.start
    for meta in metas:
        seg_start, seg_end = meta.start_offset, meta.end_offset + 1
        if seg_end <= cursor or seg_start >= r.end:
            continue
        if seg_start > cursor:
            pieces.extend(_split_by_count(cursor, seg_start, max_records))
        bounds = ([(seg_start, seg_end)]
                  if meta.segment_size_in_bytes <= max_bytes or positions is None
                  else split_segment(meta, positions(meta), max_bytes))
        for a, b in bounds:
            a, b = max(a, cursor), min(b, r.end)
            if a < b:
                pieces.append(ReadPiece(a, b, meta))
        cursor = max(cursor, min(seg_end, r.end))
        if cursor >= r.end:
            break
    if cursor < r.end:
        pieces.extend(_split_by_count(cursor, r.end, max_records))
    return pieces


def _piece_bytes(piece: ReadPiece, bytes_per_offset: float | None, max_bytes: int,
                 max_records: int) -> float:
    """About how many bytes ``piece`` reads, for grouping: its share of its segment; for a
    Fetch piece its offsets at the remote segments' bytes per offset, but at least its share
    of ``max_records`` offsets times ``max_bytes`` (so that an input partition reads about
    ``max_records`` offsets through Fetch at most), and a whole ``max_bytes`` when the rate is
    unknown (Fetch pieces are not grouped blindly)."""
    meta = piece.segment
    if meta is not None:
        span = max(1, meta.end_offset + 1 - meta.start_offset)
        return max(1.0, meta.segment_size_in_bytes * (piece.end - piece.start) / span)
    if bytes_per_offset is None:
        return float(max_bytes)
    count = piece.end - piece.start
    return max(1.0, bytes_per_offset * count, max_bytes * count / max_records)


def _weights(pieces: Sequence[ReadPiece], max_bytes: int, max_records: int) -> list[float]:
    """About how many bytes each piece reads (``_piece_bytes``; Fetch pieces at the bytes per
    offset of the remote segments among ``pieces``)."""
    used = {p.segment.remote_log_segment_id.id: p.segment for p in pieces if p.segment is not None}
    span = sum(m.end_offset + 1 - m.start_offset for m in used.values())
    rate = sum(m.segment_size_in_bytes for m in used.values()) / span if span else None
    return [_piece_bytes(p, rate, max_bytes, max_records) for p in pieces]


def _group(weights: Sequence[float], max_bytes: int) -> list[range]:
    """Consecutive runs of pieces (by index) of about equal total weight, as few as keep each
    at about ``max_bytes`` or less: the cuts fall on the piece boundaries nearest to equal
    shares."""
    total = sum(weights)
    runs = max(1, min(len(weights), math.ceil(total / max_bytes)))
    prefix = list(itertools.accumulate(weights, initial=0.0))
    cuts = [0]
    for i in range(1, runs):
        target = total * i / runs
        j = bisect.bisect_left(prefix, target, lo=cuts[-1] + 1, hi=len(weights))
        if j > cuts[-1] + 1 and target - prefix[j - 1] < prefix[j] - target:
            j -= 1
        if cuts[-1] < j < len(weights):
            cuts.append(j)
    cuts.append(len(weights))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def _task(r: OffsetRange, pieces: Sequence[ReadPiece], direct: bool) -> ReadTask:
    return ReadTask(r.topic, r.partition, pieces[0].start, pieces[-1].end,
                    tuple(pieces) if direct else ())


def plan_tasks(ranges: Iterable[OffsetRange], *,
               segments: Mapping[TopicPartitionKey, Sequence[RemoteLogSegmentMetadata]] | None = None,
               positions: Positions | None = None,
               max_bytes_per_partition: int, max_records_per_partition: int,
               min_partitions: int | None = None) -> list[ReadTask]:
    """Input partitions for ``ranges``, in range order then offset order.

    With ``segments`` (direct mode) each range becomes pieces: every remote segment
    overlapping it (cut at offset-index entries when larger than ``max_bytes_per_partition``;
    ``positions`` gives a segment's index, fetched only when it is cut), and the rest -- the
    local tail, any gap the remote tier does not cover -- through Fetch. Consecutive pieces
    are then grouped into input partitions of about equal size, as few as keep each at about
    ``max_bytes_per_partition`` or less: a topic-partition smaller than that is one input
    partition, its local tail included (every input partition costs a Spark task and a
    Python worker round trip, so fewer, larger ones read faster). Without ``segments``
    (broker mode) everything goes through Fetch. Fetch ranges are cut every
    ``max_records_per_partition`` offsets.

    ``min_partitions`` (Spark's Kafka ``minPartitions``): while there are fewer input
    partitions, the largest is cut in two -- between its pieces, else a remote segment at the
    offset-index entry nearest its middle, else a Fetch range at its middle offset.
    """
    planned: list[tuple[int, ReadTask, float]] = []     # (range number, task, weight)
    direct = segments is not None
    for n, r in enumerate(ranges):
        if not direct:
            for piece in _split_by_count(r.start, r.end, max_records_per_partition):
                planned.append((n, _task(r, [piece], False), float(piece.end - piece.start)))
            continue
        metas = segments.get((r.topic, r.partition), ())
        pieces = _remote_pieces(r, metas, positions, max_bytes_per_partition,
                                max_records_per_partition)
        weights = _weights(pieces, max_bytes_per_partition, max_records_per_partition)
        for run in _group(weights, max_bytes_per_partition):
            planned.append((n, _task(r, [pieces[i] for i in run], True),
                            sum(weights[i] for i in run)))
    if min_partitions is not None and len(planned) < min_partitions:
        planned = _split_to(planned, min_partitions, positions, direct)
    planned.sort(key=lambda x: (x[0], x[1].start))
    return [t for _, t, _ in planned]


def _split_to(planned: list[tuple[int, ReadTask, float]], count: int,
              positions: Positions | None, direct: bool) -> list[tuple[int, ReadTask, float]]:
    """Cut the largest task in two until there are ``count`` (or nothing can be cut)."""
    heap = [(-item[2], i, item) for i, item in enumerate(planned)]
    heapq.heapify(heap)
    done: list[tuple[int, ReadTask, float]] = []
    seq = len(planned)
    while heap and len(heap) + len(done) < count:
        _, _, item = heapq.heappop(heap)
        halves = _halve(item, positions, direct)
        if halves is None:
            done.append(item)
            continue
        for half in halves:
            heapq.heappush(heap, (-half[2], seq, half))
            seq += 1
    return done + [item for _, _, item in heap]


def _halve(item: tuple[int, ReadTask, float], positions: Positions | None,
           direct: bool) -> tuple[tuple[int, ReadTask, float], ...] | None:
    n, task, weight = item
    r = OffsetRange(task.topic, task.partition, task.start, task.end)
    pieces = list(task.parts())
    if len(pieces) > 1:
        weights = _weights(pieces, 1, 2**62)
        prefix = list(itertools.accumulate(weights))
        total = prefix[-1]
        best = min(range(1, len(pieces)), key=lambda j: abs(prefix[j - 1] - total / 2))
        share = prefix[best - 1] / total
        return ((n, _task(r, pieces[:best], direct), weight * share),
                (n, _task(r, pieces[best:], direct), weight * (1 - share)))
    piece = pieces[0]
    if piece.segment is not None and positions is not None:
        at = _middle_entry(piece, positions(piece.segment))
        if at is None:
            return None
        share = (at - piece.start) / (piece.end - piece.start)
        return ((n, _task(r, [ReadPiece(piece.start, at, piece.segment)], direct), weight * share),
                (n, _task(r, [ReadPiece(at, piece.end, piece.segment)], direct),
                 weight * (1 - share)))
    if piece.segment is None and piece.end - piece.start >= 2:
        mid = piece.start + (piece.end - piece.start) // 2
        return ((n, _task(r, [ReadPiece(piece.start, mid)], direct), weight / 2),
                (n, _task(r, [ReadPiece(mid, piece.end)], direct), weight / 2))
    return None


def _middle_entry(piece: ReadPiece, entries: Sequence[tuple[int, int]]) -> int | None:
    """An offset strictly inside ``piece`` where a batch starts per the segment's offset index
    (an entry ``(o, pos)``: the batch at ``pos`` ends at ``o``, so one starts at ``o + 1``),
    the one nearest the middle of the piece's indexed bytes; None when there is none."""
    inside = sorted((pos, o + 1) for o, pos in entries if piece.start < o + 1 < piece.end)
    if not inside:
        return None
    mid = (inside[0][0] + inside[-1][0]) / 2
    return min(inside, key=lambda e: abs(e[0] - mid))[1]


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
