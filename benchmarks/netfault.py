"""Network partitions between processes on one machine, without netem (issue 51).

Each host (ZooKeeper, each broker) runs in its own network namespace. Its one interface,
``eth0``, is a veth whose other end is a port of a bridge in the root namespace; the hosts
hold addresses of a private /24 (10.237.N.0/24, N not used on this machine) and the bridge holds
its first address, so clients in the root namespace reach every host. No namespace has a route
beyond that /24. Faults:

- ``cut(a, b)``: a and b each get a permanent neighbour (ARP) entry that points the other's
  address at a MAC no interface has, so their packets to each other go nowhere while every
  other pair still talks. ``CLIENTS`` names the root namespace's end (the test's clients).
- ``isolate(host)``: the bridge end of the host's veth goes down; it reaches no one.
- ``split(group_a, group_b)``: ``cut`` between every pair across the groups.
- ``blackhole(src, address)``: one direction of a cut, to one address (with ``add_address``,
  a host's second address: one listener of a host cut, its others not).
- ``heal()``: removes every entry and brings every link up again.

    with Network(["zookeeper", "broker-1", "broker-2"]) as net:
        subprocess.Popen([*net.command_prefix("broker-1"), "strata", ...])
        net.cut("broker-1", "zookeeper"); ...; net.heal()

Names start with ``snf``: namespaces ``snf-<id>-<host>``, the bridge ``snf<id>b`` (its alias
names the owning process), bridge ports ``snf<id>p<n>``. Starting a Network first removes what
a run whose owner is gone left behind (killing what still runs in its namespaces); closing one
kills what still runs in its namespaces and deletes them and the bridge. Needs root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

PREFIX = "snf"
CLIENTS = "clients"
BOGUS_MAC = "02:00:5e:ff:00:01"   # locally administered; no interface here has it
SUBNETS = ipaddress.ip_network("10.237.0.0/16")
LOCK_FILE = Path("/run/strata-netfault.lock")
ALIAS = "strata-netfault owner="
_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
_OUR_NS = re.compile(rf"^{PREFIX}-([0-9a-f]{{6}})-")
_OUR_LINK = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})[bp]")
_PROBE_NS = re.compile(rf"^{PREFIX}probe-(\d+)$")
_PROBE_LINK = re.compile(rf"^{PREFIX}[qr]([0-9a-f]+)$")


class NetFaultError(RuntimeError):
    pass


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetFaultError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done


@functools.cache
def netfault_available() -> tuple[bool, str]:
    """(True, "") when namespaces, veth pairs and bridges can be made here, else (False, why)."""
    if os.geteuid() != 0:
        return False, f"network namespaces need root; this runs as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return False, "the ip command (iproute2) is not installed"
    ns, veth, bridge = f"{PREFIX}probe-{os.getpid()}", f"{PREFIX}q{os.getpid():x}", \
        f"{PREFIX}r{os.getpid():x}"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "add", bridge, "type", "bridge")
    except (NetFaultError, OSError, subprocess.SubprocessError) as exc:
        return False, f"ip netns / veth / bridge unavailable: {exc}"
    finally:
        _ip("link", "del", bridge, check=False)
        _ip("link", "del", veth, check=False)
        _ip("netns", "del", ns, check=False)
    return True, ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner() -> str:
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def _owner_alive(owner: str) -> bool:
    pid, _, started = owner.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialises stale clean-up and bridge creation among runs on this machine."""
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir())


def _namespaces() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(ns: str, timeout: float = 10) -> None:
    """SIGKILLs what runs in ``ns`` (processes our harness started there), then deletes it."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _ip("netns", "del", ns, check=False)


def remove_stale() -> list[str]:
    """Deletes the namespaces and links of runs whose owning process is gone; what it removed."""
    live, removed = set(), []
    for link in _links():
        m = _OUR_LINK.match(link)
        if m and link == f"{PREFIX}{m.group(1)}b":
            alias = Path(f"/sys/class/net/{link}/ifalias").read_text().strip()
            if alias.startswith(ALIAS) and _owner_alive(alias[len(ALIAS):]):
                live.add(m.group(1))
    for ns in _namespaces():
        m, probe = _OUR_NS.match(ns), _PROBE_NS.match(ns)
        if (m and m.group(1) not in live) or (probe and _start_time(int(probe.group(1))) is None):
            _kill_namespace(ns)
            removed.append(ns)
    for link in _links():
        m, probe = _OUR_LINK.match(link), _PROBE_LINK.match(link)
        if (m and m.group(1) not in live) or (probe and _start_time(int(probe.group(1), 16)) is None):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        nets.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("broadcast", "local", "unicast"):
            first = line.split()[1]
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(first, strict=False))
    return nets


def _free_subnet() -> ipaddress.IPv4Network:
    used = [n for n in _used_networks() if n.prefixlen > 0]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(n) for n in used):
            return subnet
    raise NetFaultError(f"no /24 of {SUBNETS} is free on this machine")


class Network:
    """A bridge and one namespace per host; usable as a context manager (start, close)."""

    def __init__(self, hosts: Sequence[str]):
        hosts = list(hosts)
        bad = [h for h in hosts if not _HOST_NAME.match(h) or h == CLIENTS]
        if bad or len(set(hosts)) != len(hosts) or not 0 < len(hosts) <= 190:
            raise ValueError(f"host names must be distinct, lower-case, not {CLIENTS!r}: {hosts}")
        self.hosts = hosts
        self.id = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.removed_stale: list[str] = []
        self._neigh: set[tuple[str | None, str, str]] = set()   # (namespace, address, device)
        self._down: set[str] = set()
        self._started = False

    # --- names and addresses

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.id}b"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge: where the clients' packets come from."""
        return str(self.subnet.network_address + 1)

    def namespace(self, host: str) -> str:
        self._check(host)
        return f"{PREFIX}-{self.id}-{host}"

    def address(self, host: str) -> str:
        if host == CLIENTS:
            return self.bridge_address
        self._check(host)
        return str(self.subnet.network_address + 10 + self.hosts.index(host))

    def second_address(self, host: str) -> str:
        """The address ``add_address`` gives the host (.200 and up)."""
        self._check(host)
        if self.hosts.index(host) >= 50:
            raise ValueError("second addresses for the first 50 hosts only")
        return str(self.subnet.network_address + 200 + self.hosts.index(host))

    def add_address(self, host: str) -> str:
        """Gives the host's eth0 a second address (its first stays the source of what it sends)."""
        address = self.second_address(host)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=self.namespace(host))
        return address

    def port_of(self, host: str) -> str:
        """The bridge end of the host's veth."""
        self._check(host)
        return f"{PREFIX}{self.id}p{self.hosts.index(host)}"

    def command_prefix(self, host: str) -> list[str]:
        """What runs a command in the host's namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def _check(self, host: str) -> None:
        if host not in self.hosts:
            raise KeyError(f"unknown host {host!r} (hosts: {self.hosts})")

    # --- life cycle

    def start(self) -> "Network":
        try:
            with _locked():
                self.removed_stale = remove_stale()
                taken = {m.group(1) for link in _links() if (m := _OUR_LINK.match(link))}
                self.id = next(i for i in iter(lambda: secrets.token_hex(3), None) if i not in taken)
                self.subnet = _free_subnet()
                self._started = True
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("link", "set", self.bridge, "alias", ALIAS + _owner())
                # with br_netfilter loaded, bridged frames would go through iptables' FORWARD
                _ip("link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "0",
                    "nf_call_ip6tables", "0", "nf_call_arptables", "0", check=False)
                _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                ns, port = self.namespace(host), self.port_of(host)
                _ip("netns", "add", ns)
                _ip("link", "set", "lo", "up", ns=ns)
                _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", port, "master", self.bridge, "up")
                _ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kills what still runs in the namespaces, deletes them, their veths and the bridge."""
        if not self._started:
            return
        for host in self.hosts:
            ns = self.namespace(host)
            if ns in _namespaces():
                _kill_namespace(ns)
        links = set(_links())
        for host in self.hosts:
            if self.port_of(host) in links:
                _ip("link", "del", self.port_of(host), check=False)
        _ip("link", "del", self.bridge, check=False)
        self._neigh.clear()
        self._down.clear()
        self._started = False
        left = [n for n in _namespaces() if n.startswith(f"{PREFIX}-{self.id}-")] + \
               [link for link in _links() if link.startswith(f"{PREFIX}{self.id}")]
        if left:
            raise NetFaultError(f"left behind after close: {left}")

    def __enter__(self) -> "Network":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- faults

    def cut(self, a: str, b: str) -> None:
        """No packet between a and b, either way (either may be ``CLIENTS``)."""
        if a == b:
            raise ValueError(f"cut({a!r}, {b!r}): one host")
        self.blackhole(a, self.address(b))
        self.blackhole(b, self.address(a))

    def split(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        """``cut`` between every host of ``group_a`` and every host of ``group_b``."""
        group_b = list(group_b)
        for a in group_a:
            for b in group_b:
                self.cut(a, b)

    def isolate(self, host: str) -> None:
        """The host's link down: it reaches no one and no one reaches it."""
        _ip("link", "set", self.port_of(host), "down")
        self._down.add(host)

    def heal(self) -> None:
        """Undoes every cut, split and isolation."""
        for ns, address, dev in sorted(self._neigh, key=str):
            _ip("neigh", "del", address, "dev", dev, ns=ns, check=False)
        self._neigh.clear()
        for host in sorted(self._down):
            _ip("link", "set", self.port_of(host), "up")
        self._down.clear()
        # addresses that went unanswered while a link was down would answer "no route to host"
        # for a while yet; forgotten, they are asked again at the next packet
        for ns, dev in [(None, self.bridge)] + [(self.namespace(h), "eth0") for h in self.hosts]:
            for state in ("failed", "incomplete"):
                _ip("neigh", "flush", "dev", dev, "nud", state, ns=ns, check=False)

    @property
    def faults(self) -> dict[str, list]:
        """What is cut now: the blackholed (from, to) addresses and the isolated hosts."""
        return {"cut": sorted((ns or CLIENTS, addr) for ns, addr, _ in self._neigh),
                "isolated": sorted(self._down)}

    def blackhole(self, src: str, address: str) -> None:
        """``src``'s packets for ``address`` go to a MAC no one has."""
        if src == CLIENTS:
            ns, dev = None, self.bridge
        else:
            ns, dev = self.namespace(src), "eth0"
        _ip("neigh", "replace", address, "lladdr", BOGUS_MAC, "dev", dev, "nud", "permanent", ns=ns)
        self._neigh.add((ns, address, dev))

    # --- probes

    def popen(self, host: str, args: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts ``args`` in the host's namespace."""
        return subprocess.Popen([*self.command_prefix(host), *args], **kwargs)

    def connect(self, src: str, dst: str, port: int, timeout: float = 2.0) -> str:
        """A TCP connect from ``src``'s namespace to ``dst``:``port`` (``CLIENTS``: from the
        root namespace): "connected", "timed out" (no answer in ``timeout`` s) or the error."""
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(({self.address(dst)!r}, {port}), {timeout}).close()\n"
                "    print('connected')\n"
                "except TimeoutError:\n"
                "    print('timed out')\n"
                "except OSError as e:\n"
                "    print(e)\n")
        prefix = [] if src == CLIENTS else self.command_prefix(src)
        done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=timeout + 30)
        return done.stdout.strip() or done.stderr.strip()
