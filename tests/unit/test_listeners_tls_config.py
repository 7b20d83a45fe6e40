"""Kafka's listener settings (``strata.common.listeners``) and TLS contexts from ``ssl.*``
settings (``strata.net.tls``): parsing and Kafka's refusals; a TLS handshake between the two
contexts on a socket pair (no network)."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from strata.common.listeners import (
    Listener, ListenerConfigError, listener_prop, parse_listeners)
from strata.net.tls import TlsConfigError, cipher_suites, client_context, server_context
from tls_support import PASSWORD, make_ca


def test_several_listeners_with_a_protocol_map_and_advertised_endpoints():
    config = parse_listeners({
        "listeners": "INTERNAL://127.0.0.1:9093,EXTERNAL://:9094,PLAINTEXT://localhost:0",
        "listener.security.protocol.map": "INTERNAL:SSL,EXTERNAL:SASL_SSL,PLAINTEXT:PLAINTEXT",
        "advertised.listeners": "INTERNAL://broker1:9093,EXTERNAL://kafka.example.com:19094",
        "inter.broker.listener.name": "INTERNAL"})
    assert config.listeners == (Listener("INTERNAL", "127.0.0.1", 9093, "SSL"),
                                Listener("EXTERNAL", "", 9094, "SASL_SSL"),
                                Listener("PLAINTEXT", "localhost", 0, "PLAINTEXT"))
    assert config.inter_broker == Listener("INTERNAL", "broker1", 9093, "SSL")
    assert config.advertised_of("EXTERNAL").host == "kafka.example.com"


def test_defaults_are_kafkas():
    config = parse_listeners({})
    assert config.listeners == (Listener("PLAINTEXT", "", 9092, "PLAINTEXT"),)
    assert config.inter_broker_listener == "PLAINTEXT"
    assert parse_listeners({"listeners": "SSL://:1", "security.inter.broker.protocol": "SSL"}
                           ).inter_broker.tls


@pytest.mark.parametrize("props, message", [
    ({"listeners": "FOO://:9092"}, "No security protocol defined for listener FOO"),
    ({"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9093"}, "must have a different name"),
    ({"listeners": "PLAINTEXT://:9092,SSL://:9092"}, "must have a different port"),
    ({"listeners": "PLAINTEXT//:9092"}, "Unable to parse"),
    ({"advertised.listeners": "SSL://h:1"}, "must be equal to or a subset"),
    ({"inter.broker.listener.name": "PLAINTEXT", "security.inter.broker.protocol": "SSL"},
     "Only one of"),
    ({"inter.broker.listener.name": "SSL"}, "must be a listener name defined"),
    ({"listener.security.protocol.map": "A:TLS"}, "is invalid"),
])
def test_kafkas_refusals(props, message):
    with pytest.raises(ListenerConfigError, match=message):
        parse_listeners(props)


def test_a_listener_prefix_overrides_the_plain_key():
    props = {"ssl.client.auth": "none", "listener.name.internal.ssl.client.auth": "required"}
    assert listener_prop(props, "INTERNAL", "ssl.client.auth") == "required"
    assert listener_prop(props, "EXTERNAL", "ssl.client.auth") == "none"


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str = "localhost") -> str:
    """A handshake over a socket pair; the protocol version agreed."""
    a, b = socket.socketpair()
    errors = []

    def serve():
        try:
            with server.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    t = threading.Thread(target=serve)
    t.start()
    try:
        with client.wrap_socket(b, server_hostname=host) as c:
            version = c.version()
            c.sendall(b"x")
    finally:
        t.join(5)
    if errors:
        raise errors[0]
    return version


def test_pem_and_pkcs12_keystores_and_truststores_make_working_contexts(tmp_path):
    ca = make_ca(tmp_path)
    server_cert = ca.issue("broker", key_password="k3y")
    pem = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(server_cert.keystore_pem),
           "ssl.key.password": "k3y", "ssl.truststore.type": "PEM",
           "ssl.truststore.location": str(ca.pem)}
    assert handshake(server_context(pem, "SSL"), client_context(pem)) in ("TLSv1.2", "TLSv1.3")
    p12 = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(server_cert.keystore_p12),
           "ssl.keystore.password": PASSWORD, "ssl.truststore.location": str(ca.pem),
           "ssl.truststore.type": "PEM", "ssl.enabled.protocols": "TLSv1.2"}
    assert handshake(server_context(p12, "SSL"), client_context(p12)) == "TLSv1.2"
    inline = {"ssl.keystore.type": "PEM",
              "ssl.keystore.key": _key_block(server_cert.keystore_pem.read_text()),
              "ssl.keystore.certificate.chain": server_cert.keystore_pem.read_text(),
              "ssl.key.password": "k3y",
              "ssl.truststore.certificates": ca.pem.read_text()}
    assert handshake(server_context(inline, "SSL"), client_context(inline))


def _key_block(text: str) -> str:
    start = text.index("-----BEGIN")
    end = text.index("-----END", start)
    return text[start:text.index("\n", end) + 1]


def test_the_client_side_checks_the_host_name_unless_told_not_to(tmp_path):
    ca = make_ca(tmp_path)
    props = {"ssl.keystore.location": str(ca.issue("b", hosts=("broker1",)).keystore_pem),
             "ssl.keystore.type": "PEM", "ssl.truststore.location": str(ca.pem)}
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_context(props, "SSL"), client_context(props), host="localhost")
    props["ssl.endpoint.identification.algorithm"] = ""
    assert handshake(server_context(props, "SSL"), client_context(props), host="localhost")


def test_required_client_auth_refuses_a_client_without_a_certificate(tmp_path):
    ca = make_ca(tmp_path)
    server = {"ssl.keystore.location": str(ca.issue("b").keystore_pem),
              "ssl.keystore.type": "PEM", "ssl.truststore.location": str(ca.pem),
              "ssl.client.auth": "required"}
    anonymous = {"ssl.truststore.location": str(ca.pem), "ssl.truststore.type": "PEM"}
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        handshake(server_context(server, "SSL"), client_context(anonymous))
    mutual = {**anonymous, "ssl.keystore.type": "PEM",
              "ssl.keystore.location": str(ca.issue("client").keystore_pem)}
    assert handshake(server_context(server, "SSL"), client_context(mutual))


def test_jks_is_refused_with_how_to_convert_it_and_a_missing_keystore_is_named(tmp_path):
    with pytest.raises(TlsConfigError, match="keytool -importkeystore"):
        server_context({"ssl.keystore.location": str(tmp_path / "k.jks")}, "SSL")
    with pytest.raises(TlsConfigError, match="has no keystore"):
        server_context({}, "SSL")


def _tls12_client(ca, openssl_suites: str) -> ssl.SSLContext:
    client = client_context({"ssl.truststore.location": str(ca.pem), "ssl.truststore.type": "PEM"})
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    client.set_ciphers(openssl_suites)
    return client


def test_cipher_suites_with_kafkas_names_admit_only_the_listed_tls12_suites(tmp_path):
    ca = make_ca(tmp_path)
    props = {"ssl.keystore.location": str(ca.issue("b").keystore_pem), "ssl.keystore.type": "PEM",
             "ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"}
    server = server_context(props, "SSL")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        handshake(server, _tls12_client(ca, "ECDHE-ECDSA-AES128-GCM-SHA256"))
    allowed = _tls12_client(ca, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384")
    assert handshake(server, allowed) == "TLSv1.2"
    # no TLS 1.3 suite listed: TLS 1.3 is off, so a client offering it gets TLS 1.2
    modern = client_context({"ssl.truststore.location": str(ca.pem), "ssl.truststore.type": "PEM"})
    assert handshake(server, modern) == "TLSv1.2"
    assert [c["name"] for c in server.get_ciphers() if c["protocol"] != "TLSv1.3"] == [
        "ECDHE-ECDSA-AES256-GCM-SHA384"]


def test_cipher_suites_naming_only_tls13_suites_turn_tls12_off(tmp_path):
    ca = make_ca(tmp_path)
    props = {"ssl.keystore.location": str(ca.issue("b").keystore_pem), "ssl.keystore.type": "PEM",
             "ssl.truststore.location": str(ca.pem), "ssl.truststore.type": "PEM",
             "ssl.cipher.suites": "TLS_AES_256_GCM_SHA384"}
    server = server_context(props, "SSL")
    assert handshake(server, client_context(props)) == "TLSv1.3"
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        handshake(server, _tls12_client(ca, "ECDHE-ECDSA-AES256-GCM-SHA384"))


def test_cipher_suite_names_map_to_openssls_and_unknown_ones_are_refused():
    assert cipher_suites(["TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256",
                          "TLS_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-CHACHA20-POLY1305"]) == (
        ["ECDHE-RSA-AES256-GCM-SHA384", "AES128-SHA", "ECDHE-RSA-CHACHA20-POLY1305"],
        ["TLS_AES_128_GCM_SHA256"])
    with pytest.raises(TlsConfigError, match="unsupported cipher suite TLS_FOO"):
        server_context({"ssl.keystore.key": "x", "ssl.cipher.suites": "TLS_FOO"}, "SSL")


def test_ssl_protocol_tls12_keeps_the_client_side_off_tls13_and_bad_values_are_refused(tmp_path):
    ca = make_ca(tmp_path)
    props = {"ssl.keystore.location": str(ca.issue("b").keystore_pem), "ssl.keystore.type": "PEM",
             "ssl.truststore.location": str(ca.pem), "ssl.truststore.type": "PEM"}
    assert handshake(server_context(props, "SSL"), client_context(props)) == "TLSv1.3"
    old = {**props, "ssl.protocol": "TLSv1.2"}
    assert handshake(server_context(props, "SSL"), client_context(old)) == "TLSv1.2"
    with pytest.raises(TlsConfigError, match="ssl.protocol SSLV3"):
        client_context({**props, "ssl.protocol": "SSLv3"})
    with pytest.raises(TlsConfigError, match="leave no protocol"):
        server_context({**props, "ssl.enabled.protocols": "TLSv1.2",
                        "ssl.cipher.suites": "TLS_AES_256_GCM_SHA384"}, "SSL")
