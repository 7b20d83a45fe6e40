"""A cluster broker's high watermarks survive its restart (Kafka's
``replication-offset-checkpoint``): a replica restarted, cleanly or not, takes for committed
only what was committed before, never everything that survived in its log; one broker alone
(its own ISR) still takes its whole log."""

from __future__ import annotations

from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import HIGH_WATERMARK_CHECKPOINT, LogManager
from strata.protocol.records import SimpleRecord, build_batch

TP = TopicPartition("t", 0)


def write(manager: LogManager, n: int, committed: int) -> None:
    ulog = manager.get_or_create_log(TP)
    for i in range(n):
        ulog.append_as_leader(build_batch([SimpleRecord(b"v%d" % i)]), 0)
    ulog.update_high_watermark(committed)


def test_a_replicas_restart_restores_its_checkpointed_high_watermark(tmp_path):
    manager = LogManager([tmp_path], LogConfig({}), replicated=True)
    manager.startup()
    write(manager, 10, committed=6)
    manager.checkpoint_high_watermarks()
    text = (tmp_path / HIGH_WATERMARK_CHECKPOINT).read_text().split("\n")
    assert text[:3] == ["0", "1", "t 0 6"]                      # Kafka's file format
    manager.get_log(TP).update_high_watermark(8)                 # not checkpointed: a crash
    again = LogManager([tmp_path], LogConfig({}), replicated=True)
    again.startup()
    ulog = again.get_log(TP)
    assert (ulog.log_end_offset, ulog.high_watermark) == (10, 6)
    ulog.update_high_watermark(9)
    again.shutdown()                                             # clean: written at shutdown
    last = LogManager([tmp_path], LogConfig({}), replicated=True)
    last.startup()
    assert last.get_log(TP).high_watermark == 9
    last.shutdown()


def test_one_broker_takes_its_whole_log_for_committed_after_a_restart(tmp_path):
    manager = LogManager([tmp_path], LogConfig({}))
    manager.startup()
    write(manager, 10, committed=6)
    manager.checkpoint()
    assert not (tmp_path / HIGH_WATERMARK_CHECKPOINT).exists()
    again = LogManager([tmp_path], LogConfig({}))
    again.startup()
    assert again.get_log(TP).high_watermark == 10
    again.shutdown()
