"""ApiVersions: the APIs this broker serves, with their version ranges, and its features.

Features (KIP-584) are reported as Kafka 4.x reports them, at the levels Strata really has:
metadata.version at its lowest Kafka 4 level, 3.3-IV3 (7), transaction.version at 2
(transactions V2, KIP-890 part 2, as a new Kafka 4 cluster), group.version at 1 (KIP-848
consumer groups: ConsumerGroupHeartbeat), and every other feature at level 0, since Strata has
no share or streams groups, and no KRaft quorum (kraft.version);
eligible.leader.replicas.version is finalized at 1 while ``eligible.leader.replicas.enable``
is on (KIP-966), at 0 (not finalized) when it is off. A feature at level 0 is supported but not
finalized.
Before v4 a client cannot read a supported range starting at 0: those are left out, as Kafka
leaves them out.
"""

from __future__ import annotations

import dataclasses

from strata.protocol.codec import api_versions_response, make, response_class

METADATA_VERSION = "metadata.version"
METADATA_VERSION_3_3_IV3 = 7

# feature -> (supported min, supported max); the finalized level is the max (ELR: see above).
FEATURES: dict[str, tuple[int, int]] = {
    METADATA_VERSION: (METADATA_VERSION_3_3_IV3, METADATA_VERSION_3_3_IV3),
    "kraft.version": (0, 0),
    "group.version": (0, 1),                      # KIP-848 consumer groups
    "transaction.version": (0, 2),
    "eligible.leader.replicas.version": (0, 1),   # KIP-966 (``eligible.leader.replicas.enable``)
    "share.version": (0, 0),
    "streams.version": (0, 0),
}
ELR_VERSION = "eligible.leader.replicas.version"
FINALIZED_FEATURES_EPOCH = 0  # without a feature store (strata.cluster.features)
FIRST_VERSION_WITH_FEATURES = 3
FIRST_VERSION_WITH_ZERO_MIN_FEATURES = 4


def finalized_levels(eligible_leader_replicas: bool = True) -> dict[str, int]:
    """Each finalized feature's level (features at level 0 are not finalized)."""
    levels = {name: hi for name, (_, hi) in FEATURES.items() if hi > 0}
    if not eligible_leader_replicas:
        del levels[ELR_VERSION]
    return levels


def with_features(response, api_version: int, finalized: dict[str, int] | None = None,
                  epoch: int = FINALIZED_FEATURES_EPOCH):
    """``response`` (an ApiVersions body of ``api_version``) with this broker's features,
    ``finalized`` (default ``finalized_levels()``) as the finalized ones, at ``epoch``."""
    if api_version < FIRST_VERSION_WITH_FEATURES:
        return response
    rc = response_class(type(response).__api_key__, api_version)
    supported = tuple(
        make(rc, "supported_features", name=name, min_version=lo, max_version=hi)
        for name, (lo, hi) in FEATURES.items()
        if lo > 0 or api_version >= FIRST_VERSION_WITH_ZERO_MIN_FEATURES)
    levels = finalized_levels() if finalized is None else finalized
    return dataclasses.replace(response, supported_features=supported,
                               finalized_features_epoch=epoch,
                               finalized_features=tuple(
                                   make(rc, "finalized_features", name=name,
                                        min_version_level=level, max_version_level=level)
                                   for name, level in levels.items() if level > 0))


def current_finalized(ctx) -> tuple[dict[str, int], int]:
    """The finalized levels and epoch: the fixed ones, with ``ctx.features``' (the features
    UpdateFeatures changes) over them."""
    levels = finalized_levels(ctx.eligible_leader_replicas)
    if ctx.features is None:
        return levels, FINALIZED_FEATURES_EPOCH
    levels.update(ctx.features.levels())
    return levels, ctx.features.epoch


async def handle(ctx, request):
    levels, epoch = current_finalized(ctx)
    return with_features(api_versions_response(request.api_version, apis=ctx.api_versions),
                         request.api_version, levels, epoch)
