"""`python -m benchmarks.fetch_cost` at a tiny size on Strata: a raw reader sweeps the
partition with sequential Fetches, read_uncommitted and read_committed, and the broker's CPU
per Fetch is reported. Its timings are not checked here (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("isolation", [[], ["--read-committed"]])
def test_a_raw_reader_sweeps_the_partition_and_the_broker_cpu_is_reported(tmp_path, isolation):
    out = tmp_path / "fetch-cost.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fetch_cost", "--system", "strata", "--records",
         "3000", "--passes", "2", "--rounds", "1", "--json", str(out), *isolation],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["read_committed"] == bool(isolation)
    (only,) = result["rounds"]
    assert only["fetches"] >= 2 and only["fetches"] % 2 == 0   # every batch start, twice
    assert only["MiB/s"] > 0
    assert only["user us/Fetch"] >= 0 and only["system us/Fetch"] >= 0
