"""The ``usage`` pipeline: per topic and partition, what each tier holds and what the remote
tier costs.

- Local: ``local_bytes`` from the broker's DescribeLogDirs (the partition's local log size,
  summed over log dirs); ``local_segments`` from the broker's metrics endpoint
  (``/tiered/<topic>``) when ``metrics_url`` is given, else None (no Kafka API reports it).
- Remote: ``remote_bytes`` and ``remote_segments`` of the COPY_SEGMENT_FINISHED segments in
  ``__remote_log_metadata`` (``segment_size_in_bytes``: the segment as it was on disk).
- Costs, from S3-style prices (defaults: S3 Standard, us-east-1) and the way Strata's
  object-store RSM writes and reads a segment:

  ``storage_cost_month = remote_bytes / 2**30 * storage_price_gb_month`` (priced per GiB-month,
  as S3 bills "GB"; the small manifest and index objects are not counted);

  ``remote_puts`` per segment ``= 2 + log_puts``: the ``.indexes`` object and the manifest are
  one PUT each, and the ``.log`` object is one PUT up to the multipart part size
  (``rsm.config.storage.multipart.chunk.bytes``, default 8 MiB), else a multipart upload of
  ``ceil(size / part) + 2`` requests (create, the parts, complete) -- the requests
  ``MeteredObjectStore`` counts; ``write_cost = remote_puts / 1000 * put_price_per_1000`` (what
  uploading the data now in the tier cost, once, not monthly);

  ``remote_gets`` per segment ``= 2 + ceil(size / chunk)``: a full read of the tier (a backfill
  in ``direct`` mode) GETs the manifest, the indexes (one ranged GET) and each ``.log`` chunk
  (``rsm.config.chunk.size``, default 4 MiB); ``read_cost = remote_gets / 1000 *
  get_price_per_1000``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from strata.common.errors import code_of
from strata.tiered.api import RemoteLogSegmentMetadata, RemoteLogSegmentState

__all__ = ["LogDirUsage", "PartitionUsage", "UsageReport", "describe_log_dirs", "usage"]

GIB = 2**30
DEFAULT_MULTIPART_PART_BYTES = 8 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
DESCRIBE_LOG_DIRS_VERSION = 4


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionUsage:
    topic: str
    partition: int
    local_bytes: int
    local_segments: int | None
    remote_bytes: int
    remote_segments: int
    remote_puts: int
    remote_gets: int
    storage_cost_month: float
    write_cost: float
    read_cost: float


@dataclasses.dataclass(frozen=True, slots=True)
class LogDirUsage:
    """One of the broker's log dirs as DescribeLogDirs reports it."""

    log_dir: str
    error_code: int
    total_bytes: int
    usable_bytes: int
    partition_bytes: int


_SUMMED = ("local_bytes", "local_segments", "remote_bytes", "remote_segments", "remote_puts",
           "remote_gets", "storage_cost_month", "write_cost", "read_cost")


@dataclasses.dataclass
class UsageReport:
    partitions: list[PartitionUsage]
    log_dirs: list[LogDirUsage]
    prices: dict[str, float]

    def totals(self, topic: str | None = None) -> dict[str, Any]:
        """Sums over the partitions (of ``topic``); ``local_segments`` is None when unknown."""
        rows = [p for p in self.partitions if topic is None or p.topic == topic]
        out: dict[str, Any] = {}
        for name in _SUMMED:
            values = [getattr(p, name) for p in rows]
            out[name] = None if any(v is None for v in values) else sum(values)
        return out

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})

    def to_dict(self) -> dict[str, Any]:
        return {"prices": self.prices,
                "topics": {t: self.totals(t) for t in self.topics},
                "total": self.totals(),
                "partitions": [dataclasses.asdict(p) for p in self.partitions],
                "log_dirs": [dataclasses.asdict(d) for d in self.log_dirs]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        header = ["TOPIC", "PARTITION", "LOCAL-BYTES", "LOCAL-SEGMENTS", "REMOTE-BYTES",
                  "REMOTE-SEGMENTS", "STORAGE-$/MONTH", "WRITE-$", "FULL-READ-$"]

        def row(topic: str, partition: str, v: Mapping[str, Any]) -> list[str]:
            return [topic, partition, str(v["local_bytes"]),
                    "-" if v["local_segments"] is None else str(v["local_segments"]),
                    str(v["remote_bytes"]), str(v["remote_segments"]),
                    f"{v['storage_cost_month']:.6f}", f"{v['write_cost']:.6f}",
                    f"{v['read_cost']:.6f}"]
        rows = [header]
        for topic in self.topics:
            rows += [row(p.topic, str(p.partition), dataclasses.asdict(p))
                     for p in self.partitions if p.topic == topic]
            rows.append(row(topic, "all", self.totals(topic)))
        rows.append(row("TOTAL", "", self.totals()))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(f"prices: ${self.prices['storage_price_gb_month']}/GiB-month, "
                     f"${self.prices['put_price_per_1000']}/1000 PUT, "
                     f"${self.prices['get_price_per_1000']}/1000 GET")
        lines += [f"log dir {d.log_dir}: {d.partition_bytes} bytes of partitions, "
                  f"{d.usable_bytes} of {d.total_bytes} bytes usable" for d in self.log_dirs]
        return "\n".join(lines)


# --------------------------------------------------------------------------- sources


def describe_log_dirs(bootstrap: str, topics: Mapping[str, Sequence[int]] | None = None,
                      timeout: float = 30.0) -> tuple[list[LogDirUsage], dict[tuple[str, int], int]]:
    """DescribeLogDirs v4 to the bootstrap broker: its log dirs, and the local size of every
    partition (``topics`` None: all), future logs left out."""
    from kio.schema.describe_log_dirs.v4.request import (
        DescribableLogDirTopic, DescribeLogDirsRequest)
    from kio.schema.describe_log_dirs.v4.response import DescribeLogDirsResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i32

    from strata.net.connection import roundtrip

    request = DescribeLogDirsRequest(topics=None if topics is None else tuple(
        DescribableLogDirTopic(topic=TopicName(t), partitions=tuple(i32(p) for p in parts))
        for t, parts in topics.items()))
    response = roundtrip(bootstrap, request, DescribeLogDirsResponse, timeout=timeout)
    code = code_of(response.error_code)
    if code != 0:
        raise RuntimeError(f"DescribeLogDirs failed with error code {code}")
    dirs, sizes = [], {}
    for result in response.results:
        total = 0
        for t in result.topics:
            for p in t.partitions:
                if not p.is_future_key:
                    sizes[(str(t.name), int(p.partition_index))] = \
                        sizes.get((str(t.name), int(p.partition_index)), 0) + int(p.partition_size)
                    total += int(p.partition_size)
        dirs.append(LogDirUsage(result.log_dir,
                                code_of(result.error_code),
                                int(result.total_bytes), int(result.usable_bytes), total))
    return dirs, sizes


def local_segment_counts(metrics_url: str, topic: str,
                         timeout: float = 30.0) -> dict[int, int]:
    """Local segments per partition from the broker's ``/tiered/<topic>`` document."""
    url = f"{metrics_url.rstrip('/')}/tiered/{urllib.parse.quote(topic, safe='')}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        doc = json.loads(resp.read())
    return {int(p["partition"]): int(p["local_segments"]) for p in doc.get("partitions", [])}


def _int_prop(props: Mapping[str, Any], key: str, default: int) -> int:
    value = props.get(key)
    return default if value in (None, "") else int(value)


def segment_requests(size: int, *, part_bytes: int = DEFAULT_MULTIPART_PART_BYTES,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[int, int]:
    """(PUTs to upload, GETs to read once) one segment of ``size`` bytes (module docstring)."""
    log_puts = 1 if size <= part_bytes else math.ceil(size / part_bytes) + 2
    return 2 + log_puts, 2 + math.ceil(size / chunk_bytes)


def partition_usage(topic: str, partition: int, local_bytes: int, local_segments: int | None,
                    remote: Iterable[RemoteLogSegmentMetadata], *, storage_price_gb_month: float,
                    put_price_per_1000: float, get_price_per_1000: float,
                    part_bytes: int = DEFAULT_MULTIPART_PART_BYTES,
                    chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> PartitionUsage:
    sizes = [m.segment_size_in_bytes for m in remote]
    requests = [segment_requests(s, part_bytes=part_bytes, chunk_bytes=chunk_bytes) for s in sizes]
    puts = sum(r[0] for r in requests)
    gets = sum(r[1] for r in requests)
    remote_bytes = sum(sizes)
    return PartitionUsage(topic, partition, local_bytes, local_segments, remote_bytes, len(sizes),
                          puts, gets, remote_bytes / GIB * storage_price_gb_month,
                          puts / 1000 * put_price_per_1000, gets / 1000 * get_price_per_1000)


# --------------------------------------------------------------------------- the job


def usage(options: Mapping[str, str], topics: Iterable[str] | None = None, *,
          storage_price_gb_month: float = 0.023, put_price_per_1000: float = 0.005,
          get_price_per_1000: float = 0.0004, metrics_url: str | None = None) -> UsageReport:
    """The usage of ``topics`` (default: every topic whose name does not start with ``__``).

    ``options``: ``bootstrap.servers``, and optionally the remote tier's ``rsm.config.*`` keys
    (``chunk.size`` and ``storage.multipart.chunk.bytes`` shape the request counts; nothing
    is read from the object store). See the module docstring for the formulas.
    """
    from strata.spark.pipelines import bootstrap_servers, load_remote_metadata, open_client

    for name, price in (("storage_price_gb_month", storage_price_gb_month),
                        ("put_price_per_1000", put_price_per_1000),
                        ("get_price_per_1000", get_price_per_1000)):
        if not price >= 0 or math.isinf(price):
            raise ValueError(f"{name} must be a non-negative number, got {price}")
    rsm_props = _rsm_props(options)
    part_bytes = _int_prop(rsm_props, "storage.multipart.chunk.bytes", DEFAULT_MULTIPART_PART_BYTES)
    chunk_bytes = _int_prop(rsm_props, "chunk.size", DEFAULT_CHUNK_BYTES)
    with open_client(options) as client:
        if topics is None:
            infos = {n: i for n, i in client.topics().items() if not n.startswith("__")}
        else:
            wanted = list(dict.fromkeys(topics))
            infos = client.topics(wanted)
            unknown = [t for t in wanted if t not in infos]
            if unknown:
                raise ValueError(f"unknown topic(s): {', '.join(unknown)}")
        metadata = load_remote_metadata(client, infos.values())
    dirs, local = describe_log_dirs(bootstrap_servers(options),
                                    {t: range(i.partitions) for t, i in infos.items()})
    remote: dict[tuple[str, int], list[RemoteLogSegmentMetadata]] = {}
    for m in metadata.segments:
        if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
            tip = m.topic_id_partition
            remote.setdefault((tip.topic, tip.partition), []).append(m)
    partitions = []
    for topic in sorted(infos):
        counts = local_segment_counts(metrics_url, topic) if metrics_url else {}
        for p in range(infos[topic].partitions):
            partitions.append(partition_usage(
                topic, p, local.get((topic, p), 0), counts.get(p) if metrics_url else None,
                remote.get((topic, p), ()), storage_price_gb_month=storage_price_gb_month,
                put_price_per_1000=put_price_per_1000, get_price_per_1000=get_price_per_1000,
                part_bytes=part_bytes, chunk_bytes=chunk_bytes))
    return UsageReport(partitions, dirs, {"storage_price_gb_month": storage_price_gb_month,
                                          "put_price_per_1000": put_price_per_1000,
                                          "get_price_per_1000": get_price_per_1000})


def _rsm_props(options: Mapping[str, str]) -> dict[str, str]:
    """The RSM's own keys (``rsm.config.`` stripped) the options configure, if any."""
    from strata.spark.pipelines import rsm_props
    prefix = "rsm.config."
    return {k[len(prefix):]: v for k, v in (rsm_props(options) or {}).items()
            if k.startswith(prefix)}
