"""The broker's own SASL logins (``strata.security.sasl_client``): its credentials from the
inter-broker listener's JAAS config, and PLAIN and SCRAM exchanges against Strata's servers."""

from __future__ import annotations

import pytest

from strata.security.sasl import KafkaPrincipal, PlainServer, SaslAuthenticationFailed, SaslConfigError
from strata.security.sasl_client import SaslCredentials, inter_broker_credentials, new_client
from strata.security.scram import MECHANISMS, ScramFormatter, ScramServer


def exchange(client, server) -> None:
    token = client.first()
    while token is not None:
        token = client.next(server.evaluate(token))


def test_plain_logs_in():
    server = PlainServer({"broker": "s3cret"})
    exchange(new_client(SaslCredentials("PLAIN", "broker", "s3cret")), server)
    assert server.principal == KafkaPrincipal("User", "broker")


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_scram_logs_in_and_checks_the_servers_signature(mechanism):
    stored = ScramFormatter(MECHANISMS[mechanism]).generate_credential("s3cret", 4096)
    server = ScramServer(MECHANISMS[mechanism], lambda user, mech: stored)
    exchange(new_client(SaslCredentials(mechanism, "broker", "s3cret")), server)
    assert server.complete and server.principal == KafkaPrincipal("User", "broker")
    with pytest.raises(SaslAuthenticationFailed):
        exchange(new_client(SaslCredentials(mechanism, "broker", "wrong")),
                 ScramServer(MECHANISMS[mechanism], lambda user, mech: stored))
    client = new_client(SaslCredentials(mechanism, "broker", "s3cret"))
    server = ScramServer(MECHANISMS[mechanism], lambda user, mech: stored)
    final = client.next(server.evaluate(client.first()))
    server.evaluate(final)
    with pytest.raises(SaslAuthenticationFailed):    # a forged server-final message
        client.next(b"v=" + b"A" * 88)


def test_inter_broker_credentials_come_from_the_listeners_jaas_config():
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="broker" password="s3cret" user_broker="s3cret";')
    props = {"sasl.mechanism.inter.broker.protocol": "PLAIN",
             "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
             "listener.name.internal.plain.sasl.jaas.config": jaas}
    assert inter_broker_credentials(props, "INTERNAL") == SaslCredentials("PLAIN", "broker", "s3cret")
    with pytest.raises(SaslConfigError, match="no principal"):   # Kafka's default: GSSAPI
        inter_broker_credentials({}, "INTERNAL")
    with pytest.raises(SaslConfigError, match="not among"):
        inter_broker_credentials({**props, "listener.name.internal.sasl.enabled.mechanisms":
                                  "SCRAM-SHA-512"}, "INTERNAL")
