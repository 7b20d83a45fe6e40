"""AlterPartition over the wire in a three-broker cluster: the test plays a partition's leader
and sends its ISR change to the controller broker, as a broker's AlterPartitionManager would.

The broker epoch is the leader's ``/brokers/ids/N`` czxid and the partition epoch the state
znode's version, both read from ZooKeeper; Metadata shows the result.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import TopicName
from zk_server import zookeeper_available

from cluster_clients import wait_for
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode
from strata.net.connection import roundtrip
from strata.protocol.codec import ApiKey, make, request_class, response_class

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

OVERRIDES = {
    "remote.log.storage.system.enable": "false",
    "log.remote.storage.enable": "false",
    "zookeeper.session.timeout.ms": "4000",
}
DEADLINE_S = 30


def metadata(bootstrap: str, topic: str):
    return roundtrip(bootstrap, MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        MetadataResponse)


def partition0(bootstrap: str, topic: str):
    """(controller id, topic id, leader, leader epoch, ISR) of partition 0 as ``bootstrap`` sees it."""
    resp = metadata(bootstrap, topic)
    [t] = resp.topics
    [p] = [p for p in t.partitions if p.partition_index == 0]
    return (int(resp.controller_id), t.topic_id, int(p.leader_id), int(p.leader_epoch),
            tuple(sorted(int(b) for b in p.isr_nodes)))


def alter_partition(bootstrap: str, version: int, *, broker_id: int, broker_epoch: int,
                    topic_id: uuid.UUID, leader_epoch: int, partition_epoch: int,
                    isr: tuple[int, ...]):
    req_cls = request_class(ApiKey.ALTER_PARTITION, version)
    if version >= 3:
        members = {"new_isr_with_epochs": tuple(
            make(req_cls, "topics.partitions.new_isr_with_epochs", broker_id=b, broker_epoch=-1)
            for b in isr)}
    else:
        members = {"new_isr": isr}
    body = make(req_cls, broker_id=broker_id, broker_epoch=broker_epoch, topics=(
        make(req_cls, "topics", topic_id=topic_id, partitions=(
            make(req_cls, "topics.partitions", partition_index=0, leader_epoch=leader_epoch,
                 partition_epoch=partition_epoch, **members),)),))
    return roundtrip(bootstrap, body, response_class(ApiKey.ALTER_PARTITION, version))


def test_a_leader_shrinks_its_isr_through_the_controller(tmp_path):
    topic = "isr-shrink"
    # the replica taken out of the ISR is paused until the end (a caught-up follower would be
    # taken back in by the real leader at its next fetch, changing the state the checks below
    # expect); its ZooKeeper session must outlast the pause
    overrides = {**OVERRIDES, "zookeeper.session.timeout.ms": "30000"}
    with StrataCluster(tmp_path, brokers=3, overrides=overrides) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(DEADLINE_S)
        controller_id, topic_id, leader, leader_epoch, isr = wait_for(
            "partition 0 led with a full ISR and a known controller",
            lambda: (s := partition0(cluster.bootstrap.split(",")[0], topic))[0] > 0
            and s[2] >= 0 and len(s[4]) == 3 and s)
        controller = cluster.broker(controller_id)
        removed = next(r for r in isr if r not in (leader, controller_id))
        other = next(b for b in cluster.brokers if b.node_id not in (controller_id, removed))

        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(timeout=DEADLINE_S)
        try:
            broker_epoch = zk.get(f"/brokers/ids/{leader}")[1].czxid
            partition_epoch = zk.get(f"/brokers/topics/{topic}/partitions/0/state")[1].version
        finally:
            zk.stop()
            zk.close()

        smaller = tuple(b for b in isr if b != removed)
        proposal = dict(broker_id=leader, broker_epoch=broker_epoch, topic_id=topic_id,
                        leader_epoch=leader_epoch, partition_epoch=partition_epoch)
        paused = cluster.broker(removed)
        paused.pause()
        try:
            resp = alter_partition(controller.bootstrap, 2, isr=smaller, **proposal)
            assert resp.error_code == ErrorCode.NONE
            [t] = resp.topics
            [p] = t.partitions
            assert t.topic_id == topic_id
            assert (p.error_code, p.leader_id, p.leader_epoch, tuple(p.isr)) == \
                (ErrorCode.NONE, leader, leader_epoch, smaller)
            assert p.partition_epoch == partition_epoch + 1
            for b in (b for b in cluster.brokers if b.node_id in smaller):   # not the paused one
                wait_for(f"broker {b.node_id} shows ISR {smaller}",
                         lambda b=b: partition0(b.bootstrap, topic)[4] == tuple(sorted(smaller)))

            # the same change again is answered with the state it made (Kafka's ZooKeeper controller)
            again = alter_partition(controller.bootstrap, 3, isr=smaller, **proposal)
            [p] = again.topics[0].partitions
            assert (again.error_code, p.error_code, p.partition_epoch) == \
                (ErrorCode.NONE, ErrorCode.NONE, partition_epoch + 1)

            # another change on the partition epoch it replaced is refused
            stale = alter_partition(controller.bootstrap, 3, isr=(leader,), **proposal)
            [p] = stale.topics[0].partitions
            assert (stale.error_code, p.error_code) == (ErrorCode.NONE, ErrorCode.INVALID_UPDATE_VERSION)

            # a broker that is not the controller refuses the whole request
            for version in (2, 3):
                elsewhere = alter_partition(other.bootstrap, version, isr=smaller, **proposal)
                assert (elsewhere.error_code, elsewhere.topics) == (ErrorCode.NOT_CONTROLLER, ())

            # and the ISR is still the accepted one
            assert partition0(controller.bootstrap, topic)[4] == tuple(sorted(smaller))
        finally:
            paused.resume()
