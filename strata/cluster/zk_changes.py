"""Kafka's ``ZkNodeChangeNotificationListener``: a broker's follower of sequential change
notifications (``<path>/<prefix><seq>``) in ZooKeeper, used for ACLs (``/kafka-acl-changes``,
``/kafka-acl-extended-changes``) and delegation tokens (``/delegation_token/token_changes``).

Each path is watched; on a change, every notification after the last one processed is read
and handed to ``on_notification(path, data)`` in sequence order, on the follower's own thread;
notifications older than 15 minutes (by their ctime) are deleted, as Kafka's are. A failure is
logged and retried a second later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

CHANGE_EXPIRATION_MS = 15 * 60 * 1000    # ZkNodeChangeNotificationListener's


class ChangeNotificationFollower:
    def __init__(self, zk, paths: Iterable[str], prefix: str,
                 on_notification: Callable[[str, bytes], None], name: str):
        self.zk = zk   # strata.cluster.zk.client.StrataZkClient
        self.prefix = prefix
        self._on_notification = on_notification
        self._name = name
        self._last_seen = {p: -1 for p in paths}
        self._created: dict[tuple[str, str], int] = {}   # notifications seen: their ctime
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        for path in self._last_seen:
            self.zk.watch_children(path, lambda _names: self._wake.set())

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                self.process()
            except Exception:  # noqa: BLE001 - retried at the next wake-up or in a second
                log.exception("%s: processing change notifications failed", self._name)
                time.sleep(1)
                self._wake.set()

    def process(self) -> None:
        """Hands on every notification made since the last one processed, then deletes the
        notifications older than 15 minutes."""
        now = time.time() * 1000
        n = len(self.prefix)
        for path, last in self._last_seen.items():
            names = sorted(c for c in self.zk.get_children(path) if c.startswith(self.prefix))
            fresh = [c for c in names if int(c[n:]) > last]
            found = self.zk.get_data_many([f"{path}/{c}" for c in fresh])
            for name, f in zip(fresh, found):
                if f is None:
                    continue
                self._created[(path, name)] = f[1].ctime
                self._on_notification(path, f[0])
            if fresh:
                self._last_seen[path] = int(fresh[-1][n:])
        for (path, name), ctime in list(self._created.items()):
            if ctime < now - CHANGE_EXPIRATION_MS:
                del self._created[(path, name)]
                found = self.zk.get_data(f"{path}/{name}")
                if found is not None:
                    self.zk.delete_if(f"{path}/{name}", found[1].version)
