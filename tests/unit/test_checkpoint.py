"""Kafka text checkpoint files: exact format, atomic writes, strict reads."""

from __future__ import annotations

import os

import pytest

from strata.common.errors import ErrorCode, KafkaStorageError
from strata.common.types import TopicPartition
from strata.log import checkpoint as checkpoint_module
from strata.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT_FILENAME,
    CheckpointFile,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    decode_epoch_entries,
    encode_epoch_entries,
)
from strata.log.leader_epoch import EpochEntry


def test_offset_checkpoint_writes_kafka_text_format(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    OffsetCheckpointFile(path).write({
        TopicPartition("orders", 0): 1234,
        TopicPartition("my-topic.v2", 17): 0,
    })
    assert path.read_bytes() == b"0\n2\norders 0 1234\nmy-topic.v2 17 0\n"


def test_offset_checkpoint_round_trips(tmp_path):
    offsets = {TopicPartition(f"t-{i}", i % 3): i * 1000 + 7 for i in range(50)}
    offsets[TopicPartition("big", 2**31 - 1)] = 2**63 - 1
    cp = OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint")
    cp.write(offsets)
    assert cp.read() == offsets


def test_empty_offset_checkpoint_is_version_and_zero_count(tmp_path):
    cp = OffsetCheckpointFile(tmp_path / "cp")
    cp.write({})
    assert (tmp_path / "cp").read_bytes() == b"0\n0\n"
    assert cp.read() == {}


def test_missing_or_empty_checkpoint_reads_as_no_entries(tmp_path):
    assert OffsetCheckpointFile(tmp_path / "missing").read() == {}
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").write_bytes(b"")
    assert OffsetCheckpointFile(tmp_path / "empty").read() == {}
    assert LeaderEpochCheckpointFile(tmp_path / "missing2").read() == []


def test_checkpoint_read_accepts_java_whitespace_separators_and_crlf_like_kafka(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(b"0\r\n2\r\nfoo\t1  10 \r\nbar 0 -1")
    assert OffsetCheckpointFile(path).read() == {
        TopicPartition("foo", 1): 10, TopicPartition("bar", 0): -1}


def test_checkpoint_write_is_atomic_and_leaves_no_tmp_file(tmp_path):
    path = tmp_path / "cp"
    cp = OffsetCheckpointFile(path)
    cp.write({TopicPartition("a", 0): 1})
    cp.write({TopicPartition("a", 0): 2})
    assert sorted(os.listdir(tmp_path)) == ["cp"]
    assert cp.read() == {TopicPartition("a", 0): 2}


def test_failed_write_keeps_old_content_and_removes_tmp(tmp_path, monkeypatch):
    path = tmp_path / "cp"
    cp = OffsetCheckpointFile(path)
    cp.write({TopicPartition("a", 0): 1})

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "replace", failing_replace)
    with pytest.raises(KafkaStorageError) as err:
        cp.write({TopicPartition("a", 0): 2})
    assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert str(path) in str(err.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["cp"]
    assert cp.read() == {TopicPartition("a", 0): 1}


def test_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint_module.os, "fsync", recording_fsync)
    OffsetCheckpointFile(tmp_path / "cp").write({TopicPartition("a", 0): 1})
    assert synced == [str((tmp_path / "cp.tmp").resolve()), str(tmp_path.resolve())]


def test_write_if_dir_exists_skips_a_deleted_directory(tmp_path):
    gone = tmp_path / "gone"
    cp = LeaderEpochCheckpointFile(gone / LEADER_EPOCH_CHECKPOINT_FILENAME)
    assert cp.write_if_dir_exists([EpochEntry(1, 0)]) is False
    with pytest.raises(KafkaStorageError):
        cp.write([EpochEntry(1, 0)])
    gone.mkdir()
    assert cp.write_if_dir_exists([EpochEntry(1, 0)]) is True
    assert cp.read() == [EpochEntry(1, 0)]


def test_offset_checkpoint_rejects_topic_names_with_whitespace(tmp_path):
    with pytest.raises(ValueError):
        OffsetCheckpointFile(tmp_path / "cp").write({TopicPartition("bad topic", 0): 1})
    assert not (tmp_path / "cp").exists()


@pytest.mark.parametrize("content, line", [
    (b"1\n0\n", 1),                               # unknown version
    (b"x\n0\n", 1),                               # version not a number
    (b" 0\n0\n", 1),                              # Java's parseInt allows no padding
    (b"0\nnope\n", 2),                            # count not a number
    (b"0\n-1\n", 2),                              # negative count
    (b"0\n1\ntopic 0\n", 3),                      # too few fields
    (b"0\n1\ntopic 0 1 2\n", 3),                  # too many fields
    (b"0\n1\n topic 0 1\n", 3),                   # leading whitespace: empty first field
    (b"0\n1\ntopic x 1\n", 3),                    # partition not a number
    (b"0\n1\ntopic 0 1.5\n", 3),                  # offset not an integer
    (b"0\n1\ntopic 2147483648 1\n", 3),           # partition overflows int32
    (b"0\n1\ntopic 0 9223372036854775808\n", 3),  # offset overflows int64
    (b"0\n2\ntopic 0 1\n\n", 4),                  # empty line
    (b"0\n2\ntopic 0 1\n", None),                 # fewer entries than the count
    (b"0\n1\ntopic 0 1\ntopic 1 1\n", None),      # more entries than the count
    (b"0\n1\n\xff\xfe 0 1\n", None),              # not UTF-8
])
def test_malformed_offset_checkpoint_raises_storage_error_naming_file_and_line(tmp_path, content, line):
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(content)
    with pytest.raises(KafkaStorageError) as err:
        OffsetCheckpointFile(path).read()
    message = str(err.value)
    assert str(path) in message
    if line is not None:
        assert f"line {line}" in message


def test_checkpoint_without_count_line_reads_as_empty_like_kafka(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(b"0\n")
    assert OffsetCheckpointFile(path).read() == {}


def test_leader_epoch_checkpoint_writes_kafka_text_format(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    cp = LeaderEpochCheckpointFile(path)
    cp.write([EpochEntry(0, 0), EpochEntry(3, 1500), EpochEntry(7, 2**40)])
    assert path.read_bytes() == b"0\n3\n0 0\n3 1500\n7 1099511627776\n"
    assert cp.read() == [EpochEntry(0, 0), EpochEntry(3, 1500), EpochEntry(7, 2**40)]
    assert LeaderEpochCheckpointFile.in_dir(tmp_path).path == path


@pytest.mark.parametrize("content", [
    b"0\n1\n5\n", b"0\n1\n5 10 15\n", b"0\n1\nfive 10\n", b"0\n1\n2147483648 0\n", b"2\n0\n",
])
def test_malformed_leader_epoch_checkpoint_raises_storage_error(tmp_path, content):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    path.write_bytes(content)
    with pytest.raises(KafkaStorageError):
        LeaderEpochCheckpointFile(path).read()


def test_epoch_entries_encode_to_the_checkpoint_file_bytes(tmp_path):
    entries = [EpochEntry(1, 0), EpochEntry(4, 99)]
    blob = encode_epoch_entries(entries)
    assert blob == b"0\n2\n1 0\n4 99\n"
    cp = LeaderEpochCheckpointFile(tmp_path / "x")
    cp.write(entries)
    assert (tmp_path / "x").read_bytes() == blob
    assert decode_epoch_entries(blob) == entries
    assert decode_epoch_entries(b"") == []
    assert encode_epoch_entries([]) == b"0\n0\n"


def test_decode_epoch_entries_rejects_malformed_blob():
    with pytest.raises(KafkaStorageError) as err:
        decode_epoch_entries(b"0\n2\n1 0\n", source="remote segment abc")
    assert "remote segment abc" in str(err.value)


def test_generic_checkpoint_file_with_custom_formatter(tmp_path):
    class Formatter:
        def to_line(self, entry: str) -> str:
            return entry

        def from_line(self, line: str) -> str:
            if not line.isalpha():
                raise ValueError("letters only")
            return line

    cp = CheckpointFile(tmp_path / "custom", 3, Formatter())
    cp.write(["abc", "def"])
    assert (tmp_path / "custom").read_text() == "3\n2\nabc\ndef\n"
    assert cp.read() == ["abc", "def"]
    with pytest.raises(ValueError):
        cp.write(["two\nlines"])
    (tmp_path / "custom").write_text("3\n1\nab1\n")
    with pytest.raises(KafkaStorageError, match="line 3"):
        cp.read()
