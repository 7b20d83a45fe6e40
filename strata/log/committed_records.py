"""Committed records of one partition's local log, for the broker's own internal topics.

``read_committed`` walks a log whole batches at a time from an offset to its high watermark
and yields only what a read_committed consumer would see: control batches are skipped, and
records of transactional batches are held per producer id until their marker says commit
(abort drops them; a transaction still open at the high watermark is not yet visible, as in
Kafka's coordinator loaders). Records of a committed transaction therefore come out at
their marker, after non-transactional records written in between.

Used by the loaders of ``__consumer_offsets`` and ``__remote_log_metadata``; callers run it
on their own thread (each chunk read takes the log's lock briefly).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from strata.log.unified_log import FetchIsolation, UnifiedLog
from strata.protocol import records as rec

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1024 * 1024


def read_committed(ulog: UnifiedLog, start_offset: int = 0, *,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   to_log_end: bool = False) -> Iterator[rec.Record]:
    """Committed records of ``ulog`` at offsets >= ``start_offset`` (raised to the first
    local offset) below the high watermark as it is when the walk starts; with
    ``to_log_end``, below the log end offset (a coordinator loading the log it now leads:
    a new leader's high watermark lags its log end until the followers fetch again, and what
    it holds there was acknowledged).

    A transaction that began before ``start_offset`` is seen only from ``start_offset`` on:
    start at a point where no transaction is open to see whole transactions.
    """
    start = max(start_offset, ulog.log_start_offset, ulog.local_log_start_offset)
    isolation = FetchIsolation.LOG_END if to_log_end else FetchIsolation.HIGH_WATERMARK
    end = ulog.log_end_offset if to_log_end else ulog.high_watermark
    offset = start
    pending: dict[int, list[rec.Record]] = {}
    while offset < end:
        data = ulog.read(offset, chunk_bytes, isolation, True).records
        if not data:
            break
        next_offset = offset
        for header in rec.iter_headers(data):
            next_offset = max(next_offset, header.next_offset)
            if header.is_control:
                if header.record_count == 0:
                    continue   # a marker the cleaner emptied: its transaction is long over
                held = pending.pop(header.producer_id, [])
                if rec.control_type(data, header) == rec.CONTROL_COMMIT:
                    yield from held
                continue
            records = [r for r in rec.decode_batch(data, header) if r.offset >= start]
            if header.is_transactional:
                pending.setdefault(header.producer_id, []).extend(records)
            else:
                yield from records
        if next_offset <= offset:
            log.error("no progress reading %s at offset %d", ulog.topic_partition, offset)
            break
        offset = next_offset
    if pending:
        log.info("%s: %d open transaction(s) at the high watermark are not yet visible",
                 ulog.topic_partition, len(pending))
