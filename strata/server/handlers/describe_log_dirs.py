"""DescribeLogDirs v1-5: per log dir of this broker, the size of each partition's local log.

As Kafka's ``ReplicaManager.describeLogDirs``: one result per configured log dir (absolute
path), holding the requested partitions whose log lives there (all of them when the request's
topics are null), grouped by topic; a partition's size is its local log's bytes (the remote
tier is not counted), its offset lag ``max(high watermark - log end offset, 0)`` and it is
never a future log (Strata has no AlterReplicaLogDirs). v4 adds the volume's total and usable
bytes (``statvfs``; Kafka's ``Long.MAX_VALUE`` when the numbers overflow); v5 whether the dir
is cordoned (KIP-1066, ``cordoned.log.dirs``). The remote tier's size is not in the response:
Kafka 4.4's schema has no field for it (its ``PartitionSize`` is the local log's, as here);
it is the ``RemoteLogSizeBytes`` metric. A log dir that
cannot be read answers KAFKA_STORAGE_ERROR with no topics. Requested partitions this broker
has no log for are left out, as Kafka does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.unified_log import UnifiedLog
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied

_LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class PartitionDir:
    partition: int
    size: int
    offset_lag: int


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    log_dir: str
    error: ErrorCode
    topics: dict[str, list[PartitionDir]]
    total_bytes: int = -1
    usable_bytes: int = -1
    is_cordoned: bool = False


def _volume(path: Path) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding ``path``, as Java's FileStore reports them."""
    st = os.statvfs(path)
    total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    return (total if 0 <= total <= _LONG_MAX else _LONG_MAX,
            usable if 0 <= usable <= _LONG_MAX else _LONG_MAX)


def _partition_dir(ulog: UnifiedLog) -> PartitionDir:
    with ulog.lock:
        return PartitionDir(ulog.topic_partition.partition, ulog.size,
                            max(ulog.high_watermark - ulog.log_end_offset, 0))


def describe_log_dirs(log_dirs: Iterable[Path], logs: Iterable[UnifiedLog],
                      wanted: set[TopicPartition] | None,
                      cordoned: frozenset[Path] = frozenset()) -> list[LogDirDescription]:
    """What the response says of each log dir; ``wanted`` None means every partition;
    ``cordoned`` the cordoned dirs (absolute)."""
    by_dir: dict[str, list[UnifiedLog]] = {}
    for ulog in logs:
        if wanted is None or ulog.topic_partition in wanted:
            by_dir.setdefault(str(ulog.directory.parent.absolute()), []).append(ulog)
    out = []
    for log_dir in log_dirs:
        path = str(Path(log_dir).absolute())
        try:
            total, usable = _volume(Path(path))
        except OSError:
            out.append(LogDirDescription(path, ErrorCode.KAFKA_STORAGE_ERROR, {},
                                         is_cordoned=Path(path) in cordoned))
            continue
        topics: dict[str, list[PartitionDir]] = {}
        for ulog in sorted(by_dir.get(path, ()), key=lambda u: (u.topic_partition.topic,
                                                                 u.topic_partition.partition)):
            topics.setdefault(ulog.topic_partition.topic, []).append(_partition_dir(ulog))
        out.append(LogDirDescription(path, ErrorCode.NONE, topics, total, usable,
                                     Path(path) in cordoned))
    return out


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    denied = cluster_denied(ctx, request, AclOperation.DESCRIBE)  # Kafka: DESCRIBE on the cluster
    if denied is not None:
        return denied
    manager = ctx.replica_manager.log_manager
    wanted = None if body.topics is None else {
        TopicPartition(t.topic, p) for t in body.topics for p in t.partitions}
    # statvfs and the logs' locks: off the event loop
    dirs = await asyncio.to_thread(describe_log_dirs, manager.log_dirs, manager.all_logs(), wanted,
                                   manager.cordoned)
    results = tuple(
        make(rc, "results", error_code=kio_error_code(d.error), log_dir=d.log_dir,
             total_bytes=d.total_bytes, usable_bytes=d.usable_bytes, is_cordoned=d.is_cordoned,
             topics=tuple(make(rc, "results.topics", name=topic, partitions=tuple(
                 make(rc, "results.topics.partitions", partition_index=p.partition,
                      partition_size=p.size, offset_lag=p.offset_lag, is_future_key=False)
                 for p in parts))
                 for topic, parts in d.topics.items()))
        for d in dirs)
    return make(rc, results=results)
