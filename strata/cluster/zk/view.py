"""``ZkMetadataView``: one broker's live read of the cluster from ZooKeeper.

Brokers learn the cluster from ZooKeeper itself, not from controller requests: tree caches
(``/brokers``, ``/config/topics`` and ``/config/brokers``) and a watch on ``/controller`` keep an in-memory copy of
the znodes the controller writes, and every change rebuilds a ``MetadataImage`` from that copy
on the view's own thread, which hands (old image, new image) to ``on_image``. Events that
arrive together are coalesced into one rebuild.

Invariants: images are handed over in the order they were built, from one thread; a partition
state is always the newest the cache has read (ZooKeeper delivers each session's changes in
order, and the cache re-reads a znode after each of its changes), so consumers of the images
that also refuse lower leader epochs never move a partition back. Only whole reads of an open
view are handed over (``replica_deletion.view_change``): while the session is lost (``ready``
false) no image is built, after a new session the caches re-read everything, and an image
built while ``close`` empties the caches is dropped, as is any after ``close``. A topic znode
that is listed but unreadable keeps the topic as last read: it was not deleted.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from strata.cluster.image import MetadataImage, TopicImage, frozen_map
from strata.cluster.replica_deletion import ViewChange, view_change
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import StrataZkClient, ZkTree
from strata.common.watchdog import STALLS

log = logging.getLogger(__name__)

ImageListener = Callable[[MetadataImage, MetadataImage], None]


class ZkMetadataView:
    def __init__(self, zk: StrataZkClient, on_image: ImageListener):
        self._zk = zk
        self._on_image = on_image
        self.image = MetadataImage()
        self.controller_id = -1
        self._changed = threading.Event()
        self._ready = threading.Condition()
        self._closed = False
        self._trees: list[ZkTree] = []
        self._built = False
        self._thread = threading.Thread(target=self._run, name="zk-metadata-view", daemon=True)

    def start(self, timeout: float = 60.0) -> "ZkMetadataView":
        """Starts the caches and returns once a first image from a fully read tree is out."""
        self._trees = [self._zk.tree(z.BROKERS_PATH, self._changed.set),
                       self._zk.tree(f"{z.CONFIG_PATH}/topics", self._changed.set),
                       self._zk.tree(f"{z.CONFIG_PATH}/brokers", self._changed.set)]
        self._zk.watch_controller(self._on_controller)
        self._thread.start()
        with self._ready:
            if not self._ready.wait_for(lambda: self._built or self._closed, timeout):
                raise TimeoutError("ZooKeeper metadata not read within "
                                   f"{timeout:.0f} s (zookeeper.connection.timeout.ms)")
        return self

    @property
    def ready(self) -> bool:
        return all(t.initialized for t in self._trees)

    def _on_controller(self, controller_id: int | None) -> None:
        self.controller_id = -1 if controller_id is None else controller_id

    def close(self, timeout: float = 30.0) -> None:
        """Stops the view: no image is handed over once this returns (an image being applied
        is waited for, up to ``timeout``), then empties the caches."""
        self._closed = True
        self._changed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the metadata view thread is still applying an image after %.0f s",
                            timeout)
        for tree in self._trees:
            tree.close()

    def _run(self) -> None:
        while True:
            self._changed.wait()
            self._changed.clear()
            if self._closed:
                return
            if not self.ready:
                continue
            try:
                image = self._build()
            except Exception:  # noqa: BLE001 - a bad znode must not end the view
                log.exception("cannot build the metadata image from ZooKeeper")
                continue
            # what the caches were when the read ended: close() may have emptied them
            change = view_change(closed=self._closed, whole=self.ready)
            if change is not ViewChange.READ:
                log.info("metadata image not applied: read while the view was %s", change.value)
                continue
            old, self.image = self.image, image
            if image != old:
                try:
                    with STALLS.section("applying a metadata image"):
                        self._on_image(old, image)
                except Exception:  # noqa: BLE001
                    log.exception("metadata image listener failed")
            with self._ready:
                self._built = True
                self._ready.notify_all()

    def _build(self) -> MetadataImage:
        brokers_tree, configs_tree, broker_configs_tree = self._trees
        brokers = {}
        for child in brokers_tree.children(z.BROKER_IDS_PATH):
            found = brokers_tree.data(f"{z.BROKER_IDS_PATH}/{child}")
            if found is None or not child.isdigit():
                continue
            try:
                brokers[int(child)] = z.decode_broker(int(child), found[0], found[1].czxid)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring unreadable broker registration %s: %s", child, exc)
        topics = {}
        for name in brokers_tree.children(z.TOPICS_PATH):
            found = brokers_tree.data(z.topic_path(name))
            last = self.image.topics.get(name)  # kept while its znode is unusable
            if found is None or not found[0]:
                if last is not None:
                    topics[name] = last
                continue
            try:
                assignment = z.TopicAssignment.decode(name, found[0], found[1].version)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring unreadable topic znode %s: %s", name, exc)
                if last is not None:
                    topics[name] = last
                continue
            count = len(assignment.partitions)
            if assignment.topic_id is None or sorted(assignment.partitions) != list(range(count)):
                # the controller gives it an id first; a broken one stays unserved
                if last is not None:
                    topics[name] = last
                continue
            states = {}
            for p in range(count):
                state = brokers_tree.data(z.partition_state_path(name, p))
                if state is not None and state[0]:
                    try:
                        states[p] = z.decode_partition_state(state[0], state[1].version,
                                                             state[1].mzxid)
                    except (ValueError, KeyError, TypeError) as exc:
                        log.error("ignoring unreadable state of %s-%d: %s", name, p, exc)
            config = configs_tree.data(z.config_entity_path("topics", name))
            parts = assignment.partitions
            topics[name] = TopicImage(
                name, assignment.topic_id,
                tuple(parts[p].replicas for p in range(count)),
                frozen_map(states),
                frozen_map(z.decode_entity_config(config[0]) if config else {}),
                frozen_map({p: tuple(a.adding_replicas) for p, a in parts.items() if a.adding_replicas}),
                frozen_map({p: tuple(a.removing_replicas) for p, a in parts.items()
                            if a.removing_replicas}))
        broker_configs = {}
        for name in broker_configs_tree.children(f"{z.CONFIG_PATH}/brokers"):
            found = broker_configs_tree.data(z.config_entity_path("brokers", name))
            if found is None or not found[0]:
                continue
            try:
                broker_configs[name] = frozen_map(z.decode_entity_config(found[0]))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring unreadable configs of broker %s: %s", name, exc)
        return MetadataImage(frozen_map(brokers), frozen_map(topics),
                             broker_configs=frozen_map(broker_configs))
