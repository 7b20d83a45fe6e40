"""One partition hosted by this broker (Kafka's ``Partition``): the controller's state of it,
and while this broker leads it, its followers and the ISR change in flight.

The controller's states move a partition through one table (``TRANSITIONS``). ``decide``
reads the partition and a new state and returns a ``Decision``: the next state and leadership,
and the actions outside the partition that the ``ReplicaManager`` carries out, in this order:
every ``RemoveFetcher`` of a batch of states first (no fetcher may append to a log once this
broker leads it), then per partition ``OpenLog``, ``StampEpoch`` and ``AdvanceHighWatermark``,
then every ``AddFetcher``. ``decide`` changes nothing; ``commit`` applies the decision to the
partition. Rows (held role, what the new state says):

======================  ===========================  ==========================================
held                    new state                    decision (actions)
======================  ===========================  ==========================================
nothing                 gone                         ``ignore`` (none)
any held role           gone                         ``stop`` (RemoveFetcher)
any held role           older than the one held      ``ignore`` (none)
not leading             this broker leads            ``make_leader`` (RemoveFetcher, OpenLog,
                                                     StampEpoch, AdvanceHighWatermark)
leader                  leads at a new leader epoch  ``make_leader`` (as above)
leader                  leads at the same epoch      ``update_leader`` (RemoveFetcher, OpenLog,
                                                     AdvanceHighWatermark)
any                     another broker leads, this   ``make_follower`` (OpenLog, AddFetcher)
                        one a replica
any                     no leader, or not a replica  ``make_idle`` (RemoveFetcher, and OpenLog
                        here                         when a replica here)
======================  ===========================  ==========================================

A new leadership (``make_leader``) starts its epoch at the log end offset and knows nothing of
its followers' positions until they fetch; an ISR member counts as caught up at that moment.
An update at the same epoch keeps the followers and the pending ISR change, unless the new
partition epoch is past the one the change was based on (the controller moved on).

The leader side (``high_watermark_target``, ``record_fetch``, ``may_join_isr``, ``lagging``,
``Leadership.begin_isr_change``, ``isr_change_answered``) reads and changes only the
partition; the log's numbers come in as arguments. Invariant: the high watermark target never
passes the log end offset of a member of the maximal ISR (the ISR plus the members a pending
change adds).

``log_failed`` is the replica manager's note that ``OpenLog`` failed (a failing disk): the
partition is hosted without a log (one broker's reads and appends try to make it again).

Threads: the replica manager serializes ``decide``/``commit`` and the answers to ISR changes
(its states lock); follower fetches update ``Follower`` fields from the fetch threads.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Union

from strata.cluster.image import PartitionState
from strata.common.types import TopicPartition


class Follower:
    """What a leader knows of one follower (Kafka's Replica state)."""

    __slots__ = ("log_end_offset", "last_caught_up_ms", "last_fetch_ms", "last_fetch_leader_leo",
                 "broker_epoch")

    def __init__(self, now_ms: int, in_isr: bool):
        self.log_end_offset = -1
        self.last_caught_up_ms = now_ms if in_isr else 0
        self.last_fetch_ms = 0
        self.last_fetch_leader_leo = -1
        self.broker_epoch = -1   # the follower's registration when it last fetched; -1 unknown


class Leadership:
    """One leader epoch of this broker's leadership: its followers and the ISR change in
    flight. A new leader epoch is a new ``Leadership``, so an answer to a change proposed in an
    earlier one is recognised (by identity) and dropped."""

    __slots__ = ("followers", "pending_isr", "pending_partition_epoch")

    def __init__(self, state: PartitionState, broker_id: int, now_ms: int):
        self.followers = {r: Follower(now_ms, r in state.isr)
                          for r in state.replicas if r != broker_id}
        self.pending_isr: tuple[int, ...] | None = None
        self.pending_partition_epoch = -1   # the partition epoch the pending change was based on

    def begin_isr_change(self, state: PartitionState, new_isr: tuple[int, ...]) -> dict[int, int]:
        """Record ``new_isr``, proposed at ``state``, as the pending change; the broker epochs
        of the members it adds, as each was last seen fetching (KIP-903; unknown ones left
        out)."""
        self.pending_isr = new_isr
        self.pending_partition_epoch = state.partition_epoch
        return {r: f.broker_epoch for r in set(new_isr) - set(state.isr)
                if (f := self.followers.get(r)) is not None and f.broker_epoch != -1}


class RemoveFetcher(NamedTuple):
    tp: TopicPartition


class AddFetcher(NamedTuple):
    tp: TopicPartition
    leader: int
    leader_epoch: int


class OpenLog(NamedTuple):
    """The replica's log, made if missing."""
    tp: TopicPartition


class StampEpoch(NamedTuple):
    """The leader epoch starts at the log end offset (under the log's lock)."""
    tp: TopicPartition
    leader_epoch: int


class AdvanceHighWatermark(NamedTuple):
    tp: TopicPartition


Action = Union[RemoveFetcher, AddFetcher, OpenLog, StampEpoch, AdvanceHighWatermark]


class Role(enum.Enum):
    NONE = "nothing"          # no state held
    LEADER = "leader"
    FOLLOWER = "follower"
    IDLE = "idle"             # a state held, without a leader or with this broker not a replica


class Incoming(enum.Enum):
    GONE = "gone"             # this broker no longer hosts the partition
    STALE = "stale"           # older (leader epoch, partition epoch) than the state held
    LEAD = "lead"             # this broker leads, at a new leader epoch or newly
    LEAD_AGAIN = "lead again"  # this broker keeps leading at the same leader epoch
    FOLLOW = "follow"
    IDLE = "idle"


class Decision(NamedTuple):
    rule: str                                # the TRANSITIONS entry that decided
    state: PartitionState | None             # what is held afterwards (None: not hosted)
    leadership: Leadership | None
    actions: tuple[Action, ...] = ()
    became_leader: bool = False
    stopped_leading: bool = False
    new_epoch: bool = False                  # a new leader epoch (Kafka's state-change log)
    clear_pending: bool = False              # the pending ISR change is dropped
    new_followers: tuple[tuple[int, Follower], ...] = ()


def role(state: PartitionState | None, broker_id: int) -> Role:
    if state is None:
        return Role.NONE
    if state.leader == broker_id:
        return Role.LEADER
    if state.leader >= 0 and broker_id in state.replicas:
        return Role.FOLLOWER
    return Role.IDLE


def incoming(held: PartitionState | None, new: PartitionState | None, broker_id: int) -> Incoming:
    if new is None:
        return Incoming.GONE
    if held is not None and (new.leader_epoch, new.partition_epoch) < \
            (held.leader_epoch, held.partition_epoch):
        return Incoming.STALE
    if new.leader == broker_id:
        same = held is not None and held.leader == broker_id and held.leader_epoch == new.leader_epoch
        return Incoming.LEAD_AGAIN if same else Incoming.LEAD
    if new.leader >= 0 and broker_id in new.replicas:
        return Incoming.FOLLOW
    return Incoming.IDLE


_HELD = tuple(Role)
# (held role, incoming) -> the Partition method that decides
TRANSITIONS: dict[tuple[Role, Incoming], str] = {
    (Role.NONE, Incoming.GONE): "ignore",
    **{(r, Incoming.GONE): "stop" for r in _HELD if r is not Role.NONE},
    **{(r, Incoming.STALE): "ignore" for r in _HELD if r is not Role.NONE},
    **{(r, Incoming.LEAD): "make_leader" for r in _HELD},
    (Role.LEADER, Incoming.LEAD_AGAIN): "update_leader",
    **{(r, Incoming.FOLLOW): "make_follower" for r in _HELD},
    **{(r, Incoming.IDLE): "make_idle" for r in _HELD},
}


class Partition:
    """A partition hosted here. ``state`` is None only before the first state is committed."""

    __slots__ = ("tp", "broker_id", "state", "leadership", "log_failed")

    def __init__(self, tp: TopicPartition, broker_id: int,
                 state: PartitionState | None = None, leadership: Leadership | None = None):
        self.tp = tp
        self.broker_id = broker_id
        self.state = state
        self.leadership = leadership
        self.log_failed = False   # its replica's log could not be made (OpenLog failed)

    @property
    def role(self) -> Role:
        return role(self.state, self.broker_id)

    @property
    def is_leader(self) -> bool:
        return self.state is not None and self.state.leader == self.broker_id

    # ---- transitions ------------------------------------------------------------------------

    def decide(self, new: PartitionState | None, now_ms: int) -> Decision:
        """What ``new`` does to this partition (``TRANSITIONS``); changes nothing."""
        rule = TRANSITIONS[(self.role, incoming(self.state, new, self.broker_id))]
        return getattr(self, rule)(new, now_ms)

    def commit(self, decision: Decision) -> None:
        """Apply ``decision`` (from ``decide``) to this partition."""
        if decision.rule == "ignore":
            return
        self.state = decision.state
        self.leadership = decision.leadership
        if decision.leadership is not None:
            if decision.clear_pending:
                decision.leadership.pending_isr = None
            for r, follower in decision.new_followers:
                decision.leadership.followers.setdefault(r, follower)

    def ignore(self, new: PartitionState | None, now_ms: int) -> Decision:
        return Decision("ignore", self.state, self.leadership)

    def stop(self, new: None, now_ms: int) -> Decision:
        return Decision("stop", None, None, (RemoveFetcher(self.tp),),
                        stopped_leading=self.is_leader)

    def make_leader(self, new: PartitionState, now_ms: int) -> Decision:
        """Kafka's makeLeader: a new leadership whose epoch starts at the log end offset."""
        tp = self.tp
        return Decision("make_leader", new, Leadership(new, self.broker_id, now_ms),
                        (RemoveFetcher(tp), OpenLog(tp), StampEpoch(tp, new.leader_epoch),
                         AdvanceHighWatermark(tp)),
                        became_leader=not self.is_leader, new_epoch=self._new_epoch(new))

    def update_leader(self, new: PartitionState, now_ms: int) -> Decision:
        """An ISR or replica change at the same leader epoch: the followers stay; the pending
        change goes when the controller moved past the partition epoch it was based on (a
        notice of an earlier, already answered change keeps it)."""
        leadership = self.leadership
        if leadership is None:   # never held without one; lead afresh
            return self.make_leader(new, now_ms)
        added = tuple((r, Follower(now_ms, r in new.isr)) for r in new.replicas
                      if r != self.broker_id and r not in leadership.followers)
        return Decision("update_leader", new, leadership,
                        (RemoveFetcher(self.tp), OpenLog(self.tp), AdvanceHighWatermark(self.tp)),
                        clear_pending=new.partition_epoch > leadership.pending_partition_epoch,
                        new_followers=added)

    def make_follower(self, new: PartitionState, now_ms: int) -> Decision:
        return Decision("make_follower", new, None,
                        (OpenLog(self.tp), AddFetcher(self.tp, new.leader, new.leader_epoch)),
                        stopped_leading=self.is_leader, new_epoch=self._new_epoch(new))

    def make_idle(self, new: PartitionState, now_ms: int) -> Decision:
        actions: tuple[Action, ...] = (RemoveFetcher(self.tp),)
        if self.broker_id in new.replicas:
            actions += (OpenLog(self.tp),)
        return Decision("make_idle", new, None, actions,
                        stopped_leading=self.is_leader, new_epoch=self._new_epoch(new))

    def _new_epoch(self, new: PartitionState) -> bool:
        return self.state is None or self.state.leader_epoch != new.leader_epoch

    # ---- leader: followers, ISR, high watermark ---------------------------------------------

    def maximal_isr(self) -> set[int]:
        """The ISR plus the members a pending change adds: what the high watermark waits for."""
        pending = self.leadership.pending_isr if self.leadership is not None else None
        return set(self.state.isr) | set(pending or ())

    def high_watermark_target(self, log_end_offset: int, min_insync_replicas: int) -> int | None:
        """The least log end offset over the maximal ISR (this leader's ``log_end_offset``
        included; a member not fetched from yet counts -1), or None when this broker does not
        lead or the ISR is under the effective min.insync.replicas (KIP-966: a replica that
        left the ISR then, an eligible leader replica, holds all below it)."""
        st = self.state
        if st is None or st.leader != self.broker_id:
            return None
        if len(st.isr) < min(min_insync_replicas, len(st.replicas)):
            return None
        leadership = self.leadership
        pending = leadership.pending_isr if leadership is not None else None
        followers = leadership.followers if leadership is not None else {}
        target = log_end_offset
        for r in st.isr if pending is None else self.maximal_isr():   # no set on the hot path
            if r != self.broker_id:
                follower = followers.get(r)
                target = min(target, follower.log_end_offset if follower is not None else -1)
        return target

    @staticmethod
    def record_fetch(follower: Follower, fetch_offset: int, leader_leo: int, now_ms: int,
                     broker_epoch: int) -> None:
        """Kafka's Replica.updateFetchStateOrThrow: caught up when the follower asked for the
        leader's end, or for at least the end the leader had at its previous fetch."""
        if fetch_offset >= leader_leo:
            follower.last_caught_up_ms = now_ms
        elif fetch_offset >= follower.last_fetch_leader_leo >= 0:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.log_end_offset = fetch_offset
        follower.last_fetch_leader_leo = leader_leo
        follower.last_fetch_ms = now_ms
        follower.broker_epoch = broker_epoch

    @staticmethod
    def may_join_isr(fetch_offset: int, high_watermark: int, epoch_start: int) -> bool:
        """Kafka's isFollowerInSync for expansion: the follower has the high watermark and
        everything of the leader's current epoch before it (``epoch_start``)."""
        return fetch_offset >= high_watermark and fetch_offset >= max(epoch_start, 0)

    def joining(self, high_watermark: int, epoch_start: int) -> set[int]:
        """Followers outside the ISR that may join it now."""
        if self.leadership is None:
            return set()
        return {r for r, f in list(self.leadership.followers.items())
                if r not in self.state.isr
                and self.may_join_isr(f.log_end_offset, high_watermark, epoch_start)}

    def lagging(self, now_ms: int, replica_lag_time_max_ms: int) -> set[int]:
        """ISR members that have not caught up within ``replica_lag_time_max_ms``."""
        followers = self.leadership.followers if self.leadership is not None else {}
        return {r for r in self.state.isr if r != self.broker_id
                and (f := followers.get(r)) is not None
                and now_ms - f.last_caught_up_ms > replica_lag_time_max_ms}

    def isr_change_answered(self, leadership: Leadership, accepted: PartitionState | None) -> bool:
        """The controller's answer to the change proposed in ``leadership``: the state it
        accepted (None: refused). False when this broker's leadership has changed since (the
        answer is dropped). An accepted state replaces the one held only at the same leader
        epoch and a later partition epoch (a notice may have brought it already)."""
        if self.leadership is not leadership:
            return False
        held = self.state
        if accepted is not None and held is not None \
                and accepted.leader_epoch == held.leader_epoch \
                and accepted.partition_epoch > held.partition_epoch:
            self.state = held._replace(isr=tuple(accepted.isr),
                                       partition_epoch=accepted.partition_epoch)
        leadership.pending_isr = None
        return True
