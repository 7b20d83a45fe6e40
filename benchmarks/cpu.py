"""A process tree's CPU time from ``/proc``: what a broker (Strata's Python process, Kafka's JVM,
and any processes they started) spent, user + system, to compare per GiB moved.

Each ``/proc/<pid>/stat`` gives ``utime`` and ``stime`` (the process's own threads) and
``cutime`` and ``cstime`` (its children it has waited for), in clock ticks
(``SC_CLK_TCK``, usually 1/100 s). The tree's CPU time is the sum of all four over the root and
its live descendants: a dead child's time is in its parent's ``cutime`` once reaped, and in no
live process's own time, so nothing counts twice.
"""

from __future__ import annotations

import os
from pathlib import Path

GIB = 1 << 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(text: str) -> list[str]:
    """The fields after ``comm`` (which may hold spaces and parentheses): state, ppid, ..."""
    return text[text.rindex(")") + 2:].split()


# indexes into _stat_fields: fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime) of proc(5)
_PPID, _UTIME, _CSTIME = 1, 11, 14


def tree_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU-seconds (user + system) of ``pid`` and its descendants so far; 0.0 if it is gone."""
    stats: dict[int, list[str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue   # exited while we looked
    children: dict[int, list[int]] = {}
    for p, fields in stats.items():
        children.setdefault(int(fields[_PPID]), []).append(p)
    ticks, todo = 0, [pid] if pid in stats else []
    while todo:
        p = todo.pop()
        ticks += sum(int(x) for x in stats[p][_UTIME:_CSTIME + 1])
        todo += children.get(p, ())
    return ticks / CLOCK_TICKS


def user_system_seconds(pid: int, proc: Path = Path("/proc")) -> tuple[float, float]:
    """``pid``'s own user and system CPU-seconds so far (its threads, not its children)."""
    fields = _stat_fields((proc / str(pid) / "stat").read_text())
    return int(fields[_UTIME]) / CLOCK_TICKS, int(fields[_UTIME + 1]) / CLOCK_TICKS


def cpu_per_gib(cpu_seconds: float, nbytes: int) -> float:
    """CPU-seconds per GiB moved."""
    return cpu_seconds * GIB / nbytes


def machine_seconds(proc: Path = Path("/proc")) -> dict[str, float]:
    """The whole machine's CPU-seconds so far, summed over its CPUs, from ``/proc/stat``'s
    ``cpu`` line: ``idle`` (idle + iowait: no runnable thread) and ``steal`` (a hypervisor ran
    someone else on this VM's CPUs)."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]]   # user nice system idle iowait irq softirq steal
            steal = f[7] if len(f) > 7 else 0
            return {"idle": (f[3] + f[4]) / CLOCK_TICKS, "steal": steal / CLOCK_TICKS}
    raise ValueError("no cpu line in /proc/stat")


def written_back_bytes(proc: Path = Path("/proc")) -> int:
    """Bytes the kernel has written back from the page cache so far (``nr_written`` pages)."""
    for line in (proc / "vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "nr_written":
            return int(value) * PAGE_SIZE
    return 0


class MachineMeter:
    """What the rest of the machine did over a span: CPU-seconds idle and stolen, and page-cache
    bytes written back. A round slower than its CPU-seconds explain waited on one of these."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._start: tuple[dict[str, float], int] = ({}, 0)
        self.idle = self.steal = 0.0
        self.written_back = 0

    def __enter__(self) -> MachineMeter:
        self._start = machine_seconds(self.proc), written_back_bytes(self.proc)
        return self

    def __exit__(self, *exc) -> None:
        cpu0, wb0 = self._start
        cpu1 = machine_seconds(self.proc)
        self.idle, self.steal = cpu1["idle"] - cpu0["idle"], cpu1["steal"] - cpu0["steal"]
        self.written_back = written_back_bytes(self.proc) - wb0

    def figures(self) -> dict[str, float]:
        return {"machine idle CPU s": self.idle, "machine steal CPU s": self.steal,
                "written back MiB": self.written_back / (1 << 20)}


class CpuMeter:
    """Measures a process tree's CPU-seconds over a span: ``with CpuMeter(pid) as m: ...``, then
    ``m.seconds``. Any thread may use it; one span per instance."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = tree_cpu_seconds(self.pid)
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = tree_cpu_seconds(self.pid) - self._start

    def figures(self, nbytes: int) -> dict[str, float]:
        """The report's figures for a span that moved ``nbytes``."""
        return {"broker CPU s": self.seconds, "broker CPU s/GiB": cpu_per_gib(self.seconds, nbytes)}
