"""The object-store RemoteStorageManager against a real S3-API server (moto) through obstore:
round trips, idempotency, cleanup on failure, deletes, and an S3 outage through a cut proxy."""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server

from strata.common.types import TopicIdPartition, TopicPartition
from strata.tiered.api import (
    IndexType, RemoteResourceNotFoundException, RemoteStorageException,
    RetriableRemoteStorageException)
from strata.tiered.storage import (
    FaultInjectingObjectStore, ObjectStore, ObjectStoreRemoteStorageManager, ObstoreObjectStore,
    object_store_from_config)
from strata.tiered.storage import object_store as object_store_module
from strata.tiered.storage.object_store import MeteredObjectStore, find_layer

from unit.test_remote_storage import Segment  # real segment files (tests/ is on sys.path)

OUTAGE_BUDGET_S = 5.0


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
def rsm(s3, prefix) -> Iterator[ObjectStoreRemoteStorageManager]:
    manager = ObjectStoreRemoteStorageManager()
    manager.configure(s3.rsm_configs(prefix=prefix))
    yield manager
    manager.close()


@pytest.fixture
def segment(tmp_path) -> Segment:
    return Segment(tmp_path / "logs")


@pytest.fixture(autouse=True)
def _network_restored(s3) -> Iterator[None]:
    yield
    s3.restore()


def test_rsm_uses_obstore_for_s3_urls(rsm):
    assert isinstance(find_layer(rsm.store, ObstoreObjectStore), ObstoreObjectStore)


def test_round_trip_of_segment_and_every_index(rsm, segment):
    meta, data = segment.metadata, segment.bytes
    rsm.copy_log_segment_data(meta, segment.data)
    assert rsm.fetch_log_segment(meta, 0).read() == data
    assert rsm.fetch_log_segment(meta, 321, 4321).read() == data[321:4322]
    assert rsm.fetch_log_segment(meta, len(data) - 5, len(data) + 5000).read() == data[-5:]
    assert rsm.fetch_log_segment(meta, len(data) + 1).read() == b""
    for index_type in IndexType:
        assert rsm.fetch_index(meta, index_type).read() == segment.expected_index(index_type)
    keys = sorted(k for k, _ in rsm.list_partition_objects(meta.topic_id_partition))
    assert keys == sorted(rsm.object_key(meta, s) for s in ("log", "indexes", "rsm-manifest"))


def test_missing_transaction_index_raises_resource_not_found(rsm, tmp_path):
    seg = Segment(tmp_path / "logs", with_txn_index=False)
    rsm.copy_log_segment_data(seg.metadata, seg.data)
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(seg.metadata, IndexType.TRANSACTION)


def test_copy_twice_then_delete_twice(rsm, segment):
    meta = segment.metadata
    rsm.copy_log_segment_data(meta, segment.data)
    rsm.copy_log_segment_data(meta, segment.data)
    assert rsm.fetch_log_segment(meta, 0).read() == segment.bytes
    assert len(rsm.list_partition_objects(meta.topic_id_partition)) == 3
    rsm.delete_log_segment_data(meta)
    rsm.delete_log_segment_data(meta)
    assert rsm.list_partition_objects(meta.topic_id_partition) == []
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_log_segment(meta, 0)
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(meta, IndexType.OFFSET)


@pytest.mark.parametrize("failing", ["rsm-manifest", "indexes"])
def test_a_copy_failing_on_a_put_leaves_no_objects(s3, prefix, segment, failing):
    manager = ObjectStoreRemoteStorageManager()
    manager.configure({**s3.rsm_configs(prefix=prefix), "fault.fail.keys": rf"\.{failing}$"})
    assert isinstance(find_layer(manager.store, FaultInjectingObjectStore),
                      FaultInjectingObjectStore)
    with pytest.raises(RemoteStorageException):
        manager.copy_log_segment_data(segment.metadata, segment.data)
    assert manager.list_partition_objects(segment.metadata.topic_id_partition) == []


class _CutBeforeManifest(ObjectStore):
    """Cuts the network just before the first manifest upload (the link dies mid-copy)."""

    def __init__(self, inner: ObjectStore, s3: S3Server) -> None:
        self.inner, self.s3, self.armed = inner, s3, True

    def put(self, key, data):
        if self.armed and key.endswith(".rsm-manifest"):
            self.armed = False
            self.s3.cut()
        self.inner.put(key, data)

    def put_file(self, key, path):
        self.inner.put_file(key, path)

    def get(self, key):
        return self.inner.get(key)

    def get_range(self, key, start, end_exclusive):
        return self.inner.get_range(key, start, end_exclusive)

    def size(self, key):
        return self.inner.size(key)

    def delete(self, key):
        self.inner.delete(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)


def test_a_copy_cut_off_before_its_manifest_is_unreadable_and_a_retry_completes_it(
        s3, prefix, segment):
    store = object_store_from_config(s3.storage_configs())
    manager = ObjectStoreRemoteStorageManager(_CutBeforeManifest(store, s3))
    manager.configure({"key.prefix": prefix})
    meta = segment.metadata
    with pytest.raises(RetriableRemoteStorageException):
        manager.copy_log_segment_data(meta, segment.data)
    s3.restore()
    # The cleanup could not reach S3 either; what is left has no manifest, so it is not a segment.
    leftovers = {k.rsplit(".", 1)[1] for k, _ in manager.list_partition_objects(meta.topic_id_partition)}
    assert "rsm-manifest" not in leftovers
    with pytest.raises(RemoteResourceNotFoundException):
        manager.fetch_log_segment(meta, 0)
    manager.copy_log_segment_data(meta, segment.data)      # the copier's retry
    assert manager.fetch_log_segment(meta, 0).read() == segment.bytes
    manager.delete_log_segment_data(meta)
    assert manager.list_partition_objects(meta.topic_id_partition) == []


def test_big_segments_upload_in_multipart_and_read_back(s3, prefix, tmp_path):
    store = object_store_from_config({**s3.storage_configs(),
                                      "storage.multipart.chunk.bytes": 5 * 1024 * 1024})
    payload = uuid.uuid4().bytes * (11 * 1024 * 1024 // 16)        # 11 MiB: three parts
    src = tmp_path / "big.log"
    src.write_bytes(payload)
    key = f"{prefix}big.log"
    store.put_file(key, src)
    assert store.size(key) == len(payload)
    assert store.get_range(key, 6_000_000, 6_000_010) == payload[6_000_000:6_000_010]
    assert store.get_range(key, len(payload), len(payload) + 10) == b""
    store.delete(key)


def _elapsed(call) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - returned to the caller
        return time.monotonic() - started, e
    return time.monotonic() - started, None


def test_an_s3_outage_raises_retriable_errors_quickly_then_recovers(s3, rsm, segment, tmp_path):
    meta = segment.metadata
    rsm.copy_log_segment_data(meta, segment.data)
    other = Segment(tmp_path / "other", tip=TopicIdPartition(
        meta.topic_id_partition.topic_id, TopicPartition("orders", 1)))
    s3.cut()
    calls = {
        "fetch_log_segment": lambda: rsm.fetch_log_segment(meta, 0).read(),
        "fetch_index": lambda: rsm.fetch_index(meta, IndexType.OFFSET).read(),
        "copy": lambda: rsm.copy_log_segment_data(other.metadata, other.data),
        "delete": lambda: rsm.delete_log_segment_data(other.metadata),
        "list": lambda: rsm.list_partition_objects(meta.topic_id_partition),
    }
    for name, call in calls.items():
        took, error = _elapsed(call)
        assert isinstance(error, RetriableRemoteStorageException), (name, error)
        assert took < OUTAGE_BUDGET_S, (name, took)
    s3.restore()
    # moto kept its data; everything works again.
    assert rsm.fetch_log_segment(meta, 0).read() == segment.bytes
    rsm.copy_log_segment_data(other.metadata, other.data)
    assert rsm.fetch_index(other.metadata, IndexType.TIMESTAMP).read() == \
        Path(other.data.time_index).read_bytes()


def _boto(s3: S3Server):
    import boto3
    return boto3.client("s3", endpoint_url=s3.direct_endpoint, region_name=s3.region,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


class _HeldSource(io.BytesIO):
    """A seekable upload source whose reads past ``hold_at`` wait for ``release``."""

    def __init__(self, data: bytes, hold_at: int) -> None:
        super().__init__(data)
        self.hold_at = hold_at
        self.release = threading.Event()

    def read(self, size: int = -1) -> bytes:
        if self.tell() >= self.hold_at:
            assert self.release.wait(60), "the upload was never released"
        elif size < 0 or self.tell() + size > self.hold_at:
            size = self.hold_at - self.tell()
        return super().read(size)


def test_s3_sweep_aborts_old_incomplete_multipart_uploads_but_not_one_in_progress(
        s3, prefix, tmp_path, monkeypatch):
    store = object_store_from_config({**s3.storage_configs(),
                                      "storage.multipart.chunk.bytes": 5 * 1024 * 1024})
    client = _boto(s3)
    crashed = client.create_multipart_upload(Bucket=s3.bucket, Key=f"{prefix}orders-x/0/a.log")
    client.upload_part(Bucket=s3.bucket, Key=f"{prefix}orders-x/0/a.log", PartNumber=1,
                       UploadId=crashed["UploadId"], Body=b"p" * (5 * 1024 * 1024))

    def incomplete() -> dict[str, str]:
        listed = client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
        return {u["Key"][len(prefix):]: u["UploadId"] for u in listed.get("Uploads", [])}

    # an upload of this store in progress: its first part sent, the rest held back
    payload = uuid.uuid4().bytes * (12 * 1024 * 1024 // 16)
    source = _HeldSource(payload, 6 * 1024 * 1024)
    (tmp_path / "busy.log").write_bytes(b"")
    monkeypatch.setattr(object_store_module, "open", lambda path, mode: source, raising=False)
    upload = threading.Thread(target=store.put_file, args=(f"{prefix}busy.log", "busy.log"))
    upload.start()
    try:
        for _ in range(3000):
            if "busy.log" in incomplete():
                break
            time.sleep(0.01)
        assert set(incomplete()) == {"orders-x/0/a.log", "busy.log"}
        # moto dates every upload in 2010: both are old, only the one in progress stays
        assert store.abort_incomplete_uploads(prefix, older_than_ms=3_600_000) == [
            f"{prefix}orders-x/0/a.log"]
        assert set(incomplete()) == {"busy.log"}
    finally:
        source.release.set()
        upload.join()
    assert incomplete() == {}
    assert store.get(f"{prefix}busy.log") == payload
    assert find_layer(store, MeteredObjectStore).incomplete_uploads_removed() == {"": 1}
    store.close()
