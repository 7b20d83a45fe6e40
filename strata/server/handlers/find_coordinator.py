"""FindCoordinator v0-6: a group's coordinator is the leader of its ``__consumer_offsets``
partition, a transactional id's the leader of its ``__transaction_state`` partition (each topic
made on first use when missing).

From v4 a request names several keys and each key gets its own answer (v0-3: one key, one
answer). Share groups (key type 2) are not served: INVALID_REQUEST, as Kafka answers without a
share coordinator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from strata.cluster.metadata import BrokerInfo
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.coordinator.txn_records import TRANSACTION_STATE_TOPIC
from strata.protocol.codec import error_response, kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import NOTHING_DENIED, denied_names
from strata.server.handlers.group_common import client_listener

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2
FIRST_BATCHED_VERSION = 4

COORDINATOR_NOT_AVAILABLE_MESSAGE = "The coordinator is not available."


log = logging.getLogger(__name__)


class Lookup(NamedTuple):
    error: ErrorCode
    message: str | None = None
    node: BrokerInfo | None = None


def _unavailable() -> Lookup:
    return Lookup(ErrorCode.COORDINATOR_NOT_AVAILABLE, COORDINATOR_NOT_AVAILABLE_MESSAGE)


def _leader_of(ctx, coordinator, topic: str, key: str) -> Lookup:
    """The live leader of ``key``'s partition of ``topic``; this broker only once its
    ``coordinator`` has loaded the partition."""
    if coordinator is None or ctx.metadata.topic(topic) is None:
        return _unavailable()
    partition = coordinator.partition_for(key)
    st = ctx.metadata.partition_state(topic, partition)
    if st is None:
        return _unavailable()
    if st.leader == ctx.node_id and partition not in coordinator.owned_partitions:
        return _unavailable()  # loading, or shutting down
    node = next((b for b in ctx.metadata.live_brokers(client_listener())
                 if b.node_id == st.leader), None)
    return _unavailable() if node is None else Lookup(ErrorCode.NONE, node=node)


async def _ensure_topic(ctx, topic: str, internal_log) -> None:
    """Kafka makes ``__consumer_offsets`` and ``__transaction_state`` at the first
    FindCoordinator that needs them; until enough brokers are up for the topic's replication
    factor, the coordinator is COORDINATOR_NOT_AVAILABLE."""
    if ctx.metadata.topic(topic) is not None or internal_log is None:
        return
    try:
        await asyncio.to_thread(internal_log.ensure_topic)
    except KafkaError as exc:
        log.info("cannot create %s yet: %s", topic, exc)


def _coordinator_for(ctx, key_type: int, key: str) -> Lookup:
    """The coordinator of ``key``, else the error and its message."""
    if key_type == KEY_TYPE_GROUP:
        return _leader_of(ctx, ctx.group_coordinator, OFFSETS_TOPIC, key)
    if key_type == KEY_TYPE_TRANSACTION:
        return _leader_of(ctx, ctx.txn_coordinator, TRANSACTION_STATE_TOPIC,
                          key)
    if key_type == KEY_TYPE_SHARE:
        return Lookup(ErrorCode.INVALID_REQUEST)
    # Kafka: CoordinatorType.forId throws InvalidRequestException, failing the whole request
    raise KafkaError(f"Unknown coordinator type received: {key_type}",
                     code=ErrorCode.INVALID_REQUEST)


def _node(ctx, found: Lookup, no_message: str | None) -> dict:
    """The answer's fields; ``no_message`` where there is no message (v4+: "", as Kafka)."""
    if found.error != ErrorCode.NONE:
        return dict(error_code=kio_error_code(found.error), node_id=-1, host="", port=-1,
                    error_message=found.message if found.message is not None else no_message)
    return dict(error_message=no_message, node_id=found.node.node_id, host=found.node.host,
                port=found.node.port)


# Kafka: DESCRIBE on the group or transactional id whose coordinator is asked for
_DENIED = {KEY_TYPE_GROUP: (ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED),
           KEY_TYPE_TRANSACTION: (ResourceType.TRANSACTIONAL_ID,
                                  ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
    batched = request.api_version >= FIRST_BATCHED_VERSION
    keys = list(body.coordinator_keys) if batched else [body.key]
    denied, denied_error = NOTHING_DENIED, None
    if ctx.authorizer is not None and key_type in _DENIED:
        resource_type, denied_error = _DENIED[key_type]
        denied = denied_names(ctx, AclOperation.DESCRIBE, resource_type, keys)
        if not batched and denied:
            return error_response(request, denied_error)
    if len(denied) < len(set(keys)):   # made for an authorized key only (none for no keys)
        if key_type == KEY_TYPE_GROUP:
            await _ensure_topic(ctx, OFFSETS_TOPIC, ctx.offsets_log)
        elif key_type == KEY_TYPE_TRANSACTION:
            await _ensure_topic(ctx, TRANSACTION_STATE_TOPIC, ctx.txn_log)
    if batched:
        return make(rc, coordinators=tuple(
            make(rc, "coordinators", key=key,
                 **_node(ctx, Lookup(denied_error) if key in denied
                         else _coordinator_for(ctx, key_type, key), ""))
            for key in keys))
    return make(rc, **_node(ctx, _coordinator_for(ctx, key_type, body.key), None))
