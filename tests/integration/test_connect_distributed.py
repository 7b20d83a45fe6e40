"""Kafka Connect distributed (Kafka 4.4.0's ``ConnectDistributed``) restarting on its compacted
internal topics, against one Strata broker with the log cleaner on.

A worker creates its config, offsets and status topics (compacted, with Connect's
``config.storage.*`` / ``offset.storage.*`` / ``status.storage.*`` topic settings: short
``segment.ms`` so segments roll and the cleaner compacts them). A source connector (compiled here,
with ``test_group_administration``'s plugin builder) numbers its records 0, 1, 2, ... and stores
the next number as its source offset. Its config is updated many times (many records per key in
the config topic) and it commits offsets many times; once the cleaner has compacted the config and
offsets topics (fewer records stored than written), the worker is SIGKILLed and a new worker of
the same group must restore the connector with its latest config from the compacted config topic
and resume from the committed offset in the compacted offsets topic: with exactly-once source
support (KIP-618, Strata's transaction coordinator) the topic holds every number exactly once;
at least once, numbers after the last committed offset may repeat but none is skipped.

Needs Java, the Kafka jars (``make kafka-dist``) and a JDK's ``javac``/``jar``; skips without them.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from broker_process import BrokerProcess, free_port, stop_process
from kafka_tools import kafka_java_command, require_kafka_dist
import test_group_administration as group_administration
from test_group_administration import build_sink_plugin, rest, wait_for
from test_consumer_groups import NO_DELAY, assert_clean_log

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, ConfigResource, NewTopic, ResourceType)

CONNECT_DISTRIBUTED = "org.apache.kafka.connect.cli.ConnectDistributed"
GROUP = "strata-connect"
CONFIG_TOPIC, OFFSETS_TOPIC, STATUS_TOPIC = "connect-configs", "connect-offsets", "connect-status"
DATA_TOPIC = "numbers"
CONNECTOR = "numbers"
MIN_UPDATES = 5          # config updates before the config topic may count as compacted
MIN_COMMITS = 5          # offset commits before the offsets topic may count as compacted
BATCH = 10               # records per poll of the source task

# --------------------------------------------------------------------------- the plugin

CONNECTOR_JAVA = r"""
package strata.testing;

import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.ExactlyOnceSupport;
import org.apache.kafka.connect.source.SourceConnector;

/** A source connector numbering its records 0, 1, 2, ... in one source partition; its task
 *  resumes after the number in its committed source offset. */
public class NumberingSourceConnector extends SourceConnector {
    private Map<String, String> props;

    @Override public void start(Map<String, String> props) { this.props = new HashMap<>(props); }
    @Override public Class<? extends Task> taskClass() { return NumberingSourceTask.class; }
    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(props);
    }
    @Override public void stop() { }
    @Override public ConfigDef config() {
        return new ConfigDef()
            .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "target topic")
            .define("generation", ConfigDef.Type.STRING, "0", ConfigDef.Importance.LOW,
                    "written into every record's value")
            .define("batch.size", ConfigDef.Type.INT, 10, ConfigDef.Importance.LOW,
                    "records per poll")
            .define("poll.interval.ms", ConfigDef.Type.LONG, 50L, ConfigDef.Importance.LOW,
                    "pause before each poll's records");
    }
    @Override public ExactlyOnceSupport exactlyOnceSupport(Map<String, String> props) {
        return ExactlyOnceSupport.SUPPORTED;
    }
    @Override public String version() { return "1.0"; }
}
"""

TASK_JAVA = r"""
package strata.testing;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

/** The task of {@link NumberingSourceConnector}: key = the number, value =
 *  "generation:number", source offset {"next": number + 1}. */
public class NumberingSourceTask extends SourceTask {
    static final Map<String, String> PARTITION = Collections.singletonMap("sequence", "0");
    private String topic, generation;
    private int batch;
    private long pollMs, next;

    @Override public void start(Map<String, String> props) {
        topic = props.get("topic");
        generation = props.getOrDefault("generation", "0");
        batch = Integer.parseInt(props.getOrDefault("batch.size", "10"));
        pollMs = Long.parseLong(props.getOrDefault("poll.interval.ms", "50"));
        Map<String, Object> offset = context.offsetStorageReader().offset(PARTITION);
        next = offset == null ? 0 : ((Number) offset.get("next")).longValue();
        System.out.println("NumberingSourceTask generation " + generation + " starts at " + next
                           + " (committed offset " + offset + ")");
        System.out.flush();
    }

    @Override public List<SourceRecord> poll() throws InterruptedException {
        Thread.sleep(pollMs);
        List<SourceRecord> out = new ArrayList<>(batch);
        for (int i = 0; i < batch; i++, next++) {
            out.add(new SourceRecord(PARTITION, Collections.singletonMap("next", next + 1),
                                     topic, 0, Schema.STRING_SCHEMA, Long.toString(next),
                                     Schema.STRING_SCHEMA, generation + ":" + next));
        }
        return out;
    }

    @Override public void stop() { }
    @Override public String version() { return "1.0"; }
}
"""


def build_source_plugin(work: Path, monkeypatch) -> Path:
    """A plugin.path directory holding NumberingSourceConnector, built by
    ``test_group_administration.build_sink_plugin`` from sources written under ``work``."""
    sources = work / "sources"
    package = sources / "strata" / "testing"
    package.mkdir(parents=True)
    (package / "NumberingSourceConnector.java").write_text(CONNECTOR_JAVA)
    (package / "NumberingSourceTask.java").write_text(TASK_JAVA)
    services = sources / "META-INF" / "services"
    services.mkdir(parents=True)
    (services / "org.apache.kafka.connect.source.SourceConnector").write_text(
        "strata.testing.NumberingSourceConnector\n")
    monkeypatch.setattr(group_administration, "CONNECT_PLUGIN_SOURCES", sources)
    return build_sink_plugin(work)


# --------------------------------------------------------------------------- the worker

LOG4J = """status = error
name = strata-connect-distributed
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.connect.name = org.apache.kafka.connect
logger.connect.level = INFO
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""

# Topic settings Connect passes on when it creates its internal topics (KIP-605): segments roll
# after 500 ms (at the next append) and every rolled segment is cleanable.
INTERNAL_TOPIC_SETTINGS = {"segment.ms": "500", "min.cleanable.dirty.ratio": "0.01"}


class Worker:
    """One ConnectDistributed process of group ``GROUP``, its REST API on a free port."""

    def __init__(self, work: Path, name: str, bootstrap: str, plugins: Path, eos: bool):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker_id = f"127.0.0.1:{self.port}"
        self.log_path = work / f"{name}.log"
        props = {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": CONFIG_TOPIC,
            "offset.storage.topic": OFFSETS_TOPIC,
            "status.storage.topic": STATUS_TOPIC,
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "offset.flush.interval.ms": "300",
            "exactly.once.source.support": "enabled" if eos else "disabled",
            # a killed worker's connector and task move as soon as its session expires
            "scheduled.rebalance.max.delay.ms": "0",
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "listeners": self.url,
            "plugin.path": str(plugins),
            # the plugin has its ServiceLoader manifest: no 4 s reflective scan of the classpath
            "plugin.discovery": "service_load",
            **{f"{prefix}.{k}": v for prefix in ("config.storage", "offset.storage",
                                                 "status.storage")
               for k, v in INTERNAL_TOPIC_SETTINGS.items()},
        }
        self.properties = work / f"{name}.properties"
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log4j = work / "connect-log4j2.properties"
        log4j.write_text(LOG4J)
        self.command = [f"-Dlog4j2.configurationFile={log4j}"
                        if arg.startswith("-Dlog4j2.configurationFile=") else arg
                        for arg in kafka_java_command(CONNECT_DISTRIBUTED, str(self.properties))]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Worker":
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, timeout=60)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rest(self, path: str, method: str = "GET", body=None):
        assert self.alive(), f"the worker exited:\n{self.output()[-5000:]}"
        return rest(f"{self.url}{path}", method, body)


def connector_config(generation: int, eos: bool) -> dict[str, str]:
    config = {"connector.class": "strata.testing.NumberingSourceConnector", "tasks.max": "1",
              "topic": DATA_TOPIC, "generation": str(generation), "batch.size": str(BATCH),
              "poll.interval.ms": "50"}
    if eos:   # one transaction per offset.flush.interval.ms; refuse to run without EOS
        config |= {"exactly.once.support": "required", "transaction.boundary": "interval"}
    return config


def running_on(worker: Worker) -> dict | None:
    """The connector's status when it and its task are RUNNING on ``worker``."""
    status, body = worker.rest(f"/connectors/{CONNECTOR}/status")
    if status != 200:
        return None
    for state in (body["connector"], *body["tasks"]):
        if state["state"] == "FAILED":
            pytest.fail(f"the connector or its task failed: {state.get('trace')}")
    if body["connector"]["state"] != "RUNNING" or len(body["tasks"]) != 1:
        return None
    task = body["tasks"][0]
    ok = task["state"] == "RUNNING" and task["worker_id"] == body["connector"]["worker_id"] \
        == worker.worker_id
    return body if ok else None


def committed_next(worker: Worker) -> int | None:
    """The next number in the connector's committed source offset (REST, KIP-875)."""
    status, body = worker.rest(f"/connectors/{CONNECTOR}/offsets")
    if status != 200 or not body["offsets"]:
        return None
    [entry] = body["offsets"]
    assert entry["partition"] == {"sequence": "0"}, body
    return entry["offset"]["next"]


def put_config(worker: Worker, generation: int, eos: bool) -> int:
    """Create or update the connector (PUT .../config); retried while the worker answers 404
    (its REST resources not registered yet) or 409 (joining its group, or rebalancing).
    Returns the HTTP status, 201 or 200."""
    def attempt():
        status, body = worker.rest(f"/connectors/{CONNECTOR}/config", "PUT",
                                   connector_config(generation, eos))
        if status in (404, 409):
            return None
        assert status in (200, 201), (status, body)
        return status
    return wait_for(f"the worker to take config generation {generation}", attempt, timeout=60)


def task_generation(worker: Worker) -> int | None:
    status, body = worker.rest(f"/connectors/{CONNECTOR}/tasks")
    if status != 200 or len(body) != 1:
        return None
    return int(body[0]["config"]["generation"])


# --------------------------------------------------------------------------- the topics

def admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def topic_configs(a: AdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = a.describe_configs([resource])[resource].result(30)
    return {name: entry.value for name, entry in entries.items()}


def read_partition(bootstrap: str, topic: str, committed: bool = False,
                   timeout: float = 30) -> tuple[int, list]:
    """(h, the records of partition 0 of ``topic`` from its start to at least h), h being its
    high watermark when called.

    It ends at the end of the partition (the last stable offset with ``committed``) or, on a
    partition being written all the time, where a fetch never comes back empty, at the first
    record at or past that high watermark."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "strata-test-reader",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "isolation.level": "read_committed" if committed else "read_uncommitted"})
    tp = ck.TopicPartition(topic, 0)
    try:
        _, high = c.get_watermark_offsets(tp, timeout=10)
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"reading {topic} did not reach its end: {len(out)} records read, the last "
                    f"at {out[-1].offset() if out else None}; position {c.position([tp])}, "
                    f"watermarks when called {high}, now {c.get_watermark_offsets(tp, 10)}")
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    return high, out
                raise ck.KafkaException(m.error())
            out.append(m)
            if m.offset() >= high:
                return high, out
    finally:
        c.close()


class Witness:
    """Tails partition 0 of a topic from offset 0 (read_uncommitted) while it is written and
    keeps the offset and key of every record it sees: the records written, even after the
    cleaner has removed some of them."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.keys: dict[int, bytes | None] = {}
        self.reached = 0          # it has read every record below this offset
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = ck.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"strata-test-witness-{topic}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "fetch.wait.max.ms": 50})
        self._consumer.assign([ck.TopicPartition(topic, 0, 0)])
        self._thread = threading.Thread(target=self._run, name=f"witness-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                m = self._consumer.poll(0.2)
                if m is None:
                    continue
                if m.error() is None:
                    with self._lock:
                        self.keys[m.offset()] = m.key()
                        self.reached = max(self.reached, m.offset() + 1)
                elif m.error().code() == ck.KafkaError._PARTITION_EOF:
                    [tp] = self._consumer.position([ck.TopicPartition(self.topic, 0)])
                    with self._lock:
                        self.reached = max(self.reached, tp.offset)
        finally:
            self._consumer.close()

    def written(self, below: int) -> list[bytes | None] | None:
        """The keys written at offsets below ``below``; None until it has read that far."""
        with self._lock:
            if self.reached < below:
                return None
            return [k for o, k in self.keys.items() if o < below]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def compaction(b: BrokerProcess, witness: Witness) -> tuple[list, list] | None:
    """(keys written, keys stored) below the topic's current high watermark, once the witness
    has read that far."""
    high, records = read_partition(b.bootstrap, witness.topic)
    stored = [m.key() for m in records if m.offset() < high]
    written = witness.written(high)
    return None if written is None else (written, stored)


def numbers(b: BrokerProcess, committed: bool) -> list[tuple[int, int]]:
    """(number, generation) of each record of the data topic, in offset order."""
    out = []
    for m in read_partition(b.bootstrap, DATA_TOPIC, committed=committed)[1]:
        generation, number = m.value().decode().split(":")
        assert m.key().decode() == number
        out.append((int(number), int(generation)))
    return out


# --------------------------------------------------------------------------- the test

@pytest.mark.parametrize("eos", [True, False], ids=["exactly-once", "at-least-once"])
def test_connect_distributed_restarts_from_its_compacted_config_and_offsets_topics(
        tmp_path, monkeypatch, eos):
    require_kafka_dist()
    plugins = build_source_plugin(tmp_path / "plugin", monkeypatch)
    overrides = {**NO_DELAY, "log.cleaner.enable": "true", "log.cleaner.backoff.ms": "100"}
    connector_key = f"connector-{CONNECTOR}".encode()          # its config, in the config topic
    offset_key = f'["{CONNECTOR}",{{"sequence":"0"}}]'.encode()  # its offset, in the offsets topic
    witnesses: list[Witness] = []
    workers: list[Worker] = []
    with BrokerProcess(tmp_path / "broker", overrides=overrides) as b:
        try:
            a = admin(b)   # referenced until its results are in
            a.create_topics([NewTopic(DATA_TOPIC, 1, 1)])[DATA_TOPIC].result(30)
            first = Worker(tmp_path, "worker-1", b.bootstrap, plugins, eos).start()
            workers.append(first)

            # Connect creates its internal topics: compacted, with the topic settings given.
            internal = (CONFIG_TOPIC, OFFSETS_TOPIC, STATUS_TOPIC)
            wait_for("Connect to create its internal topics", lambda: first.alive() and set(
                internal) <= set(a.list_topics(timeout=10).topics), timeout=60)
            for topic in internal:
                configs = topic_configs(a, topic)
                assert configs["cleanup.policy"] == "compact", (topic, configs)
                for k, v in INTERNAL_TOPIC_SETTINGS.items():
                    assert configs[k] == v, (topic, k, configs)
            config_witness = Witness(b.bootstrap, CONFIG_TOPIC)
            offsets_witness = Witness(b.bootstrap, OFFSETS_TOPIC)
            witnesses += [config_witness, offsets_witness]

            # Create the connector, then update its config (a record of the same key each
            # time) until the cleaner has compacted the config topic.
            generation = 0
            assert put_config(first, generation, eos) == 201
            wait_for("the connector to run", lambda: running_on(first), timeout=60)
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "the config topic was not compacted"
                generation += 1
                assert put_config(first, generation, eos) == 200
                wait_for(f"the task configs of generation {generation}",
                         lambda: task_generation(first) == generation, timeout=60)
                wait_for(f"the task of generation {generation} to run",
                         lambda: running_on(first), timeout=60)
                if generation < MIN_UPDATES:
                    continue
                got = compaction(b, config_witness)
                if got is not None and len(got[1]) < len(got[0]) and \
                        got[1].count(connector_key) < got[0].count(connector_key):
                    config_written, config_stored = got
                    break
            assert config_written.count(connector_key) >= generation + 1, config_written

            # The task commits its offsets many times, and the cleaner compacts them.
            def offsets_compacted():
                got = compaction(b, offsets_witness)
                if got is None or got[0].count(offset_key) < MIN_COMMITS:
                    return None
                return got if got[1].count(offset_key) < got[0].count(offset_key) else None

            offsets_written, offsets_stored = wait_for(
                "the offsets topic to be compacted", offsets_compacted, timeout=60)

            before_kill = committed_next(first)
            assert before_kill is not None and before_kill > 0
            first.kill()

            # A new worker of the group restores the connector from the compacted topics: its
            # latest config, RUNNING, resuming from its committed offset.
            second = Worker(tmp_path, "worker-2", b.bootstrap, plugins, eos).start()
            workers.append(second)
            wait_for("the connector to run on the new worker", lambda: running_on(second),
                     timeout=90)
            status, body = second.rest(f"/connectors/{CONNECTOR}/config")
            assert status == 200, body
            assert body == {**connector_config(generation, eos), "name": CONNECTOR}
            assert task_generation(second) == generation
            starts = re.findall(r"NumberingSourceTask generation (\d+) starts at (\d+)",
                                second.output())
            assert len(starts) == 1, second.output()[-5000:]
            resumed_generation, resumed_at = map(int, starts[0])
            assert resumed_generation == generation
            assert resumed_at >= before_kill, (resumed_at, before_kill)
            wait_for("the restored task to commit offsets", lambda: (
                committed_next(second) or 0) >= resumed_at + 3 * BATCH, timeout=60)

            got = numbers(b, committed=True)
            seq = [n for n, _ in got]
            if eos:
                # every number once, in order: nothing lost, nothing written twice
                assert seq == list(range(len(seq))), _describe(seq)
            else:
                # at least once: no number lost; repeats only of numbers after the offset
                # committed before the kill
                assert sorted(set(seq)) == list(range(max(seq) + 1)), _describe(seq)
                repeated = sorted(n for n, times in Counter(seq).items() if times > 1)
                assert all(n >= before_kill for n in repeated), (before_kill, repeated)
            assert max(seq) >= resumed_at + 3 * BATCH - 1, _describe(seq)
            assert {g for n, g in got if n >= resumed_at} == {generation}

            second.stop()
        finally:
            for w in workers:
                w.kill()
            for w in witnesses:
                w.close()
        print(f"config topic: {len(config_written)} records written, {len(config_stored)} "
              f"stored ({config_written.count(connector_key)} connector configs, "
              f"{config_stored.count(connector_key)} stored); offsets topic: "
              f"{len(offsets_written)} written, {len(offsets_stored)} stored; resumed at "
              f"{resumed_at} (committed {before_kill} before the kill); {len(seq)} records")
    assert_clean_log(b)


def _describe(seq: list[int]) -> str:
    breaks = [(x, y) for x, y in zip(seq, seq[1:]) if y != x + 1]
    return f"{len(seq)} numbers, up to {max(seq, default=None)}; breaks: {breaks[:20]}"
