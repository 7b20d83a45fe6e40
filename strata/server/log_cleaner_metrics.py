"""Prometheus collector for the log cleaner: Kafka's ``kafka.log:type=LogCleaner`` and
``type=LogCleanerManager`` gauges as ``kafka_log_LogCleaner_<name>`` and
``kafka_log_LogCleanerManager_<name>`` (dashes become underscores).

The per log dir gauges (``kafka.log:type=LogCleanerManager,name=uncleanable-partitions-count,
logDirectory=<dir>`` and ``name=uncleanable-bytes``) keep Kafka's tag as the label:
``kafka_log_LogCleanerManager_uncleanable_partitions_count{logDirectory="<dir>"}``."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

_MANAGER = {"max-dirty-percent", "time-since-last-run-ms", "uncleanable-partitions-count",
            "uncleanable-bytes"}


def _family(name: str, labels: list[str] | None = None, value: float | None = None):
    group = "LogCleanerManager" if name in _MANAGER else "LogCleaner"
    return GaugeMetricFamily(f"kafka_log_{group}_{name.replace('-', '_')}",
                             f"Kafka's {group} {name}", value=value, labels=labels)


class LogCleanerCollector:
    def __init__(self, cleaner):
        self._cleaner = cleaner

    def collect(self):
        for name, value in self._cleaner.metrics().items():
            yield _family(name, value=value)
        for name, per_dir in self._cleaner.log_dir_metrics().items():
            family = _family(name, labels=["logDirectory"])
            for log_dir, value in sorted(per_dir.items()):
                family.add_metric([log_dir], value)
            yield family
