"""Fetch sessions (KIP-227) on the broker side: the cache, its eviction order and the contexts
that decide what a Fetch reads and answers (Kafka's FetchSession.scala rules)."""

from __future__ import annotations

import random

import pytest

from strata.common.errors import ErrorCode
from strata.common.types import TopicPartition
from strata.replication.replica_manager import ReadResult
from strata.server.fetch_session import (
    FINAL_EPOCH, INITIAL_EPOCH, MAX_EPOCH, FetchMetadata, FetchSessionCache, FullFetchContext,
    IncrementalFetchContext, PartitionData, SessionErrorContext, SessionlessFetchContext,
    next_epoch)

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
V = 12   # the Fetch version (sessions from v7, topic ids from v13)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def cache(slots: int = 10, eviction_ms: int = 120_000) -> tuple[FetchSessionCache, Clock]:
    clock = Clock()
    return FetchSessionCache(slots, eviction_ms, clock=clock, rng=random.Random(7)), clock


def data(offset: int, max_bytes: int = 1000, **kw) -> PartitionData:
    return PartitionData(offset, -1, max_bytes, **kw)


def ok(hw: int = 10, records: bytes = b"", log_start: int = 0, lso: int | None = None,
       **kw) -> ReadResult:
    return ReadResult(ErrorCode.NONE, hw, hw if lso is None else lso, log_start, records, **kw)


def answer(ctx, results: dict) -> tuple[ErrorCode, int, dict]:
    """``results``: tp -> ReadResult for every partition the context reads."""
    assert [tp for tp, _ in ctx.partitions] == list(results)
    error, session_id, answered = ctx.respond(list(results.items()))
    return error, session_id, dict(answered)


def open_session(c: FetchSessionCache, parts: dict, results: dict | None = None,
                 follower: bool = False) -> int:
    ctx = c.new_context(V, FetchMetadata(0, INITIAL_EPOCH), follower, list(parts.items()), [])
    assert isinstance(ctx, FullFetchContext)
    results = results or {tp: ok() for tp in parts}
    error, session_id, answered = answer(ctx, results)
    assert error == ErrorCode.NONE and answered == results
    return session_id


def incremental(c, session_id: int, epoch: int, parts: dict | None = None, forget=()):
    return c.new_context(V, FetchMetadata(session_id, epoch), False,
                         list((parts or {}).items()), list(forget))


# ---- metadata ---------------------------------------------------------------------------------


def test_epochs_follow_kafkas_next_epoch():
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(MAX_EPOCH) == 1        # wraps past 0, which means "new session"
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    assert FetchMetadata(0, 0).is_full and FetchMetadata(5, -1).is_full
    assert not FetchMetadata(5, 1).is_full


# ---- sessionless and full fetches -------------------------------------------------------------


def test_epoch_minus_one_is_a_sessionless_full_fetch():
    c, _ = cache()
    parts = [(A0, data(5)), (A1, data(0)), (A0, data(7))]   # as asked, duplicates included
    ctx = c.new_context(V, FetchMetadata(0, FINAL_EPOCH), False, parts, [])
    assert isinstance(ctx, SessionlessFetchContext) and list(ctx.partitions) == parts
    results = [(A0, ok()), (A1, ok()), (A0, ok())]
    assert ctx.respond(results) == (ErrorCode.NONE, 0, results)
    assert c.size == 0


def test_fetches_before_v7_are_sessionless_whatever_they_carry():
    c, _ = cache()
    ctx = c.new_context(6, FetchMetadata(0, INITIAL_EPOCH), False, [(A0, data(0))], [])
    assert isinstance(ctx, SessionlessFetchContext)
    assert ctx.respond([(A0, ok())])[1] == 0 and c.size == 0


def test_a_full_fetch_opens_a_session_at_epoch_one_holding_what_it_answered():
    c, _ = cache()
    sid = open_session(c, {A0: data(3), B0: data(9)},
                       {A0: ok(hw=5, log_start=1), B0: ok(hw=9, records=b"x" * 10)})
    assert sid > 0 and c.size == 1 and c.total_partitions == 2
    session = c.get(sid)
    assert session.epoch == 1 and not session.privileged
    assert [(tp, cp.data.fetch_offset, cp.high_watermark, cp.log_start_offset)
            for tp, cp in session.partitions.items()] == [(A0, 3, 5, 1), (B0, 9, 9, 0)]


def test_a_full_fetch_naming_a_session_replaces_it_and_epoch_minus_one_only_closes_it():
    c, _ = cache()
    first = open_session(c, {A0: data(0)})
    ctx = c.new_context(V, FetchMetadata(first, INITIAL_EPOCH), False, [(A1, data(0))], [])
    _, second, _ = answer(ctx, {A1: ok()})
    assert second not in (0, first) and c.get(first) is None and c.size == 1
    ctx = c.new_context(V, FetchMetadata(second, FINAL_EPOCH), False, [(A1, data(0))], [])
    assert isinstance(ctx, SessionlessFetchContext)
    assert answer(ctx, {A1: ok()})[1] == 0 and c.size == 0


def test_followers_sessions_are_privileged():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)}, follower=True)
    assert c.get(sid).privileged


# ---- incremental fetches ----------------------------------------------------------------------


def test_an_incremental_fetch_reads_the_whole_session_and_answers_only_what_changed():
    c, _ = cache()
    sid = open_session(c, {A0: data(0), A1: data(0), B0: data(0)},
                       {A0: ok(hw=10), A1: ok(hw=10), B0: ok(hw=10)})
    # the client sends only A1, at its new offset; the session supplies the others
    ctx = incremental(c, sid, 1, {A1: data(10, max_bytes=500)})
    assert isinstance(ctx, IncrementalFetchContext)
    assert ctx.partitions == [(A0, data(0)), (A1, data(10, max_bytes=500)), (B0, data(0))]
    assert c.get(sid).epoch == 2
    error, got_sid, answered = answer(ctx, {A0: ok(hw=10), A1: ok(hw=10), B0: ok(hw=12)})
    assert (error, got_sid) == (ErrorCode.NONE, sid)
    assert answered == {B0: ok(hw=12)}          # only the changed high watermark
    # nothing changed since: nothing answered; the cached high watermark moved to 12
    ctx = incremental(c, sid, 2)
    assert answer(ctx, {A0: ok(hw=10), A1: ok(hw=10), B0: ok(hw=12)}) == (ErrorCode.NONE, sid, {})


@pytest.mark.parametrize("changed, expected", [
    ("records", True), ("high watermark", True), ("log start offset", True),
    ("last stable offset", True), ("preferred read replica", True), ("diverging epoch", True),
    ("error", True), ("nothing", False)])
def test_what_makes_a_partition_answered(changed, expected):
    c, _ = cache()
    sid = open_session(c, {A0: data(4)}, {A0: ok(hw=10, log_start=2)})
    base = dict(hw=10, log_start=2)
    result = {
        "records": ok(records=b"r" * 30, **base),
        "high watermark": ok(hw=11, log_start=2),
        "log start offset": ok(hw=10, log_start=3),
        "last stable offset": ok(lso=8, **base),
        "preferred read replica": ok(preferred_read_replica=3, **base),
        "diverging epoch": ok(diverging_epoch=(2, 3), **base),
        "error": ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, 10, 10, 2),
        "nothing": ok(**base),
    }[changed]
    _, _, answered = answer(incremental(c, sid, 1), {A0: result})
    assert (A0 in answered) is expected


def test_records_and_preferred_replicas_and_divergence_are_answered_every_time():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)}, {A0: ok(hw=10)})
    for epoch in (1, 2):
        assert A0 in answer(incremental(c, sid, epoch), {A0: ok(hw=10, records=b"r" * 5)})[2]
    assert A0 in answer(incremental(c, sid, 3), {A0: ok(hw=10, preferred_read_replica=2)})[2]
    assert A0 in answer(incremental(c, sid, 4), {A0: ok(hw=10, preferred_read_replica=2)})[2]
    assert A0 in answer(incremental(c, sid, 5), {A0: ok(hw=10, diverging_epoch=(1, 5))})[2]


def test_after_an_error_the_partition_is_answered_again_once_it_recovers():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)}, {A0: ok(hw=10)})
    failed = ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, 10, 10, 0)   # the same offsets
    assert A0 in answer(incremental(c, sid, 1), {A0: failed})[2]
    # recovered with the high watermark it had before the error: answered all the same
    assert answer(incremental(c, sid, 2), {A0: ok(hw=10)})[2] == {A0: ok(hw=10)}
    assert answer(incremental(c, sid, 3), {A0: ok(hw=10)})[2] == {}


@pytest.mark.parametrize("first", ["error", "diverging epoch"])
@pytest.mark.parametrize("where", ["full", "incremental"])
def test_after_an_error_or_a_divergence_the_high_watermark_is_answered_again(first, where):
    """Strata's error answers (and diverging epochs) carry the real high watermark, which the
    follower does not take (it truncates and fetches again): the session must not count it
    as answered, or the follower would not learn it until it moves."""
    c, _ = cache()
    hw = 10
    answer_ = ReadResult(ErrorCode.OFFSET_OUT_OF_RANGE, hw, hw, 0) if first == "error" \
        else ok(hw=hw, diverging_epoch=(1, 3))
    if where == "full":
        sid = open_session(c, {A0: data(5)}, {A0: answer_})
        epoch = 1
    else:
        sid = open_session(c, {A0: data(5)}, {A0: ok(hw=hw)})
        assert A0 in answer(incremental(c, sid, 1), {A0: answer_})[2]
        epoch = 2
    # truncated to 3, the follower asks there: nothing new but the high watermark it missed
    got = answer(incremental(c, sid, epoch, {A0: data(3)}), {A0: ok(hw=hw)})[2]
    assert got == {A0: ok(hw=hw)}
    assert answer(incremental(c, sid, epoch + 1), {A0: ok(hw=hw)})[2] == {}


def test_added_partitions_join_the_end_and_are_answered_at_once():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)}, {A0: ok(hw=10)})
    ctx = incremental(c, sid, 1, {B0: data(7)})
    assert ctx.partitions == [(A0, data(0)), (B0, data(7))]
    _, _, answered = answer(ctx, {A0: ok(hw=10), B0: ok(hw=7)})
    assert answered == {B0: ok(hw=7)}       # never answered in this session: always sent


def test_forgotten_partitions_leave_the_session_and_are_not_read():
    c, _ = cache()
    sid = open_session(c, {A0: data(0), A1: data(0), B0: data(0)})
    ctx = incremental(c, sid, 1, forget=[A1, TopicPartition("zz", 3)])   # unknown: ignored
    assert [tp for tp, _ in ctx.partitions] == [A0, B0]
    assert c.total_partitions == 2
    answer(ctx, {A0: ok(), B0: ok()})
    # a partition both sent and forgotten ends up forgotten (Kafka applies the forgets last)
    ctx = incremental(c, sid, 2, {A0: data(5)}, forget=[A0])
    assert [tp for tp, _ in ctx.partitions] == [B0]


def test_forgetting_every_partition_closes_the_session_and_answers_sessionless():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)})
    ctx = incremental(c, sid, 1, forget=[A0])
    assert isinstance(ctx, SessionlessFetchContext) and list(ctx.partitions) == []
    assert ctx.respond([]) == (ErrorCode.NONE, 0, [])
    assert c.get(sid) is None and c.size == 0 and c.total_partitions == 0


def test_partitions_answered_with_records_move_to_the_end_of_the_session():
    c, _ = cache()
    sid = open_session(c, {A0: data(0), A1: data(0), B0: data(0)})
    ctx = incremental(c, sid, 1)
    answer(ctx, {A0: ok(records=b"r"), A1: ok(hw=11), B0: ok()})
    # A0 (records) goes last; A1 (answered for its high watermark only) keeps its place
    assert [tp for tp, _ in incremental(c, sid, 2).partitions] == [A1, B0, A0]


def test_session_errors():
    c, _ = cache()
    sid = open_session(c, {A0: data(0)})
    for meta, error in ((FetchMetadata(sid + 1, 1), ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
                        (FetchMetadata(0, 5), ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
                        (FetchMetadata(sid, 2), ErrorCode.INVALID_FETCH_SESSION_EPOCH)):
        ctx = c.new_context(V, meta, False, [(A0, data(3))], [])
        assert isinstance(ctx, SessionErrorContext) and ctx.error == error
        assert ctx.partitions == () and ctx.respond([]) == (error, 0, [])
    # a session error changes nothing: epoch 1 is still the one expected, offset still 0
    assert c.get(sid).epoch == 1 and c.get(sid).partitions[A0].data.fetch_offset == 0
    # a session made by v7-12 (topic names) cannot go on with v13 (topic ids), nor the reverse
    ctx = c.new_context(13, FetchMetadata(sid, 1), False, [], [])
    assert ctx.error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    ctx13 = c.new_context(13, FetchMetadata(0, 0), False, [(A0, data(0))], [])
    _, sid13, _ = answer(ctx13, {A0: ok()})
    assert c.new_context(12, FetchMetadata(sid13, 1), False, [], []).error == \
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    assert isinstance(c.new_context(13, FetchMetadata(sid13, 1), False, [], []),
                      IncrementalFetchContext)


def test_a_duplicate_request_is_answered_with_invalid_epoch_and_does_not_touch_the_session():
    """Two fetches of one session in flight (a retried long poll): the older one, answered
    after the newer began, is refused as Kafka's 'possible duplicate request'."""
    c, _ = cache()
    sid = open_session(c, {A0: data(0)}, {A0: ok(hw=10)})
    older = incremental(c, sid, 1)
    newer = incremental(c, sid, 2)
    error, got_sid, answered = answer(older, {A0: ok(hw=11)})
    assert (error, got_sid, answered) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, sid, {})
    assert c.get(sid).partitions[A0].high_watermark == 10   # the refused answer left no trace
    assert answer(newer, {A0: ok(hw=11)})[2] == {A0: ok(hw=11)}


# ---- the cache and its eviction ---------------------------------------------------------------


def test_no_slots_means_no_sessions():
    c, _ = cache(slots=0)
    assert open_session(c, {A0: data(0)}) == 0 and c.size == 0
    assert incremental(c, 5, 1).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_a_full_cache_refuses_a_new_session_while_none_can_be_evicted():
    c, clock = cache(slots=2)
    open_session(c, {A0: data(0)})
    open_session(c, {A0: data(0)})
    clock.now += 1000
    assert open_session(c, {A0: data(0), A1: data(0)}) == 0   # both recent: nothing evicted
    assert c.size == 2 and c.evictions == 0


def test_the_least_recently_used_stale_session_is_evicted_first():
    c, clock = cache(slots=3, eviction_ms=100)
    s1 = open_session(c, {A0: data(0)})
    clock.now += 10
    s2 = open_session(c, {A0: data(0)})
    clock.now += 10
    s3 = open_session(c, {A0: data(0)})
    clock.now += 10
    answer(incremental(c, s1, 1), {A0: ok()})   # s1 used again: s2 is now the least recent
    clock.now += 111                            # s2 unused for 131 ms, s3 for 121, s1 for 111
    s4 = open_session(c, {A0: data(0)})
    assert s4 and c.get(s2) is None and {c.get(s).id for s in (s1, s3, s4)} == {s1, s3, s4}
    s5 = open_session(c, {A0: data(0)})         # then s3 (121 > 100)
    assert s5 and c.get(s3) is None and c.get(s1) is not None
    assert c.evictions == 2


def test_a_followers_session_evicts_a_consumers_at_once_but_not_another_followers():
    c, clock = cache(slots=2)
    consumer = open_session(c, {A0: data(0), A1: data(0), B0: data(0)})
    follower = open_session(c, {A0: data(0)}, follower=True)
    clock.now += 1000
    # a consumer's new session evicts nothing (both sessions are recent)
    assert open_session(c, {A0: data(0)} | {TopicPartition("c", i): data(0) for i in range(9)}) == 0
    # a follower's evicts the consumer's, even a bigger one
    newer = open_session(c, {B0: data(0)}, follower=True)
    assert newer and c.get(consumer) is None and c.get(follower) is not None
    # and a third follower's finds only recent followers' sessions: refused
    assert open_session(c, {A1: data(0)}, follower=True) == 0


def test_once_older_than_the_eviction_time_the_least_valuable_session_goes():
    """A session created more than eviction_ms ago (but used since) is evictable by anyone
    worth at least as much: fewer partitions first, consumers' before followers'."""
    c, clock = cache(slots=3, eviction_ms=100)
    small = open_session(c, {A0: data(0)})
    big = open_session(c, {A0: data(0), A1: data(0), B0: data(0)})
    follower = open_session(c, {A0: data(0)}, follower=True)
    clock.now += 150
    for sid in (small, big, follower):      # all used just now: none is stale
        answer(incremental(c, sid, 1), {tp: ok() for tp, _ in c.get(sid).partitions.items()})
    # a consumer's session of 1 partition is worth less than or equal to the smallest (1, an
    # older id wins the tie only when the newcomer is smaller): (False, 1, 0) < (False, 1, id)
    assert open_session(c, {B0: data(0)}) == 0
    two = open_session(c, {A0: data(0), A1: data(0)})   # two partitions: evicts the small one
    assert two and c.get(small) is None and c.get(big) is not None
    assert c.get(follower) is not None


def test_a_touch_keeps_evictability_as_of_that_time():
    """Kafka files a session as evictable when it is touched: a consumer's session touched
    while younger than the eviction time stays protected from consumers until touched again."""
    c, clock = cache(slots=1, eviction_ms=100)
    sid = open_session(c, {A0: data(0)})
    clock.now += 50
    answer(incremental(c, sid, 1), {A0: ok()})   # touched at age 50
    clock.now += 60                              # age 110, unused for 60: not stale
    assert open_session(c, {A0: data(0), A1: data(0)}) == 0
    answer(incremental(c, sid, 2), {A0: ok()})   # touched at age 110: now evictable by all
    assert open_session(c, {A0: data(0), A1: data(0)}) != 0 and c.get(sid) is None


def test_session_ids_are_positive_and_unique():
    c, _ = cache(slots=50)
    ids = {open_session(c, {A0: data(0)}) for _ in range(50)}
    assert len(ids) == 50 and all(0 < i < MAX_EPOCH for i in ids)


def test_from_properties_reads_kafkas_names_and_defaults():
    c = FetchSessionCache.from_properties({})
    assert (c.max_entries, c.eviction_ms) == (1000, 120_000)
    c = FetchSessionCache.from_properties({"max.incremental.fetch.session.cache.slots": "5",
                                           "min.incremental.fetch.session.eviction.ms": "10"})
    assert (c.max_entries, c.eviction_ms) == (5, 10)
    with pytest.raises(ValueError):
        FetchSessionCache.from_properties({"max.incremental.fetch.session.cache.slots": "-1"})
