"""``strata storage format --add-scram`` (Kafka's ``kafka-storage format --add-scram``): the first
SCRAM credential made before any broker runs logs a real client in at the broker's first
start, on one broker (its metadata file) and in a ZooKeeper cluster (``/config/users``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient
from zk_server import zookeeper_available

from broker_process import BrokerProcess, free_port
from cluster_process import StrataCluster
from test_sasl_listeners import SCRAM_JAAS, plain
from test_tls_listeners import produce_and_consume

pytestmark = pytest.mark.slow

SASL = {"sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.clients.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.clients.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENTS:SASL_PLAINTEXT"}


def storage_format(process: BrokerProcess, *scram: str) -> str:
    """``strata storage format`` with the broker's own config and overrides."""
    command = [sys.executable, "-m", "strata.cli.main", "storage", "format"]
    if process.config is not None:
        command += ["--config", str(process.config)]
    for key, value in process.overrides.items():
        command += ["--override", f"{key}={value}"]
    for argument in scram:
        command += ["--add-scram", argument]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_credential_formatted_into_a_new_log_dir_logs_a_client_in_at_first_start(tmp_path):
    plain_port, clients = free_port(), free_port()
    overrides = {**SASL, "listeners": f"PLAINTEXT://127.0.0.1:{plain_port},"
                                      f"CLIENTS://127.0.0.1:{clients}"}
    broker = BrokerProcess(tmp_path / "b", overrides, port=plain_port)
    out = storage_format(broker, "SCRAM-SHA-512=[name=alice,password=alice-secret]",
                         "SCRAM-SHA-256=[name=alice,password=alice-secret,iterations=8192]")
    assert "SCRAM credentials of alice" in out
    with broker:
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            config = {"bootstrap.servers": f"127.0.0.1:{clients}",
                      **plain("alice", "alice-secret", mechanism=mechanism)}
            topic = f"formatted-{mechanism[-3:]}"
            assert produce_and_consume(config, topic, 20) == [b"v%d" % i for i in range(20)]
    assert "failed authentication" not in broker.output()


_ok, _why = zookeeper_available()


@pytest.mark.skipif(not _ok, reason=_why)
def test_a_credential_formatted_into_zookeeper_logs_a_client_in_at_the_clusters_first_start(
        tmp_path):
    cluster = StrataCluster(tmp_path, brokers=1, overrides={
        **SASL, "offsets.topic.replication.factor": "1", "inter.broker.listener.name": "PLAINTEXT",
        "remote.log.storage.system.enable": "false", "log.remote.storage.enable": "false"})
    broker = cluster.brokers[0]
    clients = free_port()
    both = f"PLAINTEXT://127.0.0.1:{broker.port},CLIENTS://127.0.0.1:{clients}"
    broker.process.overrides.update({"listeners": both, "advertised.listeners": both})
    cluster.zk.start()
    try:
        assert "/config/users" in storage_format(
            broker.process, "SCRAM-SHA-256=[name=bob,password=bob-secret]")
        cluster.zk.start = lambda timeout=60: cluster.zk   # already serving, with the users
        with cluster:
            config = {"bootstrap.servers": f"127.0.0.1:{clients}",
                      **plain("bob", "bob-secret", mechanism="SCRAM-SHA-256")}
            assert AdminClient(config).list_topics(timeout=15).brokers
            wrong = {**config, "sasl.password": "not-it"}
            from confluent_kafka import KafkaException
            with pytest.raises(KafkaException):
                AdminClient(wrong).list_topics(timeout=3)
    finally:
        cluster.zk.stop()
