"""The authorizer's cost on the data path (issue 46): produce and consume throughput over
SASL_PLAINTEXT (PLAIN) as a user that is not a super user, with no authorizer (mode ``off``)
against Kafka's authorizer on with 10,000 ACL bindings loaded (mode ``on``); Strata and Kafka 4.x
(KRaft, ``StandardAuthorizer``) in the same setup.

Per system, two brokers run at once, one per mode, with the same listeners and settings but
``authorizer.class.name``; rounds alternate which mode goes first. In mode ``on`` the bindings are
loaded with the AdminClient (CreateAcls, 1,000 a request) before the rounds: LITERAL and PREFIXED
bindings on other topics and groups, a few on the benchmark topics (the bench user's PREFIXED
WRITE and READ on ``bench-``, READ on the consumer's group prefix, a DENY and DESCRIBEs for other
users, a ``*`` topic binding). ``super.users`` is ``User:admin;User:ANONYMOUS`` on both systems:
the PLAINTEXT listener (topic creation, ACL loading, the readiness check and Kafka's controller
listener) is trusted; the workload runs on the SASL listener as ``User:bench``.

    python -m benchmarks.authorizer --rounds 8 --mib 512 --warmup-mib 512 --json docs/benchmarks/authorizer.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.brokers import (KafkaBroker, StrataBroker, free_port, kafka_libs_for,
                                kafka_version, log)
from benchmarks.cpu import CpuMeter
from benchmarks.workloads import MIB, Topics, consume_throughput, produce_throughput, random_values

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
USER, PASSWORD = "bench", "bench-secret"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        f'password="admin-secret" user_admin="admin-secret" user_{USER}="{PASSWORD}";')
GROUP_PREFIX = "bench-assign-"       # benchmarks.workloads.consumer_config's group ids
MODES = ("off", "on")
CHUNK = 1000                         # bindings per CreateAcls request


def bench_bindings():
    """The bindings that touch the benchmark's topics and group: what ``User:bench`` needs, and
    a few for other principals that a decision on the benchmark topic must also look at."""
    from confluent_kafka.admin import AclBinding, AclOperation as Op, AclPermissionType as P
    from confluent_kafka.admin import ResourcePatternType as PT, ResourceType as RT
    return [
        AclBinding(RT.TOPIC, "bench-", PT.PREFIXED, f"User:{USER}", "*", Op.WRITE, P.ALLOW),
        AclBinding(RT.TOPIC, "bench-", PT.PREFIXED, f"User:{USER}", "*", Op.READ, P.ALLOW),
        AclBinding(RT.GROUP, GROUP_PREFIX, PT.PREFIXED, f"User:{USER}", "*", Op.READ, P.ALLOW),
        AclBinding(RT.TOPIC, "bench-", PT.PREFIXED, "User:monitor", "*", Op.DESCRIBE, P.ALLOW),
        AclBinding(RT.TOPIC, "bench-", PT.PREFIXED, "User:blocked", "*", Op.WRITE, P.DENY),
        AclBinding(RT.TOPIC, "*", PT.LITERAL, "User:auditor", "*", Op.DESCRIBE, P.ALLOW),
        AclBinding(RT.TOPIC, "bench", PT.PREFIXED, "User:bench-reader", "10.0.0.1", Op.READ, P.ALLOW),
    ]


def other_bindings(count: int):
    """``count`` bindings on other topics and groups: per ``topic-<i>`` a LITERAL ALLOW WRITE
    and READ for ``user-<i>``; every 10th a group READ, every 100th a DENY; 50 team prefixes."""
    from confluent_kafka.admin import AclBinding, AclOperation as Op, AclPermissionType as P
    from confluent_kafka.admin import ResourcePatternType as PT, ResourceType as RT
    out = []
    i = 0
    while len(out) < count:
        user = f"User:user-{i}"
        out.append(AclBinding(RT.TOPIC, f"topic-{i}", PT.LITERAL, user, "*", Op.WRITE, P.ALLOW))
        out.append(AclBinding(RT.TOPIC, f"topic-{i}", PT.LITERAL, user, "*", Op.READ, P.ALLOW))
        if i % 10 == 0:
            out.append(AclBinding(RT.GROUP, f"group-{i}", PT.LITERAL, user, "*", Op.READ, P.ALLOW))
        if i % 100 == 0:
            out.append(AclBinding(RT.TOPIC, f"topic-{i}", PT.LITERAL, "User:blocked", "*",
                                  Op.WRITE, P.DENY))
        if i < 50:
            out.append(AclBinding(RT.TOPIC, f"team-{i}.", PT.PREFIXED, f"User:team-{i}", "*",
                                  Op.READ, P.ALLOW))
        i += 1
    return out[:count]


def load_acls(bootstrap: str, total: int, timeout: float = 300) -> dict:
    """Create ``total`` bindings (the benchmark's own among them) and wait until the broker
    lists them all; the count and the seconds it took."""
    from confluent_kafka.admin import AclBindingFilter, AdminClient
    from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    own = bench_bindings()
    bindings = own + other_bindings(max(0, total - len(own)))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    t0 = time.perf_counter()
    for i in range(0, len(bindings), CHUNK):
        for f in admin.create_acls(bindings[i:i + CHUNK], request_timeout=120).values():
            f.result(timeout=180)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    deadline = time.monotonic() + timeout
    while True:
        listed = len(admin.describe_acls(everything, request_timeout=60).result(timeout=90))
        if listed >= len(bindings) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if listed != len(bindings):
        raise RuntimeError(f"{listed} of {len(bindings)} bindings listed")
    return {"bindings": listed, "load seconds": round(time.perf_counter() - t0, 1)}


# --- brokers -------------------------------------------------------------------------------

def broker_props(mode: str) -> dict[str, str]:
    props = {"num.partitions": "1", "offsets.topic.replication.factor": "1",
             "sasl.enabled.mechanisms": "PLAIN",
             "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
             "group.initial.rebalance.delay.ms": "0"}
    if mode == "on":
        props.update({"authorizer.class.name": AUTHORIZER,
                      "super.users": "User:admin;User:ANONYMOUS"})
    return props


def make(system: str, mode: str, work: Path, libs: Path | None):
    ports = {"PLAINTEXT": free_port(), "SASL_PLAINTEXT": free_port()}
    if system == "strata":
        props = {**broker_props(mode),
                 "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
                 "remote.log.storage.system.enable": "false"}
        b = StrataBroker(work / f"{system}-{mode}", props, port=ports["PLAINTEXT"])
    else:
        controller = free_port()
        listeners = {**ports, "CONTROLLER": controller}
        props = {**broker_props(mode),
                 "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in listeners.items()),
                 "advertised.listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
                 "listener.security.protocol.map":
                     "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                 "remote.log.storage.system.enable": "false"}
        b = KafkaBroker(work / f"{system}-{mode}", libs, props, port=ports["PLAINTEXT"],
                        controller_port=controller)
    b.ports = ports
    return b


def client(broker) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": USER, "sasl.password": PASSWORD,
            "log_level": 4}     # librdkafka's telemetry notices are at 6


def throughput(broker, label: str, mib: int, record_size: int) -> dict:
    n = mib * MIB // record_size
    values = random_values(record_size)
    topic = Topics(broker.bootstrap).new(label)      # on PLAINTEXT, a super user's listener
    c = client(broker)
    with CpuMeter(broker.pid) as cpu:
        produced = produce_throughput(c["bootstrap.servers"], topic, n, values, "1", client=c)
    out = {"produce MiB/s": round(produced["MiB/s"], 1),
           "produce records/s": round(produced["records/s"]),
           "produce broker CPU s/GiB": round(cpu.figures(n * record_size)["broker CPU s/GiB"], 2)}
    with CpuMeter(broker.pid) as cpu:
        consumed = consume_throughput(c["bootstrap.servers"], topic, [0], n, client=c)
    out.update({"consume MiB/s": round(consumed["MiB/s"], 1),
                "consume records/s": round(consumed["records/s"]),
                "consume broker CPU s/GiB": round(cpu.figures(n * record_size)["broker CPU s/GiB"], 2)})
    return out


# --- the report ----------------------------------------------------------------------------

FIGURES = ("produce MiB/s", "produce records/s", "produce broker CPU s/GiB",
           "consume MiB/s", "consume records/s", "consume broker CPU s/GiB")

HEADER = ("| system | round | authorizer | load (1/5/15 min) | " + " | ".join(FIGURES) + " |\n"
          "|---|---|---|---|" + "---|" * len(FIGURES))


def line(r: dict) -> str:
    return (f"| {r['system']} | {r['round']} | {r['mode']} | {r['load']} | "
            + " | ".join(str(r[k]) for k in FIGURES) + " |")


def summarize(rounds: list[dict]) -> dict:
    """Per system and mode, each figure's median, min and max; per system, the difference of
    the medians (on against off, in % of off) and each round's own on-against-off difference."""
    out: dict = {}
    for r in rounds:
        for k in FIGURES:
            out.setdefault(r["system"], {}).setdefault(r["mode"], {}).setdefault(k, []).append(r[k])
    summary: dict = {}
    for system, modes in out.items():
        s = summary[system] = {mode: {k: {"median": statistics.median(xs), "min": min(xs),
                                          "max": max(xs)} for k, xs in figures.items()}
                               for mode, figures in modes.items()}
        if set(MODES) <= modes.keys():
            s["on vs off %"] = {k: pct(s["on"][k]["median"], s["off"][k]["median"]) for k in FIGURES}
            pairs = {}
            for r in rounds:
                if r["system"] == system:
                    pairs.setdefault(r["round"], {})[r["mode"]] = r
            s["per round on vs off %"] = {
                k: [pct(p["on"][k], p["off"][k]) for _, p in sorted(pairs.items()) if len(p) == 2]
                for k in FIGURES}
    return summary


def pct(on: float, off: float) -> float | None:
    return round((on - off) / off * 100, 1) if off else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="strata,kafka")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per mode")
    ap.add_argument("--mib", type=int, default=128, help="MiB produced then consumed per round")
    ap.add_argument("--warmup-mib", type=int, default=0,
                    help="MiB produced and consumed on each broker first (default: a quarter of --mib)")
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--acls", type=int, default=10_000, help="bindings loaded in mode on")
    ap.add_argument("--kafka-libs")
    ap.add_argument("--work-dir", help="where the brokers' data goes (a temporary dir if unset)")
    ap.add_argument("--json", help="write the rounds, summary and setup here")
    return ap.parse_args(argv)


def run_system(system: str, args, work: Path, libs: Path | None, facts: dict) -> list[dict]:
    brokers = {}
    rounds = []
    try:
        for mode in MODES:
            b = make(system, mode, work, libs)
            b.start(timeout=120)
            brokers[mode] = b
        if system == "kafka":
            facts["kafka version"] = kafka_version(libs)
        facts[f"{system} acls"] = load_acls(brokers["on"].bootstrap, args.acls)
        log(f"{system}: {facts[f'{system} acls']}")
        for mode in MODES:   # warm-up (Kafka's JIT, Strata's first connections)
            throughput(brokers[mode], "warmup", args.warmup_mib or max(1, args.mib // 4),
                       args.record_size)
        for i in range(args.rounds):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                load = "/".join(f"{x:.2f}" for x in os.getloadavg())
                r = {"system": system, "round": i + 1, "mode": mode, "load": load,
                     **throughput(brokers[mode], f"r{i}", args.mib, args.record_size)}
                rounds.append(r)
                print(line(r), flush=True)
    finally:
        for b in brokers.values():
            b.stop()
    return rounds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    libs = kafka_libs_for("kafka", args.kafka_libs) if "kafka" in systems else None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="strata-authz-bench-"))
    facts: dict = {"authorizer": AUTHORIZER, "mib": args.mib, "warmup mib": args.warmup_mib,
                   "record size": args.record_size, "acls": args.acls, "cpus": os.cpu_count(),
                   "load at start": "/".join(f"{x:.2f}" for x in os.getloadavg())}
    rounds: list[dict] = []
    print(HEADER)
    try:
        for system in systems:
            rounds += run_system(system, args, work, libs, facts)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(rounds)
    for system, s in summary.items():
        if "on vs off %" in s:
            log(f"{system}: on vs off (medians) " + ", ".join(f"{k} {v:+g} %" if v is not None else f"{k} -" for k, v in
                                                             s["on vs off %"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": facts, "rounds": rounds,
                                               "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
