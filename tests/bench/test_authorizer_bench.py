"""The authorizer benchmark (benchmarks/authorizer.py) at a tiny size against Strata alone: both
modes run in alternating rounds as a user that is not a super user, the bindings are all loaded,
and the summary's differences are the medians' and each round's."""

from __future__ import annotations

import json

import pytest

from benchmarks.authorizer import FIGURES, bench_bindings, main, other_bindings, summarize

pytestmark = pytest.mark.bench


def test_the_loaded_bindings_are_distinct_and_as_many_as_asked():
    bindings = bench_bindings() + other_bindings(2000 - len(bench_bindings()))
    assert len(bindings) == 2000
    assert len({str(b) for b in bindings}) == 2000
    assert any(b.name == "team-7." for b in bindings)


def test_a_tiny_run_against_strata_alternates_the_modes_and_reports_every_figure(tmp_path):
    out = tmp_path / "authz.json"
    assert main(["--systems", "strata", "--rounds", "2", "--mib", "2", "--acls", "500",
                 "--work-dir", str(tmp_path / "work"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["setup"]["strata acls"]["bindings"] == 500
    assert [(r["round"], r["mode"]) for r in report["rounds"]] == [
        (1, "off"), (1, "on"), (2, "on"), (2, "off")]
    for r in report["rounds"]:
        assert r["produce MiB/s"] > 0 and r["consume MiB/s"] > 0
        assert r["produce records/s"] > 0 and r["consume records/s"] > 0
        for figure in ("produce broker CPU s/GiB", "consume broker CPU s/GiB"):  # 10 ms ticks: may be 0
            assert r[figure] >= 0, figure
    assert report["summary"] == summarize(report["rounds"])
    strata = report["summary"]["strata"]
    assert set(strata["on vs off %"]) == set(FIGURES)
    assert all(len(v) == 2 for v in strata["per round on vs off %"].values())
