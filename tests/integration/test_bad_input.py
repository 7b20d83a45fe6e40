"""Bad input over raw sockets against a live broker: it answers with Kafka error codes or
closes that one connection, keeps serving everyone else, and stores nothing it should not.

One ``strata serve`` process for the module, with ``socket.request.max.bytes`` at 1 MiB so that
oversized frames are cheap. Every hypothesis example sends its bad bytes on a connection of its
own, followed (where the framing allows) by a good ApiVersions "probe" request, and accepts:

* a well-formed response (length, correlation id, a body kio decodes completely) whose error
  codes are all Kafka's and never UNKNOWN_SERVER_ERROR, then the probe's answer; or
* the connection closed (FIN or RST) before anything was answered.

A request that is neither answered nor closed within ``IO_TIMEOUT`` fails, and so does a reply
to the probe that is missing or wrong. After every example a separate fresh connection must
get a correct ApiVersions response, and a connection opened before all of it must still work
at the end. Records produced with confluent-kafka before the bad input read back identical
afterwards, at unchanged end offsets.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import struct
import time
import types
import typing
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, assume, event, example, given, reject, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map as KIO_API_KEYS
from kio.serial import entity_reader
from kio.static.primitive import Records

from wire import client_frame, framed
from broker_process import BrokerProcess
from strata.common.errors import ErrorCode
from strata.protocol import records as rec
from strata.protocol.codec import (
    ApiKey, MalformedRequest, UnsupportedVersion, kio_versions, parse_request, request_class,
    response_class)

pytestmark = pytest.mark.slow

MAX_REQUEST = 1 << 20  # socket.request.max.bytes of the module's broker
TOPIC = "kept"
PARTITIONS = 2
IO_TIMEOUT = 10.0
PROBE_CORRELATION_ID = 0x7E57AB1E
KAFKA_ERROR_CODES = {int(c) for c in KioErrorCode} | {int(c) for c in ErrorCode}
CORRUPT_RECORDS = {ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD}

# examples per property; raise it for a deeper (slower) search
EXAMPLES = int(os.environ.get("STRATA_BAD_INPUT_EXAMPLES", 200))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))


def _advertised_at_import() -> dict[int, tuple[int, int]]:
    """What the broker will advertise (strategies need it before the broker runs; tests that
    depend on it compare with the live broker's answer)."""
    from strata.server.dispatch import advertised_versions
    return advertised_versions()


ADVERTISED_AT_IMPORT = _advertised_at_import()


# ---------------------------------------------------------------------------------------------
# client side: framing, requests and responses with kio


def request_payload(body, correlation_id: int, client_id: str | None = "bad-input") -> bytes:
    """Request header and body, without the length prefix."""
    return client_frame(body, correlation_id, client_id)


def raw_header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"bad") -> bytes:
    """Request header v1; for a flexible version add the empty tagged-field byte (v2)."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    known = kio_versions(api_key)
    if known and known[0] <= version <= known[1] and request_class(api_key, version).__flexible__:
        header += b"\x00"
    return header


def nested(cls: type, *path: str) -> type:
    """The entity class at ``path`` under kio class ``cls`` (element class for arrays)."""
    for name in path:
        tp = next(f.type for f in dataclasses.fields(cls) if f.name == name)
        if typing.get_origin(tp) in (types.UnionType, typing.Union):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
        cls = tp
    return cls


def api_versions_request(correlation_id: int) -> bytes:
    cls = request_class(ApiKey.API_VERSIONS, 3)
    return framed(request_payload(cls(client_software_name="bad-input",
                                      client_software_version="1.0"), correlation_id))


def produce_request(version: int, correlation_id: int, partition_records: dict[int, bytes],
                    acks: int = -1, topic: str = TOPIC) -> bytes:
    cls = request_class(ApiKey.PRODUCE, version)
    part_cls = nested(cls, "topic_data", "partition_data")
    topic_cls = nested(cls, "topic_data")
    parts = tuple(part_cls(index=p, records=Records(data)) for p, data in partition_records.items())
    body = cls(transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
               topic_data=(topic_cls(name=topic, partition_data=parts),))
    return framed(request_payload(body, correlation_id))


def error_codes(obj) -> list[int]:
    """Every ``error_code``-typed value anywhere in a kio entity."""
    found = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            found.append(int(value))
        elif isinstance(value, tuple):
            found.extend(c for item in value if dataclasses.is_dataclass(item)
                         for c in error_codes(item))
        elif dataclasses.is_dataclass(value):
            found.extend(error_codes(value))
    return found


def decode_response(api_key: int, version: int, payload: bytes) -> tuple[int, object]:
    """(correlation id, kio response object) of one response frame (without its prefix); fails
    unless the frame is exactly one header and one body of this api key and version."""
    cls = response_class(api_key, version)
    header_v1 = api_key != ApiKey.API_VERSIONS and cls.__flexible__
    assert len(payload) >= 4, f"response of {len(payload)} bytes has no correlation id"
    (correlation_id,) = struct.unpack_from(">i", payload)
    pos = 4
    if header_v1:
        assert payload[4:5] == b"\x00", "response header v1 must carry empty tagged fields"
        pos = 5
    obj, size = entity_reader(cls)(payload[pos:], 0)
    assert pos + size == len(payload), f"{len(payload) - pos - size} bytes after the response body"
    return correlation_id, obj


# ---------------------------------------------------------------------------------------------
# sockets


class Closed(Exception):
    """The broker closed the connection (FIN or RST) at a frame boundary."""


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s: socket.socket, n: int, *, at_boundary: bool) -> bytes:
    out = bytearray()
    while len(out) < n:
        try:
            chunk = s.recv(n - len(out))
        except ConnectionResetError:
            chunk = b""
        except socket.timeout:
            raise AssertionError(f"broker neither answered nor closed within {IO_TIMEOUT}s") from None
        if not chunk:
            if at_boundary and not out:
                raise Closed()
            raise AssertionError(f"connection closed in the middle of a response ({len(out)} of {n} bytes)")
        out += chunk
    return bytes(out)


def read_frame(s: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exactly(s, 4, at_boundary=True))
    assert 0 <= size <= 64 * MAX_REQUEST, f"response length prefix {size}"
    return recv_exactly(s, size, at_boundary=False)


def read_to_eof(s: socket.socket) -> bytes:
    """Everything the broker sends until it closes (fails if it does not close)."""
    out = bytearray()
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return bytes(out)
        except socket.timeout:
            raise AssertionError(f"connection still open after {IO_TIMEOUT}s") from None
        if not chunk:
            return bytes(out)
        out += chunk


def check_api_versions(payload: bytes, correlation_id: int, expected_apis: dict | None) -> dict:
    got_corr, resp = decode_response(ApiKey.API_VERSIONS, 3, payload)
    assert got_corr == correlation_id
    assert int(resp.error_code) == ErrorCode.NONE
    apis = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    if expected_apis is not None:
        assert apis == expected_apis, "ApiVersions answer changed"
    return apis


def api_versions_on(s: socket.socket, correlation_id: int, expected_apis: dict | None) -> dict:
    s.sendall(api_versions_request(correlation_id))
    return check_api_versions(read_frame(s), correlation_id, expected_apis)


class Outcome(NamedTuple):
    answers: list[bytes]  # response frames before the probe's
    closed: bool  # closed before the probe was answered

    @property
    def kind(self) -> str:
        return "closed" if self.closed else "answered" if self.answers else "silent"


def send_then_probe(port: int, data: bytes, request_correlation_id: int | None,
                    expected_apis: dict) -> Outcome:
    """Send ``data`` (whole frames) and then a good ApiVersions request on a new connection;
    read until the probe is answered or the connection closes."""
    probe = PROBE_CORRELATION_ID if request_correlation_id != PROBE_CORRELATION_ID \
        else PROBE_CORRELATION_ID + 1
    answers: list[bytes] = []
    with connect(port) as s:
        try:
            s.sendall(data + api_versions_request(probe))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: read what there is
        while True:
            try:
                frame = read_frame(s)
            except Closed:
                assert not answers, "answered a request, then closed instead of answering the probe"
                return Outcome([], True)
            if frame[:4] == struct.pack(">i", probe):
                check_api_versions(frame, probe, expected_apis)
                return Outcome(answers, False)
            answers.append(frame)
            assert len(answers) == 1, "more than one answer to one request"


def check_answer(outcome: Outcome, api_key: int, version: int, correlation_id: int, *,
                 silent_ok: bool = False) -> object | None:
    """The one answer of ``outcome`` is a well-formed response to (api_key, version,
    correlation_id) with only Kafka error codes, none of them UNKNOWN_SERVER_ERROR; returns
    the decoded body (None if there is none: closed, or silent where ``silent_ok``)."""
    if outcome.closed:
        return None
    if not outcome.answers:
        assert silent_ok, "request neither answered nor its connection closed (probe answered)"
        return None
    (payload,) = outcome.answers
    got_corr, body = decode_response(api_key, version, payload)
    assert got_corr == correlation_id, f"correlation id {got_corr}, sent {correlation_id}"
    codes = error_codes(body)
    assert set(codes) <= KAFKA_ERROR_CODES, f"not Kafka error codes: {set(codes) - KAFKA_ERROR_CODES}"
    assert ErrorCode.UNKNOWN_SERVER_ERROR not in codes, f"UNKNOWN_SERVER_ERROR answering {body}"
    return body


def hits_known_bug(payload: bytes) -> bool:
    """Whether the broker's parser reads ``payload`` as a request that runs into a bug some test
    below demonstrates on its own (kept out of the fuzzing so that it can find others)."""
    try:
        request = parse_request(payload)
    except (MalformedRequest, UnsupportedVersion):
        return False
    return _null_topic_name_below_v12(request.body)


def parses_as_silent_produce(payload: bytes) -> bool:
    """Whether the broker's own parser reads ``payload`` as a Produce request with acks=0 (which
    Kafka never answers)."""
    try:
        request = parse_request(payload)
    except (MalformedRequest, UnsupportedVersion):
        return False
    return request.api_key == ApiKey.PRODUCE and request.body.acks == 0


# ---------------------------------------------------------------------------------------------
# the broker, its data and a connection that lives through everything


class Live(NamedTuple):
    broker: BrokerProcess
    apis: dict[int, tuple[int, int]]  # what the broker advertises
    first_connection: socket.socket
    stored: dict[int, list]  # partition -> records read back with confluent-kafka
    end_offsets: dict[int, int]

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Live(port={self.broker.port})"


def list_end_offsets(port: int) -> dict[int, int]:
    """Latest offsets of ``TOPIC``'s partitions with a raw ListOffsets v1 request."""
    cls = request_class(ApiKey.LIST_OFFSETS, 1)
    part, topic = nested(cls, "topics", "partitions"), nested(cls, "topics")
    body = cls(replica_id=-1, topics=(topic(name=TOPIC, partitions=tuple(
        part(partition_index=p, timestamp=-1) for p in range(PARTITIONS))),))
    with connect(port) as s:
        s.sendall(framed(request_payload(body, 99)))
        corr, resp = decode_response(ApiKey.LIST_OFFSETS, 1, read_frame(s))
    assert corr == 99
    ((t,),) = (resp.topics,)
    assert all(int(p.error_code) == 0 for p in t.partitions), t
    return {p.partition_index: p.offset for p in t.partitions}


def read_stored(broker: BrokerProcess) -> dict[int, list]:
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bad-input-reader",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "check.crcs": True})
    try:
        c.assign([ck.TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        out: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"stalled reading {TOPIC}"
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == ck.KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            out[msg.partition()].append((msg.offset(), msg.key(), msg.value(), msg.headers(),
                                         msg.timestamp()))
        return out
    finally:
        c.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    ck = pytest.importorskip("confluent_kafka")
    broker = BrokerProcess(tmp_path_factory.mktemp("bad-input"), overrides={
        "socket.request.max.bytes": str(MAX_REQUEST), "num.partitions": str(PARTITIONS),
        "group.initial.rebalance.delay.ms": "0"}).start()
    try:
        first = connect(broker.port)
        apis = api_versions_on(first, 1, None)
        producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                                "enable.idempotence": True, "linger.ms": 5})
        for i in range(200):
            producer.produce(TOPIC, key=b"key-%d" % i, value=b"value-%d" % i * (i % 5 + 1),
                             headers=[("i", str(i).encode())], partition=i % PARTITIONS,
                             timestamp=1_700_000_000_000 + i)
        assert producer.flush(30) == 0
        producer.list_topics("unparseable-records", timeout=10)  # auto-creates it, empty
        del producer
        stored = read_stored(broker)
        ends = list_end_offsets(broker.port)
        assert ends == {p: 100 for p in range(PARTITIONS)}
        yield Live(broker, apis, first, stored, ends)
        first.close()
    finally:
        code = broker.stop()
    assert code == 0, broker.output()[-3000:]


def assert_still_serving(live: Live) -> None:
    """A separate, fresh connection gets the same ApiVersions answer as at the start."""
    with connect(live.broker.port) as s:
        api_versions_on(s, 4242, live.apis)


def advertised(live: Live, api_key: int, version: int) -> bool:
    lo, hi = live.apis.get(api_key, (1, 0))
    return lo <= version <= hi


def decodable(api_key: int, version: int) -> bool:
    known = kio_versions(api_key)
    return known is not None and known[0] <= version <= known[1]


# ---------------------------------------------------------------------------------------------
# framing


@FUZZ
@given(payload=st.one_of(
    st.binary(max_size=400),
    # a known api key and a plausible version, then anything
    st.tuples(st.sampled_from(sorted(KIO_API_KEYS)), st.integers(-2, 20), st.integers(-2**31, 2**31 - 1),
              st.binary(max_size=300))
    .map(lambda t: struct.pack(">hhi", *t[:3]) + t[3]),
    # an api key the broker serves, a well-formed client id (and header tagged fields where
    # flexible), then anything
    st.tuples(st.sampled_from(sorted(ADVERTISED_AT_IMPORT)), st.integers(0, 15),
              st.integers(-2**31, 2**31 - 1), st.binary(max_size=300))
    .map(lambda t: raw_header(*t[:3]) + t[3])))
def test_random_frames_are_answered_with_kafka_errors_or_close_only_their_connection(live, payload):
    if hits_known_bug(payload):
        reject()
    prefix = struct.unpack_from(">hhi", payload) if len(payload) >= 8 else None
    outcome = send_then_probe(live.broker.port, framed(payload), prefix and prefix[2], live.apis)
    event(outcome.kind)
    if prefix is None:
        assert outcome.closed, "a frame shorter than a request header was answered"
    else:
        api_key, version, corr = prefix
        if outcome.answers:
            assert decodable(api_key, version) or api_key == ApiKey.API_VERSIONS, \
                f"answered api key {api_key} v{version}, which it cannot decode"
            if api_key == ApiKey.API_VERSIONS and not advertised(live, api_key, version):
                body = check_answer(outcome, api_key, 0, corr)
                assert int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
            else:
                check_answer(outcome, api_key, version, corr)
        elif not outcome.closed:
            assert parses_as_silent_produce(payload), "neither answered nor closed"
    assert_still_serving(live)


# A valid request of each kind, to cut short.
def _sample_requests() -> list[bytes]:
    fetch = request_class(ApiKey.FETCH, 12)
    fetch_topic, fetch_part = nested(fetch, "topics"), nested(fetch, "topics", "partitions")
    metadata = request_class(ApiKey.METADATA, 12)
    batch = rec.build_batch([rec.SimpleRecord(b"v", b"k", (), 1_700_000_000_000)])
    return [
        api_versions_request(5),
        framed(request_payload(metadata(topics=(nested(metadata, "topics")(name=TOPIC, topic_id=None),),
                                        allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False), 6)),
        framed(request_payload(fetch(replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
                                     min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                                     session_id=0, session_epoch=-1, cluster_id=None, rack_id="",
                                     topics=(fetch_topic(topic=TOPIC, partitions=(fetch_part(
                                         partition=0, current_leader_epoch=-1, fetch_offset=0,
                                         last_fetched_epoch=-1, log_start_offset=-1,
                                         partition_max_bytes=1 << 20),)),),
                                     forgotten_topics_data=()), 7)),
        produce_request(9, 8, {0: batch}),
    ]


SAMPLE_REQUESTS = _sample_requests()


@FUZZ
@given(request=st.sampled_from(SAMPLE_REQUESTS), data=st.data(), half_close=st.booleans())
def test_truncated_frames_are_never_answered_and_do_not_disturb_the_broker(live, request, data, half_close):
    cut = data.draw(st.integers(1, len(request) - 1), label="bytes sent")
    with connect(live.broker.port) as s:
        s.sendall(request[:cut])
        if half_close:
            s.shutdown(socket.SHUT_WR)  # EOF in the middle of a frame: the broker closes too
            assert read_to_eof(s) == b"", "answered a frame it had not fully received"
    assert_still_serving(live)
    if request is SAMPLE_REQUESTS[-1]:  # the produce request: nothing appended
        assert list_end_offsets(live.broker.port) == live.end_offsets


@FUZZ
@given(size=st.one_of(st.integers(MAX_REQUEST + 1, 2**31 - 1), st.integers(-2**31, -1),
                      st.sampled_from([MAX_REQUEST + 1, -1, 2**31 - 1, -2**31])),
       tail=st.binary(max_size=64))
def test_length_prefixes_above_the_limit_or_negative_close_the_connection(live, size, tail):
    with connect(live.broker.port) as s:
        try:
            s.sendall(struct.pack(">i", size) + tail)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_to_eof(s) == b"", "answered a frame of an impossible size"
    assert_still_serving(live)


def test_a_frame_of_exactly_the_request_size_limit_is_served_and_one_byte_more_is_not(live):
    # Kafka ignores bytes after the request body, so pad a good ApiVersions v0 request.
    header = raw_header(ApiKey.API_VERSIONS, 0, 31)
    with connect(live.broker.port) as s:
        s.sendall(framed(header + b"\x00" * (MAX_REQUEST - len(header))))
        corr, body = decode_response(ApiKey.API_VERSIONS, 0, read_frame(s))
        assert (corr, int(body.error_code)) == (31, 0)
        try:  # the broker may close on the length prefix while the body is still being sent
            s.sendall(framed(header + b"\x00" * (MAX_REQUEST + 1 - len(header))))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_to_eof(s) == b""
    assert_still_serving(live)


# ---------------------------------------------------------------------------------------------
# api keys and versions


@FUZZ
@given(api_key=st.integers(-2**15, 2**15 - 1), version=st.integers(-2**15, 2**15 - 1),
       corr=st.integers(-2**31, 2**31 - 1), body=st.binary(max_size=100))
def test_api_keys_the_broker_does_not_advertise_are_refused(live, api_key, version, corr, body):
    assume(api_key not in live.apis)
    outcome = send_then_probe(live.broker.port, framed(raw_header(api_key, version, corr) + body),
                              corr, live.apis)
    event(outcome.kind)
    if not decodable(api_key, version):
        assert outcome.closed, f"answered unknown api key {api_key} v{version}"
    else:  # a Kafka API that parses but has no handler: UNSUPPORTED_VERSION everywhere, or close
        answer = check_answer(outcome, api_key, version, corr)
        if answer is not None:
            assert set(error_codes(answer)) <= {ErrorCode.UNSUPPORTED_VERSION}
    assert_still_serving(live)


@st.composite
def unsupported_versions(draw):
    """(api key, version): an advertised key at a version it does not accept -- outside its
    range, or Produce v0-2 (advertised for librdkafka's sake, refused like Kafka 4 does)."""
    api_key = draw(st.sampled_from(sorted(ADVERTISED_AT_IMPORT)))
    lo, hi = ADVERTISED_AT_IMPORT[api_key]
    if api_key == ApiKey.PRODUCE and draw(st.booleans()):
        return api_key, draw(st.integers(0, 2))
    version = draw(st.one_of(st.integers(-2**15, lo - 1), st.integers(hi + 1, 2**15 - 1),
                             st.sampled_from([lo - 1, hi + 1, 99])))
    return api_key, version


@FUZZ
@given(kv=unsupported_versions(), corr=st.integers(-2**31, 2**31 - 1),
       body=st.one_of(st.just(b""), st.binary(max_size=100)))
@example(kv=(ApiKey.FETCH, 99), corr=1, body=b"")
@example(kv=(ApiKey.PRODUCE, 0), corr=2, body=b"")
@example(kv=(ApiKey.PRODUCE, 2), corr=3, body=b"\x00" * 20)
@example(kv=(ApiKey.API_VERSIONS, 4), corr=4, body=b"")
@example(kv=(ApiKey.API_VERSIONS, -1), corr=5, body=b"")
def test_unsupported_versions_close_the_connection_except_api_versions_which_gets_error_35(
        live, kv, corr, body):
    api_key, version = kv
    if advertised(live, api_key, version) and decodable(api_key, version):
        reject()  # the live broker accepts it
    outcome = send_then_probe(live.broker.port, framed(raw_header(api_key, version, corr) + body),
                              corr, live.apis)
    event(outcome.kind)
    if api_key == ApiKey.API_VERSIONS:
        assert not outcome.closed, "unsupported ApiVersions version: no v0 fallback answer"
        body_v0 = check_answer(outcome, ApiKey.API_VERSIONS, 0, corr)
        assert int(body_v0.error_code) == ErrorCode.UNSUPPORTED_VERSION
        entries = {int(k.api_key): (int(k.min_version), int(k.max_version))
                   for k in body_v0.api_keys}
        assert entries[ApiKey.API_VERSIONS] == live.apis[ApiKey.API_VERSIONS]
    else:
        assert outcome.closed, f"answered {ApiKey(api_key).name} v{version}"
    assert_still_serving(live)


# ---------------------------------------------------------------------------------------------
# malformed bodies behind valid headers


BODY_APIS = [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.LIST_OFFSETS,
             ApiKey.API_VERSIONS, ApiKey.CREATE_TOPICS, ApiKey.FIND_COORDINATOR,
             ApiKey.OFFSET_FETCH, ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS]


def _body_targets() -> list[tuple[int, int]]:
    from strata.protocol.codec import API_VERSIONS
    return [(k, v) for k in BODY_APIS for v in range(API_VERSIONS[k][0], API_VERSIONS[k][1] + 1)
            if decodable(k, v)]


BODY_TARGETS = _body_targets()


def _valid_body(api_key: int, version: int) -> bytes:
    """A small, valid body for (api_key, version), about nothing that exists."""
    cls = request_class(api_key, version)
    return request_payload(_minimal(cls), 0)[len(raw_header(api_key, version, 0, b"bad-input")):]


def _minimal(cls: type):
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        tp = f.type
        optional = typing.get_origin(tp) in (types.UnionType, typing.Union)
        if optional:
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        kind = f.metadata.get("kafka_type")
        if typing.get_origin(tp) is tuple:
            elem = typing.get_args(tp)[0]
            kwargs[f.name] = (_minimal(elem),) if dataclasses.is_dataclass(elem) else ()
        elif dataclasses.is_dataclass(tp):
            kwargs[f.name] = _minimal(tp)
        elif kind == "string":
            kwargs[f.name] = "no-such-thing"
        elif kind in ("bytes", "records"):
            kwargs[f.name] = None if optional else b""
        elif kind == "bool":
            kwargs[f.name] = False
        elif kind == "uuid":
            import uuid
            kwargs[f.name] = uuid.UUID(int=0)
        elif kind in ("timedelta_i32", "timedelta_i64"):
            kwargs[f.name] = datetime.timedelta(milliseconds=10)
        elif kind == "datetime_i64":
            kwargs[f.name] = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
        elif kind == "float64":
            kwargs[f.name] = 0.0
        else:
            kwargs[f.name] = 1
    return cls(**kwargs)


@FUZZ
@given(kv=st.sampled_from(BODY_TARGETS), corr=st.integers(-2**31, 2**31 - 1), data=st.data(),
       mode=st.sampled_from(["random", "truncated", "extended", "mutated"]))
def test_malformed_bodies_behind_valid_headers_get_kafka_errors_or_a_closed_connection(
        live, kv, corr, data, mode):
    api_key, version = kv
    valid = _valid_body(api_key, version)
    if mode == "random":
        body = data.draw(st.binary(max_size=200), label="body")
    elif mode == "truncated":
        body = valid[:data.draw(st.integers(0, max(len(valid) - 1, 0)), label="cut")]
    elif mode == "extended":  # trailing garbage: ignored, like Kafka
        body = valid + data.draw(st.binary(min_size=1, max_size=50), label="tail")
    else:
        if api_key == ApiKey.CREATE_TOPICS:
            reject()  # a flipped partition count could legitimately ask for millions
        mutated = bytearray(valid)
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            if not mutated:
                break
            i = data.draw(st.integers(0, len(mutated) - 1), label="at")
            mutated[i] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]), label="byte")
        body = bytes(mutated)
    payload = raw_header(api_key, version, corr, b"bad-input") + body
    if hits_known_bug(payload):
        reject()
    outcome = send_then_probe(live.broker.port, framed(payload), corr, live.apis)
    event(outcome.kind)
    if mode == "extended":
        assert not outcome.closed, "trailing bytes after a valid body closed the connection"
    check_answer(outcome, api_key, version, corr, silent_ok=parses_as_silent_produce(payload))
    assert_still_serving(live)


# Requests that parse, with arbitrary field values. Left out: group membership (a JoinGroup may
# legitimately wait its arbitrary rebalance timeout, as in Kafka) and admin requests that change
# things (arbitrary broker configs, partition counts or deletions would be obeyed).
ARBITRARY_APIS = [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.LIST_OFFSETS,
                  ApiKey.API_VERSIONS, ApiKey.FIND_COORDINATOR, ApiKey.OFFSET_FETCH,
                  ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS, ApiKey.INIT_PRODUCER_ID,
                  ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.DESCRIBE_CONFIGS, ApiKey.DESCRIBE_CLUSTER]


def _arbitrary_request(kv):
    api_key, version = kv
    body = st.from_type(request_class(api_key, version))
    if api_key == ApiKey.FETCH:  # do not let it long-poll for an arbitrary time
        body = body.map(lambda b: dataclasses.replace(
            b, max_wait=datetime.timedelta(milliseconds=min(abs(b.max_wait.total_seconds()), 0.05) * 1000)))
    return body


ARBITRARY_TARGETS = [(k, v) for k in ARBITRARY_APIS if k in ADVERTISED_AT_IMPORT
                     for v in range(ADVERTISED_AT_IMPORT[k][0], ADVERTISED_AT_IMPORT[k][1] + 1)
                     if decodable(k, v)]


@FUZZ
@given(body=st.sampled_from(ARBITRARY_TARGETS).flatmap(_arbitrary_request),
       corr=st.integers(-2**31, 2**31 - 1))
def test_well_formed_requests_with_arbitrary_field_values_get_kafka_error_codes(live, body, corr):
    try:
        payload = request_payload(body, corr)
    except (UnicodeEncodeError, struct.error, OverflowError, ValueError):
        reject()
    try:
        parse_request(payload)
    except MalformedRequest:
        reject()  # kio writes some values it cannot read back (e.g. huge timedeltas)
    if hits_known_bug(payload):
        reject()
    outcome = send_then_probe(live.broker.port, framed(payload), corr, live.apis)
    event(outcome.kind)
    silent = body.__api_key__ == ApiKey.PRODUCE and body.acks == 0
    assert not outcome.closed, "a request that parses closed the connection"
    answer = check_answer(outcome, body.__api_key__, body.__version__, corr, silent_ok=silent)
    if silent:
        assert answer is None, "answered a Produce request with acks=0"
    else:
        event(f"{ApiKey(body.__api_key__).name} error codes {sorted(set(error_codes(answer)))}")
    assert_still_serving(live)


def _null_topic_name_below_v12(body) -> bool:
    return (body.__api_key__ == ApiKey.METADATA and body.__version__ < 12
            and any(t.name is None for t in body.topics or ()))


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_and_v11_naming_a_topic_without_a_name_is_an_invalid_request(tmp_path, version):
    # v10 added topic ids to the request (so the name became nullable on the wire) but only v12
    # lets the broker look topics up by id; Kafka refuses a null name below v12 with
    # INVALID_REQUEST, reporting the topic with the name "" (getErrorResponse). A broker of its
    # own, so that the module's broker log stays free of this bug's tracebacks.
    cls = request_class(ApiKey.METADATA, version)
    body = cls(topics=(nested(cls, "topics")(name=None, topic_id=None),),
               allow_auto_topic_creation=True, include_topic_authorized_operations=False,
               **({"include_cluster_authorized_operations": False} if version < 11 else {}))
    with BrokerProcess(tmp_path) as broker:
        with connect(broker.port) as s:
            apis = api_versions_on(s, 1, None)
        outcome = send_then_probe(broker.port, framed(request_payload(body, 17)), 17, apis)
        assert not outcome.closed, "closed the connection instead of answering"
        answer = check_answer(outcome, ApiKey.METADATA, version, 17)
        assert [(t.name, int(t.error_code)) for t in answer.topics] == \
            [("", ErrorCode.INVALID_REQUEST)]


@pytest.mark.parametrize("api_key, version, body", [
    (ApiKey.DESCRIBE_GROUPS, 5, b"\x00\x00\x00"),  # groups: compact null; flag; no tags
    (ApiKey.DESCRIBE_GROUPS, 0, struct.pack(">i", -1)),  # groups: null
    (ApiKey.PRODUCE, 3, struct.pack(">hhii", -1, 1, 1000, -1)),  # topic_data: null
    (ApiKey.LIST_OFFSETS, 1, struct.pack(">ii", -1, -1)),  # topics: null
], ids=["describe-groups-v5", "describe-groups-v0", "produce-v3", "list-offsets-v1"])
def test_a_null_where_the_schema_has_a_non_nullable_array_closes_the_connection(
        live, api_key, version, body):
    # Kafka's generated readers refuse it ("non-nullable field ... was serialized as null"): a
    # request that cannot be parsed, so the connection closes -- and nothing fails inside.
    mark = len(live.broker.output())
    outcome = send_then_probe(live.broker.port, framed(raw_header(api_key, version, 3) + body), 3,
                              live.apis)
    assert outcome.closed
    assert_still_serving(live)
    errors = [line for line in live.broker.output()[mark:].splitlines() if " ERROR " in line]
    assert not errors, errors


# ---------------------------------------------------------------------------------------------
# produce requests with corrupt record batches: an error code, and nothing appended


@st.composite
def corrupt_batches(draw) -> tuple[str, bytes]:
    records = draw(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40)),
                            min_size=1, max_size=5))
    codec = draw(st.sampled_from([rec.Compression.NONE, rec.Compression.GZIP, rec.Compression.LZ4]))
    batch = bytearray(rec.build_batch([rec.SimpleRecord(v, k, (), 1_700_000_000_000)
                                       for k, v in records], compression=codec))
    how = draw(st.sampled_from(["crc-field", "covered-byte", "truncated", "magic", "length-longer",
                                "length-shorter", "second-batch-corrupt"]))
    if how == "crc-field":
        i = draw(st.integers(rec.CRC_OFFSET, rec.CRC_OFFSET + 3))
        batch[i] ^= draw(st.integers(1, 255))
    elif how == "covered-byte":  # anything the CRC covers: attributes, header fields, records
        i = draw(st.integers(rec.ATTRIBUTES_OFFSET, len(batch) - 1))
        batch[i] ^= draw(st.integers(1, 255))
    elif how == "truncated":
        del batch[draw(st.integers(1, len(batch) - 1)):]
    elif how == "magic":
        batch[rec.MAGIC_OFFSET] = draw(st.integers(0, 255).filter(lambda m: m != rec.CURRENT_MAGIC))
    elif how in ("length-longer", "length-shorter"):
        (length,) = struct.unpack_from(">i", batch, 8)
        delta = draw(st.integers(1, 2**31 - 1 - length)) if how == "length-longer" \
            else -draw(st.integers(1, length + 2**31))
        struct.pack_into(">i", batch, 8, length + delta)
    else:  # a good batch, then a corrupt one: the good one must not be appended either
        second = bytearray(batch)
        second[draw(st.integers(rec.ATTRIBUTES_OFFSET, len(second) - 1))] ^= 0xFF
        batch += second
    return how, bytes(batch)


@FUZZ
@given(version=st.integers(3, 11), acks=st.sampled_from([-1, 1]),
       partition=st.integers(0, PARTITIONS - 1), corrupt=corrupt_batches(),
       corr=st.integers(0, 2**31 - 1))
def test_produce_with_corrupt_record_batches_is_refused_and_appends_nothing(
        live, version, acks, partition, corrupt, corr):
    how, data = corrupt
    outcome = send_then_probe(live.broker.port,
                              produce_request(version, corr, {partition: data}, acks), corr,
                              live.apis)
    event(outcome.kind)
    assert not outcome.closed, f"{how}: closed instead of answering"
    body = check_answer(outcome, ApiKey.PRODUCE, version, corr)
    ((topic,),) = (body.responses,)
    ((part,),) = (topic.partition_responses,)
    assert (topic.name, part.index) == (TOPIC, partition)
    expected = set(CORRUPT_RECORDS)
    if len(data) > rec.ATTRIBUTES_OFFSET + 1:
        # Like Kafka (ProduceRequest.validateRecords) the codec is checked before the CRC: a flip
        # that lands in the compression bits may make it one this version cannot carry.
        codec = data[rec.ATTRIBUTES_OFFSET + 1] & rec.COMPRESSION_MASK
        if codec > rec.Compression.ZSTD or (codec == rec.Compression.ZSTD and version < 7):
            expected.add(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
    assert int(part.error_code) in expected, f"{how}: error {part.error_code!r}"
    assert part.base_offset == -1
    assert list_end_offsets(live.broker.port) == live.end_offsets, f"{how}: appended"
    assert_still_serving(live)


def _batch_around(payload: bytes, record_count: int, codec: int = rec.Compression.NONE) -> bytes:
    """A batch header with a correct CRC around ``payload`` as its records section."""
    return rec._assemble(payload, base_offset=0, partition_leader_epoch=-1, attributes=codec,
                         last_offset_delta=record_count - 1, base_timestamp=1_700_000_000_000,
                         max_timestamp=1_700_000_000_000, producer_id=-1, producer_epoch=-1,
                         base_sequence=-1, record_count=record_count)


_ONE_RECORD = rec.build_batch([rec.SimpleRecord(b"v", b"k", (), 1_700_000_000_000)])[rec.HEADER_SIZE:]


@pytest.mark.parametrize("batch", [
    _batch_around(b"\xde\xad\xbe\xef" * 4, 1),  # records section is not a record
    _batch_around(b"", 1),  # one record declared, none there
    _batch_around(_ONE_RECORD, 2),  # two declared, one there
    _batch_around(_ONE_RECORD + b"\x00\x01", 1),  # bytes left over after the last record
    _batch_around(b"not gzip data", 1, rec.Compression.GZIP),  # does not decompress
], ids=["garbage", "missing-record", "fewer-records", "leftover-bytes", "bad-gzip"])
def test_produce_of_batches_whose_records_do_not_parse_is_refused_although_the_crc_matches(live, batch):
    # Kafka's LogValidator iterates (and decompresses) every record of a produced batch and
    # refuses one that does not parse with INVALID_RECORD / CORRUPT_MESSAGE; a CRC only proves
    # the bytes arrived as the producer sent them. Appended, such a batch stalls consumers.
    topic = "unparseable-records"
    outcome = send_then_probe(live.broker.port,
                              produce_request(9, 23, {0: batch}, topic=topic), 23, live.apis)
    body = check_answer(outcome, ApiKey.PRODUCE, 9, 23)
    assert body is not None, "closed instead of answering"
    part = body.responses[0].partition_responses[0]
    if int(part.error_code) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        pytest.fail("topic not created (the module fixture's producer should have)")  # pragma: no cover
    assert int(part.error_code) in CORRUPT_RECORDS, \
        f"appended at offset {part.base_offset} (error {part.error_code!r})"


# ---------------------------------------------------------------------------------------------
# afterwards (keep these last: they check what everything above left behind)


def test_after_all_bad_input_the_first_connection_still_works(live):
    api_versions_on(live.first_connection, 2, live.apis)
    api_versions_on(live.first_connection, 3, live.apis)


def test_after_all_bad_input_the_stored_records_and_end_offsets_are_unchanged(live):
    assert list_end_offsets(live.broker.port) == live.end_offsets
    assert read_stored(live.broker) == live.stored


def test_the_broker_logged_no_internal_errors_while_fed_bad_input(live):
    bad = live.broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad[:20])
