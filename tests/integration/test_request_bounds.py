"""What one request may make the broker do is bounded: a CreateTopics or CreatePartitions that
would write more than Kafka's 10,000 controller records, or pass ``max.broker.partitions``, is
refused whole (POLICY_VIOLATION) before anything is written, and the broker serves other
connections while a large request is being carried out."""

from __future__ import annotations

import datetime
import select

import pytest

from broker_process import BrokerProcess
from strata.net.connection import Connection
from strata.protocol.client import client_frame, framed
from strata.protocol.codec import ApiKey, request_class, response_class

POLICY_VIOLATION = 44


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path, overrides={"max.broker.partitions": "5000",
                                            "num.partitions": "1"}) as b:
        yield b


def _partition_dirs(broker, topic: str) -> list:
    return sorted((broker.data_dir / "kafka-logs").glob(f"{topic}-*"))


def _create_topics_body(topics: list[tuple[str, int]], version: int = 7):
    cls = request_class(ApiKey.CREATE_TOPICS, version)
    topic_cls = cls.__dataclass_fields__["topics"].type.__args__[0]
    return cls(topics=tuple(topic_cls(name=name, num_partitions=n, replication_factor=1,
                                      assignments=(), configs=()) for name, n in topics),
               timeout=datetime.timedelta(seconds=30), validate_only=False)


def test_create_topics_of_sixteen_million_partitions_is_refused_and_creates_nothing(broker):
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewTopic
    from kafka.errors import PolicyViolationError
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        with pytest.raises(PolicyViolationError, match="excessively large batch"):
            admin.create_topics([NewTopic("huge", 16_777_220, 1)])
        assert "huge" not in admin.list_topics()
    finally:
        admin.close()
    assert _partition_dirs(broker, "huge") == []


def test_a_request_whose_topics_together_pass_ten_thousand_records_is_refused_whole(broker):
    # 3 topics of 3,500 partitions: each alone fits, together they do not
    with Connection(broker.bootstrap) as conn:
        resp = conn.request(_create_topics_body([(f"part{i}", 3500) for i in range(3)]),
                            response_class(ApiKey.CREATE_TOPICS, 7))
    assert [(t.name, int(t.error_code)) for t in resp.topics] == \
        [(f"part{i}", POLICY_VIOLATION) for i in range(3)]
    assert all(_partition_dirs(broker, f"part{i}") == [] for i in range(3))


def test_partitions_beyond_max_broker_partitions_are_refused_before_anything_is_written(broker):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("fits", 4000, 1)], operation_timeout=60)["fits"].result(60)
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic("over", 2000, 1)])["over"].result(60)
    assert refused.value.args[0].code() == POLICY_VIOLATION
    assert "max.broker.partitions=5000" in refused.value.args[0].str()
    with pytest.raises(KafkaException) as grown:
        admin.create_partitions([NewPartitions("fits", 6000)])["fits"].result(60)
    assert grown.value.args[0].code() == POLICY_VIOLATION
    topics = admin.list_topics(timeout=30).topics
    assert "over" not in topics and len(topics["fits"].partitions) == 4000
    assert _partition_dirs(broker, "over") == []


def test_other_connections_are_served_while_a_large_create_topics_runs(broker):
    """3,000 partitions take the broker seconds to open; a Metadata request sent after the
    CreateTopics, on another connection, is answered before it."""
    with Connection(broker.bootstrap, timeout=60) as creating, \
            Connection(broker.bootstrap, timeout=60) as other:
        creating.sock.sendall(framed(client_frame(_create_topics_body([("wide", 3000)]), 1)))
        metadata = request_class(ApiKey.METADATA, 12)(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        answer = other.request(metadata, response_class(ApiKey.METADATA, 12))
        readable, _, _ = select.select([creating.sock], [], [], 0)
        assert not readable, "the CreateTopics answer came before the other connection's"
        assert answer.brokers
        creating.sock.settimeout(120)
        assert creating.sock.recv(4)  # the CreateTopics answer does come
    assert len(_partition_dirs(broker, "wide")) == 3000


def test_a_fetch_asking_for_two_gibibytes_gets_at_most_the_brokers_fetch_max_bytes(tmp_path):
    import dataclasses
    from confluent_kafka import Producer
    from kio.schema.fetch.v12.response import FetchResponse
    from strata.protocol.client import fetch_request
    with BrokerProcess(tmp_path, overrides={"fetch.max.bytes": "100000"}) as b:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "batch.size": 20_000})
        for i in range(100):
            p.produce("wide-fetch", value=bytes(10_000), partition=0)
        assert p.flush(30) == 0
        req = dataclasses.replace(fetch_request("wide-fetch", 0, 0, partition_max_bytes=2**31 - 1),
                                  max_bytes=2**31 - 1)
        with Connection(b.bootstrap) as conn:
            resp = conn.request(req, FetchResponse)
    records = resp.responses[0].partitions[0].records
    assert 0 < len(records) <= 100_000


def test_other_connections_are_served_while_a_large_produce_is_appended(tmp_path):
    """A Produce of 40 partitions with a 1 MB batch of tiny records each keeps the broker busy
    for a while; a Metadata request sent after it, on another connection, is answered first."""
    from strata.protocol.records import SimpleRecord, build_batch
    batch = build_batch([SimpleRecord(b"v", None, (), 1_700_000_000_000)] * 100_000)
    assert len(batch) < 1_000_000
    cls = request_class(ApiKey.PRODUCE, 9)
    topic_cls = cls.__dataclass_fields__["topic_data"].type.__args__[0]
    part_cls = topic_cls.__dataclass_fields__["partition_data"].type.__args__[0]
    from kio.static.primitive import Records
    body = cls(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30),
               topic_data=(topic_cls(name="many", partition_data=tuple(
                   part_cls(index=p, records=Records(batch)) for p in range(40))),))
    with BrokerProcess(tmp_path, overrides={"num.partitions": "40",
                                            "socket.request.max.bytes": str(64 << 20)}) as b:
        with Connection(b.bootstrap, timeout=60) as producing, \
                Connection(b.bootstrap, timeout=60) as other:
            metadata = request_class(ApiKey.METADATA, 12)
            topic = metadata.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
            other.request(metadata(topics=(topic(name="many", topic_id=None),),
                                   allow_auto_topic_creation=True,
                                   include_topic_authorized_operations=False),
                          response_class(ApiKey.METADATA, 12))
            producing.sock.sendall(framed(client_frame(body, 1)))
            other.request(request_class(ApiKey.API_VERSIONS, 3)(
                client_software_name="t", client_software_version="1"),
                response_class(ApiKey.API_VERSIONS, 3))
            readable, _, _ = select.select([producing.sock], [], [], 0)
            assert not readable, "the Produce answer came before the other connection's"
            producing.sock.settimeout(120)
            assert producing.sock.recv(4)  # the Produce answer does come
