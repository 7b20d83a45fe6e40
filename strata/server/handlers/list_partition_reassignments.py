"""ListPartitionReassignments v0: one node never has a reassignment in progress, so the list is
empty, whether all partitions or named ones are asked for (Kafka leaves out partitions that are
not being reassigned, and unknown topics too)."""

from __future__ import annotations

from strata.protocol.codec import make, response_class


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    return make(rc, error_message=None, topics=())
