"""The leader side of replication against a small model, driven by a hypothesis state machine.

One clustered ReplicaManager (broker 1) leads partition t-0 with replicas (1, 2, 3) on a real
LogManager. Random sequences of produces (acks=1 or acks=all, min.insync.replicas 1..3),
follower fetches (each follower fetches at its own log end offset, which grows only by what it
fetched, possibly one batch at a time), clock advances, runs of the isr-expiration task,
controller answers to ISR proposals (accepted: the new state comes back both as the
AlterPartition response and as a metadata notice, in either order; or refused with an error),
controller-driven leader epoch bumps (same leader) and the leader's ZooKeeper session going in
and out of doubt (its leadership lease). After every step:

- the high watermark never decreases and never passes the leader's log end offset;
- the high watermark never passes the log end offset (as the model knows it) of any member of
  the ISR the leader holds, of the controller's committed ISR, or of a proposal still in flight
  that the controller could accept;
- every acks=all append reported done with NONE is on every member of those ISRs;
- the leader's maximal ISR (held ISR plus its pending change, which the high watermark is
  computed over) covers the committed ISR and a proposal the controller could still accept;
- a proposal adds a follower to the ISR only from that follower's fetch at or above the high
  watermark; every ISR (held, committed, proposed) contains the leader;
- while the lease is in doubt the high watermark stays where it was, no acks=all append is
  reported done and no ISR change is proposed.

A leader epoch bump, like an accepted change, is queued as a notice and applied in order.

The fake AlterPartition sender refuses a second change of a partition while one is pending
(OPERATION_NOT_ATTEMPTED), as ``AlterPartitionManager.submit`` does.

``STRATA_REPLICATION_EXAMPLES`` / ``STRATA_REPLICATION_STEPS`` raise the example count and
steps per example for a deeper run. The last test replays the shrunk example of the one
violation found (an ISR change dropped from the maximal ISR by a notice of the partition epoch
already held).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import event as _event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from strata.cluster.zk.session_lease import ZkSessionLease
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.protocol import records as rec
from strata.cluster.image import PartitionState
from strata.replication.replica_manager import ReplicaManager

TP = TopicPartition("t", 0)
LEADER = 1
FOLLOWERS = (2, 3)
REPLICAS = (LEADER, *FOLLOWERS)
LAG_MS = 30_000


def event(name: str) -> None:
    """hypothesis's ``event``, also callable when a test replays steps by hand."""
    if currently_in_test_context():
        _event(name)


@dataclass
class Proposal:
    future: Future
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    answered: bool = False


class FakeSender:
    """``alter_partition``: records each proposal; the machine answers it later."""

    def __init__(self, machine: "ReplicationMatchesModel"):
        self.machine = machine

    def submit(self, tp, leader_epoch, partition_epoch, new_isr, leader_recovery_state=0,
               broker_epochs=None) -> Future:
        m = self.machine
        future: Future = Future()
        if m.unanswered() is not None:  # as AlterPartitionManager: one pending change per partition
            event("proposal refused: one already pending")
            future.set_exception(KafkaError("already pending", ErrorCode.OPERATION_NOT_ATTEMPTED))
            return future
        m.check_proposal(tp, leader_epoch, partition_epoch, tuple(new_isr))
        m.proposals.append(Proposal(future, leader_epoch, partition_epoch, tuple(new_isr)))
        return future


class ReplicationMatchesModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="strata-repl-model-")
        self.manager = LogManager([self.dir], LogConfig({}), scheduler=ImmediateScheduler())
        self.manager.startup()
        self.clock = MockClock()
        self.lease = ZkSessionLease()
        self.lease.connected()
        self.hw_in_doubt = -1                          # the HW when the lease went in doubt
        self.rm = ReplicaManager(self.manager, lambda topic: 1 if topic == "t" else None,
                                 broker_id=LEADER, clustered=True, lease=self.lease,
                                 alter_partition=FakeSender(self))
        self.rm.clock = self.clock
        self.rm.replica_lag_time_max_ms = LAG_MS
        self.timers: list = []          # ReplicaManager.call_later: fired by a rule
        self.rm.call_later = lambda delay_s, fn: self.timers.append(fn)
        self.retrying = False
        self.controller: PartitionState | None = None   # the committed state
        self.notices: list[PartitionState] = []          # committed, not yet applied here
        self.proposals: list[Proposal] = []
        self.leader_leo = 0
        self.follower_leo = {r: 0 for r in FOLLOWERS}
        self.follower_epoch = {r: -1 for r in FOLLOWERS}   # epoch of the last batch fetched
        self.fetching: tuple[int, int, int] | None = None  # (replica, fetch offset, HW before)
        self.last_hw = 0
        self.waiting: list[tuple[int, int]] = []         # acks=all: (last offset, min.isr)
        self.acked: list[int] = []                       # acks=all last offsets answered NONE

    def teardown(self):
        self.manager.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def log(self):
        return self.rm.get_log(TP)

    def unanswered(self) -> Proposal | None:
        return next((p for p in self.proposals if not p.answered), None)

    def check_proposal(self, tp, leader_epoch, partition_epoch, new_isr) -> None:
        held = self.rm.state(tp)
        assert not self.lease.in_doubt(), f"{new_isr} proposed while the lease is in doubt"
        assert tp == TP and LEADER in new_isr, f"proposal {new_isr} without the leader"
        assert (leader_epoch, partition_epoch) == (held.leader_epoch, held.partition_epoch)
        added = set(new_isr) - set(held.isr)
        if added and self.retrying:
            # a retry after INELIGIBLE_REPLICA: only followers that hold the high watermark
            hw = self.log.high_watermark
            assert all(self.follower_leo[r] >= hw for r in added), \
                f"{added} re-proposed below the HW {hw}: {self.follower_leo}"
            event("expansion retried after INELIGIBLE_REPLICA")
        elif added:
            assert self.fetching is not None, f"{added} added outside a fetch"
            replica, offset, hw = self.fetching
            assert added == {replica}, f"{added} added from a fetch of {replica}"
            assert offset >= hw, f"{replica} added from a fetch at {offset} below the HW {hw}"
            event("expansion proposed")
        else:
            event("shrink proposed")

    # --- setup ---------------------------------------------------------------------------------

    @initialize(others=st.lists(st.sampled_from(FOLLOWERS), unique=True))
    def lead(self, others):
        self.controller = PartitionState(LEADER, 0, tuple(sorted({LEADER, *others})), REPLICAS, 0)
        change = self.rm.apply_states({TP: self.controller})
        assert change.became_leader == (TP,)

    # --- produce and fetch ---------------------------------------------------------------------

    @rule(count=st.integers(1, 3), acks_all=st.booleans(), min_isr=st.integers(1, 3))
    def produce(self, count, acks_all, min_isr):
        self.rm.min_insync_replicas = lambda topic: min_isr
        batch = rec.build_batch([rec.SimpleRecord(b"v", b"k")] * count)
        isr = self.rm.state(TP).isr
        result = self.rm.append(TP, batch, produce_version=9, required_acks=-1 if acks_all else 1)
        if acks_all and len(isr) < min_isr:
            assert result.error == ErrorCode.NOT_ENOUGH_REPLICAS
            return
        assert result.error == ErrorCode.NONE
        assert (result.base_offset, result.last_offset) == (self.leader_leo, self.leader_leo + count - 1)
        self.leader_leo += count
        if acks_all:
            self.waiting.append((result.last_offset, min_isr))

    @rule(replica=st.sampled_from(FOLLOWERS), max_bytes=st.sampled_from([1, 1 << 20]))
    def follower_fetches(self, replica, max_bytes):
        self.fetch(replica, max_bytes)

    @rule(replica=st.sampled_from(FOLLOWERS))
    def follower_catches_up(self, replica):
        """Fetches until a fetch brings nothing: the leader then knows its log end offset."""
        while self.fetch(replica, 1 << 20):
            pass

    def fetch(self, replica, max_bytes) -> bool:
        """One replica Fetch at the follower's log end offset; whether it brought records."""
        offset = self.follower_leo[replica]
        self.fetching = (replica, offset, self.log.high_watermark)
        try:
            result = self.rm.follower_fetch(TP, replica, offset, self.follower_epoch[replica],
                                            max_bytes, self.rm.state(TP).leader_epoch)
        finally:
            self.fetching = None
        assert result.error == ErrorCode.NONE, result
        assert result.diverging_epoch is None, f"{replica} at {offset}: diverging {result.diverging_epoch}"
        headers = list(rec.iter_headers(result.records))
        if headers:
            assert headers[0].base_offset == offset
            self.follower_leo[replica] = headers[-1].next_offset
            self.follower_epoch[replica] = headers[-1].partition_leader_epoch
        assert self.follower_leo[replica] <= self.leader_leo
        return bool(headers)

    # --- time and the isr-expiration task ------------------------------------------------------

    @rule(ms=st.sampled_from([100, LAG_MS // 2, LAG_MS + 1]))
    def clock_advances(self, ms):
        self.clock.advance_ms(ms)

    @rule()
    def isr_expiration(self):
        self.rm.shrink_isrs()

    # --- the leader's ZooKeeper session ---------------------------------------------------------

    @precondition(lambda self: not self.lease.in_doubt())
    @rule()
    def session_in_doubt(self):
        self.hw_in_doubt = self.log.high_watermark
        self.lease.suspended()
        event("lease in doubt")

    @precondition(lambda self: self.lease.in_doubt())
    @rule()
    def session_back(self):
        self.lease.connected()

    # --- the controller ------------------------------------------------------------------------

    @precondition(lambda self: self.unanswered() is not None)
    @rule(accept=st.sampled_from([True, True, False]), notice_first=st.booleans(),
          code=st.sampled_from([ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.INELIGIBLE_REPLICA,
                                ErrorCode.NOT_CONTROLLER]))
    def controller_answers(self, accept, notice_first, code):
        p = self.unanswered()
        p.answered = True
        c = self.controller
        current = (p.leader_epoch, p.partition_epoch) == (c.leader_epoch, c.partition_epoch)
        if accept and current:
            self.controller = c._replace(isr=p.isr, partition_epoch=c.partition_epoch + 1)
            self.notices.append(self.controller)
            if notice_first:
                self.deliver_all_notices()
            event("proposal accepted, notice first" if notice_first else "proposal accepted")
            p.future.set_result(self.controller)
            return
        if not current:  # the controller refuses a proposal on a state it no longer has
            code = ErrorCode.FENCED_LEADER_EPOCH if p.leader_epoch < c.leader_epoch \
                else ErrorCode.INVALID_UPDATE_VERSION
            event("stale proposal refused")
        p.future.set_exception(KafkaError("refused", code))

    @precondition(lambda self: self.timers)
    @rule()
    def expansion_retry_fires(self):
        self.retrying = True
        try:
            self.timers.pop(0)()
        finally:
            self.retrying = False

    @precondition(lambda self: self.notices)
    @rule()
    def notice_arrives(self):
        self.rm.apply_states({TP: self.notices.pop(0)})

    def deliver_all_notices(self):
        while self.notices:
            self.notice_arrives()

    @rule()
    def leader_epoch_bump(self):
        c = self.controller
        self.controller = c._replace(leader_epoch=c.leader_epoch + 1, partition_epoch=c.partition_epoch + 1)
        self.notices.append(self.controller)

    # --- invariants ----------------------------------------------------------------------------

    def isr_bounds(self) -> dict[str, tuple[int, ...]]:
        """The ISRs whose members must hold everything below the high watermark."""
        held = self.rm.state(TP)
        c = self.controller
        bounds = {f"held ISR (epoch {held.leader_epoch}/{held.partition_epoch})": held.isr,
                  f"committed ISR (epoch {c.leader_epoch}/{c.partition_epoch})": c.isr}
        p = self.unanswered()
        if p is not None and (p.leader_epoch, p.partition_epoch) == (c.leader_epoch, c.partition_epoch):
            bounds["in-flight proposal"] = p.isr
        return bounds

    @invariant()
    def high_watermark_is_safe(self):
        if self.controller is None:
            return
        hw = self.log.high_watermark
        assert hw >= self.last_hw, f"HW went back from {self.last_hw} to {hw}"
        assert not self.lease.in_doubt() or hw == self.hw_in_doubt, \
            f"HW moved from {self.hw_in_doubt} to {hw} while the lease was in doubt"
        self.last_hw = hw
        assert hw <= self.log.log_end_offset == self.leader_leo
        for name, isr in self.isr_bounds().items():
            assert LEADER in isr, f"{name} {isr} without the leader"
            for r in isr:
                if r != LEADER:
                    assert hw <= self.follower_leo[r], (
                        f"HW {hw} passes the log end offset {self.follower_leo[r]} of {r} "
                        f"in the {name} {isr}")

    @invariant()
    def the_leader_counts_every_isr_the_controller_may_commit(self):
        """The high watermark is the least log end offset over the leader's maximal ISR (held
        ISR plus the pending change): that must cover the committed ISR and an in-flight
        proposal, or the HW can pass a member before anyone sees it."""
        if self.controller is None:
            return
        held = self.rm.state(TP)
        pending = self.rm.partition(TP).leadership.pending_isr  # the change the leader counts
        maximal = set(held.isr) | set(pending or ())
        for name, isr in self.isr_bounds().items():
            assert set(isr) <= maximal, \
                f"the {name} {isr} is not in the leader's maximal ISR {sorted(maximal)} " \
                f"(held {held.isr}, pending {pending})"

    @invariant()
    def acknowledged_records_are_on_the_isr(self):
        if self.controller is None:
            return
        still = []
        for last_offset, min_isr in self.waiting:
            self.rm.min_insync_replicas = lambda topic: min_isr
            done, error = self.rm.enough_replicas_reached(TP, last_offset + 1)
            assert not (done and self.lease.in_doubt()), \
                f"acks=all of {last_offset} done ({error.name}) while the lease was in doubt"
            if not done:
                still.append((last_offset, min_isr))
            elif error == ErrorCode.NONE:
                self.acked.append(last_offset)
                event("acks=all acknowledged")
            else:
                assert error == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                assert len(self.rm.state(TP).isr) < min_isr
        self.waiting = still
        for name, isr in self.isr_bounds().items():
            for r in isr:
                for last_offset in self.acked:
                    assert r == LEADER or last_offset < self.follower_leo[r], (
                        f"acknowledged offset {last_offset} not on {r} "
                        f"({self.follower_leo[r]}) in the {name} {isr}")


ReplicationMatchesModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("STRATA_REPLICATION_EXAMPLES", "300")),
    stateful_step_count=int(os.environ.get("STRATA_REPLICATION_STEPS", "50")),
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReplicationMatchesModel = ReplicationMatchesModel.TestCase


def test_a_notice_of_the_partition_epoch_already_held_keeps_the_change_in_flight():
    """The shrunk example: the AlterPartition response for (1, 2) arrives before its notice;
    the leader proposes (1, 2, 3) at that partition epoch; the notice then arrives and must not
    drop the pending (1, 2, 3) from the leader's maximal ISR, or the high watermark passes
    follower 3 while the controller may still add it."""
    m = ReplicationMatchesModel()
    invariants = (m.high_watermark_is_safe, m.acknowledged_records_are_on_the_isr)
    try:
        m.lead(others=[])
        for step in (lambda: m.follower_catches_up(2),   # proposes (1, 2)
                     # accepted: the response arrives, the notice waits
                     lambda: m.controller_answers(True, False, ErrorCode.INVALID_UPDATE_VERSION),
                     lambda: m.follower_catches_up(3),   # proposes (1, 2, 3) at partition epoch 1
                     m.notice_arrives,                   # (1, 2) at partition epoch 1
                     lambda: m.produce(1, True, 1),      # acks=all, min.insync.replicas 1
                     lambda: m.follower_catches_up(2)):
            step()
            for check in invariants:
                check()
    finally:
        m.teardown()
