"""SASL on the broker's side (``strata.security.sasl``): JAAS configs as Kafka writes them, the
mechanisms a listener enables, and PLAIN's exchange."""

from __future__ import annotations

import pytest

from strata.security.sasl import (
    KafkaPrincipal, PlainServer, SaslAuthenticationFailed, SaslConfigError, jaas_config,
    parse_jaas, server_factories)

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="al\\"ice";')


def test_a_jaas_config_as_kafka_writes_it():
    jaas = parse_jaas(JAAS)
    assert jaas.login_module == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert jaas.options == {"username": "admin", "password": "admin-secret",
                            "user_admin": "admin-secret", "user_alice": 'al"ice'}
    with pytest.raises(SaslConfigError):
        parse_jaas("PlainLoginModule username=x;")


def test_the_most_specific_jaas_key_wins_and_mechanisms_are_per_listener():
    props = {"listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
             "sasl.jaas.config": JAAS.replace("alice", "bob"),
             "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN"}
    assert "user_alice" in jaas_config(props, "SASL_SSL", "PLAIN").options
    assert "user_bob" in jaas_config(props, "OTHER", "PLAIN").options
    assert set(server_factories(props, "SASL_SSL")) == {"PLAIN"}
    # Kafka's default mechanism, GSSAPI, wants a Kerberos principal, which PLAIN's JAAS lacks
    with pytest.raises(SaslConfigError, match="GSSAPI JAAS config names no principal"):
        server_factories(props, "OTHER")


def test_plain_accepts_a_listed_user_and_names_its_principal():
    server = PlainServer({"alice": "secret"})
    assert server.evaluate(b"\0alice\0secret") == b""
    assert server.complete and server.principal == KafkaPrincipal("User", "alice")
    assert str(server.principal) == "User:alice"
    assert PlainServer({"alice": "secret"}).evaluate(b"alice\0alice\0secret") == b""


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"\0mallory\0secret", b"\0alice\0",
                                   b"alice", b"\0\0secret", b"bob\0alice\0secret",
                                   b"\0alice\0secret\0extra"])
def test_plain_refuses_without_telling_which_part_was_wrong(token):
    server = PlainServer({"alice": "secret"})
    with pytest.raises(SaslAuthenticationFailed) as failed:
        server.evaluate(token)
    assert not server.complete and server.principal is None
    assert "secret" not in str(failed.value)


def test_authentications_are_counted_per_listener_and_mechanism_as_kafka_names_them():
    from prometheus_client import CollectorRegistry, generate_latest

    from strata.security.session import AuthenticationStats
    from strata.server.metrics import AuthenticationCollector
    stats = AuthenticationStats()
    stats.succeeded("SASL_SSL", "PLAIN")
    stats.succeeded("SASL_SSL", "PLAIN")
    stats.failed("SASL_SSL", "SCRAM-SHA-512")
    registry = CollectorRegistry()
    registry.register(AuthenticationCollector(stats))
    text = generate_latest(registry).decode()
    assert 'kafka_server_socket_server_metrics_successful_authentication_total{listener="SASL_SSL",mechanism="PLAIN"} 2.0' in text
    assert 'kafka_server_socket_server_metrics_failed_authentication_total{listener="SASL_SSL",mechanism="SCRAM-SHA-512"} 1.0' in text
