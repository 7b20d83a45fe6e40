"""ACLs in ZooKeeper as Kafka 3.9's AclAuthorizer keeps them, between two authorizers (two
brokers' worth) on one real ZooKeeper: a binding made through one is in force in the other
through the change notifications; the znodes are Kafka's; bindings written by Kafka (its JSON
and notification) are picked up; a fresh authorizer loads everything; a broker whose session
expired catches up."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from zk_fixtures import chroot, new_client, zk_server  # noqa: F401 - the fixtures
from zk_server import zookeeper_available

from strata.cluster.acl_store import ZkAclStore
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, AclBindingFilter, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, Action, PatternType as PT, ResourceType as RT)
from strata.security.sasl import KafkaPrincipal
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

ALICE = KafkaPrincipal("User", "alice")


@pytest.fixture
def authorizers(new_client):
    made = []

    def new() -> StandardAuthorizer:
        made.append(StandardAuthorizer(ZkAclStore(new_client())).start())
        return made[-1]
    yield new
    for a in made:
        a.close()


@pytest.fixture
def raw(zk_server, chroot) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_server.connect_string(chroot))
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def may(a: StandardAuthorizer, op: Op, name: str, rtype: RT = RT.TOPIC) -> bool:
    return a.authorize(ALICE, "127.0.0.1", [Action(op, rtype, name)])[0]


def test_a_binding_made_through_one_is_in_force_in_the_other(authorizers, raw):
    one, two = authorizers(), authorizers()
    assert not may(two, Op.WRITE, "orders.eu")
    assert one.create_acls([AclBinding(ResourcePattern(RT.TOPIC, "orders.", PT.PREFIXED),
                                       AccessControlEntry("User:alice", "*", Op.WRITE,
                                                          Perm.ALLOW))]) == [None]
    eventually(lambda: may(two, Op.WRITE, "orders.eu"), "the other authorizer allows the write")
    assert json.loads(raw.get("/kafka-acl-extended/prefixed/Topic/orders.")[0]) == {
        "version": 1, "acls": [{"principal": "User:alice", "permissionType": "Allow",
                                "operation": "Write", "host": "*"}]}
    [change] = raw.get_children("/kafka-acl-extended-changes")
    assert change.startswith("acl_changes_")
    # a literal binding, then its deletion through the other one
    one.create_acls([AclBinding(ResourcePattern(RT.GROUP, "g", PT.LITERAL),
                                AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW))])
    assert json.loads(raw.get("/kafka-acl/Group/g")[0])["acls"][0]["operation"] == "Read"
    assert raw.get(f"/kafka-acl-changes/{raw.get_children('/kafka-acl-changes')[0]}")[0] == \
        b"GROUP:g"
    eventually(lambda: may(two, Op.READ, "g", RT.GROUP), "the group binding in force")
    [(error, deleted)] = two.delete_acls([AclBindingFilter(RT.GROUP, "g", PT.LITERAL)])
    assert error is None and len(deleted) == 1
    assert raw.exists("/kafka-acl/Group/g") is None   # a resource without bindings goes
    eventually(lambda: not may(one, Op.READ, "g", RT.GROUP), "the deletion in force")
    # a third, started now, loads what is there
    three = authorizers()
    assert [str(b) for b in three.acls()] == [str(b) for b in one.acls()]
    assert may(three, Op.WRITE, "orders.us")


def test_bindings_written_as_kafka_writes_them_are_picked_up(authorizers, raw):
    a = authorizers()
    raw.create("/kafka-acl/Topic/payments", json.dumps({"version": 1, "acls": [
        {"principal": "User:alice", "permissionType": "Allow", "operation": "Read",
         "host": "*"}]}).encode(), makepath=True)
    raw.create("/kafka-acl-changes/acl_changes_", b"TOPIC:payments", sequence=True)
    eventually(lambda: may(a, Op.READ, "payments"), "Kafka's binding in force")
    assert may(a, Op.DESCRIBE, "payments")


def test_concurrent_writers_through_two_authorizers_lose_nothing(authorizers):
    one, two = authorizers(), authorizers()
    resource = ResourcePattern(RT.TOPIC, "shared", PT.LITERAL)
    for i in range(10):
        writer = one if i % 2 else two
        assert writer.create_acls([AclBinding(resource, AccessControlEntry(
            f"User:u{i}", "*", Op.READ, Perm.ALLOW))]) == [None]
    expected = {f"User:u{i}" for i in range(10)}
    for a in (one, two):
        eventually(lambda a=a: {b.entry.principal for b in a.acls()} == expected,
                   "every binding on both")


def test_changes_made_while_a_brokers_session_expired_are_picked_up_after(authorizers,
                                                                          zk_server):
    one, two = authorizers(), authorizers()
    client = two.store.zk
    thief = KazooClient(hosts=zk_server.connect_string(), client_id=client.session_credentials)
    thief.start(timeout=30)
    thief.stop()   # the session is expired on the server; two's client makes a new one
    thief.close()
    one.create_acls([AclBinding(ResourcePattern(RT.TOPIC, "after-expiry", PT.LITERAL),
                                AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW))])
    eventually(lambda: may(two, Op.READ, "after-expiry"),
               "the binding in force on the broker whose session expired")
