"""Kafka's authorizer interface (``org.apache.kafka.server.authorizer.Authorizer``) and the ACL
vocabulary it speaks, with Kafka's codes (``AclOperation``, ``ResourceType``, ``PatternType``,
``AclPermissionType`` as they travel in CreateAcls / DescribeAcls / DeleteAcls).

An ``Authorizer`` answers, for one principal connected from one host, whether each ``Action``
(an operation on one named resource) is allowed. The broker consults it through
``strata.server.authorization``; with no authorizer configured every action is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from strata.security.sasl import KafkaPrincipal

__all__ = ["AclOperation", "AclPermissionType", "Action", "Authorizer", "PatternType",
           "ResourceType", "WILDCARD_RESOURCE", "CLUSTER_NAME", "CURRENT_REQUEST"]

WILDCARD_RESOURCE = "*"          # ResourcePattern.WILDCARD_RESOURCE
CLUSTER_NAME = "kafka-cluster"   # the one Cluster resource's name

# The API key of the request being handled (set by the Dispatcher): the audit log names it
CURRENT_REQUEST: ContextVar[int | None] = ContextVar("strata_request_api_key", default=None)


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


@dataclass(frozen=True, slots=True)
class Action:
    """Kafka's ``Action``: ``operation`` on the resource ``resource_type``:``name`` (a LITERAL
    pattern when the request names one resource). ``log_if_allowed`` / ``log_if_denied`` say
    whether the authorizer log records the decision (Kafka turns them off for filtering, e.g.
    the topics of a Metadata request for all topics)."""

    operation: AclOperation
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL
    log_if_allowed: bool = True
    log_if_denied: bool = True


class Authorizer(Protocol):
    """What the broker asks of an authorizer."""

    def authorize(self, principal: KafkaPrincipal, host: str,
                  actions: Sequence[Action]) -> list[bool]:
        """One decision per action, in order: True if allowed. ``host`` is the client's IP
        address as a string (``"127.0.0.1"``)."""
        ...

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str,
                                   operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether the principal may do ``operation`` on some resource of the type. Kafka's
        default, for authorizers that subclass this: ask about a made-up name (allowed for super
        users and by allow.everyone.if.no.acl.found)."""
        return self.authorize(principal, host, [Action(operation, resource_type, "hardcode",
                                                       log_if_denied=False)])[0]
