"""``ReplicaOffsetsLog``: ``__consumer_offsets`` on real partition logs, for the group coordinator."""

from __future__ import annotations

import asyncio

import pytest

from strata.cluster.metadata import ClusterMetadata
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.coordinator.group import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    OffsetCommitPartition,
)
from strata.coordinator.offsets_log import ReplicaOffsetsLog
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.protocol import records as rec
from strata.replication.replica_manager import ReplicaManager
from support.replicas import follow_grants


class Broker:
    """The storage half of a broker, as ``Broker.build`` wires it."""

    def __init__(self, path, props=None):
        self.props = dict(props or {})
        self.metadata = ClusterMetadata(path, 1, self.props)
        self.manager = LogManager([path], self.metadata.default_log_config(),
                                  topic_config=self.metadata.log_config)
        self.manager.startup()
        self.metadata.add_listener(self)
        self.replica_manager = follow_grants(self.metadata, ReplicaManager(
            self.manager, lambda t: (i.partitions if (i := self.metadata.topic(t)) else None),
            broker_id=1))

    def on_topic_created(self, info) -> None:
        for p in range(info.partitions):
            self.manager.get_or_create_log(TopicPartition(info.name, p),
                                           self.metadata.log_config(info.name))

    def offsets_log(self, **kw) -> ReplicaOffsetsLog:
        return ReplicaOffsetsLog(self.replica_manager, self.metadata, self.props, **kw)

    def shutdown(self) -> None:
        self.manager.shutdown()


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path, {"offsets.topic.num.partitions": "3"})
    yield b
    b.shutdown()


def run(coro):
    return asyncio.run(coro)


def test_ensure_topic_creates_a_compacted_offsets_topic_with_the_configured_partitions(broker):
    assert broker.offsets_log().ensure_topic() == 3
    info = broker.metadata.topic(OFFSETS_TOPIC)
    assert info.partitions == 3
    assert info.configs == {"cleanup.policy": "compact", "segment.bytes": "104857600",
                            "compression.type": "producer"}
    assert broker.metadata.log_config(OFFSETS_TOPIC).is_compacted
    # an existing topic keeps its partition count, whatever the configuration says now
    broker.props["offsets.topic.num.partitions"] = "7"
    assert broker.offsets_log().ensure_topic() == 3


def test_the_default_is_fifty_partitions(tmp_path):
    b = Broker(tmp_path)
    try:
        assert b.offsets_log().ensure_topic() == 50
    finally:
        b.shutdown()


def test_appended_records_and_tombstones_replay_in_order_in_small_chunks(broker):
    log = broker.offsets_log(chunk_bytes=64)
    log.ensure_topic()
    batches = [[(b"k%d" % i, b"v%d" % i) for i in range(j, j + 3)] for j in range(0, 30, 3)]
    batches.append([(b"k0", None)])

    async def append_all():
        for records in batches:
            await log.append(1, records)
    run(append_all())
    assert list(log.replay(1)) == [r for records in batches for r in records]
    assert list(log.replay(0)) == []
    ulog = broker.replica_manager.get_log(TopicPartition(OFFSETS_TOPIC, 1))
    headers = list(rec.iter_headers(ulog.read(0, 1 << 20).records))
    assert len(headers) == len(batches)
    assert all(h.producer_id == -1 and not h.is_transactional for h in headers)


def test_append_to_a_missing_partition_raises_the_logs_error_code(broker):
    log = broker.offsets_log()
    log.ensure_topic()
    with pytest.raises(KafkaError) as err:
        run(log.append(5, [(b"k", b"v")]))
    assert err.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_replay_keeps_committed_transactions_and_drops_aborted_and_open_ones(broker):
    log = broker.offsets_log(chunk_bytes=100)
    log.ensure_topic()
    tp = TopicPartition(OFFSETS_TOPIC, 0)

    def txn(pid, *records):
        return rec.build_batch([rec.SimpleRecord(v, k) for k, v in records], producer_id=pid,
                               producer_epoch=0, base_sequence=0, transactional=True)

    def marker(pid, kind):
        return rec.build_control_batch(kind, producer_id=pid, producer_epoch=0)

    def append(batch, origin=AppendOrigin.COORDINATOR):
        assert broker.replica_manager.append(tp, batch, produce_version=None,
                                             origin=origin).error == ErrorCode.NONE

    run(log.append(0, [(b"plain-1", b"1")]))
    append(txn(7, (b"committed", b"c")), AppendOrigin.CLIENT)
    append(txn(8, (b"aborted", b"a")), AppendOrigin.CLIENT)
    run(log.append(0, [(b"plain-2", b"2")]))
    append(marker(8, rec.CONTROL_ABORT))
    append(marker(7, rec.CONTROL_COMMIT))
    append(txn(9, (b"open", b"o")), AppendOrigin.CLIENT)
    assert list(log.replay(0)) == [(b"plain-1", b"1"), (b"plain-2", b"2"), (b"committed", b"c")]


def test_a_coordinator_on_a_restarted_broker_finds_its_committed_offsets(tmp_path):
    props = {"offsets.topic.num.partitions": "4"}

    async def commit():
        b = Broker(tmp_path, props)
        log = b.offsets_log()
        gc = GroupCoordinator(log, GroupCoordinatorConfig(offsets_topic_num_partitions=log.ensure_topic()))
        gc.load()
        errors = await gc.commit_offsets("g", "", -1, [OffsetCommitPartition("t", 0, 42, 3, "meta")])
        assert errors == {("t", 0): ErrorCode.NONE}
        gc.shutdown()
        b.shutdown()

    async def fetch():
        b = Broker(tmp_path, props)
        log = b.offsets_log()
        gc = GroupCoordinator(log, GroupCoordinatorConfig(offsets_topic_num_partitions=log.ensure_topic()))
        gc.load()
        result = gc.fetch_offsets("g", [("t", 0)])
        gc.shutdown()
        b.shutdown()
        return result

    run(commit())
    result = run(fetch())
    assert result.error == ErrorCode.NONE
    assert result.offsets[("t", 0)][:3] == (42, 3, "meta")


def test_a_new_leader_replays_up_to_its_log_end_not_its_lagging_high_watermark(broker):
    """Kafka's loaders read to the log end: a broker just elected leader has a high watermark
    one follower fetch behind its log end, and the records in between were acknowledged (a
    PrepareCommit, an offset commit). Before, a coordinator failed over right after a commit
    loaded the state before it: a committed transaction was then aborted on timeout."""
    for log in (broker.offsets_log(), ReplicaOffsetsLog.for_transaction_state(
            broker.replica_manager, broker.metadata, {"transaction.state.log.num.partitions": "2"})):
        log.ensure_topic()
        run(log.append(0, [(b"k", b"old")]))
        ulog = broker.replica_manager.get_log(TopicPartition(log.topic, 0))
        acknowledged = ulog.high_watermark
        run(log.append(0, [(b"k", b"new")]))
        ulog.update_high_watermark(acknowledged)   # as on a replica that just became leader
        assert ulog.high_watermark < ulog.log_end_offset
        assert list(log.replay(0)) == [(b"k", b"old"), (b"k", b"new")]
        assert [(r.key, r.value) for r in log.replay_batches(0)] == [(b"k", b"old"), (b"k", b"new")]
