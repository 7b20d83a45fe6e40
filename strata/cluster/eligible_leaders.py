"""Eligible Leader Replicas (KIP-966), as Kafka 4's ``PartitionChangeBuilder`` keeps them.

While a partition's ISR holds fewer than ``min.insync.replicas`` members, its leader does not
advance the high watermark, so every replica that was in the ISR when it shrank below that size
still holds everything up to the high watermark: those replicas are its ELR, and one of them may
be elected when the ISR is empty. With balanced recovery (Kafka's default), ``last_known_elr``
holds the last leader while the partition has neither ISR nor leader, and that replica may lead
again (an unclean election: the partition is RECOVERING) when no ISR or ELR member is left.

Rules, applied to every partition state change (``with_eligible_leaders``):

- an ISR of at least ``min_isr`` members (the topic's min.insync.replicas, at most its
  replication factor: Kafka's effective min ISR) clears the ELR;
- otherwise the ELR is the old ELR and old ISR, minus the new ISR and minus replicas whose
  broker shut down uncleanly or lost its log directory (``unclean``, ``lost``), in broker id
  order;
- an unclean election (a leader from outside the old ISR and ELR) clears the ELR;
- ``last_known_elr`` becomes the old leader (else the last ISR member) when the ISR empties,
  stays while the partition has no leader, and is cleared once it has one; a replica that
  lost its log is never in it; when the last ISR or ELR member leaves after an unclean
  shutdown, that member (it holds all there is) becomes the last known leader.

Pure functions; any thread may call them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Sequence

from strata.cluster.image import NO_LEADER, PartitionRegistration


def with_eligible_leaders(old: PartitionRegistration, new: PartitionRegistration, min_isr: int,
                          enabled: bool, unclean: AbstractSet[int] = frozenset(),
                          lost: AbstractSet[int] = frozenset()) -> PartitionRegistration:
    """``new`` (a change of ``old``'s leader or ISR) with its ELR and last known ELR."""
    if not enabled:
        return replace(new, elr=(), last_known_elr=()) if old.elr or old.last_known_elr else new
    elected_unclean = (new.leader >= 0 and new.leader != old.leader
                       and new.leader not in old.isr and new.leader not in old.elr)
    if elected_unclean or len(new.isr) >= min_isr:
        elr: tuple[int, ...] = ()
    else:
        elr = tuple(sorted((set(old.elr) | set(old.isr)) - set(new.isr) - set(unclean) - set(lost)))
    if not new.isr and old.isr:
        # the last leader; one already gone (a controller that removes dead members one by
        # one, electing after) leaves the last member, which Kafka would have elected
        last_known: tuple[int, ...] = (old.leader,) if old.leader >= 0 else old.isr[:1]
    elif new.leader >= 0:
        last_known = ()
    else:
        last_known = old.last_known_elr
    last_known = tuple(r for r in last_known if r not in lost)
    last_out = tuple(r for r in (*old.isr, *old.elr) if r in unclean)[:1]
    if last_out and not new.isr and not elr and new.leader < 0:
        # the last member out, after an unclean shutdown: it was a holder after the earlier
        # last known leader left, so it holds at least as much (Kafka keeps the earlier one)
        last_known = last_out
    return replace(new, elr=elr, last_known_elr=last_known)


def elr_leader(assignment: Sequence[int], current: PartitionRegistration,
               acceptable: AbstractSet[int]) -> int | None:
    """The first acceptable ELR member in assignment order, if the ISR has no acceptable member."""
    if any(r in acceptable for r in current.isr):
        return None
    return next((r for r in assignment if r in acceptable and r in current.elr), None)


def last_known_leader(current: PartitionRegistration, acceptable: AbstractSet[int]) -> int | None:
    """Balanced recovery: the last leader, when no ISR or ELR member is left and it may lead."""
    if current.isr or current.elr or len(current.last_known_elr) != 1:
        return None
    leader = current.last_known_elr[0]
    return leader if leader in acceptable and leader != NO_LEADER else None
