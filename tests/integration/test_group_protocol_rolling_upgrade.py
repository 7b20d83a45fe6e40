"""KIP-848's online upgrade and downgrade with real clients: two confluent-kafka consumers of a
classic group are restarted one at a time with ``group.protocol=consumer`` (the first one's
heartbeat converts the classic group into a consumer group in which the other stays a classic
member), then back to the classic protocol (the last consumer-protocol member leaving converts
it back), while a producer keeps writing. Every record is committed exactly once across the
roll: a consumer counts a record only once its offset commit succeeded (a failed commit, e.g.
ILLEGAL_GENERATION from a classic member mid-rebalance, makes it read the record again), so a
record counted twice would be one committed by two owners of its partition."""

from __future__ import annotations

import threading

import pytest

from broker_process import BrokerProcess
from support.waiting import eventually
from test_consumer_protocol_clients import BROKER, TIMEOUT, create_topic

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

TOPIC, GROUP = "rolling", "rolling-group"


class Worker(threading.Thread):
    """A consumer of the group polling in its own thread; ``done`` are the values whose
    offset commit succeeded."""

    def __init__(self, bootstrap: str, protocol: str, name: str, done: list, lock,
                 assignor: str):
        super().__init__(daemon=True, name=name)
        config = {"bootstrap.servers": bootstrap, "group.id": GROUP, "client.id": name,
                  "group.protocol": protocol, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False}
        if protocol == "classic":
            config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                           "partition.assignment.strategy": assignor})
        self.consumer = ck.Consumer(config)
        self.consumer.subscribe([TOPIC])
        self.done, self.lock = done, lock
        self.assigned: frozenset[int] = frozenset()
        self.committed = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msg = self.consumer.poll(0.1)
                self.assigned = frozenset(p.partition for p in self.consumer.assignment())
                if msg is None or msg.error() is not None:
                    continue
                try:
                    self.consumer.commit(message=msg, asynchronous=False)
                except ck.KafkaException as e:
                    # not committed: read it again (if the partition is still ours)
                    self.failed.append(e.args[0].name())
                    try:
                        self.consumer.seek(ck.TopicPartition(msg.topic(), msg.partition(),
                                                             msg.offset()))
                    except ck.KafkaException:
                        pass
                    continue
                with self.lock:
                    self.done.append(msg.value())
                self.committed += 1
        finally:
            self.consumer.close()     # leaves the group

    def close(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()


class Producer(threading.Thread):
    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.sent: list[bytes] = []
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            value = b"r%d" % len(self.sent)
            self.producer.produce(TOPIC, value, partition=len(self.sent) % 4)
            self.sent.append(value)
            self.producer.poll(0)
        assert self.producer.flush(30) == 0


def group_type(bootstrap: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([GROUP])[GROUP].result(30)
    return desc.type.name


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_a_classic_group_is_upgraded_and_downgraded_member_by_member(tmp_path, assignor):
    """The classic members revoke eagerly (range) or cooperatively (cooperative-sticky: they
    keep partitions across rejoins and revoke only what moves)."""
    with BrokerProcess(tmp_path, BROKER) as b:
        create_topic(b, TOPIC, 4)
        done: list[bytes] = []
        lock = threading.Lock()
        producer = Producer(b.bootstrap)
        members = {"a": Worker(b.bootstrap, "classic", "a-classic", done, lock, assignor),
                   "b": Worker(b.bootstrap, "classic", "b-classic", done, lock, assignor)}

        def sharing(what: str) -> None:
            """Both members own partitions and commit records."""
            marks = {n: w.committed for n, w in members.items()}
            eventually(lambda: all(w.assigned and w.committed > marks[n] + 5
                                   for n, w in members.items())
                       and not members["a"].assigned & members["b"].assigned,
                       what, timeout=TIMEOUT, interval=0.1,
                       report=lambda: str({n: (w.assigned, w.committed)
                                           for n, w in members.items()}))

        def restart(name: str, protocol: str) -> None:
            members[name].close()
            members[name] = Worker(b.bootstrap, protocol, f"{name}-{protocol}", done, lock,
                                   assignor)

        try:
            sharing("two classic members share the partitions")
            assert group_type(b.bootstrap) == "CLASSIC"
            restart("a", "consumer")
            sharing("a consumer-protocol member and a classic member share the partitions")
            assert group_type(b.bootstrap) == "CONSUMER"
            restart("b", "consumer")
            sharing("two consumer-protocol members share the partitions")
            restart("a", "classic")
            sharing("a classic member joined the consumer group")
            assert group_type(b.bootstrap) == "CONSUMER"
            restart("b", "classic")
            sharing("two classic members share the partitions again")
            assert group_type(b.bootstrap) == "CLASSIC"
        finally:
            producer.stop.set()
            producer.join(30)
            try:
                eventually(lambda: len(done) >= len(producer.sent),
                           "every record is consumed", timeout=TIMEOUT, interval=0.1,
                           report=lambda: f"{len(done)} of {len(producer.sent)}; failed commits: "
                           + str({n: w.failed for n, w in members.items()}))
            finally:
                for w in members.values():
                    w.close()
        assert len(producer.sent) > 50
        assert sorted(done) == sorted(producer.sent)     # each exactly once
        # the group went through the conversions, not through an empty group
        assert f"upgraded classic group {GROUP}" in b.output()
        assert f"downgraded consumer group {GROUP}" in b.output()
        assert not b.logged_errors()
