"""Kafka transactions on three broker processes and a real ZooKeeper, with confluent-kafka, while
brokers are SIGKILLed.

``__transaction_state`` and ``__consumer_offsets`` are RF 3 (``transaction.state.log.min.isr``
2), the input and output topics RF 3 with ``min.insync.replicas`` 2. The transaction
coordinator of a transactional id is the leader of its ``__transaction_state`` partition and
moves with that leadership (``LeadershipPublisher`` in ``strata.broker.metadata_publisher``); markers go to
each partition's leader (``strata.server.txn_marker_sender``).

- ``test_a_commit_survives_the_coordinators_sigkill_right_after_it_returns``: EndTxn(commit)
  answered (PrepareCommit durable), the coordinator SIGKILLed at once; the broker that leads the
  ``__transaction_state`` partition next loads it, finishes the commit (markers; its
  DescribeTransactions says CompleteCommit) and a read_committed consumer sees the records (the
  LSO advances) within a bounded wait.
- ``test_consume_transform_produce_is_exactly_once_across_broker_kills``: a read_committed
  consume-transform-produce loop (``send_offsets_to_transaction``, commit; every
  ``ABORT_EVERY``-th transaction aborted on purpose) runs while the transaction coordinator
  and output partition leaders are SIGKILLed in turn and restarted. At the end, read back with
  a fresh read_committed consumer: every input record is in the output exactly once, nothing
  of an aborted transaction is visible, every transaction is all-or-nothing (a committed one
  all there), the group's committed offsets are the input's end offsets, a read_committed
  consumer that tailed the output during the kills saw nothing else, and the loop committed
  transactions after every kill (with the victim down, and again after its restart). The
  ``short`` case (2 kills: the coordinator, then an output partition's leader) is in
  ``make test``;
  the ``long`` case (``STRATA_TXN_KILLS``, 30 by default) carries the ``faults`` marker of the
  long fault loop, so ``make test`` (``-m "not faults"``) leaves it out.

Every wait is on a condition with a deadline (``cluster_clients.wait_for``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import traceback
import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING, Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException,
    Producer, TopicPartition as CTopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.describe_transactions.v0.response import DescribeTransactionsResponse
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.types import TopicName
from kio.static.primitive import i8, i32, i64
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, dump_threads, partitions, wait_for
from cluster_process import StrataCluster
from strata.common.errors import ErrorCode
from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC, partition_for
from strata.net.connection import roundtrip

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

SESSION_MS = 4000
TXN_PARTITIONS = 3
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "group.initial.rebalance.delay.ms": "0",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
}
INTERNAL = ("__consumer_offsets", TRANSACTION_STATE_TOPIC)
IN_PARTITIONS = 3
OUT_PARTITIONS = 3
ABORT_EVERY = 4            # every fourth transaction of the loop is aborted on purpose
BATCH = 50                 # input records per transaction at most
# A dead broker leaves after its ZooKeeper session; its partitions (and the coordinators on
# them) move within a few seconds more; then the client finds the new coordinator and retries.
PROGRESS_DEADLINE_S = 90.0
API_TIMEOUT_S = 15         # the timeout given to each transactional producer call
WATCHDOG_GRACE_S = 10      # a call still blocked this long after its timeout is abandoned
LONG_KILLS = int(os.environ.get("STRATA_TXN_KILLS", "30"))
# librdkafka's debug contexts for the loop's producer (e.g. "eos,protocol"), to stderr: for the
# post-mortem of a failed run (pytest -s 2>client.log)
CLIENT_DEBUG = {"debug": os.environ["STRATA_TXN_CLIENT_DEBUG"]} \
    if os.environ.get("STRATA_TXN_CLIENT_DEBUG") else {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("transactions"), brokers=3,
                       overrides=OVERRIDES) as c:
        yield c


# ---- cluster helpers ------------------------------------------------------------------------

def running(cluster) -> str:
    return ",".join(b.bootstrap for b in cluster.brokers if b.running)


def create(cluster, name: str, count: int) -> None:
    client = AdminClient({"bootstrap.servers": running(cluster)})  # fresh: brokers restart
    topic = NewTopic(name, count, 3, config={"min.insync.replicas": "2"})
    client.create_topics([topic])[name].result(30)
    wait_for(f"{name} has leaders", lambda: all(
        m.leader >= 0 for m in partitions(running(cluster), name, timeout=2).values()))


def txn_coordinator(cluster, transactional_id: str, via=None, key_type: int = 1) -> int:
    """FindCoordinator key type 1 (transaction; 0: group), asked of ``via`` (else a running
    broker)."""
    asked = via or next(b for b in cluster.brokers if b.running)
    resp = roundtrip(asked.bootstrap, FindCoordinatorRequest(
        key_type=i8(key_type), coordinator_keys=(transactional_id,)), FindCoordinatorResponse, 5)
    (c,) = resp.coordinators
    assert c.error_code == ErrorCode.NONE, c
    return int(c.node_id)


def txn_state(broker, transactional_id: str) -> str:
    """DescribeTransactions of ``transactional_id`` as the coordinator ``broker`` knows it
    ("Ongoing", "PrepareCommit", "CompleteCommit", ...)."""
    resp = roundtrip(broker.bootstrap, DescribeTransactionsRequest(
        transactional_ids=(transactional_id,)), DescribeTransactionsResponse, 5)
    (t,) = resp.transaction_states
    assert t.error_code == ErrorCode.NONE, t
    return t.transaction_state


def list_offset(cluster, topic: str, partition: int, read_committed: bool) -> int:
    """ListOffsets latest, as a consumer asks its leader: the high watermark, or with
    ``read_committed`` the last stable offset."""
    leader = partitions(running(cluster), topic, timeout=2)[partition].leader
    resp = roundtrip(cluster.broker(leader).bootstrap, ListOffsetsRequest(
        replica_id=i32(-1), isolation_level=i8(1 if read_committed else 0),
        topics=(ListOffsetsTopic(name=TopicName(topic), partitions=(ListOffsetsPartition(
            partition_index=i32(partition), current_leader_epoch=i32(-1),
            timestamp=i64(-1)),)),)), ListOffsetsResponse, 5)
    p = resp.topics[0].partitions[0]
    assert p.error_code == ErrorCode.NONE, p
    return int(p.offset)


def stable(cluster, topic: str, count: int) -> dict[int, int] | None:
    """partition -> end offset once the LSO equals the high watermark on every partition (no
    transaction open, every marker written), else None."""
    ends = {}
    for p in range(count):
        hw = list_offset(cluster, topic, p, read_committed=False)
        if list_offset(cluster, topic, p, read_committed=True) != hw:
            return None
        ends[p] = hw
    return ends


def whole_isrs(cluster, topics) -> bool:
    nodes = sorted(cluster.node_ids)
    return all(sorted(m.isr) == nodes and m.leader >= 0
               for t in topics for m in partitions(running(cluster), t, timeout=2).values())


def healthy(cluster, topics=INTERNAL) -> None:
    """Every broker registered and every ISR of ``topics`` whole (before the next fault)."""
    try:
        cluster.wait_metadata()
        wait_for("every ISR whole", lambda: whole_isrs(cluster, topics), 60)
    except (AssertionError, TimeoutError):
        dump_threads(cluster)
        raise


def read_all(cluster, topic: str, count: int, read_committed: bool, timeout: float = 60) -> list:
    """(partition, offset, key, value) of every record a fresh consumer reads from the start
    of each partition to its end (partition EOF; for read_committed: the LSO)."""
    isolation = "read_committed" if read_committed else "read_uncommitted"
    consumer = Consumer({"bootstrap.servers": running(cluster), "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
    got, eof = [], set()
    deadline = time.monotonic() + timeout
    try:
        while len(eof) < count:
            assert time.monotonic() < deadline, f"{topic}: EOF on {sorted(eof)} only in {timeout} s"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            got.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        consumer.close()
    return got


def group_offsets(cluster, group: str, topic: str, count: int) -> dict[int, int]:
    client = AdminClient({"bootstrap.servers": running(cluster)})
    found = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [CTopicPartition(topic, p) for p in range(count)])])[group].result(30)
    return {tp.partition: tp.offset for tp in found.topic_partitions}


def stack_of(thread: threading.Thread) -> str:
    """Where ``thread`` is now (for the message of a test that failed waiting on it)."""
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"


# ---- the workload ---------------------------------------------------------------------------

class InputWriter(threading.Thread):
    """An idempotent acks=all producer writing unique values round the input partitions until
    stopped (about 100 records/s)."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.failed: list = []
        self.written = 0

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5,
                             "message.timeout.ms": 120000})

        def report(err, msg):
            if err is not None:
                self.failed.append(err)
        i = 0
        while not self.stop.wait(0.1):   # the pace of the workload, not a wait for anything
            for _ in range(10):
                producer.produce(self.topic, value=b"in-%07d" % i, partition=i % IN_PARTITIONS,
                                 on_delivery=report)
                i += 1
            self.written = i
            producer.poll(0)
        producer.flush(120)


class OutputTail(threading.Thread):
    """A read_committed consumer reading the output as it is written (every partition from
    the start, no group): whatever it sees must be what a fresh read_committed consumer sees at
    the end; a record of an aborted transaction that was visible for a while shows up here."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.seen: list[tuple[int, int, bytes, bytes]] = []

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"tail-{uuid.uuid4()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "auto.offset.reset": "earliest"})
        consumer.assign([CTopicPartition(self.topic, p, OFFSET_BEGINNING)
                         for p in range(OUT_PARTITIONS)])
        try:
            while not self.stop.is_set():
                m = consumer.poll(0.2)
                if m is not None and m.error() is None:
                    self.seen.append((m.partition(), m.offset(), m.key(), m.value()))
        finally:
            consumer.close()


class Stuck(Exception):
    """A transactional API call that has not returned well past its own timeout."""


class TransformLoop(threading.Thread):
    """The application under test: consume (read_committed, group ``group``) -> produce each
    value to the output in a transaction with the consumed offsets -> commit.

    What it does on errors is what a real application does (librdkafka's transactional
    producer API):

    - retriable (``error.retriable()``): call the same operation again;
    - abortable (``error.txn_requires_abort()``): ``abort_transaction()``, then rewind the
      consumer to the group's committed offsets and process those records again;
    - fatal, or anything else: the producer is done (a coordinator may have fenced it): make a
      new one with the same ``transactional.id`` (``init_transactions`` bumps the epoch, which
      ends whatever the old instance left open), then rewind the consumer as above. The
      transaction's outcome is then not known to the application: it is recorded as unknown
      (it must be all or nothing);
    - a call that does not return ``WATCHDOG_GRACE_S`` after its own timeout is treated as
      fatal too (the producer is abandoned, its call left blocked on a daemon thread): librdkafka
      (2.16) can block in ``send_offsets_to_transaction`` past its timeout when the group
      coordinator it cached was decommissioned (dropped from Metadata, as a dead broker is),
      until some broker connection of the client changes state (librdkafka issues #5456 and
      #5511).

    Each transaction writes its number as every record's key, so the output tells which
    transaction wrote what; ``committed``/``aborted``/``unknown`` map a transaction's number to
    the (output partition, value) it produced."""

    def __init__(self, bootstrap: str, transactional_id: str, group: str, inp: str, out: str):
        super().__init__(daemon=True)
        self.bootstrap, self.transactional_id, self.group = bootstrap, transactional_id, group
        self.inp, self.out = inp, out
        self.stop = threading.Event()
        self.committed: dict[int, list[tuple[int, bytes]]] = {}
        self.aborted: dict[int, list[tuple[int, bytes]]] = {}
        self.unknown: dict[int, list[tuple[int, bytes]]] = {}
        self.offsets: dict[int, int] = {}    # input partition -> offset committed with a txn
        self.errors: collections.Counter = collections.Counter()
        self.producers = 0
        self.stuck: list[tuple[str, threading.Thread]] = []   # abandoned calls
        self.failure: BaseException | None = None

    # -- the loop

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc

    def _run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
                             "heartbeat.interval.ms": 1000})
        consumer.subscribe([self.inp])
        producer = self._new_producer()
        txn = 0
        try:
            while not self.stop.is_set():
                msgs = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
                if not msgs:
                    continue
                txn += 1
                records: list[tuple[int, bytes]] = []
                offsets: dict[int, int] = {}
                try:
                    producer.begin_transaction()
                    for i, m in enumerate(msgs):
                        p = (txn + i) % OUT_PARTITIONS   # every transaction spans the partitions
                        producer.produce(self.out, key=b"t%d" % txn, value=m.value(), partition=p)
                        records.append((p, m.value()))
                        offsets[m.partition()] = m.offset() + 1
                    positions = [CTopicPartition(self.inp, p, o) for p, o in offsets.items()]
                    group = consumer.consumer_group_metadata()
                    self._retrying("send_offsets_to_transaction", lambda t: (
                        producer.send_offsets_to_transaction(positions, group, t)))
                    if txn % ABORT_EVERY == 0:
                        self._retrying("abort_transaction", producer.abort_transaction)
                        self.aborted[txn] = records
                    else:
                        self._retrying("commit_transaction", producer.commit_transaction)
                        self.committed[txn] = records
                        self.offsets.update(offsets)
                        continue
                except Stuck as exc:
                    self.errors[f"stuck:{exc}"] += 1
                    self.unknown[txn] = records
                    producer = self._new_producer()
                except KafkaException as exc:
                    error = exc.args[0]
                    self.errors[error.name()] += 1
                    if error.txn_requires_abort():
                        try:
                            self._retrying("abort_transaction", producer.abort_transaction)
                            self.aborted[txn] = records
                        except (KafkaException, Stuck) as again:
                            self.errors[f"abort:{again}"] += 1
                            self.unknown[txn] = records
                            producer = self._new_producer()
                    else:
                        self.unknown[txn] = records
                        producer = self._new_producer()
                self._rewind(consumer)
        finally:
            consumer.close()

    def summary(self) -> str:
        return (f"{len(self.committed)} committed, {len(self.aborted)} aborted, "
                f"{len(self.unknown)} unknown transactions; {self.producers} producer(s); "
                f"client errors {dict(self.errors)}; abandoned calls "
                f"{[(name, 'blocked' if t.is_alive() else 'returned') for name, t in self.stuck]}")

    # -- what a real application does

    def _new_producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap,
                             "transactional.id": self.transactional_id, "linger.ms": 5,
                             "transaction.timeout.ms": 60000, **CLIENT_DEBUG})
        self._retrying("init_transactions", producer.init_transactions)
        self.producers += 1
        return producer

    def _retrying(self, name: str, call, timeout: float = PROGRESS_DEADLINE_S):
        """``call(API_TIMEOUT_S)`` again while it raises a retriable error (e.g. a timeout while
        a coordinator moves); any other error is raised, and Stuck for a call still blocked
        ``WATCHDOG_GRACE_S`` after its timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._watched(name, call)
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or time.monotonic() > deadline:
                    raise
                self.errors[f"retried:{name}:{error.name()}"] += 1

    def _watched(self, name: str, call):
        box: dict = {}
        done = threading.Event()

        def run():
            try:
                box["result"] = call(API_TIMEOUT_S)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller
                box["error"] = exc
            finally:
                done.set()
        worker = threading.Thread(target=run, name=f"{self.transactional_id}-{name}", daemon=True)
        worker.start()
        if not done.wait(API_TIMEOUT_S + WATCHDOG_GRACE_S):
            self.stuck.append((name, worker))   # the producer stays referenced by the call
            raise Stuck(name)
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _rewind(self, consumer: Consumer) -> None:
        """Back to the group's committed offsets (OffsetFetch; read_committed consumers ask
        with require_stable, so a commit still being completed is waited for)."""
        deadline = time.monotonic() + PROGRESS_DEADLINE_S
        while True:
            assignment = consumer.assignment()
            try:
                committed = consumer.committed(assignment, timeout=10) if assignment else []
                break
            except KafkaException as exc:
                self.errors[f"committed:{exc.args[0].name()}"] += 1
                if time.monotonic() > deadline:
                    raise
        for tp in committed:
            consumer.seek(CTopicPartition(tp.topic, tp.partition,
                                          tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


# ---- tests ----------------------------------------------------------------------------------

def test_a_commit_survives_the_coordinators_sigkill_right_after_it_returns(cluster):
    """EndTxn(commit) answers once PrepareCommit is durable in ``__transaction_state``; the
    markers are written behind. The coordinator is SIGKILLed as soon as commit_transaction
    returns: the next leader of the transactional id's ``__transaction_state`` partition loads
    it, finds the transaction unfinished (PrepareCommit, or Complete* if the markers beat the
    kill) and completes it; read_committed consumers then see every record. The same producer
    then commits another transaction through the new coordinator."""
    topic, tid = "commit-failover", "commit-failover-txn"
    create(cluster, topic, OUT_PARTITIONS)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid,
                         "linger.ms": 5})
    producer.init_transactions(30)
    coordinator = txn_coordinator(cluster, tid)
    assert {m.leader for m in partitions(cluster.bootstrap, topic).values()} - {coordinator}, \
        "some markers must go to another broker"
    values = [b"c%d" % i for i in range(30)]
    producer.begin_transaction()
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=i % OUT_PARTITIONS)
    producer.commit_transaction(30)
    victim = cluster.broker(coordinator)
    victim.kill()
    killed_at = time.monotonic()
    log_mark = {b.node_id: len(b.output()) for b in cluster.brokers if b.running}
    try:
        survivor = next(b for b in cluster.brokers if b.running)
        new = wait_for("a new transaction coordinator", lambda: (
            c := txn_coordinator(cluster, tid, via=survivor)) != coordinator and c)
        # it knows the commit (from PrepareCommit, or CompleteCommit if the markers beat the
        # kill) and completes it; never Ongoing (the commit forgotten) nor an abort
        def completed():
            state = txn_state(cluster.broker(new), tid)
            if state != "CompleteCommit":
                raise AssertionError(f"{tid} is {state}")   # shown as the last seen
            return True
        wait_for(f"the commit completed by the new coordinator {new}", completed)
        got = wait_for("the committed records visible to read_committed", lambda: (
            v := read_all(cluster, topic, OUT_PARTITIONS, read_committed=True, timeout=10))
            and len(v) >= len(values) and v)
        took = time.monotonic() - killed_at
        assert sorted(value for *_, value in got) == sorted(values)
        wait_for("the LSO at the high watermark", lambda: stable(cluster, topic, OUT_PARTITIONS))
        # what the new coordinator found (its log: "loaded N ... of __transaction_state-P at
        # coordinator epoch E ...; K to complete")
        part = partition_for(tid, TXN_PARTITIONS)
        loaded = [line for line in cluster.broker(new).output()[log_mark[new]:].splitlines()
                  if f"of {TRANSACTION_STATE_TOPIC}-{part} at coordinator epoch" in line]
        print(f"commit visible {took:.1f} s after the kill; new coordinator {new}: {loaded}")
        # the producer goes on through the new coordinator
        producer.begin_transaction()
        producer.produce(topic, value=b"after", partition=0)
        producer.commit_transaction(60)
        after = read_all(cluster, topic, OUT_PARTITIONS, read_committed=True)
        assert sorted(v for *_, v in after) == sorted([*values, b"after"])
    finally:
        victim.start()
        healthy(cluster)


def test_a_committed_offset_survives_the_group_coordinators_sigkill_right_after_it(cluster):
    """OffsetCommit answers once the record is on the ISR; the coordinator is SIGKILLed as soon
    as the commit returns, three times: the next leader of the group's ``__consumer_offsets``
    partition loads it up to its log end (its high watermark still lags one follower fetch)
    and serves exactly the last commit. Loading to the high watermark came back one commit
    behind, 3 times out of 3."""
    topic, group = "offsets-failover", "offsets-failover-group"
    create(cluster, topic, 1)
    for round_ in range(3):
        consumer = Consumer({"bootstrap.servers": running(cluster), "group.id": group,
                             "enable.auto.commit": False})
        try:
            for offset in (10 * round_ + 5, 10 * round_ + 10):
                consumer.commit(offsets=[CTopicPartition(topic, 0, offset)], asynchronous=False)
        finally:
            consumer.close()
        coordinator = txn_coordinator(cluster, group, key_type=0)
        victim = cluster.broker(coordinator)
        victim.kill()
        try:
            survivor = next(b for b in cluster.brokers if b.running)
            wait_for("a new group coordinator", lambda: (
                c := txn_coordinator(cluster, group, via=survivor, key_type=0)) != coordinator
                and c)
            assert wait_for("the group's offsets", lambda: group_offsets(
                cluster, group, topic, 1)) == {0: 10 * round_ + 10}
        finally:
            victim.start()
            healthy(cluster)


def test_kafka_python_and_aiokafka_transactional_producers_on_the_cluster(cluster):
    """The two Python clients' own transaction managers against three brokers: the
    coordinator and the partition leaders are (mostly) other brokers, so markers go out over
    WriteTxnMarkers. Commit, abort, commit; read_committed sees exactly the committed records,
    read_uncommitted the aborted ones too."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer
    topic = "python-clients-txn"
    create(cluster, topic, OUT_PARTITIONS)

    def sends(lib: str, phase: str):
        return [(i % OUT_PARTITIONS, f"{lib}-{phase}-{i}".encode()) for i in range(6)]

    kp = KafkaProducer(bootstrap_servers=running(cluster), transactional_id="kp-cluster",
                       max_block_ms=60_000)
    try:
        kp.init_transactions()
        for phase in ("kept", "dropped", "last"):
            kp.begin_transaction()
            for partition, value in sends("kp", phase):
                kp.send(topic, value=value, partition=partition)
            kp.flush()
            kp.abort_transaction() if phase == "dropped" else kp.commit_transaction()
    finally:
        kp.close(timeout=30)

    async def aiokafka_phases():
        producer = AIOKafkaProducer(bootstrap_servers=running(cluster),
                                    transactional_id="ak-cluster")
        await producer.start()
        try:
            for phase in ("kept", "dropped", "last"):
                await producer.begin_transaction()
                for partition, value in sends("ak", phase):
                    await producer.send(topic, value=value, partition=partition)
                if phase == "dropped":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()
    asyncio.run(asyncio.wait_for(aiokafka_phases(), 120))

    committed = sorted(v for lib in ("kp", "ak") for phase in ("kept", "last")
                       for _, v in sends(lib, phase))
    aborted = sorted(v for lib in ("kp", "ak") for _, v in sends(lib, "dropped"))
    wait_for("the LSO at the high watermark", lambda: stable(cluster, topic, OUT_PARTITIONS))
    assert sorted(v for *_, v in read_all(cluster, topic, OUT_PARTITIONS, True)) == committed
    assert sorted(v for *_, v in read_all(cluster, topic, OUT_PARTITIONS, False)) == \
        sorted(committed + aborted)


@pytest.mark.parametrize("kills", [
    pytest.param(2, id="short"),
    pytest.param(LONG_KILLS, id="long", marks=pytest.mark.faults),
])
def test_consume_transform_produce_is_exactly_once_across_broker_kills(cluster, kills):
    healthy(cluster)   # whatever an earlier test did
    run = uuid.uuid4().hex[:6]
    inp, out = f"txn-in-{run}", f"txn-out-{run}"
    tid, group = f"transform-{run}", f"transform-group-{run}"
    create(cluster, inp, IN_PARTITIONS)
    create(cluster, out, OUT_PARTITIONS)
    writer = InputWriter(cluster.bootstrap, inp)
    loop = TransformLoop(cluster.bootstrap, tid, group, inp, out)
    tail = OutputTail(cluster.bootstrap, out)
    writer.start()
    loop.start()
    tail.start()
    topics = (inp, out, *INTERNAL)
    killed: list[tuple[str, int]] = []

    def progress(what: str, more: int = 3) -> None:
        """The loop commits ``more`` further transactions (it has not died meanwhile)."""
        n = len(loop.committed)
        try:
            wait_for(what, lambda: loop.failure is not None or len(loop.committed) >= n + more,
                     PROGRESS_DEADLINE_S)
        except AssertionError:
            dump_threads(cluster)
            raise AssertionError(f"{what}: {len(loop.committed) - n} transactions committed; "
                                 f"{loop.summary()}; {writer.written} input records written; "
                                 f"kills {killed}; the loop at:\n{stack_of(loop)}")
        if loop.failure is not None:
            raise AssertionError(f"the transform loop died ({what})") from loop.failure

    try:
        progress("transactions committed before any kill")
        for k in range(kills):
            if k % 2 == 0:
                what = "transaction coordinator"
                victim = txn_coordinator(cluster, tid)
            else:
                what = f"leader of {out}-{k // 2 % OUT_PARTITIONS}"
                victim = partitions(running(cluster), out)[k // 2 % OUT_PARTITIONS].leader
            killed.append((what, victim))
            cluster.broker(victim).kill()
            progress(f"kill {k + 1} ({what}, broker {victim}): commits with it down")
            cluster.broker(victim).start()
            healthy(cluster, topics)
            progress(f"kill {k + 1} ({what}, broker {victim}): commits after its restart")
    finally:
        writer.stop.set()
        writer.join(150)
    try:
        ends = {p: list_offset(cluster, inp, p, read_committed=False) for p in range(IN_PARTITIONS)}
        try:
            wait_for("the loop through the whole input", lambda: loop.failure is not None or all(
                loop.offsets.get(p, 0) >= e for p, e in ends.items()), PROGRESS_DEADLINE_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: committed through {loop.offsets} of {ends}; "
                                 f"{loop.summary()}; kills {killed}; the loop at:\n"
                                 f"{stack_of(loop)}") from None
    finally:
        loop.stop.set()
        loop.join(150)
    assert loop.failure is None, f"the transform loop died: {loop.failure!r}"
    assert not loop.is_alive()
    print(f"{loop.summary()}; kills {killed}")
    assert writer.failed == []

    # every transaction finished: markers written, the LSO at the high watermark everywhere
    wait_for("no transaction left open", lambda: stable(cluster, out, OUT_PARTITIONS))
    inputs = [v for *_, v in read_all(cluster, inp, IN_PARTITIONS, read_committed=False)]
    assert len(inputs) == sum(ends.values()) and len(set(inputs)) == len(inputs)
    output = read_all(cluster, out, OUT_PARTITIONS, read_committed=True)
    try:
        wait_for("the tail through the output", lambda: set(output) <= set(tail.seen))
    finally:
        tail.stop.set()
        tail.join(30)
    # what a read_committed consumer saw while the brokers were killed is all committed
    assert set(tail.seen) - set(output) == set(), "read_committed saw records not committed"

    # every input record exactly once in the output
    counts = collections.Counter(v for *_, v in output)
    assert {v for v, c in counts.items() if c > 1} == set(), "duplicated in the output"
    assert set(inputs) - set(counts) == set(), "input records missing from the output"
    assert set(counts) - set(inputs) == set(), "output records that are not input records"
    # nothing of an aborted transaction; no transaction partly visible
    by_txn: dict[int, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for p, _, key, value in output:
        by_txn[int(key[1:])].append((p, value))
    assert set(by_txn) & set(loop.aborted) == set(), "records of aborted transactions visible"
    assert set(loop.committed) <= set(by_txn), "committed transactions not visible"
    assert set(by_txn) <= set(loop.committed) | set(loop.unknown)
    for txn, seen in by_txn.items():
        wrote = loop.committed.get(txn) or loop.unknown[txn]
        assert sorted(seen) == sorted(wrote), f"transaction {txn} partly visible"
    assert loop.aborted, "no transaction was aborted"
    # the group's committed offsets are the input's end offsets
    assert group_offsets(cluster, group, inp, IN_PARTITIONS) == ends
