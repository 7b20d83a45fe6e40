"""Topic creation on three broker processes and ZooKeeper (issue 50) never stalls a broker:
librdkafka producing to many topics at once auto-creates them all through Metadata, and no
client request of it times out nor does any broker's event-loop watchdog report a stall; and a
CreateTopics with a 1 ms timeout answers REQUEST_TIMED_OUT for each topic while the topics
are still created."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import NewTopic

from cluster_clients import NO_TIERING, admin, wait_for
from cluster_process import StrataCluster
from zk_server import zookeeper_available

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

TOPICS = 40
STALL = "stalled:"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("creation"), brokers=3, overrides={
            **NO_TIERING, "num.partitions": "3", "default.replication.factor": "3",
            "offsets.topic.num.partitions": "1"}) as c:
        yield c


class Lines(logging.Handler):
    """Keeps every record's message (librdkafka's logs: a request timeout is one)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def all_created(client, names, partitions: int) -> bool:
    md = client.list_topics(timeout=10)
    return all((t := md.topics.get(n)) is not None and t.error is None
               and len(t.partitions) == partitions
               and all(p.leader >= 0 for p in t.partitions.values()) for n in names)


def test_librdkafka_auto_creating_many_topics_at_once_sees_no_timeout_and_no_stall(cluster):
    names = [f"auto-{i}" for i in range(TOPICS)]
    logs = Lines()
    rd_logger = logging.getLogger(f"{__name__}.rdkafka")
    rd_logger.propagate = False
    rd_logger.addHandler(logs)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                         "socket.timeout.ms": 10_000, "message.timeout.ms": 120_000},
                        logger=rd_logger)
    errors: list[str] = []
    for name in names:
        producer.produce(name, b"v", on_delivery=lambda err, _m: err and errors.append(str(err)))
    assert producer.flush(120) == 0
    assert errors == []
    wait_for("every topic created at RF 3", lambda: all_created(admin(cluster.bootstrap), names, 3))
    del producer
    assert [line for line in logs.lines if "timed out" in line.lower()] == []
    stalls = {b.node_id: [line for line in b.output().splitlines() if STALL in line]
              for b in cluster.brokers}
    assert stalls == {1: [], 2: [], 3: []}


def test_create_topics_with_a_tiny_timeout_answers_request_timed_out_and_creates(cluster):
    client = admin(cluster.bootstrap)
    names = [f"tiny-{i}" for i in range(10)]
    futures = client.create_topics([NewTopic(n, 4, 3) for n in names], operation_timeout=0.001,
                                   request_timeout=30)
    codes = {}
    for name, future in futures.items():
        with pytest.raises(KafkaException) as caught:
            future.result()
        codes[name] = caught.value.args[0].name()
    assert codes == dict.fromkeys(names, "REQUEST_TIMED_OUT")
    wait_for("the timed-out topics created", lambda: all_created(client, names, 4))
