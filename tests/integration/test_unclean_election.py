"""Unclean leader election on three broker processes and a real ZooKeeper, with real clients.

Kafka's rules (strata/cluster/election.py): a partition whose leader died gets a new one from
its live ISR (or ELR) members only, the ISR emptying with its last member (KIP-966); a live
replica outside them may lead only with
``unclean.leader.election.enable`` (the broker default, or the topic's override, which takes
effect at once for an offline partition). Each test makes a partition offline the same way:
the followers are SIGKILLed (the ISR shrinks to the leader), the leader alone acknowledges more
records (acks=all, min.insync.replicas=1), then the leader is SIGKILLed and a follower, which
lacks those records, is restarted alone.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType)
from zk_server import zookeeper_available

from cluster_clients import NO_TIERING, admin, consume_all, log_end, produce, wait_for
from cluster_process import StrataCluster

_ok, _why = zookeeper_available()
pytestmark = [pytest.mark.skipif(not _ok, reason=_why), pytest.mark.slow]

SESSION_MS = 6000
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    **NO_TIERING,
    "offsets.topic.num.partitions": "3",
    "replica.lag.time.max.ms": "5000",
    "replica.fetch.wait.max.ms": "200",
}


def partition(broker, topic: str):
    """Partition 0 of ``topic`` as ``broker``'s Metadata response has it."""
    md = admin(broker.bootstrap).list_topics(topic, timeout=5)
    return md.topics[topic].partitions[0]


def leader_isr(broker, topic: str) -> tuple[int, list[int]]:
    p = partition(broker, topic)
    return p.leader, sorted(p.isrs)


def create(cluster, via, name: str, rf: int = 3, **configs: str) -> None:
    # a fresh client: a kept one may still route CreateTopics to a controller killed meanwhile
    client = AdminClient({"bootstrap.servers": via.bootstrap})
    fut = client.create_topics(
        [NewTopic(name, 1, rf, config={k.replace("_", "."): v for k, v in configs.items()})])
    fut[name].result(60)
    wait_for(f"{name} has a leader", lambda: partition(via, name).leader >= 0)


def keys(prefix: str, n: int) -> list[bytes]:
    return [b"%s%d" % (prefix.encode(), i) for i in range(n)]


def make_offline(cluster, topic: str, before: list[bytes], only_leader: list[bytes]):
    """Produces ``before`` (on every replica), SIGKILLs the followers, produces
    ``only_leader`` (on the leader alone), SIGKILLs the leader and restarts one follower alone.
    Returns (old leader, restarted follower, follower still down) as node ids."""
    assert produce(cluster.bootstrap, topic, before) == before
    leader = partition(cluster.broker(1), topic).leader
    restarted, other = [n for n in sorted(cluster.node_ids) if n != leader]
    wait_for("followers caught up", lambda: all(
        log_end(cluster.broker(f), topic) == len(before) for f in (restarted, other)))
    cluster.broker(restarted).kill()
    cluster.broker(other).kill()
    lead = cluster.broker(leader)
    wait_for("the ISR shrunk to the leader", lambda: leader_isr(lead, topic) == (leader, [leader]))
    assert produce(lead.bootstrap, topic, only_leader) == only_leader
    assert log_end(lead, topic) == len(before) + len(only_leader)
    lead.kill()
    cluster.broker(restarted).start()
    # the old leader's session must expire before the restarted follower sees it gone
    cluster.wait_metadata({restarted})
    return leader, restarted, other


# The broker-default test runs first: its own cluster is gone before the module's starts.

def test_the_broker_default_elects_a_live_replica_outside_the_isr(tmp_path):
    overrides = {**OVERRIDES, "unclean.leader.election.enable": "true"}
    with StrataCluster(tmp_path, brokers=3, overrides=overrides) as cluster:
        create(cluster, cluster.broker(1), "default-unclean", min_insync_replicas="1")
        before = keys("a", 50)
        leader, restarted, _ = make_offline(cluster, "default-unclean", before, keys("x", 20))
        f = cluster.broker(restarted)
        assert wait_for("the live non-ISR replica elected", lambda: leader_isr(
            f, "default-unclean") == (restarted, [restarted]))
        assert log_end(f, "default-unclean") == len(before)
        after = keys("b", 10)
        assert produce(f.bootstrap, "default-unclean", after) == after
        assert consume_all(f.bootstrap, "default-unclean", 60) == before + after


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StrataCluster(tmp_path_factory.mktemp("unclean"), brokers=3, overrides=OVERRIDES) as c:
        yield c


def test_without_unclean_election_only_the_isr_member_leads_again(cluster):
    topic = "clean-only"
    create(cluster, cluster.broker(1), topic, min_insync_replicas="1")
    before, only_leader = keys("a", 100), keys("x", 50)
    leader, restarted, other = make_offline(cluster, topic, before, only_leader)
    f = cluster.broker(restarted)
    # A topic created now gets a leader only once the controller (the one live broker) has
    # handled the restarted broker's registration, and with it the offline election.
    create(cluster, f, "clean-only-probe", rf=1)
    p = partition(f, topic)
    # KIP-966: the ISR emptied with the leader, which stays eligible (the last known leader)
    assert (p.leader, p.isrs) == (-1, [])
    assert p.error is not None and p.error.code() == KafkaError.LEADER_NOT_AVAILABLE
    assert log_end(f, topic) == len(before)   # it lacks what only the leader acknowledged

    cluster.broker(leader).start()
    lead = cluster.broker(leader)
    wait_for("the old leader leads again", lambda: leader_isr(f, topic)[0] == leader)
    assert consume_all(lead.bootstrap, topic, len(before) + len(only_leader)) == before + only_leader

    cluster.broker(other).start()
    cluster.wait_metadata()
    wait_for("the ISR whole again", lambda: leader_isr(lead, topic)[1] == sorted(cluster.node_ids))
    assert all(log_end(b, topic) == len(before) + len(only_leader) for b in cluster.brokers)


def test_enabling_unclean_election_on_the_topic_elects_the_live_non_isr_replica(cluster):
    topic = "unclean-topic"
    create(cluster, cluster.broker(1), topic, min_insync_replicas="1")
    before, only_leader = keys("a", 100), keys("x", 50)
    leader, restarted, other = make_offline(cluster, topic, before, only_leader)
    f = cluster.broker(restarted)
    wait_for("the partition offline", lambda: leader_isr(f, topic) == (-1, []))

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(
        "unclean.leader.election.enable", "true", incremental_operation=AlterConfigOpType.SET)])
    admin(f.bootstrap).incremental_alter_configs([resource])[resource].result(30)
    wait_for("the live non-ISR replica elected (unclean)",
             lambda: leader_isr(f, topic) == (restarted, [restarted]))
    # what only the dead leader had is gone; the new leader's log is what it had replicated
    assert log_end(f, topic) == len(before)
    after = keys("b", 30)
    assert produce(f.bootstrap, topic, after) == after
    assert consume_all(f.bootstrap, topic, len(before) + len(after)) == before + after

    # the old leader comes back as a follower and drops the records the new leader never had
    cluster.broker(leader).start()
    cluster.broker(other).start()
    cluster.wait_metadata()
    wait_for("the ISR whole again", lambda: leader_isr(f, topic) == (restarted, sorted(cluster.node_ids)))
    assert all(log_end(b, topic) == len(before) + len(after) for b in cluster.brokers)
    assert consume_all(cluster.broker(leader).bootstrap, topic, len(before) + len(after)) \
        == before + after
