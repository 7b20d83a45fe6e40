"""Config definitions in the manner of Kafka's ConfigDef: typed keys, defaults, validators.

Values arrive as strings (properties files, AlterConfigs) or as Python values; ``ConfigDef.parse``
turns either into typed values and raises ``InvalidConfigError`` naming the key, as Kafka does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

from strata.common.errors import InvalidConfigError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class ConfigType(Enum):
    BOOLEAN = "boolean"
    STRING = "string"
    INT = "int"
    SHORT = "short"
    LONG = "long"
    DOUBLE = "double"
    LIST = "list"
    CLASS = "class"
    PASSWORD = "password"


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()

Validator = Callable[[str, Any], None]


def at_least(minimum: float) -> Validator:
    def check(name: str, value: Any) -> None:
        if value is None or value < minimum:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     f"Value must be at least {minimum}")
    return check


def between(low: float, high: float) -> Validator:
    def check(name: str, value: Any) -> None:
        if value is None or not low <= value <= high:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: "
                                     f"Value must be between {low} and {high}")
    return check


def one_of(*allowed: str, case_sensitive: bool = True) -> Validator:
    def norm(s: str) -> str:
        return s if case_sensitive else s.lower()
    choices = {norm(a) for a in allowed}

    def check(name: str, value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None or norm(v) not in choices:
                raise InvalidConfigError(f"Invalid value {v} for configuration {name}: "
                                         f"String must be one of: {', '.join(allowed)}")
    return check


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: ConfigType
    default: Any
    validator: Validator | None = None
    doc: str = ""


_BOUNDS = {
    ConfigType.SHORT: (-(2**15), 2**15 - 1),
    ConfigType.INT: (-(2**31), INT_MAX),
    ConfigType.LONG: (-(2**63), LONG_MAX),
}


def _convert(key: ConfigKey, value: Any) -> Any:
    t = key.type
    if value is None:
        return None
    try:
        if t is ConfigType.BOOLEAN:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "false"):
                return s == "true"
            raise ValueError("Expected value to be either true or false")
        if t in _BOUNDS:
            if isinstance(value, bool):
                raise ValueError("not a number")
            n = int(str(value).strip()) if isinstance(value, str) else int(value)
            low, high = _BOUNDS[t]
            if not low <= n <= high:
                raise ValueError("out of range")
            return n
        if t is ConfigType.DOUBLE:
            return float(value)
        if t is ConfigType.LIST:
            if isinstance(value, (list, tuple)):
                return [str(v).strip() for v in value]
            s = str(value).strip()
            return [p.strip() for p in s.split(",")] if s else []
        return str(value).strip() if t is not ConfigType.PASSWORD else str(value)
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(f"Invalid value {value} for configuration {key.name}: {exc}")


class ConfigDef:
    """An ordered set of ``ConfigKey``s; parses a mapping into a dict of typed values."""

    def __init__(self, keys: Iterable[ConfigKey] = ()):
        self._keys: dict[str, ConfigKey] = {}
        for k in keys:
            self.add(k)

    def add(self, key: ConfigKey) -> "ConfigDef":
        self._keys[key.name] = key
        return self

    def define(self, name: str, type: ConfigType, default: Any = NO_DEFAULT,
               validator: Validator | None = None, doc: str = "") -> "ConfigDef":
        return self.add(ConfigKey(name, type, default, validator, doc))

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __getitem__(self, name: str) -> ConfigKey:
        return self._keys[name]

    def keys(self) -> Iterable[ConfigKey]:
        return self._keys.values()

    def names(self) -> list[str]:
        return list(self._keys)

    def parse_value(self, name: str, value: Any) -> Any:
        key = self._keys.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown configuration '{name}'")
        parsed = _convert(key, value)
        if key.validator is not None and parsed is not None:
            key.validator(name, parsed)
        return parsed

    def parse(self, props: Mapping[str, Any], *, allow_unknown: bool = True) -> dict[str, Any]:
        """Typed values for every defined key (defaults filled in); unknown keys kept as given."""
        out: dict[str, Any] = {}
        for name, key in self._keys.items():
            if name in props:
                out[name] = self.parse_value(name, props[name])
            elif key.default is NO_DEFAULT:
                raise InvalidConfigError(f"Missing required configuration '{name}' "
                                         "which has no default value.")
            else:
                out[name] = key.default
        for name, value in props.items():
            if name not in self._keys:
                if not allow_unknown:
                    raise InvalidConfigError(f"Unknown configuration '{name}'")
                out[name] = value
        return out


class AbstractConfig:
    """Parsed config values; ``cfg.get('segment.bytes')`` or ``cfg.segment_bytes``."""

    definition: ConfigDef = ConfigDef()

    def __init__(self, props: Mapping[str, Any] | None = None, *, allow_unknown: bool = True):
        self.originals: dict[str, Any] = dict(props or {})
        self.values: dict[str, Any] = self.definition.parse(self.originals,
                                                            allow_unknown=allow_unknown)

    def get(self, name: str) -> Any:
        return self.values[name]

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_") or attr in ("values", "originals"):
            raise AttributeError(attr)
        try:
            return self.values[attr.replace("_", ".")]
        except KeyError:
            raise AttributeError(attr) from None

    def with_overrides(self, overrides: Mapping[str, Any]):
        merged = dict(self.originals)
        merged.update(overrides)
        return type(self)(merged)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.values == self.values  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.originals!r})"


_PROP_LINE = re.compile(r"^\s*([^=:\s]+)\s*[=:]\s*(.*?)\s*$")


def load_properties(text: str) -> dict[str, str]:
    """Parse a Java-style ``.properties`` text (``#``/``!`` comments, ``key=value``, ``\\`` continuation)."""
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        if not line or line[0] in "#!":
            continue
        m = _PROP_LINE.match(line)
        if m:
            props[m.group(1)] = m.group(2)
    return props
