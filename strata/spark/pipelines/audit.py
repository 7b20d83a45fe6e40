"""The ``audit`` pipeline: reconcile the remote log metadata with the object store.

The remote tier is what ``__remote_log_metadata`` says it is; the object store is what is
really there. This job lists the store under the audited topics' prefixes, replays the metadata
(every segment state), and reports:

- **missing objects**: a COPY_SEGMENT_FINISHED segment lacks its ``.rsm-manifest``, ``.log``
  or ``.indexes`` object (readers of that segment fail);
- **orphans**: segment objects no live segment owns -- no metadata at all, a topic id that no
  longer exists, a key that does not match its segment's metadata, or a segment whose copy
  started (COPY_SEGMENT_STARTED) or delete started (DELETE_SEGMENT_STARTED) more than
  ``grace_ms`` ago and never finished (Kafka's dangling segments; younger ones are a copy or a
  delete in flight and are left alone). Objects under a partition whose remote data is being
  deleted (DELETE_PARTITION_MARKED/STARTED) are not orphans. Keys that are not in the
  RSM's layout are reported but never deleted;
- **size mismatches**: the metadata's ``segment_size_in_bytes`` against the manifest's segment
  size, and each object's listed size against what the manifest says it stores;
- **corrupt chunks**: with ``verify_crc``, every stored chunk of every finished segment's
  ``.log`` and every index in its ``.indexes`` is read and checked against the CRC32C of its
  manifest (version 2); an unparseable manifest is reported here too. Segments whose
  manifest has no chunk CRCs (version 1) cannot be verified; the report counts them, and the
  segments whose record batches all passed their CRC32C at the copy (``batchCrc32cChecked``).

Races with the broker's copier and expirer are closed by order: the store is listed first and
the metadata read after (a copier publishes COPY_SEGMENT_STARTED before it writes an object, so
every listed object's segment is known), and every missing object and orphan is confirmed with
a HEAD request before it is reported. ``delete_orphans`` deletes only the orphans, one key at a
time, never an object of a finished segment or of a copy in flight.

Works with Strata's ``ObjectStoreRemoteStorageManager`` (its layout and manifests); CRC
verification runs on a thread pool, or as a Spark job across segments when given a session.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from crc32c import crc32c

from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.types import TopicIdPartition, TopicPartition, uuid_from_kafka_str
from strata.common.types import uuid_to_kafka_str as kafka_str
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemoteLogSegmentState, RemoteResourceNotFoundException)
from strata.tiered.storage.object_store import ObjectStore
from strata.tiered.storage.remote_storage_manager import (
    INDEXES_SUFFIX, LOG_SUFFIX, MANIFEST_SUFFIX, ObjectStoreRemoteStorageManager, SegmentManifest)

__all__ = [
    "AuditReport",
    "CorruptChunk",
    "DEFAULT_GRACE_MS",
    "MissingObject",
    "OrphanObject",
    "SegmentCheck",
    "SizeMismatch",
    "audit",
    "audit_store",
    "verify_segment",
]

log = logging.getLogger(__name__)

_S = RemoteLogSegmentState
SUFFIXES = (MANIFEST_SUFFIX, LOG_SUFFIX, INDEXES_SUFFIX)
# An unfinished copy or delete younger than this is in flight, not dangling.
DEFAULT_GRACE_MS = 3_600_000
# CRC verification reads a .log object in ranged GETs of whole chunks up to this size.
CRC_READ_WINDOW_BYTES = 32 * 1024 * 1024
_KEY = re.compile(r"^(?P<topic>.+)-(?P<tid>[A-Za-z0-9_-]{22})/(?P<partition>\d+)/"
                  r"(?P<start>\d{20})-(?P<sid>[A-Za-z0-9_-]{22})\."
                  r"(?P<suffix>log|indexes|rsm-manifest)$")


# --------------------------------------------------------------------------- findings


@dataclasses.dataclass(frozen=True, slots=True)
class MissingObject:
    topic: str
    partition: int
    segment_id: str          # Kafka's string form of the segment uuid
    start_offset: int
    end_offset: int
    key: str


@dataclasses.dataclass(frozen=True, slots=True)
class OrphanObject:
    key: str
    size: int
    reason: str
    topic: str | None = None
    partition: int | None = None
    segment_id: str | None = None
    deletable: bool = True   # False for keys outside the RSM's layout


@dataclasses.dataclass(frozen=True, slots=True)
class SizeMismatch:
    topic: str
    partition: int
    segment_id: str
    key: str
    what: str                # "segment size", "log object" or "indexes object"
    expected: int
    actual: int


@dataclasses.dataclass(frozen=True, slots=True)
class CorruptChunk:
    topic: str
    partition: int
    segment_id: str
    key: str
    part: str                # "chunk <id>", "index <TYPE>" or "manifest"
    detail: str
    chunk_id: int | None = None


@dataclasses.dataclass
class AuditReport:
    """What one audit found. ``problems`` counts the findings still standing: missing objects,
    size mismatches, corrupt chunks and the orphans that were not deleted."""

    topics: list[str]
    segments: int = 0                 # finished segments audited
    objects: int = 0                  # objects listed
    chunks_verified: int = 0
    segments_without_crcs: int = 0    # manifest version 1: no chunk CRCs to verify against
    segments_batch_checked: int = 0   # every record batch passed its CRC32C at the copy
    missing: list[MissingObject] = dataclasses.field(default_factory=list)
    orphans: list[OrphanObject] = dataclasses.field(default_factory=list)
    size_mismatches: list[SizeMismatch] = dataclasses.field(default_factory=list)
    corrupt_chunks: list[CorruptChunk] = dataclasses.field(default_factory=list)
    deleted_orphans: list[str] = dataclasses.field(default_factory=list)

    @property
    def problems(self) -> int:
        deleted = set(self.deleted_orphans)
        return (len(self.missing) + len(self.size_mismatches) + len(self.corrupt_chunks)
                + sum(1 for o in self.orphans if o.key not in deleted))

    @property
    def ok(self) -> bool:
        return self.problems == 0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "problems": self.problems}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        """A readable report: a summary line, then one section per kind of finding."""
        unverifiable = (f" ({self.segments_without_crcs} segment(s) without chunk CRCs)"
                        if self.segments_without_crcs else "")
        lines = [f"audit of {', '.join(self.topics) or '(no topics)'}: {self.segments} segments, "
                 f"{self.objects} objects, {self.chunks_verified} chunks verified{unverifiable}, "
                 f"{self.problems} problem(s); record batches CRC-checked at the copy in "
                 f"{self.segments_batch_checked} of {self.segments} segments"]
        sections: list[tuple[str, list[str], list[list[str]]]] = [
            ("MISSING OBJECTS", ["TOPIC", "PARTITION", "SEGMENT", "OFFSETS", "KEY"],
             [[m.topic, str(m.partition), m.segment_id, f"{m.start_offset}-{m.end_offset}", m.key]
              for m in self.missing]),
            ("ORPHANS", ["KEY", "SIZE", "REASON", "DELETED"],
             [[o.key, str(o.size), o.reason, "yes" if o.key in self.deleted_orphans else "no"]
              for o in self.orphans]),
            ("SIZE MISMATCHES",
             ["TOPIC", "PARTITION", "SEGMENT", "WHAT", "EXPECTED", "ACTUAL", "KEY"],
             [[s.topic, str(s.partition), s.segment_id, s.what, str(s.expected), str(s.actual),
               s.key] for s in self.size_mismatches]),
            ("CORRUPT CHUNKS", ["TOPIC", "PARTITION", "SEGMENT", "PART", "DETAIL", "KEY"],
             [[c.topic, str(c.partition), c.segment_id, c.part, c.detail, c.key]
              for c in self.corrupt_chunks]),
        ]
        for title, header, rows in sections:
            if rows:
                lines += ["", f"{title} ({len(rows)})", *_table([header, *rows])]
        return "\n".join(lines)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# --------------------------------------------------------------------------- keys


class ParsedKey(NamedTuple):
    topic: str
    topic_id: uuid.UUID
    partition: int
    start_offset: int
    segment_id: uuid.UUID
    suffix: str


def parse_key(key: str, prefix: str = "") -> ParsedKey | None:
    """The parts of a segment object's key in the RSM's layout, or None for any other key."""
    if not key.startswith(prefix):
        return None
    m = _KEY.match(key[len(prefix):])
    if m is None:
        return None
    try:
        return ParsedKey(m["topic"], uuid_from_kafka_str(m["tid"]), int(m["partition"]),
                         int(m["start"]), uuid_from_kafka_str(m["sid"]), m["suffix"])
    except ValueError:
        return None


# --------------------------------------------------------------------------- CRC checks


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentCheck:
    """What CRC verification needs of one segment, plain values only (shipped to executors):
    the stored ``[start, stop)`` range and CRC32C of each ``.log`` chunk, and (name, position,
    size, CRC32C) of each index stored in ``.indexes``."""

    topic: str
    partition: int
    segment_id: str
    log_key: str
    chunks: tuple[tuple[int, int, int], ...]
    indexes_key: str
    indexes: tuple[tuple[str, int, int, int], ...]


def segment_check(rsm: ObjectStoreRemoteStorageManager, meta: RemoteLogSegmentMetadata,
                  manifest: SegmentManifest) -> SegmentCheck:
    index = manifest.chunk_index
    crcs = manifest.chunk_crcs or ()
    chunks = tuple((*index.stored_range(i), crcs[i]) for i in range(len(crcs)))
    indexes = tuple((t.name, e.position, e.size, e.crc32c)
                    for t, e in manifest.segment_indexes.items()
                    if e.crc32c is not None and e.size > 0)
    tip = meta.topic_id_partition
    return SegmentCheck(tip.topic, tip.partition, kafka_str(meta.remote_log_segment_id.id),
                        rsm.object_key(meta, LOG_SUFFIX), chunks,
                        rsm.object_key(meta, INDEXES_SUFFIX), indexes)


def _windows(chunks: Sequence[tuple[int, int, int]], limit: int) -> Iterator[list[int]]:
    """Chunk ids grouped into consecutive runs of at most ``limit`` stored bytes (a chunk
    larger than the limit is a run of its own)."""
    run: list[int] = []
    start = 0
    for i, (lo, hi, _) in enumerate(chunks):
        if run and hi - start > limit:
            yield run
            run = []
        if not run:
            start = lo
        run.append(i)
    if run:
        yield run


def verify_segment(store: ObjectStore, check: SegmentCheck,
                   window: int = CRC_READ_WINDOW_BYTES) -> tuple[int, list[CorruptChunk]]:
    """Read every chunk and index of one segment and check its CRC32C: (chunks read, corrupt
    ones). An object deleted since the listing is skipped (the expirer got there first)."""
    bad: list[CorruptChunk] = []
    found = 0

    def corrupt(key: str, part: str, detail: str, chunk_id: int | None = None) -> None:
        bad.append(CorruptChunk(check.topic, check.partition, check.segment_id, key, part,
                                detail, chunk_id))
    try:
        for run in _windows(check.chunks, window):
            lo, hi = check.chunks[run[0]][0], check.chunks[run[-1]][1]
            data = memoryview(store.get_range(check.log_key, lo, hi))
            for i in run:
                start, stop, want = check.chunks[i]
                part = data[start - lo:stop - lo]
                found += 1
                if len(part) != stop - start:
                    corrupt(check.log_key, f"chunk {i}", f"truncated: {len(part)} of "
                            f"{stop - start} bytes", i)
                elif (got := crc32c(part)) != want:
                    corrupt(check.log_key, f"chunk {i}", f"CRC32C {got:#010x}, manifest says "
                            f"{want:#010x}", i)
        if check.indexes:
            blob = memoryview(store.get(check.indexes_key))
            for name, position, size, want in check.indexes:
                part = blob[position:position + size]
                if len(part) != size or crc32c(part) != want:
                    corrupt(check.indexes_key, f"index {name}", "CRC32C mismatch"
                            if len(part) == size else f"truncated: {len(part)} of {size} bytes")
    except RemoteResourceNotFoundException:
        log.info("segment %s was deleted while it was verified", check.segment_id)
    return found, bad


Verifier = Callable[[ObjectStore, Sequence[SegmentCheck]], tuple[int, list[CorruptChunk]]]


def _verify_all(store: ObjectStore, checks: Sequence[SegmentCheck],
                threads: int = 8) -> tuple[int, list[CorruptChunk]]:
    total, bad = 0, []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="audit-crc") as pool:
        for n, found in pool.map(lambda c: verify_segment(store, c), checks):
            total += n
            bad += found
    return total, bad


def _verify_with_spark(spark: Any, options: Mapping[str, str], _store: ObjectStore,
                       checks: Sequence[SegmentCheck]) -> tuple[int, list[CorruptChunk]]:
    """The CRC checks as a Spark job: segments spread over tasks, each task opening the
    remote tier from ``options`` itself (RSMs and stores are never pickled)."""
    opts = dict(options)

    def run(part: Iterable[SegmentCheck]) -> Iterator[tuple[int, list[CorruptChunk]]]:
        from strata.spark.pipelines import open_rsm
        rsm = open_rsm(opts)
        try:
            for check in part:
                yield verify_segment(_store_of(rsm), check)
        finally:
            rsm.close()

    sc = spark.sparkContext
    slices = max(1, min(len(checks), sc.defaultParallelism * 4))
    total, bad = 0, []
    for n, found in sc.parallelize(list(checks), slices).mapPartitions(run).collect():
        total += n
        bad += found
    return total, bad


def _store_of(rsm: Any) -> ObjectStore:
    if not isinstance(rsm, ObjectStoreRemoteStorageManager):
        raise ValueError(f"audit needs Strata's ObjectStoreRemoteStorageManager (its layout and "
                        f"manifests), not {type(rsm).__name__}")
    return rsm.store


# --------------------------------------------------------------------------- reconciliation


def audit_store(rsm: ObjectStoreRemoteStorageManager, listing: Iterable[tuple[str, int]],
                segments: Iterable[RemoteLogSegmentMetadata], topics: Mapping[str, uuid.UUID], *,
                deleting: Iterable[TopicIdPartition] = (), verify_crc: bool = True,
                delete_orphans: bool = False, grace_ms: int = DEFAULT_GRACE_MS,
                clock: Clock = SYSTEM_CLOCK, verify: Verifier | None = None) -> AuditReport:
    """Reconcile one listing of the store with the metadata read after it.

    ``segments``: every segment the metadata holds in any state but DELETE_SEGMENT_FINISHED;
    ``topics``: the live topics' ids by name; ``deleting``: partitions whose remote data is
    being deleted. ``verify(store, checks) -> (chunks, corrupt)`` replaces the thread pool
    (the Spark job). See the module docstring for what is reported.
    """
    store = _store_of(rsm)
    listing = list(listing)
    segments = list(segments)
    deleting = set(deleting)
    now = clock.milliseconds()
    report = AuditReport(topics=sorted(topics), objects=len(listing))
    owners: dict[str, tuple[RemoteLogSegmentMetadata, str]] = {
        rsm.object_key(m, s): (m, s) for m in segments for s in SUFFIXES}
    known = {m.remote_log_segment_id.id for m in segments}
    sizes: dict[str, int] = {}
    orphans: list[OrphanObject] = []
    catalog = f"{rsm.key_prefix}_strata/"    # the bucket's manifests (docs/remote-manifests.md)
    for key, size in listing:
        if key.startswith(catalog):
            continue
        owner = owners.get(key)
        if owner is not None:
            meta, _ = owner
            if meta.state is _S.COPY_SEGMENT_FINISHED:
                sizes[key] = size
            elif now - meta.event_timestamp_ms >= grace_ms:
                tip = meta.topic_id_partition
                reason = ("copy never finished" if meta.state is _S.COPY_SEGMENT_STARTED
                          else "delete never finished")
                orphans.append(OrphanObject(key, size, reason, tip.topic, tip.partition,
                                            kafka_str(meta.remote_log_segment_id.id)))
            continue     # else a copy or delete in flight
        parsed = parse_key(key, rsm.key_prefix)
        if parsed is None:
            orphans.append(OrphanObject(key, size, "not a segment object of the RSM's layout",
                                        deletable=False))
            continue
        tip = TopicIdPartition(parsed.topic_id, TopicPartition(parsed.topic, parsed.partition))
        if tip in deleting:
            continue     # the partition's remote data is being deleted
        if topics.get(parsed.topic) != parsed.topic_id:
            reason = "no live topic has this topic id"
        elif parsed.segment_id in known:
            reason = "key does not match the segment's metadata"
        else:
            reason = "no remote log metadata for this segment"
        orphans.append(OrphanObject(key, size, reason, parsed.topic, parsed.partition,
                                    kafka_str(parsed.segment_id)))

    finished = sorted((m for m in segments if m.state is _S.COPY_SEGMENT_FINISHED),
                      key=lambda m: (m.topic_id_partition.topic, m.topic_id_partition.partition,
                                     m.start_offset))
    report.segments = len(finished)
    missing = [(m, key) for m in finished for s in SUFFIXES
               if (key := rsm.object_key(m, s)) not in sizes]
    # A copy that finished after the listing, or an orphan deleted since: not findings.
    report.missing = [MissingObject(m.topic_id_partition.topic, m.topic_id_partition.partition,
                                    kafka_str(m.remote_log_segment_id.id), m.start_offset,
                                    m.end_offset, key)
                      for m, key in missing if not _exists(store, key)]
    report.orphans = sorted((o for o in orphans if _exists(store, o.key)), key=lambda o: o.key)

    checks: list[SegmentCheck] = []
    for meta in finished:
        keys = {s: rsm.object_key(meta, s) for s in SUFFIXES}
        if keys[MANIFEST_SUFFIX] not in sizes:
            continue
        tip = meta.topic_id_partition
        sid = kafka_str(meta.remote_log_segment_id.id)
        try:
            manifest = SegmentManifest.from_json(store.get(keys[MANIFEST_SUFFIX]))
        except RemoteResourceNotFoundException:
            continue     # deleted since the listing
        except ValueError as e:
            report.corrupt_chunks.append(CorruptChunk(tip.topic, tip.partition, sid,
                                                      keys[MANIFEST_SUFFIX], "manifest", str(e)))
            continue
        expected = {
            "segment size": (meta.segment_size_in_bytes, manifest.segment_size,
                             keys[MANIFEST_SUFFIX]),
            "log object": (manifest.chunk_index.stored_size, sizes.get(keys[LOG_SUFFIX]),
                           keys[LOG_SUFFIX]),
            "indexes object": (max((e.position + e.size for e in manifest.segment_indexes.values()),
                                   default=0), sizes.get(keys[INDEXES_SUFFIX]),
                               keys[INDEXES_SUFFIX]),
        }
        report.segments_without_crcs += manifest.chunk_crcs is None
        report.segments_batch_checked += manifest.batch_crcs_checked
        wrong = {what for what, (want, got, key) in expected.items()
                 if got is not None and got != want}
        report.size_mismatches += [SizeMismatch(tip.topic, tip.partition, sid, key, what, want, got)
                                   for what, (want, got, key) in expected.items() if what in wrong]
        if (verify_crc and manifest.chunk_crcs is not None and keys[LOG_SUFFIX] in sizes
                and keys[INDEXES_SUFFIX] in sizes and not wrong & {"log object", "indexes object"}):
            checks.append(segment_check(rsm, meta, manifest))

    if checks:
        chunks, corrupt = (verify or _verify_all)(store, checks)
        report.chunks_verified = chunks
        report.corrupt_chunks += corrupt
    report.corrupt_chunks.sort(key=lambda c: (c.topic, c.partition, c.key,
                                              -1 if c.chunk_id is None else c.chunk_id, c.part))

    if delete_orphans:
        for orphan in report.orphans:
            if orphan.deletable:
                store.delete(orphan.key)
                report.deleted_orphans.append(orphan.key)
                log.info("deleted orphan %s (%s)", orphan.key, orphan.reason)
    return report


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.size(key)
        return True
    except RemoteResourceNotFoundException:
        return False


# --------------------------------------------------------------------------- the job


def audit(options: Mapping[str, str], topic: str | None = None, *, verify_crc: bool = True,
          delete_orphans: bool = False, spark: Any = None, grace_ms: int = DEFAULT_GRACE_MS,
          clock: Clock = SYSTEM_CLOCK) -> AuditReport:
    """Audit the remote tier of ``topic`` (every topic when None) against its metadata.

    ``options``: the ``strata`` source's options -- ``bootstrap.servers`` and the remote tier
    (``rsm.config.*``, ``remote.log.storage.manager.class.name`` or
    ``strata.server.properties``). With ``topic`` None the whole store under the RSM's key
    prefix is listed, so objects of deleted topics show up as orphans. ``spark``: run the CRC
    checks as a Spark job. ``delete_orphans``: delete the orphans found (see the module
    docstring). Raises ValueError when no remote tier is configured or a topic is unknown.
    """
    from strata.spark.pipelines import load_remote_metadata, open_client, open_rsm

    rsm = open_rsm(options)
    try:
        store = _store_of(rsm)
        with open_client(options) as client:
            if topic is not None:
                infos = client.topics([topic])
                if topic not in infos:
                    raise ValueError(f"topic {topic!r} does not exist")
                info = infos[topic]
                prefix = f"{rsm.key_prefix}{info.name}-{kafka_str(info.topic_id)}/"
                listing = list(store.list(prefix))
            else:
                listing = list(store.list(rsm.key_prefix))
                # internal topics are never tiered (Kafka refuses remote.storage.enable there)
                infos = {n: i for n, i in client.topics().items() if not n.startswith("__")}
            # after the listing: every listed object's segment is in this read (see above)
            metadata = load_remote_metadata(client, infos.values())
        verify = None if spark is None else functools.partial(_verify_with_spark, spark, options)
        return audit_store(rsm, listing, metadata.segments,
                           {n: i.topic_id for n, i in infos.items()},
                           deleting=metadata.deleting, verify_crc=verify_crc,
                           delete_orphans=delete_orphans, grace_ms=grace_ms, clock=clock,
                           verify=verify)
    finally:
        rsm.close()
