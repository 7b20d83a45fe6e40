"""Requests as a client puts them on the wire, for tests that talk bytes to the codec or a broker."""

from __future__ import annotations

import io
import struct

from kio.serial import entity_writer


def client_frame(body, correlation_id: int = 7, client_id: str | None = "test-client") -> bytes:
    """What a client puts after the length prefix: header (v1 or v2, as kio says for this
    version) and body."""
    header_cls = body.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(
        request_api_key=body.__api_key__, request_api_version=body.__version__,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload
