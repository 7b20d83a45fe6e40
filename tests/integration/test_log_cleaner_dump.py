"""Apache Kafka's DumpLogSegments reads the segments the log cleaner writes: rebuilt compressed
batches, delete horizons, a producer's retained empty batch, and their indexes."""

from __future__ import annotations

import re

import pytest

from kafka_tools import (
    dump_log_segments, dump_reports_index_errors, require_kafka_dist, parse_dump_batches)
from strata.common.clock import MockClock
from strata.log.log_cleaner import Cleaner, OffsetMap, log_to_clean
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import Compression, SimpleRecord, build_batch

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000
RETENTION = 60_000


@pytest.fixture(scope="module", autouse=True)
def kafka_tools_or_skip():
    require_kafka_dist()


def test_dump_log_segments_reads_cleaned_segments_and_their_indexes(tmp_path):
    config = LogConfig({"cleanup.policy": "compact", "internal.segment.bytes": 1500,
                        "index.interval.bytes": 100, "delete.retention.ms": RETENTION,
                        "file.delete.delay.ms": 0})
    clock = MockClock(T0)
    ulog = UnifiedLog(tmp_path / "c-0", config, clock=clock)

    def append(items, **kw):
        ulog.append_as_leader(build_batch([SimpleRecord(v, k, timestamp=T0 + i)
                                           for i, (k, v) in enumerate(items)], **kw), 0)

    append([(b"a", b"1"), (b"b", b"1")], producer_id=7, producer_epoch=0, base_sequence=0)
    for i in range(40):
        append([(b"k%d" % (i % 4), b"v%d" % i * 10), (b"j%d" % i, b"x")],
               compression=list(Compression)[i % 5])
    append([(b"a", None), (b"b", b"2")])
    ulog.update_high_watermark(ulog.log_end_offset)
    ulog.roll()
    end, _ = Cleaner(OffsetMap(1 << 20), clock=clock).clean(
        log_to_clean(ulog.topic_partition, ulog, None, T0))
    assert end == ulog.log_end_offset
    expected = {s.base_offset: [h for h, _, _ in s.iter_batches(0)]
                for s in ulog.local_log.segments}
    ulog.close()
    seen_empty = seen_horizon = False
    for base, headers in expected.items():
        files = [tmp_path / "c-0" / f"{base:020d}{suffix}"
                 for suffix in (".log", ".index", ".timeindex")]
        out = dump_log_segments(*files, deep_iteration=True)
        batches = parse_dump_batches(out)
        assert [(b["baseOffset"], b["lastOffset"], b["count"], b["position"], b["size"])
                for b in batches] == \
            [(h.base_offset, h.last_offset, h.record_count, h.position, h.size) for h in headers]
        assert all(b["isvalid"] is True for b in batches)
        seen_empty |= any(b["count"] == 0 and b["producerId"] == 7 for b in batches)
        seen_horizon |= any(b["deleteHorizonMs"] == T0 + RETENTION for b in batches)
        # compacted segments have offset gaps, which the tool lists; nothing else is reported
        errors = [e for e in dump_reports_index_errors(out)
                  if not e.startswith("Non-consecutive offsets")
                  and not re.fullmatch(r"\s+-?\d+ is followed by \d+", e)]
        assert errors == [], out
    assert seen_empty and seen_horizon
