"""Delegation tokens in ZooKeeper as Kafka 3.9 keeps them, between two managers (two brokers'
worth) on one real ZooKeeper: a token made through one logs in on the other through the
``/delegation_token/token_changes`` notifications; a token Kafka wrote (its JSON and
notification) is picked up; renewal and removal propagate; an expired token removed by both
brokers' checks is announced once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from zk_fixtures import chroot, new_client, zk_server  # noqa: F401 - the fixtures
from zk_server import zookeeper_available

from strata.cluster.delegation_tokens import (
    DelegationTokenManager, TokenConfig, ZkTokenStore, create_hmac)
from strata.common.errors import ErrorCode
from strata.security.sasl import KafkaPrincipal
from support.waiting import eventually

_ok, _why = zookeeper_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

ALICE = KafkaPrincipal("User", "alice")


@pytest.fixture
def managers(new_client):
    made = []

    def new(clock=None) -> DelegationTokenManager:
        made.append(DelegationTokenManager(TokenConfig("shared-secret"), ZkTokenStore(new_client()),
                                           **({"clock": clock} if clock else {})).start())
        return made[-1]
    yield new
    for m in made:
        m.close()


@pytest.fixture
def raw(zk_server, chroot) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_server.connect_string(chroot))
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def test_a_token_made_through_one_broker_logs_in_on_the_other(managers, raw):
    one, two = managers(), managers()
    token = one.create(ALICE, ALICE, [], -1).token
    token_id = token.info.token_id
    eventually(lambda: two.token_credential(token_id, "SCRAM-SHA-512"),
               "the other broker knows the token")
    assert two.token_credential(token_id, "SCRAM-SHA-256")[1:] == (
        ALICE, token.info.expiry_timestamp)
    doc = json.loads(raw.get(f"/delegation_token/tokens/{token_id}")[0])
    assert doc == {"version": 3, "owner": "User%3Aalice", "tokenRequester": "User%3Aalice",
                   "renewers": [], "issueTimestamp": token.info.issue_timestamp,
                   "maxTimestamp": token.info.max_timestamp,
                   "expiryTimestamp": token.info.expiry_timestamp, "tokenId": token_id}
    # renewed through the other: the first sees the new expiry
    error, expiry = two.renew(ALICE, token.hmac, 60_000)
    assert error == ErrorCode.NONE
    eventually(lambda: one.token_credential(token_id, "SCRAM-SHA-512")[2] == expiry,
               "the renewal seen by the first")
    # expired now through the first: gone from the other
    assert one.expire(ALICE, token.hmac, -1)[0] == ErrorCode.NONE
    eventually(lambda: two.token_credential(token_id, "SCRAM-SHA-512") is None,
               "the removal seen by the other")
    assert not raw.exists(f"/delegation_token/tokens/{token_id}")


def test_a_token_written_by_kafka_is_picked_up(managers, raw):
    m = managers()
    token_id = "kafka-made-token"
    raw.create(f"/delegation_token/tokens/{token_id}", json.dumps({
        "version": 3, "owner": "User%3Abob", "tokenRequester": "User%3Aalice",
        "renewers": ["User%3Acarol"], "issueTimestamp": 1, "maxTimestamp": 2 ** 50,
        "expiryTimestamp": 2 ** 50, "tokenId": token_id}).encode())
    raw.create("/delegation_token/token_changes/token_change_", token_id.encode(),
               sequence=True)
    found = eventually(lambda: m.token_credential(token_id, "SCRAM-SHA-512"),
                       "the notified token loaded")
    assert found[1] == KafkaPrincipal("User", "bob")
    # the renewer may renew it with the HMAC every broker computes from the shared key
    assert m.renew(KafkaPrincipal("User", "carol"), create_hmac(token_id, "shared-secret"),
                   1000)[0] == ErrorCode.NONE
    assert [t.token_id for t in managers().tokens()] == [token_id]   # a new broker loads it


def test_an_expired_token_removed_by_every_broker_is_announced_once(managers, raw):
    now = [1_700_000_000.0]
    one, two = managers(lambda: now[0]), managers(lambda: now[0])
    token_id = one.create(ALICE, ALICE, [], 1000).token.info.token_id
    eventually(lambda: two.tokens(), "the other broker knows the token")
    before = len(raw.get_children("/delegation_token/token_changes"))
    now[0] += 2
    assert one.expire_tokens() == [token_id]
    two.expire_tokens()
    assert len(raw.get_children("/delegation_token/token_changes")) == before + 1
    eventually(lambda: not two.tokens(), "gone from the other")
