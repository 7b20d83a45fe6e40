"""The pure-Python Kafka clients against a live Strata broker: kafka-python 3.x (idempotent by
default) and aiokafka produce records with keys, values, headers and explicit timestamps, read
them back unchanged through consumer groups and assigned partitions, commit and resume; and
kafka-python's admin client lists topics, describes the cluster and its groups."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker_process import BrokerProcess

pytestmark = pytest.mark.slow

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

from kafka import OffsetAndMetadata, TopicPartition  # noqa: E402
from kafka import codec as kafka_codec  # noqa: E402
from aiokafka.structs import TopicPartition as AioTopicPartition  # noqa: E402

PARTITIONS = 3
# Groups rebalance at once instead of waiting Kafka's default 3 s for more members; auto-created
# topics get several partitions, so that keys spread and offsets are per partition.
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0", "num.partitions": str(PARTITIONS)}
BASE_TS = 1_700_000_000_000
CREATE_TIME = 0  # timestamp_type of a record whose timestamp the producer chose
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # batch attributes, bits 0-2


def assert_clean_log(b: BrokerProcess) -> None:
    bad = b.logged_errors()
    assert not bad, "broker logged errors:\n" + "\n".join(bad)


@pytest.fixture
def broker(tmp_path):
    with BrokerProcess(tmp_path, overrides=BROKER_CONFIG) as b:
        yield b
    assert_clean_log(b)


def make_records(tag: str, n: int, *, null_header_values: bool = False) -> list[tuple]:
    """``n`` (key, value, headers, timestamp) tuples: null keys, null values, no headers, repeated
    and empty headers, timestamps out of order, and one value of 300 KB (a batch of its own)."""
    records = []
    for i in range(n):
        key = None if i % 10 == 3 else f"{tag}-key-{i}".encode()
        value = None if i % 10 == 5 else f"{tag}-value-{i}".encode() * (i % 4 + 1)
        if i == n // 2:
            value = bytes(range(256)) * 1200
        if i % 10 == 7:
            headers = []
        else:
            headers = [("seq", str(i).encode()), ("tag", tag.encode()), ("seq", b"")]
            if null_header_values and i % 3 == 0:
                headers.append(("null", None))
        records.append((key, value, headers, BASE_TS + (i * 37) % 101))
    return records


def assert_contiguous_from_zero(placed: dict) -> None:
    """Every partition's offsets run 0, 1, 2, ... (a fresh topic: no gaps, no duplicates)."""
    for p in range(PARTITIONS):
        offsets = sorted(o for q, o in placed if q == p)
        assert offsets == list(range(len(offsets))), f"partition {p} offsets {offsets}"


def counts_per_partition(placed: dict) -> dict[int, int]:
    return {p: sum(1 for q, _ in placed if q == p) for p in range(PARTITIONS)}


def stored_batches(b: BrokerProcess, topic: str) -> dict[int, list]:
    """The batch headers of each partition of ``topic``, read from its segment files."""
    return {p: [h for h, _ in stored_batches_and_records(b, topic, p)] for p in range(PARTITIONS)}


def stored_batches_and_records(b: BrokerProcess, topic: str, partition: int) -> list[tuple]:
    """(header, the bytes after the header) of each batch of ``topic``-``partition`` on disk."""
    from strata.protocol import records as rec
    batches = []
    for seg in sorted((b.data_dir / "kafka-logs" / f"{topic}-{partition}").glob("*.log")):
        data = seg.read_bytes()
        batches += [(h, data[h.position + rec.HEADER_SIZE:
                             h.position + rec.LOG_OVERHEAD + h.batch_length])
                    for h in rec.iter_headers(data)]
    return batches


def assert_written_idempotently(b: BrokerProcess, topic: str, placed: dict) -> None:
    """Every stored batch of ``topic`` carries one producer id and epoch, and sequence numbers
    that count the producer's records in each partition from 0."""
    batches = stored_batches(b, topic)
    headers = [h for hs in batches.values() for h in hs]
    assert sum(h.record_count for h in headers) == len(placed)
    assert {(h.producer_id, h.producer_epoch) for h in headers} == \
        {(headers[0].producer_id, headers[0].producer_epoch)}, "batches of several producers"
    assert headers[0].producer_id >= 0 and headers[0].producer_epoch >= 0, \
        f"not an idempotent producer: {headers[0]}"
    for p, hs in batches.items():
        # one producer on a fresh partition: its sequence numbers are the partition's offsets
        assert [(h.base_offset, h.base_sequence) for h in hs] == \
            [(h.base_offset, h.base_offset) for h in hs], f"partition {p} sequences"


# kafka-python ------------------------------------------------------------------------------------

def kp_produce(bootstrap: str, topic: str, records: list[tuple], partition: int | None = None,
               **config) -> dict:
    """Sends ``records`` with a kafka-python producer; returns {(partition, offset): record}."""
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        futures = [producer.send(topic, key=k, value=v, headers=h, timestamp_ms=ts,
                                 partition=partition)
                   for k, v, h, ts in records]
        producer.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    assert [m.timestamp for m in metas] == [r[3] for r in records]
    placed = {(m.partition, m.offset): r for m, r in zip(metas, records)}
    assert len(placed) == len(records), "two records acknowledged at one offset"
    return placed


def kp_consumer(bootstrap: str, group: str | None, **extra):
    return kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                               auto_offset_reset="earliest", enable_auto_commit=False, **extra)


def kp_poll(consumer, count: int, timeout: float = 30.0) -> list:
    """At least ``count`` records from ``consumer`` (fails with how many arrived if not).

    Each poll may block until the deadline (it returns as soon as records arrive): kafka-python
    3.0.12 drops the assignment of a join whose SyncGroup is still in flight when a short poll
    times out, and then never fetches (its need_rejoin() is already False)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        assert remaining_ms > 0, f"received {len(got)} of {count} records in {timeout}s"
        for records in consumer.poll(timeout_ms=remaining_ms).values():
            got.extend(records)
    return got


def kp_assert_nothing_more(consumer, wait: float = 1.0) -> None:
    deadline = time.monotonic() + wait
    while (remaining_ms := int((deadline - time.monotonic()) * 1000)) > 0:
        extra = [(r.partition, r.offset)
                 for rs in consumer.poll(timeout_ms=remaining_ms).values() for r in rs]
        assert not extra, f"unexpected extra records at {extra}"


def received(records) -> dict:
    """{(partition, offset): (key, value, headers, timestamp)} of consumed records, either client."""
    got = {}
    for r in records:
        assert r.timestamp_type == CREATE_TIME, f"timestamp type {r.timestamp_type} at {r.offset}"
        assert (r.partition, r.offset) not in got, f"offset {r.offset} of {r.partition} twice"
        got[(r.partition, r.offset)] = (r.key, r.value, [tuple(h) for h in r.headers], r.timestamp)
    return got


def test_kafka_python_default_producer_is_idempotent(broker):
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)
    assert producer.config["enable_idempotence"], "kafka-python 3.x enables idempotence by default"
    producer.close()
    placed = kp_produce(broker.bootstrap, "kp-idempotent", make_records("idem", 200))
    assert {p for p, _ in placed} == set(range(PARTITIONS))
    assert_contiguous_from_zero(placed)
    assert_written_idempotently(broker, "kp-idempotent", placed)


def test_kafka_python_group_consumer_reads_back_exactly_what_was_produced_and_commits(broker):
    placed = kp_produce(broker.bootstrap, "kp-roundtrip", make_records("rt", 120))
    consumer = kp_consumer(broker.bootstrap, "kp-readers")
    try:
        consumer.subscribe(["kp-roundtrip"])
        got = received(kp_poll(consumer, len(placed)))
        assert got == placed
        kp_assert_nothing_more(consumer, 0.5)
        tps = [TopicPartition("kp-roundtrip", p) for p in range(PARTITIONS)]
        assert consumer.assignment() == set(tps)
        consumer.commit()
        counts = counts_per_partition(placed)
        assert {tp.partition: consumer.committed(tp) for tp in tps} == counts
        assert {tp.partition: o for tp, o in consumer.end_offsets(tps).items()} == counts
    finally:
        consumer.close()


def test_kafka_python_next_group_member_resumes_from_the_committed_offsets(broker):
    topic, group = "kp-resume", "kp-billing"
    placed = kp_produce(broker.bootstrap, topic, make_records("first", 60))
    first = kp_consumer(broker.bootstrap, group)
    try:
        first.subscribe([topic])
        assert received(kp_poll(first, len(placed))) == placed
        # commit half of what was read, so that resuming from the commit differs from resuming
        # from the start (the reset policy) or from where this member stopped reading
        commit_at = {p: n // 2 for p, n in counts_per_partition(placed).items()}
        first.commit({TopicPartition(topic, p): OffsetAndMetadata(o, f"half of {p}", -1)
                      for p, o in commit_at.items()})
        assert {p: first.committed(TopicPartition(topic, p), metadata=True)[:2]
                for p in range(PARTITIONS)} == {p: (o, f"half of {p}") for p, o in commit_at.items()}
    finally:
        first.close()  # leaves the group

    placed.update(kp_produce(broker.bootstrap, topic, make_records("second", 30)))
    expected = {(p, o): r for (p, o), r in placed.items() if o >= commit_at[p]}
    second = kp_consumer(broker.bootstrap, group)
    try:
        second.subscribe([topic])
        assert received(kp_poll(second, len(expected))) == expected, "duplicates or gaps"
        kp_assert_nothing_more(second)
    finally:
        second.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_compressed_producer_round_trips_and_the_broker_keeps_its_codec(broker, codec):
    topic = f"kp-{codec}"
    placed = kp_produce(broker.bootstrap, topic, make_records(codec, 150),
                        compression_type=codec, linger_ms=5)
    assert_contiguous_from_zero(placed)
    assert_written_idempotently(broker, topic, placed)
    # compression.type=producer (the default): the batches are stored as the producer wrote them.
    # kafka-python sends a batch uncompressed when compressing would not shrink it (a lone small
    # record, drained early); those batches must be exactly such batches.
    encode = getattr(kafka_codec, f"{codec}_encode")
    stored = [(p, h, body) for p in range(PARTITIONS)
              for h, body in stored_batches_and_records(broker, topic, p)]
    assert {h.attributes & 0x7 for _, h, _ in stored} <= {0, CODEC_IDS[codec]}
    assert any(h.attributes & 0x7 == CODEC_IDS[codec] for _, h, _ in stored)
    for p, h, body in stored:
        if h.attributes & 0x7 == 0:
            assert len(encode(body)) >= len(body), \
                f"batch at offset {h.base_offset} of partition {p} stored uncompressed"
    consumer = kp_consumer(broker.bootstrap, f"kp-{codec}-readers")
    try:
        consumer.subscribe([topic])
        assert received(kp_poll(consumer, len(placed))) == placed
        kp_assert_nothing_more(consumer, 0.5)
    finally:
        consumer.close()


def test_kafka_python_consumer_finds_offsets_by_timestamp(broker):
    records = [(b"k%d" % i, b"v%d" % i, [], BASE_TS + 10 * i) for i in range(20)]
    placed = kp_produce(broker.bootstrap, "kp-times", records, partition=0)
    assert sorted(placed) == [(0, i) for i in range(20)]
    consumer = kp_consumer(broker.bootstrap, None)
    try:
        tp = TopicPartition("kp-times", 0)
        found = consumer.offsets_for_times({tp: BASE_TS + 55})[tp]
        assert (found.offset, found.timestamp) == (6, BASE_TS + 60)
        assert consumer.offsets_for_times({tp: BASE_TS + 1000}) == {tp: None}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 20}
    finally:
        consumer.close()


def test_kafka_python_consumer_seeking_into_a_compressed_batch_starts_at_that_offset(broker):
    records = [(b"k%d" % i, b"v%d" % i * 20, [("i", b"%d" % i)], BASE_TS + i) for i in range(50)]
    placed = kp_produce(broker.bootstrap, "kp-mid-batch", records, partition=0,
                        compression_type="lz4", linger_ms=1000)
    batches = stored_batches(broker, "kp-mid-batch")[0]
    # offset 23 lies inside a stored compressed batch (the broker answers with the whole batch)
    assert any(h.base_offset < 23 <= h.base_offset + h.last_offset_delta and h.attributes & 0x7
               for h in batches), batches
    consumer = kp_consumer(broker.bootstrap, None)
    try:
        tp = TopicPartition("kp-mid-batch", 0)
        consumer.assign([tp])
        consumer.seek(tp, 23)
        got = kp_poll(consumer, 27)
        assert [r.offset for r in got] == list(range(23, 50))
        assert received(got) == {k: r for k, r in placed.items() if k[1] >= 23}
    finally:
        consumer.close()


def test_kafka_python_consumer_with_a_tiny_fetch_size_still_receives_a_larger_record(broker):
    # KIP-74: a fetch returns the first batch whole even when it exceeds the requested maximum
    records = [(b"small", b"s", [], BASE_TS), (b"large", bytes(range(256)) * 400, [], BASE_TS + 1),
               (b"after", b"a", [], BASE_TS + 2)]
    placed = kp_produce(broker.bootstrap, "kp-tiny-fetch", records, partition=0, linger_ms=0)
    consumer = kp_consumer(broker.bootstrap, None, max_partition_fetch_bytes=1024,
                           fetch_max_bytes=1024)
    try:
        consumer.assign([TopicPartition("kp-tiny-fetch", 0)])
        assert received(kp_poll(consumer, 3)) == placed
    finally:
        consumer.close()


# aiokafka ----------------------------------------------------------------------------------------

def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def aio_poll(consumer, count: int, timeout: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} records in {timeout}s"
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got.extend(records)
    return got


async def aio_assert_nothing_more(consumer, wait: float = 1.0) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        extra = [(r.partition, r.offset)
                 for rs in (await consumer.getmany(timeout_ms=200)).values() for r in rs]
        assert not extra, f"unexpected extra records at {extra}"


async def aio_send_each_and_wait(bootstrap: str, topic: str, records: list[tuple], **config) -> dict:
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        placed = {}
        for k, v, h, ts in records:
            meta = await producer.send_and_wait(topic, key=k, value=v, headers=h, timestamp_ms=ts)
            assert meta.timestamp == ts
            assert (meta.partition, meta.offset) not in placed
            placed[(meta.partition, meta.offset)] = (k, v, h, ts)
    finally:
        await producer.stop()
    return placed


def test_aiokafka_idempotent_producer_and_group_consumer_round_trip_and_commit(broker):
    topic, group = "aio-roundtrip", "aio-readers"
    records = make_records("aio", 40, null_header_values=True)
    tps = [AioTopicPartition(topic, p) for p in range(PARTITIONS)]

    async def scenario():
        placed = await aio_send_each_and_wait(broker.bootstrap, topic, records,
                                              enable_idempotence=True)
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                                             group_id=group, auto_offset_reset="earliest",
                                             enable_auto_commit=False)
        await consumer.start()
        try:
            got = received(await aio_poll(consumer, len(records)))
            await aio_assert_nothing_more(consumer, 0.5)
            assert consumer.assignment() == set(tps)
            await consumer.commit()
            committed = {tp.partition: await consumer.committed(tp) for tp in tps}
        finally:
            await consumer.stop()
        # a new consumer of the group (not subscribed) reads the same commits from the broker
        reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group,
                                           enable_auto_commit=False)
        await reader.start()
        try:
            committed_again = {tp.partition: await reader.committed(tp) for tp in tps}
        finally:
            await reader.stop()
        return placed, got, committed, committed_again

    placed, got, committed, committed_again = run(scenario())
    assert {p for p, _ in placed} == set(range(PARTITIONS))
    assert_contiguous_from_zero(placed)
    assert_written_idempotently(broker, topic, placed)
    assert got == placed
    assert committed == committed_again == counts_per_partition(placed)


def test_aiokafka_assigned_consumer_seeks_to_beginning_and_reads_every_partition(broker):
    topic = "aio-seek"
    records = make_records("seek", 45)
    tps = [AioTopicPartition(topic, p) for p in range(PARTITIONS)]

    async def scenario():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        await producer.start()
        try:  # queued together: several records to a batch
            futures = [await producer.send(topic, key=k, value=v, headers=h, timestamp_ms=ts)
                       for k, v, h, ts in records]
            metas = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        placed = {(m.partition, m.offset): r for m, r in zip(metas, records)}

        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap,
                                             enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.seek_to_end(*tps)
            at_end = {tp: await consumer.position(tp) for tp in tps}
            await aio_assert_nothing_more(consumer, 0.5)
            await consumer.seek_to_beginning(*tps)
            at_start = {tp: await consumer.position(tp) for tp in tps}
            got = received(await aio_poll(consumer, len(records)))
            await aio_assert_nothing_more(consumer, 0.5)
            after = {tp: await consumer.position(tp) for tp in tps}
            starts = await consumer.beginning_offsets(tps)
        finally:
            await consumer.stop()
        return placed, ends, at_end, at_start, got, after, starts

    placed, ends, at_end, at_start, got, after, starts = run(scenario())
    assert len(placed) == len(records)
    assert_contiguous_from_zero(placed)
    counts = counts_per_partition(placed)
    assert {tp.partition: o for tp, o in ends.items()} == counts
    assert at_end == after == ends
    assert at_start == starts == {tp: 0 for tp in tps}
    assert got == placed


# kafka-python admin client -----------------------------------------------------------------------

def read_properties(path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_kafka_python_admin_lists_topics_and_describes_the_cluster(broker):
    kp_produce(broker.bootstrap, "admin-visible", make_records("adm", 5))
    meta = read_properties(broker.data_dir / "kafka-logs" / "meta.properties")
    node_id = int(meta["node.id"])
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        cluster = admin.describe_cluster()
        (visible,) = admin.describe_topics(["admin-visible"])
        # the admin client's metadata requests do not create topics
        (absent,) = admin.describe_topics(["admin-absent"])
        topics = admin.list_topics()
    finally:
        admin.close()

    assert cluster["cluster_id"] == meta["cluster.id"]
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == \
        [(node_id, "127.0.0.1", broker.port)]
    assert cluster["controller_id"] == node_id
    # no authorizer: every operation a cluster or topic supports is allowed (as Kafka answers)
    assert sorted(cluster["authorized_operations"]) == sorted(
        ["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS",
         "IDEMPOTENT_WRITE"])
    assert sorted(visible["authorized_operations"]) == sorted(
        ["ALTER", "ALTER_CONFIGS", "CREATE", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ",
         "WRITE"])
    assert (visible["error_code"], visible["name"], visible["is_internal"]) == \
        (0, "admin-visible", False)
    assert [(p["partition_index"], p["error_code"], p["leader_id"], p["replica_nodes"],
             p["isr_nodes"]) for p in visible["partitions"]] == \
        [(p, 0, node_id, [node_id], [node_id]) for p in range(PARTITIONS)]
    assert (absent["name"], absent["error_code"], absent["partitions"]) == \
        ("admin-absent", kafka.errors.UnknownTopicOrPartitionError.errno, [])
    assert "admin-visible" in topics and "admin-absent" not in topics


def test_kafka_python_admin_describes_a_group_and_lists_its_committed_offsets(broker):
    topic, group = "admin-group-topic", "admin-group"
    placed = kp_produce(broker.bootstrap, topic, make_records("grp", 30))
    consumer = kp_consumer(broker.bootstrap, group, client_id="admin-test-member")
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        consumer.subscribe([topic])
        kp_poll(consumer, len(placed))
        commits = {TopicPartition(topic, p): OffsetAndMetadata(n, f"meta-{p}", -1)
                   for p, n in counts_per_partition(placed).items()}
        consumer.commit(commits)
        stable = admin.describe_groups([group])[group]
        consumer.close()  # leaves the group
        empty = admin.describe_groups([group])[group]
        listed = [g for g in admin.list_groups() if g["group_id"] == group]
        offsets = admin.list_group_offsets(group)
    finally:
        consumer.close()  # again, if something failed before
        admin.close()

    assert (stable["error"], stable["group_state"], stable["protocol_type"],
            stable["protocol_data"]) == (None, "Stable", "consumer", "range")
    assert sorted(stable["authorized_operations"]) == ["DELETE", "DESCRIBE", "READ"]
    (member,) = stable["members"]
    assert member["client_id"] == "admin-test-member"
    assert member["member_metadata"]["topics"] == [topic]
    assert member["member_assignment"]["assigned_partitions"] == \
        [{"topic": topic, "partitions": list(range(PARTITIONS))}]
    assert (empty["error"], empty["group_state"], empty["members"]) == (None, "Empty", [])
    assert [(g["protocol_type"], g["group_state"]) for g in listed] == [("consumer", "Empty")]
    assert {tp: (om.offset, om.metadata) for tp, om in offsets[group].items()} == \
        {tp: (om.offset, om.metadata) for tp, om in commits.items()}
