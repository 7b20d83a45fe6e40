"""Helpers for tiered-storage tests against a live broker: raw ListOffsets (−4/−5 have no
confluent-kafka spelling), waiting for conditions, and a look at the remote tier on disk."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from kio.schema.list_offsets.v9.request import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
from kio.schema.list_offsets.v9.response import ListOffsetsResponse
from kio.serial import entity_reader
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from wire import client_frame, framed

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5

TIERED_BROKER = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "remote.log.manager.task.retry.backoff.ms": "100",
    "remote.log.manager.task.retry.backoff.max.ms": "1000",
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "0",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
}


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of a ListOffsets v9 for one partition."""
    host, port = bootstrap.rsplit(":", 1)
    req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),))
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(framed(client_frame(req, correlation_id=1)))
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        payload = _recv_exact(s, size)
    _, pos = entity_reader(ListOffsetsResponse.__header_schema__)(payload, 0)
    resp, _ = entity_reader(ListOffsetsResponse)(payload, pos)
    p = resp.topics[0].partitions[0]
    return int(p.error_code.value if hasattr(p.error_code, "value") else p.error_code), \
        int(p.offset), int(p.leader_epoch)


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
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def remote_files(root: Path, topic: str | None = None) -> list[Path]:
    """Objects of a filesystem remote tier (optionally one topic's)."""
    if not root.exists():
        return []
    files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
    if topic is not None:
        files = [p for p in files if p.relative_to(root).parts[0].startswith(f"{topic}-")]
    return sorted(files)


def local_segments(log_dir: Path, topic: str, partition: int = 0) -> list[Path]:
    return sorted((log_dir / f"{topic}-{partition}").glob("*.log"))
