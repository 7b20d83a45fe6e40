"""The follower's hand-written Fetch v12 frame is byte for byte kio's, and the broker parses it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.protocol.client import client_frame, framed
from strata.protocol.codec import parse_request
from strata.protocol.replica_fetch import PartitionFetch, ReplicaFetch

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
            for t in body.topics] == [("orders", [(0, 1234, 3), (3, 99, -1)]), ("é" * 90, [(1, 0, -1)])]
    assert [(f.topic, list(f.partitions)) for f in body.forgotten_topics_data] == [("gone", [5, 6])]
