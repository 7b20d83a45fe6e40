"""A real S3-API server for tests: moto's server in a subprocess, behind a TCP proxy that can
cut the network while moto (and its data) lives on.

    with S3Server() as s3:
        rsm.configure(s3.rsm_configs(prefix="t1/"))
        s3.cut()        # every connection through the proxy is reset, new ones too
        s3.restore()
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

from support.ports import free_port
from support.waiting import eventually

__all__ = ["S3Server", "TcpProxy", "free_port"]




def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a dead peer or a cut link looks to the client."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target``; ``cut()`` resets every open connection and
    every new one until ``restore()``. One thread accepts; one thread pumps each connection."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = False
        self._closed = False
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, name="s3-proxy-accept",
                                        daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            conns, self._conns = self._conns, set()
        for sock in conns:
            _reset(sock)

    def restore(self) -> None:
        self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        try:
            self._listener.close()
        except OSError:
            pass
        self._thread.join(timeout=2)

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._cut:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True,
                             name="s3-proxy-pump").start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        sel = selectors.DefaultSelector()
        try:
            for sock in peer:
                sock.setblocking(True)
                sock.settimeout(None)
                sel.register(sock, selectors.EVENT_READ)
            while not self._cut and not self._closed:
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj
                    data = sock.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    peer[sock].sendall(data)  # type: ignore[index]
        except (OSError, ValueError):
            pass
        finally:
            sel.close()
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            _reset(client)
            _reset(upstream)


class S3Server:
    """moto's S3 server on a free port plus a TcpProxy in front of it, with one bucket.

    Clients should use ``endpoint`` (the proxy) so that ``cut()``/``restore()`` affect them;
    ``direct_endpoint`` bypasses the proxy (for checks while cut).
    """

    def __init__(self, bucket: str = "strata-tiered", region: str = "us-east-1",
                 startup_timeout: float = 30.0) -> None:
        self.bucket = bucket
        self.region = region
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proxy: TcpProxy | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> S3Server:
        self.port = free_port()
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_DEFAULT_REGION=self.region)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready()
            self._request("PUT", f"/{self.bucket}")
            self.proxy = TcpProxy(self.port)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        def answering() -> bool:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._process.returncode}")
            self._request("GET", "/")
            return True
        eventually(answering, "the moto server answering", self.startup_timeout, interval=0.1,
                   ignoring=(OSError, urllib.error.URLError))

    def _request(self, method: str, path: str) -> bytes:
        req = urllib.request.Request(self.direct_endpoint + path, method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.read()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- network faults ---------------------------------------------------------------------

    @property
    def proxy_port(self) -> int:
        assert self.proxy is not None, "S3Server not started"
        return self.proxy.port

    def cut(self) -> None:
        """Make "the S3 server" unreachable: reset open connections and refuse new ones."""
        assert self.proxy is not None, "S3Server not started"
        self.proxy.cut()

    def restore(self) -> None:
        assert self.proxy is not None, "S3Server not started"
        self.proxy.restore()

    # ---- client configuration ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def direct_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_configs(self, *, timeout_ms: int = 5000, max_retries: int = 2) -> dict[str, Any]:
        """The ``storage.*`` keys that point obstore at the bucket through the proxy, with
        short timeouts and few retries so that an outage surfaces within seconds."""
        return {
            "storage.url": f"s3://{self.bucket}",
            "storage.aws_endpoint": self.endpoint,
            "storage.aws_access_key_id": "testing",
            "storage.aws_secret_access_key": "testing",
            "storage.aws_region": self.region,
            "storage.aws_allow_http": "true",
            "storage.aws_virtual_hosted_style_request": "false",
            "storage.client.timeout": f"{timeout_ms}ms",
            "storage.client.connect_timeout": "1s",
            "storage.retry.max_retries": max_retries,
            "storage.retry.init_backoff_ms": 50,
            "storage.retry.max_backoff_ms": 200,
            "storage.retry.retry_timeout_ms": 2 * timeout_ms,
        }

    def rsm_configs(self, prefix: str = "", **kw: Any) -> dict[str, Any]:
        """RSM configuration (``rsm.config.``-stripped) for the bucket, keys under ``prefix``."""
        return {**self.storage_configs(**kw), "key.prefix": prefix}
