"""A broker deletes a replica only when the cluster's metadata records it (issue 51, part 3):
its topic was deleted, or it was reassigned away. A view that is closing, lost its session or
is being re-read is no evidence, and nothing deletes a log while the log manager closes.

The decision is a pure function of two images (``replica_deletions``); the ZooKeeper view is
driven over in-memory trees that stand in for kazoo's TreeCache, including its ``close``,
which empties the cache."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.broker.metadata_publisher import LeadershipPublisher, TopicLogsPublisher
from strata.cluster.image import (
    BrokerRegistration, MetadataImage, PartitionRegistration, TopicImage, frozen_map)
from strata.cluster.metadata import ClusterMetadata
from strata.cluster.replica_deletion import (
    ReplicaDeletions, ViewChange, replica_deletions, view_change)
from strata.cluster.zk import znodes as z
from strata.cluster.zk.view import ZkMetadataView
from strata.cluster.zk_metadata import ZkClusterMetadata
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import DELETE_DIR_SUFFIX, LogManager
from support.waiting import eventually

ME = 1
T_ID = uuid.UUID("11111111-2222-3333-4444-555555555555")
U_ID = uuid.UUID("66666666-7777-8888-9999-aaaaaaaaaaaa")
DEADLINE_S = 10


def topic(name, topic_id, assignment, leaders=None, **kw) -> TopicImage:
    leaders = leaders or [r[0] for r in assignment]
    states = {p: PartitionRegistration(leaders[p], tuple(r)) for p, r in enumerate(assignment)}
    return TopicImage(name, topic_id, tuple(tuple(r) for r in assignment), frozen_map(states), **kw)


def image(*topics: TopicImage) -> MetadataImage:
    brokers = {i: BrokerRegistration(i, epoch=10 + i) for i in (1, 2, 3)}
    return MetadataImage(frozen_map(brokers), frozen_map({t.name: t for t in topics}))


# ---- the decision -------------------------------------------------------------------------

def test_a_leader_or_isr_change_deletes_nothing():
    old = image(topic("t", T_ID, [[1, 2], [2, 1]]))
    new = image(topic("t", T_ID, [[1, 2], [2, 1]], leaders=[2, 1]))
    assert replica_deletions(ME, old, new) == ReplicaDeletions()


def test_a_deleted_topic_deletes_this_brokers_replicas_of_it_and_nothing_else():
    t = topic("t", T_ID, [[1, 2], [2, 3], [3, 1]])
    u = topic("u", U_ID, [[1, 2]])
    found = replica_deletions(ME, image(t, u), image(u))
    assert found.topics == (t,)
    assert found.replicas == {TopicPartition("t", 0), TopicPartition("t", 2)}


def test_a_deleted_topic_this_broker_does_not_host_is_named_but_deletes_no_replica():
    t = topic("t", T_ID, [[2, 3]])
    found = replica_deletions(ME, image(t), image())
    assert found.topics == (t,) and found.replicas == frozenset()


def test_a_topic_created_again_under_a_new_id_deletes_the_old_replicas():
    old_t = topic("t", T_ID, [[1, 2]])
    found = replica_deletions(ME, image(old_t), image(topic("t", U_ID, [[1, 2]])))
    assert found.topics == (old_t,) and found.replicas == {TopicPartition("t", 0)}


def test_a_completed_reassignment_away_deletes_the_moved_replica_only():
    old = image(topic("t", T_ID, [[1, 2], [2, 1]]))
    new = image(topic("t", T_ID, [[3, 2], [2, 1]]))
    found = replica_deletions(ME, old, new)
    assert found.topics == () and found.replicas == {TopicPartition("t", 0)}


def test_a_reassignment_in_progress_deletes_nothing():
    # while moving [1, 2] to [3, 2] the assignment is target + original, 1 being removed
    old = image(topic("t", T_ID, [[1, 2]]))
    moving = image(topic("t", T_ID, [[3, 2, 1]], leaders=[2],
                         adding_replicas=frozen_map({0: (3,)}),
                         removing_replicas=frozen_map({0: (1,)})))
    assert replica_deletions(ME, old, moving) == ReplicaDeletions()
    assert replica_deletions(ME, moving, image(topic("t", T_ID, [[3, 2]]))).replicas == \
        {TopicPartition("t", 0)}


def test_new_topics_and_partitions_delete_nothing():
    old = image(topic("t", T_ID, [[1, 2]]))
    new = image(topic("t", T_ID, [[1, 2], [1, 3]]), topic("u", U_ID, [[1]]))
    assert replica_deletions(ME, old, new) == ReplicaDeletions()


@pytest.mark.parametrize("closed, whole, expected", [
    (False, True, ViewChange.READ),
    (False, False, ViewChange.INCOMPLETE),   # session lost, caches being re-read
    (True, True, ViewChange.CLOSING),
    (True, False, ViewChange.CLOSING),
])
def test_only_a_whole_read_of_an_open_view_is_a_change_to_apply(closed, whole, expected):
    assert view_change(closed=closed, whole=whole) is expected


# ---- the ZooKeeper view over in-memory trees ------------------------------------------------

@dataclass(frozen=True)
class Stat:
    version: int = 0
    czxid: int = 1
    mzxid: int = 1


class FakeTree:
    """A kazoo TreeCache over a shared dict of znodes: ``close`` empties it, as kazoo's does
    (``TreeNode.on_deleted`` on the root); ``pause_on`` blocks a ``children`` call there."""

    def __init__(self, store: "FakeZk", path: str, on_change):
        self.store, self.path, self.on_change = store, path, on_change
        self.whole = True
        self.closed = False

    @property
    def initialized(self) -> bool:
        if not self.whole:
            self.store.seen_incomplete.set()
        return self.whole

    def data(self, path):
        if self.closed or path not in self.store.znodes:
            return None
        return self.store.znodes[path], Stat()

    def children(self, path):
        self.store.pause_point(path)
        if self.closed:
            return []
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self.store.znodes
                       if p.startswith(prefix)})

    def close(self):
        self.closed = True


class FakeZk:
    """What ``ZkMetadataView`` and ``ZkClusterMetadata`` use of ``StrataZkClient``."""

    def __init__(self):
        self.znodes: dict[str, bytes] = {}
        self.trees: list[FakeTree] = []
        self.paused = threading.Event()
        self.seen_incomplete = threading.Event()
        self.release = threading.Event()
        self.pause_on: str | None = None

    def create_or_get_cluster_id(self, cluster_id):
        return cluster_id

    def tree(self, path, on_change):
        tree = FakeTree(self, path, on_change)
        self.trees.append(tree)
        on_change()  # kazoo's INITIALIZED
        return tree

    def watch_controller(self, callback):
        callback(2)

    def pause_point(self, path):
        if path == self.pause_on:
            self.pause_on = None
            self.paused.set()
            assert self.release.wait(DEADLINE_S)

    def changed(self):
        for tree in self.trees:
            tree.on_change()

    def broker(self, broker_id):
        self.znodes[z.broker_path(broker_id)] = z.encode_broker(
            BrokerRegistration(broker_id, endpoints=(z.parse_endpoint(
                f"PLAINTEXT://127.0.0.1:{9090 + broker_id}", {"PLAINTEXT": "PLAINTEXT"}),)))

    def topic(self, name, topic_id, assignment):
        self.znodes[z.topic_path(name)] = z.TopicAssignment(
            name, topic_id, {p: z.ReplicaAssignment(tuple(r)) for p, r in enumerate(assignment)}
        ).encode()
        for p, r in enumerate(assignment):
            self.znodes[z.partition_state_path(name, p)] = z.encode_partition_state(
                PartitionRegistration(r[0], tuple(r)))

    def delete_topic(self, name):
        for path in [p for p in self.znodes if p == z.topic_path(name)
                     or p.startswith(z.topic_path(name) + "/")]:
            del self.znodes[path]


@pytest.fixture
def fake_zk():
    zk = FakeZk()
    for b in (1, 2, 3):
        zk.broker(b)
    zk.topic("t", T_ID, [[1, 2], [2, 1], [3, 2]])
    zk.topic("u", U_ID, [[1, 3]])
    yield zk
    zk.release.set()


def start_view(zk):
    images = []
    view = ZkMetadataView(zk, lambda old, new: images.append(new)).start(DEADLINE_S)
    assert sorted(view.image.topics) == ["t", "u"]
    return view, images


def test_a_view_whose_caches_are_emptied_by_close_during_a_read_hands_that_image_over_to_no_one(
        fake_zk):
    view, images = start_view(fake_zk)
    fake_zk.pause_on = z.TOPICS_PATH
    fake_zk.changed()
    assert fake_zk.paused.wait(DEADLINE_S)   # the view is reading, between brokers and topics
    view.close(timeout=0.05)                 # gives up waiting: the caches are emptied
    assert all(t.closed for t in fake_zk.trees)
    fake_zk.release.set()                    # the read goes on over empty caches
    eventually(lambda: not view._thread.is_alive(), "the view thread ends")
    assert [sorted(i.topics) for i in images] == [["t", "u"]]


def test_a_view_closes_its_caches_only_after_the_read_under_way_ended(fake_zk):
    view, images = start_view(fake_zk)
    fake_zk.pause_on = z.TOPICS_PATH
    fake_zk.changed()
    assert fake_zk.paused.wait(DEADLINE_S)
    closer = threading.Thread(target=view.close)
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive() and not any(t.closed for t in fake_zk.trees)
    fake_zk.release.set()
    closer.join(DEADLINE_S)
    assert not closer.is_alive() and all(t.closed for t in fake_zk.trees)
    assert len(images) == 1   # read before close ended: not applied either


def test_a_view_applies_no_image_read_while_its_caches_are_not_whole(fake_zk):
    view, images = start_view(fake_zk)
    fake_zk.trees[0].whole = False           # session lost: kazoo's CONNECTION_LOST
    fake_zk.delete_topic("t")
    fake_zk.changed()
    assert fake_zk.seen_incomplete.wait(DEADLINE_S)
    fake_zk.trees[0].whole = True            # read whole again: the deletion is real
    fake_zk.topic("v", T_ID, [[2]])
    fake_zk.changed()
    eventually(lambda: "v" in images[-1].topics, "the new topic is applied")
    assert [sorted(i.topics) for i in images] == [["t", "u"], ["u", "v"]]
    view.close()


def test_a_listed_topic_znode_that_cannot_be_read_keeps_the_topic_as_last_read(fake_zk):
    view, images = start_view(fake_zk)
    fake_zk.znodes[z.topic_path("u")] = b"{not json"
    fake_zk.znodes[z.partition_state_path("t", 0)] = z.encode_partition_state(
        PartitionRegistration(2, (2, 1), leader_epoch=1))
    fake_zk.changed()
    eventually(lambda: len(images) == 2, "the leader change is applied")
    assert images[-1].topics["u"] == images[0].topics["u"]
    assert images[-1].topics["t"].partitions[0].leader == 2
    view.close()


# ---- ZkClusterMetadata with the broker's listeners and a real LogManager ---------------------

class KeepScheduler:
    """Deleted directories stay (as ``-delete``) for the test to see."""

    def schedule_once(self, name, fn, delay_ms=0):
        pass


class Broker:
    """Broker 1's metadata over fake ZooKeeper trees, with the listeners ``run_broker``
    registers for logs, and logs for the replicas it hosts."""

    def __init__(self, zk: FakeZk, tmp_path: Path):
        self.zk = zk
        self.logs_dir = tmp_path / "logs"
        self.md = ZkClusterMetadata(tmp_path / "meta", ME, {}, zk)
        self.manager = LogManager([self.logs_dir], LogConfig({}), scheduler=KeepScheduler(),
                                  replicated=True)
        self.manager.startup()
        self.md.start_view()
        self.applied = []
        replicas = SimpleNamespace(
            apply_states=lambda states: self.applied.append(dict(states)) or SimpleNamespace(
                became_leader=[], stopped_leading=[]))
        self.md.add_listener(TopicLogsPublisher(self.manager, self.md, create_logs=False))
        self.md.add_listener(LeadershipPublisher(replicas, self.manager, self.md, None, None))
        for tp in self.md.hosted_states():
            self.manager.get_or_create_log(tp).append_as_leader(_batch(), leader_epoch=0)

    def hosted_dirs(self) -> list[str]:
        return sorted(p.name for p in self.logs_dir.iterdir() if p.is_dir())

    def deleted_dirs(self) -> list[str]:
        return [n for n in self.hosted_dirs() if n.endswith(DELETE_DIR_SUFFIX)]


def _batch() -> bytes:
    from strata.protocol import records as rec
    return rec.build_batch([rec.SimpleRecord(b"v", b"k")])


def test_the_metadata_deletes_the_replicas_of_a_deleted_topic_and_keeps_the_rest(
        fake_zk, tmp_path):
    broker = Broker(fake_zk, tmp_path)
    assert broker.hosted_dirs() == ["t-0", "t-1", "u-0"]
    fake_zk.delete_topic("t")
    fake_zk.changed()
    eventually(lambda: len(broker.deleted_dirs()) == 2, "t's replicas deleted")
    assert [n for n in broker.hosted_dirs() if not n.endswith(DELETE_DIR_SUFFIX)] == ["u-0"]
    broker.md.close()


def test_the_metadata_deletes_a_replica_reassigned_away(fake_zk, tmp_path):
    broker = Broker(fake_zk, tmp_path)
    fake_zk.topic("u", U_ID, [[3, 2]])
    fake_zk.changed()
    eventually(lambda: broker.deleted_dirs(), "u-0 deleted")
    assert [n.split(".")[0] for n in broker.deleted_dirs()] == ["u-0"]
    assert sorted(tp for tp in broker.manager.partitions()) == [
        TopicPartition("t", 0), TopicPartition("t", 1)]
    broker.md.close()


def test_closing_the_metadata_while_its_view_reads_deletes_no_replica(fake_zk, tmp_path):
    broker = Broker(fake_zk, tmp_path)
    fake_zk.pause_on = z.TOPICS_PATH
    fake_zk.changed()
    assert fake_zk.paused.wait(DEADLINE_S)
    closer = threading.Thread(target=broker.md.close)
    closer.start()
    time.sleep(0.1)
    fake_zk.release.set()
    closer.join(DEADLINE_S)
    assert not closer.is_alive()
    assert broker.deleted_dirs() == [] and broker.hosted_dirs() == ["t-0", "t-1", "u-0"]
    assert len(broker.manager.partitions()) == 3
    # after close, even an image without the topics reaches no listener
    broker.md._on_image(broker.md.view_image, MetadataImage())
    assert broker.deleted_dirs() == [] and not any(None in a.values() for a in broker.applied)
    broker.manager.shutdown()


def test_a_write_waiting_for_the_view_ends_when_the_metadata_closes(fake_zk, tmp_path):
    """A creation waiting to see its leaders (a quiet wait) and one waiting to see its topic
    return at close instead of holding the broker's shutdown until their deadlines."""
    broker = Broker(fake_zk, tmp_path)
    never_shown = lambda img: False  # noqa: E731
    outcomes: list = []

    def wait(quiet: bool) -> None:
        try:
            broker.md._wait(never_shown, timeout_s=120, quiet=quiet)
            outcomes.append("returned")
        except KafkaError as exc:
            outcomes.append(exc.code)
    waiters = [threading.Thread(target=wait, args=(quiet,), daemon=True) for quiet in (True, False)]
    for w in waiters:
        w.start()
    broker.md.close()
    for w in waiters:
        w.join(DEADLINE_S)
        assert not w.is_alive()
    assert sorted(outcomes, key=str) == sorted(["returned", ErrorCode.REQUEST_TIMED_OUT], key=str)
    broker.manager.shutdown()


def test_a_closed_single_broker_metadata_tells_its_listeners_nothing_more(tmp_path):
    md = ClusterMetadata(tmp_path, 1, {})
    heard = []
    md.add_listener(SimpleNamespace(on_topic_deleted=heard.append,
                                    on_topic_created=heard.append))
    md.create_topic("t", 1, 1)
    assert len(heard) == 1
    md.close()
    md.delete_topic("t")
    assert len(heard) == 1
