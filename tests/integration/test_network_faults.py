"""Network partitions on broker processes and a real ZooKeeper, each in its own network
namespace (benchmarks/netfault.py), with tiering on: issue 51's "How it is shown".

- The harness itself: ``cut(a, b)`` stops TCP between a and b alone (a connect times out)
  while both still reach everyone else; ``isolate`` and ``split`` likewise; ``heal`` restores.
- Network faults (the bench's, benchmarks/netfaults.py ``apply_fault``: leader isolated,
  leader cut from ZooKeeper only, leader split from the majority, controller isolated, the
  link between a leader and a follower down), each for about 20 s, while two acks=all
  producers (an idempotent one and a plain one, without idempotence) write to a tiered RF 3
  topic (min.insync.replicas 2, 16 KiB segments, 5 s local retention) and a group consumer
  consumes it and commits. After each heal the test waits (on conditions) until every ISR is
  whole, both producers are acknowledged, the group commits beyond where it was and every
  partition tiers a new segment. Then: every record acknowledged to either producer is read
  back at its offset from offset 0 across both tiers (the plain producer may have stored a
  record twice, the idempotent one may not); the group's committed offsets never went back
  (acknowledged commits, what its coordinator answered meanwhile, where the consumer resumed
  after an assignment, what is committed at the end) and it caught up with the high
  watermarks; every replica's local log below the high watermark holds the same batches byte
  for byte (compared right after each heal and once settled, before the 5 s local retention
  removes them); and ``__remote_log_metadata`` has no segment DELETE written by a broker that
  did not lead the partition then (ZooKeeper's partition states, timed by ZooKeeper, say who
  led) and no illegal state transition among the records readers accept.

The short version (one cut of a leader from ZooKeeper) runs in ``make test``; ``make
faults-net`` runs the ``faults_net`` loop: for each fault, ``STRATA_NETFAULT_ROUNDS`` rounds (2)
on a cluster of its own, each for ``STRATA_NETFAULT_CUT_S`` seconds (20 to 25 at random).
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
from confluent_kafka import Consumer, KafkaException, TopicPartition as CTopicPartition
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient

from cluster_clients import admin, log_end
from cluster_process import StrataCluster
from benchmarks.netfault import CLIENTS, Network, netfault_available
from benchmarks.netfaults import (FAULTS, PRODUCER, Producing, apply_fault, cut_from_zookeeper,
                                    read_back, stall, unread, whole)
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
ROUNDS = int(os.environ.get("STRATA_NETFAULT_ROUNDS", "2"))    # of each fault, in make faults-net
CUT_S = os.environ.get("STRATA_NETFAULT_CUT_S")
TOPIC = "netfault"
PARTITIONS = 3
SEGMENT = 16 * 1024
RATE = 400                 # records per second, both producers and all partitions together
GROUP = "netfault-group"
COMMIT_EVERY_S = 0.5       # the group consumer commits its position this often
# the group's clients: a request to a broker cut off fails within seconds, not librdkafka's 60
CONSUMER = {"socket.timeout.ms": 10000, "topic.metadata.refresh.interval.ms": 1000,
            "metadata.max.age.ms": 3000}
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


# --------------------------------------------------------------------------- the clients


def producers(bootstrap: str) -> dict[str, Producing]:
    """The two producers of the bench's kind (benchmarks/netfaults.py), each at ``RATE``
    records/s over every partition, values tagged by producer: an idempotent acks=all one
    and a plain acks=all one (without idempotence a retry may store a record twice; it must
    still lose none)."""
    per_partition = RATE / 2 / PARTITIONS
    return {
        "idempotent": Producing(bootstrap, topic=TOPIC, partitions=PARTITIONS, rate=per_partition,
                                config=PRODUCER, tag=b"i"),
        "plain": Producing(bootstrap, topic=TOPIC, partitions=PARTITIONS, rate=per_partition,
                           config={**PRODUCER, "enable.idempotence": False}, tag=b"p"),
    }


class GroupConsuming(threading.Thread):
    """A consumer of group ``GROUP`` subscribed to ``TOPIC`` that commits its position
    synchronously every ``COMMIT_EVERY_S`` when it consumed something since. Keeps every
    acknowledged commit (partition -> [(time, offset)]), the committed offsets another client
    of the group reads from its coordinator meanwhile, and the first offset consumed after
    each assignment of a partition (librdkafka resumes from the committed offset)."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.commits: dict[int, list[tuple[float, int]]] = defaultdict(list)
        self.observed: dict[int, list[tuple[float, int]]] = defaultdict(list)
        self.resumes: list[tuple[float, int, int, int]] = []  # (time, p, offset, committed)
        self.assignments: list[tuple[float, list[int]]] = []
        self.consumed = 0
        self.errors: Counter = Counter()
        self.stopping = threading.Event()
        self._fresh: set[int] = set()     # assigned, nothing consumed since

    def last_commit(self, p: int) -> tuple[float, int]:
        return self.commits[p][-1] if self.commits[p] else (0.0, -1)

    def committed_after(self, t: float, beyond: dict[int, int]) -> bool:
        """Whether every partition had a commit acknowledged after ``t`` above ``beyond[p]``."""
        return all(self.last_commit(p)[0] > t and self.last_commit(p)[1] > beyond.get(p, -1)
                   for p in range(PARTITIONS))

    def _assigned(self, consumer, partitions) -> None:
        self.assignments.append((time.monotonic(), sorted(tp.partition for tp in partitions)))
        self._fresh |= {tp.partition for tp in partitions}

    def run(self) -> None:
        observer = threading.Thread(target=self._observe, daemon=True)
        observer.start()
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported with the errors
            self.errors[f"consumer thread: {exc!r}"] += 1
        finally:
            observer.join(30)

    def _run(self) -> None:
        consumer = Consumer({**CONSUMER, "bootstrap.servers": self.bootstrap, "group.id": GROUP,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([TOPIC], on_assign=self._assigned)
        last_commit, pending = time.monotonic(), False
        try:
            while not self.stopping.is_set():
                m = consumer.poll(0.2)
                if m is not None and m.error() is not None:
                    self.errors[m.error().name()] += 1
                elif m is not None:
                    p = m.partition()
                    if p in self._fresh:
                        self._fresh.discard(p)
                        self.resumes.append((time.monotonic(), p, m.offset(),
                                             max((o for _, o in self.commits[p]), default=-1)))
                    self.consumed += 1
                    pending = True
                if pending and time.monotonic() - last_commit >= COMMIT_EVERY_S:
                    last_commit = time.monotonic()
                    try:
                        done = consumer.commit(asynchronous=False)
                    except KafkaException as exc:   # the coordinator moving: the next one
                        self.errors[f"commit:{exc.args[0].name()}"] += 1
                        continue
                    pending = False
                    now = time.monotonic()
                    for tp in done or []:
                        if tp.error is None and tp.offset >= 0:
                            self.commits[tp.partition].append((now, tp.offset))
        finally:
            consumer.close()

    def _observe(self) -> None:
        """The group's committed offsets as its coordinator answers them, every ~0.5 s. Asked
        by a consumer of the group that does not join it: librdkafka's AdminClient aborts the
        process when an OffsetFetch times out (``rd_kafka_enq_once_del_source_return:
        Assertion `eonce->refcnt > 0'``, librdkafka issue 4605), as it does under these faults."""
        client = Consumer({**CONSUMER, "bootstrap.servers": self.bootstrap, "group.id": GROUP,
                           "enable.auto.commit": False})
        try:
            while not self.stopping.wait(0.5):
                try:
                    answer = client.committed([CTopicPartition(TOPIC, p)
                                               for p in range(PARTITIONS)], timeout=5)
                except KafkaException:   # no coordinator for a while: asked again
                    continue
                now = time.monotonic()
                for tp in answer:
                    if tp.error is None and tp.offset >= 0:
                        self.observed[tp.partition].append((now, tp.offset))
        finally:
            client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


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


def group_committed(bootstrap: str) -> dict[int, int]:
    """The group's committed offsets now, by partition (-1: none)."""
    client = Consumer({**CONSUMER, "bootstrap.servers": bootstrap, "group.id": GROUP,
                       "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in client.committed(
            [CTopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)}
    finally:
        client.close()


def check_group(consuming: GroupConsuming, final: dict[int, int], found: Findings) -> None:
    """The group's committed offsets never went back: neither the commits acknowledged to the
    consumer, nor what the coordinator answered meanwhile, nor where the consumer resumed after
    an assignment (at or above its last acknowledged commit); the offsets committed at the end
    are at or above every acknowledged commit."""
    for p in range(PARTITIONS):
        for what, series in (("acknowledged commits", consuming.commits[p]),
                             ("committed offsets read from the coordinator",
                              consuming.observed[p])):
            back = [(a, b) for (_, a), (_, b) in zip(series, series[1:]) if b < a]
            if back:
                found.problem(f"group {GROUP} partition {p}: {what} went back "
                              f"{len(back)} times: {back[:5]}")
        highest = max((o for _, o in consuming.commits[p]), default=-1)
        if final.get(p, -1) < highest:
            found.problem(f"group {GROUP} partition {p}: committed {final.get(p)} at the end, "
                          f"below the acknowledged commit {highest}")
    behind = [(p, offset, committed) for _, p, offset, committed in consuming.resumes
              if offset < committed]
    if behind:
        found.problem(f"group {GROUP}: resumed below its acknowledged commit (partition, first "
                      f"offset, committed): {behind[:10]}")
    found.note(f"group {GROUP}: consumed {consuming.consumed}, "
               f"{sum(len(c) for c in consuming.commits.values())} commits acknowledged, "
               f"{len(consuming.assignments)} assignments, resumed at "
               f"{[(p, o) for _, p, o, _ in consuming.resumes][:12]}, committed at the end "
               f"{final}, errors {dict(consuming.errors)}")


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


def tiered_beyond(cluster: StrataCluster, leadership: Leadership, marks: dict[int, int]) -> bool:
    """Whether the leader of every partition tiered a segment beyond ``marks[p]``."""
    now = {p: highest_tiered(cluster, leadership, p) for p in range(PARTITIONS)}
    return all(isinstance(now[p], int) and now[p] > marks[p] for p in range(PARTITIONS))


def cut_from_zookeeper_now(net: Network) -> list[int]:
    """The brokers that do not reach ZooKeeper now (isolated, or cut from it)."""
    hosts = {net.namespace(h): h for h in net.hosts}
    faults = net.faults
    cut = set(faults["isolated"]) | {hosts.get(ns) for ns, address in faults["cut"]
                                     if address == net.address("zookeeper")}
    return sorted(int(h.split("-")[1]) for h in cut if h and h.startswith("broker-"))


@dataclass
class Run:
    """What runs through the faults: the network, cluster, ZooKeeper's view, the clients."""

    net: Network
    cluster: StrataCluster
    leadership: Leadership
    producing: dict[str, Producing]
    consuming: GroupConsuming
    found: Findings
    rounds: list[tuple[str, float, float]] = field(default_factory=list)   # (what, from, to)


def fault_round(run: Run, fault: str, turn: int, seconds: float) -> None:
    """One fault (benchmarks/netfaults.py's ``apply_fault``) for ``seconds``, then heals and
    waits until every broker, asked itself, sees all three and whole ISRs; compares the
    replicas' local logs right away (before local retention takes what an ex-leader appended);
    then waits until both producers are acknowledged, the group commits beyond where it was,
    and every partition's leader tiers a segment beyond what was tiered at the heal."""
    net, cluster, leadership, found = run.net, run.cluster, run.leadership, run.found
    states = {q: leadership.state(q) for q in range(PARTITIONS)}
    leaders = {q: leader for q, (leader, _, _) in states.items()}
    controller = leadership.controller()
    tiered = [highest_tiered(cluster, leadership, q) for q in range(PARTITIONS)]
    start, start_ms = time.monotonic(), time.time() * 1000
    p, what = apply_fault(net, fault, leaders, controller, turn,
                          lambda node: cut_from_zookeeper(net, node))
    cut_off = cut_from_zookeeper_now(net)
    leader, epoch, isr = states[p]
    found.note(f"{fault} round {turn + 1}: {what} for {seconds:.1f} s ({TOPIC}-{p} led by "
               f"{leader} at epoch {epoch}, isr {isr}; controller {controller}; leaders "
               f"{leaders}; highest tiered offsets {tiered})")
    moved = None
    try:
        while time.monotonic() - start < seconds:    # the fault's length, not a wait
            if moved is None and leadership.state(p)[0] != leader:
                moved = time.monotonic() - start
                found.note(f"  leadership of {TOPIC}-{p} moved to {leadership.state(p)[0]} "
                           f"after {moved:.1f} s")
            time.sleep(0.2)
    finally:
        net.heal()
    healed = time.monotonic()
    committed = {q: run.consuming.last_commit(q)[1] for q in range(PARTITIONS)}
    acked = {name: len(pr.ack_times[p]) for name, pr in run.producing.items()}
    during = {n: sum(1 for t in pr.ack_times[p] if start < t <= healed)
              for n, pr in run.producing.items()}
    found.note(f"  healed; acknowledged on {TOPIC}-{p} during the fault: {during}"
               f"; leaders now {[leadership.state(q)[0] for q in range(PARTITIONS)]}")
    if moved is None:
        found.note(f"  leadership of {TOPIC}-{p} did not move during the fault")
    back = wait(f"{fault}: every broker sees all three and whole ISRs after healing",
                lambda: whole([b.bootstrap for b in cluster.brokers], TOPIC, PARTITIONS), 120,
                found)
    leadership.cuts.extend((b, start_ms, time.time() * 1000 if back else float("inf"))
                           for b in cut_off)
    if back:
        found.note(f"  every ISR whole again {time.monotonic() - healed:.1f} s after healing")
        marks = high_watermarks(cluster)
        if wait(f"{fault}: every replica at the high watermark after healing", lambda: all(
                log_end(b, TOPIC, q) >= marks[q] for b in cluster.brokers
                for q in range(PARTITIONS)), 30, found):
            compare_replicas(cluster, marks, found, f"after {fault} round {turn + 1}")
    tiered = {q: highest_tiered(cluster, leadership, q) for q in range(PARTITIONS)}
    tiered = {q: o if isinstance(o, int) else -1 for q, o in tiered.items()}
    for name, pr in run.producing.items():
        wait(f"{fault}: the {name} producer acknowledged on every partition after healing",
             lambda pr=pr: all(pr.acked_after(q, healed) for q in range(PARTITIONS)), 90, found)
    wait(f"{fault}: the group committed beyond {committed} after healing",
         lambda: run.consuming.committed_after(healed, committed), 90, found)
    # for the copiers and expirers of the old and the new leaders to act on the new segments
    wait(f"{fault}: every partition tiered beyond {tiered} after healing",
         lambda: tiered_beyond(cluster, leadership, tiered), 90, found)
    end = time.monotonic()
    run.rounds.append((f"{fault} round {turn + 1}", start, end))
    gaps = {n: round(stall(pr.ack_times[p], start, end)[0], 1) for n, pr in run.producing.items()}
    found.note(f"  {end - healed:.1f} s after healing: highest tiered offsets "
               f"{[highest_tiered(cluster, leadership, q) for q in range(PARTITIONS)]}; "
               f"longest time without an acknowledgement on {TOPIC}-{p} "
               f"{gaps} s; "
               f"{ {n: len(pr.ack_times[p]) - acked[n] for n, pr in run.producing.items()} } "
               f"acknowledged on it since the heal")


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


def check_acknowledged(name: str, producing: Producing, stored: dict,
                       rounds: list[tuple[str, float, float]], found: Findings) -> None:
    """Every record acknowledged to the producer at its offset, unchanged (netfaults.unread);
    from the idempotent producer no value stored twice (the plain one's duplicates are
    counted). Lost records are put in the fault round in which they were acknowledged."""
    acked = producing.values()
    lost, changed = unread(acked, stored)
    mine = Counter(v for v in stored.values() if v.startswith(producing.tag))
    twice = [v for v, n in mine.items() if n > 1]
    if lost:
        by_partition = defaultdict(list)
        for p, o in lost:
            by_partition[p].append(o)
        when = Counter(next((what for what, a, b in rounds
                             if a <= producing.acked[k][1] <= b), "outside the faults")
                       for k in lost)
        found.problem(f"{name} producer: {len(lost)} of {len(acked)} acknowledged records not "
                      f"read back: " + "; ".join(f"partition {p} offsets {ranges(o)}"
                                                 for p, o in sorted(by_partition.items()))
                      + f" (acknowledged during {dict(when)})")
    if changed:
        found.problem(f"{name} producer: {len(changed)} acknowledged records read back with "
                      f"another value, first at {changed[:5]}")
    if twice and producing.idempotent:
        found.problem(f"{name} producer: {len(twice)} values stored more than once, "
                      f"e.g. {twice[:3]}")
    found.note(f"{name} producer: sent {producing.sent}, acknowledged {len(acked)} "
               f"({producing.without_offset} without an offset), undelivered "
               f"{producing.undelivered}, errors {producing.error_counts()}; {len(mine)} of its "
               f"values read back, {len(twice)} of them more than once")


def run_scenario(tmp_path: Path, faults: list[str], cut_seconds) -> None:
    """The ``faults`` in turn, each ``cut_seconds()`` long, under both producers and the group
    consumer; then the checks. Asserts that none found a problem."""
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
        run = Run(net, cluster, leadership, producers(cluster.bootstrap),
                  GroupConsuming(cluster.bootstrap), found)
        with contextlib.ExitStack() as running:
            wait("every partition led", lambda: all(
                leadership.state(p)[0] >= 0 for p in range(PARTITIONS)), 30)
            for producing in run.producing.values():
                producing.start()
                running.callback(producing.stop)
            run.consuming.start()
            running.callback(run.consuming.stop)
            wait("a segment tiered on every partition", lambda: tiered_beyond(
                cluster, leadership, {p: -1 for p in range(PARTITIONS)}), 60)
            wait("the group committing on every partition",
                 lambda: run.consuming.committed_after(0, {}), 60)
            for turn, fault in enumerate(faults):
                fault_round(run, fault, turn, cut_seconds())
            for producing in run.producing.values():
                producing.stop()      # flushed
            ends = settle(cluster, leadership, found)
            wait("the group committed up to the high watermarks (it resumed after the faults)",
                 lambda: all(run.consuming.last_commit(p)[1] >= ends[p]
                             for p in range(PARTITIONS)), 90, found)
        compare_replicas(cluster, ends, found, "settled")   # before local retention takes more
        stored, read_errors = read_back(cluster.bootstrap, TOPIC, ends)
        found.note(f"read back {len(stored)} records below high watermarks {ends}; "
                   f"consumer errors: {read_errors[:5]}")
        for name, producing in run.producing.items():
            check_acknowledged(name, producing, stored, run.rounds, found)
        check_group(run.consuming, group_committed(cluster.bootstrap), found)
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
    run_scenario(tmp_path, ["leader-cut-coord"], cut_seconds=lambda: float(CUT_S or 20))


@needs_zookeeper
@pytest.mark.faults_net
@pytest.mark.parametrize("fault", FAULTS)
def test_network_faults_again_and_again_lose_no_acknowledged_record(tmp_path, fault):
    rng = random.Random(int(os.environ.get("STRATA_NETFAULT_SEED", "51")))
    run_scenario(tmp_path, [fault] * ROUNDS,
                 cut_seconds=(lambda: float(CUT_S)) if CUT_S else (lambda: rng.uniform(20, 25)))
