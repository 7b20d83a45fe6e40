"""Client quotas: the config store (AlterClientQuotas / DescribeClientQuotas rules, persistence),
the quota manager against a manual clock (precedence, Kafka's windows and throttle formula,
controller mutation token bucket), the enforcement the Dispatcher runs every request through,
and the connection's mute after a throttled response."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import math

import pytest

from strata.cluster.client_quotas import (
    CLIENT_ID, MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED, USER, ClientQuotaStore)
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import (
    API_VERSIONS, ApiKey, make, parse_request, request_class, response_class)
from strata.protocol.codec import api_versions_response
from strata.server import quotas as quotas_module
from strata.server.context import BrokerContext
from strata.server.dispatch import Dispatcher
from strata.server.metrics import ClientQuotaCollector
from strata.server.network import ConnectionInfo, KafkaServer
from strata.server.quotas import ANONYMOUS, ClientQuotaManager, QuotaType
from wire import client_frame
from support.metadata_stand_in import no_metadata

PRODUCE, FETCH, REQUEST, MUTATION = (QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST,
                                     QuotaType.CONTROLLER_MUTATION)


def alter(store, *entries, validate_only=False):
    """entries: (entity dict, {key: value or None})."""
    return store.alter([(list(entity.items()), list(ops.items())) for entity, ops in entries],
                       validate_only)


def manager_with(*entries, clock=None) -> tuple[ClientQuotaManager, ClientQuotaStore]:
    store = ClientQuotaStore()
    m = ClientQuotaManager(clock=clock or MockClock())
    store.add_listener(m.on_quotas_changed)
    assert all(code == ErrorCode.NONE for code, _ in alter(store, *entries))
    return m, store


# ---- the config store ------------------------------------------------------------------------

def test_altered_quotas_are_described_by_exact_default_and_specified_filters():
    store = ClientQuotaStore()
    assert alter(store,
                 ({CLIENT_ID: "app"}, {"producer_byte_rate": 1048576}),
                 ({CLIENT_ID: None}, {"consumer_byte_rate": 2048}),
                 ({USER: "alice", CLIENT_ID: "app"}, {"request_percentage": 50.5}),
                 ({USER: None}, {"controller_mutation_rate": 10})) == [(ErrorCode.NONE, None)] * 4

    def names(components, strict=False):
        return sorted((e for e, _ in store.describe(components, strict)), key=repr)

    found = store.describe([(CLIENT_ID, MATCH_EXACT, "app")], strict=True)
    assert [(dict(e), dict(v)) for e, v in found] == [({CLIENT_ID: "app"},
                                                      {"producer_byte_rate": 1048576.0})]
    assert len(names([(CLIENT_ID, MATCH_EXACT, "app")])) == 2          # not strict: alice's too
    assert names([(CLIENT_ID, MATCH_DEFAULT, None)], strict=True) == [((CLIENT_ID, None),)]
    assert names([(USER, MATCH_SPECIFIED, None)]) == [
        ((CLIENT_ID, "app"), (USER, "alice")), ((USER, None),)]
    assert names([(USER, MATCH_SPECIFIED, None)], strict=True) == [((USER, None),)]
    assert len(names([])) == 4 and names([], strict=True) == []


@pytest.mark.parametrize("entity, ops, message", [
    ({CLIENT_ID: "c"}, {"producer_byte_rat": 1}, "Invalid configuration key producer_byte_rat"),
    ({CLIENT_ID: "c"}, {"producer_byte_rate": 0}, "Quota producer_byte_rate must be greater than 0"),
    ({CLIENT_ID: "c"}, {"consumer_byte_rate": 10.5}, "consumer_byte_rate cannot be a fractional value."),
    ({CLIENT_ID: "c"}, {"producer_byte_rate": 1e19},
     "Proposed value for producer_byte_rate is too large for a LONG."),
    ({"group": "g"}, {"producer_byte_rate": 1}, "Unhandled client quota entity type: group"),
    ({}, {"producer_byte_rate": 1}, "Invalid empty client quota entity"),
    ({USER: ""}, {"producer_byte_rate": 1}, "Empty user not supported"),
    ({"ip": "127.0.0.1", USER: "u"}, {"connection_creation_rate": 1},
     "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"),
    ({"ip": "127.0.0.1"}, {"producer_byte_rate": 1}, "Invalid configuration key producer_byte_rate"),
])
def test_an_invalid_alteration_is_invalid_request_with_kafkas_message_and_changes_nothing(
        entity, ops, message):
    store = ClientQuotaStore()
    assert alter(store, (entity, ops), ({CLIENT_ID: "ok"}, {"producer_byte_rate": 5})) == [
        (ErrorCode.INVALID_REQUEST, message), (ErrorCode.NONE, None)]
    assert [dict(e) for e in store.snapshot()] == [{CLIENT_ID: "ok"}]


def test_a_repeated_entity_and_validate_only_change_nothing_and_remove_drops_the_entity():
    store = ClientQuotaStore()
    assert alter(store, ({CLIENT_ID: "c"}, {"producer_byte_rate": 5}),
                 ({CLIENT_ID: "c"}, {"producer_byte_rate": 6}))[1][0] == ErrorCode.INVALID_REQUEST
    assert dict(store.snapshot()[((CLIENT_ID, "c"),)]) == {"producer_byte_rate": 5.0}
    assert alter(store, ({CLIENT_ID: "c"}, {"producer_byte_rate": 7}), validate_only=True) == [
        (ErrorCode.NONE, None)]
    assert dict(store.snapshot()[((CLIENT_ID, "c"),)]) == {"producer_byte_rate": 5.0}
    alter(store, ({CLIENT_ID: "c"}, {"producer_byte_rate": None}))
    assert dict(store.snapshot()) == {}


@pytest.mark.parametrize("components, code, message", [
    ([("", MATCH_EXACT, "x")], ErrorCode.INVALID_REQUEST, "Invalid empty entity type."),
    ([(USER, MATCH_EXACT, None)], ErrorCode.INVALID_REQUEST,
     "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([(USER, MATCH_DEFAULT, "x")], ErrorCode.INVALID_REQUEST,
     "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([(USER, 7, None)], ErrorCode.INVALID_REQUEST, "Unknown match type 7"),
    ([(USER, MATCH_SPECIFIED, None), (USER, MATCH_DEFAULT, None)], ErrorCode.INVALID_REQUEST,
     "Entity type user cannot appear more than once in the filter."),
    ([("group", MATCH_SPECIFIED, None)], ErrorCode.UNSUPPORTED_VERSION, "Unsupported entity type group"),
])
def test_a_bad_describe_filter_is_refused_with_kafkas_error(components, code, message):
    with pytest.raises(KafkaError) as err:
        ClientQuotaStore().describe(components, False)
    assert (err.value.code, str(err.value)) == (code, message)


def test_quotas_survive_reopening_the_store(tmp_path):
    store = ClientQuotaStore(tmp_path)
    alter(store, ({USER: None, CLIENT_ID: "app"}, {"producer_byte_rate": 1024,
                                                   "request_percentage": 12.5}))
    reopened = ClientQuotaStore(tmp_path)
    assert {e: dict(v) for e, v in reopened.snapshot().items()} == {
        ((CLIENT_ID, "app"), (USER, None)): {"producer_byte_rate": 1024.0,
                                             "request_percentage": 12.5}}


# ---- which quota applies ---------------------------------------------------------------------

LEVELS = [  # Kafka's precedence, highest first
    {USER: ANONYMOUS, CLIENT_ID: "app"},
    {USER: ANONYMOUS, CLIENT_ID: None},
    {USER: ANONYMOUS},
    {USER: None, CLIENT_ID: "app"},
    {USER: None, CLIENT_ID: None},
    {USER: None},
    {CLIENT_ID: "app"},
    {CLIENT_ID: None},
]


def test_the_most_specific_configured_entity_wins_in_kafkas_order():
    m, store = manager_with(*[(e, {"producer_byte_rate": 1000 + i}) for i, e in enumerate(LEVELS)])
    for i, entity in enumerate(LEVELS):
        assert m.quota(PRODUCE, ANONYMOUS, "app") == 1000 + i
        alter(store, (entity, {"producer_byte_rate": None}))
    assert m.quota(PRODUCE, ANONYMOUS, "app") is None
    assert not m.enabled(PRODUCE)


def test_each_quota_type_looks_only_at_entities_that_set_its_key():
    m, _ = manager_with(({USER: ANONYMOUS}, {"consumer_byte_rate": 10}),
                        ({CLIENT_ID: "app"}, {"producer_byte_rate": 20}))
    assert m.quota(PRODUCE, ANONYMOUS, "app") == 20
    assert m.quota(FETCH, ANONYMOUS, "app") == 10
    assert m.quota(REQUEST, ANONYMOUS, "app") is None


def test_a_user_quota_is_shared_by_its_clients_and_a_default_client_quota_is_per_client():
    m, _ = manager_with(({USER: None}, {"producer_byte_rate": 100}))
    assert m.metric_tags(PRODUCE, ANONYMOUS, "a") == m.metric_tags(PRODUCE, ANONYMOUS, "b") == (
        ANONYMOUS, "")
    m, _ = manager_with(({CLIENT_ID: None}, {"producer_byte_rate": 100}))
    assert m.metric_tags(PRODUCE, ANONYMOUS, "a") == ("", "a")
    assert m.metric_tags(PRODUCE, ANONYMOUS, "b") == ("", "b")


# ---- windows and throttle time ---------------------------------------------------------------

def test_throttle_time_is_kafkas_excess_over_bound_times_the_window():
    clock = MockClock()
    m, _ = manager_with(({CLIENT_ID: "app"}, {"producer_byte_rate": 1000}), clock=clock)
    # a new sensor divides by (11 - 1) windows of 1 s: 10,000 bytes are exactly the quota
    assert m.record(PRODUCE, ANONYMOUS, "app", 10_000) == 0
    # 20,000 bytes over 10 s = 2,000 B/s: (2000 - 1000) / 1000 × 10,000 ms
    assert m.record(PRODUCE, ANONYMOUS, "app", 10_000) == 10_000
    clock.advance_ms(5_000)
    # 20,000 + 1 bytes over 10 s still (5 full windows of the 10 counted as elapsed)
    assert m.record(PRODUCE, ANONYMOUS, "app", 1) == 10_001
    clock.advance_ms(5_999)
    # 10.999 s since the first window began, 10 full windows: divided by the time itself
    assert m.record(PRODUCE, ANONYMOUS, "app", 0) == round((20_001 / 10.999 - 1000) / 1000 * 10_999)
    clock.advance_ms(1)        # the first window is 11 windows old: dropped, 1 byte is left
    assert m.record(PRODUCE, ANONYMOUS, "app", 0) == 0


def test_a_fetch_is_capped_at_what_the_quota_window_admits():
    m, _ = manager_with(({CLIENT_ID: None}, {"consumer_byte_rate": 1000}))
    assert m.max_value_in_window(FETCH, ANONYMOUS, "any") == 10_000
    assert m.max_value_in_window(PRODUCE, ANONYMOUS, "any") == math.inf


def test_the_controller_mutation_bucket_refuses_once_below_zero_and_refills_at_the_rate():
    clock = MockClock()
    m, _ = manager_with(({CLIENT_ID: "admin"}, {"controller_mutation_rate": 2}), clock=clock)
    strict = m.new_mutation_quota(ANONYMOUS, "admin", strict=True)
    strict.apply(lambda: None, lambda _: 30)       # burst 11 × 2 = 22 tokens: now -8
    assert strict.throttle_time_ms() == 0          # strict: the mutation that went below passes
    with pytest.raises(KafkaError) as err:
        strict.apply(lambda: pytest.fail("must not run"), lambda _: 1)
    assert err.value.code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert str(err.value) == "The throttling quota has been exceeded."
    assert strict.throttle_time_ms() == 4_000      # 8 tokens at 2 a second
    clock.advance_ms(1_000)
    assert strict.throttle_time_ms() == 3_000
    clock.advance_ms(3_000)
    strict.apply(lambda: None, lambda _: 1)        # back at zero: allowed again
    permissive = m.new_mutation_quota(ANONYMOUS, "admin", strict=False)
    permissive.apply(lambda: None, lambda _: 5)    # never refused, throttled instead
    assert permissive.throttle_time_ms() == 3_000  # -6 tokens at 2 a second


# ---- enforcement through the Dispatcher ------------------------------------------------------

def dispatch(ctx, conn, api, version, client_id="app", **fields):
    body = make(request_class(api, version), **fields)
    request = parse_request(client_frame(body, correlation_id=7, client_id=client_id))
    return asyncio.run(Dispatcher(ctx).__call__(request, conn))


def context(m=None, store=None, metadata=None) -> BrokerContext:
    return BrokerContext(node_id=1, advertised_host="h", advertised_port=9092,
                         metadata=no_metadata() if metadata is None else metadata,
                         replica_manager=None, client_quotas=store or ClientQuotaStore(), quotas=m)


@pytest.mark.parametrize("version", range(API_VERSIONS[ApiKey.ALTER_CLIENT_QUOTAS][1] + 1))
def test_alter_and_describe_client_quotas_round_trip_in_every_version(version):
    ctx = context()
    conn = ConnectionInfo("127.0.0.1:1", 1)
    A, D = ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.DESCRIBE_CLIENT_QUOTAS

    def entry(name, key, value, remove=False):
        return make(request_class(A, version), "entries",
                    entity=(make(request_class(A, version), "entries.entity",
                                 entity_type="client-id", entity_name=name),),
                    ops=(make(request_class(A, version), "entries.ops", key=key, value=value,
                              remove=remove),))
    r = dispatch(ctx, conn, A, version, entries=(entry("app", "producer_byte_rate", 1048576.0),
                                                  entry(None, "bogus", 1.0)), validate_only=False)
    assert [(e.error_code, e.error_message, e.entity[0].entity_name) for e in r.entries] == [
        (ErrorCode.NONE, None, "app"),
        (ErrorCode.INVALID_REQUEST, "Invalid configuration key bogus", None)]
    comp = make(request_class(D, version), "components", entity_type="client-id", match_type=0,
                match="app")
    r = dispatch(ctx, conn, D, version, components=(comp,), strict=True)
    assert r.error_code == ErrorCode.NONE
    assert [[(v.key, v.value) for v in e.values] for e in r.entries] == [
        [("producer_byte_rate", 1048576.0)]]
    bad = make(request_class(D, version), "components", entity_type="client-id", match_type=1,
               match="app")
    r = dispatch(ctx, conn, D, version, components=(bad,), strict=False)
    assert (r.error_code, r.entries) == (ErrorCode.INVALID_REQUEST, None)
    assert r.error_message == "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."


def test_an_over_quota_produce_is_answered_with_throttle_time_and_the_connection_told_to_mute():
    m, store = manager_with(({CLIENT_ID: "app"}, {"producer_byte_rate": 100}))
    conn = ConnectionInfo("127.0.0.1:1", 1)
    conn.request_size = 5_000     # 5,000 bytes over 10 s = 500 B/s: 4 × 10 s over

    async def produce(ctx, request):
        return make(response_class(request.api_key, request.api_version), responses=())
    ctx = context(m, store)
    request = parse_request(client_frame(make(request_class(ApiKey.PRODUCE, 9), acks=1,
                                              timeout_ms=1000, topic_data=(),
                                              transactional_id=None), client_id="app"))
    r = asyncio.run(m.enforce(request, conn, lambda req: produce(ctx, req)))
    assert r.throttle_time == datetime.timedelta(milliseconds=40_000)
    assert conn.throttle_ms == 40_000
    other = ConnectionInfo("127.0.0.1:2", 2)
    other.request_size = 5_000
    r = asyncio.run(m.enforce(dataclasses.replace(request, client_id="other"), other,
                              lambda req: produce(ctx, req)))
    assert r.throttle_time == datetime.timedelta(0) and other.throttle_ms == 0


def fetch_response(version, records: bytes):
    rc = response_class(ApiKey.FETCH, version)
    part = make(rc, "responses.partitions", partition_index=0, high_watermark=10,
                last_stable_offset=10, log_start_offset=0, records=records,
                preferred_read_replica=-1)
    return make(rc, session_id=0, responses=(make(rc, "responses", topic="t", partitions=(part,)),))


def test_a_throttled_fetch_answers_no_data_and_its_bytes_do_not_count():
    m, store = manager_with(({CLIENT_ID: "app"}, {"consumer_byte_rate": 100}))
    conn = ConnectionInfo("127.0.0.1:1", 1)
    version = 11
    request = parse_request(client_frame(make(
        request_class(ApiKey.FETCH, version), replica_id=-1, max_wait_ms=0, min_bytes=1,
        max_bytes=50_000_000, isolation_level=0, session_id=0, session_epoch=-1, topics=(),
        forgotten_topics_data=(), rack_id=""), client_id="app"))
    seen = []

    async def fetch(req):
        seen.append(req.body.max_bytes)
        return fetch_response(version, b"x" * 800)
    r = asyncio.run(m.enforce(request, conn, fetch))
    assert seen == [1_000]                 # capped at 100 B/s × 10 s
    assert r.responses[0].partitions[0].records == b"x" * 800 and conn.throttle_ms == 0
    r = asyncio.run(m.enforce(request, conn, fetch))
    # 1,600 bytes over 10 s = 160 B/s: (160 - 100) / 100 × 10 s
    assert r.responses == () and r.throttle_time == datetime.timedelta(seconds=6)
    assert conn.throttle_ms == 6_000
    rate = m.sensors(FETCH, ("", "app")).rate
    assert rate.total(m.now_ms()) == 800   # the throttled response's bytes were un-recorded


def fetch_as(replica_id: int, version: int = 11, session_id: int = 0):
    return parse_request(client_frame(make(
        request_class(ApiKey.FETCH, version), replica_id=replica_id, max_wait_ms=0, min_bytes=1,
        max_bytes=50_000_000, isolation_level=0, session_id=session_id, session_epoch=1,
        topics=(), forgotten_topics_data=(), rack_id=""), client_id="app"))


def test_a_followers_fetch_is_exempt_from_client_quotas_as_in_kafka():
    """A default consumer_byte_rate must not throttle replication (KIP-73 throttles it)."""
    m, _ = manager_with(({CLIENT_ID: "app"}, {"consumer_byte_rate": 100}))
    conn = ConnectionInfo("127.0.0.1:1", 1)
    seen = []

    async def fetch(req):
        seen.append(req.body.max_bytes)
        return fetch_response(11, b"x" * 5_000)
    for _ in range(3):
        r = asyncio.run(m.enforce(fetch_as(replica_id=2), conn, fetch))
        assert r.responses[0].partitions[0].records == b"x" * 5_000
    assert seen == [50_000_000] * 3 and conn.throttle_ms == 0


def test_a_throttled_fetch_keeps_its_fetch_session():
    m, _ = manager_with(({CLIENT_ID: "app"}, {"consumer_byte_rate": 100}))
    conn = ConnectionInfo("127.0.0.1:1", 1)

    async def fetch(req):
        return dataclasses.replace(fetch_response(11, b"x" * 5_000), session_id=77)
    r = asyncio.run(m.enforce(fetch_as(replica_id=-1, session_id=77), conn, fetch))
    assert r.responses == () and r.session_id == 77 and conn.throttle_ms > 0


def test_create_topics_past_the_mutation_quota_fail_with_throttling_quota_exceeded(tmp_path):
    from strata.cluster.metadata import ClusterMetadata
    metadata = ClusterMetadata(tmp_path, 1, {"node.id": "1", "log.dirs": str(tmp_path)})
    m, store = manager_with(({CLIENT_ID: "admin"}, {"controller_mutation_rate": 1}))
    ctx = context(m, store, metadata)
    conn = ConnectionInfo("127.0.0.1:1", 1)

    def topic(version, name, partitions):
        return make(request_class(ApiKey.CREATE_TOPICS, version), "topics", name=name,
                    num_partitions=partitions, replication_factor=1, assignments=(), configs=())
    r = dispatch(ctx, conn, ApiKey.CREATE_TOPICS, 7, client_id="admin", timeout_ms=1000,
                 validate_only=False, topics=(topic(7, "a", 12), topic(7, "b", 1)))
    # 11 tokens: "a" takes 12 (allowed, the bucket was not below zero), "b" is refused
    assert [(t.name, t.error_code) for t in r.topics] == [
        ("a", ErrorCode.NONE), ("b", ErrorCode.THROTTLING_QUOTA_EXCEEDED)]
    assert r.topics[1].error_message == "The throttling quota has been exceeded."
    assert r.throttle_time == datetime.timedelta(seconds=1) and conn.throttle_ms == 1_000
    assert metadata.topic("b") is None
    # before v6 the quota is permissive: created, and throttled
    conn.throttle_ms = 0
    r = dispatch(ctx, conn, ApiKey.CREATE_TOPICS, 5, client_id="admin", timeout_ms=1000,
                 validate_only=False, topics=(topic(5, "c", 2),))
    assert r.topics[0].error_code == ErrorCode.NONE and metadata.topic("c") is not None
    assert conn.throttle_ms == 3_000 and r.throttle_time == datetime.timedelta(seconds=3)


def test_request_time_counts_the_handlers_running_time_not_its_waits(monkeypatch):
    now = [0]
    monkeypatch.setattr(quotas_module.time, "perf_counter_ns", lambda: now[0])
    m, store = manager_with(({CLIENT_ID: "app"}, {"request_percentage": 1}))
    conn = ConnectionInfo("127.0.0.1:1", 1)
    request = parse_request(client_frame(make(request_class(ApiKey.API_VERSIONS, 3),
                                              client_software_name="x",
                                              client_software_version="1"), client_id="app"))

    async def handler(req):
        now[0] += 30_000_000           # runs 30 ms
        waited = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(waited.set_result, None)
        await waited
        now[0] += 20_000_000           # (the wait itself is not counted: nothing ran)
        return api_versions_response(req.api_version)

    async def main():
        async def sleeper():           # another task runs 1 s while the handler waits
            now[0] += 1_000_000_000
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(sleeper()))
        return await m.enforce(request, conn, handler)
    asyncio.run(main())
    # 50 ms = 5 percent-seconds over 10 s: 0.5 %/s, within 1 %
    rate = m.sensors(REQUEST, ("", "app")).rate
    assert rate.total(m.now_ms()) == pytest.approx(5.0)


def test_nothing_is_measured_without_quotas():
    m, _ = manager_with()
    assert not m.any_enabled
    assert m.record(PRODUCE, ANONYMOUS, "app", 10**9) == 0
    assert m.metrics() == [(t.group, "queue-size", ("", ""), 0.0) for t in QuotaType]


def test_the_quota_sensors_are_exported_under_kafkas_names():
    m, _ = manager_with(({CLIENT_ID: "app"}, {"producer_byte_rate": 1000}))
    m.record(PRODUCE, ANONYMOUS, "app", 20_000)
    m.throttle(PRODUCE, ANONYMOUS, "app", 10_000)
    families = {f.name: f for f in ClientQuotaCollector(m).collect()}
    byte_rate = families["kafka_server_Produce_byte_rate"].samples[0]
    assert byte_rate.labels == {"user": "", "client_id": "app"} and byte_rate.value == 2_000
    assert families["kafka_server_Produce_throttle_time"].samples[0].value == 10_000
    assert families["kafka_server_Produce_queue_size"].samples[0].value == 1


# ---- the connection's mute -------------------------------------------------------------------

def test_a_throttled_response_is_sent_at_once_then_the_connection_reads_nothing_until_closed():
    from test_network import api_versions_request, read_response
    handled = []

    async def throttling(request, conn):
        handled.append(request.correlation_id)
        conn.throttle_ms = 60_000
        return api_versions_response(request.api_version)

    async def main():
        server = KafkaServer(throttling, "127.0.0.1", 0)
        await server.start()
        r, w = await asyncio.open_connection("127.0.0.1", server.port)
        w.write(api_versions_request(3, 1) + api_versions_request(3, 2))
        assert (await read_response(r))[0] == 1
        (conn,) = server._connections
        assert conn._muted and conn._paused_reading
        assert handled == [1]
        await server.stop()            # ends the mute: the connection closes
        assert handled == [1]
        w.close()
    asyncio.run(asyncio.wait_for(main(), 20))
