"""CreateAcls v1-3 (Kafka's ``AclApis.handleCreateAcls``): ALTER on the Cluster first
(CLUSTER_AUTHORIZATION_FAILED); SECURITY_DISABLED without an authorizer; otherwise one result
per creation, INVALID_REQUEST with Kafka's message for a binding it refuses (unknown or ANY
type, operation or permission, a pattern type other than LITERAL or PREFIXED, an empty name, a
Cluster not named kafka-cluster, ...); a binding already there is a success."""

from __future__ import annotations

import asyncio

from strata.protocol.codec import make, response_class
from strata.security.authorizer import AclOperation
from strata.server import acl_requests, authz


async def handle(ctx, request):
    authorizer = acl_requests.acl_api(ctx, AclOperation.ALTER, authz.NO_AUTHORIZER)
    rc = response_class(request.api_key, request.api_version)
    bindings = [acl_requests.binding(c) for c in request.body.creations]
    errors = await asyncio.to_thread(authorizer.create_acls, bindings)
    return make(rc, results=tuple(make(rc, "results", **acl_requests.error_fields(e))
                                  for e in errors))
