"""AlterPartition (API key 56), both ends.

The sender (``AlterPartitionManager``) talks to a fake controller connection that takes the
request as bytes (encoded as a client would, parsed by the broker's codec) and answers with a
scripted response, so what it sends is valid on the wire. The handler is driven through the
Dispatcher with bytes both ways, over a fake metadata, the one-broker ``ClusterMetadata``, and
``ZkClusterMetadata`` over a controller that runs the real ``controller_logic``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import uuid
import pytest
from kio.serial import entity_reader

from strata.cluster import controller_logic
from strata.cluster.controller_events import AlterPartition, AlterPartitions
from strata.cluster.image import (
    BrokerRegistration, MetadataImage, PartitionRegistration, TopicImage, frozen_map)
from strata.cluster.metadata import AlterPartitionItemResult, ClusterMetadata
from strata.cluster.zk_metadata import ZkClusterMetadata
from strata.cluster.zk.session_lease import ZkSessionLease
from strata.common.backoff import ExponentialBackoff
from strata.common.clock import MockClock
from strata.common.errors import ErrorCode, KafkaError
from strata.common.types import TopicPartition
from strata.protocol.codec import (
    API_VERSIONS, ApiKey, encode_response, make, parse_request, request_class, response_class)
from strata.replication.alter_partition import AlterPartitionManager
from strata.cluster.image import PartitionState
from strata.server.context import BrokerContext
from strata.server.dispatch import Dispatcher, advertised_versions
from strata.server.network import ConnectionInfo
from support.waiting import eventually
from wire import client_frame

PEER = ConnectionInfo("10.1.2.3:50123", 1)
TOPIC_ID = uuid.UUID("11111111-2222-3333-4444-555555555555")
OTHER_ID = uuid.UUID("66666666-7777-8888-9999-aaaaaaaaaaaa")
IDS = {"t": TOPIC_ID, "u": OTHER_ID}
DEADLINE_S = 10


# ---- the sender -----------------------------------------------------------------------------

class FakeController:
    """Connections to a scripted controller. ``answer(request, target)`` returns the response
    (or raises); every request is recorded as the broker decodes it, with its target."""

    def __init__(self, answer=None):
        self.answer = answer or self.accept_all
        self.requests: list = []  # (target, decoded request body)
        self.connects: list = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.refuse_connects = 0

    def connect(self, host, port):
        self.connects.append((host, port))
        if self.refuse_connects:
            self.refuse_connects -= 1
            raise ConnectionRefusedError(f"{host}:{port} refused")
        return _FakeConnection(self, (host, port))

    @staticmethod
    def accept_all(request, target):
        """Every proposal accepted: leader 1, the proposed ISR, partition epoch + 1."""
        return response(request, {
            (t.topic_id, p.partition_index): dict(
                leader_id=request.broker_id, leader_epoch=p.leader_epoch, isr=isr_of(p),
                partition_epoch=p.partition_epoch + 1, leader_recovery_state=p.leader_recovery_state)
            for t in request.topics for p in t.partitions})


class _FakeConnection:
    def __init__(self, controller: FakeController, target):
        self.controller = controller
        self.target = target
        self.closed = False

    def request(self, body, response_cls):
        c = self.controller
        decoded = parse_request(client_frame(body)).body  # what the controller would read
        with c.lock:
            c.in_flight += 1
            c.max_in_flight = max(c.max_in_flight, c.in_flight)
            c.requests.append((self.target, decoded))
        try:
            answer = c.answer(decoded, self.target)
        finally:
            with c.lock:
                c.in_flight -= 1
        return answer

    def close(self):
        self.closed = True


def isr_of(p) -> tuple[int, ...]:
    if hasattr(p, "new_isr_with_epochs"):
        return tuple(m.broker_id for m in p.new_isr_with_epochs)
    return tuple(p.new_isr)


def response(request, partitions: dict, error_code=ErrorCode.NONE):
    """An AlterPartition response of the request's version: ``partitions`` maps (topic id,
    partition) to fields (``error_code`` alone for an error); those absent are left out."""
    rc = response_class(ApiKey.ALTER_PARTITION, request.__version__)
    topics: dict = {}
    for (tid, p), fields in partitions.items():
        topics.setdefault(tid, []).append(make(rc, "topics.partitions", partition_index=p, **fields))
    return make(rc, error_code=error_code, topics=tuple(
        make(rc, "topics", topic_id=tid, partitions=tuple(parts)) for tid, parts in topics.items()))


def partitions_sent(request) -> list[tuple[uuid.UUID, int, tuple[int, ...]]]:
    return sorted((t.topic_id, p.partition_index, isr_of(p)) for t in request.topics
                  for p in t.partitions)


@pytest.fixture
def managers():
    made = []

    def make_manager(fake, controller=lambda: (1, "c1", 9001), epoch=lambda: 42, **kw):
        kw.setdefault("backoff", ExponentialBackoff(10, 10, jitter=0))
        m = AlterPartitionManager(1, epoch, controller, IDS.get, connect=fake.connect, **kw)
        made.append(m)
        return m.start()
    yield make_manager
    for m in made:
        m.shutdown()


@pytest.mark.parametrize("version", [2, 3])
def test_an_accepted_change_resolves_to_the_new_state(managers, version):
    fake = FakeController()
    m = managers(fake, version=version)
    f = m.submit(TopicPartition("t", 3), leader_epoch=5, partition_epoch=7, new_isr=(1, 2))
    assert f.result(DEADLINE_S) == PartitionState(1, 5, (1, 2), (), 8)
    [(target, req)] = fake.requests
    assert target == ("c1", 9001)
    assert req.__version__ == version
    assert (req.broker_id, req.broker_epoch) == (1, 42)
    [topic] = req.topics
    [p] = topic.partitions
    assert (topic.topic_id, p.partition_index, p.leader_epoch, p.partition_epoch,
            p.leader_recovery_state) == (TOPIC_ID, 3, 5, 7, 0)
    if version == 3:
        assert [(b.broker_id, b.broker_epoch) for b in p.new_isr_with_epochs] == [(1, -1), (2, -1)]
    else:
        assert p.new_isr == (1, 2)
    assert m.pending() == set()


def test_v3_carries_the_broker_epochs_the_leader_saw_its_followers_fetch_at(managers):
    """KIP-903: the members given an epoch are sent with it, the others with -1 (unchecked)."""
    fake = FakeController()
    m = managers(fake)   # v3 by default
    m.submit(TopicPartition("t", 3), 5, 7, (1, 2, 3), broker_epochs={3: 700}).result(DEADLINE_S)
    [(_, req)] = fake.requests
    [p] = req.topics[0].partitions
    assert [(b.broker_id, b.broker_epoch) for b in p.new_isr_with_epochs] == [
        (1, -1), (2, -1), (3, 700)]


def test_a_partition_error_fails_that_partition_only(managers):
    def answer(request, target):
        return response(request, {(TOPIC_ID, 0): dict(error_code=ErrorCode.INVALID_UPDATE_VERSION),
                                  (TOPIC_ID, 1): dict(leader_id=1, leader_epoch=2, isr=(1,),
                                                      partition_epoch=4)})
    fake = FakeController(answer)
    m = managers(fake)
    gate = threading.Event()
    fake.answer = lambda r, t: (gate.wait(DEADLINE_S), answer(r, t))[1]
    bad = m.submit(TopicPartition("t", 0), 2, 3, (1,))
    good = m.submit(TopicPartition("t", 1), 2, 3, (1,))
    gate.set()
    with pytest.raises(KafkaError) as e:
        bad.result(DEADLINE_S)
    assert e.value.code == ErrorCode.INVALID_UPDATE_VERSION
    assert good.result(DEADLINE_S) == PartitionState(1, 2, (1,), (), 4)


def test_what_queues_during_a_request_goes_in_one_next_request(managers):
    release = threading.Event()
    fake = FakeController()
    fake.answer = lambda r, t: (release.wait(DEADLINE_S), FakeController.accept_all(r, t))[1]
    m = managers(fake)
    first = m.submit(TopicPartition("t", 0), 1, 1, (1, 2))
    eventually(lambda: fake.in_flight == 1, "the first request is in flight")
    later = [m.submit(TopicPartition("t", 1), 1, 1, (1,)),
             m.submit(TopicPartition("u", 0), 1, 1, (1, 3))]
    release.set()
    for f in [first, *later]:
        f.result(DEADLINE_S)
    assert fake.max_in_flight == 1
    assert [partitions_sent(r) for _, r in fake.requests] == [
        [(TOPIC_ID, 0, (1, 2))],
        sorted([(TOPIC_ID, 1, (1,)), (OTHER_ID, 0, (1, 3))])]


def test_a_second_change_while_one_is_pending_is_not_attempted(managers):
    release = threading.Event()
    fake = FakeController()
    fake.answer = lambda r, t: (release.wait(DEADLINE_S), FakeController.accept_all(r, t))[1]
    m = managers(fake)
    tp = TopicPartition("t", 0)
    first = m.submit(tp, 1, 1, (1, 2))
    eventually(lambda: fake.in_flight == 1, "the first request is in flight")
    second = m.submit(tp, 1, 1, (1,))
    with pytest.raises(KafkaError) as e:
        second.result(0)
    assert e.value.code == ErrorCode.OPERATION_NOT_ATTEMPTED
    # the first one's callback may propose the next change at once
    resubmitted = concurrent.futures.Future()
    first.add_done_callback(lambda f: resubmitted.set_result(m.submit(tp, 1, 2, (1,))))
    release.set()
    assert first.result(DEADLINE_S).isr == (1, 2)
    assert resubmitted.result(DEADLINE_S).result(DEADLINE_S) == PartitionState(1, 1, (1,), (), 3)


def test_not_controller_is_retried_at_the_controller_then_named(managers):
    current = [(1, "c1", 9001)]

    def answer(request, target):
        if target == ("c1", 9001):
            current[0] = (2, "c2", 9002)  # the controller moved meanwhile
            return response(request, {}, ErrorCode.NOT_CONTROLLER)
        return FakeController.accept_all(request, target)
    fake = FakeController(answer)
    m = managers(fake, controller=lambda: current[0])
    f = m.submit(TopicPartition("t", 0), 1, 1, (1, 2))
    assert f.result(DEADLINE_S).isr == (1, 2)
    assert [t for t, _ in fake.requests] == [("c1", 9001), ("c2", 9002)]
    assert fake.connects == [("c1", 9001), ("c2", 9002)]


@pytest.mark.parametrize("top", [ErrorCode.STALE_BROKER_EPOCH, ErrorCode.REQUEST_TIMED_OUT])
def test_other_top_level_errors_are_retried_with_the_current_broker_epoch(managers, top):
    epochs = iter(range(100, 10_000))
    answers = iter([lambda r, t: response(r, {}, top)] + [FakeController.accept_all] * 100)
    fake = FakeController(lambda r, t: next(answers)(r, t))
    m = managers(fake, epoch=lambda: next(epochs))
    assert m.submit(TopicPartition("t", 0), 1, 1, (1,)).result(DEADLINE_S).isr == (1,)
    assert [r.broker_epoch for _, r in fake.requests] == [100, 101]


def test_connection_failures_and_no_controller_are_retried(managers):
    known = threading.Event()
    asked = []

    def controller():
        asked.append(known.is_set())
        return (1, "c1", 9001) if known.is_set() else None
    fake = FakeController()
    fake.refuse_connects = 2
    m = managers(fake, controller=controller)
    f = m.submit(TopicPartition("t", 0), 1, 1, (1,))
    eventually(lambda: len(asked) >= 3, "three rounds without a controller")
    assert fake.connects == [] and not f.done()
    known.set()
    assert f.result(DEADLINE_S).isr == (1,)
    assert fake.connects == [("c1", 9001)] * 3


def test_a_partition_left_out_of_the_response_is_sent_again(managers):
    rounds = []

    def answer(request, target):
        rounds.append(partitions_sent(request))
        if len(rounds) == 1:  # answers partition 0 only
            return response(request, {(TOPIC_ID, 0): dict(leader_id=1, leader_epoch=1, isr=(1,),
                                                           partition_epoch=2)})
        return FakeController.accept_all(request, target)
    fake = FakeController(answer)
    m = managers(fake)
    gate = threading.Event()
    inner = fake.answer
    fake.answer = lambda r, t: (gate.wait(DEADLINE_S), inner(r, t))[1]
    a = m.submit(TopicPartition("t", 0), 1, 1, (1,))
    b = m.submit(TopicPartition("t", 1), 1, 1, (1, 3))
    gate.set()
    assert a.result(DEADLINE_S).partition_epoch == 2
    assert b.result(DEADLINE_S).isr == (1, 3)
    assert rounds[-1] == [(TOPIC_ID, 1, (1, 3))]


def test_unknown_topic_and_shutdown(managers):
    never = threading.Event()
    fake = FakeController(lambda r, t: (never.wait(DEADLINE_S), response(r, {}))[1])
    m = managers(fake)
    with pytest.raises(KafkaError) as e:
        m.submit(TopicPartition("nope", 0), 1, 1, (1,)).result(0)
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC_ID
    f = m.submit(TopicPartition("t", 0), 1, 1, (1,))
    eventually(lambda: fake.in_flight == 1, "the request is in flight")
    never.set()
    m.shutdown()
    for fut in (f, m.submit(TopicPartition("t", 1), 1, 1, (1,))):
        with pytest.raises(KafkaError) as e:
            fut.result(DEADLINE_S)
        assert e.value.code == ErrorCode.OPERATION_NOT_ATTEMPTED


def polled_manager(fake, clock, **kw):
    """A manager whose rounds the test runs (``poll``) on ``clock``: no thread, no sleeps."""
    kw.setdefault("backoff", ExponentialBackoff(100, 1000, jitter=0))
    return AlterPartitionManager(1, lambda: 42, lambda: (1, "c1", 9001), IDS.get,
                                 connect=fake.connect, clock=clock, **kw)


def test_failed_rounds_back_off_exponentially_to_a_second_and_an_answered_round_resets_it():
    """The ex-leader's retry storm: a controller that keeps answering NOT_CONTROLLER was asked
    every ~55 ms. Each failed round now waits twice as long as the one before, up to 1 s."""
    refusing = [True]
    fake = FakeController(lambda r, t: response(r, {}, ErrorCode.NOT_CONTROLLER) if refusing[0]
                          else FakeController.accept_all(r, t))
    clock = MockClock()
    m = polled_manager(fake, clock)
    f = m.submit(TopicPartition("t", 0), 1, 1, (1,))
    waits = []
    for _ in range(6):
        sent = len(fake.requests)
        waits.append(m.poll())
        assert len(fake.requests) == sent + 1
        clock.advance_ms(int(waits[-1] * 1000) - 1)
        assert m.poll() == pytest.approx(0.001)   # not due yet: nothing sent
        assert len(fake.requests) == sent + 1
        clock.advance_ms(1)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    refusing[0] = False
    assert m.poll() is None and f.result(0).isr == (1,)
    g = m.submit(TopicPartition("t", 1), 1, 1, (1,))
    assert m.poll() is None and g.done()   # sent at once: the answered round reset the backoff
    assert len(fake.requests) == 8
    m.shutdown()


def test_a_jittered_backoff_stays_within_a_fifth_of_each_step():
    fake = FakeController(lambda r, t: response(r, {}, ErrorCode.NOT_CONTROLLER))
    clock = MockClock()
    m = polled_manager(fake, clock, backoff=ExponentialBackoff(100, 1000, rng=random.Random(3)))
    m.submit(TopicPartition("t", 0), 1, 1, (1,))
    for base in (100, 200, 400, 800, 1000):
        wait = m.poll()
        assert base * 0.8 <= wait * 1000 <= min(base * 1.2, 1000)
        clock.advance_ms(int(wait * 1000) + 1)
    m.shutdown()


def test_nothing_is_sent_while_the_lease_is_in_doubt_and_what_waited_goes_once_it_is_held():
    fake = FakeController()
    lease = ZkSessionLease()
    lease.connected()
    m = polled_manager(fake, MockClock(), lease=lease)
    lease.suspended()
    f = m.submit(TopicPartition("t", 0), 1, 1, (1, 2))
    g = m.submit(TopicPartition("u", 0), 1, 1, (1,))
    assert m.poll() is None and m.poll() is None   # waits for the lease, not for a timer
    assert fake.requests == [] and not f.done()
    lease.connected()
    assert m.poll() is None
    assert [partitions_sent(r) for _, r in fake.requests] == [
        sorted([(TOPIC_ID, 0, (1, 2)), (OTHER_ID, 0, (1,))])]
    assert f.result(0).isr == (1, 2) and g.result(0).isr == (1,)
    m.shutdown()


def test_the_managers_thread_sends_what_waited_when_the_lease_is_held_again(managers):
    fake = FakeController()
    lease = ZkSessionLease()
    m = managers(fake, lease=lease)   # in doubt: not yet connected
    f = m.submit(TopicPartition("t", 0), 1, 1, (1,))
    lease.connected()
    assert f.result(DEADLINE_S).isr == (1,)


# ---- the handler ----------------------------------------------------------------------------

class RecordingMetadata:
    """Answers each item by ``answer(item)``; records the calls."""

    advertised_endpoints = {"PLAINTEXT": ("", 0)}

    def __init__(self, answer=None, refuse: ErrorCode | None = None):
        self.calls = []
        self.answer = answer
        self.refuse = refuse

    def alter_partition(self, broker_id, broker_epoch, items):
        self.calls.append((broker_id, broker_epoch, list(items)))
        if self.refuse is not None:
            raise KafkaError("refused", self.refuse)
        return [self.answer(i) for i in items]


async def send(metadata, version: int, body):
    ctx = BrokerContext(node_id=1, advertised_host="b", advertised_port=9092, metadata=metadata,
                        replica_manager=None)
    dispatcher = Dispatcher(ctx)
    request = parse_request(client_frame(body, correlation_id=5))
    frame = encode_response(request, await dispatcher(request, PEER))
    cls = response_class(ApiKey.ALTER_PARTITION, version)
    resp, size = entity_reader(cls)(frame, 8 + 1)  # size, correlation id, header tags
    assert 9 + size == len(frame)
    return resp


def request(version: int, partitions, broker_id=1, broker_epoch=42):
    """``partitions``: (topic id, partition, leader epoch, partition epoch, isr[, member epochs])."""
    cls = request_class(ApiKey.ALTER_PARTITION, version)
    topics: dict = {}
    for tid, p, le, pe, isr, *epochs in partitions:
        if version >= 3:
            member_epochs = epochs[0] if epochs else [-1] * len(isr)
            members = {"new_isr_with_epochs": tuple(
                make(cls, "topics.partitions.new_isr_with_epochs", broker_id=b, broker_epoch=e)
                for b, e in zip(isr, member_epochs))}
        else:
            members = {"new_isr": tuple(isr)}
        topics.setdefault(tid, []).append(make(cls, "topics.partitions", partition_index=p,
                                                leader_epoch=le, partition_epoch=pe, **members))
    return make(cls, broker_id=broker_id, broker_epoch=broker_epoch, topics=tuple(
        make(cls, "topics", topic_id=tid, partitions=tuple(ps)) for tid, ps in topics.items()))


def test_alter_partition_is_advertised_as_versions_2_to_3():
    assert API_VERSIONS[ApiKey.ALTER_PARTITION] == (2, 3)
    assert advertised_versions()[ApiKey.ALTER_PARTITION] == (2, 3)


@pytest.mark.parametrize("version", [2, 3])
def test_the_handler_answers_each_partition_under_its_topic(version):
    def answer(item):
        if item.partition == 1:
            return AlterPartitionItemResult(item.topic_id, 1, ErrorCode.FENCED_LEADER_EPOCH)
        return AlterPartitionItemResult(item.topic_id, item.partition, ErrorCode.NONE, 1,
                                        item.leader_epoch, item.new_isr, item.partition_epoch + 1)
    md = RecordingMetadata(answer)
    resp = asyncio.run(send(md, version, request(version, [
        (TOPIC_ID, 0, 4, 9, (1, 2), (7, -1)), (TOPIC_ID, 1, 4, 9, (1,)), (OTHER_ID, 2, 1, 0, (1, 3))])))
    [(broker_id, broker_epoch, items)] = md.calls
    assert (broker_id, broker_epoch) == (1, 42)
    assert [(i.topic_id, i.partition, i.leader_epoch, i.partition_epoch, i.new_isr)
            for i in items] == [(TOPIC_ID, 0, 4, 9, (1, 2)), (TOPIC_ID, 1, 4, 9, (1,)),
                                (OTHER_ID, 2, 1, 0, (1, 3))]
    assert items[0].isr_broker_epochs == ((7, -1) if version == 3 else None)
    assert resp.error_code == ErrorCode.NONE
    got = {(t.topic_id, p.partition_index): (p.error_code, p.leader_id, p.leader_epoch,
                                             tuple(p.isr), p.partition_epoch)
           for t in resp.topics for p in t.partitions}
    assert got == {(TOPIC_ID, 0): (ErrorCode.NONE, 1, 4, (1, 2), 10),
                   (TOPIC_ID, 1): (ErrorCode.FENCED_LEADER_EPOCH, -1, -1, (), -1),
                   (OTHER_ID, 2): (ErrorCode.NONE, 1, 1, (1, 3), 1)}
    assert [t.topic_id for t in resp.topics] == [TOPIC_ID, OTHER_ID]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("code", [ErrorCode.NOT_CONTROLLER, ErrorCode.STALE_BROKER_EPOCH])
def test_a_refused_request_has_only_a_top_level_error(version, code):
    resp = asyncio.run(send(RecordingMetadata(refuse=code), version,
                            request(version, [(TOPIC_ID, 0, 1, 1, (1,))])))
    assert (resp.error_code, resp.topics) == (code, ())


def test_one_broker_answers_not_controller(tmp_path):
    md = ClusterMetadata(tmp_path, 1, {})
    resp = asyncio.run(send(md, 2, request(2, [(TOPIC_ID, 0, 1, 1, (1,))])))
    assert (resp.error_code, resp.topics) == (ErrorCode.NOT_CONTROLLER, ())


# ---- ZkClusterMetadata over the real controller logic ----------------------------------------

class LogicController:
    """An active controller without ZooKeeper: events go through ``controller_logic``."""

    def __init__(self, image: MetadataImage, active=True):
        self.image = image
        self.is_active = active
        self.events = []
        self.hold = False

    def submit(self, event):
        self.events.append(event)
        future = concurrent.futures.Future()
        if self.hold:
            return future
        try:
            result = controller_logic.handle(self.image, event)
        except KafkaError as e:
            future.set_exception(e)
            return future
        self.image = result.image
        future.set_result(result)
        return future


def cluster_image() -> MetadataImage:
    brokers = {i: BrokerRegistration(i, epoch=100 + i) for i in (1, 2, 3)}
    topic = TopicImage("t", TOPIC_ID, ((1, 2, 3), (2, 3, 1)), frozen_map({
        0: PartitionRegistration(1, (1, 2, 3), leader_epoch=3, partition_epoch=5),
        1: PartitionRegistration(2, (2, 3, 1), leader_epoch=1, partition_epoch=2)}))
    return MetadataImage(frozen_map(brokers), frozen_map({"t": topic}), controller_epoch=1)


def zk_metadata(controller) -> ZkClusterMetadata:
    md = ZkClusterMetadata.__new__(ZkClusterMetadata)  # no ZooKeeper: only what alter_partition reads
    md.node_id, md.controller, md._wait_s = 1, controller, 0.5
    md.view_image = cluster_image()
    return md


def zk_send(md, version, partitions, broker_epoch=101):
    return asyncio.run(send(md, version, request(version, partitions, broker_epoch=broker_epoch)))


@pytest.mark.parametrize("version", [2, 3])
def test_the_controller_shrinks_the_isr_then_refuses_the_stale_retry(version):
    controller = LogicController(cluster_image())
    md = zk_metadata(controller)
    resp = zk_send(md, version, [(TOPIC_ID, 0, 3, 5, (1, 2))])
    [p] = resp.topics[0].partitions
    assert (resp.error_code, p.error_code, p.leader_id, p.leader_epoch, tuple(p.isr),
            p.partition_epoch) == (0, 0, 1, 3, (1, 2), 6)
    assert controller.events == [AlterPartitions((AlterPartition(
        1, 101, "t", 0, 3, 5, (1, 2), topic_id=TOPIC_ID,
        new_isr_broker_epochs=(-1, -1) if version == 3 else None),))]  # v3: the epochs go on
    # the same proposal again is answered with the state it made (an idempotent retry) ...
    [p] = zk_send(md, version, [(TOPIC_ID, 0, 3, 5, (1, 2))]).topics[0].partitions
    assert (p.error_code, p.partition_epoch) == (0, 6)
    # ... another one on the old partition epoch is refused
    [p] = zk_send(md, version, [(TOPIC_ID, 0, 3, 5, (1,))]).topics[0].partitions
    assert p.error_code == ErrorCode.INVALID_UPDATE_VERSION


def test_zk_partition_errors_and_top_level_errors():
    controller = LogicController(cluster_image())
    md = zk_metadata(controller)
    unknown = uuid.uuid4()
    resp = zk_send(md, 3, [(TOPIC_ID, 0, 2, 5, (1, 2)), (unknown, 0, 1, 1, (1,)),
                           (TOPIC_ID, 1, 1, 2, (2, 3)), (TOPIC_ID, 0, 3, 5, (1, 3), (-1, 999))])
    assert resp.error_code == 0
    codes = [(t.topic_id, p.partition_index, p.error_code) for t in resp.topics for p in t.partitions]
    assert codes == [(TOPIC_ID, 0, ErrorCode.FENCED_LEADER_EPOCH),
                     (TOPIC_ID, 1, ErrorCode.INVALID_REQUEST),  # broker 1 does not lead it
                     (TOPIC_ID, 0, ErrorCode.INELIGIBLE_REPLICA),  # broker 3's epoch is 103
                     (unknown, 0, ErrorCode.UNKNOWN_TOPIC_ID)]
    stale = zk_send(md, 2, [(TOPIC_ID, 0, 3, 5, (1, 2))], broker_epoch=7)
    assert (stale.error_code, stale.topics) == (ErrorCode.STALE_BROKER_EPOCH, ())
    controller.hold = True  # the controller does not answer in time
    late = zk_send(md, 2, [(TOPIC_ID, 0, 3, 5, (1, 2))])
    assert (late.error_code, late.topics) == (ErrorCode.REQUEST_TIMED_OUT, ())
    md.controller = LogicController(controller.image, active=False)
    gone = zk_send(md, 2, [(TOPIC_ID, 0, 3, 5, (1, 2))])
    assert (gone.error_code, gone.topics) == (ErrorCode.NOT_CONTROLLER, ())
    md.controller = None
    assert zk_send(md, 2, [(TOPIC_ID, 0, 3, 5, (1, 2))]).error_code == ErrorCode.NOT_CONTROLLER


def test_the_sender_and_the_handler_agree_over_the_wire():
    """The manager's requests answered by a Dispatcher over ZkClusterMetadata and the logic."""
    controller = LogicController(cluster_image())
    md = zk_metadata(controller)
    ctx = BrokerContext(node_id=1, advertised_host="b", advertised_port=9092, metadata=md,
                        replica_manager=None)
    dispatcher = Dispatcher(ctx)

    class Wire:
        def request(self, body, response_cls):
            req = parse_request(client_frame(body))
            frame = encode_response(req, asyncio.run(dispatcher(req, PEER)))
            return entity_reader(response_cls)(frame, 9)[0]

        def close(self):
            pass

    for version in (2, 3):
        m = AlterPartitionManager(1, lambda: 101, lambda: (1, "c", 1), IDS.get,
                                  connect=lambda h, p: Wire(), version=version).start()
        try:
            state = controller.image.registration(TopicPartition("t", 0))
            isr = (1, 2) if version == 2 else (1,)
            got = m.submit(TopicPartition("t", 0), state.leader_epoch, state.partition_epoch,
                           isr).result(DEADLINE_S)
            assert got == PartitionState(1, 3, isr, (), state.partition_epoch + 1)
            with pytest.raises(KafkaError) as e:
                m.submit(TopicPartition("t", 0), state.leader_epoch, state.partition_epoch,
                         (1, 3)).result(DEADLINE_S)
            assert e.value.code == ErrorCode.INVALID_UPDATE_VERSION
        finally:
            m.shutdown()
