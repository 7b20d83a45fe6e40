"""DeleteAcls v1-3 (Kafka's ``AclApis.handleDeleteAcls``): ALTER on the Cluster first
(CLUSTER_AUTHORIZATION_FAILED); SECURITY_DISABLED without an authorizer; otherwise one result
per filter: INVALID_REQUEST for a filter with an UNKNOWN element, else the bindings it deleted
(a binding two filters match is reported under the first)."""

from __future__ import annotations

import asyncio

from strata.protocol.codec import make, response_class
from strata.security.authorizer import AclOperation
from strata.server import acl_requests, authz


async def handle(ctx, request):
    authorizer = acl_requests.acl_api(ctx, AclOperation.ALTER, authz.NO_AUTHORIZER)
    rc = response_class(request.api_key, request.api_version)
    filters = [acl_requests.binding_filter(f) for f in request.body.filters]
    results = await asyncio.to_thread(authorizer.delete_acls, filters)
    return make(rc, filter_results=tuple(
        make(rc, "filter_results", **acl_requests.error_fields(error), matching_acls=tuple(
                 make(rc, "filter_results.matching_acls", **acl_requests.error_fields(e),
                      resource_type=b.pattern.resource_type, resource_name=b.pattern.name,
                      pattern_type=b.pattern.pattern_type, principal=b.entry.principal,
                      host=b.entry.host, operation=b.entry.operation,
                      permission_type=b.entry.permission_type)
                 for b, e in deleted))
        for error, deleted in results))
