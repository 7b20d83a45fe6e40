"""``ZkClusterMetadata``: ``ClusterMetadata`` for a broker of a ZooKeeper cluster.

The same interface as the one-broker ``ClusterMetadata`` (everything above ``cluster/`` uses it
without knowing which runs), with ZooKeeper as the store:

- writes (CreateTopics, CreatePartitions, DeleteTopics, topic configs) go to ZooKeeper as
  Kafka 3.9's ``AdminZkClient`` writes them, from any broker: ``/config/topics/T`` then
  ``/brokers/topics/T`` with the placement made here over the registered brokers (rack-aware),
  a deletion mark under ``/admin/delete_topics``, the config znode plus its change
  notification. The controller (``ControllerService``, on whichever broker holds
  ``/controller``) turns them into partition states;
- reads come from ``ZkMetadataView``: each image it builds is diffed against what this broker
  holds, and listeners hear about it (``on_topic_created``, ``on_topic_deleted``,
  ``on_partitions_created``, ``on_topic_config_changed``, and ``on_partition_states`` with the
  states of the partitions this broker hosts or stopped hosting). Every broker, the one that
  made a change included, learns it this way, on the view's thread, in ZooKeeper's order;
- a write returns once this broker's view holds it (and, for new partitions, their leaders),
  or after ``zookeeper.metadata.wait.ms``.

Threads: API methods may be called from any thread (one at a time, under the metadata lock);
listeners are called on the view's thread, never under the metadata lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from strata.cluster.controller_events import (
    AlterPartition, AlterPartitions, ElectionType, ElectLeaders, PartitionReassignmentRequested,
    TopicConfigsChanged)
from strata.cluster.image import (
    Endpoint, LeaderRecoveryState, MetadataImage, frozen_map)
from strata.cluster.replica_deletion import replica_deletions
from strata.cluster.metadata import (
    ELECTION_NOT_NEEDED_MESSAGE, AlterPartitionItem, AlterPartitionItemResult, BrokerInfo,
    DEFAULT_BROKER_RESOURCE, ClusterMetadata, MetaPropertiesError, PartitionReassignment,
    TopicInfo, _build_image, loggable_broker_configs, random_directory_id,
    sensitive_broker_config)
from strata.cluster.replica_assignment import (
    assign_replicas_to_brokers, brokers_for_placement, new_partitions_assignment)
from strata.cluster.zk import znodes as z
from strata.cluster import scram_credentials
from strata.cluster.zk.client import StrataZkClient, ZkNodeExistsError, ZkTree, ZooKeeperError
from strata.cluster.zk.view import ZkMetadataView
from kazoo.exceptions import NodeExistsError
from strata.common.errors import ErrorCode, KafkaError
from strata.common.files import atomic_write
from strata.common.types import TopicPartition, uuid_to_kafka_str
from strata.log.log_config import LogConfig
from strata.cluster.image import PartitionState
from strata.security.scram import ScramCredential, desanitize, sanitize, user_credentials

log = logging.getLogger(__name__)

METADATA_WAIT_MS = "zookeeper.metadata.wait.ms"   # Strata's: how long a write waits for the view
DEFAULT_METADATA_WAIT_MS = 30_000
# the RLMM's setting is Kafka's rlmm.config.-prefixed key; the bare one is accepted too
RLMM_RF_KEY = "rlmm.config.remote.log.metadata.topic.replication.factor"
INTERNAL_RF_KEYS = {"__consumer_offsets": ("offsets.topic.replication.factor", 3),
                    "__remote_log_metadata": ("remote.log.metadata.topic.replication.factor", 3),
                    "__transaction_state": ("transaction.state.log.replication.factor", 3)}


DEFAULT_BROKER_ENTITY = "<default>"   # /config/brokers/<default>: every broker's defaults


def _broker_entity(resource_name: str) -> str:
    """The /config/brokers child of a BROKER resource name ("" is the cluster default)."""
    return DEFAULT_BROKER_ENTITY if resource_name == DEFAULT_BROKER_RESOURCE else resource_name


class ZkClusterMetadata(ClusterMetadata):
    def __init__(self, log_dir: Path, node_id: int, broker_props: Mapping[str, str],
                 zk: StrataZkClient):
        self.zk = zk
        self.view_image = MetadataImage()
        self._view_changed = threading.Condition()
        self._view: ZkMetadataView | None = None
        self.controller = None  # this broker's ControllerService, once started
        # set at registration: leader epochs granted to this broker's previous incarnation
        self._stale_leaderships: dict[TopicPartition, int] | None = None
        self._users_tree: ZkTree | None = None   # /config/users, once the view starts
        self.broker_epoch = -1
        super().__init__(log_dir, node_id, broker_props)
        self._wait_s = self._int_prop(METADATA_WAIT_MS, DEFAULT_METADATA_WAIT_MS) / 1000

    # ---- start and stop ------------------------------------------------------------------------

    def start_view(self) -> None:
        """Read the cluster from ZooKeeper, then follow it (listeners hear the first image)."""
        # the users' configs (SCRAM credentials), read by authentications from memory
        self._users_tree = self.zk.tree(f"{z.CONFIG_PATH}/users", lambda: None)
        self._view = ZkMetadataView(self.zk, self._on_image).start(self._wait_s)

    def close(self) -> None:
        """Stops following ZooKeeper: once this returns no listener runs or will run (the
        view's thread has stopped), so the broker may close its logs."""
        self._closed = True  # not under the lock: a writer holds it while waiting for the view
        with self._view_changed:
            self._view_changed.notify_all()  # a write waiting for the view will not see it
        if self._view is not None:
            self._view.close()
        if self._users_tree is not None:
            self._users_tree.close()

    def controlled_shutdown(self, timeout_s: float) -> bool:
        """Asks the controller to move this broker's leaderships away (Kafka's controlled
        shutdown) and waits until the view shows none that another live ISR member could take,
        or ``timeout_s``; True when drained."""
        reg = self.zk.get_broker(self.node_id)
        if reg is None:
            return False
        self.zk.request_controlled_shutdown(self.node_id, reg.epoch)

        def drained(img: MetadataImage) -> bool:
            live = {b for b in img.brokers if b != self.node_id}
            return not any(r.leader == self.node_id and live.intersection(r.isr)
                           for t in img.topics.values() for r in t.partitions.values())
        try:
            self._wait(drained, timeout_s=timeout_s)
            return True
        except KafkaError:
            return False

    # ---- identity ------------------------------------------------------------------------------

    def _load_or_write_meta_properties(self):
        """meta.properties with the cluster id of ``/cluster/id`` (made from ours if absent).
        A log dir of another cluster is refused (Kafka's InconsistentClusterIdException)."""
        existed = (self.log_dir / "meta.properties").exists()
        cluster_id, directory_id = super()._load_or_write_meta_properties()
        stored = self.zk.create_or_get_cluster_id(cluster_id)
        if stored != cluster_id:
            if existed:
                raise MetaPropertiesError(
                    f"The Cluster ID {stored} doesn't match stored clusterId Some({cluster_id}) "
                    f"in meta.properties. The broker is trying to join the wrong cluster. "
                    f"Configured zookeeper.connect may be wrong.")
            (self.log_dir / "meta.properties").unlink()
            self.cluster_id = stored
            return self._rewrite_meta_properties(stored)
        return cluster_id, directory_id

    def _rewrite_meta_properties(self, cluster_id: str):
        path = self.log_dir / "meta.properties"
        directory_id = random_directory_id()
        atomic_write(path, (f"node.id={self.node_id}\n"
                            f"directory.id={uuid_to_kafka_str(directory_id)}\n"
                            f"version=1\ncluster.id={cluster_id}\n").encode())
        return cluster_id, directory_id

    @property
    def controller_id(self) -> int:
        return self._view.controller_id if self._view is not None else -1

    def _load_topics(self):
        return _build_image([], {})  # the view fills it

    def _persist(self, topics, broker_configs=None) -> None:
        super()._persist([], {})  # topics and dynamic broker configs live in ZooKeeper

    # ---- dynamic broker configs: /config/brokers/<default> and /config/brokers/N ---------------

    def _load_dynamic_broker_configs(self) -> dict[str, dict[str, str]]:
        """None from the log dir: the view reads ``/config/brokers`` (Kafka's ZooKeeper mode)."""
        local = super()._load_dynamic_broker_configs()
        if local:
            log.warning("ignoring dynamic broker configs %s stored in %s: a cluster keeps them "
                        "in ZooKeeper (set them again with kafka-configs)",
                        loggable_broker_configs(local), self.log_dir)
        return {}

    def _store_broker_configs(self, resource_name, configs, updated) -> None:
        """Written to ZooKeeper with a change notification; applied when the view shows it."""
        entity = _broker_entity(resource_name)
        with _zk_errors(f"writing the configs of broker {entity}"):
            self.zk.set_or_create_entity_configs("brokers", entity, configs)
            self.zk.create_config_change_notification(f"brokers/{entity}")
        log.info("broker resource %r: dynamic configs now %s (ZooKeeper)", resource_name,
                 loggable_broker_configs(configs))

    def alter_broker_configs(self, resource_name, ops, incremental, validate_only=False):
        configs = super().alter_broker_configs(resource_name, ops, incremental, validate_only)
        if not validate_only:
            entity = _broker_entity(resource_name)
            self._wait(lambda img: dict(img.broker_configs.get(entity, {})) == configs)
        return configs

    def _dynamic_from(self, image: MetadataImage) -> dict[str, dict[str, str]]:
        """The dynamic broker configs the image holds, by BROKER resource name; values that are
        not valid dynamic configs are logged and left out, as Kafka does."""
        out: dict[str, dict[str, str]] = {}
        for entity, stored in image.broker_configs.items():
            name = DEFAULT_BROKER_RESOURCE if entity == DEFAULT_BROKER_ENTITY else entity
            kept = {}
            for key, value in stored.items():
                try:
                    self._check_dynamic_broker_config(key, value)
                except KafkaError as exc:
                    log.warning("ignoring the dynamic config %s=%s of broker %s: %s", key,
                                "[hidden]" if sensitive_broker_config(key) else value, entity, exc)
                    continue
                kept[key] = value
            if kept:
                out[name] = kept
        return out

    # ---- SCRAM credentials: /config/users/<user> -----------------------------------------------

    def _load_user_configs(self) -> dict[str, dict[str, str]]:
        """None from the log dir: a cluster keeps users in ZooKeeper (``/config/users``)."""
        local = super()._load_user_configs()
        if local:
            log.warning("ignoring the users %s stored in %s: a cluster keeps them in ZooKeeper "
                        "(set their credentials again with kafka-configs)", sorted(local),
                        self.log_dir)
        return {}

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """From this broker's copy of ``/config/users`` (no ZooKeeper read: any thread, the
        event loop's included); None before the view starts."""
        tree = self._users_tree
        if tree is None:
            return None
        found = tree.data(z.config_entity_path("users", sanitize(user)))
        if found is None:
            return None
        try:
            return user_credentials(z.decode_entity_config(found[0])).get(mechanism)
        except Exception:  # noqa: BLE001 - a bad znode is no credential
            log.warning("unreadable configs of user %r in ZooKeeper", user)
            return None

    def user_scram_credentials(self, user: str) -> dict[str, ScramCredential]:
        """Read from ZooKeeper itself (as Kafka's ZooKeeper mode describes), so a change made
        through any broker is seen at once."""
        with _zk_errors(f"reading the configs of user {user}"):
            return user_credentials(self.zk.get_entity_configs("users", sanitize(user)))

    def describe_user_scram_credentials(self, users):
        def all_users() -> list[str]:
            with _zk_errors("listing the users"):
                return [desanitize(n) for n in self.zk.get_all_entities_with_config("users")]
        return scram_credentials.describe(users, self.user_scram_credentials, all_users)

    def alter_user_scram_credentials(self, deletions, upsertions):
        """Each user's ``/config/users/<user>`` rewritten against the version read (its other
        entries, client quotas among them, kept) with its change notification, as Kafka's
        ``AdminZkClient.changeConfigs``; a user whose write fails gets its own error."""
        with self._lock:
            results, changes = scram_credentials.plan_alteration(
                deletions, upsertions, lambda u, m: m in self.user_scram_credentials(u))
            failed: dict[str, KafkaError] = {}
            for user, change in changes.items():
                try:
                    with _zk_errors(f"writing the configs of user {user}"):
                        self.zk.update_entity_configs(
                            "users", sanitize(user),
                            lambda config, change=change: scram_credentials.apply_changes(
                                config, change))
                except KafkaError as exc:
                    failed[user] = exc
            if failed:
                log.warning("SCRAM credentials of %s not altered: %s", sorted(failed), failed)
            else:
                log.info("SCRAM credentials of %s altered (ZooKeeper)", sorted(changes))
        return [scram_credentials.AlterResult(r.user, failed[r.user].code, str(failed[r.user]))
                if r.user in failed else r for r in results]

    # ---- brokers and partitions ----------------------------------------------------------------

    def live_brokers(self, listener: str | None = None) -> list[BrokerInfo]:
        """Registered brokers with their endpoint on ``listener`` (the first one by default)."""
        out = []
        for b in sorted(self.view_image.brokers.values(), key=lambda b: b.id):
            ep = _endpoint(b.endpoints, listener)
            if ep is not None:
                out.append(BrokerInfo(b.id, ep.host, ep.port, b.rack))
        return out

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        t = self.view_image.topics.get(topic)
        if t is None or not 0 <= partition < len(t.assignment):
            return None
        reg = t.partitions.get(partition)
        replicas = t.assignment[partition]
        if reg is None:
            return PartitionState(-1, -1, (), replicas, -1)
        return PartitionState(reg.leader, reg.leader_epoch, reg.isr, replicas, reg.partition_epoch,
                              reg.elr, reg.last_known_elr)

    def elect_leaders(self, partitions, election_type):
        """Only the active controller elects; any other broker answers NOT_CONTROLLER (the
        client then asks the controller Metadata names)."""
        wanted = list(partitions) if partitions is not None else [
            TopicPartition(n, p) for n, t in self.view_image.topics.items()
            for p in range(len(t.assignment))]
        controller = self.controller
        if controller is None or not controller.is_active:
            return {tp: (ErrorCode.NOT_CONTROLLER, None) for tp in wanted}
        try:
            result = controller.submit(ElectLeaders(tuple(wanted), ElectionType(election_type))
                                       ).result(self._wait_s)
        except KafkaError as exc:
            return {tp: (ErrorCode(exc.code), str(exc)) for tp in wanted}
        out = {}
        for tp, code in result.response.items():
            message = ELECTION_NOT_NEEDED_MESSAGE if code == ErrorCode.ELECTION_NOT_NEEDED else None
            out[tp] = (code, message)
        # the answer once this broker has seen the new leaders
        elected = {tp for tp, (code, _) in out.items() if code == ErrorCode.NONE}
        self._wait(lambda img: all(
            (r := img.registration(tp)) is not None and r == result.image.registration(tp)
            for tp in elected), quiet=True)
        return out

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        items: list[AlterPartitionItem]) -> list[AlterPartitionItemResult]:
        """AlterPartition on the active controller: the items as one AlterPartitions event
        (decided in order, written as one pipelined batch), answered within
        ``zookeeper.metadata.wait.ms``. Top-level errors (raised, as
        Kafka's ZooKeeper controller answers them): NOT_CONTROLLER here or if the controller
        resigns meanwhile, STALE_BROKER_EPOCH for a sender that is not the registered broker
        ``broker_id``, REQUEST_TIMED_OUT when the controller does not answer in time (the
        sender retries; a retry of an applied change is answered NONE). Blocks: call it off
        the event loop."""
        controller = self.controller
        if controller is None or not controller.is_active:
            raise KafkaError(f"Broker {self.node_id} is not the controller",
                             ErrorCode.NOT_CONTROLLER)
        image = controller.image  # the controller's own, to name topics the view lacks yet
        names = {t.topic_id: name for img in (image, self.view_image) if img is not None
                 for name, t in img.topics.items()}
        results: list[AlterPartitionItemResult | None] = [None] * len(items)
        proposed: list[int] = []
        for i, item in enumerate(items):
            error = _alter_partition_item_error(item, names)
            if error is not None:
                results[i] = AlterPartitionItemResult(item.topic_id, item.partition, error)
            else:
                proposed.append(i)
        if not proposed:
            return results
        future = controller.submit(AlterPartitions(tuple(AlterPartition(
            broker_id, broker_epoch, names[items[i].topic_id], items[i].partition,
            items[i].leader_epoch, items[i].partition_epoch, tuple(items[i].new_isr),
            LeaderRecoveryState(items[i].leader_recovery_state), items[i].topic_id,
            items[i].isr_broker_epochs) for i in proposed)))
        try:
            responses = future.result(self._wait_s).response
        except concurrent.futures.TimeoutError:
            raise KafkaError("The controller did not answer AlterPartition in time",
                             ErrorCode.REQUEST_TIMED_OUT) from None
        except KafkaError as exc:
            if exc.code == ErrorCode.NOT_CONTROLLER:
                raise
            for i in proposed:
                results[i] = AlterPartitionItemResult(
                    items[i].topic_id, items[i].partition, ErrorCode(exc.code))
            return results
        for i, response in zip(proposed, responses):
            item = items[i]
            if response.error == ErrorCode.STALE_BROKER_EPOCH:  # the sender's, not the partition's
                raise KafkaError(f"Broker {broker_id}'s epoch {broker_epoch} is stale",
                                 ErrorCode.STALE_BROKER_EPOCH)
            reg = response.registration
            if response.error != ErrorCode.NONE or reg is None:
                results[i] = AlterPartitionItemResult(item.topic_id, item.partition, response.error)
            else:
                results[i] = AlterPartitionItemResult(
                    item.topic_id, item.partition, ErrorCode.NONE, reg.leader, reg.leader_epoch,
                    tuple(reg.isr), reg.partition_epoch, int(reg.leader_recovery_state))
        return results

    # ---- partition reassignments (KIP-455) -----------------------------------------------------

    def _active_controller(self):
        controller = self.controller
        if controller is None or not controller.is_active:
            raise KafkaError(f"Broker {self.node_id} is not the controller", ErrorCode.NOT_CONTROLLER)
        return controller

    def alter_partition_reassignments(self, items):
        """Only the active controller reassigns (NOT_CONTROLLER elsewhere, as Kafka's ZooKeeper
        mode); the answer comes once its writes are in ZooKeeper. A partition named twice is
        reassigned to the last target, and both items get its result."""
        controller = self._active_controller()
        wanted = {tp: None if replicas is None else tuple(replicas) for tp, replicas in items}
        future = controller.submit(PartitionReassignmentRequested(frozen_map(wanted)))
        try:
            result = future.result(self._wait_s)
        except concurrent.futures.TimeoutError:
            raise KafkaError("The controller did not answer in time",
                             code=ErrorCode.REQUEST_TIMED_OUT) from None
        return [result.response[tp] for tp, _ in items]

    def list_partition_reassignments(self, partitions):
        """The active controller's reassignments in progress (NOT_CONTROLLER elsewhere)."""
        controller = self._active_controller()
        image = controller.image or self.view_image
        wanted = None if partitions is None else set(partitions)
        out = {}
        for name, t in sorted(image.topics.items()):
            for p in sorted(set(t.adding_replicas) | set(t.removing_replicas)):
                tp = TopicPartition(name, p)
                if wanted is None or tp in wanted:
                    out[tp] = PartitionReassignment(tuple(t.assignment[p]),
                                                    tuple(t.adding_replicas.get(p, ())),
                                                    tuple(t.removing_replicas.get(p, ())))
        return out

    # ---- placement -----------------------------------------------------------------------------

    def _registered(self) -> list[tuple[int, str | None]]:
        return brokers_for_placement(self.view_image.brokers.values())

    def _check_placement(self, partitions: int, replication_factor: int,
                         manual: list[list[int]] | None = None) -> list[list[int]]:
        if manual is not None:
            return manual
        brokers = self._registered()
        if replication_factor > len(brokers):
            raise KafkaError(f"Replication factor: {replication_factor} larger than available "
                             f"brokers: {len(brokers)}.", code=ErrorCode.INVALID_REPLICATION_FACTOR)
        found = assign_replicas_to_brokers(brokers, partitions, replication_factor)
        return [found[p] for p in range(partitions)]

    def _registered_broker_ids(self) -> set[int]:
        return {b.id for b in self.view_image.brokers.values()}

    def _place_new_partitions(self, info: TopicInfo, new_total: int, assignments):
        existing = self.view_image.topics[info.name].assignment
        if assignments is not None:
            self._check_assignments(assignments, len(existing[0]))
        return new_partitions_assignment(existing, new_total, self._registered(), assignments)

    def _internal_replication_factor(self, name: str) -> int:
        """The topic's ``*.replication.factor``: broker-managed topics wait for enough brokers
        (COORDINATOR_NOT_AVAILABLE meanwhile), as Kafka's do."""
        key, default = INTERNAL_RF_KEYS.get(name, (None, 1))
        if name == "__remote_log_metadata" and self.broker_props.get(RLMM_RF_KEY):
            key = RLMM_RF_KEY
        wanted = self._int_prop(key, default) if key else default
        live = len(self._registered())
        if wanted > live:
            raise KafkaError(f"Number of alive brokers '{live}' does not meet the required "
                             f"replication factor '{wanted}' for the {name} topic (configured "
                             f"via '{key}'). This error can be ignored if the cluster is starting "
                             "up and not all brokers are up yet.",
                             code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return wanted

    def _check_broker_partitions(self, added: int) -> None:
        pass  # max.broker.partitions is checked per broker when it hosts (apply_states)

    def partition_count(self) -> int:
        return sum(1 for t in self.view_image.topics.values()
                   for r in t.assignment if self.node_id in r)

    # ---- writes --------------------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                     configs: Mapping[str, str | None] | None = None,
                     validate_only: bool = False,
                     assignments: Mapping[int, list[int]] | None = None) -> TopicInfo:
        """Checked and written under the metadata lock (one ZooKeeper multi); the wait for the
        view after it, so that creations from many threads go on side by side."""
        info = super().create_topic(name, num_partitions, replication_factor, configs,
                                    validate_only=validate_only, assignments=assignments)
        if not validate_only:
            self._await_topic(info)
        return info

    def create_internal_topic(self, name: str, partitions: int,
                              configs: Mapping[str, str] | None = None) -> TopicInfo:
        info = super().create_internal_topic(name, partitions, configs)
        self._await_topic(info)
        return info

    def _add_topic(self, info: TopicInfo, config: LogConfig, placement=None) -> None:
        """``/brokers/topics/T`` and ``/config/topics/T`` in one multi (what AdminZkClient
        writes in two steps); a config left by an earlier topic of the name is overwritten.
        No wait here: the caller waits once the metadata lock is released."""
        assignment = z.TopicAssignment(info.name, info.topic_id, {
            p: z.ReplicaAssignment(tuple(r)) for p, r in enumerate(placement)})
        with _zk_errors("creating topic " + info.name):
            if not _create_topic_znodes(self.zk, assignment, dict(info.configs)):
                # a /config/topics/T left behind: AdminZkClient's two writes
                self.zk.set_or_create_entity_configs("topics", info.name, dict(info.configs))
                self.zk.create_topic_assignment(assignment)

    def _await_topic(self, info: TopicInfo) -> None:
        """Until this broker's view holds the topic (REQUEST_TIMED_OUT after
        ``zookeeper.metadata.wait.ms``: it is written and will be applied), then, briefly,
        its leaders (clients retry LEADER_NOT_AVAILABLE meanwhile)."""
        self._wait(lambda img: (t := img.topics.get(info.name)) is not None
                   and t.topic_id == info.topic_id)
        self._wait(lambda img: len(img.topics[info.name].partitions) == info.partitions
                   if info.name in img.topics else True, timeout_s=min(self._wait_s, 10), quiet=True)

    def _remove_topic(self, info: TopicInfo) -> TopicInfo:
        with _zk_errors("deleting topic " + info.name):
            try:
                self.zk.create_delete_topic_path(info.name)
            except ZkNodeExistsError:
                pass  # already marked for deletion
        self._wait(lambda img: (t := img.topics.get(info.name)) is None
                   or t.topic_id != info.topic_id)
        log.info("deleted topic %s (%s)", info.name, uuid_to_kafka_str(info.topic_id))
        return info

    def _grow_topic(self, info: TopicInfo, updated: TopicInfo, placement) -> None:
        current = self.zk.get_topic_assignments([info.name]).get(info.name)
        if current is None or current.topic_id != info.topic_id:
            raise KafkaError(f"The topic '{info.name}' does not exist.",
                             code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        parts = dict(current.partitions)
        for i, replicas in enumerate(placement):
            parts[info.partitions + i] = z.ReplicaAssignment(tuple(replicas))
        with _zk_errors("adding partitions to " + info.name):
            self.zk.admin_set_topic_assignment(z.TopicAssignment(
                info.name, info.topic_id, parts, current.zk_version))
        self._wait(lambda img: (t := img.topics.get(info.name)) is not None
                   and len(t.partitions) >= updated.partitions)

    def _set_topic_config(self, updated: TopicInfo, config: LogConfig) -> None:
        with _zk_errors("changing the configs of " + updated.name):
            self.zk.change_entity_config("topics", updated.name, dict(updated.configs))
        self._wait(lambda img: (t := img.topics.get(updated.name)) is not None
                   and dict(t.configs) == dict(updated.configs))

    def _announce(self, method: str, *args: Any) -> None:
        pass  # listeners hear every change from the view, this broker's own included

    def _wait(self, done: Callable[[MetadataImage], bool], timeout_s: float | None = None,
              quiet: bool = False) -> None:
        """Until the view shows ``done``, or ``zookeeper.metadata.wait.ms`` (REQUEST_TIMED_OUT:
        the change is in ZooKeeper and will still be applied; ``quiet``: just return). A closed
        view shows nothing more: that ends the wait at once, as its deadline would."""
        deadline = time.monotonic() + (self._wait_s if timeout_s is None else timeout_s)
        with self._view_changed:
            while not done(self.view_image):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    if quiet:
                        return
                    raise KafkaError("The change was written to ZooKeeper but this broker has "
                                     "not seen it applied yet", code=ErrorCode.REQUEST_TIMED_OUT)
                self._view_changed.wait(left)

    # ---- the view ------------------------------------------------------------------------------

    def _on_image(self, old: MetadataImage, new: MetadataImage) -> None:
        """Everything this broker learns of the cluster passes here, on the view's thread.
        Replicas are deleted only as ``replica_deletions`` finds it recorded."""
        if self._closed:
            return
        held = self._image.topics
        topics: dict[str, TopicInfo] = {}
        for name, t in new.topics.items():
            prev = held.get(name)
            topics[name] = TopicInfo(name, t.topic_id, len(t.assignment), dict(t.configs)) \
                if prev is None or prev.topic_id != t.topic_id or prev.partitions != len(t.assignment) \
                or prev.configs != dict(t.configs) else prev
        defaults_changed = False
        if old.broker_configs != new.broker_configs:
            # not under self._lock: writers hold it while they wait for this thread
            defaults_changed = self._apply_dynamic_broker_configs(self._dynamic_from(new))
        configs = {n: (self._image.configs[n] if held.get(n) is topics[n] and not defaults_changed
                       else self._make_config(topics[n].configs, n)) for n in topics}
        states = self._hosted_states(old, new)
        deletions = replica_deletions(self.node_id, old, new)
        if deletions.replicas:  # while the topics are still known: their logs go too
            self._notify("on_partition_states", dict.fromkeys(sorted(deletions.replicas)))
        self._image = _build_image(topics.values(), configs)
        self.view_image = new
        for gone in deletions.topics:
            info = held.get(gone.name)
            if info is None or info.topic_id != gone.topic_id:
                info = TopicInfo(gone.name, gone.topic_id, len(gone.assignment), dict(gone.configs))
            log.info("topic %s (%s) deleted", gone.name, uuid_to_kafka_str(gone.topic_id))
            self._notify("on_topic_deleted", info)
        for name, info in topics.items():
            prev = held.get(name)
            if prev is None or prev.topic_id != info.topic_id:
                self._notify("on_topic_created", info)
            elif prev is not info:
                if prev.partitions < info.partitions:
                    self._notify("on_partitions_created", info, prev.partitions)
                if prev.configs != info.configs:
                    self._notify("on_topic_config_changed", info, configs[name])
                    self._tell_controller(TopicConfigsChanged(name, frozen_map(info.configs)))
        if states:
            self._notify("on_partition_states", states)
        with self._view_changed:
            self._view_changed.notify_all()

    # ---- leaderships of a previous incarnation -------------------------------------------------

    def on_registered(self, broker_epoch: int) -> None:
        """This broker's ``/brokers/ids/N`` was created (at start, or again after a new
        session) with this epoch. A leadership ZooKeeper still gives it at that moment was
        granted to its previous incarnation, whose log this one may not have (a restart
        within the old session, a replaced disk): it is not taken until the controller,
        which sees the bounce, grants one at a higher leader epoch."""
        me = self.node_id
        stale = {TopicPartition(name, p): reg.leader_epoch
                 for name, t in self.view_image.topics.items()
                 for p, reg in t.partitions.items() if reg.leader == me}
        self._stale_leaderships = stale
        self.broker_epoch = broker_epoch
        if stale:
            log.info("broker %d registered at epoch %d; not leading %d partition(s) granted to "
                     "its previous incarnation until re-elected", me, broker_epoch, len(stale))
        self._notify("on_partition_states", self.hosted_states())

    # ---- offline replicas (replication.log_dir_failure_handler's reporter) ---------------------

    def registration_epoch(self) -> int:
        return self.broker_epoch

    def report_offline_replicas(self, broker_epoch: int, offline: frozenset[TopicPartition],
                                failed: bool) -> None:
        """``/strata/offline_replicas/N`` then a log dir event notification for the controller."""
        self.zk.report_replicas(
            z.OFFLINE_REPLICAS_PATH, self.node_id, broker_epoch, offline,
            z.LOG_DIR_FAILURE_EVENT if failed else z.LOG_DIR_RECOVERY_EVENT)

    def report_tier_bootstrapped(self, broker_epoch: int,
                                 partitions: frozenset[TopicPartition]) -> None:
        """``/strata/tier_bootstrapped/N`` then a log dir event notification for the controller."""
        self.zk.report_replicas(z.TIER_BOOTSTRAPPED_PATH, self.node_id, broker_epoch, partitions,
                                z.TIER_BOOTSTRAP_EVENT)

    def _grantable(self, tp: TopicPartition, st: PartitionState) -> PartitionState:
        """``st``, or without a leader while it names this broker as leader before its
        registration or at a leader epoch granted to its previous incarnation."""
        if st.leader != self.node_id:
            return st
        stale = self._stale_leaderships
        if stale is None or st.leader_epoch <= stale.get(tp, -1):
            return st._replace(leader=-1)
        return st

    def hosted_states(self) -> dict[TopicPartition, PartitionState]:
        """The state of every partition this broker hosts, as the view holds it now."""
        return self._hosted_states(MetadataImage(), self.view_image)

    def _tell_controller(self, event: object) -> None:
        """Hands ``event`` to this broker's controller when it is the active one (every broker
        sees a config change; the active controller acts on it)."""
        controller = self.controller
        if controller is not None and controller.is_active:
            controller.submit(event).add_done_callback(
                lambda f: f.exception() and log.info("controller refused %s: %s", event, f.exception()))

    def _hosted_states(self, old: MetadataImage, new: MetadataImage
                       ) -> dict[TopicPartition, PartitionState]:
        """The states of partitions this broker hosts in ``new`` that changed since ``old``
        (the replicas it stops hosting are ``replica_deletions``')."""
        me = self.node_id
        out: dict[TopicPartition, PartitionState] = {}
        for name, t in new.topics.items():
            before = old.topics.get(name)
            if before is not None and before.topic_id != t.topic_id:
                before = None
            for p, replicas in enumerate(t.assignment):
                reg = t.partitions.get(p)
                if me not in replicas or reg is None:
                    continue
                was = before is not None and p < len(before.assignment) and me in before.assignment[p]
                if was and before.partitions.get(p) == reg and before.assignment[p] == replicas:
                    continue
                out[TopicPartition(name, p)] = self._grantable(TopicPartition(name, p), PartitionState(
                    reg.leader, reg.leader_epoch, reg.isr, replicas, reg.partition_epoch))
        return out


def _alter_partition_item_error(item: AlterPartitionItem, names: Mapping) -> ErrorCode | None:
    """What refuses an AlterPartition item before it reaches the controller: an unknown topic
    id, or a leader recovery state that is not one. (A new member's broker epoch, v3, is the
    controller's logic's to check, on its own image: ``controller_logic``.)"""
    if item.topic_id not in names:
        return ErrorCode.UNKNOWN_TOPIC_ID
    if item.leader_recovery_state not in tuple(LeaderRecoveryState):
        return ErrorCode.INVALID_REQUEST
    return None


def _endpoint(endpoints: tuple[Endpoint, ...], listener: str | None) -> Endpoint | None:
    for ep in endpoints:
        if listener is None or ep.listener == listener:
            return ep
    return None


def _create_topic_znodes(zk: StrataZkClient, assignment: z.TopicAssignment,
                         configs: Mapping[str, str]) -> bool:
    """``/brokers/topics/T`` and ``/config/topics/T`` created in one multi (the controller
    and the views see both at once); False when only the config existed (nothing written).
    ZkNodeExistsError when the topic exists."""
    topic_path = z.topic_path(assignment.topic)
    config_path = z.config_entity_path("topics", assignment.topic)

    def build(tx) -> None:
        tx.create(topic_path, assignment.encode())
        tx.create(config_path, z.encode_entity_config(configs))
    topic_result, config_result = zk._commit(build)   # noqa: SLF001 - the client's multi
    if isinstance(topic_result, NodeExistsError):
        raise ZkNodeExistsError(f"{topic_path} already exists")
    if isinstance(config_result, NodeExistsError):
        return False
    for result in (topic_result, config_result):
        if isinstance(result, Exception):
            raise ZooKeeperError(f"creating {topic_path}: {result!r}")
    return True


@contextmanager
def _zk_errors(what: str) -> Iterator[None]:
    """ZooKeeper failures of an admin write as Kafka's errors (an existing topic included)."""
    try:
        yield
    except ZkNodeExistsError as exc:
        raise KafkaError(f"Topic already exists ({what}).", code=ErrorCode.TOPIC_ALREADY_EXISTS) from exc
    except ZooKeeperError as exc:
        raise KafkaError(f"ZooKeeper failed {what}: {exc}", code=ErrorCode.UNKNOWN_SERVER_ERROR) from exc
