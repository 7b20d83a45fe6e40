"""The tiered layer's side of topics tiered by the broker default: local retention enforced at
min(local, total), and the config hook that lets such a topic stop being tiered only while
nothing of it is in the remote tier."""

from __future__ import annotations

import pytest

from strata.common.errors import InvalidConfigError
from strata.log.log_config import LogConfig
from strata.tiered.api import RemoteLogSegmentId
from tiered_env import T0, TIP, TP, TieredEnv

HOUR = 3_600_000


@pytest.fixture
def env(tmp_path):
    e = TieredEnv(tmp_path, log_props={"local.retention.bytes": "-2",
                                        "local.retention.ms": str(24 * HOUR),
                                        "retention.ms": str(HOUR)})
    yield e
    e.close()


def test_local_retention_longer_than_retention_is_enforced_at_retention(env):
    env.produce(60, ts=T0 - 2 * HOUR)   # older than retention.ms, younger than local.retention.ms
    copied = env.copy()
    assert copied > 1
    env.log.delete_old_segments()
    assert env.log.local_log_start_offset == env.log.highest_offset_in_remote_storage + 1
    assert env.log.log_start_offset == 0   # the remote tier still serves the rest


def _configs(**new):
    old = LogConfig({"remote.storage.enable": "true"})
    return LogConfig({"remote.storage.enable": "false", **new}), old


def test_untiering_passes_while_nothing_is_in_the_remote_tier(env):
    env.produce(5)
    new, old = _configs(**{"cleanup.policy": "compact"})
    env.rlm.validate_topic_config("orders", new, old)


def test_untiering_is_refused_once_a_segment_is_remote(env):
    env.produce(60)
    assert env.copy() > 0
    new, old = _configs(**{"cleanup.policy": "compact"})
    with pytest.raises(InvalidConfigError) as info:
        env.rlm.validate_topic_config("orders", new, old)
    assert str(info.value).startswith(
        "Topic orders is tiered by the broker default log.remote.storage.enable=true and "
        f"partition {TP} has data in remote storage")
    # deleting the remote data with the change is the way out the message names
    new, old = _configs(**{"cleanup.policy": "compact", "remote.log.delete.on.disable": "true"})
    env.rlm.validate_topic_config("orders", new, old)


def test_untiering_is_refused_while_a_copy_is_in_flight(env):
    env.produce(5)
    env.rlm._partitions[TP] = env.part
    env.part.copying = RemoteLogSegmentId.generate_new(TIP)
    new, old = _configs()
    with pytest.raises(InvalidConfigError, match="is copying a segment to remote storage"):
        env.rlm.validate_topic_config("orders", new, old)


def test_changes_that_keep_or_never_had_tiering_are_not_checked(env):
    env.produce(60)
    assert env.copy() > 0
    tiered = LogConfig({"remote.storage.enable": "true"})
    plain = LogConfig({})
    env.rlm.validate_topic_config("orders", tiered, tiered)
    env.rlm.validate_topic_config("orders", plain, plain)
    env.rlm.validate_topic_config("orders", tiered, None)
