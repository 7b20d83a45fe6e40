"""What the admin handlers share: duplicate detection, error (code, message) pairs, and
config resource types."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Callable
from enum import IntEnum
from typing import Any, TypeVar

from strata.common.errors import ErrorCode, KafkaError
from strata.security.authorizer import CLUSTER_NAME, Action, ResourceType
from strata.server.authorization import caller

T = TypeVar("T")


class ConfigResourceType(IntEnum):
    """ConfigResource.Type wire ids."""
    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


def duplicates(keys: Iterable[Any]) -> set:
    return {k for k, n in Counter(keys).items() if n > 1}


def attempt(fn: Callable[[], T]) -> tuple[T | None, ErrorCode, str | None]:
    """Run one per-resource admin action: (result, NONE, None) or (None, code, message)."""
    try:
        return fn(), ErrorCode.NONE, None
    except KafkaError as exc:
        return None, ErrorCode(exc.code), str(exc)


def resource_type(value: int) -> ConfigResourceType:
    try:
        return ConfigResourceType(value)
    except ValueError:
        return ConfigResourceType.UNKNOWN


# Kafka's error for a config resource the caller may not describe or alter, in its words
_CONFIG_DENIALS = {
    ConfigResourceType.TOPIC: (ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
    ConfigResourceType.GROUP: (ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed."),
}
_CLUSTER_DENIAL = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")


def config_denials(ctx, operation, resources) -> dict[tuple[int, str], tuple[ErrorCode, str]]:
    """Kafka's checks of DescribeConfigs (DESCRIBE_CONFIGS) and (Incremental)AlterConfigs
    (ALTER_CONFIGS): a topic's or group's configs need the operation on it, a broker's, the
    loggers' and client metrics' on the cluster. The (type, name) pairs of ``resources`` the
    caller may not, with the error and its default message; one authorizer call."""
    if ctx.authorizer is None:
        return {}
    acl_types = {ConfigResourceType.TOPIC: ResourceType.TOPIC,
                 ConfigResourceType.GROUP: ResourceType.GROUP,
                 ConfigResourceType.BROKER: ResourceType.CLUSTER,
                 ConfigResourceType.BROKER_LOGGER: ResourceType.CLUSTER,
                 ConfigResourceType.CLIENT_METRICS: ResourceType.CLUSTER}
    keys, actions = [], []
    for rtype, name in dict.fromkeys(resources):
        acl_type = acl_types.get(resource_type(rtype))
        if acl_type is None:   # unknown types keep their INVALID_REQUEST
            continue
        keys.append((rtype, name))
        actions.append(Action(operation, acl_type,
                              CLUSTER_NAME if acl_type is ResourceType.CLUSTER else name))
    if not actions:
        return {}
    principal, host = caller()
    decisions = ctx.authorizer.authorize(principal, host, actions)
    return {key: _CONFIG_DENIALS.get(resource_type(key[0]), _CLUSTER_DENIAL)
            for key, ok in zip(keys, decisions) if not ok}


def broker_resource_is_this_node(ctx, name: str) -> bool:
    """Kafka's check of a BROKER resource name: '' (the cluster default) or this node's id.
    False for the default; raises INVALID_REQUEST for anything but this node."""
    if name == "":
        return False
    try:
        broker_id = int(name)
    except ValueError:
        raise KafkaError(f"Broker id must be an integer, but it is: {name}",
                         code=ErrorCode.INVALID_REQUEST) from None
    if broker_id != ctx.node_id:
        raise KafkaError(f"Unexpected broker id, expected {ctx.node_id} or empty string, but "
                         f"received {name}", code=ErrorCode.INVALID_REQUEST)
    return True
