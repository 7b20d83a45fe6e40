"""Behaviour of the local log: append, read, roll, retention, recovery, corruption."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from strata.common.clock import MockClock
from strata.common.errors import (
    ErrorCode, InvalidProducerEpochError, KafkaError, OffsetOutOfRangeError,
    OutOfOrderSequenceError)
from strata.common.types import TopicPartition
from strata.log.checkpoint import OffsetCheckpointFile
from strata.log.log_config import LogConfig
from strata.log.log_manager import (
    CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, LogManager)
from strata.log.log_validator import assign_offsets
from strata.log.unified_log import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, FetchIsolation, UnifiedLog)
from strata.protocol import records as rec
from strata.protocol.records import Compression, SimpleRecord, build_batch, iter_records

T0 = 1_700_000_000_000


def cfg(**kw) -> LogConfig:
    props = {k.replace("_", "."): v for k, v in kw.items()}
    return LogConfig(props)


def batch(n: int = 1, *, ts: int = T0, value: bytes = b"v", **kw) -> bytes:
    return build_batch([SimpleRecord(value + b"%d" % i, b"k%d" % i, timestamp=ts + i)
                        for i in range(n)], **kw)


def open_log(path: Path, config: LogConfig | None = None, clock=None, **kw) -> UnifiedLog:
    return UnifiedLog(path / "topic-0", config or cfg(), clock=clock or MockClock(T0), **kw)


def offsets(data: bytes) -> list[int]:
    return [r.offset for r in iter_records(data)]


def read_all(ulog: UnifiedLog, start: int, isolation=FetchIsolation.HIGH_WATERMARK,
             max_bytes: int = 100_000) -> list[int]:
    """Offsets from ``start`` to the end, read as a consumer does (one segment per read)."""
    seen: list[int] = []
    while True:
        got = [o for o in offsets(ulog.read(start, max_bytes, isolation).records) if o >= start]
        if not got:
            return seen
        seen += got
        start = got[-1] + 1


def append_n(ulog: UnifiedLog, batches: int, records: int = 1, **kw) -> None:
    for _ in range(batches):
        ulog.append_as_leader(batch(records, **kw), 0)
    ulog.update_high_watermark(ulog.log_end_offset)


# ---- append and read ------------------------------------------------------------------------

def test_offsets_are_assigned_consecutively_across_batches(tmp_path):
    ulog = open_log(tmp_path)
    first = ulog.append_as_leader(batch(3), 0)
    second = ulog.append_as_leader(batch(2), 0)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert ulog.log_end_offset == 5


def test_an_append_of_more_batches_than_one_pwritev_takes_stores_the_assigned_bytes(tmp_path):
    """Appends write the producer's bytes around new 16-byte batch prefixes (no copy), in
    IOV_MAX-sized gathers: the segment holds what assigning offsets in place would make."""
    from strata.log.segment import _IOV_MAX
    ulog = open_log(tmp_path)
    ulog.append_as_leader(batch(2), 0)
    many = b"".join(batch(1, value=b"m%d-" % i) for i in range(_IOV_MAX + 7))
    expected = bytearray(many)
    assign_offsets(expected, list(rec.iter_headers(expected)), 2, 3)
    info = ulog.append_as_leader(many, 3)
    assert (info.first_offset, info.last_offset) == (2, _IOV_MAX + 8)
    ulog.flush(ulog.log_end_offset)
    stored = (tmp_path / "topic-0" / "00000000000000000000.log").read_bytes()
    assert stored[-len(many):] == expected
    assert many == b"".join(batch(1, value=b"m%d-" % i) for i in range(_IOV_MAX + 7))


def test_read_returns_the_whole_batch_containing_the_offset(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 3, records=4)
    got = ulog.read(5, 10_000)
    assert offsets(got.records) == list(range(4, 12))


def test_read_returns_one_oversized_batch_even_when_max_bytes_is_smaller(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 2, records=50)
    got = ulog.read(0, 1)
    assert offsets(got.records) == list(range(0, 50))


def test_read_never_returns_a_partial_batch(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 10, records=5)
    one = len(batch(5))
    got = ulog.read(0, int(one * 2.5))
    assert len(got.records) == 2 * one
    assert offsets(got.records) == list(range(10))


def test_read_stops_at_the_high_watermark_for_consumers(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 2, records=2)
    ulog.append_as_leader(batch(2), 0)  # not yet committed
    assert offsets(ulog.read(0, 10_000).records) == [0, 1, 2, 3]
    assert offsets(ulog.read(0, 10_000, FetchIsolation.LOG_END).records) == list(range(6))
    assert ulog.read(4, 10_000).records == b""


def test_read_outside_the_log_raises_offset_out_of_range(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 1, records=2)
    with pytest.raises(OffsetOutOfRangeError) as exc:
        ulog.read(3, 100)
    assert exc.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert ulog.read(2, 100).records == b""  # the log end offset itself is a valid, empty read


def test_read_crosses_into_the_next_segment(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500))
    append_n(ulog, 20, records=2)
    assert ulog.local_log.segment_count() > 2
    assert read_all(ulog, 0, max_bytes=300) == list(range(40))


def test_compressed_batches_are_stored_as_sent(tmp_path):
    ulog = open_log(tmp_path)
    sent = batch(20, compression=Compression.ZSTD)
    ulog.append_as_leader(sent, 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    stored = ulog.read(0, 100_000).records
    assert len(stored) == len(sent)
    assert stored[rec.ATTRIBUTES_OFFSET:] == sent[rec.ATTRIBUTES_OFFSET:]
    assert [r.value for r in iter_records(stored)] == [b"v%d" % i for i in range(20)]


def test_log_append_time_topics_stamp_the_broker_time(tmp_path):
    clock = MockClock(T0 + 5_000)
    ulog = open_log(tmp_path, cfg(message_timestamp_type="LogAppendTime"), clock)
    info = ulog.append_as_leader(batch(3, ts=T0), 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    assert info.log_append_time == T0 + 5_000
    data = ulog.read(0, 10_000).records
    h = rec.read_header(data)
    assert h.is_log_append_time and rec.batch_crc_ok(data, h)
    assert {r.timestamp for r in iter_records(data)} == {T0 + 5_000}


def test_a_rejected_batch_leaves_the_log_unchanged(tmp_path):
    ulog = open_log(tmp_path, cfg(max_message_bytes=200))
    append_n(ulog, 1)
    size = ulog.size
    with pytest.raises(KafkaError) as exc:
        ulog.append_as_leader(batch(20, value=b"x" * 50), 0)
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE
    bad = bytearray(batch(1))
    bad[-1] ^= 0xFF
    with pytest.raises(KafkaError) as exc:
        ulog.append_as_leader(bytes(bad), 0)
    assert exc.value.code == ErrorCode.CORRUPT_MESSAGE
    assert ulog.size == size and ulog.log_end_offset == 1


# ---- idempotence through the log ----------------------------------------------------------

def test_a_retried_idempotent_batch_gets_its_original_offsets(tmp_path):
    ulog = open_log(tmp_path)
    first = ulog.append_as_leader(batch(3, producer_id=9, producer_epoch=0, base_sequence=0), 0)
    ulog.append_as_leader(batch(2, producer_id=9, producer_epoch=0, base_sequence=3), 0)
    retry = ulog.append_as_leader(batch(3, producer_id=9, producer_epoch=0, base_sequence=0), 0)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (0, 2)
    assert first.first_offset == 0 and ulog.log_end_offset == 5


def test_sequence_gaps_and_fenced_epochs_are_rejected(tmp_path):
    ulog = open_log(tmp_path)
    ulog.append_as_leader(batch(1, producer_id=9, producer_epoch=1, base_sequence=0), 0)
    with pytest.raises(OutOfOrderSequenceError):
        ulog.append_as_leader(batch(1, producer_id=9, producer_epoch=1, base_sequence=5), 0)
    with pytest.raises(InvalidProducerEpochError):
        ulog.append_as_leader(batch(1, producer_id=9, producer_epoch=0, base_sequence=1), 0)
    assert ulog.log_end_offset == 1


def test_duplicate_detection_survives_a_clean_restart(tmp_path):
    ulog = open_log(tmp_path)
    ulog.append_as_leader(batch(2, producer_id=4, producer_epoch=0, base_sequence=0), 0)
    ulog.close()
    again = open_log(tmp_path)
    retry = again.append_as_leader(batch(2, producer_id=4, producer_epoch=0, base_sequence=0), 0)
    assert retry.duplicate and retry.first_offset == 0


# ---- roll -----------------------------------------------------------------------------------

def test_segments_roll_at_segment_bytes(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=1000))
    append_n(ulog, 30)
    segs = ulog.local_log.segments
    assert len(segs) > 2
    assert all(s.size <= 1000 for s in segs)
    names = sorted(p.name for p in (tmp_path / "topic-0").glob("*.log"))
    assert names == [f"{s.base_offset:020d}.log" for s in segs]


def test_segments_roll_when_segment_ms_passes(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, cfg(segment_ms=60_000), clock)
    ulog.append_as_leader(batch(1, ts=T0), 0)
    ulog.append_as_leader(batch(1, ts=T0 + 30_000), 0)
    assert ulog.local_log.segment_count() == 1
    ulog.append_as_leader(batch(1, ts=T0 + 61_000), 0)
    assert [s.base_offset for s in ulog.local_log.segments] == [0, 2]


def test_segments_roll_when_the_offset_index_is_full(tmp_path):
    ulog = open_log(tmp_path, cfg(segment_index_bytes=8 * 4, index_interval_bytes=0))
    append_n(ulog, 20)
    assert ulog.local_log.segment_count() >= 4
    for seg in ulog.local_log.segments[:-1]:
        assert seg.offset_index.path.stat().st_size == 8 * seg.offset_index.entries


def test_an_offset_beyond_the_relative_range_rolls_a_new_segment(tmp_path):
    ulog = open_log(tmp_path)
    ulog.append_as_leader(batch(1), 0)
    ulog.truncate_fully_and_start_at(0)
    ulog.append_as_leader(batch(1), 0)
    # jump the log end offset past base + 2^31 as a follower would see it
    far = bytearray(batch(1))
    struct.pack_into(">q", far, 0, 2**31 + 5)
    ulog.append_as_follower(far)
    assert [s.base_offset for s in ulog.local_log.segments] == [0, 2**31 + 5]


def test_index_entries_follow_index_interval_bytes(tmp_path):
    ulog = open_log(tmp_path, cfg(index_interval_bytes=4096))
    one = len(batch(10, value=b"x" * 90))
    append_n(ulog, 100, records=10, value=b"x" * 90)
    idx = ulog.local_log.active_segment.offset_index
    expected = 0
    since = 0
    for _ in range(100):
        if since > 4096:
            expected += 1
            since = 0
        since += one
    assert idx.entries == expected
    for n in range(idx.entries):
        e = idx.entry(n)
        found = ulog.local_log.active_segment.translate_offset(e.offset)
        assert found.position == e.position


# ---- timestamps -----------------------------------------------------------------------------

def test_list_offsets_by_timestamp_finds_the_first_record_at_or_after_it(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=400, index_interval_bytes=50))
    for i in range(20):
        ulog.append_as_leader(batch(2, ts=T0 + i * 100), 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    assert ulog.fetch_offset_by_timestamp(T0 + 701).offset == 15
    assert ulog.fetch_offset_by_timestamp(T0 + 700).offset == 14
    assert ulog.fetch_offset_by_timestamp(T0 - 1).offset == 0
    assert ulog.fetch_offset_by_timestamp(T0 + 10_000) is None
    assert ulog.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP).offset == 0
    assert ulog.fetch_offset_by_timestamp(LATEST_TIMESTAMP).offset == 40
    top = ulog.fetch_offset_by_timestamp(MAX_TIMESTAMP)
    assert (top.timestamp, top.offset) == (T0 + 1901, 39)


# ---- retention and the log start offset ---------------------------------------------------

def test_retention_ms_deletes_expired_segments_and_an_idle_active_one(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500, retention_ms=60_000), clock)
    for i in range(30):
        ulog.append_as_leader(batch(1, ts=T0 + i), 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    clock.advance_ms(30_000)
    assert ulog.delete_old_segments() == 0
    clock.advance_ms(31_000)
    segments = ulog.local_log.segment_count()
    assert ulog.delete_old_segments() == segments  # the active one too: rolled, then deleted
    assert [s.base_offset for s in ulog.local_log.segments] == [30]
    assert ulog.log_start_offset == 30 and ulog.log_end_offset == 30
    with pytest.raises(OffsetOutOfRangeError):
        ulog.read(29, 100)
    assert ulog.append_as_leader(batch(1, ts=T0 + 61_000), 0).first_offset == 30


def test_retention_never_deletes_offsets_at_or_above_the_high_watermark(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500, retention_ms=1000), clock)
    append_n(ulog, 10)
    ulog.append_as_leader(batch(1), 0)  # uncommitted
    clock.advance_ms(10_000)
    ulog.delete_old_segments()
    assert ulog.log_start_offset <= ulog.high_watermark == 10
    assert ulog.local_log.active_segment.base_offset <= 10 < ulog.log_end_offset


def test_delete_records_frees_segments_of_compacted_topics_too(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500, cleanup_policy="compact"))
    append_n(ulog, 30)
    before = ulog.local_log.segment_count()
    ulog.maybe_increment_log_start_offset(20)
    assert ulog.delete_old_segments() > 0
    assert ulog.local_log.segment_count() < before
    assert ulog.local_log.first_segment.base_offset <= 20


def test_retention_bytes_keeps_the_log_under_the_limit(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500, retention_bytes=1200))
    append_n(ulog, 40)
    ulog.delete_old_segments()
    assert ulog.size <= 1200 + 500
    assert ulog.log_start_offset == ulog.local_log.first_segment.base_offset > 0
    last = ulog.read(ulog.log_start_offset, 100_000).records
    assert offsets(last)[0] == ulog.log_start_offset


def test_delete_records_moves_the_log_start_offset_and_frees_segments(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500))
    append_n(ulog, 30)
    assert ulog.maybe_increment_log_start_offset(17, "DeleteRecords")
    with pytest.raises(OffsetOutOfRangeError):
        ulog.read(16, 100)
    assert 17 in offsets(ulog.read(17, 100_000).records)
    before = ulog.local_log.segment_count()
    ulog.delete_old_segments()
    assert ulog.local_log.segment_count() < before
    assert ulog.local_log.first_segment.base_offset <= 17
    with pytest.raises(OffsetOutOfRangeError):
        ulog.maybe_increment_log_start_offset(31, "beyond the high watermark")


def test_deleted_segment_files_are_renamed_then_removed(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500, retention_bytes=0))
    append_n(ulog, 20)
    ulog.delete_old_segments()
    left = {p.suffix for p in (tmp_path / "topic-0").iterdir()}
    assert ".deleted" not in left  # ImmediateScheduler: removal already ran
    assert len(list((tmp_path / "topic-0").glob("*.log"))) == 1


# ---- truncation -----------------------------------------------------------------------------

def test_truncate_to_removes_later_offsets_and_appends_continue_there(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500))
    append_n(ulog, 30)
    ulog.truncate_to(12)
    assert ulog.log_end_offset == 12 and ulog.high_watermark == 12
    assert ulog.append_as_leader(batch(1), 0).first_offset == 12
    ulog.update_high_watermark(ulog.log_end_offset)
    assert read_all(ulog, 0) == list(range(13))


def test_leader_epochs_are_recorded_and_truncated(tmp_path):
    ulog = open_log(tmp_path)
    ulog.append_as_leader(batch(2), 0)
    ulog.append_as_leader(batch(2), 3)
    ulog.append_as_leader(batch(2), 5)
    assert [tuple(e) for e in ulog.leader_epoch_cache.epoch_entries()] == [(0, 0), (3, 2), (5, 4)]
    ulog.truncate_to(3)
    assert [tuple(e) for e in ulog.leader_epoch_cache.epoch_entries()] == [(0, 0), (3, 2)]
    text = (tmp_path / "topic-0" / "leader-epoch-checkpoint").read_text()
    assert text == "0\n2\n0 0\n3 2\n"


# ---- restart and recovery -------------------------------------------------------------------

def test_a_clean_restart_keeps_every_offset_and_continues_appending(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=600))
    append_n(ulog, 25, records=2)
    ulog.close()
    again = open_log(tmp_path, cfg(internal_segment_bytes=600))
    assert again.log_end_offset == 50
    assert again.append_as_leader(batch(1), 0).first_offset == 50


def _segment_files(tmp_path: Path, suffix: str) -> list[Path]:
    return sorted((tmp_path / "topic-0").glob(f"*{suffix}"))


def test_a_flipped_byte_truncates_the_log_at_that_batch_on_recovery(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 10, records=2)
    ulog.close()
    log_file = _segment_files(tmp_path, ".log")[0]
    one = len(batch(2))
    data = bytearray(log_file.read_bytes())
    data[one * 6 + 70] ^= 0x01  # inside the 7th batch's records
    log_file.write_bytes(bytes(data))
    again = open_log(tmp_path, had_clean_shutdown=False, recovery_point=0)
    assert again.log_end_offset == 12
    assert log_file.stat().st_size == one * 6
    assert offsets(again.read(0, 100_000).records) == list(range(12))
    assert again.append_as_leader(batch(1), 0).first_offset == 12


def test_a_truncated_log_file_recovers_to_the_last_whole_batch(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 10, records=2)
    ulog.local_log.close()  # crash: no clean close
    log_file = _segment_files(tmp_path, ".log")[0]
    one = len(batch(2))
    os.truncate(log_file, one * 4 + 30)
    again = open_log(tmp_path, had_clean_shutdown=False, recovery_point=0)
    assert again.log_end_offset == 8
    assert log_file.stat().st_size == one * 4
    for h in rec.iter_headers(again.read(0, 100_000).records):
        assert h.last_offset < 8


def test_a_garbage_index_is_detected_and_rebuilt(tmp_path):
    config = cfg(internal_segment_bytes=2000, index_interval_bytes=100)
    ulog = open_log(tmp_path, config)
    append_n(ulog, 60, records=2)
    expected = [ulog.local_log.segments[0].offset_index.entry(i)
                for i in range(ulog.local_log.segments[0].offset_index.entries)]
    ulog.close()
    index_file = _segment_files(tmp_path, ".index")[0]
    index_file.write_bytes(b"\x7f\xff\xff\x00" * (len(expected) * 2))
    again = open_log(tmp_path, config)  # even after a clean shutdown
    idx = again.local_log.segments[0].offset_index
    assert [idx.entry(i) for i in range(idx.entries)] == expected
    assert offsets(again.read(5, 100).records)[:2] == [4, 5]


def test_missing_index_files_are_rebuilt(tmp_path):
    config = cfg(internal_segment_bytes=2000, index_interval_bytes=100)
    ulog = open_log(tmp_path, config)
    append_n(ulog, 60, records=2)
    ulog.close()
    for p in _segment_files(tmp_path, ".index") + _segment_files(tmp_path, ".timeindex"):
        p.unlink()
    again = open_log(tmp_path, config)
    assert again.local_log.segments[0].offset_index.entries > 0
    assert again.fetch_offset_by_timestamp(T0 + 1).offset == 1


def test_leftover_deleted_and_tmp_files_are_removed_at_load(tmp_path):
    ulog = open_log(tmp_path)
    append_n(ulog, 2)
    ulog.close()
    d = tmp_path / "topic-0"
    (d / "00000000000000000000.log.deleted").write_bytes(b"x")
    (d / "leader-epoch-checkpoint.tmp").write_bytes(b"x")
    (d / "00000000000000000099.index").write_bytes(b"")
    open_log(tmp_path)
    names = {p.name for p in d.iterdir()}
    assert not {"00000000000000000000.log.deleted", "leader-epoch-checkpoint.tmp",
                "00000000000000000099.index"} & names


def test_unclean_recovery_rebuilds_producer_state_from_the_log(tmp_path):
    ulog = open_log(tmp_path)
    for seq in range(0, 10, 2):
        ulog.append_as_leader(batch(2, producer_id=77, producer_epoch=2, base_sequence=seq), 0)
    ulog.local_log.close()
    for snap in (tmp_path / "topic-0").glob("*.snapshot"):
        snap.unlink()
    again = open_log(tmp_path, had_clean_shutdown=False, recovery_point=0)
    retry = again.append_as_leader(batch(2, producer_id=77, producer_epoch=2, base_sequence=8), 0)
    assert retry.duplicate and retry.first_offset == 8
    with pytest.raises(OutOfOrderSequenceError):
        again.append_as_leader(batch(1, producer_id=77, producer_epoch=2, base_sequence=11), 0)


# ---- log manager: checkpoints and the clean-shutdown marker ------------------------------

def test_log_manager_writes_checkpoints_and_the_clean_shutdown_marker(tmp_path):
    config = cfg(internal_segment_bytes=500)
    mgr = LogManager([tmp_path], config, clock=MockClock(T0))
    mgr.startup()
    a = mgr.get_or_create_log(TopicPartition("orders", 0))
    b = mgr.get_or_create_log(TopicPartition("orders-eu", 3))
    append_n(a, 20)
    append_n(b, 5)
    b.maybe_increment_log_start_offset(3)
    mgr.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    rp = OffsetCheckpointFile(tmp_path / RECOVERY_POINT_CHECKPOINT).read()
    assert rp == {TopicPartition("orders", 0): 20, TopicPartition("orders-eu", 3): 5}
    assert (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text().splitlines()[:2] == ["0", "2"]
    lso = OffsetCheckpointFile(tmp_path / LOG_START_OFFSET_CHECKPOINT).read()
    assert lso == {TopicPartition("orders-eu", 3): 3}

    again = LogManager([tmp_path], config, clock=MockClock(T0))
    again.startup()
    assert again.had_clean_shutdown[tmp_path]
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert again.get_log(TopicPartition("orders", 0)).log_end_offset == 20
    assert again.get_log(TopicPartition("orders-eu", 3)).log_start_offset == 3


def test_log_manager_without_the_marker_recovers_from_the_recovery_point(tmp_path):
    config = cfg(internal_segment_bytes=500)
    mgr = LogManager([tmp_path], config, clock=MockClock(T0))
    mgr.startup()
    a = mgr.get_or_create_log(TopicPartition("t", 0))
    append_n(a, 20)
    a.flush()
    mgr.checkpoint()
    append_n(a, 5)
    a.local_log.close()  # crash
    again = LogManager([tmp_path], config, clock=MockClock(T0))
    again.startup()
    assert not again.had_clean_shutdown[tmp_path]
    log2 = again.get_log(TopicPartition("t", 0))
    assert log2.log_end_offset == 25
    assert log2.recovery_point == 20


def test_deleting_a_log_removes_its_directory(tmp_path):
    mgr = LogManager([tmp_path], cfg(), clock=MockClock(T0))
    mgr.startup()
    ulog = mgr.get_or_create_log(TopicPartition("gone", 0))
    append_n(ulog, 3)
    mgr.delete_log(TopicPartition("gone", 0))
    assert not any(p.name.startswith("gone-0") for p in tmp_path.iterdir())
    assert mgr.get_log(TopicPartition("gone", 0)) is None


# ---- flush policy ---------------------------------------------------------------------------

def test_flush_messages_moves_the_recovery_point_after_that_many_messages(tmp_path):
    ulog = open_log(tmp_path, cfg(flush_messages=5))
    for _ in range(4):
        ulog.append_as_leader(batch(1), 0)
    assert ulog.recovery_point == 0
    ulog.append_as_leader(batch(1), 0)
    assert ulog.recovery_point == 5


def test_flush_ms_flushes_when_the_interval_has_passed(tmp_path):
    clock = MockClock(T0)
    ulog = open_log(tmp_path, cfg(flush_ms=1000), clock)
    ulog.append_as_leader(batch(3), 0)
    ulog.flush_if_due()
    assert ulog.recovery_point == 0
    clock.advance_ms(1000)
    ulog.flush_if_due()
    assert ulog.recovery_point == 3


def test_by_default_only_a_roll_or_close_makes_data_durable(tmp_path):
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=500))
    ulog.append_as_leader(batch(1), 0)
    assert ulog.recovery_point == 0
    append_n(ulog, 20)
    assert 0 < ulog.recovery_point <= ulog.local_log.active_segment.base_offset
    ulog.close()
    assert ulog.recovery_point == ulog.log_end_offset


def test_concurrent_checkpoints_never_leave_a_broken_file(tmp_path):
    import threading
    mgr = LogManager([tmp_path], cfg(), clock=MockClock(T0))
    mgr.startup()
    for p in range(30):
        append_n(mgr.get_or_create_log(TopicPartition("c", p)), 1)
    errors = []

    def loop():
        try:
            for _ in range(40):
                mgr.checkpoint()
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
    threads = [threading.Thread(target=loop) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(OffsetCheckpointFile(tmp_path / RECOVERY_POINT_CHECKPOINT).read()) == 30


# ---- transactions ---------------------------------------------------------------------------

def test_read_committed_reports_aborted_transactions_whose_marker_is_in_a_later_segment(tmp_path):
    from strata.log.producer_state import AppendOrigin
    from strata.protocol.records import CONTROL_ABORT, build_control_batch
    ulog = open_log(tmp_path, cfg(internal_segment_bytes=400))
    ulog.append_as_leader(batch(1), 0)
    for seq in range(8):  # a long transaction spanning segments
        ulog.append_as_leader(batch(1, producer_id=5, producer_epoch=0, base_sequence=seq,
                                    transactional=True), 0)
    ulog.append_as_leader(build_control_batch(CONTROL_ABORT, producer_id=5, producer_epoch=0,
                                              timestamp=T0), 0, origin=AppendOrigin.COORDINATOR)
    ulog.update_high_watermark(ulog.log_end_offset)
    assert ulog.local_log.segment_count() > 1
    assert ulog.last_stable_offset == ulog.log_end_offset
    got = ulog.read(1, 150, FetchIsolation.TXN_COMMITTED)
    assert got.records and got.aborted_transactions is not None
    assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == [(5, 1)]
    assert ulog.read(0, 150, FetchIsolation.HIGH_WATERMARK).aborted_transactions is None


def _log_with_an_aborted_transaction(tmp_path, **config):
    """Offsets 0-1 plain, 2-4 an aborted transaction of producer 5, 5 its marker, 6 plain."""
    from strata.log.producer_state import AppendOrigin
    from strata.protocol.records import CONTROL_ABORT, build_control_batch
    ulog = open_log(tmp_path, cfg(**config))
    ulog.append_as_leader(batch(1), 0)
    ulog.append_as_leader(batch(1), 0)
    for seq in range(3):
        ulog.append_as_leader(batch(1, producer_id=5, producer_epoch=0, base_sequence=seq,
                                    transactional=True), 0)
    ulog.append_as_leader(build_control_batch(CONTROL_ABORT, producer_id=5, producer_epoch=0,
                                              timestamp=T0), 0, origin=AppendOrigin.COORDINATOR)
    ulog.append_as_leader(batch(1), 0)
    ulog.update_high_watermark(ulog.log_end_offset)
    return ulog


def test_read_committed_region_finds_aborted_transactions_without_reading_its_batches(
        tmp_path, monkeypatch):
    from strata.protocol.file_region import FileRegion
    ulog = _log_with_an_aborted_transaction(tmp_path)

    def walked(self):
        raise AssertionError("the region's batches were read")
    monkeypatch.setattr(FileRegion, "headers", walked)
    got = ulog.read(0, 1 << 20, FetchIsolation.TXN_COMMITTED, as_region=True)
    try:
        assert isinstance(got.records, FileRegion)
        assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == [(5, 2)]
    finally:
        got.records.close()


def test_read_committed_bounds_aborted_transactions_by_the_offset_index(tmp_path):
    """Kafka's upper bound: the first index entry at or past the read's end. With every batch
    indexed, a read of the first batch ends before the transaction and reports none of it."""
    ulog = _log_with_an_aborted_transaction(tmp_path, index_interval_bytes=1)
    first = ulog.read(0, 1, FetchIsolation.TXN_COMMITTED)
    assert offsets(first.records) == [0]
    assert first.aborted_transactions == []
    into = ulog.read(1, 1 << 20, FetchIsolation.TXN_COMMITTED)
    assert [(a.producer_id, a.first_offset) for a in into.aborted_transactions] == [(5, 2)]


def test_read_committed_read_with_no_records_reports_no_aborted_transactions(tmp_path):
    ulog = _log_with_an_aborted_transaction(tmp_path)
    tail = ulog.read(ulog.log_end_offset, 1 << 20, FetchIsolation.TXN_COMMITTED)
    assert len(tail.records) == 0
    assert tail.aborted_transactions == []
