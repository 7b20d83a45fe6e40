"""Shared fixtures for the Spark tests: one local[2] SparkSession per test process with the
``strata`` source registered, a tiered broker (filesystem remote tier, metrics endpoint), and a
topic whose history spans >= 10 remote segments per partition plus a local tail.

Test modules import what they need by name (``from spark_support import spark, tiered_topic``);
pytest picks fixtures up from the importing module's namespace.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from broker_process import BrokerProcess, free_port
from tiered_support import TIERED_BROKER, wait_for

from strata.spark import session

REPO = Path(__file__).resolve().parents[1]
SPARK_KAFKA_JARS = REPO / ".cache" / "spark-kafka" / "4.0.0" / "jars"
SEGMENT_BYTES = 16 * 1024
BASE_TS = (int(time.time() * 1000) // 1000) * 1000 - 3_600_000  # an hour ago, inside retention


# ---- Spark ----------------------------------------------------------------------------------------

_session = None


def spark_session():
    """The test process's SparkSession (created once): local[2], the venv's Python for workers,
    no UI, 2 shuffle partitions, UTC session time zone, the ``strata`` source registered, and
    Spark's Kafka connector jars when ``scripts/spark-kafka-dist.sh`` installed them."""
    global _session
    if _session is not None:
        return _session
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    jars = sorted(SPARK_KAFKA_JARS.glob("*.jar")) if SPARK_KAFKA_JARS.is_dir() else []
    _session = session("local[2]", "strata-tests", [
        ("spark.ui.enabled", "false"), ("spark.sql.shuffle.partitions", "2"),
        ("spark.sql.session.timeZone", "UTC"), ("spark.driver.memory", "1g"),
        ("spark.python.worker.reuse", "true")], jars)
    return _session


@pytest.fixture(scope="session")
def spark():
    session = spark_session()
    yield session
    global _session
    session.stop()
    _session = None


# ---- broker and topic -----------------------------------------------------------------------------

class TieredBrokerProcess(BrokerProcess):
    """A BrokerProcess that also serves metrics (``/metrics``, ``/tiered/<topic>``)."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.metrics_port = free_port()
        super().__init__(data_dir, {**TIERED_BROKER,
                                    "strata.metrics.listener": f"http://127.0.0.1:{self.metrics_port}",
                                    **(overrides or {})}, port)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def remote_root(self) -> Path:
        """The filesystem remote tier (the RSM's default ``<log dir>/remote-storage``)."""
        return self.data_dir / "kafka-logs" / "remote-storage"

    def tiered_state(self, topic: str) -> dict[str, Any] | None:
        """The broker's ``/tiered/<topic>`` document (None before the topic exists)."""
        try:
            with urllib.request.urlopen(f"{self.metrics_url}/tiered/{topic}", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus sample ``name`` over series whose labels include ``labels``."""
        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
                if all(w in line for w in want):
                    total += float(line.rsplit(" ", 1)[1])
        return total


def start_tiered_broker(data_dir: Path, **overrides: str) -> TieredBrokerProcess:
    """A started broker with ``TIERED_BROKER`` settings, the filesystem remote tier under its
    data dir and a metrics listener on a free port; ``overrides`` (pass dotted keys with
    ``**{"key.name": "v"}``) win."""
    return TieredBrokerProcess(Path(data_dir), dict(overrides)).start()


@dataclass
class Produced:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int  # epoch ms (CreateTime)


@dataclass
class TieredTopic:
    broker: TieredBrokerProcess
    bootstrap: str
    topic: str
    partitions: int
    data_dir: Path
    remote_root: Path
    records: list[Produced] = field(default_factory=list)

    def options(self, **extra: str | None) -> dict[str, str]:
        """Options of the ``strata`` source for this topic: bootstrap servers, ``subscribe`` and
        the remote tier (so ``direct`` mode is the default); ``extra`` adds or overrides options
        (dotted keys via ``**{...}``), and a None value drops one (``subscribe=None``)."""
        opts: dict[str, str | None] = {
            "bootstrap.servers": self.bootstrap, "subscribe": self.topic,
            "rsm.config.storage.url": self.remote_root.as_uri(), **extra}
        return {k: v for k, v in opts.items() if v is not None}

    def rows(self, start: int = 0, end: int | None = None) -> list[Produced]:
        """The produced records with start <= offset < end in every partition."""
        return [r for r in self.records
                if r.offset >= start and (end is None or r.offset < end)]

    def produce(self, n: int, *, record_size: int = 200, seed: int | None = None) -> list[Produced]:
        """Produce ``n`` more records (round-robin over partitions, as ``make_tiered_topic``
        does), append them to ``records`` and return them."""
        new = produce_records(self.bootstrap, self.topic, self.partitions, n,
                              first_index=len(self.records), record_size=record_size, seed=seed)
        self.records.extend(new)
        self.records.sort(key=lambda r: (r.partition, r.offset))
        return new


def record_for(i: int, record_size: int, rng: random.Random) -> tuple[bytes | None, bytes,
                                                                          list[tuple[str, bytes]]]:
    """The key, value and headers of the ``i``-th record: null keys, empty values, no, one and
    two headers (one repeated name) all occur."""
    key = None if i % 10 == 3 else f"k{i}".encode()
    if i % 97 == 5:
        value = b""
    else:
        half = record_size // 2
        value = (f"v{i}-".encode() * record_size)[:half] + rng.randbytes(record_size - half)
    if i % 5 == 0:
        headers: list[tuple[str, bytes]] = []
    elif i % 5 == 1:
        headers = [("i", str(i).encode())]
    else:
        headers = [("i", str(i).encode()), ("h", b"x"), ("h", rng.randbytes(3))]
    return key, value, headers


def produce_records(bootstrap: str, topic: str, partitions: int, n: int, *, first_index: int = 0,
                    record_size: int = 200, seed: int | None = None,
                    base_ts: int = BASE_TS) -> list[Produced]:
    """Produce records ``first_index .. first_index + n - 1`` with an idempotent lz4 producer,
    record ``i`` to partition ``i % partitions`` with timestamp ``base_ts + i``; what the broker
    acknowledged, in (partition, offset) order."""
    from confluent_kafka import Producer
    rng = random.Random(first_index if seed is None else seed)
    out: list[Produced] = []
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "batch.size": 4096,
                         "compression.type": "lz4"})
    for i in range(first_index, first_index + n):
        key, value, headers = record_for(i, record_size, rng)
        ts = base_ts + i

        def delivered(err, msg, key=key, value=value, headers=headers, ts=ts):
            if err is not None:
                errors.append(str(err))
            else:
                out.append(Produced(msg.partition(), msg.offset(), key, value, headers, ts))
        producer.produce(topic, key=key, value=value, partition=i % partitions, timestamp=ts,
                         headers=headers, on_delivery=delivered)
        if i % 200 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "produce did not finish"
    assert not errors, errors[:3]
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def create_tiered_topic(broker: BrokerProcess, topic: str, partitions: int,
                        segment_bytes: int = SEGMENT_BYTES, **configs: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    conf = {"remote.storage.enable": "true", "internal.segment.bytes": str(segment_bytes),
            "local.retention.bytes": "1", "segment.index.bytes": "4096", **configs}
    admin.create_topics([NewTopic(topic, partitions, 1, config=conf)])[topic].result(30)


def tiering_settled(broker: TieredBrokerProcess, topic: str, partitions: int) -> list[dict] | None:
    """Each partition's ``/tiered`` entry once every rolled segment is in the remote tier and
    gone locally (only the active segment left), else None."""
    state = broker.tiered_state(topic)
    if not state or len(state["partitions"]) != partitions:
        return None
    parts = state["partitions"]
    for p in parts:
        if p["local_segments"] != 1 or p["remote_segments"] is None:
            return None
        if p["highest_offset_in_remote_storage"] + 1 != p["local_log_start_offset"]:
            return None
    return parts


def wait_tiering_settled(broker: TieredBrokerProcess, topic: str, partitions: int,
                         timeout: float = 120) -> list[dict]:
    return wait_for(lambda: tiering_settled(broker, topic, partitions), timeout,
                    what=f"{topic}: every rolled segment tiered and deleted locally")


def make_tiered_topic(broker: TieredBrokerProcess, topic: str, *, partitions: int = 2,
                      remote_segments: int = 10, tail_records: int = 50,
                      record_size: int = 200) -> TieredTopic:
    """A topic of ``partitions`` partitions with >= ``remote_segments`` remote segments each
    (16 KiB segments, local.retention.bytes=1) and a local tail (the active segment, holding at
    least the last batch and usually ~``tail_records`` records); returns once tiering settled.
    Records carry null keys, empty values, headers and explicit timestamps ``BASE_TS + i``."""
    create_tiered_topic(broker, topic, partitions)
    tt = TieredTopic(broker, broker.bootstrap, topic, partitions, broker.data_dir,
                     broker.remote_root)
    per_segment = max(1, SEGMENT_BYTES // (record_size + 40))
    tt.produce(partitions * per_segment * (remote_segments + 1), record_size=record_size)
    while True:
        parts = wait_tiering_settled(broker, topic, partitions)
        if min(p["remote_segments"] for p in parts) >= remote_segments:
            break
        tt.produce(partitions * per_segment, record_size=record_size)
    tt.produce(partitions * tail_records, record_size=record_size)
    wait_tiering_settled(broker, topic, partitions)
    return tt


@pytest.fixture(scope="session")
def tiered_broker(tmp_path_factory) -> Iterator[TieredBrokerProcess]:
    broker = start_tiered_broker(tmp_path_factory.mktemp("spark-broker"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def tiered_topic(tiered_broker) -> TieredTopic:
    """Read-only shared topic: 2 partitions, >= 10 remote segments each plus a local tail."""
    return make_tiered_topic(tiered_broker, "spark-shared")
