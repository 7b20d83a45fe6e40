"""Start a real ``strata serve`` process for client tests, on a free loopback port (or on
``host``, with ``prefix`` before the command: ``ip netns exec NS`` runs it in a namespace)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from support.ports import free_port  # noqa: F401 - re-exported for the tests
from support.waiting import eventually




def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Send ``sig`` to a running ``proc`` and wait; SIGKILL it after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class BrokerProcess:
    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, port: int | None = None,
                 config: Path | None = None, host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 env: dict[str, str] | None = None):
        self.data_dir = Path(data_dir)
        self.env = env or {}   # added to the process's environment (e.g. KRB5_CONFIG)
        self.port = port or free_port()
        self.host = host
        self.prefix = list(prefix)
        self.config = config  # a server.properties file (``--config``); None = embedded defaults
        # As Kafka's test harness (TestUtils.createBrokerConfig): no initial rebalance delay,
        # so a consumer group's first join does not wait 3 s; a test may set one.
        self.overrides = {"listeners": f"PLAINTEXT://{host}:{self.port}",
                          "log.dirs": str(self.data_dir / "kafka-logs"),
                          "group.initial.rebalance.delay.ms": "0",
                          **(overrides or {})}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        args = [*self.prefix, sys.executable, "-m", "strata.cli.main", "serve"]
        if self.config is not None:
            args += ["--config", str(self.config)]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        return args

    def start(self, timeout: float = 30) -> "BrokerProcess":
        return self.launch().wait_listening(timeout)

    def launch(self) -> "BrokerProcess":
        """Start the process without waiting for it to listen."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"the broker on port {self.port} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"})
        return self

    def listener_addresses(self) -> list[tuple[str, int]]:
        """Every (host, port) of the ``listeners`` override (the broker binds them one after
        another); a listener without a host is reached on ``self.host``."""
        found = re.findall(r"://([^,]*):(\d+)", self.overrides.get("listeners", ""))
        return [(h.strip("[]") or self.host, int(p)) for h, p in found if int(p)] or [
            (self.host, self.port)]

    def wait_listening(self, timeout: float = 30) -> "BrokerProcess":
        """Wait until every listener accepts connections."""
        def listening() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.output()}")
            try:
                for address in self.listener_addresses():
                    with socket.create_connection(address, timeout=0.5):
                        pass
                return True
            except OSError:
                return False
        eventually(listening, f"the broker listening on {self.listener_addresses()}", timeout,
                   report=lambda: f"\n{self.output()}")
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logged_errors(self) -> list[str]:
        """The broker log's ERROR lines and tracebacks (a broker fed any input logs none)."""
        return [line for line in self.output().splitlines()
                if " ERROR " in line or "Traceback" in line]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc is None:
            return 0
        stop_process(self.proc, sig, timeout)
        self._log.close()
        code = self.proc.returncode
        self.proc = None
        return code

    def __enter__(self) -> "BrokerProcess":
        """Starts the broker unless ``start()`` already did (``with BrokerProcess(...).start()``)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
