"""ObjectStore backends and the object-store RemoteStorageManager: layout, round trips of real
segment files, commit order, cleanup on failure, idempotency, fault injection."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import threading
import uuid
from pathlib import Path

import crc32c
import obstore.store
import pytest

from strata.common.clock import MockClock
from strata.common.types import TopicIdPartition, TopicPartition
from strata.log.indexes import AbortedTxn
from strata.log.log_config import LogConfig
from strata.log.unified_log import UnifiedLog
from strata.protocol.records import SimpleRecord, build_batch, iter_headers
from strata.tiered.api import (
    IndexType, LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata,
    RemoteResourceNotFoundException, RemoteStorageException, RetriableRemoteStorageException)
from strata.tiered.storage import (
    FaultInjectingObjectStore, FileSystemObjectStore, MemoryObjectStore, ObjectStore,
    ObjectStoreRemoteStorageManager, ObstoreObjectStore, SegmentManifest, kafka_uuid_str,
    object_store_from_config)
from strata.tiered.storage.object_store import MeteredObjectStore, find_layer

T0 = 1_700_000_000_000
TOPIC_ID = uuid.UUID("8f3b2a4c-1d5e-4f60-9a7b-0c1d2e3f4a5b")   # "jzsqTB1eT2CaewwdLj9KWw"
SEGMENT_UUID = uuid.UUID("0123e456-789a-4bcd-8ef0-123456789abc")  # "ASPkVniaS82O8BI0VniavA"
TIP = TopicIdPartition(TOPIC_ID, TopicPartition("orders", 0))


# ---- helpers --------------------------------------------------------------------------------

class Segment:
    """A real inactive segment of a log (two leader epochs, idempotent producer, an aborted
    transaction in its transaction index) and its remote metadata."""

    def __init__(self, directory: Path, *, with_txn_index: bool = True, batches: int = 80,
                 tip: TopicIdPartition = TIP, segment_uuid: uuid.UUID | None = None) -> None:
        ulog = UnifiedLog(directory / f"{tip.topic}-{tip.partition}",
                          LogConfig({"index.interval.bytes": 256}), clock=MockClock(T0))
        for i in range(batches):
            epoch = 0 if i < batches // 2 else 1
            ulog.append_as_leader(build_batch(
                [SimpleRecord(b"value-%d" % i * 8, b"k%d" % i, timestamp=T0 + i)],
                producer_id=7, producer_epoch=0, base_sequence=i), epoch)
        seg = ulog.local_log.active_segment
        ulog.roll()
        if with_txn_index:
            seg.update_txn_index(AbortedTxn(producer_id=9, first_offset=3, last_offset=10,
                                            last_stable_offset=3))
        ulog.flush()
        self.log = ulog
        self.directory = ulog.directory
        self.next_offset = ulog.log_end_offset
        self.data = LogSegmentData(
            log_segment=seg.log_path,
            offset_index=seg.offset_index.path,
            time_index=seg.time_index.path,
            transaction_index=seg.txn_index.path if with_txn_index else None,
            producer_snapshot_index=self.directory / f"{self.next_offset:020d}.snapshot",
            leader_epoch_index=(self.directory / "leader-epoch-checkpoint").read_bytes())
        self.bytes = seg.log_path.read_bytes()
        self.metadata = RemoteLogSegmentMetadata(
            RemoteLogSegmentId(tip, segment_uuid or uuid.uuid4()), 0, self.next_offset - 1,
            T0 + batches - 1, 0, T0, len(self.bytes),
            segment_leader_epochs={0: 0, 1: batches // 2})

    def expected_index(self, index_type: IndexType) -> bytes:
        d = self.data
        return {IndexType.OFFSET: lambda: d.offset_index.read_bytes(),
                IndexType.TIMESTAMP: lambda: d.time_index.read_bytes(),
                IndexType.PRODUCER_SNAPSHOT: lambda: d.producer_snapshot_index.read_bytes(),
                IndexType.LEADER_EPOCH: lambda: d.leader_epoch_index,
                IndexType.TRANSACTION: lambda: d.transaction_index.read_bytes()}[index_type]()


class RecordingObjectStore(ObjectStore):
    """Passes calls through and records ``(operation, key)`` in order."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    def put(self, key, data):
        self.calls.append(("put", key))
        self.inner.put(key, data)

    def put_file(self, key, path):
        self.calls.append(("put", key))
        self.inner.put_file(key, path)

    def get(self, key):
        self.calls.append(("get", key))
        return self.inner.get(key)

    def get_range(self, key, start, end_exclusive):
        self.calls.append(("get_range", key))
        return self.inner.get_range(key, start, end_exclusive)

    def size(self, key):
        return self.inner.size(key)

    def delete(self, key):
        self.calls.append(("delete", key))
        self.inner.delete(key)

    def delete_many(self, keys):
        for key in keys:
            self.delete(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def ops(self, op: str) -> list[str]:
        return [k for o, k in self.calls if o == op]


def suffixes(keys) -> list[str]:
    return [k.rsplit(".", 1)[1] for k in keys]


@pytest.fixture
def segment(tmp_path) -> Segment:
    return Segment(tmp_path / "logs")


@pytest.fixture(params=["filesystem", "memory"])
def rsm(request, tmp_path):
    if request.param == "filesystem":
        configs = {"storage.url": (tmp_path / "remote").as_uri(), "key.prefix": "tiered/"}
    else:
        configs = {"storage.url": "memory://", "key.prefix": "tiered/"}
    manager = ObjectStoreRemoteStorageManager()
    manager.configure(configs)
    yield manager
    manager.close()


def recording_rsm(store: ObjectStore | None = None, **configs) -> tuple[
        ObjectStoreRemoteStorageManager, RecordingObjectStore]:
    recorder = RecordingObjectStore(store or MemoryObjectStore())
    manager = ObjectStoreRemoteStorageManager(recorder)
    manager.configure(configs)
    return manager, recorder


# ---- round trips ----------------------------------------------------------------------------

def test_copy_then_fetch_returns_the_segment_bytes_whole_and_ranged(rsm, segment):
    assert rsm.copy_log_segment_data(segment.metadata, segment.data) is None
    meta, data = segment.metadata, segment.bytes
    with rsm.fetch_log_segment(meta, 0) as stream:
        assert stream.read() == data
    with rsm.fetch_log_segment(meta, 100, 499) as stream:
        assert stream.read() == data[100:500]
    with rsm.fetch_log_segment(meta, len(data) - 10, len(data) + 1000) as stream:
        assert stream.read() == data[-10:]
    with rsm.fetch_log_segment(meta, 7, 7) as stream:
        assert stream.read() == data[7:8]


def test_fetch_starting_past_the_end_is_an_empty_stream(rsm, segment):
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    assert rsm.fetch_log_segment(segment.metadata, len(segment.bytes)).read() == b""
    assert rsm.fetch_log_segment(segment.metadata, len(segment.bytes) + 50, None).read() == b""


def test_fetch_rejects_negative_or_inverted_positions(rsm, segment):
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(segment.metadata, -1)
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(segment.metadata, 10, 9)


@pytest.mark.parametrize("index_type", list(IndexType))
def test_fetch_index_returns_the_source_bytes(rsm, segment, index_type):
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    expected = segment.expected_index(index_type)
    assert expected, "the fixture should give every index some content"
    with rsm.fetch_index(segment.metadata, index_type) as stream:
        assert stream.read() == expected


def test_missing_transaction_index_raises_resource_not_found(rsm, tmp_path):
    seg = Segment(tmp_path / "logs", with_txn_index=False)
    rsm.copy_log_segment_data(seg.metadata, seg.data)
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(seg.metadata, IndexType.TRANSACTION)
    # The other indexes are still there.
    assert rsm.fetch_index(seg.metadata, IndexType.LEADER_EPOCH).read() == seg.data.leader_epoch_index


def test_an_empty_index_round_trips_as_an_empty_stream(rsm, segment):
    data = LogSegmentData(segment.data.log_segment, segment.data.offset_index,
                          segment.data.time_index, None, segment.data.producer_snapshot_index,
                          b"")
    rsm.copy_log_segment_data(segment.metadata, data)
    assert rsm.fetch_index(segment.metadata, IndexType.LEADER_EPOCH).read() == b""


def test_segment_stream_is_fetched_chunk_by_chunk_as_it_is_read(segment):
    manager, recorder = recording_rsm(**{"chunk.size": 1000})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    recorder.calls.clear()
    stream = manager.fetch_log_segment(segment.metadata, 0)
    assert len(recorder.ops("get_range")) == 1        # only the first chunk so far
    got = stream.read(100) + stream.read(2500)
    assert got == segment.bytes[:2600]
    assert len(recorder.ops("get_range")) == 3
    got += stream.read()
    assert got == segment.bytes
    assert len(recorder.ops("get_range")) == -(-len(segment.bytes) // 1000)
    assert stream.read() == b""


def test_a_seek_over_whole_chunks_never_fetches_them(segment):
    manager, recorder = recording_rsm(**{"chunk.size": 1000})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    assert len(segment.bytes) > 4500
    recorder.calls.clear()
    stream = manager.fetch_log_segment(segment.metadata, 300)
    assert stream.seekable() and stream.tell() == 0
    assert stream.seek(500, io.SEEK_CUR) == 500             # inside the loaded chunk
    assert stream.read(10) == segment.bytes[800:810]
    assert stream.seek(3650) == 3650                        # into chunk 3, past 1 and 2
    assert stream.tell() == 3650
    assert stream.read(400) == segment.bytes[3950:4350]
    assert len(recorder.ops("get_range")) == 3              # chunks 0, 3 and 4 only
    assert stream.seek(100) == 100 and stream.read(5) == segment.bytes[400:405]   # back
    assert stream.seek(-20, io.SEEK_END) == len(segment.bytes) - 320
    assert stream.read() == segment.bytes[-20:]
    assert stream.seek(10**9) == len(segment.bytes) - 300 and stream.read() == b""
    with pytest.raises(ValueError):
        stream.seek(0, 7)
    small = manager.fetch_log_segment(segment.metadata, 10, 500)     # inside one chunk
    assert small.seek(100) == 100 and small.read(5) == segment.bytes[110:115]
    assert small.seek(-1, io.SEEK_END) == 490 and small.read() == segment.bytes[500:501]
    with pytest.raises(ValueError):
        small.seek(0, 7)


def test_fetch_of_a_segment_never_copied_raises_resource_not_found(rsm, segment):
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_log_segment(segment.metadata, 0)
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(segment.metadata, IndexType.OFFSET)


def test_a_segment_without_manifest_is_incomplete_and_not_readable(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    recorder.inner.delete(manager.object_key(segment.metadata, "rsm-manifest"))
    fresh = ObjectStoreRemoteStorageManager(recorder.inner)   # no cached manifest
    fresh.configure({})
    with pytest.raises(RemoteResourceNotFoundException):
        fresh.fetch_log_segment(segment.metadata, 0)


# ---- layout and manifest --------------------------------------------------------------------

def test_layout_keys_are_exactly_aivens(segment):
    seg_meta = RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TIP, SEGMENT_UUID), 1234, 2000, T0, 0, T0, 10,
        segment_leader_epochs={0: 1234})
    manager, _ = recording_rsm(**{"key.prefix": "tiered/"})
    base = "tiered/orders-jzsqTB1eT2CaewwdLj9KWw/0/00000000000000001234-ASPkVniaS82O8BI0VniavA"
    assert manager.object_key(seg_meta, "log") == base + ".log"
    assert manager.object_key(seg_meta, "indexes") == base + ".indexes"
    assert manager.object_key(seg_meta, "rsm-manifest") == base + ".rsm-manifest"
    assert manager.partition_prefix(TIP) == "tiered/orders-jzsqTB1eT2CaewwdLj9KWw/0/"
    assert kafka_uuid_str(TOPIC_ID) == "jzsqTB1eT2CaewwdLj9KWw"


def test_copy_writes_exactly_three_objects_with_the_default_empty_prefix(tmp_path, segment):
    store = FileSystemObjectStore(tmp_path / "remote")
    manager = ObjectStoreRemoteStorageManager(store)
    manager.configure({})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    seg_id = kafka_uuid_str(segment.metadata.remote_log_segment_id.id)
    base = f"orders-{kafka_uuid_str(TOPIC_ID)}/0/00000000000000000000-{seg_id}"
    listed = dict(store.list(""))
    assert sorted(listed) == sorted(f"{base}.{s}" for s in ("log", "indexes", "rsm-manifest"))
    assert listed[f"{base}.log"] == len(segment.bytes)
    assert (tmp_path / "remote" / f"{base}.log").read_bytes() == segment.bytes


def test_manifest_is_written_last_after_log_and_indexes(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    assert suffixes(recorder.ops("put")) == ["log", "indexes", "rsm-manifest"]


def test_manifest_holds_version_size_chunk_index_crcs_and_index_positions(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    raw = recorder.inner.get(manager.object_key(segment.metadata, "rsm-manifest"))
    doc = json.loads(raw)
    size = len(segment.bytes)
    chunk = 4 * 1024 * 1024
    assert size < chunk
    assert doc["version"] == "2"
    assert doc["segmentSize"] == size
    assert doc["compression"] is False
    assert "encryption" not in doc
    assert doc["chunkIndex"] == {"type": "fixed", "originalChunkSize": chunk,
                                 "originalFileSize": size, "transformedChunkSize": chunk,
                                 "finalTransformedChunkSize": size}
    assert base64.b64decode(doc["chunkCrc32c"]) == crc32c.crc32c(segment.bytes).to_bytes(4, "big")
    indexes = doc["segmentIndexes"]
    blob = recorder.inner.get(manager.object_key(segment.metadata, "indexes"))
    position = 0
    for name, index_type in [("offset", IndexType.OFFSET), ("timestamp", IndexType.TIMESTAMP),
                             ("producerSnapshot", IndexType.PRODUCER_SNAPSHOT),
                             ("leaderEpoch", IndexType.LEADER_EPOCH),
                             ("transaction", IndexType.TRANSACTION)]:
        expected = segment.expected_index(index_type)
        assert indexes[name] == {"position": position, "size": len(expected),
                                 "crc32c": crc32c.crc32c(expected)}
        assert blob[position:position + len(expected)] == expected
        position += len(expected)
    assert len(blob) == position
    assert SegmentManifest.from_json(raw).segment_size == size


def damaged_copy(segment: Segment, directory: Path, position: int) -> Segment:
    """``segment`` with one byte of its .log flipped at ``position`` (a copy on disk)."""
    body = bytearray(segment.bytes)
    body[position] ^= 0xFF
    path = directory / "damaged.log"
    path.write_bytes(bytes(body))
    segment.data = dataclasses.replace(segment.data, log_segment=path)
    segment.bytes = bytes(body)
    return segment


def test_a_segment_whose_batches_all_pass_their_crcs_is_copied_as_vouched_for(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    raw = recorder.inner.get(manager.object_key(segment.metadata, "rsm-manifest"))
    assert json.loads(raw)["batchCrc32cChecked"] is True
    assert SegmentManifest.from_json(raw).batch_crcs_checked
    assert manager.batches_verified(segment.metadata)


def test_a_segment_with_a_corrupt_batch_is_copied_unchanged_but_not_vouched_for(tmp_path, caplog):
    seg = Segment(tmp_path / "logs")
    third = list(iter_headers(seg.bytes))[2]
    damaged_copy(seg, tmp_path, third.position + third.size - 1)      # its last record byte
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(seg.metadata, seg.data)
    raw = recorder.inner.get(manager.object_key(seg.metadata, "rsm-manifest"))
    assert json.loads(raw)["batchCrc32cChecked"] is False
    assert not manager.batches_verified(seg.metadata)
    assert f"the batch at byte {third.position} is malformed or fails its CRC32C" in caplog.text
    with manager.fetch_log_segment(seg.metadata, 0) as stream:
        assert stream.read() == seg.bytes


def test_manifests_without_the_batch_check_flag_are_not_vouched_for(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    key = manager.object_key(segment.metadata, "rsm-manifest")
    doc = json.loads(recorder.inner.get(key))
    del doc["batchCrc32cChecked"]                # as Strata wrote manifests before the flag
    other = ObjectStoreRemoteStorageManager(recorder.inner)
    other.configure({})
    recorder.inner.put(key, json.dumps(doc).encode())
    assert not other.batches_verified(segment.metadata)
    doc["batchCrc32cChecked"] = "yes"
    with pytest.raises(ValueError, match="batchCrc32cChecked"):
        SegmentManifest.from_json(json.dumps(doc))


def test_manifest_of_a_segment_without_transaction_index_has_none(tmp_path):
    seg = Segment(tmp_path / "logs", with_txn_index=False)
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(seg.metadata, seg.data)
    raw = recorder.inner.get(manager.object_key(seg.metadata, "rsm-manifest"))
    assert json.loads(raw)["segmentIndexes"]["transaction"] is None
    assert IndexType.TRANSACTION not in SegmentManifest.from_json(raw).segment_indexes


def test_manifest_json_round_trips_and_rejects_other_versions(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    raw = recorder.inner.get(manager.object_key(segment.metadata, "rsm-manifest"))
    manifest = SegmentManifest.from_json(raw)
    assert SegmentManifest.from_json(manifest.to_json()) == manifest
    doc = json.loads(raw)
    doc["version"] = "3"
    with pytest.raises(ValueError):
        SegmentManifest.from_json(json.dumps(doc))
    with pytest.raises(ValueError):
        SegmentManifest.from_json(b"{not json")


def test_a_corrupt_manifest_is_a_storage_error(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    recorder.inner.put(manager.object_key(segment.metadata, "rsm-manifest"), b"garbage")
    fresh = ObjectStoreRemoteStorageManager(recorder.inner)
    fresh.configure({})
    with pytest.raises(RemoteStorageException) as err:
        fresh.fetch_index(segment.metadata, IndexType.OFFSET)
    assert not isinstance(err.value, RemoteResourceNotFoundException)


def test_manifests_are_cached_per_segment(segment):
    manager, recorder = recording_rsm(**{"manifest.cache.size": 2})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    recorder.calls.clear()
    for index_type in (IndexType.OFFSET, IndexType.TIMESTAMP):
        manager.fetch_index(segment.metadata, index_type)
    manager.fetch_log_segment(segment.metadata, 0).read()
    assert recorder.ops("get") == []     # the manifest came from the copy, then the cache


def test_partition_listing_covers_only_that_partition(segment, tmp_path):
    manager, _ = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    tip10 = TopicIdPartition(TOPIC_ID, TopicPartition("orders", 10))
    other = Segment(tmp_path / "other", tip=tip10)
    manager.copy_log_segment_data(other.metadata, other.data)
    objects = manager.list_partition_objects(TIP)
    assert suffixes(k for k, _ in objects) == ["indexes", "log", "rsm-manifest"]
    assert all(k.startswith(manager.partition_prefix(TIP)) for k, _ in objects)
    assert dict(objects)[manager.object_key(segment.metadata, "log")] == len(segment.bytes)
    assert len(manager.list_partition_objects(tip10)) == 3


# ---- failures, idempotency, delete ----------------------------------------------------------

@pytest.mark.parametrize("failing", ["rsm-manifest", "indexes", "log"])
def test_a_copy_failing_on_any_put_leaves_no_objects_behind(segment, failing):
    memory = MemoryObjectStore()
    faulty = FaultInjectingObjectStore(memory, fail_keys=rf"\.{failing}$")
    manager = ObjectStoreRemoteStorageManager(faulty)
    manager.configure({})
    with pytest.raises(RetriableRemoteStorageException):
        manager.copy_log_segment_data(segment.metadata, segment.data)
    assert memory.objects == {}
    # The retry (same metadata) succeeds once the store behaves.
    faulty.fail_keys = None
    manager.copy_log_segment_data(segment.metadata, segment.data)
    assert manager.fetch_log_segment(segment.metadata, 0).read() == segment.bytes


def test_a_copy_failing_on_a_missing_local_file_raises_and_cleans_up(segment):
    memory = MemoryObjectStore()
    manager = ObjectStoreRemoteStorageManager(memory)
    manager.configure({})
    segment.data.producer_snapshot_index.unlink()
    with pytest.raises(RemoteStorageException) as err:
        manager.copy_log_segment_data(segment.metadata, segment.data)
    assert not isinstance(err.value, RemoteResourceNotFoundException)
    assert memory.objects == {}


def test_copying_the_same_segment_twice_overwrites(rsm, segment):
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    assert len(rsm.list_partition_objects(TIP)) == 3
    assert rsm.fetch_log_segment(segment.metadata, 0).read() == segment.bytes
    assert rsm.fetch_index(segment.metadata, IndexType.OFFSET).read() == \
        segment.data.offset_index.read_bytes()


def test_delete_removes_everything_and_is_idempotent(rsm, segment):
    rsm.copy_log_segment_data(segment.metadata, segment.data)
    rsm.fetch_index(segment.metadata, IndexType.OFFSET)     # manifest now cached
    rsm.delete_log_segment_data(segment.metadata)
    rsm.delete_log_segment_data(segment.metadata)
    assert rsm.list_partition_objects(TIP) == []
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_log_segment(segment.metadata, 0)
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(segment.metadata, IndexType.OFFSET)


def test_delete_of_a_segment_never_copied_is_fine(rsm, segment):
    rsm.delete_log_segment_data(segment.metadata)


def test_delete_removes_the_manifest_first(segment):
    manager, recorder = recording_rsm()
    manager.copy_log_segment_data(segment.metadata, segment.data)
    manager.delete_log_segment_data(segment.metadata)
    assert suffixes(recorder.ops("delete")) == ["rsm-manifest", "log", "indexes"]


def test_delete_failure_raises_a_storage_exception(segment):
    faulty = FaultInjectingObjectStore(MemoryObjectStore())
    manager = ObjectStoreRemoteStorageManager(faulty)
    manager.configure({})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    faulty.set_outage(True)
    with pytest.raises(RetriableRemoteStorageException):
        manager.delete_log_segment_data(segment.metadata)
    faulty.set_outage(False)
    manager.delete_log_segment_data(segment.metadata)
    assert manager.list_partition_objects(TIP) == []


def test_concurrent_copies_and_fetches_from_several_threads(tmp_path):
    segments = [Segment(tmp_path / f"logs{i}", batches=30,
                        tip=TopicIdPartition(TOPIC_ID, TopicPartition("orders", i)))
                for i in range(4)]
    manager = ObjectStoreRemoteStorageManager()
    manager.configure({"storage.url": (tmp_path / "remote").as_uri(),
                       "manifest.cache.size": 2})
    errors: list[BaseException] = []

    def work(seg: Segment) -> None:
        try:
            for _ in range(3):
                manager.copy_log_segment_data(seg.metadata, seg.data)
                assert manager.fetch_log_segment(seg.metadata, 0).read() == seg.bytes
                assert manager.fetch_index(seg.metadata, IndexType.TIMESTAMP).read() == \
                    seg.data.time_index.read_bytes()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in segments]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- configuration --------------------------------------------------------------------------

def test_configure_builds_the_store_named_by_storage_url(tmp_path):
    # the backend sits under the always-on MeteredObjectStore
    fs = object_store_from_config({"storage.url": (tmp_path / "r").as_uri()})
    assert isinstance(fs, MeteredObjectStore)
    fs = find_layer(fs, FileSystemObjectStore)
    assert isinstance(fs, FileSystemObjectStore) and fs.root == tmp_path / "r"
    assert isinstance(object_store_from_config({"storage.url": "memory://"}).inner,
                      MemoryObjectStore)
    s3 = object_store_from_config({
        "storage.url": "s3://bucket/prefix", "storage.aws_endpoint": "http://127.0.0.1:1",
        "storage.aws_region": "us-east-1", "storage.aws_access_key_id": "a",
        "storage.aws_secret_access_key": "b", "storage.aws_allow_http": True,
        "storage.aws_virtual_hosted_style_request": "false", "storage.client.timeout": "2s",
        "storage.retry.max_retries": "1", "storage.retry.retry_timeout_ms": "500"})
    assert isinstance(find_layer(s3, ObstoreObjectStore), ObstoreObjectStore)


def test_configure_rejects_missing_or_unknown_urls_and_options():
    with pytest.raises(RemoteStorageException):
        ObjectStoreRemoteStorageManager().configure({})
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "ftp://host/x"})
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "memory://", "fault.bogus": "1"})
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "s3://b", "storage.retry.bogus": "1"})
    with pytest.raises(RemoteStorageException):
        object_store_from_config({"storage.url": "file:relative/dir"})
    for bad in ({"key.prefix": "/abs/"}, {"key.prefix": "a//b/"}, {"fetch.window.bytes": "0"},
                {"manifest.cache.size": "many"}, {"chunk.size": "0"}, {"chunk.size": "big"},
                {"compression.enabled": "yes"}, {"encryption.enabled": "true"},
                {"encryption.enabled": "true", "encryption.key.pair.id": "k1"},
                {"encryption.key.pairs": "k1"}):
        with pytest.raises(RemoteStorageException):
            ObjectStoreRemoteStorageManager(MemoryObjectStore()).configure(bad)


def test_fault_keys_wrap_the_store_in_a_fault_injector():
    store = object_store_from_config({
        "storage.url": "memory://", "fault.put.latency.ms": "5", "fault.get.latency.ms": "3",
        "fault.error.rate": "0.25", "fault.fail.keys": r"\.log$", "fault.delay.keys": "idx",
        "fault.delay.ms": "7"})
    store = find_layer(store, FaultInjectingObjectStore)
    assert isinstance(store, FaultInjectingObjectStore)
    assert isinstance(store.inner, MemoryObjectStore)
    assert (store.put_latency_ms, store.get_latency_ms, store.error_rate) == (5, 3, 0.25)
    assert (store.fail_keys, store.delay_keys, store.delay_ms) == (r"\.log$", "idx", 7)


# ---- ObjectStore contract, for every backend ------------------------------------------------

@pytest.fixture(params=["filesystem", "memory", "obstore-memory"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "filesystem":
        return FileSystemObjectStore(tmp_path / "objects")
    if request.param == "memory":
        return MemoryObjectStore()
    return ObstoreObjectStore(obstore.store.MemoryStore(), multipart_chunk_size=5 * 1024 * 1024)


def test_store_put_get_range_size(store):
    store.put("a/b/c.bin", b"0123456789")
    assert store.get("a/b/c.bin") == b"0123456789"
    assert store.size("a/b/c.bin") == 10
    assert store.get_range("a/b/c.bin", 2, 5) == b"234"
    assert store.get_range("a/b/c.bin", 8, 100) == b"89"
    assert store.get_range("a/b/c.bin", 10, 20) == b""
    assert store.get_range("a/b/c.bin", 50, 60) == b""
    assert store.get_range("a/b/c.bin", 4, 4) == b""
    store.put("a/b/c.bin", b"new")
    assert store.get("a/b/c.bin") == b"new"


def test_store_range_buffers_equal_get_range_and_outlive_the_object_being_replaced(store):
    big = os.urandom(1 << 20)      # large enough for the file system's mapped path
    store.put("k/big.log", big)
    ranges = [(0, 1 << 20), (1000, 700_000), (900_000, 2 << 20), (5, 9), (1 << 20, 2 << 20)]
    views = [store.get_range_buffer("k/big.log", a, b) for a, b in ranges]
    for (a, b), view in zip(ranges, views):
        assert view == big[a:b] == store.get_range("k/big.log", a, b)
        assert memoryview(view).readonly
    store.put("k/big.log", b"replaced")
    store.delete("k/big.log")
    assert [bytes(v) for v in views] == [big[a:b] for a, b in ranges]
    with pytest.raises(RemoteResourceNotFoundException):
        store.get_range_buffer("k/big.log", 0, 1 << 20)


def test_store_missing_objects_raise_resource_not_found(store):
    for call in (lambda: store.get("no/such"), lambda: store.size("no/such"),
                 lambda: store.get_range("no/such", 0, 5), lambda: store.get_range("no/such", 3, 3)):
        with pytest.raises(RemoteResourceNotFoundException):
            call()


def test_store_delete_of_missing_objects_is_fine(store):
    store.put("x/1", b"1")
    store.delete("x/missing")
    store.delete_many(["x/1", "x/missing", "y/2"])
    assert list(store.list("")) == []


def test_store_list_matches_plain_string_prefixes(store):
    for key in ("t-1/0/a.log", "t-1/0/b.log", "t-1/10/a.log", "t-12/0/a.log", "u/0/a.log"):
        store.put(key, b"x" * len(key))
    assert sorted(k for k, _ in store.list("t-1/")) == ["t-1/0/a.log", "t-1/0/b.log", "t-1/10/a.log"]
    assert sorted(k for k, _ in store.list("t-1/1")) == ["t-1/10/a.log"]
    assert sorted(k for k, _ in store.list("t-1")) == [
        "t-1/0/a.log", "t-1/0/b.log", "t-1/10/a.log", "t-12/0/a.log"]
    assert dict(store.list(""))["u/0/a.log"] == len("u/0/a.log")
    assert list(store.list("nothing/")) == []


def test_store_put_file_streams_big_files(store, tmp_path):
    src = tmp_path / "big.bin"
    payload = bytes(range(256)) * (24 * 1024 + 7)    # ~6 MiB, past one multipart chunk
    src.write_bytes(payload)
    store.put_file("big/one.log", src)
    assert store.size("big/one.log") == len(payload)
    assert store.get_range("big/one.log", 5_000_000, 5_000_100) == payload[5_000_000:5_000_100]
    assert store.get("big/one.log") == payload


def test_store_rejects_malformed_keys(store):
    for key in ("", "/abs", "a//b", "a/../b", "a/./b"):
        with pytest.raises(ValueError):
            store.put(key, b"x")


def test_filesystem_store_leaves_no_temporary_files_and_prunes_empty_directories(tmp_path):
    root = tmp_path / "objects"
    store = FileSystemObjectStore(root)
    store.put("a/b/c", b"1")
    store.put("a/b/c", b"2")
    assert [p.name for p in root.rglob("*") if p.is_file()] == ["c"]
    (root / "a" / "b" / "c.strata-tmp-deadbeef").write_bytes(b"partial")  # a crashed writer
    assert list(store.list("")) == [("a/b/c", 1)]
    (root / "a" / "b" / "c.strata-tmp-deadbeef").unlink()
    store.delete("a/b/c")
    store.put("a/x", b"1")
    store.delete("a/x")
    assert list(root.iterdir()) == []


def test_filesystem_store_failed_write_keeps_the_old_object(tmp_path):
    store = FileSystemObjectStore(tmp_path / "objects")
    store.put("k", b"old")
    with pytest.raises(RemoteStorageException):
        store.put_file("k", tmp_path / "does-not-exist")
    assert store.get("k") == b"old"


# ---- fault injection ------------------------------------------------------------------------

def test_outage_fails_every_call_retriably_without_reaching_the_store():
    inner = RecordingObjectStore(MemoryObjectStore())
    inner.inner.put("k", b"v")
    faulty = FaultInjectingObjectStore(inner)
    faulty.set_outage(True)
    for call in (lambda: faulty.get("k"), lambda: faulty.put("k", b"x"),
                 lambda: faulty.get_range("k", 0, 1), lambda: faulty.size("k"),
                 lambda: faulty.delete("k"), lambda: list(faulty.list(""))):
        with pytest.raises(RetriableRemoteStorageException):
            call()
    assert inner.calls == []
    assert faulty.injected_failures == 6
    faulty.set_outage(False)
    assert faulty.get("k") == b"v"


def test_fail_keys_fail_only_matching_keys():
    faulty = FaultInjectingObjectStore(MemoryObjectStore(), fail_keys=r"\.indexes$")
    faulty.put("s.log", b"1")
    with pytest.raises(RetriableRemoteStorageException):
        faulty.put("s.indexes", b"1")
    with pytest.raises(RetriableRemoteStorageException):
        faulty.delete_many(["s.log", "s.indexes"])
    assert faulty.get("s.log") == b"1"


def test_error_rate_fails_that_share_of_calls():
    always = FaultInjectingObjectStore(MemoryObjectStore(), error_rate=1.0)
    with pytest.raises(RetriableRemoteStorageException):
        always.put("k", b"v")
    never = FaultInjectingObjectStore(MemoryObjectStore(), error_rate=0.0)
    for i in range(100):
        never.put(f"k{i}", b"v")
    some = FaultInjectingObjectStore(MemoryObjectStore(), error_rate=0.3, seed=42)
    failures = 0
    for i in range(1000):
        try:
            some.put(f"k{i}", b"v")
        except RetriableRemoteStorageException:
            failures += 1
    assert 200 < failures < 400
    with pytest.raises(ValueError):
        FaultInjectingObjectStore(MemoryObjectStore(), error_rate=1.5)


def test_latency_and_key_delays_sleep_the_configured_time():
    slept: list[float] = []
    faulty = FaultInjectingObjectStore(MemoryObjectStore(), get_latency_ms=20, put_latency_ms=50,
                                       delay_keys=r"slow", delay_ms=300, sleep=slept.append)
    faulty.put("fast", b"1")
    assert slept == [0.05]
    faulty.get("fast")
    faulty.get_range("fast", 0, 1)
    assert slept == [0.05, 0.02, 0.02]
    slept.clear()
    faulty.put("slow", b"1")
    assert slept == [0.3, 0.05]
    slept.clear()
    faulty.delete("slow")
    assert slept == [0.3]


def test_rsm_fetch_through_an_outage_raises_retriable_then_recovers(segment):
    faulty = FaultInjectingObjectStore(MemoryObjectStore())
    manager = ObjectStoreRemoteStorageManager(faulty)
    manager.configure({})
    manager.copy_log_segment_data(segment.metadata, segment.data)
    faulty.set_outage(True)
    with pytest.raises(RetriableRemoteStorageException):
        manager.fetch_log_segment(segment.metadata, 0)
    with pytest.raises(RetriableRemoteStorageException):
        manager.copy_log_segment_data(segment.metadata, segment.data)
    faulty.set_outage(False)
    manager.copy_log_segment_data(segment.metadata, segment.data)
    assert manager.fetch_log_segment(segment.metadata, 0).read() == segment.bytes


# ---- leftovers of interrupted uploads ------------------------------------------------------

class _PipeSource:
    """A FIFO to upload from, fed by the test: the upload stays in progress until ``finish``."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "source.fifo"
        os.mkfifo(self.path)
        self._out = None

    def feed(self, data: bytes) -> None:
        if self._out is None:
            self._out = open(self.path, "wb")   # blocks until the upload opens the FIFO
        self._out.write(data)
        self._out.flush()

    def finish(self) -> None:
        self._out.close()


def _age(path: Path, seconds: float) -> None:
    past = path.stat().st_mtime - seconds
    os.utime(path, (past, past))


def test_filesystem_sweep_removes_old_temporary_files_but_never_a_put_in_progress(tmp_path):
    store = FileSystemObjectStore(tmp_path / "root")
    crashed = tmp_path / "root" / "t-AAAAAAAAAAAAAAAAAAAAAA" / "0" / "x.log.strata-tmp-dead"
    crashed.parent.mkdir(parents=True)
    crashed.write_bytes(b"half a segment")
    fresh = tmp_path / "root" / "other" / "y.log.strata-tmp-fresh"
    fresh.parent.mkdir(parents=True)
    fresh.write_bytes(b"another broker's upload")
    _age(crashed, 7200)

    source = _PipeSource(tmp_path)
    upload = threading.Thread(target=store.put_file, args=("busy/z.log", source.path))
    upload.start()
    source.feed(b"first half ")
    in_progress = tmp_path / "root" / "busy"
    for _ in range(3000):       # the upload is writing its temporary file
        if any(in_progress.glob("z.log.strata-tmp-*")):
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the upload never started writing")
    for tmp in in_progress.glob("z.log.strata-tmp-*"):
        _age(tmp, 7200)         # old, yet in progress in this process

    assert store.abort_incomplete_uploads("", older_than_ms=3_600_000) == [
        "t-AAAAAAAAAAAAAAAAAAAAAA/0/x.log"]
    assert not crashed.exists() and not crashed.parent.exists()   # empty directories pruned
    assert fresh.exists()
    assert store.abort_incomplete_uploads("busy/", older_than_ms=0) == []
    source.feed(b"second half")
    source.finish()
    upload.join()
    assert store.get("busy/z.log") == b"first half second half"
    assert store.abort_incomplete_uploads("other/", older_than_ms=0) == ["other/y.log"]
    assert sorted(store.list("")) == [("busy/z.log", 22)]
    assert not [p for p in (tmp_path / "root").rglob("*") if ".strata-tmp-" in p.name]


def test_rsm_sweep_uses_its_prefix_and_age_bound_and_counts_removals_per_topic(tmp_path):
    root = tmp_path / "remote"
    manager = ObjectStoreRemoteStorageManager()
    manager.configure({"storage.url": f"file://{root}", "key.prefix": "p/",
                       "incomplete.upload.max.age.ms": 60_000})
    topic_dir = root / "p" / f"orders-{kafka_uuid_str(TOPIC_ID)}" / "0"
    topic_dir.mkdir(parents=True)
    old = topic_dir / "00000000000000000000-x.log.strata-tmp-1"
    young = topic_dir / "00000000000000000100-y.log.strata-tmp-2"
    outside = root / "q" / "z.log.strata-tmp-3"
    outside.parent.mkdir(parents=True)
    for p in (old, young, outside):
        p.write_bytes(b"partial")
    _age(old, 120)
    _age(outside, 120)
    assert manager.abort_incomplete_uploads() == 1
    assert not old.exists() and young.exists() and outside.exists()
    metered = find_layer(manager.store, MeteredObjectStore)
    assert metered.incomplete_uploads_removed() == {"orders": 1}
    manager.close()


def test_memory_store_and_decorators_have_no_leftovers_to_remove():
    store = object_store_from_config({"storage.url": "memory://", "fault.seed": "1",
                                      "upload.rate.limit.bytes.per.second": "1000000"})
    store.put("a/b", b"x")
    assert store.abort_incomplete_uploads("", 0) == []
    assert sorted(store.list("")) == [("a/b", 1)]


def test_filesystem_store_put_survives_a_prune_during_its_mkdir(tmp_path, monkeypatch):
    """A delete that empties a directory prunes it; a put into it that finds the directory
    there (mkdir: EEXIST) and then gone (pruned meanwhile) makes it again, as when the expirer
    deletes a partition's last objects while the copier writes its next segment (a CI failure:
    the copy failed with "[Errno 17] File exists" and was retried under a new segment id)."""
    import errno
    store = FileSystemObjectStore(tmp_path, sync=False)
    store.put("t-x/0/orphan.log", b"o")
    target = str(tmp_path / "t-x" / "0")
    real_mkdir = os.mkdir
    raced = []

    def mkdir(path, mode=0o777, *a, **kw):
        if os.fspath(path) == target and not raced:
            raced.append(True)
            store.delete("t-x/0/orphan.log")     # the concurrent delete prunes t-x/0 and t-x
            raise FileExistsError(errno.EEXIST, "File exists", target)
        return real_mkdir(path, mode, *a, **kw)
    monkeypatch.setattr(os, "mkdir", mkdir)
    store.put("t-x/0/new.log", b"n")
    assert raced and store.get("t-x/0/new.log") == b"n"
