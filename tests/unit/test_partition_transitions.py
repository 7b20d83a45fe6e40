"""``Partition``'s decisions without a log, fetcher or controller: the transitions table row by
row, decisions that change nothing until committed, and the leader side (followers' fetches,
ISR changes and their answers, new leader epochs) against a small model driven by a
hypothesis state machine: the high watermark never decreases and never passes the log end of
any member of the ISR the leader holds, of its pending change or of the controller's ISR."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from strata.cluster.image import PartitionState
from strata.common.types import TopicPartition
from strata.replication.partition import (
    TRANSITIONS, AddFetcher, AdvanceHighWatermark, Incoming, OpenLog, Partition, RemoveFetcher,
    Role, StampEpoch, incoming, role)

TP = TopicPartition("t", 0)
ME = 1


def held(state: PartitionState | None, now: int = 0) -> Partition:
    """A partition as ``apply_states`` leaves it after ``state``."""
    partition = Partition(TP, ME)
    if state is not None:
        partition.commit(partition.decide(state, now))
    return partition


LEADING = PartitionState(ME, 5, (ME, 2), (ME, 2, 3), 7)
FOLLOWING = PartitionState(2, 5, (ME, 2), (ME, 2, 3), 7)
IDLE = PartitionState(-1, 5, (), (ME, 2, 3), 7)
ELSEWHERE = PartitionState(2, 5, (2, 3), (2, 3), 7)


# rule, actions (kinds in order), became leader, stopped leading
ROWS = [
    (None, None, "ignore", [], False, False),
    (LEADING, None, "stop", [RemoveFetcher], False, True),
    (FOLLOWING, None, "stop", [RemoveFetcher], False, False),
    (LEADING, LEADING._replace(leader_epoch=4), "ignore", [], False, False),
    (LEADING, LEADING._replace(partition_epoch=6), "ignore", [], False, False),
    (FOLLOWING, FOLLOWING._replace(leader_epoch=4, leader=ME), "ignore", [], False, False),
    (None, LEADING, "make_leader", [RemoveFetcher, OpenLog, StampEpoch, AdvanceHighWatermark],
     True, False),
    (FOLLOWING, LEADING._replace(leader_epoch=6), "make_leader",
     [RemoveFetcher, OpenLog, StampEpoch, AdvanceHighWatermark], True, False),
    (IDLE, LEADING._replace(leader_epoch=6), "make_leader",
     [RemoveFetcher, OpenLog, StampEpoch, AdvanceHighWatermark], True, False),
    (LEADING, LEADING._replace(leader_epoch=6), "make_leader",
     [RemoveFetcher, OpenLog, StampEpoch, AdvanceHighWatermark], False, False),
    (LEADING, LEADING._replace(isr=(ME,), partition_epoch=8), "update_leader",
     [RemoveFetcher, OpenLog, AdvanceHighWatermark], False, False),
    (None, FOLLOWING, "make_follower", [OpenLog, AddFetcher], False, False),
    (LEADING, FOLLOWING._replace(leader_epoch=6), "make_follower", [OpenLog, AddFetcher],
     False, True),
    (FOLLOWING, FOLLOWING._replace(leader=3, leader_epoch=6), "make_follower",
     [OpenLog, AddFetcher], False, False),
    (None, IDLE, "make_idle", [RemoveFetcher, OpenLog], False, False),
    (LEADING, IDLE._replace(leader_epoch=6), "make_idle", [RemoveFetcher, OpenLog], False, True),
    (FOLLOWING, ELSEWHERE._replace(leader_epoch=6), "make_idle", [RemoveFetcher], False, False),
]


@pytest.mark.parametrize("before, new, rule_name, kinds, became, stopped", ROWS)
def test_each_row_of_the_table_decides_its_actions(before, new, rule_name, kinds, became, stopped):
    partition = held(before)
    decision = partition.decide(new, 1000)
    assert decision.rule == rule_name
    assert [type(a) for a in decision.actions] == kinds
    assert all(a.tp == TP for a in decision.actions)
    assert (decision.became_leader, decision.stopped_leading) == (became, stopped)


def test_the_table_has_one_rule_for_every_pair_that_can_occur():
    possible = {(r, i) for r in Role for i in Incoming
                if not (r is Role.NONE and i in (Incoming.STALE, Incoming.LEAD_AGAIN))
                and not (r is not Role.LEADER and i is Incoming.LEAD_AGAIN)}
    assert set(TRANSITIONS) == possible


def test_a_new_leader_stamps_its_epoch_and_a_follower_fetches_from_its_leader():
    decision = held(FOLLOWING).decide(LEADING._replace(leader_epoch=6), 1000)
    assert StampEpoch(TP, 6) in decision.actions
    decision = held(LEADING).decide(FOLLOWING._replace(leader=3, leader_epoch=6), 1000)
    assert AddFetcher(TP, 3, 6) in decision.actions


def test_a_new_leadership_knows_no_follower_position_and_counts_isr_members_caught_up():
    partition = held(LEADING, now=1000)
    followers = partition.leadership.followers
    assert set(followers) == {2, 3}
    assert followers[2].log_end_offset == followers[3].log_end_offset == -1
    assert (followers[2].last_caught_up_ms, followers[3].last_caught_up_ms) == (1000, 0)


def test_the_same_epoch_keeps_the_leadership_and_drops_the_pending_change_only_when_moved_past():
    partition = held(LEADING)
    leadership = partition.leadership
    leadership.begin_isr_change(LEADING, (ME,))
    partition.commit(partition.decide(LEADING._replace(partition_epoch=7, replicas=(ME, 2, 3, 4)), 0))
    assert partition.leadership is leadership and leadership.pending_isr == (ME,)
    assert 4 in leadership.followers          # a replica added at the same epoch is tracked
    partition.commit(partition.decide(LEADING._replace(partition_epoch=8), 0))
    assert partition.leadership is leadership and leadership.pending_isr is None
    partition.commit(partition.decide(LEADING._replace(leader_epoch=6, partition_epoch=9), 0))
    assert partition.leadership is not leadership   # a new epoch is a new leadership


def test_an_answer_to_an_earlier_leadership_is_dropped():
    partition = held(LEADING)
    old = partition.leadership
    old.begin_isr_change(LEADING, (ME,))
    partition.commit(partition.decide(LEADING._replace(leader_epoch=6, partition_epoch=8), 0))
    accepted = PartitionState(ME, 5, (ME,), (), 8)
    assert not partition.isr_change_answered(old, accepted)
    assert partition.state.isr == LEADING.isr and partition.state.leader_epoch == 6


def test_an_accepted_change_replaces_the_state_only_when_newer():
    partition = held(LEADING)
    leadership = partition.leadership
    leadership.begin_isr_change(LEADING, (ME,))
    assert partition.isr_change_answered(leadership, PartitionState(ME, 5, (ME,), (), 8))
    assert (partition.state.isr, partition.state.partition_epoch) == ((ME,), 8)
    assert partition.state.replicas == LEADING.replicas   # AlterPartition carries none
    leadership.begin_isr_change(partition.state, (ME, 2))
    assert partition.isr_change_answered(leadership, PartitionState(ME, 5, (ME, 2), (), 8))
    assert partition.state.isr == (ME,) and leadership.pending_isr is None   # a notice had it


STATES = st.one_of(st.none(), st.builds(
    lambda leader, epoch, pepoch, isr, replicas: PartitionState(
        leader, epoch, tuple(sorted(isr & replicas)), tuple(sorted(replicas)), pepoch),
    st.sampled_from([-1, ME, 2, 3]), st.integers(0, 3), st.integers(0, 3),
    st.frozensets(st.sampled_from([ME, 2, 3])), st.frozensets(st.sampled_from([ME, 2, 3]))))


@given(before=STATES, new=STATES)
def test_a_decision_changes_nothing_until_committed_and_follows_the_table(before, new):
    partition = held(before)
    state, leadership = partition.state, partition.leadership
    decision = partition.decide(new, 50)
    assert (partition.state, partition.leadership) == (state, leadership)
    kind = incoming(before, new, ME)
    assert decision.rule == TRANSITIONS[(role(before, ME), kind)]
    kinds = {type(a) for a in decision.actions}
    assert (AddFetcher in kinds) == (kind is Incoming.FOLLOW)
    assert (StampEpoch in kinds) == (kind is Incoming.LEAD)
    assert decision.became_leader == (kind is Incoming.LEAD and not partition.is_leader)
    assert decision.stopped_leading == (partition.is_leader and kind in (
        Incoming.GONE, Incoming.FOLLOW, Incoming.IDLE))
    if AddFetcher in kinds:
        assert RemoveFetcher not in kinds
    partition.commit(decision)
    if kind is not Incoming.STALE:
        assert partition.state == new
        assert (partition.leadership is not None) == (kind in (Incoming.LEAD, Incoming.LEAD_AGAIN))


FOLLOWERS = (2, 3)
REPLICAS = (ME, *FOLLOWERS)


class HighWatermarkMatchesModel(RuleBasedStateMachine):
    """The leader's partition as the replica manager drives it: appends, follower fetches
    (recorded at the follower's log end, which then grows by what it received), ISR proposals
    (expansions on a fetch that may join, shrinks of lagging members), the controller's answers
    (fenced unless at its current epochs), its notices at the same epoch and leader epoch
    bumps; the high watermark moved up to ``high_watermark_target`` after each step. The
    partition starts with one, two or all three replicas in its ISR. Checked against mutants:
    a follower let into the ISR below the high watermark, a pending addition left out of the
    high watermark, a follower not yet heard from counted as caught up: each fails it."""

    @initialize(isr=st.sampled_from([(ME,), (ME, 2), REPLICAS]))
    def start(self, isr):
        self.now = 0
        self.min_isr = 1
        self.controller = PartitionState(ME, 0, isr, REPLICAS, 0)
        self.partition = held(self.controller)
        self.leader_leo = 0
        self.leo = {r: 0 for r in FOLLOWERS}        # the followers' real log ends
        self.epoch_start = 0
        self.hw = self.last_hw = 0
        self.proposal = None                        # (leadership, leader epoch, p. epoch, isr)

    def advance(self) -> None:
        target = self.partition.high_watermark_target(self.leader_leo, self.min_isr)
        if target is not None and target > self.hw:
            self.hw = target

    def propose(self, new_isr: tuple[int, ...]) -> None:
        leadership = self.partition.leadership
        if self.proposal is not None or leadership.pending_isr is not None:
            return   # one change at a time per partition
        st_ = self.partition.state
        leadership.begin_isr_change(st_, new_isr)
        self.proposal = (leadership, st_.leader_epoch, st_.partition_epoch, new_isr)

    @rule(n=st.integers(1, 5))
    def append(self, n):
        self.leader_leo += n
        self.advance()

    @rule(r=st.sampled_from(FOLLOWERS), k=st.integers(0, 6))
    def fetch(self, r, k):
        leadership = self.partition.leadership
        offset = self.leo[r]
        Partition.record_fetch(leadership.followers[r], offset, self.leader_leo, self.now, -1)
        st_ = self.partition.state
        if r not in st_.isr and leadership.pending_isr is None \
                and Partition.may_join_isr(offset, self.hw, self.epoch_start):
            self.propose(tuple(sorted({*st_.isr, r})))
        self.advance()
        self.leo[r] = min(self.leader_leo, offset + k)

    @rule(ms=st.integers(0, 20_000))
    def tick(self, ms):
        self.now += ms

    @rule()
    def shrink(self):
        lagging = self.partition.lagging(self.now, 10_000)
        if lagging:
            self.propose(tuple(r for r in self.partition.state.isr if r not in lagging))
        self.advance()

    @rule(min_isr=st.integers(1, 3))
    def set_min_isr(self, min_isr):
        self.min_isr = min_isr
        self.advance()

    @precondition(lambda self: self.proposal is not None)
    @rule(accept=st.booleans(), notice_first=st.booleans())
    def answer(self, accept, notice_first):
        leadership, leader_epoch, partition_epoch, isr = self.proposal
        self.proposal = None
        c = self.controller
        accepted = None
        if accept and (leader_epoch, partition_epoch) == (c.leader_epoch, c.partition_epoch):
            self.controller = accepted = c._replace(isr=isr, partition_epoch=c.partition_epoch + 1)
        if accepted is not None and notice_first:
            self.notice()
        self.partition.isr_change_answered(
            leadership, None if accepted is None else accepted._replace(replicas=()))
        self.advance()

    @rule()
    def notice(self):
        partition = self.partition
        partition.commit(partition.decide(self.controller, self.now))
        self.advance()

    @rule()
    def new_leader_epoch(self):
        c = self.controller
        self.controller = c._replace(leader_epoch=c.leader_epoch + 1,
                                     partition_epoch=c.partition_epoch + 1)
        decision = self.partition.decide(self.controller, self.now)
        assert StampEpoch(TP, self.controller.leader_epoch) in decision.actions
        self.partition.commit(decision)
        self.epoch_start = self.leader_leo
        self.advance()

    @invariant()
    def high_watermark_within_every_isr(self):
        members = set(self.controller.isr) | set(self.partition.state.isr)
        pending = self.partition.leadership.pending_isr
        members |= set(pending or ())
        ends = {ME: self.leader_leo, **self.leo}
        assert all(self.hw <= ends[r] for r in members), (self.hw, members, ends)
        assert self.hw <= self.leader_leo

    @invariant()
    def high_watermark_never_decreases(self):
        assert self.hw >= self.last_hw
        self.last_hw = self.hw

    @invariant()
    def every_isr_holds_the_leader(self):
        assert ME in self.partition.state.isr and ME in self.controller.isr


HighWatermarkMatchesModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                                       deadline=None)
test_high_watermark_matches_model = HighWatermarkMatchesModel.TestCase
