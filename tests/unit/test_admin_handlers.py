"""The admin APIs' handlers over a real ClusterMetadata, LogManager and ReplicaManager.

Requests go through the wire format both ways (see test_group_handlers.Client), so a field a
version lacks fails here rather than in a client. Topic changes must reach the partition logs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from strata.cluster.metadata import ClusterMetadata, ConfigSource, ZERO_UUID
from strata.common.errors import ErrorCode
from strata.common.scheduler import KafkaScheduler
from strata.common.types import TopicPartition
from strata.log.log_manager import LogManager
from strata.protocol.codec import API_VERSIONS, ApiKey
from strata.protocol.records import SimpleRecord, build_batch
from strata.replication.replica_manager import ReplicaManager
from strata.server import authz
from strata.server.context import BrokerContext
from strata.broker.metadata_publisher import TopicLogsPublisher
from test_group_handlers import Client
from support.replicas import follow_grants

TOPIC, BROKER, BROKER_LOGGER, GROUP = 2, 4, 8, 32


def versions(api: ApiKey) -> list[int]:
    lo, hi = API_VERSIONS[api]
    return list(range(lo, hi + 1))


@pytest.fixture
def broker(tmp_path):
    props = {"node.id": "1", "log.dirs": str(tmp_path / "logs")}
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    metadata = ClusterMetadata(log_dir, 1, props)
    scheduler = KafkaScheduler(threads=1)
    manager = LogManager([log_dir], metadata.default_log_config(), topic_config=metadata.log_config,
                         scheduler=scheduler)
    manager.startup()
    metadata.add_listener(TopicLogsPublisher(manager, metadata))
    replicas = follow_grants(metadata, ReplicaManager(
        manager, lambda t: (i.partitions if (i := metadata.topic(t)) else None),
        broker_id=metadata.node_id))
    ctx = BrokerContext(node_id=1, advertised_host="broker.example", advertised_port=9093,
                        metadata=metadata, replica_manager=replicas)
    yield ctx, manager, log_dir
    scheduler.shutdown(run_pending=False)
    manager.shutdown()


def send(ctx, api, version, **fields):
    return asyncio.run(Client(ctx).send(api, version, **fields))


def nested(api, version, path, **fields):
    return Client.nested(api, version, path, **fields)


def create(ctx, version, *topics, validate_only=False):
    """``topics``: (name, partitions, replication factor, configs dict[, assignments])."""
    entries = []
    for name, partitions, rf, configs, *assign in topics:
        entries.append(nested(ApiKey.CREATE_TOPICS, version, "topics", name=name,
                              num_partitions=partitions, replication_factor=rf,
                              configs=tuple(nested(ApiKey.CREATE_TOPICS, version, "topics.configs",
                                                   name=k, value=v) for k, v in configs.items()),
                              assignments=tuple(nested(ApiKey.CREATE_TOPICS, version,
                                                       "topics.assignments", partition_index=i,
                                                       broker_ids=tuple(b))
                                                for i, b in enumerate(assign[0] if assign else ()))))
    r = send(ctx, ApiKey.CREATE_TOPICS, version, topics=tuple(entries), timeout_ms=30_000,
             validate_only=validate_only)
    return {t.name: t for t in r.topics}


def partition_dirs(log_dir, topic):
    return sorted(p.name for p in log_dir.iterdir() if p.name.rsplit("-", 1)[0] == topic)


# ---- CreateTopics ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(ApiKey.CREATE_TOPICS))
def test_create_topics_creates_the_partition_logs_with_the_given_configs(broker, version):
    ctx, manager, log_dir = broker
    r = create(ctx, version, ("orders", 3, 1, {"retention.ms": "12345"}), ("events", -1, -1, {}))
    assert {n: t.error_code for n, t in r.items()} == {"orders": 0, "events": 0}
    assert partition_dirs(log_dir, "orders") == ["orders-0", "orders-1", "orders-2"]
    assert manager.get_log(TopicPartition("orders", 2)).config.get("retention.ms") == 12345
    assert ctx.metadata.topic("events").partitions == 1  # num.partitions default
    if version >= 5:
        orders = r["orders"]
        assert (orders.num_partitions, orders.replication_factor) == (3, 1)
        retention = next(c for c in orders.configs if c.name == "retention.ms")
        assert (retention.value, retention.config_source) == ("12345", ConfigSource.TOPIC_CONFIG)
        segment = next(c for c in orders.configs if c.name == "segment.bytes")
        assert segment.config_source == ConfigSource.DEFAULT_CONFIG
    if version >= 7:
        assert r["orders"].topic_id == ctx.metadata.topic("orders").topic_id != ZERO_UUID


@pytest.mark.parametrize("version", [2, 7])
def test_create_topics_answers_each_bad_topic_with_kafkas_error(broker, version):
    ctx, _, log_dir = broker
    create(ctx, version, ("exists", 1, 1, {}))
    r = create(ctx, version, ("exists", 1, 1, {}), ("rf2", 1, 2, {}), ("zero", 0, 1, {}),
               ("badcfg", 1, 1, {"retention.ms": "soon"}), ("unknowncfg", 1, 1, {"nope": "1"}),
               ("bad name!", 1, 1, {}), ("good", 2, 1, {}))
    codes = {n: t.error_code for n, t in r.items()}
    assert codes == {"exists": ErrorCode.TOPIC_ALREADY_EXISTS,
                     "rf2": ErrorCode.INVALID_REPLICATION_FACTOR,
                     "zero": ErrorCode.INVALID_PARTITIONS, "badcfg": ErrorCode.INVALID_CONFIG,
                     "unknowncfg": ErrorCode.INVALID_CONFIG,
                     "bad name!": ErrorCode.INVALID_TOPIC_EXCEPTION, "good": 0}
    assert all(t.error_message for n, t in r.items() if n != "good")
    assert sorted(ctx.metadata.topics()) == ["exists", "good"]


def test_create_topics_rejects_every_entry_of_a_duplicated_name(broker):
    ctx, _, _ = broker
    r = send(ctx, ApiKey.CREATE_TOPICS, 7, timeout_ms=1000, validate_only=False, topics=tuple(
        nested(ApiKey.CREATE_TOPICS, 7, "topics", name="twice", num_partitions=1,
               replication_factor=1, configs=(), assignments=()) for _ in range(2)))
    assert [t.error_code for t in r.topics] == [ErrorCode.INVALID_REQUEST] * 2
    assert ctx.metadata.topic("twice") is None


def test_create_topics_validate_only_reports_the_topic_and_creates_nothing(broker):
    ctx, _, log_dir = broker
    r = create(ctx, 7, ("dry", 4, 1, {"cleanup.policy": "compact"}), validate_only=True)
    assert (r["dry"].error_code, r["dry"].num_partitions) == (0, 4)
    assert next(c.value for c in r["dry"].configs if c.name == "cleanup.policy") == "compact"
    assert ctx.metadata.topic("dry") is None and partition_dirs(log_dir, "dry") == []


def test_create_topics_with_a_manual_assignment_places_every_partition_here(broker):
    ctx, _, log_dir = broker
    r = create(ctx, 7, ("manual", -1, -1, {}, [[1], [1]]), ("elsewhere", -1, -1, {}, [[2]]),
               ("mixed", 2, -1, {}, [[1]]), ("twice", -1, -1, {}, [[1, 1]]))
    assert r["manual"].error_code == 0 and partition_dirs(log_dir, "manual") == ["manual-0", "manual-1"]
    assert r["elsewhere"].error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert r["mixed"].error_code == ErrorCode.INVALID_REQUEST
    assert r["twice"].error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT


# ---- DeleteTopics ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(ApiKey.DELETE_TOPICS))
def test_delete_topics_removes_the_topic_and_its_logs(broker, version):
    ctx, manager, log_dir = broker
    create(ctx, 7, ("doomed", 2, 1, {}), ("kept", 1, 1, {}))
    doomed_id = ctx.metadata.topic("doomed").topic_id
    if version >= 6:
        topics = (nested(ApiKey.DELETE_TOPICS, version, "topics", name=None, topic_id=doomed_id),
                  nested(ApiKey.DELETE_TOPICS, version, "topics", name="missing", topic_id=ZERO_UUID),
                  nested(ApiKey.DELETE_TOPICS, version, "topics", name=None, topic_id=uuid.uuid4()))
        r = send(ctx, ApiKey.DELETE_TOPICS, version, topics=topics, timeout_ms=1000)
        assert [(x.name, x.error_code) for x in r.responses] == [
            ("doomed", 0), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            (None, ErrorCode.UNKNOWN_TOPIC_ID)]
        assert r.responses[0].topic_id == doomed_id
    else:
        r = send(ctx, ApiKey.DELETE_TOPICS, version, topic_names=("doomed", "missing"),
                 timeout_ms=1000)
        assert [(x.name, x.error_code) for x in r.responses] == [
            ("doomed", 0), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert sorted(ctx.metadata.topics()) == ["kept"]
    assert manager.get_log(TopicPartition("doomed", 0)) is None
    assert partition_dirs(log_dir, "doomed") == []  # renamed to ...-delete at once
    assert partition_dirs(log_dir, "kept") == ["kept-0"]


def test_delete_topics_refuses_a_name_and_an_id_together(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("both", 1, 1, {}))
    topic_id = ctx.metadata.topic("both").topic_id
    r = send(ctx, ApiKey.DELETE_TOPICS, 6, timeout_ms=1000, topics=(
        nested(ApiKey.DELETE_TOPICS, 6, "topics", name="both", topic_id=topic_id),))
    assert r.responses[0].error_code == ErrorCode.INVALID_REQUEST
    assert ctx.metadata.topic("both") is not None


# ---- CreatePartitions --------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(ApiKey.CREATE_PARTITIONS))
def test_create_partitions_grows_the_topic_and_creates_the_new_logs(broker, version):
    ctx, _, log_dir = broker
    create(ctx, 7, ("grow", 1, 1, {}), ("same", 2, 1, {}))

    def topic(name, count, assignments=None):
        return nested(ApiKey.CREATE_PARTITIONS, version, "topics", name=name, count=count,
                      assignments=None if assignments is None else tuple(
                          nested(ApiKey.CREATE_PARTITIONS, version, "topics.assignments",
                                 broker_ids=tuple(a)) for a in assignments))

    r = send(ctx, ApiKey.CREATE_PARTITIONS, version, timeout_ms=1000, validate_only=False,
             topics=(topic("grow", 3, [[1], [1]]), topic("same", 2), topic("missing", 2),
                     topic("same", 5)))
    assert [(x.name, x.error_code) for x in r.results] == [
        ("grow", 0), ("same", ErrorCode.INVALID_REQUEST),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), ("same", ErrorCode.INVALID_REQUEST)]
    assert partition_dirs(log_dir, "grow") == ["grow-0", "grow-1", "grow-2"]
    r = send(ctx, ApiKey.CREATE_PARTITIONS, version, timeout_ms=1000, validate_only=False,
             topics=(topic("same", 2), topic("grow", 5, [[1]])))
    assert [x.error_code for x in r.results] == [ErrorCode.INVALID_PARTITIONS,
                                                 ErrorCode.INVALID_REPLICA_ASSIGNMENT]
    assert ctx.metadata.topic("grow").partitions == 3


# ---- DescribeConfigs ---------------------------------------------------------------------------

def describe(ctx, version, *resources, synonyms=False, docs=False):
    return send(ctx, ApiKey.DESCRIBE_CONFIGS, version, include_synonyms=synonyms,
                include_documentation=docs, resources=tuple(
                    nested(ApiKey.DESCRIBE_CONFIGS, version, "resources", resource_type=t,
                           resource_name=n, configuration_keys=keys)
                    for t, n, keys in resources)).results


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_configs_shows_topic_overrides_with_their_source_and_synonyms(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("described", 1, 1, {"retention.ms": "5000"}))
    [topic] = describe(ctx, version, (TOPIC, "described", None), synonyms=True, docs=True)
    entries = {c.name: c for c in topic.configs}
    assert topic.error_code == 0 and "segment.bytes" in entries
    retention = entries["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == \
        ("5000", ConfigSource.TOPIC_CONFIG, False)
    assert [s.name for s in retention.synonyms][:1] == ["retention.ms"]
    assert "log.retention.hours" in [s.name for s in retention.synonyms]
    if version >= 3:
        assert retention.config_type == 5  # LONG
    [only] = describe(ctx, version, (TOPIC, "described", ("cleanup.policy",)))
    assert [(c.name, c.value) for c in only.configs] == [("cleanup.policy", "delete")]


def test_describe_configs_answers_each_resource_on_its_own(broker):
    ctx, _, _ = broker
    results = describe(ctx, 4, (TOPIC, "missing", None), (BROKER, "1", ("log.dirs",)),
                       (BROKER, "2", None), (BROKER, "", None), (BROKER_LOGGER, "1", None),
                       (GROUP, "g", None))
    codes = [r.error_code for r in results]
    assert codes == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0, ErrorCode.INVALID_REQUEST, 0, 0,
                     ErrorCode.INVALID_REQUEST]
    [log_dirs] = results[1].configs
    assert (log_dirs.name, log_dirs.read_only, log_dirs.config_source) == \
        ("log.dirs", True, ConfigSource.STATIC_BROKER_CONFIG)
    assert results[3].configs == ()  # no dynamic cluster-wide defaults
    loggers = {c.name: c.value for c in results[4].configs}
    assert loggers["root"] in {"DEBUG", "INFO", "WARN", "ERROR", "FATAL"}


# ---- AlterConfigs / IncrementalAlterConfigs ----------------------------------------------------

@pytest.mark.parametrize("version", versions(ApiKey.ALTER_CONFIGS))
def test_alter_configs_replaces_the_whole_override_set_and_reaches_the_logs(broker, version):
    ctx, manager, _ = broker
    create(ctx, 7, ("altered", 1, 1, {"retention.ms": "5000", "cleanup.policy": "compact"}))

    def resource(name, **configs):
        return nested(ApiKey.ALTER_CONFIGS, version, "resources", resource_type=TOPIC,
                      resource_name=name, configs=tuple(
                          nested(ApiKey.ALTER_CONFIGS, version, "resources.configs", name=k, value=v)
                          for k, v in configs.items()))

    r = send(ctx, ApiKey.ALTER_CONFIGS, version, validate_only=False,
             resources=(resource("altered", **{"retention.ms": "7000"}),
                        resource("missing", **{"retention.ms": "1"})))
    assert [x.error_code for x in r.responses] == [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert ctx.metadata.topic("altered").configs == {"retention.ms": "7000"}
    ulog = manager.get_log(TopicPartition("altered", 0))
    assert ulog.config.get("retention.ms") == 7000 and ulog.config.get("cleanup.policy") == ["delete"]
    r = send(ctx, ApiKey.ALTER_CONFIGS, version, validate_only=False,
             resources=(resource("altered", **{"retention.ms": "-5x"}),))
    assert r.responses[0].error_code == ErrorCode.INVALID_CONFIG
    assert ctx.metadata.topic("altered").configs == {"retention.ms": "7000"}


@pytest.mark.parametrize("version", versions(ApiKey.INCREMENTAL_ALTER_CONFIGS))
def test_incremental_alter_configs_sets_deletes_and_appends(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("inc", 1, 1, {"retention.ms": "5000"}))

    def op(name, operation, value=None):
        return nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, version, "resources.configs", name=name,
                      config_operation=operation, value=value)

    def alter(resource_type, name, *ops, validate_only=False):
        return send(ctx, ApiKey.INCREMENTAL_ALTER_CONFIGS, version, validate_only=validate_only,
                    resources=(nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, version, "resources",
                                      resource_type=resource_type, resource_name=name,
                                      configs=tuple(ops)),)).responses[0]

    assert alter(TOPIC, "inc", op("retention.ms", 1), op("cleanup.policy", 2, "compact")).error_code == 0
    assert ctx.metadata.topic("inc").configs == {"cleanup.policy": "delete,compact"}
    assert alter(TOPIC, "inc", op("segment.ms", 0, "1000"), validate_only=True).error_code == 0
    assert "segment.ms" not in ctx.metadata.topic("inc").configs
    assert alter(TOPIC, "inc", op("segment.ms", 0, "1"), op("segment.ms", 1)).error_code == \
        ErrorCode.INVALID_REQUEST
    assert alter(BROKER, "1", op("log.retention.ms", 0, "1")).error_code == ErrorCode.INVALID_REQUEST
    logger = logging.getLogger("strata.test.admin")
    assert alter(BROKER_LOGGER, "1", op("strata.test.admin", 0, "ERROR")).error_code == 0
    assert logger.level == logging.ERROR
    assert alter(BROKER_LOGGER, "1", op("strata.test.admin", 0, "LOUD")).error_code == \
        ErrorCode.INVALID_CONFIG
    assert alter(BROKER_LOGGER, "1", op("strata.test.admin", 1)).error_code == 0
    assert logger.level == logging.NOTSET


# ---- DeleteRecords -----------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions(ApiKey.DELETE_RECORDS))
def test_delete_records_moves_the_log_start_offset(broker, version):
    ctx, manager, _ = broker
    create(ctx, 7, ("trim", 2, 1, {}))
    # past retention.ms: the answer is still the offset asked for (retention has its own task)
    old = int(time.time() * 1000) - 8 * 86_400_000
    records = [SimpleRecord(b"v%d" % i, None, (), old) for i in range(10)]
    for p in (0, 1):
        assert ctx.replica_manager.append(TopicPartition("trim", p), build_batch(records),
                                          produce_version=9).error == 0

    def delete(*partitions, topic="trim"):
        r = send(ctx, ApiKey.DELETE_RECORDS, version, timeout_ms=1000, topics=(
            nested(ApiKey.DELETE_RECORDS, version, "topics", name=topic, partitions=tuple(
                nested(ApiKey.DELETE_RECORDS, version, "topics.partitions", partition_index=p,
                       offset=o) for p, o in partitions)),))
        return [(x.partition_index, x.error_code, x.low_watermark) for x in r.topics[0].partitions]

    assert delete((0, 4), (1, -1), (2, 0)) == [
        (0, 0, 4), (1, 0, 10), (2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)]
    assert manager.get_log(TopicPartition("trim", 0)).log_start_offset == 4
    assert delete((0, 11)) == [(0, ErrorCode.OFFSET_OUT_OF_RANGE, -1)]
    assert delete((0, 0), topic="__consumer_offsets") == [(0, ErrorCode.INVALID_TOPIC_EXCEPTION, -1)]


# ---- DescribeCluster, OffsetForLeaderEpoch, Metadata authorized operations ---------------------

@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_CLUSTER))
def test_describe_cluster_names_this_broker_as_the_controller(broker, version):
    ctx, _, _ = broker
    r = send(ctx, ApiKey.DESCRIBE_CLUSTER, version, include_cluster_authorized_operations=True)
    assert (r.error_code, r.cluster_id, r.controller_id) == (0, ctx.metadata.cluster_id, 1)
    assert [(b.broker_id, b.host, b.port) for b in r.brokers] == [(1, "broker.example", 9093)]
    assert r.cluster_authorized_operations == authz.CLUSTER
    if version >= 1:
        r = send(ctx, ApiKey.DESCRIBE_CLUSTER, version, include_cluster_authorized_operations=False,
                 endpoint_type=2)
        assert r.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_FOR_LEADER_EPOCH))
def test_offset_for_leader_epoch_answers_the_end_of_the_current_epoch(broker, version):
    ctx, _, _ = broker
    create(ctx, 7, ("epochs", 1, 1, {}))
    batch = build_batch([SimpleRecord(b"v", None, (), 1_700_000_000_000)] * 7)
    assert ctx.replica_manager.append(TopicPartition("epochs", 0), batch, produce_version=9).error == 0

    def ask(partition, current, epoch):
        r = send(ctx, ApiKey.OFFSET_FOR_LEADER_EPOCH, version, replica_id=-1, topics=(
            nested(ApiKey.OFFSET_FOR_LEADER_EPOCH, version, "topics", topic="epochs", partitions=(
                nested(ApiKey.OFFSET_FOR_LEADER_EPOCH, version, "topics.partitions",
                       partition=partition, current_leader_epoch=current, leader_epoch=epoch),)),))
        p = r.topics[0].partitions[0]
        return p.error_code, p.leader_epoch, p.end_offset

    assert ask(0, 0, 0) == (0, 0, 7)
    assert ask(0, -1, 0) == (0, 0, 7)
    assert ask(0, -1, 5) == (0, -1, -1)
    assert ask(0, 1, 0)[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert ask(3, 0, 0)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_metadata_reports_authorized_operations_when_asked(broker):
    ctx, _, _ = broker
    create(ctx, 7, ("ops", 1, 1, {}))
    topic = nested(ApiKey.METADATA, 10, "topics", name="ops", topic_id=ZERO_UUID)
    r = send(ctx, ApiKey.METADATA, 10, topics=(topic,), allow_auto_topic_creation=False,
             include_cluster_authorized_operations=True, include_topic_authorized_operations=True)
    assert r.cluster_authorized_operations == authz.CLUSTER
    assert r.topics[0].topic_authorized_operations == authz.TOPIC
    r = send(ctx, ApiKey.METADATA, 10, topics=(topic,), allow_auto_topic_creation=False,
             include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    assert r.topics[0].topic_authorized_operations == authz.OMITTED
