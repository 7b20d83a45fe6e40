"""What the ACL admin handlers (CreateAcls, DescribeAcls, DeleteAcls) share: codes from the
wire as Kafka's ``fromCode`` reads them (an unknown code is UNKNOWN), filters and bindings
built from request fields, and the cluster-level check Kafka's AclApis makes first."""

from __future__ import annotations

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import kio_error_code
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


def acl_api(ctx, operation: AclOperation, no_authorizer: str):
    """Kafka's AclApis before any ACL request: ``operation`` on the Cluster
    (CLUSTER_AUTHORIZATION_FAILED), then the configured authorizer if it keeps ACLs
    (``StandardAuthorizer``), else SECURITY_DISABLED with ``no_authorizer``."""
    require_cluster(ctx, operation)
    authorizer = ctx.authorizer
    if authorizer is None or not hasattr(authorizer, "acls"):
        raise KafkaError(no_authorizer, code=ErrorCode.SECURITY_DISABLED)
    return authorizer


def error_fields(error: KafkaError | None) -> dict:
    """A result's error_code and error_message: NONE, else the error's code (INVALID_REQUEST
    for a refused binding without one)."""
    if error is None:
        return dict(error_code=kio_error_code(ErrorCode.NONE), error_message=None)
    return dict(error_code=kio_error_code(error.code or ErrorCode.INVALID_REQUEST),
                error_message=str(error))
