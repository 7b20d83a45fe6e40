"""``__remote_log_metadata`` through the Kafka protocol, for a broker in a cluster.

Kafka's TopicBasedRemoteLogMetadataManager writes the topic with a producer (acks=all) and
reads it with a consumer, wherever the partitions' leaders are. ``ClusterMetadataTopicLog``
is the ``MetadataTopicLog`` that does the same with blocking requests to each metadata
partition's current leader (``leader_of``):

- ``append``: Produce v9, acks=-1, one record (null key) in one v2 batch; the offset once the
  leader acknowledged it (every in-sync replica has it, at least ``min.insync.replicas``).
- ``read``: Fetch v12 as a consumer (replica id -1, read_uncommitted, no long poll): the
  leader serves only records below its high watermark, i.e. committed ones. Control batches
  are skipped, compressed batches decompressed, a null value reads as ``b""`` (a bad record).
- ``log_start_offset`` / ``end_offset``: ListOffsets v9 earliest / latest (the high
  watermark, for a consumer).

Every call retries what Kafka's clients retry (no leader yet, NOT_LEADER_OR_FOLLOWER, fenced
or unknown leader epochs, NOT_ENOUGH_REPLICAS[_AFTER_APPEND], REQUEST_TIMED_OUT, an unknown
partition while the topic is being created, connection failures: anything in
``strata.common.errors.RETRIABLE``) with exponential backoff, asking ``leader_of`` again
before each attempt, until ``deadline_ms``; then it raises RemoteStorageException. Other
error codes raise at once. A retried append whose earlier attempt did land stores the record
twice (Kafka's idempotent producer would not): the RLMM applies a repeated state as a
no-op or skips it as a bad record.

Connections: one blocking ``strata.net.connection.Connection`` per leader address, reused,
closed on any error; a lock per connection makes requests on it sequential, so any thread
may call any method. ``close`` shuts every connection down, which also interrupts a call
blocked on one, and makes every later call raise.
"""

from __future__ import annotations

import copy
import datetime
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from strata.common.errors import RETRIABLE, ErrorCode, KafkaError, code_of, error_name
from strata.protocol import records as rec
from strata.tiered.api import (
    RemoteStorageException,
    RemoteStorageNotReadyException,
)
from strata.tiered.metadata.topic_log import REMOTE_LOG_METADATA_TOPIC_NAME, metadata_topic_configs

__all__ = ["ClusterMetadataTopicLog", "DEFAULT_MIN_INSYNC_REPLICAS", "parse_fetched"]

log = logging.getLogger(__name__)

# KIP-1235 (Kafka 4.3): min.insync.replicas of __remote_log_metadata; a cluster whose
# remote.log.metadata.topic.replication.factor is 1 must pass 1.
DEFAULT_MIN_INSYNC_REPLICAS = 2

CONSUMER_REPLICA_ID = -1
LATEST, EARLIEST = -1, -2

# Connection errors, and what an answer that does not decode raises.
_TRANSPORT_ERRORS = (OSError, ValueError, EOFError, struct.error)


class _Retry(Exception):
    """A failed attempt worth another one (a retriable error code, no leader)."""


class _Conn:
    __slots__ = ("lock", "conn")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Any = None




def parse_fetched(data: bytes | None, start_offset: int) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, value) of the records at or after ``start_offset`` in the complete batches of
    a Fetch answer, control batches skipped, and the offset after the last complete batch
    (``start_offset`` if there is none). Raises CorruptRecordError for a batch whose CRC or
    layout is wrong."""
    found: list[tuple[int, bytes]] = []
    next_offset = start_offset
    if not data:
        return found, next_offset
    for header in rec.iter_headers(data):
        next_offset = max(next_offset, header.next_offset)
        if header.is_control:
            continue
        for record in rec.decode_batch(data, header, check_crc=True):
            if record.offset >= start_offset:
                found.append((record.offset, record.value if record.value is not None else b""))
    return found, next_offset


class ClusterMetadataTopicLog:
    """MetadataTopicLog over the Kafka protocol to each metadata partition's leader.

    ``create_topic(num_partitions, configs)`` creates ``__remote_log_metadata`` if absent and
    returns its partition count (a retriable KafkaError, e.g. COORDINATOR_NOT_AVAILABLE while
    too few brokers are registered, raises RemoteStorageNotReadyException from
    ``ensure_topic``); ``leader_of(partition)`` is the (host, port) of the partition's
    current leader, None while it has none. ``connect(host, port)`` opens a connection with
    ``request(body, response_cls)`` and ``close()`` (default: ``Connection``).

    Options: ``min_insync_replicas`` (the topic's ``min.insync.replicas`` at creation),
    ``request_timeout_ms`` (the Produce timeout; the socket waits 5 s longer),
    ``retry_backoff_ms`` doubling up to ``retry_backoff_max_ms`` between attempts,
    ``deadline_ms`` (the most one call retries; ``bounded`` gives the same client with
    another), ``fetch_max_bytes`` (per Fetch).
    """

    remote = True  # the RLMM consumes it in the background instead of on every read

    def __init__(self, create_topic: Callable[[int, dict[str, str]], int],
                 leader_of: Callable[[int], tuple[str, int] | None], *,
                 client_id: str = "strata-rlmm",
                 min_insync_replicas: int = DEFAULT_MIN_INSYNC_REPLICAS,
                 request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100,
                 retry_backoff_max_ms: int = 1_000,
                 deadline_ms: int = 120_000,
                 fetch_max_bytes: int = 1 << 20,
                 connect: Callable[[str, int], Any] | None = None, security=None) -> None:
        if min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be at least 1, not {min_insync_replicas}")
        self._create_topic = create_topic
        self._leader_of = leader_of
        self.client_id = client_id
        self.min_insync_replicas = min_insync_replicas
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = max(retry_backoff_ms, retry_backoff_max_ms)
        self.deadline_ms = deadline_ms
        self.fetch_max_bytes = fetch_max_bytes
        self._connect = connect or self._default_connect
        self._security = security   # TLS/SASL to the brokers' inter-broker listener, if any
        self._conns: dict[tuple[str, int], _Conn] = {}
        self._conns_lock = threading.Lock()
        self._closed = threading.Event()

    # ---- MetadataTopicLog -----------------------------------------------------------------

    def topic_configs(self, retention_ms: int = -1) -> dict[str, str]:
        """What ``ensure_topic`` creates the topic with."""
        return {**metadata_topic_configs(retention_ms),
                "min.insync.replicas": str(self.min_insync_replicas)}

    def ensure_topic(self, num_partitions: int, retention_ms: int = -1) -> int:
        """One creation attempt; RemoteStorageNotReadyException if it may succeed later."""
        self._check_open()
        try:
            return int(self._create_topic(num_partitions, self.topic_configs(retention_ms)))
        except KafkaError as exc:
            error_cls = RemoteStorageNotReadyException if exc.retriable else RemoteStorageException
            raise error_cls(f"creating {REMOTE_LOG_METADATA_TOPIC_NAME}: {exc}") from exc
        except RemoteStorageException:
            raise
        except Exception as exc:  # noqa: BLE001 - the metadata layer's own failures
            raise RemoteStorageNotReadyException(
                f"creating {REMOTE_LOG_METADATA_TOPIC_NAME}: {type(exc).__name__}: {exc}") from exc

    def append(self, partition: int, value: bytes) -> int:
        from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
        from kio.schema.produce.v9.response import ProduceResponse
        from kio.schema.types import TopicName
        from kio.static.primitive import i16, i32, i32Timedelta
        batch = rec.build_batch([rec.SimpleRecord(bytes(value))])
        request = ProduceRequest(
            transactional_id=None, acks=i16(-1),
            timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.request_timeout_ms)),
            topic_data=(TopicProduceData(name=TopicName(REMOTE_LOG_METADATA_TOPIC_NAME), partition_data=(
                PartitionProduceData(index=i32(partition), records=batch),)),))

        def attempt(address: tuple[str, int]) -> int:
            response = self._request(address, request, ProduceResponse)
            p = _only(partition, (q for t in response.responses
                                  if t.name == REMOTE_LOG_METADATA_TOPIC_NAME
                                  for q in t.partition_responses if q.index == partition))
            self._check_code(code_of(p.error_code), partition, "Produce", p.error_message)
            return int(p.base_offset)
        return self._with_leader(partition, "appending to", attempt)

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes]]:
        """Records from ``start_offset`` (raised to the log start offset) up to the high
        watermark the first Fetch reports, one Fetch at a time (lazily)."""
        offset, end = max(0, start_offset), None
        while end is None or offset < end:
            offset, found, next_offset, hw = self._fetch(partition, offset)
            end = hw if end is None else end
            yield from found
            if next_offset <= offset:
                return  # nothing below the leader's high watermark (its own may trail ours)
            offset = next_offset

    def log_start_offset(self, partition: int) -> int:
        return self._with_leader(partition, "listing the earliest offset of",
                                 lambda address: self._list_offset(address, partition, EARLIEST))

    def end_offset(self, partition: int) -> int:
        return self._with_leader(partition, "listing the latest offset of",
                                 lambda address: self._list_offset(address, partition, LATEST))

    def bounded(self, deadline_ms: int) -> "ClusterMetadataTopicLog":
        """This client (its connections, and closing) with calls that retry for at most
        ``deadline_ms``: for callers that retry by themselves and must not wait on one
        unavailable partition while others could be read (the RLMM's background threads)."""
        view = copy.copy(self)   # shares the connections, their lock and the closed flag
        view.deadline_ms = deadline_ms
        return view

    def close(self) -> None:
        """Close every connection (interrupting calls blocked on them); later calls raise."""
        self._closed.set()
        with self._conns_lock:
            states = list(self._conns.values())
        for state in states:
            _shutdown(state.conn)  # wakes a reader blocked on it; it closes it itself
            if state.lock.acquire(timeout=5):
                try:
                    self._drop(state)
                finally:
                    state.lock.release()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # ---- requests -------------------------------------------------------------------------

    def _fetch(self, partition: int, offset: int) -> tuple[int, list[tuple[int, bytes]], int, int]:
        """(offset read from, its records, the offset after them, the high watermark)."""
        from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
        from kio.schema.fetch.v12.response import FetchResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i8, i32, i32Timedelta, i64

        def attempt(address: tuple[str, int]) -> tuple[int, list[tuple[int, bytes]], int, int]:
            nonlocal offset
            for _ in range(3):  # out of range: at most a move to the log start, then again
                request = FetchRequest(
                    replica_id=BrokerId(CONSUMER_REPLICA_ID),
                    max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(1),
                    max_bytes=i32(self.fetch_max_bytes), isolation_level=i8(0),
                    session_id=i32(0), session_epoch=i32(-1),
                    topics=(FetchTopic(topic=TopicName(REMOTE_LOG_METADATA_TOPIC_NAME), partitions=(
                        FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                                       partition_max_bytes=i32(self.fetch_max_bytes)),)),),
                    forgotten_topics_data=())
                response = self._request(address, request, FetchResponse)
                top = code_of(response.error_code)
                if top != ErrorCode.NONE:
                    self._check_code(top, partition, "Fetch")
                p = _only(partition, (q for t in response.responses
                                      if t.topic == REMOTE_LOG_METADATA_TOPIC_NAME
                                      for q in t.partitions if q.partition_index == partition))
                code = code_of(p.error_code)
                if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    start = self._list_offset(address, partition, EARLIEST)
                    if offset < start:
                        offset = start
                        continue
                    end = self._list_offset(address, partition, LATEST)
                    if offset >= end:  # past the leader's end: nothing to read there yet
                        return offset, [], offset, end
                    raise _Retry(f"offset {offset} out of range in [{start}, {end})")
                self._check_code(code, partition, "Fetch")
                try:
                    found, next_offset = parse_fetched(p.records, offset)
                except KafkaError as exc:  # a corrupt batch: fetched again
                    raise _Retry(f"bad batch at offset {offset}: {exc}") from exc
                return offset, found, next_offset, int(p.high_watermark)
            raise _Retry(f"offset {offset} stayed out of range")
        return self._with_leader(partition, "fetching", attempt)

    def _list_offset(self, address: tuple[str, int], partition: int, timestamp: int) -> int:
        from kio.schema.list_offsets.v9.request import (
            ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
        from kio.schema.list_offsets.v9.response import ListOffsetsResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i8, i32, i64
        request = ListOffsetsRequest(
            replica_id=BrokerId(CONSUMER_REPLICA_ID), isolation_level=i8(0),
            topics=(ListOffsetsTopic(name=TopicName(REMOTE_LOG_METADATA_TOPIC_NAME), partitions=(
                ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),))
        response = self._request(address, request, ListOffsetsResponse)
        p = _only(partition, (q for t in response.topics if t.name == REMOTE_LOG_METADATA_TOPIC_NAME
                              for q in t.partitions if q.partition_index == partition))
        self._check_code(code_of(p.error_code), partition, "ListOffsets")
        if int(p.offset) < 0:
            raise _Retry(f"ListOffsets {timestamp} answered offset {int(p.offset)}")
        return int(p.offset)

    def _check_code(self, code: int, partition: int, api: str, message: str | None = None) -> None:
        if code == ErrorCode.NONE:
            return
        what = f"{api} to {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition} answered {error_name(code)}"
        if message:
            what += f": {message}"
        if code in RETRIABLE:
            raise _Retry(what)
        raise RemoteStorageException(what)

    def _with_leader(self, partition: int, what: str, attempt: Callable[[tuple[str, int]], Any]) -> Any:
        """``attempt(leader address)``, retried with backoff until it returns, a non-retriable
        error, or the deadline."""
        deadline = time.monotonic() + self.deadline_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        attempts = 0
        while True:
            self._check_open()
            attempts += 1
            try:
                address = self._leader_of(partition)
                if address is None:
                    raise _Retry("the partition has no leader")
                return attempt(address)
            except _Retry as exc:
                last: BaseException = exc
            except RemoteStorageException:
                raise
            except _TRANSPORT_ERRORS as exc:
                last = exc
            except KafkaError as exc:
                if not exc.retriable:
                    raise RemoteStorageException(f"{what} {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition}: "
                                                 f"{exc}") from exc
                last = exc
            except Exception as exc:  # noqa: BLE001 - a bug or leader_of's own failure
                raise RemoteStorageException(f"{what} {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition}: "
                                             f"{type(exc).__name__}: {exc}") from exc
            self._check_open()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteStorageException(
                    f"{what} {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition}: gave up after {attempts} "
                    f"attempt(s) in {self.deadline_ms} ms: {type(last).__name__}: {last}") from last
            log.debug("%s %s-%d failed (%s: %s); retrying in %.0f ms", what,
                      REMOTE_LOG_METADATA_TOPIC_NAME, partition, type(last).__name__, last,
                      min(backoff, left) * 1000)
            self._closed.wait(min(backoff, left))
            backoff = min(backoff * 2, self.retry_backoff_max_ms / 1000)

    def _request(self, address: tuple[str, int], body: Any, response_cls: Any) -> Any:
        with self._conns_lock:
            state = self._conns.get(address)
            if state is None:
                state = self._conns[address] = _Conn()
        with state.lock:
            self._check_open()
            try:
                if state.conn is None:
                    state.conn = self._connect(*address)
                return state.conn.request(body, response_cls)
            except BaseException:
                self._drop(state)
                raise

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RemoteStorageException(f"the {REMOTE_LOG_METADATA_TOPIC_NAME} client is closed")

    @staticmethod
    def _drop(state: _Conn) -> None:
        conn, state.conn = state.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _default_connect(self, host: str, port: int) -> Any:
        from strata.net.connection import Connection
        return Connection(f"{host}:{port}", timeout=self.request_timeout_ms / 1000 + 5,
                          client_id=self.client_id, security=self._security)


def _only(partition: int, found: Iterator[Any]) -> Any:
    p = next(iter(found), None)
    if p is None:
        raise _Retry(f"the answer has no {REMOTE_LOG_METADATA_TOPIC_NAME}-{partition}")
    return p


def _shutdown(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

