"""The benchmark's broker CPU figure: a process tree's CPU-seconds from /proc, and per GiB moved."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cpu
from benchmarks.cpu import CLOCK_TICKS, CpuMeter, cpu_per_gib, tree_cpu_seconds


def _stat(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int, cstime: int) -> str:
    # proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    #          utime stime cutime cstime priority ...
    return (f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 "
            f"{utime} {stime} {cutime} {cstime} 20 0 1 0 12345 1000 10\n")


def _fake_proc(root: Path, procs: list[tuple]) -> Path:
    for pid, *rest in procs:
        d = root / str(pid)
        d.mkdir()
        (d / "stat").write_text(_stat(pid, *rest))
    (root / "self").mkdir()          # non-numeric entries are not processes
    (root / "meminfo").write_text("")
    return root


def test_tree_cpu_sums_user_system_and_reaped_children_of_the_root_and_its_descendants(tmp_path):
    proc = _fake_proc(tmp_path, [
        (1, "init", 0, 5000, 5000, 0, 0),
        (100, "java) (broker", 1, 300, 100, 40, 10),       # comm with spaces and parentheses
        (101, "child", 100, 20, 5, 0, 0),
        (102, "grandchild", 101, 7, 3, 2, 1),
        (200, "unrelated", 1, 900, 900, 0, 0),
    ])
    ticks = (300 + 100 + 40 + 10) + (20 + 5) + (7 + 3 + 2 + 1)
    assert tree_cpu_seconds(100, proc) == pytest.approx(ticks / CLOCK_TICKS)
    assert tree_cpu_seconds(101, proc) == pytest.approx((20 + 5 + 7 + 3 + 2 + 1) / CLOCK_TICKS)


def test_tree_cpu_of_a_process_that_is_gone_is_zero(tmp_path):
    proc = _fake_proc(tmp_path, [(1, "init", 0, 10, 10, 0, 0)])
    assert tree_cpu_seconds(4242, proc) == 0.0


def test_cpu_per_gib_divides_cpu_seconds_by_the_gib_moved():
    assert cpu_per_gib(2.5, 512 * 1024 * 1024) == pytest.approx(5.0)
    assert cpu_per_gib(1.0, 200_000 * 1024) == pytest.approx(1024 * 1024 * 1024 / (200_000 * 1024))


def test_meter_reports_the_span_difference_and_its_per_gib_figure(monkeypatch):
    readings = iter([10.0, 13.0])
    monkeypatch.setattr(cpu, "tree_cpu_seconds", lambda pid: next(readings))
    with CpuMeter(1234) as m:
        pass
    assert m.seconds == pytest.approx(3.0)
    assert m.figures(3 * cpu.GIB // 2) == {"broker CPU s": pytest.approx(3.0),
                                           "broker CPU s/GiB": pytest.approx(2.0)}


def test_a_live_childs_cpu_counts_in_its_parents_tree_on_the_real_proc():
    burn = ("import os, sys\n"
            "while sum(os.times()[:2]) < 0.05:\n    pass\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    own = cpu._stat_fields(Path("/proc/self/stat").read_text())
    own_before = sum(int(x) for x in own[cpu._UTIME:cpu._CSTIME + 1]) / CLOCK_TICKS
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child_cpu = tree_cpu_seconds(child.pid)
        assert child_cpu >= 0.05
        # in ticks: 28123/100 + 5/100 > 28128/100 in floating point
        assert round(tree_cpu_seconds(os.getpid()) * CLOCK_TICKS) >= \
            round(own_before * CLOCK_TICKS) + round(child_cpu * CLOCK_TICKS)
    finally:
        child.stdin.close()
        child.wait(30)


def test_cpu_load_spins_its_processes_while_entered_and_reaps_them_on_exit():
    from benchmarks.compare import CpuLoad
    with CpuLoad(2) as load:
        assert len(load.procs) == 2
        deadline = time.monotonic() + 60
        while not all(tree_cpu_seconds(p.pid) >= 0.05 for p in load.procs):
            assert time.monotonic() < deadline, "the load processes never used the CPU"
            time.sleep(0.01)
    assert all(p.returncode is not None for p in load.procs)


def _fake_machine(root: Path, idle: int, iowait: int, steal: int, written: int) -> Path:
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  900 5 300 {idle} {iowait} 0 40 {steal} 0 0\n"
                               f"cpu0 450 2 150 {idle} {iowait} 0 20 {steal} 0 0\nintr 1 2 3\n")
    (root / "vmstat").write_text(f"nr_dirtied 777\nnr_written {written}\nnr_written_x 5\n")
    return root


def test_machine_meter_reports_idle_with_iowait_steal_and_written_back_bytes_over_the_span(tmp_path):
    proc = _fake_machine(tmp_path, idle=1000, iowait=50, steal=7, written=100)
    with cpu.MachineMeter(proc) as m:
        _fake_machine(tmp_path, idle=1200, iowait=80, steal=19, written=100 + 2560)
    assert m.idle == pytest.approx(230 / CLOCK_TICKS)
    assert m.steal == pytest.approx(12 / CLOCK_TICKS)
    assert m.written_back == 2560 * cpu.PAGE_SIZE
    assert m.figures()["written back MiB"] == pytest.approx(2560 * cpu.PAGE_SIZE / (1 << 20))


def test_the_real_proc_has_the_lines_the_machine_meter_reads():
    # written_back_bytes reads 0 when nr_written is missing: check this kernel has it
    assert any(line.split()[0] == "nr_written" for line in Path("/proc/vmstat").read_text().splitlines())
    seconds = cpu.machine_seconds()
    assert seconds["idle"] > 0 and seconds["steal"] >= 0
    with cpu.MachineMeter() as m:
        time.sleep(0.05)
    assert m.idle >= 0 and m.steal >= 0 and m.written_back >= 0
