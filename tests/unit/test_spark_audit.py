"""The audit's reconciliation (``audit_store``) over a real tiered log: segments copied by the
RemoteLogManager through Strata's object-store RSM into a memory store, the metadata from the
topic-based metadata manager; the broker and Spark parts are in the integration tests."""

from __future__ import annotations

import json
import uuid

import pytest

from strata.common.clock import MockClock
from strata.common.types import uuid_to_kafka_str as kafka_str
from strata.spark.pipelines.audit import (
    AuditReport, OrphanObject, SegmentCheck, _windows, audit_store, parse_key, verify_segment)
from strata.tiered.api import (
    RemoteLogSegmentId, RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState)
from tiered_env import T0, TIP, TOPIC_ID, TieredEnv

TOPICS = {"orders": TOPIC_ID}
HOUR = 3_600_000


@pytest.fixture
def env(tmp_path):
    env = TieredEnv(tmp_path)
    # small chunks: several per segment, so windows and chunk ids are exercised
    env.rsm.configure({"chunk.size": "700"})
    env.produce(60, size=150)
    assert env.copy() >= 3
    yield env
    env.close()


def segments(env) -> list[RemoteLogSegmentMetadata]:
    return list(env.rlmm.list_remote_log_segments(TIP))


def run(env, listing=None, **kwargs) -> AuditReport:
    kwargs.setdefault("clock", env.clock)
    return audit_store(env.rsm, env.store.list("") if listing is None else listing, segments(env),
                       TOPICS, **kwargs)


def flip(env, key: str, position: int) -> None:
    data = bytearray(env.store.get(key))
    data[position] ^= 0xFF
    env.store.put(key, bytes(data))


def test_a_clean_tier_reports_nothing_and_verifies_every_chunk(env):
    report = run(env)
    assert report.ok and report.problems == 0
    segs = segments(env)
    assert report.segments == len(segs) and report.objects == 3 * len(segs)
    want_chunks = sum(-(-m.segment_size_in_bytes // 700) for m in segs)
    assert report.chunks_verified == want_chunks > len(segs)
    assert (report.missing, report.orphans, report.size_mismatches, report.corrupt_chunks) == \
        ([], [], [], [])


def test_compressed_and_encrypted_segments_are_verified_on_their_stored_bytes(tmp_path):
    env = TieredEnv(tmp_path)
    try:
        env.rsm.configure({"chunk.size": "700", "compression.enabled": "true"})
        env.produce(40, size=150)
        env.copy()
        report = run(env)
        assert report.ok and report.chunks_verified > report.segments > 0
        seg = segments(env)[0]
        flip(env, env.rsm.object_key(seg, "log"), 3)
        bad = run(env).corrupt_chunks
        assert [(c.segment_id, c.part, c.chunk_id) for c in bad] == \
            [(kafka_str(seg.remote_log_segment_id.id), "chunk 0", 0)]
    finally:
        env.close()


def test_a_deleted_log_object_an_orphan_and_a_flipped_byte_are_exactly_what_is_reported(env):
    a, b = segments(env)[:2]
    env.store.delete(env.rsm.object_key(a, "log"))
    flip(env, env.rsm.object_key(b, "log"), 700 + 5)              # inside chunk 1
    orphan = (f"orders-{kafka_str(TOPIC_ID)}/0/{0:020d}-{kafka_str(uuid.uuid4())}.log")
    env.store.put(orphan, b"left behind")
    report = run(env)
    assert [(m.segment_id, m.key) for m in report.missing] == \
        [(kafka_str(a.remote_log_segment_id.id), env.rsm.object_key(a, "log"))]
    assert [(o.key, o.reason, o.deletable) for o in report.orphans] == \
        [(orphan, "no remote log metadata for this segment", True)]
    assert [(c.segment_id, c.part, c.chunk_id, c.key) for c in report.corrupt_chunks] == \
        [(kafka_str(b.remote_log_segment_id.id), "chunk 1", 1, env.rsm.object_key(b, "log"))]
    assert report.size_mismatches == [] and report.problems == 3


def test_delete_orphans_deletes_only_orphans_and_never_foreign_keys(env):
    live = dict(env.store.list(""))
    orphan = f"orders-{kafka_str(TOPIC_ID)}/0/{0:020d}-{kafka_str(uuid.uuid4())}.indexes"
    gone_topic = f"orders-{kafka_str(uuid.uuid4())}/0/{0:020d}-{kafka_str(uuid.uuid4())}.log"
    foreign = "backups/readme.txt"
    for key in (orphan, gone_topic, foreign):
        env.store.put(key, b"x")
    report = run(env, delete_orphans=True)
    reasons = {o.key: (o.reason, o.deletable) for o in report.orphans}
    assert reasons == {orphan: ("no remote log metadata for this segment", True),
                       gone_topic: ("no live topic has this topic id", True),
                       foreign: ("not a segment object of the RSM's layout", False)}
    assert sorted(report.deleted_orphans) == sorted([orphan, gone_topic])
    assert dict(env.store.list("")) == {**live, foreign: 1}
    assert report.problems == 1          # the foreign key is still there
    assert run(env).orphans == [OrphanObject(foreign, 1, "not a segment object of the RSM's layout",
                                             deletable=False)]


def test_the_buckets_manifests_are_neither_orphans_nor_foreign_keys(env):
    for key in ("_strata/cluster", f"_strata/partitions/orders-{kafka_str(TOPIC_ID)}/0/pointer"):
        env.store.put(key, b"x")
    report = run(env, delete_orphans=True)
    assert report.orphans == [] and report.deleted_orphans == []
    assert env.store.get("_strata/cluster") == b"x"


def test_a_size_mismatch_between_manifest_and_objects_is_reported_and_skips_the_crc_check(env):
    seg = segments(env)[0]
    key = env.rsm.object_key(seg, "indexes")
    env.store.put(key, env.store.get(key)[:-1])
    report = run(env)
    assert [(s.what, s.key, s.actual - s.expected) for s in report.size_mismatches] == \
        [("indexes object", key, -1)]
    assert report.corrupt_chunks == []


def test_a_corrupt_index_and_an_unreadable_manifest_are_corrupt_parts(env):
    a, b = segments(env)[:2]
    flip(env, env.rsm.object_key(a, "indexes"), 0)
    env.store.put(env.rsm.object_key(b, "rsm-manifest"), b"{not json")
    parts = {(c.segment_id, c.part) for c in run(env).corrupt_chunks}
    assert parts == {(kafka_str(a.remote_log_segment_id.id), "index OFFSET"),
                     (kafka_str(b.remote_log_segment_id.id), "manifest")}


def dangling_copy(env, clock: MockClock) -> RemoteLogSegmentMetadata:
    """A COPY_SEGMENT_STARTED segment with its objects written, never finished."""
    done = segments(env)[-1]
    meta = RemoteLogSegmentMetadata(
        RemoteLogSegmentId.generate_new(TIP), done.end_offset + 1, done.end_offset + 5,
        T0, 1, clock.milliseconds(), 100, segment_leader_epochs={0: done.end_offset + 1})
    env.rlmm.add_remote_log_segment_metadata(meta).result()
    for suffix in ("log", "indexes"):
        env.store.put(env.rsm.object_key(meta, suffix), b"partial")
    return meta


def test_an_unfinished_copy_is_in_flight_within_the_grace_and_an_orphan_after_it(env):
    clock = MockClock(T0 + HOUR)
    meta = dangling_copy(env, clock)
    assert run(env, clock=clock, grace_ms=HOUR).ok
    clock.sleep(HOUR / 1000)
    report = run(env, clock=clock, grace_ms=HOUR, delete_orphans=True)
    assert sorted((o.key, o.reason) for o in report.orphans) == sorted(
        (env.rsm.object_key(meta, s), "copy never finished") for s in ("log", "indexes"))
    assert report.problems == 0 and len(report.deleted_orphans) == 2
    assert not any(k.endswith(kafka_str(meta.remote_log_segment_id.id) + ".log")
                   for k, _ in env.store.list(""))


def test_objects_of_a_partition_being_deleted_are_not_orphans(env):
    stray = f"orders-{kafka_str(TOPIC_ID)}/0/{0:020d}-{kafka_str(uuid.uuid4())}.log"
    env.store.put(stray, b"x")
    env.rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
        TIP, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, T0, 1)).result()
    assert run(env, deleting={TIP}).orphans == []


def test_findings_the_broker_resolved_since_the_listing_are_not_reported(env):
    listing = list(env.store.list(""))
    stale = [(k, s) for k, s in listing if not k.endswith(".log")]   # listed before .log existed
    orphan = f"orders-{kafka_str(TOPIC_ID)}/0/{0:020d}-{kafka_str(uuid.uuid4())}.log"
    report = run(env, listing=stale + [(orphan, 3)])                 # orphan gone since
    assert report.missing == [] and report.orphans == []


def test_segment_keys_parse_back_to_their_parts(env):
    seg = segments(env)[0]
    parsed = parse_key(env.rsm.object_key(seg, "rsm-manifest"))
    assert parsed == (TIP.topic, TOPIC_ID, TIP.partition, seg.start_offset,
                      seg.remote_log_segment_id.id, "rsm-manifest")
    assert parse_key("orders-abc/0/x.log") is None
    assert parse_key("p/" + env.rsm.object_key(seg, "log"), "p/").suffix == "log"


def test_chunks_are_read_in_windows_of_whole_chunks():
    chunks = [(0, 10, 0), (10, 20, 0), (20, 45, 0), (45, 50, 0), (50, 51, 0)]
    assert list(_windows(chunks, 20)) == [[0, 1], [2], [3, 4]]
    assert list(_windows(chunks, 1000)) == [[0, 1, 2, 3, 4]]


def test_verify_segment_reads_across_windows_and_names_the_bad_chunk(env):
    seg = segments(env)[0]
    manifest = env.rsm._manifest(seg)
    from strata.spark.pipelines.audit import segment_check
    check: SegmentCheck = segment_check(env.rsm, seg, manifest)
    assert verify_segment(env.store, check, window=700) == (len(check.chunks), [])
    flip(env, check.log_key, check.chunks[-1][0])
    n, bad = verify_segment(env.store, check, window=1)
    assert n == len(check.chunks) and [c.chunk_id for c in bad] == [len(check.chunks) - 1]


def test_the_report_serialises_to_json_and_prints_a_table(env):
    seg = segments(env)[0]
    env.store.delete(env.rsm.object_key(seg, "indexes"))
    report = run(env)
    doc = json.loads(report.to_json())
    assert doc["problems"] == 1 and doc["missing"][0]["key"] == env.rsm.object_key(seg, "indexes")
    table = report.format_table()
    assert "1 problem(s)" in table and "MISSING OBJECTS (1)" in table
    assert env.rsm.object_key(seg, "indexes") in table


def rewrite_manifest(env, seg, **changes) -> None:
    """Change fields of ``seg``'s manifest JSON (None deletes one)."""
    key = env.rsm.object_key(seg, "rsm-manifest")
    doc = json.loads(env.store.get(key))
    for name, value in changes.items():
        if value is None:
            doc.pop(name, None)
        else:
            doc[name] = value
    env.store.put(key, json.dumps(doc).encode())


def test_segments_without_chunk_crcs_and_segments_batch_checked_at_the_copy_are_counted(env):
    segs = segments(env)
    report = run(env)
    assert (report.segments_without_crcs, report.segments_batch_checked) == (0, len(segs))
    old, unchecked = segs[:2]
    rewrite_manifest(env, old, version="1", chunkCrc32c=None, batchCrc32cChecked=None)
    rewrite_manifest(env, unchecked, batchCrc32cChecked=False)
    report = run(env)
    assert report.ok
    assert (report.segments_without_crcs, report.segments_batch_checked) == (1, len(segs) - 2)
    assert report.chunks_verified == sum(-(-m.segment_size_in_bytes // 700) for m in segs[1:])
    assert (f"chunks verified (1 segment(s) without chunk CRCs), 0 problem(s); record batches "
            f"CRC-checked at the copy in {len(segs) - 2} of {len(segs)} segments"
            in report.format_table())
    doc = json.loads(report.to_json())
    assert (doc["segments_without_crcs"], doc["segments_batch_checked"]) == (1, len(segs) - 2)
