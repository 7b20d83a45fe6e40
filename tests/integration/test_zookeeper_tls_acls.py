"""ZooKeeper over TLS (``zookeeper.ssl.*``, Kafka's KIP-515 names) with
``zookeeper.set.acl=true``: the broker's certificate is its ZooKeeper identity (the ``x509``
scheme), so its znodes are writable only with that certificate."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_process import free_port
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions
import tls_support
from tls_support import PASSWORD, make_ca
from zk_server import ZooKeeperServer, zookeeper_available

from cluster_clients import admin, consume_all, produce
from cluster_process import StrataCluster
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import StrataZkClient
from strata.cluster.zk.config import ZkClientConfig

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

BROKER_ALL = ACL(Permissions.ALL, Id("x509", "CN=broker,O=Strata"))
WORLD_READ = ACL(Permissions.READ, Id("world", "anyone"))


def with_tls(server: ZooKeeperServer, ca: tls_support.TestCa) -> int:
    """Adds a TLS port that needs a client certificate of ``ca``; returns that port."""
    issued = ca.issue("zookeeper")
    port = free_port()
    server.extra_config = [
        f"secureClientPort={port}",
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        f"ssl.keyStore.location={issued.keystore_p12}", f"ssl.keyStore.password={PASSWORD}",
        "ssl.keyStore.type=PKCS12",
        f"ssl.trustStore.location={ca.pem}", "ssl.trustStore.type=PEM",
        "ssl.clientAuth=need"]
    return port


def tls_props(ca: tls_support.TestCa, connect: str) -> dict[str, str]:
    issued = ca.issue("broker")
    return {"zookeeper.connect": connect, "zookeeper.set.acl": "true",
            "zookeeper.ssl.client.enable": "true",
            "zookeeper.clientCnxnSocket": "org.apache.zookeeper.ClientCnxnSocketNetty",
            "zookeeper.ssl.keystore.location": str(issued.keystore_p12),
            "zookeeper.ssl.keystore.password": PASSWORD, "zookeeper.ssl.keystore.type": "PKCS12",
            "zookeeper.ssl.truststore.location": str(ca.pem),
            "zookeeper.ssl.truststore.type": "PEM"}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tls_support.TestCa:
    return make_ca(tmp_path_factory.mktemp("zk-ca"))


def test_a_tls_broker_owns_its_znodes_by_its_certificate(
        tmp_path: Path, ca: tls_support.TestCa) -> None:
    server = ZooKeeperServer(tmp_path / "zookeeper")
    secure_port = with_tls(server, ca)
    with server:
        config = ZkClientConfig.from_properties(
            tls_props(ca, f"127.0.0.1:{secure_port}/tls"), environ={})
        assert config is not None and config.tls is not None
        assert PASSWORD not in repr(config)
        with StrataZkClient(config) as client:
            client.create_top_level_paths()
            anonymous = KazooClient(hosts=server.connect_string("/tls"))
            anonymous.start(timeout=30)
            try:
                assert sorted(anonymous.get_acls(z.TOPICS_PATH)[0]) == sorted(
                    [BROKER_ALL, WORLD_READ])
                assert anonymous.get_children(z.BROKERS_PATH)
                with pytest.raises(NoAuthError):
                    anonymous.create(f"{z.TOPICS_PATH}/intruder", b"{}")
                with pytest.raises(NoAuthError):
                    anonymous.delete(z.BROKER_IDS_PATH)
            finally:
                anonymous.stop()
                anonymous.close()


def test_a_broker_on_a_tls_zookeeper_with_set_acl_serves_topics(
        tmp_path: Path, ca: tls_support.TestCa) -> None:
    cluster = StrataCluster(tmp_path / "cluster", brokers=1)
    secure_port = with_tls(cluster.zk, ca)
    for broker in cluster.brokers:
        broker.process.overrides.update(tls_props(ca, f"127.0.0.1:{secure_port}{cluster.chroot}"))
    with cluster:
        admin(cluster.bootstrap).create_topics([NewTopic("over-tls", 1, 1)])["over-tls"].result(30)
        assert len(produce(cluster.bootstrap, "over-tls", [b"a", b"b", b"c"])) == 3
        assert len(consume_all(cluster.bootstrap, "over-tls", 3)) == 3
        anonymous = KazooClient(hosts=cluster.zk.connect_string(cluster.chroot))
        anonymous.start(timeout=30)
        try:
            assert sorted(anonymous.get_acls(z.topic_path("over-tls"))[0]) == sorted(
                [BROKER_ALL, WORLD_READ])
            with pytest.raises(NoAuthError):
                anonymous.create(z.delete_topic_path("over-tls"))
        finally:
            anonymous.stop()
            anonymous.close()
        assert PASSWORD not in cluster.broker(1).output()
