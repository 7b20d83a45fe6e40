"""A full log dir, with a real ``strata serve`` on a small tmpfs and unmodified clients.

While the disk is full, Produce and CreateTopics answer KAFKA_STORAGE_ERROR (retriable), so a
confluent-kafka producer keeps retrying instead of dropping its messages; the broker exports
``kafka_log_LogManager_OfflineLogDirectoryCount`` 1 and logs the failure once, without a
traceback per append. Once space is freed the same producer's messages are stored, the count
goes back to 0, and every acknowledged record reads back intact at its offset.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_process import BrokerProcess, free_port
from support.waiting import eventually

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

kafka = pytest.importorskip("kafka")

TOPIC = "filling"
OFFLINE = ("kafka_log_LogManager_OfflineLogDirectoryCount", ())
# librdkafka's debug line for a retriable KAFKA_STORAGE_ERROR
STORAGE_ERROR_TEXT = "Disk error when trying to access log file on disk (actions Refresh,Retry"


@pytest.fixture
def small_disk(tmp_path) -> Path:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def fill(path: Path) -> int:
    """Write ``path`` until the file system has no byte left; the bytes written."""
    chunk = b"\xa5" * 65536
    written = 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                break
        while True:     # the last few bytes
            try:
                written += f.write(b"\xa5" * 512)
            except OSError:
                return written


def value(i: int) -> bytes:
    """4200 bytes: more than a page, so no batch fits in the slack of a full disk's last page."""
    return (f"value-{i:06d}-".encode() * 330)[:4200]


class LogLines(logging.Handler):
    """librdkafka's log lines (``logger`` config), kept for the test to look at."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.lines.append(record.getMessage())

    def any(self, text: str) -> bool:
        with self._lock:
            return any(text in line for line in self.lines)


def test_a_full_disk_answers_retriable_storage_errors_until_space_returns(small_disk, tmp_path):
    port = free_port()
    b = BrokerProcess(tmp_path / "broker", {"log.dirs": str(small_disk / "logs"),
                                            "strata.metrics.listener": f"http://127.0.0.1:{port}"})
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        acked: dict[int, int] = {}      # offset -> record number
        failures: list[str] = []

        def delivered(err, msg) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                acked[msg.offset()] = int(msg.key())

        lines = LogLines()
        rdkafka_log = logging.getLogger(f"rdkafka-{port}")
        rdkafka_log.addHandler(lines)
        rdkafka_log.setLevel(logging.DEBUG)
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 120_000, "retry.backoff.ms": 100,
                         "retry.backoff.max.ms": 200, "debug": "msg", "logger": rdkafka_log})
        for i in range(200):
            p.produce(TOPIC, key=str(i).encode(), value=value(i), on_delivery=delivered)
        assert p.flush(30) == 0 and len(acked) == 200 and not failures
        assert scrape(port)[OFFLINE] == 0

        filler = small_disk / "filler"
        fill(filler)

        # A client that does not retry sees the retriable error itself.
        kp = kafka.KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", retries=0)
        with pytest.raises(kafka.errors.KafkaStorageError) as refused:
            kp.send(TOPIC, key=b"refused", value=b"x" * 65536).get(timeout=30)
        assert refused.value.retriable
        kp.close()
        assert scrape(port)[OFFLINE] == 1
        with pytest.raises(ck.KafkaException) as created:
            admin.create_topics([NewTopic("while-full", 1, 1)])["while-full"].result(30)
        assert created.value.args[0].code() == ck.KafkaError.KAFKA_STORAGE_ERROR

        # confluent-kafka retries through the full disk: nothing fails, nothing is stored yet.
        for i in range(200, 800):
            p.produce(TOPIC, key=str(i).encode(), value=value(i), on_delivery=delivered)
        def told_storage_error() -> bool:
            p.poll(0.1)
            return lines.any(STORAGE_ERROR_TEXT)
        eventually(told_storage_error, "the producer to be told KAFKA_STORAGE_ERROR", 60)
        assert not failures, failures[:3]
        assert len(acked) == 200

        filler.unlink()
        assert p.flush(120) == 0
        assert not failures, failures[:3]
        assert sorted(acked.values()) == list(range(800))
        assert eventually(lambda: scrape(port)[OFFLINE] == 0, "the log dir back online", 30)
        admin.create_topics([NewTopic("after-full", 1, 1)])["after-full"].result(30)

        # every acknowledged record, intact, at its offset; nothing else
        c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "check",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([ck.TopicPartition(TOPIC, 0, 0)])
        seen: dict[int, tuple[bytes, bytes]] = {}
        deadline = time.monotonic() + 60
        while len(seen) < len(acked) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen[m.offset()] = (m.key(), m.value())
        c.close()
        assert seen == {off: (str(i).encode(), value(i)) for off, i in acked.items()}
        assert sorted(seen) == list(range(800))
    finally:
        b.stop()
    out = b.output()
    assert "Traceback" not in out
    reports = out.count("Error while appending records to")
    assert 1 <= reports <= 3, f"{reports} reports of the full disk"
