"""Tensors freed by a stage go back to the operating system, so peak memory is what is alive.

glibc's malloc serves a large block from a fresh mapping (returned to the system when freed)
only above a threshold that it raises, up to 32 MiB, each time such a block is freed. After
a few passes every activation and logits chunk of an LLM is served from the heap instead,
where freed blocks stay resident and fragment: scoring SmolLM2-135M one row at a time peaked
near 2.1x its checkpoint with the moving threshold and 1.9x with a fixed one (BENCHMARKS,
"How much memory"). Fixing the threshold (mallopt M_MMAP_THRESHOLD, which also stops it from
moving) keeps blocks of 1 MiB and more out of the heap. A tokenizer's many small blocks stay
in the heap when it is dropped (30 MB of SmolLM2's after tokenizing): `trim_heap` hands the
free pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_FROM = 1 << 20


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at MMAP_FROM; False where there is no glibc (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_FROM))


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
