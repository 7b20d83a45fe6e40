"""KIP-405's follower scenarios and Apache Kafka's multi-broker tiered-storage integration tests,
on broker processes with a real ZooKeeper and a shared filesystem remote tier (issue 27).

One cluster of three brokers serves the module (racks r1, r2, r3, Kafka's rack-aware replica
selector). Each test's topic lives on brokers 1 and 2 (the KIP's brokers A and B) unless the
scenario moves it; broker 3 holds the third replica of ``__remote_log_metadata`` (replication
factor 3, min.insync.replicas 2), so tiering goes on while A or B is down.

The KIP's tables have three-record segments; here segments are 16 KiB (small producer
batches), so offsets are hundreds, not units. Where the tables give offsets and epochs, the
tests assert the same relations: which epochs each replica's ``leader-epoch-checkpoint`` holds
and from which offset, where a replica's local log starts against the leader's, and that every
record is read once, in order, at its offset, from the remote tier and the local one.

KIP-405 ("Follower fetch scenarios"):
- scenario 1, a new empty follower (a replica added by reassignment);
- scenario 2.1, an out-of-sync follower whose log still reaches the leader's local log start;
- scenario 2.2, one whose log the leader's local retention has passed;
- scenario 3, multiple hard failures (KIP-101's scenario 2 with tiering);
- scenario 4, an unclean leader election with truncation;
- scenario 5, log divergence in the remote tier after two unclean elections.

Kafka's ``storage/src/test/java/org/apache/kafka/tiered/storage/integration/``:
ReassignToEmptyReplicaTest / ReassignReplicaExpandTest, ReassignReplicaMoveTest,
ReassignReplicaShrinkTest, the preferred leader election of CanFetchFromTieredStorageAfter-
RecoveryOfLocalSegmentsTest, OffloadAndConsumeFromFollowerTest (KIP-392), DeleteTopicTest,
DeleteSegmentsByRetentionTimeTest and FetchFromLeaderWithCorruptedCheckpointTest; and
leadership moving back and forth while a producer writes and the leaders tier.

Two tests are about broker restarts: a restarted broker's logs keep their topic's configs
(the logs load after the ZooKeeper view: loaded with the broker defaults, a tiered log moved its
log start offset past what only the remote tier held, and the expirer then deleted that), and a
controlled shutdown does not wait minutes for a copier blocked publishing remote metadata.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ElectionType, Producer, TopicPartition as CTopicPartition
from confluent_kafka.admin import NewTopic
from kio.schema.alter_partition_reassignments.v0.request import (
    AlterPartitionReassignmentsRequest, ReassignablePartition, ReassignableTopic)
from kio.schema.alter_partition_reassignments.v0.response import (
    AlterPartitionReassignmentsResponse)
from kio.schema.delete_topics.v4.request import DeleteTopicsRequest
from kio.schema.delete_topics.v4.response import DeleteTopicsResponse
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig, AlterConfigsResource, IncrementalAlterConfigsRequest)
from kio.schema.incremental_alter_configs.v1.response import IncrementalAlterConfigsResponse
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic)
from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32
from prometheus_client.parser import text_string_to_metric_families
from zk_server import zookeeper_available

from cluster_clients import admin, partitions, wait_for
from cluster_process import StrataCluster, metadata_node_ids
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip
from strata.protocol import records as rec
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState,
    RemotePartitionDeleteMetadata, RemotePartitionDeleteState)
from strata.tiered.metadata.serde import deserialize
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME
from tiered_support import TIERED_BROKER, metadata_topic_records

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
SEGMENT = 16 * 1024
METADATA_PARTITIONS = 5
A, B, C = 1, 2, 3          # the KIP's broker A, broker B, and the third broker
RACKS = {A: "r1", B: "r2", C: "r3"}

# Every tiered topic of this module: small segments, everything tiered leaves the local log
# (local.retention.bytes 1), acks=all needs only the leader (min.insync.replicas 1).
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "segment.index.bytes": "4096", "local.retention.bytes": "1",
                "min.insync.replicas": "1"}
OVERRIDES = {
    **TIERED_BROKER,
    "log.remote.storage.enable": "false",          # only the topics that ask are tiered
    "rlmm.config.remote.log.metadata.topic.num.partitions": str(METADATA_PARTITIONS),
    "remote.log.metadata.topic.replication.factor": "3",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "auto.leader.rebalance.enable": "false",       # leaders move only when a test moves them
    "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    racks = {n: {"broker.rack": r} for n, r in RACKS.items()}
    with StrataCluster(tmp_path_factory.mktemp("tiered-scenarios"), brokers=3, overrides=OVERRIDES,
                       broker_overrides=racks, metrics=True) as c:
        yield c


@pytest.fixture(autouse=True)
def whole_cluster(cluster):
    """Each test starts with every broker up and every metadata partition fully replicated
    (a test that failed half way may have left a broker down)."""
    for b in cluster.brokers:
        if not b.running:
            b.start()
    cluster.wait_metadata()
    wait_for("__remote_log_metadata fully in sync", lambda: all(
        sorted(p.isr) == sorted(cluster.node_ids)
        for p in partitions(cluster.bootstrap, REMOTE_LOG_METADATA_TOPIC_NAME).values()), timeout=60)
    created.clear()
    yield
    # the next tests stop and restart brokers: this test's topics would only add work
    if created:
        delete_topics(cluster, list(created))


created: list[str] = []


# --------------------------------------------------------------------------- clients


def keys(prefix: str, n: int) -> list[bytes]:
    return [b"%s%06d" % (prefix.encode(), i) for i in range(n)]


def produce(bootstrap: str, topic: str, ks: list[bytes], partition: int = 0,
            timestamp: int | None = None, partial: bool = False) -> list[bytes]:
    """Idempotent acks=all, in small batches (so 16 KiB segments roll); the keys acknowledged,
    in order. Unless ``partial``, a record not acknowledged fails the test with the errors the
    producer was given."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 1, "batch.num.messages": 20, "message.timeout.ms": 60000})
    acked: list[bytes] = []
    errors: dict[str, int] = defaultdict(int)

    def delivered(err, msg) -> None:
        if err is None:
            acked.append(msg.key())
        else:
            errors[str(err)] += 1
    extra = {} if timestamp is None else {"timestamp": timestamp}
    for k in ks:
        producer.produce(topic, key=k, value=k * 8, partition=partition, **extra,
                         on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(90)
    assert partial or (not errors and not left), (
        f"{topic}-{partition}: {len(ks) - len(acked)} of {len(ks)} not acknowledged "
        f"({left} undelivered after 90 s); errors: {dict(errors)}")
    return acked


def consume(bootstrap: str, topic: str, expect: int, start: int = 0, partition: int = 0,
            rack: str | None = None, timeout: float = 60) -> list[tuple[int, bytes]]:
    """(offset, key) of ``expect`` records of one partition from ``start`` (fewer if ``timeout``
    passes first); with ``rack``, a KIP-392 consumer in that rack."""
    conf = {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10}
    if rack is not None:
        conf["client.rack"] = rack
    consumer = Consumer(conf)
    consumer.assign([CTopicPartition(topic, partition, start)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.key()))
    finally:
        consumer.close()
    return got


def numbered(ks: list[bytes], start: int = 0) -> list[tuple[int, bytes]]:
    return [(start + i, k) for i, k in enumerate(ks)]


def create(cluster, topic: str, assignment: list[list[int]], **configs: str) -> None:
    config = {**TIERED_TOPIC, **{k.replace("_", "."): v for k, v in configs.items()}}
    created.append(topic)
    admin(cluster.bootstrap).create_topics(
        [NewTopic(topic, num_partitions=len(assignment), replica_assignment=assignment,
                  config=config)])[topic].result(30)
    for p, replicas in enumerate(assignment):
        wait_for(f"{topic}-{p} led by {replicas[0]} with ISR {replicas}", lambda p=p, r=replicas: (
            (m := state(cluster, topic, p)).leader == r[0] and sorted(m.isr) == sorted(r)))


def stable(cluster):
    """Broker C when it runs (the tests never stop it but the last one), else any running
    broker. Requests a client library would route to the controller go here instead: a
    cached client may wait a minute for a controller that was just killed, and a broker just
    started may not have read ZooKeeper yet; any Strata broker serves them."""
    return cluster.broker(C) if cluster.broker(C).running else \
        next(b for b in cluster.brokers if b.running)


def alter_topic(cluster, topic: str, **configs: str) -> None:
    """IncrementalAlterConfigs (SET) of topic configs, retried while the cluster settles."""
    request = IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
        resource_type=i8(2), resource_name=topic, configs=tuple(
            AlterableConfig(name=k.replace("_", "."), config_operation=i8(0), value=v)
            for k, v in configs.items())),), validate_only=False)

    def altered():
        (r,) = roundtrip(stable(cluster).bootstrap, request, IncrementalAlterConfigsResponse,
                         timeout=40).responses
        assert r.error_code == ErrorCode.NONE, r
        return True
    wait_for(f"{topic} altered to {configs}", altered, timeout=60)


def delete_topics(cluster, topics: list[str]) -> None:
    """DeleteTopics; errors (a topic already gone, no broker up) ignored."""
    if not any(b.running for b in cluster.brokers):
        return
    try:
        roundtrip(stable(cluster).bootstrap, DeleteTopicsRequest(
            topic_names=tuple(TopicName(t) for t in topics),
            timeout=datetime.timedelta(seconds=30)), DeleteTopicsResponse, timeout=40)
    except OSError:
        pass


def running(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers if b.running)


def state(cluster, topic: str, partition: int = 0):
    """Leader, replicas, ISR and leader epoch as a running broker answers Metadata."""
    return partitions(running(cluster), topic)[partition]


def leader_is(cluster, topic: str, node: int, partition: int = 0) -> bool:
    return all(partitions(b.bootstrap, topic)[partition].leader == node
               for b in cluster.brokers if b.running)


def reassign(cluster, topic: str, targets: dict[int, list[int]]) -> None:
    """AlterPartitionReassignments (KIP-455) sent to the active controller."""
    via = next(b for b in cluster.brokers if b.running)
    controller = metadata_node_ids(via.bootstrap)[1]
    resp = roundtrip(cluster.broker(controller).bootstrap, AlterPartitionReassignmentsRequest(
        timeout=datetime.timedelta(seconds=30), topics=(ReassignableTopic(
            name=TopicName(topic), partitions=tuple(
                ReassignablePartition(partition_index=i32(p),
                                      replicas=tuple(BrokerId(r) for r in replicas))
                for p, replicas in targets.items())),)), AlterPartitionReassignmentsResponse)
    assert resp.error_code == ErrorCode.NONE, resp
    for t in resp.responses:
        for p in t.partitions:
            assert p.error_code == ErrorCode.NONE, p


def elect_preferred(cluster, topic: str, partition_ids: list[int]) -> None:
    result = admin(running(cluster)).elect_leaders(
        ElectionType.PREFERRED, [CTopicPartition(topic, p) for p in partition_ids]).result(30)
    for tp, err in result.items():
        assert err is None or err.code() == 84, (tp, err)   # 84: ELECTION_NOT_NEEDED


def expect_leader(cluster, topic: str, node: int, partition: int = 0) -> None:
    """Kafka's ExpectLeaderAction with electLeader: the replica list reordered to put ``node``
    first (a reassignment), then a preferred leader election."""
    wait_for(f"{node} in the ISR of {topic}-{partition}",
             lambda: node in state(cluster, topic, partition).isr, timeout=60)
    replicas = state(cluster, topic, partition).replicas
    reassign(cluster, topic, {partition: [node] + [r for r in replicas if r != node]})
    wait_for("the reordered replicas", lambda: state(cluster, topic, partition).replicas[0] == node)
    elect_preferred(cluster, topic, [partition])
    wait_for(f"{node} leads {topic}-{partition}", lambda: leader_is(cluster, topic, node, partition))


# --------------------------------------------------------------------------- a replica's state


def tiered_state(broker, topic: str, partition: int = 0) -> dict:
    """The broker's own view of its replica (metrics endpoint ``/tiered/<topic>``): log start,
    local log start, high watermark, log end, highest offset in remote storage, segments."""
    with urllib.request.urlopen(f"{broker.metrics_url}/tiered/{topic}", timeout=10) as r:
        doc = json.load(r)
    return next(p for p in doc["partitions"] if p["partition"] == partition)


def epochs(broker, topic: str, partition: int = 0) -> list[tuple[int, int]]:
    """The replica's leader-epoch-checkpoint: (epoch, start offset) entries."""
    lines = (broker.log_dir / f"{topic}-{partition}" / "leader-epoch-checkpoint").read_text().split()
    count = int(lines[1])
    return [(int(lines[2 + 2 * i]), int(lines[3 + 2 * i])) for i in range(count)]


def segment_bases(broker, topic: str, partition: int = 0) -> list[int]:
    return sorted(int(p.stem) for p in (broker.log_dir / f"{topic}-{partition}").glob("*.log"))


def settled(broker, topic: str, partition: int = 0) -> dict | None:
    """The replica's state once its local log is the active segment alone and everything
    below it is in the remote tier (None before)."""
    s = tiered_state(broker, topic, partition)
    if s["local_segments"] == 1 and s["highest_offset_in_remote_storage"] == \
            s["local_log_start_offset"] - 1 and s["local_log_start_offset"] > 0:
        return s
    return None


def wait_settled(broker, topic: str, above: int = 0, partition: int = 0, timeout: float = 60) -> dict:
    """Waits until ``settled`` with the local log starting above ``above``; its state. A
    timeout says where the replica stands."""
    try:
        return wait_for(f"broker {broker.node_id}'s {topic}-{partition} settled above {above}",
                        lambda: (s := settled(broker, topic, partition))
                        and s["local_log_start_offset"] > above and s, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; state {tiered_state(broker, topic, partition)}, "
                             f"segments {segment_bases(broker, topic, partition)}") from None


def scrape(broker) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(broker.metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def counter(broker, name: str, topic: str) -> float:
    return scrape(broker).get((f"kafka_server_BrokerTopicMetrics_{name}_total",
                               (("topic", topic),)), 0.0)


# --------------------------------------------------------------------------- remote metadata


@dataclass
class RemoteSegment:
    id: str
    partition: int
    start: int
    end: int
    epochs: dict[int, int]
    broker: int
    states: list[RemoteLogSegmentState] = field(default_factory=list)

    @property
    def state(self) -> RemoteLogSegmentState:
        return self.states[-1]


@dataclass
class RemoteMetadata:
    segments: list[RemoteSegment]
    partition_states: dict[int, list[RemotePartitionDeleteState]]

    def copied(self, partition: int = 0) -> list[RemoteSegment]:
        """COPY_SEGMENT_FINISHED segments of a partition, by start offset."""
        return sorted((s for s in self.segments
                       if s.partition == partition and s.state is S.COPY_SEGMENT_FINISHED),
                      key=lambda s: (s.start, s.end))


def remote_metadata(cluster, topic: str) -> RemoteMetadata:
    """Every ``__remote_log_metadata`` record of ``topic``, read as a consumer from the
    metadata partitions' leaders, folded per segment (its states in order)."""
    values = metadata_topic_records(running(cluster), METADATA_PARTITIONS, timeout=30)
    by_id: dict[str, RemoteSegment] = {}
    deletes: dict[int, list[RemotePartitionDeleteState]] = defaultdict(list)
    for p in sorted(values):
        for _, value in values[p]:
            event = deserialize(value)
            if event.topic_id_partition.topic != topic:
                continue
            if isinstance(event, RemoteLogSegmentMetadata):
                sid = str(event.remote_log_segment_id.id)
                by_id[sid] = RemoteSegment(sid, event.topic_id_partition.partition,
                                           event.start_offset, event.end_offset,
                                           dict(event.segment_leader_epochs), event.broker_id,
                                           [event.state])
            elif isinstance(event, RemoteLogSegmentMetadataUpdate):
                by_id[str(event.remote_log_segment_id.id)].states.append(event.state)
            elif isinstance(event, RemotePartitionDeleteMetadata):
                deletes[event.topic_id_partition.partition].append(event.state)
    return RemoteMetadata(list(by_id.values()), dict(deletes))


def contiguous(segments: list[RemoteSegment], start: int = 0) -> int:
    """Asserts that ``segments`` (by start offset) cover [start, end] without gap or overlap;
    returns end."""
    expected = start
    for s in segments:
        assert s.start == expected, \
            f"remote segments {[(x.start, x.end) for x in segments]}: gap or overlap at {expected}"
        expected = s.end + 1
    return expected - 1


def remote_objects(cluster, topic: str) -> list[Path]:
    root = Path(cluster.remote_dir)
    return [p for p in root.rglob("*") if p.is_file()
            and p.relative_to(root).parts[0].startswith(f"{topic}-")]


def rebuilt_from(broker, topic: str) -> tuple[str, int, list[tuple[int, int]]]:
    """(segment id, its end offset, the leader epochs taken from it) of the broker's last
    rebuild of ``topic``'s partition 0 from the remote tier, as its log says."""
    found = re.findall(rf"{re.escape(topic)}-0: rebuilt from remote segment (\S+) \[(\d+), (\d+)\] "
                       r"\(leader epochs (\[.*?\])\)", broker.output())
    assert found, f"broker {broker.node_id} did not rebuild {topic}-0"
    sid, _, end, listed = found[-1]
    return sid, int(end), [tuple(e) for e in ast.literal_eval(listed)]


def rebuilds(broker, topic: str) -> int:
    """How many times the broker's log says it rebuilt a replica of ``topic`` from the remote tier."""
    return broker.output().count(f"{topic}-0: rebuilt from remote segment")


def stop(broker, timeout: float = 25) -> None:
    """SIGTERM (a controlled shutdown) and wait; a broker still running after ``timeout``
    writes its threads' stacks to its log (SIGUSR1) and is SIGKILLed."""
    proc = broker.process.proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1)
        hung.append(broker.node_id)
        print(f"broker {broker.node_id} did not stop within {timeout} s")
        broker.kill()
    broker.process.stop()


hung: list[int] = []


# =========================================================================== KIP-405 scenarios


def test_s1_a_replica_added_by_reassignment_rebuilds_from_the_remote_tier_and_copies_only_the_local_tail(cluster):
    """KIP-405 scenario 1 (new empty follower), as Kafka's ReassignToEmptyReplicaTest and
    ReassignReplicaExpandTest run it: a partition on A alone, tiered; B is added by
    reassignment, is told OFFSET_MOVED_TO_TIERED_STORAGE, rebuilds its leader epochs from the
    remote segment just below A's local log start and fetches from there; made leader
    (replicas reordered, preferred election), it serves every record from offset 0 through the
    remote tier and tiers on from where A stopped, without gap or overlap."""
    topic = "s1-new-follower"
    create(cluster, topic, [[A]])
    first = keys("a", 3000)
    assert produce(cluster.bootstrap, topic, first) == first
    leader, follower = cluster.broker(A), cluster.broker(B)
    lead = wait_for("A tiered everything but its active segment",
                    lambda: settled(leader, topic), timeout=60)
    local_start = lead["local_log_start_offset"]
    assert 2000 < local_start < 3000 and lead["log_start_offset"] == 0, lead
    assert epochs(leader, topic) == [(0, 0)]

    # step 1: B is added; it gets OFFSET_MOVED_TO_TIERED_STORAGE and rebuilds
    reassign(cluster, topic, {0: [A, B]})
    wait_for("B in the ISR", lambda: sorted(state(cluster, topic).isr) == [A, B], timeout=60)
    head = keys("h", 10)      # records of the reassignment's epoch (the KIP table's msg 7)
    assert produce(cluster.bootstrap, topic, head) == head
    wait_for("B caught up", lambda: tiered_state(follower, topic)["log_end_offset"] == 3010)
    # the reassignment started a new epoch at A's log end (the KIP table's LE-3 at the HW)
    e1 = state(cluster, topic).leader_epoch
    assert e1 > 0
    # step 2: B holds the leader's epochs (rebuilt below its local start, fetched after it)...
    assert epochs(follower, topic) == epochs(leader, topic) == [(0, 0), (e1, 3000)]
    # ... and only the leader's local tail: its local log starts where the leader's does
    f = tiered_state(follower, topic)
    assert f["log_start_offset"] == 0 and f["local_log_start_offset"] == local_start, f
    assert segment_bases(follower, topic)[0] == local_start
    assert rebuilds(follower, topic) == 1
    assert f"fetching from {local_start}" in follower.output()
    assert counter(follower, "BuildRemoteLogAuxStateRequestsPerSec", topic) >= 1

    # Kafka's expectLeader(broker1, electLeader=true): B leads, then tiers from A's last copy
    expect_leader(cluster, topic, B)
    second = keys("b", 1500)
    assert produce(cluster.bootstrap, topic, second) == second
    wait_for("B tiered its own segments", lambda: (s := settled(follower, topic))
             and s["local_log_start_offset"] > 4000, timeout=60)
    meta = remote_metadata(cluster, topic)
    copied = meta.copied()
    assert contiguous(copied) == tiered_state(follower, topic)["local_log_start_offset"] - 1
    assert {s.broker for s in copied if s.start < local_start} == {A}
    assert {s.broker for s in copied if s.start >= local_start} == {B}
    before = counter(follower, "RemoteFetchRequestsPerSec", topic)
    assert consume(follower.bootstrap, topic, 4510) == numbered(first + head + second)
    assert counter(follower, "RemoteFetchRequestsPerSec", topic) > before


def lead_metadata_elsewhere(cluster, node: int) -> None:
    """The ``__remote_log_metadata`` partitions broker ``node`` leads move to their next
    replica (reordered replicas, preferred election). A broker's metadata consumer blocks on a
    request to a hung leader for the request timeout (35 s), stalling tiering everywhere."""
    led = {p: m.replicas for p, m in partitions(running(cluster), REMOTE_LOG_METADATA_TOPIC_NAME).items()
           if m.leader == node}
    if not led:
        return
    reassign(cluster, REMOTE_LOG_METADATA_TOPIC_NAME,
             {p: [r for r in replicas if r != node] + [node] for p, replicas in led.items()})
    wait_for("metadata replicas reordered", lambda: all(
        state(cluster, REMOTE_LOG_METADATA_TOPIC_NAME, p).replicas[-1] == node for p in led))
    elect_preferred(cluster, REMOTE_LOG_METADATA_TOPIC_NAME, list(led))
    wait_for(f"{node} leads no metadata partition", lambda: all(
        leader_is(cluster, REMOTE_LOG_METADATA_TOPIC_NAME, state(
            cluster, REMOTE_LOG_METADATA_TOPIC_NAME, p).replicas[0], p) for p in led))


def away(cluster, node: int, topic: str):
    """Broker ``node`` stops (SIGSTOP: no restart, its logs stay loaded) until the controller
    has taken it out of ``topic``'s ISR; returns a function that brings it back. (It first
    hands over its metadata leaderships: see ``lead_metadata_elsewhere``.)"""
    broker = cluster.broker(node)
    lead_metadata_elsewhere(cluster, node)
    broker.pause()
    wait_for(f"{node} out of the ISR", lambda: node not in partitions(
        ",".join(b.bootstrap for b in cluster.brokers if b.node_id != node), topic)[0].isr)

    def back() -> None:
        broker.resume()
        wait_for(f"{node} back in the ISR", lambda: node in state(cluster, topic).isr, timeout=60)
    return back


def test_s2_1_an_out_of_sync_follower_whose_log_reaches_the_leaders_local_start_just_fetches(cluster):
    """KIP-405 scenario 2.1: B falls out of sync while A goes on (and tiers) but A's local
    log still starts at or below B's log end: B's catch-up is ordinary fetching, with no
    OFFSET_MOVED_TO_TIERED_STORAGE and no rebuild, its local segments kept (no truncation),
    ending with A's log and A's epochs."""
    topic = "s2-1-catching-up"
    create(cluster, topic, [[A, B]])
    leader, follower = cluster.broker(A), cluster.broker(B)
    first = keys("a", 2000)
    assert produce(leader.bootstrap, topic, first) == first
    wait_for("both replicas tiered or trimmed what A tiered", lambda: settled(leader, topic)
             and settled(follower, topic), timeout=60)
    # from now on A keeps its local segments: its local log start stays below B's log end
    alter_topic(cluster, topic, local_retention_bytes=str(100 << 20))
    mine = segment_bases(follower, topic)
    rebuilt = rebuilds(follower, topic)
    assert tiered_state(follower, topic)["log_end_offset"] == 2000
    back = away(cluster, B, topic)
    try:
        second = keys("b", 1000)
        assert produce(leader.bootstrap, topic, second) == second
        lead = wait_for("A tiered what B lacks", lambda: (s := tiered_state(leader, topic))
                        ["highest_offset_in_remote_storage"] >= 2500 and s, timeout=60)
        assert lead["local_log_start_offset"] <= 2000, lead     # B's log end
    finally:
        back()
    wait_for("B caught up", lambda: tiered_state(follower, topic)["log_end_offset"] == 3000)
    # When the controller took B out of the ISR on its session's expiry it started a new
    # epoch at 2000 (as Kafka's ZooKeeper controller does; the leader's own shrink after
    # replica.lag.time.max.ms does not): then B's last epoch (0) is not the leader's, the
    # leader's epoch 0 ends at B's log end, and nothing of B's is truncated (the KIP table's
    # "fetchLeaderEpochEndOffsets(LE-1) returns 5, larger than the latest local offset").
    lineage = epochs(leader, topic)
    assert lineage[0] == (0, 0) and [s for _, s in lineage[1:]] in ([], [2000]), lineage
    assert rebuilds(follower, topic) == rebuilt
    assert f"{topic}-0: offset" not in follower.output()   # never moved to tiered storage
    assert segment_bases(follower, topic)[:len(mine)] == mine   # nothing truncated
    assert epochs(follower, topic) == epochs(leader, topic)
    assert consume(leader.bootstrap, topic, 3000) == numbered(first + second)


def test_s2_2_an_out_of_sync_follower_passed_by_the_leaders_local_retention_truncates_and_rebuilds(cluster):
    """KIP-405 scenario 2.2: while B is out of sync, A's local retention deletes segments
    past B's log end. B's fetch gets OFFSET_MOVED_TO_TIERED_STORAGE: it truncates its whole
    local log, rebuilds the leader epochs from the remote segment below A's earliest local
    offset and fetches from there (then it is scenario 1): its local log starts where A's
    does, with A's epochs, log start offset and records."""
    topic = "s2-2-passed-by-retention"
    create(cluster, topic, [[A, B]])
    leader, follower = cluster.broker(A), cluster.broker(B)
    first = keys("a", 1000)
    assert produce(leader.bootstrap, topic, first) == first
    wait_for("B caught up", lambda: tiered_state(follower, topic)["log_end_offset"] == 1000)
    mine = segment_bases(follower, topic)
    rebuilt = rebuilds(follower, topic)
    back = away(cluster, B, topic)
    try:
        second = keys("b", 2000)
        assert produce(leader.bootstrap, topic, second) == second
        lead = wait_for("A's local retention passed B's log end", lambda: (
            s := settled(leader, topic)) and s["local_log_start_offset"] > 2000 and s, timeout=60)
    finally:
        back()
    wait_for("B caught up", lambda: tiered_state(follower, topic)["log_end_offset"] == 3000)
    assert f"{topic}-0: offset 1000 moved to tiered storage" in follower.output()
    assert rebuilds(follower, topic) == rebuilt + 1
    f = tiered_state(follower, topic)
    assert (f["log_start_offset"], f["local_log_start_offset"]) == (0, lead["local_log_start_offset"]), f
    assert not set(mine) & set(segment_bases(follower, topic))   # truncated fully
    assert epochs(follower, topic) == epochs(leader, topic)
    assert consume(leader.bootstrap, topic, 3000) == numbered(first + second)


def lose_unflushed_tail(broker, topic: str, at: int) -> int:
    """A stopped broker loses what it had not flushed from ``at`` on (the KIP's "messages not
    synced to the hard disk"): the segment holding ``at`` is cut at the first batch from
    there, later segments and snapshots go, and the recovery point is moved back below the
    cut segment. Returns the new log end offset."""
    d = broker.log_dir / f"{topic}-0"
    base = max(b for b in segment_bases(broker, topic) if b <= at)
    path = d / f"{base:020d}.log"
    data = path.read_bytes()
    # the first batch from ``at`` on that does not start the segment (part of it stays)
    first_lost = next(h for h in rec.iter_headers(data) if h.base_offset >= at and h.position > 0)
    os.truncate(path, first_lost.position)
    for f in list(d.iterdir()):
        stem = f.name.split(".")[0]
        if stem.isdigit() and int(stem) > base and f.suffix in (
                ".log", ".index", ".timeindex", ".txnindex", ".snapshot"):
            f.unlink()
    checkpoint = broker.log_dir / "recovery-point-offset-checkpoint"
    if checkpoint.exists():     # (none yet: everything is recovered)
        lines = checkpoint.read_text().splitlines()
        lines[2:] = [(f"{topic} 0 {min(int(line.split()[2]), base)}"
                      if line.split()[:2] == [topic, "0"] else line) for line in lines[2:]]
        checkpoint.write_text("\n".join(lines) + "\n")
    return first_lost.base_offset


def offset_for_leader_epoch(broker, topic: str, epoch: int) -> tuple[int, int]:
    """(epoch, end offset) a consumer's OffsetForLeaderEpoch v4 gets from ``broker`` (KIP-320)."""
    resp = roundtrip(broker.bootstrap, OffsetForLeaderEpochRequest(
        replica_id=BrokerId(-1), topics=(OffsetForLeaderTopic(topic=TopicName(topic), partitions=(
            OffsetForLeaderPartition(partition=i32(0), current_leader_epoch=i32(-1),
                                     leader_epoch=i32(epoch)),)),)), OffsetForLeaderEpochResponse)
    p = resp.topics[0].partitions[0]
    assert p.error_code == ErrorCode.NONE, p
    return int(p.leader_epoch), int(p.end_offset)


def within_lineage(segment: RemoteSegment, lineage: list[tuple[int, int]], log_end: int) -> bool:
    """Kafka's RemoteLogManager.isRemoteSegmentWithinLeaderEpochs: the segment's epochs are
    the log's, starting where the log's do, and it ends before the log's next epoch starts."""
    starts = dict(lineage)
    seg = sorted(segment.epochs.items())
    if seg[0][0] < lineage[0][0] or seg[-1][0] > lineage[-1][0] or segment.end >= log_end:
        return False
    for i, (epoch, start) in enumerate(seg):
        if epoch not in starts or (i == 0 and start < starts[epoch]):
            return False
        later = [s for e, s in lineage if e > epoch]
        if i + 1 == len(seg):
            if later and segment.end > later[0] - 1:
                return False
        elif seg[i + 1] != next((e, s) for e, s in lineage if e > epoch):
            return False
    return True


def test_s3_multiple_hard_failures_converge_on_the_survivors_log_in_both_tiers(cluster):
    """KIP-405 scenario 3 (KIP-101's scenario 2 with tiering). A leads, B follows, A has
    tiered segments; both are SIGKILLed and B loses its unflushed tail, which includes
    records A had tiered. B comes back first and leads at a new epoch from its shorter log,
    takes new records and tiers them; A comes back, truncates what B lost and follows. Then
    both tiers hold B's log: the leader's epoch cache says which epoch each offset belongs to,
    a consumer reading from 0 gets B's records at every offset (remote and local), the epoch
    B lost is fenced at the cut (KIP-320), and the remote segments of B's lineage cover the
    log once; those of A's lost lineage stay (Kafka's expirer deletes only what breaches
    retention or the log start offset) and are never read."""
    topic = "s3-hard-failures"
    create(cluster, topic, [[A, B]], local_retention_bytes="-2",   # both keep every segment
           unclean_leader_election_enable="true")
    a, b = cluster.broker(A), cluster.broker(B)
    first = keys("a", 3000)
    assert produce(a.bootstrap, topic, first) == first
    wait_for("B has everything", lambda: tiered_state(b, topic)["log_end_offset"] == 3000)
    tiered = wait_for("A tiered most of it", lambda: (
        h := tiered_state(a, topic)["highest_offset_in_remote_storage"]) >= 2000 and h, timeout=60)

    # step 2: both crash; B had not flushed anything from offset 1000 on
    a.kill()
    b.kill()
    cut = lose_unflushed_tail(b, topic, 1000)
    assert 1000 <= cut < tiered
    b.start()
    wait_for("B leads", lambda: leader_is(cluster, topic, B), timeout=60)
    assert tiered_state(b, topic)["log_end_offset"] == cut
    second = keys("b", 3000)
    assert produce(b.bootstrap, topic, second) == second
    epoch = state(cluster, topic).leader_epoch
    assert epochs(b, topic) == [(0, 0), (epoch, cut)]

    # step 3: A returns and truncates what B lost
    a.start()
    cluster.wait_metadata()
    wait_for("A back in the ISR", lambda: sorted(state(cluster, topic).isr) == [A, B], timeout=60)
    wait_for("A caught up", lambda: tiered_state(a, topic)["log_end_offset"] == cut + 3000)
    assert epochs(a, topic) == epochs(b, topic) == [(0, 0), (epoch, cut)]

    # step 4: the local segments below the tiered offset go (on the leader, which serves the
    # reads; A caught up in fetches larger than a segment, before its configs were applied
    # again, so its local log may be one segment)
    alter_topic(cluster, topic, local_retention_bytes="1")
    wait_settled(b, topic, above=cut + 2000)
    # the epoch B lost past the cut is fenced there (KIP-320), the new one starts there
    assert offset_for_leader_epoch(b, topic, 0) == (0, cut)
    # the remote segments of B's lineage cover its log once; A's past the cut stay, unread
    copied = wait_lineage(cluster, topic, b)
    assert contiguous(copied) == tiered_state(b, topic)["local_log_start_offset"] - 1
    assert outside_lineage(cluster, topic, b)
    # a consumer from offset 0 reads B's log, the remote tier first: at the cut, B's record
    expected = numbered(first[:cut] + second)
    assert consume(cluster.bootstrap, topic, len(expected)) == expected
    assert consume(cluster.bootstrap, topic, 1, start=cut) == [(cut, second[0])]


def in_lineage(cluster, topic: str, leader, inside: bool = True) -> list[RemoteSegment]:
    """The copied remote segments of ``topic`` within ``leader``'s epoch lineage (outside it
    with ``inside`` False), by start offset."""
    lineage = epochs(leader, topic)
    log_end = tiered_state(leader, topic)["log_end_offset"]
    return [s for s in remote_metadata(cluster, topic).copied()
            if within_lineage(s, lineage, log_end) is inside]


def outside_lineage(cluster, topic: str, leader) -> list[RemoteSegment]:
    return in_lineage(cluster, topic, leader, inside=False)


def wait_lineage(cluster, topic: str, leader) -> list[RemoteSegment]:
    """Waits until the copied remote segments within ``leader``'s epoch lineage cover its log
    from 0 to below its local log start without gap or overlap; those segments. Segments of
    another lineage stay (Kafka's rule: the expirer deletes only what breaches retention or
    the log start offset, and never a segment a later leader may own); reads never use them."""
    def covered():
        copied = in_lineage(cluster, topic, leader)
        local_start = tiered_state(leader, topic)["local_log_start_offset"]
        try:
            return copied and contiguous(copied) == local_start - 1 and copied
        except AssertionError:
            return False
    try:
        return wait_for("the leader's lineage covered by its remote segments", covered, timeout=60)
    except AssertionError as exc:
        inside = [(s.start, s.end, s.epochs) for s in in_lineage(cluster, topic, leader)]
        raise AssertionError(f"{exc}; lineage {epochs(leader, topic)}, "
                             f"segments in it: {inside}") from None


def a_tiers_past_b(cluster, topic: str, count: int):
    """The unclean scenarios' start: a topic on A and B (unclean election on, local logs from
    0), 1,000 records on both; B stops and leaves the ISR; A alone takes ``count`` more and
    tiers past B's log end. (a, b, the first records, A's own)."""
    create(cluster, topic, [[A, B]], local_retention_bytes="-2",  # local logs start at 0
           unclean_leader_election_enable="true")
    a, b = cluster.broker(A), cluster.broker(B)
    first = keys("a", 1000)
    assert produce(a.bootstrap, topic, first) == first
    wait_for("B has them", lambda: tiered_state(b, topic)["log_end_offset"] == 1000)
    stop(b)
    wait_for("B out of the ISR", lambda: state(cluster, topic).isr == [A])
    only_a = keys("x", count)
    assert produce(a.bootstrap, topic, only_a) == only_a
    wait_for("A tiered past B's log end", lambda: tiered_state(
        a, topic)["highest_offset_in_remote_storage"] >= count, timeout=60)
    return a, b, first, only_a


def test_s4_unclean_election_makes_the_out_of_sync_replicas_log_the_truth_in_both_tiers(cluster):
    """KIP-405 scenario 4 (min.insync.replicas 1, unclean.leader.election.enable): B falls
    out of sync; A alone takes more records and tiers past B's log end; A stops and B, out of
    sync, is elected. B's log is the truth: it leads at a new epoch from its shorter log, takes
    new records and tiers them from where its own epoch 0 ends; A's remote segments past that
    stay, outside B's lineage, and are never read; a consumer reads B's records at every offset (the offset's epoch in B's cache
    decides, KIP table: offset 1 gives msg 4, not msg 1). A returns, truncates what B never had
    and ends with B's log and epochs, which it serves as a KIP-392 follower."""
    topic = "s4-unclean-election"
    # step 1: B is out of sync; A alone takes records and tiers past B's log end
    a, b, first, only_a = a_tiers_past_b(cluster, topic, 2000)
    # step 2: A stops; B, out of sync, is elected
    stop(a)
    b.start()
    wait_for("B leads (unclean)", lambda: leader_is(cluster, topic, B), timeout=60)
    assert tiered_state(b, topic)["log_end_offset"] == 1000
    second = keys("b", 2000)
    assert produce(b.bootstrap, topic, second) == second
    epoch = state(cluster, topic).leader_epoch
    assert epochs(b, topic) == [(0, 0), (epoch, 1000)]
    # step 3: B's local segments below what it tiered expire
    alter_topic(cluster, topic, local_retention_bytes="1")
    wait_settled(b, topic, above=2000)
    copied = wait_lineage(cluster, topic, b)
    assert contiguous(copied) == tiered_state(b, topic)["local_log_start_offset"] - 1
    assert all(s.end < 1000 for s in copied if set(s.epochs) == {0})
    assert any(s.end >= 1000 for s in outside_lineage(cluster, topic, b))   # A's, kept
    # Spark's direct reads plan only segments of B's lineage: A's copies are never read
    from strata.spark.broker_client import BrokerClient
    from strata.spark.remote_segments import remote_segments
    with BrokerClient(cluster.bootstrap) as spark_client:
        planned = remote_segments(spark_client, topic)[0]
    outside = outside_lineage(cluster, topic, b)
    assert planned and not any((m.start_offset, m.end_offset, dict(m.segment_leader_epochs))
                               in [(x.start, x.end, x.epochs) for x in outside] for m in planned)
    assert all(m.end_offset < 1000 or max(m.segment_leader_epochs) == epoch for m in planned)
    assert offset_for_leader_epoch(b, topic, 0) == (0, 1000)   # LE-0 past 1000: fenced
    expected = numbered(first + second)
    assert consume(cluster.bootstrap, topic, len(expected)) == expected
    assert consume(cluster.bootstrap, topic, 1, start=1000) == [(1000, second[0])]

    # A returns: it truncates what B never had and follows B's log
    a.start()
    cluster.wait_metadata()
    wait_for("A back in the ISR", lambda: sorted(state(cluster, topic).isr) == [A, B], timeout=60)
    assert tiered_state(a, topic)["log_end_offset"] == 3000
    assert epochs(a, topic) == epochs(b, topic)
    # it cut its log where B's epoch 0 ends, then, B's local log starting above that, it
    # rebuilt from the remote tier (scenario 2.2)
    assert f"{topic}-0 diverges from the leader at epoch 0 (leader end 1000" in a.output()
    assert rebuilds(a, topic) == 1
    assert consume(cluster.bootstrap, topic, len(expected), rack=RACKS[A]) == expected


def test_s5_remote_log_divergence_a_reimaged_broker_rebuilds_from_the_current_lineage(cluster):
    """KIP-405 scenario 5 (two unclean elections). A leads and tiers while B is out of sync
    (the KIP's LE-0; here the ISR shrink gave A's records an epoch of their own, LE-a);
    A stops, B is elected (LE-b), takes records and tiers them: the remote tier has held
    segments of two lineages for the same offsets. B stops, A comes back without knowing LE-b
    and is elected (LE-c), takes records and tiers them; the LE-b segments stay outside its
    lineage, unread (Kafka's expirer leaves them to retention). B is
    reimaged (empty disk): told OFFSET_MOVED_TO_TIERED_STORAGE it rebuilds from A's LE-c
    segment, with A's epochs (no LE-b), and joins the ISR. A consumer reading from 0, from A
    or from B (KIP-392), gets A's log: at offset 1000, A's record, not B's."""
    topic = "s5-remote-divergence"
    # step 1: A takes records B lacks and ships them
    a, b, first, only_a = a_tiers_past_b(cluster, topic, 1500)
    lineage_a = epochs(a, topic)
    assert lineage_a[0] == (0, 0) and lineage_a[-1][1] <= 1000
    # step 2: A stops, B is elected (LE-b), takes records and ships them
    stop(a)
    b.start()
    wait_for("B leads (unclean)", lambda: leader_is(cluster, topic, B), timeout=60)
    only_b = keys("y", 1500)
    assert produce(b.bootstrap, topic, only_b) == only_b
    eb = state(cluster, topic).leader_epoch
    assert eb > lineage_a[-1][0] and epochs(b, topic) == [(0, 0), (eb, 1000)]
    wait_for("B tiered its epoch", lambda: tiered_state(
        b, topic)["highest_offset_in_remote_storage"] >= 2000, timeout=60)
    # the remote tier holds both lineages for offsets 1000 on: A's copies (outside B's
    # lineage: B leaves them) and B's
    ever = [s for s in remote_metadata(cluster, topic).segments
            if S.COPY_SEGMENT_FINISHED in s.states]
    assert any(s.broker == B and eb in s.epochs and s.start <= 1000 for s in ever)
    assert any(s.broker == A and eb not in s.epochs and s.end >= 1000 for s in ever)
    # step 3: B stops; A comes back without knowing LE-b and is elected (LE-c)
    stop(b)
    a.start()
    wait_for("A leads (unclean)", lambda: leader_is(cluster, topic, A), timeout=60)
    assert tiered_state(a, topic)["log_end_offset"] == 2500
    more = keys("z", 1500)
    assert produce(a.bootstrap, topic, more) == more
    ec = state(cluster, topic).leader_epoch
    assert ec > eb and epochs(a, topic) == lineage_a + [(ec, 2500)]
    alter_topic(cluster, topic, local_retention_bytes="1")
    lead = wait_settled(a, topic, above=2500)
    copied = wait_lineage(cluster, topic, a)
    assert not any(eb in s.epochs for s in copied)
    assert any(eb in s.epochs for s in outside_lineage(cluster, topic, a))   # B's, kept
    assert contiguous(copied) == lead["local_log_start_offset"] - 1
    # step 4: B is reimaged and comes back as a follower
    shutil.rmtree(b.log_dir)
    b.start()
    cluster.wait_metadata()
    wait_for("B in the ISR", lambda: sorted(state(cluster, topic).isr) == [A, B], timeout=60)
    wait_for("B caught up", lambda: tiered_state(b, topic)["log_end_offset"] == 4000)
    assert epochs(b, topic) == epochs(a, topic) == lineage_a + [(ec, 2500)]
    f = tiered_state(b, topic)
    assert (f["log_start_offset"], f["local_log_start_offset"]) == (0, lead["local_log_start_offset"]), f
    assert rebuilds(b, topic) == 1
    # it rebuilt from a segment of the current lineage, holding LE-c (the KIP's seg-4-5)
    sid, end, rebuilt_epochs = rebuilt_from(b, topic)
    segment = next(x for x in remote_metadata(cluster, topic).segments if x.id == sid)
    assert ec in segment.epochs and eb not in segment.epochs and end == segment.end
    assert rebuilt_epochs == [e for e in lineage_a + [(ec, 2500)] if e[1] <= end]
    # LE-b is no epoch of this log: the largest one below it ends where LE-c starts
    assert offset_for_leader_epoch(a, topic, eb) == (lineage_a[-1][0], 2500)
    expected = numbered(first + only_a + more)
    assert consume(cluster.bootstrap, topic, len(expected)) == expected
    assert consume(cluster.bootstrap, topic, len(expected), rack=RACKS[B]) == expected
    assert consume(cluster.bootstrap, topic, 1, start=1000, rack=RACKS[B]) == [(1000, only_a[0])]


# ============================================== Kafka's tiered-storage integration tests


def partition_dirs(broker, topic: str) -> list[str]:
    return sorted(p.name for p in broker.log_dir.iterdir() if p.name.startswith(f"{topic}-"))


def test_reassign_move_puts_the_only_replica_on_an_empty_broker_that_copies_only_the_local_tail(cluster):
    """Kafka's ReassignReplicaMoveTest: a partition on A alone, tiered, moved to B alone. B
    rebuilds from the remote tier and copies only A's local tail; A's replica is deleted but
    the remote tier is not (moving a replica is no deletion); B leads, tiers on from where A
    stopped and serves every record from offset 0."""
    topic = "kafka-reassign-move"
    create(cluster, topic, [[A]])
    first = keys("a", 1500)
    assert produce(cluster.bootstrap, topic, first) == first
    lead = wait_settled(cluster.broker(A), topic)
    before = {s.id for s in remote_metadata(cluster, topic).copied()}
    reassign(cluster, topic, {0: [B]})
    wait_for("B alone leads", lambda: (m := state(cluster, topic)).replicas == [B] and m.leader == B
             and m.isr == [B], timeout=60)
    wait_for("A's replica deleted", lambda: partition_dirs(cluster.broker(A), topic) == [])
    b = cluster.broker(B)
    f = tiered_state(b, topic)
    assert (f["log_start_offset"], f["local_log_start_offset"]) == (0, lead["local_log_start_offset"]), f
    assert {s.id for s in remote_metadata(cluster, topic).copied()} == before
    second = keys("b", 1000)
    assert produce(cluster.bootstrap, topic, second) == second
    mine = wait_settled(b, topic, above=1500)
    copied = remote_metadata(cluster, topic).copied()
    assert contiguous(copied) == mine["local_log_start_offset"] - 1
    assert {s.broker for s in copied if s.start >= lead["local_log_start_offset"]} == {B}
    assert consume(cluster.bootstrap, topic, 2500) == numbered(first + second)


def test_reassign_shrink_leaves_each_partition_on_its_follower_which_tiers_on(cluster):
    """Kafka's ReassignReplicaShrinkTest: two partitions on A and B (p0 led by A, p1 by B),
    both tiered; each shrinks to its follower (p0 to B, p1 to A). The remaining replica leads,
    tiers on from where the removed leader stopped, and serves each partition from offset 0;
    the removed replicas' local logs go, the remote tier stays."""
    topic = "kafka-reassign-shrink"
    create(cluster, topic, [[A, B], [B, A]])
    produced = {}
    for p, leader in ((0, A), (1, B)):
        produced[p] = keys(f"p{p}-", 1000)
        assert produce(cluster.bootstrap, topic, produced[p], partition=p) == produced[p]
        wait_settled(cluster.broker(leader), topic, partition=p)
    reassign(cluster, topic, {0: [B], 1: [A]})
    for p, node in ((0, B), (1, A)):
        wait_for(f"p{p} on {node} alone", lambda p=p, node=node: (
            m := state(cluster, topic, p)).replicas == [node] and m.leader == node, timeout=60)
    wait_for("the removed replicas deleted", lambda: partition_dirs(cluster.broker(A), topic)
             == [f"{topic}-1"] and partition_dirs(cluster.broker(B), topic) == [f"{topic}-0"])
    for p, node in ((0, B), (1, A)):
        more = keys(f"p{p}-more-", 500)
        assert produce(cluster.bootstrap, topic, more, partition=p) == more
        produced[p] += more
        mine = wait_settled(cluster.broker(node), topic, above=1000, partition=p)
        copied = remote_metadata(cluster, topic).copied(p)
        assert contiguous(copied) == mine["local_log_start_offset"] - 1
        assert consume(cluster.bootstrap, topic, 1500, partition=p) == numbered(produced[p])


def test_preferred_leader_election_returns_leadership_to_a_rebuilt_replica_that_serves_the_remote_tier(cluster):
    """Kafka's CanFetchFromTieredStorageAfterRecoveryOfLocalSegmentsTest: A leads and tiers;
    A stops and B leads, serving offsets 0.. from the remote tier; A's storage is erased; A
    comes back, rebuilds from the remote tier, and a preferred leader election (admin
    ElectLeaders) makes it leader again; it serves every record from offset 0, the remote
    ones through its own remote reads."""
    topic = "kafka-preferred-election"
    create(cluster, topic, [[A, B]])
    a, b = cluster.broker(A), cluster.broker(B)
    first = keys("a", 1500)
    assert produce(cluster.bootstrap, topic, first) == first
    lead = wait_settled(a, topic)
    wait_settled(b, topic)       # the follower trims too (it learns how far the remote tier reaches)
    # (B.1) A stops: B leads and reads the remote tier
    stop(a)
    wait_for("B leads", lambda: leader_is(cluster, topic, B))
    fetched = counter(b, "RemoteFetchRequestsPerSec", topic)
    assert consume(b.bootstrap, topic, 1500) == numbered(first)
    assert counter(b, "RemoteFetchRequestsPerSec", topic) > fetched
    # (B.2) A's storage is erased; it comes back empty and is elected again
    shutil.rmtree(a.log_dir)
    a.start()
    cluster.wait_metadata()
    expect_leader(cluster, topic, A)
    f = tiered_state(a, topic)
    assert (f["log_start_offset"], f["local_log_start_offset"]) == (0, lead["local_log_start_offset"]), f
    assert rebuilds(a, topic) == 1
    assert epochs(a, topic)[:-1] == epochs(b, topic)[:len(epochs(a, topic)) - 1]
    assert consume(cluster.bootstrap, topic, 1500) == numbered(first)
    assert counter(a, "RemoteFetchRequestsPerSec", topic) > 0


def test_a_consumer_in_the_followers_rack_reads_the_remote_tier_through_the_follower(cluster):
    """Kafka's OffloadAndConsumeFromFollowerTest (KIP-392): A leads and tiers, B follows and
    trims its local log; a consumer in B's rack reading from offset 1 is sent to B, which
    serves the offsets below its local log start from the remote tier, the rest locally."""
    topic = "kafka-consume-from-follower"
    create(cluster, topic, [[A, B]])
    a, b = cluster.broker(A), cluster.broker(B)
    first = keys("a", 1500)
    assert produce(cluster.bootstrap, topic, first) == first
    wait_settled(a, topic)
    f = wait_settled(b, topic)
    assert f["local_log_start_offset"] > 1
    on_a, on_b = (counter(x, "RemoteFetchRequestsPerSec", topic) for x in (a, b))
    assert consume(cluster.bootstrap, topic, 1499, start=1, rack=RACKS[B]) == numbered(first[1:], 1)
    assert counter(b, "RemoteFetchRequestsPerSec", topic) > on_b
    assert counter(a, "RemoteFetchRequestsPerSec", topic) == on_a


def test_delete_topic_removes_every_remote_object_of_both_partitions_once(cluster):
    """Kafka's DeleteTopicTest: two partitions on A and B (p0 led by A, p1 by B), both
    tiered; the topic is deleted: every remote object of the topic goes, every remote segment
    ends DELETE_SEGMENT_FINISHED, each partition's deletion runs MARKED, STARTED, FINISHED
    once, and no broker keeps a local log of it."""
    topic = "kafka-delete-topic"
    create(cluster, topic, [[A, B], [B, A]])
    for p, leader in ((0, A), (1, B)):
        ks = keys(f"p{p}-", 1000)
        assert produce(cluster.bootstrap, topic, ks, partition=p) == ks
        wait_settled(cluster.broker(leader), topic, partition=p)
    meta = remote_metadata(cluster, topic)
    assert {s.partition for s in meta.segments} == {0, 1}
    assert remote_objects(cluster, topic)
    admin(cluster.bootstrap).delete_topics([topic])[topic].result(30)
    wait_for("the topic's remote objects deleted", lambda: not remote_objects(cluster, topic),
             timeout=60)
    meta = wait_for("both partitions' deletion finished", lambda: (
        m := remote_metadata(cluster, topic)) and all(
            P.DELETE_PARTITION_FINISHED in m.partition_states.get(p, []) for p in (0, 1)) and m,
        timeout=60)
    for p in (0, 1):
        assert meta.partition_states[p] == [P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED,
                                            P.DELETE_PARTITION_FINISHED], meta.partition_states
    assert meta.segments and all(s.state is S.DELETE_SEGMENT_FINISHED for s in meta.segments)
    for broker in cluster.brokers:
        wait_for(f"broker {broker.node_id} has no local log of the topic",
                 lambda: not [d for d in partition_dirs(broker, topic) if not d.endswith("-delete")])


def test_delete_segments_by_retention_time_moves_the_log_start_on_every_replica(cluster):
    """Kafka's DeleteSegmentsByRetentionTimeTest on two replicas: records two hours old are
    tiered, then recent ones produced; retention.ms set to an hour makes the leader delete the
    old remote segments. The log start offset moves past them on the leader and the follower,
    both leader-epoch checkpoints start there (Kafka's expectLeaderEpochCheckpoint), the
    remote objects go, and a consumer from offset 0 gets the recent records alone."""
    topic = "kafka-retention-time"
    hour = 3_600_000
    create(cluster, topic, [[A, B]], local_retention_ms=str(hour))
    a, b = cluster.broker(A), cluster.broker(B)
    old = keys("old", 1000)
    assert produce(cluster.bootstrap, topic, old, timestamp=int(time.time() * 1000) - 2 * hour) == old
    # local retention (an hour) rolls the expired active segment so that all of it is tiered
    wait_for("the old records tiered", lambda: tiered_state(
        a, topic)["highest_offset_in_remote_storage"] == 999, timeout=60)
    recent = keys("new", 100)
    assert produce(cluster.bootstrap, topic, recent) == recent
    wait_for("B has them", lambda: tiered_state(b, topic)["log_end_offset"] == 1100)
    old_segments = {s.id for s in remote_metadata(cluster, topic).copied()}
    assert old_segments
    alter_topic(cluster, topic, retention_ms=str(hour))
    for broker in (a, b):
        wait_for(f"broker {broker.node_id}'s log starts after the old records",
                 lambda: tiered_state(broker, topic)["log_start_offset"] == 1000, timeout=60)
        assert epochs(broker, topic) == [(0, 1000)]
        # the segments below the new start are deleted asynchronously (Kafka's as well)
        wait_for(f"broker {broker.node_id}'s segments below the log start deleted",
                 lambda: segment_bases(broker, topic)[0] >= 1000)
    meta = wait_for("the old segments deleted", lambda: (m := remote_metadata(cluster, topic)) and all(
        s.state is S.DELETE_SEGMENT_FINISHED for s in m.segments if s.id in old_segments) and m)
    assert not meta.copied()
    assert not remote_objects(cluster, topic)
    assert consume(cluster.bootstrap, topic, 100) == numbered(recent, 1000)


def test_fetch_from_the_leader_after_its_checkpoint_files_were_deleted(cluster):
    """Kafka's FetchFromLeaderWithCorruptedCheckpointTest: A leads and tiers; both brokers
    stop; A's replication-offset-checkpoint, recovery-point-offset-checkpoint and clean
    shutdown marker are deleted; A starts first, then B. A leads again, tiers what comes next
    and serves every record from offset 0, the tiered ones from the remote tier."""
    topic = "kafka-corrupted-checkpoint"
    create(cluster, topic, [[A, B]])
    a, b = cluster.broker(A), cluster.broker(B)
    first = keys("a", 1000)
    assert produce(cluster.bootstrap, topic, first) == first
    wait_settled(a, topic)
    assert consume(cluster.bootstrap, topic, 1000) == numbered(first)
    stop(b)
    stop(a)
    for name in ("replication-offset-checkpoint", "recovery-point-offset-checkpoint",
                 ".kafka_cleanshutdown"):
        (a.log_dir / name).unlink(missing_ok=True)
    a.start()
    b.start()
    cluster.wait_metadata()
    wait_for("A leads", lambda: leader_is(cluster, topic, A), timeout=60)
    s = tiered_state(a, topic)
    assert s["log_start_offset"] == 0, f"A's log no longer starts at 0: {s}"
    second = keys("b", 500)
    assert produce(cluster.bootstrap, topic, second) == second
    wait_settled(a, topic, above=1000)
    copied = remote_metadata(cluster, topic).copied()
    assert contiguous(copied) == tiered_state(a, topic)["local_log_start_offset"] - 1
    assert consume(cluster.bootstrap, topic, 1500) == numbered(first + second)


def test_leadership_moving_back_and_forth_while_producing_leaves_no_gap_in_the_remote_tier(cluster):
    """Leader changes during offload: while a producer writes, leadership moves A to B and
    back (preferred elections); each new leader resumes copying where its epoch lineage's
    copies end and each old leader's copier stops. The remote tier has no gap, and a consumer
    reads every record once, in order, across both tiers."""
    topic = "leader-moves-while-tiering"
    create(cluster, topic, [[A, B]])
    produced: list[bytes] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set() and n < 20:
            batch = keys(f"w{n:02d}-", 250)
            produced.extend(produce(cluster.bootstrap, topic, batch, partial=True))
            n += 1
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        wait_for("some tiered", lambda: tiered_state(cluster.broker(A), topic)[
            "highest_offset_in_remote_storage"] > 500, timeout=60)
        expect_leader(cluster, topic, B)
        wait_for("B tiered", lambda: any(
            s.broker == B for s in remote_metadata(cluster, topic).copied()), timeout=60)
        expect_leader(cluster, topic, A)
    finally:
        stop.set()
        t.join(120)
    assert not t.is_alive()
    total = len(produced)
    assert total >= 1000
    lead = wait_settled(cluster.broker(A), topic, above=0)
    copied = remote_metadata(cluster, topic).copied()
    expected = 0
    for s in copied:                      # overlaps allowed (two leaders' segment bounds), gaps not
        assert s.start <= expected, [(x.start, x.end, x.broker) for x in copied]
        expected = max(expected, s.end + 1)
    assert expected == lead["local_log_start_offset"]
    assert {s.broker for s in copied} == {A, B}
    assert consume(cluster.bootstrap, topic, total) == numbered(produced)


# =========================================================================== restarts


def test_a_restarted_broker_applies_the_topic_configs_to_the_logs_it_loads(cluster):
    """A broker restarted with its logs on disk serves them under their topic's configs (here
    remote.storage.enable, 16 KiB segments and local.retention.bytes 1): leading again, it
    rolls, tiers and trims its local log as it did before the restart."""
    topic = "restart-configs"
    create(cluster, topic, [[A]])
    first = keys("a", 1000)
    assert produce(cluster.bootstrap, topic, first) == first
    wait_for("A tiered", lambda: settled(cluster.broker(A), topic), timeout=60)
    stop(cluster.broker(A))
    cluster.broker(A).start()
    cluster.wait_metadata()
    wait_for("A leads again", lambda: leader_is(cluster, topic, A))
    s = tiered_state(cluster.broker(A), topic)
    assert s["remote_storage_enable"] and s["log_start_offset"] == 0, \
        f"the reloaded log lost its topic's configs: {s}"
    more = keys("b", 1000)
    assert produce(cluster.bootstrap, topic, more) == more
    s = wait_for("A tiers what came after its restart", lambda: (
        s := settled(cluster.broker(A), topic)) and s["local_log_start_offset"] > 1000 and s,
        timeout=30)
    assert segment_bases(cluster.broker(A), topic) == [s["local_log_start_offset"]]
    assert consume(cluster.bootstrap, topic, 2000) == numbered(first + more)


def test_a_broker_stops_promptly_while_its_copier_cannot_publish_remote_metadata(cluster):
    """A controlled shutdown does not wait for a copy blocked publishing to
    ``__remote_log_metadata`` (here: B and C are down, so the metadata partitions have fewer
    in-sync replicas than their min.insync.replicas and every publish is retried until its
    two-minute deadline). The copy left COPY_SEGMENT_STARTED is an orphan, as after a crash."""
    topic = "stop-while-publishing"
    create(cluster, topic, [[A]])
    a = cluster.broker(A)
    stop(cluster.broker(B))
    stop(cluster.broker(C))
    ks = keys("a", 1000)
    assert produce(a.bootstrap, topic, ks) == ks       # segments roll; the copier is stuck
    wait_for("a copy waiting on the metadata topic", lambda: "stop-while-publishing-0" in
             a.output() and tiered_state(a, topic)["highest_offset_in_remote_storage"] == -1
             and tiered_state(a, topic)["local_segments"] > 1)
    started = time.monotonic()
    stop(a, timeout=25)
    assert A not in hung, f"broker {A} took over 25 s to stop (its thread dump is in its log)"
    assert time.monotonic() - started < 20
