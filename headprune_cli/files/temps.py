"""Temporaries beside an output, publishing them, and removing those a killed writer left.

A temporary is named `.{target}.headprune-{8 hex}.tmp` (a file, or a folder for
`export --hf`) and its writer holds an exclusive flock on it from creation until it is
published or removed. The kernel drops the lock when the writer dies, however it dies
(SIGKILL, SIGBUS, power cut aside), and a reused pid cannot inherit it; so a temporary of
this naming that nobody holds locked is garbage, and the next headprune that writes into
the folder removes it and says so on one stderr line.

Publishing renames the temporary onto its target. Where the target must be new (it did
not exist when the command checked it, and no --force was given: outputs.claim_new), the
rename refuses to replace (renameat2 RENAME_NOREPLACE, else a hard link for a file), so
of two processes writing one new output exactly one wins and the other fails with
"now exists", leaving the winner's file as it was. No heavy imports: `select` loads this.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from headprune_cli.errors import HeadpruneError
from headprune_cli.files.outputs import is_claimed, release_claim
from headprune_cli.files.watcher import note_write

TEMP_PATTERN = re.compile(r"^\..+\.headprune-[0-9a-f]{8}\.tmp$")
_SWEPT: set[str] = set()  # folders already swept by this process


def temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.headprune-{secrets.token_hex(4)}.tmp")


def make_temp(target: Path) -> tuple[str, int]:
    """A new temporary file beside `target`, locked: (its path, the fd holding the lock)."""
    return _make(target, folder=False)


def make_temp_folder(target: Path) -> tuple[Path, int]:
    """A new temporary folder beside `target` (mode 0755), locked: (its path, the fd holding the lock)."""
    path, fd = _make(target, folder=True)
    return Path(path), fd


@contextmanager
def temp_folder(target: Path) -> Iterator[Path]:
    """make_temp_folder for a block: removed and unlocked however the block ends (once published
    by a rename, the removal finds nothing)."""
    path, fd = make_temp_folder(target)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def _make(target: Path, folder: bool) -> tuple[str, int]:
    sweep(target.parent)
    note_write(target.parent)  # so that a watching parent can clean up after a kill (watcher.py)
    while True:
        path = temp_name(target)
        if folder:
            os.mkdir(path, 0o755)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except FileNotFoundError:  # another process's sweep removed it, still empty and unlocked
                continue
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        _lock(fd, wait=True)
        # A sweep in another process may have taken this name in the instant between its
        # creation and the lock, and removed it: then start over with a fresh one.
        if _same_inode(path, fd):
            return str(path), fd
        os.close(fd)


def _lock(fd: int, wait: bool) -> bool:
    try:
        import fcntl  # noqa: PLC0415 (POSIX only)
    except ImportError:  # not POSIX: no locks; a writer goes on, and the sweep removes nothing
        return wait
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except OSError:
        return False


def _same_inode(path, fd: int) -> bool:
    try:
        return os.lstat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


# --- the sweep: temporaries whose writer is gone ---------------------------------------
def forget_sweeps() -> None:
    """Sweep again from the next command on (tests run many commands in one process)."""
    _SWEPT.clear()


def sweep(folder: Path, quiet: bool = False) -> list[Path]:
    """Remove temporaries of headprune's naming in `folder` that no live process holds
    locked; say so in one line on stderr (unless `quiet`). Once per folder per process."""
    key = os.path.realpath(folder)
    if key in _SWEPT and not quiet:
        return []
    _SWEPT.add(key)
    removed, size = [], 0
    try:
        names = [e.name for e in os.scandir(folder) if TEMP_PATTERN.match(e.name)]
    except OSError:
        return []
    for name in sorted(names):
        freed = _remove_if_abandoned(Path(folder) / name)
        if freed is not None:
            removed.append(Path(folder) / name)
            size += freed
    if removed and not quiet:
        what = "temporary file" if len(removed) == 1 else "temporary files"
        print(
            f"Note: removed {len(removed)} {what} ({_size(size)}) that a killed headprune left in {folder}",
            file=sys.stderr,
        )
    return removed


def _remove_if_abandoned(path: Path) -> int | None:
    """The bytes freed, when `path` is a temporary nobody holds; None when it is in use (or gone)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return None  # never ours: a temporary is a plain file or folder
        flags = (
            os.O_RDONLY
            | getattr(os, "O_NOFOLLOW", 0)
            | (getattr(os, "O_DIRECTORY", 0) if stat.S_ISDIR(info.st_mode) else 0)
        )
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not _lock(fd, wait=False) or not _same_inode(path, fd):
            return None
        if stat.S_ISDIR(info.st_mode):
            freed = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
            shutil.rmtree(path)
        else:
            freed = info.st_size
            os.unlink(path)
        return freed
    except OSError:
        return None
    finally:
        os.close(fd)


def _size(count: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


# --- publishing -------------------------------------------------------------------------
def publish(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename `tmp` onto `target`: without replacing when `target` was claimed as new."""
    target = Path(target)
    if not is_claimed(target):
        os.replace(tmp, target)
        return
    try:
        rename_noreplace(tmp, target)
    except FileExistsError:
        raise HeadpruneError(
            f"{target} now exists: another process wrote it while this one ran; "
            "it was left as it is (pass --force to replace it)"
        ) from None
    release_claim(target)


def publish_folder(tmp: Path, out: Path) -> None:
    """Publish a finished temporary folder: a new one without replacing (as `publish`), an
    existing one (headprune's, replaced under --force) swapped out and then removed."""
    if is_claimed(out) or not os.path.lexists(out):
        publish(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def rename_noreplace(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename that fails with FileExistsError when `target` exists (file or folder)."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(target))
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(target))
    if os.path.isdir(source):
        # No renameat2 here: rename(2) still refuses a non-empty folder or a file in the
        # way; only an empty folder made in the meantime could be replaced.
        if os.path.lexists(target) and not (os.path.isdir(target) and not os.listdir(target)):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
        os.rename(source, target)
        return
    try:
        os.link(source, target)  # atomic, and fails when the name is taken
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS):
            raise
        # A filesystem without hard links (FAT, some FUSE mounts): checked, then renamed,
        # which leaves the instant between the two unguarded.
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        os.rename(source, target)
        return
    os.unlink(source)


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def linux_libc(name: str, argtypes: list, restype=ctypes.c_int):
    """The C library's function `name` on Linux, typed; None elsewhere or when it is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


@functools.cache
def _renameat2():
    return linux_libc("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])
