"""Kafka's broker metrics, counted where requests and partitions are handled and read at scrape
time: ``BrokerTopicStats`` (Kafka's ``BrokerTopicMetrics`` per topic and in total),
``RequestStats`` (``RequestMetrics`` per API), the purgatory's remote-wait accounting and
``EventLoopIdle`` (the event loop's time blocked waiting for I/O).

Every counter is a plain integer (or float sum) bumped once per request or per partition of a
request, never per record, on the event loop's thread; a scrape reads a copy. Rates are left to
Prometheus: everything is exported as a monotonic counter (``_total``) or a summary's ``_count``
and ``_sum``, never as a rate computed here.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import defaultdict
from typing import Any

from strata.common.errors import ErrorCode
from strata.protocol.codec import ApiKey

# The time the current request spent parked in a purgatory (a long-poll Fetch, an acks=all
# Produce waiting for replication): [ns]; set per request by the network layer.
REMOTE_WAIT_NS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "strata_remote_wait_ns", default=None)

# Kafka's BrokerTopicMetrics meters this module counts, in export order: (name, help)
TOPIC_METERS = (
    ("BytesInPerSec", "Bytes of record batches appended by producers."),
    ("BytesOutPerSec", "Bytes of records sent to consumers (followers excluded)."),
    ("MessagesInPerSec", "Records appended by producers (a batch's offset count)."),
    ("BytesRejectedPerSec", "Bytes of produced batches refused as too large."),
    ("FailedProduceRequestsPerSec", "Partition appends that failed unexpectedly (Kafka's "
     "rule: not for unknown partitions, not-leader, too-large, corrupt or storage errors)."),
    ("FailedFetchRequestsPerSec", "Partition reads that failed unexpectedly (Kafka's rule: not "
     "for unknown partitions, not-leader, leader epoch, offset out of range or storage errors)."),
    ("TotalProduceRequestsPerSec", "Partition appends attempted (one per partition of a Produce)."),
    ("TotalFetchRequestsPerSec", "Partition reads (one per partition of a Fetch, consumers "
     "and followers)."),
)
_IN, _OUT, _MSGS, _REJECTED, _FAILED_P, _FAILED_F, _TOTAL_P, _TOTAL_F = range(len(TOPIC_METERS))

# Errors that Kafka's ReplicaManager does not count as failed appends / reads
_EXPECTED_PRODUCE_ERRORS = frozenset({
    ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.CORRUPT_MESSAGE,
    ErrorCode.KAFKA_STORAGE_ERROR})
_EXPECTED_FETCH_ERRORS = frozenset({
    ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.INCONSISTENT_TOPIC_ID, ErrorCode.OFFSET_OUT_OF_RANGE,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED})
_REJECTED_ERRORS = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})


class BrokerTopicStats:
    """Per-topic meters as cumulative counts: ``topics[topic]`` is a list indexed as
    ``TOPIC_METERS``. The all-topics series is their sum (at scrape time)."""

    def __init__(self) -> None:
        self.topics: dict[str, list[int]] = {}

    def _of(self, topic: str) -> list[int]:
        counts = self.topics.get(topic)
        if counts is None:
            counts = self.topics[topic] = [0] * len(TOPIC_METERS)
        return counts

    def produced(self, topic: str, error: ErrorCode, nbytes: int, messages: int) -> None:
        """One partition's append of a Produce: ``messages`` records in ``nbytes`` when it
        succeeded."""
        c = self._of(topic)
        c[_TOTAL_P] += 1
        if error == ErrorCode.NONE:
            c[_IN] += nbytes
            c[_MSGS] += messages
        elif error in _REJECTED_ERRORS:
            c[_REJECTED] += nbytes
        if error not in _EXPECTED_PRODUCE_ERRORS:
            c[_FAILED_P] += 1

    def fetched(self, topic: str, error: ErrorCode) -> None:
        """One partition's read of a Fetch (consumers and followers)."""
        c = self._of(topic)
        c[_TOTAL_F] += 1
        if error not in _EXPECTED_FETCH_ERRORS:
            c[_FAILED_F] += 1

    def sent(self, topic: str, nbytes: int) -> None:
        """Record bytes answered to a consumer (a follower's count as replication in Kafka)."""
        self._of(topic)[_OUT] += nbytes

    def forget(self, topic: str) -> None:
        """A deleted topic's series go (Kafka removes its BrokerTopicMetrics)."""
        self.topics.pop(topic, None)

    def snapshot(self) -> dict[str, list[int]]:
        return {t: list(c) for t, c in list(self.topics.items())}


def kafka_api_name(api_key: ApiKey) -> str:
    """Kafka's ``ApiKeys.name``: ``PRODUCE`` -> ``Produce``, ``API_VERSIONS`` -> ``ApiVersions``."""
    return "".join(w.capitalize() for w in api_key.name.split("_"))


# RequestMetrics' time histograms, exported as summaries (count and sum): (name, help)
REQUEST_TIMES = (
    ("TotalTimeMs", "From the request's last byte received to its response handed to the socket."),
    ("RequestQueueTimeMs", "From the request's last byte received to its handling starting "
     "(waiting behind the connection's earlier requests)."),
    ("LocalTimeMs", "Handling on the event loop, the purgatory wait excluded."),
    ("RemoteTimeMs", "Parked in a purgatory: a Fetch's long poll, an acks=all Produce "
     "waiting for its followers."),
    ("ResponseSendTimeMs", "Encoding the response and handing it to the socket's transport."),
)
_TOTAL, _QUEUE, _LOCAL, _REMOTE, _SEND = range(len(REQUEST_TIMES))


class RequestStats:
    """Per API: requests by version, errors by code, and the time sums of ``REQUEST_TIMES``.
    Fetch is split, as Kafka's RequestMetrics, into FetchConsumer and FetchFollower."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.errors: dict[tuple[str, int], int] = defaultdict(int)
        # name -> [count, total ns, queue ns, local ns, remote ns, send ns]
        self.times: dict[str, list[int]] = {}

    @staticmethod
    def metric_name(api_key: int, body: Any) -> str:
        if api_key == ApiKey.FETCH:
            replica_id = getattr(body, "replica_id", -1)
            state = getattr(body, "replica_state", None)
            if state is not None and replica_id < 0:
                replica_id = state.replica_id
            return "FetchFollower" if replica_id >= 0 else "FetchConsumer"
        return _API_NAMES.get(api_key) or kafka_api_name(ApiKey(api_key))

    def record(self, request: Any, response: Any, received_ns: int, started_ns: int,
               handled_ns: int, sent_ns: int, remote_ns: int) -> None:
        name = self.metric_name(request.api_key, request.body)
        self.requests[(name, request.api_version)] += 1
        errors = self.errors
        for code in response_errors(request.api_key, response):
            errors[(name, code)] += 1
        t = self.times.get(name)
        if t is None:
            t = self.times[name] = [0] * (len(REQUEST_TIMES) + 1)
        t[0] += 1
        t[1 + _TOTAL] += sent_ns - received_ns
        t[1 + _QUEUE] += started_ns - received_ns
        t[1 + _LOCAL] += handled_ns - started_ns - remote_ns
        t[1 + _REMOTE] += remote_ns
        t[1 + _SEND] += sent_ns - handled_ns

    def snapshot(self) -> tuple[dict, dict, dict]:
        return dict(self.requests), dict(self.errors), {n: list(t) for n, t in
                                                        list(self.times.items())}


_API_NAMES = {int(k): kafka_api_name(k) for k in ApiKey}


def response_errors(api_key: int, response: Any) -> list[int]:
    """The error codes Kafka's ``errorCounts`` would count for ``response``: each partition's of
    a Produce or Fetch (and a Fetch's top-level session error), the top-level ``error_code``
    of any other API (its nested per-resource errors are not walked). No response (acks=0):
    nothing."""
    if response is None:
        return []
    if api_key == ApiKey.PRODUCE:
        return [p.error_code for t in response.responses for p in t.partition_responses]
    if api_key == ApiKey.FETCH:
        codes = [p.error_code for t in response.responses for p in t.partitions]
        top = getattr(response, "error_code", 0)
        if top or not codes:
            codes.append(top)
        return codes
    code = getattr(response, "error_code", None)
    return [code] if isinstance(code, int) else []


class EventLoopIdle:
    """The event loop's idle fraction: 1 − the loop thread's CPU time over wall time since the
    previous scrape (its thread CPU clock, read from the scraping thread; nothing runs on the
    loop for it). Strata's counterpart of Kafka's NetworkProcessorAvgIdlePercent: one loop does
    the work of Kafka's network and request handler threads. A thread waiting for the GIL counts
    as idle here."""

    def __init__(self) -> None:
        self._clock: int | None = None
        self._lock = threading.Lock()
        self._last = (0, 0)

    def install(self) -> bool:
        """Called on the event loop's thread (a loop running in it): from now on that thread's
        CPU clock is read. False (nothing measured) off a loop or without thread clocks."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        try:
            clock = time.pthread_getcpuclockid(threading.get_ident())
            cpu = time.clock_gettime_ns(clock)
        except (AttributeError, OSError):   # not on this platform
            return False
        self._clock = clock
        self._last = (time.monotonic_ns(), cpu)
        return True

    def idle_fraction_since_last(self) -> float | None:
        """Idle over the time since the previous call (the previous scrape), in [0, 1]; None
        when not installed or the loop's thread is gone."""
        if self._clock is None:
            return None
        try:
            cpu = time.clock_gettime_ns(self._clock)
        except OSError:
            return None
        now = time.monotonic_ns()
        with self._lock:
            last_now, last_cpu = self._last
            self._last = (now, cpu)
        elapsed = now - last_now
        if elapsed <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - (cpu - last_cpu) / elapsed))
