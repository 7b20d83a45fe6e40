"""The shipped config (config/server.properties, `make run`) serves the metrics endpoint out of
the box (issue 48), so `strata tiered describe` works against it; an empty value turns it off
(what test clusters started from the shipped config use)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from strata.broker.broker import start_metrics_server
from strata.cli.main import read_server_properties

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "server.properties"


def test_shipped_config_serves_metrics_on_loopback_apart_from_the_broker_ports() -> None:
    props = read_server_properties(str(SHIPPED), [])
    url = urlsplit(props["strata.metrics.listener"])
    assert (url.scheme, url.hostname, url.port) == ("http", "127.0.0.1", 9404)
    # scripts/run-cluster.sh's defaults: ZooKeeper 2181, brokers 9092-9094, each broker its
    # metrics on the configured port + (node id - 1)
    kafka_ports = {2181, 9092, 9093, 9094, int(props["listeners"].rsplit(":", 1)[1])}
    assert not {url.port + i for i in range(3)} & kafka_ports


def test_an_empty_metrics_listener_serves_nothing() -> None:
    props = read_server_properties(str(SHIPPED), ["strata.metrics.listener="])
    assert props["strata.metrics.listener"] == ""
    assert start_metrics_server(props, log_manager=None, rlm=None, metadata=None) is None
