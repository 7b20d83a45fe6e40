"""UpdateFeatures v0-2 (``kafka-features upgrade/downgrade``): change a finalized feature level.

Checked as Kafka 4's FeatureControlManager checks an update: ALTER on the cluster; an upgrade
type it knows (v0's ``allow_downgrade`` is a safe downgrade); a level of 0 or more that this
broker supports; no downgrade asked as an upgrade, no upgrade asked as a downgrade. Every
update is checked before any is made, and the first failure is the request's error
(INVALID_UPDATE_VERSION, "Invalid update version V for feature F. <reason>"); v0-1 also report it
for each feature (v2 has no per-feature results). ``validate_only`` (v1+) stores nothing.

Of the features ApiVersions reports, only ``transaction.version`` changes on Strata
(``strata.cluster.features``, stored in the broker's ``features.json`` or ZooKeeper's
``/feature``); asking another feature for a level other than its own is refused with
INVALID_UPDATE_VERSION. A store that changed under the update answers FEATURE_UPDATE_FAILED.
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from strata.cluster.features import UPDATABLE, FeatureUpdateConflict
from strata.common.errors import ErrorCode
from strata.protocol.codec import kio_error_code, make, response_class
from strata.security.authorizer import AclOperation
from strata.server.authorization import authorize_cluster
from strata.server.handlers.api_versions import FEATURES, finalized_levels

log = logging.getLogger(__name__)

UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3
FIRST_VERSION_WITHOUT_RESULTS = 2


def _upgrade_type(update, api_version: int) -> int:
    if api_version == 0:
        return SAFE_DOWNGRADE if update.allow_downgrade else UPGRADE
    return int(update.upgrade_type)


def _current_levels(ctx) -> dict[str, int]:
    levels = finalized_levels(ctx.eligible_leader_replicas)
    if ctx.features is not None:
        levels.update(ctx.features.levels())
    return levels


def _reason(ctx, name: str, level: int, upgrade_type: int, current: int) -> str | None:
    """Why ``name`` may not go to ``level`` (None: it may)."""
    if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return "The controller does not support the given upgrade type."
    if level < 0:
        return "A feature version cannot be less than 0."
    supported = FEATURES.get(name)
    if supported is None:
        return f"Local controller {ctx.node_id} does not support this feature."
    lo, hi = supported
    if level != 0 and not lo <= level <= hi:
        return (f"Local controller {ctx.node_id} only supports versions "
                f"SupportedVersionRange[min_version:{lo}, max_version:{hi}]")
    if level < current and upgrade_type == UPGRADE:
        return ("Can't downgrade the version of this feature without setting the upgrade type "
                "to either safe or unsafe downgrade.")
    if level > current and upgrade_type != UPGRADE:
        return "Can't downgrade to a newer version."
    if level != current and (name not in UPDATABLE or ctx.features is None):
        return "Strata does not change the level of this feature."
    return None


async def handle(ctx, request):
    rc = response_class(request.api_key, request.api_version)
    body = request.body
    version = request.api_version

    def answer(error: ErrorCode, message: str | None = None, per_feature: bool = True):
        results = ()
        if per_feature and version < FIRST_VERSION_WITHOUT_RESULTS:
            results = tuple(make(rc, "results", feature=u.feature, error_code=kio_error_code(error),
                                 error_message=message) for u in body.feature_updates)
        return make(rc, throttle_time=datetime.timedelta(0), error_code=kio_error_code(error),
                    error_message=message, results=results)

    if ctx.authorizer is not None and not authorize_cluster(ctx, AclOperation.ALTER):
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, per_feature=False)
    names = [u.feature for u in body.feature_updates]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        return answer(ErrorCode.INVALID_REQUEST,
                      f"Feature {duplicate} appears more than once in the request.",
                      per_feature=False)
    current = _current_levels(ctx)
    changes = {}
    for u in body.feature_updates:
        level = int(u.max_version_level)
        reason = _reason(ctx, u.feature, level, _upgrade_type(u, version),
                         current.get(u.feature, 0))
        if reason is not None:
            return answer(ErrorCode.INVALID_UPDATE_VERSION,
                          f"Invalid update version {level} for feature {u.feature}. {reason}")
        if level != current.get(u.feature, 0):
            changes[u.feature] = level
    if changes and not getattr(body, "validate_only", False):
        try:
            await asyncio.to_thread(ctx.features.update, changes)
        except FeatureUpdateConflict as exc:
            return answer(ErrorCode.FEATURE_UPDATE_FAILED, f"The features changed meanwhile: {exc}")
        except Exception:  # noqa: BLE001 - the client gets an error code, the broker goes on
            log.exception("storing the finalized features %s failed", changes)
            return answer(ErrorCode.FEATURE_UPDATE_FAILED,
                          "Unable to update finalized features due to an unexpected server error.")
    return answer(ErrorCode.NONE)
