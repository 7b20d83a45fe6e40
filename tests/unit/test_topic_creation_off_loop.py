"""Topic creation never runs on the event loop: Metadata's auto-creation answers at once and
creates on a creation thread (Kafka's AutoTopicCreationManager), CreateTopics creates its topics
side by side and honours ``timeout_ms``, and a ZooKeeper cluster's broker writes each topic in
one multi and waits for its view without the metadata lock."""

from __future__ import annotations

import asyncio
import datetime
import threading
import uuid

import pytest

from strata.cluster.metadata import ClusterMetadata
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import ZkNodeExistsError
from strata.cluster.zk_metadata import ZkClusterMetadata, _create_topic_znodes
from strata.common.errors import ErrorCode
from strata.protocol.codec import ApiKey
from strata.server.context import BrokerContext
from strata.server.topic_creation import auto_topic_creator
from support.waiting import eventually, never
from test_group_handlers import Client
from test_replica_deletion import FakeZk

DEADLINE_S = 10


class GatedMetadata(ClusterMetadata):
    """One broker's metadata whose creations wait for ``gate`` (and, with ``barrier``, for
    each other) before they start; records the thread each ran on."""

    def __init__(self, log_dir, props=None):
        super().__init__(log_dir, 1, {"node.id": "1", **(props or {})})
        self.gate = threading.Event()
        self.gate.set()
        self.barrier: threading.Barrier | None = None
        self.threads: list[str] = []

    def create_topic(self, name, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        assert self.gate.wait(DEADLINE_S)
        if self.barrier is not None and not kwargs.get("validate_only"):
            self.barrier.wait(DEADLINE_S)   # broken (an error) unless all run at once
        return super().create_topic(name, *args, **kwargs)


@pytest.fixture
def ctx(tmp_path):
    return BrokerContext(node_id=1, advertised_host="broker.example", advertised_port=9093,
                         metadata=GatedMetadata(tmp_path), replica_manager=None)


def send(ctx, api, version, **fields):
    return asyncio.run(Client(ctx).send(api, version, **fields))


def metadata(ctx, *names):
    r = send(ctx, ApiKey.METADATA, 9, allow_auto_topic_creation=True,
             include_cluster_authorized_operations=False,
             include_topic_authorized_operations=False,
             topics=tuple(Client.nested(ApiKey.METADATA, 9, "topics", name=n) for n in names))
    return {t.name: t for t in r.topics}


def create(ctx, timeout_ms, *topics, validate_only=False):
    """``topics``: (name, partitions, replication factor[, configs as (name, value) pairs])."""
    entries = tuple(Client.nested(
        ApiKey.CREATE_TOPICS, 7, "topics", name=name, num_partitions=partitions,
        replication_factor=rf, assignments=(),
        configs=tuple(Client.nested(ApiKey.CREATE_TOPICS, 7, "topics.configs", name=k, value=v)
                      for k, v in (configs[0] if configs else ())))
        for name, partitions, rf, *configs in topics)
    r = send(ctx, ApiKey.CREATE_TOPICS, 7, topics=entries,
             timeout=datetime.timedelta(milliseconds=timeout_ms),
             validate_only=validate_only)
    return {t.name: ErrorCode(t.error_code) for t in r.topics}


# ---- Metadata's auto-creation -----------------------------------------------------------------

def test_auto_creation_answers_leader_not_available_at_once_and_creates_on_a_creation_thread(ctx):
    md = ctx.metadata
    md.gate.clear()   # the creation cannot finish: the answer must not wait for it
    assert metadata(ctx, "auto")["auto"].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert metadata(ctx, "auto")["auto"].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert md.topic("auto") is None
    md.gate.set()
    eventually(lambda: md.topic("auto") is not None, "the topic created")
    eventually(lambda: not auto_topic_creator(md).inflight(), "the creation over")
    assert md.threads == ["topic-creation_0"] or \
        (len(md.threads) == 1 and md.threads[0].startswith("topic-creation"))
    answer = metadata(ctx, "auto")["auto"]
    assert answer.error_code == ErrorCode.NONE and len(answer.partitions) == 1


def test_auto_creation_of_an_illegal_name_is_refused_without_a_creation(ctx):
    assert metadata(ctx, "no way")["no way"].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert ctx.metadata.threads == []


def test_a_failed_auto_creation_is_answered_once_then_tried_again(tmp_path):
    md = GatedMetadata(tmp_path, {"default.replication.factor": "3"})
    ctx = BrokerContext(node_id=1, advertised_host="b", advertised_port=9093, metadata=md,
                        replica_manager=None)
    assert metadata(ctx, "rf3")["rf3"].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    eventually(lambda: metadata(ctx, "rf3")["rf3"].error_code
               == ErrorCode.INVALID_REPLICATION_FACTOR, "the creation's error answered")
    assert metadata(ctx, "rf3")["rf3"].error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert md.topic("rf3") is None


# ---- CreateTopics -----------------------------------------------------------------------------

def test_create_topics_creates_its_topics_side_by_side(ctx):
    names = [f"side-{i}" for i in range(6)]
    ctx.metadata.barrier = threading.Barrier(len(names))
    assert create(ctx, 30_000, *[(n, 2, 1) for n in names]) == dict.fromkeys(
        names, ErrorCode.NONE)
    assert all(ctx.metadata.topic(n).partitions == 2 for n in names)


def test_create_topics_answers_request_timed_out_for_what_is_not_done_and_goes_on(ctx):
    md = ctx.metadata
    md.gate.clear()
    answer = create(ctx, 50, ("slow-a", 1, 1), ("slow-b", 1, 1),
                    ("dup-configs", 1, 1, [("retention.ms", "1"), ("retention.ms", "2")]))
    assert answer == {"slow-a": ErrorCode.REQUEST_TIMED_OUT,
                      "slow-b": ErrorCode.REQUEST_TIMED_OUT,
                      "dup-configs": ErrorCode.INVALID_REQUEST}
    md.gate.set()
    eventually(lambda: md.topic("slow-a") and md.topic("slow-b"), "both topics created")


def test_create_topics_with_a_zero_timeout_validates_answers_and_creates_after(ctx):
    answer = create(ctx, 0, ("fired", 3, 1), ("too-many-replicas", 1, 3))
    assert answer == {"fired": ErrorCode.REQUEST_TIMED_OUT,
                      "too-many-replicas": ErrorCode.INVALID_REPLICATION_FACTOR}
    eventually(lambda: ctx.metadata.topic("fired"), "the valid topic created")
    assert ctx.metadata.topic("fired").partitions == 3
    assert ctx.metadata.topic("too-many-replicas") is None


def test_validate_only_answers_the_validation_whatever_the_timeout(ctx):
    assert create(ctx, 0, ("checked", 1, 1), validate_only=True) == {"checked": ErrorCode.NONE}
    never(lambda: ctx.metadata.topic("checked"), "a validated topic created", during=0.2)


# ---- a ZooKeeper cluster's writes -------------------------------------------------------------

class MultiZk(FakeZk):
    """FakeZk with the client's multi and the config writes, recording each multi's ops;
    ``changed()`` is the test's to call (the view sees a write only then)."""

    def __init__(self):
        super().__init__()
        self.multis: list[list[tuple[str, str]]] = []

    def _commit(self, build):
        ops: list[tuple[str, str, bytes]] = []
        build(type("Tx", (), {"create": lambda _, path, data: ops.append(("create", path, data))})())
        self.multis.append([(op, path) for op, path, _ in ops])
        if any(path in self.znodes for _, path, _ in ops):
            from kazoo.exceptions import NodeExistsError, RuntimeInconsistency
            return [NodeExistsError() if path in self.znodes else RuntimeInconsistency()
                    for _, path, _ in ops]
        for _, path, data in ops:
            self.znodes[path] = data
        return [path for _, path, _ in ops]

    def set_or_create_entity_configs(self, entity_type, entity_name, config):
        self.znodes[z.config_entity_path(entity_type, entity_name)] = z.encode_entity_config(config)

    def create_topic_assignment(self, assignment):
        if z.topic_path(assignment.topic) in self.znodes:
            raise ZkNodeExistsError(z.topic_path(assignment.topic))
        self.znodes[z.topic_path(assignment.topic)] = assignment.encode()


def test_a_topic_is_written_in_one_multi_of_its_assignment_and_config():
    zk = MultiZk()
    assignment = z.TopicAssignment("m", uuid.uuid4(), {0: z.ReplicaAssignment((1, 2))})
    assert _create_topic_znodes(zk, assignment, {"retention.ms": "5"})
    assert zk.multis == [[("create", z.topic_path("m")),
                          ("create", z.config_entity_path("topics", "m"))]]
    assert z.decode_entity_config(zk.znodes[z.config_entity_path("topics", "m")]) == \
        {"retention.ms": "5"}
    with pytest.raises(ZkNodeExistsError):
        _create_topic_znodes(zk, assignment, {})
    left = z.TopicAssignment("left", uuid.uuid4(), {0: z.ReplicaAssignment((1,))})
    zk.znodes[z.config_entity_path("topics", "left")] = z.encode_entity_config({})
    assert not _create_topic_znodes(zk, left, {})   # a config left behind: nothing written
    assert z.topic_path("left") not in zk.znodes


def test_a_cluster_broker_waits_for_its_view_without_the_metadata_lock(tmp_path):
    zk = MultiZk()
    for b in (1, 2, 3):
        zk.broker(b)
    md = ZkClusterMetadata(tmp_path, 1, {"zookeeper.metadata.wait.ms": "10000"}, zk)
    md.start_view()
    try:
        outcomes = {}
        creators = [threading.Thread(target=lambda n=n: outcomes.setdefault(
            n, md.create_topic(n, 2, 2))) for n in ("w1", "w2")]
        for t in creators:
            t.start()
        eventually(lambda: len(zk.multis) == 2, "both topics written, side by side")
        assert md.topic("w1") is None and md.topic("w2") is None   # not yet in the view
        assert md._lock.acquire(timeout=DEADLINE_S), "the metadata lock held while waiting"
        md._lock.release()
        for name in ("w1", "w2"):   # what the controller does, then the view sees it
            assignment = z.TopicAssignment.decode(name, zk.znodes[z.topic_path(name)], 0)
            zk.topic(name, assignment.topic_id,
                     [list(assignment.partitions[p].replicas) for p in range(2)])
        zk.changed()
        for t in creators:
            t.join(DEADLINE_S)
        assert {n: i.partitions for n, i in outcomes.items()} == {"w1": 2, "w2": 2}
        assert md.topic("w1").topic_id == outcomes["w1"].topic_id
    finally:
        md.close()
