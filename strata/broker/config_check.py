"""Broker config checks at start (Kafka's ``KafkaConfig`` parsing and ``logUnused``): unknown
keys are warned about by name with the nearest known key, a value its type cannot hold stops the
broker with one line naming the key, the value and what is accepted, and the effective config is
logged as Kafka logs ``KafkaConfig values:`` (password values ``[hidden]``).

Known keys: Strata's broker configs (``BROKER_CONFIG_KEYS``), Kafka's (``KAFKA_BROKER_CONFIGS``,
generated from Kafka's jars), the ones only Strata reads (``STRATA_BROKER_CONFIGS``: ZooKeeper
mode, Strata's own ``strata.*``, keys Kafka 4 dropped), and any key under a prefix that names a
plugin's or a listener's configs (``listener.name.<l>.``, the RSM's and RLMM's prefixes)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from strata.cluster.metadata import (
    BROKER_CONFIG_KEYS, broker_config_type, render_config_value, sensitive_broker_config)
from strata.common.config import ConfigType
from strata.common.kafka_broker_configs import KAFKA_BROKER_CONFIGS

# Broker keys Strata reads that Kafka 4's KafkaConfig does not define, with their types.
STRATA_BROKER_CONFIGS: dict[str, ConfigType] = {
    "zookeeper.connect": ConfigType.STRING,
    "zookeeper.connection.timeout.ms": ConfigType.INT,
    "zookeeper.session.timeout.ms": ConfigType.INT,
    "zookeeper.metadata.wait.ms": ConfigType.LONG,
    "zookeeper.set.acl": ConfigType.BOOLEAN,
    "zookeeper.sasl.client": ConfigType.BOOLEAN,
    "zookeeper.sasl.clientconfig": ConfigType.STRING,
    "zookeeper.ssl.client.enable": ConfigType.BOOLEAN,
    "zookeeper.clientCnxnSocket": ConfigType.STRING,
    "broker.id": ConfigType.INT,
    "allow.everyone.if.no.acl.found": ConfigType.BOOLEAN,
    "super.users": ConfigType.STRING,
    "delegation.token.master.key": ConfigType.PASSWORD,
    "leader.imbalance.per.broker.percentage": ConfigType.INT,
    "leader.replication.throttled.rate": ConfigType.LONG,
    "follower.replication.throttled.rate": ConfigType.LONG,
    "replica.alter.log.dirs.io.max.bytes.per.second": ConfigType.LONG,
    "min.incremental.fetch.session.eviction.ms": ConfigType.INT,
    "strata.log.dir.probe.interval.ms": ConfigType.LONG,
    "strata.remote.cluster.lease.ms": ConfigType.LONG,
    "strata.remote.manifest.interval.ms": ConfigType.LONG,
    "strata.remote.manifests.enable": ConfigType.BOOLEAN,
    "strata.remote.cluster.snapshot.interval.ms": ConfigType.LONG,
}
# Prefixes whose keys belong to a plugin or a listener; the RSM's and RLMM's are read from
# the props (remote.log.*.impl.prefix) as well.
PLUGIN_PREFIXES = ("listener.name.", "zookeeper.ssl.", "remote.log.metadata.", "rsm.config.",
                   "rlmm.config.")
_PREFIX_KEYS = ("remote.log.storage.manager.impl.prefix", "remote.log.metadata.manager.impl.prefix")

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")
_BOUNDS = {ConfigType.SHORT: 2**15, ConfigType.INT: 2**31, ConfigType.LONG: 2**63}
_ACCEPTED = {
    ConfigType.BOOLEAN: "true or false",
    ConfigType.SHORT: f"an integer from {-2**15} to {2**15 - 1}",
    ConfigType.INT: f"an integer from {-2**31} to {2**31 - 1}",
    ConfigType.LONG: f"an integer from {-2**63} to {2**63 - 1}",
    ConfigType.DOUBLE: "a number",
}


class ConfigProblem(Exception):
    """A broker config that stops the start; ``str()`` is the one line to print."""


def config_type(name: str) -> ConfigType | None:
    """The type of a broker key: Strata's, Kafka's or one only Strata reads; None if unknown."""
    return broker_config_type(name) or STRATA_BROKER_CONFIGS.get(name)


def known_keys() -> frozenset[str]:
    return frozenset(BROKER_CONFIG_KEYS) | frozenset(KAFKA_BROKER_CONFIGS) | frozenset(
        STRATA_BROKER_CONFIGS)


def _is_known(name: str, prefixes: tuple[str, ...], known: frozenset[str]) -> bool:
    return name in known or any(p and name.startswith(p) for p in prefixes)


def unknown_keys(props: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The keys of ``props`` no broker config names, each with the nearest known key (None
    when nothing is close), in the order given."""
    known = known_keys()
    prefixes = PLUGIN_PREFIXES + tuple(str(props[k]).strip() for k in _PREFIX_KEYS if k in props)
    out = []
    for name in props:
        if not _is_known(name, prefixes, known):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            out.append((name, close[0] if close else None))
    return out


def unknown_key_warnings(props: Mapping[str, str], origin: Mapping[str, str] | None = None
                         ) -> list[str]:
    """One warning line per unknown key; ``origin`` says where a key was set (the file or
    ``--override``)."""
    lines = []
    for name, nearest in unknown_keys(props):
        where = f" ({origin[name]})" if origin and name in origin else ""
        hint = f"; did you mean '{nearest}'?" if nearest else ""
        lines.append(f"unknown broker config '{name}'{where} is ignored{hint}")
    return lines


def check_value(name: str, value: str) -> None:
    """Raise ConfigProblem when ``value`` is not a value of ``name``'s type (as Kafka's
    ConfigDef parses it: trimmed, booleans in any case, Java's integer and double syntax)."""
    type_ = config_type(name)
    s = str(value).strip()
    if type_ is ConfigType.BOOLEAN:
        ok = s.lower() in ("true", "false")
    elif type_ in _BOUNDS:
        bound = _BOUNDS[type_]
        ok = bool(_INTEGER.fullmatch(s)) and -bound <= int(s) < bound
    elif type_ is ConfigType.DOUBLE:
        ok = bool(_DOUBLE.fullmatch(s))
    else:
        return
    if not ok:
        raise ConfigProblem(f"invalid value '{value}' for broker config '{name}': "
                            f"expected {_ACCEPTED[type_]}")


def check_values(props: Mapping[str, str]) -> None:
    """Raise ConfigProblem for the first key (in sorted order) whose value its type refuses."""
    for name in sorted(props):
        check_value(name, props[name])


def effective_config(props: Mapping[str, str]) -> str:
    """Kafka's ``KafkaConfig values:`` block: every broker config Strata defines (unless
    internal and unset) and every known key set, sorted, ``null`` when unset, password values
    ``[hidden]``."""
    known = known_keys()
    names = {n for n, k in BROKER_CONFIG_KEYS.items() if not k.internal or n in props}
    names.update(n for n in props if n in known or n.startswith("listener.name."))
    lines = ["KafkaConfig values: "]
    for name in sorted(names):
        if sensitive_broker_config(name) or config_type(name) is ConfigType.PASSWORD:
            value = "[hidden]" if name in props else "null"
        else:
            key = BROKER_CONFIG_KEYS.get(name)
            raw = props.get(name, key.default if key is not None else None)
            value = "null" if raw is None else render_config_value(raw, None)
        lines.append(f"\t{name} = {value}")
    return "\n".join(lines)


def origins(path: str | None, file_keys: Iterable[str], overrides: Iterable[str]) -> dict[str, str]:
    """Where each key was set: ``--override`` wins over the file."""
    out = {k: f"in {path}" for k in file_keys}
    for item in overrides:
        out[item.partition("=")[0].strip()] = "--override"
    return out
