"""benchmarks.rlmm_scale: its synthetic metadata, loaded through the snapshot path (version 2
columns, lazy caches), answers exactly as the original replay of the records; and the
benchmark's smoke mode runs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from benchmarks import rlmm_scale
from strata.tiered.api import TopicIdPartition, TopicPartition
from strata.tiered.metadata.topic_based import (
    SNAPSHOT_VERSION,
    MetadataSnapshot,
    TopicBasedRemoteLogMetadataManager,
    _encode_snapshot_v1,
    decode_snapshot,
    snapshot_path,
)

REPO = Path(__file__).resolve().parents[2]


def _started(broker: rlmm_scale.BenchBroker, log_dir: Path) -> TopicBasedRemoteLogMetadataManager:
    rlmm = TopicBasedRemoteLogMetadataManager(broker.topic_log)
    rlmm.configure(rlmm_scale.rlmm_configs(log_dir))
    rlmm.start()
    return rlmm


def _is_lazy(rlmm: TopicBasedRemoteLogMetadataManager, tip: TopicIdPartition) -> bool:
    copy = rlmm.cache_copy(tip)
    return copy is not None and copy.is_lazy()


def test_snapshot_path_answers_as_the_full_replay_on_20000_generated_segments(tmp_path):
    data = tmp_path / "data"
    info = rlmm_scale.generate(data, 20_000, 40, seed=5, log=lambda _msg: None)
    assert info["records"] == 40_000
    tips = [TopicIdPartition(uuid.UUID(t), TopicPartition(name, p)) for t, name, p in info["tips"]]
    files = sorted((data / "remote-log-metadata-snapshots").iterdir())
    assert files and all(decode_snapshot(f.read_bytes()).next_offset > 0 for f in files)

    broker = rlmm_scale.BenchBroker(data)
    fast = _started(broker, data)                      # version 2 snapshots, lazy caches
    replay = _started(broker, tmp_path / "empty")       # the records, one by one
    assert fast.replayed_records == 0 and len(fast.snapshot_offsets) == len(files)
    assert replay.replayed_records == 40_000 and replay.skipped_records == 0

    # the benchmark's random lookups, and every segment's first and last offset in the epochs
    # around it (answers, misses and epoch boundaries alike)
    for i, epoch, offset, start, end in info["lookups"]:
        found = fast.remote_log_segment_metadata(tips[i], epoch, offset)
        assert found == replay.remote_log_segment_metadata(tips[i], epoch, offset)
        assert (found.start_offset, found.end_offset) == (start, end)
    checked = 0
    for tip in tips:
        lazy, full = fast.cache_copy(tip), replay.cache_copy(tip)  # the caches behind them
        assert lazy.is_lazy() and not full.is_lazy()
        segments = full.list_remote_log_segments()
        epochs = sorted({e for m in segments for e in m.segment_leader_epochs})
        for epoch in range(epochs[0] - 1, epochs[-1] + 2):
            assert lazy.highest_offset_for_epoch(epoch) == full.highest_offset_for_epoch(epoch)
        for m in segments:
            for epoch in (*m.segment_leader_epochs, min(m.segment_leader_epochs) - 1):
                for offset in (m.start_offset - 1, m.start_offset, m.end_offset, m.end_offset + 1):
                    expected = full.remote_log_segment_metadata(epoch, offset)
                    assert lazy.remote_log_segment_metadata(epoch, offset) == expected
                    checked += expected is not None
        assert lazy.is_lazy() and _is_lazy(fast, tip)  # none of that materialised anything
    assert checked > 40_000

    # materialised (a listing does it), everything is the same too
    for tip in tips:
        assert list(fast.list_remote_log_segments(tip)) == list(replay.list_remote_log_segments(tip))
        assert not _is_lazy(fast, tip)
        assert fast.cache_copy(tip) == replay.cache_copy(tip)
    for i, epoch, offset, _, _ in info["lookups"][:2000]:
        assert fast.remote_log_segment_metadata(tips[i], epoch, offset) == \
            replay.remote_log_segment_metadata(tips[i], epoch, offset)

    # and a version 1 snapshot of the same state still loads to the same caches
    v1_dir = tmp_path / "v1"
    mp = fast.metadata_partition(tips[0])
    snapshot = decode_snapshot(snapshot_path(data, mp).read_bytes())
    assert snapshot == MetadataSnapshot(snapshot.metadata_partition, snapshot.next_offset,
                                        snapshot.last_value_crc, snapshot.partitions, snapshot.delete_states)
    snapshot_path(v1_dir, mp).parent.mkdir(parents=True)
    snapshot_path(v1_dir, mp).write_bytes(_encode_snapshot_v1(snapshot))
    old = _started(broker, v1_dir)
    assert old.snapshot_offsets == {mp: snapshot.next_offset}
    for tip, _, _ in snapshot.partitions:
        assert not _is_lazy(old, tip)
        assert old.cache_copy(tip) == replay.cache_copy(tip)
    old.close()  # rewrites the version 1 file in the current format
    assert snapshot_path(v1_dir, mp).read_bytes()[4:6] == SNAPSHOT_VERSION.to_bytes(2, "big")
    assert decode_snapshot(snapshot_path(v1_dir, mp).read_bytes()) == snapshot
    for rlmm in (fast, replay):
        rlmm.close()
    broker.shutdown()


def test_the_benchmark_smoke_mode_runs(tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.rlmm_scale", "--segments", "2000",
                           "--rounds", "1", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    report = json.loads(out.read_text())
    assert [r["mode"] for r in printed] == [r["mode"] for r in report["rounds"]] == ["snapshot", "replay"]
    snapshot, replay = printed
    assert snapshot["snapshots_loaded"] == 50 and snapshot["replayed_records"] == 0
    assert replay["snapshots_loaded"] == 0 and replay["replayed_records"] == 4000
    for r in printed:
        assert r["lookup_mismatches"] == 0
        assert r["segments_listed"] == 2000
        assert r["to_first_lookup_s"] >= r["start_s"] > 0
        assert r["hwm_mib"] >= r["rss_after_start_mib"] > 0
        assert r["lookups"]["warm"]["p50_us"] > 0
    assert report["dataset"]["segments"] == 2000 and report["dataset"]["partitions"] == 1000
