"""The ACL stores' formats: Kafka's ZooKeeper JSON for a resource's entries and its change
notifications (LITERAL and extended), the znode paths, and the one-broker file store that keeps
bindings across a restart."""

from __future__ import annotations

import json

from strata.cluster.acl_store import (
    ACL_CHANGES_PATH, EXTENDED_ACL_CHANGES_PATH, FileAclStore, decode_acls, decode_change,
    encode_acls, encode_change, resource_path)
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, AclBindingFilter, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, Action, PatternType as PT, ResourceType as RT)
from strata.security.sasl import KafkaPrincipal


def test_resource_znode_json_is_kafkas_and_round_trips():
    entries = frozenset({AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW),
                         AccessControlEntry("User:bob", "10.0.0.1", Op.DESCRIBE_CONFIGS,
                                            Perm.DENY),
                         AccessControlEntry("User:*", "*", Op.IDEMPOTENT_WRITE, Perm.ALLOW)})
    data = encode_acls(entries)
    assert json.loads(data) == {"version": 1, "acls": [
        {"principal": "User:*", "permissionType": "Allow", "operation": "IdempotentWrite",
         "host": "*"},
        {"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "*"},
        {"principal": "User:bob", "permissionType": "Deny", "operation": "DescribeConfigs",
         "host": "10.0.0.1"}]}
    assert decode_acls(data) == entries


def test_reads_what_kafka_wrote():
    kafka = (b'{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",'
             b'"operation":"ClusterAction","host":"*"},{"principal":"User:bob",'
             b'"permissionType":"Deny","operation":"All","host":"1.2.3.4"}]}')
    assert decode_acls(kafka) == {
        AccessControlEntry("User:alice", "*", Op.CLUSTER_ACTION, Perm.ALLOW),
        AccessControlEntry("User:bob", "1.2.3.4", Op.ALL, Perm.DENY)}


def test_paths_and_change_notifications():
    literal = ResourcePattern(RT.TRANSACTIONAL_ID, "tx-1", PT.LITERAL)
    prefixed = ResourcePattern(RT.TOPIC, "orders.", PT.PREFIXED)
    assert resource_path(literal) == "/kafka-acl/TransactionalId/tx-1"
    assert resource_path(prefixed) == "/kafka-acl-extended/prefixed/Topic/orders."
    path, data = encode_change(literal)
    assert (path, data) == (ACL_CHANGES_PATH, b"TRANSACTIONAL_ID:tx-1")
    assert decode_change(path, data) == literal
    path, data = encode_change(prefixed)
    assert path == EXTENDED_ACL_CHANGES_PATH
    assert json.loads(data) == {"version": 1, "resourceType": "TOPIC", "name": "orders.",
                                "patternType": "PREFIXED"}
    assert decode_change(path, data) == prefixed
    # a name with ':' in it, as Kafka splits only at the first
    assert decode_change(ACL_CHANGES_PATH, b"Group:a:b") == ResourcePattern(
        RT.GROUP, "a:b", PT.LITERAL)


def test_file_store_keeps_bindings_across_a_restart(tmp_path):
    alice = KafkaPrincipal("User", "alice")
    a = StandardAuthorizer(FileAclStore(tmp_path)).start()
    assert a.create_acls([
        AclBinding(ResourcePattern(RT.TOPIC, "orders.", PT.PREFIXED),
                   AccessControlEntry("User:alice", "*", Op.WRITE, Perm.ALLOW)),
        AclBinding(ResourcePattern(RT.GROUP, "g", PT.LITERAL),
                   AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW))]) == [None, None]
    a.delete_acls([AclBindingFilter(RT.GROUP)])
    again = StandardAuthorizer(FileAclStore(tmp_path)).start()
    assert [str(b) for b in again.acls()] == [str(b) for b in a.acls()]
    assert len(again.acls()) == 1
    assert again.authorize(alice, "127.0.0.1", [Action(Op.WRITE, RT.TOPIC, "orders.eu"),
                                                Action(Op.READ, RT.GROUP, "g")]) == [True, False]


def _counting_writes(store: FileAclStore) -> list[int]:
    writes: list[int] = []
    write = store._write
    store._write = lambda acls: (writes.append(len(acls)), write(acls))[1]
    return writes


def test_file_store_writes_a_whole_create_or_delete_request_at_once(tmp_path):
    store = FileAclStore(tmp_path)
    writes = _counting_writes(store)
    a = StandardAuthorizer(store).start()
    bindings = [AclBinding(ResourcePattern(RT.TOPIC, f"t{i}", PT.LITERAL),
                           AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW))
                for i in range(500)]
    assert a.create_acls(bindings) == [None] * 500
    assert writes == [500]
    deleted = a.delete_acls([AclBindingFilter(RT.TOPIC)])
    assert len(deleted[0][1]) == 500 and writes == [500, 0]
    assert StandardAuthorizer(FileAclStore(tmp_path)).start().acls() == []


def test_file_store_failing_to_write_fails_every_binding_and_changes_nothing(tmp_path):
    store = FileAclStore(tmp_path)
    a = StandardAuthorizer(store).start()

    def full(acls):
        raise OSError(28, "No space left on device")
    store._write = full
    bindings = [AclBinding(ResourcePattern(RT.TOPIC, f"t{i}", PT.LITERAL),
                           AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW))
                for i in range(3)]
    results = a.create_acls(bindings)
    assert all(r is not None and "No space left" in str(r) for r in results)
    assert a.acls() == [] and store.load() == {}
