"""File I/O at the edges: atomic writes and hashes (what may be written: outputs.py).

Every output goes to a temporary file in the destination folder, is fsynced, and is
renamed into place, so a crash or kill leaves the old file or none, never half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from headprune_cli.errors import HeadpruneError
from headprune_cli.outputs import check_output, check_parent  # noqa: F401  (the output rule lives there)

_CHUNK = 1 << 20


# A stage often hashes the same checkpoint twice (to match an artifact's inputs, then on
# load); multi-GB models make that slow. The key changes whenever the file does.
_SHA_CACHE: dict[tuple, str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Run `write(tmp_path)`, fsync, then rename over `path`; clean up on any failure."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
        os.replace(tmp, out)
    except OSError as exc:
        _remove_quietly(tmp)
        raise HeadpruneError(f"could not write {out}: {exc.strerror or exc}") from exc
    except BaseException:
        _remove_quietly(tmp)
        raise


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
