"""The report of ``make bench-spark`` (benchmarks.spark_scan): markdown table and JSON from
given scan figures; no broker, no Spark."""

from __future__ import annotations

import datetime
import json

import pytest

from benchmarks.spark_scan import (
    MODE_LABELS, Params, Scan, Topic, render, report_json, round_speedups, speedup)

DATE = datetime.date(2026, 1, 2)
TOPIC = Topic("bench-spark-scan-x", rows=1_048_576, value_bytes=1_048_576 * 1024,
              remote_segments=16, local_segments=2, remote_bytes=1_000 * 2**20,
              high_watermarks={0: 524_288, 1: 524_288})


def scan(mode: str, rnd: int, seconds: float, remote_fetches: float = 0, gets: float = 0) -> Scan:
    return Scan(mode, rnd, seconds, TOPIC.rows, TOPIC.value_bytes, remote_fetches,
                remote_fetches * 1_048_576, gets)


def three_modes() -> list[Scan]:
    return [scan("direct", 1, 4.0), scan("direct", 2, 5.0), scan("direct", 3, 8.0),
            scan("broker", 1, 10.0, 512, 256), scan("broker", 2, 12.0, 520, 250),
            scan("broker", 3, 11.0, 515, 255),
            scan("connector", 1, 20.0, 1030, 256), scan("connector", 2, 16.0, 1020, 256),
            scan("connector", 3, 18.0, 1025, 260)]


def table_row(report: str, mode: str) -> list[str]:
    line = next(x for x in report.splitlines() if x.startswith(f"| {MODE_LABELS[mode]} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_mode_gets_a_row_of_medians_with_their_range():
    report = render(three_modes(), Params(), TOPIC, "python -m benchmarks.spark_scan",
                    ["2 CPUs"], ["Strata x"], DATE)
    rows = [x for x in report.splitlines() if x.startswith("| ") and "---" not in x]
    assert [r.split("|")[1].strip() for r in rows[1:]] == [MODE_LABELS[m] for m in
                                                           ("direct", "broker", "connector")]
    direct = table_row(report, "direct")
    # rows/s: 1,048,576 rows in 5 s (median), 4 s (max), 8 s (min)
    assert direct[1] == "209,715 (131,072–262,144)"
    # MB/s of values: 1 GiB / 5 s = 214.7 MB/s
    assert direct[2] == "215 (134–268)"
    assert direct[3] == "5.00 (4.00–8.00)"
    assert direct[4] == "0 (0–0)"
    broker = table_row(report, "broker")
    assert broker[4] == "515 (512–520)"          # remote-data Fetch reads: whole numbers
    assert broker[5] == "540 (537–545)"          # MB through the broker (10^6 B)
    assert broker[6] == "255 (250–256)"


def test_the_report_names_the_run_the_setup_and_the_direct_to_connector_ratio():
    report = render(three_modes(), Params(), TOPIC, "python -m benchmarks.spark_scan --gib 1",
                    ["2 CPUs (AMD EPYC)"], ["Strata abc1234", "PySpark 4.0.0"], DATE)
    lines = report.splitlines()
    assert lines[0] == "Run 2026-01-02: `python -m benchmarks.spark_scan --gib 1`"
    assert "- machine: 2 CPUs (AMD EPYC)" in lines
    assert "- PySpark 4.0.0" in lines
    assert any("1,048,576 records of 1024 B in 2 partitions" in x and "64 MiB segments" in x
               and "16 remote" in x for x in lines)
    # medians: connector 18 s, direct 5 s; per round 20/4, 16/5, 18/8
    assert lines[-1] == ("`direct` / connector (median rows/s): **3.60×** (goal ≥ 3×; "
                         "per round: 5.00×, 3.20×, 2.25×); remote-data Fetch reads the broker "
                         "served during `direct` scans: **0** (goal 0).")


def test_a_single_round_shows_plain_figures_and_no_ratio_without_the_connector():
    scans = [scan("direct", 1, 2.0), scan("broker", 1, 4.0, 7, 3)]
    p = Params(rounds=1, modes=("direct", "broker"))
    report = render(scans, p, TOPIC, "cmd", [], [], DATE)
    assert table_row(report, "broker")[1:] == ["262,144", "268", "4.00", "7", "7.34", "3"]
    assert "connector" not in report.split("\n\n")[-1]
    assert not any(x.startswith(f"| {MODE_LABELS['connector']}") for x in report.splitlines())


def test_added_get_latency_is_stated():
    report = render(three_modes(), Params(remote_latency_ms=50), TOPIC, "cmd", [], [], DATE)
    assert "50 ms added to every remote GET" in report
    assert "no added GET latency" in render(three_modes(), Params(), TOPIC, "cmd", [], [], DATE)


def test_json_has_every_scan_with_its_rates_and_the_ratio():
    scans = three_modes()
    doc = json.loads(json.dumps(report_json(scans, Params(), TOPIC, "cmd", ["v"], DATE)))
    assert doc["date"] == "2026-01-02" and doc["command"] == "cmd"
    assert doc["params"]["modes"] == ["direct", "broker", "connector"]
    assert doc["topic"]["high_watermarks"] == {"0": 524_288, "1": 524_288}
    assert len(doc["scans"]) == 9
    first = doc["scans"][0]
    assert first["mode"] == "direct" and first["round"] == 1
    assert first["rows/s"] == TOPIC.rows / 4.0
    assert first["MB/s"] == TOPIC.value_bytes / 4.0 / 1e6
    assert doc["direct/connector"] == speedup(scans, "direct", "connector") == pytest.approx(3.6)
    assert doc["direct/connector per round"] == pytest.approx([5.0, 3.2, 2.25])


def test_per_round_ratios_pair_the_scans_of_each_round_and_skip_unpaired_rounds():
    scans = [scan("direct", 2, 5.0), scan("connector", 1, 10.0), scan("direct", 1, 2.0),
             scan("connector", 2, 20.0), scan("direct", 3, 1.0)]
    assert round_speedups(scans, "direct", "connector") == pytest.approx([5.0, 4.0])
