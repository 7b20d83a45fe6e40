"""Unmodified Kafka clients produce to and consume from a live Strata broker."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from broker_process import BrokerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path) as b:
        yield b


def kcat(*args: str, input: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed (make test installs it from Debian)")
    return subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout,
                          check=True)


def test_kcat_lists_metadata_produces_and_consumes_with_keys_and_headers(broker):
    lines = b"".join(b"key-%d:value-%d\n" % (i, i) for i in range(100))
    kcat("-b", broker.bootstrap, "-P", "-t", "orders", "-K", ":", "-H", "source=kcat", input=lines)
    meta = json.loads(kcat("-b", broker.bootstrap, "-L", "-J").stdout)
    (topic,) = [t for t in meta["topics"] if t["topic"] == "orders"]
    assert [p["partition"] for p in topic["partitions"]] == [0]
    out = kcat("-b", broker.bootstrap, "-C", "-t", "orders", "-e", "-J").stdout.decode().splitlines()
    got = [json.loads(line) for line in out]
    assert [(m["offset"], m["key"], m["payload"]) for m in got] == \
        [(i, f"key-{i}", f"value-{i}") for i in range(100)]
    assert all(m["headers"] == ["source", "kcat"] for m in got)


def test_kcat_queries_offsets_by_timestamp(broker):
    kcat("-b", broker.bootstrap, "-P", "-t", "times", input=b"a\nb\nc\n")
    out = kcat("-b", broker.bootstrap, "-Q", "-t", "times:0:0").stdout.decode()
    assert "times [0] offset 0" in out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_idempotent_producer_round_trips_every_codec(broker, codec):
    ck = pytest.importorskip("confluent_kafka")
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                            "compression.type": codec, "linger.ms": 5})
    sent = [(f"k{i}".encode(), f"v{i}".encode() * (i % 7 + 1), [("h", str(i).encode())], 1_700_000_000_000 + i)
            for i in range(500)]
    for k, v, h, ts in sent:
        producer.produce("codec-" + codec, value=v, key=k, headers=h, timestamp=ts)
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + codec,
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition("codec-" + codec, 0, 0)])
    got = []
    while len(got) < len(sent):
        msg = consumer.poll(10)
        assert msg is not None, f"stalled after {len(got)} records"
        assert msg.error() is None, msg.error()
        got.append((msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
    consumer.close()
    assert got == sent


def test_confluent_kafka_idempotent_producer_gets_each_record_once_across_a_restart(tmp_path):
    ck = pytest.importorskip("confluent_kafka")
    broker = BrokerProcess(tmp_path).start()
    try:
        producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                                "linger.ms": 2})
        for i in range(300):
            producer.produce("idem", value=b"%d" % i)
        assert producer.flush(30) == 0
        broker.stop()
        broker.start()
        for i in range(300, 400):
            producer.produce("idem", value=b"%d" % i)
        assert producer.flush(60) == 0
        out = kcat("-b", broker.bootstrap, "-C", "-t", "idem", "-e", "-f", "%s\n").stdout.split()
        assert out == [b"%d" % i for i in range(400)]
        producer_ids = {h.producer_id for h in _batch_headers(tmp_path, "idem-0")}
        assert len(producer_ids) == 1 and producer_ids != {-1}
    finally:
        broker.stop()


def _batch_headers(tmp_path, partition_dir):
    from strata.protocol import records as rec
    for seg in sorted((tmp_path / "kafka-logs" / partition_dir).glob("*.log")):
        yield from rec.iter_headers(seg.read_bytes())
