"""What the admin handlers share: duplicate detection, error (code, message) pairs, and
config resource types."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Callable
from enum import IntEnum
from typing import Any, TypeVar

from strata.common.errors import ErrorCode, KafkaError

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
