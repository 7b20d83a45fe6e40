"""ApiVersions: the APIs this broker serves, with their version ranges."""

from __future__ import annotations

from strata.protocol.codec import api_versions_response


async def handle(ctx, request):
    return api_versions_response(request.api_version, apis=ctx.api_versions)
