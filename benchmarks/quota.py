"""A quota-limited producer's achieved rate: ``python -m benchmarks.quota``.

Starts a Strata broker (or uses ``--bootstrap``), sets ``producer_byte_rate`` for one client id
with AlterClientQuotas, and lets a confluent-kafka producer with that client id send 10 KiB
records as fast as it can for ``--seconds``. Reports the bytes acknowledged per second, the
rate over the whole run and after the first ``quota.window.num - 1`` seconds (the burst a new
quota sensor admits, Kafka's ``Rate``), and the throttle times librdkafka saw. Rates are in
MiB/s of record values.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from strata.net.connection import roundtrip

MIB = 1024 * 1024


def set_producer_quota(bootstrap: str, client_id: str, bytes_per_second: int) -> None:
    """AlterClientQuotas v1: ``producer_byte_rate`` of the client-id entity ``client_id``."""
    from kio.schema.alter_client_quotas.v1 import request as req
    from kio.schema.alter_client_quotas.v1.response import AlterClientQuotasResponse
    body = req.AlterClientQuotasRequest(entries=(req.EntryData(
        entity=(req.EntityData(entity_type="client-id", entity_name=client_id),),
        ops=(req.OpData(key="producer_byte_rate", value=float(bytes_per_second), remove=False),)),),
        validate_only=False)
    response = roundtrip(bootstrap, body, AlterClientQuotasResponse)
    errors = [(e.error_code, e.error_message) for e in response.entries if e.error_code != 0]
    if errors:
        raise RuntimeError(f"AlterClientQuotas failed: {errors}")


def run(bootstrap: str, client_id: str, seconds: float, record_bytes: int) -> dict:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"quota-bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    acked: list[float] = []
    throttles: list[int] = []

    def delivered(err, _msg):
        if err is None:
            acked.append(time.monotonic())

    def stats(text):
        for broker in json.loads(text)["brokers"].values():
            if broker["throttle"]["cnt"]:
                throttles.append(broker["throttle"]["max"])
    # a 2 MiB send queue, so that what is acknowledged follows what the broker admits
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                         "queue.buffering.max.kbytes": 2048, "statistics.interval.ms": 1000,
                         "stats_cb": stats})
    value = bytes(record_bytes)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            producer.produce(topic, value, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    produced_until = time.monotonic()
    producer.flush(120)
    per_second = [0] * (int(seconds) + 1)
    for t in acked:
        i = int(t - start)
        if i < len(per_second):
            per_second[i] += record_bytes
    return {"start": start, "acked": acked, "per_second": per_second,
            "produced_s": produced_until - start, "throttle_max_ms": throttles}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", help="an already running broker (default: start Strata)")
    ap.add_argument("--quota", type=int, default=MIB, help="producer_byte_rate (default 1 MiB/s)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--record-bytes", type=int, default=10_240)
    ap.add_argument("--window-num", type=int, default=11, help="the broker's quota.window.num")
    args = ap.parse_args(argv)
    broker = None
    if args.bootstrap is None:
        from benchmarks.brokers import StrataBroker
        broker = StrataBroker(Path(tempfile.mkdtemp(prefix="strata-quota-bench-")),
                              {"quota.window.num": str(args.window_num)})
        broker.start()
        bootstrap = broker.bootstrap
    else:
        bootstrap = args.bootstrap
    try:
        client_id = f"quota-bench-{uuid.uuid4().hex[:6]}"
        set_producer_quota(bootstrap, client_id, args.quota)
        r = run(bootstrap, client_id, args.seconds, args.record_bytes)
    finally:
        if broker is not None:
            broker.stop()
    acked_bytes = len(r["acked"]) * args.record_bytes
    span = (r["acked"][-1] - r["start"]) if r["acked"] else 0.0
    burst_s = args.window_num - 1
    steady = [t for t in r["acked"] if t - r["start"] >= burst_s]
    print(f"quota {args.quota / MIB:.2f} MiB/s, quota.window.num {args.window_num} x 1 s, "
          f"{args.seconds:.0f} s of producing {args.record_bytes} B records")
    print("acknowledged per second (MiB): " +
          " ".join(f"{b / MIB:.2f}" for b in r["per_second"]))
    print(f"overall: {acked_bytes / MIB:.2f} MiB in {span:.2f} s = "
          f"{acked_bytes / MIB / span if span else 0:.3f} MiB/s")
    if steady and span > burst_s:
        print(f"after the {burst_s} s burst: {len(steady) * args.record_bytes / MIB:.2f} MiB in "
              f"{span - burst_s:.2f} s = "
              f"{len(steady) * args.record_bytes / MIB / (span - burst_s):.3f} MiB/s")
    if r["throttle_max_ms"]:
        print(f"throttle time reported (max per 1 s stats window, ms): {r['throttle_max_ms']}")
    else:
        print("no throttle time reported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
