"""Tiered-storage observability without a broker process: the text form of
``__remote_log_metadata`` records (checked against Kafka's own RemoteLogMetadataFormatter when
a JDK and Kafka's jars are installed), ``strata tiered metadata`` over segment files, the
metrics collector and ``/tiered/<topic>`` over a real log and remote log manager, the reader
pool accounting, and the HTTP endpoint itself."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata.cli.main import format_tiered_table, main as cli_main
from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition, uuid_to_kafka_str
from strata.log.log_config import LogConfig
from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.protocol.records import CONTROL_COMMIT, SimpleRecord, build_batch, build_control_batch
from strata.server.metrics import (
    BrokerMetricsCollector, MetricsServer, parse_metrics_listener, topic_state)
from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState)
from strata.tiered.manager.remote_log_manager import TieringSettings
from strata.tiered.metadata.formatting import format_metadata, format_record
from strata.tiered.metadata.serde import RemoteLogSegmentMetadataSnapshot, serialize
from support.waiting import eventually
from tiered_env import TIP as ENV_TIP, TOPIC_ID as ENV_TOPIC_ID, TP as ENV_TP, TieredEnv

S = RemoteLogSegmentState
D = RemotePartitionDeleteState
TOPIC_ID = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
TIP = TopicIdPartition(TOPIC_ID, TopicPartition("orders", 7))
SEGMENT_ID = RemoteLogSegmentId(TIP, uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"))
SEGMENT = RemoteLogSegmentMetadata(SEGMENT_ID, 100, 199, 1_700_000_000_123, 2, 1_700_000_000_456, 4096,
                                   segment_leader_epochs={5: 120, 3: 100}, txn_idx_empty=True)
UPDATE = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1_700_000_000_789, b"\x01\x02\x03",
                                        S.COPY_SEGMENT_FINISHED, 2)
DELETE = RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_STARTED, 1_700_000_000_999, 1)
SNAPSHOT = RemoteLogSegmentMetadataSnapshot.create(SEGMENT.create_with_updates(UPDATE))
RECORDS = [SEGMENT, UPDATE, SEGMENT.create_with_updates(UPDATE), DELETE, SNAPSHOT]

TIP_TEXT = f"{uuid_to_kafka_str(TOPIC_ID)}:orders-7"
SEGMENT_ID_TEXT = f"RemoteLogSegmentId{{topicIdPartition={TIP_TEXT}, id={uuid_to_kafka_str(SEGMENT_ID.id)}}}"


# --------------------------------------------------------------------------- formatting


def test_segment_metadata_prints_as_kafkas_tostring():
    assert format_metadata(SEGMENT) == (
        f"RemoteLogSegmentMetadata{{remoteLogSegmentId={SEGMENT_ID_TEXT}, startOffset=100, "
        "endOffset=199, brokerId=2, maxTimestampMs=1700000000123, eventTimestampMs=1700000000456, "
        "segmentLeaderEpochs={3=100, 5=120}, segmentSizeInBytes=4096, customMetadata=Optional.empty, "
        "state=COPY_SEGMENT_STARTED, txnIdxEmpty=true}")


def test_update_delete_and_snapshot_records_print_as_kafkas_tostring():
    assert format_metadata(UPDATE) == (
        f"RemoteLogSegmentMetadataUpdate{{remoteLogSegmentId={SEGMENT_ID_TEXT}, "
        "customMetadata=Optional[CustomMetadata{3 bytes}], state=COPY_SEGMENT_FINISHED, "
        "eventTimestampMs=1700000000789, brokerId=2}")
    assert format_metadata(DELETE) == (
        f"RemotePartitionDeleteMetadata{{topicPartition={TIP_TEXT}, state=DELETE_PARTITION_STARTED, "
        "eventTimestampMs=1700000000999, brokerId=1}")
    assert format_metadata(SNAPSHOT) == (
        f"RemoteLogSegmentMetadataSnapshot{{segmentId={uuid_to_kafka_str(SEGMENT_ID.id)}, "
        "startOffset=100, endOffset=199, maxTimestampMs=1700000000123, "
        "segmentLeaderEpochs={3=100, 5=120}, segmentSizeInBytes=4096, "
        "customMetadata=Optional[CustomMetadata{3 bytes}], state=COPY_SEGMENT_FINISHED}")


def test_a_record_line_is_the_formatters_and_bad_values_raise():
    assert format_record(3, 17, serialize(DELETE)) == \
        f"partition: 3, offset: 17, value: {format_metadata(DELETE)}"
    with pytest.raises(ValueError):
        format_record(0, 0, b"\x01\x09\x00")
    with pytest.raises(ValueError):
        format_record(0, 0, None)
    with pytest.raises(TypeError):
        format_metadata(object())


JAVA_FORMATTER = r"""
import java.io.*;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;

// stdin: "<partition> <offset> <hex value>" -> Kafka's formatter line
public class FormatterCheck {
  static byte[] unhex(String h) { byte[] b = new byte[h.length() / 2]; for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16); return b; }
  public static void main(String[] args) throws Exception {
    RemoteLogMetadataSerde.RemoteLogMetadataFormatter f = new RemoteLogMetadataSerde.RemoteLogMetadataFormatter();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    String line;
    while ((line = in.readLine()) != null) {
      String[] p = line.trim().split(" ");
      f.writeTo(new ConsumerRecord<byte[], byte[]>("__remote_log_metadata", Integer.parseInt(p[0]), Long.parseLong(p[1]), null, unhex(p[2])), System.out);
    }
  }
}
"""


def test_lines_match_kafkas_remote_log_metadata_formatter(tmp_path):
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("cross-check with Kafka needs a JDK (java and javac on PATH)")
    from kafka_tools import require_kafka_dist, kafka_libs
    require_kafka_dist()
    libs = kafka_libs()
    serde = "org/apache/kafka/server/log/remote/metadata/storage/serialization/RemoteLogMetadataSerde.class"
    if not any(serde in zipfile.ZipFile(jar).namelist() for jar in libs.glob("kafka-storage-*.jar")):
        pytest.skip(f"no RemoteLogMetadataSerde in {libs}")
    (tmp_path / "FormatterCheck.java").write_text(JAVA_FORMATTER)
    classpath = f"{libs}/*"
    subprocess.run(["javac", "-d", str(tmp_path), "-cp", classpath, str(tmp_path / "FormatterCheck.java")],
                   check=True, capture_output=True, timeout=120)
    # snapshots (api key 3) never appear in the topic; the formatter is for the topic's records
    records = [SEGMENT, UPDATE, SEGMENT.create_with_updates(UPDATE), DELETE,
               RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_FINISHED, 5, 0),
               RemoteLogSegmentMetadata(SEGMENT_ID, 0, 0, -1, 0, 0, 0, segment_leader_epochs={0: 0})]
    lines = [f"{i} {i * 10} {serialize(m).hex()}" for i, m in enumerate(records)]
    proc = subprocess.run(["java", "-Xmx256m", "-cp", f"{classpath}:{tmp_path}", "FormatterCheck"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                          check=True)
    ours = [format_record(i, i * 10, serialize(m)) for i, m in enumerate(records)]
    assert proc.stdout.splitlines() == ours


# --------------------------------------------------------------------------- strata tiered metadata


def _write_metadata_partition(log_dir: Path, partition: int, values: list[bytes | None],
                              base: int = 0, segments: int = 1) -> None:
    """A ``__remote_log_metadata-N`` directory with the values as one-record batches,
    split over ``segments`` files, with a commit marker and a torn tail in the last one."""
    d = log_dir / f"__remote_log_metadata-{partition}"
    d.mkdir(parents=True)
    per = max(1, -(-len(values) // segments))
    offset = base
    for s in range(segments):
        chunk = values[s * per:(s + 1) * per]
        data = bytearray()
        start = offset
        for v in chunk:
            data += build_batch([SimpleRecord(v)], base_offset=offset)
            offset += 1
        if s == segments - 1:
            data += build_control_batch(CONTROL_COMMIT, producer_id=7, producer_epoch=0,
                                        base_offset=offset)
            data += b"\x00\x00\x00\x00\x00\x00\x00\x99\x00\x00"  # a torn batch header
        (d / f"{start:020d}.log").write_bytes(bytes(data))
        (d / f"{start:020d}.index").write_bytes(b"")


def test_tiered_metadata_prints_every_record_of_every_partition_in_order(tmp_path, capsys):
    _write_metadata_partition(tmp_path, 1, [serialize(DELETE)])
    _write_metadata_partition(tmp_path, 0, [serialize(m) for m in (SEGMENT, UPDATE)], segments=2)
    (tmp_path / "orders-0").mkdir()  # other partitions are ignored
    (tmp_path / "__remote_log_metadata-x").mkdir()
    assert cli_main(["tiered", "metadata", "--log-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [format_record(0, 0, serialize(SEGMENT)), format_record(0, 1, serialize(UPDATE)),
                   format_record(1, 0, serialize(DELETE))]
    assert cli_main(["tiered", "metadata", "--log-dir", str(tmp_path), "--partition", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [format_record(1, 0, serialize(DELETE))]


def test_tiered_metadata_reports_bad_records_and_goes_on(tmp_path, capsys):
    _write_metadata_partition(tmp_path, 0, [b"\x01\x09\x00", None, serialize(UPDATE)])
    assert cli_main(["tiered", "metadata", "--log-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("partition: 0, offset: 0, error: ")
    assert out[1].startswith("partition: 0, offset: 1, error: ")
    assert out[2].startswith(format_record(0, 2, serialize(UPDATE)) + ", refused: No remote log")


def test_tiered_metadata_shows_each_records_leader_epoch_and_what_the_brokers_refuse(
        tmp_path, capsys):
    """A deposed leader's record (epoch 5 after an epoch-6 one) and an illegal transition
    are printed as the brokers apply them: refused, with the reason."""
    led = dataclasses.replace(SEGMENT, leader_epoch=6)
    stale = dataclasses.replace(UPDATE, leader_epoch=5)
    finished = RemoteLogSegmentMetadataUpdate(SEGMENT.remote_log_segment_id, 1, None,
                                              S.COPY_SEGMENT_FINISHED, 2, leader_epoch=6)
    deleting = dataclasses.replace(finished, state=S.DELETE_SEGMENT_STARTED)
    late = dataclasses.replace(finished, event_timestamp_ms=2)   # back to FINISHED: illegal
    records = [led, stale, finished, deleting, late]
    _write_metadata_partition(tmp_path, 0, [serialize(m) for m in records])
    assert cli_main(["tiered", "metadata", "--log-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [format_record(0, i, serialize(m)) + ", leaderEpoch: %d" % m.leader_epoch
             for i, m in enumerate(records)]
    assert [out[0], out[2], out[3]] == [lines[0], lines[2], lines[3]]
    assert out[1].startswith(lines[1] + ", refused: ")
    assert "leader epoch 5" in out[1] and "epoch 6" in out[1]
    assert out[4].startswith(lines[4] + ", refused: ") and "DELETE_SEGMENT_STARTED" in out[4]


def test_tiered_metadata_without_the_topic_fails(tmp_path, capsys):
    assert cli_main(["tiered", "metadata", "--log-dir", str(tmp_path)]) == 1
    assert "__remote_log_metadata" in capsys.readouterr().err


# --------------------------------------------------------------------------- collector and JSON


class Env(TieredEnv):
    """The tiered env with reader threads and a second, untiered log ``plain``."""

    def __init__(self, tmp: Path):
        clock = MockClock()
        self.plain = UnifiedLog(tmp / "plain-0", LogConfig({}), clock=clock,
                                topic_partition=TopicPartition("plain", 0))
        super().__init__(tmp, settings=TieringSettings(reader_threads=2), clock=clock)
        self.tp, self.tip = ENV_TP, ENV_TIP

    def logs(self) -> list[UnifiedLog]:
        return [self.log, self.plain]

    def topic_id(self, topic: str):
        return ENV_TOPIC_ID if topic in ("orders", "plain") else None


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def scrape(collector) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one collection."""
    out = {}
    for family in collector.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


BTM = "kafka_server_BrokerTopicMetrics_"
T = (("topic", "orders"),)


def test_collector_reads_copies_reads_lag_and_sizes_live(env):
    env.produce(60)
    env.produce(3, ulog=env.plain)
    collector = BrokerMetricsCollector(env.logs, env.rlm)
    before = scrape(collector)
    inactive = env.log.local_log.segments[:-1]
    assert before[(BTM + "RemoteCopyLagSegments", T)] == len(inactive) > 2
    assert before[(BTM + "RemoteCopyLagBytes", T)] == sum(s.size for s in inactive)
    assert before[(BTM + "RemoteCopyBytesPerSec_total", ())] == 0
    assert before[(BTM + "RemoteCopyBytesPerSec_total", T)] == 0  # tiered, nothing copied yet

    copied = env.copy()
    remote = list(env.rlmm.list_remote_log_segments(env.tip))
    env.log.delete_old_segments()
    fut = env.rlm.submit_read(env.log, 0, 10_000, FetchIsolation.HIGH_WATERMARK, True)
    fetched = len(fut.result(10).records)
    m = scrape(collector)
    size = sum(r.segment_size_in_bytes for r in remote)
    assert m[(BTM + "RemoteCopyRequestsPerSec_total", T)] == copied == len(remote)
    assert m[(BTM + "RemoteCopyBytesPerSec_total", T)] == size
    assert m[(BTM + "RemoteCopyBytesPerSec_total", ())] == size
    assert m[(BTM + "RemoteFetchRequestsPerSec_total", T)] == 1
    assert m[(BTM + "RemoteFetchBytesPerSec_total", T)] == fetched > 0
    assert m[(BTM + "RemoteCopyErrorsPerSec_total", ())] == 0
    assert m[(BTM + "RemoteCopyLagSegments", T)] == 0 and m[(BTM + "RemoteCopyLagBytes", T)] == 0
    assert m[(BTM + "RemoteLogSizeBytes", T)] == size
    assert m[(BTM + "RemoteLogMetadataCount", T)] == len(remote)
    assert m[(BTM + "RemoteLogSizeBytes", ())] == size
    assert not any(k[1] == (("topic", "plain"),) for k in m if k[0].startswith(BTM))  # not tiered
    assert m[("kafka_log_remote_RemoteIndexCache_Misses_total", ())] >= 1
    assert m[("kafka_log_remote_RemoteIndexCache_Entries", ())] >= 1
    assert m[("org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderTaskQueueSize", ())] == 0
    idle = m[("org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderAvgIdlePercent", ())]
    assert 0 <= idle <= 1
    assert m[("kafka_log_remote_RemoteLogManager_RemoteLogManagerTasksAvgIdlePercent", ())] == 1.0
    assert m[("kafka_log_Log_LogEndOffset", (("partition", "0"), ("topic", "orders")))] == 60
    assert m[("kafka_log_Log_NumLogSegments", (("partition", "0"), ("topic", "orders")))] == 1
    assert m[("kafka_log_Log_Size", (("partition", "0"), ("topic", "plain")))] == env.plain.size
    assert m[("kafka_server_ReplicaManager_PartitionCount", ())] == 2


def test_reader_pool_accounting_counts_queued_running_and_busy_time(env):
    stats = env.rlm.reader_stats
    gate = threading.Event()
    real_read = env.rlm.read
    env.rlm.read = lambda *a, **k: (gate.wait(10), real_read(*a, **k))[1]
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    futures = [env.rlm.submit_read(env.log, 0, 1000, FetchIsolation.HIGH_WATERMARK, True)
               for _ in range(5)]
    eventually(lambda: (stats.active, stats.queued) == (2, 3),   # two reader threads
               "two reads running and three queued", 5)
    collector = BrokerMetricsCollector(env.logs, env.rlm)
    m = scrape(collector)
    assert m[("org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderTaskQueueSize", ())] == 3
    gate.set()
    for f in futures:
        f.result(10)
    assert (stats.active, stats.queued) == (0, 0)
    assert stats.busy_ns() > 0
    idle = scrape(collector)[
        ("org_apache_kafka_storage_internals_log_RemoteStorageThreadPool_RemoteLogReaderAvgIdlePercent", ())]
    assert 0 <= idle < 1  # the threads were busy during the interval


def test_collector_without_tiering_has_the_families_but_no_tiered_samples(env):
    env.produce(3, ulog=env.plain)
    m = scrape(BrokerMetricsCollector(lambda: [env.plain], None))
    assert not [k for k in m if k[0].startswith(BTM)]
    assert m[("kafka_log_Log_LogEndOffset", (("partition", "0"), ("topic", "plain")))] == 3
    names = {f.name for f in BrokerMetricsCollector(lambda: [env.plain], None).collect()}
    assert BTM + "RemoteCopyBytesPerSec" in names and BTM + "RemoteLogSizeBytes" in names


def test_topic_state_matches_the_logs_and_the_remote_tier(env):
    env.produce(60)
    env.copy()
    env.log.delete_old_segments()
    doc = topic_state(env.logs(), "orders", env.rlm, env.topic_id)
    assert doc["topic"] == "orders" and doc["topic_id"] == uuid_to_kafka_str(ENV_TOPIC_ID)
    assert doc["remote_storage_enable"] is True
    (p,) = doc["partitions"]
    remote = list(env.rlmm.list_remote_log_segments(env.tip))
    assert p["partition"] == 0
    assert p["log_start_offset"] == 0
    assert p["local_log_start_offset"] == env.log.local_log_start_offset == remote[-1].end_offset + 1
    assert p["high_watermark"] == p["log_end_offset"] == 60
    assert p["highest_offset_in_remote_storage"] == remote[-1].end_offset
    assert (p["local_segments"], p["local_bytes"]) == (1, env.log.size)
    assert (p["remote_segments"], p["remote_bytes"]) == \
        (len(remote), sum(m.segment_size_in_bytes for m in remote))
    plain = topic_state(env.logs(), "plain", env.rlm)["partitions"][0]
    assert (plain["remote_segments"], plain["highest_offset_in_remote_storage"]) == (0, -1)
    assert topic_state(env.logs(), "nope", env.rlm) is None
    local_only = topic_state(env.logs(), "orders", None)["partitions"][0]
    assert (local_only["remote_segments"], local_only["remote_bytes"]) == (0, 0)


def test_describe_table_has_a_row_per_partition():
    doc = {"topic": "t", "topic_id": "abc", "remote_storage_enable": True, "partitions": [
        {"partition": 0, "log_start_offset": 0, "local_log_start_offset": 120, "high_watermark": 300,
         "log_end_offset": 300, "highest_offset_in_remote_storage": 119, "local_segments": 2,
         "local_bytes": 5000, "remote_segments": 6, "remote_bytes": 12000},
        {"partition": 1, "log_start_offset": 0, "local_log_start_offset": 0, "high_watermark": 0,
         "log_end_offset": 0, "highest_offset_in_remote_storage": -1, "local_segments": 1,
         "local_bytes": 0, "remote_segments": None, "remote_bytes": None, "remote_error": "boom"}]}
    lines = format_tiered_table(doc).splitlines()
    assert lines[0].startswith("Topic: t") and "remote.storage.enable: true" in lines[0]
    assert lines[1].split() == ["PARTITION", "LOG-START", "LOCAL-LOG-START", "HIGH-WATERMARK", "LOG-END",
                                "HIGHEST-REMOTE-OFFSET", "LOCAL-SEGMENTS", "LOCAL-BYTES",
                                "REMOTE-SEGMENTS", "REMOTE-BYTES"]
    assert lines[2].split() == ["0", "0", "120", "300", "300", "119", "2", "5000", "6", "12000"]
    assert lines[3].split() == ["1", "0", "0", "0", "0", "-1", "1", "0", "-", "-"]
    assert "boom" in lines[4]


# --------------------------------------------------------------------------- HTTP


def test_listener_parsing():
    assert parse_metrics_listener("http://127.0.0.1:9404") == ("127.0.0.1", 9404)
    assert parse_metrics_listener("http://:0") == ("", 0)
    assert parse_metrics_listener("http://[::1]:9404/") == ("::1", 9404)
    for bad in ("127.0.0.1:9404", "https://h:1", "http://h", "http://h:1/metrics"):
        with pytest.raises(ValueError):
            parse_metrics_listener(bad)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def test_endpoint_serves_metrics_and_topic_json_on_an_ephemeral_port(env, capsys):
    env.produce(60)
    env.copy()
    server = MetricsServer("http://127.0.0.1:0", logs=env.logs, rlm=env.rlm, topic_id=env.topic_id)
    port = server.start()
    try:
        assert port > 0 and server.url == f"http://127.0.0.1:{port}"
        status, ctype, text = _get(server.url + "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        copy_bytes = families[BTM + "RemoteCopyBytesPerSec"]
        assert copy_bytes.type == "counter"
        by_labels = {tuple(sorted(s.labels.items())): s.value for s in copy_bytes.samples}
        assert by_labels[T] == by_labels[()] > 0
        assert "process_cpu_seconds" in families or "process_start_time_seconds" in families
        status, ctype, text = _get(server.url + "/tiered/orders")
        assert status == 200 and ctype == "application/json"
        assert json.loads(text)["partitions"][0]["remote_segments"] > 0
        status, _, text = _get(server.url + "/tiered/missing")
        assert status == 404 and "missing" in json.loads(text)["error"]
        assert _get(server.url + "/nothing")[0] == 404
        assert cli_main(["tiered", "describe", "orders", "--metrics-url", server.url]) == 0
        out = capsys.readouterr().out
        assert "PARTITION" in out and f"{env.log.highest_offset_in_remote_storage}" in out
        assert cli_main(["tiered", "describe", "missing", "--metrics-url", server.url]) == 1
    finally:
        server.stop()
    assert cli_main(["tiered", "describe", "orders", "--metrics-url", server.url]) == 1
    assert "cannot reach" in capsys.readouterr().err
