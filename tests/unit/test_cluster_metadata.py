"""The single node's cluster metadata: Kafka's topic and config rules, durability, listeners."""

from __future__ import annotations

import base64
import json
import threading
import uuid

import pytest

from strata.cluster.metadata import (
    BROKER_MANAGED_TOPICS,
    META_PROPERTIES_FILE,
    METADATA_FILE,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    ZERO_UUID,
    ClusterMetadata,
    ConfigEntryType,
    ConfigSource,
    MetaPropertiesError,
    TopicInfo,
    random_kafka_uuid,
    render_config_value,
    uuid_from_kafka_str,
    uuid_to_kafka_str,
)
from strata.common.config import ConfigType, load_properties
from strata.common.errors import ErrorCode, InvalidConfigError, KafkaError
from strata.log.log_config import LogConfig


def open_md(path, props=None, node_id=1):
    return ClusterMetadata(path, node_id, props or {})


def error_of(fn, *args, **kwargs) -> KafkaError:
    with pytest.raises(KafkaError) as info:
        fn(*args, **kwargs)
    return info.value


# ---- identity and meta.properties ------------------------------------------------------------

def test_first_start_writes_kafka_meta_properties(tmp_path):
    md = open_md(tmp_path / "logs", node_id=3)
    text = (tmp_path / "logs" / META_PROPERTIES_FILE).read_text()
    props = load_properties(text)
    assert set(props) == {"version", "node.id", "cluster.id", "directory.id"}
    assert props["version"] == "1"
    assert props["node.id"] == "3"
    assert props["cluster.id"] == md.cluster_id
    assert text.startswith("#\n#")  # java.util.Properties.store header
    for key in ("cluster.id", "directory.id"):
        value = props[key]
        assert len(value) == 22 and "=" not in value and not value.startswith("-")
        assert set(value) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(base64.urlsafe_b64decode(value + "==")) == 16
    assert uuid_from_kafka_str(props["directory.id"]).int >= 100  # outside Kafka's reserved ids
    assert md.node_id == 3 and md.controller_id == 3


def test_cluster_id_is_kept_across_restarts(tmp_path):
    first = open_md(tmp_path).cluster_id
    assert open_md(tmp_path).cluster_id == first
    assert open_md(tmp_path / "other").cluster_id != first


def test_mismatched_node_id_refuses_to_start(tmp_path):
    open_md(tmp_path, node_id=1)
    with pytest.raises(MetaPropertiesError, match="Stored node id 1 doesn't match .* node id 2"):
        open_md(tmp_path, node_id=2)


def test_meta_properties_without_cluster_id_is_an_error(tmp_path):
    (tmp_path / META_PROPERTIES_FILE).write_text("version=1\nnode.id=1\n")
    with pytest.raises(MetaPropertiesError, match="cluster.id"):
        open_md(tmp_path)


def test_metadata_file_of_another_cluster_is_refused(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    doc = json.loads((tmp_path / METADATA_FILE).read_text())
    doc["cluster_id"] = uuid_to_kafka_str(random_kafka_uuid())
    (tmp_path / METADATA_FILE).write_text(json.dumps(doc))
    with pytest.raises(MetaPropertiesError, match="Invalid cluster.id"):
        open_md(tmp_path)


def test_corrupt_metadata_file_is_an_error_not_an_empty_cluster(tmp_path):
    open_md(tmp_path).create_topic("t")
    (tmp_path / METADATA_FILE).write_text("{not json")
    with pytest.raises(MetaPropertiesError, match="Unreadable"):
        open_md(tmp_path)


def test_kafka_uuid_string_round_trips():
    for _ in range(100):
        u = random_kafka_uuid()
        s = uuid_to_kafka_str(u)
        assert len(s) == 22 and not s.startswith("-")
        assert uuid_from_kafka_str(s) == u
        assert u.version == 4
    assert uuid_to_kafka_str(ZERO_UUID) == "AAAAAAAAAAAAAAAAAAAAAA"
    with pytest.raises(ValueError):
        uuid_from_kafka_str("AAAA")


# ---- persistence ----------------------------------------------------------------------------

def test_topics_survive_reopen_with_ids_partitions_and_configs(tmp_path):
    md = open_md(tmp_path, {"num.partitions": "2"})
    a = md.create_topic("orders", 3, configs={"retention.ms": "1000", "cleanup.policy": "compact"})
    b = md.create_topic("events")
    md.create_partitions("events", 5)
    md.incremental_alter_topic_configs("events", [("segment.bytes", OP_SET, "2097152")])
    md.delete_topic(md.create_topic("gone").name)
    cluster_id = md.cluster_id

    again = open_md(tmp_path, {"num.partitions": "2"})
    assert again.cluster_id == cluster_id
    assert set(again.topics()) == {"orders", "events"}
    assert again.topic("orders") == a
    assert again.topic("events") == TopicInfo("events", b.topic_id, 5, {"segment.bytes": "2097152"})
    assert again.topic_by_id(a.topic_id).name == "orders"
    assert again.log_config("orders").retention_ms == 1000
    assert again.log_config("orders").is_compacted
    assert again.log_config("events").segment_bytes == 2097152


def test_metadata_file_is_json_with_kafka_topic_ids(tmp_path):
    md = open_md(tmp_path)
    info = md.create_topic("t", 2, configs={"retention.ms": "5"})
    doc = json.loads((tmp_path / METADATA_FILE).read_text())
    assert doc["version"] == 1 and doc["cluster_id"] == md.cluster_id
    assert doc["topics"] == [{"name": "t", "topic_id": uuid_to_kafka_str(info.topic_id),
                              "partitions": 2, "configs": {"retention.ms": "5"}}]
    assert not (tmp_path / (METADATA_FILE + ".tmp")).exists()


def test_failed_persist_leaves_state_unchanged(tmp_path, monkeypatch):
    md = open_md(tmp_path)
    md.create_topic("kept")
    import strata.cluster.metadata as module

    def boom(path, data, sync=True):
        raise OSError("disk full")
    monkeypatch.setattr(module, "atomic_write", boom)
    with pytest.raises(OSError):
        md.create_topic("lost")
    assert md.topic("lost") is None and set(md.topics()) == {"kept"}


def test_topic_ids_are_random_and_never_zero(tmp_path):
    md = open_md(tmp_path)
    ids = {md.create_topic(f"t{i}").topic_id for i in range(50)}
    assert len(ids) == 50 and ZERO_UUID not in ids
    assert all(isinstance(i, uuid.UUID) for i in ids)


# ---- CreateTopics ---------------------------------------------------------------------------

def test_create_uses_broker_defaults_for_minus_one(tmp_path):
    md = open_md(tmp_path, {"num.partitions": "4", "default.replication.factor": "1"})
    info = md.create_topic("t")
    assert info.partitions == 4 and info.configs == {}
    assert open_md(tmp_path / "b").create_topic("t").partitions == 1  # Kafka's default


@pytest.mark.parametrize("name, reason", [
    ("", "the empty string is not allowed"),
    (".", "'.' is not allowed"),
    ("..", "'..' is not allowed"),
    ("a" * 250, "is longer than the max allowed length 249"),
    ("bad name", "contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"),
    ("caf\u00e9", "contains one or more characters"),
    ("a/b", "contains one or more characters"),
])
def test_invalid_topic_names_are_invalid_topic_exception(tmp_path, name, reason):
    err = error_of(open_md(tmp_path).create_topic, name)
    assert err.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert str(err).startswith("Topic name is invalid: ") and reason in str(err)


def test_legal_topic_names_at_the_limits(tmp_path):
    md = open_md(tmp_path)
    for name in ("a" * 249, "A-Z_0.9", "...", "-", "_"):
        assert md.create_topic(name).name == name


def test_names_colliding_on_dot_and_underscore_are_refused(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("my.topic")
    err = error_of(md.create_topic, "my_topic")
    assert err.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert str(err) == "Topic 'my_topic' collides with existing topic: my.topic"
    assert error_of(md.create_topic, "my.topic").code == ErrorCode.TOPIC_ALREADY_EXISTS
    md.delete_topic("my.topic")
    assert md.create_topic("my_topic").name == "my_topic"


def test_existing_topic_is_topic_already_exists(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    err = error_of(md.create_topic, "t", 3)
    assert err.code == ErrorCode.TOPIC_ALREADY_EXISTS and str(err) == "Topic 't' already exists."


@pytest.mark.parametrize("partitions", [0, -2, -100])
def test_non_positive_partitions_are_invalid_partitions(tmp_path, partitions):
    err = error_of(open_md(tmp_path).create_topic, "t", partitions)
    assert err.code == ErrorCode.INVALID_PARTITIONS
    assert str(err) == "Number of partitions was set to an invalid non-positive value."


@pytest.mark.parametrize("rf", [0, -2])
def test_non_positive_replication_factor_is_invalid(tmp_path, rf):
    err = error_of(open_md(tmp_path).create_topic, "t", 1, rf)
    assert err.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert str(err) == "Replication factor must be larger than 0, or -1 to use the default value."


def test_replication_factor_above_one_cannot_be_placed_on_one_broker(tmp_path):
    md = open_md(tmp_path)
    err = error_of(md.create_topic, "t", 1, 3)
    assert err.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert str(err) == ("Unable to replicate the partition 3 time(s): The target replication "
                        "factor of 3 cannot be reached because only 1 broker(s) are registered.")
    assert md.create_topic("t", 1, 1).partitions == 1


def test_default_replication_factor_above_one_fails_like_kafka(tmp_path):
    md = open_md(tmp_path, {"default.replication.factor": "2"})
    assert error_of(md.create_topic, "t").code == ErrorCode.INVALID_REPLICATION_FACTOR


def test_cluster_metadata_topic_cannot_be_created(tmp_path):
    err = error_of(open_md(tmp_path).create_topic, "__cluster_metadata")
    assert err.code == ErrorCode.INVALID_REQUEST
    assert str(err) == "Creation of internal topic __cluster_metadata is prohibited."


def test_validate_only_creates_nothing(tmp_path):
    md = open_md(tmp_path)
    events = []
    md.add_listener(type("L", (), {"on_topic_created": lambda self, i: events.append(i)})())
    info = md.create_topic("t", 3, configs={"retention.ms": "10"}, validate_only=True)
    assert info.partitions == 3 and info.configs == {"retention.ms": "10"}
    assert md.topic("t") is None and events == []
    assert not (tmp_path / METADATA_FILE).exists()
    assert error_of(md.create_topic, "t", 0, validate_only=True).code == ErrorCode.INVALID_PARTITIONS


def test_checks_run_in_kafka_order(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    # exists beats bad configs and partitions; bad configs beat bad partitions / rf
    assert error_of(md.create_topic, "t", 0, configs={"x": "1"}).code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert error_of(md.create_topic, "u", 0, 0, configs={"x": "1"}).code == ErrorCode.INVALID_CONFIG
    assert error_of(md.create_topic, "u", 0, 0).code == ErrorCode.INVALID_REPLICATION_FACTOR


# ---- topic config validation ----------------------------------------------------------------

@pytest.mark.parametrize("configs, message", [
    ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
    ({"retention.ms": "abc"}, "Invalid value abc for configuration retention.ms: Not a number of type LONG"),
    ({"segment.bytes": "1_048_576"}, "Invalid value 1_048_576 for configuration segment.bytes: "
                                     "Not a number of type INT"),
    ({"segment.bytes": "4294967296"}, "Invalid value 4294967296 for configuration segment.bytes: "
                                      "Not a number of type INT"),
    ({"segment.bytes": "1000"}, "Invalid value 1000 for configuration segment.bytes: "
                                "Value must be at least 1048576"),
    ({"min.cleanable.dirty.ratio": "half"}, "Invalid value half for configuration "
                                            "min.cleanable.dirty.ratio: Not a number of type DOUBLE"),
    ({"preallocate": "yes"}, "Invalid value yes for configuration preallocate: "
                             "Expected value to be either true or false"),
    ({"cleanup.policy": "compact,shred"}, "Invalid value shred for configuration cleanup.policy: "
                                          "String must be one of: compact, delete"),
    ({"compression.type": "brotli"}, "Invalid value brotli for configuration compression.type"),
    ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
     "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"),
    ({"retention.ms": None}, "Null value not supported for topic configs: retention.ms"),
])
def test_bad_topic_configs_are_invalid_config_with_kafka_messages(tmp_path, configs, message):
    md = open_md(tmp_path)
    err = error_of(md.create_topic, "t", configs=configs)
    assert err.code == ErrorCode.INVALID_CONFIG
    assert str(err).startswith(message)
    assert md.topic("t") is None


def test_good_configs_are_kept_as_given_strings(tmp_path):
    md = open_md(tmp_path)
    info = md.create_topic("t", configs={"retention.ms": " 60000", "preallocate": "TRUE",
                                         "min.cleanable.dirty.ratio": "0.25"})
    assert info.configs == {"retention.ms": " 60000", "preallocate": "TRUE",
                            "min.cleanable.dirty.ratio": "0.25"}
    cfg = md.log_config("t")
    assert cfg.retention_ms == 60000 and cfg.preallocate is True
    assert cfg.get("min.cleanable.dirty.ratio") == 0.25


def test_log_config_overlays_topic_overrides_on_broker_defaults(tmp_path):
    md = open_md(tmp_path, {"log.retention.hours": "48", "log.segment.bytes": "2097152"})
    assert md.default_log_config().retention_ms == 48 * 3_600_000
    assert md.default_log_config().segment_bytes == 2097152
    md.create_topic("t", configs={"segment.bytes": "3145728"})
    cfg = md.log_config("t")
    assert isinstance(cfg, LogConfig)
    assert cfg.retention_ms == 48 * 3_600_000 and cfg.segment_bytes == 3145728
    assert md.log_config("unknown-topic") == md.default_log_config()


def test_config_validator_hook_sees_new_and_old_config_and_can_refuse(tmp_path):
    md = open_md(tmp_path, {"remote.log.storage.system.enable": "true"})
    calls = []

    def hook(name, new, old):
        calls.append((name, new.get("remote.storage.enable"),
                      None if old is None else old.get("remote.storage.enable")))
        if new.get("remote.storage.enable") and new.get("retention.ms") < 60_000:
            raise InvalidConfigError("tiered topics keep data for at least a minute")
    md.config_validator = hook
    md.create_topic("t", configs={"remote.storage.enable": "true"})
    assert calls == [("t", True, None)]
    err = error_of(md.incremental_alter_topic_configs, "t", [("retention.ms", OP_SET, "1000")])
    assert err.code == ErrorCode.INVALID_CONFIG and "a minute" in str(err)
    assert calls[-1] == ("t", True, True)
    assert md.topic("t").configs == {"remote.storage.enable": "true"}
    assert error_of(md.create_topic, "u", configs={"remote.storage.enable": "true",
                                                   "retention.ms": "1000"}).code \
        == ErrorCode.INVALID_CONFIG
    assert md.topic("u") is None
    # the built-in tiered-storage rules run first: a compacted tiered topic never reaches it
    n = len(calls)
    err = error_of(md.incremental_alter_topic_configs, "t", [("cleanup.policy", OP_SET, "compact")])
    assert err.code == ErrorCode.INVALID_CONFIG and "cleanup.policy=delete" in str(err)
    assert len(calls) == n


# ---- DeleteTopics / CreatePartitions --------------------------------------------------------

def test_delete_unknown_topic_is_unknown_topic_or_partition(tmp_path):
    err = error_of(open_md(tmp_path).delete_topic, "nope")
    assert err.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_delete_by_id(tmp_path):
    md = open_md(tmp_path)
    info = md.create_topic("t")
    assert error_of(md.delete_topic_by_id, random_kafka_uuid()).code == ErrorCode.UNKNOWN_TOPIC_ID
    assert error_of(md.delete_topic_by_id, ZERO_UUID).code == ErrorCode.INVALID_REQUEST
    assert md.delete_topic_by_id(info.topic_id) == info
    assert md.topic("t") is None and md.topic_by_id(info.topic_id) is None
    assert open_md(tmp_path).topics() == {}


def test_deleted_topic_name_can_be_reused_with_a_new_id(tmp_path):
    md = open_md(tmp_path)
    old = md.create_topic("t", configs={"retention.ms": "1"})
    md.delete_topic("t")
    new = md.create_topic("t")
    assert new.topic_id != old.topic_id and new.configs == {}
    assert md.log_config("t").retention_ms == 604_800_000


def test_internal_topics_can_be_deleted_as_in_kafka_kraft(tmp_path):
    # Kafka's KRaft controller has no internal-topic check in DeleteTopics: an authorized
    # client deletes __consumer_offsets, and the coordinator re-creates it when next needed.
    md = open_md(tmp_path)
    info = md.create_internal_topic("__consumer_offsets", 50, {"cleanup.policy": "compact"})
    assert info.internal
    assert md.delete_topic("__consumer_offsets") == info


def test_delete_topic_enable_false_is_topic_deletion_disabled(tmp_path):
    md = open_md(tmp_path, {"delete.topic.enable": "false"})
    info = md.create_topic("t")
    assert error_of(md.delete_topic, "t").code == ErrorCode.TOPIC_DELETION_DISABLED
    assert error_of(md.delete_topic_by_id, info.topic_id).code == ErrorCode.TOPIC_DELETION_DISABLED
    assert md.topic("t") == info


def test_create_partitions_grows_the_topic(tmp_path):
    md = open_md(tmp_path)
    info = md.create_topic("t", 2)
    assert md.create_partitions("t", 4, validate_only=True).partitions == 4
    assert md.topic("t").partitions == 2
    grown = md.create_partitions("t", 4)
    assert grown == TopicInfo("t", info.topic_id, 4, {})
    assert open_md(tmp_path).topic("t").partitions == 4


def test_create_partitions_errors_as_kafka(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t", 3)
    err = error_of(md.create_partitions, "t", 3)
    assert err.code == ErrorCode.INVALID_PARTITIONS and str(err) == "Topic already has 3 partition(s)."
    err = error_of(md.create_partitions, "t", 2)
    assert err.code == ErrorCode.INVALID_PARTITIONS
    assert str(err) == "The topic t currently has 3 partition(s); 2 would not be an increase."
    assert error_of(md.create_partitions, "x", 5).code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---- internal topics ------------------------------------------------------------------------

def test_create_internal_topic_skips_user_checks_and_is_idempotent(tmp_path):
    md = open_md(tmp_path, {"default.replication.factor": "3", "num.partitions": "7"})
    info = md.create_internal_topic("__consumer_offsets", 50,
                                    {"cleanup.policy": "compact", "segment.bytes": "104857600"})
    assert info.partitions == 50 and md.log_config("__consumer_offsets").is_compacted
    assert md.create_internal_topic("__consumer_offsets", 10) == info
    assert md.create_internal_topic("__remote_log_metadata", 1).partitions == 1
    assert "__transaction_state" in BROKER_MANAGED_TOPICS
    with pytest.raises(ValueError):
        md.create_internal_topic("orders", 1)
    assert error_of(md.create_internal_topic, "__transaction_state", 1,
                    {"bogus": "1"}).code == ErrorCode.INVALID_CONFIG


# ---- AlterConfigs / IncrementalAlterConfigs -------------------------------------------------

def test_legacy_alter_configs_replaces_the_whole_override_set(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t", configs={"retention.ms": "1000", "segment.ms": "5000"})
    info = md.alter_topic_configs("t", {"retention.bytes": "1024"})
    assert info.configs == {"retention.bytes": "1024"}
    assert md.log_config("t").retention_ms == 604_800_000
    assert md.log_config("t").retention_bytes == 1024
    assert open_md(tmp_path).topic("t").configs == {"retention.bytes": "1024"}


def test_legacy_alter_configs_errors(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t", configs={"retention.ms": "1000"})
    assert error_of(md.alter_topic_configs, "x", {}).code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_of(md.alter_topic_configs, "bad name", {}).code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert error_of(md.alter_topic_configs, "", {}).code == ErrorCode.INVALID_REQUEST
    err = error_of(md.alter_topic_configs, "t", {"retention.ms": None})
    assert err.code == ErrorCode.INVALID_REQUEST and str(err) == "Null value not supported for : retention.ms"
    err = error_of(md.alter_topic_configs, "t", {"segment.bytes": "1"})
    assert err.code == ErrorCode.INVALID_CONFIG
    assert md.topic("t").configs == {"retention.ms": "1000"}
    assert md.alter_topic_configs("t", {"retention.ms": "7"}, validate_only=True).configs == \
        {"retention.ms": "7"}
    assert md.topic("t").configs == {"retention.ms": "1000"}


def test_incremental_set_and_delete(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t", configs={"retention.ms": "1000", "segment.ms": "5000"})
    info = md.incremental_alter_topic_configs("t", [
        ("retention.ms", OP_DELETE, None), ("retention.bytes", OP_SET, "10"),
        ("flush.ms", OP_DELETE, None)])
    assert info.configs == {"segment.ms": "5000", "retention.bytes": "10"}
    assert md.log_config("t").retention_ms == 604_800_000


def test_incremental_append_and_subtract_on_cleanup_policy(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    # APPEND with no override starts from the topic config's default, "delete", as Kafka does
    assert md.incremental_alter_topic_configs(
        "t", [("cleanup.policy", OP_APPEND, "compact")]).configs == {"cleanup.policy": "delete,compact"}
    assert md.log_config("t").get("cleanup.policy") == ["delete", "compact"]
    assert md.incremental_alter_topic_configs(
        "t", [("cleanup.policy", OP_APPEND, "compact,delete")]).configs == \
        {"cleanup.policy": "delete,compact"}
    assert md.incremental_alter_topic_configs(
        "t", [("cleanup.policy", OP_SUBTRACT, "delete")]).configs == {"cleanup.policy": "compact"}
    assert md.log_config("t").is_compacted
    assert md.incremental_alter_topic_configs(
        "t", [("cleanup.policy", OP_SUBTRACT, "delete")]).configs == {"cleanup.policy": "compact"}
    err = error_of(md.incremental_alter_topic_configs, "t", [("cleanup.policy", OP_APPEND, "shred")])
    assert err.code == ErrorCode.INVALID_CONFIG and "shred" in str(err)


def test_incremental_append_to_non_list_is_invalid_config(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    err = error_of(md.incremental_alter_topic_configs, "t", [("segment.bytes", OP_APPEND, "1")])
    assert err.code == ErrorCode.INVALID_CONFIG
    assert str(err) == "Can't APPEND to key segment.bytes because its type is not LIST."
    err = error_of(md.incremental_alter_topic_configs, "t", [("retention.ms", OP_SUBTRACT, "1")])
    assert str(err) == "Can't SUBTRACT to key retention.ms because its type is not LIST."


def test_incremental_request_errors(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    alter = md.incremental_alter_topic_configs
    err = error_of(alter, "t", [("retention.ms", OP_SET, "1"), ("retention.ms", OP_DELETE, None)])
    assert err.code == ErrorCode.INVALID_REQUEST and str(err) == "Error due to duplicate config keys"
    err = error_of(alter, "t", [("retention.ms", OP_SET, None)])
    assert err.code == ErrorCode.INVALID_REQUEST and "Null value not supported" in str(err)
    assert error_of(alter, "t", [("retention.ms", 9, "1")]).code == ErrorCode.INVALID_REQUEST
    assert error_of(alter, "x", [("retention.ms", OP_SET, "1")]).code == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    err = error_of(alter, "t", [("nope", OP_SET, "1")])
    assert err.code == ErrorCode.INVALID_CONFIG and str(err) == "Unknown topic config name: nope"
    err = error_of(alter, "t", [("min.compaction.lag.ms", OP_SET, "100"),
                                ("max.compaction.lag.ms", OP_SET, "10")])
    assert err.code == ErrorCode.INVALID_CONFIG
    assert md.topic("t").configs == {}


def test_incremental_validate_only_changes_nothing(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    info = md.incremental_alter_topic_configs("t", [("retention.ms", OP_SET, "5")], validate_only=True)
    assert info.configs == {"retention.ms": "5"} and md.topic("t").configs == {}


# ---- listeners ------------------------------------------------------------------------------

class Recorder:
    def __init__(self, md, path):
        self.md, self.path, self.events = md, path, []

    def _on_disk(self):
        return {t["name"]: (t["partitions"], t["configs"])
                for t in json.loads((self.path / METADATA_FILE).read_text())["topics"]}

    def on_topic_created(self, info):
        self.events.append(("created", info.name, info.partitions, self._on_disk().get(info.name)))

    def on_partitions_created(self, info, old_count):
        self.events.append(("partitions", info.name, old_count, info.partitions,
                            self._on_disk()[info.name][0]))

    def on_topic_config_changed(self, info, config):
        # the listener may read back the metadata from inside its callback
        assert self.md.log_config(info.name) is config
        self.events.append(("config", info.name, dict(info.configs), config.retention_ms))

    def on_topic_deleted(self, info):
        self.events.append(("deleted", info.name, info.name in self._on_disk()))


def test_listeners_run_in_order_after_each_change_is_persisted(tmp_path):
    md = open_md(tmp_path)
    rec = Recorder(md, tmp_path)
    md.add_listener(rec)
    md.create_topic("t", 2)
    md.create_partitions("t", 3)
    md.incremental_alter_topic_configs("t", [("retention.ms", OP_SET, "42")])
    md.incremental_alter_topic_configs("t", [("retention.ms", OP_SET, "42")])  # no change
    md.alter_topic_configs("t", {})
    md.delete_topic("t")
    assert rec.events == [
        ("created", "t", 2, (2, {})),
        ("partitions", "t", 2, 3, 3),
        ("config", "t", {"retention.ms": "42"}, 42),
        ("config", "t", {}, 604_800_000),
        ("deleted", "t", False),
    ]


def test_listener_with_some_callbacks_and_failing_listener_do_not_break_changes(tmp_path):
    md = open_md(tmp_path)
    created = []

    class Partial:
        def on_topic_created(self, info):
            created.append(info.name)

    class Broken:
        def on_topic_created(self, info):
            raise RuntimeError("listener bug")

    broken = Broken()
    md.add_listener(broken)
    md.add_listener(Partial())
    md.create_topic("t")
    md.delete_topic("t")
    assert created == ["t"] and md.topic("t") is None
    md.remove_listener(broken)
    md.create_topic("u")
    assert created == ["t", "u"]


def test_concurrent_creates_are_all_persisted(tmp_path):
    md = open_md(tmp_path)
    errors = []

    def worker(i):
        for j in range(10):
            try:
                md.create_topic(f"t-{i}-{j}")
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(open_md(tmp_path).topics()) == 80


# ---- DescribeConfigs ------------------------------------------------------------------------

def entries_by_name(entries):
    return {e.name: e for e in entries}


def test_describe_topic_lists_every_topic_config_with_kafka_types(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t")
    entries = entries_by_name(md.describe_topic_configs("t"))
    assert "internal.segment.bytes" not in entries
    assert {"cleanup.policy", "retention.ms", "segment.bytes", "remote.storage.enable"} <= set(entries)
    assert entries["cleanup.policy"].value == "delete"
    assert entries["cleanup.policy"].config_type == ConfigEntryType.LIST == 7
    assert entries["preallocate"].value == "false"
    assert entries["preallocate"].config_type == ConfigEntryType.BOOLEAN == 1
    assert entries["retention.ms"].config_type == ConfigEntryType.LONG == 5
    assert entries["segment.bytes"].config_type == ConfigEntryType.INT == 3
    assert entries["compression.type"].config_type == ConfigEntryType.STRING == 2
    assert entries["min.cleanable.dirty.ratio"].value == "0.5"
    assert entries["min.cleanable.dirty.ratio"].config_type == ConfigEntryType.DOUBLE == 6
    for e in entries.values():
        assert not e.read_only and not e.is_sensitive and e.synonyms == [] and e.documentation is None
        assert e.source == ConfigSource.DEFAULT_CONFIG == 5


def test_describe_topic_override_and_static_broker_synonyms(tmp_path):
    md = open_md(tmp_path, {"log.retention.hours": "48", "log.cleanup.policy": "compact"})
    md.create_topic("t", configs={"cleanup.policy": "compact,delete", "segment.bytes": "2097152"})
    entries = entries_by_name(md.describe_topic_configs("t", include_synonyms=True))

    retention = entries["retention.ms"]
    assert retention.value == "172800000"
    assert retention.source == ConfigSource.STATIC_BROKER_CONFIG == 4
    assert retention.synonyms == [("log.retention.hours", "48", ConfigSource.STATIC_BROKER_CONFIG),
                                  ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG)]

    policy = entries["cleanup.policy"]
    assert policy.value == "compact,delete" and policy.source == ConfigSource.TOPIC_CONFIG == 1
    assert policy.synonyms == [("cleanup.policy", "compact,delete", ConfigSource.TOPIC_CONFIG),
                               ("log.cleanup.policy", "compact", ConfigSource.STATIC_BROKER_CONFIG),
                               ("log.cleanup.policy", "delete", ConfigSource.DEFAULT_CONFIG)]

    segment = entries["segment.bytes"]
    assert segment.source == ConfigSource.TOPIC_CONFIG and segment.value == "2097152"
    assert segment.synonyms == [("segment.bytes", "2097152", ConfigSource.TOPIC_CONFIG),
                                ("log.segment.bytes", "1073741824", ConfigSource.DEFAULT_CONFIG)]

    # a topic config with no broker synonym: no synonyms at all
    assert entries["remote.log.copy.disable"].synonyms == []
    assert ConfigSource.DYNAMIC_TOPIC_CONFIG == ConfigSource.TOPIC_CONFIG


def test_describe_topic_rendering_of_overrides(tmp_path):
    md = open_md(tmp_path)
    md.create_topic("t", configs={"preallocate": "TRUE", "retention.ms": " 60000",
                                  "cleanup.policy": "compact , delete"})
    entries = entries_by_name(md.describe_topic_configs("t", ["preallocate", "retention.ms",
                                                              "cleanup.policy", "no.such"]))
    assert list(entries) == ["cleanup.policy", "preallocate", "retention.ms"]
    assert entries["preallocate"].value == "true"
    assert entries["retention.ms"].value == "60000"
    assert entries["cleanup.policy"].value == "compact,delete"


def test_describe_topic_errors(tmp_path):
    md = open_md(tmp_path)
    assert error_of(md.describe_topic_configs, "nope").code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_of(md.describe_topic_configs, "bad/name").code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_describe_broker_configs_sources_and_synonyms(tmp_path):
    props = {"node.id": "1", "log.retention.hours": "48", "num.partitions": "3",
             "listeners": "PLAINTEXT://127.0.0.1:9092", "my.secret.key": "hunter2"}
    md = open_md(tmp_path, props)
    entries = entries_by_name(md.describe_broker_configs(include_synonyms=True))
    assert set(props) <= set(entries)
    assert {"log.dirs", "message.max.bytes", "auto.create.topics.enable",
            "default.replication.factor", "log.segment.bytes"} <= set(entries)

    hours = entries["log.retention.hours"]
    assert hours.value == "48" and hours.source == ConfigSource.STATIC_BROKER_CONFIG
    assert hours.synonyms == [("log.retention.hours", "48", ConfigSource.STATIC_BROKER_CONFIG),
                              ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG)]
    assert hours.read_only and hours.config_type == ConfigEntryType.INT

    ms = entries["log.retention.ms"]  # Kafka: unset, no default, lower synonyms dropped
    assert ms.value is None and ms.source == ConfigSource.DEFAULT_CONFIG and ms.synonyms == []

    parts = entries["num.partitions"]
    assert parts.value == "3" and parts.source == ConfigSource.STATIC_BROKER_CONFIG
    mmb = entries["message.max.bytes"]
    assert mmb.value == "1048588" and mmb.source == ConfigSource.DEFAULT_CONFIG
    assert mmb.synonyms == [("message.max.bytes", "1048588", ConfigSource.DEFAULT_CONFIG)]
    auto = entries["auto.create.topics.enable"]
    assert auto.value == "true" and auto.config_type == ConfigEntryType.BOOLEAN

    secret = entries["my.secret.key"]  # unknown keys are treated as sensitive, as in Kafka
    assert secret.is_sensitive and secret.value is None
    assert secret.config_type == ConfigEntryType.UNKNOWN
    assert secret.synonyms == [("my.secret.key", None, ConfigSource.STATIC_BROKER_CONFIG)]

    only = md.describe_broker_configs(["num.partitions"], include_documentation=True)
    assert [e.name for e in only] == ["num.partitions"]
    assert only[0].synonyms == [] and only[0].documentation


def test_values_render_as_kafka_renders_them():
    assert render_config_value(["compact", "delete"], ConfigType.LIST) == "compact,delete"
    assert render_config_value([], ConfigType.LIST) == ""
    assert render_config_value(True, ConfigType.BOOLEAN) == "true"
    assert render_config_value(0.5, ConfigType.DOUBLE) == "0.5"
    assert render_config_value(1.0, ConfigType.DOUBLE) == "1.0"
    assert render_config_value(0.0001, ConfigType.DOUBLE) == "1.0E-4"
    assert render_config_value(2.5e7, ConfigType.DOUBLE) == "2.5E7"
    assert render_config_value(2**63 - 1, ConfigType.LONG) == "9223372036854775807"
    assert render_config_value(None, ConfigType.INT) is None
