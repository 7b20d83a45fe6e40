"""DescribeUserScramCredentials v0: the mechanisms and iterations of users' SCRAM credentials
(never the credentials), as Kafka 4's ``ScramImage.describe``: no users named is every user
with a credential; a named user without one is RESOURCE_NOT_FOUND, a user named twice
DUPLICATE_RESOURCE, each in Kafka's words."""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    denied = cluster_denied(ctx, request, AclOperation.DESCRIBE)  # Kafka: DESCRIBE on the cluster
    if denied is not None:
        return denied
    users = None if request.body.users is None else [u.name for u in request.body.users]
    try:
        # in a cluster the metadata reads ZooKeeper: off the event loop
        results = await asyncio.to_thread(ctx.metadata.describe_user_scram_credentials, users)
    except KafkaError as exc:
        return make(rc, error_code=kio_error_code(exc.code), error_message=str(exc), results=())
    return make(rc, error_code=kio_error_code(ErrorCode.NONE), error_message=None, results=tuple(
        make(rc, "results", user=r.user, error_code=kio_error_code(r.error),
             error_message=r.message,
             credential_infos=tuple(make(rc, "results.credential_infos", mechanism=m,
                                         iterations=i) for m, i in r.credentials))
        for r in results))
