"""SASL/OAUTHBEARER and KIP-368 re-authentication with real clients (issue 45).

OAUTHBEARER: confluent-kafka's ``oauth_cb`` hands librdkafka a JWT the test signs with a key
whose public half is in the broker's JWKS file; it produces and consumes over SASL_PLAINTEXT and
SASL_SSL, and expired, wrongly signed or wrong-audience tokens are refused. librdkafka's own
unsecured JWT (``sasl.oauthbearer.config``) logs in to a listener with Kafka's unsecured
validator, which checks its required scope; Kafka's Java tools log in with an unsecured token and
with a signed token from a file (``sasl.oauthbearer.token.endpoint.url=file:...``).

Re-authentication: with a short ``connections.max.reauth.ms`` librdkafka keeps producing and
consuming across several re-authentications on the same connections, and a raw client that
ignores the session lifetime has its connection closed after it.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import jwt
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from broker_process import BrokerProcess, free_port
from kafka_tools import CONSOLE_CONSUMER, CONSOLE_PRODUCER, KAFKA_TOPICS, require_kafka_dist, \
    run_kafka_class
from strata.protocol.client import client_frame, decode_response, framed
from support.raw_exchange import mutate, send_and_drain
from support.waiting import eventually
from test_tls_listeners import produce_and_consume
from tls_support import make_ca

pytestmark = pytest.mark.slow

ISSUER, AUDIENCE = "https://idp.test", "kafka"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OAUTH_JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
UNSECURED_JAAS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                  'unsecuredValidatorRequiredScope="kafka";')
PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'user_alice="alice-secret";')
REAUTH_MS = 3000


def _jwk(key, kid: str) -> dict:
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) \
        else jwt.algorithms.ECAlgorithm
    return {**json.loads(algorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig"}


def signed(sub: str = "alice", lifetime_s: int = 300, key=RSA_KEY, alg: str = "RS256",
           kid: str = "rsa-1", **claims) -> tuple[str, float]:
    now = int(time.time())
    body = {"sub": sub, "iat": now, "exp": now + lifetime_s, "aud": AUDIENCE, "iss": ISSUER,
            "scope": "kafka", **claims}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid}), float(now + lifetime_s)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oauth")
    ca = make_ca(tmp / "ca")
    cert = ca.issue("broker")
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [_jwk(RSA_KEY, "rsa-1"), _jwk(EC_KEY, "ec-1")]}))
    ports = {"PLAINTEXT": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port(),
             "UNSECURED": free_port(), "REAUTH": free_port()}
    signed_listener = {f"listener.name.{name}.oauthbearer.{key}": value
                       for name in ("sasl_plaintext", "sasl_ssl")
                       for key, value in (("sasl.jaas.config", OAUTH_JAAS),
                                          ("sasl.oauthbearer.jwks.endpoint.url", jwks.as_uri()))}
    overrides = {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "SASL_SSL:SASL_SSL,UNSECURED:SASL_PLAINTEXT,"
                                          "REAUTH:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        **signed_listener,
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
        "org.apache.kafka.sasl.oauthbearer.allowed.urls": jwks.as_uri(),
        "listener.name.unsecured.oauthbearer.sasl.jaas.config": UNSECURED_JAAS,
        "listener.name.reauth.sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
        "listener.name.reauth.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
        "listener.name.reauth.oauthbearer.sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
        "listener.name.reauth.connections.max.reauth.ms": str(REAUTH_MS),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
        "connection.failed.authentication.delay.ms": "100"}
    with BrokerProcess(tmp / "b", overrides, port=ports["PLAINTEXT"]) as b:
        b.ports, b.ca, b.jwks = ports, ca, jwks
        yield b


def oauth(broker, listener: str, token_fn=signed, **extra) -> dict:
    protocol = "SASL_SSL" if listener == "SASL_SSL" else "SASL_PLAINTEXT"
    config = {"bootstrap.servers": f"127.0.0.1:{broker.ports[listener]}",
              "security.protocol": protocol, "sasl.mechanism": "OAUTHBEARER",
              "oauth_cb": lambda _config: token_fn(), **extra}
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = str(broker.ca.pem)
    return config


def _topics(config: dict, timeout: float = 10):
    admin = AdminClient(config)
    admin.poll(1)      # serves oauth_cb
    return admin.list_topics(timeout=timeout)


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_signed_tokens_from_oauth_cb_produce_and_consume(broker, listener):
    topic = f"oauth-{listener.lower()}"
    config = oauth(broker, listener)
    assert produce_and_consume(config, topic, 100) == [b"v%d" % i for i in range(100)]
    es256 = oauth(broker, listener, lambda: signed("bob", key=EC_KEY, alg="ES256", kid="ec-1"))
    assert _topics(es256).topics[topic]


@pytest.mark.parametrize("token, why", [
    (lambda: signed(lifetime_s=-120), "Signature has expired"),
    (lambda: signed(key=STRANGER), "Signature verification failed"),
    (lambda: signed(aud="someone-else"), "Audience doesn't match"),
    (lambda: signed(kid="unknown"), "no single key"),
])
def test_tokens_the_broker_refuses_fail_and_it_serves_on(broker, token, why):
    if why == "Signature has expired":   # librdkafka refuses to send an expired token: raw
        assert _raw_oauth_login(broker.ports["SASL_PLAINTEXT"], token()[0]) is not None
    else:
        with pytest.raises(KafkaException):
            _topics(oauth(broker, "SASL_PLAINTEXT", token), timeout=3)
    eventually(lambda: why in broker.output(), f"the broker logging why ({why})")
    assert _topics(oauth(broker, "SASL_PLAINTEXT")).brokers


def _raw_frame(body, correlation_id: int) -> bytes:
    return framed(client_frame(body, correlation_id, "raw"))


def _read(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data
    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def _raw_oauth_login(port: int, token: str) -> str | None:
    """Log in with ``token`` over a raw socket; the failure's message, or None on success."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_raw_frame(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1))
        _read(s)
        s.sendall(_raw_frame(SaslAuthenticateRequest(
            auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()), 2))
        first = decode_response(SaslAuthenticateResponse, _read(s), 2)
        if first.error_code == 0 and not first.auth_bytes:
            return None
        assert json.loads(first.auth_bytes) == {"status": "invalid_token"}
        s.sendall(_raw_frame(SaslAuthenticateRequest(auth_bytes=b"\x01"), 3))
        second = decode_response(SaslAuthenticateResponse, _read(s), 3)
        assert second.error_code == 58     # SASL_AUTHENTICATION_FAILED
        return second.error_message


def test_librdkafkas_unsecured_jwt_logs_in_to_the_unsecured_validator_with_its_scope(broker):
    config = {"bootstrap.servers": f"127.0.0.1:{broker.ports['UNSECURED']}",
              "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
              "enable.sasl.oauthbearer.unsecure.jwt": True,
              "sasl.oauthbearer.config": "principal=carol scope=kafka lifeSeconds=600"}
    assert produce_and_consume(config, "oauth-unsecured", 20) == [b"v%d" % i for i in range(20)]
    without_scope = {**config, "sasl.oauthbearer.config": "principal=carol scope=other"}
    with pytest.raises(KafkaException):
        AdminClient(without_scope).list_topics(timeout=3)
    eventually(lambda: "missing a required scope" in broker.output(), "the scope refusal logged")
    # a signed token is not an unsecured one
    assert _raw_oauth_login(broker.ports["UNSECURED"], signed()[0]) is not None


def test_kafkas_java_tools_log_in_with_an_unsecured_and_a_file_token(broker, tmp_path):
    require_kafka_dist()
    unsecured = tmp_path / "unsecured.properties"
    unsecured.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
        'required unsecuredLoginStringClaim_sub="dave" unsecuredLoginListClaim_scope=",kafka";\n')
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server",
                             f"127.0.0.1:{broker.ports['UNSECURED']}", "--command-config",
                             str(unsecured), "--create", "--topic", "java-oauth", "--partitions", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    token_file = tmp_path / "token.jwt"
    token_file.write_text(signed("erin", lifetime_s=600)[0])
    from_file = tmp_path / "file.properties"
    from_file.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer."
        "OAuthBearerLoginCallbackHandler\n"
        f"sasl.oauthbearer.token.endpoint.url={token_file.as_uri()}\n"
        f"sasl.jaas.config={OAUTH_JAAS}\n")
    result = run_kafka_class(
        KAFKA_TOPICS, "--bootstrap-server", f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
        "--command-config", str(from_file), "--list",
        jvm_opts=[f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={token_file.as_uri()}"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java-oauth" in result.stdout
    # the console producer and consumer, with the signed token from the file
    bootstrap, opts = f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", [
        f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={token_file.as_uri()}"]
    result = run_kafka_class(CONSOLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic",
                             "java-oauth", "--command-config", str(from_file),
                             input="".join(f"m{i}\n" for i in range(10)), jvm_opts=opts)
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_kafka_class(CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic",
                             "java-oauth", "--from-beginning", "--max-messages", "10",
                             "--command-config", str(from_file), jvm_opts=opts)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(f"m{i}" for i in range(10))


def _reauthentications(broker) -> int:
    return broker.output().count("re-authenticated User:alice on REAUTH")


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
def test_librdkafka_re_authenticates_on_the_same_connections_while_producing_and_consuming(
        broker, mechanism):
    from confluent_kafka import Consumer
    errors, stats = [], []
    base = {"bootstrap.servers": f"127.0.0.1:{broker.ports['REAUTH']}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "error_cb": errors.append, "statistics.interval.ms": 500,
            "stats_cb": lambda raw: stats.append(json.loads(raw))}
    if mechanism == "PLAIN":
        base.update({"sasl.username": "alice", "sasl.password": "alice-secret"})
    else:
        base["oauth_cb"] = lambda _config: signed(lifetime_s=600)
    topic = f"reauth-{mechanism.lower()}"
    producer = Producer({**base, "acks": "all"})
    consumer = Consumer({**base, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    before = _reauthentications(broker)
    sent, delivered, got = 0, [], []

    def traffic() -> bool:
        nonlocal sent
        producer.produce(topic, value=b"v%d" % sent,
                         on_delivery=lambda err, msg: delivered.append(err))
        sent += 1
        producer.poll(0)
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            got.append(message.value())
        return _reauthentications(broker) - before >= 6   # each client, several times
    eventually(traffic, "several re-authentications while producing and consuming",
               timeout=60, interval=0.05)
    assert producer.flush(30) == 0
    eventually(lambda: (m := consumer.poll(0.5)) is None or m.error() or got.append(m.value())
               or len(got) >= sent, "every record consumed", timeout=30)
    consumer.close()
    assert delivered == [None] * sent
    assert got == [b"v%d" % i for i in range(sent)]
    assert errors == []
    # each of the producer's connections opened once: re-authentication, never a reconnect
    last = next(s for s in reversed(stats) if s["type"] == "producer")
    known = {name: (b["connects"], b["disconnects"]) for name, b in last["brokers"].items()
             if b["nodeid"] >= 0}
    assert known and set(known.values()) == {(1, 0)}, known


def test_a_client_that_ignores_the_session_lifetime_is_closed_after_it(broker):
    with socket.create_connection(("127.0.0.1", broker.ports["REAUTH"]), timeout=10) as s:
        s.sendall(_raw_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
        _read(s)
        s.sendall(_raw_frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"), 2))
        done = decode_response(SaslAuthenticateResponse, _read(s), 2)
        assert done.error_code == 0 and done.session_lifetime.total_seconds() * 1000 == REAUTH_MS
        answered = 0

        def closed() -> bool:
            nonlocal answered
            try:
                s.sendall(_raw_frame(ApiVersionsRequest(), 3 + answered))
                _read(s)
                answered += 1
                return False
            except (ConnectionError, OSError):
                return True
        eventually(closed, "the connection closed after its session", timeout=REAUTH_MS / 1000 + 20,
                   interval=0.2)
        assert answered >= 1        # served while the session lasted
    assert "the SASL session expired (API_VERSIONS" in broker.output()


def test_mutated_oauthbearer_exchanges_get_an_answer_or_a_closed_connection(broker):
    """Bit flips, truncations and boundary integers in OAUTHBEARER's handshake, token and
    ``\\x01`` answer, on the signed and the unsecured listener: each connection is answered or
    closed (never left hanging), and a real login still works after them."""
    import random
    rng = random.Random(368)
    token = signed()[0]
    exchange = (_raw_frame(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1)
                + _raw_frame(SaslAuthenticateRequest(
                    auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()), 2)
                + _raw_frame(SaslAuthenticateRequest(auth_bytes=b"\x01"), 3))
    for n in range(200):
        port = broker.ports["SASL_PLAINTEXT" if n % 2 else "UNSECURED"]
        send_and_drain(port, mutate(rng, exchange))
    assert _raw_oauth_login(broker.ports["SASL_PLAINTEXT"], token) is None
    assert "Traceback" not in broker.output()
