"""Properties of the expirer's plan (``expirer.plan_expiration``) over any lineage and any
remote tier, hypothesis-generated: what a broker may delete is only ever what its own view
of the log rules out, never a later leader's segments (issue 51, part 1)."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.common.types import TopicIdPartition, TopicPartition
from strata.tiered.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from strata.tiered.manager.expirer import LogView, plan_expiration
from strata.tiered.manager.lineage import within_lineage

S = RemoteLogSegmentState
TIP = TopicIdPartition(uuid.UUID(int=7), TopicPartition("t", 0))
NOW = 1_000_000


@st.composite
def lineages(draw) -> dict[int, int]:
    """epoch -> start offset, epochs and offsets increasing (an epoch may hold no record)."""
    n = draw(st.integers(1, 4))
    epochs = sorted(draw(st.sets(st.integers(0, 12), min_size=n, max_size=n)))
    starts = sorted(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)))
    return dict(zip(epochs, starts))


@st.composite
def segments(draw, lineage: dict[int, int], uid: int) -> RemoteLogSegmentMetadata:
    start = draw(st.integers(0, 400))
    end = start + draw(st.integers(0, 60))
    pool = list(lineage) + [max(lineage) + 1, max(lineage) + 2, max(min(lineage) - 1, 0)]
    epochs = sorted(draw(st.sets(st.sampled_from(pool), min_size=1, max_size=3)))
    firsts = sorted(draw(st.lists(st.integers(start, end), min_size=len(epochs),
                                  max_size=len(epochs))))
    firsts[0] = start
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TIP, uuid.UUID(int=uid)), start, end,
        draw(st.integers(0, NOW)), draw(st.integers(1, 3)), 0, draw(st.integers(1, 1000)),
        state=draw(st.sampled_from(list(S)[:3])), segment_leader_epochs=dict(zip(epochs, firsts)),
        leader_epoch=draw(st.sampled_from([-1, *lineage, max(lineage) + 1])))


@st.composite
def cases(draw):
    lineage = draw(lineages())
    log_end = max(lineage.values()) + draw(st.integers(1, 200))
    view = LogView(log_start=draw(st.integers(0, log_end)), log_end=log_end, lineage=lineage,
                   local_only_bytes=draw(st.integers(0, 2000)),
                   retention_ms=draw(st.sampled_from([-1, 0, NOW // 2, NOW])),
                   retention_bytes=draw(st.sampled_from([-1, 0, 500, 5000])),
                   leader_epoch=max(lineage) + draw(st.integers(0, 1)))
    n = draw(st.integers(0, 8))
    segs = sorted((draw(segments(lineage, 100 + i)) for i in range(n)),
                  key=lambda m: m.start_offset)
    ids = [m.remote_log_segment_id for m in segs if m.state is S.COPY_SEGMENT_STARTED]
    orphans = set(draw(st.lists(st.sampled_from(ids), unique=True))) if ids else set()
    return segs, view, orphans


@given(cases())
@settings(max_examples=400, deadline=None)
def test_a_broker_deletes_only_what_its_own_view_of_the_log_rules_out(case):
    segs, view, orphans = case
    doomed, new_start = plan_expiration(segs, view, NOW, orphans, None)
    latest, earliest = max(view.lineage), min(view.lineage)
    assert len({m.remote_log_segment_id for m in doomed}) == len(doomed)
    for m in doomed:
        # never a later leader's segment, in whatever state
        assert max(m.segment_leader_epochs) <= latest
        assert m.leader_epoch <= view.leader_epoch
        if m.state is S.COPY_SEGMENT_STARTED:
            assert m.remote_log_segment_id in orphans
        elif m.state is S.COPY_SEGMENT_FINISHED:
            # Kafka's rule: below the log start, an older lineage, or retention in the lineage
            below_start = m.end_offset < view.log_start
            older = all(e < earliest for e in m.segment_leader_epochs)
            inside = within_lineage(m, view.lineage, earliest, view.log_end)
            assert below_start or older or (inside and new_start > m.end_offset)
    assert new_start >= view.log_start
    moved = [m for m in doomed if m.end_offset + 1 == new_start]
    assert new_start == view.log_start or moved


@given(cases(), st.sampled_from(list(S)[:3]), st.integers(1, 2))
@settings(max_examples=200, deadline=None)
def test_a_successors_segments_survive_any_view_of_an_ex_leader(case, state, ahead):
    """A segment holding an epoch above the ex-leader's lineage, or written by a leader at a
    later epoch than the one it leads at, is never in its plan, in any state, even when
    retention, the log start offset or an orphan listing would take it."""
    segs, view, orphans = case
    latest = max(view.lineage)
    successor = RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TIP, uuid.UUID(int=0)), 0, 10, 0, 9, 0, 10**6, state=state,
        segment_leader_epochs={latest + ahead: 0}, leader_epoch=view.leader_epoch + ahead)
    rewritten = RemoteLogSegmentMetadata(   # only records of the lineage, written later
        RemoteLogSegmentId(TIP, uuid.UUID(int=1)), 0, 10, 0, 9, 0, 10**6, state=state,
        segment_leader_epochs={min(view.lineage): 0}, leader_epoch=view.leader_epoch + ahead)
    theirs = {successor.remote_log_segment_id, rewritten.remote_log_segment_id}
    doomed, _ = plan_expiration([successor, rewritten, *segs], view, NOW, orphans | theirs, None)
    assert not theirs & {m.remote_log_segment_id for m in doomed}


@given(cases())
@settings(max_examples=200, deadline=None)
def test_a_segment_outside_the_lineage_is_kept_unless_below_the_start_or_older(case):
    segs, view, orphans = case
    doomed = {m.remote_log_segment_id for m in plan_expiration(segs, view, NOW, orphans, None)[0]}
    earliest = min(view.lineage)
    for m in segs:
        if m.state is S.COPY_SEGMENT_FINISHED \
                and not within_lineage(m, view.lineage, earliest, view.log_end) \
                and m.end_offset >= view.log_start \
                and any(e >= earliest for e in m.segment_leader_epochs):
            assert m.remote_log_segment_id not in doomed
