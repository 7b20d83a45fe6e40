"""Issue 48 on a real `strata serve` process: Kafka's broker metrics on the metrics endpoint
after a confluent-kafka produce and consume (BrokerTopicMetrics with exact message counts,
RequestMetrics for Produce and FetchConsumer), an unknown key warned about with the nearest known
one, a bad value stopping the broker with one line, and Kafka's kafka-configs describing
broker.rack's value."""

from __future__ import annotations

import re
import urllib.request

import pytest

from broker_process import BrokerProcess, free_port
from kafka_tools import KAFKA_CONFIGS, require_kafka_dist, run_kafka_class
from support.waiting import eventually

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "metered"
MESSAGES = 250
RACK = "rack-7f"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data = tmp_path_factory.mktemp("metered")
    port = free_port()
    with BrokerProcess(data, {"strata.metrics.listener": f"http://127.0.0.1:{port}",
                              "broker.rack": RACK, "log.retension.hours": "24"}) as b:
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def scrape(broker) -> dict[str, float]:
    """Every sample of the endpoint: 'name{labels}' -> value."""
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_produce_and_consume_show_in_broker_topic_and_request_metrics(broker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for i in range(MESSAGES):
        producer.produce(TOPIC, value=b"v" * 100, key=str(i).encode())
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "metered-group",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got = []

    def consumed() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg)
        return len(got) >= MESSAGES
    try:
        eventually(consumed, "every message consumed", 60)
    finally:
        consumer.close()

    m = scrape(broker)
    topic = f'{{topic="{TOPIC}"}}'
    assert m[f"kafka_server_BrokerTopicMetrics_MessagesInPerSec_total{topic}"] == MESSAGES
    bytes_in = m[f"kafka_server_BrokerTopicMetrics_BytesInPerSec_total{topic}"]
    assert MESSAGES * 100 < bytes_in < MESSAGES * 200   # values plus batch and record framing
    assert m["kafka_server_BrokerTopicMetrics_BytesInPerSec_total"] >= bytes_in   # all topics
    assert m[f"kafka_server_BrokerTopicMetrics_BytesOutPerSec_total{topic}"] >= bytes_in
    produces = m[f"kafka_server_BrokerTopicMetrics_TotalProduceRequestsPerSec_total{topic}"]
    assert 1 <= produces <= MESSAGES
    assert m[f"kafka_server_BrokerTopicMetrics_FailedProduceRequestsPerSec_total{topic}"] == 0
    assert m[f"kafka_server_BrokerTopicMetrics_TotalFetchRequestsPerSec_total{topic}"] >= 1

    def requests(name: str) -> float:
        return sum(v for k, v in m.items()
                   if k.startswith("kafka_network_RequestMetrics_RequestsPerSec_total{")
                   and f'request="{name}"' in k)
    assert requests("Produce") == produces   # one partition per Produce request here
    assert requests("FetchConsumer") >= 1 and requests("Metadata") >= 1
    assert m['kafka_network_RequestMetrics_ErrorsPerSec_total{error="NONE",request="Produce"}'] \
        == produces
    assert m['kafka_network_RequestMetrics_TotalTimeMs_count{request="Produce"}'] == produces
    assert m['kafka_network_RequestMetrics_TotalTimeMs_sum{request="Produce"}'] > 0
    assert m["kafka_server_ReplicaManager_LeaderCount"] >= 1
    assert m["kafka_server_ReplicaManager_UnderReplicatedPartitions"] == 0
    assert m["kafka_controller_KafkaController_ActiveControllerCount"] == 1
    assert m["kafka_controller_KafkaController_OfflinePartitionsCount"] == 0
    assert m['kafka_server_socket_server_metrics_connection_count{listener="PLAINTEXT"}'] >= 1
    assert 0 <= m["strata_network_EventLoop_AvgIdlePercent"] <= 1
    producer.flush(5)


def test_an_unknown_key_is_warned_about_with_the_nearest_known_key(broker) -> None:
    assert re.search(r"WARNING .*unknown broker config 'log\.retension\.hours' \(--override\) "
                     r"is ignored; did you mean 'log\.retention\.hours'\?", broker.output())
    assert "KafkaConfig values:" in broker.output()


def test_kafka_configs_describes_the_rack_of_the_broker(broker) -> None:
    require_kafka_dist()
    result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--describe",
                             "--entity-type", "brokers", "--entity-name", "1", "--all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"^\s*broker\.rack={RACK} sensitive=false", result.stdout, re.M), result.stdout


def test_a_bad_value_stops_the_broker_with_one_line_naming_the_key(tmp_path) -> None:
    b = BrokerProcess(tmp_path, {"log.retention.hours": "abc"}).launch()
    try:
        eventually(lambda: b.proc.poll() is not None, "the broker exits", 60)
    finally:
        code = b.stop()
    assert code == 1
    lines = b.output().strip().splitlines()
    assert lines == ["strata: invalid value 'abc' for broker config 'log.retention.hours': "
                     "expected an integer from -2147483648 to 2147483647"]
