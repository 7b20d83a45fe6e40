"""docs/metrics.md and the metrics endpoint agree: every name the endpoint exports (as the text
exposition spells it: counters with ``_total``, summaries by their family name) has a row in the
reference, and every row names something the endpoint exports. The endpoint is built as the
broker builds it (strata.broker.broker: start_metrics_server and Broker.build), with each
collector's data-dependent names brought out by sources that report every key they can."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import ProcessCollector

from strata.log.flush_stats import LogFlushStats
from strata.log.log_cleaner import LogCleaner
from strata.security.session import AuthenticationStats
from strata.server.broker_metrics import BrokerTopicStats, EventLoopIdle, RequestStats
from strata.server.log_cleaner_metrics import LogCleanerCollector
from strata.server.metrics import (
    AuthenticationCollector, BrokerMetricsCollector, ClientQuotaCollector, KafkaBrokerCollector,
    StatsCollector)
from strata.server.purgatory import PartitionWatchers
from strata.tiered.storage.chunk_cache import ChunkCache, ChunkCacheConfig

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


class _Quotas:
    """Every (group, attribute) ClientQuotaManager.metrics reports."""

    def metrics(self):
        tags = ("u", "c")
        return [("Produce", "byte-rate", tags, 1.0), ("Fetch", "byte-rate", tags, 1.0),
                ("Request", "request-time", tags, 1.0),
                ("ControllerMutation", "mutation-rate", tags, 1.0),
                ("ControllerMutation", "tokens", tags, 1.0),
                *[(g, "throttle-time", tags, 0.0)
                  for g in ("Produce", "Fetch", "Request", "ControllerMutation")],
                *[(g, "queue-size", ("", ""), 0.0)
                  for g in ("Produce", "Fetch", "Request", "ControllerMutation")]]


def _exposed(family) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def endpoint_names(tmp_path) -> set[str]:
    cleaner = LogCleaner.from_properties({"log.dirs": str(tmp_path)}, lambda: [])
    cleaner.last_stats = SimpleNamespace(elapsed_s=1.0, buffer_utilization=0.5,
                                         bytes_written=1, bytes_read=2)
    cache = ChunkCache(ChunkCacheConfig(memory_size=1 << 20))
    collectors = [
        BrokerMetricsCollector(lambda: []),
        ClientQuotaCollector(_Quotas()),
        AuthenticationCollector(AuthenticationStats()),
        LogCleanerCollector(cleaner),
        StatsCollector("strata_remote_chunk_cache", cache.stats, gauges=cache.LEVEL_STATS),
        KafkaBrokerCollector(topic_stats=BrokerTopicStats(), request_stats=RequestStats(),
                             watchers=PartitionWatchers(), loop_idle=EventLoopIdle(),
                             flush_stats=LogFlushStats()),
        ProcessCollector(registry=None),
    ]
    names = set()
    for collector in collectors:
        families = list(collector.collect())
        if hasattr(collector, "describe"):
            families += list(collector.describe())
        names.update(_exposed(f) for f in families)
    cache.close()
    return names


def documented_names() -> set[str]:
    """The first cell of every table row of the reference: `name`."""
    rows = re.findall(r"^\|\s*`([A-Za-z_:][A-Za-z0-9_:]*)`\s*\|", REFERENCE.read_text(), re.M)
    return set(rows)


def test_every_exported_name_is_documented_and_every_documented_name_exported(tmp_path) -> None:
    exported, documented = endpoint_names(tmp_path), documented_names()
    assert exported - documented == set(), "exported, not in docs/metrics.md"
    assert documented - exported == set(), "in docs/metrics.md, not exported"


def test_the_reference_names_kafkas_broker_metrics() -> None:
    documented = documented_names()
    for name in ("kafka_server_BrokerTopicMetrics_BytesInPerSec_total",
                 "kafka_server_BrokerTopicMetrics_MessagesInPerSec_total",
                 "kafka_network_RequestMetrics_RequestsPerSec_total",
                 "kafka_network_RequestMetrics_TotalTimeMs",
                 "kafka_server_ReplicaManager_UnderReplicatedPartitions",
                 "kafka_controller_KafkaController_ActiveControllerCount",
                 "kafka_server_DelayedOperationPurgatory_PurgatorySize",
                 "kafka_log_LogFlushStats_LogFlushRateAndTimeMs"):
        assert name in documented
