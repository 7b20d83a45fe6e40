"""``python -m strata.bench.client_bench --smoke`` runs end to end and reports a number for every workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from strata.bench import client_bench

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_client_bench_smoke_reports_every_workload(tmp_path):
    pytest.importorskip("confluent_kafka")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "strata.bench.client_bench", "--smoke", "--json", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["error"] is None
    summary = report["summary"]

    for workload in ("produce-acks1", "produce-acksall", "consume"):
        assert summary[workload]["MiB/s"]["median"] > 0, workload
        assert summary[workload]["records/s"]["median"] > 0, workload
    lat = {k: summary["latency"][k]["median"] for k in ("p50 ms", "p99 ms", "p99.9 ms", "max ms")}
    assert 0 < lat["p50 ms"] <= lat["p99 ms"] <= lat["p99.9 ms"] <= lat["max ms"], lat

    libs, reason = client_bench.find_kafka_libs(None)
    if libs is None:  # the Java tools are optional: skipped, with the reason in the report
        assert set(report["skipped"]) == {"java-produce", "java-consume"}
        assert reason in proc.stdout
    else:
        assert summary["java-produce"]["MiB/s"]["median"] > 0
        assert summary["java-produce"]["records/s"]["median"] > 0
        assert summary["java-consume"]["fetch MiB/s"]["median"] > 0
        assert "ProducerPerformance" in proc.stdout and "ConsumerPerformance" in proc.stdout

    # the markdown table on stdout has a row per workload and the command line
    assert "strata.bench.client_bench --smoke" in proc.stdout
    for _, label, _ in client_bench.REPORT_ROWS:
        assert f"| {label} |" in proc.stdout, label
