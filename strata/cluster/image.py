"""The cluster's metadata image: immutable value types the controller decides on.

A ``MetadataImage`` is one consistent view of the cluster: registered brokers, topics with
their replica assignments and partition states, the controller epoch and the two cluster-wide
settings the controller's decisions read. Nothing here does I/O; the ZooKeeper layer maps its
znodes onto these types one to one:

- ``/brokers/ids/N``                      -> ``BrokerRegistration`` (``epoch`` is the znode's czxid)
- ``/brokers/topics/T``                   -> ``TopicImage`` (``topic_id``, ``assignment``)
- ``/brokers/topics/T/partitions/P/state`` -> ``PartitionRegistration`` (``partition_epoch`` is
  the znode's version, so every conditional write moves it up by one)
- ``/config/topics/T``                    -> ``TopicImage.configs``
- ``/controller_epoch``                   -> ``MetadataImage.controller_epoch``
- ``/strata/broker_directories/N``        -> ``BrokerDirectories`` (the controller's memory of
  the log directories broker N last registered with)
- ``/strata/offline_replicas/N``          -> ``MetadataImage.offline_replicas[N]`` (the replicas
  broker N hosts in failed log dirs, as its current registration reported them)
- ``/strata/tier_bootstrapped/N``         -> ``MetadataImage.tier_bootstrapped[N]`` (broker N's
  replicas rebuilt from the remote tier, not yet spanning the election guard)

Invariants kept by ``strata.cluster.controller_logic`` (the only code that makes new images):
every partition's ISR is a subset of its replicas that holds the leader when there is one,
empty only while the partition has no leader; the ISR and the eligible leader replicas
(KIP-966) never share a member, and the ELR is empty while the ISR holds min.insync.replicas
members; leader and partition epochs only grow for a given topic id; a partition without a
``PartitionRegistration`` has no state znode yet (no assigned replica was alive at creation).

Threads: the values are immutable, so any thread may read them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from enum import IntEnum
from types import MappingProxyType
from typing import Iterator, Mapping, NamedTuple

from strata.common.types import TopicPartition

NO_LEADER = -1  # LeaderAndIsr.NoLeader
INITIAL_LEADER_EPOCH = 0
INITIAL_PARTITION_EPOCH = 0
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
MIN_INSYNC_REPLICAS = "min.insync.replicas"


def frozen_map(items: Mapping | None = None) -> Mapping:
    """A read-only mapping (a view over a private copy)."""
    return MappingProxyType(dict(items or {}))


class LeaderRecoveryState(IntEnum):
    """Kafka's ``LeaderRecoveryState``: RECOVERING after an unclean election until the leader says so."""

    RECOVERED = 0
    RECOVERING = 1


@dataclass(frozen=True)
class Endpoint:
    listener: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(frozen=True)
class BrokerRegistration:
    """One broker, from ``/brokers/ids/N`` (``{"version":5,"host":..,"port":..,"endpoints":
    ["PLAINTEXT://h:9092"],"listener_security_protocol_map":{..},"rack":"r1",..}``).

    ``epoch`` is the registration znode's czxid, new at every session. ``fenced`` is set when
    the session is lost (the znode vanished) and kept so the rack and endpoints stay known;
    ``in_controlled_shutdown`` while it drains. ``directory_ids`` are the ``directory.id``s of
    its log directories (KIP-858; empty when the broker does not say) and ``clean_shutdown``
    whether its logs were closed cleanly before this registration (KIP-966's unclean shutdown
    detection; True when the broker does not say). Immutable; any thread may read it.
    """

    id: int
    rack: str | None = None
    endpoints: tuple[Endpoint, ...] = ()
    epoch: int = 0
    fenced: bool = False
    in_controlled_shutdown: bool = False
    directory_ids: tuple[uuid.UUID, ...] = ()
    clean_shutdown: bool = True

    @property
    def alive(self) -> bool:
        """Registered with a live session (shutting down or not): Kafka's liveOrShuttingDown."""
        return not self.fenced

    @property
    def eligible(self) -> bool:
        """Alive and not shutting down: may lead, join an ISR or get new replicas."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(frozen=True)
class BrokerDirectories:
    """What the controller last accepted of a broker's registration: its log directory ids and
    the broker epoch of that registration (``/strata/broker_directories/N``). A registration
    at another epoch is one the controller has not handled yet; one whose directory ids lack
    one of these lost that directory. Immutable; any thread may read it."""

    directory_ids: tuple[uuid.UUID, ...] = ()
    broker_epoch: int = -1


@dataclass(frozen=True)
class PartitionRegistration:
    """One partition's state znode: ``{"version":1,"leader":1,"leader_epoch":4,
    "controller_epoch":2,"isr":[1,2]}`` plus ``"leader_recovery_state":1`` while RECOVERING
    and KIP-966's ``"eligible_leader_replicas"`` and ``"last_known_elr"`` while not empty.

    ``partition_epoch`` is the znode's version (not in the JSON). The replicas live in the
    topic's assignment. Invariants: ``leader`` is in ``isr`` or is ``NO_LEADER``; ``isr`` is
    empty only without a leader; RECOVERING only with an ISR of at most one member; ``elr``
    (replicas out of the ISR that hold everything up to the high watermark) shares no member
    with ``isr``; ``last_known_elr`` is the last leader while the partition has neither ISR
    nor leader (Kafka's balanced recovery). Immutable; any thread may read it.
    """

    leader: int
    isr: tuple[int, ...]
    leader_epoch: int = INITIAL_LEADER_EPOCH
    partition_epoch: int = INITIAL_PARTITION_EPOCH
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    controller_epoch: int = 0
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    # the znode's last modification (mzxid) when read from ZooKeeper, 0 otherwise: a leader
    # whose registration (its broker epoch, a czxid) is newer restarted after this was written
    zxid: int = field(default=0, compare=False)

    def with_leader_and_isr(self, leader: int, isr: tuple[int, ...],
                            recovery: LeaderRecoveryState | None = None) -> "PartitionRegistration":
        """Kafka's ``newLeaderAndIsr``: the leader epoch goes up by one, whatever else changes."""
        return replace(self, leader=leader, isr=tuple(isr), leader_epoch=self.leader_epoch + 1,
                       leader_recovery_state=self.leader_recovery_state if recovery is None else recovery)


class PartitionState(NamedTuple):
    """One partition as a broker holds it from the controller (Kafka's LeaderAndIsr partition
    state): what the replica manager leads or follows by."""

    leader: int                 # -1: no leader
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int = 0
    elr: tuple[int, ...] = ()              # KIP-966: eligible leader replicas (metadata only)
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicImage:
    """A topic, from ``/brokers/topics/T`` (``{"version":3,"topic_id":"<base64>",
    "partitions":{"0":[1,2,3]},"adding_replicas":{},"removing_replicas":{}}``), its
    partitions' state znodes and its ``/config/topics/T`` overrides.

    ``assignment[p]`` is partition p's replica list, preferred leader first; ``partitions``
    holds only partitions that have a state znode. While partition p is being reassigned
    (KIP-455), ``assignment[p]`` is the target replicas followed by the original ones, and
    ``adding_replicas[p]``/``removing_replicas[p]`` hold target - original and original -
    target (a partition not being reassigned has neither key). Immutable; any thread may read it.
    """

    name: str
    topic_id: uuid.UUID
    assignment: tuple[tuple[int, ...], ...]
    partitions: Mapping[int, PartitionRegistration] = field(default_factory=frozen_map)
    configs: Mapping[str, str] = field(default_factory=frozen_map)
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=frozen_map)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=frozen_map)

    def partition_ids(self) -> range:
        return range(len(self.assignment))

    def is_reassigning(self, partition: int) -> bool:
        return bool(self.adding_replicas.get(partition) or self.removing_replicas.get(partition))

    def target_replicas(self, partition: int) -> tuple[int, ...]:
        """The replicas once the reassignment completes (Kafka's ``targetReplicas``)."""
        removing = self.removing_replicas.get(partition, ())
        return tuple(r for r in self.assignment[partition] if r not in removing)

    def original_replicas(self, partition: int) -> tuple[int, ...]:
        """The replicas before the reassignment began (Kafka's ``originReplicas``), in the
        order they have in ``assignment``: as in Kafka, a cancel may reorder them."""
        adding = self.adding_replicas.get(partition, ())
        return tuple(r for r in self.assignment[partition] if r not in adding)


@dataclass(frozen=True)
class MetadataImage:
    """The whole cluster as the controller sees it (brokers by id, topics by name).

    Immutable: handlers return a new image, so any thread may read one while the controller's
    thread computes the next.
    """

    brokers: Mapping[int, BrokerRegistration] = field(default_factory=frozen_map)
    topics: Mapping[str, TopicImage] = field(default_factory=frozen_map)
    controller_epoch: int = 0
    unclean_leader_election_enable: bool = False
    leader_imbalance_per_broker_percentage: int = 10
    # the broker default of min.insync.replicas, and whether KIP-966's ELR is kept
    min_insync_replicas: int = 1
    eligible_leader_replicas_enabled: bool = True
    # /config/brokers/<name>: dynamic broker configs by entity name ("<default>", "1", ...)
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=frozen_map)
    # the controller's only: by broker id, the registration it last handled (KIP-858)
    broker_directories: Mapping[int, BrokerDirectories] = field(default_factory=frozen_map)
    # the controller's only: by broker id, the replicas in its failed log dirs (never elected,
    # never admitted to an ISR until reported back)
    offline_replicas: Mapping[int, frozenset[TopicPartition]] = field(default_factory=frozen_map)
    # the controller's only: by broker id, its replicas started at the tiered offset whose local
    # log does not span the election guard yet (KIP-1303: elected only if nobody else can)
    tier_bootstrapped: Mapping[int, frozenset[TopicPartition]] = field(default_factory=frozen_map)

    def is_replica_online(self, broker_id: int, tp: TopicPartition) -> bool:
        """False while ``broker_id`` reports its replica of ``tp`` in a failed log dir."""
        return tp not in self.offline_replicas.get(broker_id, ())

    def is_alive(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.alive

    def is_eligible(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.eligible

    def alive_broker_ids(self) -> frozenset[int]:
        return frozenset(i for i, b in self.brokers.items() if b.alive)

    def shutting_down_broker_ids(self) -> frozenset[int]:
        return frozenset(i for i, b in self.brokers.items() if b.alive and b.in_controlled_shutdown)

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        return self.topics[tp.topic].assignment[tp.partition]

    def registration(self, tp: TopicPartition) -> PartitionRegistration | None:
        topic = self.topics.get(tp.topic)
        return None if topic is None else topic.partitions.get(tp.partition)

    def all_partitions(self) -> Iterator[TopicPartition]:
        for name in sorted(self.topics):
            for p in self.topics[name].partition_ids():
                yield TopicPartition(name, p)

    def unclean_enabled(self, topic: str) -> bool:
        """The topic's ``unclean.leader.election.enable`` override, else the broker default."""
        value = self.topics[topic].configs.get(UNCLEAN_LEADER_ELECTION_ENABLE)
        return self.unclean_leader_election_enable if value is None else value.strip().lower() == "true"

    def effective_min_isr(self, tp: TopicPartition) -> int:
        """The topic's ``min.insync.replicas`` override, else the broker default, at most the
        partition's replica count (Kafka's ``getTopicEffectiveMinIsr``)."""
        value = self.topics[tp.topic].configs.get(MIN_INSYNC_REPLICAS)
        try:
            min_isr = self.min_insync_replicas if value is None else int(value)
        except ValueError:
            min_isr = self.min_insync_replicas
        return min(min_isr, len(self.replicas(tp)))
