"""Start a Strata cluster for integration tests: one real ZooKeeper (tests/zk_server.py) and N
``strata serve`` processes (tests/broker_process.py) joined through it.

    with StrataCluster(tmp_path, brokers=3, overrides={"default.replication.factor": "3"}) as c:
        producer = Producer({"bootstrap.servers": c.bootstrap})
        c.broker(2).kill(); c.wait_metadata({1, 3})
        c.broker(2).start(); c.wait_metadata()

``placement`` puts ZooKeeper and each broker on an address and runs them behind a command
prefix (benchmarks/netfault.py's Network: a network namespace each); by default all on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse

from broker_process import BrokerProcess, free_port
from cluster_clients import RUNNING_CLUSTERS, forget_admins
from strata.net.connection import roundtrip
from support.waiting import eventually
from zk_server import ZooKeeperServer

ROOT = Path(__file__).resolve().parents[1]
SERVER_PROPERTIES = ROOT / "config" / "server.properties"


class Placement(Protocol):
    """Where ``"zookeeper"`` and ``"broker-<node id>"`` listen and what runs their command."""

    def address(self, host: str) -> str: ...

    def command_prefix(self, host: str) -> list[str]: ...


class Loopback:
    """Every process on 127.0.0.1, started as it is."""

    def address(self, host: str) -> str:
        return "127.0.0.1"

    def command_prefix(self, host: str) -> list[str]:
        return []


def metadata_node_ids(bootstrap: str, timeout: float = 5) -> tuple[set[int], int]:
    """The node ids of the brokers ``bootstrap``'s Metadata response lists, and its controller id."""
    resp = roundtrip(bootstrap, MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                include_topic_authorized_operations=False),
                     MetadataResponse, timeout)
    return {int(b.node_id) for b in resp.brokers}, int(resp.controller_id)


def elected_controller(bootstrap: str, timeout: float = 30) -> int:
    """The controller ``bootstrap`` names, once it names one (a cluster just started may not
    have elected it yet, or the broker may not have heard)."""
    return eventually(lambda: (c := metadata_node_ids(bootstrap)[1]) >= 0 and (c,),
                      "a controller elected", timeout)[0]


class ClusterBroker:
    """One broker of a StrataCluster: its node id, port and data dir stay the same across
    stop()/kill() and start()."""

    def __init__(self, node_id: int, process: BrokerProcess, metrics_port: int | None = None):
        self.node_id = node_id
        self.process = process
        self.metrics_port = metrics_port

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    @property
    def data_dir(self) -> Path:
        return self.process.data_dir

    @property
    def log_dir(self) -> Path:
        return Path(self.process.overrides["log.dirs"])

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://{self.process.host}:{self.metrics_port}"

    @property
    def pid(self) -> int | None:
        return None if self.process.proc is None else self.process.proc.pid

    @property
    def running(self) -> bool:
        """Launched and not exited (a paused broker is running)."""
        return self.process.proc is not None and self.process.proc.poll() is None

    def command(self) -> list[str]:
        return self.process.command()

    def launch(self) -> "ClusterBroker":
        self.process.launch()
        return self

    def wait_listening(self, timeout: float = 30) -> "ClusterBroker":
        self.process.wait_listening(timeout)
        return self

    def start(self, timeout: float = 30) -> "ClusterBroker":
        """(Re)start with the same node id, port, dirs and overrides; returns once it listens."""
        if self.running:
            raise RuntimeError(f"broker {self.node_id} is already running (pid {self.pid})")
        self.process.start(timeout)
        return self

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (after SIGCONT, should it be paused) and wait; SIGKILL after ``timeout``.
        Returns the exit code (None when it was not running)."""
        if self.process.proc is None:
            return None
        self.resume()
        return self.process.stop(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL and wait; returns the exit code (None when it was not running)."""
        if self.process.proc is None:
            return None
        return self.process.stop(signal.SIGKILL)

    def pause(self, timeout: float = 10) -> None:
        """SIGSTOP; returns once the kernel reports the process stopped."""
        self._signal(signal.SIGSTOP)
        eventually(lambda: self._proc_state() in ("T", None), f"broker {self.node_id} stopped",
                   timeout, interval=0.01)

    def resume(self) -> None:
        """SIGCONT."""
        self._signal(signal.SIGCONT)

    def output(self) -> str:
        """Everything the broker wrote to stdout/stderr, over all its starts."""
        return self.process.output()

    def logged_errors(self) -> list[str]:
        return self.process.logged_errors()

    def metadata_node_ids(self, timeout: float = 5) -> set[int]:
        return metadata_node_ids(self.bootstrap, timeout)[0]

    def _signal(self, sig: int) -> None:
        if self.running:
            os.kill(self.process.proc.pid, sig)

    def _proc_state(self) -> str | None:
        try:
            stat = Path(f"/proc/{self.process.proc.pid}/stat").read_text()
        except (AttributeError, OSError):
            return None
        return stat.rsplit(")", 1)[1].split()[0]


class StrataCluster:
    """ZooKeeper under ``tmp_dir/zookeeper`` and brokers with node ids 1..``brokers``, each
    with its own free port and ``tmp_dir/broker-N`` (log dir ``tmp_dir/broker-N/kafka-logs``,
    output ``tmp_dir/broker-N/broker.log``), all sharing the remote tier ``tmp_dir/remote``.

    ``overrides`` apply to every broker, ``broker_overrides[n]`` to broker n only (after
    ``overrides``); the per-broker keys (node.id, listeners, advertised.listeners, log.dirs,
    zookeeper.connect, rsm.config.storage.url) are set here but an override wins. ``metrics``
    gives each broker its own ``strata.metrics.listener`` port. ``config`` is the
    server.properties passed with ``--config`` (None: embedded defaults). ``placement`` gives
    each process its address and command prefix (default: ``Loopback``)."""

    def __init__(self, tmp_dir: Path, brokers: int = 3, overrides: dict[str, str] | None = None,
                 *, broker_overrides: dict[int, dict[str, str]] | None = None,
                 config: Path | None = SERVER_PROPERTIES, chroot: str = "/strata",
                 zk_tick_ms: int = 500, metrics: bool = False, placement: Placement | None = None):
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self.tmp_dir = Path(tmp_dir)
        self.chroot = chroot
        placement = placement or Loopback()
        self.zk = ZooKeeperServer(self.tmp_dir / "zookeeper", tick_ms=zk_tick_ms,
                                  host=placement.address("zookeeper"),
                                  prefix=placement.command_prefix("zookeeper"))
        self.remote_dir = self.tmp_dir / "remote"
        used = {self.zk.port}
        self._brokers: dict[int, ClusterBroker] = {}
        for node_id in range(1, brokers + 1):
            port = _unused_port(used)
            metrics_port = _unused_port(used) if metrics else None
            data_dir = self.tmp_dir / f"broker-{node_id}"
            host = placement.address(f"broker-{node_id}")
            props = {
                "node.id": str(node_id),
                "listeners": f"PLAINTEXT://{host}:{port}",
                "advertised.listeners": f"PLAINTEXT://{host}:{port}",
                "log.dirs": str(data_dir / "kafka-logs"),
                "zookeeper.connect": self.zk.connect_string(chroot),
                "rsm.config.storage.url": self.remote_dir.resolve().as_uri(),
            }
            # without ``metrics`` none: the shipped config's fixed port would be every broker's
            props["strata.metrics.listener"] = \
                f"http://{host}:{metrics_port}" if metrics_port is not None else ""
            props.update(overrides or {})
            props.update((broker_overrides or {}).get(node_id, {}))
            self._brokers[node_id] = ClusterBroker(
                node_id, BrokerProcess(data_dir, props, port=port, config=config, host=host,
                                       prefix=placement.command_prefix(f"broker-{node_id}")),
                metrics_port)

    @property
    def brokers(self) -> list[ClusterBroker]:
        """All brokers, by node id (running or not)."""
        return [self._brokers[n] for n in sorted(self._brokers)]

    @property
    def node_ids(self) -> set[int]:
        return set(self._brokers)

    def broker(self, node_id: int) -> ClusterBroker:
        return self._brokers[node_id]

    @property
    def bootstrap(self) -> str:
        """Every broker's host:port, comma separated."""
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def zk_connect(self) -> str:
        """The brokers' zookeeper.connect (with the chroot)."""
        return self.zk.connect_string(self.chroot)

    def commands(self) -> dict[int, list[str]]:
        """Each broker's command line, by node id."""
        return {b.node_id: b.command() for b in self.brokers}

    def start(self, timeout: float = 120) -> "StrataCluster":
        """ZooKeeper, then every broker (launched together), then waits until each lists all
        brokers in its Metadata response. Stops whatever it started when that fails."""
        deadline = time.monotonic() + timeout
        RUNNING_CLUSTERS.append(self)
        try:
            self.zk.start(timeout=_left(deadline))
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self.remote_dir.mkdir(parents=True, exist_ok=True)
            for b in self.brokers:
                b.launch()
            for b in self.brokers:
                b.wait_listening(_left(deadline))
            self.wait_metadata(timeout=_left(deadline))
        except BaseException:
            self.stop()
            raise
        return self

    def wait_metadata(self, node_ids: set[int] | None = None, brokers: list[int] | None = None,
                      timeout: float = 60) -> None:
        """Polls until every broker of ``brokers`` (default: those running) answers Metadata
        listing exactly ``node_ids`` (default: all of the cluster's)."""
        want = set(self._brokers) if node_ids is None else set(node_ids)
        asked = [self._brokers[n] for n in brokers] if brokers is not None \
            else [b for b in self.brokers if b.running]
        deadline = time.monotonic() + timeout
        last: dict[int, object] = {}
        pending: list[ClusterBroker] = []

        def all_listed() -> bool:
            pending.clear()
            for b in asked:
                if not b.running:
                    raise RuntimeError(f"broker {b.node_id} exited with "
                                       f"{b.process.proc.returncode if b.process.proc else None}:\n"
                                       f"{b.output()[-4000:]}")
                try:
                    last[b.node_id] = seen = b.metadata_node_ids(timeout=min(5, _left(deadline, 0.5)))
                except (OSError, ValueError) as e:
                    last[b.node_id] = seen = e
                if seen != want:
                    pending.append(b)
            return not pending

        eventually(all_listed, f"every broker asked listing {sorted(want)}", timeout, interval=0.1,
                   report=lambda: (
                       f"; brokers {[b.node_id for b in pending]} did not; last seen {last}\n"
                       + "\n".join(f"--- broker {b.node_id} ({b.process.log_path}) ---\n"
                                   f"{b.output()[-4000:]}" for b in pending)))

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM every broker (all at once, then waits for each), then ZooKeeper."""
        running = [b for b in self.brokers if b.running]
        for b in running:
            b.resume()  # a stopped process would not act on SIGTERM
            b.process.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for b in running:
            try:
                b.process.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                b.process.proc.kill()
        for b in self.brokers:
            b.process.stop()  # reaps the exited process and closes its log
        self.zk.stop()
        if self in RUNNING_CLUSTERS:
            RUNNING_CLUSTERS.remove(self)
        forget_admins({int(b.bootstrap.rsplit(":", 1)[1]) for b in self.brokers})

    def output(self) -> str:
        """Every broker's output, headed by its node id (for assertion messages)."""
        return "\n".join(f"--- broker {b.node_id} ---\n{b.output()}" for b in self.brokers)

    def __enter__(self) -> "StrataCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _unused_port(used: set[int]) -> int:
    while (port := free_port()) in used:
        pass
    used.add(port)
    return port


def _left(deadline: float, floor: float = 1.0) -> float:
    return max(floor, deadline - time.monotonic())
