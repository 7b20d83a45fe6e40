"""TxnOffsetCommit v0-5: a transactional producer commits a group's consumed positions as part
of its transaction (exactly-once consume-transform-produce).

As in Kafka's KafkaApis, a partition of a topic that does not exist gets
UNKNOWN_TOPIC_OR_PARTITION and is not stored, and when no partition is left the coordinator is
not asked. The offsets are pending in the group coordinator until the transaction's marker
reaches the group's ``__consumer_offsets`` partition. Member id, generation and group instance
id exist from v3 (KIP-447); earlier versions commit without them. v0-1 answer
COORDINATOR_NOT_AVAILABLE for COORDINATOR_LOAD_IN_PROGRESS, which producers before 2.0 do not
handle (KAFKA-7296).

That the producer added the group to its transaction first (AddOffsetsToTxn) is checked by the
client and the transaction coordinator, not here.
"""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.coordinator.group import NO_GENERATION, UNKNOWN_MEMBER_ID
from strata.protocol.codec import error_response, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize, denied_topics
from strata.server.handlers.group_common import commit_response, offsets_to_commit


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
        if gc is None:
            errors.update({(o.topic, o.partition): ErrorCode.COORDINATOR_NOT_AVAILABLE
                           for o in valid})
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
