"""Prometheus collector for the log cleaner: Kafka's ``kafka.log:type=LogCleaner`` and
``type=LogCleanerManager`` gauges as ``kafka_log_LogCleaner_<name>`` and
``kafka_log_LogCleanerManager_<name>`` (dashes become underscores)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

_MANAGER = {"max-dirty-percent", "time-since-last-run-ms"}


class LogCleanerCollector:
    def __init__(self, cleaner):
        self._cleaner = cleaner

    def collect(self):
        for name, value in self._cleaner.metrics().items():
            group = "LogCleanerManager" if name in _MANAGER else "LogCleaner"
            yield GaugeMetricFamily(f"kafka_log_{group}_{name.replace('-', '_')}",
                                    f"Kafka's {group} {name}", value=value)
