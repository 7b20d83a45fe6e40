"""AlterUserScramCredentials and DescribeUserScramCredentials v0 on one broker, through the wire
format both ways, with Kafka 4's rules and messages (AlterUserScramCredentialsRequestTest,
DescribeUserScramCredentialsRequestTest): one result per user, duplicates, empty names,
unknown mechanisms, iteration bounds, deleting what is not there; credentials kept in the
metadata file beside topics and dynamic broker configs, across a restart, and served to the
SCRAM server."""

from __future__ import annotations

import json

import pytest
import scramp

from strata.cluster.metadata import METADATA_FILE, ClusterMetadata
from strata.cluster.scram_credentials import Deletion, Upsertion, apply_changes, plan_alteration
from strata.common.errors import ErrorCode
from strata.protocol.codec import ApiKey
from strata.security.scram import (
    SCRAM_SHA_256, SCRAM_SHA_512, ScramFormatter, ScramServer, credential_from_string)
from test_admin_handlers import broker, nested, send  # noqa: F401 - fixture

A = ApiKey
SALT = b"salt"
SALTED = b"saltedPassword"


def upsert(name, mechanism=1, iterations=4096, salt=SALT, salted=SALTED):
    return nested(A.ALTER_USER_SCRAM_CREDENTIALS, 0, "upsertions", name=name, mechanism=mechanism,
                  iterations=iterations, salt=salt, salted_password=salted)


def delete(name, mechanism=1):
    return nested(A.ALTER_USER_SCRAM_CREDENTIALS, 0, "deletions", name=name, mechanism=mechanism)


def alter(ctx, deletions=(), upsertions=()):
    r = send(ctx, A.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=tuple(deletions),
             upsertions=tuple(upsertions))
    return sorted((x.user, x.error_code, x.error_message) for x in r.results)


def describe(ctx, *names, all_users=False):
    users = None if all_users else tuple(
        nested(A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, "users", name=n) for n in names)
    r = send(ctx, A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=users)
    assert (r.error_code, r.error_message) == (0, None)
    return [(x.user, x.error_code, x.error_message,
             [(c.mechanism, c.iterations) for c in x.credential_infos]) for x in r.results]


def test_alter_nothing(broker):
    ctx, _, _ = broker
    assert alter(ctx) == []


def test_alter_and_describe(broker):
    ctx, _, _ = broker
    assert alter(ctx, upsertions=[upsert("user1")]) == [("user1", 0, None)]
    assert alter(ctx, upsertions=[upsert("user1", 2, 8192), upsert("user2", 2, 8192),
                                  upsert("user3@user3.com", 2, 8192)]) == [
        ("user1", 0, None), ("user2", 0, None), ("user3@user3.com", 0, None)]
    assert describe(ctx, all_users=True) == [
        ("user1", 0, None, [(1, 4096), (2, 8192)]),
        ("user2", 0, None, [(2, 8192)]),
        ("user3@user3.com", 0, None, [(2, 8192)])]
    assert describe(ctx) == describe(ctx, all_users=True)   # an empty list is every user
    assert describe(ctx, "user1", "unknownUser") == [
        ("user1", 0, None, [(1, 4096), (2, 8192)]),
        ("unknownUser", ErrorCode.RESOURCE_NOT_FOUND,
         "Attempt to describe a user credential that does not exist: unknownUser", [])]
    assert describe(ctx, "user1", "user1") == [
        ("user1", ErrorCode.DUPLICATE_RESOURCE,
         "Cannot describe SCRAM credentials for the same user twice in a single request: user1",
         [])]
    # deletions
    assert alter(ctx, deletions=[delete("user1", 1), delete("user2", 2)]) == [
        ("user1", 0, None), ("user2", 0, None)]
    assert describe(ctx, all_users=True) == [("user1", 0, None, [(2, 8192)]),
                                             ("user3@user3.com", 0, None, [(2, 8192)])]
    assert alter(ctx, deletions=[delete("user1", 2), delete("user3@user3.com", 2)]) == [
        ("user1", 0, None), ("user3@user3.com", 0, None)]
    assert describe(ctx, all_users=True) == []


def test_the_stored_credential_is_kafkas_from_the_salted_password(broker):
    ctx, _, _ = broker
    fmt = ScramFormatter(SCRAM_SHA_512)
    salted = fmt.salted_password("alice-secret", b"0123456789abcdef", 4096)
    assert alter(ctx, upsertions=[upsert("alice", 2, 4096, b"0123456789abcdef", salted)]) == [
        ("alice", 0, None)]
    stored = ctx.metadata.scram_credential("alice", "SCRAM-SHA-512")
    assert stored == fmt.credential(b"0123456789abcdef", salted, 4096)
    assert ctx.metadata.scram_credential("alice", "SCRAM-SHA-256") is None
    assert ctx.metadata.scram_credential("bob", "SCRAM-SHA-512") is None
    # the SCRAM server takes it: a scramp client with the password authenticates
    server = ScramServer(SCRAM_SHA_512, ctx.metadata.scram_credential)
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "alice-secret")
    client.set_server_first(server.evaluate(client.get_client_first().encode()).decode())
    client.set_server_final(server.evaluate(client.get_client_final().encode()).decode())
    assert server.complete


def test_altering_the_same_user_twice(broker):
    ctx, _, _ = broker
    assert alter(ctx, upsertions=[upsert("user1"), upsert("user2")]) == [
        ("user1", 0, None), ("user2", 0, None)]
    dup = "A user credential cannot be altered twice in the same request"
    for deletions, upsertions in (([delete("user1"), delete("user1")],
                                   [upsert("user2"), upsert("user2")]),
                                  ([delete("user1"), delete("user2")],
                                   [upsert("user1"), upsert("user2")]),
                                  ([], [upsert("user1", 1), upsert("user1", 2),
                                        upsert("user2", 1), upsert("user2", 2)])):
        assert alter(ctx, deletions, upsertions) == [
            ("user1", ErrorCode.DUPLICATE_RESOURCE, dup),
            ("user2", ErrorCode.DUPLICATE_RESOURCE, dup)]
    # nothing changed
    assert describe(ctx, all_users=True) == [("user1", 0, None, [(1, 4096)]),
                                             ("user2", 0, None, [(1, 4096)])]


def test_empty_user_names(broker):
    ctx, _, _ = broker
    for deletions, upsertions in (([delete("")], []), ([], [upsert("")]),
                                  ([delete(""), delete("")], [upsert("")])):
        assert alter(ctx, deletions, upsertions) == [
            ("", ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")]


def test_unknown_mechanisms(broker):
    ctx, _, _ = broker
    results = alter(ctx, deletions=[delete("user1", 0), delete("user1", 1), delete("user2", 10)],
                    upsertions=[upsert("user4", 0, 8192), upsert("user4", 1, 8192),
                                upsert("user5", 10, 8192), upsert("user6", 0, 8192)])
    assert results == [(u, ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
                       for u in ("user1", "user2", "user4", "user5", "user6")]


@pytest.mark.parametrize("iterations, message", [
    (1, "Too few iterations"), (4095, "Too few iterations"), (16385, "Too many iterations"),
    (2**31 - 1, "Too many iterations")])
def test_iterations_out_of_bounds(broker, iterations, message):
    ctx, _, _ = broker
    assert alter(ctx, upsertions=[upsert("user1", 1, iterations)]) == [
        ("user1", ErrorCode.UNACCEPTABLE_CREDENTIAL, message)]
    assert alter(ctx, upsertions=[upsert("user1", 2, 16384)]) == [("user1", 0, None)]


def test_deleting_a_credential_that_does_not_exist(broker):
    ctx, _, _ = broker
    assert alter(ctx, upsertions=[upsert("user1", 2)]) == [("user1", 0, None)]
    missing = "Attempt to delete a user credential that does not exist"
    assert alter(ctx, deletions=[delete("user1", 1), delete("ghost", 2)]) == [
        ("ghost", ErrorCode.RESOURCE_NOT_FOUND, missing),
        ("user1", ErrorCode.RESOURCE_NOT_FOUND, missing)]
    # a user with a failure has nothing of the request applied; the others do
    assert alter(ctx, deletions=[delete("ghost", 1)],
                 upsertions=[upsert("ghost", 2), upsert("user2", 1)]) == [
        ("ghost", ErrorCode.RESOURCE_NOT_FOUND, missing), ("user2", 0, None)]
    assert describe(ctx, all_users=True) == [("user1", 0, None, [(2, 4096)]),
                                             ("user2", 0, None, [(1, 4096)])]


def test_credentials_live_in_the_metadata_file_and_survive_a_restart(broker, tmp_path):
    ctx, _, _ = broker
    metadata = ctx.metadata
    fmt = ScramFormatter(SCRAM_SHA_256)
    salted = fmt.salted_password("pw", b"0123456789abcdef", 8192)
    assert alter(ctx, upsertions=[upsert("alice", 1, 8192, b"0123456789abcdef", salted),
                                  upsert("bob", 2)]) == [("alice", 0, None), ("bob", 0, None)]
    doc = json.loads((metadata.log_dir / METADATA_FILE).read_text())
    assert sorted(doc["users"]) == ["alice", "bob"]
    assert list(doc["users"]["alice"]) == ["SCRAM-SHA-256"]
    text = doc["users"]["alice"]["SCRAM-SHA-256"]
    assert text.startswith("salt=MDEyMzQ1Njc4OWFiY2RlZg==,stored_key=") and \
        text.endswith(",iterations=8192")
    assert credential_from_string(text) == fmt.credential(b"0123456789abcdef", salted, 8192)
    # other writers of the file keep the users; other entries of a user are kept by alterations
    metadata.create_topic("orders", 1, 1)
    doc = json.loads((metadata.log_dir / METADATA_FILE).read_text())
    doc["users"]["alice"]["producer_byte_rate"] = "1024"
    (metadata.log_dir / METADATA_FILE).write_text(json.dumps(doc))
    reopened = ClusterMetadata(metadata.log_dir, 1, metadata.broker_props)
    assert reopened.scram_credential("alice", "SCRAM-SHA-256") == \
        metadata.scram_credential("alice", "SCRAM-SHA-256")
    assert "orders" in reopened.topics()
    reopened.alter_user_scram_credentials([Deletion("alice", 1)], [Upsertion("carol", 2, 4096,
                                                                             SALT, SALTED)])
    doc = json.loads((metadata.log_dir / METADATA_FILE).read_text())
    assert doc["users"]["alice"] == {"producer_byte_rate": "1024"}
    assert sorted(doc["users"]) == ["alice", "bob", "carol"]
    assert [r.user for r in reopened.describe_user_scram_credentials(None)] == ["bob", "carol"]
    reopened.alter_user_scram_credentials([Deletion("bob", 2), Deletion("carol", 2)], [])
    doc = json.loads((metadata.log_dir / METADATA_FILE).read_text())
    assert doc["users"] == {"alice": {"producer_byte_rate": "1024"}}


def test_plan_keeps_a_users_other_entries():
    results, changes = plan_alteration([], [Upsertion("alice", 1, 4096, SALT, SALTED)],
                                       lambda u, m: False)
    assert [(r.user, r.error) for r in results] == [("alice", ErrorCode.NONE)]
    config = apply_changes({"producer_byte_rate": "1024", "SCRAM-SHA-512": "x"}, changes["alice"])
    assert config["producer_byte_rate"] == "1024" and config["SCRAM-SHA-512"] == "x"
    assert credential_from_string(config["SCRAM-SHA-256"]).iterations == 4096
    assert apply_changes(config, {"SCRAM-SHA-256": None, "SCRAM-SHA-512": None}) == {
        "producer_byte_rate": "1024"}
