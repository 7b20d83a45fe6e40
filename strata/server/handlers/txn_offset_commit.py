"""TxnOffsetCommit v0-5: a transactional producer commits a group's consumed positions as part
of its transaction (exactly-once consume-transform-produce).

As in Kafka's KafkaApis, a partition of a topic that does not exist gets
UNKNOWN_TOPIC_OR_PARTITION and is not stored, and when no partition is left the coordinator is
not asked. The offsets are pending in the group coordinator until the transaction's marker
reaches the group's ``__consumer_offsets`` partition. Member id, generation and group instance
id exist from v3 (KIP-447); earlier versions commit without them. v0-1 answer
COORDINATOR_NOT_AVAILABLE for COORDINATOR_LOAD_IN_PROGRESS, which producers before 2.0 do not
handle (KAFKA-7296).

Before v5 the producer added the group to its transaction first (AddOffsetsToTxn), which the
client and the transaction coordinator check, not this handler. From v5 (transactions V2,
KIP-890 part 2: Kafka's ``txnOffsetCommitRequestVersionToTransactionSupportedOperation``) the
client sends no AddOffsetsToTxn: the group's ``__consumer_offsets`` partition is added to the
transaction here, through the transaction coordinator, before the offsets are stored; an error
of that add is every partition's, normalized as Kafka's group coordinator does.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.coordinator.group import NO_GENERATION, UNKNOWN_MEMBER_ID
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.protocol.codec import error_response, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, denied_topics
from strata.server.handlers.group_common import commit_response, offsets_to_commit

FIRST_ADD_VERSION = 5
# Kafka's AddPartitionsToTxnManager and the group coordinator's error normalization
_ADD_ERRORS = {
    ErrorCode.PRODUCER_FENCED: ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
}


async def _add_offsets_partition(ctx, body) -> ErrorCode:
    """TxnOffsetCommit v5: the group's offsets partition added to the V2 transaction."""
    if not body.group_id:
        return ErrorCode.NONE   # the commit answers INVALID_GROUP_ID, as Kafka checks it first
    partition = ctx.group_coordinator.partition_for(body.group_id)
    if partition not in ctx.group_coordinator.owned_partitions:
        return ErrorCode.NONE   # not the group's coordinator: the commit answers that
    if ctx.txn_verifier is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    error = await ctx.txn_verifier.add(body.transactional_id, body.producer_id,
                                       body.producer_epoch, (OFFSETS_TOPIC, partition))
    return _ADD_ERRORS.get(error, error)


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    # Kafka: WRITE on the transactional id, READ on the group, READ on each topic
    if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return error_response(request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return error_response(request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    errors, valid = offsets_to_commit(
        ctx, body, denied_topics(ctx, AclOperation.READ, (t.name for t in body.topics)))
    if valid:
        gc = ctx.group_coordinator
        added = ErrorCode.NONE
        if gc is not None and request.api_version >= FIRST_ADD_VERSION:
            added = await _add_offsets_partition(ctx, body)
        if gc is None or added != ErrorCode.NONE:
            errors.update({(o.topic, o.partition): (
                ErrorCode.COORDINATOR_NOT_AVAILABLE if gc is None else added) for o in valid})
        else:
            errors.update(await gc.commit_transactional_offsets(
                body.transactional_id, body.group_id, body.producer_id, body.producer_epoch,
                valid,
                member_id=getattr(body, "member_id", UNKNOWN_MEMBER_ID),
                generation_id=getattr(body, "generation_id", NO_GENERATION),
                group_instance_id=getattr(body, "group_instance_id", None)))
    if request.api_version < 2:
        errors = {tp: (ErrorCode.COORDINATOR_NOT_AVAILABLE
                       if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else code)
                  for tp, code in errors.items()}
    return commit_response(rc, body, errors)
