"""A batched AlterPartition (issue 50): one request's proposals are one controller event,
decided in order on one image (each still fenced by its leader and partition epochs) and
written as one pipelined ZooKeeper batch, not one event and one round trip per partition."""

from __future__ import annotations

import uuid
from dataclasses import replace

from strata.cluster.controller import ControllerService
from strata.cluster.controller_events import (
    AlterPartition, AlterPartitions, BrokerRegistered, TopicCreated, UpdatePartitionState)
from strata.cluster.controller_logic import handle
from strata.cluster.image import BrokerRegistration, MetadataImage
from strata.cluster.zk.client import UpdateLeaderAndIsrResult
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition

from test_alter_partition import LogicController, TOPIC_ID, zk_send, zk_metadata, cluster_image

PARTITIONS = 20


def shrunk_cluster() -> MetadataImage:
    """Brokers 1-3, topic "t" of PARTITIONS partitions led by 1, every ISR shrunk to (1,)."""
    image = MetadataImage()
    for b in (1, 2, 3):
        image = handle(image, BrokerRegistered(BrokerRegistration(b, epoch=100 + b))).image
    image = handle(image, TopicCreated("t", uuid.uuid4(),
                                       assignment=((1, 2, 3),) * PARTITIONS)).image
    for p in range(PARTITIONS):
        image = handle(image, propose(image, p, (1,))).image
    return image


def propose(image: MetadataImage, p: int, isr, partition_epoch=None) -> AlterPartition:
    reg = image.registration(TopicPartition("t", p))
    return AlterPartition(1, 101, "t", p, reg.leader_epoch,
                          reg.partition_epoch if partition_epoch is None else partition_epoch,
                          tuple(isr))


def test_a_batch_expands_every_isr_in_one_result_with_one_write_each():
    image = shrunk_cluster()
    result = handle(image, AlterPartitions(tuple(propose(image, p, (1, 2, 3))
                                                 for p in range(PARTITIONS))))
    assert [r.error for r in result.response] == [ErrorCode.NONE] * PARTITIONS
    assert [w.partition.partition for w in result.writes] == list(range(PARTITIONS))
    assert all(isinstance(w, UpdatePartitionState) for w in result.writes)
    for p, answer in enumerate(result.response):
        reg = result.image.registration(TopicPartition("t", p))
        assert reg.isr == (1, 2, 3) and answer.registration == reg
        assert reg.partition_epoch == image.registration(TopicPartition("t", p)).partition_epoch + 1
    assert result.notices == ()


def test_each_proposal_in_a_batch_is_fenced_as_it_would_be_alone():
    image = shrunk_cluster()
    fresh = propose(image, 0, (1, 2))
    stale_leader = replace(propose(image, 1, (1, 2)), leader_epoch=-1)
    stale_version = propose(image, 2, (1, 3), partition_epoch=0)
    # the same partition twice: the second was based on the epoch the first replaced
    again = propose(image, 0, (1, 2, 3))
    ineligible = replace(propose(image, 3, (1, 2)), new_isr_broker_epochs=(-1, 999))
    result = handle(image, AlterPartitions((fresh, stale_leader, stale_version, again,
                                            ineligible)))
    assert [r.error for r in result.response] == [
        ErrorCode.NONE, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.INELIGIBLE_REPLICA]
    assert [w.partition for w in result.writes] == [TopicPartition("t", 0)]
    assert result.image.registration(TopicPartition("t", 0)).isr == (1, 2)
    for p in (1, 2, 3):
        assert result.image.registration(TopicPartition("t", p)) == \
            image.registration(TopicPartition("t", p))


def test_one_alter_partition_request_is_one_controller_event():
    controller = LogicController(cluster_image())
    md = zk_metadata(controller)
    resp = zk_send(md, 3, [(TOPIC_ID, 0, 3, 5, (1, 2)), (uuid.uuid4(), 0, 1, 1, (1,)),
                           (TOPIC_ID, 1, 1, 2, (2, 3))])
    assert resp.error_code == 0
    assert [type(e) for e in controller.events] == [AlterPartitions]
    [event] = controller.events
    assert [(i.topic, i.partition) for i in event.items] == [("t", 0), ("t", 1)]
    codes = sorted((p.partition_index, p.error_code) for t in resp.topics for p in t.partitions)
    assert codes == [(0, ErrorCode.NONE), (0, ErrorCode.UNKNOWN_TOPIC_ID),
                     (1, ErrorCode.INVALID_REQUEST)]


class RecordingZk:
    """update_leader_and_isr calls, each accepted at the next zkVersion."""

    def __init__(self):
        self.calls = []

    def update_leader_and_isr(self, states, controller_epoch, epoch_zk_version):
        self.calls.append(sorted(states))
        return UpdateLeaderAndIsrResult(
            {tp: replace(reg, partition_epoch=reg.partition_epoch + 1)
             for tp, reg in states.items()}, ())


def test_the_controller_writes_a_batch_as_one_zookeeper_batch():
    image = shrunk_cluster()
    result = handle(image, AlterPartitions(tuple(propose(image, p, (1, 2, 3))
                                                 for p in range(PARTITIONS))))
    service = ControllerService.__new__(ControllerService)  # only what _write uses
    service.zk, service._epoch, service._epoch_zk_version = RecordingZk(), 1, 0
    service._write(result.writes)
    assert service.zk.calls == [[TopicPartition("t", p) for p in range(PARTITIONS)]]
