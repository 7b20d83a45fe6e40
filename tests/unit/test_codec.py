"""Kafka request decoding / response encoding (strata.protocol.codec) on top of kio."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import types
import typing
import uuid

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records

from strata.common.errors import ErrorCode
from strata.protocol import codec
from wire import client_frame
from strata.protocol.codec import (
    API_VERSIONS, ApiKey, DecodedRequest, MalformedRequest, RequestFrame, UnsupportedReason,
    UnsupportedVersion, api_versions_response, encode_api_versions_fallback, encode_response,
    encode_response_parts, error_response, kio_versions, parse_request, request_class,
    response_class)
from strata.protocol.wire import encode_uvarint
from strata.protocol.records import SimpleRecord, build_batch

MB = 1 << 20
UTC = datetime.timezone.utc

DECODABLE = sorted(
    (key, version)
    for key, (lo, hi) in API_VERSIONS.items()
    for version in range(lo, hi + 1)
    if kio_versions(key)[0] <= version <= kio_versions(key)[1]
)


def _min_max() -> list[tuple[int, int]]:
    out = set()
    for key in API_VERSIONS:
        versions = [v for k, v in DECODABLE if k == key]
        out.update({(key, min(versions)), (key, max(versions))})
    return sorted(out)


MIN_MAX = _min_max()


def _id(kv) -> str:
    return f"{ApiKey(kv[0]).name}-v{kv[1]}"


# ---------------------------------------------------------------------------------------------
# helpers: deterministic sample entities and client-side framing


def _unwrap(tp):
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _primitive(kafka_type: str, name: str, i: int):
    match kafka_type:
        case "int8":
            return 3 + i
        case "int16":
            return 300 + i
        case "uint16":
            return 65_000 + i
        case "int32":
            return 70_000 + i
        case "int64":
            return 2**40 + i
        case "float64":
            return 2.5
        case "bool":
            return True
        case "string":
            return f"{name}-{i}-ü"
        case "bytes":
            return b"\x00bytes\xff" + bytes([i])
        case "records":
            return build_batch([SimpleRecord(b"value-%d" % i, b"key", (), 1_700_000_000_000)])
        case "uuid":
            return uuid.UUID(int=0x1234_5678_9ABC + i)
        case "timedelta_i32":
            return datetime.timedelta(milliseconds=1_500 + i)
        case "timedelta_i64":
            return datetime.timedelta(milliseconds=86_400_000 + i)
        case "datetime_i64":
            return datetime.datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
        case "error_code":
            return KioErrorCode.unknown_topic_or_partition
    raise AssertionError(kafka_type)


def sample(cls, *, nulls: bool = False, width: int = 2):
    """An instance of kio entity ``cls`` with every field set (tagged ones to non-defaults).

    ``nulls``: nullable (non-tagged) fields are None instead.
    """
    kwargs = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        tp, optional = _unwrap(f.type)
        if optional and nulls and "tag" not in f.metadata:
            kwargs[f.name] = None
        elif typing.get_origin(tp) is tuple:
            elem = typing.get_args(tp)[0]
            if dataclasses.is_dataclass(elem):
                kwargs[f.name] = tuple(sample(elem, nulls=nulls, width=width) for _ in range(width))
            else:
                kwargs[f.name] = tuple(_primitive(f.metadata["kafka_type"], f.name, j)
                                       for j in range(width))
        elif dataclasses.is_dataclass(tp):
            kwargs[f.name] = sample(tp, nulls=nulls, width=width)
        else:
            kwargs[f.name] = _primitive(f.metadata["kafka_type"], f.name, i)
    return cls(**kwargs)


def raw_header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"c") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def split_response(frame: bytes, header_v1: bool) -> tuple[int, bytes]:
    """Check the length prefix and header; return (correlation id, body bytes)."""
    (length,) = struct.unpack_from(">i", frame, 0)
    assert length == len(frame) - 4
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    if header_v1:
        assert frame[8] == 0  # empty tagged fields
        return correlation_id, frame[9:]
    return correlation_id, frame[8:]


def decode_response(request: DecodedRequest, frame: bytes):
    cls = response_class(request.api_key, request.api_version)
    header_v1 = request.api_key != ApiKey.API_VERSIONS and cls.__flexible__
    correlation_id, body = split_response(frame, header_v1)
    assert correlation_id == request.correlation_id
    obj, size = entity_reader(cls)(body, 0)
    assert size == len(body)
    return obj


def error_codes(obj) -> list[int]:
    """Every ``error_code``-typed value anywhere in a kio entity."""
    found = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            found.append(int(value))
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    found.extend(error_codes(item))
        elif dataclasses.is_dataclass(value):
            found.extend(error_codes(value))
    return found


# ---------------------------------------------------------------------------------------------
# the advertised table


def test_api_key_enum_matches_kafka_numbering():
    assert ApiKey.PRODUCE == 0 and ApiKey.FETCH == 1 and ApiKey.METADATA == 3
    assert ApiKey.API_VERSIONS == 18 and ApiKey.INIT_PRODUCER_ID == 22
    assert ApiKey.INCREMENTAL_ALTER_CONFIGS == 44 and ApiKey.DESCRIBE_CLUSTER == 60
    from kio.schema.index import api_key_map
    for key, name in api_key_map.items():
        assert ApiKey(key).name == name.upper()


def test_advertised_ranges_are_the_agreed_ones():
    assert API_VERSIONS[ApiKey.PRODUCE] == (0, 12)    # v12: transactions V2
    assert API_VERSIONS[ApiKey.FETCH] == (4, 12)
    assert API_VERSIONS[ApiKey.API_VERSIONS] == (0, 4)
    assert API_VERSIONS[ApiKey.FIND_COORDINATOR] == (0, 6)
    assert API_VERSIONS[ApiKey.DESCRIBE_GROUPS] == (0, 6)
    assert API_VERSIONS[ApiKey.LIST_GROUPS] == (0, 5)
    assert API_VERSIONS[ApiKey.DESCRIBE_LOG_DIRS] == (1, 5)
    assert API_VERSIONS[ApiKey.ALTER_PARTITION] == (2, 3)
    assert API_VERSIONS[ApiKey.END_TXN] == (0, 5)   # v5 is transactions V2
    assert API_VERSIONS[ApiKey.ALTER_USER_SCRAM_CREDENTIALS] == (0, 0)
    assert API_VERSIONS[ApiKey.SASL_HANDSHAKE] == (0, 1)
    assert API_VERSIONS[ApiKey.SASL_AUTHENTICATE] == (0, 2)
    assert API_VERSIONS[ApiKey.CREATE_DELEGATION_TOKEN] == (1, 3)     # Kafka 4's
    assert API_VERSIONS[ApiKey.DESCRIBE_DELEGATION_TOKEN] == (1, 3)
    assert API_VERSIONS[ApiKey.RENEW_DELEGATION_TOKEN] == API_VERSIONS[
        ApiKey.EXPIRE_DELEGATION_TOKEN] == (1, 2)
    assert API_VERSIONS[ApiKey.OFFSET_COMMIT] == (2, 9)      # v9: KIP-848 member epochs
    assert API_VERSIONS[ApiKey.OFFSET_FETCH] == (1, 9)
    assert API_VERSIONS[ApiKey.CONSUMER_GROUP_HEARTBEAT] == (0, 1)
    assert API_VERSIONS[ApiKey.CONSUMER_GROUP_DESCRIBE] == (0, 1)
    assert API_VERSIONS[ApiKey.UPDATE_FEATURES] == (0, 2)
    assert len(API_VERSIONS) == 58


def test_every_advertised_version_is_decodable_except_produce_v0_to_v2():
    undecodable = [(k, v) for k, (lo, hi) in API_VERSIONS.items() for v in range(lo, hi + 1)
                   if (k, v) not in DECODABLE]
    assert undecodable == [(ApiKey.PRODUCE, 0), (ApiKey.PRODUCE, 1), (ApiKey.PRODUCE, 2)]


def test_request_and_response_classes_are_looked_up_by_key_and_version():
    assert request_class(3, 12).__name__ == "MetadataRequest"
    assert request_class(3, 12).__version__ == 12
    assert response_class(1, 12).__name__ == "FetchResponse"
    with pytest.raises(LookupError):
        request_class(0, 2)
    with pytest.raises(LookupError):
        response_class(999, 0)


# ---------------------------------------------------------------------------------------------
# request round trips


@pytest.mark.parametrize("kv", DECODABLE, ids=_id)
def test_every_advertised_request_version_round_trips(kv):
    api_key, version = kv
    body = sample(request_class(api_key, version))
    decoded = parse_request(client_frame(body, correlation_id=1234, client_id="app-1"))
    assert decoded.api_key is ApiKey(api_key)
    assert (decoded.api_version, decoded.correlation_id, decoded.client_id) == (version, 1234, "app-1")
    assert decoded.body == body
    assert type(decoded.body) is type(body)


@pytest.mark.parametrize("kv", MIN_MAX, ids=_id)
def test_min_and_max_versions_round_trip_with_nulls_and_right_header(kv):
    api_key, version = kv
    cls = request_class(api_key, version)
    for body in (sample(cls, nulls=True), sample(cls, width=0), sample(cls, width=3)):
        decoded = parse_request(client_frame(body, correlation_id=-5, client_id=None))
        assert decoded.body == body
        assert decoded.client_id is None and decoded.correlation_id == -5
    flexible = cls.__flexible__
    assert decoded.header_version == (2 if flexible else 1)
    header_cls = RequestHeaderV2 if flexible else RequestHeaderV1
    assert decoded.header == header_cls(request_api_key=api_key, request_api_version=version,
                                        correlation_id=-5, client_id=None)


def test_header_version_follows_flexible_versions():
    # Metadata v9 is the first flexible version: header v2 (tagged fields after the client id).
    for version, expected in ((8, 1), (9, 2)):
        body = sample(request_class(ApiKey.METADATA, version))
        assert parse_request(client_frame(body)).header_version == expected
    # ApiVersions v3 is flexible: request header v2 as well.
    assert parse_request(client_frame(sample(request_class(18, 3)))).header_version == 2


def test_client_id_is_utf8_and_may_be_empty():
    body = sample(request_class(ApiKey.HEARTBEAT, 4))
    assert parse_request(client_frame(body, client_id="")).client_id == ""
    assert parse_request(client_frame(body, client_id="клиент")).client_id == "клиент"


def _nested_cls(cls, path):
    for name in path.split("."):
        tp, _ = _unwrap(cls.__dataclass_fields__[name].type)
        cls = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
    return cls


def test_frames_may_be_bytes_bytearray_or_memoryview():
    body = sample(request_class(ApiKey.FETCH, 12))
    frame = client_frame(body)
    for buf in (frame, bytearray(frame), memoryview(frame), memoryview(b"xx" + frame)[2:]):
        assert parse_request(buf).body == body


def test_trailing_bytes_after_the_body_are_ignored_like_kafka():
    body = sample(request_class(ApiKey.METADATA, 12))
    assert parse_request(client_frame(body) + b"\x00junk").body == body


def test_request_frame_peek_reads_the_fixed_prefix():
    frame = client_frame(sample(request_class(ApiKey.FETCH, 7)), correlation_id=99)
    assert RequestFrame.peek(frame) == (ApiKey.FETCH, 7, 99)
    with pytest.raises(MalformedRequest):
        RequestFrame.peek(frame[:7])


# ---------------------------------------------------------------------------------------------
# tagged fields


def test_unknown_tagged_fields_are_ignored_at_top_level():
    body = sample(request_class(ApiKey.API_VERSIONS, 3))
    frame = client_frame(body)
    assert frame[-1] == 0  # top-level tagged field count
    v = encode_uvarint
    extra = v(2) + v(7) + v(3) + b"abc" + v(300) + v(0)
    assert parse_request(frame[:-1] + extra).body == body


def test_unknown_tagged_fields_are_ignored_in_nested_entities_and_header():
    cls = request_class(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4)
    topic = _nested_cls(cls, "topics")
    partition = _nested_cls(cls, "topics.partitions")
    body = cls(replica_id=-1, topics=(topic(topic="t", partitions=(
        partition(partition=5, current_leader_epoch=1, leader_epoch=2),)),))
    frame = client_frame(body, client_id="c")
    # header v2: prefix(8) + client id(2 + 1) + tag count; then replica_id(4), topics count,
    # name, partitions count, 12 bytes of partition, partition tags, topic tags, top tags.
    header_end = 11
    assert frame[header_end] == 0
    v = encode_uvarint
    unknown = v(1) + v(42) + v(2) + b"zz"
    pos = header_end + 1 + 4 + 1 + 2 + 1 + 12
    assert frame[pos] == 0
    patched = (frame[:header_end] + unknown + frame[header_end + 1:pos] + unknown
               + frame[pos + 1:])
    decoded = parse_request(patched)
    assert decoded.body == body
    assert decoded.client_id == "c"


def test_known_tagged_fields_round_trip_and_size_mismatch_is_malformed():
    cls = request_class(ApiKey.FETCH, 12)
    body = dataclasses.replace(sample(cls), cluster_id="cluster-x")  # tag 0
    frame = client_frame(body)
    assert parse_request(frame).body.cluster_id == "cluster-x"
    # The body's first tagged section is at the end: count 1, tag 0, size, compact string.
    v = encode_uvarint
    tail = v(1) + v(0) + v(len("cluster-x") + 1) + v(10) + b"cluster-x"
    assert frame.endswith(tail)
    bad = frame[:-len(tail)] + v(1) + v(0) + v(3) + v(10) + b"cluster-x"
    with pytest.raises(MalformedRequest):
        parse_request(bad)


def test_unknown_tags_nested_inside_a_known_tagged_struct_are_removed():
    # No advertised request has a tagged struct, so exercise the pre-scan on a Fetch v12
    # response: PartitionData.current_leader is tag 1, itself a flexible struct.
    cls = response_class(ApiKey.FETCH, 12)
    leader = _nested_cls(cls, "responses.partitions.current_leader")
    response = error_response(_request(ApiKey.FETCH, 12), ErrorCode.NONE)
    partition = dataclasses.replace(response.responses[0].partitions[0],
                                    current_leader=leader(leader_id=3, leader_epoch=4))
    response = dataclasses.replace(response, responses=(dataclasses.replace(
        response.responses[0], partitions=(partition,)),))
    buf = io.BytesIO()
    entity_writer(cls)(buf, response)
    encoded = buf.getvalue()
    known = b"\x01\x09" + struct.pack(">ii", 3, 4) + b"\x00"
    assert encoded.count(known) == 1
    patched = encoded.replace(known, b"\x01\x0c" + struct.pack(">ii", 3, 4) + b"\x01\x09\x01x")
    with pytest.raises(KeyError):
        entity_reader(cls)(patched, 0)  # kio itself rejects unknown tags
    edits = []
    assert codec._entity_skimmer(cls)(patched, 0, len(patched), edits) == len(patched)
    cleaned = codec._apply_edits(patched, 0, len(patched), edits)
    assert cleaned == encoded
    assert entity_reader(cls)(cleaned, 0) == (response, len(encoded))


# ---------------------------------------------------------------------------------------------
# unsupported versions


@pytest.mark.parametrize("api_key, version, reason", [
    (ApiKey.METADATA, 13, UnsupportedReason.VERSION_NOT_SUPPORTED),  # kio knows it, we don't
    (ApiKey.FETCH, 3, UnsupportedReason.VERSION_NOT_SUPPORTED),
    (ApiKey.FETCH, 13, UnsupportedReason.VERSION_NOT_SUPPORTED),
    (ApiKey.PRODUCE, 2, UnsupportedReason.VERSION_NOT_DECODABLE),  # advertised, kio has no schema
    (ApiKey.PRODUCE, 0, UnsupportedReason.VERSION_NOT_DECODABLE),
    (ApiKey.PRODUCE, 99, UnsupportedReason.VERSION_NOT_SUPPORTED),
    (ApiKey.LEADER_AND_ISR, 0, UnsupportedReason.API_NOT_SUPPORTED),
    (ApiKey.SASL_HANDSHAKE, 2, UnsupportedReason.VERSION_NOT_SUPPORTED),
    (999, 0, UnsupportedReason.UNKNOWN_API_KEY),
    (-1, 0, UnsupportedReason.UNKNOWN_API_KEY),
    (ApiKey.METADATA, -1, UnsupportedReason.VERSION_NOT_SUPPORTED),
])
def test_unsupported_versions_of_other_apis_raise_unsupported_version(api_key, version, reason):
    frame = raw_header(api_key, version, 31337) + b"\x00" * 20
    with pytest.raises(UnsupportedVersion) as info:
        parse_request(frame)
    err = info.value
    assert (err.api_key, err.api_version, err.correlation_id, err.reason) == (api_key, version, 31337, reason)
    assert err.code == ErrorCode.UNSUPPORTED_VERSION


def test_unsupported_version_is_raised_before_looking_at_the_body():
    # Even a header without a client id: the version alone decides.
    with pytest.raises(UnsupportedVersion):
        parse_request(struct.pack(">hhi", ApiKey.METADATA, 13, 1))


@pytest.mark.parametrize("version", [5, 100])
def test_unsupported_api_versions_version_gets_the_v0_fallback(version):
    frame = raw_header(18, version, 77) + b"\x00garbage-of-a-future-version"
    with pytest.raises(UnsupportedVersion) as info:
        parse_request(frame)
    assert info.value.api_key == ApiKey.API_VERSIONS
    out = encode_api_versions_fallback(info.value.correlation_id)
    correlation_id, body = split_response(out, header_v1=False)
    assert correlation_id == 77
    decoded, size = entity_reader(response_class(18, 0))(body, 0)
    assert size == len(body)
    assert decoded.error_code == ErrorCode.UNSUPPORTED_VERSION == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == API_VERSIONS
    assert [k.api_key for k in decoded.api_keys] == sorted(API_VERSIONS)


def test_fallback_is_readable_by_kafka_python():
    """kafka-python 3.x decodes an errored ApiVersions answer as v0 whatever it asked for."""
    from kafka.protocol.metadata.api_versions import ApiVersionsResponse
    response = ApiVersionsResponse.decode(encode_api_versions_fallback(5)[4:], version=3, header=True)
    assert response._header.correlation_id == 5
    assert response.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == API_VERSIONS


# ---------------------------------------------------------------------------------------------
# malformed frames


@pytest.mark.parametrize("frame", [b"", b"\x00", b"\x00\x03\x00\x0c\x00\x00\x00"], ids=repr)
def test_frames_shorter_than_the_header_prefix_are_malformed(frame):
    with pytest.raises(MalformedRequest):
        parse_request(frame)


def test_bad_client_ids_are_malformed():
    prefix = struct.pack(">hhi", ApiKey.METADATA, 12, 1)
    for tail in (b"", b"\x00", struct.pack(">h", 10) + b"short", struct.pack(">h", -2)):
        with pytest.raises(MalformedRequest):
            parse_request(prefix + tail)


@pytest.mark.parametrize("kv", MIN_MAX, ids=_id)
def test_every_truncation_of_a_valid_frame_is_malformed(kv):
    frame = client_frame(sample(request_class(*kv)))
    for cut in range(8, len(frame)):
        with pytest.raises(MalformedRequest):
            parse_request(frame[:cut])


@pytest.mark.parametrize("count_bytes", [
    encode_uvarint(2**35 - 1),  # the largest 5-byte varint: kio would allocate 256 GiB, abort
    encode_uvarint(2**31),
    encode_uvarint(1_000_000),
])
def test_huge_compact_array_counts_are_rejected_before_kio_allocates(count_bytes):
    frame = raw_header(ApiKey.METADATA, 12, 1) + b"\x00" + count_bytes + b"\x00" * 32
    with pytest.raises(MalformedRequest, match="array longer than frame"):
        parse_request(frame)


def test_huge_legacy_array_counts_are_rejected_before_kio_allocates():
    for count in (2**31 - 1, 100_000):
        frame = raw_header(ApiKey.METADATA, 1, 1) + struct.pack(">i", count) + b"\x00\x01a" * 4
        with pytest.raises(MalformedRequest, match="array longer than frame"):
            parse_request(frame)
    frame = raw_header(ApiKey.METADATA, 1, 1) + struct.pack(">i", -7)
    with pytest.raises(MalformedRequest, match="negative array length"):
        parse_request(frame)


def test_kio_decode_errors_become_malformed():
    # Invalid UTF-8 in a topic name, and a null where a non-nullable string belongs: the skim
    # accepts both (sizes are fine), kio rejects them.
    bad_utf8 = raw_header(ApiKey.METADATA, 1, 1) + struct.pack(">ih", 1, 2) + b"\xff\xfe"
    null_name = raw_header(ApiKey.METADATA, 1, 1) + struct.pack(">ih", 1, -1)
    for frame in (bad_utf8, null_name):
        with pytest.raises(MalformedRequest):
            parse_request(frame)


def _parse_or_codec_error(frame) -> None:
    try:
        parse_request(frame)
    except (MalformedRequest, UnsupportedVersion):
        pass


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_codec_errors(frame):
    _parse_or_codec_error(frame)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(DECODABLE), st.integers(-1, 40), st.binary(max_size=200))
def test_random_bodies_behind_valid_headers_only_raise_codec_errors(kv, client_id_len, body):
    client_id = struct.pack(">h", client_id_len) + b"x" * max(client_id_len, 0)
    _parse_or_codec_error(struct.pack(">hhi", *kv, 1) + client_id + body)


_VALID_FRAMES = [client_frame(sample(request_class(*kv))) for kv in DECODABLE]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_VALID_FRAMES), st.data())
def test_truncated_and_corrupted_valid_frames_only_raise_codec_errors(frame, data):
    cut = data.draw(st.integers(8, len(frame) - 1))
    with pytest.raises(MalformedRequest):
        parse_request(frame[:cut])
    corrupted = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(frame) - 1))
        corrupted[position] = data.draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, position & 0xFF]))
    _parse_or_codec_error(bytes(corrupted))


st.register_type_strategy(Records, st.binary(max_size=64).map(Records))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(DECODABLE).flatmap(lambda kv: st.from_type(request_class(*kv))))
def test_hypothesis_generated_requests_round_trip(body):
    try:
        parsed = parse_request(client_frame(body))
    except MalformedRequest as exc:
        # kio writes an i64 milliseconds field (OffsetCommit retention_time) up to i64 max but
        # cannot read back one beyond datetime.timedelta's range; clients send -1 there.
        if "timedelta" in str(exc):
            reject()
        raise
    assert parsed.body == body


# ---------------------------------------------------------------------------------------------
# responses


def _request(api_key: int, version: int, correlation_id: int = 11, **changes) -> DecodedRequest:
    body = sample(request_class(api_key, version))
    if changes:
        body = dataclasses.replace(body, **changes)
    return parse_request(client_frame(body, correlation_id=correlation_id))


def test_api_versions_v3_response_uses_response_header_v0():
    request = _request(ApiKey.API_VERSIONS, 3, correlation_id=4242)
    response = api_versions_response(3)
    out = encode_response(request, response)
    (length, correlation_id, error) = struct.unpack_from(">iih", out, 0)
    assert (length, correlation_id, error) == (len(out) - 4, 4242, 0)  # no tag byte after the id
    assert decode_response(request, out) == response
    # kafka-python knows this quirk too.
    from kafka.protocol.metadata.api_versions import ApiVersionsResponse
    decoded = ApiVersionsResponse.decode(out[4:], version=3, header=True)
    assert decoded._header.correlation_id == 4242
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == API_VERSIONS


def test_flexible_responses_use_response_header_v1():
    request = _request(ApiKey.METADATA, 12, correlation_id=8)
    response = response_class(3, 12)(throttle_time=datetime.timedelta(0), brokers=(), topics=())
    out = encode_response(request, response)
    assert struct.unpack_from(">iib", out, 0) == (len(out) - 4, 8, 0)
    assert decode_response(request, out) == response


def test_non_flexible_responses_use_response_header_v0():
    request = _request(ApiKey.HEARTBEAT, 3, correlation_id=9)
    response = response_class(12, 3)(throttle_time=datetime.timedelta(0), error_code=KioErrorCode.none)
    out = encode_response(request, response)
    assert out == struct.pack(">iiih", 10, 9, 0, 0)


@pytest.mark.parametrize("version", range(0, 4))
def test_api_versions_response_lists_the_advertised_table(version):
    request = _request(ApiKey.API_VERSIONS, version)
    decoded = decode_response(request, encode_response(request, api_versions_response(version)))
    assert decoded.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == API_VERSIONS


def _fetch_response(records):
    cls = response_class(ApiKey.FETCH, 12)
    partition = _nested_cls(cls, "responses.partitions")
    topic = _nested_cls(cls, "responses")
    return cls(throttle_time=datetime.timedelta(0), error_code=KioErrorCode.none, session_id=0,
               responses=(topic(topic="t", partitions=(partition(
                   partition_index=0, error_code=KioErrorCode.none, high_watermark=10,
                   last_stable_offset=10, log_start_offset=0, aborted_transactions=(),
                   records=records),)),))


def test_fetch_response_records_are_not_copied_into_the_parts():
    request = _request(ApiKey.FETCH, 12)
    records = bytes(range(256)) * (4 * 1024)  # 1 MiB
    response = _fetch_response(records)
    parts = encode_response_parts(request, response)
    assert any(part is records for part in parts)
    joined = encode_response(request, response)
    assert joined == b"".join(parts)
    assert struct.unpack_from(">i", joined)[0] == len(joined) - 4 == sum(map(len, parts)) - 4
    assert decode_response(request, joined).responses[0].partitions[0].records == records


def test_fetch_response_accepts_memoryview_records():
    request = _request(ApiKey.FETCH, 11)
    segment = bytearray(b"x" * 100 + bytes(range(256)) * 100)
    view = memoryview(segment)[100:]
    cls = response_class(ApiKey.FETCH, 11)
    response = error_response(request, ErrorCode.NONE)
    response = dataclasses.replace(response, responses=(dataclasses.replace(
        response.responses[0], partitions=(dataclasses.replace(
            response.responses[0].partitions[0], records=view),)),))
    assert type(response) is cls
    parts = encode_response_parts(request, response)
    assert any(part is view for part in parts)
    decoded = decode_response(request, encode_response(request, response))
    assert decoded.responses[0].partitions[0].records == bytes(view)


def test_small_responses_are_a_single_buffer():
    request = _request(ApiKey.FETCH, 12)
    parts = encode_response_parts(request, _fetch_response(b"abc"))
    assert len(parts) == 1


def test_encode_response_rejects_a_body_for_another_api_or_version():
    request = _request(ApiKey.HEARTBEAT, 3)
    with pytest.raises(ValueError):
        encode_response(request, response_class(12, 4)(throttle_time=datetime.timedelta(0),
                                                       error_code=KioErrorCode.none))
    with pytest.raises(ValueError):
        encode_response(request, api_versions_response(3))


# ---------------------------------------------------------------------------------------------
# error responses


def _keys(items, *paths):
    out = []
    for item in items or ():
        out.append(tuple(getattr(item, p) for p in paths))
    return out


def _nested_keys(topics, topic_attr, parts_attr, part_attr):
    return [(getattr(t, topic_attr), getattr(p, part_attr))
            for t in topics or () for p in getattr(t, parts_attr)]


# api key -> (request keys, response keys); both must match (the response mirrors the request)
MIRRORED = {
    ApiKey.PRODUCE: (lambda b: _nested_keys(b.topic_data, "name", "partition_data", "index"),
                     lambda r: _nested_keys(r.responses, "name", "partition_responses", "index")),
    ApiKey.FETCH: (lambda b: _nested_keys(b.topics, "topic", "partitions", "partition"),
                   lambda r: _nested_keys(r.responses, "topic", "partitions", "partition_index")),
    ApiKey.LIST_OFFSETS: (lambda b: _nested_keys(b.topics, "name", "partitions", "partition_index"),
                          lambda r: _nested_keys(r.topics, "name", "partitions", "partition_index")),
    ApiKey.METADATA: (lambda b: _keys(b.topics, "name"), lambda r: _keys(r.topics, "name")),
    ApiKey.OFFSET_COMMIT: (
        lambda b: _nested_keys(b.topics, "name", "partitions", "partition_index"),
        lambda r: _nested_keys(r.topics, "name", "partitions", "partition_index")),
    # v8+ batch groups
    ApiKey.OFFSET_FETCH: (
        lambda b: [(g.group_id, t.name, i) for g in b.groups for t in g.topics or ()
                   for i in t.partition_indexes] if hasattr(b, "groups") else
        [(t.name, i) for t in b.topics or () for i in t.partition_indexes],
        lambda r: [(g.group_id, t.name, p.partition_index) for g in r.groups for t in g.topics
                   for p in t.partitions] if hasattr(r, "groups") else
        _nested_keys(r.topics, "name", "partitions", "partition_index")),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (lambda b: list(b.group_ids),
                                     lambda r: [g.group_id for g in r.groups]),
    ApiKey.LEAVE_GROUP: (lambda b: _keys(getattr(b, "members", ()), "member_id"),
                         lambda r: _keys(getattr(r, "members", ()), "member_id")),
    ApiKey.DESCRIBE_GROUPS: (lambda b: list(b.groups), lambda r: [g.group_id for g in r.groups]),
    ApiKey.DELETE_GROUPS: (lambda b: list(dict.fromkeys(b.groups_names)),
                           lambda r: [g.group_id for g in r.results]),
    ApiKey.CREATE_TOPICS: (lambda b: _keys(b.topics, "name"), lambda r: _keys(r.topics, "name")),
    ApiKey.DELETE_TOPICS: (
        lambda b: [(t.name,) for t in b.topics] if hasattr(b, "topics") else [(n,) for n in b.topic_names],
        lambda r: _keys(r.responses, "name")),
    ApiKey.DELETE_RECORDS: (
        lambda b: _nested_keys(b.topics, "name", "partitions", "partition_index"),
        lambda r: _nested_keys(r.topics, "name", "partitions", "partition_index")),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (
        lambda b: _nested_keys(b.topics, "topic", "partitions", "partition"),
        lambda r: _nested_keys(r.topics, "topic", "partitions", "partition")),
    ApiKey.DESCRIBE_CONFIGS: (lambda b: _keys(b.resources, "resource_type", "resource_name"),
                              lambda r: _keys(r.results, "resource_type", "resource_name")),
    ApiKey.ALTER_CONFIGS: (lambda b: _keys(b.resources, "resource_type", "resource_name"),
                           lambda r: _keys(r.responses, "resource_type", "resource_name")),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (
        lambda b: _keys(b.resources, "resource_type", "resource_name"),
        lambda r: _keys(r.responses, "resource_type", "resource_name")),
    ApiKey.CREATE_PARTITIONS: (lambda b: _keys(b.topics, "name"), lambda r: _keys(r.results, "name")),
    ApiKey.ALTER_CLIENT_QUOTAS: (
        lambda b: [tuple((e.entity_type, e.entity_name) for e in x.entity) for x in b.entries],
        lambda r: [tuple((e.entity_type, e.entity_name) for e in x.entity) for x in r.entries]),
    # each user named, once, in name order
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (
        lambda b: sorted({x.name for x in (*b.deletions, *b.upsertions)}),
        lambda r: [x.user for x in r.results]),
    # v0-3 name one key and answer without it; v4+ answer each key
    ApiKey.FIND_COORDINATOR: (lambda b: list(getattr(b, "coordinator_keys", ["one"])),
                              lambda r: [c.key for c in r.coordinators]
                              if hasattr(r, "coordinators") else ["one"]),
    ApiKey.CREATE_ACLS: (lambda b: [()] * len(b.creations), lambda r: [()] * len(r.results)),
    ApiKey.DELETE_ACLS: (lambda b: [()] * len(b.filters), lambda r: [()] * len(r.filter_results)),
    ApiKey.DESCRIBE_PRODUCERS: (
        lambda b: [(t.name, i) for t in b.topics for i in t.partition_indexes],
        lambda r: _nested_keys(r.topics, "name", "partitions", "partition_index")),
    ApiKey.DESCRIBE_TRANSACTIONS: (lambda b: list(b.transactional_ids),
                                   lambda r: [s.transactional_id for s in r.transaction_states]),
    ApiKey.ELECT_LEADERS: (
        lambda b: [(t.topic, p) for t in b.topic_partitions or () for p in t.partitions],
        lambda r: _nested_keys(r.replica_election_results, "topic", "partition_result",
                               "partition_id")),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (
        lambda b: _nested_keys(b.topics, "name", "partitions", "partition_index"),
        lambda r: _nested_keys(r.responses, "name", "partitions", "partition_index")),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (lambda b: _keys(b.topics, "name"),
                                       lambda r: _keys(r.topics, "name")),
    # v0-3 one transaction; v4+ (broker verification) several, each answered
    ApiKey.ADD_PARTITIONS_TO_TXN: (
        lambda b: [(t.name, p) for t in b.v3_and_below_topics for p in t.partitions]
        if hasattr(b, "v3_and_below_topics") else
        [(x.transactional_id, t.name, p) for x in b.transactions for t in x.topics
         for p in t.partitions],
        lambda r: _nested_keys(r.results_by_topic_v3_and_below, "name", "results_by_partition",
                               "partition_index")
        if hasattr(r, "results_by_topic_v3_and_below") else
        [(x.transactional_id, t.name, p.partition_index) for x in r.results_by_transaction
         for t in x.topic_results for p in t.results_by_partition]),
    ApiKey.TXN_OFFSET_COMMIT: (
        lambda b: _nested_keys(b.topics, "name", "partitions", "partition_index"),
        lambda r: _nested_keys(r.topics, "name", "partitions", "partition_index")),
    ApiKey.WRITE_TXN_MARKERS: (
        lambda b: [(m.producer_id, t.name, p) for m in b.markers for t in m.topics
                   for p in t.partition_indexes],
        lambda r: [(m.producer_id, t.name, p.partition_index) for m in r.markers
                   for t in m.topics for p in t.partitions]),
}

# APIs whose only error field is top-level
TOP_LEVEL_ONLY = {ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP,
                  ApiKey.CONSUMER_GROUP_HEARTBEAT,
                  ApiKey.LIST_GROUPS, ApiKey.OFFSET_DELETE, ApiKey.INIT_PRODUCER_ID, ApiKey.DESCRIBE_CLUSTER,
                  ApiKey.API_VERSIONS, ApiKey.DESCRIBE_LOG_DIRS, ApiKey.DESCRIBE_CLIENT_QUOTAS,
                  ApiKey.DESCRIBE_ACLS, ApiKey.LIST_TRANSACTIONS, ApiKey.LIST_PARTITION_REASSIGNMENTS,
                  ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ApiKey.GET_TELEMETRY_SUBSCRIPTIONS,
                  ApiKey.PUSH_TELEMETRY, ApiKey.ALTER_PARTITION, ApiKey.ADD_OFFSETS_TO_TXN,
                  ApiKey.END_TXN, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                  ApiKey.CREATE_DELEGATION_TOKEN, ApiKey.RENEW_DELEGATION_TOKEN,
                  ApiKey.EXPIRE_DELEGATION_TOKEN, ApiKey.DESCRIBE_DELEGATION_TOKEN,
                  ApiKey.UPDATE_FEATURES}
# Versions whose response has no error field at all: Kafka's error response for them is empty
# (DescribeLogDirs gained its top-level error code in v3).
NO_ERROR_FIELD = {(ApiKey.DESCRIBE_LOG_DIRS, 1), (ApiKey.DESCRIBE_LOG_DIRS, 2)}


def test_every_advertised_api_has_an_error_response_check():
    assert set(MIRRORED) | TOP_LEVEL_ONLY == set(API_VERSIONS)


@pytest.mark.parametrize("kv", DECODABLE, ids=_id)
@pytest.mark.parametrize("code", [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_SERVER_ERROR])
def test_error_response_sets_every_error_field_and_mirrors_the_request(kv, code):
    request = _request(*kv)
    response = error_response(request, code, message="it broke")
    assert type(response) is response_class(*kv)
    decoded = decode_response(request, encode_response(request, response))
    codes = error_codes(decoded)
    if tuple(kv) in NO_ERROR_FIELD:
        assert codes == []
        return
    assert codes and set(codes) == {code}
    if kv[0] in MIRRORED:
        request_keys, response_keys = MIRRORED[kv[0]]
        assert response_keys(decoded) == request_keys(request.body)
        # the sample request is never empty (LeaveGroup v0-2 names a single member instead)
        assert response_keys(decoded) or (kv[0] == ApiKey.LEAVE_GROUP and kv[1] < 3)
    else:
        assert len(codes) == 1
    for f in ("error_message",):
        if hasattr(decoded, f) and getattr(decoded, f) is not None:
            assert getattr(decoded, f) == "it broke"


def test_error_response_details_follow_kafka():
    fetch = error_response(_request(ApiKey.FETCH, 12), ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert fetch.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and fetch.session_id == 0
    partition = fetch.responses[0].partitions[0]
    assert (partition.high_watermark, partition.log_start_offset, partition.records) == (-1, -1, b"")

    produce = error_response(_request(ApiKey.PRODUCE, 11), ErrorCode.KAFKA_STORAGE_ERROR, "disk")
    partition = produce.responses[0].partition_responses[0]
    assert (partition.base_offset, partition.log_start_offset, partition.error_message) == (-1, -1, "disk")

    init = error_response(_request(ApiKey.INIT_PRODUCER_ID, 4), ErrorCode.COORDINATOR_NOT_AVAILABLE)
    assert (init.producer_id, init.producer_epoch) == (-1, -1)

    coordinator = error_response(_request(ApiKey.FIND_COORDINATOR, 3), ErrorCode.COORDINATOR_NOT_AVAILABLE)
    assert (coordinator.node_id, coordinator.host, coordinator.port) == (-1, "", -1)

    join = error_response(_request(ApiKey.JOIN_GROUP, 9), ErrorCode.UNKNOWN_MEMBER_ID)
    assert (join.generation_id, join.member_id, join.protocol_name, join.members) == (-1, "", None, ())
    assert error_response(_request(ApiKey.JOIN_GROUP, 6), ErrorCode.UNKNOWN_MEMBER_ID).protocol_name == ""

    offsets = error_response(_request(ApiKey.LIST_OFFSETS, 7), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    partition = offsets.topics[0].partitions[0]
    assert (partition.offset, partition.timestamp, partition.leader_epoch) == (-1, -1, -1)

    fetched = error_response(_request(ApiKey.OFFSET_FETCH, 7), ErrorCode.NOT_COORDINATOR)
    assert fetched.error_code == ErrorCode.NOT_COORDINATOR
    assert fetched.topics[0].partitions[0].committed_offset == -1


def test_metadata_error_response_for_all_topics_has_no_topics():
    request = _request(ApiKey.METADATA, 12, topics=None)
    response = error_response(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    assert response.topics == () and response.brokers == () and response.controller_id == -1


def test_api_versions_error_response_lists_versions_only_for_unsupported_version():
    request = _request(ApiKey.API_VERSIONS, 3)
    assert error_response(request, ErrorCode.UNSUPPORTED_VERSION).api_keys
    assert error_response(request, ErrorCode.INVALID_REQUEST).api_keys == ()


def test_error_response_accepts_strata_and_plain_int_codes():
    request = _request(ApiKey.HEARTBEAT, 4)
    assert error_response(request, ErrorCode.REBALANCE_IN_PROGRESS).error_code == 27
    assert error_response(request, 27).error_code is KioErrorCode.rebalance_in_progress


def test_apis_without_a_dedicated_builder_get_a_top_level_error():
    # SaslHandshake is not advertised, but a handler may still need an error for it.
    body = request_class(ApiKey.SASL_HANDSHAKE, 1)(mechanism="PLAIN")
    request = DecodedRequest(ApiKey.SASL_HANDSHAKE, 1, 3, None, None, body)
    response = error_response(request, ErrorCode.UNSUPPORTED_SASL_MECHANISM)
    assert response.error_code == 33 and response.mechanisms == ()


# ---------------------------------------------------------------------------------------------
# cross-checks with kafka-python, an independent implementation


def _kafka_python_frame(request, correlation_id=21, client_id="kafka-python-test") -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return request.encode(header=True)


def test_kafka_python_api_versions_requests_decode():
    from kafka.protocol.old.api_versions import ApiVersionsRequest
    for version in range(4):
        cls = ApiVersionsRequest[version]
        args = ("kafka-python", "2.3.3", {}) if version == 3 else ()
        decoded = parse_request(_kafka_python_frame(cls(*args), correlation_id=version))
        assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (18, version, version)
        assert decoded.client_id == "kafka-python-test"
        if version == 3:
            assert decoded.body.client_software_name == "kafka-python"
            assert decoded.body.client_software_version == "2.3.3"


def test_kafka_python_metadata_requests_decode():
    from kafka.protocol.old.metadata import MetadataRequest
    decoded = parse_request(_kafka_python_frame(MetadataRequest[0](["a", "b"])))
    assert [t.name for t in decoded.body.topics] == ["a", "b"]
    decoded = parse_request(_kafka_python_frame(MetadataRequest[1](None)))
    assert decoded.body.topics is None
    decoded = parse_request(_kafka_python_frame(MetadataRequest[8](["t"], False, True, True)))
    assert [t.name for t in decoded.body.topics] == ["t"]
    assert decoded.body.allow_auto_topic_creation is False
    assert decoded.body.include_cluster_authorized_operations is True


@pytest.mark.parametrize("version", [3, 5, 8])
def test_kafka_python_produce_requests_decode_with_raw_records(version):
    from kafka.protocol.old.produce import ProduceRequest
    batch = build_batch([SimpleRecord(b"v%d" % i, None, (), 1_700_000_000_000) for i in range(10)])
    request = ProduceRequest[version]("txn-1", -1, 30_000, [("topic-a", [(0, batch), (3, batch[:0])])])
    decoded = parse_request(_kafka_python_frame(request))
    body = decoded.body
    assert (body.transactional_id, body.acks, body.timeout) == ("txn-1", -1, datetime.timedelta(seconds=30))
    topic = body.topic_data[0]
    assert topic.name == "topic-a"
    assert [(p.index, p.records) for p in topic.partition_data] == [(0, batch), (3, b"")]


@pytest.mark.parametrize("version", [4, 11])
def test_kafka_python_fetch_requests_decode(version):
    from kafka.protocol.old.fetch import FetchRequest
    if version == 4:
        request = FetchRequest[4](-1, 500, 1, 52428800, 1, [("t", [(0, 100, 1048576), (1, 5, 1024)])])
    else:
        request = FetchRequest[11](-1, 500, 1, 52428800, 1, 0, -1,
                                   [("t", [(0, 3, 100, -1, 1048576)])], [("old", [7])], "rack-1")
    body = parse_request(_kafka_python_frame(request)).body
    assert body.max_wait == datetime.timedelta(milliseconds=500) and body.isolation_level == 1
    assert body.topics[0].topic == "t" and body.topics[0].partitions[0].fetch_offset == 100
    if version == 11:
        assert body.topics[0].partitions[0].current_leader_epoch == 3
        assert body.forgotten_topics_data[0].partitions == (7,)
        assert body.rack_id == "rack-1"


def test_kafka_python_group_and_admin_requests_decode():
    from kafka.protocol.old.admin import CreateTopicsRequest, DescribeConfigsRequest
    from kafka.protocol.old.commit import OffsetCommitRequest, OffsetFetchRequest
    from kafka.protocol.old.find_coordinator import FindCoordinatorRequest
    from kafka.protocol.old.group import HeartbeatRequest, JoinGroupRequest
    from kafka.protocol.old.init_producer_id import InitProducerIdRequest
    from kafka.protocol.old.list_offsets import ListOffsetsRequest

    body = parse_request(_kafka_python_frame(
        JoinGroupRequest[5]("g", 10_000, 30_000, "", None, "consumer", [("range", b"meta")]))).body
    assert (body.group_id, body.protocol_type, body.protocols[0].metadata) == ("g", "consumer", b"meta")
    assert body.session_timeout == datetime.timedelta(seconds=10)
    body = parse_request(_kafka_python_frame(HeartbeatRequest[3]("g", 4, "m-1", "inst"))).body
    assert (body.generation_id, body.member_id, body.group_instance_id) == (4, "m-1", "inst")
    body = parse_request(_kafka_python_frame(
        OffsetCommitRequest[7]("g", 4, "m-1", None, [("t", [(0, 42, -1, "meta")])]))).body
    partition = body.topics[0].partitions[0]
    assert (partition.committed_offset, partition.committed_metadata) == (42, "meta")
    body = parse_request(_kafka_python_frame(OffsetFetchRequest[5]("g", [("t", [0, 1])]))).body
    assert body.topics[0].partition_indexes == (0, 1)
    body = parse_request(_kafka_python_frame(FindCoordinatorRequest[2]("g", 0))).body
    assert (body.key, body.key_type) == ("g", 0)
    body = parse_request(_kafka_python_frame(ListOffsetsRequest[5](-1, 1, [("t", [(0, -1, -2)])]))).body
    assert body.topics[0].partitions[0].timestamp == -2
    body = parse_request(_kafka_python_frame(
        CreateTopicsRequest[3]([("new", 3, 1, [], [("cleanup.policy", "compact")])], 5_000, False))).body
    assert (body.topics[0].name, body.topics[0].num_partitions, body.topics[0].configs[0].value) == (
        "new", 3, "compact")
    body = parse_request(_kafka_python_frame(DescribeConfigsRequest[2]([(2, "t", None)], True))).body
    assert (body.resources[0].resource_name, body.resources[0].configuration_keys) == ("t", None)
    body = parse_request(_kafka_python_frame(InitProducerIdRequest[1](None, 60_000))).body
    assert body.transactional_id is None and body.transaction_timeout == datetime.timedelta(minutes=1)


def _kafka_python_decode(response_cls, frame: bytes):
    buf = io.BytesIO(frame[4:])
    header = response_cls.parse_header(buf)
    decoded = response_cls.decode(buf)
    assert buf.read() == b""
    return header.correlation_id, decoded


def test_kafka_python_decodes_our_metadata_responses():
    from kafka.protocol.old.metadata import MetadataResponse
    for version in (1, 8):
        request = _request(ApiKey.METADATA, version, correlation_id=61)
        cls = response_class(3, version)
        broker, topic, partition = (_nested_cls(cls, p) for p in ("brokers", "topics", "topics.partitions"))
        fields = dict(brokers=(broker(node_id=1, host="h", port=9092, rack=None),), controller_id=1,
                      topics=(topic(error_code=KioErrorCode.none, name="t", is_internal=False,
                                    partitions=(codec._make(partition, KioErrorCode.none, partition_index=0,
                                                            leader_id=1, leader_epoch=5,
                                                            replica_nodes=(1,), isr_nodes=(1,)),)),))
        if version >= 2:
            fields["cluster_id"] = "cluster"
        if version >= 3:
            fields["throttle_time"] = datetime.timedelta(0)
        correlation_id, decoded = _kafka_python_decode(
            MetadataResponse[version], encode_response(request, codec._make(cls, KioErrorCode.none, **fields)))
        assert correlation_id == 61
        assert decoded.brokers[0][:3] == (1, "h", 9092)
        assert decoded.topics[0][1] == "t"
        assert decoded.topics[0][3 if version >= 1 else 2][0][:3] == (0, 0, 1)


def test_kafka_python_decodes_our_fetch_response_with_records():
    from kafka.protocol.old.fetch import FetchResponse
    batch = build_batch([SimpleRecord(b"x" * 1000, b"k", (), 1_700_000_000_000)] * 50)
    request = _request(ApiKey.FETCH, 11, correlation_id=3)
    response = error_response(request, ErrorCode.NONE)
    response = dataclasses.replace(response, responses=(dataclasses.replace(
        response.responses[0], partitions=(dataclasses.replace(
            response.responses[0].partitions[0], high_watermark=50, records=batch),)),))
    correlation_id, decoded = _kafka_python_decode(FetchResponse[11], encode_response(request, response))
    assert correlation_id == 3
    partition = decoded.topics[0][1][0]
    assert partition[0] == response.responses[0].partitions[0].partition_index
    assert partition[2] == 50 and partition[-1] == batch


@pytest.mark.parametrize("api_key, version, module, name", [
    (ApiKey.PRODUCE, 8, "produce", "ProduceResponse"),
    (ApiKey.LIST_OFFSETS, 5, "list_offsets", "ListOffsetsResponse"),
    (ApiKey.FIND_COORDINATOR, 2, "find_coordinator", "FindCoordinatorResponse"),
    (ApiKey.HEARTBEAT, 3, "group", "HeartbeatResponse"),
    (ApiKey.OFFSET_FETCH, 5, "commit", "OffsetFetchResponse"),
    (ApiKey.INIT_PRODUCER_ID, 1, "init_producer_id", "InitProducerIdResponse"),
    (ApiKey.CREATE_TOPICS, 3, "admin", "CreateTopicsResponse"),
    (ApiKey.DESCRIBE_GROUPS, 3, "admin", "DescribeGroupsResponse"),
    (ApiKey.DELETE_TOPICS, 3, "admin", "DeleteTopicsResponse"),
])
def test_kafka_python_decodes_our_error_responses(api_key, version, module, name):
    import importlib
    response_cls = getattr(importlib.import_module(f"kafka.protocol.old.{module}"), name)[version]
    request = _request(api_key, version, correlation_id=123)
    response = error_response(request, ErrorCode.NOT_COORDINATOR)
    correlation_id, decoded = _kafka_python_decode(response_cls, encode_response(request, response))
    assert correlation_id == 123
    assert 16 in _ints(decoded.to_object())


def _ints(obj) -> list[int]:
    if isinstance(obj, dict):
        return [i for v in obj.values() for i in _ints(v)]
    if isinstance(obj, (list, tuple)):
        return [i for v in obj for i in _ints(v)]
    return [obj] if isinstance(obj, int) and not isinstance(obj, bool) else []
