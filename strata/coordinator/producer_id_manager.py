"""Producer ids for idempotent producers, unique across restarts (Kafka's ProducerIdManager).

Ids are handed out from blocks of ``BLOCK_SIZE``; the end of the current block is persisted
(atomically) before any id of it is used, so a restart, clean or not, starts past every id
ever handed out. File: ``<log dir>/producer-id-block`` holding ``version next_block_start``.
Thread-safe.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from strata.common.files import atomic_write

BLOCK_SIZE = 1000
FILE_NAME = "producer-id-block"


class ProducerIdManager:
    def __init__(self, log_dir: Path,
                 allocate_block: Callable[[], tuple[int, int]] | None = None):
        """``allocate_block`` returns a new (first id, size) each call (the cluster's blocks)."""
        self._path = Path(log_dir) / FILE_NAME
        self._lock = threading.Lock()
        self._allocate = allocate_block
        self._next = self._block_end = 0 if allocate_block is not None else self._read()

    def _read(self) -> int:
        if not self._path.exists():
            return 0
        version, value = self._path.read_text().split()
        if version != "0":
            raise ValueError(f"unknown {self._path} version {version}")
        return int(value)

    def generate(self) -> int:
        with self._lock:
            if self._next >= self._block_end:
                if self._allocate is not None:
                    first, size = self._allocate()
                    self._next, self._block_end = first, first + size
                else:
                    self._block_end = self._next + BLOCK_SIZE
                    atomic_write(self._path, f"0 {self._block_end}\n".encode())
            pid = self._next
            self._next += 1
            return pid
