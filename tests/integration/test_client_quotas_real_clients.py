"""Client quotas through real clients: Kafka 4.4's ``kafka-configs`` sets and describes them
(AlterClientQuotas / DescribeClientQuotas), they survive a restart, and a confluent-kafka
producer over its quota is throttled (its rate is measured by ``python -m benchmarks.quota``,
not asserted here)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from broker_process import BrokerProcess, free_port
from kafka_tools import KAFKA_CONFIGS, require_kafka_dist, run_kafka_class

pytestmark = pytest.mark.slow


def configs(b, *args: str) -> str:
    result = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", b.bootstrap, *args)
    assert result.returncode == 0, f"kafka-configs {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_kafka_configs_sets_and_describes_client_and_user_quotas_that_survive_a_restart(tmp_path):
    require_kafka_dist()
    with BrokerProcess(tmp_path) as b:
        out = configs(b, "--entity-type", "clients", "--entity-name", "app", "--alter",
                      "--add-config", "producer_byte_rate=1048576,request_percentage=50.5")
        assert "Completed updating config for client app." in out, out
        configs(b, "--entity-type", "users", "--entity-default", "--alter",
                "--add-config", "consumer_byte_rate=2048")
        configs(b, "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                "--entity-default", "--alter", "--add-config", "controller_mutation_rate=10")
        bad = run_kafka_class(KAFKA_CONFIGS, "--bootstrap-server", b.bootstrap, "--entity-type",
                              "clients", "--entity-name", "app", "--alter", "--add-config",
                              "producer_byte_rate=0")
        assert bad.returncode != 0
        assert "Quota producer_byte_rate must be greater than 0" in bad.stdout + bad.stderr
        described = configs(b, "--entity-type", "clients", "--entity-name", "app", "--describe")
        assert "Quota configs for client-id 'app' are " in described, described
        assert "producer_byte_rate=1048576.0" in described and "request_percentage=50.5" in described
        configs(b, "--entity-type", "clients", "--entity-name", "app", "--alter",
                "--delete-config", "request_percentage")
    with BrokerProcess(tmp_path, port=b.port) as b:
        described = configs(b, "--entity-type", "clients", "--entity-name", "app", "--describe")
        assert "producer_byte_rate=1048576.0" in described and "request_percentage" not in described
        described = configs(b, "--entity-type", "users", "--entity-default", "--describe")
        assert "Quota configs for the default user-principal are consumer_byte_rate=2048.0" in \
            described, described
        described = configs(b, "--entity-type", "users", "--entity-name", "alice",
                            "--entity-type", "clients", "--entity-default", "--describe")
        assert "controller_mutation_rate=10.0" in described, described
        everything = configs(b, "--entity-type", "clients", "--describe")
        assert "client-id 'app'" in everything and "alice" not in everything


def _set_producer_quota(bootstrap: str, client_id: str, bytes_per_second: int) -> None:
    from benchmarks.quota import set_producer_quota
    set_producer_quota(bootstrap, client_id, bytes_per_second)


def test_a_producer_over_its_byte_rate_quota_is_throttled_and_the_throttle_is_exported(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    metrics_port = free_port()
    # 2 windows of 1 s: the quota bites after about one second instead of ten
    with BrokerProcess(tmp_path, overrides={"quota.window.num": "2",
                                            "strata.metrics.listener":
                                                f"http://127.0.0.1:{metrics_port}"}) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("quota-t", 1, 1)])["quota-t"].result(30)
        _set_producer_quota(b.bootstrap, "limited", 1_048_576)
        throttles = []

        def stats(text):
            for broker in json.loads(text)["brokers"].values():
                throttles.append(broker["throttle"]["max"])
        producer = Producer({"bootstrap.servers": b.bootstrap, "client.id": "limited",
                             "linger.ms": 5, "statistics.interval.ms": 200, "stats_cb": stats})
        value = b"x" * 10_000
        total = 4 * 1_048_576
        start = time.monotonic()
        for _ in range(total // len(value)):
            while True:
                try:
                    producer.produce("quota-t", value)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        assert producer.flush(60) == 0
        elapsed = time.monotonic() - start
        time.sleep(0.5)            # one more statistics interval
        producer.poll(0)
        assert max(throttles) > 0                  # the broker reported throttle time
        assert elapsed > 1.5                       # 4 MiB at 1 MiB/s after a 1 s burst: ~3 s
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
        lines = text.decode().splitlines()
        assert any(line.startswith('kafka_server_Produce_throttle_time{client_id="limited",user=""}')
                   and float(line.split()[-1]) > 0 for line in lines), \
            [line for line in lines if "Produce" in line]
        assert any(line.startswith('kafka_server_Produce_byte_rate{client_id="limited",user=""}')
                   for line in lines)
