"""``ZkSessionLease``: the ``LeadershipLease`` of a broker whose leaderships hang on its
ZooKeeper session (``strata.common.leadership_lease``).

Held while the connection is up on a session whose state-change handlers have all run; in
doubt otherwise:

- from the moment kazoo reports the connection SUSPENDED. kazoo does so when a heartbeat goes
  unanswered, within about 2/3 of the negotiated session timeout, while the server expires a
  session only after a whole session timeout without hearing from it: the lease is given up
  before the controller can hand this broker's leaderships to another (given clocks that run
  at about the same rate). CONNECTED again on the same session: held again.
- from LOST (the session expired) until a new session is connected and its handlers have all
  succeeded: the broker's re-registration, which drops the leaderships granted to the
  expired session (``ZkClusterMetadata.on_registered``), runs before the lease is held again.
- after ``close``: for good.

Before the first connection it is in doubt too (nothing is led then anyway).

Threads: ``StrataZkClient`` reports kazoo's states from kazoo's thread and the end of the
handlers from its session thread; ``in_doubt`` may be read from any thread. Listeners are
called through ``notify`` (the client passes its session thread's executor, so they run in
order and never on kazoo's thread).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class ZkSessionLease:
    def __init__(self, notify: Callable[[Callable[[], None]], Any] = lambda fn: fn()):
        self._notify = notify
        self._lock = threading.Lock()
        self._connected = False
        self._initialized = True    # the first session has no expired one to recover from
        self._closed = False
        self._generation = 0        # sessions lost so far
        self._doubt = True
        self._listeners: list[Callable[[], None]] = []

    # ---- LeadershipLease ---------------------------------------------------------------------

    def in_doubt(self) -> bool:
        return self._doubt

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    # ---- what the ZooKeeper client reports ----------------------------------------------------

    def connected(self) -> None:
        self._update("connected", connected=True)

    def suspended(self) -> None:
        self._update("connection suspended", connected=False)

    def expired(self) -> int:
        """The session is lost; returns the token ``session_initialized`` needs."""
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._update("session expired", connected=False, initialized=False)
        return generation

    def session_initialized(self, generation: int) -> None:
        """The handlers of the session that followed loss ``generation`` all succeeded (a
        later loss makes this one's news stale: ignored)."""
        self._update("new session initialised", initialized=True, generation=generation)

    def close(self) -> None:
        self._update("client closed", closed=True)

    # ---- internals -----------------------------------------------------------------------------

    def _update(self, why: str, *, connected: bool | None = None,
                initialized: bool | None = None, closed: bool | None = None,
                generation: int | None = None) -> None:
        with self._lock:
            if self._closed or (generation is not None and generation != self._generation):
                return
            if connected is not None:
                self._connected = connected
            if initialized is not None:
                self._initialized = initialized
            if closed is not None:
                self._closed = closed
            was, self._doubt = self._doubt, \
                self._closed or not self._connected or not self._initialized
            changed = was != self._doubt
            listeners = list(self._listeners) if changed else []
        if not changed:
            return
        if self._doubt and not self._closed:
            log.warning("ZooKeeper session in doubt (%s): no acks=all acknowledged, high "
                        "watermark moved or ISR change proposed until it is held again", why)
        elif not self._doubt:
            log.info("ZooKeeper session held (%s)", why)
        for listener in listeners:
            self._notify(lambda listener=listener: _guarded(listener))


def _guarded(listener: Callable[[], None]) -> None:
    try:
        listener()
    except Exception:  # noqa: BLE001 - one listener's bug must not silence the others
        log.exception("leadership lease listener %r failed", listener)
