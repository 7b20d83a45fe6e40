"""Leader election rules, as Kafka's ``PartitionLeaderElectionAlgorithms`` and ``Election``.

Each ``elect_*`` function takes a partition's replicas (preferred first), its current
registration and the image, and returns the new registration (leader epoch bumped) or None when
no replica may lead. "Live" means alive and not shutting down (Kafka's ``isReplicaOnline``):

- offline: the first live replica in assignment order that is in the ISR, the ISR cut to its live
  members; else (KIP-966) the first live ELR member, the ISR reset to it; else, with neither ISR
  nor ELR left, the last known leader if live (balanced recovery); with unclean election, else
  the first live replica; the last two reset the ISR to the leader and make the partition
  RECOVERING;
- reassign: the first live ISR member of the target replicas, ISR unchanged;
- preferred: the first replica, if live and in the ISR, ISR unchanged;
- controlled shutdown: the first ISR member that is alive and not shutting down; shutting-down
  brokers leave the ISR.

Pure functions; any thread may call them.
"""

from __future__ import annotations

from typing import Sequence

from strata.cluster.eligible_leaders import elr_leader, last_known_leader
from strata.cluster.image import LeaderRecoveryState, MetadataImage, PartitionRegistration


def offline_partition_leader(assignment: Sequence[int], isr: Sequence[int],
                             live: set[int] | frozenset[int]) -> int | None:
    return next((r for r in assignment if r in live and r in isr), None)


def reassign_partition_leader(target: Sequence[int], isr: Sequence[int],
                              live: set[int] | frozenset[int]) -> int | None:
    return next((r for r in target if r in live and r in isr), None)


def preferred_replica_leader(assignment: Sequence[int], isr: Sequence[int],
                             live: set[int] | frozenset[int]) -> int | None:
    return assignment[0] if assignment and assignment[0] in live and assignment[0] in isr else None


def controlled_shutdown_leader(assignment: Sequence[int], isr: Sequence[int],
                               live_or_shutting_down: set[int] | frozenset[int],
                               shutting_down: set[int] | frozenset[int]) -> int | None:
    return next((r for r in assignment
                 if r in live_or_shutting_down and r in isr and r not in shutting_down), None)


def _live(image: MetadataImage, replicas: Sequence[int]) -> frozenset[int]:
    return frozenset(r for r in replicas if image.is_eligible(r))


def elect_offline(image: MetadataImage, assignment: Sequence[int], current: PartitionRegistration,
                  unclean: bool) -> PartitionRegistration | None:
    live = _live(image, assignment)
    leader = offline_partition_leader(assignment, current.isr, live)
    if leader is not None:
        return current.with_leader_and_isr(leader, tuple(r for r in current.isr if r in live))
    leader = elr_leader(assignment, current, live)
    if leader is not None:
        return current.with_leader_and_isr(leader, (leader,))
    leader = last_known_leader(current, live)
    if leader is None and unclean:
        leader = next((r for r in assignment if r in live), None)
    if leader is None:
        return None
    return current.with_leader_and_isr(leader, (leader,), LeaderRecoveryState.RECOVERING)


def elect_reassign(image: MetadataImage, target: Sequence[int],
                   current: PartitionRegistration) -> PartitionRegistration | None:
    leader = reassign_partition_leader(target, current.isr, _live(image, target))
    return None if leader is None else current.with_leader_and_isr(leader, current.isr)


def elect_preferred(image: MetadataImage, assignment: Sequence[int],
                    current: PartitionRegistration) -> PartitionRegistration | None:
    leader = preferred_replica_leader(assignment, current.isr, _live(image, assignment))
    return None if leader is None else current.with_leader_and_isr(leader, current.isr)


def elect_controlled_shutdown(image: MetadataImage, assignment: Sequence[int],
                              current: PartitionRegistration) -> PartitionRegistration | None:
    shutting_down = image.shutting_down_broker_ids()
    leader = controlled_shutdown_leader(assignment, current.isr, image.alive_broker_ids(), shutting_down)
    if leader is None:
        return None
    return current.with_leader_and_isr(leader, tuple(r for r in current.isr if r not in shutting_down))
