"""Kafka's listener configuration: ``listeners``, ``advertised.listeners``,
``listener.security.protocol.map``, ``inter.broker.listener.name`` /
``security.inter.broker.protocol`` and per-listener settings (``listener.name.<l>.<key>``).

``parse_listeners(props)`` validates them as Kafka's ``KafkaConfig`` does, with its messages:
listener names unique and each mapped to a security protocol (the map's default maps the four
protocol names to themselves), ports unique but for 0, advertised listeners a subset of the
listeners (all of them when unset), the inter-broker listener among the advertised ones.
Where Kafka refuses a configuration that sets neither inter-broker key and has no PLAINTEXT
listener, Strata takes the first advertised listener. Pure; any thread may call it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Listener", "ListenerConfig", "ListenerConfigError", "SECURITY_PROTOCOLS",
           "parse_listeners"]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)
DEFAULT_LISTENERS = "PLAINTEXT://:9092"
_ENTRY = re.compile(r"^([A-Za-z0-9_.-]+)://(\[[0-9a-fA-F:]+\]|[^:\[\]]*):(-?\d+)$")


class ListenerConfigError(ValueError):
    """A listener setting Kafka would refuse at startup."""


@dataclass(frozen=True)
class Listener:
    """One listener: its name, the host and port (bound or advertised; host "" binds all
    interfaces) and its security protocol."""

    name: str
    host: str
    port: int
    security_protocol: str

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class ListenerConfig:
    listeners: tuple[Listener, ...]
    advertised: tuple[Listener, ...]
    inter_broker_listener: str

    def advertised_of(self, name: str) -> Listener:
        return next(a for a in self.advertised if a.name == name)

    @property
    def inter_broker(self) -> Listener:
        return self.advertised_of(self.inter_broker_listener)


def listener_prop(props: Mapping[str, str], listener: str, key: str,
                  default: str | None = None) -> str | None:
    """``listener.name.<listener lower-case>.<key>`` if set, else ``key``, else ``default``
    (Kafka's per-listener override)."""
    value = props.get(f"listener.name.{listener.lower()}.{key}")
    if value is None:
        value = props.get(key, default)
    return value


def _protocol_map(props: Mapping[str, str]) -> dict[str, str]:
    raw = props.get("listener.security.protocol.map", DEFAULT_PROTOCOL_MAP)
    out: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",") if e.strip()):
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise ListenerConfigError(
                f"Invalid value {raw} for configuration listener.security.protocol.map: Map "
                f"entry '{entry}' is invalid (a listener name and one of "
                f"{', '.join(SECURITY_PROTOCOLS)} expected)")
        if name in out:
            raise ListenerConfigError(
                f"Invalid value {raw} for configuration listener.security.protocol.map: "
                f"Duplicate key: {name}")
        out[name] = protocol
    return out


def _entries(raw: str, key: str, protocols: dict[str, str]) -> tuple[Listener, ...]:
    out: list[Listener] = []
    for entry in (e.strip() for e in raw.split(",") if e.strip()):
        m = _ENTRY.match(entry)
        if m is None:
            raise ListenerConfigError(f"Invalid value {raw} for configuration {key}: Unable to "
                                      f"parse {entry} to a broker endpoint")
        name, host, port = m.group(1).upper(), m.group(2).strip("[]"), int(m.group(3))
        if name not in protocols:
            raise ListenerConfigError(
                f"Invalid value {raw} for configuration {key}: No security protocol defined "
                f"for listener {name}")
        if not 0 <= port <= 65535:
            raise ListenerConfigError(f"Invalid value {raw} for configuration {key}: port "
                                      f"{port} is out of range")
        out.append(Listener(name, host, port, protocols[name]))
    names = [entry.name for entry in out]
    if len(set(names)) != len(names):
        raise ListenerConfigError(f"Invalid value {raw} for configuration {key}: Each listener "
                                  f"must have a different name, listeners: {raw}")
    return tuple(out)


def parse_listeners(props: Mapping[str, str]) -> ListenerConfig:
    protocols = _protocol_map(props)
    listeners = _entries(props.get("listeners") or DEFAULT_LISTENERS, "listeners", protocols)
    if not listeners:
        raise ListenerConfigError("listeners must name at least one listener")
    ports = [entry.port for entry in listeners if entry.port != 0]
    if len(set(ports)) != len(ports):
        raise ListenerConfigError(f"Invalid value {props.get('listeners')} for configuration "
                                  f"listeners: Each listener must have a different port")
    advertised_raw = props.get("advertised.listeners")
    advertised = (_entries(advertised_raw, "advertised.listeners", protocols)
                  if advertised_raw else listeners)
    known = {entry.name for entry in listeners}
    for entry in advertised:
        if entry.name not in known:
            raise ListenerConfigError(
                f"advertised.listeners listener names must be equal to or a subset of the ones "
                f"defined in listeners. Found {','.join(a.name for a in advertised)}. The valid "
                f"options based on currently configured listeners are {','.join(sorted(known))}")
    name = (props.get("inter.broker.listener.name") or "").strip().upper()
    protocol = (props.get("security.inter.broker.protocol") or "").strip().upper()
    if name and protocol:
        raise ListenerConfigError("Only one of inter.broker.listener.name and "
                                  "security.inter.broker.protocol should be set.")
    if not name:
        name = protocol or "PLAINTEXT"
        if protocol and protocol not in SECURITY_PROTOCOLS:
            raise ListenerConfigError(f"Invalid value {protocol} for configuration "
                                      f"security.inter.broker.protocol")
        if not protocol and all(a.name != name for a in advertised):
            name = advertised[0].name    # one listener of another name: it is the broker's own
    if all(a.name != name for a in advertised):
        raise ListenerConfigError(
            f"inter.broker.listener.name must be a listener name defined in "
            f"advertised.listeners. The valid options based on currently configured listeners "
            f"are {','.join(a.name for a in advertised)}")
    return ListenerConfig(listeners, advertised, name)
