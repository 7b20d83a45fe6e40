"""Broker config checks at start: unknown keys warned with the nearest known one, values their
type refuses stop the start with one line naming key, value and what is accepted, the effective
config logged with passwords hidden, and `strata serve`'s other start failures as one line."""

from __future__ import annotations

import kio  # noqa: F401 - imported: `serve` leaves hypothesis (pytest's plugin) alone
import pytest

from strata.broker import config_check as cc
from strata.cli import main as cli


def test_unknown_keys_are_named_with_the_nearest_known_key() -> None:
    props = {"log.retension.hours": "3", "num.partitions": "2", "auto.create.topic.enable": "true",
             "qwertyuiop": "1", "listener.name.internal.ssl.keystore.type": "PEM",
             "rsm.config.storage.url": "file:///x", "zookeeper.connect": "zk:2181",
             "strata.metrics.listener": "http://:0", "broker.rack": "a"}
    assert cc.unknown_keys(props) == [("log.retension.hours", "log.retention.hours"),
                                      ("auto.create.topic.enable", "auto.create.topics.enable"),
                                      ("qwertyuiop", None)]


def test_kafka_4_4_broker_keys_are_known_and_typed() -> None:
    # keys KafkaConfig.configDef() gained in Kafka 4.4.0 (the project's reference version)
    props = {"max.decompressed.message.bytes": "1048576", "group.streams.assignors": "sticky",
             "errors.deadletterqueue.topic.name.prefix": "dlq-",
             "sasl.oauthbearer.allow.unverified.issuer": "false"}
    assert cc.unknown_keys(props) == []
    with pytest.raises(cc.ConfigProblem, match="'max.decompressed.message.bytes': expected an "
                                               "integer"):
        cc.check_values({"node.id": "1", "max.decompressed.message.bytes": "1MB"})


def test_a_custom_plugin_prefix_makes_its_keys_known() -> None:
    props = {"remote.log.storage.manager.impl.prefix": "mystore.", "mystore.bucket": "b"}
    assert cc.unknown_keys(props) == []


def test_warnings_say_where_the_key_was_set() -> None:
    lines = cc.unknown_key_warnings({"log.retension.hours": "3"},
                                    cc.origins("server.properties", [], ["log.retension.hours=3"]))
    assert lines == ["unknown broker config 'log.retension.hours' (--override) is ignored; "
                     "did you mean 'log.retention.hours'?"]


@pytest.mark.parametrize("key, value, accepted", [
    ("log.retention.hours", "abc", "an integer from -2147483648 to 2147483647"),
    ("log.retention.hours", "2147483648", "an integer from -2147483648 to 2147483647"),
    ("auto.create.topics.enable", "yes", "true or false"),
    ("log.cleaner.min.cleanable.ratio", "half", "a number"),
    ("zookeeper.session.timeout.ms", "10s", "an integer from -2147483648 to 2147483647"),
])
def test_a_value_its_type_refuses_is_one_line_naming_key_value_and_accepted(
        key, value, accepted) -> None:
    with pytest.raises(cc.ConfigProblem) as info:
        cc.check_values({"node.id": "1", key: value})
    assert str(info.value) == (f"invalid value '{value}' for broker config '{key}': "
                               f"expected {accepted}")


def test_values_kafka_parses_pass() -> None:
    cc.check_values({"log.retention.hours": " 12 ", "auto.create.topics.enable": "TRUE",
                     "log.cleaner.min.cleanable.ratio": "1e-1", "log.retention.bytes": "-1",
                     "listeners": "PLAINTEXT://:9092", "unknown.key": "anything"})


def test_effective_config_lists_values_defaults_and_hides_passwords() -> None:
    text = cc.effective_config({"num.partitions": "3", "broker.rack": "r1",
                                "ssl.keystore.password": "s3cret", "made.up": "x",
                                "listener.name.a.sasl.jaas.config": "jaas-secret"})
    lines = text.splitlines()
    assert lines[0] == "KafkaConfig values: "
    assert "\tnum.partitions = 3" in lines and "\tbroker.rack = r1" in lines
    assert "\tmessage.max.bytes = 1048588" in lines      # a default
    assert "\tlog.retention.ms = null" in lines          # no default
    assert "\tssl.keystore.password = [hidden]" in lines
    assert "\tlistener.name.a.sasl.jaas.config = [hidden]" in lines
    assert "s3cret" not in text and "jaas-secret" not in text and "made.up" not in text
    assert lines[1:] == sorted(lines[1:])


def test_serve_stops_on_a_bad_value_with_one_line(capsys) -> None:
    assert cli.main(["serve", "--override", "auto.create.topics.enable=yes"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["strata: invalid value 'yes' for broker config 'auto.create.topics.enable': "
                   "expected true or false"]


def test_serve_stops_on_a_missing_config_file_with_one_line(tmp_path, capsys) -> None:
    missing = tmp_path / "server.properties"
    assert cli.main(["serve", "--config", str(missing)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"strata: cannot read the config file {missing}: No such file or directory"]


def test_a_bad_log_level_is_one_line(capsys) -> None:
    assert cli.main(["--log-level", "LOUD", "serve"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "strata: invalid --log-level 'LOUD': expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"]


def test_bind_errors_name_the_address() -> None:
    asyncio_error = OSError(98, "error while attempting to bind on address ('127.0.0.1', 9092): "
                                "address already in use")
    assert cli._address_of(asyncio_error) == "127.0.0.1:9092"
    assert cli._address_of(OSError(98, "Address already in use")) == (
        "an address of listeners or strata.metrics.listener")
