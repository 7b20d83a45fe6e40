"""strata.tiered.metadata.serde: ``__remote_log_metadata`` record values and partitioner.

Byte layouts are checked three ways: golden bytes built here by hand from Kafka's message
JSON (storage/src/main/resources/message/Remote*.json), the same records as Kafka 4.3.1's
RemoteLogMetadataSerde wrote them (hex captured from the jar), and -- when Java and the
Kafka jars (4.4.0) are installed -- a live round trip through Kafka's own serde.
"""

from __future__ import annotations

import dataclasses

import random
import shutil
import struct
import subprocess
import uuid
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.tiered.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    TopicPartition,
)
from strata.tiered.metadata.serde import (
    MetadataParseException,
    RemoteLogMetadataSerde,
    RemoteLogMetadataTopicPartitioner,
    RemoteLogSegmentMetadataSnapshot,
    deserialize,
    metadata_partition,
    murmur2,
    serialize,
)

S = RemoteLogSegmentState
D = RemotePartitionDeleteState

TOPIC_ID = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
TIP = TopicIdPartition(TOPIC_ID, TopicPartition("orders", 7))
SEGMENT_UUID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
SEGMENT_ID = RemoteLogSegmentId(TIP, SEGMENT_UUID)

SEGMENT = RemoteLogSegmentMetadata(SEGMENT_ID, 100, 199, 1_700_000_000_123, 2, 1_700_000_000_456, 4096,
                                   segment_leader_epochs={5: 120, 3: 100}, txn_idx_empty=True)
UPDATE = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1_700_000_000_789, b"\x01\x02\x03", S.COPY_SEGMENT_FINISHED, 2)
SEGMENT_FINISHED = SEGMENT.create_with_updates(UPDATE)
DELETE = RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_STARTED, 1_700_000_000_999, 1)
SNAPSHOT = RemoteLogSegmentMetadataSnapshot.create(SEGMENT_FINISHED)


# --------------------------------------------------------------------------- hand-built encoding


def uv(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def i8(n): return struct.pack(">b", n)
def i32(n): return struct.pack(">i", n)
def i64(n): return struct.pack(">q", n)
def cstr(s: str) -> bytes: return uv(len(s.encode()) + 1) + s.encode()


NO_TAGS = uv(0)
TXN_INDEX_EMPTY_TAG = uv(1) + uv(0) + uv(1) + b"\x01"  # one tagged field: tag 0, size 1, true


def header(api_key: int, version: int = 0) -> bytes:
    return uv(1) + uv(api_key) + uv(version)  # frame version 1


def topic_id_partition_entry(name="orders", topic_id=TOPIC_ID, partition=7, tags=NO_TAGS) -> bytes:
    return cstr(name) + topic_id.bytes + i32(partition) + tags


def segment_id_entry(tip_entry=None) -> bytes:
    return (tip_entry if tip_entry is not None else topic_id_partition_entry()) + SEGMENT_UUID.bytes + NO_TAGS


EPOCHS = uv(2 + 1) + i32(3) + i64(100) + NO_TAGS + i32(5) + i64(120) + NO_TAGS


def golden_segment(*, tip_entry=None, start=100, event_ts=1_700_000_000_456, epochs=EPOCHS, state=0,
                   custom=uv(0), tags=TXN_INDEX_EMPTY_TAG) -> bytes:
    """RemoteLogSegmentMetadataRecord v0, field by field."""
    return (header(0) + segment_id_entry(tip_entry) + i64(start) + i64(199) + i32(2) + i64(1_700_000_000_123)
            + i64(event_ts) + epochs + i32(4096) + custom + i8(state) + tags)


GOLDEN_SEGMENT = golden_segment()
GOLDEN_UPDATE = (header(1) + segment_id_entry() + i32(2) + i64(1_700_000_000_789) + uv(3 + 1) + b"\x01\x02\x03"
                 + i8(1) + NO_TAGS)
GOLDEN_SEGMENT_FINISHED = golden_segment(event_ts=1_700_000_000_789, custom=uv(3 + 1) + b"\x01\x02\x03", state=1)
GOLDEN_DELETE = header(2) + topic_id_partition_entry() + i32(1) + i64(1_700_000_000_999) + i8(1) + NO_TAGS
GOLDEN_SNAPSHOT = (header(3) + SEGMENT_UUID.bytes + i64(100) + i64(199) + i32(2) + i64(1_700_000_000_123)
                   + i64(1_700_000_000_789) + EPOCHS + i32(4096) + uv(3 + 1) + b"\x01\x02\x03" + i8(1)
                   + TXN_INDEX_EMPTY_TAG)

# The same five records as written by Kafka 4.3.1's RemoteLogMetadataSerde (built with Kafka's own
# constructors: RemoteLogSegmentMetadata(..., txnIdxEmpty=true), createWithUpdates, ...Snapshot.create).
KAFKA_4_3_1 = {
    "segment": "010000076f72646572730f1e2d3c4b5a69788796a5b4c3d2e1f0000000070000112233445566778899aabbccddeeff"
               "00000000000000006400000000000000c7000000020000018bcfe5687b0000018bcfe569c8030000000300000000"
               "00000064000000000500000000000000780000001000000001000101",
    "update": "010100076f72646572730f1e2d3c4b5a69788796a5b4c3d2e1f0000000070000112233445566778899aabbccddeeff"
              "00000000020000018bcfe56b15040102030100",
    "segment_finished": "010000076f72646572730f1e2d3c4b5a69788796a5b4c3d2e1f000000007000011223344556677889"
                        "9aabbccddeeff00000000000000006400000000000000c7000000020000018bcfe5687b0000018bcfe5"
                        "6b1503000000030000000000000064000000000500000000000000780000001000040102030101000101",
    "delete": "010200076f72646572730f1e2d3c4b5a69788796a5b4c3d2e1f00000000700000000010000018bcfe56be70100",
    "snapshot": "01030000112233445566778899aabbccddeeff000000000000006400000000000000c7000000020000018bcfe568"
                "7b0000018bcfe56b1503000000030000000000000064000000000500000000000000780000001000040102030101"
                "000101",
}

CASES = {
    "segment": (SEGMENT, GOLDEN_SEGMENT),
    "update": (UPDATE, GOLDEN_UPDATE),
    "segment_finished": (SEGMENT_FINISHED, GOLDEN_SEGMENT_FINISHED),
    "delete": (DELETE, GOLDEN_DELETE),
    "snapshot": (SNAPSHOT, GOLDEN_SNAPSHOT),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hand_built_golden_bytes_match_kafkas(name):
    assert CASES[name][1].hex() == KAFKA_4_3_1[name]


@pytest.mark.parametrize("name", list(CASES))
def test_serialize_writes_the_golden_bytes(name):
    obj, golden = CASES[name]
    assert serialize(obj) == golden


@pytest.mark.parametrize("name", list(CASES))
def test_deserialize_reads_the_golden_bytes(name):
    obj, golden = CASES[name]
    decoded = deserialize(golden)
    assert decoded == obj and type(decoded) is type(obj)


def test_serde_object_is_the_module_functions():
    serde = RemoteLogMetadataSerde()
    assert serde.serialize(DELETE) == GOLDEN_DELETE
    assert serde.deserialize(bytearray(GOLDEN_DELETE)) == DELETE


def test_txn_index_empty_is_written_only_when_true():
    plain = RemoteLogSegmentMetadata(SEGMENT_ID, 100, 199, 1_700_000_000_123, 2, 1_700_000_000_456, 4096,
                                     segment_leader_epochs={3: 100, 5: 120})
    assert serialize(plain) == golden_segment(tags=NO_TAGS)
    assert deserialize(golden_segment(tags=uv(1) + uv(0) + uv(1) + b"\x00")).txn_idx_empty is False


EPOCH_TAG = uv(10_000) + uv(4) + i32(6)  # Strata's leader epoch tagged field, epoch 6


def test_the_writers_leader_epoch_is_strata_tag_10000_written_only_when_known():
    led = dataclasses.replace(SEGMENT, leader_epoch=6)
    assert serialize(led) == golden_segment(tags=uv(2) + TXN_INDEX_EMPTY_TAG[1:] + EPOCH_TAG)
    assert serialize(SEGMENT) == GOLDEN_SEGMENT              # -1: not written, Kafka's bytes
    update = dataclasses.replace(UPDATE, leader_epoch=6)
    assert serialize(update) == GOLDEN_UPDATE[:-1] + uv(1) + EPOCH_TAG
    delete = dataclasses.replace(DELETE, leader_epoch=6)
    assert serialize(delete) == GOLDEN_DELETE[:-1] + uv(1) + EPOCH_TAG
    for value in (led, update, delete):
        assert deserialize(serialize(value)).leader_epoch == 6
    assert deserialize(GOLDEN_SEGMENT).leader_epoch == -1
    # a snapshot record (Kafka's own type) has no such field
    assert serialize(SNAPSHOT) == GOLDEN_SNAPSHOT


@pytest.mark.parametrize("field", [uv(10_000) + uv(2) + b"\x00\x06",
                                   uv(10_000) + uv(4) + i32(-1)], ids=["short", "negative"])
def test_a_malformed_leader_epoch_field_is_a_parse_error(field):
    with pytest.raises(MetadataParseException):
        deserialize(GOLDEN_UPDATE[:-1] + uv(1) + field)


def test_null_and_empty_custom_metadata_are_different_on_the_wire():
    none = SEGMENT_FINISHED.create_with_updates(
        RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1, None, S.COPY_SEGMENT_FINISHED, 2))
    empty = SEGMENT_FINISHED.create_with_updates(
        RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1, b"", S.COPY_SEGMENT_FINISHED, 2))
    assert serialize(none) != serialize(empty)
    assert deserialize(serialize(none)).custom_metadata is None
    assert deserialize(serialize(empty)).custom_metadata == b""


def test_unknown_tagged_fields_are_skipped_at_every_level():
    unknown = uv(1) + uv(7) + uv(3) + b"abc"
    with_tags = golden_segment(tip_entry=topic_id_partition_entry(tags=unknown),
                               tags=uv(2) + uv(0) + uv(1) + b"\x01" + uv(9) + uv(2) + b"zz")
    assert deserialize(with_tags) == SEGMENT


def test_a_repeated_leader_epoch_keeps_the_last_offset_like_kafkas_hashmap():
    epochs = uv(2 + 1) + i32(3) + i64(100) + NO_TAGS + i32(3) + i64(150) + NO_TAGS
    assert dict(deserialize(golden_segment(epochs=epochs)).segment_leader_epochs) == {3: 150}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("data, message", [
    (uv(0) + uv(0) + uv(0), "frame version 0"),
    (uv(2) + uv(0) + uv(0), "unknown frame version 2"),
    (uv(1) + uv(4) + uv(0), "type 4"),
    (uv(1) + uv(127) + uv(0), "type 127"),
    (uv(1) + uv(40000) + uv(0), "too large"),
    (uv(1) + uv(0) + uv(40000), "too large"),
    (b"", "varint"),
    (b"\x01\x00", "varint"),
    (b"\x01\xff\xff\xff\xff\xff\x01\x00", "varint too long"),
])
def test_bad_headers_are_rejected(data, message):
    with pytest.raises(MetadataParseException, match=message):
        deserialize(data)


@pytest.mark.parametrize("api_key", [0, 1, 2, 3])
@pytest.mark.parametrize("version", [1, 2, 100])
def test_unknown_versions_are_rejected(api_key, version):
    with pytest.raises(MetadataParseException, match=f"version {version}"):
        deserialize(header(api_key, version) + b"\x00" * 64)


@pytest.mark.parametrize("name", list(CASES))
def test_every_truncation_is_rejected(name):
    golden = CASES[name][1]
    for cut in range(len(golden)):
        with pytest.raises(MetadataParseException):
            deserialize(golden[:cut])


@pytest.mark.parametrize("name", list(CASES))
def test_trailing_bytes_are_rejected(name):
    with pytest.raises(MetadataParseException, match="garbage"):
        deserialize(CASES[name][1] + b"\x00")


@pytest.mark.parametrize("data, message", [
    (golden_segment(tip_entry=uv(0) + TOPIC_ID.bytes + i32(7) + NO_TAGS), "null"),
    (golden_segment(tip_entry=uv(3) + b"\xff\xfe" + TOPIC_ID.bytes + i32(7) + NO_TAGS), "UTF-8"),
    (golden_segment(state=4), "state id 4"),
    (golden_segment(state=-1), "state id -1"),
    (golden_segment(start=-1), "start offset"),
    (golden_segment(epochs=uv(1)), "segment_leader_epochs"),
    (golden_segment(epochs=uv(0)), "null"),
    (golden_segment(epochs=uv(1000)), "claims 999 elements"),
    (golden_segment(tags=uv(1) + uv(0) + uv(2) + b"\x01\x01"), "TxnIndexEmpty"),
    (GOLDEN_DELETE[:-2] + i8(3) + NO_TAGS, "delete state id 3"),
    (GOLDEN_UPDATE[:-2] + i8(9) + NO_TAGS, "state id 9"),
])
def test_malformed_bodies_are_rejected(data, message):
    with pytest.raises(MetadataParseException, match=message):
        deserialize(data)


def test_serialize_rejects_what_kafka_cannot_write():
    with pytest.raises(TypeError):
        serialize(object())
    too_big_broker = RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 1, 2 ** 31)
    with pytest.raises(ValueError, match="broker_id"):
        serialize(too_big_broker)
    long_name = RemotePartitionDeleteMetadata(
        TopicIdPartition(TOPIC_ID, TopicPartition("x" * 0x8000, 0)), D.DELETE_PARTITION_MARKED, 1, 1)
    with pytest.raises(ValueError, match="too long"):
        serialize(long_name)


# --------------------------------------------------------------------------- round trips

INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
topic_id_partitions = st.builds(
    lambda topic_id, name, partition: TopicIdPartition(topic_id, TopicPartition(name, partition)),
    st.uuids(), st.text(max_size=60), INT32)
segment_ids = st.builds(RemoteLogSegmentId, topic_id_partitions, st.uuids())
custom = st.none() | st.binary(max_size=64)
epochs = st.dictionaries(INT32, INT64, min_size=1, max_size=8)


@st.composite
def offsets(draw):
    a, b = sorted(draw(st.lists(st.integers(0, 2 ** 63 - 1), min_size=2, max_size=2)))
    return a, b


@st.composite
def segments(draw):
    start, end = draw(offsets())
    return RemoteLogSegmentMetadata(
        draw(segment_ids), start, end, draw(INT64), draw(INT32), draw(INT64), draw(INT32),
        custom_metadata=draw(custom), state=draw(st.sampled_from(S)), segment_leader_epochs=draw(epochs),
        txn_idx_empty=draw(st.booleans()), leader_epoch=draw(LEADER_EPOCHS))


LEADER_EPOCHS = st.integers(-1, 2**31 - 1)
updates = st.builds(RemoteLogSegmentMetadataUpdate, segment_ids, INT64, custom, st.sampled_from(S), INT32,
                    leader_epoch=LEADER_EPOCHS)
deletes = st.builds(RemotePartitionDeleteMetadata, topic_id_partitions, st.sampled_from(D), INT64, INT32,
                    leader_epoch=LEADER_EPOCHS)
snapshots = segments().map(RemoteLogSegmentMetadataSnapshot.create)
any_metadata = segments() | updates | deletes | snapshots


@given(any_metadata)
@settings(max_examples=300, deadline=None)
def test_round_trip(metadata):
    data = serialize(metadata)
    decoded = deserialize(data)
    assert decoded == metadata and type(decoded) is type(metadata)
    assert getattr(decoded, "leader_epoch", -1) == getattr(metadata, "leader_epoch", -1)
    assert serialize(decoded) == data


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_decode_or_raise_parse_errors_only(data):
    try:
        deserialize(data)
    except MetadataParseException:
        pass


@given(any_metadata, st.data())
@settings(max_examples=100, deadline=None)
def test_single_byte_corruption_never_escapes_as_another_error(metadata, data):
    raw = bytearray(serialize(metadata))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    try:
        deserialize(bytes(raw))
    except MetadataParseException:
        pass


# --------------------------------------------------------------------------- partitioner


@pytest.mark.parametrize("data, expected", [
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize("topic_id, partition, num_partitions, expected", [
    # RemoteLogMetadataTopicPartitioner#metadataPartition in Kafka 4.3.1
    ("00000000-0000-0000-0000-000000000000", 0, 50, 6),
    ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", 0, 50, 5),
    ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", 1, 50, 31),
    ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", 7, 50, 19),
    ("ffffffff-ffff-ffff-ffff-ffffffffffff", 2147483647, 50, 10),
    ("8c6c2d6a-94bf-4a76-b3a4-5e0c1f1b7a11", 3, 50, 39),
    ("8c6c2d6a-94bf-4a76-b3a4-5e0c1f1b7a11", 3, 7, 0),
    ("8c6c2d6a-94bf-4a76-b3a4-5e0c1f1b7a11", 3, 1, 0),
    ("8c6c2d6a-94bf-4a76-b3a4-5e0c1f1b7a11", 12, 50, 48),
    # uuids whose two halves hash differently, so swapping lsb and msb would show
    ("123e4567-e89b-12d3-a456-426614174000", 0, 50, 19),
    ("123e4567-e89b-12d3-a456-426614174000", 5, 50, 35),
    ("9d5b1a2c-3e4f-4a6b-8c7d-0e1f2a3b4c5d", 1, 50, 15),
    ("9d5b1a2c-3e4f-4a6b-8c7d-0e1f2a3b4c5d", 100, 64, 63),
    ("6ba7b810-9dad-11d1-80b4-00c04fd430c8", 2, 50, 33),
])
def test_metadata_partition_matches_kafka(topic_id, partition, num_partitions, expected):
    assert metadata_partition(uuid.UUID(topic_id), partition, num_partitions) == expected


def test_partitioner_class_uses_topic_id_and_partition_only():
    partitioner = RemoteLogMetadataTopicPartitioner(50)
    assert partitioner.metadata_partition(TIP) == 19
    renamed = TopicIdPartition(TOPIC_ID, TopicPartition("renamed", 7))
    assert partitioner.metadata_partition(renamed) == 19
    with pytest.raises(ValueError):
        RemoteLogMetadataTopicPartitioner(0)
    with pytest.raises(ValueError):
        metadata_partition(TOPIC_ID, 0, -1)


@given(st.uuids(), INT32, st.integers(1, 1000))
def test_metadata_partition_is_in_range(topic_id, partition, num_partitions):
    assert 0 <= metadata_partition(topic_id, partition, num_partitions) < num_partitions


# --------------------------------------------------------------------------- cross-check with Kafka

JAVA_CHECK = r"""
import java.io.*;
import java.util.*;
import org.apache.kafka.common.*;
import org.apache.kafka.server.log.remote.storage.*;
import org.apache.kafka.server.log.remote.metadata.storage.*;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;

// stdin: "S <hex>" -> "OK <hex of Kafka's re-serialisation> <fields>" | "ERR <exception>";
//        "P <uuid> <partition> <n>" -> "OK <metadata partition>".
public class RemoteLogMetadataSerdeCheck {
  static String hex(byte[] b) { StringBuilder s = new StringBuilder(); for (byte x : b) s.append(String.format("%02x", x)); return s.toString(); }
  static byte[] unhex(String h) { byte[] b = new byte[h.length() / 2]; for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16); return b; }
  static String u(Uuid x) { return new UUID(x.getMostSignificantBits(), x.getLeastSignificantBits()).toString(); }
  static Uuid uu(String s) { UUID x = UUID.fromString(s); return new Uuid(x.getMostSignificantBits(), x.getLeastSignificantBits()); }
  static String tip(TopicIdPartition t) { return "topic=" + hex(t.topic().getBytes(java.nio.charset.StandardCharsets.UTF_8)) + " topicId=" + u(t.topicId()) + " partition=" + t.partition(); }
  static String cm(Optional<RemoteLogSegmentMetadata.CustomMetadata> c) { return c.map(x -> "h" + hex(x.value())).orElse("null"); }
  static String ep(Map<Integer, Long> m) { StringBuilder s = new StringBuilder(); for (Map.Entry<Integer, Long> e : m.entrySet()) { if (s.length() > 0) s.append(','); s.append(e.getKey()).append(':').append(e.getValue()); } return s.toString(); }
  static String desc(Object o) {
    if (o instanceof RemoteLogSegmentMetadata m) return "RLSM " + tip(m.topicIdPartition()) + " id=" + u(m.remoteLogSegmentId().id()) + " start=" + m.startOffset() + " end=" + m.endOffset() + " maxTs=" + m.maxTimestampMs() + " broker=" + m.brokerId() + " eventTs=" + m.eventTimestampMs() + " size=" + m.segmentSizeInBytes() + " custom=" + cm(m.customMetadata()) + " state=" + m.state().id() + " epochs=" + ep(m.segmentLeaderEpochs()) + " txnEmpty=" + m.isTxnIdxEmpty();
    if (o instanceof RemoteLogSegmentMetadataUpdate m) return "UPD " + tip(m.topicIdPartition()) + " id=" + u(m.remoteLogSegmentId().id()) + " broker=" + m.brokerId() + " eventTs=" + m.eventTimestampMs() + " custom=" + cm(m.customMetadata()) + " state=" + m.state().id();
    if (o instanceof RemotePartitionDeleteMetadata m) return "DEL " + tip(m.topicIdPartition()) + " broker=" + m.brokerId() + " eventTs=" + m.eventTimestampMs() + " state=" + m.state().id();
    if (o instanceof RemoteLogSegmentMetadataSnapshot m) return "SNAP id=" + u(m.segmentId()) + " start=" + m.startOffset() + " end=" + m.endOffset() + " maxTs=" + m.maxTimestampMs() + " broker=" + m.brokerId() + " eventTs=" + m.eventTimestampMs() + " size=" + m.segmentSizeInBytes() + " custom=" + cm(m.customMetadata()) + " state=" + m.state().id() + " epochs=" + ep(m.segmentLeaderEpochs()) + " txnEmpty=" + m.isTxnIdxEmpty();
    return "?" + o;
  }
  public static void main(String[] args) throws Exception {
    RemoteLogMetadataSerde serde = new RemoteLogMetadataSerde();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    String line;
    while ((line = in.readLine()) != null) {
      String[] f = line.trim().split(" ");
      try {
        if (f[0].equals("S")) {
          RemoteLogMetadata m = serde.deserialize(unhex(f.length > 1 ? f[1] : ""));
          System.out.println("OK " + hex(serde.serialize(m)) + " " + desc(m));
        } else if (f[0].equals("P")) {
          TopicIdPartition t = new TopicIdPartition(uu(f[1]), new TopicPartition("t", Integer.parseInt(f[2])));
          System.out.println("OK " + new RemoteLogMetadataTopicPartitioner(Integer.parseInt(f[3])).metadataPartition(t));
        }
      } catch (Throwable e) {
        System.out.println("ERR " + e.getClass().getSimpleName());
      }
    }
  }
}
"""

SERDE_CLASS = "org/apache/kafka/server/log/remote/metadata/storage/serialization/RemoteLogMetadataSerde.class"


@pytest.fixture(scope="module")
def kafka_serde(tmp_path_factory):
    """A function that feeds lines to the compiled Java checker and returns its output lines."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("cross-check with Kafka needs a JDK (java and javac on PATH)")
    from kafka_tools import require_kafka_dist, kafka_libs
    require_kafka_dist()
    libs = kafka_libs()
    if not any(SERDE_CLASS in zipfile.ZipFile(jar).namelist() for jar in libs.glob("kafka-storage-*.jar")):
        pytest.skip(f"no RemoteLogMetadataSerde in {libs}")
    work = tmp_path_factory.mktemp("rlmm-serde-java")
    (work / "RemoteLogMetadataSerdeCheck.java").write_text(JAVA_CHECK)
    classpath = f"{libs}/*"
    subprocess.run(["javac", "-d", str(work), "-cp", classpath, str(work / "RemoteLogMetadataSerdeCheck.java")],
                   check=True, capture_output=True, timeout=120)

    def run(lines: list[str]) -> list[str]:
        proc = subprocess.run(["java", "-Xmx256m", "-cp", f"{classpath}:{work}", "RemoteLogMetadataSerdeCheck"],
                              input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, check=True)
        out = proc.stdout.splitlines()
        assert len(out) == len(lines), proc.stderr
        return out

    return run


def describe(m) -> str:
    """The Java checker's text form of a decoded record."""
    def tip(t):
        return f"topic={t.topic.encode().hex()} topicId={t.topic_id} partition={t.partition}"

    def cm(c):
        return "null" if c is None else "h" + c.hex()

    def ep(e):
        return ",".join(f"{k}:{v}" for k, v in e.items())

    if isinstance(m, RemoteLogSegmentMetadata):
        return (f"RLSM {tip(m.topic_id_partition)} id={m.remote_log_segment_id.id} start={m.start_offset} "
                f"end={m.end_offset} maxTs={m.max_timestamp_ms} broker={m.broker_id} eventTs={m.event_timestamp_ms} "
                f"size={m.segment_size_in_bytes} custom={cm(m.custom_metadata)} state={m.state.id} "
                f"epochs={ep(m.segment_leader_epochs)} txnEmpty={str(m.txn_idx_empty).lower()}")
    if isinstance(m, RemoteLogSegmentMetadataUpdate):
        return (f"UPD {tip(m.topic_id_partition)} id={m.remote_log_segment_id.id} broker={m.broker_id} "
                f"eventTs={m.event_timestamp_ms} custom={cm(m.custom_metadata)} state={m.state.id}")
    if isinstance(m, RemotePartitionDeleteMetadata):
        return f"DEL {tip(m.topic_id_partition)} broker={m.broker_id} eventTs={m.event_timestamp_ms} state={m.state.id}"
    return (f"SNAP id={m.segment_id} start={m.start_offset} end={m.end_offset} maxTs={m.max_timestamp_ms} "
            f"broker={m.broker_id} eventTs={m.event_timestamp_ms} size={m.segment_size_in_bytes} "
            f"custom={cm(m.custom_metadata)} state={m.state.id} epochs={ep(m.segment_leader_epochs)} "
            f"txnEmpty={str(m.txn_idx_empty).lower()}")


def random_metadata(rng: random.Random):
    def i32():
        return rng.randint(-2 ** 31, 2 ** 31 - 1)

    def i64():
        return rng.choice([0, -1, 2 ** 63 - 1, -2 ** 63, rng.randint(-2 ** 63, 2 ** 63 - 1)])

    def blob():
        return rng.choice([None, b"", rng.randbytes(rng.randint(1, 300))])

    name = rng.choice(["t", "orders", "__x.y-z", "ünïcødé-☃", "a" * 249])
    tip = TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), TopicPartition(name, rng.randint(0, 2 ** 31 - 1)))
    sid = RemoteLogSegmentId(tip, uuid.UUID(int=rng.getrandbits(128)))
    start = rng.randint(0, 2 ** 40)
    epochs = {i32(): i64() for _ in range(rng.randint(1, 200 if rng.random() < 0.05 else 5))}
    segment = RemoteLogSegmentMetadata(sid, start, start + rng.randint(0, 10 ** 6), i64(), i32(), i64(), i32(),
                                       custom_metadata=blob(), state=rng.choice(list(S)),
                                       segment_leader_epochs=epochs, txn_idx_empty=rng.random() < 0.5)
    return rng.choice([
        segment,
        RemoteLogSegmentMetadataUpdate(sid, i64(), blob(), rng.choice(list(S)), i32()),
        RemotePartitionDeleteMetadata(tip, rng.choice(list(D)), i64(), i32()),
        RemoteLogSegmentMetadataSnapshot.create(segment),
    ])


@pytest.mark.slow
def test_kafka_reads_our_records_and_writes_the_same_bytes(kafka_serde):
    rng = random.Random(405)
    records = [obj for obj, _ in CASES.values()] + [random_metadata(rng) for _ in range(300)]
    encoded = [serialize(r) for r in records]
    out = kafka_serde([f"S {e.hex()}" for e in encoded])
    for record, data, line in zip(records, encoded, out):
        assert line == f"OK {data.hex()} {describe(record)}", record


@pytest.mark.slow
def test_kafka_rejects_what_we_reject(kafka_serde):
    bad = [GOLDEN_SEGMENT[:cut] for cut in range(0, len(GOLDEN_SEGMENT), 7)]
    bad += [GOLDEN_DELETE + b"\x00", uv(0) + uv(2) + uv(0), uv(1) + uv(4) + uv(0), header(0, 1) + GOLDEN_SEGMENT[3:],
            golden_segment(tip_entry=uv(0) + TOPIC_ID.bytes + i32(7) + NO_TAGS)]
    for data in bad:
        with pytest.raises(MetadataParseException):
            deserialize(data)
    assert all(line.startswith("ERR ") for line in kafka_serde([f"S {b.hex()}" for b in bad]))


@pytest.mark.slow
def test_kafka_accepts_what_we_decode_leniently(kafka_serde):
    # Unknown tagged fields (top level and nested) and a repeated epoch decode the same in both.
    unknown = uv(1) + uv(7) + uv(3) + b"abc"
    lenient = [
        golden_segment(tip_entry=topic_id_partition_entry(tags=unknown),
                       tags=uv(2) + uv(0) + uv(1) + b"\x01" + uv(9) + uv(2) + b"zz"),
        golden_segment(epochs=uv(2 + 1) + i32(3) + i64(100) + NO_TAGS + i32(3) + i64(150) + NO_TAGS),
        serialize(dataclasses.replace(SEGMENT, leader_epoch=6)),   # Strata's leader epoch tag
        serialize(dataclasses.replace(UPDATE, leader_epoch=6)),
        serialize(dataclasses.replace(DELETE, leader_epoch=6)),
    ]
    out = kafka_serde([f"S {b.hex()}" for b in lenient])
    for data, line in zip(lenient, out):
        decoded = dataclasses.replace(deserialize(data), leader_epoch=-1)  # Kafka drops the tag
        assert line == f"OK {serialize(decoded).hex()} {describe(decoded)}"


@pytest.mark.slow
def test_kafka_partitioner_agrees(kafka_serde):
    rng = random.Random(50)
    cases = [(uuid.UUID(int=rng.getrandbits(128)), rng.randint(0, 2 ** 31 - 1), rng.choice([1, 3, 50, 64, 1000]))
             for _ in range(300)]
    out = kafka_serde([f"P {u} {p} {n}" for u, p, n in cases])
    assert out == [f"OK {metadata_partition(u, p, n)}" for u, p, n in cases]
