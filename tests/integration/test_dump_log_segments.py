"""Apache Kafka's own DumpLogSegments reads the segments Strata writes, and finds no index errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_tools import (
    dump_log_segments, dump_reports_index_errors, kafka_dist_available, parse_dump_batches,
    parse_dump_index_entries)
from strata.common.clock import MockClock
from strata.log.log_config import LogConfig
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import UnifiedLog
from strata.protocol import records as rec
from strata.protocol.records import Compression, SimpleRecord, build_batch, build_control_batch

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    ok, reason = kafka_dist_available()
    if not ok:
        print(f"SKIP reason: {reason}")
        pytest.skip(reason)


def write_varied_log(directory: Path, config: LogConfig) -> UnifiedLog:
    """Several segments of plain, compressed, idempotent and transactional batches."""
    ulog = UnifiedLog(directory, config, clock=MockClock(T0 + 10_000))
    codecs = list(Compression)
    seq = 0
    for i in range(60):
        records = [SimpleRecord(b"value-%d-%d" % (i, j) * (1 + j % 5), b"key-%d" % j,
                                ((("h", b"v"),) if j % 2 else ()), T0 + i * 10 + j)
                   for j in range(1 + i % 7)]
        kw = {}
        if i % 3 == 0:
            kw = dict(producer_id=1000, producer_epoch=0, base_sequence=seq)
            seq += len(records)
        ulog.append_as_leader(build_batch(records, compression=codecs[i % len(codecs)], **kw), i // 20)
    # one committed and one aborted transaction, with their markers
    for ctype in (rec.CONTROL_COMMIT, rec.CONTROL_ABORT):
        ulog.append_as_leader(build_batch([SimpleRecord(b"txn", timestamp=T0 + 900)] * 3, producer_id=2000,
                                          producer_epoch=0, base_sequence=0 if ctype else 3,
                                          transactional=True), 3)
        ulog.append_as_leader(build_control_batch(ctype, producer_id=2000, producer_epoch=0,
                                                  timestamp=T0 + 901),
                              3, origin=AppendOrigin.COORDINATOR)
    ulog.update_high_watermark(ulog.log_end_offset)
    return ulog


def test_dump_log_segments_reads_every_batch_strata_wrote(tmp_path):
    config = LogConfig({"internal.segment.bytes": 4000, "index.interval.bytes": 200})
    ulog = write_varied_log(tmp_path / "t-0", config)
    expected = {}
    for seg in ulog.local_log.segments:
        expected[seg.base_offset] = [h for h, _, _ in seg.iter_batches(0)]
    ulog.close()
    assert len(expected) >= 3
    for base, headers in expected.items():
        log_file = tmp_path / "t-0" / f"{base:020d}.log"
        out = dump_log_segments(log_file, deep_iteration=True)
        batches = parse_dump_batches(out)
        assert [(b["baseOffset"], b["lastOffset"], b["count"], b["position"], b["size"])
                for b in batches] == \
            [(h.base_offset, h.last_offset, h.record_count, h.position, h.size) for h in headers]
        assert all(b["isvalid"] is True and b["magic"] == 2 for b in batches)
        errors = dump_reports_index_errors(out)
        if base != 0:
            # the tool starts counting at -1, so it flags the first offset of every segment
            # after the first (Kafka's own segments included); any other pair is a real gap
            assert errors[1:] == [f"  -1 is followed by {base}"], errors
        else:
            assert errors == [], errors


def test_dump_log_segments_verifies_strata_index_and_time_index_entries(tmp_path):
    config = LogConfig({"internal.segment.bytes": 4000, "index.interval.bytes": 200})
    ulog = write_varied_log(tmp_path / "t-0", config)
    segments = [(s.base_offset, s.offset_index.entries, s.time_index.entries)
                for s in ulog.local_log.segments]
    ulog.close()
    d = tmp_path / "t-0"
    for base, index_entries, time_entries in segments:
        files = [d / f"{base:020d}.index", d / f"{base:020d}.timeindex"]
        # verify mode (no sanity-check flag) compares every entry against the .log
        out = dump_log_segments(*files, deep_iteration=True)
        assert dump_reports_index_errors(out) == [], out
        entries = parse_dump_index_entries(out)
        assert len([e for e in entries if "position" in e]) == index_entries
        assert len([e for e in entries if "timestamp" in e]) == time_entries
        sane = dump_log_segments(*files, index_sanity_check=True)
        assert sane.count("passed sanity check") + sane.count("is empty") >= 1
        assert "corrupt" not in sane.lower()
    assert sum(s[1] for s in segments) > 0


def test_dump_log_segments_reads_log_append_time_batches(tmp_path):
    config = LogConfig({"message.timestamp.type": "LogAppendTime", "index.interval.bytes": 0})
    ulog = UnifiedLog(tmp_path / "t-0", config, clock=MockClock(T0 + 5))
    for i in range(5):
        ulog.append_as_leader(build_batch([SimpleRecord(b"x%d" % i, timestamp=T0)] * 2,
                                          compression=Compression.LZ4), 0)
    ulog.close()
    out = dump_log_segments(tmp_path / "t-0" / f"{0:020d}.log", tmp_path / "t-0" / f"{0:020d}.index",
                            tmp_path / "t-0" / f"{0:020d}.timeindex", deep_iteration=True)
    batches = parse_dump_batches(out)
    assert len(batches) == 5
    assert all(b.get("LogAppendTime") == T0 + 5 and b["isvalid"] is True for b in batches)
    assert dump_reports_index_errors(out) == []
