"""The brokers a benchmark runs against: Strata (``strata serve``) and Apache Kafka 4.x in KRaft
mode from the Maven Central jars of ``scripts/kafka-dist.sh``, each a subprocess on loopback
with its data in a directory of its own.

Both get the same broker settings (``COMMON_BROKER``) and a filesystem remote tier: Strata its
own (``file://<log dir>/remote-storage``), Kafka the ``LocalTieredStorage`` of its storage test
jars under ``<data dir>/remote-storage``.

    python -m benchmarks.brokers kafka --dir /var/tmp/kafka-ref   # run Kafka in the foreground
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from strata.common.types import uuid_to_kafka_str

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KAFKA_VERSION = "4.4.0"

# Settings both systems get. The intervals are shortened so that tiering and local retention act
# within a benchmark's seconds rather than Kafka's minutes; everything else is Kafka's default.
COMMON_BROKER = {
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "500",
    "log.retention.check.interval.ms": "500",
    "log.segment.delete.delay.ms": "1000",
}

# Kafka's own JVM settings (bin/kafka-server-start.sh and kafka-run-class.sh).
KAFKA_JVM = ["-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
             "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
             "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true"]
LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A broker subprocess on a loopback port, its output in ``<data dir>/broker.log``."""

    system = "?"
    host = "127.0.0.1"     # where it listens (another address when in a network namespace)

    def __init__(self, data_dir: Path, argv: list[str], port: int, env: dict | None = None) -> None:
        self.data_dir = data_dir
        self.argv = argv
        self.port = port
        self.env = env
        self.log_path = data_dir / "broker.log"
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self.started_at = 0.0      # time.monotonic() of the last start()

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60) -> float:
        """Start the process and wait until its port accepts connections and it answers a
        Metadata request with itself as a broker; the seconds that took."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (a cluster's nodes need each other first)."""
        self._log_file = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env=self.env)

    def wait_ready(self, timeout: float = 60) -> float:
        """Wait as ``start`` does for a process ``launch`` started; seconds since the launch."""
        assert self.proc is not None
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.stop()
                raise RuntimeError(f"{self.system} exited with {code}:\n{self.output_tail()}")
            if self._answers_metadata():
                return time.monotonic() - self.started_at
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.system} did not come up on {self.port}:\n{self.output_tail()}")

    def _answers_metadata(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                pass
        except OSError:
            return False
        from confluent_kafka.admin import AdminClient
        try:
            md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:  # noqa: BLE001 - not ready yet
            return False
        return bool(md.brokers)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (a clean shutdown), SIGKILL after ``timeout``; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the process (no clean shutdown) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def output_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def remote_dir(self) -> Path:
        raise NotImplementedError


class StrataBroker(Broker):
    system = "strata"

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, *,
                 port: int | None = None, config: Path | None = None) -> None:
        """``config``: a server.properties for ``--config`` (the overrides go on top)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        props = {"listeners": f"PLAINTEXT://127.0.0.1:{port}",
                 "log.dirs": str(data_dir / "kafka-logs"), **(overrides or {})}
        argv = [sys.executable, "-m", "strata.cli.main", "serve"]
        if config is not None:
            argv += ["--config", str(config)]
        for k, v in props.items():
            argv += ["--override", f"{k}={v}"]
        super().__init__(data_dir, argv, port, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def launch(self) -> None:
        compile_sources()
        super().launch()

    def remote_dir(self) -> Path:
        return self.data_dir / "kafka-logs" / "remote-storage"


def compile_sources() -> None:
    """Write the bytecode of Strata's sources where it is missing or stale, as installing a
    package does, before a broker starts from the working tree: else an environment with
    PYTHONDONTWRITEBYTECODE set (this project's machines have it) compiles every module at
    every start, 0.15-0.2 s of it. Checks file times only when nothing changed."""
    import compileall
    compileall.compile_dir(REPO_ROOT / "strata", quiet=2)


def find_kafka_libs(explicit: str | None = None) -> tuple[Path | None, str]:
    """(libs dir, "") or (None, why Kafka cannot run). Never installs anything."""
    import shutil
    if shutil.which("java") is None:
        return None, "java not found on PATH"
    if explicit:
        libs = Path(explicit)
        return (libs, "") if libs.is_dir() else (None, f"--kafka-libs {libs} is not a directory")
    version = os.environ.get("KAFKA_VERSION", DEFAULT_KAFKA_VERSION)
    root = Path(os.environ.get("KAFKA_CACHE_DIR", REPO_ROOT / ".cache" / "kafka"))
    libs = root / version / "libs"
    if (root / version / ".installed").is_file() and libs.is_dir():
        return libs, ""
    return None, f"Kafka {version} jars not installed in {libs} (run scripts/kafka-dist.sh / make kafka-dist)"


def java_command(libs: Path, main_class: str, *args: str, jvm: list[str] | None = None,
                 log4j: Path | None = None) -> list[str]:
    cmd = ["java", *(jvm if jvm is not None else ["-Xmx512m"])]
    log4j = log4j or libs.parent / "log4j2.properties"
    if log4j.is_file():
        cmd.append(f"-Dlog4j2.configurationFile={log4j}")
    return [*cmd, "-cp", f"{libs}{os.sep}*", main_class, *args]


def kafka_version(libs: Path) -> str:
    for jar in libs.glob("kafka-clients-*.jar"):
        return jar.stem.removeprefix("kafka-clients-")
    return "?"


class KafkaBroker(Broker):
    """Apache Kafka in KRaft combined mode (broker and controller, node 1 unless told) with
    ``LocalTieredStorage`` as its RemoteStorageManager. The storage dir is formatted once, in
    the constructor; ``start`` can then be called again after ``stop`` (a restart).

    One node of a multi-node quorum: pass its ``node_id`` and ports, ``voters`` (the
    ``controller.quorum.voters`` of all nodes) and the ``cluster_id`` all nodes share."""

    system = "kafka"

    def __init__(self, data_dir: Path, libs: Path, overrides: dict[str, str] | None = None,
                 log4j: Path | None = None, *, node_id: int = 1, port: int | None = None,
                 controller_port: int | None = None, voters: str | None = None,
                 cluster_id: str | None = None) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        port, controller_port = port or free_port(), controller_port or free_port()
        self.node_id, self.controller_port = node_id, controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data_dir / "kafka-logs"),
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "remote.log.storage.manager.class.name": LOCAL_TIERED_STORAGE,
            "rsm.config.dir": str(data_dir / "remote-storage"),
            "rsm.config.delete.on.close": "false",
            "remote.log.metadata.manager.listener.name": "PLAINTEXT",
            "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
            **(overrides or {}),
        }
        self.props_path = data_dir / "server.properties"
        self.props_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (data_dir / "remote-storage").mkdir(exist_ok=True)
        self.libs = libs
        cluster_id = cluster_id or uuid_to_kafka_str(uuid.uuid4())
        # "--cluster-id=ID": a random ID can start with "-", which the tool would take for an option
        fmt = java_command(libs, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                           "--config", str(self.props_path), "--ignore-formatted")
        out = subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{shlex.join(fmt)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        argv = java_command(libs, "kafka.Kafka", str(self.props_path), jvm=KAFKA_JVM, log4j=log4j)
        super().__init__(data_dir, argv, port)

    def remote_dir(self) -> Path:
        return self.data_dir / "remote-storage"


def kafka_libs_for(system: str, explicit: str | None = None) -> Path | None:
    """Kafka's jars when ``system`` is Kafka (exits, saying why, when they are missing)."""
    if system != "kafka":
        return None
    libs, why = find_kafka_libs(explicit)
    if libs is None:
        raise SystemExit(why)
    return libs


def make_broker(system: str, data_dir: Path, libs: Path | None,
                overrides: dict[str, str] | None = None, log4j: Path | None = None) -> Broker:
    """``log4j``: a log4j2 config for Kafka in place of the quiet default (WARN to stderr)."""
    props = {**COMMON_BROKER, **(overrides or {})}
    if system == "strata":
        return StrataBroker(data_dir, props)
    if system == "kafka":
        if libs is None:
            raise RuntimeError("Kafka's jars are not installed")
        return KafkaBroker(data_dir, libs, props, log4j=log4j)
    raise ValueError(f"unknown system {system!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one benchmark broker in the foreground.")
    ap.add_argument("system", choices=("strata", "kafka"))
    ap.add_argument("--dir", required=True, help="data directory (created)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.override)
    broker = make_broker(args.system, Path(args.dir), kafka_libs_for(args.system), overrides)
    took = broker.start()
    log(f"{broker.system} is up at {broker.bootstrap} after {took:.1f} s (log: {broker.log_path}); "
        f"Ctrl-C stops it")
    try:
        while broker.proc is not None and broker.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    return broker.stop() or 0


if __name__ == "__main__":
    raise SystemExit(main())
