"""Real client requests, mutated, over many connections: the broker answers each with Kafka
error codes or closes that one connection, keeps serving, and keeps what it acknowledged.

A recording proxy sits between real clients (confluent-kafka's producer, consumer groups of
both protocols and admin client; kafka-python's producer and consumer) and a broker that advertises the proxy, so
every request the clients send is kept. Those requests are then mutated (bit flips, integers
overwritten with boundary values, truncations, splices of two requests) and sent, each on a
connection of its own followed by an ApiVersions probe, from several threads at once, for
``STRATA_FUZZ_SECONDS`` seconds (20 in ``make test``; ``make fuzz`` runs it for long).

Requests that Kafka itself may hold past the probe's timeout are not sent: a Fetch waiting more
than a second, and JoinGroup / SyncGroup (they wait for a rebalance of members that the
mutations made up).
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import struct
import threading
import time

import pytest

from broker_process import BrokerProcess, free_port
from strata.protocol.codec import ApiKey, MalformedRequest, UnsupportedVersion, parse_request
from test_bad_input import (
    Closed, api_versions_on, check_answer, connect, parses_as_silent_produce,
    send_then_probe)

pytestmark = pytest.mark.slow

FUZZ_SECONDS = float(os.environ.get("STRATA_FUZZ_SECONDS", 20))
THREADS = 4
_SEED = os.environ.get("STRATA_FUZZ_SEED", "405")  # "random": a new one each run (printed)
SEED = random.randrange(1 << 30) if _SEED == "random" else int(_SEED)
KEPT = "kept"
LONG_WAITS = {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}
BOUNDARY_INTS = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00", b"\xff\xff", b"\x7f\xff",
                 b"\x80\x00", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                 b"\x80\x00\x00\x00", b"\x00\x00\x00\x01", b"\x00\x01\x00\x00", b"\x01\x00\x00\x00"]


class RecordingProxy:
    """Forwards connections to ``target_port`` and keeps every client-to-broker frame while
    ``recording`` is set."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.frames: list[bytes] = []
        self.recording = True
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the broker is gone: so is this connection
                client.close()
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        pending = bytearray()
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                if requests:
                    pending += chunk
                    while len(pending) >= 4 and len(pending) >= 4 + struct.unpack_from(">i", pending)[0]:
                        size = struct.unpack_from(">i", pending)[0]
                        if self.recording:
                            with self._lock:
                                self.frames.append(bytes(pending[4:4 + size]))
                        del pending[:4 + size]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for s in self._sockets:
            s.close()


def _consume_in_group(bootstrap: str, config: dict) -> None:
    """The 300 records of fuzz-topic read by a group member, its offsets committed."""
    ck = pytest.importorskip("confluent_kafka")
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, **config})
    consumer.subscribe(["fuzz-topic"])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 300 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == 300


def _client_traffic(bootstrap: str) -> None:
    """What a new user's first hour sends: admin calls, produce, a consumer group, commits."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("fuzz-topic", 3, 1, config={"retention.ms": "86400000"})])[
        "fuzz-topic"].result(30)
    admin.describe_configs([ConfigResource("topic", "fuzz-topic")])
    admin.list_consumer_groups().result(30)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "compression.type": "lz4", "linger.ms": 5})
    for i in range(300):
        producer.produce("fuzz-topic", key=b"k%d" % i, value=b"v" * (i % 50),
                         headers=[("h", b"%d" % i)])
    assert producer.flush(30) == 0
    _consume_in_group(bootstrap, {"group.id": "fuzz-group"})
    # a KIP-848 consumer group: ConsumerGroupHeartbeat, OffsetCommit v9, OffsetFetch v9
    _consume_in_group(bootstrap, {"group.id": "fuzz-kip848", "group.protocol": "consumer"})
    admin.describe_consumer_groups(["fuzz-kip848"])["fuzz-kip848"].result(30)
    kafka = pytest.importorskip("kafka")
    kp = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", acks="all")
    for i in range(50):
        kp.send("fuzz-topic", key=b"kp%d" % i, value=b"value")
    kp.flush(30)
    kp.close()
    kc = kafka.KafkaConsumer("fuzz-topic", bootstrap_servers=bootstrap, group_id="fuzz-kp",
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    assert sum(1 for _ in kc) >= 350
    kc.commit()
    kc.close()


def _mutate(rng: random.Random, frames: list[bytes]) -> bytes:
    f = bytearray(rng.choice(frames))
    # mostly leave the request header's api key and version alone, so that bodies get parsed
    lo = 8 if rng.random() < 0.8 and len(f) > 9 else 0
    kind = rng.choice(("flip", "int", "truncate", "splice"))
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(lo, len(f))
            f[i] ^= 1 << rng.randrange(8)
    elif kind == "int":
        value = rng.choice(BOUNDARY_INTS)
        i = rng.randrange(lo, max(lo + 1, len(f) - len(value) + 1))
        f[i:i + len(value)] = value
    elif kind == "truncate":
        del f[rng.randrange(lo or 1, len(f)):]
    else:
        other = rng.choice(frames)
        f = f[:rng.randrange(lo, len(f))] + other[rng.randrange(0, len(other)):]
    return bytes(f)


def _may_wait_past_the_probe(payload: bytes) -> bool:
    try:
        request = parse_request(payload)
    except (MalformedRequest, UnsupportedVersion):
        return False
    if request.api_key in LONG_WAITS:
        return True
    max_wait = getattr(request.body, "max_wait", None)
    return (request.api_key == ApiKey.FETCH and isinstance(max_wait, datetime.timedelta)
            and max_wait > datetime.timedelta(seconds=1))


def _check_one(port: int, payload: bytes, apis: dict) -> str:
    """Send one mutated request; the outcome's kind. Fails on anything but a well-formed answer
    with Kafka error codes, a closed connection, or silence for an acks=0 Produce."""
    api_key, version, corr = struct.unpack_from(">hhi", payload) if len(payload) >= 8 else (0, 0, 0)
    outcome = send_then_probe(port, struct.pack(">i", len(payload)) + payload,
                              corr if len(payload) >= 8 else None, apis)
    if outcome.answers:
        lo, hi = apis.get(api_key, (1, 0))
        if api_key == ApiKey.API_VERSIONS and not lo <= version <= hi:
            version = 0  # the fallback answer to an ApiVersions version it does not serve
        check_answer(outcome, api_key, version, corr)
    elif not outcome.closed:
        assert parses_as_silent_produce(payload), "neither answered nor closed"
    return outcome.kind


def fuzz(port: int, frames: list[bytes], apis: dict) -> dict[str, int]:
    """Mutations of ``frames`` sent from THREADS threads for FUZZ_SECONDS; how many had each
    outcome. Fails on the first request whose outcome ``_check_one`` rejects."""
    failures: list[str] = []
    kinds: dict[str, int] = {}
    deadline = time.monotonic() + FUZZ_SECONDS

    def work(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline and not failures:
            payload = _mutate(rng, frames)
            if _may_wait_past_the_probe(payload):
                continue
            try:
                kind = _check_one(port, payload, apis)
            except (AssertionError, Closed, OSError) as exc:
                failures.append(f"{exc!r} for request {payload.hex()}")
                return
            kinds[kind] = kinds.get(kind, 0) + 1

    threads = [threading.Thread(target=work, args=(SEED + n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    return kinds


def _read_all(bootstrap: str, topic: str) -> list:
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-reader",
                     "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == ck.KafkaError._PARTITION_EOF, msg.error()
                return out
            out.append((msg.offset(), msg.key(), msg.value(), msg.headers()))
        raise AssertionError(f"stalled reading {topic}")
    finally:
        c.close()


# With Kafka's authorizer on (issue 46) every mutated request is also decided by it: with no
# binding, allow.everyone.if.no.acl.found lets the clients' traffic through.
AUTHORIZER = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
              "allow.everyone.if.no.acl.found": "true"}


@pytest.mark.parametrize("authorizer", [False, True], ids=["no-authorizer", "authorizer"])
def test_mutated_real_client_requests_get_kafka_errors_or_close_only_their_connection(
        tmp_path, authorizer):
    ck = pytest.importorskip("confluent_kafka")
    broker_port = free_port()
    proxy = RecordingProxy(broker_port)
    broker = BrokerProcess(tmp_path, port=broker_port, overrides={
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}",
        "group.initial.rebalance.delay.ms": "0", "socket.request.max.bytes": str(1 << 20),
        # the first connection idles through the whole run and must outlive it
        "connections.max.idle.ms": str(int(max(600, FUZZ_SECONDS + 300) * 1000)),
        **(AUTHORIZER if authorizer else {})})
    with broker:
        _client_traffic(f"127.0.0.1:{proxy.port}")
        proxy.recording = False
        frames = [f for f in proxy.frames if len(f) >= 8]
        assert len({struct.unpack_from(">h", f)[0] for f in frames}) >= 10, "too few kinds recorded"
        producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "acks": "all"})
        for i in range(100):
            producer.produce(KEPT, key=b"%d" % i, value=b"kept-%d" % i, partition=0)
        assert producer.flush(30) == 0
        kept = _read_all(f"127.0.0.1:{proxy.port}", KEPT)
        assert len(kept) == 100
        first = connect(broker_port)
        apis = api_versions_on(first, 1, None)

        kinds = fuzz(broker_port, frames, apis)
        assert sum(kinds.values()) >= 100, f"only {kinds} mutated requests were sent"
        print(f"seed {SEED}: mutated requests by outcome: {kinds}")
        api_versions_on(first, 2, apis)  # a connection opened before it all still works
        first.close()
        assert _read_all(f"127.0.0.1:{proxy.port}", KEPT) == kept
    proxy.close()
    bad = broker.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad[:20])
