"""``AlterPartitionManager``: a partition leader's ISR changes sent to the controller (Kafka's
``DefaultAlterPartitionManager``).

- ``submit`` queues one change per partition; a second change for a partition whose first is
  still pending (queued or in flight) is refused at once with OPERATION_NOT_ATTEMPTED;
- one background thread sends everything queued as one AlterPartition request, one request in
  flight at a time, to the controller ``controller()`` names at that moment, stamped with
  ``broker_epoch()`` at that moment;
- a partition answered in the response leaves the queue and its future completes: the
  partition's new ``PartitionState`` (``replicas`` empty: AlterPartition does not carry them)
  or a ``KafkaError`` with the partition's error code;
- no controller known, a connection failure or a top-level error (NOT_CONTROLLER,
  STALE_BROKER_EPOCH, REQUEST_TIMED_OUT, ...) leave the whole batch queued: it is sent again,
  to the controller then named, with whatever was queued meanwhile, after a backoff that
  doubles with each consecutive failed round from retry.backoff.ms (100 ms) up to
  retry.backoff.max.ms (1 s), ±20 % jitter; a round answered in full resets it. A partition
  the response left out is sent again too. There is no overall timeout (as Kafka's);
- nothing is sent while the broker's leadership lease is in doubt (its ZooKeeper session may
  have expired): what is queued waits, and goes once the lease is held again.

Requests are v3 (``new_isr_with_epochs``, KIP-903): each member's broker epoch as the caller
saw it fetch (``submit``'s ``broker_epochs``), -1 where none is given (not checked); the
controller refuses a member at another epoch than its registration's (INELIGIBLE_REPLICA), so a
fetch state of a broker's earlier incarnation never admits the new one. ``version=2`` sends
``new_isr`` alone.

Threads: ``submit`` and ``shutdown`` from any thread; ``start`` runs the rounds on the manager's
thread, where futures complete (a callback may submit again for the same partition). A test
may instead call ``poll`` itself, on one thread, without ``start``.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from strata.common.backoff import ExponentialBackoff
from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import ErrorCode, KafkaError, error_code_of
from strata.common.leadership_lease import ALWAYS_HELD, LeadershipLease
from strata.common.types import TopicPartition
from strata.net.connection import Connection
from strata.protocol.codec import ApiKey, make, request_class, response_class
from strata.cluster.image import PartitionState

log = logging.getLogger(__name__)

RETRY_BACKOFF_MS = 100          # retry.backoff.ms
RETRY_BACKOFF_MAX_MS = 1000     # retry.backoff.max.ms
REQUEST_TIMEOUT_S = 30.0        # controller.socket.timeout.ms
LEADER_RECOVERY_STATES = (0, 1)  # RECOVERED, RECOVERING


@dataclass(frozen=True)
class _Item:
    tp: TopicPartition
    topic_id: uuid.UUID
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    leader_recovery_state: int
    future: Future
    broker_epochs: tuple[int, ...] = ()   # per new ISR member, -1: not checked


def _error(code: int, what: str) -> KafkaError:
    error = error_code_of(code)
    return KafkaError(f"{what}: {error.name}", error)


class AlterPartitionManager:
    """Sends this broker's ISR changes to the controller; see the module docstring.

    ``controller()`` gives (controller id, host, port) or None when none is known;
    ``topic_id(topic)`` the topic's id or None (the change then fails with UNKNOWN_TOPIC_ID);
    ``connect(host, port)`` opens a blocking connection with ``request(body, response_cls)`` and
    ``close()`` (default: ``strata.net.connection.Connection``); ``lease`` holds sends while in
    doubt; ``backoff`` spaces failed rounds, timed by ``clock``.
    """

    def __init__(self, broker_id: int, broker_epoch: Callable[[], int],
                 controller: Callable[[], tuple[int, str, int] | None],
                 topic_id: Callable[[str], uuid.UUID | None],
                 connect: Callable[[str, int], Any] | None = None, *,
                 version: int = 3, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 lease: LeadershipLease = ALWAYS_HELD,
                 backoff: ExponentialBackoff | None = None, clock: Clock = SYSTEM_CLOCK,
                 security=None):
        if version not in (2, 3):
            raise ValueError(f"AlterPartition v{version}: only v2 and v3 are spoken")
        self.broker_id = broker_id
        self._broker_epoch = broker_epoch
        self._controller = controller
        self._topic_id = topic_id
        self._connect = connect or (lambda host, port: Connection(
            f"{host}:{port}", timeout=request_timeout_s,
            client_id=f"broker-{broker_id}-alter-partition", security=security))
        self.version = version
        self._request_cls = request_class(ApiKey.ALTER_PARTITION, version)
        self._response_cls = response_class(ApiKey.ALTER_PARTITION, version)
        self._lease = lease
        self._backoff = backoff or ExponentialBackoff(RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS)
        self._clock = clock
        self._failures = 0           # consecutive failed rounds
        self._next_round_ns = 0      # no round before this (clock nanoseconds)
        self._holding = False        # the lease is in doubt and something waits
        self._cond = threading.Condition()
        self._pending: dict[TopicPartition, _Item] = {}  # queued or in flight, one per partition
        self._stopped = False
        self._woken = False          # something to look at: a submit, the lease, a shutdown
        self._conn: Any = None
        self._conn_target: tuple[int, str, int] | None = None
        self._thread = threading.Thread(target=self._run, name=f"alter-partition-{broker_id}",
                                        daemon=True)
        lease.add_listener(self._wake)

    def start(self) -> "AlterPartitionManager":
        self._thread.start()
        return self

    # ---- any thread ----------------------------------------------------------------------

    def submit(self, tp: TopicPartition, leader_epoch: int, partition_epoch: int,
               new_isr: tuple[int, ...], leader_recovery_state: int = 0,
               broker_epochs: Mapping[int, int] | None = None) -> Future:
        """Queues the change; a Future of the partition's new ``PartitionState``, or of the
        ``KafkaError`` refusing it (OPERATION_NOT_ATTEMPTED: a change for ``tp`` is pending,
        or the manager is shut down). ``broker_epochs``: member -> broker epoch (v3)."""
        future: Future = Future()
        topic_id = self._topic_id(tp.topic)
        if topic_id is None:
            future.set_exception(KafkaError(f"No topic id known for {tp}", ErrorCode.UNKNOWN_TOPIC_ID))
            return future
        epochs = broker_epochs or {}
        item = _Item(tp, topic_id, leader_epoch, partition_epoch, tuple(new_isr),
                     leader_recovery_state, future, tuple(epochs.get(b, -1) for b in new_isr))
        with self._cond:
            if self._stopped:
                refused = "the AlterPartition manager is shut down"
            elif tp in self._pending:
                refused = f"an ISR change of {tp} is already pending"
            else:
                refused = None
                self._pending[tp] = item
                self._woken = True
                self._cond.notify_all()
        if refused is not None:
            future.set_exception(KafkaError(f"Not sending the ISR change {tuple(new_isr)} of {tp}: "
                                            f"{refused}", ErrorCode.OPERATION_NOT_ATTEMPTED))
        return future

    def pending(self) -> set[TopicPartition]:
        """Partitions with a change queued or in flight."""
        with self._cond:
            return set(self._pending)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stops the thread (interrupting a request in flight) and fails every pending change
        with OPERATION_NOT_ATTEMPTED (it may or may not have been applied)."""
        with self._cond:
            self._stopped = True
            conn = self._conn
            self._cond.notify_all()
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv
            except OSError:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        else:
            self._disconnect()
        with self._cond:
            left = list(self._pending.values())
            self._pending.clear()
        for item in left:
            item.future.set_exception(KafkaError(
                f"The AlterPartition manager shut down before {item.tp} was answered",
                ErrorCode.OPERATION_NOT_ATTEMPTED))

    # ---- the manager's thread -------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            delay_s: float | None = None
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped or self._woken, delay_s)
                    if self._stopped:
                        return
                    self._woken = False
                delay_s = self.poll()
        finally:
            self._disconnect()

    def poll(self) -> float | None:
        """One round if one is due: everything queued, in one request. The seconds until the
        next round is due (0: at once), or None when nothing is due until a submit or a
        change of the lease (nothing queued, or the lease in doubt)."""
        with self._cond:
            if self._stopped or not self._pending:
                return None
            if self._lease.in_doubt():
                if not self._holding:
                    log.info("AlterPartition: holding the ISR changes of %s while the "
                             "leadership lease is in doubt", sorted(self._pending))
                self._holding = True
                return None
            self._holding = False
            wait_ns = self._next_round_ns - self._clock.nanoseconds()
            if wait_ns > 0:
                return wait_ns / 1e9
            batch = list(self._pending.values())
        try:
            done = self._send(batch)
        except Exception:  # noqa: BLE001 - a bug here must not end the thread
            log.exception("AlterPartition of %s failed", [i.tp for i in batch])
            self._disconnect()  # the connection may be mid-response
            done = False
        if done:
            self._failures = 0
            self._next_round_ns = 0
            with self._cond:
                return 0.0 if self._pending else None
        delay_ms = self._backoff.backoff_ms(self._failures)
        self._failures += 1
        self._next_round_ns = self._clock.nanoseconds() + delay_ms * 1_000_000
        return delay_ms / 1000

    def _send(self, batch: list[_Item]) -> bool:
        """One request for ``batch``; False when all or part of it is to be sent again."""
        target = self._controller()
        if target is None:
            log.debug("AlterPartition: no controller known; retrying after a backoff")
            return False
        try:
            conn = self._connection(target)
            response = conn.request(self._request(batch), self._response_cls)
        except (OSError, ConnectionError, ValueError) as e:  # ValueError: an undecodable answer
            log.info("AlterPartition to controller %d failed (%s); retrying after a backoff",
                     target[0], e)
            self._disconnect()
            return False
        top = int(response.error_code)
        if top != ErrorCode.NONE:
            log.info("AlterPartition: controller %d answered %s; retrying after a backoff",
                     target[0], _error(top, "top-level").code.name)
            if top == ErrorCode.NOT_CONTROLLER:
                self._disconnect()
            return False
        answers: dict[tuple[uuid.UUID, int], Any] = {
            (t.topic_id, int(p.partition_index)): p for t in response.topics for p in t.partitions}
        finished: list[tuple[_Item, Any]] = []
        with self._cond:
            for item in batch:
                answer = answers.get((item.topic_id, item.tp.partition))
                if answer is not None and self._pending.get(item.tp) is item:
                    del self._pending[item.tp]  # before the callback, which may submit again
                    finished.append((item, answer))
        for item, answer in finished:
            self._complete(item, answer)
        missing = len(batch) - len(finished)
        if missing:
            log.warning("AlterPartition: controller %d left %d partitions unanswered; resending",
                        target[0], missing)
        return not missing

    def _complete(self, item: _Item, answer: Any) -> None:
        code = int(answer.error_code)
        if code != ErrorCode.NONE:
            item.future.set_exception(_error(code, f"AlterPartition of {item.tp} refused"))
        elif int(answer.leader_recovery_state) not in LEADER_RECOVERY_STATES:
            item.future.set_exception(KafkaError(
                f"AlterPartition of {item.tp}: invalid leader recovery state "
                f"{int(answer.leader_recovery_state)}", ErrorCode.UNKNOWN_SERVER_ERROR))
        else:
            item.future.set_result(PartitionState(
                int(answer.leader_id), int(answer.leader_epoch), tuple(int(b) for b in answer.isr),
                (), int(answer.partition_epoch)))

    def _request(self, batch: list[_Item]):
        cls = self._request_cls
        by_topic: dict[uuid.UUID, list] = {}
        for item in batch:
            if self.version >= 3:
                isr = {"new_isr_with_epochs": tuple(
                    make(cls, "topics.partitions.new_isr_with_epochs", broker_id=b, broker_epoch=e)
                    for b, e in zip(item.new_isr, item.broker_epochs))}
            else:
                isr = {"new_isr": item.new_isr}
            by_topic.setdefault(item.topic_id, []).append(make(
                cls, "topics.partitions", partition_index=item.tp.partition,
                leader_epoch=item.leader_epoch, partition_epoch=item.partition_epoch,
                leader_recovery_state=item.leader_recovery_state, **isr))
        return make(cls, broker_id=self.broker_id, broker_epoch=self._broker_epoch(),
                    topics=tuple(make(cls, "topics", topic_id=tid, partitions=tuple(parts))
                                 for tid, parts in by_topic.items()))

    def _connection(self, target: tuple[int, str, int]):
        with self._cond:
            if self._conn is not None and self._conn_target == target:
                return self._conn
        self._disconnect()
        conn = self._connect(target[1], target[2])
        with self._cond:
            self._conn, self._conn_target = conn, target
        return conn

    def _disconnect(self) -> None:
        with self._cond:
            conn, self._conn, self._conn_target = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass
