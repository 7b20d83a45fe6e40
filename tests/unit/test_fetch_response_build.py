"""The Fetch handler builds each partition's answer straight from its version's kio class; for
every version 4-12 that answer equals the one the generic ``make`` builds (its zeros, schema
defaults and per-version field drops), whatever the read result."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.indexes import AbortedTxn
from strata.protocol.codec import ApiKey, kio_error_code, make, response_class
from strata.replication.replica_manager import ReadResult
from strata.server.handlers.fetch import _partition, _shape

offsets = st.integers(-1, 2**62)
results = st.builds(
    lambda **fields: ReadResult(**fields),   # given the class, hypothesis would infer the rest
    error=st.sampled_from([ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE,
                           ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH]),
    high_watermark=offsets, last_stable_offset=offsets, log_start_offset=offsets,
    records=st.binary(max_size=64),
    aborted_transactions=st.none() | st.lists(st.builds(
        lambda **fields: AbortedTxn(**fields), producer_id=st.integers(0, 2**62),
        first_offset=offsets, last_offset=offsets, last_stable_offset=offsets), max_size=3),
    diverging_epoch=st.none() | st.tuples(st.integers(0, 2**31 - 1), offsets),
    preferred_read_replica=st.integers(-1, 5))


def made_by_make(version: int, tp: TopicPartition, r: ReadResult, committed: bool):
    rc = response_class(ApiKey.FETCH, version)
    aborted = tuple(make(rc, "responses.partitions.aborted_transactions",
                         producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in (r.aborted_transactions or ())) if committed else None
    diverging = None
    if version >= 12:
        epoch, end = r.diverging_epoch if r.diverging_epoch is not None else (-1, -1)
        diverging = make(rc, "responses.partitions.diverging_epoch", epoch=epoch, end_offset=end)
    return make(rc, "responses.partitions", partition_index=tp.partition,
                error_code=kio_error_code(r.error), high_watermark=r.high_watermark,
                last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
                aborted_transactions=aborted, preferred_read_replica=r.preferred_read_replica,
                records=r.records, diverging_epoch=diverging)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(4, 12), partition=st.integers(0, 1000), r=results,
       committed=st.booleans())
def test_each_version_s_partition_answer_is_the_one_make_builds(version, partition, r, committed):
    tp = TopicPartition("t", partition)
    assert _partition(_shape(version), tp, r, committed) == made_by_make(version, tp, r, committed)


def test_each_version_s_shape_has_the_fields_kafka_added_in_it():
    for version in range(4, 13):
        shape = _shape(version)
        assert shape.response is response_class(ApiKey.FETCH, version)
        assert shape.log_start_offset == (version >= 5)
        assert shape.sessions == (version >= 7)
        assert shape.preferred_read_replica == (version >= 11)
        assert (shape.diverging is not None) == (version >= 12)
