"""``__transaction_state`` records (strata.coordinator.txn_records) against Kafka's schemas
``TransactionLogKey.json`` (v0) and ``TransactionLogValue.json`` (v0, v1 flexible)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from strata.coordinator.offsets_records import RecordFormatError
from strata.coordinator.txn_records import (
    DEFAULT_TXN_TOPIC_PARTITIONS,
    TRANSACTION_STATE_TOPIC,
    TxnLogValue,
    TxnState,
    UnknownValueVersionError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
    txn_record,
)


def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


ONGOING = TxnLogValue(
    producer_id=1000, producer_epoch=5, transaction_timeout_ms=60_000, state=TxnState.ONGOING,
    partitions=(("orders", (0, 2)),), last_update_ms=1_700_000_000_123,
    start_ms=1_700_000_000_000)
ONGOING_TAGGED = dataclasses.replace(ONGOING, previous_producer_id=999, next_producer_id=1001,
                                     client_transaction_version=2, next_producer_epoch=7)
EMPTY = TxnLogValue(7, 0, 60_000, TxnState.EMPTY, (), 5, -1)
COMPLETE = TxnLogValue(7, 1, 60_000, TxnState.COMPLETE_COMMIT, (), 6, 2)


def test_constants_and_state_ids():
    assert TRANSACTION_STATE_TOPIC == "__transaction_state"
    assert DEFAULT_TXN_TOPIC_PARTITIONS == 50
    # Kafka's TransactionState ids
    assert [(s.name, int(s)) for s in TxnState] == [
        ("EMPTY", 0), ("ONGOING", 1), ("PREPARE_COMMIT", 2), ("PREPARE_ABORT", 3),
        ("COMPLETE_COMMIT", 4), ("COMPLETE_ABORT", 5), ("DEAD", 6), ("PREPARE_EPOCH_FENCE", 7)]


# --------------------------------------------------------------------------- keys

def test_key_bytes_follow_transaction_log_key_v0():
    # version int16 0, TransactionalId string (int16 length + UTF-8)
    expected = i16(0) + i16(5) + b"txn-1"
    assert expected.hex() == "0000000574786e2d31"   # Kafka 4.3.1 TransactionLog.keyToBytes("txn-1")
    assert encode_key("txn-1") == expected
    assert decode_key(expected) == "txn-1"
    # UTF-8 length in bytes, not characters
    assert encode_key("é") == i16(0) + i16(2) + "é".encode()
    assert decode_key(encode_key("")) == ""


def test_unknown_key_version_is_skipped():
    assert decode_key(i16(1) + i16(1) + b"x") is None
    assert decode_key(i16(-1)) is None
    assert decode_key(i16(3) + b"anything at all") is None


@pytest.mark.parametrize("data", [b"", b"\x00", i16(0), i16(0) + b"\x00",
                                  i16(0) + i16(5) + b"txn", i16(0) + i16(-1),
                                  i16(0) + i16(2) + b"\xff\xfe"])
def test_bad_keys_raise(data):
    with pytest.raises(RecordFormatError):
        decode_key(data)


def test_missing_key_raises():
    with pytest.raises(RecordFormatError):
        decode_key(None)


# --------------------------------------------------------------------------- value v1

def test_value_v1_bytes_with_tagged_fields():
    expected = (
        i16(1)                                  # version
        + i64(1000)                             # ProducerId
        + i16(5)                                # ProducerEpoch
        + i32(60_000)                           # TransactionTimeoutMs
        + i8(1)                                 # TransactionStatus ONGOING
        + b"\x02"                               # TransactionPartitions: compact array, 1 + 1
        + b"\x07" + b"orders"                   #   Topic: compact string, 6 + 1
        + b"\x03" + i32(0) + i32(2)             #   PartitionIds: compact array, 2 + 1
        + b"\x00"                               #   PartitionsSchema tagged fields: none
        + i64(1_700_000_000_123)                # TransactionLastUpdateTimestampMs
        + i64(1_700_000_000_000)                # TransactionStartTimestampMs
        + b"\x04"                               # 4 tagged fields, in tag order:
        + b"\x00\x08" + i64(999)                #   tag 0 PreviousProducerId, 8 bytes
        + b"\x01\x08" + i64(1001)               #   tag 1 NextProducerId, 8 bytes
        + b"\x02\x02" + i16(2)                  #   tag 2 ClientTransactionVersion, 2 bytes
        + b"\x03\x02" + i16(7)                  #   tag 3 NextProducerEpoch, 2 bytes
    )
    # what Kafka 4.3.1's generated TransactionLogValue writes for the same fields
    assert expected.hex() == (
        "000100000000000003e800050000ea600102076f7264657273030000000000000002000000018bcfe568"
        "7b0000018bcfe5680004000800000000000003e7010800000000000003e90202000203020007")
    assert encode_value(ONGOING_TAGGED) == expected
    assert decode_value(expected) == ONGOING_TAGGED


def test_value_v1_default_tagged_fields_are_not_written():
    body = (i64(1000) + i16(5) + i32(60_000) + i8(1)
            + b"\x02" + b"\x07orders" + b"\x03" + i32(0) + i32(2) + b"\x00"
            + i64(1_700_000_000_123) + i64(1_700_000_000_000))
    assert encode_value(ONGOING) == i16(1) + body + b"\x00"
    only_ctv = dataclasses.replace(ONGOING, client_transaction_version=1)
    assert encode_value(only_ctv) == i16(1) + body + b"\x01" + b"\x02\x02" + i16(1)
    assert decode_value(i16(1) + body + b"\x00") == ONGOING


def test_value_v1_empty_state_writes_a_null_partition_array():
    expected = (i16(1) + i64(7) + i16(0) + i32(60_000) + i8(0)
                + b"\x00"                       # null compact array
                + i64(5) + i64(-1) + b"\x00")
    assert expected.hex() == "0001000000000000000700000000ea6000000000000000000005ffffffffffffffff00"
    assert encode_value(EMPTY) == expected
    assert decode_value(expected) == EMPTY


def test_value_v1_complete_state_writes_an_empty_partition_array():
    expected = (i16(1) + i64(7) + i16(1) + i32(60_000) + i8(4)
                + b"\x01"                       # empty compact array (0 + 1)
                + i64(6) + i64(2) + b"\x00")
    assert encode_value(COMPLETE) == expected
    assert decode_value(expected) == COMPLETE
    dead = dataclasses.replace(COMPLETE, state=TxnState.DEAD)
    assert encode_value(dead)[17] == 0x01          # after 2+8+2+4+1 bytes


def test_value_v1_unknown_tags_are_skipped_and_order_does_not_matter():
    body = i16(1) + i64(7) + i16(1) + i32(60_000) + i8(4) + b"\x01" + i64(6) + i64(2)
    data = body + b"\x03" + b"\x09\x03abc" + b"\x02\x02" + i16(2) + b"\x00\x08" + i64(6)
    assert decode_value(data) == dataclasses.replace(COMPLETE, client_transaction_version=2,
                                                     previous_producer_id=6)


# --------------------------------------------------------------------------- value v0

def test_value_v0_bytes():
    expected = (
        i16(0)                                  # version
        + i64(1000) + i16(5) + i32(60_000) + i8(1)
        + i32(1)                                # TransactionPartitions: int32 count
        + i16(6) + b"orders"                    #   Topic: int16 length string
        + i32(2) + i32(0) + i32(2)              #   PartitionIds: int32 count
        + i64(1_700_000_000_123) + i64(1_700_000_000_000)
    )                                           # no tagged fields in v0
    assert expected.hex() == (
        "000000000000000003e800050000ea60010000000100066f72646572730000000200000000000000020000"
        "018bcfe5687b0000018bcfe56800")
    assert decode_value(expected) == ONGOING
    assert encode_value(ONGOING, version=0) == expected
    # v0 leaves the producer ids out, as Kafka does at transaction.version 0
    ids = dataclasses.replace(ONGOING, previous_producer_id=1, next_producer_id=2)
    assert encode_value(ids, version=0) == expected


def test_value_v0_empty_and_complete_partition_arrays():
    empty = i16(0) + i64(7) + i16(0) + i32(60_000) + i8(0) + i32(-1) + i64(5) + i64(-1)
    assert empty.hex() == "0000000000000000000700000000ea6000ffffffff0000000000000005ffffffffffffffff"
    assert encode_value(EMPTY, version=0) == empty
    assert decode_value(empty) == EMPTY
    complete = i16(0) + i64(7) + i16(1) + i32(60_000) + i8(4) + i32(0) + i64(6) + i64(2)
    assert encode_value(COMPLETE, version=0) == complete
    assert decode_value(complete) == COMPLETE


def test_value_v0_cannot_store_a_client_transaction_version():
    with pytest.raises(RecordFormatError):
        encode_value(dataclasses.replace(EMPTY, client_transaction_version=2), version=0)
    with pytest.raises(RecordFormatError):
        encode_value(EMPTY, version=2)


# --------------------------------------------------------------------------- round trips

def _value_in(state: TxnState, **kw) -> TxnLogValue:
    parts = () if state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT,
                            TxnState.DEAD) else (("a", (1,)), ("b", (0, 3)))
    return TxnLogValue(42, 3, 30_000, state, parts, 10, 9, **kw)


@pytest.mark.parametrize("state", list(TxnState))
def test_round_trip_every_state(state):
    tagged = _value_in(state, previous_producer_id=41, next_producer_id=43,
                       client_transaction_version=2)
    assert decode_value(encode_value(tagged)) == tagged
    plain = _value_in(state)
    assert decode_value(encode_value(plain)) == plain
    assert decode_value(encode_value(plain, version=0)) == plain
    key, value = txn_record(f"tx-{state.name}", tagged)
    assert decode_key(key) == f"tx-{state.name}" and decode_value(value) == tagged


def test_round_trip_extremes():
    v = TxnLogValue(2**63 - 1, 2**15 - 1, 2**31 - 1, TxnState.PREPARE_COMMIT,
                    (("t" * 249, tuple(range(200))), ("ü", (2**31 - 1,))), -(2**63), 0,
                    previous_producer_id=-(2**63), next_producer_id=0,
                    client_transaction_version=2**15 - 1, next_producer_epoch=0)
    assert decode_value(encode_value(v)) == v
    # 200 partition ids: compact array length 201 is a two-byte varint (0xc9 0x01)
    assert b"\xc9\x01" + i32(0) + i32(1) in encode_value(v)


def test_tombstone():
    assert decode_value(None) is None
    key, value = txn_record("gone", None)
    assert value is None and decode_key(key) == "gone"


def test_partitions_are_normalized():
    v = TxnLogValue(1, 0, 1000, TxnState.ONGOING, [("b", [3, 1]), ("a", (2,)), ("b", (1, 0)),
                                                   ("c", ())], 0, 0)
    assert v.partitions == (("a", (2,)), ("b", (0, 1, 3)))
    assert v.state is TxnState.ONGOING
    assert TxnLogValue(1, 0, 1000, 4, (), 0, 0).state is TxnState.COMPLETE_COMMIT
    # a decoded value with repeated topics merges them (Kafka keeps a set of partitions)
    data = (i16(0) + i64(1) + i16(0) + i32(1000) + i8(1) + i32(2)
            + i16(1) + b"b" + i32(1) + i32(3) + i16(1) + b"b" + i32(1) + i32(1)
            + i64(0) + i64(0))
    assert decode_value(data).partitions == (("b", (1, 3)),)


def test_empty_state_with_partitions():
    with pytest.raises(RecordFormatError):
        encode_value(TxnLogValue(1, 0, 1000, TxnState.EMPTY, (("t", (0,)),), 0, 0))
    # on load Kafka ignores the partitions of an EMPTY value
    data = (i16(0) + i64(1) + i16(0) + i32(1000) + i8(0)
            + i32(1) + i16(1) + b"t" + i32(1) + i32(0) + i64(0) + i64(0))
    assert decode_value(data).partitions == ()


# --------------------------------------------------------------------------- garbage

@pytest.mark.parametrize("value", [ONGOING_TAGGED, EMPTY, COMPLETE])
@pytest.mark.parametrize("version", [0, 1])
def test_truncated_values_raise(value, version):
    if version == 0:
        value = dataclasses.replace(value, previous_producer_id=-1, next_producer_id=-1,
                                    client_transaction_version=0, next_producer_epoch=-1)
    data = encode_value(value, version=version)
    for n in range(len(data)):
        with pytest.raises(RecordFormatError):
            decode_value(data[:n])


def test_garbage_values_raise():
    head = i64(1) + i16(0) + i32(1000)
    tail = i64(0) + i64(0)
    bad = [
        i16(2) + head + i8(4) + i32(0) + tail,                       # unknown value version
        i16(-1) + head + i8(4) + i32(0) + tail,
        i16(0) + head + i8(8) + i32(0) + tail,                       # unknown state id
        i16(0) + head + i8(-1) + i32(0) + tail,
        i16(0) + head + i8(1) + i32(-1) + tail,                      # null partitions, ONGOING
        i16(1) + head + i8(1) + b"\x00" + tail + b"\x00",
        i16(0) + head + i8(1) + i32(1) + i16(1) + b"t" + i32(-1) + tail,  # null PartitionIds
        i16(0) + head + i8(1) + i32(1) + i16(-1) + i32(0) + tail,    # null Topic
        i16(0) + head + i8(1) + i32(1) + i16(2) + b"\xff\xfe" + i32(0) + tail,  # bad UTF-8
        i16(1) + head + i8(4) + b"\x01" + tail + b"\x01\x00\x04" + i32(1),  # tag 0 of 4 bytes
        i16(1) + head + i8(4) + b"\x01" + tail + b"\x01\x05\x05abc",      # tag runs past the end
        i16(1) + head + i8(4) + b"\xff\xff\xff\xff\xff\xff" + tail,  # over-long varint
        b"\x00",
        b"",
    ]
    for data in bad:
        with pytest.raises(RecordFormatError):
            decode_value(data)


def test_unknown_value_version_has_its_own_error():
    data = i16(2) + i64(1) + i16(0) + i32(1000) + i8(4) + i32(0) + i64(0) + i64(0)
    with pytest.raises(UnknownValueVersionError) as info:
        decode_value(data)
    assert info.value.version == 2 and isinstance(info.value, RecordFormatError)
    with pytest.raises(RecordFormatError) as info:
        decode_value(i16(0) + i64(1) + i16(0) + i32(1000) + i8(9) + i32(0) + i64(0) + i64(0))
    assert not isinstance(info.value, UnknownValueVersionError)


def test_out_of_range_fields_raise_on_encode():
    with pytest.raises(RecordFormatError):
        encode_value(dataclasses.replace(EMPTY, producer_epoch=2**15))
    with pytest.raises(RecordFormatError):
        encode_value(dataclasses.replace(EMPTY, client_transaction_version=-2**15 - 1))
    with pytest.raises(RecordFormatError):
        encode_key("x" * 40_000)


# --------------------------------------------------------------------------- partitioning

def test_partition_for_uses_java_string_hashcode():
    # Java's String.hashCode: h = 31*h + c over UTF-16 units, int32 wrap-around.
    #   "hello": h 104 -> 3325 -> 103183 -> 3198781 -> 99162322; 99162322 % 50 = 22
    assert partition_for("hello") == 22
    assert partition_for("hello", 7) == 99162322 % 7 == 0
    #   "txn": 116 -> 116*31+120 = 3716 -> 3716*31+110 = 115306; 115306 % 50 = 6
    assert partition_for("txn") == 6
    assert partition_for("txn", 1) == 0
    #   "my-group".hashCode() == -1906497762: Utils.abs -> 1906497762 % 50 = 12
    assert partition_for("my-group") == 12
    #   "polygenelubricants".hashCode() == Integer.MIN_VALUE: Utils.abs gives 0
    assert partition_for("polygenelubricants") == 0
    assert partition_for("") == 0


# --------------------------------------------------------------------------- Kafka's own reader

@pytest.mark.slow
def test_kafka_dump_log_segments_decodes_our_records(tmp_path):
    """Kafka's transaction-log decoder (kafka-dump-log --transaction-log-decoder) reads what we write."""
    from kafka_tools import dump_log_segments, require_kafka_dist
    require_kafka_dist()
    from strata.protocol.records import SimpleRecord, build_batch
    records = [
        txn_record("tx-a", dataclasses.replace(ONGOING, previous_producer_id=999,
                                               client_transaction_version=2)),
        txn_record("tx-b", EMPTY),
        txn_record("tx-c", COMPLETE),
        (encode_key("tx-d"), encode_value(
            TxnLogValue(8, 1, 1000, TxnState.PREPARE_ABORT, (("t", (1,)),), 6, 2), version=0)),
        txn_record("tx-b", None),
    ]
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(build_batch([SimpleRecord(v, k, timestamp=1_700_000_000_000)
                                     for k, v in records]))
    out = dump_log_segments(segment, print_data=True, extra_args=["--transaction-log-decoder"])
    # Kafka 4.4's decoder names the state (4.3 printed its id: Ongoing 1, Empty 0, ...)
    assert ('key: {"type":"0","data":{"transactionalId":"tx-a"}} payload: {"version":"1","data":'
            '{"producerId":1000,"previousProducerId":999,"producerEpoch":5,'
            '"transactionTimeoutMs":60000,"transactionStatus":"Ongoing","transactionPartitions":'
            '[{"topic":"orders","partitionIds":[0,2]}],"transactionLastUpdateTimestampMs":'
            '1700000000123,"transactionStartTimestampMs":1700000000000,'
            '"clientTransactionVersion":2}}') in out
    assert ('key: {"type":"0","data":{"transactionalId":"tx-b"}} payload: {"version":"1","data":'
            '{"producerId":7,"producerEpoch":0,"transactionTimeoutMs":60000,"transactionStatus":"Empty",'
            '"transactionPartitions":null,"transactionLastUpdateTimestampMs":5,'
            '"transactionStartTimestampMs":-1}}') in out
    assert ('"transactionStatus":"CompleteCommit","transactionPartitions":[],'
            '"transactionLastUpdateTimestampMs":6,"transactionStartTimestampMs":2}}') in out
    assert ('key: {"type":"0","data":{"transactionalId":"tx-d"}} payload: {"version":"0","data":'
            '{"producerId":8,"producerEpoch":1,"transactionTimeoutMs":1000,"transactionStatus":"PrepareAbort",'
            '"transactionPartitions":[{"topic":"t","partitionIds":[1]}],'
            '"transactionLastUpdateTimestampMs":6,"transactionStartTimestampMs":2}}') in out
    assert 'key: {"type":"0","data":{"transactionalId":"tx-b"}} payload: <DELETE>' in out
