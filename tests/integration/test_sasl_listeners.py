"""SASL listeners (issue 45, part 1) with real clients: confluent-kafka authenticates with PLAIN
over SASL_PLAINTEXT and SASL_SSL and produces and consumes; a wrong password is refused with
SASL_AUTHENTICATION_FAILED and the broker serves on; a request sent before authenticating
closes that one connection; Kafka's Java tools authenticate with a client config file; old
clients' raw token frames after SaslHandshake v0 log in; kafka-python and aiokafka over SASL_SSL
with SCRAM, and kcat over SASL_SSL with PLAIN and SCRAM, produce and consume."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from kio.schema.metadata.v12.request import MetadataRequest

from broker_process import BrokerProcess, free_port
from kafka_tools import KAFKA_CONFIGS, KAFKA_TOPICS, require_kafka_dist, run_kafka_class
from strata.net.connection import Connection
from support.raw_exchange import mutate, send_and_drain
from test_tls_listeners import produce_and_consume
from tls_support import make_ca

pytestmark = pytest.mark.slow

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def plain(user: str, password: str, protocol: str = "SASL_PLAINTEXT",
          mechanism: str = "PLAIN") -> dict:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sasl")
    ca = make_ca(tmp / "ca")
    cert = ca.issue("broker")
    ports = {"PLAINTEXT": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port()}
    overrides = {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
        "connection.failed.authentication.delay.ms": "300"}
    with BrokerProcess(tmp / "b", overrides, port=ports["PLAINTEXT"]) as b:
        b.ports, b.ca = ports, ca
        yield b


def test_plain_over_sasl_plaintext_and_sasl_ssl(broker):
    over_sasl = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
                 **plain("alice", "alice-secret")}
    assert produce_and_consume(over_sasl, "sasl-plain", 100) == [b"v%d" % i for i in range(100)]
    brokers = AdminClient(over_sasl).list_topics(timeout=10).brokers
    assert [b.port for b in brokers.values()] == [broker.ports["SASL_PLAINTEXT"]]
    over_ssl = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_SSL']}",
                "ssl.ca.location": str(broker.ca.pem), **plain("admin", "admin-secret", "SASL_SSL")}
    assert produce_and_consume(over_ssl, "sasl-ssl", 100) == [b"v%d" % i for i in range(100)]


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("mallory", "alice-secret")])
def test_a_wrong_password_or_unknown_user_is_refused_and_the_broker_serves_on(broker, user,
                                                                            password):
    wrong = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
             **plain(user, password)}
    with pytest.raises(KafkaException):
        AdminClient(wrong).list_topics(timeout=3)
    # librdkafka logs the broker's SASL_AUTHENTICATION_FAILED; the broker logs why, alike for both
    assert "(PLAIN on SASL_PLAINTEXT): Authentication failed: Invalid username or password" \
        in broker.output()
    right = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
             **plain("alice", "alice-secret")}
    assert AdminClient(right).list_topics(timeout=10).brokers


def test_a_request_before_authenticating_closes_that_connection(broker):
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    from kio.schema.metadata.v12.response import MetadataResponse
    with Connection(f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}") as conn:
        with pytest.raises((ConnectionError, OSError)):
            conn.request(request, MetadataResponse)
    with Connection(broker.bootstrap) as conn:    # the PLAINTEXT listener needs nothing
        assert conn.request(request, MetadataResponse).brokers


def test_kafkas_java_tools_authenticate_with_a_client_config(broker, tmp_path):
    require_kafka_dist()
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                      'required username="alice" password="alice-secret";\n')
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server",
                             f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
                             "--command-config", str(config), "--create", "--topic", "java-sasl",
                             "--partitions", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server",
                             f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
                             "--command-config", str(config), "--list")
    assert "java-sasl" in result.stdout


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_credentials_made_with_kafka_configs_log_clients_in(broker, mechanism):
    """The credential is created through the PLAINTEXT listener with Kafka's tool, then
    librdkafka logs in with it over SASL_PLAINTEXT and SASL_SSL; a wrong password is refused."""
    require_kafka_dist()
    user = f"bob-{mechanism[-3:]}"
    result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap, "--alter",
                             "--add-config", f"{mechanism}=[iterations=8192,password=bob-secret]",
                             "--entity-type", "users", "--entity-name", user)
    assert result.returncode == 0, result.stdout + result.stderr
    over_sasl = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
                 **plain(user, "bob-secret", mechanism=mechanism)}
    topic = f"scram-{mechanism[-3:]}"
    assert produce_and_consume(over_sasl, topic, 50) == [b"v%d" % i for i in range(50)]
    over_ssl = {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_SSL']}",
                "ssl.ca.location": str(broker.ca.pem),
                **plain(user, "bob-secret", "SASL_SSL", mechanism)}
    assert AdminClient(over_ssl).list_topics(timeout=10).topics[topic]
    wrong = {**over_sasl, "sasl.password": "not-it"}
    with pytest.raises(KafkaException):
        AdminClient(wrong).list_topics(timeout=3)


def _frame(body, correlation_id: int = 1) -> bytes:
    from strata.protocol.client import client_frame, framed
    return framed(client_frame(body, correlation_id, "fuzz"))


def _exchange_frames() -> list[tuple[bytes, bytes]]:
    """(handshake, first token) frames: a PLAIN login's and a SCRAM client-first's with
    SaslHandshake v1 and SaslAuthenticate, and after SaslHandshake v0 as raw token frames."""
    import struct
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
    plain, scram = b"\0alice\0alice-secret", b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"
    return [(_frame(SaslHandshakeRequest(mechanism="PLAIN")),
             _frame(SaslAuthenticateRequest(auth_bytes=plain), 2)),
            (_frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512")),
             _frame(SaslAuthenticateRequest(auth_bytes=scram), 2)),
            (_frame(HandshakeV0(mechanism="PLAIN")), struct.pack(">i", len(plain)) + plain),
            (_frame(HandshakeV0(mechanism="SCRAM-SHA-512")),
             struct.pack(">i", len(scram)) + scram)]


def test_mutated_sasl_exchanges_get_an_answer_or_a_closed_connection_and_logins_go_on(broker):
    """Bit flips, truncations, boundary integers and oversized frames in the SASL exchange (v1,
    and v0's raw token frames): each connection is answered or closed (never left hanging), and
    a real login still works."""
    import random
    from confluent_kafka.admin import AdminClient as Admin
    rng = random.Random(45)
    port = broker.ports["SASL_PLAINTEXT"]
    frames = _exchange_frames()
    sent = 0
    for _ in range(300):
        handshake, token = rng.choice(frames)
        if rng.randrange(4):
            pair = mutate(rng, handshake + token)
        else:   # a token larger than sasl.server.max.receive.size
            pair = handshake + (600_000).to_bytes(4, "big") + b"\0" * 1024
        send_and_drain(port, pair, timeout=5)
        sent += 1
    assert sent == 300
    right = {"bootstrap.servers": f"127.0.0.1:{port}", **plain("alice", "alice-secret")}
    assert Admin(right).list_topics(timeout=10).brokers
    assert "Traceback" not in broker.output()


def _raw_token_exchange(conn: Connection, mechanism: str, tokens) -> list[bytes]:
    """SaslHandshake v0, then ``tokens`` (a generator fed each server token) as raw frames
    without a request header, as clients before Kafka 1.0 send them; the server's tokens."""
    import struct
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest
    from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse
    from strata.net.connection import recv_exact
    assert conn.request(SaslHandshakeRequest(mechanism=mechanism),
                        SaslHandshakeResponse).error_code == 0
    answers, token = [], next(tokens)
    while token is not None:
        conn.sock.sendall(struct.pack(">i", len(token)) + token)
        (size,) = struct.unpack(">i", recv_exact(conn.sock, 4))
        answers.append(bytes(recv_exact(conn.sock, size)))
        token = tokens.send(answers[-1])
    return answers


def test_old_clients_raw_sasl_frames_after_handshake_v0_log_in_with_plain_and_scram(broker):
    """After SaslHandshake v0 the tokens are raw frames (Kafka's pre-SaslAuthenticate framing):
    PLAIN and SCRAM-SHA-256 log in that way, then Metadata is served on the same connection;
    garbage raw tokens close only their connection."""
    import scramp
    from confluent_kafka.admin import UserScramCredentialUpsertion, ScramCredentialInfo, \
        ScramMechanism
    from kio.schema.metadata.v12.response import MetadataResponse
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    upsert = UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-secret")
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                               include_topic_authorized_operations=False)
    address = f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}"

    def plain_tokens():
        yield b"\0alice\0alice-secret"
        yield None

    def scram_tokens():
        client = scramp.ScramClient(["SCRAM-SHA-256"], "carol", "carol-secret")
        client.set_server_first((yield client.get_client_first().encode()).decode())
        client.set_server_final((yield client.get_client_final().encode()).decode())
        yield None

    with Connection(address) as bystander:
        for mechanism, tokens in [("PLAIN", plain_tokens()), ("SCRAM-SHA-256", scram_tokens())]:
            with Connection(address) as conn:
                _raw_token_exchange(conn, mechanism, tokens)
                assert conn.request(metadata, MetadataResponse).brokers
        for mechanism, garbage in [("PLAIN", b"\x07" * 64), ("SCRAM-SHA-256", b"n,,\xff\xfe")]:
            with Connection(address) as conn:
                def garbage_tokens(token=garbage):
                    yield token
                    yield None
                with pytest.raises((ConnectionError, OSError)):
                    _raw_token_exchange(conn, mechanism, garbage_tokens())
        _raw_token_exchange(bystander, "PLAIN", plain_tokens())   # opened before, still served
        assert bystander.request(metadata, MetadataResponse).brokers
    assert "Traceback" not in broker.output()


def _scram_user(broker, user: str, password: str, mechanism: str) -> None:
    """A SCRAM credential made through the PLAINTEXT listener (AlterUserScramCredentials)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, \
        UserScramCredentialUpsertion
    kind = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}[mechanism]
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(kind, 4096), password.encode())
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_produces_and_consumes_over_sasl_ssl_with_scram(broker, mechanism):
    from kafka import KafkaConsumer, KafkaProducer
    user = f"kp-{mechanism[-3:]}"
    _scram_user(broker, user, "kp-secret", mechanism)
    security = dict(bootstrap_servers=f"localhost:{broker.ports['SASL_SSL']}",
                    security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                    sasl_plain_username=user, sasl_plain_password="kp-secret",
                    ssl_cafile=str(broker.ca.pem))
    topic = f"kafka-python-{mechanism[-3:]}"
    producer = KafkaProducer(acks="all", **security)
    for i in range(30):
        producer.send(topic, b"v%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                             consumer_timeout_ms=20_000, **security)
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == 30:
            break
    consumer.close()
    assert got == [b"v%d" % i for i in range(30)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_aiokafka_produces_and_consumes_over_sasl_ssl_with_scram(broker, mechanism):
    import asyncio
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    user = f"aio-{mechanism[-3:]}"
    _scram_user(broker, user, "aio-secret", mechanism)
    topic = f"aiokafka-{mechanism[-3:]}"

    async def main() -> list[bytes]:
        security = dict(bootstrap_servers=f"localhost:{broker.ports['SASL_SSL']}",
                        security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                        sasl_plain_username=user, sasl_plain_password="aio-secret",
                        ssl_context=create_ssl_context(cafile=str(broker.ca.pem)))
        producer = AIOKafkaProducer(acks="all", **security)
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait(topic, b"v%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                                    **security)
        await consumer.start()
        got = []
        try:
            async with asyncio.timeout(30):
                async for message in consumer:
                    got.append(message.value)
                    if len(got) == 30:
                        break
        finally:
            await consumer.stop()
        return got
    assert asyncio.run(main()) == [b"v%d" % i for i in range(30)]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_produces_and_consumes_over_sasl_ssl(broker, mechanism):
    from test_clients_basic import kcat
    user, password = ("alice", "alice-secret") if mechanism == "PLAIN" else \
        (f"kcat-{mechanism[-3:]}", "kcat-secret")
    if mechanism != "PLAIN":
        _scram_user(broker, user, password, mechanism)
    security = ["-b", f"localhost:{broker.ports['SASL_SSL']}", "-X", "security.protocol=SASL_SSL",
                "-X", f"sasl.mechanisms={mechanism}", "-X", f"sasl.username={user}",
                "-X", f"sasl.password={password}", "-X", f"ssl.ca.location={broker.ca.pem}"]
    topic = f"kcat-{mechanism.lower()}"
    kcat(*security, "-P", "-t", topic, input=b"a\nb\nc\n")
    consumed = kcat(*security, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%s\n")
    assert consumed.stdout.split() == [b"a", b"b", b"c"], consumed.stderr
    import subprocess
    with pytest.raises(subprocess.CalledProcessError):   # a wrong password gets no metadata
        kcat(*security[:-4], "-X", "sasl.password=wrong", *security[-2:], "-L", "-m", "3")
