"""Produce requests read with their records as views of the frame: the same bodies as kio's
reader gives, for every version it handles, and the same refusals."""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from strata.protocol.client import client_frame
from strata.protocol.codec import ApiKey, MalformedRequest, nested_class, parse_request, request_class
from strata.protocol.produce_wire import FIRST_VERSION, produce_reader

VERSIONS = range(FIRST_VERSION, 12)

names = st.text(min_size=0, max_size=12)
records = st.none() | st.binary(max_size=300)
partitions = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), records), max_size=4)
topics = st.lists(st.tuples(names, partitions), max_size=3)


def _body(version: int, txn_id, acks: int, timeout_ms: int, data):
    cls = request_class(ApiKey.PRODUCE, version)
    topic_cls = nested_class(cls, "topic_data")
    part_cls = nested_class(cls, "topic_data.partition_data")
    return cls(transactional_id=txn_id, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
               topic_data=tuple(topic_cls(name=n, partition_data=tuple(
                   part_cls(index=i, records=r) for i, r in parts)) for n, parts in data))


def _kio_body(frame: bytes, body):
    """kio's own reading of the frame's body (after its header)."""
    header_cls = body.__header_schema__
    _, pos = entity_reader(header_cls)(frame, 0)
    return entity_reader(type(body))(frame, pos)[0]


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), txn_id=st.none() | names,
       acks=st.sampled_from([-1, 0, 1, 2, -32768]), timeout_ms=st.integers(-2**31, 2**31 - 1),
       data=topics)
def test_a_produce_request_reads_as_kio_reads_it_with_records_viewing_the_frame(
        version, txn_id, acks, timeout_ms, data):
    body = _body(version, txn_id, acks, timeout_ms, data)
    frame = client_frame(body)
    decoded = parse_request(frame).body
    assert type(decoded) is type(body)
    assert decoded == _kio_body(frame, body)
    for t in decoded.topic_data:
        for p in t.partition_data:
            if p.records is not None:
                assert isinstance(p.records, memoryview) and p.records.readonly
                assert p.records.obj is frame   # a view, not a copy


@pytest.mark.parametrize("version", VERSIONS)
def test_records_of_a_bytearray_frame_are_read_only_views_of_it(version):
    body = _body(version, "txn", 1, 30_000, [("t", [(0, b"abc" * 100), (1, None)])])
    frame = bytearray(client_frame(body))
    decoded = parse_request(frame).body
    rec = decoded.topic_data[0].partition_data[0].records
    assert rec == b"abc" * 100 and rec.readonly
    at = frame.index(b"abc" * 100)
    frame[at:at + 3] = b"XYZ"   # the network layer never does this: here it shows the view
    assert bytes(rec[:3]) == b"XYZ"
    assert decoded.topic_data[0].partition_data[1].records is None


def _topic_name_offset(frame: bytes, version: int) -> int:
    """Where the (single, one-byte-long) topic name's byte sits, in a frame of ``_body``."""
    return frame.index(b"\x01Q" if version < 9 else b"\x02Q") + 1   # int16 1, or compact 1 + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_a_topic_name_that_is_not_utf8_is_refused_as_kio_refuses_it(version):
    body = _body(version, None, 1, 1000, [("Q", [(0, b"x")])])
    frame = bytearray(client_frame(body))
    frame[_topic_name_offset(frame, version)] = 0xFF
    with pytest.raises(Exception):
        _kio_body(bytes(frame), body)
    with pytest.raises(MalformedRequest):
        parse_request(bytes(frame))


@pytest.mark.parametrize("version", [v for v in VERSIONS if v < 9])
def test_a_records_length_below_minus_one_is_refused(version):
    body = _body(version, None, 1, 1000, [("Q", [(0, b"")])])
    frame = bytearray(client_frame(body))
    assert frame.endswith(struct.pack(">i", 0))
    frame[-4:] = struct.pack(">i", -2)
    with pytest.raises(MalformedRequest):
        parse_request(bytes(frame))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_null_topic_name_is_refused(version):
    body = _body(version, None, 1, 1000, [("Q", [(0, b"x")])])
    frame = bytearray(client_frame(body))
    at = _topic_name_offset(frame, version) - (2 if version < 9 else 1)
    if version < 9:
        frame[at:at + 3] = b"\xff\xff"   # int16 -1, dropping the name's byte
    else:
        frame[at:at + 2] = b"\x00"       # compact length 0: null
    with pytest.raises(MalformedRequest):
        parse_request(bytes(frame))


def test_unknown_tagged_fields_are_skipped_as_kio_skips_them():
    body = _body(11, None, 1, 1000, [("Q", [(0, b"rec")])])
    frame = bytearray(client_frame(body))
    assert frame.endswith(b"rec\x00\x00\x00")   # partition, topic and body tags: none
    frame[-3:] = b"\x01\x07\x02hi\x00\x01\x63\x00"   # tag 7 on the partition, tag 99 on the body
    decoded = parse_request(bytes(frame)).body
    assert decoded == body


def test_the_reader_reports_the_bytes_it_took():
    body = _body(9, "t", -1, 5, [("a", [(3, b"12345")]), ("b", [])])
    frame = client_frame(body)
    _, pos = entity_reader(body.__header_schema__)(frame, 0)
    read = produce_reader(type(body))
    got, size = read(frame + b"trailing", pos)
    assert got == body and size == len(frame) - pos
