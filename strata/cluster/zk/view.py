"""``ZkMetadataView``: one broker's live read of the cluster from ZooKeeper.

Brokers learn the cluster from ZooKeeper itself, not from controller requests: tree caches
(``/brokers``, ``/config/topics`` and ``/config/brokers``) and a watch on ``/controller`` keep an in-memory copy of
the znodes the controller writes, and every change rebuilds a ``MetadataImage`` from that copy
on the view's own thread, which hands (old image, new image) to ``on_image``. Events that
arrive together are coalesced into one rebuild.

Invariants: images are handed over in the order they were built, from one thread; a partition
state is always the newest the cache has read (ZooKeeper delivers each session's changes in
order, and the cache re-reads a znode after each of its changes), so consumers of the images
that also refuse lower leader epochs never move a partition back. While the session is lost
(``ready`` false) no image is built; after a new session the caches re-read everything.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from strata.cluster.image import MetadataImage, TopicImage, frozen_map
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

    def close(self) -> None:
        self._closed = True
        self._changed.set()
        for tree in self._trees:
            tree.close()
        if self._thread.is_alive():
            self._thread.join(5)

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
            if found is None or not found[0]:
                continue
            try:
                assignment = z.TopicAssignment.decode(name, found[0], found[1].version)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ignoring unreadable topic znode %s: %s", name, exc)
                continue
            count = len(assignment.partitions)
            if assignment.topic_id is None or sorted(assignment.partitions) != list(range(count)):
                continue  # the controller gives it an id first; a broken one stays unserved
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
