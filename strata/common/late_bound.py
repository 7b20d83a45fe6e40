"""A collaborator given after its user is built, because it needs that user first (Kafka's
BrokerServer passes such parts as suppliers). The user declares it in its constructor; the
builder sets it once. ``get()`` is None until then, which the user treats as "not there"."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class LateBound(Generic[T]):
    """Set once (a second ``set`` is a wiring error); read with ``get``."""

    __slots__ = ("name", "_value", "_set")

    def __init__(self, name: str) -> None:
        self.name = name
        self._value: T | None = None
        self._set = False

    @classmethod
    def of(cls, name: str, value: T | LateBound[T] | None) -> LateBound[T]:
        """``value`` itself when it is a LateBound, else one already set to it (unset for None)."""
        if isinstance(value, LateBound):
            return value
        bound: LateBound[T] = cls(name)
        if value is not None:
            bound.set(value)
        return bound

    def set(self, value: T) -> None:
        if self._set:
            raise RuntimeError(f"{self.name} is already set")
        self._value, self._set = value, True

    def get(self) -> T | None:
        return self._value

    def __repr__(self) -> str:
        return f"LateBound({self.name}={self._value!r})"
