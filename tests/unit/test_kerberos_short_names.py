"""sasl.kerberos.principal.to.local.rules as Kafka's KerberosShortNamer applies them: the
principal of a GSSAPI client (User:<short name>) from its Kerberos name."""

from __future__ import annotations

import pytest

from strata.security.kerberos import KerberosName, KerberosShortNamer, NoMatchingRule


def short(rules: str | None, name: str, realm: str = "REALM.COM") -> str:
    return KerberosShortNamer(rules, realm).short_name(KerberosName.parse(name))


def test_kerberos_names_split_into_service_host_and_realm():
    assert KerberosName.parse("App.service-name/example.com@REALM.COM") == \
        KerberosName("App.service-name", "example.com", "REALM.COM")
    assert KerberosName.parse("alice@REALM.COM") == KerberosName("alice", None, "REALM.COM")
    assert KerberosName.parse("alice") == KerberosName("alice")
    assert str(KerberosName.parse("kafka/host@R")) == "kafka/host@R"
    with pytest.raises(ValueError):
        KerberosName.parse("a/b/c@REALM")


def test_default_takes_the_first_component_of_names_in_the_default_realm_only():
    assert short(None, "alice@REALM.COM") == "alice"
    assert short("DEFAULT", "kafka/broker1@REALM.COM") == "kafka"
    assert short(None, "alice") == "alice"        # already simple
    with pytest.raises(NoMatchingRule):
        short(None, "alice@OTHER.COM")


def test_rules_match_by_component_count_and_rewrite_with_sed_substitutions():
    rules = r"RULE:[1:$1](App\..*)s/App\.(.*)/$1/g, RULE:[2:$1](App\..*)s/App\.(.*)/$1/g, DEFAULT"
    assert short(rules, "App.service-name/example.com@REALM.COM") == "service-name"
    assert short(rules, "App.service-name@REALM.COM") == "service-name"
    assert short(rules, "user/host@REALM.COM") == "user"
    # the realm is $0: a rule can take users of another realm
    assert short("RULE:[1:$1@$0](.*@OTHER\\.COM)s/@.*//, DEFAULT", "bob@OTHER.COM") == "bob"


@pytest.mark.parametrize("case, expected", [
    ("L", ["user", "test", "xyz_user_xyz", "service-name", "user"]),
    ("U", ["USER", "TEST", "XYZ_USER_XYZ", "SERVICE-NAME", "USER"])])
def test_rules_can_lower_or_upper_case_the_short_name(case, expected):
    rules = (f"RULE:[1:$1]/{case},RULE:[2:$1](Test.*)s/ABC///{case},"
             f"RULE:[2:$1](ABC.*)s/ABC/XYZ/g/{case},RULE:[2:$1](App\\..*)s/App\\.(.*)/$1/g/{case},"
             f"RULE:[2:$1]/{case},DEFAULT")
    names = ["User@REALM.COM", "TestABC/host@FOO.COM", "ABC_User_ABC/host@FOO.COM",
             "App.SERVICE-name/example.com@REALM.COM", "User/root@REALM.COM"]
    assert [short(rules, n) for n in names] == expected


def test_without_g_only_the_first_match_is_replaced():
    assert short("RULE:[1:$1]s/a/x/", "banana@R") == "bxnana"
    assert short("RULE:[1:$1]s/a/x/g", "banana@R") == "bxnxnx"


def test_a_rule_leaving_a_non_simple_name_fails_instead_of_trying_the_next():
    with pytest.raises(NoMatchingRule, match="Non-simple name"):
        short("RULE:[2:$1/$2],DEFAULT", "kafka/host@REALM.COM")


def test_no_rule_applying_fails():
    with pytest.raises(NoMatchingRule, match="No rules apply"):
        short("RULE:[2:$1]", "alice@REALM.COM")


@pytest.mark.parametrize("rule", ["default", "DEFAUL", "DEFAULT/L", "DEFAULT/g", "rule:[1:$1]",
                                  "rule:[1:$1]/L/U", "RULE:[1:$1/L", "RULE:[1:$1]/l",
                                  "RULE:[2:$1](ABC.*)s/ABC/XYZ/L/g"])
def test_malformed_rules_are_refused(rule):
    with pytest.raises(ValueError, match="Invalid rule"):
        KerberosShortNamer(rule, "REALM.COM")
