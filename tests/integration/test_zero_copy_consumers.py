"""Real consumers read a multi-segment topic through the broker's zero-copy (sendfile) Fetch.

The topic has 1 MiB segments and records of varied sizes; each consumer asks for small fetch
sizes, so responses end at segment ends and ``max_bytes`` cuts batches. Every consumer must get
every record, in order, byte for byte.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker_process import BrokerProcess
from kafka_tools import CONSOLE_CONSUMER, require_kafka_dist, run_kafka_class

kafka = pytest.importorskip("kafka")

TOPIC = "zero-copy"
COUNT = 3000
DEADLINE_S = 60


def value(i: int) -> str:
    return f"{i:06d}-" + "abcdefghij"[i % 10] * (100 + (i * 977) % 2900)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("zero-copy")) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={"segment.bytes": str(1 << 20)})])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5,
                             "batch.size": 64 * 1024})
        for i in range(COUNT):
            producer.produce(TOPIC, value(i).encode())
            producer.poll(0)
        assert producer.flush(30) == 0
        assert len(list((b.data_dir / "kafka-logs" / f"{TOPIC}-0").glob("*.log"))) >= 4
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def test_confluent_kafka_reads_every_record_through_sendfile(broker):
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "zc-confluent",
                         "auto.offset.reset": "earliest", "fetch.max.bytes": 100_000,
                         "message.max.bytes": 100_000,
                         "max.partition.fetch.bytes": 70_000, "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < COUNT and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value().decode())
    finally:
        consumer.close()
    assert got == [value(i) for i in range(COUNT)]


def test_kafka_python_reads_every_record_through_sendfile(broker):
    consumer = kafka.KafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap,
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   group_id="zc-kafka-python", fetch_max_bytes=100_000,
                                   max_partition_fetch_bytes=50_000, consumer_timeout_ms=10_000)
    try:
        got = [m.value.decode() for m in consumer]
    finally:
        consumer.close()
    assert got == [value(i) for i in range(COUNT)]


@pytest.mark.slow
def test_kafka_console_consumer_reads_every_record_through_sendfile(broker):
    require_kafka_dist()
    result = run_kafka_class(CONSOLE_CONSUMER, "--bootstrap-server", broker.bootstrap,
                             "--topic", TOPIC, "--from-beginning", "--max-messages", str(COUNT),
                             "--command-property", "max.partition.fetch.bytes=60000",
                             "--command-property", "fetch.max.bytes=90000", timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [value(i) for i in range(COUNT)]
