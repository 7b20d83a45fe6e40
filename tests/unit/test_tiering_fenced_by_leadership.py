"""Tiering fenced by leadership (issue 51, part 1): a broker that no longer leads a partition,
or leads it at an older epoch than another broker that has written remote metadata, neither
deletes nor publishes anything of that partition's remote tier.

Two brokers here share one metadata topic log and one object store, as brokers of a cluster
do; ``leader_epoch_of`` is what each believes it leads at (an ex-leader cut from ZooKeeper
still believes it leads)."""

from __future__ import annotations

import threading

import pytest

from strata.tiered.api import (
    FencedLeaderEpochException, RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState)
from strata.tiered.manager import copier, expirer
from strata.tiered.manager.leadership import LeadershipLost
from strata.tiered.metadata.serde import serialize
from strata.tiered.metadata.topic_log import InMemoryMetadataTopicLog
from strata.tiered.storage import MemoryObjectStore
from tiered_env import TIP, TieredEnv

S = RemoteLogSegmentState


class Broker(TieredEnv):
    """A broker of the shared cluster; ``epoch["now"]`` is the epoch it believes it leads at
    (None: it knows it does not lead)."""

    def __init__(self, tmp, cluster, broker_id: int, epoch: int | None, **log_props) -> None:
        self.epoch = {"now": epoch}
        super().__init__(tmp / f"broker-{broker_id}", store=cluster["store"],
                         topic_log=cluster["log"], broker_id=broker_id,
                         leader_epoch_of=lambda tp: self.epoch["now"], log_props=log_props)

    def states(self) -> dict:
        self.rlmm.poll()
        return {m.remote_log_segment_id: m.state for m in self.rlmm.list_remote_log_segments(TIP)}


@pytest.fixture
def cluster(tmp_path):
    shared = {"store": MemoryObjectStore(), "log": InMemoryMetadataTopicLog()}
    brokers = []

    def broker(broker_id: int, epoch: int | None, **log_props) -> Broker:
        b = Broker(tmp_path, shared, broker_id, epoch, **log_props)
        brokers.append(b)
        return b
    shared["broker"] = broker
    yield shared
    for b in brokers:
        b.close()


def stored(cluster, broker: Broker, metas) -> bool:
    """Whether every object of the segments is in the shared store."""
    objects = cluster["store"].objects
    return all(k in objects for m in metas for k in broker.rsm.segment_keys(m))


def test_an_ex_leader_never_deletes_its_successors_remote_segments(cluster):
    """The issue's first scenario: broker 1 led at epoch 5 and is cut from ZooKeeper, so it
    still believes it leads; broker 2 leads at epoch 6, with broker 1's records and its own,
    and copies its segments. Broker 1's expirer runs: the successor's segments hold an epoch
    above broker 1's lineage, and are kept, whatever retention says."""
    old = cluster["broker"](1, 5, **{"retention.bytes": "1"})   # retention wants it all gone
    new = cluster["broker"](2, 6)
    old.produce(30, epoch=5)
    new.produce(30, epoch=5)        # the same records, replicated before the cut
    new.produce(30, epoch=6)
    new.log.roll()
    assert new.copy() > 0
    copied = {i for i, st in new.states().items() if st is S.COPY_SEGMENT_FINISHED}
    assert copied
    old.rlm._ensure_initialized(old.part)
    assert expirer.expire_remote_segments(old.rlm.ctx, old.part) == 0
    states = new.states()
    assert all(states.get(i) is S.COPY_SEGMENT_FINISHED for i in copied), states
    assert stored(cluster, new, new.rlmm.list_remote_log_segments(TIP))


def successor_copied(cluster) -> tuple[Broker, Broker, object]:
    """Broker 1 believes it leads at epoch 5; broker 2 leads at 6 and has copied segments:
    (the ex-leader, the successor, the successor's first segment as the ex-leader lists it)."""
    old = cluster["broker"](1, 5)
    new = cluster["broker"](2, 6)
    new.produce(30, epoch=6)
    new.log.roll()
    new.copy()
    old.rlmm.poll()
    return old, new, list(old.rlmm.list_remote_log_segments(TIP))[0]


def test_a_deposed_leaders_delete_is_refused_by_the_metadata_before_any_object_goes(cluster):
    """Even a delete the ex-leader's rules would allow (here, forced) is fenced: its
    DELETE_SEGMENT_STARTED at epoch 5 comes after the successor's epoch-6 records, every
    reader refuses it, and the delete stops before the storage delete."""
    old, new, victim = successor_copied(cluster)
    with pytest.raises(FencedLeaderEpochException):
        expirer.delete_remote_segment(old.rlm.ctx, victim, lambda: 5)
    assert new.states()[victim.remote_log_segment_id] is S.COPY_SEGMENT_FINISHED
    assert old.states()[victim.remote_log_segment_id] is S.COPY_SEGMENT_FINISHED
    assert stored(cluster, new, [victim])
    assert new.rlmm.fenced_records == old.rlmm.fenced_records == 0   # refused before the append


def test_a_stale_record_that_reaches_the_topic_is_refused_by_every_reader(cluster):
    """A deposed leader's record that reaches the topic anyway is skipped by every broker."""
    old, new, seg = successor_copied(cluster)
    stale = RemoteLogSegmentMetadataUpdate(seg.remote_log_segment_id, 1, None,
                                           S.DELETE_SEGMENT_STARTED, 1, leader_epoch=5)
    partition = new.rlmm.metadata_partition(TIP)
    cluster["log"].append(partition, serialize(stale))
    assert new.states()[seg.remote_log_segment_id] is S.COPY_SEGMENT_FINISHED
    assert old.states()[seg.remote_log_segment_id] is S.COPY_SEGMENT_FINISHED
    assert new.rlmm.fenced_records == old.rlmm.fenced_records == 1


def test_a_publish_overtaken_by_the_successors_record_fails_for_its_writer(cluster):
    """The ex-leader's record passed its check, then the successor's landed first: its
    publish fails with FencedLeaderEpochException, and nothing of it is applied."""
    old = cluster["broker"](1, 5)
    new = cluster["broker"](2, 6)
    old.produce(30, epoch=5)
    old.log.roll()
    old.copy()
    seg = list(old.rlmm.list_remote_log_segments(TIP))[0]
    successor = RemoteLogSegmentMetadataUpdate(seg.remote_log_segment_id, 1, None,
                                               S.DELETE_SEGMENT_STARTED, 2, leader_epoch=6)
    append = cluster["log"].append

    def overtaken(partition, value):
        cluster["log"].append = append
        append(partition, serialize(successor))
        return append(partition, value)
    cluster["log"].append = overtaken
    late = RemoteLogSegmentMetadataUpdate(seg.remote_log_segment_id, 2, None,
                                          S.DELETE_SEGMENT_STARTED, 1, leader_epoch=5)
    with pytest.raises(FencedLeaderEpochException):
        old.rlmm.update_remote_log_segment_metadata(late).result(5)
    assert old.rlmm.fenced_records == 1
    sid = seg.remote_log_segment_id
    assert new.states()[sid] is old.states()[sid] is S.DELETE_SEGMENT_STARTED
    assert old.rlmm._store.segment(sid).broker_id == 2     # the successor's record, not ours


def test_a_copy_that_loses_the_leadership_mid_upload_leaves_only_an_orphan_for_the_next_leader(
        cluster):
    old = cluster["broker"](1, 0)
    old.produce(30, epoch=0)
    old.log.roll()
    uploading, release = threading.Event(), threading.Event()
    upload = old.rsm.copy_log_segment_data

    def slow_upload(meta, data):
        uploading.set()
        release.wait(10)
        return upload(meta, data)
    old.rsm.copy_log_segment_data = slow_upload
    old.rlm._ensure_initialized(old.part)
    result = {}

    def run():
        try:
            copier.copy_log_segments(old.rlm.ctx, old.part)
        except Exception as exc:  # noqa: BLE001 - what the task ends with is the point
            result["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    assert uploading.wait(10)
    old.epoch["now"] = None        # the controller moved the leadership away
    release.set()
    t.join(10)
    assert isinstance(result.get("error"), LeadershipLost)
    states = old.states()
    assert list(states.values()) == [S.COPY_SEGMENT_STARTED]   # no FINISHED, nothing else
    # the next leader (the same records, epoch 1) deletes the orphan and copies again
    new = cluster["broker"](2, 1)
    new.produce(30, epoch=0)
    new.produce(5, epoch=1)
    new.log.roll()
    new.rlm._ensure_initialized(new.part)
    assert expirer.expire_remote_segments(new.rlm.ctx, new.part) == 1
    assert new.copy() > 0
    assert set(new.states().values()) == {S.COPY_SEGMENT_FINISHED}


def test_a_task_that_loses_the_leadership_ends_without_a_failure_or_backoff(cluster):
    b = cluster["broker"](1, 3)
    b.produce(30, epoch=3)
    b.log.roll()
    b.epoch["now"] = None
    b.rlm._submit(b.rlm._copiers, b.part.copy_task, 0, b.rlm._copy, b.part)
    b.rlm._copiers.shutdown(wait=True)
    assert b.part.copy_task.backoff.failures == 0 and b.part.copy_task.last_error is None
    assert b.states() == {}


def test_leading_epoch_is_the_brokers_current_epoch_while_it_still_leads(cluster):
    b = cluster["broker"](1, 3)
    assert b.rlm.ctx.leading_epoch(b.part) == 3
    b.epoch["now"] = 4                  # the same broker leads again at a later epoch
    assert b.rlm.ctx.leading_epoch(b.part) == 4
    for gone in (None, 2):
        b.epoch["now"] = gone
        with pytest.raises(LeadershipLost):
            b.rlm.ctx.leading_epoch(b.part)


def test_a_new_leaders_first_size_pass_counts_the_records_in_both_tiers_once(cluster):
    """KAFKA-20732: the new leader's log holds the records its predecessor tiered. Its first
    expiration pass knows the highest tiered offset before it sizes the log, so those records
    are not counted once remote and again local, and nothing within retention.bytes goes."""
    old = cluster["broker"](1, 0)
    old.produce(40, epoch=0)
    old.log.roll()
    assert old.copy() > 0
    remote = sum(m.segment_size_in_bytes for m in old.rlmm.list_remote_log_segments(TIP))
    new = cluster["broker"](2, 1, **{"retention.bytes": str(int(remote * 1.5)),
                                     "local.retention.bytes": "-2"})
    new.produce(40, epoch=0)
    new.log.roll()
    assert new.log.highest_offset_in_remote_storage == -1
    new.rlm._expire(new.part)
    assert new.log.highest_offset_in_remote_storage == old.log.highest_offset_in_remote_storage
    assert new.log.log_start_offset == 0
    assert set(new.states().values()) == {S.COPY_SEGMENT_FINISHED}


def test_a_remote_read_never_serves_an_old_leaders_copy_past_where_the_log_parted_from_it(
        cluster):
    """Kafka's expirer keeps an old leader's copy that runs past where the log's lineage
    parts from it (an unclean election, a lost tail). The read of an offset that copy holds
    as the log does stops where the log parted from it, and the next read is served by the
    log's own copy: every offset gives the log's record."""
    from strata.log.unified_log import FetchIsolation
    from strata.protocol.records import iter_records
    old = cluster["broker"](1, 0)
    old.produce(25, epoch=0, size=100)
    old.log.roll()                             # its segments are cut elsewhere than the log's
    old.produce(35, epoch=0, size=100)
    old.log.roll()
    assert old.copy() > 0                      # epoch 0 up to 59, in ~2 KiB segments
    new = cluster["broker"](2, 1)
    new.produce(30, epoch=0, size=100)         # the log: epoch 0 ends at 30 ...
    new.produce(30, epoch=1, size=60)          # ... and epoch 1 holds other records from 30
    expected = {}
    while len(expected) < 60:
        data = new.log.read(len(expected), 1 << 20).records
        expected.update((r.offset, r.value) for r in iter_records(data))
    new.log.roll()
    new.rlm._ensure_initialized(new.part)
    assert new.log.highest_offset_in_remote_storage <= 29
    assert new.copy() > 0
    old_copy = next(m for m in new.rlmm.list_remote_log_segments(TIP)
                    if m.start_offset < 30 <= m.end_offset and m.broker_id == 1)
    assert new.rlm.segment_for_offset(new.log, 27) == (old_copy, 30)   # the lookup finds it
    got, offset = {}, 0
    while offset < 60:
        data = new.rlm.read(new.log, offset, 10_000, FetchIsolation.HIGH_WATERMARK, True).records
        records = [r for r in iter_records(data) if r.offset >= offset]
        assert records, f"no progress at {offset}"
        got.update((r.offset, r.value) for r in records)
        offset = records[-1].offset + 1
    assert got == expected
