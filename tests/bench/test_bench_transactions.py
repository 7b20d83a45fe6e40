"""The transactions benchmark's bookkeeping: which transactions it aborts, the read_committed
check by key, the summary and the options (the workloads themselves need a broker)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.transactions import (aborted, check_committed, committed_txns, line,
                                       parse_args, summarize, txn_key)


def test_every_tenth_transaction_is_aborted_and_none_without_abort_every():
    assert [t for t in range(30) if aborted(t, 10)] == [9, 19, 29]
    assert committed_txns(20, 10) == [t for t in range(20) if t not in (9, 19)]
    assert committed_txns(5, 0) == [0, 1, 2, 3, 4]
    assert len(committed_txns(200, 10)) == 180


def test_the_committed_check_accepts_exactly_the_committed_transactions():
    want = Counter({txn_key(t): 1000 for t in committed_txns(20, 10)})
    check_committed(want, 20, 1000, 10)


@pytest.mark.parametrize("change, says", [
    (lambda c: c.update({txn_key(9): 1000}), "aborted or unknown [9]"),     # an aborted one
    (lambda c: c.pop(txn_key(3)), "missing [3]"),
    (lambda c: c.subtract({txn_key(4): 1}), "wrong count [4]"),
])
def test_the_committed_check_names_what_is_wrong(change, says):
    keys = Counter({txn_key(t): 1000 for t in committed_txns(20, 10)})
    change(keys)
    with pytest.raises(RuntimeError, match=says.replace("[", r"\[").replace("]", r"\]")):
        check_committed(keys, 20, 1000, 10)


def _produce(round_no: int, txn_s: float) -> dict:
    return {"workload": "txn-produce", "round": round_no, "partitions": 1, "transactions": 200,
            "aborted": 0, "seconds": 200 / txn_s, "txn/s": txn_s, "MiB/s": txn_s * 0.9766,
            "commit_p50_ms": 5.0, "commit_p99_ms": 20.0, "commit_max_ms": 30.0, "init_s": 0.01,
            "broker CPU s": 1.0, "broker CPU s/GiB": 5.0}


def test_summary_keeps_every_round_and_the_median():
    rounds = [_produce(1, 50.0), _produce(2, 70.0), _produce(3, 60.0),
              {"workload": "read-committed-consume", "round": 1, "partitions": 1,
               "data": "with-aborts", "records": 180_000, "seconds": 0.6, "MiB/s": 290.0,
               "broker CPU s": 0.2, "broker CPU s/GiB": 1.1}]
    s = summarize(rounds)
    assert s["txn-produce 1"]["txn/s"] == {"median": 60.0, "min": 50.0, "max": 70.0,
                                           "rounds": [50.0, 70.0, 60.0]}
    assert s["read-committed-consume 1 with-aborts"]["MiB/s"]["rounds"] == [290.0]
    assert "txn/s" in line(rounds[0]) and "with-aborts" in line(rounds[3])


def test_options():
    args = parse_args(["--system", "kafka"])
    assert (args.rounds, args.transactions, args.records_per_txn, args.record_size,
            args.partition_counts, args.abort_every) == (3, 200, 1000, 1024, [1, 6], 10)
    with pytest.raises(SystemExit):
        parse_args(["--system", "strata", "--abort-every", "1"])
