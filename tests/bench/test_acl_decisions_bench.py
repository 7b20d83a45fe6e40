"""The ACL decision benchmark's harness at a tiny size: the bindings it loads, the decision each
scenario expects, and its report (no timing is checked)."""

from __future__ import annotations

from benchmarks import acl_decisions


def test_loads_the_bindings_asked_for_and_every_scenario_decides_as_expected(tmp_path):
    result = acl_decisions.run(bindings_count=300, decisions=50, rounds=1)
    assert result["bindings"] == 300
    assert set(result["scenarios"]) == {"literal-allow", "prefixed-allow", "deny", "no-match",
                                        "super-user", "metadata-1000"}
    assert all(r["us_per_decision"] > 0 for r in result["scenarios"].values())
    text = acl_decisions.report(result)
    assert "300 bindings" in text and "prefixed-allow" in text
    assert acl_decisions.main(["--bindings", "200", "--decisions", "10", "--rounds", "1",
                               "--json", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "r.json").read_text().startswith("{")
