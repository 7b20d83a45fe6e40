"""Kafka 4.4's tiered-storage additions on a Strata broker process, through Kafka's own tools
and confluent-kafka: KIP-1241 delayed upload (``kafka-configs`` sets, refuses and describes
``remote.copy.lag.ms`` and the dynamic ``log.remote.copy.lag.*``; a produced tiered topic
copies only its segments older than the lag), KIP-1066 cordoned log dirs (``kafka-configs``
cordons a dir, ``kafka-log-dirs`` shows new partitions placed only in the other one, a
DescribeLogDirs v5 says IsCordoned), and where the remote tier's size shows: not in
DescribeLogDirs (local bytes only, as in Kafka 4.4) but in the metrics endpoint, with
KIP-1257's size-in-percent-of-retention gauges.

One broker, two log dirs, a filesystem remote tier, a 200 ms tiering interval.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from broker_process import BrokerProcess, free_port
from kafka_tools import (
    KAFKA_CONFIGS, LOG_DIRS, _jar_has_class, kafka_libs, require_kafka_dist, run_kafka_class)
from support.waiting import eventually, never
from tiered_support import TIERED_BROKER, offsets

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

HOUR = 3_600_000
LAGGED = {"remote.storage.enable": "true", "internal.segment.bytes": str(16 * 1024),
          "segment.index.bytes": "4096", "remote.copy.lag.ms": str(HOUR),
          "local.retention.ms": str(2 * HOUR)}


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data = tmp_path_factory.mktemp("kafka44")
    dirs = [data / "logs-a", data / "logs-b"]
    port = free_port()
    with BrokerProcess(data, {**TIERED_BROKER, "log.dirs": ",".join(map(str, dirs)),
                              "strata.metrics.listener": f"http://127.0.0.1:{port}"}) as b:
        b.dirs, b.metrics_url = dirs, f"http://127.0.0.1:{port}"
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def tool(main_class: str, *args: str) -> str:
    result = run_kafka_class(main_class, *args)
    assert result.returncode == 0, f"{main_class} {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def config_command() -> str:
    """kafka-configs' main class (Kafka 4.4 moved it to the tools module)."""
    moved = "org.apache.kafka.tools.ConfigCommand"
    return moved if _jar_has_class(kafka_libs(), moved) else KAFKA_CONFIGS


def configs(b, entity_type: str, name: str, *args: str) -> str:
    return tool(config_command(), "--bootstrap-server", b.bootstrap, "--entity-type", entity_type,
                "--entity-name", name, *args)


def create(b, topic: str, partitions: int = 1, **topic_configs) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})   # outlives its future
    admin.create_topics([NewTopic(topic, partitions, 1, config=topic_configs)])[topic].result(30)


def produce(b, topic: str, start: int, n: int, ts: int) -> None:
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5,
                     "batch.size": 4096})
    for i in range(start, start + n):
        p.produce(topic, key=b"k%d" % i, value=b"v" * 200, timestamp=ts + i - start)
    assert p.flush(30) == 0


def scrape(b) -> str:
    with urllib.request.urlopen(f"{b.metrics_url}/metrics", timeout=10) as r:
        return r.read().decode()


def gauge(text: str, name: str, topic: str) -> float | None:
    m = re.search(rf'^{name}\{{(?=[^}}]*topic="{topic}")[^}}]*\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_tiered_topic_copies_only_segments_older_than_its_copy_lag(broker):
    create(broker, "lagged", **LAGGED)
    now = int(time.time() * 1000)
    produce(broker, "lagged", 0, 300, now - 3 * HOUR)     # older than the lag (and local retention)
    produce(broker, "lagged", 300, 300, now)              # younger than the lag

    # the old segments are copied, then local retention (2 h) deletes them locally
    # (retention deletes the copied segments one task after another: wait until it has caught up)
    o = eventually(lambda: (o := offsets(broker.bootstrap, "lagged"))["local_start"] > 0
                   and o["local_start"] == o["tiered"] + 1 and o,
                   "old segments tiered and deleted locally", 60)
    assert 0 < o["tiered"] < 300 and o["start"] == 0
    never(lambda: offsets(broker.bootstrap, "lagged")["tiered"] >= 300,
          "a segment younger than remote.copy.lag.ms copied", 2)
    metrics = scrape(broker)
    assert gauge(metrics, "kafka_server_BrokerTopicMetrics_RemoteCopyLagSegments", "lagged") > 0
    # DescribeLogDirs (kafka-log-dirs) counts local bytes only, as Kafka 4.4 does; the remote
    # tier's size is the RemoteLogSizeBytes metric, with KIP-1257's percentages beside it
    out = tool(LOG_DIRS, "--bootstrap-server", broker.bootstrap, "--describe",
               "--topic-list", "lagged")
    (doc,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    sizes = [p["size"] for d in doc["brokers"][0]["logDirs"] for p in d["partitions"]]
    local = json.loads(urllib.request.urlopen(f"{broker.metrics_url}/tiered/lagged",
                                              timeout=10).read())["partitions"][0]
    assert sizes == [local["local_bytes"]]
    assert gauge(metrics, "kafka_server_BrokerTopicMetrics_RemoteLogSizeBytes", "lagged") > 0
    assert gauge(metrics, "kafka_log_remote_RemoteLogManager_LocalRetentionSizeInPercent",
                 "lagged") == 0   # local.retention.bytes unlimited
    assert gauge(metrics, "kafka_log_remote_RemoteLogManager_RetentionSizeInPercent",
                 "lagged") == 0   # retention.bytes unlimited

    # the lag lowered at runtime: the young inactive segments go too
    configs(broker, "topics", "lagged", "--alter", "--add-config", "remote.copy.lag.ms=0")
    eventually(lambda: offsets(broker.bootstrap, "lagged")["tiered"] >= 300,
               "young segments copied once the lag is 0", 60)


def test_kafka_configs_sets_refuses_and_describes_the_copy_lags(broker):
    create(broker, "lag-configs", **{**LAGGED, "remote.copy.lag.ms": "60000"})
    out = configs(broker, "topics", "lag-configs", "--describe")
    assert "remote.copy.lag.ms=60000" in out, out
    refused = run_kafka_class(config_command(), "--bootstrap-server", broker.bootstrap,
                              "--entity-type", "topics", "--entity-name", "lag-configs",
                              "--alter", "--add-config", f"remote.copy.lag.ms={3 * HOUR}")
    assert refused.returncode != 0
    assert ("Value must not exceed local.retention.ms (effective value: 7200000)"
            in refused.stdout + refused.stderr), refused.stdout + refused.stderr

    configs(broker, "brokers", "1", "--alter", "--add-config", "log.remote.copy.lag.bytes=1048576")
    try:
        out = configs(broker, "brokers", "1", "--describe")
        assert re.search(r"log.remote.copy.lag.bytes=1048576 sensitive=false synonyms=\{"
                         r"DYNAMIC_BROKER_CONFIG:log.remote.copy.lag.bytes=1048576", out), out
        out = configs(broker, "topics", "lag-configs", "--describe", "--all")
        assert re.search(r"remote.copy.lag.bytes=1048576 sensitive=false synonyms=\{"
                         r"DYNAMIC_BROKER_CONFIG:log.remote.copy.lag.bytes=1048576, "
                         r"DEFAULT_CONFIG:log.remote.copy.lag.bytes=-1\}", out), out
        assert re.search(r"remote.copy.lag.ms=60000 sensitive=false synonyms=\{"
                         r"DYNAMIC_TOPIC_CONFIG:remote.copy.lag.ms=60000, "
                         r"DEFAULT_CONFIG:log.remote.copy.lag.ms=0\}", out), out
    finally:
        configs(broker, "brokers", "1", "--alter", "--delete-config", "log.remote.copy.lag.bytes")


def is_cordoned(b) -> dict[str, bool]:
    """A DescribeLogDirs v5's IsCordoned per log dir."""
    from kio.schema.describe_log_dirs.v5.request import DescribeLogDirsRequest
    from kio.schema.describe_log_dirs.v5.response import DescribeLogDirsResponse
    from strata.net.connection import roundtrip
    response = roundtrip(b.bootstrap, DescribeLogDirsRequest(topics=None), DescribeLogDirsResponse)
    return {r.log_dir: r.is_cordoned for r in response.results}


def test_a_cordoned_log_dir_takes_no_new_partition_and_is_reported(broker):
    a, b = (str(d.absolute()) for d in broker.dirs)
    configs(broker, "brokers", "1", "--alter", "--add-config", f"cordoned.log.dirs={a}")
    try:
        assert is_cordoned(broker) == {a: True, b: False}
        create(broker, "spread", 4)
        out = tool(LOG_DIRS, "--bootstrap-server", broker.bootstrap, "--describe",
                   "--topic-list", "spread")
        (doc,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        placed = {d["logDir"]: sorted(p["partition"] for p in d["partitions"])
                  for d in doc["brokers"][0]["logDirs"]}
        assert placed == {a: [], b: [f"spread-{p}" for p in range(4)]}, placed
    finally:
        configs(broker, "brokers", "1", "--alter", "--delete-config", "cordoned.log.dirs")
    assert is_cordoned(broker) == {a: False, b: False}
