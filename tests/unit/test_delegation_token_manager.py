"""Delegation tokens (KIP-48): Kafka's rules for create/renew/expire/describe, expiry and its
cleanup, the HMAC, the stored JSON, and SCRAM logins with ``tokenauth=true``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from strata.cluster.delegation_tokens import (
    DelegationTokenManager, FileTokenStore, TokenConfig, TokenInformation, TOKENS_FILE)
from strata.common.errors import ErrorCode
from strata.security.sasl import KafkaPrincipal, SaslAuthenticationFailed, server_factories
from strata.security.sasl_client import SaslCredentials, _ScramClient
from strata.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, BrokerCredentials, ScramServer

ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")
EVE = KafkaPrincipal("User", "eve")
DAY = 24 * 3600 * 1000


class Clock:
    def __init__(self):
        self.ms = 1_700_000_000_000

    def __call__(self) -> float:
        return self.ms / 1000


def manager(tmp_path, clock=None, **config) -> DelegationTokenManager:
    return DelegationTokenManager(TokenConfig("secret", **config), FileTokenStore(tmp_path),
                                  clock or Clock())


def test_create_gives_kafka_timestamps_and_hmac_sha512_of_the_id(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock)
    token = m.create(ALICE, ALICE, [BOB], -1).token
    info = token.info
    assert info.issue_timestamp == clock.ms
    assert info.max_timestamp == clock.ms + 7 * DAY
    assert info.expiry_timestamp == clock.ms + DAY
    assert token.hmac == hmac.new(b"secret", info.token_id.encode(), hashlib.sha512).digest()
    assert len(info.token_id) == 22 and "=" not in info.token_id
    # a requested lifetime bounds both; one past the maximum is cut to it
    short = m.create(ALICE, ALICE, [], 3600_000).token.info
    assert short.max_timestamp == short.expiry_timestamp == clock.ms + 3600_000
    assert m.create(ALICE, ALICE, [], 30 * DAY).token.info.max_timestamp == clock.ms + 7 * DAY


def test_renew_and_expire_by_owner_or_renewer_only(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock)
    token = m.create(ALICE, ALICE, [BOB], -1).token
    assert m.renew(EVE, token.hmac, 1000) == (ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH, -1)
    assert m.expire(EVE, token.hmac, 1000) == (ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH, -1)
    assert m.renew(ALICE, b"not a token", 1000) == (ErrorCode.DELEGATION_TOKEN_NOT_FOUND, -1)
    clock.ms += 1000
    assert m.renew(BOB, token.hmac, 2 * DAY) == (ErrorCode.NONE, clock.ms + 2 * DAY)
    assert m.renew(ALICE, token.hmac, -1) == (ErrorCode.NONE, clock.ms + DAY)
    assert m.renew(ALICE, token.hmac, 30 * DAY) == (ErrorCode.NONE, token.info.max_timestamp)
    assert m.expire(BOB, token.hmac, 5000) == (ErrorCode.NONE, clock.ms + 5000)
    clock.ms += 5001
    assert m.renew(ALICE, token.hmac, 1000) == (ErrorCode.DELEGATION_TOKEN_EXPIRED, -1)
    assert m.expire(ALICE, token.hmac, 1000) == (ErrorCode.DELEGATION_TOKEN_EXPIRED, -1)
    # a negative period removes the token at once, even an expired one
    assert m.expire(ALICE, token.hmac, -1) == (ErrorCode.NONE, clock.ms)
    assert m.tokens() == []
    assert m.renew(ALICE, token.hmac, 1000) == (ErrorCode.DELEGATION_TOKEN_NOT_FOUND, -1)


def test_describe_shows_own_renewed_requested_or_authorized_tokens(tmp_path):
    m = manager(tmp_path)
    alices = m.create(ALICE, ALICE, [BOB], -1).token.info.token_id
    bobs = m.create(BOB, BOB, [], -1).token.info.token_id
    on_behalf = m.create(EVE, ALICE, [], -1).token.info.token_id   # KIP-373: alice asked

    def ids(principal, owners=None, token_ok=lambda _t: False, owner_ok=lambda _o: False):
        return {t.info.token_id for t in m.describe(principal, owners, token_ok, owner_ok)}

    assert ids(ALICE) == {alices, on_behalf}
    assert ids(BOB) == {alices, bobs}
    assert ids(EVE) == {on_behalf}
    assert ids(EVE, token_ok=lambda t: t == bobs) == {bobs, on_behalf}
    assert ids(EVE, owner_ok=lambda o: o == ALICE) == {alices, on_behalf}
    assert ids(BOB, owners=[BOB]) == {alices, bobs}     # owner or renewer matches a filter
    assert ids(ALICE, owners=[EVE]) == {on_behalf}


def test_expired_tokens_are_removed_by_the_check(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock)
    old = m.create(ALICE, ALICE, [], 1000).token.info.token_id
    kept = m.create(ALICE, ALICE, [], -1).token.info.token_id
    clock.ms += 1001
    assert m.expire_tokens() == [old]
    assert [t.token_id for t in m.tokens()] == [kept]
    assert [t.token_id for t in manager(tmp_path, clock).store.load().values()] == [kept]


def test_tokens_survive_a_restart_in_the_log_dir_as_kafka_json(tmp_path):
    clock = Clock()
    token = manager(tmp_path, clock).create(ALICE, KafkaPrincipal("User", "a:b"), [BOB],
                                            -1).token
    doc = json.loads((tmp_path / TOKENS_FILE).read_text())["tokens"][0]
    assert doc["owner"] == "User%3Aalice" and doc["renewers"] == ["User%3Abob"]
    assert doc["tokenRequester"] == "User%3Aa%3Ab" and doc["version"] == 3
    again = manager(tmp_path, clock).start()
    try:
        assert again.tokens() == [token.info]
        assert again.renew(ALICE, token.hmac, 10)[0] == ErrorCode.NONE
    finally:
        again.close()
    assert TokenInformation.from_json(token.info.to_json()) == token.info


def token_client(token_id: str, password: str, mechanism: str) -> _ScramClient:
    client = _ScramClient(SaslCredentials(mechanism, token_id, password))
    client._bare += ",tokenauth=true"
    return client


def login(server: ScramServer, client: _ScramClient) -> None:
    final = client.next(server.evaluate(client.first()))
    client.next(server.evaluate(final))


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_scram_tokenauth_login_is_the_owner_token_authenticated(tmp_path, mechanism):
    clock = Clock()
    m = manager(tmp_path, clock)
    token = m.create(ALICE, ALICE, [], -1).token
    password = base64.b64encode(token.hmac).decode()
    server = ScramServer(mechanism, lambda _u, _m: None, tokens=m)
    login(server, token_client(token.info.token_id, password, mechanism.name))
    assert server.principal == ALICE and server.principal.token_authenticated
    assert server.credential_expires_ms == token.info.expiry_timestamp
    # a wrong password, an unknown id, an expired token, no tokenauth: refused
    for token_id, pw in ((token.info.token_id, "wrong"), ("nope", password)):
        with pytest.raises(SaslAuthenticationFailed):
            login(ScramServer(mechanism, lambda _u, _m: None, tokens=m),
                  token_client(token_id, pw, mechanism.name))
    with pytest.raises(SaslAuthenticationFailed):   # tokens off on this broker
        login(ScramServer(mechanism, lambda _u, _m: None),
              token_client(token.info.token_id, password, mechanism.name))
    with pytest.raises(SaslAuthenticationFailed):   # without the extension it is a user name
        login(ScramServer(mechanism, lambda _u, _m: None, tokens=m),
              _ScramClient(SaslCredentials(mechanism.name, token.info.token_id, password)))
    clock.ms = token.info.expiry_timestamp + 1
    with pytest.raises(SaslAuthenticationFailed):
        login(ScramServer(mechanism, lambda _u, _m: None, tokens=m),
              token_client(token.info.token_id, password, mechanism.name))


def test_a_listeners_scram_servers_check_tokens_against_the_brokers_credentials(tmp_path):
    """The broker builds its listeners' SCRAM servers from ``BrokerCredentials``: the stored
    credentials and the token manager; a plain credential store has no tokens."""
    m = manager(tmp_path, Clock())
    token = m.create(ALICE, ALICE, [], -1).token
    password = base64.b64encode(token.hmac).decode()
    props = {"sasl.enabled.mechanisms": "SCRAM-SHA-256",
             "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
             "org.apache.kafka.common.security.scram.ScramLoginModule required;"}

    def no_users(user, mechanism):
        return None
    factories = server_factories(props, "SASL_PLAINTEXT", BrokerCredentials(no_users, m))
    server = factories["SCRAM-SHA-256"]()
    login(server, token_client(token.info.token_id, password, "SCRAM-SHA-256"))
    assert server.principal == ALICE and server.principal.token_authenticated
    store = BrokerCredentials(no_users)   # tokens off
    with pytest.raises(SaslAuthenticationFailed):
        login(server_factories(props, "SASL_PLAINTEXT", store)["SCRAM-SHA-256"](),
              token_client(token.info.token_id, password, "SCRAM-SHA-256"))


def test_no_secret_key_means_no_manager():
    assert DelegationTokenManager.from_properties({}, lambda: None) is None
    config = TokenConfig.from_properties({"delegation.token.master.key": "old"})
    assert config.enabled and config.secret_key == "old"
    assert TokenConfig.from_properties({"delegation.token.secret.key": "k"}).secret_key == "k"
