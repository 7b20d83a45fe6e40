"""A log manager that shuts down closes every log once, with no deletion under way or
started (issue 51, part 3: a stopping broker renamed logs to ``-delete`` while its log manager
closed them, and died writing a producer snapshot into a directory that was gone)."""

from __future__ import annotations

import threading
import time

from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import CLEAN_SHUTDOWN_FILE, DELETE_DIR_SUFFIX, LogManager
from strata.protocol import records as rec

DEADLINE_S = 10


class KeepScheduler:
    """Deleted directories stay (as ``-delete``) for the test to see."""

    def schedule_once(self, name, fn, delay_ms=0):
        pass


def _batch() -> bytes:
    return rec.build_batch([rec.SimpleRecord(b"v", b"k")])


def test_a_log_manager_shutting_down_deletes_no_log(tmp_path):
    manager = LogManager([tmp_path], LogConfig({}), scheduler=KeepScheduler())
    manager.startup()
    manager.get_or_create_log(TopicPartition("t", 0)).append_as_leader(_batch(), leader_epoch=0)
    manager.shutdown()
    manager.delete_log(TopicPartition("t", 0))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["t-0"]
    reopened = LogManager([tmp_path], LogConfig({}))
    reopened.startup()
    assert reopened.had_clean_shutdown[tmp_path]
    assert reopened.get_log(TopicPartition("t", 0)).log_end_offset == 1


def test_a_log_manager_shutdown_waits_for_a_deletion_under_way(tmp_path):
    manager = LogManager([tmp_path], LogConfig({}), scheduler=KeepScheduler())
    manager.startup()
    doomed = manager.get_or_create_log(TopicPartition("t", 0))
    manager.get_or_create_log(TopicPartition("t", 1)).append_as_leader(_batch(), leader_epoch=0)
    closing, go_on = threading.Event(), threading.Event()
    close = doomed.local_log.close

    def slow_close():
        closing.set()
        assert go_on.wait(DEADLINE_S)
        close()
    doomed.local_log.close = slow_close
    errors = []

    def run(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    deleter = threading.Thread(target=run, args=(lambda: manager.delete_log(TopicPartition("t", 0)),))
    deleter.start()
    assert closing.wait(DEADLINE_S)
    stopper = threading.Thread(target=run, args=(manager.shutdown,))
    stopper.start()
    time.sleep(0.1)
    assert stopper.is_alive()   # waits for the deletion
    go_on.set()
    deleter.join(DEADLINE_S)
    stopper.join(DEADLINE_S)
    assert errors == []
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert names[0].startswith("t-0.") and names[0].endswith(DELETE_DIR_SUFFIX)
    assert names[1:] == ["t-1"]
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
