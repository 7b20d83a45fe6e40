"""KIP-405 on one broker, with unmodified Kafka clients: Kafka's tiered-storage integration
scenarios that apply to a single broker (OffloadAndConsumeFromLeader, EnableRemoteLogOnTopic,
DisableRemoteLogOnTopic, RollAndOffloadActiveSegment, DeleteSegmentsByRetentionTime/Size,
DeleteSegmentsDueToLogStartOffsetBreach, DeleteTopic, PartitionsExpand, ListOffsets).

The broker runs with a filesystem remote tier under its data dir, tiny segments
(``internal.segment.bytes``), ``local.retention.bytes=1`` where the scenario wants every tiered
segment gone locally, and a 200 ms task interval.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually, never
from tiered_support import (
    EARLIEST, EARLIEST_LOCAL, LATEST_TIERED, TIERED_BROKER, list_offset, local_segments, offsets,
    remote_files, wait_for)

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic)

SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096"}
BASE_TS = int(time.time() * 1000) - 3_600_000  # recent: an hour ago, inside retention.ms


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path, TIERED_BROKER) as b:
        yield b


def remote_root(b: BrokerProcess):
    return b.data_dir / "kafka-logs" / "remote-storage"


def admin(b):
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create(b, topic, partitions=1, **configs):
    a = admin(b)
    a.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(30)


def alter_future(b, topic, **configs):
    """The future of an incremental alter (SET) of topic configs."""
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    a = admin(b)
    fut = a.incremental_alter_configs([res])[res]
    fut.admin = a  # the client must outlive its future
    return fut


def alter(b, topic, **configs):
    alter_future(b, topic, **configs).result(30)


def produce(b, topic, n, start=0, partition=0, size=200, ts=None):
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "batch.size": 4096})
    for i in range(start, start + n):
        p.produce(topic, key=f"k{i}".encode(), value=(f"v{i}-".encode() * size)[:size],
                  partition=partition, timestamp=(ts or BASE_TS) + i,
                  headers=[("i", str(i).encode())])
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def consume(b, topic, start, count, partition=0, timeout=60, reset="error"):
    """``count`` records from ``start``; an out-of-range offset is an error unless ``reset``
    names an ``auto.offset.reset`` policy."""
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                     "max.partition.fetch.bytes": 64 * 1024, "auto.offset.reset": reset})
    c.assign([CkTp(topic, partition, start)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        c.close()
    return out


def check_records(msgs, start, size=200, base_ts=BASE_TS):
    for j, m in enumerate(msgs):
        i = start + j
        assert m.offset() == i
        assert m.key() == f"k{i}".encode()
        assert m.value() == (f"v{i}-".encode() * size)[:size]
        assert m.timestamp()[1] == base_ts + i
        assert m.headers() == [("i", str(i).encode())]


def wait_tiered(b, topic, at_least, partition=0, timeout=60):
    """Until the highest tiered offset reaches ``at_least`` and local retention caught up."""
    return wait_for(lambda: (o := offsets(b.bootstrap, topic, partition))["tiered"] >= at_least
                    and o["local_start"] > at_least and o, timeout, what=f"{topic} tiered")


def test_offload_and_consume_from_the_leader_across_tiers_and_after_restart(broker):
    create(broker, "t1", **TIERED_TOPIC)
    produce(broker, "t1", 1000)
    o = wait_tiered(broker, "t1", 500)
    assert o["start"] == 0 and o["end"] == 1000, o
    assert remote_files(remote_root(broker), "t1"), "nothing in the remote tier"
    msgs = consume(broker, "t1", 0, 1000)
    assert len(msgs) == 1000
    check_records(msgs, 0)
    broker.stop()
    broker.start()
    o2 = offsets(broker.bootstrap, "t1")
    assert o2["start"] == 0 and o2["tiered"] >= o["tiered"] and o2["end"] == 1000
    mid = 137  # inside a remote segment
    msgs = consume(broker, "t1", mid, 1000 - mid)
    check_records(msgs, mid)
    assert len(msgs) == 1000 - mid


def test_list_offsets_across_tiers(broker):
    create(broker, "lo", **TIERED_TOPIC)
    produce(broker, "lo", 600)
    o = wait_tiered(broker, "lo", 300)
    assert list_offset(broker.bootstrap, "lo", 0, EARLIEST)[1] == 0
    assert list_offset(broker.bootstrap, "lo", 0, EARLIEST_LOCAL)[1] == o["local_start"] > 0
    assert list_offset(broker.bootstrap, "lo", 0, LATEST_TIERED)[1] == o["tiered"]
    for i in (0, 5, 250, o["local_start"] - 1, o["local_start"], 599):
        err, off, _ = list_offset(broker.bootstrap, "lo", 0, BASE_TS + i)
        assert (err, off) == (0, i)
    assert list_offset(broker.bootstrap, "lo", 0, BASE_TS + 600)[1] == -1


def test_latest_tiered_is_minus_one_before_anything_is_tiered(broker):
    create(broker, "nt", **{**TIERED_TOPIC, "internal.segment.bytes": str(10 * 1024 * 1024)})
    produce(broker, "nt", 10)
    assert list_offset(broker.bootstrap, "nt", 0, LATEST_TIERED)[1] == -1
    assert list_offset(broker.bootstrap, "nt", 0, EARLIEST_LOCAL)[1] == 0


# ---- the remote tier as the tests see it: objects on disk and the metadata topic ------------

def _api():
    from strata.tiered import api
    return api


class RemoteObject(NamedTuple):
    topic_dir: str       # "{topic}-{topicId}"
    start: int           # the segment's start offset, from the key
    suffixes: frozenset  # "log", "indexes", "rsm-manifest"
    log_bytes: int       # size of the .log object (0 if absent)


def remote_objects(b, topic, partition=0) -> dict[str, RemoteObject]:
    """The objects of one partition in the filesystem remote tier, by segment uuid (Kafka's
    string form). Keys are ``{topic}-{topicId}/{partition}/{start:020d}-{uuid}.{suffix}``."""
    root = remote_root(b)
    found: dict[str, dict] = {}
    for f in remote_files(root, topic):
        topic_dir, part, name = f.relative_to(root).parts
        if topic_dir[:-23] != topic or int(part) != partition:
            continue  # another topic whose name starts with "{topic}-"
        start, seg_uuid, suffix = int(name[:20]), name[21:43], name[44:]
        entry = found.setdefault(seg_uuid, {"topic_dir": topic_dir, "start": start,
                                            "suffixes": set(), "log_bytes": 0})
        entry["suffixes"].add(suffix)
        if suffix == "log":
            try:
                entry["log_bytes"] = f.stat().st_size
            except FileNotFoundError:
                pass  # deleted by the expirer since the listing
    return {k: RemoteObject(v["topic_dir"], v["start"], frozenset(v["suffixes"]), v["log_bytes"])
            for k, v in found.items()}


def metadata_records(b) -> list:
    """Every record of ``__remote_log_metadata``, decoded, read with a plain consumer."""
    from strata.tiered.metadata.serde import deserialize
    topic = "__remote_log_metadata"
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"m-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    out = []
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(CkTp(topic, p), timeout=10)[1] for p in parts}
        pending = {p for p, end in ends.items() if end > 0}
        c.assign([CkTp(topic, p, ck.OFFSET_BEGINNING) for p in pending])
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert m.error() is None, m.error()
                if m.offset() < ends[m.partition()]:
                    out.append(deserialize(m.value()))
                if m.offset() + 1 >= ends[m.partition()]:
                    pending.discard(m.partition())
        assert not pending, f"could not read {topic} partitions {pending} to their end"
    finally:
        c.close()
    return out


class SegmentHistory(NamedTuple):
    meta: object         # the RemoteLogSegmentMetadata record (COPY_SEGMENT_STARTED)
    states: list         # every state it went through, in order

    @property
    def state(self):
        return self.states[-1]

    @property
    def uuid(self) -> str:
        from strata.common.types import uuid_to_kafka_str
        return uuid_to_kafka_str(self.meta.remote_log_segment_id.id)


def segment_histories(b, topic, partition=0, records=None) -> dict[str, SegmentHistory]:
    """Each remote segment (copy attempt) of a partition with its states, by uuid string."""
    api = _api()
    out: dict[str, SegmentHistory] = {}
    for r in metadata_records(b) if records is None else records:
        tip = r.topic_id_partition
        if tip.topic != topic or tip.partition != partition:
            continue
        if isinstance(r, api.RemoteLogSegmentMetadata):
            h = SegmentHistory(r, [r.state])
            out[h.uuid] = h
        elif isinstance(r, api.RemoteLogSegmentMetadataUpdate):
            from strata.common.types import uuid_to_kafka_str
            out[uuid_to_kafka_str(r.remote_log_segment_id.id)].states.append(r.state)
    return out


def chain_problems(b, topic, partition=0) -> tuple[list[str], list]:
    """What is wrong with a partition's remote tier (nothing, once tiering is at rest):
    the copied segments must be contiguous with no duplicate, from the log start offset to the
    highest tiered offset, and the tier must hold exactly their three objects each — no orphan,
    no leftover of a deleted segment. Also the copied segments, oldest first."""
    api = _api()
    S = api.RemoteLogSegmentState
    o = offsets(b.bootstrap, topic, partition)
    hist = segment_histories(b, topic, partition)
    objects = remote_objects(b, topic, partition)
    live = sorted((h for h in hist.values() if h.state is S.COPY_SEGMENT_FINISHED),
                  key=lambda h: h.meta.start_offset)
    problems = []
    if not live:
        return ["no copied segment"], live
    if not live[0].meta.start_offset <= o["start"] <= live[0].meta.end_offset:
        problems.append(f"log start {o['start']} not in the first remote segment "
                        f"[{live[0].meta.start_offset}, {live[0].meta.end_offset}]")
    for a, z in zip(live, live[1:]):
        if z.meta.start_offset != a.meta.end_offset + 1:
            problems.append(f"gap or overlap: [{a.meta.start_offset}, {a.meta.end_offset}] then "
                            f"[{z.meta.start_offset}, {z.meta.end_offset}]")
    if live[-1].meta.end_offset != o["tiered"]:
        problems.append(f"last remote segment ends at {live[-1].meta.end_offset}, "
                        f"highest tiered offset is {o['tiered']}")
    for h in hist.values():
        if h.state is not S.COPY_SEGMENT_FINISHED and h.state is not S.DELETE_SEGMENT_FINISHED:
            problems.append(f"segment {h.uuid} [{h.meta.start_offset}] in state {h.state.name}")
    for h in live:
        obj = objects.get(h.uuid)
        if obj is None or obj.suffixes != {"log", "indexes", "rsm-manifest"}:
            problems.append(f"objects of {h.uuid}: {obj}")
        elif obj.start != h.meta.start_offset or obj.log_bytes != h.meta.segment_size_in_bytes:
            problems.append(f"object {obj} does not match {h.meta}")
    extra = set(objects) - {h.uuid for h in live}
    if extra:
        problems.append(f"objects of no copied segment: {sorted(extra)}")
    return problems, live


def wait_chain(b, topic, partition=0, timeout=60, cond=lambda live: True):
    """Until ``chain_problems`` finds nothing and ``cond(live segments)`` holds."""
    last = ([], [])

    def whole() -> bool:
        nonlocal last
        last = problems, live = chain_problems(b, topic, partition)
        return not problems and cond(live)
    eventually(whole, f"remote tier of {topic}-{partition}", timeout, interval=0.2,
               report=lambda: (f"; {last[0] or 'cond'}; segments "
                               f"{[(h.meta.start_offset, h.meta.end_offset) for h in last[1]]}"))
    return last[1]


def config_error(fut):
    """The message of the INVALID_CONFIG error an admin future must fail with."""
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(30)
    vars(fut).pop("admin", None)
    err = exc.value.args[0]
    assert err.code() == ck.KafkaError.INVALID_CONFIG, err
    return err.str()


def all_segments(b, topic, partition=0):
    return local_segments(b.data_dir / "kafka-logs", topic, partition)


# ---- the scenarios ------------------------------------------------------------------------


def test_enable_remote_log_on_an_existing_topic(broker):
    """EnableRemoteLogOnTopic: segments rolled before tiering was turned on are tiered after."""
    create(broker, "en", **{"internal.segment.bytes": str(SEGMENT), "segment.index.bytes": "4096"})
    produce(broker, "en", 600)
    assert len(all_segments(broker, "en")) >= 6
    time.sleep(0.6)  # three task intervals: nothing is tiered while the topic is not
    assert offsets(broker.bootstrap, "en") == {"start": 0, "local_start": 0, "end": 600,
                                              "tiered": -1}
    assert remote_files(remote_root(broker), "en") == []

    alter(broker, "en", **{"remote.storage.enable": "true", "local.retention.bytes": "1"})
    o = wait_tiered(broker, "en", 450)
    assert o["start"] == 0 and o["end"] == 600, o
    live = wait_chain(broker, "en")
    assert live[0].meta.start_offset == 0
    # only the active segment stays local
    wait_for(lambda: [int(p.stem) for p in all_segments(broker, "en")] ==
             [offsets(broker.bootstrap, "en")["tiered"] + 1], 30, what="local segments deleted")
    msgs = consume(broker, "en", 0, 600)
    assert len(msgs) == 600
    check_records(msgs, 0)
    produce(broker, "en", 300, start=600)
    wait_tiered(broker, "en", 800)
    wait_chain(broker, "en")
    msgs = consume(broker, "en", 0, 900)
    assert len(msgs) == 900
    check_records(msgs, 0)


def test_copy_disable_keeps_remote_reads_and_resumes_without_gap(broker):
    """DisableRemoteLogOnTopic (read-only): remote.log.copy.disable stops copying, the remote
    data stays readable, and copying resumes where it stopped."""
    create(broker, "cd", **TIERED_TOPIC)
    produce(broker, "cd", 400)
    wait_tiered(broker, "cd", 250)
    # Kafka requires local retention = total retention while copying is disabled
    assert "remote.log.copy.disable" in config_error(
        alter_future(broker, "cd", **{"remote.log.copy.disable": "true"}))
    alter(broker, "cd", **{"remote.log.copy.disable": "true", "local.retention.bytes": "-2"})
    time.sleep(0.5)  # a copy in flight when the config changed may still finish
    frozen = offsets(broker.bootstrap, "cd")
    produce(broker, "cd", 400, start=400)
    assert len([p for p in all_segments(broker, "cd") if int(p.stem) > frozen["tiered"]]) >= 6

    def moved():
        o = offsets(broker.bootstrap, "cd")
        return (o["tiered"], o["local_start"]) != (frozen["tiered"], frozen["local_start"]) and o
    never(moved, "copying or local deletion while copying is disabled", during=2.0,
          interval=0.1)  # ten task intervals
    live = wait_chain(broker, "cd")
    assert live[0].meta.start_offset == 0 and live[-1].meta.end_offset == frozen["tiered"]
    msgs = consume(broker, "cd", 0, 800)  # the first part from the remote tier
    assert len(msgs) == 800
    check_records(msgs, 0)
    # remote retention still works while copying is disabled: DeleteRecords into the second
    # remote segment deletes the first
    target = live[1].meta.start_offset + 1
    a = admin(broker)
    assert list(a.delete_records([CkTp("cd", 0, target)]).values())[0].result(30) \
        .low_watermark == target
    kept = wait_chain(broker, "cd", cond=lambda lv: lv[0].uuid == live[1].uuid)
    assert [h.uuid for h in kept] == [h.uuid for h in live[1:]]

    alter(broker, "cd", **{"remote.log.copy.disable": "false", "local.retention.bytes": "1"})
    o = wait_tiered(broker, "cd", 700)
    assert o["start"] == target and o["end"] == 800, o
    after = wait_chain(broker, "cd")  # contiguous: no gap, no duplicate
    assert [h.uuid for h in after[:len(kept)]] == [h.uuid for h in kept]  # nothing copied twice
    assert after[len(kept)].meta.start_offset == frozen["tiered"] + 1
    msgs = consume(broker, "cd", ck.OFFSET_BEGINNING, 800 - target)
    assert len(msgs) == 800 - target
    check_records(msgs, target)


def test_copy_disabled_topic_applies_retention_to_local_segments(broker):
    """With copying disabled, local retention equals total retention (Kafka requires it) and
    applies to the local segments, copied or not, as on a plain topic (Kafka's
    remoteLogEnabledAndRemoteCopyEnabled): the log start offset moves and the remote segments
    below it go. Copying again resumes at the log start offset."""
    create(broker, "cs", **TIERED_TOPIC)
    produce(broker, "cs", 300)
    wait_tiered(broker, "cs", 150)
    wait_chain(broker, "cs")
    limit = 4 * SEGMENT
    alter(broker, "cs", **{"remote.log.copy.disable": "true", "retention.bytes": str(limit),
                           "local.retention.bytes": str(limit)})
    time.sleep(0.5)  # a copy in flight when the config changed may still finish
    frozen = offsets(broker.bootstrap, "cs")["tiered"]
    produce(broker, "cs", 1000, start=300)

    def settled():
        segs = all_segments(broker, "cs")
        try:
            size = sum(p.stat().st_size for p in segs)
            first = segs[0].stat().st_size
        except FileNotFoundError:
            return False  # retention deleted a segment while we looked: look again
        o = offsets(broker.bootstrap, "cs")
        return (size - limit < first and o["start"] == o["local_start"]
                and not remote_files(remote_root(broker), "cs") and o)
    o = wait_for(settled, 30, what="local retention of a copy-disabled topic")
    assert o["start"] == int(all_segments(broker, "cs")[0].stem) > frozen + 1, o
    assert o["end"] == 1300 and o["tiered"] == frozen, o
    S = _api().RemoteLogSegmentState
    assert all(h.state is S.DELETE_SEGMENT_FINISHED
               for h in segment_histories(broker, "cs").values())
    start = o["start"]
    msgs = consume(broker, "cs", ck.OFFSET_BEGINNING, 1300 - start)
    assert len(msgs) == 1300 - start
    check_records(msgs, start)

    alter(broker, "cs", **{"remote.log.copy.disable": "false", "local.retention.bytes": "1"})
    o = wait_tiered(broker, "cs", 1200)
    assert o["start"] == start, o
    live = wait_chain(broker, "cs")
    assert live[0].meta.start_offset == start
    msgs = consume(broker, "cs", ck.OFFSET_BEGINNING, 1300 - start)
    assert len(msgs) == 1300 - start
    check_records(msgs, start)


def test_disable_remote_storage_with_delete_on_disable(broker):
    """DisableRemoteLogOnTopic: turning tiering off needs remote.log.delete.on.disable, which
    deletes every remote object; the log then starts at the local log start."""
    create(broker, "dd", **TIERED_TOPIC)
    produce(broker, "dd", 600)
    o = wait_tiered(broker, "dd", 300)
    assert remote_files(remote_root(broker), "dd")
    message = config_error(alter_future(broker, "dd", **{"remote.storage.enable": "false"}))
    assert "remote.log.delete.on.disable" in message
    time.sleep(0.4)
    assert remote_files(remote_root(broker), "dd"), "refused change deleted remote data"

    alter(broker, "dd", **{"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"})
    wait_for(lambda: not remote_files(remote_root(broker), "dd"), 30, what="remote data deleted")
    o2 = wait_for(lambda: (x := offsets(broker.bootstrap, "dd"))["start"] == x["local_start"]
                  and x, 30, what="log start = local log start")
    assert o2["start"] >= o["local_start"] > 0 and o2["end"] == 600 and o2["tiered"] == -1, o2
    hist = segment_histories(broker, "dd")
    S = _api().RemoteLogSegmentState
    assert hist and all(h.states[-2:] == [S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
                        for h in hist.values()), hist
    start = o2["start"]
    msgs = consume(broker, "dd", ck.OFFSET_BEGINNING, 600 - start)
    assert len(msgs) == 600 - start
    check_records(msgs, start)
    # no longer tiered: new segments roll and stay local
    produce(broker, "dd", 300, start=600)
    time.sleep(0.6)
    assert remote_files(remote_root(broker), "dd") == []
    assert offsets(broker.bootstrap, "dd") == {"start": start, "local_start": start, "end": 900,
                                              "tiered": -1}
    msgs = consume(broker, "dd", start, 900 - start)
    check_records(msgs, start)
    assert len(msgs) == 900 - start


def test_local_retention_ms_rolls_and_offloads_the_active_segment(broker):
    """RollAndOffloadActiveSegment: an active segment past local.retention.ms is rolled,
    copied, then deleted locally."""
    now = int(time.time() * 1000)
    create(broker, "ra", **{"remote.storage.enable": "true",
                            "internal.segment.bytes": str(10 * 1024 * 1024),
                            "local.retention.ms": "1000", "retention.ms": str(86_400_000)})
    produce(broker, "ra", 100, ts=now)
    assert len(all_segments(broker, "ra")) == 1
    o = wait_for(lambda: (x := offsets(broker.bootstrap, "ra"))["tiered"] == 99
                 and x["local_start"] == 100 and x, 30, what="active segment offloaded")
    assert o == {"start": 0, "local_start": 100, "end": 100, "tiered": 99}
    live = wait_chain(broker, "ra")
    assert [(h.meta.start_offset, h.meta.end_offset) for h in live] == [(0, 99)]
    wait_for(lambda: [int(p.stem) for p in all_segments(broker, "ra")] == [100], 30,
             what="segment deleted locally")
    msgs = consume(broker, "ra", 0, 100)
    assert len(msgs) == 100
    check_records(msgs, 0, base_ts=now)


def test_remote_segments_past_retention_ms_are_deleted(broker):
    """DeleteSegmentsByRetentionTime: remote segments whose records are all older than
    retention.ms go (DELETE_SEGMENT_STARTED/FINISHED), the log start offset moves past them."""
    now = int(time.time() * 1000)
    old = now - 2 * 3_600_000
    create(broker, "rt", **{**TIERED_TOPIC, "retention.ms": "3600000",
                            "local.retention.ms": "1000"})
    produce(broker, "rt", 300, ts=old)
    produce(broker, "rt", 300, start=300, ts=now - 300)
    wait_tiered(broker, "rt", 450)

    def settled(live):
        return live[0].meta.max_timestamp_ms > now - 3_600_000
    live = wait_chain(broker, "rt", cond=settled)
    o = offsets(broker.bootstrap, "rt")
    first = live[0].meta
    assert o["start"] == first.start_offset and 0 < first.start_offset <= 300 <= first.end_offset, \
        (o, first)
    hist = segment_histories(broker, "rt")
    S = _api().RemoteLogSegmentState
    deleted = [h for h in hist.values() if h.state is S.DELETE_SEGMENT_FINISHED]
    assert deleted and all(h.meta.end_offset < o["start"] and
                           h.states == [S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED,
                                        S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
                           for h in deleted), deleted
    assert max(h.meta.max_timestamp_ms for h in deleted) <= now - 3_600_000
    # every offset below the log start was in a deleted segment, now gone from the tier
    assert sorted((h.meta.start_offset, h.meta.end_offset) for h in deleted)[0][0] == 0
    objects = remote_objects(broker, "rt")
    assert not {h.uuid for h in deleted} & set(objects)
    assert min(obj.start for obj in objects.values()) == o["start"]
    # the oldest retained record is what a timestamp far in the past finds now
    assert list_offset(broker.bootstrap, "rt", 0, old)[:2] == (0, o["start"])
    start = o["start"]
    msgs = consume(broker, "rt", ck.OFFSET_BEGINNING, 600 - start)
    assert len(msgs) == 600 - start
    check_records(msgs[:300 - start], start, base_ts=old)
    check_records(msgs[300 - start:], 300, base_ts=now - 300)


def test_an_idle_topic_past_retention_ms_empties_both_tiers(broker):
    """DeleteSegmentsByRetentionTime, all of it: the expired active segment is rolled and
    tiered, then every remote segment expires and the log start offset reaches the log end."""
    old = int(time.time() * 1000) - 2 * 3_600_000
    create(broker, "rx", **{**TIERED_TOPIC, "retention.ms": "3600000",
                            "local.retention.ms": "1000"})
    produce(broker, "rx", 300, ts=old)
    o = wait_for(lambda: (x := offsets(broker.bootstrap, "rx"))["start"] == 300 and x, 30,
                 what="every record expired")
    assert o == {"start": 300, "local_start": 300, "end": 300, "tiered": 299}, o
    wait_for(lambda: not remote_files(remote_root(broker), "rx"), 30, what="remote tier empty")
    S = _api().RemoteLogSegmentState
    hist = segment_histories(broker, "rx")
    assert hist and all(h.state is S.DELETE_SEGMENT_FINISHED for h in hist.values())
    assert max(h.meta.end_offset for h in hist.values()) == 299
    assert consume(broker, "rx", ck.OFFSET_BEGINNING, 1, timeout=2) == []
    produce(broker, "rx", 10, start=300, ts=int(time.time() * 1000))
    msgs = consume(broker, "rx", ck.OFFSET_BEGINNING, 10)
    assert [m.offset() for m in msgs] == list(range(300, 310))


def test_remote_segments_past_retention_bytes_are_deleted(broker):
    """DeleteSegmentsByRetentionSize: the oldest remote segments go while the whole log (remote
    plus local data not yet tiered) exceeds retention.bytes by at least the segment's size."""
    retention = 4 * SEGMENT
    create(broker, "rs", **{**TIERED_TOPIC, "retention.bytes": str(retention)})
    produce(broker, "rs", 1000)
    wait_tiered(broker, "rs", 850)

    def total(live):
        tiered = live[-1].meta.end_offset
        local = sum(p.stat().st_size for p in all_segments(broker, "rs") if int(p.stem) > tiered)
        return sum(h.meta.segment_size_in_bytes for h in live) + local

    def fits(live):
        return total(live) - retention < live[0].meta.segment_size_in_bytes
    live = wait_chain(broker, "rs", cond=fits)
    assert total(live) >= retention  # not more than needed was deleted
    o = offsets(broker.bootstrap, "rs")
    assert o["start"] == live[0].meta.start_offset > 0 and o["end"] == 1000, o
    S = _api().RemoteLogSegmentState
    deleted = [h for h in segment_histories(broker, "rs").values()
               if h.state is S.DELETE_SEGMENT_FINISHED]
    assert sorted(h.meta.start_offset for h in deleted)[0] == 0
    assert all(h.meta.end_offset < o["start"] for h in deleted)
    start = o["start"]
    msgs = consume(broker, "rs", ck.OFFSET_BEGINNING, 1000 - start)
    assert len(msgs) == 1000 - start
    check_records(msgs, start)


def test_delete_records_into_the_remote_range(broker):
    """DeleteSegmentsDueToLogStartOffsetBreach: DeleteRecords to an offset inside a remote
    segment moves the log start offset there and deletes the remote segments wholly below."""
    create(broker, "dr", **TIERED_TOPIC)
    produce(broker, "dr", 1000)
    wait_tiered(broker, "dr", 700)
    live = wait_chain(broker, "dr")
    seg = live[3].meta
    target = (seg.start_offset + seg.end_offset) // 2
    assert seg.start_offset < target < seg.end_offset
    a = admin(broker)
    res = a.delete_records([CkTp("dr", 0, target)])
    assert list(res.values())[0].result(30).low_watermark == target
    assert offsets(broker.bootstrap, "dr")["start"] == target
    after = wait_chain(broker, "dr", cond=lambda lv: lv[0].meta.start_offset == seg.start_offset)
    assert [h.uuid for h in after[:len(live) - 3]] == [h.uuid for h in live[3:]]
    S = _api().RemoteLogSegmentState
    hist = segment_histories(broker, "dr")
    assert all(hist[h.uuid].state is S.DELETE_SEGMENT_FINISHED for h in live[:3])
    assert not {h.uuid for h in live[:3]} & set(remote_objects(broker, "dr"))
    assert offsets(broker.bootstrap, "dr")["start"] == target
    msgs = consume(broker, "dr", ck.OFFSET_BEGINNING, 1000 - target)
    assert len(msgs) == 1000 - target
    check_records(msgs, target)
    assert list_offset(broker.bootstrap, "dr", 0, BASE_TS)[:2] == (0, target)
    # a fetch below the log start offset is OFFSET_OUT_OF_RANGE: the consumer resets
    msgs = consume(broker, "dr", 0, 1000 - target, reset="earliest")
    assert len(msgs) == 1000 - target
    check_records(msgs, target)
    broker.stop()
    broker.start()
    assert offsets(broker.bootstrap, "dr")["start"] == target
    assert [h.uuid for h in wait_chain(broker, "dr")] == [h.uuid for h in after]
    msgs = consume(broker, "dr", target, 1000 - target)
    assert len(msgs) == 1000 - target
    check_records(msgs, target)


def test_delete_topic_removes_remote_data_and_the_name_can_be_reused(broker):
    """DeleteTopic: the remote partition remover deletes every object of the topic."""
    create(broker, "dt", 2, **TIERED_TOPIC)
    for p in (0, 1):
        produce(broker, "dt", 400, partition=p)
    for p in (0, 1):
        wait_tiered(broker, "dt", 200, partition=p)
    old_dirs = {f.relative_to(remote_root(broker)).parts[0]
                for f in remote_files(remote_root(broker), "dt")}
    assert len(old_dirs) == 1
    a = admin(broker)
    a.delete_topics(["dt"])["dt"].result(30)
    wait_for(lambda: not remote_files(remote_root(broker), "dt"), 30, what="remote data deleted")
    P = _api().RemotePartitionDeleteState
    finished = {r.topic_id_partition.partition for r in metadata_records(broker)
                if isinstance(r, _api().RemotePartitionDeleteMetadata)
                and r.topic_id_partition.topic == "dt" and r.state is P.DELETE_PARTITION_FINISHED}
    assert finished == {0, 1}
    time.sleep(0.6)  # nothing comes back (a copy racing with the deletion, say)
    assert remote_files(remote_root(broker), "dt") == []

    create(broker, "dt", 1, **TIERED_TOPIC)
    produce(broker, "dt", 300)
    o = wait_tiered(broker, "dt", 150)
    assert o["start"] == 0 and o["end"] == 300
    dirs = {f.relative_to(remote_root(broker)).parts[0]
            for f in remote_files(remote_root(broker), "dt")}
    assert len(dirs) == 1 and not dirs & old_dirs
    wait_chain(broker, "dt")
    msgs = consume(broker, "dt", 0, 300)
    assert len(msgs) == 300
    check_records(msgs, 0)
    assert consume(broker, "dt", 300, 1, timeout=2) == []


def test_added_partitions_are_tiered(broker):
    """PartitionsExpand: partitions added to a tiered topic are tiered too."""
    create(broker, "pe", **TIERED_TOPIC)
    produce(broker, "pe", 300)
    wait_tiered(broker, "pe", 150)
    a = admin(broker)
    a.create_partitions([NewPartitions("pe", 3)])["pe"].result(30)
    for p in (1, 2):
        produce(broker, "pe", 300, partition=p)
    for p in (0, 1, 2):
        o = wait_tiered(broker, "pe", 150, partition=p)
        assert o["start"] == 0 and o["end"] == 300, (p, o)
        live = wait_chain(broker, "pe", partition=p)
        assert live[0].meta.start_offset == 0
        msgs = consume(broker, "pe", 0, 300, partition=p)
        assert len(msgs) == 300
        check_records(msgs, 0)


def test_remote_storage_config_validation(broker, tmp_path):
    """The remote-storage topic config rules, through the AdminClient: INVALID_CONFIG."""
    a = admin(broker)
    bad = {
        "compacted": {"remote.storage.enable": "true", "cleanup.policy": "compact"},
        "local-ms-over-total": {"remote.storage.enable": "true", "retention.ms": "60000",
                                "local.retention.ms": "120000"},
        "local-bytes-unlimited": {"remote.storage.enable": "true", "retention.bytes": "100000",
                                  "local.retention.bytes": "-1"},
        "local-bytes-over-total": {"remote.storage.enable": "true", "retention.bytes": "100000",
                                   "local.retention.bytes": "200000"},
        "copy-disabled-local-retention": {"remote.storage.enable": "true",
                                          "remote.log.copy.disable": "true",
                                          "retention.bytes": "100000",
                                          "local.retention.bytes": "1000"},
    }
    messages = {}
    for name, configs in bad.items():
        fut = a.create_topics([NewTopic(name, 1, 1, config=configs)])[name]
        messages[name] = config_error(fut)
    assert "cleanup.policy" in messages["compacted"]
    assert "local.retention.ms" in messages["local-ms-over-total"]
    assert "local.retention.bytes" in messages["local-bytes-unlimited"]
    assert "local.retention.bytes" in messages["local-bytes-over-total"]
    assert "remote.log.copy.disable" in messages["copy-disabled-local-retention"]
    assert not set(bad) & set(a.list_topics(timeout=10).topics)

    # the same rules on alter
    create(broker, "cv", **{"cleanup.policy": "compact"})
    assert "cleanup.policy" in config_error(
        alter_future(broker, "cv", **{"remote.storage.enable": "true"}))
    create(broker, "cv2", **TIERED_TOPIC)
    assert "local.retention.ms" in config_error(alter_future(
        broker, "cv2", **{"local.retention.ms": "-1", "retention.ms": "60000"}))

    # a broker without remote.log.storage.system.enable refuses tiered topics
    with BrokerProcess(tmp_path / "plain") as plain:
        pa = admin(plain)
        msg = config_error(pa.create_topics([NewTopic(
            "x", 1, 1, config={"remote.storage.enable": "true"})])["x"])
        assert "Tiered Storage functionality is disabled" in msg
        create(plain, "y")
        assert "Tiered Storage functionality is disabled" in config_error(
            alter_future(plain, "y", **{"remote.storage.enable": "true"}))
        assert "x" not in pa.list_topics(timeout=10).topics


def test_remote_quotas_are_dynamic_broker_configs_kept_across_a_restart(broker):
    """KIP-956's copy/fetch bounds through the AdminClient: set on this broker, described with
    their dynamic source, refused when invalid or static, still there after a restart;
    tiering goes on under them. (librdkafka refuses the cluster-default resource name "":
    the unit tests cover it.)"""
    copy, fetch = ("remote.log.manager.copy.max.bytes.per.second",
                   "remote.log.manager.fetch.max.bytes.per.second")
    a = admin(broker)

    def set_broker(op=AlterConfigOpType.SET, **configs):
        res = ConfigResource("broker", "1", incremental_configs=[
            ConfigEntry(k, v, incremental_operation=op) for k, v in configs.items()])
        return a.incremental_alter_configs([res])[res]

    def described():
        res = ConfigResource("broker", "1")
        client = admin(broker)   # must outlive its future
        got = client.describe_configs([res])[res].result(30)
        return {k: (e.value, int(getattr(e.source, "value", e.source)), e.is_read_only)
                for k, e in got.items() if k in (copy, fetch)}

    dynamic, default = 2, 5   # ConfigSource.DYNAMIC_BROKER_CONFIG, DEFAULT_CONFIG
    unlimited = str(2**63 - 1)
    assert described() == {copy: (unlimited, default, False), fetch: (unlimited, default, False)}
    set_broker(**{copy: "104857600", fetch: "209715200"}).result(30)
    for bad in ({fetch: "0"}, {copy: "lots"}, {"log.retention.ms": "1"}):
        with pytest.raises(ck.KafkaException) as err:
            set_broker(**bad).result(30)
        assert err.value.args[0].code() == ck.KafkaError.INVALID_REQUEST
    expected = {copy: ("104857600", dynamic, False), fetch: ("209715200", dynamic, False)}
    assert described() == expected
    broker.stop()
    broker.start()
    assert described() == expected
    create(broker, "quota", **TIERED_TOPIC)
    produce(broker, "quota", 500)
    wait_tiered(broker, "quota", 100)
    assert len(consume(broker, "quota", 0, 500)) == 500
    set_broker(AlterConfigOpType.DELETE, **{fetch: None}).result(30)
    assert described()[fetch] == (unlimited, default, False)
