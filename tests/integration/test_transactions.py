"""Kafka transactions (KIP-98, KIP-447, KIP-890 part 1) against one real ``strata serve``
process and unmodified clients, as users run them:

- confluent-kafka's consume-transform-produce loop (``send_offsets_to_transaction``) over two
  input partitions, with an aborted batch and a broker restart (SIGTERM, SIGKILL) while a
  transaction is open: read_committed sees every input record exactly once, read_uncommitted
  the aborted records too, and the group's committed offsets are the input's end offsets;
- fencing by a second producer with the same transactional.id, and the broker aborting a
  transaction that outlived its ``transaction.timeout.ms``;
- kafka-python's and aiokafka's transactional producers and read_committed consumers;
- KIP-890 verification refusing a transactional Produce to a partition never added to the
  transaction;
- read_committed from the remote tier (KIP-405): aborted transactions found through the
  transaction indexes of segments that are no longer local;
- Kafka's Java tools: ``kafka-producer-perf-test --transactional-id`` and ``kafka-transactions``
  (list, describe, describe-producers, find-hanging, abort).
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition as CkTp
from confluent_kafka.admin import AdminClient, NewTopic

from broker_process import BrokerProcess
from kafka_tools import KAFKA_TRANSACTIONS, PRODUCER_PERF, require_kafka_dist, run_kafka_class
from tiered_support import TIERED_BROKER, LATEST, list_offset, offsets, remote_files, wait_for

from strata.common.errors import ErrorCode
from strata.net.connection import Connection, roundtrip
from strata.protocol import records as rec
from strata.protocol.codec import ApiKey, make, request_class, response_class

pytestmark = pytest.mark.slow

# Groups rebalance at once instead of after Kafka's default 3 s; a few __transaction_state and
# __consumer_offsets partitions instead of 50 each (made at the first use, on a 2-core machine);
# timed-out transactions aborted within 200 ms of their timeout instead of 10 s.
BROKER = {"group.initial.rebalance.delay.ms": "0",
          "transaction.state.log.num.partitions": "4",
          "offsets.topic.num.partitions": "4",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}
TIMEOUT = 30            # seconds any one client call may take


# --------------------------------------------------------------------------- helpers


def assert_clean_log(b: BrokerProcess) -> None:
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("txn"), BROKER) as b:
        yield b
    assert_clean_log(b)


def create(b: BrokerProcess, topic: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(TIMEOUT)


def txn_producer(b: BrokerProcess, transactional_id: str, **config) -> ck.Producer:
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": transactional_id,
                     "linger.ms": 5, **config})
    p.init_transactions(TIMEOUT)
    return p


def last_stable_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The partition's last stable offset: ListOffsets(latest) at isolation read_committed."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(1), topics=(
        ListOffsetsTopic(name=TopicName(topic), partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(LATEST)),)),))
    p = roundtrip(bootstrap, req, ListOffsetsResponse).topics[0].partitions[0]
    assert int(p.error_code) == 0, p
    return int(p.offset)


def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    err, off, _ = list_offset(bootstrap, topic, partition, LATEST)
    assert err == 0, err
    return off


def settled(bootstrap: str, topic: str, partition: int = 0) -> bool:
    """No transaction open in the partition: its last stable offset is its end offset."""
    return (last_stable_offset(bootstrap, topic, partition)
            == end_offset(bootstrap, topic, partition))


def wait_settled(b: BrokerProcess, topic: str, partition: int = 0) -> None:
    """Until the markers of the transactions that ended are written (a coordinator answers
    EndTxn once PrepareCommit/PrepareAbort is durable and writes the markers after)."""
    wait_for(lambda: settled(b.bootstrap, topic, partition), TIMEOUT, 0.05,
             f"no transaction left open in {topic}-{partition}")


def read_all(b: BrokerProcess, topic: str, partitions=(0,), *, committed: bool = True,
             timeout: float = TIMEOUT) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record a confluent-kafka consumer at the given
    isolation level reads from the start of each partition up to its end (partition EOF)."""
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"read-{uuid.uuid4()}",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "isolation.level": "read_committed" if committed else "read_uncommitted",
                     "fetch.wait.max.ms": 100})
    c.assign([CkTp(topic, p, ck.OFFSET_BEGINNING) for p in partitions])
    out, at_end = [], set()
    deadline = time.monotonic() + timeout
    try:
        while at_end != set(partitions):
            assert time.monotonic() < deadline, \
                f"{topic}: only partitions {sorted(at_end)} read to the end in {timeout}s"
            for m in c.consume(500, 0.5):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    at_end.add(m.partition())
                else:
                    out.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        c.close()
    return out


def values(records) -> list[str]:
    return [r[3].decode() for r in records]


# ---- raw requests (what no client library spells)


def find_transaction_coordinator(bootstrap: str, transactional_id: str) -> None:
    """FindCoordinator for a transactional id until it answers (the first one creates
    ``__transaction_state``)."""
    rq = request_class(ApiKey.FIND_COORDINATOR, 4)
    body = make(rq, key_type=1, coordinator_keys=(transactional_id,))

    def found():
        r = roundtrip(bootstrap, body, response_class(ApiKey.FIND_COORDINATOR, 4))
        return int(r.coordinators[0].error_code) == 0
    wait_for(found, TIMEOUT, 0.1, "the transaction coordinator")


def init_producer_id(bootstrap: str, transactional_id: str,
                     timeout_ms: int = 60_000) -> tuple[int, int]:
    """(producer id, epoch) of an InitProducerId v4 for ``transactional_id``."""
    find_transaction_coordinator(bootstrap, transactional_id)
    rq = request_class(ApiKey.INIT_PRODUCER_ID, 4)
    body = make(rq, transactional_id=transactional_id,
                transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
                producer_id=-1, producer_epoch=-1)
    retriable = {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                 ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS}

    def answered():
        r = roundtrip(bootstrap, body, response_class(ApiKey.INIT_PRODUCER_ID, 4))
        code = int(r.error_code)
        if code in retriable:
            return None
        assert code == 0, f"InitProducerId({transactional_id!r}) error {code}"
        return int(r.producer_id), int(r.producer_epoch)
    return wait_for(answered, TIMEOUT, 0.1, f"InitProducerId({transactional_id!r})")


def produce_raw(bootstrap: str, version: int, transactional_id: str | None, topic: str,
                batch: bytes, partition: int = 0):
    """One Produce (acks=-1) of ``batch``; the partition's response."""
    rq = request_class(ApiKey.PRODUCE, version)
    body = make(rq, transactional_id=transactional_id, acks=-1,
                timeout=datetime.timedelta(seconds=5),
                topic_data=(make(rq, "topic_data", name=topic, partition_data=(
                    make(rq, "topic_data.partition_data", index=partition, records=batch),)),))
    with Connection(bootstrap, timeout=TIMEOUT) as conn:
        r = conn.request(body, response_class(ApiKey.PRODUCE, version))
    return r.responses[0].partition_responses[0]


def txn_batch(producer_id: int, epoch: int, n: int = 3, timestamp: int | None = None) -> bytes:
    return rec.build_batch([rec.SimpleRecord(f"raw-{i}".encode(), None, (), timestamp)
                            for i in range(n)],
                           producer_id=producer_id, producer_epoch=epoch, base_sequence=0,
                           transactional=True)


# --------------------------------------------------------------------------- consume-transform-
# produce


class Pipeline:
    """A consume-transform-produce application as Kafka's documentation writes it: a consumer
    of ``in`` in group ``ctp`` (read_committed, no auto-commit) and a transactional producer of
    ``out``; each batch of input records becomes output records and the consumer's offsets in
    one transaction. A transaction that fails abortably (or is aborted on purpose) is aborted
    and the consumer rewound to the group's committed offsets, so the batch is processed again.

    Each attempt numbers its output records ``"<input>:<attempt>"``, so the aborted attempts'
    records can be told apart."""

    # librdkafka 2.16 re-bootstraps when its only broker goes away (KIP-899's default
    # metadata.recovery.strategy=rebootstrap) and decommissions the broker it knew, and then
    # send_offsets_to_transaction waits forever (past its timeout) on the decommissioned
    # coordinator (confluentinc/librdkafka#5511). One broker that restarts at the same address
    # needs no re-bootstrap.
    NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}

    def __init__(self, b: BrokerProcess, source: str, sink: str):
        self.b, self.source, self.sink = b, source, sink
        self.consumer = ck.Consumer({
            "bootstrap.servers": b.bootstrap, "group.id": "ctp", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100, **self.NO_REBOOTSTRAP})
        self.consumer.subscribe([source])
        self.producer = txn_producer(b, "ctp-app", **self.NO_REBOOTSTRAP)
        self.attempt = 0
        self.committed: set[int] = set()
        self.aborted: set[int] = set()
        self.errors: list[str] = []

    def rewind(self) -> None:
        assigned = self.consumer.assignment()
        for tp in self.consumer.committed(assigned, TIMEOUT):
            self.consumer.seek(CkTp(tp.topic, tp.partition,
                                    tp.offset if tp.offset >= 0 else ck.OFFSET_BEGINNING))

    def abort(self) -> None:
        self.producer.abort_transaction(TIMEOUT)
        self.aborted.add(self.attempt)
        self.rewind()

    def process(self, msgs, *, abort: bool = False, before_commit=None) -> None:
        self.attempt += 1
        p = self.producer
        p.begin_transaction()
        for m in msgs:
            assert m.error() is None, m.error()
            p.produce(self.sink, key=m.key(), value=f"{m.value().decode()}:{self.attempt}",
                      partition=m.partition())
        if abort:
            p.flush(TIMEOUT)          # the aborted records reach the log before the abort
            self.abort()
            return
        if before_commit is not None:
            p.flush(TIMEOUT)
            before_commit()
        try:
            p.send_offsets_to_transaction(self.consumer.position(self.consumer.assignment()),
                                          self.consumer.consumer_group_metadata(), TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            while True:
                try:
                    p.commit_transaction(TIMEOUT)
                    break
                except KafkaException as e:
                    if not e.args[0].retriable():
                        raise
                    self.errors.append(f"attempt {self.attempt}: commit retried: {e.args[0]}")
                    assert time.monotonic() < deadline, self.errors[-5:]
        except KafkaException as e:
            error = e.args[0]
            if not error.txn_requires_abort():
                raise
            self.errors.append(f"attempt {self.attempt} aborted: {error}")
            self.abort()
            return
        self.committed.add(self.attempt)

    def done(self, ends: dict[int, int]) -> bool:
        assigned = self.consumer.assignment()
        if len(assigned) != len(ends):
            return False
        return all(tp.offset == ends[tp.partition] for tp in self.consumer.position(assigned))

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(TIMEOUT)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_consume_transform_produce_is_exactly_once_across_an_abort_and_a_broker_restart(
        tmp_path, sig):
    source, sink, n = "ctp-in", "ctp-out", 400
    b = BrokerProcess(tmp_path, BROKER)
    b.start()
    try:
        create(b, source, 2)
        create(b, sink, 2)
        feeder = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(n):
            feeder.produce(source, key=str(i).encode(), value=str(i).encode(), partition=i % 2)
        assert feeder.flush(TIMEOUT) == 0
        ends = {p: end_offset(b.bootstrap, source, p) for p in (0, 1)}
        assert ends == {0: n // 2, 1: n // 2}

        app = Pipeline(b, source, sink)
        restarted = aborted_on_purpose = None

        def restart():
            assert b.stop(sig) == (0 if sig == signal.SIGTERM else -sig)
            b.start()

        batches = 0
        deadline = time.monotonic() + 90
        while not app.done(ends):
            assert time.monotonic() < deadline, \
                f"input not consumed in 90 s: {app.consumer.position(app.consumer.assignment())}"
            msgs = app.consumer.consume(40, 0.5)
            if not msgs:
                continue
            batches += 1
            if batches == 3:            # an aborted batch, processed again after the rewind
                app.process(msgs, abort=True)
                aborted_on_purpose = app.attempt
            elif batches == 6:          # the broker restarts while this transaction is open
                app.process(msgs, before_commit=restart)
                restarted = app.attempt
            else:
                app.process(msgs)
        app.close()
        assert aborted_on_purpose is not None and restarted is not None, batches
        assert aborted_on_purpose in app.aborted
        # The transaction open across the restart is still there to commit: its state (Ongoing,
        # with its output partitions) and the group's generation were loaded back from the log.
        assert restarted in app.committed, app.errors

        # The group's committed offsets are the input's end offsets.
        check = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ctp"})
        try:
            committed = check.committed([CkTp(source, 0), CkTp(source, 1)], TIMEOUT)
        finally:
            check.close()
        assert {tp.partition: tp.offset for tp in committed} == ends

        for p in (0, 1):
            wait_settled(b, sink, p)
        out = read_all(b, sink, (0, 1))
        got = sorted(int(v.split(":")[0]) for v in values(out))
        assert got == list(range(n)), \
            f"{len(got)} records, {len(set(got))} distinct, missing " \
            f"{sorted(set(range(n)) - set(got))[:10]}, errors {app.errors}"
        attempts = {int(v.split(":")[1]) for v in values(out)}
        assert attempts <= app.committed, (attempts - app.committed, app.errors)
        for part, _, key, value in out:     # each output record went where its input was
            assert int(key) % 2 == part and value.decode().startswith(key.decode() + ":")

        everything = values(read_all(b, sink, (0, 1), committed=False))
        aborted = [v for v in everything if int(v.split(":")[1]) == aborted_on_purpose]
        assert aborted, "read_uncommitted saw none of the aborted batch's records"
        assert not set(aborted) & set(values(out))
        assert len(everything) > len(out)
        assert b.stop() == 0
    finally:
        b.stop(signal.SIGKILL)
    assert_clean_log(b)


# --------------------------------------------------------------------------- fencing, timeout


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(broker):
    topic = "fenced"
    create(broker, topic)
    first = txn_producer(broker, "fence-me")
    first.begin_transaction()
    for i in range(5):
        first.produce(topic, value=f"first-{i}".encode())
    assert first.flush(TIMEOUT) == 0
    assert not settled(broker.bootstrap, topic)

    second = txn_producer(broker, "fence-me")   # aborts the first's open transaction
    second.begin_transaction()
    for i in range(5):
        second.produce(topic, value=f"second-{i}".encode())
    second.commit_transaction(TIMEOUT)

    # The first producer's transaction is still open as far as it knows: its next transactional
    # call fails fatally.
    first.produce(topic, value=b"first-late")
    with pytest.raises(KafkaException) as info:
        first.commit_transaction(TIMEOUT)
    error = info.value.args[0]
    assert error.fatal() and error.code() == KafkaError._FENCED, error

    wait_settled(broker, topic)
    assert values(read_all(broker, topic)) == [f"second-{i}" for i in range(5)]
    uncommitted = values(read_all(broker, topic, committed=False))
    assert uncommitted[:5] == [f"first-{i}" for i in range(5)]
    assert "first-late" not in uncommitted


def test_the_broker_aborts_a_transaction_that_outlives_its_timeout(broker):
    topic = "stalled"
    create(broker, topic)
    slow = txn_producer(broker, "slow", **{"transaction.timeout.ms": 2000})
    slow.begin_transaction()
    for i in range(5):
        slow.produce(topic, value=f"stalled-{i}".encode())
    assert slow.flush(TIMEOUT) == 0
    assert end_offset(broker.bootstrap, topic) == 5
    assert last_stable_offset(broker.bootstrap, topic) == 0   # held back by the open transaction

    # The producer stalls; the broker aborts its transaction: an ABORT marker at offset 5, and
    # the last stable offset moves past it.
    wait_for(lambda: last_stable_offset(broker.bootstrap, topic) == 6, 15, 0.1,
             "the timed-out transaction aborted")
    assert end_offset(broker.bootstrap, topic) == 6

    with pytest.raises(KafkaException) as info:
        slow.commit_transaction(TIMEOUT)
    error = info.value.args[0]     # the abort bumped the epoch: the producer is fenced
    assert error.fatal() and error.code() == KafkaError._FENCED, error

    other = txn_producer(broker, "after-slow")
    other.begin_transaction()
    other.produce(topic, value=b"after")
    other.commit_transaction(TIMEOUT)
    wait_settled(broker, topic)
    assert values(read_all(broker, topic)) == ["after"]
    assert values(read_all(broker, topic, committed=False)) == \
        [f"stalled-{i}" for i in range(5)] + ["after"]


# --------------------------------------------------------------------------- pure-Python clients


def test_kafka_python_transactional_producer_commits_and_aborts(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = "kp-txn"
    create(broker, topic)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx",
                      max_block_ms=TIMEOUT * 1000)
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(5):
            p.send(topic, value=f"kept-{i}".encode(), partition=0)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(5):
            p.send(topic, value=f"dropped-{i}".encode(), partition=0)
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic, value=b"kept-last", partition=0)
        p.commit_transaction()
    finally:
        p.close(timeout=TIMEOUT)

    kept = [f"kept-{i}" for i in range(5)] + ["kept-last"]
    wait_settled(broker, topic)
    assert values(read_all(broker, topic)) == kept
    assert len(read_all(broker, topic, committed=False)) == 11

    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + TIMEOUT
        while c.position(tp) < end_offset(broker.bootstrap, topic):
            assert time.monotonic() < deadline, (got, c.position(tp))
            for records in c.poll(500).values():
                got += [r.value.decode() for r in records]
    finally:
        c.close()
    assert got == kept


def test_aiokafka_transactional_producer_commits_and_aborts(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition
    topic = "ak-txn"
    create(broker, topic)

    async def produce() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="ak-tx")
        await asyncio.wait_for(p.start(), TIMEOUT)
        try:
            async with p.transaction():
                for i in range(5):
                    await p.send(topic, f"kept-{i}".encode(), partition=0)
            await p.begin_transaction()
            for i in range(5):
                await (await p.send(topic, f"dropped-{i}".encode(), partition=0))
            await p.abort_transaction()
            async with p.transaction():
                await p.send(topic, b"kept-last", partition=0)
        finally:
            await p.stop()

    async def consume() -> list[str]:
        tp = TopicPartition(topic, 0)
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await asyncio.wait_for(c.start(), TIMEOUT)
        got = []
        try:
            c.assign([tp])
            await c.seek_to_beginning(tp)
            end = (await c.end_offsets([tp]))[tp]        # the last stable offset
            deadline = time.monotonic() + TIMEOUT
            while await c.position(tp) < end:
                assert time.monotonic() < deadline, (got, end)
                for records in (await c.getmany(tp, timeout_ms=500)).values():
                    got += [r.value.decode() for r in records]
        finally:
            await c.stop()
        return got

    kept = [f"kept-{i}" for i in range(5)] + ["kept-last"]
    asyncio.run(produce())
    wait_settled(broker, topic)
    assert asyncio.run(consume()) == kept
    assert values(read_all(broker, topic)) == kept
    assert len(read_all(broker, topic, committed=False)) == 11


# --------------------------------------------------------------------------- KIP-890 verification


def test_transactional_produce_to_a_partition_not_in_the_transaction_is_refused(broker):
    topic = "unverified"
    create(broker, topic)
    producer_id, epoch = init_producer_id(broker.bootstrap, "raw-verify")
    assert producer_id >= 0 and epoch >= 0
    for version in range(3, 12):
        r = produce_raw(broker.bootstrap, version, "raw-verify", topic,
                        txn_batch(producer_id, epoch))
        want = ErrorCode.TRANSACTION_ABORTABLE if version >= 11 else ErrorCode.INVALID_TXN_STATE
        assert int(r.error_code) == want, f"Produce v{version}: {r}"
        assert int(r.base_offset) == -1, f"Produce v{version}: {r}"
    assert end_offset(broker.bootstrap, topic) == 0
    assert read_all(broker, topic, committed=False) == []


def test_transactional_produce_without_a_transactional_id_is_refused(broker):
    """Kafka refuses a Produce that carries transactional records but no transactional id
    (KafkaApis.handleProduceRequest: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every
    partition): nothing could verify it, and no coordinator would ever end the transaction it
    opens."""
    topic = "no-txn-id"
    create(broker, topic)
    producer_id, epoch = init_producer_id(broker.bootstrap, "raw-no-id")
    for version in (3, 9, 11):
        r = produce_raw(broker.bootstrap, version, None, topic, txn_batch(producer_id, epoch))
        assert int(r.error_code) == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, \
            f"Produce v{version}: {r}"
    assert end_offset(broker.bootstrap, topic) == 0
    assert settled(broker.bootstrap, topic)


# --------------------------------------------------------------------------- tiered storage


SEGMENT = 16 * 1024
TIERED_TOPIC = {"remote.storage.enable": "true", "internal.segment.bytes": str(SEGMENT),
                "local.retention.bytes": "1", "segment.index.bytes": "4096"}


def test_read_committed_skips_aborted_transactions_read_from_the_remote_tier(tmp_path):
    topic, per_txn, txns, tail = "tiered-txn", 20, 30, 150
    pad = "x" * 200
    with BrokerProcess(tmp_path, {**TIERED_BROKER, **BROKER}) as b:
        create(b, topic, **TIERED_TOPIC)
        p = txn_producer(b, "tiered-tx")
        committed, aborted = [], []
        for t in range(txns):
            abort = t % 3 == 1
            p.begin_transaction()
            batch = [f"t{t}-{i}-{'aborted' if abort else 'committed'}" for i in range(per_txn)]
            for v in batch:
                p.produce(topic, value=f"{v}|{pad}".encode(), partition=0)
            if abort:
                assert p.flush(TIMEOUT) == 0
                p.abort_transaction(TIMEOUT)
                aborted += batch
            else:
                p.commit_transaction(TIMEOUT)
                committed += batch
        wait_settled(b, topic)
        last_marker = end_offset(b.bootstrap, topic) - 1
        assert last_marker == txns * (per_txn + 1) - 1      # every transaction and its marker
        plain = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(tail):       # rolls the transactions out of the active segment
            plain.produce(topic, value=f"plain-{i}|{pad}".encode(), partition=0)
        assert plain.flush(TIMEOUT) == 0

        # Every segment holding the transactions is in the remote tier and only there.
        o = wait_for(lambda: (o := offsets(b.bootstrap, topic))["local_start"] > last_marker
                     and o["tiered"] >= last_marker and o, 60, what="the transactions tiered")
        assert o["start"] == 0, o
        root = b.data_dir / "kafka-logs" / "remote-storage"
        assert len([f for f in remote_files(root, topic) if f.suffix == ".log"]) >= 5

        out = values(read_all(b, topic))
        assert [v.split("|")[0] for v in out] == committed + [f"plain-{i}" for i in range(tail)]
        everything = [v.split("|")[0] for v in values(read_all(b, topic, committed=False))]
        assert [v for v in everything if v.endswith("-aborted")] == aborted
    assert_clean_log(b)


# --------------------------------------------------------------------------- Java tools


def tool(main_class: str, *args: str) -> str:
    result = run_kafka_class(main_class, *args)
    assert result.returncode == 0, \
        f"{main_class} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def table(out: str) -> list[list[str]]:
    """Rows (header first) of a table ``kafka-transactions`` printed."""
    return [line.split() for line in out.strip().splitlines()]


def test_java_transactional_perf_producer_and_kafka_transactions(broker):
    require_kafka_dist()
    topic, n = "perf-txn", 500
    create(broker, topic)
    args = ("--bootstrap-server", broker.bootstrap)
    out = tool(PRODUCER_PERF, *args, "--topic", topic, "--num-records", str(n),
               "--record-size", "50", "--throughput", "-1", "--transactional-id", "perf-tx",
               "--transaction-duration-ms", "100")
    assert f"{n} records sent" in out, out
    wait_settled(broker, topic)
    assert len(read_all(broker, topic)) == n

    def listed():
        rows = table(tool(KAFKA_TRANSACTIONS, *args, "list"))
        assert rows[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
        perf = [r for r in rows[1:] if r[0] == "perf-tx"]
        assert len(perf) == 1 and perf[0][1] == "1", rows
        # CompleteCommit once the last commit's markers are written (PrepareCommit until then)
        return perf[0][3] == "CompleteCommit" and perf[0]
    perf_producer_id = wait_for(listed, TIMEOUT, 0.2, "perf-tx listed as CompleteCommit")[2]

    # An open transaction, as kafka-transactions describes it.
    p = txn_producer(broker, "described-tx")
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"open-{i}".encode(), partition=0)
    assert p.flush(TIMEOUT) == 0
    start = end_offset(broker.bootstrap, topic) - 3
    [header, row] = table(tool(KAFKA_TRANSACTIONS, *args, "describe", "--transactional-id",
                               "described-tx"))
    assert header == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                      "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                      "TransactionDurationMs", "TopicPartitions"]
    assert (row[0], row[1], row[4], row[5], row[8]) == \
        ("1", "described-tx", "Ongoing", "60000", f"{topic}-0"), row
    producer_id, epoch, started = row[2], row[3], row[6]
    assert int(started) > 0 and int(row[7]) >= 0, row

    rows = table(tool(KAFKA_TRANSACTIONS, *args, "describe-producers", "--topic", topic,
                      "--partition", "0"))
    by_id = {r[0]: r for r in rows[1:]}
    assert by_id[producer_id][1] == epoch and by_id[producer_id][5] == str(start), rows
    assert by_id[perf_producer_id][5] == "None", rows      # its transactions all ended

    p.commit_transaction(TIMEOUT)

    def described():
        [_, row] = table(tool(KAFKA_TRANSACTIONS, *args, "describe", "--transactional-id",
                              "described-tx"))
        return row[4] != "PrepareCommit" and row
    row = wait_for(described, TIMEOUT, 0.2, "described-tx out of PrepareCommit")
    # Kafka keeps the start time of the transaction that ended (TransactionMetadata.prepareComplete)
    assert (row[4], row[6], len(row)) == ("CompleteCommit", started, 8), row   # no partitions
    wait_settled(broker, topic)
    rows = table(tool(KAFKA_TRANSACTIONS, *args, "describe-producers", "--topic", topic,
                      "--partition", "0"))
    assert {r[0]: r for r in rows[1:]}[producer_id][5] == "None", rows
    assert [r[3] for r in read_all(broker, topic)][-3:] == [f"open-{i}".encode() for i in range(3)]


def test_kafka_transactions_finds_and_aborts_a_hanging_transaction(tmp_path):
    require_kafka_dist()
    topic = "hanging"
    with BrokerProcess(tmp_path, {**BROKER,
                                  "transaction.partition.verification.enable": "false"}) as b:
        create(b, topic)
        args = ("--bootstrap-server", b.bootstrap)
        # A transactional batch no coordinator knows to end: the transactional id never added
        # the partition (the append is not verified on this broker). Its records are an hour
        # old, older than find-hanging's default 15-minute bound.
        producer_id, epoch = init_producer_id(b.bootstrap, "hangs")
        an_hour_ago = int(time.time() * 1000) - 3_600_000
        r = produce_raw(b.bootstrap, 9, "hangs", topic, txn_batch(producer_id, epoch, 3,
                                                                    an_hour_ago))
        assert int(r.error_code) == 0 and int(r.base_offset) == 0, r
        plain = ck.Producer({"bootstrap.servers": b.bootstrap})
        plain.produce(topic, value=b"after", partition=0)
        assert plain.flush(TIMEOUT) == 0
        assert (last_stable_offset(b.bootstrap, topic), end_offset(b.bootstrap, topic)) == (0, 4)

        rows = table(tool(KAFKA_TRANSACTIONS, *args, "find-hanging", "--topic", topic))
        assert rows[0] == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                           "CoordinatorEpoch", "StartOffset", "LastTimestamp", "Duration(min)"]
        assert [r[:6] for r in rows[1:]] == \
            [[topic, "0", str(producer_id), str(epoch), "-1", "0"]], rows
        assert rows[1][6] == str(an_hour_ago) and int(rows[1][7]) >= 59, rows

        tool(KAFKA_TRANSACTIONS, *args, "abort", "--topic", topic, "--partition", "0",
             "--start-offset", "0")
        # An ABORT marker at offset 4; the last stable offset moves past it.
        assert (last_stable_offset(b.bootstrap, topic), end_offset(b.bootstrap, topic)) == (5, 5)
        assert values(read_all(b, topic)) == ["after"]
        assert table(tool(KAFKA_TRANSACTIONS, *args, "find-hanging", "--topic", topic))[1:] == []
    assert_clean_log(b)
