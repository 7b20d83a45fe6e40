"""The broker's CPU per Fetch, with a reader that costs almost nothing.

    python -m benchmarks.fetch_cost --system strata|kafka [--records 200000] [--passes 10]
        [--rounds 3] [--read-committed] [--json FILE]

One broker, one partition of ``--records`` 1 KiB records (produced by confluent-kafka, so in
librdkafka's batches). A reader in another process sends a consumer's Fetch requests (v12, 1 MiB
per partition) one at a time, each at the offset where the last answer ended, and receives each
answer into one reused buffer without decoding it. Each round reads the partition ``--passes``
times and prints MiB/s and the broker's user and system CPU (``/proc``) per Fetch and per GiB.

A confluent-kafka consumer takes 3-4 CPU-seconds per GiB itself (``consume_sessions``), on the
same cores as the broker, so a ``compare`` round mixes both costs. Here the reader's part is a
few syscalls per Fetch, and what is left is the broker's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path

from benchmarks.brokers import kafka_libs_for, make_broker
from benchmarks.cpu import user_system_seconds
from benchmarks.workloads import MIB, Topics, produce_throughput, random_values
from strata.net.connection import Connection, recv_into_exact
from strata.protocol.client import client_frame, fetch_request, framed
from strata.protocol.records import iter_headers

_SIZE = struct.Struct(">i")


def batch_starts(bootstrap: str, topic: str, end: int) -> list[int]:
    """The offset each Fetch of a sequential reader starts at, read once with decoding."""
    from kio.schema.fetch.v12.response import FetchResponse
    offsets, offset = [], 0
    with Connection(bootstrap, timeout=60, client_id="fetch-cost") as conn:
        while offset < end:
            part = conn.request(fetch_request(topic, 0, offset), FetchResponse).responses[0].partitions[0]
            headers = list(iter_headers(part.records or b""))
            if not headers:
                raise RuntimeError(f"no records at offset {offset} of {end} (error {part.error_code})")
            offsets.append(offset)
            offset = headers[-1].next_offset
    return offsets


def read_frames(port: int, frames: list[bytes], passes: int, out) -> None:
    """Send each frame and receive its answer into one buffer; put (seconds, answer bytes)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(4 * MIB)
    view = memoryview(buf)
    nbytes = 0
    start = time.perf_counter()
    for _ in range(passes):
        for frame in frames:
            sock.sendall(frame)
            recv_into_exact(sock, view[:4])
            size = _SIZE.unpack_from(buf)[0]
            recv_into_exact(sock, view[:size])
            nbytes += size
    out.put((time.perf_counter() - start, nbytes))
    sock.close()


def measure(broker, frames: list[bytes], passes: int) -> dict:
    """One round: the reader in its own process, the broker's CPU around it."""
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    reader = fork.Process(target=read_frames, args=(port, frames, passes, results))
    u0, s0 = user_system_seconds(broker.pid)
    reader.start()
    seconds, nbytes = results.get(timeout=600)
    reader.join()
    u1, s1 = user_system_seconds(broker.pid)
    fetches = passes * len(frames)
    gib = nbytes / (1024 * MIB)
    return {"fetches": fetches, "MiB/s": nbytes / seconds / MIB,
            "user us/Fetch": (u1 - u0) / fetches * 1e6, "system us/Fetch": (s1 - s0) / fetches * 1e6,
            "CPU s/GiB": (u1 - u0 + s1 - s0) / gib}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=("strata", "kafka"), required=True)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--read-committed", action="store_true")
    ap.add_argument("--kafka-libs", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="fetch-cost-", dir="/var/tmp"))
    broker = make_broker(args.system, data, kafka_libs_for(args.system, args.kafka_libs))
    broker.start()
    rounds = []
    try:
        topic = Topics(broker.bootstrap).new("fetch-cost")
        produce_throughput(broker.bootstrap, topic, args.records, random_values(1024), "1")
        isolation = 1 if args.read_committed else 0
        frames = [framed(client_frame(fetch_request(topic, 0, offset, isolation_level=isolation),
                                      1, "fetch-cost"))
                  for offset in batch_starts(broker.bootstrap, topic, args.records)]
        measure(broker, frames, 1)   # pages in, JIT warm
        for i in range(args.rounds):
            res = measure(broker, frames, args.passes)
            rounds.append(res)
            print(f"{args.system} round {i + 1}: {res['fetches']} Fetches, {res['MiB/s']:.0f} MiB/s, "
                  f"broker user {res['user us/Fetch']:.0f} + system {res['system us/Fetch']:.0f} "
                  f"us per Fetch, {res['CPU s/GiB']:.2f} CPU-s/GiB", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"system": args.system, "read_committed": args.read_committed,
                                         "records": args.records, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
