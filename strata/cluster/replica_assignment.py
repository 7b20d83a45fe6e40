"""Replica placement for new topics and partitions, as Kafka's ``AdminUtils`` and ``AdminZkClient``.

``assign_replicas_to_brokers`` spreads partitions over brokers so that leaders and followers
are balanced: partition p's first replica is broker ``(p + start_index) % n`` of the broker list,
the others follow at a shift that grows by one every ``n`` partitions. With racks, the broker
list alternates racks (``rack_alternated_broker_list``) and a replica is skipped while a rack or
broker without a replica remains, so each partition spans as many racks as it can. Start index
and shift are drawn from ``rng`` unless ``fixed_start_index`` is given, so a seeded ``Random``
gives a deterministic placement.

Pure functions; any thread may call them.
"""

from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

from strata.cluster.image import BrokerRegistration
from strata.common.errors import ErrorCode, KafkaError


def _error(code: ErrorCode, message: str) -> KafkaError:
    return KafkaError(message, code)


def rack_alternated_broker_list(broker_racks: Mapping[int, str]) -> list[int]:
    """Brokers taken one per rack in turn, racks in name order, brokers by id within a rack."""
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in broker_racks.items():
        by_rack.setdefault(rack, []).append(broker_id)
    queues = [sorted(by_rack[rack]) for rack in sorted(by_rack)]
    result: list[int] = []
    depth = 0
    while len(result) < len(broker_racks):
        result.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return result


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas_to_brokers(brokers: Sequence[tuple[int, str | None]], n_partitions: int,
                               replication_factor: int, fixed_start_index: int = -1,
                               start_partition_id: int = -1,
                               rng: random.Random | None = None) -> dict[int, list[int]]:
    """Partition id -> replica list over ``brokers`` ((id, rack) pairs, in the caller's order)."""
    if n_partitions <= 0:
        raise _error(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise _error(ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise _error(ErrorCode.INVALID_REPLICATION_FACTOR,
                     f"Replication factor: {replication_factor} larger than available brokers: "
                     f"{len(brokers)}.")
    rng = rng or random.Random()
    racks = {b: r for b, r in brokers}
    if all(r is None for r in racks.values()):
        broker_list = [b for b, _ in brokers]
        num_racks = 0
    else:
        if any(r is None for r in racks.values()):
            # Kafka's AdminOperationException: not an ApiException, so UNKNOWN_SERVER_ERROR.
            raise _error(ErrorCode.UNKNOWN_SERVER_ERROR,
                         "Not all brokers have rack information for replica rack aware assignment.")
        broker_list = rack_alternated_broker_list(racks)
        num_racks = len(set(racks.values()))
    n = len(broker_list)
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    result: dict[int, list[int]] = {}
    partition_id = max(0, start_partition_id)
    for _ in range(n_partitions):
        if partition_id > 0 and partition_id % n == 0:
            shift += 1
        first = (partition_id + start_index) % n
        replicas = [broker_list[first]]
        if num_racks == 0:
            replicas += [broker_list[_replica_index(first, shift, j, n)]
                         for j in range(replication_factor - 1)]
        else:
            used_racks = {racks[replicas[0]]}
            k = 0
            while len(replicas) < replication_factor:
                broker = broker_list[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack = racks[broker]
                if ((rack not in used_racks or len(used_racks) == num_racks)
                        and (broker not in replicas or len(replicas) == n)):
                    replicas.append(broker)
                    used_racks.add(rack)
        result[partition_id] = replicas
        partition_id += 1
    return result


def validate_new_topic_assignment(assignment: Mapping[int, Sequence[int]]) -> None:
    """``AdminZkClient.validateTopicCreate``'s assignment rules for a manual CreateTopics."""
    if any(len(r) == 0 for r in assignment.values()):
        raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                     "The manual partition assignment includes an empty replica list.")
    if len({len(r) for r in assignment.values()}) != 1:
        raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                     "All partitions should have the same number of replicas")
    if any(len(r) != len(set(r)) for r in assignment.values()):
        raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                     f"Duplicate replica assignment found: {dict(assignment)}")
    if sorted(assignment) != list(range(len(assignment))):
        raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                     "partitions should be a consecutive 0-based integer sequence")


def new_partitions_assignment(existing: Sequence[Sequence[int]], new_count: int,
                              brokers: Sequence[tuple[int, str | None]],
                              manual: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Replicas of the partitions CreatePartitions adds (``ZkAdminManager.createPartitions``)."""
    old_count = len(existing)
    increment = new_count - old_count
    if increment < 0:
        raise _error(ErrorCode.INVALID_PARTITIONS,
                     f"Topic currently has {old_count} partitions, which is higher than the "
                     f"requested {new_count}.")
    if increment == 0:
        raise _error(ErrorCode.INVALID_PARTITIONS, f"Topic already has {old_count} partitions.")
    rf = len(existing[0])
    broker_ids = [b for b, _ in brokers]
    if manual is not None:
        unknown = sorted({r for replicas in manual for r in replicas} - set(broker_ids))
        if unknown:
            raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}.")
        if len(manual) != increment:
            raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         f"Increasing the number of partitions by {increment} but {len(manual)} "
                         f"assignments provided.")
        _validate_added_partitions({old_count + i: r for i, r in enumerate(manual)}, rf)
        return [list(r) for r in manual]
    start_index = next((i for i, b in enumerate(broker_ids) if b >= existing[0][0]), 0)
    added = assign_replicas_to_brokers(brokers, increment, rf, start_index, old_count)
    return [added[p] for p in sorted(added)]


def _validate_added_partitions(assignment: Mapping[int, Sequence[int]], expected_rf: int) -> None:
    """``AdminZkClient.validateReplicaAssignment`` (brokers were checked by the caller)."""
    for partition, replicas in assignment.items():
        if not replicas:
            raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         f"Cannot have replication factor of 0 for partition id {partition}.")
        if len(replicas) != len(set(replicas)):
            raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         f"Duplicate brokers not allowed in replica assignment: "
                         f"{', '.join(map(str, replicas))} for partition id {partition}.")
    bad = sorted((p, len(r)) for p, r in assignment.items() if len(r) != expected_rf)
    if bad:
        raise _error(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                     f"Inconsistent replication factor between partitions, partition 0 has "
                     f"{expected_rf} while partitions [{', '.join(str(p) for p, _ in bad)}] have "
                     f"replication factors [{', '.join(str(n) for _, n in bad)}], respectively.")


def brokers_for_placement(registrations: Iterable[BrokerRegistration]) -> list[tuple[int, str | None]]:
    """(id, rack) of the brokers new replicas may go to, by id (``getBrokerMetadatas``)."""
    return sorted((b.id, b.rack) for b in registrations if b.eligible)
