"""Cluster snapshots and whole-cluster restore (issue 52).

A single broker with the remote tier writes, every ``strata.remote.cluster.snapshot.interval.ms``
(when something changed), a snapshot of its cluster into the bucket: every topic (name, id,
partition count, config overrides), every group's committed offsets, and the client quotas.
Keys (``p``: the RSM's key prefix)::

    {p}_strata/snapshots/snapshot-{writtenMs:015d}   a snapshot (kind ``snapshot``)
    {p}_strata/snapshots/latest                      a pointer naming the newest one

written as every catalog object is (a new object, then the pointer), after the cluster-marker
check; the three newest snapshots are kept. ``restore`` (``strata cluster restore``) reads the
newest readable one (falling back to older ones, each unreadable one reported with its key)
and, on an empty broker, recreates each topic (with ``strata.remote.recovery=true`` where the
bucket has its manifests), then commits each group's offsets clamped to what was recovered,
then the quotas, and reports what it restored and what it could not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any, Callable, Mapping

from strata.common.types import TopicPartition
from strata.common.types import uuid_from_kafka_str as kafka_str_to_uuid
from strata.common.types import uuid_to_kafka_str as kafka_uuid_str
from strata.tiered.api import RemoteResourceNotFoundException, RemoteStorageException
from strata.tiered.bucket.catalog import CATALOG_DIR, BucketCatalog
from strata.tiered.bucket.format import ManifestError, Pointer, decode, encode

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_MS_CONFIG = "strata.remote.cluster.snapshot.interval.ms"
DEFAULT_SNAPSHOT_INTERVAL_MS = 300_000
KEEP = 3
NOT_CAPTURED = ("ACLs", "SCRAM credentials")   # not in a snapshot yet


@dataclasses.dataclass(frozen=True)
class TopicEntry:
    name: str
    topic_id: str
    partitions: int
    configs: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class ClusterSnapshot:
    cluster_id: str
    written_ms: int
    topics: tuple[TopicEntry, ...]
    # group -> [(topic, partition, offset, metadata)]
    group_offsets: Mapping[str, tuple[tuple[str, int, int, str], ...]]
    # [([(entity type, name or None)], {quota key: value})]
    client_quotas: tuple[tuple[tuple[tuple[str, str | None], ...], Mapping[str, float]], ...]

    def body(self) -> dict[str, Any]:
        return {"clusterId": self.cluster_id, "writtenMs": self.written_ms,
                "topics": [{"name": t.name, "topicId": t.topic_id, "partitions": t.partitions,
                            "configs": dict(sorted(t.configs.items()))} for t in self.topics],
                "groupOffsets": {g: [list(o) for o in offs]
                                 for g, offs in sorted(self.group_offsets.items())},
                "clientQuotas": [{"entity": [list(p) for p in entity], "quotas": dict(q)}
                                 for entity, q in self.client_quotas],
                "notCaptured": list(NOT_CAPTURED)}

    def encode(self) -> bytes:
        return encode("snapshot", self.body())

    def content(self) -> str:
        """The snapshot without its time: equal when nothing changed."""
        return json.dumps({k: v for k, v in self.body().items() if k != "writtenMs"},
                          sort_keys=True)

    @classmethod
    def decode(cls, key: str, data: bytes) -> ClusterSnapshot:
        obj = decode(key, data, "snapshot")
        try:
            topics = tuple(TopicEntry(str(t["name"]), str(t["topicId"]), int(t["partitions"]),
                                      {str(k): str(v) for k, v in t["configs"].items()})
                           for t in obj["topics"])
            if any(t.partitions <= 0 for t in topics):
                raise ValueError("a topic with no partitions")
            for t in topics:
                kafka_str_to_uuid(t.topic_id)
            groups = {str(g): tuple((str(o[0]), int(o[1]), int(o[2]), str(o[3])) for o in offs)
                      for g, offs in obj["groupOffsets"].items()}
            quotas = tuple((tuple((str(p[0]), None if p[1] is None else str(p[1]))
                                  for p in q["entity"]),
                            {str(k): float(v) for k, v in q["quotas"].items()})
                           for q in obj["clientQuotas"])
            return cls(str(obj["clusterId"]), int(obj["writtenMs"]), topics, groups, quotas)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise ManifestError(key, f"malformed cluster snapshot: {e!r}") from e


# ---- the bucket ------------------------------------------------------------------------------

def _dir(catalog: BucketCatalog) -> str:
    return f"{catalog.prefix}{CATALOG_DIR}/snapshots/"


def pointer_key(catalog: BucketCatalog) -> str:
    return _dir(catalog) + "latest"


def write_snapshot(catalog: BucketCatalog, snap: ClusterSnapshot) -> str:
    """Put ``snap`` and point ``latest`` at it (after the marker check); the older ones beyond
    the newest ``KEEP`` are deleted. The new object's key."""
    catalog.check_owner()
    name = f"snapshot-{snap.written_ms:015d}"
    key = _dir(catalog) + name
    catalog.store.put(key, snap.encode())
    catalog.store.put(pointer_key(catalog), Pointer(0, snap.written_ms, name).encode())
    catalog.puts += 2
    old = sorted(k for k, _ in catalog.store.list(_dir(catalog)) if k.rsplit("/", 1)[-1]
                 .startswith("snapshot-"))[:-KEEP]
    for k in old:
        try:
            catalog.store.delete(k)
        except RemoteStorageException as e:
            log.debug("could not delete %s: %s", k, e)
    return key


def read_latest(catalog: BucketCatalog) -> tuple[ClusterSnapshot | None, list[str]]:
    """The newest readable snapshot (the pointer's, else the newest readable object), and the
    problems met on the way (each naming its object)."""
    problems: list[str] = []
    tried: set[str] = set()
    try:
        data = catalog.store.get(pointer_key(catalog))
        pointer = Pointer.decode(pointer_key(catalog), data)
        key = _dir(catalog) + pointer.manifest_key
        tried.add(key)
        return ClusterSnapshot.decode(key, catalog.store.get(key)), problems
    except RemoteResourceNotFoundException as e:
        problems.append(f"{pointer_key(catalog)}: {e}")
    except ManifestError as e:
        problems.append(str(e))
    keys = sorted((k for k, _ in catalog.store.list(_dir(catalog))
                   if k.rsplit("/", 1)[-1].startswith("snapshot-") and k not in tried),
                  reverse=True)
    for key in keys:
        try:
            return ClusterSnapshot.decode(key, catalog.store.get(key)), problems
        except (ManifestError, RemoteResourceNotFoundException) as e:
            problems.append(str(e))
    return None, problems


# ---- capture (in the broker) -------------------------------------------------------------------

def _internal(info: Any) -> bool:
    """The broker's own topics (__consumer_offsets, __transaction_state, __remote_log_metadata):
    a broker makes them itself."""
    return bool(info.internal) or info.name.startswith("__")


def capture(metadata: Any, group_coordinator: Any, client_quotas: Any, now_ms: int) -> ClusterSnapshot:
    """This broker's cluster now (call on the event loop: the group coordinator's thread)."""
    topics = tuple(TopicEntry(info.name, kafka_uuid_str(info.topic_id), info.partitions,
                              dict(info.configs))
                   for name, info in sorted(metadata.topics().items()) if not _internal(info))
    groups: dict[str, tuple] = {}
    listed = group_coordinator.list_groups()
    for g in listed.groups:
        fetched = group_coordinator.fetch_offsets(g.group_id)
        offs = tuple(sorted((str(tp[0]), int(tp[1]), o.offset, o.metadata or "")
                            for tp, o in fetched.offsets.items() if o.offset >= 0))
        if offs:
            groups[g.group_id] = offs
    quotas = tuple(sorted(((tuple(entity), dict(values))
                           for entity, values in client_quotas.snapshot().items()),
                          key=lambda e: repr(e[0])))
    return ClusterSnapshot(metadata.cluster_id, now_ms, topics, groups, quotas)


class SnapshotWriter:
    """The broker's periodic snapshot: ``take()`` gives the cluster now; written when it
    changed since the last write."""

    def __init__(self, catalog: BucketCatalog, take: Callable[[], ClusterSnapshot]):
        self.catalog = catalog
        self._take = take
        self._last = None
        self.written = 0

    def run(self) -> bool:
        snap = self._take()
        if snap.content() == self._last:
            return False
        write_snapshot(self.catalog, snap)
        self._last = snap.content()
        self.written += 1
        return True


def start_snapshots(scheduler: Any, props: Mapping[str, str], catalog: BucketCatalog,
                    metadata: Any, ctx: Any, loop: asyncio.AbstractEventLoop) -> SnapshotWriter:
    import time

    async def on_loop() -> ClusterSnapshot:
        return capture(metadata, ctx.group_coordinator, ctx.client_quotas, int(time.time() * 1000))

    writer = SnapshotWriter(catalog, lambda: asyncio.run_coroutine_threadsafe(
        on_loop(), loop).result(10))
    interval = int(props.get(SNAPSHOT_INTERVAL_MS_CONFIG, DEFAULT_SNAPSHOT_INTERVAL_MS))

    def task() -> None:
        try:
            writer.run()
        except Exception:  # noqa: BLE001 - the next interval tries again
            log.exception("cluster snapshot to %s failed", pointer_key(catalog))
    scheduler.schedule_periodic("strata-cluster-snapshot", task, interval)
    return writer


# ---- restore -----------------------------------------------------------------------------------

@dataclasses.dataclass
class RestoreReport:
    restored: list[str] = dataclasses.field(default_factory=list)
    not_restored: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"restored: {x}" for x in self.restored]
                + [f"NOT restored: {x}" for x in self.not_restored])


async def restore(broker: Any, progress: Callable[[str], None] = print) -> RestoreReport:
    """Restore the bucket's newest cluster snapshot into ``broker`` (built and started, with
    no topics of its own)."""
    from strata.common.errors import ErrorCode, KafkaError
    from strata.tiered.bucket.recovery import RECOVERY_CONFIG
    report = RestoreReport()
    metadata = broker.metadata
    rlm = broker.rlm
    if rlm is None or rlm.manifests is None:
        raise RuntimeError("the broker has no remote tier with manifests "
                           "(remote.log.storage.system.enable, strata.remote.manifests.enable)")
    own = [n for n, info in metadata.topics().items() if not _internal(info)]
    if own:
        raise RuntimeError(f"not an empty broker: it has topics {sorted(own)}")
    catalog: BucketCatalog = rlm.manifests.catalog
    snap, problems = await asyncio.to_thread(read_latest, catalog)
    report.not_restored += [f"snapshot object unreadable: {p}" for p in problems]
    if snap is None:
        report.not_restored.append(f"no readable cluster snapshot under {_dir(catalog)}")
        return report
    await asyncio.to_thread(catalog.check_owner)   # another live cluster's prefix: refused
    progress(f"snapshot of cluster {snap.cluster_id} written at {snap.written_ms} ms: "
             f"{len(snap.topics)} topic(s), {len(snap.group_offsets)} group(s), "
             f"{len(snap.client_quotas)} quota entit(ies)")
    ends: dict[TopicPartition, tuple[int, int]] = {}
    for i, t in enumerate(snap.topics, 1):
        configs = {k: v for k, v in t.configs.items() if k != RECOVERY_CONFIG}
        in_bucket = bool(await asyncio.to_thread(catalog.topics_named, t.name))
        try:
            if in_bucket:
                plan = await asyncio.to_thread(metadata.remote_recovery.plan, t.name)
                report.not_restored += [f"{t.name}: {p}" for p in plan.problems]
                await asyncio.to_thread(metadata.create_topic, t.name, -1, -1,
                                        {**configs, RECOVERY_CONFIG: "true"})
            else:
                await asyncio.to_thread(metadata.create_topic, t.name, t.partitions, -1, configs)
                report.not_restored.append(
                    f"{t.name}: no manifests in the bucket (never tiered): recreated empty "
                    f"with {t.partitions} partition(s) and its configs")
        except (KafkaError, RemoteStorageException) as e:
            report.not_restored.append(f"{t.name}: not created: {e}")
            progress(f"[{i}/{len(snap.topics)}] {t.name}: FAILED ({e})")
            continue
        parts = []
        for p in range(t.partitions):
            tp = TopicPartition(t.name, p)
            ulog = broker.manager.get_log(tp)
            if ulog is None:
                continue
            ends[tp] = (ulog.log_start_offset, ulog.log_end_offset)
            parts.append(f"{p}: [{ulog.log_start_offset}, {ulog.log_end_offset})")
        line = f"topic {t.name} ({len(parts)} partition(s); offsets {', '.join(parts)})"
        report.restored.append(line)
        progress(f"[{i}/{len(snap.topics)}] {line}")
    coordinator = broker.ctx.group_coordinator
    for group, offs in sorted(snap.group_offsets.items()):
        commits, clamped = [], []
        for topic, partition, offset, meta in offs:
            tp = TopicPartition(topic, partition)
            if tp not in ends:
                report.not_restored.append(f"group {group}: {topic}-{partition} at {offset}: "
                                           "the partition was not restored")
                continue
            start, end = ends[tp]
            at = min(max(offset, start), end)
            if at != offset:
                clamped.append(f"{topic}-{partition} {offset} -> {at}")
            commits.append((topic, partition, at, -1, meta))
        if not commits:
            continue
        for _ in range(600):   # the offsets partition loads in the background
            codes = await coordinator.commit_offsets(group, "", -1, commits)
            if not any(c in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR,
                             ErrorCode.COORDINATOR_NOT_AVAILABLE) for c in codes.values()):
                break
            await asyncio.sleep(0.1)
        failed = {tp: c for tp, c in codes.items() if c != ErrorCode.NONE}
        if failed:
            report.not_restored.append(f"group {group}: commits refused {failed}")
        report.restored.append(f"group {group}: {len(commits) - len(failed)} committed "
                               f"offset(s)" + (f", clamped to what was recovered: "
                                               f"{'; '.join(clamped)}" if clamped else ""))
    if snap.client_quotas:
        entries = [([p for p in entity], list(q.items())) for entity, q in snap.client_quotas]
        results = await asyncio.to_thread(broker.ctx.client_quotas.alter, entries)
        ok = sum(1 for code, _ in results if code == ErrorCode.NONE)
        report.restored.append(f"client quotas: {ok} of {len(entries)} entit(ies)")
        report.not_restored += [f"client quota {entries[i][0]}: {msg}"
                                for i, (code, msg) in enumerate(results) if code != ErrorCode.NONE]
    report.not_restored += [f"{what}: not in cluster snapshots yet" for what in NOT_CAPTURED]
    return report
