"""Topics on the shipped config (config/server.properties: every topic tiered by
``log.remote.storage.enable``, ``log.local.retention.ms`` one day, retention checked every five
minutes), through unmodified clients: short retention, compaction and its keyless records,
and DeleteRecords' low watermark (issue 23, items 3, 7, 8 and 9).
"""

from __future__ import annotations

import re
import time

import pytest

from broker_process import BrokerProcess
from kafka_tools import KAFKA_CONFIGS, KAFKA_TOPICS, require_kafka_dist, run_kafka_class
from tiered_support import TIERED_BROKER, list_offset, offsets, wait_for

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError as CkError  # noqa: E402
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic)

DAY = 86_400_000
SHIPPED = {**TIERED_BROKER,
           "log.remote.storage.enable": "true",
           "log.local.retention.ms": str(DAY),
           "log.retention.check.interval.ms": "300000"}
KEYLESS = "Compacted topic cannot accept message without key in topic partition {}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("shipped"), SHIPPED) as b:
        yield b
    bad = [line for line in b.output().splitlines() if "Traceback" in line]
    assert not bad, "broker logged tracebacks:\n" + "\n".join(bad)


def admin(b) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create(b, topic, **configs):
    a = admin(b)  # the client must outlive its futures
    a.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)


def alter(b, topic, **configs):
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    a = admin(b)
    a.incremental_alter_configs([res])[res].result(30)


def described(b, topic) -> dict:
    res = ConfigResource("topic", topic)
    a = admin(b)
    return a.describe_configs([res])[res].result(30)


def kafka_error(future) -> CkError:
    with pytest.raises(ck.KafkaException) as info:
        future.result(30)
    return info.value.args[0]


def produce(b, topic, records, **conf) -> list:
    """(key, value, timestamp) records in one batch; the delivery error of each (None: ok)."""
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 50, "acks": "all", **conf})
    errors = []
    for key, value, ts in records:
        p.produce(topic, key=key, value=value, partition=0, timestamp=ts or 0,
                  on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    p.close()
    return errors


def kafka_tool(main_class, *args) -> str:
    require_kafka_dist()
    result = run_kafka_class(main_class, *args)
    assert result.returncode == 0, f"{main_class} {args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


# ---- item 3: short retention on a tiered-by-default broker ---------------------------------------

def test_a_short_retention_is_accepted_and_caps_the_inherited_local_retention(broker):
    create(broker, "short", **{"retention.ms": "3600000"})
    entry = described(broker, "short")["local.retention.ms"]
    assert (entry.value, entry.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert described(broker, "short")["remote.storage.enable"].value == "true"
    alter(broker, "short", **{"retention.ms": "1800000"})
    assert described(broker, "short")["local.retention.ms"].value == "1800000"
    # legacy AlterConfigs (the whole override set)
    res = ConfigResource("topic", "short", set_config={"retention.ms": "600000"})
    a = admin(broker)
    a.alter_configs([res])[res].result(30)
    assert described(broker, "short")["local.retention.ms"].value == "600000"
    alter(broker, "short", **{"retention.ms": "-1"})
    assert described(broker, "short")["local.retention.ms"].value == str(DAY)
    # a local retention the client sets itself still follows Kafka's rule
    err = kafka_error(a.create_topics([NewTopic("own", 1, 1, config={
        "retention.ms": "3600000", "local.retention.ms": str(DAY)})])["own"])
    assert err.code() == CkError.INVALID_CONFIG
    assert "Value must not be more than retention.ms property value: 3600000" in err.str()


def test_kafka_topics_and_kafka_configs_set_a_short_retention(broker):
    kafka_tool(KAFKA_TOPICS, "--bootstrap-server", broker.bootstrap, "--create", "--topic",
               "cli-short", "--config", "retention.ms=3600000")
    kafka_tool(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type",
               "topics", "--entity-name", "cli-short", "--add-config", "retention.ms=1800000")
    out = kafka_tool(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--describe",
                     "--all", "--entity-type", "topics", "--entity-name", "cli-short")
    assert re.search(r"local\.retention\.ms=1800000 sensitive=false synonyms=\{"
                     r"STATIC_BROKER_CONFIG:log\.local\.retention\.ms=86400000, "
                     r"DEFAULT_CONFIG:log\.local\.retention\.ms=-2\}", out), out


# ---- item 7: keyless records on compacted topics -------------------------------------------------

@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_a_keyless_record_on_a_compacted_topic_is_refused_with_invalid_record(broker, compression):
    topic = f"compacted-{compression}"
    create(broker, topic, **{"cleanup.policy": "compact"})
    errors = produce(broker, topic, [(b"k1", b"v1", None), (None, b"v2", None)],
                     **{"compression.type": compression})
    assert errors[1] is not None and errors[1].code() == CkError.INVALID_RECORD, errors
    # the keyed record fails with it when both went in one batch (the usual case)
    assert errors[0] is None or errors[0].code() == CkError.INVALID_RECORD, errors
    assert produce(broker, topic, [(b"k3", b"v3", None), (b"", b"empty key", None)]) == [None, None]
    # nothing of a refused batch was appended
    assert offsets(broker.bootstrap, topic)["end"] == 2 + (errors[0] is None)
    # a plain topic takes keyless records
    create(broker, f"plain-{compression}")
    assert produce(broker, f"plain-{compression}", [(None, b"v", None)]) == [None]


def test_kafka_python_gets_each_keyless_records_error_from_record_errors(broker):
    kafka = pytest.importorskip("kafka")
    create(broker, "compacted-kp", **{"cleanup.policy": "compact,delete"})
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=1000,
                                   retries=0, compression_type="gzip")
    try:
        futures = [producer.send("compacted-kp", key=k, value=b"v", partition=0)
                   for k in (b"a", None, b"b", None)]
        producer.flush(30)
    finally:
        producer.close()
    errors = [f.exception for f in futures]
    assert all(e is not None for e in errors), errors
    for i in (1, 3):
        assert isinstance(errors[i], kafka.errors.InvalidRecordError), errors[i]
        assert KEYLESS.format("compacted-kp-0") in str(errors[i])
    for i in (0, 2):
        assert "part of a batch which had one more more invalid records" in str(errors[i])


# ---- item 8: DeleteRecords' low watermark --------------------------------------------------------

def test_delete_records_answers_the_requested_offset_and_leaves_retention_to_its_task(broker):
    create(broker, "trim", **{"remote.storage.enable": "false", "retention.ms": "3600000"})
    old = int(time.time() * 1000) - 7_200_000   # past retention.ms: retention may delete it all
    assert produce(broker, "trim", [(b"k%d" % i, b"v", old + i) for i in range(20)]) == [None] * 20
    a = admin(broker)
    [res] = a.delete_records([CkTp("trim", 0, 5)]).values()
    assert res.result(30).low_watermark == 5
    assert list_offset(broker.bootstrap, "trim", 0, -2)[:2] == (0, 5)
    # compaction keeps its records: Kafka refuses DeleteRecords on a compact-only topic
    create(broker, "kept", **{"cleanup.policy": "compact"})
    assert produce(broker, "kept", [(b"k", b"v", None)]) == [None]
    [res] = a.delete_records([CkTp("kept", 0, 1)]).values()
    assert kafka_error(res).code() == CkError.POLICY_VIOLATION


# ---- item 9: compacting a topic tiered by the broker default -------------------------------------

def test_a_topic_tiered_by_default_becomes_compacted_while_nothing_is_remote(broker):
    create(broker, "becomes-compacted")
    assert described(broker, "becomes-compacted")["remote.storage.enable"].value == "true"
    kafka_tool(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type",
               "topics", "--entity-name", "becomes-compacted", "--add-config",
               "cleanup.policy=compact")
    configs = described(broker, "becomes-compacted")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["remote.storage.enable"].value == "false"
    [error] = produce(broker, "becomes-compacted", [(None, b"v", None)])
    assert error.code() == CkError.INVALID_RECORD


def test_a_topic_with_remote_data_is_told_how_to_stop_being_tiered(broker):
    create(broker, "has-remote", **{"internal.segment.bytes": "16384",
                                    "segment.index.bytes": "4096"})
    records = [(b"k%d" % i, b"x" * 200, None) for i in range(400)]
    assert produce(broker, "has-remote", records, **{"batch.size": 4096}) == [None] * 400
    wait_for(lambda: offsets(broker.bootstrap, "has-remote")["tiered"] >= 0, 60, what="tiered")
    res = ConfigResource("topic", "has-remote", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    a = admin(broker)
    err = kafka_error(a.incremental_alter_configs([res])[res])
    assert err.code() == CkError.INVALID_CONFIG
    assert err.str().startswith("Topic has-remote is tiered by the broker default "
                                "log.remote.storage.enable=true and partition has-remote-0 has "
                                "data in remote storage"), err.str()
    assert "`remote.storage.enable=false,remote.log.delete.on.disable=true`" in err.str()
    assert described(broker, "has-remote")["cleanup.policy"].value == "delete"
    # what the message says to do
    alter(broker, "has-remote", **{"cleanup.policy": "compact", "remote.storage.enable": "false",
                                   "remote.log.delete.on.disable": "true"})
    assert described(broker, "has-remote")["remote.storage.enable"].value == "false"


def test_a_topic_that_asked_for_tiering_keeps_kafkas_rule(broker):
    create(broker, "asked", **{"remote.storage.enable": "true"})
    res = ConfigResource("topic", "asked", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    a = admin(broker)
    err = kafka_error(a.incremental_alter_configs([res])[res])
    assert err.code() == CkError.INVALID_CONFIG
    assert err.str() == ("Remote log storage only supports topics with cleanup.policy=delete or "
                         "cleanup.policy being an empty list.")
