"""Fetch on the wire: the follower's hand-written request and the broker's hand-written
responses are byte for byte kio's, and the broker parses the request."""

import datetime
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from strata.common.errors import ErrorCode
from strata.protocol.client import client_frame, framed
from strata.protocol.codec import nested_class, make, parse_request, response_class
from strata.protocol.fetch_wire import (
    PartitionFetch, ReplicaFetch, fetch_response_writable, write_fetch_response)

i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
# long names and many partitions make the compact lengths take more than one varint byte
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
partitions = st.lists(st.builds(PartitionFetch, i32, i32, i64, i32, i64, i32), max_size=140)
topics = st.lists(st.tuples(names, partitions.map(tuple)), max_size=4).map(tuple)
forgotten = st.lists(st.tuples(names, st.lists(i32, max_size=140).map(tuple)),
                     max_size=3).map(tuple)
requests = st.builds(ReplicaFetch, i32, st.integers(0, 2**31 - 1), i32, i32, i32, i32,
                     topics, forgotten)


@settings(max_examples=300, deadline=None)
@given(requests, i32, names)
def test_a_replica_fetch_frame_is_the_bytes_kio_writes_for_the_same_request(req, cid, client):
    assert req.frame(cid, client) == framed(client_frame(req.to_kio(), cid, client))


def test_the_broker_parses_a_replica_fetch_frame_into_the_request_sent():
    req = ReplicaFetch(2, 500, 1, 10 << 20, 77, 5, (
        ("orders", (PartitionFetch(0, 4, 1234, 3, 10, 1 << 20),
                    PartitionFetch(3, 4, 99, -1, 0, 1 << 20))),
        ("é" * 90, (PartitionFetch(1, 0, 0, -1, -1, 65536),))), (("gone", (5, 6)),))
    decoded = parse_request(req.frame(41, "strata-replica-fetcher-2")[4:])   # no length prefix
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (1, 12, 41)
    assert decoded.client_id == "strata-replica-fetcher-2"
    assert decoded.body == req.to_kio()
    body = decoded.body
    assert body.replica_id == 2 and body.session_id == 77 and body.session_epoch == 5
    assert [(t.topic, [(p.partition, p.fetch_offset, p.last_fetched_epoch) for p in t.partitions])
            for t in body.topics] == [("orders", [(0, 1234, 3), (3, 99, -1)]),
                                      ("é" * 90, [(1, 0, -1)])]
    assert [(f.topic, list(f.partitions)) for f in body.forgotten_topics_data] == [("gone", [5, 6])]


# ---- responses: the hand-written writer against kio's ----------------------------------------

codes = st.sampled_from([ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE,
                         ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH])
records = st.one_of(st.none(), st.binary(max_size=64),
                    st.integers(16 * 1024 - 2, 16 * 1024 + 2).map(lambda n: b"r" * n))


@st.composite
def fetch_responses(draw, version: int):
    rc = response_class(1, version)
    epochs = st.one_of(st.just((-1, -1)), st.tuples(i32, i64))

    def partition():
        aborted = draw(st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=3)))
        epoch, end = draw(epochs)
        tags = {}
        if version >= 12:
            leader, snapshot = draw(st.one_of(st.just((-1, -1)), st.tuples(i32, i32))), draw(epochs)
            tags = {"current_leader": nested_class(rc, "responses.partitions.current_leader")(
                        leader_id=leader[0], leader_epoch=leader[1]),
                    "snapshot_id": nested_class(rc, "responses.partitions.snapshot_id")(
                        end_offset=snapshot[1], epoch=snapshot[0])}
        return make(rc, "responses.partitions", partition_index=draw(i32), **tags,
                    error_code=draw(codes), high_watermark=draw(i64),
                    last_stable_offset=draw(i64), log_start_offset=draw(i64),
                    preferred_read_replica=draw(i32), records=draw(records),
                    aborted_transactions=None if aborted is None else tuple(
                        make(rc, "responses.partitions.aborted_transactions", producer_id=p,
                             first_offset=f) for p, f in aborted),
                    diverging_epoch=make(rc, "responses.partitions.diverging_epoch",
                                         epoch=epoch, end_offset=end) if version >= 12 else None)
    topics = tuple(make(rc, "responses", topic=draw(names), partitions=tuple(
        partition() for _ in range(draw(st.integers(0, 3)))))
        for _ in range(draw(st.integers(0, 3))))
    return make(rc, throttle_time=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
                error_code=draw(codes), session_id=draw(i32), responses=topics)


class _Collect:
    def __init__(self):
        self.parts = []

    def write(self, data):
        self.parts.append(bytes(data))


@pytest.mark.parametrize("version", range(4, 13))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_fetch_response_version_is_written_byte_for_byte_as_kio_writes_it(version, data):
    body = data.draw(fetch_responses(version))
    assert fetch_response_writable(body)
    ours = _Collect()
    write_fetch_response(ours, body)
    theirs = io.BytesIO()
    entity_writer(type(body))(theirs, body)
    assert b"".join(ours.parts) == theirs.getvalue()
    # each partition's records are handed over whole, in one write, for the sink to keep
    for t in body.responses:
        for p in t.partitions:
            if p.records:
                assert p.records in ours.parts
