"""Producer state: idempotence, fencing, transactions and byte-exact snapshots."""

from __future__ import annotations

import struct

import pytest

from strata.common.clock import MockClock
from strata.common.errors import (
    InvalidProducerEpochError, InvalidTxnStateError, KafkaStorageError, OutOfOrderSequenceError)
from strata.common.types import TopicPartition
from strata.log.producer_state import (
    NUM_BATCHES_TO_RETAIN, AppendOrigin, BatchMetadata, CompletedTxn, CorruptSnapshotError,
    ProducerStateEntry, ProducerStateManager, TransactionCoordinatorFencedError, read_snapshot,
    write_snapshot)
from strata.protocol.records import (
    CONTROL_ABORT, CONTROL_COMMIT, CONTROL_MASK, HEADER, TRANSACTIONAL_MASK, BatchHeader, crc32c)

TP = TopicPartition("orders", 0)
INT32_MAX = 2**31 - 1
PID = 1000
T0 = 1_700_000_000_000


# ---------------------------------------------------------------------------------------------
# helpers


def data_header(base_offset, base_seq, count=1, epoch=0, pid=PID, ts=T0, txn=False):
    return BatchHeader(
        base_offset=base_offset, batch_length=49 + 10 * count, partition_leader_epoch=0, magic=2,
        crc=0, attributes=TRANSACTIONAL_MASK if txn else 0, last_offset_delta=count - 1,
        base_timestamp=ts, max_timestamp=ts, producer_id=pid, producer_epoch=epoch,
        base_sequence=base_seq, record_count=count)


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def control_batch(offset, ctype, epoch=0, pid=PID, coordinator_epoch=0, ts=T0):
    """A one-record transaction marker batch: (bytes, header)."""
    key = struct.pack(">hh", 0, ctype)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key
            + _varint(len(value)) + value + _varint(0))
    record = _varint(len(body)) + body
    fields = (offset, 49 + len(record), 0, 2, 0, TRANSACTIONAL_MASK | CONTROL_MASK, 0, ts, ts,
              pid, epoch, -1, 1)
    buf = HEADER.pack(*fields) + record
    return buf, BatchHeader(*fields, 0)


def append(psm, header, buf=None, origin=AppendOrigin.CLIENT):
    """Run the log's append protocol for one batch; return the completed txn, if any."""
    info = psm.prepare_update(header.producer_id, origin)
    completed = info.append_batch(header, buf, origin)
    psm.update(info)
    psm.update_map_end_offset(header.next_offset)
    if completed is not None:
        psm.last_stable_offset(completed)
        psm.complete_txn(completed)
    return completed


@pytest.fixture
def clock():
    return MockClock(T0)


@pytest.fixture
def psm(tmp_path, clock):
    return ProducerStateManager(TP, tmp_path, producer_id_expiration_ms=60_000, clock=clock)


# ---------------------------------------------------------------------------------------------
# idempotence


def test_duplicate_detected_for_each_of_last_five_batches_but_not_sixth(psm):
    headers = [data_header(i * 2, i * 2, count=2) for i in range(6)]
    for h in headers:
        assert psm.find_duplicate(h) is None
        append(psm, h)
    assert len(psm.last_entry(PID).batch_metadata) == NUM_BATCHES_TO_RETAIN
    for h in headers[1:]:
        dup = psm.find_duplicate(h)
        assert dup == BatchMetadata(h.last_sequence, h.last_offset, 1, T0)
        assert (dup.first_seq, dup.first_offset) == (h.base_sequence, h.base_offset)
    assert psm.find_duplicate(headers[0]) is None


def test_duplicate_requires_same_epoch_and_exact_sequence_range(psm):
    append(psm, data_header(0, 0, count=3))
    assert psm.find_duplicate(data_header(0, 0, count=3)) is not None
    assert psm.find_duplicate(data_header(0, 0, count=2)) is None
    assert psm.find_duplicate(data_header(0, 0, count=3, epoch=1)) is None
    assert psm.find_duplicate(data_header(0, 0, count=3, pid=PID + 1)) is None


def test_out_of_order_sequence_rejected_and_state_untouched(psm):
    append(psm, data_header(0, 0, count=5))
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    with pytest.raises(OutOfOrderSequenceError):
        info.append_batch(data_header(5, 6))       # gap: 5 expected
    assert psm.last_entry(PID).last_seq == 4
    append(psm, data_header(5, 5))
    assert psm.last_entry(PID).last_seq == 5


def test_sequences_within_one_append_are_validated_against_each_other(psm):
    append(psm, data_header(0, 0))
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    info.append_batch(data_header(1, 1, count=2))
    with pytest.raises(OutOfOrderSequenceError):
        info.append_batch(data_header(3, 4))       # 3 expected after the batch above
    assert psm.last_entry(PID).last_seq == 0       # nothing applied without update()


def test_sequence_wraps_around_after_int32_max(psm):
    # An unknown producer may start anywhere: begin two below the maximum.
    append(psm, data_header(0, INT32_MAX - 1, count=2))
    assert psm.last_entry(PID).last_seq == INT32_MAX
    wrapped = data_header(2, INT32_MAX, count=3)    # seqs MAX, 0, 1 would repeat MAX: rejected
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    with pytest.raises(OutOfOrderSequenceError):
        info.append_batch(wrapped)
    nxt = data_header(2, 0, count=3)
    append(psm, nxt)
    assert psm.last_entry(PID).last_seq == 2
    # A batch spanning the wrap: last seq computed modulo 2^31, first seq recovered from it.
    entry = ProducerStateEntry(7, 0)
    entry.add_batch(0, 1, 100, 3, T0)              # seqs MAX-1, MAX, 0, 1
    assert entry.batch_metadata[0].first_seq == INT32_MAX - 1
    spanning = data_header(97, INT32_MAX - 1, count=4, pid=7)
    assert spanning.last_sequence == 1
    assert entry.find_duplicate_batch(spanning) is not None


def test_lower_epoch_is_fenced(psm):
    append(psm, data_header(0, 0, epoch=5))
    for origin in (AppendOrigin.CLIENT, AppendOrigin.COORDINATOR):
        info = psm.prepare_update(PID, origin)
        with pytest.raises(InvalidProducerEpochError):
            info.append_batch(data_header(1, 1, epoch=4), origin=origin)
    # Replicated data was validated by the leader: a stale epoch is only logged.
    info = psm.prepare_update(PID, AppendOrigin.REPLICATION)
    info.append_batch(data_header(1, 1, epoch=4))


def test_epoch_bump_requires_sequence_zero(psm):
    append(psm, data_header(0, 0, count=3, epoch=1))
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    with pytest.raises(OutOfOrderSequenceError):
        info.append_batch(data_header(3, 3, epoch=2))
    append(psm, data_header(3, 0, epoch=2))
    entry = psm.last_entry(PID)
    assert entry.producer_epoch == 2
    assert list(entry.batch_metadata) == [BatchMetadata(0, 3, 0, T0)]   # old epoch's batches gone


def test_unknown_producer_accepts_any_sequence(psm):
    append(psm, data_header(0, 4242, count=2, epoch=3))
    assert psm.last_entry(PID).last_seq == 4243
    # The next batch must then follow on.
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    with pytest.raises(OutOfOrderSequenceError):
        info.append_batch(data_header(2, 0, epoch=3))


def test_replication_and_coordinator_origins_skip_sequence_checks(psm):
    append(psm, data_header(0, 0))
    append(psm, data_header(1, 17), origin=AppendOrigin.REPLICATION)
    append(psm, data_header(2, -1), origin=AppendOrigin.COORDINATOR)
    assert psm.last_entry(PID).last_offset_delta == 0


# ---------------------------------------------------------------------------------------------
# transactions


def test_transaction_commit_and_abort_complete_and_move_first_unstable_offset(psm):
    other = PID + 1
    assert psm.first_unstable_offset() is None
    append(psm, data_header(0, 0, txn=True))                    # PID's txn begins at 0
    append(psm, data_header(1, 0, txn=True, pid=other))         # other's txn begins at 1
    append(psm, data_header(2, 1, txn=True))
    assert psm.first_unstable_offset() == 0
    assert list(psm.ongoing_txns) == [0, 1]
    assert psm.last_entry(PID).current_txn_first_offset == 0

    buf, marker = control_batch(3, CONTROL_ABORT)
    info = psm.prepare_update(PID, AppendOrigin.COORDINATOR)
    completed = info.append_batch(marker, buf)
    assert completed == CompletedTxn(PID, 0, 3, True)
    assert psm.first_unstable_offset() == 0                     # unchanged until update()
    psm.update(info)
    psm.update_map_end_offset(4)
    # The other producer's txn still bounds the LSO.
    assert psm.last_stable_offset(completed) == 1
    assert completed.aborted_txn_fields(1) == (PID, 0, 3, 1)
    psm.complete_txn(completed)
    assert psm.first_unstable_offset() == 1
    assert psm.last_entry(PID).current_txn_first_offset == -1

    buf, marker = control_batch(4, CONTROL_COMMIT, pid=other)
    info = psm.prepare_update(other, AppendOrigin.COORDINATOR)
    completed = info.append_batch(marker, buf)
    assert completed == CompletedTxn(other, 1, 4, False)
    psm.update(info)
    assert psm.last_stable_offset(completed) == 5
    psm.complete_txn(completed)
    assert psm.first_unstable_offset() is None
    assert not psm.ongoing_txns

    # Kafka's firstUnstableOffset also waits for the markers to reach the high watermark.
    assert psm.first_unstable_offset(include_unreplicated=True) == 0
    psm.on_high_watermark_updated(4)
    assert psm.first_unstable_offset(include_unreplicated=True) == 1
    psm.on_high_watermark_updated(5)
    assert psm.first_unstable_offset(include_unreplicated=True) is None
    assert not psm.is_empty                                     # producers remain


def test_marker_without_data_completes_nothing(psm):
    buf, marker = control_batch(0, CONTROL_COMMIT, epoch=1, coordinator_epoch=3)
    assert append(psm, marker, buf, AppendOrigin.COORDINATOR) is None
    entry = psm.last_entry(PID)
    assert (entry.producer_epoch, entry.coordinator_epoch) == (1, 3)


def test_non_transactional_batch_during_transaction_is_invalid(psm):
    append(psm, data_header(0, 0, txn=True))
    info = psm.prepare_update(PID, AppendOrigin.CLIENT)
    with pytest.raises(InvalidTxnStateError):
        info.append_batch(data_header(1, 1))


def test_marker_from_older_coordinator_is_fenced(psm):
    append(psm, data_header(0, 0, txn=True))
    buf, marker = control_batch(1, CONTROL_COMMIT, coordinator_epoch=5)
    append(psm, marker, buf, AppendOrigin.COORDINATOR)
    append(psm, data_header(2, 1, txn=True))
    buf, stale = control_batch(3, CONTROL_COMMIT, coordinator_epoch=4)
    info = psm.prepare_update(PID, AppendOrigin.COORDINATOR)
    with pytest.raises(TransactionCoordinatorFencedError):
        info.append_batch(stale, buf)


def test_tv2_marker_needs_a_higher_epoch_but_a_retry_is_accepted(psm):
    append(psm, data_header(0, 0, epoch=1, txn=True))
    buf, same_epoch = control_batch(1, CONTROL_COMMIT, epoch=1)
    info = psm.prepare_update(PID, AppendOrigin.COORDINATOR)
    with pytest.raises(InvalidProducerEpochError):
        info.append_batch(same_epoch, buf, transaction_version=2)
    buf, bumped = control_batch(1, CONTROL_COMMIT, epoch=2)
    info = psm.prepare_update(PID, AppendOrigin.COORDINATOR)
    assert info.append_batch(bumped, buf, transaction_version=2) == CompletedTxn(PID, 0, 1, False)
    psm.update(info)
    # The same marker again, the transaction already over: an idempotent retry.
    buf, retry = control_batch(2, CONTROL_COMMIT, epoch=2)
    info = psm.prepare_update(PID, AppendOrigin.COORDINATOR)
    assert info.append_batch(retry, buf, transaction_version=2) is None


# ---------------------------------------------------------------------------------------------
# snapshots


def test_snapshot_byte_layout_matches_kafka(psm, tmp_path):
    append(psm, data_header(10, 5, count=3, epoch=2, ts=T0 + 7))          # pid 1000, no txn
    append(psm, data_header(13, 0, count=1, epoch=0, pid=42, ts=T0 + 9, txn=True))
    path = psm.take_snapshot()
    assert path == tmp_path / "00000000000000000014.snapshot"
    entries = (struct.pack(">qhiqiqiq", PID, 2, 7, 12, 2, T0 + 7, -1, -1)
               + struct.pack(">qhiqiqiq", 42, 0, 0, 13, 0, T0 + 9, -1, 13))
    covered = struct.pack(">i", 2) + entries
    expected = struct.pack(">hI", 1, crc32c(covered)) + covered
    assert len(expected) == 2 + 4 + 4 + 2 * 46
    assert path.read_bytes() == expected
    assert psm.take_snapshot() is None                     # nothing new since
    assert not list(tmp_path.glob("*.tmp"))


def test_snapshot_write_read_round_trip_keeps_last_batch_only(tmp_path):
    entry = ProducerStateEntry(7, 3, coordinator_epoch=9, last_timestamp=T0 + 1,
                               current_txn_first_offset=40)
    for i in range(3):
        entry.add_batch(3, i, 40 + i, 0, T0 + i)
    entry.end_txn(3, 9, T0 + 5)
    entry.current_txn_first_offset = 43
    empty = ProducerStateEntry(8, 1, coordinator_epoch=2, last_timestamp=T0)
    path = tmp_path / "00000000000000000050.snapshot"
    write_snapshot(path, [entry, empty])
    loaded = read_snapshot(path)
    assert [e.producer_id for e in loaded] == [7, 8]
    first, second = loaded
    assert (first.producer_epoch, first.coordinator_epoch, first.current_txn_first_offset,
            first.last_timestamp) == (3, 9, 43, T0 + 5)
    # Kafka's format keeps one batch per producer; its timestamp is the entry's last timestamp.
    assert list(first.batch_metadata) == [BatchMetadata(2, 42, 0, T0 + 5)]
    assert second == ProducerStateEntry(8, 1, coordinator_epoch=2, last_timestamp=T0)
    assert second.is_empty


@pytest.mark.parametrize("damage", ["crc", "version", "truncated", "short"])
def test_corrupt_snapshot_detected(tmp_path, damage):
    path = tmp_path / "00000000000000000005.snapshot"
    write_snapshot(path, [ProducerStateEntry(1, 0, last_timestamp=T0)])
    data = bytearray(path.read_bytes())
    if damage == "crc":
        data[-1] ^= 0xFF
    elif damage == "version":
        data[0:2] = struct.pack(">h", 2)
    elif damage == "truncated":
        del data[-3:]
    else:
        del data[4:]
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError) as err:
        read_snapshot(path)
    assert isinstance(err.value, KafkaStorageError)


def test_corrupt_latest_snapshot_is_deleted_and_older_one_loaded(tmp_path, clock):
    write_snapshot(tmp_path / "00000000000000000010.snapshot",
                   [ProducerStateEntry(1, 0, last_timestamp=T0)])
    bad = tmp_path / "00000000000000000020.snapshot"
    bad.write_bytes(b"\x00\x01garbage")
    psm = ProducerStateManager(TP, tmp_path, clock=clock)
    psm.truncate_and_reload(0, 30, clock.milliseconds())
    assert not bad.exists()
    assert psm.map_end_offset == 10
    assert list(psm.active_producers) == [1]


def test_truncate_and_reload_picks_latest_snapshot_in_range(tmp_path, clock):
    psm = ProducerStateManager(TP, tmp_path, clock=clock)
    for offset in range(0, 40, 10):                      # snapshots at 10, 20, 30, 40
        append(psm, data_header(offset, offset, count=10, ts=clock.milliseconds()))
        assert psm.take_snapshot() == tmp_path / f"{offset + 10:020d}.snapshot"
    assert (psm.oldest_snapshot_offset, psm.latest_snapshot_offset) == (10, 40)

    psm = ProducerStateManager(TP, tmp_path, clock=clock)       # a restart
    psm.truncate_and_reload(10, 25, clock.milliseconds())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000020.snapshot"]
    assert psm.snapshot_file_for(40) is None and psm.fetch_snapshot(20) is not None
    assert psm.map_end_offset == 20
    entry = psm.last_entry(PID)
    assert (entry.last_seq, entry.last_data_offset) == (19, 19)
    # Only the last batch survives a reload: it is still recognised as a duplicate.
    assert psm.find_duplicate(data_header(10, 10, count=10)) is not None
    # Replay continues the sequence.
    append(psm, data_header(20, 20, count=5))
    assert psm.map_end_offset == 25
    # At the map end already: only the log start moves.
    psm.truncate_and_reload(20, 25, clock.milliseconds())
    assert psm.map_end_offset == 25 and psm.last_entry(PID).last_seq == 24
    assert psm.latest_snapshot_offset is None


def test_truncate_and_reload_without_snapshot_starts_at_log_start(tmp_path, clock):
    psm = ProducerStateManager(TP, tmp_path, clock=clock)
    append(psm, data_header(0, 0, count=10))
    psm.take_snapshot()
    psm.truncate_and_reload(10, 12, clock.milliseconds())    # snapshot at the start is dropped
    assert psm.latest_snapshot_offset is None
    assert psm.map_end_offset == 10 and psm.is_empty


def test_delete_snapshots_before_and_truncate_fully(psm, tmp_path):
    for seq, offset in enumerate((0, 5, 9)):
        append(psm, data_header(offset, seq))
        psm.take_snapshot()
    assert psm.snapshot_offsets == [1, 6, 10]
    psm.delete_snapshots_before(6)
    assert psm.snapshot_offsets == [6, 10]
    assert not (tmp_path / f"{1:020d}.snapshot").exists()
    psm.truncate_fully_and_start_at(100)
    assert psm.snapshot_offsets == [] and not list(tmp_path.iterdir())
    assert psm.map_end_offset == 100 and psm.is_empty and psm.first_unstable_offset() is None


def test_on_log_start_offset_incremented_moves_map_end(psm):
    append(psm, data_header(0, 0))
    psm.on_log_start_offset_incremented(50)
    assert psm.map_end_offset == 50
    assert psm.take_snapshot() is None       # nothing applied above the new start yet
    append(psm, data_header(50, 1))
    assert psm.take_snapshot().name == f"{51:020d}.snapshot"


# ---------------------------------------------------------------------------------------------
# expiration


def test_idle_producers_expire_but_not_during_a_transaction(psm, clock):
    append(psm, data_header(0, 0, ts=clock.milliseconds()))
    append(psm, data_header(1, 0, pid=2, ts=clock.milliseconds(), txn=True))
    clock.advance_ms(59_999)
    psm.remove_expired_producers(clock.milliseconds())
    assert set(psm.active_producers) == {PID, 2}
    clock.advance_ms(1)
    psm.remove_expired_producers(clock.milliseconds())
    assert set(psm.active_producers) == {2}


def test_expired_producers_are_not_loaded_from_snapshot(tmp_path, clock):
    psm = ProducerStateManager(TP, tmp_path, producer_id_expiration_ms=60_000, clock=clock)
    append(psm, data_header(0, 0, ts=clock.milliseconds()))
    clock.advance_ms(30_000)
    append(psm, data_header(1, 0, pid=2, ts=clock.milliseconds()))
    psm.take_snapshot()
    clock.advance_ms(40_000)
    reloaded = ProducerStateManager(TP, tmp_path, producer_id_expiration_ms=60_000, clock=clock)
    reloaded.truncate_and_reload(0, 5, clock.milliseconds())
    assert set(reloaded.active_producers) == {2}
    assert reloaded.map_end_offset == 2
