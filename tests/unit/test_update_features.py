"""UpdateFeatures (``strata.server.handlers.update_features``) and the finalized feature levels
it changes (``strata.cluster.features``): transaction.version at 2 on a new cluster, changed
with Kafka 4's checks, persisted (a broker's features.json, ZooKeeper's /feature), and reported
by ApiVersions with the finalized epoch.

Every advertised version goes through the wire format both ways (test_admin_handlers' Client).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import replace

import pytest

from strata.cluster.features import (
    DEFAULT_LEVELS, FeatureUpdateConflict, FileFeatureStore, FinalizedFeatures, ZkFeatureStore,
    decode_feature_znode, encode_feature_znode)
from strata.common.errors import ErrorCode
from strata.protocol.codec import ApiKey
from test_admin_handlers import broker, nested, send, versions  # noqa: F401 - fixture

A = ApiKey
E = ErrorCode
UPGRADE, SAFE, UNSAFE = 1, 2, 3
TV = "transaction.version"


@pytest.fixture
def ctx(broker, tmp_path):  # noqa: F811 - the fixture
    c, _, _ = broker
    return replace(c, features=FinalizedFeatures(FileFeatureStore(tmp_path / "features.json")))


def update(ctx, version, *updates, validate_only=False):
    """``updates``: (feature, level, upgrade type); v0 sends a downgrade as allow_downgrade."""
    keys = tuple(nested(A.UPDATE_FEATURES, version, "feature_updates", feature=f,
                        max_version_level=level, upgrade_type=kind,
                        allow_downgrade=kind != UPGRADE)
                 for f, level, kind in updates)
    return send(ctx, A.UPDATE_FEATURES, version, timeout=datetime.timedelta(seconds=30),
                feature_updates=keys,
                validate_only=validate_only)


def finalized(ctx):
    r = send(ctx, A.API_VERSIONS, 4, client_software_name="t", client_software_version="1")
    return ({f.name: f.max_version_level for f in r.finalized_features},
            r.finalized_features_epoch)


def test_a_new_cluster_finalizes_transaction_version_2_at_epoch_0(ctx, tmp_path):
    levels, epoch = finalized(ctx)
    assert (levels[TV], epoch) == (2, 0)
    assert json.loads((tmp_path / "features.json").read_text()) == \
        {"epoch": 0, "features": DEFAULT_LEVELS}


@pytest.mark.parametrize("version", versions(A.UPDATE_FEATURES))
def test_downgrade_and_upgrade_are_stored_and_reported_with_a_new_epoch(ctx, tmp_path, version):
    r = update(ctx, version, (TV, 1, SAFE))
    assert (r.error_code, r.error_message) == (E.NONE, None)
    if version < 2:
        assert [(x.feature, x.error_code) for x in r.results] == [(TV, E.NONE)]
    levels, epoch = finalized(ctx)
    assert (levels[TV], levels["metadata.version"], epoch) == (1, 7, 1)
    reloaded = FinalizedFeatures(FileFeatureStore(tmp_path / "features.json"))
    assert (reloaded.level(TV), reloaded.epoch) == (1, 1)
    assert update(ctx, version, (TV, 0, UNSAFE if version else SAFE)).error_code == E.NONE
    levels, epoch = finalized(ctx)
    assert TV not in levels and epoch == 2          # level 0: not finalized
    assert update(ctx, version, (TV, 2, UPGRADE)).error_code == E.NONE
    assert finalized(ctx)[0][TV] == 2
    assert update(ctx, version, (TV, 2, UPGRADE)).error_code == E.NONE   # no change
    assert finalized(ctx)[1] == 3


@pytest.mark.parametrize("updates, message", [
    ([(TV, 1, UPGRADE)], "Invalid update version 1 for feature transaction.version. Can't "
     "downgrade the version of this feature without setting the upgrade type to either safe or "
     "unsafe downgrade."),
    ([(TV, 3, UPGRADE)], "Invalid update version 3 for feature transaction.version. Local "
     "controller 1 only supports versions SupportedVersionRange[min_version:0, max_version:2]"),
    ([(TV, -1, SAFE)], "Invalid update version -1 for feature transaction.version. A feature "
     "version cannot be less than 0."),
    ([("no.such.version", 1, UPGRADE)], "Invalid update version 1 for feature no.such.version. "
     "Local controller 1 does not support this feature."),
    ([("metadata.version", 8, UPGRADE)], "Invalid update version 8 for feature metadata.version. "
     "Local controller 1 only supports versions SupportedVersionRange[min_version:7, "
     "max_version:7]"),
    ([("eligible.leader.replicas.version", 0, SAFE)], "Invalid update version 0 for feature "
     "eligible.leader.replicas.version. Strata does not change the level of this feature."),
    # every update is checked before any is made
    ([(TV, 1, SAFE), ("metadata.version", 6, SAFE)], "Invalid update version 6 for feature "
     "metadata.version. Local controller 1 only supports versions "
     "SupportedVersionRange[min_version:7, max_version:7]"),
])
@pytest.mark.parametrize("version", [0, 2])
def test_invalid_updates_are_refused_as_kafka_refuses_them_and_change_nothing(
        ctx, version, updates, message):
    r = update(ctx, version, *updates)
    assert (r.error_code, r.error_message) == (E.INVALID_UPDATE_VERSION, message)
    if version < 2:
        assert {x.error_code for x in r.results} == {E.INVALID_UPDATE_VERSION}
    assert finalized(ctx)[0][TV] == 2 and finalized(ctx)[1] == 0


@pytest.mark.parametrize("version", [v for v in versions(A.UPDATE_FEATURES) if v >= 1])
def test_an_upgrade_asked_as_a_downgrade_and_unknown_upgrade_types_are_refused(ctx, version):
    update(ctx, version, (TV, 0, SAFE))
    r = update(ctx, version, (TV, 1, SAFE))
    assert (r.error_code, r.error_message) == (E.INVALID_UPDATE_VERSION, "Invalid update version "
                                               "1 for feature transaction.version. Can't "
                                               "downgrade to a newer version.")
    for kind in (0, 4):
        r = update(ctx, version, (TV, 1, kind))
        assert r.error_message.endswith("The controller does not support the given upgrade type.")
    assert finalized(ctx)[1] == 1


@pytest.mark.parametrize("version", [v for v in versions(A.UPDATE_FEATURES) if v >= 1])
def test_validate_only_stores_nothing(ctx, version):
    assert update(ctx, version, (TV, 1, SAFE), validate_only=True).error_code == E.NONE
    assert finalized(ctx)[0][TV] == 2 and finalized(ctx)[1] == 0


def test_a_duplicate_feature_is_an_invalid_request(ctx):
    r = update(ctx, 1, (TV, 1, SAFE), (TV, 0, SAFE))
    assert (r.error_code, r.results) == (E.INVALID_REQUEST, ())
    assert finalized(ctx)[1] == 0


def test_a_store_changed_by_another_broker_fails_the_update(ctx, tmp_path):
    FinalizedFeatures(FileFeatureStore(tmp_path / "features.json")).update({TV: 1})
    r = update(ctx, 2, (TV, 0, SAFE))
    assert r.error_code == E.FEATURE_UPDATE_FAILED
    assert FinalizedFeatures(FileFeatureStore(tmp_path / "features.json")).level(TV) == 1


class FakeZk:
    """``StrataZkClient``'s feature znode calls over one in-memory znode."""

    def __init__(self, data: bytes | None = None):
        self.data, self.version, self.watchers = data, 0, []

    def get_feature_znode(self):
        return None if self.data is None else (self.data, self.version)

    def set_feature_znode(self, data, expected_version):
        if expected_version is None:
            if self.data is not None:
                return None
            self.data, self.version = data, 0
        elif self.data is None or expected_version != self.version:
            return None
        else:
            self.data, self.version = data, self.version + 1
        for w in self.watchers:
            w(self.data, self.version)
        return self.version

    def watch_feature_znode(self, callback):
        self.watchers.append(callback)
        callback(self.data, self.version)


def test_the_first_broker_writes_the_default_levels_to_the_feature_znode():
    for zk in (FakeZk(), FakeZk(b"")):      # absent, or made empty by a tool
        features = FinalizedFeatures(ZkFeatureStore(zk))
        assert decode_feature_znode(zk.data) == DEFAULT_LEVELS
        assert json.loads(zk.data) == {"version": 2, "status": 1,
                                       "features": {TV: {"max_version_level": 2}}}
        assert features.level(TV) == 2


def test_every_broker_follows_the_feature_znode_and_a_stale_update_conflicts():
    zk = FakeZk(encode_feature_znode({TV: 2}))
    a, b = FinalizedFeatures(ZkFeatureStore(zk)), FinalizedFeatures(ZkFeatureStore(zk))
    a.update({TV: 1})
    assert (b.level(TV), b.epoch) == (1, 1)        # seen through the watch
    zk.watchers.clear()                            # b misses the next change
    a.update({TV: 0})
    with pytest.raises(FeatureUpdateConflict):
        b.update({TV: 2})
    assert decode_feature_znode(zk.data) == {TV: 0}
