"""Strata's StandardAuthorizer against the cases of Kafka's StandardAuthorizerTest and
AclAuthorizerTest: literal, prefixed and wildcard patterns, DENY over ALLOW, super users,
implied operations, host filters, User:*, allow.everyone.if.no.acl.found; filters as Kafka's
AclBindingFilter matches them; what CreateAcls refuses; the audit log."""

from __future__ import annotations

import logging

import pytest

from strata.common.errors import InvalidConfigError
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, AclBindingFilter, AclError, ResourcePattern,
    StandardAuthorizer, authorizer_enabled, validate_binding)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, Action, PatternType as PT,
    ResourceType as RT)
from strata.security.sasl import KafkaPrincipal

ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")
HOST = "192.168.0.1"


def binding(name, op, perm=Perm.ALLOW, principal="User:alice", host="*", rtype=RT.TOPIC,
            pt=PT.LITERAL):
    return AclBinding(ResourcePattern(rtype, name, pt), AccessControlEntry(principal, host, op, perm))


def authorizer(*bindings, **kwargs) -> StandardAuthorizer:
    a = StandardAuthorizer(**kwargs).start()
    assert a.create_acls(list(bindings)) == [None] * len(bindings)
    return a


def allowed(a, principal, op, name, rtype=RT.TOPIC, host=HOST) -> bool:
    return a.authorize(principal, host, [Action(op, rtype, name)])[0]


def test_no_acls_denies_unless_allow_everyone_if_no_acl_found():
    assert not allowed(authorizer(), ALICE, Op.READ, "foo")
    assert allowed(authorizer(allow_everyone_if_no_acl_found=True), ALICE, Op.READ, "foo")


def test_allow_everyone_if_no_acl_found_only_for_resources_without_any_binding():
    a = authorizer(binding("foo", Op.READ, principal="User:bob"),
                   allow_everyone_if_no_acl_found=True)
    assert not allowed(a, ALICE, Op.READ, "foo")   # foo has bindings, none for alice
    assert allowed(a, BOB, Op.READ, "foo")
    assert allowed(a, ALICE, Op.READ, "bar")


def test_literal_binding_allows_only_its_resource_and_operation():
    a = authorizer(binding("foo", Op.READ))
    assert allowed(a, ALICE, Op.READ, "foo")
    assert not allowed(a, ALICE, Op.WRITE, "foo")
    assert not allowed(a, ALICE, Op.READ, "foobar")
    assert not allowed(a, BOB, Op.READ, "foo")
    assert not allowed(a, ALICE, Op.READ, "foo", rtype=RT.GROUP)


def test_prefixed_binding_matches_names_starting_with_it():
    a = authorizer(binding("foo", Op.READ, pt=PT.PREFIXED))
    assert allowed(a, ALICE, Op.READ, "foo")
    assert allowed(a, ALICE, Op.READ, "foobar")
    assert not allowed(a, ALICE, Op.READ, "fo")
    assert not allowed(a, ALICE, Op.READ, "barfoo")


def test_several_prefixes_of_one_name_all_apply_and_deny_on_a_shorter_prefix_wins():
    a = authorizer(binding("foo.bar", Op.WRITE, pt=PT.PREFIXED),
                   binding("foo.", Op.WRITE, Perm.DENY, pt=PT.PREFIXED),
                   binding("f", Op.READ, pt=PT.PREFIXED))
    assert not allowed(a, ALICE, Op.WRITE, "foo.bar.baz")
    assert allowed(a, ALICE, Op.READ, "foo.bar.baz")
    assert allowed(a, ALICE, Op.READ, "fa")


def test_literal_binding_that_is_a_prefix_of_the_name_does_not_apply():
    a = authorizer(binding("foob", Op.READ), binding("fo", Op.WRITE, pt=PT.PREFIXED))
    assert not allowed(a, ALICE, Op.READ, "foobar")
    assert allowed(a, ALICE, Op.WRITE, "foobar")


def test_wildcard_resource_matches_every_name_of_its_type():
    a = authorizer(binding("*", Op.READ))
    assert allowed(a, ALICE, Op.READ, "anything")
    assert allowed(a, ALICE, Op.READ, "*")
    assert not allowed(a, ALICE, Op.READ, "anything", rtype=RT.GROUP)


def test_deny_wins_over_allow_on_any_matching_pattern():
    a = authorizer(binding("*", Op.READ), binding("foo", Op.READ, Perm.DENY))
    assert not allowed(a, ALICE, Op.READ, "foo")
    assert allowed(a, ALICE, Op.READ, "bar")
    b = authorizer(binding("foo", Op.ALL), binding("*", Op.WRITE, Perm.DENY, principal="User:*"))
    assert not allowed(b, ALICE, Op.WRITE, "foo")
    assert allowed(b, ALICE, Op.READ, "foo")


def test_wildcard_principal_applies_to_every_user():
    a = authorizer(binding("foo", Op.READ, principal="User:*"),
                   binding("foo", Op.READ, Perm.DENY, principal="User:bob"))
    assert allowed(a, ALICE, Op.READ, "foo")
    assert allowed(a, KafkaPrincipal("User", "ANONYMOUS"), Op.READ, "foo")
    assert not allowed(a, BOB, Op.READ, "foo")


def test_host_filters_match_the_exact_address_or_star():
    a = authorizer(binding("foo", Op.READ, host="10.0.0.1"),
                   binding("foo", Op.WRITE, Perm.DENY, host="10.0.0.2"),
                   binding("foo", Op.WRITE))
    assert allowed(a, ALICE, Op.READ, "foo", host="10.0.0.1")
    assert not allowed(a, ALICE, Op.READ, "foo", host="10.0.0.2")
    assert allowed(a, ALICE, Op.WRITE, "foo", host="10.0.0.1")
    assert not allowed(a, ALICE, Op.WRITE, "foo", host="10.0.0.2")


def test_all_allows_and_denies_every_operation():
    a = authorizer(binding("foo", Op.ALL))
    for op in (Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE,
               Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS):
        assert allowed(a, ALICE, op, "foo")
    d = authorizer(binding("foo", Op.ALL), binding("foo", Op.ALL, Perm.DENY, principal="User:*"))
    assert not allowed(d, ALICE, Op.DESCRIBE, "foo")


@pytest.mark.parametrize("op", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_allow_of_read_write_delete_alter_implies_describe(op):
    a = authorizer(binding("foo", op))
    assert allowed(a, ALICE, Op.DESCRIBE, "foo")
    assert not allowed(a, ALICE, Op.DESCRIBE_CONFIGS, "foo")


@pytest.mark.parametrize("op", [Op.CREATE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
                                Op.IDEMPOTENT_WRITE])
def test_other_operations_do_not_imply_describe(op):
    assert not allowed(authorizer(binding("foo", op)), ALICE, Op.DESCRIBE, "foo")


def test_alter_configs_implies_describe_configs_but_not_the_reverse():
    assert allowed(authorizer(binding("foo", Op.ALTER_CONFIGS)), ALICE, Op.DESCRIBE_CONFIGS, "foo")
    assert not allowed(authorizer(binding("foo", Op.DESCRIBE_CONFIGS)), ALICE, Op.ALTER_CONFIGS,
                       "foo")


def test_a_deny_of_read_does_not_deny_describe():
    a = authorizer(binding("foo", Op.DESCRIBE), binding("foo", Op.READ, Perm.DENY))
    assert allowed(a, ALICE, Op.DESCRIBE, "foo")
    assert not allowed(a, ALICE, Op.READ, "foo")


def test_super_users_are_allowed_everything_whatever_the_bindings():
    a = StandardAuthorizer.from_properties({"super.users": "User:admin; User:broker"}).start()
    a.create_acls([binding("*", Op.ALL, Perm.DENY, principal="User:*")])
    assert allowed(a, KafkaPrincipal("User", "admin"), Op.WRITE, "foo")
    assert allowed(a, KafkaPrincipal("User", "broker"), Op.CLUSTER_ACTION, "kafka-cluster",
                   rtype=RT.CLUSTER)
    assert not allowed(a, ALICE, Op.WRITE, "foo")


def test_properties_read_allow_everyone_and_refuse_bad_values():
    assert StandardAuthorizer.from_properties(
        {"allow.everyone.if.no.acl.found": "true"}).allow_if_no_acl
    with pytest.raises(InvalidConfigError):
        StandardAuthorizer.from_properties({"allow.everyone.if.no.acl.found": "yes"})


def test_authorizer_class_names_kafka_knows_turn_it_on_and_others_fail_startup():
    assert not authorizer_enabled({})
    assert authorizer_enabled(
        {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
    assert authorizer_enabled({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    with pytest.raises(InvalidConfigError, match="com.example.Mine"):
        authorizer_enabled({"authorizer.class.name": "com.example.Mine"})


def test_one_call_decides_each_action_in_order():
    a = authorizer(binding("foo", Op.READ), binding("bar", Op.WRITE))
    assert a.authorize(ALICE, HOST, [Action(Op.READ, RT.TOPIC, "foo"),
                                     Action(Op.READ, RT.TOPIC, "bar"),
                                     Action(Op.WRITE, RT.TOPIC, "bar")]) == [True, False, True]


def test_removing_bindings_takes_effect_and_prefix_index_follows():
    a = authorizer(binding("foo", Op.READ, pt=PT.PREFIXED), binding("fo", Op.READ, pt=PT.PREFIXED))
    a.delete_acls([AclBindingFilter(name="foo", pattern_type=PT.PREFIXED)])
    assert allowed(a, ALICE, Op.READ, "foobar")   # "fo" still there
    a.delete_acls([AclBindingFilter(name="fo", pattern_type=PT.PREFIXED)])
    assert not allowed(a, ALICE, Op.READ, "foobar")
    assert a.acls() == []


# ---- filters (Kafka's AclBindingFilterTest, ResourcePatternFilterTest) --------------------------

LIT = ResourcePattern(RT.TOPIC, "foo", PT.LITERAL)
PRE = ResourcePattern(RT.TOPIC, "fo", PT.PREFIXED)
WILD = ResourcePattern(RT.TOPIC, "*", PT.LITERAL)


def test_filter_any_pattern_type_matches_the_exact_name_only():
    f = AclBindingFilter(RT.TOPIC, "foo", PT.ANY)
    assert f.matches_pattern(LIT)
    assert not f.matches_pattern(PRE)
    assert not f.matches_pattern(WILD)
    assert f.matches_pattern(ResourcePattern(RT.TOPIC, "foo", PT.PREFIXED))


def test_filter_match_pattern_type_matches_what_applies_to_the_name():
    f = AclBindingFilter(RT.TOPIC, "foo", PT.MATCH)
    assert f.matches_pattern(LIT) and f.matches_pattern(PRE) and f.matches_pattern(WILD)
    assert not f.matches_pattern(ResourcePattern(RT.TOPIC, "foobar", PT.PREFIXED))
    assert not f.matches_pattern(ResourcePattern(RT.GROUP, "foo", PT.LITERAL))


def test_filter_specific_pattern_type_and_null_name():
    assert AclBindingFilter(RT.TOPIC, None, PT.PREFIXED).matches_pattern(PRE)
    assert not AclBindingFilter(RT.TOPIC, None, PT.PREFIXED).matches_pattern(LIT)
    assert AclBindingFilter(RT.ANY).matches_pattern(ResourcePattern(RT.GROUP, "g", PT.LITERAL))
    assert not AclBindingFilter(RT.TOPIC, "*", PT.LITERAL).matches_pattern(LIT)


def test_entry_filter_fields():
    e = AccessControlEntry("User:alice", "*", Op.READ, Perm.ALLOW)
    assert AclBindingFilter().matches_entry(e)
    assert AclBindingFilter(principal="User:alice", host="*", operation=Op.READ,
                            permission_type=Perm.ALLOW).matches_entry(e)
    assert not AclBindingFilter(principal="User:bob").matches_entry(e)
    assert not AclBindingFilter(host="10.0.0.1").matches_entry(e)
    assert not AclBindingFilter(operation=Op.ALL).matches_entry(e)
    assert not AclBindingFilter(permission_type=Perm.DENY).matches_entry(e)


def test_describe_and_delete_use_filters():
    a = authorizer(binding("foo", Op.READ), binding("foo", Op.WRITE, principal="User:bob"),
                   binding("fo", Op.READ, pt=PT.PREFIXED), binding("g", Op.READ, rtype=RT.GROUP))
    assert len(a.acls(AclBindingFilter(RT.TOPIC, "foo", PT.MATCH))) == 3
    assert {b.entry.principal for b in a.acls(AclBindingFilter(principal="User:bob"))} == {
        "User:bob"}
    [(error, deleted)] = a.delete_acls([AclBindingFilter(RT.TOPIC, "foo", PT.MATCH,
                                                         principal="User:alice")])
    assert error is None
    assert sorted(b.pattern.name for b, e in deleted) == ["fo", "foo"]
    assert [b.entry.principal for b in a.acls(AclBindingFilter(RT.TOPIC))] == ["User:bob"]


def test_delete_with_an_unknown_filter_is_refused_and_deletes_nothing():
    a = authorizer(binding("foo", Op.READ))
    [(error, deleted)] = a.delete_acls([AclBindingFilter(operation=Op.UNKNOWN)])
    assert isinstance(error, AclError) and deleted == []
    assert len(a.acls()) == 1


def test_creating_an_existing_binding_succeeds_once_stored():
    a = authorizer(binding("foo", Op.READ))
    assert a.create_acls([binding("foo", Op.READ)]) == [None]
    assert len(a.acls()) == 1


@pytest.mark.parametrize("bad", [
    binding("foo", Op.READ, pt=PT.ANY), binding("foo", Op.READ, pt=PT.MATCH),
    binding("foo", Op.READ, pt=PT.UNKNOWN), binding("*", Op.READ, pt=PT.PREFIXED),
    binding("foo", Op.ANY), binding("foo", Op.UNKNOWN), binding("foo", Op.READ, Perm.ANY),
    binding("foo", Op.READ, rtype=RT.ANY), binding("foo", Op.READ, rtype=RT.UNKNOWN),
    binding("", Op.READ), binding("other", Op.ALTER, rtype=RT.CLUSTER),
    binding("foo", Op.READ, principal="alice"), binding("a/b", Op.READ)])
def test_bindings_kafka_refuses(bad):
    with pytest.raises(AclError):
        validate_binding(bad)
    a = authorizer()
    [error] = a.create_acls([bad])
    assert isinstance(error, AclError)
    assert a.acls() == []


def test_audit_log_denials_at_info_allows_at_debug(caplog):
    a = authorizer(binding("foo", Op.READ))
    with caplog.at_level(logging.INFO, logger="kafka.authorizer.logger"):
        allowed(a, ALICE, Op.READ, "foo")
        allowed(a, ALICE, Op.WRITE, "foo")
        a.authorize(ALICE, HOST, [Action(Op.WRITE, RT.TOPIC, "quiet", log_if_denied=False)])
    messages = [r.getMessage() for r in caplog.records if r.name == "kafka.authorizer.logger"]
    assert messages == [
        "Principal = User:alice is Denied operation = WRITE from host = 192.168.0.1 on resource "
        "= Topic:LITERAL:foo with resourceRefCount = 1 based on rule DefaultDeny"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kafka.authorizer.logger"):
        allowed(a, ALICE, Op.READ, "foo")
    [record] = [r for r in caplog.records if r.name == "kafka.authorizer.logger"]
    assert record.levelno == logging.DEBUG
    assert record.getMessage().startswith("Principal = User:alice is Allowed operation = READ")
    assert "MatchingAcl(" in record.getMessage()


# ---- authorizeByResourceType (Kafka's AuthorizerTest / AclAuthorizerTest cases) -----------------

def by_type(a, principal=ALICE, op=Op.WRITE, rtype=RT.TOPIC, host=HOST) -> bool:
    return a.authorize_by_resource_type(principal, host, op, rtype)


def test_by_resource_type_needs_an_allow_not_dominated_by_a_deny():
    assert not by_type(authorizer())
    assert by_type(authorizer(binding("t1", Op.WRITE)))
    assert not by_type(authorizer(binding("t1", Op.READ)))          # another operation
    assert by_type(authorizer(binding("t1", Op.ALL)))
    assert not by_type(authorizer(binding("t1", Op.WRITE, principal="User:bob")))
    assert by_type(authorizer(binding("t1", Op.WRITE, principal="User:*")))
    assert not by_type(authorizer(binding("t1", Op.WRITE, host="10.9.9.9")))
    # a literal deny of the same name, a prefixed deny of a prefix of it: dominated
    assert not by_type(authorizer(binding("t1", Op.WRITE), binding("t1", Op.WRITE, Perm.DENY)))
    assert not by_type(authorizer(binding("t1", Op.WRITE),
                                  binding("t", Op.WRITE, Perm.DENY, pt=PT.PREFIXED)))
    assert not by_type(authorizer(binding("t1", Op.WRITE, pt=PT.PREFIXED),
                                  binding("t1", Op.WRITE, Perm.DENY, pt=PT.PREFIXED)))
    # a literal deny does not dominate a prefixed allow of the same name
    assert by_type(authorizer(binding("t1", Op.WRITE, pt=PT.PREFIXED),
                              binding("t1", Op.WRITE, Perm.DENY)))
    # one allow left undominated is enough
    assert by_type(authorizer(binding("t1", Op.WRITE), binding("u1", Op.WRITE),
                              binding("t", Op.WRITE, Perm.DENY, pt=PT.PREFIXED)))


def test_by_resource_type_wildcards_and_super_users():
    assert not by_type(authorizer(binding("t1", Op.WRITE), binding("*", Op.WRITE, Perm.DENY)))
    assert by_type(authorizer(binding("*", Op.WRITE), binding("t1", Op.WRITE, Perm.DENY)))
    a = authorizer(binding("*", Op.ALL, Perm.DENY, principal="User:*"),
                   super_users=["User:alice"])
    assert by_type(a)
    assert not by_type(a, BOB)
    assert by_type(authorizer(allow_everyone_if_no_acl_found=True))
    # the made-up name has no bindings: allow.everyone.if.no.acl.found allows it
    assert by_type(authorizer(binding("t1", Op.WRITE, principal="User:bob"),
                              allow_everyone_if_no_acl_found=True))


def test_audit_log_names_the_request_being_handled(caplog):
    from strata.protocol.codec import ApiKey
    from strata.security.authorizer import CURRENT_REQUEST
    a = authorizer(binding("foo", Op.READ))
    token = CURRENT_REQUEST.set(ApiKey.LIST_OFFSETS)
    try:
        with caplog.at_level(logging.INFO, logger="kafka.authorizer.logger"):
            allowed(a, BOB, Op.DESCRIBE, "foo")
    finally:
        CURRENT_REQUEST.reset(token)
    [message] = [r.getMessage() for r in caplog.records if r.name == "kafka.authorizer.logger"]
    assert message == (
        "Principal = User:bob is Denied operation = DESCRIBE from host = 192.168.0.1 on resource "
        "= Topic:LITERAL:foo for request = ListOffsets with resourceRefCount = 1 based on rule "
        "DefaultDeny")


def test_a_definite_delete_filter_reaches_bindings_this_broker_has_not_seen_yet():
    from strata.security.acl_authorizer import MemoryAclStore
    store = MemoryAclStore()
    here = StandardAuthorizer(store).start()          # follows no changes: a lagging broker
    there = StandardAuthorizer(store).start()
    there.create_acls([binding("foo", Op.READ), binding("foo", Op.READ, pt=PT.PREFIXED)])
    assert here.acls() == []
    [(error, deleted)] = here.delete_acls([AclBindingFilter(RT.TOPIC, "foo", PT.ANY)])
    assert error is None
    assert sorted(b.pattern.pattern_type for b, _ in deleted) == [PT.LITERAL, PT.PREFIXED]
    assert store.load() == {}


def test_a_store_failure_is_an_unknown_server_error_for_each_binding():
    from strata.common.errors import ErrorCode
    from strata.security.acl_authorizer import MemoryAclStore

    class Broken(MemoryAclStore):
        def update(self, resource, change):
            raise OSError("disk gone")
    a = StandardAuthorizer(Broken()).start()
    errors = a.create_acls([binding("foo", Op.READ), binding("foo", Op.WRITE)])
    assert [e.code for e in errors] == [ErrorCode.UNKNOWN_SERVER_ERROR] * 2
    assert "disk gone" in str(errors[0])
    assert a.acls() == []
