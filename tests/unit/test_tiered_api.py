"""strata.tiered.api: KIP-405 value types, state machines and plugin interfaces.

Expected behaviour is Apache Kafka 4.3's ``org.apache.kafka.server.log.remote.storage``.
"""

from __future__ import annotations

import ast
import base64
import concurrent.futures
import copy
import dataclasses
import pickle
import sys
import uuid
from pathlib import Path

import pytest

from strata.common import types as common_types
from strata.tiered import api
from strata.tiered.api import (
    CustomMetadata,
    IndexType,
    LogSegmentData,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundException,
    RemoteStorageException,
    RemoteStorageManager,
    RemoteStorageNotReadyException,
    RetriableRemoteStorageException,
    TopicIdPartition,
    TopicPartition,
)

S = RemoteLogSegmentState
D = RemotePartitionDeleteState

TIP = TopicIdPartition(uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), TopicPartition("orders", 7))
SEGMENT_ID = RemoteLogSegmentId(TIP, uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"))


def segment(**overrides) -> RemoteLogSegmentMetadata:
    args = dict(remote_log_segment_id=SEGMENT_ID, start_offset=100, end_offset=199, max_timestamp_ms=1_700_000_000_123,
                broker_id=2, event_timestamp_ms=1_700_000_000_456, segment_size_in_bytes=4096,
                segment_leader_epochs={5: 120, 3: 100})
    args.update(overrides)
    return RemoteLogSegmentMetadata(**args)


# --------------------------------------------------------------------------- module boundaries


def test_api_imports_only_common_and_the_standard_library():
    tree = ast.parse(Path(api.__file__).read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            modules.add(node.module)
    for name in modules:
        top = name.split(".")[0]
        assert name.startswith("strata.common") or top in sys.stdlib_module_names or top == "__future__", name


def test_topic_id_partition_is_the_common_type():
    assert TopicIdPartition is common_types.TopicIdPartition
    assert TopicPartition is common_types.TopicPartition


# --------------------------------------------------------------------------- state machines


# Kafka's RemoteLogSegmentState.isValidTransition, written out as a table: (src, dst) -> valid.
SEGMENT_VALID = {
    (None, S.COPY_SEGMENT_STARTED),
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_STARTED),
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED),
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
    (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED),
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED),
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
    (S.DELETE_SEGMENT_FINISHED, S.DELETE_SEGMENT_FINISHED),
}

PARTITION_DELETE_VALID = {
    (None, D.DELETE_PARTITION_MARKED),
    (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_MARKED),
    (D.DELETE_PARTITION_MARKED, D.DELETE_PARTITION_STARTED),
    (D.DELETE_PARTITION_STARTED, D.DELETE_PARTITION_STARTED),
    (D.DELETE_PARTITION_STARTED, D.DELETE_PARTITION_FINISHED),
    (D.DELETE_PARTITION_FINISHED, D.DELETE_PARTITION_FINISHED),
}


def test_segment_state_ids_are_kafkas():
    assert [(s.name, s.id) for s in S] == [
        ("COPY_SEGMENT_STARTED", 0), ("COPY_SEGMENT_FINISHED", 1),
        ("DELETE_SEGMENT_STARTED", 2), ("DELETE_SEGMENT_FINISHED", 3)]
    assert S.for_id(2) is S.DELETE_SEGMENT_STARTED
    assert S.for_id(4) is None and S.for_id(-1) is None


def test_partition_delete_state_ids_are_kafkas():
    assert [(s.name, s.id) for s in D] == [
        ("DELETE_PARTITION_MARKED", 0), ("DELETE_PARTITION_STARTED", 1), ("DELETE_PARTITION_FINISHED", 2)]
    assert D.for_id(1) is D.DELETE_PARTITION_STARTED
    assert D.for_id(3) is None


@pytest.mark.parametrize("src", [None, *S])
@pytest.mark.parametrize("dst", list(S))
def test_segment_state_transitions_follow_kafka(src, dst):
    assert S.is_valid_transition(src, dst) is ((src, dst) in SEGMENT_VALID)


@pytest.mark.parametrize("src", [None, *D])
@pytest.mark.parametrize("dst", list(D))
def test_partition_delete_state_transitions_follow_kafka(src, dst):
    assert D.is_valid_transition(src, dst) is ((src, dst) in PARTITION_DELETE_VALID)


def test_self_transitions_are_valid_so_retries_are_idempotent():
    assert all(S.is_valid_transition(s, s) for s in S)
    assert all(D.is_valid_transition(s, s) for s in D)


def test_transition_to_none_is_rejected():
    with pytest.raises(ValueError):
        S.is_valid_transition(S.COPY_SEGMENT_STARTED, None)
    with pytest.raises(ValueError):
        D.is_valid_transition(None, None)


def test_index_types_are_kafkas():
    assert [t.name for t in IndexType] == ["OFFSET", "TIMESTAMP", "PRODUCER_SNAPSHOT", "TRANSACTION", "LEADER_EPOCH"]
    assert RemoteStorageManager.IndexType is IndexType


# --------------------------------------------------------------------------- RemoteLogSegmentId


def test_generate_new_gives_distinct_ids_for_the_partition():
    ids = {RemoteLogSegmentId.generate_new(TIP) for _ in range(100)}
    assert len(ids) == 100
    assert all(i.topic_id_partition == TIP and isinstance(i.id, uuid.UUID) for i in ids)


def test_generate_new_skips_uuids_kafka_never_generates(monkeypatch):
    dash = uuid.UUID(bytes=b"\xf8" + b"\x01" * 15)  # base64 "-..." (url-safe alphabet index 62)
    assert base64.urlsafe_b64encode(dash.bytes).startswith(b"-")
    good = uuid.UUID("8c6c2d6a-94bf-4a76-b3a4-5e0c1f1b7a11")
    supply = iter([uuid.UUID(int=0), uuid.UUID(int=1), dash, good])
    monkeypatch.setattr(api.uuid, "uuid4", lambda: next(supply))
    assert RemoteLogSegmentId.generate_new(TIP).id == good


def test_segment_id_requires_a_uuid():
    with pytest.raises(ValueError):
        RemoteLogSegmentId(TIP, "00112233-4455-6677-8899-aabbccddeeff")
    with pytest.raises(ValueError):
        RemoteLogSegmentId(None, uuid.uuid4())


# --------------------------------------------------------------------------- RemoteLogSegmentMetadata


def test_new_segment_metadata_defaults_like_kafkas_short_constructor():
    m = segment()
    assert m.state is S.COPY_SEGMENT_STARTED
    assert m.custom_metadata is None
    assert m.txn_idx_empty is False
    assert m.topic_id_partition == TIP


def test_segment_leader_epochs_are_sorted_by_epoch_and_read_only():
    m = segment(segment_leader_epochs={9: 150, 3: 100, 5: 120})
    assert list(m.segment_leader_epochs.items()) == [(3, 100), (5, 120), (9, 150)]
    with pytest.raises(TypeError):
        m.segment_leader_epochs[10] = 160  # type: ignore[index]


def test_caller_mutating_its_epoch_dict_does_not_change_the_metadata():
    epochs = {3: 100}
    m = segment(segment_leader_epochs=epochs)
    epochs[4] = 150
    assert dict(m.segment_leader_epochs) == {3: 100}


@pytest.mark.parametrize("overrides, message", [
    (dict(start_offset=-1), "start offset"),
    (dict(start_offset=10, end_offset=9), "end offset"),
    (dict(segment_leader_epochs={}), "segment_leader_epochs"),
    (dict(segment_leader_epochs=None), "segment_leader_epochs"),
    (dict(state=None), "state"),
    (dict(state=7), "7"),
    (dict(remote_log_segment_id=None), "remote_log_segment_id"),
])
def test_segment_metadata_rejects_what_kafkas_constructor_rejects(overrides, message):
    with pytest.raises(ValueError, match=message):
        segment(**overrides)


def test_single_offset_segment_is_valid():
    m = segment(start_offset=0, end_offset=0, segment_leader_epochs={0: 0})
    assert m.start_offset == m.end_offset == 0


def test_int_state_and_bytes_like_custom_metadata_are_normalised():
    m = segment(state=1, custom_metadata=bytearray(b"xy"))
    assert m.state is S.COPY_SEGMENT_FINISHED
    assert type(m.custom_metadata) is CustomMetadata and m.custom_metadata == b"xy"
    with pytest.raises(TypeError):
        segment(custom_metadata="xy")


def test_custom_metadata_is_bytes_with_kafkas_short_repr():
    c = CustomMetadata(b"\x00\x01\x02")
    assert c == b"\x00\x01\x02" and c.value == b"\x00\x01\x02" and type(c.value) is bytes
    assert repr(c) == "CustomMetadata(3 bytes)"


def test_segment_metadata_is_immutable_hashable_and_compares_by_value():
    a, b = segment(), segment(segment_leader_epochs={3: 100, 5: 120})
    assert a == b and hash(a) == hash(b)
    assert a != segment(txn_idx_empty=True)
    assert a != segment(custom_metadata=b"")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.start_offset = 5  # type: ignore[misc]


def test_segment_metadata_pickles_and_copies():
    m = segment(custom_metadata=b"abc", state=S.COPY_SEGMENT_FINISHED, txn_idx_empty=True)
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m), copy.copy(m)):
        assert clone == m and type(clone.custom_metadata) is CustomMetadata


def test_create_with_updates_applies_state_custom_metadata_broker_and_time():
    original = segment(txn_idx_empty=True)
    update = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1_700_000_000_789, b"\x01\x02\x03", S.COPY_SEGMENT_FINISHED, 9)
    updated = original.create_with_updates(update)
    assert (updated.state, updated.custom_metadata, updated.broker_id, updated.event_timestamp_ms) == (
        S.COPY_SEGMENT_FINISHED, b"\x01\x02\x03", 9, 1_700_000_000_789)
    # everything else is kept, and the original is unchanged
    assert (updated.remote_log_segment_id, updated.start_offset, updated.end_offset, updated.max_timestamp_ms,
            updated.segment_size_in_bytes, dict(updated.segment_leader_epochs), updated.txn_idx_empty) == (
        SEGMENT_ID, 100, 199, 1_700_000_000_123, 4096, {3: 100, 5: 120}, True)
    assert original.state is S.COPY_SEGMENT_STARTED and original.broker_id == 2


def test_create_with_updates_clears_custom_metadata_when_the_update_has_none():
    m = segment(custom_metadata=b"old")
    update = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1, None, S.DELETE_SEGMENT_STARTED, 2)
    assert m.create_with_updates(update).custom_metadata is None


def test_create_with_updates_rejects_another_segments_update():
    other = RemoteLogSegmentId(TIP, uuid.UUID(int=42))
    with pytest.raises(ValueError, match="remote_log_segment_id"):
        segment().create_with_updates(RemoteLogSegmentMetadataUpdate(other, 1, None, S.COPY_SEGMENT_FINISHED, 2))


def test_create_with_updates_does_not_judge_transitions():
    # Like Kafka, the value type applies any update; the metadata manager enforces the state machine.
    finished = segment(state=S.DELETE_SEGMENT_FINISHED)
    update = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1, None, S.COPY_SEGMENT_STARTED, 2)
    assert finished.create_with_updates(update).state is S.COPY_SEGMENT_STARTED


# --------------------------------------------------------------------------- other value types


def test_segment_update_normalises_and_knows_its_partition():
    u = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 5, memoryview(b"m"), 2, 1)
    assert u.state is S.DELETE_SEGMENT_STARTED and type(u.custom_metadata) is CustomMetadata
    assert u.topic_id_partition == TIP
    with pytest.raises(ValueError):
        RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 5, None, None, 1)
    with pytest.raises(ValueError):
        RemoteLogSegmentMetadataUpdate(TIP, 5, None, S.COPY_SEGMENT_FINISHED, 1)


def test_partition_delete_metadata():
    d = RemotePartitionDeleteMetadata(TIP, 0, 1_700_000_000_999, 1)
    assert d.state is D.DELETE_PARTITION_MARKED and d.topic_id_partition == TIP
    assert d == RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 1_700_000_000_999, 1)
    assert hash(d) == hash(RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 1_700_000_000_999, 1))
    with pytest.raises(ValueError):
        RemotePartitionDeleteMetadata(TIP, 3, 1, 1)
    with pytest.raises(ValueError):
        RemotePartitionDeleteMetadata(None, D.DELETE_PARTITION_MARKED, 1, 1)


def test_all_metadata_share_the_remote_log_metadata_base():
    d = RemotePartitionDeleteMetadata(TIP, D.DELETE_PARTITION_MARKED, 1, 1)
    u = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1, None, S.COPY_SEGMENT_FINISHED, 1)
    assert all(isinstance(x, api.RemoteLogMetadata) for x in (segment(), u, d))


def test_log_segment_data_normalises_paths_and_epoch_bytes(tmp_path):
    data = LogSegmentData(str(tmp_path / "0.log"), tmp_path / "0.index", tmp_path / "0.timeindex", None,
                          tmp_path / "0.snapshot", bytearray(b"0\n1\n0 0\n"))
    assert data.log_segment == tmp_path / "0.log" and isinstance(data.log_segment, Path)
    assert data.transaction_index is None
    assert data.leader_epoch_index == b"0\n1\n0 0\n" and type(data.leader_epoch_index) is bytes
    with_txn = dataclasses.replace(data, transaction_index=str(tmp_path / "0.txnindex"))
    assert with_txn.transaction_index == tmp_path / "0.txnindex"


@pytest.mark.parametrize("field", ["log_segment", "offset_index", "time_index", "producer_snapshot_index",
                                   "leader_epoch_index"])
def test_log_segment_data_requires_everything_but_the_transaction_index(field, tmp_path):
    args = dict(log_segment=tmp_path / "a", offset_index=tmp_path / "b", time_index=tmp_path / "c",
                transaction_index=None, producer_snapshot_index=tmp_path / "d", leader_epoch_index=b"")
    args[field] = None
    with pytest.raises(ValueError, match=field):
        LogSegmentData(**args)


# --------------------------------------------------------------------------- exceptions


def test_exception_hierarchy_matches_kafka():
    assert issubclass(RemoteResourceNotFoundException, RemoteStorageException)
    assert issubclass(RetriableRemoteStorageException, RemoteStorageException)
    assert issubclass(RemoteStorageNotReadyException, RetriableRemoteStorageException)
    assert RemoteStorageNotReadyException("x").retriable is True
    assert RemoteResourceNotFoundException("x").retriable is False
    assert RemoteStorageException("x").retriable is False


# --------------------------------------------------------------------------- interfaces


def test_interfaces_are_abstract():
    with pytest.raises(TypeError):
        RemoteStorageManager()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        RemoteLogMetadataManager()  # type: ignore[abstract]
    assert RemoteStorageManager.__abstractmethods__ == {
        "configure", "copy_log_segment_data", "fetch_log_segment", "fetch_index", "delete_log_segment_data", "close"}
    assert RemoteLogMetadataManager.__abstractmethods__ == {
        "configure", "add_remote_log_segment_metadata", "update_remote_log_segment_metadata",
        "remote_log_segment_metadata", "highest_offset_for_epoch", "put_remote_partition_delete_metadata",
        "list_remote_log_segments", "on_partition_leadership_changes", "on_stop_partitions", "remote_log_size",
        "close"}


class _OneSegmentRlmm(RemoteLogMetadataManager):
    """The smallest implementation: enough to exercise the interface's default methods."""

    def __init__(self, metadata):
        self.metadata = metadata
        self.closed = False

    def configure(self, configs):
        pass

    def add_remote_log_segment_metadata(self, remote_log_segment_metadata):
        f = concurrent.futures.Future()
        f.set_result(None)
        return f

    update_remote_log_segment_metadata = add_remote_log_segment_metadata
    put_remote_partition_delete_metadata = add_remote_log_segment_metadata

    def remote_log_segment_metadata(self, topic_id_partition, epoch_for_offset, offset):
        m = self.metadata
        return m if m.start_offset <= offset <= m.end_offset else None

    def highest_offset_for_epoch(self, topic_id_partition, leader_epoch):
        return self.metadata.end_offset

    def list_remote_log_segments(self, topic_id_partition, leader_epoch=None):
        return iter([self.metadata])

    def on_partition_leadership_changes(self, leader_partitions, follower_partitions):
        pass

    def on_stop_partitions(self, partitions):
        pass

    def remote_log_size(self, topic_id_partition, leader_epoch):
        return self.metadata.segment_size_in_bytes

    def close(self):
        self.closed = True


def test_metadata_manager_defaults_are_kafkas():
    m = segment(state=S.COPY_SEGMENT_FINISHED)
    with _OneSegmentRlmm(m) as rlmm:
        assert rlmm.is_ready(TIP) is True
        assert rlmm.next_segment_with_txn_index(TIP, 3, 150) == m
        assert rlmm.next_segment_with_txn_index(TIP, 3, 250) is None
        assert rlmm.add_remote_log_segment_metadata(segment()).result(timeout=1) is None
    assert rlmm.closed
