"""RecordBatch v2: round trips, produce validation, offset assignment, kafka-python compat."""

from __future__ import annotations

import struct

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.common.errors import CorruptRecordError, ErrorCode, KafkaError
from strata.log.log_validator import (
    AssignResult, assign_offsets, assign_offsets_gathered, validate_batches)
from strata.protocol.records import (
    ATTRIBUTES_OFFSET, CONTROL_ABORT, CONTROL_COMMIT, CONTROL_MASK, CRC_OFFSET, HEADER,
    HEADER_SIZE, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK, Compression,
    Record, SimpleRecord, batch_crc_ok, build_batch,
    build_control_batch,
    control_type, crc32c, decode_batch, iter_headers, iter_records, read_header)

T0 = 1_700_000_000_000
MB = 1 << 20
ALL_CODECS = list(Compression)
XERIAL_MAGIC = b"\x82SNAPPY\x00"


# ---------------------------------------------------------------------------------------------
# helpers


def patch_header(batch: bytes, **changes) -> bytes:
    """Rewrite header fields of a single batch and recompute its CRC, so only the change counts."""
    header = read_header(batch)._replace(**changes)
    out = bytearray(batch)
    HEADER.pack_into(out, 0, *header[:-1])
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def with_payload(batch: bytes, payload: bytes, codec: int) -> bytes:
    """Replace the records section of ``batch`` (and its codec), fixing length and CRC."""
    header = read_header(batch)
    attributes = (header.attributes & ~0x07) | codec
    return patch_header(batch[:HEADER_SIZE] + payload, attributes=attributes,
                        batch_length=HEADER_SIZE - 12 + len(payload))


def records_section(batch: bytes) -> bytes:
    return batch[HEADER_SIZE:]


def sample_records() -> list[SimpleRecord]:
    return [
        SimpleRecord(b"value-0", b"key-0", (("trace", b"abc"), ("empty", b""), ("null", None)), T0),
        SimpleRecord(b"value-1", None, (), T0 + 5),                     # null key
        SimpleRecord(None, b"tombstone", (), T0 - 20),                  # null value, earlier ts
        SimpleRecord(b"", b"", (("ключ", b"\x00\xff"),), T0 + 1_000),   # empty, not null
        SimpleRecord(b"x" * 200_000, b"big", (), T0 + 7),               # several codec blocks
    ]


def codes(exc_info) -> ErrorCode:
    assert isinstance(exc_info.value, KafkaError)
    return exc_info.value.code


def concat(*batches: bytes) -> bytes:
    return b"".join(batches)


# ---------------------------------------------------------------------------------------------
# build -> decode round trips


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_round_trip_preserves_keys_values_headers_and_timestamps(codec):
    records = sample_records()
    batch = build_batch(records, compression=codec, base_offset=40)
    header = read_header(batch)
    assert header.compression == codec
    assert batch_crc_ok(batch, header)
    decoded = decode_batch(batch, header)
    assert decoded == [
        Record(40 + i, r.timestamp, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)]
    assert all(isinstance(r.key, (bytes, type(None))) for r in decoded)


@pytest.mark.parametrize("codec", [c for c in ALL_CODECS if c], ids=lambda c: c.name)
def test_compressed_batch_is_smaller_than_uncompressed(codec):
    records = [SimpleRecord(b"repetitive payload " * 50, timestamp=T0)] * 20
    assert len(build_batch(records, compression=codec)) < len(build_batch(records)) // 5


def test_build_batch_header_uses_first_timestamp_as_base_and_greatest_as_max():
    batch = build_batch(
        [SimpleRecord(b"a", timestamp=T0 + 10), SimpleRecord(b"b", timestamp=T0 + 50),
         SimpleRecord(b"c", timestamp=T0)],
        base_offset=7, producer_id=11, producer_epoch=3, base_sequence=20,
        partition_leader_epoch=4, transactional=True)
    h = read_header(batch)
    assert (h.base_offset, h.last_offset_delta, h.record_count) == (7, 2, 3)
    assert (h.base_timestamp, h.max_timestamp) == (T0 + 10, T0 + 50)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (11, 3, 20)
    assert h.partition_leader_epoch == 4 and h.magic == 2
    assert h.is_transactional and not h.is_control and not h.is_log_append_time
    assert h.size == len(batch) and h.last_sequence == 22
    assert [r.timestamp for r in decode_batch(batch, h)] == [T0 + 10, T0 + 50, T0]


def test_build_batch_base_timestamp_override_keeps_record_timestamps():
    batch = build_batch([SimpleRecord(b"a", timestamp=T0), SimpleRecord(b"b", timestamp=T0 + 3)],
                        base_timestamp=T0 - 100)
    h = read_header(batch)
    assert h.base_timestamp == T0 - 100 and h.max_timestamp == T0 + 3
    assert [r.timestamp for r in decode_batch(batch, h)] == [T0, T0 + 3]


def test_build_batch_fills_missing_timestamps_with_wall_clock_ms():
    import time
    before = time.time_ns() // 1_000_000
    batch = build_batch([SimpleRecord(b"a"), SimpleRecord(b"b", timestamp=5)])
    after = time.time_ns() // 1_000_000
    first, second = decode_batch(batch, read_header(batch))
    assert before <= first.timestamp <= after
    assert second.timestamp == 5


def test_build_batch_accepts_plain_tuples_and_rejects_empty():
    batch = build_batch([(b"v", b"k", (), T0)])
    assert decode_batch(batch, read_header(batch)) == [Record(0, T0, b"k", b"v", ())]
    with pytest.raises(ValueError):
        build_batch([])


def test_decode_gives_every_record_the_max_timestamp_in_log_append_time_batches():
    batch = build_batch([SimpleRecord(b"a", timestamp=T0), SimpleRecord(b"b", timestamp=T0 + 9)],
                        log_append_time=True)
    h = read_header(batch)
    assert h.is_log_append_time
    assert [r.timestamp for r in decode_batch(batch, h)] == [T0 + 9, T0 + 9]


def test_snappy_batches_use_xerial_framing_like_java_clients():
    batch = build_batch(sample_records(), compression=Compression.SNAPPY)
    payload = records_section(batch)
    assert payload.startswith(XERIAL_MAGIC)
    assert struct.unpack_from(">ii", payload, 8) == (1, 1)


def test_raw_snappy_payload_also_decodes():
    records = sample_records()
    plain = build_batch(records)
    raw = bytes(cramjam.snappy.compress_raw(records_section(plain)))
    batch = with_payload(plain, raw, Compression.SNAPPY)
    assert [r.value for r in decode_batch(batch, read_header(batch))] == [r.value for r in records]


def test_lz4_batches_use_independent_blocks_for_java_readers():
    payload = records_section(build_batch(sample_records(), compression=Compression.LZ4))
    assert payload[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    assert payload[4] & 0x20  # FLG block-independence bit


def test_zstd_frame_without_content_size_decodes():
    zstandard = pytest.importorskip("zstandard")
    plain = build_batch(sample_records())
    compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    frame = compressor.compress(records_section(plain)) + compressor.flush()
    batch = with_payload(plain, frame, Compression.ZSTD)
    assert len(decode_batch(batch, read_header(batch))) == len(sample_records())


optional_bytes = st.none() | st.binary(max_size=40)
record_strategy = st.builds(
    SimpleRecord,
    value=optional_bytes | st.binary(min_size=100, max_size=70_000),
    key=optional_bytes,
    headers=st.lists(st.tuples(st.text(max_size=6), optional_bytes), max_size=3).map(tuple),
    timestamp=st.integers(min_value=-1, max_value=2**42),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, min_size=1, max_size=12),
       codec=st.sampled_from(ALL_CODECS),
       base_offset=st.integers(min_value=0, max_value=2**40),
       log_append_time=st.booleans())
def test_round_trip_property_over_random_records_and_codecs(records, codec, base_offset,
                                                            log_append_time):
    batch = build_batch(records, compression=codec, base_offset=base_offset,
                        log_append_time=log_append_time)
    (header,) = validate_batches(batch, max_message_bytes=16 * MB, from_client=False)
    max_ts = max(r.timestamp for r in records)
    expected = [Record(base_offset + i, max_ts if log_append_time else r.timestamp, r.key, r.value,
                       tuple(r.headers)) for i, r in enumerate(records)]
    assert decode_batch(batch, header, check_crc=True) == expected
    assert list(iter_records(batch)) == expected


# ---------------------------------------------------------------------------------------------
# validate_batches


def good_batch(**kwargs) -> bytes:
    return build_batch([SimpleRecord(b"v1", b"k1", timestamp=T0),
                        SimpleRecord(b"v2", b"k2", timestamp=T0 + 1)], **kwargs)


def test_validate_accepts_client_batches_and_returns_headers_with_positions():
    a, b = good_batch(), good_batch(compression=Compression.ZSTD)
    headers = validate_batches(a + b, max_message_bytes=MB, now_ms=T0)
    assert [h.position for h in headers] == [0, len(a)]
    assert headers == [read_header(a + b, 0), read_header(a + b, len(a))]


def test_validate_accepts_bytearray_and_memoryview():
    batch = good_batch()
    for buf in (bytearray(batch), memoryview(batch)):
        assert validate_batches(buf, max_message_bytes=MB)[0].record_count == 2


def test_validate_rejects_empty_buffer_as_invalid_record():
    with pytest.raises(KafkaError) as e:
        validate_batches(b"", max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("tail", [b"\x00", b"\x00" * 16, "header-only", "partial-body"])
def test_validate_rejects_trailing_fragment_as_corrupt(tail):
    batch = good_batch()
    if tail == "header-only":
        tail = batch[:HEADER_SIZE]
    elif tail == "partial-body":
        tail = batch[:-1]
    with pytest.raises(KafkaError) as e:
        validate_batches(batch + tail, max_message_bytes=MB)
    assert codes(e) == ErrorCode.CORRUPT_MESSAGE


def test_validate_rejects_truncated_single_batch_as_corrupt():
    with pytest.raises(KafkaError) as e:
        validate_batches(good_batch()[:-3], max_message_bytes=MB)
    assert codes(e) == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("length", [-1, 0, 13, 20, 48])
def test_validate_rejects_length_below_minimum_header_as_corrupt(length):
    batch = bytearray(good_batch())
    struct.pack_into(">i", batch, 8, length)
    with pytest.raises(KafkaError) as e:
        validate_batches(bytes(batch), max_message_bytes=MB)
    assert codes(e) == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_validate_rejects_magic_other_than_2_as_invalid_record(magic):
    batch = bytearray(good_batch())
    batch[16] = magic
    with pytest.raises(KafkaError) as e:
        validate_batches(bytes(batch), max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD


def test_validate_produce_v3_plus_requires_exactly_one_batch():
    batch = good_batch()
    assert len(validate_batches(batch, max_message_bytes=MB, produce_version=9)) == 1
    with pytest.raises(KafkaError) as e:
        validate_batches(batch + batch, max_message_bytes=MB, produce_version=3)
    assert codes(e) == ErrorCode.INVALID_RECORD
    assert len(validate_batches(batch + batch, max_message_bytes=MB)) == 2


@pytest.mark.parametrize("where", [ATTRIBUTES_OFFSET, 30, HEADER_SIZE - 1, HEADER_SIZE + 3, -1])
def test_validate_detects_flipped_byte_by_crc(where):
    batch = bytearray(good_batch())
    batch[where] ^= 0x01
    with pytest.raises(KafkaError) as e:
        validate_batches(bytes(batch), max_message_bytes=MB)
    assert codes(e) == ErrorCode.CORRUPT_MESSAGE


def test_validate_detects_flipped_crc_field():
    batch = bytearray(good_batch())
    batch[CRC_OFFSET] ^= 0x80
    with pytest.raises(CorruptRecordError):
        validate_batches(bytes(batch), max_message_bytes=MB)


@pytest.mark.parametrize("count,delta", [(0, -1), (-1, -2), (3, 1), (1, 1)])
def test_validate_rejects_record_count_inconsistent_with_offset_delta(count, delta):
    batch = patch_header(good_batch(), record_count=count, last_offset_delta=delta)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD


def test_validate_rejects_nonzero_base_offset_from_client_only():
    batch = good_batch(base_offset=5)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD
    assert validate_batches(batch, max_message_bytes=MB, from_client=False)[0].base_offset == 5


def test_validate_rejects_control_batch_from_client_only():
    marker = build_control_batch(CONTROL_COMMIT, producer_id=7, producer_epoch=1, timestamp=T0)
    with pytest.raises(KafkaError) as e:
        validate_batches(marker, max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD
    assert validate_batches(marker, max_message_bytes=MB, from_client=False)[0].is_control


def test_validate_rejects_producer_id_without_sequence_from_client():
    batch = good_batch(producer_id=42, producer_epoch=0, base_sequence=-1)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB)
    assert codes(e) == ErrorCode.INVALID_RECORD
    assert validate_batches(good_batch(producer_id=42, producer_epoch=0, base_sequence=0),
                            max_message_bytes=MB)[0].base_sequence == 0


def test_validate_rejects_batch_larger_than_max_message_bytes():
    batch = good_batch()
    assert validate_batches(batch, max_message_bytes=len(batch))
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=len(batch) - 1)
    assert codes(e) == ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_validate_rejects_unknown_compression_codec(codec):
    batch = patch_header(good_batch(), attributes=codec)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB)
    assert codes(e) == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_validate_rejects_zstd_before_produce_v7():
    batch = good_batch(compression=Compression.ZSTD)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB, produce_version=6)
    assert codes(e) == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert validate_batches(batch, max_message_bytes=MB, produce_version=7)
    assert validate_batches(batch, max_message_bytes=MB)


def test_validate_rejects_timestamp_too_far_in_the_future():
    batch = good_batch()  # timestamps T0, T0 + 1
    assert validate_batches(batch, max_message_bytes=MB, now_ms=T0 - 10, timestamp_after_max_ms=11)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB, now_ms=T0 - 10, timestamp_after_max_ms=10)
    assert codes(e) == ErrorCode.INVALID_TIMESTAMP


def test_validate_rejects_timestamp_too_far_in_the_past():
    batch = good_batch()
    assert validate_batches(batch, max_message_bytes=MB, now_ms=T0 + 10, timestamp_before_max_ms=10)
    with pytest.raises(KafkaError) as e:
        validate_batches(batch, max_message_bytes=MB, now_ms=T0 + 10, timestamp_before_max_ms=9)
    assert codes(e) == ErrorCode.INVALID_TIMESTAMP


def test_validate_skips_timestamp_bounds_for_log_append_time_topics():
    batch = good_batch()
    assert validate_batches(batch, max_message_bytes=MB, now_ms=0, timestamp_before_max_ms=0,
                            timestamp_after_max_ms=0, log_append_time=True)


def test_validate_default_timestamp_bounds_never_overflow_or_reject():
    batch = build_batch([SimpleRecord(b"a", timestamp=2**63 - 1), SimpleRecord(b"b", timestamp=0)])
    assert validate_batches(batch, max_message_bytes=MB, now_ms=T0)
    earliest = build_batch([SimpleRecord(b"a", timestamp=-(2**63))])
    assert validate_batches(earliest, max_message_bytes=MB, now_ms=T0)


def test_validate_rejects_log_append_time_type_set_by_client_as_kafka_does():
    batch = good_batch(log_append_time=True)
    with pytest.raises(KafkaError) as e:  # LogAppendTime topic
        validate_batches(batch, max_message_bytes=MB, now_ms=T0, log_append_time=True)
    assert codes(e) == ErrorCode.INVALID_TIMESTAMP
    no_time = patch_header(batch, max_timestamp=-1)
    with pytest.raises(KafkaError) as e:  # CreateTime topic, no usable timestamp
        validate_batches(no_time, max_message_bytes=MB, now_ms=T0)
    assert codes(e) == ErrorCode.INVALID_TIMESTAMP
    assert validate_batches(batch, max_message_bytes=MB, now_ms=T0)  # CreateTime, valid time
    assert validate_batches(batch, max_message_bytes=MB, log_append_time=True, from_client=False)


KEYLESS = ("Compacted topic cannot accept message without key in topic partition "
           "compacted-3")


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_validate_refuses_keyless_records_on_compacted_topics_naming_each(codec):
    records = [SimpleRecord(b"v%d" % i, None if i in (1, 4, 5, 6) else b"k%d" % i, (), T0 + i)
               for i in range(8)]
    batch = build_batch(records, compression=codec)
    validate_batches(batch, max_message_bytes=MB)   # not compacted: no key needed
    with pytest.raises(KafkaError) as info:
        validate_batches(batch, max_message_bytes=MB, compacted_topic_partition="compacted-3")
    err = info.value
    assert err.code == ErrorCode.INVALID_RECORD
    assert err.record_errors == [(i, KEYLESS) for i in (1, 4, 5, 6)]
    assert str(err) == (
        "One or more records have been rejected due to 4 record errors in total, and only "
        "showing the first three errors at most: ["
        f"RecordError(batchIndex=1, message='{KEYLESS}'), "
        f"RecordError(batchIndex=4, message='{KEYLESS}'), "
        f"RecordError(batchIndex=5, message='{KEYLESS}')]")


@pytest.mark.parametrize("key", [b"", b"k", b"k" * 300])
def test_validate_accepts_keyed_records_on_compacted_topics_even_empty_keys(key):
    # long timestamp and offset deltas make multi-byte varints before the key length
    records = [SimpleRecord(b"v" * 200, key, (), T0 + i * 10**9) for i in range(200)]
    validate_batches(build_batch(records), max_message_bytes=MB,
                     compacted_topic_partition="compacted-3")


def test_validate_ignores_missing_base_timestamp_for_past_bound():
    batch = build_batch([SimpleRecord(b"a", timestamp=-1)])
    assert validate_batches(batch, max_message_bytes=MB, now_ms=T0, timestamp_before_max_ms=1)


# ---------------------------------------------------------------------------------------------
# assign_offsets


def three_batches() -> bytes:
    return concat(
        build_batch([SimpleRecord(b"a", timestamp=T0 + 5), SimpleRecord(b"b", timestamp=T0 + 1)]),
        build_batch([SimpleRecord(b"c", timestamp=T0 + 9)], compression=Compression.GZIP),
        build_batch([SimpleRecord(b"d", timestamp=T0 + 9), SimpleRecord(b"e", timestamp=T0 + 2),
                     SimpleRecord(b"f", timestamp=T0 + 3)]))


def test_assign_offsets_keeps_crc_valid_without_recompute():
    original = three_batches()
    buf = bytearray(original)
    headers = validate_batches(buf, max_message_bytes=MB)
    result = assign_offsets(buf, headers, base_offset=100, leader_epoch=7)
    assert isinstance(result, AssignResult)
    assert (result.first_offset, result.last_offset) == (100, 105)
    assert [h.base_offset for h in result.headers] == [100, 102, 103]
    for old, new in zip(headers, result.headers):
        assert new.crc == old.crc
        crc_to_end = slice(old.position + CRC_OFFSET, old.position + old.size)
        assert buf[crc_to_end] == original[crc_to_end]
        assert read_header(buf, new.position) == new
        assert new.partition_leader_epoch == 7
        assert batch_crc_ok(buf, new)
    assert [r.offset for r in iter_records(buf)] == list(range(100, 106))
    assert validate_batches(buf, max_message_bytes=MB, from_client=False) == result.headers


@given(batches=st.lists(st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 10_000)),
                                 min_size=1, max_size=5), min_size=1, max_size=8),
       base=st.integers(0, 2**40), epoch=st.integers(0, 2**31 - 1))
def test_gathered_offset_assignment_writes_the_bytes_in_place_assignment_makes(batches, base,
                                                                               epoch):
    """The produce path's assignment (a new 16-byte prefix per batch around views of the
    producer's bytes) joins to exactly what rewriting a copy in place gives, with the same
    offsets, max timestamp and headers, and leaves the producer's bytes as they were."""
    data = concat(*(build_batch([SimpleRecord(v, timestamp=T0 + t) for v, t in b])
                    for b in batches))
    headers = validate_batches(data, max_message_bytes=MB)
    copy = bytearray(data)
    expected = assign_offsets(copy, headers, base, epoch)
    got = assign_offsets_gathered(data, headers, base, epoch)
    assert b"".join(got.parts) == copy
    assert got._replace(parts=None) == expected
    assert data == concat(*(build_batch([SimpleRecord(v, timestamp=T0 + t) for v, t in b])
                            for b in batches))


def test_assign_offsets_reports_shallow_offset_of_first_batch_with_greatest_max_timestamp():
    buf = bytearray(three_batches())  # max timestamps T0+5, T0+9, T0+9
    result = assign_offsets(buf, validate_batches(buf, max_message_bytes=MB), 10, 0)
    assert result.max_timestamp == T0 + 9
    assert result.shallow_offset_of_max_timestamp == 12  # last offset of the second batch


def test_assign_offsets_recomputes_crc_for_log_append_time():
    buf = bytearray(three_batches())
    headers = validate_batches(buf, max_message_bytes=MB)
    append_time = T0 + 1_000_000
    result = assign_offsets(buf, headers, base_offset=0, leader_epoch=2,
                            log_append_time_ms=append_time)
    for old, new in zip(headers, result.headers):
        assert new.attributes == old.attributes | TIMESTAMP_TYPE_MASK
        assert new.max_timestamp == append_time and new.crc != old.crc
        assert read_header(buf, new.position) == new
        assert batch_crc_ok(buf, new)
    assert result.max_timestamp == append_time
    assert result.shallow_offset_of_max_timestamp == 1
    assert {r.timestamp for r in iter_records(buf)} == {append_time}
    assert [r.value for r in iter_records(buf)] == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_assign_offsets_writes_through_a_memoryview_slice():
    prefix = b"\xaa" * 9
    buf = bytearray(prefix + good_batch())
    view = memoryview(buf)[len(prefix):]
    result = assign_offsets(view, validate_batches(view, max_message_bytes=MB), 50, 1)
    assert buf[:len(prefix)] == prefix
    assert read_header(buf, len(prefix)).base_offset == 50 == result.first_offset
    view.release()


def test_assign_offsets_refuses_read_only_buffer():
    batch = good_batch()
    with pytest.raises(TypeError):
        assign_offsets(batch, validate_batches(batch, max_message_bytes=MB), 0, 0)


# ---------------------------------------------------------------------------------------------
# control batches, iteration


@pytest.mark.parametrize("ctype", [CONTROL_ABORT, CONTROL_COMMIT])
def test_control_batch_round_trip_keeps_type_and_coordinator_epoch(ctype):
    marker = build_control_batch(ctype, producer_id=77, producer_epoch=4, coordinator_epoch=12,
                                 base_offset=30, partition_leader_epoch=3, timestamp=T0)
    h = read_header(marker)
    assert h.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK) == CONTROL_MASK | TRANSACTIONAL_MASK
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (77, 4, -1)
    assert (h.base_offset, h.partition_leader_epoch, h.record_count) == (30, 3, 1)
    assert batch_crc_ok(marker, h)
    assert control_type(marker, h) == ctype
    (record,) = decode_batch(marker, h)
    assert record == Record(30, T0, struct.pack(">hh", 0, ctype), struct.pack(">hi", 0, 12), ())


def test_iter_records_skips_control_batches_unless_asked():
    data = concat(good_batch(), build_control_batch(CONTROL_COMMIT, producer_id=1, producer_epoch=0,
                                                     base_offset=2, timestamp=T0))
    assert [r.value for r in iter_records(data)] == [b"v1", b"v2"]
    assert [r.offset for r in iter_records(data, include_control=True)] == [0, 1, 2]


def test_iter_headers_stops_at_partial_tail():
    a = good_batch()
    b = good_batch(base_offset=2)
    for cut in (1, 20, HEADER_SIZE, len(b) - 1):
        headers = list(iter_headers(a + b[:cut]))
        assert [h.position for h in headers] == [0]
    assert [h.base_offset for h in iter_headers(a + b)] == [0, 2]
    assert [h.position for h in iter_headers(a + b, len(a))] == [len(a)]
    assert list(iter_headers(a + b, 0, len(a) - 1)) == []


def test_iter_records_ignores_partial_tail_and_honours_range():
    a = good_batch()
    b = good_batch(base_offset=2)
    assert [r.offset for r in iter_records(a + b + a[:30])] == [0, 1, 2, 3]
    assert [r.offset for r in iter_records(a + b, len(a))] == [2, 3]
    assert [r.offset for r in iter_records(a + b, 0, len(a))] == [0, 1]


# ---------------------------------------------------------------------------------------------
# corrupt content on decode


@pytest.mark.parametrize("codec", [c for c in ALL_CODECS if c], ids=lambda c: c.name)
def test_decode_rejects_undecodable_compressed_payload_as_corrupt(codec):
    batch = with_payload(good_batch(), b"\x00this is not compressed data at all", codec)
    with pytest.raises(CorruptRecordError):
        decode_batch(batch, read_header(batch))


def test_decode_rejects_truncated_xerial_block():
    batch = build_batch(sample_records(), compression=Compression.SNAPPY)
    broken = with_payload(batch, records_section(batch)[:-10], Compression.SNAPPY)
    with pytest.raises(CorruptRecordError):
        decode_batch(broken, read_header(broken))


@pytest.mark.parametrize("count", [1, 3, 1000])
def test_decode_rejects_record_count_that_does_not_match_content(count):
    batch = patch_header(good_batch(), record_count=count)
    with pytest.raises(CorruptRecordError):
        decode_batch(batch, read_header(batch))


def test_decode_rejects_record_length_that_overruns_the_batch():
    batch = bytearray(good_batch())
    batch[HEADER_SIZE] = 0x7E  # first record's length varint: 63 bytes
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(batch), read_header(batch))


def test_decode_rejects_invalid_utf8_header_key():
    batch = build_batch([SimpleRecord(b"v", None, (("k", b"v"),), T0)])
    pos = batch.rindex(b"k\x02v")
    broken = bytearray(batch)
    broken[pos] = 0xFF
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(broken), read_header(broken))


def test_decode_checks_crc_only_when_asked():
    batch = bytearray(good_batch())
    batch[-2] ^= 0x01  # last byte of the last value (the header count follows); structure intact
    h = read_header(batch)
    assert len(decode_batch(batch, h)) == 2
    with pytest.raises(CorruptRecordError):
        decode_batch(batch, h, check_crc=True)


def test_decode_rejects_other_magic():
    batch = bytearray(good_batch())
    batch[16] = 1
    with pytest.raises(CorruptRecordError):
        decode_batch(batch, read_header(batch))


def test_decode_returns_no_records_for_empty_compacted_batch():
    batch = good_batch()
    empty = patch_header(batch[:HEADER_SIZE], batch_length=HEADER_SIZE - 12, record_count=0)
    assert decode_batch(empty, read_header(empty)) == []


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(ALL_CODECS), data=st.data())
def test_mutated_batches_fail_only_with_kafka_errors(codec, data):
    batch = bytearray(build_batch(compressible_records()[:6], compression=codec))
    for _ in range(data.draw(st.integers(1, 4))):
        batch[data.draw(st.integers(0, len(batch) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(batch)))
    buf = bytes(batch[:cut])
    try:
        validate_batches(buf, max_message_bytes=MB, produce_version=9, now_ms=T0,
                         timestamp_before_max_ms=10**6, timestamp_after_max_ms=10**6)
    except KafkaError:
        pass
    if len(buf) >= HEADER_SIZE:
        try:
            decode_batch(buf, read_header(buf))
        except CorruptRecordError:
            pass


# ---------------------------------------------------------------------------------------------
# compatibility with kafka-python, an independent implementation

try:
    from kafka import codec as kafka_codec
    from kafka.record import default_records as kafka_records
except ImportError:  # the rest of the module still runs
    kafka_codec = kafka_records = None

needs_kafka_python = pytest.mark.skipif(kafka_records is None, reason="kafka-python not installed")
_KP_AVAILABLE = {
    Compression.NONE: kafka_codec is not None,
    Compression.GZIP: kafka_codec is not None and kafka_codec.has_gzip(),
    Compression.SNAPPY: kafka_codec is not None and kafka_codec.has_snappy(),
    Compression.LZ4: kafka_codec is not None and kafka_codec.has_lz4(),
    Compression.ZSTD: kafka_codec is not None and kafka_codec.has_zstd(),
}
kp_codecs = pytest.mark.parametrize(
    "codec",
    [pytest.param(c, id=c.name, marks=pytest.mark.skipif(not _KP_AVAILABLE[c],
                                                         reason=f"kafka-python lacks {c.name}"))
     for c in ALL_CODECS])


def compressible_records() -> list[SimpleRecord]:
    # kafka-python sends uncompressed when compression does not shrink the data
    return [
        SimpleRecord(b"payload " * 40 + bytes([i]), None if i % 3 == 0 else b"key-%d" % i,
                     (("h", b"x"), ("n", None)) if i % 2 else (), T0 + (i * 37) % 11)
        for i in range(30)
    ] + [SimpleRecord(None, b"tombstone", (), T0 - 3), SimpleRecord(b"y" * 100_000, b"big", (), T0)]


@kp_codecs
def test_kafka_python_batches_decode_with_ours(codec):
    records = compressible_records()
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=int(codec), is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=16 * MB)
    for i, r in enumerate(records):
        assert builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value,
                              headers=list(r.headers)) is not None
    batch = bytes(builder.build())
    (header,) = validate_batches(batch, max_message_bytes=16 * MB, now_ms=T0)
    assert header.compression == codec
    assert decode_batch(batch, header, check_crc=True) == [
        Record(i, r.timestamp, r.key, r.value, tuple(r.headers)) for i, r in enumerate(records)]


@kp_codecs
def test_our_batches_decode_with_kafka_python(codec):
    records = compressible_records()
    batch = build_batch(records, compression=codec, base_offset=500, producer_id=9,
                        producer_epoch=2, base_sequence=100, partition_leader_epoch=6)
    theirs = kafka_records.DefaultRecordBatch(bytearray(batch))
    assert theirs.validate_crc()
    assert theirs.compression_type == codec
    assert (theirs.base_offset, theirs.leader_epoch, theirs.records_count) == (500, 6, len(records))
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (9, 2, 100)
    assert theirs.max_timestamp == max(r.timestamp for r in records)
    decoded = [(m.offset, m.timestamp, m.key, m.value, [tuple(h) for h in m.headers])
               for m in theirs]
    assert decoded == [(500 + i, r.timestamp, r.key, r.value, list(r.headers))
                       for i, r in enumerate(records)]


@needs_kafka_python
def test_kafka_python_reads_log_append_time_after_assign_offsets():
    buf = bytearray(build_batch(compressible_records(), compression=Compression.GZIP))
    assign_offsets(buf, validate_batches(buf, max_message_bytes=16 * MB), 1000, 3,
                   log_append_time_ms=T0 + 42)
    theirs = kafka_records.DefaultRecordBatch(bytearray(buf))
    assert theirs.validate_crc() and theirs.base_offset == 1000
    assert {m.timestamp for m in theirs} == {T0 + 42}


@needs_kafka_python
def test_kafka_python_reads_our_control_batch():
    marker = build_control_batch(CONTROL_ABORT, producer_id=5, producer_epoch=1,
                                 coordinator_epoch=8, timestamp=T0)
    theirs = kafka_records.DefaultRecordBatch(bytearray(marker))
    assert theirs.validate_crc() and theirs.is_control_batch and theirs.is_transactional
    (record,) = list(theirs)
    assert record.abort and not record.commit


def _reseal(batch: bytearray, records: bytes, count: int) -> bytes:
    """``batch``'s header over new ``records`` and ``count``, with a correct length and CRC."""
    import crc32c as _c
    out = bytearray(batch[:61]) + records
    struct.pack_into(">i", out, 8, len(out) - 12)            # batchLength
    struct.pack_into(">i", out, 23, count - 1)               # lastOffsetDelta
    struct.pack_into(">i", out, 57, count)                   # recordCount
    struct.pack_into(">I", out, 17, _c.crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4])
@pytest.mark.parametrize("damage", ["one-record-missing", "extra-count", "trailing-bytes", "cut-short"])
def test_batches_whose_records_do_not_frame_are_refused_though_their_crc_matches(codec, damage):
    recs = [SimpleRecord(b"value-%d" % i, b"k", (), 1_700_000_000_000) for i in range(5)]
    plain = bytearray(build_batch(recs))
    records = bytes(plain[61:])
    count = 5
    if damage == "one-record-missing":
        records = bytes(build_batch(recs[:4]))[61:]  # four whole records, five declared
    elif damage == "extra-count":
        count = 6
    elif damage == "trailing-bytes":
        records += b"\x00\x00"
    else:
        records = records[:-3]
    if codec != Compression.NONE:
        records = bytes(cramjam.lz4.compress(records))
        struct.pack_into(">h", plain, 21, codec)
    bad = _reseal(plain, records, count)
    with pytest.raises(KafkaError) as e:
        validate_batches(bad, max_message_bytes=1 << 20)
    assert e.value.code == ErrorCode.INVALID_RECORD
    assert validate_batches(_reseal(plain, bytes(plain[61:]) if codec == Compression.NONE
                                    else bytes(cramjam.lz4.compress(bytes(plain[61:]))), 5),
                            max_message_bytes=1 << 20)


# ---------------------------------------------------------------------------------------------
# compression bombs: a produced batch inflates to at most MAX_INFLATED_BATCH_BYTES


def test_a_zstd_batch_inflating_past_the_bound_is_refused_as_too_large_before_its_records():
    from strata.common.errors import RecordTooLargeError
    from strata.protocol.records import MAX_INFLATED_BATCH_BYTES
    bomb = bytes(cramjam.zstd.compress(bytes(MAX_INFLATED_BATCH_BYTES + MB)))
    batch = with_payload(build_batch([SimpleRecord(b"v", timestamp=T0)]), bomb, Compression.ZSTD)
    assert len(batch) < 64 * 1024
    with pytest.raises(RecordTooLargeError, match="inflates"):
        validate_batches(batch, produce_version=9, max_message_bytes=MB)


_RAW_COMPRESS = {Compression.GZIP: cramjam.gzip.compress, Compression.SNAPPY: cramjam.snappy.compress_raw,
                 Compression.LZ4: cramjam.lz4.compress, Compression.ZSTD: cramjam.zstd.compress}


@pytest.mark.parametrize("codec", list(_RAW_COMPRESS), ids=lambda c: c.name)
def test_inflating_tells_a_batch_too_large_for_the_bound_from_a_damaged_one(codec):
    from strata.common.errors import RecordTooLargeError
    from strata.protocol.records import inflate_bounded
    data = bytes(range(256)) * 400
    packed = bytes(_RAW_COMPRESS[codec](data))
    assert bytes(inflate_bounded(codec, packed, limit=len(data))) == data
    with pytest.raises(RecordTooLargeError):
        inflate_bounded(codec, packed, limit=len(data) - 1)
    with pytest.raises(CorruptRecordError):
        inflate_bounded(codec, packed[:len(packed) // 2] + bytes(7), limit=len(data))
