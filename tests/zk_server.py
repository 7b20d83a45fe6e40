"""Start a real ZooKeeper server process (scripts/zookeeper-run.sh) on a free loopback port (or
on ``host``, with ``prefix`` before the command: ``ip netns exec NS`` runs it in a namespace)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from broker_process import free_port, stop_process
from support.waiting import eventually

ROOT = Path(__file__).resolve().parents[1]
RUN_SCRIPT = ROOT / "scripts" / "zookeeper-run.sh"
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


def zookeeper_available() -> tuple[bool, str]:
    """(True, "") when a ZooKeeper server can be started here, else (False, why not)."""
    if not ZOOKEEPER_JAR.is_file():
        return False, f"{ZOOKEEPER_JAR} missing: Debian's zookeeper package is not installed " \
                      "(bash scripts/system-deps.sh)"
    if shutil.which("java") is None:
        return False, "java not found"
    return True, ""


def four_letter_word(port: int, word: str, timeout: float = 1.0, host: str = "127.0.0.1") -> str:
    """Sends a four-letter command (``ruok``, ``srvr``) and returns the whole answer."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer:
    """One standalone server with its own data dir; ``tick_ms`` 500 lets tests use sessions
    down to 1 s. Usable as a context manager (start, then stop)."""

    def __init__(self, data_dir: Path, port: int | None = None, tick_ms: int = 500,
                 host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 extra_config: Sequence[str] = (), jvm_flags: Sequence[str] = ()):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.host = host
        self.prefix = list(prefix)
        self.tick_ms = tick_ms
        self.extra_config = list(extra_config)  # zoo.cfg lines (SASL, a secureClientPort)
        self.jvm_flags = list(jvm_flags)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "zookeeper.log"
        self._log = None

    def connect_string(self, chroot: str = "") -> str:
        return f"{self.host}:{self.port}{chroot}"

    def start(self, timeout: float = 60) -> "ZooKeeperServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, "bash", str(RUN_SCRIPT), str(self.port), str(self.data_dir),
             str(self.tick_ms), self.host],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "ZOOKEEPER_EXTRA_CFG": "\n".join(self.extra_config),
                 "ZOOKEEPER_JVM_FLAGS": " ".join(self.jvm_flags)})

        def serving() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited with {self.proc.returncode}:\n{self.output()}")
            return self.serving()
        try:
            eventually(serving, f"zookeeper serving on {self.port}", timeout,
                       report=lambda: f"\n{self.output()}")
        except AssertionError:
            self.kill()
            raise
        return self

    def serving(self) -> bool:
        try:
            return four_letter_word(self.port, "ruok", host=self.host) == "imok"
        except OSError:
            return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pause(self, timeout: float = 10) -> None:
        """SIGSTOP; returns once the kernel reports the process stopped."""
        self._signal(signal.SIGSTOP)
        eventually(lambda: self._proc_state() in ("T", None), "zookeeper stopped", timeout,
                   interval=0.01)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _proc_state(self) -> str | None:
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except (AttributeError, OSError):
            return None
        return stat.rsplit(")", 1)[1].split()[0]

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()  # a stopped JVM would not act on SIGTERM
        stop_process(self.proc, sig, timeout)
        self._log.close()
        self.proc = None

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
