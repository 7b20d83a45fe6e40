"""The log cleaner against a model: the latest record per key survives at its offset."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from strata.common.clock import MockClock
from strata.common.types import TopicPartition
from strata.log.log_cleaner import (
    CLEANER_CHECKPOINT_FILENAME, Cleaner, LogCleaner, OffsetMap, log_to_clean)
from strata.log.log_config import LogConfig
from strata.log.segment import LOG_SUFFIX
from strata.log.unified_log import UnifiedLog
from strata.protocol import records as rec
from strata.protocol.records import Compression, SimpleRecord, build_batch
from support.waiting import eventually

T0 = 1_700_000_000_000
TP = TopicPartition("compacted", 0)
DELETE_RETENTION_MS = 60_000


def compacted_config(**kw) -> LogConfig:
    props = {"cleanup.policy": "compact", "internal.segment.bytes": 600,
             "delete.retention.ms": DELETE_RETENTION_MS, "file.delete.delay.ms": 0}
    props.update({k.replace("_", "."): v for k, v in kw.items()})
    return LogConfig(props)


def open_log(directory: Path, clock: MockClock, **kw) -> UnifiedLog:
    return UnifiedLog(directory / "compacted-0", compacted_config(**kw), clock=clock)


def stored(ulog: UnifiedLog) -> list[tuple[rec.BatchHeader, list[rec.Record]]]:
    """Every batch on disk; under the log lock, as a cleaner thread may swap segments (and,
    with file.delete.delay.ms=0, delete the old ones at once)."""
    out = []
    with ulog.lock:
        for seg in ulog.local_log.segments:
            for h, block, _ in seg.iter_batches(0):
                out.append((h, rec.decode_batch(block, h, check_crc=True)))
    return out


def stored_records(ulog: UnifiedLog) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, r.key, r.value) for _, rs in stored(ulog) for r in rs]


def append(ulog: UnifiedLog, batches, *, compression=Compression.NONE, **kw) -> None:
    for items in batches:
        ulog.append_as_leader(build_batch([SimpleRecord(v, k, timestamp=T0) for k, v in items],
                                          compression=compression, **kw), 0)
    ulog.update_high_watermark(ulog.log_end_offset)


def clean(ulog: UnifiedLog, clock: MockClock, checkpoint: int | None = None) -> int:
    cleaner = Cleaner(OffsetMap(1 << 20), clock=clock)
    end, _ = cleaner.clean(log_to_clean(TP, ulog, checkpoint, clock.milliseconds()))
    return end


def latest_per_key(records) -> list[tuple[int, bytes, bytes | None]]:
    latest = {}
    for offset, key, value in records:
        latest[key] = (offset, key, value)
    return sorted(latest.values())


keyed_batches = st.lists(
    st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                       st.one_of(st.none(), st.binary(min_size=1, max_size=20))),
             min_size=1, max_size=6),
    min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=keyed_batches, codec=st.sampled_from([Compression.NONE, Compression.ZSTD,
                                                      Compression.LZ4, Compression.GZIP]))
def test_cleaning_keeps_exactly_the_latest_record_per_key_at_its_offset(batches, codec):
    with tempfile.TemporaryDirectory() as d:
        clock = MockClock(T0)
        ulog = open_log(Path(d), clock)
        append(ulog, batches, compression=codec)
        before = stored_records(ulog)
        ulog.roll()
        end = clean(ulog, clock)
        assert end == ulog.log_end_offset
        after = stored_records(ulog)
        # tombstones stay until their delete horizon
        assert after == latest_per_key(before)
        for h, records in stored(ulog):
            assert h.compression == codec
            if any(r.value is None for r in records):
                assert h.attributes & rec.DELETE_HORIZON_MASK
                assert h.base_timestamp == T0 + DELETE_RETENTION_MS
        ulog.close()


def test_tombstones_are_removed_once_their_delete_horizon_passed(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"a", b"1"), (b"b", b"1")], [(b"a", None)]])
    ulog.roll()
    end = clean(ulog, clock)
    assert stored_records(ulog) == [(1, b"b", b"1"), (2, b"a", None)]
    clock.advance_ms(DELETE_RETENTION_MS)
    append(ulog, [[(b"c", b"1")]])
    ulog.roll()
    clean(ulog, clock, checkpoint=end)
    assert stored_records(ulog) == [(1, b"b", b"1"), (3, b"c", b"1")]


def test_the_last_batch_of_an_idempotent_producer_is_kept_empty(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"a", b"1")]], producer_id=7, producer_epoch=0, base_sequence=0)
    append(ulog, [[(b"a", b"2")]])
    ulog.roll()
    clean(ulog, clock)
    batches = stored(ulog)
    assert [(h.base_offset, h.producer_id, h.base_sequence, h.record_count)
            for h, _ in batches] == [(0, 7, 0, 0), (1, -1, -1, 1)]
    assert stored_records(ulog) == [(1, b"a", b"2")]


def test_offsets_are_kept_and_partially_retained_batches_keep_their_offset_range(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], [(b"b", b"2")]],
           compression=Compression.SNAPPY)
    ulog.roll()
    clean(ulog, clock)
    h, records = stored(ulog)[0]
    assert (h.base_offset, h.last_offset, h.record_count) == (0, 2, 2)
    assert [(r.offset, r.key) for r in records] == [(0, b"a"), (2, b"c")]
    assert h.compression == Compression.SNAPPY


def test_the_active_segment_and_offsets_above_the_high_watermark_are_never_cleaned(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"a", b"1")], [(b"a", b"2")]])
    end = clean(ulog, clock)   # everything is in the active segment
    assert end == 0 and len(stored_records(ulog)) == 2
    ulog.roll()
    ulog.append_as_leader(build_batch([SimpleRecord(b"3", b"a", timestamp=T0)]), 0)
    ulog.update_high_watermark(1)
    assert clean(ulog, clock) == 1     # offset 1 is above the high watermark: kept
    assert [o for o, _, _ in stored_records(ulog)] == [0, 1, 2]
    ulog.update_high_watermark(3)
    assert clean(ulog, clock, checkpoint=1) == 2     # offset 2 is in the active segment
    assert stored_records(ulog) == [(1, b"a", b"2"), (2, b"a", b"3")]


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path):
    clock = MockClock(T0 + 1000)
    ulog = open_log(tmp_path, clock, min_compaction_lag_ms=10_000)
    append(ulog, [[(b"a", b"1")], [(b"a", b"2")]])
    ulog.roll()
    assert clean(ulog, clock) == 0
    clock.advance_ms(10_000)
    assert clean(ulog, clock) == 2
    assert stored_records(ulog) == [(1, b"a", b"2")]


def test_small_cleaned_segments_are_grouped_into_one(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    for i in range(30):
        append(ulog, [[(b"k", b"%04d" % i)] * 5])
    ulog.roll()
    rolled = ulog.local_log.segment_count()
    assert rolled > 5
    end = clean(ulog, clock)     # groups are sized by the segments before cleaning
    assert ulog.local_log.segment_count() == rolled
    append(ulog, [[(b"j", b"1")]])
    ulog.roll()
    clean(ulog, clock, checkpoint=end)    # now small: one group
    assert ulog.local_log.segment_count() == 2
    assert stored_records(ulog) == [(149, b"k", b"0029"), (150, b"j", b"1")]
    assert sorted(p.name for p in ulog.directory.glob(f"*{LOG_SUFFIX}*")) == \
        sorted(s.log_path.name for s in ulog.local_log.segments)


def test_a_cleaned_log_reloads_with_the_same_records(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"a", b"1"), (b"b", b"1")], [(b"a", b"2")], [(b"c", None)]])
    ulog.roll()
    clean(ulog, clock)
    expected = stored_records(ulog)
    ulog.close()
    for clean_shutdown in (True, False):
        reopened = UnifiedLog(ulog.directory, compacted_config(), clock=clock,
                              had_clean_shutdown=clean_shutdown)
        assert stored_records(reopened) == expected
        assert reopened.log_end_offset == 4
        reopened.close()


def test_log_cleaner_picks_the_dirtiest_log_and_writes_its_checkpoint(tmp_path):
    clock = MockClock(T0)
    logs = {}
    for p, dirty in ((0, 2), (1, 20)):
        tp = TopicPartition("compacted", p)
        ulog = UnifiedLog(tmp_path / f"compacted-{p}", compacted_config(), clock=clock)
        append(ulog, [[(b"k", b"%d" % i)] for i in range(dirty)] + [[(b"x%d" % i, b"v")]
                                                                       for i in range(5)])
        ulog.roll()
        logs[tp] = ulog
    plain = UnifiedLog(tmp_path / "plain-0", LogConfig({}), clock=clock)
    append(plain, [[(b"k", b"v")]] * 5)
    plain.roll()
    cleaner = LogCleaner(lambda: [(tmp_path, tp, ulog) for tp, ulog in logs.items()] +
                         [(tmp_path, TopicPartition("plain", 0), plain)], clock=clock)
    LogCleaner.checkpoint_file(tmp_path).write({TopicPartition("compacted", 0): 5})
    picked = cleaner.grab_filthiest()
    assert picked is not None and picked[1].topic_partition == TopicPartition("compacted", 1)
    cleaner._in_progress.clear()
    worker = Cleaner(OffsetMap(1 << 20), clock=clock)
    assert cleaner.clean_once(worker) and cleaner.clean_once(worker)
    assert not cleaner.clean_once(worker)    # nothing dirty is left
    text = (tmp_path / CLEANER_CHECKPOINT_FILENAME).read_text().splitlines()
    assert text[:2] == ["0", "2"]
    assert sorted(text[2:]) == ["compacted 0 7", "compacted 1 25"]
    assert len(stored_records(plain)) == 5


def crash_test_log(directory: Path) -> tuple[int, int]:
    """A log cleaned once (tombstones with a horizon), then dirtied again: (now, checkpoint)."""
    clock = MockClock(T0)
    ulog = open_log(directory, clock)
    append(ulog, [[(b"k%d" % (i % 7), b"v%d" % i), (b"t%d" % (i % 3), b"old")] for i in range(20)])
    append(ulog, [[(b"t0", None), (b"t1", None)]])
    ulog.roll()
    end = clean(ulog, clock)
    append(ulog, [[(b"k%d" % (i % 5), b"w%d" % i)] for i in range(15)])
    ulog.roll()
    ulog.close()
    return T0 + 2 * DELETE_RETENTION_MS, end


def run_child(log_dir: Path, now: int, checkpoint: int, kill_at: int):
    import subprocess
    import sys
    child = Path(__file__).with_name("cleaner_crash_child.py")
    return subprocess.run([sys.executable, str(child), str(log_dir), str(now), str(checkpoint),
                           str(kill_at)], capture_output=True, text=True, timeout=120)


def test_a_clean_killed_at_any_file_operation_reloads_old_or_new_never_a_mix(tmp_path):
    import shutil
    template = tmp_path / "template"
    now, checkpoint = crash_test_log(template)
    log_dir = template / "compacted-0"
    clock = MockClock(now)
    original = stored_records(UnifiedLog(log_dir, compacted_config(), clock=clock))
    full = tmp_path / "full" / "compacted-0"
    shutil.copytree(log_dir, full)
    done = run_child(full, now, checkpoint, 0)
    assert done.returncode == 0, done.stderr
    operations = int(done.stdout)
    cleaned = stored_records(UnifiedLog(full, compacted_config(), clock=clock))
    assert len(cleaned) < len(original)
    assert not any(k in (b"t0", b"t1") for _, k, _ in cleaned)   # tombstones went this time
    latest = {k: (o, v) for o, k, v in original}
    for n in range(1, operations + 1):
        crashed = tmp_path / f"crash-{n}" / "compacted-0"
        shutil.copytree(log_dir, crashed)
        killed = run_child(crashed, now, checkpoint, n)
        assert killed.returncode == -9, (n, killed.stderr)
        got = stored_records(UnifiedLog(crashed, compacted_config(), clock=clock,
                                        had_clean_shutdown=False))
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), n
        assert set(cleaned) <= set(got) <= set(original), n       # nothing lost, nothing new
        newest = {k: (o, v) for o, k, v in got}
        for key, (offset, value) in latest.items():
            if value is None:
                assert newest.get(key, (offset, None)) == (offset, None), (n, key)
            else:
                assert newest[key] == (offset, value), (n, key)
        shutil.rmtree(crashed.parent)


def test_max_compaction_lag_rolls_the_segment_and_forces_a_clean_below_the_dirty_ratio(tmp_path):
    clock = MockClock(T0 + 10_000)
    ulog = open_log(tmp_path, clock, max_compaction_lag_ms=1000, min_cleanable_dirty_ratio=0.99,
                    internal_segment_bytes=1_000_000)
    for i in range(3):
        ulog.append_as_leader(build_batch([SimpleRecord(b"%d" % i, b"k%d" % i,
                                                        timestamp=T0 + 1500 * i)]), 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    assert [s.base_offset for s in ulog.local_log.segments] == [0, 1, 2]   # rolled on lag
    ltc = log_to_clean(TP, ulog, 1, clock.milliseconds())
    assert ltc.needs_compaction_now and ltc.cleanable_ratio < 0.99
    cleaner = LogCleaner(lambda: [(tmp_path, TP, ulog)], clock=clock)
    assert cleaner.clean_once(Cleaner(OffsetMap(1 << 20), clock=clock))


def test_the_throttler_holds_io_to_the_configured_rate():
    from strata.log.log_cleaner import Throttler
    clock = MockClock(T0)
    slept = []
    throttler = Throttler(1000, clock, sleep=slept.append)
    throttler.maybe_throttle(500)
    throttler.maybe_throttle(1500)
    assert slept == [0.5, 2.0]


def test_cleaner_threads_compact_in_the_background_until_shut_down(tmp_path):
    ulog = UnifiedLog(tmp_path / "compacted-0", compacted_config())
    append(ulog, [[(b"k", b"%d" % i)] for i in range(50)])
    ulog.roll()
    cleaner = LogCleaner.from_properties({"log.cleaner.backoff.ms": "10",
                                          "log.cleaner.threads": "2"},
                                         lambda: [(tmp_path, TP, ulog)])
    cleaner.startup()
    try:
        eventually(lambda: len(stored_records(ulog)) <= 1
                   and "cleaner-recopy-percent" in cleaner.metrics(),   # recorded after the swap
                   "the log cleaned and its stats recorded", 30)
        assert stored_records(ulog) == [(49, b"k", b"49")]
        assert cleaner.metrics()["cleaner-recopy-percent"] < 10   # 1 record of 50 kept
    finally:
        cleaner.shutdown()
    assert LogCleaner.from_properties({"log.cleaner.enable": "false"}, lambda: []) is None


def test_aborted_data_goes_and_its_marker_after_the_delete_horizon(tmp_path):
    from strata.log.producer_state import AppendOrigin
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)

    def txn(key: bytes, seq: int, control: int) -> None:
        ulog.append_as_leader(build_batch([SimpleRecord(b"x", key, timestamp=T0)], producer_id=5,
                                          producer_epoch=0, base_sequence=seq,
                                          transactional=True), 0)
        ulog.append_as_leader(rec.build_control_batch(control, producer_id=5, producer_epoch=0,
                                                      timestamp=T0),
                              0, origin=AppendOrigin.COORDINATOR)

    txn(b"a", 0, rec.CONTROL_ABORT)     # offsets 0, 1
    txn(b"z", 1, rec.CONTROL_COMMIT)    # offsets 2, 3
    end = 4

    def clean_more(key: bytes) -> list[rec.BatchHeader]:
        nonlocal end
        append(ulog, [[(key, b"1")]])
        ulog.roll()
        end = clean(ulog, clock, checkpoint=end)
        return [h for h, _ in stored(ulog)]

    # the aborted record goes; its marker stays while data of its txn was seen
    assert [h.base_offset for h in clean_more(b"b")] == [1, 2, 3, 4]
    # no data of the txn is left: the abort marker gets a delete horizon
    marker = clean_more(b"c")[0]
    assert marker.is_control and marker.attributes & rec.DELETE_HORIZON_MASK
    assert marker.base_timestamp == T0 + DELETE_RETENTION_MS
    clock.advance_ms(DELETE_RETENTION_MS)
    # past it the marker goes; the committed txn and its marker stay
    assert [(h.base_offset, h.is_control) for h in clean_more(b"d")] == \
        [(2, False), (3, True), (4, False), (5, False), (6, False)]


def test_cleaner_metrics_are_exported_with_kafkas_names(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from strata.server.log_cleaner_metrics import LogCleanerCollector
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    append(ulog, [[(b"k", b"%d" % i)] for i in range(4)])
    ulog.roll()
    cleaner = LogCleaner(lambda: [(tmp_path, TP, ulog)], clock=clock)
    assert cleaner.clean_once(Cleaner(OffsetMap(1 << 20), clock=clock))
    clock.advance_ms(5)
    registry = CollectorRegistry()
    registry.register(LogCleanerCollector(cleaner))
    text = generate_latest(registry).decode()
    assert "kafka_log_LogCleanerManager_max_dirty_percent 100.0" in text
    assert "kafka_log_LogCleanerManager_time_since_last_run_ms 5.0" in text
    assert "kafka_log_LogCleaner_cleaner_recopy_percent 25.0" in text
    assert "kafka_log_LogCleaner_DeadThreadCount 0.0" in text


def test_a_reader_never_finds_a_gap_while_cleaned_segments_are_swapped_in(tmp_path, monkeypatch):
    """Each old segment leaves the segment map only after the cleaned one covers its offsets
    (Kafka's replaceSegments order): a Fetch during the swap never skips offsets."""
    from strata.log.segment import LogSegment
    ulog = UnifiedLog(tmp_path / "compacted-0", compacted_config())
    append(ulog, [[(b"k%d" % (i % 3), b"%d" % i)] for i in range(60)])
    ulog.roll()
    seen = []
    rename = LogSegment.change_file_suffixes

    def watched(seg, old, new):
        if new == ".deleted":   # an old segment leaving: who serves its first offset now?
            floor = [s for s in ulog.local_log.segments if s.base_offset <= seg.base_offset][-1]
            seen.append((seg.base_offset, floor is not seg and floor.log_path.name.endswith(".swap")))
        rename(seg, old, new)
    monkeypatch.setattr(LogSegment, "change_file_suffixes", watched)
    clock = MockClock(T0)
    cleaner = LogCleaner(lambda: [(tmp_path, TP, ulog)], clock=clock)
    assert cleaner.clean_once(Cleaner(OffsetMap(1 << 20), clock=clock))
    assert len(seen) > 1 and all(ok for _, ok in seen), seen
    assert [r[1:] for r in stored_records(ulog)] == [(b"k0", b"57"), (b"k1", b"58"), (b"k2", b"59")]


# ---- uncleanable partitions and max-compaction-delay-secs (Kafka's LogCleanerManager) --------

def corrupt_first_batch(ulog: UnifiedLog) -> bytes:
    """Flip a byte of the first batch's last record, so its CRC no longer matches; returns the
    first segment's bytes after the flip."""
    seg = ulog.local_log.segments[0]
    with open(seg.log_path, "r+b") as f:
        h = rec.read_header(f.read(rec.HEADER_SIZE), 0)
        f.seek(h.size - 2)
        byte = f.read(1)[0]
        f.seek(h.size - 2)
        f.write(bytes([byte ^ 0xFF]))
        f.seek(0)
        return f.read()


def dirty_log(directory: Path, clock: MockClock, partition: int, n: int = 20, **kw) -> UnifiedLog:
    ulog = UnifiedLog(directory / f"compacted-{partition}", compacted_config(**kw), clock=clock)
    append(ulog, [[(b"k%d" % (i % 3), b"v%d" % i)] for i in range(n)])
    ulog.roll()
    return ulog


def uncleanable_warnings(caplog) -> list:
    return [r for r in caplog.records
            if r.levelname == "WARNING" and "uncleanable" in r.getMessage()]


def test_a_partition_whose_clean_hits_a_corrupt_batch_is_marked_uncleanable_counted_and_skipped(
        tmp_path, caplog):
    import logging
    from prometheus_client import CollectorRegistry, generate_latest
    from strata.common.errors import CorruptRecordError
    from strata.server.log_cleaner_metrics import LogCleanerCollector
    caplog.set_level(logging.INFO, logger="strata.log.log_cleaner")
    clock = MockClock(T0)
    bad, good = dirty_log(tmp_path, clock, 0), dirty_log(tmp_path, clock, 1)
    bad_tp, good_tp = TopicPartition("compacted", 0), TopicPartition("compacted", 1)
    corrupted = corrupt_first_batch(bad)
    first_segment = bad.local_log.segments[0].log_path
    bad_bytes = sum(s.size for s in bad.local_log.segments[:-1])
    logs = [(tmp_path, bad_tp, bad), (tmp_path, good_tp, good)]   # equally dirty: bad first
    cleaner = LogCleaner(lambda: logs, clock=clock)
    worker = Cleaner(OffsetMap(1 << 20), clock=clock)

    assert not cleaner.clean_once(worker)     # the clean raised: marked, not retried at once
    assert cleaner.uncleanable_partitions(tmp_path) == {bad_tp}
    [warning] = uncleanable_warnings(caplog)
    assert warning.exc_info and isinstance(warning.exc_info[1], CorruptRecordError)
    assert "compacted-0" in warning.getMessage()
    assert first_segment.read_bytes() == corrupted           # left as it was
    assert not list(bad.directory.glob("*.cleaned"))

    assert cleaner.clean_once(worker)         # the other compacted partition is still cleaned
    assert stored_records(good) == [(17, b"k2", b"v17"), (18, b"k0", b"v18"), (19, b"k1", b"v19")]
    assert not cleaner.clean_once(worker)     # the uncleanable one is skipped from now on
    assert not cleaner.clean_once(worker)
    assert len(uncleanable_warnings(caplog)) == 1            # logged once
    assert first_segment.read_bytes() == corrupted
    assert cleaner.uncleanable_partitions(tmp_path) == {bad_tp}
    assert cleaner.metrics()["max-dirty-percent"] == 0       # its dirt is not counted either

    log_dir = str(tmp_path.absolute())
    assert cleaner.log_dir_metrics() == {"uncleanable-partitions-count": {log_dir: 1},
                                         "uncleanable-bytes": {log_dir: bad_bytes}}
    registry = CollectorRegistry()
    registry.register(LogCleanerCollector(cleaner))
    text = generate_latest(registry).decode()
    assert f'kafka_log_LogCleanerManager_uncleanable_partitions_count{{logDirectory="{log_dir}"}} ' \
        f'1.0' in text
    assert f'kafka_log_LogCleanerManager_uncleanable_bytes{{logDirectory="{log_dir}"}} ' \
        f'{float(bad_bytes)}' in text


def test_an_uncleanable_mark_goes_with_its_log_deleted_recreated_or_a_broker_restart(tmp_path):
    import shutil
    clock = MockClock(T0)
    bad = dirty_log(tmp_path, clock, 0)
    corrupt_first_batch(bad)
    logs = [(tmp_path, TP, bad)]
    cleaner = LogCleaner(lambda: logs, clock=clock, log_dirs=[tmp_path, tmp_path / "other"])
    worker = Cleaner(OffsetMap(1 << 20), clock=clock)
    assert not cleaner.clean_once(worker)
    assert cleaner.uncleanable_partitions(tmp_path) == {TP}
    counts = cleaner.log_dir_metrics()["uncleanable-partitions-count"]
    assert counts == {str(tmp_path.absolute()): 1, str((tmp_path / "other").absolute()): 0}

    # a broker restart: a new cleaner tries the partition again (and marks it again)
    restarted = LogCleaner(lambda: logs, clock=clock)
    assert restarted.grab_filthiest() is not None
    restarted._in_progress.clear()
    assert not restarted.clean_once(worker)
    assert restarted.uncleanable_partitions(tmp_path) == {TP}

    # the partition deleted: the mark goes, and is not counted any more
    logs.clear()
    bad.close()
    shutil.rmtree(bad.directory)
    cleaner.maintain_uncleanable_partitions()
    assert cleaner.uncleanable_partitions(tmp_path) == set()
    assert cleaner.log_dir_metrics()["uncleanable-partitions-count"][str(tmp_path.absolute())] \
        == 0
    # ...and the partition created again is cleaned as any other
    logs.append((tmp_path, TP, dirty_log(tmp_path, clock, 0)))
    assert restarted.clean_once(worker)      # a new log of the partition: not skipped
    assert [k for _, k, _ in stored_records(logs[0][2])] == [b"k2", b"k0", b"k1"]


def test_a_cleaner_thread_does_not_spin_on_an_uncleanable_partition(tmp_path, monkeypatch):
    import time
    clock = MockClock(T0)
    bad, good = dirty_log(tmp_path, clock, 0), dirty_log(tmp_path, clock, 1)
    corrupt_first_batch(bad)
    attempts = []
    clean = Cleaner.clean

    def counted(self, ltc):
        attempts.append(ltc.topic_partition.partition)
        return clean(self, ltc)
    monkeypatch.setattr(Cleaner, "clean", counted)
    cleaner = LogCleaner.from_properties(
        {"log.cleaner.backoff.ms": "5", "log.dirs": str(tmp_path)},
        lambda: [(tmp_path, TopicPartition("compacted", 0), bad),
                 (tmp_path, TopicPartition("compacted", 1), good)], clock=clock)
    cleaner.startup()
    try:
        eventually(lambda: len(stored_records(good)) <= 3, "the good log cleaned", 30)
        time.sleep(0.3)     # 60 backoffs: a thread retrying the corrupt log would show here
    finally:
        cleaner.shutdown()
    assert len(stored_records(good)) == 3
    assert attempts.count(0) == 1 and attempts.count(1) == 1
    assert cleaner.metrics()["DeadThreadCount"] == 0
    assert cleaner.log_dir_metrics()["uncleanable-partitions-count"] == \
        {str(tmp_path.absolute()): 1}


def test_max_compaction_delay_secs_is_how_late_the_last_pick_found_the_oldest_dirty_record(
        tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from strata.server.log_cleaner_metrics import LogCleanerCollector
    clock = MockClock(T0)
    late = UnifiedLog(tmp_path / "compacted-0",
                      compacted_config(max_compaction_lag_ms=1000, min_cleanable_dirty_ratio=0.1),
                      clock=clock)
    append(late, [[(b"k", b"%d" % i)] for i in range(3)])     # records stamped T0
    late.roll()
    on_time = dirty_log(tmp_path, clock, 1)                   # no max.compaction.lag.ms
    logs = [(tmp_path, TopicPartition("compacted", 1), on_time),    # picked first
            (tmp_path, TopicPartition("compacted", 0), late)]
    cleaner = LogCleaner(lambda: logs, clock=clock)
    worker = Cleaner(OffsetMap(1 << 20), clock=clock)
    assert cleaner.metrics()["max-compaction-delay-secs"] == 0

    clock.advance_ms(10_500)       # 9.5 s past the 1 s lag
    assert log_to_clean(TopicPartition("compacted", 0), late, None,
                        clock.milliseconds()).compaction_delay_ms == 9_500
    assert log_to_clean(TopicPartition("compacted", 1), on_time, None,
                        clock.milliseconds()).compaction_delay_ms == 0
    assert cleaner.clean_once(worker)      # on_time cleaned; late was seen 9.5 s late
    assert cleaner.metrics()["max-compaction-delay-secs"] == 9     # whole seconds, as Kafka
    registry = CollectorRegistry()
    registry.register(LogCleanerCollector(cleaner))
    assert "kafka_log_LogCleaner_max_compaction_delay_secs 9.0" in \
        generate_latest(registry).decode()

    assert cleaner.clean_once(worker)      # late cleaned: still 9.5 s late when picked
    assert cleaner.metrics()["max-compaction-delay-secs"] == 9
    assert not cleaner.clean_once(worker)
    assert cleaner.metrics()["max-compaction-delay-secs"] == 9     # no pick: the last one's
    # dirty again with a fresh record: the next pick finds nothing late
    late.append_as_leader(build_batch([SimpleRecord(b"new", b"k",
                                                    timestamp=clock.milliseconds())]), 0)
    late.update_high_watermark(late.log_end_offset)
    late.roll()
    assert cleaner.clean_once(worker)
    assert cleaner.metrics()["max-compaction-delay-secs"] == 0


def test_a_clean_ends_past_a_trailing_transaction_marker_so_an_idle_log_is_not_picked_again(tmp_path):
    """Kafka's updateLatestOffset: markers count as read. Before, the clean ended at the last
    keyed record, the marker stayed dirty and a cleaner thread re-cleaned the idle log at once,
    in a loop (exactly-once Kafka Connect's offsets topic: 530 identical cleans in a row)."""
    from strata.log.producer_state import AppendOrigin
    clock = MockClock(T0)
    ulog = open_log(tmp_path, clock)
    for seq in range(3):
        ulog.append_as_leader(build_batch([SimpleRecord(b"v%d" % seq, b"k", timestamp=T0)],
                                          producer_id=5, producer_epoch=0, base_sequence=seq,
                                          transactional=True), 0)
        ulog.append_as_leader(rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=5,
                                                      producer_epoch=0, timestamp=T0),
                              0, origin=AppendOrigin.COORDINATOR)
    ulog.update_high_watermark(ulog.log_end_offset)
    ulog.roll()
    end = clean(ulog, clock)
    assert end == 6                          # past the last marker (offset 5)
    again = log_to_clean(TP, ulog, end, clock.milliseconds())
    assert again.first_dirty_offset == again.first_uncleanable_offset   # nothing left to clean
    assert [(r.key, r.value) for h, rs in stored(ulog) if not h.is_control for r in rs] == \
        [(b"k", b"v2")]
