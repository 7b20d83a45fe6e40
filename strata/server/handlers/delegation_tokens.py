"""CreateDelegationToken v1-3, RenewDelegationToken v1-2, ExpireDelegationToken v1-2 and
DescribeDelegationToken v1-3 (the versions Kafka 4 serves), as Kafka's ``KafkaApis`` answers
them over ``ctx.delegation_tokens`` (``strata.cluster.delegation_tokens``; None when no
``delegation.token.secret.key`` is set: DELEGATION_TOKEN_AUTH_DISABLED).

Kafka's ``allowTokenRequests``: a connection authenticated by a token, a PLAINTEXT one and a TLS
one without a client certificate get DELEGATION_TOKEN_REQUEST_NOT_ALLOWED. A token for another
owner (KIP-373) needs CREATE_TOKENS on that owner's User resource (else
DELEGATION_TOKEN_AUTHORIZATION_FAILED); renewers must be ``User`` principals
(INVALID_PRINCIPAL_TYPE). Describe lists the tokens the caller owns, renews or requested, or
may DESCRIBE (DelegationToken resource) or DESCRIBE_TOKENS (the owner's User resource); an empty
owner list answers no tokens, a null one every owner's."""

from __future__ import annotations

import asyncio
import datetime

from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.security.sasl import ANONYMOUS, KafkaPrincipal
from strata.server.authorization import authorize, caller
from strata.server.handlers.group_common import CURRENT_CONNECTION

NO_THROTTLE = datetime.timedelta(0)
USER_TYPE = "User"


def _ts(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _ms(period: datetime.timedelta) -> int:
    return round(period.total_seconds() * 1000)


def allow_token_requests() -> bool:
    """Kafka's ``KafkaApis.allowTokenRequests``."""
    conn = CURRENT_CONNECTION.get()
    principal = getattr(conn, "principal", None) or ANONYMOUS
    protocol = getattr(conn, "security_protocol", "PLAINTEXT")
    return not (principal.token_authenticated or protocol == "PLAINTEXT"
                or (protocol == "SSL" and principal == ANONYMOUS))


async def handle_create(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    requester, _host = caller()
    owner = (KafkaPrincipal(body.owner_principal_type or USER_TYPE, body.owner_principal_name)
             if getattr(body, "owner_principal_name", None) else requester)
    renewers = [KafkaPrincipal(r.principal_type, r.principal_name) for r in body.renewers]

    def answer(error: ErrorCode, token=None):
        info = token.info if token is not None else None
        return make(rc, error_code=kio_error_code(error), principal_type=owner.type,
                    principal_name=owner.name, token_requester_principal_type=requester.type,
                    token_requester_principal_name=requester.name,
                    issue_timestamp=_ts(info.issue_timestamp if info else -1),
                    expiry_timestamp=_ts(info.expiry_timestamp if info else -1),
                    max_timestamp=_ts(info.max_timestamp if info else -1),
                    token_id=info.token_id if info else "",
                    hmac=token.hmac if token is not None else b"", throttle_time=NO_THROTTLE)

    if not allow_token_requests():
        return answer(ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED)
    if owner != requester and not authorize(ctx, AclOperation.CREATE_TOKENS, ResourceType.USER,
                                            str(owner)):
        return answer(ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED)
    if any(r.type != USER_TYPE for r in renewers):
        return answer(ErrorCode.INVALID_PRINCIPAL_TYPE)
    manager = ctx.delegation_tokens
    if manager is None:
        return answer(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
    result = await asyncio.to_thread(manager.create, owner, requester, renewers,
                                     _ms(body.max_lifetime))
    return answer(result.error, result.token)


async def _renew_or_expire(ctx, request, period: datetime.timedelta, action: str):
    rc = response_class(request.api_key, request.api_version)

    def answer(error: ErrorCode, expiry: int):
        return make(rc, error_code=kio_error_code(error), expiry_timestamp=_ts(expiry),
                    throttle_time=NO_THROTTLE)

    if not allow_token_requests():
        return answer(ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, -1)
    manager = ctx.delegation_tokens
    if manager is None:
        return answer(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED, -1)
    principal, _host = caller()
    error, expiry = await asyncio.to_thread(getattr(manager, action), principal,
                                            request.body.hmac, _ms(period))
    return answer(error, expiry)


async def handle_renew(ctx, request):
    return await _renew_or_expire(ctx, request, request.body.renew_period, "renew")


async def handle_expire(ctx, request):
    return await _renew_or_expire(ctx, request, request.body.expiry_time_period, "expire")


async def handle_describe(ctx, request):
    rc = response_class(request.api_key, request.api_version)

    def answer(error: ErrorCode, tokens=()):
        return make(rc, error_code=kio_error_code(error), tokens=tuple(tokens),
                    throttle_time=NO_THROTTLE)

    if not allow_token_requests():
        return answer(ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED)
    manager = ctx.delegation_tokens
    if manager is None:
        return answer(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED)
    requested = request.body.owners
    if requested is not None and not requested:
        return answer(ErrorCode.NONE)
    owners = None if requested is None else [
        KafkaPrincipal(o.principal_type, o.principal_name) for o in requested]
    principal, _host = caller()
    found = manager.describe(
        principal, owners,
        lambda token_id: authorize(ctx, AclOperation.DESCRIBE, ResourceType.DELEGATION_TOKEN,
                                   token_id),
        lambda owner: authorize(ctx, AclOperation.DESCRIBE_TOKENS, ResourceType.USER,
                                str(owner)))
    return answer(ErrorCode.NONE, (make(
        rc, "tokens", principal_type=t.info.owner.type, principal_name=t.info.owner.name,
        token_requester_principal_type=t.info.token_requester.type,
        token_requester_principal_name=t.info.token_requester.name,
        issue_timestamp=t.info.issue_timestamp, expiry_timestamp=t.info.expiry_timestamp,
        max_timestamp=t.info.max_timestamp, token_id=t.info.token_id, hmac=t.hmac,
        renewers=tuple(make(rc, "tokens.renewers", principal_type=r.type,
                            principal_name=r.name) for r in t.info.renewers))
        for t in found))
