"""AlterClientQuotas v0-1: set or remove quota values of user / client-id / ip entities, with
Kafka's per-entity INVALID_REQUEST errors; ``validate_only`` checks without changing anything.
The rules live in ``ClientQuotaStore.alter``."""

from __future__ import annotations

import asyncio

from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


def _entries(body) -> list[tuple[list, list]]:
    return [([(e.entity_type, e.entity_name) for e in entry.entity],
             [(op.key, None if op.remove else float(op.value)) for op in entry.ops])
            for entry in body.entries]


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    denied = cluster_denied(ctx, request, AclOperation.ALTER_CONFIGS)  # Kafka: ALTER_CONFIGS on the cluster
    if denied is not None:
        return denied
    # the store writes its file (fsync) when something changes: off the event loop
    results = await asyncio.to_thread(ctx.client_quotas.alter, _entries(body), body.validate_only)
    return make(rc, entries=tuple(
        make(rc, "entries", error_code=kio_error_code(code), error_message=message,
             entity=tuple(make(rc, "entries.entity", entity_type=e.entity_type,
                               entity_name=e.entity_name) for e in entry.entity))
        for entry, (code, message) in zip(body.entries, results)))
