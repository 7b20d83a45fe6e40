"""Ports for servers a test starts later (brokers, ZooKeeper, Kafka), found free now.

Without pytest-xdist: the kernel's choice (bind to port 0). Under xdist, each worker takes ports
from a block of its own below the kernel's ephemeral range (32768+ here), so a port one worker
just found free is never handed by the kernel to another worker's bind(0) or outgoing
connection before the server it was found for binds it."""

from __future__ import annotations

import itertools
import os
import socket

BLOCK_START, BLOCK_SIZE = 10_000, 2_000


def _worker_block() -> range | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    start = BLOCK_START + int(worker[2:]) * BLOCK_SIZE
    return range(start, start + BLOCK_SIZE)


_block = _worker_block()
_next = itertools.cycle(_block) if _block is not None else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    if _next is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(BLOCK_SIZE):
        port = next(_next)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {_block}")
