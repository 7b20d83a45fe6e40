"""KIP-1241 delayed upload (Kafka 4.4): ``remote.copy.lag.ms`` / ``remote.copy.lag.bytes`` hold a
rolled segment local until either lag is reached; local retention still deletes only copied
segments; the topic and broker (``log.remote.copy.lag.*``, dynamic) configs are validated and
described as Kafka 4.4 does. Real log, memory remote tier, mock clock."""

from __future__ import annotations

import pytest

from strata.cluster.metadata import (
    DEFAULT_BROKER_RESOURCE, OP_SET, ClusterMetadata, ConfigSource)
from strata.common.errors import ErrorCode, InvalidConfigError, KafkaError
from strata.log.log_config import LogConfig
from strata.tiered.config import remote_copy_lag_errors
from strata.tiered.manager.copier import upload_eligible
from tiered_env import T0, TIP, TieredEnv

MINUTE = 60_000
TIERED_BROKER = {"remote.log.storage.system.enable": "true"}


def copied_ends(env: TieredEnv) -> list[int]:
    return [m.end_offset for m in env.rlmm.list_remote_log_segments(TIP)]


@pytest.fixture
def make_env(tmp_path):
    envs = []

    def make(**props) -> TieredEnv:
        env = TieredEnv(tmp_path / str(len(envs)), log_props=props)
        envs.append(env)
        return env
    yield make
    for env in envs:
        env.close()


def test_a_segment_younger_than_the_copy_lag_stays_local_while_an_older_one_is_copied(make_env):
    env = make_env(**{"remote.copy.lag.ms": str(10 * MINUTE), "local.retention.bytes": "-2"})
    env.produce(40, ts=T0 - 30 * MINUTE)       # old records
    old_end = env.log.log_end_offset - 1
    env.produce(40)                            # records of now
    segments = env.log.local_log.segments
    young = [s for s in segments[:-1] if s.largest_timestamp >= T0 - 10 * MINUTE]
    assert young and len(segments) - 1 > len(young)

    env.copy()
    ends = copied_ends(env)
    assert ends and max(ends) < young[0].base_offset
    assert max(ends) <= old_end
    assert env.log.highest_offset_in_remote_storage == max(ends)

    env.clock.advance_ms(10 * MINUTE)             # the young segments reach the lag
    env.copy()
    assert max(copied_ends(env)) == segments[-1].base_offset - 1


def test_the_byte_lag_copies_a_segment_once_enough_newer_bytes_follow_it(make_env):
    lag = 6000
    env = make_env(**{"remote.copy.lag.ms": "-1", "remote.copy.lag.bytes": str(lag),
                      "local.retention.bytes": "-2"})  # −1 ms: local retention, 7 days
    env.produce(80)
    segments = env.log.local_log.segments
    total = sum(s.size for s in segments)
    after, expected = total, []
    for seg, nxt in zip(segments, segments[1:]):
        after -= seg.size
        if after < lag:
            break
        expected.append(nxt.base_offset - 1)
    assert expected and len(expected) < len(segments) - 1
    env.copy()
    assert copied_ends(env) == expected


def test_local_retention_never_deletes_a_segment_the_lag_kept_local(make_env):
    env = make_env(**{"remote.copy.lag.ms": str(10 * MINUTE)})   # local.retention.bytes=1
    env.produce(30, ts=T0 - 30 * MINUTE)
    env.produce(30)
    env.copy()
    copied_to = env.log.highest_offset_in_remote_storage
    assert copied_to >= 0
    kept = [s.base_offset for s in env.log.local_log.segments if s.base_offset > copied_to]
    env.log.delete_old_segments()
    assert env.log.local_log_start_offset == copied_to + 1
    assert [s.base_offset for s in env.log.local_log.segments] == kept
    assert env.log.log_start_offset == 0


def test_a_zero_lag_copies_at_once_and_two_unlimited_lags_never_as_in_kafka():
    class Seg:
        largest_timestamp = T0

    def eligible(**props) -> bool:
        return upload_eligible(LogConfig(props), Seg(), T0, 0)
    assert eligible()                                          # defaults: 0 ms, -1 bytes
    assert eligible(**{"remote.copy.lag.ms": "60000", "remote.copy.lag.bytes": "0"})
    assert not eligible(**{"remote.copy.lag.ms": "60000"})
    # −1 bytes follows local.retention.bytes; 0 there is a zero lag: at once
    assert eligible(**{"remote.copy.lag.ms": "60000", "local.retention.bytes": "0"})
    # −1 and −1 with unlimited local retention: neither check applies
    assert not eligible(**{"remote.copy.lag.ms": "-1", "retention.ms": "-1"})

    class Future:
        largest_timestamp = T0 + MINUTE   # a timestamp ahead of the clock counts as reached
    assert upload_eligible(LogConfig({"remote.copy.lag.ms": "600000"}), Future(), T0, 0)


def test_topic_validation_has_kafka_44s_rule_and_messages():
    def errors(**props):
        return remote_copy_lag_errors(LogConfig(props))
    assert errors(**{"remote.copy.lag.ms": "1000", "local.retention.ms": "999"}) == [
        "Invalid value 1000 for configuration remote.copy.lag.ms: Value must not exceed "
        "local.retention.ms (effective value: 999)"]
    # −2 local: retention.* is the effective local retention
    assert errors(**{"remote.copy.lag.bytes": "2000", "retention.bytes": "1000"}) == [
        "Invalid value 2000 for configuration remote.copy.lag.bytes: Value must not exceed "
        "local.retention.bytes (effective value: 1000)"]
    assert errors(**{"remote.copy.lag.ms": "-1", "local.retention.ms": "5"}) == []
    assert errors(**{"remote.copy.lag.bytes": "10", "retention.bytes": "-1"}) == []
    with pytest.raises(InvalidConfigError, match="Value must be at least -1"):
        LogConfig({"remote.copy.lag.ms": "-2"})


def test_create_and_alter_topic_refuse_a_lag_beyond_local_retention(tmp_path):
    md = ClusterMetadata(tmp_path, 1, TIERED_BROKER)
    with pytest.raises(KafkaError) as info:
        md.create_topic("t", 1, 1, {"remote.storage.enable": "true", "local.retention.ms": "1000",
                                    "remote.copy.lag.ms": "2000"})
    assert info.value.code is ErrorCode.INVALID_CONFIG
    md.create_topic("t", 1, 1, {"remote.storage.enable": "true", "local.retention.ms": "1000",
                                "remote.copy.lag.ms": "1000"})
    with pytest.raises(KafkaError) as info:
        md.incremental_alter_topic_configs("t", [("local.retention.ms", OP_SET, "500")])
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert "remote.copy.lag.ms" in str(info.value)
    # a plain topic is not judged by the tiering rules, as in Kafka
    md.create_topic("plain", 1, 1, {"local.retention.ms": "1", "remote.copy.lag.ms": "2"})
    md.close()


class Heard:
    def __init__(self):
        self.configs = {}

    def on_topic_config_changed(self, info, config):
        self.configs[info.name] = config


def test_broker_copy_lag_is_dynamic_checked_and_reaches_topics_without_an_override(tmp_path):
    md = ClusterMetadata(tmp_path, 1, {**TIERED_BROKER, "log.local.retention.ms": "60000"})
    md.create_topic("inherits", 1, 1, {"remote.storage.enable": "true"})
    md.create_topic("own", 1, 1, {"remote.storage.enable": "true", "remote.copy.lag.ms": "5"})
    heard = Heard()
    md.add_listener(heard)

    with pytest.raises(KafkaError) as info:
        md.alter_broker_configs("1", [("log.remote.copy.lag.ms", OP_SET, "60001")], True)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert str(info.value) == ("Invalid value 60001 for configuration log.remote.copy.lag.ms: "
                               "Value must not exceed log.local.retention.ms (effective value: "
                               "60000)")
    md.alter_broker_configs(DEFAULT_BROKER_RESOURCE,
                            [("log.remote.copy.lag.bytes", OP_SET, "4096")], True)
    md.alter_broker_configs("1", [("log.remote.copy.lag.ms", OP_SET, "30000")], True)

    assert md.log_config("inherits").remote_copy_lag_ms == 30000
    assert md.log_config("inherits").remote_copy_lag_bytes == 4096
    assert md.log_config("own").remote_copy_lag_ms == 5
    assert heard.configs["inherits"].remote_copy_lag_ms == 30000
    (entry,) = md.describe_topic_configs("inherits", ["remote.copy.lag.ms"], include_synonyms=True)
    assert (entry.value, entry.source) == ("30000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("log.remote.copy.lag.ms", "30000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("log.remote.copy.lag.ms", "0", ConfigSource.DEFAULT_CONFIG)]
    (entry,) = md.describe_topic_configs("inherits", ["remote.copy.lag.bytes"])
    assert (entry.value, entry.source) == ("4096", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    brokers = {e.name: e for e in md.describe_broker_configs(["log.remote.copy.lag.ms"])}
    assert brokers["log.remote.copy.lag.ms"].read_only is False
    md.close()

    # stored and applied again at restart
    again = ClusterMetadata(tmp_path, 1, {**TIERED_BROKER, "log.local.retention.ms": "60000"})
    assert again.log_config("inherits").remote_copy_lag_ms == 30000
    again.close()
