"""ZooKeeper with SASL (DIGEST-MD5) and ``zookeeper.set.acl=true``, as Kafka's ZooKeeper mode:
the brokers authenticate with the JAAS file's ``Client`` section and every znode they create
gets Kafka's ACLs (the brokers' identity ALL, everyone READ except the sensitive paths), so a
client that is not a broker can read the cluster's state but not change it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions
from zk_server import ZooKeeperServer, zookeeper_available

from cluster_clients import admin, consume_all, partitions, produce, wait_for
from cluster_process import StrataCluster

from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import StrataZkClient, ZooKeeperError
from strata.cluster.zk.config import ZkClientConfig, ZkConfigError

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

BROKER_USER = "broker"
BROKER_PASSWORD = "zk-broker-secret-7d1f"
WORLD_READ = ACL(Permissions.READ, Id("world", "anyone"))
BROKER_ALL = ACL(Permissions.ALL, Id("sasl", BROKER_USER))


def server_jaas(directory: Path) -> Path:
    path = directory / "zookeeper_jaas.conf"
    path.write_text('Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n'
                    f'  user_{BROKER_USER}="{BROKER_PASSWORD}";\n}};\n')
    return path


def client_jaas(directory: Path, password: str = BROKER_PASSWORD) -> Path:
    path = directory / "kafka_server_jaas.conf"
    path.write_text('// the brokers\' ZooKeeper login\nClient {\n'
                    '  org.apache.zookeeper.server.auth.DigestLoginModule required\n'
                    f'  username="{BROKER_USER}"\n  password="{password}";\n}};\n')
    return path


def with_sasl(server: ZooKeeperServer, jaas_dir: Path) -> ZooKeeperServer:
    """``server`` set to authenticate SASL DIGEST-MD5 clients (anonymous ones still connect)."""
    server.extra_config = [
        "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider"]
    server.jvm_flags = [f"-Djava.security.auth.login.config={server_jaas(jaas_dir)}"]
    return server


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    directory = tmp_path_factory.mktemp("zk-sasl")
    with with_sasl(ZooKeeperServer(directory / "zookeeper"), directory) as server:
        yield server


@pytest.fixture
def anonymous(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_server.connect_string())
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def authenticated(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A kazoo client logged in as the brokers (ZooKeeper shows ACLs only to a reader)."""
    client = KazooClient(hosts=zk_server.connect_string(), sasl_options={
        "mechanism": "DIGEST-MD5", "username": BROKER_USER, "password": BROKER_PASSWORD})
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def broker_config(zk_server: ZooKeeperServer, tmp_path: Path, chroot: str,
                  **extra: str) -> ZkClientConfig:
    props = {"zookeeper.connect": zk_server.connect_string(chroot), "zookeeper.set.acl": "true",
             "zookeeper.session.timeout.ms": "6000", **extra}
    config = ZkClientConfig.from_properties(
        props, environ={"KAFKA_OPTS": f"-Djava.security.auth.login.config={client_jaas(tmp_path)}"})
    assert config is not None
    return config


def test_set_acl_gives_brokers_all_and_world_read_except_on_sensitive_paths(
        zk_server: ZooKeeperServer, anonymous: KazooClient, authenticated: KazooClient,
        tmp_path: Path) -> None:
    chroot = f"/strata-{uuid.uuid4().hex[:8]}"
    with StrataZkClient(broker_config(zk_server, tmp_path, chroot)) as client:
        client.create_top_level_paths()
        client.make_sure_persistent_path_exists(z.config_entity_path("users", "alice"))
        for path in (z.TOPICS_PATH, z.BROKER_IDS_PATH, z.CONFIG_CHANGES_PATH, z.CONFIG_PATH):
            assert sorted(anonymous.get_acls(chroot + path)[0]) == sorted([BROKER_ALL, WORLD_READ])
        for path in (f"{z.CONFIG_PATH}/users", z.config_entity_path("users", "alice"),
                     f"{z.CONFIG_PATH}/brokers"):
            assert authenticated.get_acls(chroot + path)[0] == [BROKER_ALL], path
        # the old consumers' path stays open, as Kafka's
        assert anonymous.get_acls(chroot + z.CONSUMERS_PATH)[0] == [
            ACL(Permissions.ALL, Id("world", "anyone"))]
        # the chroot itself is made with the secure ACLs too
        assert sorted(anonymous.get_acls(chroot)[0]) == sorted([BROKER_ALL, WORLD_READ])

        anonymous.get_children(chroot + z.TOPICS_PATH)
        with pytest.raises(NoAuthError):
            anonymous.create(f"{chroot}{z.TOPICS_PATH}/intruder", b"{}")
        with pytest.raises(NoAuthError):
            anonymous.set(chroot + z.CONFIG_CHANGES_PATH, b"x")
        with pytest.raises(NoAuthError):
            anonymous.delete(chroot + z.BROKER_IDS_PATH)
        with pytest.raises(NoAuthError):
            anonymous.get(chroot + z.config_entity_path("users", "alice"))


def test_set_acl_without_sasl_or_tls_is_refused() -> None:
    with pytest.raises(ZkConfigError, match="zookeeper.set.acl"):
        ZkClientConfig.from_properties({"zookeeper.connect": "127.0.0.1:2181",
                                        "zookeeper.set.acl": "true"}, environ={})


def test_the_jaas_file_named_in_the_broker_config_wins_over_kafka_opts(tmp_path: Path) -> None:
    named = tmp_path / "named"
    named.mkdir()
    config = ZkClientConfig.from_properties(
        {"zookeeper.connect": "127.0.0.1:2181",
         "java.security.auth.login.config": str(client_jaas(named, "from-config"))},
        environ={"KAFKA_OPTS": f"-Djava.security.auth.login.config={client_jaas(tmp_path)}"})
    assert config is not None and config.sasl is not None
    assert (config.sasl.username, config.sasl.password) == (BROKER_USER, "from-config")
    assert "from-config" not in repr(config)
    off = ZkClientConfig.from_properties(
        {"zookeeper.connect": "127.0.0.1:2181", "zookeeper.sasl.client": "false",
         "java.security.auth.login.config": str(client_jaas(named))}, environ={})
    assert off is not None and off.sasl is None


def test_brokers_with_sasl_and_set_acl_serve_fail_over_and_keep_outsiders_out(
        tmp_path: Path) -> None:
    """Two brokers log in to a SASL ZooKeeper (one names the JAAS file in its config, the other
    in KAFKA_OPTS, as a Kafka broker's -D flag): topics, produce, consume and a leader's death
    work as without SASL; an anonymous client reads the cluster's znodes but cannot change
    them; no secret from the brokers' configs reaches their logs."""
    jaas = client_jaas(tmp_path)
    plain_secret = "plain-secret-0c4e"
    remote_secret = "remote-secret-9a2b"
    cluster = StrataCluster(
        tmp_path / "cluster", brokers=2,
        overrides={"zookeeper.session.timeout.ms": "4000", "zookeeper.set.acl": "true",
                   "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                       f'required username="admin" password="{plain_secret}";',
                   "rsm.config.storage.aws_secret_access_key": remote_secret},
        broker_overrides={1: {"java.security.auth.login.config": str(jaas)}})
    cluster.broker(2).process.env["KAFKA_OPTS"] = f"-Djava.security.auth.login.config={jaas}"
    with_sasl(cluster.zk, tmp_path)
    with cluster:
        admin(cluster.bootstrap).create_topics([NewTopic("secured", 1, 2)])["secured"].result(30)
        wait_for("both replicas in sync", lambda: len(
            partitions(cluster.bootstrap, "secured")[0].isr) == 2)
        assert len(produce(cluster.bootstrap, "secured", [b"%d" % i for i in range(10)])) == 10
        assert len(consume_all(cluster.bootstrap, "secured", 10)) == 10

        anonymous = KazooClient(hosts=cluster.zk.connect_string(cluster.chroot))
        anonymous.start(timeout=30)
        try:
            topic = z.topic_path("secured")
            state = z.partition_state_path("secured", 0)
            assert "secured" in anonymous.get_children(z.TOPICS_PATH)
            assert anonymous.get(state)[0]
            assert sorted(anonymous.get_acls(topic)[0]) == sorted([BROKER_ALL, WORLD_READ])
            assert sorted(anonymous.get_acls(z.CONTROLLER_PATH)[0]) == sorted(
                [BROKER_ALL, WORLD_READ])
            with pytest.raises(NoAuthError):
                anonymous.set(state, b'{"leader": -1}')
            with pytest.raises(NoAuthError):
                anonymous.delete(z.CONTROLLER_PATH)   # no forced controller move
            with pytest.raises(NoAuthError):
                anonymous.create(z.delete_topic_path("secured"))   # no topic deletion
            with pytest.raises(NoAuthError):
                anonymous.delete(z.broker_path(1))
        finally:
            anonymous.stop()
            anonymous.close()

        leader = partitions(cluster.bootstrap, "secured")[0].leader
        survivor = cluster.broker(3 - leader)
        cluster.broker(leader).kill()
        wait_for("the survivor leads", lambda: partitions(
            survivor.bootstrap, "secured")[0].leader == survivor.node_id)
        assert len(produce(survivor.bootstrap, "secured", [b"after-%d" % i for i in range(5)])) == 5
        assert len(consume_all(survivor.bootstrap, "secured", 15)) == 15
        cluster.broker(leader).start()   # registers again through SASL
        cluster.wait_metadata()

        for broker in cluster.brokers:
            out = broker.output()
            assert "zookeeper" in out.lower()
            for secret in (BROKER_PASSWORD, plain_secret, remote_secret):
                assert secret not in out, (broker.node_id, secret)


def test_security_migration_secures_existing_znodes_and_can_open_them_again(
        zk_server: ZooKeeperServer, anonymous: KazooClient, authenticated: KazooClient,
        tmp_path: Path) -> None:
    """Znodes made before zookeeper.set.acl was turned on are open until Kafka's
    zookeeper-security-migration (``strata zookeeper-security-migration``) sets their ACLs."""
    chroot = f"/strata-{uuid.uuid4().hex[:8]}"
    config = broker_config(zk_server, tmp_path, chroot, **{"zookeeper.set.acl": "false"})
    with StrataZkClient(config) as client:
        client.create_top_level_paths()
        client.make_sure_persistent_path_exists(z.config_entity_path("users", "alice"))
    anonymous.create(f"{chroot}{z.TOPICS_PATH}/made-while-open", b"{}")

    def migrate(acl: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "strata.cli.main", "zookeeper-security-migration",
             f"--zookeeper.acl={acl}", f"--zookeeper.connect={zk_server.connect_string(chroot)}"],
            env={**os.environ,
                 "KAFKA_OPTS": f"-Djava.security.auth.login.config={client_jaas(tmp_path)}"},
            capture_output=True, text=True, timeout=120)
    done = migrate("secure")
    assert done.returncode == 0, done.stderr
    assert "Set secure ACLs on" in done.stdout
    topic = f"{chroot}{z.TOPICS_PATH}/made-while-open"
    assert sorted(anonymous.get_acls(topic)[0]) == sorted([BROKER_ALL, WORLD_READ])
    assert authenticated.get_acls(chroot + z.config_entity_path("users", "alice"))[0] == [
        BROKER_ALL]
    with pytest.raises(NoAuthError):
        anonymous.delete(topic)
    with pytest.raises(NoAuthError):
        anonymous.get(chroot + z.config_entity_path("users", "alice"))

    done = migrate("unsecure")
    assert done.returncode == 0, done.stderr
    anonymous.delete(topic)
    assert anonymous.get(chroot + z.config_entity_path("users", "alice"))


def test_security_migration_needs_sasl_or_tls() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "strata.cli.main", "zookeeper-security-migration",
         "--zookeeper.acl=secure", "--zookeeper.connect=127.0.0.1:1"],
        env={k: v for k, v in os.environ.items() if k != "KAFKA_OPTS"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "No JAAS configuration file has been specified" in done.stderr


def test_a_wrong_zookeeper_password_fails_the_start_with_the_reason(
        zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    client_jaas(tmp_path, "not-the-password")
    config = ZkClientConfig.from_properties(
        {"zookeeper.connect": zk_server.connect_string("/wrong"), "zookeeper.set.acl": "true",
         "java.security.auth.login.config": str(tmp_path / "kafka_server_jaas.conf")},
        environ={})
    assert config is not None
    with pytest.raises(ZooKeeperError, match="Authentication to ZooKeeper .* failed .*'broker'"):
        StrataZkClient(config).start()


def test_parents_made_on_the_way_get_their_own_acls(
        zk_server: ZooKeeperServer, authenticated: KazooClient, tmp_path: Path) -> None:
    """A create that makes its parents gives each the ACLs of its own path: /config/users
    made for a user's znode is not world-readable, /config made with it is."""
    chroot = f"/strata-{uuid.uuid4().hex[:8]}"
    with StrataZkClient(broker_config(zk_server, tmp_path, chroot)) as client:
        client.set_or_create_entity_configs("users", "bob", {"producer_byte_rate": "1024"})
    assert sorted(authenticated.get_acls(chroot + z.CONFIG_PATH)[0]) == sorted(
        [BROKER_ALL, WORLD_READ])
    assert authenticated.get_acls(f"{chroot}{z.CONFIG_PATH}/users")[0] == [BROKER_ALL]
