"""Principals of TLS clients: the certificate's distinguished name as Kafka writes it, mapped by
``ssl.principal.mapping.rules`` (cases from Kafka's ``SslPrincipalMapperTest``)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization

from strata.security.principal import (
    PrincipalMappingError, map_name, parse_mapping_rules, tls_principal)
from strata.security.sasl import ANONYMOUS, KafkaPrincipal
from tls_support import make_ca

RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
         "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
         "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT")


@pytest.mark.parametrize("dn, name", [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "Duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_kafkas_mapping_rules(dn, name):
    assert map_name(dn, parse_mapping_rules(RULES)) == name


def test_default_keeps_the_name_and_bad_rules_are_refused():
    assert map_name("CN=a,O=b", parse_mapping_rules(None)) == "CN=a,O=b"
    with pytest.raises(PrincipalMappingError):
        parse_mapping_rules("RULE:^CN=(.*)$")
    with pytest.raises(PrincipalMappingError):
        map_name("O=x", parse_mapping_rules("RULE:^CN=(.*)$/$1/"))


def test_a_client_certificate_names_the_principal(tmp_path):
    ca = make_ca(tmp_path)
    ca.issue("alice")
    der = ca.certificate.public_bytes(serialization.Encoding.DER)
    assert tls_principal(der, parse_mapping_rules(None)) == KafkaPrincipal("User", "CN=Strata Test CA")
    client = (tmp_path / "alice.pem").read_bytes()
    from cryptography import x509
    cert_der = x509.load_pem_x509_certificate(client).public_bytes(serialization.Encoding.DER)
    assert tls_principal(cert_der, parse_mapping_rules("RULE:^CN=(.*?),O=.*$/$1/,DEFAULT")) \
        == KafkaPrincipal("User", "alice")
    assert tls_principal(None, parse_mapping_rules(None)) == ANONYMOUS
