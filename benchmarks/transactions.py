"""Kafka transactions on one broker: transactions per second and read_committed consume
throughput, Strata against Apache Kafka 4.x on this machine (issue 29).

    python -m benchmarks.transactions --system strata|kafka --rounds N [--transactions T]
        [--record-size B] [--records-per-txn R] [--partitions 1,6] [--abort-every 10]
        [--warmup-transactions 200] [--json F]

One broker, started once for all rounds (``benchmarks.brokers.make_broker``: Strata is
``strata serve`` with its defaults, Kafka 4.x one KRaft node in combined mode, both with the
harness's ``COMMON_BROKER`` settings). Records are ``--record-size`` (1 KiB) random
(incompressible) values, no compression; each record's key is its transaction's number (4
bytes, big-endian), so that a reader can tell which transaction a record belongs to. MiB/s
counts record value bytes only (records x record size), as workloads.py does. Before the first
round, for each partition count, ``--warmup-transactions`` (200: as many records as make bench's
warm-up) transactions, every ``--abort-every``-th aborted, and a read_committed read of them run
untimed on a topic of their own: the first InitProducerId creates the transaction state topic,
and Kafka's JIT starts cold.

Each round, for each ``--partitions`` count (1, then 6), on fresh topics deleted afterwards:

``txn-produce``
    One confluent-kafka producer with workloads.py's settings (acks=all, idempotence on,
    linger.ms 5, batch.size 1 MB, no compression) and a ``transactional.id`` of its own.
    ``init_transactions()`` runs untimed (its seconds are reported as ``init_s``: about 0.5 s
    whenever librdkafka looks the coordinator up before its connection to the broker is up and
    waits for its coordinator query timer, on either system). Then, timed,
    ``--transactions`` (200) times: ``begin_transaction()``, ``--records-per-txn`` (1,000)
    ``produce()`` calls (record i of a transaction to partition i mod partitions, so that every
    transaction writes to every partition), ``commit_transaction()``. transactions/s and MiB/s
    are over the time from the first begin to the last commit's return; ``commit_*_ms`` are
    percentiles of the ``commit_transaction()`` calls, which include librdkafka's flush of the
    transaction's records not yet acknowledged (the produce() calls only queue them) and then
    EndTxn (the coordinator's PrepareCommit written, the markers written before or after the
    answer as the broker does it).

``txn-produce-aborts``
    The same on a second topic, except that every ``--abort-every``-th (10th) transaction is
    aborted: its records are flushed (so they are in the log) and ``abort_transaction()`` is
    called. Its figures are reported too: ``commit_*_ms`` over the committed transactions,
    ``end_*_ms`` over the commits and the aborts together.

``read-committed-consume``
    A confluent-kafka consumer with workloads.consumer_config (assigned, no group; its
    ``fetch.queue.backoff.ms`` of 10), ``enable.partition.eof`` (for the end check below) and
    ``isolation.level=read_committed`` reads each
    partition from its start, as workloads.consume_throughput does (start offsets looked up
    before the clock starts), until it has the committed records: all of ``txn-produce``'s
    (``data=all-committed``), and of ``txn-produce-aborts``'s only the committed transactions'
    (``data=with-aborts``, where the broker must send the aborted transactions' list and the
    client drop their records). MiB/s is the delivered records' value bytes over the time from
    assign() to the last expected record. After the clock stops it keeps reading until every
    partition reports end-of-partition at or past its high watermark and fails the run if a
    single record more arrives; for ``with-aborts`` a second, untimed read_committed pass checks
    by key that exactly the committed transactions arrived, each with all its records.

``read-uncommitted-consume``
    The same consumer with ``isolation.level=read_uncommitted`` on the same two topics, for
    reference: it receives every record, the aborted transactions' too (counted and asserted).

Beside each timed figure: the broker's CPU-seconds over the span (user + system of its process
tree, ``benchmarks.cpu``) and per GiB of record values produced or delivered. Each round
records ``uptime`` (the load averages) before and after it; on a shared machine every figure
says as much about the load as about the broker.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from benchmarks.brokers import find_kafka_libs, kafka_version, log, make_broker
from benchmarks.cpu import CpuMeter
from benchmarks.replication import source_tree, uptime
from benchmarks.workloads import (MIB, Topics, consumer_config, percentile, producer_config,
                                    random_values)

WORKLOADS = ("txn-produce", "txn-produce-aborts", "read-committed-consume",
             "read-uncommitted-consume")
STALL_TIMEOUT_S = 30


def txn_key(txn: int) -> bytes:
    return struct.pack(">I", txn)


def aborted(txn: int, abort_every: int) -> bool:
    """Whether transaction ``txn`` (0-based) is aborted: every ``abort_every``-th one, none if 0."""
    return abort_every > 0 and txn % abort_every == abort_every - 1


def committed_txns(transactions: int, abort_every: int) -> list[int]:
    return [t for t in range(transactions) if not aborted(t, abort_every)]


# --- the producer --------------------------------------------------------------------------

def txn_produce(bootstrap: str, topic: str, partitions: int, transactions: int,
                per_txn: int, values: list[bytes], abort_every: int = 0) -> dict:
    """``transactions`` transactions of ``per_txn`` records on one transactional producer; every
    ``abort_every``-th aborted (after its records are flushed into the log)."""
    from confluent_kafka import KafkaException, Producer
    delivered = [0]
    errors: list = []

    def report(err, msg) -> None:
        if err is None:
            delivered[0] += 1
        else:
            errors.append(err)

    p = Producer({**producer_config(bootstrap, "all"),
                  "transactional.id": f"bench-txn-{uuid.uuid4().hex[:12]}",
                  "on_delivery": report})
    p.list_topics(topic, timeout=10)    # connect and learn the leaders before the clock starts
    t0 = time.perf_counter()
    p.init_transactions(60)
    init_s = time.perf_counter() - t0
    produce, poll, mask = p.produce, p.poll, len(values) - 1
    ends: list[float] = []                # commit_transaction() / abort_transaction() seconds
    commits: list[float] = []
    t_start = time.perf_counter()
    for txn in range(transactions):
        key = txn_key(txn)
        p.begin_transaction()
        for i in range(per_txn):
            while True:
                try:
                    produce(topic, values[(txn * per_txn + i) & mask], key, i % partitions)
                    break
                except BufferError:       # local queue full: let deliveries drain it
                    poll(0.005)
        poll(0)
        try:
            if aborted(txn, abort_every):
                if p.flush(60):
                    raise RuntimeError(f"transaction {txn}: records left unflushed before abort")
                t0 = time.perf_counter()
                p.abort_transaction(60)
                ends.append(time.perf_counter() - t0)
            else:
                t0 = time.perf_counter()
                p.commit_transaction(60)
                took = time.perf_counter() - t0
                ends.append(took)
                commits.append(took)
        except KafkaException as e:
            raise RuntimeError(f"transaction {txn} of {transactions}: {e.args[0]}") from e
    elapsed = time.perf_counter() - t_start
    remaining = p.flush(30)
    records = transactions * per_txn
    if errors or remaining or delivered[0] != records:
        raise RuntimeError(f"txn-produce: {delivered[0]}/{records} delivered, {len(errors)} "
                           f"errors (first: {errors[:1]}), {remaining} undelivered")
    xs = sorted(x * 1000 for x in commits)
    ys = sorted(x * 1000 for x in ends)
    nbytes = records * len(values[0])
    return {"transactions": transactions, "aborted": transactions - len(commits),
            "records": records, "bytes": nbytes, "seconds": round(elapsed, 3),
            "txn/s": round(transactions / elapsed, 2),
            "MiB/s": round(nbytes / elapsed / MIB, 2),
            "commit_p50_ms": round(percentile(xs, 50), 2),
            "commit_p99_ms": round(percentile(xs, 99), 2),
            "commit_max_ms": round(xs[-1], 2),
            "end_p50_ms": round(percentile(ys, 50), 2), "end_p99_ms": round(percentile(ys, 99), 2),
            "init_s": round(init_s, 3)}


# --- the consumer --------------------------------------------------------------------------

def _consumer(bootstrap: str, isolation: str):
    from confluent_kafka import Consumer
    return Consumer({**consumer_config(bootstrap), "isolation.level": isolation,
                     "enable.partition.eof": True})


def consume_isolated(bootstrap: str, topic: str, partitions: int, n: int, isolation: str) -> dict:
    """workloads.consume_throughput's loop at ``isolation``: the seconds to receive ``n``
    records; then, untimed, reads on until every partition is at its end and fails if a single
    record more arrives."""
    from confluent_kafka import KafkaError, TopicPartition
    c = _consumer(bootstrap, isolation)
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                 for p in range(partitions)]
        count = nbytes = 0
        at_end: dict[int, int] = {}        # partition: the highest end-of-partition offset seen
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, low) for p, (low, _) in enumerate(marks)])
        last_progress = time.monotonic()
        while count < n:
            msgs = c.consume(num_messages=min(n - count, 10_000), timeout=1.0)
            if not msgs:
                if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    raise RuntimeError(f"{isolation} consume: stalled at {count}/{n} records")
                continue
            last_progress = time.monotonic()
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end[m.partition()] = max(at_end.get(m.partition(), -1), m.offset())
                        continue
                    raise RuntimeError(f"{isolation} consume: {err}")
                count += 1
                nbytes += len(m)
        elapsed = time.perf_counter() - t0
        # untimed: nothing more may arrive before every partition reports its end
        extra = 0
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while any(at_end.get(p, -1) < high for p, (_, high) in enumerate(marks)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{isolation} consume: no end of partition after {n} records "
                                   f"(ends seen {at_end}, high watermarks "
                                   f"{[h for _, h in marks]})")
            for m in c.consume(num_messages=10_000, timeout=0.5):
                err = m.error()
                if err is None:
                    extra += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end[m.partition()] = max(at_end.get(m.partition(), -1), m.offset())
                else:
                    raise RuntimeError(f"{isolation} consume: {err}")
        if extra:
            raise RuntimeError(f"{isolation} consume: {n} records expected, {n + extra} arrived")
    finally:
        c.close()
    return {"records": count, "bytes": nbytes, "seconds": round(elapsed, 3),
            "MiB/s": round(nbytes / elapsed / MIB, 2), "records/s": round(count / elapsed)}


def committed_keys(bootstrap: str, topic: str, partitions: int) -> Counter:
    """Untimed: records per transaction key that a read_committed consumer receives, read to the
    end of every partition."""
    from confluent_kafka import KafkaError, TopicPartition
    c = _consumer(bootstrap, "read_committed")
    keys: Counter = Counter()
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                 for p in range(partitions)]
        c.assign([TopicPartition(topic, p, low) for p, (low, _) in enumerate(marks)])
        at_end: dict[int, int] = {}
        deadline = time.monotonic() + 120
        while any(at_end.get(p, -1) < high for p, (_, high) in enumerate(marks)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"verify {topic}: not at the end after 120 s ({at_end})")
            for m in c.consume(num_messages=10_000, timeout=0.5):
                err = m.error()
                if err is None:
                    keys[m.key()] += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end[m.partition()] = max(at_end.get(m.partition(), -1), m.offset())
                else:
                    raise RuntimeError(f"verify {topic}: {err}")
    finally:
        c.close()
    return keys


def check_committed(keys: Counter, transactions: int, per_txn: int, abort_every: int) -> None:
    """``keys`` must be exactly the committed transactions, each with all its records."""
    want = Counter({txn_key(t): per_txn for t in committed_txns(transactions, abort_every)})
    if keys != want:
        missing = sorted(struct.unpack(">I", k)[0] for k in want.keys() - keys.keys())
        unexpected = sorted(struct.unpack(">I", k)[0] for k in keys.keys() - want.keys())
        short = sorted(struct.unpack(">I", k)[0] for k in want.keys() & keys.keys()
                       if keys[k] != want[k])
        raise RuntimeError(f"read_committed delivered the wrong transactions: missing "
                           f"{missing[:10]}, aborted or unknown {unexpected[:10]}, "
                           f"wrong count {short[:10]}")


# --- rounds --------------------------------------------------------------------------------

def measured(pid: int, fn, *args, **kwargs) -> dict:
    """``fn``'s figures with the broker's CPU-seconds over the call, per GiB of its ``bytes``."""
    with CpuMeter(pid) as cpu:
        res = fn(*args, **kwargs)
    res.update({k: round(v, 3) for k, v in cpu.figures(res["bytes"]).items()})
    return res


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Frees the disk between rounds; a failure is reported but does not end the run."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    for name, f in admin.delete_topics(names, request_timeout=30).items():
        try:
            f.result(60)
        except Exception as e:  # noqa: BLE001
            log(f"deleting {name}: {e}")


def run_round(broker, number: int, partitions: int, args, values: list[bytes]) -> list[dict]:
    """One round at one partition count: every workload, in the order of the module docstring."""
    bootstrap, pid = broker.bootstrap, broker.pid
    topics = Topics(bootstrap, partitions, 1)
    T, R = args.transactions, args.records_per_txn
    base = {"round": number, "partitions": partitions}
    out: list[dict] = []
    load_before = uptime()
    made: list[str] = []
    try:
        plain = topics.new(f"txn{partitions}")
        made.append(plain)
        out.append({"workload": "txn-produce", **base,
                    **measured(pid, txn_produce, bootstrap, plain, partitions, T, R, values)})
        mixed = topics.new(f"txnab{partitions}")
        made.append(mixed)
        out.append({"workload": "txn-produce-aborts", **base, "abort_every": args.abort_every,
                    **measured(pid, txn_produce, bootstrap, mixed, partitions, T, R, values,
                               args.abort_every)})
        n_committed = len(committed_txns(T, args.abort_every)) * R
        for data, topic, n_rc in (("all-committed", plain, T * R),
                                  ("with-aborts", mixed, n_committed)):
            out.append({"workload": "read-committed-consume", **base, "data": data,
                        **measured(pid, consume_isolated, bootstrap, topic, partitions, n_rc,
                                   "read_committed")})
            out.append({"workload": "read-uncommitted-consume", **base, "data": data,
                        **measured(pid, consume_isolated, bootstrap, topic, partitions, T * R,
                                   "read_uncommitted")})
        check_committed(committed_keys(bootstrap, mixed, partitions), T, R, args.abort_every)
    finally:
        delete_topics(bootstrap, made)
    load_after = uptime()
    for r in out:
        r.update(uptime_before=load_before, uptime_after=load_after)
    return out


def warm_up(broker, args, values: list[bytes]) -> dict:
    """Untimed, the same for both systems: the transaction state topic created by the first
    InitProducerId, then for each partition count ``--warmup-transactions`` transactions (every
    ``--abort-every``-th aborted) and a read_committed read of them, so that a JIT has seen
    every path the rounds take."""
    out: dict = {}
    if args.warmup_transactions <= 0:
        return out
    for partitions in args.partition_counts:
        topic = Topics(broker.bootstrap, partitions, 1).new(f"txnwarm{partitions}")
        try:
            res = txn_produce(broker.bootstrap, topic, partitions, args.warmup_transactions,
                              args.records_per_txn, values, args.abort_every)
            kept = len(committed_txns(args.warmup_transactions, args.abort_every))
            consume_isolated(broker.bootstrap, topic, partitions, kept * args.records_per_txn,
                             "read_committed")
        finally:
            delete_topics(broker.bootstrap, [topic])
        out[str(partitions)] = {"transactions": args.warmup_transactions,
                                "init_s": res["init_s"], "txn/s": res["txn/s"]}
    return out


def line(r: dict) -> str:
    w = r["workload"]
    head = f"{w} {r['partitions']} partition(s)"
    if "data" in r:
        head += f" {r['data']}"
    head += f" round {r['round']}: "
    cpu = f"broker CPU {r['broker CPU s']:.2f} s ({r['broker CPU s/GiB']:.2f} s/GiB)"
    if w.startswith("txn-produce"):
        return (head + f"{r['transactions']} transactions ({r['aborted']} aborted) in "
                f"{r['seconds']:.2f} s, {r['txn/s']:.1f} txn/s, {r['MiB/s']:.1f} MiB/s; commit p50 "
                f"{r['commit_p50_ms']:.1f} ms, p99 {r['commit_p99_ms']:.1f} ms, max "
                f"{r['commit_max_ms']:.1f} ms; init {r['init_s']:.2f} s; {cpu}")
    return (head + f"{r['records']} records in {r['seconds']:.2f} s, {r['MiB/s']:.1f} MiB/s; "
            f"{cpu}")


SUMMARY_KEYS = {"txn-produce": ("txn/s", "MiB/s", "commit_p50_ms", "commit_p99_ms",
                                "broker CPU s/GiB"),
                "txn-produce-aborts": ("txn/s", "MiB/s", "commit_p50_ms", "commit_p99_ms",
                                       "broker CPU s/GiB"),
                "read-committed-consume": ("MiB/s", "broker CPU s/GiB"),
                "read-uncommitted-consume": ("MiB/s", "broker CPU s/GiB")}


def summarize(rounds: list[dict]) -> dict:
    """{"workload partitions[ data]": {metric: {median, min, max, rounds}}}."""
    groups: dict[str, list[dict]] = {}
    for r in rounds:
        label = f"{r['workload']} {r['partitions']}" + (f" {r['data']}" if "data" in r else "")
        groups.setdefault(label, []).append(r)
    out = {}
    for label, rs in groups.items():
        out[label] = {}
        for k in SUMMARY_KEYS[rs[0]["workload"]]:
            xs = [r[k] for r in rs]
            out[label][k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
                             "rounds": xs}
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", choices=("strata", "kafka"), required=True)
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--transactions", type=int, default=200,
                    help="transactions per produce round (default 200)")
    ap.add_argument("--records-per-txn", type=int, default=1000,
                    help="records per transaction (default 1000)")
    ap.add_argument("--record-size", type=int, default=1024, help="value bytes (default 1024)")
    ap.add_argument("--partitions", default="1,6",
                    help="partition counts of the topics, comma separated (default 1,6)")
    ap.add_argument("--abort-every", type=int, default=10,
                    help="txn-produce-aborts aborts every Nth transaction (default 10)")
    ap.add_argument("--warmup-transactions", type=int, default=200,
                    help="untimed transactions for each partition count before the first round "
                         "(default 200)")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")
    ap.add_argument("--dir", type=Path, help="data directory (default: a temporary one, removed)")
    ap.add_argument("--kafka-libs", help="Kafka's jars (default: make kafka-dist's cache)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker property (on top of the harness's)")
    args = ap.parse_args(argv)
    if args.abort_every == 1 or args.abort_every < 0:
        ap.error("--abort-every: 0 (none) or at least 2")
    if args.transactions < 1 or args.records_per_txn < 1 or args.rounds < 1:
        ap.error("--rounds, --transactions and --records-per-txn must be positive")
    args.partition_counts = [int(x) for x in args.partitions.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    libs = None
    if args.system == "kafka":
        libs, why = find_kafka_libs(args.kafka_libs)
        if libs is None:
            raise SystemExit(why)
    overrides = dict(item.split("=", 1) for item in args.override)
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"txn-bench-{args.system}-"))
    broker = make_broker(args.system, root / args.system, libs, overrides)
    version = (f"Apache Kafka {kafka_version(libs)}" if libs is not None
               else f"Strata {source_tree()}")
    values = random_values(args.record_size)
    rounds: list[dict] = []
    try:
        log(f"starting {args.system} under {root}")
        started = broker.start()
        log(f"{args.system} up after {started:.1f} s; {uptime()}")
        warm = warm_up(broker, args, values)
        log(f"warm-up: {warm}")
        for n in range(1, args.rounds + 1):
            for partitions in args.partition_counts:
                res = run_round(broker, n, partitions, args, values)
                rounds += res
                for r in res:
                    print(line(r), flush=True)
                print(f"  round {n}, {partitions} partition(s): before {res[0]['uptime_before']}; "
                      f"after {res[0]['uptime_after']}", flush=True)
    except BaseException:
        log(f"--- {broker.log_path} ---\n{broker.output_tail(30)}")
        raise
    finally:
        code = broker.stop()
        if code not in (0, None, 143, -15):
            log(f"{args.system} exited with {code}:\n{broker.output_tail()}")
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarize(rounds)
    for label, stats in summary.items():
        for k, s in stats.items():
            print(f"{label} {k}: median {s['median']} (min {s['min']}, max {s['max']}) over "
                  f"{len(s['rounds'])} rounds")
    if args.json:
        args.json.write_text(json.dumps({
            "system": args.system, "version": version, "source": source_tree(),
            "command": shlex.join(["python", "-m", "benchmarks.transactions",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "cpus": os.cpu_count(), "record_size": args.record_size,
            "transactions": args.transactions, "records_per_txn": args.records_per_txn,
            "abort_every": args.abort_every, "warmup": warm, "uptime_end": uptime(),
            "rounds": rounds, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
