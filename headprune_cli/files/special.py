"""Special files: devices, FIFOs, sockets and the pseudo filesystems, which headprune never
reads as data and never replaces as an output.

An output path that exists and is (or reaches through a symlink) a device node, a FIFO, a
socket or anything under /dev, /proc or /sys is refused, with or without `--force`:
renaming a finished temporary onto `/dev/null` as root puts a regular file where the
device was, and onto `/dev/stdout` replaces the symlink. A stream goes to stdout with
`-o -` or no `-o`. Lexical paths and every symlink on the way count, not only the end:
`/dev/stdout` resolves to a pipe or to a regular file elsewhere, yet it is /dev's link
that the rename would replace. No heavy imports: outputs.py and fileio.py load this.
"""

from __future__ import annotations

import os
import stat

# Pseudo filesystems whose "regular" files have no true size and may read without end
# (/proc/self/pagemap), and whose entries a rename must never replace.
SPECIAL_ROOTS = ("/proc", "/sys", "/dev")
_MAX_HOPS = 40  # symlinks followed before giving up (the kernel's own limit)


def under_special_root(path: str) -> bool:
    """Whether an absolute, normalised path lies in /dev, /proc or /sys."""
    return any(path == root or path.startswith(root + "/") for root in SPECIAL_ROOTS)


def kind_of(mode: int) -> str | None:
    """'a device', 'a FIFO' or 'a socket' for those file types; None for the rest."""
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _hops(path: str) -> list[str]:
    """`path` (absolute, normalised) and each path its symlinks lead to, the last resolved."""
    hops, current = [os.path.normpath(os.path.abspath(path))], os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        try:
            target = os.readlink(current)
        except OSError:  # not a link (or gone): the chain ends here
            break
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        hops.append(current)
    hops.append(os.path.realpath(path))
    return hops


def special_output(path: str | os.PathLike) -> str | None:
    """Why an existing output path must not be replaced, or None when it may be (or does not exist)."""
    text = os.fspath(path)
    if not os.path.lexists(text):
        return None
    for hop in _hops(text):
        if under_special_root(hop):
            return f"is {hop}, a file of a special filesystem (/dev, /proc, /sys)"
    try:
        kind = kind_of(os.stat(text).st_mode)
    except OSError:
        return None  # a dangling link outside the special roots: the ordinary rules decide
    return f"is {kind}" if kind else None
