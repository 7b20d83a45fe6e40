"""The ObjectStore decorators composed by ``object_store_from_config``: the upload rate limit
(a token bucket on simulated time), the fault injector's bandwidth caps and throttling
responses, the always-on meter (requests, bytes, errors and estimated cost per operation and
topic) and its Prometheus export, and the generic ``stats()`` exporter."""

from __future__ import annotations

import types
import uuid

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from strata.common.types import TopicIdPartition, TopicPartition
from strata.server.metrics import BrokerMetricsCollector, MetricsServer, StatsCollector
from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteResourceNotFoundException,
    RemoteStorageException, RetriableRemoteStorageException)
from strata.tiered.storage import ObjectStoreRemoteStorageManager
from strata.tiered.storage.object_store import (
    FaultInjectingObjectStore, MemoryObjectStore, MeteredObjectStore, RequestPrices,
    ThrottledRemoteStorageException, UploadRateLimitedObjectStore, _obstore_error, find_layer,
    object_store_from_config, topic_of_key)

TOPIC_ID = uuid.UUID("8f3b2a4c-1d5e-4f60-9a7b-0c1d2e3f4a5b")   # "jzsqTB1eT2CaewwdLj9KWw"
DIR = "orders-jzsqTB1eT2CaewwdLj9KWw"


class SimClock:
    """Simulated seconds: ``sleep`` moves time forward."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


class Recording(MemoryObjectStore):
    """A memory store that remembers when (simulated) each upload reached it."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self.clock = clock
        self.uploads: list[tuple[float, int]] = []

    def put(self, key: str, data: bytes) -> None:
        self.uploads.append((self.clock.t, len(data)))
        super().put(key, data)


# ---- upload rate limit -------------------------------------------------------------------------

def test_upload_rate_limit_holds_within_10_percent_over_a_simulated_window():
    clock = SimClock()
    inner = Recording(clock)
    rate = 1_000_000
    store = UploadRateLimitedObjectStore(inner, rate, now=clock.now, sleep=clock.sleep)
    chunk = b"x" * 64 * 1024
    while clock.t < 30:
        store.put(f"k/{len(inner.uploads)}", chunk)
    window = 20.0
    started = sum(n for at, n in inner.uploads if at < window)
    assert abs(started - rate * window) <= 0.10 * rate * window, started
    # steady state: between uploads the clock moved by exactly size / rate
    gaps = [b[0] - a[0] for a, b in zip(inner.uploads[20:40], inner.uploads[21:41])]
    assert all(g == pytest.approx(len(chunk) / rate) for g in gaps)


def test_upload_rate_limit_counts_files_and_leaves_reads_alone(tmp_path):
    clock = SimClock()
    store = UploadRateLimitedObjectStore(MemoryObjectStore(), 1000, burst_bytes=0,
                                         now=clock.now, sleep=clock.sleep)
    src = tmp_path / "seg.log"
    src.write_bytes(b"y" * 3000)
    store.put_file("a/seg.log", src)
    assert clock.t == pytest.approx(3.0)
    assert store.get("a/seg.log") == b"y" * 3000 and store.size("a/seg.log") == 3000
    assert list(store.list("a/")) == [("a/seg.log", 3000)]
    store.delete("a/seg.log")
    assert clock.t == pytest.approx(3.0)                 # only uploads wait


def test_upload_rate_limit_key_builds_the_limiter_outermost():
    store = object_store_from_config({"storage.url": "memory://",
                                      "upload.rate.limit.bytes.per.second": "5242880"})
    assert isinstance(store, UploadRateLimitedObjectStore) and store.bytes_per_second == 5242880
    assert isinstance(store.inner, MeteredObjectStore)
    assert find_layer(store, MemoryObjectStore) is not None
    assert not isinstance(object_store_from_config({"storage.url": "memory://"}),
                          UploadRateLimitedObjectStore)   # unset: unlimited
    for bad in ("0", "-5", "fast"):
        with pytest.raises(RemoteStorageException):
            object_store_from_config({"storage.url": "memory://",
                                      "upload.rate.limit.bytes.per.second": bad})


# ---- fault injection ---------------------------------------------------------------------------

def test_bandwidth_caps_sleep_for_the_bytes_moved(tmp_path):
    clock = SimClock()
    store = FaultInjectingObjectStore(MemoryObjectStore(), get_bandwidth_bps=500,
                                      put_bandwidth_bps=250, put_latency_ms=100,
                                      sleep=clock.sleep)
    store.put("a/b", b"z" * 1000)
    assert clock.slept == [pytest.approx(0.1), pytest.approx(4.0)]   # latency, then transfer
    clock.slept.clear()
    assert store.get_range("a/b", 0, 250) == b"z" * 250
    assert clock.slept == [pytest.approx(0.5)]
    clock.slept.clear()
    src = tmp_path / "f"
    src.write_bytes(b"q" * 500)
    store.put_file("a/f", src)
    store.get("a/f")
    assert clock.slept == [pytest.approx(0.1), pytest.approx(2.0), pytest.approx(1.0)]
    clock.slept.clear()
    store.size("a/f")
    store.delete("a/f")
    assert clock.slept == []                              # no bytes moved


def test_throttling_fails_a_seeded_fraction_with_a_retriable_slowdown_error():
    def run(seed):
        inner = MemoryObjectStore()
        store = FaultInjectingObjectStore(inner, throttle_rate=0.3, seed=seed)
        outcome = []
        for i in range(1000):
            try:
                store.put(f"k/{i}", b"v")
                outcome.append(True)
            except ThrottledRemoteStorageException as e:
                assert isinstance(e, RetriableRemoteStorageException)
                assert "503 SlowDown" in str(e)
                outcome.append(False)
        assert len(inner.objects) == outcome.count(True)  # a throttled put never arrives
        assert store.injected_throttles == outcome.count(False) == store.injected_failures
        return outcome

    first = run(7)
    assert 250 <= first.count(False) <= 350
    assert run(7) == first                                # the seed makes it repeatable
    always = FaultInjectingObjectStore(MemoryObjectStore(), throttle_rate=1.0)
    with pytest.raises(ThrottledRemoteStorageException):
        always.get("x")


def test_fault_keys_build_bandwidth_and_throttling_and_old_keys_still_work():
    store = object_store_from_config({
        "storage.url": "memory://", "fault.get.bandwidth.bytes.per.second": "1048576",
        "fault.put.bandwidth.bytes.per.second": "524288", "fault.throttle.rate": "0.05",
        "fault.error.rate": "0.01", "fault.seed": "3", "fault.get.latency.ms": "2"})
    fault = find_layer(store, FaultInjectingObjectStore)
    assert (fault.get_bandwidth_bps, fault.put_bandwidth_bps, fault.throttle_rate) == \
        (1048576, 524288, 0.05)
    assert (fault.error_rate, fault.get_latency_ms) == (0.01, 2)
    # the meter sits outside the faults: it sees (and counts) the injected failures
    assert isinstance(store, MeteredObjectStore) and store.inner is fault
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "memory://", "fault.throttle.rate": "2"})


def test_a_throttled_s3_answer_maps_to_the_throttled_error_type():
    e = _obstore_error("put", "k", RuntimeError("Generic S3 error: 503 Service Unavailable: "
                                                "<Code>SlowDown</Code> Please reduce your "
                                                "request rate."))
    assert isinstance(e, ThrottledRemoteStorageException)
    assert isinstance(_obstore_error("get", "k", RuntimeError("HTTP 429 Too Many Requests")),
                      ThrottledRemoteStorageException)
    other = _obstore_error("get", "k", RuntimeError("connection reset by peer"))
    assert isinstance(other, RetriableRemoteStorageException)
    assert not isinstance(other, ThrottledRemoteStorageException)


# ---- metering ----------------------------------------------------------------------------------

def test_topic_comes_from_the_rsm_key_layout():
    rsm = ObjectStoreRemoteStorageManager(MemoryObjectStore())
    rsm.configure({"key.prefix": "tiered/"})
    for topic in ("orders", "my-topic-1", "a.b_c"):
        tip = TopicIdPartition(TOPIC_ID, TopicPartition(topic, 3))
        meta = RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, uuid.uuid4()), 0, 9, 1, 1, 1, 100,
                                        segment_leader_epochs={0: 0})
        assert topic_of_key(rsm.object_key(meta, "log"), "tiered/") == topic
        assert topic_of_key(rsm.partition_prefix(tip), "tiered/") == topic
    assert topic_of_key(f"{DIR}/0/x.log", "tiered/") == ""   # not under the prefix
    assert topic_of_key("tiered/orders-", "tiered/") == ""    # a listing prefix naming no id
    assert topic_of_key(f"{DIR}/0/x.log") == "orders"


def test_metered_store_counts_requests_bytes_errors_and_cost_per_operation_and_topic(tmp_path):
    inner = MemoryObjectStore()
    store = MeteredObjectStore(inner, prices=RequestPrices(get_per_1000=1.0, put_per_1000=10.0))
    key = f"{DIR}/0/00000000000000000000-abc.log"
    store.put(key, b"a" * 100)
    src = tmp_path / "f"
    src.write_bytes(b"b" * 40)
    store.put_file(f"{DIR}/1/idx", src)
    assert store.get(key) == b"a" * 100
    assert store.get_range(key, 10, 30) == b"a" * 20
    assert store.size(key) == 100
    with pytest.raises(RemoteResourceNotFoundException):
        store.get(f"{DIR}/0/missing")
    assert sorted(k for k, _ in store.list(f"{DIR}/")) == [key, f"{DIR}/1/idx"]
    store.delete_many([key, f"{DIR}/1/idx"])
    store.put("other/thing", b"c" * 7)
    s = {k: (v.requests, v.bytes, v.errors) for k, v in store.snapshot().items()}
    assert s == {("PUT", "orders"): (2, 140, 0), ("GET", "orders"): (3, 120, 1),
                 ("HEAD", "orders"): (1, 0, 0), ("LIST", "orders"): (1, 0, 0),
                 ("DELETE", "orders"): (2, 0, 0), ("PUT", ""): (1, 7, 0)}
    cost = store.estimated_cost()
    # GET and HEAD at 1.0 / 1000, PUT and LIST at 10.0 / 1000, DELETE free
    assert cost["orders"] == pytest.approx(4 * 0.001 + 3 * 0.01)
    assert cost[""] == pytest.approx(0.01)


def test_default_prices_are_s3_standards_and_configurable():
    assert RequestPrices() == RequestPrices(get_per_1000=0.0004, put_per_1000=0.005)
    store = object_store_from_config({"storage.url": "memory://", "key.prefix": "p/",
                                      "cost.get.per.1000.requests": "0.001",
                                      "cost.put.per.1000.requests": "0.01"})
    assert store.key_prefix == "p/"
    assert store.prices == RequestPrices(get_per_1000=0.001, put_per_1000=0.01)
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "memory://", "cost.get.per.1000.requests": "-1"})


def test_a_large_upload_to_an_obstore_counts_its_multipart_requests(tmp_path):
    import obstore.store

    from strata.tiered.storage import ObstoreObjectStore
    base = ObstoreObjectStore(obstore.store.MemoryStore(), multipart_chunk_size=5 * 1024 * 1024)
    store = MeteredObjectStore(base)
    src = tmp_path / "big"
    src.write_bytes(b"\0" * (11 * 1024 * 1024))
    store.put_file(f"{DIR}/0/big.log", src)
    stats = store.snapshot()[("PUT", "orders")]
    assert (stats.requests, stats.bytes) == (3 + 2, 11 * 1024 * 1024)   # parts, create, complete


def _scrape(collector) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in collector.collect() for s in f.samples}


def test_store_metrics_are_exported_per_operation_and_topic():
    chain = object_store_from_config({"storage.url": "memory://",
                                      "upload.rate.limit.bytes.per.second": "1000000000"})
    chain.put(f"{DIR}/0/a.log", b"x" * 10)
    chain.get(f"{DIR}/0/a.log")
    rlm = types.SimpleNamespace(
        ctx=types.SimpleNamespace(rsm=types.SimpleNamespace(store=chain), index_cache=None,
                                  quotas=None),
        metrics=types.SimpleNamespace(snapshot=dict), copier_idle_fraction=lambda: 1.0)
    m = _scrape(BrokerMetricsCollector(lambda: [], rlm))
    assert m[("strata_remote_storage_requests_total", (("op", "PUT"), ("topic", "orders")))] == 1
    assert m[("strata_remote_storage_bytes_total", (("op", "GET"), ("topic", "orders")))] == 10
    assert m[("strata_remote_storage_errors_total", (("op", "GET"), ("topic", "orders")))] == 0
    assert m[("strata_remote_storage_estimated_cost_total", (("topic", "orders"),))] == \
        pytest.approx(0.005 / 1000 + 0.0004 / 1000)


def test_any_stats_dict_is_exported_under_a_prefix():
    registry = CollectorRegistry()
    cache_stats = {"memory_hits": 5, "disk_hits": 2, "misses": 1, "memory_bytes": 4096,
                   "disk_bytes": 8192, "prefetch_dropped": 0}
    registry.register(StatsCollector("strata_chunk_cache", lambda: cache_stats))
    registry.register(StatsCollector("strata_broken", lambda: 1 / 0))   # exports nothing
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["strata_chunk_cache_memory_hits"].type == "counter"
    assert families["strata_chunk_cache_memory_hits"].samples[0].value == 5
    assert families["strata_chunk_cache_memory_bytes"].type == "gauge"
    assert families["strata_chunk_cache_disk_bytes"].samples[0].value == 8192
    assert not [n for n in families if n.startswith("strata_broken")]
    server = MetricsServer("http://127.0.0.1:0", logs=lambda: [])
    server.add_stats("strata_chunk_cache", lambda: {"misses": 3}, gauges=())
    text = generate_latest(server.registry).decode()
    assert "strata_chunk_cache_misses_total 3.0" in text


def test_an_upload_waiting_in_the_rate_limiter_fails_fast_when_aborted():
    clock = SimClock()
    calls = []

    def sleep(s):   # the broker shuts down two seconds into a ~1000 s wait
        calls.append(s)
        clock.sleep(s)
        if clock.t >= 2:
            store.abort_waits()
    store = UploadRateLimitedObjectStore(MemoryObjectStore(), 1000, burst_bytes=0,
                                         now=clock.now, sleep=sleep)
    with pytest.raises(RetriableRemoteStorageException):
        store.put("k/big", b"x" * 1_000_000)
    assert clock.t == pytest.approx(2.0) and max(calls) <= 0.5
    with pytest.raises(RetriableRemoteStorageException):
        store.put("k/next", b"x")
    assert store.inner.objects == {}
