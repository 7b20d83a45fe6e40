"""Kafka's broker metrics as Strata counts them (strata/server/broker_metrics.py) and exports
them (KafkaBrokerCollector): per-partition BrokerTopicMetrics with Kafka's failure rules,
RequestMetrics names, errors and time split, the purgatory's sizes and remote wait, the replica
and controller gauges, and the log flush timer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from strata.cluster.image import PartitionState
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.log.flush_stats import LOG_FLUSH_STATS, LogFlushStats
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.codec import ApiKey
from strata.protocol.records import SimpleRecord, build_batch
from strata.server.broker_metrics import (
    REMOTE_WAIT_NS, BrokerTopicStats, EventLoopIdle, RequestStats, kafka_api_name,
    response_errors)
from strata.server.metrics import KafkaBrokerCollector
from strata.server.purgatory import PartitionWatchers

MS = 1_000_000


def samples(collector) -> dict[tuple, float]:
    out = {}
    for family in collector.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_produce_counts_bytes_and_messages_of_successful_appends_only() -> None:
    stats = BrokerTopicStats()
    stats.produced("t", ErrorCode.NONE, 1000, 10)
    stats.produced("t", ErrorCode.MESSAGE_TOO_LARGE, 5000, 0)       # rejected, not failed
    stats.produced("t", ErrorCode.NOT_LEADER_OR_FOLLOWER, 300, 0)   # expected: not failed
    stats.produced("t", ErrorCode.INVALID_RECORD, 200, 0)           # unexpected: failed
    c = dict(zip(("in", "out", "msgs", "rejected", "failed_p", "failed_f", "total_p", "total_f"),
                 stats.snapshot()["t"]))
    assert c == {"in": 1000, "out": 0, "msgs": 10, "rejected": 5000, "failed_p": 1,
                 "failed_f": 0, "total_p": 4, "total_f": 0}


def test_fetch_counts_reads_failures_and_consumer_bytes() -> None:
    stats = BrokerTopicStats()
    stats.fetched("t", ErrorCode.NONE)
    stats.fetched("t", ErrorCode.OFFSET_OUT_OF_RANGE)   # Kafka: not a failed fetch
    stats.fetched("t", ErrorCode.UNKNOWN_SERVER_ERROR)
    stats.sent("t", 4096)
    out, failed_f, total_f = (stats.snapshot()["t"][i] for i in (1, 5, 7))
    assert (out, failed_f, total_f) == (4096, 1, 3)


def test_kafka_api_names() -> None:
    assert kafka_api_name(ApiKey.PRODUCE) == "Produce"
    assert kafka_api_name(ApiKey.API_VERSIONS) == "ApiVersions"
    assert kafka_api_name(ApiKey.OFFSET_FOR_LEADER_EPOCH) == "OffsetForLeaderEpoch"


def _produce_response(*codes):
    parts = tuple(SimpleNamespace(error_code=c) for c in codes)
    return SimpleNamespace(responses=(SimpleNamespace(partition_responses=parts),))


def test_response_errors_are_per_partition_for_produce_and_fetch_else_top_level() -> None:
    assert response_errors(ApiKey.PRODUCE, _produce_response(0, 6)) == [0, 6]
    fetch = SimpleNamespace(error_code=0, responses=(SimpleNamespace(
        partitions=(SimpleNamespace(error_code=1),)),))
    assert response_errors(ApiKey.FETCH, fetch) == [1]
    session_error = SimpleNamespace(error_code=70, responses=())
    assert response_errors(ApiKey.FETCH, session_error) == [70]
    assert response_errors(ApiKey.METADATA, SimpleNamespace(topics=())) == []
    assert response_errors(ApiKey.FIND_COORDINATOR, SimpleNamespace(error_code=15)) == [15]
    assert response_errors(ApiKey.PRODUCE, None) == []   # acks=0: no response


def test_request_stats_name_fetches_by_fetcher_and_split_the_time() -> None:
    stats = RequestStats()
    consumer = SimpleNamespace(api_key=ApiKey.FETCH, api_version=16,
                               body=SimpleNamespace(replica_id=-1, replica_state=None))
    follower = SimpleNamespace(api_key=ApiKey.FETCH, api_version=16, body=SimpleNamespace(
        replica_id=-1, replica_state=SimpleNamespace(replica_id=2)))
    produce = SimpleNamespace(api_key=ApiKey.PRODUCE, api_version=11, body=None)
    empty = SimpleNamespace(error_code=0, responses=())
    stats.record(consumer, empty, 0, 1 * MS, 501 * MS, 502 * MS, 500 * MS)
    stats.record(follower, empty, 0, 0, 1 * MS, 1 * MS, 0)
    stats.record(produce, _produce_response(0, 0, 87), 0, 2 * MS, 5 * MS, 6 * MS, 1 * MS)
    requests, errors, times = stats.snapshot()
    assert requests == {("FetchConsumer", 16): 1, ("FetchFollower", 16): 1, ("Produce", 11): 1}
    assert errors[("Produce", 0)] == 2 and errors[("Produce", 87)] == 1
    count, total, queue, local, remote, send = times["FetchConsumer"]
    assert (count, total, queue, local, remote, send) == (1, 502 * MS, 1 * MS, 0, 500 * MS, 1 * MS)
    assert times["Produce"][1:] == [6 * MS, 2 * MS, 2 * MS, 1 * MS, 1 * MS]


def test_collector_exports_requests_as_counters_and_summaries_in_ms() -> None:
    stats = RequestStats()
    produce = SimpleNamespace(api_key=ApiKey.PRODUCE, api_version=11, body=None)
    stats.record(produce, _produce_response(0), 0, 0, 3 * MS, 4 * MS, 0)
    s = samples(KafkaBrokerCollector(request_stats=stats))
    assert s[("kafka_network_RequestMetrics_RequestsPerSec_total",
              (("request", "Produce"), ("version", "11")))] == 1
    assert s[("kafka_network_RequestMetrics_ErrorsPerSec_total",
              (("error", "NONE"), ("request", "Produce")))] == 1
    assert s[("kafka_network_RequestMetrics_TotalTimeMs_count", (("request", "Produce"),))] == 1
    assert s[("kafka_network_RequestMetrics_TotalTimeMs_sum", (("request", "Produce"),))] == 4.0
    assert s[("kafka_network_RequestMetrics_LocalTimeMs_sum", (("request", "Produce"),))] == 3.0


def test_topic_series_per_topic_and_in_total_and_deleted_topics_dropped() -> None:
    stats = BrokerTopicStats()
    stats.produced("a", ErrorCode.NONE, 100, 2)
    stats.produced("b", ErrorCode.NONE, 50, 1)
    metadata = SimpleNamespace(topic=lambda t: None if t == "b" else object(),
                               controller_id=1, node_id=1, topics=lambda: {},
                               partition_state=lambda t, p: None)
    s = samples(KafkaBrokerCollector(topic_stats=stats, metadata=metadata))
    assert s[("kafka_server_BrokerTopicMetrics_MessagesInPerSec_total", (("topic", "a"),))] == 2
    assert ("kafka_server_BrokerTopicMetrics_MessagesInPerSec_total", (("topic", "b"),)) not in s
    assert s[("kafka_server_BrokerTopicMetrics_BytesInPerSec_total", ())] == 100
    assert "b" not in stats.topics


def test_replica_and_controller_gauges() -> None:
    me = 1
    states = {TopicPartition("t", 0): PartitionState(me, 3, (1, 2, 3), (1, 2, 3)),
              TopicPartition("t", 1): PartitionState(me, 3, (1,), (1, 2, 3)),     # under, < min
              TopicPartition("t", 2): PartitionState(2, 3, (2,), (1, 2, 3))}      # not led here
    rm = SimpleNamespace(broker_id=me, hosted_states=lambda: states, isr_shrinks=4,
                         isr_expands=5, min_insync_replicas=lambda topic: 2)
    leaders = {("t", 0): 1, ("t", 1): -1, ("u", 0): -1}
    metadata = SimpleNamespace(
        controller_id=me, node_id=me, topic=lambda t: object(),
        topics=lambda: {"t": SimpleNamespace(partitions=2), "u": SimpleNamespace(partitions=1)},
        partition_state=lambda t, p: PartitionState(leaders[(t, p)], 0, (), ()))
    s = samples(KafkaBrokerCollector(replica_manager=rm, metadata=metadata))
    assert s[("kafka_server_ReplicaManager_LeaderCount", ())] == 2
    assert s[("kafka_server_ReplicaManager_UnderReplicatedPartitions", ())] == 1
    assert s[("kafka_server_ReplicaManager_UnderMinIsrPartitionCount", ())] == 1
    assert s[("kafka_server_ReplicaManager_IsrShrinksPerSec_total", ())] == 4
    assert s[("kafka_server_ReplicaManager_IsrExpandsPerSec_total", ())] == 5
    assert s[("kafka_controller_KafkaController_ActiveControllerCount", ())] == 1
    assert s[("kafka_controller_KafkaController_OfflinePartitionsCount", ())] == 2
    elsewhere = SimpleNamespace(**{**vars(metadata), "controller_id": 2})
    s = samples(KafkaBrokerCollector(metadata=elsewhere))
    assert s[("kafka_controller_KafkaController_ActiveControllerCount", ())] == 0
    assert s[("kafka_controller_KafkaController_OfflinePartitionsCount", ())] == 0


def test_purgatory_counts_waiters_and_adds_the_wait_to_remote_time() -> None:
    watchers = PartitionWatchers()
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    seen = {}

    async def main() -> None:
        remote = [0]
        token = REMOTE_WAIT_NS.set(remote)
        try:
            waiter = asyncio.ensure_future(watchers.wait_any(tps, 30, watchers.mark(),
                                                             kind="Produce"))
            await asyncio.sleep(0)
            seen["during"] = (dict(watchers.delayed), dict(watchers.watches))
            watchers.notify(tps[1])
            assert await waiter
        finally:
            REMOTE_WAIT_NS.reset(token)
        seen["remote"] = remote[0]

    asyncio.run(main())
    assert seen["during"] == ({"Produce": 1, "Fetch": 0}, {"Produce": 2, "Fetch": 0})
    assert watchers.delayed == {"Produce": 0, "Fetch": 0} and watchers.watches["Produce"] == 0
    assert seen["remote"] > 0
    s = samples(KafkaBrokerCollector(watchers=watchers))
    assert s[("kafka_server_DelayedOperationPurgatory_PurgatorySize",
              (("delayedOperation", "Produce"),))] == 0


def test_connection_counts_per_listener() -> None:
    servers = [SimpleNamespace(listener="PLAINTEXT", connection_count=3),
               SimpleNamespace(listener="SSL", connection_count=1),
               SimpleNamespace(listener="PLAINTEXT", connection_count=2)]
    s = samples(KafkaBrokerCollector(servers=lambda: servers))
    assert s[("kafka_server_socket_server_metrics_connection_count",
              (("listener", "PLAINTEXT"),))] == 5
    assert s[("kafka_server_socket_server_metrics_connection_count", (("listener", "SSL"),))] == 1


def test_event_loop_idle_is_measured_only_on_a_loop_thread() -> None:
    off_loop = EventLoopIdle()
    assert not off_loop.install() and off_loop.idle_fraction_since_last() is None
    idle = EventLoopIdle()

    async def main() -> bool:
        return idle.install()
    assert asyncio.run(main())
    assert 0.0 <= idle.idle_fraction_since_last() <= 1.0


def test_log_flushes_are_counted(tmp_path: Path) -> None:
    stats = LogFlushStats()
    stats.add(0)
    assert stats.snapshot()[0] == 1
    ulog = UnifiedLog(tmp_path / "t-0", LogConfig({}))
    try:
        ulog.append_as_leader(build_batch([SimpleRecord(b"v", b"k", timestamp=1)]), 0)
        before = LOG_FLUSH_STATS.snapshot()[0]
        ulog.flush()
        assert LOG_FLUSH_STATS.snapshot()[0] == before + 1
    finally:
        ulog.close()
    s = samples(KafkaBrokerCollector(flush_stats=stats))
    assert s[("kafka_log_LogFlushStats_LogFlushRateAndTimeMs_count", ())] == 1
