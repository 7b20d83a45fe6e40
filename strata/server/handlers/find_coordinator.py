"""FindCoordinator v0-6: a group's coordinator is the leader of its ``__consumer_offsets``
partition (made on first use when missing); transactions are not supported yet.

From v4 a request names several keys and each key gets its own answer (v0-3: one key, one
answer). A transactional id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which every client
treats as fatal, so a transactional producer fails at once instead of retrying
COORDINATOR_NOT_AVAILABLE until its own timeout. Share groups (key type 2) are not served:
INVALID_REQUEST, as Kafka answers without a share coordinator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from strata.cluster.metadata import BrokerInfo
from strata.common.errors import ErrorCode, KafkaError
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.protocol.codec import kio_error_code, make, response_class

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2
FIRST_BATCHED_VERSION = 4

COORDINATOR_NOT_AVAILABLE_MESSAGE = "The coordinator is not available."


def transactions_not_supported(transactional_id: str) -> str:
    return (f"Transactions are not supported yet by this broker: transactional.id "
            f"'{transactional_id}' cannot be used (use an idempotent producer without a "
            f"transactional.id)")


log = logging.getLogger(__name__)


class Lookup(NamedTuple):
    error: ErrorCode
    message: str | None = None
    node: BrokerInfo | None = None


def _unavailable() -> Lookup:
    return Lookup(ErrorCode.COORDINATOR_NOT_AVAILABLE, COORDINATOR_NOT_AVAILABLE_MESSAGE)


def _group_coordinator(ctx, key: str) -> Lookup:
    """The live leader of the group's partition; this broker only once it has loaded it."""
    gc = ctx.group_coordinator
    if gc is None or ctx.metadata.topic(OFFSETS_TOPIC) is None:
        return _unavailable()
    partition = gc.partition_for(key)
    st = ctx.metadata.partition_state(OFFSETS_TOPIC, partition)
    if st is None:
        return _unavailable()
    if st.leader == ctx.node_id and partition not in gc.owned_partitions:
        return _unavailable()  # loading, or shutting down
    node = next((b for b in ctx.metadata.live_brokers() if b.node_id == st.leader), None)
    return _unavailable() if node is None else Lookup(ErrorCode.NONE, node=node)


async def _ensure_offsets_topic(ctx) -> None:
    """Kafka makes ``__consumer_offsets`` at the first FindCoordinator that needs it; until
    enough brokers are up for its replication factor, groups get COORDINATOR_NOT_AVAILABLE."""
    if ctx.metadata.topic(OFFSETS_TOPIC) is not None or ctx.offsets_log is None:
        return
    try:
        await asyncio.to_thread(ctx.offsets_log.ensure_topic)
    except KafkaError as exc:
        log.info("cannot create %s yet: %s", OFFSETS_TOPIC, exc)


def _coordinator_for(ctx, key_type: int, key: str) -> Lookup:
    """The coordinator of ``key``, else the error and its message."""
    if key_type == KEY_TYPE_GROUP:
        return _group_coordinator(ctx, key)
    if key_type == KEY_TYPE_TRANSACTION:
        return Lookup(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                      transactions_not_supported(key))
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


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
    if key_type == KEY_TYPE_GROUP:
        await _ensure_offsets_topic(ctx)
    if request.api_version >= FIRST_BATCHED_VERSION:
        return make(rc, coordinators=tuple(
            make(rc, "coordinators", key=key,
                 **_node(ctx, _coordinator_for(ctx, key_type, key), ""))
            for key in body.coordinator_keys))
    return make(rc, **_node(ctx, _coordinator_for(ctx, key_type, body.key), None))
