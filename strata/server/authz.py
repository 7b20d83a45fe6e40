"""Authorized-operation bit fields, and the ACL APIs' messages, as Kafka reports them with no
authorizer configured.

Without an authorizer Kafka answers every operation a resource type supports
(AclEntry.supportedOperations), one bit per AclOperation code."""

from __future__ import annotations

from strata.security.authorizer import AclOperation

OMITTED = -2147483648  # Integer.MIN_VALUE: the client did not ask


# What AclEntry.supportedOperations gives each resource type
A = AclOperation
TOPIC_OPERATIONS = (A.READ, A.WRITE, A.CREATE, A.DELETE, A.ALTER, A.DESCRIBE, A.DESCRIBE_CONFIGS,
                    A.ALTER_CONFIGS)
GROUP_OPERATIONS = (A.READ, A.DESCRIBE, A.DELETE)
CLUSTER_OPERATIONS = (A.CREATE, A.CLUSTER_ACTION, A.DESCRIBE_CONFIGS, A.ALTER_CONFIGS,
                      A.IDEMPOTENT_WRITE, A.ALTER, A.DESCRIBE)
TRANSACTIONAL_ID_OPERATIONS = (A.DESCRIBE, A.WRITE, A.TWO_PHASE_COMMIT)


def bits(ops) -> int:
    """The authorized-operations bit field of ``ops``."""
    return sum(1 << op for op in ops)


# ... as bit fields: what is reported without an authorizer
TOPIC = bits(TOPIC_OPERATIONS)
GROUP = bits(GROUP_OPERATIONS)
CLUSTER = bits(CLUSTER_OPERATIONS)


# The ACL APIs' answers with no authorizer configured (SECURITY_DISABLED), in Kafka's words:
# DescribeAcls has its own sentence, CreateAcls and DeleteAcls share the other.
NO_AUTHORIZER_ON_BROKER = "No Authorizer is configured on the broker"
NO_AUTHORIZER = "No Authorizer is configured."
