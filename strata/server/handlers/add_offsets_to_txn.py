"""AddOffsetsToTxn v0-4: the group's ``__consumer_offsets`` partition joins the producer's
transaction, so that its TxnOffsetCommit is committed or aborted with it."""

from __future__ import annotations

import datetime

from strata.common.errors import ErrorCode
from strata.coordinator.offsets_records import OFFSETS_TOPIC
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation, ResourceType
from strata.server.authorization import authorize


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    coordinator = ctx.txn_coordinator
    # Kafka: WRITE on the transactional id, READ on the group
    if not authorize(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not authorize(ctx, AclOperation.READ, ResourceType.GROUP, body.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif coordinator is None or ctx.group_coordinator is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        partition = ctx.group_coordinator.partition_for(body.group_id)
        error = await coordinator.add_partitions(body.transactional_id, body.producer_id,
                                                 body.producer_epoch, [(OFFSETS_TOPIC, partition)])
    if request.api_version < 2 and error == ErrorCode.PRODUCER_FENCED:
        error = ErrorCode.INVALID_PRODUCER_EPOCH
    return make(rc, error_code=kio_error_code(error), throttle_time=datetime.timedelta(0))
