"""Transactions V2's feature on three brokers and a real ZooKeeper (the ``faults`` marker, as
the other three-broker transaction loop: ``make faults-txn``, not ``make test``):
``transaction.version`` lives in ZooKeeper's ``/feature``.

- The first broker writes ``/feature`` with transaction.version 2; every broker reports it.
- ``kafka-features downgrade`` through one broker reaches the others through the ZooKeeper
  watch; ``upgrade`` through another brings level 2 back everywhere.
"""

from __future__ import annotations

import re

import pytest
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING
from cluster_process import StrataCluster
from kafka_tools import KAFKA_FEATURES, require_kafka_dist, run_kafka_class
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.faults]

OVERRIDES = {"zookeeper.session.timeout.ms": "4000", **NO_TIERING}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_kafka_dist()
    with StrataCluster(tmp_path_factory.mktemp("txn-v2"), brokers=3, overrides=OVERRIDES) as c:
        yield c


def features(bootstrap: str, *args: str) -> str:
    result = run_kafka_class(KAFKA_FEATURES, "--bootstrap-server", bootstrap, *args)
    return result.stdout + result.stderr


def tv_level(bootstrap: str) -> str | None:
    found = re.search(r"Feature: transaction.version\s.*?FinalizedVersionLevel: (\S+)",
                      features(bootstrap, "describe"))
    return found and found.group(1)


def test_every_broker_reports_transaction_version_2_from_zookeeper(cluster):
    for b in cluster.brokers:
        assert tv_level(b.bootstrap) == "2", b.node_id


def test_a_feature_update_reaches_every_broker_through_zookeeper(cluster):
    first, *others = cluster.brokers
    assert "transaction.version was downgraded to 1." in features(
        first.bootstrap, "downgrade", "--feature", "transaction.version=1")
    for b in others:
        eventually(lambda: tv_level(b.bootstrap) == "1", f"broker {b.node_id} at level 1", 30)
    assert "transaction.version was upgraded to 2." in features(
        others[0].bootstrap, "upgrade", "--feature", "transaction.version=2")
    for b in cluster.brokers:
        eventually(lambda: tv_level(b.bootstrap) == "2", f"broker {b.node_id} at level 2", 30)
