"""The controller's vocabulary as plain data: events in, writes and notices out.

An event is something the controller learned (a broker registered, a session was lost, an
admin asked for a topic, a leader proposed a new ISR). A handler in
``strata.cluster.controller_logic`` turns (image, event) into a ``ControllerResult``: the new
image, the writes that make the store match it, and the notices brokers must get.

Writes map onto Kafka's ZooKeeper layout: ``CreateTopic``/``SetTopicAssignment``/``DeleteTopic``
on ``/brokers/topics/T``; ``CreatePartitionState`` creates
``/brokers/topics/T/partitions/P/state`` (it must not exist); ``UpdatePartitionState`` sets it
only if its version is still ``expected_version`` (the registration's new ``partition_epoch``
is ``expected_version + 1``); ``SetBrokerDirectories`` writes Strata's
``/strata/broker_directories/N``. The store applies them in order, each guarded by the controller
epoch; a refused write means this controller's image is stale and must be reloaded.

Notices are Kafka's LeaderAndIsr and StopReplica requests: ``LeaderAndIsr`` tells one broker
the state of one partition it hosts (it leads when ``leader`` is its id); a broker ignores a
notice whose ``leader_epoch`` is older than one it has acted on.

Values only; any thread may use them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Mapping

from strata.cluster.image import (
    BrokerDirectories, BrokerRegistration, LeaderRecoveryState, MetadataImage,
    PartitionRegistration, frozen_map)
from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition


class ElectionType(IntEnum):
    """ElectLeaders' election type (Kafka's ``ElectionType``)."""

    PREFERRED = 0
    UNCLEAN = 1


# --- events -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokerRegistered:
    registration: BrokerRegistration


@dataclass(frozen=True)
class BrokerFailed:
    """The broker's session is gone (its ``/brokers/ids/N`` vanished)."""

    broker_id: int


@dataclass(frozen=True)
class ControlledShutdownRequested:
    broker_id: int
    broker_epoch: int = -1  # -1: unknown, not checked (Kafka's UNKNOWN_BROKER_EPOCH)


@dataclass(frozen=True)
class TopicCreated:
    """CreateTopics for one topic: either a partition count and replication factor, or a manual
    ``assignment`` (partition p's replicas at index p). ``seed`` makes the placement repeatable."""

    name: str
    topic_id: uuid.UUID
    num_partitions: int | None = None
    replication_factor: int | None = None
    assignment: tuple[tuple[int, ...], ...] | None = None
    configs: Mapping[str, str] = field(default_factory=frozen_map)
    seed: int | None = None


@dataclass(frozen=True)
class PartitionsAdded:
    """CreatePartitions: grow ``topic`` to ``count`` partitions (``assignment`` for the new ones)."""

    topic: str
    count: int
    assignment: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class TopicDeleted:
    topic: str


@dataclass(frozen=True)
class AlterPartition:
    """A leader's ISR proposal (AlterPartition), stamped with the epochs it was based on.
    ``new_isr_broker_epochs`` (v3, KIP-903) is each member's broker epoch as the leader saw it
    fetch, -1 for unchecked; None (v2) checks none."""

    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    topic_id: uuid.UUID | None = None  # checked when given (AlterPartition v2+)
    new_isr_broker_epochs: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AlterPartitions:
    """One AlterPartition request's proposals, decided in order on one image and written
    together (one pipelined ZooKeeper batch); the response is a tuple of
    ``AlterPartitionResult``, one per proposal."""

    items: tuple[AlterPartition, ...]


@dataclass(frozen=True)
class ElectLeaders:
    partitions: tuple[TopicPartition, ...]
    election_type: ElectionType = ElectionType.PREFERRED


@dataclass(frozen=True)
class AutoLeaderRebalance:
    """The ``leader.imbalance.check.interval.seconds`` timer fired."""


@dataclass(frozen=True)
class UncleanLeaderElectionChanged:
    """The broker default of ``unclean.leader.election.enable`` changed."""

    enabled: bool


@dataclass(frozen=True)
class TopicConfigsChanged:
    """A topic's config overrides (``/config/topics/T``) as now stored: the controller decides
    with its ``unclean.leader.election.enable`` and ``min.insync.replicas``."""

    topic: str
    configs: Mapping[str, str]


@dataclass(frozen=True)
class PartitionReassignmentRequested:
    """AlterPartitionReassignments (KIP-455): each partition's target replicas, or None to
    cancel its reassignment. The response maps each partition to (error, message)."""

    partitions: Mapping[TopicPartition, tuple[int, ...] | None]


@dataclass(frozen=True)
class LogDirEventNotification:
    """Broker ``broker_id`` (at registration ``broker_epoch``) reports the replicas it hosts in
    log dirs that fail writes now: all of them, so an empty set brings every replica back
    (Kafka's ``LogDirEventNotification``; Kafka then asked the broker, Strata reads
    ``/strata/offline_replicas/N``)."""

    broker_id: int
    broker_epoch: int
    offline_replicas: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True)
class TierBootstrappedReplicas:
    """Broker ``broker_id`` (at registration ``broker_epoch``) reports its replicas started at
    the tiered offset whose local log does not yet span ``leader.election.eligible.local.log.*``
    (KIP-1303's guard): all of them, read from ``/strata/tier_bootstrapped/N``."""

    broker_id: int
    broker_epoch: int
    partitions: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True)
class ControllerFailover:
    """This broker won the controller election with ``controller_epoch``."""

    controller_epoch: int


# --- writes -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CreateTopic:
    topic: str
    topic_id: uuid.UUID
    assignment: tuple[tuple[int, ...], ...]
    configs: Mapping[str, str]


@dataclass(frozen=True)
class SetTopicAssignment:
    """The whole topic znode: replicas and the reassignment fields (partition -> brokers,
    partitions without a reassignment left out)."""

    topic: str
    topic_id: uuid.UUID
    assignment: tuple[tuple[int, ...], ...]
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=frozen_map)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class DeleteTopic:
    topic: str
    topic_id: uuid.UUID


@dataclass(frozen=True)
class CreatePartitionState:
    partition: TopicPartition
    topic_id: uuid.UUID
    registration: PartitionRegistration


@dataclass(frozen=True)
class UpdatePartitionState:
    partition: TopicPartition
    topic_id: uuid.UUID
    registration: PartitionRegistration
    expected_version: int


@dataclass(frozen=True)
class SetBrokerDirectories:
    """The controller has handled broker ``broker_id``'s registration ``directories`` names."""

    broker_id: int
    directories: BrokerDirectories


Write = (CreateTopic | SetTopicAssignment | DeleteTopic | CreatePartitionState
         | UpdatePartitionState | SetBrokerDirectories)


# --- notices ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LeaderAndIsr:
    broker_id: int
    partition: TopicPartition
    topic_id: uuid.UUID
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int
    is_new: bool = False

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id


@dataclass(frozen=True)
class StopReplica:
    broker_id: int
    partition: TopicPartition
    topic_id: uuid.UUID
    delete: bool


Notice = LeaderAndIsr | StopReplica


@dataclass(frozen=True)
class AlterPartitionResult:
    """AlterPartition's answer: the error, or NONE and the partition's state after the change."""

    error: ErrorCode
    registration: PartitionRegistration | None = None


@dataclass(frozen=True)
class ControllerResult:
    """A handler's output; ``response`` is the reply for the event's requester, if it has one."""

    image: MetadataImage
    writes: tuple[Write, ...] = ()
    notices: tuple[Notice, ...] = ()
    response: Any = None
