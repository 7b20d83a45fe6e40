"""DescribeConfigs of a broker answers every non-password config with its value, as Kafka's
``KafkaConfig.maybeSensitive`` does: only PASSWORD-typed configs (and names neither Strata nor
Kafka knows) are sensitive."""

from __future__ import annotations

from strata.cluster.metadata import (
    ClusterMetadata, ConfigEntryType, ConfigSource, broker_config_type, loggable_broker_configs,
    sensitive_broker_config)
from strata.common.config import ConfigType


def _describe(tmp_path, props):
    md = ClusterMetadata(tmp_path, 1, props)
    try:
        return {e.name: e for e in md.describe_broker_configs()}
    finally:
        md.close()


def test_rack_and_replica_selector_are_described_with_their_values(tmp_path) -> None:
    entries = _describe(tmp_path, {
        "broker.rack": "eu-west-1a",
        "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"})
    rack = entries["broker.rack"]
    assert (rack.value, rack.is_sensitive, rack.source) == (
        "eu-west-1a", False, ConfigSource.STATIC_BROKER_CONFIG)
    assert rack.config_type == ConfigEntryType.STRING
    selector = entries["replica.selector.class"]
    assert selector.value == "org.apache.kafka.common.replica.RackAwareReplicaSelector"
    assert not selector.is_sensitive


def test_unset_rack_is_listed_without_a_value_and_not_sensitive(tmp_path) -> None:
    rack = _describe(tmp_path, {})["broker.rack"]
    assert rack.value is None and not rack.is_sensitive and rack.source == ConfigSource.DEFAULT_CONFIG


def test_kafka_configs_strata_does_not_define_are_typed_from_kafka_and_shown(tmp_path) -> None:
    entries = _describe(tmp_path, {"num.io.threads": "16", "ssl.key.password": "pw-1f3",
                                   "sasl.jaas.config": "jaas-77", "made.up.key": "x"})
    io = entries["num.io.threads"]
    assert (io.value, io.is_sensitive, io.config_type) == ("16", False, ConfigEntryType.INT)
    for secret in ("ssl.key.password", "sasl.jaas.config"):   # Kafka's PASSWORD types
        assert entries[secret].is_sensitive and entries[secret].value is None
        assert entries[secret].config_type == ConfigEntryType.PASSWORD
    unknown = entries["made.up.key"]   # neither knows it: sensitive, as in Kafka
    assert unknown.is_sensitive and unknown.value is None
    assert unknown.config_type == ConfigEntryType.UNKNOWN


def test_only_password_types_are_hidden_in_logs() -> None:
    assert broker_config_type("broker.rack") is ConfigType.STRING
    assert broker_config_type("sasl.jaas.config") is ConfigType.PASSWORD
    assert not sensitive_broker_config("replica.selector.class")
    assert loggable_broker_configs({"broker.rack": "r1", "ssl.truststore.password": "s"}) == {
        "broker.rack": "r1", "ssl.truststore.password": "[hidden]"}
