"""Listeners and TLS (issue 45, part 1) with real clients: a broker with a PLAINTEXT and an SSL
listener answers each client with the endpoints of the listener it came in on; confluent-kafka
produces and consumes over TLS (PEM and PKCS12 keystores, and with a client certificate when
the listener requires one, as kcat does); ssl.cipher.suites admits listed suites only;
kafka-configs reloads a listener's keystore without dropping connections; a three-broker
cluster whose brokers replicate and coordinate over their TLS inter-broker listener."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from zk_server import zookeeper_available

from broker_process import BrokerProcess, free_port
from cluster_clients import wait_for
from cluster_process import StrataCluster
from tls_support import PASSWORD, make_ca

pytestmark = pytest.mark.slow


def ssl_client(ca, extra: dict | None = None) -> dict:
    return {"security.protocol": "SSL", "ssl.ca.location": str(ca.pem), **(extra or {})}


def produce_and_consume(config: dict, topic: str, n: int = 200) -> list[bytes]:
    producer = Producer({**config, "acks": "all", "enable.idempotence": True})
    acked: list[bytes] = []
    for i in range(n):
        producer.produce(topic, value=b"v%d" % i, on_delivery=lambda err, msg: err is None and
                         acked.append(msg.value()))
    producer.flush(30)
    assert len(acked) == n
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []

    def read_more() -> bool:   # all that has arrived: a check reads more than one record
        got.extend(m.value() for m in consumer.consume(n, 0.5) if not m.error())
        return len(got) >= n
    wait_for("every record read back", read_more, timeout=60)
    consumer.close()
    return got


def test_one_broker_serves_plaintext_and_tls_listeners_with_their_own_endpoints(tmp_path):
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue("broker", key_password="k3y")
    plain, tls = free_port(), free_port()
    overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
                 "ssl.key.password": "k3y"}
    with BrokerProcess(tmp_path / "b", overrides, port=plain) as broker:
        over_tls = ssl_client(ca, {"bootstrap.servers": f"localhost:{tls}"})
        brokers = AdminClient(over_tls).list_topics(timeout=10).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", tls)]
        plain_brokers = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(
            timeout=10).brokers
        assert [b.port for b in plain_brokers.values()] == [plain]
        got = produce_and_consume({**over_tls, "ssl.endpoint.identification.algorithm": "none"},
                                  "over-tls")
        assert got == [b"v%d" % i for i in range(200)]
        # a plaintext client on the TLS port gets nowhere, and the broker serves on
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": f"127.0.0.1:{tls}"}).list_topics(timeout=3)
        assert AdminClient(over_tls).list_topics(timeout=10).brokers
    assert "Traceback" not in broker.output()


def test_a_listener_requiring_client_certificates_with_a_pkcs12_keystore(tmp_path):
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue("broker")
    client = ca.issue("client")
    port = free_port()
    overrides = {"listeners": f"SSL://127.0.0.1:{port}", "security.inter.broker.protocol": "SSL",
                 "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(cert.keystore_p12),
                 "ssl.keystore.password": PASSWORD, "ssl.truststore.type": "PEM",
                 "ssl.truststore.location": str(ca.pem), "ssl.client.auth": "required"}
    with BrokerProcess(tmp_path / "b", overrides, port=port):
        anonymous = ssl_client(ca, {"bootstrap.servers": f"127.0.0.1:{port}",
                                    "socket.timeout.ms": 2000})
        with pytest.raises(KafkaException):
            AdminClient(anonymous).list_topics(timeout=3)
        mutual = ssl_client(ca, {"bootstrap.servers": f"127.0.0.1:{port}",
                                 "ssl.certificate.location": str(client.certificate_pem),
                                 "ssl.key.location": str(client.keystore_pem)})
        assert produce_and_consume(mutual, "mtls", 50) == [b"v%d" % i for i in range(50)]
        # kcat (Debian's, its own librdkafka) over mTLS, and refused without a certificate
        import subprocess
        from test_clients_basic import kcat
        tls = ["-b", f"127.0.0.1:{port}", "-X", "security.protocol=SSL",
               "-X", f"ssl.ca.location={ca.pem}"]
        certificate = ["-X", f"ssl.certificate.location={client.certificate_pem}",
                       "-X", f"ssl.key.location={client.keystore_pem}"]
        kcat(*tls, *certificate, "-P", "-t", "mtls-kcat", input=b"x\ny\n")
        consumed = kcat(*tls, *certificate, "-C", "-t", "mtls-kcat", "-e", "-f", "%s\n")
        assert consumed.stdout.split() == [b"x", b"y"]
        with pytest.raises(subprocess.CalledProcessError):
            kcat(*tls, "-L", "-m", "3")


def test_a_listeners_cipher_suites_admit_a_client_offering_a_listed_suite_only(tmp_path):
    """ssl.cipher.suites with Kafka's names on the listener: librdkafka offering only a suite left
    out fails the handshake, one offering a listed suite produces and consumes."""
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue("broker")
    plain, tls = free_port(), free_port()
    overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
                 "listener.name.ssl.ssl.cipher.suites":
                     "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}
    with BrokerProcess(tmp_path / "b", overrides, port=plain) as broker:
        excluded = ssl_client(ca, {"bootstrap.servers": f"127.0.0.1:{tls}",
                                   "ssl.cipher.suites": "ECDHE-ECDSA-AES128-GCM-SHA256"})
        with pytest.raises(KafkaException):
            AdminClient(excluded).list_topics(timeout=3)
        allowed = ssl_client(ca, {"bootstrap.servers": f"127.0.0.1:{tls}",
                                  "ssl.cipher.suites": "ECDHE-ECDSA-AES256-GCM-SHA384"})
        assert produce_and_consume(allowed, "listed-suite", 20) == [b"v%d" % i for i in range(20)]
    assert "Traceback" not in broker.output()


_ok, _why = zookeeper_available()


def replicate_over_an_internal_listener(tmp_path, protocol: str, extra: dict) -> list:
    """Three brokers: clients on PLAINTEXT, brokers among themselves on an INTERNAL listener of
    ``protocol``; an RF 3 topic with min.insync.replicas 3 (every record replicated) produced
    and consumed. The brokers' outputs."""
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue("broker")
    overrides = {"listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,INTERNAL:{protocol}",
                 "inter.broker.listener.name": "INTERNAL",
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.keystore_pem),
                 "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca.pem),
                 "offsets.topic.replication.factor": "3", "offsets.topic.num.partitions": "2",
                 "remote.log.storage.system.enable": "false", "log.remote.storage.enable": "false",
                 **extra}
    cluster = StrataCluster(tmp_path, brokers=3, overrides=overrides)
    for broker in cluster.brokers:
        both = f"PLAINTEXT://127.0.0.1:{broker.port},INTERNAL://localhost:{free_port()}"
        broker.process.overrides.update({"listeners": both, "advertised.listeners": both})
    with cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("replicated", 2, 3,
                                      config={"min.insync.replicas": "3"})])["replicated"].result(30)
        wait_for("full ISRs", lambda: all(
            len(p.isrs) == 3 for p in admin.list_topics("replicated", timeout=5)
            .topics["replicated"].partitions.values()))
        got = produce_and_consume({"bootstrap.servers": cluster.bootstrap}, "replicated", 300)
        assert sorted(got) == sorted(b"v%d" % i for i in range(300))
        return [broker.output() for broker in cluster.brokers]


@pytest.mark.skipif(not _ok, reason=_why)
def test_brokers_replicate_and_coordinate_over_their_tls_inter_broker_listener(tmp_path):
    for output in replicate_over_an_internal_listener(tmp_path, "SSL", {}):
        assert "SSLError" not in output and "(INTERNAL)" in output


@pytest.mark.skipif(not _ok, reason=_why)
def test_brokers_replicate_over_a_sasl_ssl_inter_broker_listener(tmp_path):
    """Brokers log in to each other with PLAIN over TLS; clients use PLAINTEXT."""
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="broker" password="broker-secret" user_broker="broker-secret";')
    outputs = replicate_over_an_internal_listener(tmp_path, "SASL_SSL", {
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config": jaas})
    for output in outputs:
        assert "failed authentication" not in output


def _peer_serial(address: str, ca) -> tuple:
    """A new TLS connection's view of the listener's certificate (serial) and the connection."""
    import ssl
    from cryptography import x509
    from strata.net.connection import ClientSecurity, Connection
    context = ssl.create_default_context(cafile=str(ca.pem))
    conn = Connection(address, security=ClientSecurity(ssl_context=context))
    return x509.load_der_x509_certificate(conn.sock.getpeercert(binary_form=True)).serial_number, conn


def test_kafka_configs_reloads_a_listeners_keystore_without_dropping_connections(tmp_path):
    """kafka-configs sets listener.name.external.ssl.keystore.location on the broker: new TLS
    connections get the renewed certificate, one made before keeps working, a keystore of
    another subject DN is refused, a file rotated in place is reloaded when its path is given
    again, and the change survives a restart."""
    import shutil
    from cryptography import x509
    from kio.schema.metadata.v12.request import MetadataRequest
    from kio.schema.metadata.v12.response import MetadataResponse
    from kafka_tools import KAFKA_CONFIGS, require_kafka_dist, run_kafka_class
    from support.waiting import eventually
    require_kafka_dist()
    ca = make_ca(tmp_path / "ca")
    stores = {}
    for label, name in [("old", "broker"), ("renewed", "broker"), ("other", "intruder")]:
        stores[label] = tmp_path / f"{label}.pem"
        shutil.copy(ca.issue(name).keystore_pem, stores[label])
    serial = {k: x509.load_pem_x509_certificate(p.read_bytes()).serial_number
              for k, p in stores.items()}
    plain, tls = free_port(), free_port()
    overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},EXTERNAL://127.0.0.1:{tls}",
                 "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:SSL",
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(stores["old"])}
    metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                               include_topic_authorized_operations=False)
    address = f"localhost:{tls}"

    def alter(path):
        return run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", f"127.0.0.1:{plain}",
                               "--entity-type", "brokers", "--entity-name", "1", "--alter",
                               "--add-config",
                               f"listener.name.external.ssl.keystore.location={path}")
    broker = BrokerProcess(tmp_path / "b", overrides, port=plain)
    with broker:
        first, before = _peer_serial(address, ca)
        assert first == serial["old"]
        result = alter(stores["renewed"])
        assert result.returncode == 0, result.stdout + result.stderr

        def serves(label: str) -> bool:
            seen, conn = _peer_serial(address, ca)
            conn.close()
            return seen == serial[label]
        eventually(lambda: serves("renewed"), "new connections get the renewed certificate", 30)
        described = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", f"127.0.0.1:{plain}",
                                    "--entity-type", "brokers", "--entity-name", "1",
                                    "--describe")
        assert f"listener.name.external.ssl.keystore.location={stores['renewed']}" \
            in described.stdout, described.stdout + described.stderr
        assert before.request(metadata, MetadataResponse).brokers   # made before: still served
        before.close()
        refused = alter(stores["other"])
        assert refused.returncode != 0
        assert "DistinguishedName does not match" in refused.stdout + refused.stderr
        assert serves("renewed")
        # rotated in place: the same path given again reloads the changed file (Kafka's way),
        # after the same DN check against the certificate served
        shutil.copy(stores["other"], stores["renewed"])
        refused = alter(stores["renewed"])
        assert "DistinguishedName does not match" in refused.stdout + refused.stderr
        rotated = ca.issue("broker").keystore_pem
        shutil.copy(rotated, stores["renewed"])
        serial["rotated"] = x509.load_pem_x509_certificate(rotated.read_bytes()).serial_number
        result = alter(stores["renewed"])
        assert result.returncode == 0, result.stdout + result.stderr
        eventually(lambda: serves("rotated"), "new connections get the certificate rotated in "
                   "place", 30)
    with broker:   # restarted: the stored change is applied at startup
        seen, conn = _peer_serial(address, ca)
        assert seen == serial["rotated"] and conn.request(metadata, MetadataResponse).brokers
        conn.close()
    assert "Traceback" not in broker.output()


@pytest.mark.skipif(not _ok, reason=_why)
def test_a_keystore_reload_in_a_zookeeper_cluster_applies_and_survives_a_restart(tmp_path):
    """The change goes to ZooKeeper's /config/brokers/1; the broker reloads when its view shows
    it, and starts with it again."""
    import shutil
    from cryptography import x509
    from kafka_tools import KAFKA_CONFIGS, require_kafka_dist, run_kafka_class
    from support.waiting import eventually
    require_kafka_dist()
    ca = make_ca(tmp_path / "ca")
    stores = {}
    for label in ("old", "renewed"):
        stores[label] = tmp_path / f"{label}.pem"
        shutil.copy(ca.issue("broker").keystore_pem, stores[label])
    serial = {k: x509.load_pem_x509_certificate(p.read_bytes()).serial_number
              for k, p in stores.items()}
    cluster = StrataCluster(tmp_path / "cluster", brokers=1, overrides={
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:SSL",
        "inter.broker.listener.name": "PLAINTEXT", "offsets.topic.replication.factor": "1",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(stores["old"]),
        "remote.log.storage.system.enable": "false", "log.remote.storage.enable": "false"})
    broker = cluster.brokers[0]
    tls = free_port()
    both = f"PLAINTEXT://127.0.0.1:{broker.port},EXTERNAL://127.0.0.1:{tls}"
    broker.process.overrides.update({"listeners": both, "advertised.listeners": both})
    address = f"localhost:{tls}"

    def seen() -> int:
        found, conn = _peer_serial(address, ca)
        conn.close()
        return found
    with cluster:
        assert seen() == serial["old"]
        result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap,
                                 "--entity-type", "brokers", "--entity-name", "1", "--alter",
                                 "--add-config",
                                 f"listener.name.external.ssl.keystore.location={stores['renewed']}")
        assert result.returncode == 0, result.stdout + result.stderr
        eventually(lambda: seen() == serial["renewed"], "the renewed certificate served", 30)
        broker.stop()
        broker.start()
        assert seen() == serial["renewed"]
    assert "Traceback" not in broker.output()
