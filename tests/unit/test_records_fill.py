"""The produce path's record framing check (``log_validator._records_fill``) against a plain walk.

Runs of equal-length records are proven with strided slices instead of being stepped one by
one; the answer must be the plain walk's for any data: runs of every length and varint width,
lengths that change mid-batch, wrong counts, torn or padded tails, damaged prefixes, data
inside a larger buffer, and each buffer type the validator passes (bytes, bytearray, mmap).
"""

from __future__ import annotations

import mmap

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.log.log_validator import _records_fill, _RUN_PROBE
from strata.protocol.records import MIN_RECORD_LENGTH
from strata.protocol.wire import read_varint, write_varint


def plain_walk(data, count: int, lo: int, hi: int) -> bool:
    pos, n = lo, 0
    try:
        while pos < hi:
            length, pos = read_varint(data, pos)
            if length < MIN_RECORD_LENGTH:
                return False
            pos += length
            n += 1
    except (IndexError, ValueError):
        return False
    return pos == hi and n == count


# record lengths whose varints are one, two and three bytes wide, and a few too short
lengths = st.one_of(st.integers(0, 63), st.integers(64, 8191), st.integers(8192, 20_000))
runs = st.lists(st.tuples(lengths, st.integers(1, 3 * _RUN_PROBE)), min_size=1, max_size=6)


def framed(run_list) -> tuple[bytearray, int]:
    out = bytearray()
    count = 0
    for length, repeat in run_list:
        for _ in range(repeat):
            write_varint(out, length)
            out += bytes([count % 251]) * length
            count += 1
    return out, count


@settings(max_examples=400, deadline=None)
@given(runs, st.integers(-1, 1), st.sampled_from(["whole", "torn", "padded", "damaged"]),
       st.data(), st.sampled_from([bytes, bytearray, "mmap"]), st.integers(0, 5))
def test_records_fill_agrees_with_a_plain_walk(run_list, count_delta, damage, data, kind, margin):
    records, count = framed(run_list)
    if damage == "torn" and records:
        del records[-data.draw(st.integers(1, min(len(records), 3)), label="torn"):]
    elif damage == "padded":
        records += b"\x00" * data.draw(st.integers(1, 3), label="pad")
    elif damage == "damaged" and records:
        at = data.draw(st.integers(0, len(records) - 1), label="at")
        records[at] = data.draw(st.integers(0, 255), label="byte")
    count += count_delta
    buf = bytearray(b"\xff" * margin) + records + bytearray(b"\x81" * margin)
    lo, hi = margin, margin + len(records)
    if kind == "mmap":
        region = mmap.mmap(-1, max(len(buf), 1))
        region[:len(buf)] = buf
        target = region
    else:
        target = kind(buf)
    assert _records_fill(target, count, None, lo, hi) == plain_walk(buf, count, lo, hi)


def test_a_batch_of_equal_records_is_framed_without_stepping_each(monkeypatch):
    """A thousand equal records take one strided proof, not a thousand steps: the varint
    reader for wide prefixes is never reached, though every prefix here is three bytes."""
    import strata.log.log_validator as log_validator
    data, count = framed([(10_000, 1000)])
    calls = []
    real = log_validator.read_varint

    def counted(buf, pos):
        calls.append(pos)
        return real(buf, pos)
    monkeypatch.setattr(log_validator, "read_varint", counted)
    assert log_validator._records_fill(bytes(data), count)
    assert len(calls) == 1
    assert not log_validator._records_fill(bytes(data), count + 1)
    assert not log_validator._records_fill(bytes(data[:-1]), count)
