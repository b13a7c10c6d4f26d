"""glibc's mmap threshold is fixed, so freed tensors leave the resident set."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Frees a 16 MiB block (glibc then raises its mmap threshold to 16 MiB), allocates, touches and
# frees 8 MiB blocks, and prints how much of them stayed resident (KiB).
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
del blocks
print(rss() - before)
"""


def _kept_kib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_tensors_leave_the_resident_set_only_with_the_fixed_threshold():
    assert _kept_kib("moving") >= 16 << 10  # glibc's own rule keeps freed blocks in the heap
    assert _kept_kib("fixed") < 2 << 10
