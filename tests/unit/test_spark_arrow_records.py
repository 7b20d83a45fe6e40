"""Record batches to Arrow in the Spark Kafka source's schema (strata.spark.arrow_records):
round trips against records.py's builder and decoder for every codec and batch shape, control
batches, offset ranges, CRC and structure errors, nulls, headers, LogAppendTime, and one
check that PySpark 4.0 loads the batches as they are."""

from __future__ import annotations

import datetime
import random
import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.common.errors import CorruptRecordError
from strata.protocol.records import (
    ATTRIBUTES_OFFSET, CONTROL_COMMIT, CRC_OFFSET, HEADER, HEADER_SIZE, Compression, SimpleRecord,
    build_batch, build_control_batch, crc32c, iter_records, read_header, read_varint)
from strata.spark.arrow_records import (
    SPARK_SCHEMA_DDL, SPARK_SCHEMA_DDL_WITH_HEADERS, arrow_schema, batches_to_arrow)

T0 = 1_700_000_000_000
TOPIC = "orders"


def rows(data, start=0, end=2**62, **kw):
    out = []
    for batch in batches_to_arrow(data, TOPIC, 3, start, end, **kw):
        batch.validate(full=True)
        assert batch.schema == arrow_schema(kw.get("include_headers", False))
        out += batch.to_pylist()
    return out


def expected(data, start=0, end=2**62):
    """What records.py's reference decoder says, as rows."""
    out = []
    for h in _headers(data):
        if h.is_control:
            continue
        for r in iter_records(data[h.position:h.position + h.size]):
            if start <= r.offset < end:
                out.append({
                    "key": r.key, "value": r.value, "topic": TOPIC, "partition": 3,
                    "offset": r.offset,
                    "timestamp": datetime.datetime.fromtimestamp(r.timestamp / 1000, datetime.UTC),
                    "timestampType": 1 if h.is_log_append_time else 0,
                    "headers": [{"key": k, "value": v} for k, v in r.headers]})
    return out


def _headers(data):
    from strata.protocol.records import iter_headers
    return list(iter_headers(data))


def without_headers(rows_):
    return [{k: v for k, v in r.items() if k != "headers"} for r in rows_]


def sample(i: int, value_size: int = 100) -> SimpleRecord:
    key = None if i % 7 == 3 else b"key-%d" % i
    value = None if i % 11 == 5 else (b"" if i % 13 == 6 else bytes([i % 251]) * value_size)
    headers = tuple((f"h{j}", None if j == 2 else b"v%d" % j) for j in range(i % 4))
    return SimpleRecord(value, key, headers, T0 + i * 3 - 50)


def log_of(batches: int, per_batch: int, codec: int = Compression.NONE, value_size: int = 100) -> bytes:
    out = []
    for b in range(batches):
        base = b * per_batch
        out.append(build_batch([sample(base + i, value_size) for i in range(per_batch)],
                               base_offset=base, compression=codec))
    return b"".join(out)


# ---- schema -----------------------------------------------------------------------------------

def test_the_arrow_schema_is_what_pyspark_derives_from_the_ddl():
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
        TimestampType)
    base = [StructField("key", BinaryType()), StructField("value", BinaryType()),
            StructField("topic", StringType()), StructField("partition", IntegerType()),
            StructField("offset", LongType()), StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType())]
    headers = StructField("headers", ArrayType(StructType(
        [StructField("key", StringType()), StructField("value", BinaryType())])))
    assert arrow_schema(False) == to_arrow_schema(StructType(base))
    assert arrow_schema(True) == to_arrow_schema(StructType(base + [headers]))
    assert SPARK_SCHEMA_DDL_WITH_HEADERS.startswith(SPARK_SCHEMA_DDL)
    assert [f.split()[0] for f in SPARK_SCHEMA_DDL.split(", ")] == arrow_schema(False).names


# ---- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("batches, per_batch", [(3, 40), (150, 4)], ids=["few-batches", "many-batches"])
def test_every_codec_round_trips_keys_values_headers_offsets_and_timestamps(codec, batches, per_batch):
    data = log_of(batches, per_batch, codec)
    got = rows(data, include_headers=True)
    assert len(got) == batches * per_batch
    assert got == expected(data)


def test_without_headers_the_rows_have_the_seven_kafka_source_columns():
    data = log_of(5, 10)
    got = rows(data)
    assert list(got[0]) == arrow_schema(False).names
    assert got == without_headers(expected(data))


def test_null_keys_null_values_and_empty_values_stay_distinct():
    data = build_batch([SimpleRecord(b"", None, (), T0), SimpleRecord(None, b"", (), T0),
                        SimpleRecord(b"x", b"k", (), T0)])
    got = rows(data)
    assert [(r["key"], r["value"]) for r in got] == [(None, b""), (b"", None), (b"k", b"x")]


def test_headers_keep_order_repeats_null_values_and_utf8_names():
    hs = (("trace", b"abc"), ("empty", b""), ("null", None), ("ключ", b"\x00\xff"), ("trace", b"2"))
    data = build_batch([SimpleRecord(b"v", b"k", hs, T0), SimpleRecord(b"w", None, (), T0)])
    got = rows(data, include_headers=True)
    assert got[0]["headers"] == [{"key": k, "value": v} for k, v in hs]
    assert got[1]["headers"] == []


def test_long_varints_decode_large_values_headers_and_timestamp_deltas():
    records = [SimpleRecord(b"x" * 70_000, b"k" * 300, (("h" * 200, b"y" * 20_000),), T0),
               SimpleRecord(b"y", b"k2", (), T0 - 10**12),       # negative 6-byte delta
               SimpleRecord(b"z" * 9000, None, (), T0 + 10**11)]
    data = build_batch(records, base_offset=1000)
    got = rows(data, include_headers=True)
    assert got == expected(data)
    assert [r["offset"] for r in got] == [1000, 1001, 1002]


def test_a_long_varint_in_the_last_few_bytes_of_the_buffer_decodes():
    # the last record is 8 bytes: a 3-byte timestamp delta, then four 1-byte fields
    data = build_batch([SimpleRecord(None, None, (), T0), SimpleRecord(None, None, (), T0 + 8192)])
    assert rows(data, include_headers=True) == expected(data)


def test_log_append_time_batches_give_every_record_the_batch_max_timestamp():
    create = build_batch([sample(0), sample(1)], base_offset=0)
    append = build_batch([SimpleRecord(b"a", None, (), T0 + 5), SimpleRecord(b"b", None, (), T0 + 9)],
                         base_offset=2, log_append_time=True)
    got = rows(create + append)
    assert [r["timestampType"] for r in got] == [0, 0, 1, 1]
    when = datetime.datetime.fromtimestamp((T0 + 9) / 1000, datetime.UTC)
    assert [r["timestamp"] for r in got[2:]] == [when, when]
    assert got[0]["timestamp"] == datetime.datetime.fromtimestamp((T0 - 50) / 1000, datetime.UTC)


def test_timestamps_are_utc_microseconds_of_the_record_milliseconds():
    data = build_batch([SimpleRecord(b"v", None, (), 1_700_000_000_123)])
    batch = next(batches_to_arrow(data, TOPIC, 0, 0, 1))
    assert batch.column("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]


# ---- control batches and offset ranges --------------------------------------------------------

def test_control_batches_are_skipped_and_transactional_records_kept():
    txn = build_batch([sample(0), sample(1)], base_offset=0, producer_id=7, producer_epoch=0,
                      base_sequence=0, transactional=True)
    marker = build_control_batch(CONTROL_COMMIT, producer_id=7, producer_epoch=0, base_offset=2)
    after = build_batch([sample(3)], base_offset=3)
    got = rows(txn + marker + after)
    assert [r["offset"] for r in got] == [0, 1, 3]


@pytest.mark.parametrize("start, end", [(0, 600), (17, 18), (13, 501), (45, 47), (598, 2000)])
def test_only_offsets_in_the_range_are_returned(start, end):
    data = log_of(150, 4, Compression.LZ4)    # offsets 0..599
    got = rows(data, start, end, include_headers=True)
    assert [r["offset"] for r in got] == list(range(start, min(end, 600)))
    assert got == expected(data, start, end)


def test_a_range_outside_the_data_gives_no_batches():
    data = log_of(3, 10)
    assert list(batches_to_arrow(data, TOPIC, 0, 30, 40)) == []
    assert list(batches_to_arrow(data, TOPIC, 0, 5, 5)) == []
    assert list(batches_to_arrow(b"", TOPIC, 0, 0, 10)) == []


def test_max_rows_splits_one_large_batch_and_many_small_ones():
    big = build_batch([sample(i) for i in range(250)], base_offset=0)
    sizes = [b.num_rows for b in batches_to_arrow(big, TOPIC, 0, 0, 250, max_rows=100)]
    assert sizes == [100, 100, 50]
    small = log_of(100, 3)
    sizes = [b.num_rows for b in batches_to_arrow(small, TOPIC, 0, 0, 300, max_rows=64)]
    assert max(sizes) <= 64 and sum(sizes) == 300


def test_a_memoryview_input_reads_like_bytes():
    data = log_of(4, 5, Compression.SNAPPY)
    view_rows = [r for b in batches_to_arrow(memoryview(bytearray(data)), TOPIC, 3, 0, 20,
                                             include_headers=True) for r in b.to_pylist()]
    assert view_rows == expected(data)


def test_earlier_results_survive_later_decoding_of_compressed_data():
    first = log_of(70, 3, Compression.ZSTD)
    kept = list(batches_to_arrow(first, TOPIC, 3, 0, 2**62, include_headers=True))
    second = log_of(70, 3, Compression.GZIP, value_size=300)     # reuses the decode buffer
    list(batches_to_arrow(second, TOPIC, 3, 0, 2**62, include_headers=True))
    assert [r for b in kept for r in b.to_pylist()] == expected(first)


def test_results_do_not_refer_to_the_input_buffer_so_it_can_be_reused():
    data = log_of(4, 30)
    buf = bytearray(data)
    kept = list(batches_to_arrow(memoryview(buf), TOPIC, 3, 0, 2**62, include_headers=True))
    buf[:] = bytes(len(buf))                # the reader's next piece overwrites it
    assert [r for b in kept for r in b.to_pylist()] == expected(data)


def same_size(i: int, size: int) -> SimpleRecord:
    return SimpleRecord(bytes([i % 251]) * size, b"k%03d" % (i % 1000), (), T0 + i)


@pytest.mark.parametrize("sizes", [
    [1024] * 200,                                   # one run
    [1024] * 90 + [7] + [1024] * 109,               # a different record inside a run
    [300] * 50 + [5000] * 50 + [0] * 50,            # runs of three sizes, 1- to 2-byte lengths
    [10, 11] * 60,                                  # no two neighbours alike
    [20] * 3 + [21] * 3 + [22] * 3 + [20] * 40,     # runs too short to check at once
    [20_000] * 30,                                  # 3-byte record lengths
    [64] * 40 + [65] * 30 + [3, 900, 17, 4000, 0, 250] + [64] * 60,   # run, run, no run, run
    [1024] * 3000,                                  # the offset delta grows a byte at 64
], ids=["one-run", "odd-one-out", "three-runs", "alternating", "short-runs", "long-records",
        "runs-then-random", "long-batch"])
def test_runs_of_equal_size_records_decode_like_the_reference(sizes):
    data = build_batch([same_size(i, n) for i, n in enumerate(sizes)], base_offset=40)
    assert rows(data, include_headers=True) == expected(data)
    assert rows(memoryview(bytearray(data)), 100, 150) == without_headers(expected(data, 100, 150))


# ---- corruption -------------------------------------------------------------------------------

def flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0x01
    return bytes(out)


def test_a_crc_mismatch_names_the_topic_partition_and_batch_base_offset():
    data = b"".join(build_batch([SimpleRecord(b"v" * 20, b"k", (), T0)] * 10, base_offset=b * 10)
                    for b in range(3))
    second = _headers(data)[1]
    bad = flip(data, second.position + second.size - 5)   # a value byte of offset 19
    with pytest.raises(CorruptRecordError, match=r"orders-3.*base offset 10\b"):
        rows(bad)
    got = rows(bad, check_crc=False)                      # unchecked: the flipped byte shows
    assert got[19]["value"] == b"v" * 16 + b"w" + b"v" * 3
    assert [r["value"] for r in got[:19] + got[20:]] == [b"v" * 20] * 29


def with_fields(batch: bytes, payload: bytes | None = None, **changes) -> bytes:
    """The batch with header fields (and records section) replaced, CRC recomputed."""
    h = read_header(batch)
    body = batch[HEADER_SIZE:] if payload is None else payload
    h = h._replace(batch_length=HEADER_SIZE - 12 + len(body), **changes)
    out = bytearray(HEADER.pack(*h[:-1]) + body)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def test_truncated_input_is_an_error_not_a_silent_stop():
    data = log_of(3, 10)
    with pytest.raises(CorruptRecordError, match="orders-3"):
        rows(data[:-5])
    with pytest.raises(CorruptRecordError):
        rows(data + data[:30])


@pytest.mark.parametrize("many", [False, True], ids=["python-walk", "vector-walk"])
def test_records_that_do_not_fill_their_batch_are_an_error(many):
    base = 80 if many else 0
    good = build_batch([sample(i) for i in range(5)], base_offset=base)
    short = with_fields(good, record_count=4, last_offset_delta=3)      # one record too many
    long = with_fields(good, record_count=6, last_offset_delta=5)       # one record missing
    padded = with_fields(good, payload=good[HEADER_SIZE:] + b"\x00\x00")
    before = log_of(80, 1) if many else b""     # 81 batches: the walk steps them together
    for bad in (short, long, padded):
        with pytest.raises(CorruptRecordError, match="orders-3"):
            rows(before + bad)


@pytest.mark.parametrize("at", [1, 57, 63])
def test_a_bad_record_length_inside_a_run_of_equal_records_is_an_error(at):
    batch = build_batch([SimpleRecord(b"v" * 20, b"k", (), T0) for _ in range(64)])
    size = (len(batch) - HEADER_SIZE) // 64        # offset deltas 0-63: every record this long
    body = bytearray(batch[HEADER_SIZE:])
    assert read_varint(body, 0)[0] == read_varint(body, 50 * size)[0] == size - 1
    body[at * size] += 2                            # its length varint: one byte longer
    with pytest.raises(CorruptRecordError, match="orders-3"):
        rows(with_fields(batch, payload=bytes(body)))


def test_a_record_length_overrunning_its_fields_is_an_error():
    body = bytearray(build_batch([SimpleRecord(b"abc", b"k", (), T0)])[HEADER_SIZE:])
    # record: length, attributes, ts delta, offset delta, key len (k), key, value len ...
    body[4] = 0x10                          # key length 8: runs into the value
    with pytest.raises(CorruptRecordError):
        rows(with_fields(build_batch([SimpleRecord(b"abc", b"k", (), T0)]), payload=bytes(body)))


def test_other_magic_values_are_refused():
    data = bytearray(log_of(1, 2))
    data[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        rows(bytes(data), check_crc=False)


# ---- property: any records round trip ----------------------------------------------------------

record_st = st.builds(
    SimpleRecord,
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
             max_size=4).map(tuple),
    st.integers(min_value=0, max_value=2**41))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(record_st, min_size=1, max_size=12),
                          st.sampled_from(list(Compression)), st.booleans()),
                min_size=1, max_size=8),
       st.integers(0, 40), st.integers(0, 60))
def test_any_batches_round_trip_like_the_reference_decoder(batches, start, length):
    parts = []
    base = 0
    for records, codec, append_time in batches:
        parts.append(build_batch(records, base_offset=base, compression=codec,
                                 log_append_time=append_time))
        base += len(records)
    data = b"".join(parts)
    assert rows(data, start, start + length, include_headers=True) == \
        expected(data, start, start + length)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(st.sampled_from([0, 3, 40, 200]), min_size=1, max_size=80),
                          st.booleans()), min_size=1, max_size=4),
       st.integers(0, 100), st.integers(0, 200))
def test_batches_of_few_record_sizes_round_trip_like_the_reference_decoder(batches, start,
                                                                           length):
    parts = []
    base = 0
    for sizes, keyed in batches:
        parts.append(build_batch([SimpleRecord(b"v" * n, b"k" if keyed else None, (), T0 + i)
                                  for i, n in enumerate(sizes)], base_offset=base))
        base += len(sizes)
    data = b"".join(parts)
    assert rows(data, start, start + length) == without_headers(expected(data, start, start + length))


# ---- PySpark 4.0 loads the batches as they are -------------------------------------------------

@pytest.mark.slow
def test_pyspark_loads_the_batches_with_timestamps_nulls_empty_values_and_headers():
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    data = spark_sample_log()      # travels to the Python workers in the reader's closure

    class Reader(DataSourceReader):
        def __init__(self, headers: bool) -> None:
            self.headers = headers

        def partitions(self):
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition):
            yield from batches_to_arrow(data, "orders", partition.value, 0, 2**62,
                                        include_headers=self.headers, max_rows=7)

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "arrow-records-probe"

        def schema(self):
            return SPARK_SCHEMA_DDL_WITH_HEADERS if self.options.get("headers") else SPARK_SCHEMA_DDL

        def reader(self, schema):
            return Reader(bool(self.options.get("headers")))

    from spark_support import spark_session
    spark = spark_session()     # the test process's one session (a second one would lose its jars)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        spark.dataSource.register(Source)
        want = expected(data)
        got = spark.read.format("arrow-records-probe").option("headers", "1").load() \
            .selectExpr("partition", "offset", "key", "value", "unix_millis(timestamp) AS ms",
                        "timestampType", "headers").collect()
        assert len(got) == 2 * len(want)
        for r in got:
            w = want[r["offset"]]
            assert (r["key"], r["value"]) == (w["key"], w["value"])
            assert r["ms"] == int(w["timestamp"].timestamp() * 1000)
            assert r["timestampType"] == w["timestampType"]
            assert [(h["key"], h["value"]) for h in r["headers"]] == \
                [(h["key"], h["value"]) for h in w["headers"]]
        plain = spark.read.format("arrow-records-probe").load()
        assert plain.columns == arrow_schema(False).names
        assert plain.where("key IS NULL").count() == 2 * sum(r["key"] is None for r in want)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def spark_sample_log() -> bytes:
    rng = random.Random(5)
    records = [sample(i, rng.choice([0, 10, 5000])) for i in range(30)]
    return (build_batch(records[:20], base_offset=0, compression=Compression.ZSTD)
            + build_batch(records[20:], base_offset=20, log_append_time=True))
