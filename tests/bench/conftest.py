"""Every test here is a test of a benchmark harness (the top-level ``benchmarks`` package): each
is marked ``bench``, which ``make test`` leaves out and ``make bench-smoke`` (run by CI after
``make test``) runs."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)   # before ``-m`` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.bench)
