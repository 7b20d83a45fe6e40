"""The cluster's finalized levels of the features an operator changes with UpdateFeatures
(``kafka-features upgrade/downgrade``): ``transaction.version``, finalized at 2 on a new
cluster as Kafka 4 bootstraps it.

``FinalizedFeatures`` holds the levels and their epoch (ApiVersions' finalized features epoch)
and persists a change through a store before taking it:

- ``FileFeatureStore``: one broker's ``features.json`` in its first log dir, rewritten whole
  (a temporary file renamed over it); the epoch counts the changes;
- ``ZkFeatureStore``: a cluster's ``/feature`` znode, as Kafka's ZooKeeper mode kept it
  (``{"version": 2, "status": 1, "features": {name: {"max_version_level": L}}}``), its zkVersion
  the epoch; a write is conditional on the version read, and every broker follows the znode
  with a watch. The first broker of a new cluster creates it with the default levels.

A level of 0 is not finalized (ApiVersions leaves the feature out of its finalized features).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Mapping, Protocol

log = logging.getLogger(__name__)

TRANSACTION_VERSION = "transaction.version"
# feature -> (supported min, max, level of a new cluster)
UPDATABLE: dict[str, tuple[int, int, int]] = {TRANSACTION_VERSION: (0, 2, 2)}
DEFAULT_LEVELS = {name: default for name, (_, _, default) in UPDATABLE.items()}


class FeatureUpdateConflict(Exception):
    """The stored levels changed since they were read (another broker's update)."""


class FeatureStore(Protocol):
    def load(self) -> tuple[dict[str, int], int]:
        """(levels, epoch); a store that has none yet stores ``DEFAULT_LEVELS``."""

    def save(self, levels: Mapping[str, int], epoch: int) -> int:
        """Store ``levels`` if the stored epoch is still ``epoch``; the new epoch."""


class MemoryFeatureStore:
    def __init__(self, levels: Mapping[str, int] | None = None):
        self.levels, self.epoch = dict(DEFAULT_LEVELS if levels is None else levels), 0

    def load(self) -> tuple[dict[str, int], int]:
        return dict(self.levels), self.epoch

    def save(self, levels: Mapping[str, int], epoch: int) -> int:
        if epoch != self.epoch:
            raise FeatureUpdateConflict(f"epoch {self.epoch}, not {epoch}")
        self.levels, self.epoch = dict(levels), epoch + 1
        return self.epoch


def _levels_of(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise ValueError(f"features {raw!r} are not an object")
    out = {}
    for name, value in raw.items():
        level = value.get("max_version_level") if isinstance(value, dict) else value
        if not isinstance(name, str) or not isinstance(level, int) or isinstance(level, bool):
            raise ValueError(f"bad feature {name!r}: {value!r}")
        out[name] = level
    return out


class FileFeatureStore:
    """``features.json`` of a single broker: ``{"epoch": E, "features": {name: level}}``."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> tuple[dict[str, int], int]:
        if not self.path.exists():
            self._write(DEFAULT_LEVELS, 0)
            return dict(DEFAULT_LEVELS), 0
        data = json.loads(self.path.read_text())
        return _levels_of(data["features"]), int(data["epoch"])

    def save(self, levels: Mapping[str, int], epoch: int) -> int:
        _, stored = self.load()
        if stored != epoch:
            raise FeatureUpdateConflict(f"{self.path} is at epoch {stored}, not {epoch}")
        self._write(levels, epoch + 1)
        return epoch + 1

    def _write(self, levels: Mapping[str, int], epoch: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"epoch": epoch, "features": dict(levels)}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


FEATURE_ZNODE = "/feature"        # strata.cluster.zk.znodes.FEATURE_PATH
FEATURE_ZNODE_VERSION = 2
FEATURE_ZNODE_ENABLED = 1


def encode_feature_znode(levels: Mapping[str, int]) -> bytes:
    return json.dumps({"version": FEATURE_ZNODE_VERSION, "status": FEATURE_ZNODE_ENABLED,
                       "features": {n: {"max_version_level": lv} for n, lv in sorted(levels.items())}},
                      separators=(",", ":")).encode()


def decode_feature_znode(data: bytes) -> dict[str, int]:
    doc = json.loads(data.decode())
    if not isinstance(doc, dict) or doc.get("status", FEATURE_ZNODE_ENABLED) != FEATURE_ZNODE_ENABLED:
        return {}
    return _levels_of(doc.get("features", {}))


class ZkFeatureStore:
    """``/feature`` over ``StrataZkClient``'s feature znode calls."""

    def __init__(self, zk):
        self.zk = zk

    def load(self) -> tuple[dict[str, int], int]:
        for _ in range(3):
            found = self.zk.get_feature_znode()
            if found is not None and found[0]:
                return decode_feature_znode(found[0]), found[1]
            # a new cluster (or an empty znode): the first broker writes the default levels
            version = self.zk.set_feature_znode(encode_feature_znode(DEFAULT_LEVELS),
                                                None if found is None else found[1])
            if version is not None:
                return dict(DEFAULT_LEVELS), version
        raise FeatureUpdateConflict(f"{FEATURE_ZNODE} keeps changing")

    def save(self, levels: Mapping[str, int], epoch: int) -> int:
        version = self.zk.set_feature_znode(encode_feature_znode(levels), epoch)
        if version is None:
            raise FeatureUpdateConflict(f"{FEATURE_ZNODE} changed since version {epoch}")
        return version

    def follow(self, callback: Callable[[dict[str, int], int], None]) -> None:
        self.zk.watch_feature_znode(lambda data, version: callback(
            decode_feature_znode(data), version) if data is not None else None)


class FinalizedFeatures:
    """The updatable features' finalized levels and epoch, read by ApiVersions and the
    transaction coordinator, changed only through ``update`` (UpdateFeatures)."""

    def __init__(self, store: FeatureStore):
        self._store = store
        self._lock = threading.RLock()   # a watch may call back inside update
        self._levels, self._epoch = store.load()
        follow = getattr(store, "follow", None)
        if follow is not None:
            follow(self._changed)

    @property
    def epoch(self) -> int:
        return self._epoch

    def level(self, name: str) -> int:
        return self._levels.get(name, 0)

    def levels(self) -> dict[str, int]:
        return dict(self._levels)

    def update(self, changes: Mapping[str, int]) -> None:
        """Store ``levels`` with ``changes`` applied (blocking; a conflict raises)."""
        with self._lock:
            levels = {**self._levels, **changes}
            epoch = self._store.save(levels, self._epoch)
            self._levels, self._epoch = levels, epoch
        log.info("finalized features now %s (epoch %d)", levels, epoch)

    def _changed(self, levels: dict[str, int], epoch: int) -> None:
        with self._lock:
            if epoch > self._epoch:
                self._levels, self._epoch = levels, epoch
                log.info("finalized features changed to %s (epoch %d)", levels, epoch)
