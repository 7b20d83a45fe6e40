"""ReplicaManager: the partitions this broker leads, and the produce/fetch/list-offsets paths.

The controller's partition states arrive through ``apply_states`` (one broker is a cluster of
one: its metadata grants it every partition, leader at epoch 0 with itself the ISR). Each
hosted partition is a ``Partition`` (strata.replication.partition), whose transitions table
decides what a state does; this broker serves as leader only the partitions it leads, at their
leader epoch, and answers the others with Kafka's errors (NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH); it follows the others through ``fetchers``
(strata.replication.replica_fetcher).

A leader (Kafka's Partition) tracks each follower's log end offset from its replica Fetches;
invariants:
- the high watermark only grows, and never passes the log end offset of any member of the
  maximal ISR (the ISR plus members a pending AlterPartition adds), so an acknowledged acks=all
  record is on every ISR member;
- a follower joins the ISR only once it has reached the high watermark and this leader epoch's
  start offset (proposed with the broker epoch it fetched at, KIP-903, so the controller never
  admits a later incarnation on it), and leaves it after ``replica.lag.time.max.ms`` without
  catching up; either change is proposed to the controller (``alter_partition``), one at a time
  per partition, and takes effect when the controller accepts it;
- a follower whose last fetched epoch diverges from this log is told where (KIP-320) and
  appends nothing until it has truncated;
- while the broker's leadership lease is in doubt (its ZooKeeper session may have expired, and
  another broker may lead the same partitions) no high watermark moves, no acks=all wait
  completes and no ISR change is proposed; appends and fetches go on. Once the lease is held
  again, high watermarks catch up and acks=all waiters are woken.

Synchronous and thread-safe (each log has its own lock); the server awaits nothing here.
``on_append`` is called with the partition after every append, to wake delayed fetches.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, NamedTuple

from strata.cluster.image import PartitionState
from strata.common.clock import SYSTEM_CLOCK
from strata.common.errors import ErrorCode, KafkaError, OffsetOutOfRangeError
from strata.common.late_bound import LateBound
from strata.common.leadership_lease import ALWAYS_HELD, LeadershipLease
from strata.common.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, TopicPartition
from strata.log.log_manager import LogManager
from strata.log.producer_state import AppendOrigin
from strata.log.unified_log import LATEST_TIMESTAMP, FetchIsolation, UnifiedLog
from strata.replication.partition import (
    AddFetcher, AdvanceHighWatermark, Decision, Leadership, OpenLog, Partition, RemoveFetcher,
    StampEpoch)

log = logging.getLogger(__name__)

ISR_EXPANSION_RETRY_MS = 100  # after the controller refused a follower as INELIGIBLE_REPLICA
APPLY_THREADS = 8         # partitions whose logs are opened and epochs flushed side by side
PARALLEL_APPLY_MIN = 16   # fewer logs to open than this: applied on the caller's thread


class StateChange(NamedTuple):
    """What ``apply_states`` did: partitions this broker started or stopped leading."""

    became_leader: tuple[TopicPartition, ...] = ()
    stopped_leading: tuple[TopicPartition, ...] = ()


class AppendResult(NamedTuple):
    error: ErrorCode
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()   # (index in batch, message)
    last_offset: int = -1


class ReadResult(NamedTuple):
    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    aborted_transactions: list | None = None
    remote: UnifiedLog | None = None   # the offset lives in the remote tier: read it there
    diverging_epoch: tuple[int, int] | None = None   # (epoch, end offset) for a follower, KIP-320
    preferred_read_replica: int = -1                 # KIP-392: read from this replica instead


class OffsetResult(NamedTuple):
    error: ErrorCode
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


def _code(exc: Exception) -> ErrorCode:
    if isinstance(exc, KafkaError):
        return ErrorCode(exc.code)
    log.exception("unexpected error on the data path")
    return ErrorCode.UNKNOWN_SERVER_ERROR


class ReplicaManager:
    def __init__(self, log_manager: LogManager, partitions: Callable[[str], int | None],
                 on_append: Callable[[TopicPartition], None] | None = None, *,
                 broker_id: int = -1, clustered: bool = False,
                 lease: LeadershipLease = ALWAYS_HELD,
                 replica_lag_time_max_ms: int = 30_000,
                 min_insync_replicas: Callable[[str], int] = lambda topic: 1,
                 broker_epoch_of: Callable[[int], int] = lambda broker_id: -1,
                 broker_racks: Callable[[], Mapping[int, str | None]] | None = None,
                 leader_quota=None,
                 call_later: Callable[[float, Callable[[], None]], None] | None = None,
                 remote_log_manager: Any = None, fetchers: Any = None,
                 alter_partition: Any = None):
        self.log_manager = log_manager
        self._partitions = partitions
        self._on_append = on_append or (lambda tp: None)
        # strata.tiered.manager.RemoteLogManager when tiered storage is enabled on this broker;
        # it, the follower fetchers and the AlterPartition sender are made with this replica
        # manager, so a broker gives each as a LateBound it sets once (a test: the part)
        self._remote_log_manager = LateBound.of("remote log manager", remote_log_manager)
        self.broker_id = broker_id
        # Other brokers replicate (a failed log is never made again here)
        self._clustered = clustered
        # each partition hosted here, from the controller's states (``apply_states``)
        self._hosted_partitions: dict[TopicPartition, Partition] = {}
        self._states_lock = threading.Lock()
        # runs fn after a delay (from any thread); a broker sets its event loop's, so that
        # delayed proposals are serialized with the fetches that propose; a timer thread else
        self.call_later: Callable[[float, Callable[[], None]], None] = \
            call_later or self._call_later
        self.clock = SYSTEM_CLOCK
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.min_insync_replicas = min_insync_replicas   # a topic's min.insync.replicas
        # A cluster broker's follower fetchers (add_partitions / remove_partitions) and
        # AlterPartition sender (submit -> Future of PartitionState); None on one broker.
        self._fetchers = LateBound.of("follower fetchers", fetchers)
        self._alter_partition = LateBound.of("AlterPartition sender", alter_partition)
        # KIP-903: a broker's registration epoch as this broker's metadata shows it now (-1:
        # unknown), stamped on each follower fetch; Fetch v12 carries no ReplicaState (v15+)
        self.broker_epoch_of = broker_epoch_of
        # KIP-392 (replica.selector.class RackAwareReplicaSelector): broker id -> rack of the
        # live brokers, or None when consumers read from leaders only
        self.broker_racks = broker_racks
        # leader.replication.throttled.rate (strata.replication.quota.ReplicationQuota)
        self.leader_quota = leader_quota
        self.lease = lease
        lease.add_listener(self._on_lease_changed)
        self.isr_shrinks = 0   # ISR changes the controller accepted (Kafka's IsrShrinksPerSec,
        self.isr_expands = 0   # IsrExpandsPerSec)

    # ---- leadership -------------------------------------------------------------------------

    @property
    def remote_log_manager(self) -> Any:
        return self._remote_log_manager.get()

    @property
    def fetchers(self) -> Any:
        return self._fetchers.get()

    @property
    def alter_partition(self) -> Any:
        return self._alter_partition.get()

    @property
    def clustered(self) -> bool:
        """Whether other brokers replicate this broker's partitions (acks=all waits for them)."""
        return self._clustered

    def partition(self, tp: TopicPartition) -> Partition | None:
        """The partition hosted here, None if not."""
        return self._hosted_partitions.get(tp)

    def state(self, tp: TopicPartition) -> PartitionState | None:
        """The partition's state here, None if not hosted here."""
        found = self._hosted_partitions.get(tp)
        return found.state if found is not None else None

    def hosted_states(self) -> dict[TopicPartition, PartitionState]:
        """The state of every partition hosted here, now (for the metrics endpoint)."""
        with self._states_lock:
            partitions = list(self._hosted_partitions.items())
        return {tp: p.state for tp, p in partitions if p.state is not None}

    def is_leader(self, tp: TopicPartition) -> bool:
        st = self.state(tp)
        return st is not None and st.leader == self.broker_id

    def _leadership(self, tp: TopicPartition) -> Leadership | None:
        found = self._hosted_partitions.get(tp)
        return found.leadership if found is not None else None

    def apply_states(self, states: Mapping[TopicPartition, PartitionState | None]) -> StateChange:
        """Kafka's becomeLeaderOrFollower/stopReplicas for the partitions given (None: this
        broker no longer hosts it): each partition decides (``Partition.decide``, the
        transitions table of strata.replication.partition) and the actions run here. A state
        older than the one held (lower leader epoch, or the same leader epoch at a lower
        partition epoch) is ignored, so no stale controller or late read moves a partition
        back. A new leader stamps its epoch into the leader epoch cache at its log end offset
        (Kafka's makeLeader)."""
        with self._states_lock:
            return self._apply_states(states)

    def _apply_states(self, states: Mapping[TopicPartition, PartitionState | None]) -> StateChange:
        now = self.clock.milliseconds()
        decided: list[tuple[Partition, Decision]] = []
        for tp, st in states.items():
            partition = self._hosted_partitions.get(tp) or Partition(tp, self.broker_id)
            decision = partition.decide(st, now)
            if decision.rule == "ignore":
                if st is not None:
                    held = partition.state
                    log.info("ignoring stale state of %s: epoch %d/%d, holding %d/%d", tp,
                             st.leader_epoch, st.partition_epoch, held.leader_epoch,
                             held.partition_epoch)
                continue
            decided.append((partition, decision))
        actions = [a for _, d in decided for a in d.actions]
        # Kafka's makeLeader order: no fetcher may append to a log once this broker leads
        # it (a batch of the old leader's epoch after the new epoch's start would corrupt
        # the leader epoch cache), so the fetchers let go first
        removed = [a.tp for a in actions if isinstance(a, RemoveFetcher)]
        if removed and self.fetchers is not None:
            self.fetchers.remove_partitions(removed)
        opening = sum(1 for _, d in decided if any(isinstance(a, OpenLog) for a in d.actions))
        if opening >= PARALLEL_APPLY_MIN:
            # each partition's log opened and epoch flushed on its own (the fsyncs overlap);
            # a partition's steps keep their order, and every one is done before the fetchers
            with ThreadPoolExecutor(min(APPLY_THREADS, opening),
                                    thread_name_prefix="apply-states") as pool:
                list(pool.map(lambda pd: self._apply_one(*pd), decided))   # raises as serial
        else:
            for p, d in decided:
                self._apply_one(p, d)
        gained = [p.tp for p, d in decided if d.became_leader]
        lost = [p.tp for p, d in decided if not d.became_leader and d.stopped_leading]
        follow = {a.tp: (a.leader, a.leader_epoch) for a in actions if isinstance(a, AddFetcher)}
        if follow and self.fetchers is not None:
            self.fetchers.add_partitions(follow)
        return StateChange(tuple(gained), tuple(lost))

    def _apply_one(self, partition: Partition, decision: Decision) -> None:
        """One partition's decision: its log opened (made if new), the decision committed,
        then its epoch stamped (serialized with appends) and its high watermark moved."""
        tp = partition.tp
        ulog = None
        log_failed = False
        if any(isinstance(a, OpenLog) for a in decision.actions):
            try:
                ulog = self.get_log(tp, create=True)
            except KafkaError as exc:
                log.error("cannot host %s: %s", tp, exc)
                log_failed = True
        partition.commit(decision)
        partition.log_failed = log_failed
        if decision.state is None:
            self._hosted_partitions.pop(tp, None)
        else:
            self._hosted_partitions[tp] = partition
        for action in decision.actions:
            if isinstance(action, StampEpoch) and ulog is not None:
                with ulog.lock:   # serialized with appends (which check the epoch)
                    ulog.leader_epoch_cache.assign(action.leader_epoch, ulog.log_end_offset)
            elif isinstance(action, AdvanceHighWatermark) and ulog is not None:
                self._maybe_advance_high_watermark(tp, ulog)
        if decision.new_epoch:   # Kafka's state-change log
            st = decision.state
            log.info("%s: %s at leader epoch %d (leader %d, ISR %s)", tp,
                     "leading" if partition.is_leader else "following", st.leader_epoch,
                     st.leader, list(st.isr))

    # ---- leader: followers, ISR, high watermark ---------------------------------------------

    def _maybe_advance_high_watermark(self, tp: TopicPartition, ulog: UnifiedLog,
                                      wake: bool = True) -> bool:
        """HW = the least log end offset over the maximal ISR (the leader's own included);
        it only grows, and not while the ISR is under the effective min.insync.replicas
        (KIP-966: so a replica that left the ISR then, an eligible leader replica, holds all
        below it). Wakes waiters (acks=all produces, fetches) when it moved, with ``wake``."""
        partition = self._hosted_partitions.get(tp)
        if partition is None or not partition.is_leader:
            return False
        st = partition.state
        # min.insync.replicas counts only while the ISR is short of the replicas (it is
        # capped at their number): a full ISR, one broker's always, skips the config lookup
        min_isr = self.min_insync_replicas(tp.topic) if len(st.isr) < len(st.replicas) else 1
        target = partition.high_watermark_target(ulog.log_end_offset, min_isr)
        if target is None or self.lease.in_doubt():
            return False
        with ulog.lock:   # callers run on several threads: never set an older value
            if target <= ulog.high_watermark:
                return False
            ulog.update_high_watermark(target)
        if wake:
            self._on_append(tp)
        return True

    def _on_lease_changed(self) -> None:
        """The lease is held again: what the followers fetched while it was in doubt moves
        the high watermarks, and acks=all waiters already below them are woken."""
        if self.lease.in_doubt():
            return
        for tp in [tp for tp, p in list(self._hosted_partitions.items())
                   if p.leadership is not None]:
            ulog = self.log_manager.get_log(tp)
            if ulog is not None and not self._maybe_advance_high_watermark(tp, ulog):
                self._on_append(tp)

    def follower_fetch(self, tp: TopicPartition, replica_id: int, fetch_offset: int,
                       last_fetched_epoch: int, max_bytes: int, current_leader_epoch: int,
                       *, as_region: bool = False, record: bool = True) -> ReadResult:
        """A follower's Fetch: the diverging epoch if its log went another way (KIP-320), else
        its position recorded (ISR, high watermark) and the records from ``fetch_offset``.

        ``record=False`` reads again for a Fetch that was parked: as Kafka's DelayedFetch, it
        does not record the follower's position again, which would date a fetch that arrived
        up to ``replica.fetch.wait.max.ms`` ago as now (and could take a follower that has
        since gone back into the ISR)."""
        ulog, error, _ = self.leader_log(tp, current_leader_epoch)
        if ulog is None:
            return ReadResult(error)
        st = self.state(tp)
        leadership = self._leadership(tp)
        if st is not None and (leadership is None or replica_id not in leadership.followers):
            return ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, ulog.high_watermark,
                              ulog.last_stable_offset, ulog.log_start_offset)
        if last_fetched_epoch >= 0:
            found = ulog.leader_epoch_cache.end_offset_for(last_fetched_epoch, ulog.log_end_offset)
            if found.leader_epoch == UNDEFINED_EPOCH or found.offset == UNDEFINED_OFFSET:
                # no epoch of ours at or below the follower's: Kafka's answer, which the
                # follower resolves with ListOffsets (truncating to our end or start)
                return ReadResult(ErrorCode.OFFSET_OUT_OF_RANGE, ulog.high_watermark,
                                  ulog.last_stable_offset, ulog.log_start_offset)
            if found.leader_epoch < last_fetched_epoch or found.offset < fetch_offset:
                return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                                  ulog.log_start_offset,
                                  diverging_epoch=(found.leader_epoch, found.offset))
        if leadership is not None and record:
            self._record_follower_fetch(tp, st, ulog, leadership, replica_id, fetch_offset)
        quota = self.leader_quota
        throttled = quota is not None and quota.is_throttled(tp)
        if throttled and replica_id not in st.isr and quota.is_quota_exceeded():
            # Kafka's shouldLeaderThrottle: an out-of-sync follower of a throttled partition
            # gets no records while leader.replication.throttled.rate is exceeded
            return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                              ulog.log_start_offset)
        result = self.read(tp, fetch_offset, max_bytes, FetchIsolation.LOG_END, True,
                           as_region=as_region, current_leader_epoch=current_leader_epoch)
        if throttled and result.records:
            quota.record(len(result.records))
        return result

    def _record_follower_fetch(self, tp: TopicPartition, st: PartitionState, ulog: UnifiedLog,
                               leadership: Leadership, replica_id: int, fetch_offset: int) -> None:
        Partition.record_fetch(leadership.followers[replica_id], fetch_offset,
                               ulog.log_end_offset, self.clock.milliseconds(),
                               self.broker_epoch_of(replica_id))
        if replica_id not in st.isr and leadership.pending_isr is None \
                and Partition.may_join_isr(fetch_offset, ulog.high_watermark,
                                           self._epoch_start(st, ulog)):
            self._propose_isr(tp, st, leadership, tuple(sorted(set(st.isr) | {replica_id})))
        self._maybe_advance_high_watermark(tp, ulog)

    @staticmethod
    def _epoch_start(st: PartitionState, ulog: UnifiedLog) -> int:
        """Where the leader's current epoch starts in its log (0 at leader epoch 0)."""
        return ulog.leader_epoch_cache.end_offset_for(
            st.leader_epoch - 1, ulog.log_end_offset).offset if st.leader_epoch > 0 else 0

    def shrink_isrs(self) -> None:
        """Kafka's isr-expiration task (every replica.lag.time.max.ms / 2): followers that have
        not caught up within replica.lag.time.max.ms leave the ISR."""
        if self.lease.in_doubt():
            return
        now = self.clock.milliseconds()
        for tp, partition in list(self._hosted_partitions.items()):
            leadership = partition.leadership
            if leadership is None or not partition.is_leader or leadership.pending_isr is not None:
                continue
            st = partition.state
            lagging = partition.lagging(now, self.replica_lag_time_max_ms)
            if lagging:
                log.info("%s: shrinking the ISR %s: %s out of sync for more than %d ms", tp,
                         list(st.isr), sorted(lagging), self.replica_lag_time_max_ms)
                self._propose_isr(tp, st, leadership, tuple(r for r in st.isr if r not in lagging))

    def _propose_isr(self, tp: TopicPartition, st: PartitionState, leadership: Leadership,
                     new_isr: tuple[int, ...], retries: int = 0) -> None:
        """Ask the controller for ``new_isr`` in ``leadership`` (at state ``st``); its answer
        is dropped if the partition's leadership has changed by then."""
        sender = self.alter_partition
        partition = self._hosted_partitions.get(tp)
        if sender is None or partition is None or self.lease.in_doubt():
            return   # a follower's next fetch or the next expiration run proposes it again
        epochs = leadership.begin_isr_change(st, new_isr)
        future = sender.submit(tp, st.leader_epoch, st.partition_epoch, new_isr,
                               broker_epochs=epochs)

        def done(f) -> None:
            exc = f.exception()
            with self._states_lock:
                if exc is not None:
                    if not partition.isr_change_answered(leadership, None):
                        return  # leadership changed meanwhile
                    log.info("%s: ISR change to %s not accepted: %s", tp, list(new_isr), exc)
                    if getattr(exc, "code", None) == ErrorCode.INELIGIBLE_REPLICA \
                            and len(new_isr) > len(st.isr):
                        self._retry_expansion_later(partition, leadership, retries)
                    return
                if not partition.isr_change_answered(leadership, f.result()):
                    return
                if len(new_isr) < len(st.isr):
                    self.isr_shrinks += 1
                elif len(new_isr) > len(st.isr):
                    self.isr_expands += 1
            ulog = self.get_log(tp)
            if ulog is not None:
                self._maybe_advance_high_watermark(tp, ulog)
        future.add_done_callback(done)

    def _retry_expansion_later(self, partition: Partition, leadership: Leadership,
                               retries: int) -> None:
        """An expansion the controller refused as INELIGIBLE_REPLICA (the follower had just
        registered, and the controller had not seen it yet): asked again after
        ``ISR_EXPANSION_RETRY_MS``, doubling up to 2 s, instead of at the follower's next
        fetch, which a caught-up follower's long poll can hold for replica.fetch.wait.max.ms."""
        tp = partition.tp

        def retry() -> None:
            with self._states_lock:
                st = partition.state
                if self._hosted_partitions.get(tp) is not partition \
                        or partition.leadership is not leadership \
                        or leadership.pending_isr is not None:
                    return
            ulog = self.get_log(tp)
            if ulog is None:
                return
            with ulog.lock:
                joining = partition.joining(ulog.high_watermark, self._epoch_start(st, ulog))
            if joining:   # outside the lock: a refusal calls back at once
                self._propose_isr(tp, st, leadership, tuple(sorted({*st.isr, *joining})),
                                  retries + 1)
        self.call_later(min(ISR_EXPANSION_RETRY_MS * 2 ** retries, 2000) / 1000, retry)

    @staticmethod
    def _call_later(delay_s: float, fn: Callable[[], None]) -> None:
        timer = threading.Timer(delay_s, fn)
        timer.daemon = True
        timer.start()

    def _preferred_read_replica(self, tp: TopicPartition, ulog: UnifiedLog, client_rack: str,
                                fetch_offset: int) -> int:
        """Kafka's RackAwareReplicaSelector: -1 (the leader) unless the leader is in another
        rack than the consumer and an in-sync follower in its rack holds ``fetch_offset``
        (the one furthest ahead, then the most recently caught up)."""
        racks = self.broker_racks()
        if racks.get(self.broker_id) == client_rack:
            return -1
        st = self.state(tp)
        leadership = self._leadership(tp)
        if st is None or leadership is None:
            return -1
        candidates = [(f.log_end_offset, f.last_caught_up_ms, r)
                      for r, f in leadership.followers.items()
                      if r in st.isr and racks.get(r) == client_rack
                      and f.log_end_offset >= fetch_offset >= ulog.log_start_offset]
        return max(candidates)[2] if candidates else -1

    def enough_replicas_reached(self, tp: TopicPartition, required_offset: int
                                ) -> tuple[bool, ErrorCode]:
        """acks=all: (done, error). Done when the high watermark reached ``required_offset``
        (NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR is then below min.insync.replicas), or
        when this broker no longer leads the partition (NOT_LEADER_OR_FOLLOWER). Not done
        while the leadership lease is in doubt: the request waits, as for replication, and
        answers REQUEST_TIMED_OUT (which producers retry) if the doubt outlasts it."""
        st = self.state(tp)
        ulog = self.log_manager.get_log(tp)
        if st is None or st.leader != self.broker_id or ulog is None:
            return True, ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.lease.in_doubt() or ulog.high_watermark < required_offset:
            return False, ErrorCode.NONE
        if len(st.isr) < self._effective_min_isr(tp):
            return True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return True, ErrorCode.NONE

    def _effective_min_isr(self, tp: TopicPartition) -> int:
        """Kafka's effectiveMinIsr: the topic's min.insync.replicas capped at the replica count
        (so one broker's RF 1 partition takes acks=all at any setting, as a Kafka broker's
        does). A full ISR meets it whatever it is: 1 then, without the config lookup."""
        st = self.state(tp)
        if st is None or len(st.isr) >= len(st.replicas):
            return 1
        return min(self.min_insync_replicas(tp.topic), len(st.replicas))

    def leader_log(self, tp: TopicPartition, current_leader_epoch: int = UNDEFINED_EPOCH,
                   require_leader: bool = True) -> tuple[UnifiedLog | None, ErrorCode, int]:
        """(log, NONE, leader epoch) when this broker may serve ``tp``, else (None, error, -1).

        Kafka's order: an unknown partition is UNKNOWN_TOPIC_OR_PARTITION (NOT_LEADER_OR_FOLLOWER
        when the topic exists but the replica is not here); a client's ``current_leader_epoch``
        below ours is FENCED_LEADER_EPOCH, above it UNKNOWN_LEADER_EPOCH; then a broker that
        does not lead it (with ``require_leader``) is NOT_LEADER_OR_FOLLOWER."""
        st = self.state(tp)
        if st is None:
            count = self._partitions(tp.topic)
            known = count is not None and 0 <= tp.partition < count
            return None, (ErrorCode.NOT_LEADER_OR_FOLLOWER if known
                          else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), -1
        if current_leader_epoch != UNDEFINED_EPOCH and current_leader_epoch != st.leader_epoch:
            return None, (ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < st.leader_epoch
                          else ErrorCode.UNKNOWN_LEADER_EPOCH), -1
        if require_leader and st.leader != self.broker_id:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        ulog, error = self._hosted(tp)
        return ulog, error, st.leader_epoch if ulog is not None else -1

    def get_log(self, tp: TopicPartition, create: bool | None = None) -> UnifiedLog | None:
        """The partition's log; None if the partition does not exist. Only ``apply_states``
        makes one (``create``), for a partition its state makes a replica here."""
        count = self._partitions(tp.topic)
        if count is None or not 0 <= tp.partition < count:
            return None
        found = self.log_manager.get_log(tp)
        if found is not None or not create:
            return found
        return self.log_manager.get_or_create_log(tp)

    def _hosted(self, tp: TopicPartition) -> tuple[UnifiedLog | None, ErrorCode]:
        """The partition's log, or None and why: UNKNOWN_TOPIC_OR_PARTITION, or the
        KAFKA_STORAGE_ERROR of a log that cannot be created on a failing disk. One broker
        makes again here a log that could not be made when granted; a cluster broker never
        does (an empty log in another dir must not lead: the log dir failure handler reports
        the replica offline and follows it afresh once the dir takes writes)."""
        partition = self._hosted_partitions.get(tp)
        retry = not self._clustered and partition is not None and partition.log_failed
        try:
            ulog = self.get_log(tp, create=retry)
        except KafkaError as exc:
            return None, ErrorCode(exc.code)
        if retry and ulog is not None:
            partition.log_failed = False
        return ulog, ErrorCode.NONE if ulog is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # ---- produce ----------------------------------------------------------------------------

    def append(self, tp: TopicPartition, records: bytes | None, *, produce_version: int | None,
               origin: AppendOrigin = AppendOrigin.CLIENT, required_acks: int = 1,
               verification_guard: object | None = None) -> AppendResult:
        """A leader's append; ``last_offset`` of the result is what acks=all waits for."""
        ulog, error, epoch = self.leader_log(tp)
        if ulog is None:
            return AppendResult(error)
        if not records:
            return AppendResult(ErrorCode.INVALID_RECORD, message="no records")
        if required_acks == -1:
            isr = self.state(tp).isr
            min_isr = self._effective_min_isr(tp)
            if len(isr) < min_isr:
                return AppendResult(ErrorCode.NOT_ENOUGH_REPLICAS, log_start_offset=ulog.log_start_offset,
                                    message=f"The size of the current ISR {set(isr)} is insufficient "
                                            f"to satisfy the min.isr requirement of {min_isr} for "
                                            f"partition {tp}")
        try:
            info = ulog.append_as_leader(records, epoch, origin=origin,
                                         produce_version=produce_version,
                                         verification_guard=verification_guard)
            if not info.duplicate:   # waiters are woken below
                self._maybe_advance_high_watermark(tp, ulog, wake=False)
        except Exception as exc:  # noqa: BLE001 - every failure is a Kafka error code for the client
            return AppendResult(_code(exc), log_start_offset=ulog.log_start_offset,
                                message=str(exc),
                                record_errors=tuple(getattr(exc, "record_errors", ())))
        self._on_append(tp)
        return AppendResult(ErrorCode.NONE, info.first_offset, info.log_append_time,
                            info.log_start_offset, last_offset=info.last_offset)

    # ---- fetch ------------------------------------------------------------------------------

    def read(self, tp: TopicPartition, fetch_offset: int, max_bytes: int,
             isolation: FetchIsolation, min_one_message: bool, *,
             as_region: bool = False, current_leader_epoch: int = UNDEFINED_EPOCH,
             client_rack: str | None = None) -> ReadResult:
        """The records at ``fetch_offset``; local ones as a ``FileRegion`` with ``as_region``.

        ``client_rack`` is a consumer's rack (Fetch v11+, which may read from a follower up to
        its high watermark, KIP-392); a leader with a replica selector names the replica in the
        consumer's rack instead of answering records."""
        ulog, error, _ = self.leader_log(tp, current_leader_epoch,
                                         require_leader=client_rack is None)
        if ulog is not None and client_rack and self.broker_racks is not None \
                and self.is_leader(tp):
            preferred = self._preferred_read_replica(tp, ulog, client_rack, fetch_offset)
            if preferred >= 0:
                return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                                  ulog.log_start_offset, preferred_read_replica=preferred)
        if ulog is None:
            return ReadResult(error)
        remote = self._remote_read(ulog, fetch_offset, isolation)
        if remote is not None:
            return remote
        try:
            info = ulog.read(fetch_offset, max_bytes, isolation, min_one_message, as_region)
        except Exception as exc:  # noqa: BLE001
            # Local retention may have deleted the segment since the check above: the offset
            # is then in the remote tier (Kafka's out-of-range handling looks again too).
            remote = self._remote_read(ulog, fetch_offset, isolation) \
                if isinstance(exc, OffsetOutOfRangeError) else None
            return remote or ReadResult(_code(exc), ulog.high_watermark, ulog.last_stable_offset,
                                        ulog.log_start_offset)
        return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                          ulog.log_start_offset, info.records, info.aborted_transactions)

    def _remote_read(self, ulog: UnifiedLog, fetch_offset: int,
                     isolation: FetchIsolation) -> ReadResult | None:
        """The answer when ``fetch_offset`` lies in the remote tier only, else None."""
        if not (ulog.log_start_offset <= fetch_offset < ulog.local_log_start_offset) \
                or self.remote_log_manager is None:
            return None
        if isolation is FetchIsolation.LOG_END:  # a follower rebuilds from remote storage
            return ReadResult(ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, ulog.high_watermark,
                              ulog.last_stable_offset, ulog.log_start_offset)
        return ReadResult(ErrorCode.NONE, ulog.high_watermark, ulog.last_stable_offset,
                          ulog.log_start_offset, remote=ulog)

    # ---- list offsets -----------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int, isolation: FetchIsolation,
                    from_consumer: bool = True,
                    current_leader_epoch: int = UNDEFINED_EPOCH,
                    leader_only: bool = True) -> OffsetResult:
        ulog, error, _ = self.leader_log(tp, current_leader_epoch, require_leader=leader_only)
        if ulog is None:
            return OffsetResult(error)
        try:
            if from_consumer:
                last_fetchable = ulog.last_stable_offset if isolation is FetchIsolation.TXN_COMMITTED \
                    else ulog.high_watermark
            else:
                last_fetchable = ulog.log_end_offset
            if timestamp == LATEST_TIMESTAMP:
                epoch = ulog.leader_epoch_cache.latest_epoch()
                return OffsetResult(ErrorCode.NONE, -1, last_fetchable, epoch if epoch is not None else -1)
            found = None
            rlm = self.remote_log_manager
            if timestamp >= 0 and rlm is not None and ulog.log_start_offset < ulog.local_log_start_offset:
                found = rlm.find_offset_by_timestamp(ulog, timestamp)
            if found is None:
                found = ulog.fetch_offset_by_timestamp(timestamp)
        except Exception as exc:  # noqa: BLE001
            return OffsetResult(_code(exc))
        if found is None or (timestamp >= 0 and found.offset >= last_fetchable):
            return OffsetResult(ErrorCode.NONE, -1, -1, -1)
        epoch = found.leader_epoch if found.leader_epoch is not None else -1
        return OffsetResult(ErrorCode.NONE, found.timestamp, found.offset, epoch)

    # ---- delete records ---------------------------------------------------------------------

    def delete_records(self, tp: TopicPartition, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords: move the log start offset (-1 means the high watermark); the low
        watermark is the log start offset this leaves, as in Kafka. The segments below it go
        in the retention task (``log.retention.check.interval.ms``), never in the request,
        so time or size retention cannot move the answer past the requested offset."""
        ulog, error, _ = self.leader_log(tp)
        if ulog is None:
            return error, -1
        try:
            if "delete" not in ulog.config.get("cleanup.policy"):
                return ErrorCode.POLICY_VIOLATION, -1  # Kafka: only with cleanup.policy delete
            target = ulog.high_watermark if offset == -1 else offset
            if target < 0:
                return ErrorCode.OFFSET_OUT_OF_RANGE, -1
            ulog.maybe_increment_log_start_offset(target, "DeleteRecords")
        except Exception as exc:  # noqa: BLE001
            return _code(exc), -1
        return ErrorCode.NONE, ulog.log_start_offset

    # ---- offset for leader epoch ------------------------------------------------------------

    def end_offset_for_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                             epoch: int) -> tuple[ErrorCode, int, int]:
        """OffsetForLeaderEpoch: (error, the largest epoch <= ``epoch``, its end offset)."""
        ulog, error, _ = self.leader_log(tp, current_leader_epoch)
        if ulog is None:
            return error, UNDEFINED_EPOCH, UNDEFINED_OFFSET
        found = ulog.leader_epoch_cache.end_offset_for(epoch, ulog.log_end_offset)
        return ErrorCode.NONE, found.leader_epoch, found.offset
