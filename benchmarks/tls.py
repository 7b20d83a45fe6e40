"""Strata vs Apache Kafka over TLS (issue 45): produce and hot consume on an SSL listener, and new
authenticated connections per second on a SASL_SSL listener (TLS + SCRAM-SHA-512 + ApiVersions).

Both brokers get the same certificate and key (one test CA, tests/tls_support.py: Strata reads
the PEM keystore, Kafka the PKCS12 one made from the same key) and the same pinned protocol and
cipher suite (``--cipher``, Kafka's name, TLS 1.2 only on both sides); the client checks what was
negotiated. Both run at once, on loopback ports; rounds alternate which goes first.

    python -m benchmarks.tls --rounds 3 --json docs/benchmarks/tls.json
"""

from __future__ import annotations

import argparse
import errno
import gzip
import importlib.util
import json
import multiprocessing
import os
import shutil
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.brokers import (REPO_ROOT, KafkaBroker, StrataBroker, free_port, kafka_libs_for,
                                kafka_version, log)
from benchmarks.cpu import CpuMeter
from benchmarks.workloads import MIB, Topics, consume_throughput, produce_throughput, random_values

CIPHER = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"     # the test CA's certificates are EC keys
USER, PASSWORD = "bench", "bench-secret"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
TCP_ULP = getattr(socket, "TCP_ULP", 31)


def _tls_support():
    """tests/tls_support.py (the tests' CA), loaded by path: tests/ is not a package."""
    spec = importlib.util.spec_from_file_location("tls_support", REPO_ROOT / "tests" / "tls_support.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tls_support", module)    # dataclasses look their module up there
    spec.loader.exec_module(sys.modules["tls_support"])
    return sys.modules["tls_support"]
    return module


def openssl_name(cipher: str) -> str:
    from strata.net.tls import cipher_suites
    tls12, _ = cipher_suites([cipher])
    if len(tls12) != 1:
        raise SystemExit(f"--cipher {cipher}: not a TLS 1.2 suite both sides can pin")
    return tls12[0]


# --- kernel TLS ----------------------------------------------------------------------------

def ktls_status() -> dict:
    """Whether kernel TLS could carry a TLS listener's sends here: the kernel's TLS ULP (a
    setsockopt(TCP_ULP, "tls") on a connected loopback socket), Python's and OpenSSL's side."""
    out = {"kernel": os.uname().release, "openssl": ssl.OPENSSL_VERSION,
           "python ssl.OP_ENABLE_KTLS": hasattr(ssl, "OP_ENABLE_KTLS")}
    try:
        out["tcp_available_ulp"] = Path("/proc/sys/net/ipv4/tcp_available_ulp").read_text().strip()
    except OSError as e:
        out["tcp_available_ulp"] = f"unreadable: {e.strerror}"
    try:   # the kernel's build options, where it publishes them
        with gzip.open("/proc/config.gz", "rt") as f:
            wanted = ("CONFIG_TLS=", "# CONFIG_TLS ", "CONFIG_MODULES=", "# CONFIG_MODULES ")
            out["kernel config"] = [x.strip() for x in f if x.startswith(wanted)]
    except OSError as e:
        out["kernel config"] = f"unreadable: {e.strerror}"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client:
            try:
                client.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
                out["setsockopt TCP_ULP tls"] = "ok"
            except OSError as e:
                out["setsockopt TCP_ULP tls"] = f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"
    out["usable"] = out["setsockopt TCP_ULP tls"] == "ok" and out["python ssl.OP_ENABLE_KTLS"]
    return out


# --- brokers -------------------------------------------------------------------------------

class Setup:
    """Certificates, and each system's listeners: PLAINTEXT (admin), SSL, SASL_SSL."""

    def __init__(self, work: Path, cipher: str) -> None:
        tls = _tls_support()
        self.ca = tls.make_ca(work / "ca")
        self.cert = self.ca.issue("broker")
        self.password = tls.PASSWORD
        self.cipher = cipher
        self.openssl_cipher = openssl_name(cipher)

    def common(self) -> dict[str, str]:
        return {"num.partitions": "1", "offsets.topic.replication.factor": "1",
                "ssl.enabled.protocols": "TLSv1.2", "ssl.protocol": "TLSv1.2",
                "ssl.cipher.suites": self.cipher,
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS}

    def strata(self, work: Path, extra: dict[str, str]) -> StrataBroker:
        ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "SASL_SSL": free_port()}
        props = {**self.common(),
                 "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.cert.keystore_pem),
                 **extra}
        b = StrataBroker(work, props, port=ports["PLAINTEXT"])
        b.ports = ports
        return b

    def kafka(self, work: Path, libs: Path, extra: dict[str, str]) -> KafkaBroker:
        ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "SASL_SSL": free_port()}
        controller = free_port()
        listeners = {**ports, "CONTROLLER": controller}
        props = {**self.common(),
                 "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in listeners.items()),
                 "advertised.listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
                 "listener.security.protocol.map":
                     "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
                 "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(self.cert.keystore_p12),
                 "ssl.keystore.password": self.password, "ssl.key.password": self.password,
                 "remote.log.storage.system.enable": "false",
                 **extra}
        b = KafkaBroker(work, libs, props, port=ports["PLAINTEXT"], controller_port=controller)
        b.ports = ports
        return b

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.pem))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(self.openssl_cipher)
        return ctx

    def librdkafka(self, broker, listener: str = "SSL") -> dict:
        client = {"bootstrap.servers": f"127.0.0.1:{broker.ports[listener]}",
                  "security.protocol": listener}
        if listener == "SSL":
            client.update({"ssl.ca.location": str(self.ca.pem), "ssl.cipher.suites": self.openssl_cipher})
        return client


def add_scram_user(bootstrap: str) -> None:
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)
    upsert = UserScramCredentialUpsertion(
        USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), PASSWORD.encode())
    admin = AdminClient({"bootstrap.servers": bootstrap})   # kept until the results are in
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(timeout=30)


def negotiated(setup: Setup, port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with setup.client_context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
            name, version, bits = s.cipher()
            return {"cipher": name, "version": version, "bits": bits}


# --- one authenticated connection ----------------------------------------------------------

def _recv_exact(s, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return bytes(buf)


def _call(s, body, response_cls, correlation_id: int):
    from strata.protocol.client import client_frame, decode_response, framed
    s.sendall(framed(client_frame(body, correlation_id, "tls-bench")))
    (size,) = struct.unpack(">i", _recv_exact(s, 4))
    return decode_response(response_cls, _recv_exact(s, size), correlation_id)


def authenticated_connection(ctx: ssl.SSLContext, port: int) -> None:
    """Connect, TLS handshake, ApiVersions, SaslHandshake and SaslAuthenticate (SCRAM-SHA-512,
    the server's signature checked), close."""
    import scramp
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.api_versions.v3.response import ApiVersionsResponse
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
    from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            r = _call(s, ApiVersionsRequest(client_software_name="tls-bench",
                                            client_software_version="1"), ApiVersionsResponse, 1)
            if r.error_code != 0:
                raise RuntimeError(f"ApiVersions: error {r.error_code}")
            r = _call(s, SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), SaslHandshakeResponse, 2)
            if r.error_code != 0:
                raise RuntimeError(f"SaslHandshake: error {r.error_code}")
            client = scramp.ScramClient(["SCRAM-SHA-512"], USER, PASSWORD)
            r = _call(s, SaslAuthenticateRequest(auth_bytes=client.get_client_first().encode()),
                      SaslAuthenticateResponse, 3)
            if r.error_code != 0:
                raise RuntimeError(f"SaslAuthenticate: {r.error_code} {r.error_message}")
            client.set_server_first(r.auth_bytes.decode())
            r = _call(s, SaslAuthenticateRequest(auth_bytes=client.get_client_final().encode()),
                      SaslAuthenticateResponse, 4)
            if r.error_code != 0:
                raise RuntimeError(f"SaslAuthenticate: {r.error_code} {r.error_message}")
            client.set_server_final(r.auth_bytes.decode())


def _connect_loop(args) -> tuple[int, float, str, float]:
    ca_pem, openssl_cipher, port, seconds = args
    ctx = ssl.create_default_context(cafile=ca_pem)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(openssl_cipher)
    done, first_error = 0, ""
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        try:
            authenticated_connection(ctx, port)
            done += 1
        except (OSError, RuntimeError) as e:
            first_error = first_error or repr(e)
            break
    return done, time.perf_counter() - t0, first_error, time.process_time() - cpu0


def connection_rate(setup: Setup, broker, clients: int, seconds: float) -> dict:
    """``clients`` processes, each opening authenticated connections one after another for
    ``seconds``; connections per second over all of them, and the broker's and the clients' CPU
    per connection (the clients share the machine's cores with the broker)."""
    work = [(str(setup.ca.pem), setup.openssl_cipher, broker.ports["SASL_SSL"], seconds)] * clients
    with multiprocessing.get_context("fork").Pool(clients) as pool, CpuMeter(broker.pid) as cpu:
        results = pool.map(_connect_loop, work)
    errors = [e for _, _, e, _ in results if e]
    if errors:
        raise RuntimeError(f"connection rate on {broker.system}: {errors[0]}")
    done = sum(n for n, _, _, _ in results)
    elapsed = max(t for _, t, _, _ in results)
    client_cpu = sum(c for _, _, _, c in results)
    return {"connections": done, "connections/s": round(done / elapsed, 1),
            "broker CPU ms/connection": round(cpu.seconds * 1000 / max(done, 1), 2),
            "client CPU ms/connection": round(client_cpu * 1000 / max(done, 1), 2)}


# --- throughput ----------------------------------------------------------------------------

def throughput(setup: Setup, broker, label: str, mib: int, record_size: int,
               listener: str = "SSL") -> dict:
    n = mib * MIB // record_size
    values = random_values(record_size)
    topic = Topics(f"127.0.0.1:{broker.ports['PLAINTEXT']}").new(label)
    client = setup.librdkafka(broker, listener)
    with CpuMeter(broker.pid) as cpu:
        produced = produce_throughput(client["bootstrap.servers"], topic, n, values, "1", client=client)
    out = {"produce MiB/s": round(produced["MiB/s"], 1),
           "produce broker CPU s/GiB": round(cpu.figures(n * record_size)["broker CPU s/GiB"], 2)}
    with CpuMeter(broker.pid) as cpu:
        consumed = consume_throughput(client["bootstrap.servers"], topic, [0], n, client=client)
    out.update({"consume MiB/s": round(consumed["MiB/s"], 1),
                "consume broker CPU s/GiB": round(cpu.figures(n * record_size)["broker CPU s/GiB"], 2)})
    return out


# --- the run -------------------------------------------------------------------------------

def line(r: dict) -> str:
    return (f"| {r['system']} | {r['round']} | {r['load']} | {r['produce MiB/s']} | "
            f"{r['produce broker CPU s/GiB']} | {r['consume MiB/s']} | "
            f"{r['consume broker CPU s/GiB']} | {r['connections/s']} | "
            f"{r['broker CPU ms/connection']} | {r['client CPU ms/connection']} |")


HEADER = ("| system | round | load (1/5/15 min) | produce MiB/s | produce broker CPU s/GiB | "
          "hot consume MiB/s | consume broker CPU s/GiB | SCRAM connections/s | "
          "broker CPU ms/connection | client CPU ms/connection |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def summarize(rounds: list[dict]) -> dict:
    """Median, min and max of each figure per system."""
    out: dict = {}
    for r in rounds:
        for k, v in r.items():
            if isinstance(v, (int, float)) and k != "round":
                out.setdefault(r["system"], {}).setdefault(k, []).append(v)
    return {system: {k: {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
                     for k, xs in figures.items()}
            for system, figures in out.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="strata,kafka")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256, help="MiB produced then consumed per round")
    ap.add_argument("--warmup-mib", type=int, default=0,
                    help="MiB produced and consumed before the rounds (default: a quarter of --mib)")
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--conn-clients", type=int, default=4, help="client processes connecting")
    ap.add_argument("--conn-seconds", type=float, default=10)
    ap.add_argument("--listener", choices=("SSL", "PLAINTEXT"), default="SSL",
                    help="where produce and consume run (PLAINTEXT: the baseline without TLS)")
    ap.add_argument("--cipher", default=CIPHER, help="Kafka's name of a TLS 1.2 suite")
    ap.add_argument("--strata-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kafka-libs")
    ap.add_argument("--work-dir", help="where the brokers' data goes (a temporary dir if unset)")
    ap.add_argument("--json", help="write the rounds, summary and setup here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    libs = kafka_libs_for("kafka", args.kafka_libs) if "kafka" in systems else None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="strata-tls-bench-"))
    setup = Setup(work, args.cipher)
    ktls = ktls_status()
    log(f"kernel TLS: {ktls}")
    strata_extra = dict(item.split("=", 1) for item in args.strata_override)
    brokers = {}
    rounds: list[dict] = []
    facts: dict = {"ktls": ktls, "cipher": args.cipher, "throughput listener": args.listener, "strata overrides": strata_extra,
                   "mib": args.mib, "warmup mib": args.warmup_mib, "record size": args.record_size,
                   "conn clients": args.conn_clients, "conn seconds": args.conn_seconds,
                   "cpus": os.cpu_count()}
    try:
        for system in systems:
            b = (setup.strata(work / system, strata_extra) if system == "strata"
                 else setup.kafka(work / system, libs, {}))
            b.start(timeout=120)
            brokers[system] = b
            add_scram_user(b.bootstrap)
            facts[f"{system} negotiated"] = negotiated(setup, b.ports["SSL"])
            if system == "kafka":
                facts["kafka version"] = kafka_version(libs)
            # first login, once the credential has reached the broker's cache; warms up too
            deadline = time.monotonic() + 30
            while True:
                try:
                    authenticated_connection(setup.client_context(), b.ports["SASL_SSL"])
                    break
                except (OSError, RuntimeError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            # warm-up (Kafka's JIT): the throughput rounds' work and a share of the logins
            throughput(setup, b, "warmup", args.warmup_mib or max(1, args.mib // 4),
                       args.record_size, args.listener)
            connection_rate(setup, b, args.conn_clients, args.conn_seconds / 2)
        log(f"negotiated: {[facts[f'{s} negotiated'] for s in systems]}")
        print(HEADER)
        for i in range(args.rounds):
            order = systems if i % 2 == 0 else systems[::-1]
            for system in order:
                b = brokers[system]
                load = "/".join(f"{x:.2f}" for x in os.getloadavg())
                r = {"system": system, "round": i + 1, "load": load,
                     **throughput(setup, b, f"r{i}", args.mib, args.record_size, args.listener),
                     **connection_rate(setup, b, args.conn_clients, args.conn_seconds)}
                rounds.append(r)
                print(line(r), flush=True)
    finally:
        for b in brokers.values():
            b.stop()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(rounds)
    for system, figures in summary.items():
        log(f"{system}: " + ", ".join(f"{k} {v['median']:g} [{v['min']:g}-{v['max']:g}]"
                                     for k, v in figures.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": facts, "rounds": rounds,
                                               "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
