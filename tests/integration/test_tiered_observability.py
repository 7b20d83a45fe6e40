"""Observing tiered storage on a live broker: the Prometheus endpoint
(``strata.metrics.listener``), ``/tiered/<topic>``, ``strata tiered describe`` and, after a
clean stop, ``strata tiered metadata`` over the broker's ``__remote_log_metadata`` logs.

Numbers are checked against what is really there: the objects of the filesystem remote tier,
ListOffsets (−2, −4, −1, −5) and the records a confluent-kafka consumer reads back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker_process import BrokerProcess, free_port
from tiered_support import TIERED_BROKER, offsets, remote_files, wait_for

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096"}
BTM = "kafka_server_BrokerTopicMetrics_"
TOPIC = "obs"
PARTITIONS = 2
PER_PARTITION = 400
VALUE = 200


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of ``/metrics``."""
    status, text = http_get(base + "/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def strata_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strata.cli.main", "--log-level", "WARNING", *args],
                          capture_output=True, text=True, timeout=60)


def create(bootstrap: str, topic: str, partitions: int, **configs) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(30)


def produce(bootstrap: str, topic: str, n: int, partition: int) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "batch.size": 4096})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=(f"v{i}-".encode() * VALUE)[:VALUE],
                  partition=partition)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def consume(bootstrap: str, topic: str, partition: int, count: int, timeout: float = 60) -> list:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                     "max.partition.fetch.bytes": 64 * 1024})
    c.assign([CkTp(topic, partition, 0)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        c.close()
    return out


def remote_segments(root: Path, topic: str) -> list[tuple[int, int, str, int]]:
    """(partition, start offset, segment id, .log object size) of each remote segment."""
    out = []
    for f in remote_files(root, topic):
        if f.suffix == ".log":
            out.append((int(f.parent.name), int(f.name[:20]), f.name[21:-len(".log")], f.stat().st_size))
    return sorted(out)


@pytest.fixture
def broker(tmp_path):
    port = free_port()
    b = BrokerProcess(tmp_path, {**TIERED_BROKER, "strata.metrics.listener": f"http://127.0.0.1:{port}"})
    b.metrics_url = f"http://127.0.0.1:{port}"
    with b:
        yield b


def test_metrics_tiered_json_describe_and_metadata_dump_agree_with_the_remote_tier(broker):
    base = broker.metrics_url
    root = broker.data_dir / "kafka-logs" / "remote-storage"
    create(broker.bootstrap, TOPIC, PARTITIONS, **TIERED_TOPIC)
    create(broker.bootstrap, "plain", 1)
    for p in range(PARTITIONS):
        produce(broker.bootstrap, TOPIC, PER_PARTITION, p)
    produce(broker.bootstrap, "plain", 10, 0)

    def settled():
        """Every inactive segment copied and deleted locally, in every partition."""
        status, text = http_get(f"{base}/tiered/{TOPIC}")
        doc = json.loads(text)
        parts = doc["partitions"]
        return status == 200 and all(
            p["local_segments"] == 1 and p["highest_offset_in_remote_storage"] >= 0
            and p["local_log_start_offset"] == p["highest_offset_in_remote_storage"] + 1
            for p in parts) and doc
    doc = wait_for(settled, 90, 0.2, "every inactive segment tiered and gone locally")

    # /tiered/<topic> agrees with ListOffsets and with the remote tier's objects
    segs = remote_segments(root, TOPIC)
    assert {s[0] for s in segs} == set(range(PARTITIONS))
    for p in doc["partitions"]:
        o = offsets(broker.bootstrap, TOPIC, p["partition"])
        assert (o["start"], o["local_start"], o["end"], o["tiered"]) == (
            p["log_start_offset"], p["local_log_start_offset"], p["high_watermark"],
            p["highest_offset_in_remote_storage"]), (o, p)
        assert p["log_start_offset"] == 0 and p["high_watermark"] == p["log_end_offset"] == PER_PARTITION
        mine = [s for s in segs if s[0] == p["partition"]]
        assert p["remote_segments"] == len(mine) > 1
        assert p["remote_bytes"] == sum(s[3] for s in mine)
        local = sorted((broker.data_dir / "kafka-logs" / f"{TOPIC}-{p['partition']}").glob("*.log"))
        assert p["local_segments"] == len(local) == 1
        assert p["local_bytes"] == sum(f.stat().st_size for f in local)
    assert doc["remote_storage_enable"] is True and doc["topic_id"]
    status, text = http_get(f"{base}/tiered/plain")
    plain = json.loads(text)["partitions"][0]
    assert status == 200 and (plain["remote_segments"], plain["highest_offset_in_remote_storage"],
                              plain["high_watermark"]) == (0, -1, 10)
    assert http_get(f"{base}/tiered/absent")[0] == 404

    # consume everything from offset 0: the remote tier serves the start
    for p in range(PARTITIONS):
        msgs = consume(broker.bootstrap, TOPIC, p, PER_PARTITION)
        assert [m.offset() for m in msgs] == list(range(PER_PARTITION))

    m = scrape(base)
    t = (("topic", TOPIC),)
    total_bytes = sum(s[3] for s in segs)
    assert m[(BTM + "RemoteCopyBytesPerSec_total", t)] == total_bytes > 0
    assert m[(BTM + "RemoteCopyRequestsPerSec_total", t)] == len(segs)
    assert m[(BTM + "RemoteCopyBytesPerSec_total", ())] == total_bytes  # the only tiered topic
    assert m[(BTM + "RemoteCopyErrorsPerSec_total", t)] == 0
    assert m[(BTM + "RemoteFetchBytesPerSec_total", t)] > 0
    assert m[(BTM + "RemoteFetchRequestsPerSec_total", t)] >= PARTITIONS
    assert m[(BTM + "RemoteFetchErrorsPerSec_total", ())] == 0
    assert m[(BTM + "RemoteDeleteRequestsPerSec_total", ())] == 0
    assert m[(BTM + "RemoteLogSizeBytes", t)] == total_bytes
    assert m[(BTM + "RemoteLogMetadataCount", t)] == len(segs)
    assert m[(BTM + "RemoteCopyLagSegments", t)] == 0 and m[(BTM + "RemoteCopyLagBytes", t)] == 0
    # the remote-tier meters have no sample for the untiered topic (its bytes in/out do)
    assert not [k for k in m if k[0].startswith(BTM + "Remote") and k[1] == (("topic", "plain"),)]
    pool = "org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_"
    assert m[(pool + "RemoteLogReaderTaskQueueSize", ())] == 0
    assert 0 <= m[(pool + "RemoteLogReaderAvgIdlePercent", ())] <= 1
    assert 0 <= m[("kafka_log_remote_RemoteLogManager_RemoteLogManagerTasksAvgIdlePercent", ())] <= 1
    cache = "kafka_log_remote_RemoteIndexCache_"
    assert m[(cache + "Misses_total", ())] >= 1 and m[(cache + "Entries", ())] >= 1
    assert m[("kafka_log_Log_LogEndOffset", (("partition", "1"), ("topic", TOPIC)))] == PER_PARTITION

    # strata tiered describe prints the same numbers, one row per partition
    r = strata_cli("tiered", "describe", TOPIC, "--metrics-url", base)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"Topic: {TOPIC}")
    assert lines[1].split()[0] == "PARTITION"
    for p in doc["partitions"]:
        row = lines[2 + p["partition"]].split()
        assert row == [str(v) for v in (
            p["partition"], p["log_start_offset"], p["local_log_start_offset"], p["high_watermark"],
            p["log_end_offset"], p["highest_offset_in_remote_storage"], p["local_segments"],
            p["local_bytes"], p["remote_segments"], p["remote_bytes"])]

    # after a clean stop, the metadata topic's own logs tell the same story
    assert broker.stop() == 0
    r = strata_cli("tiered", "metadata", "--log-dir", str(broker.data_dir / "kafka-logs"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    line_re = re.compile(r"^partition: (\d+), offset: (\d+), value: (\w+)\{")
    assert lines and all(line_re.match(line) for line in lines), lines[:3]
    for partition, start, seg_id, size in segs:
        started = [line for line in lines if line_re.match(line).group(3) == "RemoteLogSegmentMetadata"
                   and f", id={seg_id}}}" in line]
        assert len(started) == 1, seg_id
        assert f"{TOPIC}-{partition}, id=" in started[0]
        assert f"startOffset={start}," in started[0] and "state=COPY_SEGMENT_STARTED" in started[0]
        assert f"segmentSizeInBytes={size}," in started[0]
        finished = [line for line in lines if "RemoteLogSegmentMetadataUpdate{" in line
                    and f", id={seg_id}}}" in line]
        assert len(finished) == 1 and "state=COPY_SEGMENT_FINISHED" in finished[0], seg_id
    # per metadata partition, offsets are consecutive from 0
    by_partition: dict[int, list[int]] = {}
    for line in lines:
        mp, off = map(int, line_re.match(line).group(1, 2))
        by_partition.setdefault(mp, []).append(off)
    assert all(offs == list(range(len(offs))) for offs in by_partition.values())
    assert sum(map(len, by_partition.values())) == 2 * len(segs)


def test_endpoint_without_tiering_serves_log_metrics_on_a_logged_ephemeral_port(tmp_path):
    with BrokerProcess(tmp_path, {"strata.metrics.listener": "http://127.0.0.1:0"}) as b:
        found = wait_for(lambda: re.search(r"metrics endpoint listening on http://127\.0\.0\.1:(\d+)",
                                           b.output()), 10, what="the metrics port in the log")
        base = f"http://127.0.0.1:{found.group(1)}"
        create(b.bootstrap, "local", 2)
        produce(b.bootstrap, "local", 5, 1)
        m = scrape(base)
        assert not [k for k in m if k[0].startswith(BTM + "Remote")]  # tiered families, no samples
        assert m[(BTM + "MessagesInPerSec_total", (("topic", "local"),))] == 5
        status, text = http_get(base + "/metrics")
        assert f"# TYPE {BTM}RemoteCopyBytesPerSec_total counter" in text
        assert m[("kafka_log_Log_LogEndOffset", (("partition", "1"), ("topic", "local")))] == 5
        status, text = http_get(base + "/tiered/local")
        doc = json.loads(text)
        assert status == 200 and doc["remote_storage_enable"] is False
        assert [(p["partition"], p["high_watermark"], p["remote_segments"],
                 p["highest_offset_in_remote_storage"]) for p in doc["partitions"]] == \
            [(0, 0, 0, -1), (1, 5, 0, -1)]
        r = strata_cli("tiered", "describe", "local", "--metrics-url", base)
        assert r.returncode == 0 and r.stdout.splitlines()[3].split()[:4] == ["1", "0", "0", "5"]
    assert "metrics endpoint" in b.output()
