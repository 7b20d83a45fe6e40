"""``ControllerService``: the controller's runtime over ZooKeeper, one per broker (Kafka's
ZooKeeper-mode ``KafkaController`` with its ``ControllerEventManager``).

It campaigns for ``/controller``, and while it holds it runs one thread over one queue of
events; each event goes through ``controller_logic.handle`` (pure), its writes go to ZooKeeper
through ``StrataZkClient`` and, once they are all written, its notices go to a ``NoticeSink``.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Protocol, Sequence

from strata.cluster import controller_logic
from strata.cluster.controller_events import (
    AutoLeaderRebalance, ControlledShutdownRequested, BrokerFailed, BrokerRegistered, ControllerFailover, ControllerResult, CreatePartitionState,
    CreateTopic, DeleteTopic, LogDirEventNotification, Notice, PartitionsAdded, SetBrokerDirectories, SetTopicAssignment,
    TierBootstrappedReplicas,
    TopicCreated, TopicDeleted, UpdatePartitionState, Write)
from strata.cluster.image import MetadataImage, TopicImage, frozen_map
from strata.cluster.zk import znodes as z
from strata.cluster.zk.client import (
    ControllerMovedError, StateChangeHandler, StrataZkClient, ZkNodeExistsError, ZooKeeperError)
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.common.watchdog import STALLS

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 10  # reloads after lost version races before an event is given up


class NoticeSink(Protocol):
    """Where a controller's LeaderAndIsr/StopReplica notices go (the broker implements it).

    Called on the controller's thread, after the writes behind the notices are in ZooKeeper;
    it must not block (hand the notices off to the broker's own threads).
    """

    def deliver(self, broker_id: int, notices: Sequence[Notice], controller_epoch: int) -> None: ...


class LoggingNoticeSink:
    """The brokers' sink: a broker learns its partitions from ZooKeeper itself (the state
    znodes the controller has just written, through ``zk.view``), so the notices are only
    logged, as Kafka's state-change log records the requests it sends."""

    def deliver(self, broker_id: int, notices: Sequence[Notice], controller_epoch: int) -> None:
        if log.isEnabledFor(logging.DEBUG):
            for notice in notices:
                log.debug("controller epoch %d: to broker %d: %s", controller_epoch, broker_id, notice)


# --- the queue's own events (watch callbacks and session changes enqueue them) -------------

@dataclass(frozen=True)
class _Startup:
    pass


@dataclass(frozen=True)
class _Reelect:
    """``/controller`` vanished, or a new session began: campaign again."""


@dataclass(frozen=True)
class _ControllerChange:
    controller_id: int | None


@dataclass(frozen=True)
class _Expire:
    pass


@dataclass(frozen=True)
class _BrokerChange:
    pass


@dataclass(frozen=True)
class _TopicChange:
    pass


@dataclass(frozen=True)
class _PartitionModifications:
    topic: str


@dataclass(frozen=True)
class _TopicDeletion:
    pass


@dataclass(frozen=True)
class _ControlledShutdowns:
    pass


@dataclass(frozen=True)
class _Rebalance:
    pass


@dataclass(frozen=True)
class _LogDirEvents:
    """``/log_dir_event_notification`` has children: brokers' offline replicas changed."""


@dataclass(frozen=True)
class _Submitted:
    event: object
    future: Future


@dataclass(frozen=True)
class _Stop:
    pass


_CONTROL = (_Startup, _Reelect, _ControllerChange, _Expire, _Stop)  # kept when the queue drops


class _LostRace(Exception):
    """A conditional write found ZooKeeper changed since the image was read."""


def _not_controller(broker_id: int) -> KafkaError:
    return KafkaError(f"Broker {broker_id} is not the controller", ErrorCode.NOT_CONTROLLER)


class ControllerService:
    """One broker's controller: a candidate until it wins ``/controller``, then the one
    process that changes partition state until it resigns.

    Znodes (Kafka's ZooKeeper layout, see ``zk.znodes``): it creates the ephemeral
    ``/controller`` together with bumping ``/controller_epoch``; while active it watches
    ``/brokers/ids``, ``/brokers/topics`` (and each ``/brokers/topics/T``) and
    ``/admin/delete_topics`` and ``/log_dir_event_notification`` (reading
    ``/strata/offline_replicas/N``, deleting the notifications), and writes topic znodes, partition state znodes, deletion marks
    and ``/strata/broker_directories/N`` (the registrations it has handled, read at failover).

    Invariants:
    - it acts only while active, i.e. after its own election at an epoch higher than any
      controller epoch it has seen, and every write is a multi-op checking
      ``/controller_epoch``'s zkVersion, so a controller that has been succeeded (paused,
      partitioned, expired) changes nothing: the refused write makes it resign;
    - partition state writes are also conditional on the state znode's version; a lost race
      reloads the whole image from ZooKeeper, reconciles it as a failover does, and redoes the
      event (at most ``MAX_ATTEMPTS`` times);
    - notices go out only after every write of their event succeeded, stamped with the epoch;
    - ``image`` is what ZooKeeper holds as far as this controller wrote and read it; it is
      dropped (None) when not active;
    - resigning (``/controller`` moved, a refused write, session expiry, close) fails queued
      submissions with NOT_CONTROLLER and drops queued watch events.

    Threads: ``start``, ``submit`` and ``close`` may be called from any thread; everything else
    runs on the service's own thread. ZooKeeper watch and session callbacks only enqueue.
    """

    def __init__(self, zk: StrataZkClient, broker_id: int, sink: NoticeSink, *,
                 unclean_leader_election_enable: bool = False,
                 leader_imbalance_per_broker_percentage: int = 10,
                 auto_leader_rebalance_interval_s: float | None = None,
                 min_insync_replicas: int = 1, eligible_leader_replicas_enable: bool = True):
        """``auto_leader_rebalance_interval_s``: ``leader.imbalance.check.interval.seconds``
        when ``auto.leader.rebalance.enable``, else None; ``min_insync_replicas``: the broker
        default; ``eligible_leader_replicas_enable``: whether KIP-966's ELR is kept."""
        self.zk = zk
        self._rebalance_interval = auto_leader_rebalance_interval_s
        self._stopped = threading.Event()
        self.broker_id = broker_id
        self.sink = sink
        self._unclean = unclean_leader_election_enable
        self._imbalance = leader_imbalance_per_broker_percentage
        self._min_isr = min_insync_replicas
        self._elr = eligible_leader_replicas_enable
        self._queue: queue.Queue = queue.Queue()
        self._queue_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"controller-{broker_id}", daemon=True)
        self._handler_name = f"controller-{broker_id}"
        self._active = False
        self._epoch = 0
        self._epoch_zk_version = -1
        self._highest_epoch_seen = 0
        self._watching = False
        self._watched_topics: set[str] = set()
        self.image: MetadataImage | None = None

    # --- any thread ---------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def controller_epoch(self) -> int:
        """The epoch this controller acts on (0 before its first election)."""
        return self._epoch

    def start(self) -> "ControllerService":
        self.zk.register_state_change_handler(StateChangeHandler(
            self._handler_name,
            before_initializing_session=lambda: self._clear_and_put(_Expire()),
            after_initializing_session=lambda: self._put(_Reelect())))
        self._thread.start()
        self._put(_Startup())
        if self._rebalance_interval:
            threading.Thread(target=self._rebalance_timer, name=f"controller-{self.broker_id}-rebalance",
                             daemon=True).start()
        return self

    def _rebalance_timer(self) -> None:
        while not self._stopped.wait(self._rebalance_interval):
            if self._active:
                self._put(_Rebalance())

    def submit(self, event: object) -> Future:
        """Queues a controller event (ControlledShutdownRequested, AlterPartition, ElectLeaders,
        TopicCreated, ...); the future gets its ``ControllerResult`` or the ``KafkaError``
        (NOT_CONTROLLER when this broker is not, or stops being, the controller)."""
        future: Future = Future()
        self._put(_Submitted(event, future))
        return future

    def close(self) -> None:
        """Resigns (deleting ``/controller`` if held, so another broker takes over at once)."""
        self._stopped.set()
        self._clear_and_put(_Stop())
        self._thread.join()
        self.zk.unregister_state_change_handler(self._handler_name)

    def _put(self, item: object) -> None:
        with self._queue_lock:
            self._queue.put(item)

    def _clear_and_put(self, item: object) -> None:
        """Kafka's ``clearAndPut``: drops queued events (failing submissions) before ``item``."""
        self._drop_queued_work(first=item)

    def _drop_queued_work(self, first: object | None = None) -> None:
        """Empties the queue but for election and shutdown events; submissions fail."""
        with self._queue_lock:
            kept = [] if first is None else [first]
            while True:
                try:
                    queued = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(queued, _Submitted):
                    queued.future.set_exception(_not_controller(self.broker_id))
                elif isinstance(queued, _CONTROL):
                    kept.append(queued)
            for queued in kept:
                self._queue.put(queued)

    # --- the controller thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                self._resign("shutting down", delete_controller=True)
                return
            try:
                with STALLS.section(f"controller event {type(item).__name__}"):
                    self._process(item)
            except ControllerMovedError as e:
                self._resign(f"a write was refused: {e}")
                self._fail(item, _not_controller(self.broker_id))
            except KafkaError as e:
                self._fail(item, e)
                log.warning("Controller event %s refused: %s", item, e)
            except Exception as e:
                self._fail(item, KafkaError(f"{type(e).__name__}: {e}"))
                log.exception("Controller event %s failed", item)

    @staticmethod
    def _fail(item: object, error: KafkaError) -> None:
        if isinstance(item, _Submitted) and not item.future.done():
            item.future.set_exception(error)

    def _process(self, item: object) -> None:
        if isinstance(item, _Startup):
            self.zk.watch_controller(lambda controller_id: self._put(_ControllerChange(controller_id)))
            self._elect()
        elif isinstance(item, _Reelect):
            self._maybe_resign()
            self._elect()
        elif isinstance(item, _ControllerChange):
            if item.controller_id is None:
                self._maybe_resign()
                self._elect()
            elif item.controller_id != self.broker_id:
                self._resign(f"broker {item.controller_id} is the controller")
        elif isinstance(item, _Expire):
            self._resign("ZooKeeper session expired")
        elif isinstance(item, _Submitted):
            if not self._active:
                raise _not_controller(self.broker_id)
            if not item.future.set_running_or_notify_cancel():
                return
            item.future.set_result(self._decide_and_write(item.event))
        elif self._active:
            if self.image is None:  # an earlier event gave up: reload first
                self._decide_and_write(None)
            for event in self._events_from_watch(item):
                try:
                    self._decide_and_write(event)
                except KafkaError as e:
                    log.warning("Controller event %s refused: %s", event, e)
            if isinstance(item, _BrokerChange):
                self._log_live_brokers()

    def _log_live_brokers(self) -> None:
        live = sorted(self.image.alive_broker_ids()) if self.image is not None else []
        log.info("Live brokers: %s", live, extra={
            "controller_event": "live_brokers", "controller_epoch": self._epoch, "brokers": live})

    # --- election and resignation ----------------------------------------------------------

    def _note_epoch(self) -> None:
        current = self.zk.get_controller_epoch()
        if current is not None:
            self._highest_epoch_seen = max(self._highest_epoch_seen, current[0])

    def _elect(self) -> None:
        """Kafka's ``elect``: no-op while another broker holds ``/controller``."""
        if self._active:
            return
        if self.zk.get_controller_id() is not None:
            self._note_epoch()
            return
        try:
            epoch, zk_version = self.zk.register_controller_and_increment_controller_epoch(self.broker_id)
        except ControllerMovedError:
            self._note_epoch()
            log.info("Broker %d lost the controller election", self.broker_id)
            return
        if epoch <= self._highest_epoch_seen:  # cannot happen while ZooKeeper keeps its data
            log.error("Won controller epoch %d but have seen %d; not acting", epoch,
                      self._highest_epoch_seen)
            return
        self._epoch, self._epoch_zk_version, self._highest_epoch_seen = epoch, zk_version, epoch
        self._active = True
        log.info("Broker %d is the controller at epoch %d", self.broker_id, epoch,
                 extra={"controller_event": "elected", "controller_epoch": epoch})
        self._watch_cluster()
        self.image = None
        self._decide_and_write(None)
        self._log_live_brokers()
        self._put(_TopicDeletion())
        self._put(_ControlledShutdowns())
        self._put(_LogDirEvents())

    def _maybe_resign(self) -> None:
        if self._active and self.zk.get_controller_id() != self.broker_id:
            self._resign("the controller moved")

    def _resign(self, reason: str, delete_controller: bool = False) -> None:
        """Kafka's ``onControllerResignation``: stop acting and drop the queued work."""
        if not self._active:
            return
        self._active = False
        self.image = None
        self._drop_queued_work()
        log.warning("Broker %d resigns as controller of epoch %d: %s", self.broker_id, self._epoch,
                    reason, extra={"controller_event": "resigned", "controller_epoch": self._epoch,
                                   "reason": reason})
        if delete_controller:
            try:
                self.zk.delete_controller(self._epoch_zk_version)
            except ZooKeeperError as e:
                log.info("Not deleting /controller: %s", e)

    # --- watches -------------------------------------------------------------------------

    def _watch_cluster(self) -> None:
        """Registers the cluster watches once; they outlive sessions (kazoo re-arms them) and
        enqueue only, and the thread ignores what they report while not active."""
        if self._watching:
            return
        self._watching = True
        self.zk.watch_broker_ids(lambda _ids: self._put(_BrokerChange()))
        self.zk.watch_topics(lambda _names: self._put(_TopicChange()))
        self.zk.watch_topic_deletions(lambda _names: self._put(_TopicDeletion()))
        self.zk.watch_controlled_shutdowns(lambda _names: self._put(_ControlledShutdowns()))
        self.zk.watch_log_dir_event_notifications(
            lambda names: self._put(_LogDirEvents()) if names else None)

    def _watch_topics(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self._watched_topics:
                self._watched_topics.add(name)
                self.zk.watch_topic(name, lambda name=name: self._put(_PartitionModifications(name)))

    def _events_from_watch(self, item: object) -> list[object]:
        """Kafka's BrokerChange, TopicChange, PartitionModifications and TopicDeletion: what
        ZooKeeper holds now against the image, as controller events."""
        image = self.image
        if isinstance(item, _BrokerChange):
            current = {b.id: b for b in self.zk.get_all_brokers()}
            events: list[object] = [
                BrokerRegistered(reg) for i, reg in sorted(current.items())
                if (old := image.brokers.get(i)) is None or not old.alive or old.epoch != reg.epoch]
            return events + [BrokerFailed(i) for i in sorted(image.alive_broker_ids() - set(current))]
        if isinstance(item, _TopicChange):
            names = self.zk.get_all_topics()
            self._watched_topics &= names
            self._watch_topics(names)
            new = names - set(image.topics)
            return [TopicCreated(t.topic, t.topic_id or uuid.uuid4(), assignment=_replicas(t),
                                 configs=frozen_map(self.zk.get_entity_configs("topics", t.topic)))
                    for t in self.zk.get_topic_assignments(new).values() if _replicas(t)]
        if isinstance(item, _PartitionModifications):
            topic = image.topics.get(item.topic)
            found = self.zk.get_topic_assignments([item.topic]).get(item.topic)
            if topic is None or found is None or found.topic_id not in (None, topic.topic_id):
                return []
            replicas = _replicas(found)
            old = len(topic.assignment)
            if len(replicas) <= old:
                return []
            return [PartitionsAdded(item.topic, len(replicas), assignment=replicas[old:])]
        if isinstance(item, _ControlledShutdowns):
            # a broker asks once per epoch; one still draining keeps its flag in the image
            return [ControlledShutdownRequested(b, epoch)
                    for b, epoch in sorted(self.zk.get_controlled_shutdowns().items())
                    if (reg := image.brokers.get(b)) is not None and reg.alive
                    and not reg.in_controlled_shutdown]
        if isinstance(item, _Rebalance):
            return [AutoLeaderRebalance()]
        if isinstance(item, _LogDirEvents):
            # the notifications only say "look": each broker's znode holds all it reports
            names = self.zk.get_log_dir_event_notifications()
            reported = self.zk.get_all_reported(z.OFFLINE_REPLICAS_PATH)
            guarded = self.zk.get_all_reported(z.TIER_BOOTSTRAPPED_PATH)
            events: list[object] = []
            for b in sorted(image.alive_broker_ids()):
                epoch = image.brokers[b].epoch
                offline = _current(reported, b, epoch)
                if offline != image.offline_replicas.get(b, frozenset()):
                    events.append(LogDirEventNotification(b, epoch, offline))
                bootstrapped = _current(guarded, b, epoch)
                if bootstrapped != image.tier_bootstrapped.get(b, frozenset()):
                    events.append(TierBootstrappedReplicas(b, epoch, bootstrapped))
            if names:
                self.zk.delete_log_dir_event_notifications(names, self._epoch_zk_version)
            return events
        if isinstance(item, _TopicDeletion):
            marked = self.zk.get_topic_deletions()
            unknown = [t for t in marked if t not in image.topics]
            if unknown:  # Kafka drops marks of topics that do not exist
                self.zk.delete_topic_deletions(unknown, self._epoch_zk_version)
            return [TopicDeleted(t) for t in marked if t in image.topics]
        raise TypeError(f"not a watch event: {item!r}")

    # --- decide, write, publish ---------------------------------------------------------

    def _decide_and_write(self, event: object | None) -> ControllerResult | None:
        """``handle`` the event on the image, write, then publish. Without an image (just
        elected, or after a lost race) first loads one and reconciles it (ControllerFailover).
        Raises ControllerMovedError when fenced, KafkaError when the event is refused."""
        for _ in range(MAX_ATTEMPTS):
            if self.image is None:
                loaded = self._load()
                if not self._commit(controller_logic.handle(loaded, ControllerFailover(self._epoch))):
                    continue
            if event is None:
                return None
            result = controller_logic.handle(self.image, event)
            if self._commit(result):
                return result
        raise KafkaError(f"Gave up on {event!r} after {MAX_ATTEMPTS} lost version races",
                         ErrorCode.REQUEST_TIMED_OUT)

    def _commit(self, result: ControllerResult) -> bool:
        """Writes then publishes ``result``; False (image dropped) when a race was lost."""
        try:
            self._write(result.writes)
        except ControllerMovedError:
            raise
        except (_LostRace, ZooKeeperError) as e:
            log.info("Controller lost a version race (%s); reloading from ZooKeeper", e)
            self.image = None
            return False
        self.image = result.image
        by_broker: dict[int, list[Notice]] = {}
        for notice in result.notices:
            by_broker.setdefault(notice.broker_id, []).append(notice)
        for broker_id, notices in sorted(by_broker.items()):
            self.sink.deliver(broker_id, tuple(notices), self._epoch)
        return True

    def _load(self) -> MetadataImage:
        """The image as ZooKeeper holds it, one epoch below ours (so a failover applies).
        Topics without a topic id get one written (Kafka's ``setTopicIds``)."""
        brokers = {b.id: b for b in self.zk.get_all_brokers()}
        assignments = self.zk.get_topic_assignments(self.zk.get_all_topics())
        states = self.zk.get_partition_states(
            TopicPartition(t, p) for t, a in assignments.items() for p in a.partitions)
        topics = {}
        for name, found in assignments.items():
            replicas = _replicas(found)
            if not replicas:
                log.error("Ignoring topic %s: its partitions are not 0..n-1: %s", name, found)
                continue
            topic_id = found.topic_id or self._set_topic_id(found)
            adding, removing = _reassignment_fields(found)
            topics[name] = TopicImage(
                name, topic_id, replicas,
                frozen_map({tp.partition: reg for tp, reg in states.items() if tp.topic == name}),
                frozen_map(self.zk.get_entity_configs("topics", name)), adding, removing)
        offline, guarded = ({b: parts for b, (epoch, parts) in self.zk.get_all_reported(base).items()
                             if parts and b in brokers and brokers[b].epoch == epoch}
                            for base in (z.OFFLINE_REPLICAS_PATH, z.TIER_BOOTSTRAPPED_PATH))
        return MetadataImage(frozen_map(brokers), frozen_map(topics), self._epoch - 1,
                             self._unclean, self._imbalance,
                             min_insync_replicas=self._min_isr,
                             eligible_leader_replicas_enabled=self._elr,
                             broker_directories=frozen_map(self.zk.get_all_broker_directories()),
                             offline_replicas=frozen_map(offline),
                             tier_bootstrapped=frozen_map(guarded))

    def _set_topic_id(self, found: z.TopicAssignment) -> uuid.UUID:
        topic_id = uuid.uuid4()
        self._set_assignment(replace(found, topic_id=topic_id))
        return topic_id

    def _set_assignment(self, assignment: z.TopicAssignment) -> None:
        try:
            self.zk.set_topic_assignment(assignment, self._epoch_zk_version)
        except ControllerMovedError:
            raise
        except ZooKeeperError as e:
            raise _LostRace(f"{z.topic_path(assignment.topic)} changed") from e

    def _write(self, writes: Sequence[Write]) -> None:
        """Applies the writes in order; runs of partition state writes go as one pipelined
        batch (one partition at most once per batch, so a partition changed twice keeps order)."""
        i = 0
        while i < len(writes):
            kind = type(writes[i])
            if kind in (CreatePartitionState, UpdatePartitionState):
                batch: dict[TopicPartition, Write] = {}
                while i < len(writes) and type(writes[i]) is kind and writes[i].partition not in batch:
                    batch[writes[i].partition] = writes[i]
                    i += 1
                (self._create_states if kind is CreatePartitionState else self._update_states)(batch)
            else:
                _TOPIC_WRITERS[kind](self, writes[i])
                i += 1

    def _create_states(self, batch: dict[TopicPartition, CreatePartitionState]) -> None:
        results = self.zk.create_partition_states(
            {tp: w.registration for tp, w in batch.items()}, self._epoch_zk_version)
        lost = [tp for tp, r in results.items() if isinstance(r, ZooKeeperError)]
        if lost:
            raise _LostRace(f"state znodes of {lost} could not be created")

    def _update_states(self, batch: dict[TopicPartition, UpdatePartitionState]) -> None:
        # The logic's registration carries its new version; the client expects the old one.
        result = self.zk.update_leader_and_isr(
            {tp: replace(w.registration, partition_epoch=w.expected_version) for tp, w in batch.items()},
            self._epoch, self._epoch_zk_version)
        lost = list(result.to_retry) + [
            tp for tp, r in result.finished.items()
            if isinstance(r, ZooKeeperError) or r.partition_epoch != batch[tp].registration.partition_epoch]
        if lost:
            raise _LostRace(f"state znodes of {lost} changed")

    def _create_topic(self, w: CreateTopic) -> None:
        """AdminZkClient's order: configs, then the topic znode. The znode may already be
        there, written by an admin path: then it must be this topic (its id, or none yet)."""
        if w.configs and self.zk.get_entity_configs("topics", w.topic) != dict(w.configs):
            self.zk.set_or_create_entity_configs("topics", w.topic, w.configs)
        wanted = z.TopicAssignment(w.topic, w.topic_id, _assignment_map(w.assignment))
        try:
            self.zk.create_topic_assignment(wanted)
            return
        except ZkNodeExistsError:
            found = self.zk.get_topic_assignments([w.topic]).get(w.topic)
        if found is None or _replicas(found) != w.assignment or found.topic_id not in (None, w.topic_id):
            raise _LostRace(f"{z.topic_path(w.topic)} holds another topic")
        if found.topic_id is None:
            self._set_assignment(replace(found, topic_id=w.topic_id))

    def _set_topic_assignment(self, w: SetTopicAssignment) -> None:
        found = self.zk.get_topic_assignments([w.topic]).get(w.topic)
        if found is None or found.topic_id not in (None, w.topic_id):
            raise _LostRace(f"{z.topic_path(w.topic)} is gone or holds another topic")
        partitions = {p: z.ReplicaAssignment(tuple(r), tuple(w.adding_replicas.get(p, ())),
                                             tuple(w.removing_replicas.get(p, ())))
                      for p, r in enumerate(w.assignment)}
        if found.partitions == partitions and found.topic_id == w.topic_id:
            return
        self._set_assignment(replace(found, topic_id=w.topic_id, partitions=partitions))

    def _delete_topic(self, w: DeleteTopic) -> None:
        """The topic znode with its partition states, its configs, then its deletion mark."""
        found = self.zk.get_topic_assignments([w.topic]).get(w.topic)
        if found is not None and found.topic_id not in (None, w.topic_id):
            raise _LostRace(f"{z.topic_path(w.topic)} holds another topic")
        self.zk.delete_topic_znode(w.topic, self._epoch_zk_version)
        self.zk.delete_topic_configs([w.topic], self._epoch_zk_version)
        self.zk.delete_topic_deletions([w.topic], self._epoch_zk_version)
        self._watched_topics.discard(w.topic)

    def _set_broker_directories(self, w: SetBrokerDirectories) -> None:
        self.zk.set_broker_directories(w.broker_id, w.directories, self._epoch_zk_version)


_TOPIC_WRITERS: dict[type, Callable[[ControllerService, object], None]] = {
    CreateTopic: ControllerService._create_topic,
    SetTopicAssignment: ControllerService._set_topic_assignment,
    DeleteTopic: ControllerService._delete_topic,
    SetBrokerDirectories: ControllerService._set_broker_directories,
}


def _replicas(found: z.TopicAssignment) -> tuple[tuple[int, ...], ...]:
    """Partition p's replicas at index p; () when the partitions are not 0..n-1."""
    if sorted(found.partitions) != list(range(len(found.partitions))):
        return ()
    return tuple(tuple(found.partitions[p].replicas) for p in range(len(found.partitions)))


def _reassignment_fields(found: z.TopicAssignment):
    """The topic znode's adding and removing replicas as the image holds them."""
    adding = {p: tuple(a.adding_replicas) for p, a in found.partitions.items() if a.adding_replicas}
    removing = {p: tuple(a.removing_replicas) for p, a in found.partitions.items()
                if a.removing_replicas}
    return frozen_map(adding), frozen_map(removing)


def _assignment_map(assignment: Sequence[Sequence[int]]) -> dict[int, z.ReplicaAssignment]:
    return {p: z.ReplicaAssignment(tuple(r)) for p, r in enumerate(assignment)}


def _current(reports: dict[int, tuple[int, frozenset[TopicPartition]]], broker: int,
             epoch: int) -> frozenset[TopicPartition]:
    """What ``broker`` reported at its registration ``epoch`` (an older report: nothing)."""
    reported_epoch, partitions = reports.get(broker, (-1, frozenset()))
    return partitions if reported_epoch == epoch else frozenset()
