"""What the ACL admin handlers (CreateAcls, DescribeAcls, DeleteAcls) share: codes from the
wire as Kafka's ``fromCode`` reads them (an unknown code is UNKNOWN), filters and bindings
built from request fields, and the cluster-level check Kafka's AclApis makes first."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, AclBindingFilter, ResourcePattern)
from strata.security.authorizer import (
    CLUSTER_NAME, AclOperation, AclPermissionType, PatternType, ResourceType)
from strata.server.authorization import authorize

CLUSTER_NOT_AUTHORIZED = "Cluster authorization failed."


def code(enum, value: int):
    try:
        return enum(value)
    except ValueError:
        return enum.UNKNOWN


def require_cluster(ctx, operation: AclOperation) -> None:
    """Kafka's ``authorizeClusterOperation``: CLUSTER_AUTHORIZATION_FAILED for the request."""
    if not authorize(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(CLUSTER_NOT_AUTHORIZED, code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def binding(creation) -> AclBinding:
    return AclBinding(
        ResourcePattern(code(ResourceType, creation.resource_type), creation.resource_name,
                        code(PatternType, creation.resource_pattern_type)),
        AccessControlEntry(creation.principal, creation.host,
                           code(AclOperation, creation.operation),
                           code(AclPermissionType, creation.permission_type)))


def binding_filter(f) -> AclBindingFilter:
    return AclBindingFilter(code(ResourceType, f.resource_type_filter), f.resource_name_filter,
                            code(PatternType, f.pattern_type_filter), f.principal_filter,
                            f.host_filter, code(AclOperation, f.operation),
                            code(AclPermissionType, f.permission_type))


def acl_api(ctx):
    """The configured authorizer if it keeps ACLs (``StandardAuthorizer``), else None."""
    authorizer = ctx.authorizer
    return authorizer if authorizer is not None and hasattr(authorizer, "acls") else None
