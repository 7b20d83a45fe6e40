"""The classic group's transition table (``strata.coordinator.group.state``) against Kafka's
``ClassicGroupState.validPreviousStates``, and ``ClassicGroup.transition`` held to it."""

from __future__ import annotations

import pytest

from strata.coordinator.group.classic_group import ClassicGroup
from strata.coordinator.group.state import TRANSITIONS, GroupState, can_rebalance, is_legal

E, PR, CR, S, D = (GroupState.EMPTY, GroupState.PREPARING_REBALANCE,
                   GroupState.COMPLETING_REBALANCE, GroupState.STABLE, GroupState.DEAD)

# Kafka 4's ClassicGroupState: each state with the states it may be entered from
KAFKA_VALID_PREVIOUS = {
    PR: {S, CR, E},
    CR: {PR},
    S: {CR},
    E: {PR},
    D: {S, PR, CR, E, D},
}


def test_the_table_has_exactly_kafkas_transitions():
    assert set(TRANSITIONS) == {(src, dst) for dst, srcs in KAFKA_VALID_PREVIOUS.items()
                                for src in srcs}
    assert all(reason for reason in TRANSITIONS.values())


def test_only_stable_completing_and_empty_groups_may_start_a_rebalance():
    assert {s for s in GroupState if can_rebalance(s)} == {S, CR, E}


@pytest.mark.parametrize("src", list(GroupState))
@pytest.mark.parametrize("dst", list(GroupState))
def test_a_group_moves_only_along_the_table(src, dst):
    group = ClassicGroup("g", now_ms=0, state=src)
    if is_legal(src, dst):
        group.transition(dst, now_ms=5)
        assert (group.state, group.state_timestamp) == (dst, 5)
    else:
        with pytest.raises(RuntimeError, match="invalid transition"):
            group.transition(dst, now_ms=5)
        assert (group.state, group.state_timestamp) == (src, 0)
