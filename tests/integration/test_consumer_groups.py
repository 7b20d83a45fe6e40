"""Consumer groups against a live Strata broker: unmodified Kafka clients subscribe, share
partitions, commit, and resume from their committed offsets, across a broker restart too."""

from __future__ import annotations

import time

import pytest

from broker_process import BrokerProcess

pytestmark = pytest.mark.slow

ck = pytest.importorskip("confluent_kafka")

# The tests' groups rebalance at once instead of waiting Kafka's default 3 s for more members.
NO_DELAY = {"group.initial.rebalance.delay.ms": "0"}
# Short heartbeats so that a member notices a rebalance quickly (Kafka's minimum session).
FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}


def assert_clean_log(b: BrokerProcess) -> None:
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path, overrides=NO_DELAY) as b:
        yield b
    assert_clean_log(b)


def produce(bootstrap: str, topic: str, records, partition: int | None = None) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, headers, ts in records:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=ts, **kwargs)
    assert producer.flush(30) == 0, "producer could not deliver everything"


def make_records(n: int, start: int = 0, tag: str = "r"):
    return [(f"{tag}-key-{i}".encode(), f"{tag}-value-{i}".encode() * (i % 3 + 1),
             [("seq", str(i).encode()), ("tag", tag.encode())], 1_700_000_000_000 + i)
            for i in range(start, start + n)]


def consumer(bootstrap: str, group: str, **extra):
    return ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                        "auto.offset.reset": "earliest", "enable.auto.commit": False,
                        **FAST_GROUP, **extra})


def poll_messages(c, count: int, timeout: float = 20.0) -> list:
    """Exactly ``count`` messages from ``c`` (fails with what arrived if they do not)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, \
            f"received {len(got)} of {count} messages within {timeout}s"
        msg = c.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    return got


def assert_nothing_more(c, wait: float = 1.0) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        msg = c.poll(0.2)
        assert msg is None or msg.error() is not None, \
            f"unexpected extra message at offset {msg.offset()} of partition {msg.partition()}"


def as_records(msgs) -> list:
    return [(m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in msgs]


def committed(c, topic: str, partitions=(0,)) -> list[int]:
    return [tp.offset for tp in c.committed([ck.TopicPartition(topic, p) for p in partitions],
                                            timeout=10)]


def test_subscribed_consumer_receives_everything_produced_and_commits(broker):
    sent = make_records(300)
    produce(broker.bootstrap, "events", sent)
    c = consumer(broker.bootstrap, "readers")
    try:
        c.subscribe(["events"])
        got = poll_messages(c, len(sent))
        assert as_records(got) == sent
        assert [m.offset() for m in got] == list(range(len(sent)))
        c.commit(asynchronous=False)
        assert committed(c, "events") == [len(sent)]
        assert_nothing_more(c, 0.5)
    finally:
        c.close()


def test_next_consumer_in_group_resumes_from_the_committed_offset(broker):
    produce(broker.bootstrap, "orders", make_records(100))
    first = consumer(broker.bootstrap, "billing")
    try:
        first.subscribe(["orders"])
        got = poll_messages(first, 40)
        assert [m.offset() for m in got] == list(range(40))
        first.commit(offsets=[ck.TopicPartition("orders", 0, 40)], asynchronous=False)
    finally:
        first.close()  # leaves the group; whatever it fetched beyond offset 40 was not committed

    produce(broker.bootstrap, "orders", make_records(50, start=100))
    second = consumer(broker.bootstrap, "billing")
    try:
        second.subscribe(["orders"])
        got = poll_messages(second, 110)
        assert [m.offset() for m in got] == list(range(40, 150)), "duplicates or gaps"
        assert as_records(got) == make_records(60, start=40) + make_records(50, start=100)
        assert_nothing_more(second)
    finally:
        second.close()


def test_two_consumers_in_one_group_split_four_partitions_and_read_everything_once(tmp_path):
    with BrokerProcess(tmp_path, overrides={**NO_DELAY, "num.partitions": "4"}) as b:
        # a producer's metadata request creates the topic (consumers do not auto-create)
        ck.Producer({"bootstrap.servers": b.bootstrap}).list_topics("clicks", timeout=10)
        members = [consumer(b.bootstrap, "splitters", **{"client.id": f"member-{i}"})
                   for i in range(2)]
        try:
            for c in members:
                c.subscribe(["clicks"])
            # Let the group settle with both members before anything is produced, so that no
            # partition changes hands (and is read again, nothing being committed) meanwhile.
            deadline = time.monotonic() + 30
            while True:
                assigned = [sorted(tp.partition for tp in c.assignment()) for c in members]
                if all(len(a) == 2 for a in assigned):
                    break
                assert time.monotonic() < deadline, f"group did not settle: assignments {assigned}"
                for c in members:
                    msg = c.poll(0.2)
                    assert msg is None or msg.error() is None, msg.error()
                    assert msg is None, "a message before anything was produced"
            assert sorted(assigned[0] + assigned[1]) == [0, 1, 2, 3]

            sent = {p: make_records(100, tag=f"p{p}") for p in range(4)}
            for p, records in sent.items():
                produce(b.bootstrap, "clicks", records, partition=p)
            got: list[list] = [[], []]
            deadline = time.monotonic() + 30
            while sum(map(len, got)) < 400:
                assert time.monotonic() < deadline, f"received {sum(map(len, got))} of 400"
                for i, c in enumerate(members):
                    msg = c.poll(0.1)
                    if msg is not None:
                        assert msg.error() is None, msg.error()
                        got[i].append(msg)
            for c in members:
                assert_nothing_more(c, 0.5)
            assert [sorted(tp.partition for tp in c.assignment()) for c in members] == assigned
        finally:
            for c in members:
                c.close()
    assert_clean_log(b)

    for i, msgs in enumerate(got):
        assert {m.partition() for m in msgs} <= set(assigned[i]), "read a partition it did not own"
    positions = [(m.partition(), m.offset()) for m in got[0] + got[1]]
    assert len(set(positions)) == 400, "a record was read twice"
    for p in range(4):
        records = sorted((m for m in got[0] + got[1] if m.partition() == p),
                         key=lambda m: m.offset())
        assert as_records(records) == sent[p]


def test_committed_offsets_survive_a_broker_restart(tmp_path):
    b = BrokerProcess(tmp_path, overrides=NO_DELAY).start()
    try:
        produce(b.bootstrap, "ledger", make_records(80))
        c = consumer(b.bootstrap, "auditors")
        try:
            c.subscribe(["ledger"])
            poll_messages(c, 80)
            c.commit(offsets=[ck.TopicPartition("ledger", 0, 70)], asynchronous=False)
        finally:
            c.close()

        b.stop()  # SIGTERM: a clean shutdown
        b.start()
        produce(b.bootstrap, "ledger", make_records(20, start=80))

        c = consumer(b.bootstrap, "auditors")
        try:
            assert committed(c, "ledger") == [70]
            c.subscribe(["ledger"])
            got = poll_messages(c, 30)
            assert [m.offset() for m in got] == list(range(70, 100))
            assert as_records(got) == make_records(30, start=70)
            assert_nothing_more(c, 0.5)
        finally:
            c.close()
    finally:
        b.stop()
    assert_clean_log(b)


def test_kafka_python_consumer_group_consumes_and_commits(broker):
    kafka = pytest.importorskip("kafka")
    sent = make_records(120)
    produce(broker.bootstrap, "metrics", sent)
    kc = kafka.KafkaConsumer("metrics", bootstrap_servers=broker.bootstrap, group_id="kp-group",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=300)
    try:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent):
            assert time.monotonic() < deadline, f"kafka-python received {len(got)} of {len(sent)}"
            for records in kc.poll(timeout_ms=500).values():
                got.extend(records)
        assert [(r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp) for r in got] == \
            [(k, v, h, ts) for k, v, h, ts in sent]
        kc.commit()
        tp = kafka.TopicPartition("metrics", 0)
        assert kc.committed(tp) == len(sent)
    finally:
        kc.close()

    # another client library sees the same committed offset for the group
    c = consumer(broker.bootstrap, "kp-group")
    try:
        assert committed(c, "metrics") == [len(sent)]
    finally:
        c.close()


def test_manually_assigned_consumer_commits_without_a_generation_and_reads_it_back(broker):
    produce(broker.bootstrap, "manual", make_records(30))
    c = consumer(broker.bootstrap, "manual-group")
    try:
        c.assign([ck.TopicPartition("manual", 0, 0)])
        got = poll_messages(c, 30)
        assert as_records(got) == make_records(30)
        # no JoinGroup happened: librdkafka commits with generation -1 and an empty member id
        c.commit(asynchronous=False)
        assert committed(c, "manual") == [30]
        c.commit(offsets=[ck.TopicPartition("manual", 0, 12)], asynchronous=False)
        assert committed(c, "manual") == [12]
    finally:
        c.close()


def test_admin_client_lists_and_describes_a_running_group(broker):
    from confluent_kafka.admin import AdminClient
    produce(broker.bootstrap, "audit", make_records(5))
    c = consumer(broker.bootstrap, "described", **{"client.id": "describer"})
    try:
        c.subscribe(["audit"])
        poll_messages(c, 5)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed = admin.list_consumer_groups(request_timeout=10).result(timeout=15)
        assert "described" in {g.group_id for g in listed.valid}
        desc = admin.describe_consumer_groups(["described"], request_timeout=10)["described"] \
            .result(timeout=15)
        assert desc.state.name == "STABLE"
        (member,) = desc.members
        assert member.client_id == "describer"
        assert member.host.lstrip("/") == "127.0.0.1"
        assert [(tp.topic, tp.partition) for tp in member.assignment.topic_partitions] == \
            [("audit", 0)]
    finally:
        c.close()


def test_sigterm_shuts_down_promptly_while_a_consumer_long_polls(tmp_path):
    import time
    ck = pytest.importorskip("confluent_kafka")
    broker = BrokerProcess(tmp_path, overrides={"group.initial.rebalance.delay.ms": "0"}).start()
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "idle",
                            "fetch.wait.max.ms": 5000})
    try:
        consumer.subscribe(["idle-topic"])
        for _ in range(20):
            consumer.poll(0.2)
        t0 = time.monotonic()
        assert broker.stop() == 0
        assert time.monotonic() - t0 < 5
    finally:
        consumer.close()
