"""The remote tier without the broker: which remote segments a topic has, and their bytes.

- ``remote_segments`` reads the ``__remote_log_metadata`` partitions a topic maps to through
  Fetch and replays them into a ``RemotePartitionMetadataStore``, as the broker's topic-based
  metadata manager does at start, then lists each partition's readable segments.
- ``rsm_props_from_options`` turns a Spark user's options (broker-style keys, or the path of
  the broker's ``server.properties``) into the properties that build the broker's
  RemoteStorageManager.
- ``RemoteSegmentReader`` builds that RemoteStorageManager inside a Spark executor and streams
  a segment's record batches from it: seek with the segment's offset index, then read in
  pieces cut at batch boundaries (``views``: into one reused buffer), asking the RSM to load
  what follows meanwhile, and the next segment's first chunks too (``prefetch``). Its
  RemoteStorageManager is never pickled (it holds threads, caches and store clients); only
  the properties travel to executors.
"""

from __future__ import annotations

import logging
import struct
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from strata.common.config import load_properties
from strata.common.errors import ErrorCode
from strata.common.scheduler import BackgroundThread
from strata.common.types import uuid_to_kafka_str
from strata.protocol.client import EARLIEST, LATEST
from strata.protocol.records import (
    CONTROL_MASK, HEADER_SIZE, LOG_OVERHEAD, decode_batch, iter_headers)
from strata.spark.broker_client import (
    BrokerClient, BrokerRequestError, DataLossError, TopicInfo, whole_batches)
from strata.tiered.api import (
    IndexType, RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteResourceNotFoundException,
    RemoteStorageException, RemoteStorageManager, TopicIdPartition, TopicPartition)
from strata.tiered.config import (
    DEFAULT_REMOTE_STORAGE_MANAGER_CLASS_NAME, DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX,
    REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP, REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP,
    REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP, RemoteLogManagerConfig, load_plugin)
from strata.tiered.metadata.cache import RemotePartitionMetadataStore
from strata.tiered.metadata.serde import deserialize, metadata_partition
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME

__all__ = [
    "RemoteSegmentReader",
    "SERVER_PROPERTIES_OPTION",
    "remote_segments",
    "replay_remote_log_metadata",
    "rsm_props_from_options",
    "segment_read_ranges",
]

log = logging.getLogger(__name__)

SERVER_PROPERTIES_OPTION = "strata.server.properties"
# RSM keys of a broker's server.properties left out when Spark builds the RSM from it: the
# chunk cache's disk tier is the broker's own directory, whose files a second cache would
# delete at its start.
_BROKER_ONLY_RSM_KEYS = ("chunk.cache.disk.",)

_LENGTH = struct.Struct(">i")
# What a reader fetches from the remote segment at a time, cut back to whole batches.
READ_PIECE_BYTES = 8 << 20
# Offset indexes of this many segments are kept by a reader (~1 KiB each for 1 MiB segments).
_INDEX_CACHE_SEGMENTS = 256


# ---- the remote log metadata ----------------------------------------------------------------------

def remote_segments(client: BrokerClient, topic: str) -> dict[int, list[RemoteLogSegmentMetadata]]:
    """Each partition of ``topic`` (every partition a key) to its readable remote segments in
    offset order: COPY_SEGMENT_FINISHED segments of the current leader-epoch lineage, read
    from ``__remote_log_metadata`` through Fetch and replayed as the broker's metadata
    manager replays it (events it would refuse are skipped). A copy superseded by a later
    upload of the same offsets (a new leader re-copying) is left out, and so is a segment
    outside the partition leader's epoch lineage (``within_leader_lineage``: an old leader's
    records that an unclean election or a lost tail took out of the log, which Kafka's
    expirer leaves to retention): those offsets are the leader's to serve.

    Raises BrokerRequestError (UNKNOWN_TOPIC_OR_PARTITION) for an unknown topic.
    """
    info = client.topics([topic]).get(topic)
    if info is None:
        raise BrokerRequestError(f"topic {topic}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    store = replay_remote_log_metadata(client, [info])
    finished = {p: _finished(store, TopicIdPartition(info.topic_id, TopicPartition(topic, p)))
                for p in range(info.partitions)}
    asks = sorted({(p, e) for p, metas in finished.items() for m in metas
                   for e in m.segment_leader_epochs})
    ends = client.epoch_end_offsets(topic, asks) if asks else {}
    return {p: _current_lineage([m for m in metas if within_leader_lineage(m, p, ends)])
            for p, metas in finished.items()}


def within_leader_lineage(meta: RemoteLogSegmentMetadata, partition: int,
                          ends: Mapping[tuple[int, int], tuple[int, int]]) -> bool:
    """Whether the leader's log holds the segment's records: each epoch of the segment is
    one of the leader's, and ends in its log where the segment's next epoch starts (the last
    one: after the segment's end). ``ends``: OffsetForLeaderEpoch's answers by (partition,
    epoch), as ``BrokerClient.epoch_end_offsets`` gives them."""
    epochs = sorted(meta.segment_leader_epochs.items())
    for i, (epoch, _) in enumerate(epochs):
        found, end = ends.get((partition, epoch), (-1, -1))
        if found != epoch:
            return False
        if i + 1 < len(epochs):
            if end != epochs[i + 1][1]:
                return False
        elif end <= meta.end_offset:
            return False
    return True


def replay_remote_log_metadata(client: BrokerClient,
                               topics: Iterable[TopicInfo]) -> RemotePartitionMetadataStore:
    """The remote log metadata of ``topics``: the ``__remote_log_metadata`` partitions they
    map to, read through Fetch and replayed into a store as the broker's topic-based
    metadata manager replays them at start (events it would refuse are skipped; events of
    other topics are not applied). Empty when the cluster never tiered anything."""
    topics = list(topics)
    store = RemotePartitionMetadataStore()
    meta_topic = client.topics([REMOTE_LOG_METADATA_TOPIC_NAME]).get(REMOTE_LOG_METADATA_TOPIC_NAME)
    if meta_topic is None or meta_topic.partitions == 0 or not topics:
        return store
    ids = {t.topic_id for t in topics}
    wanted = sorted({metadata_partition(t.topic_id, p, meta_topic.partitions)
                     for t in topics for p in range(t.partitions)})
    starts = client.list_offsets(REMOTE_LOG_METADATA_TOPIC_NAME, wanted, EARLIEST)
    ends = client.list_offsets(REMOTE_LOG_METADATA_TOPIC_NAME, wanted, LATEST)
    skipped = 0
    for mp in wanted:
        start, end = starts[mp], ends[mp]
        if start > 0:
            log.warning("%s-%d starts at offset %d: events deleted before it are not replayed",
                        REMOTE_LOG_METADATA_TOPIC_NAME, mp, start)
        for chunk in client.read_range(REMOTE_LOG_METADATA_TOPIC_NAME, mp, start, end):
            skipped += _replay(chunk, start, end, ids, store)
    if skipped:
        log.info("skipped %d remote log metadata event(s) the broker would refuse too", skipped)
    return store


def _replay(chunk: bytes, start: int, end: int, topic_ids: set[uuid.UUID],
            store: RemotePartitionMetadataStore) -> int:
    """Apply the events of the topics ``topic_ids`` in ``chunk``; the number skipped."""
    skipped = 0
    for header in iter_headers(chunk):
        if header.attributes & CONTROL_MASK:
            continue
        for record in decode_batch(chunk, header, check_crc=True):
            if not start <= record.offset < end or record.value is None:
                continue
            try:
                event = deserialize(record.value)
                if event.topic_id_partition.topic_id not in topic_ids:
                    continue
                store.handle(event)
            except (ValueError, TypeError, RemoteStorageException) as exc:
                skipped += 1
                log.debug("%s offset %d: %s", REMOTE_LOG_METADATA_TOPIC_NAME, record.offset, exc)
    return skipped


def _finished(store: RemotePartitionMetadataStore,
              tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
    """The finished segments some leader epoch still refers to."""
    cache = store.cache_copy(tip)
    if cache is None:
        return []
    referenced = {seg_id for state in cache.epochs.values() for seg_id in state.offset_to_id.values()}
    return [cache.segments[i] for i in referenced
            if cache.segments[i].state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED]


def _current_lineage(finished: list[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """``finished`` by start offset; where two overlap, the one reaching further (then of the
    later epoch) wins the offsets both hold, and an older one is kept only for offsets
    nothing newer covers."""
    finished = list(finished)
    finished.sort(key=lambda m: (m.end_offset, max(m.segment_leader_epochs), m.event_timestamp_ms),
                  reverse=True)
    chosen: list[RemoteLogSegmentMetadata] = []
    floor: int | None = None       # the lowest start offset chosen so far
    for m in finished:
        if floor is None or m.start_offset < floor:
            chosen.append(m)
            floor = m.start_offset
    chosen.sort(key=lambda m: (m.start_offset, m.end_offset))
    return chosen


def segment_read_ranges(segments: list[RemoteLogSegmentMetadata]
                        ) -> list[tuple[RemoteLogSegmentMetadata, int, int]]:
    """``(segment, start, end)`` with ``[start, end)`` the offsets to read from each segment
    of a ``remote_segments`` list: its whole range, cut short where a later segment (which
    ``remote_segments`` preferred) begins inside it."""
    out = []
    for i, m in enumerate(segments):
        end = m.end_offset + 1
        if i + 1 < len(segments):
            end = min(end, segments[i + 1].start_offset)
        if end > m.start_offset:
            out.append((m, m.start_offset, end))
    return out


# ---- the RemoteStorageManager's properties ---------------------------------------------------------

def rsm_props_from_options(options: Mapping[str, str]) -> dict[str, str] | None:
    """The RemoteStorageManager's broker-style properties from a Spark user's options, or
    None when the options configure no remote tier.

    Options (keys case-insensitive, as Spark passes them lower-cased):
    ``remote.log.storage.manager.class.name`` / ``.class.path``,
    ``remote.log.storage.manager.impl.prefix`` (default ``rsm.config.``) and the keys under
    that prefix; or ``strata.server.properties``: the path of the broker's server.properties,
    whose tiered keys are read as the broker reads them (``storage.url`` defaulted from its
    ``log.dirs`` as the broker defaults it; its chunk-cache disk tier left out: that
    directory is the broker's). Options win over the file.

    The result: ``remote.log.storage.manager.class.name`` (always), ``...class.path`` (when
    set) and the RSM's own keys under ``rsm.config.``; plain strings, safe to pickle.
    """
    lowered = {str(k).lower(): (str(k), str(v)) for k, v in options.items()}
    props: dict[str, str] = {}
    configured = False
    path = lowered.get(SERVER_PROPERTIES_OPTION)
    if path is not None:
        from_file = _from_server_properties(Path(path[1]).expanduser())
        if from_file is not None:
            props.update(from_file)
            configured = True
    for key in (REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP, REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP):
        if key in lowered and lowered[key][1].strip():
            props[key] = lowered[key][1].strip()
            configured = True
    prefix_entry = lowered.get(REMOTE_STORAGE_MANAGER_CONFIG_PREFIX_PROP)
    prefix = (prefix_entry[1] if prefix_entry else DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX)
    for low, (original, value) in lowered.items():
        if low.startswith(prefix.lower()) and len(low) > len(prefix):
            props[DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX + original[len(prefix):]] = value
            configured = True
    if not configured:
        return None
    props.setdefault(REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP, DEFAULT_REMOTE_STORAGE_MANAGER_CLASS_NAME)
    return props


def _from_server_properties(path: Path) -> dict[str, str] | None:
    """The RSM properties a broker with this server.properties builds its RSM from, or None
    when its tiering is off."""
    try:
        broker_props = load_properties(path.read_text())
    except OSError as exc:
        raise ValueError(f"{SERVER_PROPERTIES_OPTION}: cannot read {path}: {exc}") from exc
    cfg = RemoteLogManagerConfig(broker_props)
    if not cfg.system_enabled:
        log.warning("%s: %s does not enable tiered storage (remote.log.storage.system.enable)",
                    SERVER_PROPERTIES_OPTION, path)
        return None
    props = {REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP: cfg.rsm_class_name}
    class_path = cfg.remote_storage_manager_class_path
    if class_path:
        props[REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP] = class_path
    for key, value in cfg.rsm_props().items():     # storage.url defaulted from log.dirs
        if not key.startswith(_BROKER_ONLY_RSM_KEYS):
            props[DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX + key] = str(value)
    return props


# ---- reading segments ------------------------------------------------------------------------------

class RemoteSegmentReader:
    """Reads remote segments through the RemoteStorageManager that ``rsm_props`` (from
    ``rsm_props_from_options``) describe, built and configured as the broker builds its own
    (``load_plugin`` of the class, ``configure`` with the prefix-stripped keys): its caches,
    CRC checks and decryption apply.

    Create it where it is used (a Spark executor): it must not be pickled. Not thread-safe
    for concurrent reads of one reader's index cache; its RSM is thread-safe.
    """

    def __init__(self, rsm_props: Mapping[str, str]) -> None:
        props = dict(rsm_props)
        class_name = props.get(REMOTE_STORAGE_MANAGER_CLASS_NAME_PROP) \
            or DEFAULT_REMOTE_STORAGE_MANAGER_CLASS_NAME
        cls = load_plugin(class_name, props.get(REMOTE_STORAGE_MANAGER_CLASS_PATH_PROP),
                          expected_type=RemoteStorageManager)
        prefix = DEFAULT_REMOTE_STORAGE_MANAGER_CONFIG_PREFIX
        configs = {k[len(prefix):]: v for k, v in props.items()
                   if k.startswith(prefix) and len(k) > len(prefix)}
        self.rsm: RemoteStorageManager = cls()
        self.rsm.configure(configs)
        self._indexes: OrderedDict[object, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._ahead = BackgroundThread("strata-segment-ahead")

    def __reduce__(self) -> tuple:
        raise TypeError("RemoteSegmentReader holds a RemoteStorageManager and is not picklable: "
                        "ship rsm_props and build the reader where it reads")

    def close(self) -> None:
        self._ahead.close()
        self.rsm.close()
        with self._lock:
            self._indexes.clear()

    def __enter__(self) -> RemoteSegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the offset index -------------------------------------------------------------------

    def offset_positions(self, meta: RemoteLogSegmentMetadata) -> list[tuple[int, int]]:
        """The entries of the segment's offset index as ``(offset, byte position)``: the batch
        at ``position`` ends at ``offset`` (Kafka's index keeps each indexed batch's last
        offset), so ``offset + 1`` is where the next batch starts. Sparse: about one entry per
        ``index.interval.bytes``. Missing index -> DataLossError."""
        index = self._index(meta, meta.start_offset, meta.end_offset + 1)
        return list(zip(index[:, 0].tolist(), index[:, 1].tolist()))

    def _index(self, meta: RemoteLogSegmentMetadata, start: int, end: int) -> np.ndarray:
        """(n, 2) int64 (absolute offset, position), validated and cached per segment."""
        seg_id = meta.remote_log_segment_id.id
        with self._lock:
            found = self._indexes.get(seg_id)
            if found is not None:
                self._indexes.move_to_end(seg_id)
                return found
        try:
            with self.rsm.fetch_index(meta, IndexType.OFFSET) as stream:
                raw = stream.read()
        except RemoteResourceNotFoundException as exc:
            raise _data_loss(meta, start, end, exc) from exc
        entries = np.frombuffer(raw, ">i4", count=len(raw) // 8 * 2).reshape(-1, 2).astype(np.int64)
        # a preallocated index may end in zero entries: keep the increasing prefix
        valid = len(entries)
        if valid > 1:
            steps = np.flatnonzero(np.diff(entries[:, 0]) <= 0)
            if steps.size:
                valid = int(steps[0]) + 1
        index = entries[:valid]
        index[:, 0] += meta.start_offset
        with self._lock:
            self._indexes[seg_id] = index
            while len(self._indexes) > _INDEX_CACHE_SEGMENTS:
                self._indexes.popitem(last=False)
        return index

    def _byte_range(self, meta: RemoteLogSegmentMetadata, start: int, end: int) -> tuple[int, int]:
        """Positions [from, to) of the segment holding every batch with offsets in
        [start, end): from the greatest entry whose offset is <= start, to the entry after
        the first one whose offset reaches end - 1 (or the segment's end)."""
        index = self._index(meta, start, end)
        size = meta.segment_size_in_bytes
        if not len(index):
            return 0, size
        offsets = index[:, 0]
        i = int(np.searchsorted(offsets, start, side="right")) - 1
        first = int(index[i, 1]) if i >= 0 else 0
        j = int(np.searchsorted(offsets, end - 1, side="left"))
        last = int(index[j + 1, 1]) if j + 1 < len(index) else size
        return first, max(last, first)

    # ---- the data ---------------------------------------------------------------------------

    def read(self, meta: RemoteLogSegmentMetadata, start_offset: int,
             end_offset: int) -> Iterator[bytes]:
        """The segment's record batches holding offsets ``[start_offset, end_offset)``: whole
        batches in pieces of about ``READ_PIECE_BYTES``, the first batch possibly beginning
        before ``start_offset``. A missing object raises DataLossError naming the segment,
        its topic-partition and the offsets."""
        for view in self.views(meta, start_offset, end_offset):
            yield bytes(view)

    def views(self, meta: RemoteLogSegmentMetadata, start_offset: int,
              end_offset: int) -> Iterator[memoryview]:
        """What ``read`` gives, as views of one buffer this generator reuses: a view is valid
        only until the next one is asked for (decode or copy it first). This spares each piece
        two copies and a fresh allocation (whose page faults cost more than the copies)."""
        start = max(start_offset, meta.start_offset)
        end = min(end_offset, meta.end_offset + 1)
        if start >= end:
            return
        try:
            yield from self._read(meta, start, end)
        except RemoteResourceNotFoundException as exc:
            raise _data_loss(meta, start, end, exc) from exc

    def batches_verified(self, meta: RemoteLogSegmentMetadata) -> bool:
        """Whether the RSM vouches for the segment's batches (``batches_verified``): they
        passed their CRC32C checks at upload and every chunk read is checked against its
        own, so checking each batch again would add nothing. False when it cannot tell (a
        missing manifest is for the read to report)."""
        try:
            return self.rsm.batches_verified(meta)
        except RemoteStorageException:
            return False

    def prefetch(self, meta: RemoteLogSegmentMetadata, start_offset: int) -> None:
        """A hint that ``meta`` is read from ``start_offset`` next: its offset index, manifest
        and first piece load in the background meanwhile (a reader of consecutive segments
        then does not wait for each one's first GETs). Errors are left for the read."""
        self._ahead.submit(self._warm, meta, start_offset)

    def _warm(self, meta: RemoteLogSegmentMetadata, start_offset: int) -> None:
        first, last = self._byte_range(meta, max(start_offset, meta.start_offset),
                                       meta.end_offset + 1)
        ahead = min(READ_PIECE_BYTES, self.rsm.prefetch_max_size)
        if first < last:
            self.rsm.prefetch(meta, first, min(ahead, last - first))

    def _read(self, meta: RemoteLogSegmentMetadata, start: int, end: int) -> Iterator[memoryview]:
        first, last = self._byte_range(meta, start, end)
        if first >= last:
            return
        ahead = self.rsm.prefetch_max_size    # 0: no read-ahead
        stream = self.rsm.fetch_log_segment(meta, first, last - 1)
        try:
            position = first        # the segment byte after what was read
            cut = bytearray()       # the head of a batch the last piece ended inside
            for piece in _pieces(stream):
                position += len(piece)
                if ahead and position < last:
                    # what follows loads in the RSM's threads while this piece is decoded
                    self.rsm.prefetch(meta, position, min(ahead, last - position))
                if cut:
                    piece = piece[_complete_batch(cut, piece, meta, position - len(piece)):]
                    if _batch_size(cut) != len(cut):
                        continue        # still partial: the piece went into it
                    found = whole_batches(cut, start, end)
                    if found.keep_from >= 0:
                        yield memoryview(cut)[found.keep_from:found.keep_to]
                    if found.reached_end:
                        return
                    cut = bytearray()   # a fresh one: the view just given may still be held
                found = whole_batches(piece, start, end)
                if found.keep_from >= 0:
                    yield piece[found.keep_from:found.keep_to]
                if found.reached_end:
                    return
                rest = piece[found.parsed_to:]     # a partial (or malformed) batch
                if rest:
                    _complete_batch(cut, rest, meta, position - len(rest))
            if cut:
                raise _malformed(meta, position - len(cut))
        finally:
            stream.close()


def _pieces(stream) -> Iterator[memoryview]:
    """The stream's bytes in pieces, each valid until the next is asked for: views of the
    RSM's chunks (no copy) when the stream offers them, else reads into one reused buffer."""
    # under a fresh io.BufferedReader (nothing buffered yet) the raw stream reads the same
    readview = getattr(getattr(stream, "raw", stream), "readview", None)
    if readview is not None:
        while piece := readview():
            yield piece
        return
    view = memoryview(bytearray(READ_PIECE_BYTES))
    while got := stream.readinto(view):
        yield view[:got]


def _batch_size(head: bytes | bytearray) -> int | None:
    """The whole size of the batch ``head`` starts, or None before its length is in."""
    return _LENGTH.unpack_from(head, 8)[0] + LOG_OVERHEAD if len(head) >= LOG_OVERHEAD else None


def _complete_batch(cut: bytearray, piece: memoryview, meta: RemoteLogSegmentMetadata,
                    at: int) -> int:
    """Append to ``cut`` (a batch's first bytes, or nothing) what ``piece`` (at segment byte
    ``at``) holds of that batch; how many bytes of ``piece`` that took. A batch whose length
    is below the minimum raises."""
    taken = 0
    if len(cut) < LOG_OVERHEAD:
        taken = min(LOG_OVERHEAD - len(cut), len(piece))
        cut += piece[:taken]
    size = _batch_size(cut)
    if size is None:
        return taken
    if size < HEADER_SIZE:
        raise _malformed(meta, at - len(cut) + taken)
    more = min(size - len(cut), len(piece) - taken)
    cut += piece[taken:taken + more]
    return taken + more


def _malformed(meta: RemoteLogSegmentMetadata, position: int) -> RemoteStorageException:
    return RemoteStorageException(
        f"remote segment {uuid_to_kafka_str(meta.remote_log_segment_id.id)} has a truncated "
        f"or malformed batch at position {position}")


def _data_loss(meta: RemoteLogSegmentMetadata, start: int, end: int,
               exc: Exception) -> DataLossError:
    tp = meta.topic_id_partition
    return DataLossError(
        f"remote segment {uuid_to_kafka_str(meta.remote_log_segment_id.id)} "
        f"({meta.remote_log_segment_id.id}) of {tp.topic}-{tp.partition}, offsets "
        f"[{start}, {end}) of its [{meta.start_offset}, {meta.end_offset}], is missing from "
        f"remote storage: {exc}", topic=tp.topic, partition=tp.partition, start=start, end=end)
