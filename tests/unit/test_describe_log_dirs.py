"""DescribeLogDirs over a real ClusterMetadata, LogManager (two log dirs) and ReplicaManager,
through the Dispatcher as bytes both ways, in every advertised version; and KIP-1066's
cordoned log dirs (``cordoned.log.dirs``), which v5 reports and new partitions avoid."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from strata.broker.metadata_publisher import TopicLogsPublisher
from strata.cluster.metadata import OP_DELETE, OP_SET, ClusterMetadata
from strata.common.errors import ErrorCode, KafkaError
from strata.common.scheduler import KafkaScheduler
from strata.common.types import TopicPartition
from strata.log.log_manager import LogManager
from strata.protocol.codec import API_VERSIONS, ApiKey
from strata.protocol.records import SimpleRecord, build_batch
from strata.replication.replica_manager import ReplicaManager
from strata.server.context import BrokerContext
from strata.server.dispatch import advertised_versions
from test_group_handlers import Client
from support.replicas import follow_grants

API = ApiKey.DESCRIBE_LOG_DIRS
VERSIONS = list(range(API_VERSIONS[API][0], API_VERSIONS[API][1] + 1))


@pytest.fixture
def broker(tmp_path):
    dirs = [tmp_path / "logs-a", tmp_path / "logs-b"]
    for d in dirs:
        d.mkdir()
    props = {"node.id": "1", "log.dirs": ",".join(map(str, dirs))}
    metadata = ClusterMetadata(dirs[0], 1, props)
    scheduler = KafkaScheduler(threads=1)
    manager = LogManager(dirs, metadata.default_log_config(), topic_config=metadata.log_config,
                         scheduler=scheduler)
    manager.startup()
    metadata.add_listener(TopicLogsPublisher(manager, metadata))
    replicas = follow_grants(metadata, ReplicaManager(
        manager, lambda t: (i.partitions if (i := metadata.topic(t)) else None),
        broker_id=metadata.node_id))
    ctx = BrokerContext(node_id=1, advertised_host="broker.example", advertised_port=9093,
                        metadata=metadata, replica_manager=replicas)
    metadata.create_topic("orders", 3)
    metadata.create_topic("events", 1)
    for n, tp in ((5, TopicPartition("orders", 0)), (2, TopicPartition("orders", 2)),
                  (7, TopicPartition("events", 0))):
        for i in range(n):
            replicas.append(tp, build_batch([SimpleRecord(b"v" * (100 + i), b"k%d" % i)]),
                            produce_version=None)
    yield ctx, manager, dirs
    scheduler.shutdown(run_pending=False)
    manager.shutdown()


def describe(ctx, version, topics: dict[str, list[int]] | None):
    """The response to a DescribeLogDirs for ``topics`` (None: every partition)."""
    client = Client(ctx)
    if topics is not None:
        topics = tuple(client.nested(API, version, "topics", topic=name, partitions=tuple(parts))
                       for name, parts in topics.items())
    return asyncio.run(client.send(API, version, topics=topics))


def on_disk(manager, tp) -> tuple[str, int]:
    """(absolute log dir, bytes of the partition's segment files) as the files say."""
    ulog = manager.get_log(tp)
    return (str(ulog.directory.parent.absolute()),
            sum(p.stat().st_size for p in ulog.directory.glob("*.log")))


def sizes(result) -> dict[tuple[str, int], tuple[str, int, int, bool]]:
    return {(t.name, p.partition_index): (r.log_dir, p.partition_size, p.offset_lag, p.is_future_key)
            for r in result.results for t in r.topics for p in t.partitions}


def test_describe_log_dirs_is_advertised_as_versions_1_to_5():
    assert advertised_versions()[API] == (1, 5)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_partition_is_reported_under_its_log_dir_with_its_local_size(broker, version):
    ctx, manager, dirs = broker
    r = describe(ctx, version, None)
    assert [res.log_dir for res in r.results] == [str(d.absolute()) for d in dirs]
    assert all(res.error_code == ErrorCode.NONE for res in r.results)
    got = sizes(r)
    want = {}
    for tp in manager.partitions():
        log_dir, size = on_disk(manager, tp)
        want[(tp.topic, tp.partition)] = (log_dir, size, 0, False)
    assert got == want
    assert got[("orders", 0)][1] > got[("orders", 2)][1] > 0 and got[("orders", 1)][1] == 0
    # each partition appears once, in the dir its files are in
    assert sum(len(t.partitions) for res in r.results for t in res.topics) == len(want)


@pytest.mark.parametrize("version", VERSIONS)
def test_only_the_requested_partitions_are_described_and_unknown_ones_are_left_out(broker, version):
    ctx, manager, _ = broker
    r = describe(ctx, version, {"orders": [0, 2, 9], "nope": [0]})
    assert set(sizes(r)) == {("orders", 0), ("orders", 2)}
    assert sizes(r)[("orders", 0)][1] == on_disk(manager, TopicPartition("orders", 0))[1]
    # a dir holding none of them is still listed, with no topics
    assert len(r.results) == 2


def test_version_4_reports_the_volume_total_and_usable_bytes(broker):
    ctx, _, dirs = broker
    r = describe(ctx, 4, None)
    for res, d in zip(r.results, dirs):
        st = os.statvfs(d)
        assert res.total_bytes == st.f_blocks * st.f_frsize
        # free space moves while the test runs: bounded by the volume, and positive here
        assert 0 < res.usable_bytes <= res.total_bytes


def test_versions_before_4_carry_no_volume_sizes(broker):
    ctx, _, _ = broker
    r = describe(ctx, 3, None)
    assert not hasattr(r.results[0], "total_bytes")


def test_an_unreadable_log_dir_answers_kafka_storage_error_and_the_others_still_answer(broker):
    ctx, manager, dirs = broker
    manager.log_dirs.append(Path(dirs[0].parent / "gone"))   # configured but missing
    try:
        r = describe(ctx, 4, None)
    finally:
        manager.log_dirs.pop()   # the manager's shutdown writes checkpoints into every dir
    by_dir = {res.log_dir: res for res in r.results}
    gone = by_dir[str((dirs[0].parent / "gone").absolute())]
    assert gone.error_code == ErrorCode.KAFKA_STORAGE_ERROR and gone.topics == ()
    assert by_dir[str(dirs[0].absolute())].error_code == ErrorCode.NONE


def cordon(ctx, value: str | None) -> None:
    op = OP_DELETE if value is None else OP_SET
    ctx.metadata.alter_broker_configs("1", [("cordoned.log.dirs", op, value)], True)


def test_version_5_says_which_log_dirs_are_cordoned_and_new_partitions_avoid_them(broker):
    ctx, manager, dirs = broker
    cordon(ctx, str(dirs[0]))
    r = describe(ctx, 5, None)
    assert [(res.log_dir, res.is_cordoned) for res in r.results] == [
        (str(dirs[0].absolute()), True), (str(dirs[1].absolute()), False)]
    assert not hasattr(describe(ctx, 4, None).results[0], "is_cordoned")
    before = {tp: on_disk(manager, tp)[0] for tp in manager.partitions()}
    ctx.metadata.create_topic("fresh", 4)
    placed = {on_disk(manager, TopicPartition("fresh", p))[0] for p in range(4)}
    assert placed == {str(dirs[1].absolute())}
    assert {tp: on_disk(manager, tp)[0] for tp in before} == before   # the old logs stay

    cordon(ctx, "*")                  # every dir: no new partition on this broker
    assert all(res.is_cordoned for res in describe(ctx, 5, None).results)
    with pytest.raises(KafkaError) as info:
        ctx.metadata.create_topic("refused", 1)
    assert info.value.code is ErrorCode.INVALID_REPLICATION_FACTOR
    assert str(info.value) == ("Unable to replicate the partition 1 time(s): All brokers are "
                               "currently fenced, or have all their log directories cordoned.")
    cordon(ctx, None)
    assert not any(res.is_cordoned for res in describe(ctx, 5, None).results)
    ctx.metadata.create_topic("again", 2)
    assert {on_disk(manager, TopicPartition("again", p))[0] for p in range(2)} == {
        str(dirs[0].absolute())}      # back to the emptier dir


def test_cordoned_log_dirs_must_name_log_dirs_as_kafka_checks_them(broker, tmp_path):
    ctx, _, dirs = broker
    for value, message in (
            ("/elsewhere", "Invalid value /elsewhere for configuration cordoned.log.dirs: Invalid "
                           "entry in cordoned.log.dirs: /elsewhere. All cordoned log dirs must be "
                           "entries of log.dirs or log.dir."),
            (f"*,{dirs[0]}", "When cordoned.log.dirs is set to *, it must not contain other "
                             "values")):
        with pytest.raises(KafkaError) as info:
            cordon(ctx, value)
        assert info.value.code is ErrorCode.INVALID_REQUEST and str(info.value) == message
    (entry,) = ctx.metadata.describe_broker_configs(["cordoned.log.dirs"])
    assert (entry.value, entry.read_only) == ("", False)
    # at startup a bad value stops the broker, with KafkaConfig's message
    props = {"log.dirs": str(dirs[0]), "cordoned.log.dirs": f"{dirs[0]},/x"}
    with pytest.raises(ValueError, match=r"Missing entries : \[/x\]"):
        ClusterMetadata(tmp_path / "other", 2, props)
