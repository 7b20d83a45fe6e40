"""Apache Kafka 4.x's own command-line tools against a live Strata broker.

The tools are Kafka's Java classes from Maven Central (scripts/kafka-dist.sh); without Java or
Maven these tests skip with the reason. Each tool runs as a user would run it, and its output
is checked for what the broker must have done.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from broker_process import BrokerProcess
from kafka_tools import (
    CONSOLE_CONSUMER, CONSOLE_PRODUCER, CONSUMER_GROUPS, CONSUMER_PERF, DELETE_RECORDS,
    GET_OFFSETS, KAFKA_CONFIGS, KAFKA_TOPICS, PRODUCER_PERF, require_kafka_dist,
    run_kafka_class)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("cli"),
                       overrides={"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def tool(main_class: str, *args: str, input: str | None = None, timeout: float = 120) -> str:
    """Run a tool; its stdout. Fails the test with the tool's output if it exits non-zero."""
    result = run_kafka_class(main_class, *args, input=input, timeout=timeout)
    assert result.returncode == 0, f"{main_class} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def topics(b, *args, **kw) -> str:
    return tool(KAFKA_TOPICS, "--bootstrap-server", b.bootstrap, *args, **kw)


def offsets(b, topic: str, time_spec: str) -> dict[int, int]:
    out = tool(GET_OFFSETS, "--bootstrap-server", b.bootstrap, "--topic", topic, "--time", time_spec)
    found = {}
    for line in out.split():
        name, partition, offset = line.rsplit(":", 2)
        if name == topic:
            found[int(partition)] = int(offset)
    return found


def test_kafka_topics_creates_with_configs_describes_alters_and_deletes(broker):
    out = topics(broker, "--create", "--topic", "cli-orders", "--partitions", "3",
                 "--replication-factor", "1", "--config", "retention.ms=12345",
                 "--config", "cleanup.policy=compact")
    assert "Created topic cli-orders." in out
    out = topics(broker, "--describe", "--topic", "cli-orders")
    assert re.search(r"Topic: cli-orders\s+TopicId: \S+\s+PartitionCount: 3\s+ReplicationFactor: 1", out), out
    assert "retention.ms=12345" in out and "cleanup.policy=compact" in out
    for p in range(3):
        assert re.search(rf"Partition: {p}\s+Leader: 1\s+Replicas: 1\s+Isr: 1", out), out
    topics(broker, "--alter", "--topic", "cli-orders", "--partitions", "5")
    assert "PartitionCount: 5" in topics(broker, "--describe", "--topic", "cli-orders")
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", broker.bootstrap, "--create",
                             "--topic", "cli-orders", "--partitions", "1")
    assert result.returncode != 0 and "already exists" in result.stdout + result.stderr
    assert "cli-orders" in topics(broker, "--list").split()
    topics(broker, "--delete", "--topic", "cli-orders")
    assert "cli-orders" not in topics(broker, "--list").split()


def test_kafka_configs_alters_and_describes_topic_and_broker_configs(broker):
    topics(broker, "--create", "--topic", "cli-configs", "--partitions", "1")
    configs = ("--bootstrap-server", broker.bootstrap, "--entity-type", "topics",
               "--entity-name", "cli-configs")
    tool(KAFKA_CONFIGS, *configs, "--alter", "--add-config",
         "retention.ms=999,cleanup.policy=[delete,compact]")
    out = tool(KAFKA_CONFIGS, *configs, "--describe")
    assert "retention.ms=999" in out and "cleanup.policy=delete,compact" in out
    tool(KAFKA_CONFIGS, *configs, "--alter", "--delete-config", "retention.ms")
    out = tool(KAFKA_CONFIGS, *configs, "--describe", "--all")
    assert re.search(r"retention.ms=604800000 sensitive=false synonyms=\{DEFAULT_CONFIG:log.retention.hours=168", out), out
    out = tool(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--entity-type", "brokers",
               "--entity-name", "1", "--describe", "--all")
    assert re.search(r"log.dirs=\S+ sensitive=false synonyms=\{STATIC_BROKER_CONFIG:log.dirs=", out), out


def test_console_producer_and_group_consumer_round_trip_keys_values_and_headers(broker):
    topics(broker, "--create", "--topic", "cli-console", "--partitions", "1")
    lines = [f"h{i}:x{i},trace:t{i}\tkey-{i}\tvalue-{i}" for i in range(20)]
    tool(CONSOLE_PRODUCER, "--bootstrap-server", broker.bootstrap, "--topic", "cli-console",
         "--reader-property", "parse.key=true", "--reader-property", "parse.headers=true",
         input="\n".join(lines) + "\n")
    before = int(time.time() * 1000)
    out = tool(CONSOLE_CONSUMER, "--bootstrap-server", broker.bootstrap, "--topic", "cli-console",
               "--group", "cli-group", "--from-beginning", "--max-messages", "20",
               "--formatter-property", "print.key=true", "--formatter-property", "print.headers=true",
               "--formatter-property", "print.timestamp=true", "--formatter-property", "print.offset=true")
    got = [line.split("\t") for line in out.splitlines() if line.startswith("CreateTime:")]
    assert len(got) == 20, out
    for i, (ts, offset, headers, key, value) in enumerate(got):
        assert 0 < int(ts.split(":")[1]) <= before
        assert (offset, headers, key, value) == (f"Offset:{i}", f"h{i}:x{i},trace:t{i}", f"key-{i}", f"value-{i}")
    out = tool(CONSUMER_GROUPS, "--bootstrap-server", broker.bootstrap, "--describe", "--group", "cli-group")
    assert re.search(r"cli-group\s+cli-console\s+0\s+20\s+20\s+0", out), out
    assert "cli-group" in tool(CONSUMER_GROUPS, "--bootstrap-server", broker.bootstrap, "--list").split()


def test_get_offsets_and_delete_records_move_the_log_start(broker, tmp_path):
    topics(broker, "--create", "--topic", "cli-trim", "--partitions", "2")
    tool(CONSOLE_PRODUCER, "--bootstrap-server", broker.bootstrap, "--topic", "cli-trim",
         "--producer-property", "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
         input="".join(f"v{i}\n" for i in range(10)))
    latest = offsets(broker, "cli-trim", "-1")
    assert sum(latest.values()) == 10 and offsets(broker, "cli-trim", "-2") == {0: 0, 1: 0}
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "cli-trim", "partition": 0, "offset": 2}]}))
    out = tool(DELETE_RECORDS, "--bootstrap-server", broker.bootstrap, "--offset-json-file", str(spec))
    assert re.search(r"partition: cli-trim-0\s+low_watermark: 2", out), out
    assert offsets(broker, "cli-trim", "-2") == {0: 2, 1: 0}
    assert offsets(broker, "cli-trim", "-1") == latest


def test_perf_tools_produce_and_consume_every_record(broker):
    topics(broker, "--create", "--topic", "cli-perf", "--partitions", "2")
    out = tool(PRODUCER_PERF, "--bootstrap-server", broker.bootstrap, "--topic", "cli-perf",
               "--num-records", "20000", "--record-size", "1024", "--throughput", "-1",
               "--command-property", "acks=all", "--command-property", "linger.ms=5",
               "--command-property", "batch.size=262144")
    assert re.search(r"20000 records sent, [\d.]+ records/sec", out), out
    assert sum(offsets(broker, "cli-perf", "-1").values()) == 20000
    out = tool(CONSUMER_PERF, "--bootstrap-server", broker.bootstrap, "--topic", "cli-perf",
               "--num-records", "20000", "--timeout", "30000")
    header, row = [line for line in out.splitlines() if line.strip()][-2:]
    fields = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")]))
    assert int(fields["data.consumed.in.nMsg"]) == 20000, out
    assert float(fields["data.consumed.in.MB"]) == pytest.approx(20000 * 1024 / 1024 / 1024, rel=0.01)


def test_java_tools_read_a_tiered_topic_across_both_tiers(tmp_path):
    """Kafka's GetOffsetShell asks for earliest-local (−4) and latest-tiered (−5) through the Java
    AdminClient (ListOffsets v8+), and the Java console consumer reads from offset 0 through the
    remote tier into the local one."""
    from tiered_support import TIERED_BROKER, offsets as raw_offsets, wait_for
    with BrokerProcess(tmp_path, TIERED_BROKER) as b:
        topics(b, "--create", "--topic", "tt", "--partitions", "1", "--config",
               "remote.storage.enable=true", "--config", "internal.segment.bytes=16384",
               "--config", "local.retention.bytes=1")
        lines = "".join(f"value-{i:05d}-{'x' * 200}\n" for i in range(400))
        tool(CONSOLE_PRODUCER, "--bootstrap-server", b.bootstrap, "--topic", "tt",
             "--producer-property", "batch.size=2048", input=lines)
        def settled():  # every inactive segment tiered and gone locally, twice in a row
            x = raw_offsets(b.bootstrap, "tt")
            local = list((tmp_path / "kafka-logs" / "tt-0").glob("*.log"))
            if x["tiered"] < 200 or x["local_start"] != x["tiered"] + 1 or len(local) != 1:
                return None  # only the active segment may stay local
            time.sleep(1)
            return x if raw_offsets(b.bootstrap, "tt") == x else None
        o = wait_for(settled, 60, what="tiering to settle")
        assert offsets(b, "tt", "-4") == {0: o["local_start"]}
        assert offsets(b, "tt", "-5") == {0: o["tiered"]}
        assert offsets(b, "tt", "-2") == {0: 0}
        out = tool(CONSOLE_CONSUMER, "--bootstrap-server", b.bootstrap, "--topic", "tt",
                   "--from-beginning", "--max-messages", "400", "--timeout-ms", "30000")
        got = [line for line in out.splitlines() if line.startswith("value-")]
        assert got == lines.splitlines()
