"""DescribeAcls v1-3 (Kafka's ``AclApis.handleDescribeAcls``): DESCRIBE on the Cluster first
(CLUSTER_AUTHORIZATION_FAILED); SECURITY_DISABLED without an authorizer; a filter with an
UNKNOWN element INVALID_REQUEST; otherwise the bindings the filter matches, by resource
pattern."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import make, response_class
from strata.security.acl_authorizer import AclError, validate_filter
from strata.security.authorizer import AclOperation
from strata.server import acl_requests, authz


async def handle(ctx, request):
    authorizer = acl_requests.acl_api(ctx, AclOperation.DESCRIBE, authz.NO_AUTHORIZER_ON_BROKER)
    f = acl_requests.binding_filter(request.body)
    try:
        validate_filter(f)
    except AclError as exc:
        raise KafkaError(str(exc), code=ErrorCode.INVALID_REQUEST) from None
    rc = response_class(request.api_key, request.api_version)
    by_resource: dict = {}
    for b in authorizer.acls(f):
        by_resource.setdefault(b.pattern, []).append(b.entry)
    return make(rc, error_message=None, resources=tuple(
        make(rc, "resources", resource_type=p.resource_type, resource_name=p.name,
             pattern_type=p.pattern_type, acls=tuple(
                 make(rc, "resources.acls", principal=e.principal, host=e.host,
                      operation=e.operation, permission_type=e.permission_type)
                 for e in entries))
        for p, entries in by_resource.items()))
