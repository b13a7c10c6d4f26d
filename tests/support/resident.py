"""How much of a tensor's memory mapping is resident in this process (Linux /proc/self/smaps)."""

from __future__ import annotations

import sys

import pytest
import torch

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux only)")


def resident_kib(tensor: torch.Tensor) -> int:
    """The Rss (KiB) of the mapping that holds `tensor`'s first byte."""
    address = tensor.data_ptr()
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds address {address:#x}")
