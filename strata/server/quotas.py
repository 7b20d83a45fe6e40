"""Client quotas, enforced as Kafka's ``ClientQuotaManager`` family does (KIP-13, KIP-55, KIP-124,
KIP-219, KIP-599).

Which quota applies to a request of (user, client id): Kafka's ``DefaultQuotaCallback``. For
each quota type separately (only the entities that set its key count), the request belongs to a
*quota entity* named by its metric tags (user, client-id), the first of these that is set::

    1. /config/users/<user>/clients/<client-id>    tags (user, client-id)
    2. /config/users/<user>/clients/<default>      tags (user, client-id)
    3. /config/users/<user>                        tags (user, "")
    4. /config/users/<default>/clients/<client-id> tags (user, client-id)
    5. /config/users/<default>/clients/<default>   tags (user, client-id)
    6. /config/users/<default>                     tags (user, "")
    7. /config/clients/<client-id>                 tags ("", client-id)
    8. /config/clients/<default>                   tags ("", client-id)

so a user quota is shared by all that user's clients, and a ``<default>`` client quota is a
separate budget per client id. The user is the connection's authenticated principal's name
(SASL or a TLS client certificate), ``ANONYMOUS`` without authentication.

Per quota entity and type, a sensor measures Kafka's ``Rate`` over ``quota.window.num``
windows of ``quota.window.size.seconds`` (11 × 1 s): Produce the request bytes, Fetch the
response bytes, Request the handler's time in percent of one thread (nanoseconds × 100 / 1e9
per second). When the measured rate exceeds the bound, the throttle time is Kafka's
``(rate − bound) / bound × window``; the response carries it (``throttle_time_ms``) and leaves
at once, then the connection is muted for that long (``ConnectionInfo.throttle_ms``). A
throttled Fetch answers no data and un-records its bytes; a Fetch's ``max_bytes`` is capped
at what the window admits. ``controller_mutation_rate`` is a token bucket of the partitions
that CreateTopics, CreatePartitions and DeleteTopics create or delete: from CreateTopics v6,
CreatePartitions v3 and DeleteTopics v5 it is strict (a topic asked for while the bucket is
below zero fails with THROTTLING_QUOTA_EXCEEDED), before that it only throttles.

With no quota of a type configured nothing of that type is measured (Kafka's
``quotasEnabled``). Time is the injected clock's (``milliseconds()`` as a monotonic count here).
Threads: the event loop and the admin handlers' worker threads; sensors are thread-safe.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Any, Generator, TypeVar

from strata.cluster.client_quotas import (
    CLIENT_ID, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE, USER, Snapshot)
from strata.common.clock import SYSTEM_CLOCK, Clock
from strata.common.errors import ErrorCode, KafkaError
from strata.common.rate import Rate, SampledAvgMax, throttle_time_ms
from strata.protocol.codec import ApiKey, DecodedRequest, make, response_class

T = TypeVar("T")

ANONYMOUS = "ANONYMOUS"
INACTIVE_SENSOR_EXPIRATION_MS = 3_600_000   # Kafka's InactiveSensorExpirationTimeSeconds
THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."

# The first version of each controller mutation API whose quota is strict (KIP-599).
STRICT_SINCE = {ApiKey.CREATE_TOPICS: 6, ApiKey.CREATE_PARTITIONS: 3, ApiKey.DELETE_TOPICS: 5}


class QuotaType(Enum):
    """Kafka's ``QuotaType``: the metric group and the quota key of each."""
    PRODUCE = ("Produce", PRODUCER_BYTE_RATE)
    FETCH = ("Fetch", CONSUMER_BYTE_RATE)
    REQUEST = ("Request", REQUEST_PERCENTAGE)
    CONTROLLER_MUTATION = ("ControllerMutation", CONTROLLER_MUTATION_RATE)

    @property
    def group(self) -> str:
        return self.value[0]

    @property
    def key(self) -> str:
        return self.value[1]


Tags = tuple[str, str]   # (user, client-id) metric tags; "" where the quota entity has none


def _metric_tags(entities: Mapping[tuple, float], user: str, client_id: str) -> Tags:
    """Kafka's ``DefaultQuotaCallback.quotaMetricTags`` over the entities of one quota type."""
    has_user = has_client = has_both = False
    for entity in entities:
        types = {t for t, _ in entity}
        has_both |= types == {USER, CLIENT_ID}
        has_user |= types == {USER}
        has_client |= types == {CLIENT_ID}
    if not (has_user or has_both):
        return "", client_id
    if not (has_client or has_both):
        return user, ""
    if not (has_user or has_client):
        return user, client_id
    for entity, tags in (
            (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),
            (((CLIENT_ID, None), (USER, user)), (user, client_id)),
            (((USER, user),), (user, "")),
            (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),
            (((CLIENT_ID, None), (USER, None)), (user, client_id)),
            (((USER, None),), (user, ""))):
        if entity in entities:
            return tags
    return "", client_id


def _quota_limit(entities: Mapping[tuple, float], tags: Tags) -> float | None:
    """Kafka's ``DefaultQuotaCallback.quotaLimit``: the bound of a quota entity, if any."""
    user, client_id = tags
    if user and client_id:
        lookups = [((CLIENT_ID, client_id), (USER, user)), ((CLIENT_ID, None), (USER, user)),
                   ((CLIENT_ID, client_id), (USER, None)), ((CLIENT_ID, None), (USER, None))]
    elif user:
        lookups = [((USER, user),), ((USER, None),)]
    elif client_id:
        lookups = [((CLIENT_ID, client_id),), ((CLIENT_ID, None),)]
    else:
        return None
    for entity in lookups:
        if entity in entities:
            return entities[entity]
    return None


class TokenBucketStat:
    """Kafka's ``TokenBucket`` stat: ``tokens`` refill at ``quota`` per second up to a burst of
    ``samples × window × quota``; a record takes its value (the balance may go negative).
    Starts full. Thread-safe."""

    def __init__(self, samples: int, window_ms: int, now_ms: int) -> None:
        self._burst_s = samples * window_ms / 1000.0
        self._tokens: float | None = None      # None: full at the next use
        self._last_ms = now_ms
        self._lock = threading.Lock()

    def _refill(self, quota: float, now_ms: int) -> None:
        burst = self._burst_s * quota
        if self._tokens is None:
            self._tokens = burst
        else:
            self._tokens = min(burst, self._tokens + quota * (now_ms - self._last_ms) / 1000.0)
        self._last_ms = now_ms

    def record(self, value: float, quota: float, now_ms: int) -> None:
        with self._lock:
            self._refill(quota, now_ms)
            self._tokens = min(self._burst_s * quota, self._tokens - value)

    def tokens(self, quota: float, now_ms: int) -> float:
        with self._lock:
            self._refill(quota, now_ms)
            return self._tokens


class _Sensors:
    """The sensors of one quota entity and type: the quota sensor and the throttle-time one."""

    __slots__ = ("rate", "tokens", "throttle", "last_ms")

    def __init__(self, quota_type: QuotaType, samples: int, window_ms: int, now_ms: int) -> None:
        self.rate = Rate(samples, window_ms)   # byte-rate, request-time or mutation-rate
        self.tokens = (TokenBucketStat(samples, window_ms, now_ms)
                       if quota_type is QuotaType.CONTROLLER_MUTATION else None)
        self.throttle = SampledAvgMax()        # throttle-time (Kafka's default 2 × 30 s)
        self.last_ms = now_ms


class ControllerMutationQuota:
    """One request's controller mutation quota (Kafka's Strict/Permissive
    ``ControllerMutationQuota``): ``check()`` before a mutation, ``record(partitions)`` after."""

    def __init__(self, manager: "ClientQuotaManager | None" = None, tags: Tags = ("", ""),
                 strict: bool = False) -> None:
        self._manager = manager
        self._tags = tags
        self._strict = strict
        self._throttle_ms = 0
        self._throttled_at_ms = 0

    def _violation_ms(self, now_ms: int) -> int:
        """Kafka's ``throttleTimeMs``: −tokens / quota, in ms, when the bucket is below zero."""
        m = self._manager
        quota = m.quota_limit(QuotaType.CONTROLLER_MUTATION, self._tags)
        if quota is None:
            return 0
        tokens = m.sensors(QuotaType.CONTROLLER_MUTATION, self._tags).tokens.tokens(quota, now_ms)
        return int(math.floor(-tokens / quota * 1000 + 0.5)) if tokens < 0 else 0

    def check(self) -> None:
        """Strict: raise THROTTLING_QUOTA_EXCEEDED while the bucket is below zero."""
        if self._manager is None or not self._strict:
            return
        now = self._manager.now_ms()
        throttle = self._violation_ms(now)
        if throttle > 0:
            self._throttle_ms, self._throttled_at_ms = throttle, now
            raise KafkaError(THROTTLING_QUOTA_EXCEEDED_MESSAGE,
                             code=ErrorCode.THROTTLING_QUOTA_EXCEEDED)

    def record(self, partitions: int) -> None:
        m = self._manager
        if m is None or partitions <= 0:
            return
        now = m.now_ms()
        quota = m.quota_limit(QuotaType.CONTROLLER_MUTATION, self._tags)
        sensors = m.sensors(QuotaType.CONTROLLER_MUTATION, self._tags)
        sensors.rate.record(partitions, now)
        if quota is None:
            return
        sensors.tokens.record(partitions, quota, now)
        if not self._strict:
            throttle = self._violation_ms(now)
            if throttle > 0:
                self._throttle_ms, self._throttled_at_ms = throttle, now

    def apply(self, mutate: Callable[[], T], partitions: Callable[[T], int]) -> T:
        """``check()``, ``mutate()``, then ``record`` the partitions it created or deleted."""
        self.check()
        result = mutate()
        self.record(partitions(result))
        return result

    def throttle_time_ms(self) -> int:
        """What is left of the last violation's throttle time."""
        if self._throttle_ms <= 0 or self._manager is None:
            return 0
        return max(0, self._throttle_ms - (self._manager.now_ms() - self._throttled_at_ms))


UNBOUNDED_MUTATION_QUOTA = ControllerMutationQuota()
_MUTATION_QUOTA: contextvars.ContextVar[ControllerMutationQuota] = contextvars.ContextVar(
    "strata_mutation_quota", default=UNBOUNDED_MUTATION_QUOTA)


def mutation_quota() -> ControllerMutationQuota:
    """The controller mutation quota of the request being handled (unbounded outside one)."""
    return _MUTATION_QUOTA.get()


class ClientQuotaManager:
    """The broker's client quotas: configs from a ``ClientQuotaStore`` (``on_quotas_changed``),
    one sensor set per (quota type, quota entity), and the per-request enforcement
    (``enforce``) the dispatcher runs every handler through."""

    def __init__(self, *, window_num: int = 11, window_size_s: int = 1,
                 controller_window_num: int = 11, controller_window_size_s: int = 1,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._windows = {t: (window_num, window_size_s * 1000) for t in QuotaType}
        self._windows[QuotaType.CONTROLLER_MUTATION] = (controller_window_num,
                                                       controller_window_size_s * 1000)
        self._clock = clock
        self._by_type: dict[QuotaType, dict[tuple, float]] = {t: {} for t in QuotaType}
        self.any_enabled = False   # any quota configured: the Dispatcher calls enforce()
        self._sensors: dict[tuple[QuotaType, Tags], _Sensors] = {}
        self._throttled_until: dict[QuotaType, list[int]] = {t: [] for t in QuotaType}
        self._lock = threading.Lock()

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "ClientQuotaManager":
        """Kafka's broker configs ``quota.window.num``, ``quota.window.size.seconds`` and their
        ``controller.`` counterparts (default 11 windows of 1 s)."""
        def window(key: str, default: int) -> int:
            value = int(props.get(key, default))
            if value < 1:
                raise ValueError(f"{key} must be at least 1, got {value}")
            return value
        return cls(window_num=window("quota.window.num", 11),
                   window_size_s=window("quota.window.size.seconds", 1),
                   controller_window_num=window("controller.quota.window.num", 11),
                   controller_window_size_s=window("controller.quota.window.size.seconds", 1))

    def now_ms(self) -> int:
        return self._clock.milliseconds()

    # ---- configuration ---------------------------------------------------------------------

    def on_quotas_changed(self, snapshot: Snapshot) -> None:
        """A ``ClientQuotaStore`` listener: take the new configs (ip quotas are not enforced)."""
        by_type: dict[QuotaType, dict[tuple, float]] = {t: {} for t in QuotaType}
        for entity, values in snapshot.items():
            for quota_type in QuotaType:
                if quota_type.key in values:
                    by_type[quota_type][entity] = values[quota_type.key]
        self._by_type = by_type
        self.any_enabled = any(by_type.values())

    def enabled(self, quota_type: QuotaType) -> bool:
        return bool(self._by_type[quota_type])

    def metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Tags:
        return _metric_tags(self._by_type[quota_type], user, client_id)

    def quota_limit(self, quota_type: QuotaType, tags: Tags) -> float | None:
        return _quota_limit(self._by_type[quota_type], tags)

    def quota(self, quota_type: QuotaType, user: str, client_id: str) -> float | None:
        """The bound that applies to (user, client id), None when unlimited."""
        return self.quota_limit(quota_type, self.metric_tags(quota_type, user, client_id))

    # ---- sensors ---------------------------------------------------------------------------

    def sensors(self, quota_type: QuotaType, tags: Tags) -> _Sensors:
        now = self.now_ms()
        key = (quota_type, tags)
        s = self._sensors.get(key)
        if s is None:
            with self._lock:
                s = self._sensors.get(key)
                if s is None:
                    self._expire(now)
                    samples, window_ms = self._windows[quota_type]
                    s = self._sensors[key] = _Sensors(quota_type, samples, window_ms, now)
        s.last_ms = now
        return s

    def _expire(self, now: int) -> None:
        """Drop the sensors unused for an hour, as Kafka's sensors expire (lock held)."""
        for key in [k for k, s in self._sensors.items()
                    if now - s.last_ms >= INACTIVE_SENSOR_EXPIRATION_MS]:
            del self._sensors[key]

    def record(self, quota_type: QuotaType, user: str, client_id: str, value: float) -> int:
        """Kafka's ``maybeRecordAndGetThrottleTimeMs``: record ``value`` and return the
        throttle time in ms (0 within the quota, or with no quota of this type)."""
        if not self.enabled(quota_type):
            return 0
        tags = self.metric_tags(quota_type, user, client_id)
        rate = self.sensors(quota_type, tags).rate
        now = self.now_ms()
        rate.record(value, now)
        bound = self.quota_limit(quota_type, tags)
        if bound is None:
            return 0
        return throttle_time_ms(rate.measure(now), bound, rate.window_size_ms(now))

    def unrecord(self, quota_type: QuotaType, user: str, client_id: str, value: float) -> None:
        if self.enabled(quota_type):
            tags = self.metric_tags(quota_type, user, client_id)
            self.sensors(quota_type, tags).rate.record(-value, self.now_ms())

    def max_value_in_window(self, quota_type: QuotaType, user: str, client_id: str) -> float:
        """Kafka's ``getMaxValueInQuotaWindow``: bound × (samples − 1) × window seconds."""
        bound = self.quota(quota_type, user, client_id) if self.enabled(quota_type) else None
        if bound is None:
            return math.inf
        samples, window_ms = self._windows[quota_type]
        return bound * (samples - 1) * window_ms / 1000.0

    def throttle(self, quota_type: QuotaType, user: str, client_id: str, throttle_ms: int) -> None:
        """Record a throttle (the throttle-time sensor and the delay queue's size)."""
        now = self.now_ms()
        tags = self.metric_tags(quota_type, user, client_id)
        self.sensors(quota_type, tags).throttle.record(throttle_ms, now)
        with self._lock:
            queue = self._throttled_until[quota_type]
            queue[:] = [t for t in queue if t > now]
            queue.append(now + throttle_ms)

    def new_mutation_quota(self, user: str, client_id: str, strict: bool) -> ControllerMutationQuota:
        if not self.enabled(QuotaType.CONTROLLER_MUTATION):
            return UNBOUNDED_MUTATION_QUOTA
        tags = self.metric_tags(QuotaType.CONTROLLER_MUTATION, user, client_id)
        return ControllerMutationQuota(self, tags, strict)

    # ---- metrics ---------------------------------------------------------------------------

    def metrics(self) -> list[tuple[str, str, Tags, float]]:
        """(group, attribute, tags, value) of every live sensor, as Kafka names them:
        ``byte-rate`` (Produce, Fetch), ``request-time`` (Request), ``mutation-rate`` and
        ``tokens`` (ControllerMutation), ``throttle-time`` (each); ``queue-size`` per group
        with empty tags."""
        now = self.now_ms()
        with self._lock:
            self._expire(now)
            sensors = list(self._sensors.items())
            queues = {t: sum(1 for u in q if u > now) for t, q in self._throttled_until.items()}
        out = []
        for (quota_type, tags), s in sorted(sensors, key=lambda kv: (kv[0][0].group, kv[0][1])):
            name = {QuotaType.REQUEST: "request-time",
                    QuotaType.CONTROLLER_MUTATION: "mutation-rate"}.get(quota_type, "byte-rate")
            out.append((quota_type.group, name, tags, s.rate.measure(now)))
            if s.tokens is not None:
                quota = self.quota_limit(quota_type, tags)
                out.append((quota_type.group, "tokens", tags,
                            s.tokens.tokens(quota, now) if quota is not None else float(2**63 - 1)))
            out.append((quota_type.group, "throttle-time", tags, s.throttle.avg(now)))
        for quota_type, size in queues.items():
            out.append((quota_type.group, "queue-size", ("", ""), float(size)))
        return out

    # ---- enforcement -----------------------------------------------------------------------

    async def enforce(self, request: DecodedRequest, conn: Any,
                      call: Callable[[DecodedRequest], Awaitable[Any]]) -> Any:
        """Run ``call(request)`` (the handler) under the quotas of the request's client, as
        KafkaApis does: record, compute the throttle time, put it in the response and ask the
        connection to mute itself for it (``conn.throttle_ms``)."""
        # the authenticated user's name (Kafka's sanitized principal name), ANONYMOUS without
        principal = getattr(conn, "principal", None)
        user, client_id = (principal.name if principal is not None else ANONYMOUS,
                           request.client_id or "")
        api = request.api_key
        if api == ApiKey.FETCH and request.body.replica_id >= 0:
            return await call(request)   # followers are exempt, as in Kafka (KIP-73 throttles them)
        if api == ApiKey.FETCH and self.enabled(QuotaType.FETCH):
            window_bytes = self.max_value_in_window(QuotaType.FETCH, user, client_id)
            body = request.body
            if window_bytes < body.max_bytes:
                cap = max(int(window_bytes), 1)
                request = dataclasses.replace(request, body=dataclasses.replace(
                    body, max_bytes=cap, min_bytes=min(body.min_bytes, cap)))
        mutation = UNBOUNDED_MUTATION_QUOTA
        token = None
        if api in STRICT_SINCE:
            mutation = self.new_mutation_quota(user, client_id,
                                               request.api_version >= STRICT_SINCE[api])
            token = _MUTATION_QUOTA.set(mutation)
        timed = _Timed(call(request)) if self.enabled(QuotaType.REQUEST) else None
        try:
            body = await (timed if timed is not None else call(request))
        finally:
            if token is not None:
                _MUTATION_QUOTA.reset(token)
        acks0 = api == ApiKey.PRODUCE and request.body.acks == 0
        request_ms = 0
        if timed is not None and not acks0:
            request_ms = self.record(QuotaType.REQUEST, user, client_id, timed.ns * 100 / 1e9)
        other_type, other_ms = None, 0
        if api == ApiKey.PRODUCE:
            other_type = QuotaType.PRODUCE
            other_ms = self.record(other_type, user, client_id, getattr(conn, "request_size", 0))
        elif api == ApiKey.FETCH and body is not None:
            other_type = QuotaType.FETCH
            size = _fetch_response_bytes(body) if self.enabled(other_type) else 0
            other_ms = self.record(other_type, user, client_id, size)
            if max(other_ms, request_ms) > 0:
                # a throttled Fetch answers no data, so its bytes do not count; its fetch
                # session goes on (Kafka's getThrottledResponse)
                self.unrecord(other_type, user, client_id, size)
                body = make(response_class(api, request.api_version),
                            session_id=getattr(body, "session_id", 0), responses=())
        elif api in STRICT_SINCE:
            other_type, other_ms = QuotaType.CONTROLLER_MUTATION, mutation.throttle_time_ms()
        throttle = max(request_ms, other_ms)
        if throttle <= 0:
            return body
        self.throttle(other_type if other_ms > request_ms else QuotaType.REQUEST,
                      user, client_id, throttle)
        conn.throttle_ms = throttle
        if body is not None and "throttle_time" in body.__dataclass_fields__:
            body = dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=throttle))
        return body


def _fetch_response_bytes(body: Any) -> int:
    """The record bytes of a Fetch response (Kafka counts the whole response's size)."""
    return sum(len(p.records or b"") for t in body.responses for p in t.partitions)


class _Timed:
    """Awaits a coroutine and adds up the time it runs (``ns``), not the time it waits: the
    handler's own time, which the request quota measures as Kafka measures a request's time
    on its handler thread."""

    __slots__ = ("_coro", "ns")

    def __init__(self, coro) -> None:
        self._coro = coro
        self.ns = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, send, error = self._coro, None, None
        while True:
            start = time.perf_counter_ns()
            try:
                step = coro.throw(error) if error is not None else coro.send(send)
            except StopIteration as done:
                self.ns += time.perf_counter_ns() - start
                return done.value
            except BaseException:
                self.ns += time.perf_counter_ns() - start
                raise
            self.ns += time.perf_counter_ns() - start
            try:
                send, error = (yield step), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - passed on to the coroutine
                send, error = None, exc
