"""``__remote_log_metadata`` in a cluster: ClusterMetadataTopicLog against a real Strata broker
process, and the topic-based RLMM over a remote topic log (here an in-memory fake): start does
not block, a background consumer applies what other brokers publish, readiness waits for the
end offset read after the assignment, close stops the threads."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import NewTopic

from broker_process import BrokerProcess, free_port
from cluster_clients import NO_TIERING, admin, partitions, wait_for
from strata.common.clock import SYSTEM_CLOCK, MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.protocol import records as rec
from strata.tiered.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemoteStorageException,
    RemoteStorageNotReadyException,
    TopicIdPartition,
)
from strata.tiered.metadata.cluster_topic_log import ClusterMetadataTopicLog, parse_fetched
from strata.tiered.metadata.serde import serialize
from strata.tiered.metadata.topic_based import (
    FAILING_WARN_AFTER_MS,
    FAILING_WARN_EVERY_MS,
    TopicBasedRemoteLogMetadataManager,
)
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME as TOPIC
from strata.tiered.metadata.topic_log import InMemoryMetadataTopicLog

S = RemoteLogSegmentState
NUM_PARTITIONS = 3
WAIT_S = 20


def tip(topic: str = "orders", partition: int = 0, topic_id: int = 0xC0FFEE) -> TopicIdPartition:
    return TopicIdPartition(uuid.UUID(int=topic_id), TopicPartition(topic, partition))


TIP = tip()


def segment(start: int, end: int, partition: TopicIdPartition = TIP) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate_new(partition), start, end,
                                    5_000 + end, 1, 4_000, 1000, segment_leader_epochs={0: start})


def finished(m: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(m.remote_log_segment_id, 6_000, None,
                                          S.COPY_SEGMENT_FINISHED, 1)


def manager(topic_log, log_dir, broker_id: int = 1, clock=SYSTEM_CLOCK,
            **extra) -> TopicBasedRemoteLogMetadataManager:
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log, clock=clock)
    rlmm.configure({"remote.log.metadata.topic.num.partitions": NUM_PARTITIONS,
                    "log.dir": str(log_dir), "broker.id": broker_id,
                    "remote.log.metadata.poll.interval.ms": 20,
                    "remote.log.metadata.initialization.retry.interval.ms": 20, **extra})
    return rlmm


def copy(rlmm, m: RemoteLogSegmentMetadata) -> None:
    rlmm.add_remote_log_segment_metadata(m).result(0)
    rlmm.update_remote_log_segment_metadata(finished(m)).result(0)


# --------------------------------------------------------------------------- a fake remote log


class FakeRemoteTopicLog(InMemoryMetadataTopicLog):
    """InMemoryMetadataTopicLog marked remote, with switches: creation refused until
    ``creatable`` is set, reads of a partition in ``hidden`` see nothing, every read is
    recorded with its thread, ``end_offset`` calls are counted, partitions in ``leaderless``
    fail as ClusterMetadataTopicLog does once it gives up on a partition with no leader."""

    remote = True

    def __init__(self) -> None:
        super().__init__()
        self.creatable = threading.Event()
        self.creatable.set()
        self.create_attempts = 0
        self.hidden: set[int] = set()
        self.reads: list[tuple[str, int]] = []
        self.end_offset_calls: dict[int, int] = {}
        self.closed = threading.Event()
        self.block_reads = False
        self.leaderless: set[int] = set()
        self.leaderless_calls = 0

    def log_start_offset(self, partition: int) -> int:
        if partition in self.leaderless:
            self.leaderless_calls += 1
            raise RemoteStorageException(f"listing the earliest offset of {TOPIC}-{partition}: "
                                         "gave up: _Retry: the partition has no leader")
        return super().log_start_offset(partition)

    def ensure_topic(self, num_partitions: int, retention_ms: int = -1) -> int:
        self.create_attempts += 1
        if not self.creatable.is_set():
            raise RemoteStorageNotReadyException("Number of alive brokers '1' does not meet the "
                                                 "required replication factor '3'")
        return super().ensure_topic(num_partitions, retention_ms)

    def read(self, partition: int, start_offset: int):
        self.reads.append((threading.current_thread().name, partition))
        if self.block_reads:  # as a call stuck on a connection until close shuts it down
            self.closed.wait()
            raise RemoteStorageException("closed")
        if partition in self.hidden:
            return iter(())
        return super().read(partition, start_offset)

    def end_offset(self, partition: int) -> int:
        self.end_offset_calls[partition] = self.end_offset_calls.get(partition, 0) + 1
        return super().end_offset(partition)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def fake() -> FakeRemoteTopicLog:
    return FakeRemoteTopicLog()


@pytest.fixture
def rlmm(fake, tmp_path):
    m = manager(fake, tmp_path)
    m.start()
    yield m
    m.close()


def loaded(rlmm) -> bool:
    return all(rlmm.read_offset(p) is not None for p in range(NUM_PARTITIONS))


def test_start_returns_at_once_and_readiness_comes_once_the_topic_can_be_created(fake, tmp_path):
    fake.creatable.clear()
    rlmm = manager(fake, tmp_path)
    rlmm.on_partition_leadership_changes({TIP}, set())
    started = time.monotonic()
    rlmm.start()
    assert time.monotonic() - started < 1
    wait_for("a few creation attempts", lambda: fake.create_attempts >= 3, WAIT_S, 0.01)
    assert not rlmm.is_ready(TIP)
    assert not rlmm.wait_ready(TIP, 0.05)
    with pytest.raises(RemoteStorageNotReadyException):
        rlmm.list_remote_log_segments(TIP)
    with pytest.raises(RemoteStorageNotReadyException):
        rlmm.add_remote_log_segment_metadata(segment(0, 9))
    fake.creatable.set()
    assert rlmm.wait_ready(TIP, WAIT_S)
    assert fake.num_partitions == NUM_PARTITIONS
    m = segment(0, 9)
    copy(rlmm, m)
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5).remote_log_segment_id == m.remote_log_segment_id
    rlmm.close()


def test_the_consumer_applies_what_another_broker_appends_and_reads_stay_local(rlmm, fake):
    rlmm.on_partition_leadership_changes(set(), {TIP})
    assert rlmm.wait_ready(TIP, WAIT_S)
    mp = rlmm.metadata_partition(TIP)
    m = segment(0, 9)
    fake.append(mp, serialize(m))            # published by another broker
    fake.append(mp, serialize(finished(m)))
    found = wait_for("the other broker's segment", lambda: rlmm.remote_log_segment_metadata(TIP, 0, 5),
                     WAIT_S, 0.01)
    assert found.state is S.COPY_SEGMENT_FINISHED
    # reads serve the applied state: no read of the log from this (the caller's) thread
    fake.hidden.add(mp)
    fake.append(mp, serialize(segment(10, 19)))
    before = len(fake.reads)
    assert len(list(rlmm.list_remote_log_segments(TIP))) == 1
    assert rlmm.highest_offset_for_epoch(TIP, 0) == 9
    assert all(name != threading.current_thread().name for name, _ in fake.reads[before:])
    fake.hidden.discard(mp)
    wait_for("the third record", lambda: len(list(rlmm.list_remote_log_segments(TIP))) == 2, WAIT_S, 0.01)


def test_a_ready_listener_hears_of_each_partition_once_it_is_loaded(fake, tmp_path):
    fake.creatable.clear()
    rlmm = manager(fake, tmp_path)
    heard: list = []
    rlmm.add_ready_listener(heard.append)
    rlmm.on_partition_leadership_changes(set(), {TIP})
    rlmm.start()
    try:
        wait_for("a few creation attempts", lambda: fake.create_attempts >= 2, WAIT_S, 0.01)
        assert heard == [] and not rlmm.is_ready(TIP)
        fake.creatable.set()
        wait_for("the notice", lambda: heard == [TIP], WAIT_S, 0.01)
        assert rlmm.is_ready(TIP)
        other = tip("other", 0)
        rlmm.on_partition_leadership_changes(set(), {other})
        wait_for("the second notice", lambda: heard == [TIP, other], WAIT_S, 0.01)
    finally:
        rlmm.close()


def test_the_consumer_reads_only_metadata_partitions_in_use(rlmm, fake):
    rlmm.on_partition_leadership_changes({TIP}, set())
    assert rlmm.wait_ready(TIP, WAIT_S)
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    mine = rlmm.metadata_partition(TIP)
    other = next(t for t in (tip("x", p) for p in range(50)) if rlmm.metadata_partition(t) != mine)
    fake.append(rlmm.metadata_partition(other), serialize(segment(0, 9, other)))
    before = len(fake.reads)
    wait_for("more consumer rounds", lambda: len(fake.reads) >= before + 5, WAIT_S, 0.01)
    consumer = [p for name, p in fake.reads[before:] if name.startswith("rlmm-consumer")]
    assert consumer and set(consumer) == {mine}
    assert rlmm.poll() == 1  # an explicit poll reads every metadata partition
    assert len(list(rlmm.list_remote_log_segments(other))) == 1


def test_readiness_waits_for_the_end_offset_read_after_the_assignment(rlmm, fake):
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    mp = rlmm.metadata_partition(TIP)
    m = segment(0, 9)
    fake.append(mp, serialize(m))
    fake.append(mp, serialize(finished(m)))
    fake.hidden.add(mp)            # this broker's reads lag behind the leader
    calls = fake.end_offset_calls.get(mp, 0)
    rlmm.on_partition_leadership_changes({TIP}, set())
    wait_for("the end offset read", lambda: fake.end_offset_calls.get(mp, 0) > calls, WAIT_S, 0.01)
    assert not rlmm.wait_ready(TIP, 0.1)
    fake.hidden.discard(mp)
    assert rlmm.wait_ready(TIP, WAIT_S)
    # ready means applied up to that end offset: the other broker's copy is visible
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5).state is S.COPY_SEGMENT_FINISHED

    # an assigned follower stays ready; a new leadership waits for a fresh end offset
    rlmm.on_partition_leadership_changes(set(), {TIP})
    assert rlmm.is_ready(TIP)
    fake.hidden.add(mp)
    later = segment(10, 19)
    fake.append(mp, serialize(later))
    rlmm.on_partition_leadership_changes({TIP}, set())
    assert not rlmm.is_ready(TIP)
    assert not rlmm.wait_ready(TIP, 0.1)
    fake.hidden.discard(mp)
    assert rlmm.wait_ready(TIP, WAIT_S)
    assert len(list(rlmm.list_remote_log_segments(TIP))) == 2

    rlmm.on_stop_partitions({TIP})
    assert not rlmm.is_ready(TIP)
    assert rlmm.assigned_partitions() == frozenset()


def test_a_partition_never_assigned_is_not_ready(rlmm):
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    assert not rlmm.is_ready(tip("never"))
    assert list(rlmm.list_remote_log_segments(tip("never"))) == []  # reads are served


def test_a_publish_applies_its_record_before_it_returns(rlmm, fake):
    rlmm.on_partition_leadership_changes({TIP}, set())
    assert rlmm.wait_ready(TIP, WAIT_S)
    m = segment(0, 9)
    copy(rlmm, m)
    assert rlmm.remote_log_segment_metadata(TIP, 0, 9).state is S.COPY_SEGMENT_FINISHED
    assert fake.values(rlmm.metadata_partition(TIP)) == [serialize(m), serialize(finished(m))]


def test_a_publish_waits_for_a_leader_whose_high_watermark_trails(rlmm, fake, monkeypatch):
    assert rlmm.wait_ready(TIP, 0) is False
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    mp = rlmm.metadata_partition(TIP)
    real_read, real_append = fake.read, fake.append
    lag = {"reads": 0}

    def append(partition, value):
        lag["reads"] = 3   # the next reads do not reach the appended record yet
        return real_append(partition, value)

    def read(partition, start):
        if partition == mp and lag["reads"] > 0:
            lag["reads"] -= 1
            return iter(())
        return real_read(partition, start)
    monkeypatch.setattr(fake, "append", append)
    monkeypatch.setattr(fake, "read", read)
    m = segment(0, 9)
    rlmm.add_remote_log_segment_metadata(m).result(0)
    assert list(rlmm.list_remote_log_segments(TIP)) == [m]
    assert lag["reads"] == 0


def test_a_retried_append_that_stored_the_record_twice_is_applied_once(rlmm, fake, monkeypatch):
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    real_append = fake.append

    def twice(partition, value):  # the first attempt's answer was lost, the retry landed too
        real_append(partition, value)
        return real_append(partition, value)
    monkeypatch.setattr(fake, "append", twice)
    m = segment(0, 9)
    copy(rlmm, m)
    mp = rlmm.metadata_partition(TIP)
    assert len(fake.values(mp)) == 4
    assert [s.state for s in rlmm.list_remote_log_segments(TIP)] == [S.COPY_SEGMENT_FINISHED]
    assert rlmm.highest_offset_for_epoch(TIP, 0) == 9


def test_an_append_that_gave_up_after_its_record_landed_counts_as_applied(rlmm, fake, monkeypatch):
    wait_for("the loader done", lambda: loaded(rlmm), WAIT_S, 0.01)
    real_append = fake.append

    def landed_then_gave_up(partition, value):
        real_append(partition, value)
        raise RemoteStorageException("appending: gave up after 5 attempt(s)")
    monkeypatch.setattr(fake, "append", landed_then_gave_up)
    m = segment(0, 9)
    rlmm.add_remote_log_segment_metadata(m).result(0)
    assert list(rlmm.list_remote_log_segments(TIP)) == [m]

    monkeypatch.setattr(fake, "append", lambda p, v: (_ for _ in ()).throw(
        RemoteStorageException("appending: gave up")))
    with pytest.raises(RemoteStorageException, match="gave up"):
        rlmm.update_remote_log_segment_metadata(finished(m)).result(0)
    assert rlmm.remote_log_segment_metadata(TIP, 0, 5) is None


def test_snapshots_work_with_a_remote_log(fake, tmp_path):
    first = manager(fake, tmp_path)
    first.start()
    wait_for("loaded", lambda: loaded(first), WAIT_S, 0.01)
    made = [segment(i * 10, i * 10 + 9) for i in range(3)]
    for m in made:
        copy(first, m)
    first.close()
    second = manager(fake, tmp_path / "other")
    again = manager(fake, tmp_path)
    for later in (second, again):
        later.on_partition_leadership_changes({TIP}, set())
        later.start()
        assert later.wait_ready(TIP, WAIT_S)
        wait_for("loaded", lambda: loaded(later), WAIT_S, 0.01)
        assert [s.remote_log_segment_id for s in later.list_remote_log_segments(TIP)] == \
            [m.remote_log_segment_id for m in made]
    assert second.replayed_records == 6 and second.snapshot_offsets == {}
    assert again.replayed_records == 0
    assert again.snapshot_offsets == {first.metadata_partition(TIP): 6}
    second.close()
    again.close()


def test_close_stops_the_threads_promptly_even_when_a_read_is_stuck(fake, tmp_path):
    fake.creatable.clear()
    idle = manager(fake, tmp_path)
    idle.start()
    wait_for("creation retried", lambda: fake.create_attempts >= 2, WAIT_S, 0.01)
    started = time.monotonic()
    idle.close()
    assert time.monotonic() - started < 5
    assert fake.closed.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("rlmm-") and t.is_alive()]

    stuck_log = FakeRemoteTopicLog()
    stuck = manager(stuck_log, tmp_path / "stuck")
    stuck_log.block_reads = True  # the loader's replay hangs on its first read
    stuck.start()
    wait_for("a read in progress", lambda: stuck_log.reads, WAIT_S, 0.01)
    started = time.monotonic()
    stuck.close()
    assert time.monotonic() - started < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("rlmm-") and t.is_alive()]
    with pytest.raises(RemoteStorageException):
        stuck.list_remote_log_segments(TIP)
    assert not stuck.wait_ready(TIP, 1)


def test_a_metadata_partition_failing_to_load_is_a_warning_after_a_while_then_throttled(
        fake, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="strata.tiered.metadata.topic_based")
    clock = MockClock()
    fake.leaderless = {1}
    rlmm = manager(fake, tmp_path, clock=clock)
    rlmm.start()

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and f"{TOPIC}-1" in r.getMessage()]
    try:
        wait_for("the others loaded, 1 retried", lambda: rlmm.read_offset(0) is not None
                 and rlmm.read_offset(2) is not None and fake.leaderless_calls >= 3, WAIT_S, 0.01)
        assert warnings() == []   # a failure of a start that has not lasted is no warning
        clock.advance_ms(FAILING_WARN_AFTER_MS)
        first = wait_for("a warning", warnings, WAIT_S, 0.01)
        assert first == [f"loading {TOPIC}-1 has been failing for {FAILING_WARN_AFTER_MS // 1000} s "
                         f"(retrying): RemoteStorageException: listing the earliest offset of "
                         f"{TOPIC}-1: gave up: _Retry: the partition has no leader"]
        calls = fake.leaderless_calls
        wait_for("more attempts", lambda: fake.leaderless_calls >= calls + 3, WAIT_S, 0.01)
        assert len(warnings()) == 1   # throttled
        clock.advance_ms(FAILING_WARN_EVERY_MS)
        wait_for("the next warning", lambda: len(warnings()) == 2, WAIT_S, 0.01)
        fake.leaderless.clear()
        wait_for("1 loaded", lambda: rlmm.read_offset(1) is not None, WAIT_S, 0.01)
        total = (FAILING_WARN_AFTER_MS + FAILING_WARN_EVERY_MS) // 1000
        assert f"loading {TOPIC}-1 succeeded after failing for {total} s" in caplog.messages
    finally:
        rlmm.close()


# --------------------------------------------------------------------------- parsing


def test_parse_fetched_skips_control_batches_and_records_before_the_start():
    data = (rec.build_batch([rec.SimpleRecord(b"a"), rec.SimpleRecord(b"b")], base_offset=10)
            + rec.build_control_batch(rec.CONTROL_COMMIT, producer_id=7, producer_epoch=0,
                                      base_offset=12)
            + rec.build_batch([rec.SimpleRecord(None), rec.SimpleRecord(b"d")], base_offset=13,
                              compression=rec.Compression.GZIP))
    found, next_offset = parse_fetched(data, 11)
    assert found == [(11, b"b"), (13, b""), (14, b"d")]
    assert next_offset == 15
    partial = data[:-5]   # a batch cut short by the response size is left for the next fetch
    assert parse_fetched(partial, 10) == ([(10, b"a"), (11, b"b")], 13)
    assert parse_fetched(None, 4) == ([], 4)


# --------------------------------------------------------------------------- a real broker


def create_topic_via(bootstrap: str, replication_factor: int):
    """``create_topic`` as the broker's: CreateTopics, an existing topic kept as it is."""
    def create_topic(num_partitions: int, configs: dict[str, str]) -> int:
        futures = admin(bootstrap).create_topics(
            [NewTopic(TOPIC, num_partitions, replication_factor, config=configs)])
        try:
            futures[TOPIC].result(30)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == ErrorCode.INVALID_REPLICATION_FACTOR:
                raise KafkaError(str(exc), code=ErrorCode.COORDINATOR_NOT_AVAILABLE) from exc
            if code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
        return len(partitions(bootstrap, TOPIC))
    return create_topic


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("rlmm-broker"), dict(NO_TIERING)) as b:
        yield b


@pytest.fixture
def client(broker):
    address = ("127.0.0.1", broker.port)
    topic_log = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: address,
                                        client_id="test-rlmm", min_insync_replicas=1,
                                        deadline_ms=20_000)
    assert topic_log.ensure_topic(NUM_PARTITIONS) == NUM_PARTITIONS
    yield topic_log
    topic_log.close()


def test_against_a_broker_the_topic_is_created_with_kafkas_configs(broker, client):
    assert client.ensure_topic(NUM_PARTITIONS + 2) == NUM_PARTITIONS  # an existing topic stays
    from confluent_kafka.admin import ConfigResource
    resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    described = admin(broker.bootstrap).describe_configs([resource])[resource].result(30)
    got = {k: described[k].value for k in ("cleanup.policy", "retention.ms", "remote.storage.enable",
                                           "min.insync.replicas")}
    assert got == {"cleanup.policy": "delete", "retention.ms": "-1", "remote.storage.enable": "false",
                   "min.insync.replicas": "1"}


def test_against_a_broker_appends_are_read_back_in_order(client):
    start = client.end_offset(0)
    offsets = [client.append(0, b"value-%d" % i) for i in range(5)]
    assert offsets == list(range(start, start + 5))
    assert client.end_offset(0) == start + 5
    assert list(client.read(0, start + 2)) == [(start + i, b"value-%d" % i) for i in range(2, 5)]
    assert list(client.read(0, start + 5)) == []
    assert client.log_start_offset(0) == 0


def test_against_a_broker_reads_span_many_fetches_and_compressed_batches(broker):
    address = ("127.0.0.1", broker.port)
    small = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: address,
                                    min_insync_replicas=1, fetch_max_bytes=200)
    try:
        small.ensure_topic(NUM_PARTITIONS)
        start = small.end_offset(1)
        for codec in (rec.Compression.GZIP, rec.Compression.ZSTD, rec.Compression.NONE):
            batch = rec.build_batch([rec.SimpleRecord(b"%s-%d" % (codec.name.encode(), i) * 8)
                                     for i in range(4)], compression=codec)
            assert produce_raw(broker.bootstrap, 1, batch) == ErrorCode.NONE
        got = list(small.read(1, start))
        assert [o for o, _ in got] == list(range(start, start + 12))
        assert got[0][1] == b"GZIP-0" * 8 and got[-1][1] == b"NONE-3" * 8
    finally:
        small.close()


def produce_raw(bootstrap: str, partition: int, batch: bytes) -> int:
    import datetime
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.produce.v9.response import ProduceResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i32
    from strata.net.connection import roundtrip
    resp = roundtrip(bootstrap, ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(TopicProduceData(name=TopicName(TOPIC), partition_data=(
            PartitionProduceData(index=i32(partition), records=batch),)),)), ProduceResponse)
    return int(resp.responses[0].partition_responses[0].error_code)


def test_against_a_broker_a_read_below_the_log_start_starts_at_the_log_start(broker, client):
    for i in range(4):
        client.append(2, b"old-%d" % i)
    end = client.end_offset(2)
    (result,) = admin(broker.bootstrap).delete_records([CkTopicPartition(TOPIC, 2, end - 1)]).values()
    result.result(30)
    assert client.log_start_offset(2) == end - 1
    assert list(client.read(2, 0)) == [(end - 1, b"old-3")]


def test_against_a_broker_missing_leaders_and_refused_connections_are_retried(broker, client):
    # ``client`` made the topic: this test alone must not depend on an earlier one's
    address = ("127.0.0.1", broker.port)
    dead = ("127.0.0.1", free_port())
    answers = iter([None, dead, None, dead])
    topic_log = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1),
                                        lambda p: next(answers, address), min_insync_replicas=1,
                                        retry_backoff_ms=10, deadline_ms=20_000)
    try:
        offset = topic_log.append(0, b"after retries")
        assert list(topic_log.read(0, offset)) == [(offset, b"after retries")]
    finally:
        topic_log.close()


def test_against_a_broker_lasting_errors_raise_at_once_and_missing_leaders_at_the_deadline(broker):
    address = ("127.0.0.1", broker.port)
    topic_log = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: address,
                                        min_insync_replicas=1, deadline_ms=20_000)
    leaderless = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: None,
                                         retry_backoff_ms=10, deadline_ms=300)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteStorageException, match="MESSAGE_TOO_LARGE"):
            topic_log.append(0, b"x" * (2 << 20))
        with pytest.raises(RemoteStorageException, match="UNKNOWN_TOPIC_OR_PARTITION|gave up"):
            ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: address,
                                    deadline_ms=300).end_offset(NUM_PARTITIONS + 7)
        assert time.monotonic() - started < 10
        with pytest.raises(RemoteStorageException, match="no leader"):
            leaderless.end_offset(0)
        topic_log.close()
        with pytest.raises(RemoteStorageException, match="closed"):
            topic_log.end_offset(0)
    finally:
        topic_log.close()
        leaderless.close()


def test_against_a_broker_a_metadata_partition_without_a_leader_does_not_hold_up_the_others(
        broker, client, tmp_path):
    """A restarted broker whose disk was replaced: a metadata partition whose only in-sync
    replica was on that disk has no leader. The loader meets it first, and the partition
    assigned meanwhile is ready all the same, although this client's calls retry for two
    minutes (the deadline publishes get)."""
    address = ("127.0.0.1", broker.port)
    asked: list[int] = []

    def leader_of(partition: int):
        asked.append(partition)
        return None if partition == 0 else address
    topic_log = ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), leader_of,
                                        min_insync_replicas=1, deadline_ms=120_000)
    rlmm = manager(topic_log, tmp_path)
    wanted = next(t for t in (tip("wiped", p) for p in range(64)) if rlmm.metadata_partition(t) != 0)
    try:
        rlmm.start()
        wait_for("the loader at partition 0", lambda: 0 in asked, WAIT_S, 0.01)
        rlmm.on_partition_leadership_changes(set(), {wanted})   # as a replica is assigned
        assert rlmm.wait_ready(wanted, WAIT_S)
        assert rlmm.read_offset(0) is None
    finally:
        rlmm.close()


def test_against_a_broker_two_managers_see_each_others_records(broker, client, tmp_path):
    address = ("127.0.0.1", broker.port)

    def topic_log():
        return ClusterMetadataTopicLog(create_topic_via(broker.bootstrap, 1), lambda p: address,
                                       min_insync_replicas=1, deadline_ms=20_000)
    one, two = manager(topic_log(), tmp_path / "one", 1), manager(topic_log(), tmp_path / "two", 2)
    partition = tip("shared", 0, 0xABCDEF)
    try:
        for m in (one, two):
            m.on_partition_leadership_changes({partition}, set())
            m.start()
        assert one.wait_ready(partition, WAIT_S) and two.wait_ready(partition, WAIT_S)
        m = segment(0, 99, partition)
        copy(one, m)
        found = wait_for("the segment on the other manager",
                         lambda: two.remote_log_segment_metadata(partition, 0, 50), WAIT_S, 0.02)
        assert found.remote_log_segment_id == m.remote_log_segment_id
        assert two.highest_offset_for_epoch(partition, 0) == 99
    finally:
        one.close()
        two.close()
