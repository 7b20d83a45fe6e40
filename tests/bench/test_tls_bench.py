"""The TLS benchmark (benchmarks/tls.py) at a tiny size against Strata alone: its rounds carry
throughput, CPU per GiB and authenticated connections per second, over the pinned cipher."""

from __future__ import annotations

import json

from benchmarks.tls import CIPHER, ktls_status, main, openssl_name, summarize


def test_the_kernel_tls_check_says_what_it_found():
    status = ktls_status()
    assert {"kernel", "openssl", "python ssl.OP_ENABLE_KTLS", "tcp_available_ulp",
            "setsockopt TCP_ULP tls", "usable"} <= status.keys()
    assert status["usable"] is (status["setsockopt TCP_ULP tls"] == "ok"
                                and status["python ssl.OP_ENABLE_KTLS"])


def test_a_tiny_run_against_strata_reports_every_figure_over_the_pinned_cipher(tmp_path):
    out = tmp_path / "tls.json"
    assert main(["--systems", "strata", "--rounds", "2", "--mib", "2", "--conn-seconds", "0.5",
                 "--conn-clients", "2", "--work-dir", str(tmp_path / "work"),
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["setup"]["strata negotiated"] == {"cipher": openssl_name(CIPHER),
                                                    "version": "TLSv1.2", "bits": 256}
    assert [(r["system"], r["round"]) for r in report["rounds"]] == [("strata", 1), ("strata", 2)]
    for r in report["rounds"]:
        assert r["connections"] > 0 and r["connections/s"] > 0
        assert r["produce MiB/s"] > 0 and r["consume MiB/s"] > 0
        for figure in ("produce broker CPU s/GiB", "consume broker CPU s/GiB",
                       "broker CPU ms/connection", "client CPU ms/connection"):   # CPU is counted in 10 ms ticks: 2 MiB may be 0
            assert r[figure] >= 0, figure
    assert report["summary"] == summarize(report["rounds"])
