"""Producer ids for idempotent producers, unique across restarts (Kafka's ProducerIdManager).

Ids are handed out from blocks of ``BLOCK_SIZE``; the end of the current block is persisted
(atomically) before any id of it is used, so a restart, clean or not, starts past every id
ever handed out. File: ``<log dir>/producer-id-block`` holding ``version next_block_start``.
Thread-safe.
"""

from __future__ import annotations

import threading
from pathlib import Path

from strata.common.files import atomic_write

BLOCK_SIZE = 1000
FILE_NAME = "producer-id-block"


class ProducerIdManager:
    def __init__(self, log_dir: Path):
        self._path = Path(log_dir) / FILE_NAME
        self._lock = threading.Lock()
        self._next = self._block_end = self._read()

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
                self._block_end = self._next + BLOCK_SIZE
                atomic_write(self._path, f"0 {self._block_end}\n".encode())
            pid = self._next
            self._next += 1
            return pid
