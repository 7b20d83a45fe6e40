"""The four delegation token APIs through the dispatcher, as Kafka's KafkaApis answers them:
which connections may ask (not PLAINTEXT, not a token login, not TLS without a certificate), a
token for another owner needs CREATE_TOKENS on that User, renewers must be Users, Describe is
filtered by ownership or DESCRIBE on the DelegationToken, and no secret key disables them."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import replace

import pytest

from strata.cluster.delegation_tokens import DelegationTokenManager, FileTokenStore, TokenConfig
from strata.common.errors import ErrorCode
from strata.protocol.codec import (
    ApiKey as A, encode_response, make, parse_request, request_class)
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, PatternType as PT, ResourceType as RT)
from strata.security.sasl import ANONYMOUS, KafkaPrincipal
from strata.server.dispatch import Dispatcher
from strata.server.network import ConnectionInfo
from test_group_handlers import context
from wire import client_frame

ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")


class Client:
    """Requests through the dispatcher on a connection of ``principal``; the responses as the
    handler made them, checked to encode (kio's reader refuses Kafka's -1 timestamps)."""

    def __init__(self, ctx, conn):
        self.dispatcher, self.conn = Dispatcher(ctx), conn

    async def send(self, api_key, version, **fields):
        request = parse_request(client_frame(make(request_class(api_key, version), **fields),
                                             correlation_id=5))
        response = await self.dispatcher(request, self.conn)
        assert encode_response(request, response)
        return response

    @staticmethod
    def nested(api_key, version, path, **fields):
        return make(request_class(api_key, version), path, **fields)


class TokenBroker:
    """A broker context with an authorizer and a token manager; ``as_`` a client of it."""

    def __init__(self, tmp_path):
        self.ctx = replace(
            context(), authorizer=StandardAuthorizer(super_users=["User:admin"]).start(),
            delegation_tokens=DelegationTokenManager(TokenConfig("k"), FileTokenStore(tmp_path)))

    @property
    def authorizer(self):
        return self.ctx.authorizer

    @property
    def delegation_tokens(self):
        return self.ctx.delegation_tokens

    def as_(self, principal, protocol="SASL_PLAINTEXT"):
        conn = ConnectionInfo("10.0.0.9:4000", 7, protocol, protocol)
        conn.principal = principal
        return Client(self.ctx, conn)


@pytest.fixture
def broker(tmp_path):
    return TokenBroker(tmp_path)


def create(client, version=3, owner=None, renewers=()):
    return asyncio.run(client.send(
        A.CREATE_DELEGATION_TOKEN, version, owner_principal_type=owner and owner.type,
        owner_principal_name=owner and owner.name, max_lifetime=datetime.timedelta(milliseconds=-1),
        renewers=tuple(Client.nested(A.CREATE_DELEGATION_TOKEN, version, "renewers",
                                     principal_type=r.type, principal_name=r.name)
                       for r in renewers)))


def describe(client, owners=None, version=3):
    return asyncio.run(client.send(A.DESCRIBE_DELEGATION_TOKEN, version, owners=None if owners
                                   is None else tuple(Client.nested(
                                       A.DESCRIBE_DELEGATION_TOKEN, version, "owners",
                                       principal_type=o.type, principal_name=o.name)
                                       for o in owners)))


@pytest.mark.parametrize("principal,protocol", [
    (ANONYMOUS, "PLAINTEXT"), (ANONYMOUS, "SSL"),
    (KafkaPrincipal("User", "alice", token_authenticated=True), "SASL_PLAINTEXT")])
def test_token_requests_not_allowed_on_these_connections(broker, principal, protocol):
    client = broker.as_(principal, protocol)
    assert create(client).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    assert describe(client).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    for api, period in ((A.RENEW_DELEGATION_TOKEN, "renew_period"),
                        (A.EXPIRE_DELEGATION_TOKEN, "expiry_time_period")):
        r = asyncio.run(client.send(api, 2, hmac=b"x", **{
            period: datetime.timedelta(0)}))
        assert r.error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED


def test_tls_with_a_client_certificate_may_create(broker):
    r = create(broker.as_(KafkaPrincipal("User", "CN=alice"), "SSL"))
    assert r.error_code == ErrorCode.NONE and r.principal_name == "CN=alice" and r.token_id


def test_a_token_for_another_owner_needs_create_tokens_on_that_user(broker):
    r = create(broker.as_(ALICE), owner=BOB)
    assert r.error_code == ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED
    assert (r.principal_name, r.token_requester_principal_name) == ("bob", "alice")
    broker.authorizer.create_acls([AclBinding(ResourcePattern(RT.USER, "User:bob", PT.LITERAL),
                                              AccessControlEntry("User:alice", "*",
                                                                 Op.CREATE_TOKENS, Perm.ALLOW))])
    r = create(broker.as_(ALICE), owner=BOB)
    assert r.error_code == ErrorCode.NONE
    assert (r.principal_name, r.token_requester_principal_name) == ("bob", "alice")
    assert [(t.principal_name, t.token_requester_principal_name)
            for t in describe(broker.as_(BOB), [BOB]).tokens] == [("bob", "alice")]


def test_renewers_must_be_users(broker):
    r = create(broker.as_(ALICE), renewers=[KafkaPrincipal("Group", "g")])
    assert r.error_code == ErrorCode.INVALID_PRINCIPAL_TYPE


def test_describe_shows_owned_tokens_or_those_the_caller_may_describe(broker):
    alices = create(broker.as_(ALICE), renewers=[BOB]).token_id
    carols = create(broker.as_(KafkaPrincipal("User", "carol"))).token_id
    assert [t.token_id for t in describe(broker.as_(BOB)).tokens] == [alices]
    assert describe(broker.as_(BOB), owners=[]).tokens == ()    # Kafka: an empty list, none
    eve = KafkaPrincipal("User", "eve")
    assert describe(broker.as_(eve)).tokens == ()
    broker.authorizer.create_acls([AclBinding(
        ResourcePattern(RT.DELEGATION_TOKEN, carols, PT.LITERAL),
        AccessControlEntry("User:eve", "*", Op.DESCRIBE, Perm.ALLOW))])
    assert [t.token_id for t in describe(broker.as_(eve)).tokens] == [carols]
    token = describe(broker.as_(KafkaPrincipal("User", "admin")), [ALICE]).tokens[0]
    assert (token.token_id, [r.principal_name for r in token.renewers]) == (alices, ["bob"])


def test_renew_and_expire_answer_kafkas_errors(broker):
    r = create(broker.as_(ALICE))
    td = datetime.timedelta
    renew = asyncio.run(broker.as_(BOB).send(A.RENEW_DELEGATION_TOKEN, 2, hmac=r.hmac,
                                             renew_period=td(hours=1)))
    assert renew.error_code == ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH
    assert int(renew.expiry_timestamp.timestamp() * 1000) == -1
    renew = asyncio.run(broker.as_(ALICE).send(A.RENEW_DELEGATION_TOKEN, 1, hmac=b"nope",
                                               renew_period=td(hours=1)))
    assert renew.error_code == ErrorCode.DELEGATION_TOKEN_NOT_FOUND
    renew = asyncio.run(broker.as_(ALICE).send(A.RENEW_DELEGATION_TOKEN, 2, hmac=r.hmac,
                                               renew_period=td(hours=1)))
    assert renew.error_code == ErrorCode.NONE
    assert r.issue_timestamp + td(hours=1) <= renew.expiry_timestamp < r.expiry_timestamp
    gone = asyncio.run(broker.as_(ALICE).send(A.EXPIRE_DELEGATION_TOKEN, 2, hmac=r.hmac,
                                              expiry_time_period=td(milliseconds=-1)))
    assert gone.error_code == ErrorCode.NONE and broker.delegation_tokens.tokens() == []


def test_no_secret_key_disables_every_token_api(broker):
    broker.ctx = replace(broker.ctx, delegation_tokens=None)
    client = broker.as_(ALICE)
    assert create(client).error_code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED
    assert describe(client).error_code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED
