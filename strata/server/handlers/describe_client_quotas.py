"""DescribeClientQuotas v0-1: the configured quota entities matching a filter (Kafka's
``ClientQuotasImage.describe``); a bad filter is a top-level error with Kafka's message."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import cluster_denied


async def handle(ctx, request):
    body = request.body
    denied = cluster_denied(ctx, request, AclOperation.DESCRIBE_CONFIGS)  # Kafka: DESCRIBE_CONFIGS on the cluster
    if denied is not None:
        return denied
    rc = response_class(request.api_key, request.api_version)
    components = [(c.entity_type, int(c.match_type), c.match) for c in body.components]
    try:
        found = ctx.client_quotas.describe(components, body.strict)
    except KafkaError as exc:
        return make(rc, error_code=kio_error_code(exc.code), error_message=str(exc), entries=None)
    entries = tuple(
        make(rc, "entries",
             entity=tuple(make(rc, "entries.entity", entity_type=t, entity_name=n)
                          for t, n in entity),
             values=tuple(make(rc, "entries.values", key=k, value=v)
                          for k, v in sorted(values.items())))
        for entity, values in found)
    return make(rc, error_code=kio_error_code(ErrorCode.NONE), error_message=None, entries=entries)
