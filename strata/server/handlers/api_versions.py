"""ApiVersions: the APIs this broker serves, with their version ranges."""

from __future__ import annotations

from strata.protocol.codec import api_versions_response


async def handle(ctx, request):
    from strata.server.dispatch import advertised_versions
    return api_versions_response(request.api_version, apis=advertised_versions())
