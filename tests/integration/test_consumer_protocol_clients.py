"""KIP-848 consumer groups with real clients: Kafka's Java consumer (4.4, the jars of
``make kafka-dist``) and confluent-kafka
(librdkafka 2.6+) with ``group.protocol=consumer`` share a topic's partitions through
ConsumerGroupHeartbeat, commit with their member epochs, take over a leaving member's
partitions (one member static, subscribed by a regex the broker evaluates), and
``kafka-consumer-groups`` describes the group; after a broker restart the group is back with
its members' epochs.

``java/ConsumerProtocolClient.java`` runs in java's source-file mode and prints its assignment
whenever it changes; the test drives it through stdin.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from broker_process import BrokerProcess
from kafka_tools import (
    CONSUMER_GROUPS, dump_log_segments, kafka_java_command, require_kafka_dist, run_kafka_class)
from support.waiting import eventually
from test_consumer_groups import make_records, produce

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

CLIENT = Path(__file__).parent / "java" / "ConsumerProtocolClient.java"
# heartbeats every second so that reconciliation takes seconds, not tens of them
BROKER = {"group.initial.rebalance.delay.ms": "0", "offsets.topic.num.partitions": "1",
          "group.consumer.min.heartbeat.interval.ms": "500",
          "group.consumer.heartbeat.interval.ms": "1000",
          "group.consumer.min.session.timeout.ms": "6000",
          "group.consumer.session.timeout.ms": "10000"}
TIMEOUT = 60


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("kip848"), BROKER) as b:
        yield b
        assert not b.logged_errors()


def create_topic(b: BrokerProcess, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


class JavaConsumer:
    """A running ConsumerProtocolClient: its latest assignment and record count."""

    def __init__(self, b: BrokerProcess, group: str, topic: str, client_id: str,
                 *instance_id: str):
        self.client_id = client_id
        self.proc = subprocess.Popen(
            kafka_java_command(str(CLIENT), b.bootstrap, group, topic, client_id, *instance_id),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.assignment: frozenset[str] | None = None
        self.consumed = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("ASSIGNMENT"):
                parts = line[len("ASSIGNMENT"):].strip()
                self.assignment = frozenset(parts.split(",")) if parts else frozenset()
            elif line.startswith("CONSUMED "):
                self.consumed = int(line.split()[1])

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def commit(self) -> None:
        before = self.lines.count("COMMITTED")
        self.send("commit")
        eventually(lambda: self.lines.count("COMMITTED") > before, f"{self.client_id} commits",
                   timeout=TIMEOUT, report=self.report)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)

    def report(self) -> str:
        return f"{self.client_id}: " + "\n".join(self.lines[-40:])


def consumer_groups(b: BrokerProcess, *args: str) -> str:
    result = run_kafka_class(CONSUMER_GROUPS, "--bootstrap-server", b.bootstrap, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def partitions_of(topic: str, n: int) -> frozenset[str]:
    return frozenset(f"{topic}-{p}" for p in range(n))


def test_java_consumers_share_partitions_commit_and_take_over_a_leaving_members(broker):
    require_kafka_dist()
    topic, group = "kip848-java", "kip848-java-group"
    create_topic(broker, topic, 4)
    everything = partitions_of(topic, 4)
    a = JavaConsumer(broker, group, topic, "java-a")
    b = None
    try:
        eventually(lambda: a.assignment == everything, "the first member gets every partition",
                   timeout=TIMEOUT, report=a.report)
        # the second member is static and subscribes by a regex the broker evaluates
        b = JavaConsumer(broker, group, "regex:kip848-j.*", "java-b", "static-b")

        def shared() -> bool:
            return (a.assignment is not None and b.assignment is not None
                    and len(a.assignment) == len(b.assignment) == 2
                    and a.assignment | b.assignment == everything)
        eventually(shared, "the two members share the partitions", timeout=TIMEOUT,
                   report=lambda: a.report() + "\n" + b.report())
        # produced now, each record is read once, by the member that owns its partition
        produce(broker.bootstrap, topic, make_records(40))
        eventually(lambda: a.consumed + b.consumed >= 40, "every record consumed",
                   timeout=TIMEOUT, report=lambda: a.report() + "\n" + b.report())
        a.commit()
        b.commit()

        out = consumer_groups(broker, "--describe", "--group", group)
        rows = [line.split() for line in out.splitlines() if topic in line]
        assert len(rows) == 4, out
        assert sum(int(r[3]) for r in rows) == 40, out      # CURRENT-OFFSET per partition
        assert {"java-a", "java-b"} <= set(out.split()), out
        members = consumer_groups(broker, "--describe", "--members", "--group", group)
        assert {"java-a", "java-b"} <= set(members.split()), members
        state = consumer_groups(broker, "--describe", "--state", "--group", group)
        assert "Stable" in state and "uniform" in state, state

        a.close()
        assert a.proc.returncode == 0 and "CLOSED" in a.lines, a.report()
        eventually(lambda: b.assignment == everything,
                   "the remaining member takes the leaver's partitions", timeout=TIMEOUT,
                   report=b.report)
        members = consumer_groups(broker, "--describe", "--members", "--group", group)
        assert "java-a" not in members.split() and "java-b" in members.split(), members
    finally:
        a.close()
        if b is not None:
            b.close()
    assert b.proc.returncode == 0, b.report()
    # a static member that closes leaves for now (epoch -2): it stays, with its partitions,
    # until its session ends
    members = consumer_groups(broker, "--describe", "--members", "--verbose", "--group", group)
    assert "static-b" in members.split(), members
    listed = consumer_groups(broker, "--list", "--type", "consumer")
    assert group in listed.split(), listed


def test_confluent_kafka_consumers_use_the_consumer_protocol(broker):
    topic, group = "kip848-rdkafka", "kip848-rdkafka-group"
    create_topic(broker, topic, 4)
    produce(broker.bootstrap, topic, make_records(20))
    config = {"bootstrap.servers": broker.bootstrap, "group.id": group,
              "group.protocol": "consumer", "auto.offset.reset": "earliest",
              "enable.auto.commit": False}
    first = ck.Consumer({**config, "client.id": "rd-a"})
    second = ck.Consumer({**config, "client.id": "rd-b"})
    got: list = []
    try:
        first.subscribe([topic])
        second.subscribe([topic])

        def poll_both() -> bool:
            for c in (first, second):
                msg = c.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(msg)
            a = {p.partition for p in first.assignment()}
            b = {p.partition for p in second.assignment()}
            return len(got) >= 20 and len(a) == len(b) == 2 and not a & b
        eventually(poll_both, "two librdkafka members share the partitions and read everything",
                   timeout=TIMEOUT, interval=0)
        assert sorted(m.value() for m in got) == sorted(r[1] for r in make_records(20))
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
        first.close()

        def taken_over() -> bool:
            second.poll(0.2)
            return len(second.assignment()) == 4
        eventually(taken_over, "the remaining member takes every partition", timeout=TIMEOUT,
                   interval=0)
        offsets = second.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=30)
        assert sum(tp.offset for tp in offsets) == 20
    finally:
        second.close()


def test_a_restarted_broker_resumes_the_consumer_group(tmp_path):
    """Members' epochs and assignments come back from __consumer_offsets, whose records Kafka's
    own DumpLogSegments decodes as ConsumerGroup* records."""
    require_kafka_dist()
    topic, group = "kip848-restart", "kip848-restart-group"
    with BrokerProcess(tmp_path, BROKER) as b:
        create_topic(b, topic, 2)
        c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
        try:
            c.subscribe([topic])
            eventually(lambda: c.poll(0.2) is None and len(c.assignment()) == 2,
                       "the member is assigned both partitions", timeout=TIMEOUT, interval=0)
            before = describe(b, group)
            b.stop()
            b.start()
            after = describe(b, group)
            assert after == before
            # the member carries on in its epoch: its next heartbeats are accepted
            eventually(lambda: c.poll(0.2) is None and len(c.assignment()) == 2,
                       "the member keeps its partitions", timeout=TIMEOUT, interval=0)
            assert describe(b, group) == before
        finally:
            c.close()
    [segment] = tmp_path.glob("**/__consumer_offsets-*/00000000000000000000.log")
    out = dump_log_segments(segment, print_data=True, extra_args=["--offsets-decoder"])
    keys = [json.loads(k) for k in re.findall(r" key: (\{.*?\}) payload:", out)]
    types = {k["type"] for k in keys if k["data"].get("groupId") == group}
    # group epoch, member metadata, target assignment (metadata, member), current assignment
    assert {"3", "5", "6", "7", "8"} <= types, out


def describe(b: BrokerProcess, group: str) -> tuple:
    """(state, [(member id, partitions)]) as the admin client describes the group."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    [desc] = admin.describe_consumer_groups([group])[group].result(30),
    return (str(desc.state), sorted((m.member_id, sorted(tp.partition for tp in
                                                        m.assignment.topic_partitions))
                                    for m in desc.members))
