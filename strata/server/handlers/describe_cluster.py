"""DescribeCluster v0-1: the live brokers, the cluster id and the controller. As Kafka's, anyone
may ask; the cluster's authorized operations are 0 without DESCRIBE on the cluster."""

from __future__ import annotations

from strata.common.errors import ErrorCode
from strata.protocol.codec import make, response_class
from strata.server import authz
from strata.server.authorization import cluster_operations
from strata.server.handlers.group_common import client_listener

ENDPOINT_BROKERS = 1


async def handle(ctx, request):
    body = request.body
    rc = response_class(request.api_key, request.api_version)
    endpoint_type = getattr(body, "endpoint_type", ENDPOINT_BROKERS)
    if endpoint_type != ENDPOINT_BROKERS:
        return make(rc, error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                    error_message="The request was sent to an endpoint of type BROKER, but we "
                                  f"wanted an endpoint of type {endpoint_type}",
                    endpoint_type=endpoint_type, cluster_id=ctx.metadata.cluster_id,
                    controller_id=-1, brokers=(),
                    cluster_authorized_operations=authz.OMITTED)
    brokers = tuple(make(rc, "brokers", broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                    for b in ctx.metadata.live_brokers(client_listener()))
    return make(rc, endpoint_type=ENDPOINT_BROKERS, cluster_id=ctx.metadata.cluster_id,
                controller_id=ctx.metadata.controller_id, brokers=brokers,
                cluster_authorized_operations=cluster_operations(
                    ctx, body.include_cluster_authorized_operations))
