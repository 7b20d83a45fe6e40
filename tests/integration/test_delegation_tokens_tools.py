"""Delegation tokens (KIP-48) with Kafka 4's ``kafka-delegation-tokens`` and Java clients: on one
SCRAM broker, alice creates, describes, renews and expires a token; Kafka's console producer and
consumer log in with it (SCRAM, ``tokenauth="true"``, the token id and its HMAC) as alice; a
token-authenticated or PLAINTEXT connection may not create tokens; a broker without
``delegation.token.secret.key`` refuses; an expired token is refused and removed. With Kafka's
authorizer, a token for another owner needs CREATE_TOKENS on that user, its login is the
owner under the owner's ACLs, and DESCRIBE on the token lets another user see it. In a
three-broker ZooKeeper cluster a token created through one broker logs in on the others within
seconds, from Kafka's znodes.

librdkafka (confluent-kafka) cannot log in with a token: its SCRAM client-first message is
``n,,n=<user>,r=<nonce>`` with no extensions (librdkafka 2.16, confluent-kafka's wheel), so it
never sends Kafka's ``tokenauth``; only Java clients are tested here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from zk_server import zookeeper_available

from broker_process import BrokerProcess, free_port
from cluster_clients import NO_TIERING
from cluster_process import StrataCluster
from kafka_tools import (
    CONSOLE_CONSUMER, CONSOLE_PRODUCER, KAFKA_ACLS, KAFKA_CONFIGS, KAFKA_TOPICS,
    require_kafka_dist, run_kafka_class)
from support.waiting import eventually

pytestmark = pytest.mark.slow

DELEGATION_TOKENS = "org.apache.kafka.tools.DelegationTokenCommand"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
MECHANISM = "SCRAM-SHA-512"


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


def sasl_props(plain_port: int, sasl_port: int, secret: str | None = "token-secret") -> dict:
    both = f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    props = {"listeners": both, "advertised.listeners": both,
             "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
             "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
             "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
             "delegation.token.expiry.check.interval.ms": "500"}
    if secret is not None:
        props["delegation.token.secret.key"] = secret
    return props


def scram_user(plain_bootstrap: str, user: str) -> None:
    result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", plain_bootstrap, "--alter",
                             "--add-config", f"{MECHANISM}=[password={user}-secret]",
                             "--entity-type", "users", "--entity-name", user)
    assert result.returncode == 0, result.stdout + result.stderr


def client_config(path: Path, username: str, password: str, token: bool = False) -> Path:
    extra = ' tokenauth="true"' if token else ""
    path.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism={MECHANISM}\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                    f'required username="{username}" password="{password}"{extra};\n')
    return path


def tokens(bootstrap: str, config: Path, *args: str):
    return run_kafka_class(DELEGATION_TOKENS, "--bootstrap-server", bootstrap,
                           "--command-config", str(config), *args)


def create(bootstrap: str, config: Path, *args: str) -> tuple[str, str]:
    """--create: (token id, HMAC in base64) from the tool's table."""
    result = tokens(bootstrap, config, "--create", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    token_id = re.search(r"Created delegation token with tokenId : (\S+)", result.stdout)[1]
    row = next(line.split() for line in result.stdout.splitlines()
               if line.startswith(token_id + " "))
    return token_id, row[1]


def described(bootstrap: str, config: Path, *args: str) -> str:
    result = tokens(bootstrap, config, "--describe", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def lists_topics(bootstrap: str, config: Path) -> bool:
    """kafka-topics --list logs in with ``config``: whether it did."""
    result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", bootstrap, "--command-config",
                             str(config), "--list", timeout=60)
    return result.returncode == 0


def test_kafka_delegation_tokens_and_java_clients_on_one_broker(tmp_path):
    plain_port, sasl_port = free_port(), free_port()
    at = f"127.0.0.1:{sasl_port}"
    with BrokerProcess(tmp_path / "b", sasl_props(plain_port, sasl_port),
                       port=plain_port) as broker:
        scram_user(broker.bootstrap, "alice")
        scram_user(broker.bootstrap, "bob")
        alice = client_config(tmp_path / "alice.properties", "alice", "alice-secret")
        bob = client_config(tmp_path / "bob.properties", "bob", "bob-secret")
        # not over PLAINTEXT (no authenticated principal)
        plain_cfg = tmp_path / "plain.properties"
        plain_cfg.write_text("security.protocol=PLAINTEXT\n")
        refused = tokens(broker.bootstrap, plain_cfg, "--create", "--max-life-time-period", "-1")
        assert refused.returncode != 0
        assert "not allowed" in refused.stdout + refused.stderr

        token_id, hmac = create(at, alice, "--max-life-time-period", "-1",
                                "--renewer-principal", "User:bob")
        # the tool without --owner-principal sends an empty owner list: Kafka answers no tokens
        assert "Total number of tokens : 0" in described(at, alice)
        assert token_id in described(at, alice, "--owner-principal", "User:alice")
        assert token_id in described(at, bob, "--owner-principal", "User:alice")  # a renewer
        assert "Total number of tokens : 0" in described(at, bob, "--owner-principal",
                                                          "User:carol")

        # Kafka's console producer and consumer log in with the token, as alice
        token_cfg = client_config(tmp_path / "token.properties", token_id, hmac, token=True)
        result = run_kafka_class(CONSOLE_PRODUCER, "--bootstrap-server", at, "--topic",
                                 "by-token", "--command-config", str(token_cfg),
                                 input="".join(f"m{i}\n" for i in range(10)))
        assert result.returncode == 0, result.stdout + result.stderr
        result = run_kafka_class(CONSOLE_CONSUMER, "--bootstrap-server", at, "--topic",
                                 "by-token", "--from-beginning", "--max-messages", "10",
                                 "--command-config", str(token_cfg))
        assert result.returncode == 0, result.stdout + result.stderr
        assert sorted(result.stdout.split()) == sorted(f"m{i}" for i in range(10))
        # a token-authenticated connection may not create one
        refused = tokens(at, token_cfg, "--create", "--max-life-time-period", "-1")
        assert refused.returncode != 0
        assert "not allowed" in refused.stdout + refused.stderr
        # the token's HMAC under another id, or a wrong HMAC: refused
        assert not lists_topics(at, client_config(tmp_path / "bad.properties", token_id,
                                                  "AAAA" + hmac[4:], token=True))

        # renew and expire: owner or renewer
        result = tokens(at, bob, "--renew", "--hmac", hmac, "--renew-time-period", "-1")
        assert "Completed renew operation" in result.stdout, result.stdout + result.stderr
        carol_cfg = client_config(tmp_path / "carol.properties", "carol", "carol-secret")
        scram_user(broker.bootstrap, "carol")
        result = tokens(at, carol_cfg, "--renew", "--hmac", hmac, "--renew-time-period", "-1")
        assert result.returncode != 0
        assert "DelegationTokenOwnerMismatch" in result.stdout + result.stderr
        result = tokens(at, alice, "--expire", "--hmac", hmac, "--expiry-time-period", "0")
        assert "Completed expire operation" in result.stdout, result.stdout + result.stderr
        # expired: refused at once, then removed by the periodic check
        assert not lists_topics(at, token_cfg)
        eventually(lambda: "Total number of tokens : 0" in described(
                       at, alice, "--owner-principal", "User:alice"),
                   "the expired token removed", timeout=30)
        result = tokens(at, alice, "--renew", "--hmac", hmac, "--renew-time-period", "-1")
        assert "DelegationTokenNotFound" in result.stdout + result.stderr

        # a token survives a restart (kept in the log dir)
        token_id, hmac = create(at, alice, "--max-life-time-period", "-1")
    with BrokerProcess(tmp_path / "b", sasl_props(plain_port, sasl_port), port=plain_port):
        again = client_config(tmp_path / "again.properties", token_id, hmac, token=True)
        assert lists_topics(at, again)
    bad = broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def test_without_a_secret_key_token_requests_are_refused(tmp_path):
    plain_port, sasl_port = free_port(), free_port()
    at = f"127.0.0.1:{sasl_port}"
    with BrokerProcess(tmp_path / "b", sasl_props(plain_port, sasl_port, secret=None),
                       port=plain_port) as broker:
        scram_user(broker.bootstrap, "alice")
        alice = client_config(tmp_path / "alice.properties", "alice", "alice-secret")
        result = tokens(at, alice, "--create", "--max-life-time-period", "-1")
        assert result.returncode != 0
        assert "DelegationTokenDisabled" in result.stdout + result.stderr


def test_with_kafkas_authorizer_tokens_follow_the_owners_acls(tmp_path):
    """KIP-373: alice makes a token for bob once she has CREATE_TOKENS on User:bob; a login
    with it is bob under bob's ACLs; eve describes bob's token once she may DESCRIBE it."""
    plain_port, sasl_port = free_port(), free_port()
    at = f"127.0.0.1:{sasl_port}"
    props = {**sasl_props(plain_port, sasl_port),
             "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
             "super.users": "User:ANONYMOUS"}   # the PLAINTEXT listener: the admin's
    with BrokerProcess(tmp_path / "b", props, port=plain_port) as broker:
        plain_cfg = tmp_path / "plain.properties"
        plain_cfg.write_text("security.protocol=PLAINTEXT\n")

        def acl(*args: str) -> None:
            result = run_kafka_class(KAFKA_ACLS, "--bootstrap-server", broker.bootstrap,
                                     "--command-config", str(plain_cfg), "--add", *args)
            assert result.returncode == 0, result.stdout + result.stderr
        for user in ("alice", "bob", "eve"):
            scram_user(broker.bootstrap, user)
        result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", broker.bootstrap,
                                 "--create", "--topic", "orders", "--partitions", "1")
        assert result.returncode == 0, result.stdout + result.stderr
        alice = client_config(tmp_path / "alice.properties", "alice", "alice-secret")
        eve = client_config(tmp_path / "eve.properties", "eve", "eve-secret")
        refused = tokens(at, alice, "--create", "--max-life-time-period", "-1",
                         "--owner-principal", "User:bob")
        assert refused.returncode != 0
        assert "DelegationTokenAuthorizationException" in refused.stdout + refused.stderr
        acl("--allow-principal", "User:alice", "--operation", "CreateTokens",
            "--user-principal", "User:bob")
        token_id, hmac = create(at, alice, "--max-life-time-period", "-1",
                                "--owner-principal", "User:bob")
        token_cfg = client_config(tmp_path / "token.properties", token_id, hmac, token=True)

        def topics_seen() -> list[str]:
            result = run_kafka_class(KAFKA_TOPICS, "--bootstrap-server", at,
                                     "--command-config", str(token_cfg), "--list")
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout.split()
        assert "orders" not in topics_seen()
        acl("--allow-principal", "User:bob", "--operation", "Describe", "--topic", "orders")
        assert "orders" in topics_seen()     # the token's login is bob

        assert "Total number of tokens : 0" in described(at, eve, "--owner-principal",
                                                          "User:bob")
        acl("--allow-principal", "User:eve", "--operation", "Describe", "--delegation-token",
            token_id)
        assert token_id in described(at, eve, "--owner-principal", "User:bob")


_zk_ok, _zk_why = zookeeper_available()


@pytest.mark.skipif(not _zk_ok, reason=_zk_why)
def test_a_token_created_through_one_broker_logs_in_on_the_others(tmp_path):
    cluster = StrataCluster(tmp_path, brokers=3, overrides={
        "zookeeper.session.timeout.ms": "6000", **NO_TIERING})
    sasl_ports = {}
    for b in cluster.brokers:
        sasl_ports[b.node_id] = free_port()
        b.process.overrides.update(sasl_props(b.port, sasl_ports[b.node_id]))
    with cluster:
        at = {n: f"127.0.0.1:{p}" for n, p in sasl_ports.items()}
        scram_user(cluster.brokers[0].bootstrap, "alice")
        alice = client_config(tmp_path / "alice.properties", "alice", "alice-secret")
        eventually(lambda: lists_topics(at[2], alice), "alice's credential on broker 2",
                   timeout=30)
        token_id, hmac = create(at[1], alice, "--max-life-time-period", "-1")
        token_cfg = client_config(tmp_path / "token.properties", token_id, hmac, token=True)
        for node in (2, 3):
            eventually(lambda n=node: lists_topics(at[n], token_cfg),
                       f"the token logs in on broker {node}", timeout=30)
        assert token_id in described(at[3], alice, "--owner-principal", "User:alice")
        # Kafka's znodes: the token's JSON and the change notification
        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(30)
        try:
            doc = json.loads(zk.get(f"/delegation_token/tokens/{token_id}")[0])
            assert doc["owner"] == "User%3Aalice" and doc["tokenId"] == token_id
            assert doc["version"] == 3 and doc["renewers"] == []
            changes = [zk.get(f"/delegation_token/token_changes/{c}")[0].decode()
                       for c in zk.get_children("/delegation_token/token_changes")]
            assert token_id in changes
        finally:
            zk.stop()
            zk.close()
        # expired through broker 3: refused on broker 1
        result = tokens(at[3], alice, "--expire", "--hmac", hmac, "--expiry-time-period", "-1")
        assert "Completed expire operation" in result.stdout, result.stdout + result.stderr
        eventually(lambda: not lists_topics(at[1], token_cfg), "the token refused on broker 1",
                   timeout=30)
