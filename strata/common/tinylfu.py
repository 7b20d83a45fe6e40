"""A byte-weighted W-TinyLFU admission and eviction policy (bookkeeping only, no values).

theine's policy core (``theine_core.TlfuCore``: a window LRU, a segmented main LRU and a
count-min frequency sketch, as in Caffeine) counts *entries*; it has no weigher. Caches
bounded in bytes (the remote index cache, the chunk caches) use it through
:class:`ByteWeightedTinyLfu`, which splits the byte budget into at most ``max_slots`` equal
slots. A key of ``weight`` bytes takes ``ceil(weight / slot_bytes)`` slots, each a policy key
of its own; when the core evicts any slot of a key the whole key is evicted.

The class only decides *which* keys are held: the caller keeps the values, calls
:meth:`~ByteWeightedTinyLfu.admit` when it has a value to cache, :meth:`~ByteWeightedTinyLfu.touch`
on every hit and :meth:`~ByteWeightedTinyLfu.remove` when it drops a value itself, and drops
the values of the keys ``admit`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from theine_core import TlfuCore, spread

__all__ = ["DEFAULT_MAX_SLOTS", "ByteWeightedTinyLfu"]

K = TypeVar("K", bound=Hashable)

# A finer split weighs small keys more exactly; a coarser one makes big keys cheaper to admit
# and touch (one policy key per slot).
DEFAULT_MAX_SLOTS = 16384


class ByteWeightedTinyLfu(Generic[K]):
    """W-TinyLFU over keys weighted in bytes.

    Invariant: the weights of the held keys never add up to more than ``capacity_bytes``
    (a key's slots cover its weight, and the core never holds more slots than fit in the
    budget). A key heavier than the whole budget is never held.

    Not thread-safe (nor is ``TlfuCore``): the owner serialises every call, normally under the
    lock that also guards its values.
    """

    def __init__(self, capacity_bytes: int, *, max_slots: int = DEFAULT_MAX_SLOTS,
                 min_slot_bytes: int = 1) -> None:
        """``max_slots`` bounds the split of the budget; ``min_slot_bytes`` bounds the slot
        size from below, so that a key of ``w`` bytes is never more than ``w / min_slot_bytes``
        policy keys however large the budget."""
        if max_slots < 1:
            raise ValueError(f"max_slots must be at least 1, not {max_slots}")
        self._capacity_bytes = max(0, capacity_bytes)
        self._slot_bytes = max(1, min_slot_bytes, math.ceil(self._capacity_bytes / max_slots))
        self._capacity_slots = self._capacity_bytes // self._slot_bytes
        self._core = TlfuCore(self._capacity_slots) if self._capacity_slots > 0 else None
        self._slots: dict[K, list[int]] = {}    # held key -> its policy keys
        self._weights: dict[K, int] = {}
        self._owner: dict[int, K] = {}           # policy key -> held key
        self._weighted_bytes = 0

    # ---- state -------------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def slot_bytes(self) -> int:
        """Bytes per policy slot: a key's weight is rounded up to a multiple of this."""
        return self._slot_bytes

    @property
    def weighted_bytes(self) -> int:
        """The sum of the weights of the held keys (at most ``capacity_bytes``)."""
        return self._weighted_bytes

    def __len__(self) -> int:
        return len(self._weights)

    def __contains__(self, key: object) -> bool:
        return key in self._weights

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._weights))

    def weight(self, key: K) -> int | None:
        """The weight ``key`` was admitted with, or None when it is not held."""
        return self._weights.get(key)

    # ---- changes -----------------------------------------------------------------------------

    def admit(self, key: K, weight: int) -> list[K]:
        """Offer ``key`` (``weight`` bytes) to the policy; counts as one access of it.

        Returns the keys evicted to make room, in eviction order, with ``key`` itself last
        when the policy rejects it (or it weighs more than the budget): the caller drops
        their values. A key already held with the same weight is only touched; with another
        weight it is admitted afresh.

        Slots are inserted one at a time and a victim's other slots leave the core as soon as
        one of them is evicted, so an admission never evicts more than it needs room for.
        """
        if weight < 0:
            raise ValueError(f"negative weight {weight} for {key!r}")
        held = self._weights.get(key)
        if held is not None:
            if held == weight:
                self.touch(key)
                return []
            self.remove(key)
        slots = max(1, math.ceil(weight / self._slot_bytes))
        core = self._core
        if core is None or slots > self._capacity_slots:
            return [key]
        hashes = self._slot_hashes(key, slots)
        core.access(hashes)  # the request that brings the key counts in its frequency
        self._slots[key] = hashes
        self._weights[key] = weight
        self._weighted_bytes += weight
        evicted: list[K] = []
        for h in hashes:
            for victim_hash in core.set([(h, 0)]):
                victim = self._owner.get(victim_hash)
                if victim is None or not self._forget(victim):
                    continue
                evicted.append(victim)
                if victim == key:   # the newcomer lost: its remaining slots never go in
                    return evicted
        return evicted

    def touch(self, key: K) -> bool:
        """Record an access of ``key`` (a hit); False (and nothing recorded) when not held."""
        hashes = self._slots.get(key)
        if hashes is None:
            return False
        assert self._core is not None
        self._core.access(hashes)
        return True

    def remove(self, key: K) -> bool:
        """Stop holding ``key`` (not an eviction); False when it was not held."""
        return self._forget(key)

    def clear(self) -> None:
        """Drop every key; the frequency history stays."""
        for key in list(self._weights):
            self._forget(key)

    # ---- internals ---------------------------------------------------------------------------

    def _slot_hashes(self, key: K, slots: int) -> list[int]:
        hashes = []
        for i in range(slots):
            h = spread(hash((key, i)))
            salt = 0
            while h in self._owner:  # a 64-bit collision with a held slot: pick another
                salt += 1
                h = spread(hash((key, i, salt)))
            self._owner[h] = key
            hashes.append(h)
        return hashes

    def _forget(self, key: K) -> bool:
        hashes = self._slots.pop(key, None)
        if hashes is None:
            return False
        self._weighted_bytes -= self._weights.pop(key)
        assert self._core is not None
        for h in hashes:
            del self._owner[h]
            self._core.remove(h)   # None for the slot the core just evicted, or never set
        return True
