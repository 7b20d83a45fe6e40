"""SASL/GSSAPI (Kerberos) listeners (issue 45) against a real MIT KDC of the test's own realm:
kcat (Debian's librdkafka, through Cyrus SASL's GSSAPI plugin) produces and consumes over
SASL_PLAINTEXT and SASL_SSL with a keytab; Kafka's Java tools log in with Krb5LoginModule; the
principal is the short name of sasl.kerberos.principal.to.local.rules. A client of the wire
exchange itself (python-gssapi, RFC 4752's client side) shows the bad inputs: a garbage
token, a ticket for another service and an unsupported security layer are each answered
SASL_AUTHENTICATION_FAILED and the broker serves on; a client whose keytab no longer holds its
key gets no ticket and is not let in. Three brokers replicate to each other over a SASL_SSL
inter-broker listener with GSSAPI.

confluent-kafka's wheel is left out: its librdkafka is built without GSSAPI ("No provider for
SASL mechanism GSSAPI: recompile librdkafka with libsasl2"); kcat's Debian librdkafka has it.
Nothing here skips: the KDC, kcat and python-gssapi come from `make system-deps` / `make venv`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import gssapi
import pytest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse

from broker_process import BrokerProcess, free_port
from kafka_tools import CONSOLE_CONSUMER, CONSOLE_PRODUCER, KAFKA_TOPICS, run_kafka_class
from kerberos_support import Kdc
from strata.net.connection import ClientSecurity, Connection
from tls_support import make_ca

pytestmark = pytest.mark.slow

SERVICE = "kafka/localhost"
# etl/<host> principals are User:etl-service; the rest, in the realm, their first component
RULES = "RULE:[2:$1](etl)s/.*/etl-service/, DEFAULT"


def krb5_jaas(keytab, principal: str) -> str:
    return ('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true '
            f'keyTab="{keytab}" principal="{principal}";')


@pytest.fixture(scope="module")
def realm(tmp_path_factory):
    kdc = Kdc.start(tmp_path_factory.mktemp("kdc"))
    try:
        for name in (SERVICE, "kafka/otherhost", "alice", "etl/batch1", "mallory"):
            kdc.add_principal(name)
        kdc.keytabs = {name: kdc.keytab(name) for name in
                       (SERVICE, "kafka/otherhost", "alice", "etl/batch1", "mallory")}
        # mallory's key changes after her keytab was written: it holds a key the KDC no longer has
        kdc.keytab("mallory", kdc.directory / "mallory-new.keytab")
        saved = os.environ.get("KRB5_CONFIG")
        os.environ["KRB5_CONFIG"] = str(kdc.krb5_conf)   # for this process's python-gssapi client
        try:
            yield kdc
        finally:
            if saved is None:
                os.environ.pop("KRB5_CONFIG", None)
            else:
                os.environ["KRB5_CONFIG"] = saved
    finally:
        kdc.stop()


@pytest.fixture(scope="module")
def broker(realm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gssapi")
    ca = make_ca(tmp / "ca")
    cert = ca.issue("broker")
    ports = {"PLAINTEXT": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port()}
    service = realm.principal(SERVICE)
    # clients ask tickets for kafka/<the host they were given>: advertise localhost
    overrides = {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{ports['PLAINTEXT']},"
                                f"SASL_PLAINTEXT://localhost:{ports['SASL_PLAINTEXT']},"
                                f"SASL_SSL://localhost:{ports['SASL_SSL']}",
        "sasl.enabled.mechanisms": "GSSAPI",
        "listener.name.sasl_plaintext.gssapi.sasl.jaas.config":
            krb5_jaas(realm.keytabs[SERVICE], service),
        "listener.name.sasl_ssl.gssapi.sasl.jaas.config":
            krb5_jaas(realm.keytabs[SERVICE], service),
        "sasl.kerberos.principal.to.local.rules": RULES,
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
        "connection.failed.authentication.delay.ms": "100"}
    with BrokerProcess(tmp / "b", overrides, port=ports["PLAINTEXT"],
                       env={"KRB5_CONFIG": str(realm.krb5_conf)}) as b:
        b.ports, b.ca = ports, ca
        yield b


def kcat(realm, broker, user: str, *args: str, protocol: str = "SASL_PLAINTEXT",
         input: bytes | None = None, keytab=None) -> subprocess.CompletedProcess:
    """kcat logged in as ``user`` with its keytab (librdkafka runs kinit into its own cache)."""
    if shutil.which("kcat") is None:
        raise RuntimeError("kcat missing: `make system-deps` installs it from Debian")
    port = broker.ports[protocol]
    config = ["-X", f"security.protocol={protocol}", "-X", "sasl.mechanisms=GSSAPI",
              "-X", "sasl.kerberos.service.name=kafka",
              "-X", f"sasl.kerberos.principal={realm.principal(user)}",
              "-X", f"sasl.kerberos.keytab={keytab or realm.keytabs[user]}"]
    if protocol == "SASL_SSL":
        config += ["-X", f"ssl.ca.location={broker.ca.pem}"]
    env = {**realm.env, "KRB5CCNAME": f"FILE:{realm.directory / user.replace('/', '_')}.ccache"}
    return subprocess.run(["kcat", "-b", f"localhost:{port}", *config, *args], input=input,
                          capture_output=True, timeout=60, env=env)


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_kcat_produces_and_consumes_with_a_keytab(realm, broker, protocol):
    topic = f"krb-{protocol.lower()}"
    lines = b"".join(b"v%d\n" % i for i in range(100))
    produced = kcat(realm, broker, "alice", "-P", "-t", topic, protocol=protocol, input=lines)
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = kcat(realm, broker, "alice", "-C", "-t", topic, "-e", "-q", protocol=protocol)
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.split() == [b"v%d" % i for i in range(100)]
    assert f"authenticationID=alice@{realm.realm}; principal=User:alice" in broker.output()


def test_the_principal_is_the_short_name_of_the_to_local_rules(realm, broker):
    listed = kcat(realm, broker, "etl/batch1", "-L")
    assert listed.returncode == 0, listed.stderr.decode()
    assert f"authenticationID=etl/batch1@{realm.realm}; principal=User:etl-service" \
        in broker.output()


def test_a_client_whose_keytab_holds_an_old_key_is_not_let_in(realm, broker):
    refused = kcat(realm, broker, "mallory", "-L", "-m", "5")
    assert refused.returncode != 0
    # kinit found no key the KDC accepts, so librdkafka has no ticket to offer the broker
    assert b"No Kerberos credentials available" in refused.stderr, refused.stderr.decode()
    assert "principal=User:mallory" not in broker.output()
    assert kcat(realm, broker, "alice", "-L").returncode == 0


def test_kafkas_java_tools_log_in_with_krb5loginmodule(realm, broker, tmp_path):
    config = tmp_path / "client.properties"
    jaas = krb5_jaas(realm.keytabs["alice"], realm.principal("alice"))
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\n"
                      f"sasl.kerberos.service.name=kafka\nsasl.jaas.config={jaas}\n")
    bootstrap = f"localhost:{broker.ports['SASL_PLAINTEXT']}"
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", bootstrap, "--command-config",
                             str(config), "--create", "--topic", "java-krb", "--partitions", "2",
                             jvm_opts=realm.java_opts)
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_kafka_class(CONSOLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic",
                             "java-krb", "--command-config", str(config),
                             input="".join(f"m{i}\n" for i in range(20)), jvm_opts=realm.java_opts)
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_kafka_class(CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic",
                             "java-krb", "--from-beginning", "--max-messages", "20",
                             "--command-config", str(config), jvm_opts=realm.java_opts)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(f"m{i}" for i in range(20))


class Rfc4752Client:
    """The client side of SASL/GSSAPI on python-gssapi, for Connection's SASL login;
    ``layer`` is the security layer it picks from the server's offer."""

    def __init__(self, realm, user: str, target: str = SERVICE, layer: int = 1,
                 first: bytes | None = None):
        creds = gssapi.Credentials(
            name=gssapi.Name(realm.principal(user), gssapi.NameType.kerberos_principal),
            usage="initiate", store={"client_keytab": str(realm.keytabs[user]),
                                     "ccache": f"FILE:{realm.directory / 'raw.ccache'}"})
        self.context = gssapi.SecurityContext(
            name=gssapi.Name(realm.principal(target), gssapi.NameType.kerberos_principal),
            creds=creds, usage="initiate",
            flags=[gssapi.RequirementFlag.mutual_authentication])
        self.layer, self._first, self.offer = layer, first, None

    def first(self) -> bytes:
        return self._first if self._first is not None else self.context.step()

    def next(self, token: bytes) -> bytes | None:
        if not self.context.complete:
            return self.context.step(token) or b""
        if self.offer is None:
            self.offer = self.context.unwrap(token).message
            return self.context.wrap(bytes([self.layer, 0, 0, 0]), False).message
        return None


def login(broker, client: Rfc4752Client) -> Connection:
    return Connection(f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}", security=ClientSecurity(
        sasl_mechanism="GSSAPI", sasl_client=lambda host: client))


METADATA = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False)


def test_the_exchange_offers_no_security_layer_then_serves_requests(realm, broker):
    client = Rfc4752Client(realm, "alice")
    with login(broker, client) as conn:
        assert conn.request(METADATA, MetadataResponse).brokers
    assert client.offer == bytes([1, 0, 0, 0])   # no security layer, no message size


@pytest.mark.parametrize("case", ["garbage token", "ticket for another service",
                                  "integrity layer"])
def test_bad_gssapi_exchanges_are_refused_and_the_broker_serves_on(realm, broker, case):
    client = {"garbage token": lambda: Rfc4752Client(realm, "alice", first=b"\x60\x82garbage"),
              "ticket for another service": lambda: Rfc4752Client(realm, "alice",
                                                                  target="kafka/otherhost"),
              "integrity layer": lambda: Rfc4752Client(realm, "alice", layer=2)}[case]()
    with pytest.raises(ConnectionError, match=r"\(58\): Authentication failed during "
                                              r"authentication due to invalid credentials "
                                              r"with SASL mechanism GSSAPI"):
        login(broker, client)
    with login(broker, Rfc4752Client(realm, "alice")) as conn:
        assert conn.request(METADATA, MetadataResponse).brokers
    assert "Traceback" not in broker.output()


def test_mutated_gssapi_exchanges_get_an_answer_or_a_closed_connection(realm, broker):
    """Real AP-REQ tokens with bit flips, truncations, boundary integers, or a frame larger than
    sasl.server.max.receive.size: each connection is answered or closed, never left hanging,
    nothing is logged as a crash, and a real login still works."""
    import random
    import socket

    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from strata.protocol.client import client_frame, framed
    rng = random.Random(4752)
    handshake = framed(client_frame(SaslHandshakeRequest(mechanism="GSSAPI"), 1, "fuzz"))
    for _ in range(150):
        token = Rfc4752Client(realm, "alice").first()
        pair = bytearray(handshake + framed(client_frame(
            SaslAuthenticateRequest(auth_bytes=token), 2, "fuzz")))
        kind = rng.randrange(4)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(handshake) + 4, len(pair))
                pair[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            pair = pair[:rng.randrange(len(handshake), len(pair))]
        elif kind == 2:
            i = rng.randrange(len(handshake), len(pair) - 4)
            pair[i:i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\0\0\0\0"])
        else:
            pair = bytearray(handshake) + (600_000).to_bytes(4, "big") + b"\x60" * 1024
        with socket.create_connection(("127.0.0.1", broker.ports["SASL_PLAINTEXT"]),
                                      timeout=10) as s:
            s.sendall(bytes(pair))
            s.shutdown(socket.SHUT_WR)
            try:
                while s.recv(65536):   # answers, then the broker closes (or closes at once)
                    pass
            except ConnectionResetError:
                pass
    with login(broker, Rfc4752Client(realm, "alice")) as conn:
        assert conn.request(METADATA, MetadataResponse).brokers
    assert "Traceback" not in broker.output()


def test_brokers_replicate_over_a_gssapi_sasl_ssl_inter_broker_listener(realm, tmp_path):
    """Three brokers log in to each other with Kerberos (sasl.mechanism.inter.broker.protocol
    GSSAPI, tickets for kafka/localhost from the shared keytab) over TLS; every record of an
    RF 3, min.insync.replicas 3 topic is replicated; clients use PLAINTEXT."""
    from test_tls_listeners import replicate_over_an_internal_listener
    service = realm.principal(SERVICE)
    outputs = replicate_over_an_internal_listener(tmp_path, "SASL_SSL", {
        "sasl.mechanism.inter.broker.protocol": "GSSAPI",
        "sasl.kerberos.service.name": "kafka",
        "listener.name.internal.sasl.enabled.mechanisms": "GSSAPI",
        "listener.name.internal.gssapi.sasl.jaas.config":
            krb5_jaas(realm.keytabs[SERVICE], service)})   # brokers inherit KRB5_CONFIG
    assert not any("failed authentication" in output for output in outputs)
    # the leaders log their followers' logins (a broker that leads nothing logs none)
    assert any(f"authenticationID={service}; principal=User:kafka" in output for output in outputs)
