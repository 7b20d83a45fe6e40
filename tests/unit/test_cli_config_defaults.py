"""The broker reads each config's default from the table DescribeConfigs reports
(``BROKER_CONFIG_KEYS``): every key the broker (``strata.broker.broker``) reads without a default of its own is in
that table, so what the broker runs with and what it describes are one value."""

from __future__ import annotations

import ast
from pathlib import Path

import strata.broker.broker as cli
from strata.cluster.metadata import BROKER_CONFIG_KEYS


def keys_read_with_the_table_default() -> set[str]:
    tree = ast.parse(Path(cli.__file__).read_text())
    keys = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("_int", "_flag") and len(node.args) == 2
                and not node.keywords and isinstance(node.args[1], ast.Constant)):
            keys.add(node.args[1].value)
    return keys


def test_every_default_the_broker_reads_is_one_describe_configs_reports():
    keys = keys_read_with_the_table_default()
    assert {"connections.max.idle.ms", "socket.send.buffer.bytes", "fetch.max.bytes"} <= keys
    missing = sorted(k for k in keys if k not in BROKER_CONFIG_KEYS)
    assert missing == []
    for key in keys:
        assert BROKER_CONFIG_KEYS[key].default is not None, key


def test_unset_keys_take_the_described_default():
    assert cli._int({}, "connections.max.idle.ms") == 600_000
    assert cli._int({"connections.max.idle.ms": "5"}, "connections.max.idle.ms") == 5
    assert cli._flag({}, "auto.leader.rebalance.enable") is True
    off = {"auto.leader.rebalance.enable": "False"}
    assert cli._flag(off, "auto.leader.rebalance.enable") is False
