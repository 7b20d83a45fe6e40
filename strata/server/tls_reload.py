"""Listeners' keystores and truststores changed at runtime (Kafka's dynamic
``listener.name.<l>.ssl.keystore.location`` and friends, set with AlterConfigs or
IncrementalAlterConfigs on this broker's BROKER resource, e.g. ``kafka-configs --entity-type
brokers --entity-name 1 --alter --add-config listener.name.external.ssl.keystore.location=...``).

``validate`` is the metadata's ``broker_config_validator``: a change whose new keystore Kafka
would refuse (``tls.check_keystore_update``) is answered INVALID_REQUEST and not stored.
``on_broker_configs_changed`` (a metadata listener: after the change is stored, in a cluster
once ZooKeeper's ``/config/brokers/<id>`` shows it) loads the new stores into the listener's
live TLS context on the event loop: new connections get the new certificate, connections
already made are not touched. The same path given again reloads its file when it changed
since it was loaded (Kafka's behaviour). The stored change survives restarts (the metadata
file, or ZooKeeper), and the broker starts with its effective configs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Mapping, Sequence

from strata.common.errors import InvalidRequestError
from strata.common.listeners import listener_prop
from strata.cluster.metadata import LISTENER_SSL_CONFIGS
from strata.net.tls import (
    TlsConfigError, check_keystore_update, keystore_certificate, reload_server_context)

log = logging.getLogger(__name__)


def _tls_settings(props: Mapping[str, str], listener: str) -> tuple:
    """The listener's store settings and their files' modification times (the same path given
    again reloads a file that changed, as Kafka's SslFactory does)."""
    values = tuple(listener_prop(props, listener, key) for key in sorted(LISTENER_SSL_CONFIGS))
    mtimes = []
    for kind in ("keystore", "truststore"):
        location = listener_prop(props, listener, f"ssl.{kind}.location")
        try:
            mtimes.append(os.stat(location).st_mtime_ns if location else None)
        except OSError:
            mtimes.append(None)
    return values + tuple(mtimes)


class ListenerTlsReloader:
    def __init__(self, metadata, servers: Sequence, loop: asyncio.AbstractEventLoop):
        self._metadata = metadata
        self._servers = [s for s in servers if s.ssl is not None]
        self._loop = loop
        props = metadata.effective_broker_props()
        self._applied = {s.listener: _tls_settings(props, s.listener) for s in self._servers}
        # the certificate each listener serves: what a new keystore is compared with
        self._served = {s.listener: keystore_certificate(props, s.listener)
                        for s in self._servers}

    def validate(self, old: dict, new: dict) -> None:
        for server in self._servers:
            if _tls_settings(new, server.listener) != self._applied.get(server.listener):
                try:
                    check_keystore_update(old, new, server.listener,
                                          current=self._served.get(server.listener))
                except TlsConfigError as exc:
                    raise InvalidRequestError(str(exc)) from None

    def on_broker_configs_changed(self, _rlm_config=None) -> None:
        props = self._metadata.effective_broker_props()
        for server in self._servers:
            settings = _tls_settings(props, server.listener)
            if settings != self._applied.get(server.listener):
                self._applied[server.listener] = settings
                self._loop.call_soon_threadsafe(self._reload, server, props)

    def _reload(self, server, props: dict) -> None:
        try:   # checked again: a change seen from ZooKeeper, or a file changed in place
            check_keystore_update(props, props, server.listener,
                                  current=self._served.get(server.listener))
            certificate = keystore_certificate(props, server.listener)
            reload_server_context(server.ssl, props, server.listener)
        except Exception as exc:  # noqa: BLE001 - the old certificate stays in use
            log.error("listener %s: the new keystore is not used, the old one stays: %s",
                      server.listener, exc)
            return
        self._served[server.listener] = certificate
        log.info("listener %s: keystore reloaded for new connections", server.listener)
