"""A session killed mid-write (SIGKILL) leaves its hidden temporary beside the target; the
next headprune that writes into that folder removes temporaries of its own naming whose
writer is gone (nobody holds their flock) and says so in one line. A temporary still
being written, and any file of another naming, are left alone."""

from __future__ import annotations

import fcntl
import os
import signal
import textwrap
import time
from pathlib import Path

from headprune_cli.files.temps import TEMP_PATTERN
from tests.support import finished, headprune, snapshot

SLOW_WRITE = textwrap.dedent("""
    import os, sys, time
    import headprune_cli.model.checkpoint as checkpoint
    real = checkpoint.write_file

    def slow(path, specs, metadata):  # the whole temporary is on disk; the rename has not happened
        real(path, specs, metadata)
        print(os.getpid(), path, flush=True)
        time.sleep(120)

    checkpoint.write_file = slow
    from headprune_cli.cli.app import run
    run()
""")


def _killed_mid_write(work: Path) -> tuple[object, int, Path]:
    script = work.parent / "slow_write.py"
    script.write_text(SLOW_WRITE)
    process = headprune(
        "prune", "model.safetensors", "--plan", "plan.json", "-o", "small.safetensors", cwd=work, script=script
    )
    pid, tmp = process.stdout.readline().split()
    tmp = work / Path(tmp).name
    assert TEMP_PATTERN.match(tmp.name) and tmp.stat().st_size > 100_000  # a model-sized leftover
    return process, int(pid), tmp


def _unlocked(path: Path, timeout: float = 30) -> bool:
    """Wait until nobody holds the temporary's lock (its writer has died)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            time.sleep(0.05)
        finally:
            os.close(fd)
    return False


def test_the_next_write_removes_what_a_killed_session_left(work, cli):
    process, _, tmp = _killed_mid_write(work)
    process.kill()  # SIGKILL to the session: its worker dies with it, the temporary stays
    process.communicate(timeout=60)
    assert _unlocked(tmp) and tmp.exists()
    size_kb = tmp.stat().st_size / 1e3
    result = cli("select", work / "scores.json", "--ratio", "0.5", "-o", work / "again.json")
    assert result.code == 0, result.err
    notes = [line for line in result.err.splitlines() if line.startswith("Note:")]
    assert notes == [f"Note: removed 1 temporary file ({size_kb:.1f} KB) that a killed headprune left in {work}"], (
        result.err
    )
    assert not tmp.exists() and not (work / "small.safetensors").exists()


def test_a_worker_killed_under_the_watcher_is_cleaned_up_at_once(work):
    process, worker, tmp = _killed_mid_write(work)
    assert worker != process.pid  # the command runs in a child of the process started
    os.kill(worker, signal.SIGKILL)  # the OOM killer's way
    code, _, err = finished(process)
    assert code == 128 + signal.SIGKILL and err == "Error: killed by SIGKILL; its temporaries were removed\n", (
        code,
        err,
    )
    assert not tmp.exists() and not (work / "small.safetensors").exists()


def test_live_and_foreign_temporaries_are_kept(work, cli):
    live = work / ".plan.json.headprune-0123abcd.tmp"  # a writer in another process is still at it
    live.write_bytes(b"being written")
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    (work / ".plan.json.0123abcd.tmp").write_bytes(b"another tool's, or an older headprune's")
    (work / ".notes.headprune-89abcdef.tmp").symlink_to(work / "data.jsonl")  # ours are never links
    (work / "headprune-0123abcd.tmp").write_bytes(b"not hidden: not our naming")
    try:
        before = snapshot(work)
        result = cli("select", work / "scores.json", "--ratio", "0.5", "-o", work / "again.json")
        assert result.code == 0 and "Note:" not in result.err, result.err
        after = snapshot(work)
        del after["again.json"]
        assert after == before
    finally:
        os.close(holder)


def test_an_abandoned_temporary_folder_is_removed_too(work, cli):
    """`export --hf` builds its folder as a locked temporary folder beside the target."""
    left = work / ".exported.headprune-deadbeef.tmp"
    (left / "onnx").mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"x" * 5000)
    (left / "onnx" / "model.onnx").write_bytes(b"y" * 1000)
    result = cli("export", work / "model.safetensors", "--hf", work / "exported")
    assert result.code == 0, result.err
    assert f"Note: removed 1 temporary file (6.0 KB) that a killed headprune left in {work}" in result.err.splitlines()
    assert not left.exists() and (work / "exported" / "config.json").is_file()


def test_a_temporary_folder_swept_before_its_maker_opened_it_is_made_again(tmp_path, monkeypatch):
    """Another process's sweep can remove a new, still empty and unlocked temporary folder in the
    instant between its mkdir and its open; the maker then takes a fresh name (CI met this as
    "No such file or directory" when two exports raced)."""
    import os

    from headprune_cli.files import temps

    real_mkdir, swept = os.mkdir, []

    def mkdir_then_swept(path, mode=0o777):
        real_mkdir(path, mode)
        if not swept:  # the first one only: the sweep of the other process, right now
            swept.append(path)
            os.rmdir(path)

    monkeypatch.setattr(temps.os, "mkdir", mkdir_then_swept)
    path, fd = temps.make_temp_folder(tmp_path / "exported")
    try:
        assert path.is_dir() and str(path) != str(swept[0])
    finally:
        os.close(fd)
