"""The consume-sessions bench reads perf stat's CSV lines, and a process's user and system
seconds from /proc (``bench.cpu``)."""

from __future__ import annotations

import os

from benchmarks.consume_sessions import perf_counts
from benchmarks.cpu import user_system_seconds


def test_perf_stat_csv_lines_become_counts_by_event_name():
    err = ("1040,,syscalls:sys_enter_sendfile64,2001234567,100.00,,\n"
           "1973,,context-switches,2001234567,100.00,,\n"
           "<not counted>,,cpu-migrations,0,0.00,,\n")
    assert perf_counts(err) == {"sendfile64": 1040, "context-switches": 1973}


def test_user_and_system_seconds_grow_with_this_process_s_work():
    u0, s0 = user_system_seconds(os.getpid())
    sum(i * i for i in range(3_000_000))
    u1, s1 = user_system_seconds(os.getpid())
    assert u1 > u0 and s1 >= s0
