"""The topic-based RLMM across a cluster: ``__remote_log_metadata`` replicated on three broker
processes (real ZooKeeper), written and read through ClusterMetadataTopicLog by managers in
this process, each as a different broker would run it.

Invariants checked:
- a segment one manager publishes reaches another through its background consumer;
- a partition is ready only once assigned, and then what was published before the
  assignment is visible (readiness waits for the end offset read after it);
- a publish survives the SIGKILL of its metadata partition's leader (it lands once a new
  leader is elected) and nothing published earlier is lost: all visible on both managers;
- a manager started from another's snapshots replays only the records after them.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, partitions, wait_for
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.net.connection import roundtrip
from strata.tiered.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from strata.tiered.metadata.cluster_topic_log import ClusterMetadataTopicLog
from strata.tiered.metadata.topic_based import TopicBasedRemoteLogMetadataManager
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME as TOPIC

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

SESSION_MS = 6000
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
}
NUM_PARTITIONS = 3
READY_S = 60.0
S = RemoteLogSegmentState


def tip(topic: str, partition: int = 0) -> TopicIdPartition:
    return TopicIdPartition(uuid.uuid5(uuid.NAMESPACE_DNS, topic), TopicPartition(topic, partition))


def segment(partition: TopicIdPartition, start: int, end: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate_new(partition), start, end,
                                    5_000 + end, 1, 4_000, 1000, segment_leader_epochs={0: start})


def copy(rlmm, m: RemoteLogSegmentMetadata) -> None:
    rlmm.add_remote_log_segment_metadata(m).result(0)
    rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
        m.remote_log_segment_id, 6_000, None, S.COPY_SEGMENT_FINISHED, 1)).result(0)


def segment_ids(rlmm, partition: TopicIdPartition) -> list:
    return [s.remote_log_segment_id for s in rlmm.list_remote_log_segments(partition)]


# ---- the broker's two callbacks, as a client of the cluster ----------------------------------


def create_topic_via(cluster):
    """CreateTopics with replication factor 3; an existing topic is kept as it is."""
    def create_topic(num_partitions: int, configs: dict[str, str]) -> int:
        futures = admin(cluster.bootstrap).create_topics([NewTopic(TOPIC, num_partitions, 3, config=configs)])
        try:
            futures[TOPIC].result(30)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == ErrorCode.INVALID_REPLICATION_FACTOR:  # too few brokers yet
                raise KafkaError(str(exc), code=ErrorCode.COORDINATOR_NOT_AVAILABLE) from exc
            if code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
        return len(partitions(live_bootstrap(cluster), TOPIC))
    return create_topic


def leader_via(cluster):
    """The leader's address as the first live broker's Metadata answer says."""
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.schema.types import TopicName
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(TOPIC)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)

    def leader_of(partition: int) -> tuple[str, int] | None:
        for b in cluster.brokers:
            if not b.running:
                continue
            try:
                resp = roundtrip(b.bootstrap, request, MetadataResponse, 2)
            except (OSError, ValueError):
                continue
            hosts = {int(n.node_id): (n.host, int(n.port)) for n in resp.brokers}
            leader = next((int(p.leader_id) for t in resp.topics for p in t.partitions
                           if int(p.partition_index) == partition), -1)
            return hosts.get(leader)
        return None
    return leader_of


def live_bootstrap(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers if b.running)


def manager(cluster, log_dir, broker_id: int) -> TopicBasedRemoteLogMetadataManager:
    topic_log = ClusterMetadataTopicLog(create_topic_via(cluster), leader_via(cluster),
                                        client_id=f"broker-{broker_id}-rlmm", min_insync_replicas=2,
                                        retry_backoff_ms=50, deadline_ms=60_000)
    rlmm = TopicBasedRemoteLogMetadataManager(topic_log)
    rlmm.configure({"remote.log.metadata.topic.num.partitions": NUM_PARTITIONS,
                    "log.dir": str(log_dir), "broker.id": broker_id,
                    "remote.log.metadata.poll.interval.ms": 50})
    return rlmm


def loaded(rlmm) -> bool:
    return all(rlmm.read_offset(p) is not None for p in range(NUM_PARTITIONS))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("rlmm-cluster"), brokers=3, overrides=OVERRIDES) as c:
        yield c


@pytest.fixture(scope="module")
def pair(cluster, tmp_path_factory):
    """Two managers, as brokers 1 and 2 run them, started before any partition is assigned."""
    base = tmp_path_factory.mktemp("rlmm-pair")
    one, two = manager(cluster, base / "one", 1), manager(cluster, base / "two", 2)
    one.start()
    two.start()
    yield one, two
    one.close()
    two.close()


def test_a_segment_one_broker_publishes_is_seen_by_another_once_it_is_ready(cluster, pair):
    one, two = pair
    orders = tip("orders")
    one.on_partition_leadership_changes({orders}, set())
    assert one.wait_ready(orders, READY_S)
    first = segment(orders, 0, 99)
    copy(one, first)
    assert one.remote_log_segment_metadata(orders, 0, 50).remote_log_segment_id == first.remote_log_segment_id
    topic = partitions(live_bootstrap(cluster), TOPIC)
    assert len(topic) == NUM_PARTITIONS and all(len(m.replicas) == 3 for m in topic.values())
    resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    configs = admin(cluster.bootstrap).describe_configs([resource])[resource].result(30)
    assert configs["min.insync.replicas"].value == "2"
    assert configs["remote.storage.enable"].value == "false"

    assert not two.is_ready(orders)  # never assigned
    two.on_partition_leadership_changes(set(), {orders})
    assert two.wait_ready(orders, READY_S)
    # ready: applied up to the end offset read after the assignment, so the copy is there
    found = two.remote_log_segment_metadata(orders, 0, 50)
    assert found is not None and found.state is S.COPY_SEGMENT_FINISHED
    assert found.remote_log_segment_id == first.remote_log_segment_id

    later = segment(orders, 100, 199)
    copy(one, later)
    wait_for("the later segment on the other manager",
             lambda: two.remote_log_segment_metadata(orders, 0, 150))
    assert two.highest_offset_for_epoch(orders, 0) == 199
    assert segment_ids(two, orders) == segment_ids(one, orders)


def test_a_publish_survives_the_sigkill_of_its_metadata_partitions_leader(cluster, pair):
    one, two = pair
    payments = tip("payments")
    one.on_partition_leadership_changes({payments}, set())
    two.on_partition_leadership_changes(set(), {payments})
    assert one.wait_ready(payments, READY_S) and two.wait_ready(payments, READY_S)
    before = [segment(payments, i * 100, i * 100 + 99) for i in range(2)]
    for m in before:
        copy(one, m)

    p = one.metadata_partition(payments)
    leader = partitions(live_bootstrap(cluster), TOPIC)[p].leader
    cluster.broker(leader).kill()
    try:
        after = segment(payments, 200, 299)
        copy(one, after)  # retried until a new leader is elected
        wait_for("the new leader in Metadata",
                 lambda: partitions(live_bootstrap(cluster), TOPIC)[p].leader not in (-1, leader))
        expected = [m.remote_log_segment_id for m in before + [after]]
        assert segment_ids(one, payments) == expected
        wait_for("the last copy finished on the other manager",
                 lambda: two.remote_log_segment_metadata(payments, 0, 250), timeout=READY_S)
        assert segment_ids(two, payments) == expected
        assert all(s.state is S.COPY_SEGMENT_FINISHED for s in two.list_remote_log_segments(payments))
    finally:
        cluster.broker(leader).start()
        cluster.wait_metadata()
    wait_for("the restarted broker back in the ISR",
             lambda: leader in partitions(cluster.bootstrap, TOPIC)[p].isr, timeout=READY_S)


def test_a_manager_started_from_anothers_snapshots_replays_only_the_tail(cluster, pair, tmp_path):
    _, two = pair
    refunds = tip("refunds")
    first = manager(cluster, tmp_path / "first", 1)
    first.on_partition_leadership_changes({refunds}, set())
    first.start()
    assert first.wait_ready(refunds, READY_S)
    wait_for("every metadata partition loaded", lambda: loaded(first), timeout=READY_S)
    early = [segment(refunds, i * 100, i * 100 + 99) for i in range(2)]
    for m in early:
        copy(first, m)
    p = first.metadata_partition(refunds)
    covered = first.read_offset(p)
    first.close()  # writes the snapshots

    two.on_partition_leadership_changes({refunds}, set())
    assert two.wait_ready(refunds, READY_S)
    tail = segment(refunds, 200, 299)
    copy(two, tail)  # two records after the snapshot

    third = manager(cluster, tmp_path / "first", 3)
    third.on_partition_leadership_changes(set(), {refunds})
    third.start()
    try:
        assert third.wait_ready(refunds, READY_S)
        wait_for("every metadata partition loaded", lambda: loaded(third), timeout=READY_S)
        assert third.snapshot_offsets[p] == covered
        assert third.replayed_records_by_partition[p] == 2
        assert third.replayed_records == 2
        assert segment_ids(third, refunds) == [m.remote_log_segment_id for m in early + [tail]]
    finally:
        third.close()
