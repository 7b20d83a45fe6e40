"""Client quota configs: Kafka's ``ClientQuotaControlManager`` (alter) and ``ClientQuotasImage``
(describe) for one node.

A quota entity is a set of (entity type, name) pairs, at most one per type: ``user``,
``client-id`` (alone or together) or ``ip`` (alone); a name of ``None`` is the type's
``<default>`` entity. Each entity holds quota values by key (``producer_byte_rate``,
``consumer_byte_rate``, ``request_percentage``, ``controller_mutation_rate`` for users and
client ids, ``connection_creation_rate`` for ips), all positive doubles as on the wire.

On disk, in the first log dir: ``__strata_client_quotas.json``, rewritten whole and
atomically (tmp file, fsync, rename, dir fsync) by each alteration that changes something::

    {"version": 1, "entities": [{"entity": {"client-id": "app", "user": null},
                                 "quotas": {"producer_byte_rate": 1048576.0}}]}

Invariants: no stored entity has an empty quota map; readers see an immutable snapshot that
each alteration replaces whole, after the file is written; listeners are called with the
new snapshot under the store's lock, so they see changes one at a time and in order.
Threads: any thread may call any method.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from strata.common.errors import ErrorCode, KafkaError
from strata.common.files import atomic_write

log = logging.getLogger(__name__)

QUOTAS_FILE = "__strata_client_quotas.json"
FORMAT_VERSION = 1

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

_LONG_MAX = float(2**63 - 1)
_INT_MAX = float(2**31 - 1)
# key -> (kind, upper bound) as Kafka's QuotaConfig defines them
USER_CLIENT_QUOTA_KEYS = {
    PRODUCER_BYTE_RATE: ("LONG", _LONG_MAX),
    CONSUMER_BYTE_RATE: ("LONG", _LONG_MAX),
    REQUEST_PERCENTAGE: ("DOUBLE", math.inf),
    CONTROLLER_MUTATION_RATE: ("DOUBLE", math.inf),
}
IP_QUOTA_KEYS = {CONNECTION_CREATION_RATE: ("INT", _INT_MAX)}

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

# An entity: ((type, name or None for <default>), ...) sorted by type.
Entity = tuple[tuple[str, "str | None"], ...]
Snapshot = Mapping[Entity, Mapping[str, float]]


def make_entity(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(pairs, key=lambda p: p[0]))


def entity_text(entity: Entity) -> str:
    """Kafka's ``ClientQuotaEntity.toString``."""
    inner = ", ".join(f"{t}={n}" for t, n in entity)
    return f"ClientQuotaEntity(entries={{{inner}}})"


def _invalid(message: str) -> tuple[ErrorCode, str]:
    return ErrorCode.INVALID_REQUEST, message


def _valid_ip(name: str | None) -> bool:
    if name is None:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def _entity_error(pairs: list[tuple[str, str | None]]) -> tuple[ErrorCode, str] | None:
    if not pairs:
        return _invalid("Invalid empty client quota entity")
    seen: set[str] = set()
    for entity_type, name in pairs:
        if entity_type in seen:
            return _invalid(f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in (USER, CLIENT_ID, IP):
            return _invalid(f"Unhandled client quota entity type: {entity_type}")
        seen.add(entity_type)
        if name is not None and name == "":
            return _invalid(f"Empty {entity_type} not supported")
    return None


def _keys_for(entity: dict[str, str | None]) -> dict[str, tuple[str, float]] | tuple[ErrorCode, str]:
    if IP in entity:
        if USER in entity or CLIENT_ID in entity:
            # Kafka's message, missing space included
            return _invalid("Invalid quota entity combination, IP entity should"
                            "not be combined with User or ClientId")
        if not _valid_ip(entity[IP]):
            return _invalid(f"{entity[IP]} is not a valid IP or resolvable host.")
        return IP_QUOTA_KEYS
    return USER_CLIENT_QUOTA_KEYS


def _value_error(keys: Mapping[str, tuple[str, float]], key: str,
                 value: float) -> tuple[ErrorCode, str] | None:
    spec = keys.get(key)
    if spec is None:
        return _invalid(f"Invalid configuration key {key}")
    if not value > 0.0:
        return _invalid(f"Quota {key} must be greater than 0")
    kind, upper = spec
    if kind == "DOUBLE":
        return None
    if value > upper:
        article = "an" if kind == "INT" else "a"
        return _invalid(f"Proposed value for {key} is too large for {article} {kind}.")
    if abs(math.fmod(value, 1.0)) > 1e-6:
        return _invalid(f"{key} cannot be a fractional value.")
    return None


class ClientQuotaStore:
    """The configured client quotas, persisted in ``log_dir`` (in memory when ``None``)."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self._path = None if log_dir is None else Path(log_dir) / QUOTAS_FILE
        self._lock = threading.RLock()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._quotas: Snapshot = MappingProxyType(self._load())

    # ---- persistence ---------------------------------------------------------------------------

    def _load(self) -> dict[Entity, Mapping[str, float]]:
        if self._path is None or not self._path.exists():
            return {}
        try:
            doc = json.loads(self._path.read_bytes())
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            out = {}
            for item in doc["entities"]:
                entity = make_entity((str(t), None if n is None else str(n))
                                     for t, n in item["entity"].items())
                quotas = {str(k): float(v) for k, v in item["quotas"].items()}
                if quotas:
                    out[entity] = MappingProxyType(quotas)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RuntimeError(f"Unreadable client quotas file {self._path}: {exc}") from exc
        if out:
            log.info("loaded client quotas of %d entities from %s", len(out), self._path)
        return out

    def _persist(self, quotas: Mapping[Entity, Mapping[str, float]]) -> None:
        if self._path is None:
            return
        doc = {"version": FORMAT_VERSION,
               "entities": [{"entity": dict(entity), "quotas": dict(values)}
                            for entity, values in sorted(quotas.items(), key=lambda e: repr(e[0]))]}
        atomic_write(self._path, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8"))

    # ---- reads ---------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self._quotas

    def add_listener(self, listener: Callable[[Snapshot], None]) -> None:
        """Call ``listener(snapshot)`` now and after every change."""
        with self._lock:
            self._listeners.append(listener)
            listener(self._quotas)

    def describe(self, components: Iterable[tuple[str, int, str | None]],
                 strict: bool) -> list[tuple[Entity, Mapping[str, float]]]:
        """DescribeClientQuotas: the entities matching every (type, match type, match)
        filter component; with ``strict``, only those with no other entity types. Raises
        KafkaError (INVALID_REQUEST, UNSUPPORTED_VERSION) for a bad filter, as Kafka does."""
        exact: dict[str, str | None] = {}
        specified: set[str] = set()
        for entity_type, match_type, match in components:
            if entity_type == "":
                raise KafkaError("Invalid empty entity type.", code=ErrorCode.INVALID_REQUEST)
            if entity_type in exact or entity_type in specified:
                raise KafkaError(f"Entity type {entity_type} cannot appear more than once in the "
                                 "filter.", code=ErrorCode.INVALID_REQUEST)
            if entity_type not in (IP, USER, CLIENT_ID):
                raise KafkaError(f"Unsupported entity type {entity_type}",
                                 code=ErrorCode.UNSUPPORTED_VERSION)
            if match_type == MATCH_EXACT:
                if match is None:
                    raise KafkaError("Request specified MATCH_TYPE_EXACT, but set match string to "
                                     "null.", code=ErrorCode.INVALID_REQUEST)
                exact[entity_type] = match
            elif match_type == MATCH_DEFAULT:
                if match is not None:
                    raise KafkaError("Request specified MATCH_TYPE_DEFAULT, but also specified a "
                                     "match string.", code=ErrorCode.INVALID_REQUEST)
                exact[entity_type] = None
            elif match_type == MATCH_SPECIFIED:
                if match is not None:
                    raise KafkaError("Request specified MATCH_TYPE_SPECIFIED, but also specified "
                                     "a match string.", code=ErrorCode.INVALID_REQUEST)
                specified.add(entity_type)
            else:
                raise KafkaError(f"Unknown match type {match_type}", code=ErrorCode.INVALID_REQUEST)
        if (IP in exact or IP in specified) and (exact.keys() | specified) & {USER, CLIENT_ID}:
            raise KafkaError("Invalid entity filter component combination. IP filter component "
                             "should not be used with user or clientId filter component.",
                             code=ErrorCode.INVALID_REQUEST)
        out = []
        for entity, values in self._quotas.items():
            names = dict(entity)
            if any(t not in names or names[t] != n for t, n in exact.items()):
                continue
            if any(t not in names for t in specified):
                continue
            if strict and len(names) != len(exact) + len(specified):
                continue
            out.append((entity, values))
        return out

    # ---- alterations ---------------------------------------------------------------------------

    def alter(self, entries: Iterable[tuple[list[tuple[str, str | None]],
                                            list[tuple[str, float | None]]]],
              validate_only: bool = False) -> list[tuple[ErrorCode, str | None]]:
        """AlterClientQuotas: per entry (entity pairs, [(key, value or None to remove)]), its
        (error code, message), in order. An entry with any error changes nothing, nor does a
        repeat of an earlier entry's entity; the others apply together (unless ``validate_only``) and are durable before this returns."""
        with self._lock:
            new = dict(self._quotas)
            results: list[tuple[ErrorCode, str | None]] = []
            seen: set[Entity] = set()
            for pairs, ops in entries:
                entity = make_entity(pairs)
                if entity in seen:
                    results.append(_invalid(f"Ignoring duplicate entity {entity_text(entity)}"))
                    continue
                seen.add(entity)
                error, values = self._altered(pairs, ops, new.get(entity, {}))
                if error is not None:
                    results.append(error)
                    continue
                if values:
                    new[entity] = MappingProxyType(values)
                else:
                    new.pop(entity, None)
                results.append((ErrorCode.NONE, None))
            if not validate_only and new != dict(self._quotas):
                self._persist(new)
                self._quotas = MappingProxyType(new)
                for listener in self._listeners:
                    listener(self._quotas)
        return results

    @staticmethod
    def _altered(pairs: list[tuple[str, str | None]], ops: list[tuple[str, float | None]],
                 current: Mapping[str, float]) -> tuple[tuple[ErrorCode, str] | None,
                                                        dict[str, float]]:
        """The entity's quotas after ``ops``, or the first error (Kafka's checks, in order)."""
        keys_seen: set[str] = set()
        for key, _value in ops:
            if key in keys_seen:
                return _invalid(f"Duplicate quota key {key} not updating quota for this entity "
                                f"{entity_text(make_entity(pairs))}"), {}
            keys_seen.add(key)
        error = _entity_error(pairs)
        if error is not None:
            return error, {}
        keys = _keys_for(dict(pairs))
        if isinstance(keys, tuple):
            return keys, {}
        values = dict(current)
        for key, value in ops:
            if value is None:
                values.pop(key, None)
                continue
            error = _value_error(keys, key, value)
            if error is not None:
                return error, {}
            values[key] = float(value)
        return None, values
