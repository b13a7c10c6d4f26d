"""A torchrun process that died, named by the ones that live on.

When one rank is killed (`kill -9`, the OOM killer), the others learn it from their
communication library ("[gloo] Connection closed by peer", an NCCL error) or from torchrun,
which stops them with SIGTERM once it has seen a worker die. Neither says which rank died
or what a user can do next. So when the process group forms, every rank learns every
other rank's machine and pid (one all-gather of two integers), and when training stops on
an error, each surviving rank looks for a peer on its own machine that is gone and says,
in one line, which rank died and the step its training state can resume from (exit 1).
A peer on another machine cannot be looked at: a broken group with no dead local peer is
named as such. The training state is never touched: it is what the rerun resumes from.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from headprune_cli.errors import HeadpruneError, Interrupted, PeerFault, first_line, shorten
from headprune_cli.files.watcher import note_state, resume_advice

if TYPE_CHECKING:
    import torch

_PEERS: list[tuple[int, int]] = []  # per rank: (machine id, pid), filled when the group forms
_RANK = 0
# How long a rank that got a communication error waits for its dead peer's process to be
# gone: the peer's sockets close while the kernel is still tearing the process down.
_GRACE_S = 2.0


def _machine() -> int:
    """This machine, as an integer every rank on it agrees on (containers may share a hostname)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return zlib.crc32(f"{socket.gethostname()}\0{boot}".encode())


def note_peers(device: torch.device) -> None:
    """Learn every rank's (machine, pid); called once, right after the process group forms."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)
    import torch.distributed as dist  # noqa: PLC0415 (keeps torch out of this module's import)

    global _RANK
    mine = torch.tensor([_machine(), os.getpid()], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    _PEERS[:] = [(int(t[0]), int(t[1])) for t in every]
    _RANK = dist.get_rank()


def _gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped (a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] in ("Z", "X")


def dead_peers(wait_s: float = 0.0) -> list[int]:
    """Ranks on this machine whose process is gone, looked for up to `wait_s` seconds."""
    here = _machine()
    deadline = time.monotonic() + wait_s
    while True:
        dead = [r for r, (machine, pid) in enumerate(_PEERS) if r != _RANK and machine == here and _gone(pid)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.1)


def fault_line(dead: list[int], state_dir: Path | None) -> str:
    """'rank 1 (pid 4242) died ...; resume from step 6 ...', one line."""
    who = ", ".join(f"rank {r} (pid {_PEERS[r][1]})" for r in dead)
    verb = "died" if len(dead) == 1 else "all died"
    return f"{who} {verb} while rank {_RANK} trained (killed, or stopped on its own error); {resume_advice(state_dir)}"


@contextmanager
def peer_faults(state_dir: Path | None) -> Iterator[None]:
    """Turn an error that a dead peer caused into the one line that names it (see the module doc)."""
    if _PEERS and state_dir is not None:
        note_state(state_dir)  # the watcher of a rank killed outright names the step too
    try:
        yield
    except Interrupted as exc:
        # torchrun stops the survivors with SIGTERM after a worker died (it has reaped it by
        # then); a Ctrl-C is the user's own stop, never a fault.
        dead = dead_peers() if _PEERS and str(exc) == "SIGTERM" else []
        if not dead:
            raise
        raise PeerFault(fault_line(dead, state_dir)) from None
    except HeadpruneError:
        raise  # already one line about this rank's own input
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        if not _PEERS:
            raise
        dead = _waited_for_dead()
        if dead:
            raise PeerFault(fault_line(dead, state_dir)) from None
        if not _communication_error(exc):
            raise
        raise PeerFault(
            f"the torchrun process group broke while rank {_RANK} trained ({shorten(first_line(exc), 100)}): a "
            f"process on another machine died or the network failed; {resume_advice(state_dir)}"
        ) from None


def _waited_for_dead() -> list[int]:
    """dead_peers over the grace time; torchrun's SIGTERM may end the wait, its dead worker reaped."""
    try:
        return dead_peers(_GRACE_S)
    except Interrupted as exc:
        dead = dead_peers() if str(exc) == "SIGTERM" else []
        if not dead:
            raise
        return dead


def _communication_error(exc: BaseException) -> bool:
    """An error of torch.distributed's own (its backends raise DistError subclasses)."""
    import torch.distributed as dist  # noqa: PLC0415 (keeps torch out of this module's import)

    return isinstance(exc, dist.DistError)
