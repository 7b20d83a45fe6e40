"""AlterConfigs v0-2 (the legacy whole-set replace) and IncrementalAlterConfigs v0-1.

Topic configs are altered in the cluster metadata and take effect on the logs at once; logger
levels change in place. Broker configs are static (server.properties), so altering one is
refused with INVALID_REQUEST, except the dynamic ones (``DYNAMIC_BROKER_CONFIGS``: the KIP-956
remote copy/fetch quotas), which may be set for this node (resource name: its id) or as the
cluster-wide default (resource name ""): persisted in the cluster metadata (in a cluster, in
ZooKeeper's ``/config/brokers``, which every broker follows) and applied live."""

from __future__ import annotations

import asyncio

from strata.common.errors import ErrorCode, KafkaError
from strata.protocol.codec import ApiKey, kio_error_code, make, response_class
from strata.server import loggers
from strata.security.authorizer import AclOperation
from strata.server.handlers.admin_common import (
    ConfigResourceType as R, attempt, broker_resource_is_this_node, config_denials, duplicates,
    resource_type)


def _alter(ctx, res, incremental: bool, validate_only: bool) -> None:
    kind = resource_type(res.resource_type)
    if incremental:
        ops = [(c.name, c.config_operation, c.value) for c in res.configs]
    else:
        ops = [(c.name, loggers.OP_SET, c.value) for c in res.configs]
    if kind is R.TOPIC:
        if incremental:
            ctx.metadata.incremental_alter_topic_configs(res.resource_name, ops, validate_only)
        else:
            ctx.metadata.alter_topic_configs(res.resource_name, {k: v for k, _, v in ops},
                                             validate_only)
    elif kind is R.BROKER:
        broker_resource_is_this_node(ctx, res.resource_name)
        ctx.metadata.alter_broker_configs(res.resource_name, ops, incremental, validate_only)
    elif kind is R.BROKER_LOGGER and incremental:
        if not broker_resource_is_this_node(ctx, res.resource_name):
            raise KafkaError("Broker id must not be empty", code=ErrorCode.INVALID_REQUEST)
        loggers.alter(ops, validate_only)
    else:
        raise KafkaError(f"Unsupported resource type: {kind.name if kind else res.resource_type}",
                         code=ErrorCode.INVALID_REQUEST)


async def handle(ctx, request):
    body = request.body
    incremental = request.api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS
    rc = response_class(request.api_key, request.api_version)
    dup_resources = duplicates((r.resource_type, r.resource_name) for r in body.resources)
    denials = config_denials(ctx, AclOperation.ALTER_CONFIGS,
                             ((r.resource_type, r.resource_name) for r in body.resources))
    results = []
    for res in body.resources:
        if (res.resource_type, res.resource_name) in dup_resources:
            code, message = ErrorCode.INVALID_REQUEST, "Duplicate resource."
        elif (res.resource_type, res.resource_name) in denials:
            code, message = denials[(res.resource_type, res.resource_name)][0], None
        elif duplicates(c.name for c in res.configs):
            code, message = ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys"
        else:   # off the event loop: in a cluster a change waits until ZooKeeper shows it
            _, code, message = await asyncio.to_thread(
                attempt, lambda res=res: _alter(ctx, res, incremental, body.validate_only))
        results.append(make(rc, "responses", error_code=kio_error_code(code),
                            error_message=message, resource_type=res.resource_type,
                            resource_name=res.resource_name))
    return make(rc, responses=tuple(results))
