"""CreateAcls, DescribeAcls and DeleteAcls in every version Strata advertises, through the
Dispatcher as bytes (the peer is User:ANONYMOUS from 10.1.2.3): bindings created, described
with filters and deleted; Kafka's INVALID_REQUEST for bindings and filters it refuses; ALTER
(create, delete) and DESCRIBE (describe) on the Cluster required, CLUSTER_AUTHORIZATION_FAILED
otherwise."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from strata.common.errors import ErrorCode
from strata.protocol.codec import API_VERSIONS, ApiKey as A
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, PatternType as PT, ResourceType as RT)
from test_group_handlers import Client, context

VERSIONS = list(range(API_VERSIONS[A.CREATE_ACLS][0], API_VERSIONS[A.CREATE_ACLS][1] + 1))


def ctx_with(authorizer):
    return replace(context(), authorizer=authorizer)


def creation(version, name, op=Op.READ, pt=PT.LITERAL, rtype=RT.TOPIC, perm=Perm.ALLOW,
             principal="User:alice", host="*"):
    return Client.nested(A.CREATE_ACLS, version, "creations", resource_type=rtype,
                         resource_name=name, resource_pattern_type=pt, principal=principal,
                         host=host, operation=op, permission_type=perm)


def describe(client, version, rtype=RT.ANY, name=None, pt=PT.ANY, principal=None,
             op=Op.ANY, perm=Perm.ANY):
    return asyncio.run(client.send(A.DESCRIBE_ACLS, version, resource_type_filter=rtype,
                                   resource_name_filter=name, pattern_type_filter=pt,
                                   principal_filter=principal, host_filter=None, operation=op,
                                   permission_type=perm))


def delete_filter(version, rtype=RT.ANY, name=None, pt=PT.ANY, op=Op.ANY, perm=Perm.ANY):
    return Client.nested(A.DELETE_ACLS, version, "filters", resource_type_filter=rtype,
                         resource_name_filter=name, pattern_type_filter=pt,
                         principal_filter=None, host_filter=None, operation=op,
                         permission_type=perm)


@pytest.mark.parametrize("version", VERSIONS)
def test_create_describe_delete(version):
    client = Client(ctx_with(StandardAuthorizer(super_users=["User:ANONYMOUS"]).start()))
    r = asyncio.run(client.send(A.CREATE_ACLS, version, creations=(
        creation(version, "orders"), creation(version, "orders.", Op.WRITE, PT.PREFIXED),
        creation(version, "g", rtype=RT.GROUP, perm=Perm.DENY, host="10.0.0.1"),
        creation(version, "kafka-cluster", Op.IDEMPOTENT_WRITE, rtype=RT.CLUSTER))))
    assert [(x.error_code, x.error_message) for x in r.results] == [(ErrorCode.NONE, None)] * 4
    r = describe(client, version)
    assert r.error_code == ErrorCode.NONE
    got = {(x.resource_type, x.resource_name, x.pattern_type,
            tuple((a.principal, a.host, a.operation, a.permission_type) for a in x.acls))
           for x in r.resources}
    assert got == {
        (RT.TOPIC, "orders", PT.LITERAL, (("User:alice", "*", Op.READ, Perm.ALLOW),)),
        (RT.TOPIC, "orders.", PT.PREFIXED, (("User:alice", "*", Op.WRITE, Perm.ALLOW),)),
        (RT.GROUP, "g", PT.LITERAL, (("User:alice", "10.0.0.1", Op.READ, Perm.DENY),)),
        (RT.CLUSTER, "kafka-cluster", PT.LITERAL,
         (("User:alice", "*", Op.IDEMPOTENT_WRITE, Perm.ALLOW),))}
    # MATCH: what applies to topic orders.eu
    r = describe(client, version, RT.TOPIC, "orders.eu", PT.MATCH)
    assert [x.resource_name for x in r.resources] == ["orders."]
    r = asyncio.run(client.send(A.DELETE_ACLS, version, filters=(
        delete_filter(version, RT.TOPIC), delete_filter(version, RT.GROUP, "nothing", PT.LITERAL))))
    first, second = r.filter_results
    assert first.error_code == ErrorCode.NONE and second.error_code == ErrorCode.NONE
    assert sorted(m.resource_name for m in first.matching_acls) == ["orders", "orders."]
    assert all(m.error_code == ErrorCode.NONE for m in first.matching_acls)
    assert second.matching_acls == ()
    assert {x.resource_type for x in describe(client, version).resources} == {RT.GROUP, RT.CLUSTER}


@pytest.mark.parametrize("version", VERSIONS)
def test_bindings_and_filters_kafka_refuses_are_invalid_request(version):
    authorizer = StandardAuthorizer(super_users=["User:ANONYMOUS"]).start()
    client = Client(ctx_with(authorizer))
    r = asyncio.run(client.send(A.CREATE_ACLS, version, creations=(
        creation(version, "*", pt=PT.PREFIXED), creation(version, "t", pt=PT.MATCH),
        creation(version, "t", op=Op.ANY), creation(version, "t", op=99),
        creation(version, "t", rtype=RT.ANY), creation(version, "t", perm=Perm.UNKNOWN),
        creation(version, "other", rtype=RT.CLUSTER), creation(version, "t", principal="bob"),
        creation(version, "ok"))))
    codes = [x.error_code for x in r.results]
    assert codes == [ErrorCode.INVALID_REQUEST] * 8 + [ErrorCode.NONE]
    assert r.results[0].error_message and r.results[6].error_message == \
        "The only valid name for the CLUSTER resource is kafka-cluster"
    assert [b.pattern.name for b in authorizer.acls()] == ["ok"]
    assert describe(client, version, op=Op.UNKNOWN).error_code == ErrorCode.INVALID_REQUEST
    r = asyncio.run(client.send(A.DELETE_ACLS, version, filters=(
        delete_filter(version, pt=PT.UNKNOWN), delete_filter(version, perm=Perm.ALLOW))))
    assert [x.error_code for x in r.filter_results] == [ErrorCode.INVALID_REQUEST, ErrorCode.NONE]
    assert authorizer.acls() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_acl_apis_need_alter_or_describe_on_the_cluster(version):
    authorizer = StandardAuthorizer().start()
    client = Client(ctx_with(authorizer))
    r = asyncio.run(client.send(A.CREATE_ACLS, version, creations=(creation(version, "t"),)))
    assert [x.error_code for x in r.results] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    assert describe(client, version).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    r = asyncio.run(client.send(A.DELETE_ACLS, version, filters=(delete_filter(version),)))
    assert [x.error_code for x in r.filter_results] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    cluster = ResourcePattern(RT.CLUSTER, "kafka-cluster", PT.LITERAL)
    authorizer.create_acls([AclBinding(cluster, AccessControlEntry(
        "User:ANONYMOUS", "10.1.2.3", Op.DESCRIBE, Perm.ALLOW))])
    assert describe(client, version).error_code == ErrorCode.NONE
    r = asyncio.run(client.send(A.CREATE_ACLS, version, creations=(creation(version, "t"),)))
    assert [x.error_code for x in r.results] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    authorizer.create_acls([AclBinding(cluster, AccessControlEntry(
        "User:*", "*", Op.ALTER, Perm.ALLOW))])
    r = asyncio.run(client.send(A.CREATE_ACLS, version, creations=(creation(version, "t"),)))
    assert [x.error_code for x in r.results] == [ErrorCode.NONE]
