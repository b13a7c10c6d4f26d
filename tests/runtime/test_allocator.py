"""glibc's mmap threshold is fixed, so freed tensors leave the resident set."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Frees a 16 MiB block (glibc then raises its mmap threshold to 16 MiB), allocates and touches
# four 8 MiB blocks, frees all but the last (which pins the heap's top: with all four freed, the
# top could exceed glibc's trim threshold and be handed back by chance), and prints the KiB
# resident since: the 8 MiB still held, plus the freed blocks that stayed.
PROBE = """
import sys
import torch
from headprune_cli.runtime import allocator
if sys.argv[1] == "fixed":
    assert allocator.return_freed_memory()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4
first = torch.ones(16 << 20, dtype=torch.uint8)
del first
before = rss()
blocks = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(4)]
del blocks[:-1]
print(rss() - before)
"""


def _kept_kib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_tensors_leave_the_resident_set_only_with_the_fixed_threshold():
    assert _kept_kib("moving") >= (8 + 16) << 10  # glibc's own rule keeps freed blocks in the heap
    assert _kept_kib("fixed") < (8 + 2) << 10  # only the block still held


# Mallocs 100,000 small blocks (about 20 MiB of heap), frees all but the last (which pins the
# heap's top, so glibc cannot shrink it by itself), and prints the KiB still resident, without
# or with trim_heap.
TRIM_PROBE = """
import ctypes, sys
from headprune_cli.runtime import allocator
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4
before = rss()
blocks = [libc.malloc(200) for _ in range(100_000)]
for b in blocks:
    ctypes.memset(b, 1, 200)
for b in blocks[:-1]:
    libc.free(b)
if sys.argv[1] == "trim":
    allocator.trim_heap()
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_trimming_hands_the_heaps_free_pages_back():
    def kept(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", TRIM_PROBE, mode], capture_output=True, text=True, check=True)
        return int(done.stdout.split()[-1])

    assert kept("keep") >= 15 << 10  # freed small blocks stay resident in the heap
    assert kept("trim") < 4 << 10
