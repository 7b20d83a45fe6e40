"""The benchmark report: ratios, the docs section it replaces, its charts, and the figure checks."""

from __future__ import annotations

from benchmarks import compare
from benchmarks.compare import Results


def _results() -> Results:
    r = Results()
    for mib in (100.0, 120.0, 110.0):
        r.add("strata", "produce-acks1", {"MiB/s": mib})
    for mib in (200.0, 220.0, 240.0):
        r.add("kafka", "produce-acks1", {"MiB/s": mib})
    r.add("strata", "latency", {"p50 ms": 4.0, "p99 ms": 8.0, "p99.9 ms": 12.0})
    r.add("kafka", "latency", {"p50 ms": 2.0, "p99 ms": 4.0, "p99.9 ms": 6.0})
    return r


def test_table_shows_median_spread_and_strata_over_kafka_ratio():
    table = "\n".join(compare.render_table(_results(), ["strata", "kafka"], ["produce-acks1", "latency"]))
    assert "| produce acks=1 (confluent-kafka) | MiB/s (higher is better) | 110.0 (100.0–120.0) " \
           "| 220.0 (200.0–240.0) | 0.50 |" in table
    assert "| p99 ms (lower is better) | 8.00 (8.00–8.00) | 4.00 (4.00–4.00) | 2.00 |" in table


def test_report_section_is_replaced_between_markers_and_the_rest_kept(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nolder results\n")
    compare.replace_section(doc, "first run")
    compare.replace_section(doc, "second run")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nolder results\n")
    assert "second run" in text and "first run" not in text
    assert text.count(compare.MARK_START) == 1 and text.count(compare.MARK_END) == 1


def test_charts_are_written_as_png(tmp_path):
    paths = compare.draw_charts(_results(), ["strata", "kafka"], ["produce-acks1", "latency"], tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "latency.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figure_checks_catch_missing_workloads_zero_throughput_and_disordered_percentiles():
    r = _results()
    assert compare.check_figures(r, ["strata", "kafka"], ["produce-acks1", "latency"]) == []
    r.add("strata", "consume", {"MiB/s": 0.0})
    r.add("kafka", "latency", {"p50 ms": 5.0, "p99 ms": 3.0, "p99.9 ms": 6.0})
    problems = compare.check_figures(r, ["strata", "kafka"], ["produce-acks1", "latency", "consume"])
    assert "strata consume: MiB/s = 0.0" in problems
    assert "kafka consume: no figures" in problems
    assert "kafka latency: percentiles [5.0, 3.0, 6.0]" in problems


def test_table_and_charts_show_broker_cpu_per_gib_beside_throughput_lower_is_better(tmp_path):
    r = Results()
    r.add("strata", "consume", {"MiB/s": 600.0, "broker CPU s/GiB": 3.0})
    r.add("kafka", "consume", {"MiB/s": 400.0, "broker CPU s/GiB": 1.5})
    table = compare.render_table(r, ["strata", "kafka"], ["consume"])
    assert table[2:] == [
        "| hot consume (confluent-kafka) | MiB/s (higher is better) | 600.0 (600.0–600.0) "
        "| 400.0 (400.0–400.0) | 1.50 |",
        "| hot consume (confluent-kafka) | broker CPU s/GiB (lower is better) | 3.00 (3.00–3.00) "
        "| 1.50 (1.50–1.50) | 2.00 |"]
    paths = compare.draw_charts(r, ["strata", "kafka"], ["consume"], tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "cpu.png"]


def test_each_system_runs_first_in_every_other_round():
    from benchmarks.compare import round_order
    assert [round_order(["strata", "kafka"], r) for r in range(4)] == [
        ["strata", "kafka"], ["kafka", "strata"], ["strata", "kafka"], ["kafka", "strata"]]
    assert round_order(["strata"], 1) == ["strata"]
