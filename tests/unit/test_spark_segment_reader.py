"""RemoteSegmentReader over a real RSM with tiny chunks: batches cut anywhere by chunk ends
(inside their 12-byte length prefix too) are joined, and a damaged segment is an error naming
the position of the bad batch, never data."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from test_remote_storage import Segment

pytest.importorskip("pyarrow")

from strata.protocol.records import LOG_OVERHEAD, iter_headers  # noqa: E402
from strata.spark.remote_segments import (  # noqa: E402
    RemoteSegmentReader, rsm_props_from_options)
from strata.tiered.api import RemoteStorageException  # noqa: E402


def reader(tmp_path, chunk_size: int) -> RemoteSegmentReader:
    return RemoteSegmentReader(rsm_props_from_options({
        "rsm.config.storage.url": (tmp_path / "remote").as_uri(),
        "rsm.config.chunk.size": str(chunk_size)}))


def uploaded(tmp_path, r: RemoteSegmentReader, body: bytes | None = None):
    """A real segment copied through ``r``'s RSM, its .log replaced by ``body`` if given."""
    seg = Segment(tmp_path / "seg", batches=30, with_txn_index=False)
    data, meta = seg.data, seg.metadata
    if body is not None:
        path = tmp_path / "damaged.log"
        path.write_bytes(body)
        data = dataclasses.replace(data, log_segment=path)
        meta = dataclasses.replace(meta, segment_size_in_bytes=len(body))
    r.rsm.copy_log_segment_data(meta, data)
    return seg, meta


@pytest.mark.parametrize("chunk_size", [5, 61, 500, 1 << 20])
def test_batches_cut_by_tiny_chunks_come_back_whole_and_in_order(tmp_path, chunk_size):
    with reader(tmp_path, chunk_size) as r:
        seg, meta = uploaded(tmp_path, r)
        got = b"".join(bytes(v) for v in r.views(meta, 0, seg.next_offset))
        assert got == seg.bytes
        later = b"".join(r.read(meta, 12, 20))
        assert [h.base_offset for h in iter_headers(later)] == list(range(12, 20))


@pytest.mark.parametrize("chunk_size", [5, 500])
def test_a_truncated_last_batch_is_an_error_at_its_position(tmp_path, chunk_size):
    whole = Segment(tmp_path / "whole", batches=30, with_txn_index=False).bytes
    last = [h for h in iter_headers(whole)][-1]
    with reader(tmp_path, chunk_size) as r:
        _, meta = uploaded(tmp_path, r, whole[:last.position + 30])
        with pytest.raises(RemoteStorageException, match=f"at position {last.position}$"):
            list(r.views(meta, 0, 10 ** 6))


@pytest.mark.parametrize("chunk_size", [5, 500])
def test_a_batch_with_an_impossible_length_is_an_error_at_its_position(tmp_path, chunk_size):
    whole = bytearray(Segment(tmp_path / "whole", batches=30, with_txn_index=False).bytes)
    bad = [h for h in iter_headers(bytes(whole))][7]
    struct.pack_into(">i", whole, bad.position + LOG_OVERHEAD - 4, 10)    # batchLength 10
    with reader(tmp_path, chunk_size) as r:
        _, meta = uploaded(tmp_path, r, bytes(whole))
        with pytest.raises(RemoteStorageException, match=f"at position {bad.position}$"):
            list(r.views(meta, 0, 10 ** 6))


def test_the_reader_trusts_batches_only_of_segments_its_rsm_vouches_for(tmp_path):
    whole = bytearray(Segment(tmp_path / "whole", batches=30, with_txn_index=False).bytes)
    with reader(tmp_path, 500) as r:
        _, intact = uploaded(tmp_path / "a", r)
        assert r.batches_verified(intact)
        whole[-1] ^= 0xFF                               # the last batch fails its CRC
        _, damaged = uploaded(tmp_path / "b", r, bytes(whole))
        assert not r.batches_verified(damaged)
        r.rsm.delete_log_segment_data(intact)
    with reader(tmp_path, 500) as fresh:                # no manifest cached
        assert not fresh.batches_verified(intact)      # the read reports the loss
