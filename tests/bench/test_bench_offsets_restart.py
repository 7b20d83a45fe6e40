"""The offsets restart benchmark's pure helpers: counting records from segment bytes, the
broker log's startup marks and cleaner lines, and the offsets it commits (the runs themselves
need a broker)."""

from __future__ import annotations

from datetime import datetime

from benchmarks.offsets_restart import (broker_log_marks, cleaned_lines, committed_offset,
                                          segment_records)
from strata.protocol.records import SimpleRecord, build_batch


def test_segment_records_counts_batches_and_records_and_stops_at_a_zeroed_or_cut_tail():
    one = build_batch([SimpleRecord(b"v%d" % i, b"k%d" % i) for i in range(3)])
    two = build_batch([SimpleRecord(b"v", b"k")], base_offset=3)
    assert segment_records(b"") == (0, 0)
    assert segment_records(one) == (1, 3)
    assert segment_records(one + two) == (2, 4)
    assert segment_records(one + two + bytes(4096)) == (2, 4)      # preallocated zeros
    assert segment_records(one + two[:-1]) == (1, 3)              # a torn last batch


def test_committed_offsets_differ_by_group_partition_and_commit():
    seen = {committed_offset(g, p, c) for g in range(3) for p in range(4) for c in range(5)}
    assert len(seen) == 60
    assert committed_offset(199, 49, 99) == 99_001_990_049


def test_broker_log_marks_are_seconds_from_the_launch():
    launched = datetime(2026, 1, 2, 3, 4, 5).timestamp()
    text = "\n".join([
        "2026-01-02 03:04:06,000 INFO strata.log.log_manager: loaded 100 logs from /d (clean)",
        "2026-01-02 03:04:06,500 INFO strata.coordinator.group_coordinator: loaded group g1 "
        "(Empty, generation 0, 0 members, 50 offsets, 0 open transactions)",
        "2026-01-02 03:04:08,250 INFO strata.coordinator.group_coordinator: loaded group g2 "
        "(Empty, generation 0, 0 members, 50 offsets, 0 open transactions)",
        "2026-01-02 03:04:08,300 INFO strata.server.network: listening on 127.0.0.1:9092",
        "2026-01-02 03:04:09,000 ERROR strata.x: something",
        "  a continuation line",
    ])
    marks = broker_log_marks(text, launched)
    assert marks == {"logs_loaded_s": 1.0, "groups_first_s": 1.5, "groups_last_s": 3.25,
                     "listening_s": 3.3, "groups_logged": 2, "errors": 1}
    assert broker_log_marks("", launched)["listening_s"] is None


def test_cleaned_lines_sum_the_cleaners_reports():
    text = ("x INFO strata.log.log_cleaner: cleaned __consumer_offsets-3 up to 900: "
            "1000 -> 100 bytes in 0.50s\n"
            "x INFO strata.log.log_cleaner: cleaned __consumer_offsets-3 up to 950: "
            "200 -> 110 bytes in 0.25s\n"
            "x INFO strata.log.log_cleaner: cleaned other-0 up to 5: 10 -> 1 bytes in 0.01s\n")
    assert cleaned_lines(text) == {"cleans": 2, "partitions": 1, "bytes_read": 1200,
                                   "bytes_kept": 210, "seconds": 0.75}
