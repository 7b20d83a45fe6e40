"""KIP-1257's partition size in percent of retention (Kafka 4.4's gauges) on the metrics
endpoint's collector, over a real tiered log and remote log manager: the local log against
``retention.bytes`` on a plain topic, and on a tiered one the whole partition (uncopied local
segments plus the remote tier) against ``retention.bytes`` and the local log against
``local.retention.bytes``; and KIP-1066's cordoned log dir count."""

from __future__ import annotations

from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch
from strata.server.metrics import BrokerMetricsCollector
from strata.common.types import TopicPartition
from test_tiered_observability_units import scrape
from tiered_env import TieredEnv

PARTITION = (("partition", "0"), ("topic", "orders"))
RLM = "kafka_log_remote_RemoteLogManager_"


def test_a_tiered_partition_reports_its_total_and_local_size_in_percent_of_retention(tmp_path):
    env = TieredEnv(tmp_path, log_props={"retention.bytes": "20000",
                                         "local.retention.bytes": "6000"})
    try:
        env.produce(60)
        env.copy()
        segments = env.log.local_log.segments
        highest = env.log.highest_offset_in_remote_storage
        remote = sum(m.segment_size_in_bytes for m in env.rlmm.list_remote_log_segments(
            env.part.tip))
        local = sum(s.size for s in segments)
        only_local = sum(s.size for s in segments if s.base_offset > highest)
        assert remote > 0 and 0 < only_local < local

        m = scrape(BrokerMetricsCollector(env.logs, env.rlm, cordoned_log_dirs=lambda: 2))
        assert m[(RLM + "RetentionSizeInPercent", PARTITION)] == (only_local + remote) * 100 // 20000
        assert m[(RLM + "LocalRetentionSizeInPercent", PARTITION)] == local * 100 // 6000
        assert m[("kafka_log_Log_RetentionSizeInPercent", PARTITION)] == 0   # the RLM's job
        assert m[("kafka_log_LogManager_CordonedLogDirectoryCount", ())] == 2

        env.log.delete_old_segments()   # local retention: the total stays, the local share drops
        m = scrape(BrokerMetricsCollector(env.logs, env.rlm))
        assert m[(RLM + "RetentionSizeInPercent", PARTITION)] == (only_local + remote) * 100 // 20000
        assert m[(RLM + "LocalRetentionSizeInPercent", PARTITION)] == \
            sum(s.size for s in env.log.local_log.segments) * 100 // 6000
    finally:
        env.close()


def test_a_plain_partition_reports_its_size_in_percent_of_retention_bytes(tmp_path):
    def plain(retention_bytes: str) -> UnifiedLog:
        ulog = UnifiedLog(tmp_path / f"orders-{retention_bytes}", LogConfig({
            "retention.bytes": retention_bytes, "internal.segment.bytes": "4096"}),
            topic_partition=TopicPartition("orders", 0))
        for i in range(30):
            ulog.append_as_leader(build_batch([SimpleRecord(b"v" * 100, b"k%d" % i)]), 0)
        ulog.update_high_watermark(ulog.log_end_offset)
        return ulog

    limited = plain("5000")
    m = scrape(BrokerMetricsCollector(lambda: [limited], None))
    assert m[("kafka_log_Log_RetentionSizeInPercent", PARTITION)] == limited.size * 100 // 5000
    assert not any(name.startswith(RLM) for name, _ in m)
    unlimited = plain("-1")
    m = scrape(BrokerMetricsCollector(lambda: [unlimited], None))
    assert m[("kafka_log_Log_RetentionSizeInPercent", PARTITION)] == 0
    limited.close()
    unlimited.close()
