"""KIP-956 remote copy and fetch quotas: Kafka's sampled-rate math on a mock clock, the copier
held to the copy bound, Fetch skipping remote reads over the fetch bound, the quotas as dynamic
broker configs (AlterConfigs, IncrementalAlterConfigs, DescribeConfigs, kept across a restart),
and their metrics."""

from __future__ import annotations

import asyncio
import datetime
import math
import threading
from pathlib import Path

import pytest

from strata.broker.metadata_publisher import NO_REMOTE_TIER, TopicLogsPublisher
from strata.cluster.metadata import ClusterMetadata, ConfigSource
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode
from strata.common.rate import SampledAvgMax, SampledRate, TokenBucket, throttle_time_ms
from strata.common.scheduler import KafkaScheduler
from strata.log.log_manager import LogManager
from strata.protocol.codec import ApiKey
from strata.protocol.records import iter_records
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.metrics import BrokerMetricsCollector
from strata.tiered.manager.quota import RemoteLogQuotas, RLMQuotaManager
from strata.tiered.manager.remote_log_manager import TieringSettings
from strata.tiered.storage import ObjectStoreRemoteStorageManager
from test_group_handlers import Client
from tiered_env import T0, TP, TieredEnv
from support.replicas import lead_alone
from support.metadata_stand_in import no_metadata

COPY = "remote.log.manager.copy.max.bytes.per.second"
FETCH = "remote.log.manager.fetch.max.bytes.per.second"
BROKER = 4


# ---- the rate math -----------------------------------------------------------------------------

def test_sampled_rate_divides_the_live_windows_by_the_time_since_the_oldest_began():
    rate = SampledRate(samples=11, window_ms=1000)
    assert rate.measure(0) == 0.0
    rate.record(1000, 0)
    assert rate.measure(0) == 1000.0        # at least one whole window
    assert rate.measure(500) == 1000.0
    assert rate.measure(2000) == 500.0      # 1000 bytes over 2 s
    rate.record(3000, 2000)                 # a new window
    assert rate.measure(4000) == 1000.0     # 4000 bytes over 4 s
    # 11 s after it began the first window is dropped: 3000 bytes over the 9 s since 2000
    assert rate.measure(11_000) == pytest.approx(3000 / 9)
    assert rate.window_size_ms(11_000) == 9000


def test_throttle_time_is_the_excess_over_the_bound_times_the_window():
    assert throttle_time_ms(1000, 500, 1000) == 1000
    assert throttle_time_ms(750, 500, 2000) == 1000
    assert throttle_time_ms(500, 500, 1000) == 0    # at the bound is within it
    assert throttle_time_ms(100, 500, 1000) == 0


def test_quota_manager_is_exceeded_above_the_bound_until_the_rate_drains():
    clock = MockClock(T0)
    quota = RLMQuotaManager(500, window_num=11, window_size_seconds=1, clock=clock)
    assert quota.throttle_time_ms() == 0 and not quota.is_quota_exceeded()
    quota.record(1000)
    assert quota.rate() == 1000.0
    assert quota.is_quota_exceeded() and quota.throttle_time_ms() == 1000
    clock.advance_ms(1000)
    assert quota.throttle_time_ms() == 1000          # still 1000 B over 1 s
    clock.advance_ms(1000)
    assert quota.rate() == 500.0 and quota.throttle_time_ms() == 0
    quota.record(1)
    assert quota.is_quota_exceeded()
    quota.update_quota(2000)                          # live: what was recorded stays
    assert not quota.is_quota_exceeded() and quota.rate() == pytest.approx(1001 / 2)
    with pytest.raises(ValueError):
        quota.update_quota(0)


def test_throttle_sensor_reports_kafkas_avg_and_max_and_nan_when_idle():
    stats = SampledAvgMax(samples=2, window_ms=30_000)
    assert math.isnan(stats.avg(0)) and math.isnan(stats.max(0))
    stats.record(100, 0)
    stats.record(300, 10_000)
    assert stats.avg(10_000) == 200 and stats.max(10_000) == 300
    stats.record(50, 40_000)                          # a second window
    assert stats.avg(40_000) == 150 and stats.max(40_000) == 300
    assert stats.avg(60_000) == 50 and stats.max(60_000) == 50   # the first expired
    assert math.isnan(stats.avg(200_000))


def test_token_bucket_lets_a_burst_through_then_the_rate():
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s
    bucket = TokenBucket(1000, burst=500, now=lambda: now[0], sleep=sleep)
    assert bucket.acquire(500) == 0                   # the burst
    assert bucket.acquire(250) == pytest.approx(0.25)
    assert bucket.acquire(2000) == pytest.approx(2.0)  # bigger than the burst: passes, later
    now[0] += 10
    assert bucket.acquire(100) == 0                   # refilled (up to the burst)
    assert sum(slept) == pytest.approx(2.25)


# ---- the copy quota ----------------------------------------------------------------------------

class Env(TieredEnv):
    """The tiered env with reader threads, ``settings`` for the RLM, and every copy recorded
    in ``copies`` as (ms since T0, segment bytes)."""

    def __init__(self, tmp: Path, **settings):
        super().__init__(tmp, settings=TieringSettings(reader_threads=2, **settings))
        self.copies: list[tuple[int, int]] = []
        real_copy = self.rsm.copy_log_segment_data

        def copy(meta, data):
            self.copies.append((self.clock.milliseconds() - T0, meta.segment_size_in_bytes))
            return real_copy(meta, data)
        self.rsm.copy_log_segment_data = copy


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def test_copy_quota_holds_the_copied_bytes_within_10_percent_of_the_bound_over_10_seconds(tmp_path):
    bound = 4096
    e = Env(tmp_path, copy_max_bytes_per_second=bound)
    try:
        e.produce(600)                               # ~35 segments of ~2 KiB: ~70 KiB
        segments = len(e.log.local_log.segments) - 1
        assert segments * 2048 > 1.5 * bound * 10
        assert e.copy() == segments                  # every one, paced by the mock clock
        in_window = sum(size for at, size in e.copies if at < 10_000)
        assert abs(in_window - bound * 10) <= 0.10 * bound * 10, (in_window, e.copies[:12])
        assert e.rlm.quotas.copy_throttle.count > 0
        assert e.rlm.quotas.copy_throttle.max() > 0
    finally:
        e.close()


def test_without_a_copy_quota_nothing_waits(env):
    env.produce(200)
    env.copy()
    assert {at for at, _ in env.copies} == {0}       # the clock never moved
    assert env.rlm.quotas.copy_throttle.count == 0


def test_a_copier_waiting_for_the_copy_quota_gives_up_at_shutdown():
    quotas = RemoteLogQuotas(copy_bytes_per_second=1)   # the system clock: a real wait
    quotas.copy.record(1_000_000)
    result = []
    waiter = threading.Thread(target=lambda: result.append(quotas.acquire_copy(10)))
    waiter.start()
    quotas.close()
    waiter.join(10)
    assert not waiter.is_alive() and result == [False]


def test_a_copier_stops_waiting_when_copying_is_turned_off(env):
    env.rlm.update_copy_quota(1)
    env.rlm.quotas.copy.record(1_000_000)
    checks = []

    def stop():
        checks.append(env.clock.milliseconds())
        return len(checks) > 3                        # "copy disabled" after a few waits
    assert env.rlm.quotas.acquire_copy(10, stop) is False
    assert len(checks) == 4 and checks[-1] > checks[0]


def test_shutdown_ends_uploads_waiting_in_the_stores_rate_limiter(tmp_path):
    from strata.tiered.storage.object_store import UploadRateLimitedObjectStore, find_layer
    e = Env(tmp_path)
    rsm = ObjectStoreRemoteStorageManager()
    rsm.configure({"storage.url": "memory://", "upload.rate.limit.bytes.per.second": "1"})
    e.rlm.ctx.rsm = rsm
    e.rlm.shutdown()
    limiter = find_layer(rsm.store, UploadRateLimitedObjectStore)
    with pytest.raises(Exception, match="rate limiter is stopped"):
        limiter.put("a/b", b"x" * 10)


# ---- the fetch quota ---------------------------------------------------------------------------

class _Logs:
    """The log manager a ReplicaManager needs, over the Env's one log."""

    def __init__(self, ulog):
        self.ulog = ulog

    def get_log(self, tp):
        return self.ulog if tp == TP else None


def _fetch(env, offset: int = 0, max_wait_ms: int = 0):
    replicas = ReplicaManager(_Logs(env.log), lambda t: 1 if t == "orders" else None,
                              remote_log_manager=env.rlm)
    lead_alone(replicas, TP)
    ctx = BrokerContext(node_id=1, advertised_host="h", advertised_port=1, metadata=no_metadata(),
                        replica_manager=replicas)
    v = 12
    part = Client.nested(ApiKey.FETCH, v, "topics.partitions", partition=0,
                         current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                         log_start_offset=-1, partition_max_bytes=1 << 20)
    topic = Client.nested(ApiKey.FETCH, v, "topics", topic="orders", partitions=(part,))
    r = asyncio.run(Client(ctx).send(ApiKey.FETCH, v, cluster_id=None, replica_id=-1,
                                     max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                                     min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                                     session_id=0, session_epoch=-1, topics=(topic,),
                                     forgotten_topics_data=(), rack_id=""))
    [p] = r.responses[0].partitions
    return p


def _tier_everything(env):
    env.produce(100)
    env.copy()
    env.log.delete_old_segments()
    assert env.log.local_log_start_offset > 0


def test_fetch_over_the_fetch_quota_answers_the_remote_partition_empty_without_error(env):
    _tier_everything(env)
    env.rlm.update_fetch_quota(1000)
    first = _fetch(env)                               # within the quota: a remote read
    assert first.error_code == 0 and first.records
    fetched = sum(1 for _ in iter_records(first.records))
    assert fetched > 0
    assert env.rlm.quotas.fetch.rate() == len(first.records)   # the bytes read were recorded
    assert env.rlm.fetch_throttle_time_ms() > 0       # far more than 1000 B in 1 s
    reads_before = env.rlm.metrics.snapshot()["RemoteFetchRequestsPerSec"].get("orders", 0)
    throttled = _fetch(env)
    assert throttled.error_code == 0 and not throttled.records
    assert throttled.high_watermark == env.log.high_watermark
    assert env.rlm.metrics.snapshot()["RemoteFetchRequestsPerSec"].get("orders", 0) == reads_before
    assert env.rlm.quotas.fetch_throttle.count == 1
    env.clock.advance_ms(60_000)                      # the samples expire: reads again
    again = _fetch(env)
    assert again.error_code == 0 and again.records


def test_a_dynamic_fetch_quota_increase_lets_remote_reads_through_at_once(env):
    _tier_everything(env)
    env.rlm.update_fetch_quota(1)
    assert _fetch(env).records
    assert not _fetch(env).records
    env.rlm.update_fetch_quota(10**12)
    assert _fetch(env).records


def test_throttle_and_quota_rate_metrics_are_exported_in_kafkas_names(env):
    _tier_everything(env)
    collector = BrokerMetricsCollector(lambda: [env.log], env.rlm)
    idle = {(s.name, tuple(s.labels.items())): s.value
            for f in collector.collect() for s in f.samples}
    assert math.isnan(idle[("kafka_server_RemoteLogManager_remote_copy_throttle_time_avg", ())])
    env.rlm.update_fetch_quota(1)
    _fetch(env)
    _fetch(env)
    m = {(s.name, tuple(s.labels.items())): s.value for f in collector.collect() for s in f.samples}
    throttle = env.rlm.quotas.fetch_throttle
    assert m[("kafka_server_RemoteLogManager_remote_fetch_throttle_time_max", ())] == throttle.max() > 0
    assert m[("kafka_server_RemoteLogManager_remote_fetch_throttle_time_avg", ())] == throttle.avg()
    assert m[("kafka_server_RLMFetch_byte_rate", ())] > 1
    assert ("kafka_server_RLMCopy_byte_rate", ()) in m
    assert ("kafka_server_RemoteLogManager_remote_copy_throttle_time_max", ()) in m


# ---- dynamic broker configs --------------------------------------------------------------------

class Broker:
    """ClusterMetadata and the admin handlers over one log dir, the Env's RLM following the
    metadata as the broker wires it."""

    def __init__(self, log_dir: Path, rlm=NO_REMOTE_TIER, **props):
        self.props = {"node.id": "1", "log.dirs": str(log_dir), **props}
        self.metadata = ClusterMetadata(log_dir, 1, self.props)
        self.scheduler = KafkaScheduler(threads=1)
        self.manager = LogManager([log_dir], self.metadata.default_log_config(),
                                  topic_config=self.metadata.log_config, scheduler=self.scheduler)
        self.manager.startup()
        self.metadata.add_listener(TopicLogsPublisher(self.manager, self.metadata, rlm))
        replicas = ReplicaManager(self.manager, lambda t: None)
        self.ctx = BrokerContext(node_id=1, advertised_host="h", advertised_port=1,
                                 metadata=self.metadata, replica_manager=replicas)

    def send(self, api, version, **fields):
        return asyncio.run(Client(self.ctx).send(api, version, **fields))

    def incremental(self, name, *ops, validate_only=False):
        v = 1
        configs = tuple(Client.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "resources.configs",
                                      name=k, config_operation=op, value=value)
                        for k, op, value in ops)
        res = Client.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "resources",
                            resource_type=BROKER, resource_name=name, configs=configs)
        return self.send(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, validate_only=validate_only,
                         resources=(res,)).responses[0]

    def legacy(self, name, **configs):
        v = 2
        res = Client.nested(ApiKey.ALTER_CONFIGS, v, "resources", resource_type=BROKER,
                            resource_name=name, configs=tuple(
                                Client.nested(ApiKey.ALTER_CONFIGS, v, "resources.configs",
                                              name=k, value=val) for k, val in configs.items()))
        return self.send(ApiKey.ALTER_CONFIGS, v, validate_only=False, resources=(res,)).responses[0]

    def describe(self, name, keys=None):
        v = 4
        res = Client.nested(ApiKey.DESCRIBE_CONFIGS, v, "resources", resource_type=BROKER,
                            resource_name=name, configuration_keys=keys)
        [r] = self.send(ApiKey.DESCRIBE_CONFIGS, v, include_synonyms=True,
                        include_documentation=False, resources=(res,)).results
        assert r.error_code == 0, r.error_message
        return {c.name: c for c in r.configs}

    def close(self):
        self.scheduler.shutdown(run_pending=False)
        self.manager.shutdown()


def test_dynamic_quotas_change_live_show_their_source_and_survive_a_restart(env, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    b = Broker(log_dir, env.rlm, **{FETCH: "5000000"})
    try:
        assert b.incremental("1", (COPY, 0, "1000")).error_code == 0
        assert env.rlm.quotas.copy.quota_bytes_per_second == 1000          # live
        assert b.incremental("", (FETCH, 0, "2000"), (COPY, 0, "3000")).error_code == 0
        assert env.rlm.quotas.fetch.quota_bytes_per_second == 2000
        assert env.rlm.quotas.copy.quota_bytes_per_second == 1000          # this node's wins
        mine = b.describe("1", (COPY, FETCH, "log.dirs"))
        copy, fetch = mine[COPY], mine[FETCH]
        assert (copy.value, copy.config_source, copy.read_only) == \
            ("1000", ConfigSource.DYNAMIC_BROKER_CONFIG, False)
        assert [(s.value, s.source) for s in copy.synonyms][:2] == [
            ("1000", ConfigSource.DYNAMIC_BROKER_CONFIG),
            ("3000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)]
        assert (fetch.value, fetch.config_source) == \
            ("2000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert ConfigSource.STATIC_BROKER_CONFIG in [s.source for s in fetch.synonyms]
        assert mine["log.dirs"].read_only
        defaults = b.describe("")
        assert {n: (c.value, c.config_source) for n, c in defaults.items()} == {
            COPY: ("3000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
            FETCH: ("2000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)}
    finally:
        b.close()

    # a restart: the stored values are in the metadata file and the tiering settings
    again = Broker(log_dir, **{FETCH: "5000000"})
    try:
        assert again.metadata.dynamic_broker_configs("1") == {COPY: "1000"}
        assert again.metadata.dynamic_broker_configs("") == {FETCH: "2000", COPY: "3000"}
        cfg = again.metadata.remote_log_manager_config
        settings = TieringSettings.from_config(cfg)
        assert (settings.copy_max_bytes_per_second, settings.fetch_max_bytes_per_second) == \
            (1000, 2000)
        assert again.describe("1", (COPY,))[COPY].config_source == ConfigSource.DYNAMIC_BROKER_CONFIG
        # DELETE reverts to the next source down
        assert again.incremental("1", (COPY, 1, None)).error_code == 0
        assert again.describe("1", (COPY,))[COPY].value == "3000"
        assert again.incremental("", (FETCH, 1, None)).error_code == 0
        fetch = again.describe("1", (FETCH,))[FETCH]
        assert (fetch.value, fetch.config_source) == ("5000000", ConfigSource.STATIC_BROKER_CONFIG)
    finally:
        again.close()


def test_bad_dynamic_broker_configs_are_refused_as_kafka_does_and_change_nothing(env, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    b = Broker(log_dir, env.rlm)
    try:
        r = b.incremental("1", (COPY, 0, "0"))
        assert r.error_code == ErrorCode.INVALID_REQUEST
        assert r.error_message == f"Invalid value 0 for configuration {COPY}: Value must be at least 1"
        r = b.incremental("1", (FETCH, 0, "fast"))
        assert (r.error_code, r.error_message) == (
            ErrorCode.INVALID_REQUEST,
            f"Invalid value fast for configuration {FETCH}: Not a number of type LONG")
        r = b.incremental("1", (COPY, 2, "5"))
        assert (r.error_code, r.error_message) == (
            ErrorCode.INVALID_REQUEST, f"Config value append is not allowed for config key: {COPY}")
        # any static key refuses the whole resource, with the old message
        r = b.incremental("1", (COPY, 0, "5"), ("log.retention.ms", 0, "1"))
        assert r.error_code == ErrorCode.INVALID_REQUEST
        assert r.error_message == ("Strata reads broker configs from server.properties only; "
                                   "dynamic broker configs are not supported: log.retention.ms")
        assert b.incremental("2", (COPY, 0, "5")).error_code == ErrorCode.INVALID_REQUEST
        assert b.incremental("1", (COPY, 0, "5"), validate_only=True).error_code == 0
        assert b.metadata.dynamic_broker_configs("1") == {}
        assert env.rlm.quotas.copy.unlimited
        assert b.describe("") == {}
    finally:
        b.close()


def test_legacy_alter_configs_replaces_the_broker_resources_dynamic_set(env, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    b = Broker(log_dir, env.rlm)
    try:
        assert b.legacy("1", **{COPY: "100", FETCH: "200"}).error_code == 0
        assert b.metadata.dynamic_broker_configs("1") == {COPY: "100", FETCH: "200"}
        assert b.legacy("1", **{FETCH: "300"}).error_code == 0
        assert b.metadata.dynamic_broker_configs("1") == {FETCH: "300"}
        assert env.rlm.quotas.copy.unlimited and env.rlm.quotas.fetch.quota_bytes_per_second == 300
        assert b.legacy("1", **{"num.partitions": "3"}).error_code == ErrorCode.INVALID_REQUEST
        assert b.metadata.dynamic_broker_configs("1") == {FETCH: "300"}
    finally:
        b.close()
