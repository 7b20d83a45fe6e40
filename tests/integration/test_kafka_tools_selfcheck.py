"""Self-check of the Kafka-tools harness (tests/kafka_tools.py + scripts/kafka-dist.sh).

A tiny segment is hand-built here with struct + crc32c (deliberately NOT with
strata's own encoder) and fed to Apache Kafka's DumpLogSegments, so the
harness itself is known to work before it is used to judge strata's files.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

import kafka_tools
from kafka_tools import (
    KafkaToolError,
    dump_log_segments,
    dump_reports_index_errors,
    parse_dump_batches,
    parse_dump_index_entries,
)

pytestmark = pytest.mark.slow

BASE_TS = 1_700_000_000_000
SEGMENT = "00000000000000000000"


@pytest.fixture(scope="module")
def kafka_dist() -> Path:
    ok, reason = kafka_tools.kafka_dist_available()
    if not ok:
        print(reason)
        pytest.skip(reason)
    return kafka_tools.kafka_libs()


# --- hand-built RecordBatch v2 ----------------------------------------------

def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag, 64-bit
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _record(offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = bytearray()
    body += b"\x00"  # attributes
    body += _varint(ts_delta)
    body += _varint(offset_delta)
    for field in (key, value):
        if field is None:
            body += _varint(-1)
        else:
            body += _varint(len(field)) + field
    body += _varint(0)  # no headers
    return _varint(len(body)) + bytes(body)


def build_batch(base_offset: int, records: list[tuple[int, bytes | None, bytes | None]],
                leader_epoch: int = 0) -> tuple[bytes, int]:
    """records: (timestamp, key, value). Returns (batch bytes, crc)."""
    base_ts = records[0][0]
    max_ts = max(r[0] for r in records)
    recs = b"".join(_record(i, ts - base_ts, k, v) for i, (ts, k, v) in enumerate(records))
    # attributes .. end: covered by the CRC
    after_crc = struct.pack(
        ">hiqqqhii", 0, len(records) - 1, base_ts, max_ts, -1, -1, -1, len(records)
    ) + recs
    crc = crc32c.crc32c(after_crc)
    after_len = struct.pack(">ibI", leader_epoch, 2, crc) + after_crc
    return struct.pack(">qi", base_offset, len(after_len)) + after_len, crc


def write_segment(directory: Path, *, index_entry: tuple[int, int] | None = None,
                  time_entry: tuple[int, int] | None = None, index_bytes: bytes | None = None):
    """Two batches: offsets 0-1 and 2-4. Index/timeindex point at the 2nd batch
    (Kafka indexes a batch by its LAST offset, relative to the segment base)."""
    directory.mkdir(parents=True, exist_ok=True)
    b1, crc1 = build_batch(0, [(BASE_TS, b"k", b"v0"), (BASE_TS + 1, None, b"v1")])
    b2, crc2 = build_batch(2, [(BASE_TS + 10, b"k2", b"v2"), (BASE_TS + 30, b"k3", b"v3"),
                               (BASE_TS + 20, b"k4", None)])
    log = directory / f"{SEGMENT}.log"
    log.write_bytes(b1 + b2)
    rel_offset, position = index_entry if index_entry is not None else (4, len(b1))
    ts, ts_offset = time_entry if time_entry is not None else (BASE_TS + 30, 4)
    idx = directory / f"{SEGMENT}.index"
    idx.write_bytes(index_bytes if index_bytes is not None else struct.pack(">ii", rel_offset, position))
    tidx = directory / f"{SEGMENT}.timeindex"
    tidx.write_bytes(struct.pack(">qi", ts, ts_offset))
    return log, idx, tidx, {"sizes": (len(b1), len(b2)), "crcs": (crc1, crc2)}


# --- tests -------------------------------------------------------------------

def test_dump_log_segments_reads_a_hand_built_segment(kafka_dist, tmp_path):
    log, idx, tidx, info = write_segment(tmp_path / "seg")

    # Full verification mode (no --index-sanity-check): every index entry is
    # checked against the log; anything wrong would be reported on stderr.
    text = dump_log_segments(log, idx, tidx, deep_iteration=True)
    print(text)
    assert dump_reports_index_errors(text) == []

    batches = parse_dump_batches(text)
    assert [(b["baseOffset"], b["lastOffset"], b["count"]) for b in batches] == [(0, 1, 2), (2, 4, 3)]
    size1, size2 = info["sizes"]
    assert [b["position"] for b in batches] == [0, size1]
    assert [b["size"] for b in batches] == [size1, size2]
    assert [b["crc"] for b in batches] == list(info["crcs"])
    assert [b["CreateTime"] for b in batches] == [BASE_TS + 1, BASE_TS + 30]  # max timestamp
    for b in batches:
        assert b["magic"] == 2 and b["compresscodec"] == "none" and b["isvalid"] is True
        assert b["producerId"] == -1 and b["isTransactional"] is False and b["isControl"] is False
    records = [r for b in batches for r in b["records"]]
    assert [r["offset"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["timestamp"] for r in records] == [BASE_TS, BASE_TS + 1, BASE_TS + 10, BASE_TS + 30, BASE_TS + 20]
    assert [(r["keySize"], r["valueSize"]) for r in records] == [(1, 2), (-1, 2), (2, 2), (2, 2), (2, -1)]

    assert parse_dump_index_entries(text) == [
        {"kind": "offset", "offset": 4, "position": size1, "file": str(idx)},
        {"kind": "time", "timestamp": BASE_TS + 30, "offset": 4, "file": str(tidx)},
    ]

    # Broker-startup sanity check mode.
    sanity = dump_log_segments(idx, tidx, deep_iteration=False, index_sanity_check=True)
    print(sanity)
    assert f"{idx} passed sanity check." in sanity
    assert f"{tidx} passed sanity check." in sanity
    assert dump_reports_index_errors(sanity) == []


def test_dump_log_segments_reports_wrong_index_entries(kafka_dist, tmp_path):
    # .index says offset 3 (the batch at that position ends at 4);
    # .timeindex carries a timestamp that is not the batch's max timestamp.
    log, idx, tidx, info = write_segment(tmp_path / "bad", index_entry=(3, 0),
                                         time_entry=(BASE_TS + 31, 4))
    # Position 0 -> first batch, whose last offset is 1.
    text = dump_log_segments(log, idx, tidx, deep_iteration=False)
    print(text)
    errors = dump_reports_index_errors(text)
    assert f"Mismatches in :{idx}" in errors
    assert "  Index offset: 3, log offset: 1" in errors
    assert f"Found timestamp mismatch in :{tidx}" in errors
    assert f"  Index timestamp: {BASE_TS + 31}, log timestamp: {BASE_TS + 30}" in errors

    # A torn .index (not a multiple of 8 bytes) fails the sanity check: exit 1.
    _, torn_idx, _, _ = write_segment(tmp_path / "torn", index_bytes=struct.pack(">ii", 4, 0) + b"\x00\x01")
    with pytest.raises(KafkaToolError) as excinfo:
        dump_log_segments(torn_idx, deep_iteration=False, index_sanity_check=True)
    print(excinfo.value.output)
    assert excinfo.value.returncode == 1
    assert any("is corrupt, found 10 bytes which is neither positive nor a multiple of 8" in e
               for e in dump_reports_index_errors(excinfo.value.output))
