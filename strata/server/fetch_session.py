"""Incremental fetch sessions (KIP-227) as Kafka's brokers serve them (``FetchSession.scala``).

A Fetch v7+ names a session id and epoch (Kafka's ``FetchMetadata``):

- id 0, epoch -1 (and every Fetch before v7): a *sessionless* full fetch, answered with every
  partition asked and session id 0;
- epoch 0: a *full* fetch that closes the session it names (if any) and asks for a new one: it
  is answered with every partition asked and the new session's id, or 0 when the cache has no
  room for it (``max.incremental.fetch.session.cache.slots``); the session starts at epoch 1;
- epoch -1 with an id: closes that session, then a sessionless full fetch;
- any other epoch: an *incremental* fetch of session ``id``, valid only at the session's next
  epoch (else INVALID_FETCH_SESSION_EPOCH; an unknown id FETCH_SESSION_ID_NOT_FOUND; a Fetch
  v13+ in a session made before v13 or the other way round FETCH_SESSION_TOPIC_ID_ERROR). Its
  partitions are added to or updated in the session, its ``forgotten_topics_data`` leave it,
  and the fetch reads every partition of the session. The answer names only the partitions
  with something new: records, a high watermark, log start offset or last stable offset other
  than the last one answered, a preferred read replica, a diverging epoch or an error (an
  error or a diverging epoch also forgets the high watermark answered, so the partition is
  answered again, with its high watermark, once the follower has recovered or truncated). A
  session left empty is closed and that fetch answered sessionless. Partitions answered with
  records move to the end of the session, so the next fetch reads the others first (the
  response's ``max_bytes`` is shared in session order).

Kafka compares the high watermark, log start offset, preferred replica, error and diverging
epoch; the last stable offset is compared here too (answering a partition more often is always
safe: a client takes every partition answered).

The cache holds at most ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's
default 1000; 0 disables sessions: every full fetch is answered sessionless). A new session
that finds the cache full may evict, as Kafka's ``FetchSessionCache.tryEvict``: the least
recently used session if it was unused for more than ``min.incremental.fetch.session.eviction.ms``
(Kafka's fixed 120000, a property here); else the least valuable session by (privileged,
partitions, id) if the newcomer is worth at least as much, where sessions of followers
(``replica_id`` >= 0) are privileged, a consumer's session can be evicted by a follower's at
any time and by a consumer's only once it is older than the eviction time, and a follower's
session only once it is older than that. Recent Kafka splits the cache in 8 shards (each with
an eighth of the slots, evicting within itself) to spread lock contention; this cache is one.

Used from the event loop; the cache's lock makes it safe from other threads too.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition

__all__ = [
    "CACHE_SLOTS_PROP", "EVICTION_MS_PROP", "FINAL_EPOCH", "INITIAL_EPOCH", "INVALID_SESSION_ID",
    "FetchContext", "FetchMetadata", "FetchSession", "FetchSessionCache", "FullFetchContext",
    "IncrementalFetchContext", "PartitionData", "SessionErrorContext", "SessionlessFetchContext",
    "next_epoch",
]

log = logging.getLogger(__name__)

INVALID_SESSION_ID = 0     # no session
INITIAL_EPOCH = 0          # a full fetch that creates a session
FINAL_EPOCH = -1           # a full fetch that creates none (closes the one it names)
MAX_EPOCH = 2**31 - 1
FIRST_VERSION_WITH_SESSIONS = 7
FIRST_VERSION_WITH_TOPIC_IDS = 13

CACHE_SLOTS_PROP = "max.incremental.fetch.session.cache.slots"
EVICTION_MS_PROP = "min.incremental.fetch.session.eviction.ms"
DEFAULT_CACHE_SLOTS = 1000
DEFAULT_EVICTION_MS = 120_000


def next_epoch(epoch: int) -> int:
    """Kafka's ``FetchMetadata.nextEpoch``: -1 stays -1, the largest epoch wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


class FetchMetadata(NamedTuple):
    session_id: int = INVALID_SESSION_ID
    epoch: int = FINAL_EPOCH

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


SESSIONLESS = FetchMetadata(INVALID_SESSION_ID, FINAL_EPOCH)


class PartitionData(NamedTuple):
    """What a Fetch asks of one partition (the fields a session remembers)."""

    fetch_offset: int
    log_start_offset: int = -1
    max_bytes: int = 0
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1


def records_size(records: Any) -> int:
    return len(records) if records else 0


def _forgets_high_watermark(resp: Any) -> bool:
    """An error or a diverging epoch (KIP-320): always answered, and the high watermark is
    remembered as unknown (-1), so the next answer after it carries the high watermark again.

    Kafka does this for errors in incremental answers; its error answers carry a high
    watermark of -1 anyway, so a full fetch's session also starts with -1 for them. Strata's
    error answers carry the real high watermark, and a follower takes no high watermark from
    an error or a diverging epoch (it truncates, then fetches again): remembering it would
    leave the next answer out and the follower without the high watermark until it moves."""
    return resp.error != ErrorCode.NONE or resp.diverging_epoch is not None


class CachedPartition:
    """One partition of a session: the request's fields it was last sent with, and what was
    last answered for it (high watermark, log start offset, last stable offset)."""

    __slots__ = ("data", "high_watermark", "log_start_offset", "last_stable_offset")

    def __init__(self, data: PartitionData, high_watermark: int = -1, log_start_offset: int = -1,
                 last_stable_offset: int = -1):
        self.data = data
        self.high_watermark = high_watermark
        self.log_start_offset = log_start_offset
        self.last_stable_offset = last_stable_offset

    def must_respond(self, resp: Any, update: bool = True) -> bool:
        """Kafka's ``maybeUpdateResponseData``: whether ``resp`` (a partition's answer, with
        ``records``, ``high_watermark``, ``log_start_offset``, ``last_stable_offset``,
        ``preferred_read_replica``, ``error`` and ``diverging_epoch``) must be sent; with
        ``update``, what it answers becomes what was last answered."""
        respond = records_size(resp.records) > 0
        if self.high_watermark != resp.high_watermark:
            respond = True
            if update:
                self.high_watermark = resp.high_watermark
        if self.log_start_offset != resp.log_start_offset:
            respond = True
            if update:
                self.log_start_offset = resp.log_start_offset
        if self.last_stable_offset != resp.last_stable_offset:
            respond = True
            if update:
                self.last_stable_offset = resp.last_stable_offset
        if resp.preferred_read_replica >= 0:
            respond = True
        if _forgets_high_watermark(resp):
            respond = True
            if update:
                self.high_watermark = -1
        return respond

    def __repr__(self) -> str:
        return (f"CachedPartition({self.data}, hw={self.high_watermark}, "
                f"log_start={self.log_start_offset}, lso={self.last_stable_offset})")


class FetchSession:
    """One session: its partitions in fetch order and the epoch its next request must carry."""

    def __init__(self, session_id: int, privileged: bool,
                 partitions: dict[TopicPartition, CachedPartition], uses_topic_ids: bool,
                 now_ms: int):
        self.id = session_id
        self.privileged = privileged
        self.partitions = partitions
        self.uses_topic_ids = uses_topic_ids
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)
        # the cache's bookkeeping, as of the last touch (Kafka's cachedSize and the trees)
        self.cached_size = -1
        self.evictable_by_all = False
        self.evictable_by_privileged = False

    def update(self, fetch_data: Mapping[TopicPartition, PartitionData],
               to_forget: Iterable[TopicPartition]) -> tuple[list, list, list]:
        """An incremental request's changes: (added, updated, removed) partitions. New
        partitions go to the end; updated ones keep their place."""
        added, updated, removed = [], [], []
        for tp, data in fetch_data.items():
            cached = self.partitions.get(tp)
            if cached is None:
                self.partitions[tp] = CachedPartition(data)
                added.append(tp)
            else:
                cached.data = data
                updated.append(tp)
        for tp in to_forget:
            if self.partitions.pop(tp, None) is not None:
                removed.append(tp)
        return added, updated, removed

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)

    def __repr__(self) -> str:
        return (f"FetchSession(id={self.id}, privileged={self.privileged}, "
                f"partitions={len(self.partitions)}, epoch={self.epoch}, "
                f"created={self.creation_ms}, last_used={self.last_used_ms})")


# ---- contexts: what one Fetch reads and how it is answered ------------------------------------


class FetchContext:
    """``partitions``: what the Fetch reads, in order; ``respond(results)`` turns the answers
    read for them into (top-level error, session id, answers to send)."""

    error: ErrorCode = ErrorCode.NONE
    partitions: Sequence[tuple[TopicPartition, PartitionData]] = ()

    def respond(self, results: list[tuple[TopicPartition, Any]]
                ) -> tuple[ErrorCode, int, list[tuple[TopicPartition, Any]]]:
        raise NotImplementedError


class SessionErrorContext(FetchContext):
    """A session error: nothing is read; the answer is the error, no partitions, session 0."""

    def __init__(self, error: ErrorCode):
        self.error = error
        self.partitions = ()

    def respond(self, results):
        return self.error, INVALID_SESSION_ID, []


class SessionlessFetchContext(FetchContext):
    """Every partition asked, every one answered; no session."""

    def __init__(self, partitions: Sequence[tuple[TopicPartition, PartitionData]]):
        self.partitions = partitions

    def respond(self, results):
        return ErrorCode.NONE, INVALID_SESSION_ID, list(results)


class FullFetchContext(FetchContext):
    """Every partition asked, every one answered; a new session holds them if the cache has
    room (what is answered now is what its first incremental fetch compares with)."""

    def __init__(self, cache: "FetchSessionCache", fetch_data: dict[TopicPartition, PartitionData],
                 privileged: bool, uses_topic_ids: bool):
        self.cache = cache
        self.fetch_data = fetch_data
        self.partitions = list(fetch_data.items())
        self.privileged = privileged
        self.uses_topic_ids = uses_topic_ids

    def respond(self, results):
        def cached() -> dict[TopicPartition, CachedPartition]:
            out = {}
            for tp, r in results:
                hw = -1 if _forgets_high_watermark(r) else r.high_watermark
                out[tp] = CachedPartition(self.fetch_data[tp], hw, r.log_start_offset,
                                          r.last_stable_offset)
            return out
        session_id = self.cache.maybe_create_session(self.privileged, len(results),
                                                     self.uses_topic_ids, cached)
        return ErrorCode.NONE, session_id, list(results)


class IncrementalFetchContext(FetchContext):
    """Every partition of the session is read; only those with something new are answered."""

    def __init__(self, cache: "FetchSessionCache", session: FetchSession, request_epoch: int):
        self.cache = cache
        self.session = session
        self.request_epoch = request_epoch
        self.partitions = [(tp, c.data) for tp, c in session.partitions.items()]

    def respond(self, results):
        session = self.session
        with self.cache.lock:
            if session.epoch != next_epoch(self.request_epoch):
                # another request of this session was served meanwhile (a duplicate)
                return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, []
            out = []
            for tp, r in results:
                cached = session.partitions.get(tp)
                if cached is None:       # left the session meanwhile: answered anyway
                    out.append((tp, r))
                    continue
                if cached.must_respond(r):
                    out.append((tp, r))
                    if records_size(r.records) > 0:   # the others go first next time
                        session.partitions[tp] = session.partitions.pop(tp)
            return ErrorCode.NONE, session.id, out


# ---- the cache ---------------------------------------------------------------------------------


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class FetchSessionCache:
    """Kafka's ``FetchSessionCache`` and ``FetchManager.newContext``."""

    def __init__(self, max_entries: int = DEFAULT_CACHE_SLOTS,
                 eviction_ms: int = DEFAULT_EVICTION_MS,
                 clock: Callable[[], int] = _monotonic_ms, rng: random.Random | None = None):
        if max_entries < 0:
            raise ValueError(f"{CACHE_SLOTS_PROP} must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.clock = clock
        self._rng = rng or random.Random()
        self.lock = threading.RLock()
        self._sessions: dict[int, FetchSession] = {}
        self._num_partitions = 0
        self.evictions = 0

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "FetchSessionCache":
        def num(name: str, default: int) -> int:
            value = props.get(name)
            return default if value is None or not str(value).strip() else int(str(value).strip())
        return cls(num(CACHE_SLOTS_PROP, DEFAULT_CACHE_SLOTS),
                   num(EVICTION_MS_PROP, DEFAULT_EVICTION_MS))

    # ---- introspection (Kafka's NumIncrementalFetchSessions, ...PartitionsCached) -----------

    def get(self, session_id: int) -> FetchSession | None:
        with self.lock:
            return self._sessions.get(session_id)

    @property
    def size(self) -> int:
        with self.lock:
            return len(self._sessions)

    @property
    def total_partitions(self) -> int:
        with self.lock:
            return self._num_partitions

    # ---- sessions ---------------------------------------------------------------------------

    def _new_session_id(self) -> int:
        while True:
            sid = self._rng.randint(1, MAX_EPOCH - 1)
            if sid not in self._sessions:
                return sid

    def maybe_create_session(self, privileged: bool, size: int, uses_topic_ids: bool,
                             create_partitions: Callable[[], dict[TopicPartition, CachedPartition]]
                             ) -> int:
        """A new session of ``size`` partitions if there is room or room can be made; its id,
        else INVALID_SESSION_ID."""
        with self.lock:
            now = self.clock()
            if len(self._sessions) >= self.max_entries and \
                    not self._try_evict(privileged, (privileged, size, 0), now):
                return INVALID_SESSION_ID
            session = FetchSession(self._new_session_id(), privileged, create_partitions(),
                                   uses_topic_ids, now)
            self._sessions[session.id] = session
            self.touch(session, now)
            log.debug("created %s", session)
            return session.id

    def _try_evict(self, privileged: bool, key: tuple[bool, int, int], now: int) -> bool:
        """Kafka's ``tryEvict``: the least recently used session if it is stale, else the
        least valuable evictable one if ``key`` is worth at least as much."""
        if not self._sessions:
            return False
        lru = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - lru.last_used_ms > self.eviction_ms:
            log.debug("evicting stale %s", lru)
            self._evict(lru)
            return True
        if privileged:
            candidates = [s for s in self._sessions.values() if s.evictable_by_privileged]
        else:
            candidates = [s for s in self._sessions.values() if s.evictable_by_all]
        if not candidates:
            return False
        victim = min(candidates, key=FetchSession.evictable_key)
        if key < victim.evictable_key():
            return False
        log.debug("evicting %s for a session of key %s", victim, key)
        self._evict(victim)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1

    def remove(self, session_id: int) -> FetchSession | None:
        with self.lock:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                self._num_partitions -= max(session.cached_size, 0)
                session.cached_size = -1
                session.evictable_by_all = session.evictable_by_privileged = False
            return session

    def touch(self, session: FetchSession, now: int) -> None:
        """Kafka's ``touch``: last used now; the session's size and evictability as of now (a
        consumer's session is evictable by a follower's at once, by anyone's once older than
        the eviction time; a follower's only once older than that)."""
        with self.lock:
            session.last_used_ms = now
            if session.cached_size >= 0:
                self._num_partitions -= session.cached_size
            session.cached_size = len(session.partitions)
            self._num_partitions += session.cached_size
            old = now - session.creation_ms > self.eviction_ms
            session.evictable_by_privileged = (not session.privileged) or old
            session.evictable_by_all = old

    # ---- Kafka's FetchManager.newContext ----------------------------------------------------

    def new_context(self, version: int, metadata: FetchMetadata, is_follower: bool,
                    fetch_data: Sequence[tuple[TopicPartition, PartitionData]],
                    to_forget: Sequence[TopicPartition]) -> FetchContext:
        if version < FIRST_VERSION_WITH_SESSIONS:
            metadata = SESSIONLESS
        uses_topic_ids = version >= FIRST_VERSION_WITH_TOPIC_IDS
        if metadata.is_full:
            if metadata.session_id != INVALID_SESSION_ID:
                self.remove(metadata.session_id)    # a full fetch closes the session it names
            if metadata.epoch == FINAL_EPOCH:
                return SessionlessFetchContext(list(fetch_data))
            return FullFetchContext(self, dict(fetch_data), is_follower, uses_topic_ids)
        with self.lock:
            session = self._sessions.get(metadata.session_id)
            if session is None:
                log.debug("session error for %d: no such session", metadata.session_id)
                return SessionErrorContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if session.epoch != metadata.epoch:
                log.debug("session error for %d: expected epoch %d, got %d", session.id,
                          session.epoch, metadata.epoch)
                return SessionErrorContext(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            if session.uses_topic_ids != uses_topic_ids:
                return SessionErrorContext(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
            data = dict(fetch_data)
            added, updated, removed = session.update(data, to_forget)
            if not session.partitions:
                # nothing left: the session closes and this fetch is answered sessionless
                log.debug("closing session %d: no partitions left", session.id)
                self.remove(session.id)
                return SessionlessFetchContext(list(data.items()))
            self.touch(session, self.clock())
            session.epoch = next_epoch(session.epoch)
            log.debug("incremental fetch of session %d, epoch %d: added %d, updated %d, "
                      "removed %d partition(s)", session.id, session.epoch, len(added),
                      len(updated), len(removed))
            return IncrementalFetchContext(self, session, metadata.epoch)


NO_SESSIONS = FetchSessionCache(max_entries=0)   # fetch sessions off: every Fetch sessionless
