"""fileio's edges, one function at a time: what counts as a regular file, hashing exactly
what stat() promised, the hash cache, atomic writes and the OS errors behind them."""

from __future__ import annotations

import errno
import hashlib
import os
import threading

import pytest

from headprune_cli.errors import CheckpointError, HeadpruneError
from headprune_cli.files import io as fileio


def test_check_regular_refuses_what_is_not_an_ordinary_file_with_its_reason(tmp_path):
    plain = tmp_path / "f.bin"
    plain.write_bytes(b"abc")
    assert fileio.check_regular(plain).st_size == 3
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-proc").symlink_to("/proc/self/status")
    cases = {
        tmp_path / "missing": f"{tmp_path / 'missing'}: cannot read this model (No such file or directory)",
        tmp_path: f"{tmp_path}: a folder, not a regular model",
        tmp_path / "fifo": f"{tmp_path / 'fifo'}: a device, pipe or socket, not a regular model",
        "/dev/null": "/dev/null: a device, pipe or socket, not a regular model",
        tmp_path / "to-proc": f"{tmp_path / 'to-proc'}: a file of a special filesystem (/proc/",
    }
    for path, message in cases.items():
        with pytest.raises(CheckpointError) as caught:  # the error type the caller asked for
            fileio.check_regular(path, "model", CheckpointError)
        assert str(caught.value).startswith(message), (path, str(caught.value))
    with pytest.raises(HeadpruneError, match="not a regular file$"):
        fileio.check_regular(tmp_path)


def test_a_file_whose_name_only_starts_like_a_special_root_is_regular(tmp_path, monkeypatch):
    """/procfs is not /proc: the special roots match whole path components."""
    (tmp_path / "procfs").write_bytes(b"x")
    monkeypatch.setattr(fileio, "SPECIAL_ROOTS", (str(tmp_path / "proc"),))
    assert fileio.check_regular(tmp_path / "procfs").st_size == 1
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "inside").write_bytes(b"x")
    with pytest.raises(HeadpruneError, match="special filesystem"):
        fileio.check_regular(tmp_path / "proc" / "inside")


def test_open_regular_never_blocks_on_a_fifo_swapped_in_after_the_check(tmp_path, monkeypatch):
    plain = tmp_path / "f.bin"
    plain.write_bytes(b"abc")
    with fileio.open_regular(plain) as handle:
        assert handle.read() == b"abc"
    assert _refusal(fileio.open_regular, tmp_path, "plan") == f"{tmp_path}: a folder, not a regular plan"
    assert _refusal(fileio.open_regular, tmp_path) == f"{tmp_path}: a folder, not a regular file"
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(fileio, "check_regular", lambda *args, **kwargs: None)  # the race: checked, then swapped
    result: list = []
    worker = threading.Thread(
        target=lambda: result.append(_refusal(fileio.open_regular, tmp_path / "fifo", "plan")), daemon=True
    )
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "open_regular blocked on a FIFO"
    assert result == [f"{tmp_path / 'fifo'}: not a regular plan"]


def _refusal(function, *args) -> str | None:
    try:
        function(*args)
    except HeadpruneError as exc:
        return str(exc)
    return None


def test_hash_reads_the_size_stat_promised_and_no_more(tmp_path):
    path = tmp_path / "growing.bin"
    data = os.urandom((3 << 20) + 5)  # spans several read chunks
    path.write_bytes(data + b"appended later")
    assert fileio._hash(path, len(data)) == hashlib.sha256(data).hexdigest()
    assert fileio._hash(path, 0) == hashlib.sha256(b"").hexdigest()
    assert fileio._hash(path, 1) == hashlib.sha256(data[:1]).hexdigest()


def test_a_remembered_hash_is_used_until_the_file_changes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"written")
    fileio.remember_sha256(path, "ab" * 32)  # what a writer hashed as the bytes went out
    assert fileio.sha256_file(path) == "ab" * 32  # not read back
    path.write_bytes(b"rewritten")
    assert fileio.sha256_file(path) == hashlib.sha256(b"rewritten").hexdigest()


def test_hash_ahead_starts_one_hash_per_version_of_a_file(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    submitted, hashed = [], []
    real_submit, real_hash = fileio._HASHER.submit, fileio._hash
    monkeypatch.setattr(fileio._HASHER, "submit", lambda *args: submitted.append(args[1:]) or real_submit(*args))
    monkeypatch.setattr(fileio, "_hash", lambda *args: hashed.append(args) or real_hash(*args))
    fileio.hash_ahead(path)
    fileio.hash_ahead(path)  # already under way
    assert submitted == [(path, 3)]
    assert fileio.sha256_file(path) == hashlib.sha256(b"abc").hexdigest()
    assert hashed == [(path, 3)]  # sha256_file took the hash started ahead: the file was read once
    fileio.hash_ahead(path)  # already known
    assert len(submitted) == 1


def test_atomic_write_returns_what_the_writer_returned_with_the_usual_mode(tmp_path):
    def writer(tmp):
        with open(tmp, "wb") as handle:
            return handle.write(b"12345")

    old = os.umask(0o027)
    try:
        result = fileio.atomic_write(tmp_path / "out.bin", writer)
        umask_after = os.umask(0o027)  # reading the umask must leave it as it was
    finally:
        os.umask(old)
    assert umask_after == 0o027
    assert result == 5 and (tmp_path / "out.bin").read_bytes() == b"12345"
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o640
    fileio.atomic_write_bytes(tmp_path / "out.bin", b"replaced")
    assert (tmp_path / "out.bin").read_bytes() == b"replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


@pytest.mark.parametrize(
    "failure, expected",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "could not write {out}: No space left on device"),
        (RuntimeError("I/O error: File too large (os error 27)"), "could not write {out}: File too large"),
        (RuntimeError("a bug, not the disk"), None),
        (KeyboardInterrupt(), None),
    ],
)
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp(tmp_path, failure, expected):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def write(tmp):
        with open(tmp, "wb") as handle:
            handle.write(b"half")
        raise failure

    with pytest.raises(BaseException) as caught:
        fileio.atomic_write(out, write)
    if expected is None:
        assert caught.value is failure  # not the user's disk: the error goes on as it was
    else:
        assert type(caught.value) is HeadpruneError and str(caught.value) == expected.format(out=out)
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_os_error_in_finds_the_os_error_a_library_wraps():
    direct = OSError(errno.EACCES, "Permission denied")
    assert fileio.os_error_in(direct) is direct
    wrapped = fileio.os_error_in(RuntimeError("Error while serializing: I/O error (os error 28)"))
    assert (wrapped.errno, wrapped.strerror) == (28, os.strerror(28))
    assert fileio.os_error_in(RuntimeError("no errno here")) is None
    assert fileio.os_error_in(KeyboardInterrupt("(os error 28)")) is None  # an interrupt is never the disk


def test_start_writeback_asks_the_kernel_for_the_range_just_written(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(fileio, "_sync_file_range", lambda: lambda *args: calls.append(args))
    fileio.start_writeback(7, 4096, 1 << 20)
    fileio.start_writeback(7, 0, 0)  # nothing written: nothing asked
    fileio.start_writeback(7, 9, 1)
    assert calls == [(7, 4096, 1 << 20, 2), (7, 9, 1, 2)]  # SYNC_FILE_RANGE_WRITE: start, do not wait
    monkeypatch.setattr(fileio, "_sync_file_range", lambda: None)  # not Linux
    fileio.start_writeback(7, 0, 10)


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="sync_file_range is Linux's")
def test_sync_file_range_is_found_and_accepts_a_real_file(tmp_path):
    function = fileio._sync_file_range()
    assert function is not None and len(function.argtypes) == 4
    with open(tmp_path / "f.bin", "wb") as handle:
        handle.write(b"x" * 8192)
        handle.flush()
        assert function(handle.fileno(), 0, 8192, 2) == 0
