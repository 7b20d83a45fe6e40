"""The rejoin and replication benchmarks' helpers (no broker runs here; the benchmarks themselves
are run by hand, `make bench-rejoin` / `make bench-replication`, and their figures live in
docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import rejoin, replication
from benchmarks.brokers import KafkaBroker, StrataBroker
from benchmarks.workloads import MIB


def _args(**kw) -> argparse.Namespace:
    base = {"segment_mib": 16, "tiered": "on", "local_retention_segments": 3}
    return argparse.Namespace(**{**base, **kw})


def test_a_tiered_topic_keeps_a_few_segments_locally():
    assert rejoin.topic_config(_args()) == {
        "segment.bytes": str(16 * MIB), "remote.storage.enable": "true",
        "local.retention.bytes": str(48 * MIB)}


def test_an_untiered_topic_has_only_its_segment_size():
    assert rejoin.topic_config(_args(tiered="off")) == {"segment.bytes": str(16 * MIB)}


def test_segments_under_a_mebibyte_need_the_internal_setting():
    config = rejoin.topic_config(_args(segment_mib=0.0625, local_retention_segments=2))
    assert config["internal.segment.bytes"] == str(64 * 1024)
    assert "segment.bytes" not in config
    assert config["local.retention.bytes"] == str(128 * 1024)


def test_a_strata_nodes_next_launch_gets_the_property(tmp_path):
    node = StrataBroker(tmp_path / "n", {"a": "1"}, port=1)
    rejoin.set_property(node, rejoin.LAST_TIERED, "true")
    rejoin.set_property(node, rejoin.LAST_TIERED, "false")
    overrides = [node.argv[i + 1] for i, a in enumerate(node.argv) if a == "--override"]
    assert overrides.count(f"{rejoin.LAST_TIERED}=false") == 1
    assert not any(o == f"{rejoin.LAST_TIERED}=true" for o in overrides)
    assert "a=1" in overrides


def test_a_kafka_nodes_properties_file_gets_the_property(tmp_path):
    node = KafkaBroker.__new__(KafkaBroker)    # no format: only the properties file matters
    node.props_path = tmp_path / "server.properties"
    node.props_path.write_text(f"node.id=1\n{rejoin.LAST_TIERED}=false\n")
    rejoin.set_property(node, rejoin.LAST_TIERED, "true")
    assert node.props_path.read_text().splitlines() == ["node.id=1", f"{rejoin.LAST_TIERED}=true"]


def test_tree_bytes_counts_files_or_one_kind(tmp_path):
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / "00000000000000000000.log").write_bytes(b"x" * 100)
    (tmp_path / "t-0" / "00000000000000000000.index").write_bytes(b"x" * 10)
    (tmp_path / "meta.properties").write_bytes(b"x" * 5)
    assert rejoin.tree_bytes(tmp_path) == 115
    assert rejoin.tree_bytes(tmp_path, ".log") == 100


def test_replication_refuses_an_unknown_workload():
    with pytest.raises(SystemExit) as e:
        replication.main(["--system", "strata", "--workloads", "produce,nope"])
    assert e.value.code == 2
