"""TLS connections hand large responses to the transport in pieces of about 64 KiB (the TLS
transport encrypts whatever one call gives it before writing any of it), bytes unchanged."""

from __future__ import annotations

import os

from strata.server.network import _TLS_PIECE, _write_in_pieces


class RecordingTransport:
    def __init__(self):
        self.calls: list[list[bytes]] = []

    def writelines(self, parts):
        self.calls.append([bytes(p) for p in parts])


def test_a_large_response_is_written_in_pieces_with_its_bytes_in_order():
    parts = [b"\0\0\0\x10header", os.urandom(1 << 20), b"tail", os.urandom(3 * _TLS_PIECE + 7)]
    t = RecordingTransport()
    _write_in_pieces(t, parts)
    assert b"".join(b"".join(call) for call in t.calls) == b"".join(parts)
    sizes = [sum(map(len, call)) for call in t.calls]
    assert len(sizes) >= (sum(map(len, parts)) // _TLS_PIECE)
    assert max(sizes) < 2 * _TLS_PIECE
    assert all(len(piece) <= _TLS_PIECE for call in t.calls for piece in call)


def test_small_responses_go_in_one_call_and_memoryviews_and_bytearrays_are_accepted():
    t = RecordingTransport()
    _write_in_pieces(t, [b"a" * 10, bytearray(b"b" * 20), memoryview(b"c" * 30)])
    assert t.calls == [[b"a" * 10, b"b" * 20, b"c" * 30]]
    t = RecordingTransport()
    _write_in_pieces(t, [memoryview(b"x" * (_TLS_PIECE * 2))])
    assert t.calls == [[b"x" * _TLS_PIECE], [b"x" * _TLS_PIECE]]
