"""Hot consume, session after session on one broker: where a round's time goes.

    python -m benchmarks.consume_sessions --system strata|kafka [--records 1000000]
        [--sessions 8] [--cpu-load 1] [--client-heap kept|returned] [--override KEY=VALUE ...]

One broker, one topic of ``--records`` 1 KiB records (produced and read once untimed), then
``--sessions`` consumer sessions in a row (``workloads.consume_throughput``), under
``--cpu-load`` spinning processes as ``compare --cpu-load``. Each session prints its MiB/s,
the broker's CPU-seconds per GiB split into user and system time (``/proc/<pid>/stat``, the
main process; the JVM for Kafka), the consumer's (this process: the Python loop and
librdkafka's threads), and, when ``perf`` can trace it, the broker's ``sendfile``
calls, context switches and CPU migrations (``perf stat -p``). It separates what varies
between sessions (the kernel's share, the syscall pattern) from what ``compare`` reports as
one figure per round. ``--client-heap`` as in ``compare``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.brokers import kafka_libs_for, make_broker
from benchmarks.compare import CpuLoad
from benchmarks.cpu import user_system_seconds
from benchmarks.workloads import (
    CLIENT_HEAPS, MIB, Topics, apply_client_heap, consume_throughput, log, produce_throughput,
    random_values)

PERF_EVENTS = "syscalls:sys_enter_sendfile64,context-switches,cpu-migrations"


def perf_counts(err: str) -> dict[str, int]:
    counts = {}
    for line in err.splitlines():   # perf stat -x, : value,unit,event,...
        f = line.split(",")
        if len(f) > 2 and f[0].strip().isdigit():
            counts[f[2].split(":")[-1].replace("sys_enter_", "")] = int(f[0])
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=("strata", "kafka"), required=True)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--cpu-load", type=int, default=1)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kafka-libs", default=None)
    ap.add_argument("--client-heap", choices=CLIENT_HEAPS, default="kept")
    args = ap.parse_args(argv)
    log(f"client heap: {apply_client_heap(args.client_heap)}")
    overrides = dict(o.split("=", 1) for o in args.override)
    data = Path(tempfile.mkdtemp(prefix="consume-sessions-", dir="/var/tmp"))
    broker = make_broker(args.system, data, kafka_libs_for(args.system, args.kafka_libs), overrides)
    perf = shutil.which("perf")
    broker.start()
    try:
        topic = Topics(broker.bootstrap).new("sessions")
        produce_throughput(broker.bootstrap, topic, args.records, random_values(1024), "1")
        consume_throughput(broker.bootstrap, topic, [0], args.records)   # pages in, JIT warm
        gib = args.records * 1024 / (1024 * MIB)
        with CpuLoad(args.cpu_load):
            for i in range(args.sessions):
                tracer = subprocess.Popen([perf, "stat", "-x,", "-e", PERF_EVENTS, "-p",
                                           str(broker.pid)], stderr=subprocess.PIPE, text=True) \
                    if perf else None
                time.sleep(0.2)   # perf attached before the session starts
                u0, s0 = user_system_seconds(broker.pid)
                c0 = os.times()
                res = consume_throughput(broker.bootstrap, topic, [0], args.records)
                c1 = os.times()
                u1, s1 = user_system_seconds(broker.pid)
                counts = {}
                if tracer is not None:
                    tracer.send_signal(2)
                    counts = perf_counts(tracer.communicate()[1])
                shown = "".join(f", {k} {v}" for k, v in counts.items())
                print(f"{args.system} session {i + 1}: {res['MiB/s']:.0f} MiB/s, user "
                      f"{(u1 - u0) / gib:.2f} + system {(s1 - s0) / gib:.2f} CPU-s/GiB; consumer "
                      f"{(c1.user - c0.user) / gib:.2f} + {(c1.system - c0.system) / gib:.2f}"
                      f"{shown}", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
