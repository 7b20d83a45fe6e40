"""Transactions V2 (KIP-890 part 2) with Kafka's own Java client: a broker at
``transaction.version`` 2 (the default, as a new Kafka 4 cluster) makes Kafka 4.x's producer
end every transaction with EndTxn v5 (the epoch bumped each time), send Produce v12 with no
AddPartitionsToTxn (the partition leader adds the partition) and TxnOffsetCommit v5 with no
AddOffsetsToTxn.

``java/TransactionsV2Client.java`` (run in java's source-file mode) commits, aborts, runs a
consume-transform-produce transaction with ``sendOffsetsToTransaction``, is fenced by a second
producer of the same transactional id, and reads both topics back read_committed. The test
checks what it read, the group's committed offsets, and the producer epoch that
``kafka-transactions describe`` reports: one bump per ended transaction, which V1 never does.

``kafka-features downgrade --feature transaction.version=1`` then makes the same client use V1
(no bump), ``kafka-features describe`` shows the level with a new finalized epoch, an upgrade
past the supported range is refused, and ``upgrade --feature transaction.version=2`` brings V2
back.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker_process import BrokerProcess
from kafka_tools import (
    KAFKA_FEATURES, KAFKA_TRANSACTIONS, kafka_java_command, require_kafka_dist, run_kafka_class)
from support.waiting import eventually

CLIENT = Path(__file__).parent / "java" / "TransactionsV2Client.java"
BROKER = {"group.initial.rebalance.delay.ms": "0",
          "transaction.state.log.num.partitions": "4",
          "offsets.topic.num.partitions": "4"}
TIMEOUT = 30
PARTITIONS = 2


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    require_kafka_dist()
    with BrokerProcess(tmp_path_factory.mktemp("txn-v2"), BROKER) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1)
                                      for t in ("v2-in", "v2-out", "v1-in")]).values():
            f.result(TIMEOUT)
        yield b
        assert not b.logged_errors()


def client(b: BrokerProcess, *args: str) -> list[str]:
    """The Java client's output lines (it must exit 0)."""
    run = subprocess.run(kafka_java_command(str(CLIENT), b.bootstrap, *args),
                         capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.splitlines()


def features(b: BrokerProcess, *args: str) -> str:
    result = run_kafka_class(KAFKA_FEATURES, "--bootstrap-server", b.bootstrap, *args)
    return result.stdout + result.stderr


def finalized(b: BrokerProcess, name: str) -> tuple[str, str]:
    """(FinalizedVersionLevel, Epoch) of ``name`` in ``kafka-features describe``."""
    out = features(b, "describe")
    found = re.search(rf"Feature: {re.escape(name)}\s.*?FinalizedVersionLevel: (\S+)\s+Epoch: (\S+)",
                      out)
    assert found, out
    return found.group(1), found.group(2)


def describe(b: BrokerProcess, transactional_id: str) -> dict[str, str]:
    result = run_kafka_class(KAFKA_TRANSACTIONS, "--bootstrap-server", b.bootstrap, "describe",
                             "--transactional-id", transactional_id)
    assert result.returncode == 0, result.stdout + result.stderr
    header, row = [line.split() for line in result.stdout.strip().splitlines()]
    return dict(zip(header, row))


def completed(b: BrokerProcess, transactional_id: str) -> dict[str, str] | None:
    d = describe(b, transactional_id)
    return d if d["TransactionState"] == "CompleteCommit" else None


def test_java_producer_commits_aborts_and_is_fenced_with_transactions_v2(broker):
    b = broker
    assert finalized(b, "transaction.version") == ("2", "0")
    lines = client(b, "v2-in", "v2-out", "v2-tx", "v2-group", str(PARTITIONS))
    outcomes = [line for line in lines if not line.startswith(("READ", "OFFSET"))]
    assert outcomes[:4] == ["COMMITTED c1", "ABORTED a1", "COMMITTED c2", "COMMITTED copy"]
    assert outcomes[4].split()[0] == "ZOMBIE" and outcomes[4] != "ZOMBIE committed", lines
    assert outcomes[-1] == "COMMITTED c3", lines
    # read_committed: the committed transactions, each partition in order, nothing aborted
    # or fenced
    expected = [f"{txn}-{i}" for p in range(PARTITIONS) for txn in ("c1", "c2", "c3")
                for i in range(4) if i % PARTITIONS == p]
    assert [line[5:] for line in lines if line.startswith("READ ")] == expected
    copied = [f"copy-{txn}-{i}" for p in range(PARTITIONS) for txn in ("c1", "c2")
              for i in range(4) if i % PARTITIONS == p]
    assert [line[9:] for line in lines if line.startswith("READ_OUT ")] == copied
    # the offsets committed with the copy: each input partition's end (c1, a1, c2: two
    # records and a marker each)
    assert [line for line in lines if line.startswith("OFFSET ")] == [f"OFFSET {9 * PARTITIONS}"]
    d = eventually(lambda: completed(b, "v2-tx"), "v2-tx in CompleteCommit", TIMEOUT)
    # epochs: the first producer 0, bumped by its four ends to 4; the second producer's
    # InitProducerId 5, its one commit 6 (V1 would stop at 1)
    assert d["ProducerEpoch"] == "6", d


def test_kafka_features_downgrades_to_v1_and_upgrades_back(broker):
    b = broker
    assert "transaction.version was downgraded to 1." in \
        features(b, "downgrade", "--feature", "transaction.version=1")
    assert finalized(b, "transaction.version") == ("1", "1")
    assert client(b, "v1-in", "-", "v1-tx", "-", str(PARTITIONS), "commits", "2") == \
        ["COMMITTED t0", "COMMITTED t1"]
    d = eventually(lambda: completed(b, "v1-tx"), "v1-tx in CompleteCommit", TIMEOUT)
    assert d["ProducerEpoch"] == "0", d       # V1: EndTxn v4, no bump
    out = features(b, "upgrade", "--feature", "transaction.version=3")
    assert "Invalid update version 3 for feature transaction.version. Local controller 1 only " \
        "supports versions" in out, out
    assert "transaction.version was upgraded to 2." in \
        features(b, "upgrade", "--feature", "transaction.version=2")
    assert finalized(b, "transaction.version") == ("2", "2")
