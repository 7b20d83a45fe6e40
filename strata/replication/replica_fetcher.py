"""The follower side of replication: Kafka's ReplicaFetcherManager and ReplicaFetcherThread.

A follower copies its partitions from their leaders with Fetch v12 requests (``replica_id`` =
this broker). Partitions are spread over fetchers keyed by (leader id, fetcher id), the
fetcher id being a stable hash of the partition modulo ``num.replica.fetchers``, as in Kafka.
Each fetcher sends one Fetch for all its ready partitions, in a fetch session (KIP-227) with its
leader as Kafka's ReplicaFetcherThread keeps one (``FetchSessionHandler``): a full fetch opens
it, then each incremental fetch names only the partitions whose fetch state changed and
forgets those no longer fetched, and the leader answers only partitions with something new.
Per partition answered:

- records: appended with ``append_as_follower`` (whole batches; a trailing partial batch is
  left for the next fetch), then the high watermark follows the leader's (never above our log
  end) and the log start offset follows the leader's when it is higher;
- a diverging epoch (KIP-320): the log is truncated to where it agrees with the leader, as
  Kafka's ``getOffsetTruncationState`` decides, and fetching goes on from there;
- OFFSET_OUT_OF_RANGE: truncated to the leader's end (ListOffsets latest) when ours is past it,
  else restarted at the leader's log start offset when ours is below it (Kafka's
  ``fetchOffsetAndTruncate``);
- OFFSET_MOVED_TO_TIERED_STORAGE (KIP-405): the leader's local log starts above our log end
  and what lies below it is in the remote tier. As Kafka's TierStateMachine: the leader's
  earliest local offset and its epoch (ListOffsets -4), its log start offset (-2), the epoch
  of the offset just below (OffsetForLeaderEpoch), then ``remote_aux_state`` rebuilds the log
  from the remote segment ending there (leader epochs, producer state) and fetching resumes
  after it; any failure backs off and retries, the log untouched;
- an append the log dir refuses (KAFKA_STORAGE_ERROR: disk full or failing): the partition
  stops (one warning); the broker takes the dir's replicas offline and, once the dir takes
  writes again, removes and re-adds them here (``log_dir_failure_handler``);
- other errors (NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
  ...): that partition backs off ``replica.fetch.backoff.ms``; new metadata brings the leader.

A failed request (connection refused or dropped, timeout, undecodable answer) closes the
connection and backs off every partition of the request; the fetcher reconnects afterwards, and
its next fetch is a full one opening a new session (as after any closed connection). A session
the leader no longer knows (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH: evicted,
the leader restarted, a lost answer) is replaced by a new full fetch at once, without back-off.
Records move as bytes: only batch headers are read.

Where fetchers run: each is a task on the broker's event loop (the manager's ``loop``; without
one, as in unit tests, the manager runs a loop of its own in a thread), so that a follower's
appends and Fetches do not take turns with the loop's thread for the GIL: each hop of an
acks=all record used to cross threads. The Fetch goes out on an ``AsyncConnection`` and its
answer is handled on the loop; what may wait on the leader or the remote tier (an
OFFSET_OUT_OF_RANGE's or an OFFSET_MOVED_TO_TIERED_STORAGE's ListOffsets, OffsetForLeaderEpoch
and rebuild, KIP-1023's first start) runs in a worker thread on a blocking connection of its
own while the fetcher waits for it, as Kafka's fetcher thread waits for its TierStateMachine.

Locks: the manager's lock is taken before a fetcher's, never the other way round. A fetcher
holds its lock while it handles an answer, so a partition removed or moved is never written by
its old fetcher afterwards.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from strata.common.errors import (
    CorruptRecordError, ErrorCode, InvalidRecordError, KafkaStorageError, code_of, error_name)
from strata.common.types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, TopicPartition
from strata.log.unified_log import (
    EARLIEST_LOCAL_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP, EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP, UnifiedLog)
from strata.protocol.fetch_wire import PartitionFetch, ReplicaFetch

__all__ = ["ReplicaFetcher", "ReplicaFetcherManager", "fetcher_id"]

log = logging.getLogger(__name__)

DEFAULT_NUM_FETCHERS = 1
DEFAULT_MAX_WAIT_MS = 500
DEFAULT_MIN_BYTES = 1
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
DEFAULT_BACKOFF_MS = 1000
DEFAULT_SOCKET_TIMEOUT_MS = 30_000

_BACK_OFF = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
})


def _java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as an unsigned 32-bit value."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h


def fetcher_id(tp: TopicPartition, num_fetchers: int) -> int:
    """Kafka's ``getFetcherId``: ``abs(31 * topic.hashCode + partition) % num_fetchers``
    (stable across processes, unlike Python's ``hash``)."""
    h = (31 * _java_string_hash(tp.topic) + tp.partition) & 0x7FFFFFFF
    return h % max(1, num_fetchers)



class FetchData(NamedTuple):
    """What one fetch asks of a partition; a change of any field sends it again in the session."""

    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int


class FetchSessionHandler:
    """Kafka's ``FetchSessionHandler`` (client side of KIP-227) for one leader.

    ``build(next)`` takes every partition to fetch this round, in order, and returns what the
    request carries: (partitions to send, partitions to forget, session id, session epoch).
    A full fetch (no session yet, or one being replaced) sends them all and opens a session;
    an incremental one sends the partitions added or whose ``FetchData`` changed, and forgets
    the session's partitions missing from ``next``. ``handle_response`` reads the answer's
    session fields (True when its partitions may be processed); ``handle_error`` follows a
    failed request: the next fetch is a full one replacing the session."""

    def __init__(self) -> None:
        self.session_id = 0          # INVALID_SESSION_ID: none
        self.epoch = 0               # INITIAL_EPOCH: the next fetch is a full one
        self.session_partitions: dict[TopicPartition, FetchData] = {}

    @property
    def is_full(self) -> bool:
        return self.epoch in (0, -1)

    def build(self, next_partitions: dict[TopicPartition, FetchData]):
        if self.is_full:
            self.session_partitions = dict(next_partitions)
            return dict(next_partitions), [], self.session_id, self.epoch
        session = self.session_partitions
        added, altered, removed = {}, {}, []
        for tp in list(session):
            data = next_partitions.get(tp)
            if data is None:
                del session[tp]
                removed.append(tp)
            elif data != session[tp]:
                session[tp] = data
                altered[tp] = data
        for tp, data in next_partitions.items():
            if tp not in session:
                session[tp] = data
                added[tp] = data
        return {**added, **altered}, removed, self.session_id, self.epoch

    def handle_response(self, response) -> bool:
        """Kafka's ``handleResponse``: the session's next state from the answer; False when
        its partitions must not be processed (an error, or an answer that does not fit)."""
        if code_of(response.error_code) != ErrorCode.NONE:
            if code_of(response.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self.session_id, self.epoch = 0, 0
            else:
                self.epoch = 0              # close the session and open a new one
            return False
        answered = {TopicPartition(t.topic, p.partition_index)
                    for t in response.responses for p in t.partitions}
        session_id = int(response.session_id)
        if self.is_full:
            if answered != set(self.session_partitions):
                # a full answer names every partition asked (an empty one: a quota throttle)
                self.session_id, self.epoch = 0, 0
                return False
            if session_id == 0:
                self.session_id, self.epoch = 0, 0          # sessionless: full fetches again
            else:
                self.session_id, self.epoch = session_id, 1  # the new session's first epoch
            return True
        if not answered <= set(self.session_partitions):
            log.info("incremental fetch answer of session %d names partitions outside it: %s",
                     self.session_id, sorted(answered - set(self.session_partitions)))
            self.epoch = 0
            return False
        if session_id == 0:
            self.session_id, self.epoch = 0, 0    # the leader closed the session
        else:
            self.epoch = 1 if self.epoch == 2**31 - 1 else self.epoch + 1
        return True

    def handle_error(self) -> None:
        """After a failed request: the next fetch is a full one that replaces the session."""
        self.epoch = 0


@dataclass
class _PartitionState:
    epoch: int                  # the leader epoch we fetch at
    delay_until: float = 0.0    # time.monotonic() before which it is not fetched
    lag: int | None = None      # leader's high watermark - our log end, from the last answer
    failed: bool = False        # stopped until its next leader or epoch, or re-added
    new: bool = True            # not fetched yet (KIP-1023 may start it at the tiered offset)


class ReplicaFetcher:
    """Fetches the partitions one leader leads for this broker (one of ``num_fetchers``): a
    task on the manager's event loop (``start`` schedules it, ``join`` waits for its end)."""

    def __init__(self, manager: "ReplicaFetcherManager", leader_id: int, fetcher_index: int):
        self.name = f"ReplicaFetcherThread-{fetcher_index}-{leader_id}"   # Kafka's name
        self.manager = manager
        self.leader_id = leader_id
        self.fetcher_index = fetcher_index
        self._lock = threading.RLock()
        self._states: dict[TopicPartition, _PartitionState] = {}   # insertion order = fetch order
        self._stopping = threading.Event()
        self._conn: Any = None          # blocking: the worker steps' (and fakes' Fetches)
        self._session = FetchSessionHandler()
        self._loop: asyncio.AbstractEventLoop | None = None   # the manager's, once started
        self._aconn: Any = None         # the Fetch connection on the loop
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._scheduled = False
        self._done = threading.Event()

    # ---- membership (called by the manager) -------------------------------------------------

    def add(self, tp: TopicPartition, epoch: int) -> None:
        """Fetch ``tp`` at ``epoch``. The same epoch again changes nothing; another epoch
        updates it (clearing a failure and a back-off). Progress lives in the log itself."""
        with self._lock:
            st = self._states.get(tp)
            if st is not None and st.epoch == epoch:
                return
            if st is None:
                self._states[tp] = _PartitionState(epoch)
            else:
                st.epoch, st.delay_until, st.failed = epoch, 0.0, False
            self._kick()

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                self._states.pop(tp, None)

    def retry_now(self, tp: TopicPartition) -> None:
        """End ``tp``'s back-off: what it waited for (its remote log metadata) is there."""
        with self._lock:
            st = self._states.get(tp)
            if st is not None and not st.failed and st.delay_until > time.monotonic():
                st.delay_until = 0.0
                self._kick()

    def is_idle(self) -> bool:
        with self._lock:
            return not self._states

    def states(self) -> dict[TopicPartition, tuple[int, bool, int | None]]:
        """tp -> (epoch, failed, lag)."""
        with self._lock:
            return {tp: (st.epoch, st.failed, st.lag) for tp, st in self._states.items()}

    def _kick(self) -> None:
        """Wake the fetcher from its wait for a ready partition."""
        if self._wake is not None:
            self._on_loop(self._wake.set)

    def _on_loop(self, fn: Callable[[], Any]) -> None:
        """``fn`` on the fetcher's loop: now from its thread, else soon (not once it closed)."""
        if self._loop is None:   # not started
            return
        if self._in_loop_thread():
            fn()
            return
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:   # the loop is closed: nothing runs on it any more
            pass

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def start(self) -> None:
        self._loop = self.manager.event_loop()
        self._scheduled = True

        def create() -> None:
            self._wake = asyncio.Event()
            self._task = self._loop.create_task(self._arun(), name=self.name)
            # also when cancelled before it ran (its body, and finally, never entered)
            self._task.add_done_callback(lambda _: self._done.set())
        self._on_loop(create)

    def is_alive(self) -> bool:
        """Started and not told to stop: it may still write its partitions' logs."""
        return self._scheduled and not self._stopping.is_set() and not self._done.is_set()

    def join(self) -> None:
        """After ``initiate_shutdown``: returns once the fetcher writes no log any more.
        Answers and worker steps are handled under the lock and check the stop under it, so
        taking the lock once is enough; this never waits for the loop, which may be waiting
        for a lock that the caller holds (ReplicaManager.apply_states calls this under its
        states lock, and the loop's AlterPartition callbacks take that lock)."""
        with self._lock:
            self._close_connection()   # the worker steps' (none runs any more)

    def wait_ended(self, timeout: float) -> None:
        """Until the task itself ended (its connection closed); not from the loop's thread."""
        if self._scheduled and not self._in_loop_thread():
            self._done.wait(timeout)

    def initiate_shutdown(self) -> None:
        self._stopping.set()
        self._on_loop(lambda: self._task is not None and self._task.cancel())
        sock = getattr(self._conn, "sock", None)
        if sock is not None:   # wakes a recv blocked in the leader's long poll or a worker step
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- the task -----------------------------------------------------------------------------

    def _ready(self) -> tuple[list[TopicPartition], float | None]:
        """(the partitions to fetch now, seconds until the next back-off ends, None: none)."""
        now = time.monotonic()
        ready, wake = [], None
        for tp, st in self._states.items():
            if st.failed:
                continue
            if st.delay_until <= now:
                ready.append(tp)
            elif wake is None or st.delay_until < wake:
                wake = st.delay_until
        return ready, None if wake is None else max(0.0, wake - now)

    async def _arun(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    await self._round()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the fetcher must survive anything
                    if self._stopping.is_set():
                        break
                    log.exception("%s: unexpected error; backing off all partitions", self.name)
                    self._close_fetch_connection()
                    with self._lock:
                        self._delay(list(self._states), self.manager.backoff_ms)
        except asyncio.CancelledError:
            pass
        finally:
            self._close_fetch_connection()

    async def _round(self) -> None:
        """One Fetch and its answer (or a wait until a partition is ready); the steps that may
        wait on the leader or the remote tier go to a worker thread."""
        self._wake.clear()   # before the check: a kick after it ends the wait below
        worker: list = []
        with self._lock:
            ready, wait_s = self._ready()
            request, sent = self._build_request(ready, worker) if ready else (None, {})
        if worker:
            await self._in_worker(worker)
            return
        if request is None:
            if ready:   # what was ready is backed off now: let the loop run, then look again
                await asyncio.sleep(0)
                return
            try:
                await asyncio.wait_for(self._wake.wait(), wait_s)
            except TimeoutError:
                pass
            return
        try:
            response = await self._send_fetch(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the request
            if self._stopping.is_set():
                return
            log.warning("%s: fetch from broker %d failed (%s: %s); backing off %d ms",
                        self.name, self.leader_id, type(exc).__name__, exc,
                        self.manager.backoff_ms)
            self._close_fetch_connection()
            with self._lock:
                self._delay(sent, self.manager.backoff_ms)
            return
        notify: list[TopicPartition] = []
        with self._lock:
            if self._stopping.is_set():   # join() returned: no write any more
                return
            self._process_response(response, sent, notify, worker)
        self._notify(notify)
        if worker:
            await self._in_worker(worker)

    async def _in_worker(self, steps: list) -> None:
        """Run ``steps`` (tp, handler, what was asked) in a worker thread and wait."""
        await asyncio.get_running_loop().run_in_executor(None, self._run_steps, steps)

    def _run_steps(self, steps: list) -> None:
        """Each step's handler, under the lock, unless its partition changed meanwhile (moved,
        another epoch, failed, or its log end moved from what was asked); a False answer
        backs the partition off."""
        with self._lock:
            errors = []
            for tp, handler, asked in steps:
                if self._stopping.is_set():
                    return
                st = self._states.get(tp)
                ulog = self.manager.get_log(tp)
                if st is None or st.failed or ulog is None or (asked is not None and (
                        st.epoch != asked[1] or ulog.log_end_offset != asked[0])):
                    continue
                if not handler(tp, st, ulog):
                    errors.append(tp)
            self._delay(errors, self.manager.backoff_ms)

    async def _send_fetch(self, request):
        """The Fetch's answer, on the fetch connection (opened if needed); with only a
        blocking ``connect`` (unit tests' fakes), on the blocking one."""
        from kio.schema.fetch.v12.response import FetchResponse
        if self.manager.async_connect is None:
            response = self._connection().request(request.to_kio(), FetchResponse)
            await asyncio.sleep(0)   # the other fetchers' turn: this never waited on the loop
            return response
        if self._aconn is None:
            address = self._address()
            self._aconn = await self.manager.async_connect(address)
        return await self._aconn.request_frame(request.frame, FetchResponse)

    def _address(self) -> str:
        endpoint = self.manager.endpoint_of(self.leader_id)
        if endpoint is None:
            raise ConnectionError(f"no endpoint known for broker {self.leader_id}")
        host, port = endpoint
        return f"{host}:{port}"

    def _close_fetch_connection(self) -> None:
        self._session.handle_error()   # the next fetch opens a new session
        conn, self._aconn = self._aconn, None
        if conn is not None:
            conn.close()
        if self.manager.async_connect is None:
            self._close_connection()

    def _notify(self, notify: list[TopicPartition]) -> None:
        on_append = self.manager.on_append
        if on_append is not None:
            for tp in notify:
                try:
                    on_append(tp)
                except Exception:  # noqa: BLE001
                    log.exception("%s: on_append(%s) failed", self.name, tp)

    def _throttled_now(self, tp: TopicPartition) -> bool:
        """Kafka's shouldFollowerThrottle: a replica that is not caught up, of a throttled
        partition, while the follower quota is exceeded."""
        quota = self.manager.quota
        return (quota is not None and self._states[tp].lag != 0 and quota.is_throttled(tp)
                and quota.is_quota_exceeded())

    def _delay(self, tps: Iterable[TopicPartition], ms: int) -> None:
        until = time.monotonic() + ms / 1000
        for tp in tps:
            st = self._states.get(tp)
            if st is not None and st.delay_until < until:
                st.delay_until = until

    def _build_request(self, ready: list[TopicPartition], worker: list):
        """The Fetch for ``ready`` and what was asked per partition: tp -> (offset, epoch);
        None for the Fetch when there is nothing to fetch and nothing to forget.

        As Kafka's ReplicaFetcherThread.buildFetch with its FetchSessionHandler.Builder: the
        partitions not added this round (backed off, throttled, failed, without a local log)
        are not in the builder's next set, so an incremental fetch forgets them
        (forgotten_topics_data) and adds them again once they are ready. The session therefore
        holds exactly the partitions of ``sent``: the leader reads those and no others, and
        a partition left out is not read (nor counted as fetching) while it waits.

        A new partition's KIP-1023 start is added to ``worker`` (steps for a worker thread),
        and the partition is fetched once it is done; a round with worker steps runs them
        instead of a Fetch (None), leaving the session as it was."""
        m = self.manager
        fetch: dict[TopicPartition, FetchData] = {}
        sent: dict[TopicPartition, tuple[int, int]] = {}
        missing, throttled = [], []
        for tp in ready:
            if self._throttled_now(tp):
                throttled.append(tp)
                continue
            ulog = m.get_log(tp)
            if ulog is None:
                missing.append(tp)
                continue
            st = self._states[tp]
            if st.new and m.fetch_last_tiered_offset and m.remote_aux_state is not None:
                worker.append((tp, self._start_at_tiered_offset, None))
                continue
            st.new = False
            epoch = st.epoch
            with ulog.lock:
                offset = ulog.log_end_offset
                last_epoch = ulog.leader_epoch_cache.latest_epoch()
                start = ulog.log_start_offset
            sent[tp] = (offset, epoch)
            fetch[tp] = FetchData(offset, start, m.partition_max_bytes, epoch,
                                  last_epoch if last_epoch is not None else -1)
        if missing:
            log.debug("%s: no local log yet for %s; backing off", self.name, missing)
            self._delay(missing, m.backoff_ms)
        if throttled:  # over follower.replication.throttled.rate: asked again once it drains
            self._delay(throttled, min(m.backoff_ms, max(1, m.quota.throttle_time_ms())))
        if worker:
            # this round runs the worker steps and sends no Fetch: the session must not take
            # in what it would have sent (the leader would never hear of a partition added or
            # moved here, and would go on reading it from where it was)
            return None, {}
        to_send, to_forget, session_id, session_epoch = self._session.build(fetch)
        if not sent and not to_forget:
            return None, sent
        by_topic: dict[str, list[PartitionFetch]] = {}
        for tp, d in to_send.items():
            by_topic.setdefault(tp.topic, []).append(PartitionFetch(
                tp.partition, d.current_leader_epoch, d.fetch_offset, d.last_fetched_epoch,
                d.log_start_offset, d.max_bytes))
        forget: dict[str, list[int]] = {}
        for tp in to_forget:
            forget.setdefault(tp.topic, []).append(tp.partition)
        request = ReplicaFetch(
            m.broker_id, m.max_wait_ms, m.min_bytes, m.max_bytes, session_id, session_epoch,
            tuple((t, tuple(ps)) for t, ps in by_topic.items()),
            tuple((t, tuple(ps)) for t, ps in forget.items()))
        return request, sent

    # ---- the connection ---------------------------------------------------------------------

    def _connection(self):
        if self._conn is None:
            self._conn = self.manager.connect(self._address())
            if self._stopping.is_set():   # shut down while connecting
                self._close_connection()
                raise ConnectionError("shutting down")
        return self._conn

    def _close_connection(self) -> None:
        self._session.handle_error()   # the next fetch opens a new session
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _list_offset(self, tp: TopicPartition, epoch: int, timestamp: int) -> int | None:
        """The leader's offset for ``timestamp`` (latest or earliest), None on any failure."""
        found = self._list_offset_and_epoch(tp, epoch, timestamp)
        return None if found is None else found[0]

    def _list_offset_and_epoch(self, tp: TopicPartition, epoch: int,
                               timestamp: int) -> tuple[int, int] | None:
        """(offset, its leader epoch) the leader answers for ``timestamp``, None on failure."""
        if timestamp == EARLIEST_PENDING_UPLOAD_TIMESTAMP:   # v11 (KIP-1023)
            from kio.schema.list_offsets.v11 import request as rq
            from kio.schema.list_offsets.v11.response import ListOffsetsResponse
        else:
            from kio.schema.list_offsets.v9 import request as rq
            from kio.schema.list_offsets.v9.response import ListOffsetsResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i8, i32, i32Timedelta, i64
        extra = {"timeout": i32Timedelta.parse(datetime.timedelta(
            milliseconds=self.manager.socket_timeout_ms))} \
            if "timeout" in rq.ListOffsetsRequest.__dataclass_fields__ else {}
        req = rq.ListOffsetsRequest(
            replica_id=BrokerId(self.manager.broker_id), isolation_level=i8(0),
            topics=(rq.ListOffsetsTopic(name=TopicName(tp.topic), partitions=(
                rq.ListOffsetsPartition(partition_index=i32(tp.partition),
                                        current_leader_epoch=i32(epoch),
                                        timestamp=i64(timestamp)),)),), **extra)
        p = self._partition_answer(req, ListOffsetsResponse, f"ListOffsets {timestamp}", tp,
                                   lambda t: t.name, lambda p: p.partition_index)
        return None if p is None else (int(p.offset), int(p.leader_epoch))

    def _partition_answer(self, req, response_cls, what: str, tp: TopicPartition,
                          topic_of, partition_of):
        """The leader's answer for ``tp`` to a one-partition request, None on any failure (a
        failed request closes the connection; an error code is logged)."""
        try:
            resp = self._connection().request(req, response_cls)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: %s for %s failed (%s: %s)", self.name, what, tp,
                        type(exc).__name__, exc)
            self._close_connection()
            return None
        for t in resp.topics:
            for p in t.partitions:
                if topic_of(t) == tp.topic and partition_of(p) == tp.partition:
                    code = code_of(p.error_code)
                    if code != ErrorCode.NONE:
                        log.info("%s: %s for %s answered %s", self.name, what, tp,
                                 error_name(code))
                        return None
                    return p
        log.warning("%s: %s for %s answered without the partition", self.name, what, tp)
        return None

    def _end_offset_for_epoch(self, tp: TopicPartition, current_epoch: int,
                              epoch: int) -> tuple[int, int] | None:
        """OffsetForLeaderEpoch to the leader: (the largest epoch <= ``epoch``, its end
        offset), None on any failure."""
        from kio.schema.offset_for_leader_epoch.v4.request import (
            OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic)
        from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i32
        req = OffsetForLeaderEpochRequest(
            replica_id=BrokerId(self.manager.broker_id),
            topics=(OffsetForLeaderTopic(topic=TopicName(tp.topic), partitions=(
                OffsetForLeaderPartition(partition=i32(tp.partition),
                                         current_leader_epoch=i32(current_epoch),
                                         leader_epoch=i32(epoch)),)),))
        p = self._partition_answer(req, OffsetForLeaderEpochResponse,
                                   f"OffsetForLeaderEpoch {epoch}", tp,
                                   lambda t: t.topic, lambda p: p.partition)
        return None if p is None else (int(p.leader_epoch), int(p.end_offset))

    # ---- answers ----------------------------------------------------------------------------

    def _process_response(self, response, sent: dict[TopicPartition, tuple[int, int]],
                          notify: list[TopicPartition], worker: list) -> None:
        """Handle a Fetch answer: the partitions appended to (or whose high watermark moved)
        go to ``notify``; those that need the leader or the remote tier, to ``worker``."""
        top = code_of(response.error_code)
        usable = self._session.handle_response(response)
        if top in (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH):
            log.info("%s: fetch session answered %s; opening a new one with a full fetch",
                     self.name, error_name(top))
            return
        if top != ErrorCode.NONE:
            log.warning("%s: fetch answered %s; backing off", self.name, error_name(top))
            self._delay(sent, self.manager.backoff_ms)
            return
        if not usable:   # not an answer to this session's fetch: a new full fetch follows
            log.info("%s: fetch answer does not match the session's partitions; ignored",
                     self.name)
            return
        errors: list[TopicPartition] = []
        for t in response.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition_index)
                asked = sent.get(tp)
                st = self._states.get(tp)
                # removed, moved to another epoch, or failed meanwhile: the answer is stale
                if asked is None or st is None or st.failed or st.epoch != asked[1]:
                    continue
                ulog = self.manager.get_log(tp)
                if ulog is None or ulog.log_end_offset != asked[0]:
                    continue
                if not self._process_partition(tp, st, ulog, p, notify, worker):
                    errors.append(tp)
        self._delay(errors, self.manager.backoff_ms)

    def _process_partition(self, tp, st: _PartitionState, ulog: UnifiedLog, p,
                           notify: list[TopicPartition], worker: list) -> bool:
        """Handle one partition's answer; False to back it off."""
        code = code_of(p.error_code)
        if code == ErrorCode.NONE:
            return self._process_data(tp, st, ulog, p, notify)
        handler = {ErrorCode.OFFSET_OUT_OF_RANGE: self._handle_out_of_range,
                   ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE:
                       self._handle_moved_to_tiered_storage}.get(code)
        if handler is not None:
            worker.append((tp, handler, (ulog.log_end_offset, st.epoch)))
            return True
        if code in _BACK_OFF:
            log.debug("%s: %s answered %s; backing off", self.name, tp, error_name(code))
        else:
            log.warning("%s: %s answered %s; backing off", self.name, tp, error_name(code))
        return False

    def _process_data(self, tp, st: _PartitionState, ulog: UnifiedLog, p,
                      notify: list[TopicPartition]) -> bool:
        diverging = p.diverging_epoch
        if diverging is not None and diverging.epoch >= 0 and diverging.end_offset >= 0:
            # KIP-320: the records (none) are ignored; truncate and fetch again
            return self._truncate_on_diverging(tp, ulog, int(diverging.epoch),
                                               int(diverging.end_offset))
        records = p.records
        appended = False
        try:
            if records:
                info = ulog.append_as_follower(records)
                appended = info is not None and info.valid_bytes > 0
                quota = self.manager.quota
                if appended and quota is not None and quota.is_throttled(tp):
                    quota.record(info.valid_bytes)
            hw_before = ulog.high_watermark
            hw = int(p.high_watermark)
            if hw >= 0:
                ulog.update_high_watermark(min(hw, ulog.log_end_offset))
            leader_start = int(p.log_start_offset)
            if leader_start > ulog.log_start_offset:
                ulog.maybe_increment_log_start_offset(min(leader_start, ulog.high_watermark),
                                                      "leader offset incremented")
        except (CorruptRecordError, InvalidRecordError) as exc:
            # as Kafka: logged, fetched again (a transient state of the leader's log)
            log.error("%s: %s: invalid records from the leader at offset %d: %s",
                      self.name, tp, ulog.log_end_offset, exc)
            return False
        except KafkaStorageError as exc:
            # as Kafka's fetcher: the partition stops; the broker handles its offline log dir
            # and follows it afresh once the dir takes writes (log_dir_failure_handler)
            log.warning("%s: %s: cannot append at offset %d (%s); partition stopped until "
                        "its log dir takes writes again", self.name, tp, ulog.log_end_offset, exc)
            st.failed = True
            return True
        except Exception:  # noqa: BLE001 - a bug: stop this partition
            log.exception("%s: %s: failed to append at offset %d; partition marked failed",
                          self.name, tp, ulog.log_end_offset)
            st.failed = True
            return True
        st.lag = max(0, hw - ulog.log_end_offset) if hw >= 0 else st.lag
        if appended:
            # fetch order rotates, so a partition cut short by the response limit goes first later
            self._states[tp] = self._states.pop(tp)
        if appended or ulog.high_watermark != hw_before:
            notify.append(tp)
        return True

    def _truncate_on_diverging(self, tp, ulog: UnifiedLog, leader_epoch: int,
                               leader_end_offset: int) -> bool:
        """Kafka's ``getOffsetTruncationState`` for the leader's (epoch, end offset); False
        (back off) when that leaves the log as it was, which a correct leader never causes."""
        with ulog.lock:
            leo = ulog.log_end_offset
            ours = ulog.leader_epoch_cache.end_offset_for(leader_epoch, leo)
            if ours.offset == UNDEFINED_OFFSET or ours.leader_epoch == UNDEFINED_EPOCH:
                # we have no epoch at or below the leader's: its end offset is the bound
                target = min(leader_end_offset, leo)
            elif ours.leader_epoch != leader_epoch:
                # we never had the leader's epoch: cut to the end of our last epoch below it;
                # the next fetch names that epoch and the leader answers again if needed
                target = min(ours.offset, leo)
            else:
                target = min(ours.offset, leader_end_offset, leo)
            log.info("%s: %s diverges from the leader at epoch %d (leader end %d, ours %s); "
                     "truncating from %d to %d", self.name, tp, leader_epoch, leader_end_offset,
                     tuple(ours), leo, target)
            latest = ulog.leader_epoch_cache.latest_entry()
            if not ulog.truncate_to(target):
                if ulog.leader_epoch_cache.latest_entry() != latest:
                    return True   # it dropped an epoch we led without writing (KAFKA-10706)
                log.warning("%s: %s: nothing to truncate for the leader's diverging epoch %d; "
                            "backing off", self.name, tp, leader_epoch)
                return False
            return True

    def _handle_moved_to_tiered_storage(self, tp, st: _PartitionState, ulog: UnifiedLog) -> bool:
        """KIP-405's BuildingRemoteLogAuxState; False (back off, retry) on any failure."""
        if self.manager.remote_aux_state is None:
            log.error("%s: %s: the leader's log starts in remote storage above our log end %d, "
                      "but this broker has no tiered storage (remote.log.storage.system.enable)"
                      ": partition marked failed until its leader or leader epoch changes",
                      self.name, tp, ulog.log_end_offset)
            st.failed = True
            return True
        return self._rebuild_from_remote(tp, st, ulog, EARLIEST_LOCAL_TIMESTAMP)

    def _start_at_tiered_offset(self, tp, st: _PartitionState, ulog: UnifiedLog) -> bool:
        """KIP-1023 (``follower.fetch.last.tiered.offset.enable``): an empty replica of a
        tiered partition starts at the leader's first offset not yet in the remote tier
        instead of copying what the remote tier already holds. True when it did (or there was
        nothing to skip; the partition is no longer new), False to back off."""
        with ulog.lock:
            empty = ulog.log_end_offset == 0 and ulog.log_start_offset == 0
        if empty and ulog.remote_log_enabled and not self._rebuild_from_remote(
                tp, st, ulog, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
            return False
        st.new = False
        return True

    def _rebuild_from_remote(self, tp, st: _PartitionState, ulog: UnifiedLog, timestamp: int) -> bool:
        """Start the log after the remote segment below the leader's offset for ``timestamp``
        (its earliest local offset, or its earliest pending upload), as Kafka's
        TierStateMachine; False (back off, retry) on any failure."""
        build = self.manager.remote_aux_state
        local = self._list_offset_and_epoch(tp, st.epoch, timestamp)
        start = self._list_offset(tp, st.epoch, EARLIEST_TIMESTAMP) if local else None
        if local is None or start is None:
            return False
        leader_local_start, local_epoch = local
        if timestamp == EARLIEST_PENDING_UPLOAD_TIMESTAMP and leader_local_start <= max(start, 0):
            return True     # nothing tiered yet (or not tiered): fetch from the start
        if local_epoch < 0:
            log.warning("%s: %s: the leader knows no epoch for its offset %d",
                        self.name, tp, leader_local_start)
            return False
        target = local_epoch
        if local_epoch > 0:
            # the offset just below the local start may belong to an earlier epoch (or to one
            # before a gap in the epochs): the leader's end of the epoch before says which
            earlier = self._end_offset_for_epoch(tp, st.epoch, local_epoch - 1)
            if earlier is None:
                return False
            if earlier[1] > leader_local_start - 1:
                target = earlier[0]
        log.info("%s: %s: %s; rebuilding from the remote segment of epoch %d holding offset "
                 "%d (leader's log start %d)", self.name, tp,
                 f"offset {ulog.log_end_offset} moved to tiered storage"
                 if timestamp == EARLIEST_LOCAL_TIMESTAMP else "an empty replica starts at the "
                 f"leader's earliest pending upload {leader_local_start}",
                 target, leader_local_start - 1, start)
        try:
            build(ulog, target, leader_local_start, start)
        except Exception as exc:  # noqa: BLE001 - retried after the back-off
            log.warning("%s: %s: rebuilding from the remote tier failed, retrying after %d ms: "
                        "%s: %s", self.name, tp, self.manager.backoff_ms, type(exc).__name__, exc)
            return False
        st.lag = None
        return True

    def _handle_out_of_range(self, tp, st: _PartitionState, ulog: UnifiedLog) -> bool:
        """Kafka's ``fetchOffsetAndTruncate``; False (back off) when the leader cannot say."""
        leo = ulog.log_end_offset
        leader_end = self._list_offset(tp, st.epoch, LATEST_TIMESTAMP)
        if leader_end is None:
            return False
        if leader_end < leo:
            log.warning("%s: %s: our log end %d is past the leader's %d; truncating",
                        self.name, tp, leo, leader_end)
            ulog.truncate_to(leader_end)
            st.lag = 0
            return True
        leader_start = self._list_offset(tp, st.epoch, EARLIEST_TIMESTAMP)
        if leader_start is None:
            return False
        if leader_start > leo:
            log.warning("%s: %s: our log end %d is below the leader's log start %d; "
                        "restarting the log there", self.name, tp, leo, leader_start)
            ulog.truncate_fully_and_start_at(leader_start)
            st.lag = max(0, leader_end - ulog.log_end_offset)
            return True
        # as Kafka, fetch again from our log end, but after a back-off: nothing changed here
        log.info("%s: %s: offset %d out of range, but within the leader's [%d, %d]; "
                 "fetching again after a back-off", self.name, tp, leo, leader_start, leader_end)
        return False



class ReplicaFetcherManager:
    """This broker's fetchers, one per (leader id, fetcher id). Thread-safe."""

    def __init__(self, broker_id: int, endpoint_of: Callable[[int], tuple[str, int] | None],
                 get_log: Callable[[TopicPartition], UnifiedLog | None], *,
                 num_fetchers: int = DEFAULT_NUM_FETCHERS, max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
                 min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
                 partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
                 backoff_ms: int = DEFAULT_BACKOFF_MS,
                 on_append: Callable[[TopicPartition], None] | None = None,
                 connect: Callable[[str], Any] | None = None,
                 socket_timeout_ms: int = DEFAULT_SOCKET_TIMEOUT_MS,
                 quota: Any = None,
                 remote_aux_state: Callable[[UnifiedLog, int, int, int], int] | None = None,
                 fetch_last_tiered_offset: bool = False,
                 loop: asyncio.AbstractEventLoop | None = None, security=None):
        """``quota``: the follower replication throttle (strata.replication.quota), if any.
        ``remote_aux_state(log, target epoch, leader's local log start, leader's log start)``:
        KIP-405's rebuild from the remote tier (RemoteLogManager.build_remote_log_aux_state),
        None without tiered storage. ``fetch_last_tiered_offset``: KIP-1023's
        ``follower.fetch.last.tiered.offset.enable``. ``loop``: the event loop the fetchers
        run on (the broker's; without it, one of the manager's own). ``connect(address)``: the
        blocking connections of the worker steps; given (unit tests' fakes), it serves the
        Fetches too, else they go out on an ``AsyncConnection``."""
        if num_fetchers < 1:
            raise ValueError(f"num.replica.fetchers must be >= 1, got {num_fetchers}")
        if socket_timeout_ms < max_wait_ms:   # as Kafka's config check: a long poll must fit
            raise ValueError(f"replica.socket.timeout.ms ({socket_timeout_ms}) must be at least "
                             f"replica.fetch.wait.max.ms ({max_wait_ms})")
        self.broker_id = broker_id
        self.endpoint_of = endpoint_of
        self.get_log = get_log
        self.num_fetchers = num_fetchers
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.partition_max_bytes = partition_max_bytes
        self.backoff_ms = backoff_ms
        self.on_append = on_append
        self.socket_timeout_ms = socket_timeout_ms
        self.connect = connect or self._default_connect
        self.quota = quota
        self.remote_aux_state = remote_aux_state
        self.fetch_last_tiered_offset = fetch_last_tiered_offset
        self.security = security   # TLS/SASL to the leaders' inter-broker listener, if any
        self._loop = loop
        self._own_loop: threading.Thread | None = None
        # None: the blocking ``connect`` given (unit tests' fakes) serves the Fetches too
        self.async_connect = None if connect is not None else self._default_async_connect
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self._assigned: dict[TopicPartition, tuple[int, int]] = {}
        self._closed = False

    @classmethod
    def from_properties(cls, broker_id: int, props: Mapping[str, str],
                        endpoint_of: Callable[[int], tuple[str, int] | None],
                        get_log: Callable[[TopicPartition], UnifiedLog | None],
                        **kwargs) -> "ReplicaFetcherManager":
        """Kafka's broker configs, with Kafka's defaults; ``kwargs`` as for the constructor."""
        def num(name: str, default: int) -> int:
            value = props.get(name)
            return default if value is None or not str(value).strip() else int(str(value).strip())
        return cls(broker_id, endpoint_of, get_log,
                   num_fetchers=num("num.replica.fetchers", DEFAULT_NUM_FETCHERS),
                   max_wait_ms=num("replica.fetch.wait.max.ms", DEFAULT_MAX_WAIT_MS),
                   min_bytes=num("replica.fetch.min.bytes", DEFAULT_MIN_BYTES),
                   max_bytes=num("replica.fetch.response.max.bytes", DEFAULT_MAX_BYTES),
                   partition_max_bytes=num("replica.fetch.max.bytes", DEFAULT_PARTITION_MAX_BYTES),
                   backoff_ms=num("replica.fetch.backoff.ms", DEFAULT_BACKOFF_MS),
                   socket_timeout_ms=num("replica.socket.timeout.ms", DEFAULT_SOCKET_TIMEOUT_MS),
                   fetch_last_tiered_offset=str(props.get(
                       "follower.fetch.last.tiered.offset.enable", "false")).strip().lower() == "true",
                   **kwargs)

    def _default_connect(self, address: str):
        from strata.net.connection import Connection
        return Connection(address, timeout=self.socket_timeout_ms / 1000,
                          client_id=f"broker-{self.broker_id}-fetcher", security=self.security)

    async def _default_async_connect(self, address: str):
        from strata.net.connection import AsyncConnection
        return await AsyncConnection.open(address, timeout=self.socket_timeout_ms / 1000,
                                          client_id=f"broker-{self.broker_id}-fetcher",
                                          security=self.security)

    # ---- membership -------------------------------------------------------------------------

    def add_partitions(self, states: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """Follow each partition from (leader id, leader epoch). A partition whose leader
        changed leaves its old fetcher; an epoch below the one held is stale and ignored; a
        leader of -1 (none) stops fetching the partition."""
        idle: list[ReplicaFetcher] = []
        new: list[ReplicaFetcher] = []
        with self._lock:
            if self._closed:
                return
            for tp, (leader, epoch) in states.items():
                old_key = self._assigned.get(tp)
                old = self._fetchers.get(old_key) if old_key is not None else None
                held = old.states().get(tp) if old is not None else None
                if held is not None and held[0] > epoch:
                    log.info("ignoring stale leader %d at epoch %d for %s (epoch %d held)",
                             leader, epoch, tp, held[0])
                    continue
                key = (leader, fetcher_id(tp, self.num_fetchers))
                if old_key is not None and old_key != key:
                    if old is not None:
                        old.remove([tp])
                    del self._assigned[tp]
                if leader < 0:
                    continue
                fetcher = self._fetchers.get(key)
                if fetcher is None:
                    fetcher = self._fetchers[key] = ReplicaFetcher(self, *key)
                    new.append(fetcher)
                fetcher.add(tp, epoch)
                self._assigned[tp] = key
            # a new fetcher starts with all its partitions: one started with the first alone
            # would send its first Fetch for that one, and the leader could hold it for
            # replica.fetch.wait.max.ms before the rest were asked for
            for fetcher in new:
                fetcher.start()
            idle = self._take_idle_locked()
        self._stop(idle)

    def remove_partitions(self, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            by_fetcher: dict[tuple[int, int], list[TopicPartition]] = {}
            for tp in tps:
                key = self._assigned.pop(tp, None)
                if key is not None:
                    by_fetcher.setdefault(key, []).append(tp)
            for key, group in by_fetcher.items():
                fetcher = self._fetchers.get(key)
                if fetcher is not None:
                    fetcher.remove(group)
            idle = self._take_idle_locked()
        self._stop(idle)

    def retry_now(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` without waiting out its back-off (the remote log metadata manager
        calls this when a partition's metadata is loaded, so that a follower rebuilding from
        the remote tier need not wait ``replica.fetch.backoff.ms`` after a first attempt
        that found it not loaded yet). Nothing for a partition not followed."""
        with self._lock:
            key = self._assigned.get(tp)
            fetcher = self._fetchers.get(key) if key is not None else None
        if fetcher is not None:
            fetcher.retry_now(tp)

    def _take_idle_locked(self) -> list[ReplicaFetcher]:
        idle = [k for k, f in self._fetchers.items() if f.is_idle()]
        return [self._fetchers.pop(k) for k in idle]

    @staticmethod
    def _stop(fetchers: list[ReplicaFetcher]) -> None:
        for f in fetchers:
            f.initiate_shutdown()
        for f in fetchers:
            f.join()

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the fetchers run on: the broker's, or one of the manager's own, started
        in a thread the first time."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._own_loop = threading.Thread(target=loop.run_forever, daemon=True,
                                              name=f"ReplicaFetchers-{self.broker_id}")
            self._own_loop.start()
            self._loop = loop
        return self._loop

    def shutdown(self) -> None:
        """Stop every fetcher and wait for them; not from the loop's own thread (its tasks
        end on it). The manager's own loop stops too."""
        with self._lock:
            self._closed = True
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._assigned.clear()
        self._stop(fetchers)
        for f in fetchers:   # called off the loop with no lock held: the tasks can end
            f.wait_ended(self.socket_timeout_ms / 1000)
        own, self._own_loop = self._own_loop, None
        if own is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            own.join()
            self._loop.close()

    # ---- introspection ----------------------------------------------------------------------

    def _snapshot(self) -> list[tuple[int, dict]]:
        with self._lock:
            fetchers = list(self._fetchers.values())
        return [(f.leader_id, f.states()) for f in fetchers]

    def fetching(self) -> dict[TopicPartition, tuple[int, int]]:
        """tp -> (leader id, leader epoch) of every partition being fetched (failed ones not)."""
        return {tp: (leader, epoch) for leader, states in self._snapshot()
                for tp, (epoch, failed, _) in states.items() if not failed}

    def failed_partitions(self) -> dict[TopicPartition, tuple[int, int]]:
        """tp -> (leader id, leader epoch) of partitions stopped until their next change."""
        return {tp: (leader, epoch) for leader, states in self._snapshot()
                for tp, (epoch, failed, _) in states.items() if failed}

    def lag(self, tp: TopicPartition) -> int | None:
        """The leader's high watermark minus our log end offset at the last answer."""
        for _, states in self._snapshot():
            if tp in states:
                return states[tp][2]
        return None

    def threads(self) -> dict[tuple[int, int], ReplicaFetcher]:
        """(leader id, fetcher id) -> fetcher."""
        with self._lock:
            return dict(self._fetchers)
