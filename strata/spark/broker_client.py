"""A small blocking Kafka client for Spark executors and drivers: Metadata, ListOffsets, Fetch
and DescribeConfigs, no event loop, no background threads.

Requests are kio messages sent on ``strata.net.connection.Connection``s; each broker gets one
persistent connection, opened on first use and reused for every later request (correlation
ids are checked). Partition requests go to the partition's leader as the last Metadata
response named it; a leadership error refreshes the metadata and retries. Versions are the
newest that kio has and Strata serves: Metadata v12, ListOffsets v9, Fetch v12 (topic names;
v13+ switches to topic ids), DescribeConfigs v4; a broker's ApiVersions answer is checked
once per connection, so an older broker fails with a clear error.

Thread-safe: requests of one client are sent one at a time (a lock around each), so threads
sharing a client wait for each other; Spark runs one task at a time in a Python worker.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from strata.common.errors import RETRIABLE, ErrorCode, KafkaError, code_of
from strata.net.connection import Connection
from strata.protocol.records import HEADER, HEADER_SIZE, LOG_OVERHEAD

__all__ = [
    "BrokerClient",
    "BrokerRequestError",
    "DataLossError",
    "FetchResult",
    "TopicInfo",
    "WholeBatches",
    "whole_batches",
]

log = logging.getLogger(__name__)

_API_NAMES = {3: "Metadata", 2: "ListOffsets", 1: "Fetch", 32: "DescribeConfigs"}

# Retries of a retriable error code (after a metadata refresh each) before giving up.
_RETRIES = 5
_RETRY_BACKOFF_S = 0.1
_LEADERSHIP_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_ID})


@dataclass(frozen=True)
class TopicInfo:
    """A topic as Metadata describes it."""

    name: str
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True)
class FetchResult:
    """One partition of a Fetch response. ``records`` is raw record-batch bytes as the broker
    sent them: whole batches except, possibly, a partial last one."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes


class DataLossError(Exception):
    """Offsets that were asked for no longer exist (deleted by retention, a missing remote
    object). ``topic``, ``partition`` and the missing offsets ``[start, end)`` when known."""

    def __init__(self, message: str, *, topic: str | None = None, partition: int | None = None,
                 start: int | None = None, end: int | None = None) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class BrokerRequestError(KafkaError):
    """A broker answered a request with an error code (``code``: Kafka's number)."""

    def __init__(self, message: str, code: int) -> None:
        try:
            known: ErrorCode | None = ErrorCode(code)
        except ValueError:
            known = None
        super().__init__(f"{message}: {known.name if known is not None else 'error'} ({code})",
                         known)
        self.error_code = code

    @property
    def retriable(self) -> bool:
        return self.error_code in RETRIABLE


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bootstrap server {text!r} is not host:port")
    return host.strip("[]"), int(port)


class BrokerClient:
    """A blocking client of a Kafka-protocol cluster (see the module doc).

    ``bootstrap_servers``: comma-separated ``host:port``; ``timeout_s`` bounds every socket
    operation and the waiting of ``read_range`` for offsets the broker does not serve yet.
    """

    def __init__(self, bootstrap_servers: str, client_id: str = "strata-spark",
                 timeout_s: float = 30.0) -> None:
        self.bootstrap = [_address(s) for s in bootstrap_servers.split(",") if s.strip()]
        if not self.bootstrap:
            raise ValueError("no bootstrap server given")
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._connections: dict[tuple[str, int], Connection] = {}
        self._versions: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}  # per connection
        self._lock = threading.RLock()      # one request at a time per client
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._topics: dict[str, TopicInfo] = {}

    # ---- life cycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Sockets and locks do not travel: a client pickled into a Spark task reconnects there.
        state = self.__dict__.copy()
        del state["_connections"], state["_versions"], state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connections, self._versions = {}, {}
        self._lock = threading.RLock()

    # ---- connections ------------------------------------------------------------------------

    def _connection(self, address: tuple[str, int]) -> Connection:
        conn = self._connections.get(address)
        if conn is None:
            conn = Connection(address, self.timeout_s, self.client_id)
            try:
                self._versions[address] = self._api_versions(conn)
            except BaseException:
                conn.close()
                raise
            self._connections[address] = conn
        return conn

    def _api_versions(self, conn: Connection) -> dict[int, tuple[int, int]]:
        from kio.schema.api_versions.v3.request import ApiVersionsRequest
        from kio.schema.api_versions.v3.response import ApiVersionsResponse
        resp = conn.request(ApiVersionsRequest(client_software_name="strata-spark",
                                               client_software_version="1"), ApiVersionsResponse)
        if code_of(resp.error_code):
            raise BrokerRequestError(f"ApiVersions to {conn.address}", code_of(resp.error_code))
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}

    def _send(self, address: tuple[str, int], body: Any, response_cls: type) -> Any:
        """One request. Every request this client sends only reads, so a broken connection
        is replaced and the request sent once more before the error is raised."""
        for attempt in (0, 1):
            with self._lock:
                conn = self._connection(address)
                api_key = int(body.__api_key__)
                low, high = self._versions[address].get(api_key, (0, -1))
                if not low <= int(body.__version__) <= high:
                    raise BrokerRequestError(
                        f"broker {address[0]}:{address[1]} does not serve "
                        f"{_API_NAMES.get(api_key, api_key)} v{int(body.__version__)} (it serves "
                        f"{low}-{high})", ErrorCode.UNSUPPORTED_VERSION)
                try:
                    return conn.request(body, response_cls)
                except OSError as exc:       # ConnectionError and socket timeouts included
                    conn.close()
                    self._connections.pop(address, None)
                    if attempt:
                        raise
                    log.info("request to %s:%d failed (%s); reconnecting", *address, exc)
        raise AssertionError("unreachable")

    def _any_broker(self, body: Any, response_cls: type) -> Any:
        """Send to a connected broker, else to each bootstrap server in turn."""
        candidates = list(self._connections) + [a for a in self.bootstrap
                                                if a not in self._connections]
        error: Exception | None = None
        for address in candidates:
            try:
                return self._send(address, body, response_cls)
            except OSError as exc:
                error = exc
        raise ConnectionError(f"no broker of {self.bootstrap} answered: {error}") from error

    def _leader_address(self, topic: str, partition: int) -> tuple[str, int]:
        leader = self._leaders.get((topic, partition))
        if leader is None or leader not in self._brokers:
            self._refresh([topic])
            leader = self._leaders.get((topic, partition))
        if leader is None or leader < 0 or leader not in self._brokers:
            raise BrokerRequestError(f"{topic}-{partition} has no leader",
                                     ErrorCode.LEADER_NOT_AVAILABLE)
        return self._brokers[leader]

    # ---- Metadata ---------------------------------------------------------------------------

    def _refresh(self, names: list[str] | None) -> dict[str, TopicInfo]:
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
        from kio.schema.metadata.v12.response import MetadataResponse
        from kio.schema.types import TopicName
        topics = None if names is None else tuple(
            MetadataRequestTopic(topic_id=None, name=TopicName(n)) for n in names)
        resp = self._any_broker(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                                include_topic_authorized_operations=False),
                                MetadataResponse)
        for b in resp.brokers:
            self._brokers[int(b.node_id)] = (str(b.host), int(b.port))
        found: dict[str, TopicInfo] = {}
        for t in resp.topics:
            code = code_of(t.error_code)
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION or t.name is None:
                continue
            if code:
                raise BrokerRequestError(f"Metadata of topic {t.name}", code)
            info = TopicInfo(str(t.name), t.topic_id, len(t.partitions))
            found[info.name] = self._topics[info.name] = info
            for p in t.partitions:
                self._leaders[(info.name, int(p.partition_index))] = int(p.leader_id)
        return found

    def topics(self, names: list[str] | None = None) -> dict[str, TopicInfo]:
        """The topics named (all, internal ones included, when None) that exist, by name;
        unknown names are left out. Retriable errors (a topic still being created) are retried."""
        for attempt in range(_RETRIES + 1):
            try:
                return self._refresh(None if names is None else list(names))
            except BrokerRequestError as exc:
                if not exc.retriable or attempt == _RETRIES:
                    raise
                time.sleep(_RETRY_BACKOFF_S * (attempt + 1))
        raise AssertionError("unreachable")

    # ---- ListOffsets ------------------------------------------------------------------------

    def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """Each partition's offset for ``timestamp``: -1 latest (the high watermark), -2
        earliest (log start, remote tier included), -4 earliest local, -5 latest tiered (-1
        when nothing is), or epoch ms: the first offset whose timestamp is >= it (-1 when no
        record is that late, as Kafka answers)."""
        from kio.schema.list_offsets.v9.request import (
            ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
        from kio.schema.list_offsets.v9.response import ListOffsetsResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i8, i32, i64

        def ask(address: tuple[str, int], parts: list[int]) -> Iterator[tuple[int, int, Any]]:
            req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=(
                ListOffsetsTopic(name=TopicName(topic), partitions=tuple(
                    ListOffsetsPartition(partition_index=i32(p), timestamp=i64(timestamp))
                    for p in parts)),))
            for t in self._send(address, req, ListOffsetsResponse).topics:
                for r in t.partitions:
                    yield int(r.partition_index), code_of(r.error_code), int(r.offset)
        return self._ask_leaders(topic, partitions, lambda p: p, ask,
                                 lambda p: f"ListOffsets({timestamp}) of {topic}-{p}")

    # ---- OffsetForLeaderEpoch ---------------------------------------------------------------

    def epoch_end_offsets(self, topic: str, asks: list[tuple[int, int]]
                          ) -> dict[tuple[int, int], tuple[int, int]]:
        """For each (partition, leader epoch) asked, the leader's answer as a consumer gets it
        (OffsetForLeaderEpoch v4): (the largest epoch of its log at or below the one asked,
        where that epoch ends), or (-1, -1) when its log has none."""
        from kio.schema.offset_for_leader_epoch.v4.request import (
            OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic)
        from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
        from kio.schema.types import BrokerId, TopicName
        from kio.static.primitive import i32

        def ask(address: tuple[str, int], keys: list[tuple[int, int]]
                ) -> Iterator[tuple[tuple[int, int], int, Any]]:
            req = OffsetForLeaderEpochRequest(replica_id=BrokerId(-1), topics=(
                OffsetForLeaderTopic(topic=TopicName(topic), partitions=tuple(
                    OffsetForLeaderPartition(partition=i32(p), leader_epoch=i32(e))
                    for p, e in keys)),))
            asked = dict(keys)
            for t in self._send(address, req, OffsetForLeaderEpochResponse).topics:
                for r in t.partitions:
                    p = int(r.partition)
                    yield ((p, asked.get(p, -1)), code_of(r.error_code),
                           (int(r.leader_epoch), int(r.end_offset)))
        return self._ask_leaders(topic, asks, lambda k: k[0], ask,
                                 lambda k: f"OffsetForLeaderEpoch({k[1]}) of {topic}-{k[0]}")

    def _ask_leaders(self, topic: str, keys: Iterable[Any], partition_of: Callable[[Any], int],
                     ask: Callable[[tuple[str, int], list[Any]], Iterable[tuple[Any, int, Any]]],
                     what: Callable[[Any], str]) -> dict[Any, Any]:
        """Each key's answer from its partition's leader: ``ask(leader, keys)`` sends one
        request and yields (key, error code, answer); a request names a partition once, so
        keys of one partition go in successive requests. Retriable errors (a leader moved)
        are retried after a metadata refresh; others raise BrokerRequestError."""
        result: dict[Any, Any] = {}
        pending = sorted(set(keys))
        for attempt in range(_RETRIES + 1):
            failed: list[tuple[Any, int]] = []
            requests: dict[tuple[tuple[str, int], int], list[Any]] = {}
            rounds: dict[int, int] = {}
            for k in pending:
                p = partition_of(k)
                try:
                    address = self._leader_address(topic, p)
                except BrokerRequestError as exc:
                    failed.append((k, exc.error_code))
                    continue
                requests.setdefault((address, rounds.get(p, 0)), []).append(k)
                rounds[p] = rounds.get(p, 0) + 1
            for (address, _), batch in requests.items():
                for k, code, answer in ask(address, batch):
                    if code:
                        failed.append((k, code))
                    else:
                        result[k] = answer
            failed += [(k, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for k in pending
                       if k not in result and k not in dict(failed)]
            if not failed:
                return result
            errors = [BrokerRequestError(what(k), c) for k, c in failed]
            fatal = next((e for e in errors if not e.retriable), None)
            if fatal is not None or attempt == _RETRIES:
                raise fatal or errors[0]
            self._after_error(topic, [c for _, c in failed], attempt)
            pending = [k for k, _ in failed]
        raise AssertionError("unreachable")

    def _after_error(self, topic: str, codes: list[int], attempt: int) -> None:
        time.sleep(_RETRY_BACKOFF_S * (attempt + 1))
        if any(c in _LEADERSHIP_ERRORS for c in codes):
            self._refresh([topic])

    # ---- Fetch ------------------------------------------------------------------------------

    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int = 8 << 20,
              max_wait_ms: int = 500) -> FetchResult:
        """One Fetch of one partition from ``offset`` (read uncommitted, at most ``max_bytes``
        but at least one whole batch, KIP-74), from the partition's leader. The partition's
        error code is returned, not raised; a request-level error raises BrokerRequestError."""
        from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
        from kio.schema.fetch.v12.response import FetchResponse
        from kio.schema.types import TopicName
        from kio.static.primitive import i32, i32Timedelta, i64
        max_bytes = min(max_bytes, 0x7FFFFFFF)
        req = FetchRequest(
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
            min_bytes=i32(1), max_bytes=i32(max_bytes),
            topics=(FetchTopic(topic=TopicName(topic), partitions=(FetchPartition(
                partition=i32(partition), fetch_offset=i64(offset),
                partition_max_bytes=i32(max_bytes)),)),),
            forgotten_topics_data=())
        resp = self._send(self._leader_address(topic, partition), req, FetchResponse)
        if code_of(resp.error_code):
            raise BrokerRequestError(f"Fetch of {topic}-{partition}", code_of(resp.error_code))
        for t in resp.responses:
            for p in t.partitions:
                if int(p.partition_index) == partition:
                    return FetchResult(code_of(p.error_code), int(p.high_watermark),
                                       int(p.last_stable_offset), int(p.log_start_offset),
                                       bytes(p.records) if p.records else b"")
        raise BrokerRequestError(f"Fetch of {topic}-{partition}: not in the response",
                                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    def read_range(self, topic: str, partition: int, start: int, end: int, *,
                   max_bytes: int = 8 << 20) -> Iterator[bytes]:
        """The record batches holding offsets ``[start, end)``, Fetch after Fetch: whole
        batches only, the first possibly beginning before ``start``, none beginning at or after
        ``end`` (control batches included: ``batches_to_arrow`` skips them).

        Raises DataLossError naming the topic-partition and the missing offsets
        ``[exc.start, exc.end)`` when offsets of the range no longer exist: the broker answers
        OFFSET_OUT_OF_RANGE, or its log start offset moved past offsets it skipped (gaps
        above the log start offset are records that are not visible, as Spark's Kafka source
        treats them). A caller that carries on resumes at ``exc.end`` and decodes from there
        (the first batch it gets may hold offsets below it). Other error codes raise
        BrokerRequestError (retriable ones are retried first); offsets the broker does not
        serve yet (``end`` above its high watermark) are waited for up to ``timeout_s``, then
        TimeoutError.
        """
        where = f"{topic}-{partition}"
        offset = start
        retries = 0
        idle_since: float | None = None
        while offset < end:
            try:
                result = self.fetch(topic, partition, offset, max_bytes=max_bytes)
            except BrokerRequestError as exc:
                if not exc.retriable or retries >= _RETRIES:
                    raise
                self._after_error(topic, [exc.error_code], retries)
                retries += 1
                continue
            code = result.error_code
            if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                lost_end = min(end, result.log_start_offset) if result.log_start_offset > offset \
                    else end
                raise DataLossError(
                    f"{where}: offsets [{offset}, {lost_end}) are out of range (log start offset "
                    f"{result.log_start_offset}, high watermark {result.high_watermark})",
                    topic=topic, partition=partition, start=offset, end=lost_end)
            if code:
                error = BrokerRequestError(f"Fetch of {where} at offset {offset}", code)
                if not error.retriable or retries >= _RETRIES:
                    raise error
                self._after_error(topic, [code], retries)
                retries += 1
                continue
            retries = 0
            found = whole_batches(result.records, offset, end)
            chunk = result.records[found.keep_from:found.keep_to] if found.keep_from >= 0 else b""
            first_base, next_offset = found.first_base, found.next_offset
            if next_offset <= offset:
                # nothing new: offsets not there yet, a remote read that did not finish in the
                # broker's wait, or one batch larger than max_bytes
                if result.records and not chunk and max_bytes < 0x7FFFFFFF:
                    max_bytes = min(max_bytes * 2, 0x7FFFFFFF)
                    continue
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if now - idle_since > self.timeout_s:
                    raise TimeoutError(
                        f"{where}: no records at offset {offset} within {self.timeout_s} s "
                        f"(high watermark {result.high_watermark}, asked up to {end})")
                continue
            idle_since = None
            if first_base > offset and result.log_start_offset > offset:
                # the log start offset moved past offsets this read had not reached yet
                lost_end = min(first_base, result.log_start_offset, end)
                raise DataLossError(f"{where}: offsets [{offset}, {lost_end}) are missing: the "
                                    f"log now starts at {result.log_start_offset}",
                                    topic=topic, partition=partition, start=offset, end=lost_end)
            if chunk:
                yield chunk
            offset = next_offset

    # ---- DescribeConfigs --------------------------------------------------------------------

    def describe_configs(self, resource_type: int, name: str) -> dict[str, str]:
        """The configs of one resource (2: topic, 4: broker, named by its id) with a value
        (sensitive ones have none and are left out)."""
        from kio.schema.describe_configs.v4.request import (
            DescribeConfigsRequest, DescribeConfigsResource)
        from kio.schema.describe_configs.v4.response import DescribeConfigsResponse
        from kio.static.primitive import i8
        req = DescribeConfigsRequest(resources=(DescribeConfigsResource(
            resource_type=i8(resource_type), resource_name=name, configuration_keys=None),))
        if resource_type == 4 and name.isdigit() and int(name) in self._brokers:
            resp = self._send(self._brokers[int(name)], req, DescribeConfigsResponse)
        else:
            resp = self._any_broker(req, DescribeConfigsResponse)
        for r in resp.results:
            code = code_of(r.error_code)
            if code:
                raise BrokerRequestError(f"DescribeConfigs of {name}"
                                         f"{': ' + r.error_message if r.error_message else ''}",
                                         code)
            return {str(c.name): str(c.value) for c in r.configs if c.value is not None}
        raise BrokerRequestError(f"DescribeConfigs of {name}: no result",
                                 ErrorCode.UNKNOWN_SERVER_ERROR)


class WholeBatches(NamedTuple):
    """What ``whole_batches`` found at the head of a buffer of record batches."""

    keep_from: int      # position of the first whole batch holding offsets >= start (-1: none)
    keep_to: int        # end of the last whole batch starting below end
    first_base: int     # base offset of the batch at keep_from (-1: none)
    next_offset: int    # the offset after the whole batches read (start: none; end: reached)
    parsed_to: int      # where the whole batches read end: a partial batch may follow
    reached_end: bool   # a batch starting at or after end was met (reading stopped there)


def whole_batches(data: bytes, start: int, end: int) -> WholeBatches:
    """Walk the whole batches of ``data`` (from a batch boundary) that matter for offsets
    ``[start, end)``: those ending before ``start`` are passed over, the walk stops at a
    batch starting at or after ``end`` or at a partial (or malformed) batch."""
    unpack = HEADER.unpack_from
    size = len(data)
    pos = 0
    keep_from = keep_to = first = -1
    next_offset = start
    reached_end = False
    while pos + HEADER_SIZE <= size:
        fields = unpack(data, pos)
        batch_end = pos + fields[1] + LOG_OVERHEAD
        if fields[1] < HEADER_SIZE - LOG_OVERHEAD or batch_end > size:
            break
        base, last = fields[0], fields[0] + fields[6]
        if base >= end:
            reached_end = True
            next_offset = end
            break
        if last >= start:
            if keep_from < 0:
                keep_from, first = pos, base
            keep_to = batch_end
        next_offset = max(next_offset, last + 1)
        pos = batch_end
    return WholeBatches(keep_from, keep_to, first, next_offset, pos, reached_end)
