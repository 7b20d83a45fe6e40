"""A minimal blocking Kafka client for requests the usual client libraries cannot spell
(ListOffsets -4/-5 among them): frame a kio request, send it, read back its response."""

from __future__ import annotations

import io
import socket
import struct

from kio.serial import entity_reader, entity_writer

__all__ = ["EARLIEST", "EARLIEST_LOCAL", "LATEST", "LATEST_TIERED", "MAX_TIMESTAMP",
           "client_frame", "framed", "list_offset", "roundtrip"]

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


def client_frame(body, correlation_id: int = 7, client_id: str | None = "test-client") -> bytes:
    """What a client puts after the length prefix: header (the version kio gives this request)
    and body."""
    header_cls = body.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(
        request_api_key=body.__api_key__, request_api_version=body.__version__,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def roundtrip(bootstrap: str, body, response_cls, timeout: float = 10):
    """Send one request on a fresh connection; its decoded response."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(framed(client_frame(body, correlation_id=1)))
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        payload = _recv_exact(s, size)
    _, pos = entity_reader(response_cls.__header_schema__)(payload, 0)
    resp, _ = entity_reader(response_cls)(payload, pos)
    return resp


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of a ListOffsets v9 for one partition."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),))
    p = roundtrip(bootstrap, req, ListOffsetsResponse).topics[0].partitions[0]
    code = p.error_code.value if hasattr(p.error_code, "value") else p.error_code
    return int(code), int(p.offset), int(p.leader_epoch)
