"""The machine's physical ceilings, measured next to a benchmark so its figures can be read as a
fraction of what the hardware allows: page-cache read, fsync'd write and loopback TCP
bandwidth, each in MiB/s."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

MIB = 1024 * 1024
_BLOCK = MIB


def page_cache_read(directory: Path, size_mib: int) -> float:
    """Sequential 1 MiB preads of a file that is already in the page cache."""
    path = directory / f".ceiling-read-{os.getpid()}"
    block = os.urandom(_BLOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(size_mib):
            os.pwrite(fd, block, i * _BLOCK)
        buf = bytearray(_BLOCK)
        for i in range(size_mib):              # warm: every page cached
            os.preadv(fd, [buf], i * _BLOCK)
        t0 = time.perf_counter()
        for i in range(size_mib):
            os.preadv(fd, [buf], i * _BLOCK)
        return size_mib / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def fsynced_write(directory: Path, size_mib: int, sync_every_mib: int = 64) -> float:
    """1 MiB writes to a new file with an fdatasync every ``sync_every_mib`` and at the end:
    what the disk accepts durably."""
    path = directory / f".ceiling-write-{os.getpid()}"
    block = os.urandom(_BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for i in range(size_mib):
            os.write(fd, block)
            if (i + 1) % sync_every_mib == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        return size_mib / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def loopback_tcp(size_mib: int) -> float:
    """One TCP connection on 127.0.0.1, 1 MiB sends from one thread, receives in another."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        received = [0]

        def sink() -> None:
            conn, _ = server.accept()
            with conn:
                buf = bytearray(_BLOCK)
                while True:
                    n = conn.recv_into(buf)
                    if not n:
                        return
                    received[0] += n

        t = threading.Thread(target=sink, daemon=True)
        t.start()
        block = os.urandom(_BLOCK)
        with socket.create_connection(("127.0.0.1", port)) as c:
            t0 = time.perf_counter()
            for _ in range(size_mib):
                c.sendall(block)
            c.shutdown(socket.SHUT_WR)
            t.join()
            elapsed = time.perf_counter() - t0
    if received[0] != size_mib * _BLOCK:
        raise RuntimeError(f"loopback: received {received[0]} of {size_mib * _BLOCK} bytes")
    return size_mib / elapsed


def measure(directory: Path, size_mib: int = 1024) -> dict[str, float]:
    """All three ceilings, MiB/s; files go to ``directory`` (the brokers' disk)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"page-cache read MiB/s": page_cache_read(directory, size_mib),
            "fsync'd write MiB/s": fsynced_write(directory, max(1, size_mib // 2)),
            "loopback TCP MiB/s": loopback_tcp(size_mib)}
