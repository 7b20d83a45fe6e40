"""``LeadershipLease``: whether this broker may still do what only a partition leader may do.

A broker in a cluster holds its leaderships through its ZooKeeper session: once the session
expires, the controller gives them to other brokers. While the session is *in doubt* (the
connection is lost and the session may have expired, or a new session has not yet been
initialised) another broker may already lead the same partitions, so a leader must not:
acknowledge acks=all produce requests, move the high watermark, propose ISR changes
(AlterPartition), or write to the remote tier. It may still append, serve fetches and
follower fetches: none of those tells a client a record is committed.

KRaft reaches the same end by fencing a broker whose heartbeats stop; Kafka's ZooKeeper mode
had no such rule.

One broker alone (no ZooKeeper) is never in doubt: ``ALWAYS_HELD``.
"""

from __future__ import annotations

from typing import Callable, Protocol


class LeadershipLease(Protocol):
    """Thread-safe; ``in_doubt`` is cheap enough for every produce and fetch."""

    def in_doubt(self) -> bool:
        """True while this broker may no longer lead what it believes it leads."""
        ...

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` after each change of ``in_doubt()`` (it reads the new value itself:
        calls may arrive on another thread than the change). It must not block."""
        ...


class _AlwaysHeld:
    """The lease of a broker that needs no one's agreement to lead."""

    def in_doubt(self) -> bool:
        return False

    def add_listener(self, listener: Callable[[], None]) -> None:
        pass   # it never changes

    def __repr__(self) -> str:
        return "ALWAYS_HELD"


ALWAYS_HELD: LeadershipLease = _AlwaysHeld()
