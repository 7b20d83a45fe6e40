"""Keystores changed at runtime: Kafka's checks of a listener's new keystore (same subject DN,
no SAN dropped, unless ssl.allow.dn.changes / ssl.allow.san.changes), the live context serving
the new certificate to new connections while an established one keeps working, and the
dynamic listener configs' rules and persistence in the broker's metadata."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading

import pytest
from cryptography import x509

from strata.common.errors import InvalidRequestError
from strata.cluster.metadata import DEFAULT_BROKER_RESOURCE, OP_SET, ClusterMetadata
from strata.net.tls import TlsConfigError, check_keystore_update, reload_server_context, \
    server_context
from tls_support import make_ca

KEY = "listener.name.ssl.ssl.keystore.location"


def _keystores(tmp_path):
    """The CA, and keystores: the broker's, a renewal (same DN and SANs), another DN, fewer SANs."""
    ca = make_ca(tmp_path / "ca")
    out = {}
    for label, name, hosts in [("old", "broker", ("localhost", "127.0.0.1")),
                               ("renewed", "broker", ("localhost", "127.0.0.1", "b1")),
                               ("other-dn", "intruder", ("localhost", "127.0.0.1")),
                               ("fewer-sans", "broker", ("localhost",))]:
        issued = ca.issue(name, hosts=hosts)
        out[label] = tmp_path / f"{label}.pem"
        shutil.copy(issued.keystore_pem, out[label])
    return ca, out


def _props(path) -> dict:
    return {"ssl.keystore.type": "PEM", KEY: str(path)}


def test_a_renewed_certificate_is_accepted_and_kafkas_refusals_are_made(tmp_path):
    ca, stores = _keystores(tmp_path)
    old = _props(stores["old"])
    check_keystore_update(old, _props(stores["renewed"]), "SSL")
    with pytest.raises(TlsConfigError, match="Keystore DistinguishedName does not match"):
        check_keystore_update(old, _props(stores["other-dn"]), "SSL")
    check_keystore_update(old, {**_props(stores["other-dn"]), "ssl.allow.dn.changes": "true"},
                          "SSL")
    with pytest.raises(TlsConfigError, match="Keystore SubjectAltNames do not match"):
        check_keystore_update(old, _props(stores["fewer-sans"]), "SSL")
    check_keystore_update(old, {**_props(stores["fewer-sans"]),
                                "listener.name.ssl.ssl.allow.san.changes": "true"}, "SSL")
    with pytest.raises(TlsConfigError, match="Validation of dynamic config update"):
        check_keystore_update(old, _props(tmp_path / "missing.pem"), "SSL")
    (tmp_path / "garbage.pem").write_text("not a keystore")
    with pytest.raises(TlsConfigError, match="Validation of dynamic config update"):
        check_keystore_update(old, _props(tmp_path / "garbage.pem"), "SSL")


def _serve(context: ssl.SSLContext, sock: socket.socket, ready: threading.Event) -> None:
    with context.wrap_socket(sock, server_side=True) as s:
        ready.set()
        while data := s.recv(16):
            s.sendall(data)


def _connect(context: ssl.SSLContext, client: ssl.SSLContext):
    a, b = socket.socketpair()
    ready = threading.Event()
    t = threading.Thread(target=_serve, args=(context, a, ready), daemon=True)
    t.start()
    c = client.wrap_socket(b, server_hostname="localhost")
    ready.wait(5)
    return c, t


def _serial(conn: ssl.SSLSocket) -> int:
    return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)).serial_number


def test_a_reloaded_context_serves_the_new_certificate_and_an_established_connection_lives_on(
        tmp_path):
    ca, stores = _keystores(tmp_path)
    context = server_context(_props(stores["old"]), "SSL")
    client = ssl.create_default_context(cafile=str(ca.pem))
    before, t1 = _connect(context, client)
    old_serial = _serial(before)
    reload_server_context(context, _props(stores["renewed"]), "SSL")
    after, t2 = _connect(context, client)
    assert _serial(after) != old_serial
    assert _serial(after) == x509.load_pem_x509_certificate(stores["renewed"].read_bytes()
                                                            ).serial_number
    before.sendall(b"still here")          # the connection made before the swap works on
    assert before.recv(16) == b"still here"
    for conn, t in ((before, t1), (after, t2)):
        conn.close()
        t.join(5)


def test_listener_ssl_configs_are_per_broker_prefixed_checked_and_persisted(tmp_path):
    ca, stores = _keystores(tmp_path)
    logs = tmp_path / "logs"
    metadata = ClusterMetadata(logs, 1, _props(stores["old"]))
    seen = []

    def validator(old, new):
        seen.append((old.get(KEY), new.get(KEY)))
        try:
            check_keystore_update(old, new, "SSL")
        except TlsConfigError as exc:
            raise InvalidRequestError(str(exc)) from None
    metadata.broker_config_validator = validator
    try:
        with pytest.raises(InvalidRequestError, match="only per-listener using the listener prefix"):
            metadata.alter_broker_configs("1", [("ssl.keystore.location", OP_SET, "x")], True)
        with pytest.raises(InvalidRequestError, match="broker id must be specified"):
            metadata.alter_broker_configs(DEFAULT_BROKER_RESOURCE,
                                          [(KEY, OP_SET, str(stores["renewed"]))], True)
        with pytest.raises(InvalidRequestError, match="DistinguishedName does not match"):
            metadata.alter_broker_configs("1", [(KEY, OP_SET, str(stores["other-dn"]))], True)
        assert metadata.effective_broker_props()[KEY] == str(stores["old"])
        metadata.alter_broker_configs("1", [(KEY, OP_SET, str(stores["renewed"]))], True)
        assert seen[-1] == (str(stores["old"]), str(stores["renewed"]))
        (entry,) = metadata.describe_broker_configs([KEY])
        assert (entry.value, entry.read_only, entry.is_sensitive) == (str(stores["renewed"]),
                                                                      False, False)
        assert entry.source.name == "DYNAMIC_BROKER_CONFIG"
    finally:
        metadata.close()
    reopened = ClusterMetadata(logs, 1, _props(stores["old"]))   # as after a restart
    try:
        assert reopened.effective_broker_props()[KEY] == str(stores["renewed"])
    finally:
        reopened.close()


def test_the_reloader_loads_a_file_rotated_in_place_and_refuses_another_dn(tmp_path):
    """A metadata change (here: nothing but a notification) reloads a keystore file changed in
    place when the certificate keeps its DN; one of another DN is logged and not used."""
    import asyncio
    import os
    from types import SimpleNamespace
    from strata.server.tls_reload import ListenerTlsReloader
    ca, stores = _keystores(tmp_path)
    live = tmp_path / "live.pem"
    shutil.copy(stores["old"], live)
    props = _props(live)
    server = SimpleNamespace(listener="SSL", ssl=server_context(props, "SSL"))
    client = ssl.create_default_context(cafile=str(ca.pem))
    loop = asyncio.new_event_loop()
    reloader = ListenerTlsReloader(SimpleNamespace(effective_broker_props=lambda: props),
                                   [server], loop)

    def notified_and_served(source) -> int:
        shutil.copy(source, live)
        stat = live.stat()
        os.utime(live, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime
        reloader.on_broker_configs_changed()
        loop.run_until_complete(asyncio.sleep(0))   # the reload runs on the loop
        conn, t = _connect(server.ssl, client)
        try:
            return _serial(conn)
        finally:
            conn.close()
            t.join(5)
    try:
        def serial_of(label):
            return x509.load_pem_x509_certificate(stores[label].read_bytes()).serial_number
        assert notified_and_served(stores["renewed"]) == serial_of("renewed")
        assert notified_and_served(stores["other-dn"]) == serial_of("renewed")
    finally:
        loop.close()
