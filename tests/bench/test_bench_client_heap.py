"""The harness keeps the memory its clients free: reused buffers are not faulted in again."""

import platform
import subprocess
import sys

import pytest

# In a fresh interpreter: allocate 64 buffers of 1 MiB, touch every page, free them all; five
# times, as a consumer's receive buffers and values come and go, after the bench's
# `--client-heap` choice. Prints what the report would say, then the minor faults of the last
# four rounds.
CHURN = """
import ctypes, resource, sys
from benchmarks.workloads import apply_client_heap
print(apply_client_heap(sys.argv[1]))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def churn():
    bufs = [libc.malloc(1 << 20) for _ in range(64)]
    for b in bufs:
        ctypes.memset(b, 1, 1 << 20)
    for b in bufs:
        libc.free(b)
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

TOUCHED_PAGES = 4 * 64 * 256


def faults(heap: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN, heap], capture_output=True, text=True,
                         check=True, timeout=60)
    said, count = out.stdout.splitlines()
    assert ("glibc keeps" in said) == (heap == "kept")
    return int(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's parameters are glibc's")
def test_kept_heap_reuses_freed_buffers_without_faulting_them_in_again():
    returned, kept = faults("returned"), faults("kept")
    assert returned >= TOUCHED_PAGES // 2      # glibc's default: most pages faulted in again
    assert kept < TOUCHED_PAGES // 20
