"""Listeners' keystores and truststores changed at runtime (Kafka's dynamic
``listener.name.<l>.ssl.keystore.location`` and friends, set with AlterConfigs or
IncrementalAlterConfigs on this broker's BROKER resource, e.g. ``kafka-configs --entity-type
brokers --entity-name 1 --alter --add-config listener.name.external.ssl.keystore.location=...``).

``validate`` is the metadata's ``broker_config_validator``: a change whose new keystore Kafka
would refuse (``tls.check_keystore_update``) is answered INVALID_REQUEST and not stored.
``on_broker_configs_changed`` (a metadata listener: after the change is stored, in a cluster
once ZooKeeper's ``/config/brokers/<id>`` shows it) loads the new stores into the listener's
live TLS context on the event loop: new connections get the new certificate, connections
already made are not touched. The stored change survives restarts (the metadata file, or
ZooKeeper), and the broker starts with its effective configs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Mapping, Sequence

from strata.common.errors import InvalidRequestError
from strata.common.listeners import listener_prop
from strata.cluster.metadata import LISTENER_SSL_CONFIGS
from strata.net.tls import TlsConfigError, check_keystore_update, reload_server_context

log = logging.getLogger(__name__)


def _tls_settings(props: Mapping[str, str], listener: str) -> tuple:
    return tuple(listener_prop(props, listener, key) for key in sorted(LISTENER_SSL_CONFIGS))


class ListenerTlsReloader:
    def __init__(self, metadata, servers: Sequence, loop: asyncio.AbstractEventLoop):
        self._metadata = metadata
        self._servers = [s for s in servers if s.ssl is not None]
        self._loop = loop
        props = metadata.effective_broker_props()
        self._applied = {s.listener: _tls_settings(props, s.listener) for s in self._servers}

    def validate(self, old: dict, new: dict) -> None:
        for server in self._servers:
            if _tls_settings(old, server.listener) != _tls_settings(new, server.listener):
                try:
                    check_keystore_update(old, new, server.listener)
                except TlsConfigError as exc:
                    raise InvalidRequestError(str(exc)) from None

    def on_broker_configs_changed(self, _rlm_config=None) -> None:
        props = self._metadata.effective_broker_props()
        for server in self._servers:
            settings = _tls_settings(props, server.listener)
            if settings != self._applied.get(server.listener):
                self._applied[server.listener] = settings
                self._loop.call_soon_threadsafe(self._reload, server, props)

    @staticmethod
    def _reload(server, props: dict) -> None:
        try:
            reload_server_context(server.ssl, props, server.listener)
        except Exception:  # noqa: BLE001 - the old certificate stays in use
            log.exception("listener %s: the new keystore could not be loaded; keeping the old",
                          server.listener)
            return
        log.info("listener %s: keystore reloaded for new connections", server.listener)
