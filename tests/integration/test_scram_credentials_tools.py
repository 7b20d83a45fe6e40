"""SCRAM credentials through Kafka 4.4's ``kafka-configs``: created, described and deleted on one
broker (kept in its metadata file, across a restart) and on a ZooKeeper cluster (kept in
``/config/users/<user>`` as Kafka keeps them, beside the entity's other entries; created
through one broker, described through another).

The tools are Kafka's Java classes from Maven Central (scripts/kafka-dist.sh); without Java or
Maven these tests skip with the reason.
"""

from __future__ import annotations

import json
import re

import pytest
from kazoo.client import KazooClient
from zk_server import zookeeper_available

from broker_process import BrokerProcess
from cluster_clients import NO_TIERING
from cluster_process import StrataCluster
from kafka_tools import KAFKA_CONFIGS, require_kafka_dist, run_kafka_class
from strata.cluster.metadata import METADATA_FILE
from strata.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, credential_from_string

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


def configs(bootstrap: str, *args: str) -> str:
    result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", bootstrap, *args, timeout=120)
    assert result.returncode == 0, f"kafka-configs {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def add(bootstrap: str, user: str, config: str) -> str:
    return configs(bootstrap, "--alter", "--add-config", config, "--entity-type", "users",
                   "--entity-name", user)


def described(bootstrap: str, user: str | None = None) -> dict[str, str]:
    """kafka-configs --describe --entity-type users [--entity-name]: user -> credentials text."""
    args = ["--describe", "--entity-type", "users"] + (["--entity-name", user] if user else [])
    out = configs(bootstrap, *args)
    return dict(re.findall(r"SCRAM credential configs for user-principal '([^']*)' are (.*)", out))


def check_stored(text: str, mechanism, iterations: int) -> None:
    """A stored credential is Kafka's string form of a salted credential."""
    assert re.fullmatch(r"salt=[A-Za-z0-9+/=]+,stored_key=[A-Za-z0-9+/=]+,"
                        r"server_key=[A-Za-z0-9+/=]+,iterations=\d+", text), text
    cred = credential_from_string(text)
    size = 32 if mechanism is SCRAM_SHA_256 else 64
    assert (len(cred.stored_key), len(cred.server_key), cred.iterations) == (size, size, iterations)


def test_kafka_configs_on_one_broker(tmp_path):
    broker = BrokerProcess(tmp_path / "broker")
    with broker:
        out = add(broker.bootstrap, "alice", "SCRAM-SHA-512=[password=alice-secret]")
        assert "Completed updating config for user alice." in out
        add(broker.bootstrap, "bob", "SCRAM-SHA-256=[iterations=8192,password=bob-secret]")
        add(broker.bootstrap, "bob", "SCRAM-SHA-512=[password=bob-secret]")
        assert described(broker.bootstrap) == {
            "alice": "SCRAM-SHA-512=iterations=4096",
            "bob": "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"}
        assert described(broker.bootstrap, "alice") == {"alice": "SCRAM-SHA-512=iterations=4096"}
        out = configs(broker.bootstrap, "--describe", "--entity-type", "users",
                      "--entity-name", "nobody")
        assert "SCRAM credential configs for user-principal 'nobody'" not in out
        configs(broker.bootstrap, "--alter", "--delete-config", "SCRAM-SHA-256",
                "--entity-type", "users", "--entity-name", "bob")
        assert described(broker.bootstrap, "bob") == {"bob": "SCRAM-SHA-512=iterations=4096"}
        # too many iterations (the tool itself refuses too few): the broker's error, nothing stored
        result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", broker.bootstrap,
                                 "--alter", "--add-config",
                                 "SCRAM-SHA-256=[iterations=20000,password=x]",
                                 "--entity-type", "users", "--entity-name", "carol")
        assert result.returncode != 0
        assert "Too many iterations" in result.stdout + result.stderr
    # kept in the metadata file, in Kafka's form, across a restart
    doc = json.loads(next((tmp_path / "broker").rglob(METADATA_FILE)).read_text())
    assert sorted(doc["users"]) == ["alice", "bob"]
    check_stored(doc["users"]["alice"]["SCRAM-SHA-512"], SCRAM_SHA_512, 4096)
    with BrokerProcess(tmp_path / "broker", port=broker.port) as again:
        assert described(again.bootstrap) == {"alice": "SCRAM-SHA-512=iterations=4096",
                                              "bob": "SCRAM-SHA-512=iterations=4096"}
    bad = broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


_zk_ok, _zk_why = zookeeper_available()


@pytest.mark.skipif(not _zk_ok, reason=_zk_why)
def test_kafka_configs_on_a_cluster_through_zookeeper(tmp_path):
    with StrataCluster(tmp_path, brokers=2, overrides={
            "zookeeper.session.timeout.ms": "4000", **NO_TIERING}) as cluster:
        one, two = (b.bootstrap for b in cluster.brokers)
        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(30)
        try:
            # an entry Kafka's ZooKeeper mode keeps beside credentials (a user quota)
            zk.create("/config/users/alice", json.dumps(
                {"version": 1, "config": {"producer_byte_rate": "1048576"}}).encode(),
                makepath=True)
            add(one, "alice", "SCRAM-SHA-512=[password=alice-secret]")
            add(one, "user@example.com", "SCRAM-SHA-256=[iterations=8192,password=x]")
            # described through the other broker at once
            assert described(two) == {"alice": "SCRAM-SHA-512=iterations=4096",
                                      "user@example.com": "SCRAM-SHA-256=iterations=8192"}
            data, _ = zk.get("/config/users/alice")
            config = json.loads(data)["config"]
            assert config["producer_byte_rate"] == "1048576"   # kept
            check_stored(config["SCRAM-SHA-512"], SCRAM_SHA_512, 4096)
            # the znode name is Kafka's sanitized user name; each change is notified
            assert "user%40example.com" in zk.get_children("/config/users")
            changes = [json.loads(zk.get(f"/config/changes/{c}")[0])["entity_path"]
                       for c in zk.get_children("/config/changes")]
            assert "users/alice" in changes and "users/user%40example.com" in changes
            configs(two, "--alter", "--delete-config", "SCRAM-SHA-512", "--entity-type",
                    "users", "--entity-name", "alice")
            assert described(one) == {"user@example.com": "SCRAM-SHA-256=iterations=8192"}
            assert json.loads(zk.get("/config/users/alice")[0])["config"] == {
                "producer_byte_rate": "1048576"}
        finally:
            zk.stop()
            zk.close()
