"""Helpers for tiered-storage tests against a live broker: raw ListOffsets (−4/−5 have no
confluent-kafka spelling), waiting for conditions, and a look at the remote tier on disk."""

from __future__ import annotations

import time
from pathlib import Path

from strata.net.connection import list_offset  # noqa: F401
from strata.protocol.client import (  # noqa: F401
    EARLIEST, EARLIEST_LOCAL, LATEST, LATEST_TIERED, MAX_TIMESTAMP)
from support.waiting import eventually

TIERED_BROKER = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "remote.log.manager.task.retry.backoff.ms": "100",
    "remote.log.manager.task.retry.backoff.max.ms": "1000",
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "0",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
}


def offsets(bootstrap: str, topic: str, partition: int = 0) -> dict[str, int]:
    """log start (−2), local log start (−4), log end (−1) and highest tiered (−5) offsets."""
    out = {}
    for name, ts in (("start", EARLIEST), ("local_start", EARLIEST_LOCAL), ("end", LATEST),
                     ("tiered", LATEST_TIERED)):
        err, off, _ = list_offset(bootstrap, topic, partition, ts)
        assert err == 0, f"ListOffsets({ts}) error {err}"
        out[name] = off
    return out


def wait_for(cond, timeout: float = 60, interval: float = 0.1, what: str = "condition"):
    """``cond()``'s first truthy result, within ``timeout`` seconds."""
    return eventually(cond, what, timeout, interval)


def remote_files(root: Path, topic: str | None = None) -> list[Path]:
    """Objects of a filesystem remote tier (optionally one topic's)."""
    def listing() -> list[Path] | None:
        if not root.exists():
            return []
        try:   # the store prunes directories a delete empties while this walks them
            return sorted(p for top in root.glob("*" if topic is None else f"{topic}-*")
                          for p in ([top] if top.is_file() else top.rglob("*"))
                          if p.is_file() and not p.name.startswith("."))
        except FileNotFoundError:
            return None
    return eventually(lambda: (x := listing()) is not None and (x,), "a listing")[0]


def local_segments(log_dir: Path, topic: str, partition: int = 0) -> list[Path]:
    return sorted((log_dir / f"{topic}-{partition}").glob("*.log"))


def metadata_topic_records(bootstrap: str, partitions: int | None = None,
                           timeout: float = 60) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of ``__remote_log_metadata`` as a consumer reads it, by metadata
    partition: (offset, value) in offset order, up to each partition's end when asked
    (``partitions``: the topic's count; None asks the cluster)."""
    import uuid
    from confluent_kafka import Consumer, TopicPartition as CTopicPartition
    from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME as NAME
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rlmm-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    values: dict[int, list[tuple[int, bytes]]] = {}
    try:
        if partitions is None:
            partitions = len(consumer.list_topics(NAME, timeout=10).topics[NAME].partitions)
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(CTopicPartition(NAME, p), timeout=10)
            if high > low:
                ends[p] = high
                values[p] = []
        consumer.assign([CTopicPartition(NAME, p, 0) for p in ends])
        deadline = time.monotonic() + timeout
        while any(not values[p] or values[p][-1][0] < ends[p] - 1 for p in ends):
            assert time.monotonic() < deadline, \
                f"metadata read stalled at {({p: v[-1][0] if v else -1 for p, v in values.items()})}"
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                values[m.partition()].append((m.offset(), m.value()))
    finally:
        consumer.close()
    return values
