"""A classic group's states and the one table of its legal transitions.

Rule of this module: a group moves from state to state only through
``ClassicGroup.transition``, which refuses any (from, to) pair missing from ``TRANSITIONS``; a
refusal is a coordinator bug, never a client's error. The table's values say what moves the
group along that edge (Kafka's ``ClassicGroupState`` keeps the same edges as
``validPreviousStates``)::

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup stored--> Stable
    Stable / CompletingRebalance --join with new metadata, leader rejoin, leave, session
        expiry--> PreparingRebalance
    PreparingRebalance --no members left--> Empty
    Empty without offsets (after expiry) or deleted --> Dead (dropped from the cache)
"""

from __future__ import annotations

from enum import Enum


class GroupState(str, Enum):
    """Kafka's classic group states; ``.value`` is the name DescribeGroups/ListGroups report."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_E = GroupState.EMPTY
_PR = GroupState.PREPARING_REBALANCE
_CR = GroupState.COMPLETING_REBALANCE
_S = GroupState.STABLE
_D = GroupState.DEAD

TRANSITIONS: dict[tuple[GroupState, GroupState], str] = {
    (_E, _PR): "a member joins",
    (_PR, _CR): "every member has rejoined, or the rebalance timeout ends the join phase",
    (_PR, _E): "the join phase ends without members",
    (_CR, _S): "the leader's assignment is stored",
    (_CR, _PR): "a member joins with new metadata, leaves, expires or misses its SyncGroup; "
                "the assignment cannot be stored",
    (_S, _PR): "a member joins with new metadata, the leader rejoins, a member leaves, expires "
               "or misses its SyncGroup; a loaded group is over capacity",
    (_E, _D): "deleted (DeleteGroups), expired without offsets, or unloaded",
    (_PR, _D): "unloaded",
    (_CR, _D): "unloaded",
    (_S, _D): "unloaded",
    (_D, _D): "unloaded while being deleted",
}


def is_legal(current: GroupState, target: GroupState) -> bool:
    return (current, target) in TRANSITIONS


def can_rebalance(state: GroupState) -> bool:
    """Whether a group in ``state`` may start a rebalance (go to PreparingRebalance)."""
    return is_legal(state, GroupState.PREPARING_REBALANCE)
