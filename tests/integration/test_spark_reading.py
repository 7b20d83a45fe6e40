"""The reading library under the Strata Spark source, against a live tiered broker (no Spark):
BrokerClient (Metadata, ListOffsets, Fetch, DescribeConfigs), remote_segments (the remote
log metadata replayed from ``__remote_log_metadata``), RemoteSegmentReader (segments straight
from the filesystem remote tier) and batches_to_arrow decoding what they return.

One broker and one topic for the module: 2 partitions, 16 KiB segments, local.retention.bytes=1,
so every rolled segment is tiered and deleted locally and each partition ends with a local
tail (its active segment). Records: null keys, empty values, 0-2 headers (one with a null
value), explicit timestamps; the first part uncompressed, the rest zstd.
"""

from __future__ import annotations

import io
import pickle
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_process import BrokerProcess
from tiered_support import TIERED_BROKER, local_segments, offsets, wait_for

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition as CkTp  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from strata.common.types import uuid_to_kafka_str  # noqa: E402
from strata.spark.arrow_records import batches_to_arrow  # noqa: E402
from strata.spark.broker_client import BrokerClient, DataLossError  # noqa: E402
from strata.spark.remote_segments import (  # noqa: E402
    RemoteSegmentReader, remote_segments, rsm_props_from_options, segment_read_ranges)

pytestmark = pytest.mark.slow

TOPIC = "reading"
PARTITIONS = 2
PER_PARTITION = 1200
CHUNK_SIZE = 9000       # the remote .log objects' chunks: batches straddle their ends
BASE_TS = (int(time.time() * 1000) // 1000) * 1000 - 3_600_000     # an hour ago: kept


@dataclass(frozen=True)
class Sent:
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass
class Cluster:
    broker: BrokerProcess
    remote_root: Path
    sent: dict[int, list[Sent]]         # by partition, in offset order

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap


def record(i: int, rng: random.Random) -> tuple[bytes | None, bytes, list[tuple[str, bytes | None]]]:
    key = None if i % 10 == 3 else b"key-%d" % i
    value = b"" if i % 97 == 5 else rng.randbytes(rng.randint(100, 400))
    headers: list[tuple[str, bytes | None]] = [[], [("i", b"%d" % i)],
                                               [("i", b"%d" % i), ("n", None)]][i % 3]
    return key, value, headers


def produce(bootstrap: str, topic: str, indexes: range, partitions: int, compression: str
            ) -> list[tuple[int, Sent]]:
    rng = random.Random(indexes.start)
    acked: list[tuple[int, Sent]] = []
    errors: list[str] = []
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                            "batch.size": 4096, "compression.type": compression,
                            "enable.idempotence": True})
    for i in indexes:
        key, value, headers = record(i, rng)

        def done(err, msg, key=key, value=value, headers=headers, ts=BASE_TS + i):
            if err is not None:
                errors.append(str(err))
            else:
                acked.append((msg.partition(), Sent(msg.offset(), key, value, tuple(headers), ts)))
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=BASE_TS + i,
                         partition=i % partitions, on_delivery=done)
        if i % 200 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    return acked


def manifests(root: Path, topic: str, partition: int) -> set[str]:
    """Kafka-form uuids of the segments whose manifest (the commit marker) is in the tier."""
    found = set()
    for f in root.glob(f"{topic}-*/{partition}/*.rsm-manifest"):
        if f.parent.parent.name[:-23] == topic:
            found.add(f.name[21:43])
    return found


def settled(c: Cluster) -> bool:
    """Every rolled segment tiered and deleted locally: only the active one (the tail) left."""
    log_dir = c.broker.data_dir / "kafka-logs"
    for p in range(PARTITIONS):
        if len(local_segments(log_dir, TOPIC, p)) != 1:
            return False
        o = offsets(c.bootstrap, TOPIC, p)
        if not (o["tiered"] + 1 == o["local_start"] < o["end"]
                and len(manifests(c.remote_root, TOPIC, p)) >= 10):
            return False
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("spark-reading")
    with BrokerProcess(data_dir, {**TIERED_BROKER, "rsm.config.chunk.size": str(CHUNK_SIZE)}) \
            as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={
            "remote.storage.enable": "true", "internal.segment.bytes": str(16 * 1024),
            "local.retention.bytes": "1", "segment.index.bytes": "4096",
            "index.interval.bytes": "1024"})])[TOPIC].result(30)
        total = PARTITIONS * PER_PARTITION
        acked = produce(broker.bootstrap, TOPIC, range(0, total * 2 // 3), PARTITIONS, "none")
        acked += produce(broker.bootstrap, TOPIC, range(total * 2 // 3, total), PARTITIONS, "zstd")
        sent = {p: sorted((s for q, s in acked if q == p), key=lambda s: s.offset)
                for p in range(PARTITIONS)}
        c = Cluster(broker, data_dir / "kafka-logs" / "remote-storage", sent)
        wait_for(lambda: settled(c), 120, what="every rolled segment tiered and deleted locally")
        yield c


def client(c: Cluster, **kw) -> BrokerClient:
    return BrokerClient(c.bootstrap, **kw)


def reader(c: Cluster) -> RemoteSegmentReader:
    return RemoteSegmentReader(rsm_props_from_options({"rsm.config.storage.url": c.remote_root.as_uri()}))


def decoded(chunks, partition: int, start: int, end: int) -> list[dict]:
    return [r for chunk in chunks
            for b in batches_to_arrow(chunk, TOPIC, partition, start, end, include_headers=True)
            for r in b.to_pylist()]


def as_sent(rows: list[dict]) -> list[Sent]:
    out = []
    for r in rows:
        assert r["topic"] == TOPIC and r["timestampType"] == 0
        out.append(Sent(r["offset"], r["key"], r["value"],
                        tuple((h["key"], h["value"]) for h in r["headers"]),
                        int(r["timestamp"].timestamp() * 1000)))
    return out


# ---- Metadata, ListOffsets, DescribeConfigs ----------------------------------------------------

def test_topics_include_internal_ones_and_leave_out_unknown_names(cluster):
    with client(cluster) as c:
        everything = c.topics()
        named = c.topics([TOPIC, "no-such-topic"])
    assert "__remote_log_metadata" in everything and TOPIC in everything
    assert list(named) == [TOPIC]
    assert named[TOPIC].partitions == PARTITIONS and named[TOPIC].topic_id.int != 0
    assert named[TOPIC] == everything[TOPIC]


def test_list_offsets_answers_every_special_timestamp_and_times(cluster):
    with client(cluster) as c:
        earliest = c.list_offsets(TOPIC, [0, 1], -2)
        latest = c.list_offsets(TOPIC, [0, 1], -1)
        local = c.list_offsets(TOPIC, [0, 1], -4)
        tiered = c.list_offsets(TOPIC, [0, 1], -5)
        for p in range(PARTITIONS):
            sent = cluster.sent[p]
            assert earliest[p] == 0 and latest[p] == len(sent) == sent[-1].offset + 1
            assert 0 < tiered[p] + 1 == local[p] < latest[p]
            for k in (0, 7, local[p] - 1, local[p], len(sent) - 1):      # both tiers
                assert c.list_offsets(TOPIC, [p], sent[k].timestamp) == {p: k}
                assert c.list_offsets(TOPIC, [p], sent[k].timestamp - 1) == {p: k}
            assert c.list_offsets(TOPIC, [p], sent[-1].timestamp + 1) == {p: -1}
        assert c.list_offsets(TOPIC, [1, 0], cluster.sent[1][3].timestamp) == \
            {1: 3, 0: 4}        # partition 0 holds the even indexes, 1 the odd ones


def test_describe_configs_reads_topic_and_broker_configs(cluster):
    with client(cluster) as c:
        topic = c.describe_configs(2, TOPIC)
        broker = c.describe_configs(4, "1")
    assert topic["remote.storage.enable"] == "true"
    assert topic["segment.index.bytes"] == "4096"
    assert broker["remote.log.storage.system.enable"] == "true"


# ---- the remote log metadata -------------------------------------------------------------------

def test_remote_segments_lists_exactly_the_finished_segments_whose_objects_exist(cluster):
    with client(cluster) as c:
        segments = remote_segments(c, TOPIC)
        local = c.list_offsets(TOPIC, [0, 1], -4)
    assert sorted(segments) == list(range(PARTITIONS))
    for p, metas in segments.items():
        assert len(metas) >= 10
        assert {uuid_to_kafka_str(m.remote_log_segment_id.id) for m in metas} == \
            manifests(cluster.remote_root, TOPIC, p)
        assert metas[0].start_offset == 0 and metas[-1].end_offset + 1 == local[p]
        assert all(a.end_offset + 1 == b.start_offset for a, b in zip(metas, metas[1:]))
        assert all(m.topic_id_partition.partition == p for m in metas)
        assert [(m, m.start_offset, m.end_offset + 1) for m in metas] == segment_read_ranges(metas)


def test_lineage_drops_superseded_copies_and_clips_partly_overlapped_ones():
    import uuid

    from strata.common.types import TopicIdPartition, TopicPartition
    from strata.spark.remote_segments import _current_lineage, _finished
    from strata.tiered.api import (
        RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
        RemoteLogSegmentState)
    from strata.tiered.metadata.cache import RemotePartitionMetadataStore
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition(TOPIC, 0))
    store = RemotePartitionMetadataStore()

    def copied(start: int, end: int, epochs: dict[int, int]) -> RemoteLogSegmentMetadata:
        meta = RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, uuid.uuid4()), start, end, 0, 1, 0,
                                        100, segment_leader_epochs=epochs)
        store.handle(meta)
        store.handle(RemoteLogSegmentMetadataUpdate(
            meta.remote_log_segment_id, 0, None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1))
        return meta

    a = copied(0, 99, {0: 0})
    b = copied(100, 199, {0: 100})
    again = copied(100, 199, {0: 100})              # the same range copied again: wins
    newer = copied(150, 249, {0: 150, 1: 200})      # a new leader's epoch from 200
    lineage = _current_lineage(_finished(store, tip))
    ids = [m.remote_log_segment_id for m in lineage]
    assert ids == [x.remote_log_segment_id for x in (a, again, newer)]
    assert b.remote_log_segment_id not in ids
    assert [(s, e) for _, s, e in segment_read_ranges(lineage)] == [(0, 100), (100, 150), (150, 250)]


def test_segments_outside_the_leaders_epoch_lineage_are_not_read_directly():
    """An unclean election leaves an old leader's copies of offsets the new leader's log
    holds other records at; Kafka's expirer keeps them until retention. The planner reads a
    segment straight from the bucket only where the leader's OffsetForLeaderEpoch answers
    say its log holds the segment's epochs exactly there."""
    import uuid

    from strata.common.types import TopicIdPartition, TopicPartition
    from strata.spark.remote_segments import within_leader_lineage
    from strata.tiered.api import RemoteLogSegmentId, RemoteLogSegmentMetadata
    tip = TopicIdPartition(uuid.uuid4(), TopicPartition(TOPIC, 0))

    def seg(start: int, end: int, epochs: dict[int, int]) -> RemoteLogSegmentMetadata:
        return RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, uuid.uuid4()), start, end, 0, 1,
                                        0, 100, segment_leader_epochs=epochs)
    # the leader's log: epoch 0 on [0, 1000), epoch 4 from 1000 (epoch 3 was the old leader's,
    # whose records past 1000 the leader never had), log end 3000
    ends = {(0, 0): (0, 1000), (0, 3): (0, 1000), (0, 4): (4, 3000)}
    assert within_leader_lineage(seg(0, 999, {0: 0}), 0, ends)
    assert within_leader_lineage(seg(900, 1999, {0: 900, 4: 1000}), 0, ends)
    assert not within_leader_lineage(seg(0, 1499, {0: 0}), 0, ends)        # epoch 0 past 1000
    assert not within_leader_lineage(seg(800, 1499, {0: 800, 3: 1000}), 0, ends)  # epoch 3
    assert not within_leader_lineage(seg(2000, 3000, {4: 2000}), 0, ends)  # past the log end
    assert not within_leader_lineage(seg(0, 99, {0: 0}), 1, ends)          # nothing asked


def test_segment_metadata_pickles_and_the_reader_refuses_to(cluster):
    with client(cluster) as c:
        meta = remote_segments(c, TOPIC)[0][3]
        assert pickle.loads(pickle.dumps(meta)) == meta
        copy = pickle.loads(pickle.dumps(c))              # connections stay behind
        with copy:
            assert copy.list_offsets(TOPIC, [0], -2) == {0: 0}
    with reader(cluster) as r:
        with pytest.raises(TypeError, match="not picklable"):
            pickle.dumps(r)


# ---- reading both tiers ------------------------------------------------------------------------

def test_remote_segments_and_the_local_tail_give_exactly_the_produced_records(cluster):
    with reader(cluster) as r:
        with client(cluster) as c:
            segments = remote_segments(c, TOPIC)
            latest = c.list_offsets(TOPIC, [0, 1], -1)
            for p in range(PARTITIONS):
                got = []
                for meta, start, end in segment_read_ranges(segments[p]):
                    got += decoded(r.read(meta, start, end), p, start, end)
                tail = segments[p][-1].end_offset + 1
                got += decoded(c.read_range(TOPIC, p, tail, latest[p]), p, tail, latest[p])
                assert as_sent(got) == cluster.sent[p]


def test_read_range_alone_reads_both_tiers_through_the_broker(cluster):
    with client(cluster, timeout_s=60) as c:
        for p in range(PARTITIONS):
            end = len(cluster.sent[p])
            chunks = list(c.read_range(TOPIC, p, 0, end, max_bytes=64 * 1024))
            assert len(chunks) > 1
            assert as_sent(decoded(chunks, p, 0, end)) == cluster.sent[p]
            middle = decoded(c.read_range(TOPIC, p, 101, 257), p, 101, 257)
            assert as_sent(middle) == cluster.sent[p][101:257]


def test_part_of_a_segment_is_read_from_its_offset_index_position(cluster):
    with reader(cluster) as r:
        with client(cluster) as c:
            meta = remote_segments(c, TOPIC)[1][4]
        positions = r.offset_positions(meta)
        assert len(positions) >= 3                         # index.interval.bytes=1024
        assert all(meta.start_offset <= o <= meta.end_offset for o, _ in positions)
        assert [pos for _, pos in positions] == sorted({pos for _, pos in positions})
        cut = positions[1][0] + 1                          # where an indexed batch ends
        for start, end in ((meta.start_offset, cut), (cut, meta.end_offset + 1),
                           (meta.start_offset + 3, meta.start_offset + 5)):
            chunks = list(r.read(meta, start, end))
            got = as_sent(decoded(chunks, 1, start, end))
            assert got == cluster.sent[1][start:end]
            first_batch_base = int.from_bytes(chunks[0][:8], "big")
            assert first_batch_base <= start
        assert list(r.read(meta, meta.end_offset + 1, meta.end_offset + 10)) == []


def piece_reader(c: Cluster, monkeypatch, piece: int | None) -> RemoteSegmentReader:
    """A reader whose pieces are the RSM's chunks, viewed in place (``piece`` None), or reads
    of ``piece`` bytes into its own buffer (its RSM then returns plain streams)."""
    r = reader(c)
    if piece is not None:
        import strata.spark.remote_segments as rs
        monkeypatch.setattr(rs, "READ_PIECE_BYTES", piece)
        fetch = r.rsm.fetch_log_segment
        monkeypatch.setattr(r.rsm, "fetch_log_segment", lambda *a: io.BytesIO(fetch(*a).read()))
    return r


@pytest.mark.parametrize("piece", [None, 1000, 5000])
def test_batches_cut_by_piece_ends_are_joined_and_every_piece_ends_at_a_batch_boundary(
        cluster, monkeypatch, piece):
    """None: the pieces are the RSM's chunks (CHUNK_SIZE, viewed in place); a number: reads
    of that size into the reader's buffer. Either way batches straddle the piece ends."""
    with piece_reader(cluster, monkeypatch, piece) as r:
        with client(cluster) as c:
            meta = remote_segments(c, TOPIC)[0][2]
        chunks = list(r.read(meta, meta.start_offset, meta.end_offset + 1))
        assert len(chunks) > 1
        got = as_sent(decoded(chunks, 0, meta.start_offset, meta.end_offset + 1))
        assert got == cluster.sent[0][meta.start_offset:meta.end_offset + 1]


@pytest.mark.parametrize("piece", [None, 1000, 5000, 1 << 20])
def test_views_decoded_one_at_a_time_give_what_read_gives(cluster, monkeypatch, piece):
    with piece_reader(cluster, monkeypatch, piece) as r:
        with client(cluster) as c:
            meta = remote_segments(c, TOPIC)[1][3]
        start, end = meta.start_offset + 2, meta.end_offset + 1
        got, owners = [], []
        for view in r.views(meta, start, end):         # as read_task consumes them
            owners.append(view.obj)
            got += decoded([view], 1, start, end)
        assert as_sent(got) == cluster.sent[1][start:end]
        assert got == decoded(r.read(meta, start, end), 1, start, end)
        if piece is None:       # chunks in place; only batches cut by a chunk's end are copied
            assert sum(not isinstance(o, bytearray) for o in owners) >= 2
        elif piece == 1 << 20:
            assert len({id(o) for o in owners}) == 1   # no batch outgrew it: one buffer


def test_a_read_ahead_hint_never_fails_and_the_read_after_it_is_exact(cluster):
    import dataclasses
    import uuid
    from strata.tiered.api import RemoteLogSegmentId
    with reader(cluster) as r:
        with client(cluster) as c:
            metas = remote_segments(c, TOPIC)[0][5:7]
        gone = dataclasses.replace(metas[0], remote_log_segment_id=RemoteLogSegmentId(
            metas[0].remote_log_segment_id.topic_id_partition, uuid.uuid4()))
        r.prefetch(gone, gone.start_offset)             # errors are left for a read
        for meta in metas:
            r.prefetch(meta, meta.start_offset + 1)
        for meta in metas:
            start, end = meta.start_offset + 1, meta.end_offset + 1
            assert as_sent(decoded(r.views(meta, start, end), 0, start, end)) == \
                cluster.sent[0][start:end]
        with pytest.raises(DataLossError):
            list(r.views(gone, gone.start_offset, gone.end_offset + 1))


# ---- configuration -----------------------------------------------------------------------------

def test_rsm_props_come_from_options_in_any_case_or_from_the_brokers_server_properties(cluster, tmp_path):
    uri = cluster.remote_root.as_uri()
    assert rsm_props_from_options({"bootstrap.servers": cluster.bootstrap}) is None
    spark_style = rsm_props_from_options({"rsm.config.storage.url": uri,
                                          "Remote.Log.Storage.Manager.Class.Name":
                                          "strata.tiered.storage.ObjectStoreRemoteStorageManager"})
    assert spark_style == {"rsm.config.storage.url": uri, "remote.log.storage.manager.class.name":
                           "strata.tiered.storage.ObjectStoreRemoteStorageManager"}
    custom = rsm_props_from_options({"remote.log.storage.manager.impl.prefix": "tier.",
                                     "tier.storage.url": uri, "rsm.config.ignored": "x"})
    assert custom["rsm.config.storage.url"] == uri and "rsm.config.ignored" not in custom

    props_file = tmp_path / "server.properties"
    props_file.write_text(
        "remote.log.storage.system.enable=true\n"
        f"log.dirs={cluster.broker.data_dir / 'kafka-logs'}\n"
        f"rsm.config.chunk.cache.disk.path={tmp_path / 'broker-cache'}\n"
        "rsm.config.chunk.cache.disk.size=1048576\n"
        "rsm.config.chunk.size=65536\n")
    from_file = rsm_props_from_options({"strata.server.properties": str(props_file)})
    assert from_file["rsm.config.storage.url"] == uri          # <first log dir>/remote-storage
    assert from_file["rsm.config.chunk.size"] == "65536"
    assert not [k for k in from_file if "chunk.cache.disk" in k]
    overridden = rsm_props_from_options({"strata.server.properties": str(props_file),
                                         "rsm.config.chunk.size": "4096"})
    assert overridden["rsm.config.chunk.size"] == "4096"
    props_file.write_text(f"log.dirs={cluster.broker.data_dir / 'kafka-logs'}\n")
    assert rsm_props_from_options({"strata.server.properties": str(props_file)}) is None

    with RemoteSegmentReader(from_file) as r:
        with client(cluster) as c:
            meta = remote_segments(c, TOPIC)[0][0]
        got = decoded(r.read(meta, 0, meta.end_offset + 1), 0, 0, meta.end_offset + 1)
        assert as_sent(got) == cluster.sent[0][:meta.end_offset + 1]


# ---- data loss ---------------------------------------------------------------------------------

def test_a_deleted_segment_object_fails_with_data_loss_naming_the_segment(cluster):
    with client(cluster) as c:
        meta = remote_segments(c, TOPIC)[1][5]
    seg = uuid_to_kafka_str(meta.remote_log_segment_id.id)
    objects = sorted(cluster.remote_root.glob(f"{TOPIC}-*/1/*-{seg}.*"))
    assert [o.suffix for o in objects] == [".indexes", ".log", ".rsm-manifest"]
    cases = {"the log object": [o for o in objects if o.suffix == ".log"], "every object": objects}
    for what, gone in cases.items():
        for o in gone:
            o.rename(o.with_name(o.name + ".hidden"))
        try:
            with reader(cluster) as r, pytest.raises(DataLossError) as err:   # nothing cached
                list(r.read(meta, meta.start_offset, meta.end_offset + 1))
        finally:
            for o in gone:
                o.with_name(o.name + ".hidden").rename(o)
        message = str(err.value)
        assert seg in message and str(meta.remote_log_segment_id.id) in message, what
        assert f"{TOPIC}-1" in message
        assert f"[{meta.start_offset}, {meta.end_offset + 1})" in message
        assert (err.value.topic, err.value.partition) == (TOPIC, 1)


def test_offsets_below_the_log_start_are_data_loss_naming_where_to_resume(cluster):
    topic = "reading-trimmed"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    acked = produce(cluster.bootstrap, topic, range(100), 1, "lz4")
    assert len(acked) == 100
    assert list(admin.delete_records([CkTp(topic, 0, 40)]).values())[0].result(30) \
        .low_watermark == 40
    with client(cluster) as c:
        with pytest.raises(DataLossError) as err:
            list(c.read_range(topic, 0, 0, 100))
        assert f"{topic}-0" in str(err.value) and "[0, 40)" in str(err.value)
        assert (err.value.start, err.value.end) == (0, 40)
        resume = err.value.end                             # what a reader that carries on does
        rows = [r for chunk in c.read_range(topic, 0, resume, 100)
                for b in batches_to_arrow(chunk, topic, 0, resume, 100) for r in b.to_pylist()]
        assert [r["offset"] for r in rows] == list(range(40, 100))


def test_reading_past_the_high_watermark_gives_up_after_the_timeout(cluster):
    with client(cluster, timeout_s=1) as c:
        end = len(cluster.sent[0])
        with pytest.raises(TimeoutError, match=f"{TOPIC}-0"):
            for _ in c.read_range(TOPIC, 0, end - 3, end + 5):
                pass


def test_the_client_reconnects_after_the_broker_restarts(cluster):
    with client(cluster) as c:
        before = c.list_offsets(TOPIC, [0, 1], -1)
        cluster.broker.stop()
        cluster.broker.start()
        assert c.list_offsets(TOPIC, [0, 1], -1) == before
        end = before[0]
        assert as_sent(decoded(c.read_range(TOPIC, 0, end - 10, end), 0, end - 10, end)) == \
            cluster.sent[0][-10:]
