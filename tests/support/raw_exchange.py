"""Mutated raw byte exchanges for the SASL fuzz tests: Kafka frames with bits flipped, cut short
or with a boundary integer written over, sent on a fresh connection that is drained until the
broker closes it."""

from __future__ import annotations

import random
import socket

BOUNDARY_INTS = (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\0\0\0\0")


def mutate(rng: random.Random, data: bytes) -> bytes:
    """``data`` (frames, so its first 4 bytes are a length prefix, kept) with 1-4 bits flipped,
    truncated, or a boundary int32 written over 4 bytes, each a third of the time."""
    out = bytearray(data)
    kind = rng.randrange(3)
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(4, len(out))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        out = out[:rng.randrange(4, len(out))]
    else:
        i = rng.randrange(4, len(out) - 4)
        out[i:i + 4] = rng.choice(BOUNDARY_INTS)
    return bytes(out)


def send_and_drain(port: int, data: bytes, timeout: float = 10) -> None:
    """Send ``data``, half-close, and read until the broker closes (it answers, then closes, or
    closes at once); a connection left hanging raises socket.timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
