"""Tiered-storage configuration: Kafka 4.4's RemoteLogManagerConfig keys and the topic and
broker rules of LogConfig, through ClusterMetadata and the admin APIs.

Expected values and messages are Apache Kafka 4.4.0's (RemoteLogManagerConfig.configDef(),
LogConfig.validateTopicLogConfigValues / validateBrokerLogConfigValues,
LogManager.updateTopicConfig).
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from strata.cluster.metadata import (  # noqa: I001
    DYNAMIC_BROKER_CONFIGS,
    OP_APPEND, OP_DELETE, OP_SET, BROKER_CONFIG_KEYS, ClusterMetadata, ConfigEntryType, ConfigSource)
from strata.common.config import LONG_MAX, ConfigType
from strata.common.errors import ErrorCode, InvalidConfigError, KafkaError
from strata.tiered import config as tc
from strata.tiered.config import (
    REMOTE_LOG_MANAGER_CONFIG_DEF, RemoteLogManagerConfig, default_remote_storage_dir,
    default_remote_storage_url, load_plugin)
from support.replicas import follow_grants

SYSTEM_ON = {"remote.log.storage.system.enable": "true"}
TIERED = {"remote.storage.enable": "true"}

DISABLED = ("Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
            "with remote log storage.")
CLEANUP = ("Remote log storage only supports topics with cleanup.policy=delete or cleanup.policy "
           "being an empty list.")
TURN_OFF = ("It is invalid to disable remote storage without deleting remote data. If you want "
            "to keep the remote data and turn to read only, please set "
            "`remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable "
            "remote storage and delete all remote data, please set "
            "`remote.storage.enable=false,remote.log.delete.on.disable=true`.")
COPY_BYTES = ("When `remote.log.copy.disable` is set to true, the `local.retention.bytes` and "
              "`retention.bytes` must be set to the identical value because there will be no "
              "more logs copied to the remote storage.")
COPY_MS = ("When `remote.log.copy.disable` is set to true, the `local.retention.ms` and "
           "`retention.ms` must be set to the identical value because there will be no more "
           "logs copied to the remote storage.")
STORED_TIERED = ("You have to delete all topics with the property remote.storage.enable=true "
                 "before disabling tiered storage cluster-wide")


def open_md(path, props=None):
    return ClusterMetadata(path, 1, dict(props or {}))


def error_of(fn, *args, **kwargs) -> KafkaError:
    with pytest.raises(KafkaError) as info:
        fn(*args, **kwargs)
    return info.value


def invalid_config(fn, *args, **kwargs) -> str:
    err = error_of(fn, *args, **kwargs)
    assert err.code == ErrorCode.INVALID_CONFIG
    return str(err)


# ---- RemoteLogManagerConfig: keys, types, defaults, validators -------------------------------

# name: (type, default) -- Kafka 4.4.0, except the RLMM class (Strata's own topic-based RLMM)
KAFKA_KEYS = {
    "remote.log.storage.system.enable": (ConfigType.BOOLEAN, False),
    "remote.log.storage.manager.impl.prefix": (ConfigType.STRING, "rsm.config."),
    "remote.log.metadata.manager.impl.prefix": (ConfigType.STRING, "rlmm.config."),
    "remote.log.storage.manager.class.name": (ConfigType.STRING, None),
    "remote.log.storage.manager.class.path": (ConfigType.STRING, None),
    "remote.log.metadata.manager.class.name": (
        ConfigType.STRING, "strata.tiered.metadata.topic_based.TopicBasedRemoteLogMetadataManager"),
    "remote.log.metadata.manager.class.path": (ConfigType.STRING, None),
    "remote.log.metadata.manager.listener.name": (ConfigType.STRING, None),
    "remote.log.metadata.custom.metadata.max.bytes": (ConfigType.INT, 128),
    "remote.log.index.file.cache.total.size.bytes": (ConfigType.LONG, 1024 ** 3),
    "remote.log.index.file.cache.ttl.ms": (ConfigType.LONG, 900_000),
    "remote.log.manager.thread.pool.size": (ConfigType.INT, 2),
    "remote.log.manager.copier.thread.pool.size": (ConfigType.INT, 10),
    "remote.log.manager.expiration.thread.pool.size": (ConfigType.INT, 10),
    "remote.log.manager.follower.thread.pool.size": (ConfigType.INT, 2),
    "remote.log.manager.task.interval.ms": (ConfigType.LONG, 30_000),
    "remote.log.manager.task.retry.backoff.ms": (ConfigType.LONG, 500),
    "remote.log.manager.task.retry.backoff.max.ms": (ConfigType.LONG, 30_000),
    "remote.log.manager.task.retry.jitter": (ConfigType.DOUBLE, 0.2),
    "remote.log.reader.threads": (ConfigType.INT, 10),
    "remote.log.reader.max.pending.tasks": (ConfigType.INT, 100),
    "log.local.retention.ms": (ConfigType.LONG, -2),
    "log.local.retention.bytes": (ConfigType.LONG, -2),
    "log.remote.copy.lag.ms": (ConfigType.LONG, 0),       # Kafka 4.4 (KIP-1241)
    "log.remote.copy.lag.bytes": (ConfigType.LONG, -1),
    "remote.log.manager.copy.max.bytes.per.second": (ConfigType.LONG, LONG_MAX),
    "remote.log.manager.copy.quota.window.num": (ConfigType.INT, 11),
    "remote.log.manager.copy.quota.window.size.seconds": (ConfigType.INT, 1),
    "remote.log.manager.fetch.max.bytes.per.second": (ConfigType.LONG, LONG_MAX),
    "remote.log.manager.fetch.quota.window.num": (ConfigType.INT, 11),
    "remote.log.manager.fetch.quota.window.size.seconds": (ConfigType.INT, 1),
    "remote.fetch.max.wait.ms": (ConfigType.INT, 500),
    "remote.list.offsets.request.timeout.ms": (ConfigType.LONG, 30_000),
}

# name: (lowest valid value, Kafka's message for one below it)
AT_LEAST = {
    "remote.log.metadata.custom.metadata.max.bytes": 0,
    "remote.log.index.file.cache.total.size.bytes": 1,
    "remote.log.index.file.cache.ttl.ms": -1,
    "remote.log.manager.thread.pool.size": 1,
    "remote.log.manager.copier.thread.pool.size": 1,
    "remote.log.manager.expiration.thread.pool.size": 1,
    "remote.log.manager.follower.thread.pool.size": 1,
    "remote.log.manager.task.interval.ms": 1,
    "remote.log.manager.task.retry.backoff.ms": 1,
    "remote.log.manager.task.retry.backoff.max.ms": 1,
    "remote.log.reader.threads": 1,
    "remote.log.reader.max.pending.tasks": 1,
    "log.local.retention.ms": -2,
    "log.local.retention.bytes": -2,
    "log.remote.copy.lag.ms": -1,
    "log.remote.copy.lag.bytes": -1,
    "remote.log.manager.copy.max.bytes.per.second": 1,
    "remote.log.manager.copy.quota.window.num": 1,
    "remote.log.manager.copy.quota.window.size.seconds": 1,
    "remote.log.manager.fetch.max.bytes.per.second": 1,
    "remote.log.manager.fetch.quota.window.num": 1,
    "remote.log.manager.fetch.quota.window.size.seconds": 1,
    "remote.fetch.max.wait.ms": 1,
    "remote.list.offsets.request.timeout.ms": 1,
}


def test_config_def_has_exactly_kafkas_keys_types_and_defaults():
    assert REMOTE_LOG_MANAGER_CONFIG_DEF.names() == list(KAFKA_KEYS)
    for name, (type_, default) in KAFKA_KEYS.items():
        key = REMOTE_LOG_MANAGER_CONFIG_DEF[name]
        assert (key.type, key.default) == (type_, default), name
        assert key.doc, name


def test_defaults_through_the_typed_accessors():
    cfg = RemoteLogManagerConfig({})
    for name, (_, default) in KAFKA_KEYS.items():
        assert cfg.get(name) == default
    assert cfg.is_remote_storage_system_enabled is False
    assert cfg.remote_storage_manager_class_name == \
        "strata.tiered.storage.remote_storage_manager.ObjectStoreRemoteStorageManager"
    assert cfg.remote_storage_manager_class_path is None
    assert cfg.remote_log_metadata_manager_class_name == \
        "strata.tiered.metadata.topic_based.TopicBasedRemoteLogMetadataManager"
    assert cfg.remote_storage_manager_prefix == "rsm.config."
    assert cfg.remote_log_metadata_manager_prefix == "rlmm.config."
    assert cfg.remote_log_metadata_manager_listener_name is None
    assert cfg.remote_log_metadata_custom_metadata_max_bytes == 128
    assert cfg.remote_log_index_file_cache_total_size_bytes == 1073741824
    assert cfg.remote_log_index_file_cache_ttl_ms == 900_000
    assert cfg.remote_log_manager_copier_thread_pool_size == 10
    assert cfg.remote_log_manager_expiration_thread_pool_size == 10
    assert cfg.remote_log_manager_follower_thread_pool_size == 2
    assert cfg.remote_log_manager_thread_pool_size == 2
    assert cfg.remote_log_manager_task_interval_ms == 30_000
    assert cfg.remote_log_manager_task_retry_backoff_ms == 500
    assert cfg.remote_log_manager_task_retry_backoff_max_ms == 30_000
    assert cfg.remote_log_manager_task_retry_jitter == 0.2
    assert cfg.remote_log_reader_threads == 10
    assert cfg.remote_log_reader_max_pending_tasks == 100
    assert cfg.remote_fetch_max_wait_ms == 500
    assert cfg.remote_list_offsets_request_timeout_ms == 30_000
    assert (cfg.log_local_retention_ms, cfg.log_local_retention_bytes) == (-2, -2)
    assert cfg.remote_log_manager_copy_max_bytes_per_second == 2**63 - 1
    assert cfg.remote_log_manager_fetch_max_bytes_per_second == 2**63 - 1
    assert (cfg.remote_log_manager_copy_num_quota_samples,
            cfg.remote_log_manager_copy_quota_window_size_seconds) == (11, 1)
    assert (cfg.remote_log_manager_fetch_num_quota_samples,
            cfg.remote_log_manager_fetch_quota_window_size_seconds) == (11, 1)


def test_short_accessor_names_match_the_kafka_named_ones():
    cfg = RemoteLogManagerConfig({**SYSTEM_ON, "remote.log.reader.threads": "3",
                                  "remote.log.manager.copier.thread.pool.size": "4"})
    assert cfg.system_enabled is True
    assert cfg.rsm_class_name == cfg.remote_storage_manager_class_name
    assert cfg.rlmm_class_name == cfg.remote_log_metadata_manager_class_name
    assert cfg.index_cache_size_bytes == 1024 ** 3
    assert (cfg.task_interval_ms, cfg.retry_backoff_ms, cfg.retry_backoff_max_ms,
            cfg.retry_jitter) == (30_000, 500, 30_000, 0.2)
    assert (cfg.copier_threads, cfg.expiration_threads, cfg.follower_threads,
            cfg.reader_threads, cfg.reader_max_pending_tasks) == (4, 10, 2, 3, 100)


def test_string_values_are_parsed_to_their_types():
    cfg = RemoteLogManagerConfig({
        "remote.log.storage.system.enable": " TRUE ",
        "remote.log.reader.threads": "4",
        "remote.log.index.file.cache.total.size.bytes": "1048576",
        "remote.log.manager.task.retry.jitter": "0.5",
        "remote.log.storage.manager.class.name": "my.pkg.Rsm",
        "remote.log.storage.manager.class.path": "/opt/plugins",
    })
    assert cfg.is_remote_storage_system_enabled is True
    assert cfg.remote_log_reader_threads == 4
    assert cfg.remote_log_index_file_cache_total_size_bytes == 1048576
    assert cfg.remote_log_manager_task_retry_jitter == 0.5
    assert cfg.remote_storage_manager_class_name == "my.pkg.Rsm"
    assert cfg.remote_storage_manager_class_path == "/opt/plugins"
    assert cfg.remote_log_reader_threads == cfg.get("remote.log.reader.threads")


@pytest.mark.parametrize("name", sorted(AT_LEAST))
def test_each_numeric_key_rejects_values_below_kafkas_minimum(name):
    low = AT_LEAST[name]
    RemoteLogManagerConfig({name: str(low)})
    with pytest.raises(InvalidConfigError) as info:
        RemoteLogManagerConfig({name: str(low - 1)})
    assert str(info.value) == (f"Invalid value {low - 1} for configuration {name}: "
                               f"Value must be at least {low}")


def test_jitter_range_and_non_empty_strings_use_kafkas_messages():
    with pytest.raises(InvalidConfigError, match=r"^Invalid value 0\.6 for configuration "
                       r"remote\.log\.manager\.task\.retry\.jitter: Value must be no more than 0\.5$"):
        RemoteLogManagerConfig({"remote.log.manager.task.retry.jitter": "0.6"})
    with pytest.raises(InvalidConfigError, match="Value must be at least 0"):
        RemoteLogManagerConfig({"remote.log.manager.task.retry.jitter": "-0.1"})
    for name in ("remote.log.storage.manager.impl.prefix", "remote.log.metadata.manager.impl.prefix",
                 "remote.log.storage.manager.class.name", "remote.log.metadata.manager.class.name",
                 "remote.log.metadata.manager.listener.name"):
        with pytest.raises(InvalidConfigError) as info:
            RemoteLogManagerConfig({name: "  "})
        assert str(info.value).endswith(f"for configuration {name}: String must be non-empty")
    # the class paths have no validator
    RemoteLogManagerConfig({"remote.log.storage.manager.class.path": ""})
    with pytest.raises(InvalidConfigError, match="remote.log.storage.system.enable"):
        RemoteLogManagerConfig({"remote.log.storage.system.enable": "yes"})
    with pytest.raises(InvalidConfigError, match="remote.log.reader.threads"):
        RemoteLogManagerConfig({"remote.log.reader.threads": "ten"})


def test_follower_pool_falls_back_to_the_deprecated_thread_pool_size():
    assert RemoteLogManagerConfig({"remote.log.manager.thread.pool.size": "5"}) \
        .remote_log_manager_follower_thread_pool_size == 5
    both = RemoteLogManagerConfig({"remote.log.manager.thread.pool.size": "5",
                                   "remote.log.manager.follower.thread.pool.size": "3"})
    assert both.remote_log_manager_follower_thread_pool_size == 3
    assert both.remote_log_manager_thread_pool_size == 3
    # the copier and expiration pools no longer fall back (Kafka 4.0+)
    assert both.remote_log_manager_copier_thread_pool_size == 10


# ---- plugin properties ------------------------------------------------------------------------

def test_rsm_and_rlmm_props_are_the_prefixed_keys_with_the_prefix_stripped(tmp_path):
    cfg = RemoteLogManagerConfig({
        "log.dirs": f"{tmp_path / 'a'},{tmp_path / 'b'}",
        "rsm.config.storage.url": "s3://bucket/prefix",
        "rsm.config.chunk.size": "4194304",
        "rsm.config.": "the bare prefix is no property",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.broker.id": "99",
        "remote.log.storage.system.enable": "true",
        "node.id": "1",
    })
    assert cfg.rsm_props() == {"storage.url": "s3://bucket/prefix", "chunk.size": "4194304"}
    assert cfg.rsm_props(tmp_path / "elsewhere", broker_id=7) == {
        "storage.url": "s3://bucket/prefix", "chunk.size": "4194304", "broker.id": 7}
    assert cfg.rlmm_props() == {"remote.log.metadata.topic.num.partitions": "5",
                                "remote.log.metadata.topic.replication.factor": "1",
                                "broker.id": "99"}
    # the broker's own values win over a prefixed one, as in Kafka
    full = cfg.rlmm_props(broker_id=1, cluster_id="abc", log_dir=tmp_path / "a",
                          endpoint=("localhost", 9092))
    assert full == {
        "remote.log.metadata.common.client.bootstrap.servers": "localhost:9092",
        "remote.log.metadata.common.client.security.protocol": "PLAINTEXT",
        "remote.log.metadata.topic.num.partitions": "5",
        "remote.log.metadata.topic.replication.factor": "1",
        "broker.id": 1, "log.dir": str(tmp_path / "a"), "cluster.id": "abc",
    }


def test_custom_prefixes_select_other_keys():
    cfg = RemoteLogManagerConfig({
        "remote.log.storage.manager.impl.prefix": "rsm.s3.",
        "remote.log.metadata.manager.impl.prefix": "rlmm.x.",
        "rsm.s3.bucket": "b", "rsm.config.ignored": "1", "rsm.s3.storage.url": "s3://b",
        "rlmm.x.a": "1", "rlmm.config.ignored": "2",
    })
    assert cfg.rsm_props() == {"bucket": "b", "storage.url": "s3://b"}
    assert cfg.rlmm_props() == {"a": "1"}
    assert cfg.config_props("remote.log.storage.manager.impl.prefix") == \
        {"bucket": "b", "storage.url": "s3://b"}


def test_storage_url_defaults_to_remote_storage_under_the_first_log_dir(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    cfg = RemoteLogManagerConfig({"log.dirs": f" {first} , {second} "})
    assert cfg.log_dirs == [str(first), str(second)]
    expected = (first / "remote-storage").as_uri()
    assert expected.startswith("file:///") and expected.endswith("/first/remote-storage")
    assert cfg.default_storage_url == expected
    assert cfg.rsm_props() == {"storage.url": expected}
    assert cfg.rsm_props(second) == {"storage.url": (second / "remote-storage").as_uri()}
    assert default_remote_storage_url(first) == expected
    assert default_remote_storage_dir(first) == first / "remote-storage"
    # log.dir when log.dirs is absent; Kafka's /tmp/kafka-logs when both are
    assert RemoteLogManagerConfig({"log.dir": str(second)}).log_dirs == [str(second)]
    assert RemoteLogManagerConfig({}).log_dirs == ["/tmp/kafka-logs"]
    assert RemoteLogManagerConfig({"rsm.config.storage.url": ""}).rsm_props()["storage.url"] == \
        "file:///tmp/kafka-logs/remote-storage"
    # a relative log dir becomes absolute
    rel = RemoteLogManagerConfig({"log.dirs": "data/logs"}).default_storage_url
    assert rel == (Path.cwd() / "data/logs/remote-storage").as_uri()


# ---- load_plugin --------------------------------------------------------------------------------

class _Outer:
    class Inner:
        pass


def test_load_plugin_by_dotted_or_colon_name():
    from strata.tiered.api import RemoteStorageManager
    assert load_plugin("strata.tiered.api.RemoteStorageManager") is RemoteStorageManager
    assert load_plugin("strata.tiered.api:RemoteStorageManager") is RemoteStorageManager
    assert load_plugin(" collections.OrderedDict ") is __import__("collections").OrderedDict
    assert load_plugin(f"{__name__}:_Outer.Inner") is _Outer.Inner
    assert load_plugin(f"{__name__}._Outer.Inner") is _Outer.Inner
    assert load_plugin("strata.tiered.api.RemoteStorageManager",
                       expected_type=RemoteStorageManager) is RemoteStorageManager


def test_load_plugin_errors_name_the_class():
    from strata.tiered.api import RemoteStorageManager
    for bad in ("no_such_module_xyz.Thing", "strata.tiered.api.NoSuchClass",
                "strata.tiered.api:NoSuchClass", "no_such_module_xyz:Thing", "Thing", "", ":X"):
        with pytest.raises(ImportError) as info:
            load_plugin(bad)
        assert bad.strip() in str(info.value) or not bad.strip()
    with pytest.raises(TypeError, match="is not a class"):
        load_plugin("strata.tiered.config.load_plugin")
    with pytest.raises(TypeError, match="RemoteStorageManager"):
        load_plugin("collections.OrderedDict", expected_type=RemoteStorageManager)


def test_load_plugin_reports_a_plugin_whose_own_import_fails(tmp_path):
    (tmp_path / "broken_plugin_mod_xyz.py").write_text("import missing_dependency_xyz\n")
    with pytest.raises(ImportError, match="missing_dependency_xyz"):
        load_plugin("broken_plugin_mod_xyz.Plugin", str(tmp_path))


def test_load_plugin_searches_the_class_path_first(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "strata_test_rsm_plugin_xyz.py").write_text(textwrap.dedent("""
        class MyRsm:
            pass
    """))
    saved = list(sys.path)
    try:
        cls = load_plugin("strata_test_rsm_plugin_xyz.MyRsm",
                          os.pathsep.join([str(tmp_path / "nothing-here"), str(plugins)]))
        assert cls.__name__ == "MyRsm"
        assert sys.path[:2] == [str(tmp_path / "nothing-here"), str(plugins)]
        cfg = RemoteLogManagerConfig({
            "remote.log.storage.manager.class.name": "strata_test_rsm_plugin_xyz:MyRsm",
            "remote.log.storage.manager.class.path": str(plugins)})
        assert cfg.remote_storage_manager_class() is cls
    finally:
        sys.path[:] = saved
        sys.modules.pop("strata_test_rsm_plugin_xyz", None)


# ---- topic rules through ClusterMetadata --------------------------------------------------------

def test_tiering_a_topic_needs_the_broker_system_flag(tmp_path):
    md = open_md(tmp_path)
    assert invalid_config(md.create_topic, "t", configs=TIERED) == DISABLED
    assert invalid_config(md.create_topic, "t", configs=TIERED, validate_only=True) == DISABLED
    assert md.topic("t") is None
    md.create_topic("t", configs={"remote.storage.enable": "false"})
    md.create_topic("u")
    assert invalid_config(md.alter_topic_configs, "u", TIERED) == DISABLED
    assert invalid_config(md.incremental_alter_topic_configs, "u",
                          [("remote.storage.enable", OP_SET, "true")]) == DISABLED
    assert md.topic("u").configs == {}
    # the other remote keys are plain topic configs without tiering
    md.alter_topic_configs("u", {"remote.log.copy.disable": "true",
                                 "remote.log.delete.on.disable": "true",
                                 "local.retention.ms": "-1"})


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_a_tiered_topic_must_have_cleanup_policy_delete(tmp_path, policy):
    md = open_md(tmp_path, SYSTEM_ON)
    assert invalid_config(md.create_topic, "t", configs={**TIERED, "cleanup.policy": policy}) \
        == CLEANUP
    md.create_topic("t", configs=TIERED)
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("cleanup.policy", OP_SET, policy)]) == CLEANUP
    assert invalid_config(md.alter_topic_configs, "t", {**TIERED, "cleanup.policy": policy}) \
        == CLEANUP
    assert md.topic("t").configs == TIERED


def test_compaction_reached_by_append_or_broker_default_is_refused_too(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    md.create_topic("t", configs=TIERED)
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("cleanup.policy", OP_APPEND, "compact")]) == CLEANUP
    # a compacted topic cannot be tiered either
    md.create_topic("c", configs={"cleanup.policy": "compact"})
    assert invalid_config(md.incremental_alter_topic_configs, "c",
                          [("remote.storage.enable", OP_SET, "true")]) == CLEANUP
    md2 = open_md(tmp_path / "b", {**SYSTEM_ON, "log.cleanup.policy": "compact"})
    assert invalid_config(md2.create_topic, "t", configs=TIERED) == CLEANUP
    md2.create_topic("t", configs={**TIERED, "cleanup.policy": "delete"})


def test_an_empty_or_repeated_delete_cleanup_policy_may_be_tiered(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    md.create_topic("t", configs={**TIERED, "cleanup.policy": ""})
    assert md.log_config("t").get("cleanup.policy") == []
    assert md.log_config("t").get("remote.storage.enable") is True
    md.create_topic("u", configs={**TIERED, "cleanup.policy": "delete,delete"})  # as Kafka 4.3


@pytest.mark.parametrize("kind", ["ms", "bytes"])
def test_local_retention_may_not_exceed_total_retention(tmp_path, kind):
    md = open_md(tmp_path, SYSTEM_ON)
    local, total = f"local.retention.{kind}", f"retention.{kind}"
    assert invalid_config(md.create_topic, "t", configs={**TIERED, total: "1000", local: "2000"}) \
        == (f"Invalid value 2000 for configuration {local}: Value must not be more than {total} "
            f"property value: 1000")
    assert invalid_config(md.create_topic, "t", configs={**TIERED, total: "1000", local: "-1"}) \
        == (f"Invalid value -1 for configuration {local}: Value must not be -1 as {total} value "
            f"is set as 1000.")
    for ok in ("1000", "999", "0", "-2"):
        md.create_topic(f"ok{ok}", configs={**TIERED, total: "1000", local: ok})
    # infinite total retention: any local retention
    md.create_topic("inf", configs={**TIERED, total: "-1", local: "123456789"})
    md.create_topic("inf2", configs={**TIERED, total: "-1", local: "-1"})
    # the same rules on alter, both paths
    assert "Value must not be more than" in invalid_config(
        md.incremental_alter_topic_configs, "ok1000", [(local, OP_SET, "1001")])
    assert "Value must not be -1" in invalid_config(
        md.alter_topic_configs, "ok1000", {**TIERED, total: "1000", local: "-1"})
    assert "Value must not be more than" in invalid_config(
        md.incremental_alter_topic_configs, "ok1000", [(total, OP_SET, "10")])
    # not tiered: no rule
    md.create_topic("plain", configs={total: "1000", local: "2000"})


def test_retention_ms_default_and_negative_retention_bytes(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    # retention.ms defaults to 7 days: local -1 against it
    assert invalid_config(md.create_topic, "t", configs={**TIERED, "local.retention.ms": "-1"}) \
        == ("Invalid value -1 for configuration local.retention.ms: Value must not be -1 as "
            "retention.ms value is set as 604800000.")
    # retention.bytes defaults to -1 (and any negative is "infinite" for Kafka's check)
    md.create_topic("t", configs={**TIERED, "local.retention.bytes": "-1"})
    md.create_topic("u", configs={**TIERED, "retention.bytes": "-5", "local.retention.bytes": "9"})


def test_broker_retention_defaults_take_part_in_topic_checks(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.retention.ms": "1000",
                            "log.local.retention.bytes": "500"})
    assert invalid_config(md.create_topic, "t", configs={**TIERED, "local.retention.ms": "5000"}) \
        == ("Invalid value 5000 for configuration local.retention.ms: Value must not be more "
            "than retention.ms property value: 1000")
    # an inherited log.local.retention.bytes above the topic's retention.bytes is capped
    md.create_topic("s", configs={**TIERED, "retention.bytes": "100"})
    assert md.log_config("s").get("local.retention.bytes") == 100
    md.create_topic("t", configs=TIERED)


SHIPPED = {**SYSTEM_ON, "log.remote.storage.enable": "true", "log.local.retention.ms": "86400000",
           "log.local.retention.bytes": "10000"}


def test_inherited_local_retention_is_capped_at_a_shorter_topic_retention(tmp_path):
    md = open_md(tmp_path, SHIPPED)
    md.create_topic("short", configs={"retention.ms": "3600000", "retention.bytes": "5000"})
    config = md.log_config("short")
    assert config.get("local.retention.ms") == 3600000
    assert config.get("local.retention.bytes") == 5000
    md.create_topic("plain")
    assert md.log_config("plain").get("local.retention.ms") == 86400000
    # IncrementalAlterConfigs and legacy AlterConfigs of retention move the cap both ways
    md.incremental_alter_topic_configs("plain", [("retention.ms", OP_SET, "1000")])
    assert md.log_config("plain").get("local.retention.ms") == 1000
    md.alter_topic_configs("plain", {"retention.ms": "-1"})
    assert md.log_config("plain").get("local.retention.ms") == 86400000
    md.alter_topic_configs("plain", {"retention.bytes": "100"})
    assert md.log_config("plain").get("local.retention.bytes") == 100
    assert md.topic("plain").configs == {"retention.bytes": "100"}  # the cap is not an override
    # a value set on the topic itself is judged by Kafka's rule, not capped
    assert invalid_config(md.create_topic, "own", configs={
        "retention.ms": "3600000", "local.retention.ms": "86400000"}) == (
        "Invalid value 86400000 for configuration local.retention.ms: Value must not be more "
        "than retention.ms property value: 3600000")
    again = open_md(tmp_path, SHIPPED)
    assert again.log_config("short").get("local.retention.ms") == 3600000


def test_an_unbounded_inherited_local_retention_is_capped_too(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.retention.ms": "-1", "log.local.retention.ms": "-1"})
    md.create_topic("t", configs={**TIERED, "retention.ms": "60000"})
    assert md.log_config("t").get("local.retention.ms") == 60000
    md.create_topic("u", configs=TIERED)
    assert md.log_config("u").get("local.retention.ms") == -1


def test_a_capped_local_retention_is_described_with_its_broker_source(tmp_path):
    md = open_md(tmp_path, SHIPPED)
    md.create_topic("short", configs={"retention.ms": "3600000"})
    [entry] = md.describe_topic_configs("short", ["local.retention.ms"], include_synonyms=True)
    assert (entry.value, entry.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG)
    assert entry.synonyms == [
        ("log.local.retention.ms", "86400000", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.local.retention.ms", "-2", ConfigSource.DEFAULT_CONFIG)]


def test_effective_local_retention_never_exceeds_the_total():
    from strata.log.log_config import LogConfig, effective_local_retention
    assert effective_local_retention(-2, 500) == 500
    assert effective_local_retention(-2, -1) == -1
    assert effective_local_retention(-1, 500) == 500
    assert effective_local_retention(-1, -1) == -1
    assert effective_local_retention(900, 500) == 500
    assert effective_local_retention(100, 500) == 100
    assert effective_local_retention(100, -1) == 100
    config = LogConfig({"local.retention.ms": "86400000", "retention.ms": "3600000",
                        "local.retention.bytes": "-1", "retention.bytes": "1000"})
    assert (config.local_retention_ms, config.local_retention_bytes) == (3600000, 1000)


def test_copy_disabled_needs_local_retention_equal_to_total_or_minus_two(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    ro = {**TIERED, "remote.log.copy.disable": "true"}
    # Kafka's testCreateTopicRetentionBytesValidationWithRemoteCopyDisabled, step 1
    assert invalid_config(md.create_topic, "t", configs={
        **ro, "local.retention.bytes": "100", "retention.bytes": "1000",
        "local.retention.ms": "-2"}) == COPY_BYTES
    assert invalid_config(md.create_topic, "t", configs={
        **ro, "local.retention.ms": "1000", "retention.ms": "5000"}) == COPY_MS
    # bytes is checked before ms
    assert invalid_config(md.create_topic, "t", configs={
        **ro, "local.retention.bytes": "100", "retention.bytes": "1000",
        "local.retention.ms": "1000", "retention.ms": "5000"}) == COPY_BYTES
    md.create_topic("a", configs=ro)  # both -2
    md.create_topic("b", configs={**ro, "local.retention.bytes": "1000", "retention.bytes": "1000",
                                  "local.retention.ms": "5000", "retention.ms": "5000"})
    # infinite total retention: local must then be -1 too (or -2)
    md.create_topic("c", configs={**ro, "retention.ms": "-1", "local.retention.ms": "-1"})
    assert invalid_config(md.create_topic, "d", configs={
        **ro, "retention.ms": "-1", "local.retention.ms": "1000"}) == COPY_MS
    # on alter (Kafka's test, steps 5-6): a tiered topic with local < total
    md.create_topic("e", configs={**TIERED, "retention.ms": "1000", "local.retention.ms": "100"})
    assert invalid_config(md.incremental_alter_topic_configs, "e",
                          [("remote.log.copy.disable", OP_SET, "true")]) == COPY_MS
    md.incremental_alter_topic_configs("e", [("remote.log.copy.disable", OP_SET, "true"),
                                             ("local.retention.ms", OP_SET, "1000")])
    assert md.log_config("e").get("remote.log.copy.disable") is True


def test_turning_tiering_off_requires_delete_on_disable(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    md.create_topic("t", configs=TIERED)
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("remote.storage.enable", OP_SET, "false")]) == TURN_OFF
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("remote.storage.enable", OP_DELETE, None)]) == TURN_OFF
    # legacy AlterConfigs replaces the whole set: leaving the key out turns tiering off
    assert invalid_config(md.alter_topic_configs, "t", {"retention.ms": "1000"}) == TURN_OFF
    assert invalid_config(md.alter_topic_configs, "t", {"remote.storage.enable": "false"},
                          validate_only=True) == TURN_OFF
    assert md.topic("t").configs == TIERED
    # read-only tiering instead is fine
    md.incremental_alter_topic_configs("t", [("remote.log.copy.disable", OP_SET, "true")])
    md.incremental_alter_topic_configs("t", [("remote.storage.enable", OP_SET, "false"),
                                             ("remote.log.delete.on.disable", OP_SET, "true")])
    cfg = md.log_config("t")
    assert cfg.get("remote.storage.enable") is False and cfg.get("remote.log.delete.on.disable")
    # once off, the key may go: nothing is turned off any more
    md.alter_topic_configs("t", {})
    # and a never-tiered topic may say false without more
    md.create_topic("u")
    md.incremental_alter_topic_configs("u", [("remote.storage.enable", OP_SET, "false")])


def test_internal_topics_are_never_tiered(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    assert invalid_config(md.create_internal_topic, "__remote_log_metadata", 1,
                          {**TIERED, "retention.ms": "-1"}) == \
        "Remote log storage is unsupported for the internal topic __remote_log_metadata"
    assert invalid_config(md.create_internal_topic, "__consumer_offsets", 1,
                          {**TIERED, "cleanup.policy": "compact"}) == CLEANUP
    md.create_internal_topic("__remote_log_metadata", 1, {"retention.ms": "-1"})
    assert invalid_config(md.incremental_alter_topic_configs, "__remote_log_metadata",
                          [("remote.storage.enable", OP_SET, "true")]) == \
        "Remote log storage is unsupported for the internal topic __remote_log_metadata"


def test_rejections_leave_nothing_behind_and_are_invalid_config_errors(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    with pytest.raises(InvalidConfigError):
        md.create_topic("t", configs={**TIERED, "cleanup.policy": "compact"})
    assert md.topics() == {}
    reopened = open_md(tmp_path, SYSTEM_ON)
    assert reopened.topics() == {}


# ---- the broker default: log.remote.storage.enable ----------------------------------------------

def test_broker_default_tiers_new_topics_but_not_compacted_or_internal_ones(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    assert md.default_log_config().get("remote.storage.enable") is True
    md.create_topic("plain")
    assert md.topic("plain").configs == {}
    assert md.log_config("plain").get("remote.storage.enable") is True
    md.create_topic("compacted", configs={"cleanup.policy": "compact"})
    assert md.log_config("compacted").get("remote.storage.enable") is False
    md.create_topic("both", configs={"cleanup.policy": "compact,delete"})
    assert md.log_config("both").get("remote.storage.enable") is False
    for name, configs in (("__consumer_offsets", {"cleanup.policy": "compact"}),
                          ("__transaction_state", {"cleanup.policy": "compact"}),
                          ("__remote_log_metadata", {"retention.ms": "-1",
                                                     "cleanup.policy": "delete"})):
        md.create_internal_topic(name, 1, configs)
        assert md.log_config(name).get("remote.storage.enable") is False, name
    # explicit settings still count: false is honoured, true on a compacted topic is refused
    md.create_topic("opted-out", configs={"remote.storage.enable": "false"})
    assert md.log_config("opted-out").get("remote.storage.enable") is False
    assert invalid_config(md.create_topic, "x", configs={**TIERED, "cleanup.policy": "compact"}) \
        == CLEANUP
    # the resolution survives a restart
    again = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    assert again.log_config("plain").get("remote.storage.enable") is True
    assert again.log_config("compacted").get("remote.storage.enable") is False
    assert again.log_config("__remote_log_metadata").get("remote.storage.enable") is False


def test_broker_default_with_a_compacting_broker_cleanup_policy_tiers_nothing(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true",
                            "log.cleanup.policy": "compact"})
    md.create_topic("t")
    assert md.log_config("t").get("remote.storage.enable") is False
    md.create_topic("d", configs={"cleanup.policy": "delete"})
    assert md.log_config("d").get("remote.storage.enable") is True


def test_compacting_a_topic_tiered_by_the_broker_default_turns_tiering_off(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    md.create_topic("t")
    assert md.log_config("t").get("remote.storage.enable") is True
    md.incremental_alter_topic_configs("t", [("cleanup.policy", OP_SET, "compact")])
    assert md.topic("t").configs == {"cleanup.policy": "compact"}
    assert md.log_config("t").get("remote.storage.enable") is False
    # legacy AlterConfigs, and an explicit false, pass the same way
    md.create_topic("u")
    md.alter_topic_configs("u", {"cleanup.policy": "compact,delete"})
    assert md.log_config("u").get("remote.storage.enable") is False
    md.create_topic("v")
    md.incremental_alter_topic_configs("v", [("remote.storage.enable", OP_SET, "false")])
    assert md.log_config("v").get("remote.storage.enable") is False


def test_untiering_an_inherited_topic_asks_the_tiered_layer_which_may_refuse(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    md.create_topic("t")
    calls = []

    def refuse(name, config, old):
        calls.append((name, config.get("remote.storage.enable"), old.get("remote.storage.enable")))
        raise InvalidConfigError(tc.inherited_tiering_remote_data_message(
            name, "partition t-0 has data in remote storage"))
    md.config_validator = refuse
    message = invalid_config(md.incremental_alter_topic_configs, "t",
                             [("cleanup.policy", OP_SET, "compact")])
    assert calls == [("t", False, True)]
    assert message.startswith("Topic t is tiered by the broker default "
                              "log.remote.storage.enable=true and partition t-0 has data in "
                              "remote storage")
    assert "`remote.storage.enable=false,remote.log.delete.on.disable=true`" in message
    assert md.topic("t").configs == {}
    assert md.log_config("t").get("remote.storage.enable") is True


def test_a_topic_that_asked_for_tiering_keeps_kafkas_rules(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    md.create_topic("t", configs=TIERED)
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("cleanup.policy", OP_SET, "compact")]) == CLEANUP
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("remote.storage.enable", OP_SET, "false")]) == TURN_OFF
    # dropping the topic's own setting while compacting is still turning its tiering off
    assert invalid_config(md.incremental_alter_topic_configs, "t",
                          [("remote.storage.enable", OP_DELETE, None),
                           ("cleanup.policy", OP_SET, "compact")]) == TURN_OFF
    md.incremental_alter_topic_configs("t", [("remote.storage.enable", OP_SET, "false"),
                                             ("remote.log.delete.on.disable", OP_SET, "true"),
                                             ("cleanup.policy", OP_SET, "compact")])
    assert md.log_config("t").get("remote.storage.enable") is False


def test_broker_default_is_described_where_it_applies_only(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "log.remote.storage.enable": "true"})
    md.create_topic("plain")
    md.create_topic("compacted", configs={"cleanup.policy": "compact"})

    def entry(topic):
        [e] = md.describe_topic_configs(topic, ["remote.storage.enable"], include_synonyms=True)
        return e

    plain = entry("plain")
    assert (plain.value, plain.source) == ("true", ConfigSource.STATIC_BROKER_CONFIG)
    assert plain.synonyms == [("log.remote.storage.enable", "true",
                               ConfigSource.STATIC_BROKER_CONFIG)]
    compacted = entry("compacted")
    assert (compacted.value, compacted.source) == ("false", ConfigSource.DEFAULT_CONFIG)
    assert compacted.synonyms == []


def test_broker_default_without_the_system_flag_refuses_to_start(tmp_path):
    with pytest.raises(ValueError) as info:
        open_md(tmp_path, {"log.remote.storage.enable": "true"})
    message = str(info.value)
    assert "log.remote.storage.enable=true" in message
    assert "remote.log.storage.system.enable=true" in message
    assert not (tmp_path / "meta.properties").exists()  # refused before anything was written
    open_md(tmp_path, {"log.remote.storage.enable": "false"})


# ---- broker startup -----------------------------------------------------------------------------

def test_bad_remote_values_stop_the_broker(tmp_path):
    with pytest.raises(InvalidConfigError, match="remote.log.reader.threads"):
        open_md(tmp_path, {"remote.log.reader.threads": "0"})
    with pytest.raises(InvalidConfigError, match="remote.log.storage.system.enable"):
        open_md(tmp_path, {"remote.log.storage.system.enable": "maybe"})


def test_broker_local_retention_must_fit_broker_retention_when_tiering_is_on(tmp_path):
    props = {**SYSTEM_ON, "log.retention.ms": "1000", "log.local.retention.ms": "5000"}
    with pytest.raises(ValueError) as info:
        open_md(tmp_path, props)
    assert str(info.value) == ("Invalid value 5000 for configuration local.retention.ms: Value "
                               "must not be more than retention.ms property value: 1000")
    with pytest.raises(ValueError, match="Value must not be -1 as retention.bytes value is set "
                                         "as 10."):
        open_md(tmp_path, {**SYSTEM_ON, "log.retention.bytes": "10",
                           "log.local.retention.bytes": "-1"})
    # Kafka checks these only when tiering is enabled
    open_md(tmp_path, {"log.retention.ms": "1000", "log.local.retention.ms": "5000"})


def test_tiered_topics_stop_a_broker_whose_tiering_was_disabled(tmp_path):
    md = open_md(tmp_path, SYSTEM_ON)
    md.create_topic("tiered", configs=TIERED)
    md.create_topic("plain")
    with pytest.raises(ValueError) as info:
        open_md(tmp_path, {})
    assert str(info.value).startswith(STORED_TIERED)
    assert "tiered" in str(info.value)
    # deleting the tiered topic lets the broker start without tiering
    md.delete_topic("tiered")
    open_md(tmp_path, {})


def test_remote_log_manager_config_is_exposed_by_the_metadata(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "remote.log.reader.threads": "3",
                            "rsm.config.storage.url": "memory://"})
    assert md.remote_storage_system_enabled is True
    assert md.remote_log_manager_config.remote_log_reader_threads == 3
    assert md.remote_log_manager_config.rsm_props() == {"storage.url": "memory://"}
    assert open_md(tmp_path / "b").remote_storage_system_enabled is False


# ---- DescribeConfigs on the broker --------------------------------------------------------------

_ENTRY_TYPES = {ConfigType.BOOLEAN: ConfigEntryType.BOOLEAN, ConfigType.STRING: ConfigEntryType.STRING,
                ConfigType.INT: ConfigEntryType.INT, ConfigType.LONG: ConfigEntryType.LONG,
                ConfigType.DOUBLE: ConfigEntryType.DOUBLE}


def test_describe_broker_lists_every_remote_key_with_kafkas_type_default_and_doc(tmp_path):
    md = open_md(tmp_path)
    entries = {e.name: e for e in md.describe_broker_configs(include_documentation=True,
                                                             include_synonyms=True)}
    internal = tc.INTERNAL_REMOTE_LOG_MANAGER_KEYS
    assert internal == {"remote.log.index.file.cache.ttl.ms",
                        "remote.log.manager.task.retry.backoff.ms",
                        "remote.log.manager.task.retry.backoff.max.ms",
                        "remote.log.manager.task.retry.jitter"}
    for name, (type_, default) in KAFKA_KEYS.items():
        assert name in BROKER_CONFIG_KEYS
        if name in internal:
            assert name not in entries  # Kafka describes internal configs only when set
            continue
        e = entries[name]
        assert e.config_type == _ENTRY_TYPES[type_], name
        # the two KIP-956 quotas are dynamic (read_only false), as in Kafka
        assert e.read_only == (name not in DYNAMIC_BROKER_CONFIGS), name
        assert not e.is_sensitive and e.source == ConfigSource.DEFAULT_CONFIG
        assert e.documentation == REMOTE_LOG_MANAGER_CONFIG_DEF[name].doc
    assert entries["remote.log.storage.system.enable"].value == "false"
    assert entries["remote.log.storage.manager.class.name"].value is None
    assert entries["remote.log.metadata.manager.class.name"].value == \
        "strata.tiered.metadata.topic_based.TopicBasedRemoteLogMetadataManager"
    assert entries["remote.log.index.file.cache.total.size.bytes"].value == "1073741824"
    assert entries["remote.log.manager.copy.max.bytes.per.second"].value == str(2**63 - 1)
    assert entries["log.local.retention.ms"].value == "-2"
    assert entries["remote.fetch.max.wait.ms"].documentation.startswith(
        "The maximum amount of time the server will wait before answering the fetch request")
    strata_default = entries["log.remote.storage.enable"]
    assert strata_default.config_type == ConfigEntryType.BOOLEAN and strata_default.value is None


def test_describe_broker_shows_set_values_and_set_internal_keys(tmp_path):
    md = open_md(tmp_path, {**SYSTEM_ON, "remote.log.manager.task.retry.jitter": "0.25",
                            "remote.log.reader.threads": "4", "rsm.config.secret": "s3cr3t"})
    entries = {e.name: e for e in md.describe_broker_configs(include_synonyms=True)}
    on = entries["remote.log.storage.system.enable"]
    assert (on.value, on.source) == ("true", ConfigSource.STATIC_BROKER_CONFIG)
    assert on.synonyms == [("remote.log.storage.system.enable", "true",
                            ConfigSource.STATIC_BROKER_CONFIG),
                           ("remote.log.storage.system.enable", "false",
                            ConfigSource.DEFAULT_CONFIG)]
    jitter = entries["remote.log.manager.task.retry.jitter"]
    assert (jitter.value, jitter.config_type) == ("0.25", ConfigEntryType.DOUBLE)
    assert entries["remote.log.reader.threads"].value == "4"
    # plugin properties are unknown to the broker: sensitive, as Kafka treats unknown keys
    secret = entries["rsm.config.secret"]
    assert secret.is_sensitive and secret.value is None
    only = md.describe_broker_configs(["remote.log.manager.task.retry.backoff.ms"])
    assert only == []  # internal and unset


# ---- over the wire -------------------------------------------------------------------------------

@pytest.fixture
def wire(tmp_path):
    from strata.broker.metadata_publisher import TopicLogsPublisher
    from strata.common.scheduler import KafkaScheduler
    from strata.log.log_manager import LogManager
    from strata.replication.replica_manager import ReplicaManager
    from strata.server.context import BrokerContext
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    metadata = ClusterMetadata(log_dir, 1, {"node.id": "1", "log.dirs": str(log_dir), **SYSTEM_ON})
    scheduler = KafkaScheduler(threads=1)
    manager = LogManager([log_dir], metadata.default_log_config(), topic_config=metadata.log_config,
                         scheduler=scheduler)
    manager.startup()
    metadata.add_listener(TopicLogsPublisher(manager, metadata))
    replicas = follow_grants(metadata, ReplicaManager(
        manager, lambda t: (i.partitions if (i := metadata.topic(t)) else None),
        broker_id=metadata.node_id))
    ctx = BrokerContext(node_id=1, advertised_host="broker.example", advertised_port=9093,
                        metadata=metadata, replica_manager=replicas)
    yield ctx
    scheduler.shutdown(run_pending=False)
    manager.shutdown()


def _send(ctx, api, version, **fields):
    from test_group_handlers import Client
    return asyncio.run(Client(ctx).send(api, version, **fields))


def _nested(api, version, path, **fields):
    from test_group_handlers import Client
    return Client.nested(api, version, path, **fields)


def test_create_topics_answers_invalid_config_with_kafkas_message(wire):
    from strata.protocol.codec import ApiKey
    v = 7

    def topic(name, configs):
        return _nested(ApiKey.CREATE_TOPICS, v, "topics", name=name, num_partitions=1,
                       replication_factor=1, assignments=(), configs=tuple(
                           _nested(ApiKey.CREATE_TOPICS, v, "topics.configs", name=k, value=val)
                           for k, val in configs.items()))

    r = _send(wire, ApiKey.CREATE_TOPICS, v, timeout_ms=30_000, validate_only=False, topics=(
        topic("bad", {**TIERED, "cleanup.policy": "compact"}), topic("good", TIERED)))
    results = {t.name: t for t in r.topics}
    assert results["bad"].error_code == ErrorCode.INVALID_CONFIG
    assert results["bad"].error_message == CLEANUP
    assert results["good"].error_code == 0
    assert wire.metadata.log_config("good").get("remote.storage.enable") is True


def test_incremental_alter_configs_refuses_turning_tiering_off(wire):
    from strata.protocol.codec import ApiKey
    wire.metadata.create_topic("t", configs=TIERED)
    v = 1
    r = _send(wire, ApiKey.INCREMENTAL_ALTER_CONFIGS, v, validate_only=False, resources=(
        _nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "resources", resource_type=2,
                resource_name="t", configs=(
                    _nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "resources.configs",
                            name="remote.storage.enable", config_operation=0, value="false"),)),))
    [resp] = r.responses
    assert (resp.error_code, resp.error_message) == (ErrorCode.INVALID_CONFIG, TURN_OFF)
    assert wire.metadata.topic("t").configs == TIERED


def test_describe_configs_on_the_broker_lists_remote_keys_with_docs(wire):
    from strata.protocol.codec import ApiKey
    v = 4
    r = _send(wire, ApiKey.DESCRIBE_CONFIGS, v, include_synonyms=False, include_documentation=True,
              resources=(_nested(ApiKey.DESCRIBE_CONFIGS, v, "resources", resource_type=4,
                                 resource_name="1", configuration_keys=None),))
    [result] = r.results
    entries = {c.name: c for c in result.configs}
    assert result.error_code == 0
    visible = set(KAFKA_KEYS) - tc.INTERNAL_REMOTE_LOG_MANAGER_KEYS
    assert visible <= set(entries)
    assert entries["remote.log.storage.system.enable"].value == "true"
    assert entries["remote.log.reader.threads"].documentation == \
        "Size of the thread pool that is allocated for handling remote log reads."
    assert entries["remote.log.manager.copier.thread.pool.size"].config_type == 3  # INT
