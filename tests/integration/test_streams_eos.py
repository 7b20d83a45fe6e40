"""Kafka Streams against one ``strata serve`` process (issues 28 and 29): Kafka's own
``WordCountDemo`` (kafka-streams-examples 4.3.1, the last published, run unmodified on Kafka
Streams 4.4.0 from the jars ``scripts/kafka-dist.sh`` installs) with
``processing.guarantee=exactly_once_v2``.

The application reads lines from ``streams-plaintext-input``, repartitions the words through
``<app>-KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition``, counts them in a RocksDB store
backed by the compacted ``<app>-KSTREAM-AGGREGATE-STATE-STORE-0000000003-changelog`` and writes
every updated count to ``streams-wordcount-output`` (the demo turns the record cache off, so each
word occurrence makes one changelog record and one output record, in the transaction that also
commits the input offsets).

The run: lines go in until the changelog has been compacted by the broker's log cleaner (fewer
records stored than written); then, with more lines flowing, the Streams JVM is SIGKILLed while
a transaction is open; its state directory is wiped, so the restarted JVM (a new process id,
hence a new transactional.id: the dead transaction is aborted by the broker on its timeout)
restores its counts from the compacted changelog; more lines go in. Read read_committed, each
word's counts in the output topic are exactly 1, 2, ..., N with N the word's occurrences in
the input: no update lost, none counted twice (the aborted transaction's records are never
seen) and the restored store continued from the right counts.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from broker_process import BrokerProcess, stop_process
from kafka_tools import kafka_dist_available, kafka_libs
from support.waiting import eventually

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

WORD_COUNT_DEMO = "org.apache.kafka.streams.examples.wordcount.WordCountDemo"
INPUT = "streams-plaintext-input"        # fixed by WordCountDemo
OUTPUT = "streams-wordcount-output"      # fixed by WordCountDemo
APP_ID = "strata-wordcount-eos"
STORE = "KSTREAM-AGGREGATE-STATE-STORE-0000000003"   # the demo's (unnamed) count() store
CHANGELOG = f"{APP_ID}-{STORE}-changelog"
REPARTITION = f"{APP_ID}-{STORE}-repartition"
PARTITIONS = 2                           # of the input topic, hence of every internal topic

# Groups rebalance at once; a dead Streams member leaves its group after 2 s instead of 45 s;
# few __consumer_offsets / __transaction_state partitions; the transaction coordinator looks for
# timed-out transactions every 200 ms; the cleaner looks for dirty logs every 100 ms.
BROKER = {"group.initial.rebalance.delay.ms": "0",
          "group.min.session.timeout.ms": "1000",
          "offsets.topic.num.partitions": "2",
          "transaction.state.log.num.partitions": "2",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
          "log.cleaner.backoff.ms": "100"}

# The demo's own defaults stay (its String serdes, statestore.cache.max.bytes=0,
# auto.offset.reset=earliest). ``topic.*`` goes to the internal topics' configs: the changelog
# rolls a segment every 100 ms of record time so the cleaner has closed segments to compact.
STREAMS_PROPS = """\
application.id={app_id}
bootstrap.servers={bootstrap}
state.dir={state_dir}
processing.guarantee=exactly_once_v2
commit.interval.ms=100
num.stream.threads=1
topic.segment.ms=100
topic.min.cleanable.dirty.ratio=0.01
session.timeout.ms=2000
heartbeat.interval.ms=500
producer.transaction.timeout.ms=5000
"""

# WARN to stderr, plus the changelog reader's INFO lines ("Finished restoring changelog <tp> to
# store <s> with a total number of <n> records") that tell how much a restore read.
STREAMS_LOG4J = """\
status = error
name = strata-streams-test
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p [%t] %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
logger.restore.name = org.apache.kafka.streams.processor.internals.StoreChangelogReader
logger.restore.level = INFO
"""
RESTORED_RE = re.compile(r"Finished restoring changelog (\S+) to store (\S+) "
                         r"with a total number of (\d+) records")

VOCABULARY = ["kafka", "strata", "streams", "exactly", "once", "compacted", "changelog",
              "restore"]
TIMEOUT = 60             # seconds any one phase may take


def line_words(i: int) -> list[str]:
    """Line i has word j when j+1 divides i+1: known, different counts per word."""
    return [w for j, w in enumerate(VOCABULARY) if (i + 1) % (j + 1) == 0]


class Input:
    """Lines for the input topic; ``expected`` counts every word produced so far."""

    def __init__(self, bootstrap: str):
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                     "enable.idempotence": True})
        self.next_line = 0
        self.expected: collections.Counter[str] = collections.Counter()

    def send(self, n: int) -> None:
        for _ in range(n):
            words = line_words(self.next_line)
            self.producer.produce(INPUT, " ".join(words).encode())
            self.expected.update(words)
            self.next_line += 1
        assert self.producer.flush(TIMEOUT) == 0, "input lines not delivered"

    @property
    def occurrences(self) -> int:
        return sum(self.expected.values())


class Output:
    """A read_committed consumer of the whole output topic that keeps every count it read."""

    def __init__(self, bootstrap: str):
        self.consumer = ck.Consumer({"bootstrap.servers": bootstrap,
                                     "group.id": f"check-{uuid.uuid4()}",
                                     "enable.auto.commit": False,
                                     "isolation.level": "read_committed",
                                     "fetch.wait.max.ms": 100})
        self.consumer.assign([TopicPartition(OUTPUT, p, ck.OFFSET_BEGINNING)
                              for p in range(PARTITIONS)])
        self.counts: dict[str, list[int]] = collections.defaultdict(list)

    def poll(self, timeout: float = 0.2) -> None:
        for m in self.consumer.consume(1000, timeout):
            assert m.error() is None, m.error()
            self.counts[m.key().decode()].append(int.from_bytes(m.value(), "big", signed=True))

    def latest(self) -> dict[str, int]:
        return {w: seq[-1] for w, seq in self.counts.items()}

    def close(self) -> None:
        self.consumer.close()


class StreamsApp:
    """WordCountDemo in its own JVM; each run logs to its own file."""

    def __init__(self, tmp: Path, bootstrap: str):
        self.tmp = tmp
        self.state_dir = tmp / "streams-state"
        self.props = tmp / "streams.properties"
        self.props.write_text(STREAMS_PROPS.format(app_id=APP_ID, bootstrap=bootstrap,
                                                   state_dir=self.state_dir))
        self.log4j = tmp / "streams-log4j2.properties"
        self.log4j.write_text(STREAMS_LOG4J)
        self.proc: subprocess.Popen | None = None
        self.runs: list[Path] = []

    def start(self) -> None:
        log_path = self.tmp / f"streams-{len(self.runs) + 1}.log"
        self.runs.append(log_path)
        # java.io.tmpdir: where rocksdbjni unpacks its native library (left behind by a SIGKILL)
        jvm_tmp = self.tmp / "jvm-tmp"
        jvm_tmp.mkdir(exist_ok=True)
        cmd = ["java", "-Xmx384m", f"-Djava.io.tmpdir={jvm_tmp}",
               f"-Dlog4j2.configurationFile={self.log4j}",
               "-cp", f"{kafka_libs()}{os.sep}*", WORD_COUNT_DEMO, str(self.props)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def log(self, run: int = -1) -> str:
        return self.runs[run].read_text(errors="replace") if self.runs else ""

    def errors(self) -> list[str]:
        """ERROR lines of every run, but the one an unclean shutdown under EOS brings: a
        store without a checkpoint is "corrupted", wiped and restored from the changelog."""
        return [line for run in range(len(self.runs)) for line in self.log(run).splitlines()
                if (" ERROR " in line or "Exception in thread" in line)
                and "TaskCorruptedException" not in line]

    def check_alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, \
            f"the Streams JVM exited ({self.proc.returncode}):\n{self.log()[-6000:]}"
        bad = self.errors()
        assert not bad, "Kafka Streams logged errors:\n" + "\n".join(bad[:40])

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(TIMEOUT)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.resume()
            stop_process(self.proc, signal.SIGTERM, timeout=TIMEOUT)   # the demo's close() hook

    def restored(self) -> dict[str, int]:
        """{changelog partition: records restored} from the latest run's log."""
        return {m.group(1): int(m.group(3)) for m in RESTORED_RE.finditer(self.log())}


def offsets(bootstrap: str, topic: str, committed: bool) -> list[int]:
    """Each partition's end offset (latest at read_uncommitted) or last stable offset (latest at
    read_committed), from one ListOffsets v9."""
    from kio.schema.list_offsets.v9.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic)
    from kio.schema.list_offsets.v9.response import ListOffsetsResponse
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64
    from strata.net.connection import roundtrip
    from strata.protocol.client import LATEST
    req = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(1 if committed else 0),
                             topics=(ListOffsetsTopic(name=TopicName(topic), partitions=tuple(
                                 ListOffsetsPartition(partition_index=i32(p), timestamp=i64(LATEST))
                                 for p in range(PARTITIONS))),))
    parts = sorted(roundtrip(bootstrap, req, ListOffsetsResponse).topics[0].partitions,
                   key=lambda p: int(p.partition_index))
    assert all(int(p.error_code) == 0 for p in parts), parts
    return [int(p.offset) for p in parts]


def open_transactions(bootstrap: str) -> list[str]:
    """Partitions of the application's topics with an open transaction (LSO < end offset)."""
    out = []
    for topic in (CHANGELOG, REPARTITION, OUTPUT):
        for p, (lso, end) in enumerate(zip(offsets(bootstrap, topic, True),
                                           offsets(bootstrap, topic, False))):
            if lso < end:
                out.append(f"{topic}-{p} (LSO {lso} < end {end})")
    return out


def stored_records(bootstrap: str, topic: str) -> int:
    """How many data records the topic holds: read_uncommitted from each partition's first
    offset to its end (control records are not delivered)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4()}",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
    n, at_end = 0, set()
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic} not read to its end in {TIMEOUT}s"
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    n += 1
                else:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    at_end.add(m.partition())
    finally:
        c.close()
    return n


def wait_until(cond, what: str, app: StreamsApp, out: Output | None = None,
               timeout: float = TIMEOUT):
    """Poll ``out`` and ``cond`` until ``cond`` is true; fail on a deadline or on a dead or
    erroring Streams JVM."""
    def check():
        if out is not None:
            out.poll()          # waits for records itself
        got = cond()
        if not got:
            app.check_alive()
        return got
    return eventually(check, what, timeout, interval=0 if out is not None else 0.1,
                      report=lambda: (f"; output counts {out.latest() if out is not None else None}"
                                      f"\n--- streams log ---\n{app.log()[-6000:]}"))


@pytest.fixture
def broker(tmp_path):
    ok, reason = kafka_dist_available()
    if not ok:
        pytest.skip(reason)
    if not list(kafka_libs().glob("kafka-streams-examples-*.jar")):
        pytest.skip(f"kafka-streams-examples is not in {kafka_libs()} (KAFKA_VERSION override?)")
    b = BrokerProcess(tmp_path / "broker", BROKER).start()
    try:
        yield b
    finally:
        b.stop()
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


def test_word_count_exactly_once_v2_survives_sigkill_and_restores_from_compacted_changelog(
        broker, tmp_path):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in (INPUT, OUTPUT):
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT)
    lines = Input(broker.bootstrap)
    out = Output(broker.bootstrap)
    app = StreamsApp(tmp_path, broker.bootstrap)
    try:
        app.start()

        # 1. Lines in batches, each counted (committed output == input so far), until the
        #    cleaner has compacted the changelog: it stores fewer records than were written
        #    (one per word occurrence, the record cache being off).
        written = 0

        def compacted():
            nonlocal written
            lines.send(40)
            want = dict(lines.expected)
            wait_until(lambda: out.latest() == want, f"counts {want}", app, out)
            written = lines.occurrences
            stored = stored_records(broker.bootstrap, CHANGELOG)
            return stored if stored < written else None
        stored = wait_until(compacted, "the changelog to be compacted", app)
        assert stored < written

        # 2. SIGKILL the JVM in the middle of a transaction while lines keep coming (a
        #    feeder thread): once new counts are committed, the JVM is frozen (SIGSTOP) and
        #    killed if one of its transactions is open, else let go on (SIGCONT) and tried again
        #    a moment later. A kill whose transaction was completed anyway (its EndTxn already
        #    on the wire) starts the JVM again, state kept, and kills it again.
        before_kill = dict(lines.expected)
        stop_feeding = threading.Event()
        feed_error: list[BaseException] = []

        def feed():
            try:
                while not stop_feeding.is_set():
                    lines.send(10)
                    time.sleep(0.05)      # pacing: a steady stream, not a wait for anything
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                feed_error.append(exc)

        def frozen_mid_transaction():
            if not any(out.latest().get(w, 0) > n for w, n in before_kill.items()):
                return None
            app.pause()
            found = open_transactions(broker.bootstrap)
            if not found:
                app.resume()
            return found

        open_at_kill: list[str] = []
        for attempt in range(3):
            feeder = threading.Thread(target=feed, daemon=True)
            stop_feeding.clear()
            feeder.start()
            try:
                seen = wait_until(frozen_mid_transaction,
                                  "an open Streams transaction after new counts", app, out)
                app.kill()
            finally:
                stop_feeding.set()
                feeder.join(TIMEOUT)
            assert not feed_error, feed_error
            open_at_kill = open_transactions(broker.bootstrap)
            if open_at_kill:
                break
            print(f"kill {attempt + 1}: transactions open before it {seen}, none after")
            app.start()
        assert open_at_kill, "three kills all landed after their transaction's EndTxn"
        written_before_restore = lines.occurrences

        # 3. Wipe the state directory (RocksDB store, checkpoint and process id) and start the
        #    JVM again: it restores the counts from the compacted changelog.
        stores = list(app.state_dir.glob(f"{APP_ID}/*/rocksdb/{STORE}"))
        assert stores, f"no RocksDB store under {app.state_dir}"
        shutil.rmtree(app.state_dir)
        app.start()
        lines.send(200)
        want = dict(lines.expected)
        wait_until(lambda: out.latest() == want, f"final counts {want}", app, out)

        restored = app.restored()
        assert sorted(restored) == sorted(f"{CHANGELOG}-{p}" for p in range(PARTITIONS)), \
            f"no restore of every changelog partition in the log:\n{app.log()[-6000:]}"
        # At most the records written before the kill (fewer: the cleaner removed old counts),
        # at least one per word.
        assert len(VOCABULARY) <= sum(restored.values()) < written_before_restore, restored

        # Every word's committed counts are 1..N, in order: nothing lost, nothing counted twice
        # (the killed transaction was aborted), the restored store went on from the right count.
        assert sorted(out.counts) == sorted(VOCABULARY)
        for word, seq in out.counts.items():
            n = lines.expected[word]
            assert seq == list(range(1, n + 1)), (
                f"{word}: {len(seq)} committed counts, expected 1..{n}; "
                f"wrong at {next((i for i, v in enumerate(seq) if v != i + 1), None)}")
        # An aborted transaction's records are in the output log, only not read_committed.
        if any(t.startswith(OUTPUT) for t in open_at_kill):
            assert stored_records(broker.bootstrap, OUTPUT) > lines.occurrences

        # The changelog, compacted: fewer records stored than written.
        assert stored_records(broker.bootstrap, CHANGELOG) < lines.occurrences
        app.check_alive()
    finally:
        out.close()
        app.stop()
    print(f"changelog: {stored} of {written} records stored after phase 1; kill with open "
          f"transactions {open_at_kill}; restored {restored}; {lines.occurrences} words")
