"""The cleaner's array scan (``cleaner_scan``) writes the same bytes as decoding every record.

Two copies of one random log are cleaned, over several rounds, by ``Cleaner(scan=True)`` and by
``Cleaner(scan=False)`` (the record-by-record reference); their segment files, checkpoints and
stats must match exactly.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from strata.common.clock import MockClock
from strata.common.types import TopicPartition
from strata.log.cleaner_scan import scan_batch
from strata.log import log_cleaner
from strata.log.log_cleaner import Cleaner, OffsetMap, log_to_clean
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol import records as rec
from strata.protocol.records import Compression, SimpleRecord, build_batch

T0 = 1_700_000_000_000
TP = TopicPartition("compacted", 0)
DELETE_RETENTION_MS = 60_000

records = st.lists(
    st.tuples(st.sampled_from([b"a", b"bb", b"c" * 70, b"d", b"", b"\x00e"]),
              st.one_of(st.none(), st.binary(max_size=200)),
              st.lists(st.tuples(st.sampled_from(["h", "hh"]),
                                 st.one_of(st.none(), st.binary(max_size=5))), max_size=2),
              st.integers(-5_000, 300_000)),
    min_size=1, max_size=24)
rounds = st.lists(st.tuples(st.lists(records, min_size=1, max_size=8),
                            st.integers(0, 2 * DELETE_RETENTION_MS)),
                  min_size=1, max_size=3)


def open_log(directory: Path, clock: MockClock, segment_bytes: int) -> UnifiedLog:
    return UnifiedLog(directory, LogConfig({
        "cleanup.policy": "compact", "internal.segment.bytes": segment_bytes,
        "delete.retention.ms": DELETE_RETENTION_MS, "file.delete.delay.ms": 0}), clock=clock)


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())
            if p.suffix in (".log", ".index", ".timeindex")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=rounds,
       codec=st.sampled_from([Compression.NONE, Compression.LZ4, Compression.ZSTD,
                              Compression.SNAPPY, Compression.GZIP]),
       log_append_time=st.booleans(), segment_bytes=st.sampled_from([700, 4000, 1 << 20]),
       map_slots=st.sampled_from([2, 7, 30, 1000]), idempotent=st.booleans(),
       group_records=st.sampled_from([1, 10, 4096]))
# tombstones that stay the latest of their key past their delete horizon, then go
@example(rounds=[([[(b"a", None, [], 0)] * 3 + [(b"bb", b"x", [], 5)] * 3] * 2, 0),
                 ([[(b"bb", b"y", [("h", None)], 9)] * 9], 70_000),
                 ([[(b"d", b"z", [], 1)] * 9], 70_000)],
         codec=Compression.NONE, log_append_time=False, segment_bytes=4000, map_slots=1000,
         idempotent=False, group_records=4096)
def test_scanned_clean_writes_the_same_bytes_as_decoding_every_record(
        rounds, codec, log_append_time, segment_bytes, map_slots, idempotent, group_records):
    default = log_cleaner._GROUP_RECORDS
    log_cleaner._GROUP_RECORDS = group_records   # where groups of scanned batches end
    try:
        clean_both_ways(rounds, codec, log_append_time, segment_bytes, map_slots, idempotent)
    finally:
        log_cleaner._GROUP_RECORDS = default


def clean_both_ways(rounds, codec, log_append_time, segment_bytes, map_slots, idempotent):
    with tempfile.TemporaryDirectory() as d:
        clock = MockClock(T0)
        logs = {scan: open_log(Path(d) / f"{scan}-0", clock, segment_bytes)
                for scan in (True, False)}
        # a map of few slots fills during a clean: its cut must be the same on both paths
        cleaners = {scan: Cleaner(OffsetMap(map_slots * 24), clock=clock, scan=scan)
                    for scan in logs}
        checkpoints = dict.fromkeys(logs)
        sequence = 0
        for batches, advance in rounds:
            for items in batches:
                kw = dict(producer_id=5, producer_epoch=0, base_sequence=sequence) \
                    if idempotent else {}
                sequence += len(items)
                batch = build_batch([SimpleRecord(v, k, tuple(hs), T0 + dt)
                                     for k, v, hs, dt in items], compression=codec,
                                    log_append_time=log_append_time, **kw)
                for ulog in logs.values():
                    ulog.append_as_leader(batch, 0)
            outcome = {}
            for scan, ulog in logs.items():
                ulog.update_high_watermark(ulog.log_end_offset)
                ulog.roll()
                end, stats = cleaners[scan].clean(
                    log_to_clean(TP, ulog, checkpoints[scan], clock.milliseconds()))
                checkpoints[scan] = end
                outcome[scan] = (end, stats.bytes_read, stats.bytes_written, stats.messages_read,
                                 stats.messages_written, stats.map_messages_read,
                                 stats.invalid_messages)
            assert outcome[True] == outcome[False]
            assert files(logs[True].directory) == files(logs[False].directory)
            clock.advance_ms(advance)
        for ulog in logs.values():
            ulog.close()


def test_a_batch_whose_records_do_not_fill_it_is_left_to_the_decoder():
    items = [SimpleRecord(b"v%d" % i, b"k%d" % i) for i in range(10)]
    good = bytearray(build_batch(items))
    h = rec.read_header(good, 0)
    assert scan_batch(good, h).offsets.tolist() == list(range(10))
    # one record count too many: the walk overruns the data, so the decoder decides (and raises)
    bad = bytes(rec._assemble(bytes(good[rec.HEADER_SIZE:]), base_offset=0,
                              partition_leader_epoch=-1, attributes=0, last_offset_delta=10,
                              base_timestamp=h.base_timestamp, max_timestamp=h.max_timestamp,
                              producer_id=-1, producer_epoch=-1, base_sequence=-1,
                              record_count=11))
    hb = rec.read_header(bad, 0)
    assert scan_batch(bad, hb) is None
    with pytest.raises(rec.CorruptRecordError):
        rec.decode_batch(bad, hb, check_crc=True)
    good[-3] ^= 0xFF   # a flipped byte fails the CRC check, as decode_batch's does
    with pytest.raises(rec.CorruptRecordError):
        scan_batch(bytes(good), h)
