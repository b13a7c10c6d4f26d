"""A watching parent around the command: what a process killed by SIGBUS cannot say.

headprune memory-maps its weight files (its own streamed reads, safetensors' and
transformers' loads). When another process truncates such a file while it is read, the
next access to a page past the new end raises SIGBUS, and the kernel ends the process on
the spot: Python can neither catch the signal nor resume the C or Rust code that faulted
(a handler that returns makes the same access fault again). Checking the size before each
tensor only narrows the window. So the console entry point forks first: the child runs
the command, the parent only waits. The child notes in a page of memory it shares with
the parent which files it maps (with their size and identity when first read) and which
folders it writes into. When the child dies by a signal, the parent removes the
temporaries it left there (temps.sweep: nobody holds their lock any more) and prints one
line: for SIGBUS, `Error: X changed while headprune read it ...` and exit 1, the file
named by comparing each noted file with what it is now.

Signals: the parent blocks the ones that end a command and forwards those sent to it
alone (`kill PID`) to the child; those the terminal sends to the whole process group
(Ctrl-C) reach the child directly and are not sent twice. The child dies with the parent
(PR_SET_PDEATHSIG), so `kill -9 PID` still stops the work. HEADPRUNE_NO_WATCHER=1, a
platform without fork, or a caller of main() in-process run the command unwatched.
No heavy imports: this runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path

_PAGE = 1 << 20  # anonymous: costs memory only where written
_NOTES: dict | None = None  # in the watched child: what it has noted so far
_SHARED: mmap.mmap | None = None
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_CRASHES = {signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel (the terminal) sent, not kill()
_PR_SET_PDEATHSIG = 1


def note_read(path: str | os.PathLike) -> None:
    """Record a file about to be memory-mapped, as it is now (size, inode, mtime)."""
    if _NOTES is None:
        return
    key = os.path.realpath(path)
    if key in _NOTES["reads"]:
        return
    try:
        info = os.stat(key)
    except OSError:
        return
    _NOTES["reads"][key] = [str(path), info.st_size, info.st_ino, info.st_mtime_ns]
    _share()


def note_write(folder: str | os.PathLike) -> None:
    """Record a folder that temporaries are made in."""
    if _NOTES is None:
        return
    key = os.path.realpath(folder)
    if key not in _NOTES["writes"]:
        _NOTES["writes"].append(key)
        _share()


def note_state(folder: str | os.PathLike) -> None:
    """Record a training-state folder: a rank killed under torchrun says the step it resumes from."""
    if _NOTES is not None:
        _NOTES["state"] = str(folder)
        _share()


def _share() -> None:
    if _NOTES is None or _SHARED is None:  # only the watched child has both (set together at fork)
        return
    data = json.dumps(_NOTES).encode()
    if len(data) + 4 > _PAGE:  # hundreds of shards: keep what fits (the folders come first in importance)
        data = json.dumps(
            {"reads": dict(list(_NOTES["reads"].items())[:50]), "writes": _NOTES["writes"][:50]}
        ).encode()[: _PAGE - 4]
    _SHARED[4 : 4 + len(data)] = data
    _SHARED[:4] = struct.pack("<I", len(data))


def _read_shared(shared: mmap.mmap) -> dict:
    (length,) = struct.unpack("<I", shared[:4])
    try:
        return json.loads(shared[4 : 4 + length]) if length else {"reads": {}, "writes": []}
    except ValueError:
        return {"reads": {}, "writes": []}


# --- the entry point ------------------------------------------------------------------------
def watched(command: Callable[[], int], sweep: Callable[[Path], object]) -> int:
    """Run `command` in a child process watched by this one; returns the exit code to use.
    `sweep(folder)` removes the unlocked temporaries the child left in a folder it wrote in."""
    global _NOTES, _SHARED
    if (
        not hasattr(os, "fork")
        or not hasattr(signal, "sigwaitinfo")
        or os.environ.get("HEADPRUNE_NO_WATCHER", "") not in ("", "0")
    ):
        return command()
    shared = mmap.mmap(-1, _PAGE)  # anonymous and shared: the child's notes outlive it
    waited = set(_FORWARDED) | {signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # before fork: no SIGCHLD lost
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _NOTES, _SHARED = {"reads": {}, "writes": []}, shared
        return command()
    status = _wait(child, waited)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return _verdict(status, _read_shared(shared), sweep)


def _die_with(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


def _wait(child: int, waited: set) -> int:
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(child, os.WNOHANG)
            if done == child:
                return status
        elif info.si_code != _SI_KERNEL:  # sent to this pid alone: pass it on
            try:
                os.kill(child, info.si_signo)
            except ProcessLookupError:
                pass


def _verdict(status: int, notes: dict, sweep: Callable[[Path], object]) -> int:
    # The child is gone, so none of its temporaries is locked any more: whatever it could
    # not remove (a second Ctrl-C during its cleanup, a signal) goes now. Another live
    # writer's temporaries in the same folders stay locked, and stay.
    for folder in notes.get("writes", []):
        sweep(Path(folder))
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    number = os.WTERMSIG(status)
    name = signal.Signals(number).name if number in signal.Signals.__members__.values() else f"signal {number}"
    if number == signal.SIGBUS:
        print(f"Error: {_changed(notes)}; nothing was written", file=sys.stderr)
        return 1
    if number in _CRASHES:
        print(
            f"Internal error: headprune crashed ({name}); its temporaries were removed (please report)", file=sys.stderr
        )
        return 70
    print(f"Error: {_who()}killed by {name}; its temporaries were removed{_resume(notes)}", file=sys.stderr)
    return 128 + number


def _who() -> str:
    """'rank 1 ' under torchrun (the survivors name the same rank), else nothing."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return f"rank {rank} " if rank.isdigit() and world.isdigit() and int(world) > 1 else ""


def _resume(notes: dict) -> str:
    """'; resume from step N ...' when the child trained with a state folder under torchrun."""
    if not _who() or not notes.get("state"):
        return ""
    return f"; {resume_advice(Path(notes['state']))}"


def _changed(notes: dict) -> str:
    """Which noted input is no longer what it was when first read."""
    for shown, size, inode, mtime in notes.get("reads", {}).values():
        try:
            now = os.stat(shown)
        except OSError:
            return f"{shown} changed while headprune read it (it is gone)"
        if now.st_size < size:
            return f"{shown} changed while headprune read it (truncated from {size} to {now.st_size} bytes)"
        if (now.st_ino, now.st_mtime_ns, now.st_size) != (inode, mtime, size):
            return f"{shown} changed while headprune read it (rewritten)"
    return "an input file changed while headprune read it (a memory-mapped read failed: SIGBUS)"


def resume_step(state_dir: Path | None) -> int | None:
    """The step the saved training state holds (its latest.json), None when nothing was saved."""
    if state_dir is None:
        return None
    try:
        step = json.loads((state_dir / "latest.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def resume_advice(state_dir: Path | None) -> str:
    """What to run next: resume from the saved step, or start over when none was saved."""
    step = resume_step(state_dir)
    if step is None:
        return "no training state was saved yet: rerun the same torchrun command to start over"
    return f"resume from step {step} (the state in {state_dir}): rerun the same torchrun command with --resume"
