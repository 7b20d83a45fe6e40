"""Dynamic broker configs are logged as Kafka logs them: password values as ``[hidden]``, when
they are altered and when a restarted broker loads them again."""

from __future__ import annotations

import logging

from strata.cluster.metadata import OP_SET, ClusterMetadata, loggable_broker_configs

SECRET = "keystore-secret-51e0"
PASSWORD_KEY = "listener.name.ssl.ssl.keystore.password"
LOCATION_KEY = "listener.name.ssl.ssl.keystore.location"


def test_dynamic_listener_passwords_are_hidden_in_the_log_when_set_and_when_loaded(
        tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="strata.cluster.metadata")
    metadata = ClusterMetadata(tmp_path, 1, {})
    try:
        metadata.alter_broker_configs("1", [(PASSWORD_KEY, OP_SET, SECRET),
                                            (LOCATION_KEY, OP_SET, "/etc/broker.p12")], True)
    finally:
        metadata.close()
    reopened = ClusterMetadata(tmp_path, 1, {})   # loads them again, as after a restart
    reopened.close()
    logged = [r.getMessage() for r in caplog.records if PASSWORD_KEY in r.getMessage()]
    assert any("dynamic configs now" in m for m in logged)
    assert any("loaded dynamic broker configs" in m for m in logged)
    for message in logged:
        assert SECRET not in message
        assert f"'{PASSWORD_KEY}': '[hidden]'" in message
        assert "/etc/broker.p12" in message   # not a secret: logged as it is


def test_sensitive_means_what_describe_configs_marks_sensitive() -> None:
    assert loggable_broker_configs({
        "sasl.jaas.config": "x", "ssl.key.password": "x", "log.retention.ms": "5",
        "some.unknown.config": "x", "listener.name.a.ssl.keystore.key": "x",
        "listener.name.a.ssl.keystore.type": "PEM"}) == {
        "sasl.jaas.config": "[hidden]", "ssl.key.password": "[hidden]", "log.retention.ms": "5",
        "some.unknown.config": "[hidden]", "listener.name.a.ssl.keystore.key": "[hidden]",
        "listener.name.a.ssl.keystore.type": "PEM"}
