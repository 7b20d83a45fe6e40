"""Child process of the cleaner crash test: cleans a log, SIGKILLed at its Nth file operation.

usage: cleaner_crash_child.py LOG_DIR NOW_MS CHECKPOINT KILL_AT (0: never; prints the count)
"""

import os
import signal
import sys
from pathlib import Path

from strata.common.clock import MockClock
from strata.common.types import TopicPartition
from strata.log.log_cleaner import Cleaner, OffsetMap, log_to_clean
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog


def main() -> None:
    directory, now_ms, checkpoint, kill_at = Path(sys.argv[1]), *map(int, sys.argv[2:5])
    config = LogConfig({"cleanup.policy": "compact", "internal.segment.bytes": 600,
                        "delete.retention.ms": 60_000, "file.delete.delay.ms": 0})
    clock = MockClock(now_ms)
    ulog = UnifiedLog(directory, config, clock=clock)
    calls = 0

    def counted(fn):
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapper

    for name in ("rename", "fsync", "pwrite", "pwritev", "ftruncate", "unlink"):
        setattr(os, name, counted(getattr(os, name)))
    Cleaner(OffsetMap(1 << 20), clock=clock).clean(
        log_to_clean(TopicPartition("compacted", 0), ulog, checkpoint, now_ms))
    print(calls)


if __name__ == "__main__":
    main()
