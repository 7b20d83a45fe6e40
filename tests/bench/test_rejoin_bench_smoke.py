"""`python -m benchmarks.rejoin` at a tiny size on Strata (4 MiB, 256 KiB segments, 4 s ZooKeeper
sessions; about 20 s): a wiped follower of a tiered topic rejoins with KIP-1023 off and on, and
fetches only the leader's local tail. Its timings are not checked here (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from zk_server import zookeeper_available

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]


def test_a_wiped_tiered_follower_rejoins_with_only_the_local_tail(tmp_path):
    out = tmp_path / "rejoin.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.rejoin", "--system", "strata", "--tiered", "on",
         "--data-mib", "4", "--segment-mib", "0.25", "--local-retention-segments", "2",
         "--rounds", "1", "--fetch-last-tiered-offset", "both",
         "--override", "zookeeper.session.timeout.ms=4000", "--json", str(out)],
        capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rounds = {r["fetch_last_tiered_offset"]: r for r in result["rounds"]}
    assert set(rounds) == {"off", "on"}
    for r in rounds.values():
        assert r["records"] == 4096
        assert r["ready_s"] <= r["caught_up_s"]
        assert r["follower_log_start"] == 0               # the log starts where the leader's does
        assert r["follower_local_start"] > 0              # but its local part after the remote tier
        assert r["fetched_MiB"] < 2                       # of 4 MiB
    # KIP-1023 starts after the highest tiered offset, at or after the leader's local log start
    assert rounds["on"]["follower_local_start"] >= rounds["off"]["follower_local_start"]
