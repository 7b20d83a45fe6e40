"""AlterUserScramCredentials v0: set (from the salt, salted password and iterations the client
computed) or delete users' SCRAM credentials, with Kafka 4's per-user errors; one result per
user named. The rules live in ``cluster/scram_credentials.py``; the metadata stores them (its
file on one broker, ``/config/users/<user>`` in ZooKeeper in a cluster, so that every broker
sees them)."""

from __future__ import annotations

import asyncio

from strata.cluster.scram_credentials import Deletion, Upsertion
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    denied = cluster_denied(ctx, request, AclOperation.ALTER)  # Kafka: ALTER on the cluster
    if denied is not None:
        return denied
    deletions = [Deletion(d.name, int(d.mechanism)) for d in body.deletions or ()]
    upsertions = [Upsertion(u.name, int(u.mechanism), int(u.iterations), bytes(u.salt),
                            bytes(u.salted_password)) for u in body.upsertions or ()]
    # the store writes its file (fsync) or ZooKeeper: off the event loop
    results = await asyncio.to_thread(ctx.metadata.alter_user_scram_credentials,
                                      deletions, upsertions)
    return make(rc, results=tuple(
        make(rc, "results", user=r.user, error_code=kio_error_code(r.error),
             error_message=r.message)
        for r in results))
