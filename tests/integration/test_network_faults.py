"""Network partitions on broker processes and a real ZooKeeper, each in its own network
namespace (strata/bench/netfault.py), with tiering on: issue 51's "How it is shown".

- The harness itself: ``cut(a, b)`` stops TCP between a and b alone (a connect times out)
  while both still reach everyone else; ``isolate`` and ``split`` likewise; ``heal`` restores.
- A partition leader cut from ZooKeeper only (it still reaches the other brokers and the
  clients) for about 20 s while an idempotent acks=all producer keeps writing to a tiered RF 3
  topic (min.insync.replicas 2, 16 KiB segments, 5 s local retention). After healing and
  settling: every acknowledged record is read back at its offset from offset 0 across both
  tiers, no value is stored twice, every replica's local log below the high watermark holds
  the same batches byte for byte (compared right after each heal and once settled, before the
  5 s local retention removes them), and ``__remote_log_metadata`` has no segment DELETE written
  by a broker that did not lead the partition then (ZooKeeper's partition states, timed by
  ZooKeeper, say who led) and no illegal state transition among the records readers accept.

The short version (one cut) runs in ``make test``; ``make faults-net`` runs the ``faults_net``
loop: ``STRATA_NETFAULT_ROUNDS`` cuts (10), each of the leader of the next partition, for
``STRATA_NETFAULT_CUT_S`` seconds (20 to 25 at random).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition as CTopicPartition
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient

from cluster_clients import admin, log_end
from cluster_process import StrataCluster
from strata.bench.netfault import CLIENTS, Network, netfault_available
from strata.bench.netfaults import read_back
from strata.cluster.zk.znodes import broker_path, partition_state_path
from strata.net.connection import list_offset
from strata.protocol import records as rec
from strata.protocol.client import LATEST_TIERED
from strata.tiered.api import (
    RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState)
from strata.tiered.metadata.serde import deserialize
from tiered_support import TIERED_BROKER, metadata_topic_records
from zk_server import zookeeper_available

_net_ok, _net_why = netfault_available()
_zk_ok, _zk_why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _net_ok, reason=f"network fault harness: {_net_why}"),
              pytest.mark.slow]
needs_zookeeper = pytest.mark.skipif(not _zk_ok, reason=_zk_why)

S = RemoteLogSegmentState
DELETES = (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)
ROUNDS = int(os.environ.get("STRATA_NETFAULT_ROUNDS", "10"))
CUT_S = os.environ.get("STRATA_NETFAULT_CUT_S")
TOPIC = "netfault"
PARTITIONS = 3
SEGMENT = 16 * 1024
RATE = 400                 # records per second, all partitions together
VALUE_SIZE = 100
AFTER_HEAL_S = 10          # producing on after each heal before the next cut or the checks
# a broker that reaches ZooKeeper hears of a leader change within this; a broker cut from it
# gets no such grace from its cut until it is back in every ISR
GRACE_MS = 1000
TOPIC_CONFIG = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "segment.index.bytes": "4096", "local.retention.ms": "5000",
                "min.insync.replicas": "2"}
OVERRIDES = {
    **TIERED_BROKER,
    "log.remote.storage.enable": "false",          # only the topics that ask are tiered
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "remote.log.metadata.topic.replication.factor": "3",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
}
HOSTS = ["zookeeper", "broker-1", "broker-2", "broker-3"]
LISTEN = "import socket, sys, time; s = socket.create_server((sys.argv[1], 7000)); time.sleep(300)"


# --------------------------------------------------------------------------- the harness


def test_a_cut_stops_only_that_pair_isolate_and_split_too_and_heal_restores_all():
    with Network(["a", "b", "c"]) as net:
        listeners = [net.popen(h, ["python3", "-c", LISTEN, net.address(h)]) for h in net.hosts]
        try:
            deadline = time.monotonic() + 10
            while any(net.connect(CLIENTS, h, 7000) != "connected" for h in net.hosts):
                assert time.monotonic() < deadline, "the listeners did not start"
                time.sleep(0.1)

            def reach(src, dst, timeout=1.0):
                return net.connect(src, dst, 7000, timeout)
            assert reach("a", "b") == reach("b", "a") == reach("a", "c") == "connected"

            net.cut("a", "b")
            assert reach("a", "b") == reach("b", "a") == "timed out"
            assert reach("a", "c") == reach("c", "b") == reach(CLIENTS, "a") == \
                reach(CLIENTS, "b") == "connected"
            net.heal()
            assert reach("a", "b") == reach("b", "a") == "connected"

            net.cut("a", CLIENTS)
            assert reach(CLIENTS, "a") == reach("a", CLIENTS) == "timed out"
            assert reach("a", "b") == reach(CLIENTS, "b") == "connected"
            net.heal()
            assert reach(CLIENTS, "a") == "connected"

            net.isolate("a")
            assert reach("b", "a") != "connected" and reach("a", "c") != "connected"
            assert reach(CLIENTS, "a") != "connected"
            assert reach("b", "c") == reach(CLIENTS, "b") == "connected"
            net.heal()
            assert reach("b", "a", 5) == reach("a", "c", 5) == reach(CLIENTS, "a", 5) == "connected"

            net.split(["a"], ["b", "c"])
            assert reach("a", "b") == reach("c", "a") == "timed out"
            assert reach("b", "c") == reach(CLIENTS, "a") == "connected"
            net.heal()
            assert net.faults == {"cut": [], "isolated": []}
            assert reach("a", "b") == reach("c", "a") == "connected"
        finally:
            for p in listeners:
                p.kill()
                p.wait()


# --------------------------------------------------------------------------- who leads


class Leadership:
    """The partition states of ``topic`` as ZooKeeper holds them, read from the root namespace
    (never cut): the current one, and every one seen, timed by ZooKeeper's own write time."""

    def __init__(self, zk_connect: str, topic: str, partitions: int):
        self.zk = KazooClient(hosts=zk_connect, timeout=10)
        self.zk.start(timeout=15)
        self.topic = topic
        self.history: dict[int, list[tuple[int, int, int, int, list[int]]]] = defaultdict(list)
        self.cuts: list[tuple[int, int, float]] = []   # (broker, from ms, to ms) cut from ZooKeeper
        self._lock = threading.Lock()
        for p in range(partitions):
            self.zk.DataWatch(partition_state_path(topic, p), self._watcher(p))

    def _watcher(self, p: int):
        def seen(data, stat) -> None:
            if data:
                doc = json.loads(data)
                with self._lock:   # (ZooKeeper's mtime ms, zk version, leader, epoch, isr)
                    self.history[p].append((stat.mtime, stat.version, doc["leader"],
                                            doc["leader_epoch"], doc["isr"]))
        return seen

    def state(self, p: int) -> tuple[int, int, list[int]]:
        """(leader, leader epoch, isr) now."""
        data, _ = self.zk.get(partition_state_path(self.topic, p))
        doc = json.loads(data)
        return doc["leader"], doc["leader_epoch"], doc["isr"]

    def controller(self) -> int:
        data, _ = self.zk.get("/controller")
        return int(json.loads(data)["brokerid"])

    def registered(self, node_id: int) -> bool:
        return self.zk.exists(broker_path(node_id)) is not None

    def led(self, p: int, broker: int, start_ms: int, end_ms: int) -> bool:
        """Whether ZooKeeper named ``broker`` leader of ``p`` at some time in [start, end]."""
        with self._lock:
            states = sorted(self.history[p])
        for i, (mtime, _, leader, _, _) in enumerate(states):
            until = states[i + 1][0] if i + 1 < len(states) else float("inf")
            if leader == broker and mtime <= end_ms and until >= start_ms:
                return True
        return False

    def history_of(self, p: int) -> list[tuple[int, int, int]]:
        """(ZooKeeper's write time ms, leader, leader epoch) of each state seen of ``p``."""
        with self._lock:
            return [(m, leader, epoch) for m, _, leader, epoch, _ in sorted(self.history[p])]

    def grace_ms(self, broker: int, t_ms: int) -> int:
        """How long after losing leadership a write by ``broker`` at ``t_ms`` is excused."""
        cut = any(b == broker and start <= t_ms <= end for b, start, end in self.cuts)
        return 0 if cut else GRACE_MS

    def missed_versions(self) -> dict[int, list[int]]:
        """zk versions the watch did not see (two writes closer than the watch's re-read)."""
        out = {}
        with self._lock:
            for p, states in self.history.items():
                versions = sorted({s[1] for s in states})
                gaps = sorted(set(range(versions[0], versions[-1] + 1)) - set(versions))
                if gaps:
                    out[p] = gaps
        return out

    def close(self) -> None:
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
            self.zk = None


# --------------------------------------------------------------------------- the producer


class Producing(threading.Thread):
    """An idempotent acks=all producer at ``RATE`` records/s over every partition; keeps
    ``acked[(partition, offset)] = value`` and the errors of what failed."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.acked: dict[tuple[int, int], bytes] = {}
        self.acked_in: Counter = Counter()     # by partition
        self.ack_times: dict[int, list[float]] = defaultdict(list)
        self.errors: Counter = Counter()
        self.sent = 0
        self.undelivered = 0
        self.stopping = threading.Event()

    def _producer(self) -> Producer:
        # metadata every second and 5 s request timeouts: the producer moves to a new leader
        # within seconds although the old one, cut from ZooKeeper, still answers as leader
        return Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 120000, "request.timeout.ms": 5000,
                         "topic.metadata.refresh.interval.ms": 1000})

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked[(msg.partition(), msg.offset())] = msg.value()
            self.acked_in[msg.partition()] += 1
            self.ack_times[msg.partition()].append(time.monotonic())
        else:
            self.errors[err.name()] += 1

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported with the errors
            self.errors[f"producer thread: {exc!r}"] += 1

    def _run(self) -> None:
        producer = self._producer()
        start = time.monotonic()
        while not self.stopping.is_set():
            i = self.sent
            value = (b"%09d:" % i).ljust(VALUE_SIZE, b"x")
            try:
                producer.produce(TOPIC, value=value, partition=i % PARTITIONS,
                                 on_delivery=self._delivered)
            except BufferError:
                producer.poll(0.1)
                continue
            except KafkaException as exc:   # a fatal idempotence error: a new producer id
                self.errors[f"fatal:{exc.args[0].name()}"] += 1
                self.undelivered += producer.flush(10)
                producer = self._producer()
                continue
            self.sent += 1
            producer.poll(0)
            ahead = start + self.sent / RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self.undelivered += producer.flush(120)

    def longest_wait(self, p: int, start: float, end: float) -> float:
        """The longest time in [start, end] (monotonic) without an acknowledgement on ``p``."""
        times = [start] + [t for t in list(self.ack_times[p]) if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))

    def stop(self) -> None:
        self.stopping.set()
        self.join(180)


# --------------------------------------------------------------------------- the checks


@dataclass
class Findings:
    """What the test found wrong (asserted empty at the end) and what it measured."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print("PROBLEM:", text, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, flush=True)


def ranges(offsets) -> list[tuple[int, int]]:
    """Consecutive offsets as [first, last] ranges."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and o == out[-1][1] + 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return [tuple(r) for r in out]


def remote_metadata_events(bootstrap: str) -> list:
    """``TOPIC``'s ``__remote_log_metadata`` records in the order of their metadata partition."""
    events = []
    for _, records in sorted(metadata_topic_records(bootstrap).items()):
        for _, value in records:
            event = deserialize(value)
            if event.topic_id_partition.topic == TOPIC:
                events.append(event)
    return events


def check_remote_metadata(events: list, leadership: Leadership, found: Findings) -> None:
    """No segment DELETE from a broker that did not lead then (refused by readers or not: it
    may have deleted the objects); the states of each segment a legal sequence, among the
    records readers accept (they refuse one written at a leader epoch below one already seen
    for its partition). Other writes by a broker that did not lead, the refused records, and
    two finished copies of one range are noted."""
    states: dict = {}
    first: dict = {}
    fences: dict[int, int] = {}
    refused: list[str] = []
    copies_by_range: dict = defaultdict(set)
    not_leading: dict = defaultdict(list)      # (partition, broker, is a delete) -> [what]
    for e in events:
        p = e.topic_id_partition.partition
        if isinstance(e, RemoteLogSegmentMetadata):
            first[e.remote_log_segment_id] = e
        elif not isinstance(e, RemoteLogSegmentMetadataUpdate):
            continue
        sid, state, t, broker = e.remote_log_segment_id, e.state, e.event_timestamp_ms, e.broker_id
        seg = first.get(sid)
        what = f"{state.name} of [{getattr(seg, 'start_offset', '?')}, " \
               f"{getattr(seg, 'end_offset', '?')}] at {t}"
        if not leadership.led(p, broker, t - leadership.grace_ms(broker, t), t):
            not_leading[(p, broker, state in DELETES)].append(what)
        epoch = getattr(e, "leader_epoch", -1)   # the writer's; records from before the fencing lack it
        if 0 <= epoch < fences.get(p, -1):
            refused.append(f"partition {p}: {what} by broker {broker} at epoch {epoch}")
            continue
        fences[p] = max(fences.get(p, -1), epoch)
        prev = states.get(sid)
        if not S.is_valid_transition(prev, state):
            found.problem(f"partition {p} segment {sid.id}: illegal transition "
                          f"{getattr(prev, 'name', None)} -> {what} by broker {broker}")
        states[sid] = state
        if state is S.COPY_SEGMENT_FINISHED and seg is not None:
            copies_by_range[(p, seg.start_offset, seg.end_offset)].add((str(sid.id), broker))
    for (p, broker, delete), writes in sorted(not_leading.items()):
        text = (f"partition {p}: {len(writes)} records by broker {broker} while it did not lead "
                f"the partition (ZooKeeper's leaders {leadership.history_of(p)}): {writes[:6]}")
        if delete:
            found.problem(f"segment deletes: {text}")
        else:
            found.note(text)
    for key, copies in sorted(copies_by_range.items()):
        if len(copies) > 1:
            found.note(f"partition {key[0]} [{key[1]}, {key[2]}] copied {len(copies)} times: "
                       f"{sorted(copies)}")
    if refused:
        found.note(f"{len(refused)} records readers refuse: {refused[:6]}")
    found.note(f"remote metadata: {len(events)} records, {len(states)} segments, "
               f"{Counter(s.name for s in states.values())}")


def local_batches(log_dir: Path, p: int, below: int) -> dict[int, bytes]:
    """The batches of a replica's local log of ``TOPIC``-p that end below ``below``; read
    again from the start when local retention removes a segment meanwhile (the broker may run)."""
    for _ in range(50):
        out = {}
        try:
            for segment in sorted((log_dir / f"{TOPIC}-{p}").glob("*.log")):
                data = segment.read_bytes()
                for h in rec.iter_headers(data):
                    if h.last_offset < below:
                        out[h.base_offset] = data[h.position:h.position + h.size]
            return out
        except FileNotFoundError:
            continue
    raise AssertionError(f"{log_dir}: segments of {TOPIC}-{p} kept going while read")


def compare_replicas(cluster: StrataCluster, high_watermarks: dict[int, int],
                     found: Findings, when: str) -> None:
    """Each replica's local log is contiguous, and batches at the same offset below the high
    watermark are the same bytes on every replica that still holds them."""
    for p, hw in high_watermarks.items():
        logs = {b.node_id: local_batches(b.log_dir, p, hw) for b in cluster.brokers}
        for node, batches in logs.items():
            bases = sorted(batches)
            for prev, base in zip(bases, bases[1:]):
                end = rec.read_header(batches[prev]).next_offset
                if base != end:
                    found.problem(f"{when}: partition {p} replica {node}: local log jumps from "
                                  f"{end} to {base}")
        compared = 0
        nodes = sorted(logs)
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                lo = max(min(logs[a], default=hw), min(logs[b], default=hw))
                only = sorted(o for o in set(logs[a]) ^ set(logs[b]) if o >= lo)
                differ = sorted(o for o in set(logs[a]) & set(logs[b]) if logs[a][o] != logs[b][o])
                compared += len(set(logs[a]) & set(logs[b]))
                if only:
                    found.problem(f"{when}: partition {p}: batches at {only[:10]} on only one of "
                                  f"replicas {a} and {b} (below the high watermark {hw})")
                if differ:
                    found.problem(f"{when}: partition {p}: replicas {a} and {b} differ in the "
                                  f"batches at {differ[:10]} ({len(differ)} batches)")
        found.note(f"{when}: partition {p}: local logs below {hw} start at "
                   f"{ {n: min(bs, default=None) for n, bs in logs.items()} }; "
                   f"{compared} batch pairs compared")


# --------------------------------------------------------------------------- the scenario


def wait(what: str, check, timeout: float, found: Findings | None = None) -> bool:
    """Polls ``check`` (exceptions count as not yet); on timeout a problem (or, without
    ``found``, an AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # noqa: BLE001 - brokers come and go
            last = exc
        if last and not isinstance(last, Exception):
            return True
        time.sleep(0.2)
    message = f"{what}: not within {timeout:.0f} s (last: {last!r})"
    if found is None:
        raise AssertionError(message)
    found.problem(message)
    return False


def highest_tiered(cluster: StrataCluster, leadership: Leadership, p: int) -> int | str:
    """The highest offset in the remote tier as the leader ZooKeeper names answers it."""
    try:
        err, offset, _ = list_offset(cluster.broker(leadership.state(p)[0]).bootstrap, TOPIC, p,
                                     LATEST_TIERED)
    except Exception as exc:  # noqa: BLE001 - only for the notes
        return repr(exc)
    return offset if err == 0 else f"error {err}"


def cut_leader_from_zookeeper(net: Network, cluster: StrataCluster, leadership: Leadership,
                              producing: Producing, p: int, seconds: float,
                              found: Findings) -> None:
    """Cuts the leader of ``p`` from ZooKeeper alone for ``seconds``, heals, and waits for it to
    be back in every ISR."""
    leader, epoch, isr = leadership.state(p)
    acked_before = producing.acked_in[p]
    found.note(f"cutting broker {leader} (leader of {TOPIC}-{p} at epoch {epoch}, isr {isr}, "
               f"controller {leadership.controller()}, highest tiered offset "
               f"{highest_tiered(cluster, leadership, p)}) from ZooKeeper for {seconds:.1f} s")
    start, start_ms = time.monotonic(), time.time() * 1000
    net.cut(f"broker-{leader}", "zookeeper")
    moved = None
    try:
        while time.monotonic() - start < seconds:
            if moved is None and leadership.state(p)[0] != leader:
                moved = time.monotonic() - start
                found.note(f"  leadership of {TOPIC}-{p} moved to {leadership.state(p)[0]} "
                           f"after {moved:.1f} s")
            time.sleep(0.2)
    finally:
        net.heal()
    found.note(f"  healed; {producing.acked_in[p] - acked_before} records of {TOPIC}-{p} "
               f"acknowledged during the cut; leaders now "
               f"{[leadership.state(q)[0] for q in range(PARTITIONS)]}; highest tiered offset "
               f"{highest_tiered(cluster, leadership, p)}")
    if moved is None:
        found.note(f"  leadership of {TOPIC}-{p} did not move during the cut")
    back = wait(f"broker {leader} registered again and every ISR whole after the cut",
                lambda: leadership.registered(leader) and all(
                    len(leadership.state(q)[2]) == 3 for q in range(PARTITIONS)), 90, found)
    leadership.cuts.append((leader, start_ms, time.time() * 1000 if back else float("inf")))
    if back:
        found.note(f"  every ISR whole again {time.monotonic() - start - seconds:.1f} s after healing")
        # the ex-leader's log right away, before local retention takes what it appended when cut
        marks = high_watermarks(cluster)
        if wait("every replica at the high watermark after the cut", lambda: all(
                log_end(b, TOPIC, q) >= marks[q] for b in cluster.brokers
                for q in range(PARTITIONS)), 30, found):
            compare_replicas(cluster, marks, found, f"after cutting broker {leader}")
    found.note(f"  longest time without an acknowledgement on {TOPIC}-{p} from the cut to now: "
               f"{producing.longest_wait(p, start, time.monotonic()):.1f} s")


def high_watermarks(cluster: StrataCluster) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(CTopicPartition(TOPIC, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def settle(cluster: StrataCluster, leadership: Leadership, found: Findings) -> dict[int, int]:
    """Waits until every replica of every partition is in the ISR and at the high watermark;
    the high watermarks."""
    ends: dict[int, int] = {}
    watermarks = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "settle"})

    def settled() -> bool:
        for p in range(PARTITIONS):
            ends[p] = watermarks.get_watermark_offsets(CTopicPartition(TOPIC, p), timeout=5)[1]
        return all(len(leadership.state(p)[2]) == 3 and
                   all(log_end(b, TOPIC, p) == ends[p] for b in cluster.brokers)
                   for p in range(PARTITIONS))
    try:
        wait("every replica at the high watermark", settled, 60, found)
    finally:
        watermarks.close()
    return dict(ends)


def check_acknowledged(acked: dict, stored: dict, found: Findings) -> None:
    """Every acknowledged record at its offset, unchanged; no value stored twice."""
    lost = sorted(k for k in acked if k not in stored)
    changed = sorted(k for k in acked if k in stored and stored[k] != acked[k])
    twice = [v for v, n in Counter(stored.values()).items() if n > 1]
    by_partition = defaultdict(list)
    for p, o in lost:
        by_partition[p].append(o)
    if lost:
        found.problem(f"{len(lost)} of {len(acked)} acknowledged records not read back: "
                      + "; ".join(f"partition {p} offsets {ranges(o)}"
                                  for p, o in sorted(by_partition.items())))
    if changed:
        found.problem(f"{len(changed)} acknowledged records read back with another value, "
                      f"first at {changed[:5]}")
    if twice:
        found.problem(f"{len(twice)} values stored more than once, e.g. {twice[:3]}")


def run_scenario(tmp_path: Path, rounds: int, cut_seconds) -> None:
    """``rounds`` cuts of a partition leader from ZooKeeper, each ``cut_seconds()`` long, under
    a producer; then the checks. Asserts that none found a problem."""
    found = Findings()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(Network(HOSTS))
        cluster = stack.enter_context(StrataCluster(tmp_path, brokers=3, overrides=OVERRIDES,
                                                    placement=net))
        admin(cluster.bootstrap).create_topics(
            [NewTopic(TOPIC, PARTITIONS, 3, config=TOPIC_CONFIG)])[TOPIC].result(30)
        leadership = Leadership(cluster.zk_connect, TOPIC, PARTITIONS)
        stack.callback(leadership.close)
        producing = Producing(cluster.bootstrap)
        with contextlib.ExitStack() as running:
            wait("every partition led", lambda: all(
                leadership.state(p)[0] >= 0 for p in range(PARTITIONS)), 30)
            producing.start()
            running.callback(producing.stop)
            wait("a segment tiered on every partition", lambda: all(
                list_offset(cluster.broker(leadership.state(p)[0]).bootstrap, TOPIC, p,
                            LATEST_TIERED)[1] >= 0 for p in range(PARTITIONS)), 60)
            controller = leadership.controller()
            leaders = [leadership.state(p)[0] for p in range(PARTITIONS)]
            # the first cut: the leader of a partition that is not the controller; then the next
            first = next((p for p in range(PARTITIONS) if leaders[p] != controller), 0)
            for r in range(rounds):
                p = (first + r) % PARTITIONS
                cut_leader_from_zookeeper(net, cluster, leadership, producing, p, cut_seconds(),
                                          found)
                n = len(producing.acked)
                time.sleep(AFTER_HEAL_S)   # for the copiers and expirers of old and new leader
                wait("records acknowledged after healing", lambda: len(producing.acked) > n, 60,
                     found)
                found.note(f"  {AFTER_HEAL_S} s later: highest tiered offsets "
                           f"{[highest_tiered(cluster, leadership, q) for q in range(PARTITIONS)]}")
        found.note(f"produced {producing.sent}, acknowledged {len(producing.acked)}, "
                   f"undelivered {producing.undelivered}, errors {dict(producing.errors)}")

        ends = settle(cluster, leadership, found)
        compare_replicas(cluster, ends, found, "settled")   # before local retention takes more
        stored, read_errors = read_back(cluster.bootstrap, TOPIC, ends)
        found.note(f"read back {len(stored)} records below high watermarks {ends}; "
                   f"consumer errors: {read_errors[:5]}")
        check_acknowledged(producing.acked, stored, found)
        check_remote_metadata(remote_metadata_events(cluster.bootstrap), leadership, found)
        if leadership.missed_versions():
            found.note(f"partition state versions not seen: {leadership.missed_versions()}")
        history = {p: leadership.history_of(p) for p in range(PARTITIONS)}
    found.note(f"took {time.monotonic() - started:.0f} s")
    (tmp_path / "findings.json").write_text(json.dumps(
        {"problems": found.problems, "notes": found.notes, "leaders": history}, indent=1))
    assert not found.problems, "\n".join(
        [f"{len(found.problems)} problems (all in {tmp_path / 'findings.json'}):"]
        + found.problems[:40] + ["--- notes ---"] + found.notes[-40:])


@needs_zookeeper
def test_a_leader_cut_from_zookeeper_loses_no_acknowledged_record(tmp_path):
    run_scenario(tmp_path, rounds=1, cut_seconds=lambda: float(CUT_S or 20))


@needs_zookeeper
@pytest.mark.faults_net
def test_leaders_cut_from_zookeeper_again_and_again_lose_no_acknowledged_record(tmp_path):
    rng = random.Random(int(os.environ.get("STRATA_NETFAULT_SEED", "51")))
    run_scenario(tmp_path, rounds=ROUNDS,
                 cut_seconds=(lambda: float(CUT_S)) if CUT_S else (lambda: rng.uniform(20, 25)))
