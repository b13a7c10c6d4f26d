"""File I/O at the edges: atomic writes and hashes (what may be written: outputs.py).

Every output goes to a temporary file in the destination folder (named and locked as
temps.py says), is fsynced, and is renamed into place, so a crash or kill leaves the old
file or none, never half a file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from headprune_cli.errors import HeadpruneError
from headprune_cli.files.outputs import check_output, check_parent  # noqa: F401  (the output rule lives there)
from headprune_cli.files.special import SPECIAL_ROOTS  # /dev, /proc, /sys: never read as data (nor replaced)
from headprune_cli.files.temps import linux_libc, make_temp, publish  # locked temporaries, no-replace publishing

_CHUNK = 1 << 20
T = TypeVar("T")


# A stage often hashes the same checkpoint twice (to match an artifact's inputs, then on
# load); multi-GB models make that slow. The key changes whenever the file does.
_SHA_CACHE: dict[tuple, str] = {}
_AHEAD: dict[tuple, Future] = {}  # hashes started by hash_ahead, not yet taken
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256-ahead")


def check_regular(
    path: str | os.PathLike, what: str = "file", error: type[HeadpruneError] = HeadpruneError
) -> os.stat_result:
    """The stat of `path` if it is a regular file on an ordinary filesystem; else refuse.

    Devices, FIFOs and sockets would block or never end; stat() does not open them."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise error(f"{path}: cannot read this {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
        raise error(f"{path}: {kind}, not a regular {what}")
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + "/") for root in SPECIAL_ROOTS):
        raise error(f"{path}: a file of a special filesystem ({real}), not a regular {what}")
    return info


def open_regular(path: str | os.PathLike, what: str = "file"):
    """Open a regular file for reading without ever blocking on a FIFO swapped in after the check."""
    check_regular(path, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HeadpruneError(f"{path}: not a regular {what}")
    return os.fdopen(fd, "rb")


def _cache_key(path: str | os.PathLike, info: os.stat_result) -> tuple:
    return (os.path.realpath(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def remember_sha256(path: str | os.PathLike, digest: str) -> None:
    """Record the sha256 of a file just written (hashed as its bytes went out), so a
    multi-GB output is not read back to hash it."""
    _SHA_CACHE[_cache_key(path, check_regular(path))] = digest


def sha256_file(path: str | os.PathLike) -> str:
    info = check_regular(path)
    key = _cache_key(path, info)
    if key not in _SHA_CACHE:
        pending = _AHEAD.pop(key, None)
        _SHA_CACHE[key] = pending.result() if pending is not None else _hash(path, info.st_size)
    return _SHA_CACHE[key]


def hash_ahead(path: str | os.PathLike) -> None:
    """Start hashing `path` on a background thread; sha256_file(path) takes the result.

    For work that needs the hash only later and has slow work in between: building a
    model's layout imports transformers' modelling code (3.7 s for LLaMA on 2 cores),
    while hashing a 2 GB file takes 2 s of the other core (hashlib and reads release the
    GIL). A file that is not regular is left to sha256_file, which refuses it."""
    try:
        info = check_regular(path)
    except HeadpruneError:
        return
    key = _cache_key(path, info)
    if key not in _SHA_CACHE and key not in _AHEAD:
        _AHEAD[key] = _HASHER.submit(_hash, path, info.st_size)


def _hash(path: str | os.PathLike, size: int) -> str:
    digest, left = hashlib.sha256(), size
    with open_regular(path) as handle:
        # Read the size stat() promised and no more: a file that grows while hashed
        # has changed under us, and its hash would not describe what was read.
        while left > 0 and (chunk := handle.read(min(_CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: str | os.PathLike, write: Callable[[str], T]) -> T:
    """Run `write(tmp_path)`, fsync, then rename over `path`; clean up on any failure.
    Returns what `write` returned.

    An output that did not exist when the command checked it (and had no --force) is
    published without replacing: when another process made it meanwhile, this one fails
    and leaves that file alone (see outputs.claim_new)."""
    out = Path(path)
    tmp, lock = make_temp(out)
    try:
        result = write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # temporaries are made 0600; outputs get the usual mode
        publish(tmp, out)
        return result
    except BaseException as exc:
        _remove_quietly(tmp)
        error = os_error_in(exc)
        if error is not None:  # disk full, file too large, read-only: the user's problem, one line
            raise HeadpruneError(f"could not write {out}: {error.strerror or error}") from exc
        raise
    finally:
        os.close(lock)  # the flock goes with it: from now on the sweep may take what is left


def os_error_in(exc: BaseException) -> OSError | None:
    """The OS error behind a failed write: an OSError itself, or one that a library (safetensors'
    Rust writer) reports inside its own exception type as "... (os error 28)"."""
    if isinstance(exc, OSError):
        return exc
    found = re.search(r"\(os error (\d+)\)", str(exc)) if isinstance(exc, Exception) else None
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else None


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing these bytes of `fd` to disk now, without waiting.

    A 2 GB output stays below the kernel's background-writeback threshold on a machine with
    ordinary RAM, so without this the whole file goes to disk in atomic_write's fsync, after
    the last byte: 3 s for 2 GB here. Started while the rest is produced, the fsync finds
    little left (0.4 s). Linux only (sync_file_range); elsewhere the fsync does it all.
    """
    sync_file_range = _sync_file_range()
    if sync_file_range is not None and length > 0:
        sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # advisory: errors ignored


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait


@functools.cache
def _sync_file_range():
    return linux_libc("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)

    atomic_write(path, write)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
